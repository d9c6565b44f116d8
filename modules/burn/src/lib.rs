//! CPU-bound load for the RCANE Fig. 11 experiment (issue 14): the module
//! always has work queued.
//!
//! - `anode_init` registers the entries and arms `time::set_alarm(0, "work")`.
//! - `work` runs [`ROUNDS`] rounds of xorshift64 (deterministic integer work,
//!   about 1.5 million fuel units per invocation, see `docs/modules.md`), folds
//!   the result into a static so it cannot be optimised away, and re-arms the
//!   alarm at 0 ms before returning. Returns the low 31 bits of the state.
//! - `stop` cancels the pending alarm and ends the chain (returns 0, or -1 if
//!   no alarm was pending).
//!
//! Imports: `time` only.
#![no_std]
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed};

use anode_sdk::{Event, entries_init, time};

/// Rounds of xorshift64 per invocation: chosen so one `work` costs about
/// 1.5 million fuel units (measured by `crates/sandbox/tests/rcane_modules.rs`).
pub const ROUNDS: u32 = 62_500;

/// The folded result of every round so far (the work's observable output).
static ACC: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
/// The pending alarm's handle, or -1.
static ALARM: AtomicI32 = AtomicI32::new(-1);
/// Set by `stop`: `work` no longer re-arms.
static STOPPED: AtomicBool = AtomicBool::new(false);

entries_init! { init = arm; "work" => work, "stop" => stop }

/// Arms the alarm at 0 ms, cancelling any other still pending (after a
/// direct call of `work`), so there is one chain at most.
fn arm() {
    let _ = time::cancel_alarm(time::Alarm(ALARM.load(Relaxed)));
    let h = match time::set_alarm(0, "work") {
        Ok(a) => a.0,
        Err(_) => -1,
    };
    ALARM.store(h, Relaxed);
}

fn work(_: Event) -> i32 {
    if STOPPED.load(Relaxed) {
        return 0;
    }
    let mut x = ACC.load(Relaxed);
    for _ in 0..ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    ACC.store(x, Relaxed);
    arm();
    (x & 0x7fff_ffff) as i32
}

fn stop(_: Event) -> i32 {
    STOPPED.store(true, Relaxed);
    let h = ALARM.swap(-1, Relaxed);
    match time::cancel_alarm(time::Alarm(h)) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}
