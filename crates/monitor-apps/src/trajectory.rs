//! Trajectory sampling (Duffield and Grossglauser; FLAME §3.1).
//!
//! A hash `h(x)` over the *invariant* part of a packet decides sampling: the
//! packet is sampled iff `h(x) < B`, with `h` in `0..2^32` (`A = 2^32`) and
//! `B = rate · 2^32`. The invariant part is what no hop rewrites: IP version,
//! addresses, protocol, IPv4 identification (IPv6 flow label), IP length,
//! ports, TCP sequence, acknowledgment, flags and window, and the first
//! [`PAYLOAD_BYTES`] granted payload bytes. Never the TTL/hop limit, TOS,
//! fragment field or any checksum. Every monitor with the same seed, rate and
//! grant therefore samples exactly the same packets.
//!
//! A second hash `g(x)` over the 5-tuple labels the flow. A sampled packet
//! whose label the (direct-mapped, [`FLOWS`]-slot) flow table does not hold
//! emits a flow record first; every sampled packet emits a packet record and
//! asks the host to export the packet itself.
//!
//! Records: schema [`FLOW_RECORD`] = `ts, flow, src, dst, sport, dport, proto`;
//! schema [`PACKET_RECORD`] = `ts, flow, hash, len`.

use crate::abi::{Element, Field, RecordBuilder, View};
use crate::hash::Hasher;
use crate::{App, Sink};

/// Flow table slots.
pub const FLOWS: usize = 1024;
/// Payload bytes included in the invariant hash (when granted).
pub const PAYLOAD_BYTES: usize = 16;
/// Schema of a new-flow record.
pub const FLOW_RECORD: u8 = 1;
/// Schema of a sampled-packet record.
pub const PACKET_RECORD: u8 = 2;

/// Trajectory sampling state.
#[derive(Debug, Clone)]
pub struct Trajectory {
    threshold: u64,
    seed: u64,
    flows: [u64; FLOWS],
    /// Packets seen.
    pub seen: u64,
    /// Packets sampled.
    pub sampled: u64,
}

/// `h(x)`: the invariant-content hash of a view, in `0..2^32`.
pub fn packet_hash(v: &View<'_>, seed: u64) -> u64 {
    let mut h = Hasher::new(seed);
    h.word(u64::from(v.ip_version()) | u64::from(v.proto()) << 8 | v.get(Field::IpLen) << 16)
        .bytes(&v.src())
        .bytes(&v.dst())
        .word(v.get(Field::IpId) | v.get(Field::Sport) << 32 | v.get(Field::Dport) << 48)
        .word(v.get(Field::TcpSeq) | v.get(Field::TcpAck) << 32)
        .word(v.get(Field::TcpFlags) | v.get(Field::TcpWindow) << 8);
    let p = v.payload();
    h.bytes(p.get(..PAYLOAD_BYTES).unwrap_or(p));
    h.finish() >> 32
}

/// `g(x)`: the flow label of a view (the 5-tuple, never sequence numbers).
pub fn flow_label(v: &View<'_>, seed: u64) -> u64 {
    Hasher::new(seed ^ 0x5eed_f10e)
        .word(u64::from(v.proto()) | u64::from(v.sport()) << 8 | u64::from(v.dport()) << 24)
        .bytes(&v.src())
        .bytes(&v.dst())
        .finish()
}

impl Trajectory {
    /// Samples a fraction `rate_ppm / 10^6` of packets; monitors that must
    /// agree use the same `seed`.
    pub const fn new(rate_ppm: u32, seed: u64) -> Trajectory {
        let r = if rate_ppm > 1_000_000 { 1_000_000 } else { rate_ppm as u64 };
        Trajectory { threshold: (r << 32) / 1_000_000, seed, flows: [0; FLOWS], seen: 0, sampled: 0 }
    }

    /// Whether `v` is sampled, and its `(h(x), g(x))`.
    pub fn decide(&self, v: &View<'_>) -> Option<(u64, u64)> {
        let h = packet_hash(v, self.seed);
        (h < self.threshold).then(|| (h, flow_label(v, self.seed)))
    }
}

impl App for Trajectory {
    fn packet(&mut self, v: &View<'_>, sink: &mut dyn Sink) {
        self.seen += 1;
        let Some((h, g)) = self.decide(v) else { return };
        self.sampled += 1;
        let slot = (g as usize) % FLOWS;
        let label = g | 1; // 0 marks an empty slot
        if self.flows[slot] != label {
            self.flows[slot] = label;
            let mut r = RecordBuilder::new(FLOW_RECORD);
            r.uint(Element::Ts, v.ts()).uint(Element::FlowId, g).addresses(v);
            r.uint(Element::Sport, u64::from(v.sport()))
                .uint(Element::Dport, u64::from(v.dport()))
                .uint(Element::Proto, u64::from(v.proto()));
            sink.record(r.as_bytes());
        }
        let mut r = RecordBuilder::new(PACKET_RECORD);
        r.uint(Element::Ts, v.ts())
            .uint(Element::FlowId, g)
            .uint(Element::Digest, h)
            .uint(Element::Len, v.get(Field::IpLen));
        sink.record(r.as_bytes());
        sink.sample();
    }

    fn tick(&mut self, _now_ns: u64, _sink: &mut dyn Sink) {}
}
