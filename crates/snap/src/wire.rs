//! The SNAP packet wire format (SNAP §VI-A, Fig. 3).
//!
//! ```text
//!  0      1      2             4             6             8
//! +------+------+-------------+-------------+-------------+
//! | ver  | flags| entry point | resource bd | demux port  |
//! +------+------+-------------+-------------+-------------+
//! |        source address     |   destination address     |  8..16
//! +-------------+-------------+-------------+-------------+
//! |  code len   |  heap len   |  stack len  |  reserved   |  16..24
//! +-------------+-------------+-------------+-------------+
//! | code: code len words | heap: heap len words | stack: stack len words |
//! ```
//!
//! All header fields are in network byte order. The sections are arrays of
//! 32-bit words whose byte order is given by the `LE` flag, so a packet can be
//! executed in place right after these structural checks, without unmarshalling.
//! The stack is stored bottom first: the top of the stack is the last word, and
//! execution grows the stack toward the end of the buffer.
//!
//! # No-panic contract
//! After [`Packet::new_checked`] succeeds, no accessor of [`Packet`] panics.
//! [`Packet::new_unchecked`] accessors may panic on short buffers.

use crate::ops::IMM_MASK;
use core::net::Ipv4Addr;

/// The only wire version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 24;

/// Header flag bits.
pub mod flags {
    /// Program words (code, heap, stack) are little-endian.
    pub const LE: u8 = 0x01;
    /// All defined flag bits.
    pub const ALL: u8 = LE;
}

pub(crate) mod field {
    use core::ops::Range;
    pub const VERSION: usize = 0;
    pub const FLAGS: usize = 1;
    pub const ENTRY: Range<usize> = 2..4;
    pub const RB: Range<usize> = 4..6;
    pub const PORT: Range<usize> = 6..8;
    pub const SRC: Range<usize> = 8..12;
    pub const DST: Range<usize> = 12..16;
    pub const CODE_LEN: Range<usize> = 16..18;
    pub const HEAP_LEN: Range<usize> = 18..20;
    pub const STACK_LEN: Range<usize> = 20..22;
    pub const RESERVED: Range<usize> = 22..24;
}

/// A structural problem with a SNAP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the fixed header.
    #[error("truncated header: {len} bytes, need {HEADER_LEN}")]
    Truncated {
        /// Bytes available.
        len: usize,
    },
    /// The version field is not [`VERSION`].
    #[error("unknown SNAP version {0}")]
    BadVersion(u8),
    /// A reserved flag bit is set.
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// The reserved header field is not zero.
    #[error("reserved header field is {0:#06x}, must be 0")]
    ReservedNonZero(u16),
    /// The sections do not fit in the buffer.
    #[error("sections need {need} bytes, buffer has {have}")]
    SectionsOverrun {
        /// Bytes the header declares.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The buffer holds bytes after the declared sections.
    #[error("{extra} trailing bytes after the stack section")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },
    /// The entry point is not inside the code section.
    #[error("entry point {entry} outside code of {code_len} instructions")]
    EntryOutOfBounds {
        /// Declared entry point.
        entry: u16,
        /// Declared code length.
        code_len: u16,
    },
    /// A section holds more words than a 16-bit length can describe (emit only).
    #[error("section too long: {0} words")]
    SectionTooLong(usize),
    /// The output buffer is too small (emit only).
    #[error("output buffer of {have} bytes, need {need}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

#[inline(always)]
fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_be_bytes(a)
}

#[inline(always)]
fn addr(b: &[u8], r: core::ops::Range<usize>) -> Ipv4Addr {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    Ipv4Addr::from(a)
}

/// A received packet's header, decoded and checked once: the checks of
/// [`Packet::check`], in the same order, plus an exact length (the buffer
/// given is exactly the packet). The VM executes from it
/// ([`Vm::execute_checked`](crate::vm::Vm::execute_checked)) without checking
/// the header again; the node classifies a datagram and hands this down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    pub(crate) entry: usize,
    pub(crate) code_len: usize,
    pub(crate) h0: u32,
    pub(crate) heap_start: usize,
    pub(crate) stack_start: usize,
    pub(crate) len: usize,
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) port: u16,
    pub(crate) flags: u8,
    pub(crate) rb: u16,
}

impl Checked {
    /// Decodes and checks the header of the packet that is exactly `b`, in
    /// one pass over its 24 bytes.
    #[inline(always)]
    pub fn decode(b: &[u8]) -> Result<Checked, WireError> {
        let len = b.len();
        let Some(h) = b.first_chunk::<HEADER_LEN>() else { return Err(WireError::Truncated { len }) };
        let be = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        if h[0] != VERSION {
            return Err(WireError::BadVersion(h[0]));
        }
        if h[1] & !flags::ALL != 0 {
            return Err(WireError::UnknownFlags(h[1]));
        }
        if be(22) != 0 {
            return Err(WireError::ReservedNonZero(be(22)));
        }
        let (entry, code_len, heap_len, stack_len) = (be(2), be(16), be(18), be(20));
        let heap_start = HEADER_LEN + 4 * code_len as usize;
        let stack_start = heap_start + 4 * heap_len as usize;
        let total = stack_start + 4 * stack_len as usize;
        if total > len {
            return Err(WireError::SectionsOverrun { need: total, have: len });
        }
        if entry >= code_len {
            return Err(WireError::EntryOutOfBounds { entry, code_len });
        }
        if total != len {
            return Err(WireError::TrailingBytes { extra: len - total });
        }
        Ok(Checked {
            entry: entry as usize,
            code_len: code_len as usize,
            h0: heap_len as u32,
            heap_start,
            stack_start,
            len,
            src: Ipv4Addr::new(h[8], h[9], h[10], h[11]),
            dst: Ipv4Addr::new(h[12], h[13], h[14], h[15]),
            port: be(6),
            flags: h[1],
            rb: be(4),
        })
    }

    /// The packet's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the packet is empty (never, once checked).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The resource bound it arrived with.
    pub fn resource_bound(&self) -> u16 {
        self.rb
    }
    /// The header with another arriving resource bound: the node lowers an
    /// excessive bound (writing it into the packet too) before execution.
    pub fn with_resource_bound(self, rb: u16) -> Checked {
        Checked { rb, ..self }
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        self.src
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        self.dst
    }
    /// Destination port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A read/write view of a SNAP packet over a byte buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check`](Self::check) succeeds.
    ///
    /// The buffer may be longer than the packet (for in-place execution the
    /// packet sits at the front of a larger buffer); see [`total_len`](Self::total_len).
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let p = Packet::new_unchecked(buffer);
        p.check()?;
        Ok(p)
    }

    /// Structural checks only (SNAP §VI-A): the header is present, the
    /// version is known, no unknown flags, the sections fit in the buffer and
    /// the entry point is inside the code.
    pub fn check(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated { len: b.len() });
        }
        if b[field::VERSION] != VERSION {
            return Err(WireError::BadVersion(b[field::VERSION]));
        }
        if b[field::FLAGS] & !flags::ALL != 0 {
            return Err(WireError::UnknownFlags(b[field::FLAGS]));
        }
        let reserved = be16(b, field::RESERVED);
        if reserved != 0 {
            return Err(WireError::ReservedNonZero(reserved));
        }
        let need = self.total_len();
        if need > b.len() {
            return Err(WireError::SectionsOverrun { need, have: b.len() });
        }
        let (entry, code_len) = (self.entry(), self.code_len());
        if entry >= code_len {
            return Err(WireError::EntryOutOfBounds { entry, code_len });
        }
        Ok(())
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Version field.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// Flags field.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Whether program words are little-endian.
    pub fn little_endian(&self) -> bool {
        self.flags() & flags::LE != 0
    }
    /// Entry point: index of the first instruction to execute.
    pub fn entry(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ENTRY)
    }
    /// Resource bound.
    pub fn resource_bound(&self) -> u16 {
        be16(self.buffer.as_ref(), field::RB)
    }
    /// Demux port of the originating application.
    pub fn port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PORT)
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        addr(self.buffer.as_ref(), field::SRC)
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        addr(self.buffer.as_ref(), field::DST)
    }
    /// Code length in words.
    pub fn code_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CODE_LEN)
    }
    /// Heap length in words.
    pub fn heap_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::HEAP_LEN)
    }
    /// Stack length in words.
    pub fn stack_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::STACK_LEN)
    }
    /// Byte offset of the code section.
    pub fn code_start(&self) -> usize {
        HEADER_LEN
    }
    /// Byte offset of the heap section.
    pub fn heap_start(&self) -> usize {
        HEADER_LEN + 4 * self.code_len() as usize
    }
    /// Byte offset of the stack section.
    pub fn stack_start(&self) -> usize {
        self.heap_start() + 4 * self.heap_len() as usize
    }
    /// Total packet length in bytes declared by the header.
    pub fn total_len(&self) -> usize {
        self.stack_start() + 4 * self.stack_len() as usize
    }
    /// Reads program word `i` of the section starting at byte `start`.
    pub fn word_at(&self, byte_off: usize) -> u32 {
        let b = self.buffer.as_ref();
        let mut a = [0u8; 4];
        a.copy_from_slice(&b[byte_off..byte_off + 4]);
        if self.little_endian() { u32::from_le_bytes(a) } else { u32::from_be_bytes(a) }
    }
    /// Code word `i`.
    pub fn code_word(&self, i: usize) -> u32 {
        self.word_at(self.code_start() + 4 * i)
    }
    /// Heap word `i`.
    pub fn heap_word(&self, i: usize) -> u32 {
        self.word_at(self.heap_start() + 4 * i)
    }
    /// Stack word `i` (0 is the bottom).
    pub fn stack_word(&self, i: usize) -> u32 {
        self.word_at(self.stack_start() + 4 * i)
    }
    /// The whole packet as bytes (header plus sections).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.total_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn put16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the version field.
    pub fn set_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::VERSION] = v;
    }
    /// Sets the flags field.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    /// Sets the entry point.
    pub fn set_entry(&mut self, v: u16) {
        self.put16(field::ENTRY, v)
    }
    /// Sets the resource bound.
    pub fn set_resource_bound(&mut self, v: u16) {
        self.put16(field::RB, v)
    }
    /// Sets the demux port.
    pub fn set_port(&mut self, v: u16) {
        self.put16(field::PORT, v)
    }
    /// Sets the source address.
    pub fn set_src(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }
    /// Sets the code length (words).
    pub fn set_code_len(&mut self, v: u16) {
        self.put16(field::CODE_LEN, v)
    }
    /// Sets the heap length (words).
    pub fn set_heap_len(&mut self, v: u16) {
        self.put16(field::HEAP_LEN, v)
    }
    /// Sets the stack length (words).
    pub fn set_stack_len(&mut self, v: u16) {
        self.put16(field::STACK_LEN, v)
    }
    /// Zeroes the reserved field.
    pub fn clear_reserved(&mut self) {
        self.put16(field::RESERVED, 0)
    }
}

/// An owned, parsed SNAP packet. Words are held in host order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repr {
    /// Write program words little-endian.
    pub little_endian: bool,
    /// Entry point.
    pub entry: u16,
    /// Resource bound.
    pub resource_bound: u16,
    /// Demux port of the originating application.
    pub port: u16,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Code words.
    pub code: Vec<u32>,
    /// Heap words.
    pub heap: Vec<u32>,
    /// Stack words, bottom first.
    pub stack: Vec<u32>,
}

impl Repr {
    /// Parses a checked packet. The buffer must hold exactly the packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check()?;
        let have = p.buffer.as_ref().len();
        if have != p.total_len() {
            return Err(WireError::TrailingBytes { extra: have - p.total_len() });
        }
        Ok(Repr {
            little_endian: p.little_endian(),
            entry: p.entry(),
            resource_bound: p.resource_bound(),
            port: p.port(),
            src: p.src(),
            dst: p.dst(),
            code: (0..p.code_len() as usize).map(|i| p.code_word(i)).collect(),
            heap: (0..p.heap_len() as usize).map(|i| p.heap_word(i)).collect(),
            stack: (0..p.stack_len() as usize).map(|i| p.stack_word(i)).collect(),
        })
    }

    /// Parses bytes that hold exactly one packet.
    pub fn parse_bytes(b: &[u8]) -> Result<Repr, WireError> {
        Repr::parse(&Packet::new_unchecked(b))
    }

    /// Length of the emitted packet in bytes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + 4 * (self.code.len() + self.heap.len() + self.stack.len())
    }

    /// Writes the packet to the front of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(WireError::BufferTooSmall { need, have: buf.len() });
        }
        let len16 = |v: &Vec<u32>| u16::try_from(v.len()).map_err(|_| WireError::SectionTooLong(v.len()));
        let (c, h, s) = (len16(&self.code)?, len16(&self.heap)?, len16(&self.stack)?);
        if self.entry >= c {
            return Err(WireError::EntryOutOfBounds { entry: self.entry, code_len: c });
        }
        let mut p = Packet::new_unchecked(&mut buf[..need]);
        p.set_version(VERSION);
        p.set_flags(if self.little_endian { flags::LE } else { 0 });
        p.set_entry(self.entry);
        p.set_resource_bound(self.resource_bound);
        p.set_port(self.port);
        p.set_src(self.src);
        p.set_dst(self.dst);
        p.set_code_len(c);
        p.set_heap_len(h);
        p.set_stack_len(s);
        p.clear_reserved();
        let mut at = HEADER_LEN;
        for &w in self.code.iter().chain(&self.heap).chain(&self.stack) {
            let bytes = if self.little_endian { w.to_le_bytes() } else { w.to_be_bytes() };
            buf[at..at + 4].copy_from_slice(&bytes);
            at += 4;
        }
        Ok(need)
    }

    /// Emits into a new vector.
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

/// Masks a value to the 25-bit datum field (helper for emitters).
pub const fn datum(v: u32) -> u32 {
    v & IMM_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fig. 1 ping to 10.0.0.2 from 10.0.0.1, port 7, payload "ping":
    /// stack [0 :: 7 :: blob] (top first).
    static PING_BYTES: [u8; 72] = [
        0x01, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x07, // ver flags ep=0 rb=16 port=7
        10, 0, 0, 1, 10, 0, 0, 2, // src dst
        0x00, 0x07, 0x00, 0x02, 0x00, 0x03, 0x00, 0x00, // code 7, heap 2, stack 3
        0x20, 0x00, 0x00, 0x00, // forw
        0x30, 0x00, 0x00, 0x05, // bne 5
        0x02, 0x00, 0x00, 0x01, // push 1
        0x40, 0x00, 0x00, 0x00, // getsrc
        0x22, 0x00, 0x00, 0x00, // forwto
        0x0a, 0x00, 0x00, 0x00, // pop
        0x26, 0x00, 0x00, 0x00, // demux
        0x0a, 0x00, 0x00, 0x04, // heap: blob header, len 4
        b'p', b'i', b'n', b'g', // payload
        0x0a, 0x00, 0x00, 0x00, // stack bottom: blob@0
        0x00, 0x00, 0x00, 0x07, // 7
        0x00, 0x00, 0x00, 0x00, // top: 0
    ];

    fn ping_repr() -> Repr {
        use crate::ops::{Insn, Op};
        use crate::value::{Tag, Value, header};
        let i = |op, v| Insn::new(op, v).expect("imm").encode();
        Repr {
            little_endian: false,
            entry: 0,
            resource_bound: 16,
            port: 7,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            code: vec![
                i(Op::Forw, 0),
                i(Op::Bne, 5),
                i(Op::Push, 1),
                i(Op::GetSrc, 0),
                i(Op::ForwTo, 0),
                i(Op::Pop, 0),
                i(Op::Demux, 0),
            ],
            heap: vec![header(Tag::Blob, 4), u32::from_be_bytes(*b"ping")],
            stack: vec![Value::heap(Tag::Blob, 0).0, Value::int(7).0, Value::int(0).0],
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PING_BYTES[..]).expect("valid");
        assert_eq!(p.version(), 1);
        assert!(!p.little_endian());
        assert_eq!(p.resource_bound(), 16);
        assert_eq!(p.port(), 7);
        assert_eq!(p.src(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.code_len(), 7);
        assert_eq!(p.total_len(), 72);
        assert_eq!(Repr::parse(&p), Ok(ping_repr()));
    }

    #[test]
    fn construct() {
        assert_eq!(ping_repr().to_bytes().expect("emit"), PING_BYTES.to_vec());
    }

    #[test]
    fn little_endian_roundtrip() {
        let mut r = ping_repr();
        r.little_endian = true;
        let b = r.to_bytes().expect("emit");
        assert_eq!(b[1], flags::LE);
        assert_eq!(&b[24..28], &[0, 0, 0, 0x20]);
        assert_eq!(Repr::parse_bytes(&b), Ok(r));
    }

    #[test]
    fn rejections() {
        let ok = PING_BYTES;
        assert_eq!(Packet::new_checked(&ok[..10]).err(), Some(WireError::Truncated { len: 10 }));
        let mut b = ok;
        b[0] = 2;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::BadVersion(2)));
        let mut b = ok;
        b[1] = 0x80;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::UnknownFlags(0x80)));
        let mut b = ok;
        b[23] = 1;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::ReservedNonZero(1)));
        assert_eq!(Packet::new_checked(&ok[..71]).err(), Some(WireError::SectionsOverrun { need: 72, have: 71 }));
        let mut b = ok;
        b[3] = 7;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(WireError::EntryOutOfBounds { entry: 7, code_len: 7 }));
        let mut long = ok.to_vec();
        long.push(0);
        assert!(Packet::new_checked(&long[..]).is_ok(), "views accept a larger buffer");
        assert_eq!(Repr::parse_bytes(&long), Err(WireError::TrailingBytes { extra: 1 }));
        let mut b = ok;
        b[17] = 0; // code_len 0 => no entry point is valid
        b[16] = 0;
        assert!(matches!(Packet::new_checked(&b[..]).err(), Some(WireError::EntryOutOfBounds { .. })));
    }
}
