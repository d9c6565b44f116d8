//! The node's side of SANE: maps the security layer's peers to neighbour
//! addresses, endpoints and interfaces, frames handshake messages and
//! protected packets in ANEP, and turns rejections into drop counters.
//!
//! ```text
//! HANDSHAKE ──► Links::handle_handshake ──► replies, SAs
//! AUTH/ESP  ──► Links::open (in place) ──► inner ANEP datagram ──► the node as before
//! other     ──► drop (non_neighbor)
//! every transmission ──► Links::seal for the next hop's SA ──► AUTH/ESP datagram
//! ```

use crate::anep;
use crate::config::{ConfigError, KeyField, ModeField, NodeConfig, parse_key, parse_mode};
use crate::counters::Drop;
use anode_sec::links::Stats;
use anode_sec::{HsReject, Identity, Lifetime, Links, LinksConfig, Mode, PeerConfig, RateLimit, Reject};
use core::net::{Ipv4Addr, SocketAddr};

/// What the daemon hands the node when security is on.
#[derive(Debug, Clone)]
pub struct SecurityInit {
    /// The node's identity (from its key file).
    pub identity: Identity,
    /// Unix time in ms when `now_ms` was 0 (handshake timestamps).
    pub unix_ms_at_zero: u64,
}

/// ANEP type id of a protected datagram in `mode`.
pub fn type_of(mode: Mode) -> u16 {
    match mode {
        Mode::Authenticate => anep::TYPE_AUTH,
        Mode::Encrypt => anep::TYPE_ESP,
    }
}

pub(crate) struct Guard {
    pub links: Links,
    peer_of_endpoint: crate::FastMap<SocketAddr, usize>,
    addr_of_peer: Vec<Option<Ipv4Addr>>,
    iface_of_endpoint: crate::FastMap<SocketAddr, usize>,
    pub outs: Vec<anode_sec::Output>,
}

impl core::fmt::Debug for Guard {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Guard").field("links", &self.links).finish_non_exhaustive()
    }
}

impl Guard {
    pub fn new(cfg: &NodeConfig, init: SecurityInit, now_ms: u64) -> Result<Guard, ConfigError> {
        let Some(sec) = cfg.security.as_ref() else { return Err(ConfigError::MissingKeyFile) };
        let default = sec.default_mode()?;
        let mut peers = Vec::new();
        let mut addr_of_peer = Vec::new();
        let mut iface_of_endpoint = crate::FastMap::default();
        for (i, iface) in cfg.interfaces.iter().enumerate() {
            for n in &iface.neighbors {
                let k = n.key.as_deref().ok_or(ConfigError::MissingNeighborKey(n.address))?;
                let key = parse_key(KeyField::Neighbor(n.address), k)?;
                let mode = parse_mode(ModeField::Neighbor(n.address), n.mode.as_deref(), default)?;
                peers.push(PeerConfig { key, endpoint: n.endpoint, mode });
                addr_of_peer.push(Some(n.address));
                iface_of_endpoint.insert(n.endpoint, i);
            }
        }
        let mut users = Vec::new();
        for (i, u) in sec.users.iter().enumerate() {
            users.push(parse_key(KeyField::User(i), u)?);
            addr_of_peer.push(None);
        }
        let lc = LinksConfig {
            peers,
            users,
            user_mode: default,
            lifetime: Lifetime {
                rekey_after_ms: sec.rekey_after_secs.saturating_mul(1000),
                reject_after_ms: sec.reject_after_secs.saturating_mul(1000),
                rekey_after_packets: sec.rekey_after_packets,
                grace_ms: sec.grace_ms,
                ..Lifetime::default()
            },
            unix_offset_ms: init.unix_ms_at_zero,
            max_clock_skew_ms: sec.max_clock_skew_secs.saturating_mul(1000),
            rate: RateLimit {
                per_source_per_sec: sec.handshake_rate,
                per_source_burst: sec.handshake_rate.saturating_mul(2),
                ..RateLimit::default()
            },
            ..LinksConfig::default()
        };
        let links = Links::new(init.identity, lc, now_ms)?;
        let peer_of_endpoint = (0..links.peer_count())
            .filter_map(|p| links.endpoint_of(p).map(|e| (e, p)))
            .collect::<crate::FastMap<_, _>>();
        Ok(Guard { links, peer_of_endpoint, addr_of_peer, iface_of_endpoint, outs: Vec::new() })
    }

    /// Remembers where a user (Noise XX) connected from, so replies to it
    /// are sealed for its SA and sent on the interface it came in on.
    pub fn learn_endpoint(&mut self, peer: usize, iface: Option<usize>) {
        if let Some(ep) = self.links.endpoint_of(peer) {
            self.peer_of_endpoint.entry(ep).or_insert(peer);
            if let Some(i) = iface {
                self.iface_of_endpoint.entry(ep).or_insert(i);
            }
        }
    }

    /// The neighbour (peer index) at `endpoint`.
    pub fn peer_at(&self, endpoint: &SocketAddr) -> Option<usize> {
        self.peer_of_endpoint.get(endpoint).copied()
    }

    /// Interface toward `endpoint`, if it is a neighbour's.
    pub fn iface_of(&self, endpoint: &SocketAddr) -> Option<usize> {
        self.iface_of_endpoint.get(endpoint).copied()
    }

    /// The status section of `anode status`.
    pub fn to_json(&self, now_ms: u64) -> serde_json::Value {
        use serde_json::json;
        let peers: Vec<_> = self
            .links
            .status(now_ms)
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                json!({
                    "address": self.addr_of_peer.get(i).copied().flatten().map(|a| a.to_string()),
                    "kind": format!("{:?}", p.kind).to_lowercase(),
                    "fingerprint": p.key.map(|k| k.fingerprint().to_string()),
                    "endpoint": p.endpoint.map(|e| e.to_string()),
                    "mode": p.mode.name(),
                    "up": p.up,
                    "handshaking": p.handshaking,
                    "pattern": p.pattern,
                    "out_spi": p.out_spi.map(|s| format!("{s:08x}")),
                    "in_spi": p.in_spi.map(|s| format!("{s:08x}")),
                    "sa_age_ms": p.sa_age_ms,
                    "tx_packets": p.tx_packets,
                    "rx_packets": p.rx_packets,
                    "handshakes": p.handshakes,
                })
            })
            .collect();
        let Stats { initiated, completed_ik, completed_xx, rekeys, timeouts, yielded, expired, cookies_sent } =
            self.links.stats;
        json!({
            "identity": self.links.public().fingerprint().to_string(),
            "public_key": self.links.public().to_string(),
            "peers": peers,
            "handshakes": {"initiated": initiated, "completed_ik": completed_ik, "completed_xx": completed_xx,
                           "rekeys": rekeys, "timeouts": timeouts, "yielded": yielded, "expired_sas": expired,
                           "cookies_sent": cookies_sent},
        })
    }

    /// A line for the log about an established SA.
    pub fn describe(&self, peer: usize, rekey: bool) -> String {
        let who = match (self.addr_of_peer.get(peer).copied().flatten(), self.links.key_of(peer)) {
            (Some(a), Some(k)) => format!("neighbour {a} ({})", k.fingerprint()),
            (None, Some(k)) => format!("user {}", k.fingerprint()),
            _ => format!("peer {peer}"),
        };
        format!("{} with {who}, {}", if rekey { "rekeyed" } else { "link up" }, self.links.mode(peer).name())
    }
}

/// The drop counter for a rejected protected datagram.
pub fn drop_of_reject(r: Reject) -> Drop {
    match r {
        Reject::Truncated => Drop::AuthTruncated,
        Reject::UnknownSpi => Drop::AuthUnknownSpi,
        Reject::Expired => Drop::AuthExpiredSa,
        Reject::Replay => Drop::AuthReplay,
        Reject::BeyondWindow => Drop::AuthBeyondWindow,
        Reject::TagMismatch => Drop::AuthTagMismatch,
        _ => Drop::AuthModeTooWeak,
    }
}

/// The drop counter for a rejected handshake message.
pub fn drop_of_handshake(r: HsReject) -> Drop {
    match r {
        HsReject::Malformed(_) => Drop::HandshakeMalformed,
        HsReject::RateLimited => Drop::HandshakeRateLimited,
        HsReject::Replay => Drop::HandshakeReplay,
        HsReject::Stale => Drop::HandshakeStale,
        HsReject::UnknownKey => Drop::NonNeighbor,
        HsReject::Unexpected => Drop::HandshakeUnexpected,
        HsReject::BadCookie => Drop::HandshakeBadCookie,
        _ => Drop::HandshakeFailed,
    }
}
