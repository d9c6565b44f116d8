//! Capture files: pcap and pcapng read through `pcap-file`, with bounded
//! buffering and typed errors; sampled packets written as pcap.
//!
//! [`CaptureReader`] reads from any `Read` (a file, stdin, a pipe) and yields
//! [`Frame`]s borrowed from its buffer. It never holds more than
//! [`MAX_BUFFER`] bytes: a record or block longer than [`MAX_FRAME`] plus
//! its framing is an error ([`CaptureError::TooLarge`]), whatever length the
//! file claims, so a 4 GiB length field costs nothing.
//!
//! # DoS and malformed input
//!
//! - The file header is checked (magic, version) by `pcap-file`; the header's
//!   snap length is *not* trusted: 0 and 2³²−1 (seen in the wild) mean "no
//!   limit stated" and every record is held to [`MAX_FRAME`] (libpcap's
//!   `MAXIMUM_SNAPLEN`) instead.
//! - A pcap record whose captured length exceeds its original length is
//!   skipped and counted (`bad_records`); reading goes on.
//! - pcapng blocks other than section headers, interface descriptions,
//!   enhanced and simple packets (statistics, name resolution, custom and
//!   unknown types) are skipped and counted (`skipped_blocks`). A packet
//!   naming an interface that was never described is skipped and counted.
//! - A file that ends inside a record is [`CaptureError::Truncated`]; the
//!   frames before it were delivered.
//!
//! Timestamps are nanoseconds since the Unix epoch: pcap's micro- or
//! nanosecond magic and pcapng's `if_tsresol` (default 10⁻⁶) and
//! `if_tsoffset` are applied (`pcap-file` 2.0 reports raw pcapng units).

use std::io::{Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapParser, PcapWriter};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, PcapError, TsResolution};

/// Largest captured frame accepted (libpcap's `MAXIMUM_SNAPLEN`).
pub const MAX_FRAME: usize = 262_144;
/// Most bytes a reader buffers: one frame and its framing.
pub const MAX_BUFFER: usize = MAX_FRAME + 4096;
const READ_CHUNK: usize = 64 * 1024;

/// The link layer of a frame (the capture's DLT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// `DLT_EN10MB`: Ethernet II (with 802.1Q/802.1ad tags).
    Ethernet,
    /// `DLT_RAW` / `LINKTYPE_RAW`: a bare IPv4 or IPv6 packet.
    Raw,
    /// `LINKTYPE_IPV4`.
    Ipv4,
    /// `LINKTYPE_IPV6`.
    Ipv6,
    /// `LINKTYPE_LINUX_SLL` (`tcpdump -i any`, older libpcap).
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (`tcpdump -i any`).
    LinuxSll2,
    /// `DLT_NULL`: BSD loopback, a 4-byte address family in host order.
    Null,
    /// Anything else (its DLT number); its frames are counted as `unsupported_link`.
    Other(u32),
}

impl LinkType {
    /// The link type for a DLT number.
    pub fn from_dlt(n: u32) -> LinkType {
        match n {
            0 => LinkType::Null,
            1 => LinkType::Ethernet,
            12 | 14 | 101 => LinkType::Raw,
            113 => LinkType::LinuxSll,
            228 => LinkType::Ipv4,
            229 => LinkType::Ipv6,
            276 => LinkType::LinuxSll2,
            n => LinkType::Other(n),
        }
    }
    /// The DLT number written to pcap files.
    pub fn dlt(self) -> u32 {
        match self {
            LinkType::Null => 0,
            LinkType::Ethernet => 1,
            LinkType::Raw => 101,
            LinkType::LinuxSll => 113,
            LinkType::Ipv4 => 228,
            LinkType::Ipv6 => 229,
            LinkType::LinuxSll2 => 276,
            LinkType::Other(n) => n,
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Capture time, ns since the Unix epoch.
    pub ts_ns: u64,
    /// Length on the wire (may exceed `data.len()`).
    pub wire_len: u32,
    /// Interface index (pcapng interface id; 0 for pcap).
    pub iface: u16,
    /// Link layer.
    pub link: LinkType,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// Why a capture could not be read further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Reading the source failed.
    #[error("read error: {0}")]
    Io(String),
    /// The first bytes are neither a pcap nor a pcapng magic number.
    #[error("not a pcap or pcapng capture (magic {0:02x?})")]
    NotACapture([u8; 4]),
    /// The file or section header is malformed.
    #[error("bad capture header: {0}")]
    Header(String),
    /// A record or block is malformed (pcapng block framing, options, lengths).
    #[error("malformed capture record: {0}")]
    Malformed(String),
    /// A record or block is longer than this reader accepts.
    #[error("record or block longer than {MAX_BUFFER} bytes")]
    TooLarge,
    /// The capture ends inside a record.
    #[error("capture truncated inside a record ({0} bytes left over)")]
    Truncated(usize),
}

/// Counters of a reader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureCounters {
    /// Frames delivered.
    pub frames: u64,
    /// pcap records skipped (captured length > original length).
    pub bad_records: u64,
    /// pcapng blocks skipped (not packets or descriptions).
    pub skipped_blocks: u64,
    /// Packets naming an undescribed interface.
    pub unknown_interface: u64,
    /// Bytes consumed.
    pub bytes: u64,
}

/// The capture's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic pcap (microsecond or nanosecond).
    Pcap,
    /// pcapng.
    PcapNg,
}

#[derive(Debug, Clone, Copy)]
struct Iface {
    link: LinkType,
    /// Multiplier and divisor turning pcapng time units into ns.
    mul: u64,
    div: u64,
    offset_ns: u64,
}

enum Parser {
    Pcap { p: PcapParser, link: LinkType, nanos: bool },
    Ng { p: PcapNgParser, ifaces: Vec<Iface> },
}

/// What one parse step found (positions in the buffer, so the borrow of the
/// buffer is taken only when the frame is returned).
enum Step {
    Frame { consumed: usize, at: usize, len: usize, ts_ns: u64, wire_len: u32, iface: u16, link: LinkType },
    Skip { consumed: usize, bad: bool, unknown_iface: bool },
    More,
}

/// Reads frames from a pcap or pcapng source.
pub struct CaptureReader<R> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    parser: Parser,
    format: Format,
    snaplen: u32,
    counters: CaptureCounters,
}

impl<R> std::fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureReader").field("format", &self.format).field("counters", &self.counters).finish()
    }
}

fn read_some<R: Read>(src: &mut R, buf: &mut [u8]) -> Result<usize, CaptureError> {
    loop {
        match src.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CaptureError::Io(e.to_string())),
        }
    }
}

fn offset_in(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let o = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (o + inner.len() <= outer.len()).then_some(o)
}

fn ng_iface(idb: &pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock<'_>) -> Iface {
    let mut it = Iface { link: LinkType::from_dlt(u32::from(idb.linktype)), mul: 1000, div: 1, offset_ns: 0 };
    for o in &idb.options {
        match o {
            InterfaceDescriptionOption::IfTsResol(r) => {
                if r & 0x80 == 0 {
                    let e = u32::from(*r);
                    if e <= 9 {
                        it.mul = 10u64.pow(9 - e);
                        it.div = 1;
                    } else {
                        it.mul = 1;
                        it.div = 10u64.checked_pow(e - 9).unwrap_or(u64::MAX);
                    }
                } else {
                    // 2^-e seconds: ns = units * 1e9 / 2^e
                    let e = u32::from(r & 0x7f).min(63);
                    it.mul = 1_000_000_000;
                    it.div = 1u64 << e;
                }
            }
            InterfaceDescriptionOption::IfTsOffset(s) => it.offset_ns = s.saturating_mul(1_000_000_000),
            _ => {}
        }
    }
    it
}

impl<R: Read> CaptureReader<R> {
    /// Opens a capture: reads and checks its header.
    ///
    /// # Errors
    /// [`CaptureError::NotACapture`], [`CaptureError::Header`], [`CaptureError::Io`],
    /// [`CaptureError::Truncated`] for a source shorter than a header.
    pub fn new(mut src: R) -> Result<CaptureReader<R>, CaptureError> {
        let mut buf = vec![0; MAX_BUFFER + READ_CHUNK];
        let (mut end, mut eof) = (0, false);
        while end < 28 && !eof {
            let n = read_some(&mut src, &mut buf[end..end + READ_CHUNK])?;
            eof = n == 0;
            end += n;
        }
        let magic: [u8; 4] = buf[..4].try_into().map_err(|_| CaptureError::Truncated(end))?;
        if end < 4 {
            return Err(CaptureError::Truncated(end));
        }
        let (start, parser, format, snaplen) = match magic {
            [0x0a, 0x0d, 0x0d, 0x0a] => loop {
                // The section header block may be longer than what is buffered.
                match PcapNgParser::new(&buf[..end]) {
                    Ok((rem, p)) => break (end - rem.len(), Parser::Ng { p, ifaces: Vec::new() }, Format::PcapNg, 0),
                    Err(PcapError::IncompleteBuffer) if eof => return Err(CaptureError::Truncated(end)),
                    Err(PcapError::IncompleteBuffer) if end + READ_CHUNK > buf.len() => {
                        return Err(CaptureError::TooLarge);
                    }
                    Err(PcapError::IncompleteBuffer) => {
                        let n = read_some(&mut src, &mut buf[end..end + READ_CHUNK])?;
                        eof = n == 0;
                        end += n;
                    }
                    Err(e) => return Err(CaptureError::Header(e.to_string())),
                }
            },
            [0xa1, 0xb2, 0xc3, 0xd4]
            | [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d]
            | [0x4d, 0x3c, 0xb2, 0xa1] => {
                let (rem, p) = PcapParser::new(&buf[..end]).map_err(|e| match e {
                    PcapError::IncompleteBuffer => CaptureError::Truncated(end),
                    e => CaptureError::Header(e.to_string()),
                })?;
                let h: PcapHeader = p.header();
                let parser = Parser::Pcap {
                    link: LinkType::from_dlt(u32::from(h.datalink)),
                    nanos: h.ts_resolution == TsResolution::NanoSecond,
                    p,
                };
                (end - rem.len(), parser, Format::Pcap, h.snaplen)
            }
            m => return Err(CaptureError::NotACapture(m)),
        };
        let counters = CaptureCounters { bytes: start as u64, ..CaptureCounters::default() };
        Ok(CaptureReader { src, buf, start, end, eof, parser, format, snaplen, counters })
    }

    /// pcap or pcapng.
    pub fn format(&self) -> Format {
        self.format
    }
    /// The pcap header's snap length as written (0 for pcapng; informational only).
    pub fn header_snaplen(&self) -> u32 {
        self.snaplen
    }
    /// Counters so far.
    pub fn counters(&self) -> CaptureCounters {
        self.counters
    }

    fn fill(&mut self) -> Result<(), CaptureError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buf.len() - self.end;
        if room == 0 {
            return Err(CaptureError::TooLarge);
        }
        let n = read_some(&mut self.src, &mut self.buf[self.end..self.end + room.min(READ_CHUNK)])?;
        if n == 0 {
            self.eof = true;
        }
        self.end += n;
        Ok(())
    }

    fn step(&mut self) -> Result<Step, CaptureError> {
        let src = &self.buf[self.start..self.end];
        match &mut self.parser {
            Parser::Pcap { p, link, nanos } => match p.next_raw_packet(src) {
                Ok((rem, raw)) => {
                    let consumed = src.len() - rem.len();
                    let data: &[u8] = &raw.data;
                    if raw.incl_len > raw.orig_len || data.len() > MAX_FRAME {
                        return Ok(Step::Skip { consumed, bad: true, unknown_iface: false });
                    }
                    let frac = u64::from(raw.ts_frac);
                    let ts_ns = u64::from(raw.ts_sec).saturating_mul(1_000_000_000).saturating_add(if *nanos {
                        frac
                    } else {
                        frac.saturating_mul(1000)
                    });
                    let at = offset_in(src, data).ok_or_else(|| CaptureError::Malformed("record data".into()))?;
                    Ok(Step::Frame {
                        consumed,
                        at: self.start + at,
                        len: data.len(),
                        ts_ns,
                        wire_len: raw.orig_len,
                        iface: 0,
                        link: *link,
                    })
                }
                Err(PcapError::IncompleteBuffer) => Ok(Step::More),
                Err(e) => Err(CaptureError::Malformed(e.to_string())),
            },
            Parser::Ng { p, ifaces } => match p.next_block(src) {
                Ok((rem, block)) => {
                    let consumed = src.len() - rem.len();
                    let (iface, ts_raw, wire_len, data) = match &block {
                        Block::SectionHeader(_) => {
                            ifaces.clear();
                            return Ok(Step::Skip { consumed, bad: false, unknown_iface: false });
                        }
                        Block::InterfaceDescription(idb) => {
                            ifaces.push(ng_iface(idb));
                            return Ok(Step::Skip { consumed, bad: false, unknown_iface: false });
                        }
                        Block::EnhancedPacket(e) => {
                            (e.interface_id, e.timestamp.as_nanos() as u64, e.original_len, &e.data[..])
                        }
                        Block::SimplePacket(s) => (0, 0, s.original_len, &s.data[..]),
                        _ => return Ok(Step::Skip { consumed, bad: true, unknown_iface: false }),
                    };
                    let Some(ifc) = ifaces.get(iface as usize).copied() else {
                        return Ok(Step::Skip { consumed, bad: false, unknown_iface: true });
                    };
                    if data.len() > MAX_FRAME {
                        return Err(CaptureError::TooLarge);
                    }
                    let ts_ns = (u128::from(ts_raw) * u128::from(ifc.mul) / u128::from(ifc.div.max(1)))
                        .min(u128::from(u64::MAX)) as u64;
                    let at = offset_in(src, data).ok_or_else(|| CaptureError::Malformed("block data".into()))?;
                    Ok(Step::Frame {
                        consumed,
                        at: self.start + at,
                        len: data.len(),
                        ts_ns: ts_ns.saturating_add(ifc.offset_ns),
                        wire_len: wire_len.max(data.len() as u32),
                        iface: u16::try_from(iface).unwrap_or(u16::MAX),
                        link: ifc.link,
                    })
                }
                Err(PcapError::IncompleteBuffer) => Ok(Step::More),
                Err(e) => Err(CaptureError::Malformed(e.to_string())),
            },
        }
    }

    /// The next frame, `Ok(None)` at the end of the capture.
    ///
    /// # Errors
    /// See [`CaptureError`]. After an error the reader should be dropped.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, CaptureError> {
        loop {
            match self.step()? {
                Step::Frame { consumed, at, len, ts_ns, wire_len, iface, link } => {
                    self.start += consumed;
                    self.counters.bytes += consumed as u64;
                    self.counters.frames += 1;
                    let data = self.buf.get(at..at + len).ok_or_else(|| CaptureError::Malformed("frame".into()))?;
                    return Ok(Some(Frame { ts_ns, wire_len, iface, link, data }));
                }
                Step::Skip { consumed, bad, unknown_iface } => {
                    self.start += consumed;
                    self.counters.bytes += consumed as u64;
                    if unknown_iface {
                        self.counters.unknown_interface += 1;
                    } else if bad {
                        match self.format {
                            Format::Pcap => self.counters.bad_records += 1,
                            Format::PcapNg => self.counters.skipped_blocks += 1,
                        }
                    }
                }
                Step::More => {
                    if self.eof {
                        let left = self.end - self.start;
                        return if left == 0 { Ok(None) } else { Err(CaptureError::Truncated(left)) };
                    }
                    if self.end - self.start >= MAX_BUFFER {
                        return Err(CaptureError::TooLarge);
                    }
                    self.fill()?;
                }
            }
        }
    }
}

/// Writes frames as a classic pcap file (nanosecond resolution), e.g. the
/// packets a module sampled.
pub struct PcapSink<W: Write> {
    w: PcapWriter<W>,
}

impl<W: Write> std::fmt::Debug for PcapSink<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PcapSink")
    }
}

impl<W: Write> PcapSink<W> {
    /// Writes the file header for `link`.
    ///
    /// # Errors
    /// The writer's I/O error, as text.
    pub fn new(w: W, link: LinkType) -> Result<PcapSink<W>, CaptureError> {
        let header = PcapHeader {
            snaplen: MAX_FRAME as u32,
            datalink: DataLink::from(link.dlt()),
            ts_resolution: TsResolution::NanoSecond,
            ..PcapHeader::default()
        };
        let w = PcapWriter::with_header(w, header).map_err(|e| CaptureError::Io(e.to_string()))?;
        Ok(PcapSink { w })
    }
    /// Appends one frame.
    ///
    /// # Errors
    /// The writer's I/O error, as text.
    pub fn write(&mut self, ts_ns: u64, wire_len: u32, data: &[u8]) -> Result<(), CaptureError> {
        let p = PcapPacket::new(Duration::from_nanos(ts_ns), wire_len.max(data.len() as u32), data);
        self.w.write_packet(&p).map(|_| ()).map_err(|e| CaptureError::Io(e.to_string()))
    }
    /// The inner writer.
    pub fn into_inner(self) -> W {
        self.w.into_writer()
    }
}
