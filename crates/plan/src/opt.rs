//! Optimisations on generated code, and the `mktup` padding every program
//! needs.
//!
//! - **Dead code**: nothing after an instruction that always ends or leaves
//!   the straight line (`exit`, `demux`, `ji`, `paj`) runs until the next label
//!   some branch or `push` refers to, so it is removed. This drops what
//!   follows an exiting `send` (the paper's Fig. 2 keeps `pop; popi 3; exit`)
//!   or a `demux`.
//! - **Needless pulls**: `pull 1; pull 1` before `demux` copies the two values
//!   already on top of the stack (footnote 5 of the paper), so both go; a
//!   value pushed or pulled and then popped is never made; stack shuffling
//!   right before `exit` is dropped; `exit` as the last instruction is implied.
//! - **Stack clean-up**: `slide`/`pop`/`popi` runs merge.
//! - **Jumps**: a `ji` to the next instruction goes; a `ji` to an `exit`
//!   becomes `exit`.
//!
//! Then `mktup n` gets the `n-1` non-`mktup` instructions it must be followed
//! by (SNAP §IV-A.2), padding with `nop` where needed.

use crate::codegen::{Arg, Item};
use anode_snap::Op;
use std::collections::HashSet;

/// Most rounds of the optimiser (each round only ever shrinks the code).
const MAX_ROUNDS: usize = 64;

fn referenced(items: &[Item], roots: &[u32]) -> HashSet<u32> {
    let mut s: HashSet<u32> = roots.iter().copied().collect();
    for it in items {
        if let Item::Ins(_, Arg::Label(l)) = it {
            s.insert(*l);
        }
    }
    s
}

fn ends_straight_line(op: Op) -> bool {
    matches!(op, Op::Exit | Op::Demux | Op::Ji | Op::Paj)
}

/// Pushes a value without any other effect and without faulting.
fn pure_push(op: Op) -> bool {
    matches!(
        op,
        Op::Push
            | Op::PushB
            | Op::PushU
            | Op::PushH
            | Op::Pull
            | Op::GetRb
            | Op::GetEp
            | Op::GetPort
            | Op::GetIfc
            | Op::NNbr
            | Op::Depth
            | Op::GetSrc
            | Op::GetDst
            | Op::Here
    )
}

/// Only moves stack values around.
fn stack_only(op: Op) -> bool {
    pure_push(op) || matches!(op, Op::Pop | Op::PopI | Op::Slide | Op::Swap | Op::Store | Op::Nop)
}

fn imm(a: &Arg) -> i64 {
    match a {
        Arg::Imm(k) => *k,
        _ => 0,
    }
}

/// Runs every optimisation to a fixed point.
pub(crate) fn optimise(items: &mut Vec<Item>, roots: &[u32]) {
    for _ in 0..MAX_ROUNDS {
        let before = items.clone();
        remove_dead(items, roots);
        peephole(items);
        jumps(items);
        trailing_exit(items);
        if *items == before {
            break;
        }
    }
}

fn remove_dead(items: &mut Vec<Item>, roots: &[u32]) {
    let refs = referenced(items, roots);
    let mut live = true;
    items.retain(|it| match it {
        Item::Label(l) => {
            if refs.contains(l) {
                live = true;
                true
            } else {
                false
            }
        }
        Item::Ins(op, _) => {
            let keep = live;
            if live && ends_straight_line(*op) {
                live = false;
            }
            keep
        }
    });
}

fn peephole(items: &mut Vec<Item>) {
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for it in items.drain(..) {
        out.push(it);
        loop {
            let n = out.len();
            let last = |k: usize| -> Option<(Op, Arg)> {
                match out.get(n.checked_sub(k)?) {
                    Some(Item::Ins(op, a)) => Some((*op, a.clone())),
                    _ => None,
                }
            };
            let (Some((op2, a2)), p1) = (last(1), last(2)) else { break };
            let p2 = last(3);
            let rewrite: Option<(usize, Vec<Item>)> = match (p2.as_ref(), p1.as_ref(), op2) {
                // pull 1; pull 1; demux: the two values are already there.
                (Some((Op::Pull, x)), Some((Op::Pull, y)), Op::Demux) if imm(x) == 1 && imm(y) == 1 => {
                    Some((3, vec![Item::Ins(Op::Demux, Arg::None)]))
                }
                _ => match (p1, op2) {
                    (Some((o, _)), Op::Pop) if pure_push(o) => Some((2, vec![])),
                    (Some((o, _)), Op::Exit) if stack_only(o) => Some((2, vec![Item::Ins(Op::Exit, Arg::None)])),
                    (Some((Op::Slide, k)), Op::Pop) => Some((2, vec![popi(imm(&k) + 1)])),
                    (Some((Op::Pop, _)), Op::Pop) => Some((2, vec![popi(2)])),
                    (Some((Op::PopI, k)), Op::Pop) => Some((2, vec![popi(imm(&k) + 1)])),
                    (Some((Op::Pop, _)), Op::PopI) => Some((2, vec![popi(imm(&a2) + 1)])),
                    (Some((Op::PopI, k)), Op::PopI) => Some((2, vec![popi(imm(&k) + imm(&a2))])),
                    (Some((Op::Slide, k)), Op::Slide) => {
                        Some((2, vec![Item::Ins(Op::Slide, Arg::Imm(imm(&k) + imm(&a2)))]))
                    }
                    (_, Op::Slide | Op::PopI) if imm(&a2) == 0 => Some((1, vec![])),
                    (_, Op::PopI) if imm(&a2) == 1 => Some((1, vec![Item::Ins(Op::Pop, Arg::None)])),
                    _ => None,
                },
            };
            match rewrite {
                Some((k, repl)) => {
                    out.truncate(n - k);
                    out.extend(repl);
                }
                None => break,
            }
        }
    }
    *items = out;
}

fn popi(k: i64) -> Item {
    if k == 1 { Item::Ins(Op::Pop, Arg::None) } else { Item::Ins(Op::PopI, Arg::Imm(k)) }
}

fn jumps(items: &mut Vec<Item>) {
    // Where each label points: the first instruction after it.
    let mut target_op: std::collections::HashMap<u32, Option<Op>> = std::collections::HashMap::new();
    let mut pending: Vec<u32> = Vec::new();
    for it in items.iter() {
        match it {
            Item::Label(l) => pending.push(*l),
            Item::Ins(op, _) => {
                for l in pending.drain(..) {
                    target_op.insert(l, Some(*op));
                }
            }
        }
    }
    for l in pending {
        target_op.insert(l, None);
    }
    let mut i = 0;
    while i < items.len() {
        if let Item::Ins(Op::Ji, Arg::Label(l)) = items[i] {
            // Jump to the very next instruction: remove it.
            let mut j = i + 1;
            let mut next = false;
            while let Some(Item::Label(m)) = items.get(j) {
                if *m == l {
                    next = true;
                }
                j += 1;
            }
            if next {
                items.remove(i);
                continue;
            }
            if matches!(target_op.get(&l), Some(Some(Op::Exit)) | Some(None)) {
                items[i] = Item::Ins(Op::Exit, Arg::None);
            }
        }
        i += 1;
    }
}

fn trailing_exit(items: &mut Vec<Item>) {
    if let Some(i) = items.iter().rposition(|it| matches!(it, Item::Ins(..)))
        && items[i] == Item::Ins(Op::Exit, Arg::None)
    {
        items.remove(i);
    }
}

/// Pads with `nop` so that every `mktup n` is followed by at least `n-1`
/// instructions before the next `mktup` and before the end of the code.
pub(crate) fn pad_mktup(items: &mut Vec<Item>) {
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    // Instructions still owed to the last mktup.
    let mut owed: i64 = 0;
    for it in items.drain(..) {
        match &it {
            Item::Ins(Op::MkTup, a) => {
                for _ in 0..owed.max(0) {
                    out.push(Item::Ins(Op::Nop, Arg::None));
                }
                owed = imm(a).max(1) - 1;
            }
            Item::Ins(..) => owed -= 1,
            Item::Label(_) => {}
        }
        out.push(it);
    }
    for _ in 0..owed.max(0) {
        out.push(Item::Ins(Op::Nop, Arg::None));
    }
    *items = out;
}
