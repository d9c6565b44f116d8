//! The capsule wire format: capsules (code or its hash, entry name,
//! credential, data) and the demand-loading messages that fetch code by hash
//! from the previous hop (ANTS-style). All integers are big-endian.
//!
//! ```text
//! every message: 0 version = 1 | 1 kind
//!
//! kind 1, capsule (44-byte header, then the variable parts in this order):
//!   2  flags       bit 0: code carried; other bits must be 0
//!   3  entry_len   1..=32, entry name from [A-Za-z0-9._-]
//!   4  cred_len    u16, 0..=4096 (0: no credential)
//!   6  data_len    u16, 0..=8192
//!   8  code_len    u32, 0 unless code carried; then 1..=max module size
//!   12 hash        32 bytes, SHA-256 of the code
//!   44 entry | credential | data | code
//!
//! kind 2, code request:  2 hash (32)                    total 34 bytes
//! kind 3, code reply:    2 code_len u32 | 6 hash (32) | 38 code
//! ```
//!
//! A message must be exactly as long as its lengths say; anything else is
//! refused. When code is carried its SHA-256 must equal `hash`.

use anode_cred::ModuleHash;

/// Wire version.
pub const VERSION: u8 = 1;
/// Kind byte of a capsule.
pub const KIND_CAPSULE: u8 = 1;
/// Kind byte of a code request.
pub const KIND_CODE_REQUEST: u8 = 2;
/// Kind byte of a code reply.
pub const KIND_CODE_REPLY: u8 = 3;
/// Capsule header length.
pub const CAPSULE_HEADER: usize = 44;
/// Longest entry name.
pub const MAX_ENTRY: usize = 32;
/// Longest credential.
pub const MAX_CRED: usize = anode_cred::credential::MAX_CREDENTIAL;
/// Longest capsule data.
pub const MAX_DATA: usize = 8192;
/// Largest code a message may carry (the sandbox may set a lower limit).
pub const MAX_CODE: usize = 1 << 20;
/// Bytes of a code reply before its code: version, kind, code length, hash.
pub const CODE_REPLY_HEADER: usize = 2 + 4 + 32;

/// Capsule format errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its header or its lengths say.
    #[error("capsule message truncated: {len} bytes, needs {need}")]
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Longer than its lengths say.
    #[error("capsule message has {0} trailing bytes")]
    Trailing(usize),
    /// Unknown version.
    #[error("unknown capsule version {0}")]
    Version(u8),
    /// Unknown kind.
    #[error("unknown capsule message kind {0}")]
    Kind(u8),
    /// Reserved flag bits set.
    #[error("reserved capsule flags set: {0:#04x}")]
    Flags(u8),
    /// A length is out of range.
    #[error("capsule {field} length {len} out of range (max {max})")]
    Length {
        /// Which field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The entry name has a bad character.
    #[error("invalid entry name {0:?}")]
    EntryName(String),
}

/// A parsed capsule, borrowing the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capsule<'a> {
    /// Name of the entry to call.
    pub entry: &'a str,
    /// The credential (empty: none).
    pub credential: &'a [u8],
    /// Data for the entry.
    pub data: &'a [u8],
    /// The code, when carried.
    pub code: Option<&'a [u8]>,
    /// SHA-256 of the code.
    pub hash: ModuleHash,
}

/// A parsed capsule-protocol message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// An active packet.
    Capsule(Capsule<'a>),
    /// "Send me the code with this hash."
    CodeRequest(ModuleHash),
    /// The code with this hash (not yet verified).
    CodeReply {
        /// The hash claimed.
        hash: ModuleHash,
        /// The code.
        code: &'a [u8],
    },
}

fn be16(b: &[u8]) -> usize {
    u16::from_be_bytes([b[0], b[1]]) as usize
}
fn be32(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}
fn hash_at(b: &[u8]) -> ModuleHash {
    let mut h = [0u8; 32];
    h.copy_from_slice(&b[..32]);
    ModuleHash(h)
}
fn need(b: &[u8], n: usize) -> Result<(), WireError> {
    if b.len() < n { Err(WireError::Truncated { len: b.len(), need: n }) } else { Ok(()) }
}
fn exact(b: &[u8], n: usize) -> Result<(), WireError> {
    need(b, n)?;
    if b.len() > n { Err(WireError::Trailing(b.len() - n)) } else { Ok(()) }
}

/// Whether `s` is a valid entry name.
pub fn valid_entry(s: &str) -> bool {
    anode_cred::naming::valid_ident(s, MAX_ENTRY)
}

impl<'a> Message<'a> {
    /// Parses one message.
    pub fn parse(b: &'a [u8]) -> Result<Message<'a>, WireError> {
        need(b, 2)?;
        if b[0] != VERSION {
            return Err(WireError::Version(b[0]));
        }
        match b[1] {
            KIND_CAPSULE => Capsule::parse(b).map(Message::Capsule),
            KIND_CODE_REQUEST => {
                exact(b, 34)?;
                Ok(Message::CodeRequest(hash_at(&b[2..])))
            }
            KIND_CODE_REPLY => {
                need(b, CODE_REPLY_HEADER)?;
                let len = be32(&b[2..]);
                if len == 0 || len > MAX_CODE {
                    return Err(WireError::Length { field: "code", len, max: MAX_CODE });
                }
                exact(b, CODE_REPLY_HEADER + len)?;
                Ok(Message::CodeReply { hash: hash_at(&b[6..]), code: &b[CODE_REPLY_HEADER..] })
            }
            k => Err(WireError::Kind(k)),
        }
    }
}

impl<'a> Capsule<'a> {
    fn parse(b: &'a [u8]) -> Result<Capsule<'a>, WireError> {
        need(b, CAPSULE_HEADER)?;
        let flags = b[2];
        if flags & !1 != 0 {
            return Err(WireError::Flags(flags));
        }
        let entry_len = b[3] as usize;
        let cred_len = be16(&b[4..]);
        let data_len = be16(&b[6..]);
        let code_len = be32(&b[8..]);
        let carried = flags & 1 != 0;
        if entry_len == 0 || entry_len > MAX_ENTRY {
            return Err(WireError::Length { field: "entry", len: entry_len, max: MAX_ENTRY });
        }
        if cred_len > MAX_CRED {
            return Err(WireError::Length { field: "credential", len: cred_len, max: MAX_CRED });
        }
        if data_len > MAX_DATA {
            return Err(WireError::Length { field: "data", len: data_len, max: MAX_DATA });
        }
        if (carried && (code_len == 0 || code_len > MAX_CODE)) || (!carried && code_len != 0) {
            return Err(WireError::Length { field: "code", len: code_len, max: if carried { MAX_CODE } else { 0 } });
        }
        exact(b, CAPSULE_HEADER + entry_len + cred_len + data_len + code_len)?;
        let hash = hash_at(&b[12..]);
        let mut p = CAPSULE_HEADER;
        let entry_b = &b[p..p + entry_len];
        p += entry_len;
        let entry = core::str::from_utf8(entry_b)
            .ok()
            .filter(|e| valid_entry(e))
            .ok_or_else(|| WireError::EntryName(String::from_utf8_lossy(entry_b).into_owned()))?;
        let credential = &b[p..p + cred_len];
        p += cred_len;
        let data = &b[p..p + data_len];
        p += data_len;
        let code = carried.then(|| &b[p..p + code_len]);
        Ok(Capsule { entry, credential, data, code, hash })
    }

    /// Encodes this capsule into `out` (cleared first). The hash is written
    /// as given; use [`ModuleHash::of`] on the code.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        out.clear();
        if !valid_entry(self.entry) {
            return Err(WireError::EntryName(self.entry.into()));
        }
        if self.credential.len() > MAX_CRED {
            return Err(WireError::Length { field: "credential", len: self.credential.len(), max: MAX_CRED });
        }
        if self.data.len() > MAX_DATA {
            return Err(WireError::Length { field: "data", len: self.data.len(), max: MAX_DATA });
        }
        let code = self.code.unwrap_or(&[]);
        if code.len() > MAX_CODE || (self.code.is_some() && code.is_empty()) {
            return Err(WireError::Length { field: "code", len: code.len(), max: MAX_CODE });
        }
        out.reserve(CAPSULE_HEADER + self.entry.len() + self.credential.len() + self.data.len() + code.len());
        out.extend_from_slice(&[VERSION, KIND_CAPSULE, self.code.is_some() as u8, self.entry.len() as u8]);
        out.extend_from_slice(&(self.credential.len() as u16).to_be_bytes());
        out.extend_from_slice(&(self.data.len() as u16).to_be_bytes());
        out.extend_from_slice(&(code.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.hash.0);
        out.extend_from_slice(self.entry.as_bytes());
        out.extend_from_slice(self.credential);
        out.extend_from_slice(self.data);
        out.extend_from_slice(code);
        Ok(())
    }
}

/// Encodes a code request.
pub fn encode_code_request(hash: &ModuleHash, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[VERSION, KIND_CODE_REQUEST]);
    out.extend_from_slice(&hash.0);
}

/// Encodes a code reply.
pub fn encode_code_reply(hash: &ModuleHash, code: &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
    out.clear();
    if code.is_empty() || code.len() > MAX_CODE {
        return Err(WireError::Length { field: "code", len: code.len(), max: MAX_CODE });
    }
    out.extend_from_slice(&[VERSION, KIND_CODE_REPLY]);
    out.extend_from_slice(&(code.len() as u32).to_be_bytes());
    out.extend_from_slice(&hash.0);
    out.extend_from_slice(code);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn capsule_round_trips_both_modes() {
        let code = b"\0asm\x01\0\0\0";
        let mut out = Vec::new();
        for carried in [false, true] {
            let c = Capsule {
                entry: "ping",
                credential: b"cred",
                data: b"data",
                code: carried.then_some(&code[..]),
                hash: ModuleHash::of(code),
            };
            c.encode(&mut out).unwrap();
            assert_eq!(Message::parse(&out).unwrap(), Message::Capsule(c));
            // Every truncation and an extra byte are refused.
            for n in 0..out.len() {
                assert!(Message::parse(&out[..n]).is_err(), "prefix {n}");
            }
            out.push(0);
            assert_eq!(Message::parse(&out), Err(WireError::Trailing(1)));
        }
    }

    #[test]
    fn fetch_messages_round_trip() {
        let h = ModuleHash([3; 32]);
        let mut out = Vec::new();
        encode_code_request(&h, &mut out);
        assert_eq!(Message::parse(&out).unwrap(), Message::CodeRequest(h));
        encode_code_reply(&h, b"xyz", &mut out).unwrap();
        assert_eq!(Message::parse(&out).unwrap(), Message::CodeReply { hash: h, code: b"xyz" });
    }

    #[test]
    fn bad_fields_are_refused() {
        let mut out = Vec::new();
        let c = Capsule { entry: "ping", credential: b"", data: b"", code: None, hash: ModuleHash([0; 32]) };
        c.encode(&mut out).unwrap();
        let mut b = out.clone();
        b[0] = 2;
        assert_eq!(Message::parse(&b), Err(WireError::Version(2)));
        let mut b = out.clone();
        b[1] = 9;
        assert_eq!(Message::parse(&b), Err(WireError::Kind(9)));
        let mut b = out.clone();
        b[2] = 2;
        assert_eq!(Message::parse(&b), Err(WireError::Flags(2)));
        let mut b = out.clone();
        b[44] = b' ';
        assert!(matches!(Message::parse(&b), Err(WireError::EntryName(_))));
        let mut b = out.clone();
        b[11] = 1; // code length without the carried flag
        assert!(matches!(Message::parse(&b), Err(WireError::Length { field: "code", .. })));
        let bad = Capsule { entry: "bad name", ..c };
        assert!(bad.encode(&mut out).is_err());
    }
}
