//! A user reaching 10 nodes of an administrative domain (issue 18, SANE
//! §4.7), through the whole node path (`Node::handle_datagram_from`: ANEP,
//! the security layer, classification, the SNAP VM), in one process, with
//! every datagram counted on the wire:
//!
//! - **handshake per node**: a Noise XX handshake with each node, then one
//!   SNAP packet over each SA;
//! - **tickets**: an XX handshake with one node (the key distribution
//!   service), a ticket request and reply over that SA, then one
//!   ticket-authenticated SNAP packet (`DOMAIN`, the ticket on it) to each
//!   of the 10 nodes.
//!
//! "Reached" means the node ran the user's SNAP packet. Prints a table: the
//! mean wall time of `RUNS` runs (fresh nodes each run, built outside the
//! timing) and the bytes of every datagram between the user and the nodes.
//!
//! `cargo bench -p anode-node --bench domains` (or `scripts/bench-domains`).

use anode_node::anep;
use anode_node::config::NodeConfig;
use anode_node::core::{KDC_OP, Node, Outbox, recv_buffer_len};
use anode_node::secure::SecurityInit;
use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::ticket::{Envelope, KdcMessage};
use anode_sec::{DomainKey, Identity, Links, LinksConfig, Mode, Output, TicketHolder};
use std::net::SocketAddr;
use std::time::Instant;

const NODES: usize = 10;
const RUNS: usize = 20;
const SECRET: [u8; 32] = [0x3C; 32];
const UDP: &str = include_str!("../../../examples/snap/udp.s");

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
fn node_ep(k: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 20_000 + k as u16))
}
fn user_ep() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 29_999))
}
fn operator() -> Identity {
    Identity::from_seed(&[1; 32])
}
fn user() -> Identity {
    Identity::from_seed(&[9; 32])
}

/// Node k of the domain: one interface, the user allowed over XX, node 0
/// the key distribution service.
fn node(k: usize, unix0: u64) -> Node {
    let cfg = format!(
        "address = \"10.0.1.{}\"\n[[interface]]\nname = \"u\"\nlisten = \"{}\"\n\
         [security]\nkey = \"unused\"\nusers = [\"{}\"]\n\
         [domain]\noperator = \"{}\"\nsecret = \"unused\"\nkdc = {}\n",
        k + 1,
        node_ep(k),
        user().public(),
        operator().public(),
        k == 0
    );
    let cfg = NodeConfig::from_toml(&cfg).expect("config");
    let init = SecurityInit { identity: Identity::from_seed(&[k as u8 + 100; 32]), unix_ms_at_zero: unix0 };
    let mut n = Node::with_security(&cfg, None, Some(init), 0).expect("node");
    let key = || DomainKey::new(operator().public(), &SECRET);
    if k == 0 {
        let kdc = anode_sec::Kdc::new(key(), Default::default(), 0).expect("kdc");
        n.enable_kdc(kdc, unix0);
    }
    n.enable_domain(&cfg, key(), unix0).expect("domain");
    n.register_port(7);
    n
}

/// The SNAP packet (examples/snap/udp.s) for node k, as an ANEP datagram.
fn snap_for(k: usize) -> Vec<u8> {
    let mut r = anode_snap::asm::assemble(UDP).expect("udp.s");
    r.dst = std::net::Ipv4Addr::new(10, 0, 1, k as u8 + 1);
    anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, &r.to_bytes().expect("snap"))
}

/// The user and the nodes, datagrams passed by hand, bytes counted.
struct Net {
    nodes: Vec<Node>,
    user: Links,
    bytes: usize,
    datagrams: usize,
    /// Control answers the user received.
    answers: Vec<Vec<u8>>,
    buf: Vec<u8>,
    t0: Instant,
}

impl Net {
    fn new() -> Net {
        let unix0 = unix_ms();
        let nodes = (0..NODES).map(|k| node(k, unix0)).collect();
        let user =
            Links::new(user(), LinksConfig { unix_offset_ms: unix0, ..LinksConfig::default() }, 0).expect("links");
        Net { nodes, user, bytes: 0, datagrams: 0, answers: Vec::new(), buf: vec![0; 65_536], t0: Instant::now() }
    }
    fn now(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }
    /// A datagram from the user to node k, and everything that follows.
    fn send_node(&mut self, k: usize, d: &[u8]) {
        self.bytes += d.len();
        self.datagrams += 1;
        let mut buf = vec![0u8; recv_buffer_len(1400).max(d.len())];
        buf[..d.len()].copy_from_slice(d);
        let mut out = Outbox::default();
        let now = self.now();
        self.nodes[k].handle_datagram_from(0, Some(user_ep()), &mut buf, d.len(), now, &mut out);
        let back: Vec<Vec<u8>> = out.transmits.iter().map(|t| out.bytes(&t.data, &buf).to_vec()).collect();
        for b in back {
            self.send_user(k, &b);
        }
    }
    /// A datagram from node k to the user.
    fn send_user(&mut self, k: usize, d: &[u8]) {
        self.bytes += d.len();
        self.datagrams += 1;
        let n = d.len();
        self.buf[..n].copy_from_slice(d);
        let Ok(a) = anep::Packet::new_checked(&self.buf[..n]) else { return };
        let (t, ps) = (a.type_id(), a.payload_start());
        let now = self.now();
        let mut outs = Vec::new();
        match t {
            anep::TYPE_HANDSHAKE => {
                let _ = self.user.handle_handshake(node_ep(k), &self.buf[ps..n], now, &mut outs);
            }
            anep::TYPE_AUTH | anep::TYPE_ESP => {
                if let Ok(o) = self.user.open(&mut self.buf[..n], ps, t == anep::TYPE_ESP, now)
                    && let Ok(ia) = anep::Packet::new_checked(&self.buf[o.inner.clone()])
                    && ia.type_id() == anep::TYPE_CONTROL
                {
                    self.answers.push(ia.payload().to_vec());
                }
            }
            _ => {}
        }
        self.user_outputs(outs);
    }
    fn user_outputs(&mut self, outs: Vec<Output>) {
        for o in outs {
            if let Output::Handshake { to, msg, .. } = o {
                let k = (to.port() - 20_000) as usize;
                self.send_node(k, &anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg));
            }
        }
    }
    /// An XX handshake with node k, run to completion.
    fn handshake(&mut self, k: usize) -> usize {
        let peer = self.user.connect(node_ep(k), None, Mode::Encrypt, self.now());
        for _ in 0..20 {
            let mut outs = Vec::new();
            let now = self.now();
            self.user.poll(now, &mut outs);
            self.user_outputs(outs);
            if self.user.is_up(peer) {
                return peer;
            }
        }
        panic!("no SA with node {k}");
    }
    /// `inner` (an ANEP datagram) over the user's SA `peer` with node k.
    fn over_sa(&mut self, k: usize, peer: usize, inner: &[u8]) {
        let mut d = vec![0u8; anep::HEADER_LEN + OVERHEAD + inner.len()];
        d[anep::HEADER_LEN + AH_LEN..anep::HEADER_LEN + AH_LEN + inner.len()].copy_from_slice(inner);
        anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_ESP, AH_LEN + inner.len() + 16);
        let now = self.now();
        let len = self.user.seal(peer, &mut d, anep::HEADER_LEN, inner.len(), now).expect("seal");
        self.send_node(k, &d[..len]);
    }
    fn reached(&self) -> usize {
        self.nodes.iter().filter(|n| n.counters.rx_snap >= 1).count()
    }
}

/// A handshake with every node, then a SNAP packet over each SA.
fn per_node() -> (f64, usize, usize) {
    let mut net = Net::new();
    let t = Instant::now();
    for k in 0..NODES {
        let peer = net.handshake(k);
        net.over_sa(k, peer, &snap_for(k));
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(net.reached(), NODES, "every node ran the packet");
    (secs, net.bytes, net.datagrams)
}

/// One handshake with the service, a ticket, then a ticket packet to each node.
fn tickets() -> (f64, usize, usize) {
    let mut net = Net::new();
    let issuer = anode_cred::Issuer::from_secret(&operator().secret_seed()).expect("issuer");
    let cred = issuer.admin(anode_cred::PrincipalId(*user().public().as_bytes()), None).expect("credential");
    let t = Instant::now();
    let peer = net.handshake(0);
    let req = KdcMessage::Request { lifetime_s: 300, credential: cred.to_bytes() }.to_vec();
    let body = [&[KDC_OP][..], &req].concat();
    net.over_sa(0, peer, &anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_CONTROL, &body));
    let answer = net.answers.pop().expect("a ticket reply");
    let mut h = TicketHolder::from_reply(answer.get(1..).unwrap_or(&[])).expect("a ticket");
    for k in 0..NODES {
        let p = h.seal(u32::from(std::net::Ipv4Addr::new(10, 0, 1, k as u8 + 1)), &snap_for(k));
        let mut e = Vec::new();
        Envelope::Ticket(&p).emit(&mut e).expect("envelope");
        net.send_node(k, &anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_DOMAIN, &e));
    }
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(net.reached(), NODES, "every node ran the packet");
    let hs: Vec<u64> = net.nodes.iter().map(|n| n.counters.handshakes_rx).collect();
    assert!(hs[0] > 0 && hs[1..].iter().all(|&h| h == 0), "a handshake with the service only: {hs:?}");
    (secs, net.bytes, net.datagrams)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs one round.
    let runs = if std::env::args().any(|a| a == "--bench") { RUNS } else { 1 };
    let mean = |f: fn() -> (f64, usize, usize)| {
        let mut t = 0.0;
        let mut last = (0, 0);
        for _ in 0..runs {
            let (s, b, d) = f();
            t += s;
            last = (b, d);
        }
        (t / runs as f64, last.0, last.1)
    };
    let (t_hs, b_hs, d_hs) = mean(per_node);
    let (t_tk, b_tk, d_tk) = mean(tickets);
    println!("A user reaching {NODES} nodes of a domain (mean of {runs} runs, whole node path, in one process)");
    println!("| | time | bytes on the wire | datagrams |");
    println!("|---|---:|---:|---:|");
    println!(
        "| an XX handshake with every node, then a SNAP packet over each SA | {:.2} ms | {b_hs} | {d_hs} |",
        t_hs * 1e3
    );
    println!(
        "| tickets: 1 XX with the service, 1 ticket, a ticket packet (ticket on it) to each node | {:.2} ms | {b_tk} | {d_tk} |",
        t_tk * 1e3
    );
    println!("ratio (handshakes / tickets): time {:.1}x, bytes {:.2}x", t_hs / t_tk, b_hs as f64 / b_tk as f64);
}
