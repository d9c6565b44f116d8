//! Hostile to the scheduler (issue 14, "a module that yields constantly"):
//! does almost nothing per invocation but always has the next one queued, so
//! it maximises invocations (scheduler events) per second.
//!
//! - `anode_init` arms `time::set_alarm(0, "tick")`.
//! - `tick` counts the invocation and re-arms the alarm at 0 ms; returns the
//!   count (saturated to `i32::MAX`).
//! - `stop` cancels the pending alarm and ends the chain.
//! - `count` returns the number of `tick`s so far.
//!
//! Imports: `time` only.
#![no_std]
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering::Relaxed};

use anode_sdk::{Event, entries_init, time};

static TICKS: AtomicU32 = AtomicU32::new(0);
static ALARM: AtomicI32 = AtomicI32::new(-1);
static STOPPED: AtomicBool = AtomicBool::new(false);

entries_init! { init = arm; "tick" => tick, "stop" => stop, "count" => count }

/// Arms the alarm at 0 ms, cancelling any other still pending (after a
/// direct call of `tick`), so there is one chain at most.
fn arm() {
    let _ = time::cancel_alarm(time::Alarm(ALARM.load(Relaxed)));
    let h = match time::set_alarm(0, "tick") {
        Ok(a) => a.0,
        Err(_) => -1,
    };
    ALARM.store(h, Relaxed);
}

fn tick(_: Event) -> i32 {
    if STOPPED.load(Relaxed) {
        return 0;
    }
    let n = TICKS.load(Relaxed).saturating_add(1);
    TICKS.store(n, Relaxed);
    arm();
    n.min(i32::MAX as u32) as i32
}

fn stop(_: Event) -> i32 {
    STOPPED.store(true, Relaxed);
    match time::cancel_alarm(time::Alarm(ALARM.swap(-1, Relaxed))) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

fn count(_: Event) -> i32 {
    TICKS.load(Relaxed).min(i32::MAX as u32) as i32
}
