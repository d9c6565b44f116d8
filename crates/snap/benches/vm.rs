//! SNAP VM benchmarks (issue 3): cost per packet, fixed cost, cost per
//! instruction, and a side-by-side comparison with rbpf 0.4's eBPF interpreter
//! and (issue 19) with the same programs compiled to WebAssembly and run by
//! wasmtime, entry included.
//!
//! Run: `cargo bench -p anode-snap --bench vm -- --warm-up-time 1 --measurement-time 3`.
//! Results and their reading are in `docs/benchmarks.md`.
//!
//! Execution mutates the packet buffer (the resource bound is decremented, `forw`
//! rewrites header fields, pushes overwrite stack words), so each iteration
//! restores what the program changes. Every workload's restore is checked once
//! at setup: after a run and a restore the packet bytes equal the original.
//!
//! With `SNAP_BENCH_ITERS=N` set, the binary skips criterion and runs every
//! workload N times, printing each workload's instruction counts; meant for
//! `valgrind --tool=callgrind`, where the difference between two values of N
//! gives a repeatable machine-instruction count per run.

use anode_snap::ops::{Insn, Op};
use anode_snap::value::{Tag, Value, header};
use anode_snap::vm::{End, SimpleNode, Vm, VmConfig};
use anode_snap::wire::{HEADER_LEN, Repr};
use criterion::{Criterion, Throughput, criterion_group};
use std::hint::black_box;
use std::net::Ipv4Addr;

fn a(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn insn(op: Op, imm: i64) -> u32 {
    Insn::new(op, imm).expect("immediate in range").encode()
}

/// Heap words of a blob: header, then the bytes packed big-endian, zero padded.
fn blob_words(bytes: &[u8]) -> Vec<u32> {
    let mut v = vec![header(Tag::Blob, bytes.len() as u32)];
    for chunk in bytes.chunks(4) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        v.push(u32::from_be_bytes(w));
    }
    v
}

fn packet(src: Ipv4Addr, dst: Ipv4Addr, code: Vec<u32>, heap: Vec<u32>, stack: Vec<u32>) -> Vec<u8> {
    Repr { little_endian: false, entry: 0, resource_bound: 16, port: 7, src, dst, code, heap, stack }
        .to_bytes()
        .expect("packet encodes")
}

/// The paper's ping (Fig. 1) with stack `[blob "ping", 7, top]` (top last).
fn ping(src: Ipv4Addr, dst: Ipv4Addr, top: i32) -> Vec<u8> {
    let code = vec![
        insn(Op::Forw, 0),
        insn(Op::Bne, 5),
        insn(Op::Push, 1),
        insn(Op::GetSrc, 0),
        insn(Op::ForwTo, 0),
        insn(Op::Pop, 0),
        insn(Op::Demux, 0),
    ];
    let stack = vec![Value::heap(Tag::Blob, 0).0, Value::int(7).0, Value::int(top).0];
    packet(src, dst, code, blob_words(b"ping"), stack)
}

/// What an iteration must put back before the next run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Restore {
    /// Only the resource bound (header bytes 4..6) changes.
    Rb,
    /// The resource bound and the packet's last word (the stack top).
    RbAndTop,
    /// Copy the whole packet back.
    All,
}

/// One SNAP packet ready to be executed in place, again and again.
struct Snap {
    vm: Vm,
    node: SimpleNode,
    orig: Vec<u8>,
    buf: Vec<u8>,
    len: usize,
    restore: Restore,
}

impl Snap {
    fn new(pkt: Vec<u8>, here: Ipv4Addr, restore: Restore) -> Snap {
        let len = pkt.len();
        let code_len = (len - HEADER_LEN) / 4; // an upper bound is enough for the headroom
        let mut buf = vec![0u8; Vm::buffer_need(len, code_len)];
        buf[..len].copy_from_slice(&pkt);
        Snap { vm: Vm::new(VmConfig::default()), node: SimpleNode::new(here, 3), orig: pkt, buf, len, restore }
    }

    /// Puts back what a run changed. The small restores copy fixed-size
    /// arrays so that they compile to a few moves, not a `memcpy` call.
    #[inline(always)]
    fn restore(&mut self) {
        let len = self.len;
        let rb: [u8; 2] = [self.orig[4], self.orig[5]];
        match self.restore {
            Restore::Rb => *self.buf.first_chunk_mut::<6>().expect("header").last_chunk_mut::<2>().expect("rb") = rb,
            Restore::RbAndTop => {
                *self.buf.first_chunk_mut::<6>().expect("header").last_chunk_mut::<2>().expect("rb") = rb;
                let top: [u8; 4] = *self.orig.last_chunk::<4>().expect("a stack word");
                *self.buf[..len].last_chunk_mut::<4>().expect("a stack word") = top;
            }
            Restore::All => self.buf[..len].copy_from_slice(&self.orig),
        }
    }

    /// One restore and one execution; returns the number of instructions run.
    #[inline(always)]
    fn run(&mut self) -> u32 {
        self.restore();
        let out = self.vm.execute(&mut self.buf, self.len, &self.node);
        black_box(out).executed
    }

    /// Runs once, checks the end and the instruction count, checks that the
    /// restore brings the packet back, and returns the word above the packet
    /// (the stack top for programs that start with an empty stack).
    fn check(&mut self, end: End, executed: u32) -> u32 {
        let mut first = None;
        for _ in 0..3 {
            self.restore();
            let out = self.vm.execute(&mut self.buf, self.len, &self.node);
            assert_eq!(out.end, end, "unexpected end");
            assert_eq!(out.executed, executed, "unexpected instruction count");
            let word = u32::from_be_bytes(self.buf[self.len..self.len + 4].try_into().expect("4 bytes"));
            let tail = u32::from_be_bytes(self.buf[self.len - 4..self.len].try_into().expect("4 bytes"));
            let got = (word, tail);
            assert!(first.is_none() || first == Some(got), "runs differ");
            first = Some(got);
            self.restore();
            assert_eq!(self.buf[..self.len], self.orig[..], "restore is incomplete");
        }
        first.expect("ran").0
    }
}

/// A logical ALU operation on one accumulator.
#[derive(Clone, Copy)]
enum Alu {
    AddI(i32),
    XorI(i32),
    MulI(i32),
    AndI(i32),
    ShlI(u32),
    Add(i32),
    Sub(i32),
    Xor(i32),
}

const CYCLE: [Alu; 8] = [
    Alu::AddI(3),
    Alu::XorI(0x55),
    Alu::MulI(7),
    Alu::AndI(0xf_ffff),
    Alu::Add(12345),
    Alu::Sub(77),
    Alu::Xor(0x0f0f),
    Alu::ShlI(1),
];

impl Alu {
    /// Instructions it takes in SNAP (and in the eBPF twin).
    fn width(self) -> usize {
        match self {
            Alu::Add(_) | Alu::Sub(_) | Alu::Xor(_) => 2,
            _ => 1,
        }
    }
}

/// A straight-line program of exactly `total` instructions: `push 1`, the
/// operations of [`CYCLE`] in turn, `exit`.
fn alu_ops(total: usize) -> Vec<Alu> {
    let mut budget = total - 2;
    let mut ops = Vec::new();
    for &op in CYCLE.iter().cycle() {
        if budget == 0 {
            break;
        }
        let op = if op.width() > budget { Alu::AddI(1) } else { op };
        budget -= op.width();
        ops.push(op);
    }
    ops
}

fn alu_snap(ops: &[Alu]) -> Vec<u32> {
    let mut c = vec![insn(Op::Push, 1)];
    for &op in ops {
        match op {
            Alu::AddI(k) => c.push(insn(Op::AddI, k.into())),
            Alu::XorI(k) => c.push(insn(Op::XorI, k.into())),
            Alu::MulI(k) => c.push(insn(Op::MulI, k.into())),
            Alu::AndI(k) => c.push(insn(Op::AndI, k.into())),
            Alu::ShlI(k) => c.push(insn(Op::ShlI, k.into())),
            Alu::Add(k) => c.extend([insn(Op::Push, k.into()), insn(Op::Add, 0)]),
            Alu::Sub(k) => c.extend([insn(Op::Push, k.into()), insn(Op::Sub, 0)]),
            Alu::Xor(k) => c.extend([insn(Op::Push, k.into()), insn(Op::Xor, 0)]),
        }
    }
    c.push(insn(Op::Exit, 0));
    c
}

/// The same program in eBPF, instruction for instruction: `push k; add`
/// becomes `mov r1, k; add r0, r1`.
fn alu_ebpf(ops: &[Alu]) -> String {
    let mut s = String::from("mov r0, 1\n");
    for &op in ops {
        let line = match op {
            Alu::AddI(k) => format!("add r0, {k}"),
            Alu::XorI(k) => format!("xor r0, {k}"),
            Alu::MulI(k) => format!("mul r0, {k}"),
            Alu::AndI(k) => format!("and r0, {k}"),
            Alu::ShlI(k) => format!("lsh r0, {k}"),
            Alu::Add(k) => format!("mov r1, {k}\nadd r0, r1"),
            Alu::Sub(k) => format!("mov r1, {k}\nsub r0, r1"),
            Alu::Xor(k) => format!("mov r1, {k}\nxor r0, r1"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str("exit\n");
    s
}

fn alu_packet(total: usize) -> Snap {
    let code = alu_snap(&alu_ops(total));
    assert_eq!(code.len(), total);
    // The stack starts empty, so pushes only write above the packet.
    Snap::new(packet(a(1), a(1), code, vec![], vec![]), a(1), Restore::Rb)
}

/// Two 200-instruction programs that isolate the dispatch from the mix:
/// `push 1`, 198 × `addi 3`, `exit` (one instruction repeated, so its
/// indirect branch is always predicted), and `push 1`, 66 × (`push k; add;
/// andi 0xffff`), `exit` (a three-instruction cycle).
fn dispatch_packets() -> [(&'static str, Snap); 2] {
    let one = |code: Vec<u32>| {
        assert_eq!(code.len(), 200);
        Snap::new(packet(a(1), a(1), code, vec![], vec![]), a(1), Restore::Rb)
    };
    let mut addi = vec![insn(Op::Push, 1)];
    addi.extend(std::iter::repeat_n(insn(Op::AddI, 3), 198));
    addi.push(insn(Op::Exit, 0));
    let mut cycle = vec![insn(Op::Push, 1)];
    for k in 0..66 {
        cycle.extend([insn(Op::Push, k), insn(Op::Add, 0), insn(Op::AndI, 0xffff)]);
    }
    cycle.push(insn(Op::Exit, 0));
    [("snap_200_addi_repeated", one(addi)), ("snap_200_push_add_andi", one(cycle))]
}

/// The longest straight-line program a default-MTU packet can carry.
fn longest_alu() -> usize {
    (VmConfig::default().mtu - HEADER_LEN) / 4
}

/// A 42-byte Ethernet + IPv4 + UDP frame to port 53.
fn udp_frame() -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend([0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00]); // dst mac, src mac, IPv4
    f.extend([0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]); // IPv4, UDP
    f.extend([0x30, 0x39, 0, 53, 0, 8, 0, 0]); // sport 12345, dport 53, len 8
    assert_eq!(f.len(), 42);
    f
}

/// The filter in SNAP, the frame a blob on the stack: 13 instructions on a match.
fn filter_snap() -> Vec<u32> {
    vec![
        insn(Op::Pull, 0),     // 0  dup the frame
        insn(Op::BGet16, 12),  // 1  ethertype
        insn(Op::EqI, 0x0800), // 2
        insn(Op::Beq, 10),     // 3  -> 13
        insn(Op::Pull, 0),     // 4
        insn(Op::BGet, 23),    // 5  IP protocol
        insn(Op::EqI, 17),     // 6
        insn(Op::Beq, 6),      // 7  -> 13
        insn(Op::BGet16, 36),  // 8  UDP destination port (consumes the frame)
        insn(Op::EqI, 53),     // 9
        insn(Op::Beq, 3),      // 10 -> 13
        insn(Op::Push, 1),     // 11
        insn(Op::Exit, 0),     // 12
        insn(Op::Push, 0),     // 13 fail
        insn(Op::Exit, 0),     // 14
    ]
}

/// The filter in eBPF (little-endian host: `ldxh` loads host order, so the
/// constants are byte-swapped, as a compiler emits `htons(...)`): 9 instructions on a match.
const FILTER_EBPF: &str = "
    mov r0, 0
    ldxh r2, [r1+12]
    jne r2, 0x0008, +5
    ldxb r2, [r1+23]
    jne r2, 17, +3
    ldxh r2, [r1+36]
    jne r2, 0x3500, +1
    mov r0, 1
    exit
";

fn filter_packet(frame: &[u8]) -> Snap {
    let pkt = packet(a(1), a(1), filter_snap(), blob_words(frame), vec![Value::heap(Tag::Blob, 0).0]);
    // The result overwrites the frame reference, the packet's last word.
    Snap::new(pkt, a(1), Restore::RbAndTop)
}

fn ping_cases() -> [(&'static str, Snap, End, u32); 3] {
    [
        // (a) forwarding hop: 10.0.0.2 on the way 10.0.0.1 -> 10.0.0.3.
        ("a_forward_hop", Snap::new(ping(a(1), a(3), 0), a(2), Restore::Rb), End::Forwarded, 1),
        // (b) destination: forw, bne, push, getsrc, forwto back to the source.
        ("b_destination", Snap::new(ping(a(1), a(3), 0), a(3), Restore::All), End::Forwarded, 5),
        // (c) back at the source: forw, bne, demux.
        ("c_source_deliver", Snap::new(ping(a(3), a(1), 1), a(1), Restore::Rb), End::Delivered, 3),
    ]
}

fn bench_ping(c: &mut Criterion) {
    let mut g = c.benchmark_group("ping");
    let mut cases = ping_cases();
    for (_, s, end, n) in cases.iter_mut() {
        s.check(*end, *n);
    }
    // Baseline: copying the packet back, as case (b) does every iteration.
    let (orig, mut buf) = (cases[1].1.orig.clone(), cases[1].1.buf.clone());
    g.bench_function(format!("memcpy_{}B", orig.len()), |b| {
        b.iter(|| {
            black_box(&mut buf[..orig.len()]).copy_from_slice(black_box(&orig));
        })
    });
    for (name, s, _, _) in cases.iter_mut() {
        g.bench_function(*name, |b| b.iter(|| s.run()));
    }
    g.finish();
}

fn bench_fixed(c: &mut Criterion) {
    let mut g = c.benchmark_group("fixed");
    let mut s = Snap::new(packet(a(1), a(1), vec![insn(Op::Exit, 0)], vec![], vec![]), a(1), Restore::Rb);
    s.check(End::Exit, 1);
    g.bench_function("exit_1_insn", |b| b.iter(|| s.run()));
    g.finish();
}

fn bench_alu(c: &mut Criterion) {
    let mut g = c.benchmark_group("alu");
    for n in [200, longest_alu()] {
        let mut s = alu_packet(n);
        s.check(End::Exit, n as u32);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("snap_{n}_insns"), |b| b.iter(|| s.run()));
    }
    for (name, mut s) in dispatch_packets() {
        s.check(End::Exit, 200);
        g.throughput(Throughput::Elements(200));
        g.bench_function(name, |b| b.iter(|| s.run()));
    }
    g.finish();
}

fn bench_rbpf(c: &mut Criterion) {
    let mut g = c.benchmark_group("vs_rbpf");
    // (a) the 200-instruction ALU program.
    let ops = alu_ops(200);
    let prog = rbpf::assembler::assemble(&alu_ebpf(&ops)).expect("assembles");
    assert_eq!(prog.len() / 8, 200);
    let ebpf = rbpf::EbpfVmNoData::new(Some(&prog)).expect("verifies");
    let r = ebpf.execute_program().expect("runs");
    let mut s = alu_packet(200);
    let top = Value(s.check(End::Exit, 200));
    // Same result modulo 2^25: the operations used commute with truncation.
    assert_eq!(top.datum() as u64, r & 0x1ff_ffff, "SNAP and eBPF disagree");
    g.throughput(Throughput::Elements(200));
    g.bench_function("alu200/snap", |b| b.iter(|| s.run()));
    g.bench_function("alu200/rbpf", |b| b.iter(|| ebpf.execute_program().expect("runs")));

    // (b) the UDP port-53 filter on the same frame bytes.
    let frame = udp_frame();
    let prog = rbpf::assembler::assemble(FILTER_EBPF).expect("assembles");
    assert_eq!(prog.len() / 8, 9);
    let ebpf = rbpf::EbpfVmMbuff::new(Some(&prog)).expect("verifies");
    assert_eq!(ebpf.execute_program(&frame, &[]).expect("runs"), 1);
    let mut miss = frame.clone();
    miss[37] = 54;
    assert_eq!(ebpf.execute_program(&miss, &[]).expect("runs"), 0);
    let mut s = filter_packet(&frame);
    s.check(End::Exit, 13);
    let top = Value(u32::from_be_bytes(s.buf[s.len - 4..s.len].try_into().expect("4 bytes")));
    s.vm.execute(&mut s.buf, s.len, &s.node);
    let hit = Value(u32::from_be_bytes(s.buf[s.len - 4..s.len].try_into().expect("4 bytes")));
    assert_eq!((top, hit), (Value::heap(Tag::Blob, 0), Value::int(1)), "SNAP filter should match");
    let mut m = filter_packet(&miss);
    m.check(End::Exit, 13);
    m.vm.execute(&mut m.buf, m.len, &m.node);
    let res = Value(u32::from_be_bytes(m.buf[m.len - 4..m.len].try_into().expect("4 bytes")));
    assert_eq!(res, Value::int(0), "SNAP filter should reject port 54");
    g.throughput(Throughput::Elements(13));
    g.bench_function("udp_filter/snap", |b| b.iter(|| s.run()));
    g.throughput(Throughput::Elements(9));
    g.bench_function("udp_filter/rbpf", |b| b.iter(|| ebpf.execute_program(black_box(&frame), &[]).expect("runs")));
    g.finish();
}

/// The UDP filter in WebAssembly, as a C compiler would emit it for
/// `frame[12..14] == htons(0x800) && frame[23] == 17 && frame[36..38] == htons(53)`
/// on the frame at address 0 of linear memory (the same loads and constants
/// as the eBPF filter); and a function that only returns, for the entry cost.
const FILTER_WAT: &str = r#"
(module
  (memory (export "mem") 1)
  (func (export "filter") (param $len i32) (result i32)
    (if (i32.ne (i32.load16_u offset=12 (i32.const 0)) (i32.const 0x0008)) (then (return (i32.const 0))))
    (if (i32.ne (i32.load8_u offset=23 (i32.const 0)) (i32.const 17)) (then (return (i32.const 0))))
    (if (i32.ne (i32.load16_u offset=36 (i32.const 0)) (i32.const 0x3500)) (then (return (i32.const 0))))
    (i32.const 1))
  (func (export "nop") (param $len i32) (result i32)
    (i32.const 0)))
"#;

/// The ALU program in WebAssembly, instruction for instruction like the eBPF
/// twin on one `i64` accumulator. The start value (1) is the parameter:
/// with a constant, Cranelift would fold the whole program to its result.
fn alu_wat(ops: &[Alu]) -> String {
    let mut s = String::from("(module\n (func (export \"alu\") (param $x i64) (result i64)\n  local.get $x\n");
    for &op in ops {
        let line = match op {
            Alu::AddI(k) | Alu::Add(k) => format!("i64.const {k} i64.add"),
            Alu::XorI(k) | Alu::Xor(k) => format!("i64.const {k} i64.xor"),
            Alu::MulI(k) => format!("i64.const {k} i64.mul"),
            Alu::AndI(k) => format!("i64.const {k} i64.and"),
            Alu::ShlI(k) => format!("i64.const {k} i64.shl"),
            Alu::Sub(k) => format!("i64.const {k} i64.sub"),
        };
        s.push_str("  ");
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str(" ))\n");
    s
}

/// How a wasmtime engine bounds the CPU of a call.
#[derive(Clone, Copy)]
enum Bound {
    /// `consume_fuel`, the sandbox's default (`CpuBound::Fuel`); fuel set before every call.
    Fuel,
    /// `epoch_interruption` (`CpuBound::Epoch`); the deadline set before every call.
    Epoch,
    /// Neither: no CPU bound at all (what SNAP's resource bound and rbpf do not allow).
    None,
}

impl Bound {
    fn name(self) -> &'static str {
        match self {
            Bound::Fuel => "fuel",
            Bound::Epoch => "epoch",
            Bound::None => "unbounded",
        }
    }
}

/// The sandbox's engine settings (crates/sandbox, `Sandbox::new`): 256 KiB
/// wasm stack, no native unwind info, Cranelift `speed`; calls are synchronous
/// (`TypedFunc::call`, no async fuel yields).
fn wasm_engine(bound: Bound) -> wasmtime::Engine {
    let mut c = wasmtime::Config::new();
    match bound {
        Bound::Fuel => {
            c.consume_fuel(true);
        }
        Bound::Epoch => {
            c.epoch_interruption(true);
        }
        Bound::None => {}
    }
    c.max_wasm_stack(256 * 1024);
    c.native_unwind_info(false);
    wasmtime::Engine::new(&c).expect("engine")
}

/// One instantiated module in its own store, called per packet as a user would.
struct Wasm {
    store: wasmtime::Store<()>,
    bound: Bound,
    mem: Option<wasmtime::Memory>,
}

impl Wasm {
    fn new(engine: &wasmtime::Engine, wat: &str, bound: Bound) -> (Wasm, wasmtime::Instance) {
        let module = wasmtime::Module::new(engine, wat::parse_str(wat).expect("WAT parses")).expect("compiles");
        let mut store = wasmtime::Store::new(engine, ());
        arm(&mut store, bound);
        let inst = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
        let mem = inst.get_memory(&mut store, "mem");
        (Wasm { store, bound, mem }, inst)
    }

    /// Per packet: the CPU bound armed, the frame copied into linear memory.
    #[inline(always)]
    fn enter(&mut self, frame: &[u8]) {
        arm(&mut self.store, self.bound);
        if let Some(m) = self.mem {
            m.data_mut(&mut self.store)[..frame.len()].copy_from_slice(frame);
        }
    }
}

/// Arms the per-call CPU bound as the sandbox does (`invoke::arm`).
#[inline(always)]
fn arm(store: &mut wasmtime::Store<()>, bound: Bound) {
    match bound {
        Bound::Fuel => store.set_fuel(1 << 20).expect("fuel on"),
        Bound::Epoch => store.set_epoch_deadline(1 << 20),
        Bound::None => {}
    }
}

fn bench_wasm(c: &mut Criterion) {
    let mut g = c.benchmark_group("vs_wasm");
    let frame = udp_frame();
    let mut miss = frame.clone();
    miss[37] = 54;
    let ops = alu_ops(200);
    let alu = alu_wat(&ops);
    let mut s = alu_packet(200);
    let want = Value(s.check(End::Exit, 200)).datum() as u64;
    for bound in [Bound::Fuel, Bound::Epoch, Bound::None] {
        let engine = wasm_engine(bound);
        let b = bound.name();
        // (a) the UDP filter on the frame copied into linear memory.
        let (mut w, inst) = Wasm::new(&engine, FILTER_WAT, bound);
        let f = inst.get_typed_func::<i32, i32>(&mut w.store, "filter").expect("filter");
        let nop = inst.get_typed_func::<i32, i32>(&mut w.store, "nop").expect("nop");
        for (fr, want) in [(&frame, 1), (&miss, 0), (&frame, 1)] {
            w.enter(fr);
            assert_eq!(f.call(&mut w.store, fr.len() as i32).expect("runs"), want, "wasm filter");
        }
        g.bench_function(format!("udp_filter/wasm_{b}"), |bn| {
            bn.iter(|| {
                w.enter(black_box(&frame));
                f.call(&mut w.store, frame.len() as i32).expect("runs")
            })
        });
        g.bench_function(format!("entry/wasm_{b}"), |bn| {
            bn.iter(|| {
                w.enter(black_box(&frame));
                nop.call(&mut w.store, frame.len() as i32).expect("runs")
            })
        });
        // (b) the 200-instruction ALU program.
        let (mut w, inst) = Wasm::new(&engine, &alu, bound);
        let f = inst.get_typed_func::<i64, i64>(&mut w.store, "alu").expect("alu");
        w.enter(&[]);
        let r = f.call(&mut w.store, 1).expect("runs") as u64;
        assert_eq!(r & 0x1ff_ffff, want, "SNAP and wasm disagree");
        g.bench_function(format!("alu200/wasm_{b}"), |bn| {
            bn.iter(|| {
                w.enter(&[]);
                f.call(&mut w.store, black_box(1)).expect("runs")
            })
        });
    }
    // What a packet carrying new code would pay before its first run, once per
    // module (a user caches the compiled module; SNAP has no such step).
    let engine = wasm_engine(Bound::Fuel);
    let bytes = wat::parse_str(FILTER_WAT).expect("WAT parses");
    g.sample_size(10);
    g.bench_function("udp_filter/wasm_fuel_compile", |bn| {
        bn.iter(|| wasmtime::Module::new(&engine, black_box(&bytes)).expect("compiles"))
    });
    let module = wasmtime::Module::new(&engine, &bytes).expect("compiles");
    g.sample_size(100);
    g.bench_function("udp_filter/wasm_fuel_new_store_instance", |bn| {
        bn.iter(|| {
            let mut store = wasmtime::Store::new(&engine, ());
            arm(&mut store, Bound::Fuel);
            let inst = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
            let f = inst.get_typed_func::<i32, i32>(&mut store, "filter").expect("filter");
            let m = inst.get_memory(&mut store, "mem").expect("mem");
            m.data_mut(&mut store)[..frame.len()].copy_from_slice(&frame);
            f.call(&mut store, frame.len() as i32).expect("runs")
        })
    });
    g.finish();
}

/// Runs every workload `n` times without criterion (for callgrind).
fn run_plain(n: u64) {
    let mut cases: Vec<(String, Snap)> =
        ping_cases().into_iter().map(|(k, s, _, _)| (format!("ping/{k}"), s)).collect();
    cases.push((
        "fixed/exit".into(),
        Snap::new(packet(a(1), a(1), vec![insn(Op::Exit, 0)], vec![], vec![]), a(1), Restore::Rb),
    ));
    cases.push(("alu/200".into(), alu_packet(200)));
    cases.push((format!("alu/{}", longest_alu()), alu_packet(longest_alu())));
    cases.push(("udp_filter/snap".into(), filter_packet(&udp_frame())));
    cases.extend(dispatch_packets().into_iter().map(|(k, s)| (format!("alu/{k}"), s)));
    let only = std::env::var("SNAP_BENCH_ONLY").unwrap_or_default();
    for (name, s) in cases.iter_mut().filter(|(k, _)| k.contains(only.as_str())) {
        let mut total = 0u64;
        for _ in 0..n {
            total += u64::from(s.run());
        }
        println!("{name}: {total} SNAP instructions in {n} runs");
    }
    let prog = rbpf::assembler::assemble(&alu_ebpf(&alu_ops(200))).expect("assembles");
    let frame = udp_frame();
    let fprog = rbpf::assembler::assemble(FILTER_EBPF).expect("assembles");
    if "rbpf/alu200".contains(only.as_str()) {
        let ebpf = rbpf::EbpfVmNoData::new(Some(&prog)).expect("verifies");
        for _ in 0..n {
            black_box(ebpf.execute_program().expect("runs"));
        }
        println!("rbpf/alu200: {n} runs");
    }
    if "rbpf/udp_filter".contains(only.as_str()) {
        let ebpf = rbpf::EbpfVmMbuff::new(Some(&fprog)).expect("verifies");
        for _ in 0..n {
            black_box(ebpf.execute_program(black_box(&frame), &[]).expect("runs"));
        }
        println!("rbpf/udp_filter: {n} runs");
    }
    for bound in [Bound::Fuel, Bound::Epoch, Bound::None] {
        let b = bound.name();
        let engine = wasm_engine(bound);
        if format!("wasm_{b}/udp_filter").contains(only.as_str()) {
            let (mut w, inst) = Wasm::new(&engine, FILTER_WAT, bound);
            let f = inst.get_typed_func::<i32, i32>(&mut w.store, "filter").expect("filter");
            for _ in 0..n {
                w.enter(black_box(&frame));
                black_box(f.call(&mut w.store, frame.len() as i32).expect("runs"));
            }
            println!("wasm_{b}/udp_filter: {n} runs");
        }
        if format!("wasm_{b}/alu200").contains(only.as_str()) {
            let (mut w, inst) = Wasm::new(&engine, &alu_wat(&alu_ops(200)), bound);
            let f = inst.get_typed_func::<i64, i64>(&mut w.store, "alu").expect("alu");
            for _ in 0..n {
                w.enter(&[]);
                black_box(f.call(&mut w.store, black_box(1)).expect("runs"));
            }
            println!("wasm_{b}/alu200: {n} runs");
        }
    }
}

criterion_group!(benches, bench_ping, bench_fixed, bench_alu, bench_rbpf, bench_wasm);

fn main() {
    if let Some(n) = std::env::var("SNAP_BENCH_ITERS").ok().and_then(|v| v.parse().ok()) {
        run_plain(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
