//! Active Reliable Multicast (ARM), the router's part, as used for RCANE's
//! Fig. 15 (§VI-D.1): cache the data packets of a flow, serve the
//! receivers' NACKs from the cache, and size the cache to the loss
//! downstream through the session's heap reservation.
//!
//! Wire formats (big-endian): a data packet is `[seq u32][payload]` (at
//! most [`MAX_PACKET`] bytes in all) on [`DATA_PORT`]; a NACK is exactly
//! `[seq u32]` on [`NACK_PORT`]. Anything else is counted as `bad` and
//! dropped: the module never traps on its input.
//!
//! - `data` (channel on [`DATA_PORT`]): caches the packet unless its
//!   sequence number is already cached, and forwards it to the downstream
//!   receiver (set by `downstream`). The sender is whoever sent the data
//!   (`net::source`).
//! - `nack` (channel on [`NACK_PORT`]): a *hit* resends the cached packet
//!   downstream; a *miss* forwards the NACK to the sender.
//! - `heap_pressure` (the session heap crossed 80 % of its reservation):
//!   recycles the oldest quarter of the cache (its slots are the next to be
//!   written) and grows the cache no more until the reservation changes.
//! - `tick` (alarm, every second): if fewer than 90 % of the NACKs of that
//!   second were hits, asks for the reservation plus [`STEP`]
//!   (`session::heap_request`).
//! - `downstream`: input `[IPv4 u32]`, the receiver to forward to. Until
//!   it is set, the source of the first NACK becomes the receiver (how a
//!   receiver joins on a node, where no one can call an entry).
//! - `stats`: input a counter's name (`data`, `nacks`, `hits`, `misses`,
//!   `recycled`, `evicted`, `bad`, `pages`, `grow_refused`, `requests`,
//!   `request_refused`, `send_failed`, `cached`, `slots`); returns it
//!   (saturated), or -1.
//!
//! Lookups scan the ring (a few hundred slots in Fig. 15; each scan is
//! bounded by the cache's size and the invocation's fuel).
//!
//! The cache is a ring of [`SLOT`]-byte slots in linear memory the module
//! grows itself (`memory.grow`, one 64 KiB page = 64 slots at a time, when
//! the write position wraps), so its size is what the session's heap
//! account charges. Slot `i` is at `base + i * SLOT`: `[seq u32 LE][len
//! u16 LE][valid u16 LE][packet]`. Writing goes round the ring in order, so
//! the slots from the write position on are the oldest. When the heap
//! refuses a page, or after a pressure call, the ring wraps instead of
//! growing: the oldest entry is overwritten.
//!
//! Imports: `net`, `time`, `session`, `route` (none of which it needs a
//! right for beyond the channels and alarms).
#![no_std]
use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

use anode_sdk::{Event, entries_init, net, session, time};

/// The port of data packets (to the router and from it to the receiver).
pub const DATA_PORT: u16 = 4500;
/// The port of NACKs (to the router and from it to the sender).
pub const NACK_PORT: u16 = 4501;
/// Bytes per cache slot (header included).
pub const SLOT: u32 = 1024;
/// Slot header bytes.
const HEADER: u32 = 8;
/// The largest data packet (sequence number included) the cache takes.
pub const MAX_PACKET: usize = (SLOT - HEADER) as usize;
/// A wasm page.
const PAGE: u32 = 65536;
/// The reservation asked for on top of the current one, bytes.
pub const STEP: u64 = 32 * 1024;
/// The share of NACKs (percent) served from the cache below which it asks.
pub const TARGET_PERCENT: u64 = 90;

/// Where the cache's first page is (0: none yet).
static BASE: AtomicU32 = AtomicU32::new(0);
/// Pages the cache holds.
static PAGES: AtomicU32 = AtomicU32::new(0);
/// The slot written next (the oldest entry when the ring is full).
static NEXT: AtomicU32 = AtomicU32::new(0);
/// The reservation (KiB) at which the cache stopped growing; `u32::MAX`: it grows.
static CAPPED_AT: AtomicU32 = AtomicU32::new(u32::MAX);
static DOWNSTREAM: AtomicU32 = AtomicU32::new(0);
static UPSTREAM: AtomicU32 = AtomicU32::new(0);

static DATA: AtomicU32 = AtomicU32::new(0);
static NACKS: AtomicU32 = AtomicU32::new(0);
static HITS: AtomicU32 = AtomicU32::new(0);
static MISSES: AtomicU32 = AtomicU32::new(0);
static RECYCLED: AtomicU32 = AtomicU32::new(0);
static EVICTED: AtomicU32 = AtomicU32::new(0);
static BAD: AtomicU32 = AtomicU32::new(0);
static GROW_REFUSED: AtomicU32 = AtomicU32::new(0);
static REQUESTS: AtomicU32 = AtomicU32::new(0);
static REQUEST_REFUSED: AtomicU32 = AtomicU32::new(0);
static SEND_FAILED: AtomicU32 = AtomicU32::new(0);
/// NACKs and hits since the last tick.
static SEC_NACKS: AtomicU32 = AtomicU32::new(0);
static SEC_HITS: AtomicU32 = AtomicU32::new(0);

entries_init! {
    init = init;
    "data" => data, "nack" => nack, "heap_pressure" => pressure, "tick" => tick,
    "downstream" => downstream, "stats" => stats
}

fn init() {
    let _ = net::open_channel(DATA_PORT, b"", "data");
    let _ = net::open_channel(NACK_PORT, b"", "nack");
    let _ = time::set_alarm(1000, "tick");
}

fn bump(c: &AtomicU32) {
    c.store(c.load(Relaxed).saturating_add(1), Relaxed);
}

/// Slots in the cache.
fn slots() -> u32 {
    PAGES.load(Relaxed) * (PAGE / SLOT)
}

/// The address of slot `i`, if the cache has it.
fn slot_addr(i: u32) -> Option<usize> {
    (i < slots()).then(|| BASE.load(Relaxed) as usize + (i * SLOT) as usize)
}

/// Slot `i`'s header: (seq, packet length, valid).
fn header(i: u32) -> Option<(u32, usize, bool)> {
    let a = slot_addr(i)?;
    let mut h = [0u8; HEADER as usize];
    // SAFETY: slot `i` lies in pages this module grew (`slot_addr` checks
    // `i` against them); nothing else uses that memory.
    unsafe { core::ptr::copy_nonoverlapping(a as *const u8, h.as_mut_ptr(), h.len()) };
    let seq = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let len = usize::from(u16::from_le_bytes([h[4], h[5]])).min(MAX_PACKET);
    Some((seq, len, u16::from_le_bytes([h[6], h[7]]) == 1))
}

/// Writes slot `i`: header and packet (at most [`MAX_PACKET`] bytes).
fn write_slot(i: u32, seq: u32, packet: &[u8], valid: bool) {
    let Some(a) = slot_addr(i) else { return };
    let n = packet.len().min(MAX_PACKET);
    let mut h = [0u8; HEADER as usize];
    h[..4].copy_from_slice(&seq.to_le_bytes());
    h[4..6].copy_from_slice(&(n as u16).to_le_bytes());
    h[6..8].copy_from_slice(&u16::from(valid).to_le_bytes());
    // SAFETY: as in `header`; `n` ≤ MAX_PACKET keeps the write in the slot.
    unsafe {
        core::ptr::copy_nonoverlapping(h.as_ptr(), a as *mut u8, h.len());
        core::ptr::copy_nonoverlapping(packet.as_ptr(), (a + HEADER as usize) as *mut u8, n);
    }
}

/// Copies slot `i`'s packet into `out`, returning the part filled.
fn read_slot(i: u32, out: &mut [u8; MAX_PACKET]) -> Option<&[u8]> {
    let (_, len, valid) = header(i)?;
    let a = slot_addr(i)?;
    if !valid {
        return None;
    }
    // SAFETY: as in `header`; `len` ≤ MAX_PACKET = out.len().
    unsafe { core::ptr::copy_nonoverlapping((a + HEADER as usize) as *const u8, out.as_mut_ptr(), len) };
    out.get(..len)
}

/// The slot caching `seq`.
fn find(seq: u32) -> Option<u32> {
    (0..slots()).find(|&i| matches!(header(i), Some((s, _, true)) if s == seq))
}

/// The session's reservation in KiB (0 without one).
fn reserved_kib() -> u32 {
    session::heap_reserved().map_or(0, |b| (b / 1024).min(u64::from(u32::MAX - 1)) as u32)
}

/// Whether the cache may grow: not capped, or the reservation changed since.
fn may_grow() -> bool {
    let at = CAPPED_AT.load(Relaxed);
    if at == u32::MAX {
        return true;
    }
    if reserved_kib() != at {
        CAPPED_AT.store(u32::MAX, Relaxed);
        return true;
    }
    false
}

fn cap() {
    CAPPED_AT.store(reserved_kib(), Relaxed);
}

/// Adds a page to the cache; false if the heap refused it.
fn grow() -> bool {
    let old = core::arch::wasm32::memory_grow(0, 1);
    if old == usize::MAX {
        bump(&GROW_REFUSED);
        cap();
        return false;
    }
    let Some(addr) = old.checked_mul(PAGE as usize).and_then(|a| u32::try_from(a).ok()) else { return false };
    let pages = PAGES.load(Relaxed);
    if pages == 0 {
        BASE.store(addr, Relaxed);
    } else if addr != BASE.load(Relaxed) + pages * PAGE {
        // Not contiguous (only this module grows its memory, so never):
        // keep the ring as it is.
        cap();
        return false;
    }
    PAGES.store(pages + 1, Relaxed);
    true
}

/// Caches `packet` (sequence number `seq`) unless it is cached already.
fn insert(seq: u32, packet: &[u8]) {
    if find(seq).is_some() {
        return;
    }
    let mut i = NEXT.load(Relaxed);
    if i >= slots() {
        // The ring is full: a new page, else round to the oldest slot.
        if !(may_grow() && grow()) {
            i = 0;
        }
    }
    if i >= slots() {
        return; // no cache at all
    }
    if matches!(header(i), Some((_, _, true))) {
        bump(&EVICTED);
    }
    write_slot(i, seq, packet, true);
    NEXT.store(i + 1, Relaxed);
}

fn send(dst: u32, port: u16, bytes: &[u8]) {
    if dst == 0 || net::send(dst, port, bytes).is_err() {
        bump(&SEND_FAILED);
    }
}

fn data(ev: Event) -> i32 {
    let mut buf = [0u8; MAX_PACKET + 1];
    let p = ev.input(&mut buf);
    let (Some(s), true) = (p.get(..4), p.len() <= MAX_PACKET && ev.len <= MAX_PACKET) else {
        bump(&BAD);
        return -1;
    };
    let seq = u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
    bump(&DATA);
    UPSTREAM.store(net::source(), Relaxed);
    insert(seq, p);
    send(DOWNSTREAM.load(Relaxed), DATA_PORT, p);
    0
}

fn nack(ev: Event) -> i32 {
    let mut buf = [0u8; 8];
    let p = ev.input(&mut buf);
    let &[a, b, c, d] = p else {
        bump(&BAD);
        return -1;
    };
    let seq = u32::from_be_bytes([a, b, c, d]);
    // Without a `downstream` call (a node offers no way to call an entry
    // from outside), the first receiver to NACK joins the flow: a receiver
    // joins by NACKing a sequence number it does not expect.
    if DOWNSTREAM.load(Relaxed) == 0 {
        DOWNSTREAM.store(net::source(), Relaxed);
    }
    bump(&NACKS);
    bump(&SEC_NACKS);
    let mut pkt = [0u8; MAX_PACKET];
    match find(seq).and_then(|i| read_slot(i, &mut pkt)) {
        Some(packet) => {
            bump(&HITS);
            bump(&SEC_HITS);
            send(DOWNSTREAM.load(Relaxed), DATA_PORT, packet);
            1
        }
        None => {
            bump(&MISSES);
            send(UPSTREAM.load(Relaxed), NACK_PORT, p);
            0
        }
    }
}

/// Heap pressure: frees the oldest quarter of the cached entries (the slots
/// written next) and stops growing at this reservation.
fn pressure(_: Event) -> i32 {
    cap();
    let n = slots();
    let live = (0..n).filter(|&i| matches!(header(i), Some((_, _, true)))).count() as u32;
    let mut todo = live / 4;
    let start = NEXT.load(Relaxed);
    for k in 0..n {
        if todo == 0 {
            break;
        }
        let i = (start + k) % n;
        if let Some((seq, _, true)) = header(i) {
            write_slot(i, seq, &[], false);
            bump(&RECYCLED);
            todo -= 1;
        }
    }
    0
}

/// Every second: ask for more heap if the cache served too few NACKs.
fn tick(_: Event) -> i32 {
    let n = u64::from(SEC_NACKS.swap(0, Relaxed));
    let h = u64::from(SEC_HITS.swap(0, Relaxed));
    let _ = time::set_alarm(1000, "tick");
    if n == 0 || h * 100 >= n * TARGET_PERCENT {
        return 0;
    }
    let want = session::heap_reserved().unwrap_or(0).saturating_add(STEP);
    bump(&REQUESTS);
    if session::heap_request(want).is_err() {
        bump(&REQUEST_REFUSED);
        return -1;
    }
    1
}

fn downstream(ev: Event) -> i32 {
    let mut buf = [0u8; 8];
    let &[a, b, c, d] = ev.input(&mut buf) else { return -1 };
    DOWNSTREAM.store(u32::from_be_bytes([a, b, c, d]), Relaxed);
    0
}

fn stats(ev: Event) -> i32 {
    let mut buf = [0u8; 16];
    let v = match ev.input(&mut buf) {
        b"data" => DATA.load(Relaxed),
        b"nacks" => NACKS.load(Relaxed),
        b"hits" => HITS.load(Relaxed),
        b"misses" => MISSES.load(Relaxed),
        b"recycled" => RECYCLED.load(Relaxed),
        b"evicted" => EVICTED.load(Relaxed),
        b"bad" => BAD.load(Relaxed),
        b"pages" => PAGES.load(Relaxed),
        b"grow_refused" => GROW_REFUSED.load(Relaxed),
        b"requests" => REQUESTS.load(Relaxed),
        b"request_refused" => REQUEST_REFUSED.load(Relaxed),
        b"send_failed" => SEND_FAILED.load(Relaxed),
        b"cached" => (0..slots()).filter(|&i| matches!(header(i), Some((_, _, true)))).count() as u32,
        b"slots" => slots(),
        _ => return -1,
    };
    v.min(i32::MAX as u32) as i32
}
