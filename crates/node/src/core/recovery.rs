//! Boot recovery served to peers (SANE §4.1, AEGIS's `Recover`): a
//! `CONTROL` body of type [`RECOVERY_OP`] carries one recovery protocol
//! message (`anode_boot::recovery`); it is handed to the repository hook the
//! daemon installed and the answer goes back over the same SA.
//!
//! The core knows nothing of the protocol or of files: the hook does
//! (`anode_boot::fsio::MirrorSource` in the daemon). The core authenticates
//! (only a principal with an SA is served) and rate-limits per principal
//! with a token bucket, so a peer cannot make the node read its repository
//! faster than [`RATE_PER_SEC`] chunks a second.

use super::{Node, Outbox};
use core::net::SocketAddr;
use std::collections::HashMap;

/// The control body type of a recovery message (`0x21` ‖ message).
pub const RECOVERY_OP: u8 = 0x21;
/// Requests a principal may make per second, sustained.
pub const RATE_PER_SEC: u64 = 200;
/// Requests a principal may make in a burst.
pub const BURST: u64 = 100;
/// Principals tracked by the rate limiter (the oldest is forgotten first).
pub const MAX_PRINCIPALS: usize = 256;

/// The repository a node serves: one request in, one reply out (`None`:
/// nothing to send back, e.g. garbage).
pub type RepoFn = Box<dyn FnMut(&[u8]) -> Option<Vec<u8>> + Send>;

/// Counters of the recovery served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryCounters {
    /// Requests answered.
    pub served: u64,
    /// Requests dropped: over the principal's rate.
    pub rate_limited: u64,
    /// Requests dropped: no authenticated principal.
    pub unauthenticated: u64,
    /// Requests dropped: this node serves no repository.
    pub no_repository: u64,
    /// Requests the repository did not answer (not a request).
    pub unanswered: u64,
}

/// A token bucket per principal.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens_milli: u64,
    at_ms: u64,
}

/// The served repository and its limits.
#[derive(Default)]
pub(crate) struct Recovery {
    repo: Option<RepoFn>,
    buckets: HashMap<[u8; 32], Bucket>,
    pub(crate) counters: RecoveryCounters,
}

impl core::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Recovery")
            .field("repo", &self.repo.is_some())
            .field("principals", &self.buckets.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Recovery {
    /// Takes a token of `who` at `now_ms`; false if its bucket is empty.
    fn admit(&mut self, who: [u8; 32], now_ms: u64) -> bool {
        if !self.buckets.contains_key(&who) && self.buckets.len() >= MAX_PRINCIPALS {
            let oldest = self.buckets.iter().min_by_key(|(_, b)| b.at_ms).map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.buckets.remove(&k);
            }
        }
        let b = self.buckets.entry(who).or_insert(Bucket { tokens_milli: BURST * 1000, at_ms: now_ms });
        let refill = now_ms.saturating_sub(b.at_ms).saturating_mul(RATE_PER_SEC);
        b.tokens_milli = b.tokens_milli.saturating_add(refill).min(BURST * 1000);
        b.at_ms = b.at_ms.max(now_ms);
        if b.tokens_milli < 1000 {
            return false;
        }
        b.tokens_milli -= 1000;
        true
    }
}

impl Node {
    /// Serves boot recovery to peers from `repo` (see the module doc).
    pub fn serve_recovery(&mut self, repo: RepoFn) {
        self.recovery.repo = Some(repo);
    }

    /// Counters of the recovery served so far.
    pub fn recovery_counters(&self) -> RecoveryCounters {
        self.recovery.counters
    }

    /// The `recovery` section of `status`: whether this node serves a
    /// repository, and what it served and refused (None if it serves none
    /// and was never asked).
    pub fn recovery_json(&self) -> Option<serde_json::Value> {
        let r = &self.recovery;
        let c = r.counters;
        (r.repo.is_some() || c != RecoveryCounters::default()).then(|| {
            serde_json::json!({"serving": r.repo.is_some(), "served": c.served, "rate_limited": c.rate_limited,
                "unauthenticated": c.unauthenticated, "no_repository": c.no_repository, "unanswered": c.unanswered})
        })
    }

    /// A recovery request `msg` (the body after [`RECOVERY_OP`]) from
    /// `from`, whose SA ends at `to`.
    pub(crate) fn recovery_request(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        to: Option<SocketAddr>,
        iface: usize,
        msg: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let r = &mut self.recovery;
        let (Some(key), Some(to)) = (from, to) else {
            r.counters.unauthenticated += 1;
            return;
        };
        if !r.admit(*key.as_bytes(), now_ms) {
            r.counters.rate_limited += 1;
            return;
        }
        let Some(repo) = r.repo.as_mut() else {
            r.counters.no_repository += 1;
            return;
        };
        let Some(reply) = repo(msg) else {
            r.counters.unanswered += 1;
            return;
        };
        r.counters.served += 1;
        super::control::send_control(out, iface, to, &[&[RECOVERY_OP][..], &reply[..]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Owner;
    use anode_wire::anep;

    #[test]
    fn the_bucket_admits_a_burst_then_the_rate() {
        let mut r = Recovery::default();
        let k = [7; 32];
        let admitted = (0..2 * BURST).filter(|_| r.admit(k, 1_000)).count() as u64;
        assert_eq!(admitted, BURST);
        // 100 ms later: RATE_PER_SEC / 10 more.
        let admitted = (0..BURST).filter(|_| r.admit(k, 1_100)).count() as u64;
        assert_eq!(admitted, RATE_PER_SEC / 10);
        // Another principal has its own bucket.
        assert!(r.admit([8; 32], 1_100));
    }

    fn node() -> Node {
        let cfg = crate::config::NodeConfig::from_toml(
            "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n",
        )
        .expect("config");
        Node::new(&cfg, None).expect("node")
    }

    #[test]
    fn a_request_is_answered_over_the_sa_it_came_on_and_refusals_are_counted() {
        let mut n = node();
        let key = anode_sec::Identity::from_seed(&[1; 32]).public();
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut out = Outbox::default();
        // No repository: dropped and counted.
        n.recovery_request(Some(key), Some(to), 0, b"fetch", 1, &mut out);
        assert!(out.transmits.is_empty());
        assert_eq!(n.recovery_counters().no_repository, 1);
        assert!(n.recovery_json().is_some(), "a node that was asked says so");
        n.serve_recovery(Box::new(|req| (req != b"garbage").then(|| [b"re:", req].concat())));
        // An answer: a CONTROL frame 0x21 ‖ reply, to the SA's endpoint, as System.
        n.recovery_request(Some(key), Some(to), 0, b"fetch", 1, &mut out);
        let [t] = out.transmits.as_slice() else { panic!("one reply: {:?}", out.transmits) };
        assert_eq!((t.to, t.iface, t.owner), (to, 0, Owner::System));
        let f = anep::Packet::new_checked(out.bytes(&t.data, &[])).expect("frame");
        assert_eq!(f.type_id(), anep::TYPE_CONTROL);
        assert_eq!(f.payload(), b"\x21re:fetch");
        // Not a request: nothing sent. No principal: nothing sent.
        n.recovery_request(Some(key), Some(to), 0, b"garbage", 1, &mut out);
        n.recovery_request(None, Some(to), 0, b"fetch", 1, &mut out);
        assert_eq!(out.transmits.len(), 1);
        // Over the rate (all at one instant: no refill): dropped and
        // counted. Every request with a principal took a token.
        for _ in 0..2 * BURST {
            n.recovery_request(Some(key), Some(to), 0, b"fetch", 1, &mut out);
        }
        let c = n.recovery_counters();
        assert_eq!((c.served, c.unanswered, c.unauthenticated), (BURST - 2, 1, 1), "{c:?}");
        assert_eq!(c.rate_limited, BURST + 3, "{c:?}");
        assert_eq!(out.transmits.len() as u64, c.served);
    }

    #[test]
    fn the_limiter_tracks_a_bounded_number_of_principals() {
        let mut r = Recovery::default();
        for i in 0..(MAX_PRINCIPALS as u64 + 50) {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&i.to_be_bytes());
            assert!(r.admit(k, i));
        }
        assert_eq!(r.buckets.len(), MAX_PRINCIPALS);
    }
}
