//! Entry points for the cargo-fuzz targets under `fuzz/` (and for replaying
//! their seeds as ordinary tests, `tests/fuzz_seeds.rs`). Each function
//! panics only when an invariant of the node is broken, never because the
//! input is bad.
//!
//! - [`datagram`]: bytes into [`Node::handle_datagram`] of a two-interface
//!   node; checks that every datagram is either handled or counted as a
//!   drop, that the counters add up to what came out, and that everything
//!   transmitted is a valid datagram for a real neighbour.
//! - [`config`]: text into [`NodeConfig::from_toml`] and
//!   [`Topology::from_toml`]; what parses must build a node and consistent
//!   shortest-path routes.
//! - [`local`]: bytes into the local-API decoders; what decodes must
//!   re-encode to the same bytes, and requests are applied to a node as the
//!   daemon would.

use crate::anep;
use crate::config::{NodeConfig, Topology};
use crate::core::{Data, Node, Outbox, recv_buffer_len};
use crate::counters::{Counters, Drop, N_DROPS};
use crate::local::{Reply, Request};
use crate::plain;
use anode_snap::wire::Packet;
use core::net::{Ipv4Addr, SocketAddr};
use std::sync::OnceLock;

/// The node the datagram target feeds (also the configuration unit tests
/// use): 10.0.0.2 between 10.0.0.1 (`west`) and 10.0.0.3 (`east`), with a
/// static route to 10.0.0.4.
pub const NODE: &str = r#"
address = "10.0.0.2"
[[interface]]
name = "west"
listen = "127.0.0.1:7002"
neighbors = [{ address = "10.0.0.1", endpoint = "127.0.0.1:7001" }]
[[interface]]
name = "east"
listen = "127.0.0.1:7012"
neighbors = [{ address = "10.0.0.3", endpoint = "127.0.0.1:7003" }]
[routes]
static = [{ dest = "10.0.0.4", via = "10.0.0.3" }]
"#;

/// Port registered at the fuzzed node.
pub const PORT: u16 = 7;

fn node(default_route: bool) -> Node {
    static CFG: OnceLock<NodeConfig> = OnceLock::new();
    let mut cfg = CFG.get_or_init(|| NodeConfig::from_toml(NODE).expect("the built-in configuration is valid")).clone();
    if default_route {
        cfg.routes.default_via = Some(Ipv4Addr::new(10, 0, 0, 1));
    }
    let mut n = Node::new(&cfg, None).expect("the built-in configuration builds");
    n.register_port(PORT);
    n
}

/// The neighbours of [`NODE`]: endpoint → interface.
fn neighbour_iface(to: SocketAddr) -> Option<usize> {
    match to.port() {
        7001 => Some(0),
        7003 => Some(1),
        _ => None,
    }
}

/// Feeds one datagram to a two-interface node and checks the accounting.
///
/// The first byte selects the setup (bit 0: a default route; bit 1: a
/// receive buffer exactly as long as the datagram, so the VM copies; bits
/// 2–3: the interface, 2 being one the node does not have; bits 4–5: the
/// rest is sent as is (0) or behind a valid ANEP header of type SNAP (1),
/// plain (2) or the type in its next two bytes (3)). The rest is the
/// datagram.
pub fn datagram(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut n = node(mode & 1 != 0);
    let bytes = match (mode >> 4) & 3 {
        0 => rest.to_vec(),
        1 => anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, rest),
        2 => anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, rest),
        _ => match rest.split_first_chunk::<2>() {
            Some((t, body)) => anep::frame(mode & 0x80, u16::from_be_bytes(*t), body),
            None => rest.to_vec(),
        },
    };
    if bytes.len() > u16::MAX as usize {
        return;
    }
    let iface = ((mode >> 2) & 3) as usize;
    let tight = mode & 2 != 0;
    let mut buf = bytes.clone();
    if !tight {
        buf.resize(recv_buffer_len(n.mtu()).max(bytes.len()), 0);
    }
    let before = n.counters.clone();
    let mut out = Outbox::default();
    n.handle_datagram(iface, &mut buf, bytes.len(), 5, &mut out);
    check_datagram(&bytes, iface, &before, &n.counters, &out, &buf);

    // Whatever came out, fed to the same node again (as a neighbour would
    // send it back), must obey the same rules.
    let sent: Vec<Vec<u8>> = out.transmits.iter().map(|t| out.bytes(&t.data, &buf).to_vec()).collect();
    for s in sent.iter().take(4) {
        let mut buf = s.clone();
        buf.resize(recv_buffer_len(n.mtu()).max(s.len()), 0);
        let before = n.counters.clone();
        let mut out = Outbox::default();
        n.handle_datagram(1, &mut buf, s.len(), 6, &mut out);
        check_datagram(s, 1, &before, &n.counters, &out, &buf);
    }
}

fn delta(a: &Counters, b: &Counters) -> Counters {
    let mut d = Counters::new(&[]);
    d.rx_snap = b.rx_snap - a.rx_snap;
    d.rx_plain = b.rx_plain - a.rx_plain;
    d.rx_unknown = b.rx_unknown - a.rx_unknown;
    d.passed_on = b.passed_on - a.passed_on;
    d.injected = b.injected - a.injected;
    d.snap_forwarded = b.snap_forwarded - a.snap_forwarded;
    d.snap_children = b.snap_children - a.snap_children;
    d.plain_forwarded = b.plain_forwarded - a.plain_forwarded;
    d.delivered = b.delivered - a.delivered;
    d.vm_instructions = b.vm_instructions - a.vm_instructions;
    for i in 0..N_DROPS {
        d.drops[i] = b.drops[i] - a.drops[i];
    }
    d.vm_faults = b.vm_faults.iter().zip(&a.vm_faults).map(|(x, y)| x - y).collect();
    d
}

/// Checks what handling `bytes` (from interface `iface`) did to the
/// counters and the outbox.
fn check_datagram(bytes: &[u8], iface: usize, before: &Counters, after: &Counters, out: &Outbox, input: &[u8]) {
    let d = delta(before, after);
    let drop = |r: Drop| d.dropped(r);
    // Interface counters.
    for (i, (a, b)) in before.ifaces.iter().zip(&after.ifaces).enumerate() {
        let hit = u64::from(i == iface);
        assert_eq!(b.rx_packets - a.rx_packets, hit);
        assert_eq!(b.rx_bytes - a.rx_bytes, hit * bytes.len() as u64);
        assert_eq!((b.tx_packets, b.tx_bytes), (a.tx_packets, a.tx_bytes), "the core never counts tx itself");
    }
    assert_eq!(d.injected, 0);
    assert_eq!(d.vm_faults.iter().sum::<u64>(), drop(Drop::VmFault), "every fault is one vm_fault drop");
    assert_eq!(out.deliveries.len() as u64, d.delivered);
    assert_eq!(drop(Drop::TxFailed), 0);
    let anep_drops = [Drop::AnepTruncated, Drop::AnepBadVersion, Drop::AnepBadLength, Drop::AnepBadOption];
    let handled = d.rx_snap.min(1) + d.rx_plain + d.rx_unknown;
    match anep::Packet::new_checked(bytes) {
        Err(e) => {
            let want = match e {
                anep::Error::Truncated(_) => Drop::AnepTruncated,
                anep::Error::BadVersion(_) => Drop::AnepBadVersion,
                anep::Error::BadHeaderLength { .. } | anep::Error::BadPacketLength { .. } => Drop::AnepBadLength,
                _ => Drop::AnepBadOption,
            };
            assert_eq!(drop(want), 1, "{e}");
            assert_eq!(d.total_drops(), 1, "{e}: one drop");
            assert_eq!(handled + d.rx_snap, 0, "{e}: not handled");
            assert!(out.transmits.is_empty() && out.deliveries.is_empty());
        }
        Ok(a) => {
            assert_eq!(anep_drops.iter().map(|&r| drop(r)).sum::<u64>(), 0);
            assert_eq!(handled, 1, "handled exactly once");
            match a.type_id() {
                anep::TYPE_SNAP => {
                    assert_eq!(d.rx_snap.min(1), 1);
                    // Packets sent to this node itself run here again (and
                    // count as received) or hit the loopback limit.
                    let to_self = d.rx_snap - 1 + drop(Drop::LoopbackLimit);
                    let sends = d.snap_forwarded + d.snap_children;
                    assert_eq!(out.transmits.len() as u64 + to_self + drop(Drop::NoRoute), sends);
                    // SNAP §IV-A.3 through the node: a packet that arrives
                    // with bound n causes at most n - 1 further sends.
                    let rb = bytes
                        .get(a.payload_start() + 4..a.payload_start() + 6)
                        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]) as u64);
                    assert!(sends < rb.max(1), "{sends} sends from a packet with rb {rb}");
                    for r in [Drop::UnknownType, Drop::PlainMalformed, Drop::TtlExceeded] {
                        assert_eq!(drop(r), 0, "{}", r.name());
                    }
                }
                anep::TYPE_PLAIN => {
                    assert_eq!(d.rx_plain, 1);
                    assert_eq!(d.delivered + d.plain_forwarded + d.total_drops(), 1, "one fate");
                    assert_eq!(out.transmits.len() as u64, d.plain_forwarded);
                    if d.plain_forwarded == 1 {
                        let ttl = bytes[a.payload_start() + 8];
                        let sent = out.bytes(&out.transmits[0].data, input);
                        assert_eq!(sent.len(), bytes.len());
                        assert_eq!(sent[a.payload_start() + 8], ttl - 1, "ttl decremented in place");
                    }
                    if d.delivered == 1 {
                        let got = out.bytes(&out.deliveries[0].data, input);
                        assert_eq!(got, &bytes[a.payload_start() + plain::HEADER_LEN..]);
                    }
                }
                _ => {
                    assert_eq!(d.rx_unknown, 1);
                    assert_eq!(d.passed_on + drop(Drop::UnknownType), 1);
                    assert_eq!(d.total_drops(), drop(Drop::UnknownType));
                    assert_eq!(out.transmits.len() as u64, d.passed_on);
                    if let Some(t) = out.transmits.first() {
                        assert_eq!(out.bytes(&t.data, input), bytes, "passed on unchanged");
                        assert!(!a.discard_if_unknown());
                    }
                }
            }
        }
    }
    for t in &out.transmits {
        assert_eq!(neighbour_iface(t.to), Some(t.iface), "sent to {} via interface {}", t.to, t.iface);
        let s = out.bytes(&t.data, input);
        let a = anep::Packet::new_checked(s).expect("transmits are valid ANEP datagrams");
        if a.type_id() == anep::TYPE_SNAP {
            let p = Packet::new_checked(a.payload()).expect("transmits are valid SNAP packets");
            assert_eq!(p.total_len(), a.payload().len());
            assert!(p.total_len() <= 1400);
        }
    }
    for dl in &out.deliveries {
        assert_eq!(dl.port, PORT, "only the registered port gets deliveries");
        if let Data::Input(r) = &dl.data {
            assert!(r.end <= input.len());
        }
    }
}

/// Parses text as a node configuration and as a topology. If the text holds
/// a line `%%`, the part before it is the configuration and the part after
/// it the topology, and the node is built from both.
pub fn config(data: &[u8]) {
    let Ok(text) = core::str::from_utf8(data) else { return };
    if let Some((c, t)) = text.split_once("\n%%\n") {
        if let (Ok(cfg), Ok(topo)) = (NodeConfig::from_toml(c), Topology::from_toml(t)) {
            check_topology(&topo);
            let in_topology = topo.nodes.iter().any(|n| n.address == cfg.address);
            match Node::new(&cfg, Some(&topo)) {
                Ok(n) => {
                    assert!(in_topology);
                    // Routes only ever point at configured neighbours.
                    let nbrs = cfg.neighbor_addrs();
                    for dest in topo.nodes.iter().take(64).map(|t| t.address) {
                        if let Some(via) = n.next_hop(dest) {
                            assert!(nbrs.contains(&via), "route to {dest} via non-neighbour {via}");
                        }
                    }
                }
                Err(e) => assert!(!in_topology, "{e}"),
            }
        }
        return;
    }
    if let Ok(cfg) = NodeConfig::from_toml(text) {
        // With security on, the node needs an identity (a fixed one here).
        let sec = cfg.security_enabled().then(|| crate::secure::SecurityInit {
            identity: anode_sec::Identity::from_seed(&[9; 32]),
            unix_ms_at_zero: 0,
        });
        match Node::with_security(&cfg, None, sec, 0) {
            Ok(n) => {
                assert_eq!(n.counters.ifaces.len(), cfg.interfaces.len());
                assert_eq!(n.address(), cfg.address);
            }
            // Only the security layer can refuse what validated: e.g. the
            // node's own key listed as a neighbour's.
            Err(crate::config::ConfigError::Links(_)) if cfg.security_enabled() => {}
            Err(e) => panic!("a configuration that validates builds a node: {e}"),
        }
    }
    if let Ok(topo) = Topology::from_toml(text) {
        check_topology(&topo);
    }
}

/// Every node's next hops are neighbours on a shortest path.
fn check_topology(t: &Topology) {
    for n in t.nodes.iter().take(32) {
        let hops = t.next_hops(n.address).expect("a topology node has routes");
        let dist = t.hop_counts(n.address);
        let nbrs = t.neighbors(n.address);
        for (dest, via) in &hops {
            assert!(nbrs.contains(via), "next hop {via} is not a neighbour of {}", n.address);
            assert_ne!(*dest, n.address);
            let dv = t.hop_counts(*via);
            assert_eq!(dv.get(dest).map(|d| d + 1), dist.get(dest).copied(), "{via} is on a shortest path");
        }
        assert_eq!(hops.len() + 1, dist.len(), "every reachable node has a route");
    }
}

/// Decodes bytes as a local-API request and as a reply; what decodes must
/// encode back to the same bytes. Decoded requests are applied to a node as
/// the daemon would apply them.
pub fn local(data: &[u8]) {
    if let Ok(r) = Request::decode(data) {
        assert_eq!(r.encode(), data, "request re-encodes byte for byte");
        assert_eq!(Request::decode(&r.encode()), Ok(r.clone()));
        let mut n = node(true);
        let mut out = Outbox::default();
        match r {
            Request::Hello => {}
            Request::Register(p) => n.register_port(p),
            Request::Unregister(p) => n.unregister_port(p),
            Request::Inject(packet) => n.inject_snap(packet, 0, &mut out),
            Request::Plain { dst, port, ttl, payload } => n.inject_plain(dst, port, ttl, payload, 0, &mut out),
            // Modules are off in the fuzzing node: counted, nothing else.
            Request::Capsule(c) => {
                let _ = n.inject_capsule(c, 0, &mut out);
            }
        }
        // Results of a local request never point into a receive buffer.
        for t in &out.transmits {
            assert!(matches!(t.data, Data::Arena(_)));
            assert_eq!(neighbour_iface(t.to), Some(t.iface));
            assert!(anep::Packet::new_checked(out.bytes(&t.data, &[])).is_ok());
        }
        for dl in &out.deliveries {
            assert!(matches!(dl.data, Data::Arena(_)));
        }
        assert_eq!(out.deliveries.len() as u64, n.counters.delivered);
    }
    if let Ok(r) = Reply::decode(data) {
        assert_eq!(r.encode(), data, "reply re-encodes byte for byte");
        assert_eq!(Reply::decode(&r.encode()), Ok(r.clone()));
    }
}

/// Arbitrary bytes as a control message: parse, and a parsed message
/// re-encodes to the same bytes; and the same bytes as a session request
/// to a node with RCANE on: always a well-formed reply, never a panic.
pub fn control(data: &[u8]) {
    let mut n = node(false);
    if n.enable_rcane(anode_sched::RcaneConfig::default(), 0).is_ok() {
        let reply = n.session_request(anode_sandbox::PrincipalId([3; 32]), data, 1);
        assert!(anode_sched::wire::Reply::parse_bytes(&reply).is_ok(), "the node answers every request");
    }
    // The same bytes as a boot recovery request (CONTROL 0x21): handed to
    // the repository as they are, the reply framed back to the requester.
    let key = anode_sec::Identity::from_seed(&[5; 32]).public();
    let to: SocketAddr = ([127, 0, 0, 1], 9).into();
    let mut out = Outbox::default();
    n.serve_recovery(Box::new(|req| req.first().map(|_| req.to_vec())));
    n.recovery_request(Some(key), Some(to), 0, data, 1, &mut out);
    for t in &out.transmits {
        let f = anep::Packet::new_checked(out.bytes(&t.data, &[])).expect("a reply is a valid frame");
        assert_eq!(f.payload().split_first(), Some((&crate::core::RECOVERY_OP, data)));
    }
    if let Ok(m) = anode_wire::control::Message::parse(data) {
        let mut v = Vec::new();
        assert!(m.emit(&mut v).is_ok(), "a parsed message emits");
        assert_eq!(v, data, "a control message re-encodes byte for byte");
        assert_eq!(v.len(), m.buffer_len());
    }
}

/// Arbitrary bytes as a sequence of code chunks and staged loads from eight
/// principals (the staging of modules too large for one control datagram):
/// 6 bytes per step, `[op, who, total (2), offset (2)]`; bit 0 of `op`
/// takes `who`'s staged code instead of adding a chunk of `op >> 2` bytes
/// (at least 1), bits 1-2 of `op` advance the clock by 0, 10, 20 or 40 s.
/// The bounds hold after every step, and staged code comes out whole: as
/// long as the total of its first chunk.
pub fn staging(data: &[u8]) {
    use crate::core::staging::{MAX_STAGED_BYTES, MAX_STAGINGS, Staging};
    use anode_sandbox::PrincipalId;
    use anode_wire::control::CodeChunk;
    let mut s = Staging::default();
    let mut totals = std::collections::HashMap::new();
    let mut now = 0u64;
    let bytes = [0x5au8; 64];
    for step in data.chunks_exact(6) {
        let (op, who) = (step[0], PrincipalId([step[1] & 7; 32]));
        let total = u32::from(u16::from_be_bytes([step[2], step[3]]));
        let offset = u32::from(u16::from_be_bytes([step[4], step[5]]));
        now += [0, 10_000, 20_000, 40_000][usize::from((op >> 1) & 3)];
        if op & 1 == 1 {
            if let Ok(code) = s.take(who, now) {
                assert_eq!(Some(&code.len()), totals.get(&who), "staged code comes out whole");
            }
            totals.remove(&who);
        } else {
            let data = &bytes[..usize::from(op >> 2).clamp(1, 63)];
            let c = CodeChunk { total, offset, data };
            match s.chunk(who, &c, 40_000, now, |_, _| Some(anode_sandbox::HeapCharge::default())) {
                Ok(n) => {
                    if offset == 0 {
                        totals.insert(who, total as usize);
                    }
                    assert!(n as usize <= total as usize, "never more than declared");
                }
                Err(_) if offset == 0 => {
                    totals.remove(&who);
                }
                Err(_) => {}
            }
        }
        let (n, declared) = s.usage();
        assert!(n <= MAX_STAGINGS && declared <= MAX_STAGED_BYTES, "bounded: {n} stagings, {declared} bytes");
    }
}
