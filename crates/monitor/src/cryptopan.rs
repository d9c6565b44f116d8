//! Prefix-preserving address anonymization: Crypto-PAn (J. Xu, J. Fan,
//! M. Ammar, S. Moon, "Prefix-preserving IP address anonymization", ICNP
//! 2002), with AES-128 from the RustCrypto `aes` crate.
//!
//! The 32-byte key splits in two: the first 16 bytes are the AES key, and
//! the AES encryption of the second 16 bytes is the *pad*. Bit `i` of the
//! anonymized address is bit `i` of the original XOR the first bit of
//! `AES(original bits 0..i ‖ pad bits i..128)`, so two addresses sharing a
//! `k`-bit prefix map to addresses sharing a `k`-bit prefix, and nothing else
//! is revealed. IPv4 uses the first 32 bits of the block (the reference
//! implementation); IPv6 the whole 128 (as the Go and Python ports do).
//! `tests/cryptopan.rs` reproduces the reference distribution's sample
//! trace (`sample_trace_raw` → `sample_trace_sanitized`) exactly.
//!
//! # Key handling
//!
//! The key is zeroized when the anonymizer is dropped (the AES key schedule
//! too: `aes`'s `zeroize` feature). Key files hold one line,
//! `anode-cryptopan-v1 <64 hex digits>`, and must not be readable by group
//! or others (checked by the CLI). Traces anonymized under one key stay
//! comparable with each other, prefix by prefix; rotating the key (a new file
//! and a restart of the monitor, or [`Anonymizer::rotate`]) breaks that
//! linkage on purpose, so rotate whenever traces go to a new recipient.
//! [`CryptoPan::key_id`] (8 bytes of SHA-256 of the key, never the key)
//! names the key in exports so that recipients know which traces they may
//! compare.

use aes::Aes128;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use zeroize::{Zeroize, Zeroizing};

/// A Crypto-PAn instance for one key.
#[derive(Clone)]
pub struct CryptoPan {
    aes: Aes128,
    pad: [u8; 16],
    id: [u8; 8],
}

impl std::fmt::Debug for CryptoPan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CryptoPan(key id {})", self.key_id_hex())
    }
}

impl Drop for CryptoPan {
    fn drop(&mut self) {
        self.pad.zeroize();
    }
}

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not `anode-cryptopan-v1 <64 hex digits>`.
    #[error("not a Crypto-PAn key: expected one line `anode-cryptopan-v1 <64 hex digits>`")]
    Format,
}

/// The key file's first word.
pub const KEY_TAG: &str = "anode-cryptopan-v1";

impl CryptoPan {
    /// An instance for a 32-byte key.
    pub fn new(key: &[u8; 32]) -> CryptoPan {
        let aes = Aes128::new(GenericArray::from_slice(&key[..16]));
        let mut block = GenericArray::clone_from_slice(&key[16..]);
        aes.encrypt_block(&mut block);
        let mut pad = [0u8; 16];
        pad.copy_from_slice(&block);
        block.as_mut_slice().zeroize();
        let digest = <sha2::Sha256 as sha2::Digest>::digest(key);
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        CryptoPan { aes, pad, id }
    }

    /// Parses a key file's text.
    ///
    /// # Errors
    /// [`KeyError::Format`].
    pub fn from_key_text(text: &str) -> Result<CryptoPan, KeyError> {
        let mut it = text.split_whitespace();
        if it.next() != Some(KEY_TAG) {
            return Err(KeyError::Format);
        }
        let hex = it.next().ok_or(KeyError::Format)?;
        if it.next().is_some() || hex.len() != 64 {
            return Err(KeyError::Format);
        }
        let mut key = Zeroizing::new([0u8; 32]);
        for (i, k) in key.iter_mut().enumerate() {
            *k = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or(KeyError::Format)?, 16)
                .map_err(|_| KeyError::Format)?;
        }
        Ok(CryptoPan::new(&key))
    }

    /// The text of a key file for `key`.
    pub fn key_text(key: &[u8; 32]) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::from(KEY_TAG));
        s.push(' ');
        for b in key {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }

    /// 8 bytes of SHA-256 of the key: names the key, reveals nothing of it.
    pub fn key_id(&self) -> [u8; 8] {
        self.id
    }

    /// [`CryptoPan::key_id`] in hex.
    pub fn key_id_hex(&self) -> String {
        self.id.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn first_bit(&self, block: [u8; 16]) -> u8 {
        let mut b = GenericArray::from(block);
        self.aes.encrypt_block(&mut b);
        b[0] >> 7
    }

    /// Anonymizes an IPv4 address (as a big-endian `u32`).
    pub fn anonymize_v4(&self, orig: u32) -> u32 {
        let pad4 = u32::from_be_bytes([self.pad[0], self.pad[1], self.pad[2], self.pad[3]]);
        let mut input = self.pad;
        let mut result = 0u32;
        for pos in 0..32u32 {
            let prefix = orig.checked_shr(32 - pos).and_then(|x| x.checked_shl(32 - pos)).unwrap_or(0);
            let keep = u32::MAX.checked_shr(pos).unwrap_or(0);
            input[..4].copy_from_slice(&(prefix | (pad4 & keep)).to_be_bytes());
            result |= u32::from(self.first_bit(input)) << (31 - pos);
        }
        result ^ orig
    }

    /// Anonymizes an IPv6 address (as a big-endian `u128`).
    pub fn anonymize_v6(&self, orig: u128) -> u128 {
        let pad = u128::from_be_bytes(self.pad);
        let mut result = 0u128;
        for pos in 0..128u32 {
            let prefix = orig.checked_shr(128 - pos).and_then(|x| x.checked_shl(128 - pos)).unwrap_or(0);
            let keep = u128::MAX.checked_shr(pos).unwrap_or(0);
            result |= u128::from(self.first_bit((prefix | (pad & keep)).to_be_bytes())) << (127 - pos);
        }
        result ^ orig
    }

    /// Anonymizes an address of 4 or 16 bytes in place (other lengths are left alone).
    pub fn anonymize_bytes(&self, a: &mut [u8]) {
        if let Ok(b) = <[u8; 4]>::try_from(&*a) {
            a.copy_from_slice(&self.anonymize_v4(u32::from_be_bytes(b)).to_be_bytes());
        } else if let Ok(b) = <[u8; 16]>::try_from(&*a) {
            a.copy_from_slice(&self.anonymize_v6(u128::from_be_bytes(b)).to_be_bytes());
        }
    }
}

const V4_CACHE: usize = 1 << 16;
const V6_CACHE: usize = 1 << 12;

/// Crypto-PAn with a direct-mapped cache of recent mappings: an IPv4 address
/// costs 32 AES blocks, so the monitor remembers the last mapping per slot
/// ([`V4_CACHE`](self) slots for IPv4, fewer for IPv6).
#[derive(Debug, Clone)]
pub struct Anonymizer {
    pan: CryptoPan,
    v4: Vec<(u32, u32, bool)>,
    v6: Vec<(u128, u128, bool)>,
    /// Cache hits.
    pub hits: u64,
    /// Cache misses (each costs 32 or 128 AES blocks).
    pub misses: u64,
}

impl Anonymizer {
    /// A cached anonymizer.
    pub fn new(pan: CryptoPan) -> Anonymizer {
        Anonymizer { pan, v4: vec![(0, 0, false); V4_CACHE], v6: vec![(0, 0, false); V6_CACHE], hits: 0, misses: 0 }
    }
    /// The key's id.
    pub fn key_id_hex(&self) -> String {
        self.pan.key_id_hex()
    }
    /// Replaces the key and forgets every cached mapping.
    pub fn rotate(&mut self, pan: CryptoPan) {
        self.pan = pan;
        self.v4.iter_mut().for_each(|e| *e = (0, 0, false));
        self.v6.iter_mut().for_each(|e| *e = (0, 0, false));
    }
    /// Anonymizes an IPv4 address.
    pub fn v4(&mut self, a: u32) -> u32 {
        let slot = (anode_monitor_apps::hash::fmix64(u64::from(a)) as usize) & (V4_CACHE - 1);
        match self.v4.get_mut(slot) {
            Some(e) if e.2 && e.0 == a => {
                self.hits += 1;
                e.1
            }
            Some(e) => {
                self.misses += 1;
                let r = self.pan.anonymize_v4(a);
                *e = (a, r, true);
                r
            }
            None => self.pan.anonymize_v4(a),
        }
    }
    /// Anonymizes an IPv6 address.
    pub fn v6(&mut self, a: u128) -> u128 {
        let slot = (anode_monitor_apps::hash::fmix64((a as u64) ^ ((a >> 64) as u64)) as usize) & (V6_CACHE - 1);
        match self.v6.get_mut(slot) {
            Some(e) if e.2 && e.0 == a => {
                self.hits += 1;
                e.1
            }
            Some(e) => {
                self.misses += 1;
                let r = self.pan.anonymize_v6(a);
                *e = (a, r, true);
                r
            }
            None => self.pan.anonymize_v6(a),
        }
    }
    /// Anonymizes 4 or 16 address bytes in place.
    pub fn bytes(&mut self, a: &mut [u8]) {
        if let Ok(b) = <[u8; 4]>::try_from(&*a) {
            let r = self.v4(u32::from_be_bytes(b));
            a.copy_from_slice(&r.to_be_bytes());
        } else if let Ok(b) = <[u8; 16]>::try_from(&*a) {
            let r = self.v6(u128::from_be_bytes(b));
            a.copy_from_slice(&r.to_be_bytes());
        }
    }
}
