//! The verified boot chain of an anode node (AEGIS, SANE §4.1, with The
//! Update Framework's metadata) and its recovery protocol.
//!
//! # Layering
//!
//! - [`layer`]: the layers (binary, config, keys, switchlets, monitor) and
//!   component names `<node>/<layer>/<file>`.
//! - [`verify`]: TUF metadata (root, targets, snapshot, timestamp) verified
//!   from bytes at a given time, and components checked against it.
//! - [`chain`]: components settled layer by layer into a [`VerifiedChain`]
//!   that holds the verified bytes.
//! - [`recovery`]: the recovery protocol's wire format (checked views and
//!   `Repr`s), the requester's state machine ([`recovery::Fetch`]) and the
//!   responder ([`recovery::serve`]).
//! - [`boot`](mod@boot): the procedure that ties them together with the
//!   operator's [`Policy`], over the [`BootIo`] and [`Source`] traits.
//! - [`sign`]: the operator's side: making the metadata.
//! - [`state`]: the node's record of what it trusted last (rollback).
//! - [`fsio`]: the filesystem driver (boot directory, mirrors); the only
//!   module that touches files and clocks.
//! - [`fuzzing`]: entry points for the cargo-fuzz targets.
//!
//! Everything except [`fsio`] is sans-I/O: bytes and time in, verdicts and
//! messages out.
//!
//! # Invariants
//!
//! - A component is used only as the bytes that verified: the chain hands
//!   out those bytes, never a path to read again.
//! - A component of layer *i + 1* is accepted only once every component of
//!   layers ≤ *i* is settled (verified, recovered, or skipped by policy).
//! - Every input is bounded before it is parsed or hashed: metadata by
//!   role, components by their signed length, recovery by the signed length
//!   or a fixed bound, by per-request timeouts, attempt deadlines and an
//!   attempt limit.
//! - Nothing is recorded (the state file) until the whole chain verified;
//!   a recovered copy is stored only after it verified.
//! - The OS, firmware and boot loader below the node binary are out of
//!   scope: UEFI Secure Boot, measured boot and TPM PCRs cover them (see
//!   `docs/boot.md`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod boot;
pub mod chain;
pub mod fsio;
pub mod fuzzing;
pub mod layer;
pub mod recovery;
pub mod sign;
pub mod state;
pub mod verify;

pub use boot::{BootError, BootEvent, BootIo, BootOutcome, BootParams, Policy, Source};
pub use chain::{ChainBuilder, ChainError, ComponentReport, Verdict, VerifiedChain};
pub use layer::{ComponentName, Layer};
pub use state::BootState;
pub use verify::{ComponentError, Limits, MetadataError, MetadataInput, Trusted, verify_metadata};
