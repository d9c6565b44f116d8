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
                    out.transmits.push(Transmit { iface, to, data, owner: Owner::System });
                }
                anode_sec::Output::Keepalive { peer } => {
                    let Some(to) = g.links.endpoint_of(peer) else { continue };
                    let Some(iface) = g.iface_of(&to).or(rx_iface) else { continue };
                    if let Some(data) = seal_into(g, peer, &mut out.arena, Inner::Empty, now_ms) {
                        self.counters.keepalives_tx += 1;
                        out.transmits.push(Transmit { iface, to, data, owner: Owner::System });
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

    /// Protects the transmissions from index `mark` on for their next hop
    /// (hop by hop, SANE §4.6). Those without an SA are dropped (`no_sa`).
    pub(super) fn protect(&mut self, buf: &[u8], out: &mut Outbox, mark: usize, now_ms: u64) {
        self.capture_out(buf, out, mark);
        let Some(g) = self.sec.as_mut() else { return };
        let mut keep = mark;
        for i in mark..out.transmits.len() {
            let t = out.transmits[i].clone();
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
    use anode_sec::sa::{AH_LEN, TAG_LEN};
    let start = arena.len();
    arena.resize(start + anep::HEADER_LEN + AH_LEN, 0);
    match inner {
        Inner::Empty => {}
        Inner::Bytes(b) => arena.extend_from_slice(b),
        Inner::Arena(r) if r.end <= start => arena.extend_from_within(r),
        Inner::Arena(_) => {}
    }
    let n = arena.len() - (start + anep::HEADER_LEN + AH_LEN);
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
