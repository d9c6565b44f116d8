//! RCANE Fig. 16, isolation of allocation (§VI-D.2), on real daemons.
//!
//! A testbed of two nodes, a - c (`anode testbed up --period-log`, in a
//! scratch directory). On c, two modules (WAT built here):
//!
//! - **B** (guaranteed: a VP of 1 ms in every 4 ms, no slack) has a channel
//!   on port 5000 for payloads starting `B`. Each request does `--b-work`
//!   loop iterations (about half a millisecond), every `--keep-every`th
//!   also keeps a 64 KiB result until its next request (64 soft-state
//!   entries of 1000 bytes, charged to its session's heap),
//!   and replies to the requester (`net.send` to the packet's source) with
//!   what it did: the request's number, whether it tried to keep a result
//!   and whether that allocation was refused, and its heap account's use.
//! - **A** (best effort: a VP of 100 µs in every 100 ms that may use
//!   slack) has a channel for payloads starting `A`. Each request does a
//!   number of allocate-compute steps on soft state: light requests keep at
//!   most 32 entries (every allocation frees the oldest), heavy ones keep
//!   every entry until an allocation is refused, then free the oldest
//!   quarter ("collect") and go on, and top the heap up before they return:
//!   garbage accumulates up to the reservation, as in a collected heap.
//!
//! Node a is the requester: the harness sends B a request every 4 ms and
//! A one every 4 ms (2 ms apart) through a's application socket, A light
//! for the first third of the run, heavy after, and receives B's replies
//! on a port registered at a. Run twice: A and B in ONE session of one
//! principal (A's channel on the session's VP 0, B's on VP 1; one store,
//! one heap account) and in TWO sessions of two principals (each channel
//! on its session's VP 0).
//!
//! In one session B loses service to A three ways, each counted by the
//! node: its VP first runs A's preempted invocation, which holds the
//! principal's one store, on B's budget (`rcane.counters.jobs_helped`:
//! RCANE's B doing A's collector work, so B is late); its packet is not
//! queued because A has filled the shared heap account, which queued
//! packets are charged to (`dropped_full` on B's channel); or it runs but
//! its 64 KiB result is refused (its reply says so).
//!
//! Measured: per request, the latency from sending to receiving the reply
//! (two overlay hops and both nodes' processing), whether a reply came at
//! all, whether B's allocation was refused; per period, the CPU B's VP
//! received (the node's period log); after the run, the node's counters
//! (`rcane.counters.jobs_helped`: suspended invocations run by another VP
//! of their principal whose job needed the store; `jobs_busy`: jobs
//! dropped for a busy store, none since; B's channel's drops; the heap
//! accounts' refusals).
//!
//! Writes `fig16-node.csv` (one row per B request), `fig16-node-periods.csv`
//! (one row per period of B's VP), `fig16-node-summary.json` and
//! `fig16-node.png` (one column per scenario). Timing is not asserted
//! anywhere: the machine is shared (docs/rcane.md).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bed::Testbed;
use anode_daemon::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;
use serde_json::json;

/// `anode experiment fig16-node`.
#[derive(Debug, clap::Args)]
pub struct Fig16NodeArgs {
    /// Seconds of requests per scenario (A turns heavy after a third).
    #[arg(long, default_value_t = 6.0)]
    seconds: f64,
    /// B's loop iterations per request (about half a millisecond here).
    #[arg(long, default_value_t = 100_000)]
    b_work: u32,
    /// B keeps a 64 KiB result every this many requests.
    #[arg(long, default_value_t = 25)]
    keep_every: u32,
    /// A's allocate-compute steps per light request.
    #[arg(long, default_value_t = 50)]
    a_light: u32,
    /// A's allocate-compute steps per heavy request.
    #[arg(long, default_value_t = 150)]
    a_heavy: u32,
    /// Each session's heap reservation, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    heap: u64,
    /// Output directory.
    #[arg(short, long, default_value = "fig16-node-out")]
    out: PathBuf,
}

const PORT: u16 = 5000;
const REPLY_PORT: u16 = 5001;
const PERIOD: Duration = Duration::from_millis(4);
/// Bytes of one soft-state entry's value.
const VALUE: u32 = 1000;
/// Entries of one kept result of B (64 × 1000 bytes).
const CHUNKS: u32 = 64;
/// Entries a light request of A keeps at most.
const LIGHT_LIVE: u32 = 32;
/// Loop iterations of A's computation per step.
const A_WORK: u32 = 200;
/// FIFO of A's channel, bytes of payload (a few requests: its backlog is
/// charged to the heap too).
const A_FIFO: u32 = 64;
/// FIFO of B's channel (the default, docs/channels.md).
const DEFAULT_FIFO: u32 = 64 * 1024;

/// The channel spec (docs/channels.md): port 5000, any source, a FIFO of
/// `buffer` bytes, payload prefix `prefix`, no keys; as WAT string escapes.
fn spec(prefix: u8, buffer: u32) -> String {
    let b = buffer.to_be_bytes();
    format!("\\01\\00\\13\\88\\{:02x}\\{:02x}\\{:02x}\\{:02x}\\01\\{prefix:02x}\\00", b[0], b[1], b[2], b[3])
}

/// Module B: requests `[B][seq u32][iters u32][keep u8][reply port u16]`
/// (little-endian), replies `[seq u32][flags u8][kept u8][pad 2][heap used
/// i64][acc u32]`; flags: 1 tried to keep a result, 2 that was refused.
fn b_module(vp: u8) -> Result<Vec<u8>> {
    let spec = spec(b'B', 0);
    let src = format!(
        r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "net" "send" (func $send (param i32 i32 i32 i32) (result i32)))
  (import "net" "source" (func $src (result i32)))
  (import "state" "put" (func $put (param i32 i32 i32 i32 i64) (result i32)))
  (import "state" "remove" (func $rm (param i32 i32) (result i32)))
  (import "session" "heap_used" (func $used (result i64)))
  (memory (export "memory") 1)
  (global $kept (mut i32) (i32.const 0))
  (global $acc (mut i32) (i32.const 0))
  (global $chan (mut i32) (i32.const 0))
  (data (i32.const 0) "serve")
  (data (i32.const 16) "{spec}")
  (data (i32.const 80) "b")
  (func $drop_result
    (block $d (loop $l
      (br_if $d (i32.eqz (global.get $kept)))
      (global.set $kept (i32.sub (global.get $kept) (i32.const 1)))
      (i32.store8 (i32.const 81) (global.get $kept))
      (drop (call $rm (i32.const 80) (i32.const 2)))
      (br $l))))
  (func $serve (param i32 i32) (result i32) (local $n i32) (local $i i32) (local $iters i32) (local $flags i32)
    (local.set $n (call $in (i32.const 128) (i32.const 16) (i32.const 0)))
    (if (i32.lt_s (local.get $n) (i32.const 12)) (then (return (i32.const -1))))
    (local.set $iters (i32.load (i32.const 133)))
    (loop $w
      (global.set $acc (i32.xor (global.get $acc) (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $w (i32.lt_u (local.get $i) (local.get $iters))))
    (call $drop_result)
    (if (i32.load8_u (i32.const 137)) (then
      (local.set $flags (i32.const 1))
      (block $d (loop $k
        (br_if $d (i32.ge_u (global.get $kept) (i32.const {CHUNKS})))
        (i32.store8 (i32.const 81) (global.get $kept))
        (if (call $put (i32.const 80) (i32.const 2) (i32.const 1024) (i32.const {VALUE}) (i64.const 0))
          (then (local.set $flags (i32.const 3)) (br $d)))
        (global.set $kept (i32.add (global.get $kept) (i32.const 1)))
        (br $k)))
      (if (i32.eq (local.get $flags) (i32.const 3)) (then (call $drop_result)))))
    (i32.store (i32.const 160) (i32.load (i32.const 129)))
    (i32.store8 (i32.const 164) (local.get $flags))
    (i32.store8 (i32.const 165) (global.get $kept))
    (i64.store (i32.const 168) (call $used))
    (i32.store (i32.const 176) (global.get $acc))
    (drop (call $send (call $src) (i32.load16_u (i32.const 138)) (i32.const 160) (i32.const 20)))
    (i32.const 0))
  (table (export "__indirect_function_table") 1 funcref)
  (elem (i32.const 0) $serve)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 5) (i32.const 0)))
    (global.set $chan (call $open (i32.const 16) (i32.const 11) (i32.const 0) (i32.const 5) (i32.const {vp})))))"#
    );
    wat::parse_str(src).context("the fig16-node module B")
}

/// Module A: requests `[A][mode u8: L or H][steps u32]` (little-endian).
fn a_module(vp: u8) -> Result<Vec<u8>> {
    let spec = spec(b'A', A_FIFO);
    let src = format!(
        r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "state" "put" (func $put (param i32 i32 i32 i32 i64) (result i32)))
  (import "state" "remove" (func $rm (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $head (mut i32) (i32.const 0))
  (global $tail (mut i32) (i32.const 0))
  (global $acc (mut i32) (i32.const 0))
  (global $chan (mut i32) (i32.const 0))
  (data (i32.const 0) "churn")
  (data (i32.const 16) "{spec}")
  (data (i32.const 64) "a")
  (func $live (result i32) (i32.sub (global.get $head) (global.get $tail)))
  (func $free_oldest
    (i32.store16 (i32.const 65) (i32.and (global.get $tail) (i32.const 4095)))
    (drop (call $rm (i32.const 64) (i32.const 3)))
    (global.set $tail (i32.add (global.get $tail) (i32.const 1))))
  ;; One allocation: 0 kept, else refused.
  (func $alloc (result i32) (local $r i32)
    (i32.store16 (i32.const 65) (i32.and (global.get $head) (i32.const 4095)))
    (local.set $r (call $put (i32.const 64) (i32.const 3) (i32.const 1024) (i32.const {VALUE}) (i64.const 0)))
    (if (i32.eqz (local.get $r)) (then (global.set $head (i32.add (global.get $head) (i32.const 1)))))
    (local.get $r))
  (func $churn (param i32 i32) (result i32)
    (local $n i32) (local $heavy i32) (local $steps i32) (local $cap i32) (local $s i32) (local $q i32) (local $i i32)
    (local.set $n (call $in (i32.const 128) (i32.const 16) (i32.const 0)))
    (if (i32.lt_s (local.get $n) (i32.const 6)) (then (return (i32.const -1))))
    (local.set $heavy (i32.eq (i32.load8_u (i32.const 129)) (i32.const 72)))
    (local.set $steps (i32.load (i32.const 130)))
    (local.set $cap (select (i32.const 4096) (i32.const {LIGHT_LIVE}) (local.get $heavy)))
    (block $done (loop $step
      (br_if $done (i32.ge_u (local.get $s) (local.get $steps)))
      (local.set $s (i32.add (local.get $s) (i32.const 1)))
      (block $ok (loop $trim
        (br_if $ok (i32.lt_u (call $live) (local.get $cap)))
        (call $free_oldest)
        (br $trim)))
      (if (call $alloc) (then
        (local.set $q (i32.shr_u (call $live) (i32.const 2)))
        (if (i32.eqz (local.get $q)) (then (local.set $q (i32.const 1))))
        (block $c (loop $col
          (br_if $c (i32.or (i32.eqz (local.get $q)) (i32.eqz (call $live))))
          (call $free_oldest)
          (local.set $q (i32.sub (local.get $q) (i32.const 1)))
          (br $col)))))
      (local.set $i (i32.const 0))
      (loop $w
        (global.set $acc (i32.xor (global.get $acc) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $w (i32.lt_u (local.get $i) (i32.const {A_WORK}))))
      (br $step)))
    (if (local.get $heavy) (then
      (block $full (loop $top
        (br_if $full (i32.ge_u (call $live) (local.get $cap)))
        (br_if $full (call $alloc))
        (br $top)))))
    (call $live))
  (table (export "__indirect_function_table") 1 funcref)
  (elem (i32.const 0) $churn)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 5) (i32.const 0)))
    (global.set $chan (call $open (i32.const 16) (i32.const 11) (i32.const 0) (i32.const 5) (i32.const {vp})))))"#
    );
    wat::parse_str(src).context("the fig16-node module A")
}

/// The testbed a - c of this experiment, users' commands to c.
type Bed = Testbed;

/// `anode testbed up` of a - c with the period log, a key pair per user.
fn up_bed(anode: PathBuf, dir: PathBuf, users: &[&str]) -> Result<Bed> {
    let line2 = "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"c\", address = \"10.0.0.3\" }]\n\
                 link = [{ a = \"a\", b = \"c\" }]\n";
    Testbed::up(anode, dir, line2, users, &["--period-log"], "c")
}

/// What this experiment does on its testbed.
trait Workloads {
    /// Opens a session of `u` with `vps`; returns the VP handles in order.
    fn open_session(&self, u: &str, vps: &[&str], heap: u64) -> Result<Vec<String>>;
    /// Loads `code` as `name` for `u`.
    fn load(&self, u: &str, name: &str, code: &[u8]) -> Result<()>;
}

impl Workloads for Testbed {
    fn open_session(&self, u: &str, vps: &[&str], heap: u64) -> Result<Vec<String>> {
        let sc = self.cred(
            u,
            &format!("{u}.session"),
            &[
                "--kind",
                "session",
                "--vp-share",
                "30%",
                "--total-share",
                "30%",
                "--vps",
                "2",
                "--extra",
                "--heap",
                "64MiB",
            ],
        )?;
        let heap = heap.to_string();
        let mut a = vec!["session", "open", "--credential", &sc, "--heap", &heap];
        for v in vps {
            a.extend_from_slice(&["--vp", v]);
        }
        let out = self.user(u, &a)?;
        let added = out.split("VPs added:").nth(1).ok_or_else(|| anyhow!("no VPs in {out:?}"))?;
        Ok(added.split_whitespace().map(str::to_string).collect())
    }

    fn load(&self, u: &str, name: &str, code: &[u8]) -> Result<()> {
        let wasm = self.dir().join(format!("{name}.wasm"));
        std::fs::write(&wasm, code)?;
        let wasm = wasm.to_string_lossy().into_owned();
        let cred = self.cred(
            u,
            &format!("{u}-{name}.cred"),
            &[
                "--kind",
                "module",
                "--module",
                &wasm,
                "--interface",
                "net,state",
                "--cpu",
                "10000000",
                "--state",
                "16MiB",
            ],
        )?;
        self.user(u, &["module", "load", &wasm, "--credential", &cred]).map(|_| ())
    }
}

/// One request of B.
#[derive(Debug, Clone, Default)]
struct Req {
    /// Sent, ms since the first request.
    sent_ms: f64,
    heavy: bool,
    /// Request to reply, µs (None: no reply came).
    latency_us: Option<f64>,
    /// It asked B to keep a result.
    keep: bool,
    /// B's reply said its allocation was refused.
    alloc_failed: bool,
    /// B's session heap use in its reply, bytes.
    heap_used: u64,
}

/// One period of B's VP, from the node's period log.
#[derive(Debug, Clone)]
struct Period {
    /// Start, ms since the first period of B's VP.
    start_ms: f64,
    end_ms: f64,
    received_us: f64,
    slack_us: f64,
    idle: bool,
}

/// A scenario's outcome.
#[derive(Debug)]
struct Outcome {
    name: &'static str,
    shared: bool,
    reqs: Vec<Req>,
    periods: Vec<Period>,
    /// The periods of A's VP (100 ms each).
    a_periods: Vec<Period>,
    heavy_from_ms: f64,
    counters: serde_json::Value,
}

#[derive(Debug, Default)]
struct Replies {
    sent: Vec<Option<Instant>>,
    got: Vec<Option<(Instant, u8, u64)>>,
}

/// Sends B's and A's requests for `seconds` (A heavy after a third) and
/// collects B's replies.
fn drive(bed: &Bed, a: &Fig16NodeArgs) -> Result<Vec<Req>> {
    let n = (a.seconds / PERIOD.as_secs_f64()).round().max(1.0) as usize;
    let heavy_from = n / 3;
    let replies = Arc::new(Mutex::new(Replies { sent: vec![None; n], got: vec![None; n] }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut rx = Client::connect(bed.dir().join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
    rx.register(REPLY_PORT).map_err(|e| anyhow!("registering port {REPLY_PORT} at a: {e}"))?;
    let receiver = {
        let (replies, stop) = (replies.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let Some((_, p)) = rx.recv(Duration::from_millis(50)).map_err(|e| anyhow!("receiving: {e}"))? else {
                    continue;
                };
                let at = Instant::now();
                if p.len() < 20 {
                    continue;
                }
                let seq = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
                let used = u64::from_le_bytes([p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]]);
                let mut r = replies.lock().map_err(|_| anyhow!("poisoned"))?;
                if let Some(slot) = r.got.get_mut(seq) {
                    *slot = Some((at, p[4], used));
                }
            }
            Ok(())
        })
    };
    let mut tx = Client::connect(bed.dir().join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
    let c = std::net::Ipv4Addr::new(10, 0, 0, 3);
    let start = Instant::now();
    let keep_every = a.keep_every.max(1) as usize;
    for i in 0..n {
        let heavy = i >= heavy_from;
        // B at the start of each 4 ms slot, A half way through it.
        let due = start + PERIOD * i as u32;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let mut b = vec![b'B'];
        b.extend_from_slice(&(i as u32).to_le_bytes());
        b.extend_from_slice(&a.b_work.to_le_bytes());
        b.push(u8::from(i % keep_every == keep_every - 1));
        b.extend_from_slice(&REPLY_PORT.to_le_bytes());
        if let Ok(mut r) = replies.lock()
            && let Some(s) = r.sent.get_mut(i)
        {
            *s = Some(Instant::now());
        }
        tx.plain(c, PORT, 64, &b).map_err(|e| anyhow!("sending B's request: {e}"))?;
        let due = due + PERIOD / 2;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let mut p = vec![b'A', if heavy { b'H' } else { b'L' }];
        p.extend_from_slice(&(if heavy { a.a_heavy } else { a.a_light }).to_le_bytes());
        tx.plain(c, PORT, 64, &p).map_err(|e| anyhow!("sending A's request: {e}"))?;
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    receiver.join().map_err(|_| anyhow!("the receiver thread panicked"))??;
    let r = replies.lock().map_err(|_| anyhow!("poisoned"))?;
    let t0 = r.sent.first().copied().flatten().unwrap_or(start);
    Ok((0..n)
        .map(|i| {
            let sent = r.sent.get(i).copied().flatten();
            let got = r.got.get(i).copied().flatten();
            Req {
                sent_ms: sent.map_or(0.0, |s| s.duration_since(t0).as_secs_f64() * 1e3),
                heavy: i >= heavy_from,
                latency_us: sent.zip(got).map(|(s, g)| g.0.saturating_duration_since(s).as_secs_f64() * 1e6),
                keep: i % keep_every == keep_every - 1,
                alloc_failed: got.is_some_and(|g| g.1 & 2 != 0),
                heap_used: got.map_or(0, |g| g.2),
            }
        })
        .collect())
}

/// The periods of VP `vp` in a period log, from `t0_ns` (daemon time).
fn periods_of(log: &str, vp: &str, t0_ns: u64) -> Vec<Period> {
    let mut v = Vec::new();
    for line in log.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 8 || f[0] != vp {
            continue;
        }
        let n = |k: usize| f[k].parse::<u64>().unwrap_or(0);
        if n(2) < t0_ns {
            continue;
        }
        v.push(Period {
            start_ms: (n(2) - t0_ns) as f64 / 1e6,
            end_ms: n(3).saturating_sub(t0_ns) as f64 / 1e6,
            received_us: n(5) as f64 / 1e3,
            slack_us: n(6) as f64 / 1e3,
            idle: f[7] == "1",
        });
    }
    v
}

/// Where the run starts in daemon time: the start of the first period in
/// which `vp` (B's) received CPU, i.e. served its first request.
fn first_served(log: &str, vp: &str) -> u64 {
    log.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.len() == 8 && f[0] == vp && f[5].parse::<u64>().is_ok_and(|r| r > 0))
        .and_then(|f| f[2].parse().ok())
        .unwrap_or(0)
}

/// Runs one scenario on a fresh testbed.
fn scenario(a: &Fig16NodeArgs, shared: bool, work: &Path) -> Result<Outcome> {
    let name = if shared { "one session" } else { "two sessions" };
    let anode = std::env::current_exe()?;
    let dir = work.join(if shared { "one" } else { "two" });
    let users: &[&str] = if shared { &["ab"] } else { &["a", "b"] };
    let bed = up_bed(anode, dir, users)?;
    // A best effort (a notional 0.1 % in 100 ms plus slack), B 1 ms in 4 ms.
    let (a_vp, b_vp) = ("100us/100ms+extra", "1ms/4ms");
    let (a_handle, b_handle) = if shared {
        let vps = bed.open_session("ab", &[a_vp, b_vp], a.heap)?;
        bed.load("ab", "a", &a_module(0)?)?;
        bed.load("ab", "b", &b_module(1)?)?;
        (vps.first().cloned(), vps.get(1).cloned())
    } else {
        let a_vps = bed.open_session("a", &[a_vp], a.heap)?;
        let b_vps = bed.open_session("b", &[b_vp], a.heap)?;
        bed.load("a", "a", &a_module(0)?)?;
        bed.load("b", "b", &b_module(0)?)?;
        (a_vps.first().cloned(), b_vps.first().cloned())
    };
    let (Some(a_handle), Some(b_handle)) = (a_handle, b_handle) else { bail!("no VP handles for A and B") };
    // Let the SAs and loads settle.
    std::thread::sleep(Duration::from_millis(300));
    let reqs = drive(&bed, a)?;
    let status = bed.json(&["status"])?;
    let modules = bed.json(&["module", "list"])?;
    // A's channel is the one with the small FIFO.
    let part = |buffer: u32| -> serde_json::Value {
        let chan = status["modules"]["channels"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["buffer"].as_u64() == Some(u64::from(buffer))))
            .cloned()
            .unwrap_or_default();
        let m =
            modules.as_array().and_then(|l| l.iter().find(|m| m["id"] == chan["module"])).cloned().unwrap_or_default();
        json!({"module": m["id"], "principal": m["principal"], "heap": m["heap"], "counters": m["counters"], "channel": chan})
    };
    let counters = json!({
        "jobs_busy": status["rcane"]["counters"]["jobs_busy"],
        "jobs_helped": status["rcane"]["counters"]["jobs_helped"],
        "rcane": status["rcane"]["counters"],
        "a": part(A_FIFO),
        "b": part(DEFAULT_FIFO),
    });
    bed.down();
    let log = std::fs::read_to_string(bed.dir().join("tb/c/periods.csv")).context("c's period log")?;
    let t0 = first_served(&log, &b_handle);
    let periods = periods_of(&log, &b_handle, t0);
    let a_periods = periods_of(&log, &a_handle, t0);
    let heavy_from_ms = reqs.iter().find(|r| r.heavy).map_or(0.0, |r| r.sent_ms);
    Ok(Outcome { name, shared, reqs, periods, a_periods, heavy_from_ms, counters })
}

/// Percentile `q` of sorted values.
fn pct(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied()
}

/// B's figures in one phase of a scenario.
fn phase(o: &Outcome, heavy: bool) -> serde_json::Value {
    let rs: Vec<&Req> = o.reqs.iter().filter(|r| r.heavy == heavy).collect();
    let mut lat: Vec<f64> = rs.iter().filter_map(|r| r.latency_us).collect();
    lat.sort_by(f64::total_cmp);
    let in_phase = |p: &&Period| (p.start_ms >= o.heavy_from_ms) == heavy;
    let ps: Vec<&Period> = o.periods.iter().filter(in_phase).collect();
    let busy: Vec<&&Period> = ps.iter().filter(|p| !p.idle || p.received_us > 0.0).collect();
    let mean = |v: &[&&Period]| v.iter().map(|p| p.received_us).sum::<f64>() / v.len().max(1) as f64;
    json!({
        "requests": rs.len(),
        "replies": lat.len(),
        "lost": rs.len() - lat.len(),
        "keeps": rs.iter().filter(|r| r.keep && r.latency_us.is_some()).count(),
        "alloc_failed": rs.iter().filter(|r| r.alloc_failed).count(),
        "latency_us": {"p50": pct(&lat, 0.5), "p99": pct(&lat, 0.99), "max": lat.last()},
        "b_vp_periods": ps.len(),
        "b_vp_cpu_us_per_period": mean(&busy),
        "b_vp_slack_us": ps.iter().map(|p| p.slack_us).sum::<f64>(),
    })
}

/// Runs `anode experiment fig16-node`.
pub fn run(a: Fig16NodeArgs) -> Result<std::process::ExitCode> {
    if !(0.5..=120.0).contains(&a.seconds) {
        bail!("--seconds must be 0.5..=120");
    }
    if a.heap < 256 << 10 {
        bail!("--heap must be at least 256 KiB (two modules' memories and B's 64 KiB result)");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let work = std::env::temp_dir().join(format!("anode-fig16-node-{}", std::process::id()));
    let mut all = Vec::new();
    for shared in [true, false] {
        let o = scenario(&a, shared, &work)?;
        eprintln!(
            "{}: A light {}\n{}: A heavy {}\n{}: node {}",
            o.name,
            phase(&o, false),
            o.name,
            phase(&o, true),
            o.name,
            json!({"jobs_busy": o.counters["jobs_busy"], "jobs_helped": o.counters["jobs_helped"]})
        );
        all.push(o);
    }
    let _ = std::fs::remove_dir_all(&work);
    let mut csv = String::from(
        "# fig16-node: B's requests (one row each); latency empty = no reply\n\
         scenario,sent_ms,a_heavy,latency_us,keep,alloc_failed,heap_used\n",
    );
    let mut pcsv = String::from("scenario,vp,start_ms,end_ms,received_us,slack_us,idle\n");
    let mut summary = Vec::new();
    for o in &all {
        for r in &o.reqs {
            let lat = r.latency_us.map_or(String::new(), |l| format!("{l:.0}"));
            csv.push_str(&format!(
                "{},{:.3},{},{lat},{},{},{}\n",
                o.name, r.sent_ms, r.heavy, r.keep, r.alloc_failed, r.heap_used
            ));
        }
        for (vp, ps) in [("B", &o.periods), ("A", &o.a_periods)] {
            for p in ps {
                pcsv.push_str(&format!(
                    "{},{vp},{:.3},{:.3},{:.1},{:.1},{}\n",
                    o.name, p.start_ms, p.end_ms, p.received_us, p.slack_us, p.idle
                ));
            }
        }
        summary.push(json!({
            "scenario": o.name,
            "shared": o.shared,
            "a_light": phase(o, false),
            "a_heavy": phase(o, true),
            "node": o.counters,
        }));
    }
    let args = json!({"seconds": a.seconds, "b_work": a.b_work, "keep_every": a.keep_every,
                      "a_light": a.a_light, "a_heavy": a.a_heavy, "heap": a.heap});
    let files = [
        ("fig16-node.csv", csv),
        ("fig16-node-periods.csv", pcsv),
        ("fig16-node-summary.json", serde_json::to_string_pretty(&json!({"args": args, "scenarios": summary}))?),
    ];
    for (f, text) in files {
        let p = a.out.join(f);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    let png = a.out.join("fig16-node.png");
    plot(&all, &png)?;
    eprintln!("wrote {}/fig16-node{{.csv,-periods.csv,-summary.json,.png}}", a.out.display());
    Ok(std::process::ExitCode::SUCCESS)
}

const BLUE: RGBColor = RGBColor(31, 119, 180);
const RED: RGBColor = RGBColor(214, 39, 40);
const ORANGE: RGBColor = RGBColor(255, 127, 14);
const GREY: RGBColor = RGBColor(127, 127, 127);

fn plot(all: &[Outcome], out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (1400, 760)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = all.iter().flat_map(|o| o.reqs.last()).map(|r| r.sent_ms / 1e3).fold(0.5, f64::max) * 1.02;
    let lat_max = all
        .iter()
        .flat_map(|o| o.reqs.iter().filter_map(|r| r.latency_us))
        .map(|l| l / 1e3)
        .fold(2.0, f64::max)
        .min(200.0);
    let cpu_max = 105.0;
    let areas = root.split_evenly((2, all.len()));
    for (col, o) in all.iter().enumerate() {
        let (Some(top), Some(bottom)) = (areas.get(col), areas.get(all.len() + col)) else { continue };
        let heavy = o.heavy_from_ms / 1e3;
        let mut c = ChartBuilder::on(top)
            .caption(format!("{}: CPU per period, % of one CPU (B: 1 ms in 4 ms = 25 %)", o.name), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..cpu_max)
            .map_err(|x| e(&x))?;
        c.configure_mesh().x_desc("time (s)").y_desc("%").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
        // B's per 4 ms period (an overrun shows above 25 %, repaid next period).
        let pts: Vec<(f64, f64)> = o.periods.iter().map(|p| (p.start_ms / 1e3, p.received_us / 40.0)).collect();
        c.draw_series(LineSeries::new(pts, BLUE.stroke_width(1)))
            .map_err(|x| e(&x))?
            .label("B's VP, per 4 ms period (node's period log)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        let a_pts: Vec<(f64, f64)> = o
            .a_periods
            .iter()
            .map(|p| (p.start_ms / 1e3, p.received_us / 10.0 / (p.end_ms - p.start_ms).max(4.0)))
            .collect();
        c.draw_series(LineSeries::new(a_pts, ORANGE.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label("A's VP (best effort), per 100 ms period")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ORANGE.stroke_width(2)));
        c.draw_series(LineSeries::new(vec![(heavy, 0.0), (heavy, cpu_max)], GREY.stroke_width(1)))
            .map_err(|x| e(&x))?
            .label("A turns heavy")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREY.stroke_width(2)));
        super::plot::legend(&mut c, SeriesLabelPosition::MiddleLeft, 13).map_err(|x| e(&x))?;
        let mut c = ChartBuilder::on(bottom)
            .caption(format!("{}: B's request latency (x lost, o allocation refused)", o.name), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..lat_max * 1.08)
            .map_err(|x| e(&x))?;
        c.configure_mesh().x_desc("time (s)").y_desc("ms").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
        c.draw_series(
            o.reqs
                .iter()
                .filter_map(|r| r.latency_us.map(|l| (r.sent_ms / 1e3, (l / 1e3).min(lat_max))))
                .map(|p| Circle::new(p, 2, BLUE.filled())),
        )
        .map_err(|x| e(&x))?;
        c.draw_series(
            o.reqs
                .iter()
                .filter(|r| r.alloc_failed)
                .map(|r| Circle::new((r.sent_ms / 1e3, lat_max * 1.02), 4, ORANGE.stroke_width(2))),
        )
        .map_err(|x| e(&x))?;
        c.draw_series(
            o.reqs
                .iter()
                .filter(|r| r.latency_us.is_none())
                .map(|r| Cross::new((r.sent_ms / 1e3, lat_max * 1.05), 4, RED.stroke_width(2))),
        )
        .map_err(|x| e(&x))?;
        c.draw_series(LineSeries::new(vec![(heavy, 0.0), (heavy, lat_max * 1.08)], GREY.stroke_width(1)))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_spec_is_eleven_bytes_with_its_prefix() {
        let s = spec(b'B', 64);
        assert_eq!(s, "\\01\\00\\13\\88\\00\\00\\00\\40\\01\\42\\00");
    }

    #[test]
    fn the_period_log_is_read_for_one_vp_from_its_first_period() {
        let log = "vp,session,start_ns,end_ns,slice_ns,received_ns,slack_ns,idle\n\
                   3.1,2.1,1000000,5000000,1000000,500000,0,1\n\
                   4.1,2.1,1000000,5000000,1000000,900000,0,0\n\
                   3.1,2.1,5000000,9000000,1000000,1000000,0,0\n";
        assert_eq!(first_served(log, "3.1"), 1_000_000);
        assert_eq!(first_served(log, "9.1"), 0);
        let p = periods_of(log, "3.1", 1_000_000);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].start_ms, 0.0);
        assert_eq!(p[1].start_ms, 4.0);
        assert_eq!(p[1].received_us, 1000.0);
        assert!(p[0].idle && !p[1].idle);
        assert_eq!(periods_of(log, "3.1", 2_000_000).len(), 1);
    }
}
