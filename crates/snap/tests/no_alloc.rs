//! "No surprises in the data path": once warm, executing packets allocates
//! nothing — not for forwarding in place, not for the destination's work,
//! not for a child built by the copying pass, not for delivery.
//!
//! dhat's testing mode counts every heap allocation of the process, so this
//! test runs without the libtest harness (`harness = false`): one thread.
use anode_snap::vm::{End, SimpleNode, Vm, VmConfig};
use std::net::Ipv4Addr;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const PING: &str = include_str!("../../../examples/snap/ping.s");
const TRACEROUTE: &str = include_str!("../../../examples/snap/traceroute.s");
const COMPILED: &str = include_str!("../../../examples/snap/ping_compiled.s");

fn main() {
    steady_state_execution_does_not_allocate();
    println!("no_alloc: 1 passed, 0 failed");
}

fn steady_state_execution_does_not_allocate() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let a = |n| Ipv4Addr::new(10, 0, 0, n);
    let mut middle = SimpleNode::new(a(2), 2);
    middle.routes = vec![(a(1), a(1)), (a(3), a(3)), (a(4), a(3))];
    let mut dest = SimpleNode::new(a(3), 2);
    dest.routes = vec![(a(1), a(2)), (a(2), a(2))];
    let cases: Vec<(Vec<u8>, &SimpleNode, End)> = vec![
        (anode_snap::asm::assemble(PING).expect("ping").to_bytes().expect("emit"), &middle, End::Forwarded),
        (anode_snap::asm::assemble(PING).expect("ping").to_bytes().expect("emit"), &dest, End::Forwarded),
        (anode_snap::asm::assemble(TRACEROUTE).expect("tr").to_bytes().expect("emit"), &middle, End::Forwarded),
        (anode_snap::asm::assemble(COMPILED).expect("c").to_bytes().expect("emit"), &dest, End::Exit),
    ];
    let mut vm = Vm::new(VmConfig::default());
    let mut buf = vec![0u8; 2 * 1400];
    // The traceroute probe must have travelled one hop for the middle node to report.
    let run = |vm: &mut Vm, bytes: &[u8], node: &SimpleNode, buf: &mut Vec<u8>, hops: bool| {
        buf[..bytes.len()].copy_from_slice(bytes);
        if hops {
            // stack top (hop count) := 1
            let n = bytes.len();
            buf[n - 4..n].copy_from_slice(&1u32.to_be_bytes());
        }
        vm.execute(buf, bytes.len(), node).end
    };
    for (i, (bytes, node, want)) in cases.iter().enumerate() {
        assert_eq!(run(&mut vm, bytes, node, &mut buf, i == 2), *want, "case {i}");
    }
    let before = dhat::HeapStats::get();
    assert!(before.total_blocks > 0, "dhat is counting");
    for _ in 0..1000 {
        for (i, (bytes, node, _)) in cases.iter().enumerate() {
            run(&mut vm, bytes, node, &mut buf, i == 2);
        }
    }
    let after = dhat::HeapStats::get();
    assert_eq!(after.total_blocks, before.total_blocks, "allocations in the steady state");
}
