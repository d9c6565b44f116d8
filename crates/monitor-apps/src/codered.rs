//! Code Red detection (FLAME §3.1).
//!
//! Code Red I and II open a connection to port 80 and send
//! `GET /default.ida?` followed by a long run of one padding character (224
//! `N`s in CRv1, `X`s in CRII) and then the shellcode. This module reports a
//! flow whose byte stream contains the literal followed by at least
//! [`PAD_MIN`] equal padding characters (`N` or `X`), once per flow, with its
//! addresses and ports.
//!
//! The request is matched on the reassembled stream, so it is found when it
//! is split across TCP segments at any byte and when the segments arrive out
//! of order, duplicated or overlapping.
//!
//! # Bounded state
//!
//! - [`FLOWS`] flow slots (one per direction), 4-way probed, least recently
//!   seen evicted; a slot not seen for [`FLOW_AGE_NS`] is free.
//! - Each flow reassembles only the first [`WINDOW`] bytes of its stream (the
//!   request starts at byte 0 of a Code Red connection), in a fixed buffer
//!   with a bitmap of received bytes. Bytes beyond the window are ignored
//!   (`beyond_window`). The stream starts at the SYN's sequence number + 1,
//!   or at the first data segment seen if the SYN was not seen.
//! - The matcher is a small state machine over the in-order prefix, resumed
//!   where it stopped: per packet it touches only new bytes.
//!
//! It needs the payload: a grant of `payload("all")` (or a first-N grant at
//! least as long as the segments) — bytes a grant withholds are gaps that the
//! stream never fills.
//!
//! Record schema [`CODERED_RECORD`]: `ts, src, dst, sport, dport, variant`.

use crate::abi::{Element, RecordBuilder, View, proto, tcp_flags};
use crate::hash::Hasher;
use crate::{App, Sink};

/// Flow slots.
pub const FLOWS: usize = 256;
/// Slots probed per flow.
pub const PROBE: usize = 4;
/// Bytes of each stream reassembled and scanned.
pub const WINDOW: usize = 1024;
/// Least run of padding characters reported.
pub const PAD_MIN: u16 = 200;
/// A flow not seen for this long is forgotten.
pub const FLOW_AGE_NS: u64 = 60_000_000_000;
/// Schema of a detection record.
pub const CODERED_RECORD: u8 = 4;
/// The request line prefix Code Red sends.
pub const LITERAL: &[u8] = b"GET /default.ida?";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
}

#[derive(Debug, Clone, Copy, Default)]
struct Matcher {
    lit: u8,
    pad: u8,
    run: u16,
}

impl Matcher {
    /// Feeds one byte; true when the signature is complete.
    fn feed(&mut self, c: u8) -> bool {
        if (self.lit as usize) < LITERAL.len() {
            if c == LITERAL[self.lit as usize] {
                self.lit += 1;
            } else {
                self.lit = u8::from(c == LITERAL[0]);
            }
            return false;
        }
        if self.run > 0 && c == self.pad {
            self.run += 1;
        } else if self.run == 0 && (c == b'N' || c == b'X') {
            self.pad = c;
            self.run = 1;
        } else {
            *self = Matcher::default();
            return self.feed(c);
        }
        self.run >= PAD_MIN
    }
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    used: bool,
    key: Key,
    base: u32,
    contig: u16,
    done: bool,
    last: u64,
    m: Matcher,
    data: [u8; WINDOW],
    have: [u8; WINDOW / 8],
}

const EMPTY: Flow = Flow {
    used: false,
    key: Key { src: [0; 16], dst: [0; 16], sport: 0, dport: 0 },
    base: 0,
    contig: 0,
    done: false,
    last: 0,
    m: Matcher { lit: 0, pad: 0, run: 0 },
    data: [0; WINDOW],
    have: [0; WINDOW / 8],
};

/// Counters of the Code Red application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeRedCounters {
    /// Flows started.
    pub flows: u64,
    /// Detections reported.
    pub detections: u64,
    /// Live flows evicted for a new one.
    pub evicted: u64,
    /// Segments (or parts) beyond the reassembly window, ignored.
    pub beyond_window: u64,
}

/// The Code Red application.
#[derive(Debug, Clone)]
pub struct CodeRed {
    flows: [Flow; FLOWS],
    /// Counters.
    pub counters: CodeRedCounters,
}

impl Default for CodeRed {
    fn default() -> Self {
        CodeRed::new()
    }
}

impl CodeRed {
    /// An empty flow table.
    pub const fn new() -> CodeRed {
        CodeRed {
            flows: [EMPTY; FLOWS],
            counters: CodeRedCounters { flows: 0, detections: 0, evicted: 0, beyond_window: 0 },
        }
    }

    fn slot(&mut self, k: &Key, now: u64, create: bool) -> Option<usize> {
        let h = Hasher::new(0xc0de_4ed0)
            .bytes(&k.src)
            .bytes(&k.dst)
            .word(u64::from(k.sport) | u64::from(k.dport) << 16)
            .finish() as usize;
        let probes = (0..PROBE).map(|i| (h + i) % FLOWS);
        let live = |f: &Flow| f.used && now.saturating_sub(f.last) <= FLOW_AGE_NS;
        if let Some(i) = probes.clone().find(|&i| live(&self.flows[i]) && self.flows[i].key == *k) {
            return Some(i);
        }
        if !create {
            return None;
        }
        let i = match probes.clone().find(|&i| !live(&self.flows[i])) {
            Some(i) => i,
            None => {
                self.counters.evicted += 1;
                probes.min_by_key(|&i| self.flows[i].last).unwrap_or(h % FLOWS)
            }
        };
        Some(i)
    }

    fn start(&mut self, i: usize, k: Key, base: u32, now: u64) {
        let f = &mut self.flows[i];
        *f = EMPTY;
        f.used = true;
        f.key = k;
        f.base = base;
        f.last = now;
        self.counters.flows += 1;
    }
}

impl App for CodeRed {
    fn packet(&mut self, v: &View<'_>, sink: &mut dyn Sink) {
        if v.proto() != proto::TCP {
            return;
        }
        let now = v.ts();
        let k = Key { src: v.src(), dst: v.dst(), sport: v.sport(), dport: v.dport() };
        let flags = v.tcp_flags();
        let payload = v.payload();
        if flags & tcp_flags::SYN != 0 {
            if let Some(i) = self.slot(&k, now, true) {
                self.start(i, k, v.tcp_seq().wrapping_add(1), now);
            }
            return;
        }
        if payload.is_empty() {
            return;
        }
        let i = match self.slot(&k, now, false) {
            Some(i) => i,
            None => match self.slot(&k, now, true) {
                Some(i) => {
                    self.start(i, k, v.tcp_seq(), now);
                    i
                }
                None => return,
            },
        };
        let f = &mut self.flows[i];
        f.last = now;
        if f.done {
            return;
        }
        // Offset of the segment in the stream; data before the base is cut off.
        let rel = v.tcp_seq().wrapping_sub(f.base) as i32;
        let (skip, off) = if rel < 0 { ((-(rel as i64)) as usize, 0usize) } else { (0, rel as usize) };
        let Some(bytes) = payload.get(skip..) else { return };
        if off >= WINDOW || off + bytes.len() > WINDOW {
            self.counters.beyond_window += 1;
        }
        for (j, &b) in bytes.iter().enumerate().take(WINDOW.saturating_sub(off)) {
            let p = off + j;
            f.data[p] = b;
            f.have[p / 8] |= 1 << (p % 8);
        }
        // Advance the in-order prefix and scan the new bytes.
        let mut c = f.contig as usize;
        while c < WINDOW && f.have[c / 8] & (1 << (c % 8)) != 0 {
            if f.m.feed(f.data[c]) {
                f.done = true;
                self.counters.detections += 1;
                let mut r = RecordBuilder::new(CODERED_RECORD);
                r.uint(Element::Ts, now).addresses(v);
                r.uint(Element::Sport, u64::from(k.sport))
                    .uint(Element::Dport, u64::from(k.dport))
                    .uint(Element::Variant, u64::from(f.m.pad));
                sink.record(r.as_bytes());
                break;
            }
            c += 1;
        }
        f.contig = c as u16;
    }

    fn tick(&mut self, _now_ns: u64, _sink: &mut dyn Sink) {}
}
