//! The RCANE paper's Marshal example, run against anode.
//!
//! In the Caml RCANE, a principal could use `Marshal.from_string` to build a
//! value of any type, for example a `Thread.t` naming another principal's
//! thread, and pass it to `Thread.kill`: type safety was the only thing that
//! made handles unforgeable, and unmarshalling bypassed it. In anode,
//! handles cross the network as plain 64-bit integers, so forging one is
//! trivial by design. What must hold instead is that a handle grants
//! nothing: every use is checked against the principal the SA authenticated
//! and the session that principal owns. This test forges handles every way
//! it can (bits copied off the wire, guessed indices and generations, the
//! built-in sessions, stale handles after reuse) and shows that none of
//! them lets Mallory touch Alice's session, VPs or pools.

use crate::common::*;
use anode_sched::wire::{Reply, Request};
use anode_sched::{
    HandleError, PoolId, PoolSpec, PrincipalId, Rcane, RcaneConfig, RcaneError, ReserveRequest, SessionId, VpId, VpOp,
};

const ALICE: PrincipalId = PrincipalId([0xa1; 32]);
const MALLORY: PrincipalId = PrincipalId([0x66; 32]);

/// Applies a wire request as the daemon would for `who`.
fn request(node: &mut Rcane<u32>, who: PrincipalId, bytes: &[u8], now: u64) -> Reply {
    let r = match Request::parse_bytes(bytes).expect("well-formed request") {
        Request::Open { reservation, .. } => {
            node.open_session(who, generous(), None, &reservation, now).map(|g| Reply::granted(&g))
        }
        Request::Reserve { session, reservation } => {
            node.reserve(&who, session, &reservation, now).map(|g| Reply::granted(&g))
        }
        Request::Close { session } => node.close_session(&who, session, now).map(|c| Reply::closed(&c)),
        Request::List => Ok(Reply::Sessions(node.list(&who, now).iter().map(Into::into).collect())),
        Request::Show { session } => node.show(&who, session, now).map(|i| Reply::Sessions(vec![(&i).into()])),
    };
    r.unwrap_or_else(|e| Reply::error(&e))
}

#[test]
fn forged_handles_grant_nothing() {
    let mut node: Rcane<u32> = Rcane::new(RcaneConfig::default(), 0).unwrap();
    // Alice opens a session over the wire; Mallory sees the reply bytes
    // (the "marshalled" handles).
    let open = Request::Open { credential: vec![], reservation: add(&[vp(400 * US, 4 * MS, false)]) };
    let reply_bytes = request(&mut node, ALICE, &open.to_bytes().unwrap(), 0).to_bytes().unwrap();
    let Reply::Granted { session: alice_sid, added } = Reply::parse_bytes(&reply_bytes).unwrap() else {
        panic!("alice's open refused")
    };
    let alice_vp = added[0];
    let alice_pool =
        node.open_pool(&ALICE, alice_sid, alice_vp, PoolSpec { max_queued: 4, max_in_progress: 1 }, 0).unwrap();
    node.post(alice_pool, 7, 0).unwrap();
    let before = node.session_info(alice_sid, 1).unwrap();
    let g = node.open_session(MALLORY, generous(), None, &add(&[vp(MS, 10 * MS, false)]), 1).unwrap();
    let (mallory_sid, mallory_vp) = (g.session, g.added[0]);

    // "Thread.kill" on Alice's VP, from Mallory's own session.
    let kill = Request::Reserve {
        session: mallory_sid,
        reservation: ReserveRequest { vps: vec![VpOp::Remove(alice_vp)], ..ReserveRequest::default() },
    };
    assert_eq!(
        Reply::parse_bytes(&request(&mut node, MALLORY, &kill.to_bytes().unwrap(), 2).to_bytes().unwrap()).unwrap(),
        Reply::error(&RcaneError::Vp(alice_vp, HandleError::NotYours))
    );
    // Presenting Alice's session itself.
    let close = Request::Close { session: alice_sid }.to_bytes().unwrap();
    assert_eq!(
        request(&mut node, MALLORY, &close, 2),
        Reply::error(&RcaneError::Session(alice_sid, HandleError::NotYours))
    );
    assert_eq!(
        node.reserve(&MALLORY, alice_sid, &add(&[vp(MS, 10 * MS, false)]), 2),
        Err(RcaneError::Session(alice_sid, HandleError::NotYours))
    );
    assert!(node.show(&MALLORY, alice_sid, 2).is_err());
    // Alice's pool and VP from Mallory's session.
    assert_eq!(
        node.close_pool(&MALLORY, mallory_sid, alice_pool, 2),
        Err(RcaneError::Pool(alice_pool, HandleError::NotYours))
    );
    assert_eq!(
        node.open_pool(&MALLORY, mallory_sid, alice_vp, PoolSpec { max_queued: 1, max_in_progress: 1 }, 2),
        Err(RcaneError::Vp(alice_vp, HandleError::NotYours))
    );
    let change =
        ReserveRequest { vps: vec![VpOp::Change(alice_vp, vp(10 * US, 4 * MS, false))], ..ReserveRequest::default() };
    assert_eq!(node.reserve(&MALLORY, mallory_sid, &change, 2), Err(RcaneError::Vp(alice_vp, HandleError::NotYours)));
    // The built-in sessions belong to no principal.
    for sid in [node.system().0, node.best_effort().0] {
        assert_eq!(node.close_session(&MALLORY, sid, 2), Err(RcaneError::Session(sid, HandleError::NotYours)));
    }
    // Every handle with a small index and generation, as session, VP and pool.
    for index in 0..16u64 {
        for generation in 0..6u64 {
            let raw = generation << 32 | index;
            let (sid, v, p) = (SessionId::from_raw(raw), VpId::from_raw(raw), PoolId::from_raw(raw));
            if sid != mallory_sid {
                assert!(node.close_session(&MALLORY, sid, 3).is_err(), "closed {sid}");
            }
            if v != mallory_vp {
                let rm = ReserveRequest { vps: vec![VpOp::Remove(v)], ..ReserveRequest::default() };
                assert!(node.reserve(&MALLORY, mallory_sid, &rm, 3).is_err(), "removed VP {v}");
            }
            assert!(node.close_pool(&MALLORY, mallory_sid, p, 3).is_err(), "closed pool {p}");
        }
    }
    // Alice is untouched: same VPs, same pools, her event still queued.
    let after = node.session_info(alice_sid, 1).unwrap();
    assert_eq!(after, before);
    assert_eq!(after.pools[0].queued, 1);
    assert!(node.sched().info(alice_vp).unwrap().runnable);
}

#[test]
fn stale_handles_after_reuse_are_refused() {
    let mut node: Rcane<u32> = Rcane::new(RcaneConfig::default(), 0).unwrap();
    let a = node.open_session(ALICE, generous(), None, &add(&[vp(MS, 10 * MS, false)]), 0).unwrap();
    node.close_session(&ALICE, a.session, 1).unwrap();
    // Mallory's new session and VP reuse Alice's slots.
    let m = node.open_session(MALLORY, generous(), None, &add(&[vp(MS, 10 * MS, false)]), 2).unwrap();
    assert_eq!((m.session.index(), m.added[0].index()), (a.session.index(), a.added[0].index()));
    assert_ne!(m.session, a.session);
    // Alice's old handles are stale, whoever presents them.
    assert_eq!(node.close_session(&ALICE, a.session, 3), Err(RcaneError::Session(a.session, HandleError::Stale)));
    assert_eq!(node.close_session(&MALLORY, a.session, 3), Err(RcaneError::Session(a.session, HandleError::Stale)));
    let rm = ReserveRequest { vps: vec![VpOp::Remove(a.added[0])], ..ReserveRequest::default() };
    assert_eq!(node.reserve(&MALLORY, m.session, &rm, 3), Err(RcaneError::Vp(a.added[0], HandleError::Stale)));
    // A re-opened Alice session cannot reach Mallory's VP that now sits in
    // her old slot.
    let a2 = node.open_session(ALICE, generous(), None, &ReserveRequest::default(), 4).unwrap();
    let rm = ReserveRequest { vps: vec![VpOp::Remove(m.added[0])], ..ReserveRequest::default() };
    assert_eq!(node.reserve(&ALICE, a2.session, &rm, 4), Err(RcaneError::Vp(m.added[0], HandleError::NotYours)));
    assert_eq!(node.session_info(m.session, 5).unwrap().vps.len(), 1);
    // A fabricated index far past anything allocated.
    let far = SessionId::from_raw(1 << 32 | 999_999);
    assert_eq!(node.close_session(&ALICE, far, 5), Err(RcaneError::Session(far, HandleError::Unknown)));
}
