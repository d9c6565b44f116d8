//! Hostile: entry `run` grows linear memory until the host refuses, then traps.
#![no_std]
use anode_sdk::{Event, entries};

entries! { "run" => run }

fn run(_: Event) -> i32 {
    loop {
        if core::arch::wasm32::memory_grow(0, 16) == usize::MAX {
            core::arch::wasm32::unreachable();
        }
    }
}
