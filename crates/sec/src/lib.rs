//! SANE for anode: who a node talks to, and proof of it on every packet.
//!
//! - [`identity`]: Ed25519 identities, fingerprints, key files, and the
//!   binding of an identity to its Noise static key.
//! - [`cookie`]: cookie replies that stop XX first messages from forged
//!   sources being reflected (WireGuard's cookie, QUIC's Retry).
//! - [`handshake`]: framing of Noise IK and XX handshake messages (the key
//!   establishment protocol of SANE §4.4, with today's protocol).
//! - [`sa`]: security associations and the authentication header
//!   (SANE §4.5): AES-256-GCM per packet, authenticate-only or encrypted.
//! - [`replay`]: the anti-replay window (RFC 6479 style, 4032 packets).
//! - [`links`]: the sans-I/O security layer a node embeds: link keys with
//!   every configured neighbour at boot (§4.6), rekeying, topology freeze,
//!   handshake rate limits.
//! - [`domain`], [`ticket`]: administrative domains (SANE §4.7): a key
//!   distribution service issuing short-lived tickets, ticket-authenticated
//!   packets, perimeter attachments checked and enforced in the interior.
//! - [`fuzzing`]: entry points for the cargo-fuzz targets.
//!
//! The design and its threat model are in `docs/security.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cookie;
pub mod domain;
pub mod fuzzing;
pub mod handshake;
pub mod identity;
pub mod links;
pub mod replay;
pub mod sa;
pub mod ticket;

pub use domain::{Accepted, DomainError, DomainKey, DomainNode, Kdc, KdcConfig, Revocation, TicketHolder};
pub use identity::{Fingerprint, Identity, KeyError, PublicKey};
pub use links::{HsReject, Links, LinksConfig, Opened, Output, PeerConfig, PeerKind, PeerStatus, RateLimit};
pub use sa::{Lifetime, Mode, Reject, SealError};
