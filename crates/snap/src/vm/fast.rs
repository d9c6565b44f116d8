//! The interpreter's fast loop: the stack, integer, comparison, branch and
//! blob-read instructions, on their happy path only.
//!
//! The general loop in [`Vm::run`](super::Vm) keeps some twenty values live
//! (the heap regions, the execution heap, the counters for memory and
//! network operations, the outcome, the context), more than x86-64 has
//! registers, so LLVM reloads several of them from the stack on every
//! instruction, even on `add`, and every operand goes through a stack slot.
//! This loop keeps only what its instructions touch: the code, the stack,
//! the packet's own heap, `pc`, `sp`, the stretch's highest `sp`, the
//! instructions skipped by branches, and the top of the stack itself, in a
//! register. Operators modulo 2^25 skip the sign extension, and `push k`
//! with an operator after it runs as one (see [`run`]).
//!
//! It never faults and never does anything the general loop would not. An
//! instruction it does not handle, or one that would fault (a stack
//! underflow or overflow, a division by zero, a backward branch, an invalid
//! immediate, an `eq` that must look into the heap, a blob read outside the
//! packet's own heap), ends it *before* that instruction changes anything:
//! the general loop then runs the instruction and raises the fault itself,
//! with its own message and trace. So after the fast loop the live state
//! (`pc`, the stack's words below `sp`, the counters) is exactly what the
//! general loop would have left; only stack slots above the top, which
//! nothing reads, may differ. The tests check this by running every
//! instruction case and random programs both ways
//! ([`traced_and_untraced_agree`](crate::fuzzing::traced_and_untraced_agree):
//! with a tracer the fast loop is never taken).
//!
//! A first version without the register for the top of the stack cut a
//! quarter of the machine instructions and was slower in time
//! (docs/benchmarks.md, "SNAP VM", fourth pass).

use super::{Endian, opc};
use crate::ops::{IMM_MASK, sext25, trunc25};
use crate::value::{Tag, Value, split_header};

/// The part of the general loop's state the fast loop reads and advances.
#[derive(Debug, Clone, Copy)]
pub(super) struct Regs {
    /// Index of the next instruction.
    pub pc: usize,
    /// Stack depth in words (stack region words in use).
    pub sp: usize,
    /// Highest `sp` since the last heap allocation.
    pub seg_max: usize,
    /// Instructions skipped by taken branches (so executed = pc − entry − skipped).
    pub skipped: usize,
}

/// The word the loop reads past the end of the code (opcode 127, which it
/// does not handle).
const PAST_END: [u8; 4] = [0xff; 4];
const _: () = assert!(!FAST[127]);

/// Whether the fast loop handles opcode `op` (when it would not fault).
pub(super) const FAST: [bool; 128] = {
    let mut t = [false; 128];
    let ops = [
        opc::Nop,
        opc::Push,
        opc::PushB,
        opc::PushU,
        opc::Pop,
        opc::PopI,
        opc::Pull,
        opc::Store,
        opc::Slide,
        opc::Swap,
        opc::Bne,
        opc::Beq,
        opc::Ji,
        opc::Paj,
        opc::Depth,
        opc::Add,
        opc::Sub,
        opc::Mul,
        opc::Div,
        opc::Mod,
        opc::Neg,
        opc::Abs,
        opc::Min,
        opc::Max,
        opc::AddI,
        opc::SubI,
        opc::MulI,
        opc::DivI,
        opc::ModI,
        opc::And,
        opc::Or,
        opc::Xor,
        opc::Not,
        opc::Shl,
        opc::Shr,
        opc::ShrU,
        opc::AndI,
        opc::OrI,
        opc::XorI,
        opc::ShlI,
        opc::ShrI,
        opc::LNot,
        opc::Eq,
        opc::Neq,
        opc::Lt,
        opc::Le,
        opc::Gt,
        opc::Ge,
        opc::EqI,
        opc::NeqI,
        opc::LtI,
        opc::LeI,
        opc::GtI,
        opc::GeI,
        opc::BGet,
        opc::BGet16,
    ];
    let mut i = 0;
    while i < ops.len() {
        t[ops[i] as usize] = true;
        i += 1;
    }
    t
};

/// Whether instruction word `w` has an opcode the fast loop handles.
#[inline(always)]
pub(super) fn handles(w: u32) -> bool {
    FAST[(w >> 25) as usize & 127]
}

/// Whether to enter the fast loop at `pc`, whose word is `w`, with `sp`
/// words on the stack: when it and the next two instructions are ones it
/// handles (entering and leaving it costs about as much as two instructions
/// in the general loop), and the stack is not empty (the loop keeps the top
/// word in a register).
#[inline(always)]
pub(super) fn worth_it<E: Endian>(code: &[[u8; 4]], pc: usize, w: u32, sp: usize) -> bool {
    handles(w)
        && sp > 0
        && code.get(pc + 1).is_some_and(|b| handles(E::get(*b)))
        && code.get(pc + 2).is_some_and(|b| handles(E::get(*b)))
}

/// Runs instructions from `r.pc` until one it does not handle, or the end
/// of the code; `r` is left at that instruction, not yet run. `r.sp` must be
/// at least 1; it stays so (an instruction that would empty the stack is
/// left to the general loop).
///
/// The top word of the stack lives in a register (`tos`, in host order)
/// while the loop runs, and its slot in `st` is stale: an integer
/// instruction then costs no load and store of the stack, which otherwise
/// put a store-to-load round trip on the critical path of every
/// instruction. It is written back when the loop ends.
#[inline(never)]
pub(super) fn run<E: Endian>(code: &[[u8; 4]], st: &mut [[u8; 4]], heap: &[[u8; 4]], h0: u32, r: &mut Regs) {
    let Regs { mut pc, mut sp, mut seg_max, mut skipped } = *r;
    let Some(top) = sp.checked_sub(1).and_then(|i| st.get(i)) else { return };
    let mut tos = E::get(*top);
    let code_len = code.len();
    loop {
        // Past the end of the code, a word whose opcode (127) the loop does
        // not handle, so that it ends (a select: no branch to predict).
        let w = E::get(*code.get(pc).unwrap_or(&PAST_END));
        let (op, imm) = ((w >> 25) as u8, w & IMM_MASK);
        // Each arm checks everything first and breaks (handing the
        // instruction to the general loop) before it changes any state.
        //
        // Pushes `$v`: the old top goes to its slot.
        macro_rules! push {
            ($v:expr) => {{
                let v: Value = $v;
                if sp >= st.len() {
                    break;
                }
                let Some(b) = st.get_mut(sp - 1) else { break };
                *b = E::put(tos);
                tos = v.0;
                sp += 1;
                if sp > seg_max {
                    seg_max = sp;
                }
            }};
        }
        // The word below the top, for an instruction that pops the top
        // (there must be one: the stack never empties here).
        macro_rules! second {
            () => {{
                let Some(b) = sp.checked_sub(2).and_then(|i| st.get(i)) else { break };
                E::get(*b)
            }};
        }
        // The top word replaced by `$e` of its 25-bit integer.
        macro_rules! top1 {
            (|$a:ident| $e:expr) => {{
                let $a = sext25(tos);
                let v: Value = $e;
                tos = v.0;
            }};
        }
        // The integer operators whose 25-bit result depends only on the
        // low 25 bits of their operands (arithmetic modulo 2^25, bitwise,
        // left shifts): computed on the words as they are and truncated,
        // with no sign extension (`Value::int(sext25(a) op sext25(b))` is
        // `(a op b) & IMM_MASK` for these), which keeps two instructions
        // off the top word's dependency chain.
        macro_rules! ring1 {
            (|$a:ident| $e:expr) => {{
                let $a: u32 = tos;
                let v: u32 = $e;
                tos = v & IMM_MASK;
            }};
        }
        macro_rules! ring2 {
            (|$a:ident, $b:ident| $e:expr) => {{
                let ($a, $b): (u32, u32) = (second!(), tos);
                let v: u32 = $e;
                tos = v & IMM_MASK;
                sp -= 1;
            }};
        }
        // The top two words replaced by `$e` of their integers.
        macro_rules! top2 {
            (|$a:ident, $b:ident| $e:expr) => {{
                let ($a, $b) = (sext25(second!()), sext25(tos));
                let v: Value = $e;
                tos = v.0;
                sp -= 1;
            }};
        }
        // A forward branch by `$off` from this instruction, popping the top
        // (`$pop`) once it is known to be valid; the arm must end with it.
        macro_rules! jump {
            ($off:expr, $pop:expr) => {{
                let off: i64 = $off;
                let target = pc as i64 + off;
                if off < 1 || target > code_len as i64 {
                    break;
                }
                if $pop {
                    tos = second!();
                    sp -= 1;
                }
                skipped += target as usize - (pc + 1);
                // One back edge for every instruction: `pc += 1` below.
                pc = target as usize - 1;
            }};
        }
        // The blob or string the top word refers to, when it lies whole in
        // the packet's own heap (the first `h0` words of `heap`): its offset
        // and length in bytes. Anything else (the execution heap, a wrong
        // type, a bad extent) is the general loop's, which faults.
        macro_rules! blob {
            () => {{
                let v = Value(tos);
                let tc = v.tag_code();
                if tc != Tag::Blob as u32 && tc != Tag::Str as u32 {
                    break;
                }
                let off = v.datum();
                if off >= h0 {
                    break;
                }
                let Some(hb) = heap.get(off as usize) else { break };
                let (ty, len) = split_header(E::get(*hb));
                if ty != tc || off as u64 + 1 + len.div_ceil(4) as u64 > h0 as u64 {
                    break;
                }
                (off, len)
            }};
        }
        // Heap word `i` of the packet's own heap (`i < h0` by the extent check).
        macro_rules! word {
            ($i:expr) => {{
                let Some(b) = heap.get($i as usize) else { break };
                E::get(*b)
            }};
        }
        match op {
            opc::Nop => {}
            opc::Push => {
                // `push k` and an arithmetic or bitwise operator after it run
                // as one, without the stack round trip (the value `k` would
                // have gone to a slot above the top, which nothing reads).
                // Past the end, [`PAST_END`]'s opcode (a branch here: a
                // select and a load cost the ALU program 0.5 Ir per instruction).
                let next = code.get(pc + 1).map_or(127, |b| (E::get(*b) >> 25) as u8);
                let fused = match next {
                    opc::Add => Some(tos.wrapping_add(imm)),
                    opc::Sub => Some(tos.wrapping_sub(imm)),
                    opc::Mul => Some(tos.wrapping_mul(imm)),
                    opc::And => Some(tos & imm),
                    opc::Or => Some(tos | imm),
                    opc::Xor => Some(tos ^ imm),
                    _ => None,
                };
                match fused {
                    // The push needs room, as alone.
                    Some(v) if sp < st.len() => {
                        tos = v & IMM_MASK;
                        if sp + 1 > seg_max {
                            seg_max = sp + 1;
                        }
                        pc += 1;
                    }
                    _ => push!(Value(imm)),
                }
            }
            opc::PushB => {
                if imm > 1 {
                    break;
                }
                push!(Value::bool(imm != 0))
            }
            opc::PushU => push!(Value::UNIT),
            opc::Pop => {
                tos = second!();
                sp -= 1;
            }
            opc::PopI => {
                // Leaves at least one word.
                let Some(s) = sp.checked_sub(imm as usize).filter(|&s| s > 0) else { break };
                if s < sp {
                    let Some(b) = st.get(s - 1) else { break };
                    tos = E::get(*b);
                    sp = s;
                }
            }
            opc::Pull => {
                let v = if imm == 0 {
                    tos
                } else {
                    let Some(b) = sp.checked_sub(imm as usize + 1).and_then(|i| st.get(i)) else { break };
                    E::get(*b)
                };
                push!(Value(v))
            }
            opc::Store => {
                // Pops the top into the word `imm + 1` below the new top.
                let Some(i) = sp.checked_sub(imm as usize + 2) else { break };
                // With `imm` 0, into the new top itself: `tos` stays.
                if imm != 0 {
                    let new_top = second!();
                    let Some(b) = st.get_mut(i) else { break };
                    *b = E::put(tos);
                    tos = new_top;
                }
                sp -= 1;
            }
            opc::Slide => {
                // The top moves down `imm` words, dropping those: in a
                // register, only `sp` changes.
                let Some(s) = sp.checked_sub(imm as usize) else { break };
                if s == 0 {
                    break;
                }
                sp = s;
            }
            opc::Swap => {
                let Some(b) = sp.checked_sub(2).and_then(|i| st.get_mut(i)) else { break };
                let below = E::get(*b);
                *b = E::put(tos);
                tos = below;
            }
            opc::Bne => {
                if sp < 2 {
                    break;
                }
                if Value(tos).datum() != 0 {
                    jump!(sext25(imm) as i64, true)
                } else {
                    tos = second!();
                    sp -= 1;
                }
            }
            opc::Beq => {
                if sp < 2 {
                    break;
                }
                if Value(tos).datum() == 0 {
                    jump!(sext25(imm) as i64, true)
                } else {
                    tos = second!();
                    sp -= 1;
                }
            }
            opc::Ji => jump!(sext25(imm) as i64, false),
            opc::Paj => {
                if sp < 2 {
                    break;
                }
                let v = sext25(tos) as i64;
                jump!(v + sext25(imm) as i64, true)
            }
            opc::Depth => push!(Value::int(sp as i32)),
            opc::Add => ring2!(|a, b| a.wrapping_add(b)),
            opc::Sub => ring2!(|a, b| a.wrapping_sub(b)),
            opc::Mul => ring2!(|a, b| a.wrapping_mul(b)),
            opc::Div | opc::Mod => {
                let b = sext25(tos);
                if b == 0 {
                    break;
                }
                let div = op == opc::Div;
                top2!(|a, b| Value::int(if div { a.wrapping_div(b) } else { a.wrapping_rem(b) }))
            }
            opc::Neg => ring1!(|a| a.wrapping_neg()),
            opc::Abs => top1!(|a| Value::int(a.wrapping_abs())),
            opc::Min => top2!(|a, b| Value::int(a.min(b))),
            opc::Max => top2!(|a, b| Value::int(a.max(b))),
            opc::AddI => ring1!(|a| a.wrapping_add(imm)),
            opc::SubI => ring1!(|a| a.wrapping_sub(imm)),
            opc::MulI => ring1!(|a| a.wrapping_mul(imm)),
            opc::DivI | opc::ModI => {
                let b = sext25(imm);
                if b == 0 {
                    break;
                }
                let div = op == opc::DivI;
                top1!(|a| Value::int(if div { a.wrapping_div(b) } else { a.wrapping_rem(b) }))
            }
            opc::And => ring2!(|a, b| a & b),
            opc::Or => ring2!(|a, b| a | b),
            opc::Xor => ring2!(|a, b| a ^ b),
            opc::Not => ring1!(|a| !a),
            opc::Shl => ring2!(|a, b| a.wrapping_shl(b & 31)),
            opc::Shr => top2!(|a, b| Value::int(a >> (b as u32 & 31))),
            opc::ShrU => top2!(|a, b| Value::int((trunc25(a) >> (b as u32 & 31)) as i32)),
            opc::AndI => ring1!(|a| a & imm),
            opc::OrI => ring1!(|a| a | imm),
            opc::XorI => ring1!(|a| a ^ imm),
            opc::ShlI => ring1!(|a| a.wrapping_shl(imm & 31)),
            opc::ShrI => top1!(|a| Value::int(a >> (imm & 31))),
            // `datum() == 0` of the word is `sext25 == 0`.
            opc::LNot => top1!(|a| Value::bool(a == 0)),
            opc::Eq | opc::Neq => {
                let (a, b) = (Value(second!()), Value(tos));
                let same = if a.tag_code() != b.tag_code() {
                    false
                } else if a.0 == b.0 {
                    true
                } else if matches!(a.tag(), Some(Tag::Addr | Tag::Float)) {
                    // Compared by value in the heap: the general loop's.
                    break;
                } else {
                    false
                };
                tos = Value::bool(same == (op == opc::Eq)).0;
                sp -= 1;
            }
            opc::Lt => top2!(|a, b| Value::bool(a < b)),
            opc::Le => top2!(|a, b| Value::bool(a <= b)),
            opc::Gt => top2!(|a, b| Value::bool(a > b)),
            opc::Ge => top2!(|a, b| Value::bool(a >= b)),
            opc::EqI => top1!(|a| Value::bool(a == sext25(imm))),
            opc::NeqI => top1!(|a| Value::bool(a != sext25(imm))),
            opc::LtI => top1!(|a| Value::bool(a < sext25(imm))),
            opc::LeI => top1!(|a| Value::bool(a <= sext25(imm))),
            opc::GtI => top1!(|a| Value::bool(a > sext25(imm))),
            opc::GeI => top1!(|a| Value::bool(a >= sext25(imm))),
            // The blob is popped and the result pushed: the top word is
            // replaced.
            opc::BGet => {
                let (off, len) = blob!();
                if imm >= len {
                    break;
                }
                let b = (word!(off + 1 + imm / 4) >> (8 * (3 - imm % 4))) as u8;
                tos = Value::int(b as i32).0;
            }
            opc::BGet16 => {
                let (off, len) = blob!();
                if imm as u64 + 2 > len as u64 {
                    break;
                }
                let v = if imm % 4 != 3 {
                    (word!(off + 1 + imm / 4) >> (8 * (2 - imm % 4))) as u16
                } else {
                    ((word!(off + 1 + imm / 4) as u16 & 0xff) << 8) | (word!(off + 2 + imm / 4) >> 24) as u16
                };
                tos = Value::int(v as i32).0;
            }
            _ => break,
        }
        pc += 1;
    }
    // The top back to its slot (`1 <= sp <= st.len()` throughout).
    if let Some(b) = sp.checked_sub(1).and_then(|i| st.get_mut(i)) {
        *b = E::put(tos);
    }
    *r = Regs { pc, sp, seg_max, skipped };
}
