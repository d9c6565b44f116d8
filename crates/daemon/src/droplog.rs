//! Rate-limited drop logging: at most one warning per drop reason per
//! [`DROP_LOG_INTERVAL`], carrying the count of drops since the previous
//! line, so a flood of bad packets cannot fill the disk.

use anode_node::counters::{Counters, DROP_NAMES, Drop, N_DROPS};
use anode_snap::vm::FAULT_KINDS;
use core::fmt::Write;
use std::time::{Duration, Instant};

/// Least time between two warnings for the same drop reason.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One warning line to emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DropLine {
    /// Drop reason.
    pub(crate) reason: &'static str,
    /// Drops since the previous line for this reason.
    pub(crate) count: u64,
    /// Drops of this reason since start.
    pub(crate) total: u64,
    /// Extra detail: fault kinds for `vm_fault`, the socket error for
    /// `tx_failed`; empty otherwise.
    pub(crate) detail: String,
}

/// Remembers what was last logged per reason.
#[derive(Debug)]
pub(crate) struct DropLog {
    logged: [u64; N_DROPS],
    at: [Option<Instant>; N_DROPS],
    faults_logged: Vec<u64>,
    created: Instant,
    /// The last transmission error, reported with the next `tx_failed` line.
    pub(crate) tx_error: Option<String>,
}

impl DropLog {
    pub(crate) fn new() -> DropLog {
        DropLog {
            logged: [0; N_DROPS],
            at: [None; N_DROPS],
            faults_logged: vec![0; FAULT_KINDS.len()],
            created: Instant::now(),
            tx_error: None,
        }
    }

    /// When the next line is due: the earliest time a reason with drops not
    /// yet logged may be logged again. None when everything is logged.
    pub(crate) fn next_due(&self, c: &Counters) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (r, &total) in c.drops.iter().enumerate() {
            if total <= self.logged[r] {
                continue;
            }
            // Never logged: due at once (any past instant will do).
            let t = self.at[r].map_or(self.created, |t| t + DROP_LOG_INTERVAL);
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        next
    }

    /// The lines due now. Cheap when nothing was dropped: one pass over
    /// the drop array, no allocation.
    pub(crate) fn due(&mut self, c: &Counters, now: Instant) -> Vec<DropLine> {
        let mut lines = Vec::new();
        for (r, &total) in c.drops.iter().enumerate() {
            if total <= self.logged[r] {
                continue;
            }
            if self.at[r].is_some_and(|t| now.duration_since(t) < DROP_LOG_INTERVAL) {
                continue;
            }
            let mut detail = String::new();
            if r == Drop::VmFault as usize {
                for (k, (now_n, was)) in c.vm_faults.iter().zip(self.faults_logged.iter_mut()).enumerate() {
                    if *now_n > *was {
                        let _ = write!(
                            detail,
                            "{}{}={}",
                            if detail.is_empty() { "" } else { " " },
                            FAULT_KINDS[k],
                            now_n - *was
                        );
                        *was = *now_n;
                    }
                }
            }
            if r == Drop::TxFailed as usize
                && let Some(e) = self.tx_error.take()
            {
                detail = e;
            }
            lines.push(DropLine { reason: DROP_NAMES[r], count: total - self.logged[r], total, detail });
            self.logged[r] = total;
            self.at[r] = Some(now);
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_per_interval() {
        let mut c = Counters::new(&["a".to_string()]);
        let mut log = DropLog::new();
        let t0 = Instant::now();
        assert!(log.due(&c, t0).is_empty());
        c.drop(Drop::NoRoute);
        let l = log.due(&c, t0);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].reason, l[0].count, l[0].total), ("no_route", 1, 1));
        for _ in 0..1000 {
            c.drop(Drop::NoRoute);
        }
        assert!(log.due(&c, t0 + Duration::from_millis(500)).is_empty(), "suppressed within the interval");
        c.drop(Drop::VmFault);
        c.vm_faults[2] += 1;
        let l = log.due(&c, t0 + Duration::from_millis(1001));
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].reason, l[0].count, l[0].total), ("no_route", 1000, 1001));
        assert_eq!(l[1].reason, "vm_fault");
        assert_eq!(l[1].detail, format!("{}=1", FAULT_KINDS[2]));
    }
}
