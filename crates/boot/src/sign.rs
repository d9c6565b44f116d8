//! The operator's side: making the four TUF roles' metadata for the
//! components of one or more nodes.
//!
//! Keys are ordinary anode Ed25519 identities ([`anode_sec::Identity`], the
//! key files of `anode keys gen`), converted to the `tuf` crate's keys. A
//! role signed by several keys carries one signature per key; the node
//! requires the role's threshold of them.

use crate::layer::{ComponentName, Layer};
use crate::verify::SECRET_FIELD;
use anode_sec::{Identity, PublicKey};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;
use tuf::crypto::{Ed25519PrivateKey, HashAlgorithm};
use tuf::metadata::{
    Metadata, MetadataDescription, RawSignedMetadata, RootMetadataBuilder, SignedMetadata, SnapshotMetadataBuilder,
    TargetDescription, TargetPath, TargetsMetadata, TargetsMetadataBuilder, TimestampMetadataBuilder,
};
use tuf::pouf::Pouf1;

/// Why metadata could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// A role has no signing key.
    #[error("no signing key given")]
    NoSigner,
    /// A threshold of zero or above the number of keys.
    #[error("threshold {threshold} for {n} key(s)")]
    Threshold {
        /// The threshold.
        threshold: u32,
        /// The keys.
        n: usize,
    },
    /// Existing targets metadata does not parse.
    #[error("existing targets metadata: {0}")]
    Existing(String),
    /// The tuf crate refused (bad key, bad path, serialization).
    #[error("{0}")]
    Tuf(String),
}

fn tuf(e: tuf::Error) -> SignError {
    SignError::Tuf(e.to_string())
}

fn private(id: &Identity) -> Result<Ed25519PrivateKey, SignError> {
    let mut pair = [0u8; 64];
    pair[..32].copy_from_slice(&*id.secret_seed());
    pair[32..].copy_from_slice(id.public().as_bytes());
    let k = Ed25519PrivateKey::from_ed25519(&pair).map_err(tuf);
    pair.fill(0);
    k
}

fn public(k: &PublicKey) -> Result<tuf::crypto::PublicKey, SignError> {
    tuf::crypto::PublicKey::from_ed25519(k.as_bytes().to_vec()).map_err(tuf)
}

fn utc(t: SystemTime) -> DateTime<Utc> {
    // Whole seconds: the metadata format carries no fraction.
    let t: DateTime<Utc> = DateTime::from(t);
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

fn signed<M: Metadata>(m: &M, signers: &[&Identity]) -> Result<Vec<u8>, SignError> {
    let (first, rest) = signers.split_first().ok_or(SignError::NoSigner)?;
    let mut s = SignedMetadata::<Pouf1, M>::new(m, &private(first)?).map_err(tuf)?;
    for k in rest {
        s.add_signature(&private(k)?).map_err(tuf)?;
    }
    Ok(s.to_raw().map_err(tuf)?.as_bytes().to_vec())
}

/// Keys and threshold of one role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleKeys {
    /// Public keys.
    pub keys: Vec<PublicKey>,
    /// Signatures required.
    pub threshold: u32,
}

impl RoleKeys {
    /// One key, threshold one.
    pub fn one(k: PublicKey) -> RoleKeys {
        RoleKeys { keys: vec![k], threshold: 1 }
    }
    fn check(&self) -> Result<(), SignError> {
        if self.threshold == 0 || self.threshold as usize > self.keys.len() {
            return Err(SignError::Threshold { threshold: self.threshold, n: self.keys.len() });
        }
        Ok(())
    }
}

/// What the root metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootSpec {
    /// Version (1 for the first).
    pub version: u32,
    /// Expiry.
    pub expires: SystemTime,
    /// Root keys.
    pub root: RoleKeys,
    /// Targets keys.
    pub targets: RoleKeys,
    /// Snapshot keys.
    pub snapshot: RoleKeys,
    /// Timestamp keys.
    pub timestamp: RoleKeys,
}

/// Signed root metadata. For a rotation, `signers` must include a threshold
/// of the previous root's keys *and* of the new ones.
pub fn root(spec: &RootSpec, signers: &[&Identity]) -> Result<Vec<u8>, SignError> {
    for r in [&spec.root, &spec.targets, &spec.snapshot, &spec.timestamp] {
        r.check()?;
    }
    let mut b = RootMetadataBuilder::new()
        .version(spec.version)
        .expires(utc(spec.expires))
        .consistent_snapshot(false)
        .root_threshold(spec.root.threshold)
        .targets_threshold(spec.targets.threshold)
        .snapshot_threshold(spec.snapshot.threshold)
        .timestamp_threshold(spec.timestamp.threshold);
    for k in &spec.root.keys {
        b = b.root_key(public(k)?);
    }
    for k in &spec.targets.keys {
        b = b.targets_key(public(k)?);
    }
    for k in &spec.snapshot.keys {
        b = b.snapshot_key(public(k)?);
    }
    for k in &spec.timestamp.keys {
        b = b.timestamp_key(public(k)?);
    }
    signed(&b.build().map_err(tuf)?, signers)
}

/// The targets of a repository: every node's components.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    entries: BTreeMap<String, TargetDescription>,
}

impl Targets {
    /// No targets.
    pub fn new() -> Targets {
        Targets::default()
    }

    /// The targets of existing (the operator's own) targets metadata, to
    /// change one node's components and keep the others'.
    pub fn from_existing(targets_json: &[u8]) -> Result<Targets, SignError> {
        let raw = RawSignedMetadata::<Pouf1, TargetsMetadata>::new(targets_json.to_vec());
        let m = raw.parse_untrusted().and_then(|s| s.assume_valid()).map_err(|e| SignError::Existing(e.to_string()))?;
        let entries = m.targets().iter().map(|(p, d)| (p.as_str().to_string(), d.clone())).collect();
        Ok(Targets { entries })
    }

    /// Forgets every component of `node`.
    pub fn remove_node(&mut self, node: &str) {
        let prefix = format!("{node}/");
        self.entries.retain(|k, _| !k.starts_with(&prefix));
    }

    /// Adds (or replaces) a component. A component of the keys layer whose
    /// bytes are a secret file (a node key, a domain secret) is marked secret.
    pub fn add(&mut self, name: &ComponentName, bytes: &[u8]) -> Result<(), SignError> {
        let secret = name.layer == Layer::Keys && crate::layer::is_secret_file(bytes);
        let mut custom = HashMap::new();
        if secret {
            custom.insert(SECRET_FIELD.to_string(), serde_json::Value::Bool(true));
        }
        let d = TargetDescription::from_slice_with_custom(bytes, &[HashAlgorithm::Sha256], custom).map_err(tuf)?;
        self.entries.insert(name.target(), d);
        Ok(())
    }

    /// Target names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether a target is marked secret.
    pub fn is_secret(&self, target: &str) -> bool {
        self.entries.get(target).and_then(|d| d.custom().get(SECRET_FIELD)).and_then(|v| v.as_bool()).unwrap_or(false)
    }

    /// Signed targets metadata.
    pub fn sign(&self, version: u32, expires: SystemTime, signers: &[&Identity]) -> Result<Vec<u8>, SignError> {
        let mut b = TargetsMetadataBuilder::new().version(version).expires(utc(expires));
        for (p, d) in &self.entries {
            b = b.insert_target_description(TargetPath::new(p.clone()).map_err(tuf)?, d.clone());
        }
        signed(&b.build().map_err(tuf)?, signers)
    }
}

/// Signed snapshot metadata pinning `targets` (its version, length and SHA-256).
pub fn snapshot(
    version: u32,
    expires: SystemTime,
    targets: &[u8],
    signers: &[&Identity],
) -> Result<Vec<u8>, SignError> {
    let v = version_of(targets).ok_or_else(|| SignError::Tuf("targets metadata has no version".into()))?;
    let d = MetadataDescription::from_slice(targets, v, &[HashAlgorithm::Sha256]).map_err(tuf)?;
    let path = tuf::metadata::MetadataPath::targets();
    let m = SnapshotMetadataBuilder::new()
        .version(version)
        .expires(utc(expires))
        .insert_metadata_description(path, d)
        .build()
        .map_err(tuf)?;
    signed(&m, signers)
}

/// Signed timestamp metadata pinning `snapshot`.
pub fn timestamp(
    version: u32,
    expires: SystemTime,
    snapshot: &[u8],
    signers: &[&Identity],
) -> Result<Vec<u8>, SignError> {
    let v = version_of(snapshot).ok_or_else(|| SignError::Tuf("snapshot metadata has no version".into()))?;
    let d = MetadataDescription::from_slice(snapshot, v, &[HashAlgorithm::Sha256]).map_err(tuf)?;
    let m = TimestampMetadataBuilder::from_metadata_description(d)
        .version(version)
        .expires(utc(expires))
        .build()
        .map_err(tuf)?;
    signed(&m, signers)
}

/// The `signed.version` of any metadata file, unverified (for numbering the
/// next version on the operator's side only).
pub fn version_of(metadata: &[u8]) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_slice(metadata).ok()?;
    v.get("signed")?.get("version")?.as_u64().and_then(|v| u32::try_from(v).ok())
}
