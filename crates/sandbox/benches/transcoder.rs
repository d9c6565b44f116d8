//! Expert Table 3 inside one process: the CPU time per source frame of the
//! tiered transcoder, path-based (receive path, cache and AES pods, one path
//! module per gold and silver stream, one bronze path) against all-in-one
//! (one module), for 1 gold + 1 bronze + k silver streams.
//!
//! No daemon, no sockets and no scheduler: each variant's modules are
//! invoked back to back on this thread, so the difference is what isolation
//! costs (separate instances and memories, pod calls, one invocation per
//! stream) without the node's jobs, dispatch and I/O, which
//! `anode experiment transcoder` adds (docs/transcoder.md).
//!
//! The variants run in alternating blocks of frames on the same stream; the
//! figure is the median over blocks of the time per frame. Wall clock on
//! one thread; run it on a quiet machine.
//!
//! `cargo bench -p anode-sandbox --bench transcoder` (after `scripts/setup`,
//! which builds the modules). `TC_SILVER=1,5,11` picks the silver counts,
//! `TC_BLOCKS=N` the number of blocks per variant (each of 16 frames),
//! `TC_THRASH=MiB` writes that many MiB before every frame of either
//! variant (untimed), so that each frame starts with cold caches, as on a
//! node that sleeps between frames while other processes run.
#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
#[allow(missing_docs)]
mod common;

use std::time::Instant;

use anode_sandbox::{Action, ModuleId, Sandbox};
use common::now;
use common::tc::{codec_sandbox, load, load_pod, packet, setup_bytes, source};

const GOLD: u8 = 0;
const SILVER: u8 = 1;
const BRONZE: u8 = 2;
/// Frames per block.
const BLOCK: usize = 16;
/// Source frames (the stream repeats them with rising sequence numbers).
const SOURCE: usize = 48;

fn run(sb: &mut Sandbox, m: ModuleId, entry: &str, input: &[u8], out: &mut Vec<Action>) -> i32 {
    out.clear();
    sb.invoke(now(1), m, entry, input, out).unwrap()
}

/// The streams: gold, bronze, then `silver` silver streams.
fn streams(silver: usize) -> Vec<(u8, u16, Option<[u8; 16]>)> {
    let mut s = vec![(GOLD, 6000u16, Some([1; 16])), (BRONZE, 6001, None)];
    s.extend((0..silver).map(|i| (SILVER, 6002 + i as u16, Some([2 + i as u8; 16]))));
    s
}

/// The path-based variant, set up.
struct Paths {
    sb: Sandbox,
    rx: ModuleId,
    paths: Vec<(u8, ModuleId)>,
}

impl Paths {
    fn new(silver: usize) -> Paths {
        let mut sb = codec_sandbox();
        for tier in ["gold", "silver", "bronze"] {
            load_pod(&mut sb, "tc-cache", tier, None);
        }
        load_pod(&mut sb, "tc-aes", "aes", None);
        let rx = load(&mut sb, "tc-rx", "rx");
        let mut out = Vec::new();
        let paths = streams(silver)
            .into_iter()
            .map(|(tier, port, key)| {
                let p = load(&mut sb, "tc-path", &format!("p{port}"));
                assert_eq!(run(&mut sb, p, "setup", &setup_bytes(tier, port, key), &mut out), 1);
                (tier, p)
            })
            .collect();
        Paths { sb, rx, paths }
    }

    /// One frame; adds the time of the receive path and of each tier's
    /// paths to `t` (rx, gold, bronze, silver).
    fn frame(&mut self, seq: u32, f: &[u8], out: &mut Vec<Action>, t: &mut [f64; 4]) {
        let s = Instant::now();
        assert_eq!(run(&mut self.sb, self.rx, "frame", &packet(seq, f), out), 0);
        t[0] += s.elapsed().as_secs_f64();
        for &(tier, p) in &self.paths {
            let s = Instant::now();
            assert_eq!(run(&mut self.sb, p, "frame", &seq.to_be_bytes(), out), 1);
            let i = match tier {
                GOLD => 1,
                BRONZE => 2,
                _ => 3,
            };
            t[i] += s.elapsed().as_secs_f64();
        }
    }
}

/// The all-in-one variant, set up.
struct All {
    sb: Sandbox,
    all: ModuleId,
    n: usize,
}

impl All {
    fn new(silver: usize) -> All {
        let mut sb = codec_sandbox();
        let all = load(&mut sb, "tc-all", "all");
        let mut out = Vec::new();
        let s = streams(silver);
        for &(tier, port, key) in &s {
            assert!(run(&mut sb, all, "client", &setup_bytes(tier, port, key), &mut out) >= 1);
        }
        All { sb, all, n: s.len() }
    }

    fn frame(&mut self, seq: u32, f: &[u8], out: &mut Vec<Action>) {
        assert_eq!(run(&mut self.sb, self.all, "frame", &packet(seq, f), out) as usize, self.n);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench binaries with no `--bench`: nothing to do then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let silver: Vec<usize> = std::env::var("TC_SILVER")
        .unwrap_or_else(|_| "1,5,11".into())
        .split(',')
        .map(|s| s.trim().parse().expect("TC_SILVER: numbers"))
        .collect();
    let blocks: usize = std::env::var("TC_BLOCKS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    let frames = source(SOURCE);
    let thrash_mib: usize = std::env::var("TC_THRASH").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut thrash = vec![0u8; thrash_mib << 20];
    let mut pass = 0u8;
    let mut cool = |t: &mut Vec<u8>| {
        pass = pass.wrapping_add(1);
        for line in t.chunks_mut(64) {
            line[0] = pass;
        }
        std::hint::black_box(&t);
    };
    let mut out = Vec::new();
    println!(
        "silver | path-based us/frame | all-in-one us/frame | path / all | rx | gold path | bronze path | per silver path"
    );
    let mut per_all = Vec::new();
    for &k in &silver {
        let mut p = Paths::new(k);
        let mut a = All::new(k);
        let (mut pt, mut at, mut parts) = (Vec::new(), Vec::new(), Vec::new());
        let mut seq = 0u32;
        // Two warm-up blocks each (the first frames build decoders, encoders and tables).
        for b in 0..blocks + 2 {
            let mut t = [0f64; 4];
            let (mut pe, mut ae) = (0.0, 0.0);
            for i in 0..BLOCK {
                cool(&mut thrash);
                let s = Instant::now();
                p.frame(seq + i as u32, &frames[(seq as usize + i) % SOURCE], &mut out, &mut t);
                pe += s.elapsed().as_secs_f64() / BLOCK as f64;
            }
            for i in 0..BLOCK {
                cool(&mut thrash);
                let s = Instant::now();
                a.frame(seq + i as u32, &frames[(seq as usize + i) % SOURCE], &mut out);
                ae += s.elapsed().as_secs_f64() / BLOCK as f64;
            }
            seq += BLOCK as u32;
            if b >= 2 {
                pt.push(pe);
                at.push(ae);
                parts.push(t.map(|x| x / BLOCK as f64));
            }
        }
        let ratios: Vec<f64> = pt.iter().zip(&at).map(|(p, a)| p / a).collect();
        let mut r = ratios.clone();
        let (pm, am, rm) = (median(&mut pt), median(&mut at), median(&mut r));
        let part = |i: usize| {
            let mut v: Vec<f64> = parts.iter().map(|t| t[i]).collect();
            median(&mut v)
        };
        per_all.push((k, am));
        println!(
            "{k} | {:.1} | {:.1} | {rm:.3} (blocks {:.3}-{:.3}) | {:.1} | {:.1} | {:.1} | {:.1}",
            pm * 1e6,
            am * 1e6,
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
            part(0) * 1e6,
            part(1) * 1e6,
            part(2) * 1e6,
            part(3) * 1e6 / k as f64,
        );
    }
    if per_all.len() >= 2 {
        let (k0, a0) = per_all[0];
        let (k1, a1) = per_all[per_all.len() - 1];
        println!("all-in-one, marginal per silver client: {:.1} us", (a1 - a0) / (k1 - k0) as f64 * 1e6);
    }
}
