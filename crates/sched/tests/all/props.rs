//! Property tests of the scheduler and admission control, on a virtual clock.

use crate::common::*;
use anode_sched::{
    Ceilings, Owner, PrincipalId, Rcane, RcaneConfig, ReserveRequest, SessionId, SessionInfo, VpId, VpOp,
};
use proptest::prelude::*;
use std::collections::HashMap;

const PERIODS: [u64; 8] = [MS, 2 * MS, 3 * MS, 4 * MS, 5 * MS, 8 * MS, 10 * MS, 20 * MS];

fn principal(i: usize) -> PrincipalId {
    PrincipalId([i as u8 + 1; 32])
}

fn node() -> Rcane<u8> {
    Rcane::new(RcaneConfig::default(), 0).unwrap()
}

/// Admits what fits of `specs` (one session each) and makes them CPU bound,
/// with Best-Effort busy too; returns the admitted VPs with their params.
fn admit(n: &mut Rcane<u8>, specs: &[(usize, u64, bool)]) -> Vec<(VpId, u64, bool)> {
    let mut admitted = Vec::new();
    for (i, &(pi, permille, extra)) in specs.iter().enumerate() {
        let period = PERIODS[pi];
        let slice = (period * permille / 1000).max(10 * US);
        if let Ok(g) = n.open_session(principal(i), generous(), None, &add(&[vp(slice, period, extra)]), 0) {
            n.set_busy(g.added[0], true, 0).unwrap();
            admitted.push((g.added[0], slice, extra));
        }
    }
    n.set_busy(n.best_effort().1, true, 0).unwrap();
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every admitted CPU-bound VP gets exactly its slice in every period
    /// (no extra), or at least its slice (extra), when the caller preempts
    /// exactly at the end of each dispatch.
    #[test]
    fn every_admitted_vp_gets_its_slice_every_period(
        specs in prop::collection::vec((0usize..8, 10u64..400, any::<bool>()), 1..10)
    ) {
        let mut n = node();
        let admitted = admit(&mut n, &specs);
        prop_assert!(n.sched().total_share_ppm() <= 950_000);
        let (mut now, mut rng) = (0, Rng(1));
        drive(&mut n, &mut now, 200 * MS, Grain::Exact, &mut rng);
        let mut seen: HashMap<VpId, usize> = HashMap::new();
        for r in n.drain_periods() {
            let Some(&(_, slice, extra)) = admitted.iter().find(|(v, ..)| *v == r.vp) else { continue };
            prop_assert!(!r.idle);
            prop_assert_eq!(r.slice_ns, slice);
            if extra {
                prop_assert!(r.received_ns >= slice, "{:?}", r);
            } else {
                prop_assert_eq!(r.received_ns, slice, "{:?}", r);
                prop_assert_eq!(r.slack_ns, 0);
            }
            *seen.entry(r.vp).or_default() += 1;
        }
        for (v, ..) in &admitted {
            prop_assert!(seen.get(v).copied().unwrap_or(0) >= 9, "VP {} had too few periods", v);
        }
    }

    /// Slack is shared: runnable VPs with extra (Best-Effort among them) get
    /// slack within one quantum of each other; VPs without extra get none.
    #[test]
    fn slack_is_shared_equally(extra in 1usize..5, plain in 0usize..3) {
        let mut n = node();
        let mut specs = vec![(6usize, 20u64, true); extra];
        specs.extend(vec![(3usize, 100u64, false); plain]);
        let admitted = admit(&mut n, &specs);
        let (mut now, mut rng) = (0, Rng(2));
        drive(&mut n, &mut now, S, Grain::Exact, &mut rng);
        let mut slack: Vec<u64> = admitted.iter().filter(|a| a.2).map(|a| n.sched().info(a.0).unwrap().totals.slack_ns).collect();
        slack.push(n.sched().info(n.best_effort().1).unwrap().totals.slack_ns);
        let (lo, hi) = (slack.iter().min().copied().unwrap_or(0), slack.iter().max().copied().unwrap_or(0));
        prop_assert!(lo > 0);
        prop_assert!(hi - lo <= 2 * MS, "slack {:?}", slack);
        for a in admitted.iter().filter(|a| !a.2) {
            prop_assert_eq!(n.sched().info(a.0).unwrap().totals.slack_ns, 0);
        }
    }

    /// A VP that overruns its dispatches pays for it in its next periods: it
    /// never gets more than one overrun beyond its slice in any period, nor
    /// more than its share plus one slice and one overrun in the long run.
    #[test]
    fn overruns_are_charged_to_the_overrunner(pi in 0usize..8, permille in 50u64..300, max_over_us in 1u64..500, seed in 1u64..1000) {
        let mut n = node();
        let period = PERIODS[pi];
        let slice = period * permille / 1000;
        let admitted = admit(&mut n, &[(pi, permille, false), (3, 200, false)]);
        let x = admitted[0].0;
        let max_over = max_over_us * US;
        let (mut now, mut rng) = (0u64, Rng(seed));
        while now < 300 * MS {
            match n.pick(now) {
                None => now = n.poll_at().unwrap().max(now + 1),
                Some(d) => {
                    let used = d.budget_ns + if d.vp == x { rng.range(0, max_over) } else { 0 };
                    now += used;
                    let _ = n.charge(&d, used, now);
                }
            }
        }
        let t = n.sched().info(x).unwrap().totals;
        let got = t.guaranteed_ns + t.overrun_ns + t.slack_ns;
        let periods = now / period + 1;
        prop_assert!(got <= periods * slice + max_over, "{} > {} periods x {} + {}", got, periods, slice, max_over);
        prop_assert_eq!(t.slack_ns, 0);
        for r in n.drain_periods().filter(|r| r.vp == x) {
            prop_assert!(r.received_ns <= r.slice_ns + max_over, "{:?}", r);
        }
    }

    /// Admission never lets guarantees exceed capacity or ceilings, and a
    /// refused request changes nothing.
    #[test]
    fn admission_keeps_capacity_and_refusals_change_nothing(
        ops in prop::collection::vec((0usize..3, 0u8..5, 0u8..8, 1u64..500, 0usize..8, any::<bool>()), 1..40)
    ) {
        let mut n = node();
        let ceil = |p: usize| Ceilings {
            max_vp_share_ppm: [200_000, 400_000, 1_000_000][p],
            max_total_share_ppm: [300_000, 500_000, 900_000][p],
            max_vps: [2, 3, 8][p] as u32,
            extra: p == 2,
            max_heap_bytes: 1 << 20,
            ..Ceilings::NONE
        };
        let mut sessions: Vec<(usize, SessionId)> = Vec::new();
        for (step, (p, kind, k, permille, pi, extra)) in ops.into_iter().enumerate() {
            let now = step as u64 * MS;
            let params = vp((PERIODS[pi] * permille / 1000).max(10 * US), PERIODS[pi], extra);
            let mine: Vec<SessionId> = sessions.iter().filter(|(q, _)| *q == p).map(|(_, s)| *s).collect();
            let snapshot = |n: &mut Rcane<u8>| -> Vec<SessionInfo> {
                let ids: Vec<SessionId> = n.sessions().collect();
                ids.into_iter().map(|s| n.session_info(s, now).unwrap()).collect()
            };
            let before = snapshot(&mut n);
            let ok = match (kind, mine.get(usize::from(k) % mine.len().max(1))) {
                (0, _) | (_, None) => {
                    let req = ReserveRequest { heap_bytes: Some(u64::from(k) << 17), ..add(&vec![params; usize::from(k % 3)]) };
                    match n.open_session(principal(p), ceil(p), None, &req, now) {
                        Ok(g) => { sessions.push((p, g.session)); true }
                        Err(_) => false,
                    }
                }
                (1, Some(&s)) => n.reserve(&principal(p), s, &add(&[params, params]), now).is_ok(),
                (2, Some(&s)) => {
                    let vps = n.session_info(s, now).unwrap().vps;
                    let op = match vps.first() { Some((v, _)) => VpOp::Change(*v, params), None => VpOp::Add(params) };
                    n.reserve(&principal(p), s, &ReserveRequest { vps: vec![op], ..ReserveRequest::default() }, now).is_ok()
                }
                (3, Some(&s)) => {
                    let vps = n.session_info(s, now).unwrap().vps;
                    let ops = vps.iter().take(1).map(|(v, _)| VpOp::Remove(*v)).collect();
                    n.reserve(&principal(p), s, &ReserveRequest { vps: ops, heap_bytes: Some(u64::from(k) << 18), ..ReserveRequest::default() }, now).is_ok()
                }
                (_, Some(&s)) => {
                    sessions.retain(|(_, x)| *x != s);
                    n.close_session(&principal(p), s, now).is_ok()
                }
            };
            prop_assert!(n.sched().total_share_ppm() <= 950_000);
            let after = snapshot(&mut n);
            if !ok {
                prop_assert_eq!(&before, &after, "a refused request changed the node");
            }
            for info in &after {
                if let Owner::Principal(pid) = info.owner {
                    let c = ceil(usize::from(pid.0[0]) - 1);
                    prop_assert!(info.share_ppm <= c.max_total_share_ppm);
                    prop_assert!(info.vps.len() <= c.max_vps as usize);
                    prop_assert!(info.vps.iter().all(|(_, p)| p.share_ppm() <= c.max_vp_share_ppm && (c.extra || !p.extra)));
                    prop_assert!(info.heap_bytes <= c.max_heap_bytes);
                }
            }
            let heap: u64 = after.iter().map(|i| i.heap_bytes).sum();
            prop_assert!(heap <= n.config().capacity.heap_bytes);
        }
    }

    /// Handles cannot be forged: a raw handle works for a principal only if
    /// it names that principal's own session or VP.
    #[test]
    fn handles_cannot_be_forged(attempts in prop::collection::vec((0usize..3, 0u64..12, 0u64..4, any::<bool>()), 1..60)) {
        let mut n = node();
        let mut own: HashMap<SessionId, usize> = HashMap::new();
        let mut vp_owner: HashMap<VpId, SessionId> = HashMap::new();
        for p in 0..3 {
            for _ in 0..2 {
                let g = n.open_session(principal(p), Ceilings { max_vps: 4, max_vp_share_ppm: 50_000, max_total_share_ppm: 200_000, ..Ceilings::NONE }, None, &add(&[vp(100 * US, 10 * MS, false)]), 0).unwrap();
                own.insert(g.session, p);
                vp_owner.insert(g.added[0], g.session);
            }
        }
        for (step, (p, index, generation, as_session)) in attempts.into_iter().enumerate() {
            let now = step as u64;
            let raw = generation << 32 | index;
            if as_session {
                let sid = SessionId::from_raw(raw);
                let r = n.close_session(&principal(p), sid, now);
                prop_assert_eq!(r.is_ok(), own.get(&sid) == Some(&p), "close of {} by {}: {:?}", sid, p, r);
                if r.is_ok() {
                    own.remove(&sid);
                }
            } else {
                let v = VpId::from_raw(raw);
                let Some((&sid, _)) = own.iter().find(|(_, q)| **q == p) else { continue };
                let req = ReserveRequest { vps: vec![VpOp::Remove(v)], ..ReserveRequest::default() };
                let r = n.reserve(&principal(p), sid, &req, now);
                prop_assert_eq!(r.is_ok(), vp_owner.get(&v) == Some(&sid), "remove of {} in {}: {:?}", v, sid, r);
                if r.is_ok() {
                    vp_owner.remove(&v);
                }
            }
        }
    }
}
