//! SNAP — Safe and Nimble Active Packets — as a sans-I/O library.
//!
//! Layering, bottom up:
//! - [`ops`]: the instruction set, defined once in [`for_each_op!`].
//! - [`value`]: tagged stack words and heap objects.
//! - [`wire`]: the packet format, a checked view ([`wire::Packet`]) and an
//!   owned representation ([`wire::Repr`]).
//! - [`vm`]: the interpreter. It executes a packet in place in the buffer it
//!   arrived in and returns an [`vm::Outcome`]: packets to send, a payload to
//!   deliver, or a fault. It owns no sockets, clocks or threads; the node
//!   passes `now` and its routing view in through [`vm::NodeContext`].
//! - [`services`]: the extensible table of node-resident services for `calls`.
//! - [`asm`] and [`disasm`]: the text format.
//! - [`bound`]: resource bounds computed from the header before execution.
//!
//! # Invariants (SNAP §IV)
//! - Every branch goes forward, so each instruction executes at most once.
//! - Every non-network instruction runs in constant time and pushes at most
//!   one stack word and allocates at most one heap object of one payload word
//!   (`mktup n` is amortized over the n-1 non-`mktup` instructions that must
//!   follow it).
//! - At most `N` network operations per packet (`N` = interface count);
//!   `demux` delivers at most once and ends the packet.
//! - Execution memory never exceeds 4 × MTU.
//! - The resource bound is decremented on arrival and conserved across
//!   children.
//! - Untrusted bytes never cause a panic: every fault is a typed [`vm::Fault`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod asm;
pub mod bound;
pub mod disasm;
pub mod fuzzing;
pub mod ops;
pub mod services;
pub mod sim;
pub mod value;
pub mod vm;
pub mod wire;

pub use ops::{Insn, Op};
pub use value::{Tag, Value};
pub use vm::{Action, End, Fault, Loc, NodeContext, Outcome, SimpleNode, Vm, VmConfig};
pub use wire::{Packet as SnapPacket, Repr as SnapRepr, WireError};
