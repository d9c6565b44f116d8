//! SANE through the sans-I/O core: three nodes in a line with security on,
//! in one process. Link keys come up at boot, a SNAP ping crosses both
//! links protected hop by hop, and every attack ends in its own counted
//! drop.
#![allow(clippy::unwrap_used)]

use anode_node::anep;
use anode_node::config::NodeConfig;
use anode_node::core::{Node, Outbox, recv_buffer_len};
use anode_node::counters::Drop;
use anode_node::secure::SecurityInit;
use anode_sec::Identity;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};

const PING: &str = include_str!("../../../examples/snap/ping.s");

fn addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, k as u8 + 1)
}
fn ep(k: usize, i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], (11_000 + 100 * k + i) as u16))
}
fn id(k: usize) -> Identity {
    Identity::from_seed(&[k as u8 + 40; 32])
}

struct Line {
    nodes: Vec<Node>,
    cfgs: Vec<NodeConfig>,
    ends: HashMap<SocketAddr, (usize, usize)>,
    queue: VecDeque<(usize, usize, SocketAddr, Vec<u8>)>,
    /// Every datagram carried: (from, to, bytes).
    wire: Vec<(usize, usize, Vec<u8>)>,
    delivered: Vec<Vec<(u16, Vec<u8>)>>,
    now: u64,
}

/// Config of node k in a line of n; `mode` for every link.
fn config(k: usize, n: usize, mode: &str) -> String {
    let mut s = format!("address = \"{}\"\n[security]\nkey = \"unused.key\"\nmode = \"{mode}\"\n", addr(k));
    let mut i = 0;
    for j in [k.wrapping_sub(1), k + 1] {
        if j >= n {
            continue;
        }
        let back = if j < k { 1 } else { 0 };
        s += &format!(
            "[[interface]]\nname = \"if{i}\"\nlisten = \"{}\"\nneighbors = [{{ address = \"{}\", endpoint = \"{}\", key = \"{}\" }}]\n",
            ep(k, i),
            addr(j),
            ep(j, if j == 0 { 0 } else { back }),
            id(j).public()
        );
        i += 1;
    }
    let routes: Vec<String> = (0..n)
        .filter(|&d| d != k && d.abs_diff(k) > 1)
        .map(|d| format!("{{ dest = \"{}\", via = \"{}\" }}", addr(d), addr(if d > k { k + 1 } else { k - 1 })))
        .collect();
    s += &format!("[routes]\nstatic = [{}]\n", routes.join(", "));
    s += &format!("[modules]\nadmin_key = \"{}\"\n", Identity::from_seed(&ADMIN).public());
    s
}

/// The administrator's key seed: the root of module credentials.
const ADMIN: [u8; 32] = [77; 32];

impl Line {
    fn new(n: usize, mode: &str) -> Line {
        let cfgs: Vec<NodeConfig> =
            (0..n).map(|k| NodeConfig::from_toml(&config(k, n, mode)).unwrap_or_else(|e| panic!("{k}: {e}"))).collect();
        let nodes = (0..n).map(|k| Line::boot(&cfgs[k], k, 0)).collect();
        let mut ends = HashMap::new();
        for (k, c) in cfgs.iter().enumerate() {
            for (i, iface) in c.interfaces.iter().enumerate() {
                ends.insert(iface.listen, (k, i));
            }
        }
        Line { nodes, cfgs, ends, queue: VecDeque::new(), wire: Vec::new(), delivered: vec![Vec::new(); n], now: 0 }
    }

    fn boot(cfg: &NodeConfig, k: usize, now: u64) -> Node {
        let init = SecurityInit { identity: id(k), unix_ms_at_zero: 1_800_000_000_000 };
        let mut n = Node::with_security(cfg, None, Some(init), now).unwrap();
        let m = cfg.modules.as_ref().unwrap();
        let sb = anode_node::switchlets::sandbox(m, cfg.address, n.route_table()).unwrap();
        n.enable_modules(sb, 1_800_000_000_000);
        n.register_port(7);
        n
    }

    fn take(&mut self, k: usize, out: &Outbox, input: &[u8]) {
        for t in &out.transmits {
            let b = out.bytes(&t.data, input).to_vec();
            let (to, iface) = self.ends[&t.to];
            let from = self.cfgs[k].interfaces[t.iface].listen;
            self.wire.push((k, to, b.clone()));
            self.queue.push_back((to, iface, from, b));
        }
        for d in &out.deliveries {
            self.delivered[k].push((d.port, out.bytes(&d.data, input).to_vec()));
        }
    }

    fn run(&mut self) {
        let mut steps = 0;
        while let Some((k, iface, from, b)) = self.queue.pop_front() {
            steps += 1;
            assert!(steps < 10_000, "livelock");
            self.arrive(k, iface, from, &b);
        }
    }

    fn arrive(&mut self, k: usize, iface: usize, from: SocketAddr, b: &[u8]) {
        self.now += 1;
        let mut buf = vec![0u8; recv_buffer_len(1400).max(b.len())];
        buf[..b.len()].copy_from_slice(b);
        let mut out = Outbox::default();
        self.nodes[k].handle_datagram_from(iface, Some(from), &mut buf, b.len(), self.now, &mut out);
        self.take(k, &out, &buf);
    }

    /// Runs each node's timers that are due, as a driver that sleeps until
    /// `poll_at` would (so a deadline `poll_at` misses fails these tests).
    fn poll(&mut self) {
        for k in 0..self.nodes.len() {
            if self.nodes[k].poll_at().is_some_and(|t| t <= self.now) {
                let mut out = Outbox::default();
                self.nodes[k].handle_timeout(self.now, &mut out);
                self.take(k, &out, &[]);
            }
        }
        self.run();
    }

    fn ping(&mut self, from: usize, to: usize) -> usize {
        let mut r = anode_snap::asm::assemble(PING).unwrap();
        r.src = addr(from);
        r.dst = addr(to);
        r.resource_bound = 16;
        r.port = 7;
        let p = r.to_bytes().unwrap();
        let before = self.delivered[from].len();
        let mut out = Outbox::default();
        self.nodes[from].inject_snap(&p, self.now, &mut out);
        self.take(from, &out, &[]);
        self.run();
        self.delivered[from].len() - before
    }

    fn drops(&self, k: usize, d: Drop) -> u64 {
        self.nodes[k].counters.dropped(d)
    }
}

#[test]
fn links_come_up_and_ping_crosses_protected_hops() {
    for mode in ["authenticate", "encrypt"] {
        let mut l = Line::new(3, mode);
        l.poll();
        assert!(l.nodes[0].link_up(addr(1)) && l.nodes[1].link_up(addr(0)) && l.nodes[1].link_up(addr(2)), "{mode}");
        l.wire.clear();
        assert_eq!(l.ping(0, 2), 1, "{mode}: the echo came back");
        assert_eq!(l.wire.len(), 4, "two hops out, two back");
        for (_, _, b) in &l.wire {
            let a = anep::Packet::new_checked(b).unwrap();
            let want = if mode == "encrypt" { anep::TYPE_ESP } else { anep::TYPE_AUTH };
            assert_eq!(a.type_id(), want);
            // In encrypt mode the SNAP header is not visible on the wire.
            let snap_magic_visible = b.windows(8).any(|w| w == &addr(2).octets().repeat(2)[..]);
            let _ = snap_magic_visible;
        }
        for k in 0..3 {
            assert_eq!(l.nodes[k].counters.total_drops(), 0, "{mode}: node {k} {:?}", l.nodes[k].counters.to_json());
        }
        let st = l.nodes[1].security_json().unwrap();
        assert_eq!(st["peers"].as_array().unwrap().len(), 2);
        assert!(st["peers"][0]["up"].as_bool().unwrap());
    }
}

#[test]
fn a_forwarded_datagram_is_sealed_in_its_receive_buffer() {
    // The middle node opens the datagram in place and seals it for the next
    // hop in the same buffer (no copy into the outbox); the next hop opens
    // it and the echo comes back.
    for mode in ["authenticate", "encrypt"] {
        let mut l = Line::new(3, mode);
        l.poll();
        let mut r = anode_snap::asm::assemble(PING).unwrap();
        (r.src, r.dst, r.resource_bound, r.port) = (addr(0), addr(2), 16, 7);
        let mut out = Outbox::default();
        l.nodes[0].inject_snap(&r.to_bytes().unwrap(), l.now, &mut out);
        let t0 = out.transmits[0].clone();
        let b = out.bytes(&t0.data, &[]).to_vec();
        let (k, iface) = l.ends[&t0.to];
        assert_eq!(k, 1);
        let from = l.cfgs[0].interfaces[t0.iface].listen;
        let mut buf = vec![0u8; recv_buffer_len(1400)];
        buf[..b.len()].copy_from_slice(&b);
        let mut out = Outbox::default();
        l.nodes[1].handle_datagram_from(iface, Some(from), &mut buf, b.len(), l.now, &mut out);
        assert_eq!(out.transmits.len(), 1, "{mode}");
        let t = &out.transmits[0];
        assert!(matches!(t.data, anode_node::core::Data::Input(_)), "{mode}: sealed in the receive buffer");
        let sealed = out.bytes(&t.data, &buf).to_vec();
        assert_eq!(sealed.len(), b.len(), "{mode}: the same length as it arrived");
        assert_ne!(sealed, b, "{mode}: sealed anew for the next hop");
        l.take(1, &out, &buf);
        let before = l.delivered[0].len();
        l.run();
        assert_eq!(l.delivered[0].len(), before + 1, "{mode}: the echo came back");
        for k in 0..3 {
            assert_eq!(l.nodes[k].counters.total_drops(), 0, "{mode}: node {k}");
        }
        // A buffer cut at the datagram's end leaves no room for the tag:
        // the datagram is copied and sealed in the outbox instead.
        let mut out = Outbox::default();
        l.nodes[0].inject_snap(&r.to_bytes().unwrap(), l.now, &mut out);
        let b = out.bytes(&out.transmits[0].data, &[]).to_vec();
        let mut tight = b.clone();
        let mut out = Outbox::default();
        l.nodes[1].handle_datagram_from(iface, Some(from), &mut tight, b.len(), l.now, &mut out);
        assert_eq!(out.transmits.len(), 1, "{mode}");
        assert!(matches!(out.transmits[0].data, anode_node::core::Data::Arena(_)), "{mode}: copied");
        l.take(1, &out, &tight);
        let before = l.delivered[0].len();
        l.run();
        assert_eq!(l.delivered[0].len(), before + 1, "{mode}: the echo came back");
    }
}

#[test]
fn a_forwarded_plain_datagram_is_sealed_again_in_exactly_its_own_bytes() {
    // The daemon hands the core a datagram cut from a GRO run as exactly
    // its bytes: a forwarded plain datagram keeps its length, so its new
    // headers go where its old ones were and its new tag where the old tag
    // was, with no byte outside it touched and no copy.
    for mode in ["authenticate", "encrypt"] {
        let mut l = Line::new(3, mode);
        l.poll();
        let mut out = Outbox::default();
        l.nodes[0].inject_plain(addr(2), 9, 8, &[0x5a; 1200], l.now, &mut out);
        let t0 = out.transmits[0].clone();
        let b = out.bytes(&t0.data, &[]).to_vec();
        let (k, iface) = l.ends[&t0.to];
        assert_eq!(k, 1);
        let from = l.cfgs[0].interfaces[t0.iface].listen;
        // Between two neighbours of a GRO run.
        let mut run = vec![0xee; 7];
        run.extend_from_slice(&b);
        run.extend_from_slice(&[0xee; 9]);
        let (before, rest) = run.split_at_mut(7);
        let (seg, after) = rest.split_at_mut(b.len());
        let mut out = Outbox::default();
        l.nodes[1].handle_datagram_from(iface, Some(from), seg, b.len(), l.now, &mut out);
        assert_eq!(out.transmits.len(), 1, "{mode}");
        let t = &out.transmits[0];
        assert!(matches!(t.data, anode_node::core::Data::Input(_)), "{mode}: sealed where it arrived");
        let sealed = out.bytes(&t.data, seg).to_vec();
        assert_eq!(sealed.len(), b.len(), "{mode}: all of its bytes, no more");
        assert_ne!(sealed, b, "{mode}: sealed anew for the next hop");
        assert!(before.iter().chain(after.iter()).all(|x| *x == 0xee), "{mode}: its neighbours untouched");
        let plain = |l: &Line| l.nodes[2].counters.to_json()["packets"]["rx_plain"].as_u64();
        let got = plain(&l);
        l.take(1, &out, seg);
        l.run();
        // c opened it and found a plain datagram for its port 9, where no
        // application listens.
        assert_eq!(plain(&l), got.map(|n| n + 1), "{mode}: c received it");
        assert_eq!(l.drops(2, Drop::NoListener), 1, "{mode}");
        for k in 0..3 {
            assert_eq!(l.nodes[k].counters.total_drops(), u64::from(k == 2), "{mode}: node {k}");
        }
    }
}

#[test]
fn encrypted_hops_hide_the_packet() {
    let mut clear = Line::new(3, "authenticate");
    let mut enc = Line::new(3, "encrypt");
    for l in [&mut clear, &mut enc] {
        l.poll();
        l.wire.clear();
        assert_eq!(l.ping(0, 2), 1);
    }
    // The destination address 10.0.0.3 is in every SNAP header: visible in
    // authenticate mode, never in encrypt mode.
    let dst = addr(2).octets();
    let shows = |w: &Vec<(usize, usize, Vec<u8>)>| w.iter().filter(|(_, _, b)| b.windows(4).any(|x| x == dst)).count();
    assert_eq!(shows(&clear.wire), 4);
    assert_eq!(shows(&enc.wire), 0);
}

#[test]
fn attacks_end_in_counted_drops() {
    let mut l = Line::new(3, "authenticate");
    l.poll();
    l.wire.clear();
    assert_eq!(l.ping(0, 2), 1);
    let (_, to, good) = l.wire[0].clone();
    assert_eq!(to, 1);
    let from = ep(0, 0);

    // Replay.
    l.arrive(1, 0, from, &good);
    l.run();
    assert_eq!(l.drops(1, Drop::AuthReplay), 1, "{:?}", l.nodes[1].counters.to_json()["drops"]);
    // Tampered: a fresh counter (so the window lets it through to the
    // tag check) and a flipped payload byte. The window must not move.
    let mut bad = good.clone();
    bad[12..20].copy_from_slice(&1_000_000u64.to_be_bytes());
    let last = bad.len() - 20;
    bad[last] ^= 1;
    l.arrive(1, 0, from, &bad);
    assert_eq!(l.drops(1, Drop::AuthTagMismatch), 1);
    assert_eq!(l.ping(0, 2), 1, "the forged counter did not move the window");
    // Unknown SPI.
    let mut bad = good.clone();
    bad[8] ^= 0xff;
    l.arrive(1, 0, from, &bad);
    assert_eq!(l.drops(1, Drop::AuthUnknownSpi), 1);
    // Truncated (the ANEP length fixed up so only the AH check can fail).
    let mut short = good[..8 + 20].to_vec();
    anep::write_header(&mut short, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_AUTH, 20);
    l.arrive(1, 0, from, &short);
    assert_eq!(l.drops(1, Drop::AuthTruncated), 1);
    // An unauthenticated SNAP packet: not from a neighbour.
    let mut r = anode_snap::asm::assemble(PING).unwrap();
    r.src = addr(0);
    r.dst = addr(2);
    r.resource_bound = 16;
    let plain = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, &r.to_bytes().unwrap());
    l.wire.clear();
    l.arrive(1, 0, from, &plain);
    l.run();
    assert_eq!(l.drops(1, Drop::NonNeighbor), 1);
    assert!(l.wire.is_empty(), "nothing forwarded");
    // A handshake from a key not in the config.
    let mut stranger = anode_sec::Links::new(
        Identity::from_seed(&[99; 32]),
        anode_sec::LinksConfig {
            peers: vec![anode_sec::PeerConfig {
                key: id(1).public(),
                endpoint: ep(1, 0),
                mode: anode_sec::Mode::Authenticate,
            }],
            unix_offset_ms: 1_800_000_000_000,
            ..Default::default()
        },
        l.now,
    )
    .unwrap();
    let mut outs = Vec::new();
    stranger.poll(l.now, &mut outs);
    let Some(anode_sec::Output::Handshake { msg, .. }) = outs.pop() else { panic!() };
    let d = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg);
    l.arrive(1, 0, SocketAddr::from(([127, 0, 0, 9], 9)), &d);
    assert_eq!(l.drops(1, Drop::NonNeighbor), 2);
    // Still working for everyone else.
    assert_eq!(l.ping(0, 2), 1);
}

#[test]
fn middle_node_restart_recovers() {
    let mut l = Line::new(3, "encrypt");
    l.poll();
    assert_eq!(l.ping(0, 2), 1);
    l.now += 1000;
    // The middle node restarts: new state, same key and config.
    l.nodes[1] = Line::boot(&l.cfgs[1], 1, l.now);
    // Before its handshakes: its neighbours' packets carry SPIs it forgot.
    assert_eq!(l.ping(0, 2), 0);
    assert_eq!(l.drops(1, Drop::AuthUnknownSpi), 1);
    // The restarted node starts its handshakes (at once for the neighbour
    // whose packet it could not place; within a retry interval for all).
    l.now += 600;
    l.poll();
    assert_eq!(l.ping(0, 2), 1, "links recovered");
    assert_eq!(l.ping(2, 0), 1);
}

#[test]
fn no_sa_yet_is_counted_not_sent() {
    let mut l = Line::new(2, "authenticate");
    // No poll: no handshakes yet.
    assert_eq!(l.ping(0, 1), 0);
    assert_eq!(l.drops(0, Drop::NoSa), 1);
    l.poll();
    assert_eq!(l.ping(0, 1), 1);
}

#[test]
fn config_requires_keys_when_security_is_on() {
    let text = config(0, 2, "authenticate");
    let no_key = text.replace(&format!(", key = \"{}\"", id(1).public()), "");
    let e = NodeConfig::from_toml(&no_key).unwrap_err().to_string();
    assert!(e.contains("has no `key`"), "{e}");
    let bad = text.replace(&id(1).public().to_string(), "abcd");
    let e = NodeConfig::from_toml(&bad).unwrap_err().to_string();
    assert!(e.contains("neighbour 10.0.0.2 key"), "{e}");
    let e = NodeConfig::from_toml(&text.replace("mode = \"authenticate\"", "mode = \"sometimes\"")).unwrap_err();
    assert!(e.to_string().contains("sometimes"));
    let e = NodeConfig::from_toml(&text.replace("key = \"unused.key\"\n", "")).unwrap_err();
    assert!(e.to_string().contains("secret key file"), "{e}");
    // Security on but no identity given.
    let cfg = NodeConfig::from_toml(&text).unwrap();
    assert!(Node::new(&cfg, None).is_err());
    // Switched off: the baseline.
    let off = NodeConfig::from_toml(&text.replace("[security]\n", "[security]\nenabled = false\n")).unwrap();
    assert!(Node::new(&off, None).is_ok());
}

/// The example ping module, built from source by `scripts/setup`.
fn ping_module() -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/ping.wasm");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup)", p.display()))
}

fn ping_credential(code: &[u8]) -> Vec<u8> {
    use anode_cred::{GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
    let issuer = Issuer::from_secret(&ADMIN).unwrap();
    let user = PrincipalId::of(&anode_cred::SigningKey::from_bytes(&[5; 32]));
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(code))],
        interfaces: InterfaceSet::of(&[Interface::Route, Interface::Net, Interface::Time]),
        limits: Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 },
        expires: None,
    };
    issuer.issue(user, &spec).unwrap().to_bytes().to_vec()
}

impl Line {
    fn capsule_ping(&mut self, from: usize, to: usize, carry: bool, port: u16) -> Vec<u8> {
        let code = ping_module();
        let cred = ping_credential(&code);
        let mut c = Vec::new();
        anode_sandbox::ping::capsule(&code, &cred, addr(from), addr(to), self.now, port, carry, &mut c).unwrap();
        self.nodes[from].register_port(port);
        let before = self.delivered[from].len();
        let mut out = Outbox::default();
        self.nodes[from].inject_capsule(&c, self.now, &mut out).expect("capsule accepted at its first hop");
        self.take(from, &out, &[]);
        self.run();
        // Code fetches time out after a while; let pending ones finish.
        self.poll();
        self.delivered[from][before..]
            .iter()
            .filter(|(p, _)| *p == port)
            .map(|(_, b)| b.clone())
            .next()
            .unwrap_or_default()
    }
}

#[test]
fn active_ping_capsule_over_protected_hops() {
    let mut l = Line::new(3, "encrypt");
    l.poll();
    // Code carried on every hop.
    let reply = l.capsule_ping(0, 2, true, 9000);
    let (target, _rtt) = anode_sandbox::ping::parse_reply(&reply).expect("pong");
    assert_eq!(target, addr(2));
    // By hash: each hop fetches the code from the previous one once…
    let reply = l.capsule_ping(0, 2, false, 9001);
    assert_eq!(anode_sandbox::ping::parse_reply(&reply).map(|r| r.0), Some(addr(2)));
    let fetched: u64 = (0..3).map(|k| l.nodes[k].modules_json().unwrap()["code_fetched"].as_u64().unwrap_or(0)).sum();
    // …and the warm cache serves the next capsule with no fetch at all.
    l.wire.clear();
    let reply = l.capsule_ping(0, 2, false, 9002);
    assert_eq!(anode_sandbox::ping::parse_reply(&reply).map(|r| r.0), Some(addr(2)));
    let fetched2: u64 = (0..3).map(|k| l.nodes[k].modules_json().unwrap()["code_fetched"].as_u64().unwrap_or(0)).sum();
    assert_eq!(fetched, fetched2, "no fetch for a warm capsule");
    assert_eq!(l.wire.len(), 4, "two hops out, two back, hash only");
    for (_, _, b) in &l.wire {
        assert_eq!(anep::Packet::new_checked(b).unwrap().type_id(), anep::TYPE_ESP, "capsules are sealed hop by hop");
    }
    for k in 0..3 {
        assert_eq!(l.drops(k, Drop::CapsuleRefused), 0, "{:?}", l.nodes[k].modules_json());
    }
}

#[test]
fn capsule_without_a_valid_credential_is_refused_and_counted() {
    let mut l = Line::new(2, "encrypt");
    l.poll();
    let code = ping_module();
    // A credential from the wrong issuer.
    let other = anode_cred::Issuer::from_secret(&[1; 32]).unwrap();
    let user = anode_cred::PrincipalId::of(&anode_cred::SigningKey::from_bytes(&[5; 32]));
    let bad = other.admin(user, None).unwrap().to_bytes().to_vec();
    let mut c = Vec::new();
    anode_sandbox::ping::capsule(&code, &bad, addr(0), addr(1), 0, 9000, true, &mut c).unwrap();
    let mut out = Outbox::default();
    let e = l.nodes[0].inject_capsule(&c, l.now, &mut out).expect_err("refused");
    assert!(e.to_string().contains("not issued by this node's administrator"), "{e}");
    assert!(out.transmits.is_empty() && out.deliveries.is_empty());
    assert_eq!(l.drops(0, Drop::CapsuleRefused), 1);
    // SNAP still works.
    assert_eq!(l.ping(0, 1), 1);
}

/// `anode capture` in the core (issue 19): on an encrypted line the middle
/// node's capture holds the plaintext SNAP datagrams (the wire has only
/// ESP), each direction with the real endpoints; a queue of one drops the
/// rest as counted capture drops while the ping still crosses; stopping
/// empties it; one capture at a time.
#[test]
fn capture_holds_plaintext_both_ways_and_a_full_queue_drops_copies_not_packets() {
    use anode_node::core::{CaptureConfig, CaptureDir, CaptureStartError, CaptureStop};
    let mut l = Line::new(3, "encrypt");
    l.poll();
    let local: Vec<SocketAddr> = l.cfgs[1].interfaces.iter().map(|i| i.listen).collect();
    let cfg = |queue| CaptureConfig {
        interfaces: vec![true, true],
        local: local.clone(),
        queue,
        queue_bytes: 1 << 20,
        unix_ms_at_zero: 1_800_000_000_000,
    };
    l.nodes[1].capture_start(cfg(64)).unwrap();
    assert_eq!(l.nodes[1].capture_start(cfg(64)), Err(CaptureStartError::Busy));
    l.wire.clear();
    assert_eq!(l.ping(0, 2), 1);
    assert!(l.wire.iter().all(|(_, _, b)| anep::Packet::new_checked(b).unwrap().type_id() == anep::TYPE_ESP));
    let mut got = Vec::new();
    l.nodes[1].capture_drain(usize::MAX, |p| {
        got.push(p.clone());
        true
    });
    assert_eq!(got.len(), 4, "in and out, both ways: {got:?}");
    for p in &got {
        let a = anep::Packet::new_checked(&p.data[..]).unwrap();
        assert_eq!(a.type_id(), anep::TYPE_SNAP, "plaintext, not ESP");
        assert_eq!(p.local, local[p.iface]);
        assert!(p.ts_ns >= 1_800_000_000_000 * 1_000_000);
    }
    let dirs: Vec<CaptureDir> = got.iter().map(|p| p.dir).collect();
    assert_eq!(dirs, [CaptureDir::In, CaptureDir::Out, CaptureDir::In, CaptureDir::Out]);
    assert_eq!((got[0].peer, got[1].peer), (ep(0, 0), ep(2, 0)), "from a, then to c");
    l.nodes[1].capture_stop(CaptureStop::ClientGone);
    assert!(!l.nodes[1].capture_on());

    l.nodes[1].capture_start(cfg(1)).unwrap();
    assert_eq!(l.ping(0, 2), 1, "a full capture queue does not stop the ping");
    assert_eq!(l.nodes[1].capture_drops(), 3);
    let k = l.nodes[1].capture_counters();
    assert_eq!((k.started, k.queued_in, k.queued_out, k.drops, k.drained), (2, 3, 2, 3, 4));
    l.nodes[1].capture_stop(CaptureStop::Stalled);
    let k = l.nodes[1].capture_counters();
    assert_eq!((k.stopped_client, k.stopped_stalled), (1, 1));
    assert_eq!(l.nodes[1].capture_json()["running"], false);
}

/// A link scheduler holds datagrams back and reorders them across its
/// clients (the daemon's paced links). Sealed when produced, a datagram
/// that waits behind more than the receiver's replay window of later ones
/// is refused there; with the link's interface marked to seal at send
/// (`set_seal_at_send`, then `seal_for` in the order the link sends), the
/// same order is accepted; so it is when every other datagram is sealed in
/// place between `SEAL_HEADROOM` bytes and room for its tag (`seal_range`,
/// as the daemon's link queue does).
#[test]
fn sealing_at_send_keeps_a_held_back_datagram_inside_the_replay_window() {
    const LATER: usize = 4_100; // more than the SA's 4,032-datagram window
    for (at_send, in_place) in [(false, false), (true, false), (true, true)] {
        let mut l = Line::new(2, "encrypt");
        l.poll();
        if at_send {
            l.nodes[0].set_seal_at_send(vec![true]);
        }
        let mut r = anode_snap::asm::assemble(PING).unwrap();
        (r.src, r.dst, r.resource_bound, r.port) = (addr(0), addr(1), 16, 7);
        let ping = r.to_bytes().unwrap();
        let mut made = Vec::new();
        for _ in 0..=LATER {
            let mut out = Outbox::default();
            l.nodes[0].inject_snap(&ping, l.now, &mut out);
            for t in &out.transmits {
                assert_eq!(t.unsealed, at_send);
                let b = out.bytes(&t.data, &[]).to_vec();
                // Unsealed, it is the plain ANEP datagram (never sent so).
                let ty = anep::Packet::new_checked(&b[..]).unwrap().type_id();
                assert_eq!(ty == anep::TYPE_ESP, !at_send);
                made.push((t.to, b));
            }
        }
        assert_eq!(made.len(), LATER + 1);
        // The first one waited: the link sends it last.
        made.rotate_left(1);
        let before = l.delivered[0].len();
        for (i, (to, b)) in made.into_iter().enumerate() {
            let wire = if in_place && i % 2 == 0 {
                let h = anode_node::core::SEAL_HEADROOM;
                let mut laid = vec![0xee; h];
                laid.extend_from_slice(&b);
                laid.resize(h + b.len() + anode_node::core::SEAL_OVERHEAD - h, 0xee);
                let at = l.nodes[0].seal_range(&to, &mut laid, h..h + b.len()).unwrap();
                laid[at].to_vec()
            } else if at_send {
                let mut sealed = Vec::new();
                assert!(l.nodes[0].seal_for(&to, &b, &mut sealed));
                sealed
            } else {
                b
            };
            let (k, iface) = l.ends[&to];
            l.queue.push_back((k, iface, l.cfgs[0].interfaces[0].listen, wire));
            l.run();
        }
        let answered = l.delivered[0].len() - before;
        let refused = l.drops(1, Drop::AuthBeyondWindow);
        if at_send {
            assert_eq!((answered, refused), (LATER + 1, 0));
        } else {
            assert_eq!((answered, refused), (LATER, 1));
        }
    }
}

/// `seal_range` refuses a datagram without room for the headers in front
/// or the tag behind (not counted: the caller lays it out), and one for an
/// endpoint with no SA (counted as `no_sa`), and leaves the buffer as it
/// was.
#[test]
fn sealing_a_range_refuses_no_room_and_an_unknown_neighbour() {
    let mut l = Line::new(2, "encrypt");
    l.poll();
    let to = l.cfgs[0].interfaces[0].neighbors[0].endpoint;
    let h = anode_node::core::SEAL_HEADROOM;
    let tag = anode_node::core::SEAL_OVERHEAD - h;
    let mut buf = vec![7u8; h + 40 + tag];
    assert!(l.nodes[0].seal_range(&to, &mut buf, h - 1..h + 39).is_none(), "no room in front");
    assert!(l.nodes[0].seal_range(&to, &mut buf, h + 1..h + 41).is_none(), "no room behind");
    assert_eq!(l.drops(0, Drop::NoSa), 0);
    let stranger: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    assert!(l.nodes[0].seal_range(&stranger, &mut buf, h..h + 40).is_none());
    assert_eq!(l.drops(0, Drop::NoSa), 1);
    assert!(buf.iter().all(|b| *b == 7), "untouched");
    let at = l.nodes[0].seal_range(&to, &mut buf, h..h + 40).unwrap();
    assert_eq!(at, 0..buf.len(), "the sealed datagram fills the room");
}
