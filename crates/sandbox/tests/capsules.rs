//! Capsules over an in-memory line of nodes: the active ping with code
//! carried and by hash (fetched from the previous hop and cached), and every
//! capsule refusal.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{CredError, Interface, ModuleGrant, ModuleHash, PrincipalId};
use anode_sandbox::capsule::{self, Capsule};
use anode_sandbox::{Action, CapsuleError, CapsuleOutcome, InvokeError, LoadError, Sandbox, SandboxConfig};
use common::*;

fn line(n: u8) -> Vec<Sandbox> {
    (1..=n).map(|i| sandbox_with(SandboxConfig::default(), line_routes(i, n))).collect()
}

fn ping_cred(code: &[u8]) -> Vec<u8> {
    ordinary(
        user(),
        vec![ModuleGrant::Hash(ModuleHash::of(code))],
        &[Interface::Route, Interface::Net, Interface::Time],
    )
    .to_bytes()
    .to_vec()
}

fn ping_data(origin: u8, target: u8, t0: u64, port: u16, carry: bool) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&addr(origin).octets());
    d.extend_from_slice(&addr(target).octets());
    d.extend_from_slice(&t0.to_be_bytes());
    d.extend_from_slice(&port.to_be_bytes());
    d.push(carry as u8);
    d
}

fn capsule_bytes(entry: &str, cred: &[u8], data: &[u8], code: &[u8], carried: bool) -> Vec<u8> {
    let mut out = Vec::new();
    Capsule { entry, credential: cred, data, code: carried.then_some(code), hash: ModuleHash::of(code) }
        .encode(&mut out)
        .unwrap();
    out
}

fn pong_payload(target: u8, rtt: u64) -> Vec<u8> {
    let mut p = addr(target).octets().to_vec();
    p.extend_from_slice(&rtt.to_be_bytes());
    p
}

#[test]
fn active_ping_with_code_carried() {
    let code = module("ping");
    let cred = ping_cred(&code);
    for hops in 1..=3u8 {
        let mut nodes = line(hops + 1);
        let target = hops + 1;
        let first = capsule_bytes("ping", &cred, &ping_data(1, target, 40, 9000, true), &code, true);
        let (delivered, msgs) = run_line(&mut nodes, vec![(1, 1, first)], 47);
        assert_eq!(delivered, vec![(1, 9000, pong_payload(target, 7))]);
        assert_eq!(msgs, 1 + 2 * hops as usize);
        for n in &nodes {
            assert_eq!(n.counters().code_requests_sent, 0);
        }
    }
}

#[test]
fn active_ping_by_hash_fetches_from_previous_hop_then_caches() {
    let code = module("ping");
    let cred = ping_cred(&code);
    let mut nodes = line(3);
    // The origin has the code (carried to itself); every later hop gets only the hash.
    let first = capsule_bytes("ping", &cred, &ping_data(1, 3, 0, 9000, false), &code, true);
    let (delivered, msgs) = run_line(&mut nodes, vec![(1, 1, first)], 5);
    assert_eq!(delivered, vec![(1, 9000, pong_payload(3, 5))]);
    // inject + (capsule, request, reply) to 2 and to 3 + 2 back.
    assert_eq!(msgs, 1 + 3 + 3 + 2);
    assert_eq!(nodes[1].counters().code_requests_sent, 1);
    assert_eq!(nodes[2].counters().code_requests_sent, 1);
    assert_eq!(nodes[0].counters().code_served, 1);
    assert_eq!(nodes[1].counters().code_served, 1);
    assert_eq!(nodes[1].counters().code_fetched, 1);

    // Warm: a capsule carrying only the hash runs everywhere with no fetch.
    let second = capsule_bytes("ping", &cred, &ping_data(1, 3, 10, 9001, false), &code, false);
    let (delivered, msgs) = run_line(&mut nodes, vec![(1, 1, second)], 12);
    assert_eq!(delivered, vec![(1, 9001, pong_payload(3, 2))]);
    assert_eq!(msgs, 5);
    for n in &nodes {
        assert_eq!(n.cache_stats().inserts, 1, "compiled once per node");
    }
    let requests: u64 = nodes.iter().map(|n| n.counters().code_requests_sent).sum();
    assert_eq!(requests, 2, "no new fetch for the warm capsule");
}

#[test]
fn wrong_hash_is_refused_with_no_effect() {
    let code = module("ping");
    let cred = ping_cred(&code);
    let mut sb = sandbox();
    let mut bytes = capsule_bytes("ping", &cred, &ping_data(1, 1, 0, 9, true), &code, true);
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // the carried code no longer matches its hash
    let mut out = Vec::new();
    let e = sb.handle_capsule(now(0), addr(2), &bytes, &mut out).unwrap_err();
    assert!(matches!(e, CapsuleError::WrongHash { .. }), "{e}");
    assert!(out.is_empty());
    assert_eq!(sb.cache_stats().entries, 0);

    // A fetched reply with the wrong code is refused too; the capsule keeps waiting until the timeout.
    let by_hash = capsule_bytes("ping", &cred, &ping_data(1, 1, 0, 9, false), &code, false);
    assert_eq!(
        sb.handle_capsule(now(0), addr(2), &by_hash, &mut out).unwrap(),
        CapsuleOutcome::Pending { hash: ModuleHash::of(&code), requested: true }
    );
    let mut req = Vec::new();
    capsule::encode_code_request(&ModuleHash::of(&code), &mut req);
    assert_eq!(out, vec![Action::SendCapsule { principal: None, to: addr(2), bytes: req }]);
    out.clear();
    let mut reply = Vec::new();
    capsule::encode_code_reply(&ModuleHash::of(&code), &module("spin"), &mut reply).unwrap();
    let e = sb.handle_capsule(now(1), addr(2), &reply, &mut out).unwrap_err();
    assert!(matches!(e, CapsuleError::WrongHash { .. }), "{e}");
    assert_eq!(sb.cache_stats().entries, 0);
    assert_eq!(sb.poll_at(), Some(1000));
    sb.handle_timeout(now(1000), &mut out);
    assert!(out.is_empty());
    assert_eq!(sb.counters().fetch_timeouts, 1);
    assert_eq!(sb.counters().pending_dropped, 1);
    // A late correct reply is now unsolicited and ignored.
    capsule::encode_code_reply(&ModuleHash::of(&code), &code, &mut reply).unwrap();
    assert_eq!(sb.handle_capsule(now(1001), addr(2), &reply, &mut out).unwrap(), CapsuleOutcome::Ignored);
    assert_eq!(sb.cache_stats().entries, 0);
}

#[test]
fn capsule_naming_unregistered_entry_is_refused() {
    let code = module("ping");
    let cred = ping_cred(&code);
    let mut sb = sandbox();
    let bytes = capsule_bytes("nope", &cred, b"", &code, true);
    let mut out = Vec::new();
    assert_eq!(
        sb.handle_capsule(now(0), addr(2), &bytes, &mut out).unwrap_err(),
        CapsuleError::Invoke(InvokeError::UnregisteredEntry("nope".into()))
    );
    assert!(out.is_empty());
    assert_eq!(sb.counters().capsule_refused.get("unregistered_entry"), Some(&1));
}

#[test]
fn capsule_credential_refusals() {
    let code = module("ping");
    let mut sb = sandbox();
    let mut out = Vec::new();
    let bytes = capsule_bytes("ping", b"", &ping_data(1, 1, 0, 9, true), &code, true);
    assert_eq!(
        sb.handle_capsule(now(0), addr(2), &bytes, &mut out).unwrap_err(),
        CapsuleError::Load(LoadError::Denied(CredError::NoCredential))
    );
    // A credential for other code.
    let other = ping_cred(b"other");
    let bytes = capsule_bytes("ping", &other, &ping_data(1, 1, 0, 9, true), &code, true);
    assert!(matches!(
        sb.handle_capsule(now(0), addr(2), &bytes, &mut out).unwrap_err(),
        CapsuleError::Load(LoadError::Denied(CredError::NotGranted { .. }))
    ));
    // A credential without `net`: the ping's imports are refused.
    let thin = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&code))], &[Interface::Route, Interface::Time]);
    let bytes = capsule_bytes("ping", thin.to_bytes(), &ping_data(1, 1, 0, 9, true), &code, true);
    assert!(matches!(
        sb.handle_capsule(now(0), addr(2), &bytes, &mut out).unwrap_err(),
        CapsuleError::Load(LoadError::ForbiddenImport { right: Some(Interface::Net), .. })
    ));
    assert!(out.is_empty());
    assert!(sb.modules().is_empty());
    // Malformed messages.
    assert!(matches!(sb.handle_capsule(now(0), addr(2), b"\x01\x01", &mut out), Err(CapsuleError::Wire(_))));
}

#[test]
fn flood_of_looping_capsules_is_bounded_and_the_node_keeps_working() {
    let spin = module("spin");
    let cred = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&spin))], &[]);
    let mut sb = sandbox();
    let ctr_code = module("counter");
    let ctr = sb
        .load(
            now(0),
            &anode_sandbox::LoadSpec {
                code: &ctr_code,
                credential: Some(admin(PrincipalId([7; 32])).to_bytes()),
                requester: None,
                local_name: None,
                limits: anode_cred::RequestedLimits { cpu: Some(100_000), ..Default::default() },
            },
        )
        .unwrap();
    let mut out = Vec::new();
    let bytes = capsule_bytes("run", cred.to_bytes(), b"", &spin, true);
    for i in 0..50 {
        assert_eq!(
            sb.handle_capsule(now(i), addr(2), &bytes, &mut out).unwrap_err(),
            CapsuleError::Invoke(InvokeError::CpuExhausted)
        );
    }
    assert_eq!(sb.counters().capsule_refused.get("cpu_exhausted"), Some(&50));
    assert_eq!(sb.cache_stats().inserts, 2, "the counter and the looping capsule, each compiled once");
    assert_eq!(sb.invoke(now(60), ctr, "incr", b"k", &mut out), Ok(1));
    assert!(out.is_empty());
}

fn variant(n: u32) -> Vec<u8> {
    wat(&format!(
        r#"(module
            (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "run")
            (table (export "__indirect_function_table") 2 funcref)
            (elem (i32.const 1) $run)
            (func $run (param i32 i32) (result i32) (i32.const {n}))
            (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 1)))))"#
    ))
}

#[test]
fn code_cache_is_bounded_lru_and_capsule_stores_are_recycled() {
    let codes: Vec<Vec<u8>> = (0..6).map(variant).collect();
    let cred = admin(user());
    let cfg = SandboxConfig { cache_bytes: 1, capsule_instances: 2, ..Default::default() };
    // Find one entry's cost to size the cache for exactly two.
    let mut probe = sandbox();
    let mut out = Vec::new();
    probe
        .handle_capsule(now(0), addr(2), &capsule_bytes("run", cred.to_bytes(), b"", &codes[0], true), &mut out)
        .unwrap();
    let one = probe.cache_stats().bytes;
    assert!(one > 0);
    let mut sb = sandbox_with(SandboxConfig { cache_bytes: 2 * one + one / 2, ..cfg }, line_routes(1, 1));
    for (i, c) in codes.iter().enumerate() {
        let r = sb.handle_capsule(now(0), addr(2), &capsule_bytes("run", cred.to_bytes(), b"", c, true), &mut out);
        assert_eq!(
            r.unwrap(),
            CapsuleOutcome::Ran {
                module: match r_id(&sb) {
                    Some(id) => id,
                    None => unreachable!(),
                },
                result: i as i32
            }
        );
    }
    let s = sb.cache_stats();
    assert_eq!(s.entries, 2);
    assert_eq!(s.evictions, 4);
    assert!(s.bytes <= 2 * one + one / 2);
    assert!(sb.counters().capsule_store_recycles >= 2);
    // The most recent code is still cached: a by-hash capsule runs without a fetch.
    let r = sb.handle_capsule(now(0), addr(2), &capsule_bytes("run", cred.to_bytes(), b"", &codes[5], false), &mut out);
    assert!(matches!(r, Ok(CapsuleOutcome::Ran { result: 5, .. })), "{r:?}");
    // The oldest is not: it is fetched.
    let r = sb.handle_capsule(now(0), addr(2), &capsule_bytes("run", cred.to_bytes(), b"", &codes[0], false), &mut out);
    assert!(matches!(r, Ok(CapsuleOutcome::Pending { requested: true, .. })), "{r:?}");
}

fn r_id(sb: &Sandbox) -> Option<anode_sandbox::ModuleId> {
    // The most recent capsule instance is the highest id.
    (1..10_000).rev().map(anode_sandbox::ModuleId).find(|id| sb.module(*id).is_some())
}

#[test]
fn ping_helpers_match_the_module() {
    let code = module("ping");
    let cred = ping_cred(&code);
    let mut nodes = line(2);
    let mut first = Vec::new();
    anode_sandbox::ping::capsule(&code, &cred, addr(1), addr(2), 100, 9000, false, &mut first).unwrap();
    let (delivered, _) = run_line(&mut nodes, vec![(1, 1, first)], 103);
    let [(1, 9000, payload)] = &delivered[..] else { panic!("{delivered:?}") };
    assert_eq!(anode_sandbox::ping::parse_reply(payload), Some((addr(2), 3)));
    assert_eq!(anode_sandbox::ping::parse_reply(b"short"), None);
}

#[test]
fn deferred_capsules_become_jobs_of_their_principal_that_run_like_the_capsule() {
    let code = variant(7);
    let cred = admin(user());
    let bytes = capsule_bytes("run", cred.to_bytes(), b"", &code, true);
    let mut out = Vec::new();
    // At once (the default): the entry's result comes back.
    let mut inline = sandbox();
    assert!(matches!(
        inline.handle_capsule(now(0), addr(2), &bytes, &mut out),
        Ok(CapsuleOutcome::Ran { result: 7, .. })
    ));
    // Deferred: verified and instantiated, then a job of the principal.
    let mut sb = sandbox();
    sb.defer_capsules(true);
    let module = match sb.handle_capsule(now(0), addr(2), &bytes, &mut out) {
        Ok(CapsuleOutcome::Queued { module }) => module,
        r => panic!("{r:?}"),
    };
    assert_eq!(sb.counters().capsules_run, 0, "nothing ran yet");
    let mut jobs = Vec::new();
    sb.take_capsule_jobs(&mut jobs);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].module, module);
    assert_eq!(sb.job_principal(&jobs[0]), Some(user()));
    let task = sb.start(now(1), jobs.remove(0)).unwrap().unwrap();
    match sb.resume(task, &mut || true, &mut out) {
        anode_sandbox::Step::Done(r) => assert_eq!(r.unwrap(), 7),
        anode_sandbox::Step::Yielded(_) => panic!("keep_going said go on"),
    }
    assert_eq!(sb.counters().capsules_run, 1);
    // A refused capsule makes no job.
    let forged = capsule_bytes("run", b"not a credential", b"", &code, true);
    assert!(sb.handle_capsule(now(2), addr(2), &forged, &mut out).is_err());
    sb.take_capsule_jobs(&mut jobs);
    assert!(jobs.is_empty());
}

/// A code request is 34 bytes and its reply as large as the module: each
/// neighbour gets its own byte budget for replies, and all of them together
/// four times one. A neighbour that asks in a loop is refused (counted) once
/// its budget is spent, without costing another neighbour its replies.
#[test]
fn code_requests_are_answered_within_each_neighbours_reply_budget() {
    let code = module("ping");
    let cred = ping_cred(&code);
    let reply = (capsule::CODE_REPLY_HEADER + code.len()) as u64;
    // One reply's burst (max_module = the code), refilled in 100 ms.
    let cfg =
        SandboxConfig { max_module: code.len(), code_reply_bytes_per_sec: 10 * reply, ..SandboxConfig::default() };
    let mut sb = sandbox_with(cfg, line_routes(1, 1));
    let mut out = Vec::new();
    // The code reaches the cache with a capsule that carries it.
    let carried = capsule_bytes("ping", &cred, &ping_data(1, 1, 0, 9, true), &code, true);
    sb.handle_capsule(now(0), addr(2), &carried, &mut out).unwrap();
    assert_eq!(sb.cache_stats().entries, 1);
    let mut req = Vec::new();
    capsule::encode_code_request(&ModuleHash::of(&code), &mut req);
    let ask = |sb: &mut Sandbox, t: u64, n: u8| {
        let mut out = Vec::new();
        let r = sb.handle_capsule(now(t), addr(n), &req, &mut out);
        assert_eq!(out.len(), usize::from(r.is_ok()), "a reply exactly when served");
        r
    };
    let limited = |r: Result<CapsuleOutcome, CapsuleError>, n: u8| {
        assert!(matches!(r, Err(CapsuleError::CodeReplyLimited(a)) if a == addr(n)), "{r:?}")
    };
    assert_eq!(ask(&mut sb, 0, 2).unwrap(), CapsuleOutcome::CodeServed);
    limited(ask(&mut sb, 0, 2), 2);
    // Others are still served from their own budgets...
    for n in 3..=5 {
        assert_eq!(ask(&mut sb, 0, n).unwrap(), CapsuleOutcome::CodeServed);
    }
    // ...until the node's (four replies at once) is spent too.
    limited(ask(&mut sb, 0, 6), 6);
    // Neighbour 2 floods: refused while its budget refills.
    for t in [1, 50, 99] {
        limited(ask(&mut sb, t, 2), 2);
    }
    // 100 ms later neighbour 2 has a reply's worth again.
    assert_eq!(ask(&mut sb, 100, 2).unwrap(), CapsuleOutcome::CodeServed);
    assert_eq!(sb.counters().code_served, 5);
    assert_eq!(sb.counters().capsule_refused.get("code_reply_limited"), Some(&5));

    // 0 serves no code at all.
    let cfg = SandboxConfig { code_reply_bytes_per_sec: 0, ..SandboxConfig::default() };
    let mut off = sandbox_with(cfg, line_routes(1, 1));
    off.handle_capsule(now(0), addr(2), &carried, &mut out).unwrap();
    limited(ask(&mut off, 0, 2), 2);
    assert_eq!(off.counters().code_served, 0);
}
