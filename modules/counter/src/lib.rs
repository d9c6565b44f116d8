//! A soft-state counter switchlet: `incr` counts the input as a key and
//! returns the new count; `report` delivers `marshal[key, count]` to local
//! port 7 and logs it.
#![no_std]
use anode_sdk::{Event, entries, log, marshal, net, state};

entries! { "incr" => incr, "report" => report }

fn count(key: &[u8]) -> u32 {
    let mut v = [0u8; 4];
    match state::get(key, &mut v) {
        Ok(b) if b.len() == 4 => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        _ => 0,
    }
}

fn incr(ev: Event) -> i32 {
    let mut key = [0u8; 64];
    let key = ev.input(&mut key);
    let n = count(key) + 1;
    match state::put(key, &n.to_be_bytes(), 0) {
        Ok(()) => n as i32,
        Err(_) => -1,
    }
}

fn report(ev: Event) -> i32 {
    let mut key = [0u8; 64];
    let key = ev.input(&mut key);
    let n = count(key).to_be_bytes();
    let mut out = [0u8; 128];
    let Ok(enc) = marshal::encode(&[key, &n], &mut out) else { return -1 };
    let _ = log::write("counter report");
    match net::deliver_local(7, enc) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}
