//! Security associations and the authentication header (in the spirit of
//! IPsec AH and ESP, SANE §4.5).
//!
//! A protected datagram, after the outer ANEP header (`P` bytes, written by
//! the caller and covered by the tag):
//!
//! ```text
//!  P        P+4                P+12                    P+12+n       P+12+n+16
//! +--------+------------------+-----------------------+------------+
//! |  SPI   |  counter (64)    | inner ANEP packet (n) |  tag (16)  |
//! +--------+------------------+-----------------------+------------+
//! ```
//!
//! The cipher is AES-256-GCM (ring), the nonce four zero bytes and the
//! counter, big-endian. Keys are per direction, so a (key, nonce) pair is
//! never reused. Authenticate-only mode ([`Mode::Authenticate`]) passes
//! everything as associated data and encrypts nothing (GMAC, like AH);
//! [`Mode::Encrypt`] encrypts the inner packet and authenticates the
//! headers (like ESP). The outer ANEP type id says which, and is itself
//! covered by the tag.

use crate::replay::{REJECT_AFTER_MESSAGES, ReplayError, ReplayWindow};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroize;

/// Bytes between the outer ANEP header and the inner packet.
pub const AH_LEN: usize = 12;
/// Bytes of the tag after the inner packet.
pub const TAG_LEN: usize = 16;
/// All the bytes protection adds, besides the outer ANEP header.
pub const OVERHEAD: usize = AH_LEN + TAG_LEN;

/// Protection of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Authenticate only: the inner packet travels in clear.
    Authenticate,
    /// Encrypt and authenticate.
    Encrypt,
}

impl Mode {
    /// Name used in configs and status.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Authenticate => "authenticate",
            Mode::Encrypt => "encrypt",
        }
    }
}

/// Why a protected datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Reject {
    /// Shorter than the header and tag.
    #[error("truncated authenticated packet")]
    Truncated,
    /// No SA has this SPI.
    #[error("unknown SPI")]
    UnknownSpi,
    /// The SA's lifetime is over.
    #[error("SA expired")]
    Expired,
    /// The counter was seen before.
    #[error("replayed packet")]
    Replay,
    /// The counter is behind the replay window.
    #[error("counter behind the replay window")]
    BeyondWindow,
    /// The tag does not verify.
    #[error("tag mismatch")]
    TagMismatch,
    /// Authenticate-only packet on a link whose policy demands encryption.
    #[error("packet not encrypted but the link requires encryption")]
    ModeTooWeak,
}

/// Why a packet could not be protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// No established SA toward the peer (a handshake is under way).
    #[error("no security association with the peer yet")]
    NoSa,
    /// The buffer does not have room for the header and tag.
    #[error("no room for the authentication header and tag")]
    NoRoom,
}

/// Lifetime limits of SAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Start a new handshake when an SA we initiated is this old (ms).
    pub rekey_after_ms: u64,
    /// Refuse to use an SA this old (ms).
    pub reject_after_ms: u64,
    /// Start a new handshake after sending this many packets on an SA.
    pub rekey_after_packets: u64,
    /// Refuse to send or receive more packets than this on an SA.
    pub reject_after_packets: u64,
    /// How long a replaced SA still accepts packets in flight (ms).
    pub grace_ms: u64,
}

impl Default for Lifetime {
    fn default() -> Self {
        Lifetime {
            rekey_after_ms: 120_000,
            reject_after_ms: 180_000,
            rekey_after_packets: 1 << 60,
            reject_after_packets: REJECT_AFTER_MESSAGES,
            grace_ms: 10_000,
        }
    }
}

/// One security association: both directions with one peer.
pub struct Sa {
    /// Index of the peer in the link table.
    pub peer: usize,
    /// SPI we chose; the peer puts it on packets to us.
    pub in_spi: u32,
    /// SPI the peer chose; we put it on packets to it.
    pub out_spi: u32,
    in_key: LessSafeKey,
    out_key: LessSafeKey,
    /// Next counter to send.
    pub tx_counter: u64,
    /// Counters received.
    pub window: ReplayWindow,
    /// Established at (ms).
    pub created_ms: u64,
    /// No packets in either direction after this (ms).
    pub expire_at_ms: u64,
    /// Whether we initiated the handshake (the initiator rekeys on time).
    pub initiator: bool,
    /// Whether the peer is known to hold the keys (initiator: at once;
    /// responder: after the first packet from the peer on this SA).
    pub confirmed: bool,
    /// Packets accepted.
    pub rx_packets: u64,
    /// Which handshake pattern made it ("IK" or "XX").
    pub pattern: &'static str,
}

impl core::fmt::Debug for Sa {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sa")
            .field("peer", &self.peer)
            .field("in_spi", &format_args!("{:#010x}", self.in_spi))
            .field("out_spi", &format_args!("{:#010x}", self.out_spi))
            .field("tx_counter", &self.tx_counter)
            .field("confirmed", &self.confirmed)
            .finish_non_exhaustive()
    }
}

fn key(k: &[u8; 32]) -> Option<LessSafeKey> {
    // AES-256 takes any 32-byte key: this fails only on a wrong length.
    UnboundKey::new(&AES_256_GCM, k).ok().map(LessSafeKey::new)
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

impl Sa {
    /// A new SA from the handshake's keys (zeroized here after use).
    /// `None` only if the cipher refuses the keys.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        peer: usize,
        in_spi: u32,
        out_spi: u32,
        mut in_key: [u8; 32],
        mut out_key: [u8; 32],
        initiator: bool,
        now_ms: u64,
        life: &Lifetime,
        pattern: &'static str,
    ) -> Option<Sa> {
        let keys = key(&in_key).zip(key(&out_key));
        in_key.zeroize();
        out_key.zeroize();
        let (in_key, out_key) = keys?;
        Some(Sa {
            peer,
            in_spi,
            out_spi,
            in_key,
            out_key,
            tx_counter: 0,
            window: ReplayWindow::new(),
            created_ms: now_ms,
            expire_at_ms: now_ms.saturating_add(life.reject_after_ms),
            initiator,
            confirmed: initiator,
            rx_packets: 0,
            pattern,
        })
    }

    /// Protects `buf[..hdr + AH_LEN + n + TAG_LEN]`: `buf[..hdr]` is the
    /// outer header (already written), the inner packet is at
    /// `hdr + AH_LEN`, `n` bytes long. Fills in SPI, counter and tag (and
    /// encrypts the inner packet in [`Mode::Encrypt`]). Returns the
    /// datagram length.
    pub fn seal(&mut self, buf: &mut [u8], hdr: usize, n: usize, mode: Mode) -> Result<usize, SealError> {
        let total = hdr + AH_LEN + n + TAG_LEN;
        if buf.len() < total {
            return Err(SealError::NoRoom);
        }
        let ctr = self.tx_counter;
        self.tx_counter += 1;
        buf[hdr..hdr + 4].copy_from_slice(&self.out_spi.to_be_bytes());
        buf[hdr + 4..hdr + 12].copy_from_slice(&ctr.to_be_bytes());
        let body = hdr + AH_LEN;
        let (head, rest) = buf.split_at_mut(match mode {
            Mode::Authenticate => body + n,
            Mode::Encrypt => body,
        });
        let tag = match mode {
            Mode::Authenticate => self.out_key.seal_in_place_separate_tag(nonce(ctr), Aad::from(&*head), &mut []),
            Mode::Encrypt => self.out_key.seal_in_place_separate_tag(nonce(ctr), Aad::from(&*head), &mut rest[..n]),
        };
        let Ok(tag) = tag else { return Err(SealError::NoRoom) };
        buf[body + n..total].copy_from_slice(tag.as_ref());
        Ok(total)
    }

    /// Opens a datagram that [`Sa::seal`] made, in place: checks the
    /// replay window, verifies the tag, then commits the counter (check
    /// first, commit second). Returns the inner packet's range.
    pub fn open(
        &mut self,
        buf: &mut [u8],
        hdr: usize,
        mode: Mode,
        now_ms: u64,
    ) -> Result<core::ops::Range<usize>, Reject> {
        let len = buf.len();
        if len < hdr + OVERHEAD {
            return Err(Reject::Truncated);
        }
        if now_ms >= self.expire_at_ms {
            return Err(Reject::Expired);
        }
        let mut c = [0u8; 8];
        c.copy_from_slice(&buf[hdr + 4..hdr + 12]);
        let ctr = u64::from_be_bytes(c);
        self.window.check(ctr).map_err(|e| match e {
            ReplayError::Replayed => Reject::Replay,
            ReplayError::BeyondWindow => Reject::BeyondWindow,
            ReplayError::Exhausted => Reject::Expired,
        })?;
        let body = hdr + AH_LEN;
        let n = len - hdr - OVERHEAD;
        let ok = match mode {
            Mode::Authenticate => {
                let (head, tag) = buf.split_at_mut(body + n);
                self.in_key.open_in_place(nonce(ctr), Aad::from(&*head), tag).is_ok()
            }
            Mode::Encrypt => {
                let (head, rest) = buf.split_at_mut(body);
                self.in_key.open_in_place(nonce(ctr), Aad::from(&*head), rest).is_ok()
            }
        };
        if !ok {
            return Err(Reject::TagMismatch);
        }
        self.window.commit(ctr);
        self.rx_packets += 1;
        self.confirmed = true;
        Ok(body..body + n)
    }
}

/// The SPI of a protected datagram whose outer header is `hdr` bytes.
pub fn spi_of(buf: &[u8], hdr: usize) -> Option<u32> {
    buf.get(hdr..hdr + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pair() -> (Sa, Sa) {
        let life = Lifetime::default();
        let a = Sa::new(0, 1, 2, [1; 32], [2; 32], true, 0, &life, "IK").unwrap();
        let b = Sa::new(0, 2, 1, [2; 32], [1; 32], false, 0, &life, "IK").unwrap();
        (a, b)
    }

    fn datagram(a: &mut Sa, inner: &[u8], mode: Mode) -> Vec<u8> {
        let mut v = vec![0u8; 8 + OVERHEAD + inner.len()];
        v[..8].copy_from_slice(b"ANEPHDR!");
        v[8 + AH_LEN..8 + AH_LEN + inner.len()].copy_from_slice(inner);
        let n = a.seal(&mut v, 8, inner.len(), mode).unwrap();
        assert_eq!(n, v.len());
        v
    }

    #[test]
    fn seal_open_both_modes() {
        let (mut a, mut b) = pair();
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut d = datagram(&mut a, b"hello world", mode);
            assert_eq!(d[20..31] == *b"hello world", mode == Mode::Authenticate);
            let r = b.open(&mut d, 8, mode, 1).unwrap();
            assert_eq!(&d[r], b"hello world");
        }
    }

    #[test]
    fn tampering_anywhere_is_caught() {
        let (mut a, mut b) = pair();
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let d = datagram(&mut a, b"payload bytes", mode);
            for i in 0..d.len() {
                if (8..12).contains(&i) {
                    continue; // the SPI picks the SA; see the node tests
                }
                let mut t = d.clone();
                t[i] ^= 0x40;
                assert!(b.open(&mut t, 8, mode, 1).is_err(), "byte {i} {mode:?}");
            }
            let mut ok = d.clone();
            assert!(b.open(&mut ok, 8, mode, 1).is_ok());
        }
    }

    #[test]
    fn truncated_replayed_and_mode_confusion() {
        let (mut a, mut b) = pair();
        let d = datagram(&mut a, b"x", Mode::Authenticate);
        assert_eq!(b.open(&mut d.clone()[..20], 8, Mode::Authenticate, 1), Err(Reject::Truncated));
        assert!(b.open(&mut d.clone(), 8, Mode::Authenticate, 1).is_ok());
        assert_eq!(b.open(&mut d.clone(), 8, Mode::Authenticate, 1), Err(Reject::Replay));
        // Opening an AH packet as ESP fails the tag, and vice versa.
        let d = datagram(&mut a, b"abc", Mode::Authenticate);
        assert_eq!(b.open(&mut d.clone(), 8, Mode::Encrypt, 1), Err(Reject::TagMismatch));
        // A failed tag does not consume the counter.
        assert!(b.open(&mut d.clone(), 8, Mode::Authenticate, 1).is_ok());
        let d = datagram(&mut a, b"late", Mode::Authenticate);
        assert_eq!(b.open(&mut d.clone(), 8, Mode::Authenticate, 200_000), Err(Reject::Expired));
    }
}
