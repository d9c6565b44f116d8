//! TCP handshake round-trip time as a monitoring module: SYN time stored under seq + 1, the ACK in the same direction completes it; 4096-entry table, SYNs forgotten after 30 s.
#![no_std]
use anode_monitor_apps::abi::View;
use anode_monitor_apps::{App, Sink};
use anode_sdk::monitor::{self, Global};

// A constant initialiser that is all zero bytes lands in .bss, not in the binary.
static APP: Global<anode_monitor_apps::rtt::Rtt> = Global::new(anode_monitor_apps::rtt::Rtt::new(0));

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
