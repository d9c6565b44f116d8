//! Compile errors: every one carries the file, a 1-based line and column, and
//! a plain message.

use core::fmt;

/// A 1-based source position (column counted in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// What went wrong. The variants are the error classes of `docs/plan.md`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// The text is not a program of the grammar.
    #[error("syntax error: {0}")]
    Syntax(String),
    /// A name that is not a parameter, `let` binding, function or service.
    #[error("unknown name: {0}")]
    Unbound(String),
    /// The program is ill-typed.
    #[error("type error: {0}")]
    Type(String),
    /// A function calls itself, directly or through others. The cycle starts
    /// and ends with the same function.
    #[error("recursive function: {} (PLAN functions may not be recursive; calls are inlined)", .cycle.join(" -> "))]
    Recursion {
        /// The functions of the cycle, in call order, first one repeated last.
        cycle: Vec<String>,
    },
    /// `foldl`/`foldr` without the programmer's bound on the list length.
    #[error("`{0}` needs a bound on the list length, which the compiler unrolls to: write {0}[N](...)")]
    FoldWithoutBound(&'static str),
    /// The generated packet would be larger than the packet size limit.
    #[error("the compiled packet would be {bytes} bytes, over the {limit}-byte packet limit ({detail})")]
    TooLarge {
        /// Size of the packet the program would be.
        bytes: usize,
        /// The limit (the MTU).
        limit: usize,
        /// Where the size comes from.
        detail: String,
    },
    /// One of the compiler's own bounds on its work (source size, nesting,
    /// unrolled size) was exceeded.
    #[error("too big to compile: {0}")]
    Limit(String),
}

/// A compile error at a source position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{pos}: {kind}")]
pub struct Error {
    /// The file name given to the compiler.
    pub file: String,
    /// Where.
    pub pos: Pos,
    /// What.
    pub kind: ErrorKind,
}

/// An error before the file name is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PErr {
    pub pos: Pos,
    pub kind: ErrorKind,
}

impl PErr {
    pub(crate) fn new(pos: Pos, kind: ErrorKind) -> PErr {
        PErr { pos, kind }
    }
    pub(crate) fn syntax(pos: Pos, msg: impl Into<String>) -> PErr {
        PErr { pos, kind: ErrorKind::Syntax(msg.into()) }
    }
    pub(crate) fn ty(pos: Pos, msg: impl Into<String>) -> PErr {
        PErr { pos, kind: ErrorKind::Type(msg.into()) }
    }
    pub(crate) fn limit(pos: Pos, msg: impl Into<String>) -> PErr {
        PErr { pos, kind: ErrorKind::Limit(msg.into()) }
    }
    pub(crate) fn with_file(self, file: &str) -> Error {
        Error { file: file.to_owned(), pos: self.pos, kind: self.kind }
    }
}

pub(crate) type PResult<T> = Result<T, PErr>;
