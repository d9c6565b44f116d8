//! Entry points for the cargo-fuzz targets under `fuzz/` (and for replaying
//! their corpora as ordinary tests). Each function panics only when an
//! invariant of the crate is broken, never because the input is bad.

use crate::ops::Insn;
use crate::vm::{Action, End, Outcome, SimpleNode, TraceView, Tracer, Vm, VmConfig};
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
        if let Err(e) = traced_and_untraced_agree(data, headroom, &node, cfg) {
            panic!("{e}");
        }
    }
}

/// A tracer that records nothing: with it the interpreter runs every
/// instruction in its general loop (a tracer must see each one), never in
/// the fast loop.
struct GeneralLoopOnly;

impl Tracer for GeneralLoopOnly {
    const ENABLED: bool = true;
    fn step(&mut self, _: usize, _: Result<Insn, u32>, _: &TraceView<'_>) {}
}

/// Everything observable about one run, for comparing two.
fn observed(out: &Outcome, buf: &[u8], live: usize) -> String {
    let acts: Vec<_> = out
        .actions()
        .iter()
        .map(|a| match a {
            Action::Send { dest, kind, packet } => format!("send {dest} {kind:?} {:02x?}", out.bytes(packet, buf)),
            Action::Deliver { port, payload } => format!("deliver {port} {:02x?}", out.bytes(payload, buf)),
        })
        .collect();
    // The stack's live words; above them the two loops may leave different
    // dead words, which nothing reads.
    let live = live + 4 * out.depth as usize;
    format!(
        "end {:?}, executed {}, max_stack {}, depth {}, heap_alloc {}, peak_memory {}, net_ops {}, rb {}/{}/{}, \
         log {:?}, actions {acts:?}, live bytes {:02x?}",
        out.end,
        out.executed,
        out.max_stack,
        out.depth,
        out.heap_alloc,
        out.peak_memory,
        out.net_ops,
        out.rb_in,
        out.rb_given,
        out.rb_left,
        out.log,
        buf.get(..live).unwrap_or(buf)
    )
}

/// Runs `data` as a SNAP packet (with `headroom` bytes of room after it)
/// twice, with a tracer, so in the interpreter's general loop only, and
/// without, so with its fast loop where that applies, and checks that
/// everything observable agrees: the outcome and its counters, the actions
/// and their bytes, and the packet's live bytes (header, code, heap and the
/// stack's `depth` words). Returns the first difference.
///
/// # Errors
/// A description of both runs when they differ.
pub fn traced_and_untraced_agree(data: &[u8], headroom: usize, node: &SimpleNode, cfg: VmConfig) -> Result<(), String> {
    let live = Packet::new_checked(data).map_or(0, |p| p.total_len() - 4 * p.stack_len() as usize);
    let mut runs = [String::new(), String::new()];
    for (traced, run) in runs.iter_mut().enumerate() {
        let mut buf = data.to_vec();
        buf.resize(data.len() + headroom, 0);
        let mut vm = Vm::new(cfg);
        let out = if traced == 1 {
            vm.execute_traced(&mut buf, data.len(), node, &mut GeneralLoopOnly)
        } else {
            vm.execute(&mut buf, data.len(), node)
        };
        *run = observed(out, &buf, live);
    }
    if runs[0] == runs[1] {
        Ok(())
    } else {
        Err(format!("the fast and the general loop disagree:\n  fast:    {}\n  general: {}", runs[0], runs[1]))
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
