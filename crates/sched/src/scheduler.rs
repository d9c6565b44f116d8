//! The CPU scheduler: virtual processors under EDF, with slack sharing
//! (RCANE §IV-C; the policy is Nemesis' Atropos, which RCANE ran on).
//!
//! A virtual processor (VP) is guaranteed `slice_ns` of CPU in every
//! `period_ns`; a VP with `extra` may also use slack. The scheduler holds the
//! VPs and answers one question, [`Scheduler::pick`]: which VP runs now, on
//! which kind of time, and for how long at most. The caller runs it (a wasm
//! invocation, a pool's events), measures the CPU it used with the thread
//! CPU clock and reports it with [`Scheduler::charge`]. Time is a `u64` of
//! nanoseconds passed in by the caller; nothing here reads a clock.
//!
//! # Policy
//! - **Guaranteed time, EDF.** Each runnable VP has a current period
//!   `[start, deadline)` and a remaining budget. Among runnable VPs with
//!   budget left, the earliest deadline runs. At its deadline a VP's next
//!   period begins with a fresh budget of `slice_ns`.
//! - **Slack.** When no runnable VP has budget, the CPU is slack. It goes to
//!   the runnable VPs that have `extra` (the Best-Effort VP has it), the one
//!   that has received the least slack first (a virtual time, as CFS keeps
//!   with equal weights; a VP that wakes starts at the smallest virtual time
//!   among the others, so sleeping earns no credit). A VP without `extra`
//!   never gets slack: it gets its slice and nothing more.
//! - **Dispatch length.** [`Dispatch::budget_ns`] is the remaining budget (or
//!   the slack quantum), cut at the next replenishment of any runnable VP,
//!   since that replenishment may preempt the running VP under EDF. The
//!   caller must come back by then; it usually can only stop at its next
//!   preemption point, so it may run a little longer.
//! - **Overruns.** CPU a guaranteed dispatch used beyond the VP's budget is
//!   a debt: the next periods start with `slice_ns - debt` (RCANE charges
//!   the overrunner, not the others). Leftover budget does not carry over.
//! - **Blocking and waking** (the constant-bandwidth-server wake rule): a VP
//!   that wakes keeps its current period and budget if it can still use the
//!   budget before the deadline without exceeding `slice/period`; otherwise
//!   a new period starts at the wake time. A VP therefore never gets more
//!   than its bandwidth by sleeping, which keeps EDF's utilisation bound
//!   (sum of slice/period ≤ 1) sufficient for every VP to meet its slice.
//!
//! # Records
//! Every completed period of a VP is a [`PeriodRecord`] (start, end, slice,
//! CPU received). The last [`SchedConfig::ring_len`] of each VP are kept for
//! `anode status`; all of them also go to a bounded log that the caller
//! drains ([`Scheduler::drain_periods`]) for the Fig. 11 trace; overflow of
//! that log is counted, never unbounded.
//!
//! # Cost
//! `pick` and `charge` are `O(log n)` in the number of runnable VPs (three
//! ordered sets: deadlines of VPs with budget, replenishment times, slack
//! virtual times), plus the replenishments that fell due.

use crate::handle::{Lookup, SessionId, Slab, VpId};
use std::collections::{BTreeSet, VecDeque};

/// The longest period a VP may have (one hour), so that budget arithmetic
/// in signed nanoseconds can never overflow.
pub const MAX_PERIOD_NS: u64 = 3_600_000_000_000;

/// A VP's guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VpParams {
    /// CPU time guaranteed in every period, in ns (`1..=period_ns`).
    pub slice_ns: u64,
    /// Period, in ns (`1..=`[`MAX_PERIOD_NS`]).
    pub period_ns: u64,
    /// Whether the VP may also run on slack time.
    pub extra: bool,
}

/// Why a time span or a VP's text form did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseVpError {
    /// Not `SLICE/PERIOD[+extra]`.
    #[error("bad VP {0:?}: expected SLICE/PERIOD[+extra], e.g. 400us/4ms")]
    Form(String),
    /// A span without a number or with an unknown unit.
    #[error("bad time span {0:?}: expected a number and ns, us, ms or s, e.g. 400us")]
    Span(String),
    /// A span too large for u64 nanoseconds.
    #[error("time span {0:?} is out of range")]
    Range(String),
}

/// A time span in nanoseconds from `4ms`, `500us` (or `µs`), `1.5s`,
/// `250000ns`: a decimal number and a unit, rounded to a nanosecond.
pub fn parse_span_ns(s: &str) -> Result<u64, ParseVpError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let mul: u64 = match unit {
        "ns" => 1,
        "us" | "µs" => 1000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(ParseVpError::Span(s.into())),
    };
    if n.is_empty() {
        return Err(ParseVpError::Span(s.into()));
    }
    if let Ok(v) = n.parse::<u64>() {
        return v.checked_mul(mul).ok_or_else(|| ParseVpError::Range(s.into()));
    }
    let v: f64 = n.parse().map_err(|_| ParseVpError::Span(s.into()))?;
    let r = (v * mul as f64).round();
    if !(0.0..1.8e19).contains(&r) {
        return Err(ParseVpError::Range(s.into()));
    }
    Ok(r as u64)
}

impl core::str::FromStr for VpParams {
    type Err = ParseVpError;

    /// `SLICE/PERIOD`, e.g. `400us/4ms`, with `+extra` appended for a VP
    /// that may use slack. Bounds are checked where the VP is admitted.
    fn from_str(s: &str) -> Result<VpParams, ParseVpError> {
        let (t, extra) = match s.trim().strip_suffix("+extra") {
            Some(t) => (t, true),
            None => (s.trim(), false),
        };
        let (slice, period) = t.split_once('/').ok_or_else(|| ParseVpError::Form(s.into()))?;
        Ok(VpParams { slice_ns: parse_span_ns(slice)?, period_ns: parse_span_ns(period)?, extra })
    }
}

impl VpParams {
    /// The guaranteed share in parts per million of one CPU, rounded up so
    /// that admission never undercounts.
    pub fn share_ppm(&self) -> u64 {
        if self.period_ns == 0 {
            return u64::MAX;
        }
        let n = u128::from(self.slice_ns) * 1_000_000;
        u64::try_from(n.div_ceil(u128::from(self.period_ns))).unwrap_or(u64::MAX)
    }

    fn check(&self) -> Result<(), SchedError> {
        if self.slice_ns == 0 || self.period_ns == 0 || self.slice_ns > self.period_ns || self.period_ns > MAX_PERIOD_NS
        {
            return Err(SchedError::BadParams(*self));
        }
        Ok(())
    }
}

/// Which kind of time a dispatch runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchKind {
    /// The VP's guaranteed budget (EDF).
    Guaranteed,
    /// Slack: time no guarantee needs.
    Slack,
}

/// The scheduler's decision: run `vp` for at most `budget_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Dispatch {
    /// The VP to run.
    pub vp: VpId,
    /// The session that owns it (the one to charge).
    pub owner: SessionId,
    /// How long the caller may run it before it must come back, in ns (≥ 1).
    pub budget_ns: u64,
    /// Guaranteed or slack time.
    pub kind: DispatchKind,
    /// The VP's current deadline (end of its period).
    pub deadline_ns: u64,
}

/// One interval of a VP's life: usually one period, or several periods the
/// VP was runnable in but got no CPU because the caller came back late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodRecord {
    /// The VP.
    pub vp: VpId,
    /// Its session.
    pub owner: SessionId,
    /// Start of the interval (ns, caller's clock).
    pub start_ns: u64,
    /// End of the interval.
    pub end_ns: u64,
    /// CPU guaranteed in the interval (`slice_ns`, times the number of
    /// periods for a gap record, pro rata for a period cut short by a
    /// parameter change or a wake-up).
    pub slice_ns: u64,
    /// CPU received in the interval, all kinds (guaranteed, overrun, slack).
    pub received_ns: u64,
    /// The part of `received_ns` that was slack.
    pub slack_ns: u64,
    /// Whether the VP was not runnable for some of the interval (then a
    /// shortfall is the VP's choice, not a broken guarantee).
    pub idle: bool,
}

impl PeriodRecord {
    /// Whether the VP received at least `fraction` of its slice, or did not
    /// want it (was idle for part of the interval).
    pub fn honoured(&self, fraction: f64) -> bool {
        self.idle || self.received_ns as f64 >= fraction * self.slice_ns as f64
    }
}

/// CPU a [`Scheduler::charge`] attributed, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charged {
    /// Taken from the VP's budget.
    pub guaranteed_ns: u64,
    /// Used beyond the budget on a guaranteed dispatch: a debt on the next
    /// periods.
    pub overrun_ns: u64,
    /// Slack.
    pub slack_ns: u64,
}

impl Charged {
    /// All of it.
    pub fn total_ns(&self) -> u64 {
        self.guaranteed_ns + self.overrun_ns + self.slack_ns
    }
}

/// A scheduler error. Only the trusted caller (the daemon) reaches these;
/// a principal's handles are checked by [`crate::Rcane`] first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// No VP with this index ever existed.
    #[error("unknown VP {0}")]
    UnknownVp(VpId),
    /// The VP was removed (its slot may hold another VP now).
    #[error("stale VP handle {0}")]
    StaleVp(VpId),
    /// Slice is zero or longer than the period, or the period is zero or
    /// longer than [`MAX_PERIOD_NS`].
    #[error("bad VP parameters: slice {} ns, period {} ns", .0.slice_ns, .0.period_ns)]
    BadParams(VpParams),
    /// All VP slots are in use.
    #[error("no free VP slot")]
    Full,
}

/// The budget and deadline of a VP whose parameters become `new` at `now`,
/// in a period (of `old`) with `remaining` left that ends at `deadline` >
/// `now`: with the same period, the period goes on and the budget moves by
/// the change of slice; with another, a period of `new` begins now with
/// what was left. Never more than the new slice; a debt carries over.
fn carried(old: VpParams, remaining: i64, deadline: u64, new: VpParams, now: u64) -> (i64, u64) {
    let slice = to_i64(new.slice_ns);
    if new.period_ns == old.period_ns {
        (remaining.saturating_add(slice - to_i64(old.slice_ns)).min(slice), deadline)
    } else {
        (remaining.min(slice), now.saturating_add(new.period_ns))
    }
}

fn lookup_err(vp: VpId) -> impl Fn(Lookup) -> SchedError {
    move |l| match l {
        Lookup::Unknown => SchedError::UnknownVp(vp),
        Lookup::Stale => SchedError::StaleVp(vp),
    }
}

/// Tuning of a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedConfig {
    /// Longest slack dispatch, in ns.
    pub slack_quantum_ns: u64,
    /// Completed-period records kept per VP for status.
    pub ring_len: usize,
    /// Capacity of the period log drained by [`Scheduler::drain_periods`]
    /// (0 disables it).
    pub period_log_capacity: usize,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig { slack_quantum_ns: 1_000_000, ring_len: 32, period_log_capacity: 65_536 }
    }
}

/// Lifetime totals of one VP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VpTotals {
    /// Guaranteed CPU received, ns.
    pub guaranteed_ns: u64,
    /// CPU used beyond the budget on guaranteed dispatches, ns.
    pub overrun_ns: u64,
    /// Slack CPU received, ns.
    pub slack_ns: u64,
    /// Completed periods (records).
    pub periods: u64,
    /// Dispatches.
    pub dispatches: u64,
}

#[derive(Debug, Clone)]
struct Vp {
    owner: SessionId,
    params: VpParams,
    runnable: bool,
    period_start: u64,
    deadline: u64,
    /// Budget left in this period; negative is a debt.
    remaining: i64,
    received: u64,
    slack_in_period: u64,
    idle_in_period: bool,
    vtime: u64,
    ring: VecDeque<PeriodRecord>,
    totals: VpTotals,
}

/// A read-only view of one VP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VpInfo {
    /// Owning session.
    pub owner: SessionId,
    /// Its guarantee.
    pub params: VpParams,
    /// Whether it has work.
    pub runnable: bool,
    /// Start of its current period.
    pub period_start_ns: u64,
    /// End of its current period.
    pub deadline_ns: u64,
    /// Budget left in the current period (negative: debt from an overrun).
    pub remaining_ns: i64,
    /// CPU received so far in the current period.
    pub received_ns: u64,
    /// Lifetime totals.
    pub totals: VpTotals,
}

/// The EDF scheduler over virtual processors. See the module documentation.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedConfig,
    vps: Slab<Vp>,
    /// `(deadline, index)` of runnable VPs with budget left.
    ready: BTreeSet<(u64, u32)>,
    /// `(deadline, index)` of every runnable VP: its next replenishment.
    timers: BTreeSet<(u64, u32)>,
    /// `(virtual slack time, index)` of runnable VPs with `extra`.
    slack: BTreeSet<(u64, u32)>,
    log: VecDeque<PeriodRecord>,
    log_dropped: u64,
    now: u64,
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(cfg: SchedConfig) -> Scheduler {
        Scheduler {
            cfg,
            vps: Slab::default(),
            ready: BTreeSet::new(),
            timers: BTreeSet::new(),
            slack: BTreeSet::new(),
            log: VecDeque::new(),
            log_dropped: 0,
            now: 0,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// The latest `now` seen. Time never goes backwards here: an earlier
    /// `now` passed in is taken as this one.
    pub fn now(&self) -> u64 {
        self.now
    }

    fn clock(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    /// Adds a VP (not runnable; its first period starts now). This does no
    /// admission control: that is [`crate::Rcane`]'s job.
    ///
    /// # Errors
    /// [`SchedError::BadParams`], or [`SchedError::Full`].
    pub fn add_vp(&mut self, owner: SessionId, params: VpParams, now: u64) -> Result<VpId, SchedError> {
        params.check()?;
        let now = self.clock(now);
        let vp = Vp {
            owner,
            params,
            runnable: false,
            period_start: now,
            deadline: now.saturating_add(params.period_ns),
            remaining: to_i64(params.slice_ns),
            received: 0,
            slack_in_period: 0,
            idle_in_period: true,
            vtime: 0,
            ring: VecDeque::new(),
            totals: VpTotals::default(),
        };
        self.vps.insert(vp).map_err(|_| SchedError::Full)
    }

    /// Removes a VP; its current period is recorded as cut short.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`].
    pub fn remove_vp(&mut self, id: VpId, now: u64) -> Result<VpInfo, SchedError> {
        let now = self.clock(now);
        self.vps.get(id).map_err(lookup_err(id))?;
        self.detach(id.index());
        self.cut_period(id.index(), now);
        let info = self.info(id)?;
        self.vps.remove(id).map_err(lookup_err(id))?;
        Ok(info)
    }

    /// Changes a VP's guarantee at `now` without giving it time it was not
    /// owed. The period so far is recorded as cut short. With the same
    /// period, the period goes on to its deadline and the budget left moves
    /// by the change of slice (at most the new slice); with another period,
    /// a new one begins now holding only what was left (at most the new
    /// slice), whole slices coming from its next period on. A debt carries
    /// over either way. So asking again and again (the same, less and back,
    /// another period and back) never refills a budget: before this, each
    /// change began a period with a whole slice, and a VP of 10 % that
    /// changed every 0.5 ms took 60 % of the CPU (test
    /// `changing_a_vps_parameters_over_and_over_takes_no_more_than_its_guarantee`).
    ///
    /// # Errors
    /// [`SchedError::BadParams`], [`SchedError::UnknownVp`], [`SchedError::StaleVp`].
    pub fn set_params(&mut self, id: VpId, params: VpParams, now: u64) -> Result<(), SchedError> {
        params.check()?;
        let now = self.clock(now);
        self.vps.get(id).map_err(lookup_err(id))?;
        let i = id.index();
        self.detach(i);
        // A period that ended before now ends (and refills) first, as it
        // would have at its deadline.
        self.roll(i, now);
        self.cut_period(i, now);
        if let Some(v) = self.vps.by_index_mut(i) {
            (v.remaining, v.deadline) = carried(v.params, v.remaining, v.deadline, params, now);
            v.params = params;
            v.period_start = now;
        }
        self.attach(i);
        Ok(())
    }

    /// Makes `id`, just added at `now`, go on with the period of a VP of
    /// the same principal removed before its deadline (`from`, as
    /// [`Scheduler::remove_vp`] returned it), by the rule of
    /// [`Scheduler::set_params`]: so that removing a VP and adding another,
    /// or closing a session and opening another, cannot begin a period with
    /// a whole slice either. Nothing changes if `from`'s period is over.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`].
    pub fn continue_lapsed(&mut self, id: VpId, from: &VpInfo, now: u64) -> Result<(), SchedError> {
        let now = self.clock(now);
        self.vps.get(id).map_err(lookup_err(id))?;
        if now >= from.deadline_ns {
            return Ok(());
        }
        let i = id.index();
        self.detach(i);
        if let Some(v) = self.vps.by_index_mut(i) {
            (v.remaining, v.deadline) = carried(from.params, from.remaining_ns, from.deadline_ns, v.params, now);
        }
        self.attach(i);
        Ok(())
    }

    /// Says whether a VP has work. A VP that becomes runnable follows the
    /// wake rule in the module documentation.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`].
    pub fn set_runnable(&mut self, id: VpId, runnable: bool, now: u64) -> Result<(), SchedError> {
        let now = self.clock(now);
        let v = self.vps.get(id).map_err(lookup_err(id))?;
        if v.runnable == runnable {
            return Ok(());
        }
        let i = id.index();
        self.detach(i);
        if runnable {
            self.wake(i, now);
        } else if let Some(v) = self.vps.by_index_mut(i) {
            v.runnable = false;
            v.idle_in_period = true;
        }
        self.attach(i);
        Ok(())
    }

    fn wake(&mut self, i: u32, now: u64) {
        // Periods that ended while the VP slept: close the one it slept in,
        // repay debt for the ones that passed; record no idle gaps.
        self.roll(i, now);
        let Some(v) = self.vps.by_index_mut(i) else { return };
        v.runnable = true;
        if v.period_start == now {
            // Not a moment of this period passed idle.
            v.idle_in_period = false;
        }
        // CBS wake rule: keep the budget only if it fits in the time left
        // at the VP's bandwidth: remaining * period <= (deadline - now) * slice.
        let left = u128::from(v.deadline.saturating_sub(now));
        let fits = v.remaining <= 0
            || (v.remaining as u128) * u128::from(v.params.period_ns) <= left * u128::from(v.params.slice_ns);
        if !fits {
            self.cut_period(i, now);
            if let Some(v) = self.vps.by_index_mut(i) {
                v.period_start = now;
                v.deadline = now.saturating_add(v.params.period_ns);
                v.remaining = to_i64(v.params.slice_ns);
                v.idle_in_period = false;
            }
        }
        // Slack fairness: sleeping earns no credit.
        let floor = self.slack.first().map(|&(t, _)| t);
        if let (Some(floor), Some(v)) = (floor, self.vps.by_index_mut(i)) {
            v.vtime = v.vtime.max(floor);
        }
    }

    /// Records the current period of VP `i` as ending at `now` (cut short),
    /// with a pro-rata slice. Does not start a new one.
    fn cut_period(&mut self, i: u32, now: u64) {
        let Some((generation, v)) = self.vps.by_index(i) else { return };
        let end = now.clamp(v.period_start, v.deadline);
        let len = end - v.period_start;
        let slice = if v.params.period_ns == 0 {
            0
        } else {
            u64::try_from(u128::from(v.params.slice_ns) * u128::from(len) / u128::from(v.params.period_ns))
                .unwrap_or(u64::MAX)
        };
        let rec = PeriodRecord {
            vp: VpId::new(i, generation),
            owner: v.owner,
            start_ns: v.period_start,
            end_ns: end,
            slice_ns: slice,
            received_ns: v.received,
            slack_ns: v.slack_in_period,
            idle: v.idle_in_period || !v.runnable,
        };
        if len > 0 || v.received > 0 {
            self.record(i, rec);
        }
        if let Some(v) = self.vps.by_index_mut(i) {
            v.received = 0;
            v.slack_in_period = 0;
            v.idle_in_period = !v.runnable;
        }
    }

    fn record(&mut self, i: u32, rec: PeriodRecord) {
        let ring_len = self.cfg.ring_len;
        if let Some(v) = self.vps.by_index_mut(i) {
            v.totals.periods += 1;
            if ring_len > 0 {
                if v.ring.len() >= ring_len {
                    v.ring.pop_front();
                }
                v.ring.push_back(rec);
            }
        }
        if self.cfg.period_log_capacity > 0 {
            if self.log.len() >= self.cfg.period_log_capacity {
                self.log_dropped += 1;
            } else {
                self.log.push_back(rec);
            }
        }
    }

    /// Moves VP `i` to the period that contains `now` (if its deadline has
    /// passed): records the period that ended, and for a runnable VP one gap
    /// record for whole periods it got nothing in. Constant time however far
    /// `now` jumped.
    fn roll(&mut self, i: u32, now: u64) {
        let Some((generation, v)) = self.vps.by_index(i) else { return };
        if now < v.deadline {
            return;
        }
        let (owner, p, deadline, runnable) = (v.owner, v.params, v.deadline, v.runnable);
        let rec = PeriodRecord {
            vp: VpId::new(i, generation),
            owner,
            start_ns: v.period_start,
            end_ns: deadline,
            slice_ns: p.slice_ns,
            received_ns: v.received,
            slack_ns: v.slack_in_period,
            idle: v.idle_in_period || !runnable,
        };
        self.record(i, rec);
        let skipped = (now - deadline) / p.period_ns;
        let start = deadline.saturating_add(skipped.saturating_mul(p.period_ns));
        if skipped > 0 && runnable {
            let gap = PeriodRecord {
                vp: rec.vp,
                owner,
                start_ns: deadline,
                end_ns: start,
                slice_ns: skipped.saturating_mul(p.slice_ns),
                received_ns: 0,
                slack_ns: 0,
                idle: false,
            };
            self.record(i, gap);
        }
        if let Some(v) = self.vps.by_index_mut(i) {
            let debt = u64::try_from((-v.remaining).max(0)).unwrap_or(0);
            let debt = debt.saturating_sub(skipped.saturating_mul(p.slice_ns));
            v.period_start = start;
            v.deadline = start.saturating_add(p.period_ns);
            v.remaining = to_i64(p.slice_ns) - to_i64(debt);
            v.received = 0;
            v.slack_in_period = 0;
            v.idle_in_period = !runnable;
        }
    }

    fn detach(&mut self, i: u32) {
        let Some((_, v)) = self.vps.by_index(i) else { return };
        let (deadline, vtime) = (v.deadline, v.vtime);
        self.ready.remove(&(deadline, i));
        self.timers.remove(&(deadline, i));
        self.slack.remove(&(vtime, i));
    }

    fn attach(&mut self, i: u32) {
        let Some((_, v)) = self.vps.by_index(i) else { return };
        if !v.runnable {
            return;
        }
        self.timers.insert((v.deadline, i));
        if v.remaining > 0 {
            self.ready.insert((v.deadline, i));
        }
        if v.params.extra {
            self.slack.insert((v.vtime, i));
        }
    }

    /// Replenishes every runnable VP whose deadline is at or before `now`.
    fn advance(&mut self, now: u64) {
        while let Some(&(t, i)) = self.timers.first() {
            if t > now {
                break;
            }
            self.detach(i);
            self.roll(i, now);
            self.attach(i);
        }
    }

    /// Which VP runs now, on which time, for how long at most; `None` if no
    /// VP is runnable with budget and no runnable VP may use slack (then
    /// sleep until [`poll_at`](Self::poll_at) or until a VP wakes).
    pub fn pick(&mut self, now: u64) -> Option<Dispatch> {
        let now = self.clock(now);
        self.advance(now);
        let next_timer = self.timers.first().map_or(u64::MAX, |&(t, _)| t);
        let until_timer = next_timer.saturating_sub(now).max(1);
        let (i, kind, budget) = if let Some(&(_, i)) = self.ready.first() {
            let (_, v) = self.vps.by_index(i)?;
            let remaining = u64::try_from(v.remaining).unwrap_or(1).max(1);
            (i, DispatchKind::Guaranteed, remaining.min(until_timer))
        } else {
            let &(_, i) = self.slack.first()?;
            (i, DispatchKind::Slack, self.cfg.slack_quantum_ns.max(1).min(until_timer))
        };
        let (generation, v) = self.vps.by_index(i)?;
        let (owner, deadline) = (v.owner, v.deadline);
        if let Some(v) = self.vps.by_index_mut(i) {
            v.totals.dispatches += 1;
        }
        Some(Dispatch { vp: VpId::new(i, generation), owner, budget_ns: budget, kind, deadline_ns: deadline })
    }

    /// Reports that `d.vp` ran for `used_ns` of CPU, ending at `now`. The run
    /// is taken to have been contiguous, ending at `now`: CPU before the
    /// VP's deadline counts in its current period, the rest in the period
    /// that contains `now`. CPU is taken from the budget first; beyond it, a
    /// slack dispatch of a VP with `extra` is slack, anything else is an
    /// overrun, a debt on the next periods.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`] (the VP was
    /// removed while it ran: nothing is charged here; the caller charges the
    /// session directly).
    pub fn charge(&mut self, d: &Dispatch, used_ns: u64, now: u64) -> Result<Charged, SchedError> {
        let now = self.clock(now);
        let id = d.vp;
        self.vps.get(id).map_err(lookup_err(id))?;
        let i = id.index();
        self.detach(i);
        let start = now.saturating_sub(used_ns);
        let mut out = Charged::default();
        // CPU before the current deadline.
        let deadline = self.vps.by_index(i).map_or(u64::MAX, |(_, v)| v.deadline);
        let before = used_ns.min(deadline.saturating_sub(start));
        self.consume(i, before, d.kind, &mut out);
        // The rest, in the period containing `now`.
        let after = used_ns - before;
        if after > 0 {
            self.roll(i, now);
            self.consume(i, after, d.kind, &mut out);
        }
        self.attach(i);
        self.advance(now);
        Ok(out)
    }

    fn consume(&mut self, i: u32, amount: u64, kind: DispatchKind, out: &mut Charged) {
        let Some(v) = self.vps.by_index_mut(i) else { return };
        let from_budget = if v.remaining > 0 { amount.min(v.remaining as u64) } else { 0 };
        let excess = amount - from_budget;
        v.remaining -= to_i64(from_budget);
        v.received = v.received.saturating_add(amount);
        v.totals.guaranteed_ns = v.totals.guaranteed_ns.saturating_add(from_budget);
        out.guaranteed_ns += from_budget;
        if excess > 0 {
            if kind == DispatchKind::Slack && v.params.extra {
                v.slack_in_period = v.slack_in_period.saturating_add(excess);
                v.vtime = v.vtime.saturating_add(excess);
                v.totals.slack_ns = v.totals.slack_ns.saturating_add(excess);
                out.slack_ns += excess;
            } else {
                v.remaining = v.remaining.saturating_sub(to_i64(excess));
                v.totals.overrun_ns = v.totals.overrun_ns.saturating_add(excess);
                out.overrun_ns += excess;
            }
        }
    }

    /// The next instant at which [`pick`](Self::pick) may answer differently
    /// without any other call: `now` if something can run already, the next
    /// replenishment of a runnable VP, or `None` if no VP is runnable.
    pub fn poll_at(&self) -> Option<u64> {
        if !self.ready.is_empty() || !self.slack.is_empty() {
            return Some(self.now);
        }
        self.timers.first().map(|&(t, _)| t)
    }

    /// A VP's state.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`].
    pub fn info(&self, id: VpId) -> Result<VpInfo, SchedError> {
        let v = self.vps.get(id).map_err(lookup_err(id))?;
        Ok(VpInfo {
            owner: v.owner,
            params: v.params,
            runnable: v.runnable,
            period_start_ns: v.period_start,
            deadline_ns: v.deadline,
            remaining_ns: v.remaining,
            received_ns: v.received,
            totals: v.totals,
        })
    }

    /// The VP's most recent completed periods, oldest first.
    ///
    /// # Errors
    /// [`SchedError::UnknownVp`] or [`SchedError::StaleVp`].
    pub fn recent_periods(&self, id: VpId) -> Result<impl Iterator<Item = &PeriodRecord> + '_, SchedError> {
        Ok(self.vps.get(id).map_err(lookup_err(id))?.ring.iter())
    }

    /// Takes the completed-period records logged since the last drain,
    /// oldest first.
    pub fn drain_periods(&mut self) -> impl Iterator<Item = PeriodRecord> + '_ {
        self.log.drain(..)
    }

    /// Period records lost because the log was full.
    pub fn periods_dropped(&self) -> u64 {
        self.log_dropped
    }

    /// Every VP with its handle.
    pub fn vps(&self) -> impl Iterator<Item = VpId> + '_ {
        self.vps.iter::<VpId>().map(|(id, _)| id)
    }

    /// Number of VPs.
    pub fn len(&self) -> usize {
        self.vps.len()
    }

    /// Whether there are no VPs.
    pub fn is_empty(&self) -> bool {
        self.vps.is_empty()
    }

    /// Sum of the guaranteed shares of all VPs, in ppm.
    pub fn total_share_ppm(&self) -> u64 {
        self.vps.iter::<VpId>().map(|(_, v)| v.params.share_ppm()).fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MS: u64 = 1_000_000;
    const S0: SessionId = SessionId::new(0, 1);

    fn p(slice_ms: u64, period_ms: u64, extra: bool) -> VpParams {
        VpParams { slice_ns: slice_ms * MS, period_ns: period_ms * MS, extra }
    }

    /// Runs the scheduler for `until` ns, each dispatch using its whole
    /// budget; returns the CPU each VP got.
    fn run(s: &mut Scheduler, vps: &[VpId], mut now: u64, until: u64) -> Vec<u64> {
        let mut got = vec![0; vps.len()];
        while now < until {
            match s.pick(now) {
                Some(d) => {
                    let used = d.budget_ns.min(until - now);
                    now += used;
                    let c = s.charge(&d, used, now).unwrap();
                    let k = vps.iter().position(|v| *v == d.vp).unwrap();
                    got[k] += c.total_ns();
                }
                None => now = s.poll_at().unwrap_or(until).min(until).max(now + 1),
            }
        }
        got
    }

    #[test]
    fn edf_gives_each_its_slice_and_no_extra_gets_no_slack() {
        let mut s = Scheduler::new(SchedConfig::default());
        let b = s.add_vp(S0, p(1, 4, false), 0).unwrap();
        let c = s.add_vp(S0, p(2, 10, false), 0).unwrap();
        for v in [b, c] {
            s.set_runnable(v, true, 0).unwrap();
        }
        let got = run(&mut s, &[b, c], 0, 400 * MS);
        assert_eq!(got, vec![100 * MS, 80 * MS], "exactly the slices, no slack");
        for v in [b, c] {
            let recs: Vec<_> = s.recent_periods(v).unwrap().copied().collect();
            assert!(!recs.is_empty());
            assert!(recs.iter().all(|r| r.received_ns == r.slice_ns && r.slack_ns == 0), "{recs:?}");
        }
        // In [400, 403) ms both use their slices, then nothing may run
        // until b's next period at 404 ms.
        assert_eq!(run(&mut s, &[b, c], 400 * MS, 403 * MS), vec![MS, 2 * MS]);
        assert_eq!(s.pick(403 * MS), None);
        assert_eq!(s.poll_at(), Some(404 * MS));
    }

    #[test]
    fn changing_a_vps_parameters_over_and_over_takes_no_more_than_its_guarantee() {
        // A holds 1 ms in 10 ms and asks for its parameters again every
        // 0.5 ms (the same, or 0.5 ms and back, or a 12 ms period and
        // back); B holds 4 ms in 10 ms. Over 200 ms A gets at most its 20
        // slices, and B all of its own.
        let mut s = Scheduler::new(SchedConfig::default());
        let a = s.add_vp(S0, p(1, 10, false), 0).unwrap();
        let b = s.add_vp(S0, p(4, 10, false), 0).unwrap();
        for v in [a, b] {
            s.set_runnable(v, true, 0).unwrap();
        }
        let mut got = [0u64; 2];
        let half = MS / 2;
        for i in 0..400u64 {
            let t = i * half;
            let again = match i % 4 {
                0 => p(1, 10, false),
                1 => VpParams { slice_ns: half, period_ns: 10 * MS, extra: false },
                2 => p(1, 10, false),
                _ => VpParams { slice_ns: 6 * MS / 5, period_ns: 12 * MS, extra: false },
            };
            s.set_params(a, again, t).unwrap();
            for (g, x) in got.iter_mut().zip(run(&mut s, &[a, b], t, t + half)) {
                *g += x;
            }
        }
        assert!(got[0] <= 20 * MS + MS / 2, "A got {} ms of 200, its share is 20", got[0] as f64 / MS as f64);
        assert_eq!(got[1], 80 * MS, "B got all of its slices");
    }

    #[test]
    fn slack_goes_to_extra_vps_equally() {
        let mut s = Scheduler::new(SchedConfig::default());
        let a = s.add_vp(S0, p(1, 10, true), 0).unwrap();
        let b = s.add_vp(S0, p(1, 10, true), 0).unwrap();
        let c = s.add_vp(S0, p(2, 10, false), 0).unwrap();
        for v in [a, b, c] {
            s.set_runnable(v, true, 0).unwrap();
        }
        let got = run(&mut s, &[a, b, c], 0, 1000 * MS);
        assert_eq!(got[2], 200 * MS);
        assert_eq!(got[0] + got[1], 800 * MS);
        assert!(got[0].abs_diff(got[1]) <= 2 * MS, "{got:?}");
    }

    #[test]
    fn overrun_is_a_debt_on_the_next_period() {
        let mut s = Scheduler::new(SchedConfig::default());
        let v = s.add_vp(S0, p(1, 4, false), 0).unwrap();
        s.set_runnable(v, true, 0).unwrap();
        let d = s.pick(0).unwrap();
        assert_eq!(d.budget_ns, MS);
        let c = s.charge(&d, 3 * MS / 2, 3 * MS / 2).unwrap();
        assert_eq!(c, Charged { guaranteed_ns: MS, overrun_ns: MS / 2, slack_ns: 0 });
        assert_eq!(s.pick(2 * MS), None, "no budget, no slack");
        assert_eq!(s.poll_at(), Some(4 * MS));
        let d = s.pick(4 * MS).unwrap();
        assert_eq!(d.budget_ns, MS / 2, "the next period pays the debt");
    }

    #[test]
    fn waking_late_starts_a_new_period() {
        let mut s = Scheduler::new(SchedConfig::default());
        let v = s.add_vp(S0, p(2, 10, false), 0).unwrap();
        // Wakes at 9 ms with 2 ms of budget and 1 ms to the deadline: the
        // budget does not fit at 20 %, so a new period starts at 9 ms.
        s.set_runnable(v, true, 9 * MS).unwrap();
        let i = s.info(v).unwrap();
        assert_eq!((i.period_start_ns, i.deadline_ns, i.remaining_ns), (9 * MS, 19 * MS, 2 * MS as i64));
        // Runs 1 ms, blocks, wakes at 12 ms: 1 ms of budget fits in the 7 ms
        // left at 20 %, so the period is kept.
        let d = s.pick(9 * MS).unwrap();
        s.charge(&d, MS, 10 * MS).unwrap();
        s.set_runnable(v, false, 10 * MS).unwrap();
        s.set_runnable(v, true, 12 * MS).unwrap();
        assert_eq!(s.info(v).unwrap().deadline_ns, 19 * MS);
        // Waking at 15 ms it would not fit (1 ms in 4 ms at 20 % is 0.8 ms).
        s.set_runnable(v, false, 12 * MS).unwrap();
        s.set_runnable(v, true, 15 * MS).unwrap();
        assert_eq!(s.info(v).unwrap().deadline_ns, 25 * MS);
    }

    #[test]
    fn a_late_caller_yields_one_gap_record() {
        let mut s = Scheduler::new(SchedConfig::default());
        let v = s.add_vp(S0, p(1, 4, false), 0).unwrap();
        s.set_runnable(v, true, 0).unwrap();
        let d = s.pick(0).unwrap();
        s.charge(&d, MS, MS).unwrap();
        // Nobody calls for an hour.
        let d = s.pick(3_600_000 * MS + MS).unwrap();
        assert_eq!(d.budget_ns, MS);
        let recs: Vec<_> = s.drain_periods().collect();
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].received_ns, MS);
        assert_eq!((recs[1].received_ns, recs[1].start_ns), (0, 4 * MS));
        assert_eq!(recs[1].slice_ns, (recs[1].end_ns - recs[1].start_ns) / 4);
    }

    #[test]
    fn bad_params_and_stale_handles() {
        let mut s = Scheduler::new(SchedConfig::default());
        for bad in [p(0, 4, false), p(5, 4, false), p(0, 0, false)] {
            assert_eq!(s.add_vp(S0, bad, 0), Err(SchedError::BadParams(bad)));
        }
        let big = VpParams { slice_ns: 1, period_ns: MAX_PERIOD_NS + 1, extra: false };
        assert!(s.add_vp(S0, big, 0).is_err());
        let v = s.add_vp(S0, p(1, 4, false), 0).unwrap();
        s.remove_vp(v, 1).unwrap();
        assert_eq!(s.set_runnable(v, true, 2), Err(SchedError::StaleVp(v)));
        assert_eq!(s.info(VpId::from_raw(77)), Err(SchedError::UnknownVp(VpId::from_raw(77))));
    }

    #[test]
    fn share_rounds_up() {
        assert_eq!(p(1, 10, false).share_ppm(), 100_000);
        assert_eq!(VpParams { slice_ns: 1, period_ns: 3, extra: false }.share_ppm(), 333_334);
    }
}
