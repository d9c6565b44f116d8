//! FLAME Table 5 and §3.5 on anode: the cost per packet of each application
//! natively and as a sandboxed module under its policy, on the same real
//! trace in one run; and the replay rate with 1, 4 and 20 modules.
//!
//! Trace: `$ANODE_MONITOR_TRACE`, else the large capture `scripts/mktraces
//! --large N` writes (`$CARGO_TARGET_DIR/traces/large.pcap`), else
//! `tests/traces/rtt-client-side.pcap` joined with `codered.pcap`. Frames
//! are read into memory first: the benchmark measures the monitor, not the
//! disk. Modules come from `modules/out` (scripts/setup).
#![allow(clippy::unwrap_used)]

use std::io::Cursor;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anode_cred::{Issuer, PrincipalId};
use anode_monitor::apps::abi::Field;
use anode_monitor::apps::{App, codered::CodeRed, hurst::Hurst, rtt::Rtt, trajectory::Trajectory};
use anode_monitor::policy::{self, ExportRights, MonitorSpec, PAYLOAD_ALL, PolicyLimits, Prefix};
use anode_monitor::{CaptureReader, CryptoPan, Frame, LinkType, Monitor, MonitorConfig};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

struct Owned {
    ts: u64,
    wire: u32,
    link: LinkType,
    data: Vec<u8>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load_trace() -> (String, Vec<Owned>) {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    let candidates: Vec<PathBuf> = match std::env::var_os("ANODE_MONITOR_TRACE") {
        Some(p) => vec![PathBuf::from(p)],
        None => {
            let large = target.join("traces/large.pcap");
            if large.exists() {
                vec![large]
            } else {
                vec![root().join("tests/traces/rtt-client-side.pcap"), root().join("tests/traces/codered.pcap")]
            }
        }
    };
    let mut frames = Vec::new();
    for p in &candidates {
        let b = std::fs::read(p).unwrap();
        let mut r = CaptureReader::new(Cursor::new(b)).unwrap();
        while let Some(f) = r.next_frame().unwrap() {
            frames.push(Owned { ts: f.ts_ns, wire: f.wire_len, link: f.link, data: f.data.to_vec() });
        }
    }
    let name =
        candidates.iter().map(|p| p.file_name().unwrap().to_string_lossy().to_string()).collect::<Vec<_>>().join("+");
    (name, frames)
}

fn issuer() -> Issuer {
    Issuer::from_secret(&[1; 32]).unwrap()
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn cred(read: &[Field], payload: u32, anonymize: bool) -> Vec<u8> {
    let spec = MonitorSpec {
        read: read.to_vec(),
        payload,
        anonymize: if anonymize { vec![Prefix::ALL_V4, Prefix::ALL_V6] } else { vec![] },
        limits: Some(PolicyLimits { budget: 100_000, periodic: 50_000_000, memory: 16 << 20 }),
        export: ExportRights { records: true, packets: true },
        ..MonitorSpec::default()
    };
    policy::issue(&issuer(), PrincipalId([3; 32]), &spec).unwrap().to_bytes().to_vec()
}

/// Each application's policy: the fields it needs, anonymized addresses.
fn app_policy(app: &str) -> Vec<u8> {
    use Field::*;
    match app {
        "trajectory" => cred(
            &[Ts, IpVersion, Proto, IpLen, IpId, Src, Dst, Sport, Dport, TcpSeq, TcpAck, TcpFlags, TcpWindow],
            16,
            true,
        ),
        "rtt" => cred(&[Ts, IpVersion, Proto, Src, Dst, Sport, Dport, TcpSeq, TcpFlags], 0, true),
        "codered" => cred(&[Ts, IpVersion, Proto, Src, Dst, Sport, Dport, TcpSeq, TcpFlags], PAYLOAD_ALL, true),
        "hurst" => cred(&[Ts], 0, false),
        _ => cred(&[Ts, WireLen], 0, false),
    }
}

fn native(app: &str) -> Box<dyn App + Send> {
    match app {
        "trajectory" => Box::new(Trajectory::new(100_000, 0x5a4d)),
        "rtt" => Box::new(Rtt::new(0)),
        "codered" => Box::new(CodeRed::new()),
        _ => Box::new(Hurst::new(1_000_000, 2)),
    }
}

fn module(name: &str) -> Vec<u8> {
    let p = root().join("modules/out").join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}; run scripts/setup", p.display()))
}

fn monitor(batch: u32) -> Monitor {
    let mut m = Monitor::new(
        issuer().public_key(),
        MonitorConfig { batch, ..MonitorConfig::default() },
        Some(CryptoPan::new(&[5; 32])),
    )
    .unwrap();
    m.verifier_mut().max.memory = 64 << 20;
    m
}

/// Feeds every frame, with a periodic call per second of capture time; returns packets fed.
fn run(m: &mut Monitor, frames: &[Owned], out: &mut Vec<anode_monitor::Output>) -> u64 {
    let mut next = 0;
    for f in frames {
        let fr = Frame { ts_ns: f.ts, wire_len: f.wire, iface: 0, link: f.link, data: &f.data };
        m.handle_frame(&fr, out);
        if f.ts >= next {
            m.periodic(f.ts, out);
            next = f.ts + 1_000_000_000;
        }
        out.clear();
    }
    m.flush(out);
    out.clear();
    frames.len() as u64
}

fn bench(c: &mut Criterion) {
    let (name, frames) = load_trace();
    eprintln!("trace {name}: {} frames", frames.len());
    let mut out = Vec::new();

    let mut g = c.benchmark_group(format!("per_app/{name}"));
    g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(frames.len() as u64));
    let admin = policy::issue(&issuer(), PrincipalId([3; 32]), &MonitorSpec { admin: true, ..MonitorSpec::default() })
        .unwrap()
        .to_bytes()
        .to_vec();
    {
        let mut m = monitor(32);
        g.bench_function("parse_only", |b| b.iter(|| run(&mut m, &frames, &mut out)));
    }
    for app in ["trajectory", "rtt", "codered", "hurst"] {
        let mut m = monitor(32);
        m.load_native(now(), app, native(app), &admin).unwrap();
        g.bench_function(BenchmarkId::new("native", app), |b| b.iter(|| run(&mut m, &frames, &mut out)));
        let mut m = monitor(32);
        m.load_native(now(), app, native(app), &app_policy(app)).unwrap();
        g.bench_function(BenchmarkId::new("native_policy", app), |b| b.iter(|| run(&mut m, &frames, &mut out)));
        for batch in [1, 32] {
            let mut m = monitor(batch);
            m.load(now(), app, &module(&format!("mon-{app}")), &app_policy(app)).unwrap();
            g.bench_function(BenchmarkId::new(format!("sandboxed_policy_batch{batch}"), app), |b| {
                b.iter(|| run(&mut m, &frames, &mut out))
            });
            let i = &m.modules()[0];
            assert_eq!((i.counters.overruns, i.counters.traps), (0, 0), "{app}");
        }
    }
    g.finish();

    let mut g = c.benchmark_group(format!("replay/{name}"));
    g.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(frames.len() as u64));
    let mut m = monitor(32);
    m.load(now(), "count", &module("mon-count"), &app_policy("count")).unwrap();
    g.bench_function("1_trivial", |b| b.iter(|| run(&mut m, &frames, &mut out)));
    for copies in [1usize, 5] {
        let mut m = monitor(32);
        for k in 0..copies {
            for app in ["trajectory", "rtt", "codered", "hurst"] {
                m.load(now(), &format!("{app}{k}"), &module(&format!("mon-{app}")), &app_policy(app)).unwrap();
            }
        }
        g.bench_function(format!("{}_apps", copies * 4), |b| b.iter(|| run(&mut m, &frames, &mut out)));
    }
    let mut m = monitor(32);
    for k in 0..20 {
        m.load(now(), &format!("count{k}"), &module("mon-count"), &app_policy("count")).unwrap();
    }
    g.bench_function("20_trivial", |b| b.iter(|| run(&mut m, &frames, &mut out)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
