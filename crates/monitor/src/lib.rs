//! FLAME in anode: untrusted traffic monitoring under policy (FLAME §2–3).
//!
//! Layer: a sans-I/O library between capture sources and exporters. The
//! CLI (`anode monitor`) and the node's tap (`anode-node`'s `core::tap`,
//! the daemon's `tap`) own files, sockets, clocks and threads; everything
//! here takes frames and time as arguments and returns outputs.
//!
//! ```text
//! capture (pcap, pcapng, live, node tap) ─► parse (etherparse) ─► per module:
//!   filter ─► policy view (fields, payload cut, Crypto-PAn) ─► wasm module (fuel)
//!   ─► records (JSON lines, IPFIX) and sampled packets (pcap)
//! ```
//!
//! - [`capture`]: pcap/pcapng readers with bounded buffering; a pcap writer.
//! - [`parse`]: Ethernet, Linux SLL, IPv4, IPv6, TCP, UDP; skips counted by reason.
//! - [`policy`]: monitoring credentials (Biscuit, rooted in the
//!   administrator's key, attenuable only downwards) and the [`Policy`] they grant.
//! - [`cryptopan`]: prefix-preserving anonymization (Crypto-PAn).
//! - [`view`]: the policy compiled into a view builder.
//! - [`runtime`]: fuel- and memory-bounded wasm modules, the `mon` interface.
//! - [`monitor`]: the pipeline, overrun accounting, unloading.
//! - [`export`]: JSON lines and IPFIX encoders.
//!
//! # Invariants
//!
//! - A module never receives a byte of the packet except through the view
//!   its policy compiles to: forbidden fields are absent and zero, anonymized
//!   addresses are replaced before the module runs, the payload is cut to
//!   the grant ([`view`]).
//! - A module's call is bounded by fuel (budget × packets in the call) and
//!   its memory by a limiter; a trap or an overrun ends that call only, and
//!   the other modules and the monitor go on ([`monitor`]).
//! - Untrusted bytes (capture files, frames, credentials, module binaries,
//!   module records) get typed errors or counted skips, never a panic, and
//!   bounded memory.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;
pub mod cryptopan;
pub mod export;
pub mod fuzzing;
pub mod monitor;
pub mod parse;
pub mod policy;
pub mod runtime;
pub mod view;

pub use anode_monitor_apps as apps;
pub use capture::{CaptureError, CaptureReader, Frame, LinkType, PcapSink};
pub use cryptopan::{Anonymizer, CryptoPan};
pub use export::{IpfixEncoder, json_line};
pub use monitor::{ModuleCounters, ModuleId, ModuleInfo, Monitor, MonitorConfig, MonitorLoadError, Output};
pub use parse::{Packet, Skip};
pub use policy::{
    Clause, ExportRights, MonitorSpec, Narrowing, Policy, PolicyError, PolicyLimits, PolicyVerifier, Prefix,
};
