//! Entry points for the cargo-fuzz targets under `fuzz/` (and their seed
//! replay tests): every parser of the boot chain fed arbitrary bytes.

use crate::verify::{Limits, MetadataInput, verify_metadata};
use std::time::{Duration, SystemTime};

/// Bytes as a recovery message: parse, re-emit (must round-trip), serve,
/// and feed to a fetch waiting for a reply. Must never panic.
pub fn recovery_message(data: &[u8]) {
    if let Ok(r) = crate::recovery::parse(data) {
        assert_eq!(r.to_vec(), data, "a parsed recovery message re-emits to the same bytes");
    }
    let file = b"hello".to_vec();
    let _ = crate::recovery::serve(data, |_| crate::recovery::Lookup::Found(&file));
    let limits = crate::recovery::FetchLimits::default();
    if let Ok(mut f) =
        crate::recovery::Fetch::new("b/config/node.toml", crate::recovery::Bound::Exact(5), 2, limits, 7, 0)
    {
        let _ = f.poll(0);
        let _ = f.handle(0, data, 1);
        let _ = f.poll(10_000);
    }
}

/// Bytes split into metadata files at `\n%%\n` (root, timestamp, snapshot,
/// targets): verified, then as a boot state and a `boot.toml`. Must never
/// panic.
pub fn metadata(data: &[u8]) {
    let parts: Vec<&[u8]> = split(data);
    let get = |i: usize| parts.get(i).copied().unwrap_or(&[]);
    let input = MetadataInput { root: get(0), root_updates: &[], timestamp: get(1), snapshot: get(2), targets: get(3) };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    if let Ok(t) = verify_metadata(&input, None, "b", now, &Limits::default()) {
        for e in t.components() {
            let _ = t.check(&e.name, get(4));
        }
    }
    let _ = crate::state::BootState::parse(data);
    if let Ok(s) = core::str::from_utf8(data) {
        let _ = crate::fsio::BootConfig::from_toml(s);
        let _ = crate::layer::ComponentName::parse(s);
    }
}

fn split(data: &[u8]) -> Vec<&[u8]> {
    let sep = b"\n%%\n";
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(sep.len()).position(|w| w == sep) {
        out.push(&rest[..i]);
        rest = &rest[i + sep.len()..];
    }
    out.push(rest);
    out
}
