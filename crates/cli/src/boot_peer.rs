//! Boot recovery from a peer node over a security association (SANE §4.1,
//! AEGIS's `Recover` against a trusted repository reached by a secure
//! protocol): a [`Source`] that carries each recovery message as a
//! `CONTROL` body `0x21 ‖ message` inside an SA with the peer, which
//! answers from the repository it serves (`anode node --recovery-repo`).
//!
//! This is a short-lived client SA, as `anode module load` uses
//! (`sa_client`), opened from the process that boots, before the node's own
//! SAs exist. The copy a peer sends is verified against the signed metadata
//! like any other, so the SA is for privacy and for the peer to know who
//! asks, not for trust in the bytes.

use anode_boot::Source;
use anode_boot::recovery::{Repr, parse};
use anode_node::core::RECOVERY_OP;
use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::{Identity, Links, LinksConfig, Mode, Output, PublicKey};
use anode_wire::anep;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// An open SA with the peer.
struct Conn {
    links: Links,
    peer: usize,
    sock: UdpSocket,
    t0: Instant,
}

/// A peer node serving boot recovery over an SA.
pub struct PeerSource {
    addr: SocketAddr,
    expect: Option<PublicKey>,
    who: Identity,
    wait: Duration,
    conn: Option<Conn>,
    buf: Vec<u8>,
}

impl core::fmt::Debug for PeerSource {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PeerSource").field("addr", &self.addr).field("up", &self.conn.is_some()).finish()
    }
}

impl PeerSource {
    /// The peer at UDP endpoint `addr` (its key `expect`ed, if given),
    /// asked as `who` (a key the peer lists among its users); each request
    /// waits at most `wait` for its answer, and the handshake at most `wait`
    /// too.
    pub fn new(addr: SocketAddr, expect: Option<PublicKey>, who: Identity, wait: Duration) -> PeerSource {
        PeerSource { addr, expect, who, wait, conn: None, buf: vec![0; 65_536] }
    }

    fn now_ms(c: &Conn) -> u64 {
        c.t0.elapsed().as_millis() as u64
    }

    /// Opens the SA: a Noise handshake, bounded by `wait`.
    fn connect(&mut self) -> Result<(), String> {
        // The SA's state takes an identity of its own (a copy, zeroized
        // with it).
        let me = Identity::parse(&self.who.to_file_text()).map_err(|e| e.to_string())?;
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .map_err(|e| e.to_string())?;
        let mut links = Links::new(me, LinksConfig { unix_offset_ms: unix, ..LinksConfig::default() }, 0)
            .map_err(|e| e.to_string())?;
        let peer = links.connect(self.addr, self.expect, Mode::Encrypt, 0);
        let sock = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_millis(20))).map_err(|e| e.to_string())?;
        let mut c = Conn { links, peer, sock, t0: Instant::now() };
        let deadline = Instant::now() + self.wait;
        let mut last = None;
        while Instant::now() < deadline {
            if c.links.is_up(c.peer) {
                self.conn = Some(c);
                return Ok(());
            }
            if let Err(e) = Self::pump(&mut c, &mut self.buf, &mut |_| {}) {
                last = Some(e);
            }
        }
        Err(last.unwrap_or_else(|| format!("no handshake with {} within {:?}", self.addr, self.wait)))
    }

    /// One round: timers, one datagram in (handshake, or an SA packet whose
    /// inner CONTROL payload goes to `on_control`), handshake messages out.
    fn pump(c: &mut Conn, buf: &mut [u8], on_control: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let mut out = Vec::new();
        let now = Self::now_ms(c);
        c.links.poll(now, &mut out);
        let mut err = None;
        if let Ok((n, from)) = c.sock.recv_from(buf)
            && let Some(d) = buf.get_mut(..n)
            && let Ok(a) = anep::Packet::new_checked(&*d)
        {
            let (type_id, ps) = (a.type_id(), a.payload_start());
            match type_id {
                anep::TYPE_HANDSHAKE => {
                    if let Some(m) = d.get(ps..)
                        && let Err(e) = c.links.handle_handshake(from, m, now, &mut out)
                    {
                        err = Some(e.to_string());
                    }
                }
                anep::TYPE_AUTH | anep::TYPE_ESP => {
                    if let Ok(o) = c.links.open(d, ps, type_id == anep::TYPE_ESP, now)
                        && let Some(inner) = d.get(o.inner)
                        && let Ok(ia) = anep::Packet::new_checked(inner)
                        && ia.type_id() == anep::TYPE_CONTROL
                    {
                        on_control(ia.payload());
                    }
                }
                _ => {}
            }
        }
        for o in out {
            if let Output::Handshake { to, msg, .. } = o {
                let _ = c.sock.send_to(&anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg), to);
            }
        }
        err.map_or(Ok(()), Err)
    }

    /// Sends `request` over the SA and waits for the reply with its id.
    fn ask(&mut self, request: &[u8]) -> Option<Vec<u8>> {
        let id = anode_boot::recovery::Message::new_checked(request).ok()?.id();
        let c = self.conn.as_mut()?;
        let inner =
            anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_CONTROL, &[&[RECOVERY_OP][..], request].concat());
        let mut d = vec![0u8; anep::HEADER_LEN + OVERHEAD + inner.len()];
        d.get_mut(anep::HEADER_LEN + AH_LEN..anep::HEADER_LEN + AH_LEN + inner.len())?.copy_from_slice(&inner);
        anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_ESP, AH_LEN + inner.len() + 16);
        let now = Self::now_ms(c);
        let len = c.links.seal(c.peer, &mut d, anep::HEADER_LEN, inner.len(), now).ok()?;
        c.sock.send_to(d.get(..len)?, self.addr).ok()?;
        let deadline = Instant::now() + self.wait;
        let mut answer = None;
        while answer.is_none() && Instant::now() < deadline {
            let _ = Self::pump(c, &mut self.buf, &mut |body| {
                if let Some((&RECOVERY_OP, reply)) = body.split_first()
                    && parse(reply).is_ok_and(|r| reply_id(&r) == id)
                {
                    answer = Some(reply.to_vec());
                }
            });
        }
        answer
    }
}

fn reply_id(r: &Repr<'_>) -> u32 {
    match *r {
        Repr::Fetch { id, .. } | Repr::Data { id, .. } | Repr::Error { id, .. } => id,
    }
}

impl Source for PeerSource {
    fn name(&self) -> String {
        format!("peer {}", self.addr)
    }

    fn exchange(&mut self, request: &[u8]) -> Option<Vec<u8>> {
        if self.conn.is_none()
            && let Err(e) = self.connect()
        {
            tracing::warn!(peer = %self.addr, "boot recovery: no SA with the peer: {e}");
            return None;
        }
        let r = self.ask(request);
        if r.is_none() {
            // The next request opens a new SA (the peer may have restarted).
            self.conn = None;
            tracing::warn!(peer = %self.addr, "boot recovery: no answer from the peer within {:?}", self.wait);
        }
        r
    }
}
