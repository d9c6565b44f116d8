//! Code generation for forward-only SNAP, with inlining and fold unrolling.
//!
//! Every user function call is inlined: its arguments are pushed and become
//! the callee's parameters, its body is compiled in their place, and `slide`
//! drops them afterwards, keeping the result. Folds are unrolled to the
//! programmer's bound. So no code ever branches backward.
//!
//! Values live on the SNAP stack. The generator tracks the stack depth at
//! every point; a variable bound at slot `s` (0 = deepest of the current
//! packet's frame) is fetched with `pull depth-1-s`.
//!
//! A function evaluated remotely (`|f|` of `OnRemote`) gets its own code
//! block, entered with its arguments on the stack. Each routing function used
//! gets a prologue that runs on every hop (§V-A): for `defaultRoute` it is
//! `forw; paj -k`, which moves on toward the destination or jumps to the
//! block whose index is on top of the stack.

use crate::ast::*;
use crate::builtins::{self, Code};
use crate::error::{PErr, PResult, Pos};
use crate::types::{Notes, Num};
use anode_snap::Op;
use core::net::Ipv4Addr;
use std::collections::HashMap;

/// Most instructions the generator emits before optimisation.
pub const MAX_INSNS: usize = 16_384;
/// Deepest nesting of inlined calls and fold bodies.
pub const MAX_INLINE_DEPTH: u32 = 16;
/// Largest fold bound accepted.
pub const MAX_FOLD_BOUND: u32 = 1024;

/// A constant operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Const {
    /// A string (also service names).
    Str(Vec<u8>),
    /// A blob.
    Blob(Vec<u8>),
    /// A host address.
    Host(Ipv4Addr),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
    /// Unit.
    Unit,
}

/// An instruction operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// None.
    None,
    /// An integer immediate.
    Imm(i64),
    /// A code label (branch target or `push` of its index).
    Label(u32),
    /// A constant (`push`, `calls`).
    Const(Const),
    /// `paj` that jumps to the absolute index on the stack: `paj -self`.
    PajSelf,
}

/// One item of generated code.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A label definition.
    Label(u32),
    /// An instruction.
    Ins(Op, Arg),
}

/// A generated program before assembly.
#[derive(Debug, Clone)]
pub struct Code0 {
    /// The code.
    pub items: Vec<Item>,
    /// Label names, by id.
    pub labels: Vec<String>,
    /// Labels that must be kept: the entry prologue and the block starts.
    pub roots: Vec<u32>,
    /// Code blocks: (label, description, source position).
    pub blocks: Vec<(u32, String, Pos)>,
    /// The entry point label.
    pub entry: u32,
    /// The initial stack, top first, as assembler values.
    pub stack: Vec<String>,
    /// Heap entries the stack needs.
    pub heap: Vec<String>,
    /// The destination.
    pub dst: Ipv4Addr,
    /// The resource bound.
    pub rb: u16,
}

type Env<'p> = Vec<(&'p str, i64)>;

struct Gen<'p> {
    funs: HashMap<&'p str, &'p Fun>,
    notes: &'p Notes,
    items: Vec<Item>,
    depth: i64,
    labels: Vec<String>,
    chunks: HashMap<&'p str, u32>,
    chunk_queue: Vec<&'p str>,
    routes: HashMap<Option<&'p str>, u32>,
    route_queue: Vec<(Option<&'p str>, Pos)>,
    inline_depth: u32,
    emitted: usize,
}

/// Generates code for `prog` (checked), whose invocation is `inv`.
pub(crate) fn generate(
    prog: &Program,
    notes: &Notes,
    dst_override: Option<Ipv4Addr>,
    rb_override: Option<u16>,
) -> PResult<Code0> {
    let Some(inv) = &prog.invocation else {
        return Err(PErr::syntax(
            crate::error::Pos { line: 1, col: 1 },
            "the program has no invocation: end it with `OnRemote(|f|(args), dest, rb, defaultRoute)`, the packet to build",
        ));
    };
    let ExprKind::Remote { chunk, dest, rb, route, .. } = &inv.kind else {
        return Err(PErr::syntax(inv.pos, "the invocation must be `OnRemote(...)` or `OnNeighbor(...)`"));
    };
    let mut g = Gen {
        funs: prog.funs.iter().map(|f| (f.name.as_str(), f)).collect(),
        notes,
        items: Vec::new(),
        depth: 0,
        labels: Vec::new(),
        chunks: HashMap::new(),
        chunk_queue: Vec::new(),
        routes: HashMap::new(),
        route_queue: Vec::new(),
        inline_depth: 0,
        emitted: 0,
    };
    let route_key = match route {
        Route::Default => None,
        Route::Fun(r, _) => Some(r.as_str()),
    };
    // defaultRoute's prologue comes first, as in Fig. 2.
    let entry = g.route_label(route_key, inv.pos);
    let entry_chunk = g.chunk_label(&chunk.fun);
    // Generate every block reachable from the invocation.
    let mut chunk_code: HashMap<&str, Vec<Item>> = HashMap::new();
    let mut route_code: Vec<(u32, String, Pos, Vec<Item>)> = Vec::new();
    let mut done_routes = 0;
    loop {
        if let Some(f) = g.chunk_queue.pop() {
            let (Some(&fun), Some(&label)) = (g.funs.get(f), g.chunks.get(f)) else { continue };
            g.items = vec![Item::Label(label)];
            g.depth = fun.params.len() as i64;
            let env: Env<'_> = fun.params.iter().enumerate().map(|(i, p)| (p.name.as_str(), i as i64)).collect();
            g.expr(&fun.body, &env, true)?;
            chunk_code.insert(f, std::mem::take(&mut g.items));
        } else if done_routes < g.route_queue.len() {
            let (r, pos) = g.route_queue[done_routes];
            done_routes += 1;
            let Some(&label) = g.routes.get(&r) else { continue };
            g.items = vec![Item::Label(label)];
            g.route_prologue(r, pos)?;
            let name = r.map_or_else(|| "defaultRoute".to_owned(), |r| format!("routing function {r}"));
            let rpos = r.and_then(|r| g.funs.get(r)).map_or(pos, |f| f.pos);
            route_code.push((label, name, rpos, std::mem::take(&mut g.items)));
        } else {
            break;
        }
    }
    let mut items = Vec::new();
    let mut blocks = Vec::new();
    let mut roots = Vec::new();
    for (label, name, pos, code) in route_code {
        blocks.push((label, name, pos));
        roots.push(label);
        items.extend(code);
    }
    for f in &prog.funs {
        if let Some(code) = chunk_code.remove(f.name.as_str()) {
            let Some(&label) = g.chunks.get(f.name.as_str()) else { continue };
            blocks.push((label, format!("fun {}", f.name), f.pos));
            roots.push(label);
            items.extend(code);
        }
    }
    // The initial stack, top first: the chunk's block, the final destination
    // for a user routing function, then the arguments, last first.
    let dst = dst_override.unwrap_or(match dest.kind {
        ExprKind::Host(a) => a,
        _ => Ipv4Addr::UNSPECIFIED,
    });
    let rb = rb_override.unwrap_or(match rb.kind {
        ExprKind::Int(v) => u16::try_from(v).unwrap_or(1),
        _ => 1,
    });
    let mut heap = Vec::new();
    let mut stack = vec![g.labels.get(entry_chunk as usize).cloned().unwrap_or_default()];
    if route_key.is_some() {
        stack.push(dst.to_string());
    }
    for a in chunk.args.iter().rev() {
        stack.push(const_value(a, &mut heap));
    }
    Ok(Code0 { items, labels: g.labels, roots, blocks, entry, stack, heap, dst, rb })
}

/// Assembler text for a constant; tuples and lists become heap objects.
fn const_value(e: &Expr, heap: &mut Vec<String>) -> String {
    match &e.kind {
        ExprKind::Int(v) => v.to_string(),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::Unit => "()".to_owned(),
        ExprKind::Float(x) => float_text(*x),
        ExprKind::Host(a) => a.to_string(),
        ExprKind::Str(s) => quote(s),
        ExprKind::Blob(b) => blob_text(b),
        ExprKind::Tuple(v) => {
            let parts: Vec<String> = v.iter().map(|x| const_value(x, heap)).collect();
            heap_tuple(parts, heap)
        }
        ExprKind::List(v) => {
            let mut tail = "()".to_owned();
            for x in v.iter().rev() {
                let h = const_value(x, heap);
                tail = heap_tuple(vec![h, tail], heap);
            }
            tail
        }
        ExprKind::Cons(h, t) => {
            let h = const_value(h, heap);
            let t = const_value(t, heap);
            heap_tuple(vec![h, t], heap)
        }
        _ => "()".to_owned(),
    }
}

fn heap_tuple(parts: Vec<String>, heap: &mut Vec<String>) -> String {
    let name = format!("H.{}", heap.len());
    heap.push(format!("{name}: tuple [{}]", parts.join(", ")));
    format!("@{name}")
}

/// A float as the assembler reads it back exactly.
pub(crate) fn float_text(x: f32) -> String {
    let s = format!("{x:?}");
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") { s } else { format!("{s}.0") }
}

/// Bytes as an assembler string literal.
pub(crate) fn quote(bytes: &[u8]) -> String {
    use core::fmt::Write;
    let mut s = String::with_capacity(bytes.len() + 2);
    s.push('"');
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            b'\r' => s.push_str("\\r"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => {
                let _ = write!(s, "\\x{b:02x}");
            }
        }
    }
    s.push('"');
    s
}

pub(crate) fn blob_text(b: &[u8]) -> String {
    format!("blob {}", quote(b))
}

fn int_imm(e: &Expr) -> Option<i64> {
    match e.kind {
        ExprKind::Int(v)
            if (i64::from(anode_snap::ops::IMM_MIN)..=i64::from(anode_snap::ops::IMM_MAX)).contains(&v) =>
        {
            Some(v)
        }
        _ => None,
    }
}

impl<'p> Gen<'p> {
    fn new_label(&mut self, name: Option<String>) -> u32 {
        let id = self.labels.len() as u32;
        self.labels.push(name.unwrap_or_else(|| format!("L.{id}")));
        id
    }

    fn chunk_label(&mut self, f: &'p str) -> u32 {
        if let Some(&l) = self.chunks.get(f) {
            return l;
        }
        let safe = Op::from_mnemonic(f).is_none() && !matches!(f, "word" | "addr" | "str" | "tuple" | "defaultRoute");
        let name = if safe { f.to_owned() } else { format!("fun.{f}") };
        let l = self.new_label(Some(name));
        self.chunks.insert(f, l);
        self.chunk_queue.push(f);
        l
    }

    fn route_label(&mut self, r: Option<&'p str>, pos: Pos) -> u32 {
        if let Some(&l) = self.routes.get(&r) {
            return l;
        }
        let name = r.map_or_else(|| "defaultRoute".to_owned(), |r| format!("route.{r}"));
        let l = self.new_label(Some(name));
        self.routes.insert(r, l);
        self.route_queue.push((r, pos));
        l
    }

    fn emit(&mut self, op: Op, arg: Arg, delta: i64, pos: Pos) -> PResult<()> {
        self.emitted += 1;
        if self.emitted > MAX_INSNS {
            return Err(PErr::limit(
                pos,
                format!(
                    "inlining and unrolling produce more than {MAX_INSNS} instructions (no packet could hold them)"
                ),
            ));
        }
        self.items.push(Item::Ins(op, arg));
        self.depth += delta;
        Ok(())
    }

    fn op(&mut self, op: Op, delta: i64, pos: Pos) -> PResult<()> {
        self.emit(op, Arg::None, delta, pos)
    }

    fn label(&mut self, l: u32) {
        self.items.push(Item::Label(l));
    }

    fn pull_slot(&mut self, slot: i64, pos: Pos) -> PResult<()> {
        let k = self.depth - 1 - slot;
        self.emit(Op::Pull, Arg::Imm(k), 1, pos)
    }

    fn route_prologue(&mut self, r: Option<&'p str>, pos: Pos) -> PResult<()> {
        match r {
            None => {
                self.depth = 1;
                self.op(Op::Forw, 0, pos)?;
                self.emit(Op::Paj, Arg::PajSelf, -1, pos)
            }
            Some(r) => {
                // Stack on arrival, top first: [block :: final dest :: args].
                let Some(&f) = self.funs.get(r) else {
                    return Err(PErr::new(
                        pos,
                        crate::error::ErrorKind::Unbound(format!("routing function `{r}` is not defined")),
                    ));
                };
                let arrived = self.new_label(None);
                self.depth = 2;
                self.pull_slot(0, pos)?;
                self.op(Op::IsHere, 0, pos)?;
                self.emit(Op::Bne, Arg::Label(arrived), -1, pos)?;
                self.pull_slot(0, pos)?;
                self.inline_on_stack(f, false, pos)?;
                self.op(Op::ForwTo, -1, pos)?;
                // The routing function chose this node, which is not the
                // destination: the packet cannot move on and ends.
                self.op(Op::Exit, 0, pos)?;
                self.label(arrived);
                self.depth = 2;
                self.emit(Op::Slide, Arg::Imm(1), -1, pos)?;
                self.emit(Op::Paj, Arg::PajSelf, -1, pos)
            }
        }
    }

    /// Inlines `f` whose arguments are the top `k` stack values.
    fn inline_on_stack(&mut self, f: &'p Fun, tail: bool, pos: Pos) -> PResult<()> {
        self.inline_depth += 1;
        if self.inline_depth > MAX_INLINE_DEPTH {
            return Err(PErr::limit(pos, format!("calls and folds nested more than {MAX_INLINE_DEPTH} deep")));
        }
        let k = f.params.len() as i64;
        let base = self.depth - k;
        let env: Env<'p> = f.params.iter().enumerate().map(|(i, p)| (p.name.as_str(), base + i as i64)).collect();
        self.expr(&f.body, &env, tail)?;
        if !tail && k > 0 {
            self.emit(Op::Slide, Arg::Imm(k), -k, pos)?;
        }
        self.inline_depth -= 1;
        Ok(())
    }

    /// Compiles `e`. Not in tail position it leaves one value on the stack;
    /// in tail position it ends the packet.
    fn expr(&mut self, e: &'p Expr, env: &Env<'p>, tail: bool) -> PResult<()> {
        let pos = e.pos;
        match &e.kind {
            ExprKind::Let(binds, body) => {
                let mut env2 = env.clone();
                for b in binds {
                    self.expr(&b.value, &env2, false)?;
                    env2.push((&b.name, self.depth - 1));
                }
                self.expr(body, &env2, tail)?;
                if !tail {
                    let n = binds.len() as i64;
                    self.emit(Op::Slide, Arg::Imm(n), -n, pos)?;
                }
                return Ok(());
            }
            ExprKind::If(c, a, b) => {
                let d0 = self.depth;
                let else_l = self.new_label(None);
                self.cond_branch(c, else_l, env)?;
                self.expr(a, env, tail)?;
                if tail {
                    self.label(else_l);
                    self.depth = d0;
                    return self.expr(b, env, true);
                }
                let end_l = self.new_label(None);
                self.emit(Op::Ji, Arg::Label(end_l), 0, pos)?;
                self.label(else_l);
                self.depth = d0;
                self.expr(b, env, false)?;
                self.label(end_l);
                return Ok(());
            }
            ExprKind::Seq(v) => {
                let n = v.len();
                for (i, x) in v.iter().enumerate() {
                    if i + 1 == n {
                        return self.expr(x, env, tail);
                    }
                    self.expr(x, env, false)?;
                    self.op(Op::Pop, -1, x.pos)?;
                }
                // An empty sequence cannot be parsed; treat it as unit.
                self.emit(Op::PushU, Arg::None, 1, pos)?;
            }
            ExprKind::Call(name, args) => {
                if let Some(&f) = self.funs.get(name.as_str()) {
                    for a in args {
                        self.expr(a, env, false)?;
                    }
                    return self.inline_on_stack(f, tail, pos);
                }
                if self.builtin(name, args, env, pos, tail)? {
                    return Ok(());
                }
                self.emit(Op::PushU, Arg::None, 1, pos)?;
            }
            ExprKind::Remote { chunk, dest, rb, route, .. } => {
                let route_key = match route {
                    Route::Default => None,
                    Route::Fun(r, _) => Some(r.as_str()),
                };
                let prologue = self.route_label(route_key, pos);
                let block = self.chunk_label(&chunk.fun);
                let k = chunk.args.len() as i64;
                for a in &chunk.args {
                    self.expr(a, env, false)?;
                }
                let s = if route_key.is_some() {
                    // The child starts here, so that the routing function
                    // also chooses the first hop; the final destination
                    // travels on its stack.
                    self.expr(dest, env, false)?;
                    self.emit(Op::Push, Arg::Label(block), 1, pos)?;
                    self.emit(Op::Push, Arg::Label(prologue), 1, pos)?;
                    self.emit(Op::Push, Arg::Imm(k + 2), 1, pos)?;
                    self.expr(rb, env, false)?;
                    self.op(Op::Here, 1, pos)?;
                    k + 2
                } else {
                    self.emit(Op::Push, Arg::Label(block), 1, pos)?;
                    self.emit(Op::Push, Arg::Label(prologue), 1, pos)?;
                    self.emit(Op::Push, Arg::Imm(k + 1), 1, pos)?;
                    self.expr(rb, env, false)?;
                    self.expr(dest, env, false)?;
                    k + 1
                };
                self.op(Op::Send, -3, pos)?;
                if tail {
                    return self.op(Op::Exit, 0, pos);
                }
                // Keep send's unit, drop the child's stack.
                self.emit(Op::Slide, Arg::Imm(s), -s, pos)?;
                return Ok(());
            }
            ExprKind::Fold { right, bound, fun, init, list } => {
                let n = bound.unwrap_or(1);
                if n > MAX_FOLD_BOUND {
                    return Err(PErr::limit(pos, format!("fold bound {n} is more than {MAX_FOLD_BOUND}")));
                }
                let Some(&f) = self.funs.get(fun.0.as_str()) else {
                    return Err(PErr::new(
                        fun.1,
                        crate::error::ErrorKind::Unbound(format!("`{}` is not defined", fun.0)),
                    ));
                };
                let kw = if *right { "foldr" } else { "foldl" };
                let msg = format!("{kw}[{n}] overflow at {pos}");
                if *right {
                    // Reverse the list (checking the bound), then fold it
                    // from the left with f's arguments swapped.
                    self.emit(Op::PushU, Arg::None, 1, pos)?;
                    self.expr(list, env, false)?;
                    self.fold_loop(n, None, Some(&msg), pos)?;
                    self.expr(init, env, false)?;
                    self.op(Op::Swap, 0, pos)?;
                    self.fold_loop(n, Some((f, true)), None, pos)?;
                } else {
                    self.expr(init, env, false)?;
                    self.expr(list, env, false)?;
                    self.fold_loop(n, Some((f, false)), Some(&msg), pos)?;
                }
            }
            _ => self.simple(e, env)?,
        }
        if tail {
            self.op(Op::Exit, 0, pos)?;
        }
        Ok(())
    }

    /// `[list :: acc]` → `[acc']`, unrolled `n` times. `step` is the function
    /// and whether to swap its arguments; `None` conses (list reversal).
    /// With `check`, a list longer than `n` aborts with that message.
    fn fold_loop(&mut self, n: u32, step: Option<(&'p Fun, bool)>, check: Option<&str>, pos: Pos) -> PResult<()> {
        let done = self.new_label(None);
        let d0 = self.depth;
        let empty = |g: &mut Gen<'p>| -> PResult<()> {
            g.emit(Op::Pull, Arg::Imm(0), 1, pos)?;
            g.emit(Op::IsTag, Arg::Imm(2), 0, pos)?;
            g.emit(Op::Bne, Arg::Label(done), -1, pos)
        };
        for _ in 0..n {
            empty(self)?;
            self.emit(Op::Pull, Arg::Imm(1), 1, pos)?; // acc
            self.emit(Op::Pull, Arg::Imm(1), 1, pos)?; // list
            self.emit(Op::Nth, Arg::Imm(0), 0, pos)?; // [x :: acc :: list :: acc]
            match step {
                Some((f, swap)) => {
                    if swap {
                        self.op(Op::Swap, 0, pos)?;
                    }
                    self.inline_on_stack(f, false, pos)?;
                }
                None => {
                    self.op(Op::Swap, 0, pos)?;
                    self.emit(Op::MkTup, Arg::Imm(2), -1, pos)?;
                }
            }
            self.emit(Op::Store, Arg::Imm(1), -1, pos)?; // [list :: acc']
            self.emit(Op::Nth, Arg::Imm(1), 0, pos)?; // [tl list :: acc']
        }
        if let Some(msg) = check {
            empty(self)?;
            self.emit(Op::Push, Arg::Const(Const::Str(msg.as_bytes().to_vec())), 1, pos)?;
            self.emit(Op::Calls, Arg::Const(Const::Str(b"abort".to_vec())), 0, pos)?;
        }
        self.label(done);
        self.depth = d0;
        self.op(Op::Pop, -1, pos)
    }

    /// Jumps to `target` when `c` is false.
    fn cond_branch(&mut self, c: &'p Expr, target: u32, env: &Env<'p>) -> PResult<()> {
        if let ExprKind::Un(UnOp::Not, x) = &c.kind {
            self.expr(x, env, false)?;
            return self.emit(Op::Bne, Arg::Label(target), -1, c.pos);
        }
        self.expr(c, env, false)?;
        self.emit(Op::Beq, Arg::Label(target), -1, c.pos)
    }

    /// Returns whether `name` was a built-in (it always is after checking).
    fn builtin(&mut self, name: &str, args: &'p [Expr], env: &Env<'p>, pos: Pos, tail: bool) -> PResult<bool> {
        let Some(b) = builtins::lookup(name) else { return Ok(false) };
        let n = args.len() as i64;
        match b.code {
            Code::InsnImm(op) => {
                for a in &args[..args.len().saturating_sub(1)] {
                    self.expr(a, env, false)?;
                }
                let k = args.last().and_then(int_imm).unwrap_or(0);
                self.emit(op, Arg::Imm(k), 1 - (n - 1), pos)?;
            }
            _ => {
                for a in args {
                    self.expr(a, env, false)?;
                }
                match b.code {
                    Code::Insn(op) => self.op(op, 1 - n, pos)?,
                    Code::Service(s) => {
                        self.emit(Op::Calls, Arg::Const(Const::Str(s.as_bytes().to_vec())), 1 - n, pos)?
                    }
                    Code::StateMember => {
                        self.emit(Op::Calls, Arg::Const(Const::Str(b"state.get".to_vec())), 0, pos)?;
                        self.emit(Op::IsTag, Arg::Imm(2), 0, pos)?;
                        self.op(Op::LNot, 0, pos)?;
                    }
                    Code::Deliver => {
                        self.op(Op::Demux, -2, pos)?;
                        // demux ends the packet; what follows is dead.
                        if tail {
                            return Ok(true);
                        }
                        self.depth += 1;
                    }
                    Code::Abort => {
                        self.emit(Op::Calls, Arg::Const(Const::Str(b"abort".to_vec())), 0, pos)?;
                        if tail {
                            return Ok(true);
                        }
                    }
                    Code::List => {
                        let (op, imm) = match name {
                            "hd" => (Op::Nth, 0),
                            "tl" => (Op::Nth, 1),
                            _ => (Op::IsTag, 2),
                        };
                        self.emit(op, Arg::Imm(imm), 0, pos)?;
                    }
                    Code::InsnImm(_) => {}
                }
            }
        }
        if tail {
            self.op(Op::Exit, 0, pos)?;
        }
        Ok(true)
    }

    /// Expressions without control flow of their own.
    fn simple(&mut self, e: &'p Expr, env: &Env<'p>) -> PResult<()> {
        let pos = e.pos;
        let num = |g: &Gen<'p>| g.notes.num.get(&e.id).copied().unwrap_or(Num::Int);
        match &e.kind {
            ExprKind::Int(v) => self.emit(Op::Push, Arg::Imm(*v), 1, pos),
            ExprKind::Bool(b) => self.emit(Op::PushB, Arg::Const(Const::Bool(*b)), 1, pos),
            ExprKind::Unit => self.emit(Op::PushU, Arg::None, 1, pos),
            ExprKind::Float(x) => self.emit(Op::PushH, Arg::Const(Const::Float(*x)), 1, pos),
            ExprKind::Host(a) => self.emit(Op::PushH, Arg::Const(Const::Host(*a)), 1, pos),
            ExprKind::Str(s) => self.emit(Op::PushH, Arg::Const(Const::Str(s.clone())), 1, pos),
            ExprKind::Blob(b) => self.emit(Op::PushH, Arg::Const(Const::Blob(b.clone())), 1, pos),
            ExprKind::Var(name) => {
                let slot = env.iter().rev().find(|(n, _)| n == name).map_or(0, |(_, s)| *s);
                self.pull_slot(slot, pos)
            }
            ExprKind::Bin(BinOp::And, a, b) => {
                let f = self.new_label(None);
                let end = self.new_label(None);
                let d0 = self.depth;
                self.cond_branch(a, f, env)?;
                self.expr(b, env, false)?;
                self.emit(Op::Ji, Arg::Label(end), 0, pos)?;
                self.label(f);
                self.depth = d0;
                self.emit(Op::PushB, Arg::Const(Const::Bool(false)), 1, pos)?;
                self.label(end);
                Ok(())
            }
            ExprKind::Bin(BinOp::Or, a, b) => {
                let t = self.new_label(None);
                let end = self.new_label(None);
                let d0 = self.depth;
                self.expr(a, env, false)?;
                self.emit(Op::Bne, Arg::Label(t), -1, pos)?;
                self.expr(b, env, false)?;
                self.emit(Op::Ji, Arg::Label(end), 0, pos)?;
                self.label(t);
                self.depth = d0;
                self.emit(Op::PushB, Arg::Const(Const::Bool(true)), 1, pos)?;
                self.label(end);
                Ok(())
            }
            ExprKind::Bin(op, a, b) => {
                let kind = num(self);
                // Integer operations with a literal right operand use the
                // immediate forms.
                if kind == Num::Int
                    && let Some(k) = int_imm(b)
                {
                    let iop = match op {
                        BinOp::Add => Some(Op::AddI),
                        BinOp::Sub => Some(Op::SubI),
                        BinOp::Mul => Some(Op::MulI),
                        BinOp::Div => Some(Op::DivI),
                        BinOp::Mod => Some(Op::ModI),
                        BinOp::Lt => Some(Op::LtI),
                        BinOp::Le => Some(Op::LeI),
                        BinOp::Gt => Some(Op::GtI),
                        BinOp::Ge => Some(Op::GeI),
                        BinOp::Eq => Some(Op::EqI),
                        BinOp::Ne => Some(Op::NeqI),
                        BinOp::And | BinOp::Or => None,
                    };
                    if let Some(iop) = iop {
                        self.expr(a, env, false)?;
                        return self.emit(iop, Arg::Imm(k), 0, pos);
                    }
                }
                self.expr(a, env, false)?;
                self.expr(b, env, false)?;
                let (op, swap) = match (op, kind) {
                    (BinOp::Eq, _) => (Op::Eq, false),
                    (BinOp::Ne, _) => (Op::Neq, false),
                    (BinOp::Add, Num::Int) => (Op::Add, false),
                    (BinOp::Sub, Num::Int) => (Op::Sub, false),
                    (BinOp::Mul, Num::Int) => (Op::Mul, false),
                    (BinOp::Div, Num::Int) => (Op::Div, false),
                    (BinOp::Mod, _) => (Op::Mod, false),
                    (BinOp::Lt, Num::Int) => (Op::Lt, false),
                    (BinOp::Le, Num::Int) => (Op::Le, false),
                    (BinOp::Gt, Num::Int) => (Op::Gt, false),
                    (BinOp::Ge, Num::Int) => (Op::Ge, false),
                    (BinOp::Add, Num::Float) => (Op::FAdd, false),
                    (BinOp::Sub, Num::Float) => (Op::FSub, false),
                    (BinOp::Mul, Num::Float) => (Op::FMul, false),
                    (BinOp::Div, Num::Float) => (Op::FDiv, false),
                    (BinOp::Lt, Num::Float) => (Op::FLt, false),
                    (BinOp::Le, Num::Float) => (Op::FLe, false),
                    (BinOp::Gt, Num::Float) => (Op::FLt, true),
                    (BinOp::Ge, Num::Float) => (Op::FLe, true),
                    (BinOp::And | BinOp::Or, _) => (Op::Eq, false),
                };
                if swap {
                    self.op(Op::Swap, 0, pos)?;
                }
                self.op(op, -1, pos)
            }
            ExprKind::Un(UnOp::Not, a) => {
                self.expr(a, env, false)?;
                self.op(Op::LNot, 0, pos)
            }
            ExprKind::Un(UnOp::Neg, a) => {
                self.expr(a, env, false)?;
                self.op(if num(self) == Num::Float { Op::FNeg } else { Op::Neg }, 0, pos)
            }
            ExprKind::Tuple(v) => {
                for x in v {
                    self.expr(x, env, false)?;
                }
                let n = v.len() as i64;
                self.emit(Op::MkTup, Arg::Imm(n), 1 - n, pos)
            }
            ExprKind::Proj(k, a) => {
                self.expr(a, env, false)?;
                self.emit(Op::Nth, Arg::Imm(i64::from(*k) - 1), 0, pos)
            }
            ExprKind::List(v) => {
                for x in v {
                    self.expr(x, env, false)?;
                }
                self.emit(Op::PushU, Arg::None, 1, pos)?;
                for _ in v {
                    self.emit(Op::MkTup, Arg::Imm(2), -1, pos)?;
                }
                Ok(())
            }
            ExprKind::Cons(h, t) => {
                self.expr(h, env, false)?;
                self.expr(t, env, false)?;
                self.emit(Op::MkTup, Arg::Imm(2), -1, pos)
            }
            // Handled by `expr`.
            ExprKind::Let(..)
            | ExprKind::If(..)
            | ExprKind::Seq(_)
            | ExprKind::Call(..)
            | ExprKind::Remote { .. }
            | ExprKind::Fold { .. } => self.emit(Op::PushU, Arg::None, 1, pos),
        }
    }
}
