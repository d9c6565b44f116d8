//! Entry points for the fuzz targets (also run over the seeds as tests).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::credential::{Issuer, LoadRequest, RequestedLimits, Verifier, VerifierConfig};
use crate::interface::InterfaceSet;
use crate::naming::{CodeInfo, ModuleHash};

/// The fixed administrator key the fuzz target verifies against.
pub fn issuer() -> &'static Issuer {
    static I: OnceLock<Issuer> = OnceLock::new();
    I.get_or_init(|| match Issuer::from_secret(&[42; 32]) {
        Ok(i) => i,
        Err(e) => panic!("fixed fuzz key: {e}"),
    })
}

/// Bytes as a credential presented for a load request, and as a module
/// binary inspected for a signature section. Must never panic; a decision
/// must be the same when repeated (from the decision cache).
pub fn credential(data: &[u8]) {
    let _ = CodeInfo::inspect(data);
    let code = CodeInfo { hash: ModuleHash::of(b"fuzz"), signed: None };
    let mut v = Verifier::new(issuer().public_key(), VerifierConfig::default());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let req = LoadRequest {
        credential: Some(data),
        requester: None,
        code: &code,
        local_name: Some("fuzz"),
        interfaces: InterfaceSet::ALL,
        limits: RequestedLimits::default(),
    };
    let a = v.authorize(now, &req);
    let b = v.authorize(now, &req);
    assert_eq!(a, b, "a repeated decision differs");
}

/// The principal the `session_credential` target presents credentials as.
pub fn session_principal() -> crate::naming::PrincipalId {
    crate::naming::PrincipalId([7; 32])
}

/// Bytes as a session credential presented by [`session_principal`] to open
/// a session and to reserve 5 % of one VP with 1 MiB of heap. Must never
/// panic; a decision must be the same when repeated (from the decision
/// cache); a grant's ceilings must cover what it allowed.
pub fn session_credential(data: &[u8]) {
    use crate::session::SessionRequest;
    let mut v = Verifier::new(issuer().public_key(), VerifierConfig::default());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let open = SessionRequest::default();
    let reserve = SessionRequest { vp_share_ppm: 50_000, total_share_ppm: 50_000, vps: 1, heap_bytes: 1 << 20, ..open };
    for req in [open, reserve] {
        let a = v.authorize_session(now, data, session_principal(), &req);
        let b = v.authorize_session(now, data, session_principal(), &req);
        assert_eq!(a, b, "a repeated decision differs");
        if let Ok(g) = a {
            assert_eq!(g.principal, session_principal());
            for name in crate::session::AMOUNTS {
                assert!(req.get(name) <= g.ceilings.get(name), "{name} allowed above the grant's ceiling");
            }
        }
    }
}

/// Text as a `channel` fact's two strings, split at the first newline: a
/// typed refusal, or a grant whose strings parse back to it and that
/// covers the filters it was written to cover.
pub fn channel_grant(data: &[u8]) {
    use crate::channel::ChannelGrant;
    let text = String::from_utf8_lossy(data);
    let (ports, source) = text.split_once('\n').unwrap_or((&text, "*"));
    let Ok(g) = ChannelGrant::parse(ports, source) else { return };
    let (p, s) = g.to_strings();
    assert_eq!(ChannelGrant::parse(&p, &s), Ok(g), "a channel grant does not round-trip");
    assert!(g.covers(g.port_lo, g.source) && g.covers(g.port_hi, g.source), "a grant does not cover itself");
    assert_eq!(g.covers(g.port_lo, None), g.source.is_none(), "a source grant covers any source");
}
