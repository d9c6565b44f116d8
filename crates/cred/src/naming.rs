//! Module naming (SANE §4.9): by hash of the code, by programmer key + name +
//! version (the code carries the programmer's Ed25519 signature), or by the
//! loading principal's key + name; and version preference lists with fallback.
//!
//! # The signature section
//!
//! A programmer-signed module is an ordinary WebAssembly binary whose **last**
//! section is a custom section named `anode.sig` (custom sections are ignored
//! by the engine, so the signed code runs unchanged). Its payload:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format, `1` |
//! | 32 | programmer's Ed25519 public key |
//! | 1 + n | name length `n` (1..=64), name (UTF-8, see [`valid_ident`]) |
//! | 1 + v | version length `v` (1..=32), version |
//! | 64 | Ed25519 signature |
//!
//! The signature covers `"anode-module-sig-v1\0" ‖ SHA-256(bytes before the
//! section) ‖ n ‖ name ‖ v ‖ version`. The module's hash name is SHA-256 of
//! the whole binary, signature section included.

use core::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

/// Name of the custom section that carries a programmer's signature.
pub const SIG_SECTION: &str = "anode.sig";
const SIG_DOMAIN: &[u8] = b"anode-module-sig-v1\0";
/// Longest module name (programmer or local naming), in bytes.
pub const MAX_NAME: usize = 64;
/// Longest version string, in bytes.
pub const MAX_VERSION: usize = 32;
/// Most alternatives in one version preference list.
pub const MAX_PREFERENCES: usize = 8;

/// Errors in module names, preference lists and signature sections.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// A name or version is empty, too long, or has a character outside `[A-Za-z0-9._-]`.
    #[error("invalid module name {0:?}: 1..=64 characters from [A-Za-z0-9._-] (version: 1..=32)")]
    InvalidName(String),
    /// A programmer-signed name lacks the `/version` part.
    #[error("signed module name {0:?} has no version: expected NAME/VERSION")]
    NoVersion(String),
    /// A preference list is empty or has too many alternatives.
    #[error("a preference list needs 1..={MAX_PREFERENCES} alternatives separated by '|', got {0}")]
    BadPreferenceList(usize),
    /// The binary is not a WebAssembly module (bad header or section framing).
    #[error("malformed wasm: {0}")]
    MalformedWasm(&'static str),
    /// The `anode.sig` section is malformed or not the last section.
    #[error("malformed signature section: {0}")]
    MalformedSignature(&'static str),
    /// The programmer's signature does not verify.
    #[error("invalid programmer signature on module {name}/{version} (programmer {programmer})")]
    InvalidSignature {
        /// The claimed programmer key.
        programmer: PrincipalId,
        /// The claimed name.
        name: String,
        /// The claimed version.
        version: String,
    },
}

/// A principal (administrator, user, programmer): its Ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrincipalId(pub [u8; 32]);

impl PrincipalId {
    /// Lower-case hex of the key (64 characters), as used in credentials.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<PrincipalId> {
        let mut out = [0u8; 32];
        unhex(s, &mut out).then_some(PrincipalId(out))
    }
    /// The principal of an Ed25519 signing key.
    pub fn of(key: &SigningKey) -> PrincipalId {
        PrincipalId(key.verifying_key().to_bytes())
    }
}

impl fmt::Display for PrincipalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0[..8]))
    }
}
impl fmt::Debug for PrincipalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrincipalId({})", hex(&self.0[..8]))
    }
}

/// SHA-256 of a module's complete binary: its name by hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleHash(pub [u8; 32]);

impl ModuleHash {
    /// Hashes a module binary.
    pub fn of(code: &[u8]) -> ModuleHash {
        ModuleHash(Sha256::digest(code).into())
    }
    /// Lower-case hex (64 characters).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<ModuleHash> {
        let mut out = [0u8; 32];
        unhex(s, &mut out).then_some(ModuleHash(out))
    }
}
impl fmt::Display for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0[..8]))
    }
}
impl fmt::Debug for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModuleHash({})", hex(&self.0[..8]))
    }
}

/// A programmer's verified claim on a module: key, name, version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SignedName {
    /// The programmer's key.
    pub programmer: PrincipalId,
    /// The programmer's name for the module.
    pub name: String,
    /// The version.
    pub version: String,
}

/// What the node knows about a module binary before compiling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// SHA-256 of the whole binary.
    pub hash: ModuleHash,
    /// The programmer's name, if the code carries a valid signature section.
    pub signed: Option<SignedName>,
}

impl CodeInfo {
    /// Hashes the code and verifies its signature section if it has one.
    /// A present but invalid signature refuses the module.
    pub fn inspect(code: &[u8]) -> Result<CodeInfo, NameError> {
        let hash = ModuleHash::of(code);
        let signed = match find_sig_section(code)? {
            None => None,
            Some((start, payload)) => Some(verify_sig(&code[..start], payload)?),
        };
        Ok(CodeInfo { hash, signed })
    }
}

/// The three ways of naming a loaded module (SANE §4.9).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModuleName {
    /// `{H}`: trust only the code itself.
    Hash(ModuleHash),
    /// `{Q, "name/version"}`: trust the programmer `Q` who signed it.
    Signed {
        /// Programmer key.
        programmer: PrincipalId,
        /// Name.
        name: String,
        /// Version.
        version: String,
    },
    /// `{P, "name"}`: trust the principal `P` who loaded it.
    Local {
        /// Loading principal.
        loader: PrincipalId,
        /// The loader's name for it.
        name: String,
    },
}

impl fmt::Display for ModuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleName::Hash(h) => write!(f, "{{{h}}}"),
            ModuleName::Signed { programmer, name, version } => write!(f, "{{{programmer}, {name}/{version}}}"),
            ModuleName::Local { loader, name } => write!(f, "{{{loader}, {name}}}"),
        }
    }
}

/// A request for a module by name with fallback, e.g. programmer `Q` with
/// `"IPv4/version2 | IPv4/version1"`: the first alternative that is loaded wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameRequest {
    /// By hash (no alternatives).
    Hash(ModuleHash),
    /// By programmer key and a list of `name/version` alternatives.
    Signed {
        /// Programmer key.
        programmer: PrincipalId,
        /// `(name, version)` in order of preference.
        alternatives: Vec<(String, String)>,
    },
    /// By loader key and a list of name alternatives.
    Local {
        /// Loading principal.
        loader: PrincipalId,
        /// Names in order of preference.
        alternatives: Vec<String>,
    },
}

impl NameRequest {
    /// Parses `"name/version | name/version ..."` for a programmer key.
    pub fn signed(programmer: PrincipalId, list: &str) -> Result<NameRequest, NameError> {
        let alternatives = split_list(list)?.into_iter().map(split_signed).collect::<Result<Vec<_>, _>>()?;
        Ok(NameRequest::Signed { programmer, alternatives })
    }
    /// Parses `"name | name ..."` for a loader key.
    pub fn local(loader: PrincipalId, list: &str) -> Result<NameRequest, NameError> {
        let alternatives = split_list(list)?
            .into_iter()
            .map(|s| if valid_ident(s, MAX_NAME) { Ok(s.to_string()) } else { Err(NameError::InvalidName(s.into())) })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NameRequest::Local { loader, alternatives })
    }
    /// The candidate names, most preferred first.
    pub fn candidates(&self) -> Vec<ModuleName> {
        match self {
            NameRequest::Hash(h) => vec![ModuleName::Hash(*h)],
            NameRequest::Signed { programmer, alternatives } => alternatives
                .iter()
                .map(|(n, v)| ModuleName::Signed { programmer: *programmer, name: n.clone(), version: v.clone() })
                .collect(),
            NameRequest::Local { loader, alternatives } => {
                alternatives.iter().map(|n| ModuleName::Local { loader: *loader, name: n.clone() }).collect()
            }
        }
    }
}

fn split_list(list: &str) -> Result<Vec<&str>, NameError> {
    let parts: Vec<&str> = list.split('|').map(str::trim).collect();
    if parts.is_empty() || parts.len() > MAX_PREFERENCES || parts.iter().any(|p| p.is_empty()) {
        return Err(NameError::BadPreferenceList(parts.iter().filter(|p| !p.is_empty()).count()));
    }
    Ok(parts)
}

/// Splits `"name/version"` at the last `/`.
pub fn split_signed(s: &str) -> Result<(String, String), NameError> {
    let (n, v) = s.rsplit_once('/').ok_or_else(|| NameError::NoVersion(s.into()))?;
    if !valid_ident(n, MAX_NAME) || n.contains('/') || !valid_ident(v, MAX_VERSION) {
        return Err(NameError::InvalidName(s.into()));
    }
    Ok((n.to_string(), v.to_string()))
}

/// A module name or version: `1..=max` bytes from `[A-Za-z0-9._-]`.
pub fn valid_ident(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Appends a programmer signature section to a module binary (which must not
/// already carry one).
pub fn sign_module(code: &[u8], key: &SigningKey, name: &str, version: &str) -> Result<Vec<u8>, NameError> {
    if !valid_ident(name, MAX_NAME) {
        return Err(NameError::InvalidName(name.into()));
    }
    if !valid_ident(version, MAX_VERSION) {
        return Err(NameError::InvalidName(version.into()));
    }
    if find_sig_section(code)?.is_some() {
        return Err(NameError::MalformedSignature("module is already signed"));
    }
    let msg = sig_message(code, name, version);
    let sig = key.sign(&msg);
    let mut payload = Vec::with_capacity(1 + 32 + 2 + name.len() + version.len() + 64);
    payload.push(1);
    payload.extend_from_slice(&key.verifying_key().to_bytes());
    payload.push(name.len() as u8);
    payload.extend_from_slice(name.as_bytes());
    payload.push(version.len() as u8);
    payload.extend_from_slice(version.as_bytes());
    payload.extend_from_slice(&sig.to_bytes());
    let mut body = Vec::new();
    leb128(&mut body, SIG_SECTION.len() as u32);
    body.extend_from_slice(SIG_SECTION.as_bytes());
    body.extend_from_slice(&payload);
    let mut out = code.to_vec();
    out.push(0);
    leb128(&mut out, body.len() as u32);
    out.extend_from_slice(&body);
    Ok(out)
}

fn sig_message(code: &[u8], name: &str, version: &str) -> Vec<u8> {
    let mut msg = Vec::with_capacity(SIG_DOMAIN.len() + 32 + 2 + name.len() + version.len());
    msg.extend_from_slice(SIG_DOMAIN);
    msg.extend_from_slice(&Sha256::digest(code));
    msg.push(name.len() as u8);
    msg.extend_from_slice(name.as_bytes());
    msg.push(version.len() as u8);
    msg.extend_from_slice(version.as_bytes());
    msg
}

fn verify_sig(signed_code: &[u8], p: &[u8]) -> Result<SignedName, NameError> {
    let bad = NameError::MalformedSignature;
    let mut r = Reader(p);
    if r.u8().ok_or(bad("truncated"))? != 1 {
        return Err(bad("unknown format"));
    }
    let key: [u8; 32] = r.take(32).ok_or(bad("truncated key"))?.try_into().map_err(|_| bad("key"))?;
    let nlen = r.u8().ok_or(bad("truncated"))? as usize;
    let name = core::str::from_utf8(r.take(nlen).ok_or(bad("truncated name"))?).map_err(|_| bad("name not UTF-8"))?;
    let vlen = r.u8().ok_or(bad("truncated"))? as usize;
    let version =
        core::str::from_utf8(r.take(vlen).ok_or(bad("truncated version"))?).map_err(|_| bad("version not UTF-8"))?;
    let sig: [u8; 64] = r.take(64).ok_or(bad("truncated signature"))?.try_into().map_err(|_| bad("signature"))?;
    if !r.0.is_empty() {
        return Err(bad("trailing bytes"));
    }
    if !valid_ident(name, MAX_NAME) || !valid_ident(version, MAX_VERSION) {
        return Err(NameError::InvalidName(format!("{name}/{version}")));
    }
    let programmer = PrincipalId(key);
    let invalid = || NameError::InvalidSignature { programmer, name: name.into(), version: version.into() };
    let vk = VerifyingKey::from_bytes(&key).map_err(|_| invalid())?;
    vk.verify_strict(&sig_message(signed_code, name, version), &Signature::from_bytes(&sig)).map_err(|_| invalid())?;
    Ok(SignedName { programmer, name: name.into(), version: version.into() })
}

/// Walks the module's sections. Returns the offset of the `anode.sig` section
/// and its payload if present; it must be the last section and unique.
fn find_sig_section(code: &[u8]) -> Result<Option<(usize, &[u8])>, NameError> {
    let bad = NameError::MalformedWasm;
    if code.len() < 8 || &code[..4] != b"\0asm" || code[4..8] != [1, 0, 0, 0] {
        return Err(bad("not a WebAssembly module (bad magic or version)"));
    }
    let mut pos = 8;
    let mut found = None;
    while pos < code.len() {
        let start = pos;
        let id = code[pos];
        pos += 1;
        let (size, n) = read_leb(&code[pos..]).ok_or(bad("bad section size"))?;
        pos += n;
        let end = pos.checked_add(size as usize).filter(|&e| e <= code.len()).ok_or(bad("section past end"))?;
        if found.is_some() {
            return Err(NameError::MalformedSignature("the signature section is not the last section"));
        }
        if id == 0 {
            let body = &code[pos..end];
            let (nlen, k) = read_leb(body).ok_or(bad("bad custom section name"))?;
            let name_end = k.checked_add(nlen as usize).filter(|&e| e <= body.len()).ok_or(bad("custom name"))?;
            if &body[k..name_end] == SIG_SECTION.as_bytes() {
                found = Some((start, &body[name_end..]));
            }
        }
        pos = end;
    }
    Ok(found)
}

fn read_leb(b: &[u8]) -> Option<(u32, usize)> {
    let mut v: u32 = 0;
    for (i, &byte) in b.iter().take(5).enumerate() {
        let bits = (byte & 0x7f) as u32;
        if i == 4 && bits > 0x0f {
            return None;
        }
        v |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

fn leb128(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

struct Reader<'a>(&'a [u8]);
impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[(x >> 4) as usize] as char);
        s.push(D[(x & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str, out: &mut [u8]) -> bool {
    let b = s.as_bytes();
    if b.len() != out.len() * 2 {
        return false;
    }
    let val = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    for (i, o) in out.iter_mut().enumerate() {
        match (val(b[2 * i]), val(b[2 * i + 1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const EMPTY: &[u8] = b"\0asm\x01\0\0\0";

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn sign_and_verify_round_trip() {
        let signed = sign_module(EMPTY, &key(1), "IPv4", "version2").unwrap();
        let info = CodeInfo::inspect(&signed).unwrap();
        let s = info.signed.unwrap();
        assert_eq!((s.programmer, s.name.as_str(), s.version.as_str()), (PrincipalId::of(&key(1)), "IPv4", "version2"));
        assert_eq!(info.hash, ModuleHash::of(&signed));
        assert_eq!(CodeInfo::inspect(EMPTY).unwrap().signed, None);
    }

    #[test]
    fn tampered_code_or_claim_fails_signature() {
        // Add a (harmless) custom section before the signature: the signed prefix changes.
        let mut code = EMPTY.to_vec();
        code.extend_from_slice(&[0, 2, 1, b'x']);
        let signed = sign_module(&code, &key(1), "ping", "1").unwrap();
        let mut bad = signed.clone();
        bad[11] = b'y';
        assert!(matches!(CodeInfo::inspect(&bad), Err(NameError::InvalidSignature { .. })));
        // Claiming another version with the same signature.
        let mut bad = signed.clone();
        let pos = bad.len() - 64 - 1;
        bad[pos] = b'2';
        assert!(matches!(CodeInfo::inspect(&bad), Err(NameError::InvalidSignature { .. })));
        // The last byte of the signature flipped.
        let mut bad = signed;
        *bad.last_mut().unwrap() ^= 1;
        assert!(matches!(CodeInfo::inspect(&bad), Err(NameError::InvalidSignature { .. })));
    }

    #[test]
    fn signature_must_be_last_and_unique() {
        let signed = sign_module(EMPTY, &key(1), "a", "1").unwrap();
        let mut extra = signed.clone();
        extra.extend_from_slice(&[0, 2, 1, b'x']);
        assert!(matches!(CodeInfo::inspect(&extra), Err(NameError::MalformedSignature(_))));
        assert!(matches!(sign_module(&signed, &key(1), "a", "1"), Err(NameError::MalformedSignature(_))));
    }

    #[test]
    fn malformed_framing_is_refused() {
        assert!(matches!(CodeInfo::inspect(b"\0asm"), Err(NameError::MalformedWasm(_))));
        assert!(matches!(CodeInfo::inspect(b"\0asm\x01\0\0\0\x01\x05\0"), Err(NameError::MalformedWasm(_))));
        assert!(matches!(
            CodeInfo::inspect(b"\0asm\x01\0\0\0\x01\xff\xff\xff\xff\xff"),
            Err(NameError::MalformedWasm(_))
        ));
    }

    #[test]
    fn preference_lists() {
        let q = PrincipalId([7; 32]);
        let r = NameRequest::signed(q, "IPv4/version2 | IPv4/version1").unwrap();
        assert_eq!(
            r.candidates(),
            vec![
                ModuleName::Signed { programmer: q, name: "IPv4".into(), version: "version2".into() },
                ModuleName::Signed { programmer: q, name: "IPv4".into(), version: "version1".into() },
            ]
        );
        assert!(matches!(NameRequest::signed(q, "IPv4"), Err(NameError::NoVersion(_))));
        assert!(matches!(NameRequest::signed(q, "a/1||b/2"), Err(NameError::BadPreferenceList(_))));
        assert!(matches!(NameRequest::local(q, "bad name"), Err(NameError::InvalidName(_))));
        assert_eq!(NameRequest::local(q, "counter").unwrap().candidates().len(), 1);
    }

    #[test]
    fn hex_round_trip() {
        let p = PrincipalId([0xab; 32]);
        assert_eq!(PrincipalId::from_hex(&p.to_hex()), Some(p));
        assert_eq!(PrincipalId::from_hex("zz"), None);
    }
}
