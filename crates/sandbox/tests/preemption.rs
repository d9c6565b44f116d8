//! Preemptible invocations: a CPU-bound invocation stops at a preemption
//! point when the caller says so, resumes exactly where it stopped, keeps
//! its fuel bound across slices, and holds only its own principal's store.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{ModuleHash, PrincipalId, RequestedLimits};
use anode_sandbox::{InvokeError, Job, JobKind, LoadError, LoadSpec, SandboxConfig, Step};
use common::*;

fn spec<'a>(code: &'a [u8], cred: Option<&'a [u8]>) -> LoadSpec<'a> {
    LoadSpec { code, credential: cred, requester: None, local_name: None, limits: RequestedLimits::default() }
}

fn job(module: anode_sandbox::ModuleId, entry: &str, input: &[u8]) -> Job {
    Job::new(module, JobKind::Entry { entry: entry.into(), arg: 0 }, input.to_vec(), 0)
}

/// A loop of `n` iterations that returns its count: work with a known end.
fn counted_loop() -> Vec<u8> {
    wat(r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "run")
        (func $run (param i32 i32) (result i32) (local $i i32)
          (loop $l
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 500000))))
          (local.get $i))
        (table (export "__indirect_function_table") 1 funcref)
        (elem (i32.const 0) $run)
        (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 0)))))"#)
}

#[test]
fn a_preempted_invocation_resumes_where_it_stopped() {
    let mut sb = sandbox();
    let code = counted_loop();
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.cpu = Some(10_000_000);
    let id = match sb.load(now(0), &s) {
        Ok(id) => id,
        Err(e) => panic!("load: {e}"),
    };
    // Without preemption: runs to its end.
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Ok(500_000));
    // Stopped at the first preemption point, then resumed slice by slice.
    let mut task = sb.start(now(2), job(id, "run", b"")).unwrap().unwrap();
    let mut slices = 0;
    let r = loop {
        slices += 1;
        let mut points = 0;
        match sb.resume(
            task,
            &mut || {
                points += 1;
                points < 3
            },
            &mut out,
        ) {
            Step::Done(r) => break r,
            Step::Yielded(t) => task = t,
        }
        assert!(slices < 10_000, "never finished");
    };
    assert_eq!(r, Ok(500_000), "the same result as an uninterrupted run");
    assert!(slices > 1, "a 500k-iteration loop crosses several preemption points");
    assert!(sb.counters().preempted >= (slices - 1) as u64);
    assert_eq!(sb.module(id).unwrap().counters.ok, 2);
}

#[test]
fn a_spinning_invocation_keeps_its_fuel_bound_across_slices() {
    let mut sb = sandbox();
    let code = module("spin");
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.cpu = Some(1_000_000);
    let id = sb.load(now(0), &s).unwrap();
    let mut task = sb.start(now(1), job(id, "run", b"")).unwrap().unwrap();
    let mut out = Vec::new();
    let mut slices = 0;
    let r = loop {
        slices += 1;
        match sb.resume(task, &mut || false, &mut out) {
            Step::Done(r) => break r,
            Step::Yielded(t) => task = t,
        }
        assert!(slices < 1000, "the fuel bound did not hold");
    };
    assert_eq!(r, Err(InvokeError::CpuExhausted));
    // 1M fuel at one preemption point every DEFAULT_YIELD_FUEL units.
    let expect = 1_000_000 / anode_sandbox::DEFAULT_YIELD_FUEL;
    assert!(slices as u64 >= expect - 1 && slices as u64 <= expect + 2, "{slices} slices");
    assert_eq!(sb.module(id).unwrap().counters.cpu_exhausted, 1);
}

#[test]
fn a_suspended_task_holds_only_its_principals_store() {
    let mut sb = sandbox();
    let spin = module("spin");
    let c = admin(user());
    let mut s = spec(&spin, Some(c.to_bytes()));
    s.limits.cpu = Some(10_000_000);
    let id = sb.load(now(0), &s).unwrap();
    let task = sb.start(now(1), job(id, "run", b"")).unwrap().unwrap();
    let mut out = Vec::new();
    let Step::Yielded(task) = sb.resume(task, &mut || false, &mut out) else { panic!("spin ended") };
    // Another principal runs meanwhile.
    let ctr_code = module("counter");
    let other = admin(PrincipalId([77; 32]));
    let ctr = sb.load(now(2), &spec(&ctr_code, Some(other.to_bytes()))).unwrap();
    assert_eq!(sb.invoke(now(2), ctr, "incr", b"k", &mut out), Ok(1));
    // The same principal's other work waits: typed refusals.
    assert_eq!(sb.start(now(2), job(id, "run", b"")).unwrap_err(), InvokeError::Busy);
    let ctr2 = spec(&ctr_code, Some(c.to_bytes()));
    assert_eq!(sb.load(now(2), &ctr2).unwrap_err(), LoadError::Busy);
    // Unloaded while suspended: the task ends without effect, the store is freed.
    assert!(sb.unload(id));
    let r = match sb.resume(task, &mut || true, &mut out) {
        Step::Done(r) => r,
        Step::Yielded(_) => panic!("keep_going said go on"),
    };
    assert!(r.is_err(), "{r:?}");
    assert_eq!(sb.memory_used(&user()), 0);
    // The principal can load again.
    let again = sb.load(now(3), &spec(&ctr_code, Some(c.to_bytes()))).unwrap();
    assert_eq!(sb.invoke(now(3), again, "incr", b"k", &mut out), Ok(1));
    assert!(sb.module(id).is_none());
    let _ = ModuleHash::of(&spin);
}

#[test]
fn alarms_and_channels_become_jobs_that_skip_cancelled_work() {
    let mut sb = sandbox_with(SandboxConfig::default(), line_routes(1, 1));
    let code = module("channel");
    let c = admin(user());
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut jobs = Vec::new();
    assert_eq!(sb.channel_jobs(addr(2), 4000, b"nope", &mut jobs), 0, "the prefix does not match");
    let n = sb.channel_jobs(addr(2), 4000, b"hi there", &mut jobs);
    assert_eq!(n, 1);
    let mut out = Vec::new();
    for j in jobs.drain(..) {
        let t = sb.start(now(1), j).unwrap().unwrap();
        assert!(matches!(sb.resume(t, &mut || true, &mut out), Step::Done(Ok(_))));
    }
    assert_eq!(sb.counters().channel_deliveries, 1);
    // The alarm armed at init (100 ms) is due at 100, not before.
    sb.due_jobs(now(99), &mut jobs);
    assert!(jobs.is_empty());
    sb.due_jobs(now(100), &mut jobs);
    assert_eq!(jobs.len(), 1);
    let alarm = jobs.pop().unwrap();
    // Closing the channel makes a queued packet job a no-op.
    sb.channel_jobs(addr(2), 4000, b"hi again", &mut jobs);
    let t = sb.start(now(100), job(id, "close", b"")).unwrap().unwrap();
    assert!(matches!(sb.resume(t, &mut || true, &mut out), Step::Done(Ok(_))));
    assert!(!sb.has_channels(), "the close reached the demux index");
    assert!(sb.start(now(100), jobs.pop().unwrap()).unwrap().is_none(), "closed channel: nothing to run");
    // The alarm job runs its entry once; a second start of it finds it gone.
    let t = sb.start(now(100), alarm.clone()).unwrap().unwrap();
    assert!(matches!(sb.resume(t, &mut || true, &mut out), Step::Done(Ok(_))));
    assert!(sb.start(now(100), alarm).unwrap().is_none());
    assert_eq!(sb.counters().alarms_fired, 1);
}

#[test]
fn a_failed_init_leaves_no_handles_behind() {
    // Arms the principal's every alarm, then traps: nothing may remain
    // counted against the principal.
    let mut sb = sandbox();
    let c = admin(user());
    // A module of the principal's already lives in its store (else a
    // failed load frees the store, and the question does not arise).
    let counter = module("counter");
    sb.load(now(0), &spec(&counter, Some(c.to_bytes()))).unwrap();
    let bad = wat(r#"(module
        (import "time" "set_alarm" (func $set (param i64 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "x")
        (func (export "anode_init") (local $i i32)
          (loop $l
            (drop (call $set (i64.const 1000) (i32.const 0) (i32.const 1)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 100))))
          unreachable))"#);
    assert!(matches!(sb.load(now(0), &spec(&bad, Some(c.to_bytes()))), Err(LoadError::InitFailed(_))));
    // The same principal can still arm alarms: the channel module arms one at init.
    let code = module("channel");
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut jobs = Vec::new();
    sb.due_jobs(now(100), &mut jobs);
    assert_eq!(jobs.len(), 1, "the new module's alarm was armed");
    assert!(sb.module(id).is_some());
}

/// A loop of 10,000 cheap host calls (`anode.input_read` of nothing).
fn host_call_loop() -> Vec<u8> {
    wat(r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "run")
        (func $run (param i32 i32) (result i32) (local $i i32)
          (loop $l
            (drop (call $in (i32.const 0) (i32.const 0) (i32.const 0)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 10000))))
          (local.get $i))
        (table (export "__indirect_function_table") 1 funcref)
        (elem (i32.const 0) $run)
        (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 0)))))"#)
}

/// Charging a host call's fuel must not restart wasmtime's yield interval
/// each time: a module that calls the host more often than once per
/// interval would then never reach a preemption point and could hold the
/// CPU past its slice (found by the pods work: 10,000 calls, 0 points).
#[test]
fn a_module_calling_the_host_in_a_loop_still_reaches_preemption_points_and_pays_for_its_calls() {
    let mut sb = sandbox();
    let code = host_call_loop();
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.cpu = Some(10_000_000);
    let id = sb.load(now(0), &s).unwrap();
    let mut out = Vec::new();
    let task = sb.start(now(1), job(id, "run", b"")).unwrap().unwrap();
    // Asked to stop at the first point: it must stop before its end.
    let mut task = match sb.resume(task, &mut || false, &mut out) {
        Step::Yielded(t) => t,
        Step::Done(r) => panic!("ran to its end ({r:?}) without a preemption point"),
    };
    let mut points = 1;
    let r = loop {
        match sb.resume(task, &mut || false, &mut out) {
            Step::Done(r) => break r,
            Step::Yielded(t) => {
                points += 1;
                task = t;
            }
        }
        assert!(points < 10_000, "never finished");
    };
    assert_eq!(r, Ok(10_000));
    assert!(points >= 2, "{points} preemption points");
    // Every call's fuel is charged, the owed part included.
    let mut inv = Vec::new();
    sb.take_invocations(&mut inv);
    let fuel = inv.last().unwrap().fuel;
    let host = 10_000 * anode_sandbox::DEFAULT_HOST_CALL_FUEL;
    assert!(fuel >= host && fuel < host + 1_000_000, "charged {fuel} fuel for {host} of host calls");
    // A grant too small for the calls ends the invocation, preempted or not.
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.cpu = Some(2_000_000);
    let mut sb = sandbox();
    let small = sb.load(now(2), &s).unwrap();
    assert_eq!(sb.invoke(now(3), small, "run", b"", &mut out), Err(InvokeError::CpuExhausted));
}
