//! The interface sockets: batched receive (`recvmmsg`) into fixed buffers,
//! the core, and batched send (`sendmmsg`) per outgoing interface.

use crate::BATCH;
use crate::app::Local;
use crate::daemon::Daemon;
use crate::droplog::DropLog;
use anode_node::core::{Node, Outbox};
use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use tracing::{debug, info};

/// Receive side of the data path: the batch buffers and their outboxes.
pub(crate) struct Rx {
    pub(crate) bufs: [Vec<u8>; BATCH],
    pub(crate) lens: [usize; BATCH],
    pub(crate) outs: [Outbox; BATCH],
    pub(crate) hdrs: MultiHeaders<SockaddrStorage>,
    pub(crate) froms: [Option<SocketAddr>; BATCH],
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
        let cpu0 = if self.node.rcane_on() { crate::daemon::thread_cpu_ns() } else { 0 };
        let rx_bytes: usize = self.rx.lens[..n].iter().sum();
        let Rx { bufs, lens, outs, froms, .. } = &mut self.rx;
        for i in 0..n {
            outs[i].clear();
            self.node.handle_datagram_from(iface, froms[i], &mut bufs[i], lens[i], now_ms, &mut outs[i]);
            if !outs[i].log.is_empty() {
                debug!(target: "anode::snap", "{}", outs[i].log.trim_end());
            }
            for e in &outs[i].events {
                info!("{e}");
            }
        }
        send_transmits(&self.udp, &mut self.tx_hdrs, &mut self.node, &mut self.droplog, &outs[..n], &bufs[..n]);
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, &outs[..n], &bufs[..n]);
        if self.node.rcane_on() {
            // Network input runs between dispatches, for Best-Effort (SNAP,
            // forwarding) and System (handshakes, keepalives, control
            // requests). The batch's thread CPU time is split between them
            // by datagram count (one clock read per batch, not per datagram:
            // an approximation, documented in docs/rcane.md).
            let used = crate::daemon::thread_cpu_ns().saturating_sub(cpu0);
            let outs = &self.rx.outs[..n];
            let n_sys = outs.iter().filter(|o| o.system).count() as u64;
            let sys_bytes: usize = self.rx.lens[..n].iter().zip(outs).filter(|(_, o)| o.system).map(|(l, _)| *l).sum();
            let sys_ns = used.saturating_mul(n_sys) / (n as u64).max(1);
            use anode_node::core::Owner;
            if n_sys > 0 {
                self.node.charge_outside(Owner::System, sys_ns, n_sys, sys_bytes as u64);
            }
            if n_sys < n as u64 {
                let be = (rx_bytes - sys_bytes) as u64;
                self.node.charge_outside(Owner::BestEffort, used - sys_ns, n as u64 - n_sys, be);
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
    outs: &[Outbox],
    bufs: &[Vec<u8>],
) {
    for (iface, sock) in udp.iter().enumerate() {
        let mut iovs = [[IoSlice::new(&[])]; BATCH];
        let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
        let mut k = 0;
        for (out, buf) in outs.iter().zip(bufs) {
            for t in out.transmits.iter().filter(|t| t.iface == iface) {
                iovs[k] = [IoSlice::new(out.bytes(&t.data, buf))];
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
