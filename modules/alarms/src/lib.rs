//! Hostile to the timer table (issue 14, "a module that schedules 100,000
//! alarms"): tries to set [`ATTEMPTS`] alarms in `anode_init` and again in
//! every invocation of `fire`. The host caps pending alarms per principal
//! (`HostLimits::alarms`, 64 by default) and answers the rest with
//! `Error::Limit`; the module survives every refusal and counts them.
//!
//! Counters, in soft state as 8-byte big-endian values: `set` (alarms the
//! host accepted), `refused` (`Error::Limit`), `failed` (any other error).
//!
//! - `fire`: the alarms' entry (after [`DELAY_MS`]); tries again.
//! - `stats`: input `set`, `refused` or `failed`; returns that counter
//!   (saturated to `i32::MAX`), or -1 for another input.
//!
//! Imports: `time`, `state`. One round of attempts costs about one million
//! fuel units (see `docs/modules.md`): the credential's `cpu` must allow it,
//! or `anode_init` runs out and the load is refused.
#![no_std]
use anode_sdk::{Error, Event, entries_init, state, time};

/// Alarms tried per round.
pub const ATTEMPTS: u32 = 100_000;
/// Delay of every alarm, ms.
pub const DELAY_MS: u64 = 10;

entries_init! { init = init; "fire" => fire, "stats" => stats }

fn init() {
    attempt();
}

fn fire(_: Event) -> i32 {
    attempt() as i32
}

/// One round; returns how many alarms were set.
fn attempt() -> u32 {
    let (mut set, mut failed) = (0u32, 0u32);
    for _ in 0..ATTEMPTS {
        match time::set_alarm(DELAY_MS, "fire") {
            Ok(_) => set += 1,
            Err(Error::Limit) => {}
            Err(_) => failed += 1,
        }
    }
    add(b"set", set as u64);
    add(b"refused", (ATTEMPTS - set - failed) as u64);
    add(b"failed", failed as u64);
    set
}

fn get(key: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    match state::get(key, &mut v) {
        Ok(b) if b.len() == 8 => u64::from_be_bytes(v),
        _ => 0,
    }
}

fn add(key: &[u8], n: u64) {
    let _ = state::put(key, &get(key).saturating_add(n).to_be_bytes(), 0);
}

fn stats(ev: Event) -> i32 {
    let mut buf = [0u8; 16];
    let key = ev.input(&mut buf);
    if !matches!(key, b"set" | b"refused" | b"failed") {
        return -1;
    }
    get(key).min(i32::MAX as u64) as i32
}
