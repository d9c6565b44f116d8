//! Hostile monitoring module for the tests. For every packet it reads every
//! field of its view, granted or not, and counts the non-zero bytes of the
//! fields its policy withholds. The first payload byte it is granted picks
//! an attack:
//!
//! - `S`: scan the module's whole linear memory for the test's secret
//!   payload marker and the test's raw source address (both compared
//!   through an XOR so that neither sits in this module's own memory);
//! - `L`: loop forever; `T`: trap; `M`: grow memory without bound, then trap;
//! - `E`: export a record (the tests run it with and without the right).
//!
//! Every packet exports `[packets = forbidden bytes seen, flow = secrets
//! found]` (schema 9) when it may.
#![no_std]
use anode_monitor_apps::abi::{Element, Field, RecordBuilder, View};
use anode_sdk::monitor::{self, Global};

/// "PAYLOAD-SECRET-7f3a" XOR 0x55.
const MARKER: [u8; 19] = xor(*b"PAYLOAD-SECRET-7f3a");
/// 192.0.2.77 (the tests' source address) XOR 0x55.
const ADDR: [u8; 4] = xor([192, 0, 2, 77]);

const fn xor<const N: usize>(mut a: [u8; N]) -> [u8; N] {
    let mut i = 0;
    while i < N {
        a[i] ^= 0x55;
        i += 1;
    }
    a
}

static SINK: Global<u64> = Global::new(0);

fn occurrences(pattern: &[u8]) -> u64 {
    let size = core::arch::wasm32::memory_size(0) * 65_536;
    let mut found = 0;
    let mut at = 0;
    while at + pattern.len() <= size {
        let mut k = 0;
        // Reads of our own linear memory: every address below memory_size is valid.
        while k < pattern.len() && unsafe { core::ptr::read_volatile((at + k) as *const u8) } == pattern[k] ^ 0x55 {
            k += 1;
        }
        if k == pattern.len() {
            found += 1;
        }
        at += 1;
    }
    found
}

fn packet(view: &[u8], _index: u32, _status: u32) {
    let Some(v) = View::new(view) else { return };
    let mask = v.present_mask();
    let mut forbidden = 0u64;
    for f in Field::ALL {
        if mask & f.bit() == 0 {
            forbidden += v.raw(*f).iter().filter(|b| **b != 0).count() as u64;
        }
    }
    let mut secrets = 0;
    match v.payload().first() {
        Some(b'S') => secrets = occurrences(&MARKER) + occurrences(&ADDR),
        Some(b'L') => loop {
            SINK.with(|s| *s = core::hint::black_box(s.wrapping_add(1)));
        },
        Some(b'T') => core::arch::wasm32::unreachable(),
        Some(b'M') => loop {
            if core::arch::wasm32::memory_grow(0, 16) == usize::MAX {
                core::arch::wasm32::unreachable();
            }
        },
        _ => {}
    }
    let mut r = RecordBuilder::new(9);
    r.uint(Element::Packets, forbidden).uint(Element::FlowId, secrets);
    let _ = monitor::emit(r.as_bytes());
}

fn tick(_now_ns: u64) {}

anode_sdk::monitor_module!(packet, tick);
