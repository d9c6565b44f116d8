//! Active Network Encapsulation Protocol (ANEP) framing.
//!
//! Every datagram between anode nodes starts with an ANEP header (Alexander
//! et al., "Active Network Encapsulation Protocol", 1997):
//!
//! ```text
//!  0        1        2                 4                 6                 8
//! +--------+--------+-----------------+-----------------+-----------------+
//! | version| flags  |     type id     |  header length  |  packet length  |
//! +--------+--------+-----------------+-----------------+-----------------+
//! | options (header length × 4 − 8 bytes)  ...                            |
//! +-----------------------------------------------------------------------+
//! | payload (packet length − header length × 4 bytes)                      |
//! ```
//!
//! All fields are big-endian. `header length` counts 32-bit words, options
//! included (minimum 2). `packet length` counts bytes, header included, and
//! must equal the datagram's length. Options are TLVs: a 16-bit type whose
//! top bit says "discard the packet if you do not know this option", a
//! 16-bit length in 32-bit words including the 4-byte option header, then
//! the option data. This node knows no options yet: it skips unknown ones
//! unless their discard bit is set.
//!
//! Flag bit 7 (`0x80`, [`FLAG_DISCARD_UNKNOWN`]) says what a node that does
//! not know the type id does: set, it discards the packet; clear, it passes
//! it on toward the default next hop ("forward if unknown").
//!
//! Type ids used by anode (the experimental range, documented in
//! `docs/node.md`): [`TYPE_SNAP`], [`TYPE_PLAIN`], and reserved for later
//! issues [`TYPE_CAPSULE`], [`TYPE_CONTROL`]; and for SANE [`TYPE_AUTH`],
//! [`TYPE_ESP`], [`TYPE_HANDSHAKE`].

/// ANEP version this node speaks.
pub const VERSION: u8 = 1;
/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 8;
/// Flag: discard the packet if its type id is unknown (else pass it on).
pub const FLAG_DISCARD_UNKNOWN: u8 = 0x80;
/// Option-type bit: discard the packet if the option is unknown.
pub const OPT_DISCARD_UNKNOWN: u16 = 0x8000;

/// A SNAP active packet (`docs/snap.md`).
pub const TYPE_SNAP: u16 = 0xA001;
/// A plain packet forwarded by destination address only, without the VM:
/// the baseline "IP router" path (see [`crate::plain`]).
pub const TYPE_PLAIN: u16 = 0xA002;
/// Reserved: module capsule (issue 7).
pub const TYPE_CAPSULE: u16 = 0xA003;
/// Reserved: control message (issue 7).
pub const TYPE_CONTROL: u16 = 0xA004;
/// An authenticated (not encrypted) datagram: SPI, counter, inner ANEP
/// datagram, tag (`docs/security.md`).
pub const TYPE_AUTH: u16 = 0xA005;
/// A key-establishment handshake message (Noise IK or XX).
pub const TYPE_HANDSHAKE: u16 = 0xA006;
/// An encrypted and authenticated datagram: like [`TYPE_AUTH`] with the
/// inner datagram encrypted.
pub const TYPE_ESP: u16 = 0xA007;

/// Why an ANEP datagram was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnepError {
    /// Shorter than the fixed header.
    #[error("truncated ANEP header: {0} bytes")]
    Truncated(usize),
    /// Unknown version.
    #[error("unknown ANEP version {0}")]
    BadVersion(u8),
    /// Header length below 2 words or beyond the datagram.
    #[error("bad ANEP header length {words} words for a {len}-byte datagram")]
    BadHeaderLength {
        /// Declared header length in words.
        words: u16,
        /// Datagram length.
        len: usize,
    },
    /// Packet length differs from the datagram length.
    #[error("ANEP packet length {declared} but datagram is {len} bytes")]
    BadPacketLength {
        /// Declared packet length.
        declared: u16,
        /// Datagram length.
        len: usize,
    },
    /// A malformed option.
    #[error("malformed ANEP option at byte {0}")]
    BadOption(usize),
    /// An unknown option whose discard bit is set.
    #[error("unknown ANEP option {0:#06x} with the discard bit set")]
    UnknownOption(u16),
}

/// A checked ANEP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anep {
    /// Flags byte.
    pub flags: u8,
    /// Type id.
    pub type_id: u16,
    /// Byte offset of the payload.
    pub payload_start: usize,
    /// Datagram length (= packet length).
    pub len: usize,
}

impl Anep {
    /// Checks an ANEP datagram: version, lengths and options.
    pub fn parse(b: &[u8]) -> Result<Anep, AnepError> {
        let len = b.len();
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(AnepError::Truncated(len));
        };
        if h[0] != VERSION {
            return Err(AnepError::BadVersion(h[0]));
        }
        let words = u16::from_be_bytes([h[4], h[5]]);
        let declared = u16::from_be_bytes([h[6], h[7]]);
        let hlen = words as usize * 4;
        if words < 2 || hlen > len {
            return Err(AnepError::BadHeaderLength { words, len });
        }
        if declared as usize != len {
            return Err(AnepError::BadPacketLength { declared, len });
        }
        let mut at = HEADER_LEN;
        while at < hlen {
            let Some(o) = b.get(at..at + 4) else { return Err(AnepError::BadOption(at)) };
            let ty = u16::from_be_bytes([o[0], o[1]]);
            let olen = u16::from_be_bytes([o[2], o[3]]) as usize * 4;
            if olen < 4 || at + olen > hlen {
                return Err(AnepError::BadOption(at));
            }
            if ty & OPT_DISCARD_UNKNOWN != 0 {
                return Err(AnepError::UnknownOption(ty));
            }
            at += olen;
        }
        Ok(Anep { flags: h[1], type_id: u16::from_be_bytes([h[2], h[3]]), payload_start: hlen, len })
    }

    /// Whether an unknown type id should be discarded rather than passed on.
    pub fn discard_if_unknown(&self) -> bool {
        self.flags & FLAG_DISCARD_UNKNOWN != 0
    }
}

/// Writes a fixed 8-byte ANEP header (no options) for a payload of
/// `payload_len` bytes into `buf[..8]`.
///
/// # Panics
/// If `buf` is shorter than 8 bytes or the total exceeds 65535 bytes; callers
/// size both (the node's MTU is far below).
pub fn write_header(buf: &mut [u8], flags: u8, type_id: u16, payload_len: usize) {
    let total = (HEADER_LEN + payload_len).min(u16::MAX as usize) as u16;
    buf[0] = VERSION;
    buf[1] = flags;
    buf[2..4].copy_from_slice(&type_id.to_be_bytes());
    buf[4..6].copy_from_slice(&2u16.to_be_bytes());
    buf[6..8].copy_from_slice(&total.to_be_bytes());
}

/// Builds a whole datagram: header then payload.
pub fn frame(flags: u8, type_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0; HEADER_LEN + payload.len()];
    write_header(&mut v, flags, type_id, payload.len());
    v[HEADER_LEN..].copy_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let d = frame(FLAG_DISCARD_UNKNOWN, TYPE_SNAP, b"abcd");
        assert_eq!(d, [1, 0x80, 0xA0, 0x01, 0, 2, 0, 12, b'a', b'b', b'c', b'd']);
        let a = Anep::parse(&d).expect("valid");
        assert_eq!(a.type_id, TYPE_SNAP);
        assert_eq!(a.payload_start, 8);
        assert!(a.discard_if_unknown());
    }

    #[test]
    fn options_are_skipped_or_rejected() {
        // header 4 words: one 2-word option of type 7 (skippable)
        let mut d = vec![1, 0, 0xA0, 0x01, 0, 4, 0, 18, 0, 7, 0, 2, 9, 9, 9, 9, b'x', b'y'];
        assert_eq!(Anep::parse(&d).map(|a| a.payload_start), Ok(16));
        d[8] = 0x80; // discard bit
        assert_eq!(Anep::parse(&d), Err(AnepError::UnknownOption(0x8007)));
        d[8] = 0;
        d[11] = 0; // zero-length option
        assert_eq!(Anep::parse(&d), Err(AnepError::BadOption(8)));
        d[11] = 3; // overruns the header
        assert_eq!(Anep::parse(&d), Err(AnepError::BadOption(8)));
    }

    #[test]
    fn rejections() {
        assert_eq!(Anep::parse(&[1, 0, 0]), Err(AnepError::Truncated(3)));
        assert_eq!(Anep::parse(&[2, 0, 0, 0, 0, 2, 0, 8]), Err(AnepError::BadVersion(2)));
        assert_eq!(Anep::parse(&[1, 0, 0, 0, 0, 1, 0, 8]), Err(AnepError::BadHeaderLength { words: 1, len: 8 }));
        assert_eq!(Anep::parse(&[1, 0, 0, 0, 0, 3, 0, 8]), Err(AnepError::BadHeaderLength { words: 3, len: 8 }));
        assert_eq!(Anep::parse(&[1, 0, 0, 0, 0, 2, 0, 9]), Err(AnepError::BadPacketLength { declared: 9, len: 8 }));
    }
}
