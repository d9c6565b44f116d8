//! The interface sockets: batched receive (`recvmmsg`) into fixed buffers,
//! the core, and batched send (`sendmmsg`) per outgoing interface.

use crate::BATCH;
use crate::app::Local;
use crate::daemon::Daemon;
use crate::droplog::DropLog;
use crate::frag::Frag;
use crate::mmsg::{Received, RecvMmsg};
use crate::offload::{IoCounters, Offload, gso_run};
use crate::pacer::Pacer;
use anode_node::core::{Node, Outbox, Owner};
use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, sendmmsg};
use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::Instant;
use tracing::{debug, info};

/// Receive side of the data path: what `recvmmsg` filled, the batch
/// slots the core works on, and their outboxes.
pub(crate) struct Rx {
    /// `recvmmsg`'s buffers: one datagram each, or a GRO run.
    pub(crate) raw: [Vec<u8>; BATCH],
    /// What each of them holds.
    pub(crate) got: [Received; BATCH],
    pub(crate) mmsg: RecvMmsg,
    /// The slots' own buffers: a slot's datagram is here, handled in
    /// place, unless [`src`](Self::src) says it is where it arrived.
    pub(crate) bufs: [Vec<u8>; BATCH],
    /// Per slot, the (message, offset) in `raw` of a datagram cut from a GRO
    /// run and handled where it arrived; `None`: in the slot's own buffer.
    pub(crate) src: [Option<(usize, usize)>; BATCH],
    pub(crate) lens: [usize; BATCH],
    pub(crate) outs: [Outbox; BATCH],
    pub(crate) froms: [Option<SocketAddr>; BATCH],
    /// Wall time each datagram of the batch took in the core, ns (with
    /// RCANE on), to split the batch's CPU among owners.
    pub(crate) spent: [u64; BATCH],
    /// The split, reused batch after batch.
    pub(crate) shares: Vec<Share>,
}

/// One owner's part of a receive batch: what [`split_batch`] charges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) owner: Owner,
    pub(crate) ns: u64,
    /// Datagrams received for it that no session was charged for yet.
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

/// Splits `used` ns of thread CPU among the owners of a batch's datagrams
/// in proportion to `spent` (each datagram's wall time in the core), into
/// `shares` (one entry per owner, cleared first). The parts add up to
/// `used` exactly (the rounding remainder goes to the last owner). A
/// datagram accepted for a principal's session (`rx_for`) charges its CPU
/// there; its packet and bytes were charged when it was queued, so it adds
/// none here. With every `spent` zero the split is by datagram count.
pub(crate) fn split_batch(used: u64, outs: &[Outbox], lens: &[usize], spent: &[u64], shares: &mut Vec<Share>) {
    shares.clear();
    let total: u64 = spent.iter().sum();
    let weight = |i: usize| if total == 0 { 1 } else { spent.get(i).copied().unwrap_or(0) };
    let total = if total == 0 { outs.len() as u64 } else { total };
    let mut weights: [u64; BATCH] = [0; BATCH];
    for (i, (o, len)) in outs.iter().zip(lens).enumerate() {
        let (owner, packets, bytes) = match (o.system, o.rx_for) {
            (true, _) => (Owner::System, 1, *len as u64),
            (false, Some(p)) => (Owner::Principal(p), 0, 0),
            (false, None) => (Owner::BestEffort, 1, *len as u64),
        };
        let k = match shares.iter().position(|s| s.owner == owner) {
            Some(k) => k,
            None => {
                shares.push(Share { owner, ns: 0, packets: 0, bytes: 0 });
                shares.len() - 1
            }
        };
        if let (Some(s), Some(w)) = (shares.get_mut(k), weights.get_mut(k)) {
            s.packets += packets;
            s.bytes += bytes;
            *w += weight(i);
        }
    }
    let mut left = used;
    let last = shares.len().saturating_sub(1);
    for (k, (s, w)) in shares.iter_mut().zip(weights).enumerate() {
        s.ns = if k == last { left } else { ((u128::from(used) * u128::from(w)) / u128::from(total.max(1))) as u64 };
        s.ns = s.ns.min(left);
        left -= s.ns;
    }
}

/// Where a batch's transmissions come from, for [`Daemon::transmit`]
/// (a receive batch's go through [`Daemon::transmit_batch`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outs {
    /// What an application request produced.
    Inject,
    /// What timers and module dispatches produced.
    Timer,
}

/// What sending needs besides the datagrams: the sockets, the send
/// headers, fragmentation, the offloads and where results are counted.
pub(crate) struct Tx<'a> {
    pub(crate) udp: &'a [UdpSocket],
    pub(crate) hdrs: &'a mut MultiHeaders<SockaddrStorage>,
    pub(crate) tally: &'a mut TxTally,
    pub(crate) droplog: &'a mut DropLog,
    pub(crate) frag: &'a mut Frag,
    pub(crate) off: &'a mut Offload,
    /// Interfaces not to send on here: paced ones (`rate_bps`), whose
    /// datagrams the link scheduler queued (empty: none).
    pub(crate) skip: &'a [bool],
}

impl Daemon {
    /// Handles what one interface has waiting: one `recvmmsg`, whose
    /// datagrams (GRO runs cut apart) go through the core [`BATCH`] at a
    /// time, each batch's transmissions sent and deliveries made before the
    /// next.
    pub(crate) fn udp_ready(&mut self, iface: usize) {
        // The batch's slots borrow the receive buffers while the rest of
        // the daemon sends from them: the buffers are taken out meanwhile.
        let Some(mut rx) = self.rx.take() else { return };
        self.udp_ready_with(&mut rx, iface);
        self.rx = Some(rx);
    }

    fn udp_ready_with(&mut self, rx: &mut Rx, iface: usize) {
        let Rx { mmsg, raw, got, .. } = rx;
        let n = match mmsg.recv(self.udp[iface].as_fd(), raw, got) {
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return,
            Err(e) => {
                // Nothing a datagram socket returns here is fatal (e.g. a
                // queued ICMP error); note it and go on.
                debug!(iface = %self.cfg.interfaces[iface].name, error = %e, "recvmmsg");
                return;
            }
        };
        let mut at = (0, 0);
        while at.0 < n {
            let k = rx.fill(n, &mut at, &mut self.offload.counters);
            self.handle_slots(&mut rx.batch(k), iface, k);
        }
    }

    /// Runs the first `k` slots of the receive batch through the core, then
    /// sends, delivers and charges what they produced.
    fn handle_slots(&mut self, b: &mut Batch<'_>, iface: usize, k: usize) {
        let now_ms = self.now_ms();
        if self.paced.iter().any(|p| *p) {
            self.batch_at_ns = self.now_ns();
        }
        let rcane = self.node.rcane_on();
        let cpu0 = if rcane { crate::daemon::thread_cpu_ns() } else { 0 };
        run_core(&mut self.node, &mut self.frag, b, iface, k, now_ms, rcane);
        let (outs, slots) = (&mut b.outs[..k], &mut b.slots[..k]);
        self.transmit_batch(outs, slots, true);
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, outs, slots);
        if rcane {
            let used = crate::daemon::thread_cpu_ns().saturating_sub(cpu0);
            charge_batch(&mut self.node, b, k, used);
            self.charged = true;
        }
    }

    /// Sends the transmissions of `from`'s outbox.
    pub(crate) fn transmit(&mut self, from: Outs) {
        let slot = match from {
            Outs::Inject => &mut self.inject_out,
            Outs::Timer => &mut self.timer_out,
        };
        let mut out = std::mem::take(slot);
        self.transmit_batch(std::slice::from_mut(&mut out), &mut [[0u8; 0]], false);
        match from {
            Outs::Inject => self.inject_out = out,
            Outs::Timer => self.timer_out = out,
        }
    }

    /// Sends the transmissions of `outs` (the outbox of datagram `i` points
    /// into `bufs[i]`); `rx`: they are a receive batch's, whose datagrams
    /// joined their paced links when the batch arrived.
    pub(crate) fn transmit_batch<B: AsRef<[u8]> + AsMut<[u8]>>(
        &mut self,
        outs: &mut [Outbox],
        bufs: &mut [B],
        rx: bool,
    ) {
        // The clock only for paced links (an unpaced node reads none here).
        let clock = self.paced.iter().any(|p| *p).then(|| self.now_ns());
        let mut now = std::mem::take(&mut self.send_now);
        now.clear();
        let mut rest = true;
        let skip = if let Some(now_ns) = clock {
            // Datagrams of a receive batch joined their links when they arrived.
            let at_ns = if rx { self.batch_at_ns.min(now_ns) } else { now_ns };
            let mut pacer = self.pacer.lock();
            let (frag, tally, burst) = (&mut self.frag, &mut self.tally, &mut self.burst);
            rest = send_or_enqueue_paced(
                &mut pacer,
                &mut self.node,
                frag,
                tally,
                (&mut *outs, &mut *bufs),
                (at_ns, now_ns),
                &mut now,
                burst,
            );
            Some(Arc::clone(&self.paced))
        } else {
            None
        };
        let (outs, bufs): (&[Outbox], &[B]) = (outs, bufs);
        let mut tx = Tx {
            udp: &self.udp,
            hdrs: &mut self.tx_hdrs,
            tally: &mut self.tally,
            droplog: &mut self.droplog,
            frag: &mut self.frag,
            off: &mut self.offload,
            skip: skip.as_deref().unwrap_or(&[]),
        };
        if rest {
            send_transmits(&mut tx, outs, bufs);
        }
        if !now.is_empty() {
            send_paced_now(&mut tx, &mut self.node, outs, bufs, &now);
        }
        self.send_now = now;
        self.tally.apply(&mut self.node);
        if skip.is_some() {
            self.pace();
        }
    }

    /// Sends what the paced links may send now, and charges each datagram
    /// sent to its owner's session.
    pub(crate) fn pace(&mut self) {
        let now_ns = self.now_ns();
        let lock = Arc::clone(&self.pacer);
        let mut pacer = lock.lock();
        pacer.follow_all(&self.node, now_ns);
        let mut got = std::mem::take(&mut self.released);
        for iface in 0..pacer.len() {
            if !pacer.paced(iface) {
                continue;
            }
            let Some(sock) = self.udp.get(iface) else { continue };
            loop {
                pacer.release(iface, now_ns, &mut got);
                if got.is_empty() {
                    break;
                }
                pacer.seal_released(&mut self.node, &mut got);
                if got.is_empty() {
                    // All dropped (no SA): the link may release more.
                    continue;
                }
                // On the stack: a released chunk is at most BATCH long.
                let n = got.len().min(BATCH);
                let iovs: [[IoSlice<'_>; 1]; BATCH] =
                    std::array::from_fn(|i| [IoSlice::new(got.get(i).map_or(&[][..], |(_, q)| q.bytes()))]);
                let addrs: [Option<SockaddrStorage>; BATCH] =
                    std::array::from_fn(|i| got.get(i).map(|(_, q)| SockaddrStorage::from(q.to)));
                let mut tx = Tx {
                    udp: &self.udp,
                    hdrs: &mut self.tx_hdrs,
                    tally: &mut self.tally,
                    droplog: &mut self.droplog,
                    frag: &mut self.frag,
                    off: &mut self.offload,
                    skip: &[],
                };
                let sent = send_chunk(&mut tx, sock, iface, &iovs[..n], &addrs[..n]);
                // Only what the kernel took is charged: a datagram it
                // refused (EAGAIN, say) is counted as a transmit error.
                let took = got.iter().enumerate().filter(|(i, _)| sent.get(*i));
                charge_runs(&mut self.node, took.map(|(_, (key, q))| (key.owner, q.bytes().len() as u64)));
                for (_, q) in got.drain(..) {
                    pacer.recycle(q);
                }
                self.charged = true;
            }
        }
        self.released = got;
        self.tally.apply(&mut self.node);
    }
}

/// Queues the transmissions of `outs` for the paced interfaces (`paced`)
/// on their links, for the event loop to release ([`Daemon::pace`]). A
/// transmission left unsealed by the core is sealed when its link releases
/// it (its SA sequence number then follows the link's order), unless it
/// must go as fragments: those are sealed now. Called by the data path
/// workers, with the node and the pacer locked (in that order); the event
/// loop uses [`send_or_enqueue_paced`].
#[allow(clippy::too_many_arguments)] // the event loop's and a worker's parts, borrowed apart
pub(crate) fn enqueue_paced<B: AsRef<[u8]>>(
    pacer: &mut Pacer,
    node: &mut Node,
    frag: &mut Frag,
    tally: &mut TxTally,
    paced: &[bool],
    outs: &[Outbox],
    bufs: &[B],
    now_ns: u64,
) {
    let mut scratch = (Vec::new(), Vec::new());
    for (out, buf) in outs.iter().zip(bufs) {
        for t in out.transmits.iter().filter(|t| paced.get(t.iface).copied().unwrap_or(false)) {
            enqueue_one(pacer, node, frag, tally, (out, buf.as_ref()), t, &mut scratch, now_ns);
        }
    }
}

/// Queues transmission `t` of `out` (made from `buf`) on its paced link at
/// `at_ns`: whole, or as its fragments (sealed first) when it is longer
/// than the link's MTU. `scratch`: reused room for the fragments and the
/// sealed datagram.
#[allow(clippy::too_many_arguments)]
fn enqueue_one(
    pacer: &mut Pacer,
    node: &mut Node,
    frag: &mut Frag,
    tally: &mut TxTally,
    (out, buf): (&Outbox, &[u8]),
    t: &anode_node::core::Transmit,
    (pieces, sealed): &mut (Vec<Vec<u8>>, Vec<u8>),
    at_ns: u64,
) {
    let mut bytes = out.bytes(&t.data, buf);
    if !frag.too_long(sealed_len(t, bytes)) {
        pacer.enqueue(node, t.iface, key_of(t), t.to, bytes, seal_overhead(t), at_ns);
        return;
    }
    if t.unsealed {
        if !node.seal_for(&t.to, bytes, sealed) {
            return;
        }
        bytes = sealed;
    }
    pieces.clear();
    if frag.split(bytes, pieces) == 0 {
        tally.count(t.iface, bytes.len(), false);
        return;
    }
    for p in pieces.iter() {
        pacer.enqueue(node, t.iface, key_of(t), t.to, p, None, at_ns);
    }
}

/// The link client transmission `t` is queued under: its owner, and its
/// channel's flow if it was sent on one.
fn key_of(t: &anode_node::core::Transmit) -> crate::pacer::TxKey {
    crate::pacer::TxKey { owner: t.owner, flow: t.flow }
}

/// What sealing will add to transmission `t` when its link sends it: the
/// core leaves a transmission unsealed only for a neighbour with an SA
/// (`Node::protect`), so no lookup per datagram here.
fn seal_overhead(t: &anode_node::core::Transmit) -> Option<usize> {
    t.unsealed.then_some(anode_node::core::SEAL_OVERHEAD)
}

/// The length of transmission `t` (its datagram `bytes`) as it will go on
/// its link, sealed.
fn sealed_len(t: &anode_node::core::Transmit, bytes: &[u8]) -> usize {
    bytes.len() + seal_overhead(t).unwrap_or(0)
}

/// The event loop's [`enqueue_paced`]: the batch's transmissions for each
/// paced interface, arrived at `at_ns`, as one burst.
///
/// When they are one owner's, none is longer than the link's MTU, and the
/// link has nothing queued, the link takes the burst at once
/// ([`Pacer::send_burst`]: its state is exactly that of queueing each at
/// `at_ns` and releasing at `now_ns`): the ones it lets go now are sealed
/// where they are and their places (outbox, transmission) added to `now`
/// for [`send_paced_now`], with no copy into the queue and out again, and
/// the rest are queued as usual. Sealed before anything the link releases
/// after them, and sent before [`Daemon::pace`] sends that, so the SA's
/// sequence numbers still follow the link's order. Otherwise each is
/// queued ([`enqueue_one`]).
///
/// Returns false when every transmission of `outs` was for a paced
/// interface, so that [`send_transmits`] has nothing to look for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send_or_enqueue_paced<B: AsRef<[u8]> + AsMut<[u8]>>(
    pacer: &mut Pacer,
    node: &mut Node,
    frag: &mut Frag,
    tally: &mut TxTally,
    (outs, bufs): (&mut [Outbox], &mut [B]),
    (at_ns, now_ns): (u64, u64),
    now: &mut Vec<(usize, usize)>,
    (burst, lens): &mut (Vec<(usize, usize)>, Vec<u32>),
) -> bool {
    let mut scratch = (Vec::new(), Vec::new());
    // Transmissions in all, and those for paced interfaces.
    let total: usize = outs.iter().map(|o| o.transmits.len()).sum();
    let mut paced = 0;
    for iface in 0..pacer.len() {
        if !pacer.paced(iface) {
            continue;
        }
        burst.clear();
        lens.clear();
        let mut owner = None;
        let mut one = true;
        for (i, (out, buf)) in outs.iter().zip(bufs.iter()).enumerate() {
            for (j, t) in out.transmits.iter().enumerate().filter(|(_, t)| t.iface == iface) {
                let len = sealed_len(t, out.bytes(&t.data, buf.as_ref()));
                let key = key_of(t);
                one &= !frag.too_long(len) && owner.is_none_or(|o| o == key);
                owner = Some(key);
                burst.push((i, j));
                lens.push(u32::try_from(len).unwrap_or(u32::MAX));
            }
        }
        let Some(owner) = owner else { continue };
        paced += burst.len();
        let went = if one {
            let (o, b): (&[Outbox], &[B]) = (outs, bufs);
            pacer.send_burst(node, iface, owner, lens, (at_ns, now_ns), |k| {
                let (i, j) = burst.get(k).copied().unwrap_or_default();
                let (out, buf) = (o.get(i)?, b.get(i)?);
                let t = out.transmits.get(j)?;
                Some((t.to, out.bytes(&t.data, buf.as_ref()), seal_overhead(t)))
            })
        } else {
            None
        };
        match went {
            Some(m) => {
                for &(i, j) in burst.iter().take(m) {
                    if let (Some(out), Some(buf)) = (outs.get_mut(i), bufs.get_mut(i))
                        && node.seal_transmit(out, j, buf.as_mut())
                    {
                        now.push((i, j));
                    }
                }
            }
            None => {
                for &(i, j) in burst.iter() {
                    if let (Some(out), Some(buf)) = (outs.get(i), bufs.get(i))
                        && let Some(t) = out.transmits.get(j)
                    {
                        enqueue_one(pacer, node, frag, tally, (out, buf.as_ref()), t, &mut scratch, at_ns);
                    }
                }
            }
        }
    }
    paced < total
}

/// Sends the datagrams that their paced links let go at once
/// ([`send_or_enqueue_paced`]: transmission `j` of outbox `i` for each
/// `(i, j)`, grouped by interface as it lists them), in order, a GSO run or
/// `sendmmsg` per [`BATCH`] per interface, in one pass, and charges each
/// one the kernel took to its owner's session (as [`Daemon::pace`] does for
/// the ones it releases).
pub(crate) fn send_paced_now<B: AsRef<[u8]>>(
    tx: &mut Tx<'_>,
    node: &mut Node,
    outs: &[Outbox],
    bufs: &[B],
    now: &[(usize, usize)],
) {
    let mut iovs = [[IoSlice::new(&[])]; BATCH];
    let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
    let mut owners = [(Owner::BestEffort, 0u64); BATCH];
    let mut k = 0;
    let mut cur = usize::MAX;
    let flush = |tx: &mut Tx<'_>,
                 node: &mut Node,
                 iface: usize,
                 iovs: &[[IoSlice<'_>; 1]],
                 addrs: &[Option<SockaddrStorage>],
                 owners: &[(Owner, u64)]| {
        let Some(sock) = tx.udp.get(iface) else { return };
        let sent = send_chunk(tx, sock, iface, iovs, addrs);
        charge_runs(node, owners.iter().enumerate().filter(|(n, _)| sent.get(*n)).map(|(_, o)| *o));
    };
    for &(i, j) in now {
        let (Some(out), Some(buf)) = (outs.get(i), bufs.get(i)) else { continue };
        let Some(t) = out.transmits.get(j) else { continue };
        if k > 0 && (t.iface != cur || k == BATCH) {
            flush(tx, node, cur, &iovs[..k], &addrs[..k], &owners[..k]);
            k = 0;
        }
        cur = t.iface;
        let bytes = out.bytes(&t.data, buf.as_ref());
        iovs[k] = [IoSlice::new(bytes)];
        addrs[k] = Some(SockaddrStorage::from(t.to));
        owners[k] = (t.owner, bytes.len() as u64);
        k += 1;
    }
    if k > 0 {
        flush(tx, node, cur, &iovs[..k], &addrs[..k], &owners[..k]);
    }
}

/// Charges datagrams a paced link sent (owner, bytes) to their owners'
/// sessions, one charge per run of one owner's datagrams (a burst is one
/// owner's) rather than a session lookup per datagram.
fn charge_runs(node: &mut Node, sent: impl Iterator<Item = (Owner, u64)>) {
    let mut run: Option<(Owner, u64, u64)> = None;
    for (owner, len) in sent {
        match &mut run {
            Some((o, p, b)) if *o == owner => (*p, *b) = (*p + 1, *b + len),
            _ => {
                if let Some((o, p, b)) = run.replace((owner, 1, len)) {
                    node.charge_sent(o, p, b);
                }
            }
        }
    }
    if let Some((o, p, b)) = run {
        node.charge_sent(o, p, b);
    }
}

/// Runs the first `k` slots of `rx` through fragment reassembly and the
/// core, logging what they produced; with `timed`, each slot's wall time
/// goes to `rx.spent` (for [`charge_batch`]).
pub(crate) fn run_core(
    node: &mut Node,
    frag: &mut Frag,
    rx: &mut Batch<'_>,
    iface: usize,
    k: usize,
    now_ms: u64,
    timed: bool,
) {
    let Batch { slots: bufs, lens, outs, froms, spent, .. } = rx;
    let mut t = timed.then(Instant::now);
    for i in 0..k {
        outs[i].clear();
        // A fragment is held until its datagram is whole, which is then
        // handled in its place (the buffer holds up to 64 KiB).
        if let Some(r) = frag.take(froms[i], bufs[i].get(..lens[i]).unwrap_or(&[]), now_ms) {
            match r {
                Ok(Some(whole)) if whole.len() <= bufs[i].len() => {
                    bufs[i][..whole.len()].copy_from_slice(&whole);
                    lens[i] = whole.len();
                }
                _ => {
                    spent[i] = 0;
                    if let Some(t0) = t.as_mut() {
                        *t0 = Instant::now();
                    }
                    continue;
                }
            }
        }
        node.handle_datagram_from(iface, froms[i], bufs[i], lens[i], now_ms, &mut outs[i]);
        if !outs[i].log.is_empty() {
            debug!(target: "anode::snap", "{}", outs[i].log.trim_end());
        }
        for e in &outs[i].events {
            info!("{e}");
        }
        if let Some(t0) = t.as_mut() {
            // Each datagram's share of the batch's CPU, by the wall time
            // its handling took (vDSO clock, not a syscall).
            let t1 = Instant::now();
            spent[i] = t1.saturating_duration_since(*t0).as_nanos() as u64;
            *t0 = t1;
        }
    }
}

/// Charges `used` ns of thread CPU for the first `k` slots of `rx`.
///
/// Network input runs between dispatches, for Best-Effort (SNAP,
/// forwarding), System (handshakes, keepalives, control requests) and the
/// principals whose sessions capsules and channel packets were accepted
/// for. The batch's thread CPU time (one clock read per batch) is split
/// among them by each datagram's wall time.
pub(crate) fn charge_batch(node: &mut Node, rx: &mut Batch<'_>, k: usize, used: u64) {
    let Batch { lens, outs, spent, shares, .. } = rx;
    split_batch(used, &outs[..k], &lens[..k], &spent[..k], shares);
    for s in shares.iter() {
        node.charge_outside(s.owner, s.ns, s.packets, s.bytes);
    }
}

/// Transmissions counted while the node is not at hand (a worker sends
/// outside the node's lock), added to its counters after.
#[derive(Debug, Clone, Default)]
pub(crate) struct TxTally {
    /// Per interface: datagrams and bytes sent.
    sent: Vec<(u64, u64)>,
    /// Datagrams refused, per interface.
    failed: Vec<u64>,
}

impl TxTally {
    /// Counts one datagram of `bytes` on `iface`, sent or refused.
    pub(crate) fn count(&mut self, iface: usize, bytes: usize, ok: bool) {
        if self.sent.len() <= iface {
            self.sent.resize(iface + 1, (0, 0));
            self.failed.resize(iface + 1, 0);
        }
        if ok {
            self.sent[iface].0 += 1;
            self.sent[iface].1 += bytes as u64;
        } else {
            self.failed[iface] += 1;
        }
    }

    /// Adds what was counted to `node`'s counters and starts again.
    pub(crate) fn apply(&mut self, node: &mut Node) {
        for (iface, ((p, b), f)) in self.sent.iter_mut().zip(self.failed.iter_mut()).enumerate() {
            if *p > 0 || *f > 0 {
                node.count_tx_batch(iface, *p, *b, *f);
            }
            (*p, *b, *f) = (0, 0, 0);
        }
    }
}

impl Rx {
    /// Buffers of `blen` bytes for a batch.
    pub(crate) fn new(blen: usize) -> Rx {
        Rx {
            raw: std::array::from_fn(|_| vec![0; blen]),
            got: [Received::default(); BATCH],
            mmsg: RecvMmsg::new(),
            bufs: std::array::from_fn(|_| vec![0; blen]),
            src: [None; BATCH],
            lens: [0; BATCH],
            outs: std::array::from_fn(|_| Outbox::preallocated()),
            froms: [None; BATCH],
            spent: [0; BATCH],
            shares: Vec::with_capacity(4),
        }
    }

    /// Moves the next datagrams of the `n` received, from `at` (message,
    /// offset in it) on, into the batch slots, at most [`BATCH`]; returns
    /// how many. A message that is one datagram changes places with the
    /// slot's buffer (no copy). A GRO run is cut into its datagrams, each
    /// handled where it arrived ([`Rx::batch`]: exactly its bytes, so the
    /// core copies one only if it needs more room, a SNAP packet's stack
    /// growing, say; a forwarded datagram is sealed again in its own
    /// headers' and tag's bytes); a fragment is copied into its slot's own
    /// buffer, which reassembly needs.
    pub(crate) fn fill(&mut self, n: usize, at: &mut (usize, usize), c: &mut IoCounters) -> usize {
        let mut k = 0;
        while k < BATCH && at.0 < n {
            let m = at.0;
            let Received { len, seg, from } = self.got[m];
            self.froms[k] = from;
            self.src[k] = None;
            if at.1 == 0 && (seg == 0 || seg >= len) {
                std::mem::swap(&mut self.raw[m], &mut self.bufs[k]);
                self.lens[k] = len;
                *at = (m + 1, 0);
            } else {
                if at.1 == 0 {
                    c.gro_receives += 1;
                }
                let end = at.1.saturating_add(seg).min(len);
                let piece = self.raw[m].get(at.1..end).unwrap_or(&[]);
                if crate::frag::is_fragment(piece) {
                    let l = piece.len().min(self.bufs[k].len());
                    self.bufs[k][..l].copy_from_slice(&piece[..l]);
                    self.lens[k] = l;
                } else {
                    self.src[k] = Some((m, at.1));
                    self.lens[k] = piece.len();
                }
                c.gro_datagrams += 1;
                *at = if end >= len { (m + 1, 0) } else { (m, end) };
            }
            k += 1;
        }
        c.datagrams += k as u64;
        k
    }

    /// The first `k` slots as a [`Batch`]: each slot's bytes (its own
    /// buffer, or exactly its datagram's bytes in the GRO run it arrived
    /// in; the slots of one run are disjoint parts of its buffer).
    pub(crate) fn batch(&mut self, k: usize) -> Batch<'_> {
        let Rx { raw, bufs, src, lens, outs, froms, spent, shares, .. } = self;
        let mut slots: [&mut [u8]; BATCH] = std::array::from_fn(|_| Default::default());
        let mut raws = raw.iter_mut().enumerate();
        // The GRO run being cut: its index, the offset where `rest` begins
        // and what of it the slots have not taken.
        let mut cur: Option<(usize, usize, &mut [u8])> = None;
        for (i, (slot, own)) in slots.iter_mut().zip(bufs.iter_mut()).enumerate().take(k) {
            let Some((m, off)) = src[i] else {
                *slot = own.as_mut_slice();
                continue;
            };
            // Slots come in the order of their messages and offsets.
            if cur.as_ref().is_none_or(|c| c.0 != m) {
                cur = raws.by_ref().find(|(j, _)| *j == m).map(|(j, r)| (j, 0, r.as_mut_slice()));
            }
            if let Some((_, base, rest)) = cur.as_mut() {
                let whole = std::mem::take(rest);
                let skip = off.saturating_sub(*base).min(whole.len());
                let (_, tail) = whole.split_at_mut(skip);
                let n = lens[i].min(tail.len());
                let (seg, after) = tail.split_at_mut(n);
                *slot = seg;
                *rest = after;
                *base += skip + n;
            }
        }
        Batch { slots, lens, outs, froms, spent, shares }
    }
}

/// A receive batch's slots, as the core and the send path work on them.
pub(crate) struct Batch<'a> {
    /// Each slot's bytes: its datagram from 0 to its length, and for a slot
    /// with its own buffer the room behind.
    pub(crate) slots: [&'a mut [u8]; BATCH],
    pub(crate) lens: &'a mut [usize; BATCH],
    pub(crate) outs: &'a mut [Outbox; BATCH],
    pub(crate) froms: &'a [Option<SocketAddr>; BATCH],
    pub(crate) spent: &'a mut [u64; BATCH],
    pub(crate) shares: &'a mut Vec<Share>,
}

/// Sends every transmission of `outs` (the outbox of datagram `i` points
/// into `bufs[i]`), grouped by interface, [`BATCH`] per `sendmmsg` or a
/// GSO run per `sendmsg`.
pub(crate) fn send_transmits<B: AsRef<[u8]>>(tx: &mut Tx<'_>, outs: &[Outbox], bufs: &[B]) {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    for (iface, sock) in tx.udp.iter().enumerate() {
        if tx.skip.get(iface).copied().unwrap_or(false) {
            continue;
        }
        let mut iovs = [[IoSlice::new(&[])]; BATCH];
        let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
        let mut k = 0;
        let mut oversize = false;
        for (out, buf) in outs.iter().zip(bufs) {
            // An unsealed transmission only ever goes through a paced link
            // (`Pacer::seal_released`); never in the clear.
            for t in out.transmits.iter().filter(|t| t.iface == iface && !t.unsealed) {
                let bytes = out.bytes(&t.data, buf.as_ref());
                if tx.frag.too_long(bytes.len()) {
                    oversize = true;
                    continue;
                }
                iovs[k] = [IoSlice::new(bytes)];
                addrs[k] = Some(SockaddrStorage::from(t.to));
                k += 1;
                if k == BATCH {
                    send_chunk(tx, sock, iface, &iovs[..k], &addrs[..k]);
                    k = 0;
                }
            }
        }
        if k > 0 {
            send_chunk(tx, sock, iface, &iovs[..k], &addrs[..k]);
        }
        // Datagrams longer than the link's MTU, as fragments (the slow path:
        // capsules with their code, control messages), in a second pass only
        // when the first one skipped any.
        if !oversize {
            continue;
        }
        for (out, buf) in outs.iter().zip(bufs) {
            // An unsealed transmission only ever goes through a paced link
            // (`Pacer::seal_released`); never in the clear.
            for t in out.transmits.iter().filter(|t| t.iface == iface && !t.unsealed) {
                let bytes = out.bytes(&t.data, buf.as_ref());
                if !tx.frag.too_long(bytes.len()) {
                    continue;
                }
                pieces.clear();
                if tx.frag.split(bytes, &mut pieces) == 0 {
                    tx.tally.count(iface, bytes.len(), false);
                    tx.droplog.tx_error = Some(format!("a datagram of {} bytes cannot be fragmented", bytes.len()));
                    continue;
                }
                for chunk in pieces.chunks(BATCH) {
                    let mut iovs = [[IoSlice::new(&[])]; BATCH];
                    let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
                    for (j, p) in chunk.iter().enumerate() {
                        iovs[j] = [IoSlice::new(p)];
                        addrs[j] = Some(SockaddrStorage::from(t.to));
                    }
                    send_chunk(tx, sock, iface, &iovs[..chunk.len()], &addrs[..chunk.len()]);
                }
            }
        }
    }
    // Transmissions naming an interface that does not exist cannot happen
    // (the core only routes to configured neighbours), but count them.
    for out in outs {
        for t in out.transmits.iter().filter(|t| t.iface >= tx.udp.len()) {
            tx.tally.count(t.iface, 0, false);
        }
    }
}

/// Sends one chunk of datagrams on `iface`: each GSO run (see
/// [`gso_run`]) in one `sendmsg` where the interface has GSO, the
/// datagrams between runs by `sendmmsg`.
pub(crate) fn send_chunk(
    tx: &mut Tx<'_>,
    sock: &UdpSocket,
    iface: usize,
    iovs: &[[IoSlice<'_>; 1]],
    addrs: &[Option<SockaddrStorage>],
) -> Sent {
    let mut sent = Sent::default();
    let mut start = 0;
    while start < iovs.len() {
        let max = tx.off.gso(iface);
        let r = if max > 1 { gso_run(&iovs[start..], &addrs[start..], max) } else { 1 };
        if r > 1
            && let Some(Some(to)) = addrs.get(start)
            && let Some(ok) = tx.off.send_run(sock, iface, tx.tally, tx.droplog, &iovs[start..start + r], to)
        {
            if ok {
                sent.set_range(start, start + r);
            }
            start += r;
            continue;
        }
        // Datagram by datagram up to where the next run starts (all of
        // them when GSO is off or the kernel refused this run).
        let mut end = start + r.max(1);
        if tx.off.gso(iface) > 1 {
            while end < iovs.len() && gso_run(&iovs[end..], &addrs[end..], 2) < 2 {
                end += 1;
            }
        } else {
            end = iovs.len();
        }
        send_each(tx, sock, iface, &iovs[start..end], &addrs[start..end], start, &mut sent);
        start = end;
    }
    sent
}

/// Which datagrams of a chunk ([`BATCH`] at most) the kernel took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent(u64);

impl Sent {
    /// Whether datagram `i` of the chunk was sent.
    pub(crate) fn get(self, i: usize) -> bool {
        i < 64 && self.0 & (1 << i) != 0
    }

    fn set_range(&mut self, from: usize, to: usize) {
        for i in from..to.min(64) {
            self.0 |= 1 << i;
        }
    }
}

/// `sendmmsg` of `iovs`, [`BATCH`] at most; a datagram the kernel refuses
/// is counted and dropped. Marks those sent in `sent`, from `base` on.
fn send_each(
    tx: &mut Tx<'_>,
    sock: &UdpSocket,
    iface: usize,
    iovs: &[[IoSlice<'_>; 1]],
    addrs: &[Option<SockaddrStorage>],
    base: usize,
    sent_mask: &mut Sent,
) {
    let fd = sock.as_raw_fd();
    let mut start = 0;
    while start < iovs.len() {
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        // The result iterator yields one item per message sent; only the
        // count matters here.
        let r = sendmmsg(fd, tx.hdrs, iovs[start..].iter(), &addrs[start..], no_cmsgs, MsgFlags::MSG_DONTWAIT)
            .map(Iterator::count);
        match r {
            Ok(sent) if sent > 0 => {
                for io in &iovs[start..start + sent] {
                    tx.tally.count(iface, io[0].len(), true);
                }
                sent_mask.set_range(base + start, base + start + sent);
                start += sent;
            }
            Err(Errno::EINTR) => {}
            other => {
                // The first message was refused (e.g. EAGAIN: the socket
                // buffer is full). Drop it, as a router would, and go on.
                let e = other.err().unwrap_or(Errno::EAGAIN);
                tx.tally.count(iface, iovs[start][0].len(), false);
                tx.droplog.tx_error = Some(format!("{e} (to {:?})", addrs[start].map(|a| a.to_string())));
                start += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anode_node::core::Outbox;
    use anode_sandbox::PrincipalId;

    fn outbox(system: bool, rx_for: Option<PrincipalId>) -> Outbox {
        let mut o = Outbox::default();
        o.system = system;
        o.rx_for = rx_for;
        o
    }

    /// `rx`'s message `m` holds `bytes`, cut into GRO segments of `seg`
    /// (0: one datagram).
    fn received(rx: &mut Rx, m: usize, bytes: &[u8], seg: usize) {
        rx.raw[m][..bytes.len()].copy_from_slice(bytes);
        rx.got[m] = Received { len: bytes.len(), seg, from: None };
    }

    #[test]
    fn gro_segments_are_handled_where_they_arrived_and_fragments_and_single_datagrams_in_their_slots() {
        let mut rx = Rx::new(64);
        let run: Vec<u8> = (0..25).collect();
        received(&mut rx, 0, &run, 10);
        let single: Vec<u8> = (100..107).collect();
        received(&mut rx, 1, &single, 0);
        let mut second: Vec<u8> = (200..216).collect();
        second[2..4].copy_from_slice(&anode_wire::frag::TYPE_FRAGMENT.to_be_bytes());
        received(&mut rx, 2, &second, 8);
        let mut c = IoCounters::default();
        let mut at = (0, 0);
        let k = rx.fill(3, &mut at, &mut c);
        assert_eq!((k, at), (6, (3, 0)));
        assert_eq!(rx.src[..k], [Some((0, 0)), Some((0, 10)), Some((0, 20)), None, None, Some((2, 8))]);
        assert_eq!(rx.lens[..k], [10, 10, 5, 7, 8, 8]);
        assert_eq!((c.gro_receives, c.gro_datagrams, c.datagrams), (2, 5, 6));
        let b = rx.batch(k);
        assert_eq!(&*b.slots[0], &run[..10]);
        assert_eq!(&*b.slots[1], &run[10..20]);
        assert_eq!(&*b.slots[2], &run[20..]);
        // A single datagram and a fragment: in the slot's own buffer, with
        // the room behind it.
        assert_eq!((&b.slots[3][..7], b.slots[3].len()), (&single[..], 64));
        assert_eq!((&b.slots[4][..8], b.slots[4].len()), (&second[..8], 64));
        assert_eq!(&*b.slots[5], &second[8..]);
        // Each slot is its own datagram's bytes: writing one leaves the
        // others of its run as they were.
        b.slots[1].fill(0xff);
        assert_eq!(&*b.slots[0], &run[..10]);
        assert_eq!(&*b.slots[2], &run[20..]);
        assert_eq!(&rx.raw[0][10..20], &[0xff; 10]);
    }

    #[test]
    fn a_gro_run_longer_than_a_batch_continues_in_the_next() {
        let mut rx = Rx::new(64 * 40);
        let run: Vec<u8> = (0..40 * 3).map(|i| i as u8).collect();
        received(&mut rx, 0, &run, 3);
        let mut c = IoCounters::default();
        let mut at = (0, 0);
        let k = rx.fill(1, &mut at, &mut c);
        assert_eq!((k, at), (BATCH, (0, 3 * BATCH)));
        let b = rx.batch(k);
        assert!(b.slots.iter().enumerate().all(|(i, s)| **s == run[3 * i..3 * i + 3]));
        let k = rx.fill(1, &mut at, &mut c);
        assert_eq!((k, at), (40 - BATCH, (1, 0)));
        let b = rx.batch(k);
        for (i, s) in b.slots.iter().enumerate().take(k) {
            assert_eq!(**s, run[3 * (BATCH + i)..3 * (BATCH + i) + 3]);
        }
        assert_eq!((c.gro_receives, c.gro_datagrams), (1, 40));
    }

    fn share(shares: &[Share], owner: Owner) -> Share {
        *shares.iter().find(|s| s.owner == owner).expect("owner has a share")
    }

    #[test]
    fn a_slow_control_request_is_charged_to_system_not_by_count() {
        // One control request that took 900 us beside three forwarded
        // packets of 10 us each: System gets 90 % of the batch's CPU, not
        // a quarter of it as a split by datagram count would give.
        let outs = [outbox(true, None), outbox(false, None), outbox(false, None), outbox(false, None)];
        let mut shares = Vec::new();
        split_batch(1_000_000, &outs, &[300, 100, 100, 100], &[900, 10, 10, 10], &mut shares);
        let sys = share(&shares, Owner::System);
        let be = share(&shares, Owner::BestEffort);
        assert_eq!((sys.packets, sys.bytes), (1, 300));
        assert_eq!((be.packets, be.bytes), (3, 300));
        assert_eq!(sys.ns, 967_741); // 1e6 * 900 / 930
        assert_eq!(sys.ns + be.ns, 1_000_000);
    }

    #[test]
    fn a_capsule_accepted_for_a_session_charges_its_principal_and_no_packets() {
        let p = PrincipalId([7; 32]);
        let q = PrincipalId([8; 32]);
        let outs = [outbox(false, Some(p)), outbox(false, None), outbox(false, Some(q)), outbox(false, Some(p))];
        let mut shares = Vec::new();
        split_batch(10_007, &outs, &[500, 100, 400, 500], &[40, 10, 20, 30], &mut shares);
        let sp = share(&shares, Owner::Principal(p));
        let sq = share(&shares, Owner::Principal(q));
        let be = share(&shares, Owner::BestEffort);
        // Their packets were charged when queued; not again here.
        assert_eq!((sp.packets, sp.bytes, sq.packets, sq.bytes), (0, 0, 0, 0));
        assert_eq!((be.packets, be.bytes), (1, 100));
        assert_eq!(sp.ns, 7_004); // 10007 * 70 / 100
        assert_eq!(be.ns, 1_000);
        assert_eq!(sp.ns + sq.ns + be.ns, 10_007);
        assert_eq!(shares.len(), 3);
    }

    #[test]
    fn without_timings_the_split_is_by_count_and_still_adds_up() {
        let outs = [outbox(true, None), outbox(false, None), outbox(false, None)];
        let mut shares = vec![Share { owner: Owner::System, ns: 5, packets: 5, bytes: 5 }];
        split_batch(100, &outs, &[1, 1, 1], &[0, 0, 0], &mut shares);
        assert_eq!(share(&shares, Owner::System).ns, 33);
        assert_eq!(share(&shares, Owner::BestEffort).ns, 67);
        split_batch(0, &[], &[], &[], &mut shares);
        assert!(shares.is_empty());
    }
}

/// GSO and GRO through a real daemon on loopback: its receive and send
/// paths driven by hand (`udp_ready`), without the event loop. `line` and
/// `plain` serve the pacer's test too.
#[cfg(test)]
pub(crate) mod offload_tests {
    use crate::daemon::{Daemon, Options};
    use anode_node::anep;
    use anode_node::config::NodeConfig;
    use nix::sys::socket::{ControlMessage, MsgFlags, SockaddrStorage, sendmsg};
    use std::io::IoSlice;
    use std::net::{SocketAddr, UdpSocket};
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::Duration;

    /// b between a (west) and c (east), plain forwarding, `io` as the
    /// `[io]` section and `east` added to the east interface (a `rate_bps`,
    /// say). b's ports lie below the ephemeral range (`crate::ports`), so
    /// no other test's socket takes one before b binds it.
    pub(crate) fn line(io: &str, east: &str, tag: &str) -> (Daemon, UdpSocket, UdpSocket, SocketAddr) {
        let a = UdpSocket::bind("127.0.0.1:0").expect("bind a");
        let c = UdpSocket::bind("127.0.0.1:0").expect("bind c");
        c.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
        let free: Vec<u16> = crate::ports::reserve_loopback(2)
            .expect("free ports")
            .iter()
            .map(|s| s.local_addr().expect("addr").port())
            .collect();
        let run_dir = std::env::temp_dir().join(format!("anode-offload-{tag}-{}", std::process::id()));
        let cfg = NodeConfig::from_toml(&format!(
            "address = \"10.0.0.2\"\nrun_dir = \"{}\"\n\
             [[interface]]\nname = \"west\"\nlisten = \"127.0.0.1:{}\"\n\
             neighbors = [{{ address = \"10.0.0.1\", endpoint = \"{}\" }}]\n\
             [[interface]]\nname = \"east\"\nlisten = \"127.0.0.1:{}\"\n{east}\
             neighbors = [{{ address = \"10.0.0.3\", endpoint = \"{}\" }}]\n\
             [io]\n{io}\n",
            run_dir.display(),
            free[0],
            a.local_addr().expect("a"),
            free[1],
            c.local_addr().expect("c"),
        ))
        .expect("config");
        let d = Daemon::bind(&cfg, None, &Options::default()).expect("daemon");
        let west = d.listen_addrs()[0];
        (d, a, c, west)
    }

    /// A plain datagram to c of `len` bytes whose payload is `seq` repeated.
    pub(crate) fn plain(len: usize, seq: u8) -> Vec<u8> {
        let mut p = vec![seq; len];
        let plen = len - anep::HEADER_LEN;
        anep::write_header(&mut p, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, plen);
        anode_node::plain::Repr {
            dst: "10.0.0.3".parse().expect("addr"),
            src: "10.0.0.1".parse().expect("addr"),
            ttl: 8,
            port: 9,
        }
        .emit(&mut p[anep::HEADER_LEN..])
        .expect("header room");
        p
    }

    /// Sends `dgrams` from `a` to `to` as one GSO run (the last may be
    /// shorter).
    fn send_run(a: &UdpSocket, to: SocketAddr, dgrams: &[Vec<u8>]) {
        let iovs: Vec<IoSlice<'_>> = dgrams.iter().map(|d| IoSlice::new(d)).collect();
        let seg = dgrams[0].len() as u16;
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        let to = SockaddrStorage::from(to);
        sendmsg(a.as_raw_fd(), &iovs, &cmsg, MsgFlags::empty(), Some(&to)).expect("GSO send from a");
    }

    /// Runs b's receive path until `want` datagrams reached c (or a
    /// second passed); returns them.
    fn forward(d: &mut Daemon, c: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70_000];
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while got.len() < want && std::time::Instant::now() < deadline {
            d.udp_ready(0);
            c.set_nonblocking(true).expect("nonblocking");
            while let Ok((n, _)) = c.recv_from(&mut buf) {
                got.push(buf[..n].to_vec());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    }

    /// The 20 datagrams a sends: 19 of 300 bytes and a last of 120.
    fn burst() -> Vec<Vec<u8>> {
        (0..20u8).map(|i| plain(if i == 19 { 120 } else { 300 }, i + 1)).collect()
    }

    /// What c must receive for `sent`: each datagram with its TTL lowered.
    fn check(sent: &[Vec<u8>], got: &[Vec<u8>]) {
        assert_eq!(got.len(), sent.len(), "every datagram crossed b");
        for (s, g) in sent.iter().zip(got) {
            assert_eq!(g.len(), s.len());
            let p = anode_node::plain::Packet::new_checked(&g[anep::HEADER_LEN..]).expect("a plain header");
            let r = anode_node::plain::Repr::parse(&p);
            assert_eq!(r.ttl, 7);
            let body = anep::HEADER_LEN + anode_node::plain::HEADER_LEN;
            assert_eq!(g[body..], s[body..], "payloads in order and intact");
        }
    }

    #[test]
    fn a_gso_run_arrives_as_one_gro_receive_is_cut_into_datagrams_and_leaves_as_one_gso_send() {
        let (mut d, a, c, west) = line("gso = true\ngro = true\nspin_us = 0", "", "on");
        let sent = burst();
        send_run(&a, west, &sent);
        let got = forward(&mut d, &c, sent.len());
        check(&sent, &got);
        let k = d.offload.counters;
        assert_eq!(k.gro_receives, 1, "{k:?}: loopback hands a GSO run whole to a GRO socket");
        assert_eq!(k.gro_datagrams, 20, "{k:?}");
        assert_eq!((k.gso_sends, k.gso_datagrams, k.gso_fallbacks), (1, 20, 0), "{k:?}");
        assert_eq!(d.node().counters.plain_forwarded, 20);
    }

    #[test]
    fn with_the_offloads_off_the_same_datagrams_cross_one_by_one() {
        let (mut d, a, c, west) = line("gso = false\ngro = false\nspin_us = 0", "", "off");
        let sent = burst();
        send_run(&a, west, &sent);
        let got = forward(&mut d, &c, sent.len());
        check(&sent, &got);
        let k = d.offload.counters;
        assert_eq!((k.gro_receives, k.gro_datagrams, k.gso_sends, k.gso_datagrams), (0, 0, 0, 0), "{k:?}");
        assert_eq!(d.node().counters.plain_forwarded, 20);
    }

    #[test]
    fn a_gso_run_the_kernel_refuses_is_sent_datagram_by_datagram() {
        let (mut d, a, c, west) = line("gso = true\ngro = true\nspin_us = 0", "", "refused");
        // With SO_NO_CHECK the kernel refuses every GSO send (EINVAL).
        crate::mmsg::set_no_check(d.udp[1].as_fd()).expect("SO_NO_CHECK");
        let sent = burst();
        send_run(&a, west, &sent);
        let got = forward(&mut d, &c, sent.len());
        check(&sent, &got);
        let k = d.offload.counters;
        assert_eq!((k.gso_sends, k.gso_fallbacks), (0, 1), "{k:?}");
        assert_eq!(d.node().counters.plain_forwarded, 20);
    }

    #[test]
    fn a_gro_run_with_a_malformed_datagram_loses_only_that_datagram() {
        let (mut d, a, c, west) = line("gso = true\ngro = true\nspin_us = 0", "", "bad");
        let mut sent = burst();
        // Datagram 5 claims a longer ANEP length than its segment.
        anep::write_header(&mut sent[5], anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, 900);
        send_run(&a, west, &sent);
        let got = forward(&mut d, &c, sent.len() - 1);
        let mut good = sent.clone();
        good.remove(5);
        check(&good, &got);
        assert_eq!(d.offload.counters.gro_datagrams, 20);
        assert_eq!(d.node().counters.plain_forwarded, 19);
    }
}
