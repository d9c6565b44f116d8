//! Verification of the signed metadata (TUF roles) and of each component
//! against it. Sans-I/O: bytes and the time in, a verdict out.
//!
//! The metadata follows The Update Framework (TUF 1.0, the `Pouf1` JSON
//! format of the `tuf` crate): *root* lists the keys and thresholds of every
//! role and is the trust anchor; *targets* lists each component's length and
//! SHA-256 under its name `<node>/<layer>/<file>`; *snapshot* pins the
//! version, length and hash of targets; *timestamp* pins those of snapshot
//! and expires soonest. The `tuf` crate's [`Database`] checks signatures,
//! thresholds, role types, the version chain and expiry of timestamp and
//! targets at the time we pass in; this module adds what its `Database`
//! leaves to its (async, networked) client and what a node needs:
//!
//! - size bounds on every role before parsing (endless data);
//! - length and SHA-256 of snapshot against timestamp and of targets against
//!   snapshot (TUF §5.3.1, §5.4.1: mix-and-match);
//! - root and snapshot expiry (§5.1.8, §5.3.4: indefinite freeze);
//! - rollback against the node's own [`BootState`] across boots (§5.2.2,
//!   §5.3.3), including the snapshot version named by timestamp (§5.2.2.2);
//! - a rotation of the timestamp or snapshot keys resets the versions
//!   recorded under the old keys (§5.3.11: recovery from fast-forward);
//! - the latest known time: a clock set back does not revive expired
//!   metadata;
//! - each component checked by length first, then SHA-256; bytes that match
//!   another node's or layer's target are named (wrong software
//!   installation); a component the metadata does not list is refused
//!   (arbitrary installation, extraneous dependencies).
//!
//! Nothing here changes any state until everything verified: the caller gets
//! a [`Trusted`] holding the new [`BootState`], and persists it only after
//! the chain it vouches for was built (check first, commit second).

use crate::layer::{ComponentName, Layer, NameError, short};
use crate::state::{BootState, FORMAT};
use chrono::{DateTime, Utc};
use core::fmt;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;
use tuf::crypto::HashAlgorithm;
use tuf::database::Database;
use tuf::metadata::{
    Metadata, MetadataDescription, MetadataPath, RawSignedMetadata, RootMetadata, SnapshotMetadata, TargetsMetadata,
    TimestampMetadata,
};
use tuf::pouf::Pouf1;

/// Custom target field marking a secret (the node's key file): verified like
/// any component, never served by a repository nor fetched from one.
pub const SECRET_FIELD: &str = "anode_secret";

/// A TUF role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The root of trust: keys and thresholds.
    Root,
    /// Freshness: the current snapshot.
    Timestamp,
    /// Consistency: the current targets.
    Snapshot,
    /// The components.
    Targets,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Root => "root",
            Role::Timestamp => "timestamp",
            Role::Snapshot => "snapshot",
            Role::Targets => "targets",
        })
    }
}

/// Size bounds (TUF: "an upper bound on the number of bytes" for metadata
/// whose length is not known in advance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest root metadata file.
    pub root: usize,
    /// Largest timestamp metadata file.
    pub timestamp: usize,
    /// Largest snapshot metadata file.
    pub snapshot: usize,
    /// Largest targets metadata file.
    pub targets: usize,
    /// Largest component (the binary is the big one).
    pub component: u64,
    /// Most root rotations applied in one boot.
    pub root_updates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            root: 64 << 10,
            timestamp: 16 << 10,
            snapshot: 256 << 10,
            targets: 4 << 20,
            component: 512 << 20,
            root_updates: 32,
        }
    }
}

impl Limits {
    /// The bound for a role.
    pub fn of(&self, role: Role) -> usize {
        match role {
            Role::Root => self.root,
            Role::Timestamp => self.timestamp,
            Role::Snapshot => self.snapshot,
            Role::Targets => self.targets,
        }
    }
}

/// Why the metadata was refused. Nothing was trusted or recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A metadata file is larger than its bound (endless data).
    #[error("{role} metadata of {len} bytes exceeds the {max}-byte bound")]
    TooLarge {
        /// The role.
        role: Role,
        /// Its size.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A metadata file does not parse, or is not of its role.
    #[error("{role} metadata is malformed: {reason}")]
    Malformed {
        /// The role.
        role: Role,
        /// Why.
        reason: String,
    },
    /// Fewer valid signatures than the role's threshold (a compromised key
    /// below the threshold, or no valid key at all).
    #[error("{role} metadata has {valid} valid signature(s), its threshold is {threshold}")]
    BelowThreshold {
        /// The role.
        role: Role,
        /// Valid signatures from the role's keys.
        valid: u32,
        /// Required.
        threshold: u32,
    },
    /// The metadata expired at the (latest known) time (indefinite freeze).
    #[error("{role} metadata expired at {expires} (now {now})")]
    Expired {
        /// The role.
        role: Role,
        /// Its expiry (RFC 3339).
        expires: String,
        /// The time used (RFC 3339).
        now: String,
    },
    /// A version older than one already trusted (rollback).
    #[error("{role} metadata version {new} is older than the trusted version {trusted} (rollback)")]
    Rollback {
        /// The role.
        role: Role,
        /// Trusted version.
        trusted: u32,
        /// Offered version.
        new: u32,
    },
    /// A version other than the one its parent role names (mix-and-match,
    /// fast-forward).
    #[error("{role} metadata version {found} is not the version {expected} its parent names")]
    VersionMismatch {
        /// The role.
        role: Role,
        /// Named by the parent.
        expected: u32,
        /// Offered.
        found: u32,
    },
    /// Length or SHA-256 other than what the parent role names (mix-and-match).
    #[error("{role} metadata does not match the length and SHA-256 its parent names")]
    HashMismatch {
        /// The role.
        role: Role,
    },
    /// The parent role does not give the length and SHA-256 of the role.
    #[error("{role} metadata is not pinned by length and SHA-256 in its parent")]
    Unpinned {
        /// The role.
        role: Role,
    },
    /// More root rotations than [`Limits::root_updates`].
    #[error("more than {0} root rotations")]
    TooManyRootUpdates(usize),
    /// A target name that is not `<node>/<layer>/<file>`.
    #[error("targets metadata: {0}")]
    BadTargetName(#[from] NameError),
    /// A target without a SHA-256 hash, or longer than the component bound.
    #[error("target {0} has no SHA-256 hash or exceeds the component bound")]
    BadTarget(String),
    /// The metadata lists no component of this node.
    #[error("the targets metadata lists no component of node {0:?}")]
    NoTargetsForNode(String),
    /// Any other refusal by the TUF verifier.
    #[error("{role} metadata refused: {reason}")]
    Other {
        /// The role.
        role: Role,
        /// The verifier's words.
        reason: String,
    },
}

fn tuf_err(role: Role, e: tuf::Error) -> MetadataError {
    use tuf::Error as E;
    match e {
        E::MetadataMissingSignatures { number_of_valid_signatures, threshold, .. } => {
            MetadataError::BelowThreshold { role, valid: number_of_valid_signatures, threshold }
        }
        E::BadSignature(_) => MetadataError::BelowThreshold { role, valid: 0, threshold: 1 },
        E::ExpiredMetadata { expiration, now, .. } => {
            MetadataError::Expired { role, expires: expiration.to_rfc3339(), now: now.to_rfc3339() }
        }
        E::AttemptedMetadataRollBack { trusted_version, new_version, .. } => {
            MetadataError::Rollback { role, trusted: trusted_version, new: new_version }
        }
        E::WrongMetadataVersion { expected_version, new_version, .. } => {
            MetadataError::VersionMismatch { role, expected: expected_version, found: new_version }
        }
        E::Encoding(s) => MetadataError::Malformed { role, reason: short(&s) },
        E::Json(j) => MetadataError::Malformed { role, reason: short(&j.to_string()) },
        other => MetadataError::Other { role, reason: short(&other.to_string()) },
    }
}

/// The metadata bytes the caller read.
#[derive(Debug, Clone, Copy)]
pub struct MetadataInput<'a> {
    /// The trusted root (the anchor installed on the node).
    pub root: &'a [u8],
    /// Newer roots `N+1.root.json`, `N+2.root.json`, … in order.
    pub root_updates: &'a [Vec<u8>],
    /// `timestamp.json`.
    pub timestamp: &'a [u8],
    /// `snapshot.json`.
    pub snapshot: &'a [u8],
    /// `targets.json`.
    pub targets: &'a [u8],
}

/// What the metadata says one component must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Its name.
    pub name: ComponentName,
    /// Its exact length.
    pub length: u64,
    /// Its SHA-256.
    pub sha256: [u8; 32],
    /// A secret (never fetched from or served by a repository).
    pub secret: bool,
}

/// Versions and expiry of the trusted metadata, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleInfo {
    /// The role.
    pub role: Role,
    /// Its version.
    pub version: u32,
    /// Its expiry (RFC 3339).
    pub expires: String,
}

/// Something worth a log line that is not a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// The clock is behind the latest known time; the latter was used.
    ClockBehind {
        /// The clock (Unix seconds).
        clock: i64,
        /// The latest known time used instead.
        latest_known: i64,
    },
    /// The timestamp or snapshot keys were rotated: versions recorded under
    /// the old keys were forgotten (recovery from a fast-forward attack).
    KeysRotated {
        /// Which role.
        role: Role,
    },
    /// The root was rotated to a new version.
    RootRotated {
        /// The new version.
        version: u32,
    },
}

/// Metadata that verified: what each of this node's components must be.
#[derive(Debug, Clone)]
pub struct Trusted {
    node: String,
    expected: BTreeMap<ComponentName, Expected>,
    by_hash: HashMap<[u8; 32], String>,
    state: BootState,
    roles: Vec<RoleInfo>,
    notices: Vec<Notice>,
}

/// Why a component was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComponentError {
    /// The metadata does not list it (arbitrary installation, extraneous dependency).
    #[error("{0} is not in the signed targets metadata")]
    NotInMetadata(String),
    /// It could not be read (missing, unreadable); the text says why.
    #[error("{name} could not be read: {reason}")]
    Unreadable {
        /// The component.
        name: String,
        /// Why.
        reason: String,
    },
    /// Its length differs from the metadata's (a longer file is not read past the length + 1).
    #[error("{name}: {found} bytes, the metadata says {expected}")]
    Length {
        /// The component.
        name: String,
        /// Signed length.
        expected: u64,
        /// Found (at least).
        found: u64,
    },
    /// Its SHA-256 differs from the metadata's (tampered or corrupted).
    #[error("{name}: SHA-256 {found} does not match the signed {expected}")]
    Hash {
        /// The component.
        name: String,
        /// Signed digest (hex).
        expected: String,
        /// Found digest (hex).
        found: String,
    },
    /// The bytes are a valid component, but of another node or layer (wrong software installation).
    #[error("{name}: these bytes are the signed component {other}, not this one (wrong installation)")]
    WrongComponent {
        /// The component.
        name: String,
        /// The target the bytes match.
        other: String,
    },
}

fn hex(b: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// Lower-case hex of a SHA-256.
pub fn sha256_hex(b: &[u8; 32]) -> String {
    hex(b)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

fn check_pinned<M: Metadata>(role: Role, bytes: &[u8], d: &MetadataDescription<M>) -> Result<(), MetadataError> {
    let (Some(len), Some(h)) = (d.length(), d.hashes().get(&HashAlgorithm::Sha256)) else {
        return Err(MetadataError::Unpinned { role });
    };
    if len != bytes.len() || h.value() != sha256(bytes) {
        return Err(MetadataError::HashMismatch { role });
    }
    Ok(())
}

fn keys_digest<'a>(ids: impl Iterator<Item = &'a tuf::crypto::KeyId>) -> String {
    let mut v: Vec<String> = ids.map(|k| k.to_string()).collect();
    v.sort();
    hex(&sha256(v.join(",").as_bytes()))
}

fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn bound(role: Role, bytes: &[u8], limits: &Limits) -> Result<(), MetadataError> {
    let max = limits.of(role);
    if bytes.len() > max { Err(MetadataError::TooLarge { role, len: bytes.len(), max }) } else { Ok(()) }
}

/// Verifies the metadata for `node` at time `now`, against the node's
/// previous state (`None` on a first boot: trust on first use of the root
/// anchor, as a TUF client shipped with its root).
///
/// # Errors
/// A [`MetadataError`] naming the role and the rule broken.
///
/// # DoS
/// Every input is bounded by `limits` before it is parsed; signature checks
/// are bounded by the number of keys in the (trusted) root.
pub fn verify_metadata(
    input: &MetadataInput<'_>,
    prior: Option<&BootState>,
    node: &str,
    now: SystemTime,
    limits: &Limits,
) -> Result<Trusted, MetadataError> {
    bound(Role::Root, input.root, limits)?;
    bound(Role::Timestamp, input.timestamp, limits)?;
    bound(Role::Snapshot, input.snapshot, limits)?;
    bound(Role::Targets, input.targets, limits)?;
    if input.root_updates.len() > limits.root_updates {
        return Err(MetadataError::TooManyRootUpdates(limits.root_updates));
    }
    let mut notices = Vec::new();
    let prior = prior.cloned().unwrap_or_default();
    let clock: DateTime<Utc> = DateTime::from(now);
    let start = match DateTime::from_timestamp(prior.latest_known_time, 0) {
        Some(t) if t > clock => {
            notices.push(Notice::ClockBehind { clock: clock.timestamp(), latest_known: t.timestamp() });
            t
        }
        _ => clock,
    };

    // Root: the anchor, then rotations in order (each signed by a threshold
    // of the old and of the new root keys; the tuf crate checks both).
    let raw = RawSignedMetadata::<Pouf1, RootMetadata>::new(input.root.to_vec());
    let mut db = Database::<Pouf1>::from_trusted_root(&raw).map_err(|e| tuf_err(Role::Root, e))?;
    for u in input.root_updates {
        bound(Role::Root, u, limits)?;
        db.update_root(&RawSignedMetadata::new(u.clone())).map_err(|e| tuf_err(Role::Root, e))?;
        notices.push(Notice::RootRotated { version: db.trusted_root().version() });
    }
    let root = db.trusted_root();
    if *root.expires() <= start {
        return Err(MetadataError::Expired {
            role: Role::Root,
            expires: rfc3339(root.expires()),
            now: rfc3339(&start),
        });
    }
    if root.version() < prior.root {
        return Err(MetadataError::Rollback { role: Role::Root, trusted: prior.root, new: root.version() });
    }
    let ts_keys = keys_digest(root.timestamp().key_ids().iter());
    let snap_keys = keys_digest(root.snapshot().key_ids().iter());
    let mut floor = prior.clone();
    if !prior.timestamp_keys.is_empty() && prior.timestamp_keys != ts_keys {
        notices.push(Notice::KeysRotated { role: Role::Timestamp });
        floor.timestamp = 0;
        floor.snapshot = 0;
        floor.targets = 0;
    }
    if !prior.snapshot_keys.is_empty() && prior.snapshot_keys != snap_keys {
        notices.push(Notice::KeysRotated { role: Role::Snapshot });
        floor.snapshot = 0;
        floor.targets = 0;
    }
    let root_info = RoleInfo { role: Role::Root, version: root.version(), expires: rfc3339(root.expires()) };

    // Timestamp.
    let raw = RawSignedMetadata::<Pouf1, TimestampMetadata>::new(input.timestamp.to_vec());
    db.update_timestamp(&start, &raw).map_err(|e| tuf_err(Role::Timestamp, e))?;
    let Some(ts) = db.trusted_timestamp() else {
        return Err(MetadataError::Other { role: Role::Timestamp, reason: "not trusted".into() });
    };
    if ts.version() < floor.timestamp {
        return Err(MetadataError::Rollback { role: Role::Timestamp, trusted: floor.timestamp, new: ts.version() });
    }
    if ts.snapshot().version() < floor.snapshot {
        return Err(MetadataError::Rollback {
            role: Role::Snapshot,
            trusted: floor.snapshot,
            new: ts.snapshot().version(),
        });
    }
    check_pinned(Role::Snapshot, input.snapshot, ts.snapshot())?;
    let ts_info = RoleInfo { role: Role::Timestamp, version: ts.version(), expires: rfc3339(ts.expires()) };

    // Snapshot.
    let raw = RawSignedMetadata::<Pouf1, SnapshotMetadata>::new(input.snapshot.to_vec());
    db.update_snapshot(&start, &raw).map_err(|e| tuf_err(Role::Snapshot, e))?;
    let Some(snap) = db.trusted_snapshot() else {
        return Err(MetadataError::Other { role: Role::Snapshot, reason: "not trusted".into() });
    };
    if *snap.expires() <= start {
        return Err(MetadataError::Expired {
            role: Role::Snapshot,
            expires: rfc3339(snap.expires()),
            now: rfc3339(&start),
        });
    }
    let Some(tdesc) = snap.meta().get(&MetadataPath::targets()) else {
        return Err(MetadataError::Unpinned { role: Role::Targets });
    };
    if tdesc.version() < floor.targets {
        return Err(MetadataError::Rollback { role: Role::Targets, trusted: floor.targets, new: tdesc.version() });
    }
    check_pinned(Role::Targets, input.targets, tdesc)?;
    let snap_info = RoleInfo { role: Role::Snapshot, version: snap.version(), expires: rfc3339(snap.expires()) };

    // Targets.
    let raw = RawSignedMetadata::<Pouf1, TargetsMetadata>::new(input.targets.to_vec());
    db.update_targets(&start, &raw).map_err(|e| tuf_err(Role::Targets, e))?;
    let Some(targets) = db.trusted_targets() else {
        return Err(MetadataError::Other { role: Role::Targets, reason: "not trusted".into() });
    };
    let targets_info =
        RoleInfo { role: Role::Targets, version: targets.version(), expires: rfc3339(targets.expires()) };
    let mut expected = BTreeMap::new();
    let mut by_hash = HashMap::new();
    for (path, d) in targets.targets() {
        let name = ComponentName::parse(path.as_str())?;
        let h = d.hashes().get(&HashAlgorithm::Sha256).map(|h| h.value());
        let Some(h) = h.and_then(|h| <[u8; 32]>::try_from(h).ok()).filter(|_| d.length() <= limits.component) else {
            return Err(MetadataError::BadTarget(short(path.as_str())));
        };
        by_hash.insert(h, name.target());
        if name.node == node {
            let secret = d.custom().get(SECRET_FIELD).and_then(|v| v.as_bool()).unwrap_or(false);
            expected.insert(name.clone(), Expected { name, length: d.length(), sha256: h, secret });
        }
    }
    if expected.is_empty() {
        return Err(MetadataError::NoTargetsForNode(node.to_string()));
    }
    let state = BootState {
        format: FORMAT,
        root: root_info.version,
        timestamp: ts_info.version,
        snapshot: snap_info.version,
        targets: targets_info.version,
        timestamp_keys: ts_keys,
        snapshot_keys: snap_keys,
        latest_known_time: start.timestamp(),
    };
    Ok(Trusted {
        node: node.to_string(),
        expected,
        by_hash,
        state,
        roles: vec![root_info, ts_info, snap_info, targets_info],
        notices,
    })
}

impl Trusted {
    /// The node this metadata was verified for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// This node's components, in layer order.
    pub fn components(&self) -> impl Iterator<Item = &Expected> {
        let mut v: Vec<&Expected> = self.expected.values().collect();
        v.sort_by(|a, b| (a.name.layer, &a.name.file).cmp(&(b.name.layer, &b.name.file)));
        v.into_iter()
    }

    /// This node's components of one layer.
    pub fn layer(&self, layer: Layer) -> impl Iterator<Item = &Expected> {
        self.expected.values().filter(move |e| e.name.layer == layer)
    }

    /// What the metadata says `name` must be.
    pub fn expected(&self, name: &ComponentName) -> Option<&Expected> {
        self.expected.get(name)
    }

    /// The state to record once the chain this metadata vouches for is built.
    pub fn new_state(&self) -> &BootState {
        &self.state
    }

    /// Versions and expiry of the four roles.
    pub fn roles(&self) -> &[RoleInfo] {
        &self.roles
    }

    /// Things worth logging that were not refusals.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// Checks `bytes` against the metadata's entry for `name`: length first,
    /// then SHA-256.
    ///
    /// # Errors
    /// [`ComponentError`]: not listed, wrong length, wrong hash, or the
    /// bytes of another component.
    pub fn check(&self, name: &ComponentName, bytes: &[u8]) -> Result<(), ComponentError> {
        let e = self.expected.get(name).ok_or_else(|| ComponentError::NotInMetadata(name.target()))?;
        let h = sha256(bytes);
        if bytes.len() as u64 == e.length && h == e.sha256 {
            return Ok(());
        }
        if let Some(other) = self.by_hash.get(&h)
            && *other != name.target()
        {
            return Err(ComponentError::WrongComponent { name: name.target(), other: other.clone() });
        }
        if bytes.len() as u64 != e.length {
            return Err(ComponentError::Length { name: name.target(), expected: e.length, found: bytes.len() as u64 });
        }
        Err(ComponentError::Hash { name: name.target(), expected: hex(&e.sha256), found: hex(&h) })
    }
}
