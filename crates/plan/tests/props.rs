//! Property: any program the compiler accepts yields SNAP code that the VM
//! never rejects for a structural reason (backward branch, branch out of
//! bounds, `mktup` rule, bad opcode or immediate, stack underflow, bad entry
//! point), checked statically and by running it on the simulator. The
//! generated programs are well-typed and avoid partial operations, so they
//! must not hit a type mismatch either.
#![allow(clippy::unwrap_used)]

use anode_plan::{Options, compile, structural_check};
use anode_snap::sim::Network;
use anode_snap::vm::{End, Fault, VmConfig};
use proptest::prelude::*;

fn int_expr() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        (-50i32..50).prop_map(|v| if v < 0 { format!("~{}", -v) } else { v.to_string() }),
        Just("x".to_owned()),
        Just("y".to_owned()),
        Just("getRB()".to_owned()),
        Just("numNeighbors()".to_owned()),
    ];
    leaf.prop_recursive(4, 40, 3, |inner| {
        let b = bool_expr_from(inner.clone().boxed());
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} * {b})")),
            (inner.clone(), 1i32..9).prop_map(|(a, k)| format!("({a} - {k})")),
            (inner.clone(), 1i32..9).prop_map(|(a, k)| format!("({a} mod {k})")),
            (b, inner.clone(), inner.clone()).prop_map(|(c, a, b)| format!("(if {c} then {a} else {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("(let val z = {a} in z + {b} end)")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("hd([{a}, {b}])")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("#2 ({a}, {b}, {a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("g({a}, {b})")),
            (1u32..4, inner.clone(), proptest::collection::vec(inner.clone(), 0..4))
                .prop_map(|(n, a, l)| format!("foldl[{n}](add, {a}, [{}])", l.join(", "))),
            (1u32..4, inner.clone(), proptest::collection::vec(inner.clone(), 0..4))
                .prop_map(|(n, a, l)| format!("foldr[{n}](radd, [{}], {a})", l.join(", "))),
            (inner.clone(), inner).prop_map(|(a, b)| format!("(print({a}); {b})")),
        ]
    })
    .boxed()
}

fn bool_expr_from(i: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![
        (i.clone(), i.clone()).prop_map(|(a, b)| format!("({a} < {b})")),
        (i.clone(), i.clone()).prop_map(|(a, b)| format!("({a} = {b})")),
        (i.clone(), i.clone()).prop_map(|(a, b)| format!("(not ({a} >= {b}) orelse {a} <> 3)")),
        (i.clone(), i.clone()).prop_map(|(a, b)| format!("({a} > 0 andalso {b} <= 2)")),
        i.prop_map(|a| format!("null(tl([{a}]))")),
    ]
    .boxed()
}

fn stmt() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        int_expr().prop_map(|e| format!("deliver({e}, 5)")),
        int_expr().prop_map(|e| format!("OnRemote(|sink|({e}, 5), getSrc(), getRB(), defaultRoute)")),
        int_expr().prop_map(|e| format!("OnNeighbor(|sink|({e}, 6), getSrc(), 1)")),
        int_expr().prop_map(|e| format!("OnRemote(|sink|({e}, 7), 10.0.0.1, 2, hop)")),
        int_expr().prop_map(|e| format!("print({e})")),
    ];
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            (int_expr(), inner.clone()).prop_map(|(e, s)| format!("(print({e}); {s})")),
            (bool_expr_from(int_expr()), inner.clone(), inner.clone())
                .prop_map(|(c, a, b)| format!("if {c} then {a} else {b}")),
            (int_expr(), inner.clone()).prop_map(|(e, s)| format!("let val w = {e} in {s} end")),
            (inner.clone(), inner).prop_map(|(a, b)| format!("({a}; {b})")),
        ]
    })
}

fn program(g: String, body: String, x: i32, y: i32, dst: u8, rb: u16) -> String {
    // g may not call itself.
    let g = g.replace("g(", "add(");
    format!(
        "fun add(acc: int, x: int) : int = acc + x\n\
         fun radd(x: int, acc: int) : int = acc * 2 + x\n\
         fun hop(d: host) : host = nextHop(d)\n\
         fun g(x: int, y: int) : int = {g}\n\
         fun sink(v: int, port: int) = deliver(v, port)\n\
         fun main(x: int, y: int) = {body}\n\
         OnRemote(|main|({x}, {y}), 10.0.0.{dst}, {rb}, defaultRoute)\n"
    )
}

fn structural(f: &Fault) -> bool {
    matches!(
        f,
        Fault::Wire(_)
            | Fault::BackwardBranch { .. }
            | Fault::BranchOutOfBounds { .. }
            | Fault::MktupTooClose
            | Fault::MktupPastEnd
            | Fault::InvalidOpcode { .. }
            | Fault::InvalidImmediate(_)
            | Fault::StackUnderflow
            | Fault::StackOverflow
            | Fault::OutOfMemory
            | Fault::BadEntryPoint(_)
            | Fault::TypeMismatch { .. }
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn accepted_programs_never_fault_structurally(
        g in int_expr(), body in stmt(), x in -100i32..100, y in -100i32..100, dst in 1u8..=4, rb in 1u16..40,
        optimize in any::<bool>(),
    ) {
        let src = program(g, body, x, y, dst, rb);
        let opts = Options { optimize, ..Options::default() };
        let Ok(c) = compile("p.plan", &src, &opts) else { return Ok(()) };
        if let Err(e) = structural_check(&c.packet, &c.chunk_starts) {
            panic!("{e}\n{src}\n{}", c.asm);
        }
        let mut net = Network::line(4, VmConfig::default());
        let report = net.inject(c.packet.src, &c.bytes, false);
        for h in &report.hops {
            if let End::Fault { fault, pc } = &h.end {
                prop_assert!(!structural(fault), "{fault} at {pc:?} on {}\n{src}\n{}", h.node, c.asm);
            }
        }
    }
}

/// The generator is not vacuous: most of its programs compile.
#[test]
fn generated_programs_mostly_compile() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut ok, mut total) = (0, 0);
    for _ in 0..100 {
        let g = int_expr().new_tree(&mut runner).unwrap().current();
        let b = stmt().new_tree(&mut runner).unwrap().current();
        total += 1;
        if compile("p.plan", &program(g, b, 1, 2, 3, 16), &Options::default()).is_ok() {
            ok += 1;
        }
    }
    assert!(ok * 2 > total, "only {ok} of {total} generated programs compile");
}
