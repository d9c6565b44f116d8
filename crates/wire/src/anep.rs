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
//! the option data. anode knows no options yet: it skips unknown ones
//! unless their discard bit is set.
//!
//! Flag bit 7 (`0x80`, [`FLAG_DISCARD_UNKNOWN`]) says what a node that does
//! not know the type id does: set, it discards the packet; clear, it passes
//! it on toward the default next hop ("forward if unknown").
//!
//! # No-panic contract
//! After [`Packet::new_checked`] succeeds, no accessor of [`Packet`] panics.

/// ANEP version this node speaks.
pub const VERSION: u8 = 1;
/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 8;
/// Flag: discard the packet if its type id is unknown (else pass it on).
pub const FLAG_DISCARD_UNKNOWN: u8 = 0x80;
/// Option-type bit: discard the packet if the option is unknown.
pub const OPT_DISCARD_UNKNOWN: u16 = 0x8000;

/// A SNAP packet (`docs/snap.md`).
pub const TYPE_SNAP: u16 = 0xA001;
/// A plain packet forwarded by destination address only, without the VM:
/// the baseline "IP router" path (see [`crate::plain`]).
pub const TYPE_PLAIN: u16 = 0xA002;
/// A capsule, code request or code reply (`docs/modules.md`).
pub const TYPE_CAPSULE: u16 = 0xA003;
/// A control message ([`crate::control`]), only inside a security association.
pub const TYPE_CONTROL: u16 = 0xA004;
/// An authenticated (not encrypted) datagram: SPI, counter, inner ANEP
/// datagram, tag (`docs/security.md`).
pub const TYPE_AUTH: u16 = 0xA005;
/// A key-establishment handshake message (Noise IK or XX).
pub const TYPE_HANDSHAKE: u16 = 0xA006;
/// An encrypted and authenticated datagram: like [`TYPE_AUTH`] with the
/// inner datagram encrypted.
pub const TYPE_ESP: u16 = 0xA007;
/// An administrative domain's datagram (SANE §4.7): a user's
/// ticket-authenticated packet, or a packet a border admitted with its
/// perimeter attachment (`anode_sec::ticket::Envelope`, `docs/security.md`).
pub const TYPE_DOMAIN: u16 = 0xA008;

mod field {
    use core::ops::Range;
    pub const VERSION: usize = 0;
    pub const FLAGS: usize = 1;
    pub const TYPE: Range<usize> = 2..4;
    pub const HEADER_WORDS: Range<usize> = 4..6;
    pub const PACKET_LEN: Range<usize> = 6..8;
}

/// Why an ANEP datagram was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A payload too long for the 16-bit packet length.
    #[error("payload of {0} bytes does not fit an ANEP datagram")]
    TooLong(usize),
}

fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    match b.get(r) {
        Some(&[h, l]) => u16::from_be_bytes([h, l]),
        _ => 0,
    }
}

/// A view of an ANEP datagram: the buffer is exactly the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it (accessors then read zeros where
    /// the buffer is short, and never panic either).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check`](Self::check) succeeds.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let p = Packet::new_unchecked(buffer);
        p.check()?;
        Ok(p)
    }

    /// The checks of the ANEP header: version, both lengths against the
    /// datagram, and every option's framing (an unknown option with its
    /// discard bit set is refused, others are skipped).
    pub fn check(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        let len = b.len();
        if len < HEADER_LEN {
            return Err(Error::Truncated(len));
        }
        if b[field::VERSION] != VERSION {
            return Err(Error::BadVersion(b[field::VERSION]));
        }
        let words = be16(b, field::HEADER_WORDS);
        let hlen = words as usize * 4;
        if words < 2 || hlen > len {
            return Err(Error::BadHeaderLength { words, len });
        }
        let declared = be16(b, field::PACKET_LEN);
        if declared as usize != len {
            return Err(Error::BadPacketLength { declared, len });
        }
        let mut at = HEADER_LEN;
        while at < hlen {
            let Some(o) = b.get(at..at + 4) else { return Err(Error::BadOption(at)) };
            let ty = u16::from_be_bytes([o[0], o[1]]);
            let olen = u16::from_be_bytes([o[2], o[3]]) as usize * 4;
            if olen < 4 || at + olen > hlen {
                return Err(Error::BadOption(at));
            }
            if ty & OPT_DISCARD_UNKNOWN != 0 {
                return Err(Error::UnknownOption(ty));
            }
            at += olen;
        }
        Ok(())
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref().get(field::FLAGS).copied().unwrap_or(0)
    }
    /// The type id.
    pub fn type_id(&self) -> u16 {
        be16(self.buffer.as_ref(), field::TYPE)
    }
    /// Whether an unknown type id should be discarded rather than passed on.
    pub fn discard_if_unknown(&self) -> bool {
        self.flags() & FLAG_DISCARD_UNKNOWN != 0
    }
    /// Header length in bytes, options included: where the payload starts.
    pub fn payload_start(&self) -> usize {
        (be16(self.buffer.as_ref(), field::HEADER_WORDS) as usize * 4).min(self.buffer.as_ref().len())
    }
    /// The datagram's length.
    pub fn len(&self) -> usize {
        self.buffer.as_ref().len()
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.buffer.as_ref().is_empty()
    }
    /// The payload after the header and its options.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        b.get(self.payload_start()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let s = self.payload_start();
        self.buffer.as_mut().get_mut(s..).unwrap_or(&mut [])
    }
}

/// A parsed ANEP header, as anode emits it: no options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Flags byte.
    pub flags: u8,
    /// Type id.
    pub type_id: u16,
    /// Payload bytes after the header.
    pub payload_len: usize,
}

impl Repr {
    /// The header of a checked datagram (its options are dropped).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr { flags: p.flags(), type_id: p.type_id(), payload_len: p.payload().len() }
    }

    /// A header with the discard flag set, as nodes send.
    pub fn discard(type_id: u16, payload_len: usize) -> Repr {
        Repr { flags: FLAG_DISCARD_UNKNOWN, type_id, payload_len }
    }

    /// Bytes of the whole datagram.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Writes the fixed 8-byte header (no options) into `buf[..8]`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buf` is shorter than 8 bytes;
    /// [`Error::TooLong`] if the datagram would exceed 65,535 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), Error> {
        let total = u16::try_from(self.buffer_len()).map_err(|_| Error::TooLong(self.payload_len))?;
        let Some(h) = buf.first_chunk_mut::<HEADER_LEN>() else { return Err(Error::Truncated(buf.len())) };
        h[field::VERSION] = VERSION;
        h[field::FLAGS] = self.flags;
        h[field::TYPE].copy_from_slice(&self.type_id.to_be_bytes());
        h[field::HEADER_WORDS].copy_from_slice(&2u16.to_be_bytes());
        h[field::PACKET_LEN].copy_from_slice(&total.to_be_bytes());
        Ok(())
    }
}

/// Writes a fixed 8-byte ANEP header (no options) for a payload of
/// `payload_len` bytes into `buf[..8]`. Callers size both: the node's MTU is
/// far below the 65,535-byte limit, and buffers start with header room.
///
/// # Panics
/// If `buf` is shorter than 8 bytes or the total exceeds 65,535 bytes
/// (both programming errors, never input).
pub fn write_header(buf: &mut [u8], flags: u8, type_id: u16, payload_len: usize) {
    let r = Repr { flags, type_id, payload_len }.emit(buf);
    assert!(r.is_ok(), "ANEP header: {r:?}");
}

/// Builds a whole datagram: header then payload.
///
/// # Panics
/// If the payload is longer than 65,527 bytes (a programming error).
pub fn frame(flags: u8, type_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0; HEADER_LEN + payload.len()];
    write_header(&mut v, flags, type_id, payload.len());
    v[HEADER_LEN..].copy_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SNAP ping of docs/snap.md §1.7 travels with this header.
    static PING_HEADER: [u8; 8] = [0x01, 0x80, 0xa0, 0x01, 0x00, 0x02, 0x00, 0x50];

    #[test]
    fn deconstruct_and_construct() {
        let mut d = PING_HEADER.to_vec();
        d.resize(0x50, 0);
        let p = Packet::new_checked(&d[..]).expect("valid");
        assert_eq!((p.type_id(), p.payload_start(), p.payload().len()), (TYPE_SNAP, 8, 72));
        assert!(p.discard_if_unknown());
        let r = Repr::parse(&p);
        assert_eq!(r, Repr::discard(TYPE_SNAP, 72));
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).expect("fits");
        assert_eq!(b[..8], PING_HEADER);
        let d = frame(FLAG_DISCARD_UNKNOWN, TYPE_SNAP, b"abcd");
        assert_eq!(d, [1, 0x80, 0xA0, 0x01, 0, 2, 0, 12, b'a', b'b', b'c', b'd']);
    }

    #[test]
    fn options_are_skipped_or_rejected() {
        // header 4 words: one 2-word option of type 7 (skippable)
        let mut d = vec![1, 0, 0xA0, 0x01, 0, 4, 0, 18, 0, 7, 0, 2, 9, 9, 9, 9, b'x', b'y'];
        let p = Packet::new_checked(&d[..]).expect("valid");
        assert_eq!((p.payload_start(), p.payload()), (16, &b"xy"[..]));
        assert_eq!(Repr::parse(&p).payload_len, 2, "options are not carried into the Repr");
        d[8] = 0x80; // discard bit
        assert_eq!(Packet::new_checked(&d[..]), Err(Error::UnknownOption(0x8007)));
        d[8] = 0;
        d[11] = 0; // zero-length option
        assert_eq!(Packet::new_checked(&d[..]), Err(Error::BadOption(8)));
        d[11] = 3; // overruns the header
        assert_eq!(Packet::new_checked(&d[..]), Err(Error::BadOption(8)));
    }

    #[test]
    fn rejections() {
        let c = |b: &[u8]| Packet::new_checked(b).map(|_| ());
        assert_eq!(c(&[1, 0, 0]), Err(Error::Truncated(3)));
        assert_eq!(c(&[2, 0, 0, 0, 0, 2, 0, 8]), Err(Error::BadVersion(2)));
        assert_eq!(c(&[1, 0, 0, 0, 0, 1, 0, 8]), Err(Error::BadHeaderLength { words: 1, len: 8 }));
        assert_eq!(c(&[1, 0, 0, 0, 0, 3, 0, 8]), Err(Error::BadHeaderLength { words: 3, len: 8 }));
        assert_eq!(c(&[1, 0, 0, 0, 0, 2, 0, 9]), Err(Error::BadPacketLength { declared: 9, len: 8 }));
        assert_eq!(Repr::discard(TYPE_SNAP, 1).emit(&mut [0u8; 7]), Err(Error::Truncated(7)));
        assert_eq!(Repr::discard(TYPE_SNAP, 65_530).emit(&mut [0u8; 8]), Err(Error::TooLong(65_530)));
    }

    #[test]
    fn unchecked_views_never_panic() {
        for len in 0..12 {
            let b = vec![0xffu8; len];
            let p = Packet::new_unchecked(&b[..]);
            let _ = (p.flags(), p.type_id(), p.payload_start(), p.payload(), p.discard_if_unknown());
        }
    }
}
