//! Session credentials: every refusal, attenuation, kinds, and the fuzz seeds.
//! `ANODE_BLESS=1` rewrites fuzz/seeds/session_credential.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anode_cred::*;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn user() -> PrincipalId {
    PrincipalId::of(&SigningKey::from_bytes(&[9; 32]))
}

fn other() -> PrincipalId {
    PrincipalId::of(&SigningKey::from_bytes(&[10; 32]))
}

const CEILINGS: SessionCeilings = SessionCeilings {
    max_vp_share_ppm: 300_000,
    max_total_share_ppm: 500_000,
    max_vps: 4,
    extra: true,
    max_heap_bytes: 64 << 20,
    max_tx_bytes_per_sec: 1_250_000,
    max_rx_bytes_per_sec: 2_500_000,
    max_pools: 8,
    max_queued_events: 1024,
};

fn spec() -> SessionSpec {
    SessionSpec { ceilings: CEILINGS, expires: Some(t(100)) }
}

fn setup() -> (Issuer, Verifier) {
    let i = Issuer::from_secret(&[1; 32]).unwrap();
    let v = Verifier::new(i.public_key(), VerifierConfig::default());
    (i, v)
}

/// 20 % on one VP with slack, 16 MiB of heap, 1 Mbit/s each way, one pool.
fn request() -> SessionRequest {
    SessionRequest {
        vp_share_ppm: 200_000,
        total_share_ppm: 200_000,
        vps: 1,
        extra: true,
        heap_bytes: 16 << 20,
        tx_bytes_per_sec: 125_000,
        rx_bytes_per_sec: 125_000,
        pools: 1,
        queued_events: 256,
    }
}

#[test]
fn issued_credential_grants_its_ceilings_until_expiry() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    for r in [SessionRequest::default(), request()] {
        let g = v.authorize_session(t(0), c.to_bytes(), user(), &r).unwrap();
        assert_eq!(g, SessionGrant { principal: user(), ceilings: CEILINGS, recheck_at: Some(t(100)) });
    }
    // Exactly at the ceilings is allowed.
    let full = SessionRequest {
        vp_share_ppm: 300_000,
        total_share_ppm: 500_000,
        vps: 4,
        extra: true,
        heap_bytes: 64 << 20,
        tx_bytes_per_sec: 1_250_000,
        rx_bytes_per_sec: 2_500_000,
        pools: 8,
        queued_events: 1024,
    };
    v.authorize_session(t(0), c.to_bytes(), user(), &full).unwrap();
    assert_eq!(v.counters().allowed, 3);
}

#[test]
fn expired_credential_is_refused() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    let e = v.authorize_session(t(100), c.to_bytes(), user(), &SessionRequest::default()).unwrap_err();
    assert!(matches!(e, CredError::Expired { .. }), "{e}");
    assert_eq!(v.counters().denied.get("expired"), Some(&1));
}

#[test]
fn cached_grant_does_not_outlive_expiry() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    let r = SessionRequest::default();
    v.authorize_session(t(99), c.to_bytes(), user(), &r).unwrap();
    assert!(matches!(v.authorize_session(t(100), c.to_bytes(), user(), &r), Err(CredError::Expired { .. })));
}

#[test]
fn forged_or_foreign_credentials_are_refused() {
    let (_, mut v) = setup();
    let r = SessionRequest::default();
    // Issued by another administrator.
    let foreign = Issuer::from_secret(&[2; 32]).unwrap().issue_session(user(), &spec()).unwrap();
    assert_eq!(v.authorize_session(t(0), foreign.to_bytes(), user(), &r).unwrap_err(), CredError::WrongIssuer);
    // Our own credential with its authority block altered: a signature no longer matches.
    let (i, _) = setup();
    let mut b = i.issue_session(user(), &spec()).unwrap().to_bytes().to_vec();
    let at = b.windows(3).position(|w| w == b"vps").unwrap();
    b[at] = b'x';
    let e = v.authorize_session(t(0), &b, user(), &r).unwrap_err();
    assert!(matches!(e, CredError::WrongIssuer | CredError::Malformed(_)), "{e}");
    assert_eq!(v.authorize_session(t(0), b"garbage", user(), &r).unwrap_err().label(), "malformed");
    assert_eq!(v.authorize_session(t(0), &[], user(), &r).unwrap_err(), CredError::NoCredential);
    assert_eq!(v.authorize_session(t(0), &[0; 5000], user(), &r).unwrap_err(), CredError::TooLarge(5000));
}

#[test]
fn credential_presented_by_another_principal_is_refused() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    assert_eq!(
        v.authorize_session(t(0), c.to_bytes(), other(), &SessionRequest::default()).unwrap_err(),
        CredError::WrongPrincipal { owner: user(), requester: other() }
    );
}

#[test]
fn request_above_the_administrators_ceiling_is_refused() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    let r = SessionRequest { total_share_ppm: 600_000, ..request() };
    assert_eq!(
        v.authorize_session(t(0), c.to_bytes(), user(), &r).unwrap_err(),
        CredError::LimitExceeded { resource: "total_share", requested: 600_000, allowed: 500_000 }
    );
    // No slack granted: a VP asking for it is refused.
    let c = i
        .issue_session(user(), &SessionSpec { ceilings: SessionCeilings { extra: false, ..CEILINGS }, expires: None })
        .unwrap();
    let g = v.authorize_session(t(0), c.to_bytes(), user(), &SessionRequest::default()).unwrap();
    assert_eq!(g.recheck_at, None);
    assert_eq!(
        v.authorize_session(t(0), c.to_bytes(), user(), &request()).unwrap_err(),
        CredError::LimitExceeded { resource: "extra", requested: 1, allowed: 0 }
    );
}

#[test]
fn unstated_ceilings_allow_nothing() {
    let (i, mut v) = setup();
    let b = biscuit_auth::Biscuit::builder()
        .code(format!(
            "kind(\"session\"); principal(\"{}\"); ceiling(\"vps\", 2); ceiling(\"vps\", 1);",
            user().to_hex()
        ))
        .unwrap();
    let c = i.issue_builder(b).unwrap();
    let g = v.authorize_session(t(0), c.to_bytes(), user(), &SessionRequest::default()).unwrap();
    assert_eq!(g.ceilings, SessionCeilings { max_vps: 1, ..SessionCeilings::NONE });
    let e = v.authorize_session(t(0), c.to_bytes(), user(), &SessionRequest { heap_bytes: 1, ..Default::default() });
    assert_eq!(e.unwrap_err(), CredError::LimitExceeded { resource: "heap", requested: 1, allowed: 0 });
}

#[test]
fn attenuation_facts_cannot_widen() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    // A block stating larger ceilings, another principal, and the session kind again.
    let wide = c
        .attenuate_datalog(&format!(
            "ceiling(\"vp_share\", 1000000); ceiling(\"total_share\", 1000000); principal(\"{}\"); kind(\"session\");",
            other().to_hex()
        ))
        .unwrap();
    let r = SessionRequest { vp_share_ppm: 900_000, total_share_ppm: 900_000, ..request() };
    assert_eq!(
        v.authorize_session(t(0), wide.to_bytes(), user(), &r).unwrap_err(),
        CredError::LimitExceeded { resource: "vp_share", requested: 900_000, allowed: 300_000 }
    );
    // The principal is still the authority's.
    assert_eq!(
        v.authorize_session(t(0), wide.to_bytes(), other(), &SessionRequest::default()).unwrap_err(),
        CredError::WrongPrincipal { owner: user(), requester: other() }
    );
    let g = v.authorize_session(t(0), wide.to_bytes(), user(), &request()).unwrap();
    assert_eq!(g.ceilings, CEILINGS);
    // Nor can a block lift the expiry.
    assert!(matches!(
        v.authorize_session(t(200), wide.to_bytes(), user(), &request()).unwrap_err(),
        CredError::Expired { .. }
    ));
}

#[test]
fn attenuation_checks_narrow_and_refuse_requests_above_them() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    let a = SessionAttenuation {
        expires: Some(t(50)),
        max_vp_share_ppm: Some(100_000),
        max_heap_bytes: Some(8 << 20),
        no_extra: true,
        ..Default::default()
    };
    let narrow = c.attenuate_session(&a).unwrap();
    let ok = SessionRequest {
        vp_share_ppm: 100_000,
        total_share_ppm: 100_000,
        extra: false,
        heap_bytes: 8 << 20,
        ..request()
    };
    let g = v.authorize_session(t(0), narrow.to_bytes(), user(), &ok).unwrap();
    assert_eq!(
        g.ceilings,
        SessionCeilings { max_vp_share_ppm: 100_000, extra: false, max_heap_bytes: 8 << 20, ..CEILINGS }
    );
    assert_eq!(g.recheck_at, Some(t(50)));
    for (r, resource, requested, allowed) in [
        (SessionRequest { vp_share_ppm: 100_001, ..ok }, "vp_share", 100_001, 100_000),
        (SessionRequest { heap_bytes: 16 << 20, ..ok }, "heap", 16 << 20, 8 << 20),
        (SessionRequest { extra: true, ..ok }, "extra", 1, 0),
    ] {
        assert_eq!(
            v.authorize_session(t(0), narrow.to_bytes(), user(), &r).unwrap_err(),
            CredError::LimitExceeded { resource, requested, allowed }
        );
    }
    assert!(matches!(
        v.authorize_session(t(50), narrow.to_bytes(), user(), &ok).unwrap_err(),
        CredError::Expired { .. }
    ));
}

#[test]
fn checks_of_other_forms_are_enforced_per_request() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    // Heap at most 1 MiB per VP: not a bound on one amount, so not in the ceilings.
    let narrow = c.attenuate_datalog("check if heap($h), vps($n), $h <= $n * 1048576;").unwrap();
    let r = SessionRequest { vps: 2, heap_bytes: 2 << 20, ..request() };
    let g = v.authorize_session(t(0), narrow.to_bytes(), user(), &r).unwrap();
    assert_eq!(g.ceilings, CEILINGS);
    let e = v.authorize_session(t(0), narrow.to_bytes(), user(), &SessionRequest { heap_bytes: 3 << 20, ..r });
    assert!(matches!(e.unwrap_err(), CredError::CheckFailed { .. }));
    // A check that makes itself vacuous with a fact of its own block still bounds the grant.
    let vacuous = c.attenuate_datalog("vp_share(0); check if vp_share($v), $v <= 1000;").unwrap();
    assert_eq!(
        v.authorize_session(t(0), vacuous.to_bytes(), user(), &request()).unwrap_err(),
        CredError::LimitExceeded { resource: "vp_share", requested: 200_000, allowed: 1000 }
    );
    // A holder's check may also name the requester.
    let mine = c.attenuate_datalog(&format!("check if requester(\"{}\");", other().to_hex())).unwrap();
    assert!(matches!(
        v.authorize_session(t(0), mine.to_bytes(), user(), &request()).unwrap_err(),
        CredError::CheckFailed { .. }
    ));
}

#[test]
fn module_and_session_credentials_are_not_interchangeable() {
    let (i, mut v) = setup();
    let r = SessionRequest::default();
    let code = CodeInfo::inspect(b"\0asm\x01\0\0\0").unwrap();
    let module = i
        .issue(
            user(),
            &GrantSpec {
                modules: vec![ModuleGrant::Hash(code.hash)],
                interfaces: InterfaceSet::EMPTY,
                limits: Limits { memory: 1 << 20, cpu: 1000, state: 0 },
                expires: None,
            },
        )
        .unwrap();
    let admin = i.admin(user(), None).unwrap();
    for m in [&module, &admin] {
        assert_eq!(
            v.authorize_session(t(0), m.to_bytes(), user(), &r).unwrap_err(),
            CredError::WrongKind { expected: "session", found: "module".into() }
        );
    }
    // A block claiming the session kind on a module credential gains nothing.
    let claimed = admin.attenuate_datalog("kind(\"session\"); ceiling(\"vps\", 9);").unwrap();
    assert_eq!(v.authorize_session(t(0), claimed.to_bytes(), user(), &r).unwrap_err().label(), "wrong_kind");
    // A monitoring credential (right("monitor")) is not a session credential either.
    let monitor = i
        .issue_builder(
            biscuit_auth::Biscuit::builder()
                .code(format!("principal(\"{}\"); right(\"monitor\"); right(\"admin\");", user().to_hex()))
                .unwrap(),
        )
        .unwrap();
    assert_eq!(
        v.authorize_session(t(0), monitor.to_bytes(), user(), &r).unwrap_err(),
        CredError::WrongKind { expected: "session", found: "monitor".into() }
    );
    // And the other way round: a session or monitoring credential loads no module.
    let session = i.issue_session(user(), &spec()).unwrap();
    fn load<'a>(c: &'a Credential, code: &'a CodeInfo) -> LoadRequest<'a> {
        LoadRequest {
            credential: Some(c.to_bytes()),
            requester: Some(user()),
            code,
            local_name: None,
            interfaces: InterfaceSet::EMPTY,
            limits: RequestedLimits::default(),
        }
    }
    assert_eq!(
        v.authorize(t(0), &load(&session, &code)).unwrap_err(),
        CredError::WrongKind { expected: "module", found: "session".into() }
    );
    assert_eq!(
        v.authorize(t(0), &load(&monitor, &code)).unwrap_err(),
        CredError::WrongKind { expected: "module", found: "monitor".into() }
    );
    v.authorize(t(0), &load(&module, &code)).unwrap();
    // A module credential issued before kinds existed (no kind fact) still loads.
    let legacy = i
        .issue_builder(
            biscuit_auth::Biscuit::builder()
                .code(format!("principal(\"{}\"); right(\"admin\");", user().to_hex()))
                .unwrap(),
        )
        .unwrap();
    v.authorize(t(0), &load(&legacy, &code)).unwrap();
}

#[test]
fn recognized_check_bounds() {
    let checks = |src: &str| biscuit_auth::builder::BlockBuilder::new().code(src).unwrap().checks;
    let b = |f: &str, max| Some(Bound { fact: f.into(), max });
    let c = checks(
        "check if vp_share($v), $v <= 5; check if heap($h), $h < 10; check if tx($x), 7 >= $x; \
         check all rx($x), $x <= 3; check if extra(false);\
         reject if vps($n), $n > 2; check if vps($n), $n <= 2 || $n == 9; check if pools($p), $p > 2; \
         check if pools($p), $p < -4;",
    );
    let got: Vec<Option<Bound>> = c.iter().map(check_bound).collect();
    assert_eq!(
        got,
        vec![b("vp_share", 5), b("heap", 9), b("tx", 7), b("rx", 3), b("extra", 0), None, None, None, b("pools", 0)]
    );
    assert_eq!(
        check_expiry(&checks("check if time($t), $t < 2027-01-15T08:00:00Z;")[0]),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
    );
}

#[test]
fn denials_are_cached_and_counted() {
    let (i, mut v) = setup();
    let c = i.issue_session(user(), &spec()).unwrap();
    for _ in 0..3 {
        let _ = v.authorize_session(t(0), c.to_bytes(), other(), &SessionRequest::default());
    }
    assert_eq!(v.counters().denied.get("wrong_principal"), Some(&3));
    assert_eq!(v.counters().cache_hits, 2);
}

// ---------------------------------------------------------------- fuzz seeds

fn seeds() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/session_credential")
}

fn seed_credentials() -> Vec<(&'static str, Vec<u8>)> {
    let i = fuzzing::issuer();
    let p = fuzzing::session_principal();
    let s = i.issue_session(p, &SessionSpec { ceilings: CEILINGS, expires: None }).unwrap();
    let narrow = s
        .attenuate_session(&SessionAttenuation { max_vp_share_ppm: Some(40_000), no_extra: true, ..Default::default() })
        .unwrap();
    let expiring = i.issue_session(p, &SessionSpec { ceilings: CEILINGS, expires: Some(t(0)) }).unwrap();
    let module = i.admin(p, None).unwrap();
    vec![
        ("session", s.to_bytes().to_vec()),
        ("attenuated", narrow.to_bytes().to_vec()),
        ("expired", expiring.to_bytes().to_vec()),
        ("module", module.to_bytes().to_vec()),
    ]
}

fn mutations(seed: &[u8], n: usize) -> Vec<Vec<u8>> {
    let mut out = vec![seed.to_vec()];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut m = seed.to_vec();
        if m.is_empty() {
            break;
        }
        let p = (x as usize) % m.len();
        match i % 3 {
            0 => m.truncate(p),
            1 => m[p] ^= (x >> 32) as u8 | 1,
            _ => m.insert(p, (x >> 40) as u8),
        }
        out.push(m);
    }
    out
}

#[test]
fn fuzz_seeds() {
    if std::env::var_os("ANODE_BLESS").is_some() {
        std::fs::create_dir_all(seeds()).unwrap();
        for (name, b) in seed_credentials() {
            std::fs::write(seeds().join(name), b).unwrap();
        }
    }
    let mut n = 0;
    for e in std::fs::read_dir(seeds()).unwrap() {
        let b = std::fs::read(e.unwrap().path()).unwrap();
        for m in mutations(&b, 60) {
            fuzzing::session_credential(&m);
            n += 1;
        }
    }
    assert!(n >= 4 * 61, "seeds missing: {n} inputs (run with ANODE_BLESS=1)");
    // The valid seed is granted (expiry is after the fuzz target's `now`).
    let (_, s) = &seed_credentials()[0];
    let mut v = Verifier::new(fuzzing::issuer().public_key(), VerifierConfig::default());
    v.authorize_session(t(0), s, fuzzing::session_principal(), &SessionRequest::default()).unwrap();
}
