//! Expert Table 2 on this machine: a procedure call, a call into the module
//! itself, a host call (the "system call"), a pod call and return (null and
//! with a 1 KiB argument copied both ways), a nested pod call, and 4-byte
//! round trips to another process over a pipe and over a Unix socket; hot
//! (back-to-back) and cold (caches thrashed before each timed call).
//!
//! Hot figures are per call: one invocation makes `HOT` calls in a wasm
//! loop, and the invocation's cost is divided by `HOT`. Cold figures are one
//! call per invocation after the caches are thrashed; the bench also times
//! the same invocation making no call, so the call costs the difference.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anode_cred::{Issuer, PrincipalId, RequestedLimits};
use anode_sandbox::pods::OnFault;
use anode_sandbox::{LoadSpec, ModuleId, Now, PodSpec, Sandbox, SandboxConfig, StaticRoutes};
use criterion::{Criterion, criterion_group};

/// Calls per invocation for the hot figures.
const HOT: u32 = 1000;
/// Bytes written between cold calls: more than the last-level cache here.
const THRASH: usize = 64 << 20;
/// Cold calls timed per subject.
const COLD: u32 = 200;

fn now() -> Now {
    Now { ms: 1, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

/// A client whose entries take [binding 4 LE][n 4 LE] and make `n` calls.
const CLIENT: &str = r#"(module
    (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
    (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
    (import "route" "this_host" (func $host (result i32)))
    (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
    (import "pod" "call" (func $call (param i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 64) "wasmhostpodpod1kbind")
    (func $null (result i32) (i32.const 0))
    (func $n (result i32)
      (drop (call $in (i32.const 0) (i32.const 8) (i32.const 0)))
      (i32.load (i32.const 4)))
    (func $wasm (param i32 i32) (result i32) (local $i i32) (local $n i32)
      (local.set $n (call $n))
      (block $b (loop $l
        (br_if $b (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $null))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (local.get $i))
    (func $hostf (param i32 i32) (result i32) (local $i i32) (local $n i32)
      (local.set $n (call $n))
      (block $b (loop $l
        (br_if $b (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $host))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (local.get $i))
    (func $podf (param i32 i32) (result i32) (local $i i32) (local $n i32)
      (local.set $n (call $n))
      (block $b (loop $l
        (br_if $b (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $call (i32.load (i32.const 0)) (i32.const 0)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (local.get $i))
    (func $pod1k (param i32 i32) (result i32) (local $i i32) (local $n i32)
      (local.set $n (call $n))
      (block $b (loop $l
        (br_if $b (i32.ge_u (local.get $i) (local.get $n)))
        (drop (call $call (i32.load (i32.const 0)) (i32.const 1024)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (local.get $i))
    (func $bindf (param i32 i32) (result i32) (local $b i32)
      (drop (call $in (i32.const 128) (i32.const 64) (i32.const 0)))
      (local.set $b (call $bind (i32.const 128) (local.get 1) (i32.const 4096) (i32.const 2048)))
      (drop (call $call (local.get $b) (i32.const 0)))
      (local.get $b))
    (table (export "__indirect_function_table") 5 funcref)
    (elem (i32.const 0) $wasm $hostf $podf $pod1k $bindf)
    (func (export "anode_init")
      (drop (call $reg (i32.const 64) (i32.const 4) (i32.const 0)))
      (drop (call $reg (i32.const 68) (i32.const 4) (i32.const 1)))
      (drop (call $reg (i32.const 72) (i32.const 3) (i32.const 2)))
      (drop (call $reg (i32.const 75) (i32.const 5) (i32.const 3)))
      (drop (call $reg (i32.const 80) (i32.const 4) (i32.const 4)))))"#;

/// `null` returns nothing; `echo` returns its argument.
const NULL_POD: &str = r#"(module
    (memory (export "memory") 1)
    (func (export "pod_buffer") (result i32) (i32.const 0))
    (func (export "pod_buffer_len") (result i32) (i32.const 2048))
    (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
    (func (export "offer.null") (param i32 i32) (result i32) (i32.const 0))
    (func (export "offer.echo") (param i32 i32) (result i32) (local.get 1)))"#;

/// `go` calls `null.null` through a binding it made on its first call.
const RELAY_POD: &str = r#"(module
    (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
    (import "pod" "call" (func $call (param i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 2048) "null.null")
    (global $b (mut i32) (i32.const 0))
    (func (export "pod_buffer") (result i32) (i32.const 0))
    (func (export "pod_buffer_len") (result i32) (i32.const 256))
    (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
    (func (export "offer.go") (param i32 i32) (result i32)
      (if (i32.eqz (global.get $b)) (then
        (global.set $b (call $bind (i32.const 2048) (i32.const 9) (i32.const 1024) (i32.const 256)))
        (drop (call $call (global.get $b) (i32.const 0)))))
      (call $call (global.get $b) (i32.const 0))))"#;

struct Setup {
    sb: Sandbox,
    client: ModuleId,
    null: i32,
    echo: i32,
    relay: i32,
    /// `nullrb.null`: the null pod loaded with [`OnFault::Rollback`] (a
    /// 64 KiB memory copied before every call).
    rollback: i32,
}

/// `yields`: the default preemptible invocations (`pod.call` is then an
/// async host call); `false`: `yield_fuel = None`, plain synchronous calls.
fn setup(yields: bool) -> Setup {
    let issuer = Issuer::from_secret(&[1; 32]).unwrap();
    let routes = StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: HashMap::new() };
    let mut cfg = SandboxConfig::default();
    if !yields {
        cfg.yield_fuel = None;
    }
    let mut sb = Sandbox::new(issuer.public_key(), cfg, Arc::new(routes)).unwrap();
    let cred = issuer.admin(PrincipalId([2; 32]), None).unwrap();
    let limits = RequestedLimits { cpu: Some(10_000_000), ..RequestedLimits::default() };
    for (name, src, on_fault) in [
        ("null", NULL_POD, OnFault::Reset),
        ("relay", RELAY_POD, OnFault::Reset),
        ("nullrb", NULL_POD, OnFault::Rollback),
    ] {
        let code = wat::parse_str(src).unwrap();
        let spec = PodSpec {
            code: &code,
            credential: Some(cred.to_bytes()),
            requester: None,
            name,
            limits,
            clients: None,
            on_fault,
            min_fuel: 0,
        };
        sb.load_pod(now(), &spec).unwrap();
    }
    let code = wat::parse_str(CLIENT).unwrap();
    let spec = LoadSpec { code: &code, credential: Some(cred.to_bytes()), requester: None, local_name: None, limits };
    let client = sb.load(now(), &spec).unwrap();
    let mut bind = |offer: &str| {
        let b = sb.invoke(now(), client, "bind", offer.as_bytes(), &mut Vec::new()).unwrap();
        assert!(b > 0, "{offer}: {b}");
        b
    };
    let (null, echo, relay, rollback) = (bind("null.null"), bind("null.echo"), bind("relay.go"), bind("nullrb.null"));
    Setup { sb, client, null, echo, relay, rollback }
}

fn input(binding: i32, n: u32) -> Vec<u8> {
    let mut v = binding.to_le_bytes().to_vec();
    v.extend_from_slice(&n.to_le_bytes());
    v
}

impl Setup {
    fn run(&mut self, entry: &str, binding: i32, n: u32) {
        let r = self.sb.invoke(now(), self.client, entry, &input(binding, n), &mut Vec::new());
        assert_eq!(r, Ok(n as i32), "{entry}");
    }
}

#[inline(never)]
fn proc_null(x: u32) -> u32 {
    black_box(x)
}

/// Writes `THRASH` bytes so that the next call finds cold caches.
fn thrash(buf: &mut [u8], round: u8) {
    for chunk in buf.chunks_mut(64) {
        chunk[0] = chunk[0].wrapping_add(round);
    }
    black_box(&buf);
}

/// An echo process (this bench re-run with `ANODE_POD_BENCH_ECHO`): 4 bytes in, 4 bytes out.
fn echo_child(stdin: Stdio, stdout: Stdio) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env("ANODE_POD_BENCH_ECHO", "1")
        .stdin(stdin)
        .stdout(stdout)
        .spawn()
        .unwrap()
}

fn echo_loop() {
    let (mut i, mut o) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut b = [0u8; 4];
    while i.read_exact(&mut b).is_ok() {
        if o.write_all(&b).and_then(|()| o.flush()).is_err() {
            break;
        }
    }
}

fn bounce(w: &mut impl Write, r: &mut impl Read) {
    let mut b = [1u8, 2, 3, 4];
    w.write_all(&b).unwrap();
    w.flush().unwrap();
    r.read_exact(&mut b).unwrap();
}

fn table2(c: &mut Criterion) {
    let mut s = setup(true);
    let (null, echo, relay, rollback) = (s.null, s.echo, s.relay, s.rollback);
    let mut sync = setup(false);
    let mut g = c.benchmark_group("pods_hot");
    g.bench_function("proc_call", |b| b.iter(|| proc_null(black_box(1))));
    for (name, entry, binding) in [
        ("wasm_call", "wasm", 0),
        ("host_call", "host", 0),
        ("pod_call_null", "pod", null),
        ("pod_call_1k", "pod1k", echo),
        ("pod_call_nested", "pod", relay),
        ("pod_call_null_rollback", "pod", rollback),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    s.run(entry, binding, HOT);
                }
                t.elapsed() / HOT
            })
        });
    }
    let sync_null = sync.null;
    g.bench_function("pod_call_null_no_preemption", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                sync.run("pod", sync_null, HOT);
            }
            t.elapsed() / HOT
        })
    });
    // Pipe and Unix-socket round trips to another process.
    let mut child = echo_child(Stdio::piped(), Stdio::piped());
    let (mut w, mut r) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    g.bench_function("pipe_bounce", |b| b.iter(|| bounce(&mut w, &mut r)));
    let (mine, theirs) = UnixStream::pair().unwrap();
    let theirs2 = theirs.try_clone().unwrap();
    let mut schild =
        echo_child(Stdio::from(std::os::fd::OwnedFd::from(theirs)), Stdio::from(std::os::fd::OwnedFd::from(theirs2)));
    let mut sock = mine;
    let mut sock_r = sock.try_clone().unwrap();
    g.bench_function("unix_bounce", |b| b.iter(|| bounce(&mut sock, &mut sock_r)));
    g.finish();

    // Cold: criterion's loop would thrash millions of times; time COLD single
    // calls by hand instead and print their medians (Expert: 40 calls).
    let mut buf = vec![0u8; THRASH];
    let mut round = 0u8;
    let mut cold = |f: &mut dyn FnMut()| -> (Duration, Duration) {
        let mut v: Vec<Duration> = (0..COLD)
            .map(|_| {
                round = round.wrapping_add(1);
                thrash(&mut buf, round);
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        v.sort();
        (v[v.len() / 2], v.iter().sum::<Duration>() / COLD)
    };
    let mut rows = vec![(
        "proc_call",
        cold(&mut || {
            black_box(proc_null(black_box(1)));
        }),
    )];
    rows.push(("invoke_no_call", cold(&mut || s.run("pod", null, 0))));
    for (name, entry, binding) in [
        ("invoke_wasm_call", "wasm", 0),
        ("invoke_host_call", "host", 0),
        ("invoke_pod_call_null", "pod", null),
        ("invoke_pod_call_1k", "pod1k", echo),
        ("invoke_pod_call_nested", "pod", relay),
        ("invoke_pod_call_rollback", "pod", rollback),
    ] {
        rows.push((name, cold(&mut || s.run(entry, binding, 1))));
    }
    rows.push(("pipe_bounce", cold(&mut || bounce(&mut w, &mut r))));
    rows.push(("unix_bounce", cold(&mut || bounce(&mut sock, &mut sock_r))));
    println!("\npods_cold ({COLD} calls each, {} MiB written between calls): median, mean", THRASH >> 20);
    for (name, (median, mean)) in rows {
        println!("pods_cold/{name:<24} {:>10.2} us {:>10.2} us", median.as_secs_f64() * 1e6, mean.as_secs_f64() * 1e6);
    }
    drop((w, r, sock, sock_r));
    let _ = child.wait();
    let _ = schild.wait();
}

criterion_group!(benches, table2);

fn main() {
    if std::env::var_os("ANODE_POD_BENCH_ECHO").is_some() {
        echo_loop();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
