//! Ed25519 identities, their public names (fingerprints), the X25519 Noise
//! static keys bound to them, and key files.
//!
//! Every node and user owns an Ed25519 key pair. The *fingerprint*, the first
//! 16 bytes of SHA-256 over the public key in hex, names the principal in logs,
//! status output and credentials. The Noise static key is the X25519 form of
//! the same key (the birational map used by libsodium's
//! `crypto_sign_ed25519_pk_to_curve25519`), so knowing a neighbour's Ed25519
//! key from the config is enough to run Noise IK toward it; handshakes carry a
//! signature over the static key as well (see `docs/security.md`).
//!
//! Key files are one line of text:
//! `anode-ed25519-secret-v1 <64 hex digits of the 32-byte seed>` (mode 0600,
//! never overwritten) and `anode-ed25519-public-v1 <64 hex digits>`.

use core::fmt;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::{Zeroize, Zeroizing};

/// First word of a secret key file.
pub const SECRET_TAG: &str = "anode-ed25519-secret-v1";
/// First word of a public key file.
pub const PUBLIC_TAG: &str = "anode-ed25519-public-v1";
/// Domain separation for the signature that binds a Noise static key.
pub const STATIC_BINDING_CONTEXT: &[u8] = b"anode/sane/noise-static-key/v1";

/// A problem with a key or key file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not a key of the expected kind.
    #[error("{what}: not an anode {kind} key (expected `{tag} <64 hex digits>`)")]
    Format {
        /// File or source.
        what: String,
        /// "secret" or "public".
        kind: &'static str,
        /// The expected first word.
        tag: &'static str,
    },
    /// The bytes are not a valid Ed25519 public key.
    #[error("{0}: not a valid Ed25519 public key (not a curve point)")]
    BadPoint(String),
    /// A secret key file is readable by group or others.
    #[error("{path}: secret key is accessible by group or others (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file exists and would be overwritten.
    #[error("{0}: already exists; refusing to overwrite a key (remove it first if you mean to)")]
    Exists(PathBuf),
    /// An I/O error on a key file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The system random number generator failed.
    #[error("system random number generator failed: {0}")]
    Random(String),
}

/// A principal's public key (Ed25519), checked to be a curve point.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// From raw bytes; fails if they are not a valid point.
    pub fn from_bytes(b: &[u8; 32]) -> Option<PublicKey> {
        VerifyingKey::from_bytes(b).ok().map(|_| PublicKey(*b))
    }
    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// The principal's name: first 16 bytes of SHA-256(key), hex.
    pub fn fingerprint(&self) -> Fingerprint {
        let d = Sha256::digest(self.0);
        let mut f = [0u8; 16];
        f.copy_from_slice(&d[..16]);
        Fingerprint(f)
    }
    /// The X25519 public key Noise uses for this identity.
    pub fn x25519(&self) -> [u8; 32] {
        match VerifyingKey::from_bytes(&self.0) {
            Ok(v) => v.to_montgomery().to_bytes(),
            // Unreachable: constructors check the point.
            Err(_) => [0; 32],
        }
    }
    /// Verifies `sig` over `msg` (strict verification: no malleable or
    /// small-order signatures).
    pub fn verify(&self, msg: &[u8], sig: &[u8; 64]) -> bool {
        match VerifyingKey::from_bytes(&self.0) {
            Ok(v) => v.verify_strict(msg, &Signature::from_bytes(sig)).is_ok(),
            Err(_) => false,
        }
    }
    /// Parses 64 hex digits, or a public key file's text.
    pub fn parse(text: &str) -> Result<PublicKey, KeyError> {
        let t = text.trim();
        let hex = t.strip_prefix(PUBLIC_TAG).map(str::trim).unwrap_or(t);
        let fmt = || KeyError::Format { what: short(text), kind: "public", tag: PUBLIC_TAG };
        let b = decode_hex32(hex).ok_or_else(fmt)?;
        PublicKey::from_bytes(&b).ok_or_else(|| KeyError::BadPoint(short(text)))
    }
    /// The text of a public key file.
    pub fn to_file_text(&self) -> String {
        format!("{PUBLIC_TAG} {self}\n")
    }
}

fn short(t: &str) -> String {
    let t = t.trim();
    if t.len() > 24 { format!("{:?}…", t.get(..24).unwrap_or("")) } else { format!("{t:?}") }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

fn write_hex(f: &mut impl fmt::Write, bytes: &[u8]) -> fmt::Result {
    for b in bytes {
        f.write_char(char::from(HEX[(b >> 4) as usize]))?;
        f.write_char(char::from(HEX[(b & 15) as usize]))?;
    }
    Ok(())
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

/// A principal's short name (16 bytes of SHA-256 of its public key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 16]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An Ed25519 key pair. The secret is zeroized when dropped.
pub struct Identity {
    signing: SigningKey,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.public().fingerprint())
    }
}

impl Clone for Identity {
    fn clone(&self) -> Identity {
        Identity { signing: SigningKey::from_bytes(self.signing.as_bytes()) }
    }
}

impl Identity {
    /// A fresh key pair from the system's random number generator.
    pub fn generate() -> Result<Identity, KeyError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut *seed).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Identity::from_seed(&seed))
    }
    /// From a 32-byte seed (tests and key files).
    pub fn from_seed(seed: &[u8; 32]) -> Identity {
        Identity { signing: SigningKey::from_bytes(seed) }
    }
    /// The 32-byte secret seed (zeroized when dropped), for libraries that
    /// take Ed25519 keys in that form (credential issuing).
    pub fn secret_seed(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(*self.signing.as_bytes())
    }
    /// The public key.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key().to_bytes())
    }
    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.signing.sign(msg).to_bytes()
    }
    /// The X25519 secret for Noise (zeroized when dropped).
    pub fn x25519_secret(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.signing.to_scalar_bytes())
    }
    /// Parses a secret key file's text.
    pub fn parse(text: &str) -> Result<Identity, KeyError> {
        let fmt = || KeyError::Format { what: "secret key".into(), kind: "secret", tag: SECRET_TAG };
        let hex = text.trim().strip_prefix(SECRET_TAG).ok_or_else(fmt)?;
        let mut seed = Zeroizing::new(decode_hex32(hex.trim()).ok_or_else(fmt)?);
        let id = Identity::from_seed(&seed);
        seed.zeroize();
        Ok(id)
    }
    /// The text of a secret key file (zeroized when dropped).
    pub fn to_file_text(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(SECRET_TAG.len() + 66));
        s.push_str(SECRET_TAG);
        s.push(' ');
        // Writing to a String cannot fail.
        let _ = write_hex(&mut *s, self.signing.as_bytes());
        s.push('\n');
        s
    }

    /// Loads a secret key file, refusing one that group or others can access.
    pub fn load(path: &Path) -> Result<Identity, KeyError> {
        let io = |source| KeyError::Io { path: path.to_path_buf(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: path.to_path_buf(), mode });
        }
        if meta.len() > 4096 {
            return Err(KeyError::Format { what: path.display().to_string(), kind: "secret", tag: SECRET_TAG });
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(io)?);
        Identity::parse(&text).map_err(|e| match e {
            KeyError::Format { kind, tag, .. } => KeyError::Format { what: path.display().to_string(), kind, tag },
            e => e,
        })
    }

    /// Writes `DIR/NAME.key` (mode 0600) and `DIR/NAME.pub`, refusing to
    /// overwrite either. Creates `DIR` (mode 0700) if needed.
    pub fn save(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), KeyError> {
        let secret = dir.join(format!("{name}.key"));
        let public = dir.join(format!("{name}.pub"));
        for p in [&secret, &public] {
            if p.exists() {
                return Err(KeyError::Exists(p.clone()));
            }
        }
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| KeyError::Io { path: dir.to_path_buf(), source })?;
        }
        use std::os::unix::fs::DirBuilderExt;
        let write = |p: &Path, mode: u32, text: &str| -> Result<(), KeyError> {
            let io = |source| KeyError::Io { path: p.to_path_buf(), source };
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(p).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists { KeyError::Exists(p.to_path_buf()) } else { io(e) }
            })?;
            f.write_all(text.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)
        };
        write(&secret, 0o600, &self.to_file_text())?;
        write(&public, 0o644, &self.public().to_file_text())?;
        Ok((secret, public))
    }

    /// The identity payload that binds this identity to its Noise static
    /// key: the public key, then a signature over
    /// [`STATIC_BINDING_CONTEXT`] ‖ X25519 static key.
    pub fn binding(&self) -> [u8; 96] {
        let mut msg = [0u8; STATIC_BINDING_CONTEXT.len() + 32];
        msg[..STATIC_BINDING_CONTEXT.len()].copy_from_slice(STATIC_BINDING_CONTEXT);
        msg[STATIC_BINDING_CONTEXT.len()..].copy_from_slice(&self.public().x25519());
        let mut out = [0u8; 96];
        out[..32].copy_from_slice(self.public().as_bytes());
        out[32..].copy_from_slice(&self.sign(&msg));
        out
    }
}

/// Checks an identity payload against the Noise static key the peer proved
/// it holds. Returns the peer's identity if the signature is valid and the
/// static key is the X25519 form of the signed identity.
pub fn verify_binding(payload: &[u8; 96], remote_static: &[u8]) -> Option<PublicKey> {
    let mut pk = [0u8; 32];
    pk.copy_from_slice(&payload[..32]);
    let key = PublicKey::from_bytes(&pk)?;
    let mut sig = [0u8; 64];
    sig.copy_from_slice(&payload[32..]);
    let mut msg = [0u8; STATIC_BINDING_CONTEXT.len() + 32];
    msg[..STATIC_BINDING_CONTEXT.len()].copy_from_slice(STATIC_BINDING_CONTEXT);
    let rs: [u8; 32] = remote_static.try_into().ok()?;
    msg[STATIC_BINDING_CONTEXT.len()..].copy_from_slice(&rs);
    (key.x25519() == rs && key.verify(&msg, &sig)).then_some(key)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn key_text_round_trips() {
        let id = Identity::from_seed(&[7; 32]);
        let back = Identity::parse(&id.to_file_text()).unwrap();
        assert_eq!(back.public(), id.public());
        assert_eq!(PublicKey::parse(&id.public().to_file_text()).unwrap(), id.public());
        assert_eq!(PublicKey::parse(&id.public().to_string()).unwrap(), id.public());
        assert_eq!(id.public().fingerprint().to_string().len(), 32);
    }

    #[test]
    fn bad_key_text_is_refused() {
        assert!(matches!(Identity::parse("hello"), Err(KeyError::Format { .. })));
        assert!(matches!(Identity::parse(&format!("{SECRET_TAG} 12")), Err(KeyError::Format { .. })));
        assert!(matches!(PublicKey::parse(&"zz".repeat(32)), Err(KeyError::Format { .. })));
        // Not a point: y = 2 has no x on the curve.
        let mut b = [0u8; 32];
        b[0] = 2;
        let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
        assert!(matches!(PublicKey::parse(&hex), Err(KeyError::BadPoint(_))));
    }

    #[test]
    fn binding_verifies_only_the_right_static_key() {
        let a = Identity::from_seed(&[1; 32]);
        let b = Identity::from_seed(&[2; 32]);
        let p = a.binding();
        assert_eq!(verify_binding(&p, &a.public().x25519()), Some(a.public()));
        assert_eq!(verify_binding(&p, &b.public().x25519()), None);
        let mut bad = p;
        bad[40] ^= 1;
        assert_eq!(verify_binding(&bad, &a.public().x25519()), None);
    }

    #[test]
    fn save_refuses_overwrite_and_load_checks_mode() {
        let dir = std::env::temp_dir().join(format!("anode-sec-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let id = Identity::from_seed(&[3; 32]);
        let (sk, pk) = id.save(&dir, "node").unwrap();
        assert_eq!(std::fs::metadata(&sk).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(id.save(&dir, "node"), Err(KeyError::Exists(_))));
        assert_eq!(Identity::load(&sk).unwrap().public(), id.public());
        assert_eq!(PublicKey::parse(&std::fs::read_to_string(&pk).unwrap()).unwrap(), id.public());
        std::fs::set_permissions(&sk, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Identity::load(&sk), Err(KeyError::Permissions { mode: 0o644, .. })));
        assert!(matches!(Identity::load(&dir.join("missing.key")), Err(KeyError::Io { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
