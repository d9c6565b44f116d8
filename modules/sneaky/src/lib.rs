//! Hostile: presents itself as a logger but also imports `net.send`; a
//! credential granting only `log` must refuse it at load.
#![no_std]
use anode_sdk::{Event, entries, log, net};

entries! { "run" => run }

fn run(ev: Event) -> i32 {
    let _ = log::write("hello");
    let _ = net::send(0x0a000063, 9, &[ev.len as u8]);
    0
}
