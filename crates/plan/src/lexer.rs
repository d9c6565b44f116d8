//! The lexer: source text → tokens with positions.
//!
//! Comments are ML's `(* ... *)` and nest. Numbers: `12` is an integer,
//! `1.5` a float, `10.0.0.1` a host address. `"..."` is a string and
//! `b"..."` a blob; escapes are `\\ \" \n \t \r \0 \xHH`.

use crate::error::{PErr, PResult, Pos};
use core::net::Ipv4Addr;

/// Largest source accepted, in bytes.
pub const MAX_SOURCE: usize = 256 * 1024;
/// Most tokens accepted.
pub const MAX_TOKENS: usize = 64 * 1024;

/// A token.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// Integer literal (unsigned; `-`/`~` are operators).
    Int(i64),
    /// Float literal.
    Float(f32),
    /// Host address literal.
    Host(Ipv4Addr),
    /// String literal.
    Str(Vec<u8>),
    /// Blob literal `b"..."`.
    Blob(Vec<u8>),
    /// Identifier.
    Ident(String),
    /// Keyword.
    Kw(&'static str),
    /// Punctuation or operator.
    Sym(&'static str),
    /// End of input.
    Eof,
}

const KEYWORDS: &[&str] = &[
    "fun", "let", "val", "in", "end", "if", "then", "else", "andalso", "orelse", "not", "mod", "true", "false", "int",
    "bool", "unit", "float", "host", "blob", "string", "list",
];

// Longest first, so `::` wins over `:` and `<=` over `<`.
const SYMBOLS: &[&str] =
    &["::", "<>", "<=", ">=", "(", ")", "[", "]", ",", ";", ":", "=", "<", ">", "+", "-", "*", "/", "~", "#", "|"];

/// A token and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// Its first character.
    pub pos: Pos,
}

struct Lexer<'a> {
    src: &'a [u8],
    i: usize,
    line: u32,
    col: u32,
}

impl Lexer<'_> {
    fn pos(&self) -> Pos {
        Pos { line: self.line, col: self.col }
    }
    fn peek(&self, k: usize) -> Option<u8> {
        self.src.get(self.i + k).copied()
    }
    fn bump(&mut self) -> Option<u8> {
        let b = self.peek(0)?;
        self.i += 1;
        if b == b'\n' {
            self.line = self.line.saturating_add(1);
            self.col = 1;
        } else if b & 0xc0 != 0x80 {
            // Count characters, not UTF-8 continuation bytes.
            self.col = self.col.saturating_add(1);
        }
        Some(b)
    }

    fn skip_space(&mut self) -> PResult<()> {
        loop {
            match self.peek(0) {
                Some(b' ' | b'\t' | b'\r' | b'\n') => {
                    self.bump();
                }
                Some(b'(') if self.peek(1) == Some(b'*') => {
                    let start = self.pos();
                    self.bump();
                    self.bump();
                    let mut depth = 1u32;
                    while depth > 0 {
                        match self.bump() {
                            None => return Err(PErr::syntax(start, "comment `(*` is never closed with `*)`")),
                            Some(b'(') if self.peek(0) == Some(b'*') => {
                                self.bump();
                                depth = depth.saturating_add(1);
                            }
                            Some(b'*') if self.peek(0) == Some(b')') => {
                                self.bump();
                                depth -= 1;
                            }
                            _ => {}
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn string(&mut self, start: Pos) -> PResult<Vec<u8>> {
        // The opening quote has been consumed.
        let mut out = Vec::new();
        loop {
            let at = self.pos();
            match self.bump() {
                None | Some(b'\n') => return Err(PErr::syntax(start, "string literal is not closed with `\"`")),
                Some(b'"') => return Ok(out),
                Some(b'\\') => {
                    let c = self.bump();
                    match c {
                        Some(b'\\') => out.push(b'\\'),
                        Some(b'"') => out.push(b'"'),
                        Some(b'n') => out.push(b'\n'),
                        Some(b't') => out.push(b'\t'),
                        Some(b'r') => out.push(b'\r'),
                        Some(b'0') => out.push(0),
                        Some(b'x') => {
                            let h = |b: Option<u8>| b.and_then(|b| char::from(b).to_digit(16));
                            match (h(self.bump()), h(self.bump())) {
                                (Some(a), Some(b)) => out.push((a * 16 + b) as u8),
                                _ => return Err(PErr::syntax(at, "`\\x` must be followed by two hex digits")),
                            }
                        }
                        _ => return Err(PErr::syntax(at, "unknown escape; use \\\\ \\\" \\n \\t \\r \\0 or \\xHH")),
                    }
                }
                Some(b) => out.push(b),
            }
        }
    }

    fn number(&mut self, start: Pos) -> PResult<Tok> {
        let s = self.i;
        while matches!(self.peek(0), Some(b'0'..=b'9' | b'.')) {
            // A dot must be followed by a digit to belong to the number.
            if self.peek(0) == Some(b'.') && !matches!(self.peek(1), Some(b'0'..=b'9')) {
                break;
            }
            self.bump();
        }
        let text = core::str::from_utf8(&self.src[s..self.i]).unwrap_or("");
        let dots = text.bytes().filter(|&b| b == b'.').count();
        let bad = || PErr::syntax(start, format!("bad number `{text}`"));
        match dots {
            0 => text
                .parse::<i64>()
                .map(Tok::Int)
                .map_err(|_| PErr::syntax(start, format!("integer `{text}` is too large"))),
            1 => text.parse::<f32>().map(Tok::Float).map_err(|_| bad()),
            3 => text.parse::<Ipv4Addr>().map(Tok::Host).map_err(|_| {
                PErr::syntax(start, format!("bad host address `{text}` (four numbers 0-255 separated by dots)"))
            }),
            _ => Err(bad()),
        }
    }
}

/// Splits `src` into tokens; the last is [`Tok::Eof`].
pub(crate) fn lex(src: &str) -> PResult<Vec<Token>> {
    if src.len() > MAX_SOURCE {
        return Err(PErr::limit(
            Pos { line: 1, col: 1 },
            format!("source is {} bytes, more than {MAX_SOURCE}", src.len()),
        ));
    }
    let mut lx = Lexer { src: src.as_bytes(), i: 0, line: 1, col: 1 };
    let mut out = Vec::new();
    loop {
        lx.skip_space()?;
        let pos = lx.pos();
        if out.len() >= MAX_TOKENS {
            return Err(PErr::limit(pos, format!("more than {MAX_TOKENS} tokens")));
        }
        let Some(c) = lx.peek(0) else {
            out.push(Token { tok: Tok::Eof, pos });
            return Ok(out);
        };
        let tok = match c {
            b'0'..=b'9' => lx.number(pos)?,
            b'"' => {
                lx.bump();
                Tok::Str(lx.string(pos)?)
            }
            b'b' if lx.peek(1) == Some(b'"') => {
                lx.bump();
                lx.bump();
                Tok::Blob(lx.string(pos)?)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let s = lx.i;
                while matches!(lx.peek(0), Some(b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'\'')) {
                    lx.bump();
                }
                let word = core::str::from_utf8(&lx.src[s..lx.i]).unwrap_or("");
                match KEYWORDS.iter().find(|k| **k == word) {
                    Some(k) => Tok::Kw(k),
                    None => Tok::Ident(word.to_owned()),
                }
            }
            _ => {
                let rest = &lx.src[lx.i..];
                match SYMBOLS.iter().find(|s| rest.starts_with(s.as_bytes())) {
                    Some(s) => {
                        for _ in 0..s.len() {
                            lx.bump();
                        }
                        Tok::Sym(s)
                    }
                    None => {
                        let ch = src.get(lx.i..).and_then(|r| r.chars().next()).unwrap_or('?');
                        return Err(PErr::syntax(pos, format!("unexpected character `{}`", ch.escape_default())));
                    }
                }
            }
        };
        out.push(Token { tok, pos });
    }
}

impl core::fmt::Display for Tok {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Tok::Int(i) => write!(f, "`{i}`"),
            Tok::Float(x) => write!(f, "`{x}`"),
            Tok::Host(a) => write!(f, "`{a}`"),
            Tok::Str(_) => f.write_str("a string"),
            Tok::Blob(_) => f.write_str("a blob"),
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Kw(s) | Tok::Sym(s) => write!(f, "`{s}`"),
            Tok::Eof => f.write_str("the end of the file"),
        }
    }
}
