//! Administrative domains through the sans-I/O core (SANE §4.7): a line
//! of four nodes with security on, in one process:
//!
//! ```text
//! n0 (outside) ── n1 (border) ── n2 (interior) ── n3 (interior)
//! ```
//!
//! A user's ticket packet for n3, sent to the border, is admitted there and
//! travels with its perimeter attachment through n2 to n3, which accepts it
//! and runs the SNAP packet inside. What must be refused is refused and
//! counted: a ticket packet for another node at an interior node, a domain
//! datagram at a node outside any domain, and (with n1 not a border) a
//! neighbour outside the domain sending into it past no border.
#![allow(clippy::unwrap_used)]

use anode_node::anep;
use anode_node::config::NodeConfig;
use anode_node::core::{Node, Outbox, recv_buffer_len};
use anode_node::counters::Drop;
use anode_node::secure::SecurityInit;
use anode_sec::ticket::Envelope;
use anode_sec::{DomainKey, Identity, Kdc, TicketHolder};
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};

const UDP: &str = include_str!("../../../examples/snap/udp.s");
const UNIX0: u64 = 1_800_000_000_000;
const SECRET: [u8; 32] = [7; 32];

fn addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, k as u8 + 1)
}
fn ep(k: usize, i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], (12_000 + 100 * k + i) as u16))
}
fn id(k: usize) -> Identity {
    Identity::from_seed(&[k as u8 + 60; 32])
}
fn operator() -> Identity {
    Identity::from_seed(&[88; 32])
}

/// Node k of a line of 4; nodes 1..=3 are the domain, n1 its border if `border`.
fn config(k: usize, border: bool) -> String {
    let n = 4;
    let mut s = format!("address = \"{}\"\n[security]\nkey = \"unused.key\"\n", addr(k));
    let mut i = 0;
    for j in [k.wrapping_sub(1), k + 1] {
        if j >= n {
            continue;
        }
        let back = usize::from(j < k);
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
    if k >= 1 {
        let members: Vec<String> = (1..n).map(|m| format!("\"{}\"", id(m).public())).collect();
        s += &format!(
            "[domain]\noperator = \"{}\"\nsecret = \"unused\"\nborder = {}\nmembers = [{}]\n",
            operator().public(),
            border && k == 1,
            members.join(", ")
        );
    }
    s
}

struct Line {
    nodes: Vec<Node>,
    cfgs: Vec<NodeConfig>,
    ends: HashMap<SocketAddr, (usize, usize)>,
    queue: VecDeque<(usize, usize, SocketAddr, Vec<u8>)>,
    delivered: Vec<Vec<(u16, Vec<u8>)>>,
    now: u64,
}

impl Line {
    fn new(border: bool) -> Line {
        let cfgs: Vec<NodeConfig> = (0..4).map(|k| NodeConfig::from_toml(&config(k, border)).unwrap()).collect();
        let mut nodes = Vec::new();
        for (k, cfg) in cfgs.iter().enumerate() {
            let init = SecurityInit { identity: id(k), unix_ms_at_zero: UNIX0 };
            let mut n = Node::with_security(cfg, None, Some(init), 0).unwrap();
            if cfg.domain.is_some() {
                n.enable_domain(cfg, DomainKey::new(operator().public(), &SECRET), UNIX0).unwrap();
            }
            n.register_port(7);
            nodes.push(n);
        }
        let mut ends = HashMap::new();
        for (k, c) in cfgs.iter().enumerate() {
            for (i, iface) in c.interfaces.iter().enumerate() {
                ends.insert(iface.listen, (k, i));
            }
        }
        let mut l = Line { nodes, cfgs, ends, queue: VecDeque::new(), delivered: vec![Vec::new(); 4], now: 0 };
        for _ in 0..3 {
            l.poll();
        }
        l
    }

    fn take(&mut self, k: usize, out: &Outbox, input: &[u8]) {
        for t in &out.transmits {
            let b = out.bytes(&t.data, input).to_vec();
            let (to, iface) = self.ends[&t.to];
            let from = self.cfgs[k].interfaces[t.iface].listen;
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

    fn drops(&self, k: usize, d: Drop) -> u64 {
        self.nodes[k].counters.dropped(d)
    }

    fn domain(&self, k: usize) -> serde_json::Value {
        self.nodes[k].kdc_json().unwrap()["node"].clone()
    }
}

/// An ANEP datagram of `type_id` around `payload`.
fn datagram(type_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; anep::HEADER_LEN];
    anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, type_id, payload.len());
    d.extend_from_slice(payload);
    d
}

/// The SNAP packet of examples/snap/udp.s for node `k` (delivers "hello"
/// to port 7 there).
fn snap_for(k: usize) -> Vec<u8> {
    let mut r = anode_snap::asm::assemble(UDP).unwrap();
    r.dst = addr(k);
    datagram(anep::TYPE_SNAP, &r.to_bytes().unwrap())
}

/// A user holding a ticket of the domain.
fn user_ticket() -> TicketHolder {
    let user = Identity::from_seed(&[99; 32]).public();
    let issuer = anode_cred::Issuer::from_secret(&operator().secret_seed()).unwrap();
    let cred = issuer.admin(anode_cred::PrincipalId(*user.as_bytes()), None).unwrap();
    let mut kdc = Kdc::new(DomainKey::new(operator().public(), &SECRET), Default::default(), 0).unwrap();
    let issued = kdc.issue(user, cred.to_bytes(), 60, 0, UNIX0 / 1000).unwrap();
    TicketHolder::from_issued(&issued).unwrap()
}

fn ticket_datagram(h: &mut TicketHolder, dest: usize) -> Vec<u8> {
    let p = h.seal(u32::from(addr(dest)), &snap_for(dest));
    let mut e = Vec::new();
    Envelope::Ticket(&p).emit(&mut e).unwrap();
    datagram(anep::TYPE_DOMAIN, &e)
}

#[test]
fn the_border_admits_and_the_attachment_travels_through_the_interior() {
    let mut l = Line::new(true);
    assert!(l.nodes[1].link_up(addr(2)) && l.nodes[2].link_up(addr(3)));
    let mut h = user_ticket();
    let user_ep = SocketAddr::from(([127, 0, 0, 1], 9999));
    // To the border, for n3, two hops inside the domain.
    l.arrive(1, 0, user_ep, &ticket_datagram(&mut h, 3));
    l.run();
    assert_eq!(l.delivered[3], vec![(7, b"hello".to_vec())], "n3 ran the SNAP packet");
    assert_eq!(l.domain(1)["attached"], 1);
    assert_eq!(l.domain(3)["by_attachment"], 1);
    assert_eq!(l.domain(2)["by_attachment"], 0, "n2 only passed it on");
    // Straight to n2, for n2: it verifies the ticket itself.
    l.arrive(2, 0, user_ep, &ticket_datagram(&mut h, 2));
    l.run();
    assert_eq!(l.delivered[2].len(), 1);
    assert_eq!(l.domain(2)["by_ticket"], 1);
    // A ticket packet for n3 at n2, which is not a border: refused.
    l.arrive(2, 0, user_ep, &ticket_datagram(&mut h, 3));
    l.run();
    assert_eq!(l.drops(2, Drop::DomainNotForMe), 1);
    assert_eq!(l.domain(2)["refused"]["not_for_me"], 1);
    // An attached envelope for n3 sent to n2 from outside any SA: not passed on.
    let mut e = Vec::new();
    Envelope::Attached { destination: u32::from(addr(3)), attachment: None, inner: &snap_for(3) }.emit(&mut e).unwrap();
    l.arrive(2, 0, user_ep, &datagram(anep::TYPE_DOMAIN, &e));
    l.run();
    assert_eq!(l.drops(2, Drop::DomainNotForMe), 2);
    assert_eq!(l.delivered[3].len(), 1);
    // A domain datagram at a node of no domain.
    l.arrive(0, 0, user_ep, &ticket_datagram(&mut h, 0));
    l.run();
    assert_eq!(l.drops(0, Drop::DomainOff), 1);
    // Garbage in an envelope.
    l.arrive(3, 0, user_ep, &datagram(anep::TYPE_DOMAIN, &[2, 9]));
    l.run();
    assert_eq!(l.drops(3, Drop::DomainMalformed), 1);
}

#[test]
fn an_interior_node_refuses_traffic_from_outside_that_passed_no_border() {
    // SNAP traffic crosses a border as best effort; with n1 interior, the
    // same packet from n0 (outside the domain) is refused at n1.
    for border in [true, false] {
        let mut l = Line::new(border);
        let mut out = Outbox::default();
        let now = l.now;
        l.nodes[0].inject_snap(&snap_for(3)[anep::HEADER_LEN..], now, &mut out);
        l.take(0, &out, &[]);
        l.run();
        let bypass = l.drops(1, Drop::DomainNoAttachment);
        assert_eq!((l.delivered[3].len(), bypass), if border { (1, 0) } else { (0, 1) }, "border {border}");
    }
}
