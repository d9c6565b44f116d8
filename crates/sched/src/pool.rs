//! Pools: bounded event queues bound to one VP (RCANE §IV-C: "a thread pool
//! acts as a queueing and dispatch point for events ... its threads are only
//! eligible to run when its VP receives CPU time").
//!
//! An event is whatever the caller queues (a packet arrival on a channel, an
//! alarm, a capsule invocation). A pool bounds both the events queued and
//! the events in progress (taken but not finished: a preempted invocation
//! stays in progress until it completes). Overflow is refused and counted,
//! never unbounded. [`crate::Rcane`] makes a VP runnable exactly while one of
//! its pools has a backlog, and hands out events only to the VP that holds
//! the CPU.

use crate::handle::{SessionId, VpId};
use std::collections::VecDeque;

/// The bounds of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// Events that may wait (≥ 1).
    pub max_queued: u32,
    /// Events that may be in progress at once (≥ 1).
    pub max_in_progress: u32,
}

/// Counters of one pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Events accepted.
    pub accepted: u64,
    /// Events refused because the queue was full.
    pub refused: u64,
    /// Events finished.
    pub completed: u64,
    /// Events discarded when the pool was closed.
    pub discarded: u64,
}

/// A bounded event queue bound to one VP.
#[derive(Debug, Clone)]
pub struct Pool<E> {
    vp: VpId,
    session: SessionId,
    spec: PoolSpec,
    queue: VecDeque<E>,
    in_progress: u32,
    stats: PoolStats,
}

impl<E> Pool<E> {
    /// An empty pool.
    pub fn new(session: SessionId, vp: VpId, spec: PoolSpec) -> Pool<E> {
        Pool { vp, session, spec, queue: VecDeque::new(), in_progress: 0, stats: PoolStats::default() }
    }

    /// The VP it is bound to.
    pub fn vp(&self) -> VpId {
        self.vp
    }

    /// The session that owns it.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// Its bounds.
    pub fn spec(&self) -> PoolSpec {
        self.spec
    }

    /// Its counters.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Events waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Events in progress.
    pub fn in_progress(&self) -> u32 {
        self.in_progress
    }

    /// Whether it has work: events waiting or in progress.
    pub fn has_backlog(&self) -> bool {
        !self.queue.is_empty() || self.in_progress > 0
    }

    /// Queues an event, or refuses it (counted) and gives it back.
    ///
    /// # Errors
    /// The event itself, when `max_queued` events are waiting.
    pub fn push(&mut self, e: E) -> Result<(), E> {
        if self.queue.len() >= self.spec.max_queued as usize {
            self.stats.refused += 1;
            return Err(e);
        }
        self.queue.push_back(e);
        self.stats.accepted += 1;
        Ok(())
    }

    /// Takes the next event into progress, if one waits and fewer than
    /// `max_in_progress` are in progress.
    pub fn take(&mut self) -> Option<E> {
        if self.in_progress >= self.spec.max_in_progress {
            return None;
        }
        let e = self.queue.pop_front()?;
        self.in_progress += 1;
        Some(e)
    }

    /// The event [`take`](Self::take) would return next, left queued.
    pub fn peek(&self) -> Option<&E> {
        if self.in_progress >= self.spec.max_in_progress {
            return None;
        }
        self.queue.front()
    }

    /// Marks one event in progress as finished. Returns `false` if none was.
    pub fn finish(&mut self) -> bool {
        if self.in_progress == 0 {
            return false;
        }
        self.in_progress -= 1;
        self.stats.completed += 1;
        true
    }

    /// Takes every queued event out (not those in progress), uncounted:
    /// for the daemon to move them elsewhere.
    pub fn take_queued(&mut self) -> Vec<E> {
        self.queue.drain(..).collect()
    }

    /// Empties the pool (on close), counting what was discarded.
    pub fn discard_all(&mut self) -> u64 {
        let n = self.queue.len() as u64 + u64::from(self.in_progress);
        self.queue.clear();
        self.in_progress = 0;
        self.stats.discarded += n;
        n
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bounds_are_kept_and_overflow_counted() {
        let mut p = Pool::new(SessionId::new(2, 1), VpId::new(0, 1), PoolSpec { max_queued: 2, max_in_progress: 1 });
        assert!(!p.has_backlog());
        assert_eq!(p.push(1), Ok(()));
        assert_eq!(p.push(2), Ok(()));
        assert_eq!(p.push(3), Err(3));
        assert_eq!(p.take(), Some(1));
        assert_eq!(p.take(), None, "one in progress at most");
        assert!(p.has_backlog());
        assert!(p.finish());
        assert_eq!(p.take(), Some(2));
        assert!(p.finish());
        assert!(!p.finish());
        assert!(!p.has_backlog());
        assert_eq!(p.stats(), PoolStats { accepted: 2, refused: 1, completed: 2, discarded: 0 });
    }
}
