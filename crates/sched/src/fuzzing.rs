//! Entry points for the cargo-fuzz targets under `fuzz/` (also replayed over
//! their seeds as ordinary tests, `tests/fuzz_seeds.rs`). Each function
//! panics only when an invariant of the crate is broken, never because the
//! input is bad.

use crate::account::PrincipalId;
use crate::admission::Ceilings;
use crate::rcane::{Rcane, RcaneConfig};
use crate::wire::{Message, Reply, Request};

/// Bytes as one session control request and as one reply: what parses
/// re-encodes to the same bytes.
pub fn control_parse(data: &[u8]) {
    if let Ok(r) = Request::parse_bytes(data) {
        assert_eq!(r.to_bytes().as_deref(), Ok(data), "request did not round-trip");
    }
    if let Ok(r) = Reply::parse_bytes(data) {
        assert_eq!(r.to_bytes().as_deref(), Ok(data), "reply did not round-trip");
    }
}

/// Bytes as a stream of `(principal selector, control message)` pairs
/// applied to a node, as the daemon would: each request's outcome must keep
/// the node's invariants (guarantees within capacity, every session within
/// its ceilings, replies that encode), and every reply must parse back.
pub fn control_apply(data: &[u8]) {
    let cfg = RcaneConfig { max_sessions: 8, max_sessions_per_principal: 3, ..RcaneConfig::default() };
    let mut node: Rcane<u8> = match Rcane::new(cfg, 0) {
        Ok(n) => n,
        Err(e) => panic!("default config refused: {e}"),
    };
    let ceilings = Ceilings {
        max_vp_share_ppm: 400_000,
        max_total_share_ppm: 500_000,
        max_vps: 4,
        extra: true,
        max_heap_bytes: 1 << 20,
        max_tx_bytes_per_sec: 1 << 20,
        max_rx_bytes_per_sec: 1 << 20,
        max_pools: 2,
        max_queued_events: 64,
    };
    let mut rest = data;
    let mut now = 0u64;
    while let Some((&sel, tail)) = rest.split_first() {
        let Some(len) = Message::<&[u8]>::frame_len(tail) else { break };
        let Some((msg, after)) = tail.split_at_checked(len) else { break };
        rest = after;
        now += u64::from(sel) * 1_000_000;
        let principal = PrincipalId([sel & 3; 32]);
        let Ok(req) = Request::parse_bytes(msg) else { continue };
        let reply = match req {
            Request::Open { reservation, .. } => node
                .open_session(principal, ceilings, Some(now + 10_000_000_000), &reservation, now)
                .map(|g| Reply::granted(&g)),
            Request::Reserve { session, reservation } => {
                node.reserve(&principal, session, &reservation, now).map(|g| Reply::granted(&g))
            }
            Request::Close { session } => node.close_session(&principal, session, now).map(|c| Reply::closed(&c)),
            Request::List => Ok(Reply::Sessions(node.list(&principal, now).iter().map(Into::into).collect())),
            Request::Show { session } => {
                node.show(&principal, session, now).map(|i| Reply::Sessions(vec![(&i).into()]))
            }
        };
        let reply = reply.unwrap_or_else(|e| Reply::error(&e));
        let bytes = match reply.to_bytes() {
            Ok(b) => b,
            Err(e) => panic!("reply {reply:?} does not encode: {e}"),
        };
        assert_eq!(Reply::parse_bytes(&bytes).as_ref(), Ok(&reply));
        let cap = node.config().capacity;
        assert!(node.sched().total_share_ppm() <= cap.cpu_ppm, "guarantees above capacity");
        let ids: Vec<_> = node.sessions().collect();
        for sid in ids {
            let Ok(info) = node.session_info(sid, now) else { panic!("listed session {sid} has no info") };
            if let crate::account::Owner::Principal(_) = info.owner {
                assert!(info.share_ppm <= ceilings.max_total_share_ppm);
                assert!(info.vps.len() <= ceilings.max_vps as usize);
                assert!(info.heap_bytes <= ceilings.max_heap_bytes);
            }
        }
    }
}

/// Text as a Fig. 11 trace: what parses re-emits to text that parses to the
/// same trace.
pub fn trace_parse(data: &[u8]) {
    let Ok(text) = core::str::from_utf8(data) else { return };
    if let Ok(t) = crate::trace::Trace::parse(text) {
        let again = crate::trace::Trace::parse(&t.to_csv());
        assert_eq!(again.as_ref(), Ok(&t), "trace did not round-trip");
        let _ = crate::trace::stats(&t.rows);
    }
}
