//! PLAN to SNAP: a compiler from a high-level functional packet language to
//! forward-only SNAP code (SNAP paper §V; issue 5).
//!
//! The source language is a documented subset of PLAN with ML syntax (see
//! `docs/plan.md`). The pipeline:
//!
//! 1. [`parser`] (with [`lexer`]): text → [`ast::Program`], with limits on
//!    source size and nesting;
//! 2. [`types`]: names, the recursion check (direct or mutual, naming the
//!    cycle), and type checking with inference of result types;
//! 3. [`codegen`]: every call inlined, every fold unrolled to its bound,
//!    forward-only SNAP code with one block per remotely evaluated function
//!    and one routing prologue per routing function;
//! 4. [`opt`]: dead code after exiting `send`/`demux`, needless pulls, stack
//!    clean-up; then the `mktup` padding;
//! 5. assembler text, assembled by [`anode_snap::asm::assemble`] and checked
//!    against the packet size limit.
//!
//! Every failure is an [`Error`] with file, line and column; no input makes
//! the compiler panic or work without bound.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ast;
pub mod builtins;
pub mod codegen;
pub mod error;
pub mod fuzzing;
pub mod lexer;
pub mod opt;
pub mod parser;
pub mod types;

pub use error::{Error, ErrorKind, Pos};

use anode_snap::wire::Repr;
use codegen::{Arg, Const, Item};
use core::fmt::Write;
use core::net::Ipv4Addr;

/// Compiler options: header fields and limits.
#[derive(Debug, Clone)]
pub struct Options {
    /// Largest packet, in bytes (the MTU). Default 1400, the node default.
    pub mtu: usize,
    /// Source address of the built packet (the injecting node).
    pub src: Ipv4Addr,
    /// Replaces the invocation's destination.
    pub dst: Option<Ipv4Addr>,
    /// Replaces the invocation's resource bound.
    pub rb: Option<u16>,
    /// The header's application port (`getPort()`).
    pub port: u16,
    /// Run the optimisations (on by default; off shows the plain
    /// translation).
    pub optimize: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            mtu: anode_snap::vm::DEFAULT_MTU,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: None,
            rb: None,
            port: 0,
            optimize: true,
        }
    }
}

/// A compiled program.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Assembler text (`anode snap asm` accepts it).
    pub asm: String,
    /// The packet.
    pub packet: Repr,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Code words of each block: (description, words).
    pub blocks: Vec<(String, usize)>,
    /// Instruction index where each remotely evaluated function's block
    /// starts: the targets of the routing prologues' `paj`.
    pub chunk_starts: Vec<usize>,
}

/// Compiles `src` (named `file` in errors) into a SNAP packet.
pub fn compile(file: &str, src: &str, opts: &Options) -> Result<Compiled, Error> {
    compile_inner(src, opts).map_err(|e| e.with_file(file))
}

/// Parses and checks `src` without generating code.
pub fn check(file: &str, src: &str) -> Result<(), Error> {
    let prog = parser::parse(src).map_err(|e| e.with_file(file))?;
    types::check(&prog).map_err(|e| e.with_file(file))?;
    Ok(())
}

fn compile_inner(src: &str, opts: &Options) -> Result<Compiled, error::PErr> {
    let prog = parser::parse(src)?;
    let notes = types::check(&prog)?;
    let mut code = codegen::generate(&prog, &notes, opts.dst, opts.rb)?;
    if opts.optimize {
        opt::optimise(&mut code.items, &code.roots);
    }
    opt::pad_mktup(&mut code.items);
    let inv_pos = prog.invocation.as_ref().map_or(Pos { line: 1, col: 1 }, |e| e.pos);
    let text = render(&code, opts);
    let packet = anode_snap::asm::assemble(&text).map_err(|e| {
        error::PErr::limit(inv_pos, format!("the generated code does not assemble ({e}); this is a compiler bug"))
    })?;
    // Per-block sizes, for the report and the size error.
    let mut blocks: Vec<(String, usize, Pos)> = Vec::new();
    let mut chunk_starts = Vec::new();
    let mut cur: Option<usize> = None;
    let mut index = 0;
    for it in &code.items {
        match it {
            Item::Label(l) => {
                if let Some(b) = code.blocks.iter().find(|b| b.0 == *l) {
                    blocks.push((b.1.clone(), 0, b.2));
                    cur = Some(blocks.len() - 1);
                    if b.1.starts_with("fun ") {
                        chunk_starts.push(index);
                    }
                }
            }
            Item::Ins(..) => {
                index += 1;
                if let Some(c) = cur {
                    blocks[c].1 += 1;
                }
            }
        }
    }
    let bytes = packet.to_bytes().map_err(|e| {
        error::PErr::new(
            inv_pos,
            ErrorKind::TooLarge { bytes: usize::MAX, limit: opts.mtu, detail: format!("a section is too long: {e}") },
        )
    })?;
    if bytes.len() > opts.mtu {
        let largest = blocks.iter().max_by_key(|b| b.1);
        let (pos, detail) = match largest {
            Some((name, words, pos)) => (
                *pos,
                format!(
                    "{} code, {} heap and {} stack words; the largest block is {name} with {words} instructions",
                    packet.code.len(),
                    packet.heap.len(),
                    packet.stack.len()
                ),
            ),
            None => (inv_pos, String::new()),
        };
        return Err(error::PErr::new(pos, ErrorKind::TooLarge { bytes: bytes.len(), limit: opts.mtu, detail }));
    }
    Ok(Compiled {
        asm: text,
        packet,
        bytes,
        blocks: blocks.into_iter().map(|(n, w, _)| (n, w)).collect(),
        chunk_starts,
    })
}

fn render(code: &codegen::Code0, opts: &Options) -> String {
    let name = |l: u32| code.labels.get(l as usize).cloned().unwrap_or_default();
    let mut s = String::new();
    let _ = writeln!(s, "; compiled by anode-plan");
    let _ = writeln!(s, ".src {}", opts.src);
    let _ = writeln!(s, ".dst {}", code.dst);
    let _ = writeln!(s, ".rb {}", code.rb);
    let _ = writeln!(s, ".port {}", opts.port);
    let _ = writeln!(s, ".entry {}", name(code.entry));
    let _ = writeln!(s, ".stack {}", code.stack.join(", "));
    let _ = writeln!(s);
    let mut index = 0i64;
    for it in &code.items {
        match it {
            Item::Label(l) => {
                let _ = writeln!(s, "{}:", name(*l));
            }
            Item::Ins(op, arg) => {
                let operand = match arg {
                    Arg::None => String::new(),
                    Arg::Imm(k) => k.to_string(),
                    Arg::Label(l) => name(*l),
                    Arg::PajSelf => (-index).to_string(),
                    Arg::Const(c) => match c {
                        Const::Str(b) => codegen::quote(b),
                        Const::Blob(b) => codegen::blob_text(b),
                        Const::Host(a) => a.to_string(),
                        Const::Float(x) => codegen::float_text(*x),
                        Const::Bool(b) => b.to_string(),
                        Const::Unit => "()".to_owned(),
                    },
                };
                // The assembler picks pushb/pushu/pushh from a `push` operand.
                let mn = match op {
                    anode_snap::Op::PushB | anode_snap::Op::PushH => "push".to_owned(),
                    anode_snap::Op::PushU => "push ()".to_owned(),
                    _ => op.to_string(),
                };
                if operand.is_empty() {
                    let _ = writeln!(s, "        {mn}");
                } else {
                    let _ = writeln!(s, "        {mn} {operand}");
                }
                index += 1;
            }
        }
    }
    if !code.heap.is_empty() {
        let _ = writeln!(s, ".heap");
        for h in &code.heap {
            let _ = writeln!(s, "{h}");
        }
    }
    s
}

/// Checks the structural rules of SNAP that compiled code must obey: every
/// code word is an instruction; every `bne`/`beq`/`ji` goes forward and stays
/// within the code; every `paj` lands, for each block index the code pushes,
/// forward within the code; every `mktup n` is followed by at least `n-1`
/// instructions before the next `mktup` and before the end (§IV-A.2). The VM
/// checks all of these as it runs; this is the static counterpart used by
/// the tests and the fuzz target.
pub fn structural_check(p: &Repr, chunk_starts: &[usize]) -> Result<(), String> {
    use anode_snap::{Insn, Op};
    let len = p.code.len() as i64;
    let mut insns = Vec::with_capacity(p.code.len());
    for (i, &w) in p.code.iter().enumerate() {
        insns.push(Insn::decode(w).map_err(|e| format!("word {i}: {e}"))?);
    }
    let pushed: Vec<i64> = chunk_starts.iter().map(|&i| i as i64).collect();
    let mut fence = 0i64;
    for (at, ins) in insns.iter().enumerate() {
        let at = at as i64;
        match ins.op {
            Op::Bne | Op::Beq | Op::Ji => {
                let off = ins.imm_value();
                if off < 1 || at + off > len {
                    return Err(format!("{at}: {ins} jumps to {}", at + off));
                }
            }
            Op::Paj => {
                for &t in &pushed {
                    let to = t + ins.imm_value();
                    if to < 1 || at + to > len {
                        return Err(format!("{at}: {ins} with {t} on the stack jumps to {}", at + to));
                    }
                }
            }
            Op::MkTup => {
                if at < fence {
                    return Err(format!("{at}: mktup within {fence} (the previous mktup's shadow)"));
                }
                fence = at + ins.imm_value().max(1);
                if fence > len {
                    return Err(format!("{at}: {ins} without enough instructions after it"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A readable, stable summary of what a packet did on the simulator
/// ([`anode_snap::sim::Network`]): one line per hop, then the deliveries and
/// the number of link transmissions. Used by `anode plan run --sim` and the
/// golden tests.
pub fn outcome_text(report: &anode_snap::sim::Report) -> String {
    use anode_snap::vm::{End, SendKind};
    let mut s = String::new();
    for h in &report.hops {
        let end = match &h.end {
            End::Exit => "exit".to_owned(),
            End::Forwarded => "forwarded".to_owned(),
            End::Delivered => "delivered".to_owned(),
            End::Fault { fault, pc } => match pc {
                Some(pc) => format!("fault {} at {pc}: {fault}", fault.kind()),
                None => format!("fault {}: {fault}", fault.kind()),
            },
        };
        let _ = write!(s, "{}: {end} after {} instructions", h.node, h.executed);
        for (dest, via, kind, bytes) in &h.sends {
            let k = match kind {
                SendKind::Forward => "forward",
                SendKind::Child => "child",
            };
            let _ = write!(s, "; {k} to {dest} via {via} ({bytes} bytes)");
        }
        s.push('\n');
    }
    for d in &report.deliveries {
        let text = if d.payload.iter().all(|b| (0x20..0x7f).contains(b)) {
            format!("{:?}", String::from_utf8_lossy(&d.payload))
        } else {
            d.payload.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let _ = writeln!(s, "delivered at {} on port {}: {text}", d.node, d.port);
    }
    for (node, dest) in &report.unroutable {
        let _ = writeln!(s, "unroutable at {node}: no route to {dest}");
    }
    let _ = writeln!(s, "{} link transmissions", report.transmissions);
    s
}
