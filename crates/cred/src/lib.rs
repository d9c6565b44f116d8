//! Credentials and naming for switchlets (SANE §4.3, §4.8, §4.9).
//!
//! - [`naming`]: the three ways to name a module (hash of code; programmer key +
//!   name + version, with the programmer's Ed25519 signature carried in the
//!   code; loading principal + name) and version preference lists.
//! - [`credential`]: Biscuit tokens rooted in the node administrator's key.
//!   An administrative credential loads anything; an ordinary one names the
//!   modules, interfaces and limits it allows. Holders attenuate, never widen.
//!   The [`Verifier`] decides each load once, logs and counts every decision.
//! - [`interface`]: the Core's host interfaces, each a separately grantable right.
//! - [`session`]: session credentials, the most a principal may reserve on a
//!   node (RCANE sessions), decided by [`Verifier::authorize_session`].
//! - [`channel`]: the traffic a module credential lets its modules open
//!   receive channels for (`channel("<ports>", "<source>")` facts).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod channel;
pub mod credential;
pub mod fuzzing;
pub mod interface;
pub mod naming;
pub mod session;

pub use biscuit_auth::PublicKey as RootKey;
pub use channel::{ChannelAuthority, ChannelGrant, ChannelGrantError};
pub use credential::{
    Attenuation, AuthCounters, CredError, Credential, Grant, GrantSpec, Issuer, Limits, LoadRequest, ModuleGrant,
    RequestedLimits, Verifier, VerifierConfig,
};
pub use ed25519_dalek::SigningKey;
pub use interface::{Interface, InterfaceSet};
pub use naming::{CodeInfo, ModuleHash, ModuleName, NameError, NameRequest, PrincipalId, SignedName, sign_module};
pub use session::{
    AMOUNTS, Bound, SessionAttenuation, SessionCeilings, SessionGrant, SessionRequest, SessionSpec, check_bound,
    check_expiry,
};

/// The credential root for an administrator's raw Ed25519 public key (as
/// in a node config's `[modules] admin_key`).
pub fn root_key_from_ed25519(bytes: &[u8; 32]) -> Result<RootKey, CredError> {
    RootKey::from_bytes(bytes, biscuit_auth::builder::Algorithm::Ed25519).map_err(|e| CredError::Build(e.to_string()))
}
