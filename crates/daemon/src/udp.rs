//! The interface sockets: batched receive (`recvmmsg`) into fixed buffers,
//! the core, and batched send (`sendmmsg`) per outgoing interface.

use crate::BATCH;
use crate::app::Local;
use crate::daemon::Daemon;
use crate::droplog::DropLog;
use crate::frag::Frag;
use anode_node::core::{Node, Outbox, Owner};
use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Instant;
use tracing::{debug, info};

/// Receive side of the data path: the batch buffers and their outboxes.
pub(crate) struct Rx {
    pub(crate) bufs: [Vec<u8>; BATCH],
    pub(crate) lens: [usize; BATCH],
    pub(crate) outs: [Outbox; BATCH],
    pub(crate) hdrs: MultiHeaders<SockaddrStorage>,
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

impl Daemon {
    /// Handles one batch from interface `iface`: recvmmsg, the core, then
    /// sendmmsg per outgoing interface and the deliveries.
    pub(crate) fn udp_ready(&mut self, iface: usize) {
        let n = match recv_batch(&self.udp[iface], &mut self.rx) {
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return,
            Err(e) => {
                // Nothing a datagram socket returns here is fatal (e.g. a
                // queued ICMP error); note it and go on.
                debug!(iface = %self.cfg.interfaces[iface].name, error = %e, "recvmmsg");
                return;
            }
        };
        let now_ms = self.now_ms();
        let rcane = self.node.rcane_on();
        let Rx { bufs, lens, outs, froms, spent, .. } = &mut self.rx;
        let cpu0 = if rcane { crate::daemon::thread_cpu_ns() } else { 0 };
        let mut t = rcane.then(Instant::now);
        for i in 0..n {
            outs[i].clear();
            // A fragment is held until its datagram is whole, which is then
            // handled in its place (the buffer holds up to 64 KiB).
            if let Some(r) = self.frag.take(froms[i], bufs[i].get(..lens[i]).unwrap_or(&[]), now_ms) {
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
            self.node.handle_datagram_from(iface, froms[i], &mut bufs[i], lens[i], now_ms, &mut outs[i]);
            if !outs[i].log.is_empty() {
                debug!(target: "anode::snap", "{}", outs[i].log.trim_end());
            }
            for e in &outs[i].events {
                info!("{e}");
            }
            if let Some(t0) = t.as_mut() {
                // Each datagram's share of the batch's CPU, by the wall
                // time its handling took (vDSO clock, not a syscall).
                let t1 = Instant::now();
                spent[i] = t1.saturating_duration_since(*t0).as_nanos() as u64;
                *t0 = t1;
            }
        }
        send_transmits(
            &self.udp,
            &mut self.tx_hdrs,
            &mut self.node,
            &mut self.droplog,
            &mut self.frag,
            &outs[..n],
            &bufs[..n],
        );
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, &outs[..n], &bufs[..n]);
        if rcane {
            // Network input runs between dispatches, for Best-Effort (SNAP,
            // forwarding), System (handshakes, keepalives, control requests)
            // and the principals whose sessions capsules and channel packets
            // were accepted for. The batch's thread CPU time (one clock read
            // per batch) is split among them by each datagram's wall time.
            let used = crate::daemon::thread_cpu_ns().saturating_sub(cpu0);
            let Rx { lens, outs, spent, shares, .. } = &mut self.rx;
            split_batch(used, &outs[..n], &lens[..n], &spent[..n], shares);
            for s in shares.iter() {
                self.node.charge_outside(s.owner, s.ns, s.packets, s.bytes);
            }
            self.charged = true;
        }
    }
}

/// Reads one batch of datagrams into `rx.bufs`, their lengths into
/// `rx.lens`; returns how many.
pub(crate) fn recv_batch(sock: &UdpSocket, rx: &mut Rx) -> Result<usize, Errno> {
    let Rx { bufs, lens, hdrs, froms, .. } = rx;
    let mut iovs: [[IoSliceMut<'_>; 1]; BATCH] = bufs.each_mut().map(|b| [IoSliceMut::new(b.as_mut_slice())]);
    let msgs = recvmmsg(sock.as_raw_fd(), hdrs, iovs.iter_mut(), MsgFlags::MSG_DONTWAIT, None)?;
    let mut n = 0;
    for ((m, l), f) in msgs.zip(lens.iter_mut()).zip(froms.iter_mut()) {
        // A datagram longer than the buffer arrives truncated (MSG_TRUNC);
        // its ANEP length then disagrees and the core drops it.
        *l = m.bytes;
        *f = m.address.and_then(|a| a.as_sockaddr_in().map(|s| SocketAddr::V4((*s).into())));
        n += 1;
    }
    Ok(n)
}

/// Sends every transmission of `outs` (the outbox of datagram `i` points
/// into `bufs[i]`), grouped by interface, [`BATCH`] per `sendmmsg`.
pub(crate) fn send_transmits(
    udp: &[UdpSocket],
    hdrs: &mut MultiHeaders<SockaddrStorage>,
    node: &mut Node,
    droplog: &mut DropLog,
    frag: &mut Frag,
    outs: &[Outbox],
    bufs: &[Vec<u8>],
) {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    for (iface, sock) in udp.iter().enumerate() {
        let mut iovs = [[IoSlice::new(&[])]; BATCH];
        let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
        let mut k = 0;
        let mut oversize = false;
        for (out, buf) in outs.iter().zip(bufs) {
            for t in out.transmits.iter().filter(|t| t.iface == iface) {
                let bytes = out.bytes(&t.data, buf);
                if frag.too_long(bytes.len()) {
                    oversize = true;
                    continue;
                }
                iovs[k] = [IoSlice::new(bytes)];
                addrs[k] = Some(SockaddrStorage::from(t.to));
                k += 1;
                if k == BATCH {
                    send_chunk(sock, iface, hdrs, node, droplog, &iovs[..k], &addrs[..k]);
                    k = 0;
                }
            }
        }
        if k > 0 {
            send_chunk(sock, iface, hdrs, node, droplog, &iovs[..k], &addrs[..k]);
        }
        // Datagrams longer than the link's MTU, as fragments (the slow path:
        // capsules with their code, control messages), in a second pass only
        // when the first one skipped any.
        if !oversize {
            continue;
        }
        for (out, buf) in outs.iter().zip(bufs) {
            for t in out.transmits.iter().filter(|t| t.iface == iface) {
                let bytes = out.bytes(&t.data, buf);
                if !frag.too_long(bytes.len()) {
                    continue;
                }
                pieces.clear();
                if frag.split(bytes, &mut pieces) == 0 {
                    node.count_tx(iface, bytes.len(), false);
                    droplog.tx_error = Some(format!("a datagram of {} bytes cannot be fragmented", bytes.len()));
                    continue;
                }
                for chunk in pieces.chunks(BATCH) {
                    let mut iovs = [[IoSlice::new(&[])]; BATCH];
                    let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
                    for (j, p) in chunk.iter().enumerate() {
                        iovs[j] = [IoSlice::new(p)];
                        addrs[j] = Some(SockaddrStorage::from(t.to));
                    }
                    send_chunk(sock, iface, hdrs, node, droplog, &iovs[..chunk.len()], &addrs[..chunk.len()]);
                }
            }
        }
    }
    // Transmissions naming an interface that does not exist cannot happen
    // (the core only routes to configured neighbours), but count them.
    for out in outs {
        for t in out.transmits.iter().filter(|t| t.iface >= udp.len()) {
            node.count_tx(t.iface, 0, false);
        }
    }
}

pub(crate) fn send_chunk(
    sock: &UdpSocket,
    iface: usize,
    hdrs: &mut MultiHeaders<SockaddrStorage>,
    node: &mut Node,
    droplog: &mut DropLog,
    iovs: &[[IoSlice<'_>; 1]],
    addrs: &[Option<SockaddrStorage>],
) {
    let fd = sock.as_raw_fd();
    let mut start = 0;
    while start < iovs.len() {
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        // The result iterator yields one item per message sent; only the
        // count matters here.
        let r = sendmmsg(fd, hdrs, iovs[start..].iter(), &addrs[start..], no_cmsgs, MsgFlags::MSG_DONTWAIT)
            .map(Iterator::count);
        match r {
            Ok(sent) if sent > 0 => {
                for io in &iovs[start..start + sent] {
                    node.count_tx(iface, io[0].len(), true);
                }
                start += sent;
            }
            Err(Errno::EINTR) => {}
            other => {
                // The first message was refused (e.g. EAGAIN: the socket
                // buffer is full). Drop it, as a router would, and go on.
                let e = other.err().unwrap_or(Errno::EAGAIN);
                node.count_tx(iface, iovs[start][0].len(), false);
                droplog.tx_error = Some(format!("{e} (to {:?})", addrs[start].map(|a| a.to_string())));
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
