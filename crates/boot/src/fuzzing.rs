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

/// Seeds for `boot_recovery`: one message of each kind.
pub fn recovery_seeds() -> Vec<Vec<u8>> {
    use crate::recovery::{ErrorCode, Repr};
    vec![
        Repr::Fetch { id: 7, offset: 0, max: 1024, name: "b/config/node.toml" }.to_vec(),
        Repr::Fetch { id: 8, offset: 0, max: 512, name: "metadata/timestamp.json" }.to_vec(),
        Repr::Data { id: 7, offset: 0, total: 5, data: b"hello" }.to_vec(),
        Repr::Error { id: 9, code: ErrorCode::NotFound }.to_vec(),
    ]
}

/// Seeds for `boot_metadata`: a signed repository for node `b` (root,
/// timestamp, snapshot, targets and the config component, joined by
/// `\n%%\n`), a state file and a `boot.toml`.
pub fn metadata_seeds() -> Vec<Vec<u8>> {
    use crate::layer::ComponentName;
    use crate::sign::{self, RoleKeys, RootSpec, Targets};
    let id = |n: u8| anode_sec::Identity::from_seed(&[n; 32]);
    let (root_k, targets_k, snap_k, ts_k) = (id(1), id(2), id(3), id(4));
    let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000);
    let spec = RootSpec {
        version: 1,
        expires: later,
        root: RoleKeys::one(root_k.public()),
        targets: RoleKeys::one(targets_k.public()),
        snapshot: RoleKeys::one(snap_k.public()),
        timestamp: RoleKeys::one(ts_k.public()),
    };
    let config = b"address = \"10.0.0.2\"\n".to_vec();
    let mut t = Targets::new();
    let mut seeds = Vec::new();
    let made = (|| -> Option<Vec<u8>> {
        let root = sign::root(&spec, &[&root_k]).ok()?;
        t.add(&ComponentName::parse("b/config/node.toml").ok()?, &config).ok()?;
        let targets = t.sign(1, later, &[&targets_k]).ok()?;
        let snapshot = sign::snapshot(1, later, &targets, &[&snap_k]).ok()?;
        let timestamp = sign::timestamp(1, later, &snapshot, &[&ts_k]).ok()?;
        let mut v = Vec::new();
        for part in [&root, &timestamp, &snapshot, &targets, &config] {
            if !v.is_empty() {
                v.extend_from_slice(b"\n%%\n");
            }
            v.extend_from_slice(part);
        }
        Some(v)
    })();
    seeds.extend(made);
    seeds.push(crate::state::BootState { format: 1, root: 1, ..Default::default() }.to_bytes());
    seeds.push(b"node = \"b\"\npolicy = \"recover\"\nmirrors = [\"../repo\"]\n".to_vec());
    seeds.push(
        b"node = \"b\"\npolicy = \"degraded\"\nmirrors = []\npeers = [\"127.0.0.1:7000\"]\n\
          recovery_key = \"recovery.key\"\nrequest_timeout_ms = 300\n"
            .to_vec(),
    );
    seeds
}
