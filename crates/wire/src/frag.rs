//! Fragmentation and reassembly of datagrams larger than a link's MTU
//! (issue 19, "Real MTUs"), sans-I/O.
//!
//! A node that must send a datagram (an ANEP frame, usually already sealed
//! for its next hop) longer than the link's MTU sends it as fragments: ANEP
//! frames of type [`TYPE_FRAGMENT`], each carrying one piece of the
//! original bytes. The next hop puts the pieces back together with a
//! [`Reassembler`] and handles the whole datagram as if it had arrived in
//! one piece. Fragmentation is hop by hop, below the security layer: the
//! pieces of a sealed datagram are not authenticated one by one, the whole
//! is, once it is reassembled.
//!
//! # Wire format
//!
//! The payload of an ANEP frame of type [`TYPE_FRAGMENT`] (all big-endian):
//!
//! ```text
//!  0        1        2                 4                                   8
//! +--------+--------+-----------------+-----------------------------------+
//! | ver=1  | flags=0|  reserved = 0   |           datagram id             |
//! +--------+--------+-----------------+-----------------------------------+
//! |      offset     |   total length  |  data (at least 1 byte) ...        |
//! +-----------------+-----------------+------------------------------------+
//! ```
//!
//! `datagram id` is chosen by the sender (a counter) and names the set of
//! fragments of one datagram from one sender; `offset` is where `data`
//! starts in the original datagram; `total length` is the original's length
//! (1..=65,535 bytes, and the same in every fragment of the set); `offset +
//! data length ≤ total length`. A set has at most [`MAX_FRAGMENTS`] pieces.
//!
//! # Reassembly policy (a hardened IP stack's)
//!
//! Fragments must arrive in order, first to last, with no gap, overlap or
//! repeat. Any departure drops the whole set, counted by its reason, and
//! frees its memory at once: a duplicate (bytes already received, the same
//! again), an overlap (a piece that would rewrite or run past bytes already
//! received with other bytes), out of order (a piece
//! past the next expected byte, or one that starts a set anywhere but at
//! offset 0), a total that changes within a set, an oversized datagram
//! (above [`Limits::max_datagram`]). A set never completed is dropped after
//! [`Limits::timeout_ms`] ([`Reassembler::expire`]). Memory is reserved for
//! the whole datagram when its first piece arrives and is bounded per
//! source ([`Limits::per_source_bytes`], [`Limits::sets_per_source`]) and in
//! total ([`Limits::total_bytes`], [`Limits::max_sets`]); a set that does
//! not fit is refused (`no_room`), and the sets already held keep their
//! room, so a flood from one source cannot evict another's datagrams. Over
//! one link, in-order delivery is the normal case (veth, loopback, one
//! Ethernet hop); the strictness costs a retransmission only where the
//! network reorders, and makes every set cost at most one buffer and O(1)
//! work per piece.

use std::collections::HashMap;
use std::hash::Hash;

use crate::anep;

/// ANEP type id of a fragment.
pub const TYPE_FRAGMENT: u16 = 0xA00F;
/// Length of the fragment header (after the ANEP header).
pub const HEADER_LEN: usize = 12;
/// The fragment format's version.
pub const VERSION: u8 = 1;
/// Most pieces in one set.
pub const MAX_FRAGMENTS: usize = 64;
/// Smallest data a fragment may carry when the sender splits (an MTU that
/// leaves less than this after the headers is refused).
pub const MIN_PIECE: usize = 64;

/// Why a fragment, or a datagram to fragment, was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FragError {
    /// Shorter than the header, a version, flag or reserved field that is
    /// not what this node speaks, no data, a zero total, or data that runs
    /// past the total.
    #[error("malformed fragment")]
    Malformed,
    /// The datagram is longer than this node reassembles (or, sending, than
    /// a set of [`MAX_FRAGMENTS`] pieces carries).
    #[error("oversized datagram: {total} bytes (at most {max})")]
    Oversized {
        /// The datagram's length.
        total: usize,
        /// The most allowed.
        max: usize,
    },
    /// A piece received before, again: its set is dropped.
    #[error("duplicate fragment")]
    Duplicate,
    /// A piece that rewrites bytes already received: its set is dropped.
    #[error("overlapping fragment")]
    Overlap,
    /// A piece past the next expected byte, or a set that does not start at
    /// offset 0: its set is dropped.
    #[error("fragment out of order")]
    OutOfOrder,
    /// A piece whose total differs from its set's: its set is dropped.
    #[error("fragment total changed within its set")]
    TotalChanged,
    /// The set does not fit in the reassembly memory (per source or in
    /// total): refused, the sets held are kept.
    #[error("no room to reassemble")]
    NoRoom,
    /// The set has more than [`MAX_FRAGMENTS`] pieces: dropped.
    #[error("too many fragments")]
    TooManyFragments,
    /// The MTU leaves less than [`MIN_PIECE`] bytes of data per fragment.
    #[error("MTU {mtu} too small to fragment")]
    MtuTooSmall {
        /// The MTU asked for.
        mtu: usize,
    },
}

impl FragError {
    /// A short label, for counters and logs.
    pub fn label(&self) -> &'static str {
        match self {
            FragError::Malformed => "malformed",
            FragError::Oversized { .. } => "oversized",
            FragError::Duplicate => "duplicate",
            FragError::Overlap => "overlap",
            FragError::OutOfOrder => "out_of_order",
            FragError::TotalChanged => "total_changed",
            FragError::NoRoom => "no_room",
            FragError::TooManyFragments => "too_many_fragments",
            FragError::MtuTooSmall { .. } => "mtu_too_small",
        }
    }
}

/// A checked view of a fragment payload (the ANEP payload of a frame of
/// type [`TYPE_FRAGMENT`]). After [`Packet::new_checked`] succeeds, no
/// accessor panics.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(&[x, y]) => u16::from_be_bytes([x, y]),
        _ => 0,
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[a, b2, c, d]) => u32::from_be_bytes([a, b2, c, d]),
        _ => 0,
    }
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks `buffer` as a fragment payload.
    ///
    /// # Errors
    /// [`FragError::Malformed`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, FragError> {
        let b = buffer.as_ref();
        if b.len() <= HEADER_LEN || b.first() != Some(&VERSION) || b.get(1..4) != Some(&[0, 0, 0]) {
            return Err(FragError::Malformed);
        }
        let p = Packet { buffer };
        let (offset, total, len) = (usize::from(p.offset()), usize::from(p.total()), p.data().len());
        if total == 0 || offset + len > total {
            return Err(FragError::Malformed);
        }
        Ok(p)
    }

    /// The datagram id.
    pub fn id(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }

    /// Where the data starts in the original datagram.
    pub fn offset(&self) -> u16 {
        be16(self.buffer.as_ref(), 8)
    }

    /// The original datagram's length.
    pub fn total(&self) -> u16 {
        be16(self.buffer.as_ref(), 10)
    }

    /// The piece's bytes.
    pub fn data(&self) -> &[u8] {
        self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }
}

/// How a datagram of `len` bytes is split for `mtu`: the data per piece and
/// the number of pieces.
///
/// # Errors
/// [`FragError::MtuTooSmall`]; [`FragError::Oversized`] for an empty
/// datagram, one above 65,535 bytes, or one needing more than
/// [`MAX_FRAGMENTS`] pieces.
pub fn plan(len: usize, mtu: usize) -> Result<(usize, usize), FragError> {
    let piece = mtu.saturating_sub(anep::HEADER_LEN + HEADER_LEN);
    if piece < MIN_PIECE {
        return Err(FragError::MtuTooSmall { mtu });
    }
    let max = (piece * MAX_FRAGMENTS).min(usize::from(u16::MAX));
    if len == 0 || len > max {
        return Err(FragError::Oversized { total: len, max });
    }
    Ok((piece, len.div_ceil(piece)))
}

/// Splits `datagram` for a link of `mtu` bytes into ANEP frames of type
/// [`TYPE_FRAGMENT`], in order, each handed to `emit` (built in `scratch`,
/// which is reused). Returns the number of fragments.
///
/// # Errors
/// As [`plan`]; nothing is emitted then.
pub fn fragment(
    datagram: &[u8],
    mtu: usize,
    id: u32,
    scratch: &mut Vec<u8>,
    mut emit: impl FnMut(&[u8]),
) -> Result<usize, FragError> {
    let (piece, count) = plan(datagram.len(), mtu)?;
    let total =
        u16::try_from(datagram.len()).map_err(|_| FragError::Oversized { total: datagram.len(), max: 65_535 })?;
    for (k, chunk) in datagram.chunks(piece).enumerate() {
        let offset =
            u16::try_from(k * piece).map_err(|_| FragError::Oversized { total: datagram.len(), max: 65_535 })?;
        scratch.clear();
        scratch.resize(anep::HEADER_LEN, 0);
        anep::write_header(scratch, anep::FLAG_DISCARD_UNKNOWN, TYPE_FRAGMENT, HEADER_LEN + chunk.len());
        scratch.extend_from_slice(&[VERSION, 0, 0, 0]);
        scratch.extend_from_slice(&id.to_be_bytes());
        scratch.extend_from_slice(&offset.to_be_bytes());
        scratch.extend_from_slice(&total.to_be_bytes());
        scratch.extend_from_slice(chunk);
        emit(scratch);
    }
    Ok(count)
}

/// Bounds of a [`Reassembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest datagram reassembled, bytes (at most 65,535).
    pub max_datagram: usize,
    /// Reassembly memory one source may hold, bytes.
    pub per_source_bytes: usize,
    /// Sets one source may have open.
    pub sets_per_source: usize,
    /// Reassembly memory in all, bytes.
    pub total_bytes: usize,
    /// Sets open in all.
    pub max_sets: usize,
    /// How long a set may stay incomplete, ms.
    pub timeout_ms: u64,
}

impl Default for Limits {
    /// 16 KiB datagrams; 64 KiB and 8 sets per source; 1 MiB and 256 sets
    /// in all; 2 s.
    fn default() -> Self {
        Limits {
            max_datagram: 16 * 1024,
            per_source_bytes: 64 * 1024,
            sets_per_source: 8,
            total_bytes: 1024 * 1024,
            max_sets: 256,
            timeout_ms: 2_000,
        }
    }
}

/// What a [`Reassembler`] did, by outcome; every fragment is counted once
/// in `fragments` and a set that is dropped is counted once by its reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Fragments offered.
    pub fragments: u64,
    /// Datagrams reassembled whole.
    pub reassembled: u64,
    /// Malformed fragments.
    pub malformed: u64,
    /// Datagrams too long (sets refused or dropped).
    pub oversized: u64,
    /// Sets dropped for a duplicate piece.
    pub duplicate: u64,
    /// Sets dropped for an overlapping piece.
    pub overlap: u64,
    /// Sets dropped (or fragments refused) for being out of order.
    pub out_of_order: u64,
    /// Sets dropped because their total changed.
    pub total_changed: u64,
    /// Sets dropped for more than [`MAX_FRAGMENTS`] pieces.
    pub too_many_fragments: u64,
    /// Sets refused for want of memory.
    pub no_room: u64,
    /// Sets never completed, dropped on their timeout.
    pub incomplete: u64,
}

impl Counters {
    fn count(&mut self, e: FragError) {
        let c = match e {
            FragError::Malformed => &mut self.malformed,
            FragError::Oversized { .. } => &mut self.oversized,
            FragError::Duplicate => &mut self.duplicate,
            FragError::Overlap => &mut self.overlap,
            FragError::OutOfOrder => &mut self.out_of_order,
            FragError::TotalChanged => &mut self.total_changed,
            FragError::NoRoom => &mut self.no_room,
            FragError::TooManyFragments | FragError::MtuTooSmall { .. } => &mut self.too_many_fragments,
        };
        *c += 1;
    }
}

/// One datagram being reassembled.
#[derive(Debug)]
struct Set {
    buf: Vec<u8>,
    total: u16,
    pieces: usize,
    deadline: u64,
}

/// Per-source use of the reassembly memory.
#[derive(Debug, Default, Clone, Copy)]
struct Use {
    sets: usize,
    bytes: usize,
}

/// Puts fragments back together, per source `K` (a neighbour's address),
/// within [`Limits`]. Sans-I/O: fragments and `now` in, datagrams out.
#[derive(Debug)]
pub struct Reassembler<K: Eq + Hash + Copy> {
    limits: Limits,
    sets: HashMap<(K, u32), Set>,
    by_source: HashMap<K, Use>,
    bytes: usize,
    /// What it did.
    pub counters: Counters,
}

impl<K: Eq + Hash + Copy> Reassembler<K> {
    /// A reassembler within `limits` (`max_datagram` is capped at 65,535).
    pub fn new(mut limits: Limits) -> Reassembler<K> {
        limits.max_datagram = limits.max_datagram.min(usize::from(u16::MAX));
        Reassembler { limits, sets: HashMap::new(), by_source: HashMap::new(), bytes: 0, counters: Counters::default() }
    }

    /// Bytes reserved by the sets open now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sets open now.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// The earliest deadline of an open set, ms.
    pub fn poll_at(&self) -> Option<u64> {
        self.sets.values().map(|s| s.deadline).min()
    }

    /// Takes fragment `payload` (the ANEP payload) from `from` at `now_ms`.
    /// Returns the whole datagram when this was its last piece.
    ///
    /// # Errors
    /// Each [`FragError`] but `MtuTooSmall`, counted; a set the fragment
    /// belonged to is dropped with it (except for `NoRoom`, which concerns a
    /// new set only).
    pub fn push(&mut self, from: K, payload: &[u8], now_ms: u64) -> Result<Option<Vec<u8>>, FragError> {
        self.counters.fragments += 1;
        let r = self.push_inner(from, payload, now_ms);
        match &r {
            Ok(Some(_)) => self.counters.reassembled += 1,
            Ok(None) => {}
            Err(e) => self.counters.count(*e),
        }
        r
    }

    fn push_inner(&mut self, from: K, payload: &[u8], now_ms: u64) -> Result<Option<Vec<u8>>, FragError> {
        let p = Packet::new_checked(payload)?;
        let (id, offset, total, data) = (p.id(), p.offset(), p.total(), p.data());
        let key = (from, id);
        let Some(set) = self.sets.get_mut(&key) else {
            return self.start(from, id, total, data, now_ms, offset);
        };
        let next = set.buf.len();
        let outcome = if total != set.total {
            Err(FragError::TotalChanged)
        } else if usize::from(offset) > next {
            Err(FragError::OutOfOrder)
        } else if usize::from(offset) < next {
            let repeat = set.buf.get(usize::from(offset)..usize::from(offset) + data.len()) == Some(data);
            Err(if repeat { FragError::Duplicate } else { FragError::Overlap })
        } else if set.pieces >= MAX_FRAGMENTS {
            Err(FragError::TooManyFragments)
        } else {
            Ok(())
        };
        if let Err(e) = outcome {
            self.drop_set(&key);
            return Err(e);
        }
        set.buf.extend_from_slice(data);
        set.pieces += 1;
        if set.buf.len() == usize::from(set.total) {
            return Ok(self.drop_set(&key));
        }
        Ok(None)
    }

    /// Opens a set with its first piece.
    fn start(
        &mut self,
        from: K,
        id: u32,
        total: u16,
        data: &[u8],
        now_ms: u64,
        offset: u16,
    ) -> Result<Option<Vec<u8>>, FragError> {
        let len = usize::from(total);
        if len > self.limits.max_datagram {
            return Err(FragError::Oversized { total: len, max: self.limits.max_datagram });
        }
        if offset != 0 {
            return Err(FragError::OutOfOrder);
        }
        if data.len() == len {
            // A "set" of one piece: nothing to hold.
            return Ok(Some(data.to_vec()));
        }
        let u = self.by_source.get(&from).copied().unwrap_or_default();
        if u.sets >= self.limits.sets_per_source
            || u.bytes + len > self.limits.per_source_bytes
            || self.sets.len() >= self.limits.max_sets
            || self.bytes + len > self.limits.total_bytes
        {
            return Err(FragError::NoRoom);
        }
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(data);
        let set = Set { buf, total, pieces: 1, deadline: now_ms.saturating_add(self.limits.timeout_ms) };
        self.sets.insert((from, id), set);
        let e = self.by_source.entry(from).or_default();
        e.sets += 1;
        e.bytes += len;
        self.bytes += len;
        Ok(None)
    }

    /// Removes a set and frees its room; returns its bytes.
    fn drop_set(&mut self, key: &(K, u32)) -> Option<Vec<u8>> {
        let set = self.sets.remove(key)?;
        let len = usize::from(set.total);
        self.bytes = self.bytes.saturating_sub(len);
        if let Some(u) = self.by_source.get_mut(&key.0) {
            u.sets = u.sets.saturating_sub(1);
            u.bytes = u.bytes.saturating_sub(len);
            if u.sets == 0 {
                self.by_source.remove(&key.0);
            }
        }
        Some(set.buf)
    }

    /// Drops the sets whose deadline has passed at `now_ms` (counted as
    /// `incomplete`); returns how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let due: Vec<(K, u32)> = self.sets.iter().filter(|(_, s)| s.deadline <= now_ms).map(|(k, _)| *k).collect();
        for k in &due {
            self.drop_set(k);
        }
        self.counters.incomplete += due.len() as u64;
        due.len()
    }

    /// Drops every set of `from` (a neighbour that went away).
    pub fn forget(&mut self, from: K) {
        let keys: Vec<(K, u32)> = self.sets.keys().filter(|k| k.0 == from).copied().collect();
        for k in &keys {
            self.drop_set(k);
        }
    }
}

/// Entry point of the `wire_frag` fuzz target: arbitrary fragments from a
/// few sources through a small reassembler, with time moving, and a
/// split-then-reassemble round trip of the same bytes. Must never panic,
/// and the reassembler's memory must stay within its limits.
pub fn fuzz(data: &[u8]) {
    let limits = Limits {
        max_datagram: 4096,
        per_source_bytes: 8192,
        sets_per_source: 3,
        total_bytes: 16384,
        max_sets: 6,
        timeout_ms: 50,
    };
    let mut r: Reassembler<u8> = Reassembler::new(limits);
    let mut now = 0u64;
    let mut rest = data;
    // Records: source (1), time step (1), length (1), then that many bytes.
    while let [src, step, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (frag, more) = tail.split_at(n);
        now += u64::from(*step);
        if step.is_multiple_of(17) {
            r.expire(now);
        }
        let _ = r.push(src % 4, frag, now);
        assert!(r.bytes() <= limits.total_bytes && r.sets() <= limits.max_sets);
        rest = more;
    }
    // Round trip: whatever fragments, reassembles to itself.
    let mtu = 100 + usize::from(data.first().copied().unwrap_or(0));
    let mut scratch = Vec::new();
    let mut pieces = Vec::new();
    if fragment(data, mtu, 7, &mut scratch, |f| pieces.push(f.to_vec())).is_ok() {
        let mut r: Reassembler<u8> = Reassembler::new(Limits { max_datagram: 65_535, ..Limits::default() });
        let mut whole = None;
        for f in &pieces {
            let p = anep::Packet::new_checked(f.as_slice()).map(|p| p.payload().to_vec());
            assert!(p.is_ok(), "a fragment is a valid ANEP frame");
            if let Ok(p) = p {
                whole = r.push(9, &p, 0).ok().flatten().or(whole);
            }
        }
        assert_eq!(whole.as_deref(), Some(data), "split then reassembled is the same");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frames(datagram: &[u8], mtu: usize, id: u32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        fragment(datagram, mtu, id, &mut scratch, |f| {
            let p = anep::Packet::new_checked(f).expect("valid ANEP");
            assert_eq!(p.type_id(), TYPE_FRAGMENT);
            assert!(f.len() <= mtu, "{} > {mtu}", f.len());
            out.push(p.payload().to_vec());
        })
        .expect("fragments");
        out
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn a_2k_capsule_crosses_a_1500_byte_link_and_comes_back_whole() {
        let d = bytes(2048);
        let f = frames(&d, 1500, 1);
        assert_eq!(f.len(), 2);
        let mut r = Reassembler::new(Limits::default());
        assert_eq!(r.push(1u8, &f[0], 0), Ok(None));
        assert_eq!(r.bytes(), 2048, "room for the whole datagram is reserved at its first piece");
        assert_eq!(r.push(1u8, &f[1], 1), Ok(Some(d)));
        assert_eq!((r.bytes(), r.sets(), r.counters.reassembled, r.counters.fragments), (0, 0, 1, 2));
    }

    #[test]
    fn sets_of_two_sources_with_the_same_id_do_not_mix() {
        let (a, b) = (bytes(3000), vec![9u8; 3000]);
        let (fa, fb) = (frames(&a, 1000, 5), frames(&b, 1000, 5));
        let mut r = Reassembler::new(Limits::default());
        let mut got = Vec::new();
        for (x, y) in fa.iter().zip(&fb) {
            got.extend(r.push(1u8, x, 0).unwrap());
            got.extend(r.push(2u8, y, 0).unwrap());
        }
        assert_eq!(got, vec![a, b]);
    }

    #[test]
    fn each_bad_set_is_dropped_and_counted_by_its_reason() {
        let d = bytes(4000);
        let f = frames(&d, 1000, 3);
        assert_eq!(f.len(), 5);
        let mut r = Reassembler::new(Limits::default());
        // Duplicate.
        r.push(1u8, &f[0], 0).unwrap();
        assert_eq!(r.push(1u8, &f[0], 0), Err(FragError::Duplicate));
        assert_eq!(r.sets(), 0, "the set is dropped");
        // Out of order: a gap, and a set not starting at 0.
        r.push(1u8, &f[0], 0).unwrap();
        assert_eq!(r.push(1u8, &f[2], 0), Err(FragError::OutOfOrder));
        assert_eq!(r.push(1u8, &f[1], 0), Err(FragError::OutOfOrder));
        // Overlap: a piece that starts inside what was received.
        r.push(1u8, &f[0], 0).unwrap();
        let mut o = f[1].clone();
        o[8..10].copy_from_slice(&500u16.to_be_bytes());
        assert_eq!(r.push(1u8, &o, 0), Err(FragError::Overlap));
        // The same offset with other bytes is an overlap, not a duplicate.
        r.push(1u8, &f[0], 0).unwrap();
        let mut o = f[0].clone();
        o[HEADER_LEN] ^= 1;
        assert_eq!(r.push(1u8, &o, 0), Err(FragError::Overlap));
        // A total that changes.
        r.push(1u8, &f[0], 0).unwrap();
        let mut t = f[1].clone();
        t[10..12].copy_from_slice(&4001u16.to_be_bytes());
        assert_eq!(r.push(1u8, &t, 0), Err(FragError::TotalChanged));
        // Never completed.
        r.push(1u8, &f[0], 0).unwrap();
        assert_eq!(r.poll_at(), Some(2_000));
        assert_eq!(r.expire(1_999), 0);
        assert_eq!(r.expire(2_000), 1);
        let c = r.counters;
        assert_eq!(
            (c.duplicate, c.out_of_order, c.overlap, c.total_changed, c.incomplete, c.reassembled),
            (1, 2, 2, 1, 1, 0)
        );
        assert_eq!((r.sets(), r.bytes()), (0, 0), "every dropped set freed its room");
    }

    #[test]
    fn oversized_malformed_and_unsplittable_are_refused() {
        let mut r: Reassembler<u8> = Reassembler::new(Limits { max_datagram: 3000, ..Limits::default() });
        let f = frames(&bytes(4000), 1500, 1);
        assert_eq!(r.push(1, &f[0], 0), Err(FragError::Oversized { total: 4000, max: 3000 }));
        assert_eq!(r.sets(), 0, "nothing is reserved for it");
        for bad in [
            &[][..],
            &[1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4][..],    // no data
            &[2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 1][..], // version
            &[1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 1][..], // flags
            &[1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1][..], // total 0
            &[1, 0, 0, 0, 0, 0, 0, 1, 0, 4, 0, 4, 1][..], // past the total
        ] {
            assert_eq!(r.push(1, bad, 0), Err(FragError::Malformed), "{bad:?}");
        }
        assert_eq!(r.counters.malformed, 6);
        let mut s = Vec::new();
        assert_eq!(fragment(&bytes(100), 80, 1, &mut s, |_| {}), Err(FragError::MtuTooSmall { mtu: 80 }));
        assert!(matches!(fragment(&bytes(70_000), 1500, 1, &mut s, |_| {}), Err(FragError::Oversized { .. })));
        assert!(matches!(fragment(&[], 1500, 1, &mut s, |_| {}), Err(FragError::Oversized { .. })));
        // 65 pieces of 64 bytes are one too many.
        let mtu = anep::HEADER_LEN + HEADER_LEN + MIN_PIECE;
        assert!(fragment(&bytes(64 * 64), mtu, 1, &mut s, |_| {}).is_ok());
        assert!(matches!(fragment(&bytes(64 * 65), mtu, 1, &mut s, |_| {}), Err(FragError::Oversized { .. })));
    }

    #[test]
    fn a_flooding_source_fills_its_own_room_and_not_anothers() {
        let limits = Limits { per_source_bytes: 8000, sets_per_source: 4, total_bytes: 12_000, ..Limits::default() };
        let mut r = Reassembler::new(limits);
        // The flooder opens sets of 3000 bytes and never finishes them.
        let mut refused = 0;
        for id in 0..100 {
            let f = frames(&bytes(3000), 1000, id);
            if r.push(66u8, &f[0], 0) == Err(FragError::NoRoom) {
                refused += 1;
            }
        }
        assert_eq!(refused, 98, "two sets of 3000 fit in its 8000 bytes");
        assert_eq!(r.bytes(), 6000);
        // A well-behaved source still gets a 4000-byte datagram through.
        let d = bytes(4000);
        let mut got = None;
        for f in frames(&d, 1000, 0) {
            got = r.push(7u8, &f, 1).unwrap().or(got);
        }
        assert_eq!(got, Some(d));
        // The flooder's sets time out and free the room.
        assert_eq!(r.expire(2_000), 2);
        assert_eq!((r.bytes(), r.counters.no_room, r.counters.incomplete), (0, 98, 2));
    }

    #[test]
    fn a_single_piece_needs_no_room() {
        let mut r: Reassembler<u8> = Reassembler::new(Limits { total_bytes: 0, ..Limits::default() });
        let f = frames(&bytes(500), 1500, 1);
        assert_eq!(r.push(1, &f[0], 0), Ok(Some(bytes(500))));
    }

    #[test]
    fn fuzz_seeds_and_mutations() {
        let mut seeds: Vec<Vec<u8>> = vec![vec![], vec![1, 2, 3], vec![0; 40]];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/wire_frag");
        if let Ok(rd) = std::fs::read_dir(&dir) {
            seeds.extend(rd.flatten().filter_map(|e| std::fs::read(e.path()).ok()));
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for s in &seeds {
            fuzz(s);
            for _ in 0..300 {
                let mut m = s.clone();
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if !m.is_empty() {
                    let i = (x as usize) % m.len();
                    m[i] ^= (x >> 32) as u8;
                }
                if x.is_multiple_of(3) {
                    m.push((x >> 40) as u8);
                }
                fuzz(&m);
            }
        }
    }
}
