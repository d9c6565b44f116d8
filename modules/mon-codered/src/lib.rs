//! Code Red I/II detection as a monitoring module: GET /default.ida? followed by 200+ N or X, reassembled across segments (in any order) in the first 1 KiB of each of up to 256 flows.
#![no_std]
use anode_monitor_apps::abi::View;
use anode_monitor_apps::{App, Sink};
use anode_sdk::monitor::{self, Global};

// A constant initialiser that is all zero bytes lands in .bss, not in the binary.
static APP: Global<anode_monitor_apps::codered::CodeRed> = Global::new(anode_monitor_apps::codered::CodeRed::new());

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
