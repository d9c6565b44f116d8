//! The heap test module (issue 15, RCANE §IV-E): a module that grows its
//! memory in every way a hostile one would, and a well-behaved service to
//! watch beside it.
#![allow(dead_code, clippy::unwrap_used)]

use anode_cred::{PrincipalId, RequestedLimits};
use anode_sandbox::{Action, InvokeError, Job, JobKind, LoadSpec, ModuleId, Sandbox, Step};

use super::*;

/// Entries (argument `arg`, as a job's `JobKind::Entry { arg }`):
/// - `bomb`: grows 4 pages (256 KiB) at a time until refused, then traps
///   (as Rust code does when allocation fails);
/// - `creep`: grows one page at a time forever, ignoring refusals (ends
///   on its CPU bound);
/// - `grow`: grows `arg` pages once; returns `memory.grow`'s answer;
/// - `touch_all`: grows one page at a time until refused, writing every
///   new page (so it is resident); returns the pages it has;
/// - `mark`: writes 7 to the first byte of every page; `sum`: the sum of
///   those bytes (7 × pages while nothing else wrote there);
/// - `listen`: opens a channel on port `arg` (every payload) to `pkt`;
/// - `pkt`: counts a packet; `pkts`: the count;
/// - `fill`: puts soft-state entries of 1000 bytes until refused; returns
///   how many it put;
/// - `heap_pressure`: counts the call (mode 0) or spins forever (mode 1);
///   `pcount`: the count; `hostile`: sets mode 1;
/// - `ask`: `session.heap_request(arg × 1024)`; `ask_twice`: the same
///   twice (the second's answer); `reserved`:
///   `session.heap_reserved()` in KiB (or the error code).
pub const HEAP_WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "net" "open_channel" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "state" "put" (func $put (param i32 i32 i32 i32 i64) (result i32)))
  (import "session" "heap_request" (func $ask (param i64) (result i32)))
  (import "session" "heap_reserved" (func $reserved (result i64)))
  (memory (export "memory") 1)
  (global $pkts (mut i32) (i32.const 0))
  (global $pcount (mut i32) (i32.const 0))
  (global $mode (mut i32) (i32.const 0))
  (global $key (mut i32) (i32.const 0))
  (data (i32.const 0) "bomb")
  (data (i32.const 8) "creep")
  (data (i32.const 16) "grow")
  (data (i32.const 24) "touch_all")
  (data (i32.const 40) "mark")
  (data (i32.const 48) "sum")
  (data (i32.const 56) "listen")
  (data (i32.const 64) "pkt")
  (data (i32.const 72) "pkts")
  (data (i32.const 80) "fill")
  (data (i32.const 88) "heap_pressure")
  (data (i32.const 104) "pcount")
  (data (i32.const 112) "hostile")
  (data (i32.const 120) "ask")
  (data (i32.const 128) "reserved")
  (data (i32.const 144) "ask_twice")
  (func $bomb (param i32 i32) (result i32)
    (loop $l (br_if $l (i32.ne (memory.grow (i32.const 4)) (i32.const -1))))
    unreachable)
  (func $creep (param i32 i32) (result i32)
    (loop $l (drop (memory.grow (i32.const 1))) (br $l))
    (i32.const 0))
  (func $grow (param i32 i32) (result i32) (memory.grow (local.get 0)))
  (func $touch_all (param i32 i32) (result i32) (local $p i32)
    (block $done
      (loop $l
        (local.set $p (memory.grow (i32.const 1)))
        (br_if $done (i32.eq (local.get $p) (i32.const -1)))
        ;; one byte in each 4 KiB of the new page
        (i32.store8 (i32.mul (local.get $p) (i32.const 65536)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 4096)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 8192)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 12288)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 16384)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 20480)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 24576)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 28672)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 32768)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 36864)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 40960)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 45056)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 49152)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 53248)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 57344)) (i32.const 1))
        (i32.store8 (i32.add (i32.mul (local.get $p) (i32.const 65536)) (i32.const 61440)) (i32.const 1))
        (br $l)))
    (memory.size))
  (func $mark (param i32 i32) (result i32) (local $i i32)
    (loop $l
      (i32.store8 (i32.add (i32.mul (local.get $i) (i32.const 65536)) (i32.const 1000)) (i32.const 7))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (memory.size))))
    (i32.const 0))
  (func $sum (param i32 i32) (result i32) (local $i i32) (local $s i32)
    (loop $l
      (local.set $s (i32.add (local.get $s)
        (i32.load8_u (i32.add (i32.mul (local.get $i) (i32.const 65536)) (i32.const 1000)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (memory.size))))
    (local.get $s))
  (func $listen (param i32 i32) (result i32)
    (call $open (local.get 0) (i32.const 0) (i32.const 0) (i32.const 64) (i32.const 3)))
  (func $pkt (param i32 i32) (result i32)
    (global.set $pkts (i32.add (global.get $pkts) (i32.const 1))) (i32.const 0))
  (func $pkts_f (param i32 i32) (result i32) (global.get $pkts))
  (func $fill (param i32 i32) (result i32) (local $n i32)
    (block $done
      (loop $l
        (global.set $key (i32.add (global.get $key) (i32.const 1)))
        (i32.store (i32.const 2000) (global.get $key))
        (br_if $done (i32.ne (call $put (i32.const 2000) (i32.const 4) (i32.const 3000) (i32.const 1000) (i64.const 0))
                             (i32.const 0)))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $l)))
    (local.get $n))
  (func $pressure (param i32 i32) (result i32)
    (if (i32.eq (global.get $mode) (i32.const 1)) (then (loop $spin (br $spin))))
    (global.set $pcount (i32.add (global.get $pcount) (i32.const 1)))
    (i32.const 0))
  (func $pcount_f (param i32 i32) (result i32) (global.get $pcount))
  (func $hostile (param i32 i32) (result i32) (global.set $mode (i32.const 1)) (i32.const 0))
  (func $ask_f (param i32 i32) (result i32) (call $ask (i64.mul (i64.extend_i32_u (local.get 0)) (i64.const 1024))))
  (func $reserved_f (param i32 i32) (result i32) (local $r i64)
    (local.set $r (call $reserved))
    (if (result i32) (i64.lt_s (local.get $r) (i64.const 0))
      (then (i32.wrap_i64 (local.get $r)))
      (else (i32.wrap_i64 (i64.div_u (local.get $r) (i64.const 1024))))))
  (func $ask_twice (param i32 i32) (result i32)
    (drop (call $ask_f (local.get 0) (local.get 1)))
    (call $ask_f (local.get 0) (local.get 1)))
  (table (export "__indirect_function_table") 16 funcref)
  (elem (i32.const 0) $bomb $creep $grow $touch_all $mark $sum $listen $pkt $pkts_f $fill $pressure $pcount_f
        $hostile $ask_f $reserved_f $ask_twice)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 5) (i32.const 1)))
    (drop (call $reg (i32.const 16) (i32.const 4) (i32.const 2)))
    (drop (call $reg (i32.const 24) (i32.const 9) (i32.const 3)))
    (drop (call $reg (i32.const 40) (i32.const 4) (i32.const 4)))
    (drop (call $reg (i32.const 48) (i32.const 3) (i32.const 5)))
    (drop (call $reg (i32.const 56) (i32.const 6) (i32.const 6)))
    (drop (call $reg (i32.const 64) (i32.const 3) (i32.const 7)))
    (drop (call $reg (i32.const 72) (i32.const 4) (i32.const 8)))
    (drop (call $reg (i32.const 80) (i32.const 4) (i32.const 9)))
    (drop (call $reg (i32.const 88) (i32.const 13) (i32.const 10)))
    (drop (call $reg (i32.const 104) (i32.const 6) (i32.const 11)))
    (drop (call $reg (i32.const 112) (i32.const 7) (i32.const 12)))
    (drop (call $reg (i32.const 120) (i32.const 3) (i32.const 13)))
    (drop (call $reg (i32.const 128) (i32.const 8) (i32.const 14)))
    (drop (call $reg (i32.const 144) (i32.const 9) (i32.const 15)))))"#;

/// The heap module's binary.
pub fn heap_module() -> Vec<u8> {
    wat(HEAP_WAT)
}

/// The same module with other bytes (a second module, not a reload).
pub fn heap_module_2() -> Vec<u8> {
    wat(&HEAP_WAT.replace("(global $key", "(global $other i32 (i32.const 2))\n  (global $key"))
}

/// A principal numbered `n`.
pub fn principal(n: u8) -> PrincipalId {
    PrincipalId([n; 32])
}

/// Loads the heap module for `p` (admin credential, `cpu` fuel per call,
/// 64 MiB of memory granted: the session reservation is what binds).
pub fn load_heap(sb: &mut Sandbox, code: &[u8], p: PrincipalId, cpu: u64) -> ModuleId {
    let c = admin(p);
    let limits = RequestedLimits { cpu: Some(cpu), memory: Some(64 << 20), ..Default::default() };
    let spec = LoadSpec { code, credential: Some(c.to_bytes()), requester: None, local_name: None, limits };
    sb.load(now(0), &spec).unwrap()
}

/// Runs entry `entry` of `id` with argument `arg` to its end.
pub fn run(sb: &mut Sandbox, id: ModuleId, entry: &str, arg: i32, out: &mut Vec<Action>) -> Result<i32, InvokeError> {
    let job = Job::new(id, JobKind::Entry { entry: entry.into(), arg }, Vec::new(), 0);
    run_job(sb, job, out)
}

/// Runs `job` to its end (`Ok(0)` for a job that starts as nothing).
pub fn run_job(sb: &mut Sandbox, job: Job, out: &mut Vec<Action>) -> Result<i32, InvokeError> {
    match sb.start(now(1), job)? {
        None => Ok(0),
        Some(t) => match sb.resume(t, &mut || true, out) {
            Step::Done(r) => r,
            Step::Yielded(_) => unreachable!("keep_going never says stop"),
        },
    }
}
