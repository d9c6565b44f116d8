//! A seeded 64-bit hash for sampling decisions and table slots.
//!
//! Not cryptographic: trajectory sampling needs a hash that every monitor
//! computes identically and whose output is close to uniform on real
//! header bytes. Words are folded with 64-bit multiplies and xor-shifts
//! (no 128-bit multiply: wasm32 has none, and emulating it costs more than
//! the rest of a packet's work) and the result goes through MurmurHash3's
//! 64-bit finalizer.

const K0: u64 = 0x9E37_79B9_7F4A_7C15;
const K1: u64 = 0xBF58_476D_1CE4_E5B9;

fn mix(a: u64, b: u64) -> u64 {
    let x = a.wrapping_mul(b | 1);
    x ^ (x >> 29)
}

/// MurmurHash3's 64-bit finalizer.
pub fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// An incremental hasher.
#[derive(Debug, Clone, Copy)]
pub struct Hasher {
    h: u64,
    n: u64,
}

impl Hasher {
    /// A hasher with `seed`.
    pub fn new(seed: u64) -> Hasher {
        Hasher { h: seed ^ K0, n: 0 }
    }
    /// Feeds one 64-bit word.
    pub fn word(&mut self, w: u64) -> &mut Self {
        self.h = mix(self.h ^ w, K1 ^ self.n.wrapping_mul(K0));
        self.n = self.n.wrapping_add(1);
        self
    }
    /// Feeds bytes (length included, so "ab","c" and "a","bc" differ).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        self.word(u64::from_le_bytes(w) ^ ((b.len() as u64) << 56))
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        fmix64(self.h ^ self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sensitive() {
        let a = Hasher::new(1).bytes(b"hello").finish();
        assert_eq!(a, Hasher::new(1).bytes(b"hello").finish());
        assert_ne!(a, Hasher::new(2).bytes(b"hello").finish());
        assert_ne!(a, Hasher::new(1).bytes(b"hellp").finish());
        assert_ne!(Hasher::new(1).bytes(b"ab").bytes(b"c").finish(), Hasher::new(1).bytes(b"a").bytes(b"bc").finish());
    }

    #[test]
    fn top_bits_are_close_to_uniform_on_sequential_inputs() {
        // 4096 consecutive IPv4 identifiers: the share below 1/8 of the range is ~1/8.
        let mut below = 0;
        for id in 0u64..4096 {
            if Hasher::new(7).word(0x0a00_0001).word(id).finish() < u64::MAX / 8 {
                below += 1;
            }
        }
        assert!((400..=630).contains(&below), "{below}");
    }
}
