//! UDP segmentation offload on the interface sockets (`[io]`, issue 19).
//!
//! * **GSO** (`UDP_SEGMENT`): a run of datagrams of one size to one
//!   neighbour (the last may be shorter) leaves in one `sendmsg` whose
//!   iovecs are the datagrams in place, with the segment size in a control
//!   message; the kernel walks its stack once for the run and cuts it into
//!   datagrams at the device (or, on loopback and veth, hands the run whole
//!   to a receiver that asked for GRO). Nothing is copied.
//! * **GRO** (`UDP_GRO`): the kernel may hand a receive a run of datagrams
//!   from one sender, concatenated, with their segment size in a control
//!   message. [`crate::udp`] cuts it back into datagrams before the core
//!   sees any of them, so the core's input is the same either way.
//!
//! Both are detected per socket at start and fall back to plain
//! `sendmmsg`/`recvmmsg`: a kernel without `UDP_SEGMENT` or `UDP_GRO`
//! refuses the socket option and the interface runs without it. A send the
//! kernel refuses as a GSO run (`EINVAL`: a segment longer than the path
//! MTU, too many segments) is sent again datagram by datagram and counted
//! (`gso_fallbacks`); `EIO` (a device that cannot checksum a GSO run, as
//! quinn-udp handles it) turns GSO off on that interface for good.

use crate::droplog::DropLog;
use crate::udp::TxTally;
use anode_node::config::IoConfig;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollTimeout};
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, getsockopt, sendmmsg, setsockopt, sockopt,
};
use std::io::IoSlice;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::Instant;
use tracing::{info, warn};

/// Most datagrams in one GSO send. Linux takes 64 (`UDP_MAX_SEGMENTS`
/// before 6.9) or 128.
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes in one GSO send: the largest UDP payload over IPv4.
pub(crate) const GSO_MAX_BYTES: usize = 65_507;

/// What each interface socket may do, and what it did.
#[derive(Debug)]
pub(crate) struct Offload {
    /// The header of a GSO send, with room for its control message
    /// (reused: sending allocates nothing).
    hdrs: MultiHeaders<SockaddrStorage>,
    /// Largest GSO run per interface (0: GSO off).
    gso: Vec<usize>,
    /// GRO on, per interface.
    gro: Vec<bool>,
    /// Counters for `anode status` (`io`).
    pub(crate) counters: IoCounters,
}

/// Counters of the offloads and the polling (`anode status`, `io`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IoCounters {
    /// Datagrams received (GRO runs counted datagram by datagram).
    pub(crate) datagrams: u64,
    /// GSO sends (each one run of datagrams).
    pub(crate) gso_sends: u64,
    /// Datagrams sent in GSO runs.
    pub(crate) gso_datagrams: u64,
    /// GSO runs the kernel refused and that went datagram by datagram.
    pub(crate) gso_fallbacks: u64,
    /// Receives that held more than one datagram (GRO).
    pub(crate) gro_receives: u64,
    /// Datagrams cut out of those receives.
    pub(crate) gro_datagrams: u64,
    /// Times the loop polled its sockets instead of sleeping (`spin_us`).
    pub(crate) spins: u64,
    /// Spins that found input before their time ran out.
    pub(crate) spin_hits: u64,
}

impl IoCounters {
    /// Adds `o` to these.
    pub(crate) fn add(&mut self, o: &IoCounters) {
        self.datagrams += o.datagrams;
        self.gso_sends += o.gso_sends;
        self.gso_datagrams += o.gso_datagrams;
        self.gso_fallbacks += o.gso_fallbacks;
        self.gro_receives += o.gro_receives;
        self.gro_datagrams += o.gro_datagrams;
        self.spins += o.spins;
        self.spin_hits += o.spin_hits;
    }
}

impl Offload {
    /// Turns on what `cfg` asks for on each socket, as far as the kernel
    /// allows, and says what it got.
    pub(crate) fn setup(socks: &[UdpSocket], names: &[String], cfg: &IoConfig) -> Offload {
        let mut off = Offload {
            hdrs: MultiHeaders::preallocate(1, Some(nix::cmsg_space!(u16))),
            gso: Vec::new(),
            gro: Vec::new(),
            counters: IoCounters::default(),
        };
        for (s, name) in socks.iter().zip(names) {
            // The kernel has UDP_SEGMENT if it answers for it.
            let gso = cfg.gso && getsockopt(s, sockopt::UdpGsoSegment).is_ok();
            let gro = cfg.gro && setsockopt(s, sockopt::UdpGroSegment, &true).is_ok();
            if cfg.busy_poll_us > 0
                && let Err(e) = socket2::SockRef::from(s).set_busy_poll(cfg.busy_poll_us)
            {
                warn!(iface = %name, error = %e, "SO_BUSY_POLL refused (needs CAP_NET_ADMIN to raise it)");
            }
            if (cfg.gso && !gso) || (cfg.gro && !gro) {
                info!(iface = %name, gso, gro, "the kernel does not offer every UDP offload; using batched system calls");
            }
            off.gso.push(if gso { GSO_MAX_SEGMENTS } else { 0 });
            off.gro.push(gro);
        }
        off
    }

    /// The largest GSO run on `iface` (below 2: off).
    pub(crate) fn gso(&self, iface: usize) -> usize {
        self.gso.get(iface).copied().unwrap_or(0)
    }

    /// The `io` object of `anode status`: these counters plus the
    /// workers' (`workers`, their sum), and how many workers run.
    pub(crate) fn status(&self, theirs: &[IoCounters]) -> serde_json::Value {
        let mut c = self.counters;
        for t in theirs {
            c.add(t);
        }
        serde_json::json!({
            "workers": theirs.len().max(1),
            "datagrams": c.datagrams,
            "worker_datagrams": theirs.iter().map(|t| t.datagrams).collect::<Vec<_>>(),
            "gso": self.gso.iter().map(|g| *g > 1).collect::<Vec<_>>(),
            "gro": self.gro,
            "gso_sends": c.gso_sends,
            "gso_datagrams": c.gso_datagrams,
            "gso_fallbacks": c.gso_fallbacks,
            "gro_receives": c.gro_receives,
            "gro_datagrams": c.gro_datagrams,
            "spins": c.spins,
            "spin_hits": c.spin_hits,
        })
    }

    /// Sends `iovs` (one datagram each, all to `to`, a run as
    /// [`gso_run`] finds it) as one GSO message on `iface`. `Some(true)`:
    /// sent; `Some(false)`: dropped (counted, logged); `None`: the kernel
    /// refused the run as such, send it datagram by datagram.
    pub(crate) fn send_run(
        &mut self,
        sock: &UdpSocket,
        iface: usize,
        tally: &mut TxTally,
        droplog: &mut DropLog,
        iovs: &[[IoSlice<'_>; 1]],
        to: &SockaddrStorage,
    ) -> Option<bool> {
        let n = iovs.len().min(GSO_MAX_SEGMENTS);
        let mut flat = [IoSlice::new(&[]); GSO_MAX_SEGMENTS];
        for (f, io) in flat.iter_mut().zip(&iovs[..n]) {
            *f = io[0];
        }
        let seg = u16::try_from(iovs.first().map_or(0, |io| io[0].len())).unwrap_or(u16::MAX);
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        loop {
            let msg = [&flat[..n]];
            let r = sendmmsg(sock.as_raw_fd(), &mut self.hdrs, &msg, [Some(*to)], cmsg, MsgFlags::MSG_DONTWAIT)
                .map(Iterator::count);
            match r {
                Ok(0) => {
                    // Not sent, no error: as EAGAIN.
                    for io in &iovs[..n] {
                        tally.count(iface, io[0].len(), false);
                    }
                    droplog.tx_error = Some(format!("GSO run of {n} to {to} not sent"));
                    return Some(false);
                }
                Ok(_) => {
                    self.counters.gso_sends += 1;
                    self.counters.gso_datagrams += n as u64;
                    for io in &iovs[..n] {
                        tally.count(iface, io[0].len(), true);
                    }
                    return Some(true);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EIO) => {
                    // The device cannot checksum GSO runs: off for good.
                    warn!(iface, "UDP GSO failed with EIO; sending datagram by datagram on this interface");
                    if let Some(g) = self.gso.get_mut(iface) {
                        *g = 0;
                    }
                    self.counters.gso_fallbacks += 1;
                    return None;
                }
                Err(Errno::EINVAL | Errno::EMSGSIZE | Errno::ENOTSUP) => {
                    self.counters.gso_fallbacks += 1;
                    return None;
                }
                Err(e) => {
                    // EAGAIN (the socket buffer is full) and the rest: the
                    // run is dropped, as a router would.
                    for io in &iovs[..n] {
                        tally.count(iface, io[0].len(), false);
                    }
                    droplog.tx_error = Some(format!("{e} (GSO run of {n} to {to})"));
                    return Some(false);
                }
            }
        }
    }
}

/// Adaptive polling: polls `epoll` without sleeping until something is
/// ready or `until`, yielding the CPU between polls (to anything runnable:
/// another node, the sender; polling must not take the CPU from the work
/// it waits for). Returns how many events it found (0: time ran out, or an
/// error, which the sleeping wait then meets).
pub(crate) fn spin_wait(epoll: &Epoll, events: &mut [EpollEvent], until: Instant, c: &mut IoCounters) -> usize {
    c.spins += 1;
    loop {
        let n = epoll.wait(events, EpollTimeout::ZERO).unwrap_or(0);
        if n > 0 {
            c.spin_hits += 1;
            return n;
        }
        if Instant::now() >= until {
            return 0;
        }
        std::thread::yield_now();
    }
}

/// How many datagrams from the start of `iovs` form one GSO run, at most
/// `max`: one destination, every datagram as long as the first except the
/// last, which may be shorter, and at most [`GSO_MAX_BYTES`] in all. A run
/// of 1 is no run.
pub(crate) fn gso_run(iovs: &[[IoSlice<'_>; 1]], addrs: &[Option<SockaddrStorage>], max: usize) -> usize {
    let (Some(first), Some(Some(to))) = (iovs.first(), addrs.first()) else { return 0 };
    let seg = first[0].len();
    if seg == 0 || max < 2 {
        return 1;
    }
    let mut total = seg;
    let mut n = 1;
    for (io, a) in iovs.iter().zip(addrs).skip(1) {
        let len = io[0].len();
        if n == max || a.as_ref() != Some(to) || len == 0 || len > seg || total + len > GSO_MAX_BYTES {
            break;
        }
        total += len;
        n += 1;
        if len < seg {
            break;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn run(lens: &[usize], to: &[u16], max: usize) -> usize {
        let bufs: Vec<Vec<u8>> = lens.iter().map(|l| vec![0; *l]).collect();
        let iovs: Vec<[IoSlice<'_>; 1]> = bufs.iter().map(|b| [IoSlice::new(b)]).collect();
        let addrs: Vec<Option<SockaddrStorage>> =
            to.iter().map(|p| Some(SockaddrStorage::from(SocketAddr::from(([127, 0, 0, 1], *p))))).collect();
        gso_run(&iovs, &addrs, max)
    }

    #[test]
    fn a_run_is_one_destination_one_size_and_a_shorter_last() {
        assert_eq!(run(&[100, 100, 100], &[1, 1, 1], 64), 3);
        assert_eq!(run(&[100, 100, 60, 100], &[1, 1, 1, 1], 64), 3, "the shorter one ends the run");
        assert_eq!(run(&[100, 120], &[1, 1], 64), 1, "a longer one cannot follow");
        assert_eq!(run(&[100, 100, 100], &[1, 1, 2], 64), 2, "another neighbour ends it");
        assert_eq!(run(&[100; 10], &[1; 10], 4), 4, "at most max");
        assert_eq!(run(&[100; 10], &[1; 10], 1), 1, "GSO off");
        assert_eq!(run(&[30_000, 30_000, 30_000], &[1, 1, 1], 64), 2, "at most 65,507 bytes");
        assert_eq!(run(&[0, 0], &[1, 1], 64), 1, "empty datagrams go alone");
        assert_eq!(run(&[], &[], 64), 0);
    }
}
