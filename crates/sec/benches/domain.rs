//! Administrative domains (issue 18): ticket issue and verify, perimeter
//! admission and interior checks, and, measured in the same run, the Noise
//! handshakes they replace. Ends by printing the time and bytes for a user
//! to reach 10 nodes of a domain: one XX handshake with the key
//! distribution service plus a ticket carried on the first packet to each
//! node, against an XX handshake with every node.
//!
//! `cargo bench -p anode-sec --bench domain -- --warm-up-time 1 --measurement-time 3`

use anode_cred::{InterfaceSet, Issuer, PrincipalId, RequestedLimits};
use anode_sec::domain::{DomainKey, DomainNode, Kdc, KdcConfig, TicketHolder};
use anode_sec::links::Output;
use anode_sec::sa::Mode;
use anode_sec::ticket::KdcMessage;
use anode_sec::{Identity, Links, LinksConfig};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const NOW: u64 = 1_800_000_000;
const NODES: u32 = 10;

fn ep(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn operator() -> Identity {
    Identity::from_seed(&[1; 32])
}

fn user() -> Identity {
    Identity::from_seed(&[9; 32])
}

fn domain() -> DomainKey {
    DomainKey::new(operator().public(), &[0xA; 32])
}

fn credential() -> Vec<u8> {
    let issuer = Issuer::from_secret(&operator().secret_seed()).unwrap_or_else(|e| panic!("{e}"));
    let c = issuer.admin(PrincipalId(*user().public().as_bytes()), None).unwrap_or_else(|e| panic!("{e}"));
    c.to_bytes().to_vec()
}

fn kdc() -> Kdc {
    let cfg = KdcConfig {
        per_user_per_sec: 1_000_000,
        per_user_burst: 1_000_000,
        global_per_sec: 1_000_000,
        global_burst: 1_000_000,
        ..KdcConfig::default()
    };
    Kdc::new(domain(), cfg, 0).unwrap_or_else(|e| panic!("{e}"))
}

fn node(n: u8) -> DomainNode {
    DomainNode::new(domain(), 1, Identity::from_seed(&[n; 32]).public(), u32::from(n)).unwrap_or_else(|e| panic!("{e}"))
}

fn msg(out: &mut Vec<Output>) -> Vec<u8> {
    let m = out.iter().find_map(|o| match o {
        Output::Handshake { msg, .. } => Some(msg.clone()),
        _ => None,
    });
    out.clear();
    m.unwrap_or_else(|| panic!("no handshake message"))
}

/// One XX handshake between the user and a node; returns the bytes of its three messages.
fn xx() -> usize {
    let mut u = Links::new(user(), LinksConfig::default(), 0).unwrap_or_else(|e| panic!("{e}"));
    let cfg = LinksConfig { users: vec![user().public()], ..LinksConfig::default() };
    let mut n = Links::new(Identity::from_seed(&[2; 32]), cfg, 0).unwrap_or_else(|e| panic!("{e}"));
    u.connect(ep(7002), None, Mode::Encrypt, 0);
    let mut out = Vec::new();
    u.poll(1, &mut out);
    let m1 = msg(&mut out);
    n.handle_handshake(ep(9000), &m1, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let m2 = msg(&mut out);
    u.handle_handshake(ep(7002), &m2, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let m3 = msg(&mut out);
    n.handle_handshake(ep(9000), &m3, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
    m1.len() + m2.len() + m3.len()
}

fn benches(c: &mut Criterion) {
    let cred = credential();
    let mut k = kdc();
    c.bench_function("ticket issue (credential verify + attenuate + seal)", |b| {
        b.iter(|| black_box(k.issue(user().public(), &cred, 300, 0, NOW).unwrap_or_else(|e| panic!("{e}"))))
    });
    let issued = k.issue(user().public(), &cred, 300, 0, NOW).unwrap_or_else(|e| panic!("{e}"));
    c.bench_function("ticket packet, first to a node (open ticket + packet)", |b| {
        b.iter_batched(
            || {
                let mut h = TicketHolder::from_issued(&issued).unwrap_or_else(|| panic!());
                (node(5), h.seal(5, &[0u8; 100]))
            },
            |(mut n, p)| black_box(n.open_packet(&p, NOW).unwrap_or_else(|e| panic!("{e}"))),
            BatchSize::SmallInput,
        )
    });
    let mut h = TicketHolder::from_issued(&issued).unwrap_or_else(|| panic!());
    let mut n5 = node(5);
    let first = h.seal(5, &[0u8; 100]);
    let _ = n5.open_packet(&first, NOW);
    c.bench_function("ticket packet, later (ticket held, 100 B)", |b| {
        b.iter_batched(|| h.seal(5, &[0u8; 100]), |p| black_box(n5.open_packet(&p, NOW).is_ok()), BatchSize::SmallInput)
    });
    let mut border = node(3);
    let mut interior = node(4);
    c.bench_function("perimeter: admit at the border + accept in the interior", |b| {
        b.iter_batched(
            || h.seal(4, &[0u8; 100]),
            |p| {
                let (a, att) = border.admit(&p, &Default::default(), NOW).unwrap_or_else(|e| panic!("{e}"));
                black_box(interior.accept_attached(Some(&att), &a.payload, NOW).is_ok())
            },
            BatchSize::SmallInput,
        )
    });
    let p = h.seal(4, &[0u8; 100]);
    let (a, att) = border.admit(&p, &Default::default(), NOW).unwrap_or_else(|e| panic!("{e}"));
    let accepted = interior.accept_attached(Some(&att), &a.payload, NOW).unwrap_or_else(|e| panic!("{e}"));
    let code = anode_cred::CodeInfo { hash: anode_cred::ModuleHash::of(b"code"), signed: None };
    let mut t = NOW;
    c.bench_function("interior: authorize with the attached credential (uncached)", |b| {
        b.iter(|| {
            t += 2; // past the decision cache's 1 s
            black_box(interior.authorize(&accepted, &code, InterfaceSet::EMPTY, RequestedLimits::default(), t).is_ok())
        })
    });
    c.bench_function("handshake XX (user + node, three messages)", |b| b.iter(|| black_box(xx())));
    ten_nodes(&cred);
}

fn mean(n: u32, mut f: impl FnMut()) -> Duration {
    f();
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n
}

/// Time and bytes for a user to get 10 nodes to accept its packets.
fn ten_nodes(cred: &[u8]) {
    let runs = 50;
    let xx_bytes = xx();
    let t_xx = mean(runs, || {
        black_box(xx());
    });
    let mut k = kdc();
    let req = KdcMessage::Request { lifetime_s: 300, credential: cred }.to_vec();
    let reply = k.handle_request(user().public(), &req, 0, NOW);
    let mut h0 = TicketHolder::from_reply(&reply).unwrap_or_else(|e| panic!("{e}"));
    let first_packet_overhead = h0.seal(1, &[]).len();
    let t_tickets = mean(runs, || {
        black_box(xx());
        let reply = k.handle_request(user().public(), &req, 0, NOW);
        let mut h = TicketHolder::from_reply(&reply).unwrap_or_else(|e| panic!("{e}"));
        for n in 0..NODES {
            let mut d = node(n as u8 + 10);
            let p = h.seal(u32::from(n as u8 + 10), &[]);
            black_box(d.open_packet(&p, NOW).unwrap_or_else(|e| panic!("{e}")));
        }
    });
    let later_overhead = {
        let mut h = TicketHolder::from_reply(&reply).unwrap_or_else(|e| panic!("{e}"));
        let _ = h.seal(1, &[]);
        h.seal(1, &[]).len()
    };
    let ticket_bytes = xx_bytes + req.len() + reply.len() + NODES as usize * first_packet_overhead;
    println!();
    println!("== a user reaching {NODES} nodes of a domain (mean of {runs} runs, this machine)");
    println!(
        "handshake per node: {NODES} x XX = {:.2} ms, {} bytes of handshake ({} per node)",
        (t_xx * NODES).as_secs_f64() * 1e3,
        xx_bytes * NODES as usize,
        xx_bytes
    );
    println!(
        "tickets:            1 XX + 1 ticket + {NODES} first packets = {:.2} ms, {} bytes \
         (XX {xx_bytes}, request {}, reply {}, ticket on each first packet {first_packet_overhead}); \
         later packets carry {later_overhead} bytes of header and tag",
        t_tickets.as_secs_f64() * 1e3,
        ticket_bytes,
        req.len(),
        reply.len()
    );
    println!("(SANE's key establishment took 2.4 s per node on its 1999 hardware)");
}

criterion_group!(domain_benches, benches);
criterion_main!(domain_benches);
