//! Property tests of SNAP §IV's guarantees: for arbitrary bytes and for
//! arbitrary well-formed programs, execution never panics, executes at most
//! |code| instructions, stays within the memory bound, never exceeds the
//! node's network operations, and conserves the resource bound — at one
//! node and across a whole network.

use anode_snap::fuzzing::{check_invariants, parse_execute, traced_and_untraced_agree};
use anode_snap::ops::{ALL_OPS, IMM_MASK, ImmKind, Insn, Op};
use anode_snap::sim::Network;
use anode_snap::value::{Tag, Value, header};
use anode_snap::vm::{End, SimpleNode, Vm, VmConfig};
use anode_snap::wire::{HEADER_LEN, Repr};
use proptest::prelude::*;
use std::net::Ipv4Addr;

fn a(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

/// A fixed heap with one object of each kind: addr@0, float@2, blob@4 (6
/// bytes), tuple@7 (3 elements referring to the others), str@11 "clock.ms",
/// str@14 "state.get".
fn heap() -> Vec<u32> {
    let mut h = vec![header(Tag::Addr, 1), u32::from(a(3))];
    h.extend([header(Tag::Float, 1), 1.5f32.to_bits()]);
    h.extend([header(Tag::Blob, 6), u32::from_be_bytes(*b"abcd"), u32::from_be_bytes([b'e', b'f', 0, 0])]);
    h.extend([header(Tag::Tuple, 3), Value::heap(Tag::Addr, 0).0, Value::int(-4).0, Value::heap(Tag::Blob, 4).0]);
    h.extend([header(Tag::Str, 8), u32::from_be_bytes(*b"cloc"), u32::from_be_bytes(*b"k.ms")]);
    h.extend([
        header(Tag::Str, 9),
        u32::from_be_bytes(*b"stat"),
        u32::from_be_bytes(*b"e.ge"),
        u32::from_be_bytes([b't', 0, 0, 0]),
    ]);
    h
}

const HEAP_REFS: [u32; 6] = [0, 2, 4, 7, 11, 14];

fn value() -> impl Strategy<Value = u32> {
    prop_oneof![
        (-50i32..50).prop_map(|i| Value::int(i).0),
        any::<bool>().prop_map(|b| Value::bool(b).0),
        Just(Value::UNIT.0),
        Just(Value::heap(Tag::Addr, 0).0),
        Just(Value::heap(Tag::Float, 2).0),
        Just(Value::heap(Tag::Blob, 4).0),
        Just(Value::heap(Tag::Tuple, 7).0),
        Just(Value::heap(Tag::Str, 11).0),
        (0..4u32).prop_map(|p| Value::int(p as i32).0),
        any::<u32>(),
    ]
}

/// One instruction at position `at` of a program of `len` instructions,
/// with an immediate valid for its kind (branches forward and in bounds).
fn insn(at: usize, len: usize) -> impl Strategy<Value = u32> {
    // Bias toward instructions that grow the stack so programs run longer
    // before the random operands run out.
    let stack_ops = [Op::Push, Op::Pull, Op::PushH, Op::Here, Op::GetRb];
    let pick = prop_oneof![
        3 => (0..ALL_OPS.len()).prop_map(|i| ALL_OPS[i]),
        2 => (0..stack_ops.len()).prop_map(move |i| stack_ops[i]),
    ];
    with_immediate(pick, at, len)
}

/// The stack, integer, comparison, branch and blob-read instructions the
/// interpreter's fast loop runs (`crates/snap/src/vm/fast.rs`).
const FAST_OPS: [Op; 56] = [
    Op::Nop,
    Op::Push,
    Op::PushB,
    Op::PushU,
    Op::Pop,
    Op::PopI,
    Op::Pull,
    Op::Store,
    Op::Slide,
    Op::Swap,
    Op::Bne,
    Op::Beq,
    Op::Ji,
    Op::Paj,
    Op::Depth,
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::Mod,
    Op::Neg,
    Op::Abs,
    Op::Min,
    Op::Max,
    Op::AddI,
    Op::SubI,
    Op::MulI,
    Op::DivI,
    Op::ModI,
    Op::And,
    Op::Or,
    Op::Xor,
    Op::Not,
    Op::Shl,
    Op::Shr,
    Op::ShrU,
    Op::AndI,
    Op::OrI,
    Op::XorI,
    Op::ShlI,
    Op::ShrI,
    Op::LNot,
    Op::Eq,
    Op::Neq,
    Op::Lt,
    Op::Le,
    Op::Gt,
    Op::Ge,
    Op::EqI,
    Op::NeqI,
    Op::LtI,
    Op::LeI,
    Op::GtI,
    Op::GeI,
    Op::BGet,
    Op::BGet16,
];

/// One instruction, mostly of the fast loop's, with runs of `push` and an
/// operator (which it runs as one) likely.
fn fast_insn(at: usize, len: usize) -> impl Strategy<Value = u32> {
    let fused = [Op::Push, Op::Add, Op::Sub, Op::Mul, Op::And, Op::Or, Op::Xor];
    let pick = prop_oneof![
        6 => (0..FAST_OPS.len()).prop_map(|i| FAST_OPS[i]),
        3 => (0..fused.len()).prop_map(move |i| fused[i]),
        1 => (0..ALL_OPS.len()).prop_map(|i| ALL_OPS[i]),
    ];
    with_immediate(pick, at, len)
}

/// `op` with an immediate valid for its kind (branches forward and in
/// bounds) at position `at` of a program of `len` instructions.
fn with_immediate(pick: impl Strategy<Value = Op>, at: usize, len: usize) -> impl Strategy<Value = u32> {
    (pick, any::<u32>(), -8i32..8).prop_map(move |(op, r, small)| {
        let imm: i64 = match op.imm_kind() {
            ImmKind::None => 0,
            ImmKind::Int => small as i64,
            ImmKind::Adjust => small as i64 - at as i64 / 2,
            ImmKind::Offset => 1 + (r as usize % (len - at)) as i64,
            ImmKind::Count => match op {
                Op::MkTup => (r % 4) as i64,
                Op::AMask | Op::AMatch => (r % 34) as i64,
                _ => (r % 6) as i64,
            },
            ImmKind::HeapRef => HEAP_REFS[r as usize % HEAP_REFS.len()] as i64,
            ImmKind::Bool => (r % 2) as i64,
            ImmKind::Tag => (r % 9) as i64,
        };
        Insn::new(op, imm).map(Insn::encode).unwrap_or(Op::Nop as u32)
    })
}

fn program() -> impl Strategy<Value = Repr> {
    (1usize..120)
        .prop_flat_map(|len| {
            let code: Vec<_> = (0..len).map(|at| insn(at, len)).collect();
            (code, prop::collection::vec(value(), 0..16), 1u16..6, any::<bool>(), 0..3u8)
        })
        .prop_map(|(code, stack, rb, le, dst)| Repr {
            little_endian: le,
            entry: 0,
            resource_bound: rb,
            port: 5,
            src: a(1),
            dst: a(1 + dst),
            code,
            heap: heap(),
            stack,
        })
}

/// Programs mostly of the fast loop's instructions on random stacks.
fn fast_program() -> impl Strategy<Value = Repr> {
    (1usize..80)
        .prop_flat_map(|len| {
            let code: Vec<_> = (0..len).map(|at| fast_insn(at, len)).collect();
            (code, prop::collection::vec(value(), 0..12), any::<bool>())
        })
        .prop_map(|(code, stack, le)| Repr {
            little_endian: le,
            entry: 0,
            resource_bound: 3,
            port: 5,
            src: a(1),
            dst: a(2),
            code,
            heap: heap(),
            stack,
        })
}

fn node(interfaces: u8) -> SimpleNode {
    let mut n = SimpleNode::new(a(2), interfaces);
    n.routes = vec![(a(1), a(1)), (a(3), a(3))];
    n.neighbors = vec![a(1), a(3)];
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        parse_execute(&data);
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_header(
        words in prop::collection::vec(any::<u32>(), 1..200),
        split in (0usize..200, 0usize..200),
        rb in 0u16..4, le in any::<bool>(),
    ) {
        // A header whose lengths match the random body, so execution starts.
        let n = words.len();
        let c = 1 + split.0 % n;
        let h = split.1 % (n - c + 1);
        let r = Repr {
            little_endian: le, entry: 0, resource_bound: rb, port: 0, src: a(1), dst: a(3),
            code: words[..c].to_vec(), heap: words[c..c + h].to_vec(), stack: words[c + h..].to_vec(),
        };
        let bytes = r.to_bytes().expect("emit");
        parse_execute(&bytes);
    }

    #[test]
    fn well_formed_programs_keep_the_guarantees(p in program(), interfaces in 1u8..4) {
        let bytes = p.to_bytes().expect("emit");
        let cfg = VmConfig::default();
        let mut vm = Vm::new(cfg);
        let n = node(interfaces);
        for headroom in [0, 4 * p.code.len()] {
            let mut buf = bytes.clone();
            buf.resize(bytes.len() + headroom, 0);
            let out = vm.execute(&mut buf, bytes.len(), &n);
            check_invariants(&bytes, out, interfaces);
            // Children and forwarded packets are themselves valid, within
            // the MTU, and carry at least 1 of resource bound.
            for act in out.actions() {
                if let anode_snap::Action::Send { packet, .. } = act {
                    let pb = out.bytes(packet, &buf);
                    prop_assert!(pb.len() <= cfg.mtu && pb.len() >= HEADER_LEN);
                    let child = Repr::parse_bytes(pb);
                    prop_assert!(child.is_ok(), "child does not parse: {:?}", child);
                    prop_assert!(child.map(|c| c.resource_bound >= 1).unwrap_or(false));
                }
            }
        }
    }

    /// The interpreter's fast loop (taken only without a tracer) agrees
    /// with its general loop in everything observable, on programs made
    /// mostly of its instructions and on the general random programs, in
    /// place, copied, and with a stack that can overflow.
    #[test]
    fn the_fast_loop_agrees_with_the_general_loop(p in fast_program(), q in program(), small_mtu in any::<bool>()) {
        let n = node(3);
        for r in [&p, &q] {
            let bytes = r.to_bytes().expect("emit");
            let mtu = if small_mtu { bytes.len() + 16 } else { VmConfig::default().mtu };
            let cfg = VmConfig { mtu };
            for headroom in [0, 4 * r.code.len(), 8] {
                if let Err(e) = traced_and_untraced_agree(&bytes, headroom, &n, cfg) {
                    prop_assert!(false, "{}", e);
                }
            }
        }
    }

    /// SNAP §IV-A.3 across a network: a packet injected with bound n causes
    /// at most n transmissions, whatever it does.
    #[test]
    fn resource_bound_is_conserved_across_a_network(p in program()) {
        let mut net = Network::line(4, VmConfig::default());
        let rb = p.resource_bound as usize;
        let r = net.inject(a(1), &p.to_bytes().expect("emit"), false);
        let sent = r.hops.len() - 1 + r.unroutable.len();
        prop_assert!(sent <= rb, "{} packets sent with resource bound {}", sent, rb);
        for h in &r.hops {
            if let End::Fault { .. } = h.end {
                prop_assert!(h.sends.is_empty());
            }
        }
    }
}

#[test]
fn generated_programs_exercise_the_vm() {
    // Guard against a generator that only ever produces instant faults.
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strat = program();
    let (mut ran, mut sent, mut delivered) = (0u32, 0, 0);
    let mut vm = Vm::default();
    for _ in 0..3000 {
        let p = strat.new_tree(&mut runner).expect("tree").current();
        let bytes = p.to_bytes().expect("emit");
        let mut buf = bytes.clone();
        buf.resize(bytes.len() * 8, 0);
        let out = vm.execute(&mut buf, bytes.len(), &node(3));
        ran += out.executed;
        sent += out.actions().iter().filter(|x| matches!(x, anode_snap::Action::Send { .. })).count();
        delivered += out.actions().iter().filter(|x| matches!(x, anode_snap::Action::Deliver { .. })).count();
    }
    assert!(ran > 10_000, "only {ran} instructions executed");
    assert!(sent > 50 && delivered > 5, "sent {sent}, delivered {delivered}");
    let _ = IMM_MASK;
}
