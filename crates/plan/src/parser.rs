//! The parser: tokens → [`Program`]. Recursive descent with a nesting limit,
//! so no input can exhaust the stack.

use crate::ast::*;
use crate::error::{PErr, PResult, Pos};
use crate::lexer::{Tok, Token, lex};

/// Deepest nesting of expressions and types accepted.
pub const MAX_DEPTH: u32 = 64;

struct Parser {
    toks: Vec<Token>,
    i: usize,
    depth: u32,
    next_id: u32,
}

/// Parses a whole program.
pub(crate) fn parse(src: &str) -> PResult<Program> {
    let toks = lex(src)?;
    let mut p = Parser { toks, i: 0, depth: 0, next_id: 0 };
    p.program()
}

impl Parser {
    fn peek(&self) -> &Tok {
        self.toks.get(self.i).map_or(&Tok::Eof, |t| &t.tok)
    }
    fn peek_at(&self, k: usize) -> &Tok {
        self.toks.get(self.i + k).map_or(&Tok::Eof, |t| &t.tok)
    }
    fn pos(&self) -> Pos {
        self.toks.get(self.i).or(self.toks.last()).map_or(Pos { line: 1, col: 1 }, |t| t.pos)
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.i < self.toks.len() {
            self.i += 1;
        }
        t
    }
    fn is_sym(&self, s: &str) -> bool {
        matches!(self.peek(), Tok::Sym(x) if *x == s)
    }
    fn is_kw(&self, s: &str) -> bool {
        matches!(self.peek(), Tok::Kw(x) if *x == s)
    }
    fn unexpected<T>(&self, what: &str) -> PResult<T> {
        Err(PErr::syntax(self.pos(), format!("expected {what}, found {}", self.peek())))
    }
    fn sym(&mut self, s: &str) -> PResult<()> {
        if self.is_sym(s) {
            self.i += 1;
            Ok(())
        } else {
            self.unexpected(&format!("`{s}`"))
        }
    }
    fn kw(&mut self, s: &str) -> PResult<()> {
        if self.is_kw(s) {
            self.i += 1;
            Ok(())
        } else {
            self.unexpected(&format!("`{s}`"))
        }
    }
    fn ident(&mut self, what: &str) -> PResult<(String, Pos)> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.i += 1;
                Ok((s, pos))
            }
            _ => self.unexpected(what),
        }
    }
    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(PErr::limit(self.pos(), format!("expressions nested more than {MAX_DEPTH} deep")));
        }
        Ok(())
    }
    fn mk(&mut self, kind: ExprKind, pos: Pos) -> Expr {
        self.next_id += 1;
        Expr { kind, pos, id: self.next_id }
    }

    fn program(&mut self) -> PResult<Program> {
        let mut funs = Vec::new();
        while self.is_kw("fun") {
            funs.push(self.fun()?);
        }
        let invocation = if matches!(self.peek(), Tok::Eof) {
            None
        } else {
            let pos = self.pos();
            let e = self.expr().map_err(|e| {
                if matches!(e.kind, crate::error::ErrorKind::Syntax(_)) && e.pos == pos {
                    PErr::syntax(
                        pos,
                        format!("expected `fun` or the invocation `OnRemote(...)`, found {}", self.peek()),
                    )
                } else {
                    e
                }
            })?;
            Some(e)
        };
        if !matches!(self.peek(), Tok::Eof) {
            return self.unexpected(if invocation.is_some() {
                "the end of the file after the invocation (functions come first)"
            } else {
                "`fun`"
            });
        }
        Ok(Program { funs, invocation })
    }

    fn fun(&mut self) -> PResult<Fun> {
        self.kw("fun")?;
        let (name, pos) = self.ident("a function name")?;
        self.sym("(")?;
        let mut params = Vec::new();
        if !self.is_sym(")") {
            loop {
                let (pname, ppos) = self.ident("a parameter name")?;
                if !self.is_sym(":") {
                    return Err(PErr::syntax(
                        self.pos(),
                        format!("parameter `{pname}` needs a type: write `{pname}: int` (or another type)"),
                    ));
                }
                self.sym(":")?;
                let ty = self.ty()?;
                params.push(Param { name: pname, ty, pos: ppos });
                if self.is_sym(",") {
                    self.i += 1;
                } else {
                    break;
                }
            }
        }
        self.sym(")")?;
        let ret = if self.is_sym(":") {
            self.i += 1;
            Some(self.ty()?)
        } else {
            None
        };
        self.sym("=")?;
        let body = self.expr()?;
        Ok(Fun { name, pos, params, ret, body })
    }

    fn ty(&mut self) -> PResult<TypeExpr> {
        self.enter()?;
        let mut parts = vec![self.ty_atom()?];
        while self.is_sym("*") {
            self.i += 1;
            parts.push(self.ty_atom()?);
        }
        self.depth -= 1;
        Ok(if parts.len() == 1 { parts.pop().unwrap_or(TypeExpr::Unit) } else { TypeExpr::Tuple(parts) })
    }

    fn ty_atom(&mut self) -> PResult<TypeExpr> {
        let mut t = match self.next() {
            Tok::Kw("int") => TypeExpr::Int,
            Tok::Kw("bool") => TypeExpr::Bool,
            Tok::Kw("unit") => TypeExpr::Unit,
            Tok::Kw("float") => TypeExpr::Float,
            Tok::Kw("host") => TypeExpr::Host,
            Tok::Kw("blob") => TypeExpr::Blob,
            Tok::Kw("string") => TypeExpr::Str,
            Tok::Sym("(") => {
                let t = self.ty()?;
                self.sym(")")?;
                t
            }
            _ => {
                self.i -= 1;
                return self.unexpected("a type (int, bool, unit, float, host, blob, string, T list, T * T)");
            }
        };
        while self.is_kw("list") {
            self.i += 1;
            t = TypeExpr::List(Box::new(t));
        }
        Ok(t)
    }

    /// A full expression.
    fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let e = self.orelse();
        self.depth -= 1;
        e
    }

    fn orelse(&mut self) -> PResult<Expr> {
        let mut a = self.andalso()?;
        while self.is_kw("orelse") {
            let pos = self.pos();
            self.i += 1;
            let b = self.andalso()?;
            a = self.mk(ExprKind::Bin(BinOp::Or, Box::new(a), Box::new(b)), pos);
        }
        Ok(a)
    }

    fn andalso(&mut self) -> PResult<Expr> {
        let mut a = self.cmp()?;
        while self.is_kw("andalso") {
            let pos = self.pos();
            self.i += 1;
            let b = self.cmp()?;
            a = self.mk(ExprKind::Bin(BinOp::And, Box::new(a), Box::new(b)), pos);
        }
        Ok(a)
    }

    fn cmp(&mut self) -> PResult<Expr> {
        let a = self.cons()?;
        let op = match self.peek() {
            Tok::Sym("=") => BinOp::Eq,
            Tok::Sym("<>") => BinOp::Ne,
            Tok::Sym("<") => BinOp::Lt,
            Tok::Sym("<=") => BinOp::Le,
            Tok::Sym(">") => BinOp::Gt,
            Tok::Sym(">=") => BinOp::Ge,
            _ => return Ok(a),
        };
        let pos = self.pos();
        self.i += 1;
        let b = self.cons()?;
        Ok(self.mk(ExprKind::Bin(op, Box::new(a), Box::new(b)), pos))
    }

    fn cons(&mut self) -> PResult<Expr> {
        let h = self.add()?;
        if self.is_sym("::") {
            let pos = self.pos();
            self.i += 1;
            self.enter()?;
            let t = self.cons();
            self.depth -= 1;
            let t = t?;
            return Ok(self.mk(ExprKind::Cons(Box::new(h), Box::new(t)), pos));
        }
        Ok(h)
    }

    fn add(&mut self) -> PResult<Expr> {
        let mut a = self.mul()?;
        loop {
            let op = match self.peek() {
                Tok::Sym("+") => BinOp::Add,
                Tok::Sym("-") => BinOp::Sub,
                _ => return Ok(a),
            };
            let pos = self.pos();
            self.i += 1;
            let b = self.mul()?;
            a = self.mk(ExprKind::Bin(op, Box::new(a), Box::new(b)), pos);
        }
    }

    fn mul(&mut self) -> PResult<Expr> {
        let mut a = self.unary()?;
        loop {
            let op = match self.peek() {
                Tok::Sym("*") => BinOp::Mul,
                Tok::Sym("/") => BinOp::Div,
                Tok::Kw("mod") => BinOp::Mod,
                _ => return Ok(a),
            };
            let pos = self.pos();
            self.i += 1;
            let b = self.unary()?;
            a = self.mk(ExprKind::Bin(op, Box::new(a), Box::new(b)), pos);
        }
    }

    fn unary(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        self.enter()?;
        let r = match self.peek().clone() {
            Tok::Kw("not") => {
                self.i += 1;
                let e = self.unary()?;
                Ok(self.mk(ExprKind::Un(UnOp::Not, Box::new(e)), pos))
            }
            Tok::Sym("~" | "-") => {
                self.i += 1;
                if let Tok::Int(v) = *self.peek() {
                    self.i += 1;
                    Ok(self.mk(ExprKind::Int(-v), pos))
                } else if let Tok::Float(x) = *self.peek() {
                    self.i += 1;
                    Ok(self.mk(ExprKind::Float(-x), pos))
                } else {
                    let e = self.unary()?;
                    Ok(self.mk(ExprKind::Un(UnOp::Neg, Box::new(e)), pos))
                }
            }
            Tok::Sym("#") => {
                self.i += 1;
                let k = match self.next() {
                    Tok::Int(k) if (1..=64).contains(&k) => k as u32,
                    _ => {
                        self.i -= 1;
                        return self.unexpected("a field number 1..64 after `#`");
                    }
                };
                let e = self.unary()?;
                Ok(self.mk(ExprKind::Proj(k, Box::new(e)), pos))
            }
            _ => self.atom(),
        };
        self.depth -= 1;
        r
    }

    fn args(&mut self) -> PResult<Vec<Expr>> {
        self.sym("(")?;
        let mut v = Vec::new();
        if !self.is_sym(")") {
            loop {
                v.push(self.expr()?);
                if self.is_sym(",") {
                    self.i += 1;
                } else {
                    break;
                }
            }
        }
        self.sym(")")?;
        Ok(v)
    }

    fn atom(&mut self) -> PResult<Expr> {
        let pos = self.pos();
        let kind = match self.next() {
            Tok::Int(v) => ExprKind::Int(v),
            Tok::Float(x) => ExprKind::Float(x),
            Tok::Host(a) => ExprKind::Host(a),
            Tok::Str(s) => ExprKind::Str(s),
            Tok::Blob(b) => ExprKind::Blob(b),
            Tok::Kw("true") => ExprKind::Bool(true),
            Tok::Kw("false") => ExprKind::Bool(false),
            Tok::Kw("if") => {
                let c = self.expr()?;
                self.kw("then")?;
                let a = self.expr()?;
                if !self.is_kw("else") {
                    return self.unexpected("`else` (every `if` needs one)");
                }
                self.i += 1;
                let b = self.expr()?;
                ExprKind::If(Box::new(c), Box::new(a), Box::new(b))
            }
            Tok::Kw("let") => {
                let mut binds = Vec::new();
                while self.is_kw("val") {
                    self.i += 1;
                    let (name, npos) = self.ident("a name after `val`")?;
                    let ty = if self.is_sym(":") {
                        self.i += 1;
                        Some(self.ty()?)
                    } else {
                        None
                    };
                    self.sym("=")?;
                    let value = self.expr()?;
                    binds.push(Binding { name, ty, value, pos: npos });
                }
                if binds.is_empty() {
                    return self.unexpected("`val` after `let`");
                }
                self.kw("in")?;
                let body = self.seq_until(|p| p.is_kw("end"))?;
                self.kw("end")?;
                ExprKind::Let(binds, Box::new(body))
            }
            Tok::Sym("(") => {
                if self.is_sym(")") {
                    self.i += 1;
                    ExprKind::Unit
                } else {
                    let first = self.expr()?;
                    if self.is_sym(",") {
                        let mut v = vec![first];
                        while self.is_sym(",") {
                            self.i += 1;
                            v.push(self.expr()?);
                        }
                        self.sym(")")?;
                        ExprKind::Tuple(v)
                    } else if self.is_sym(";") {
                        let mut v = vec![first];
                        while self.is_sym(";") {
                            self.i += 1;
                            v.push(self.expr()?);
                        }
                        self.sym(")")?;
                        ExprKind::Seq(v)
                    } else {
                        self.sym(")")?;
                        return Ok(first);
                    }
                }
            }
            Tok::Sym("[") => {
                let mut v = Vec::new();
                if !self.is_sym("]") {
                    loop {
                        v.push(self.expr()?);
                        if self.is_sym(",") {
                            self.i += 1;
                        } else {
                            break;
                        }
                    }
                }
                self.sym("]")?;
                ExprKind::List(v)
            }
            Tok::Ident(name) => match name.as_str() {
                "foldl" | "foldr" => self.fold(name == "foldr")?,
                "OnRemote" | "OnNeighbor" => self.remote(name == "OnNeighbor")?,
                _ if self.is_sym("(") => ExprKind::Call(name, self.args()?),
                _ => ExprKind::Var(name),
            },
            _ => {
                self.i -= 1;
                return self.unexpected("an expression");
            }
        };
        Ok(self.mk(kind, pos))
    }

    /// `e1; e2; ...` up to (not including) the token `stop` accepts.
    fn seq_until(&mut self, stop: impl Fn(&Parser) -> bool) -> PResult<Expr> {
        let pos = self.pos();
        let mut v = vec![self.expr()?];
        while self.is_sym(";") && !stop(self) {
            self.i += 1;
            v.push(self.expr()?);
        }
        Ok(if v.len() == 1 {
            v.pop().unwrap_or_else(|| self.mk(ExprKind::Unit, pos))
        } else {
            self.mk(ExprKind::Seq(v), pos)
        })
    }

    fn fold(&mut self, right: bool) -> PResult<ExprKind> {
        let bound = if self.is_sym("[") {
            self.i += 1;
            let b = match self.next() {
                Tok::Int(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
                _ => {
                    self.i -= 1;
                    return self.unexpected("a positive list-length bound");
                }
            };
            self.sym("]")?;
            Some(b)
        } else {
            None
        };
        self.sym("(")?;
        let fun = self.ident("the name of the function to fold")?;
        self.sym(",")?;
        let a = self.expr()?;
        self.sym(",")?;
        let b = self.expr()?;
        self.sym(")")?;
        // foldl(f, init, list); foldr(f, list, init), as in PLAN.
        let (init, list) = if right { (b, a) } else { (a, b) };
        Ok(ExprKind::Fold { right, bound, fun, init: Box::new(init), list: Box::new(list) })
    }

    fn remote(&mut self, neighbor: bool) -> PResult<ExprKind> {
        self.sym("(")?;
        self.sym("|")?;
        let (fun, fun_pos) = self.ident("the name of the function to evaluate remotely")?;
        self.sym("|")?;
        let args = self.args()?;
        self.sym(",")?;
        let dest = self.expr()?;
        self.sym(",")?;
        let rb = self.expr()?;
        let route = if neighbor {
            Route::Default
        } else {
            self.sym(",")?;
            let (r, rpos) = self.ident("a routing function (`defaultRoute` or one of yours)")?;
            if r == "defaultRoute" { Route::Default } else { Route::Fun(r, rpos) }
        };
        self.sym(")")?;
        let _ = self.peek_at(0);
        Ok(ExprKind::Remote {
            chunk: Chunk { fun, fun_pos, args },
            dest: Box::new(dest),
            rb: Box::new(rb),
            route,
            neighbor,
        })
    }
}
