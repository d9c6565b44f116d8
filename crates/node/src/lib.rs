//! The anode node.
//!
//! - [`anep`]: the Active Network Encapsulation Protocol header that starts
//!   every datagram between nodes, and the type ids anode uses.
//! - [`plain`]: the plain (no VM) forwarding header, the baseline router.
//! - [`config`]: node configuration and shared topology files.
//! - [`counters`]: counters for `anode status` and Prometheus.
//! - [`core`]: the sans-I/O node: datagrams in, transmissions and deliveries
//!   out. Multi-node behaviour is tested in one process through it.
//! - [`local`]: the message format of the local application API.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod anep;
pub mod config;
pub mod core;
pub mod counters;
pub mod local;
pub mod plain;
