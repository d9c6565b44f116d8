//! Link-layer fragmentation (issue 19, "Real MTUs"): datagrams longer than
//! the link's MTU go out as `anode_wire::frag` pieces, and pieces from
//! neighbours are put back together before the core sees the datagram.
//!
//! This is the daemon's part because the MTU is a property of its links;
//! the format, the splitting and the bounded reassembly are sans-I/O in
//! `anode_wire::frag`.

use std::net::SocketAddr;

use anode_wire::frag::{self, Counters, FragError, Limits, Reassembler};

/// IPv4 and UDP headers: what a link MTU holds beyond the datagram.
pub(crate) const IP_UDP_HEADERS: usize = 28;

/// Fragmentation state of one daemon.
pub(crate) struct Frag {
    /// Longest datagram sent whole (the link MTU less [`IP_UDP_HEADERS`]);
    /// `None`: off.
    limit: Option<usize>,
    next_id: u32,
    /// Reassembly of neighbours' pieces, per source address.
    pub(crate) rx: Reassembler<SocketAddr>,
    /// Datagrams sent as fragments.
    pub(crate) tx_datagrams: u64,
    /// Fragments sent.
    pub(crate) tx_fragments: u64,
    /// Datagrams too long to fragment (dropped).
    pub(crate) tx_refused: u64,
    scratch: Vec<u8>,
}

/// The reassembly limits of a daemon: datagrams up to 64 KiB (a module
/// load), 256 KiB and 8 sets per neighbour, 4 MiB and 256 sets in all, 2 s.
pub(crate) fn limits() -> Limits {
    Limits {
        max_datagram: 65_535,
        per_source_bytes: 256 * 1024,
        sets_per_source: 8,
        total_bytes: 4 * 1024 * 1024,
        max_sets: 256,
        timeout_ms: 2_000,
    }
}

/// Whether datagram `d` is a fragment (by its ANEP type id alone).
pub(crate) fn is_fragment(d: &[u8]) -> bool {
    d.get(2..4) == Some(&frag::TYPE_FRAGMENT.to_be_bytes()[..])
}

impl Frag {
    /// Fragmentation for links of `link_mtu` bytes (0: off).
    pub(crate) fn new(link_mtu: usize) -> Frag {
        Frag {
            limit: (link_mtu > 0).then(|| link_mtu.saturating_sub(IP_UDP_HEADERS)),
            next_id: 1,
            rx: Reassembler::new(limits()),
            tx_datagrams: 0,
            tx_fragments: 0,
            tx_refused: 0,
            scratch: Vec::new(),
        }
    }

    /// Whether `len` bytes must go as fragments.
    pub(crate) fn too_long(&self, len: usize) -> bool {
        self.limit.is_some_and(|l| len > l)
    }

    /// Splits `datagram` into pieces appended to `pieces`; returns how many
    /// (0, counted, if it cannot be split).
    pub(crate) fn split(&mut self, datagram: &[u8], pieces: &mut Vec<Vec<u8>>) -> usize {
        let Some(limit) = self.limit else { return 0 };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        match frag::fragment(datagram, limit, id, &mut self.scratch, |f| pieces.push(f.to_vec())) {
            Ok(n) => {
                self.tx_datagrams += 1;
                self.tx_fragments += n as u64;
                n
            }
            Err(_) => {
                self.tx_refused += 1;
                0
            }
        }
    }

    /// Takes datagram `d` from `from` if it is a fragment: `None` when it
    /// is not one (handle it as it is); `Some(Ok(Some(whole)))` when it was
    /// the last piece; `Some(Ok(None))` when more are to come;
    /// `Some(Err(_))` when it was refused (counted in `rx.counters`).
    pub(crate) fn take(
        &mut self,
        from: Option<SocketAddr>,
        d: &[u8],
        now_ms: u64,
    ) -> Option<Result<Option<Vec<u8>>, FragError>> {
        // Every datagram passes here: look at the type id alone first (the
        // core checks the whole ANEP header of the others itself).
        if !is_fragment(d) {
            return None;
        }
        let p = anode_wire::anep::Packet::new_checked(d).ok()?;
        if self.rx.poll_at().is_some_and(|t| t <= now_ms) {
            self.rx.expire(now_ms);
        }
        let Some(from) = from else {
            self.rx.counters.fragments += 1;
            self.rx.counters.malformed += 1;
            return Some(Err(FragError::Malformed));
        };
        Some(self.rx.push(from, p.payload(), now_ms))
    }

    /// What this instance did and holds.
    pub(crate) fn totals(&self) -> FragTotals {
        FragTotals {
            tx_datagrams: self.tx_datagrams,
            tx_fragments: self.tx_fragments,
            tx_refused: self.tx_refused,
            rx: self.rx.counters,
            held_sets: self.rx.sets() as u64,
            held_bytes: self.rx.bytes() as u64,
        }
    }

    /// The counters for `anode status` (`fragments`): this instance's plus
    /// `others` (the data path workers', each reassembling its own
    /// sources).
    pub(crate) fn status(&self, others: &[FragTotals]) -> serde_json::Value {
        let mut t = self.totals();
        for o in others {
            t.add(o);
        }
        let c = t.rx;
        serde_json::json!({
            "link_mtu_payload": self.limit,
            "tx_datagrams": t.tx_datagrams,
            "tx_fragments": t.tx_fragments,
            "tx_refused": t.tx_refused,
            "rx_fragments": c.fragments,
            "rx_reassembled": c.reassembled,
            "rx_held_sets": t.held_sets,
            "rx_held_bytes": t.held_bytes,
            "drops": {
                "malformed": c.malformed,
                "oversized": c.oversized,
                "duplicate": c.duplicate,
                "overlap": c.overlap,
                "out_of_order": c.out_of_order,
                "total_changed": c.total_changed,
                "too_many_fragments": c.too_many_fragments,
                "no_room": c.no_room,
                "incomplete": c.incomplete,
            },
        })
    }
}

/// One fragmentation instance's counters and holdings.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FragTotals {
    tx_datagrams: u64,
    tx_fragments: u64,
    tx_refused: u64,
    rx: Counters,
    held_sets: u64,
    held_bytes: u64,
}

impl FragTotals {
    fn add(&mut self, o: &FragTotals) {
        self.tx_datagrams += o.tx_datagrams;
        self.tx_fragments += o.tx_fragments;
        self.tx_refused += o.tx_refused;
        self.held_sets += o.held_sets;
        self.held_bytes += o.held_bytes;
        let (a, b) = (&mut self.rx, &o.rx);
        a.fragments += b.fragments;
        a.reassembled += b.reassembled;
        a.malformed += b.malformed;
        a.oversized += b.oversized;
        a.duplicate += b.duplicate;
        a.overlap += b.overlap;
        a.out_of_order += b.out_of_order;
        a.total_changed += b.total_changed;
        a.too_many_fragments += b.too_many_fragments;
        a.no_room += b.no_room;
        a.incomplete += b.incomplete;
    }
}
