//! Trajectory sampling (Duffield and Grossglauser) as a monitoring module: samples 10 % of packets by a hash over their invariant fields (seed 0x5a4d), exports a flow record per new flow, a packet record and the packet itself per sample.
#![no_std]
use anode_monitor_apps::abi::View;
use anode_monitor_apps::{App, Sink};
use anode_sdk::monitor::{self, Global};

/// Sampling rate, parts per million (every monitor on a path must use the same).
const RATE_PPM: u32 = 100_000;
/// Hash seed (the same on every monitor).
const SEED: u64 = 0x5a4d;

// The state is a static with a constant initialiser (small enough to sit in the binary's data).
static APP: Global<anode_monitor_apps::trajectory::Trajectory> =
    Global::new(anode_monitor_apps::trajectory::Trajectory::new(RATE_PPM, SEED));

/// Records and samples go to the monitor; `index` names the packet in the call.
struct Host(u32);

impl Sink for Host {
    fn record(&mut self, rec: &[u8]) {
        let _ = monitor::emit(rec);
    }
    fn sample(&mut self) {
        let _ = monitor::sample(self.0);
    }
}

fn packet(view: &[u8], index: u32, _status: u32) {
    if let Some(v) = View::new(view) {
        APP.with(|a| a.packet(&v, &mut Host(index)));
    }
}

fn tick(now_ns: u64) {
    APP.with(|a| a.tick(now_ns, &mut Host(0)));
}

anode_sdk::monitor_module!(packet, tick);
