//! Entry points for the cargo-fuzz targets under `fuzz/` (and for replaying
//! their corpora as ordinary tests). Each function panics only when an
//! invariant of the crate is broken, never because the input is bad.

use crate::vm::{End, SimpleNode, Vm, VmConfig};
use crate::wire::{Packet, Repr};
use core::net::Ipv4Addr;

/// Parses and executes arbitrary bytes as a SNAP packet, checking the
/// invariants of SNAP §IV on the outcome.
pub fn parse_execute(data: &[u8]) {
    let mut node = SimpleNode::new(Ipv4Addr::new(10, 0, 0, 2), 3);
    node.routes.push((Ipv4Addr::new(10, 0, 0, 3), Ipv4Addr::new(10, 0, 0, 3)));
    node.neighbors = vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3)];
    let cfg = VmConfig { mtu: 1400 };
    let mut vm = Vm::new(cfg);
    // Structural views never panic.
    if let Ok(p) = Packet::new_checked(data) {
        let _ = Repr::parse(&Packet::new_unchecked(&data[..p.total_len()]));
    }
    for headroom in [0usize, 8 * cfg.mtu] {
        let mut buf = data.to_vec();
        buf.resize(data.len() + headroom, 0);
        let out = vm.execute(&mut buf, data.len(), &node);
        check_invariants(data, out, 3);
    }
}

/// Checks an outcome against the guarantees the design makes for `input`.
pub fn check_invariants(input: &[u8], out: &crate::vm::Outcome, interfaces: u8) {
    let Ok(p) = Packet::new_checked(input) else {
        assert!(matches!(out.end, End::Fault { .. }));
        return;
    };
    let code = (p.code_len() - p.entry()) as u32;
    assert!(out.executed <= code, "executed {} > {} instructions", out.executed, code);
    assert!(out.max_stack <= p.stack_len() as u32 + code);
    assert!(out.heap_alloc <= 3 * code);
    assert!(out.net_ops <= interfaces);
    if let End::Fault { .. } = out.end {
        assert!(out.actions().is_empty(), "a faulting packet has no effect");
    } else {
        // Conservation (SNAP §IV-A.3): what is left plus what was given away
        // never exceeds what the packet arrived with, less the hop.
        assert!(out.rb_in >= 1);
        assert!(out.rb_left as u32 + out.rb_given < out.rb_in as u32);
        let memory = out.peak_memory as u64;
        assert!(memory >= p.total_len() as u64);
        assert!(memory <= p.total_len() as u64 + 12 * code as u64);
        assert!(memory <= 4 * 1400, "execution memory {memory} above 4 x MTU");
    }
}
/// Assembles arbitrary text; if it assembles, checks the binary round trip
/// through the disassembler.
pub fn assemble(data: &[u8]) {
    let Ok(src) = core::str::from_utf8(data) else { return };
    let Ok(repr) = crate::asm::assemble(src) else { return };
    let text = crate::disasm::disassemble(&repr);
    let again = crate::asm::assemble(&text);
    assert_eq!(again.as_ref().ok(), Some(&repr), "disassembly did not round-trip:\n{text}");
}
