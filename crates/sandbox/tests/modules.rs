//! Loading, thinning, limits and host interfaces with the SDK-built example
//! modules (run `scripts/setup` first) and hand-written WAT.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{
    Attenuation, CredError, Interface, InterfaceSet, ModuleGrant, ModuleHash, ModuleName, NameRequest, PrincipalId,
    RequestedLimits, SigningKey, sign_module,
};
use anode_sandbox::cred::Issuer;
use anode_sandbox::{Action, CpuBound, InvokeError, LoadError, LoadSpec, Sandbox, SandboxConfig};
use common::*;

fn spec<'a>(code: &'a [u8], cred: Option<&'a [u8]>) -> LoadSpec<'a> {
    LoadSpec { code, credential: cred, requester: None, local_name: None, limits: RequestedLimits::default() }
}

/// The effect-free check every refusal ends with: nothing loaded, nothing named.
fn assert_no_effect(sb: &Sandbox, code: &[u8]) {
    assert!(sb.modules().is_empty(), "a refused load left modules: {:?}", sb.modules());
    assert_eq!(sb.resolve(&NameRequest::Hash(ModuleHash::of(code))), None);
    assert_eq!(sb.memory_used(&user()), 0);
}

/// A working counter module next to the hostile one, to show it is unaffected.
fn counter(sb: &mut Sandbox) -> anode_sandbox::ModuleId {
    let code = module("counter");
    let c = admin(PrincipalId([77; 32]));
    sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap()
}

fn counter_still_counts(sb: &mut Sandbox, id: anode_sandbox::ModuleId, expect: i32) {
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "incr", b"k", &mut out), Ok(expect));
}

#[test]
fn counter_module_uses_state_marshal_log_and_net() {
    let mut sb = sandbox();
    let code = module("counter");
    let cred = ordinary(
        user(),
        vec![ModuleGrant::Hash(ModuleHash::of(&code))],
        &[Interface::State, Interface::Marshal, Interface::Log, Interface::Net],
    );
    let id = sb.load(now(0), &spec(&code, Some(cred.to_bytes()))).unwrap();
    let info = sb.module(id).unwrap();
    assert_eq!(info.entries, vec!["incr".to_string(), "report".to_string()]);
    assert_eq!(info.principal, user());
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "incr", b"apples", &mut out), Ok(1));
    assert_eq!(sb.invoke(now(2), id, "incr", b"apples", &mut out), Ok(2));
    assert_eq!(sb.invoke(now(2), id, "incr", b"pears", &mut out), Ok(1));
    assert!(out.is_empty());
    assert_eq!(sb.invoke(now(3), id, "report", b"apples", &mut out), Ok(0));
    let mut enc = Vec::new();
    anode_sandbox::marshal::encode([&b"apples"[..], &2u32.to_be_bytes()].into_iter(), &mut enc).unwrap();
    assert!(out.contains(&Action::DeliverLocal { principal: user(), port: 7, payload: enc }), "{out:?}");
    assert!(out.iter().any(|a| matches!(a, Action::Log { text, .. } if text == "counter report")));
    assert_eq!(sb.state_bytes(&user()), "apples".len() + 4 + "pears".len() + 4);
    assert_eq!(sb.module(id).unwrap().counters.ok, 4);
}

#[test]
fn forbidden_import_is_refused_naming_import_and_right() {
    let mut sb = sandbox();
    let code = module("sneaky");
    let cred = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&code))], &[Interface::Log]);
    let e = sb.load(now(0), &spec(&code, Some(cred.to_bytes()))).unwrap_err();
    assert_eq!(e, LoadError::ForbiddenImport { import: "net.send".into(), right: Some(Interface::Net) });
    assert!(e.to_string().contains("net.send") && e.to_string().contains("Net"), "{e}");
    assert_no_effect(&sb, &code);
    assert_eq!(sb.counters().load_refused.get("forbidden_import"), Some(&1));
    // With net granted too, it loads.
    let cred = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&code))], &[Interface::Log, Interface::Net]);
    assert!(sb.load(now(0), &spec(&code, Some(cred.to_bytes()))).is_ok());
}

#[test]
fn attenuated_interfaces_thin_the_module() {
    let mut sb = sandbox();
    let code = module("sneaky");
    let cred = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(&code))], &[Interface::Log, Interface::Net]);
    let thin = cred
        .attenuate(&Attenuation { interfaces: Some(InterfaceSet::of(&[Interface::Log])), ..Default::default() })
        .unwrap();
    let e = sb.load(now(0), &spec(&code, Some(thin.to_bytes()))).unwrap_err();
    assert!(matches!(e, LoadError::Denied(CredError::CheckFailed { .. })), "{e}");
    assert_no_effect(&sb, &code);
}

#[test]
fn import_from_no_host_interface_is_refused() {
    let mut sb = sandbox();
    let code =
        wat(r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32))))"#);
    let c = admin(user());
    let e = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err();
    assert_eq!(e, LoadError::ForbiddenImport { import: "wasi_snapshot_preview1.fd_write".into(), right: None });
    assert_no_effect(&sb, &code);
    // A function the interface does not have.
    let code = wat(r#"(module (import "net" "raw_socket" (func)))"#);
    let e = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err();
    assert_eq!(e, LoadError::UnknownImport { import: "net.raw_socket".into() });
    let code = wat(r#"(module (import "anode" "kill" (func)))"#);
    let e = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err();
    assert_eq!(e, LoadError::UnknownImport { import: "anode.kill".into() });
    assert_no_effect(&sb, &code);
    // A granted interface imported with the wrong signature fails instantiation.
    let code = wat(r#"(module (import "log" "write" (func (param i64))))"#);
    let e = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err();
    assert!(matches!(e, LoadError::Instantiate(_)), "{e}");
    assert_no_effect(&sb, &code);
}

#[test]
fn malformed_and_oversize_modules_are_refused() {
    let mut sb = sandbox_with(SandboxConfig { max_module: 4096, ..Default::default() }, line_routes(1, 1));
    let c = admin(user());
    for bad in [&b""[..], b"\0asm", b"\0asm\x01\0\0\0\x01\x04\x01\x60\0", b"not wasm at all"] {
        let e = sb.load(now(0), &spec(bad, Some(c.to_bytes()))).unwrap_err();
        assert!(matches!(e, LoadError::Malformed(_)), "{bad:?}: {e}");
        assert_no_effect(&sb, bad);
    }
    // Valid framing, invalid code: caught by the compiler.
    let bad = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\x00\x0a\x05\x01\x03\0\x6a\x0b";
    assert!(matches!(sb.load(now(0), &spec(bad, Some(c.to_bytes()))).unwrap_err(), LoadError::Malformed(_)));
    let mut big = module("counter");
    big.extend(std::iter::repeat_n(0u8, 4096));
    assert_eq!(
        sb.load(now(0), &spec(&big, Some(c.to_bytes()))).unwrap_err(),
        LoadError::TooLarge { size: big.len(), max: 4096 }
    );
    assert_no_effect(&sb, &big);
}

#[test]
fn credential_refusals_have_no_effect() {
    let code = module("counter");
    let hash = ModuleHash::of(&code);
    let mut sb = sandbox();
    // No credential.
    let e = sb.load(now(0), &spec(&code, None)).unwrap_err();
    assert_eq!(e, LoadError::Denied(CredError::NoCredential));
    assert_no_effect(&sb, &code);
    // Wrong issuer.
    let other = Issuer::from_secret(&[2; 32]).unwrap().admin(user(), None).unwrap();
    assert_eq!(
        sb.load(now(0), &spec(&code, Some(other.to_bytes()))).unwrap_err(),
        LoadError::Denied(CredError::WrongIssuer)
    );
    // Expired.
    let ifaces = [Interface::State, Interface::Marshal, Interface::Log, Interface::Net];
    let soon = issuer()
        .issue(
            user(),
            &anode_cred::GrantSpec {
                modules: vec![ModuleGrant::Hash(hash)],
                interfaces: InterfaceSet::of(&ifaces),
                limits: limits(),
                expires: Some(now(10).wall),
            },
        )
        .unwrap();
    let e = sb.load(now(10), &spec(&code, Some(soon.to_bytes()))).unwrap_err();
    assert!(matches!(e, LoadError::Denied(CredError::Expired { .. })), "{e}");
    // Attenuated beyond the parent: a block claiming admin and more memory.
    let c = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash([0; 32]))], &ifaces);
    let wide = c
        .attenuate_datalog(&format!(
            "right(\"admin\"); grant_hash(\"{}\"); limit(\"memory\", 999999999);",
            hash.to_hex()
        ))
        .unwrap();
    assert_eq!(
        sb.load(now(0), &spec(&code, Some(wide.to_bytes()))).unwrap_err(),
        LoadError::Denied(CredError::NotGranted { module: hash })
    );
    let c = ordinary(user(), vec![ModuleGrant::Hash(hash)], &ifaces);
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.memory = Some(999_999_999);
    assert!(matches!(sb.load(now(0), &s).unwrap_err(), LoadError::Denied(CredError::LimitExceeded { .. })));
    // Granted for another hash ("wrong hash").
    let c = ordinary(user(), vec![ModuleGrant::Hash(ModuleHash::of(b"other code"))], &ifaces);
    assert_eq!(
        sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err(),
        LoadError::Denied(CredError::NotGranted { module: hash })
    );
    assert_no_effect(&sb, &code);
    let refused: u64 = sb.counters().load_refused.values().sum();
    assert_eq!(refused, 6);
    assert_eq!(sb.auth_counters().denied_total(), 6);
    assert_eq!(sb.auth_counters().allowed, 0);
}

#[test]
fn invalid_programmer_signature_is_refused() {
    let mut sb = sandbox();
    let programmer = SigningKey::from_bytes(&[5; 32]);
    let signed = sign_module(&module("counter"), &programmer, "counter", "1").unwrap();
    let mut bad = signed.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let c = admin(user());
    let e = sb.load(now(0), &spec(&bad, Some(c.to_bytes()))).unwrap_err();
    assert!(matches!(e, LoadError::BadSignature(anode_cred::NameError::InvalidSignature { .. })), "{e}");
    assert_no_effect(&sb, &bad);
    assert!(sb.load(now(0), &spec(&signed, Some(c.to_bytes()))).is_ok());
}

#[test]
fn version_preference_lists_fall_back() {
    let mut sb = sandbox();
    let q = SigningKey::from_bytes(&[5; 32]);
    let v1 = sign_module(&module("counter"), &q, "IPv4", "version1").unwrap();
    let v2 = sign_module(&module("counter"), &q, "IPv4", "version2").unwrap();
    let cred = ordinary(
        user(),
        vec![ModuleGrant::Signed { programmer: PrincipalId::of(&q), name: "IPv4".into() }],
        &[Interface::State, Interface::Marshal, Interface::Log, Interface::Net],
    );
    let req = NameRequest::signed(PrincipalId::of(&q), "IPv4/version2 | IPv4/version1").unwrap();
    assert_eq!(sb.resolve(&req), None);
    let id1 = sb.load(now(0), &spec(&v1, Some(cred.to_bytes()))).unwrap();
    assert_eq!(sb.resolve(&req), Some(id1));
    let id2 = sb.load(now(0), &spec(&v2, Some(cred.to_bytes()))).unwrap();
    assert_eq!(sb.resolve(&req), Some(id2));
    assert!(sb.module(id2).unwrap().names.contains(&ModuleName::Signed {
        programmer: PrincipalId::of(&q),
        name: "IPv4".into(),
        version: "version2".into()
    }));
    // Hash names and the loader's own names resolve too.
    assert_eq!(sb.resolve(&NameRequest::Hash(ModuleHash::of(&v1))), Some(id1));
    let code = module("counter");
    let cred = ordinary(
        user(),
        vec![ModuleGrant::Local("ctr".into())],
        &[Interface::State, Interface::Marshal, Interface::Log, Interface::Net],
    );
    let mut s = spec(&code, Some(cred.to_bytes()));
    s.local_name = Some("ctr");
    let id3 = sb.load(now(0), &s).unwrap();
    assert_eq!(sb.resolve(&NameRequest::local(user(), "missing | ctr").unwrap()), Some(id3));
    assert!(sb.unload(id2));
    assert_eq!(sb.resolve(&req), Some(id1));
}

#[test]
fn infinite_loop_ends_that_invocation_only() {
    let mut sb = sandbox();
    let ctr = counter(&mut sb);
    let code = module("spin");
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.cpu = Some(200_000);
    let id = sb.load(now(0), &s).unwrap();
    let mut out = Vec::new();
    for _ in 0..3 {
        assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Err(InvokeError::CpuExhausted));
    }
    assert_eq!(sb.module(id).unwrap().counters.cpu_exhausted, 3);
    counter_still_counts(&mut sb, ctr, 1);
}

#[test]
fn infinite_loop_under_epoch_interruption() {
    let cfg = SandboxConfig { cpu: CpuBound::Epoch { ticks: 2 }, ..Default::default() };
    let mut sb = sandbox_with(cfg, line_routes(1, 1));
    let engine = sb.engine().clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let ticker = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(1));
            engine.increment_epoch();
        }
    });
    let code = module("spin");
    let c = admin(user());
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut out = Vec::new();
    let r = sb.invoke(now(1), id, "run", b"", &mut out);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    ticker.join().unwrap();
    assert_eq!(r, Err(InvokeError::CpuExhausted));
}

#[test]
fn a_session_heap_reservation_caps_the_principal_in_place_of_its_grants() {
    let mut sb = sandbox();
    let code = module("membomb");
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.memory = Some(8 << 20);
    let id = sb.load(now(0), &s).unwrap();
    let mut out = Vec::new();
    // A 2 MiB reservation: the bomb stops there, not at its grant's 8 MiB.
    sb.set_session_heap(user(), Some(2 << 20));
    assert_eq!(sb.session_heap_principals(), vec![user()]);
    assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Err(InvokeError::MemoryLimit));
    let used = sb.memory_used(&user());
    assert!(used <= 2 << 20, "{used}");
    // The session gone: its grants cap it again.
    sb.set_session_heap(user(), None);
    assert!(sb.session_heap_principals().is_empty());
    assert_eq!(sb.invoke(now(2), id, "run", b"", &mut out), Err(InvokeError::MemoryLimit));
    let used = sb.memory_used(&user());
    assert!(used > 2 << 20 && used <= 8 << 20, "{used}");
    // A reservation set before the principal has any store applies when it loads.
    let other = PrincipalId([9; 32]);
    sb.set_session_heap(other, Some(2 << 20));
    let other_cred = admin(other);
    let mut s2 = spec(&code, Some(other_cred.to_bytes()));
    s2.limits.memory = Some(8 << 20);
    let id2 = sb.load(now(3), &s2).unwrap();
    assert_eq!(sb.invoke(now(4), id2, "run", b"", &mut out), Err(InvokeError::MemoryLimit));
    assert!(sb.memory_used(&other) <= 2 << 20, "{}", sb.memory_used(&other));
}

#[test]
fn memory_bomb_is_stopped_at_the_principal_cap() {
    let mut sb = sandbox();
    let ctr = counter(&mut sb);
    let code = module("membomb");
    let c = admin(user());
    let mut s = spec(&code, Some(c.to_bytes()));
    s.limits.memory = Some(2 << 20);
    let id = sb.load(now(0), &s).unwrap();
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Err(InvokeError::MemoryLimit));
    assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Err(InvokeError::MemoryLimit));
    assert!(sb.memory_used(&user()) <= 2 << 20, "{}", sb.memory_used(&user()));
    assert_eq!(sb.module(id).unwrap().counters.memory_exhausted, 2);
    counter_still_counts(&mut sb, ctr, 1);
    // A module whose initial memory exceeds the cap is refused at load.
    let big = wat(r#"(module (memory 64))"#); // 4 MiB
    let e = sb.load(now(0), &s_with(&big, c.to_bytes(), 1 << 20)).unwrap_err();
    assert_eq!(e, LoadError::MemoryLimit { cap: 2 << 20 });
}

fn s_with<'a>(code: &'a [u8], cred: &'a [u8], mem: u64) -> LoadSpec<'a> {
    let mut s = spec(code, Some(cred));
    s.limits.memory = Some(mem);
    s
}

#[test]
fn module_trapping_on_every_call_is_counted() {
    let mut sb = sandbox();
    let ctr = counter(&mut sb);
    let code = module("trapper");
    let c = admin(user());
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut out = Vec::new();
    for _ in 0..5 {
        assert!(matches!(sb.invoke(now(1), id, "run", b"x", &mut out), Err(InvokeError::Trap(_))));
    }
    assert_eq!(sb.module(id).unwrap().counters.traps, 5);
    assert_eq!(sb.counters().invoke_failed.get("trap"), Some(&5));
    counter_still_counts(&mut sb, ctr, 1);
    assert_eq!(sb.invoke(now(1), id, "nope", b"", &mut out), Err(InvokeError::UnregisteredEntry("nope".into())));
}

#[test]
fn init_that_traps_or_spins_refuses_the_load() {
    let mut sb = sandbox();
    let c = admin(user());
    let code = wat(r#"(module (func (export "anode_init") unreachable))"#);
    assert!(matches!(
        sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err(),
        LoadError::InitFailed(InvokeError::Trap(_))
    ));
    let code = wat(r#"(module (func (export "anode_init") (loop (br 0))))"#);
    assert_eq!(
        sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err(),
        LoadError::InitFailed(InvokeError::CpuExhausted)
    );
    let code = wat(r#"(module (func $s (loop (br 0))) (start $s))"#);
    assert_eq!(
        sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap_err(),
        LoadError::InitFailed(InvokeError::CpuExhausted)
    );
    assert!(sb.modules().is_empty());
}

#[test]
fn channels_demux_and_alarms_fire() {
    let mut sb = sandbox();
    let code = module("channel");
    let c = ordinary(
        user(),
        vec![ModuleGrant::Hash(ModuleHash::of(&code))],
        &[Interface::Net, Interface::State, Interface::Time, Interface::Log],
    );
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut out = Vec::new();
    assert_eq!(sb.deliver(now(5), addr(2), 4000, b"hi there", &mut out), 1);
    assert_eq!(
        out,
        vec![Action::SendPacket {
            principal: user(),
            dst: addr(2),
            port: 4001,
            payload: b"hi there".to_vec(),
            flow: None
        }]
    );
    out.clear();
    assert_eq!(sb.deliver(now(5), addr(2), 4000, b"bye", &mut out), 0, "prefix does not match");
    assert_eq!(sb.deliver(now(5), addr(2), 4002, b"hi", &mut out), 0, "port does not match");
    assert_eq!(sb.poll_at(), Some(100));
    sb.handle_timeout(now(99), &mut out);
    assert!(out.is_empty());
    sb.handle_timeout(now(100), &mut out);
    assert!(
        matches!(&out[..], [Action::Log { module, text, .. }] if *module == id && text == "channel tick"),
        "{out:?}"
    );
    assert_eq!(sb.counters().alarms_fired, 1);
    assert_eq!(sb.poll_at(), None);
    out.clear();
    assert_eq!(sb.invoke(now(200), id, "close", b"", &mut out), Ok(0));
    assert_eq!(sb.deliver(now(201), addr(2), 4000, b"hi again", &mut out), 0);
    assert_eq!(sb.invoke(now(200), id, "close", b"", &mut out), Ok(-1), "already closed");
}

#[test]
fn handles_cannot_be_forged_by_another_module() {
    let mut sb = sandbox();
    let chan = module("channel");
    let c = admin(user());
    sb.load(now(0), &spec(&chan, Some(c.to_bytes()))).unwrap();
    // The same principal (same store, same handle table) tries every small handle.
    let forger = wat(r#"(module
            (import "net" "close_channel" (func $close (param i32) (result i32)))
            (import "time" "cancel_alarm" (func $cancel (param i32) (result i32)))
            (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "run")
            (table (export "__indirect_function_table") 2 funcref)
            (elem (i32.const 1) $run)
            (func $run (param i32 i32) (result i32) (local $g i32) (local $i i32) (local $ok i32)
              (local.set $g (i32.const 0))
              (loop $gl
                (local.set $i (i32.const 0))
                (loop $il
                  (if (i32.ge_s (call $close (i32.or (i32.shl (local.get $g) (i32.const 16)) (local.get $i))) (i32.const 0))
                    (then (local.set $ok (i32.add (local.get $ok) (i32.const 1)))))
                  (if (i32.ge_s (call $cancel (i32.or (i32.shl (local.get $g) (i32.const 16)) (local.get $i))) (i32.const 0))
                    (then (local.set $ok (i32.add (local.get $ok) (i32.const 1)))))
                  (local.set $i (i32.add (local.get $i) (i32.const 1)))
                  (br_if $il (i32.lt_u (local.get $i) (i32.const 64))))
                (local.set $g (i32.add (local.get $g) (i32.const 1)))
                (br_if $gl (i32.lt_u (local.get $g) (i32.const 8))))
              (local.get $ok))
            (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 1)))))"#);
    let id = sb.load(now(0), &spec(&forger, Some(c.to_bytes()))).unwrap();
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), id, "run", b"", &mut out), Ok(0), "no forged handle worked");
    assert_eq!(sb.deliver(now(2), addr(2), 4000, b"hi", &mut out), 1, "the channel is still open");
    sb.handle_timeout(now(100), &mut out);
    assert_eq!(sb.counters().alarms_fired, 1, "the alarm was not cancelled");
}

#[test]
fn unload_frees_names_channels_and_memory() {
    let mut sb = sandbox();
    let code = module("channel");
    let c = admin(user());
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    assert!(sb.memory_used(&user()) > 0);
    assert!(sb.unload(id));
    assert!(!sb.unload(id));
    assert_no_effect(&sb, &code);
    let mut out = Vec::new();
    assert_eq!(sb.deliver(now(1), addr(2), 4000, b"hi", &mut out), 0);
    sb.handle_timeout(now(100), &mut out);
    assert!(out.is_empty());
    assert_eq!(sb.invoke(now(1), id, "tick", b"", &mut out), Err(InvokeError::NoSuchModule));
}

#[test]
fn init_actions_are_returned_by_load_with() {
    let mut sb = sandbox();
    let code = wat(r#"(module
            (import "log" "write" (func $log (param i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "started")
            (func (export "anode_init") (drop (call $log (i32.const 0) (i32.const 7)))))"#);
    let c = admin(user());
    let mut out = Vec::new();
    let id = sb.load_with(now(0), &spec(&code, Some(c.to_bytes())), &mut out).unwrap();
    assert!(matches!(&out[..], [Action::Log { module, text, .. }] if *module == id && text == "started"), "{out:?}");
}

#[test]
fn log_is_rate_limited_per_module() {
    let mut sb = sandbox();
    let code = wat(r#"(module
            (import "log" "write" (func $log (param i32 i32) (result i32)))
            (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "spam")
            (table (export "__indirect_function_table") 2 funcref)
            (elem (i32.const 1) $spam)
            (func $spam (param i32 i32) (result i32) (local $i i32)
              (loop $l
                (drop (call $log (i32.const 0) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br_if $l (i32.lt_u (local.get $i) (i32.const 100))))
              (i32.const 0))
            (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 1)))))"#);
    let c = admin(user());
    let id = sb.load(now(0), &spec(&code, Some(c.to_bytes()))).unwrap();
    let mut out = Vec::new();
    sb.invoke(now(0), id, "spam", b"", &mut out).unwrap();
    assert_eq!(out.len(), 20, "the burst");
    assert_eq!(sb.module(id).unwrap().counters.log_dropped, 80);
    out.clear();
    sb.invoke(now(1000), id, "spam", b"", &mut out).unwrap();
    assert_eq!(out.len(), 10, "one second of refill");
}

#[test]
fn principals_have_separate_stores_and_state() {
    let mut sb = sandbox();
    let code = module("counter");
    let a = sb.load(now(0), &spec(&code, Some(admin(PrincipalId([1; 32])).to_bytes()))).unwrap();
    let b = sb.load(now(0), &spec(&code, Some(admin(PrincipalId([2; 32])).to_bytes()))).unwrap();
    let mut out = Vec::new();
    assert_eq!(sb.invoke(now(1), a, "incr", b"k", &mut out), Ok(1));
    assert_eq!(sb.invoke(now(1), a, "incr", b"k", &mut out), Ok(2));
    assert_eq!(sb.invoke(now(1), b, "incr", b"k", &mut out), Ok(1), "b sees none of a's state");
    assert_eq!(sb.cache_stats().inserts, 1, "compiled once, instantiated twice");
}

#[test]
fn sandbox_can_move_to_the_daemon_thread() {
    fn send<T: Send>() {}
    send::<Sandbox>();
    send::<anode_sandbox::Action>();
}

#[test]
fn a_retried_load_finds_the_module_it_loaded() {
    let mut sb = sandbox();
    let code = module("counter");
    let c = admin(user());
    let named = |name: &'static str| LoadSpec { local_name: Some(name), ..spec(&code, Some(c.to_bytes())) };
    let mut out = Vec::new();
    let (a, again) = sb.load_once(now(0), &named("ctr"), &mut out).unwrap();
    assert!(!again);
    assert_eq!(sb.load_once(now(1), &named("ctr"), &mut out).unwrap(), (a, true), "same principal, code, name");
    assert_eq!(sb.load(now(1), &named("ctr")).unwrap(), a);
    assert_eq!(sb.modules(), vec![a]);
    assert_eq!(sb.counters().reloads, 2);
    assert_eq!(sb.counters().loads, 1);
    // Another name, or another principal, is another module.
    let b = sb.load(now(2), &named("ctr2")).unwrap();
    let other = admin(PrincipalId([3; 32]));
    let o = sb.load(now(2), &LoadSpec { local_name: Some("ctr"), ..spec(&code, Some(other.to_bytes())) }).unwrap();
    assert_eq!(sb.modules().len(), 3);
    assert!(a != b && b != o);
    // After an unload the same request loads afresh.
    assert!(sb.unload(a));
    let (a2, again) = sb.load_once(now(3), &named("ctr"), &mut out).unwrap();
    assert!(!again && a2 != a);
}

#[test]
fn a_module_is_unloaded_when_its_credential_expires() {
    let mut sb = sandbox();
    let code = module("counter");
    let ifaces = [Interface::State, Interface::Marshal, Interface::Log, Interface::Net];
    let cred = |expires: u64| {
        issuer()
            .issue(
                user(),
                &anode_cred::GrantSpec {
                    modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
                    interfaces: InterfaceSet::of(&ifaces),
                    limits: limits(),
                    expires: Some(now(expires).wall),
                },
            )
            .unwrap()
    };
    let short = cred(5_000);
    let id = sb.load(now(0), &spec(&code, Some(short.to_bytes()))).unwrap();
    let long = cred(60_000);
    let kept = sb.load(now(0), &LoadSpec { local_name: Some("long"), ..spec(&code, Some(long.to_bytes())) }).unwrap();
    // The sandbox asks to be woken at the expiry.
    assert_eq!(sb.poll_at(), Some(5_000));
    let mut out = Vec::new();
    sb.handle_timeout(now(4_999), &mut out);
    assert_eq!(sb.modules().len(), 2, "not before its date");
    sb.handle_timeout(now(5_000), &mut out);
    assert_eq!(sb.modules(), vec![kept], "unloaded at its date; the other stays");
    assert_eq!(sb.invoke(now(5_001), id, "incr", b"k", &mut out), Err(InvokeError::NoSuchModule));
    assert_eq!(sb.counters().credential_unloads, 1);
    assert_eq!(sb.poll_at(), Some(60_000));
    // A credential without a date is never looked at again.
    let mut sb = sandbox();
    sb.load(now(0), &spec(&code, Some(admin(user()).to_bytes()))).unwrap();
    assert_eq!(sb.poll_at(), None);
}
