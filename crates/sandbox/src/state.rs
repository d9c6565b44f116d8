//! Soft state: a bounded per-principal key/value store with optional expiry.

use std::collections::HashMap;

/// Longest key.
pub const MAX_KEY: usize = 64;
/// Longest value.
pub const MAX_VALUE: usize = 1024;

/// One principal's soft state, bounded in bytes (keys plus values) and entries.
#[derive(Debug)]
pub struct SoftState {
    map: HashMap<Vec<u8>, (Vec<u8>, Option<u64>)>,
    bytes: usize,
    cap_bytes: usize,
    cap_entries: usize,
}

impl SoftState {
    /// An empty store of at most `cap_bytes` and `cap_entries`.
    pub fn new(cap_bytes: usize, cap_entries: usize) -> SoftState {
        SoftState { map: HashMap::new(), bytes: 0, cap_bytes, cap_entries }
    }

    /// Bytes in use.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries in use.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Changes the byte cap (entries above it stay until removed or expired).
    pub fn set_cap(&mut self, cap_bytes: usize) {
        self.cap_bytes = cap_bytes;
    }

    fn purge(&mut self, now: u64) {
        let mut freed = 0;
        self.map.retain(|k, (v, exp)| {
            let keep = exp.is_none_or(|e| e > now);
            if !keep {
                freed += k.len() + v.len();
            }
            keep
        });
        self.bytes -= freed;
    }

    /// Stores `key = value`; `false` (and no change) if it would not fit.
    pub fn put(&mut self, now: u64, key: Vec<u8>, value: Vec<u8>, expires: Option<u64>) -> bool {
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return false;
        }
        let old = self.map.get(&key).map_or(0, |(v, _)| key.len() + v.len());
        let new = key.len() + value.len();
        let fits = |s: &SoftState| s.bytes - old + new <= s.cap_bytes && (old > 0 || s.map.len() < s.cap_entries);
        if !fits(self) {
            self.purge(now);
            let old2 = self.map.get(&key).map_or(0, |(v, _)| key.len() + v.len());
            if self.bytes - old2 + new > self.cap_bytes || (old2 == 0 && self.map.len() >= self.cap_entries) {
                return false;
            }
        }
        if let Some((v, _)) = self.map.get(&key) {
            self.bytes -= key.len() + v.len();
        }
        self.bytes += new;
        self.map.insert(key, (value, expires));
        true
    }

    /// The live value of `key`.
    pub fn get(&mut self, now: u64, key: &[u8]) -> Option<&[u8]> {
        let expired = matches!(self.map.get(key), Some((_, Some(e))) if *e <= now);
        if expired {
            self.remove(key);
            return None;
        }
        self.map.get(key).map(|(v, _)| v.as_slice())
    }

    /// Removes `key`; whether it was present.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove_entry(key) {
            Some((k, (v, _))) => {
                self.bytes -= k.len() + v.len();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bounded_in_bytes_and_entries_with_expiry() {
        let mut s = SoftState::new(10, 2);
        assert!(s.put(0, b"a".to_vec(), b"1234".to_vec(), None));
        assert!(s.put(0, b"b".to_vec(), b"1234".to_vec(), Some(5)));
        assert!(!s.put(0, b"c".to_vec(), b"1".to_vec(), None), "entry cap");
        assert!(!s.put(0, b"a".to_vec(), b"123456".to_vec(), None), "byte cap");
        assert_eq!(s.get(0, b"a"), Some(&b"1234"[..]));
        assert_eq!(s.get(5, b"b"), None, "expired");
        assert!(s.put(6, b"c".to_vec(), b"1".to_vec(), None));
        assert_eq!(s.bytes(), 7);
        assert!(s.remove(b"a"));
        assert_eq!(s.bytes(), 2);
    }
}
