//! Parsing frames into the header fields the policy view is built from,
//! through `etherparse` (lax slicing: a capture cut by its snap length still
//! yields its headers and the payload bytes that were captured).
//!
//! A frame that is not IP is skipped as [`Skip::NotIp`]; a malformed one is
//! skipped with the reason `etherparse` gives, mapped to a stable label
//! ([`Skip::label`]) so that the monitor counts skips by reason. Nothing here
//! panics or allocates.

use etherparse::err::Layer;
use etherparse::err::packet::SliceError;
use etherparse::{EtherType, LaxNetSlice, LaxSlicedPacket, TransportSlice};

use crate::capture::{Frame, LinkType};

/// The transport header, if TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// Not TCP or UDP (ICMP, a non-first fragment, other protocols).
    None,
    /// TCP.
    Tcp {
        /// Source port.
        sport: u16,
        /// Destination port.
        dport: u16,
        /// Sequence number.
        seq: u32,
        /// Acknowledgment number.
        ack: u32,
        /// Flags, CWR..FIN in bits 7..0.
        flags: u8,
        /// Window.
        window: u16,
    },
    /// UDP.
    Udp {
        /// Source port.
        sport: u16,
        /// Destination port.
        dport: u16,
    },
}

/// A parsed IP packet: header fields plus where things are in the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Capture time, ns.
    pub ts_ns: u64,
    /// Length on the wire.
    pub wire_len: u32,
    /// Interface.
    pub iface: u16,
    /// Link type of `frame`.
    pub link: LinkType,
    /// The whole captured frame.
    pub frame: &'a [u8],
    /// Offset of the IP header in `frame`.
    pub ip_off: usize,
    /// Length of the IP header (IPv6: including extension headers).
    pub ip_hdr_len: usize,
    /// 4 or 6.
    pub version: u8,
    /// Source address (IPv4 in the first 4 bytes).
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Protocol (after IPv6 extension headers).
    pub proto: u8,
    /// TTL / hop limit.
    pub ttl: u8,
    /// TOS / traffic class.
    pub tos: u8,
    /// IPv4 flags + fragment offset as on the wire (IPv6: from a fragment header, else 0).
    pub frag: u16,
    /// IPv4 identification / IPv6 flow label.
    pub id: u32,
    /// IP total length.
    pub ip_len: u32,
    /// Transport header.
    pub l4: L4,
    /// Offset of the transport header in `frame` (= `payload_off` when [`L4::None`]).
    pub l4_off: usize,
    /// Offset of the payload in `frame`.
    pub payload_off: usize,
    /// The captured payload bytes.
    pub payload: &'a [u8],
    /// The payload's length on the wire.
    pub payload_len: u32,
}

impl Packet<'_> {
    /// Source and destination ports (0 without TCP/UDP).
    pub fn ports(&self) -> (u16, u16) {
        match self.l4 {
            L4::Tcp { sport, dport, .. } | L4::Udp { sport, dport } => (sport, dport),
            L4::None => (0, 0),
        }
    }
    /// Address length: 4 or 16.
    pub fn addr_len(&self) -> usize {
        if self.version == 4 { 4 } else { 16 }
    }
}

macro_rules! skips {
    ($(($v:ident, $label:literal, $doc:literal)),* $(,)?) => {
        /// Why a frame was skipped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Skip {
            $(#[doc = $doc] $v,)*
        }
        impl Skip {
            /// Every reason.
            pub const ALL: &'static [Skip] = &[$(Skip::$v),*];
            /// A stable label for counters.
            pub const fn label(self) -> &'static str {
                match self { $(Skip::$v => $label,)* }
            }
        }
    };
}

skips! {
    (NotIp, "not_ip", "not an IP packet (ARP, LLDP, …): skipped, not malformed"),
    (UnsupportedLink, "unsupported_link", "a link type the parser does not know"),
    (LinkTruncated, "link_truncated", "shorter than its link-layer header"),
    (LinkHeader, "link_header", "a malformed link-layer header (Linux SLL, MACsec)"),
    (IpTruncated, "ip_truncated", "the IP header is cut off"),
    (IpHeader, "ip_header", "a malformed IP header (bad version, IHL, length)"),
    (IpExtension, "ip_extension", "a malformed IPv4 or IPv6 extension header"),
    (L4Truncated, "l4_truncated", "the TCP or UDP header is cut off"),
    (TcpHeader, "tcp_header", "a malformed TCP header (data offset)"),
}

fn stop_reason(e: &SliceError, layer: Layer) -> Skip {
    match e {
        SliceError::Len(_) => match layer {
            Layer::TcpHeader | Layer::UdpHeader | Layer::Icmpv4 | Layer::Icmpv6 => Skip::L4Truncated,
            Layer::Ethernet2Header | Layer::VlanHeader | Layer::LinuxSllHeader | Layer::MacsecHeader => {
                Skip::LinkTruncated
            }
            _ => Skip::IpTruncated,
        },
        SliceError::LinuxSll(_) | SliceError::Macsec(_) => Skip::LinkHeader,
        SliceError::Ip(_) | SliceError::Ipv4(_) | SliceError::Ipv6(_) => Skip::IpHeader,
        SliceError::Ipv4Exts(_) | SliceError::Ipv6Exts(_) => Skip::IpExtension,
        SliceError::Tcp(_) => Skip::TcpHeader,
    }
}

fn offset_in(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let o = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (o + inner.len() <= outer.len()).then_some(o)
}

fn slice<'a>(f: &Frame<'a>) -> Result<LaxSlicedPacket<'a>, Skip> {
    let d = f.data;
    match f.link {
        LinkType::Ethernet => LaxSlicedPacket::from_ethernet(d).map_err(|_| Skip::LinkTruncated),
        LinkType::Raw | LinkType::Ipv4 | LinkType::Ipv6 => LaxSlicedPacket::from_ip(d).map_err(|e| match e {
            etherparse::err::ip::LaxHeaderSliceError::Len(_) => Skip::IpTruncated,
            etherparse::err::ip::LaxHeaderSliceError::Content(_) => Skip::IpHeader,
        }),
        LinkType::LinuxSll => {
            let proto = d.get(14..16).ok_or(Skip::LinkTruncated)?;
            let rest = d.get(16..).ok_or(Skip::LinkTruncated)?;
            Ok(LaxSlicedPacket::from_ether_type(EtherType(u16::from_be_bytes([proto[0], proto[1]])), rest))
        }
        LinkType::LinuxSll2 => {
            let proto = d.get(0..2).ok_or(Skip::LinkTruncated)?;
            let rest = d.get(20..).ok_or(Skip::LinkTruncated)?;
            Ok(LaxSlicedPacket::from_ether_type(EtherType(u16::from_be_bytes([proto[0], proto[1]])), rest))
        }
        LinkType::Null => {
            let fam = d.get(0..4).ok_or(Skip::LinkTruncated)?;
            let (le, be) = (
                u32::from_le_bytes([fam[0], fam[1], fam[2], fam[3]]),
                u32::from_be_bytes([fam[0], fam[1], fam[2], fam[3]]),
            );
            let af = if le < 256 { le } else { be };
            let rest = d.get(4..).ok_or(Skip::LinkTruncated)?;
            match af {
                2 | 24 | 28 | 30 => LaxSlicedPacket::from_ip(rest).map_err(|_| Skip::IpHeader),
                _ => Err(Skip::NotIp),
            }
        }
        LinkType::Other(_) => Err(Skip::UnsupportedLink),
    }
}

/// Parses a frame. Non-IP and malformed frames are `Err` with the reason.
pub fn parse<'a>(f: &Frame<'a>) -> Result<Packet<'a>, Skip> {
    let s = slice(f)?;
    let frame = f.data;
    let net = match &s.net {
        Some(n) => n,
        None => {
            return Err(match &s.stop_err {
                Some((e, layer)) => stop_reason(e, *layer),
                None => Skip::NotIp,
            });
        }
    };
    // A frame whose transport header is present but broken is malformed;
    // one cut inside its payload is fine (lax slicing keeps what is there).
    if let Some((e, layer)) = &s.stop_err
        && s.transport.is_none()
        && matches!(layer, Layer::TcpHeader | Layer::UdpHeader)
    {
        return Err(stop_reason(e, *layer));
    }
    let mut p = Packet {
        ts_ns: f.ts_ns,
        wire_len: f.wire_len,
        iface: f.iface,
        link: f.link,
        frame,
        ip_off: 0,
        ip_hdr_len: 0,
        version: 0,
        src: [0; 16],
        dst: [0; 16],
        proto: 0,
        ttl: 0,
        tos: 0,
        frag: 0,
        id: 0,
        ip_len: 0,
        l4: L4::None,
        l4_off: 0,
        payload_off: 0,
        payload: &[],
        payload_len: 0,
    };
    let ip_payload = match net {
        LaxNetSlice::Ipv4(v4) => {
            let h = v4.header();
            p.version = 4;
            p.ip_off = offset_in(frame, h.slice()).ok_or(Skip::IpHeader)?;
            p.ip_hdr_len = h.slice().len() + v4.extensions().auth.map_or(0, |a| a.slice().len());
            p.src[..4].copy_from_slice(&h.source());
            p.dst[..4].copy_from_slice(&h.destination());
            p.proto = v4.payload_ip_number().0;
            p.ttl = h.ttl();
            p.tos = h.slice().get(1).copied().unwrap_or(0);
            p.frag = h.slice().get(6..8).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
            p.id = u32::from(h.identification());
            p.ip_len = u32::from(h.total_len());
            v4.payload()
        }
        LaxNetSlice::Ipv6(v6) => {
            let h = v6.header();
            p.version = 6;
            p.ip_off = offset_in(frame, h.slice()).ok_or(Skip::IpHeader)?;
            p.ip_hdr_len = h.slice().len() + v6.extensions().slice().len();
            p.src = h.source();
            p.dst = h.destination();
            p.proto = v6.payload().ip_number.0;
            p.ttl = h.hop_limit();
            p.tos = h.traffic_class();
            p.id = h.flow_label().value();
            p.ip_len = u32::from(h.payload_length()) + 40;
            if let Some(fh) = v6.extensions().first_header()
                && fh == etherparse::IpNumber::IPV6_FRAGMENTATION_HEADER
            {
                p.frag = v6.is_payload_fragmented() as u16;
            }
            v6.payload()
        }
        LaxNetSlice::Arp(_) => return Err(Skip::NotIp),
    };
    // Bytes of the IP payload on the wire (IP length minus headers).
    let ip_payload_wire = (p.ip_len as usize).saturating_sub(p.ip_hdr_len);
    match &s.transport {
        Some(TransportSlice::Tcp(t)) => {
            let hdr = t.header_slice();
            p.l4_off = offset_in(frame, hdr).ok_or(Skip::TcpHeader)?;
            let b = hdr.get(13).copied().unwrap_or(0);
            p.l4 = L4::Tcp {
                sport: t.source_port(),
                dport: t.destination_port(),
                seq: t.sequence_number(),
                ack: t.acknowledgment_number(),
                flags: b,
                window: t.window_size(),
            };
            p.payload = t.payload();
            p.payload_off = p.l4_off + hdr.len();
            p.payload_len = ip_payload_wire.saturating_sub(hdr.len()) as u32;
        }
        Some(TransportSlice::Udp(u)) => {
            let hdr = u.header_slice();
            p.l4_off = offset_in(frame, hdr).ok_or(Skip::L4Truncated)?;
            p.l4 = L4::Udp { sport: u.source_port(), dport: u.destination_port() };
            p.payload = u.payload();
            p.payload_off = p.l4_off + hdr.len();
            p.payload_len = u32::from(u.length()).saturating_sub(8);
        }
        _ => {
            p.payload = ip_payload.payload;
            p.payload_off = offset_in(frame, ip_payload.payload).unwrap_or(frame.len());
            p.l4_off = p.payload_off;
            p.payload_len = ip_payload_wire as u32;
        }
    }
    if p.payload_len < p.payload.len() as u32 {
        p.payload_len = p.payload.len() as u32;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv4/TCP SYN to port 80 with 4 bytes of payload, as
    /// `etherparse::PacketBuilder` writes it.
    pub(crate) fn tcp_frame(payload: &[u8]) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
            .ipv4([192, 168, 1, 1], [10, 0, 0, 2], 64)
            .tcp(40000, 80, 1000, 65000)
            .syn();
        let mut out = Vec::new();
        b.write(&mut out, payload).unwrap_or_default();
        out
    }

    fn frame(data: &[u8], link: LinkType) -> Frame<'_> {
        Frame { ts_ns: 7, wire_len: data.len() as u32, iface: 0, link, data }
    }

    #[test]
    fn ethernet_ipv4_tcp_fields_and_offsets() {
        let d = tcp_frame(b"abcd");
        let p = parse(&frame(&d, LinkType::Ethernet)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.version, p.proto, p.ttl, p.ip_off, p.l4_off, p.payload_off), (4, 6, 64, 14, 34, 54));
        assert_eq!(&p.src[..4], &[192, 168, 1, 1]);
        assert_eq!(p.ports(), (40000, 80));
        assert!(matches!(p.l4, L4::Tcp { seq: 1000, flags: 0x02, .. }));
        assert_eq!((p.payload, p.payload_len), (&b"abcd"[..], 4));
    }

    #[test]
    fn snaplen_cut_payload_keeps_headers_and_wire_length() {
        let d = tcp_frame(&[0x55; 100]);
        let cut = &d[..60];
        let p = parse(&frame(cut, LinkType::Ethernet)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.payload.len(), p.payload_len), (6, 100));
    }

    #[test]
    fn malformed_frames_are_typed_skips() {
        let d = tcp_frame(b"");
        assert_eq!(parse(&frame(&d[..10], LinkType::Ethernet)), Err(Skip::LinkTruncated));
        assert_eq!(parse(&frame(&d[..20], LinkType::Ethernet)), Err(Skip::IpTruncated));
        assert_eq!(parse(&frame(&d[..40], LinkType::Ethernet)), Err(Skip::L4Truncated));
        let mut bad = d.clone();
        bad[14] = 0x41; // IHL 1
        assert_eq!(parse(&frame(&bad, LinkType::Ethernet)), Err(Skip::IpHeader));
        let mut arp = d.clone();
        arp[12..14].copy_from_slice(&[0x88, 0xcc]); // LLDP
        assert_eq!(parse(&frame(&arp, LinkType::Ethernet)), Err(Skip::NotIp));
        assert_eq!(parse(&frame(&d, LinkType::Other(147))), Err(Skip::UnsupportedLink));
        let mut off = d.clone();
        off[14 + 20 + 12] = 0x20; // TCP data offset 2
        assert_eq!(parse(&frame(&off, LinkType::Ethernet)), Err(Skip::TcpHeader));
    }

    #[test]
    fn raw_ipv6_udp() {
        let b = etherparse::PacketBuilder::ipv6(
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            9,
        )
        .udp(53, 5353);
        let mut d = Vec::new();
        b.write(&mut d, b"q").unwrap_or_default();
        let p = parse(&frame(&d, LinkType::Raw)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.version, p.proto, p.ttl, p.ip_len, p.payload_len), (6, 17, 9, 49, 1));
        assert_eq!(p.ports(), (53, 5353));
        assert_eq!(p.src[0], 0x20);
    }
}
