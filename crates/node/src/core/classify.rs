//! Classification: every received datagram passes here once. Each header
//! is checked once, where it is first read, and what the check found (a
//! [`Frame`]) is handed down; nothing downstream parses it again.
//!
//! ```text
//! datagram ─► outer ANEP check (Frame) ─┬─ security off ─► dispatch(Frame)
//!                                       └─ security on: HANDSHAKE ─► key establishment
//!                                                       AUTH/ESP ─► verify, open in place
//!                                                           ─► inner ANEP check (Frame) ─► control │ domain │ dispatch
//!                                                       DOMAIN ─► ticket or attachment check (core::domain)
//!                                                       other ─► drop(non_neighbor)
//! dispatch: SNAP ─► data::run_snap │ plain ─► data::plain │ capsule ─► sandbox │ other ─► pass on │ drop
//! ```

use super::{Data, Node, Outbox, Owner};
use crate::counters::Drop;
use crate::secure;
use anode_wire::anep;
use core::net::{Ipv4Addr, SocketAddr};

/// A checked ANEP datagram inside the receive buffer: where it is and what
/// its header said. Made only by [`Node::frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    /// First byte of the ANEP header.
    pub base: usize,
    /// First byte of the payload (after the header and its options).
    pub payload: usize,
    /// One past the last byte.
    pub end: usize,
    /// The type id.
    pub type_id: u16,
    /// The "discard if unknown" flag.
    pub discard: bool,
}

impl Node {
    /// Handles one received datagram in `buf[..len]` from interface `iface`.
    ///
    /// `buf` should be [`recv_buffer_len`](super::recv_buffer_len) long so
    /// SNAP packets execute in place; a shorter buffer works but copies.
    /// Results go to `out`, which is not cleared first.
    pub fn handle_datagram(&mut self, iface: usize, buf: &mut [u8], len: usize, now_ms: u64, out: &mut Outbox) {
        self.handle_datagram_from(iface, None, buf, len, now_ms, out);
    }

    /// [`handle_datagram`](Self::handle_datagram) with the sender's
    /// address, which handshakes from users need for the reply and the
    /// handshake rate limit keys on.
    pub fn handle_datagram_from(
        &mut self,
        iface: usize,
        from: Option<SocketAddr>,
        buf: &mut [u8],
        len: usize,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        self.set_now(now_ms);
        let len = len.min(buf.len());
        if let Some(c) = self.counters.ifaces.get_mut(iface) {
            c.rx_packets += 1;
            c.rx_bytes += len as u64;
        }
        let Some(f) = self.frame(buf, 0, len) else { return };
        if self.sec.is_none() {
            self.tap_packet(iface, from, &buf[f.base..f.end], now_ms);
            self.capture_in(iface, from, &buf[f.base..f.end]);
            let mark = out.transmits.len();
            let prev = from.and_then(|f| self.ep_addr.get(&f).copied());
            self.dispatch(prev, buf, f, out);
            self.drain_loopback(now_ms, out);
            self.capture_out(buf, out, mark);
            return;
        }
        match f.type_id {
            anep::TYPE_HANDSHAKE => {
                out.system = true;
                self.handshake(iface, from, &buf[f.payload..f.end], now_ms, out)
            }
            anep::TYPE_AUTH | anep::TYPE_ESP => self.protected(iface, from, buf, f, now_ms, out),
            anep::TYPE_DOMAIN => {
                // Authenticated by its ticket or attachment, not by an SA.
                let mark = out.transmits.len();
                self.capture_in(iface, from, &buf[f.base..f.end]);
                self.domain_datagram(None, buf, f, now_ms, out);
                self.protect(buf, out, mark, now_ms);
            }
            _ => self.counters.drop(Drop::NonNeighbor),
        }
    }

    /// Checks the ANEP datagram at `buf[base..end]`, counting the drop
    /// reason if it is bad. The only place an ANEP header is parsed.
    pub(super) fn frame(&mut self, buf: &[u8], base: usize, end: usize) -> Option<Frame> {
        let bytes = buf.get(base..end).unwrap_or(&[]);
        match anep::Packet::new_checked(bytes) {
            Ok(p) => Some(Frame {
                base,
                payload: base + p.payload_start(),
                end,
                type_id: p.type_id(),
                discard: p.discard_if_unknown(),
            }),
            Err(e) => {
                self.counters.drop(match e {
                    anep::Error::Truncated(_) => Drop::AnepTruncated,
                    anep::Error::BadVersion(_) => Drop::AnepBadVersion,
                    anep::Error::BadHeaderLength { .. } | anep::Error::BadPacketLength { .. } => Drop::AnepBadLength,
                    _ => Drop::AnepBadOption,
                });
                None
            }
        }
    }

    /// A handshake message: key establishment, then its answers.
    fn handshake(&mut self, iface: usize, from: Option<SocketAddr>, msg: &[u8], now_ms: u64, out: &mut Outbox) {
        let Some(g) = self.sec.as_mut() else { return };
        let src = from.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut outs = std::mem::take(&mut g.outs);
        outs.clear();
        match g.links.handle_handshake(src, msg, now_ms, &mut outs) {
            Ok(()) => self.counters.handshakes_rx += 1,
            Err(e) => self.counters.drop(secure::drop_of_handshake(e)),
        }
        self.emit_security(&mut outs, Some(iface), now_ms, out);
        if let Some(g) = self.sec.as_mut() {
            g.outs = outs;
        }
    }

    /// A protected datagram: verified (and decrypted) in place, then its
    /// inner datagram is checked once and handled.
    fn protected(
        &mut self,
        iface: usize,
        from: Option<SocketAddr>,
        buf: &mut [u8],
        f: Frame,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let Some(g) = self.sec.as_mut() else { return };
        let mark = out.transmits.len();
        let enc = f.type_id == anep::TYPE_ESP;
        let opened = match g.links.open(&mut buf[..f.end], f.payload, enc, now_ms) {
            Ok(o) => o,
            Err(r) => {
                if r == anode_sec::Reject::UnknownSpi
                    && let Some(p) = from.and_then(|f| g.peer_at(&f))
                {
                    g.links.kick(p, now_ms);
                }
                self.counters.drop(secure::drop_of_reject(r));
                return;
            }
        };
        if opened.inner.is_empty() {
            out.system = true;
            self.counters.keepalives_rx += 1;
            return;
        }
        self.counters.rx_authenticated += 1;
        let principal = g.links.key_of(opened.peer);
        let endpoint = g.links.endpoint_of(opened.peer);
        let Some(inner) = self.frame(buf, opened.inner.start, opened.inner.end) else { return };
        self.capture_in(iface, from.or(endpoint), &buf[inner.base..inner.end]);
        if inner.type_id == anep::TYPE_CONTROL {
            out.system = true;
            self.control(principal, endpoint, iface, &buf[inner.payload..inner.end], now_ms, out);
        } else if self.bypasses_perimeter(principal.as_ref()) {
            return;
        } else if inner.type_id == anep::TYPE_DOMAIN {
            self.domain_datagram(principal, buf, inner, now_ms, out);
        } else {
            self.tap_packet(iface, from.or(endpoint), &buf[inner.base..inner.end], now_ms);
            let prev = endpoint.and_then(|e| self.ep_addr.get(&e).copied());
            self.dispatch(prev, buf, inner, out);
            self.drain_loopback(now_ms, out);
        }
        self.protect(buf, out, mark, now_ms);
    }

    /// Handles a checked ANEP datagram by its type id.
    pub(super) fn dispatch(&mut self, prev: Option<Ipv4Addr>, buf: &mut [u8], f: Frame, out: &mut Outbox) {
        match f.type_id {
            anep::TYPE_SNAP => {
                self.counters.rx_snap += 1;
                self.run_snap(buf, f.payload, f.end, out);
            }
            anep::TYPE_PLAIN => {
                self.counters.rx_plain += 1;
                self.plain(buf, f, out);
            }
            anep::TYPE_CAPSULE if self.modules.is_some() => {
                let now = self.now_ms;
                // A neighbour's refused capsule is counted by reason (status).
                let _ = self.capsule(prev.unwrap_or(Ipv4Addr::UNSPECIFIED), &buf[f.payload..f.end], now, out);
            }
            anep::TYPE_AUTH | anep::TYPE_ESP | anep::TYPE_HANDSHAKE if self.sec.is_some() => {
                // Nested in a verified datagram: not something to forward.
                self.counters.drop(Drop::NonNeighbor);
            }
            _ => {
                self.counters.rx_unknown += 1;
                let pass = if f.discard { None } else { self.env.default_via };
                match pass.and_then(|v| self.env.link.get(&v).copied()) {
                    Some((iface, to)) => {
                        self.counters.passed_on += 1;
                        out.transmits.push(super::Transmit {
                            iface,
                            to,
                            data: Data::Input(f.base..f.end),
                            owner: Owner::BestEffort,
                            unsealed: false,
                            flow: None,
                        });
                    }
                    None => self.counters.drop(Drop::UnknownType),
                }
            }
        }
    }
}
