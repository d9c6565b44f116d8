//! The SNAP assembler: text → [`Repr`].
//!
//! The syntax is line oriented and follows the listings of the SNAP paper
//! (Fig. 1 and Fig. 2). `;` or `#` starts a comment that runs to the end of
//! the line.
//!
//! ```text
//! .src 10.0.0.1            ; header directives, anywhere in the file
//! .dst 10.0.0.2
//! .rb 16
//! .port 7
//! .stack 0, 7, blob "ping" ; initial stack, TOP FIRST
//!
//!         forw             ; instructions: mnemonic [operand]
//!         bne done         ; forward branch to a label (or `bne 5`)
//!         push 1
//! done:   demux
//!
//! .heap                    ; explicit heap objects, laid out in order
//! name:   str "clock.ms"
//! pair:   tuple [1, @name, ()]
//! ```
//!
//! # Directives
//! - `.entry LABEL|N` — entry point (default 0).
//! - `.rb N` — resource bound (default 16).
//! - `.src A.B.C.D`, `.dst A.B.C.D` — addresses (default 0.0.0.0).
//! - `.port N` — demux port (default 0).
//! - `.endian big|little` — byte order of the program words (default big).
//! - `.stack V, V, ...` — the initial stack, written top first as the paper
//!   writes `[0 :: port :: payload]`.
//! - `.heap` / `.code` — switch section (code is the default).
//! - `.word 0xHEX` — a raw word in the current section.
//!
//! # Labels
//! `name:` (spaces before the colon are allowed) names the next code word
//! (its instruction index) or, in the heap section, the next heap word (its
//! word offset). Names match `[A-Za-z_][A-Za-z0-9_.]*`.
//!
//! # Operands
//! By the opcode's [`ImmKind`]: branches (`bne`, `beq`, `ji`) take a relative
//! offset or a code label (the offset is computed and must be ≥ 1); `paj`
//! takes a signed adjustment; integer ops take an integer or a code label
//! (its absolute index, as in Fig. 2's `push r`); counts take a non-negative
//! integer; `pushb` takes `true`/`false`/`0`/`1`; `istag` takes a tag name or
//! number; `pushh` and `calls` take a heap offset, `@label`, or a constant
//! literal (`calls "clock.ms"`). `push` also accepts `true`, `false`, `()`,
//! an address, a float, a string, `blob "..."`/`blob 0x..` and `@label`,
//! which select `pushb`, `pushu` or `pushh` with a heap constant.
//!
//! # Values (in `.stack` and tuples)
//! Integers, `true`, `false`, `()`, code labels (their index, as an integer),
//! constants (`10.0.0.1`, `1.5`, `"text"`, `blob "..."`, `blob 0x0a0b`),
//! `@label` (a reference to a heap object), raw references `TAG@N` (e.g.
//! `blob@4`) and raw words `word 0xHEX`.
//!
//! # Heap entries
//! `[label:] addr A.B.C.D | float F | blob "..."|0x.. | str "..."|0x.. |
//! tuple [V, ...] | word 0xHEX`. Explicit objects come first, in source
//! order; constants created by operands and stack values follow, in order of
//! first appearance, deduplicated.
//!
//! String escapes: `\\ \" \n \t \r \0 \xHH`. Strings are byte strings:
//! `\xHH` is one byte, other characters are their UTF-8 bytes.

use crate::ops::{IMM_MASK, IMM_MAX, IMM_MIN, ImmKind, ImmOutOfRange, Insn, Op};
use crate::value::{Tag, Value, code_is_ref, header};
use crate::wire::Repr;
use core::fmt;
use core::net::Ipv4Addr;
use std::collections::HashMap;

/// Most words a section can hold (its length is a 16-bit header field).
pub const MAX_SECTION_WORDS: usize = u16::MAX as usize;

/// Default resource bound when `.rb` is absent.
pub const DEFAULT_RESOURCE_BOUND: u16 = 16;

/// An assembly error with its 1-based source position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {kind}")]
pub struct AsmError {
    /// 1-based line number.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What went wrong.
    pub kind: AsmErrorKind,
}

/// A packet section, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The code section.
    Code,
    /// The heap section.
    Heap,
    /// The initial stack.
    Stack,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Code => "code",
            Section::Heap => "heap",
            Section::Stack => "stack",
        })
    }
}

/// Whether a label names a code index or a heap offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelKind {
    /// Defined in the code section: an instruction index.
    Code,
    /// Defined in the heap section: a word offset.
    Heap,
}

impl fmt::Display for LabelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LabelKind::Code => "code",
            LabelKind::Heap => "heap",
        })
    }
}

/// Why the assembler rejected its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AsmErrorKind {
    /// A character that starts no token.
    #[error("unexpected character {0:?}")]
    UnexpectedChar(char),
    /// A string literal without its closing quote.
    #[error("unterminated string literal")]
    UnterminatedString,
    /// An unknown or malformed escape sequence in a string literal.
    #[error("bad escape sequence `\\{0}`")]
    BadEscape(char),
    /// A malformed numeric, address, float or hex literal.
    #[error("malformed literal `{0}`")]
    BadLiteral(String),
    /// The line does not start with a label, directive or instruction.
    #[error("expected a label, directive, instruction or heap entry")]
    ExpectedStatement,
    /// An unknown instruction mnemonic.
    #[error("unknown mnemonic `{0}`")]
    UnknownMnemonic(String),
    /// An unknown directive.
    #[error("unknown directive `.{0}`")]
    UnknownDirective(String),
    /// An unknown heap entry kind.
    #[error("unknown heap entry `{0}` (expected addr, float, blob, str, tuple or word)")]
    UnknownHeapEntry(String),
    /// A header directive given more than once.
    #[error("directive `.{name}` already given on line {first_line}")]
    DuplicateDirective {
        /// The directive.
        name: &'static str,
        /// Where it was first given.
        first_line: usize,
    },
    /// An instruction, directive or literal lacks its operand.
    #[error("missing operand: expected {0}")]
    MissingOperand(&'static str),
    /// An instruction without an immediate was given an operand.
    #[error("`{0}` takes no operand")]
    UnexpectedOperand(&'static str),
    /// Tokens after a complete statement.
    #[error("unexpected input after the end of the statement")]
    TrailingInput,
    /// An operand of the wrong kind.
    #[error("bad operand: expected {0}")]
    BadOperand(&'static str),
    /// A literal outside the range its field can hold.
    #[error("value {value} out of range {min}..={max}")]
    OutOfRange {
        /// The value given.
        value: i64,
        /// Smallest accepted value.
        min: i64,
        /// Largest accepted value.
        max: i64,
    },
    /// An immediate that does not fit its instruction.
    #[error("{0}")]
    ImmOutOfRange(ImmOutOfRange),
    /// A label that is never defined.
    #[error("undefined label `{0}`")]
    UndefinedLabel(String),
    /// A label defined twice.
    #[error("label `{name}` already defined on line {first_line}")]
    DuplicateLabel {
        /// The label.
        name: String,
        /// Where it was first defined.
        first_line: usize,
    },
    /// A code label used where a heap label is needed, or vice versa.
    #[error("`{name}` is a {found} label, expected a {expected} label")]
    WrongLabelKind {
        /// The label.
        name: String,
        /// The kind the operand needs.
        expected: LabelKind,
        /// The kind of the definition.
        found: LabelKind,
    },
    /// `@label` names a heap word that does not start an object.
    #[error("heap label `{0}` does not start a heap object")]
    NotAnObject(String),
    /// A branch whose offset is not at least 1 (SNAP branches go forward).
    #[error("branch offset {offset} does not go forward (must be at least 1)")]
    BackwardBranch {
        /// The offset the branch would have.
        offset: i64,
    },
    /// A section longer than its 16-bit length field.
    #[error("{section} section too long: {len} words (at most {MAX_SECTION_WORDS})")]
    SectionTooLong {
        /// The section.
        section: Section,
        /// Its length in words.
        len: usize,
    },
    /// The entry point is not inside the code.
    #[error("entry point {entry} outside code of {code_len} words")]
    EntryOutOfBounds {
        /// The entry point.
        entry: usize,
        /// Number of code words.
        code_len: usize,
    },
    /// The program has no code words.
    #[error("program has no code")]
    EmptyCode,
}

/// Assembles SNAP source text into a packet.
///
/// Never panics: every rejection is an [`AsmError`] with the position of the
/// offending token.
pub fn assemble(src: &str) -> Result<Repr, AsmError> {
    let mut asm = Assembler::default();
    for (i, text) in src.lines().enumerate() {
        asm.line(text, i + 1)?;
    }
    asm.finish()
}

// ---------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Pos {
    line: usize,
    col: usize,
}

impl Pos {
    fn err(self, kind: AsmErrorKind) -> AsmError {
        AsmError { line: self.line, col: self.col, kind }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok<'a> {
    /// `[A-Za-z_][A-Za-z0-9_.]*`
    Ident(&'a str),
    /// `.name`, without the dot.
    Dir(&'a str),
    /// Anything number-like: integers, hex, dotted quads, floats. Classified
    /// by the consumer, which knows what it expects.
    Num(&'a str),
    /// A string literal, escapes decoded.
    Str(Vec<u8>),
    Colon,
    Comma,
    LBrack,
    RBrack,
    LParen,
    RParen,
    At,
}

#[derive(Debug, Clone, PartialEq)]
struct Token<'a> {
    tok: Tok<'a>,
    pos: Pos,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits one line into tokens; returns them and the position just past the
/// last one.
fn tokenize(text: &str, line: usize) -> Result<(Vec<Token<'_>>, Pos), AsmError> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let ch = |i: usize| chars.get(i).map(|c| c.1);
    let slice = |a: usize, b: usize| {
        let byte = |i: usize| chars.get(i).map_or(text.len(), |c| c.0);
        text.get(byte(a)..byte(b)).unwrap_or("")
    };
    let mut toks = Vec::new();
    let mut end = Pos { line, col: 1 };
    let mut i = 0;
    while let Some(c) = ch(i) {
        let pos = Pos { line, col: i + 1 };
        let start = i;
        let punct = match c {
            ':' => Some(Tok::Colon),
            ',' => Some(Tok::Comma),
            '[' => Some(Tok::LBrack),
            ']' => Some(Tok::RBrack),
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '@' => Some(Tok::At),
            _ => None,
        };
        let tok = if let Some(p) = punct {
            i += 1;
            p
        } else if c.is_whitespace() {
            i += 1;
            continue;
        } else if c == ';' || c == '#' {
            break;
        } else if c == '"' {
            let (bytes, next) = string_literal(&chars, i, line)?;
            i = next;
            Tok::Str(bytes)
        } else if c == '.' && ch(i + 1).is_some_and(is_ident_start) {
            i += 1;
            while ch(i).is_some_and(is_ident_char) {
                i += 1;
            }
            Tok::Dir(slice(start + 1, i))
        } else if c.is_ascii_digit()
            || (matches!(c, '+' | '-' | '.') && ch(i + 1).is_some_and(|d| d.is_ascii_alphanumeric() || d == '.'))
        {
            i += 1;
            loop {
                match ch(i) {
                    Some(d) if is_ident_char(d) => i += 1,
                    Some('+' | '-') if matches!(ch(i - 1), Some('e' | 'E')) => i += 1,
                    _ => break,
                }
            }
            Tok::Num(slice(start, i))
        } else if is_ident_start(c) {
            while ch(i).is_some_and(is_ident_char) {
                i += 1;
            }
            Tok::Ident(slice(start, i))
        } else {
            return Err(pos.err(AsmErrorKind::UnexpectedChar(c)));
        };
        toks.push(Token { tok, pos });
        end = Pos { line, col: i + 1 };
    }
    Ok((toks, end))
}

/// Decodes the string literal whose opening quote is `chars[start]`; returns
/// its bytes and the index just past the closing quote.
fn string_literal(chars: &[(usize, char)], start: usize, line: usize) -> Result<(Vec<u8>, usize), AsmError> {
    let ch = |i: usize| chars.get(i).map(|c| c.1);
    let at = |i: usize| Pos { line, col: i + 1 };
    let mut out = Vec::new();
    let mut i = start + 1;
    loop {
        match ch(i) {
            None => return Err(at(start).err(AsmErrorKind::UnterminatedString)),
            Some('"') => return Ok((out, i + 1)),
            Some('\\') => {
                let Some(e) = ch(i + 1) else {
                    return Err(at(start).err(AsmErrorKind::UnterminatedString));
                };
                let byte = match e {
                    '\\' => b'\\',
                    '"' => b'"',
                    'n' => b'\n',
                    't' => b'\t',
                    'r' => b'\r',
                    '0' => 0,
                    'x' => {
                        let hex = |j: usize| ch(j).and_then(|c| c.to_digit(16));
                        match (hex(i + 2), hex(i + 3)) {
                            (Some(h), Some(l)) => {
                                i += 2;
                                // Two hex digits always fit a byte.
                                u8::try_from(h * 16 + l).unwrap_or(0)
                            }
                            _ => return Err(at(i).err(AsmErrorKind::BadEscape('x'))),
                        }
                    }
                    other => return Err(at(i).err(AsmErrorKind::BadEscape(other))),
                };
                out.push(byte);
                i += 2;
            }
            Some(c) => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += 1;
            }
        }
    }
}

/// A cursor over the tokens of one line.
struct Cursor<'a> {
    toks: Vec<Token<'a>>,
    i: usize,
    end: Pos,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<&Tok<'a>> {
        self.toks.get(self.i).map(|t| &t.tok)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok<'a>> {
        self.toks.get(self.i + k).map(|t| &t.tok)
    }

    /// Position of the next token, or just past the last one.
    fn pos(&self) -> Pos {
        self.toks.get(self.i).map_or(self.end, |t| t.pos)
    }

    /// Position of the token just consumed.
    fn last_pos(&self) -> Pos {
        self.i.checked_sub(1).and_then(|i| self.toks.get(i)).map_or(self.end, |t| t.pos)
    }

    fn at_end(&self) -> bool {
        self.i >= self.toks.len()
    }

    /// Takes the next token (its slot is left holding a placeholder).
    fn next(&mut self) -> Option<Token<'a>> {
        let t = self.toks.get_mut(self.i)?;
        self.i += 1;
        Some(Token { tok: core::mem::replace(&mut t.tok, Tok::Comma), pos: t.pos })
    }

    /// Takes the next token; `MissingOperand(what)` at the end of the line.
    fn expect(&mut self, what: &'static str) -> Result<Token<'a>, AsmError> {
        let end = self.pos();
        self.next().ok_or_else(|| end.err(AsmErrorKind::MissingOperand(what)))
    }

    /// Takes the next token, which must be `tok`.
    fn expect_punct(&mut self, tok: Tok<'static>, what: &'static str) -> Result<(), AsmError> {
        let t = self.expect(what)?;
        if t.tok == tok { Ok(()) } else { Err(t.pos.err(AsmErrorKind::BadOperand(what))) }
    }

    fn finish(&self) -> Result<(), AsmError> {
        if self.at_end() { Ok(()) } else { Err(self.pos().err(AsmErrorKind::TrailingInput)) }
    }
}

// ---------------------------------------------------------------------------
// Literals
// ---------------------------------------------------------------------------

/// Parses `[+-]?(0x HEX+ | DEC+)`.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..)?),
        Some(b'+') => (false, s.get(1..)?),
        _ => (false, s),
    };
    let (radix, digits) = match body.get(..2) {
        Some("0x" | "0X") => (16, body.get(2..)?),
        _ => (10, body),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let mag = i128::from(u64::from_str_radix(digits, radix).ok()?);
    i64::try_from(if neg { -mag } else { mag }).ok()
}

/// Parses a dotted quad `A.B.C.D` (decimal octets ≤ 255).
fn parse_quad(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// Parses a float literal (anything `f32::from_str` accepts that is not hex).
fn parse_float(s: &str) -> Option<f32> {
    if s.contains(['x', 'X']) {
        return None;
    }
    s.parse::<f32>().ok()
}

/// Parses `0x` followed by an even number of hex digits as bytes.
fn parse_hex_bytes(s: &str) -> Option<Vec<u8>> {
    let digits = match s.get(..2) {
        Some("0x" | "0X") => s.get(2..)?,
        _ => return None,
    };
    let nibbles: Option<Vec<u8>> = digits.chars().map(|c| c.to_digit(16).and_then(|d| u8::try_from(d).ok())).collect();
    let nibbles = nibbles?;
    if nibbles.len() % 2 != 0 {
        return None;
    }
    Some(nibbles.chunks(2).map(|p| (p[0] << 4) | p[1]).collect())
}

/// A number-like token, classified.
enum NumLit {
    Int(i64),
    Addr(Ipv4Addr),
    Float(f32),
}

fn classify_num(s: &str) -> Option<NumLit> {
    if let Some(a) = parse_quad(s) {
        Some(NumLit::Addr(a))
    } else if let Some(i) = parse_int(s) {
        Some(NumLit::Int(i))
    } else {
        parse_float(s).map(NumLit::Float)
    }
}

fn bad_literal(t: &Token<'_>, s: &str) -> AsmError {
    t.pos.err(AsmErrorKind::BadLiteral(s.to_owned()))
}

fn check_range(pos: Pos, value: i64, min: i64, max: i64) -> Result<i64, AsmError> {
    if (min..=max).contains(&value) { Ok(value) } else { Err(pos.err(AsmErrorKind::OutOfRange { value, min, max })) }
}

/// Packs bytes into words, big-endian within each word, zero padded.
fn pack_bytes(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks(4).map(|c| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        u32::from_be_bytes(w)
    })
}

/// Header plus payload words of a byte-array object.
fn bytes_object(tag: Tag, bytes: &[u8]) -> Vec<u32> {
    // Longer arrays cannot fit a section anyway; the caller's size check
    // rejects them.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    core::iter::once(header(tag, len)).chain(pack_bytes(bytes)).collect()
}

// ---------------------------------------------------------------------------
// Assembler state
// ---------------------------------------------------------------------------

/// An auto-created heap constant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ConstKey {
    Addr(u32),
    Float(u32),
    Blob(Vec<u8>),
    Str(Vec<u8>),
}

impl ConstKey {
    fn tag(&self) -> Tag {
        match self {
            ConstKey::Addr(_) => Tag::Addr,
            ConstKey::Float(_) => Tag::Float,
            ConstKey::Blob(_) => Tag::Blob,
            ConstKey::Str(_) => Tag::Str,
        }
    }

    fn words(&self) -> Vec<u32> {
        match self {
            ConstKey::Addr(a) => vec![header(Tag::Addr, 1), *a],
            ConstKey::Float(f) => vec![header(Tag::Float, 1), *f],
            ConstKey::Blob(b) => bytes_object(Tag::Blob, b),
            ConstKey::Str(b) => bytes_object(Tag::Str, b),
        }
    }

    fn len(&self) -> usize {
        match self {
            ConstKey::Addr(_) | ConstKey::Float(_) => 2,
            ConstKey::Blob(b) | ConstKey::Str(b) => 1 + b.len().div_ceil(4),
        }
    }
}

/// An instruction operand awaiting label and constant resolution.
#[derive(Debug, Clone)]
enum Operand<'a> {
    Imm(i64),
    CodeLabel(&'a str),
    HeapLabel(&'a str),
    Const(usize),
}

#[derive(Debug, Clone)]
enum CodeItem<'a> {
    Raw(u32),
    Insn { op: Op, operand: Operand<'a>, pos: Pos },
}

/// A stack value literal awaiting resolution.
#[derive(Debug, Clone)]
enum ValueLit<'a> {
    Word(u32),
    Const(usize),
    HeapLabel(&'a str),
    CodeLabel(&'a str),
}

#[derive(Debug, Clone)]
enum HeapItem<'a> {
    Raw(u32),
    Value(ValueLit<'a>, Pos),
}

#[derive(Debug, Clone, Copy)]
struct LabelDef {
    kind: LabelKind,
    value: usize,
    line: usize,
}

#[derive(Debug, Clone)]
enum Entry<'a> {
    Index(usize),
    Label(&'a str),
}

/// A header directive's value and where it was given.
type Given<T> = Option<(T, Pos)>;

#[derive(Default)]
struct Assembler<'a> {
    in_heap: bool,
    little_endian: Given<bool>,
    entry: Given<Entry<'a>>,
    rb: Given<u16>,
    port: Given<u16>,
    src: Given<Ipv4Addr>,
    dst: Given<Ipv4Addr>,
    /// Top first, as written.
    stack: Given<Vec<(ValueLit<'a>, Pos)>>,
    code: Vec<CodeItem<'a>>,
    heap: Vec<HeapItem<'a>>,
    /// Offsets of explicit heap objects and their types.
    objects: HashMap<usize, Tag>,
    labels: HashMap<&'a str, LabelDef>,
    consts: Vec<(ConstKey, Pos)>,
    const_ids: HashMap<ConstKey, usize>,
}

/// Records a header directive, rejecting a second occurrence.
fn set_once<T>(slot: &mut Given<T>, name: &'static str, value: T, pos: Pos) -> Result<(), AsmError> {
    if let Some((_, first)) = slot {
        return Err(pos.err(AsmErrorKind::DuplicateDirective { name, first_line: first.line }));
    }
    *slot = Some((value, pos));
    Ok(())
}

impl<'a> Assembler<'a> {
    fn line(&mut self, text: &'a str, lineno: usize) -> Result<(), AsmError> {
        let (toks, end) = tokenize(text, lineno)?;
        let mut cur = Cursor { toks, i: 0, end };
        while let (Some(&Tok::Ident(name)), Some(Tok::Colon)) = (cur.peek(), cur.peek_at(1)) {
            let pos = cur.pos();
            self.define_label(name, pos)?;
            cur.next();
            cur.next();
        }
        let Some(t) = cur.next() else {
            return Ok(());
        };
        match t.tok {
            Tok::Dir(d) => self.directive(d, t.pos, &mut cur)?,
            Tok::Ident(m) if self.in_heap => self.heap_entry(m, t.pos, &mut cur)?,
            Tok::Ident(m) => self.instruction(m, t.pos, &mut cur)?,
            _ => return Err(t.pos.err(AsmErrorKind::ExpectedStatement)),
        }
        cur.finish()
    }

    fn define_label(&mut self, name: &'a str, pos: Pos) -> Result<(), AsmError> {
        if let Some(first) = self.labels.get(name) {
            return Err(pos.err(AsmErrorKind::DuplicateLabel { name: name.to_owned(), first_line: first.line }));
        }
        let (kind, value) =
            if self.in_heap { (LabelKind::Heap, self.heap.len()) } else { (LabelKind::Code, self.code.len()) };
        self.labels.insert(name, LabelDef { kind, value, line: pos.line });
        Ok(())
    }

    // ---- directives -------------------------------------------------------

    fn directive(&mut self, d: &'a str, pos: Pos, cur: &mut Cursor<'a>) -> Result<(), AsmError> {
        match d {
            "entry" => {
                let t = cur.expect("an entry point (label or index)")?;
                let e = match t.tok {
                    Tok::Ident(l) => Entry::Label(l),
                    Tok::Num(s) => {
                        let v = parse_int(s).ok_or_else(|| bad_literal(&t, s))?;
                        let v = check_range(t.pos, v, 0, i64::from(u16::MAX))?;
                        Entry::Index(usize::try_from(v).unwrap_or(usize::MAX))
                    }
                    _ => {
                        return Err(t.pos.err(AsmErrorKind::BadOperand("an entry point (label or index)")));
                    }
                };
                set_once(&mut self.entry, "entry", e, pos)
            }
            "rb" => {
                let v = u16_operand(cur, "a resource bound")?;
                set_once(&mut self.rb, "rb", v, pos)
            }
            "port" => {
                let v = u16_operand(cur, "a port number")?;
                set_once(&mut self.port, "port", v, pos)
            }
            "src" => {
                let a = addr_operand(cur)?;
                set_once(&mut self.src, "src", a, pos)
            }
            "dst" => {
                let a = addr_operand(cur)?;
                set_once(&mut self.dst, "dst", a, pos)
            }
            "endian" => {
                const WHAT: &str = "`big` or `little`";
                let t = cur.expect(WHAT)?;
                let le = match t.tok {
                    Tok::Ident("big") => false,
                    Tok::Ident("little") => true,
                    _ => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
                };
                set_once(&mut self.little_endian, "endian", le, pos)
            }
            "stack" => {
                let mut vals = Vec::new();
                if !cur.at_end() {
                    loop {
                        let vpos = cur.pos();
                        let v = self.value_lit(cur)?;
                        vals.push((v, vpos));
                        if cur.peek() == Some(&Tok::Comma) {
                            cur.next();
                        } else {
                            break;
                        }
                    }
                }
                if vals.len() > MAX_SECTION_WORDS {
                    return Err(pos.err(AsmErrorKind::SectionTooLong { section: Section::Stack, len: vals.len() }));
                }
                set_once(&mut self.stack, "stack", vals, pos)
            }
            "heap" => {
                self.in_heap = true;
                Ok(())
            }
            "code" => {
                self.in_heap = false;
                Ok(())
            }
            "word" => {
                let w = word_operand(cur)?;
                if self.in_heap {
                    self.push_heap(vec![HeapItem::Raw(w)], pos)
                } else {
                    self.push_code(CodeItem::Raw(w), pos)
                }
            }
            _ => Err(pos.err(AsmErrorKind::UnknownDirective(d.to_owned()))),
        }
    }

    // ---- code -------------------------------------------------------------

    fn push_code(&mut self, item: CodeItem<'a>, pos: Pos) -> Result<(), AsmError> {
        if self.code.len() >= MAX_SECTION_WORDS {
            return Err(pos.err(AsmErrorKind::SectionTooLong { section: Section::Code, len: self.code.len() + 1 }));
        }
        self.code.push(item);
        Ok(())
    }

    fn instruction(&mut self, m: &'a str, pos: Pos, cur: &mut Cursor<'a>) -> Result<(), AsmError> {
        let op = Op::from_mnemonic(m).ok_or_else(|| pos.err(AsmErrorKind::UnknownMnemonic(m.to_owned())))?;
        let opos = cur.pos();
        let (op, operand) = match op.imm_kind() {
            ImmKind::None => {
                if !cur.at_end() {
                    return Err(opos.err(AsmErrorKind::UnexpectedOperand(op.mnemonic())));
                }
                (op, Operand::Imm(0))
            }
            _ if op == Op::Push => self.push_operand(cur)?,
            ImmKind::Int | ImmKind::Offset => (op, int_or_label(cur)?),
            ImmKind::Adjust => (op, Operand::Imm(int_operand(cur, "a signed adjustment")?)),
            ImmKind::Count => (op, Operand::Imm(int_operand(cur, "a count")?)),
            ImmKind::Bool => {
                const WHAT: &str = "`true`, `false`, 0 or 1";
                let t = cur.expect(WHAT)?;
                let v = match t.tok {
                    Tok::Ident("true") => 1,
                    Tok::Ident("false") => 0,
                    Tok::Num(s) => parse_int(s).ok_or_else(|| bad_literal(&t, s))?,
                    _ => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
                };
                (op, Operand::Imm(v))
            }
            ImmKind::Tag => {
                const WHAT: &str = "a tag name or number";
                let t = cur.expect(WHAT)?;
                let v = match t.tok {
                    Tok::Ident(name) => match Tag::from_name(name) {
                        Some(tag) => i64::from(tag as u8),
                        None => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
                    },
                    Tok::Num(s) => parse_int(s).ok_or_else(|| bad_literal(&t, s))?,
                    _ => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
                };
                (op, Operand::Imm(v))
            }
            ImmKind::HeapRef => (op, self.heap_operand(cur)?),
        };
        self.push_code(CodeItem::Insn { op, operand, pos: opos }, pos)
    }

    /// `push`'s operand, which may select `pushb`, `pushu` or `pushh`.
    fn push_operand(&mut self, cur: &mut Cursor<'a>) -> Result<(Op, Operand<'a>), AsmError> {
        let blob_lit = matches!(cur.peek_at(1), Some(Tok::Str(_) | Tok::Num(_)));
        let simple = match cur.peek() {
            None => {
                return Err(cur.pos().err(AsmErrorKind::MissingOperand("an integer, label or literal")));
            }
            Some(Tok::Ident("true")) => Some((Op::PushB, Operand::Imm(1))),
            Some(Tok::Ident("false")) => Some((Op::PushB, Operand::Imm(0))),
            Some(Tok::Num(s)) => parse_int(s).map(|v| (Op::Push, Operand::Imm(v))),
            Some(Tok::Ident("blob")) if blob_lit => None,
            Some(&Tok::Ident(l)) => Some((Op::Push, Operand::CodeLabel(l))),
            Some(Tok::LParen) => {
                cur.next();
                cur.expect_punct(Tok::RParen, "`)`")?;
                return Ok((Op::PushU, Operand::Imm(0)));
            }
            _ => None,
        };
        match simple {
            Some(r) => {
                cur.next();
                Ok(r)
            }
            None => Ok((Op::PushH, self.heap_operand(cur)?)),
        }
    }

    /// A heap reference operand: offset, `@label` or constant literal.
    fn heap_operand(&mut self, cur: &mut Cursor<'a>) -> Result<Operand<'a>, AsmError> {
        const WHAT: &str = "a heap offset, `@label` or constant";
        let pos = cur.pos();
        let t = cur.expect(WHAT)?;
        match t.tok {
            Tok::At => Ok(Operand::HeapLabel(heap_label_name(cur)?)),
            Tok::Str(b) => Ok(Operand::Const(self.intern(ConstKey::Str(b), pos)?)),
            Tok::Ident("blob") => {
                let b = bytes_operand(cur)?;
                Ok(Operand::Const(self.intern(ConstKey::Blob(b), pos)?))
            }
            Tok::Num(s) => match classify_num(s) {
                Some(NumLit::Int(v)) => Ok(Operand::Imm(v)),
                Some(NumLit::Addr(a)) => Ok(Operand::Const(self.intern(ConstKey::Addr(a.to_bits()), pos)?)),
                Some(NumLit::Float(f)) => Ok(Operand::Const(self.intern(ConstKey::Float(f.to_bits()), pos)?)),
                None => Err(bad_literal(&t, s)),
            },
            _ => Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
        }
    }

    /// Creates or reuses a heap constant; returns its index.
    fn intern(&mut self, key: ConstKey, pos: Pos) -> Result<usize, AsmError> {
        if let Some(&id) = self.const_ids.get(&key) {
            return Ok(id);
        }
        let len = key.len();
        if len > MAX_SECTION_WORDS {
            return Err(pos.err(AsmErrorKind::SectionTooLong { section: Section::Heap, len }));
        }
        let id = self.consts.len();
        self.const_ids.insert(key.clone(), id);
        self.consts.push((key, pos));
        Ok(id)
    }

    // ---- values -----------------------------------------------------------

    /// One stack value literal (in `.stack` and tuples).
    fn value_lit(&mut self, cur: &mut Cursor<'a>) -> Result<ValueLit<'a>, AsmError> {
        const WHAT: &str = "a value";
        let pos = cur.pos();
        let next_is_bytes = matches!(cur.peek_at(1), Some(Tok::Str(_) | Tok::Num(_)));
        let next_is_at = cur.peek_at(1) == Some(&Tok::At);
        let t = cur.expect(WHAT)?;
        Ok(match t.tok {
            Tok::Num(s) => match classify_num(s) {
                Some(NumLit::Int(v)) => {
                    let v = check_range(t.pos, v, i64::from(IMM_MIN), i64::from(IMM_MAX))?;
                    ValueLit::Word(Value::int(i32::try_from(v).unwrap_or(0)).0)
                }
                Some(NumLit::Addr(a)) => ValueLit::Const(self.intern(ConstKey::Addr(a.to_bits()), pos)?),
                Some(NumLit::Float(f)) => ValueLit::Const(self.intern(ConstKey::Float(f.to_bits()), pos)?),
                None => return Err(bad_literal(&t, s)),
            },
            Tok::Str(b) => ValueLit::Const(self.intern(ConstKey::Str(b), pos)?),
            Tok::LParen => {
                cur.expect_punct(Tok::RParen, "`)`")?;
                ValueLit::Word(Value::UNIT.0)
            }
            Tok::At => ValueLit::HeapLabel(heap_label_name(cur)?),
            Tok::Ident("true") => ValueLit::Word(Value::bool(true).0),
            Tok::Ident("false") => ValueLit::Word(Value::bool(false).0),
            Tok::Ident("blob") if next_is_bytes => {
                let b = bytes_operand(cur)?;
                ValueLit::Const(self.intern(ConstKey::Blob(b), pos)?)
            }
            Tok::Ident("word") if next_is_bytes => ValueLit::Word(word_operand(cur)?),
            Tok::Ident(name) if next_is_at => {
                let tag =
                    Tag::from_name(name).ok_or_else(|| t.pos.err(AsmErrorKind::BadOperand("a tag name before `@`")))?;
                cur.next();
                let n = int_operand(cur, "a datum")?;
                let n = check_range(cur.last_pos(), n, 0, i64::from(IMM_MASK))?;
                ValueLit::Word(Value::new(tag, u32::try_from(n).unwrap_or(0)).0)
            }
            Tok::Ident(name) => ValueLit::CodeLabel(name),
            _ => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
        })
    }

    // ---- heap -------------------------------------------------------------

    fn push_heap(&mut self, words: Vec<HeapItem<'a>>, pos: Pos) -> Result<(), AsmError> {
        let len = self.heap.len() + words.len();
        if len > MAX_SECTION_WORDS {
            return Err(pos.err(AsmErrorKind::SectionTooLong { section: Section::Heap, len }));
        }
        self.heap.extend(words);
        Ok(())
    }

    fn push_object(&mut self, tag: Tag, words: Vec<HeapItem<'a>>, pos: Pos) -> Result<(), AsmError> {
        let off = self.heap.len();
        self.push_heap(words, pos)?;
        self.objects.insert(off, tag);
        Ok(())
    }

    fn heap_entry(&mut self, kind: &'a str, pos: Pos, cur: &mut Cursor<'a>) -> Result<(), AsmError> {
        let raw = |ws: Vec<u32>| ws.into_iter().map(HeapItem::Raw).collect::<Vec<_>>();
        match kind {
            "word" => {
                let w = word_operand(cur)?;
                self.push_heap(vec![HeapItem::Raw(w)], pos)
            }
            "addr" => {
                let a = addr_operand(cur)?;
                let words = raw(vec![header(Tag::Addr, 1), a.to_bits()]);
                self.push_object(Tag::Addr, words, pos)
            }
            "float" => {
                const WHAT: &str = "a float";
                let t = cur.expect(WHAT)?;
                let f = match t.tok {
                    Tok::Num(s) | Tok::Ident(s) => parse_float(s).ok_or_else(|| bad_literal(&t, s))?,
                    _ => return Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
                };
                let words = raw(vec![header(Tag::Float, 1), f.to_bits()]);
                self.push_object(Tag::Float, words, pos)
            }
            "blob" | "str" => {
                let tag = if kind == "blob" { Tag::Blob } else { Tag::Str };
                let b = bytes_operand(cur)?;
                if b.len() > MAX_SECTION_WORDS * 4 {
                    return Err(
                        pos.err(AsmErrorKind::SectionTooLong { section: Section::Heap, len: b.len().div_ceil(4) })
                    );
                }
                self.push_object(tag, raw(bytes_object(tag, &b)), pos)
            }
            "tuple" => {
                cur.expect_punct(Tok::LBrack, "`[`")?;
                let mut elems = Vec::new();
                if cur.peek() == Some(&Tok::RBrack) {
                    cur.next();
                } else {
                    loop {
                        let vpos = cur.pos();
                        let v = self.value_lit(cur)?;
                        elems.push(HeapItem::Value(v, vpos));
                        let t = cur.expect("`,` or `]`")?;
                        match t.tok {
                            Tok::Comma => {}
                            Tok::RBrack => break,
                            _ => return Err(t.pos.err(AsmErrorKind::BadOperand("`,` or `]`"))),
                        }
                    }
                }
                let n = u32::try_from(elems.len()).unwrap_or(u32::MAX);
                let mut words = vec![HeapItem::Raw(header(Tag::Tuple, n))];
                words.extend(elems);
                self.push_object(Tag::Tuple, words, pos)
            }
            _ => Err(pos.err(AsmErrorKind::UnknownHeapEntry(kind.to_owned()))),
        }
    }

    // ---- resolution -------------------------------------------------------

    fn label(&self, name: &str, pos: Pos, expected: LabelKind) -> Result<usize, AsmError> {
        let def = self.labels.get(name).ok_or_else(|| pos.err(AsmErrorKind::UndefinedLabel(name.to_owned())))?;
        if def.kind != expected {
            return Err(pos.err(AsmErrorKind::WrongLabelKind { name: name.to_owned(), expected, found: def.kind }));
        }
        Ok(def.value)
    }

    /// The type of the heap object starting at `off`, if one does.
    fn object_tag(&self, off: usize) -> Option<Tag> {
        if let Some(&t) = self.objects.get(&off) {
            return Some(t);
        }
        match self.heap.get(off) {
            Some(&HeapItem::Raw(w)) if code_is_ref(w >> 25) => Tag::from_code((w >> 25) as u8),
            _ => None,
        }
    }

    fn value_word(&self, v: &ValueLit<'a>, pos: Pos, const_off: &[usize]) -> Result<u32, AsmError> {
        Ok(match *v {
            ValueLit::Word(w) => w,
            ValueLit::Const(id) => {
                let tag = self.consts.get(id).map_or(Tag::Unit, |c| c.0.tag());
                Value::heap(tag, offset_u32(const_off.get(id).copied().unwrap_or(0))).0
            }
            ValueLit::HeapLabel(name) => {
                let off = self.label(name, pos, LabelKind::Heap)?;
                let tag = self.object_tag(off).ok_or_else(|| pos.err(AsmErrorKind::NotAnObject(name.to_owned())))?;
                Value::heap(tag, offset_u32(off)).0
            }
            ValueLit::CodeLabel(name) => {
                let idx = self.label(name, pos, LabelKind::Code)?;
                Value::int(i32::try_from(idx).unwrap_or(0)).0
            }
        })
    }

    fn finish(self) -> Result<Repr, AsmError> {
        if self.code.is_empty() {
            return Err(Pos { line: 1, col: 1 }.err(AsmErrorKind::EmptyCode));
        }
        // Constants go after the explicit heap.
        let mut const_off = Vec::with_capacity(self.consts.len());
        let mut heap_len = self.heap.len();
        for (k, pos) in &self.consts {
            const_off.push(heap_len);
            heap_len += k.len();
            if heap_len > MAX_SECTION_WORDS {
                return Err(pos.err(AsmErrorKind::SectionTooLong { section: Section::Heap, len: heap_len }));
            }
        }

        let mut code = Vec::with_capacity(self.code.len());
        for (i, item) in self.code.iter().enumerate() {
            let (op, operand, pos) = match item {
                CodeItem::Raw(w) => {
                    code.push(*w);
                    continue;
                }
                CodeItem::Insn { op, operand, pos } => (*op, operand, *pos),
            };
            let kind = op.imm_kind();
            let value = match *operand {
                Operand::Imm(v) => v,
                Operand::CodeLabel(name) => {
                    let target = self.label(name, pos, LabelKind::Code)?;
                    let target = i64::try_from(target).unwrap_or(i64::MAX);
                    if kind == ImmKind::Offset { target - i64::try_from(i).unwrap_or(0) } else { target }
                }
                Operand::HeapLabel(name) => {
                    let off = self.label(name, pos, LabelKind::Heap)?;
                    i64::try_from(off).unwrap_or(i64::MAX)
                }
                Operand::Const(id) => i64::try_from(const_off.get(id).copied().unwrap_or(0)).unwrap_or(0),
            };
            if kind == ImmKind::Offset && value < 1 {
                return Err(pos.err(AsmErrorKind::BackwardBranch { offset: value }));
            }
            let insn = Insn::new(op, value).map_err(|e| pos.err(AsmErrorKind::ImmOutOfRange(e)))?;
            code.push(insn.encode());
        }

        let mut heap = Vec::with_capacity(heap_len);
        for item in &self.heap {
            heap.push(match item {
                HeapItem::Raw(w) => *w,
                HeapItem::Value(v, pos) => self.value_word(v, *pos, &const_off)?,
            });
        }
        for (k, _) in &self.consts {
            heap.extend(k.words());
        }

        let mut stack = Vec::new();
        if let Some((vals, _)) = &self.stack {
            stack.reserve(vals.len());
            for (v, pos) in vals.iter().rev() {
                stack.push(self.value_word(v, *pos, &const_off)?);
            }
        }

        let entry = match &self.entry {
            None => 0,
            Some((Entry::Index(n), pos)) => {
                if *n >= code.len() {
                    return Err(pos.err(AsmErrorKind::EntryOutOfBounds { entry: *n, code_len: code.len() }));
                }
                *n
            }
            Some((Entry::Label(name), pos)) => {
                let n = self.label(name, *pos, LabelKind::Code)?;
                if n >= code.len() {
                    return Err(pos.err(AsmErrorKind::EntryOutOfBounds { entry: n, code_len: code.len() }));
                }
                n
            }
        };

        Ok(Repr {
            little_endian: self.little_endian.is_some_and(|(le, _)| le),
            // Both bounded by MAX_SECTION_WORDS above.
            entry: u16::try_from(entry).unwrap_or(0),
            resource_bound: self.rb.map_or(DEFAULT_RESOURCE_BOUND, |(v, _)| v),
            port: self.port.map_or(0, |(v, _)| v),
            src: self.src.map_or(Ipv4Addr::UNSPECIFIED, |(a, _)| a),
            dst: self.dst.map_or(Ipv4Addr::UNSPECIFIED, |(a, _)| a),
            code,
            heap,
            stack,
        })
    }
}

/// Heap offsets are bounded by [`MAX_SECTION_WORDS`], so they fit a datum.
fn offset_u32(off: usize) -> u32 {
    u32::try_from(off).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Operand helpers
// ---------------------------------------------------------------------------

fn int_operand(cur: &mut Cursor<'_>, what: &'static str) -> Result<i64, AsmError> {
    let t = cur.expect(what)?;
    match t.tok {
        Tok::Num(s) => parse_int(s).ok_or_else(|| bad_literal(&t, s)),
        _ => Err(t.pos.err(AsmErrorKind::BadOperand(what))),
    }
}

fn u16_operand(cur: &mut Cursor<'_>, what: &'static str) -> Result<u16, AsmError> {
    let pos = cur.pos();
    let v = int_operand(cur, what)?;
    let v = check_range(pos, v, 0, i64::from(u16::MAX))?;
    Ok(u16::try_from(v).unwrap_or(0))
}

fn word_operand(cur: &mut Cursor<'_>) -> Result<u32, AsmError> {
    let pos = cur.pos();
    let v = int_operand(cur, "a 32-bit word")?;
    let v = check_range(pos, v, 0, i64::from(u32::MAX))?;
    Ok(u32::try_from(v).unwrap_or(0))
}

fn addr_operand(cur: &mut Cursor<'_>) -> Result<Ipv4Addr, AsmError> {
    const WHAT: &str = "an address A.B.C.D";
    let t = cur.expect(WHAT)?;
    match t.tok {
        Tok::Num(s) => parse_quad(s).ok_or_else(|| bad_literal(&t, s)),
        _ => Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
    }
}

/// A quoted string or `0x` hex bytes.
fn bytes_operand(cur: &mut Cursor<'_>) -> Result<Vec<u8>, AsmError> {
    const WHAT: &str = "a string or 0x hex bytes";
    let t = cur.expect(WHAT)?;
    match t.tok {
        Tok::Str(b) => Ok(b),
        Tok::Num(s) => parse_hex_bytes(s).ok_or_else(|| bad_literal(&t, s)),
        _ => Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
    }
}

/// The label name after `@`.
fn heap_label_name<'a>(cur: &mut Cursor<'a>) -> Result<&'a str, AsmError> {
    const WHAT: &str = "a heap label after `@`";
    let t = cur.expect(WHAT)?;
    match t.tok {
        Tok::Ident(l) => Ok(l),
        _ => Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
    }
}

/// An integer or a code label.
fn int_or_label<'a>(cur: &mut Cursor<'a>) -> Result<Operand<'a>, AsmError> {
    const WHAT: &str = "an integer or code label";
    let t = cur.expect(WHAT)?;
    match t.tok {
        Tok::Num(s) => parse_int(s).map(Operand::Imm).ok_or_else(|| bad_literal(&t, s)),
        Tok::Ident(l) => Ok(Operand::CodeLabel(l)),
        _ => Err(t.pos.err(AsmErrorKind::BadOperand(WHAT))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> AsmError {
        match assemble(src) {
            Ok(r) => panic!("expected an error, got {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn tokenizer_basics() {
        let (t, end) = tokenize(r#"r : push blob@4, "a\x41\n" ; c"#, 3).expect("tokens");
        let toks: Vec<_> = t.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(
            toks,
            vec![
                Tok::Ident("r"),
                Tok::Colon,
                Tok::Ident("push"),
                Tok::Ident("blob"),
                Tok::At,
                Tok::Num("4"),
                Tok::Comma,
                Tok::Str(b"aA\n".to_vec()),
            ]
        );
        assert_eq!(t[2].pos, Pos { line: 3, col: 5 });
        assert_eq!(end.col, 27);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_int("-0x10"), Some(-16));
        assert_eq!(parse_int("+7"), Some(7));
        assert_eq!(parse_int("0x+5"), None);
        assert_eq!(parse_int("0x"), None);
        assert_eq!(parse_int("99999999999999999999"), None);
        assert_eq!(parse_quad("10.0.0.1"), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(parse_quad("10.0.0.256"), None);
        assert_eq!(parse_quad("10.0.0"), None);
        assert!(matches!(classify_num("1.5"), Some(NumLit::Float(f)) if f == 1.5));
        assert!(matches!(classify_num("1e-3"), Some(NumLit::Float(_))));
        assert!(classify_num("1.2.3").is_none());
        assert_eq!(parse_hex_bytes("0x0aff"), Some(vec![0x0a, 0xff]));
        assert_eq!(parse_hex_bytes("0x0af"), None);
        assert_eq!(parse_hex_bytes("0x"), Some(vec![]));
    }

    #[test]
    fn constants_are_deduplicated_after_explicit_heap() {
        let r = assemble(".stack \"a\", 10.0.0.1\npush 10.0.0.1\ncalls \"a\"\npush 1.5\n.heap\nx: word 0x1\n")
            .expect("assembles");
        // explicit word, then "a" (stack), 10.0.0.1 (stack), 1.5 (code)
        assert_eq!(
            r.heap,
            vec![
                1,
                header(Tag::Str, 1),
                u32::from_be_bytes(*b"a\0\0\0"),
                header(Tag::Addr, 1),
                0x0a00_0001,
                header(Tag::Float, 1),
                1.5f32.to_bits(),
            ]
        );
        assert_eq!(r.code[0], Insn::new(Op::PushH, 3).expect("imm").encode());
        assert_eq!(r.code[1], Insn::new(Op::Calls, 1).expect("imm").encode());
        assert_eq!(r.code[2], Insn::new(Op::PushH, 5).expect("imm").encode());
        assert_eq!(r.stack, vec![Value::heap(Tag::Addr, 3).0, Value::heap(Tag::Str, 1).0]);
    }

    #[test]
    fn positions() {
        let e = err("nop\n  bogus 1\n");
        assert_eq!((e.line, e.col), (2, 3));
        assert_eq!(e.to_string(), "2:3: unknown mnemonic `bogus`");
        let e = err("push");
        assert_eq!((e.line, e.col), (1, 5));
        assert_eq!(e.kind, AsmErrorKind::MissingOperand("an integer, label or literal"));
    }

    #[test]
    fn tuple_values() {
        let r = assemble("nop\n.heap\nt: tuple [1, true, (), @s, blob@9, word 0xffffffff, \"k\"]\ns: str \"\"\n")
            .expect("assembles");
        assert_eq!(
            r.heap,
            vec![
                header(Tag::Tuple, 7),
                Value::int(1).0,
                Value::bool(true).0,
                Value::UNIT.0,
                Value::heap(Tag::Str, 8).0,
                Value::heap(Tag::Blob, 9).0,
                0xffff_ffff,
                Value::heap(Tag::Str, 9).0,
                header(Tag::Str, 0),
                header(Tag::Str, 1),
                u32::from_be_bytes(*b"k\0\0\0"),
            ]
        );
    }
}
