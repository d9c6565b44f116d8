//! Transmit scheduling per paced link (RCANE §IV-D, §VI-B): the daemon's
//! side of [`anode_sched::tx`].
//!
//! An interface with `rate_bps` gets a [`LinkSched`]: what the core
//! produces for it is queued per owner (a principal's session, System,
//! Best-Effort) instead of being sent at once, and the event loop releases
//! it at the link's rate, from its timer ([`Pacer::next_due_ns`]). A
//! principal's session transmit reservation (bytes/s) becomes a guarantee
//! of `period * reservation * 8 / rate` of link time in every period of
//! the interface (`tx_period_us`, 6 ms by default); everyone else is best
//! effort. The guarantee follows the reservation: it is compared at each
//! packet of the principal and at each release, so a reservation change
//! or a closed session takes effect on the next packet or wakeup.
//!
//! Interfaces without a rate are untouched: their transmissions go out as
//! produced and cost one branch per interface.

use anode_node::config::InterfaceConfig;
use anode_node::core::{Node, Owner};
use anode_node::counters::Drop;
use anode_sandbox::Flow;
use anode_sched::tx::{ClientInfo, Guarantee, LinkSched, TxConfig, TxError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use tracing::warn;

/// The guarantee period unless `tx_period_us` says otherwise: the paper's 6 ms.
pub(crate) const DEFAULT_PERIOD_NS: u64 = 6_000_000;

/// A client of a paced link: an owner and, for a principal's channel with
/// a transmit reservation of its own (`net.channel_tx`), that channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TxKey {
    pub(crate) owner: Owner,
    pub(crate) flow: Option<Flow>,
}

impl TxKey {
    /// The owner's packets not sent on a reserved channel.
    pub(crate) fn of(owner: Owner) -> TxKey {
        TxKey { owner, flow: None }
    }
}

impl core::fmt::Display for TxKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.flow {
            Some(flow) => write!(f, "{} {flow}", self.owner),
            None => write!(f, "{}", self.owner),
        }
    }
}

/// A datagram waiting for its link.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) to: SocketAddr,
    /// The buffer it waits in (a spare one, reused).
    buf: Vec<u8>,
    /// Where the datagram is in `buf` (once sealed, the sealed one).
    at: Range<usize>,
    /// Still to be sealed for `to` when released ([`Pacer::seal_released`]):
    /// then `buf` has room for the headers in front of it and the tag
    /// behind it.
    pub(crate) seal: bool,
}

impl Queued {
    /// The datagram.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.buf.get(self.at.clone()).unwrap_or(&[])
    }
}

/// One paced link.
#[derive(Debug)]
pub(crate) struct Link {
    sched: LinkSched<TxKey, Queued>,
    period_ns: u64,
    /// The reservation (bytes/s) each principal's flow's guarantee was last
    /// made from, and whether the link refused it.
    applied: HashMap<TxKey, (u64, bool)>,
    /// Guarantees the link refused (the sum would exceed the link).
    refused: u64,
    /// Datagrams it let go at once, unqueued ([`Pacer::send_burst`]; also
    /// counted in its `sent_packets`).
    sent_at_once: u64,
}

/// The paced links, by interface index (`None`: sent as produced).
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    links: Vec<Option<Link>>,
    /// Buffers of datagrams already sent, reused by the next ones queued,
    /// so that a paced link does not allocate per datagram once warm.
    spare: Vec<Vec<u8>>,
    /// Which interfaces are paced.
    mask: Arc<[bool]>,
    /// Scratch list of a link's flows with their old and new reservations,
    /// reused by [`Pacer::follow_all`].
    flows: Vec<(TxKey, u64, u64)>,
}

/// Most spare buffers kept.
const MAX_SPARE: usize = 1024;
/// Largest buffer kept as spare (a link MTU's datagram; fragments and
/// larger datagrams are given back to the allocator).
const MAX_SPARE_LEN: usize = 2048;

impl Pacer {
    /// A link scheduler for each interface with a rate.
    pub(crate) fn new(ifaces: &[InterfaceConfig]) -> Pacer {
        let links = ifaces
            .iter()
            .map(|i| {
                let rate = i.rate_bps?;
                let period_ns = i.tx_period_us.map_or(DEFAULT_PERIOD_NS, |us| us.saturating_mul(1000));
                let mut cfg = TxConfig::new(rate);
                // How far behind the clock the link may start datagrams
                // when the event loop comes back late (a guaranteed
                // dispatch of module work runs its slice out before the
                // loop sends again; a busy machine wakes it late): one
                // period. Lateness within a period is not lost link time
                // (2 ms lost 6-8 % of the link to best effort in the Fig.
                // 12 run); the price is a burst of up to a period's link
                // time after a late wakeup.
                cfg.catch_up_ns = period_ns;
                if let Some(q) = i.tx_queue_bytes {
                    cfg.queue_bytes = q;
                }
                let mut sched = LinkSched::new(cfg).ok()?;
                // The node's own traffic (handshakes, keepalives, control
                // replies) goes first, even on a link booked to the last
                // percent.
                sched.set_priority(TxKey::of(Owner::System), true).ok()?;
                Some(Link { sched, period_ns, applied: HashMap::new(), refused: 0, sent_at_once: 0 })
            })
            .collect();
        let links: Vec<Option<Link>> = links;
        let mask = links.iter().map(Option::is_some).collect();
        Pacer { links, mask, spare: Vec::new(), flows: Vec::new() }
    }

    /// Takes back the buffer of a datagram that was sent, for the next one
    /// queued.
    pub(crate) fn recycle(&mut self, q: Queued) {
        self.give_back(q.buf);
    }

    /// Keeps `buf` for a later datagram (within the spare limits).
    fn give_back(&mut self, buf: Vec<u8>) {
        if self.spare.len() < MAX_SPARE && buf.capacity() <= MAX_SPARE_LEN {
            self.spare.push(buf);
        }
    }

    /// Which interfaces are paced (shared, so taking it costs no
    /// allocation per batch).
    pub(crate) fn mask(&self) -> Arc<[bool]> {
        Arc::clone(&self.mask)
    }

    /// Whether interface `iface` is paced.
    pub(crate) fn paced(&self, iface: usize) -> bool {
        self.links.get(iface).is_some_and(Option::is_some)
    }

    /// Queues a datagram of `owner` for paced interface `iface`; a full
    /// queue drops it (counted in the node's drops and the link's status).
    /// `seal`: the datagram is still to be sealed when released, which
    /// adds that many bytes (its link time counts them).
    #[allow(clippy::too_many_arguments)] // one call site per kind of datagram, all in udp.rs
    pub(crate) fn enqueue(
        &mut self,
        node: &mut Node,
        iface: usize,
        key: TxKey,
        to: SocketAddr,
        bytes: &[u8],
        seal: Option<usize>,
        now_ns: u64,
    ) {
        let Some(Some(link)) = self.links.get_mut(iface) else { return };
        link.follow_key(node, key, now_ns);
        // The link time of the datagram as it will go: sealed.
        let len = u32::try_from(bytes.len() + seal.unwrap_or(0)).unwrap_or(u32::MAX);
        let q = queued(&mut self.spare, to, bytes, seal);
        match link.sched.try_enqueue(key, len, q, now_ns) {
            Ok(()) => {}
            Err((e, q)) => {
                // The buffer is kept for the next datagram.
                node.counters.drop(if e == TxError::TooManyClients { Drop::TxNoClient } else { Drop::TxQueueFull });
                self.give_back(q.buf);
            }
        }
    }

    /// Gives paced interface `iface` a burst of `owner`'s datagrams (their
    /// lengths as they will go, sealed, in `lens`), all arrived at `at_ns`,
    /// to send at once ([`LinkSched::send_burst`]: the link's state is
    /// exactly that of queueing each at `at_ns` and releasing at `now_ns`).
    /// `Some(m)`: the link counted the first `m` as sent, the caller sends
    /// them now; the rest were queued, `datagram(i)` giving each one's
    /// neighbour, bytes and seal overhead (as for [`Pacer::enqueue`]).
    /// `None`: nothing was taken (the link has datagrams queued, `owner`
    /// holds a guarantee, the burst exceeds its queue): queue each.
    pub(crate) fn send_burst<'b>(
        &mut self,
        node: &Node,
        iface: usize,
        key: TxKey,
        lens: &[u32],
        (at_ns, now_ns): (u64, u64),
        datagram: impl Fn(usize) -> Option<(SocketAddr, &'b [u8], Option<usize>)>,
    ) -> Option<usize> {
        let Some(Some(link)) = self.links.get_mut(iface) else { return None };
        link.follow_key(node, key, now_ns);
        let spare = &mut self.spare;
        let m = link.sched.send_burst(key, lens, at_ns, now_ns, |i| match datagram(i) {
            Some((to, bytes, seal)) => queued(spare, to, bytes, seal),
            // Cannot happen: the caller's indices are the burst's own.
            // Were one missing, its item would go as an empty datagram to
            // 0.0.0.0:0, which the kernel refuses (a transmit error).
            None => Queued { to: SocketAddr::from(([0, 0, 0, 0], 0)), buf: Vec::new(), at: 0..0, seal: false },
        })?;
        link.sent_at_once += m as u64;
        Some(m)
    }

    /// Seals the released datagrams that left the core unsealed, in the
    /// order the link sends them (so the receiver's replay window sees
    /// sequence numbers in order whatever the link's clients waited). A
    /// datagram whose neighbour has no SA now is dropped (`no_sa`).
    pub(crate) fn seal_released(&mut self, node: &mut Node, got: &mut Vec<(TxKey, Queued)>) {
        let mut i = 0;
        while let Some((_, q)) = got.get_mut(i) {
            if !q.seal {
                i += 1;
                continue;
            }
            // Queued with room for the headers and the tag: sealed in
            // place, no copy.
            if let Some(at) = node.seal_range(&q.to, &mut q.buf, q.at.clone()) {
                q.at = at;
                q.seal = false;
                i += 1;
            } else {
                let (_, q) = got.remove(i);
                self.recycle(q);
            }
        }
    }

    /// Makes every guarantee follow its flow's current reservation (a
    /// closed session's or channel's guarantee is released here even if it
    /// never sends again). Guarantees that shrink go first, so that link
    /// time a session moves to one of its channels is free when the
    /// channel asks for it.
    pub(crate) fn follow_all(&mut self, node: &Node, now_ns: u64) {
        let mut flows = std::mem::take(&mut self.flows);
        for link in self.links.iter_mut().flatten() {
            flows.clear();
            for (k, (old, _)) in &link.applied {
                if let Owner::Principal(p) = k.owner {
                    flows.push((*k, *old, node.flow_tx_of(p, k.flow)));
                }
            }
            for &(k, old, new) in &flows {
                if new < old {
                    link.follow(k, new, now_ns);
                }
            }
            for &(k, old, new) in &flows {
                if new > old {
                    link.follow(k, new, now_ns);
                }
            }
        }
        self.flows = flows;
    }

    /// Takes the datagrams of `iface` that may go at `now_ns` into `out`
    /// (cleared first), with their owners.
    pub(crate) fn release(&mut self, iface: usize, now_ns: u64, out: &mut Vec<(TxKey, Queued)>) {
        out.clear();
        let Some(Some(link)) = self.links.get_mut(iface) else { return };
        while let Some(r) = link.sched.poll(now_ns) {
            out.push((r.key, r.item));
            if out.len() >= crate::BATCH {
                break;
            }
        }
    }

    /// The number of interfaces (paced or not).
    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    /// When the next paced datagram may go (ns on the daemon's clock);
    /// `None` when nothing is queued, so an idle node does not wake.
    pub(crate) fn next_due_ns(&self, now_ns: u64) -> Option<u64> {
        self.links.iter().flatten().filter_map(|l| l.sched.next_due(now_ns)).min()
    }

    /// The `tx` section of `status` for interface `iface`, if paced.
    pub(crate) fn status(&self, iface: usize) -> Option<serde_json::Value> {
        use serde_json::json;
        let link = self.links.get(iface)?.as_ref()?;
        let s = link.sched.stats();
        let clients: Vec<serde_json::Value> = link
            .sched
            .clients()
            .into_iter()
            .map(|ClientInfo { key, guarantee, budget_ns, stats: c }| {
                json!({
                    "owner": key.to_string(),
                    "guarantee": guarantee.map(|g| json!({"slice_ns": g.slice_ns, "period_ns": g.period_ns})),
                    "budget_ns": budget_ns,
                    "sent_packets": c.sent_packets, "sent_bytes": c.sent_bytes, "sent_link_ns": c.sent_ns,
                    "dropped_packets": c.dropped_packets, "dropped_bytes": c.dropped_bytes,
                    "queued_packets": c.queued_packets, "queued_bytes": c.queued_bytes,
                    "two_period_windows": c.two_period_windows,
                    "two_period_within_one_packet": c.two_period_within_one_packet,
                })
            })
            .collect();
        Some(json!({
            "rate_bps": link.sched.config().rate_bps,
            "period_ns": link.period_ns,
            "queue_bytes": link.sched.config().queue_bytes,
            "booked_ppb": s.booked_ppb,
            "queued_packets": s.queued_packets, "queued_bytes": s.queued_bytes,
            "sent_packets": s.sent_packets, "sent_bytes": s.sent_bytes, "sent_at_once": link.sent_at_once,
            "dropped_queue_full": s.dropped_queue_full, "dropped_no_client": s.dropped_no_client,
            "guarantees_refused": link.refused,
            "clients": clients,
        }))
    }
}

/// `bytes` for `to` copied into a buffer from `spare` to wait in a link's
/// queue; with `seal` (the seal's overhead), with room for the headers in
/// front and the tag behind, so that the datagram is sealed where it waits
/// ([`Pacer::seal_released`]).
fn queued(spare: &mut Vec<Vec<u8>>, to: SocketAddr, bytes: &[u8], seal: Option<usize>) -> Queued {
    let mut buf = spare_buf(spare);
    buf.clear();
    let start = if seal.is_some() { anode_node::core::SEAL_HEADROOM } else { 0 };
    buf.resize(start, 0);
    buf.extend_from_slice(bytes);
    if let Some(overhead) = seal {
        buf.resize(buf.len() + overhead.saturating_sub(start), 0);
    }
    Queued { to, buf, at: start..start + bytes.len(), seal: seal.is_some() }
}

/// A buffer from `spare`, or a new one with room for a link MTU's datagram
/// and its seal: one allocated smaller would grow past `MAX_SPARE_LEN` when
/// sealed (a 1,400-byte datagram doubled to 2.8 KB) and be given back to the
/// allocator, one malloc and free per datagram.
fn spare_buf(spare: &mut Vec<Vec<u8>>) -> Vec<u8> {
    spare.pop().unwrap_or_else(|| Vec::with_capacity(MAX_SPARE_LEN))
}

impl Link {
    /// Makes the guarantee of `key`, a packet's client, follow its
    /// reservation. A principal's channel follows after the principal's
    /// other packets, whose share it takes from.
    fn follow_key(&mut self, node: &Node, key: TxKey, now_ns: u64) {
        let Owner::Principal(p) = key.owner else { return };
        let (rest, own) = node.flow_txs_of(p, key.flow);
        if key.flow.is_some() {
            self.follow(TxKey::of(key.owner), rest, now_ns);
            self.follow(key, own, now_ns);
        } else {
            self.follow(key, rest, now_ns);
        }
    }

    /// Makes `key`'s guarantee on this link the one its reservation of
    /// `bytes_per_sec` maps to, if that changed since last time.
    fn follow(&mut self, key: TxKey, bytes_per_sec: u64, now_ns: u64) {
        if self.applied.get(&key).is_some_and(|(b, _)| *b == bytes_per_sec) {
            return;
        }
        let g = Guarantee::from_bytes_per_sec(bytes_per_sec, self.sched.config().rate_bps, self.period_ns);
        let ok = match self.sched.set_guarantee(key, g, now_ns) {
            Ok(()) => true,
            Err(e) => {
                // The sessions' reservations are admitted against the
                // node's transmit capacity, not per link: a link slower
                // than that capacity can refuse. The session then sends
                // as best effort on this link (and keeps any guarantee it
                // had).
                self.refused += 1;
                warn!(flow = %key, error = %e, "a transmit reservation does not fit this link");
                false
            }
        };
        if bytes_per_sec == 0 && ok {
            self.applied.remove(&key);
        } else {
            self.applied.insert(key, (bytes_per_sec, ok));
        }
    }
}

/// A paced link through a real daemon on loopback, its receive path and
/// its pacing driven by hand (`udp_ready`, `pace`), without the event loop.
#[cfg(test)]
mod tests {
    use crate::daemon::{Daemon, Options};
    use crate::udp::offload_tests::{line, plain};
    use anode_node::config::NodeConfig;
    use std::net::UdpSocket;
    use std::time::Duration;

    /// What the paced east link has charged to Best-Effort's session.
    fn best_effort_tx(d: &mut Daemon) -> u64 {
        let now = d.now_ns();
        let s = d.node.sessions_json(now).expect("rcane on");
        let be = s["sessions"].as_array().expect("sessions").iter().find(|s| s["owner"] == "best-effort").cloned();
        be.expect("Best-Effort's session")["charges"]["tx_packets"].as_u64().expect("tx_packets")
    }

    #[test]
    fn a_datagram_the_kernel_refuses_on_a_paced_link_is_not_charged() {
        // b forwards west to east; east is paced and RCANE is on. With c at
        // the broadcast address the kernel refuses every send (EACCES, no
        // SO_BROADCAST); with c on loopback it takes them.
        let key = anode_sec::Identity::from_seed(&[3; 32]).public().to_string();
        for refused in [true, false] {
            let a = UdpSocket::bind("127.0.0.1:0").expect("bind a");
            let c = UdpSocket::bind("127.0.0.1:0").expect("bind c");
            let free: Vec<u16> = crate::ports::reserve_loopback(2)
                .expect("free ports")
                .iter()
                .map(|s| s.local_addr().expect("addr").port())
                .collect();
            let run_dir = std::env::temp_dir().join(format!("anode-pacer-refused-{refused}-{}", std::process::id()));
            let to = if refused { "255.255.255.255:9".to_string() } else { c.local_addr().expect("c").to_string() };
            let cfg = NodeConfig::from_toml(&format!(
                "address = \"10.0.0.2\"\nrun_dir = \"{}\"\n\
                 [[interface]]\nname = \"west\"\nlisten = \"127.0.0.1:{}\"\n\
                 neighbors = [{{ address = \"10.0.0.1\", endpoint = \"{}\" }}]\n\
                 [[interface]]\nname = \"east\"\nlisten = \"127.0.0.1:{}\"\nrate_bps = 100000000\n\
                 neighbors = [{{ address = \"10.0.0.3\", endpoint = \"{to}\" }}]\n\
                 [modules]\nadmin_key = \"{key}\"\n",
                run_dir.display(),
                free[0],
                a.local_addr().expect("a"),
                free[1],
            ))
            .expect("config");
            let mut d = Daemon::bind(&cfg, None, &Options::default()).expect("daemon");
            let west = d.listen_addrs()[0];
            assert_eq!(best_effort_tx(&mut d), 0);
            for i in 0..5u8 {
                a.send_to(&plain(300, i), west).expect("send");
            }
            std::thread::sleep(Duration::from_millis(20));
            d.udp_ready(0);
            for _ in 0..50 {
                d.pace();
                if d.pacer.lock().status(1).expect("east is paced")["queued_packets"] == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let st = d.pacer.lock().status(1).expect("east");
            assert_eq!(st["sent_packets"], 5, "the link released all five\n{st}");
            let tx = d.node.counters.ifaces[1].tx_packets;
            if refused {
                assert_eq!((tx, best_effort_tx(&mut d)), (0, 0), "refused: neither sent nor charged");
            } else {
                assert_eq!((tx, best_effort_tx(&mut d)), (5, 5), "sent and charged");
            }
            let _ = std::fs::remove_dir_all(&run_dir);
        }
    }

    #[test]
    fn a_fast_idle_link_sends_a_whole_batch_at_once_in_order_unqueued() {
        // East is paced at 40 Gbit/s: ten 300-byte datagrams hold it 600 ns
        // in all, less than the core takes for the batch, so the link lets
        // all of them go when the batch is sent, none copied into its queue.
        let (mut d, a, c, west) = line("", "rate_bps = 40000000000\n", "pacer-burst");
        let sent: Vec<Vec<u8>> = (0..10u8).map(|i| plain(300, i)).collect();
        for p in &sent {
            a.send_to(p, west).expect("send");
        }
        std::thread::sleep(Duration::from_millis(20));
        d.udp_ready(0);
        let mut buf = [0u8; 2048];
        for s in &sent {
            let (n, _) = c.recv_from(&mut buf).expect("each datagram arrives");
            assert_eq!(buf[n - 1], s[s.len() - 1], "in order");
        }
        let st = d.pacer.lock().status(1).expect("east is paced");
        let got = (st["sent_packets"].as_u64(), st["sent_at_once"].as_u64(), st["queued_packets"].as_u64());
        assert_eq!(got, (Some(10), Some(10), Some(0)), "{st}");
        assert_eq!(d.node.counters.ifaces[1].tx_packets, 10);
        let _ = std::fs::remove_dir_all(d.run_dir());
    }

    #[test]
    fn a_paced_link_sends_at_its_rate_in_order_and_an_empty_one_asks_for_no_wakeup() {
        // East is paced at 1 Mbit/s: a 300-byte datagram holds it 2.4 ms.
        let (mut d, a, c, west) = line("", "rate_bps = 1000000\n", "pacer");
        c.set_nonblocking(true).expect("nonblocking");
        let sent: Vec<Vec<u8>> = (0..10u8).map(|i| plain(300, i)).collect();
        for p in &sent {
            a.send_to(p, west).expect("send");
        }
        std::thread::sleep(Duration::from_millis(20));
        d.udp_ready(0);
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        let mut drain = |got: &mut Vec<Vec<u8>>| {
            while let Ok((n, _)) = c.recv_from(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        };
        std::thread::sleep(Duration::from_millis(5));
        drain(&mut got);
        // One datagram left at once, unqueued; the other nine wait for the link.
        assert_eq!(got.len(), 1);
        let st = d.pacer.lock().status(1).expect("east is paced");
        assert_eq!((st["queued_packets"].as_u64(), st["sent_at_once"].as_u64()), (Some(9), Some(1)), "{st}");
        assert!(d.pacer.lock().status(0).is_none(), "west is not paced");
        assert!(d.pacer.lock().next_due_ns(d.now_ns()).is_some(), "a wakeup for the queue");
        // Released as the link frees, in order.
        for _ in 0..200 {
            std::thread::sleep(Duration::from_millis(1));
            d.pace();
            drain(&mut got);
            if got.len() == sent.len() {
                break;
            }
        }
        assert_eq!(got.len(), sent.len());
        for (s, g) in sent.iter().zip(&got) {
            assert_eq!(g[g.len() - 1], s[s.len() - 1], "in order");
        }
        let st = d.pacer.lock().status(1).expect("east");
        assert_eq!((st["sent_packets"].as_u64(), st["queued_packets"].as_u64()), (Some(10), Some(0)), "{st}");
        let be = st["clients"].as_array().expect("clients").iter().find(|c| c["owner"] == "best-effort").cloned();
        assert_eq!(be.expect("forwarding is best effort")["sent_packets"], 10);
        // Nothing queued: no wakeup.
        assert_eq!(d.pacer.lock().next_due_ns(d.now_ns()), None);
        assert_eq!(d.node.counters.ifaces[1].tx_packets, 10);
        let _ = std::fs::remove_dir_all(d.run_dir());
    }
}
