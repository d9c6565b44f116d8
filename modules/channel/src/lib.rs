//! A channel switchlet: at init opens a channel for port 4000 packets whose
//! payload starts with "hi", and arms a 100 ms alarm. Each matching packet is
//! echoed to its source on port 4001 and counted in soft state; the alarm
//! logs the count. `close` closes the channel.
#![no_std]
use anode_sdk::{Event, log, net, state, time};

static mut CHANNEL: i32 = 0;

#[unsafe(no_mangle)]
pub extern "C" fn anode_init() {
    extern "C" fn on_packet_t(arg: i32, len: i32) -> i32 {
        on_packet(Event { arg, len: len.max(0) as usize })
    }
    extern "C" fn tick_t(arg: i32, len: i32) -> i32 {
        tick(Event { arg, len: len.max(0) as usize })
    }
    extern "C" fn close_t(arg: i32, len: i32) -> i32 {
        close(Event { arg, len: len.max(0) as usize })
    }
    let _ = anode_sdk::register("on_packet", on_packet_t);
    let _ = anode_sdk::register("tick", tick_t);
    let _ = anode_sdk::register("close", close_t);
    if let Ok(c) = net::open_channel(4000, b"hi", "on_packet") {
        unsafe { CHANNEL = c.0 };
    }
    let _ = time::set_alarm(100, "tick");
}

fn seen() -> u32 {
    let mut v = [0u8; 4];
    match state::get(b"seen", &mut v) {
        Ok(b) if b.len() == 4 => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        _ => 0,
    }
}

fn on_packet(ev: Event) -> i32 {
    let mut buf = [0u8; 512];
    let data = ev.input(&mut buf);
    let n = seen() + 1;
    let _ = state::put(b"seen", &n.to_be_bytes(), 0);
    match net::send(net::source(), 4001, data) {
        Ok(()) => n as i32,
        Err(_) => -1,
    }
}

fn tick(_: Event) -> i32 {
    let _ = log::write("channel tick");
    seen() as i32
}

fn close(_: Event) -> i32 {
    match net::close_channel(net::Channel(unsafe { CHANNEL })) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}
