//! The module ABI: the policy view of one packet, and export records.
//!
//! # The view (host → module)
//!
//! For each packet a module may see, the host writes one *view record* into
//! the module's own memory. Integers are little-endian (wasm's order);
//! addresses are in network byte order, an IPv4 address in the first four of
//! its sixteen bytes.
//!
//! ```text
//! off len
//! 0   4   record length: HEADER_LEN + payload bytes that follow (the next
//!         record of a batch starts at the next multiple of 8)
//! 4   4   present: bit i set iff field i (table below) is granted to the
//!         module AND exists in this packet; otherwise its bytes are zero
//! 8   80  the fields (table below)
//! 88  4   payload bytes that follow the header (≤ the grant, ≤ captured)
//! 92  4   reserved, zero
//! 96  …   payload bytes (the start of the TCP/UDP payload, or of the IP
//!         payload for other protocols)
//! ```
//!
//! A field the credential does not grant is *absent*: its bit is clear and
//! its bytes are zero, whatever the packet held. Anonymized addresses are
//! already replaced. The module never sees any other byte of the packet.
//!
//! # Records (module → host)
//!
//! A module exports results as records: `u8 schema` (the module's own record
//! kind, 1..=255), then items `u8 element, value`, each value the fixed
//! length [`Element::size`] gives. The host checks every record against the
//! element table ([`Record::parse`]) and turns it into a JSON line, an IPFIX
//! data record (one template per distinct schema and element list), or both.

/// Length of the view header; the payload follows it.
pub const HEADER_LEN: usize = 96;
/// Offset of the payload length in the header.
pub const PAYLOAD_LEN_OFF: usize = 88;
/// Records in a batch start at multiples of this.
pub const RECORD_ALIGN: usize = 8;
/// Longest export record, bytes.
pub const MAX_RECORD: usize = 256;

macro_rules! for_each_field {
    ($m:ident) => {
        $m! {
            // variant, name in credentials, bit, offset, length, doc
            (Ts, "ts", 0, 8, 8, "capture time, ns since the Unix epoch (u64)"),
            (WireLen, "len", 1, 16, 4, "frame length on the wire (u32)"),
            (Iface, "iface", 2, 20, 2, "capture interface index (u16)"),
            (IpVersion, "ip.version", 3, 22, 1, "4 or 6 (u8)"),
            (Proto, "ip.proto", 4, 23, 1, "IP protocol / IPv6 upper-layer next header (u8)"),
            (Ttl, "ip.ttl", 5, 24, 1, "TTL / hop limit (u8)"),
            (Tos, "ip.tos", 6, 25, 1, "TOS / traffic class (u8)"),
            (Frag, "ip.frag", 7, 26, 2, "IPv4 flags and fragment offset as on the wire (u16)"),
            (IpId, "ip.id", 8, 28, 4, "IPv4 identification, or IPv6 flow label (u32)"),
            (IpLen, "ip.len", 9, 32, 4, "IP total length: IPv4 total length, IPv6 payload length + 40 (u32)"),
            (Src, "ip.src", 10, 36, 16, "source address (16 bytes, IPv4 in the first 4)"),
            (Dst, "ip.dst", 11, 52, 16, "destination address (16 bytes, IPv4 in the first 4)"),
            (Sport, "l4.sport", 12, 68, 2, "TCP/UDP source port (u16)"),
            (Dport, "l4.dport", 13, 70, 2, "TCP/UDP destination port (u16)"),
            (TcpSeq, "tcp.seq", 14, 72, 4, "TCP sequence number (u32)"),
            (TcpAck, "tcp.ack", 15, 76, 4, "TCP acknowledgment number (u32)"),
            (TcpFlags, "tcp.flags", 16, 80, 1, "TCP flags CWR ECE URG ACK PSH RST SYN FIN, bit 7..0 (u8)"),
            (TcpWindow, "tcp.window", 17, 82, 2, "TCP window (u16)"),
            (PayloadLen, "payload.len", 18, 84, 4, "TCP/UDP payload length on the wire (u32)"),
        }
    };
}

macro_rules! define_fields {
    ($(($v:ident, $name:literal, $bit:literal, $off:literal, $len:literal, $doc:literal)),* $(,)?) => {
        /// A named header field of the view. The table in this module's
        /// source drives names, presence bits, offsets and lengths.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Field {
            $(#[doc = $doc] $v = $bit,)*
        }

        impl Field {
            /// Every field, in bit order.
            pub const ALL: &'static [Field] = &[$(Field::$v),*];

            /// Its name in credentials and docs (`ip.src`, `tcp.seq`, …).
            pub const fn name(self) -> &'static str {
                match self { $(Field::$v => $name,)* }
            }
            /// Its offset in the view header.
            pub const fn offset(self) -> usize {
                match self { $(Field::$v => $off,)* }
            }
            /// Its size in bytes.
            pub const fn size(self) -> usize {
                match self { $(Field::$v => $len,)* }
            }
            /// Its presence bit.
            pub const fn bit(self) -> u32 {
                1 << (self as u8)
            }
            /// The field called `name`.
            pub fn from_name(name: &str) -> Option<Field> {
                match name { $($name => Some(Field::$v),)* _ => None }
            }
        }
    };
}

for_each_field!(define_fields);

/// TCP flag bits in [`Field::TcpFlags`].
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// IP protocol numbers used by the applications.
pub mod proto {
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
}

/// A read-only view of one packet as the policy lets a module see it.
///
/// Every getter returns zero (or empty) for an absent field; none panics.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    b: &'a [u8],
}

impl<'a> View<'a> {
    /// A view over one record; `None` if shorter than [`HEADER_LEN`].
    pub fn new(b: &'a [u8]) -> Option<View<'a>> {
        (b.len() >= HEADER_LEN).then_some(View { b })
    }

    fn bytes<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = self.b.get(off..off + N) {
            out.copy_from_slice(s);
        }
        out
    }

    /// The record length at the start of a batch record (header + payload).
    pub fn record_len(&self) -> usize {
        u32::from_le_bytes(self.bytes(0)) as usize
    }
    /// The presence mask.
    pub fn present_mask(&self) -> u32 {
        u32::from_le_bytes(self.bytes(4))
    }
    /// Whether `f` is granted and present in this packet.
    pub fn present(&self, f: Field) -> bool {
        self.present_mask() & f.bit() != 0
    }
    /// A field's raw bytes (zero when absent).
    pub fn raw(&self, f: Field) -> &'a [u8] {
        self.b.get(f.offset()..f.offset() + f.size()).unwrap_or(&[])
    }
    /// A field as an unsigned integer (fields of 1, 2, 4 or 8 bytes; 0 for addresses).
    pub fn get(&self, f: Field) -> u64 {
        let o = f.offset();
        match f.size() {
            1 => u64::from(self.bytes::<1>(o)[0]),
            2 => u64::from(u16::from_le_bytes(self.bytes(o))),
            4 => u64::from(u32::from_le_bytes(self.bytes(o))),
            8 => u64::from_le_bytes(self.bytes(o)),
            _ => 0,
        }
    }
    /// Capture time, ns.
    pub fn ts(&self) -> u64 {
        self.get(Field::Ts)
    }
    /// IP version (4, 6, or 0 if absent).
    pub fn ip_version(&self) -> u8 {
        self.get(Field::IpVersion) as u8
    }
    /// Protocol.
    pub fn proto(&self) -> u8 {
        self.get(Field::Proto) as u8
    }
    /// Source address, 16 bytes (IPv4 in the first 4).
    pub fn src(&self) -> [u8; 16] {
        self.bytes(Field::Src.offset())
    }
    /// Destination address, 16 bytes.
    pub fn dst(&self) -> [u8; 16] {
        self.bytes(Field::Dst.offset())
    }
    /// Source port.
    pub fn sport(&self) -> u16 {
        self.get(Field::Sport) as u16
    }
    /// Destination port.
    pub fn dport(&self) -> u16 {
        self.get(Field::Dport) as u16
    }
    /// TCP sequence number.
    pub fn tcp_seq(&self) -> u32 {
        self.get(Field::TcpSeq) as u32
    }
    /// TCP acknowledgment number.
    pub fn tcp_ack(&self) -> u32 {
        self.get(Field::TcpAck) as u32
    }
    /// TCP flags.
    pub fn tcp_flags(&self) -> u8 {
        self.get(Field::TcpFlags) as u8
    }
    /// The payload bytes the module was granted (may be fewer than on the wire).
    pub fn payload(&self) -> &'a [u8] {
        let n = u32::from_le_bytes(self.bytes(PAYLOAD_LEN_OFF)) as usize;
        let end = HEADER_LEN.saturating_add(n).min(self.b.len());
        self.b.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

/// Writes view records (the host side). Every write is bounds-checked; a
/// buffer too small makes the writer return `None` rather than panic.
#[derive(Debug)]
pub struct ViewWriter<'a> {
    b: &'a mut [u8],
    mask: u32,
}

impl<'a> ViewWriter<'a> {
    /// Starts a record in `b` (zeroing its header); `None` if `b` is shorter than [`HEADER_LEN`].
    pub fn new(b: &'a mut [u8]) -> Option<ViewWriter<'a>> {
        let h = b.get_mut(..HEADER_LEN)?;
        h.fill(0);
        Some(ViewWriter { b, mask: 0 })
    }
    /// Sets field `f` to `bytes` (truncated or zero-extended to its length) and marks it present.
    pub fn set_bytes(&mut self, f: Field, bytes: &[u8]) {
        let o = f.offset();
        if let Some(dst) = self.b.get_mut(o..o + f.size()) {
            let n = bytes.len().min(dst.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
        self.mask |= f.bit();
    }
    /// Sets an integer field (little-endian, truncated to its length) and marks it present.
    pub fn set(&mut self, f: Field, v: u64) {
        let le = v.to_le_bytes();
        let o = f.offset();
        let n = f.size().min(8);
        if let (Some(dst), Some(src)) = (self.b.get_mut(o..o + n), le.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.mask |= f.bit();
    }
    /// Copies up to `max` payload bytes and finishes the record; returns its
    /// length (header + payload), or `None` if the buffer cannot hold the header.
    pub fn finish(self, payload: &[u8], max: usize) -> Option<usize> {
        let room = self.b.len().checked_sub(HEADER_LEN)?;
        let n = payload.len().min(max).min(room);
        self.b.get_mut(HEADER_LEN..HEADER_LEN + n)?.copy_from_slice(payload.get(..n)?);
        let total = HEADER_LEN + n;
        self.b.get_mut(PAYLOAD_LEN_OFF..PAYLOAD_LEN_OFF + 4)?.copy_from_slice(&(n as u32).to_le_bytes());
        self.b.get_mut(0..4)?.copy_from_slice(&(total as u32).to_le_bytes());
        self.b.get_mut(4..8)?.copy_from_slice(&self.mask.to_le_bytes());
        Some(total)
    }
}

/// How the host renders an element's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Unsigned big-endian integer.
    Unsigned,
    /// Time, ns since the Unix epoch (IPFIX dateTimeNanoseconds on export).
    TimeNs,
    /// IPv4 address.
    Ipv4,
    /// IPv6 address.
    Ipv6,
    /// IEEE 754 binary64.
    Float,
    /// An ASCII character.
    Char,
}

/// The IANA Private Enterprise Number for documentation (RFC 5612), used for
/// the elements IANA's IPFIX registry has no standard element for.
pub const PEN: u32 = 32473;

macro_rules! for_each_element {
    ($m:ident) => {
        $m! {
            // variant, id, JSON key, length, kind, IPFIX (enterprise, element id), doc
            (Ts, 1, "ts", 8, TimeNs, (0, 325), "observationTimeNanoseconds"),
            (Src4, 2, "src", 4, Ipv4, (0, 8), "sourceIPv4Address"),
            (Dst4, 3, "dst", 4, Ipv4, (0, 12), "destinationIPv4Address"),
            (Src6, 4, "src", 16, Ipv6, (0, 27), "sourceIPv6Address"),
            (Dst6, 5, "dst", 16, Ipv6, (0, 28), "destinationIPv6Address"),
            (Sport, 6, "sport", 2, Unsigned, (0, 7), "sourceTransportPort"),
            (Dport, 7, "dport", 2, Unsigned, (0, 11), "destinationTransportPort"),
            (Proto, 8, "proto", 1, Unsigned, (0, 4), "protocolIdentifier"),
            (Len, 9, "len", 8, Unsigned, (0, 224), "ipTotalLength"),
            (FlowId, 10, "flow", 8, Unsigned, (0, 148), "flowId: the trajectory flow label g(x)"),
            (Digest, 11, "hash", 8, Unsigned, (0, 326), "digestHashValue: the trajectory packet hash h(x)"),
            (Packets, 12, "packets", 8, Unsigned, (0, 2), "packetDeltaCount"),
            (RttNs, 13, "rtt_ns", 8, Unsigned, (PEN, 1), "TCP handshake round-trip time, ns"),
            (Hurst, 14, "hurst", 8, Float, (PEN, 2), "Hurst parameter estimate"),
            (Octaves, 15, "octaves", 4, Unsigned, (PEN, 3), "wavelet octaves in the estimate"),
            (Variant, 16, "variant", 1, Char, (PEN, 4), "Code Red padding character (N: CRv1, X: CRII)"),
            (Bins, 17, "bins", 8, Unsigned, (PEN, 5), "intervals counted by the Hurst estimator"),
        }
    };
}

macro_rules! define_elements {
    ($(($v:ident, $id:literal, $json:literal, $len:literal, $kind:ident, ($pen:expr, $ie:literal), $doc:literal)),* $(,)?) => {
        /// An element of an export record. The table in this module's source
        /// drives ids, JSON keys, lengths and IPFIX information elements.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Element {
            $(#[doc = $doc] $v = $id,)*
        }

        impl Element {
            /// Every element.
            pub const ALL: &'static [Element] = &[$(Element::$v),*];
            /// The element with wire id `id`.
            pub fn from_id(id: u8) -> Option<Element> {
                match id { $($id => Some(Element::$v),)* _ => None }
            }
            /// Its key in JSON lines.
            pub const fn json_key(self) -> &'static str {
                match self { $(Element::$v => $json,)* }
            }
            /// Its value's size in bytes.
            pub const fn size(self) -> usize {
                match self { $(Element::$v => $len,)* }
            }
            /// How to render it.
            pub const fn kind(self) -> Kind {
                match self { $(Element::$v => Kind::$kind,)* }
            }
            /// IPFIX (enterprise number, information element id); enterprise 0 is IANA.
            pub const fn ipfix(self) -> (u32, u16) {
                match self { $(Element::$v => ($pen, $ie),)* }
            }
        }
    };
}

for_each_element!(define_elements);

/// Builds an export record in a fixed buffer.
#[derive(Debug)]
pub struct RecordBuilder {
    buf: [u8; MAX_RECORD],
    len: usize,
    overflow: bool,
}

impl RecordBuilder {
    /// A record of kind `schema`.
    pub fn new(schema: u8) -> RecordBuilder {
        let mut buf = [0u8; MAX_RECORD];
        buf[0] = schema;
        RecordBuilder { buf, len: 1, overflow: false }
    }
    /// Appends element `e` with big-endian `value` bytes (zero-padded or cut to its length).
    pub fn bytes(&mut self, e: Element, value: &[u8]) -> &mut Self {
        let n = e.size();
        match self.buf.get_mut(self.len..self.len + 1 + n) {
            Some(dst) => {
                dst[0] = e as u8;
                let m = value.len().min(n);
                dst[1 + n - m..].copy_from_slice(&value[value.len() - m..]);
                self.len += 1 + n;
            }
            None => self.overflow = true,
        }
        self
    }
    /// Appends an unsigned value.
    pub fn uint(&mut self, e: Element, v: u64) -> &mut Self {
        self.bytes(e, &v.to_be_bytes())
    }
    /// Appends a float.
    pub fn float(&mut self, e: Element, v: f64) -> &mut Self {
        self.bytes(e, &v.to_bits().to_be_bytes())
    }
    /// Appends source and destination addresses of a view, as IPv4 or IPv6 elements.
    pub fn addresses(&mut self, v: &View<'_>) -> &mut Self {
        let (s, d) = (v.src(), v.dst());
        if v.ip_version() == 6 {
            self.bytes(Element::Src6, &s).bytes(Element::Dst6, &d)
        } else {
            self.bytes(Element::Src4, &s[..4]).bytes(Element::Dst4, &d[..4])
        }
    }
    /// The record bytes (empty if an element did not fit).
    pub fn as_bytes(&self) -> &[u8] {
        if self.overflow { &[] } else { &self.buf[..self.len] }
    }
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// Empty, or longer than [`MAX_RECORD`].
    Length,
    /// Schema 0 is reserved.
    Schema,
    /// An element id no table entry has.
    UnknownElement(u8),
    /// The record ends inside a value.
    Truncated,
    /// More than [`MAX_ITEMS`] items.
    TooManyItems,
}

/// Most items in one record.
pub const MAX_ITEMS: usize = 24;

/// A checked record: its schema and items.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The module's record kind.
    pub schema: u8,
    items: [(Option<Element>, &'a [u8]); MAX_ITEMS],
    n: usize,
}

impl<'a> Record<'a> {
    /// Checks a record from a module.
    pub fn parse(b: &'a [u8]) -> Result<Record<'a>, RecordError> {
        if b.is_empty() || b.len() > MAX_RECORD {
            return Err(RecordError::Length);
        }
        let schema = b[0];
        if schema == 0 {
            return Err(RecordError::Schema);
        }
        let mut items: [(Option<Element>, &'a [u8]); MAX_ITEMS] = [(None, &[]); MAX_ITEMS];
        let mut n = 0;
        let mut i = 1;
        while i < b.len() {
            let e = Element::from_id(b[i]).ok_or(RecordError::UnknownElement(b[i]))?;
            let v = b.get(i + 1..i + 1 + e.size()).ok_or(RecordError::Truncated)?;
            let slot = items.get_mut(n).ok_or(RecordError::TooManyItems)?;
            *slot = (Some(e), v);
            n += 1;
            i += 1 + e.size();
        }
        Ok(Record { schema, items, n })
    }
    /// The items, in order.
    pub fn items(&self) -> impl Iterator<Item = (Element, &'a [u8])> + '_ {
        self.items[..self.n].iter().filter_map(|(e, v)| e.map(|e| (e, *v)))
    }
    /// Number of items.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Whether the record has no items.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// Big-endian unsigned value of up to 8 bytes.
pub fn be_uint(v: &[u8]) -> u64 {
    v.iter().take(8).fold(0u64, |a, b| (a << 8) | u64::from(*b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_the_header_without_overlap() {
        let mut used = [false; HEADER_LEN];
        for f in Field::ALL {
            assert!(f.offset() >= 8 && f.offset() + f.size() <= PAYLOAD_LEN_OFF, "{f:?}");
            for b in &mut used[f.offset()..f.offset() + f.size()] {
                assert!(!*b, "{f:?} overlaps");
                *b = true;
            }
            assert_eq!(Field::from_name(f.name()), Some(*f));
        }
    }

    #[test]
    fn view_round_trip_and_absent_fields_read_zero() {
        let mut buf = [0xAAu8; 200];
        let mut w = ViewWriter::new(&mut buf).unwrap();
        w.set(Field::Ts, 123_456_789);
        w.set(Field::Sport, 80);
        w.set_bytes(Field::Src, &[10, 0, 0, 1]);
        let n = w.finish(b"GET / HTTP/1.0", 5).unwrap();
        assert_eq!(n, HEADER_LEN + 5);
        let v = View::new(&buf[..n]).unwrap();
        assert_eq!(v.ts(), 123_456_789);
        assert_eq!(v.sport(), 80);
        assert!(v.present(Field::Sport) && !v.present(Field::Dport));
        assert_eq!(v.dport(), 0);
        assert_eq!(v.tcp_seq(), 0);
        assert_eq!(&v.src()[..4], &[10, 0, 0, 1]);
        assert_eq!(v.payload(), b"GET /");
        assert_eq!(v.record_len(), n);
    }

    #[test]
    fn short_buffers_are_refused_not_panics() {
        assert!(View::new(&[0; 10]).is_none());
        assert!(ViewWriter::new(&mut [0; 10]).is_none());
        // A lying payload length in a view reads only what is there.
        let mut buf = [0u8; HEADER_LEN + 2];
        buf[PAYLOAD_LEN_OFF..PAYLOAD_LEN_OFF + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(View::new(&buf).unwrap().payload().len(), 2);
    }

    #[test]
    fn records_build_and_parse() {
        let mut r = RecordBuilder::new(3);
        r.uint(Element::Ts, 5).bytes(Element::Src4, &[1, 2, 3, 4]).uint(Element::RttNs, 1000);
        let p = Record::parse(r.as_bytes()).unwrap();
        assert_eq!(p.schema, 3);
        let items: [(Element, u64); 3] = {
            let mut it = p.items().map(|(e, v)| (e, be_uint(v)));
            [it.next().unwrap(), it.next().unwrap(), it.next().unwrap()]
        };
        assert_eq!(items, [(Element::Ts, 5), (Element::Src4, 0x01020304), (Element::RttNs, 1000)]);
        assert_eq!(Record::parse(&[]).unwrap_err(), RecordError::Length);
        assert_eq!(Record::parse(&[0]).unwrap_err(), RecordError::Schema);
        assert_eq!(Record::parse(&[1, 200]).unwrap_err(), RecordError::UnknownElement(200));
        assert_eq!(Record::parse(&[1, 1, 0, 0]).unwrap_err(), RecordError::Truncated);
        let mut many = [0u8; 1 + 3 * 25];
        many[0] = 1;
        for i in 0..25 {
            many[1 + 3 * i] = Element::Sport as u8;
        }
        assert_eq!(Record::parse(&many).unwrap_err(), RecordError::TooManyItems);
    }

    #[test]
    fn element_ids_are_unique() {
        for e in Element::ALL {
            assert_eq!(Element::from_id(*e as u8), Some(*e));
        }
    }
}
