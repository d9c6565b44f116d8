//! The anode node.
//!
//! - [`anep`]: the Active Network Encapsulation Protocol header that starts
//!   every datagram between nodes, and the type ids anode uses.
//! - [`plain`]: the plain (no VM) forwarding header, the baseline router.
//! - [`config`]: node configuration and shared topology files.
//! - [`counters`]: counters for `anode status` and Prometheus.
//! - [`secure`]: SANE between nodes: handshakes, and every datagram
//!   authenticated (and encrypted by policy) hop by hop.
//! - [`core`]: the sans-I/O node: datagrams in, transmissions and deliveries
//!   out. Multi-node behaviour is tested in one process through it.
//! - [`local`]: the message format of the local application API.
//! - [`fuzzing`]: entry points for the cargo-fuzz targets under `fuzz/`.
//! - [`daemon`]: the UDP daemon around the core (`anode node`): sockets,
//!   batching, the local application and control sockets, metrics.
//! - [`client`]: a blocking client for that API, used by `anode ping` and friends.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod anep;
pub mod client;
pub mod config;
pub mod core;
pub mod counters;
pub mod daemon;
pub mod fuzzing;
pub mod local;
pub mod plain;
pub mod secure;
pub mod switchlets;
