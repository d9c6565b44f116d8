//! The SNAP interpreter: in-place, sans-I/O, with interleaved checks.
//!
//! [`Vm::execute`] takes a buffer holding one SNAP packet at its front and a
//! [`NodeContext`] (this node's addresses, interface count, routes, clock and
//! services) and returns an [`Outcome`]: the packets to transmit, the payload
//! to deliver, and how the packet ended. It never performs I/O.
//!
//! # Execution in place (SNAP §VI-C)
//! The packet's stack section is its last section, stored bottom first, so the
//! stack simply grows toward the end of the buffer. Words keep the packet's
//! byte order. Heap objects allocated during execution go to a second,
//! VM-owned heap whose offsets start at the original heap's length. When the
//! caller's buffer lacks the headroom the stack may need (4 bytes per
//! remaining instruction), the packet is first copied into a VM-owned buffer,
//! as the paper's kernel version does.
//!
//! # Memory bound (SNAP §IV-A.2)
//! A packet of at most `mtu` bytes with `C` instructions runs `n ≤ C - entry`
//! instructions; each pushes at most one word and allocates at most two heap
//! words (header plus one payload word; `mktup k` allocates `k+1` words over
//! the `k` instructions it owns). So the stack region needs at most
//! `mtu + 4n ≤ 2·mtu` bytes and the second heap at most `8n ≤ 2·mtu` bytes:
//! 4 × MTU in all. Both limits are also checked on every push and allocation.
//!
//! # Faults
//! Any violation ends the packet with a [`Fault`]; actions produced before the
//! fault are discarded, so a failing packet has no network effect.

use crate::ops::{IMM_MASK, Insn, Op, sext25, trunc25};
use crate::services::{Arg, MAX_ARITY, Ret, ServiceCx, ServiceError, ServiceTable, SmallBytes};
use crate::value::{Tag, Value, code_is_ref, header, payload_words, split_header};
use crate::wire::field::{DST, SRC};
use crate::wire::{HEADER_LEN, Packet, WireError};
use core::net::Ipv4Addr;
use core::ops::Range;

/// What the VM needs to know about the node it runs on.
pub trait NodeContext {
    /// This node's primary address (`here`).
    fn here(&self) -> Ipv4Addr;
    /// Whether `a` is one of this node's addresses (`ishere`, `forw`).
    fn is_here(&self, a: Ipv4Addr) -> bool {
        a == self.here()
    }
    /// Number of interfaces: the per-packet limit on network operations.
    fn interfaces(&self) -> u8;
    /// Next hop toward `dest`, if there is a route.
    fn next_hop(&self, dest: Ipv4Addr) -> Option<Ipv4Addr>;
    /// This node's neighbours, in a stable order (`nbr`, `nnbr`).
    fn neighbors(&self) -> &[Ipv4Addr];
    /// Monotonic time in milliseconds.
    fn now_ms(&self) -> u64;
    /// Services reachable with `calls`.
    fn services(&self) -> Option<&ServiceTable> {
        None
    }
}

/// A node context built from plain data, for tests, tools and simulations.
#[derive(Debug, Clone)]
pub struct SimpleNode {
    /// This node's addresses; the first is `here`.
    pub addrs: Vec<Ipv4Addr>,
    /// Interface count.
    pub interfaces: u8,
    /// Static routes: (destination, next hop).
    pub routes: Vec<(Ipv4Addr, Ipv4Addr)>,
    /// Neighbours.
    pub neighbors: Vec<Ipv4Addr>,
    /// Current time.
    pub now_ms: u64,
    /// Services.
    pub services: ServiceTable,
}

impl SimpleNode {
    /// A node with one address, `interfaces` interfaces and built-in services.
    pub fn new(addr: Ipv4Addr, interfaces: u8) -> SimpleNode {
        SimpleNode {
            addrs: vec![addr],
            interfaces,
            routes: Vec::new(),
            neighbors: Vec::new(),
            now_ms: 0,
            services: ServiceTable::with_builtins(),
        }
    }
}

impl NodeContext for SimpleNode {
    fn here(&self) -> Ipv4Addr {
        self.addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED)
    }
    fn is_here(&self, a: Ipv4Addr) -> bool {
        self.addrs.contains(&a)
    }
    fn interfaces(&self) -> u8 {
        self.interfaces
    }
    fn next_hop(&self, dest: Ipv4Addr) -> Option<Ipv4Addr> {
        self.routes.iter().find(|(d, _)| *d == dest).map(|(_, h)| *h)
    }
    fn neighbors(&self) -> &[Ipv4Addr] {
        &self.neighbors
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn services(&self) -> Option<&ServiceTable> {
        Some(&self.services)
    }
}

/// Why a packet was ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fault {
    /// The packet failed a structural check.
    #[error("malformed packet: {0}")]
    Wire(#[from] WireError),
    /// The packet, or a packet it would send, exceeds the MTU.
    #[error("packet of {len} bytes exceeds the MTU of {mtu}")]
    PacketTooLarge {
        /// Length in bytes.
        len: usize,
        /// The limit.
        mtu: usize,
    },
    /// The packet arrived with no resource bound, or tried to forward or give
    /// a child more than it has left.
    #[error("resource bound exhausted")]
    ResourceBoundExhausted,
    /// A word whose opcode is unassigned.
    #[error("invalid opcode {code:#04x}")]
    InvalidOpcode {
        /// The 7-bit code.
        code: u8,
    },
    /// A branch whose target is not after the branch.
    #[error("backward branch by {offset}")]
    BackwardBranch {
        /// The offset that was taken.
        offset: i64,
    },
    /// A branch beyond the end of the code.
    #[error("branch target {target} beyond the code")]
    BranchOutOfBounds {
        /// The target index.
        target: i64,
    },
    /// An instruction needed more stack values than there are.
    #[error("stack underflow")]
    StackUnderflow,
    /// The stack outgrew its region (cannot happen for well-formed packets).
    #[error("stack overflow")]
    StackOverflow,
    /// A heap reference or object outside the packet's heap.
    #[error("heap reference {offset} out of bounds")]
    HeapOutOfBounds {
        /// The offending offset.
        offset: u32,
    },
    /// An operand of the wrong type where the type matters for safety.
    #[error("type mismatch: expected {expected}, found tag {found}")]
    TypeMismatch {
        /// What was expected.
        expected: &'static str,
        /// The tag code found.
        found: u8,
    },
    /// A tuple or byte index out of range.
    #[error("index {index} out of bounds for length {len}")]
    IndexOutOfBounds {
        /// The index.
        index: i64,
        /// The length.
        len: u32,
    },
    /// Integer division or remainder by zero.
    #[error("division by zero")]
    DivideByZero,
    /// A `mktup n` ran within n-1 instructions of the previous one.
    #[error("mktup within the shadow of a previous mktup")]
    MktupTooClose,
    /// A `mktup n` without n-1 instructions after it.
    #[error("mktup near the end of the code")]
    MktupPastEnd,
    /// An immediate outside the range its instruction accepts.
    #[error("invalid immediate {0}")]
    InvalidImmediate(u32),
    /// The second heap is full (cannot happen for well-formed packets).
    #[error("out of packet memory")]
    OutOfMemory,
    /// `send` with a resource bound below 1.
    #[error("send with resource bound {0}")]
    InvalidSendBound(i32),
    /// More network operations than the node has interfaces.
    #[error("more than {limit} network operations")]
    TooManySends {
        /// The node's limit.
        limit: u8,
    },
    /// `send` with an entry point outside the code.
    #[error("bad entry point {0}")]
    BadEntryPoint(i32),
    /// `demux` with a port outside 0..=65535.
    #[error("bad port {0}")]
    BadPort(i32),
    /// `calls` named a service that is not registered.
    #[error("unknown service")]
    UnknownService,
    /// A service refused the call.
    #[error("service failed: {0}")]
    ServiceFailed(ServiceError),
}

/// Every fault kind's name, in a fixed order (for counters).
pub const FAULT_KINDS: &[&str] = &[
    "wire",
    "packet_too_large",
    "resource_bound_exhausted",
    "invalid_opcode",
    "backward_branch",
    "branch_out_of_bounds",
    "stack_underflow",
    "stack_overflow",
    "heap_out_of_bounds",
    "type_mismatch",
    "index_out_of_bounds",
    "divide_by_zero",
    "mktup_too_close",
    "mktup_past_end",
    "invalid_immediate",
    "out_of_memory",
    "invalid_send_bound",
    "too_many_sends",
    "bad_entry_point",
    "bad_port",
    "unknown_service",
    "service_failed",
];

impl Fault {
    /// Index of this fault's kind in [`FAULT_KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            Fault::Wire(_) => 0,
            Fault::PacketTooLarge { .. } => 1,
            Fault::ResourceBoundExhausted => 2,
            Fault::InvalidOpcode { .. } => 3,
            Fault::BackwardBranch { .. } => 4,
            Fault::BranchOutOfBounds { .. } => 5,
            Fault::StackUnderflow => 6,
            Fault::StackOverflow => 7,
            Fault::HeapOutOfBounds { .. } => 8,
            Fault::TypeMismatch { .. } => 9,
            Fault::IndexOutOfBounds { .. } => 10,
            Fault::DivideByZero => 11,
            Fault::MktupTooClose => 12,
            Fault::MktupPastEnd => 13,
            Fault::InvalidImmediate(_) => 14,
            Fault::OutOfMemory => 15,
            Fault::InvalidSendBound(_) => 16,
            Fault::TooManySends { .. } => 17,
            Fault::BadEntryPoint(_) => 18,
            Fault::BadPort(_) => 19,
            Fault::UnknownService => 20,
            Fault::ServiceFailed(_) => 21,
        }
    }
    /// This fault's kind name (snake case, for counters and logs).
    pub fn kind(&self) -> &'static str {
        FAULT_KINDS[self.kind_index()]
    }
}

/// Where the bytes of an action live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loc {
    /// In the caller's packet buffer (zero copy: the packet was forwarded in
    /// place, or a payload is delivered straight from the packet's heap).
    Input(Range<usize>),
    /// In the outcome's own arena.
    Arena(Range<usize>),
}

/// Why a packet is transmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendKind {
    /// `forw` or `forwto`: the packet itself moves on.
    Forward,
    /// `send`: a child packet.
    Child,
}

/// Something the node must do with the packet's results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Transmit a SNAP packet toward `dest` (the node picks the next hop).
    Send {
        /// Final destination of the packet.
        dest: Ipv4Addr,
        /// Forward or child.
        kind: SendKind,
        /// The packet bytes.
        packet: Loc,
    },
    /// Deliver a payload to a local application port.
    Deliver {
        /// The port.
        port: u16,
        /// The payload bytes.
        payload: Loc,
    },
}

/// How a packet's execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `exit`, or ran off the end of the code.
    Exit,
    /// `forw`/`forwto` sent the packet on.
    Forwarded,
    /// `demux` delivered it.
    Delivered,
    /// A fault ended it; no actions are produced.
    Fault {
        /// What went wrong.
        fault: Fault,
        /// Index of the faulting instruction, if execution had started.
        pc: Option<u16>,
    },
}

/// The result of executing one packet.
#[derive(Debug, Clone)]
pub struct Outcome {
    actions: Vec<Action>,
    arena: Vec<u8>,
    /// The packet's `print` output, if any.
    pub log: String,
    /// How execution ended.
    pub end: End,
    /// Instructions executed.
    pub executed: u32,
    /// Highest stack depth reached, in words.
    pub max_stack: u32,
    /// Stack depth when the program ended, in words: the stack region's
    /// first `depth` words are its stack then (0 after a fault).
    pub depth: u32,
    /// Words allocated in the second heap.
    pub heap_alloc: u32,
    /// Peak execution memory in bytes: the packet plus, at its highest,
    /// stack growth beyond the packet plus the execution heap. At most
    /// 4 × MTU (SNAP §IV-A.2).
    pub peak_memory: u32,
    /// Network operations performed (`forw`, `forwto`, `send`, `demux`).
    pub net_ops: u8,
    /// Resource bound in the header on arrival.
    pub rb_in: u16,
    /// Resource bound given to children with `send`.
    pub rb_given: u32,
    /// Resource bound left with the packet itself (carried on by `forw`).
    pub rb_left: u16,
}

impl Default for Outcome {
    fn default() -> Self {
        Outcome {
            actions: Vec::with_capacity(8),
            arena: Vec::new(),
            log: String::new(),
            end: End::Exit,
            executed: 0,
            max_stack: 0,
            depth: 0,
            heap_alloc: 0,
            peak_memory: 0,
            net_ops: 0,
            rb_in: 0,
            rb_given: 0,
            rb_left: 0,
        }
    }
}

impl Outcome {
    fn reset(&mut self) {
        self.actions.clear();
        self.arena.clear();
        self.log.clear();
        self.end = End::Exit;
        self.executed = 0;
        self.max_stack = 0;
        self.depth = 0;
        self.heap_alloc = 0;
        self.peak_memory = 0;
        self.net_ops = 0;
        self.rb_in = 0;
        self.rb_given = 0;
        self.rb_left = 0;
    }
    /// The actions, in the order the program performed them.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }
    /// The bytes at `loc`; `input` is the buffer passed to [`Vm::execute`].
    pub fn bytes<'a>(&'a self, loc: &Loc, input: &'a [u8]) -> &'a [u8] {
        match loc {
            Loc::Input(r) => input.get(r.clone()).unwrap_or(&[]),
            Loc::Arena(r) => self.arena.get(r.clone()).unwrap_or(&[]),
        }
    }
    /// The fault, if the packet faulted.
    pub fn fault(&self) -> Option<Fault> {
        match self.end {
            End::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }
}

/// VM limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmConfig {
    /// Largest SNAP packet accepted or produced, in bytes.
    pub mtu: usize,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig { mtu: DEFAULT_MTU }
    }
}

/// Default SNAP MTU: an Ethernet payload less IPv4, UDP and ANEP headers.
pub const DEFAULT_MTU: usize = 1400;

/// Receives one call per executed instruction when tracing.
pub trait Tracer {
    /// Whether tracing is on; when `false` the calls compile away.
    const ENABLED: bool;
    /// Called after instruction `pc` executed (also after the faulting one).
    fn step(&mut self, pc: usize, insn: Result<Insn, u32>, view: &TraceView<'_>);
}

/// The tracer that does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTrace;
impl Tracer for NoTrace {
    const ENABLED: bool = false;
    fn step(&mut self, _: usize, _: Result<Insn, u32>, _: &TraceView<'_>) {}
}

/// A read-only look at the machine state, for tracers.
#[derive(Debug)]
pub struct TraceView<'a> {
    head: &'a [u8],
    le: bool,
    heap_start: usize,
    h0: u32,
    scratch: &'a [u32],
    stack: &'a [[u8; 4]],
    /// Remaining resource bound.
    pub rb: u16,
    /// The fault, if this step faulted.
    pub fault: Option<Fault>,
}

impl TraceView<'_> {
    fn decode(&self, b: [u8; 4]) -> u32 {
        if self.le { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }
    }
    fn word(&self, at: usize) -> Option<u32> {
        let b = self.head.get(at..)?.first_chunk::<4>()?;
        Some(self.decode(*b))
    }
    /// Stack depth in words.
    pub fn depth(&self) -> usize {
        self.stack.len()
    }
    /// The stack, bottom first.
    pub fn stack(&self) -> Vec<Value> {
        self.stack.iter().map(|b| Value(self.decode(*b))).collect()
    }
    fn heap_word(&self, off: u32) -> Option<u32> {
        if off < self.h0 {
            self.word(self.heap_start + 4 * off as usize)
        } else {
            self.scratch.get((off - self.h0) as usize).copied()
        }
    }
    /// Renders a value, resolving heap objects (addresses, floats, short blobs).
    pub fn render(&self, v: Value) -> String {
        let Some(tag) = v.tag() else { return format!("{v:?}") };
        if !tag.is_ref() {
            return format!("{v:?}");
        }
        let off = v.datum();
        let Some(h) = self.heap_word(off) else { return format!("{v:?}!") };
        let (_, len) = split_header(h);
        match tag {
            Tag::Addr => self.heap_word(off + 1).map_or(format!("{v:?}!"), |w| Ipv4Addr::from(w).to_string()),
            Tag::Float => self.heap_word(off + 1).map_or(format!("{v:?}!"), |w| format!("{:?}", f32::from_bits(w))),
            Tag::Blob | Tag::Str => {
                let mut s = Vec::new();
                for i in 0..len.min(24) {
                    match self.heap_word(off + 1 + i / 4) {
                        Some(w) => s.push(w.to_be_bytes()[(i % 4) as usize]),
                        None => break,
                    }
                }
                let more = if len > 24 { "…" } else { "" };
                format!("{}{:?}{more}", if tag == Tag::Blob { "blob" } else { "" }, String::from_utf8_lossy(&s))
            }
            Tag::Tuple => format!("tuple@{off}[{len}]"),
            _ => format!("{v:?}"),
        }
    }
}

mod fast;

/// Byte order of a packet's program words.
trait Endian {
    const LITTLE: bool;
    fn get(b: [u8; 4]) -> u32;
    fn put(v: u32) -> [u8; 4];
}
struct Be;
struct Le;
impl Endian for Be {
    const LITTLE: bool = false;
    #[inline(always)]
    fn get(b: [u8; 4]) -> u32 {
        u32::from_be_bytes(b)
    }
    #[inline(always)]
    fn put(v: u32) -> [u8; 4] {
        v.to_be_bytes()
    }
}
impl Endian for Le {
    const LITTLE: bool = true;
    #[inline(always)]
    fn get(b: [u8; 4]) -> u32 {
        u32::from_le_bytes(b)
    }
    #[inline(always)]
    fn put(v: u32) -> [u8; 4] {
        v.to_le_bytes()
    }
}

#[inline(always)]
fn rd<E: Endian>(buf: &[u8], at: usize) -> Option<u32> {
    Some(E::get(*buf.get(at..)?.first_chunk::<4>()?))
}

#[inline(always)]
fn wr<E: Endian>(buf: &mut [u8], at: usize, v: u32) -> Option<()> {
    buf.get_mut(at..)?.first_chunk_mut::<4>()?.copy_from_slice(&E::put(v));
    Some(())
}

/// Header fields the interpreter keeps in registers: the header checked
/// once by [`Checked::decode`](crate::wire::Checked::decode).
type Hdr = crate::wire::Checked;

/// Scratch state of the copying pass that builds child packets (SNAP §VI-D).
#[derive(Debug, Default, Clone)]
struct Gc {
    /// Forwarding table: new offset of a copied object, valid when
    /// `stamp[off] == epoch`.
    fwd: Vec<u32>,
    stamp: Vec<u32>,
    epoch: u32,
    heap: Vec<u32>,
    stack: Vec<u32>,
    fixups: Vec<(usize, u32)>,
}

/// The SNAP virtual machine. Reuse one per thread: it keeps its buffers, so
/// steady-state execution allocates nothing.
#[derive(Debug, Clone)]
pub struct Vm {
    cfg: VmConfig,
    scratch: Vec<u32>,
    work: Vec<u8>,
    gc: Gc,
    out: Outcome,
}

impl Default for Vm {
    fn default() -> Self {
        Vm::new(VmConfig::default())
    }
}

/// Result of the interpreter loop: a normal end is written to the outcome
/// directly (a small `Ok`), a fault is returned with its instruction index.
type Run = Result<(), (Fault, Option<u16>)>;

impl Vm {
    /// A VM with the given limits.
    pub fn new(cfg: VmConfig) -> Vm {
        let words = cfg.mtu / 2;
        Vm {
            cfg,
            scratch: Vec::with_capacity(words),
            work: vec![0; 2 * cfg.mtu + HEADER_LEN],
            gc: Gc::default(),
            out: Outcome::default(),
        }
    }

    /// The limits.
    pub fn config(&self) -> VmConfig {
        self.cfg
    }

    /// Bytes of buffer an in-place execution of a packet of `len` bytes with
    /// `code_len` instructions may touch (packet plus stack growth).
    pub fn buffer_need(len: usize, code_len: usize) -> usize {
        len + 4 * code_len
    }

    /// Executes the packet in `buf[..len]` on the node `ctx`.
    ///
    /// `buf` may be longer than the packet; execution in place uses the room
    /// after it for the stack. The header's resource bound is decremented in
    /// `buf`. Returns the outcome, valid until the next call.
    pub fn execute<C: NodeContext>(&mut self, buf: &mut [u8], len: usize, ctx: &C) -> &Outcome {
        self.execute_traced(buf, len, ctx, &mut NoTrace)
    }

    /// Executes the packet whose header the caller checked once with
    /// [`Checked::decode`](crate::wire::Checked::decode) over `buf[..hdr.len()]`:
    /// the header is not checked again. A node classifies a datagram and
    /// hands the checked header down (one pass per datagram).
    pub fn execute_checked<C: NodeContext>(&mut self, buf: &mut [u8], hdr: &crate::wire::Checked, ctx: &C) -> &Outcome {
        self.out.reset();
        self.scratch.clear();
        let r = self.start_checked(buf, *hdr, ctx, &mut NoTrace);
        self.finish(r)
    }

    /// [`execute`](Self::execute) with a per-instruction tracer.
    pub fn execute_traced<C: NodeContext, T: Tracer>(
        &mut self,
        buf: &mut [u8],
        len: usize,
        ctx: &C,
        tr: &mut T,
    ) -> &Outcome {
        self.out.reset();
        self.scratch.clear();
        let len = len.min(buf.len());
        let r = match crate::wire::Checked::decode(&buf[..len]) {
            Ok(hdr) => self.start_checked(buf, hdr, ctx, tr),
            Err(e) => Err((Fault::Wire(e), None)),
        };
        self.finish(r)
    }

    fn finish(&mut self, r: Run) -> &Outcome {
        if let Err((fault, pc)) = r {
            self.out.actions.clear();
            self.out.arena.clear();
            self.out.end = End::Fault { fault, pc };
        }
        &self.out
    }

    #[inline(always)]
    fn start_checked<C: NodeContext, T: Tracer>(&mut self, buf: &mut [u8], hdr: Hdr, ctx: &C, tr: &mut T) -> Run {
        let (len, rb) = (hdr.len, hdr.rb);
        // The one cheap guard a checked header still needs: that it was
        // checked over this buffer (no header field is read again).
        if buf.len() < len {
            return Err((Fault::Wire(WireError::Truncated { len: buf.len() }), None));
        }
        if len > self.cfg.mtu {
            return Err((Fault::PacketTooLarge { len, mtu: self.cfg.mtu }, None));
        }
        self.out.rb_in = rb;
        if rb == 0 {
            return Err((Fault::ResourceBoundExhausted, None));
        }
        let le = hdr.flags & crate::wire::flags::LE != 0;
        // SNAP §IV-A.3: the resource bound is decremented upon reception.
        if let Some(f) = buf.get_mut(4..6) {
            f.copy_from_slice(&(rb - 1).to_be_bytes());
        }
        let need = Vm::buffer_need(len, hdr.code_len - hdr.entry);
        if buf.len() < need {
            return self.run_copied(buf, hdr, need, ctx, tr);
        }
        if le {
            self.run::<Le, C, T>(buf, hdr, rb - 1, need, ctx, tr)
        } else {
            self.run::<Be, C, T>(buf, hdr, rb - 1, need, ctx, tr)
        }
    }

    /// [`start_checked`](Self::start_checked) for a buffer without room for
    /// the stack to grow: the packet runs in the VM's own buffer. Out of
    /// line and cold, so that the interpreter inlined into the common path
    /// is there once per byte order, not twice.
    #[cold]
    #[inline(never)]
    fn run_copied<C: NodeContext, T: Tracer>(
        &mut self,
        buf: &mut [u8],
        hdr: Hdr,
        need: usize,
        ctx: &C,
        tr: &mut T,
    ) -> Run {
        let (len, rb) = (hdr.len, hdr.rb);
        let le = hdr.flags & crate::wire::flags::LE != 0;
        // Not enough headroom: copy into our own buffer (SNAP §VI-C).
        let mut work = core::mem::take(&mut self.work);
        if work.len() < need {
            work.resize(need, 0);
        }
        work[..len].copy_from_slice(&buf[..len]);
        let r = if le {
            self.run::<Le, C, T>(&mut work, hdr, rb - 1, need, ctx, tr)
        } else {
            self.run::<Be, C, T>(&mut work, hdr, rb - 1, need, ctx, tr)
        };
        // Actions may point into `work`: move those bytes to the arena.
        for a in self.out.actions.iter_mut() {
            let loc = match a {
                Action::Send { packet, .. } => packet,
                Action::Deliver { payload, .. } => payload,
            };
            if let Loc::Input(r) = loc {
                let start = self.out.arena.len();
                self.out.arena.extend_from_slice(work.get(r.clone()).unwrap_or(&[]));
                *loc = Loc::Arena(start..self.out.arena.len());
            }
        }
        self.work = work;
        r
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn run<E: Endian, C: NodeContext, T: Tracer>(
        &mut self,
        buf: &mut [u8],
        hdr: Hdr,
        mut rb: u16,
        limit: usize,
        ctx: &C,
        tr: &mut T,
    ) -> Run {
        let code_len = hdr.code_len;
        let sb = hdr.stack_start;
        let mut pc = hdr.entry;
        let h0 = hdr.h0;
        // Split the buffer: header, code and arriving heap are read-only while
        // the packet runs; the stack region (the packet's stack plus room to
        // grow) is a slice of words, so `sp` is a word index and each stack
        // access is one bounds check. Header writes for an in-place forward
        // happen after the loop.
        let (head, tail) = buf.split_at_mut(sb);
        let head: &[u8] = head;
        let st: &mut [[u8; 4]] = tail.get_mut(..limit - sb).unwrap_or_default().as_chunks_mut::<4>().0;
        let code: &[[u8; 4]] = head.get(HEADER_LEN..HEADER_LEN + 4 * code_len).unwrap_or_default().as_chunks::<4>().0;
        let heapw: &[[u8; 4]] = head.get(hdr.heap_start..).unwrap_or_default().as_chunks::<4>().0;
        let s0 = (hdr.len - sb) / 4;
        let mut sp = s0;
        // SNAP §IV-A.2, made exact: no instruction grows stack plus heap by
        // more than three words (`getsrc`: one stack word, a header and a
        // payload word; `mktup k`: pops k, pushes 1, allocates k+1). So the
        // stack growth and the execution heap together never exceed 3 words
        // per instruction that can still run, which keeps the whole packet
        // within 4 × MTU. The physical heap cap is the same 3 words.
        let n_max = code_len - hdr.entry;
        let heap_cap = 3 * n_max;
        let budget = 12 * n_max;
        let mut peak = 0usize;
        let max_ops = ctx.interfaces();
        let mut ops: u8 = 0;
        let mut fence = 0usize;
        // Instructions executed so far: `pc - entry - skipped`. Branches go
        // forward only, so counting what they skip (at the rare taken branch)
        // replaces an increment on every instruction.
        let mut skipped = 0usize;
        let entry = hdr.entry;
        macro_rules! executed {
            () => {
                (pc - entry - skipped) as u32
            };
        }
        let mut max_sp = sp;
        let mut seg_max = sp;
        let scratch = &mut self.scratch;
        let out = &mut self.out;
        let gc = &mut self.gc;
        let mtu = self.cfg.mtu;

        macro_rules! fail {
            ($f:expr) => {{
                let f = $f;
                if T::ENABLED {
                    let view = TraceView {
                        head,
                        le: E::LITTLE,
                        heap_start: hdr.heap_start,
                        h0,
                        scratch,
                        stack: st.get(..sp).unwrap_or_default(),
                        rb,
                        fault: Some(f),
                    };
                    let w = code.get(pc.saturating_sub(1)).map_or(0, |b| E::get(*b));
                    tr.step(pc.saturating_sub(1), Insn::decode(w).map_err(|_| w), &view);
                }
                out.executed = executed!();
                return Err((f, Some(pc.saturating_sub(1) as u16)));
            }};
        }
        macro_rules! pop {
            () => {{
                sp = match sp.checked_sub(1) {
                    Some(s) => s,
                    None => fail!(Fault::StackUnderflow),
                };
                match st.get(sp) {
                    Some(b) => Value(E::get(*b)),
                    None => fail!(Fault::StackUnderflow),
                }
            }};
        }
        // Peak memory is the highest stack growth plus execution heap. The
        // heap only grows at allocations, so between two allocations the
        // peak is that stretch's highest stack plus the heap then: `push`
        // tracks the stretch's highest stack, `heap_grows!` closes a stretch.
        macro_rules! push {
            ($v:expr) => {{
                let v: Value = $v;
                match st.get_mut(sp) {
                    Some(b) => *b = E::put(v.0),
                    None => fail!(Fault::StackOverflow),
                }
                sp += 1;
                if sp > seg_max {
                    seg_max = sp;
                }
            }};
        }
        macro_rules! heap_grows {
            () => {{
                peak = peak.max(4 * (seg_max.saturating_sub(s0) + scratch.len()));
                max_sp = max_sp.max(seg_max);
                seg_max = sp;
            }};
        }
        macro_rules! int {
            () => {
                pop!().as_int()
            };
        }
        // Heap word at offset `off` (original heap or second heap).
        macro_rules! hword {
            ($off:expr) => {{
                let off: u32 = $off;
                let w = if off < h0 {
                    heapw.get(off as usize).map(|b| E::get(*b))
                } else {
                    scratch.get((off - h0) as usize).copied()
                };
                match w {
                    Some(w) => w,
                    None => fail!(Fault::HeapOutOfBounds { offset: off }),
                }
            }};
        }
        // Header of the object `v` refers to, checking type and extent.
        macro_rules! object {
            ($v:expr, $want:expr, $name:literal) => {{
                let v: Value = $v;
                let tc = v.tag_code();
                if !$want.contains(&tc) {
                    fail!(Fault::TypeMismatch { expected: $name, found: tc as u8 })
                }
                let off = v.datum();
                let hw = hword!(off);
                let (ty, len) = split_header(hw);
                if ty != tc {
                    fail!(Fault::TypeMismatch { expected: $name, found: ty as u8 })
                }
                let pw = payload_words(hw).unwrap_or(0);
                let end = off as u64 + 1 + pw as u64;
                let region_end = if off < h0 { h0 as u64 } else { h0 as u64 + scratch.len() as u64 };
                if end > region_end {
                    fail!(Fault::HeapOutOfBounds { offset: off })
                }
                (off, len)
            }};
        }
        macro_rules! addr {
            () => {{
                let (off, _) = object!(pop!(), [Tag::Addr as u32], "addr");
                Ipv4Addr::from(hword!(off + 1))
            }};
        }
        macro_rules! float {
            () => {{
                let (off, _) = object!(pop!(), [Tag::Float as u32], "float");
                f32::from_bits(hword!(off + 1))
            }};
        }
        macro_rules! blob {
            () => {
                object!(pop!(), [Tag::Blob as u32, Tag::Str as u32], "blob or str")
            };
        }
        macro_rules! byte {
            ($off:expr, $i:expr) => {{
                let i: u32 = $i;
                // Byte i of the blob: the words hold its bytes big-end first.
                (hword!($off + 1 + i / 4) >> (8 * (3 - i % 4))) as u8
            }};
        }
        macro_rules! alloc {
            ($tag:expr, $word:expr) => {{
                if scratch.len() + 2 > heap_cap || 4 * (sp.saturating_sub(s0) + scratch.len() + 2) > budget {
                    fail!(Fault::OutOfMemory)
                }
                heap_grows!();
                let off = h0 + scratch.len() as u32;
                scratch.push(header($tag, 1));
                scratch.push($word);
                Value::heap($tag, off)
            }};
        }
        macro_rules! push_addr {
            ($a:expr) => {{
                let a: Ipv4Addr = $a;
                let v = alloc!(Tag::Addr, u32::from(a));
                push!(v)
            }};
        }
        macro_rules! push_float {
            ($x:expr) => {{
                let x: f32 = $x;
                let v = alloc!(Tag::Float, x.to_bits());
                push!(v)
            }};
        }
        // Integer operators work on the top of the stack in place: one
        // bounds check, and the stack never grows.
        macro_rules! top2 {
            (|$a:ident, $b:ident| $e:expr) => {{
                let i = match sp.checked_sub(2) {
                    Some(i) => i,
                    None => fail!(Fault::StackUnderflow),
                };
                match st.get_mut(i..sp) {
                    Some([x, y]) => {
                        let ($a, $b) = (sext25(E::get(*x)), sext25(E::get(*y)));
                        let r: Value = $e;
                        *x = E::put(r.0);
                    }
                    _ => fail!(Fault::StackUnderflow),
                }
                sp = i + 1;
            }};
        }
        macro_rules! top1 {
            (|$a:ident| $e:expr) => {{
                match sp.checked_sub(1).and_then(|i| st.get_mut(i)) {
                    Some(x) => {
                        let $a = sext25(E::get(*x));
                        let r: Value = $e;
                        *x = E::put(r.0);
                    }
                    None => fail!(Fault::StackUnderflow),
                }
            }};
        }
        macro_rules! binop {
            (|$a:ident, $b:ident| $e:expr) => {
                top2!(|$a, $b| Value::int($e))
            };
        }
        macro_rules! cmp {
            (|$a:ident, $b:ident| $e:expr) => {
                top2!(|$a, $b| Value::bool($e))
            };
        }
        macro_rules! fbin {
            (|$a:ident, $b:ident| $e:expr) => {{
                let $b = float!();
                let $a = float!();
                push_float!($e)
            }};
        }
        macro_rules! fcmp {
            (|$a:ident, $b:ident| $e:expr) => {{
                let $b = float!();
                let $a = float!();
                push!(Value::bool($e))
            }};
        }
        macro_rules! jump {
            ($at:expr, $off:expr) => {{
                let off: i64 = $off;
                if off < 1 {
                    fail!(Fault::BackwardBranch { offset: off })
                }
                let target = $at as i64 + off;
                if target > code_len as i64 {
                    fail!(Fault::BranchOutOfBounds { target })
                }
                skipped += target as usize - pc;
                pc = target as usize;
            }};
        }
        macro_rules! netop {
            () => {{
                if ops >= max_ops {
                    fail!(Fault::TooManySends { limit: max_ops })
                }
                ops += 1;
            }};
        }
        macro_rules! finish {
            ($end:expr) => {{
                out.executed = executed!();
                let peak = peak.max(4 * (seg_max.saturating_sub(s0) + scratch.len()));
                out.max_stack = max_sp.max(seg_max) as u32;
                out.depth = sp as u32;
                out.heap_alloc = scratch.len() as u32;
                out.peak_memory = (hdr.len + peak) as u32;
                out.net_ops = ops;
                out.rb_left = rb;
                out.end = $end;
                return Ok(());
            }};
        }

        let forward: ForwardInPlace = loop {
            let Some(wb) = code.get(pc) else { finish!(End::Exit) };
            let mut w = E::get(*wb);
            // A run of stack, integer and branch instructions goes to the
            // fast loop (`vm/fast.rs`), which stops before the first
            // instruction it does not handle (or that would fault); that one
            // runs here. Only a run of three or more: entering and leaving
            // costs about as much as two instructions here. Never when
            // tracing: the tracer sees every instruction from here.
            if !T::ENABLED && fast::worth_it::<E>(code, pc, w, sp) {
                let mut r = fast::Regs { pc, sp, seg_max, skipped };
                fast::run::<E>(code, st, heapw, h0, &mut r);
                fast::Regs { pc, sp, seg_max, skipped } = r;
                let Some(wb) = code.get(pc) else { finish!(End::Exit) };
                w = E::get(*wb);
            }
            let at = pc;
            pc += 1;
            let imm = w & IMM_MASK;
            // One jump table on the 7-bit opcode (not a decode table, then a
            // second jump table on the decoded `Op`); unassigned codes fault.
            // The match is no longer checked for exhaustiveness: an opcode
            // without an arm would fault as invalid, which the instruction
            // tests catch (`every_opcode_is_exercised` in tests/insns.rs).
            let op = (w >> 25) as u8;
            match op {
                opc::Nop => {}
                opc::Push => push!(Value(imm)),
                opc::PushB => {
                    if imm > 1 {
                        fail!(Fault::InvalidImmediate(imm))
                    }
                    push!(Value::bool(imm != 0))
                }
                opc::PushU => push!(Value::UNIT),
                opc::PushH => {
                    if imm >= h0 {
                        fail!(Fault::HeapOutOfBounds { offset: imm })
                    }
                    let (ty, _) = split_header(hword!(imm));
                    if !code_is_ref(ty) {
                        fail!(Fault::TypeMismatch { expected: "heap object", found: ty as u8 })
                    }
                    push!(Value((ty << 25) | imm))
                }
                opc::Pop => {
                    pop!();
                }
                opc::PopI => {
                    sp = match sp.checked_sub(imm as usize) {
                        Some(s) => s,
                        None => fail!(Fault::StackUnderflow),
                    };
                }
                opc::Pull => {
                    let v = match sp.checked_sub(imm as usize + 1).and_then(|i| st.get(i)) {
                        Some(b) => E::get(*b),
                        None => fail!(Fault::StackUnderflow),
                    };
                    push!(Value(v))
                }
                opc::Store => {
                    let v = pop!();
                    match sp.checked_sub(imm as usize + 1).and_then(|i| st.get_mut(i)) {
                        Some(b) => *b = E::put(v.0),
                        None => fail!(Fault::StackUnderflow),
                    }
                }
                opc::Slide => {
                    let v = pop!();
                    sp = match sp.checked_sub(imm as usize) {
                        Some(s) => s,
                        None => fail!(Fault::StackUnderflow),
                    };
                    push!(v)
                }
                opc::Swap => {
                    let b = pop!();
                    let a = pop!();
                    push!(b);
                    push!(a)
                }
                // ---- network control ----
                opc::Forw | opc::ForwTo => {
                    let (dest, src) = if op == opc::Forw {
                        (head_addr(head, DST), head_addr(head, SRC))
                    } else {
                        (addr!(), ctx.here())
                    };
                    if ctx.is_here(dest) {
                        continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, st, sp, rb);
                        continue;
                    }
                    netop!();
                    if rb == 0 {
                        fail!(Fault::ResourceBoundExhausted)
                    }
                    let stack = st.get(..sp).unwrap_or_default();
                    let needs_copy = stack.iter().any(|b| {
                        let v = Value(E::get(*b));
                        v.is_ref() && v.datum() >= h0
                    });
                    if needs_copy {
                        let child = ChildSpec { dest, src, entry: hdr.entry as u16, rb, stack_words: sp };
                        let loc = match build_child::<E>(gc, out, head, &hdr, scratch, stack, child, mtu) {
                            Ok(l) => l,
                            Err(f) => fail!(f),
                        };
                        out.actions.push(Action::Send { dest, kind: SendKind::Forward, packet: loc });
                        continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, stack, sp, rb);
                        finish!(End::Forwarded)
                    }
                    let total = sb + 4 * sp;
                    if total > mtu || sp > u16::MAX as usize {
                        fail!(Fault::PacketTooLarge { len: total, mtu })
                    }
                    continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, stack, sp, rb);
                    // The stack is already in place after the heap: only the
                    // header changes (SNAP §VI-D).
                    break ForwardInPlace { dest, src, total };
                }
                opc::Send => {
                    let dest = addr!();
                    let r = int!();
                    let s = int!();
                    let ep = int!();
                    netop!();
                    if ep < 0 || ep as usize >= code_len {
                        fail!(Fault::BadEntryPoint(ep))
                    }
                    if s < 0 || s as usize > sp {
                        fail!(Fault::StackUnderflow)
                    }
                    if r < 1 {
                        fail!(Fault::InvalidSendBound(r))
                    }
                    if r > rb as i32 {
                        fail!(Fault::ResourceBoundExhausted)
                    }
                    let child =
                        ChildSpec { dest, src: ctx.here(), entry: ep as u16, rb: r as u16, stack_words: s as usize };
                    let stack = st.get(sp - s as usize..sp).unwrap_or_default();
                    let loc = match build_child::<E>(gc, out, head, &hdr, scratch, stack, child, mtu) {
                        Ok(l) => l,
                        Err(f) => fail!(f),
                    };
                    out.actions.push(Action::Send { dest, kind: SendKind::Child, packet: loc });
                    rb -= r as u16;
                    out.rb_given += r as u32;
                    push!(Value::UNIT)
                }
                opc::Demux => {
                    let port = int!();
                    let v = pop!();
                    if !(0..=u16::MAX as i32).contains(&port) {
                        fail!(Fault::BadPort(port))
                    }
                    netop!();
                    let payload = match deliver_bytes::<E>(out, head, &hdr, scratch, v) {
                        Ok(l) => l,
                        Err(f) => fail!(f),
                    };
                    out.actions.push(Action::Deliver { port: port as u16, payload });
                    continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, st, sp, rb);
                    finish!(End::Delivered)
                }
                opc::Exit => {
                    continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, st, sp, rb);
                    finish!(End::Exit)
                }
                // ---- flow control ----
                opc::Bne => {
                    if pop!().datum() != 0 {
                        jump!(at, sext25(imm) as i64)
                    }
                }
                opc::Beq => {
                    if pop!().datum() == 0 {
                        jump!(at, sext25(imm) as i64)
                    }
                }
                opc::Ji => jump!(at, sext25(imm) as i64),
                opc::Paj => {
                    let v = int!() as i64;
                    jump!(at, v + sext25(imm) as i64)
                }
                // ---- environment ----
                opc::GetSrc => push_addr!(cold_addr(head_addr(head, SRC))),
                opc::GetDst => push_addr!(cold_addr(head_addr(head, DST))),
                opc::GetRb => push!(Value::int(rb as i32)),
                opc::GetEp => push!(cold_int(hdr.entry as i32)),
                opc::GetPort => push!(cold_int(hdr.port as i32)),
                opc::Here => push_addr!(cold_addr(ctx.here())),
                opc::IsHere => {
                    let a = addr!();
                    push!(Value::bool(ctx.is_here(a)))
                }
                opc::GetIfc => push!(cold_int(max_ops as i32)),
                opc::NextHop => {
                    let a = addr!();
                    match ctx.next_hop(a) {
                        Some(h) => push_addr!(h),
                        None => push!(Value::UNIT),
                    }
                }
                opc::Nbr => {
                    let i = int!();
                    match usize::try_from(i).ok().and_then(|i| ctx.neighbors().get(i)) {
                        Some(&h) => push_addr!(h),
                        None => push!(Value::UNIT),
                    }
                }
                opc::NNbr => push!(cold_int(ctx.neighbors().len().min(1 << 20) as i32)),
                opc::Depth => push!(Value::int(sp as i32)),
                // ---- integer arithmetic ----
                opc::Add => binop!(|a, b| a.wrapping_add(b)),
                opc::Sub => binop!(|a, b| a.wrapping_sub(b)),
                opc::Mul => binop!(|a, b| a.wrapping_mul(b)),
                opc::Div | opc::Mod => {
                    let b = int!();
                    let a = int!();
                    if b == 0 {
                        fail!(Fault::DivideByZero)
                    }
                    push!(Value::int(if op == opc::Div { a.wrapping_div(b) } else { a.wrapping_rem(b) }))
                }
                opc::Neg => top1!(|a| Value::int(a.wrapping_neg())),
                opc::Abs => top1!(|a| Value::int(a.wrapping_abs())),
                opc::Min => binop!(|a, b| a.min(b)),
                opc::Max => binop!(|a, b| a.max(b)),
                opc::AddI => top1!(|a| Value::int(a.wrapping_add(sext25(imm)))),
                opc::SubI => top1!(|a| Value::int(a.wrapping_sub(sext25(imm)))),
                opc::MulI => top1!(|a| Value::int(a.wrapping_mul(sext25(imm)))),
                opc::DivI | opc::ModI => {
                    let b = sext25(imm);
                    let a = int!();
                    if b == 0 {
                        fail!(Fault::DivideByZero)
                    }
                    push!(Value::int(if op == opc::DivI { a.wrapping_div(b) } else { a.wrapping_rem(b) }))
                }
                // ---- bitwise ----
                opc::And => binop!(|a, b| a & b),
                opc::Or => binop!(|a, b| a | b),
                opc::Xor => binop!(|a, b| a ^ b),
                opc::Not => top1!(|a| Value::int(!a)),
                opc::Shl => binop!(|a, b| a.wrapping_shl(b as u32 & 31)),
                opc::Shr => binop!(|a, b| a >> (b as u32 & 31)),
                opc::ShrU => binop!(|a, b| (trunc25(a) >> (b as u32 & 31)) as i32),
                opc::AndI => top1!(|a| Value::int(a & sext25(imm))),
                opc::OrI => top1!(|a| Value::int(a | sext25(imm))),
                opc::XorI => top1!(|a| Value::int(a ^ sext25(imm))),
                opc::ShlI => top1!(|a| Value::int(a.wrapping_shl(imm & 31))),
                opc::ShrI => top1!(|a| Value::int(a >> (imm & 31))),
                opc::LNot => {
                    let a = pop!();
                    push!(Value::bool(a.datum() == 0))
                }
                // ---- relational ----
                opc::Eq | opc::Neq => {
                    let b = pop!();
                    let a = pop!();
                    let same = if a.tag_code() != b.tag_code() {
                        false
                    } else if a.0 == b.0 {
                        true
                    } else {
                        match a.tag() {
                            Some(Tag::Addr) => {
                                let (oa, _) = object!(a, [Tag::Addr as u32], "addr");
                                let (ob, _) = object!(b, [Tag::Addr as u32], "addr");
                                hword!(oa + 1) == hword!(ob + 1)
                            }
                            Some(Tag::Float) => {
                                let (oa, _) = object!(a, [Tag::Float as u32], "float");
                                let (ob, _) = object!(b, [Tag::Float as u32], "float");
                                f32::from_bits(hword!(oa + 1)) == f32::from_bits(hword!(ob + 1))
                            }
                            _ => false,
                        }
                    };
                    push!(Value::bool(same == (op == opc::Eq)))
                }
                opc::Lt => cmp!(|a, b| a < b),
                opc::Le => cmp!(|a, b| a <= b),
                opc::Gt => cmp!(|a, b| a > b),
                opc::Ge => cmp!(|a, b| a >= b),
                opc::EqI => top1!(|a| Value::bool(a == sext25(imm))),
                opc::NeqI => top1!(|a| Value::bool(a != sext25(imm))),
                opc::LtI => top1!(|a| Value::bool(a < sext25(imm))),
                opc::LeI => top1!(|a| Value::bool(a <= sext25(imm))),
                opc::GtI => top1!(|a| Value::bool(a > sext25(imm))),
                opc::GeI => top1!(|a| Value::bool(a >= sext25(imm))),
                // ---- floating point ----
                opc::FAdd => fbin!(|a, b| a + b),
                opc::FSub => fbin!(|a, b| a - b),
                opc::FMul => fbin!(|a, b| a * b),
                opc::FDiv => fbin!(|a, b| a / b),
                opc::FNeg => {
                    let a = float!();
                    push_float!(-a)
                }
                opc::FLt => fcmp!(|a, b| a < b),
                opc::FLe => fcmp!(|a, b| a <= b),
                opc::FEq => fcmp!(|a, b| a == b),
                opc::IToF => {
                    let a = int!();
                    push_float!(a as f32)
                }
                opc::FToI => {
                    let a = float!();
                    let i = if a.is_nan() { 0 } else { (a as i64).clamp(IMM_MIN64, IMM_MAX64) as i32 };
                    push!(Value::int(i))
                }
                // ---- addresses ----
                opc::AMask => {
                    if imm > 32 {
                        fail!(Fault::InvalidImmediate(imm))
                    }
                    let a = addr!();
                    push_addr!(Ipv4Addr::from(u32::from(a) & prefix_mask(imm)))
                }
                opc::AMatch => {
                    if imm > 32 {
                        fail!(Fault::InvalidImmediate(imm))
                    }
                    let b = addr!();
                    let a = addr!();
                    push!(Value::bool((u32::from(a) ^ u32::from(b)) & prefix_mask(imm) == 0))
                }
                opc::AOctet => {
                    if imm > 3 {
                        fail!(Fault::InvalidImmediate(imm))
                    }
                    let a = addr!();
                    push!(Value::int(a.octets()[imm as usize] as i32))
                }
                opc::MkAddr => {
                    let d = int!();
                    let c = int!();
                    let b = int!();
                    let a = int!();
                    push_addr!(Ipv4Addr::new(a as u8, b as u8, c as u8, d as u8))
                }
                // ---- tuples and types ----
                opc::MkTup => {
                    let n = imm as usize;
                    // SNAP §IV-A.2: mktup n must be followed by n-1 non-mktup instructions.
                    if at < fence {
                        fail!(Fault::MktupTooClose)
                    }
                    if at + n.max(1) > code_len {
                        fail!(Fault::MktupPastEnd)
                    }
                    fence = at + n.max(1);
                    let base = match sp.checked_sub(n) {
                        Some(b) => b,
                        None => fail!(Fault::StackUnderflow),
                    };
                    if scratch.len() + 1 + n > heap_cap
                        || 4 * (base.saturating_sub(s0) + scratch.len() + 1 + n) > budget
                    {
                        fail!(Fault::OutOfMemory)
                    }
                    // The popped values stay in their slots while they are
                    // copied; the stack has shrunk to `base` already.
                    let top = sp;
                    sp = base;
                    heap_grows!();
                    let off = h0 + scratch.len() as u32;
                    scratch.push(header(Tag::Tuple, n as u32));
                    scratch.extend(st.get(base..top).unwrap_or_default().iter().map(|b| E::get(*b)));
                    push!(Value::heap(Tag::Tuple, off))
                }
                opc::Nth | opc::NthX => {
                    let i = if op == opc::Nth { imm as i64 } else { int!() as i64 };
                    let (off, len) = object!(pop!(), [Tag::Tuple as u32], "tuple");
                    if i < 0 || i >= len as i64 {
                        fail!(Fault::IndexOutOfBounds { index: i, len })
                    }
                    push!(Value(hword!(off + 1 + i as u32)))
                }
                opc::TLen => {
                    let (_, len) = object!(pop!(), [Tag::Tuple as u32], "tuple");
                    push!(Value::int(len as i32))
                }
                opc::IsTag => {
                    let v = pop!();
                    push!(Value::bool(v.tag_code() == imm))
                }
                opc::TagOf => {
                    let v = pop!();
                    push!(Value::int(v.tag_code() as i32))
                }
                // ---- byte arrays ----
                opc::BLen => {
                    let (_, len) = blob!();
                    push!(Value::int(len as i32))
                }
                opc::BGet | opc::BGetX => {
                    let i = if op == opc::BGet { imm as i64 } else { int!() as i64 };
                    let (off, len) = blob!();
                    if i < 0 || i >= len as i64 {
                        fail!(Fault::IndexOutOfBounds { index: i, len })
                    }
                    push!(Value::int(byte!(off, i as u32) as i32))
                }
                opc::BGet16 => {
                    let (off, len) = blob!();
                    if imm as u64 + 2 > len as u64 {
                        fail!(Fault::IndexOutOfBounds { index: imm as i64, len })
                    }
                    // One word read when both bytes are in one word.
                    let v = if imm % 4 != 3 {
                        (hword!(off + 1 + imm / 4) >> (8 * (2 - imm % 4))) as u16
                    } else {
                        u16::from_be_bytes([byte!(off, imm), byte!(off, imm + 1)])
                    };
                    push!(Value::int(v as i32))
                }
                opc::BGetA => {
                    let (off, len) = blob!();
                    if imm as u64 + 4 > len as u64 {
                        fail!(Fault::IndexOutOfBounds { index: imm as i64, len })
                    }
                    let a = [byte!(off, imm), byte!(off, imm + 1), byte!(off, imm + 2), byte!(off, imm + 3)];
                    push_addr!(Ipv4Addr::from(a))
                }
                // ---- services ----
                opc::Calls => {
                    if imm >= h0 {
                        fail!(Fault::HeapOutOfBounds { offset: imm })
                    }
                    let (off, len) = object!(Value::heap(Tag::Str, imm), [Tag::Str as u32], "str");
                    if len as usize > crate::services::MAX_NAME {
                        fail!(Fault::UnknownService)
                    }
                    let mut name = [0u8; crate::services::MAX_NAME];
                    for i in 0..len {
                        name[i as usize] = byte!(off, i);
                    }
                    let Some(svc) = ctx.services().and_then(|t| t.get(&name[..len as usize])) else {
                        fail!(Fault::UnknownService)
                    };
                    let n = svc.arity().min(MAX_ARITY);
                    if sp < n {
                        fail!(Fault::StackUnderflow)
                    }
                    let mut args = [Arg::Unit; MAX_ARITY];
                    for i in (0..n).rev() {
                        let v = pop!();
                        args[i] = match v.tag() {
                            Some(Tag::Int) => Arg::Int(v.as_int()),
                            Some(Tag::Bool) => Arg::Bool(v.datum() != 0),
                            Some(Tag::Unit) => Arg::Unit,
                            Some(Tag::Addr) => {
                                let (o, _) = object!(v, [Tag::Addr as u32], "addr");
                                Arg::Addr(Ipv4Addr::from(hword!(o + 1)))
                            }
                            Some(Tag::Float) => {
                                let (o, _) = object!(v, [Tag::Float as u32], "float");
                                Arg::Float(f32::from_bits(hword!(o + 1)))
                            }
                            Some(t @ (Tag::Blob | Tag::Str)) => {
                                let (o, l) = object!(v, [Tag::Blob as u32, Tag::Str as u32], "blob");
                                if l as usize > crate::services::MAX_BYTES_ARG {
                                    Arg::Opaque(t as u8)
                                } else {
                                    let mut b = [0u8; crate::services::MAX_BYTES_ARG];
                                    for j in 0..l {
                                        b[j as usize] = byte!(o, j);
                                    }
                                    SmallBytes::new(&b[..l as usize]).map_or(Arg::Opaque(t as u8), |s| Arg::Bytes(t, s))
                                }
                            }
                            _ => Arg::Opaque(v.tag_code() as u8),
                        };
                    }
                    let mut cx =
                        ServiceCx { now_ms: ctx.now_ms(), here: ctx.here(), interfaces: max_ops, log: &mut out.log };
                    match svc.call(&mut cx, &args[..n]) {
                        Ok(Ret::Int(i)) => push!(Value::int(i)),
                        Ok(Ret::Bool(b)) => push!(Value::bool(b)),
                        Ok(Ret::Unit) => push!(Value::UNIT),
                        Ok(Ret::Addr(a)) => push_addr!(a),
                        Ok(Ret::Float(x)) => push_float!(x),
                        Err(e) => fail!(Fault::ServiceFailed(e)),
                    }
                }
                _ => fail!(Fault::InvalidOpcode { code: op }),
            }
            continue_trace::<E, T>(tr, at, w, head, &hdr, scratch, st, sp, rb);
        };
        // In-place forward: rewrite the header fields that change.
        let mut p = Packet::new_unchecked(&mut buf[..forward.total]);
        p.set_resource_bound(rb);
        p.set_stack_len(sp as u16);
        p.set_dst(forward.dest);
        p.set_src(forward.src);
        out.actions.push(Action::Send {
            dest: forward.dest,
            kind: SendKind::Forward,
            packet: Loc::Input(0..forward.total),
        });
        finish!(End::Forwarded)
    }
}

/// The opcodes as `u8` constants, for the interpreter's one-level dispatch.
macro_rules! op_codes {
    ($($name:ident $mn:literal $code:literal $imm:ident $class:ident $cost:ident $eff:literal $fails:literal $doc:literal;)*) => {
        #[allow(non_upper_case_globals)]
        mod opc {
            $(pub(super) const $name: u8 = $code;)*
        }
        // Each constant is its `Op`'s code.
        const _: () = { $(assert!(opc::$name == crate::ops::Op::$name as u8);)* };
    };
}
crate::for_each_op!(op_codes);

/// `Value::int` out of line, for the handlers of rarely used environment
/// queries: their operands do not change during a packet, and inline LLVM
/// computes them once before the loop, on every packet, whether or not the
/// program uses them.
#[cold]
#[inline(never)]
fn cold_int(i: i32) -> Value {
    Value::int(i)
}

/// The address in header field `f` (`field::SRC` or `field::DST`), read
/// where it lies instead of from the decoded header: the header is not
/// written while the packet runs, and keeping the decoded copies live across
/// the interpreter's loop cost two loads per instruction.
#[inline(always)]
fn head_addr(head: &[u8], f: core::ops::Range<usize>) -> Ipv4Addr {
    head.get(f).and_then(|b| <[u8; 4]>::try_from(b).ok()).map_or(Ipv4Addr::UNSPECIFIED, Ipv4Addr::from)
}

/// The same for the address queries.
#[cold]
#[inline(never)]
fn cold_addr(a: Ipv4Addr) -> Ipv4Addr {
    a
}

/// A forward that reuses the arriving buffer (SNAP §VI-D).
#[derive(Debug, Clone, Copy)]
struct ForwardInPlace {
    dest: Ipv4Addr,
    src: Ipv4Addr,
    total: usize,
}

const IMM_MIN64: i64 = crate::ops::IMM_MIN as i64;
const IMM_MAX64: i64 = crate::ops::IMM_MAX as i64;

#[inline(always)]
fn prefix_mask(k: u32) -> u32 {
    if k == 0 { 0 } else { u32::MAX << (32 - k) }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn continue_trace<E: Endian, T: Tracer>(
    tr: &mut T,
    pc: usize,
    w: u32,
    head: &[u8],
    hdr: &Hdr,
    scratch: &[u32],
    st: &[[u8; 4]],
    sp: usize,
    rb: u16,
) {
    if T::ENABLED {
        // Sliced here, not by the caller: a slice taken in the argument list
        // is checked after every instruction even when nothing is traced.
        let stack = st.get(..sp).unwrap_or_default();
        let view =
            TraceView { head, le: E::LITTLE, heap_start: hdr.heap_start, h0: hdr.h0, scratch, stack, rb, fault: None };
        tr.step(pc, Insn::decode(w).map_err(|_| w), &view);
    }
}

/// Header fields of a child or forwarded packet.
#[derive(Debug, Clone, Copy)]
struct ChildSpec {
    dest: Ipv4Addr,
    src: Ipv4Addr,
    entry: u16,
    rb: u16,
    /// Number of top stack values it takes.
    stack_words: usize,
}

/// Reads heap word `off` of the parent (original heap or second heap).
#[inline(always)]
fn parent_word<E: Endian>(buf: &[u8], hdr: &Hdr, scratch: &[u32], off: u32) -> Option<u32> {
    if off < hdr.h0 {
        rd::<E>(buf, hdr.heap_start + 4 * off as usize)
    } else {
        scratch.get((off - hdr.h0) as usize).copied()
    }
}

/// Copies the object at parent offset `off` into the child heap (once), and
/// returns its child offset.
fn gc_copy<E: Endian>(
    gc: &mut Gc,
    buf: &[u8],
    hdr: &Hdr,
    scratch: &[u32],
    off: u32,
    (fixed, mtu): (usize, usize),
) -> Result<u32, Fault> {
    let oob = Fault::HeapOutOfBounds { offset: off };
    let i = off as usize;
    if gc.stamp.get(i) == Some(&gc.epoch) {
        return gc.fwd.get(i).copied().ok_or(oob);
    }
    let hw = parent_word::<E>(buf, hdr, scratch, off).ok_or(oob)?;
    let Some(pw) = payload_words(hw) else {
        return Err(Fault::TypeMismatch { expected: "heap object", found: (hw >> 25) as u8 });
    };
    let region_end = if off < hdr.h0 { hdr.h0 as u64 } else { hdr.h0 as u64 + scratch.len() as u64 };
    if off as u64 + 1 + pw as u64 > region_end {
        return Err(oob);
    }
    let new = gc.heap.len();
    let len = fixed + 4 * (new + 1 + pw as usize);
    if len > mtu {
        return Err(Fault::PacketTooLarge { len, mtu });
    }
    gc.heap.push(hw);
    for k in 1..=pw {
        gc.heap.push(parent_word::<E>(buf, hdr, scratch, off + k).ok_or(oob)?);
    }
    if gc.stamp.len() <= i {
        gc.stamp.resize(i + 1, 0);
        gc.fwd.resize(i + 1, 0);
    }
    gc.stamp[i] = gc.epoch;
    gc.fwd[i] = new as u32;
    Ok(new as u32)
}

/// Builds a child packet in the outcome arena with a copying pass that keeps
/// only the heap reachable from the child's stack and the code's heap
/// constants, fixing offsets (SNAP §VI-D).
#[allow(clippy::too_many_arguments)]
fn build_child<E: Endian>(
    gc: &mut Gc,
    out: &mut Outcome,
    buf: &[u8],
    hdr: &Hdr,
    scratch: &[u32],
    stack: &[[u8; 4]],
    spec: ChildSpec,
    mtu: usize,
) -> Result<Loc, Fault> {
    gc.epoch = gc.epoch.wrapping_add(1);
    if gc.epoch == 0 {
        gc.stamp.iter_mut().for_each(|s| *s = 0);
        gc.epoch = 1;
    }
    gc.heap.clear();
    gc.stack.clear();
    gc.fixups.clear();
    let c = hdr.code_len;
    let fixed = HEADER_LEN + 4 * (c + spec.stack_words);
    if fixed > mtu {
        return Err(Fault::PacketTooLarge { len: fixed, mtu });
    }
    let room = (fixed, mtu);
    // Roots 1: the child's stack, bottom first.
    for b in stack {
        let w = E::get(*b);
        let v = Value(w);
        let nw = if v.is_ref() {
            let n = gc_copy::<E>(gc, buf, hdr, scratch, v.datum(), room)?;
            (w & !IMM_MASK) | n
        } else {
            w
        };
        gc.stack.push(nw);
    }
    // Roots 2: heap constants named by the code (`pushh`, `calls`).
    for i in 0..c {
        let w = rd::<E>(buf, HEADER_LEN + 4 * i).unwrap_or(0);
        let code = (w >> 25) as u8;
        if code == Op::PushH as u8 || code == Op::Calls as u8 {
            let imm = w & IMM_MASK;
            // A constant that does not name a valid object is left as is: it
            // faults if it ever executes. A valid one that does not fit the
            // MTU means the child cannot be built.
            if imm < hdr.h0 {
                match gc_copy::<E>(gc, buf, hdr, scratch, imm, room) {
                    Ok(n) => gc.fixups.push((i, (w & !IMM_MASK) | n)),
                    Err(f @ Fault::PacketTooLarge { .. }) => return Err(f),
                    Err(_) => {}
                }
            }
        }
    }
    // Cheney scan: tuples may hold references.
    let mut scan = 0;
    while scan < gc.heap.len() {
        let hw = gc.heap[scan];
        let (ty, len) = split_header(hw);
        let pw = payload_words(hw).unwrap_or(0) as usize;
        if ty == Tag::Tuple as u32 {
            for j in 0..len as usize {
                let w = gc.heap[scan + 1 + j];
                if code_is_ref(w >> 25) {
                    let n = gc_copy::<E>(gc, buf, hdr, scratch, w & IMM_MASK, room)?;
                    gc.heap[scan + 1 + j] = (w & !IMM_MASK) | n;
                }
            }
        }
        scan += 1 + pw;
    }
    let h = gc.heap.len();
    let total = fixed + 4 * h;
    if total > mtu || h > u16::MAX as usize || spec.stack_words > u16::MAX as usize {
        return Err(Fault::PacketTooLarge { len: total, mtu });
    }
    // Emit: header, code (patched), heap, stack.
    let start = out.arena.len();
    out.arena.resize(start + total, 0);
    let dst = &mut out.arena[start..start + total];
    dst[..HEADER_LEN + 4 * c].copy_from_slice(&buf[..HEADER_LEN + 4 * c]);
    let mut p = Packet::new_unchecked(&mut dst[..]);
    p.set_flags(hdr.flags);
    p.set_entry(spec.entry);
    p.set_resource_bound(spec.rb);
    p.set_port(hdr.port);
    p.set_src(spec.src);
    p.set_dst(spec.dest);
    p.set_heap_len(h as u16);
    p.set_stack_len(spec.stack_words as u16);
    for &(i, w) in &gc.fixups {
        wr::<E>(dst, HEADER_LEN + 4 * i, w);
    }
    let mut at = HEADER_LEN + 4 * c;
    for &w in gc.heap.iter().chain(&gc.stack) {
        wr::<E>(dst, at, w);
        at += 4;
    }
    Ok(Loc::Arena(start..start + total))
}

/// The bytes `demux` delivers for value `v` (see docs/snap.md, "Delivery").
fn deliver_bytes<E: Endian>(out: &mut Outcome, buf: &[u8], hdr: &Hdr, scratch: &[u32], v: Value) -> Result<Loc, Fault> {
    let start = out.arena.len();
    match v.tag() {
        Some(Tag::Blob | Tag::Str) => {
            let (off, len) = obj_extent::<E>(buf, hdr, scratch, v)?;
            let first = hdr.heap_start + 4 * (off as usize + 1);
            if !E::LITTLE && off < hdr.h0 {
                return Ok(Loc::Input(first..first + len as usize));
            }
            for i in 0..len {
                let w = parent_word::<E>(buf, hdr, scratch, off + 1 + i / 4)
                    .ok_or(Fault::HeapOutOfBounds { offset: off })?;
                out.arena.push(w.to_be_bytes()[(i % 4) as usize]);
            }
        }
        Some(Tag::Tuple) => {
            let (off, len) = obj_extent::<E>(buf, hdr, scratch, v)?;
            for j in 0..len {
                let e =
                    parent_word::<E>(buf, hdr, scratch, off + 1 + j).ok_or(Fault::HeapOutOfBounds { offset: off })?;
                let ev = Value(e);
                if ev.tag() == Some(Tag::Tuple) {
                    return Err(Fault::TypeMismatch { expected: "non-tuple element", found: Tag::Tuple as u8 });
                }
                out.arena.push(ev.tag_code() as u8);
                let lpos = out.arena.len();
                out.arena.extend_from_slice(&[0, 0]);
                scalar_bytes::<E>(out, buf, hdr, scratch, ev)?;
                let n = (out.arena.len() - lpos - 2) as u16;
                out.arena[lpos..lpos + 2].copy_from_slice(&n.to_be_bytes());
            }
        }
        _ => scalar_bytes::<E>(out, buf, hdr, scratch, v)?,
    }
    Ok(Loc::Arena(start..out.arena.len()))
}

fn obj_extent<E: Endian>(buf: &[u8], hdr: &Hdr, scratch: &[u32], v: Value) -> Result<(u32, u32), Fault> {
    let off = v.datum();
    let oob = Fault::HeapOutOfBounds { offset: off };
    let hw = parent_word::<E>(buf, hdr, scratch, off).ok_or(oob)?;
    let (ty, len) = split_header(hw);
    if ty != v.tag_code() {
        return Err(Fault::TypeMismatch { expected: "object of the value's type", found: ty as u8 });
    }
    let pw = payload_words(hw).unwrap_or(0);
    let region_end = if off < hdr.h0 { hdr.h0 as u64 } else { hdr.h0 as u64 + scratch.len() as u64 };
    if off as u64 + 1 + pw as u64 > region_end {
        return Err(oob);
    }
    Ok((off, len))
}

fn scalar_bytes<E: Endian>(out: &mut Outcome, buf: &[u8], hdr: &Hdr, scratch: &[u32], v: Value) -> Result<(), Fault> {
    match v.tag() {
        Some(Tag::Int) => out.arena.extend_from_slice(&v.as_int().to_be_bytes()),
        Some(Tag::Bool) => out.arena.push((v.datum() != 0) as u8),
        Some(Tag::Unit) => {}
        Some(Tag::Addr | Tag::Float) => {
            let (off, _) = obj_extent::<E>(buf, hdr, scratch, v)?;
            let w = parent_word::<E>(buf, hdr, scratch, off + 1).ok_or(Fault::HeapOutOfBounds { offset: off })?;
            out.arena.extend_from_slice(&w.to_be_bytes());
        }
        Some(Tag::Blob | Tag::Str) => {
            let (off, len) = obj_extent::<E>(buf, hdr, scratch, v)?;
            for i in 0..len {
                let w = parent_word::<E>(buf, hdr, scratch, off + 1 + i / 4)
                    .ok_or(Fault::HeapOutOfBounds { offset: off })?;
                out.arena.push(w.to_be_bytes()[(i % 4) as usize]);
            }
        }
        Some(Tag::Tuple) | None => {
            return Err(Fault::TypeMismatch { expected: "deliverable value", found: v.tag_code() as u8 });
        }
    }
    Ok(())
}
