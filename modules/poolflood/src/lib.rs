//! Hostile to its own event pool (issue 14, "one that floods its own
//! pool"): opens a channel on [`PORT`] for payloads starting with
//! [`PREFIX`] and, on each packet, sends [`FANOUT`] packets to itself (its
//! own node address from `route::this_host`, the same port and prefix), so
//! each packet it receives queues `FANOUT` more events for it.
//!
//! - `on_packet`: the channel's entry; returns how many sends the host took.
//! - `kick`: sends the first `FANOUT` packets (call it directly to start).
//! - `stats`: input `sent` or `refused`; returns that counter (sends the
//!   host accepted, or refused), or -1 for another input.
//!
//! Imports: `net`, `route`.
#![no_std]
use core::sync::atomic::{AtomicU32, Ordering::Relaxed};

use anode_sdk::{Event, entries_init, net, route};

/// The port of the channel and of the packets it sends itself.
pub const PORT: u16 = 4400;
/// The demultiplexing prefix.
pub const PREFIX: &[u8; 2] = b"pf";
/// Packets sent to itself per packet received.
pub const FANOUT: u32 = 8;

static SENT: AtomicU32 = AtomicU32::new(0);
static REFUSED: AtomicU32 = AtomicU32::new(0);

entries_init! { init = open; "on_packet" => on_packet, "kick" => kick, "stats" => stats }

fn open() {
    let _ = net::open_channel(PORT, PREFIX, "on_packet");
}

/// Sends `FANOUT` packets `[p f][generation u32 BE]` to this node.
fn flood(generation: u32) -> i32 {
    let me = route::this_host();
    let mut payload = [0u8; 6];
    payload[..2].copy_from_slice(PREFIX);
    payload[2..].copy_from_slice(&generation.to_be_bytes());
    let mut ok = 0;
    for _ in 0..FANOUT {
        match net::send(me, PORT, &payload) {
            Ok(()) => {
                ok += 1;
                SENT.fetch_add(1, Relaxed);
            }
            Err(_) => {
                REFUSED.fetch_add(1, Relaxed);
            }
        }
    }
    ok
}

fn on_packet(ev: Event) -> i32 {
    let mut buf = [0u8; 6];
    let p = ev.input(&mut buf);
    let generation = match p {
        [_, _, a, b, c, d] => u32::from_be_bytes([*a, *b, *c, *d]),
        _ => 0,
    };
    flood(generation.wrapping_add(1))
}

fn kick(_: Event) -> i32 {
    flood(0)
}

fn stats(ev: Event) -> i32 {
    let mut buf = [0u8; 8];
    match ev.input(&mut buf) {
        b"sent" => SENT.load(Relaxed).min(i32::MAX as u32) as i32,
        b"refused" => REFUSED.load(Relaxed).min(i32::MAX as u32) as i32,
        _ => -1,
    }
}
