//! Ledger write cost per charged event, batched (one transaction per flush
//! of 10, 100 or 1000 charges), and the size of the database after 10^6
//! charged events (1000 flushes of 1000 charges: 100 principals × 10
//! sessions, each charging one kind per flush).
#![allow(clippy::unwrap_used)]

use anode_ledger::{Batch, Ledger, LedgerConfig, Query};
use anode_sched::{Charge, Owner, PrincipalId, ResourceKind, SessionId};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use std::path::PathBuf;
use std::time::Instant;

fn charges(n: usize, seq: u64) -> Vec<Charge> {
    (0..n)
        .map(|i| Charge {
            owner: Owner::Principal(PrincipalId([(i / 10) as u8; 32])),
            session: SessionId::from_raw(i as u64),
            kind: ResourceKind::ALL[(seq as usize + i) % ResourceKind::ALL.len()],
            amount: 1_000 + seq,
        })
        .collect()
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("anode-ledger-bench-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger_write");
    for per_batch in [10usize, 100, 1000] {
        let dir = scratch(&format!("w{per_batch}"));
        let mut l = Ledger::open(&dir.join("l.db"), LedgerConfig::default()).unwrap();
        let boot = l.begin_boot(0, "bench").unwrap();
        let mut seq = 0u64;
        g.throughput(Throughput::Elements(per_batch as u64));
        g.bench_function(BenchmarkId::new("batch", per_batch), |b| {
            b.iter_custom(|iters| {
                let batches: Vec<Batch> = (0..iters)
                    .map(|i| Batch {
                        boot,
                        seq: seq + i,
                        start_ms: (seq + i) * 1000,
                        end_ms: (seq + i + 1) * 1000,
                        charges: charges(per_batch, seq + i),
                        sessions: vec![],
                    })
                    .collect();
                seq += iters;
                let t = Instant::now();
                for b in &batches {
                    l.write(b).unwrap();
                }
                t.elapsed()
            })
        });
        drop(l);
        let _ = std::fs::remove_dir_all(&dir);
    }
    g.finish();
}

fn size_after_a_million() {
    let dir = scratch("size");
    let path = dir.join("l.db");
    let mut l = Ledger::open(&path, LedgerConfig::default()).unwrap();
    let boot = l.begin_boot(0, "bench").unwrap();
    let t = Instant::now();
    for seq in 0..1000u64 {
        let b = Batch {
            boot,
            seq,
            start_ms: seq * 1000,
            end_ms: (seq + 1) * 1000,
            charges: charges(1000, seq),
            sessions: vec![],
        };
        l.write(&b).unwrap();
    }
    let took = t.elapsed();
    l.checkpoint().unwrap();
    let rows = l.rows(&Query::default()).unwrap().len();
    let size = std::fs::metadata(&path).unwrap().len();
    let events = 1e6;
    println!(
        "ledger_size: 10^6 charged events in 1000 batches: {rows} rows, {:.1} MB ({:.1} bytes/event), written in {:.2} s ({:.2} µs/event)",
        size as f64 / 1e6,
        size as f64 / events,
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / events
    );
    drop(l);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, write_cost);

fn main() {
    benches();
    size_after_a_million();
    Criterion::default().configure_from_args().final_summary();
}
