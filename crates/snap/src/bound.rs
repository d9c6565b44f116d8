//! Resource bounds of a packet, computed from its header before it runs
//! (SNAP §IV-A: "a node can trivially predict a strict upper bound on the
//! resources that will be used by a packet").

use crate::wire::{HEADER_LEN, Packet, WireError};
use core::fmt;

/// Upper bounds guaranteed by the design for one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Instructions executed at one node: each runs at most once and
    /// execution starts at the entry point, so at most `code_len - entry`.
    pub instructions: u32,
    /// Stack words at one node: the initial stack plus one per instruction.
    pub stack_words: u32,
    /// Heap words at one node: the original heap plus three per instruction
    /// (no instruction grows stack and heap together by more than three
    /// words; `mktup n` is amortized over its shadow).
    pub heap_words: u32,
    /// Bytes of execution memory at one node: the packet plus stack growth
    /// and execution heap together, at most 12 bytes per instruction.
    /// Never more than 4 × MTU.
    pub memory_bytes: u32,
    /// Network operations at one node (`forw`, `forwto`, `send`, `demux`):
    /// the node's interface count.
    pub net_ops: u8,
    /// Bytes transmitted by one node for this packet: `net_ops × mtu`.
    pub tx_bytes_per_node: u64,
    /// Transmissions this packet and all its descendants can cause in the
    /// whole network: its resource bound (conserved across children).
    pub network_transmissions: u32,
    /// Bytes this packet and all its descendants can put on the network.
    pub network_bytes: u64,
}

/// Computes the bounds of a packet for a node with `interfaces` interfaces
/// and the given MTU.
pub fn bounds(packet: &[u8], interfaces: u8, mtu: usize) -> Result<Bounds, WireError> {
    let p = Packet::new_checked(packet)?;
    let n = (p.code_len() - p.entry()) as u32;
    let len = p.total_len() as u32;
    let stack_words = p.stack_len() as u32 + n;
    let heap_words = p.heap_len() as u32 + 3 * n;
    let rb = p.resource_bound() as u32;
    Ok(Bounds {
        instructions: n,
        stack_words,
        heap_words,
        memory_bytes: len + 12 * n,
        net_ops: interfaces,
        tx_bytes_per_node: interfaces as u64 * mtu as u64,
        network_transmissions: rb,
        network_bytes: rb as u64 * mtu.max(HEADER_LEN) as u64,
    })
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "per node:")?;
        writeln!(f, "  instructions executed   <= {}", self.instructions)?;
        writeln!(f, "  stack words             <= {}", self.stack_words)?;
        writeln!(f, "  heap words              <= {}", self.heap_words)?;
        writeln!(f, "  execution memory bytes  <= {}", self.memory_bytes)?;
        writeln!(f, "  network operations      <= {}", self.net_ops)?;
        writeln!(f, "  bytes transmitted       <= {}", self.tx_bytes_per_node)?;
        writeln!(f, "whole network (packet and all descendants):")?;
        writeln!(f, "  transmissions           <= {}", self.network_transmissions)?;
        write!(f, "  bytes transmitted       <= {}", self.network_bytes)
    }
}
