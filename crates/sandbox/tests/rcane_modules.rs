//! The modules of the resource-control experiments and hostile cases (issue
//! 14), at the sandbox level: each is loaded under a credential granting
//! exactly what it imports, and shown to do what its experiment needs and to
//! reach the limit it is meant to reach without harming its neighbours
//! (run `scripts/setup` first). `docs/modules.md` describes each module.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{GrantSpec, Interface, InterfaceSet, Limits, ModuleGrant, ModuleHash, PrincipalId, RequestedLimits};
use anode_sandbox::{
    Action, Invocation, InvokeError, LoadError, LoadSpec, ModuleId, Sandbox, SandboxConfig, StaticRoutes,
};
use common::*;

/// Loads example module `name` for `user()` under a credential that grants
/// `ifaces` and the given memory and fuel maxima.
fn try_load(sb: &mut Sandbox, name: &str, ifaces: &[Interface], memory: u64, cpu: u64) -> Result<ModuleId, LoadError> {
    let code = module(name);
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
        interfaces: InterfaceSet::of(ifaces),
        limits: Limits { memory, cpu, state: 4096 },
        expires: None,
    };
    let cred = issuer().issue(user(), &spec).unwrap();
    let spec = LoadSpec {
        code: &code,
        credential: Some(cred.to_bytes()),
        requester: None,
        local_name: None,
        limits: RequestedLimits::default(),
    };
    sb.load(now(0), &spec)
}

/// [`try_load`], which must succeed; checks the module imports exactly `ifaces`.
fn load(sb: &mut Sandbox, name: &str, ifaces: &[Interface], memory: u64, cpu: u64) -> ModuleId {
    let id = try_load(sb, name, ifaces, memory, cpu).unwrap();
    assert_eq!(sb.module(id).unwrap().interfaces, InterfaceSet::of(ifaces), "{name} imports");
    id
}

fn entries(sb: &Sandbox, id: ModuleId) -> Vec<String> {
    sb.module(id).unwrap().entries
}

fn config(alarms_per_poll: usize) -> SandboxConfig {
    SandboxConfig { alarms_per_poll, ..Default::default() }
}

/// The invocations since the last call.
fn invocations(sb: &mut Sandbox) -> Vec<Invocation> {
    let mut v = Vec::new();
    sb.take_invocations(&mut v);
    v
}

/// A counter module of another principal, to show it keeps working.
fn bystander(sb: &mut Sandbox) -> ModuleId {
    let code = module("counter");
    let c = admin(PrincipalId([77; 32]));
    let spec = LoadSpec {
        code: &code,
        credential: Some(c.to_bytes()),
        requester: None,
        local_name: None,
        limits: RequestedLimits::default(),
    };
    sb.load(now(0), &spec).unwrap()
}

fn bystander_counts(sb: &mut Sandbox, id: ModuleId, expect: i32) {
    assert_eq!(sb.invoke(now(1), id, "incr", b"k", &mut Vec::new()), Ok(expect));
}

fn stat(sb: &mut Sandbox, id: ModuleId, name: &str) -> i32 {
    sb.invoke(now(1), id, "stats", name.as_bytes(), &mut Vec::new()).unwrap()
}

fn sends(out: &[Action]) -> Vec<(std::net::Ipv4Addr, u16, &[u8])> {
    out.iter()
        .map(|a| match a {
            Action::SendPacket { principal, dst, port, payload, .. } => {
                assert_eq!(*principal, user());
                (*dst, *port, &payload[..])
            }
            other => panic!("unexpected action {other:?}"),
        })
        .collect()
}

/// `burn`'s `ROUNDS` (modules/burn/src/lib.rs) and its seed.
const BURN_ROUNDS: u32 = 62_500;
const BURN_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
/// The fuel one `work` uses, as documented in docs/modules.md (±5 %).
const BURN_FUEL: u64 = 1_500_000;

/// `burn`'s state after `invocations` calls of `work`, computed here.
fn burn_state(invocations: u32) -> u64 {
    let mut x = BURN_SEED;
    for _ in 0..invocations * BURN_ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

#[test]
fn burn_uses_its_documented_fuel_and_always_has_work_queued() {
    let mut sb = sandbox_with(config(3), line_routes(1, 1));
    let other = bystander(&mut sb);
    let id = load(&mut sb, "burn", &[Interface::Time], 4 << 20, 4_000_000);
    assert_eq!(entries(&sb, id), ["stop", "work"]);
    // anode_init armed the chain at 0 ms.
    assert_eq!(sb.poll_at(), Some(0));
    let _ = invocations(&mut sb);
    let mut out = Vec::new();
    sb.handle_timeout(now(0), &mut out);
    assert!(out.is_empty(), "{out:?}");
    // A poll runs the alarms due when it starts: one work, which re-armed
    // at 0 ms, so more is due at once (the node's scheduler decides when).
    let mut runs = invocations(&mut sb);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(sb.poll_at(), Some(0));
    for _ in 0..2 {
        sb.handle_timeout(now(0), &mut out);
        runs.extend(invocations(&mut sb));
    }
    assert_eq!(runs.len(), 3, "{runs:?}");
    for r in &runs {
        assert!(r.ok && r.module == id && r.principal == user(), "{r:?}");
        // Deterministic: every invocation does the same work.
        assert_eq!(r.fuel, runs[0].fuel);
    }
    let fuel = runs[0].fuel;
    println!("burn: {fuel} fuel per work invocation");
    assert!(fuel.abs_diff(BURN_FUEL) <= BURN_FUEL / 20, "burn used {fuel} fuel, documented {BURN_FUEL}");
    assert_eq!(sb.module(id).unwrap().counters.ok, 3);
    // The work is really done: the fourth call returns the state computed here.
    let x = burn_state(4);
    assert_eq!(sb.invoke(now(1), id, "work", b"", &mut out), Ok((x & 0x7fff_ffff) as i32));
    // Under a bound below its need it ends on CPU, and only that call fails.
    let mut tight = sandbox_with(config(3), line_routes(1, 1));
    let t = load(&mut tight, "burn", &[Interface::Time], 4 << 20, 1_000_000);
    assert_eq!(tight.invoke(now(1), t, "work", b"", &mut out), Err(InvokeError::CpuExhausted));
    // stop ends the chain: nothing runs any more.
    assert_eq!(sb.invoke(now(2), id, "stop", b"", &mut out), Ok(0));
    let _ = invocations(&mut sb);
    sb.handle_timeout(now(3), &mut out);
    assert!(invocations(&mut sb).is_empty());
    assert_eq!(sb.poll_at(), None);
    bystander_counts(&mut sb, other, 1);
}

#[test]
fn yielder_rearms_at_every_invocation() {
    let mut sb = sandbox_with(config(5), line_routes(1, 1));
    let id = load(&mut sb, "yielder", &[Interface::Time], 4 << 20, 1_000_000);
    assert_eq!(entries(&sb, id), ["count", "stop", "tick"]);
    assert_eq!(sb.poll_at(), Some(0));
    let mut out = Vec::new();
    for t in 0..20 {
        sb.handle_timeout(now(t), &mut out);
        // Always the next invocation queued, due at once.
        assert_eq!(sb.poll_at(), Some(t));
    }
    assert!(out.is_empty());
    let runs = invocations(&mut sb);
    assert_eq!(runs.len(), 20, "one tick per poll: the ones due when it started");
    assert!(runs.iter().all(|r| r.ok));
    println!("yielder: {} fuel per tick", runs[0].fuel);
    // Its wasm is ~100 units; each host call costs DEFAULT_HOST_CALL_FUEL.
    assert!(runs[0].fuel < 2_000, "a tick should be almost free: {}", runs[0].fuel);
    assert_eq!(sb.invoke(now(20), id, "count", b"", &mut out), Ok(20));
    assert_eq!(sb.invoke(now(20), id, "stop", b"", &mut out), Ok(0));
    sb.handle_timeout(now(21), &mut out);
    assert_eq!(sb.poll_at(), None);
    assert_eq!(sb.invoke(now(21), id, "count", b"", &mut out), Ok(20));
}

/// Node 2 of a line 1 - 2 - 3: neighbours 10.0.0.1 and 10.0.0.3.
fn middle() -> StaticRoutes {
    line_routes(2, 3)
}

const FORWARDER: &[Interface] = &[Interface::Route, Interface::Net, Interface::Time];

#[test]
fn forwarder_hits_the_send_limit_every_event_and_the_memory_cap() {
    let mut sb = sandbox_with(config(1), middle());
    let other = bystander(&mut sb);
    let cap: u64 = 2 << 20;
    let id = load(&mut sb, "forwarder", FORWARDER, cap, 1_000_000);
    assert_eq!(entries(&sb, id), ["flood", "on_packet", "stats", "stop", "tick"]);
    assert_eq!(stat(&mut sb, id, "neighbours"), 2);
    assert!(sb.has_channel(4300, std::net::Ipv4Addr::UNSPECIFIED, b"fw"));
    let initial = sb.memory_used(&user()) as u64;
    let room = ((cap - initial) / 65_536) as i32;
    assert!(room > 2, "initial memory {initial}");
    let limit = SandboxConfig::default().host.sends_per_invocation as usize;

    // Every alarm: a full burst, to the neighbours in turn, and the alarm again.
    let mut t = 0;
    for k in 1..=room + 3 {
        let mut out = Vec::new();
        sb.handle_timeout(now(t), &mut out);
        assert_eq!(sb.poll_at(), Some(t), "re-armed");
        let s = sends(&out);
        assert_eq!(s.len(), limit, "event {k}");
        for (i, (dst, port, payload)) in s.iter().enumerate() {
            assert_eq!(*dst, addr(if i % 2 == 0 { 1 } else { 3 }));
            assert_eq!(*port, 4300);
            assert_eq!(payload.len(), 1400);
            assert!(payload.starts_with(b"fw"));
        }
        assert_eq!(stat(&mut sb, id, "refused"), k, "one refusal per event ends the burst");
        assert_eq!(stat(&mut sb, id, "pages"), k.min(room));
        assert_eq!(stat(&mut sb, id, "grow_refused"), (k - room).max(0));
        t += 1;
    }
    // Memory stops at the principal's cap and stays there; sends go on.
    assert_eq!(sb.memory_used(&user()) as u64, cap);
    assert_eq!(stat(&mut sb, id, "failed"), 0);
    assert_eq!(stat(&mut sb, id, "sent"), (room + 3) * limit as i32);

    // A packet on its channel is a burst too, and its source is a neighbour already.
    let mut out = Vec::new();
    assert_eq!(sb.deliver(now(t), addr(3), 4300, b"fw\0\0\0\x07", &mut out), 1);
    assert_eq!(sends(&out).len(), limit);
    assert_eq!(stat(&mut sb, id, "neighbours"), 2);

    // The literal loop in one invocation: the memory is at its cap, so it traps at once.
    assert_eq!(sb.invoke(now(t), id, "flood", b"", &mut out), Err(InvokeError::MemoryLimit));
    assert_eq!(sb.module(id).unwrap().counters.memory_exhausted, 1);
    assert!(sb.memory_used(&user()) as u64 <= cap);

    // stop: no alarm, no channel.
    assert_eq!(sb.invoke(now(t), id, "stop", b"", &mut out), Ok(0));
    let _ = invocations(&mut sb);
    let mut out = Vec::new();
    sb.handle_timeout(now(t + 1), &mut out);
    assert_eq!(sb.deliver(now(t + 1), addr(3), 4300, b"fw", &mut out), 0);
    assert!(out.is_empty() && invocations(&mut sb).is_empty());
    bystander_counts(&mut sb, other, 1);
}

#[test]
fn forwarder_flood_ends_on_memory_or_cpu() {
    // Enough fuel: the loop grows memory until the cap, then traps.
    let mut sb = sandbox_with(config(1), middle());
    let other = bystander(&mut sb);
    let id = load(&mut sb, "forwarder", FORWARDER, 2 << 20, 10_000_000);
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "flood", b"", &mut out), Err(InvokeError::MemoryLimit));
    assert!(out.is_empty(), "a failed invocation sends nothing");
    assert_eq!(sb.memory_used(&user()), 2 << 20);
    assert!(stat(&mut sb, id, "refused") > 0, "it ran past the send limit");
    bystander_counts(&mut sb, other, 1);
    // Little fuel and plenty of memory: it ends on CPU first.
    let mut sb = sandbox_with(config(1), middle());
    let id = load(&mut sb, "forwarder", FORWARDER, 64 << 20, 400_000);
    assert_eq!(sb.invoke(now(1), id, "flood", b"", &mut out), Err(InvokeError::CpuExhausted));
    assert!(sb.memory_used(&user()) < 64 << 20);
    assert_eq!(sb.module(id).unwrap().counters.cpu_exhausted, 1);
}

#[test]
fn forwarder_halves_payloads_the_host_finds_too_large() {
    let mut cfg = config(1);
    cfg.host.max_payload = 1000;
    let mut sb = sandbox_with(cfg, middle());
    let id = load(&mut sb, "forwarder", FORWARDER, 4 << 20, 1_000_000);
    let mut out = Vec::new();
    sb.handle_timeout(now(0), &mut out);
    let s = sends(&out);
    assert_eq!(s.len(), 16);
    assert!(s.iter().all(|(_, _, p)| p.len() == 700), "{:?}", s.iter().map(|x| x.2.len()).collect::<Vec<_>>());
    assert_eq!(stat(&mut sb, id, "failed"), 0);
}

#[test]
fn forwarder_without_neighbours_only_allocates() {
    let mut sb = sandbox_with(config(1), line_routes(1, 1));
    let id = load(&mut sb, "forwarder", FORWARDER, 4 << 20, 1_000_000);
    assert_eq!(stat(&mut sb, id, "neighbours"), 0);
    let mut out = Vec::new();
    sb.handle_timeout(now(0), &mut out);
    assert!(out.is_empty());
    assert_eq!(stat(&mut sb, id, "pages"), 1);
    assert_eq!(sb.poll_at(), Some(0));
}

const ALARMS: &[Interface] = &[Interface::Time, Interface::State];

#[test]
fn alarms_is_stopped_by_its_cpu_bound_because_host_calls_are_charged() {
    // 100,000 set_alarm calls cost 100,000 × DEFAULT_HOST_CALL_FUEL: more
    // than the node's largest bound (10 M): the flood cannot even load.
    let mut sb = sandbox_with(config(2), line_routes(1, 1));
    let other = bystander(&mut sb);
    let e = try_load(&mut sb, "alarms", ALARMS, 4 << 20, 10_000_000).unwrap_err();
    assert_eq!(e, LoadError::InitFailed(InvokeError::CpuExhausted));
    bystander_counts(&mut sb, other, 1);
}

#[test]
fn alarms_hits_the_alarm_cap_and_counts_the_refusals() {
    // Host calls free (not the default): the alarm cap alone holds.
    let mut sb = sandbox_with(SandboxConfig { host_call_fuel: 0, ..config(2) }, line_routes(1, 1));
    let other = bystander(&mut sb);
    let cap = SandboxConfig::default().host.alarms as i32;
    let id = load(&mut sb, "alarms", ALARMS, 4 << 20, 10_000_000);
    assert_eq!(entries(&sb, id), ["fire", "stats"]);
    // anode_init tried 100,000: the host took `cap` and refused the rest.
    assert_eq!(stat(&mut sb, id, "set"), cap);
    assert_eq!(stat(&mut sb, id, "refused"), 100_000 - cap);
    assert_eq!(stat(&mut sb, id, "failed"), 0);
    assert_eq!(sb.poll_at(), Some(10));
    // Two alarms fire (the poll's bound); each frees one slot and tries 100,000 again.
    let _ = invocations(&mut sb);
    let mut out = Vec::new();
    sb.handle_timeout(now(10), &mut out);
    let runs = invocations(&mut sb);
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.ok), "survives every refusal: {runs:?}");
    println!("alarms: {} fuel per round of 100,000 attempts", runs[0].fuel);
    assert_eq!(stat(&mut sb, id, "set"), cap + 2);
    assert_eq!(stat(&mut sb, id, "refused"), 100_000 - cap + 2 * 99_999);
    assert_eq!(stat(&mut sb, id, "failed"), 0);
    assert_eq!(stat(&mut sb, id, "other"), -1);
    assert_eq!(sb.module(id).unwrap().counters.traps, 0);
    bystander_counts(&mut sb, other, 1);
}

#[test]
fn alarms_under_a_bound_below_one_round_is_refused_at_load() {
    let mut sb = sandbox_with(SandboxConfig { host_call_fuel: 0, ..config(2) }, line_routes(1, 1));
    let e = try_load(&mut sb, "alarms", ALARMS, 4 << 20, 1_000_000).unwrap_err();
    assert_eq!(e, LoadError::InitFailed(InvokeError::CpuExhausted));
    assert!(sb.modules().is_empty());
}

#[test]
fn poolflood_sends_to_its_own_channel() {
    let mut sb = sandbox_with(config(1), line_routes(1, 2));
    let id = load(&mut sb, "poolflood", &[Interface::Net, Interface::Route], 4 << 20, 1_000_000);
    assert_eq!(entries(&sb, id), ["kick", "on_packet", "stats"]);
    assert!(sb.has_channel(4400, std::net::Ipv4Addr::UNSPECIFIED, b"pf"));
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "kick", b"", &mut out), Ok(8));
    let first: Vec<Vec<u8>> = sends(&out)
        .into_iter()
        .map(|(dst, port, p)| {
            // To its own node, port and prefix: its own channel takes them.
            assert_eq!((dst, port), (addr(1), 4400));
            assert_eq!(p, b"pf\0\0\0\0");
            p.to_vec()
        })
        .collect();
    assert_eq!(first.len(), 8);
    // Each packet delivered back queues eight more, one generation on.
    let mut next = Vec::new();
    for p in &first {
        assert_eq!(sb.deliver(now(2), addr(1), 4400, p, &mut next), 1);
    }
    let s = sends(&next);
    assert_eq!(s.len(), 64);
    assert!(s.iter().all(|(d, port, p)| *d == addr(1) && *port == 4400 && *p == b"pf\0\0\0\x01"));
    assert_eq!(stat(&mut sb, id, "sent"), 72);
    assert_eq!(stat(&mut sb, id, "refused"), 0);
}
