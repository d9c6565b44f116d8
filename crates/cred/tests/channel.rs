//! Channel grants end to end: issued, decided, refused when malformed,
//! not widened by attenuation; and the `channel_grant` fuzz seeds.
#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anode_cred::*;

const EMPTY_WASM: &[u8] = b"\0asm\x01\0\0\0";

fn t() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn user() -> PrincipalId {
    PrincipalId([9; 32])
}

fn setup() -> (Issuer, Verifier, CodeInfo, GrantSpec) {
    let i = Issuer::from_secret(&[1; 32]).unwrap();
    let v = Verifier::new(i.public_key(), VerifierConfig::default());
    let code = CodeInfo::inspect(EMPTY_WASM).unwrap();
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(code.hash)],
        interfaces: InterfaceSet::of(&[Interface::Net]),
        limits: Limits { memory: 1 << 20, cpu: 100_000, state: 4096 },
        expires: None,
    };
    (i, v, code, spec)
}

fn decide(v: &mut Verifier, cred: &[u8], code: &CodeInfo) -> Result<Grant, CredError> {
    v.authorize(
        t(),
        &LoadRequest {
            credential: Some(cred),
            requester: None,
            code,
            local_name: None,
            interfaces: InterfaceSet::of(&[Interface::Net]),
            limits: RequestedLimits::default(),
        },
    )
}

#[test]
fn issued_grants_are_decided_and_bound_the_filters() {
    let (i, mut v, code, spec) = setup();
    let g = ChannelGrant::parse("5000-5010", "10.0.1.0/24").unwrap();
    let c = i.issue_channels(user(), &spec, &[g]).unwrap();
    let grant = decide(&mut v, c.to_bytes(), &code).unwrap();
    assert_eq!(grant.channels, ChannelAuthority::Granted(vec![g]));
    assert!(grant.channels.allows(5005, Some((Ipv4Addr::new(10, 0, 1, 0), 24))));
    assert!(!grant.channels.allows(5005, None));
    // Without channel facts: what was granted before (documented gap).
    let plain = i.issue(user(), &spec).unwrap();
    assert_eq!(decide(&mut v, plain.to_bytes(), &code).unwrap().channels, ChannelAuthority::Unrestricted);
    // Admin: everything.
    let admin = i.admin(user(), None).unwrap();
    assert_eq!(decide(&mut v, admin.to_bytes(), &code).unwrap().channels, ChannelAuthority::Unrestricted);
}

#[test]
fn a_malformed_channel_fact_refuses_the_load() {
    let (i, mut v, code, spec) = setup();
    // A grant that does not parse (ports backwards), issued as a fact.
    let good = ChannelGrant::parse("1", "*").unwrap();
    let c = i.issue_channels(user(), &spec, &[good]).unwrap();
    assert!(decide(&mut v, c.to_bytes(), &code).is_ok());
    let bad = ChannelGrant { port_lo: 9, port_hi: 1, source: None };
    let c = i.issue_channels(user(), &spec, &[bad]).unwrap();
    let e = decide(&mut v, c.to_bytes(), &code).unwrap_err();
    assert!(matches!(e, CredError::ChannelGrant(ChannelGrantError::Ports(_))), "{e:?}");
    assert_eq!(e.label(), "channel_grant");
}

#[test]
fn attenuation_cannot_add_a_channel_grant() {
    let (i, mut v, code, spec) = setup();
    let g = ChannelGrant::parse("5000", "10.0.1.0/24").unwrap();
    let c = i.issue_channels(user(), &spec, &[g]).unwrap();
    let wider = c.attenuate_datalog("channel(\"0-65535\", \"*\");").unwrap();
    let grant = decide(&mut v, wider.to_bytes(), &code).unwrap();
    assert_eq!(grant.channels, ChannelAuthority::Granted(vec![g]));
}

#[test]
fn channel_grant_fuzz_seeds() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/channel_grant");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        fuzzing::channel_grant(&data);
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let text = String::from_utf8_lossy(&data).into_owned();
        let (ports, source) = text.split_once('\n').unwrap();
        let ok = ChannelGrant::parse(ports, source).is_ok();
        assert_eq!(ok, !(name.starts_with("bad_") || name == "host_bits"), "seed {name}");
        for k in 0..data.len() {
            fuzzing::channel_grant(&data[..k]);
        }
        n += 1;
    }
    assert!(n >= 4);
}
