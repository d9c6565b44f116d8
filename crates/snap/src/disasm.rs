//! The SNAP disassembler: [`Repr`] → text.
//!
//! [`disassemble`] prints assembler source that [`crate::asm::assemble`]
//! turns back into an identical [`Repr`], for any packet, including words
//! that are not valid instructions or heap objects (they are printed as raw
//! `word`s). Heap objects are labelled `hN`, N being their word offset.

use crate::ops::{ImmKind, Insn};
use crate::value::{Tag, Value, payload_words, split_header};
use crate::wire::Repr;
use core::fmt::Write as _;
use core::net::Ipv4Addr;
use std::collections::BTreeMap;

/// Column at which code comments start.
const COMMENT_COL: usize = 28;

/// Disassembles a whole packet into source that reassembles to it exactly.
pub fn disassemble(r: &Repr) -> String {
    let heap = HeapMap::walk(&r.heap);
    let mut out = String::new();
    let _ = writeln!(out, "; SNAP packet: {} code, {} heap, {} stack words", r.code.len(), r.heap.len(), r.stack.len());
    if r.little_endian {
        out.push_str(".endian little\n");
    }
    let _ = writeln!(out, ".entry {}", r.entry);
    let _ = writeln!(out, ".rb {}", r.resource_bound);
    let _ = writeln!(out, ".src {}", r.src);
    let _ = writeln!(out, ".dst {}", r.dst);
    let _ = writeln!(out, ".port {}", r.port);
    if !r.stack.is_empty() {
        let vals: Vec<String> = r.stack.iter().rev().map(|&w| value_literal(w)).collect();
        let _ = writeln!(out, ".stack {}", vals.join(", "));
    }

    out.push_str("\n.code\n");
    for (i, &w) in r.code.iter().enumerate() {
        let (text, note) = match insn_text(w, Some(&heap)) {
            Some((text, insn)) => (text, insn_note(i, insn, &heap)),
            None => (format!(".word {w:#010x}"), String::new()),
        };
        let _ = writeln!(out, "{text:<COMMENT_COL$}; {i}{note}");
    }

    if !r.heap.is_empty() {
        out.push_str("\n.heap\n");
        heap.print(&r.heap, &mut out);
    }
    out
}

/// Disassembles one instruction word, without heap context (for tracing).
///
/// Words that are not a canonical instruction print as `.word 0x...`.
pub fn disassemble_insn(word: u32) -> String {
    match insn_text(word, None) {
        Some((text, _)) => text,
        None => format!(".word {word:#010x}"),
    }
}

/// The mnemonic form of `w`, if assembling it gives back the same word.
fn insn_text(w: u32, heap: Option<&HeapMap>) -> Option<(String, Insn)> {
    let insn = Insn::decode(w).ok()?;
    let v = insn.imm_value();
    if Insn::new(insn.op, v).ok()?.encode() != w {
        return None;
    }
    let m = insn.op.mnemonic();
    let text = match insn.op.imm_kind() {
        ImmKind::None => m.to_owned(),
        ImmKind::Bool => format!("{m} {}", v != 0),
        ImmKind::Tag => match u8::try_from(v).ok().and_then(Tag::from_code) {
            Some(t) => format!("{m} {}", t.name()),
            None => format!("{m} {v}"),
        },
        ImmKind::HeapRef if heap.is_some_and(|h| h.objects.contains_key(&insn.imm)) => {
            format!("{m} @h{v}")
        }
        _ => format!("{m} {v}"),
    };
    Some((text, insn))
}

/// The comment suffix after an instruction's index: branch target or the
/// heap constant it refers to.
fn insn_note(i: usize, insn: Insn, heap: &HeapMap) -> String {
    match insn.op.imm_kind() {
        ImmKind::Offset => format!(" -> {}", i as i64 + insn.imm_value()),
        ImmKind::HeapRef => match heap.objects.get(&insn.imm) {
            Some(d) => format!(": {d}"),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// A stack value in the raw form the assembler reads back bit for bit.
fn value_literal(w: u32) -> String {
    let v = Value(w);
    match v.tag() {
        Some(Tag::Int) => v.as_int().to_string(),
        Some(Tag::Bool) if v.datum() <= 1 => (v.datum() == 1).to_string(),
        Some(Tag::Unit) if v.datum() == 0 => "()".to_owned(),
        Some(t) => format!("{}@{}", t.name(), v.datum()),
        None => format!("word {w:#010x}"),
    }
}

/// Escapes bytes as a quoted string literal.
fn quote(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() + 2);
    s.push('"');
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'\r' => s.push_str("\\r"),
            0 => s.push_str("\\0"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
    }
    s.push('"');
    s
}

/// Whether bytes read well as a quoted string.
fn is_texty(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| matches!(b, 0x20..=0x7e | b'\n' | b'\t' | b'\r'))
}

fn hex_bytes(bytes: &[u8]) -> String {
    let mut s = String::from("0x");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The float literal for `bits`, if it parses back to the same bits.
fn float_literal(bits: u32) -> Option<String> {
    let s = format!("{:?}", f32::from_bits(bits));
    (s.parse::<f32>().ok()?.to_bits() == bits).then_some(s)
}

/// One walked heap object.
struct Object<'a> {
    ty: Tag,
    /// Header plus payload.
    words: &'a [u32],
}

impl Object<'_> {
    /// The bytes of a blob or string, if its padding is zero (otherwise the
    /// object cannot be written as a literal).
    fn bytes(&self) -> Option<Vec<u8>> {
        let (_, len) = split_header(*self.words.first()?);
        let len = usize::try_from(len).ok()?;
        let all: Vec<u8> = self.words.get(1..)?.iter().flat_map(|w| w.to_be_bytes()).collect();
        let (bytes, pad) = all.split_at_checked(len)?;
        pad.iter().all(|&b| b == 0).then(|| bytes.to_vec())
    }

    /// The heap entry that reassembles to exactly these words, if any.
    fn literal(&self) -> Option<String> {
        let (_, len) = split_header(*self.words.first()?);
        let payload = self.words.get(1..)?;
        match self.ty {
            Tag::Addr if len == 1 => Some(format!("addr {}", Ipv4Addr::from_bits(*payload.first()?))),
            Tag::Float if len == 1 => Some(format!("float {}", float_literal(*payload.first()?)?)),
            Tag::Blob => {
                let b = self.bytes()?;
                Some(if is_texty(&b) { format!("blob {}", quote(&b)) } else { format!("blob {}", hex_bytes(&b)) })
            }
            Tag::Str => Some(format!("str {}", quote(&self.bytes()?))),
            Tag::Tuple => {
                let elems: Vec<String> = payload.iter().map(|&w| value_literal(w)).collect();
                Some(format!("tuple [{}]", elems.join(", ")))
            }
            _ => None,
        }
    }

    /// A short description for comments at use sites.
    fn describe(&self) -> String {
        let (_, len) = split_header(self.words.first().copied().unwrap_or(0));
        let first = self.words.get(1).copied().unwrap_or(0);
        match self.ty {
            Tag::Addr => Ipv4Addr::from_bits(first).to_string(),
            Tag::Float => format!("{:?}", f32::from_bits(first)),
            Tag::Blob | Tag::Str => {
                let prefix = if self.ty == Tag::Blob { "blob " } else { "" };
                match self.bytes() {
                    Some(b) => {
                        let shown = b.get(..32).unwrap_or(&b);
                        let more = if shown.len() < b.len() { "..." } else { "" };
                        format!("{prefix}{}{more}", quote(shown))
                    }
                    None => format!("{} of {len} bytes, nonzero padding", self.ty.name()),
                }
            }
            Tag::Tuple => format!("tuple of {len}"),
            _ => String::new(),
        }
    }
}

/// The heap, walked object by object from offset 0.
struct HeapMap {
    /// Object start offset → description, for comments.
    objects: BTreeMap<u32, String>,
    /// Where the walk stopped (a non-heap header or an overrun); words from
    /// here on are printed raw.
    end: usize,
}

impl HeapMap {
    fn walk(heap: &[u32]) -> HeapMap {
        let mut objects = BTreeMap::new();
        let mut off = 0usize;
        while let Some(obj) = object_at(heap, off) {
            objects.insert(u32::try_from(off).unwrap_or(u32::MAX), obj.describe());
            off += obj.words.len();
        }
        HeapMap { objects, end: off }
    }

    fn print(&self, heap: &[u32], out: &mut String) {
        let mut off = 0usize;
        while off < self.end {
            let Some(obj) = object_at(heap, off) else { break };
            match obj.literal() {
                Some(lit) => {
                    let _ = writeln!(out, "h{off}: {lit}");
                }
                None => {
                    for (k, w) in obj.words.iter().enumerate() {
                        if k == 0 {
                            let _ = writeln!(out, "h{off}: word {w:#010x}");
                        } else {
                            let _ = writeln!(out, "    word {w:#010x}");
                        }
                    }
                }
            }
            off += obj.words.len();
        }
        for (k, w) in heap.iter().enumerate().skip(off) {
            let _ = writeln!(out, "    word {w:#010x}{:>10}; {k}", "");
        }
    }
}

/// The object whose header is at `off`, if it is a heap type that fits.
fn object_at(heap: &[u32], off: usize) -> Option<Object<'_>> {
    let h = *heap.get(off)?;
    let ty = Tag::from_code(u8::try_from(split_header(h).0).ok()?)?;
    let n = usize::try_from(payload_words(h)?).ok()?;
    let words = heap.get(off..off.checked_add(1)?.checked_add(n)?)?;
    Some(Object { ty, words })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Op;
    use crate::value::header;

    #[test]
    fn insn_forms() {
        let enc = |op, v| Insn::new(op, v).expect("imm").encode();
        assert_eq!(disassemble_insn(enc(Op::Bne, 5)), "bne 5");
        assert_eq!(disassemble_insn(enc(Op::Paj, -1)), "paj -1");
        assert_eq!(disassemble_insn(enc(Op::PushB, 1)), "pushb true");
        assert_eq!(disassemble_insn(enc(Op::IsTag, 5)), "istag blob");
        assert_eq!(disassemble_insn(enc(Op::IsTag, 100)), "istag 100");
        assert_eq!(disassemble_insn(enc(Op::Forw, 0)), "forw");
        assert_eq!(disassemble_insn(enc(Op::Forw, 0) | 1), ".word 0x20000001");
        let back = (u32::from(Op::Bne.code()) << 25) | crate::ops::trunc25(-1);
        assert_eq!(disassemble_insn(back), ".word 0x31ffffff");
        assert_eq!(disassemble_insn(0x7e << 25), ".word 0xfc000000");
    }

    #[test]
    fn values() {
        assert_eq!(value_literal(Value::int(-3).0), "-3");
        assert_eq!(value_literal(Value::bool(true).0), "true");
        assert_eq!(value_literal(Value::new(Tag::Bool, 7).0), "bool@7");
        assert_eq!(value_literal(Value::UNIT.0), "()");
        assert_eq!(value_literal(Value::heap(Tag::Blob, 4).0), "blob@4");
        assert_eq!(value_literal(0xffff_ffff), "word 0xffffffff");
    }

    #[test]
    fn heap_objects() {
        let heap = vec![
            header(Tag::Str, 3),
            u32::from_be_bytes(*b"ab\"\0"),
            header(Tag::Blob, 2),
            0x0001_0000,
            header(Tag::Blob, 1),
            0x4142_0000, // nonzero padding: raw
            header(Tag::Float, 1),
            f32::NAN.to_bits() | 1, // NaN payload: raw
            header(Tag::Addr, 1),
            0x0a00_0001,
            header(Tag::Tuple, 9), // overruns: raw from here
            1,
        ];
        let mut out = String::new();
        let map = HeapMap::walk(&heap);
        map.print(&heap, &mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], r#"h0: str "ab\"""#);
        assert_eq!(lines[1], "h2: blob 0x0001");
        assert_eq!(lines[2], "h4: word 0x0a000001");
        assert_eq!(lines[3], "    word 0x41420000");
        assert_eq!(lines[6], "h8: addr 10.0.0.1");
        assert!(lines[7].starts_with("    word 0x0c000009"));
        assert_eq!(map.end, 10);
    }

    #[test]
    fn floats_roundtrip_or_fall_back() {
        for f in [1.5f32, -0.0, 1e-45, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, 0.1] {
            let s = float_literal(f.to_bits()).expect("literal");
            assert_eq!(s.parse::<f32>().map(f32::to_bits), Ok(f.to_bits()), "{s}");
        }
        assert_eq!(float_literal(f32::NAN.to_bits() | 1), None);
    }
}
