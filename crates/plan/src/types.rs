//! Name resolution, the recursion check and the type checker.
//!
//! Functions are checked callees first (the call graph is acyclic once the
//! recursion check has passed), so a function's result type may be inferred.
//! Types are monomorphic except for the built-ins (`hd`, `::`, `[]`, `print`,
//! `deliver`, ...), which are instantiated at each use. Arithmetic and
//! comparison are overloaded on `int` and `float`; the checker records which
//! one each operator got, defaulting to `int`.

use crate::ast::*;
use crate::builtins::{self, BTy, Code};
use crate::error::{ErrorKind, PErr, PResult, Pos};
use core::fmt;
use std::collections::{BTreeSet, HashMap};

/// Deepest type accepted.
pub const MAX_TYPE_DEPTH: u32 = 128;

/// A type.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
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
    List(Box<Ty>),
    /// `T1 * T2 ...`
    Tuple(Vec<Ty>),
    /// An unknown, solved by unification.
    Var(u32),
}

impl Ty {
    fn from_expr(t: &TypeExpr) -> Ty {
        match t {
            TypeExpr::Int => Ty::Int,
            TypeExpr::Bool => Ty::Bool,
            TypeExpr::Unit => Ty::Unit,
            TypeExpr::Float => Ty::Float,
            TypeExpr::Host => Ty::Host,
            TypeExpr::Blob => Ty::Blob,
            TypeExpr::Str => Ty::Str,
            TypeExpr::List(t) => Ty::List(Box::new(Ty::from_expr(t))),
            TypeExpr::Tuple(ts) => Ty::Tuple(ts.iter().map(Ty::from_expr).collect()),
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Int => f.write_str("int"),
            Ty::Bool => f.write_str("bool"),
            Ty::Unit => f.write_str("unit"),
            Ty::Float => f.write_str("float"),
            Ty::Host => f.write_str("host"),
            Ty::Blob => f.write_str("blob"),
            Ty::Str => f.write_str("string"),
            Ty::List(t) => match **t {
                Ty::Tuple(_) => write!(f, "({t}) list"),
                _ => write!(f, "{t} list"),
            },
            Ty::Tuple(ts) => {
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" * ")?;
                    }
                    match t {
                        Ty::Tuple(_) => write!(f, "({t})")?,
                        _ => write!(f, "{t}")?,
                    }
                }
                Ok(())
            }
            Ty::Var(v) => write!(f, "'t{v}"),
        }
    }
}

/// Whether an overloaded operator works on integers or floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Num {
    /// Integer instructions.
    Int,
    /// Float instructions.
    Float,
}

/// What the checker tells the code generator.
#[derive(Debug, Default)]
pub struct Notes {
    /// Operand kind of each arithmetic / comparison / negation, by expression id.
    pub num: HashMap<u32, Num>,
    /// Functions in callee-first order.
    pub order: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Numeric,
    Equality,
    Key,
    Scalar,
    Deliverable,
}

struct Sig {
    params: Vec<Ty>,
    ret: Ty,
}

struct Checker<'p> {
    subst: Vec<Option<Ty>>,
    funs: HashMap<&'p str, &'p Fun>,
    sigs: HashMap<&'p str, Sig>,
    pending_num: Vec<(u32, Ty)>,
    deferred: Vec<(Pos, Ty, Class, String)>,
}

/// Checks `prog`: names, recursion, types. Returns the notes for code
/// generation.
pub(crate) fn check(prog: &Program) -> PResult<Notes> {
    let mut funs: HashMap<&str, &Fun> = HashMap::new();
    for f in &prog.funs {
        if builtins::lookup(&f.name).is_some() || builtins::RESERVED.contains(&f.name.as_str()) {
            return Err(PErr::new(
                f.pos,
                ErrorKind::Type(format!("`{}` is a built-in name; choose another name for this function", f.name)),
            ));
        }
        if let Some(prev) = funs.insert(&f.name, f) {
            return Err(PErr::new(
                f.pos,
                ErrorKind::Type(format!("function `{}` is already defined at {}", f.name, prev.pos)),
            ));
        }
        let mut seen = BTreeSet::new();
        for p in &f.params {
            if !seen.insert(&p.name) {
                return Err(PErr::ty(p.pos, format!("parameter `{}` appears twice", p.name)));
            }
        }
    }
    let order = call_order(prog, &funs)?;
    let mut ck =
        Checker { subst: Vec::new(), funs, sigs: HashMap::new(), pending_num: Vec::new(), deferred: Vec::new() };
    // Parameter types are known from the annotations; results are inferred
    // callees first.
    for name in &order {
        let f = ck.funs[name.as_str()];
        let params: Vec<Ty> = f.params.iter().map(|p| Ty::from_expr(&p.ty)).collect();
        let mut env: Vec<(&str, Ty)> = f.params.iter().map(|p| p.name.as_str()).zip(params.iter().cloned()).collect();
        let body = ck.expr(&f.body, &mut env)?;
        if let Some(r) = &f.ret {
            let r = Ty::from_expr(r);
            ck.unify(&body, &r, f.body.pos, || {
                format!("the body of `{}` has type {{a}}, but its declared result is {{b}}", f.name)
            })?;
        }
        ck.finish_deferred()?;
        let ret = ck.resolve(&body, 0);
        ck.sigs.insert(f.name.as_str(), Sig { params, ret });
    }
    if let Some(inv) = &prog.invocation {
        ck.invocation(inv)?;
        ck.finish_deferred()?;
    }
    let mut notes = Notes { order, ..Notes::default() };
    for (id, t) in std::mem::take(&mut ck.pending_num) {
        let k = match ck.resolve(&t, 0) {
            Ty::Float => Num::Float,
            _ => Num::Int,
        };
        notes.num.insert(id, k);
    }
    Ok(notes)
}

/// Every function callee first; rejects recursion, naming the cycle.
fn call_order(prog: &Program, funs: &HashMap<&str, &Fun>) -> PResult<Vec<String>> {
    // Edges: calls, fold iterators and routing functions, which are inlined.
    // `|f|` chunks are not edges: they are evaluated by a new packet.
    let mut edges: HashMap<&str, Vec<(&str, Pos)>> = HashMap::new();
    for f in &prog.funs {
        let mut v = Vec::new();
        callees(&f.body, funs, &mut v);
        edges.insert(&f.name, v);
    }
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let mut mark: HashMap<&str, Mark> = prog.funs.iter().map(|f| (f.name.as_str(), Mark::New)).collect();
    let mut order = Vec::new();
    for f in &prog.funs {
        if mark[f.name.as_str()] != Mark::New {
            continue;
        }
        // Iterative DFS: (function, next edge index).
        let mut stack: Vec<(&str, usize)> = vec![(&f.name, 0)];
        mark.insert(&f.name, Mark::Active);
        while let Some(&mut (u, ref mut i)) = stack.last_mut() {
            let es = &edges[u];
            if *i < es.len() {
                let (v, pos) = es[*i];
                *i += 1;
                match mark[v] {
                    Mark::New => {
                        mark.insert(v, Mark::Active);
                        stack.push((v, 0));
                    }
                    Mark::Active => {
                        let start = stack.iter().position(|(n, _)| *n == v).unwrap_or(0);
                        let mut cycle: Vec<String> = stack[start..].iter().map(|(n, _)| (*n).to_owned()).collect();
                        cycle.push(v.to_owned());
                        return Err(PErr::new(pos, ErrorKind::Recursion { cycle }));
                    }
                    Mark::Done => {}
                }
            } else {
                mark.insert(u, Mark::Done);
                order.push(u.to_owned());
                stack.pop();
            }
        }
    }
    Ok(order)
}

fn callees<'a>(e: &'a Expr, funs: &HashMap<&str, &Fun>, out: &mut Vec<(&'a str, Pos)>) {
    let mut add = |n: &'a str, p: Pos| {
        if funs.contains_key(n) {
            out.push((n, p));
        }
    };
    match &e.kind {
        ExprKind::Call(n, args) => {
            add(n, e.pos);
            for a in args {
                callees(a, funs, out);
            }
        }
        ExprKind::Fold { fun, init, list, .. } => {
            add(&fun.0, fun.1);
            callees(init, funs, out);
            callees(list, funs, out);
        }
        ExprKind::Remote { chunk, dest, rb, route, .. } => {
            if let Route::Fun(r, p) = route {
                add(r, *p);
            }
            for a in &chunk.args {
                callees(a, funs, out);
            }
            callees(dest, funs, out);
            callees(rb, funs, out);
        }
        ExprKind::Let(bs, body) => {
            for b in bs {
                callees(&b.value, funs, out);
            }
            callees(body, funs, out);
        }
        ExprKind::If(a, b, c) => {
            callees(a, funs, out);
            callees(b, funs, out);
            callees(c, funs, out);
        }
        ExprKind::Seq(v) | ExprKind::Tuple(v) | ExprKind::List(v) => {
            for a in v {
                callees(a, funs, out);
            }
        }
        ExprKind::Bin(_, a, b) | ExprKind::Cons(a, b) => {
            callees(a, funs, out);
            callees(b, funs, out);
        }
        ExprKind::Un(_, a) | ExprKind::Proj(_, a) => callees(a, funs, out),
        ExprKind::Int(_)
        | ExprKind::Bool(_)
        | ExprKind::Unit
        | ExprKind::Float(_)
        | ExprKind::Host(_)
        | ExprKind::Str(_)
        | ExprKind::Blob(_)
        | ExprKind::Var(_) => {}
    }
}

impl<'p> Checker<'p> {
    fn fresh(&mut self) -> Ty {
        self.subst.push(None);
        Ty::Var((self.subst.len() - 1) as u32)
    }

    /// `t` with every solved variable replaced.
    fn resolve(&self, t: &Ty, depth: u32) -> Ty {
        if depth > MAX_TYPE_DEPTH {
            return t.clone();
        }
        match t {
            Ty::Var(v) => match self.subst.get(*v as usize).and_then(|s| s.as_ref()) {
                Some(t) => self.resolve(t, depth + 1),
                None => t.clone(),
            },
            Ty::List(e) => Ty::List(Box::new(self.resolve(e, depth + 1))),
            Ty::Tuple(ts) => Ty::Tuple(ts.iter().map(|t| self.resolve(t, depth + 1)).collect()),
            _ => t.clone(),
        }
    }

    fn shallow(&self, t: &Ty) -> Ty {
        let mut t = t.clone();
        let mut n = 0;
        while let Ty::Var(v) = t {
            match self.subst.get(v as usize).and_then(|s| s.as_ref()) {
                Some(u) if n < 10_000 => {
                    t = u.clone();
                    n += 1;
                }
                _ => break,
            }
        }
        t
    }

    fn occurs(&self, v: u32, t: &Ty, depth: u32) -> bool {
        if depth > MAX_TYPE_DEPTH {
            return true;
        }
        match self.shallow(t) {
            Ty::Var(w) => w == v,
            Ty::List(e) => self.occurs(v, &e, depth + 1),
            Ty::Tuple(ts) => ts.iter().any(|t| self.occurs(v, t, depth + 1)),
            _ => false,
        }
    }

    fn unify_inner(&mut self, a: &Ty, b: &Ty, depth: u32) -> bool {
        if depth > MAX_TYPE_DEPTH {
            return false;
        }
        let (a, b) = (self.shallow(a), self.shallow(b));
        match (&a, &b) {
            (Ty::Var(x), Ty::Var(y)) if x == y => true,
            (Ty::Var(x), t) | (t, Ty::Var(x)) => {
                if self.occurs(*x, t, 0) {
                    return false;
                }
                self.subst[*x as usize] = Some(t.clone());
                true
            }
            (Ty::List(x), Ty::List(y)) => self.unify_inner(x, y, depth + 1),
            (Ty::Tuple(xs), Ty::Tuple(ys)) => {
                xs.len() == ys.len() && xs.iter().zip(ys.iter()).all(|(x, y)| self.unify_inner(x, y, depth + 1))
            }
            _ => a == b,
        }
    }

    /// Unifies; on failure reports `msg` with `{a}` and `{b}` replaced.
    fn unify(&mut self, a: &Ty, b: &Ty, pos: Pos, msg: impl FnOnce() -> String) -> PResult<()> {
        if self.unify_inner(a, b, 0) {
            Ok(())
        } else {
            let (ra, rb) = (self.resolve(a, 0), self.resolve(b, 0));
            Err(PErr::ty(pos, msg().replace("{a}", &ra.to_string()).replace("{b}", &rb.to_string())))
        }
    }

    fn expect(&mut self, got: &Ty, want: &Ty, pos: Pos, what: &str) -> PResult<()> {
        let what = what.to_owned();
        self.unify(got, want, pos, move || format!("{what} has type {{a}}, expected {{b}}"))
    }

    fn finish_deferred(&mut self) -> PResult<()> {
        for (pos, t, class, what) in std::mem::take(&mut self.deferred) {
            let r = self.resolve(&t, 0);
            let ok = match class {
                Class::Numeric => match r {
                    Ty::Int | Ty::Float => true,
                    Ty::Var(_) => self.unify_inner(&r, &Ty::Int, 0),
                    _ => false,
                },
                Class::Equality => matches!(r, Ty::Int | Ty::Bool | Ty::Unit | Ty::Host | Ty::Float | Ty::Var(_)),
                Class::Key => match r {
                    Ty::Int | Ty::Bool | Ty::Host | Ty::Blob | Ty::Str => true,
                    Ty::Var(_) => self.unify_inner(&r, &Ty::Int, 0),
                    _ => false,
                },
                Class::Scalar => match r {
                    Ty::Int | Ty::Bool | Ty::Unit | Ty::Host | Ty::Float => true,
                    Ty::Var(_) => self.unify_inner(&r, &Ty::Int, 0),
                    _ => false,
                },
                Class::Deliverable => match &r {
                    Ty::List(_) => false,
                    Ty::Tuple(ts) => ts.iter().all(|t| !matches!(self.resolve(t, 0), Ty::List(_) | Ty::Tuple(_))),
                    _ => true,
                },
            };
            if !ok {
                let need = match class {
                    Class::Numeric => "int or float",
                    Class::Equality => "int, bool, unit, host or float (blobs, strings, tuples and lists have no `=`)",
                    Class::Key => "int, bool, host, blob or string (a soft-state key)",
                    Class::Scalar => "int, bool, unit, host or float (a soft-state value)",
                    Class::Deliverable => {
                        "a scalar, blob, string or a tuple of those (lists and nested tuples cannot be delivered)"
                    }
                };
                return Err(PErr::ty(pos, format!("{what} has type {r}, but must be {need}")));
            }
        }
        Ok(())
    }

    fn lookup_var(env: &[(&str, Ty)], name: &str) -> Option<Ty> {
        env.iter().rev().find(|(n, _)| *n == name).map(|(_, t)| t.clone())
    }

    fn expr(&mut self, e: &'p Expr, env: &mut Vec<(&'p str, Ty)>) -> PResult<Ty> {
        Ok(match &e.kind {
            ExprKind::Int(v) => {
                let (lo, hi) = (i64::from(anode_snap::ops::IMM_MIN), i64::from(anode_snap::ops::IMM_MAX));
                if !(lo..=hi).contains(v) {
                    return Err(PErr::ty(
                        e.pos,
                        format!("integer {v} does not fit SNAP's 25-bit integers ({lo}..{hi})"),
                    ));
                }
                Ty::Int
            }
            ExprKind::Bool(_) => Ty::Bool,
            ExprKind::Unit => Ty::Unit,
            ExprKind::Float(_) => Ty::Float,
            ExprKind::Host(_) => Ty::Host,
            ExprKind::Str(_) => Ty::Str,
            ExprKind::Blob(_) => Ty::Blob,
            ExprKind::Var(n) => match Self::lookup_var(env, n) {
                Some(t) => t,
                None => {
                    let hint = if self.funs.contains_key(n.as_str()) || builtins::lookup(n).is_some() {
                        format!("`{n}` is a function: call it as `{n}(...)`")
                    } else {
                        format!("`{n}` is not a parameter, `let` name, function or built-in")
                    };
                    return Err(PErr::new(e.pos, ErrorKind::Unbound(hint)));
                }
            },
            ExprKind::Let(binds, body) => {
                let mark = env.len();
                for b in binds {
                    let t = self.expr(&b.value, env)?;
                    if let Some(ann) = &b.ty {
                        let want = Ty::from_expr(ann);
                        self.expect(&t, &want, b.value.pos, &format!("`{}`", b.name))?;
                    }
                    env.push((&b.name, t));
                }
                let t = self.expr(body, env)?;
                env.truncate(mark);
                t
            }
            ExprKind::If(c, a, b) => {
                let tc = self.expr(c, env)?;
                self.expect(&tc, &Ty::Bool, c.pos, "the condition of `if`")?;
                let ta = self.expr(a, env)?;
                let tb = self.expr(b, env)?;
                self.unify(&ta, &tb, b.pos, || "`then` gives {a} but `else` gives {b}".to_owned())?;
                ta
            }
            ExprKind::Seq(v) => {
                let mut t = Ty::Unit;
                for x in v {
                    t = self.expr(x, env)?;
                }
                t
            }
            ExprKind::Bin(op, a, b) => {
                let ta = self.expr(a, env)?;
                let tb = self.expr(b, env)?;
                match op {
                    BinOp::And | BinOp::Or => {
                        self.expect(&ta, &Ty::Bool, a.pos, &format!("the left operand of `{op}`"))?;
                        self.expect(&tb, &Ty::Bool, b.pos, &format!("the right operand of `{op}`"))?;
                        Ty::Bool
                    }
                    BinOp::Mod => {
                        self.expect(&ta, &Ty::Int, a.pos, "the left operand of `mod`")?;
                        self.expect(&tb, &Ty::Int, b.pos, "the right operand of `mod`")?;
                        Ty::Int
                    }
                    _ => {
                        let opn = *op;
                        self.unify(&ta, &tb, e.pos, || format!("the operands of `{opn}` differ: {{a}} and {{b}}"))?;
                        if matches!(op, BinOp::Eq | BinOp::Ne) {
                            self.deferred.push((e.pos, ta.clone(), Class::Equality, format!("the operand of `{op}`")));
                            Ty::Bool
                        } else {
                            self.deferred.push((e.pos, ta.clone(), Class::Numeric, format!("the operand of `{op}`")));
                            self.pending_num.push((e.id, ta.clone()));
                            if matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div) { ta } else { Ty::Bool }
                        }
                    }
                }
            }
            ExprKind::Un(UnOp::Not, a) => {
                let t = self.expr(a, env)?;
                self.expect(&t, &Ty::Bool, a.pos, "the operand of `not`")?;
                Ty::Bool
            }
            ExprKind::Un(UnOp::Neg, a) => {
                let t = self.expr(a, env)?;
                self.deferred.push((e.pos, t.clone(), Class::Numeric, "the operand of `~`".to_owned()));
                self.pending_num.push((e.id, t.clone()));
                t
            }
            ExprKind::Tuple(v) => {
                let mut ts = Vec::with_capacity(v.len());
                for x in v {
                    ts.push(self.expr(x, env)?);
                }
                Ty::Tuple(ts)
            }
            ExprKind::Proj(k, a) => {
                let t = self.expr(a, env)?;
                match self.resolve(&t, 0) {
                    Ty::Tuple(ts) => match ts.get(*k as usize - 1) {
                        Some(t) => t.clone(),
                        None => return Err(PErr::ty(e.pos, format!("`#{k}` of a {}-tuple", ts.len()))),
                    },
                    other => {
                        return Err(PErr::ty(
                            e.pos,
                            format!("`#{k}` needs a tuple of known type, found {other} (annotate the parameter)"),
                        ));
                    }
                }
            }
            ExprKind::List(v) => {
                let el = self.fresh();
                for x in v {
                    let t = self.expr(x, env)?;
                    self.unify(&t, &el, x.pos, || "list elements differ: {a} and {b}".to_owned())?;
                }
                Ty::List(Box::new(el))
            }
            ExprKind::Cons(h, t) => {
                let th = self.expr(h, env)?;
                let tt = self.expr(t, env)?;
                let want = Ty::List(Box::new(th));
                self.unify(&tt, &want, t.pos, || "the right of `::` has type {a}, expected {b}".to_owned())?;
                want
            }
            ExprKind::Call(name, args) => self.call(e, name, args, env)?,
            ExprKind::Fold { right, bound, fun, init, list } => {
                let kw = if *right { "foldr" } else { "foldl" };
                if bound.is_none() {
                    return Err(PErr::new(e.pos, ErrorKind::FoldWithoutBound(kw)));
                }
                let ti = self.expr(init, env)?;
                let tl = self.expr(list, env)?;
                let el = self.fresh();
                self.expect(&tl, &Ty::List(Box::new(el.clone())), list.pos, &format!("the list of `{kw}`"))?;
                let Some(sig) = self.sigs.get(fun.0.as_str()) else {
                    return Err(PErr::new(
                        fun.1,
                        ErrorKind::Unbound(format!(
                            "`{}` is not a function of this program (fold needs one of yours)",
                            fun.0
                        )),
                    ));
                };
                let (params, ret) = (sig.params.clone(), sig.ret.clone());
                if params.len() != 2 {
                    return Err(PErr::ty(
                        fun.1,
                        format!("`{}` takes {} arguments; `{kw}` needs a function of two", fun.0, params.len()),
                    ));
                }
                // foldl: f(acc, x); foldr: f(x, acc).
                let (pa, px) = if *right { (&params[1], &params[0]) } else { (&params[0], &params[1]) };
                let f = fun.0.clone();
                self.unify(&ti, pa, init.pos, || {
                    format!("the initial value has type {{a}}, but `{f}` takes an accumulator of type {{b}}")
                })?;
                let f = fun.0.clone();
                self.unify(&el, px, list.pos, || {
                    format!("the list elements have type {{a}}, but `{f}` takes elements of type {{b}}")
                })?;
                let f = fun.0.clone();
                self.unify(&ret, pa, fun.1, || format!("`{f}` returns {{a}}, but its accumulator has type {{b}}"))?;
                ti
            }
            ExprKind::Remote { chunk, dest, rb, route, neighbor } => {
                self.remote(chunk, dest, rb, route, *neighbor, env)?;
                Ty::Unit
            }
        })
    }

    fn remote(
        &mut self,
        chunk: &'p Chunk,
        dest: &'p Expr,
        rb: &'p Expr,
        route: &'p Route,
        neighbor: bool,
        env: &mut Vec<(&'p str, Ty)>,
    ) -> PResult<()> {
        let what = if neighbor { "OnNeighbor" } else { "OnRemote" };
        let Some(f) = self.funs.get(chunk.fun.as_str()).copied() else {
            return Err(PErr::new(
                chunk.fun_pos,
                ErrorKind::Unbound(format!(
                    "`{}` is not a function of this program (`{what}` evaluates one of yours)",
                    chunk.fun
                )),
            ));
        };
        if f.params.len() != chunk.args.len() {
            return Err(PErr::ty(
                chunk.fun_pos,
                format!("`{}` takes {} arguments but the chunk gives {}", f.name, f.params.len(), chunk.args.len()),
            ));
        }
        for (a, p) in chunk.args.iter().zip(&f.params) {
            let t = self.expr(a, env)?;
            self.expect(&t, &Ty::from_expr(&p.ty), a.pos, &format!("argument `{}` of `{}`", p.name, f.name))?;
        }
        let td = self.expr(dest, env)?;
        self.expect(&td, &Ty::Host, dest.pos, &format!("the destination of `{what}`"))?;
        let tr = self.expr(rb, env)?;
        self.expect(&tr, &Ty::Int, rb.pos, &format!("the resource bound of `{what}`"))?;
        if let Route::Fun(r, pos) = route {
            let Some(sig) = self.sigs.get(r.as_str()) else {
                return Err(PErr::new(*pos, ErrorKind::Unbound(format!("routing function `{r}` is not defined"))));
            };
            let ok = sig.params.len() == 1 && {
                let (p, ret) = (sig.params[0].clone(), sig.ret.clone());
                self.unify_inner(&p, &Ty::Host, 0) && self.unify_inner(&ret, &Ty::Host, 0)
            };
            if !ok {
                return Err(PErr::ty(
                    *pos,
                    format!("routing function `{r}` must have type host -> host (destination to next hop)"),
                ));
            }
        }
        Ok(())
    }

    fn bty(&mut self, b: BTy) -> Option<Ty> {
        Some(match b {
            BTy::Int | BTy::ConstInt => Ty::Int,
            BTy::Bool => Ty::Bool,
            BTy::Unit => Ty::Unit,
            BTy::Float => Ty::Float,
            BTy::Host => Ty::Host,
            BTy::Blob => Ty::Blob,
            BTy::Str => Ty::Str,
            BTy::Key | BTy::Scalar | BTy::Any => return None,
        })
    }

    fn call(&mut self, e: &'p Expr, name: &str, args: &'p [Expr], env: &mut Vec<(&'p str, Ty)>) -> PResult<Ty> {
        let mut targs = Vec::with_capacity(args.len());
        for a in args {
            targs.push(self.expr(a, env)?);
        }
        if let Some(sig) = self.sigs.get(name) {
            let (params, ret) = (sig.params.clone(), sig.ret.clone());
            if params.len() != args.len() {
                return Err(PErr::ty(
                    e.pos,
                    format!("`{name}` takes {} arguments, given {}", params.len(), args.len()),
                ));
            }
            for (i, ((t, p), a)) in targs.iter().zip(&params).zip(args).enumerate() {
                let pname = self.funs.get(name).and_then(|f| f.params.get(i)).map_or("?", |p| p.name.as_str());
                self.expect(t, p, a.pos, &format!("argument `{pname}` of `{name}`"))?;
            }
            return Ok(ret);
        }
        let Some(b) = builtins::lookup(name) else {
            let msg = if self.funs.contains_key(name) {
                format!("`{name}` cannot be used here")
            } else {
                format!("`{name}` is not a function of this program or a built-in")
            };
            return Err(PErr::new(e.pos, ErrorKind::Unbound(msg)));
        };
        if b.params.len() != args.len() {
            return Err(PErr::ty(e.pos, format!("`{name}` takes {} arguments, given {}", b.params.len(), args.len())));
        }
        if b.code == Code::List {
            let el = self.fresh();
            let l = Ty::List(Box::new(el.clone()));
            self.expect(&targs[0], &l, args[0].pos, &format!("the argument of `{name}`"))?;
            return Ok(match name {
                "hd" => el,
                "tl" => l,
                _ => Ty::Bool,
            });
        }
        for (i, (&p, t)) in b.params.iter().zip(&targs).enumerate() {
            let what = format!("argument {} of `{name}`", i + 1);
            match p {
                BTy::Key => self.deferred.push((args[i].pos, t.clone(), Class::Key, what)),
                BTy::Scalar => self.deferred.push((args[i].pos, t.clone(), Class::Scalar, what)),
                BTy::Any if b.code == Code::Deliver => {
                    self.deferred.push((args[i].pos, t.clone(), Class::Deliverable, what))
                }
                BTy::Any => {}
                BTy::ConstInt => {
                    if !matches!(args[i].kind, ExprKind::Int(k) if (0..=32).contains(&k)) {
                        return Err(PErr::ty(args[i].pos, format!("{what} must be an integer literal 0..32")));
                    }
                }
                _ => {
                    if let Some(want) = self.bty(p) {
                        self.expect(t, &want, args[i].pos, &what)?;
                    }
                }
            }
        }
        Ok(self.bty(b.ret).unwrap_or(Ty::Unit))
    }

    fn invocation(&mut self, inv: &'p Expr) -> PResult<()> {
        let ExprKind::Remote { chunk, dest, rb, .. } = &inv.kind else {
            return Err(PErr::syntax(
                inv.pos,
                "after the functions comes the packet to build: `OnRemote(|f|(args), dest, rb, route)`",
            ));
        };
        for a in &chunk.args {
            if !is_const(a) {
                return Err(PErr::ty(
                    a.pos,
                    "the invocation's arguments must be constants (literals, tuples and lists of them)",
                ));
            }
        }
        if !matches!(dest.kind, ExprKind::Host(_)) {
            return Err(PErr::ty(dest.pos, "the invocation's destination must be a host literal such as 10.0.0.3"));
        }
        if !matches!(rb.kind, ExprKind::Int(1..=65535)) {
            return Err(PErr::ty(rb.pos, "the invocation's resource bound must be an integer literal 1..65535"));
        }
        let mut env = Vec::new();
        self.expr(inv, &mut env)?;
        Ok(())
    }
}

/// Whether `e` is a constant the assembler can place in the initial stack.
pub(crate) fn is_const(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Int(_)
        | ExprKind::Bool(_)
        | ExprKind::Unit
        | ExprKind::Float(_)
        | ExprKind::Host(_)
        | ExprKind::Str(_)
        | ExprKind::Blob(_) => true,
        ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().all(is_const),
        ExprKind::Cons(a, b) => is_const(a) && is_const(b),
        _ => false,
    }
}
