//! FLAME's module ABI and its four monitoring applications (FLAME §3.1),
//! `no_std` and allocation-free.
//!
//! Layer: below the monitor host (`anode-monitor`) and below the wasm modules
//! in `modules/`. The same code runs three ways: inside the sandboxed modules
//! (built for `wasm32-unknown-unknown` with `anode-sdk`), natively in the
//! benchmark that measures what the sandbox and policy cost, and in the
//! host, which writes views with [`abi::ViewWriter`] and decodes records with
//! [`abi::Record`].
//!
//! - [`abi`]: the policy view a module receives for each packet (a fixed
//!   96-byte header of named fields with a presence mask, then the granted
//!   payload bytes), the table of fields, and the export records modules emit
//!   (one table of elements drives names, JSON keys and IPFIX information
//!   elements).
//! - [`trajectory`]: trajectory sampling (Duffield and Grossglauser): a hash
//!   over the invariant part of a packet decides sampling, a second hash
//!   labels the flow.
//! - [`rtt`]: TCP round-trip time from the SYN and the ACK that completes the
//!   handshake, in a bounded table with ageing.
//! - [`codered`]: Code Red I/II detection across segment boundaries and out of
//!   order segments, with bounded per-flow state.
//! - [`hurst`]: the real-time wavelet estimator of the Hurst parameter
//!   (Roughan, Veitch and Abry): counts per interval in the per-packet part,
//!   the wavelet pyramid and the estimate in the periodic part.
//!
//! Invariants: no function panics on any view bytes (every read is checked
//! and an absent field reads as zero); every table has a fixed capacity set
//! at compile time, so a module's memory does not grow with the traffic.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod abi;
pub mod codered;
pub mod hash;
pub mod hurst;
pub mod rtt;
pub mod trajectory;

/// Where an application puts what it finds.
pub trait Sink {
    /// An export record (bytes built with [`abi::RecordBuilder`]).
    fn record(&mut self, rec: &[u8]);
    /// Asks for the current packet (the one being handled) to be exported
    /// as a sampled packet, as the policy lets the module see it.
    fn sample(&mut self);
}

/// A monitoring application: a per-packet part and a periodic part.
pub trait App {
    /// Handles one packet's view. Must be fast: it runs under the per-packet budget.
    fn packet(&mut self, view: &abi::View<'_>, sink: &mut dyn Sink);
    /// The periodic part, with the monitor's time (ns since the Unix epoch).
    fn tick(&mut self, now_ns: u64, sink: &mut dyn Sink);
}
