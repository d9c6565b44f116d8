//! TCP round-trip time from the handshake (FLAME §3.1).
//!
//! "For every SYN packet received, we store a timestamp into a hash-table.
//! As the first ACK after a SYN usually has a sequence number which is the
//! SYN packet's sequence number plus one, this number is used as the key."
//! The key here is the connection's 4-tuple and `seq + 1`; the matching ACK
//! is the first packet *in the same direction* with the ACK flag, no SYN,
//! and that sequence number. The estimate, ACK time − SYN time, spans
//! monitor → server → monitor → client → monitor: the sum of the SYN/ACK's
//! and the handshake ACK's `tcp.analysis.ack_rtt` in Wireshark's terms.
//!
//! # Bounded state and ageing
//!
//! The table has [`SLOTS`] entries, open addressing with at most [`PROBE`]
//! probes. An entry older than `max_age_ns` (default [`DEFAULT_MAX_AGE_NS`],
//! 30 s: longer than Linux's first five SYN retransmissions) counts as free;
//! [`App::tick`] also sweeps [`SWEEP`] slots per call and drops aged entries
//! (`expired`). When all probed slots are live, the oldest of them is evicted
//! (`evicted`). A retransmitted SYN (same key) marks the entry ambiguous and
//! its ACK yields no sample (Karn's rule; counted in `ambiguous`). A RST
//! with the key's sequence number removes the entry.
//!
//! Record schema [`RTT_RECORD`]: `ts` (of the ACK), `src, dst, sport, dport`
//! (the SYN's direction), `rtt_ns`.

use crate::abi::{Element, RecordBuilder, View, proto, tcp_flags};
use crate::hash::Hasher;
use crate::{App, Sink};

/// Table slots (a power of two).
pub const SLOTS: usize = 4096;
/// Slots probed per lookup.
pub const PROBE: usize = 8;
/// Slots swept per tick.
pub const SWEEP: usize = 512;
/// Default age after which a SYN without its ACK is forgotten.
pub const DEFAULT_MAX_AGE_NS: u64 = 30_000_000_000;
/// Schema of an RTT record.
pub const RTT_RECORD: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    seq: u32,
}

const EMPTY_KEY: Key = Key { src: [0; 16], dst: [0; 16], sport: 0, dport: 0, seq: 0 };

#[derive(Debug, Clone, Copy)]
struct Slot {
    used: bool,
    ambiguous: bool,
    key: Key,
    ts: u64,
}

const EMPTY: Slot = Slot { used: false, ambiguous: false, key: EMPTY_KEY, ts: 0 };

/// Counters of the RTT application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RttCounters {
    /// SYNs stored.
    pub syns: u64,
    /// RTT samples produced.
    pub samples: u64,
    /// Retransmitted SYNs (entry marked ambiguous).
    pub retransmitted: u64,
    /// ACKs of ambiguous entries (no sample).
    pub ambiguous: u64,
    /// Live entries evicted by a full probe window.
    pub evicted: u64,
    /// Entries dropped by ageing.
    pub expired: u64,
    /// Entries removed by a RST.
    pub reset: u64,
}

/// The RTT application.
#[derive(Debug, Clone)]
pub struct Rtt {
    slots: [Slot; SLOTS],
    max_age_ns: u64,
    sweep: usize,
    /// Counters.
    pub counters: RttCounters,
}

fn slot_of(k: &Key) -> usize {
    let h = Hasher::new(0x7274_7400)
        .bytes(&k.src)
        .bytes(&k.dst)
        .word(u64::from(k.sport) | u64::from(k.dport) << 16 | u64::from(k.seq) << 32)
        .finish();
    (h as usize) & (SLOTS - 1)
}

impl Rtt {
    /// An empty table; SYNs without an ACK are forgotten after `max_age_ns`
    /// (0: [`DEFAULT_MAX_AGE_NS`], which keeps a static `Rtt` all-zero, so
    /// that a wasm module's state lands in `.bss` rather than in its binary).
    pub const fn new(max_age_ns: u64) -> Rtt {
        Rtt {
            slots: [EMPTY; SLOTS],
            max_age_ns,
            sweep: 0,
            counters: RttCounters {
                syns: 0,
                samples: 0,
                retransmitted: 0,
                ambiguous: 0,
                evicted: 0,
                expired: 0,
                reset: 0,
            },
        }
    }

    fn live(&self, s: &Slot, now: u64) -> bool {
        let age = if self.max_age_ns == 0 { DEFAULT_MAX_AGE_NS } else { self.max_age_ns };
        s.used && now.saturating_sub(s.ts) <= age
    }

    fn find(&self, k: &Key, now: u64) -> Option<usize> {
        let base = slot_of(k);
        (0..PROBE)
            .map(|i| (base + i) & (SLOTS - 1))
            .find(|&i| self.live(&self.slots[i], now) && self.slots[i].key == *k)
    }

    fn syn(&mut self, k: Key, now: u64) {
        if let Some(i) = self.find(&k, now) {
            self.slots[i].ambiguous = true;
            self.counters.retransmitted += 1;
            return;
        }
        let base = slot_of(&k);
        let probes = (0..PROBE).map(|i| (base + i) & (SLOTS - 1));
        let victim = match probes.clone().find(|&i| !self.live(&self.slots[i], now)) {
            Some(i) => {
                if self.slots[i].used {
                    self.counters.expired += 1;
                }
                i
            }
            None => {
                self.counters.evicted += 1;
                probes.min_by_key(|&i| self.slots[i].ts).unwrap_or(base)
            }
        };
        self.slots[victim] = Slot { used: true, ambiguous: false, key: k, ts: now };
        self.counters.syns += 1;
    }
}

impl App for Rtt {
    fn packet(&mut self, v: &View<'_>, sink: &mut dyn Sink) {
        if v.proto() != proto::TCP {
            return;
        }
        let f = v.tcp_flags();
        let now = v.ts();
        let (src, dst, sport, dport) = (v.src(), v.dst(), v.sport(), v.dport());
        if f & tcp_flags::SYN != 0 && f & tcp_flags::ACK == 0 {
            self.syn(Key { src, dst, sport, dport, seq: v.tcp_seq().wrapping_add(1) }, now);
            return;
        }
        if f & (tcp_flags::ACK | tcp_flags::RST) == 0 || f & tcp_flags::SYN != 0 {
            return;
        }
        let k = Key { src, dst, sport, dport, seq: v.tcp_seq() };
        let Some(i) = self.find(&k, now) else { return };
        let s = self.slots[i];
        self.slots[i] = EMPTY;
        if f & tcp_flags::RST != 0 {
            self.counters.reset += 1;
        } else if s.ambiguous {
            self.counters.ambiguous += 1;
        } else if now >= s.ts {
            self.counters.samples += 1;
            let mut r = RecordBuilder::new(RTT_RECORD);
            r.uint(Element::Ts, now).addresses(v);
            r.uint(Element::Sport, u64::from(sport))
                .uint(Element::Dport, u64::from(dport))
                .uint(Element::RttNs, now - s.ts);
            sink.record(r.as_bytes());
        }
    }

    fn tick(&mut self, now_ns: u64, _sink: &mut dyn Sink) {
        for _ in 0..SWEEP {
            let i = self.sweep;
            self.sweep = (self.sweep + 1) & (SLOTS - 1);
            if self.slots[i].used && !self.live(&self.slots[i], now_ns) {
                self.slots[i] = EMPTY;
                self.counters.expired += 1;
            }
        }
    }
}
