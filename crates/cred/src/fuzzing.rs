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
