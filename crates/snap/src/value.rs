//! Stack values and heap objects.
//!
//! A stack value is one 32-bit word: a 7-bit tag in the high bits and a 25-bit
//! datum in the low bits (SNAP §VI-B). Small values (integers, booleans, unit)
//! live in the datum. Large values (addresses, floats, byte arrays, strings,
//! tuples) live in the heap and the datum is the word offset of their header
//! relative to the heap base, so a packet can be relocated without fix-ups.
//!
//! Each heap object starts with a one-word header: the object type (the same
//! codes as the tags) in the high 7 bits and a 25-bit length. The length is in
//! bytes for blobs and strings, in elements for tuples, and 1 for addresses
//! and floats. The payload follows: one word for an address (a.b.c.d as the
//! word `a<<24 | b<<16 | c<<8 | d`), one word for a float (IEEE-754 binary32
//! bits), `ceil(len/4)` words of bytes for blobs and strings (zero padded), and
//! one tagged value word per tuple element.

use crate::ops::{IMM_BITS, IMM_MASK, sext25, trunc25};
use core::fmt;

/// Value tags and heap object types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tag {
    /// A 25-bit signed integer in the datum.
    Int = 0,
    /// A boolean: datum 0 or 1.
    Bool = 1,
    /// Unit (also the empty list); datum 0.
    Unit = 2,
    /// Reference to an IPv4 address object.
    Addr = 3,
    /// Reference to a binary32 float object.
    Float = 4,
    /// Reference to a byte array.
    Blob = 5,
    /// Reference to a tuple.
    Tuple = 6,
    /// Reference to a string (bytes, conventionally UTF-8).
    Str = 7,
}

/// All tags, in code order.
pub const ALL_TAGS: [Tag; 8] = [Tag::Int, Tag::Bool, Tag::Unit, Tag::Addr, Tag::Float, Tag::Blob, Tag::Tuple, Tag::Str];

impl Tag {
    /// Decodes a 7-bit tag; `None` for unassigned codes.
    #[inline(always)]
    pub const fn from_code(c: u8) -> Option<Tag> {
        match c {
            0 => Some(Tag::Int),
            1 => Some(Tag::Bool),
            2 => Some(Tag::Unit),
            3 => Some(Tag::Addr),
            4 => Some(Tag::Float),
            5 => Some(Tag::Blob),
            6 => Some(Tag::Tuple),
            7 => Some(Tag::Str),
            _ => None,
        }
    }

    /// Whether values with this tag point into the heap.
    #[inline(always)]
    pub const fn is_ref(self) -> bool {
        matches!(self, Tag::Addr | Tag::Float | Tag::Blob | Tag::Tuple | Tag::Str)
    }

    /// Lower-case name, as used by the assembler.
    pub const fn name(self) -> &'static str {
        match self {
            Tag::Int => "int",
            Tag::Bool => "bool",
            Tag::Unit => "unit",
            Tag::Addr => "addr",
            Tag::Float => "float",
            Tag::Blob => "blob",
            Tag::Tuple => "tuple",
            Tag::Str => "str",
        }
    }

    /// Parses a tag name.
    pub fn from_name(s: &str) -> Option<Tag> {
        ALL_TAGS.iter().copied().find(|t| t.name() == s)
    }
}

/// Whether a raw 7-bit tag code denotes a heap reference.
#[inline(always)]
pub const fn code_is_ref(code: u32) -> bool {
    // Addr, Float, Blob, Tuple, Str are codes 3..=7.
    code >= 3 && code <= 7
}

/// One tagged stack word.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value(pub u32);

impl Value {
    /// Unit.
    pub const UNIT: Value = Value::new(Tag::Unit, 0);

    /// Builds a value from a tag and a 25-bit datum.
    #[inline(always)]
    pub const fn new(tag: Tag, datum: u32) -> Value {
        Value(((tag as u32) << IMM_BITS) | (datum & IMM_MASK))
    }
    /// An integer (truncated to 25 bits).
    #[inline(always)]
    pub const fn int(v: i32) -> Value {
        Value(trunc25(v))
    }
    /// A boolean.
    #[inline(always)]
    pub const fn bool(b: bool) -> Value {
        Value::new(Tag::Bool, b as u32)
    }
    /// A heap reference of the given type.
    #[inline(always)]
    pub const fn heap(tag: Tag, off: u32) -> Value {
        Value::new(tag, off)
    }
    /// The raw 7-bit tag code.
    #[inline(always)]
    pub const fn tag_code(self) -> u32 {
        self.0 >> IMM_BITS
    }
    /// The tag, if assigned.
    #[inline(always)]
    pub const fn tag(self) -> Option<Tag> {
        Tag::from_code(self.tag_code() as u8)
    }
    /// The unsigned 25-bit datum.
    #[inline(always)]
    pub const fn datum(self) -> u32 {
        self.0 & IMM_MASK
    }
    /// The datum read as a signed integer.
    #[inline(always)]
    pub const fn as_int(self) -> i32 {
        sext25(self.0)
    }
    /// Whether this value points into the heap.
    #[inline(always)]
    pub const fn is_ref(self) -> bool {
        code_is_ref(self.tag_code())
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag() {
            Some(Tag::Int) => write!(f, "{}", self.as_int()),
            Some(Tag::Bool) => write!(f, "{}", self.datum() != 0),
            Some(Tag::Unit) => f.write_str("()"),
            Some(t) => write!(f, "{}@{}", t.name(), self.datum()),
            None => write!(f, "word({:#010x})", self.0),
        }
    }
}

/// Builds a heap object header word.
#[inline(always)]
pub const fn header(ty: Tag, len: u32) -> u32 {
    ((ty as u32) << IMM_BITS) | (len & IMM_MASK)
}

/// Splits a heap header word into (type code, length).
#[inline(always)]
pub const fn split_header(w: u32) -> (u32, u32) {
    (w >> IMM_BITS, w & IMM_MASK)
}

/// Number of payload words of an object with this header, or `None` if the
/// type code is not a heap type.
#[inline(always)]
pub const fn payload_words(w: u32) -> Option<u32> {
    let (ty, len) = split_header(w);
    match ty {
        3 | 4 => Some(1),
        5 | 7 => Some(len.div_ceil(4)),
        6 => Some(len),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_roundtrip() {
        for v in [0, 1, -1, 12345, -(1 << 24), (1 << 24) - 1] {
            assert_eq!(Value::int(v).as_int(), v);
            assert_eq!(Value::int(v).tag(), Some(Tag::Int));
        }
        // wraps at 25 bits
        assert_eq!(Value::int(1 << 24).as_int(), -(1 << 24));
    }

    #[test]
    fn payload_sizes() {
        assert_eq!(payload_words(header(Tag::Blob, 0)), Some(0));
        assert_eq!(payload_words(header(Tag::Blob, 5)), Some(2));
        assert_eq!(payload_words(header(Tag::Tuple, 3)), Some(3));
        assert_eq!(payload_words(header(Tag::Addr, 1)), Some(1));
        assert_eq!(payload_words(header(Tag::Int, 1)), None);
    }
}
