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
                    out.transmits.push(Transmit { iface, to, data, owner: Owner::System, unsealed: false });
                }
                anode_sec::Output::Keepalive { peer } => {
                    let Some(to) = g.links.endpoint_of(peer) else { continue };
                    let Some(iface) = g.iface_of(&to).or(rx_iface) else { continue };
                    if let Some(data) = seal_into(g, peer, &mut out.arena, Inner::Empty, now_ms) {
                        self.counters.keepalives_tx += 1;
                        out.transmits.push(Transmit { iface, to, data, owner: Owner::System, unsealed: false });
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
        let r = g.peer_at(to).and_then(|peer| seal_into(g, peer, sealed, Inner::Bytes(inner), now_ms));
        self.sealed_or_dropped(r, sealed)
    }

    /// Cuts `buf` to the sealed datagram `r`, or, without one (no SA),
    /// empties it and counts a `no_sa` drop. Whether there is one.
    fn sealed_or_dropped(&mut self, r: Option<Data>, buf: &mut Vec<u8>) -> bool {
        match r {
            Some(Data::Arena(r) | Data::Input(r)) => {
                buf.truncate(r.end);
                true
            }
            None => {
                buf.clear();
                self.counters.drop(Drop::NoSa);
                false
            }
        }
    }

    /// Seals in place the datagram that left the core unsealed and was laid
    /// out in `buf` behind [`SEAL_HEADROOM`] bytes (a paced link's queue
    /// keeps it so, which saves the copy [`seal_for`](Self::seal_for)
    /// makes). With security off the headroom is removed. False, counted as
    /// `no_sa`, when the neighbour has no SA now (or `buf` is shorter than
    /// the headroom).
    pub fn seal_in_place(&mut self, to: &core::net::SocketAddr, buf: &mut Vec<u8>) -> bool {
        let now_ms = self.now_ms;
        if buf.len() < SEAL_HEADROOM {
            self.counters.drop(Drop::NoSa);
            return false;
        }
        let Some(g) = self.sec.as_mut() else {
            buf.drain(..SEAL_HEADROOM);
            return true;
        };
        let r = g.peer_at(to).and_then(|peer| seal_laid_out(g, peer, buf, 0, now_ms));
        self.sealed_or_dropped(r, buf)
    }

    /// Protects the transmissions from index `mark` on for their next hop
    /// (hop by hop, SANE §4.6). Those without an SA are dropped (`no_sa`).
    pub(super) fn protect(&mut self, buf: &[u8], out: &mut Outbox, mark: usize, now_ms: u64) {
        self.capture_out(buf, out, mark);
        let Some(g) = self.sec.as_mut() else { return };
        let mut keep = mark;
        for i in mark..out.transmits.len() {
            let t = out.transmits[i].clone();
            if self.seal_at_send.get(t.iface).copied().unwrap_or(false) && g.peer_at(&t.to).is_some() {
                // Sealed by the daemon when its link sends it.
                out.transmits[keep] = Transmit { unsealed: true, ..t };
                keep += 1;
                continue;
            }
            let sealed = g.peer_at(&t.to).and_then(|peer| match &t.data {
                Data::Input(r) => {
                    seal_into(g, peer, &mut out.arena, Inner::Bytes(buf.get(r.clone()).unwrap_or(&[])), now_ms)
                }
                Data::Arena(r) => seal_into(g, peer, &mut out.arena, Inner::Arena(r.clone()), now_ms),
            });
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
/// ([`Node::seal_in_place`]): the outer ANEP header and the AH header.
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

/// Seals `inner` (an ANEP datagram) for `peer` into new bytes at the end
/// of `arena`. None (and the arena unchanged) if there is no SA yet.
fn seal_into(g: &mut Guard, peer: usize, arena: &mut Vec<u8>, inner: Inner<'_>, now_ms: u64) -> Option<Data> {
    use anode_sec::sa::AH_LEN;
    let start = arena.len();
    arena.resize(start + anep::HEADER_LEN + AH_LEN, 0);
    match inner {
        Inner::Empty => {}
        Inner::Bytes(b) => arena.extend_from_slice(b),
        Inner::Arena(r) if r.end <= start => arena.extend_from_within(r),
        Inner::Arena(_) => {}
    }
    seal_laid_out(g, peer, arena, start, now_ms)
}

/// Seals the datagram laid out in `arena[start..]` behind
/// [`SEAL_HEADROOM`] bytes of room for its headers, in place. None (and the
/// arena cut back to `start`) if there is no SA yet.
fn seal_laid_out(g: &mut Guard, peer: usize, arena: &mut Vec<u8>, start: usize, now_ms: u64) -> Option<Data> {
    use anode_sec::sa::{AH_LEN, TAG_LEN};
    let n = arena.len().checked_sub(start + anep::HEADER_LEN + AH_LEN)?;
    let body = AH_LEN + n + TAG_LEN;
    arena.resize(start + anep::HEADER_LEN + body, 0);
    let d = &mut arena[start..];
    anep::write_header(d, anep::FLAG_DISCARD_UNKNOWN, secure::type_of(g.links.mode(peer)), body);
    match g.links.seal(peer, d, anep::HEADER_LEN, n, now_ms) {
        Ok(total) => Some(Data::Arena(start..start + total)),
        Err(_) => {
            arena.truncate(start);
            None
        }
    }
}
