//! The view builder: a policy compiled once, at load, into what each packet
//! becomes for one module (FLAME §2: "code inserted before each module …
//! restricts access of modules to packets or packet fields, provides
//! selective anonymization of fields").
//!
//! Enforcement is by construction: a module's only input is the view record
//! [`ViewBuilder::build`] writes into its memory. A field the policy does not
//! grant is never written (its bytes stay zero and its presence bit clear);
//! addresses the policy anonymizes are replaced before they are written; the
//! payload is cut to the grant. No pointer to the frame ever reaches a module.
//!
//! Sampled packets are exported through [`ViewBuilder::sanitize`]: the IP
//! packet (link layer dropped, written as `LINKTYPE_RAW`) with every byte of a
//! field the policy does not grant zeroed, checksums and IP/TCP options always
//! zeroed (a checksum would let a reader recover zeroed fields), anonymized
//! addresses replaced, and the payload cut to the grant. Two structural
//! fields are rewritten rather than zeroed so that Wireshark can read the
//! result: without `ip.len` the IP length becomes the length exported; without
//! `ip.proto` the transport header and payload are not exported at all.

use anode_monitor_apps::abi::{Field, HEADER_LEN, ViewWriter};

use crate::cryptopan::Anonymizer;
use crate::parse::{L4, Packet};
use crate::policy::{Filter, PAYLOAD_ALL, Policy, Prefix};

/// A policy compiled for the per-packet path.
#[derive(Debug, Clone)]
pub struct ViewBuilder {
    filter: Filter,
    fields: u32,
    payload: usize,
    anonymize: Vec<Prefix>,
    admin: bool,
}

impl ViewBuilder {
    /// Compiles `policy`. `max_payload` caps the payload copied (the record buffer size).
    pub fn new(policy: &Policy, max_payload: usize) -> ViewBuilder {
        let payload =
            if policy.payload == PAYLOAD_ALL { max_payload } else { (policy.payload as usize).min(max_payload) };
        ViewBuilder {
            filter: policy.filter.clone(),
            fields: policy.fields,
            payload,
            anonymize: policy.anonymize.clone(),
            admin: policy.admin,
        }
    }

    /// Whether the module may see this packet at all.
    pub fn visible(&self, p: &Packet<'_>) -> bool {
        self.filter.matches(p)
    }

    /// The largest record this builder writes.
    pub fn record_cap(&self) -> usize {
        HEADER_LEN + self.payload
    }

    /// Whether `f` is granted.
    pub fn reads(&self, f: Field) -> bool {
        self.fields & f.bit() != 0
    }

    /// Whether some address may need anonymizing.
    pub fn anonymizes(&self) -> bool {
        !self.anonymize.is_empty()
    }

    fn address(&self, p: &Packet<'_>, a: &[u8; 16], anon: &mut Option<&mut Anonymizer>) -> Option<[u8; 16]> {
        if !self.anonymize.iter().any(|x| x.contains(p.version, a)) {
            return Some(*a);
        }
        let an = anon.as_deref_mut()?;
        let mut out = *a;
        an.bytes(&mut out[..p.addr_len()]);
        Some(out)
    }

    /// Writes the view of `p` into `out`; returns its length, or `None` if
    /// `out` is shorter than [`HEADER_LEN`]. An address that must be
    /// anonymized without an anonymizer is left absent.
    pub fn build(&self, p: &Packet<'_>, mut anon: Option<&mut Anonymizer>, out: &mut [u8]) -> Option<usize> {
        let mut w = ViewWriter::new(out)?;
        let g = |f: Field| self.fields & f.bit() != 0;
        if g(Field::Ts) {
            w.set(Field::Ts, p.ts_ns);
        }
        if g(Field::WireLen) {
            w.set(Field::WireLen, u64::from(p.wire_len));
        }
        if g(Field::Iface) {
            w.set(Field::Iface, u64::from(p.iface));
        }
        // The IP version is needed to read any address; it is structural.
        w.set(Field::IpVersion, u64::from(p.version));
        if g(Field::Proto) {
            w.set(Field::Proto, u64::from(p.proto));
        }
        if g(Field::Ttl) {
            w.set(Field::Ttl, u64::from(p.ttl));
        }
        if g(Field::Tos) {
            w.set(Field::Tos, u64::from(p.tos));
        }
        if g(Field::Frag) {
            w.set(Field::Frag, u64::from(p.frag));
        }
        if g(Field::IpId) {
            w.set(Field::IpId, u64::from(p.id));
        }
        if g(Field::IpLen) {
            w.set(Field::IpLen, u64::from(p.ip_len));
        }
        if g(Field::Src)
            && let Some(a) = self.address(p, &p.src, &mut anon)
        {
            w.set_bytes(Field::Src, &a);
        }
        if g(Field::Dst)
            && let Some(a) = self.address(p, &p.dst, &mut anon)
        {
            w.set_bytes(Field::Dst, &a);
        }
        if g(Field::PayloadLen) {
            w.set(Field::PayloadLen, u64::from(p.payload_len));
        }
        match p.l4 {
            L4::Tcp { sport, dport, seq, ack, flags, window } => {
                if g(Field::Sport) {
                    w.set(Field::Sport, u64::from(sport));
                }
                if g(Field::Dport) {
                    w.set(Field::Dport, u64::from(dport));
                }
                if g(Field::TcpSeq) {
                    w.set(Field::TcpSeq, u64::from(seq));
                }
                if g(Field::TcpAck) {
                    w.set(Field::TcpAck, u64::from(ack));
                }
                if g(Field::TcpFlags) {
                    w.set(Field::TcpFlags, u64::from(flags));
                }
                if g(Field::TcpWindow) {
                    w.set(Field::TcpWindow, u64::from(window));
                }
            }
            L4::Udp { sport, dport } => {
                if g(Field::Sport) {
                    w.set(Field::Sport, u64::from(sport));
                }
                if g(Field::Dport) {
                    w.set(Field::Dport, u64::from(dport));
                }
            }
            L4::None => {}
        }
        w.finish(p.payload, self.payload)
    }

    /// The packet as this policy lets it be exported (see the module docs),
    /// appended to `out` as a `LINKTYPE_RAW` frame. Returns its wire length.
    pub fn sanitize(&self, p: &Packet<'_>, mut anon: Option<&mut Anonymizer>, out: &mut Vec<u8>) -> u32 {
        let start = out.len();
        // Without the protocol the transport header is opaque: it is not exported.
        let end = if self.admin || self.fields & Field::Proto.bit() != 0 {
            p.payload_off.saturating_add(p.payload.len().min(self.payload))
        } else {
            p.ip_off + p.ip_hdr_len
        }
        .min(p.frame.len());
        let Some(bytes) = p.frame.get(p.ip_off..end) else { return 0 };
        out.extend_from_slice(bytes);
        let Some(pkt) = out.get_mut(start..) else { return 0 };
        let g = |f: Field| self.admin || self.fields & f.bit() != 0;
        let zero = |pkt: &mut [u8], r: std::ops::Range<usize>| {
            if let Some(s) = pkt.get_mut(r) {
                s.fill(0);
            }
        };
        let ip_hdr = p.ip_hdr_len.min(pkt.len());
        let (src_r, dst_r) = if p.version == 4 {
            if !g(Field::Tos) {
                zero(pkt, 1..2);
            }
            if !g(Field::IpLen) {
                // The length of what is exported: readers need a total length.
                let n = (pkt.len().min(usize::from(u16::MAX)) as u16).to_be_bytes();
                if let Some(s) = pkt.get_mut(2..4) {
                    s.copy_from_slice(&n);
                }
            }
            if !g(Field::IpId) {
                zero(pkt, 4..6);
            }
            if !g(Field::Frag) {
                zero(pkt, 6..8);
            }
            if !g(Field::Ttl) {
                zero(pkt, 8..9);
            }
            if !g(Field::Proto) {
                zero(pkt, 9..10);
            }
            zero(pkt, 10..12);
            zero(pkt, 20..ip_hdr);
            (12..16, 16..20)
        } else {
            if !g(Field::Tos) {
                if let Some(b) = pkt.get_mut(0) {
                    *b &= 0xf0;
                }
                if let Some(b) = pkt.get_mut(1) {
                    *b &= 0x0f;
                }
            }
            if !g(Field::IpId) {
                if let Some(b) = pkt.get_mut(1) {
                    *b &= 0xf0;
                }
                zero(pkt, 2..4);
            }
            if !g(Field::IpLen) {
                let n = (pkt.len().saturating_sub(40).min(usize::from(u16::MAX)) as u16).to_be_bytes();
                if let Some(s) = pkt.get_mut(4..6) {
                    s.copy_from_slice(&n);
                }
            }
            if !g(Field::Proto) {
                zero(pkt, 6..7);
            }
            if !g(Field::Ttl) {
                zero(pkt, 7..8);
            }
            if !self.admin {
                zero(pkt, 40..ip_hdr);
            }
            (8..24, 24..40)
        };
        for (r, f, a) in [(src_r, Field::Src, p.src), (dst_r, Field::Dst, p.dst)] {
            match (g(f), self.address(p, &a, &mut anon)) {
                (true, Some(x)) => {
                    if let Some(s) = pkt.get_mut(r) {
                        let n = s.len();
                        s.copy_from_slice(&x[..n]);
                    }
                }
                _ => zero(pkt, r),
            }
        }
        let l4 = p.l4_off.saturating_sub(p.ip_off);
        let pay = p.payload_off.saturating_sub(p.ip_off);
        match p.l4 {
            L4::Tcp { .. } => {
                for (f, r) in [
                    (Field::Sport, 0..2),
                    (Field::Dport, 2..4),
                    (Field::TcpSeq, 4..8),
                    (Field::TcpAck, 8..12),
                    (Field::TcpWindow, 14..16),
                ] {
                    if !g(f) {
                        zero(pkt, l4 + r.start..l4 + r.end);
                    }
                }
                if !g(Field::TcpFlags) {
                    if let Some(b) = pkt.get_mut(l4 + 12) {
                        *b &= 0xf0;
                    }
                    zero(pkt, l4 + 13..l4 + 14);
                }
                zero(pkt, l4 + 16..l4 + 20);
                zero(pkt, l4 + 20..pay);
            }
            L4::Udp { .. } => {
                if !g(Field::Sport) {
                    zero(pkt, l4..l4 + 2);
                }
                if !g(Field::Dport) {
                    zero(pkt, l4 + 2..l4 + 4);
                }
                if !g(Field::PayloadLen) {
                    zero(pkt, l4 + 4..l4 + 6);
                }
                zero(pkt, l4 + 6..l4 + 8);
            }
            L4::None => {}
        }
        p.ip_len
    }
}
