//! Pods (Expert §3, issue 17): two-phase binding, calls charged to the
//! caller, containment of pods that loop, trap or snoop, nesting and
//! re-entrancy, and the hostile clients of the issue.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{Interface, ModuleGrant, ModuleHash, PrincipalId, RequestedLimits, SigningKey};
use anode_sandbox::pods::{
    E_BADID, E_BUSY, E_CPU, E_DEPTH, E_GONE, E_REFUSED, E_SHORT, E_TRAP, MAX_BINDINGS, MAX_DEPTH, OnFault,
    POD_HOST_CALL_FUEL, PodError,
};
use anode_sandbox::{
    Action, Invocation, InvokeError, Job, JobKind, LoadError, LoadSpec, ModuleId, PodSpec, Sandbox, Step,
};
use common::*;

/// A client module. Entries (input → result):
/// - `bind`: offer name → binding (its buffer: 1024..3072 of its memory);
/// - `call`: binding (4 bytes LE) ‖ payload → `pod.call`'s result; the
///   bytes the pod returned are delivered locally on port 1;
/// - `unbind`: binding → result;
/// - `flood`: offer name; binds 1,000 times, returns how many succeeded.
///
/// It keeps a secret at 8192 that it never passes to a pod.
fn client() -> Vec<u8> {
    wat(r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
        (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
        (import "pod" "call" (func $call (param i32 i32) (result i32)))
        (import "pod" "unbind" (func $unbind (param i32) (result i32)))
        (import "net" "deliver_local" (func $dl (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "bindcallunbindflood")
        (data (i32.const 8192) "CLNTSECRET-of-the-client")
        (func $bindf (param i32 i32) (result i32)
          (drop (call $in (i32.const 512) (i32.const 64) (i32.const 0)))
          (call $bind (i32.const 512) (local.get 1) (i32.const 1024) (i32.const 2048)))
        (func $callf (param i32 i32) (result i32) (local $r i32)
          (drop (call $in (i32.const 512) (i32.const 4) (i32.const 0)))
          (drop (call $in (i32.const 1024) (i32.const 2048) (i32.const 4)))
          (local.set $r (call $call (i32.load (i32.const 512)) (i32.sub (local.get 1) (i32.const 4))))
          (if (i32.gt_s (local.get $r) (i32.const 0))
            (then (drop (call $dl (i32.const 1) (i32.const 1024) (local.get $r)))))
          (local.get $r))
        (func $unbindf (param i32 i32) (result i32)
          (drop (call $in (i32.const 512) (i32.const 4) (i32.const 0)))
          (call $unbind (i32.load (i32.const 512))))
        (func $floodf (param i32 i32) (result i32) (local $i i32) (local $ok i32)
          (drop (call $in (i32.const 512) (i32.const 64) (i32.const 0)))
          (loop $l
            (if (i32.gt_s (call $bind (i32.const 512) (local.get 1) (i32.const 1024) (i32.const 16)) (i32.const 0))
              (then (local.set $ok (i32.add (local.get $ok) (i32.const 1)))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 1000))))
          (local.get $ok))
        (table (export "__indirect_function_table") 4 funcref)
        (elem (i32.const 0) $bindf $callf $unbindf $floodf)
        (func (export "anode_init")
          (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
          (drop (call $reg (i32.const 4) (i32.const 4) (i32.const 1)))
          (drop (call $reg (i32.const 8) (i32.const 6) (i32.const 2)))
          (drop (call $reg (i32.const 14) (i32.const 5) (i32.const 3)))))"#)
}

/// A pod with per-client state. Its buffer is 0..4096. Entries:
/// - `echo`: returns its input;
/// - `count`: returns [calls so far (4 LE)][the binding's state (4 LE)];
/// - `work`: a loop of 10,000 iterations, returns 0;
/// - `spin`: loops forever; `trap`: traps;
/// - `scan`: looks through all of its memory, 4-aligned, for the client's
///   secret marker `CLNT` and returns [hits (4 LE)];
/// - `reach`: loads from an address beyond its memory (traps).
///
/// `pod_bind` accepts every client; the state is the client's number (1, 2, ...).
fn store_pod() -> Vec<u8> {
    wat(r#"(module
        (memory (export "memory") 1)
        (global $clients (mut i32) (i32.const 0))
        (global $calls (mut i32) (i32.const 0))
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 4096))
        (func (export "pod_bind") (param i32) (result i32)
          (global.set $clients (i32.add (global.get $clients) (i32.const 1)))
          (global.get $clients))
        (func $tick (global.set $calls (i32.add (global.get $calls) (i32.const 1))))
        (func (export "offer.echo") (param i32 i32) (result i32) (call $tick) (local.get 1))
        (func (export "offer.count") (param i32 i32) (result i32)
          (call $tick)
          (i32.store (i32.const 0) (global.get $calls))
          (i32.store (i32.const 4) (local.get 0))
          (i32.const 8))
        (func (export "offer.work") (param i32 i32) (result i32) (local $i i32)
          (call $tick)
          (loop $l
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 10000))))
          (i32.const 0))
        (func (export "offer.spin") (param i32 i32) (result i32) (call $tick) (loop $l (br $l)) (i32.const 0))
        (func (export "offer.trap") (param i32 i32) (result i32) (call $tick) unreachable)
        (func (export "offer.scan") (param i32 i32) (result i32) (local $a i32) (local $hits i32)
          (loop $l
            (if (i32.eq (i32.load (local.get $a)) (i32.const 0x544e4c43))
              (then (local.set $hits (i32.add (local.get $hits) (i32.const 1)))))
            (local.set $a (i32.add (local.get $a) (i32.const 4)))
            (br_if $l (i32.lt_u (local.get $a) (i32.sub (i32.mul (memory.size) (i32.const 65536)) (i32.const 4)))))
          (i32.store (i32.const 0) (local.get $hits))
          (i32.const 4))
        (func (export "offer.reach") (param i32 i32) (result i32)
          (i32.load (i32.const 0x7fff0000))))"#)
}

/// A pod that refuses every client.
fn picky_pod() -> Vec<u8> {
    wat(r#"(module
        (memory (export "memory") 1)
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 64))
        (func (export "pod_bind") (param i32) (result i32) (i32.const -1))
        (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#)
}

/// A pod whose `go` binds once to `target` and calls it with nothing; it
/// returns the callee's bytes, or the callee's error code as 4 bytes LE.
fn relay_pod(target: &str) -> Vec<u8> {
    let n = target.len();
    wat(&format!(
        r#"(module
        (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
        (import "pod" "call" (func $call (param i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 2048) "{target}")
        (global $b (mut i32) (i32.const 0))
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 256))
        (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
        (func $fail (param i32) (result i32) (i32.store (i32.const 0) (local.get 0)) (i32.const 4))
        (func (export "offer.go") (param i32 i32) (result i32) (local $r i32)
          (if (i32.eqz (global.get $b)) (then
            (local.set $r (call $bind (i32.const 2048) (i32.const {n}) (i32.const 1024) (i32.const 256)))
            (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (call $fail (local.get $r)))))
            (global.set $b (local.get $r))
            (local.set $r (call $call (global.get $b) (i32.const 0)))
            (if (i32.lt_s (local.get $r) (i32.const 0)) (then
              (global.set $b (i32.const 0))
              (return (call $fail (local.get $r)))))))
          (local.set $r (call $call (global.get $b) (i32.const 0)))
          (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (call $fail (local.get $r)))))
          (memory.copy (i32.const 0) (i32.const 1024) (local.get $r))
          (local.get $r)))"#
    ))
}

fn second_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn second() -> PrincipalId {
    PrincipalId::of(&second_key())
}

fn load_client(sb: &mut Sandbox, p: PrincipalId, cpu: Option<u64>) -> ModuleId {
    let code = client();
    let c = admin(p);
    let spec = LoadSpec {
        code: &code,
        credential: Some(c.to_bytes()),
        requester: None,
        local_name: None,
        limits: RequestedLimits { cpu, ..RequestedLimits::default() },
    };
    sb.load(now(0), &spec).unwrap()
}

fn pod_spec<'a>(code: &'a [u8], cred: &'a [u8], name: &'a str, cpu: Option<u64>) -> PodSpec<'a> {
    PodSpec {
        code,
        credential: Some(cred),
        requester: None,
        name,
        limits: RequestedLimits { cpu, ..RequestedLimits::default() },
        clients: None,
        on_fault: OnFault::Reset,
        min_fuel: 0,
    }
}

fn load_pod(sb: &mut Sandbox, code: &[u8], name: &str, cpu: Option<u64>) -> anode_sandbox::pods::PodId {
    let c = admin(user()).to_bytes().to_vec();
    sb.load_pod(now(0), &pod_spec(code, &c, name, cpu)).unwrap()
}

fn bind(sb: &mut Sandbox, m: ModuleId, offer: &str) -> i32 {
    sb.invoke(now(1), m, "bind", offer.as_bytes(), &mut Vec::new()).unwrap()
}

/// Calls through `binding`; the result and the bytes the pod returned.
fn call(sb: &mut Sandbox, m: ModuleId, binding: i32, payload: &[u8]) -> (Result<i32, InvokeError>, Vec<u8>) {
    let mut input = binding.to_le_bytes().to_vec();
    input.extend_from_slice(payload);
    let mut out = Vec::new();
    let r = sb.invoke(now(2), m, "call", &input, &mut out);
    let bytes = out
        .into_iter()
        .find_map(|a| match a {
            Action::DeliverLocal { port: 1, payload, .. } => Some(payload),
            _ => None,
        })
        .unwrap_or_default();
    (r, bytes)
}

/// Binds to `offer` and completes phase 2.
fn bind_full(sb: &mut Sandbox, m: ModuleId, offer: &str) -> i32 {
    let b = bind(sb, m, offer);
    assert!(b > 0, "bind {offer}: {b}");
    assert_eq!(call(sb, m, b, b"").0, Ok(0), "bind request of {offer}");
    b
}

fn le(b: &[u8], i: usize) -> i32 {
    i32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

#[test]
fn two_phase_binding_then_calls_with_per_client_state() {
    let mut sb = sandbox();
    let pod = load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let b = load_client(&mut sb, second(), None);
    // Phase 1: a temporary binding; the pod has not run.
    let ba = bind(&mut sb, a, "store.count");
    assert!(ba > 0);
    let info = &sb.pods()[0];
    assert_eq!((info.id, info.counters.binds, info.counters.calls), (pod, 1, 0));
    // Phase 2: the first call is the bind request.
    assert_eq!(call(&mut sb, a, ba, b"").0, Ok(0));
    assert_eq!(sb.pods()[0].counters.accepted, 1);
    let bb = bind_full(&mut sb, b, "store.count");
    // Calls carry the per-client state the pod chose at bind time.
    let (r, bytes) = call(&mut sb, a, ba, b"");
    assert_eq!(r, Ok(8));
    assert_eq!((le(&bytes, 0), le(&bytes, 4)), (1, 1), "first call, first client");
    let (_, bytes) = call(&mut sb, b, bb, b"");
    assert_eq!((le(&bytes, 0), le(&bytes, 4)), (2, 2), "second call, second client");
    // Arguments travel through the negotiated buffer and come back.
    let be = bind_full(&mut sb, a, "store.echo");
    let (r, bytes) = call(&mut sb, a, be, b"hello pod");
    assert_eq!((r, bytes.as_slice()), (Ok(9), &b"hello pod"[..]));
    // Longer than the negotiated length (the client's 2,048-byte region): refused, pod not entered.
    assert_eq!(call(&mut sb, a, be, &[7u8; 2996]).0, Ok(-1));
    let (r, bytes) = call(&mut sb, a, ba, b"");
    assert_eq!((r, le(&bytes, 0)), (Ok(8), 4), "the refused call never ran in the pod");
    assert_eq!(sb.pod_bindings(a), 2);
}

#[test]
fn forged_foreign_and_stale_bindings_reach_the_error_path() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let b = load_client(&mut sb, second(), None);
    let ba = bind_full(&mut sb, a, "store.count");
    // Another client's identifier means nothing in b's table.
    assert_eq!(call(&mut sb, b, ba, b"").0, Ok(E_BADID));
    // Made-up identifiers around and far from the real one.
    let mut forged = vec![0, -1, i32::MIN, i32::MAX, ba + 1, ba - 1, ba ^ (1 << 16), ba + (1 << 16)];
    forged.extend((1..300).map(|i| i * 7919));
    for f in forged.into_iter().filter(|&f| f != ba) {
        assert_eq!(call(&mut sb, a, f, b"").0, Ok(E_BADID), "forged {f:#x}");
    }
    let calls = sb.pods()[0].counters.calls;
    assert_eq!(calls, 1, "no forged call reached the pod (only the bind request)");
    // Stale after unbind, and a new binding in the same slot is a new identifier.
    assert_eq!(sb.invoke(now(3), a, "unbind", &ba.to_le_bytes(), &mut Vec::new()), Ok(0));
    assert_eq!(call(&mut sb, a, ba, b"").0, Ok(E_BADID));
    assert_eq!(sb.invoke(now(3), a, "unbind", &ba.to_le_bytes(), &mut Vec::new()), Ok(E_BADID));
    let ba2 = bind_full(&mut sb, a, "store.count");
    assert_ne!(ba2, ba);
    assert_eq!(call(&mut sb, a, ba, b"").0, Ok(E_BADID));
    assert!(sb.pod_counters().bad_binding >= 300);
    // Unloading the client forgets its table.
    assert!(sb.unload(a));
    assert_eq!(sb.pod_bindings(a), 0);
}

#[test]
fn offers_access_lists_and_refusing_pods() {
    let mut sb = sandbox();
    let a = load_client(&mut sb, user(), None);
    // No such pod or entry; malformed names.
    for name in ["nope.x", "store.nope", "store", ".x", "a.b.c"] {
        assert_eq!(bind(&mut sb, a, name), -4, "{name}");
    }
    // The pod refuses in phase 2: the binding is gone.
    load_pod(&mut sb, &picky_pod(), "picky", None);
    let b = bind(&mut sb, a, "picky.x");
    assert!(b > 0);
    assert_eq!(call(&mut sb, a, b, b"").0, Ok(E_REFUSED));
    assert_eq!(call(&mut sb, a, b, b"").0, Ok(E_BADID));
    assert_eq!(sb.pods()[0].counters.refused, 1);
    // The access list is checked at phase 1, against the client's principal.
    let c = admin(user()).to_bytes().to_vec();
    let code = store_pod();
    let mut s = pod_spec(&code, &c, "private", None);
    s.clients = Some(vec![second()]);
    sb.load_pod(now(0), &s).unwrap();
    assert_eq!(bind(&mut sb, a, "private.echo"), E_REFUSED);
    let other = load_client(&mut sb, second(), None);
    bind_full(&mut sb, other, "private.echo");
    let private = sb.pods().into_iter().find(|p| p.name == "private").unwrap();
    assert_eq!((private.counters.denied, private.counters.accepted), (1, 1));
}

#[test]
fn a_pod_that_loops_is_cut_off_and_reset_and_the_caller_carries_on() {
    let mut sb = sandbox();
    // The pod may spend 100,000 per call; the caller has 10,000,000.
    load_pod(&mut sb, &store_pod(), "store", Some(100_000));
    let a = load_client(&mut sb, user(), None);
    let bc = bind_full(&mut sb, a, "store.count");
    let (_, bytes) = call(&mut sb, a, bc, b"");
    assert_eq!(le(&bytes, 0), 1);
    let bs = bind_full(&mut sb, a, "store.spin");
    let mut recs = Vec::new();
    sb.take_invocations(&mut recs);
    assert_eq!(call(&mut sb, a, bs, b"").0, Ok(E_CPU), "the caller's invocation goes on and sees the error");
    sb.take_invocations(&mut recs);
    let last: &Invocation = recs.last().unwrap();
    assert!(last.ok && last.fuel >= 100_000, "the pod's cut-off time is charged to the caller: {last:?}");
    let p = &sb.pods()[0];
    assert_eq!((p.counters.cut_off, p.counters.resets), (1, 1));
    // Reset: bindings to the old instance are gone, its state is fresh.
    assert_eq!(call(&mut sb, a, bc, b"").0, Ok(E_GONE));
    assert_eq!(call(&mut sb, a, bc, b"").0, Ok(E_BADID));
    let bc = bind_full(&mut sb, a, "store.count");
    let (_, bytes) = call(&mut sb, a, bc, b"");
    assert_eq!((le(&bytes, 0), le(&bytes, 4)), (1, 1), "counters start again after the reset");
}

#[test]
fn a_pod_spends_at_most_what_its_caller_has_left() {
    let mut sb = sandbox();
    // The pod may spend 10,000,000 per call, the caller only 200,000 per invocation.
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), Some(200_000));
    let bs = bind_full(&mut sb, a, "store.spin");
    let mut recs = Vec::new();
    sb.take_invocations(&mut recs);
    let (r, _) = call(&mut sb, a, bs, b"");
    // The caller has no fuel left: it either traps at its next fuel check
    // or returns the error code if it has none before its end (this one).
    assert!(matches!(r, Ok(E_CPU) | Err(InvokeError::CpuExhausted)), "{r:?}");
    sb.take_invocations(&mut recs);
    let last = recs.last().unwrap();
    assert_eq!(last.fuel, 200_000, "the invocation used its whole budget, no more: {last:?}");
    let p = &sb.pods()[0];
    assert!(p.counters.cut_off == 1 && p.counters.fuel < 200_000, "{:?}", p.counters);
}

#[test]
fn a_pod_with_a_minimum_refuses_callers_too_short_to_finish() {
    let mut sb = sandbox();
    let c = admin(user()).to_bytes().to_vec();
    let code = store_pod();
    let mut s = pod_spec(&code, &c, "store", None);
    s.min_fuel = 1_000_000;
    sb.load_pod(now(0), &s).unwrap();
    let rich = load_client(&mut sb, user(), None);
    let poor = load_client(&mut sb, second(), Some(200_000));
    let br = bind_full(&mut sb, rich, "store.count");
    // The poor client cannot even complete its bind: the pod is not entered.
    let bp = bind(&mut sb, poor, "store.spin");
    assert_eq!(call(&mut sb, poor, bp, b"").0, Ok(E_SHORT));
    let p = &sb.pods()[0];
    assert_eq!((p.counters.short, p.counters.resets, p.counters.cut_off), (1, 0, 0));
    // So it cannot cut the pod off and reset it under the other client.
    let (r, bytes) = call(&mut sb, rich, br, b"");
    assert_eq!((r, le(&bytes, 4)), (Ok(8), 1), "the rich client's binding and state survive");
}

#[test]
fn time_in_a_pod_is_charged_to_its_caller() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let be = bind_full(&mut sb, a, "store.echo");
    let bw = bind_full(&mut sb, a, "store.work");
    let mut recs = Vec::new();
    sb.take_invocations(&mut recs);
    recs.clear();
    let f0 = sb.pods()[0].counters.fuel;
    let _ = call(&mut sb, a, be, b"");
    let f1 = sb.pods()[0].counters.fuel;
    let _ = call(&mut sb, a, bw, b"");
    let f2 = sb.pods()[0].counters.fuel;
    sb.take_invocations(&mut recs);
    let (echo, work) = (recs[0].fuel, recs[1].fuel);
    let (pod_echo, pod_work) = (f1 - f0, f2 - f1);
    assert!(pod_work > 20_000, "10,000 iterations: {pod_work}");
    // The caller's invocations differ by exactly what the pod spent.
    assert_eq!(work - echo, pod_work - pod_echo, "caller {echo}/{work}, pod {pod_echo}/{pod_work}");
}

#[test]
fn a_pods_own_host_calls_cost_it_host_call_fuel_which_its_caller_pays() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    load_pod(&mut sb, &relay_pod("store.echo"), "relay", None);
    let a = load_client(&mut sb, user(), None);
    let b = bind_full(&mut sb, a, "relay.go");
    // The first call binds the relay to the store; time the second.
    let _ = call(&mut sb, a, b, b"");
    let fuel = |sb: &Sandbox, name: &str| sb.pods().iter().find(|p| p.name == name).unwrap().counters.fuel;
    let (r0, s0) = (fuel(&sb, "relay"), fuel(&sb, "store"));
    let (r, _) = call(&mut sb, a, b, b"");
    assert_eq!(r, Ok(0));
    let (relay, store) = (fuel(&sb, "relay") - r0, fuel(&sb, "store") - s0);
    // The relay spent the store's call, its one `pod.call` and a few
    // instructions of its own.
    let own = relay.checked_sub(store + POD_HOST_CALL_FUEL).unwrap_or_else(|| panic!("relay {relay}, store {store}"));
    assert!(own < 200, "relay {relay}, store {store}: {own} of its own");
}

#[test]
fn a_pod_that_traps_is_contained_and_reset() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let bc = bind_full(&mut sb, a, "store.count");
    let _ = call(&mut sb, a, bc, b"");
    let _ = call(&mut sb, a, bc, b"");
    let bt = bind_full(&mut sb, a, "store.trap");
    assert_eq!(call(&mut sb, a, bt, b"").0, Ok(E_TRAP));
    assert_eq!(sb.pods()[0].counters.traps, 1);
    let bc = bind_full(&mut sb, a, "store.count");
    let (_, bytes) = call(&mut sb, a, bc, b"");
    assert_eq!(le(&bytes, 0), 1, "the instance is the initial one again");
    // A retiring pod is unloaded instead.
    let c = admin(user()).to_bytes().to_vec();
    let code = store_pod();
    let mut s = pod_spec(&code, &c, "brittle", None);
    s.on_fault = OnFault::Retire;
    sb.load_pod(now(0), &s).unwrap();
    let bt = bind_full(&mut sb, a, "brittle.trap");
    assert_eq!(call(&mut sb, a, bt, b"").0, Ok(E_TRAP));
    assert!(sb.pods().iter().all(|p| p.name != "brittle"));
    assert_eq!(call(&mut sb, a, bt, b"").0, Ok(E_GONE));
}

#[test]
fn a_pod_cannot_reach_its_callers_memory() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let scan = bind_full(&mut sb, a, "store.scan");
    // The client's secret (at 8192 in its memory) is not in the pod's memory.
    let (r, bytes) = call(&mut sb, a, scan, b"");
    assert_eq!((r, le(&bytes, 0)), (Ok(4), 0), "the pod's whole memory holds no byte of its caller's secret");
    // What the client passes, it can find: the scan works.
    let (_, bytes) = call(&mut sb, a, scan, b"CLNT");
    assert_eq!(le(&bytes, 0), 1);
    // An address beyond its own memory is a trap, not the caller's memory.
    let reach = bind_full(&mut sb, a, "store.reach");
    assert_eq!(call(&mut sb, a, reach, b"").0, Ok(E_TRAP));
}

#[test]
fn nesting_stops_at_the_depth_limit_and_pods_are_not_reentered() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    // r1 -> r2 -> ... -> rN -> store.count: depth N + 1 for the store.
    let n = MAX_DEPTH as usize;
    for i in 1..=n {
        let target = if i == n { "store.count".to_string() } else { format!("r{}.go", i + 1) };
        load_pod(&mut sb, &relay_pod(&target), &format!("r{i}"), None);
    }
    let a = load_client(&mut sb, user(), None);
    // Entering at r2 puts the store at depth MAX_DEPTH: allowed.
    let b2 = bind_full(&mut sb, a, "r2.go");
    let (r, bytes) = call(&mut sb, a, b2, b"");
    assert_eq!((r, le(&bytes, 0), le(&bytes, 4)), (Ok(8), 1, 1), "the store answered through three relays");
    // Entering at r1 would put it at MAX_DEPTH + 1: r{n} is refused.
    let b1 = bind_full(&mut sb, a, "r1.go");
    let (r, bytes) = call(&mut sb, a, b1, b"");
    assert_eq!((r, le(&bytes, 0)), (Ok(4), E_DEPTH));
    assert!(sb.pod_counters().too_deep >= 1);
    // A pod that calls itself finds itself busy.
    load_pod(&mut sb, &relay_pod("self.go"), "self", None);
    let bs = bind_full(&mut sb, a, "self.go");
    let (_, bytes) = call(&mut sb, a, bs, b"");
    assert_eq!(le(&bytes, 0), E_BUSY);
}

#[test]
fn a_client_binding_100000_times_is_bounded_and_counted() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let mut ok = 0;
    for _ in 0..100 {
        ok += sb.invoke(now(1), a, "flood", b"store.echo", &mut Vec::new()).unwrap();
    }
    assert_eq!(ok as usize, MAX_BINDINGS);
    assert_eq!(sb.pod_bindings(a), MAX_BINDINGS);
    assert_eq!(sb.pod_counters().table_full, 100_000 - MAX_BINDINGS as u64);
    assert_eq!(sb.pods()[0].counters.binds, MAX_BINDINGS as u64);
    // Other clients are not affected.
    let b = load_client(&mut sb, second(), None);
    bind_full(&mut sb, b, "store.echo");
}

#[test]
fn a_pod_unloaded_while_bound_fails_cleanly() {
    let mut sb = sandbox();
    let pod = load_pod(&mut sb, &store_pod(), "store", None);
    let a = load_client(&mut sb, user(), None);
    let bc = bind_full(&mut sb, a, "store.count");
    let temp = bind(&mut sb, a, "store.echo");
    assert!(sb.unload_pod(pod));
    assert!(!sb.unload_pod(pod));
    assert_eq!(call(&mut sb, a, bc, b"").0, Ok(E_GONE));
    assert_eq!(call(&mut sb, a, temp, b"").0, Ok(E_GONE));
    assert_eq!(call(&mut sb, a, bc, b"").0, Ok(E_BADID));
    assert_eq!(bind(&mut sb, a, "store.count"), -4);
    // A new pod of the same name is a new pod: old identifiers stay dead.
    load_pod(&mut sb, &store_pod(), "store", None);
    assert_eq!(call(&mut sb, a, bc, b"").0, Ok(E_BADID));
    bind_full(&mut sb, a, "store.count");
}

#[test]
fn a_slow_caller_cannot_hold_a_pod_across_its_preemption() {
    let mut sb = sandbox();
    load_pod(&mut sb, &store_pod(), "store", None);
    // The slow client calls `work` (about 40,000 fuel) in a loop of its own.
    let slow = wat(r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
        (import "pod" "call" (func $call (param i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "runstore.work")
        (func $run (param i32 i32) (result i32) (local $b i32) (local $i i32)
          (local.set $b (call $bind (i32.const 3) (i32.const 10) (i32.const 1024) (i32.const 64)))
          (drop (call $call (local.get $b) (i32.const 0)))
          (loop $l
            (drop (call $call (local.get $b) (i32.const 0)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 20))))
          (local.get $i))
        (table (export "__indirect_function_table") 1 funcref)
        (elem (i32.const 0) $run)
        (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 0)))))"#);
    let c = admin(second()).to_bytes().to_vec();
    let spec =
        LoadSpec { code: &slow, credential: Some(&c), requester: None, local_name: None, limits: Default::default() };
    let s = sb.load(now(0), &spec).unwrap();
    let fast = load_client(&mut sb, user(), None);
    let bf = bind_full(&mut sb, fast, "store.count");
    let job = Job::new(s, JobKind::Entry { entry: "run".into(), arg: 0 }, Vec::new(), 0);
    let mut task = sb.start(now(1), job).unwrap().unwrap();
    let mut out = Vec::new();
    let mut interleaved = 0;
    let mut seen = Vec::new();
    let r = loop {
        // The slow path is stopped at its first preemption point each slice.
        match sb.resume(task, &mut || false, &mut out) {
            Step::Done(r) => break r,
            Step::Yielded(t) => task = t,
        }
        // The pod is never held by the suspended slow path: the fast one gets in.
        let (r, bytes) = call(&mut sb, fast, bf, b"");
        assert_eq!(r, Ok(8), "the fast path was not stalled");
        seen.push(le(&bytes, 0));
        interleaved += 1;
    };
    assert_eq!(r, Ok(20));
    // The pod's own call count, as the fast path saw it: the slow path's
    // calls fell between the fast path's.
    assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
    assert!(seen.windows(2).any(|w| w[1] > w[0] + 1), "{seen:?}");
    assert!(interleaved >= 2, "the slow path was preempted between its pod calls ({interleaved})");
    assert_eq!(sb.pods()[0].counters.busy, 0);
}

#[test]
fn pods_are_loaded_only_with_the_pod_right_and_the_pod_interface() {
    let mut sb = sandbox();
    let code = store_pod();
    // A credential without `pod`.
    let c = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&code))], &[Interface::Log]).to_bytes().to_vec();
    assert_eq!(sb.load_pod(now(0), &pod_spec(&code, &c, "store", None)).unwrap_err(), PodError::NotGranted);
    // A pod importing another interface.
    let logger = wat(r#"(module (import "log" "write" (func (param i32 i32) (result i32)))
        (memory (export "memory") 1)
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 64))
        (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
        (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#);
    let admin_c = admin(user()).to_bytes().to_vec();
    assert!(matches!(
        sb.load_pod(now(0), &pod_spec(&logger, &admin_c, "logger", None)),
        Err(PodError::ForbiddenImport(i)) if i == "log.write"
    ));
    // Malformed pods.
    type Case = (&'static str, fn(&PodError) -> bool);
    let cases: [Case; 5] = [
        (r#"(module (memory (export "memory") 1))"#, |e| matches!(e, PodError::NoOffers)),
        (
            r#"(module (memory (export "memory") 1) (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#,
            |e| matches!(e, PodError::Export(_)),
        ),
        (
            r#"(module (memory (export "memory") 1)
              (func (export "pod_buffer") (result i32) (i32.const 65500))
              (func (export "pod_buffer_len") (result i32) (i32.const 64))
              (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
              (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#,
            |e| matches!(e, PodError::Buffer { .. }),
        ),
        (
            r#"(module (memory (export "memory") 1)
              (func (export "pod_buffer") (result i32) (i32.const 0))
              (func (export "pod_buffer_len") (result i32) (i32.const 8))
              (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
              (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#,
            |e| matches!(e, PodError::Buffer { .. }),
        ),
        (
            r#"(module (memory (export "memory") 1) (func $s (loop (br 0))) (start $s)
              (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0)))"#,
            |e| matches!(e, PodError::Instantiate(_)),
        ),
    ];
    for (i, (src, ok)) in cases.iter().enumerate() {
        let code = wat(src);
        let name = format!("bad{i}");
        let e = sb.load_pod(now(0), &pod_spec(&code, &admin_c, &name, Some(100_000))).unwrap_err();
        assert!(ok(&e), "case {i}: {e:?}");
    }
    assert!(matches!(sb.load_pod(now(0), &pod_spec(&code, &admin_c, "bad.name", None)), Err(PodError::BadName(_))));
    load_pod(&mut sb, &code, "store", None);
    assert!(matches!(sb.load_pod(now(0), &pod_spec(&code, &admin_c, "store", None)), Err(PodError::NameTaken(_))));
    // A client whose credential lacks `pod` cannot even import it.
    let cl = client();
    let c = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&cl))], &[Interface::Net]).to_bytes().to_vec();
    let spec =
        LoadSpec { code: &cl, credential: Some(&c), requester: None, local_name: None, limits: Default::default() };
    assert!(matches!(sb.load(now(0), &spec), Err(LoadError::ForbiddenImport { right: Some(Interface::Pod), .. })));
    assert!(sb.pods().len() == 1);
}

/// The `pod_load` fuzz target over its seeds (the pods above; `ANODE_BLESS=1`
/// rewrites `fuzz/seeds/pod_load/`) and deterministic mutations of them.
#[test]
fn pod_load_fuzz_seeds_and_mutations() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/pod_load");
    let fresh = [store_pod(), picky_pod(), relay_pod("store.echo")];
    if std::env::var_os("ANODE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in fresh.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}.wasm")), s).unwrap();
        }
    }
    let seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("fuzz/seeds/pod_load exists (ANODE_BLESS=1 writes it)")
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(seeds.len(), fresh.len());
    let mut sb = anode_sandbox::fuzzing::sandbox();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for s in &seeds {
        assert!(anode_sandbox::fuzzing::pod_load(&mut sb, s), "a seed loads");
        for _ in 0..150 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut m = s.clone();
            match x % 3 {
                0 => {
                    let i = (x >> 8) as usize % m.len();
                    m[i] ^= (x >> 32) as u8 | 1;
                }
                1 => m.truncate((x >> 8) as usize % (m.len() + 1)),
                _ => m.extend_from_slice(&x.to_le_bytes()),
            }
            let _ = anode_sandbox::fuzzing::pod_load(&mut sb, &m);
        }
    }
    assert!(sb.pods().is_empty());
}

/// A pod whose every mutable global is exported, so it can be rolled back.
/// Its buffer is 0..4096; per-client counters live at 8192 + 4 × state.
/// Entries (the input is a 4-byte LE number n where it matters):
/// - `add`: adds n to the client's counter and to the total; returns
///   [counter (4 LE)][total (4 LE)];
/// - `half`: writes the client's counter and the total half-way, then traps
///   (kept, that state would be inconsistent);
/// - `spin`: writes the same, then loops until cut off;
/// - `grow`: grows the memory by a page, then traps;
/// - `poison`: marks the pod bad (its `pod_check` then fails) and returns 0.
fn ledger_pod() -> Vec<u8> {
    wat(r#"(module
        (memory (export "memory") 1)
        (global $clients (export "clients") (mut i32) (i32.const 0))
        (global $total (export "total") (mut i32) (i32.const 0))
        (global $bad (export "bad") (mut i32) (i32.const 0))
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 4096))
        (func (export "pod_bind") (param i32) (result i32)
          (global.set $clients (i32.add (global.get $clients) (i32.const 1)))
          (global.get $clients))
        (func (export "pod_check") (result i32) (global.get $bad))
        (func $slot (param $s i32) (result i32) (i32.add (i32.const 8192) (i32.shl (local.get $s) (i32.const 2))))
        (func $scribble (param $s i32)
          (i32.store (call $slot (local.get $s)) (i32.const 999999))
          (global.set $total (i32.const 777)))
        (func (export "offer.add") (param $s i32) (param $n i32) (result i32) (local $a i32)
          (local.set $a (call $slot (local.get $s)))
          (i32.store (local.get $a) (i32.add (i32.load (local.get $a)) (i32.load (i32.const 0))))
          (global.set $total (i32.add (global.get $total) (i32.load (i32.const 0))))
          (i32.store (i32.const 0) (i32.load (local.get $a)))
          (i32.store (i32.const 4) (global.get $total))
          (i32.const 8))
        (func (export "offer.half") (param $s i32) (param $n i32) (result i32)
          (call $scribble (local.get $s)) unreachable)
        (func (export "offer.spin") (param $s i32) (param $n i32) (result i32)
          (call $scribble (local.get $s)) (loop $l (br $l)) (i32.const 0))
        (func (export "offer.grow") (param $s i32) (param $n i32) (result i32)
          (call $scribble (local.get $s)) (drop (memory.grow (i32.const 1))) unreachable)
        (func (export "offer.poison") (param $s i32) (param $n i32) (result i32)
          (global.set $bad (i32.const 1)) (i32.const 0)))"#)
}

fn load_rollback_pod(sb: &mut Sandbox, code: &[u8], name: &str, cpu: Option<u64>) -> Result<(), PodError> {
    let c = admin(user()).to_bytes().to_vec();
    let mut s = pod_spec(code, &c, name, cpu);
    s.on_fault = OnFault::Rollback;
    sb.load_pod(now(0), &s).map(|_| ())
}

/// [counter, total] after adding `n` through `binding`.
fn add(sb: &mut Sandbox, m: ModuleId, binding: i32, n: i32) -> (Result<i32, InvokeError>, i32, i32) {
    let (r, bytes) = call(sb, m, binding, &n.to_le_bytes());
    if bytes.len() < 8 {
        return (r, -1, -1);
    }
    (r, le(&bytes, 0), le(&bytes, 4))
}

#[test]
fn a_rolled_back_pod_keeps_every_clients_state_and_binding_after_a_fault() {
    let mut sb = sandbox();
    load_rollback_pod(&mut sb, &ledger_pod(), "ledger", Some(100_000)).unwrap();
    let a = load_client(&mut sb, user(), None);
    let b = load_client(&mut sb, second(), None);
    let aa = bind_full(&mut sb, a, "ledger.add");
    let ba = bind_full(&mut sb, b, "ledger.add");
    assert_eq!(add(&mut sb, a, aa, 5), (Ok(8), 5, 5));
    assert_eq!(add(&mut sb, b, ba, 7), (Ok(8), 7, 12));
    // A trap half-way through an update: memory and globals are put back.
    let ah = bind_full(&mut sb, a, "ledger.half");
    assert_eq!(call(&mut sb, a, ah, b"").0, Ok(E_TRAP));
    // So is a cut-off one.
    let asp = bind_full(&mut sb, a, "ledger.spin");
    assert_eq!(call(&mut sb, a, asp, b"").0, Ok(E_CPU));
    let p = &sb.pods()[0];
    assert_eq!((p.counters.traps, p.counters.cut_off), (1, 1));
    assert_eq!((p.counters.rollbacks, p.counters.rollback_failed, p.counters.resets), (2, 0, 0));
    // Both clients' bindings still work, and see the state from before the faults.
    assert_eq!(add(&mut sb, a, aa, 1), (Ok(8), 6, 13), "not 999999, not 777: the half-done updates are gone");
    assert_eq!(add(&mut sb, b, ba, 0), (Ok(8), 7, 13));
    // The faulting bindings stay too: the instance is the same one.
    assert_eq!(call(&mut sb, a, ah, b"").0, Ok(E_TRAP));
    assert_eq!(sb.pods()[0].counters.rollbacks, 3);
}

#[test]
fn a_rollback_that_cannot_be_done_or_fails_its_check_resets_the_pod() {
    let mut sb = sandbox();
    load_rollback_pod(&mut sb, &ledger_pod(), "ledger", Some(100_000)).unwrap();
    let a = load_client(&mut sb, user(), None);
    let aa = bind_full(&mut sb, a, "ledger.add");
    assert_eq!(add(&mut sb, a, aa, 5), (Ok(8), 5, 5));
    // The memory grew during the faulting call: it cannot shrink back, so
    // the pod is reset and the bindings go.
    let ag = bind_full(&mut sb, a, "ledger.grow");
    assert_eq!(call(&mut sb, a, ag, b"").0, Ok(E_TRAP));
    let p = &sb.pods()[0];
    assert_eq!((p.counters.rollbacks, p.counters.rollback_failed, p.counters.resets), (0, 1, 1));
    assert_eq!(call(&mut sb, a, aa, b"").0, Ok(E_GONE));
    let aa = bind_full(&mut sb, a, "ledger.add");
    assert_eq!(add(&mut sb, a, aa, 2), (Ok(8), 2, 2), "the fresh instance");
    // The pod marked itself bad: after the next fault its check fails, and
    // it is reset rather than kept.
    let ap = bind_full(&mut sb, a, "ledger.poison");
    assert_eq!(call(&mut sb, a, ap, b"").0, Ok(0));
    let ah = bind_full(&mut sb, a, "ledger.half");
    assert_eq!(call(&mut sb, a, ah, b"").0, Ok(E_TRAP));
    let p = &sb.pods()[0];
    assert_eq!((p.counters.rollbacks, p.counters.rollback_failed, p.counters.resets), (0, 2, 2));
    let aa = bind_full(&mut sb, a, "ledger.add");
    assert_eq!(add(&mut sb, a, aa, 3), (Ok(8), 3, 3));
}

#[test]
fn rollback_is_refused_for_pods_whose_state_the_node_cannot_capture() {
    let mut sb = sandbox();
    let pod = |extra: &str| {
        wat(&format!(
            r#"(module (memory (export "memory") 1)
              (func (export "pod_buffer") (result i32) (i32.const 0))
              (func (export "pod_buffer_len") (result i32) (i32.const 64))
              (func (export "pod_bind") (param i32) (result i32) (i32.const 0))
              (func (export "offer.x") (param i32 i32) (result i32) (i32.const 0))
              {extra})"#
        ))
    };
    let cases = [
        ("(global $g (mut i32) (i32.const 0))", "mutable global 0 is not exported"),
        (
            "(table 1 funcref) (func (export \"offer.t\") (param i32 i32) (result i32) (table.set 0 (i32.const 0) (ref.null func)) (i32.const 0))",
            "table.set",
        ),
        (
            "(table 1 funcref) (func (export \"offer.t\") (param i32 i32) (result i32) (drop (table.grow 0 (ref.null func) (i32.const 1))) (i32.const 0))",
            "table.grow",
        ),
        (
            "(data $d \"x\") (func (export \"offer.t\") (param i32 i32) (result i32) (data.drop $d) (i32.const 0))",
            "data.drop",
        ),
    ];
    for (i, (extra, why)) in cases.iter().enumerate() {
        match load_rollback_pod(&mut sb, &pod(extra), &format!("p{i}"), None) {
            Err(PodError::NoRollback(w)) => assert!(w.contains(why), "case {i}: {w}"),
            r => panic!("case {i}: {r:?}"),
        }
    }
    // store_pod keeps its counters in globals it does not export.
    assert!(matches!(load_rollback_pod(&mut sb, &store_pod(), "store", None), Err(PodError::NoRollback(_))));
    // The same pods load with the default policy, and constant or exported globals are fine.
    load_pod(&mut sb, &pod(cases[0].0), "p0", None);
    load_rollback_pod(
        &mut sb,
        &pod("(global $c i32 (i32.const 1)) (global $e (export \"e\") (mut i64) (i64.const 0))"),
        "ok",
        None,
    )
    .unwrap();
    assert!(anode_sandbox::pods::rollback_check(b"\0asm\x01\0\0\0\x06\x01").is_err(), "a truncated section");
}

/// A pod with a table of 3 client slots at 1024: `pod_bind` takes a free
/// slot (its index + 1 is the client's state) or refuses when all are
/// taken; `pod_unbind(state)` frees it. `used` returns [slots in use (4 LE)];
/// `arm` makes the next `pod_unbind` trap.
fn table_pod() -> Vec<u8> {
    wat(r#"(module
        (memory (export "memory") 1)
        (global $armed (export "armed") (mut i32) (i32.const 0))
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 256))
        (func (export "pod_bind") (param i32) (result i32) (local $i i32)
          (block $full (loop $l
            (br_if $full (i32.ge_u (local.get $i) (i32.const 3)))
            (if (i32.eqz (i32.load8_u (i32.add (i32.const 1024) (local.get $i)))) (then
              (i32.store8 (i32.add (i32.const 1024) (local.get $i)) (i32.const 1))
              (return (i32.add (local.get $i) (i32.const 1)))))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br $l)))
          (i32.const -1))
        (func (export "pod_unbind") (param $s i32)
          (if (global.get $armed) (then unreachable))
          (i32.store8 (i32.add (i32.const 1023) (local.get $s)) (i32.const 0)))
        (func (export "offer.used") (param i32 i32) (result i32)
          (i32.store (i32.const 0) (i32.add (i32.add (i32.load8_u (i32.const 1024)) (i32.load8_u (i32.const 1025)))
            (i32.load8_u (i32.const 1026))))
          (i32.const 4))
        (func (export "offer.arm") (param i32 i32) (result i32) (global.set $armed (i32.const 1)) (i32.const 0)))"#)
}

fn unbind(sb: &mut Sandbox, m: ModuleId, binding: i32) -> Result<i32, InvokeError> {
    sb.invoke(now(3), m, "unbind", &binding.to_le_bytes(), &mut Vec::new())
}

#[test]
fn a_pod_frees_a_clients_state_when_it_unbinds_or_goes_away() {
    let mut sb = sandbox();
    load_pod(&mut sb, &table_pod(), "table", Some(100_000));
    let a = load_client(&mut sb, user(), None);
    let b = load_client(&mut sb, second(), None);
    let a1 = bind_full(&mut sb, a, "table.used");
    let _a2 = bind_full(&mut sb, a, "table.used");
    let _b1 = bind_full(&mut sb, b, "table.used");
    let (_, bytes) = call(&mut sb, a, a1, b"");
    assert_eq!(le(&bytes, 0), 3);
    // Full: the pod refuses a fourth client state.
    let t = bind(&mut sb, a, "table.used");
    assert_eq!(call(&mut sb, a, t, b"").0, Ok(E_REFUSED));
    // An unbind runs pod_unbind: the slot is free again.
    assert_eq!(unbind(&mut sb, a, a1), Ok(0));
    assert_eq!(sb.pods()[0].counters.unbinds, 1);
    let a3 = bind_full(&mut sb, a, "table.used");
    // A temporary binding (never full) unbinds without pod code.
    let t = bind(&mut sb, a, "table.used");
    assert_eq!(unbind(&mut sb, a, t), Ok(0));
    assert_eq!(sb.pods()[0].counters.unbinds, 1);
    // b goes away: its binding is unbound in the pod too.
    assert!(sb.unload(b));
    assert_eq!(sb.pods()[0].counters.unbinds, 2);
    let (_, bytes) = call(&mut sb, a, a3, b"");
    assert_eq!(le(&bytes, 0), 2, "a's two slots; b's was freed");
    // A pod_unbind that traps: the unbind still succeeds, the pod is reset
    // by its policy (bindings to the old instance are gone).
    let arm = bind_full(&mut sb, a, "table.arm");
    assert_eq!(call(&mut sb, a, arm, b"").0, Ok(0));
    assert_eq!(unbind(&mut sb, a, a3), Ok(0));
    let p = &sb.pods()[0];
    assert_eq!((p.counters.unbinds, p.counters.traps, p.counters.resets), (3, 1, 1));
    assert_eq!(call(&mut sb, a, arm, b"").0, Ok(E_GONE));
}

#[test]
fn a_pod_is_unloaded_when_its_credential_expires() {
    let mut sb = sandbox();
    let code = store_pod();
    let cred = |expires: u64| {
        common::issuer()
            .issue(
                user(),
                &anode_cred::GrantSpec {
                    modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
                    interfaces: anode_cred::InterfaceSet::of(&[Interface::Pod]),
                    limits: limits(),
                    expires: Some(now(expires).wall),
                },
            )
            .unwrap()
            .to_bytes()
            .to_vec()
    };
    let (short, long) = (cred(5_000), cred(60_000));
    sb.load_pod(now(0), &pod_spec(&code, &short, "brief", None)).unwrap();
    sb.load_pod(now(0), &pod_spec(&code, &long, "lasting", None)).unwrap();
    let a = load_client(&mut sb, user(), None);
    let bb = bind_full(&mut sb, a, "brief.count");
    let bl = bind_full(&mut sb, a, "lasting.count");
    // The sandbox asks to be woken at the expiry.
    assert_eq!(sb.poll_at(), Some(5_000));
    let mut out = Vec::new();
    sb.handle_timeout(now(4_999), &mut out);
    assert_eq!(sb.pods().len(), 2, "not before its date");
    sb.handle_timeout(now(5_000), &mut out);
    let names: Vec<String> = sb.pods().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["lasting"], "unloaded at its date; the other stays");
    assert_eq!(sb.counters().credential_unloads, 1);
    assert_eq!(call(&mut sb, a, bb, b"").0, Ok(E_GONE), "its clients find it gone");
    assert_eq!(call(&mut sb, a, bl, b"").0, Ok(8));
    assert_eq!(sb.poll_at(), Some(60_000));
    // A pod unloaded by the operator before its date is not looked at again.
    let id = sb.pods()[0].id;
    assert!(sb.unload_pod(id));
    sb.handle_timeout(now(60_000), &mut out);
    assert_eq!(sb.counters().credential_unloads, 1);
}

/// A pod that grows its memory: `grow` returns `memory.grow 1`'s result
/// (the previous page count, or -1) as 4 bytes LE.
fn grower_pod() -> Vec<u8> {
    wat(r#"(module
        (memory (export "memory") 1)
        (func (export "pod_buffer") (result i32) (i32.const 0))
        (func (export "pod_buffer_len") (result i32) (i32.const 64))
        (func (export "pod_bind") (param i32) (result i32) (i32.const 1))
        (func (export "offer.grow") (param i32 i32) (result i32)
          (i32.store (i32.const 0) (memory.grow (i32.const 1)))
          (i32.const 4)))"#)
}

/// A pod is one of its owner's module instances (RCANE §IV-E, issue 15):
/// its memory is charged to its owner's heap account and stops at the
/// owner's session reservation, with a counted refusal, as a module's
/// does; its clients' accounts are not charged, unloading it gives the
/// memory back, and a pod that does not fit is refused at load.
#[test]
fn a_pods_memory_is_charged_to_its_owners_session_heap() {
    const PAGE: usize = 64 << 10;
    let mut sb = sandbox();
    sb.set_session_heap(user(), Some(3 * PAGE));
    let pod = load_pod(&mut sb, &grower_pod(), "grower", None);
    assert_eq!(sb.heap(&user()).unwrap().memory, PAGE, "its first page, charged to its owner");
    let c = load_client(&mut sb, second(), None);
    let client_before = sb.heap(&second()).unwrap();
    let b = bind_full(&mut sb, c, "grower.grow");
    let grown: Vec<i32> = (0..3).map(|_| le(&call(&mut sb, c, b, b"").1, 0)).collect();
    assert_eq!(grown, [1, 2, -1], "the third page fits the 3-page reservation, the fourth does not");
    let owner = sb.heap(&user()).unwrap();
    assert_eq!((owner.memory, owner.refusals), (3 * PAGE, 1));
    assert_eq!(sb.heap(&second()).unwrap().memory, client_before.memory, "the client pays no pod memory");
    // A larger reservation lets it grow again.
    sb.set_session_heap(user(), Some(4 * PAGE));
    assert_eq!(le(&call(&mut sb, c, b, b"").1, 0), 3);
    assert!(sb.unload_pod(pod));
    assert_eq!(sb.heap(&user()).unwrap().memory, 0, "unloading the pod gives its memory back");
    // No room for a pod's first page: refused at load, nothing kept.
    let m = load_client(&mut sb, user(), None);
    sb.set_session_heap(user(), Some(PAGE));
    let cred = admin(user()).to_bytes().to_vec();
    let r = sb.load_pod(now(0), &pod_spec(&grower_pod(), &cred, "grower2", None));
    assert!(matches!(r, Err(PodError::Instantiate(_))), "{r:?}");
    assert!(sb.pods().is_empty());
    assert_eq!(sb.heap(&user()).unwrap().memory, PAGE, "only the owner's own module's page");
    sb.unload(m);
}

/// A pod's own memory cap (its credential's `memory`) still binds while
/// its owner's session reservation would allow more.
#[test]
fn a_pods_own_memory_cap_binds_under_a_larger_session_heap() {
    const PAGE: usize = 64 << 10;
    let mut sb = sandbox();
    sb.set_session_heap(user(), Some(64 * PAGE));
    let cred = admin(user()).to_bytes().to_vec();
    let mut spec = pod_spec(&[], &cred, "grower", None);
    let code = grower_pod();
    spec.code = &code;
    spec.limits.memory = Some(2 * PAGE as u64);
    sb.load_pod(now(0), &spec).unwrap();
    let c = load_client(&mut sb, second(), None);
    let b = bind_full(&mut sb, c, "grower.grow");
    let grown: Vec<i32> = (0..2).map(|_| le(&call(&mut sb, c, b, b"").1, 0)).collect();
    assert_eq!(grown, [1, -1], "2 pages is the pod's own cap");
    assert_eq!(sb.heap(&user()).unwrap().memory, 2 * PAGE);
}
