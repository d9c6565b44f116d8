//! anode's wire formats, as checked views over bytes and parsed
//! representations (smoltcp's `wire` module is the model).
//!
//! - [`anep`]: the Active Network Encapsulation Protocol header that starts
//!   every datagram between nodes, and the type ids anode uses.
//! - [`plain`]: the plain (no VM) forwarding header, the baseline router.
//! - [`frag`]: fragmentation and reassembly of datagrams longer than a
//!   link's MTU.
//! - [`control`]: control messages a user sends a node over its security
//!   association (module loads) and the node's typed replies.
//! - [`local`]: the messages of the local application API (`app.sock`).
//! - [`capture`]: `anode capture`'s request on the control socket and the
//!   framed stream of plaintext datagrams the node answers with.
//! - [`fuzzing`]: the entry point of the `wire_views` fuzz target.
//!
//! SNAP packets have their own view in `anode_snap::wire`, capsules in
//! `anode_sandbox::capsule`, handshake messages in `anode_sec::handshake`.
//!
//! # Layer and invariants
//!
//! This crate is the bottom layer: no I/O, no allocation in the views, no
//! dependencies but `thiserror`. Each format has a `Packet<T: AsRef<[u8]>>`
//! view with `new_checked`, which validates the bytes once; **after
//! `new_checked` succeeds no accessor of that view panics**, and the node
//! hands the checked view down instead of checking again. Setters live on
//! `impl<T: AsMut<[u8]>>`. A `Repr` is the parsed, owned form: `parse` from a
//! checked view (semantic checks), `emit` into a buffer of `buffer_len()`
//! bytes. Every rejection is a typed error variant, never a string.
//! The one stateful part, [`frag::Reassembler`], holds only bounded
//! buffers (per source and in total) and drops what it cannot finish.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod anep;
pub mod capture;
pub mod control;
pub mod frag;
pub mod fuzzing;
pub mod local;
pub mod plain;
