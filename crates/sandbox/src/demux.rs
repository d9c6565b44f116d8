//! Channels' demultiplexing specifications and the node's demux table
//! (RCANE §IV-D): which packets a module's channel receives, how much of
//! its session's buffering it may hold, and which of its session's VPs
//! processes it.
//!
//! ```text
//! module ── net.open_channel_spec(bytes) ──► DemuxSpec::parse ──► checked against the credential
//!                                                                  (anode_cred::ChannelGrant)
//! packet for (port, source, payload) ──► DemuxTable::lookup(port) ──► routes of that port only,
//!     most specific first ──► DemuxSpec::matches ──► the channel's bounded FIFO (FifoCharge)
//! ```
//!
//! Invariants:
//! - A spec is a checked value: every field is within its bound
//!   ([`MAX_PREFIX`], [`MAX_KEYS`], [`MAX_KEY_LEN`], [`MAX_KEY_END`],
//!   [`MAX_BUFFER`]), a source prefix has no host bits, and the bytes it
//!   was parsed from had nothing after it. [`DemuxSpec::emit`] writes the
//!   same bytes back.
//! - A lookup touches only the routes of the packet's port: its cost does
//!   not depend on the channels other ports (other sessions) hold.
//! - A channel's FIFO holds at most its spec's buffer of payload bytes;
//!   what a queued packet holds is given back when its job is dropped
//!   (run, refused, or discarded), by [`FifoCharge`]'s `Drop`.
//! - A channel with sub-flow keys shares its FIFO among its sub-flows
//!   (stochastic fairness, as Linux's SFQ): each sub-flow hashes, with a
//!   key chosen at random per channel, into one of [`SUBFLOW_BUCKETS`]
//!   buckets; a bucket that holds bytes may hold at most `buffer / (n + 1)`
//!   where `n` is the number of buckets holding bytes, so there is always
//!   room for a sub-flow that holds none, and one sub-flow's flood cannot
//!   take the FIFO from the others.
//!
//! The byte format is in docs/channels.md.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::ModuleId;

/// The one version of the spec format.
pub const SPEC_VERSION: u8 = 1;
/// Flag: a source-address prefix follows the fixed header.
pub const FLAG_SOURCE: u8 = 0x01;
/// Flag: the source prefix is the one the module's credential grants for
/// the port (resolved by the node when the channel opens; nothing follows
/// the fixed header for it). Not with [`FLAG_SOURCE`].
pub const FLAG_SOURCE_GRANTED: u8 = 0x02;
/// Longest payload prefix a spec may match on.
pub const MAX_PREFIX: usize = 64;
/// Most sub-flow keys.
pub const MAX_KEYS: usize = 4;
/// Longest payload key field.
pub const MAX_KEY_LEN: u8 = 16;
/// A payload key field must end within this many bytes of the payload.
pub const MAX_KEY_END: usize = 1500;
/// Largest FIFO a channel may ask for, bytes.
pub const MAX_BUFFER: u32 = 16 << 20;
/// The FIFO of a channel that asks for none (buffer 0), and of channels
/// opened with the old `net.open_channel`, bytes.
pub const DEFAULT_BUFFER: u32 = 64 << 10;
/// Key kind: the packet's source address.
pub const KEY_SOURCE: u8 = 1;
/// Key kind: payload bytes at an offset.
pub const KEY_PAYLOAD: u8 = 2;
/// Buckets a keyed channel's FIFO is shared among (its sub-flows hash
/// into them with a per-channel random key).
pub const SUBFLOW_BUCKETS: usize = 1024;
/// Host memory of a keyed channel's share table, bytes (charged to its
/// session's heap with the channel's handle).
pub const SHARE_TABLE_BYTES: usize = SUBFLOW_BUCKETS * 4;
/// Bytes of the fixed header (version, flags, port, buffer).
pub const FIXED_LEN: usize = 8;
/// Longest valid spec, bytes (`net.open_channel_spec` reads no more).
pub const MAX_SPEC_LEN: usize = FIXED_LEN + 5 + 1 + MAX_PREFIX + 1 + MAX_KEYS * 4;

/// Why spec bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The bytes end before the spec does.
    #[error("demux spec truncated")]
    Truncated,
    /// An unknown format version.
    #[error("demux spec version {0} (expected {SPEC_VERSION})")]
    Version(u8),
    /// Flag bits this version does not define.
    #[error("demux spec has unknown flags {0:#04x}")]
    Flags(u8),
    /// A source prefix longer than 32 bits.
    #[error("source prefix length {0} > 32")]
    SourceLen(u8),
    /// A source prefix with bits set past its length.
    #[error("source prefix {0}/{1} has host bits set")]
    SourceHostBits(Ipv4Addr, u8),
    /// A payload prefix longer than [`MAX_PREFIX`].
    #[error("payload prefix of {0} bytes > {MAX_PREFIX}")]
    PrefixTooLong(usize),
    /// More sub-flow keys than [`MAX_KEYS`].
    #[error("{0} sub-flow keys > {MAX_KEYS}")]
    TooManyKeys(u8),
    /// An unknown key kind.
    #[error("unknown sub-flow key kind {0}")]
    KeyKind(u8),
    /// A payload key of 0 bytes or more than [`MAX_KEY_LEN`].
    #[error("payload key length {0} not in 1..={MAX_KEY_LEN}")]
    KeyLen(u8),
    /// A payload key that ends past [`MAX_KEY_END`].
    #[error("payload key at {offset}+{len} ends past {MAX_KEY_END}")]
    KeyEnd {
        /// Its offset.
        offset: u16,
        /// Its length.
        len: u8,
    },
    /// A FIFO larger than [`MAX_BUFFER`].
    #[error("buffer of {0} bytes > {MAX_BUFFER}")]
    Buffer(u32),
    /// Bytes after the spec.
    #[error("{0} bytes after the demux spec")]
    Trailing(usize),
}

/// An IPv4 source prefix: `addr/len` with no host bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourcePrefix {
    addr: Ipv4Addr,
    len: u8,
}

impl SourcePrefix {
    /// A checked prefix.
    pub fn new(addr: Ipv4Addr, len: u8) -> Result<SourcePrefix, SpecError> {
        if len > 32 {
            return Err(SpecError::SourceLen(len));
        }
        if u32::from(addr) & !mask(len) != 0 {
            return Err(SpecError::SourceHostBits(addr, len));
        }
        Ok(SourcePrefix { addr, len })
    }

    /// Its address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// Its length, bits.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// Whether it is `0.0.0.0/0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `a` is within it.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & mask(self.len) == u32::from(self.addr)
    }

    /// Whether every address of `other` is within it.
    pub fn covers(&self, other: &SourcePrefix) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) }
}

/// A sub-flow key field (the paper's step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubKey {
    /// The packet's source address.
    Source,
    /// `len` payload bytes at `offset`.
    Payload {
        /// Offset in the payload.
        offset: u16,
        /// Length, 1..=[`MAX_KEY_LEN`].
        len: u8,
    },
}

/// A channel's demultiplexing specification, checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DemuxSpec {
    /// The port.
    pub port: u16,
    /// Only packets from this source prefix (`None`: any source).
    pub source: Option<SourcePrefix>,
    /// The source prefix is to be the one the module's credential grants
    /// for the port ([`FLAG_SOURCE_GRANTED`]); `source` is then `None`
    /// until the node resolves it.
    pub source_granted: bool,
    /// Only payloads starting with these bytes.
    pub prefix: Vec<u8>,
    /// Sub-flow keys: a packet whose payload is too short for one is
    /// malformed for this channel.
    pub keys: Vec<SubKey>,
    /// FIFO size asked for, bytes (0: [`DEFAULT_BUFFER`]).
    pub buffer: u32,
}

/// Reads from a byte slice, each read checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SpecError> {
        let end = self.at.checked_add(n).ok_or(SpecError::Truncated)?;
        let s = self.b.get(self.at..end).ok_or(SpecError::Truncated)?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, SpecError> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }
    fn u16(&mut self) -> Result<u16, SpecError> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, SpecError> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
}

impl DemuxSpec {
    /// A spec for the old `net.open_channel(port, prefix)`: any source, no
    /// keys, the default buffer.
    pub fn port_prefix(port: u16, prefix: Vec<u8>) -> Result<DemuxSpec, SpecError> {
        if prefix.len() > MAX_PREFIX {
            return Err(SpecError::PrefixTooLong(prefix.len()));
        }
        Ok(DemuxSpec { port, source: None, source_granted: false, prefix, keys: Vec::new(), buffer: 0 })
    }

    /// Parses the bytes a module passes to `net.open_channel_spec`
    /// (docs/channels.md).
    pub fn parse(bytes: &[u8]) -> Result<DemuxSpec, SpecError> {
        let mut r = Reader { b: bytes, at: 0 };
        let version = r.u8()?;
        if version != SPEC_VERSION {
            return Err(SpecError::Version(version));
        }
        let flags = r.u8()?;
        if flags & !(FLAG_SOURCE | FLAG_SOURCE_GRANTED) != 0 || flags == FLAG_SOURCE | FLAG_SOURCE_GRANTED {
            return Err(SpecError::Flags(flags));
        }
        let source_granted = flags & FLAG_SOURCE_GRANTED != 0;
        let port = r.u16()?;
        let buffer = r.u32()?;
        if buffer > MAX_BUFFER {
            return Err(SpecError::Buffer(buffer));
        }
        let source = if flags & FLAG_SOURCE != 0 {
            let a = r.take(4)?;
            let addr = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            Some(SourcePrefix::new(addr, r.u8()?)?)
        } else {
            None
        };
        let plen = usize::from(r.u8()?);
        if plen > MAX_PREFIX {
            return Err(SpecError::PrefixTooLong(plen));
        }
        let prefix = r.take(plen)?.to_vec();
        let nkeys = r.u8()?;
        if usize::from(nkeys) > MAX_KEYS {
            return Err(SpecError::TooManyKeys(nkeys));
        }
        let mut keys = Vec::with_capacity(usize::from(nkeys));
        for _ in 0..nkeys {
            keys.push(match r.u8()? {
                KEY_SOURCE => SubKey::Source,
                KEY_PAYLOAD => {
                    let offset = r.u16()?;
                    let len = r.u8()?;
                    if len == 0 || len > MAX_KEY_LEN {
                        return Err(SpecError::KeyLen(len));
                    }
                    if usize::from(offset) + usize::from(len) > MAX_KEY_END {
                        return Err(SpecError::KeyEnd { offset, len });
                    }
                    SubKey::Payload { offset, len }
                }
                k => return Err(SpecError::KeyKind(k)),
            });
        }
        let rest = bytes.len() - r.at;
        if rest != 0 {
            return Err(SpecError::Trailing(rest));
        }
        Ok(DemuxSpec { port, source, source_granted, prefix, keys, buffer })
    }

    /// Writes the spec in the format [`DemuxSpec::parse`] reads.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(SPEC_VERSION);
        out.push(if self.source.is_some() {
            FLAG_SOURCE
        } else if self.source_granted {
            FLAG_SOURCE_GRANTED
        } else {
            0
        });
        out.extend_from_slice(&self.port.to_be_bytes());
        out.extend_from_slice(&self.buffer.to_be_bytes());
        if let Some(s) = self.source {
            out.extend_from_slice(&s.addr.octets());
            out.push(s.len);
        }
        out.push(self.prefix.len().min(MAX_PREFIX) as u8);
        out.extend_from_slice(self.prefix.get(..self.prefix.len().min(MAX_PREFIX)).unwrap_or(&[]));
        out.push(self.keys.len().min(MAX_KEYS) as u8);
        for k in self.keys.iter().take(MAX_KEYS) {
            match *k {
                SubKey::Source => out.push(KEY_SOURCE),
                SubKey::Payload { offset, len } => {
                    out.push(KEY_PAYLOAD);
                    out.extend_from_slice(&offset.to_be_bytes());
                    out.push(len);
                }
            }
        }
    }

    /// The FIFO size this channel gets, bytes.
    pub fn buffer_bytes(&self) -> usize {
        if self.buffer == 0 { DEFAULT_BUFFER as usize } else { self.buffer as usize }
    }

    /// Whether the filter (source prefix, payload prefix) takes a packet
    /// from `source` with `payload` (its port is the table's business).
    pub fn matches(&self, source: Ipv4Addr, payload: &[u8]) -> bool {
        self.source.is_none_or(|s| s.contains(source)) && payload.starts_with(&self.prefix)
    }

    /// The sub-flow a packet belongs to: a hash of its key fields keyed by
    /// `keyer` (a channel's [`Route`] holds a random one, so that a sender
    /// cannot choose key fields that fall in another sub-flow's bucket); 0
    /// without keys; `None` if the payload is too short for a key (the
    /// packet is malformed for this channel). The key fields have fixed
    /// lengths, so their concatenation is unambiguous.
    pub fn subflow(&self, keyer: &impl BuildHasher, source: Ipv4Addr, payload: &[u8]) -> Option<u64> {
        if self.keys.is_empty() {
            return Some(0);
        }
        let mut h = keyer.build_hasher();
        for k in &self.keys {
            match *k {
                SubKey::Source => h.write(&source.octets()),
                SubKey::Payload { offset, len } => {
                    let o = usize::from(offset);
                    h.write(payload.get(o..o + usize::from(len))?);
                }
            }
        }
        // 0 means "no keys" to a module; a keyed sub-flow is never 0.
        Some(h.finish().max(1))
    }

    /// How specific the filter is, for ordering a port's routes (most
    /// specific first): source prefix length, then payload prefix length.
    fn specificity(&self) -> (u8, usize) {
        (self.source.map_or(0, |s| s.len), self.prefix.len())
    }
}

/// A channel's counters and FIFO occupancy, shared by its route and the
/// jobs queued for it.
#[derive(Debug, Default)]
pub struct ChannelStats {
    delivered: AtomicU64,
    bytes: AtomicU64,
    dropped_full: AtomicU64,
    dropped_share: AtomicU64,
    dropped_rate: AtomicU64,
    dropped_malformed: AtomicU64,
    queued_bytes: AtomicU64,
    queued_packets: AtomicU64,
    shares: Option<Shares>,
}

/// A keyed channel's FIFO bytes per sub-flow bucket.
#[derive(Debug)]
struct Shares {
    /// Payload bytes queued per bucket (a FIFO holds at most 16 MiB plus a
    /// packet: a `u32` holds it).
    held: Box<[AtomicU32]>,
    /// Buckets holding bytes now.
    active: AtomicU32,
}

impl Shares {
    fn new() -> Shares {
        Shares { held: (0..SUBFLOW_BUCKETS).map(|_| AtomicU32::new(0)).collect(), active: AtomicU32::new(0) }
    }

    fn bucket(&self, subflow: u64) -> Option<&AtomicU32> {
        self.held.get((subflow % SUBFLOW_BUCKETS as u64) as usize)
    }

    fn give_back(&self, subflow: u64, len: u32) {
        if let Some(b) = self.bucket(subflow)
            && b.fetch_sub(len, Ordering::Relaxed) == len
        {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A snapshot of one channel, for `anode status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelInfo {
    /// The module that opened it.
    pub module: u32,
    /// Its handle in that module.
    pub handle: i32,
    /// Its port.
    pub port: u16,
    /// Its source prefix (`a.b.c.d/n`), if any.
    pub source: Option<String>,
    /// Its payload prefix length, bytes.
    pub prefix_len: usize,
    /// Its sub-flow keys.
    pub keys: usize,
    /// The index of its session's VP that processes it.
    pub vp: u8,
    /// Its FIFO size, bytes.
    pub buffer: usize,
    /// Payload bytes queued now.
    pub queued_bytes: u64,
    /// Packets queued now.
    pub queued_packets: u64,
    /// Packets accepted into its FIFO.
    pub delivered: u64,
    /// Payload bytes accepted into its FIFO.
    pub bytes: u64,
    /// Packets dropped because its FIFO was full.
    pub dropped_full: u64,
    /// Packets dropped because their sub-flow held its share of the FIFO
    /// (keyed channels only).
    pub dropped_share: u64,
    /// Sub-flow buckets holding bytes now (keyed channels only).
    pub active_subflows: u32,
    /// Packets dropped over its session's receive reservation.
    pub dropped_rate: u64,
    /// Packets too short for its sub-flow keys.
    pub dropped_malformed: u64,
}

/// What a queued packet holds of its channel's FIFO; given back on drop.
/// A clone holds nothing; charges do not make jobs different.
#[derive(Debug, Default)]
pub struct FifoCharge {
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    stats: Arc<ChannelStats>,
    bytes: u64,
    subflow: u64,
}

impl Clone for FifoCharge {
    fn clone(&self) -> Self {
        FifoCharge::default()
    }
}

impl PartialEq for FifoCharge {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FifoCharge {}

impl FifoCharge {
    /// Payload bytes held.
    pub fn bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, |h| h.bytes)
    }
}

impl Drop for FifoCharge {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            let s = &h.stats;
            s.queued_bytes.fetch_sub(h.bytes, Ordering::Relaxed);
            s.queued_packets.fetch_sub(1, Ordering::Relaxed);
            if let Some(sh) = &s.shares {
                sh.give_back(h.subflow, h.bytes as u32);
            }
        }
    }
}

/// Why a packet that matched a channel's filter was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its FIFO was full.
    Full,
    /// Its sub-flow held its share of the FIFO.
    Share,
    /// Over its session's receive reservation.
    Rate,
    /// Too short for its sub-flow keys.
    Malformed,
}

/// What early demultiplexing did with one packet ([`Sandbox::demux_into`](crate::Sandbox::demux_into)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemuxOutcome {
    /// Channels whose filter matched.
    pub matched: usize,
    /// Jobs queued (one per channel that had room).
    pub queued: usize,
    /// Channels whose FIFO (or session heap) was full, or whose share of
    /// it the packet's sub-flow held.
    pub full: usize,
    /// Channels for which it was too short for a sub-flow key.
    pub malformed: usize,
    /// Channels whose session was over its receive reservation.
    pub rate: usize,
}

/// One open channel in the table.
#[derive(Debug)]
pub struct Route {
    /// The checked spec.
    pub spec: DemuxSpec,
    /// The module that opened it.
    pub module: ModuleId,
    /// Its handle.
    pub handle: i32,
    /// The index of its session's VP that processes it.
    pub vp: u8,
    stats: Arc<ChannelStats>,
    keyer: RandomState,
}

impl Route {
    /// A route for a channel just opened (a keyed one with its share table
    /// and a fresh random hash key).
    pub fn new(spec: DemuxSpec, module: ModuleId, handle: i32, vp: u8) -> Route {
        let stats = ChannelStats { shares: (!spec.keys.is_empty()).then(Shares::new), ..ChannelStats::default() };
        Route { spec, module, handle, vp, stats: Arc::new(stats), keyer: RandomState::new() }
    }

    /// The sub-flow of a packet on this channel ([`DemuxSpec::subflow`]
    /// with this channel's key).
    pub fn subflow(&self, source: Ipv4Addr, payload: &[u8]) -> Option<u64> {
        self.spec.subflow(&self.keyer, source, payload)
    }

    /// Takes room for a packet in the FIFO, returning it with the packet's
    /// sub-flow, or says why not (counted against this channel only). On
    /// a keyed channel a sub-flow that holds bytes may hold at most
    /// `buffer / (n + 1)`, `n` the sub-flows (buckets) holding bytes with
    /// it; one that holds none is taken whenever the FIFO has room.
    pub fn admit(&self, source: Ipv4Addr, payload: &[u8]) -> Result<(FifoCharge, u64), Refusal> {
        let s = &self.stats;
        let Some(subflow) = self.subflow(source, payload) else {
            s.dropped_malformed.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Malformed);
        };
        let len = payload.len() as u64;
        let cap = self.spec.buffer_bytes() as u64;
        // One thread demultiplexes (the node's, under its lock); the jobs
        // that give bytes back only lower what is held, so a load-then-add
        // cannot overshoot.
        if s.queued_bytes.load(Ordering::Relaxed).saturating_add(len) > cap {
            s.dropped_full.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::Full);
        }
        if let Some(sh) = &s.shares
            && let Some(b) = sh.bucket(subflow)
        {
            let held = u64::from(b.load(Ordering::Relaxed));
            if held > 0 {
                let n = u64::from(sh.active.load(Ordering::Relaxed)).max(1);
                if held + len > cap / (n + 1) {
                    s.dropped_share.fetch_add(1, Ordering::Relaxed);
                    return Err(Refusal::Share);
                }
            }
            // len <= cap <= MAX_BUFFER: it fits a u32.
            if b.fetch_add(len as u32, Ordering::Relaxed) == 0 {
                sh.active.fetch_add(1, Ordering::Relaxed);
            }
        }
        s.queued_bytes.fetch_add(len, Ordering::Relaxed);
        s.queued_packets.fetch_add(1, Ordering::Relaxed);
        s.delivered.fetch_add(1, Ordering::Relaxed);
        s.bytes.fetch_add(len, Ordering::Relaxed);
        Ok((FifoCharge { held: Some(Held { stats: s.clone(), bytes: len, subflow }) }, subflow))
    }

    /// Counts a packet dropped over its session's receive reservation.
    pub fn count_rate_drop(&self) {
        self.stats.dropped_rate.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a packet dropped because its session's heap had no room for
    /// it (the session's buffering is the sum of its channels' FIFOs).
    pub fn count_full(&self) {
        self.stats.dropped_full.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot for `anode status`.
    pub fn info(&self) -> ChannelInfo {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChannelInfo {
            module: self.module.0,
            handle: self.handle,
            port: self.spec.port,
            source: self.spec.source.map(|p| format!("{}/{}", p.addr, p.len)),
            prefix_len: self.spec.prefix.len(),
            keys: self.spec.keys.len(),
            vp: self.vp,
            buffer: self.spec.buffer_bytes(),
            queued_bytes: g(&s.queued_bytes),
            queued_packets: g(&s.queued_packets),
            delivered: g(&s.delivered),
            bytes: g(&s.bytes),
            dropped_full: g(&s.dropped_full),
            dropped_share: g(&s.dropped_share),
            active_subflows: s.shares.as_ref().map_or(0, |sh| sh.active.load(Ordering::Relaxed)),
            dropped_rate: g(&s.dropped_rate),
            dropped_malformed: g(&s.dropped_malformed),
        }
    }
}

/// One port's routes: those with a source prefix, by prefix length
/// (longest first) and then by masked address, and those without (any
/// source).
#[derive(Debug, Default)]
struct PortRoutes {
    by_len: Vec<(u8, HashMap<u32, Vec<Route>>)>,
    any: Vec<Route>,
}

impl PortRoutes {
    fn is_empty(&self) -> bool {
        self.by_len.is_empty() && self.any.is_empty()
    }
}

/// Inserts `r` after the routes of `v` at least as specific.
fn insert_sorted(v: &mut Vec<Route>, r: Route) {
    let key = r.spec.specificity();
    let at = v.iter().position(|o| o.spec.specificity() < key).unwrap_or(v.len());
    v.insert(at, r);
}

/// The node's open channels by port. Within a port, routes with a source
/// prefix are found by one hash lookup per distinct prefix length (at most
/// 33), longest first, then the port's any-source routes: a lookup's cost
/// depends on the routes that could match the packet, not on how many
/// channels other ports, or other source prefixes of the same port, hold.
#[derive(Debug, Default)]
pub struct DemuxTable {
    by_port: HashMap<u16, PortRoutes>,
    len: usize,
}

impl DemuxTable {
    /// An empty table.
    pub fn new() -> DemuxTable {
        DemuxTable::default()
    }

    /// Channels open.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no channel is open.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a channel.
    pub fn insert(&mut self, r: Route) {
        let p = self.by_port.entry(r.spec.port).or_default();
        match r.spec.source {
            None => insert_sorted(&mut p.any, r),
            Some(src) => {
                let at = match p.by_len.iter().position(|(l, _)| *l <= src.len()) {
                    Some(i) if p.by_len.get(i).is_some_and(|(l, _)| *l == src.len()) => i,
                    Some(i) => {
                        p.by_len.insert(i, (src.len(), HashMap::new()));
                        i
                    }
                    None => {
                        p.by_len.push((src.len(), HashMap::new()));
                        p.by_len.len() - 1
                    }
                };
                if let Some((_, m)) = p.by_len.get_mut(at) {
                    insert_sorted(m.entry(u32::from(src.addr())).or_default(), r);
                }
            }
        }
        self.len += 1;
    }

    /// Removes the channels for which `gone` is true.
    pub fn remove_where(&mut self, mut gone: impl FnMut(&Route) -> bool) {
        let mut n = 0;
        self.by_port.retain(|_, p| {
            p.any.retain(|r| !gone(r));
            n += p.any.len();
            p.by_len.retain_mut(|(_, m)| {
                m.retain(|_, v| {
                    v.retain(|r| !gone(r));
                    n += v.len();
                    !v.is_empty()
                });
                !m.is_empty()
            });
            !p.is_empty()
        });
        self.len = n;
    }

    /// Removes `module`'s channel `handle`.
    pub fn remove(&mut self, module: ModuleId, handle: i32) {
        self.remove_where(|r| r.module == module && r.handle == handle);
    }

    /// Removes every channel of `module`.
    pub fn remove_module(&mut self, module: ModuleId) {
        self.remove_where(|r| r.module == module);
    }

    /// The channels whose filter takes a packet for `port` from `source`
    /// with `payload`: longest source prefix first, any-source last.
    pub fn lookup<'a>(
        &'a self,
        port: u16,
        source: Ipv4Addr,
        payload: &'a [u8],
    ) -> impl Iterator<Item = &'a Route> + 'a {
        let p = self.by_port.get(&port);
        let a = u32::from(source);
        let prefixed =
            p.into_iter().flat_map(|p| p.by_len.iter()).filter_map(move |(len, m)| m.get(&(a & mask(*len)))).flatten();
        let any = p.into_iter().flat_map(|p| p.any.iter());
        prefixed.chain(any).filter(move |r| r.spec.matches(source, payload))
    }

    /// Every channel, for `anode status`.
    pub fn iter(&self) -> impl Iterator<Item = &Route> {
        self.by_port.values().flat_map(|p| p.by_len.iter().flat_map(|(_, m)| m.values().flatten()).chain(p.any.iter()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec() -> DemuxSpec {
        DemuxSpec {
            port: 5000,
            source: Some(SourcePrefix::new(Ipv4Addr::new(10, 0, 1, 0), 24).unwrap()),
            source_granted: false,
            prefix: b"ab".to_vec(),
            keys: vec![SubKey::Source, SubKey::Payload { offset: 2, len: 4 }],
            buffer: 3000,
        }
    }

    fn bytes(s: &DemuxSpec) -> Vec<u8> {
        let mut v = Vec::new();
        s.emit(&mut v);
        v
    }

    #[test]
    fn round_trip() {
        let s = spec();
        assert_eq!(DemuxSpec::parse(&bytes(&s)), Ok(s));
        let plain = DemuxSpec::port_prefix(7, vec![]).unwrap();
        assert_eq!(bytes(&plain), [1, 0, 0, 7, 0, 0, 0, 0, 0, 0]);
        assert_eq!(DemuxSpec::parse(&bytes(&plain)), Ok(plain));
        let granted = DemuxSpec { source: None, source_granted: true, ..spec() };
        assert_eq!(bytes(&granted)[1], FLAG_SOURCE_GRANTED);
        assert_eq!(DemuxSpec::parse(&bytes(&granted)), Ok(granted));
    }

    #[test]
    fn every_truncation_is_refused() {
        let b = bytes(&spec());
        for n in 0..b.len() {
            assert_eq!(DemuxSpec::parse(&b[..n]), Err(SpecError::Truncated), "at {n}");
        }
    }

    #[test]
    fn rejections() {
        let base = bytes(&spec());
        let with = |i: usize, v: u8| {
            let mut b = base.clone();
            b[i] = v;
            DemuxSpec::parse(&b)
        };
        assert_eq!(with(0, 2), Err(SpecError::Version(2)));
        assert_eq!(with(1, 0x03), Err(SpecError::Flags(0x03)), "an explicit and a granted source");
        assert_eq!(with(1, 0x05), Err(SpecError::Flags(0x05)));
        assert_eq!(with(12, 33), Err(SpecError::SourceLen(33)));
        assert_eq!(with(11, 1), Err(SpecError::SourceHostBits(Ipv4Addr::new(10, 0, 1, 1), 24)));
        // buffer 0x01000001 > MAX_BUFFER
        assert_eq!(with(4, 1).map(|_| ()).unwrap_err(), SpecError::Buffer((1 << 24) | 3000));
        let mut b = base.clone();
        b.push(0);
        assert_eq!(DemuxSpec::parse(&b), Err(SpecError::Trailing(1)));
        // prefix length at 13, keys count at 16, first key kind at 17, second at 18.
        assert_eq!(with(13, 65), Err(SpecError::PrefixTooLong(65)));
        assert_eq!(with(16, 5), Err(SpecError::TooManyKeys(5)));
        assert_eq!(with(17, 9), Err(SpecError::KeyKind(9)));
        assert_eq!(with(21, 0), Err(SpecError::KeyLen(0)));
        assert_eq!(with(21, 17), Err(SpecError::KeyLen(17)));
        let mut b = base.clone();
        b[19..21].copy_from_slice(&1497u16.to_be_bytes());
        assert_eq!(DemuxSpec::parse(&b), Err(SpecError::KeyEnd { offset: 1497, len: 4 }));
        assert_eq!(DemuxSpec::port_prefix(1, vec![0; 65]), Err(SpecError::PrefixTooLong(65)));
    }

    #[test]
    fn matching_and_subflows() {
        let s = spec();
        let a = Ipv4Addr::new(10, 0, 1, 9);
        assert!(s.matches(a, b"abcdef"));
        assert!(!s.matches(Ipv4Addr::new(10, 0, 2, 9), b"abcdef"));
        assert!(!s.matches(a, b"xbcdef"));
        let k = RandomState::new();
        assert_eq!(s.subflow(&k, a, b"abcde"), None);
        assert_ne!(s.subflow(&k, a, b"abcdef"), s.subflow(&k, a, b"abcdeg"));
        assert_eq!(s.subflow(&k, a, b"abcdefXX"), s.subflow(&k, a, b"abcdefYY"));
        assert_ne!(s.subflow(&k, a, b"abcdef"), s.subflow(&k, Ipv4Addr::new(10, 0, 1, 8), b"abcdef"));
        assert_eq!(DemuxSpec { keys: vec![], ..s }.subflow(&k, a, b"abcdef"), Some(0));
    }

    #[test]
    fn fifo_is_bounded_and_given_back() {
        let r = Route::new(DemuxSpec { keys: vec![], ..spec() }, ModuleId(1), 3, 0);
        let a = Ipv4Addr::new(10, 0, 1, 9);
        let p = [b'a'; 1000];
        let held: Vec<FifoCharge> = (0..3).map(|_| r.admit(a, &p).unwrap().0).collect();
        assert_eq!(r.admit(a, &p).unwrap_err(), Refusal::Full);
        let i = r.info();
        assert_eq!((i.delivered, i.dropped_full, i.queued_bytes), (3, 1, 3000));
        drop(held);
        assert_eq!(r.info().queued_bytes, 0);
        assert!(r.admit(a, &p).is_ok());
        let keyed = Route::new(spec(), ModuleId(1), 4, 0);
        assert_eq!(keyed.admit(a, b"abcde").unwrap_err(), Refusal::Malformed);
        assert_eq!(keyed.info().dropped_malformed, 1);
    }

    /// Payload `ab` then a 4-byte sub-flow key `k`, `len` bytes in all.
    fn keyed_payload(k: u32, len: usize) -> Vec<u8> {
        let mut p = b"ab".to_vec();
        p.extend_from_slice(&k.to_be_bytes());
        p.resize(len, 0);
        p
    }

    /// A sub-flow key whose bucket on `r` differs from key `k`'s (buckets
    /// come from a random hash key: two keys share one with odds 1/1024);
    /// `k + 1` on a channel without keys.
    fn other_bucket(r: &Route, k: u32) -> u32 {
        if r.spec.keys.is_empty() {
            return k + 1;
        }
        let a = Ipv4Addr::new(10, 0, 1, 9);
        let bucket = |k: u32| r.subflow(a, &keyed_payload(k, 8)).unwrap() % SUBFLOW_BUCKETS as u64;
        (k + 1..).find(|o| bucket(*o) != bucket(k)).unwrap()
    }

    #[test]
    fn a_flooding_subflow_cannot_take_the_fifo_from_the_others() {
        // 10,000 bytes of FIFO keyed on payload bytes 2..6; a flood of
        // sub-flow 1 beside sub-flow 2 sending one packet in 20, and the
        // channel's VP serving 5 packets (oldest first) per round, well
        // more than sub-flow 2 sends.
        let s = DemuxSpec { keys: vec![SubKey::Payload { offset: 2, len: 4 }], buffer: 10_000, ..spec() };
        let run = |s: DemuxSpec| {
            let r = Route::new(s, ModuleId(1), 3, 0);
            let a = Ipv4Addr::new(10, 0, 1, 9);
            let (flood, steady) = (keyed_payload(1, 100), keyed_payload(other_bucket(&r, 1), 100));
            let mut fifo = std::collections::VecDeque::new();
            let (mut lost, mut sent) = (0, 0);
            for _ in 0..200 {
                for i in 0..20 {
                    let steady_turn = i == 10;
                    let p = if steady_turn { &steady } else { &flood };
                    match r.admit(a, p) {
                        Ok((c, _)) => fifo.push_back(c),
                        Err(_) if steady_turn => lost += 1,
                        Err(_) => {}
                    }
                    sent += u32::from(steady_turn);
                }
                for _ in 0..5 {
                    fifo.pop_front();
                }
            }
            (lost, sent, r.info())
        };
        let (lost, sent, i) = run(s.clone());
        assert_eq!((lost, sent), (0, 200), "the steady sub-flow loses nothing");
        assert!(i.dropped_share > 0 && i.dropped_full == 0, "{i:?}");
        assert!(i.queued_bytes <= 10_000);
        // Without keys the flood fills the FIFO and the steady flow loses.
        let (lost, _, i) = run(DemuxSpec { keys: vec![], ..s });
        assert!(lost > 100 && i.dropped_full > 0 && i.dropped_share == 0, "{lost} {i:?}");
    }

    #[test]
    fn shares_are_given_back_and_a_new_subflow_always_has_room() {
        let s = DemuxSpec { keys: vec![SubKey::Payload { offset: 2, len: 4 }], buffer: 3000, ..spec() };
        let r = Route::new(s, ModuleId(1), 3, 0);
        let a = Ipv4Addr::new(10, 0, 1, 9);
        // One sub-flow alone may hold half the FIFO (and always one packet).
        let one: Vec<FifoCharge> =
            (0..3).filter_map(|_| r.admit(a, &keyed_payload(1, 700)).ok().map(|c| c.0)).collect();
        assert_eq!(one.len(), 2);
        assert_eq!(r.info().active_subflows, 1);
        // A second sub-flow finds room although the first is at its share.
        let two = r.admit(a, &keyed_payload(other_bucket(&r, 1), 700)).unwrap().0;
        assert_eq!(r.info().active_subflows, 2);
        drop(one);
        assert_eq!(r.info().active_subflows, 1);
        drop(two);
        let i = r.info();
        assert_eq!((i.active_subflows, i.queued_bytes, i.queued_packets, i.dropped_share), (0, 0, 0, 1));
        // A packet larger than a share is taken when its sub-flow holds nothing.
        assert!(r.admit(a, &keyed_payload(1, 2900)).is_ok());
    }

    #[test]
    fn table_looks_at_one_port_most_specific_first() {
        let mut t = DemuxTable::new();
        let a = Ipv4Addr::new(10, 0, 1, 9);
        t.insert(Route::new(DemuxSpec::port_prefix(5000, vec![]).unwrap(), ModuleId(1), 1, 0));
        t.insert(Route::new(spec(), ModuleId(2), 1, 0));
        t.insert(Route::new(DemuxSpec::port_prefix(5001, vec![]).unwrap(), ModuleId(3), 1, 0));
        t.insert(Route::new(
            DemuxSpec {
                source: Some(SourcePrefix::new(Ipv4Addr::new(10, 0, 1, 9), 32).unwrap()),
                ..DemuxSpec::port_prefix(5000, vec![]).unwrap()
            },
            ModuleId(4),
            1,
            0,
        ));
        t.insert(Route::new(
            DemuxSpec {
                source: Some(SourcePrefix::new(Ipv4Addr::new(10, 0, 2, 0), 24).unwrap()),
                ..DemuxSpec::port_prefix(5000, vec![]).unwrap()
            },
            ModuleId(5),
            1,
            0,
        ));
        assert_eq!(t.len(), 5);
        let m: Vec<u32> = t.lookup(5000, a, b"abcdef").map(|r| r.module.0).collect();
        assert_eq!(m, [4, 2, 1], "longest source prefix first, any source last");
        assert_eq!(t.iter().count(), 5);
        t.remove_module(ModuleId(4));
        t.remove_module(ModuleId(5));
        assert_eq!(t.lookup(5000, Ipv4Addr::new(1, 1, 1, 1), b"abcdef").count(), 1);
        t.remove_module(ModuleId(2));
        assert_eq!(t.len(), 2);
        t.remove(ModuleId(3), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(5001, a, b"").count(), 0);
    }
}
