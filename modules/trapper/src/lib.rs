//! Hostile: entry `run` traps on every call.
#![no_std]
use anode_sdk::{Event, entries};

entries! { "run" => run }

fn run(ev: Event) -> i32 {
    if core::hint::black_box(ev.len) < usize::MAX {
        core::arch::wasm32::unreachable();
    }
    0
}
