//! Micro-benchmarks of the security layer (issue 6): a whole Noise IK and
//! XX handshake between two in-memory layers, seal and open of one packet
//! (authenticate-only and encrypted, 100 and 1,400 bytes), and the replay
//! window check + commit.
//!
//! `cargo bench -p anode-sec --bench sec -- --warm-up-time 1 --measurement-time 3`

use anode_sec::links::Output;
use anode_sec::replay::ReplayWindow;
use anode_sec::sa::{AH_LEN, Lifetime, Mode, OVERHEAD, Sa};
use anode_sec::{Identity, Links, LinksConfig, PeerConfig};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::net::SocketAddr;

fn ep(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn layer(me: u8, peer: Option<(u8, u16)>, users: Vec<anode_sec::PublicKey>) -> Links {
    let peers = peer
        .map(|(k, p)| {
            vec![PeerConfig { key: Identity::from_seed(&[k; 32]).public(), endpoint: ep(p), mode: Mode::Authenticate }]
        })
        .unwrap_or_default();
    let cfg = LinksConfig { peers, users, unix_offset_ms: 1_800_000_000_000, ..LinksConfig::default() };
    Links::new(Identity::from_seed(&[me; 32]), cfg, 0).unwrap_or_else(|e| panic!("{e}"))
}

fn msg(out: &mut Vec<Output>) -> Vec<u8> {
    let m = out.iter().find_map(|o| match o {
        Output::Handshake { msg, .. } => Some(msg.clone()),
        _ => None,
    });
    out.clear();
    m.unwrap_or_else(|| panic!("no handshake message"))
}

fn handshakes(c: &mut Criterion) {
    // Fresh layers per iteration (setup not timed); the timestamps advance
    // so the responder never sees a replay.
    let mut t = 1_000u64;
    c.bench_function("handshake IK (initiator + responder, both messages)", |b| {
        b.iter_batched(
            || (layer(1, Some((2, 7002)), vec![]), layer(2, Some((1, 7001)), vec![])),
            |(mut i, mut r)| {
                t += 1;
                let mut out = Vec::new();
                i.poll(t, &mut out);
                let m1 = msg(&mut out);
                r.handle_handshake(ep(7001), &m1, t, &mut out).unwrap_or_else(|e| panic!("{e}"));
                let m2 = msg(&mut out);
                i.handle_handshake(ep(7002), &m2, t, &mut out).unwrap_or_else(|e| panic!("{e}"));
                assert!(i.is_up(0));
                (i, r)
            },
            BatchSize::SmallInput,
        )
    });
    let user = Identity::from_seed(&[7; 32]);
    c.bench_function("handshake XX (user + node, three messages)", |b| {
        b.iter_batched(
            || {
                let mut u = layer(7, None, vec![]);
                u.connect(ep(7002), None, Mode::Authenticate, 0);
                (u, layer(2, None, vec![user.public()]))
            },
            |(mut u, mut n)| {
                let mut out = Vec::new();
                u.poll(1, &mut out);
                let m1 = msg(&mut out);
                n.handle_handshake(ep(9000), &m1, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
                let m2 = msg(&mut out);
                u.handle_handshake(ep(7002), &m2, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
                let m3 = msg(&mut out);
                n.handle_handshake(ep(9000), &m3, 1, &mut out).unwrap_or_else(|e| panic!("{e}"));
                (u, n)
            },
            BatchSize::SmallInput,
        )
    });
}

fn packets(c: &mut Criterion) {
    let life = Lifetime::default();
    for size in [100usize, 1400] {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut a = Sa::new(0, 1, 2, [1; 32], [2; 32], true, 0, &life, "IK").unwrap_or_else(|| panic!());
            let mut bsa = Sa::new(0, 2, 1, [2; 32], [1; 32], false, 0, &life, "IK").unwrap_or_else(|| panic!());
            let n = size - 8;
            let mut buf = vec![0x5au8; 8 + OVERHEAD + n];
            c.bench_function(&format!("seal {size} B {}", mode.name()), |b| {
                b.iter(|| black_box(a.seal(black_box(&mut buf), 8, n, mode)))
            });
            // Open needs a fresh counter each time: seal a batch, open it.
            let mut batch: Vec<Vec<u8>> = Vec::new();
            c.bench_function(&format!("open {size} B {}", mode.name()), |b| {
                b.iter_batched(
                    || {
                        batch.clear();
                        let mut d = vec![0x5au8; 8 + OVERHEAD + n];
                        d[8 + AH_LEN..8 + AH_LEN + n].fill(7);
                        let _ = a.seal(&mut d, 8, n, mode);
                        d
                    },
                    |mut d| {
                        let r = bsa.open(&mut d, 8, mode, 1);
                        assert!(r.is_ok());
                        d
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    let mut w = ReplayWindow::new();
    let mut ctr = 0u64;
    c.bench_function("replay window check + commit (in order)", |b| {
        b.iter(|| {
            ctr += 1;
            let ok = w.check(black_box(ctr)).is_ok();
            if ok {
                w.commit(ctr);
            }
            ok
        })
    });
}

criterion_group!(benches, handshakes, packets);
criterion_main!(benches);
