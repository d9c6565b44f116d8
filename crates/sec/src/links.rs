//! The sans-I/O security layer of a node: link keys with every configured
//! neighbour (SANE §4.6), Noise IK/XX handshakes, SAs with rekeying, and
//! per-packet protection. Datagrams and `now` in; handshake messages,
//! keepalives and opened packets out. The node owns the sockets.
//!
//! Per peer, three SA slots as in WireGuard: `current` (we send on it),
//! `previous` (the one it replaced, still accepted for a grace period so
//! packets in flight are not lost), and `next` (made by a handshake we
//! answered; it becomes current when the first packet arrives on it, which
//! proves the initiator holds the keys).

use crate::handshake::{self, Header, Kind, ParseError};
use crate::identity::{Identity, PublicKey, verify_binding};
use crate::sa::{Lifetime, Mode, OVERHEAD, Reject, Sa, SealError, spi_of};
use core::net::SocketAddr;
use core::ops::Range;
use snow::params::NoiseParams;
use std::collections::HashMap;
use zeroize::Zeroizing;

/// A configured neighbour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its identity.
    pub key: PublicKey,
    /// Its UDP endpoint.
    pub endpoint: SocketAddr,
    /// Protection required on the link.
    pub mode: Mode,
}

/// Handshake rate limits (token buckets, checked before any cryptography).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// First messages per second from one source address.
    pub per_source_per_sec: u32,
    /// Burst allowed from one source.
    pub per_source_burst: u32,
    /// First messages per second from all sources together.
    pub global_per_sec: u32,
    /// Global burst.
    pub global_burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit { per_source_per_sec: 10, per_source_burst: 20, global_per_sec: 500, global_burst: 1000 }
    }
}

/// Configuration of the security layer.
#[derive(Debug, Clone)]
pub struct LinksConfig {
    /// Configured neighbours: the only nodes accepted (topology freeze).
    pub peers: Vec<PeerConfig>,
    /// Users allowed to connect with Noise XX.
    pub users: Vec<PublicKey>,
    /// Protection for user links.
    pub user_mode: Mode,
    /// SA lifetimes.
    pub lifetime: Lifetime,
    /// Unix time in ms at `now_ms == 0` (handshake timestamps are wall clock).
    pub unix_offset_ms: u64,
    /// Handshake timestamps further than this from our clock are refused.
    pub max_clock_skew_ms: u64,
    /// Handshake rate limits.
    pub rate: RateLimit,
    /// First retry delay for an unanswered handshake (doubles each time).
    pub retry_initial_ms: u64,
    /// Largest retry delay.
    pub retry_max_ms: u64,
}

impl Default for LinksConfig {
    fn default() -> Self {
        LinksConfig {
            peers: Vec::new(),
            users: Vec::new(),
            user_mode: Mode::Authenticate,
            lifetime: Lifetime::default(),
            unix_offset_ms: 0,
            max_clock_skew_ms: 120_000,
            rate: RateLimit::default(),
            retry_initial_ms: 500,
            retry_max_ms: 16_000,
        }
    }
}

/// A configuration the security layer refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinksError {
    /// A peer has this node's own key.
    #[error("peer key {0} is this node's own key")]
    OwnKey(String),
    /// Two peers share a key.
    #[error("peer key {0} is listed twice")]
    DuplicateKey(String),
}

/// Why a handshake message was refused. Each is counted by the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HsReject {
    /// Malformed framing.
    #[error("malformed handshake: {0}")]
    Malformed(ParseError),
    /// Over the per-source or global rate.
    #[error("handshake rate limit")]
    RateLimited,
    /// Timestamp not newer than the last accepted from that peer.
    #[error("replayed handshake")]
    Replay,
    /// Timestamp too far from our clock.
    #[error("handshake timestamp outside the allowed clock skew")]
    Stale,
    /// A key that is not a configured neighbour or allowed user.
    #[error("handshake from a key that is not a configured neighbour or user")]
    UnknownKey,
    /// Noise refused the message (wrong key, tampering).
    #[error("handshake failed to decrypt or verify")]
    Decrypt,
    /// A response or third message for no handshake in progress.
    #[error("handshake message for no handshake in progress")]
    Unexpected,
    /// An XX first message whose cookie is wrong or too old.
    #[error("XX first message with a wrong or stale cookie")]
    BadCookie,
}

/// What the node must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a handshake message (the body of an ANEP `HANDSHAKE` datagram).
    Handshake {
        /// Destination.
        to: SocketAddr,
        /// The peer, if known.
        peer: Option<usize>,
        /// The message.
        msg: Vec<u8>,
    },
    /// Send an empty protected packet to `peer` to confirm a new SA.
    Keepalive {
        /// The peer.
        peer: usize,
    },
    /// An SA with `peer` was established.
    Established {
        /// The peer.
        peer: usize,
        /// Whether it replaced an earlier SA.
        rekey: bool,
    },
}

/// A verified packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The peer it came from.
    pub peer: usize,
    /// The inner packet in the buffer.
    pub inner: Range<usize>,
}

/// Kind of peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    /// A configured neighbour (IK, both directions).
    Neighbor,
    /// A user allowed to connect to us (XX responder).
    User,
    /// A node we contacted as a user (XX initiator).
    Remote,
}

/// Handshake and SA statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Handshakes we started (first messages sent, retries included).
    pub initiated: u64,
    /// Handshakes completed, IK.
    pub completed_ik: u64,
    /// Handshakes completed, XX.
    pub completed_xx: u64,
    /// Handshakes that replaced a working SA.
    pub rekeys: u64,
    /// Our handshakes that got no answer in time.
    pub timeouts: u64,
    /// Our first messages dropped in favour of the peer's (lower key wins).
    pub yielded: u64,
    /// SAs removed after expiry.
    pub expired: u64,
    /// Cookie replies sent to XX first messages without a cookie.
    pub cookies_sent: u64,
}

/// One peer's state, for `anode status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// Identity (None for a remote node not yet authenticated).
    pub key: Option<PublicKey>,
    /// Endpoint.
    pub endpoint: Option<SocketAddr>,
    /// Kind.
    pub kind: PeerKind,
    /// Required protection.
    pub mode: Mode,
    /// Whether an SA is usable for sending.
    pub up: bool,
    /// Handshake pattern of the current SA.
    pub pattern: Option<&'static str>,
    /// Outbound SPI of the current SA.
    pub out_spi: Option<u32>,
    /// Inbound SPI of the current SA.
    pub in_spi: Option<u32>,
    /// Age of the current SA (ms).
    pub sa_age_ms: Option<u64>,
    /// Packets sent on the current SA.
    pub tx_packets: u64,
    /// Packets accepted on the current SA.
    pub rx_packets: u64,
    /// Handshakes completed with this peer.
    pub handshakes: u64,
    /// Whether a handshake we started is in progress.
    pub handshaking: bool,
}

struct Pending {
    hs: snow::HandshakeState,
    local_spi: u32,
    sent_ms: u64,
    xx: bool,
    /// The first message as sent, to send again with a cookie.
    first: Vec<u8>,
    /// Whether it was sent again with a cookie (once per attempt).
    cookie_sent: bool,
}

struct Peer {
    key: Option<PublicKey>,
    x_pub: [u8; 32],
    endpoint: Option<SocketAddr>,
    mode: Mode,
    kind: PeerKind,
    current: Option<u32>,
    previous: Option<u32>,
    next: Option<u32>,
    /// Latest handshake timestamp accepted from this peer (µs).
    last_ts: u64,
    pending: Option<Pending>,
    next_attempt_ms: u64,
    attempts: u32,
    want: bool,
    handshakes: u64,
    expect: Option<PublicKey>,
}

impl Peer {
    /// A peer with no SAs and no handshake yet; the first attempt at
    /// `first_attempt_ms`.
    fn new(
        key: Option<PublicKey>,
        endpoint: Option<SocketAddr>,
        mode: Mode,
        kind: PeerKind,
        first_attempt_ms: u64,
    ) -> Peer {
        Peer {
            key,
            x_pub: key.map_or([0; 32], |k| k.x25519()),
            endpoint,
            mode,
            kind,
            current: None,
            previous: None,
            next: None,
            last_ts: 0,
            pending: None,
            next_attempt_ms: first_attempt_ms,
            attempts: 0,
            want: false,
            handshakes: 0,
            expect: None,
        }
    }
}

struct XxResponder {
    hs: snow::HandshakeState,
    from: SocketAddr,
    peer_spi: u32,
    created_ms: u64,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens_milli: u64,
    at_ms: u64,
}

impl Bucket {
    fn full(burst: u32, now: u64) -> Bucket {
        Bucket { tokens_milli: burst as u64 * 1000, at_ms: now }
    }
    fn take(&mut self, rate: u32, burst: u32, now: u64) -> bool {
        let dt = now.saturating_sub(self.at_ms);
        self.at_ms = now;
        self.tokens_milli = (self.tokens_milli + dt * rate as u64).min(burst as u64 * 1000);
        if self.tokens_milli >= 1000 {
            self.tokens_milli -= 1000;
            true
        } else {
            false
        }
    }
}

const MAX_XX_PENDING: usize = 64;
const MAX_SOURCES: usize = 4096;
const XX_PENDING_MS: u64 = 5_000;
/// How long expired SAs are remembered so late packets count as `expired`.
const EXPIRED_KEEP_MS: u64 = 60_000;

/// The security layer.
pub struct Links {
    id: Identity,
    x_secret: Zeroizing<[u8; 32]>,
    cfg: LinksConfig,
    ik: NoiseParams,
    xx: NoiseParams,
    peers: Vec<Peer>,
    /// By SPI. The node picks its SPIs at random, so a lookup for any
    /// arriving SPI walks only the node's own keys: seeded foldhash, not
    /// SipHash (per packet, on the receive path).
    sas: HashMap<u32, Sa, foldhash::fast::RandomState>,
    xx_pending: HashMap<u32, XxResponder>,
    sources: HashMap<SocketAddr, Bucket>,
    global: Bucket,
    last_ts_sent: u64,
    cookies: crate::cookie::Cookies,
    /// Statistics.
    pub stats: Stats,
}

impl core::fmt::Debug for Links {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Links").field("id", &self.id).field("peers", &self.peers.len()).finish_non_exhaustive()
    }
}

fn params(name: &str) -> NoiseParams {
    match name.parse() {
        Ok(p) => p,
        // Both names are constants this crate's tests parse.
        Err(_) => unreachable!("noise protocol name {name} does not parse"),
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // On failure the bytes stay zero and the caller retries with a counter.
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

impl Links {
    /// A security layer for `id` with these neighbours and users. With
    /// neighbours, the first [`poll`](Self::poll) starts a handshake with
    /// each (link keys at boot).
    pub fn new(id: Identity, cfg: LinksConfig, now_ms: u64) -> Result<Links, LinksError> {
        let me = id.public();
        let mut peers = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let all = cfg
            .peers
            .iter()
            .map(|p| (p.key, Some(p.endpoint), p.mode, PeerKind::Neighbor))
            .chain(cfg.users.iter().map(|k| (*k, None, cfg.user_mode, PeerKind::User)));
        for (key, endpoint, mode, kind) in all {
            if key == me {
                return Err(LinksError::OwnKey(key.fingerprint().to_string()));
            }
            if !seen.insert(key) {
                return Err(LinksError::DuplicateKey(key.fingerprint().to_string()));
            }
            // Both ends start at boot; the higher key waits one retry
            // interval so the lower key's handshake usually wins without a
            // collision (see `ik_respond`).
            let first_attempt = if key < me { now_ms + cfg.retry_initial_ms } else { now_ms };
            let mut p = Peer::new(Some(key), endpoint, mode, kind, first_attempt);
            p.want = kind == PeerKind::Neighbor;
            peers.push(p);
        }
        let x_secret = id.x25519_secret();
        let global = Bucket::full(cfg.rate.global_burst, now_ms);
        Ok(Links {
            id,
            x_secret,
            ik: params(handshake::IK),
            xx: params(handshake::XX),
            cfg,
            peers,
            sas: HashMap::default(),
            xx_pending: HashMap::new(),
            sources: HashMap::new(),
            global,
            last_ts_sent: 0,
            cookies: crate::cookie::Cookies::new(now_ms),
            stats: Stats::default(),
        })
    }

    /// This node's public key.
    pub fn public(&self) -> PublicKey {
        self.id.public()
    }

    /// Number of peers (neighbours, users, remotes).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The peer with this key.
    pub fn peer_of_key(&self, key: &PublicKey) -> Option<usize> {
        self.peers.iter().position(|p| p.key.as_ref() == Some(key))
    }

    /// A peer's key, once known.
    pub fn key_of(&self, peer: usize) -> Option<PublicKey> {
        self.peers.get(peer).and_then(|p| p.key)
    }

    /// A peer's endpoint, once known.
    pub fn endpoint_of(&self, peer: usize) -> Option<SocketAddr> {
        self.peers.get(peer).and_then(|p| p.endpoint)
    }

    /// A peer's required protection.
    pub fn mode(&self, peer: usize) -> Mode {
        self.peers.get(peer).map(|p| p.mode).unwrap_or(Mode::Encrypt)
    }

    /// Until when (ms) the holder of `key` has an SA with this node: the
    /// latest expiry of the SAs of every peer with that key, `None` if it
    /// has none. A user's SA lasts `reject_after` from its handshake; a
    /// new handshake makes a later one.
    pub fn sa_until(&self, key: &PublicKey) -> Option<u64> {
        self.sas
            .values()
            .filter(|sa| self.peers.get(sa.peer).is_some_and(|p| p.key.as_ref() == Some(key)))
            .map(|sa| sa.expire_at_ms)
            .max()
    }

    /// Whether `peer` has an SA to send on.
    pub fn is_up(&self, peer: usize) -> bool {
        self.peers.get(peer).and_then(|p| p.current).is_some()
    }

    /// A packet from `peer`'s endpoint named an SPI we do not know: if we
    /// have no SA with it (we restarted), handshake at the next poll rather
    /// than after the boot delay. Only the first attempt is hurried, so a
    /// forger cannot make us handshake faster than the backoff allows.
    pub fn kick(&mut self, peer: usize, now_ms: u64) {
        if let Some(p) = self.peers.get_mut(peer)
            && p.kind == PeerKind::Neighbor
            && p.current.is_none()
            && p.pending.is_none()
            && p.attempts == 0
        {
            p.next_attempt_ms = p.next_attempt_ms.min(now_ms);
        }
    }

    /// Starts an XX handshake with a node whose key we may not know (a
    /// user contacting a node). With `expect`, the node must prove that key.
    /// Returns the new peer's index.
    pub fn connect(&mut self, endpoint: SocketAddr, expect: Option<PublicKey>, mode: Mode, now_ms: u64) -> usize {
        let mut p = Peer::new(None, Some(endpoint), mode, PeerKind::Remote, now_ms);
        p.want = true;
        p.expect = expect;
        self.peers.push(p);
        self.peers.len() - 1
    }

    fn fresh_spi(&self) -> u32 {
        for i in 0..64u32 {
            let s = random_u32().wrapping_add(i);
            let used = s == 0
                || self.sas.contains_key(&s)
                || self.xx_pending.contains_key(&s)
                || self.peers.iter().any(|p| p.pending.as_ref().is_some_and(|q| q.local_spi == s));
            if !used {
                return s;
            }
        }
        // 64 collisions in a row: the RNG is broken. Fall back to a scan.
        (1..=u32::MAX).find(|s| !self.sas.contains_key(s) && !self.xx_pending.contains_key(s)).unwrap_or(1)
    }

    fn timestamp(&mut self, now_ms: u64) -> u64 {
        let wall = (now_ms + self.cfg.unix_offset_ms).saturating_mul(1000);
        self.last_ts_sent = wall.max(self.last_ts_sent + 1);
        self.last_ts_sent
    }

    /// Drives timers: starts handshakes with neighbours that lack an SA
    /// (with exponential backoff), rekeys SAs that we initiated when they
    /// reach their time or packet limit, gives up on unanswered
    /// handshakes, and forgets expired SAs.
    pub fn poll(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        let life = self.cfg.lifetime;
        // Expiry.
        let mut gone = Vec::new();
        for (spi, sa) in &self.sas {
            if now_ms >= sa.expire_at_ms.saturating_add(EXPIRED_KEEP_MS) {
                gone.push(*spi);
            }
        }
        for spi in gone {
            self.sas.remove(&spi);
            self.stats.expired += 1;
            for p in &mut self.peers {
                for slot in [&mut p.current, &mut p.previous, &mut p.next] {
                    if *slot == Some(spi) {
                        *slot = None;
                    }
                }
            }
        }
        self.xx_pending.retain(|_, x| now_ms < x.created_ms + XX_PENDING_MS);
        for i in 0..self.peers.len() {
            let p = &self.peers[i];
            if p.kind == PeerKind::User {
                continue;
            }
            // Has our handshake timed out?
            if let Some(pd) = &p.pending {
                let wait = self.backoff(p.attempts);
                if now_ms >= pd.sent_ms + wait {
                    self.peers[i].pending = None;
                    self.stats.timeouts += 1;
                } else {
                    continue;
                }
            }
            let p = &self.peers[i];
            let need = match p.current.and_then(|s| self.sas.get(&s)) {
                None => true,
                Some(sa) => {
                    now_ms >= sa.expire_at_ms
                        || (sa.initiator && now_ms >= sa.created_ms + life.rekey_after_ms)
                        || sa.tx_counter >= life.rekey_after_packets
                }
            };
            if (need || p.want) && now_ms >= p.next_attempt_ms {
                self.initiate(i, now_ms, out);
            }
        }
    }

    /// The earliest time [`poll`](Self::poll) has work: an SA to expire or
    /// forget, a responder state to drop, a handshake to time out, a first
    /// handshake, retry or rekey to start. `None`: nothing is scheduled.
    /// A caller that sleeps until then and polls loses no timer; a deadline
    /// already past means "now".
    pub fn poll_at(&self) -> Option<u64> {
        let life = self.cfg.lifetime;
        let mut at: Option<u64> = None;
        let mut when = |t: u64| at = Some(at.map_or(t, |a| a.min(t)));
        for sa in self.sas.values() {
            when(sa.expire_at_ms.saturating_add(EXPIRED_KEEP_MS));
        }
        for x in self.xx_pending.values() {
            when(x.created_ms + XX_PENDING_MS);
        }
        for p in &self.peers {
            if p.kind == PeerKind::User || p.endpoint.is_none() {
                continue;
            }
            if let Some(pd) = &p.pending {
                when(pd.sent_ms + self.backoff(p.attempts));
                continue;
            }
            let need_at = match p.current.and_then(|s| self.sas.get(&s)) {
                None => Some(0),
                _ if p.want => Some(0),
                Some(sa) => {
                    let mut t = sa.expire_at_ms;
                    if sa.initiator {
                        t = t.min(sa.created_ms + life.rekey_after_ms);
                    }
                    Some(t)
                }
            };
            if let Some(t) = need_at {
                when(t.max(p.next_attempt_ms));
            }
        }
        at
    }

    fn backoff(&self, attempts: u32) -> u64 {
        let shift = attempts.saturating_sub(1).min(16);
        (self.cfg.retry_initial_ms << shift).min(self.cfg.retry_max_ms)
    }

    fn initiate(&mut self, i: usize, now_ms: u64, out: &mut Vec<Output>) {
        // Whatever happens below, the next attempt waits: a failure to build
        // a handshake must not make `poll_at` say "now" again and again.
        let backoff = self.backoff(self.peers[i].attempts + 1);
        self.peers[i].next_attempt_ms = now_ms + backoff;
        let spi = self.fresh_spi();
        let ts = self.timestamp(now_ms);
        let p = &self.peers[i];
        let Some(to) = p.endpoint else { return };
        let xx = p.kind == PeerKind::Remote;
        let built = if xx {
            snow::Builder::new(self.xx.clone())
                .local_private_key(&self.x_secret[..])
                .and_then(|b| b.prologue(handshake::PROLOGUE))
                .and_then(|b| b.build_initiator())
        } else {
            snow::Builder::new(self.ik.clone())
                .local_private_key(&self.x_secret[..])
                .and_then(|b| b.remote_public_key(&p.x_pub))
                .and_then(|b| b.prologue(handshake::PROLOGUE))
                .and_then(|b| b.build_initiator())
        };
        let Ok(mut hs) = built else { return };
        let mut msg = vec![0u8; handshake::MAX_LEN];
        let kind = if xx { Kind::Xx1 } else { Kind::IkInit };
        Header { kind, sender: spi, receiver: 0 }.emit(&mut msg);
        let mut payload = [0u8; 12];
        payload[..8].copy_from_slice(&ts.to_be_bytes());
        payload[8..].copy_from_slice(&spi.to_be_bytes());
        let body: &[u8] = if xx { &[] } else { &payload };
        let Ok(n) = hs.write_message(body, &mut msg[handshake::HEADER_LEN..]) else { return };
        msg.truncate(handshake::HEADER_LEN + n);
        let attempts = self.peers[i].attempts + 1;
        let retry = self.backoff(attempts);
        let p = &mut self.peers[i];
        p.pending = Some(Pending { hs, local_spi: spi, sent_ms: now_ms, xx, first: msg.clone(), cookie_sent: false });
        p.attempts = attempts;
        p.next_attempt_ms = now_ms + retry;
        p.want = false;
        self.stats.initiated += 1;
        out.push(Output::Handshake { to, peer: Some(i), msg });
    }

    fn rate_ok(&mut self, from: SocketAddr, now_ms: u64) -> bool {
        let r = self.cfg.rate;
        if self.sources.len() >= MAX_SOURCES && !self.sources.contains_key(&from) {
            // Forget sources whose buckets have refilled; if none, all.
            let full = r.per_source_burst as u64 * 1000;
            self.sources
                .retain(|_, b| b.tokens_milli + now_ms.saturating_sub(b.at_ms) * (r.per_source_per_sec as u64) < full);
            if self.sources.len() >= MAX_SOURCES {
                self.sources.clear();
            }
        }
        let b = self.sources.entry(from).or_insert_with(|| Bucket::full(r.per_source_burst, now_ms));
        if !b.take(r.per_source_per_sec, r.per_source_burst, now_ms) {
            return false;
        }
        self.global.take(r.global_per_sec, r.global_burst, now_ms)
    }

    /// Handles a handshake message from `from`.
    pub fn handle_handshake(
        &mut self,
        from: SocketAddr,
        msg: &[u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), HsReject> {
        let (h, body) = Header::parse(msg).map_err(HsReject::Malformed)?;
        match h.kind {
            Kind::IkInit | Kind::Xx1 if !self.rate_ok(from, now_ms) => Err(HsReject::RateLimited),
            Kind::IkInit => self.ik_respond(h, body, now_ms, out),
            Kind::IkResp | Kind::Xx2 => self.initiator_finish(h, body, now_ms, out),
            Kind::Xx1 => self.xx_respond(from, h, body, now_ms, out),
            Kind::Xx3 => self.xx_finish(from, h, body, now_ms, out),
            Kind::Cookie => self.cookie_received(h, body, out),
        }
    }

    /// A cookie reply to our XX first message: send it again with the
    /// cookie appended (once per attempt, so forged replies cannot make us
    /// send more).
    fn cookie_received(&mut self, h: Header, cookie: &[u8], out: &mut Vec<Output>) -> Result<(), HsReject> {
        let i = self
            .peers
            .iter()
            .position(|p| p.pending.as_ref().is_some_and(|q| q.xx && !q.cookie_sent && q.local_spi == h.receiver))
            .ok_or(HsReject::Unexpected)?;
        let to = self.peers[i].endpoint.ok_or(HsReject::Unexpected)?;
        let pd = self.peers[i].pending.as_mut().ok_or(HsReject::Unexpected)?;
        pd.cookie_sent = true;
        let mut msg = pd.first.clone();
        msg.extend_from_slice(cookie);
        out.push(Output::Handshake { to, peer: Some(i), msg });
        Ok(())
    }

    fn check_ts(&self, peer: usize, ts: u64, now_ms: u64) -> Result<(), HsReject> {
        let wall = (now_ms + self.cfg.unix_offset_ms).saturating_mul(1000);
        if ts <= self.peers[peer].last_ts {
            return Err(HsReject::Replay);
        }
        if ts.abs_diff(wall) > self.cfg.max_clock_skew_ms.saturating_mul(1000) {
            return Err(HsReject::Stale);
        }
        Ok(())
    }

    fn ik_respond(&mut self, h: Header, body: &[u8], now_ms: u64, out: &mut Vec<Output>) -> Result<(), HsReject> {
        let mut hs = snow::Builder::new(self.ik.clone())
            .local_private_key(&self.x_secret[..])
            .and_then(|b| b.prologue(handshake::PROLOGUE))
            .and_then(|b| b.build_responder())
            .map_err(|_| HsReject::Decrypt)?;
        let mut payload = [0u8; handshake::MAX_LEN];
        let n = hs.read_message(body, &mut payload).map_err(|_| HsReject::Decrypt)?;
        let rs = hs.get_remote_static().ok_or(HsReject::Decrypt)?;
        let i = self
            .peers
            .iter()
            .position(|p| p.kind == PeerKind::Neighbor && p.x_pub[..] == *rs)
            .ok_or(HsReject::UnknownKey)?;
        if n != 12 {
            return Err(HsReject::Decrypt);
        }
        let ts = u64::from_be_bytes(payload[..8].try_into().map_err(|_| HsReject::Decrypt)?);
        let spi = u32::from_be_bytes(payload[8..12].try_into().map_err(|_| HsReject::Decrypt)?);
        if spi != h.sender {
            return Err(HsReject::Decrypt);
        }
        self.check_ts(i, ts, now_ms)?;
        self.peers[i].last_ts = ts;
        // Simultaneous initiations: the lower key keeps its own.
        if self.peers[i].pending.as_ref().is_some_and(|p| !p.xx)
            && self.peers[i].key.is_some_and(|k| k < self.id.public())
        {
            self.peers[i].pending = None;
            self.stats.yielded += 1;
        }
        let r_spi = self.fresh_spi();
        let mut msg = vec![0u8; handshake::MAX_LEN];
        Header { kind: Kind::IkResp, sender: r_spi, receiver: spi }.emit(&mut msg);
        let mut p2 = [0u8; 8];
        p2[..4].copy_from_slice(&r_spi.to_be_bytes());
        p2[4..].copy_from_slice(&spi.to_be_bytes());
        let n = hs.write_message(&p2, &mut msg[handshake::HEADER_LEN..]).map_err(|_| HsReject::Decrypt)?;
        msg.truncate(handshake::HEADER_LEN + n);
        let (k1, k2) = hs.dangerously_get_raw_split();
        let sa = Sa::new(i, r_spi, spi, k1, k2, false, now_ms, &self.cfg.lifetime, "IK").ok_or(HsReject::Decrypt)?;
        let rekey = self.peers[i].current.is_some();
        self.install_next(i, sa);
        self.stats.completed_ik += 1;
        let to = self.peers[i].endpoint.ok_or(HsReject::UnknownKey)?;
        out.push(Output::Handshake { to, peer: Some(i), msg });
        out.push(Output::Established { peer: i, rekey });
        Ok(())
    }

    fn initiator_finish(&mut self, h: Header, body: &[u8], now_ms: u64, out: &mut Vec<Output>) -> Result<(), HsReject> {
        let xx = h.kind == Kind::Xx2;
        let i = self
            .peers
            .iter()
            .position(|p| p.pending.as_ref().is_some_and(|q| q.local_spi == h.receiver && q.xx == xx))
            .ok_or(HsReject::Unexpected)?;
        let Some(mut pd) = self.peers[i].pending.take() else { return Err(HsReject::Unexpected) };
        let res = self.initiator_read(i, &mut pd, h, body, now_ms, out);
        if res.is_err() {
            // A forged response must not cancel our handshake.
            self.peers[i].pending = Some(pd);
        }
        res
    }

    fn initiator_read(
        &mut self,
        i: usize,
        pd: &mut Pending,
        h: Header,
        body: &[u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), HsReject> {
        let mut payload = [0u8; handshake::MAX_LEN];
        let n = pd.hs.read_message(body, &mut payload).map_err(|_| HsReject::Decrypt)?;
        let spis = if pd.xx { 96 } else { 0 };
        if n != spis + 8 {
            return Err(HsReject::Decrypt);
        }
        let r_spi = u32::from_be_bytes(payload[spis..spis + 4].try_into().map_err(|_| HsReject::Decrypt)?);
        let i_spi = u32::from_be_bytes(payload[spis + 4..spis + 8].try_into().map_err(|_| HsReject::Decrypt)?);
        if r_spi != h.sender || i_spi != pd.local_spi {
            return Err(HsReject::Decrypt);
        }
        let mut third = None;
        if pd.xx {
            let rs = pd.hs.get_remote_static().ok_or(HsReject::Decrypt)?;
            let binding: [u8; 96] = payload[..96].try_into().map_err(|_| HsReject::Decrypt)?;
            let key = verify_binding(&binding, rs).ok_or(HsReject::Decrypt)?;
            if self.peers[i].expect.is_some_and(|e| e != key) {
                return Err(HsReject::UnknownKey);
            }
            let mut p3 = [0u8; 104];
            p3[..96].copy_from_slice(&self.id.binding());
            p3[96..].copy_from_slice(&self.timestamp(now_ms).to_be_bytes());
            let mut msg = vec![0u8; handshake::MAX_LEN];
            Header { kind: Kind::Xx3, sender: pd.local_spi, receiver: r_spi }.emit(&mut msg);
            let n = pd.hs.write_message(&p3, &mut msg[handshake::HEADER_LEN..]).map_err(|_| HsReject::Decrypt)?;
            msg.truncate(handshake::HEADER_LEN + n);
            self.peers[i].key = Some(key);
            self.peers[i].x_pub = key.x25519();
            third = Some(msg);
        }
        let (k1, k2) = pd.hs.dangerously_get_raw_split();
        let pattern = if pd.xx { "XX" } else { "IK" };
        let sa = Sa::new(i, pd.local_spi, r_spi, k2, k1, true, now_ms, &self.cfg.lifetime, pattern)
            .ok_or(HsReject::Decrypt)?;
        if let (Some(msg), Some(to)) = (third, self.peers[i].endpoint) {
            out.push(Output::Handshake { to, peer: Some(i), msg });
        }
        let rekey = self.peers[i].current.is_some();
        self.sas.insert(sa.in_spi, sa);
        self.promote(i, pd.local_spi, now_ms);
        let p = &mut self.peers[i];
        p.attempts = 0;
        p.handshakes += 1;
        if pd.xx {
            self.stats.completed_xx += 1;
        } else {
            self.stats.completed_ik += 1;
        }
        if rekey {
            self.stats.rekeys += 1;
        }
        out.push(Output::Keepalive { peer: i });
        out.push(Output::Established { peer: i, rekey });
        Ok(())
    }

    fn xx_respond(
        &mut self,
        from: SocketAddr,
        h: Header,
        body: &[u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), HsReject> {
        if !self.peers.iter().any(|p| p.kind == PeerKind::User) {
            return Err(HsReject::UnknownKey);
        }
        // Anti-reflection: no Noise work and nothing larger than the request
        // until the source has shown it receives at its address.
        let (ephemeral, cookie) = match body.len() {
            32 => (body, None),
            n if n == 32 + crate::cookie::COOKIE_LEN => (&body[..32], Some(&body[32..])),
            n => return Err(HsReject::Malformed(ParseError::Truncated(handshake::HEADER_LEN + n))),
        };
        let Some(cookie) = cookie else {
            let mut msg = vec![0u8; handshake::HEADER_LEN];
            Header { kind: Kind::Cookie, sender: 0, receiver: h.sender }.emit(&mut msg);
            msg.extend_from_slice(&self.cookies.make(now_ms, from, h.sender, ephemeral));
            self.stats.cookies_sent += 1;
            out.push(Output::Handshake { to: from, peer: None, msg });
            return Ok(());
        };
        if !self.cookies.check(now_ms, from, h.sender, ephemeral, cookie) {
            return Err(HsReject::BadCookie);
        }
        let body = ephemeral;
        let mut hs = snow::Builder::new(self.xx.clone())
            .local_private_key(&self.x_secret[..])
            .and_then(|b| b.prologue(handshake::PROLOGUE))
            .and_then(|b| b.build_responder())
            .map_err(|_| HsReject::Decrypt)?;
        let mut payload = [0u8; handshake::MAX_LEN];
        hs.read_message(body, &mut payload).map_err(|_| HsReject::Decrypt)?;
        let r_spi = self.fresh_spi();
        let mut p2 = [0u8; 104];
        p2[..96].copy_from_slice(&self.id.binding());
        p2[96..100].copy_from_slice(&r_spi.to_be_bytes());
        p2[100..].copy_from_slice(&h.sender.to_be_bytes());
        let mut msg = vec![0u8; handshake::MAX_LEN];
        Header { kind: Kind::Xx2, sender: r_spi, receiver: h.sender }.emit(&mut msg);
        let n = hs.write_message(&p2, &mut msg[handshake::HEADER_LEN..]).map_err(|_| HsReject::Decrypt)?;
        msg.truncate(handshake::HEADER_LEN + n);
        if self.xx_pending.len() >= MAX_XX_PENDING
            && let Some(oldest) = self.xx_pending.iter().min_by_key(|(_, x)| x.created_ms).map(|(k, _)| *k)
        {
            self.xx_pending.remove(&oldest);
        }
        self.xx_pending.insert(r_spi, XxResponder { hs, from, peer_spi: h.sender, created_ms: now_ms });
        out.push(Output::Handshake { to: from, peer: None, msg });
        Ok(())
    }

    fn xx_finish(
        &mut self,
        from: SocketAddr,
        h: Header,
        body: &[u8],
        now_ms: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), HsReject> {
        match self.xx_pending.get(&h.receiver) {
            Some(x) if x.from == from && x.peer_spi == h.sender => {}
            _ => return Err(HsReject::Unexpected),
        }
        let Some(mut x) = self.xx_pending.remove(&h.receiver) else { return Err(HsReject::Unexpected) };
        let mut payload = [0u8; handshake::MAX_LEN];
        let n = x.hs.read_message(body, &mut payload).map_err(|_| HsReject::Decrypt)?;
        if n != 104 {
            return Err(HsReject::Decrypt);
        }
        let rs = x.hs.get_remote_static().ok_or(HsReject::Decrypt)?;
        let binding: [u8; 96] = payload[..96].try_into().map_err(|_| HsReject::Decrypt)?;
        let key = verify_binding(&binding, rs).ok_or(HsReject::Decrypt)?;
        let i = self
            .peers
            .iter()
            .position(|p| p.kind == PeerKind::User && p.key == Some(key))
            .ok_or(HsReject::UnknownKey)?;
        let ts = u64::from_be_bytes(payload[96..104].try_into().map_err(|_| HsReject::Decrypt)?);
        self.check_ts(i, ts, now_ms)?;
        self.peers[i].last_ts = ts;
        self.peers[i].endpoint = Some(from);
        let (k1, k2) = x.hs.dangerously_get_raw_split();
        let sa = Sa::new(i, h.receiver, h.sender, k1, k2, false, now_ms, &self.cfg.lifetime, "XX")
            .ok_or(HsReject::Decrypt)?;
        let rekey = self.peers[i].current.is_some();
        self.install_next(i, sa);
        self.stats.completed_xx += 1;
        out.push(Output::Established { peer: i, rekey });
        Ok(())
    }

    /// Installs a responder-side SA in the `next` slot.
    fn install_next(&mut self, i: usize, sa: Sa) {
        let spi = sa.in_spi;
        self.sas.insert(spi, sa);
        if let Some(old) = self.peers[i].next.replace(spi) {
            self.sas.remove(&old);
        }
        self.peers[i].handshakes += 1;
    }

    /// Makes `spi` the SA we send on; the one it replaces stays for the
    /// grace period.
    fn promote(&mut self, i: usize, spi: u32, now_ms: u64) {
        let grace = self.cfg.lifetime.grace_ms;
        let p = &mut self.peers[i];
        if p.current == Some(spi) {
            return;
        }
        // A working SA: the next handshake (a rekey) need not wait out the
        // retry backoff of earlier attempts.
        p.next_attempt_ms = now_ms;
        if p.next == Some(spi) {
            p.next = None;
        }
        let old_prev = p.previous.take();
        if let Some(old) = p.current.replace(spi) {
            p.previous = Some(old);
            if let Some(sa) = self.sas.get_mut(&old) {
                sa.expire_at_ms = sa.expire_at_ms.min(now_ms + grace);
            }
        }
        if let Some(old) = old_prev
            && Some(old) != self.peers[i].current
        {
            self.sas.remove(&old);
        }
    }

    /// Protects an inner packet for `peer`: see [`Sa::seal`] for the layout
    /// of `buf`. Returns the datagram length.
    pub fn seal(&mut self, peer: usize, buf: &mut [u8], hdr: usize, n: usize, now_ms: u64) -> Result<usize, SealError> {
        let life = self.cfg.lifetime;
        let Some(p) = self.peers.get_mut(peer) else { return Err(SealError::NoSa) };
        let mode = p.mode;
        let Some(sa) = p.current.and_then(|s| self.sas.get_mut(&s)) else {
            p.want = true;
            return Err(SealError::NoSa);
        };
        if now_ms >= sa.expire_at_ms || sa.tx_counter >= life.reject_after_packets {
            p.current = None;
            p.want = true;
            return Err(SealError::NoSa);
        }
        if sa.tx_counter + 1 >= life.rekey_after_packets {
            p.want = true;
        }
        sa.seal(buf, hdr, n, mode)
    }

    /// Verifies (and decrypts) a protected datagram in place; `buf[..hdr]`
    /// is its outer ANEP header and `encrypted` what its type id says.
    pub fn open(&mut self, buf: &mut [u8], hdr: usize, encrypted: bool, now_ms: u64) -> Result<Opened, Reject> {
        if buf.len() < hdr + OVERHEAD {
            return Err(Reject::Truncated);
        }
        let spi = spi_of(buf, hdr).ok_or(Reject::Truncated)?;
        let Some(sa) = self.sas.get_mut(&spi) else { return Err(Reject::UnknownSpi) };
        let peer = sa.peer;
        let required = self.peers.get(peer).map(|p| p.mode).unwrap_or(Mode::Encrypt);
        if required == Mode::Encrypt && !encrypted {
            return Err(Reject::ModeTooWeak);
        }
        let was_confirmed = sa.confirmed;
        let inner = sa.open(buf, hdr, if encrypted { Mode::Encrypt } else { Mode::Authenticate }, now_ms)?;
        if !was_confirmed {
            self.promote(peer, spi, now_ms);
        }
        // A user who encrypts gets encrypted answers, whatever the node's
        // default for users: the modes of the two ends then agree (a user
        // tool that insists on encryption would drop authenticate-only
        // answers). Only after the tag verified, and never downwards.
        if encrypted
            && let Some(p) = self.peers.get_mut(peer)
            && p.kind != PeerKind::Neighbor
        {
            p.mode = Mode::Encrypt;
        }
        Ok(Opened { peer, inner })
    }

    /// Per-peer state for `anode status`.
    pub fn status(&self, now_ms: u64) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let sa = p.current.and_then(|s| self.sas.get(&s));
                PeerStatus {
                    key: p.key,
                    endpoint: p.endpoint,
                    kind: p.kind,
                    mode: p.mode,
                    up: sa.is_some_and(|s| now_ms < s.expire_at_ms),
                    pattern: sa.map(|s| s.pattern),
                    out_spi: sa.map(|s| s.out_spi),
                    in_spi: sa.map(|s| s.in_spi),
                    sa_age_ms: sa.map(|s| now_ms.saturating_sub(s.created_ms)),
                    tx_packets: sa.map(|s| s.tx_counter).unwrap_or(0),
                    rx_packets: sa.map(|s| s.rx_packets).unwrap_or(0),
                    handshakes: p.handshakes,
                    handshaking: p.pending.is_some(),
                }
            })
            .collect()
    }

    /// Number of live SAs (all slots, all peers).
    pub fn sa_count(&self) -> usize {
        self.sas.len()
    }
}
