//! Capture for the operator (`anode capture`, issue 19): copies of the
//! plaintext datagrams the node receives and sends, for the daemon to
//! stream to the operator's client, which writes pcap.
//!
//! ```text
//! classify: verified inner datagram ─► capture_in ─┐
//! protect:  transmissions before sealing ─► capture_out ─┤ (each: one `if let` when off)
//!                                                        ▼
//!          bounded queue (datagrams and bytes; full: counted as drops, never waits)
//!                                                        ▼
//! the daemon, after each wakeup: capture_drain ─► frames ─► the client's socket
//! ```
//!
//! What is captured: every datagram the node handles after the outer
//! checks, i.e. on a secured link the inner datagram after the tag is
//! verified (and decrypted), whatever its type (SNAP, plain, capsules,
//! control requests, domain datagrams); with security off every datagram
//! whose ANEP header checks. On the way out, every transmission that goes
//! through protection, before it is sealed (and with security off, the
//! forwarded and child datagrams). What is not: handshakes (their Noise
//! messages are on the wire as they are: tcpdump sees them), keepalives
//! (empty), datagrams dropped before verification (bad tag, replay, no SA:
//! counted in `status`), and the link-layer fragments of a datagram longer
//! than the link MTU (the whole datagram is captured, before fragmentation
//! and after reassembly).
//!
//! Invariant: capturing never changes what the data path does. Inbound
//! bytes are copied before `dispatch` rewrites them; outbound ones before
//! they are sealed; a full queue drops the copy, not the datagram.

use super::{Node, Outbox};
use core::net::SocketAddr;
use std::collections::VecDeque;

/// Datagrams the queue holds by default.
pub const CAPTURE_QUEUE: usize = 4096;
/// Bytes the queue holds at most, whatever its datagram count.
pub const CAPTURE_QUEUE_BYTES: usize = 16 << 20;

/// How a capture is set up (from the request and the bound sockets).
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// Which interfaces are captured, by index (`true`: captured).
    pub interfaces: Vec<bool>,
    /// Each interface's local endpoint.
    pub local: Vec<SocketAddr>,
    /// Datagrams that may wait for the daemon.
    pub queue: usize,
    /// Bytes that may wait for the daemon.
    pub queue_bytes: usize,
    /// Wall-clock ms when `now_ms` was 0 (timestamps are ns since the epoch).
    pub unix_ms_at_zero: u64,
}

/// Which way a captured datagram went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureDir {
    /// Received (after verification and decryption).
    In,
    /// Sent (before protection).
    Out,
}

/// One captured datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// When, ns since the Unix epoch (ms resolution: the node's clock).
    pub ts_ns: u64,
    /// Received or sent.
    pub dir: CaptureDir,
    /// Interface index.
    pub iface: usize,
    /// The neighbour's endpoint (0.0.0.0:0 if unknown).
    pub peer: SocketAddr,
    /// The interface's endpoint.
    pub local: SocketAddr,
    /// The plaintext ANEP datagram.
    pub data: Vec<u8>,
}

/// Why a capture stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStop {
    /// The client closed its connection (done, or gone).
    ClientGone,
    /// The client read nothing for too long while data waited.
    Stalled,
    /// The node is shutting down.
    Shutdown,
}

/// Capture counters, since the node started (all captures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CaptureCounters {
    /// Captures started.
    pub started: u64,
    /// Captures refused (bad request, not the operator, busy, ...; the
    /// daemon counts them here).
    pub refused: u64,
    /// Captures ended by their client.
    pub stopped_client: u64,
    /// Captures ended because their client stalled.
    pub stopped_stalled: u64,
    /// Received datagrams queued.
    pub queued_in: u64,
    /// Sent datagrams queued.
    pub queued_out: u64,
    /// Datagrams not captured because the queue was full (by count or bytes).
    pub drops: u64,
    /// Datagrams on interfaces the capture does not cover.
    pub other_interface: u64,
    /// Datagrams handed to the daemon.
    pub drained: u64,
}

pub(crate) struct Capture {
    cfg: CaptureConfig,
    queue: VecDeque<Captured>,
    bytes: usize,
    /// Buffers of drained datagrams, reused.
    free: Vec<Vec<u8>>,
    /// Drops of this capture.
    drops: u64,
}

/// The node's capture state: on or off, and the counters of all captures.
#[derive(Default)]
pub(crate) struct CaptureSlot {
    on: Option<Box<Capture>>,
    counters: CaptureCounters,
}

impl core::fmt::Debug for CaptureSlot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CaptureSlot").field("on", &self.on.is_some()).field("counters", &self.counters).finish()
    }
}

impl CaptureSlot {
    fn push(&mut self, dir: CaptureDir, iface: usize, peer: Option<SocketAddr>, datagram: &[u8], now_ms: u64) {
        let Some(c) = self.on.as_mut() else { return };
        let k = &mut self.counters;
        if !c.cfg.interfaces.get(iface).copied().unwrap_or(false) {
            k.other_interface += 1;
            return;
        }
        if c.queue.len() >= c.cfg.queue || c.bytes.saturating_add(datagram.len()) > c.cfg.queue_bytes {
            k.drops += 1;
            c.drops += 1;
            return;
        }
        match dir {
            CaptureDir::In => k.queued_in += 1,
            CaptureDir::Out => k.queued_out += 1,
        }
        let mut data = c.free.pop().unwrap_or_default();
        data.clear();
        data.extend_from_slice(datagram);
        c.bytes += data.len();
        let ts_ns = c.cfg.unix_ms_at_zero.saturating_add(now_ms).saturating_mul(1_000_000);
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        let local = c.cfg.local.get(iface).copied().unwrap_or(unspecified);
        c.queue.push_back(Captured { ts_ns, dir, iface, peer: peer.unwrap_or(unspecified), local, data });
    }
}

/// Why a capture could not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureStartError {
    /// A capture is already running (one at a time).
    #[error("a capture is already running on this node")]
    Busy,
}

impl Node {
    /// Starts capturing (the daemon, on its operator's request).
    ///
    /// # Errors
    /// [`CaptureStartError::Busy`] if a capture runs already.
    pub fn capture_start(&mut self, cfg: CaptureConfig) -> Result<(), CaptureStartError> {
        if self.capture.on.is_some() {
            return Err(CaptureStartError::Busy);
        }
        self.capture.counters.started += 1;
        let queue = VecDeque::with_capacity(cfg.queue.min(1024));
        self.capture.on = Some(Box::new(Capture { cfg, queue, bytes: 0, free: Vec::new(), drops: 0 }));
        Ok(())
    }

    /// Stops the running capture (if any), dropping what it still holds.
    pub fn capture_stop(&mut self, why: CaptureStop) {
        if self.capture.on.take().is_none() {
            return;
        }
        match why {
            CaptureStop::ClientGone | CaptureStop::Shutdown => self.capture.counters.stopped_client += 1,
            CaptureStop::Stalled => self.capture.counters.stopped_stalled += 1,
        }
    }

    /// Counts a refused capture request.
    pub fn capture_refused(&mut self) {
        self.capture.counters.refused += 1;
    }

    /// Whether a capture runs.
    pub fn capture_on(&self) -> bool {
        self.capture.on.is_some()
    }

    /// Drops of the running capture (0 when none runs).
    pub fn capture_drops(&self) -> u64 {
        self.capture.on.as_ref().map_or(0, |c| c.drops)
    }

    /// Hands at most `max` queued datagrams, oldest first, to `f`, which
    /// returns false to stop early (that datagram is then handed first
    /// next time). Their buffers are reused.
    pub fn capture_drain(&mut self, max: usize, mut f: impl FnMut(&Captured) -> bool) {
        let Some(c) = self.capture.on.as_mut() else { return };
        for _ in 0..max {
            let Some(p) = c.queue.front() else { return };
            if !f(p) {
                return;
            }
            if let Some(p) = c.queue.pop_front() {
                c.bytes -= p.data.len().min(c.bytes);
                self.capture.counters.drained += 1;
                if c.free.len() < 64 {
                    c.free.push(p.data);
                }
            }
        }
    }

    /// The capture counters (all captures since start).
    pub fn capture_counters(&self) -> CaptureCounters {
        self.capture.counters
    }

    /// The `capture` section of `anode status`.
    pub fn capture_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self.capture.counters).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("running".into(), self.capture.on.is_some().into());
            if let Some(c) = &self.capture.on {
                o.insert("queued_now".into(), c.queue.len().into());
                o.insert("queue".into(), c.cfg.queue.into());
                o.insert("this_capture_drops".into(), c.drops.into());
            }
        }
        v
    }

    /// A received datagram after verification (`datagram`: the inner ANEP
    /// datagram, before it is handled) from `peer` on `iface`.
    #[inline]
    pub(super) fn capture_in(&mut self, iface: usize, peer: Option<SocketAddr>, datagram: &[u8]) {
        if self.capture.on.is_some() {
            let now = self.now_ms;
            self.capture.push(CaptureDir::In, iface, peer, datagram, now);
        }
    }

    /// The transmissions of `out` from index `mark` on, before protection
    /// (`buf`: the buffer their `Data::Input` ranges point into).
    #[inline]
    pub(super) fn capture_out(&mut self, buf: &[u8], out: &Outbox, mark: usize) {
        if self.capture.on.is_some() {
            let now = self.now_ms;
            for t in out.transmits.get(mark..).unwrap_or(&[]) {
                self.capture.push(CaptureDir::Out, t.iface, Some(t.to), out.bytes(&t.data, buf), now);
            }
        }
    }
}
