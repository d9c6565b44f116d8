//! The abstract syntax of the PLAN subset (see `docs/plan.md`).

use crate::error::Pos;
use core::fmt;
use core::net::Ipv4Addr;

/// A source type.
#[derive(Debug, Clone, PartialEq)]
pub enum TypeExpr {
    /// `int`
    Int,
    /// `bool`
    Bool,
    /// `unit`
    Unit,
    /// `float`
    Float,
    /// `host`
    Host,
    /// `blob`
    Blob,
    /// `string`
    Str,
    /// `T list`
    List(Box<TypeExpr>),
    /// `T1 * T2 * ...`
    Tuple(Vec<TypeExpr>),
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `mod`
    Mod,
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `andalso`
    And,
    /// `orelse`
    Or,
}

impl fmt::Display for BinOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "mod",
            BinOp::Eq => "=",
            BinOp::Ne => "<>",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "andalso",
            BinOp::Or => "orelse",
        })
    }
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    /// `not`
    Not,
    /// `~` or `-`
    Neg,
}

/// How a remote evaluation finds its destination.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// `defaultRoute`: the node's routing table (SNAP `forw`).
    Default,
    /// A user routing function `fun r(dest: host) : host` giving the next hop.
    Fun(String, Pos),
}

/// `|f|(args)`: a function to evaluate elsewhere and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// The function.
    pub fun: String,
    /// Where it is named.
    pub fun_pos: Pos,
    /// The arguments.
    pub args: Vec<Expr>,
}

/// An expression. `id` is unique in a program and keys the checker's notes.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    /// What it is.
    pub kind: ExprKind,
    /// Where it starts.
    pub pos: Pos,
    /// Unique number.
    pub id: u32,
}

/// Expression forms.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// Integer literal.
    Int(i64),
    /// `true`/`false`.
    Bool(bool),
    /// `()`.
    Unit,
    /// Float literal.
    Float(f32),
    /// Host literal.
    Host(Ipv4Addr),
    /// String literal.
    Str(Vec<u8>),
    /// Blob literal.
    Blob(Vec<u8>),
    /// A variable.
    Var(String),
    /// `let val x = e ... in body end`.
    Let(Vec<Binding>, Box<Expr>),
    /// `if c then a else b`.
    If(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `(e1; e2; ...)`: the value of the last.
    Seq(Vec<Expr>),
    /// Binary operation.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// Unary operation.
    Un(UnOp, Box<Expr>),
    /// `(e1, e2, ...)`, at least two.
    Tuple(Vec<Expr>),
    /// `#k e`, k from 1.
    Proj(u32, Box<Expr>),
    /// `[e1, ...]`.
    List(Vec<Expr>),
    /// `h :: t`.
    Cons(Box<Expr>, Box<Expr>),
    /// `f(args)`: a user function (inlined) or a built-in.
    Call(String, Vec<Expr>),
    /// `foldl[N](f, init, list)` or `foldr[N](f, list, init)`.
    Fold {
        /// `foldr`?
        right: bool,
        /// The bound N, if given.
        bound: Option<u32>,
        /// The iterator function and where it is named.
        fun: (String, Pos),
        /// Initial accumulator.
        init: Box<Expr>,
        /// The list.
        list: Box<Expr>,
    },
    /// `OnRemote(|f|(args), dest, rb, route)` or `OnNeighbor(|f|(args), dest, rb)`.
    Remote {
        /// What to evaluate.
        chunk: Chunk,
        /// Where.
        dest: Box<Expr>,
        /// Resource bound given to the new packet.
        rb: Box<Expr>,
        /// How it gets there.
        route: Route,
        /// Written as `OnNeighbor`.
        neighbor: bool,
    },
}

/// One `val x [: T] = e` of a `let`.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// The name.
    pub name: String,
    /// Its optional annotation.
    pub ty: Option<TypeExpr>,
    /// Its value.
    pub value: Expr,
    /// Where the name is.
    pub pos: Pos,
}

/// A function parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The name.
    pub name: String,
    /// Its type (required).
    pub ty: TypeExpr,
    /// Where.
    pub pos: Pos,
}

/// `fun name(params) [: T] = body`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fun {
    /// The name.
    pub name: String,
    /// Where the name is.
    pub pos: Pos,
    /// Parameters.
    pub params: Vec<Param>,
    /// Optional result annotation.
    pub ret: Option<TypeExpr>,
    /// The body.
    pub body: Expr,
}

/// A whole program: functions, then optionally the packet to build, written
/// as a top-level `OnRemote`/`OnNeighbor` whose arguments are constants.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// The functions, in source order.
    pub funs: Vec<Fun>,
    /// The invocation (an [`ExprKind::Remote`]), if any.
    pub invocation: Option<Expr>,
}
