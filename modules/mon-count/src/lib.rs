//! The trivial monitoring module: counts packets and bytes; the periodic
//! part exports the totals. The benchmark's baseline for the cost of
//! entering the sandbox.
#![no_std]
use anode_monitor_apps::abi::{Element, Field, RecordBuilder, View};
use anode_sdk::monitor::{self, Global};

static COUNT: Global<(u64, u64)> = Global::new((0, 0));

fn packet(view: &[u8], _index: u32, _status: u32) {
    if let Some(v) = View::new(view) {
        COUNT.with(|c| {
            c.0 += 1;
            c.1 += v.get(Field::WireLen);
        });
    }
}

fn tick(now_ns: u64) {
    let (p, b) = COUNT.with(|c| *c);
    let mut r = RecordBuilder::new(6);
    r.uint(Element::Ts, now_ns).uint(Element::Packets, p).uint(Element::Len, b);
    let _ = monitor::emit(r.as_bytes());
}

anode_sdk::monitor_module!(packet, tick);
