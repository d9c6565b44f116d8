//! Compiled against hand-written ping (SNAP §VII-B): bytes of program
//! overhead and per-hop execution cost, side by side in one criterion run.
//!
//! Run: `cargo bench -p anode-plan --bench ping -- --warm-up-time 1 --measurement-time 3`.
//! Results are in `docs/benchmarks.md`.
//!
//! Three pings from 10.0.0.1 to 10.0.0.3 with the 4-byte payload "ping":
//! - `fig1`: `examples/snap/ping.s`, the paper's hand-written Fig. 1;
//! - `fig2`: `examples/snap/ping_compiled.s`, the paper's compiler output
//!   (Fig. 2) as printed;
//! - `plan`: `examples/plan/ping.plan` compiled by anode-plan.
//!
//! Each is timed at the three kinds of hop a ping makes: `forward` (an
//! intermediate node, 10.0.0.2), `turnaround` (the destination builds the
//! reply) and `deliver` (the reply arrives at the source). Every iteration
//! copies the packet back into the execution buffer first (the same copy for
//! all three programs), then executes it once.

use anode_snap::vm::{Action, End, SimpleNode, Vm, VmConfig};
use anode_snap::wire::{HEADER_LEN, Repr};
use criterion::{Criterion, criterion_group};
use std::hint::black_box;
use std::net::Ipv4Addr;

fn a(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn asm(path: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(root().join(path)).expect("example");
    anode_snap::asm::assemble(&text).expect("assembles").to_bytes().expect("encodes")
}

fn plan_ping() -> Vec<u8> {
    let text = std::fs::read_to_string(root().join("examples/plan/ping.plan")).expect("example");
    anode_plan::compile("ping.plan", &text, &anode_plan::Options::default()).expect("compiles").bytes
}

struct Hop {
    vm: Vm,
    node: SimpleNode,
    orig: Vec<u8>,
    buf: Vec<u8>,
}

impl Hop {
    fn new(pkt: &[u8], here: Ipv4Addr) -> Hop {
        let code_len = (pkt.len() - HEADER_LEN) / 4;
        let mut buf = vec![0u8; Vm::buffer_need(pkt.len(), code_len)];
        buf[..pkt.len()].copy_from_slice(pkt);
        Hop { vm: Vm::new(VmConfig::default()), node: SimpleNode::new(here, 2), orig: pkt.to_vec(), buf }
    }
    #[inline(always)]
    fn run(&mut self) -> u32 {
        let len = self.orig.len();
        self.buf[..len].copy_from_slice(&self.orig);
        black_box(self.vm.execute(&mut self.buf, len, &self.node)).executed
    }
    /// Runs once; returns the end, the instruction count and the packet it
    /// sends, if any.
    fn once(&mut self) -> (End, u32, Option<Vec<u8>>) {
        let len = self.orig.len();
        self.buf[..len].copy_from_slice(&self.orig);
        let out = self.vm.execute(&mut self.buf, len, &self.node);
        let sent = out.actions().iter().find_map(|act| match act {
            Action::Send { packet, .. } => Some(out.bytes(packet, &self.buf).to_vec()),
            Action::Deliver { .. } => None,
        });
        (out.end, out.executed, sent)
    }
}

/// The three hops of one program: (forward, turnaround, deliver).
fn hops(first: &[u8]) -> [Hop; 3] {
    let mut fwd = Hop::new(first, a(2));
    let (end, _, moved) = fwd.once();
    assert_eq!(end, End::Forwarded);
    let mut turn = Hop::new(&moved.expect("forwarded packet"), a(3));
    let (_, _, reply) = turn.once();
    let reply = reply.expect("reply");
    // The reply's next hop is 10.0.0.2, where it is forwarded as above; time
    // its arrival at the source.
    let mut dl = Hop::new(&reply, a(1));
    let (end, _, _) = dl.once();
    assert_eq!(end, End::Delivered, "the reply delivers at the source");
    [fwd, turn, dl]
}

fn bench_ping(c: &mut Criterion) {
    let programs =
        [("fig1", asm("examples/snap/ping.s")), ("fig2", asm("examples/snap/ping_compiled.s")), ("plan", plan_ping())];
    println!("program overhead (packet bytes minus the 4-byte payload) and instructions per hop:");
    let mut all = Vec::new();
    for (name, pkt) in &programs {
        let r = Repr::parse_bytes(pkt).expect("parses");
        let mut h = hops(pkt);
        let counts: Vec<u32> = h.iter_mut().map(|h| h.once().1).collect();
        println!(
            "  {name}: {} bytes overhead ({} code words); instructions forward/turnaround/deliver = {}/{}/{}",
            pkt.len() - 4,
            r.code.len(),
            counts[0],
            counts[1],
            counts[2]
        );
        all.push((*name, h));
    }
    let mut g = c.benchmark_group("plan_ping");
    for (i, hop) in ["forward", "turnaround", "deliver"].iter().enumerate() {
        for (name, h) in all.iter_mut() {
            let h = &mut h[i];
            g.bench_function(format!("{hop}/{name}"), |b| b.iter(|| h.run()));
        }
    }
    g.finish();
}

criterion_group!(benches, bench_ping);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
