//! RCANE on the node (RCANE §IV-B, §IV-C): module work as events on the
//! pools of sessions, run by their virtual processors under EDF.
//!
//! ```text
//! alarm due / packet for a module channel ──► Job ──► pool of the module's principal's session
//!                                                      (or the Best-Effort module pool)
//! daemon: pick(now) ──► Dispatch{vp, budget} ──► run_dispatch: resume the VP's suspended task,
//!         then its pools' jobs, each preemptible at fuel yields ──► charge(thread CPU used)
//! ```
//!
//! Without [`Node::enable_rcane`] (the in-process tests, a node without
//! modules), module work runs inline when it arrives, as before.
//!
//! One OS thread runs every session: the daemon's. Network input is
//! handled between dispatches, and a dispatch lasts at most its budget (a
//! VP's slice at most) plus one preemption grain, so forwarding waits at
//! most that long; its CPU is charged to Best-Effort, the control plane's to
//! System, and a capsule's or channel packet's arrival to the session it was
//! accepted for ([`Outbox::rx_for`]; the daemon splits each receive batch's
//! CPU by each datagram's measured time).

use std::collections::HashMap;

use anode_sandbox::{InvokeError, Job, PrincipalId, Step, Task};
use anode_sched::{Dispatch, PoolId, PoolSpec, PostRefusal, Rcane, RcaneConfig, SessionId, VpId};

use super::{Node, Outbox, Owner};

/// Counters of the node's module scheduling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SchedCounters {
    /// Jobs queued on pools.
    pub jobs_posted: u64,
    /// Jobs refused because their pool was full.
    pub jobs_refused_full: u64,
    /// Jobs dropped because another task of the same principal held its
    /// store on another VP (none since such a task is run by the job's VP
    /// first: `jobs_helped`; kept for a store held in any other way).
    pub jobs_busy: u64,
    /// Tasks suspended on one VP and run by another VP of the same
    /// principal, whose next job needed the store they held (RCANE's
    /// shared session: one VP does another's work, on its own budget).
    pub jobs_helped: u64,
    /// Jobs finished (including refusals by the sandbox).
    pub jobs_done: u64,
    /// Dispatches run.
    pub dispatches: u64,
    /// Tasks stopped at a preemption point when their dispatch ended.
    pub preemptions: u64,
    /// Session control requests received.
    pub session_requests: u64,
    /// Session requests refused (credential, admission, handles, malformed).
    pub session_refused: u64,
    /// Session requests refused by the per-principal rate limit.
    pub session_rate_limited: u64,
}

/// The node's resource-control state.
pub(crate) struct Sched {
    pub rcane: Rcane<Job>,
    /// Best-Effort's module pool.
    be_pool: PoolId,
    /// Each session's module pool.
    pools: HashMap<SessionId, PoolId>,
    /// Pools on a session's other VPs (by VP index), for the channels that
    /// name them, opened on first use with the session's pool spec.
    vp_pools: HashMap<(SessionId, u8), PoolId>,
    /// Each session's module pool spec.
    pool_specs: HashMap<SessionId, PoolSpec>,
    /// The session a principal's modules run in (its first).
    by_principal: HashMap<PrincipalId, SessionId>,
    /// A task stopped at a preemption point, per VP, with its pool.
    suspended: HashMap<VpId, (PoolId, Task)>,
    /// Each session's credential, to decide again on a changed reservation.
    credentials: HashMap<SessionId, Vec<u8>>,
    limiter: anode_sched::RequestLimiter,
    /// For each principal's session: its principal's key and until when
    /// (ms) it was last known to hold an SA with this node.
    sa_seen: HashMap<SessionId, (anode_sec::PublicKey, u64)>,
    /// How long a session outlives its principal's last SA (ms).
    grace_ms: u64,
    /// When to look again for sessions whose principal is gone (ms).
    gone_check_at: Option<u64>,
    /// What each principal's modules may still send (bounded table).
    tx: anode_sched::ByteBuckets<PrincipalId>,
    /// Every principal's best-effort transmit allowance, bytes/s.
    tx_default: u64,
    /// What each session with a receive reservation may still receive on
    /// its channels (bounded table, like `tx`).
    rx: anode_sched::ByteBuckets<PrincipalId>,
    /// Interfaces whose transmissions the daemon schedules per link: they
    /// are charged when sent ([`Node::charge_sent`]), not when produced.
    paced: Vec<bool>,
    pub counters: SchedCounters,
}

impl std::fmt::Debug for Sched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sched").field("counters", &self.counters).finish_non_exhaustive()
    }
}

/// Why RCANE could not be turned on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RcaneSetupError {
    /// The resource-control configuration is invalid.
    #[error(transparent)]
    Config(#[from] anode_sched::ConfigError),
    /// Best-Effort's module pool could not be opened.
    #[error("cannot open Best-Effort's module pool: {0}")]
    Pool(anode_sched::RcaneError),
}

/// A session of the configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the session for principal {principal} was refused: {answer}")]
pub struct StaticSessionError {
    /// Its principal.
    pub principal: PrincipalId,
    /// The node's answer (credential, capacity, bad VP, ...).
    pub answer: String,
}

/// What each principal's modules may send unless configured
/// (`[modules] tx_bytes_per_sec`), on top of its session's transmit
/// reservation: 1.25 MB/s (10 Mbit/s).
pub const DEFAULT_TX_BYTES_PER_SEC: u64 = 1_250_000;

/// Most principals whose transmit allowance is tracked at once.
const MAX_TX_BUCKETS: usize = 4096;

/// How long a session outlives its principal's last security association
/// unless configured (`[modules] session_grace_secs`), ms.
pub const DEFAULT_SESSION_GRACE_MS: u64 = 60_000;

/// Bounds of the Best-Effort module pool.
pub const BE_POOL: PoolSpec = PoolSpec { max_queued: 4096, max_in_progress: 1 };

impl Sched {
    pub fn new(cfg: RcaneConfig, now_ns: u64) -> Result<Sched, RcaneSetupError> {
        let mut rcane = Rcane::new(cfg, now_ns)?;
        let (sid, vp) = rcane.best_effort();
        let be_pool = rcane.open_pool_trusted(sid, vp, BE_POOL).map_err(RcaneSetupError::Pool)?;
        Ok(Sched {
            rcane,
            be_pool,
            pools: HashMap::new(),
            vp_pools: HashMap::new(),
            pool_specs: HashMap::new(),
            by_principal: HashMap::new(),
            suspended: HashMap::new(),
            credentials: HashMap::new(),
            limiter: anode_sched::RequestLimiter::new(SESSION_REQUESTS_PER_SEC, SESSION_REQUEST_BURST, 4096),
            sa_seen: HashMap::new(),
            grace_ms: DEFAULT_SESSION_GRACE_MS,
            gone_check_at: None,
            tx: anode_sched::ByteBuckets::new(MAX_TX_BUCKETS),
            tx_default: DEFAULT_TX_BYTES_PER_SEC,
            rx: anode_sched::ByteBuckets::new(MAX_TX_BUCKETS),
            paced: Vec::new(),
            counters: SchedCounters::default(),
        })
    }

    /// The scheduler's clock for a call that only has milliseconds (the
    /// daemon's clocks share one origin; never behind the scheduler).
    pub fn ns(&self, now_ms: u64) -> u64 {
        now_ms.saturating_mul(1_000_000).max(self.rcane.sched().now())
    }

    /// The pool a principal's module work goes to.
    fn pool_for(&self, p: Option<PrincipalId>) -> PoolId {
        p.and_then(|p| self.by_principal.get(&p)).and_then(|s| self.pools.get(s)).copied().unwrap_or(self.be_pool)
    }

    /// The pool of VP index `vp` of a principal's session, for a channel
    /// that names it: opened on first use; index 0, an index the session
    /// does not have, or no session: [`Sched::pool_for`] (remembered, so a
    /// flood for such a channel costs one lookup a packet, until the
    /// session's reservation changes: [`Sched::revalidate_vp_pools`]).
    fn pool_for_vp(&mut self, p: Option<PrincipalId>, vp: u8) -> PoolId {
        let Some(sid) = p.and_then(|p| self.by_principal.get(&p).copied()) else { return self.pool_for(p) };
        if vp == 0 {
            return self.pool_for(p);
        }
        if let Some(pool) = self.vp_pools.get(&(sid, vp)) {
            return *pool;
        }
        let now = self.rcane.sched().now();
        let id = self.rcane.session_info(sid, now).ok().and_then(|i| i.vps.get(usize::from(vp)).map(|v| v.0));
        let spec = self.pool_specs.get(&sid).copied();
        let pool = match (id, spec) {
            (Some(id), Some(spec)) => self.rcane.open_pool_trusted(sid, id, spec).unwrap_or(self.pool_for(p)),
            _ => self.pool_for(p),
        };
        self.vp_pools.insert((sid, vp), pool);
        pool
    }

    /// After session `sid`'s VPs changed: forgets the channel pools whose
    /// VP is gone or is no longer at their index (a removed VP took its
    /// pools with it), and the remembered fallbacks, so that the next
    /// packet for such a channel finds or opens the right pool.
    fn revalidate_vp_pools(&mut self, sid: SessionId) {
        let now = self.rcane.sched().now();
        let Ok(info) = self.rcane.session_info(sid, now) else {
            self.vp_pools.retain(|(s, _), _| *s != sid);
            return;
        };
        let main = self.pools.get(&sid).copied();
        self.vp_pools.retain(|(s, idx), pool| {
            if *s != sid {
                return true;
            }
            let vp_at = info.vps.get(usize::from(*idx)).map(|v| v.0);
            let pool_vp = info.pools.iter().find(|p| p.pool == *pool).map(|p| p.vp);
            Some(*pool) != main && vp_at.is_some() && vp_at == pool_vp
        });
    }

    /// The session a principal's work is charged to.
    pub fn session_of(&self, owner: Owner) -> SessionId {
        match owner {
            Owner::System => self.rcane.system().0,
            Owner::BestEffort => self.rcane.best_effort().0,
            Owner::Principal(p) => self.by_principal.get(&p).copied().unwrap_or(self.rcane.best_effort().0),
        }
    }

    /// Records that `principal`'s session `sid` exists, with a module pool
    /// on its first VP.
    pub fn session_opened(&mut self, principal: PrincipalId, sid: SessionId, spec: PoolSpec) {
        let Ok(info) = self.rcane.session_info(sid, self.rcane.sched().now()) else { return };
        let Some((vp, _)) = info.vps.first().copied() else { return };
        if let Ok(pool) = self.rcane.open_pool_trusted(sid, vp, spec) {
            self.pools.insert(sid, pool);
            self.pool_specs.insert(sid, spec);
            self.by_principal.entry(principal).or_insert(sid);
        }
    }

    /// Queues `job` on `pool`, counting it as posted or, when the pool is
    /// full, refused.
    fn post(&mut self, pool: PoolId, job: Job) -> Result<(), PostRefusal> {
        let now = self.rcane.sched().now();
        match self.rcane.post(pool, job, now) {
            Ok(()) => {
                self.counters.jobs_posted += 1;
                Ok(())
            }
            Err(e) => {
                self.counters.jobs_refused_full += u64::from(e.reason == PostRefusal::Full);
                Err(e.reason)
            }
        }
    }

    /// Marks a job of `pool` finished (run, refused by the sandbox, or
    /// nothing to run).
    fn job_done(&mut self, pool: PoolId) {
        self.counters.jobs_done += 1;
        let now = self.rcane.sched().now();
        let _ = self.rcane.finish_event(pool, now);
    }

    /// Takes `bytes` of `p`'s transmit allowance: its best-effort rate plus
    /// its session's transmit reservation, in bursts of a tenth of a second
    /// (64 KiB at least). `false`: over the limit, do not send.
    pub fn tx_allow(&mut self, p: PrincipalId, bytes: u64, now_ns: u64) -> bool {
        let reserved = self.by_principal.get(&p).map_or(0, |sid| self.rcane.tx_reserved(*sid));
        let rate = self.tx_default.saturating_add(reserved);
        let burst = (rate / 10).max(64 << 10);
        self.tx.take(p, (rate, burst), bytes, now_ns)
    }

    /// Takes `bytes` of `p`'s receive allowance for its channels: a
    /// session with a receive reservation is policed at it, in bursts of a
    /// tenth of a second (64 KiB at least); a principal without one is not
    /// (its channels' FIFOs and its VPs bound it). `false`: drop.
    pub fn rx_allow(&mut self, p: PrincipalId, bytes: u64, now_ns: u64) -> bool {
        let rate = self.by_principal.get(&p).map_or(0, |sid| self.rcane.rx_reserved(*sid));
        if rate == 0 {
            self.rx.remove(&p);
            return true;
        }
        let burst = (rate / 10).max(64 << 10);
        self.rx.take(p, (rate, burst), bytes, now_ns)
    }

    /// Takes the suspended task of `principal`, if one holds its store.
    fn take_suspended_of(&mut self, principal: PrincipalId) -> Option<(VpId, PoolId, Task)> {
        let vp = self.suspended.iter().find(|(_, (_, t))| t.principal() == principal).map(|(vp, _)| *vp)?;
        self.suspended.remove(&vp).map(|(pool, t)| (vp, pool, t))
    }

    /// Takes the jobs queued on session `sid`'s module pool (before it is
    /// closed), to be posted again on Best-Effort's.
    fn take_session_jobs(&mut self, sid: SessionId) -> Vec<Job> {
        let now = self.rcane.sched().now();
        let vp_pools = self.vp_pools.iter().filter(|((s, _), _)| *s == sid).map(|(_, p)| *p);
        let pools: Vec<PoolId> = self.pools.get(&sid).copied().into_iter().chain(vp_pools).collect();
        pools.into_iter().flat_map(|p| self.rcane.take_queued(p, now)).collect()
    }

    /// Posts jobs on Best-Effort's module pool (refusals are counted).
    fn post_best_effort(&mut self, jobs: Vec<Job>) {
        for j in jobs {
            let _ = self.post(self.be_pool, j);
        }
    }

    /// Forgets a closed session whose VPs were `vps` (its pools went with
    /// it); returns its suspended tasks, which the caller runs to their end
    /// (bounded by their fuel) so that their stores come back.
    pub fn session_closed(&mut self, sid: SessionId, vps: &[VpId]) -> Vec<Task> {
        self.pools.remove(&sid);
        self.vp_pools.retain(|(s, _), _| *s != sid);
        self.pool_specs.remove(&sid);
        self.sa_seen.remove(&sid);
        self.credentials.remove(&sid);
        self.by_principal.retain(|_, s| *s != sid);
        vps.iter().filter_map(|vp| self.suspended.remove(vp)).map(|(_, t)| t).collect()
    }
}

impl Node {
    /// Turns on RCANE scheduling of module work (the daemon does, at
    /// start): alarms and channel packets become events on their
    /// principals' pools, run by [`Node::run_dispatch`]. `now_ns` is the
    /// time base of the scheduling calls (monotonic ns).
    pub fn enable_rcane(&mut self, cfg: RcaneConfig, now_ns: u64) -> Result<(), RcaneSetupError> {
        self.sched = Some(Box::new(Sched::new(cfg, now_ns)?));
        if let Some(m) = self.modules.as_mut() {
            m.sb.defer_capsules(true);
        }
        Ok(())
    }

    /// How long a principal's session outlives its last security
    /// association with this node (ms; default
    /// [`DEFAULT_SESSION_GRACE_MS`]). Past it the session is closed with
    /// reason `principal-gone`.
    pub fn set_session_grace_ms(&mut self, ms: u64) {
        if let Some(s) = self.sched.as_mut() {
            s.grace_ms = ms;
        }
    }

    /// Every principal's best-effort transmit allowance for its modules'
    /// packets, bytes per second (default [`DEFAULT_TX_BYTES_PER_SEC`]); a
    /// session's transmit reservation adds to it.
    pub fn set_tx_allowance(&mut self, bytes_per_sec: u64) {
        if let Some(s) = self.sched.as_mut() {
            s.tx_default = bytes_per_sec;
        }
    }

    /// Marks the interfaces whose transmissions the daemon schedules per
    /// link (`rate_bps`): their bytes are charged to the sending session
    /// when the link scheduler sends them ([`charge_sent`](Self::charge_sent)),
    /// so that what a full queue dropped is not charged.
    pub fn set_paced(&mut self, paced: Vec<bool>) {
        if let Some(s) = self.sched.as_mut() {
            s.paced = paced;
        }
    }

    /// Charges `packets` datagrams of `bytes` that a paced link sent for
    /// `owner` to its session (nothing without RCANE).
    pub fn charge_sent(&mut self, owner: Owner, packets: u64, bytes: u64) {
        if let Some(s) = self.sched.as_mut() {
            let sid = s.session_of(owner);
            let _ = s.rcane.charge_tx(sid, packets, bytes);
        }
    }

    /// The transmit reservation of `p`'s session, bytes/s (0: none, or
    /// RCANE off).
    pub fn tx_reserved_of(&self, p: PrincipalId) -> u64 {
        let Some(s) = self.sched.as_ref() else { return 0 };
        s.by_principal.get(&p).map_or(0, |sid| s.rcane.tx_reserved(*sid))
    }

    /// The transmit reservation of one of `p`'s flows, bytes/s: of its
    /// channel `flow` (what it reserved with `net.channel_tx`, 0 if
    /// nothing), or with `None` of the rest of its packets (its session's
    /// reservation less what its channels reserve). What a paced link
    /// turns into each flow's guarantee.
    pub fn flow_tx_of(&self, p: PrincipalId, flow: Option<anode_sandbox::Flow>) -> u64 {
        let (rest, own) = self.flow_txs_of(p, flow);
        if flow.is_some() { own } else { rest }
    }

    /// Both reservations of [`Node::flow_tx_of`] at once, bytes/s: of the
    /// rest of `p`'s packets, and of its channel `flow` (0 without one).
    pub fn flow_txs_of(&self, p: PrincipalId, flow: Option<anode_sandbox::Flow>) -> (u64, u64) {
        let session = self.tx_reserved_of(p);
        if session == 0 {
            return (0, 0);
        }
        let (channels, own) = self.modules.as_ref().map_or((0, 0), |m| m.sb.flow_tx(&p, flow));
        (session.saturating_sub(channels), own.min(session))
    }

    /// Whether RCANE scheduling is on.
    pub fn rcane_on(&self) -> bool {
        self.sched.is_some()
    }

    /// Scheduling counters, when RCANE is on.
    pub fn sched_counters(&self) -> Option<SchedCounters> {
        self.sched.as_ref().map(|s| s.counters)
    }

    /// The resource-control core, when on (read-only).
    pub fn rcane(&self) -> Option<&Rcane<Job>> {
        self.sched.as_ref().map(|s| &s.rcane)
    }

    /// The resource-control core, when on.
    pub fn rcane_mut(&mut self) -> Option<&mut Rcane<Job>> {
        self.sched.as_mut().map(|s| &mut s.rcane)
    }

    /// Queues module jobs on their principals' pools (or runs them inline
    /// when RCANE is off).
    pub(super) fn post_jobs(&mut self, jobs: &mut Vec<Job>, out: &mut Outbox) {
        if jobs.is_empty() {
            return;
        }
        if self.sched.is_none() {
            let now = self.now_ms;
            let mark = out.transmits.len();
            self.with_sandbox(now, out, |sb, now, a| {
                for job in jobs.drain(..) {
                    if let Ok(Some(t)) = sb.start(now, job) {
                        let _ = sb.resume(t, &mut || true, a);
                    }
                }
            });
            self.protect(&mut [], out, mark, now);
            return;
        }
        let principals: Vec<Option<PrincipalId>> =
            jobs.iter().map(|j| self.modules.as_ref().and_then(|m| m.sb.job_principal(j))).collect();
        let Some(s) = self.sched.as_mut() else { return };
        for (job, p) in jobs.drain(..).zip(principals) {
            // A packet for a principal's channel, or its capsule, was
            // received for it: charged to its session (if it has one).
            if matches!(job.kind, anode_sandbox::JobKind::Channel { .. } | anode_sandbox::JobKind::Capsule { .. })
                && let Some(sid) = p.and_then(|p| s.by_principal.get(&p).copied())
            {
                let bytes = job.input.len() as u64;
                let _ = s.rcane.charge_rx(sid, 1, bytes);
                out.rx_for = p;
            }
            let pool = s.pool_for_vp(p, job.vp);
            if s.post(pool, job).is_err() {
                self.counters.drop(crate::counters::Drop::PoolFull);
            }
        }
    }

    /// Hands the scheduler's completed-period records to `f` (and forgets
    /// them).
    pub fn drain_periods(&mut self, f: &mut dyn FnMut(anode_sched::PeriodRecord)) {
        if let Some(s) = self.sched.as_mut() {
            for r in s.rcane.drain_periods() {
                f(r);
            }
        }
    }

    /// What every session used since the last call, and the sessions
    /// opened and closed: for the ledger.
    pub fn drain_charges(&mut self, now_ns: u64) -> (Vec<anode_sched::Charge>, Vec<anode_sched::SessionEvent>) {
        let Some(s) = self.sched.as_mut() else { return (Vec::new(), Vec::new()) };
        let now_ns = now_ns.max(s.rcane.sched().now());
        let c = s.rcane.drain_charges(now_ns);
        let e = s.rcane.drain_events().collect();
        (c, e)
    }

    /// Which VP runs now, and for how long (`None`: no module work is
    /// runnable; sleep until [`Node::sched_poll_at`]).
    pub fn pick(&mut self, now_ns: u64) -> Option<Dispatch> {
        self.sched.as_mut()?.rcane.pick(now_ns)
    }

    /// Module jobs posted to the scheduler so far (0 with RCANE off): a
    /// data path worker that sees it grow wakes the event loop, which
    /// dispatches them.
    pub fn jobs_posted(&self) -> u64 {
        self.sched.as_ref().map_or(0, |s| s.counters.jobs_posted)
    }

    /// When the scheduler next needs the CPU (a budget replenished, a
    /// credential expiring), monotonic ns.
    pub fn sched_poll_at(&self) -> Option<u64> {
        self.sched.as_ref()?.rcane.poll_at()
    }

    /// The earliest of [`poll_at`](Self::poll_at) (in ns) and
    /// [`sched_poll_at`](Self::sched_poll_at): when the caller must next
    /// wake for the core, monotonic ns.
    pub fn next_due_ns(&self) -> Option<u64> {
        [self.poll_at().map(|ms| ms.saturating_mul(1_000_000)), self.sched_poll_at()].into_iter().flatten().min()
    }

    /// Runs the dispatched VP's work, its suspended task first, then jobs
    /// from its pools, until `keep_going` says stop (the daemon's budget
    /// check, asked at every preemption point and between jobs) or no work
    /// is left. Returns the jobs finished.
    pub fn run_dispatch(
        &mut self,
        d: &Dispatch,
        now_ms: u64,
        keep_going: &mut dyn FnMut() -> bool,
        out: &mut Outbox,
    ) -> usize {
        self.set_now(now_ms);
        if self.tap_dispatch(d) {
            return 0;
        }
        let Some(s) = self.sched.as_mut() else { return 0 };
        s.counters.dispatches += 1;
        let mark = out.transmits.len();
        let mut done = 0;
        while let Some(s) = self.sched.as_mut() {
            let (pool, task) = match s.suspended.remove(&d.vp) {
                Some(x) => x,
                None => {
                    let Some(pool) = s.rcane.pools_with_work(d.vp).next() else { break };
                    // A session's VPs share its principal's store (its heap):
                    // when the next job's store is held by an invocation
                    // suspended on another VP, this VP runs that invocation
                    // first, on its own budget, rather than dropping the job.
                    // It is RCANE's one-session case of Fig. 16: B does A's
                    // work and is served late. Only one principal's VPs can
                    // help each other: another principal has its own store.
                    let holder = match (s.rcane.peek_event(pool), self.modules.as_ref()) {
                        (Some(job), Some(m)) => m.sb.job_principal(job),
                        _ => None,
                    };
                    if let Some(p) = holder
                        && let Some(s) = self.sched.as_mut()
                        && let Some((other_vp, other_pool, task)) = s.take_suspended_of(p)
                    {
                        s.counters.jobs_helped += 1;
                        let step = self.with_sandbox(now_ms, out, |sb, _, a| sb.resume(task, keep_going, a));
                        let Some(s) = self.sched.as_mut() else { break };
                        match step {
                            Some(Step::Yielded(t)) => {
                                s.counters.preemptions += 1;
                                s.suspended.insert(other_vp, (other_pool, t));
                                break;
                            }
                            _ => {
                                s.job_done(other_pool);
                                let now_ns = s.rcane.sched().now();
                                let _ = s.rcane.set_busy(other_vp, false, now_ns);
                                done += 1;
                                self.post_due_jobs(now_ms, out);
                                if !keep_going() {
                                    break;
                                }
                                continue;
                            }
                        }
                    }
                    let Some(s) = self.sched.as_mut() else { break };
                    let job = match s.rcane.take_event(d, pool) {
                        Ok(Some(j)) => j,
                        _ => break,
                    };
                    let started = self.with_sandbox(now_ms, out, |sb, now, _| sb.start(now, job));
                    match started {
                        Some(Ok(Some(t))) => (pool, t),
                        other => {
                            let Some(s) = self.sched.as_mut() else { break };
                            if matches!(other, Some(Err(InvokeError::Busy))) {
                                s.counters.jobs_busy += 1;
                            }
                            s.job_done(pool);
                            done += 1;
                            if !keep_going() {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            let step = self.with_sandbox(now_ms, out, |sb, _, a| sb.resume(task, keep_going, a));
            let Some(s) = self.sched.as_mut() else { break };
            match step {
                Some(Step::Yielded(t)) => {
                    s.counters.preemptions += 1;
                    s.suspended.insert(d.vp, (pool, t));
                    break;
                }
                _ => {
                    s.job_done(pool);
                    done += 1;
                    // An alarm the job set for now (a chain of work, as
                    // modules/burn re-arms at 0 ms) is posted at once, so
                    // its VP stays runnable rather than waiting for the
                    // daemon's next timer pass.
                    self.post_due_jobs(now_ms, out);
                    if !keep_going() {
                        break;
                    }
                }
            }
        }
        if let Some(s) = self.sched.as_mut() {
            let busy = s.suspended.contains_key(&d.vp);
            let now_ns = s.rcane.sched().now();
            let _ = s.rcane.set_busy(d.vp, busy, now_ns);
        }
        self.charge_transmits(out, mark);
        self.protect(&mut [], out, mark, now_ms);
        done
    }

    /// Posts the module alarms due at `now_ms` as jobs on their pools.
    pub(super) fn post_due_jobs(&mut self, now_ms: u64, out: &mut Outbox) {
        if self.modules.as_ref().is_some_and(|m| m.sb.poll_at().is_some_and(|t| t <= now_ms)) {
            let mut jobs = Vec::new();
            self.with_sandbox(now_ms, out, |sb, now, _| sb.due_jobs(now, &mut jobs));
            self.post_jobs(&mut jobs, out);
        }
    }

    /// Charges what a dispatch used, measured on the thread CPU clock.
    pub fn charge(&mut self, d: &Dispatch, used_ns: u64, now_ns: u64) {
        if let Some(s) = self.sched.as_mut() {
            s.rcane.charge(d, used_ns, now_ns);
        }
    }

    /// Charges work done outside dispatches (a receive batch's share: its
    /// thread CPU time and the datagrams received) to `owner`'s session:
    /// System, Best-Effort, or the principal's (Best-Effort's without one).
    pub fn charge_outside(&mut self, owner: Owner, used_ns: u64, rx_packets: u64, rx_bytes: u64) {
        if let Some(s) = self.sched.as_mut() {
            let sid = s.session_of(owner);
            let _ = s.rcane.charge_cpu(sid, used_ns, anode_sched::DispatchKind::Guaranteed);
            let _ = s.rcane.charge_rx(sid, rx_packets, rx_bytes);
        }
    }

    /// Charges the transmissions queued since `mark` to their owners' sessions.
    pub(super) fn charge_transmits(&mut self, out: &Outbox, mark: usize) {
        let Some(s) = self.sched.as_mut() else { return };
        for t in out.transmits.iter().skip(mark) {
            if s.paced.get(t.iface).copied().unwrap_or(false) {
                continue;
            }
            let len = match &t.data {
                super::Data::Input(r) | super::Data::Arena(r) => r.len() as u64,
            };
            let sid = s.session_of(t.owner);
            let _ = s.rcane.charge_tx(sid, 1, len);
        }
    }
}

/// Session requests per second per principal, and their burst (a flood is
/// refused with `RateLimited`; what it cost is charged to System).
pub const SESSION_REQUESTS_PER_SEC: u32 = 20;
/// Burst of session requests.
pub const SESSION_REQUEST_BURST: u32 = 40;

/// The amounts a request would leave the session holding, as the
/// credential's attenuation checks see them.
fn amounts(
    current: &[(VpId, anode_sched::VpParams)],
    heap: u64,
    tx: u64,
    rx: u64,
    req: &anode_sched::ReserveRequest,
) -> anode_cred::SessionRequest {
    use anode_sched::VpOp;
    let mut vps: Vec<(Option<VpId>, anode_sched::VpParams)> = current.iter().map(|(v, p)| (Some(*v), *p)).collect();
    for op in &req.vps {
        match op {
            VpOp::Add(p) => vps.push((None, *p)),
            VpOp::Change(id, p) => {
                for v in vps.iter_mut().filter(|v| v.0 == Some(*id)) {
                    v.1 = *p;
                }
            }
            VpOp::Remove(id) => vps.retain(|v| v.0 != Some(*id)),
        }
    }
    anode_cred::SessionRequest {
        vp_share_ppm: vps.iter().map(|v| v.1.share_ppm()).max().unwrap_or(0),
        total_share_ppm: vps.iter().map(|v| v.1.share_ppm()).fold(0, u64::saturating_add),
        vps: vps.len() as u32,
        extra: vps.iter().any(|v| v.1.extra),
        heap_bytes: req.heap_bytes.unwrap_or(heap),
        tx_bytes_per_sec: req.tx_bytes_per_sec.unwrap_or(tx),
        rx_bytes_per_sec: req.rx_bytes_per_sec.unwrap_or(rx),
        pools: 1,
        queued_events: SESSION_POOL_QUEUE,
    }
}

/// Events a session's module pool holds.
pub const SESSION_POOL_QUEUE: u32 = 1024;

fn ceilings(c: &anode_cred::SessionCeilings) -> anode_sched::Ceilings {
    anode_sched::Ceilings {
        max_vp_share_ppm: c.max_vp_share_ppm,
        max_total_share_ppm: c.max_total_share_ppm,
        max_vps: c.max_vps,
        extra: c.extra,
        max_heap_bytes: c.max_heap_bytes,
        max_tx_bytes_per_sec: c.max_tx_bytes_per_sec,
        max_rx_bytes_per_sec: c.max_rx_bytes_per_sec,
        max_pools: c.max_pools,
        max_queued_events: c.max_queued_events,
    }
}

impl Node {
    /// A session control message (ops 0x10-0x14) from the principal `from`,
    /// authenticated by its SA: the reply's bytes.
    pub(crate) fn session_request(&mut self, from: PrincipalId, body: &[u8], now_ms: u64) -> Vec<u8> {
        use anode_sched::wire::{ErrorCode, Reply, Request, SessionSummary};
        let reply = (|| {
            let Some(s) = self.sched.as_mut() else {
                return Reply::Error { code: ErrorCode::Internal, detail: 0 };
            };
            s.counters.session_requests += 1;
            let now_ns = s.ns(now_ms);
            let p = anode_sched::PrincipalId(from.0);
            if let Err(r) = s.limiter.check(p, now_ns) {
                s.counters.session_rate_limited += 1;
                return Reply::Error { code: ErrorCode::RateLimited, detail: r.retry_after_ns };
            }
            let req = match Request::parse_bytes(body) {
                Ok(r) => r,
                Err(_) => return Reply::Error { code: ErrorCode::Malformed, detail: 0 },
            };
            match req {
                Request::Open { credential, reservation } => {
                    self.open_session(from, &credential, &reservation, true, now_ms)
                }
                Request::Reserve { session, reservation } => self.reserve_session(from, session, &reservation, now_ms),
                Request::Close { session } => {
                    let Some(s) = self.sched.as_mut() else {
                        return Reply::Error { code: ErrorCode::Internal, detail: 0 };
                    };
                    let vps = s.rcane.session_info(session, now_ns).map(|i| i.vps).unwrap_or_default();
                    let owned = s.rcane.show(&p, session, now_ns).is_ok();
                    let moved = if owned { s.take_session_jobs(session) } else { Vec::new() };
                    match s.rcane.close_session(&p, session, now_ns) {
                        Ok(c) => {
                            s.post_best_effort(moved);
                            self.session_gone(session, &vps, now_ms);
                            tracing::info!(session = %session, principal = %from, "session closed by its principal");
                            Reply::closed(&c)
                        }
                        Err(e) => Reply::error(&e),
                    }
                }
                Request::List => Reply::Sessions(s.rcane.list(&p, now_ns).iter().map(SessionSummary::from).collect()),
                Request::Show { session } => match s.rcane.show(&p, session, now_ns) {
                    Ok(i) => Reply::Sessions(vec![SessionSummary::from(&i)]),
                    Err(e) => Reply::error(&e),
                },
            }
        })();
        if let (Some(s), Reply::Error { .. } | Reply::Refused { .. } | Reply::BadVp { .. }) =
            (self.sched.as_mut(), &reply)
        {
            s.counters.session_refused += 1;
        }
        if matches!(reply, Reply::Granted { .. } | Reply::Closed { .. }) {
            self.sync_session_reservations();
        }
        reply.to_bytes().unwrap_or_default()
    }

    /// Gives the sandbox each principal's session heap and transmit
    /// reservations (of the session its modules run in, when it reserved
    /// them), and clears those of principals whose session is gone or
    /// reserves none.
    pub(super) fn sync_session_reservations(&mut self) {
        let Some(s) = self.sched.as_mut() else { return };
        let now_ns = s.rcane.sched().now();
        let pairs: Vec<(PrincipalId, SessionId)> = s.by_principal.iter().map(|(p, sid)| (*p, *sid)).collect();
        let mut want: HashMap<PrincipalId, usize> = HashMap::new();
        let mut want_tx: HashMap<PrincipalId, u64> = HashMap::new();
        for (p, sid) in pairs {
            if let Ok(i) = s.rcane.session_info(sid, now_ns) {
                if i.heap_bytes > 0 {
                    want.insert(p, usize::try_from(i.heap_bytes).unwrap_or(usize::MAX));
                }
                if i.tx_bytes_per_sec > 0 {
                    want_tx.insert(p, i.tx_bytes_per_sec);
                }
            }
        }
        let Some(m) = self.modules.as_mut() else { return };
        let had = m.sb.session_heap_principals();
        sync_reservations(had, want, |p, b| m.sb.set_session_heap(p, b));
        let had = m.sb.session_tx_principals();
        sync_reservations(had, want_tx, |p, b| m.sb.set_session_tx(p, b));
    }

    fn authorize_session(
        &mut self,
        from: PrincipalId,
        credential: &[u8],
        req: &anode_cred::SessionRequest,
        now_ms: u64,
    ) -> Result<(anode_sched::Ceilings, Option<u64>), anode_sched::wire::Reply> {
        use anode_sched::wire::{ErrorCode, Reply};
        let Some(m) = self.modules.as_mut() else {
            return Err(Reply::Error { code: ErrorCode::CredentialRefused, detail: 0 });
        };
        let now = m.now(now_ms);
        match m.sb.verifier_mut().authorize_session(now.wall, credential, from, req) {
            Ok(g) => {
                let now_ns = self.sched.as_ref().map_or(0, |s| s.ns(now_ms));
                let expires = g.recheck_at.map(|t| {
                    let d = t.duration_since(now.wall).map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64);
                    now_ns.saturating_add(d)
                });
                Ok((ceilings(&g.ceilings), expires))
            }
            Err(anode_cred::CredError::Expired { .. }) => {
                Err(Reply::Error { code: ErrorCode::CredentialExpired, detail: 0 })
            }
            Err(anode_cred::CredError::LimitExceeded { resource, requested, allowed }) => {
                let r = match resource {
                    "vp_share" => anode_sched::Resource::VpShare,
                    "total_share" => anode_sched::Resource::Cpu,
                    "vps" => anode_sched::Resource::Vps,
                    "extra" => anode_sched::Resource::Extra,
                    "heap" => anode_sched::Resource::Heap,
                    "tx" => anode_sched::Resource::Tx,
                    "rx" => anode_sched::Resource::Rx,
                    "pools" => anode_sched::Resource::Pools,
                    _ => anode_sched::Resource::QueuedEvents,
                };
                let left = self.sched.as_ref().map_or(0, |s| s.rcane.left(r));
                Err(Reply::Refused { resource: r, by: anode_sched::Limit::Credential, asked: requested, left, allowed })
            }
            Err(e) => {
                tracing::debug!(principal = %from, reason = %e, "session credential refused");
                Err(Reply::Error { code: ErrorCode::CredentialRefused, detail: 0 })
            }
        }
    }

    /// Opens a session from the configuration (`[[modules.session]]`),
    /// before anything else runs: decided by its credential and admitted as
    /// one opened over the network, but never closed as `principal-gone`.
    ///
    /// # Errors
    /// [`StaticSessionError`] with the node's answer when it is refused.
    pub fn open_static_session(
        &mut self,
        principal: PrincipalId,
        credential: &[u8],
        vps: &[anode_sched::VpParams],
        now_ms: u64,
    ) -> Result<SessionId, StaticSessionError> {
        let req = anode_sched::ReserveRequest {
            vps: vps.iter().map(|v| anode_sched::VpOp::Add(*v)).collect(),
            ..Default::default()
        };
        match self.open_session(principal, credential, &req, false, now_ms) {
            anode_sched::wire::Reply::Granted { session, .. } => {
                self.sync_session_reservations();
                Ok(session)
            }
            other => Err(StaticSessionError { principal, answer: format!("{other:?}") }),
        }
    }

    fn open_session(
        &mut self,
        from: PrincipalId,
        credential: &[u8],
        req: &anode_sched::ReserveRequest,
        track_sa: bool,
        now_ms: u64,
    ) -> anode_sched::wire::Reply {
        use anode_sched::wire::Reply;
        let want = amounts(&[], 0, 0, 0, req);
        let (ceil, expires) = match self.authorize_session(from, credential, &want, now_ms) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let Some(s) = self.sched.as_mut() else { return Reply::error(&anode_sched::RcaneError::Builtin) };
        let now_ns = s.ns(now_ms);
        match s.rcane.open_session(anode_sched::PrincipalId(from.0), ceil, expires, req, now_ns) {
            Ok(g) => {
                let spec =
                    PoolSpec { max_queued: SESSION_POOL_QUEUE.min(ceil.max_queued_events.max(1)), max_in_progress: 1 };
                s.session_opened(from, g.session, spec);
                s.credentials.insert(g.session, credential.to_vec());
                // The request came over an SA of `from`: the session lives
                // while it (or a later one) does, plus the grace period.
                if let Some(key) = anode_sec::PublicKey::from_bytes(&from.0).filter(|_| track_sa) {
                    let until = self.sec.as_ref().and_then(|g| g.links.sa_until(&key)).unwrap_or(now_ms);
                    s.sa_seen.insert(g.session, (key, until));
                    let at = until.saturating_add(s.grace_ms);
                    s.gone_check_at = Some(s.gone_check_at.map_or(at, |t| t.min(at)));
                }
                tracing::info!(session = %g.session, principal = %from, vps = g.added.len(), "session opened");
                Reply::granted(&g)
            }
            Err(e) => Reply::error(&e),
        }
    }

    fn reserve_session(
        &mut self,
        from: PrincipalId,
        sid: SessionId,
        req: &anode_sched::ReserveRequest,
        now_ms: u64,
    ) -> anode_sched::wire::Reply {
        use anode_sched::wire::Reply;
        let p = anode_sched::PrincipalId(from.0);
        let Some(s) = self.sched.as_mut() else { return Reply::error(&anode_sched::RcaneError::Builtin) };
        let now_ns = s.ns(now_ms);
        let info = match s.rcane.show(&p, sid, now_ns) {
            Ok(i) => i,
            Err(e) => return Reply::error(&e),
        };
        // The credential's attenuation checks decide on the amounts the
        // change would leave; admission then checks the ceilings and the node.
        let want = amounts(&info.vps, info.heap_bytes, info.tx_bytes_per_sec, info.rx_bytes_per_sec, req);
        let cred = s.credentials.get(&sid).cloned().unwrap_or_default();
        if let Err(r) = self.authorize_session(from, &cred, &want, now_ms) {
            return r;
        }
        let Some(s) = self.sched.as_mut() else { return Reply::error(&anode_sched::RcaneError::Builtin) };
        match s.rcane.reserve(&p, sid, req, now_ns) {
            Ok(g) => {
                s.revalidate_vp_pools(sid);
                Reply::granted(&g)
            }
            Err(e) => Reply::error(&e),
        }
    }

    /// A module's `session.heap_request`: decided as the control path's
    /// `anode session reserve --heap` is (the session credential's ceiling,
    /// then admission against the node's heap capacity), by the principal's
    /// own session; granted, the sandbox's reservation follows at once.
    pub(super) fn module_heap_request(
        &mut self,
        principal: PrincipalId,
        module: anode_sandbox::ModuleId,
        bytes: u64,
        now_ms: u64,
    ) {
        let Some(sid) = self.sched.as_ref().and_then(|s| s.by_principal.get(&principal).copied()) else { return };
        let req = anode_sched::ReserveRequest { heap_bytes: Some(bytes), ..Default::default() };
        let reply = self.reserve_session(principal, sid, &req, now_ms);
        let granted = matches!(reply, anode_sched::wire::Reply::Granted { .. });
        tracing::debug!(%module, %principal, bytes, granted, "module heap request");
        if granted {
            self.sync_session_reservations();
        } else if let Some(s) = self.sched.as_mut() {
            s.counters.session_refused += 1;
        }
    }

    /// Runs `principal`'s suspended task to its end (bounded by its fuel),
    /// so that its store is free (a load for a principal whose module is
    /// preempted waits for it, rather than being refused). Returns whether
    /// there was one.
    pub(super) fn finish_suspended_of(&mut self, principal: PrincipalId, now_ms: u64, out: &mut Outbox) -> bool {
        let Some(s) = self.sched.as_mut() else { return false };
        let Some((vp, pool, task)) = s.take_suspended_of(principal) else { return false };
        self.with_sandbox(now_ms, out, |sb, _, a| sb.resume(task, &mut || true, a));
        if let Some(s) = self.sched.as_mut() {
            s.job_done(pool);
            let now_ns = s.rcane.sched().now();
            let _ = s.rcane.set_busy(vp, false, now_ns);
        }
        true
    }

    /// Cleans up after a closed session: its suspended tasks are run to
    /// their end (bounded by their fuel) so that their stores come back.
    fn session_gone(&mut self, sid: SessionId, vps: &[(VpId, anode_sched::VpParams)], now_ms: u64) {
        let ids: Vec<VpId> = vps.iter().map(|(v, _)| *v).collect();
        let Some(s) = self.sched.as_mut() else { return };
        let tasks = s.session_closed(sid, &ids);
        let mut out = Outbox::default();
        for t in tasks {
            self.with_sandbox(now_ms, &mut out, |sb, _, a| sb.resume(t, &mut || true, a));
        }
    }

    /// When [`close_gone_sessions`](Self::close_gone_sessions) has work.
    pub(super) fn gone_check_at(&self) -> Option<u64> {
        self.sched.as_ref().and_then(|s| s.gone_check_at)
    }

    /// Closes the sessions whose principal has held no security association
    /// with this node for the grace period (`principal-gone`), the same way
    /// as a session whose credential expired: its queued events move to
    /// Best-Effort, its suspended task is run to its end (bounded by its
    /// fuel) so that the principal's store comes back, and the close is
    /// logged and recorded with its reason.
    pub(super) fn close_gone_sessions(&mut self, now_ms: u64) {
        let Some(s) = self.sched.as_mut() else { return };
        if s.gone_check_at.is_none_or(|t| t > now_ms) {
            return;
        }
        let links = self.sec.as_ref().map(|g| &g.links);
        let grace = s.grace_ms;
        let mut next: Option<u64> = None;
        let mut gone = Vec::new();
        for (sid, (key, until)) in s.sa_seen.iter_mut() {
            if let Some(t) = links.and_then(|l| l.sa_until(key)) {
                *until = (*until).max(t);
            }
            let at = until.saturating_add(grace);
            if at <= now_ms {
                gone.push(*sid);
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        s.gone_check_at = next;
        let why =
            format!("its principal has had no security association with this node for the grace period ({grace} ms)");
        for sid in gone {
            self.end_session(sid, anode_sched::CloseReason::PrincipalGone, &why, now_ms);
        }
        self.sync_session_reservations();
    }

    /// Closes sessions whose credentials expired.
    pub(super) fn expire_sessions(&mut self, _out: &mut Outbox) {
        let now_ms = self.now_ms;
        let Some(s) = self.sched.as_mut() else { return };
        let now_ns = s.ns(now_ms);
        if s.rcane.next_expiry().is_none_or(|t| t > now_ns) {
            return;
        }
        let ids: Vec<SessionId> = s.rcane.sessions().collect();
        let due: Vec<SessionId> = ids
            .into_iter()
            .filter(|sid| {
                s.rcane.session_info(*sid, now_ns).is_ok_and(|i| i.expires_at_ns.is_some_and(|t| t <= now_ns))
            })
            .collect();
        for sid in due {
            self.end_session(sid, anode_sched::CloseReason::CredentialExpired, "its credential expired", now_ms);
        }
        self.sync_session_reservations();
    }

    /// Ends session `sid` for `reason` (the node's decision, not its
    /// principal's request): its queued events move to Best-Effort's pool,
    /// its suspended task runs to its end (bounded by its fuel) so that its
    /// store comes back, and the close is logged with `why`.
    fn end_session(&mut self, sid: SessionId, reason: anode_sched::CloseReason, why: &str, now_ms: u64) {
        let Some(s) = self.sched.as_mut() else { return };
        let now_ns = s.ns(now_ms);
        let vps = s.rcane.session_info(sid, now_ns).map(|i| i.vps).unwrap_or_default();
        let moved = s.take_session_jobs(sid);
        s.sa_seen.remove(&sid);
        let closed = s.rcane.close_session_for(sid, reason, now_ns).is_ok();
        s.post_best_effort(moved);
        if closed {
            tracing::info!(session = %sid, "session closed: {why}");
            self.session_gone(sid, &vps, now_ms);
        }
    }
}

impl Node {
    /// The `sessions` section of `anode status`: every session with its
    /// VPs (guarantee, share received over its recent periods), pools
    /// (queued, refused) and charges; `None` when RCANE is off.
    pub fn sessions_json(&mut self, now_ns: u64) -> Option<serde_json::Value> {
        use serde_json::json;
        let s = self.sched.as_mut()?;
        let now_ns = now_ns.max(s.rcane.sched().now());
        let ids: Vec<SessionId> = s.rcane.sessions().collect();
        let mut sessions = Vec::new();
        for sid in ids {
            let Ok(i) = s.rcane.session_info(sid, now_ns) else { continue };
            let vps: Vec<serde_json::Value> = i
                .vps
                .iter()
                .map(|(vp, p)| {
                    let (mut periods, mut slice, mut got, mut met) = (0u64, 0u64, 0u64, 0u64);
                    if let Ok(recent) = s.rcane.sched().recent_periods(*vp) {
                        for r in recent {
                            periods += 1;
                            slice += r.slice_ns;
                            got += r.received_ns;
                            met += u64::from(r.honoured(0.95));
                        }
                    }
                    let info = s.rcane.sched().info(*vp).ok();
                    json!({
                        "vp": vp.to_string(),
                        "slice_ns": p.slice_ns, "period_ns": p.period_ns, "extra": p.extra,
                        "guaranteed_share": p.slice_ns as f64 / p.period_ns.max(1) as f64,
                        "recent_periods": periods,
                        "received_share_of_slice": if slice > 0 { got as f64 / slice as f64 } else { 0.0 },
                        "periods_with_95pct_of_slice": met,
                        "runnable": info.map(|x| x.runnable),
                        "received_ns_total": info.map(|x| {
                            json!({"guaranteed": x.totals.guaranteed_ns, "overrun": x.totals.overrun_ns,
                                   "slack": x.totals.slack_ns, "periods": x.totals.periods,
                                   "dispatches": x.totals.dispatches})
                        }),
                    })
                })
                .collect();
            let pools: Vec<serde_json::Value> = i
                .pools
                .iter()
                .map(|p| {
                    json!({"pool": p.pool.to_string(), "queued": p.queued, "in_progress": p.in_progress,
                           "max_queued": p.spec.max_queued, "stats": format!("{:?}", p.stats)})
                })
                .collect();
            let a = i.account;
            sessions.push(json!({
                "session": sid.to_string(),
                "owner": i.owner.to_string(),
                "share_ppm": i.share_ppm,
                "heap_bytes": i.heap_bytes,
                "expires_in_ms": i.expires_at_ns.map(|t| t.saturating_sub(now_ns) / 1_000_000),
                "vps": vps,
                "pools": pools,
                "charges": {
                    "cpu_guaranteed_ns": a.cpu_guaranteed_ns, "cpu_slack_ns": a.cpu_slack_ns,
                    "tx_packets": a.tx_packets, "tx_bytes": a.tx_bytes,
                    "rx_packets": a.rx_packets, "rx_bytes": a.rx_bytes,
                    "module_loads": a.module_loads, "heap_byte_seconds": (a.heap_byte_ns / 1_000_000_000) as u64,
                },
            }));
        }
        Some(json!({
            "counters": s.counters,
            "orphan_cpu_ns": s.rcane.orphan_cpu_ns(),
            "total_share_ppm": s.rcane.sched().total_share_ppm(),
            "sessions": sessions,
        }))
    }
}

/// Makes one of the sandbox's session reservation maps `want`: clears
/// (`set(p, None)`) the principals of `had` that `want` lacks, then sets
/// each of `want`.
fn sync_reservations<V>(
    had: Vec<PrincipalId>,
    want: HashMap<PrincipalId, V>,
    mut set: impl FnMut(PrincipalId, Option<V>),
) {
    for p in had.into_iter().filter(|p| !want.contains_key(p)) {
        set(p, None);
    }
    for (p, v) in want {
        set(p, Some(v));
    }
}
