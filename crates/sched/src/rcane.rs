//! Sessions, reservations, pools and accounting over the [`Scheduler`]: the
//! part of RCANE's Core that a principal talks to (RCANE §IV-B.2, §IV-C).
//!
//! Two kinds of callers, two kinds of methods:
//! - **Principal-facing** methods ([`Rcane::open_session`], [`Rcane::reserve`],
//!   [`Rcane::close_session`], [`Rcane::open_pool`], [`Rcane::list`], ...)
//!   take the [`PrincipalId`] that the caller's security association
//!   authenticated, and check that every session, VP and pool handle the
//!   request names belongs to a session of that principal. A handle is
//!   only a name; authority is the pair (authenticated principal, owned
//!   session). System and Best-Effort belong to no principal, so no request
//!   can touch them.
//! - **Trusted** methods ([`Rcane::pick`], [`Rcane::charge`], [`Rcane::post`],
//!   [`Rcane::charge_tx`], ...) are for the daemon itself; they check that
//!   handles are live, not who owns them.
//!
//! # Invariants
//! - The guaranteed CPU shares of all VPs (System and Best-Effort included)
//!   never exceed [`Capacity::cpu_ppm`]; nor do heap, transmit and receive
//!   reservations their capacities (a session may always shrink).
//! - No session holds more than its credential's [`Ceilings`].
//! - A request is applied whole or not at all.
//! - A VP is runnable exactly while one of its pools has a backlog or the
//!   daemon marked it busy; a pool's events are handed out only to the VP
//!   that the last [`Rcane::pick`] dispatched.
//! - Every CPU ns charged, packet, byte, load and heap byte-second lands in
//!   exactly one session's [`Account`], and [`Rcane::drain_charges`]
//!   returns each exactly once, also after the session closed.

use crate::account::{Account, Charge, CloseReason, KINDS, Owner, PrincipalId, ResourceKind, SessionEvent};
use crate::admission::{AdmissionError, Capacity, Ceilings, Limit, ReserveRequest, Resource, VpOp, check};
use crate::handle::{Lookup, PoolId, SessionId, Slab, VpId};
use crate::pool::{Pool, PoolSpec, PoolStats};
use crate::scheduler::{
    Charged, Dispatch, DispatchKind, MAX_PERIOD_NS, SchedConfig, SchedError, Scheduler, VpInfo, VpParams,
};
use std::collections::VecDeque;

/// What is wrong with a handle a request named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    /// No such object was ever created.
    Unknown,
    /// It was closed (and its slot may name another object now).
    Stale,
    /// It exists but belongs to another session or principal.
    NotYours,
}

impl core::fmt::Display for HandleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            HandleError::Unknown => "unknown",
            HandleError::Stale => "stale (closed)",
            HandleError::NotYours => "not yours",
        })
    }
}

fn from_lookup(l: Lookup) -> HandleError {
    match l {
        Lookup::Unknown => HandleError::Unknown,
        Lookup::Stale => HandleError::Stale,
    }
}

/// An error of a session request or a trusted call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RcaneError {
    /// The session handle is unknown, stale or another principal's.
    #[error("session {0}: {1}")]
    Session(SessionId, HandleError),
    /// The VP handle is unknown, stale or another session's.
    #[error("VP {0}: {1}")]
    Vp(VpId, HandleError),
    /// The pool handle is unknown, stale or another session's.
    #[error("pool {0}: {1}")]
    Pool(PoolId, HandleError),
    /// The reservation was refused.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The node has as many sessions as it allows.
    #[error("the node allows {limit} sessions")]
    TooManySessions {
        /// The limit.
        limit: u32,
    },
    /// This principal has as many sessions as the node allows one principal.
    #[error("the node allows {limit} sessions per principal")]
    TooManySessionsForPrincipal {
        /// The limit.
        limit: u32,
    },
    /// The request has more VP operations than the node accepts at once.
    #[error("{ops} VP operations in one request, at most {max}")]
    TooManyOps {
        /// Operations asked.
        ops: usize,
        /// The limit.
        max: usize,
    },
    /// The request changes or removes the same VP twice.
    #[error("VP {0} named twice in one request")]
    DuplicateVp(VpId),
    /// The session's credential has expired (the session is now closed).
    #[error("the session's credential has expired")]
    CredentialExpired,
    /// A pool's bounds are zero.
    #[error("a pool needs max_queued and max_in_progress of at least 1")]
    BadPool,
    /// Events of a pool were asked for by a VP that does not hold the CPU.
    #[error("pool {pool} belongs to VP {pool_vp}, which does not hold the CPU")]
    NotHoldingCpu {
        /// The pool.
        pool: PoolId,
        /// Its VP.
        pool_vp: VpId,
    },
    /// System and Best-Effort cannot be closed or changed by requests.
    #[error("the System and Best-Effort sessions cannot be closed")]
    Builtin,
    /// The scheduler refused (a VP slot limit was reached).
    #[error(transparent)]
    Sched(#[from] SchedError),
}

/// Why an event was not queued; the event comes back with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostRefused<E> {
    /// The event, given back.
    pub event: E,
    /// Why.
    pub reason: PostRefusal,
}

/// The reason a [`PostRefused`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostRefusal {
    /// The pool's queue is full (counted in its [`PoolStats::refused`]).
    Full,
    /// The pool handle is unknown or stale.
    Pool(HandleError),
}

/// A problem with an [`RcaneConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// System and Best-Effort guarantees exceed the CPU capacity.
    #[error("System ({system} ppm) and Best-Effort ({best_effort} ppm) exceed the capacity of {capacity} ppm")]
    BuiltinsExceedCapacity {
        /// System's share.
        system: u64,
        /// Best-Effort's share.
        best_effort: u64,
        /// Capacity.
        capacity: u64,
    },
    /// The CPU capacity is above one CPU (1 000 000 ppm): EDF on one thread
    /// cannot guarantee more.
    #[error("CPU capacity {0} ppm is more than one CPU")]
    CapacityAboveOneCpu(u64),
    /// A period bound is zero, inverted, or above the scheduler's maximum.
    #[error("period bounds {min}..={max} ns are invalid")]
    PeriodBounds {
        /// Minimum.
        min: u64,
        /// Maximum.
        max: u64,
    },
    /// A built-in session's VP parameters are invalid.
    #[error(transparent)]
    Builtin(#[from] SchedError),
}

/// Configuration of the resource-control core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcaneConfig {
    /// What the node can guarantee in total.
    pub capacity: Capacity,
    /// The System session's VP (it always has `extra`).
    pub system: VpParams,
    /// The Best-Effort session's VP (SNAP forwarding, principals without a
    /// reservation).
    pub best_effort: VpParams,
    /// Shortest VP period a principal may ask for, ns.
    pub min_period_ns: u64,
    /// Longest VP period, ns.
    pub max_period_ns: u64,
    /// Shortest slice, ns.
    pub min_slice_ns: u64,
    /// Most principal sessions on the node.
    pub max_sessions: u32,
    /// Most sessions of one principal.
    pub max_sessions_per_principal: u32,
    /// Most VP operations in one request.
    pub max_request_ops: usize,
    /// Closed sessions (and session events) kept until drained; more are
    /// dropped and counted.
    pub max_undrained: usize,
    /// Scheduler tuning.
    pub sched: SchedConfig,
}

impl Default for RcaneConfig {
    /// 95 % of one CPU for guarantees; System 5 % per 10 ms and Best-Effort
    /// 10 % per 10 ms, both with slack; periods 500 µs..10 s; 256 MiB of
    /// heap and 12.5 MB/s (100 Mbit/s) each way for reservations.
    fn default() -> Self {
        const MS: u64 = 1_000_000;
        RcaneConfig {
            capacity: Capacity {
                cpu_ppm: 950_000,
                heap_bytes: 256 << 20,
                tx_bytes_per_sec: 12_500_000,
                rx_bytes_per_sec: 12_500_000,
            },
            system: VpParams { slice_ns: MS / 2, period_ns: 10 * MS, extra: true },
            best_effort: VpParams { slice_ns: MS, period_ns: 10 * MS, extra: true },
            min_period_ns: MS / 2,
            max_period_ns: 10_000 * MS,
            min_slice_ns: 10_000,
            max_sessions: 1024,
            max_sessions_per_principal: 8,
            max_request_ops: 32,
            max_undrained: 4096,
            sched: SchedConfig::default(),
        }
    }
}

#[derive(Debug, Clone)]
struct Session {
    owner: Owner,
    ceilings: Ceilings,
    expires_at: Option<u64>,
    opened_at: u64,
    vps: Vec<VpId>,
    pools: Vec<PoolId>,
    heap_bytes: u64,
    tx_bytes_per_sec: u64,
    rx_bytes_per_sec: u64,
    account: Account,
    heap_since: u64,
    drained: [u64; KINDS],
}

impl Session {
    fn new(owner: Owner, ceilings: Ceilings, expires_at: Option<u64>, now: u64) -> Session {
        Session {
            owner,
            ceilings,
            expires_at,
            opened_at: now,
            vps: Vec::new(),
            pools: Vec::new(),
            heap_bytes: 0,
            tx_bytes_per_sec: 0,
            rx_bytes_per_sec: 0,
            account: Account::default(),
            heap_since: now,
            drained: [0; KINDS],
        }
    }

    fn integrate_heap(&mut self, now: u64) {
        let dt = now.saturating_sub(self.heap_since);
        self.account.heap_byte_ns =
            self.account.heap_byte_ns.saturating_add(u128::from(self.heap_bytes) * u128::from(dt));
        self.heap_since = self.heap_since.max(now);
    }

    fn queued_capacity<E>(&self, pools: &Slab<Pool<E>>) -> u64 {
        self.pools.iter().filter_map(|p| pools.get(*p).ok()).map(|p| u64::from(p.spec().max_queued)).sum()
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct VpWork {
    backlog_pools: u32,
    busy: bool,
}

/// A session that was closed, with its final account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedSession {
    /// The session.
    pub session: SessionId,
    /// Its owner.
    pub owner: Owner,
    /// Why it closed.
    pub reason: CloseReason,
    /// What it used in its life.
    pub account: Account,
    /// Events discarded from its pools.
    pub events_discarded: u64,
}

#[derive(Debug, Clone)]
struct Undrained {
    session: SessionId,
    owner: Owner,
    account: Account,
    drained: [u64; KINDS],
}

/// A granted request: the session and the VPs it added, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The session.
    pub session: SessionId,
    /// Handles of the VPs added.
    pub added: Vec<VpId>,
}

/// One pool as [`SessionInfo`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    /// Handle.
    pub pool: PoolId,
    /// Its VP.
    pub vp: VpId,
    /// Bounds.
    pub spec: PoolSpec,
    /// Events waiting.
    pub queued: usize,
    /// Events in progress.
    pub in_progress: u32,
    /// Counters.
    pub stats: PoolStats,
}

/// A session's state, for `anode session show` and `anode status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Handle.
    pub session: SessionId,
    /// Owner.
    pub owner: Owner,
    /// When it opened (caller's clock, ns).
    pub opened_at_ns: u64,
    /// When its credential expires.
    pub expires_at_ns: Option<u64>,
    /// Its credential's ceilings.
    pub ceilings: Ceilings,
    /// Its VPs.
    pub vps: Vec<(VpId, VpParams)>,
    /// Its pools.
    pub pools: Vec<PoolInfo>,
    /// Sum of its VPs' shares, ppm.
    pub share_ppm: u64,
    /// Heap reservation, bytes.
    pub heap_bytes: u64,
    /// Transmit reservation, bytes per second.
    pub tx_bytes_per_sec: u64,
    /// Receive reservation, bytes per second.
    pub rx_bytes_per_sec: u64,
    /// Cumulative usage.
    pub account: Account,
}

/// What a request would leave a session holding; computed before anything
/// changes, so that a refused request changes nothing.
struct Plan {
    add: Vec<VpParams>,
    change: Vec<(VpId, VpParams)>,
    remove: Vec<VpId>,
    heap_bytes: u64,
    tx_bytes_per_sec: u64,
    rx_bytes_per_sec: u64,
}

/// The resource-control core: sessions, their VPs, pools and accounts over
/// one [`Scheduler`]. `E` is the event type pools carry.
#[derive(Debug, Clone)]
pub struct Rcane<E> {
    cfg: RcaneConfig,
    sched: Scheduler,
    sessions: Slab<Session>,
    pools: Slab<Pool<E>>,
    work: Vec<VpWork>,
    system: (SessionId, VpId),
    best_effort: (SessionId, VpId),
    running: Option<VpId>,
    undrained: VecDeque<Undrained>,
    events: VecDeque<SessionEvent>,
    dropped_records: u64,
    orphan_cpu_ns: u64,
    /// Principals' VPs removed before their period ended (oldest first, at
    /// most [`MAX_LAPSED`]): a VP the same principal adds before that end
    /// goes on with the period ([`Scheduler::continue_lapsed`]) instead of
    /// beginning one with a whole slice.
    lapsed: VecDeque<(PrincipalId, VpInfo)>,
}

/// Removed VPs whose periods [`Rcane`] remembers. Beyond it the oldest is
/// forgotten: a principal would need this many VPs removed within one
/// period (each request is itself a control message, at most
/// `max_request_ops` operations) to win a slice back.
pub const MAX_LAPSED: usize = 1024;

impl<E> Rcane<E> {
    /// Creates the core with its System and Best-Effort sessions.
    ///
    /// # Errors
    /// A [`ConfigError`] if the capacity cannot hold the built-in sessions or
    /// a bound is invalid.
    pub fn new(cfg: RcaneConfig, now: u64) -> Result<Rcane<E>, ConfigError> {
        if cfg.capacity.cpu_ppm > 1_000_000 {
            return Err(ConfigError::CapacityAboveOneCpu(cfg.capacity.cpu_ppm));
        }
        if cfg.min_period_ns == 0 || cfg.min_period_ns > cfg.max_period_ns || cfg.max_period_ns > MAX_PERIOD_NS {
            return Err(ConfigError::PeriodBounds { min: cfg.min_period_ns, max: cfg.max_period_ns });
        }
        let (system, best_effort) = (cfg.system.share_ppm(), cfg.best_effort.share_ppm());
        if system.saturating_add(best_effort) > cfg.capacity.cpu_ppm {
            return Err(ConfigError::BuiltinsExceedCapacity { system, best_effort, capacity: cfg.capacity.cpu_ppm });
        }
        let mut sched = Scheduler::new(cfg.sched);
        let mut sessions = Slab::default();
        let mut builtin = |owner: Owner, params: VpParams| -> Result<(SessionId, VpId), ConfigError> {
            let params = VpParams { extra: true, ..params };
            let mut s = Session::new(owner, Ceilings::NONE, None, now);
            let sid: SessionId = sessions.insert(s.clone()).map_err(|_| SchedError::Full)?;
            let vp = sched.add_vp(sid, params, now)?;
            s.vps.push(vp);
            if let Ok(slot) = sessions.get_mut(sid) {
                *slot = s;
            }
            Ok((sid, vp))
        };
        let system = builtin(Owner::System, cfg.system)?;
        let best_effort = builtin(Owner::BestEffort, cfg.best_effort)?;
        let mut r = Rcane {
            cfg,
            sched,
            sessions,
            pools: Slab::default(),
            work: Vec::new(),
            system,
            best_effort,
            running: None,
            undrained: VecDeque::new(),
            events: VecDeque::new(),
            dropped_records: 0,
            orphan_cpu_ns: 0,
            lapsed: VecDeque::new(),
        };
        r.reset_work(system.1);
        r.reset_work(best_effort.1);
        Ok(r)
    }

    /// The configuration.
    pub fn config(&self) -> &RcaneConfig {
        &self.cfg
    }

    /// The scheduler (read-only: VP state, recent periods).
    pub fn sched(&self) -> &Scheduler {
        &self.sched
    }

    /// The System session and its VP.
    pub fn system(&self) -> (SessionId, VpId) {
        self.system
    }

    /// The Best-Effort session and its VP.
    pub fn best_effort(&self) -> (SessionId, VpId) {
        self.best_effort
    }

    fn reset_work(&mut self, vp: VpId) {
        let i = vp.index() as usize;
        if self.work.len() <= i {
            self.work.resize(i + 1, VpWork::default());
        }
        if let Some(w) = self.work.get_mut(i) {
            *w = VpWork::default();
        }
    }

    fn update_runnable(&mut self, vp: VpId, now: u64) {
        let w = self.work.get(vp.index() as usize).copied().unwrap_or_default();
        // The VP is live whenever this is called; a stale one is ignored.
        let _ = self.sched.set_runnable(vp, w.backlog_pools > 0 || w.busy, now);
    }

    // ---- principal-facing -------------------------------------------------

    /// The session `sid` if `principal` owns it; closes it first if its
    /// credential expired.
    fn owned(&mut self, principal: &PrincipalId, sid: SessionId, now: u64) -> Result<&mut Session, RcaneError> {
        let s = self.sessions.get(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        if s.owner != Owner::Principal(*principal) {
            return Err(RcaneError::Session(sid, HandleError::NotYours));
        }
        let expires_at = s.expires_at;
        if expires_at.is_some_and(|t| t <= now) {
            self.close(sid, CloseReason::CredentialExpired, now)?;
            return Err(RcaneError::CredentialExpired);
        }
        self.sessions.get_mut(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))
    }

    /// Why `vp` is not one of `session`'s VPs.
    fn foreign_vp(&self, vp: VpId) -> RcaneError {
        match self.sched.info(vp) {
            Ok(_) => RcaneError::Vp(vp, HandleError::NotYours),
            Err(SchedError::UnknownVp(_)) => RcaneError::Vp(vp, HandleError::Unknown),
            Err(_) => RcaneError::Vp(vp, HandleError::Stale),
        }
    }

    /// Why `pool` is not one of `session`'s pools.
    fn foreign_pool(&self, pool: PoolId) -> RcaneError {
        match self.pools.get(pool) {
            Ok(_) => RcaneError::Pool(pool, HandleError::NotYours),
            Err(l) => RcaneError::Pool(pool, from_lookup(l)),
        }
    }

    /// Opens a session for `principal` (authenticated by its SA), with the
    /// ceilings its credential states and the credential's expiry, and
    /// grants `req` in it. Nothing happens unless all of it is granted.
    ///
    /// # Errors
    /// [`RcaneError::TooManySessions`], [`RcaneError::TooManySessionsForPrincipal`],
    /// [`RcaneError::CredentialExpired`], or any refusal of [`Rcane::reserve`].
    pub fn open_session(
        &mut self,
        principal: PrincipalId,
        ceilings: Ceilings,
        expires_at_ns: Option<u64>,
        req: &ReserveRequest,
        now: u64,
    ) -> Result<Granted, RcaneError> {
        if expires_at_ns.is_some_and(|t| t <= now) {
            return Err(RcaneError::CredentialExpired);
        }
        let owner = Owner::Principal(principal);
        let (mut total, mut mine) = (0u32, 0u32);
        for (_, s) in self.sessions.iter::<SessionId>() {
            if let Owner::Principal(p) = s.owner {
                total += 1;
                mine += u32::from(p == principal);
            }
        }
        if total >= self.cfg.max_sessions {
            return Err(RcaneError::TooManySessions { limit: self.cfg.max_sessions });
        }
        if mine >= self.cfg.max_sessions_per_principal {
            return Err(RcaneError::TooManySessionsForPrincipal { limit: self.cfg.max_sessions_per_principal });
        }
        let session = Session::new(owner, ceilings, expires_at_ns, now);
        let plan = self.plan(None, &session, req)?;
        let sid: SessionId = self.sessions.insert(session).map_err(|_| SchedError::Full)?;
        let added = match self.apply(sid, plan, now) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.sessions.remove(sid);
                return Err(e);
            }
        };
        self.push_event(SessionEvent::Opened { session: sid, owner, at_ns: now });
        Ok(Granted { session: sid, added })
    }

    /// Changes the reservations of `principal`'s session `sid`: all of
    /// `req`, or nothing.
    ///
    /// # Errors
    /// A handle error for the session or a VP, [`RcaneError::TooManyOps`],
    /// [`RcaneError::DuplicateVp`], [`RcaneError::CredentialExpired`], or an
    /// [`AdmissionError`] saying what was asked, what is left and what the
    /// credential allows.
    pub fn reserve(
        &mut self,
        principal: &PrincipalId,
        sid: SessionId,
        req: &ReserveRequest,
        now: u64,
    ) -> Result<Granted, RcaneError> {
        let session = self.owned(principal, sid, now)?.clone();
        let plan = self.plan(Some(sid), &session, req)?;
        let added = self.apply(sid, plan, now)?;
        Ok(Granted { session: sid, added })
    }

    /// Closes `principal`'s session `sid`, freeing everything it held.
    ///
    /// # Errors
    /// A handle error for the session, or [`RcaneError::CredentialExpired`]
    /// (it was closed for that reason instead).
    pub fn close_session(
        &mut self,
        principal: &PrincipalId,
        sid: SessionId,
        now: u64,
    ) -> Result<ClosedSession, RcaneError> {
        self.owned(principal, sid, now)?;
        self.close(sid, CloseReason::ByPrincipal, now)
    }

    /// `principal`'s sessions.
    pub fn list(&mut self, principal: &PrincipalId, now: u64) -> Vec<SessionInfo> {
        let mine: Vec<SessionId> = self
            .sessions
            .iter::<SessionId>()
            .filter(|(_, s)| s.owner == Owner::Principal(*principal))
            .map(|(id, _)| id)
            .collect();
        mine.into_iter().filter_map(|sid| self.show(principal, sid, now).ok()).collect()
    }

    /// One of `principal`'s sessions.
    ///
    /// # Errors
    /// A handle error for the session, or [`RcaneError::CredentialExpired`].
    pub fn show(&mut self, principal: &PrincipalId, sid: SessionId, now: u64) -> Result<SessionInfo, RcaneError> {
        self.owned(principal, sid, now)?;
        self.session_info(sid, now)
    }

    /// Opens a pool of `principal`'s session `sid`, bound to its VP `vp`.
    ///
    /// # Errors
    /// Handle errors, [`RcaneError::BadPool`], or a credential refusal for
    /// [`Resource::Pools`] or [`Resource::QueuedEvents`].
    pub fn open_pool(
        &mut self,
        principal: &PrincipalId,
        sid: SessionId,
        vp: VpId,
        spec: PoolSpec,
        now: u64,
    ) -> Result<PoolId, RcaneError> {
        let s = self.owned(principal, sid, now)?;
        if !s.vps.contains(&vp) {
            return Err(self.foreign_vp(vp));
        }
        let s = self.sessions.get(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        let c = s.ceilings;
        let pools = s.pools.len() as u64;
        check(Resource::Pools, pools, pools + 1, 0, u64::MAX, u64::from(c.max_pools))?;
        let queued = s.queued_capacity(&self.pools);
        let want = queued.saturating_add(u64::from(spec.max_queued));
        check(Resource::QueuedEvents, queued, want, 0, u64::MAX, u64::from(c.max_queued_events))?;
        self.add_pool(sid, vp, spec)
    }

    /// Closes one of `principal`'s pools; its events are discarded (counted).
    ///
    /// # Errors
    /// Handle errors.
    pub fn close_pool(
        &mut self,
        principal: &PrincipalId,
        sid: SessionId,
        pool: PoolId,
        now: u64,
    ) -> Result<PoolStats, RcaneError> {
        let s = self.owned(principal, sid, now)?;
        if !s.pools.contains(&pool) {
            return Err(self.foreign_pool(pool));
        }
        self.remove_pool(pool, now)
    }

    // ---- planning and applying requests -----------------------------------

    fn check_vp(&self, p: VpParams) -> Result<(), AdmissionError> {
        let c = &self.cfg;
        if p.period_ns < c.min_period_ns
            || p.period_ns > c.max_period_ns
            || p.slice_ns < c.min_slice_ns.max(1)
            || p.slice_ns > p.period_ns
        {
            return Err(AdmissionError::BadVp {
                params: p,
                min_period_ns: c.min_period_ns,
                max_period_ns: c.max_period_ns,
                min_slice_ns: c.min_slice_ns.max(1),
            });
        }
        Ok(())
    }

    fn plan(&self, sid: Option<SessionId>, s: &Session, req: &ReserveRequest) -> Result<Plan, RcaneError> {
        let max = self.cfg.max_request_ops;
        if req.vps.len() > max {
            return Err(RcaneError::TooManyOps { ops: req.vps.len(), max });
        }
        let c = s.ceilings;
        // The session's VPs after the request: (handle if existing, params).
        let mut after: Vec<(Option<VpId>, VpParams)> = Vec::with_capacity(s.vps.len() + req.vps.len());
        for &vp in &s.vps {
            after.push((Some(vp), self.sched.info(vp)?.params));
        }
        let current_share: u64 = after.iter().map(|(_, p)| p.share_ppm()).fold(0, u64::saturating_add);
        let current_count = after.len() as u64;
        let mut plan = Plan {
            add: Vec::new(),
            change: Vec::new(),
            remove: Vec::new(),
            heap_bytes: req.heap_bytes.unwrap_or(s.heap_bytes),
            tx_bytes_per_sec: req.tx_bytes_per_sec.unwrap_or(s.tx_bytes_per_sec),
            rx_bytes_per_sec: req.rx_bytes_per_sec.unwrap_or(s.rx_bytes_per_sec),
        };
        let node_cpu_left = |s_share: u64| {
            self.cfg.capacity.cpu_ppm.saturating_sub(self.sched.total_share_ppm().saturating_sub(s_share))
        };
        let mut touched: Vec<VpId> = Vec::new();
        for op in &req.vps {
            let (vp, params) = match *op {
                VpOp::Add(p) => (None, Some(p)),
                VpOp::Change(vp, p) => (Some(vp), Some(p)),
                VpOp::Remove(vp) => (Some(vp), None),
            };
            if let Some(vp) = vp {
                if !s.vps.contains(&vp) {
                    return Err(self.foreign_vp(vp));
                }
                if touched.contains(&vp) {
                    return Err(RcaneError::DuplicateVp(vp));
                }
                touched.push(vp);
            }
            if let Some(p) = params {
                self.check_vp(p)?;
                let share = p.share_ppm();
                if share > c.max_vp_share_ppm {
                    return Err(AdmissionError::Refused {
                        resource: Resource::VpShare,
                        by: Limit::Credential,
                        asked: share,
                        left: node_cpu_left(current_share),
                        allowed: c.max_vp_share_ppm,
                    }
                    .into());
                }
                if p.extra && !c.extra {
                    return Err(AdmissionError::Refused {
                        resource: Resource::Extra,
                        by: Limit::Credential,
                        asked: 1,
                        left: u64::MAX,
                        allowed: 0,
                    }
                    .into());
                }
            }
            match (vp, params) {
                (None, Some(p)) => {
                    after.push((None, p));
                    plan.add.push(p);
                }
                (Some(vp), Some(p)) => {
                    if let Some(slot) = after.iter_mut().find(|(h, _)| *h == Some(vp)) {
                        slot.1 = p;
                    }
                    plan.change.push((vp, p));
                }
                (Some(vp), None) => {
                    after.retain(|(h, _)| *h != Some(vp));
                    plan.remove.push(vp);
                }
                (None, None) => {}
            }
        }
        let new_share: u64 = after.iter().map(|(_, p)| p.share_ppm()).fold(0, u64::saturating_add);
        check(Resource::Vps, current_count, after.len() as u64, 0, u64::MAX, u64::from(c.max_vps))?;
        let others_cpu = self.sched.total_share_ppm().saturating_sub(current_share);
        check(Resource::Cpu, current_share, new_share, others_cpu, self.cfg.capacity.cpu_ppm, c.max_total_share_ppm)?;
        let (heap, tx, rx) = self.reserved_except(sid);
        let cap = self.cfg.capacity;
        check(Resource::Heap, s.heap_bytes, plan.heap_bytes, heap, cap.heap_bytes, c.max_heap_bytes)?;
        check(
            Resource::Tx,
            s.tx_bytes_per_sec,
            plan.tx_bytes_per_sec,
            tx,
            cap.tx_bytes_per_sec,
            c.max_tx_bytes_per_sec,
        )?;
        check(
            Resource::Rx,
            s.rx_bytes_per_sec,
            plan.rx_bytes_per_sec,
            rx,
            cap.rx_bytes_per_sec,
            c.max_rx_bytes_per_sec,
        )?;
        Ok(plan)
    }

    /// Heap, transmit and receive reservations of every session but `sid`.
    fn reserved_except(&self, sid: Option<SessionId>) -> (u64, u64, u64) {
        let (mut heap, mut tx, mut rx) = (0u64, 0u64, 0u64);
        for (id, o) in self.sessions.iter::<SessionId>() {
            if Some(id) != sid {
                heap = heap.saturating_add(o.heap_bytes);
                tx = tx.saturating_add(o.tx_bytes_per_sec);
                rx = rx.saturating_add(o.rx_bytes_per_sec);
            }
        }
        (heap, tx, rx)
    }

    /// Session `sid`'s transmit reservation, bytes per second (0 for a
    /// stale handle or none).
    pub fn tx_reserved(&self, sid: SessionId) -> u64 {
        self.sessions.get(sid).map_or(0, |s| s.tx_bytes_per_sec)
    }

    /// Session `sid`'s receive reservation, bytes/s (0 if none or no such
    /// session).
    pub fn rx_reserved(&self, sid: SessionId) -> u64 {
        self.sessions.get(sid).map_or(0, |s| s.rx_bytes_per_sec)
    }

    /// What the node has left of `resource` to grant (capacity less what
    /// every session holds); `u64::MAX` for resources the node does not
    /// bound (counts of VPs, pools, queued events, slack).
    pub fn left(&self, resource: Resource) -> u64 {
        let cap = self.cfg.capacity;
        let (heap, tx, rx) = self.reserved_except(None);
        match resource {
            Resource::Cpu | Resource::VpShare => cap.cpu_ppm.saturating_sub(self.sched.total_share_ppm()),
            Resource::Heap => cap.heap_bytes.saturating_sub(heap),
            Resource::Tx => cap.tx_bytes_per_sec.saturating_sub(tx),
            Resource::Rx => cap.rx_bytes_per_sec.saturating_sub(rx),
            _ => u64::MAX,
        }
    }

    /// The principal owning `sid`, if a principal does.
    fn principal_of(&self, sid: SessionId) -> Option<PrincipalId> {
        match self.sessions.get(sid).map(|s| s.owner) {
            Ok(Owner::Principal(p)) => Some(p),
            _ => None,
        }
    }

    /// Remembers `vp`'s period, about to be removed, for `principal`.
    fn lapse(&mut self, principal: PrincipalId, vp: VpId, now: u64) {
        self.lapsed.retain(|(_, i)| i.deadline_ns > now);
        let Ok(info) = self.sched.info(vp) else { return };
        if info.deadline_ns <= now {
            return;
        }
        if self.lapsed.len() >= MAX_LAPSED {
            self.lapsed.pop_front();
        }
        self.lapsed.push_back((principal, info));
    }

    /// Makes `vp`, just added for `principal`, go on with one of its
    /// lapsed periods (one of the same period first).
    fn resume_lapsed(&mut self, principal: PrincipalId, vp: VpId, now: u64) {
        let Ok(period) = self.sched.info(vp).map(|i| i.params.period_ns) else { return };
        let live = |(p, i): &(PrincipalId, VpInfo)| *p == principal && i.deadline_ns > now;
        let at = self
            .lapsed
            .iter()
            .position(|e| live(e) && e.1.params.period_ns == period)
            .or_else(|| self.lapsed.iter().position(live));
        if let Some((_, info)) = at.and_then(|k| self.lapsed.remove(k)) {
            let _ = self.sched.continue_lapsed(vp, &info, now);
        }
    }

    fn apply(&mut self, sid: SessionId, plan: Plan, now: u64) -> Result<Vec<VpId>, RcaneError> {
        let principal = self.principal_of(sid);
        // Adds first: the only step that can fail (no VP slot left); undo
        // them if it does, so the request stays all or nothing.
        let mut added = Vec::with_capacity(plan.add.len());
        for p in &plan.add {
            match self.sched.add_vp(sid, *p, now) {
                Ok(vp) => added.push(vp),
                Err(e) => {
                    for vp in added {
                        let _ = self.sched.remove_vp(vp, now);
                    }
                    return Err(e.into());
                }
            }
        }
        // What the removed VPs had left of their periods goes to the added
        // ones, before either is touched.
        if let Some(p) = principal {
            for &vp in &plan.remove {
                self.lapse(p, vp, now);
            }
        }
        for &vp in &added {
            self.reset_work(vp);
            if let Some(p) = principal {
                self.resume_lapsed(p, vp, now);
            }
        }
        for (vp, p) in plan.change {
            self.sched.set_params(vp, p, now)?;
        }
        for vp in plan.remove {
            self.remove_vp(sid, vp, now);
        }
        let s = self.sessions.get_mut(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        s.vps.extend_from_slice(&added);
        s.integrate_heap(now);
        s.heap_bytes = plan.heap_bytes;
        s.tx_bytes_per_sec = plan.tx_bytes_per_sec;
        s.rx_bytes_per_sec = plan.rx_bytes_per_sec;
        Ok(added)
    }

    /// Removes a VP and its pools; returns events discarded.
    fn remove_vp(&mut self, sid: SessionId, vp: VpId, now: u64) -> u64 {
        let pools: Vec<PoolId> = self.pools.iter::<PoolId>().filter(|(_, p)| p.vp() == vp).map(|(id, _)| id).collect();
        let mut discarded = 0;
        for pool in pools {
            discarded += self.remove_pool(pool, now).map_or(0, |s| s.discarded);
        }
        let _ = self.sched.remove_vp(vp, now);
        if self.running == Some(vp) {
            self.running = None;
        }
        if let Ok(s) = self.sessions.get_mut(sid) {
            s.vps.retain(|v| *v != vp);
        }
        discarded
    }

    fn add_pool(&mut self, sid: SessionId, vp: VpId, spec: PoolSpec) -> Result<PoolId, RcaneError> {
        if spec.max_queued == 0 || spec.max_in_progress == 0 {
            return Err(RcaneError::BadPool);
        }
        let pool: PoolId = self.pools.insert(Pool::new(sid, vp, spec)).map_err(|_| SchedError::Full)?;
        if let Ok(s) = self.sessions.get_mut(sid) {
            s.pools.push(pool);
        }
        Ok(pool)
    }

    fn remove_pool(&mut self, pool: PoolId, now: u64) -> Result<PoolStats, RcaneError> {
        let mut p = self.pools.remove(pool).map_err(|l| RcaneError::Pool(pool, from_lookup(l)))?;
        let had = p.has_backlog();
        p.discard_all();
        if had {
            self.backlog_changed(p.vp(), false, now);
        }
        if let Ok(s) = self.sessions.get_mut(p.session()) {
            s.pools.retain(|x| *x != pool);
        }
        Ok(p.stats())
    }

    fn backlog_changed(&mut self, vp: VpId, has: bool, now: u64) {
        if let Some(w) = self.work.get_mut(vp.index() as usize) {
            w.backlog_pools = if has { w.backlog_pools.saturating_add(1) } else { w.backlog_pools.saturating_sub(1) };
        }
        self.update_runnable(vp, now);
    }

    fn close(&mut self, sid: SessionId, reason: CloseReason, now: u64) -> Result<ClosedSession, RcaneError> {
        if sid == self.system.0 || sid == self.best_effort.0 {
            return Err(RcaneError::Builtin);
        }
        let vps = self.sessions.get(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?.vps.clone();
        if let Some(p) = self.principal_of(sid) {
            for &vp in &vps {
                self.lapse(p, vp, now);
            }
        }
        let mut discarded = 0;
        for vp in vps {
            discarded += self.remove_vp(sid, vp, now);
        }
        let mut s = self.sessions.remove(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        s.integrate_heap(now);
        if self.undrained.len() >= self.cfg.max_undrained {
            self.undrained.pop_front();
            self.dropped_records += 1;
        }
        self.undrained.push_back(Undrained { session: sid, owner: s.owner, account: s.account, drained: s.drained });
        self.push_event(SessionEvent::Closed { session: sid, owner: s.owner, reason, at_ns: now });
        Ok(ClosedSession { session: sid, owner: s.owner, reason, account: s.account, events_discarded: discarded })
    }

    fn push_event(&mut self, e: SessionEvent) {
        if self.events.len() >= self.cfg.max_undrained {
            self.events.pop_front();
            self.dropped_records += 1;
        }
        self.events.push_back(e);
    }

    // ---- trusted: the daemon ----------------------------------------------

    /// Closes a session for a reason other than its principal's request
    /// (its SA is gone past the grace period, the operator, shutdown).
    ///
    /// # Errors
    /// A handle error, or [`RcaneError::Builtin`] for System and Best-Effort.
    pub fn close_session_for(
        &mut self,
        sid: SessionId,
        reason: CloseReason,
        now: u64,
    ) -> Result<ClosedSession, RcaneError> {
        self.close(sid, reason, now)
    }

    /// Closes every session whose credential has expired by `now`.
    pub fn expire(&mut self, now: u64) -> Vec<ClosedSession> {
        let due: Vec<SessionId> = self
            .sessions
            .iter::<SessionId>()
            .filter(|(_, s)| s.expires_at.is_some_and(|t| t <= now))
            .map(|(id, _)| id)
            .collect();
        due.into_iter().filter_map(|sid| self.close(sid, CloseReason::CredentialExpired, now).ok()).collect()
    }

    /// The earliest credential expiry of any session.
    pub fn next_expiry(&self) -> Option<u64> {
        self.sessions.iter::<SessionId>().filter_map(|(_, s)| s.expires_at).min()
    }

    /// Opens a pool for a session without a credential check (the daemon's
    /// own pools in System and Best-Effort).
    ///
    /// # Errors
    /// Handle errors or [`RcaneError::BadPool`].
    pub fn open_pool_trusted(&mut self, sid: SessionId, vp: VpId, spec: PoolSpec) -> Result<PoolId, RcaneError> {
        let s = self.sessions.get(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        if !s.vps.contains(&vp) {
            return Err(self.foreign_vp(vp));
        }
        self.add_pool(sid, vp, spec)
    }

    /// Queues an event on a pool; its VP becomes runnable.
    ///
    /// # Errors
    /// The event comes back with [`PostRefusal::Full`] (counted) or a
    /// handle error.
    pub fn post(&mut self, pool: PoolId, event: E, now: u64) -> Result<(), PostRefused<E>> {
        let p = match self.pools.get_mut(pool) {
            Ok(p) => p,
            Err(l) => return Err(PostRefused { event, reason: PostRefusal::Pool(from_lookup(l)) }),
        };
        let had = p.has_backlog();
        if let Err(event) = p.push(event) {
            return Err(PostRefused { event, reason: PostRefusal::Full });
        }
        let vp = p.vp();
        if !had {
            self.backlog_changed(vp, true, now);
        }
        Ok(())
    }

    /// Takes the next event of `pool` into progress, for the VP that `d`
    /// dispatched. Only the VP holding the CPU gets its pools' events.
    ///
    /// # Errors
    /// A handle error, or [`RcaneError::NotHoldingCpu`].
    pub fn take_event(&mut self, d: &Dispatch, pool: PoolId) -> Result<Option<E>, RcaneError> {
        let p = self.pools.get_mut(pool).map_err(|l| RcaneError::Pool(pool, from_lookup(l)))?;
        if p.vp() != d.vp || self.running != Some(d.vp) {
            return Err(RcaneError::NotHoldingCpu { pool, pool_vp: p.vp() });
        }
        Ok(p.take())
    }

    /// The event [`take_event`](Self::take_event) would return next from
    /// `pool`, left queued (`None` for an unknown pool).
    pub fn peek_event(&self, pool: PoolId) -> Option<&E> {
        self.pools.get(pool).ok()?.peek()
    }

    /// Marks one event of `pool` in progress as finished; the VP stops being
    /// runnable when none of its pools has a backlog.
    ///
    /// # Errors
    /// A handle error.
    pub fn finish_event(&mut self, pool: PoolId, now: u64) -> Result<(), RcaneError> {
        let p = self.pools.get_mut(pool).map_err(|l| RcaneError::Pool(pool, from_lookup(l)))?;
        p.finish();
        if !p.has_backlog() {
            let vp = p.vp();
            self.backlog_changed(vp, false, now);
        }
        Ok(())
    }

    /// Takes every event queued on `pool` (trusted: the daemon moves the
    /// events of a session it is about to close to Best-Effort, so that a
    /// module's work outlives its principal's reservation).
    pub fn take_queued(&mut self, pool: PoolId, now: u64) -> Vec<E> {
        let Ok(p) = self.pools.get_mut(pool) else { return Vec::new() };
        let had = p.has_backlog();
        let v = p.take_queued();
        let (vp, has) = (p.vp(), p.has_backlog());
        if had && !has {
            self.backlog_changed(vp, false, now);
        }
        v
    }

    /// The pools bound to `vp` that have events waiting, for the daemon to
    /// take from when `vp` is dispatched.
    pub fn pools_with_work(&self, vp: VpId) -> impl Iterator<Item = PoolId> + '_ {
        self.pools.iter::<PoolId>().filter(move |(_, p)| p.vp() == vp && p.queued() > 0).map(|(id, _)| id)
    }

    /// Marks a VP as having work outside its pools (or not).
    ///
    /// # Errors
    /// A handle error.
    pub fn set_busy(&mut self, vp: VpId, busy: bool, now: u64) -> Result<(), RcaneError> {
        self.sched.info(vp).map_err(|_| self.foreign_vp(vp))?;
        if let Some(w) = self.work.get_mut(vp.index() as usize) {
            w.busy = busy;
        }
        self.update_runnable(vp, now);
        Ok(())
    }

    /// Takes the completed-period records logged since the last drain (see
    /// [`Scheduler::drain_periods`]).
    pub fn drain_periods(&mut self) -> impl Iterator<Item = crate::scheduler::PeriodRecord> + '_ {
        self.sched.drain_periods()
    }

    /// Which VP runs now and for how long (see [`Scheduler::pick`]).
    pub fn pick(&mut self, now: u64) -> Option<Dispatch> {
        let d = self.sched.pick(now);
        self.running = d.map(|d| d.vp);
        d
    }

    /// The next instant something changes (see [`Scheduler::poll_at`]),
    /// including credential expiries.
    pub fn poll_at(&self) -> Option<u64> {
        match (self.sched.poll_at(), self.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reports the CPU the dispatched VP used (thread CPU time), charging it
    /// to the VP's session. If the VP or its session went away while it
    /// ran, the CPU is still charged to that session's final account, or
    /// to System if none is left (counted in [`Rcane::orphan_cpu_ns`]).
    pub fn charge(&mut self, d: &Dispatch, used_ns: u64, now: u64) -> Charged {
        if self.running == Some(d.vp) {
            self.running = None;
        }
        let c = self.sched.charge(d, used_ns, now).unwrap_or(match d.kind {
            DispatchKind::Guaranteed => Charged { guaranteed_ns: used_ns, ..Charged::default() },
            DispatchKind::Slack => Charged { slack_ns: used_ns, ..Charged::default() },
        });
        let add = |a: &mut Account| {
            a.cpu_guaranteed_ns = a.cpu_guaranteed_ns.saturating_add(c.guaranteed_ns + c.overrun_ns);
            a.cpu_slack_ns = a.cpu_slack_ns.saturating_add(c.slack_ns);
        };
        if let Some(a) = self.account_mut(d.owner) {
            add(a);
        } else {
            self.orphan_cpu_ns = self.orphan_cpu_ns.saturating_add(c.total_ns());
            if let Ok(s) = self.sessions.get_mut(self.system.0) {
                add(&mut s.account);
            }
        }
        c
    }

    fn account_mut(&mut self, sid: SessionId) -> Option<&mut Account> {
        if let Ok(s) = self.sessions.get_mut(sid) {
            return Some(&mut s.account);
        }
        self.undrained.iter_mut().find(|u| u.session == sid).map(|u| &mut u.account)
    }

    fn charge_with(&mut self, sid: SessionId, f: impl FnOnce(&mut Account)) -> Result<(), RcaneError> {
        let a = self.account_mut(sid).ok_or(RcaneError::Session(sid, HandleError::Stale))?;
        f(a);
        Ok(())
    }

    /// Charges CPU spent outside a dispatch (the daemon's own work for a
    /// session), in ns of thread CPU time.
    ///
    /// # Errors
    /// A handle error if the session is gone and drained.
    pub fn charge_cpu(&mut self, sid: SessionId, ns: u64, kind: DispatchKind) -> Result<(), RcaneError> {
        self.charge_with(sid, |a| match kind {
            DispatchKind::Guaranteed => a.cpu_guaranteed_ns = a.cpu_guaranteed_ns.saturating_add(ns),
            DispatchKind::Slack => a.cpu_slack_ns = a.cpu_slack_ns.saturating_add(ns),
        })
    }

    /// Charges packets sent.
    ///
    /// # Errors
    /// A handle error if the session is gone and drained.
    pub fn charge_tx(&mut self, sid: SessionId, packets: u64, bytes: u64) -> Result<(), RcaneError> {
        self.charge_with(sid, |a| {
            a.tx_packets = a.tx_packets.saturating_add(packets);
            a.tx_bytes = a.tx_bytes.saturating_add(bytes);
        })
    }

    /// Charges packets received.
    ///
    /// # Errors
    /// A handle error if the session is gone and drained.
    pub fn charge_rx(&mut self, sid: SessionId, packets: u64, bytes: u64) -> Result<(), RcaneError> {
        self.charge_with(sid, |a| {
            a.rx_packets = a.rx_packets.saturating_add(packets);
            a.rx_bytes = a.rx_bytes.saturating_add(bytes);
        })
    }

    /// Charges one module load.
    ///
    /// # Errors
    /// A handle error if the session is gone and drained.
    pub fn charge_module_load(&mut self, sid: SessionId) -> Result<(), RcaneError> {
        self.charge_with(sid, |a| a.module_loads = a.module_loads.saturating_add(1))
    }

    /// CPU charged to System because its session was gone.
    pub fn orphan_cpu_ns(&self) -> u64 {
        self.orphan_cpu_ns
    }

    /// Closed sessions or session events lost because nobody drained them.
    pub fn dropped_records(&self) -> u64 {
        self.dropped_records
    }

    /// What every session used since the last drain: one [`Charge`] per
    /// session and resource kind that changed, live and closed sessions
    /// alike (a closed session is forgotten once drained).
    pub fn drain_charges(&mut self, now: u64) -> Vec<Charge> {
        fn deltas(out: &mut Vec<Charge>, owner: Owner, sid: SessionId, a: &Account, drained: &mut [u64; KINDS]) {
            for (k, d) in ResourceKind::ALL.into_iter().zip(drained.iter_mut()) {
                let cur = a.get(k);
                if cur > *d {
                    out.push(Charge { owner, session: sid, kind: k, amount: cur - *d });
                    *d = cur;
                }
            }
        }
        let mut out = Vec::new();
        for (sid, s) in self.sessions.iter_mut::<SessionId>() {
            s.integrate_heap(now);
            let account = s.account;
            deltas(&mut out, s.owner, sid, &account, &mut s.drained);
        }
        for mut u in self.undrained.drain(..) {
            deltas(&mut out, u.owner, u.session, &u.account, &mut u.drained);
        }
        out
    }

    /// Session openings and closings since the last drain.
    pub fn drain_events(&mut self) -> impl Iterator<Item = SessionEvent> + '_ {
        self.events.drain(..)
    }

    /// Every live session's handle (System and Best-Effort first).
    pub fn sessions(&self) -> impl Iterator<Item = SessionId> + '_ {
        self.sessions.iter::<SessionId>().map(|(id, _)| id)
    }

    /// A session's state, without an ownership check (for `anode status`).
    ///
    /// # Errors
    /// A handle error.
    pub fn session_info(&mut self, sid: SessionId, now: u64) -> Result<SessionInfo, RcaneError> {
        let s = self.sessions.get_mut(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        s.integrate_heap(now);
        let s = self.sessions.get(sid).map_err(|l| RcaneError::Session(sid, from_lookup(l)))?;
        let vps: Vec<(VpId, VpParams)> =
            s.vps.iter().filter_map(|vp| self.sched.info(*vp).ok().map(|i| (*vp, i.params))).collect();
        let pools = s
            .pools
            .iter()
            .filter_map(|id| {
                let p = self.pools.get(*id).ok()?;
                Some(PoolInfo {
                    pool: *id,
                    vp: p.vp(),
                    spec: p.spec(),
                    queued: p.queued(),
                    in_progress: p.in_progress(),
                    stats: p.stats(),
                })
            })
            .collect();
        Ok(SessionInfo {
            session: sid,
            owner: s.owner,
            opened_at_ns: s.opened_at,
            expires_at_ns: s.expires_at,
            ceilings: s.ceilings,
            share_ppm: vps.iter().map(|(_, p)| p.share_ppm()).fold(0, u64::saturating_add),
            vps,
            pools,
            heap_bytes: s.heap_bytes,
            tx_bytes_per_sec: s.tx_bytes_per_sec,
            rx_bytes_per_sec: s.rx_bytes_per_sec,
            account: s.account,
        })
    }
}
