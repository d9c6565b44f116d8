//! The boot procedure: metadata, then every layer in order, with recovery
//! and the operator's policy. The procedure owns no file, socket or clock:
//! it reads and writes through a [`BootIo`] and talks to repositories
//! through [`Source`]s, so every path through it runs in memory in tests.
//!
//! ```text
//! state.json ─► verify metadata ──fail──► policy refuse? ─► BootError
//!                    │                     └► fetch metadata from sources, verify, store
//!                    ▼
//!   for each layer in order, for each component of this node:
//!     read bytes (≤ signed length + 1) ─► verify ──fail──► policy refuse? ─► BootError
//!                    │                                 └► fetch, verify, store
//!                    │                                     └─gave up─► degraded & not essential? skip : BootError
//!                    ▼
//!   VerifiedChain (the bytes) ─► record the new state.json (only now)
//! ```
//!
//! Every step is a [`BootEvent`], logged with `tracing` as it happens and
//! returned to the caller.

use crate::chain::{ChainBuilder, ChainError, VerifiedChain};
use crate::layer::{ComponentName, Layer};
use crate::recovery::{Bound, ErrorCode, Fetch, FetchError, FetchEvent, FetchLimits, Step};
use crate::state::{BootState, StateError};
use crate::verify::{ComponentError, Limits, MetadataError, MetadataInput, Notice, Trusted, verify_metadata};
use serde::Deserialize;
use std::time::SystemTime;
use tracing::{info, warn};

/// The metadata files of a boot directory.
pub const ROOT: &str = "root.json";
/// Timestamp metadata file.
pub const TIMESTAMP: &str = "timestamp.json";
/// Snapshot metadata file.
pub const SNAPSHOT: &str = "snapshot.json";
/// Targets metadata file.
pub const TARGETS: &str = "targets.json";
/// The node's state file.
pub const STATE: &str = "state.json";

/// What the node does when a component fails verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Refuse to start (the default).
    #[default]
    Refuse,
    /// Recover from the configured repositories; refuse to start if that fails.
    Recover,
    /// Recover; if that fails, start without the component when its layer
    /// is not essential (switchlets, monitor), else refuse.
    Degraded,
}

impl Policy {
    /// Parses `refuse`, `recover` or `degraded`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "refuse" => Some(Policy::Refuse),
            "recover" => Some(Policy::Recover),
            "degraded" => Some(Policy::Degraded),
            _ => None,
        }
    }
    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Refuse => "refuse",
            Policy::Recover => "recover",
            Policy::Degraded => "degraded",
        }
    }
}

/// Settings of one boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootParams {
    /// This node's name in the targets metadata.
    pub node: String,
    /// What to do on a failure.
    pub policy: Policy,
    /// Size bounds.
    pub limits: Limits,
    /// Recovery timeouts and attempts.
    pub fetch: FetchLimits,
    /// Store recovered copies and record the new state (the daemon: yes;
    /// `anode boot verify`: only with `--repair`).
    pub commit: bool,
}

/// Reading and writing the node's files; implemented by the driver.
pub trait BootIo {
    /// Reads a file of the boot directory, at most `max` + 1 bytes;
    /// `Ok(None)` if it does not exist.
    fn read_boot_file(&mut self, file: &str, max: usize) -> Result<Option<Vec<u8>>, String>;
    /// Replaces a file of the boot directory (atomically).
    fn write_boot_file(&mut self, file: &str, bytes: &[u8]) -> Result<(), String>;
    /// Reads a component, at most `max` bytes.
    fn read_component(&mut self, name: &ComponentName, max: u64) -> Result<Vec<u8>, String>;
    /// Replaces a component's file with a verified copy (atomically).
    fn write_component(&mut self, name: &ComponentName, bytes: &[u8]) -> Result<(), String>;
    /// A monotonic clock in milliseconds (recovery timeouts).
    fn now_ms(&mut self) -> u64;
    /// Waits until the monotonic clock reaches `ms`.
    fn wait_until(&mut self, ms: u64);
}

/// A repository to recover from: a local mirror, or a peer node over its
/// security association.
pub trait Source {
    /// A name for logs and reports.
    fn name(&self) -> String;
    /// Delivers one recovery request and returns the reply, if one came
    /// before the source's own wait ended (`None`: nothing yet).
    fn exchange(&mut self, request: &[u8]) -> Option<Vec<u8>>;
}

/// One step of the boot, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BootEvent {
    /// No state file: first boot, trust on first use of the root anchor.
    FirstBoot,
    /// The state file was unreadable and ignored (policy recover/degraded).
    StateIgnored(StateError),
    /// The metadata verified.
    MetadataVerified {
        /// Root, timestamp, snapshot and targets versions.
        versions: [u32; 4],
    },
    /// A notice from the metadata verification.
    Notice(Notice),
    /// The local metadata was refused.
    MetadataRefused(MetadataError),
    /// Metadata from a source was refused.
    MetadataSourceRefused {
        /// The source.
        source: String,
        /// Why.
        reason: String,
    },
    /// Good metadata was recovered from a source.
    MetadataRecovered {
        /// The source.
        source: String,
    },
    /// A component verified.
    Verified(String),
    /// A component failed verification.
    Failed {
        /// The component.
        name: String,
        /// Why.
        error: ComponentError,
    },
    /// A step of a recovery fetch.
    Fetch {
        /// The resource.
        name: String,
        /// The source, when known.
        source: Option<String>,
        /// The step.
        event: FetchEvent,
    },
    /// A component was recovered.
    Recovered {
        /// The component.
        name: String,
        /// From.
        source: String,
    },
    /// A verified copy was written to disk.
    Stored(String),
    /// Writing a verified copy failed (the node goes on with the verified bytes in memory).
    StoreFailed {
        /// The file.
        name: String,
        /// Why.
        reason: String,
    },
    /// A component was left out (degraded start).
    Skipped {
        /// The component.
        name: String,
        /// Why.
        reason: String,
    },
    /// The new state was recorded.
    StateRecorded([u32; 4]),
}

/// Why the node must not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BootError {
    /// The root anchor is missing.
    #[error("no {ROOT} in the boot directory: install the operator's root metadata (anode boot sign --install)")]
    NoRoot,
    /// A boot file could not be read or written.
    #[error("{file}: {reason}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// The state file is unreadable (policy refuse).
    #[error("{STATE}: {0}")]
    State(StateError),
    /// The metadata failed and the policy is refuse.
    #[error("metadata refused (policy refuse): {0}")]
    Metadata(MetadataError),
    /// The metadata failed and no source had good metadata.
    #[error("metadata refused ({local}) and not recovered: {recovery}")]
    MetadataUnrecovered {
        /// The local failure.
        local: MetadataError,
        /// The last recovery failure.
        recovery: String,
    },
    /// A component failed and the policy is refuse.
    #[error("{error} (policy refuse)")]
    Component {
        /// Why.
        error: ComponentError,
    },
    /// A component failed and recovery failed.
    #[error("{error}; recovery failed: {recovery}")]
    Unrecovered {
        /// Why the local copy failed.
        error: ComponentError,
        /// Why recovery failed.
        recovery: FetchError,
    },
    /// The chain could not be completed.
    #[error(transparent)]
    Chain(#[from] ChainError),
}

/// A completed boot.
#[derive(Debug, Clone)]
pub struct BootOutcome {
    /// The verified chain: the node uses these bytes.
    pub chain: VerifiedChain,
    /// What happened, in order.
    pub events: Vec<BootEvent>,
}

/// The boot directory's root, root rotations, and timestamp, snapshot and
/// targets (each possibly missing).
type LocalMetadata = (Vec<u8>, Vec<Vec<u8>>, [Option<Vec<u8>>; 3]);

struct Run<'a> {
    io: &'a mut dyn BootIo,
    sources: &'a mut [Box<dyn Source>],
    p: &'a BootParams,
    events: Vec<BootEvent>,
    next_id: u32,
}

fn log(e: &BootEvent) {
    match e {
        BootEvent::Verified(n) => info!(component = %n, "boot: verified"),
        BootEvent::Recovered { name, source } => info!(component = %name, %source, "boot: recovered"),
        BootEvent::Stored(n) => info!(file = %n, "boot: stored verified copy"),
        BootEvent::MetadataVerified { versions } => info!(?versions, "boot: metadata verified"),
        BootEvent::MetadataRecovered { source } => info!(%source, "boot: metadata recovered"),
        BootEvent::StateRecorded(v) => info!(versions = ?v, "boot: state recorded"),
        BootEvent::FirstBoot => info!("boot: no state file, first boot"),
        BootEvent::Fetch { name, source, event } => info!(resource = %name, ?source, ?event, "boot: recovery"),
        other => warn!(event = ?other, "boot"),
    }
}

fn versions(s: &BootState) -> [u32; 4] {
    [s.root, s.timestamp, s.snapshot, s.targets]
}

impl Run<'_> {
    fn event(&mut self, e: BootEvent) {
        log(&e);
        self.events.push(e);
    }

    fn read(&mut self, file: &str, max: usize) -> Result<Option<Vec<u8>>, BootError> {
        self.io.read_boot_file(file, max).map_err(|reason| BootError::Io { file: file.into(), reason })
    }

    fn local_metadata(&mut self) -> Result<LocalMetadata, BootError> {
        let l = self.p.limits;
        let root = self.read(ROOT, l.root)?.ok_or(BootError::NoRoot)?;
        let mut updates = Vec::new();
        if let Some(v) = crate::sign::version_of(&root) {
            for n in v.saturating_add(1)..=v.saturating_add(l.root_updates as u32 + 1) {
                match self.read(&format!("{n}.root.json"), l.root)? {
                    Some(b) => updates.push(b),
                    None => break,
                }
            }
        }
        let ts = self.read(TIMESTAMP, l.timestamp)?;
        let snap = self.read(SNAPSHOT, l.snapshot)?;
        let targets = self.read(TARGETS, l.targets)?;
        Ok((root, updates, [ts, snap, targets]))
    }

    /// Runs one fetch to completion against the given sources (indices into
    /// `self.sources`), verifying each complete copy with `check`.
    fn fetch(
        &mut self,
        name: &str,
        bound: Bound,
        sources: &[usize],
        limits: FetchLimits,
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(usize, Vec<u8>), FetchError> {
        let now = self.io.now_ms();
        let mut f = Fetch::new(name, bound, sources.len(), limits, self.next_id, now)?;
        self.next_id = self.next_id.wrapping_add(limits.max_attempts.saturating_mul(1 << 16));
        let mut step = f.poll(now);
        let result = loop {
            self.fetch_events(&mut f, sources);
            match step {
                Some(Step::Send { source, msg }) => {
                    let s = sources.get(source).copied().unwrap_or(0);
                    let reply = self.sources.get_mut(s).and_then(|src| src.exchange(&msg));
                    let now = self.io.now_ms();
                    step = match reply {
                        Some(r) => f.handle(source, &r, now).unwrap_or(None),
                        None => None,
                    };
                    if step.is_none() {
                        step = f.poll(now);
                    }
                }
                Some(Step::Complete { source, bytes }) => match check(&bytes) {
                    Ok(()) => {
                        f.accept();
                        break Ok((sources.get(source).copied().unwrap_or(0), bytes));
                    }
                    Err(reason) => step = f.reject(&reason, self.io.now_ms()),
                },
                Some(Step::GaveUp(e)) => break Err(e),
                None => {
                    if let Some(t) = f.next_timer() {
                        self.io.wait_until(t);
                    }
                    step = f.poll(self.io.now_ms());
                }
            }
        };
        self.fetch_events(&mut f, sources);
        result
    }

    fn fetch_events(&mut self, f: &mut Fetch, sources: &[usize]) {
        for event in f.events() {
            let src = match &event {
                FetchEvent::Attempt { source, .. }
                | FetchEvent::Received { source, .. }
                | FetchEvent::Accepted { source } => Some(*source),
                _ => None,
            };
            let source = src.and_then(|i| sources.get(i)).and_then(|&s| self.sources.get(s)).map(|s| s.name());
            self.event(BootEvent::Fetch { name: f.name().to_string(), source, event });
        }
    }

    fn source_name(&self, i: usize) -> String {
        self.sources.get(i).map(|s| s.name()).unwrap_or_default()
    }

    fn metadata(&mut self, prior: Option<&BootState>, now: SystemTime) -> Result<Trusted, BootError> {
        let (root, updates, [ts, snap, targets]) = self.local_metadata()?;
        let local = match (&ts, &snap, &targets) {
            (Some(ts), Some(snap), Some(targets)) => {
                let input =
                    MetadataInput { root: &root, root_updates: &updates, timestamp: ts, snapshot: snap, targets };
                verify_metadata(&input, prior, &self.p.node, now, &self.p.limits)
            }
            _ => Err(MetadataError::Malformed {
                role: crate::verify::Role::Timestamp,
                reason: "timestamp, snapshot or targets metadata missing".into(),
            }),
        };
        let local = match local {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        self.event(BootEvent::MetadataRefused(local.clone()));
        if self.p.policy == Policy::Refuse {
            return Err(BootError::Metadata(local));
        }
        let mut last = "no recovery source is configured".to_string();
        let n = self.sources.len();
        for k in 0..(self.p.fetch.max_attempts as usize).max(1) {
            if n == 0 {
                break;
            }
            let i = k % n;
            match self.metadata_from(i, &root, prior, now) {
                Ok(t) => return Ok(t),
                Err(reason) => {
                    let source = self.source_name(i);
                    self.event(BootEvent::MetadataSourceRefused { source, reason: reason.clone() });
                    last = reason;
                }
            }
        }
        Err(BootError::MetadataUnrecovered { local, recovery: last })
    }

    fn metadata_from(
        &mut self,
        i: usize,
        root: &[u8],
        prior: Option<&BootState>,
        now: SystemTime,
    ) -> Result<Trusted, String> {
        let l = self.p.limits;
        let one = FetchLimits { max_attempts: 1, ..self.p.fetch };
        let get = |run: &mut Self, file: &str, max: usize| {
            run.fetch(&format!("metadata/{file}"), Bound::AtMost(max as u64), &[i], one, &mut |_| Ok(()))
                .map(|(_, b)| b)
        };
        let mut updates = Vec::new();
        if let Some(v) = crate::sign::version_of(root) {
            for n in v.saturating_add(1)..=v.saturating_add(l.root_updates as u32) {
                match get(self, &format!("{n}.root.json"), l.root) {
                    Ok(b) => updates.push((n, b)),
                    Err(FetchError::GaveUp { last, .. })
                        if matches!(*last, FetchError::Refused { code: ErrorCode::NotFound, .. }) =>
                    {
                        break;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        let ts = get(self, TIMESTAMP, l.timestamp).map_err(|e| e.to_string())?;
        let snap = get(self, SNAPSHOT, l.snapshot).map_err(|e| e.to_string())?;
        let targets = get(self, TARGETS, l.targets).map_err(|e| e.to_string())?;
        let raw_updates: Vec<Vec<u8>> = updates.iter().map(|(_, b)| b.clone()).collect();
        let input =
            MetadataInput { root, root_updates: &raw_updates, timestamp: &ts, snapshot: &snap, targets: &targets };
        let t = verify_metadata(&input, prior, &self.p.node, now, &self.p.limits).map_err(|e| e.to_string())?;
        let source = self.source_name(i);
        self.event(BootEvent::MetadataRecovered { source });
        if self.p.commit {
            let mut files: Vec<(String, &[u8])> =
                updates.iter().map(|(n, b)| (format!("{n}.root.json"), &b[..])).collect();
            files.extend([(TIMESTAMP.into(), &ts[..]), (SNAPSHOT.into(), &snap[..]), (TARGETS.into(), &targets[..])]);
            for (f, b) in files {
                match self.io.write_boot_file(&f, b) {
                    Ok(()) => self.event(BootEvent::Stored(f)),
                    Err(reason) => self.event(BootEvent::StoreFailed { name: f, reason }),
                }
            }
        }
        Ok(t)
    }

    fn component(&mut self, chain: &mut ChainBuilder, name: &ComponentName) -> Result<(), BootError> {
        let Some(e) = chain.trusted().expected(name).cloned() else { return Ok(()) };
        let error = match self.io.read_component(name, e.length.saturating_add(1)) {
            Ok(bytes) => match chain.offer(name, bytes) {
                Ok(()) => {
                    self.event(BootEvent::Verified(name.target()));
                    return Ok(());
                }
                Err(ChainError::Component(c)) => c,
                Err(other) => return Err(other.into()),
            },
            Err(reason) => chain.unreadable(name, &reason),
        };
        self.event(BootEvent::Failed { name: name.target(), error: error.clone() });
        if self.p.policy == Policy::Refuse {
            return Err(BootError::Component { error });
        }
        let recovery = if e.secret {
            Err(FetchError::Secret)
        } else {
            let all: Vec<usize> = (0..self.sources.len()).collect();
            let trusted = chain.trusted().clone();
            self.fetch(&name.target(), Bound::Exact(e.length), &all, self.p.fetch, &mut |b| {
                trusted.check(name, b).map_err(|e| e.to_string())
            })
        };
        match recovery {
            Ok((i, bytes)) => {
                let source = self.source_name(i);
                if self.p.commit {
                    match self.io.write_component(name, &bytes) {
                        Ok(()) => self.event(BootEvent::Stored(name.target())),
                        Err(reason) => self.event(BootEvent::StoreFailed { name: name.target(), reason }),
                    }
                }
                chain.offer_recovered(name, bytes, &source)?;
                self.event(BootEvent::Recovered { name: name.target(), source });
                Ok(())
            }
            Err(fe) => {
                if self.p.policy == Policy::Degraded && !name.layer.essential() {
                    chain.skip(name, &fe.to_string())?;
                    self.event(BootEvent::Skipped { name: name.target(), reason: fe.to_string() });
                    Ok(())
                } else {
                    Err(BootError::Unrecovered { error, recovery: fe })
                }
            }
        }
    }
}

/// Boots: verifies the metadata and every component of `params.node`, layer
/// by layer, recovering from `sources` and applying the policy. `now` is the
/// wall-clock time used for expiry.
///
/// # Errors
/// A [`BootError`]: the node must not start. Nothing was stored or
/// recorded for a boot that fails in verification; recovered copies that
/// verified were stored (they are good copies either way).
pub fn boot(
    io: &mut dyn BootIo,
    sources: &mut [Box<dyn Source>],
    params: &BootParams,
    now: SystemTime,
) -> Result<BootOutcome, BootError> {
    let (r, events) = boot_with_events(io, sources, params, now);
    r.map(|chain| BootOutcome { chain, events })
}

/// [`boot`], returning the events also when the boot fails (for reports
/// such as `anode boot verify`).
pub fn boot_with_events(
    io: &mut dyn BootIo,
    sources: &mut [Box<dyn Source>],
    params: &BootParams,
    now: SystemTime,
) -> (Result<VerifiedChain, BootError>, Vec<BootEvent>) {
    let mut run = Run { io, sources, p: params, events: Vec::new(), next_id: 1 };
    let r = run.boot(now);
    (r, run.events)
}

impl Run<'_> {
    fn boot(&mut self, now: SystemTime) -> Result<VerifiedChain, BootError> {
        let params = self.p;
        let prior = match self.read(STATE, crate::state::MAX_STATE)? {
            None => {
                self.event(BootEvent::FirstBoot);
                None
            }
            Some(b) => match BootState::parse(&b) {
                Ok(s) => Some(s),
                Err(e) if params.policy == Policy::Refuse => return Err(BootError::State(e)),
                Err(e) => {
                    self.event(BootEvent::StateIgnored(e));
                    None
                }
            },
        };
        let trusted = self.metadata(prior.as_ref(), now)?;
        for n in trusted.notices() {
            self.event(BootEvent::Notice(n.clone()));
        }
        self.event(BootEvent::MetadataVerified { versions: versions(trusted.new_state()) });
        let names: Vec<ComponentName> = trusted.components().map(|e| e.name.clone()).collect();
        let mut chain = ChainBuilder::new(trusted);
        for layer in Layer::ALL {
            for name in names.iter().filter(|n| n.layer == layer) {
                self.component(&mut chain, name)?;
            }
        }
        let chain = chain.finish()?;
        if params.commit {
            let v = versions(chain.state());
            self.io
                .write_boot_file(STATE, &chain.state().to_bytes())
                .map_err(|reason| BootError::Io { file: STATE.into(), reason })?;
            self.event(BootEvent::StateRecorded(v));
        }
        Ok(chain)
    }
}
