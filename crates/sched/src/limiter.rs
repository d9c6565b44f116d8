//! Rate limiting of session control requests, per principal (issue 14: "a
//! flood of requests, which is rate-limited and charged to System within its
//! guarantee").
//!
//! Session requests run in the System session, whose guarantee is fixed;
//! without a limit, one principal's flood would use all of System's time
//! and delay everyone's requests. Each principal has a token bucket
//! (`rate_per_sec` tokens per second, at most `burst`); a request takes one
//! token or is refused with the time until the next token. The table is
//! bounded: when it is full, buckets that have refilled completely (which
//! carry no state) are dropped; if none has, requests from principals not
//! yet in the table are refused until one has (counted). A full table is
//! swept at most once per [`SWEEP_NS`], so a flood of newcomers costs a
//! lookup each, not a walk of the whole table each.

use crate::account::PrincipalId;
use std::collections::HashMap;

/// A refused request: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many session requests: retry in {retry_after_ns} ns")]
pub struct RateLimited {
    /// Time until a token is available, ns.
    pub retry_after_ns: u64,
}

/// Token buckets per principal.
#[derive(Debug, Clone)]
pub struct RequestLimiter {
    rate_per_sec: u64,
    burst: u64,
    max_principals: usize,
    /// Tokens in units of 1e-9 token (so refill is exact in ns), and the
    /// time of the last update.
    buckets: HashMap<PrincipalId, (u64, u64)>,
    refused: u64,
    /// When the full table was last swept for refilled buckets.
    swept_ns: Option<u64>,
}

const UNIT: u64 = 1_000_000_000;

/// The shortest time between two sweeps of a full table (1 ms): a bucket
/// refills in no less than that at any rate worth tracking, and each sweep
/// walks the whole table.
pub const SWEEP_NS: u64 = 1_000_000;

/// Whether a full table last swept at `swept` may be swept again at `now`
/// (and, if so, records `now`).
fn may_sweep(swept: &mut Option<u64>, now: u64) -> bool {
    if swept.is_some_and(|s| now.saturating_sub(s) < SWEEP_NS && now >= s) {
        return false;
    }
    *swept = Some(now);
    true
}

impl RequestLimiter {
    /// `rate_per_sec` requests per second per principal (≥ 1), bursts of
    /// `burst` (≥ 1), at most `max_principals` principals tracked.
    pub fn new(rate_per_sec: u32, burst: u32, max_principals: usize) -> RequestLimiter {
        RequestLimiter {
            rate_per_sec: u64::from(rate_per_sec.max(1)),
            burst: u64::from(burst.max(1)),
            max_principals: max_principals.max(1),
            buckets: HashMap::new(),
            refused: 0,
            swept_ns: None,
        }
    }

    fn refill(&self, (tokens, last): (u64, u64), now: u64) -> u64 {
        let dt = now.saturating_sub(last);
        tokens.saturating_add(dt.saturating_mul(self.rate_per_sec)).min(self.burst * UNIT)
    }

    /// Takes one token for `p` at `now`.
    ///
    /// # Errors
    /// [`RateLimited`] with the time until the next token (counted).
    pub fn check(&mut self, p: PrincipalId, now: u64) -> Result<(), RateLimited> {
        if !self.buckets.contains_key(&p) && self.buckets.len() >= self.max_principals {
            if may_sweep(&mut self.swept_ns, now) {
                let full = self.burst * UNIT;
                let (rate, burst) = (self.rate_per_sec, self.burst);
                self.buckets.retain(|_, b| {
                    let dt = now.saturating_sub(b.1);
                    b.0.saturating_add(dt.saturating_mul(rate)).min(burst * UNIT) < full
                });
            }
            if self.buckets.len() >= self.max_principals {
                self.refused += 1;
                return Err(RateLimited { retry_after_ns: UNIT / self.rate_per_sec });
            }
        }
        let b = self.buckets.get(&p).copied().unwrap_or((self.burst * UNIT, now));
        let tokens = self.refill(b, now);
        if tokens < UNIT {
            self.buckets.insert(p, (tokens, now.max(b.1)));
            self.refused += 1;
            return Err(RateLimited { retry_after_ns: (UNIT - tokens).div_ceil(self.rate_per_sec) });
        }
        self.buckets.insert(p, (tokens - UNIT, now.max(b.1)));
        Ok(())
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Principals tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn bursts_then_the_rate() {
        let mut l = RequestLimiter::new(10, 3, 8);
        let p = PrincipalId([1; 32]);
        for _ in 0..3 {
            l.check(p, 0).unwrap();
        }
        assert_eq!(l.check(p, 0), Err(RateLimited { retry_after_ns: 100 * MS }));
        assert_eq!(l.check(p, 60 * MS), Err(RateLimited { retry_after_ns: 40 * MS }));
        l.check(p, 100 * MS).unwrap();
        assert!(l.check(p, 150 * MS).is_err());
        // Another principal is not affected.
        l.check(PrincipalId([2; 32]), 150 * MS).unwrap();
        // A flood of 1000 requests in a second gets through at the rate only.
        let q = PrincipalId([3; 32]);
        let ok = (0..1000u64).filter(|i| l.check(q, 200 * MS + i * MS).is_ok()).count();
        assert_eq!(ok, 3 + 9, "3 at once, then one per 100 ms (at 300..=1100 ms)");
        assert!(l.refused() >= 980);
    }

    #[test]
    fn the_table_is_bounded() {
        let mut l = RequestLimiter::new(1, 1, 2);
        l.check(PrincipalId([1; 32]), 0).unwrap();
        l.check(PrincipalId([2; 32]), 0).unwrap();
        // Both buckets are empty: a third principal waits.
        assert!(l.check(PrincipalId([3; 32]), 0).is_err());
        assert_eq!(l.tracked(), 2);
        // Once they have refilled, their state is dropped to make room.
        l.check(PrincipalId([3; 32]), 2_000 * MS).unwrap();
        assert!(l.tracked() <= 2);
    }

    #[test]
    fn a_full_table_is_swept_at_most_once_per_millisecond() {
        // 1,000 requests/s, bursts of 1: a spent bucket is full after 1 ms.
        let mut l = RequestLimiter::new(1000, 1, 1);
        l.check(PrincipalId([1; 32]), 0).unwrap();
        assert!(l.check(PrincipalId([2; 32]), 999_999).is_err(), "swept then: 1 still spending");
        // 1 is full from 1 ms on, but the table was swept 1 ns before that.
        assert!(l.check(PrincipalId([2; 32]), MS + 500_000).is_err(), "no sweep within 1 ms");
        l.check(PrincipalId([2; 32]), 2 * MS).unwrap();
        assert_eq!(l.tracked(), 1);
    }
}

/// A token bucket of bytes: what a principal may transmit (issue 14: the
/// hostile forwarder "must hit its ... transmit limits"). `rate` bytes per
/// second, at most `burst` bytes at once. Exact in integer nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBucket {
    rate: u64,
    burst: u64,
    /// Bytes × 1e9 (so that refill is exact per ns).
    level: u128,
    last_ns: u64,
}

impl ByteBucket {
    /// A full bucket at `now_ns`.
    pub fn new(rate_bytes_per_sec: u64, burst_bytes: u64, now_ns: u64) -> ByteBucket {
        ByteBucket {
            rate: rate_bytes_per_sec,
            burst: burst_bytes,
            level: u128::from(burst_bytes) * u128::from(UNIT),
            last_ns: now_ns,
        }
    }

    /// Changes the rate and burst (a reservation changed), keeping what is
    /// in the bucket up to the new burst.
    pub fn set(&mut self, rate_bytes_per_sec: u64, burst_bytes: u64, now_ns: u64) {
        self.refill(now_ns);
        self.rate = rate_bytes_per_sec;
        self.burst = burst_bytes;
        self.level = self.level.min(u128::from(burst_bytes) * u128::from(UNIT));
    }

    /// The rate, bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = now_ns.saturating_sub(self.last_ns);
        self.last_ns = self.last_ns.max(now_ns);
        let full = u128::from(self.burst) * u128::from(UNIT);
        self.level = self.level.saturating_add(u128::from(dt) * u128::from(self.rate)).min(full);
    }

    /// Takes `bytes` at `now_ns` if the bucket holds them; `false` (and
    /// nothing taken) otherwise.
    pub fn take(&mut self, bytes: u64, now_ns: u64) -> bool {
        self.refill(now_ns);
        let need = u128::from(bytes) * u128::from(UNIT);
        if need > self.level {
            return false;
        }
        self.level -= need;
        true
    }

    /// Whether the bucket is full at `now_ns` (it carries no state then,
    /// and may be forgotten).
    pub fn is_full(&self, now_ns: u64) -> bool {
        let mut b = *self;
        b.refill(now_ns);
        b.level >= u128::from(b.burst) * u128::from(UNIT)
    }
}

/// Byte buckets by key (principal, neighbour), at most `max` of them. When
/// the table is full, buckets that have refilled (which carry no state) are
/// forgotten; if none has, a key not yet in it is refused. A full table is
/// swept at most once per [`SWEEP_NS`]: a flood of new keys costs a lookup
/// each, not a walk of the table each.
#[derive(Debug, Clone)]
pub struct ByteBuckets<K> {
    map: HashMap<K, ByteBucket>,
    max: usize,
    swept_ns: Option<u64>,
}

impl<K: Eq + core::hash::Hash + Copy> ByteBuckets<K> {
    /// An empty table of at most `max` buckets.
    pub fn new(max: usize) -> ByteBuckets<K> {
        ByteBuckets { map: HashMap::new(), max, swept_ns: None }
    }

    /// Takes `bytes` from `key`'s bucket at `now_ns`, the bucket made (full)
    /// or changed to `rate` bytes/s and `burst` bytes first; `false`: not
    /// enough in it, or no room for a new bucket (nothing taken).
    pub fn take(&mut self, key: K, (rate, burst): (u64, u64), bytes: u64, now_ns: u64) -> bool {
        if !self.map.contains_key(&key) && self.map.len() >= self.max {
            if may_sweep(&mut self.swept_ns, now_ns) {
                self.map.retain(|_, b| !b.is_full(now_ns));
            }
            if self.map.len() >= self.max {
                return false;
            }
        }
        let b = self.map.entry(key).or_insert_with(|| ByteBucket::new(rate, burst, now_ns));
        if b.rate() != rate {
            b.set(rate, burst, now_ns);
        }
        b.take(bytes, now_ns)
    }

    /// Forgets `key`'s bucket.
    pub fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod byte_bucket_tests {
    use super::ByteBucket;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let mut b = ByteBucket::new(1000, 500, 0);
        assert!(b.take(500, 0));
        assert!(!b.take(1, 0), "the burst is spent");
        // 1000 B/s: 1 byte per ms.
        assert!(!b.take(100, 99_000_000));
        assert!(b.take(100, 100_000_000));
        // Never more than the burst, however long it waited.
        assert!(!b.take(501, 3_600_000_000_000));
        assert!(b.take(500, 3_600_000_000_000));
        assert!(b.is_full(3_601_000_000_000));
        // Over a long run, the rate: 10 s at 1000 B/s is 10,000 B (+ burst).
        let mut b = ByteBucket::new(1000, 500, 0);
        let mut sent = 0u64;
        for t in 0..10_000u64 {
            if b.take(7, t * 1_000_000) {
                sent += 7;
            }
        }
        assert!((9_900..=10_500).contains(&sent), "{sent}");
        // A lower rate keeps at most the new burst (the bucket refilled
        // to 500 in the 10 s since).
        b.set(10, 20, 20_000_000_000);
        assert!(b.take(20, 20_000_000_000) && !b.take(1, 20_000_000_000));
        assert_eq!(b.rate(), 10);
    }

    #[test]
    fn a_full_table_of_busy_buckets_refuses_new_keys_and_forgets_refilled_ones() {
        use super::ByteBuckets;
        const S: u64 = 1_000_000_000;
        let mut t = ByteBuckets::new(2);
        // 1000 B/s, bursts of 100: two keys spend theirs.
        assert!(t.take(1u8, (1000, 100), 100, 0));
        assert!(t.take(2u8, (1000, 100), 100, 0));
        assert!(!t.take(1u8, (1000, 100), 1, 0), "1's burst is spent");
        assert!(!t.take(3u8, (1000, 100), 1, 0), "no room while both are busy");
        assert_eq!(t.len(), 2);
        // 0.1 s later both have refilled: they are forgotten to make room.
        assert!(t.take(3u8, (1000, 100), 100, S / 10));
        assert_eq!(t.len(), 1);
        // A changed rate applies to the key's bucket from then on: 1 ms
        // refilled at the old rate (1 byte), the next at the new (1,000).
        assert!(!t.take(3u8, (1_000_000, 100), 50, S / 10 + 1_000_000));
        assert!(t.take(3u8, (1_000_000, 100), 50, S / 10 + 2_000_000));
        t.remove(&3);
        assert!(t.is_empty());
    }

    /// A flood of new keys at a full table walks it at most once per
    /// `SWEEP_NS`: a bucket that refills between two sweeps is forgotten
    /// at the next one, not at each newcomer.
    #[test]
    fn a_full_table_is_swept_at_most_once_per_millisecond() {
        use super::{ByteBuckets, SWEEP_NS};
        const US: u64 = 1_000;
        // 1 MB/s, bursts of 100 B: an emptied bucket is full again in 100 µs.
        let mut t = ByteBuckets::new(1);
        assert!(t.take(1u8, (1_000_000, 100), 100, 0));
        assert!(!t.take(2u8, (1_000_000, 100), 1, 0), "swept at 0: 1 is empty");
        // 1 has refilled by 200 µs, but the last sweep was 200 µs ago.
        for i in 0..1000u64 {
            assert!(!t.take(2u8, (1_000_000, 100), 1, 200 * US + i * 100), "no sweep before 1 ms");
        }
        assert!(t.take(2u8, (1_000_000, 100), 1, SWEEP_NS), "swept again at 1 ms");
        assert_eq!(t.len(), 1);
    }
}
