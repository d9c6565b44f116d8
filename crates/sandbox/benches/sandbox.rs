//! Switchlet costs: cold load of a ~2 KB module, warm invocation, capsules
//! (code carried and by hash, warm cache), and fuel vs epoch interruption.
//! Needs the example modules: `scripts/setup`.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anode_cred::{Issuer, ModuleHash, PrincipalId, RequestedLimits};
use anode_sandbox::capsule::Capsule;
use anode_sandbox::{CpuBound, LoadSpec, Now, Sandbox, SandboxConfig, StaticRoutes};
use criterion::{Criterion, criterion_group, criterion_main};

fn module(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../modules/out").join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup first", p.display()))
}

fn now(ms: u64) -> Now {
    Now { ms, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

fn sandbox(cpu: CpuBound) -> (Sandbox, Issuer) {
    sandbox_opt(cpu, true)
}

fn sandbox_opt(cpu: CpuBound, optimize: bool) -> (Sandbox, Issuer) {
    let issuer = Issuer::from_secret(&[1; 32]).unwrap();
    let routes = StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: HashMap::new() };
    let cfg = SandboxConfig { cpu, optimize, ..Default::default() };
    (Sandbox::new(issuer.public_key(), cfg, Arc::new(routes)).unwrap(), issuer)
}

/// `code` plus a custom section that makes it unique (so nothing is cached) and pads it to `size`.
fn unique(code: &[u8], n: u64, size: usize) -> Vec<u8> {
    let mut v = code.to_vec();
    let pad = size.saturating_sub(code.len() + 12).max(8);
    v.push(0);
    let mut body = vec![1u8, b'u'];
    body.extend_from_slice(&n.to_le_bytes());
    body.resize(pad, 0);
    let mut len = body.len() as u32;
    loop {
        let b = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            v.push(b);
            break;
        }
        v.push(b | 0x80);
    }
    v.extend_from_slice(&body);
    v
}

fn ping_data() -> Vec<u8> {
    // origin = target = this node: the entry delivers locally at once.
    let mut d = Vec::new();
    d.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 1]);
    d.extend_from_slice(&0u64.to_be_bytes());
    d.extend_from_slice(&9000u16.to_be_bytes());
    d.push(0);
    d
}

fn bench(c: &mut Criterion) {
    let ping = module("ping");
    let counter = module("counter");
    let (mut sb, issuer) = sandbox(CpuBound::Fuel);
    let cred = issuer.admin(PrincipalId([3; 32]), None).unwrap();
    let mut out = Vec::new();

    let mut n = 0u64;
    for optimize in [true, false] {
        let (mut sb, _) = sandbox_opt(CpuBound::Fuel, optimize);
        let name = if optimize { "cold_load_2k_module" } else { "cold_load_2k_module_unoptimized" };
        c.bench_function(name, |b| {
            b.iter(|| {
                n += 1;
                let code = unique(&ping, n, 2048);
                let spec = LoadSpec {
                    code: &code,
                    credential: Some(cred.to_bytes()),
                    requester: None,
                    local_name: None,
                    limits: RequestedLimits::default(),
                };
                let id = sb.load(now(0), &spec).unwrap();
                sb.unload(id);
            })
        });
    }

    // The parts of a cold load, separately.
    let mut g = c.benchmark_group("cold_parts");
    let mut verifier = anode_cred::Verifier::new(issuer.public_key(), anode_cred::VerifierConfig::default());
    let mut k = 0u64;
    g.bench_function("credential_decision", |b| {
        b.iter(|| {
            k += 1;
            let info = anode_cred::CodeInfo { hash: ModuleHash::of(&k.to_le_bytes()), signed: None };
            let req = anode_cred::LoadRequest {
                credential: Some(cred.to_bytes()),
                requester: None,
                code: &info,
                local_name: None,
                interfaces: anode_cred::InterfaceSet::ALL,
                limits: RequestedLimits::default(),
            };
            black_box(verifier.authorize(now(0).wall, &req).unwrap());
        })
    });
    let engine = sb.engine().clone();
    g.bench_function("compile", |b| {
        b.iter(|| {
            k += 1;
            let code = unique(&ping, k, 2048);
            black_box(wasmtime::Module::from_binary(&engine, &code).unwrap());
        })
    });
    let tiny = wat::parse_str(r#"(module (func (export "f") (param i32) (result i32) (local.get 0)))"#).unwrap();
    g.bench_function("compile_tiny", |b| {
        b.iter(|| {
            k += 1;
            let code = unique(&tiny, k, 64);
            black_box(wasmtime::Module::from_binary(&engine, &code).unwrap());
        })
    });
    g.bench_function("hash_and_inspect", |b| {
        b.iter(|| {
            k += 1;
            let code = unique(&ping, k, 2048);
            black_box(anode_cred::CodeInfo::inspect(&code).unwrap());
        })
    });
    g.finish();

    let spec = LoadSpec {
        code: &counter,
        credential: Some(cred.to_bytes()),
        requester: None,
        local_name: None,
        limits: RequestedLimits::default(),
    };
    let id = sb.load(now(0), &spec).unwrap();
    c.bench_function("warm_invoke", |b| {
        b.iter(|| {
            black_box(sb.invoke(now(1), id, "incr", b"key", &mut out).unwrap());
            out.clear();
        })
    });

    let data = ping_data();
    let hash = ModuleHash::of(&ping);
    let mut by_hash = Vec::new();
    Capsule { entry: "ping", credential: cred.to_bytes(), data: &data, code: None, hash }.encode(&mut by_hash).unwrap();
    let mut carried = Vec::new();
    Capsule { entry: "ping", credential: cred.to_bytes(), data: &data, code: Some(&ping), hash }
        .encode(&mut carried)
        .unwrap();
    let from = Ipv4Addr::new(10, 0, 0, 2);
    sb.handle_capsule(now(0), from, &carried, &mut out).unwrap();
    out.clear();
    c.bench_function("capsule_by_hash_warm", |b| {
        b.iter(|| {
            black_box(sb.handle_capsule(now(1), from, &by_hash, &mut out).unwrap());
            out.clear();
        })
    });
    c.bench_function("capsule_code_carried_warm", |b| {
        b.iter(|| {
            black_box(sb.handle_capsule(now(1), from, &carried, &mut out).unwrap());
            out.clear();
        })
    });

    // Fuel vs epoch: the same short entry and a 100,000-iteration loop.
    let looper = wat::parse_str(
        r#"(module
            (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "loopnop")
            (table (export "__indirect_function_table") 3 funcref)
            (elem (i32.const 1) $loop $nop)
            (func $loop (param i32 i32) (result i32) (local $i i32) (local $acc i32)
              (loop $l
                (local.set $acc (i32.add (local.get $acc) (i32.mul (local.get $i) (i32.const 3))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br_if $l (i32.lt_u (local.get $i) (i32.const 100000))))
              (local.get $acc))
            (func $nop (param i32 i32) (result i32) (local.get 1))
            (func (export "anode_init")
              (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 1)))
              (drop (call $reg (i32.const 4) (i32.const 3) (i32.const 2)))))"#,
    )
    .unwrap();
    for (label, cpu) in [("fuel", CpuBound::Fuel), ("epoch", CpuBound::Epoch { ticks: 1_000_000 })] {
        let (mut sb, issuer) = sandbox(cpu);
        let cred = issuer.admin(PrincipalId([4; 32]), None).unwrap();
        let spec = LoadSpec {
            code: &looper,
            credential: Some(cred.to_bytes()),
            requester: None,
            local_name: None,
            limits: RequestedLimits::default(),
        };
        let id = sb.load(now(0), &spec).unwrap();
        let mut g = c.benchmark_group(format!("cpu_bound_{label}"));
        g.bench_function("nop_entry", |b| b.iter(|| black_box(sb.invoke(now(1), id, "nop", b"", &mut out).unwrap())));
        g.bench_function("loop_100k", |b| b.iter(|| black_box(sb.invoke(now(1), id, "loop", b"", &mut out).unwrap())));
        g.finish();
    }
    preemption(c);
}

/// The cost of a preemption point: a loop of 200,000 iterations (about
/// 1.6 M fuel, no host calls) with no yields (a synchronous store), and with
/// a fuel yield every 50,000, 10,000 and 1,000 units (each yield is a fiber
/// switch out and back, and a call of the caller's `keep_going`). Cost per
/// point = (time - time without) / points (the count is printed once).
fn preemption(c: &mut Criterion) {
    let code = wat::parse_str(
        r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "work")
        (func $work (param i32 i32) (result i32) (local $i i32)
          (loop $l
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 200000))))
          (local.get $i))
        (table (export "__indirect_function_table") 1 funcref)
        (elem (i32.const 0) $work)
        (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))))"#,
    )
    .unwrap();
    let mut g = c.benchmark_group("preemption");
    for (label, interval) in
        [("no_yield", None), ("yield_50k", Some(50_000)), ("yield_10k", Some(10_000)), ("yield_1k", Some(1_000))]
    {
        let issuer = Issuer::from_secret(&[1; 32]).unwrap();
        let routes = StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: HashMap::new() };
        let cfg = SandboxConfig { yield_fuel: interval, ..Default::default() };
        let mut sb = Sandbox::new(issuer.public_key(), cfg, Arc::new(routes)).unwrap();
        let cred = issuer.admin(PrincipalId([5; 32]), None).unwrap();
        let limits = RequestedLimits { cpu: Some(5_000_000), ..Default::default() };
        let spec =
            LoadSpec { code: &code, credential: Some(cred.to_bytes()), requester: None, local_name: None, limits };
        let id = sb.load(now(0), &spec).unwrap();
        let mut out = Vec::new();
        let mut printed = false;
        g.bench_function(format!("loop_200k_{label}"), |b| {
            b.iter(|| {
                let job = anode_sandbox::Job::new(
                    id,
                    anode_sandbox::JobKind::Entry { entry: "work".into(), arg: 0 },
                    Vec::new(),
                    0,
                );
                let t = sb.start(now(1), job).unwrap().unwrap();
                let mut points = 0u32;
                let r = match sb.resume(
                    t,
                    &mut || {
                        points += 1;
                        true
                    },
                    &mut out,
                ) {
                    anode_sandbox::Step::Done(r) => black_box((r.unwrap(), points)),
                    anode_sandbox::Step::Yielded(_) => unreachable!(),
                };
                if !printed {
                    eprintln!("preemption/{label}: {points} preemption points per invocation");
                    printed = true;
                }
                r
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
