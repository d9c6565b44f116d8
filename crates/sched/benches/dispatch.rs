//! Scheduler decision cost per dispatch: one `pick` plus one `charge`, with
//! 4, 64 and 1024 CPU-bound VPs (all runnable, guarantees summing to 90 %
//! of the CPU, periods 1-20 ms) and one VP with extra time taking the slack.
//! Each dispatch runs for its budget or 50 µs, whichever is less, on a
//! virtual clock.
#![allow(clippy::unwrap_used)]

use anode_sched::{SchedConfig, Scheduler, SessionId, VpParams};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

const MS: u64 = 1_000_000;

fn scheduler(n: u64) -> Scheduler {
    let mut s = Scheduler::new(SchedConfig { period_log_capacity: 0, ..SchedConfig::default() });
    let owner = SessionId::from_raw(1 << 32);
    for i in 0..n {
        let period = (1 + i % 20) * MS;
        let slice = (period * 9 / 10 / n).max(1);
        let v = s.add_vp(owner, VpParams { slice_ns: slice, period_ns: period, extra: false }, 0).unwrap();
        s.set_runnable(v, true, 0).unwrap();
    }
    let be = s.add_vp(owner, VpParams { slice_ns: MS / 100, period_ns: 10 * MS, extra: true }, 0).unwrap();
    s.set_runnable(be, true, 0).unwrap();
    s
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched_dispatch");
    for n in [4u64, 64, 1024] {
        let mut s = scheduler(n);
        let mut now = 0u64;
        // Warm up past the first periods so every VP is in steady state.
        for _ in 0..10_000 {
            let d = s.pick(now).unwrap();
            now += d.budget_ns.min(50_000);
            s.charge(&d, d.budget_ns.min(50_000), now).unwrap();
        }
        g.bench_function(BenchmarkId::new("pick_charge", n), |b| {
            b.iter(|| {
                let d = s.pick(black_box(now)).unwrap();
                let used = d.budget_ns.min(50_000);
                now += used;
                black_box(s.charge(&d, used, now).unwrap());
            })
        });
    }
    g.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
