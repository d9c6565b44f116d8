//! One heap per session (issue 15, RCANE §IV-E): every store and the host
//! state of a principal draw from its session's reservation; hostile
//! modules stop at it with a counted refusal, and another session's service
//! is unchanged.
#![allow(clippy::unwrap_used)]

mod common;

use anode_sandbox::heap::{HANDLE_BYTES, JOB_BYTES, PRESSURE_ENTRY, STATE_ENTRY_BYTES};
use anode_sandbox::{Action, HeapUse, InvokeError, Job, JobKind, Sandbox};
use common::heap::*;
use common::*;

const MIB: usize = 1 << 20;
const PAGE: usize = 64 << 10;

fn heap(sb: &Sandbox, n: u8) -> HeapUse {
    sb.heap(&principal(n)).unwrap()
}

/// A victim's service: grows a page, marks every page, and reads the marks
/// back; returns its page count.
fn victim_serves(sb: &mut Sandbox, id: anode_sandbox::ModuleId) -> i32 {
    let mut out = Vec::new();
    let before = run(sb, id, "grow", 1, &mut out).unwrap();
    assert!(before > 0, "the victim could not grow one page");
    assert_eq!(run(sb, id, "mark", 0, &mut out), Ok(0));
    let pages = before + 1;
    assert_eq!(run(sb, id, "sum", 0, &mut out), Ok(7 * pages), "the victim's memory is intact");
    pages
}

/// Two principals, each with a 1 MiB session heap and the heap module.
fn two_sessions(cpu: u64) -> (Sandbox, anode_sandbox::ModuleId, anode_sandbox::ModuleId) {
    let mut sb = sandbox();
    let code = heap_module();
    sb.set_session_heap(principal(1), Some(MIB));
    sb.set_session_heap(principal(2), Some(MIB));
    let bad = load_heap(&mut sb, &code, principal(1), cpu);
    let good = load_heap(&mut sb, &code, principal(2), cpu);
    (sb, bad, good)
}

#[test]
fn memories_and_tables_of_every_store_are_charged_to_one_account() {
    let mut sb = sandbox();
    let code = heap_module();
    sb.set_session_heap(principal(1), Some(MIB));
    let a = load_heap(&mut sb, &code, principal(1), 1_000_000);
    let u = heap(&sb, 1);
    // One page of memory, a 15-element table.
    assert_eq!((u.memory, u.tables, u.reservation), (PAGE, 16 * 8, Some(MIB)));
    // A second module of the same principal draws from the same account.
    let b = load_heap(&mut sb, &heap_module_2(), principal(1), 1_000_000);
    assert_ne!(a, b);
    let u = heap(&sb, 1);
    assert_eq!((u.memory, u.tables), (2 * PAGE, 2 * 16 * 8));
    // Together they stop at the reservation: 16 pages less the 2 they hold.
    let mut out = Vec::new();
    assert_eq!(run(&mut sb, a, "grow", 8, &mut out), Ok(1));
    assert_eq!(run(&mut sb, b, "grow", 6, &mut out), Ok(-1), "8 + 6 + 2 pages and the tables exceed 1 MiB");
    assert_eq!(run(&mut sb, b, "grow", 5, &mut out), Ok(1));
    let u = heap(&sb, 1);
    assert_eq!(u.memory, 15 * PAGE);
    assert!(u.used <= MIB);
    assert_eq!(u.refusals, 1);
    // Unloading a module does not free its memory while its store lives
    // (wasm memories are reserved, never shrunk); unloading the last one
    // drops the store and gives everything back.
    sb.unload(a);
    sb.unload(b);
    let u = heap(&sb, 1);
    assert_eq!((u.memory, u.tables, u.handles), (0, 0, 0));
}

#[test]
fn memory_bomb_in_one_session_stops_at_its_reservation_and_the_other_is_unchanged() {
    let (mut sb, bad, good) = two_sessions(10_000_000);
    let pages = victim_serves(&mut sb, good);
    let before = heap(&sb, 2);
    let mut out = Vec::new();
    for _ in 0..3 {
        assert_eq!(run(&mut sb, bad, "bomb", 0, &mut out), Err(InvokeError::MemoryLimit));
    }
    let u = heap(&sb, 1);
    assert!(u.used <= MIB, "{u:?}");
    assert!(u.memory > MIB / 2, "it did grow first: {u:?}");
    assert_eq!(u.refusals, 3, "one counted refusal per bomb");
    assert_eq!(sb.module(bad).unwrap().counters.memory_exhausted, 3);
    // The victim: same account, still serving, memory intact.
    assert_eq!(heap(&sb, 2), before);
    assert_eq!(victim_serves(&mut sb, good), pages + 1);
    assert_eq!(heap(&sb, 2).refusals, 0);
}

#[test]
fn a_module_growing_in_small_steps_forever_stops_at_its_reservation() {
    let (mut sb, bad, good) = two_sessions(2_000_000);
    let mut out = Vec::new();
    // One invocation that grows a page at a time and never stops: its
    // memory stops at the reservation, its CPU bound ends it (reported as
    // the memory limit, which it ran into first).
    assert_eq!(run(&mut sb, bad, "creep", 0, &mut out), Err(InvokeError::MemoryLimit));
    assert_eq!(sb.module(bad).unwrap().counters.memory_exhausted, 1);
    let u = heap(&sb, 1);
    assert!(u.used <= MIB && u.memory >= MIB - 2 * PAGE, "{u:?}");
    assert!(u.refusals > 1000, "every refused step is counted: {u:?}");
    // And one page per invocation, a thousand times.
    for _ in 0..1000 {
        assert_eq!(run(&mut sb, bad, "grow", 1, &mut out), Ok(-1));
    }
    assert!(heap(&sb, 1).used <= MIB);
    assert!(heap(&sb, 1).refusals > u.refusals + 999);
    assert_eq!(victim_serves(&mut sb, good), 2);
    assert_eq!(heap(&sb, 2).refusals, 0);
}

#[test]
fn a_session_that_queues_packets_without_reading_them_stops_at_its_reservation() {
    let (mut sb, bad, good) = two_sessions(1_000_000);
    let mut out = Vec::new();
    // Both listen on port 4000 (every payload); the hostile session's VP never runs.
    assert!(run(&mut sb, bad, "listen", 4000, &mut out).unwrap() > 0);
    assert!(run(&mut sb, good, "listen", 4000, &mut out).unwrap() > 0);
    assert_eq!(heap(&sb, 1).handles, HANDLE_BYTES);
    let payload = vec![0u8; 1000];
    let mut held: Vec<Job> = Vec::new();
    let mut good_jobs = 0;
    for _ in 0..2000 {
        let mut jobs = Vec::new();
        sb.channel_jobs(addr(2), 4000, &payload, &mut jobs);
        for j in jobs {
            if sb.job_principal(&j) == Some(principal(1)) {
                held.push(j); // never read
            } else {
                // The other session reads its packet at once.
                assert_eq!(run_job(&mut sb, j, &mut out), Ok(0));
                good_jobs += 1;
            }
        }
    }
    let u = heap(&sb, 1);
    assert!(u.used <= MIB, "{u:?}");
    let per_job = 1000 + JOB_BYTES;
    assert_eq!(u.queued, held.len() * per_job);
    // Its channel's FIFO (64 KiB by default, docs/channels.md) binds before
    // its 1 MiB reservation: every packet not queued is counted against
    // that channel (the heap binding first: tests/channels.rs).
    assert_eq!(held.len(), 65, "stopped at its FIFO");
    let bad_channel = sb.channel_infos().into_iter().find(|c| c.module == bad.0).unwrap();
    assert_eq!(bad_channel.dropped_full as usize, 2000 - held.len(), "every packet not queued is counted");
    assert_eq!(good_jobs, 2000, "the other session received every packet");
    assert_eq!(run(&mut sb, good, "pkts", 0, &mut out), Ok(2000));
    assert_eq!(heap(&sb, 2).queued, 0);
    assert_eq!(heap(&sb, 2).refusals, 0);
    // Reading (or dropping) the queue gives its bytes back.
    let first = held.remove(0);
    assert_eq!(run_job(&mut sb, first, &mut out), Ok(0));
    drop(held);
    assert_eq!(heap(&sb, 1).queued, 0);
    assert_eq!(run(&mut sb, bad, "pkts", 0, &mut out), Ok(1));
}

#[test]
fn soft_state_is_charged_to_the_session_heap() {
    let (mut sb, bad, good) = two_sessions(10_000_000);
    let mut out = Vec::new();
    // Fill the memory first, so that little is left for state.
    assert_eq!(run(&mut sb, bad, "grow", 12, &mut out), Ok(1));
    let n = run(&mut sb, bad, "fill", 0, &mut out).unwrap();
    let u = heap(&sb, 1);
    assert!(u.used <= MIB, "{u:?}");
    assert_eq!(u.state, n as usize * (4 + 1000 + STATE_ENTRY_BYTES));
    assert!(n > 0 && (n as usize) < (MIB - 13 * PAGE) / 1000 + 1, "{n}");
    assert_eq!(u.refusals, 1, "the put that did not fit");
    assert_eq!(victim_serves(&mut sb, good), 2);
}

#[test]
fn pressure_calls_the_entry_once_per_crossing_and_a_hostile_one_is_contained() {
    let (mut sb, bad, good) = two_sessions(1_000_000);
    let mut out = Vec::new();
    assert_eq!(sb.poll_at(), None);
    // 12 pages of 16 (and the table): 81 %.
    assert_eq!(run(&mut sb, good, "grow", 12, &mut out), Ok(1));
    assert_eq!(sb.poll_at(), Some(0), "the callback is due");
    let mut jobs = Vec::new();
    sb.due_jobs(now(2), &mut jobs);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].kind, JobKind::Entry { entry: PRESSURE_ENTRY.into(), arg: 81 });
    assert_eq!(sb.job_principal(&jobs[0]), Some(principal(2)));
    for j in jobs.drain(..) {
        assert_eq!(run_job(&mut sb, j, &mut out), Ok(0));
    }
    assert_eq!(run(&mut sb, good, "pcount", 0, &mut out), Ok(1));
    // Still above: not called again.
    assert_eq!(run(&mut sb, good, "grow", 1, &mut out), Ok(13));
    assert_eq!(sb.poll_at(), None);
    assert_eq!(heap(&sb, 2).pressure_calls, 1);
    // A callback that spins is stopped by its CPU bound, like any entry.
    assert_eq!(run(&mut sb, bad, "hostile", 0, &mut out), Ok(0));
    assert_eq!(run(&mut sb, bad, "grow", 13, &mut out), Ok(1));
    sb.due_jobs(now(3), &mut jobs);
    assert_eq!(jobs.len(), 1);
    let j = jobs.pop().unwrap();
    assert_eq!(run_job(&mut sb, j, &mut out), Err(InvokeError::CpuExhausted));
    assert_eq!(run(&mut sb, good, "pcount", 0, &mut out), Ok(1));
    assert_eq!(run(&mut sb, good, "sum", 0, &mut out), Ok(0), "nothing wrote the victim's marks");
}

#[test]
fn heap_requests_go_to_the_node_and_a_shrink_below_use_is_refused_with_pressure() {
    let (mut sb, a, _) = two_sessions(1_000_000);
    let mut out = Vec::new();
    assert_eq!(run(&mut sb, a, "reserved", 0, &mut out), Ok(1024));
    // Grow: an action for the node, which decides (here: grants).
    assert_eq!(run(&mut sb, a, "ask", 2048, &mut out), Ok(0));
    let asked: Vec<_> = out.iter().filter(|x| matches!(x, Action::HeapRequest { .. })).cloned().collect();
    assert_eq!(asked, vec![Action::HeapRequest { principal: principal(1), module: a, bytes: 2 << 20 }]);
    sb.set_session_heap(principal(1), Some(2 << 20));
    assert_eq!(run(&mut sb, a, "reserved", 0, &mut out), Ok(2048));
    assert_eq!(run(&mut sb, a, "grow", 20, &mut out), Ok(1), "the larger reservation holds");
    // Shrinking below use: refused in the module, and its pressure entry is called.
    out.clear();
    assert_eq!(run(&mut sb, a, "ask", 512, &mut out), Ok(-3));
    assert!(out.is_empty());
    let mut jobs = Vec::new();
    sb.due_jobs(now(2), &mut jobs);
    assert_eq!(jobs.len(), 1);
    // One request per invocation.
    out.clear();
    assert_eq!(run(&mut sb, a, "ask_twice", 4096, &mut out), Ok(-3));
    assert_eq!(out.len(), 1, "{out:?}");
    // Without a session reservation the node is still asked (it knows
    // whether the principal has a session); there is none to report.
    sb.set_session_heap(principal(1), None);
    out.clear();
    assert_eq!(run(&mut sb, a, "ask", 4096, &mut out), Ok(0));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(run(&mut sb, a, "reserved", 0, &mut out), Ok(-5));
}

#[test]
fn without_a_session_the_credentials_memory_cap_still_applies() {
    let mut sb = sandbox();
    let code = heap_module();
    let id = load_heap(&mut sb, &code, principal(1), 10_000_000);
    let mut out = Vec::new();
    // Granted 64 MiB (load_heap): the bomb stops there.
    assert_eq!(run(&mut sb, id, "bomb", 0, &mut out), Err(InvokeError::MemoryLimit));
    let u = heap(&sb, 1);
    assert_eq!(u.reservation, None);
    assert!(u.memory <= 64 * MIB && u.memory > 60 * MIB, "{u:?}");
    assert_eq!(u.refusals, 1);
}

#[test]
fn code_staged_ahead_of_a_load_is_held_in_the_session_heap_until_it_ends() {
    let mut sb = sandbox();
    sb.set_session_heap(principal(1), Some(MIB));
    // Without a session heap nothing is charged and no account is made.
    let none = sb.charge_staged(principal(2), 300_000).unwrap();
    assert_eq!(none.bytes(), 0);
    assert!(sb.heap(&principal(2)).is_none());
    // With one, the declared bytes are held while the staging lasts.
    let held = sb.charge_staged(principal(1), 200_000).unwrap();
    assert_eq!(held.bytes(), 200_000);
    let u = heap(&sb, 1);
    assert_eq!((u.staged, u.used, u.refusals), (200_000, 200_000, 0));
    // More than the reservation has left is refused, counted, and holds
    // nothing.
    assert!(sb.charge_staged(principal(1), MIB - 200_000 + 1).is_none());
    let u = heap(&sb, 1);
    assert_eq!((u.staged, u.refusals), (200_000, 1));
    // The module loaded after it (or the staging dropped) gives it back,
    // and a module's memory then has the room.
    drop(held);
    assert_eq!(heap(&sb, 1).staged, 0);
    let m = load_heap(&mut sb, &heap_module(), principal(1), 1_000_000);
    let mut out = Vec::new();
    assert_eq!(run(&mut sb, m, "grow", 14, &mut out), Ok(1), "the staged bytes were given back");
}
