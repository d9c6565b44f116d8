//! The Roughan-Veitch-Abry real-time Hurst estimator as a monitoring module: packets counted per 1 ms in the per-packet part, the Haar pyramid and the fit (octaves from 2) in the periodic part.
#![no_std]
use anode_monitor_apps::abi::View;
use anode_monitor_apps::{App, Sink};
use anode_sdk::monitor::{self, Global};

/// Counting interval, ns.
const BIN_NS: u64 = 1_000_000;
/// First octave of the fit.
const J1: usize = 2;

// The state is a static with a constant initialiser (small enough to sit in the binary's data).
static APP: Global<anode_monitor_apps::hurst::Hurst> = Global::new(anode_monitor_apps::hurst::Hurst::new(BIN_NS, J1));

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
