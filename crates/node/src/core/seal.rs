//! Protection: every transmission is sealed for its next hop (SANE §4.6,
//! hop by hop), and the security layer's own messages (handshakes,
//! keepalives) are framed and sent for System.

use super::{Data, Node, Outbox, Owner, Transmit};
use crate::counters::Drop;
use crate::secure::{self, Guard};
use anode_wire::anep;
use core::ops::Range;

impl Node {
    /// Whether authentication between nodes is on.
    pub fn security_on(&self) -> bool {
        self.sec.is_some()
    }

    /// The security section of `anode status` (None when security is off).
    pub fn security_json(&self) -> Option<serde_json::Value> {
        self.sec.as_ref().map(|g| g.to_json(self.now_ms))
    }

    /// Whether the link to neighbour `addr` has an SA (always true when
    /// security is off).
    pub fn link_up(&self, addr: core::net::Ipv4Addr) -> bool {
        let Some(g) = &self.sec else { return true };
        let Some(&(_, ep)) = self.env.link.get(&addr) else { return false };
        g.peer_at(&ep).is_some_and(|p| g.links.is_up(p))
    }

    /// The security layer's timers: link keys at boot, retries, rekeys,
    /// expiry.
    pub(super) fn poll_security(&mut self, now_ms: u64, out: &mut Outbox) {
        let Some(g) = self.sec.as_mut() else { return };
        let mut outs = std::mem::take(&mut g.outs);
        outs.clear();
        g.links.poll(now_ms, &mut outs);
        self.emit_security(&mut outs, None, now_ms, out);
        if let Some(g) = self.sec.as_mut() {
            g.outs = outs;
        }
    }

    /// Turns the security layer's outputs into transmissions, for System.
    pub(super) fn emit_security(
        &mut self,
        outs: &mut Vec<anode_sec::Output>,
        rx_iface: Option<usize>,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let Some(g) = self.sec.as_mut() else { return };
        for o in outs.drain(..) {
            match o {
                anode_sec::Output::Handshake { to, msg, .. } => {
                    let Some(iface) = g.iface_of(&to).or(rx_iface) else { continue };
                    let data = out.push_frame(anep::TYPE_HANDSHAKE, &[&msg]);
                    out.transmits.push(Transmit { iface, to, data, owner: Owner::System, unsealed: false, flow: None });
                }
                anode_sec::Output::Keepalive { peer } => {
                    let Some(to) = g.links.endpoint_of(peer) else { continue };
                    let Some(iface) = g.iface_of(&to).or(rx_iface) else { continue };
                    if let Some(data) = seal_into(g, peer, &mut out.arena, Inner::Empty, now_ms) {
                        self.counters.keepalives_tx += 1;
                        out.transmits.push(Transmit {
                            iface,
                            to,
                            data,
                            owner: Owner::System,
                            unsealed: false,
                            flow: None,
                        });
                    }
                }
                anode_sec::Output::Established { peer, rekey } => {
                    g.learn_endpoint(peer, rx_iface);
                    self.counters.sa_established += 1;
                    out.events.push(g.describe(peer, rekey));
                }
            }
        }
    }

    /// Makes the transmissions on the interfaces marked in `mask` leave the
    /// core unsealed, for the daemon to seal with [`Node::seal_for`] when
    /// it sends them. A link scheduler that reorders datagrams across its
    /// clients must sit before the SA's sequence numbers: sealed when
    /// queued, a datagram that waits behind more than the receiver's
    /// replay window of later ones is refused there as a replay (a
    /// best-effort client on a link booked to 98 % waited over a second).
    pub fn set_seal_at_send(&mut self, mask: Vec<bool>) {
        self.seal_at_send = mask;
    }

    /// Seals `inner` (a whole ANEP datagram that left the core unsealed,
    /// see [`Node::set_seal_at_send`]) for the neighbour at `to` into
    /// `sealed` (cleared first). With security off `sealed` is a copy.
    /// False, counted as `no_sa`, when the neighbour has no SA now.
    pub fn seal_for(&mut self, to: &core::net::SocketAddr, inner: &[u8], sealed: &mut Vec<u8>) -> bool {
        sealed.clear();
        let now_ms = self.now_ms;
        let Some(g) = self.sec.as_mut() else {
            sealed.extend_from_slice(inner);
            return true;
        };
        match g.peer_at(to).and_then(|peer| seal_into(g, peer, sealed, Inner::Bytes(inner), now_ms)) {
            Some(Data::Arena(r) | Data::Input(r)) => {
                sealed.truncate(r.end);
                true
            }
            None => {
                sealed.clear();
                self.counters.drop(Drop::NoSa);
                false
            }
        }
    }

    /// Seals the datagram at `buf[r]` for the neighbour at `to` where it is:
    /// its headers go into the [`SEAL_HEADROOM`] bytes in front of it and
    /// its tag behind it, which `buf` must have room for ([`room_around`];
    /// `None` without touching `buf` otherwise), or `None` when there is no
    /// SA (counted as `no_sa`). With security off, the datagram as it is.
    /// Returns where the sealed datagram is. For a link queue that keeps
    /// the datagram in a buffer laid out so (no copy).
    pub fn seal_range(&mut self, to: &core::net::SocketAddr, buf: &mut [u8], r: Range<usize>) -> Option<Range<usize>> {
        let now_ms = self.now_ms;
        let Some(g) = self.sec.as_mut() else { return Some(r) };
        if !room_around(buf, &r) {
            return None;
        }
        let sealed = g.peer_at(to).and_then(|peer| seal_in_buffer(g, peer, buf, r, now_ms));
        if sealed.is_none() {
            self.counters.drop(Drop::NoSa);
        }
        sealed
    }

    /// Seals transmission `i` of `out`, which the core left unsealed for a
    /// paced link ([`Node::set_seal_at_send`]), now, as the core seals the
    /// others: where it is in `buf` (the receive buffer `out` was made
    /// from) when nothing else of `out` points into `buf` and there is room
    /// around it, else into the outbox's arena. For a datagram its link
    /// sends at once instead of queueing it. False, counted as `no_sa` and
    /// the transmission left as it was, when the neighbour has no SA now.
    pub fn seal_transmit(&mut self, out: &mut Outbox, i: usize, buf: &mut [u8]) -> bool {
        let now_ms = self.now_ms;
        let Some(t) = out.transmits.get(i) else { return false };
        if !t.unsealed {
            return true;
        }
        let Some(g) = self.sec.as_mut() else { return false };
        let sole = input_refs(out) == 1;
        let (to, data) = (t.to, t.data.clone());
        match g.peer_at(&to).and_then(|peer| seal_data(g, peer, buf, &mut out.arena, &data, sole, now_ms)) {
            Some(sealed) => {
                if let Some(t) = out.transmits.get_mut(i) {
                    t.data = sealed;
                    t.unsealed = false;
                }
                true
            }
            None => {
                self.counters.drop(Drop::NoSa);
                false
            }
        }
    }

    /// Protects the transmissions from index `mark` on for their next hop
    /// (hop by hop, SANE §4.6). Those without an SA are dropped (`no_sa`).
    ///
    /// A datagram forwarded from the receive buffer `buf` (`Data::Input`)
    /// is sealed there, in place, when nothing else in the outbox points
    /// into `buf` and `buf` has room for the headers in front of it and the
    /// tag behind it (the room of the headers and tag it arrived with): no
    /// copy. Otherwise it is copied into the outbox's arena and sealed
    /// there.
    pub(super) fn protect(&mut self, buf: &mut [u8], out: &mut Outbox, mark: usize, now_ms: u64) {
        self.capture_out(buf, out, mark);
        let Some(g) = self.sec.as_mut() else { return };
        let inputs = input_refs(out);
        let mut keep = mark;
        for i in mark..out.transmits.len() {
            let t = out.transmits[i].clone();
            if self.seal_at_send.get(t.iface).copied().unwrap_or(false) && g.peer_at(&t.to).is_some() {
                // Sealed by the daemon when its link sends it.
                out.transmits[keep] = Transmit { unsealed: true, ..t };
                keep += 1;
                continue;
            }
            let sealed =
                g.peer_at(&t.to).and_then(|peer| seal_data(g, peer, buf, &mut out.arena, &t.data, inputs == 1, now_ms));
            match sealed {
                Some(data) => {
                    out.transmits[keep] = Transmit { data, ..t };
                    keep += 1;
                }
                None => self.counters.drop(Drop::NoSa),
            }
        }
        out.transmits.truncate(keep);
    }
}

/// Bytes sealing adds to a datagram for a neighbour with an SA (the core
/// leaves a transmission unsealed, `Transmit::unsealed`, only for such a
/// neighbour).
pub const SEAL_OVERHEAD: usize = anep::HEADER_LEN + anode_sec::sa::OVERHEAD;

/// Bytes a datagram needs in front of it to be sealed in place
/// ([`Node::seal_range`], and the forwarding path sealing in the receive buffer): the outer ANEP header and the AH header.
pub const SEAL_HEADROOM: usize = anep::HEADER_LEN + anode_sec::sa::AH_LEN;

/// Where the inner datagram to seal is.
enum Inner<'a> {
    /// Nothing: an empty keepalive.
    Empty,
    /// Bytes outside the arena (the receive buffer).
    Bytes(&'a [u8]),
    /// A range of the arena itself (copied within it, no allocation).
    Arena(Range<usize>),
}

/// Whether `buf` has room for the outer headers in front of `r` and the tag
/// behind it.
pub fn room_around(buf: &[u8], r: &Range<usize>) -> bool {
    r.start >= SEAL_HEADROOM && r.end.checked_add(anode_sec::sa::TAG_LEN).is_some_and(|e| e <= buf.len())
}

/// Seals the datagram at `buf[r]` for `peer` where it is, its headers
/// written into the room in front of it and its tag behind it
/// ([`room_around`]); where the sealed datagram is. None if there is no SA
/// (or no room).
fn seal_in_buffer(g: &mut Guard, peer: usize, buf: &mut [u8], r: Range<usize>, now_ms: u64) -> Option<Range<usize>> {
    use anode_sec::sa::{AH_LEN, TAG_LEN};
    let start = r.start.checked_sub(SEAL_HEADROOM)?;
    let n = r.len();
    let body = AH_LEN + n + TAG_LEN;
    let d = buf.get_mut(start..start + anep::HEADER_LEN + body)?;
    anep::write_header(d, anep::FLAG_DISCARD_UNKNOWN, secure::type_of(g.links.mode(peer)), body);
    let total = g.links.seal(peer, d, anep::HEADER_LEN, n, now_ms).ok()?;
    Some(start..start + total)
}

/// How many of `out`'s transmissions and deliveries point into the receive
/// buffer (`Data::Input`): a datagram is sealed in that buffer only when it
/// is the one.
fn input_refs(out: &Outbox) -> usize {
    out.transmits.iter().filter(|t| matches!(t.data, Data::Input(_))).count()
        + out.deliveries.iter().filter(|d| matches!(d.data, Data::Input(_))).count()
}

/// Seals the datagram at `data` for `peer`: in `buf` where it is when it
/// is the only thing of its outbox there (`sole`) and has room around it
/// ([`seal_in_buffer`], no copy), else copied into `arena` and sealed
/// there ([`seal_into`]).
fn seal_data(
    g: &mut Guard,
    peer: usize,
    buf: &mut [u8],
    arena: &mut Vec<u8>,
    data: &Data,
    sole: bool,
    now_ms: u64,
) -> Option<Data> {
    match data {
        Data::Input(r) if sole && room_around(buf, r) => {
            seal_in_buffer(g, peer, buf, r.clone(), now_ms).map(Data::Input)
        }
        Data::Input(r) => seal_into(g, peer, arena, Inner::Bytes(buf.get(r.clone()).unwrap_or(&[])), now_ms),
        Data::Arena(r) => seal_into(g, peer, arena, Inner::Arena(r.clone()), now_ms),
    }
}

/// Seals `inner` (an ANEP datagram) for `peer` into new bytes at the end
/// of `arena`, laid out with room for the headers and the tag and sealed
/// there ([`seal_in_buffer`]). None (and the arena unchanged) if there is
/// no SA yet.
fn seal_into(g: &mut Guard, peer: usize, arena: &mut Vec<u8>, inner: Inner<'_>, now_ms: u64) -> Option<Data> {
    let start = arena.len();
    arena.resize(start + SEAL_HEADROOM, 0);
    match inner {
        Inner::Empty => {}
        Inner::Bytes(b) => arena.extend_from_slice(b),
        Inner::Arena(r) if r.end <= start => arena.extend_from_within(r),
        Inner::Arena(_) => {}
    }
    let r = start + SEAL_HEADROOM..arena.len();
    arena.resize(arena.len() + anode_sec::sa::TAG_LEN, 0);
    let sealed = seal_in_buffer(g, peer, arena, r, now_ms);
    if sealed.is_none() {
        arena.truncate(start);
    }
    sealed.map(Data::Arena)
}
