//! Monitoring credentials: issue, narrow, and the hostile cases (expired,
//! forged, widened).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use anode_cred::{Credential, Issuer};
use anode_monitor::apps::abi::Field;
use anode_monitor::policy::{self, Clause, ExportRights, Narrowing, PAYLOAD_ALL, PolicyError, PolicyVerifier, Prefix};
use common::*;

fn verifier() -> PolicyVerifier {
    PolicyVerifier::new(issuer().public_key())
}

fn parse(bytes: &[u8]) -> Credential {
    Credential::parse(bytes, &issuer().public_key()).unwrap()
}

#[test]
fn issued_policy_is_what_the_authority_block_says() {
    let mut s = spec(&[Field::Ts, Field::Src, Field::Dport], 64, records());
    s.filter = vec![Clause::Proto(vec![6]), Clause::Net(vec![Prefix::parse("10.0.0.0/8").unwrap()])];
    s.anonymize = vec![Prefix::parse("10.1.0.0/16").unwrap()];
    let p = verifier().authorize(now(), &cred(&s)).unwrap();
    assert_eq!(p.principal, user());
    assert!(p.reads(Field::Src) && p.reads(Field::Dport) && !p.reads(Field::TcpSeq));
    assert_eq!(p.payload, 64);
    assert_eq!(p.filter.clauses.len(), 2);
    assert_eq!(p.anonymize, vec![Prefix::parse("10.1.0.0/16").unwrap()]);
    assert_eq!(p.export, records());
    assert_eq!(p.limits.budget, 200_000);
}

#[test]
fn narrowing_narrows_every_dimension() {
    let base = parse(&full_cred());
    let n = Narrowing {
        filter: vec![Clause::Port(vec![80])],
        read: Some(vec![Field::Ts, Field::Dport, Field::TcpSeq]),
        payload: Some(16),
        anonymize: vec![Prefix::ALL_V4],
        budget: Some(1000),
        export: Some(ExportRights { records: true, packets: false }),
        expires: Some(now() + Duration::from_secs(60)),
        ..Narrowing::default()
    };
    let c = policy::attenuate(&base, &n).unwrap();
    let p = verifier().authorize(now(), c.to_bytes()).unwrap();
    assert_eq!(p.fields, Field::Ts.bit() | Field::Dport.bit() | Field::TcpSeq.bit());
    assert_eq!(p.payload, 16);
    assert_eq!(p.limits.budget, 1000);
    assert_eq!(p.export, ExportRights { records: true, packets: false });
    assert_eq!(p.filter.clauses, vec![Clause::Port(vec![80])]);
    assert_eq!(p.anonymize, vec![Prefix::ALL_V4]);
    // A second narrowing intersects with the first.
    let c2 = policy::attenuate(&c, &Narrowing { read: Some(vec![Field::Dport, Field::Src]), ..Narrowing::default() })
        .unwrap();
    assert_eq!(verifier().authorize(now(), c2.to_bytes()).unwrap().fields, Field::Dport.bit());
    // Expired after its own expiry.
    let later = now() + Duration::from_secs(120);
    assert!(matches!(verifier().authorize(later, c.to_bytes()), Err(PolicyError::Expired(_))));
}

#[test]
fn widening_by_appended_facts_gains_nothing() {
    let narrow = cred(&spec(&[Field::Ts], 0, ExportRights::default()));
    let c = parse(&narrow)
        .attenuate_datalog(
            "right(\"admin\"); read(\"ip.src\"); read(\"tcp.seq\"); payload_all(true); payload(1000);
             export(\"records\"); export(\"packets\"); limit(\"budget\", 99999999);
             narrow_payload(5000); narrow_limit(\"budget\", 99999999); narrow_read({\"ip.src\", \"ts\"});",
        )
        .unwrap();
    let p = verifier().authorize(now(), c.to_bytes()).unwrap();
    assert!(!p.admin);
    assert_eq!(p.fields, Field::Ts.bit());
    assert_eq!(p.payload, 0);
    assert_eq!(p.export, ExportRights::default());
    assert_eq!(p.limits.budget, 200_000);
}

#[test]
fn expired_forged_and_foreign_credentials_are_refused() {
    let mut s = spec(&[Field::Ts], 0, records());
    s.expires = Some(now() - Duration::from_secs(1));
    assert!(matches!(verifier().authorize(now(), &cred(&s)), Err(PolicyError::Expired(_))));

    // Signed by another administrator.
    let other = Issuer::from_secret(&[2; 32]).unwrap();
    let forged = policy::issue(&other, user(), &spec(&all_fields(), PAYLOAD_ALL, everything())).unwrap();
    assert_eq!(verifier().authorize(now(), forged.to_bytes()).unwrap_err().label(), "wrong_issuer");

    // Bytes flipped inside the signature or the facts.
    let good = full_cred();
    for i in [good.len() / 2, good.len() - 5] {
        let mut b = good.clone();
        b[i] ^= 0x40;
        assert!(verifier().authorize(now(), &b).is_err(), "flip at {i}");
    }
    assert!(verifier().authorize(now(), b"not a token").is_err());
    assert_eq!(verifier().authorize(now(), &vec![0u8; 5000]).unwrap_err().label(), "too_large");

    // A switchlet credential is no monitoring credential.
    let switchlet = issuer()
        .issue(
            user(),
            &anode_cred::GrantSpec {
                modules: vec![],
                interfaces: anode_cred::InterfaceSet::EMPTY,
                limits: anode_cred::Limits { memory: 1, cpu: 1, state: 1 },
                expires: None,
            },
        )
        .unwrap();
    assert_eq!(verifier().authorize(now(), switchlet.to_bytes()), Err(PolicyError::NotMonitoring));
    // Nor is an administrative switchlet credential (right("admin") without
    // right("monitor")): it used to pass as an administrative monitoring one.
    let admin_switchlet = issuer().admin(user(), None).unwrap();
    assert_eq!(verifier().authorize(now(), admin_switchlet.to_bytes()), Err(PolicyError::NotMonitoring));
}

#[test]
fn malformed_policy_facts_are_refused() {
    let root = issuer();
    for code in [
        "principal(\"00\"); right(\"monitor\");",
        "principal(\"\"); principal(\"11\"); right(\"monitor\");",
        "right(\"monitor\"); read(\"ip.nosuchfield\");",
        "right(\"monitor\"); filter_net(\"10.0.0.0/33\");",
        "right(\"monitor\"); filter_port(70000);",
        "right(\"monitor\"); limit(\"cpu\", 5);",
    ] {
        let code = if code.contains("principal") {
            code.to_string()
        } else {
            format!("principal(\"{}\"); {code}", user().to_hex())
        };
        let b = biscuit_auth::Biscuit::builder().code(&code).unwrap();
        let c = root.issue_builder(b).unwrap();
        assert!(verifier().authorize(now(), c.to_bytes()).is_err(), "{code}");
    }
}
