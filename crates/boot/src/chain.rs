//! The chain itself: components verified layer by layer, in order, from the
//! bytes the caller read, into a [`VerifiedChain`] that hands those same
//! bytes to the node ("verify the bytes you load, not a path").
//!
//! AEGIS's `LevelTransition` (SANE §4.1.1) verifies level *i + 1* and either
//! jumps to it or calls `Recover`. Here a layer's components are *settled*
//! (verified, recovered, or skipped by the operator's policy) before any
//! component of a later layer is accepted, so nothing of layer *i + 1* is
//! used on the strength of an unverified layer *i*.

use crate::layer::{ComponentName, Layer};
use crate::state::BootState;
use crate::verify::{ComponentError, Expected, Notice, RoleInfo, Trusted, sha256_hex};
use std::collections::BTreeMap;

/// The outcome for one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its bytes matched the metadata.
    Verified,
    /// The local copy failed; a copy from `source` matched the metadata.
    Recovered {
        /// Where the good copy came from.
        source: String,
        /// Why the local copy failed.
        local: ComponentError,
    },
    /// Failed and left out by a degraded start (non-essential layers only).
    Skipped {
        /// Why it failed.
        error: ComponentError,
        /// Why recovery did not help.
        recovery: String,
    },
    /// Failed; not (yet) recovered or skipped.
    Failed(ComponentError),
}

impl Verdict {
    /// Whether the component is settled (usable or deliberately left out).
    pub fn settled(&self) -> bool {
        !matches!(self, Verdict::Failed(_))
    }
    /// A short word for reports.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Verified => "verified",
            Verdict::Recovered { .. } => "recovered",
            Verdict::Skipped { .. } => "skipped",
            Verdict::Failed(_) => "FAILED",
        }
    }
}

/// One line of the chain's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentReport {
    /// The component.
    pub name: ComponentName,
    /// Signed length.
    pub length: u64,
    /// Signed SHA-256 (hex).
    pub sha256: String,
    /// The outcome.
    pub verdict: Verdict,
}

/// Misuse of the chain, or a chain that cannot be completed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A component was offered while an earlier layer is not settled.
    #[error("{name} offered before layer {pending} is settled (layers are verified in order)")]
    OutOfOrder {
        /// The component offered.
        name: String,
        /// The earliest unsettled layer.
        pending: Layer,
    },
    /// The component failed verification.
    #[error(transparent)]
    Component(#[from] ComponentError),
    /// A component of an essential layer cannot be skipped.
    #[error("{0} belongs to an essential layer and cannot be skipped")]
    Essential(String),
    /// Components were never settled.
    #[error("unsettled component(s): {0}")]
    Unsettled(String),
    /// The node asked for a component the chain does not hold (not signed: an extraneous dependency).
    #[error("{0} is not part of the verified chain")]
    NotInChain(String),
    /// The node asked for a component that a degraded start left out.
    #[error("{0} was left out by a degraded start")]
    Skipped(String),
}

/// Components being verified, layer by layer.
#[derive(Debug)]
pub struct ChainBuilder {
    trusted: Trusted,
    verdicts: BTreeMap<ComponentName, Verdict>,
    bytes: BTreeMap<ComponentName, Vec<u8>>,
}

impl ChainBuilder {
    /// Starts a chain on verified metadata.
    pub fn new(trusted: Trusted) -> ChainBuilder {
        ChainBuilder { trusted, verdicts: BTreeMap::new(), bytes: BTreeMap::new() }
    }

    /// The metadata.
    pub fn trusted(&self) -> &Trusted {
        &self.trusted
    }

    /// The earliest layer with a component not settled.
    pub fn pending_layer(&self) -> Option<Layer> {
        self.trusted
            .components()
            .find(|e| !self.verdicts.get(&e.name).is_some_and(Verdict::settled))
            .map(|e| e.name.layer)
    }

    fn in_order(&self, name: &ComponentName) -> Result<(), ChainError> {
        match self.pending_layer() {
            Some(p) if p < name.layer => Err(ChainError::OutOfOrder { name: name.target(), pending: p }),
            _ => Ok(()),
        }
    }

    /// Offers the bytes read for `name`. They are kept if they verify;
    /// otherwise the component is marked failed (to be recovered or skipped).
    ///
    /// # Errors
    /// [`ChainError::OutOfOrder`], or the component's verification error.
    pub fn offer(&mut self, name: &ComponentName, bytes: Vec<u8>) -> Result<(), ChainError> {
        self.in_order(name)?;
        match self.trusted.check(name, &bytes) {
            Ok(()) => {
                self.verdicts.insert(name.clone(), Verdict::Verified);
                self.bytes.insert(name.clone(), bytes);
                Ok(())
            }
            Err(e) => {
                if self.trusted.expected(name).is_some() {
                    self.verdicts.insert(name.clone(), Verdict::Failed(e.clone()));
                }
                Err(e.into())
            }
        }
    }

    /// Records that `name` could not be read at all.
    pub fn unreadable(&mut self, name: &ComponentName, reason: &str) -> ComponentError {
        let e = ComponentError::Unreadable { name: name.target(), reason: reason.to_string() };
        if self.trusted.expected(name).is_some() {
            self.verdicts.insert(name.clone(), Verdict::Failed(e.clone()));
        }
        e
    }

    /// Offers a copy recovered from `source` for a component that failed.
    /// Kept only if it verifies; the local failure stays on record.
    ///
    /// # Errors
    /// [`ChainError::OutOfOrder`], or the copy's verification error (the
    /// component stays failed).
    pub fn offer_recovered(&mut self, name: &ComponentName, bytes: Vec<u8>, source: &str) -> Result<(), ChainError> {
        self.in_order(name)?;
        self.trusted.check(name, &bytes)?;
        let local = match self.verdicts.get(name) {
            Some(Verdict::Failed(e)) => e.clone(),
            _ => ComponentError::Unreadable { name: name.target(), reason: "not read".into() },
        };
        self.verdicts.insert(name.clone(), Verdict::Recovered { source: source.to_string(), local });
        self.bytes.insert(name.clone(), bytes);
        Ok(())
    }

    /// Leaves out a failed component of a non-essential layer (a degraded start).
    ///
    /// # Errors
    /// [`ChainError::Essential`] for binary, config and keys components;
    /// [`ChainError::NotInChain`] for a name the metadata does not list.
    pub fn skip(&mut self, name: &ComponentName, recovery: &str) -> Result<(), ChainError> {
        if self.trusted.expected(name).is_none() {
            return Err(ChainError::NotInChain(name.target()));
        }
        if name.layer.essential() {
            return Err(ChainError::Essential(name.target()));
        }
        let error = match self.verdicts.get(name) {
            Some(Verdict::Failed(e)) => e.clone(),
            _ => ComponentError::Unreadable { name: name.target(), reason: "not read".into() },
        };
        self.verdicts.insert(name.clone(), Verdict::Skipped { error, recovery: recovery.to_string() });
        Ok(())
    }

    /// The verdict so far for `name`.
    pub fn verdict(&self, name: &ComponentName) -> Option<&Verdict> {
        self.verdicts.get(name)
    }

    /// The report so far, in layer order (components not offered yet show as failed "not read").
    pub fn report(&self) -> Vec<ComponentReport> {
        self.trusted.components().map(|e| self.line(e)).collect()
    }

    fn line(&self, e: &Expected) -> ComponentReport {
        let verdict = self.verdicts.get(&e.name).cloned().unwrap_or_else(|| {
            Verdict::Failed(ComponentError::Unreadable { name: e.name.target(), reason: "not read".into() })
        });
        ComponentReport { name: e.name.clone(), length: e.length, sha256: sha256_hex(&e.sha256), verdict }
    }

    /// The verified chain, once every component is settled.
    ///
    /// # Errors
    /// [`ChainError::Unsettled`] naming the components that are not.
    pub fn finish(self) -> Result<VerifiedChain, ChainError> {
        let report = self.report();
        let unsettled: Vec<String> = report.iter().filter(|r| !r.verdict.settled()).map(|r| r.name.target()).collect();
        if !unsettled.is_empty() {
            return Err(ChainError::Unsettled(unsettled.join(", ")));
        }
        Ok(VerifiedChain {
            node: self.trusted.node().to_string(),
            bytes: self.bytes,
            report,
            roles: self.trusted.roles().to_vec(),
            notices: self.trusted.notices().to_vec(),
            state: self.trusted.new_state().clone(),
        })
    }
}

/// A verified chain: the exact bytes of every component that verified, for
/// the node to use instead of reading the files again.
#[derive(Debug, Clone)]
pub struct VerifiedChain {
    node: String,
    bytes: BTreeMap<ComponentName, Vec<u8>>,
    report: Vec<ComponentReport>,
    roles: Vec<RoleInfo>,
    notices: Vec<Notice>,
    state: BootState,
}

impl VerifiedChain {
    /// The node.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The verified bytes of `file` in `layer`.
    ///
    /// # Errors
    /// [`ChainError::Skipped`] if a degraded start left it out;
    /// [`ChainError::NotInChain`] if the metadata never listed it (the node
    /// must not use it: it is unsigned).
    pub fn get(&self, layer: Layer, file: &str) -> Result<&[u8], ChainError> {
        let name = ComponentName { node: self.node.clone(), layer, file: file.to_string() };
        self.get_name(&name)
    }

    /// The verified bytes of `name`.
    ///
    /// # Errors
    /// As [`VerifiedChain::get`].
    pub fn get_name(&self, name: &ComponentName) -> Result<&[u8], ChainError> {
        if let Some(b) = self.bytes.get(name) {
            return Ok(b);
        }
        if self.report.iter().any(|r| r.name == *name) {
            return Err(ChainError::Skipped(name.target()));
        }
        Err(ChainError::NotInChain(name.target()))
    }

    /// The verified bytes of `file` in whichever layer lists it (the first in
    /// layer order).
    ///
    /// # Errors
    /// As [`VerifiedChain::get`].
    pub fn find(&self, file: &str) -> Result<(Layer, &[u8]), ChainError> {
        let mut skipped = None;
        for l in Layer::ALL {
            match self.get(l, file) {
                Ok(b) => return Ok((l, b)),
                Err(e @ ChainError::Skipped(_)) => skipped = skipped.or(Some(e)),
                Err(_) => {}
            }
        }
        Err(skipped.unwrap_or_else(|| ChainError::NotInChain(format!("{}/*/{file}", self.node))))
    }

    /// The report: every component in layer order with its verdict.
    pub fn report(&self) -> &[ComponentReport] {
        &self.report
    }

    /// Versions and expiry of the metadata it was verified against.
    pub fn roles(&self) -> &[RoleInfo] {
        &self.roles
    }

    /// Notices from the metadata verification.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// The state to persist now that the chain is complete (rollback
    /// protection for the next boot).
    pub fn state(&self) -> &BootState {
        &self.state
    }

    /// Whether a degraded start left anything out.
    pub fn degraded(&self) -> bool {
        self.report.iter().any(|r| matches!(r.verdict, Verdict::Skipped { .. }))
    }
}
