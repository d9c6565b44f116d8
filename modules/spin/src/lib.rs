//! Hostile: entry `run` never returns.
#![no_std]
use anode_sdk::{Event, entries};

entries! { "run" => run }

fn run(ev: Event) -> i32 {
    let mut x = ev.len as u64;
    loop {
        x = core::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}
