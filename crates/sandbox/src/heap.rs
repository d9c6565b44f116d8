//! One heap per session (RCANE §IV-E): a principal's memory account.
//!
//! "Each session is given its own independent heap. The maximum reserved
//! size for this heap may be configured by the session, by requesting a
//! particular size from the Core. Charging is based on the size of the
//! reserved memory blocks that comprise the heap, rather than the amount of
//! live memory within those blocks." (RCANE §IV-E)
//!
//! Every store of a principal (its modules' store, its capsule instances'
//! store and the stores of the pods it owns) and the host-side state the
//! sandbox keeps for it draw from ONE [`HeapAccount`], shared by reference. What is charged, by
//! reserved size, never by live size:
//!
//! | part | size charged |
//! |---|---|
//! | linear memories | their size in bytes (what `memory.grow` reserved; wasm memories never shrink) |
//! | tables | elements × [`TABLE_ELEMENT_BYTES`] |
//! | handles (channels, pending alarms) | [`HANDLE_BYTES`] each, and a keyed channel's share table ([`crate::demux::SHARE_TABLE_BYTES`]) |
//! | soft state | key + value bytes + [`STATE_ENTRY_BYTES`] per entry |
//! | queued jobs (channel packets, capsules waiting for their VP) | input bytes + [`JOB_BYTES`] each, until the job starts |
//! | code staged ahead of a load (a module sent in chunks) | its declared size, from its first chunk until the load or the staging's end ([`Sandbox::charge_staged`](crate::Sandbox::charge_staged)) |
//!
//! While the principal's session holds a heap reservation, a charge that
//! would take the total past it is refused: `memory.grow` and `table.grow`
//! return -1 inside the module, a host call that would keep state returns
//! [`E_LIMIT`](crate::host::E_LIMIT), a packet for one of its channels is
//! not queued. Each refusal is counted on the account ([`HeapUse::refusals`])
//! and touches nothing of any other principal. Without a reservation the
//! account only counts (each store is then capped by its credentials'
//! `memory`, and host state by its own limits, as before).
//!
//! **Pressure.** When the total crosses [`PRESSURE_PERCENT`] % of the
//! reservation upwards, the account flags pressure once; the sandbox then
//! calls the `heap_pressure` entry of each of the principal's modules that
//! registered one (a job like any other, run and charged in the session,
//! bounded by its fuel). It is flagged again only after the total has gone
//! below the threshold (or the reservation changed), so a module sitting at
//! 90 % is not called in a loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes charged per table element (a wasmtime `funcref` slot is one pointer).
pub const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();
/// Bytes charged per live handle (a channel or a pending alarm): the
/// handle-table slot, the object with its entry name (at most
/// [`MAX_ENTRY`](crate::capsule::MAX_ENTRY) bytes), its index entries.
pub const HANDLE_BYTES: usize = 128;
/// Bytes charged per soft-state entry on top of its key and value (the hash
/// map's slot and the two vectors' headers).
pub const STATE_ENTRY_BYTES: usize = 64;
/// Bytes charged per queued job on top of its input (the job itself).
pub const JOB_BYTES: usize = 128;
/// Use, in percent of the reservation, at which the pressure entry is called.
pub const PRESSURE_PERCENT: usize = 80;
/// The entry the sandbox calls on heap pressure (argument: use in percent of
/// the reservation).
pub const PRESSURE_ENTRY: &str = "heap_pressure";

/// What a charge is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Linear memories.
    Memory,
    /// Tables.
    Tables,
    /// Handles.
    Handles,
    /// Soft state.
    State,
    /// Queued jobs.
    Queued,
    /// Code staged ahead of a load.
    Staged,
}

/// A principal's memory account: what its stores and host state hold.
#[derive(Debug)]
pub struct HeapAccount {
    reservation: Option<usize>,
    memory: usize,
    tables: usize,
    handles: usize,
    state: usize,
    queued: usize,
    staged: usize,
    refusals: u64,
    peak: usize,
    pressure_armed: bool,
    pressure_pending: bool,
    pressure_calls: u64,
    /// Sandbox-wide: some account has pressure pending.
    signal: Arc<AtomicBool>,
}

/// A shared account (each store and each queued job holds a reference).
pub(crate) type SharedHeap = Arc<Mutex<HeapAccount>>;

/// A snapshot of an account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapUse {
    /// The session's heap reservation, bytes (`None`: no session reservation).
    pub reservation: Option<usize>,
    /// Everything charged, bytes (the sum of the parts below).
    pub used: usize,
    /// Linear memories, bytes.
    pub memory: usize,
    /// Tables, bytes.
    pub tables: usize,
    /// Handles, bytes.
    pub handles: usize,
    /// Soft state, bytes.
    pub state: usize,
    /// Queued jobs, bytes.
    pub queued: usize,
    /// Code staged ahead of a load, bytes.
    pub staged: usize,
    /// Charges refused (grows, state puts, handles, queued packets).
    pub refusals: u64,
    /// Highest `used` seen.
    pub peak: usize,
    /// Times pressure was flagged (the entry is called once per flag).
    pub pressure_calls: u64,
}

impl HeapAccount {
    pub(crate) fn shared(signal: Arc<AtomicBool>, reservation: Option<usize>) -> SharedHeap {
        Arc::new(Mutex::new(HeapAccount {
            reservation,
            memory: 0,
            tables: 0,
            handles: 0,
            state: 0,
            queued: 0,
            staged: 0,
            refusals: 0,
            peak: 0,
            pressure_armed: true,
            pressure_pending: false,
            pressure_calls: 0,
            signal,
        }))
    }

    /// Everything charged, bytes.
    pub fn used(&self) -> usize {
        self.memory
            .saturating_add(self.tables)
            .saturating_add(self.handles)
            .saturating_add(self.state)
            .saturating_add(self.queued)
            .saturating_add(self.staged)
    }

    /// Whether a reservation bounds the account.
    pub(crate) fn reserved(&self) -> bool {
        self.reservation.is_some()
    }

    /// Whether `bytes` more fit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        self.reservation.is_none_or(|r| self.used().saturating_add(bytes) <= r)
    }

    fn part(&mut self, p: Part) -> &mut usize {
        match p {
            Part::Memory => &mut self.memory,
            Part::Tables => &mut self.tables,
            Part::Handles => &mut self.handles,
            Part::State => &mut self.state,
            Part::Queued => &mut self.queued,
            Part::Staged => &mut self.staged,
        }
    }

    /// Charges `bytes` to `p` if they fit; otherwise counts a refusal.
    pub(crate) fn charge(&mut self, p: Part, bytes: usize) -> bool {
        if !self.fits(bytes) {
            self.refusals += 1;
            return false;
        }
        self.force(p, bytes);
        true
    }

    /// Counts a refusal decided elsewhere (a store's own cap, say).
    pub(crate) fn refuse(&mut self) {
        self.refusals += 1;
    }

    /// Charges `bytes` to `p` whatever the reservation (what a store
    /// already holds when it is counted).
    pub(crate) fn force(&mut self, p: Part, bytes: usize) {
        let v = self.part(p);
        *v = v.saturating_add(bytes);
        self.changed();
    }

    /// Gives `bytes` of `p` back.
    pub(crate) fn release(&mut self, p: Part, bytes: usize) {
        let v = self.part(p);
        *v = v.saturating_sub(bytes);
        self.changed();
    }

    /// Sets `p` to `bytes` (parts recomputed from their owner, as soft state).
    pub(crate) fn set(&mut self, p: Part, bytes: usize) {
        *self.part(p) = bytes;
        self.changed();
    }

    /// Sets the reservation (re-arming the pressure flag).
    pub(crate) fn set_reservation(&mut self, r: Option<usize>) {
        if self.reservation != r {
            self.reservation = r;
            self.pressure_armed = true;
            self.changed();
        }
    }

    /// The reservation.
    pub fn reservation(&self) -> Option<usize> {
        self.reservation
    }

    /// Flags pressure now (a shrink request below use, say).
    pub(crate) fn flag_pressure(&mut self) {
        self.pressure_pending = true;
        self.pressure_armed = false;
        self.pressure_calls += 1;
        self.signal.store(true, Ordering::Relaxed);
    }

    /// Takes the pressure flag.
    pub(crate) fn take_pressure(&mut self) -> bool {
        std::mem::take(&mut self.pressure_pending)
    }

    fn changed(&mut self) {
        let used = self.used();
        self.peak = self.peak.max(used);
        let Some(r) = self.reservation.filter(|r| *r > 0) else { return };
        let over = used.saturating_mul(100) >= r.saturating_mul(PRESSURE_PERCENT);
        if !over {
            self.pressure_armed = true;
        } else if self.pressure_armed {
            self.flag_pressure();
        }
    }

    /// Use in percent of the reservation (0 without one).
    pub(crate) fn percent(&self) -> i32 {
        match self.reservation.filter(|r| *r > 0) {
            Some(r) => i32::try_from(self.used().saturating_mul(100) / r).unwrap_or(i32::MAX),
            None => 0,
        }
    }

    /// A snapshot.
    pub fn snapshot(&self) -> HeapUse {
        HeapUse {
            reservation: self.reservation,
            used: self.used(),
            memory: self.memory,
            tables: self.tables,
            handles: self.handles,
            state: self.state,
            queued: self.queued,
            staged: self.staged,
            refusals: self.refusals,
            peak: self.peak,
            pressure_calls: self.pressure_calls,
        }
    }
}

/// Runs `f` on the account (a poisoned lock is recovered: the account holds
/// plain counters, every one of them valid).
pub(crate) fn with<R>(h: &SharedHeap, f: impl FnOnce(&mut HeapAccount) -> R) -> R {
    let mut g = h.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut g)
}

/// What a queued job (or code staged ahead of a load) holds of its
/// principal's heap; given back when it is dropped (the job started or was
/// thrown away, the staging ended). A clone holds nothing.
#[derive(Default)]
pub struct HeapCharge(Option<(SharedHeap, Part, usize)>);

impl HeapCharge {
    /// Charges a job of `input` bytes to `heap`; `None` if it does not fit
    /// (a refusal is counted).
    pub(crate) fn job(heap: &SharedHeap, input: usize) -> Option<HeapCharge> {
        Self::of(heap, Part::Queued, input.saturating_add(JOB_BYTES))
    }

    /// Charges `bytes` of staged code to `heap`; `None` if they do not fit
    /// (a refusal is counted).
    pub(crate) fn staged(heap: &SharedHeap, bytes: usize) -> Option<HeapCharge> {
        Self::of(heap, Part::Staged, bytes)
    }

    fn of(heap: &SharedHeap, p: Part, bytes: usize) -> Option<HeapCharge> {
        with(heap, |a| a.charge(p, bytes)).then(|| HeapCharge(Some((heap.clone(), p, bytes))))
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |(_, _, b)| *b)
    }
}

impl Drop for HeapCharge {
    fn drop(&mut self) {
        if let Some((h, p, b)) = self.0.take() {
            with(&h, |a| a.release(p, b));
        }
    }
}

impl Clone for HeapCharge {
    fn clone(&self) -> Self {
        HeapCharge(None)
    }
}

impl std::fmt::Debug for HeapCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeapCharge({})", self.bytes())
    }
}

impl PartialEq for HeapCharge {
    /// Charges do not make jobs different.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for HeapCharge {}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(r: Option<usize>) -> SharedHeap {
        HeapAccount::shared(Arc::new(AtomicBool::new(false)), r)
    }

    #[test]
    fn charges_stop_at_the_reservation_and_count_refusals() {
        let h = account(Some(1000));
        assert!(with(&h, |a| a.charge(Part::Memory, 600)));
        assert!(with(&h, |a| a.charge(Part::State, 400)));
        assert!(!with(&h, |a| a.charge(Part::Handles, 1)));
        let u = with(&h, |a| a.snapshot());
        assert_eq!((u.used, u.refusals, u.peak), (1000, 1, 1000));
        with(&h, |a| a.release(Part::State, 400));
        assert!(with(&h, |a| a.charge(Part::Handles, 128)));
    }

    #[test]
    fn without_a_reservation_it_only_counts() {
        let h = account(None);
        assert!(with(&h, |a| a.charge(Part::Memory, usize::MAX / 2)));
        assert!(with(&h, |a| a.charge(Part::Memory, usize::MAX / 2)));
        assert_eq!(with(&h, |a| (a.snapshot().refusals, a.percent())), (0, 0));
    }

    #[test]
    fn pressure_is_flagged_once_per_crossing() {
        let signal = Arc::new(AtomicBool::new(false));
        let h = HeapAccount::shared(signal.clone(), Some(100));
        with(&h, |a| a.force(Part::Memory, 79));
        assert!(!with(&h, |a| a.take_pressure()));
        with(&h, |a| a.force(Part::Memory, 1));
        assert!(signal.load(Ordering::Relaxed));
        assert!(with(&h, |a| a.take_pressure()));
        with(&h, |a| a.force(Part::Memory, 10));
        assert!(!with(&h, |a| a.take_pressure()), "still above: not again");
        with(&h, |a| a.release(Part::Memory, 50));
        with(&h, |a| a.force(Part::Memory, 50));
        assert!(with(&h, |a| a.take_pressure()), "crossed again");
        assert_eq!(with(&h, |a| a.snapshot().pressure_calls), 2);
    }

    #[test]
    fn a_job_charge_is_given_back_when_dropped_and_a_clone_holds_nothing() {
        let h = account(Some(1000));
        let c = HeapCharge::job(&h, 500);
        assert!(c.is_some());
        assert_eq!(with(&h, |a| a.used()), 500 + JOB_BYTES);
        let d = c.clone();
        assert_eq!(d.as_ref().map(HeapCharge::bytes), Some(0));
        assert!(HeapCharge::job(&h, 500).is_none(), "does not fit");
        drop(c);
        drop(d);
        assert_eq!(with(&h, |a| (a.used(), a.snapshot().refusals)), (0, 1));
    }
}
