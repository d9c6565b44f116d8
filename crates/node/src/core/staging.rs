//! Code staged ahead of its load request: a module larger than one control
//! datagram arrives as `code chunk`s (`anode_wire::control`), in order,
//! then a load request with empty code loads it.
//!
//! Bounded like the fragment reassembler (`anode_wire::frag`): one staging
//! per principal, its declared total at most the sandbox's module size
//! limit, at most [`MAX_STAGINGS`] principals and [`MAX_STAGED_BYTES`]
//! declared bytes at once, each dropped [`STAGING_TIMEOUT_MS`] after its last
//! chunk. Chunks must come in order with no gap or overlap; any departure
//! drops that principal's staging (it starts over at offset 0). Room is
//! taken by declared size when a staging starts, so a principal cannot
//! stage more than it declared, and one that stalls holds its room only
//! until the timeout.

use anode_sandbox::{HeapCharge, PrincipalId};
use anode_wire::control::CodeChunk;

/// Most principals staging code at once.
pub const MAX_STAGINGS: usize = 16;
/// Most bytes declared by the stagings in progress, together.
pub const MAX_STAGED_BYTES: usize = 16 << 20;
/// A staging with no chunk for this long is dropped.
pub const STAGING_TIMEOUT_MS: u64 = 30_000;

/// Why a chunk or a staged load was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StageError {
    /// The declared total is empty or over the module size limit.
    #[error("staged code of {total} bytes: the node loads modules of 1 to {max} bytes")]
    TooLarge { total: u32, max: usize },
    /// Not the next byte expected (a gap, a repeat or an overlap).
    #[error("chunk at offset {offset}, expected {expected}: the staging is dropped; start again at offset 0")]
    OutOfOrder { offset: u32, expected: usize },
    /// A total other than the staging's.
    #[error("chunk says the code is {total} bytes, the staging {staged}: the staging is dropped")]
    TotalChanged { total: u32, staged: usize },
    /// The chunk runs past the declared total.
    #[error("chunk runs past the declared {total} bytes: the staging is dropped")]
    PastEnd { total: usize },
    /// No room for another staging now.
    #[error("the node stages code for {MAX_STAGINGS} principals or {MAX_STAGED_BYTES} bytes at most; try again later")]
    Full,
    /// A load with empty code, and nothing staged.
    #[error("a load request with no code needs its code staged first, in chunks (anode module load does this)")]
    Nothing,
    /// A load with empty code before the last chunk.
    #[error("staged code incomplete: {received} of {total} bytes; the staging is dropped")]
    Incomplete { received: usize, total: usize },
    /// The declared total does not fit in the principal's session heap
    /// reservation, where staged code is charged until it is loaded.
    #[error("staged code of {total} bytes does not fit in the session's heap reservation; reserve more heap first")]
    OverHeap { total: u32 },
}

struct Staged {
    total: usize,
    buf: Vec<u8>,
    last_ms: u64,
    /// The declared total, held in the principal's session heap while the
    /// staging lasts (given back when it is dropped).
    _heap: HeapCharge,
}

/// The stagings in progress.
#[derive(Default)]
pub(crate) struct Staging {
    sets: crate::FastMap<PrincipalId, Staged>,
    declared: usize,
}

impl core::fmt::Debug for Staging {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (n, declared) = self.usage();
        f.debug_struct("Staging").field("stagings", &n).field("declared", &declared).finish()
    }
}

impl Staging {
    /// Adds chunk `c` from `who`; the bytes received so far. A chunk that
    /// starts a staging takes its declared total from `who`'s session heap
    /// with `charge(who, total)` (`None`: it does not fit, and nothing is
    /// staged).
    pub(crate) fn chunk(
        &mut self,
        who: PrincipalId,
        c: &CodeChunk<'_>,
        max_code: usize,
        now_ms: u64,
        charge: impl FnOnce(PrincipalId, usize) -> Option<HeapCharge>,
    ) -> Result<u32, StageError> {
        self.expire(now_ms);
        let total = c.total as usize;
        if c.offset == 0 {
            self.drop_of(who);
            if total == 0 || total > max_code {
                return Err(StageError::TooLarge { total: c.total, max: max_code });
            }
            if self.sets.len() >= MAX_STAGINGS || self.declared.saturating_add(total) > MAX_STAGED_BYTES {
                return Err(StageError::Full);
            }
            let heap = charge(who, total).ok_or(StageError::OverHeap { total: c.total })?;
            self.declared += total;
            self.sets.insert(who, Staged { total, buf: Vec::new(), last_ms: now_ms, _heap: heap });
        }
        let Some(s) = self.sets.get_mut(&who) else {
            return Err(StageError::OutOfOrder { offset: c.offset, expected: 0 });
        };
        let err = if total != s.total {
            Some(StageError::TotalChanged { total: c.total, staged: s.total })
        } else if c.offset as usize != s.buf.len() {
            Some(StageError::OutOfOrder { offset: c.offset, expected: s.buf.len() })
        } else if s.buf.len().saturating_add(c.data.len()) > s.total {
            Some(StageError::PastEnd { total: s.total })
        } else {
            None
        };
        if let Some(e) = err {
            self.drop_of(who);
            return Err(e);
        }
        s.buf.extend_from_slice(c.data);
        s.last_ms = now_ms;
        Ok(u32::try_from(s.buf.len()).unwrap_or(u32::MAX))
    }

    /// Takes `who`'s staged code for a load request with empty code; the
    /// staging ends either way.
    pub(crate) fn take(&mut self, who: PrincipalId, now_ms: u64) -> Result<Vec<u8>, StageError> {
        self.expire(now_ms);
        let s = self.sets.remove(&who).ok_or(StageError::Nothing)?;
        self.declared -= s.total;
        if s.buf.len() != s.total {
            return Err(StageError::Incomplete { received: s.buf.len(), total: s.total });
        }
        Ok(s.buf)
    }

    /// Stagings in progress and the bytes they declared.
    pub(crate) fn usage(&self) -> (usize, usize) {
        (self.sets.len(), self.declared)
    }

    fn drop_of(&mut self, who: PrincipalId) {
        if let Some(s) = self.sets.remove(&who) {
            self.declared -= s.total;
        }
    }

    fn expire(&mut self, now_ms: u64) {
        let declared = &mut self.declared;
        self.sets.retain(|_, s| {
            let keep = now_ms.saturating_sub(s.last_ms) < STAGING_TIMEOUT_MS;
            if !keep {
                *declared -= s.total;
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session heap with room for anything.
    fn free(_: PrincipalId, _: usize) -> Option<HeapCharge> {
        Some(HeapCharge::default())
    }

    const MAX: usize = 1000;

    fn p(n: u8) -> PrincipalId {
        PrincipalId([n; 32])
    }

    fn c(total: u32, offset: u32, data: &[u8]) -> CodeChunk<'_> {
        CodeChunk { total, offset, data }
    }

    #[test]
    fn chunks_in_order_make_the_code_once() {
        let mut s = Staging::default();
        assert_eq!(s.chunk(p(1), &c(6, 0, b"abc"), MAX, 0, free), Ok(3));
        assert_eq!(s.chunk(p(1), &c(6, 3, b"def"), MAX, 10, free), Ok(6));
        assert_eq!(s.usage(), (1, 6));
        assert_eq!(s.take(p(1), 20), Ok(b"abcdef".to_vec()));
        assert_eq!(s.usage(), (0, 0));
        assert_eq!(s.take(p(1), 20), Err(StageError::Nothing), "taken once");
    }

    #[test]
    fn every_departure_drops_the_staging() {
        let mut s = Staging::default();
        // A gap, a repeat, a changed total, data past the total.
        for bad in [c(6, 4, b"x"), c(6, 0, b"y"), c(7, 2, b"z"), c(6, 2, b"12345")] {
            assert_eq!(s.chunk(p(1), &c(6, 0, b"ab"), MAX, 0, free), Ok(2));
            let r = s.chunk(p(1), &bad, MAX, 0, free);
            if bad.offset == 0 {
                // Offset 0 starts over: a new staging with "y".
                assert_eq!(r, Ok(1));
                assert_eq!(s.take(p(1), 0), Err(StageError::Incomplete { received: 1, total: 6 }));
            } else {
                assert!(r.is_err(), "{bad:?}: {r:?}");
                assert_eq!(s.usage(), (0, 0), "{bad:?} dropped the staging");
                assert_eq!(
                    s.chunk(p(1), &c(6, 2, b"cd"), MAX, 0, free).map_err(|_| ()),
                    Err(()),
                    "nothing to continue"
                );
            }
        }
        // Taking an incomplete staging ends it.
        assert_eq!(s.chunk(p(1), &c(6, 0, b"ab"), MAX, 0, free), Ok(2));
        assert_eq!(s.take(p(1), 0), Err(StageError::Incomplete { received: 2, total: 6 }));
        assert_eq!(s.usage(), (0, 0));
    }

    #[test]
    fn a_hostile_principal_costs_another_nothing() {
        let mut s = Staging::default();
        assert_eq!(s.chunk(p(2), &c(4, 0, b"go"), MAX, 0, free), Ok(2));
        // p(1) restarts, skips, repeats, overruns and stalls, interleaved.
        for (i, bad) in
            [c(MAX as u32, 0, b"x"), c(9, 5, b"y"), c(9, 0, b"z"), c(9, 0, b"123456789+")].iter().enumerate()
        {
            let _ = s.chunk(p(1), bad, MAX, i as u64, free);
        }
        assert_eq!(s.take(p(1), 5), Err(StageError::Nothing), "its last attempt ran past its total");
        assert_eq!(s.chunk(p(2), &c(4, 2, b"od"), MAX, 10, free), Ok(4));
        assert_eq!(s.take(p(2), 10), Ok(b"good".to_vec()), "the other's staging is whole");
    }

    #[test]
    fn sizes_counts_and_time_are_bounded() {
        let mut s = Staging::default();
        assert_eq!(s.chunk(p(1), &c(0, 0, b"a"), MAX, 0, free), Err(StageError::TooLarge { total: 0, max: MAX }));
        assert_eq!(s.chunk(p(1), &c(1001, 0, b"a"), MAX, 0, free), Err(StageError::TooLarge { total: 1001, max: MAX }));
        for n in 0..MAX_STAGINGS as u8 {
            assert_eq!(s.chunk(p(n), &c(10, 0, b"a"), MAX, 0, free), Ok(1));
        }
        assert_eq!(s.chunk(p(200), &c(10, 0, b"a"), MAX, 0, free), Err(StageError::Full), "one staging too many");
        // A stalled staging goes after the timeout and frees its room.
        assert_eq!(s.chunk(p(0), &c(10, 1, b"b"), MAX, STAGING_TIMEOUT_MS - 1, free), Ok(2));
        assert_eq!(s.chunk(p(200), &c(10, 0, b"a"), MAX, STAGING_TIMEOUT_MS, free), Ok(1));
        assert_eq!(s.usage(), (2, 20), "p(0), refreshed, and p(200)");
        // Declared bytes are bounded in total too.
        let mut s = Staging::default();
        let big = MAX_STAGED_BYTES / 2 + 1;
        assert_eq!(s.chunk(p(1), &c(big as u32, 0, b"a"), usize::MAX, 0, free), Ok(1));
        assert_eq!(s.chunk(p(2), &c(big as u32, 0, b"a"), usize::MAX, 0, free), Err(StageError::Full));
    }

    #[test]
    fn a_staging_that_does_not_fit_in_the_session_heap_is_refused_and_holds_nothing() {
        let mut s = Staging::default();
        let full = |_: PrincipalId, _: usize| None;
        assert_eq!(s.chunk(p(1), &c(6, 0, b"abc"), MAX, 0, full), Err(StageError::OverHeap { total: 6 }));
        assert_eq!(s.usage(), (0, 0), "nothing staged, no room taken");
        assert_eq!(
            s.chunk(p(1), &c(6, 3, b"def"), MAX, 0, free),
            Err(StageError::OutOfOrder { offset: 3, expected: 0 })
        );
        // Room made (a larger reservation): it starts over at offset 0.
        let mut asked = None;
        let room = |who: PrincipalId, n: usize| {
            asked = Some((who, n));
            free(who, n)
        };
        assert_eq!(s.chunk(p(1), &c(6, 0, b"abc"), MAX, 0, room), Ok(3));
        assert_eq!(asked, Some((p(1), 6)), "the declared total is what its principal's session heap is asked for");
        assert_eq!(s.chunk(p(1), &c(6, 3, b"def"), MAX, 0, |_, _| panic!("asked again")), Ok(6));
    }
}
