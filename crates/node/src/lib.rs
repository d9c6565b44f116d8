//! The anode node, without I/O: datagrams and `now` in, transmissions,
//! deliveries and log events out.
//!
//! ```text
//! datagram ─► outer ANEP check ─► security (verify, open) ─► inner ANEP check ─► classify
//!   SNAP ─► structural check ─► VM in place ─► forward │ children │ deliver │ drop(reason)
//!   plain ─► header check ─► ttl, route ─► forward │ deliver │ drop(reason)
//!   capsule ─► sandbox (in the sender's principal) ─► transmissions │ deliveries
//!   control ─► the control plane (module loads) ─► a typed reply
//!   unknown ─► pass on (flag clear, default route) │ drop
//! every transmission ─► sealed for the next hop ─► the caller's sockets
//! ```
//!
//! - [`config`]: node configuration and shared topology files, parsed from
//!   text (the daemon reads the files).
//! - [`core`]: the [`Node`](core::Node): classification, the data and control
//!   planes, owned transmissions, timers (`poll_at`, `handle_timeout`).
//! - [`counters`]: counters for `anode status` and Prometheus.
//! - [`secure`]: SANE between nodes: handshakes, and every datagram
//!   authenticated (and encrypted by policy) hop by hop.
//! - [`switchlets`]: the embedded sandbox for modules and capsules.
//! - [`fuzzing`]: entry points for the cargo-fuzz targets under `fuzz/`.
//!
//! # Layer and invariants
//!
//! This crate owns no sockets, threads, clocks or files: time is passed in
//! (`now_ms`), and everything the node decides lands in an
//! [`Outbox`](core::Outbox). So many nodes run in one process in tests
//! (`tests/inprocess.rs`, `tests/secure.rs`), deterministically.
//!
//! - **One check per header.** Each header of a datagram is checked once,
//!   where it is first read, and the checked view is handed down: the outer
//!   ANEP header, the security header, the inner ANEP header, then the SNAP,
//!   plain or capsule header. The SNAP VM executes the header the node
//!   checked and does not check it again (`docs/node.md` §1).
//! - **Every transmission, delivery and execution has an owner** (an
//!   [`Owner`](core::Owner)): Best-Effort for SNAP and plain packets, the
//!   module's principal for capsules and module sends, System for
//!   handshakes and control. Nothing is sent that nobody is charged for.
//! - **No allocation per forwarded packet** in the steady state: packets
//!   forwarded in place are transmitted from the receive buffer; what must
//!   be built goes to the outbox's reused arena.
//! - **Bad input is counted and dropped**, by reason; it never panics.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod core;
pub mod counters;
pub mod fuzzing;
pub mod secure;
pub mod switchlets;

pub use anode_wire::{anep, control, local, plain};

/// A hash map for the per-packet tables whose keys the node chose itself
/// (configured neighbours and routes): foldhash, seeded per process,
/// instead of SipHash, which took 4-8 % of a forwarding node's CPU. Tables
/// that a remote party can fill (handshake sources) keep SipHash.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
