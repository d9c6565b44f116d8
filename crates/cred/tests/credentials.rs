//! Every credential decision, allowed and refused, end to end.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use anode_cred::*;

const EMPTY_WASM: &[u8] = b"\0asm\x01\0\0\0";

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn user() -> PrincipalId {
    PrincipalId::of(&SigningKey::from_bytes(&[9; 32]))
}

fn code() -> CodeInfo {
    CodeInfo::inspect(EMPTY_WASM).unwrap()
}

fn spec(modules: Vec<ModuleGrant>) -> GrantSpec {
    GrantSpec {
        modules,
        interfaces: InterfaceSet::of(&[Interface::Log, Interface::Time]),
        limits: Limits { memory: 1 << 20, cpu: 100_000, state: 4096 },
        expires: Some(t(100)),
    }
}

fn req<'a>(cred: &'a [u8], code: &'a CodeInfo) -> LoadRequest<'a> {
    LoadRequest {
        credential: Some(cred),
        requester: None,
        code,
        local_name: None,
        interfaces: InterfaceSet::of(&[Interface::Log]),
        limits: RequestedLimits::default(),
    }
}

fn setup() -> (Issuer, Verifier) {
    let i = Issuer::from_secret(&[1; 32]).unwrap();
    let v = Verifier::new(i.public_key(), VerifierConfig::default());
    (i, v)
}

#[test]
fn admin_credential_loads_anything_with_node_limits() {
    let (i, mut v) = setup();
    let c = i.admin(user(), None).unwrap();
    let code = code();
    let mut r = req(c.to_bytes(), &code);
    r.interfaces = InterfaceSet::ALL;
    let g = v.authorize(t(0), &r).unwrap();
    assert!(g.admin);
    assert_eq!(g.principal, user());
    assert_eq!(g.interfaces, InterfaceSet::ALL);
    assert_eq!(g.limits, v.config().node_limits);
    assert_eq!(g.names, vec![ModuleName::Hash(code.hash)]);
    assert_eq!(v.counters().allowed, 1);
}

#[test]
fn ordinary_credential_loads_granted_hash_only() {
    let (i, mut v) = setup();
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(code.hash)])).unwrap();
    let g = v.authorize(t(0), &req(c.to_bytes(), &code)).unwrap();
    assert!(!g.admin);
    assert_eq!(g.limits, Limits { memory: 1 << 20, cpu: 100_000, state: 4096 });
    assert_eq!(g.interfaces, InterfaceSet::of(&[Interface::Log, Interface::Time]));

    let other = CodeInfo::inspect(b"\0asm\x01\0\0\0\0\x02\x01x").unwrap();
    let e = v.authorize(t(0), &req(c.to_bytes(), &other)).unwrap_err();
    assert_eq!(e, CredError::NotGranted { module: other.hash });
    assert_eq!(v.counters().denied.get("not_granted"), Some(&1));
}

#[test]
fn no_credential_is_refused() {
    let (_, mut v) = setup();
    let code = code();
    let mut r = req(&[], &code);
    r.credential = None;
    assert_eq!(v.authorize(t(0), &r).unwrap_err(), CredError::NoCredential);
    assert_eq!(v.counters().denied_total(), 1);
    assert_eq!(v.counters().allowed, 0);
}

#[test]
fn expired_credential_is_refused() {
    let (i, mut v) = setup();
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(code.hash)])).unwrap();
    assert!(v.authorize(t(99), &req(c.to_bytes(), &code)).is_ok());
    let e = v.authorize(t(100), &req(c.to_bytes(), &code)).unwrap_err();
    assert!(matches!(e, CredError::Expired { .. }), "{e}");
}

#[test]
fn cached_decision_does_not_outlive_expiry() {
    let (i, mut v) = setup();
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(code.hash)])).unwrap();
    // Allowed at 99.5 s: cached, but only until the expiry at 100 s.
    v.authorize(t(99) + Duration::from_millis(500), &req(c.to_bytes(), &code)).unwrap();
    v.authorize(t(99) + Duration::from_millis(900), &req(c.to_bytes(), &code)).unwrap();
    assert_eq!(v.counters().cache_hits, 1);
    let e = v.authorize(t(100), &req(c.to_bytes(), &code)).unwrap_err();
    assert!(matches!(e, CredError::Expired { .. }), "{e}");
}

#[test]
fn wrong_issuer_is_refused() {
    let (_, mut v) = setup();
    let other = Issuer::from_secret(&[2; 32]).unwrap();
    let c = other.admin(user(), None).unwrap();
    let code = code();
    assert_eq!(v.authorize(t(0), &req(c.to_bytes(), &code)).unwrap_err(), CredError::WrongIssuer);
}

#[test]
fn malformed_and_oversize_credentials_are_refused() {
    let (_, mut v) = setup();
    let code = code();
    assert!(matches!(v.authorize(t(0), &req(b"not a biscuit", &code)).unwrap_err(), CredError::Malformed(_)));
    let big = vec![0u8; 5000];
    assert_eq!(v.authorize(t(0), &req(&big, &code)).unwrap_err(), CredError::TooLarge(5000));
}

#[test]
fn attenuation_cannot_widen() {
    let (i, mut v) = setup();
    let code = code();
    let granted = CodeInfo::inspect(b"\0asm\x01\0\0\0\0\x02\x01y").unwrap();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(granted.hash)])).unwrap();
    // A block claiming admin rights, another module, more interfaces and more memory.
    let wide = c
        .attenuate_datalog(&format!(
            "right(\"admin\"); grant_hash(\"{}\"); interface(\"net\"); limit(\"memory\", 1000000000);",
            code.hash.to_hex()
        ))
        .unwrap();
    assert_eq!(
        v.authorize(t(0), &req(wide.to_bytes(), &code)).unwrap_err(),
        CredError::NotGranted { module: code.hash }
    );
    let mut r = req(wide.to_bytes(), &granted);
    r.interfaces = InterfaceSet::of(&[Interface::Net]);
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::InterfaceNotGranted { right: Interface::Net, .. }));
    let mut r = req(wide.to_bytes(), &granted);
    r.limits.memory = Some(1_000_000_000);
    assert_eq!(
        v.authorize(t(0), &r).unwrap_err(),
        CredError::LimitExceeded { resource: "memory", requested: 1_000_000_000, allowed: 1 << 20 }
    );
    // Removing the authority's expiry by attenuation is impossible too.
    assert!(matches!(v.authorize(t(200), &req(wide.to_bytes(), &granted)).unwrap_err(), CredError::Expired { .. }));
}

#[test]
fn attenuation_narrows() {
    let (i, mut v) = setup();
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(code.hash)])).unwrap();
    let narrow = c
        .attenuate(&Attenuation {
            expires: Some(t(10)),
            max_memory: Some(65536),
            interfaces: Some(InterfaceSet::of(&[Interface::Log])),
            ..Default::default()
        })
        .unwrap();
    // Asking for the parent's memory fails the attenuated check; asking for less passes.
    let e = v.authorize(t(0), &req(narrow.to_bytes(), &code)).unwrap_err();
    assert!(matches!(e, CredError::CheckFailed { .. }), "{e}");
    let mut r = req(narrow.to_bytes(), &code);
    r.limits.memory = Some(65536);
    assert_eq!(v.authorize(t(0), &r).unwrap().limits.memory, 65536);
    // Time is not granted by the attenuated block.
    r.interfaces = InterfaceSet::of(&[Interface::Log, Interface::Time]);
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::CheckFailed { .. }));
    // The attenuation's earlier expiry applies.
    r.interfaces = InterfaceSet::of(&[Interface::Log]);
    assert!(matches!(v.authorize(t(10), &r).unwrap_err(), CredError::Expired { .. }));
    // An attenuation restricted to other hashes refuses this one.
    let other = c.attenuate(&Attenuation { hashes: Some(vec![ModuleHash([0; 32])]), ..Default::default() }).unwrap();
    assert!(matches!(v.authorize(t(0), &req(other.to_bytes(), &code)).unwrap_err(), CredError::CheckFailed { .. }));
}

#[test]
fn wrong_principal_is_refused() {
    let (i, mut v) = setup();
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Hash(code.hash)])).unwrap();
    let mut r = req(c.to_bytes(), &code);
    r.requester = Some(PrincipalId([3; 32]));
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::WrongPrincipal { .. }));
    r.requester = Some(user());
    assert!(v.authorize(t(0), &r).is_ok());
}

#[test]
fn signed_and_local_names() {
    let (i, mut v) = setup();
    let programmer = SigningKey::from_bytes(&[5; 32]);
    let signed = sign_module(EMPTY_WASM, &programmer, "IPv4", "version2").unwrap();
    let info = CodeInfo::inspect(&signed).unwrap();
    let c = i
        .issue(
            user(),
            &spec(vec![ModuleGrant::Signed { programmer: PrincipalId::of(&programmer), name: "IPv4".into() }]),
        )
        .unwrap();
    let g = v.authorize(t(0), &req(c.to_bytes(), &info)).unwrap();
    assert!(g.names.contains(&ModuleName::Signed {
        programmer: PrincipalId::of(&programmer),
        name: "IPv4".into(),
        version: "version2".into()
    }));
    // The same code signed by someone else is not granted.
    let forger = SigningKey::from_bytes(&[6; 32]);
    let forged = CodeInfo::inspect(&sign_module(EMPTY_WASM, &forger, "IPv4", "version2").unwrap()).unwrap();
    assert!(matches!(v.authorize(t(0), &req(c.to_bytes(), &forged)).unwrap_err(), CredError::NotGranted { .. }));

    // Local naming: the credential lets its holder install "counter" under its own key.
    let code = code();
    let c = i.issue(user(), &spec(vec![ModuleGrant::Local("counter".into())])).unwrap();
    let mut r = req(c.to_bytes(), &code);
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::NotGranted { .. }));
    r.local_name = Some("counter");
    let g = v.authorize(t(0), &r).unwrap();
    assert!(g.names.contains(&ModuleName::Local { loader: user(), name: "counter".into() }));
    r.local_name = Some("other");
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::NotGranted { .. }));
    r.local_name = Some("bad name");
    assert!(matches!(v.authorize(t(0), &r).unwrap_err(), CredError::InvalidLocalName(_)));
}

#[test]
fn fuzz_entry_point_accepts_real_tokens() {
    let c = anode_cred::fuzzing::issuer().admin(user(), None).unwrap();
    anode_cred::fuzzing::credential(c.to_bytes());
    anode_cred::fuzzing::credential(b"garbage");
    anode_cred::fuzzing::credential(EMPTY_WASM);
}

#[test]
fn denials_are_cached_for_the_ttl_and_counted() {
    let (_, mut v) = setup();
    let other = Issuer::from_secret(&[2; 32]).unwrap().admin(user(), None).unwrap();
    let code = code();
    for _ in 0..5 {
        assert_eq!(v.authorize(t(0), &req(other.to_bytes(), &code)).unwrap_err(), CredError::WrongIssuer);
    }
    assert_eq!(v.counters().denied.get("wrong_issuer"), Some(&5));
    assert_eq!(v.counters().cache_hits, 4);
    // After the TTL the credential is verified again.
    assert_eq!(v.authorize(t(2), &req(other.to_bytes(), &code)).unwrap_err(), CredError::WrongIssuer);
    assert_eq!(v.counters().cache_hits, 4);
}
