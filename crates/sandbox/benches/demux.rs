//! Cost of early demultiplexing per packet (issue 15, RCANE §IV-D): the
//! demux table's lookup of a packet's channel plus taking room in its FIFO
//! (and giving it back, as its job would), with 1, 10 and 1,000 channels
//! open. Two layouts: the other channels on other ports (other sessions'
//! services: the goal is a flat cost), and all on the packet's port with
//! other source prefixes (a linear scan of that port's routes). A third
//! case, one channel keyed on the source and 4 payload bytes, adds the
//! sub-flow hash and the per-sub-flow share of the FIFO.
//!
//! `cargo bench -p anode-sandbox --bench demux`; figures in docs/benchmarks.md.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::net::Ipv4Addr;

use anode_sandbox::ModuleId;
use anode_sandbox::demux::{DemuxSpec, DemuxTable, Route, SourcePrefix, SubKey};
use criterion::{Criterion, criterion_group, criterion_main};

const PORT: u16 = 5000;

fn table(n: u32, same_port: bool) -> DemuxTable {
    table_keyed(n, same_port, vec![])
}

fn table_keyed(n: u32, same_port: bool, keys: Vec<SubKey>) -> DemuxTable {
    let mut t = DemuxTable::new();
    for i in 0..n {
        let mut spec = DemuxSpec::port_prefix(if same_port { PORT } else { PORT + 1 + i as u16 }, vec![]).unwrap();
        if same_port {
            // 10.1.x.y/32: not the packet's source.
            spec.source = Some(SourcePrefix::new(Ipv4Addr::from(0x0a01_0000 + i), 32).unwrap());
        }
        t.insert(Route::new(spec, ModuleId(i + 2), 1, 0));
    }
    // The packet's channel: from 10.0.0.0/24, payload prefix "RX".
    let mut spec = DemuxSpec::port_prefix(PORT, b"RX".to_vec()).unwrap();
    spec.source = Some(SourcePrefix::new(Ipv4Addr::new(10, 0, 0, 0), 24).unwrap());
    spec.keys = keys;
    t.insert(Route::new(spec, ModuleId(1), 1, 0));
    t
}

fn bench(c: &mut Criterion) {
    let src = Ipv4Addr::new(10, 0, 0, 7);
    let payload = [b'R', b'X', 0, 0, 0, 0, 0, 0];
    let mut g = c.benchmark_group("demux");
    let keyed = vec![SubKey::Source, SubKey::Payload { offset: 2, len: 4 }];
    let cases = [false, true]
        .into_iter()
        .flat_map(|same_port| {
            [0u32, 9, 999].into_iter().map(move |others| {
                let name = format!("{}_channels_{}", others + 1, if same_port { "same_port" } else { "other_ports" });
                (name, table(others, same_port))
            })
        })
        .chain([("1_channel_keyed".to_string(), table_keyed(0, false, keyed))]);
    for (name, t) in cases {
        g.bench_function(&name, |b| {
            b.iter(|| {
                let mut n = 0;
                for r in t.lookup(PORT, black_box(src), black_box(&payload)) {
                    if let Ok(held) = r.admit(src, &payload) {
                        n += 1;
                        drop(black_box(held));
                    }
                }
                assert_eq!(n, 1);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
