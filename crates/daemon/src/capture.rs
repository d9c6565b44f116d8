//! `anode capture` on the control socket (issue 19): the operator's request
//! turns its control connection into a stream of the node's plaintext
//! datagrams (`anode_wire::capture` frames), drained from the core's
//! bounded capture queue after each wakeup.
//!
//! Who may capture: the control socket is the node user's (mode 0600 in a
//! 0700 run directory), or its `[local] socket_group`'s (0660, 0750) when
//! that is set. A capture reveals plaintext, so beyond the socket's mode
//! the daemon checks the client's credentials (`SO_PEERCRED`): only a
//! client running as the node's own user or as root is served; a group
//! member that may read `status` is refused (`NotOperator`).
//!
//! A client that cannot keep up never slows the node: the core's queue is
//! bounded (full: the copy is dropped and counted, the datagram goes on),
//! this connection holds at most [`OUT_CAP`] bytes beyond what its socket
//! took, and a client that takes nothing for `[local] stall_timeout_ms`
//! while data waits is disconnected and the capture stopped
//! (`stopped_stalled`).

use crate::control::{Conn, Listener, Progress, Stream};
use crate::daemon::Daemon;
use anode_node::core::{CAPTURE_QUEUE, CAPTURE_QUEUE_BYTES, CaptureConfig, CaptureDir, CaptureStop, Captured};
use anode_wire::capture::{self as wire, Direction, Frame, Refusal};
use nix::sys::epoll::{EpollEvent, EpollFlags};
use std::io;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Bytes of frames a capture connection holds beyond what its socket took.
pub const OUT_CAP: usize = 256 << 10;

/// How long an idle capture connection (nothing waiting) may stay quiet:
/// long, since it only ends when the client goes.
const IDLE: Duration = Duration::from_secs(3600);

/// A control connection that is streaming a capture.
#[derive(Debug)]
pub(crate) struct CaptureConn {
    out: Vec<u8>,
    sent: usize,
    /// The drop count last reported to the client.
    drops_sent: u64,
    /// Who asked: (uid, pid), for `status`.
    who: (u32, i32),
    /// Since when bytes wait and the socket took none of them.
    waiting_since: Option<Instant>,
    /// The client shut down its sending side (as `socat` does after the
    /// request): stop reading; the capture goes on until it hangs up.
    input_closed: bool,
}

impl CaptureConn {
    /// Bytes waiting for the client's socket.
    fn pending(&self) -> usize {
        self.out.len() - self.sent
    }
}

/// Whether a client running as `uid` may capture on a node running as
/// `node_uid`: its own user or root only.
///
/// # Errors
/// [`Refusal::NotOperator`] with the reason.
pub(crate) fn operator_check(uid: Option<u32>, node_uid: u32) -> Result<(), (Refusal, String)> {
    match uid {
        Some(u) if u == node_uid || u == 0 => Ok(()),
        Some(u) => Err((
            Refusal::NotOperator,
            format!(
                "uid {u} is not this node's operator: a capture reveals plaintext, so only the node's user (uid {node_uid}) or root may run it"
            ),
        )),
        None => Err((Refusal::NotOperator, "the client's credentials are unknown".into())),
    }
}

fn refused(code: Refusal, why: &str) -> Vec<u8> {
    let mut v = Vec::new();
    let _ = Frame::Refused(code, why).emit(&mut v);
    v
}

fn frame_of(p: &Captured, out: &mut Vec<u8>) -> bool {
    let f = Frame::Packet(wire::Packet {
        dir: match p.dir {
            CaptureDir::In => Direction::In,
            CaptureDir::Out => Direction::Out,
        },
        iface: u8::try_from(p.iface).unwrap_or(u8::MAX),
        ts_ns: p.ts_ns,
        peer: wire::v4_of(p.peer),
        local: wire::v4_of(p.local),
        datagram: p.data.get(..wire::MAX_DATAGRAM).unwrap_or(&p.data),
    });
    f.emit(out).is_ok()
}

impl Daemon {
    /// A `capture` request on control connection `c` (token `token`):
    /// checks who asks and what, starts the core's capture and answers
    /// with a `start` frame (the connection then streams), or answers with
    /// a `refused` frame and closes.
    pub(crate) fn capture_begin(
        &mut self,
        c: &mut Conn,
        req: &Result<(Option<String>, Option<u32>), wire::RequestError>,
        token: u64,
    ) -> Progress {
        let uid_pid = match &c.stream {
            Stream::Unix(s) => nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
                .ok()
                .map(|k| (k.uid(), k.pid())),
            Stream::Tcp(_) => None,
        };
        match self.capture_check(uid_pid.map(|(u, _)| u), req) {
            Err((code, why)) => {
                self.node.capture_refused();
                warn!(uid = ?uid_pid.map(|(u, _)| u), reason = %why, "capture refused");
                c.respond(refused(code, &why))
            }
            Ok(cfg) => {
                let ifaces: Vec<wire::Iface<'_>> = self
                    .cfg
                    .interfaces
                    .iter()
                    .zip(&self.listen)
                    .enumerate()
                    .map(|(i, (f, l))| wire::Iface {
                        index: u8::try_from(i).unwrap_or(u8::MAX),
                        local: wire::v4_of(*l),
                        name: &f.name,
                    })
                    .collect();
                let mut out = Vec::new();
                if Frame::Start(ifaces).emit(&mut out).is_err() {
                    self.node.capture_refused();
                    return c
                        .respond(refused(Refusal::BadRequest, "more than 255 interfaces, or a name over 255 bytes"));
                }
                if let Err(e) = self.node.capture_start(cfg) {
                    self.node.capture_refused();
                    return c.respond(refused(Refusal::Busy, &e.to_string()));
                }
                let who = uid_pid.unwrap_or((u32::MAX, 0));
                info!(uid = who.0, pid = who.1, "capture started for the operator: plaintext is leaving the node");
                c.capture = Some(Box::new(CaptureConn {
                    out,
                    sent: 0,
                    drops_sent: 0,
                    who,
                    waiting_since: None,
                    input_closed: false,
                }));
                c.responding = true;
                c.deadline = Instant::now() + Duration::from_millis(self.cfg.local.stall_timeout_ms);
                self.capture_flush(c, token)
            }
        }
    }

    fn capture_check(
        &self,
        uid: Option<u32>,
        req: &Result<(Option<String>, Option<u32>), wire::RequestError>,
    ) -> Result<CaptureConfig, (Refusal, String)> {
        operator_check(uid, nix::unistd::geteuid().as_raw())?;
        let (iface, queue) = req.as_ref().map_err(|e| (Refusal::BadRequest, e.to_string()))?;
        let n = self.cfg.interfaces.len();
        let interfaces = match iface {
            None => vec![true; n],
            Some(name) => {
                if !self.cfg.interfaces.iter().any(|i| &i.name == name) {
                    let names: Vec<&str> = self.cfg.interfaces.iter().map(|i| i.name.as_str()).collect();
                    return Err((
                        Refusal::UnknownInterface,
                        format!("no interface {name:?} (this node has {})", names.join(", ")),
                    ));
                }
                self.cfg.interfaces.iter().map(|i| &i.name == name).collect()
            }
        };
        let unix_ms_at_zero = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
            .saturating_sub(self.now_ms());
        Ok(CaptureConfig {
            interfaces,
            local: self.listen.clone(),
            queue: queue.map_or(CAPTURE_QUEUE, |q| q as usize),
            queue_bytes: CAPTURE_QUEUE_BYTES,
            unix_ms_at_zero,
        })
    }

    /// Events on a capturing connection: input (the client may only close;
    /// anything it sends is read and ignored), hang-up, and room to write.
    pub(crate) fn capture_ready(&mut self, c: &mut Conn, ev: EpollFlags, token: u64) -> Progress {
        if ev.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            return Progress::Close;
        }
        if ev.contains(EpollFlags::EPOLLIN) && c.capture.as_ref().is_some_and(|cc| !cc.input_closed) {
            let mut chunk = [0u8; 256];
            for _ in 0..16 {
                match c.stream_mut().read(&mut chunk) {
                    Ok(0) => {
                        if let Some(cc) = c.capture.as_mut() {
                            cc.input_closed = true;
                        }
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Progress::Close,
                }
            }
        }
        self.capture_flush(c, token)
    }

    /// Writes what waits, refilling from the core's queue while the socket
    /// takes it; then asks for writability only if something still waits.
    pub(crate) fn capture_flush(&mut self, c: &mut Conn, token: u64) -> Progress {
        let Some(mut cc) = c.capture.take() else { return Progress::Close };
        let mut progressed = false;
        let r = loop {
            while cc.pending() > 0 {
                match c.stream_mut().write(&cc.out[cc.sent..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        cc.sent += n;
                        progressed = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        c.capture = Some(cc);
                        return Progress::Close;
                    }
                }
            }
            if cc.pending() > 0 {
                break Progress::Pending;
            }
            cc.out.clear();
            cc.sent = 0;
            let drops = self.node.capture_drops();
            if drops != cc.drops_sent {
                let _ = Frame::Drops(drops).emit(&mut cc.out);
                cc.drops_sent = drops;
            }
            let out = &mut cc.out;
            self.node.capture_drain(usize::MAX, |p| {
                if out.len() >= OUT_CAP {
                    return false;
                }
                // Cannot fail: the datagram is cut to what a frame carries.
                let _ = frame_of(p, out);
                true
            });
            if cc.out.is_empty() {
                break Progress::Pending;
            }
        };
        // The stall clock runs from the last write that made progress, or
        // from when bytes began to wait (the socket may be full right when
        // a batch is queued).
        let now = Instant::now();
        if cc.pending() == 0 {
            cc.waiting_since = None;
            c.deadline = now + IDLE;
        } else {
            if progressed || cc.waiting_since.is_none() {
                cc.waiting_since = Some(now);
            }
            let since = cc.waiting_since.unwrap_or(now);
            c.deadline = since + Duration::from_millis(self.cfg.local.stall_timeout_ms);
        }
        // A hang-up is reported whatever the interest.
        let mut flags = if cc.input_closed { EpollFlags::empty() } else { EpollFlags::EPOLLIN };
        if cc.pending() > 0 {
            flags |= EpollFlags::EPOLLOUT;
        }
        let _ = self.epoll.modify(&c.stream, &mut EpollEvent::new(flags, token));
        c.capture = Some(cc);
        r
    }

    /// Streams what the core captured since the last wakeup (from the
    /// event loop; nothing when no capture runs).
    pub(crate) fn run_capture(&mut self) {
        if !self.node.capture_on() {
            return;
        }
        let Some(slot) = self.control_conns.iter().position(|c| c.as_ref().is_some_and(|c| c.capture.is_some())) else {
            // The connection is gone: nothing will read (cannot happen:
            // closing the connection stops the capture).
            self.node.capture_stop(CaptureStop::ClientGone);
            return;
        };
        let Some(mut c) = self.control_conns.get_mut(slot).and_then(Option::take) else { return };
        let p = self.capture_flush(&mut c, crate::TOKEN_CONN + slot as u64);
        self.control_conns[slot] = Some(c);
        if p == Progress::Close {
            self.close_conn(Listener::Control, slot);
        }
    }

    /// The `capture` section of `anode status`: the core's counters and
    /// the running capture's client.
    pub(crate) fn capture_json(&self) -> serde_json::Value {
        let mut v = self.node.capture_json();
        let client = self.control_conns.iter().flatten().find_map(|c| c.capture.as_ref());
        if let (Some(cc), Some(o)) = (client, v.as_object_mut()) {
            o.insert(
                "client".into(),
                serde_json::json!({"uid": cc.who.0, "pid": cc.who.1, "pending_bytes": cc.pending()}),
            );
        }
        v
    }

    /// The capture counters in Prometheus text.
    pub(crate) fn capture_prometheus(&self) -> String {
        let mut s = String::new();
        let k = self.node.capture_counters();
        for (name, help, v) in [
            ("started", "Captures started by the operator.", k.started),
            ("refused", "Capture requests refused.", k.refused),
            ("stopped_client", "Captures ended by their client.", k.stopped_client),
            ("stopped_stalled", "Captures stopped because their client stalled.", k.stopped_stalled),
            ("queued_in", "Received datagrams captured.", k.queued_in),
            ("queued_out", "Sent datagrams captured.", k.queued_out),
            ("drops", "Datagrams not captured: the capture queue was full.", k.drops),
            ("drained", "Captured datagrams streamed toward the client.", k.drained),
        ] {
            crate::control::prom_counter(&mut s, &format!("anode_capture_{name}_total"), help, v);
        }
        s
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nodes_user_or_root_may_capture() {
        assert!(operator_check(Some(1000), 1000).is_ok());
        assert!(operator_check(Some(0), 1000).is_ok(), "root");
        let e = operator_check(Some(65534), 1000).unwrap_err();
        assert_eq!(e.0, Refusal::NotOperator);
        assert!(e.1.contains("uid 65534"), "{}", e.1);
        assert_eq!(operator_check(None, 1000).unwrap_err().0, Refusal::NotOperator, "no credentials");
        assert_eq!(operator_check(Some(1000), 0).unwrap_err().0, Refusal::NotOperator, "a user, root's node");
    }

    #[test]
    fn a_captured_datagram_becomes_one_packet_frame() {
        let p = Captured {
            ts_ns: 5,
            dir: CaptureDir::Out,
            iface: 1,
            peer: "127.0.0.1:7".parse().unwrap(),
            local: "127.0.0.1:8".parse().unwrap(),
            data: vec![1, 2, 3],
        };
        let mut v = Vec::new();
        assert!(frame_of(&p, &mut v));
        match Frame::parse(&v).unwrap() {
            Frame::Packet(f) => {
                assert_eq!((f.dir, f.iface, f.ts_ns, f.datagram), (Direction::Out, 1, 5, &[1u8, 2, 3][..]));
                assert_eq!((f.peer.port(), f.local.port()), (7, 8));
            }
            f => panic!("{f:?}"),
        }
    }
}
