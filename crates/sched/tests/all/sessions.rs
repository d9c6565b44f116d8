//! Sessions, admission control, pools and accounting.

use crate::common::*;
use anode_sched::{
    AdmissionError, Capacity, Ceilings, Charged, CloseReason, DispatchKind, HandleError, Limit, Owner, PoolId,
    PoolSpec, PostRefusal, PrincipalId, Rcane, RcaneConfig, RcaneError, ReserveRequest, Resource, ResourceKind,
    SessionEvent, VpOp,
};

const P: PrincipalId = PrincipalId([1; 32]);
const Q: PrincipalId = PrincipalId([2; 32]);

fn node() -> Rcane<u32> {
    Rcane::new(RcaneConfig::default(), 0).unwrap()
}

fn refused(resource: Resource, by: Limit, asked: u64, left: u64, allowed: u64) -> RcaneError {
    RcaneError::Admission(AdmissionError::Refused { resource, by, asked, left, allowed })
}

#[test]
fn credential_ceilings_refuse_with_what_was_asked_left_and_allowed() {
    let mut n = node();
    let c = Ceilings {
        max_vp_share_ppm: 200_000,
        max_total_share_ppm: 300_000,
        max_vps: 2,
        extra: false,
        max_heap_bytes: 1000,
        max_tx_bytes_per_sec: 10,
        max_rx_bytes_per_sec: 20,
        max_pools: 1,
        max_queued_events: 8,
    };
    // The node has 95 % less System 5 % and Best-Effort 10 %: 80 % left.
    let left = 800_000;
    let r = |v: &[_]| n.clone().open_session(P, c, None, &add(v), 0).unwrap_err();
    assert_eq!(r(&[vp(3 * MS, 10 * MS, false)]), refused(Resource::VpShare, Limit::Credential, 300_000, left, 200_000));
    assert_eq!(
        r(&[vp(2 * MS, 10 * MS, false), vp(2 * MS, 10 * MS, false)]),
        refused(Resource::Cpu, Limit::Credential, 400_000, left, 300_000)
    );
    assert_eq!(r(&[vp(MS, 10 * MS, false); 3]), refused(Resource::Vps, Limit::Credential, 3, u64::MAX, 2));
    assert_eq!(r(&[vp(MS, 10 * MS, true)]), refused(Resource::Extra, Limit::Credential, 1, u64::MAX, 0));
    let mut heap = ReserveRequest { heap_bytes: Some(1001), ..ReserveRequest::default() };
    assert_eq!(
        n.open_session(P, c, None, &heap, 0),
        Err(refused(Resource::Heap, Limit::Credential, 1001, 256 << 20, 1000))
    );
    heap.heap_bytes = None;
    heap.tx_bytes_per_sec = Some(11);
    assert_eq!(n.open_session(P, c, None, &heap, 0), Err(refused(Resource::Tx, Limit::Credential, 11, 12_500_000, 10)));
    heap.tx_bytes_per_sec = None;
    heap.rx_bytes_per_sec = Some(21);
    assert_eq!(n.open_session(P, c, None, &heap, 0), Err(refused(Resource::Rx, Limit::Credential, 21, 12_500_000, 20)));
    assert_eq!(n.sessions().count(), 2, "no refused open left a session behind");
    // Pools: count and queued events.
    let g = n.open_session(P, c, None, &add(&[vp(MS, 10 * MS, false)]), 0).unwrap();
    let spec = PoolSpec { max_queued: 9, max_in_progress: 1 };
    assert_eq!(
        n.open_pool(&P, g.session, g.added[0], spec, 0),
        Err(refused(Resource::QueuedEvents, Limit::Credential, 9, u64::MAX, 8))
    );
    let spec = PoolSpec { max_queued: 8, max_in_progress: 1 };
    n.open_pool(&P, g.session, g.added[0], spec, 0).unwrap();
    assert_eq!(
        n.open_pool(&P, g.session, g.added[0], spec, 0),
        Err(refused(Resource::Pools, Limit::Credential, 2, u64::MAX, 1))
    );
    let bad = PoolSpec { max_queued: 0, max_in_progress: 1 };
    let mut n2 = node();
    let g2 = n2.open_session(P, generous(), None, &add(&[vp(MS, 10 * MS, false)]), 0).unwrap();
    assert_eq!(n2.open_pool(&P, g2.session, g2.added[0], bad, 0), Err(RcaneError::BadPool));
}

#[test]
fn node_capacity_refuses_and_requests_are_all_or_nothing() {
    let mut n = node();
    let a = n.open_session(P, generous(), None, &add(&[vp(5 * MS, 10 * MS, false)]), 0).unwrap();
    let before = n.session_info(a.session, 0).unwrap();
    // 50 % + 20 % fits the 80 %, a further 20 % does not: nothing is added.
    let req = ReserveRequest {
        vps: vec![VpOp::Add(vp(2 * MS, 10 * MS, false)), VpOp::Add(vp(2 * MS, 10 * MS, false))],
        heap_bytes: Some(4096),
        ..ReserveRequest::default()
    };
    assert_eq!(
        n.reserve(&P, a.session, &req, 0),
        Err(refused(Resource::Cpu, Limit::Node, 900_000, 800_000, 1_000_000))
    );
    assert_eq!(n.session_info(a.session, 0).unwrap(), before, "a refused request changes nothing");
    assert_eq!(n.sched().len(), 3);
    // Another principal sees what is left.
    assert_eq!(
        n.open_session(Q, generous(), None, &add(&[vp(4 * MS, 10 * MS, false)]), 0),
        Err(refused(Resource::Cpu, Limit::Node, 400_000, 300_000, 1_000_000))
    );
    // Shrinking one VP while adding another, in one request.
    let req = ReserveRequest {
        vps: vec![VpOp::Change(a.added[0], vp(2 * MS, 10 * MS, false)), VpOp::Add(vp(5 * MS, 10 * MS, false))],
        ..ReserveRequest::default()
    };
    let g = n.reserve(&P, a.session, &req, 1).unwrap();
    assert_eq!(g.added.len(), 1);
    assert_eq!(n.session_info(a.session, 1).unwrap().share_ppm, 700_000);
    assert!(n.sched().total_share_ppm() <= 950_000);
    // Heap: the credential allows 64 MiB; the node has 256 MiB in all.
    let heap = |b: u64| ReserveRequest { heap_bytes: Some(b), ..ReserveRequest::default() };
    assert_eq!(
        n.reserve(&P, a.session, &heap((64 << 20) + 1), 1),
        Err(refused(Resource::Heap, Limit::Credential, (64 << 20) + 1, 256 << 20, 64 << 20))
    );
    n.reserve(&P, a.session, &heap(64 << 20), 1).unwrap();
    for _ in 0..3 {
        n.open_session(Q, generous(), None, &heap(64 << 20), 1).unwrap();
    }
    assert_eq!(
        n.open_session(P, generous(), None, &heap(1), 1),
        Err(refused(Resource::Heap, Limit::Node, 1, 0, 64 << 20))
    );
    // Shrinking is never refused.
    n.reserve(&P, a.session, &heap(1 << 20), 1).unwrap();
}

#[test]
fn malformed_requests() {
    let mut n = node();
    let a = n.open_session(P, generous(), None, &add(&[vp(MS, 10 * MS, false)]), 0).unwrap();
    let v = a.added[0];
    let dup = ReserveRequest {
        vps: vec![VpOp::Remove(v), VpOp::Change(v, vp(MS, 10 * MS, false))],
        ..ReserveRequest::default()
    };
    assert_eq!(n.reserve(&P, a.session, &dup, 0), Err(RcaneError::DuplicateVp(v)));
    let many = add(&[vp(MS, 100 * MS, false); 33]);
    assert_eq!(n.reserve(&P, a.session, &many, 0), Err(RcaneError::TooManyOps { ops: 33, max: 32 }));
    let cfg = RcaneConfig::default();
    for bad in [vp(MS, 100 * US, false), vp(MS, 20 * S, false), vp(1, 10 * MS, false), vp(11 * MS, 10 * MS, false)] {
        assert_eq!(
            n.reserve(&P, a.session, &add(&[bad]), 0),
            Err(RcaneError::Admission(AdmissionError::BadVp {
                params: bad,
                min_period_ns: cfg.min_period_ns,
                max_period_ns: cfg.max_period_ns,
                min_slice_ns: cfg.min_slice_ns,
            }))
        );
    }
    assert_eq!(n.session_info(a.session, 0).unwrap().vps.len(), 1);
}

#[test]
fn session_limits_expiry_and_close_reasons() {
    let cfg = RcaneConfig { max_sessions: 3, max_sessions_per_principal: 2, ..RcaneConfig::default() };
    let mut n: Rcane<u32> = Rcane::new(cfg, 0).unwrap();
    let none = ReserveRequest::default();
    let s1 = n.open_session(P, generous(), Some(10 * S), &none, 0).unwrap().session;
    let s2 = n.open_session(P, generous(), None, &none, 0).unwrap().session;
    assert_eq!(
        n.open_session(P, generous(), None, &none, 0),
        Err(RcaneError::TooManySessionsForPrincipal { limit: 2 })
    );
    let s3 = n.open_session(Q, generous(), None, &none, 0).unwrap().session;
    assert_eq!(n.open_session(Q, generous(), None, &none, 0), Err(RcaneError::TooManySessions { limit: 3 }));
    assert_eq!(n.open_session(Q, generous(), Some(5), &none, 5), Err(RcaneError::CredentialExpired));
    // Expiry closes the session on its next request...
    assert_eq!(n.reserve(&P, s1, &none, 10 * S), Err(RcaneError::CredentialExpired));
    assert_eq!(n.show(&P, s1, 10 * S), Err(RcaneError::Session(s1, HandleError::Stale)));
    // ...or on the daemon's sweep.
    let s4 = n.open_session(Q, generous(), Some(20 * S), &none, 11 * S).unwrap().session;
    assert_eq!(n.next_expiry(), Some(20 * S));
    assert_eq!(n.poll_at(), Some(20 * S));
    let closed = n.expire(20 * S);
    assert_eq!(
        closed.iter().map(|c| (c.session, c.reason)).collect::<Vec<_>>(),
        vec![(s4, CloseReason::CredentialExpired)]
    );
    n.close_session(&P, s2, 21 * S).unwrap();
    n.close_session_for(s3, CloseReason::PrincipalGone, 22 * S).unwrap();
    assert_eq!(n.close_session_for(n.system().0, CloseReason::ByOperator, 22 * S), Err(RcaneError::Builtin));
    let events: Vec<SessionEvent> = n.drain_events().collect();
    let closes: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Closed { session, reason, .. } => Some((*session, *reason)),
            SessionEvent::Opened { .. } => None,
        })
        .collect();
    assert_eq!(
        closes,
        vec![
            (s1, CloseReason::CredentialExpired),
            (s4, CloseReason::CredentialExpired),
            (s2, CloseReason::ByPrincipal),
            (s3, CloseReason::PrincipalGone),
        ]
    );
    assert_eq!(events.iter().filter(|e| matches!(e, SessionEvent::Opened { .. })).count(), 4);
}

#[test]
fn pools_drive_their_vp_and_only_it() {
    let mut n = node();
    let g = n.open_session(P, generous(), None, &add(&[vp(MS, 4 * MS, false), vp(MS, 4 * MS, false)]), 0).unwrap();
    let (v1, v2) = (g.added[0], g.added[1]);
    let spec = PoolSpec { max_queued: 2, max_in_progress: 1 };
    let p1 = n.open_pool(&P, g.session, v1, spec, 0).unwrap();
    let p2 = n.open_pool(&P, g.session, v2, spec, 0).unwrap();
    assert_eq!(n.pick(0), None, "no events, nothing runnable");
    n.post(p1, 10, 0).unwrap();
    n.post(p1, 11, 0).unwrap();
    assert_eq!(n.post(p1, 12, 0).unwrap_err().reason, PostRefusal::Full);
    assert_eq!(n.post(p1, 13, 0).unwrap_err().event, 13);
    let d = n.pick(0).unwrap();
    assert_eq!(d.vp, v1);
    assert_eq!(n.take_event(&d, p2), Err(RcaneError::NotHoldingCpu { pool: p2, pool_vp: v2 }));
    assert_eq!(n.take_event(&d, p1), Ok(Some(10)));
    assert_eq!(n.take_event(&d, p1), Ok(None), "one in progress at most");
    let _ = n.charge(&d, 100 * US, 100 * US);
    // After the charge the dispatch is over: its events are no longer handed out.
    assert!(matches!(n.take_event(&d, p1), Err(RcaneError::NotHoldingCpu { .. })));
    n.finish_event(p1, 100 * US).unwrap();
    let d = n.pick(100 * US).unwrap();
    assert_eq!(n.take_event(&d, p1), Ok(Some(11)));
    let _ = n.charge(&d, 100 * US, 200 * US);
    n.finish_event(p1, 200 * US).unwrap();
    assert!(!n.sched().info(v1).unwrap().runnable, "no backlog, not runnable");
    assert_eq!(n.pick(200 * US), None);
    // Closing a pool discards its events and its VP goes idle.
    n.post(p2, 1, 300 * US).unwrap();
    assert!(n.sched().info(v2).unwrap().runnable);
    let stats = n.close_pool(&P, g.session, p2, 300 * US).unwrap();
    assert_eq!(stats.discarded, 1);
    assert!(!n.sched().info(v2).unwrap().runnable);
    assert_eq!(n.post(p2, 2, 300 * US).unwrap_err().reason, PostRefusal::Pool(HandleError::Stale));
    let info = n.session_info(g.session, 300 * US).unwrap();
    assert_eq!(info.pools.len(), 1);
    assert_eq!((info.pools[0].stats.accepted, info.pools[0].stats.refused, info.pools[0].stats.completed), (2, 2, 2));
    // Removing a VP removes its pools.
    let rm = ReserveRequest { vps: vec![VpOp::Remove(v1)], ..ReserveRequest::default() };
    n.reserve(&P, g.session, &rm, 400 * US).unwrap();
    assert_eq!(n.post(p1, 3, 400 * US).unwrap_err().reason, PostRefusal::Pool(HandleError::Stale));
}

#[test]
fn accounts_add_up_and_drain_exactly_once() {
    let mut n = node();
    let mut rng = Rng(7);
    let (sys, _) = n.system();
    let (be_sid, be_vp) = n.best_effort();
    let heap = ReserveRequest { heap_bytes: Some(1 << 20), ..add(&[vp(MS, 4 * MS, false)]) };
    let a = n.open_session(P, generous(), None, &heap, 0).unwrap();
    let b = n.open_session(Q, generous(), None, &add(&[vp(2 * MS, 10 * MS, true)]), 0).unwrap();
    n.set_busy(a.added[0], true, 0).unwrap();
    n.set_busy(b.added[0], true, 0).unwrap();
    n.set_busy(be_vp, true, 0).unwrap();
    let mut now = 0;
    let mut charged = 0u64;
    let mut drained: Vec<anode_sched::Charge> = Vec::new();
    for step in 1..=10u64 {
        charged += drive(&mut n, &mut now, step * S, Grain::Yield { min: 20 * US, max: 80 * US }, &mut rng)
            .iter()
            .map(|c| c.total_ns())
            .sum::<u64>();
        n.charge_tx(a.session, 3, 300).unwrap();
        if step <= 5 {
            n.charge_rx(b.session, 2, 100).unwrap();
        }
        n.charge_module_load(a.session).unwrap();
        n.charge_cpu(sys, 1000, DispatchKind::Guaranteed).unwrap();
        charged += 1000;
        if step == 5 {
            n.close_session(&Q, b.session, now).unwrap();
            // Charges for a closed session still land in its final account.
            n.charge_rx(b.session, 1, 1).unwrap();
        }
        drained.extend(n.drain_charges(now));
    }
    let total = |kind: ResourceKind, owner: Option<Owner>| -> u64 {
        drained.iter().filter(|c| c.kind == kind && owner.is_none_or(|o| c.owner == o)).map(|c| c.amount).sum()
    };
    let cpu = total(ResourceKind::CpuGuaranteedNs, None) + total(ResourceKind::CpuSlackNs, None);
    assert_eq!(cpu, charged, "every CPU ns charged is drained once");
    assert_eq!(n.orphan_cpu_ns(), 0);
    // The CPU of the run: everything from 0 to the end, nothing idle (BE is busy).
    assert!((10 * S..10 * S + MS).contains(&cpu), "{cpu}");
    assert_eq!(total(ResourceKind::TxPackets, Some(Owner::Principal(P))), 30);
    assert_eq!(total(ResourceKind::TxBytes, None), 3000);
    assert_eq!(total(ResourceKind::RxPackets, Some(Owner::Principal(Q))), 5 * 2 + 1);
    assert_eq!(total(ResourceKind::ModuleLoads, None), 10);
    // 1 MiB for 10 s (to the last drain, which is at or after 10 s).
    let heap_s = total(ResourceKind::HeapByteSeconds, Some(Owner::Principal(P)));
    assert_eq!(heap_s, (1u64 << 20) * now / S, "{heap_s}");
    // Nothing is drained twice, and the closed session is forgotten.
    assert_eq!(n.drain_charges(now), vec![]);
    // The guaranteed VP got its slice: 25 % of 10 s less nothing (it never overran
    // by more than one grain, and the debt was paid back).
    let a_cpu = total(ResourceKind::CpuGuaranteedNs, Some(Owner::Principal(P)));
    assert!(a_cpu.abs_diff(10 * S / 4) < MS, "{a_cpu}");
    assert_eq!(total(ResourceKind::CpuSlackNs, Some(Owner::Principal(P))), 0, "no extra, no slack");
    assert!(total(ResourceKind::CpuSlackNs, Some(Owner::BestEffort)) > 0);
    assert_eq!(
        n.session_info(be_sid, now).unwrap().account.cpu_ns(),
        total(ResourceKind::CpuGuaranteedNs, Some(Owner::BestEffort))
            + total(ResourceKind::CpuSlackNs, Some(Owner::BestEffort))
    );
}

#[test]
fn config_is_checked() {
    let over = RcaneConfig {
        capacity: Capacity { cpu_ppm: 100_000, ..RcaneConfig::default().capacity },
        ..RcaneConfig::default()
    };
    assert!(matches!(Rcane::<u8>::new(over, 0), Err(anode_sched::ConfigError::BuiltinsExceedCapacity { .. })));
    let two = RcaneConfig {
        capacity: Capacity { cpu_ppm: 2_000_000, ..RcaneConfig::default().capacity },
        ..RcaneConfig::default()
    };
    assert!(matches!(Rcane::<u8>::new(two, 0), Err(anode_sched::ConfigError::CapacityAboveOneCpu(_))));
    let bounds = RcaneConfig { min_period_ns: 10, max_period_ns: 5, ..RcaneConfig::default() };
    assert!(matches!(Rcane::<u8>::new(bounds, 0), Err(anode_sched::ConfigError::PeriodBounds { .. })));
}

/// Runs P's churn for 200 ms in 0.5 ms steps, `churn` making P's new VP
/// (and its pool, kept full) at each step; returns the CPU P received.
fn churned_cpu(n: &mut Rcane<u32>, mut churn: impl FnMut(&mut Rcane<u32>, u64) -> PoolId) -> u64 {
    let step = MS / 2;
    let mut rng = Rng(7);
    let mut got = 0;
    let mut now = 0;
    for i in 0..400u64 {
        let t = i * step;
        let pool = churn(n, t);
        for e in 0..8 {
            let _ = n.post(pool, e, t);
        }
        now = now.max(t);
        got += drive(n, &mut now, t + step, Grain::Exact, &mut rng).iter().map(Charged::total_ns).sum::<u64>();
    }
    got
}

#[test]
fn replacing_a_vp_or_reopening_a_session_over_and_over_takes_no_more_than_the_guarantee() {
    // P holds one VP of 1 ms in 10 ms (10 %, no slack) and has work all the
    // time. Every 0.5 ms it replaces the VP (remove and add in one request)
    // or closes its session and opens another: each new VP used to begin a
    // period with a whole slice, which took P 60 % of the CPU. Over 200 ms
    // it may have its 20 slices and a little.
    let spec = PoolSpec { max_queued: 64, max_in_progress: 1 };
    let one = vp(MS, 10 * MS, false);
    let c = generous();
    // Replacing the VP.
    let mut n = node();
    let g = n.open_session(P, c, None, &add(&[one]), 0).unwrap();
    let mut cur = g.added[0];
    let got = churned_cpu(&mut n, |n, t| {
        let req = ReserveRequest { vps: vec![VpOp::Remove(cur), VpOp::Add(one)], ..ReserveRequest::default() };
        cur = n.reserve(&P, g.session, &req, t).unwrap().added[0];
        n.open_pool(&P, g.session, cur, spec, t).unwrap()
    });
    assert!(got <= 21 * MS, "replacing its VP, P got {} ms of 200, its share is 20", got / MS);
    // Reopening the session.
    let mut n = node();
    let mut sid = None;
    let got = churned_cpu(&mut n, |n, t| {
        if let Some(s) = sid {
            n.close_session(&P, s, t).unwrap();
        }
        let g = n.open_session(P, c, None, &add(&[one]), t).unwrap();
        sid = Some(g.session);
        n.open_pool(&P, g.session, g.added[0], spec, t).unwrap()
    });
    assert!(got <= 21 * MS, "reopening its session, P got {} ms of 200, its share is 20", got / MS);
}
