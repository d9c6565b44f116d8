//! RCANE resource control for anode, sans-I/O (RCANE §IV-B, §IV-C, §IV-E).
//!
//! Layering, bottom up:
//! - [`handle`]: generational slots; session, VP and pool handles.
//! - [`scheduler`]: virtual processors under EDF with slack sharing, driven
//!   by `pick(now)` / `charge(dispatch, used, now)`; per-period records.
//! - [`pool`]: bounded event queues bound to one VP.
//! - [`admission`]: node capacity, credential ceilings, reservation requests
//!   and their typed refusals.
//! - [`limiter`]: per-principal rate limiting of session requests.
//! - [`account`]: principals, per-session accounts, charges, close reasons.
//! - [`rcane`]: [`Rcane`], sessions over all of the above: the
//!   principal-facing requests (checked against the authenticated principal)
//!   and the daemon's trusted calls.
//! - [`trace`]: the per-period CPU trace (CSV) of the Fig. 11 experiment
//!   and its statistics, shared by the node, the Linux baselines and the plot.
//! - [`tx`]: transmit scheduling per outgoing link: guaranteed slices of
//!   link time per period, best effort for the rest, paced to the link rate.
//! - [`wire`]: the session control messages (open, reserve, close, list,
//!   show and their replies), a checked view and a `Repr`.
//!
//! The daemon owns the clock (monotonic ns), the thread CPU clock that
//! measures what a dispatch used, the threads and the ledger file; this
//! crate owns the decisions.
//!
//! # Invariants
//! - Guaranteed CPU shares (System and Best-Effort included) never exceed the
//!   configured capacity, and no session exceeds its credential's ceilings;
//!   a request is granted whole or not at all.
//! - With total guaranteed utilisation ≤ 1, every runnable VP receives its
//!   slice in every period, less what it overran in earlier periods (EDF
//!   with the constant-bandwidth-server wake rule), provided the caller
//!   comes back within each dispatch's budget (up to its preemption grain).
//! - A VP without `extra` never receives slack.
//! - A handle grants nothing by itself: principal-facing calls check that
//!   the session belongs to the authenticated principal and that every VP
//!   and pool named belongs to that session; stale and fabricated handles
//!   are refused with typed errors.
//! - Every queue is bounded (pools, period log, undrained records), and
//!   overflow is counted.
//! - Untrusted bytes ([`wire`]) never cause a panic.
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod account;
pub mod admission;
pub mod fuzzing;
pub mod handle;
pub mod limiter;
pub mod pool;
pub mod rcane;
pub mod scheduler;
pub mod trace;
pub mod tx;
pub mod wire;

pub use account::{Account, Charge, CloseReason, Owner, PrincipalId, ResourceKind, SessionEvent};
pub use admission::{AdmissionError, Capacity, Ceilings, Limit, ReserveRequest, Resource, VpOp};
pub use handle::{PoolId, SessionId, VpId};
pub use limiter::{ByteBucket, ByteBuckets, RateLimited, RequestLimiter};
pub use pool::{Pool, PoolSpec, PoolStats};
pub use rcane::{
    ClosedSession, ConfigError, Granted, HandleError, PoolInfo, PostRefusal, PostRefused, Rcane, RcaneConfig,
    RcaneError, SessionInfo,
};
pub use scheduler::{
    Charged, Dispatch, DispatchKind, ParseVpError, PeriodRecord, SchedConfig, SchedError, Scheduler, VpInfo, VpParams,
    VpTotals, parse_span_ns,
};
pub use tx::{Guarantee, LinkSched, LinkStats, Released, TxConfig, TxError};
