//! Link transmit scheduler cost per packet: one `enqueue` plus one `poll`,
//! on a 100 Mbit/s link with 3 and 64 backlogged clients (half of them
//! guaranteed, guarantees summing to 90 % of the link, 6 ms periods, the
//! rest best effort), 1,456-byte packets, on a virtual clock that advances
//! by each packet's link time. And `send_burst`: a burst of 32 packets of
//! 100 or 1,456 bytes from one best-effort client on a link far faster than
//! it (40 Gbit/s, as the forwarding bench's paced node), all of which go at
//! once (criterion's time is per burst, its throughput per packet).
#![allow(clippy::unwrap_used)]

use anode_sched::tx::{Guarantee, LinkSched, TxConfig};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

const MS: u64 = 1_000_000;
const LEN: u32 = 1456;

fn link(n: u32) -> LinkSched<u32, ()> {
    let mut l = LinkSched::new(TxConfig::new(100_000_000)).unwrap();
    let guaranteed = n.div_ceil(2);
    for k in 0..guaranteed {
        let slice = 6 * MS * 9 / 10 / u64::from(guaranteed);
        l.set_guarantee(k, Some(Guarantee { slice_ns: slice, period_ns: 6 * MS }), 0).unwrap();
    }
    for k in 0..n {
        for _ in 0..8 {
            l.enqueue(k, LEN, (), 0).unwrap();
        }
    }
    l
}

fn per_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx_link");
    for n in [3u32, 64] {
        let mut l = link(n);
        let step = l.link_ns(LEN);
        let mut now = 0u64;
        g.bench_function(BenchmarkId::new("enqueue_poll", n), |b| {
            b.iter(|| {
                now += step;
                let r = l.poll(now).unwrap();
                // The sender of the packet that left queues another: every
                // client stays backlogged.
                l.enqueue(r.key, LEN, (), now).unwrap();
                black_box(r.start_ns)
            })
        });
    }
    g.finish();
}

fn burst(c: &mut Criterion) {
    let mut g = c.benchmark_group("tx_burst_32");
    for len in [100u32, LEN] {
        let mut l: LinkSched<u32, ()> = LinkSched::new(TxConfig::new(40_000_000_000)).unwrap();
        let lens = [len; 32];
        let step = 32 * l.link_ns(len);
        // Each burst arrived one burst's link time before it is handed
        // over (as a receive batch before the core is done with it), so
        // the whole burst goes.
        let mut now = MS;
        assert_eq!(l.send_burst(7, &lens, now - step, now, |_| ()), Some(32));
        g.throughput(criterion::Throughput::Elements(32));
        g.bench_function(BenchmarkId::new("send_burst", len), |b| {
            b.iter(|| {
                now += step;
                let m = l.send_burst(7, black_box(&lens), now - step, now, |_| ());
                debug_assert_eq!(m, Some(32));
                black_box(m)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, per_packet, burst);
criterion_main!(benches);
