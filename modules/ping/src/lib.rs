//! The active ping as a capsule (the paper's `saneping`).
//!
//! Data (18 bytes, big-endian): origin address (4), target address (4),
//! send time in the origin's ms (8), reply port (2); then one flag byte:
//! 1 = carry the code on every hop, 0 = send only its hash.
//! Entry `ping` travels hop by hop to the target, which turns it into `pong`;
//! `pong` travels back and, at the origin, delivers
//! `[target (4), rtt_ms (8)]` to the local application on the reply port.
#![no_std]
use anode_sdk::{Event, entries, net, route, time};

entries! { "ping" => ping, "pong" => pong }

const LEN: usize = 19;

fn parse(ev: &Event, buf: &mut [u8; LEN]) -> Option<(u32, u32, u64, u16, bool)> {
    if ev.len != LEN || ev.input(buf).len() != LEN {
        return None;
    }
    let origin = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let target = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let mut t = [0u8; 8];
    t.copy_from_slice(&buf[8..16]);
    let port = u16::from_be_bytes([buf[16], buf[17]]);
    Some((origin, target, u64::from_be_bytes(t), port, buf[18] == 1))
}

fn toward(dst: u32, entry: &str, data: &[u8], carry: bool) -> i32 {
    match route::next_hop(dst) {
        Some(hop) => match net::forward_capsule(hop, entry, data, carry) {
            Ok(()) => 0,
            Err(_) => 3,
        },
        None => 2,
    }
}

fn ping(ev: Event) -> i32 {
    let mut buf = [0u8; LEN];
    let Some((origin, target, _, _, carry)) = parse(&ev, &mut buf) else { return 1 };
    if route::this_host() == target { pong_at(origin, &buf, carry) } else { toward(target, "ping", &buf, carry) }
}

fn pong_at(origin: u32, buf: &[u8; LEN], carry: bool) -> i32 {
    if route::this_host() == origin {
        return arrive(buf);
    }
    toward(origin, "pong", buf, carry)
}

fn arrive(buf: &[u8; LEN]) -> i32 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&buf[8..16]);
    let rtt = time::now_ms().saturating_sub(u64::from_be_bytes(t));
    let mut out = [0u8; 12];
    out[..4].copy_from_slice(&buf[4..8]);
    out[4..].copy_from_slice(&rtt.to_be_bytes());
    match net::deliver_local(u16::from_be_bytes([buf[16], buf[17]]), &out) {
        Ok(()) => 0,
        Err(_) => 4,
    }
}

fn pong(ev: Event) -> i32 {
    let mut buf = [0u8; LEN];
    let Some((origin, _, _, _, carry)) = parse(&ev, &mut buf) else { return 1 };
    pong_at(origin, &buf, carry)
}
