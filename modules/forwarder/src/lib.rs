//! The hostile forwarder of the RCANE paper's Fig. 1, run literally (issue
//! 14): a module that loops on allocating memory and sending packets to its
//! neighbours, to hit its CPU, memory and transmit limits.
//!
//! Neighbours: at load, every address `a` of this node's /24 for which
//! `route::next_hop(a) == a`, plus the source of any packet on its channel
//! that is a neighbour; at most [`MAX_NEIGHBOURS`].
//!
//! Every event (its alarm, re-armed at 0 ms first so the chain never ends,
//! and every packet on its channel, [`PORT`] with prefix [`PREFIX`]) is one
//! *burst*:
//!
//! 1. grow the buffer by one more wasm page (64 KiB) of linear memory; once
//!    the host refuses (the principal's memory cap), count the refusal and go
//!    on, so the memory stays pinned at the cap;
//! 2. send `[f w][seq u32 BE][zeros]` packets of [`PAYLOAD`] bytes to the
//!    neighbours in turn until the host refuses (`Error::Limit`: the sends
//!    per invocation); a payload the host finds too large is halved.
//!
//! Neighbours that run the forwarder too receive the packets on their
//! channel and burst again: the traffic grows without bound unless the
//! node limits it.
//!
//! Entries:
//! - `tick` (the alarm), `on_packet` (the channel): a burst; return the
//!   packets the host accepted.
//! - `flood`: the literal loop inside one invocation: grow by a page, send
//!   to every neighbour, forever; traps (like `membomb`) when the memory
//!   cannot grow, else ends when its CPU bound does. Never returns.
//! - `stop`: cancels the alarm chain and closes the channel.
//! - `stats`: input `sent`, `refused` (sends refused for the limit),
//!   `failed` (other send errors), `pages` (pages grown), `grow_refused`,
//!   `neighbours`; returns that counter (saturated), or -1.
//!
//! Imports: `route`, `net`, `time`.
#![no_std]
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering::Relaxed};

use anode_sdk::{Error, Event, entries_init, net, route, time};

/// The port it sends to and listens on.
pub const PORT: u16 = 4300;
/// The demultiplexing prefix of its channel and of every packet it sends.
pub const PREFIX: &[u8; 2] = b"fw";
/// Most neighbours it keeps.
pub const MAX_NEIGHBOURS: usize = 16;
/// Payload bytes per packet (the host's default `max_payload`).
pub const PAYLOAD: usize = 1400;

static NEIGHBOURS: [AtomicU32; MAX_NEIGHBOURS] = [const { AtomicU32::new(0) }; MAX_NEIGHBOURS];
static COUNT: AtomicU32 = AtomicU32::new(0);
static NEXT: AtomicU32 = AtomicU32::new(0);
static SEQ: AtomicU32 = AtomicU32::new(0);
static SENT: AtomicU32 = AtomicU32::new(0);
static REFUSED: AtomicU32 = AtomicU32::new(0);
static FAILED: AtomicU32 = AtomicU32::new(0);
static PAGES: AtomicU32 = AtomicU32::new(0);
static GROW_REFUSED: AtomicU32 = AtomicU32::new(0);
static ALARM: AtomicI32 = AtomicI32::new(-1);
static CHANNEL: AtomicI32 = AtomicI32::new(-1);
static STOPPED: AtomicBool = AtomicBool::new(false);

entries_init! {
    init = init;
    "tick" => tick, "on_packet" => on_packet, "flood" => flood, "stop" => stop, "stats" => stats
}

fn init() {
    let me = route::this_host();
    for host in 1..255u32 {
        let a = (me & 0xffff_ff00) | host;
        if a != me {
            add_neighbour(a);
        }
    }
    if let Ok(c) = net::open_channel(PORT, PREFIX, "on_packet") {
        CHANNEL.store(c.0, Relaxed);
    }
    arm();
}

/// Adds `a` if it is a neighbour (its own next hop) not yet known.
fn add_neighbour(a: u32) {
    if a == 0 || route::next_hop(a) != Some(a) {
        return;
    }
    let n = COUNT.load(Relaxed) as usize;
    if NEIGHBOURS.iter().take(n).any(|x| x.load(Relaxed) == a) {
        return;
    }
    if let Some(slot) = NEIGHBOURS.get(n) {
        slot.store(a, Relaxed);
        COUNT.store(n as u32 + 1, Relaxed);
    }
}

fn neighbour(i: u32) -> Option<u32> {
    let n = COUNT.load(Relaxed);
    if n == 0 {
        return None;
    }
    NEIGHBOURS.get((i % n) as usize).map(|x| x.load(Relaxed))
}

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

/// Grows the buffer by one wasm page; `false` if the host refused.
fn grow() -> bool {
    if core::arch::wasm32::memory_grow(0, 1) == usize::MAX {
        GROW_REFUSED.fetch_add(1, Relaxed);
        return false;
    }
    PAGES.fetch_add(1, Relaxed);
    true
}

/// One send of `buf[..len]` to the next neighbour in turn (the turn and
/// the sequence number move on only when the host takes the packet).
fn send_next(buf: &mut [u8; PAYLOAD], len: usize) -> Result<(), Error> {
    let Some(dst) = neighbour(NEXT.load(Relaxed)) else { return Err(Error::NotFound) };
    let seq = SEQ.load(Relaxed);
    buf[2..6].copy_from_slice(&seq.to_be_bytes());
    net::send(dst, PORT, buf.get(..len).unwrap_or(&buf[..]))?;
    NEXT.fetch_add(1, Relaxed);
    SEQ.store(seq.wrapping_add(1), Relaxed);
    Ok(())
}

fn packet() -> [u8; PAYLOAD] {
    let mut buf = [0u8; PAYLOAD];
    buf[..2].copy_from_slice(PREFIX);
    buf
}

fn burst() -> i32 {
    grow();
    if COUNT.load(Relaxed) == 0 {
        return 0;
    }
    let mut buf = packet();
    let mut len = PAYLOAD;
    let mut sent = 0;
    loop {
        match send_next(&mut buf, len) {
            Ok(()) => {
                sent += 1;
                SENT.fetch_add(1, Relaxed);
            }
            Err(Error::Limit) => {
                REFUSED.fetch_add(1, Relaxed);
                return sent;
            }
            Err(Error::Invalid) if len > 6 => len = (len / 2).max(6),
            Err(_) => {
                FAILED.fetch_add(1, Relaxed);
                return sent;
            }
        }
    }
}

fn tick(_: Event) -> i32 {
    if STOPPED.load(Relaxed) {
        return 0;
    }
    arm();
    burst()
}

fn on_packet(_: Event) -> i32 {
    add_neighbour(net::source());
    burst()
}

fn flood(_: Event) -> i32 {
    let mut buf = packet();
    loop {
        if !grow() {
            core::arch::wasm32::unreachable();
        }
        for _ in 0..COUNT.load(Relaxed) {
            match send_next(&mut buf, PAYLOAD) {
                Ok(()) => SENT.fetch_add(1, Relaxed),
                Err(Error::Limit) => REFUSED.fetch_add(1, Relaxed),
                Err(_) => FAILED.fetch_add(1, Relaxed),
            };
        }
    }
}

fn stop(_: Event) -> i32 {
    STOPPED.store(true, Relaxed);
    let a = time::cancel_alarm(time::Alarm(ALARM.swap(-1, Relaxed)));
    let c = net::close_channel(net::Channel(CHANNEL.swap(-1, Relaxed)));
    if a.is_ok() && c.is_ok() { 0 } else { -1 }
}

fn stats(ev: Event) -> i32 {
    let mut buf = [0u8; 16];
    let c = match ev.input(&mut buf) {
        b"sent" => &SENT,
        b"refused" => &REFUSED,
        b"failed" => &FAILED,
        b"pages" => &PAGES,
        b"grow_refused" => &GROW_REFUSED,
        b"neighbours" => &COUNT,
        _ => return -1,
    };
    c.load(Relaxed).min(i32::MAX as u32) as i32
}
