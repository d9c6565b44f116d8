//! The transcoder's cache pod (Expert Fig. 3, issue 17): a ring of the
//! last [`SLOTS`] entries of one tier, by sequence number. Loaded once per
//! tier (pods `gold`, `silver`, `bronze`: one code, three instances).
//!
//! Offers:
//! - `put`: `[seq u32 LE][entry, 1..=ENTRY bytes]` → nothing; stores the
//!   entry in slot `seq % SLOTS`. At most one client holds a `put`
//!   binding at a time (the receive path): a second is refused at bind.
//! - `get`: `[seq u32 LE]` → the entry stored under `seq`, or nothing if
//!   it was never stored or was overwritten;
//! - `latest`: nothing → the highest `seq` stored so far (`u32 LE`), or
//!   nothing before the first `put`;
//! - `ticket`: nothing → a number (`u32 LE`) one higher than the last
//!   ticket's, from 0: on a node each `tc-path` instance takes one from pod
//!   `gold` in its `anode_init` as its instance index (docs/transcoder.md).
//!
//! Anything else (a short or long argument) returns -1; the pod never
//! traps on its input. It holds no keys and imports nothing.
#![no_std]

/// Entries kept.
pub const SLOTS: usize = 16;
/// The largest entry: one frame of 16-bit stereo PCM (the silver tier).
pub const ENTRY: usize = 4608;
const BUF: usize = ENTRY + 4;
/// Bind request: principal (32), kind (1), id (4), entry name length (1), name.
const NAME_AT: usize = 38;

struct Slot {
    seq: u32,
    len: usize,
    data: [u8; ENTRY],
}

struct Cache {
    buf: [u8; BUF],
    slots: [Slot; SLOTS],
    writer: bool,
    latest: Option<u32>,
    tickets: u32,
}

static mut CACHE: Cache = Cache {
    buf: [0; BUF],
    slots: [const { Slot { seq: 0, len: 0, data: [0; ENTRY] } }; SLOTS],
    writer: false,
    latest: None,
    tickets: 0,
};

// `&mut STATIC` is refused in edition 2024; a raw pointer is the way.
#[allow(clippy::deref_addrof)]
fn cache() -> &'static mut Cache {
    // The pod is single-threaded and never re-entered (docs/pods.md).
    unsafe { &mut *(&raw mut CACHE) }
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_buffer() -> i32 {
    cache().buf.as_ptr() as i32
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_buffer_len() -> i32 {
    BUF as i32
}

/// State 1: the writer's `put` binding; 0: a reader.
#[unsafe(no_mangle)]
pub extern "C" fn pod_bind(len: i32) -> i32 {
    let c = cache();
    let name = c
        .buf
        .get(NAME_AT - 1)
        .and_then(|&n| c.buf.get(NAME_AT..NAME_AT + usize::from(n)))
        .filter(|_| usize::try_from(len).is_ok_and(|l| l <= BUF));
    match name {
        Some(b"put") if c.writer => -1,
        Some(b"put") => {
            c.writer = true;
            1
        }
        Some(_) => 0,
        None => -1,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_unbind(state: i32) {
    if state == 1 {
        cache().writer = false;
    }
}

#[unsafe(export_name = "offer.put")]
pub extern "C" fn put(state: i32, len: i32) -> i32 {
    let c = cache();
    let Some(arg) = usize::try_from(len).ok().and_then(|l| c.buf.get(..l)) else { return -1 };
    let Some((seq, entry)) = arg.split_first_chunk::<4>() else { return -1 };
    if state != 1 || entry.is_empty() || entry.len() > ENTRY {
        return -1;
    }
    let seq = u32::from_le_bytes(*seq);
    let Some(slot) = c.slots.get_mut(seq as usize % SLOTS) else { return -1 };
    slot.seq = seq;
    slot.len = entry.len();
    slot.data[..entry.len()].copy_from_slice(entry);
    c.latest = Some(c.latest.map_or(seq, |l| l.max(seq)));
    0
}

#[unsafe(export_name = "offer.latest")]
pub extern "C" fn latest(_state: i32, len: i32) -> i32 {
    let c = cache();
    match (len, c.latest) {
        (0, Some(l)) => {
            c.buf[..4].copy_from_slice(&l.to_le_bytes());
            4
        }
        (0, None) => 0,
        _ => -1,
    }
}

#[unsafe(export_name = "offer.ticket")]
pub extern "C" fn ticket(_state: i32, len: i32) -> i32 {
    let c = cache();
    if len != 0 {
        return -1;
    }
    c.buf[..4].copy_from_slice(&c.tickets.to_le_bytes());
    c.tickets = c.tickets.wrapping_add(1);
    4
}

#[unsafe(export_name = "offer.get")]
pub extern "C" fn get(_state: i32, len: i32) -> i32 {
    let c = cache();
    if len != 4 {
        return -1;
    }
    let seq = u32::from_le_bytes([c.buf[0], c.buf[1], c.buf[2], c.buf[3]]);
    let Some(slot) = c.slots.get(seq as usize % SLOTS) else { return -1 };
    if slot.len == 0 || slot.seq != seq {
        return 0;
    }
    c.buf[..slot.len].copy_from_slice(&slot.data[..slot.len]);
    slot.len as i32
}

#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}
