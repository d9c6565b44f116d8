//! A virtual-clock driver for the scheduler, and helpers.
#![allow(dead_code)]

use anode_sched::{Ceilings, Charged, Rcane, ReserveRequest, VpOp, VpParams};

pub const US: u64 = 1_000;
pub const MS: u64 = 1_000_000;
pub const S: u64 = 1_000_000_000;

/// xorshift64*: a small deterministic generator for jitter.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// How a dispatched VP gives the CPU back.
#[derive(Debug, Clone, Copy)]
pub enum Grain {
    /// Exactly at the end of its budget (perfect preemption).
    Exact,
    /// At its first preemption point at or after the budget: the code runs
    /// between preemption points for a uniform `min..=max` ns.
    Yield { min: u64, max: u64 },
}

/// Runs the node on a virtual clock from `*now` until `until`; every
/// dispatch runs for its budget as `grain` allows. Returns every charge.
pub fn drive<E>(node: &mut Rcane<E>, now: &mut u64, until: u64, grain: Grain, rng: &mut Rng) -> Vec<Charged> {
    let mut charges = Vec::new();
    while *now < until {
        match node.pick(*now) {
            None => *now = node.poll_at().unwrap_or(until).clamp(*now + 1, until),
            Some(d) => {
                assert!(d.budget_ns >= 1);
                let used = match grain {
                    Grain::Exact => d.budget_ns,
                    Grain::Yield { min, max } => {
                        let mut used = 0;
                        while used < d.budget_ns {
                            used += rng.range(min, max);
                        }
                        used
                    }
                };
                *now += used;
                charges.push(node.charge(&d, used, *now));
            }
        }
    }
    charges
}

/// Ceilings that allow a lot.
pub fn generous() -> Ceilings {
    Ceilings {
        max_vp_share_ppm: 1_000_000,
        max_total_share_ppm: 1_000_000,
        max_vps: 16,
        extra: true,
        max_heap_bytes: 64 << 20,
        max_tx_bytes_per_sec: 1 << 30,
        max_rx_bytes_per_sec: 1 << 30,
        max_pools: 8,
        max_queued_events: 1024,
    }
}

pub fn vp(slice_ns: u64, period_ns: u64, extra: bool) -> VpParams {
    VpParams { slice_ns, period_ns, extra }
}

pub fn add(params: &[VpParams]) -> ReserveRequest {
    ReserveRequest { vps: params.iter().map(|p| VpOp::Add(*p)).collect(), ..ReserveRequest::default() }
}
