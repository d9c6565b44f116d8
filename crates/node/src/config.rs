//! Node configuration and topology files (TOML), documented in
//! `docs/node.md` with an example in `examples/node/`.
//!
//! Parsing is separate from I/O: [`NodeConfig::from_toml`] and
//! [`Topology::from_toml`] take text; the daemon reads the files.

use core::net::{Ipv4Addr, SocketAddr};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// A configuration problem, with enough context to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The TOML does not parse or does not match the schema.
    #[error("{0}")]
    Syntax(toml::de::Error),
    /// A configuration could not be written as TOML.
    #[error("cannot write the configuration as TOML: {0}")]
    Serialize(toml::ser::Error),
    /// The node has no interfaces.
    #[error("no [[interface]] sections: a node needs at least one interface")]
    NoInterfaces,
    /// Two interfaces share a name or a listen address.
    #[error("interface {0:?} is defined twice (names and listen addresses must be unique)")]
    DuplicateInterface(String),
    /// A neighbour address appears twice.
    #[error("neighbour {0} is listed twice")]
    DuplicateNeighbor(Ipv4Addr),
    /// A neighbour uses the node's own address.
    #[error("neighbour {0} has this node's own address")]
    SelfNeighbor(Ipv4Addr),
    /// A static route goes via an address that is not a neighbour.
    #[error("route to {dest} goes via {via}, which is not a neighbour of this node")]
    ViaNotNeighbor {
        /// Route destination.
        dest: Ipv4Addr,
        /// The bad next hop.
        via: Ipv4Addr,
    },
    /// A `[local]` setting out of range.
    #[error("[local] {key} {reason}")]
    BadLocalSetting {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// `max_resource_bound` is 0 (no packet could ever run).
    #[error("max_resource_bound must be at least 1")]
    BadMaxResourceBound,
    /// The MTU is outside the supported range.
    #[error("mtu {0} outside 128..=8192")]
    BadMtu(usize),
    /// The link MTU is neither 0 (off) nor within 576..=65535.
    #[error("link_mtu {0}: 0 (off) or 576..=65535")]
    BadLinkMtu(usize),
    /// `[io] spin_us` is above [`MAX_SPIN_US`].
    #[error("[io] spin_us {0}: at most {MAX_SPIN_US}")]
    BadSpin(u64),
    /// `[io] workers` is above [`MAX_WORKERS`].
    #[error("[io] workers {0}: at most {MAX_WORKERS} (0: one per CPU)")]
    BadWorkers(usize),
    /// An interface's `rate_bps`, `tx_period_us` or `tx_queue_bytes` is
    /// out of range, or a rate is set with more than one data path worker.
    #[error("interface {name}: {reason}")]
    BadLinkRate {
        /// The interface.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// `[io] busy_poll_us` is above one second.
    #[error("[io] busy_poll_us {0}: at most 1000000")]
    BadBusyPoll(u32),
    /// A topology names a node that does not exist.
    #[error("topology link names unknown node {0:?}")]
    UnknownNode(String),
    /// A topology defines a node twice.
    #[error("topology defines node {0:?} twice")]
    DuplicateNode(String),
    /// Two topology nodes share an address.
    #[error("topology address {address} is used by both {first:?} and {second:?}")]
    DuplicateAddress {
        /// The address.
        address: Ipv4Addr,
        /// The node that has it first.
        first: String,
        /// The node that has it again.
        second: String,
    },
    /// A topology link joins a node to itself.
    #[error("topology link joins node {0:?} to itself")]
    SelfLink(String),
    /// A topology link appears twice (in either direction).
    #[error("topology link {0}-{1} is listed twice")]
    DuplicateLink(String, String),
    /// A neighbour's endpoint is one of this node's own listen addresses:
    /// everything sent to it would come straight back.
    #[error("neighbour {neighbor} has endpoint {endpoint}, which is this node's own listen address")]
    EndpointIsSelf {
        /// The neighbour.
        neighbor: Ipv4Addr,
        /// Its endpoint.
        endpoint: SocketAddr,
    },
    /// This node's address is not in the topology.
    #[error("this node's address {0} is not in the topology")]
    NotInTopology(Ipv4Addr),
    /// Security is on but a neighbour has no `key`.
    #[error("security is on but neighbour {0} has no `key` (its public key, from `anode keys show`)")]
    MissingNeighborKey(Ipv4Addr),
    /// A key in the config does not parse.
    #[error("{what}: {problem}")]
    BadKey {
        /// Which key.
        what: KeyField,
        /// Why.
        problem: KeyProblem,
    },
    /// A bad protection mode name.
    #[error("{what}: mode {mode:?} is neither \"authenticate\" nor \"encrypt\"")]
    BadMode {
        /// Where: the `[security]` section, or a neighbour.
        what: ModeField,
        /// The name given.
        mode: String,
    },
    /// The security layer refused the neighbours and users (its own key
    /// listed, or a key twice).
    #[error("[security]: {0}")]
    Links(#[from] anode_sec::links::LinksError),
    /// A resource-control setting of `[modules]` is invalid.
    #[error("[modules] {key}: {reason}")]
    Rcane {
        /// Which setting.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A `[[modules.session]]` is malformed.
    #[error("[[modules.session]] #{index}: {reason}")]
    StaticSession {
        /// Which one (from 0).
        index: usize,
        /// Why.
        reason: String,
    },
    /// A `[[modules.pod]]` is malformed.
    #[error("[[modules.pod]]: {0}")]
    Pod(String),
    /// The administrator key is not usable as a credential root.
    #[error("[modules] admin_key: {0}")]
    AdminRoot(anode_cred::CredError),
    /// The wasm engine could not be set up on this host.
    #[error("[modules]: {0}")]
    Sandbox(#[from] anode_sandbox::SetupError),
    /// Security is on but no key file is configured.
    #[error("security is on but [security] has no `key` (the node's secret key file, from `anode keys gen`)")]
    MissingKeyFile,
    /// Two neighbours share a key.
    #[error("neighbours {0} and {1} have the same key")]
    DuplicateNeighborKey(Ipv4Addr, Ipv4Addr),
    /// SA lifetimes out of order.
    #[error("[security] need 0 < rekey_after_secs < reject_after_secs (got {rekey} and {reject})")]
    BadLifetimes {
        /// `rekey_after_secs`.
        rekey: u64,
        /// `reject_after_secs`.
        reject: u64,
    },
    /// A `[security]` setting that must be positive is zero.
    #[error("[security] {0} must be positive")]
    ZeroSecuritySetting(&'static str),
    /// A `[monitor]` setting out of range.
    #[error("[monitor] {key} {reason}")]
    BadMonitorSetting {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// `[monitor] interfaces` names an interface the node does not have.
    #[error("[monitor] interfaces: no [[interface]] is named {0:?}")]
    MonitorUnknownInterface(String),
    /// A `[domain]` setting is invalid.
    #[error("[domain] {0}")]
    Domain(&'static str),
}

/// Which key of the configuration a [`ConfigError::BadKey`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyField {
    /// `[modules] admin_key`.
    AdminKey,
    /// A neighbour's `key`.
    Neighbor(Ipv4Addr),
    /// `[security] users[i]`.
    User(usize),
    /// `[[modules.session]]` number i's `principal`.
    SessionPrincipal(usize),
    /// `[monitor] admin_key`.
    MonitorAdminKey,
    /// `[domain] operator`.
    DomainOperator,
    /// `[domain] members`.
    DomainMember,
    /// `[domain.revoked] users`.
    DomainRevokedUser,
}

impl core::fmt::Display for KeyField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            KeyField::AdminKey => f.write_str("[modules] admin_key"),
            KeyField::Neighbor(a) => write!(f, "neighbour {a} key"),
            KeyField::User(i) => write!(f, "[security] users[{i}]"),
            KeyField::SessionPrincipal(i) => write!(f, "[[modules.session]] #{i} principal"),
            KeyField::MonitorAdminKey => f.write_str("[monitor] admin_key"),
            KeyField::DomainOperator => f.write_str("[domain] operator"),
            KeyField::DomainMember => f.write_str("[domain] members"),
            KeyField::DomainRevokedUser => f.write_str("[domain.revoked] users"),
        }
    }
}

/// Why a public key in the configuration does not parse; each carries the
/// key text (cut short) for the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyProblem {
    /// Not `anode-ed25519-public-v1 <64 hex digits>` (or the 64 digits alone).
    #[error("{0}: not an anode public key (expected `{tag} <64 hex digits>`)", tag = anode_sec::identity::PUBLIC_TAG)]
    Format(String),
    /// 32 bytes that are not an Ed25519 curve point.
    #[error("{0}: not a valid Ed25519 public key (not a curve point)")]
    NotOnCurve(String),
}

/// Which part of the configuration a [`ConfigError::BadMode`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModeField {
    /// `[security] mode`.
    Security,
    /// A neighbour's `mode`.
    Neighbor(Ipv4Addr),
}

impl core::fmt::Display for ModeField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ModeField::Security => f.write_str("[security]"),
            ModeField::Neighbor(a) => write!(f, "neighbour {a}"),
        }
    }
}

/// Parses a public key of the configuration, naming the key when it fails.
pub fn parse_key(what: KeyField, text: &str) -> Result<anode_sec::PublicKey, ConfigError> {
    anode_sec::PublicKey::parse(text).map_err(|e| {
        let problem = match e {
            anode_sec::KeyError::BadPoint(t) => KeyProblem::NotOnCurve(t),
            anode_sec::KeyError::Format { what, .. } => KeyProblem::Format(what),
            other => KeyProblem::Format(other.to_string()),
        };
        ConfigError::BadKey { what, problem }
    })
}

fn default_mtu() -> usize {
    anode_snap::vm::DEFAULT_MTU
}

/// Default [`NodeConfig::max_resource_bound`]: like IP's usual initial TTL,
/// enough for a traceroute of nine hops, and a packet's whole tree of
/// descendants then causes at most 64 transmissions network-wide.
pub const DEFAULT_MAX_RESOURCE_BOUND: u16 = 64;

fn default_max_rb() -> u16 {
    DEFAULT_MAX_RESOURCE_BOUND
}

fn is_zero(m: &usize) -> bool {
    *m == 0
}

fn is_default_mtu(m: &usize) -> bool {
    *m == default_mtu()
}

fn is_default_max_rb(r: &u16) -> bool {
    *r == DEFAULT_MAX_RESOURCE_BOUND
}

fn is_default_io(l: &IoConfig) -> bool {
    *l == IoConfig::default()
}

fn is_default_local(l: &LocalConfig) -> bool {
    *l == LocalConfig::default()
}

/// One neighbour on an interface.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NeighborConfig {
    /// The neighbour's overlay address.
    pub address: Ipv4Addr,
    /// Its UDP endpoint.
    pub endpoint: SocketAddr,
    /// Its public key (64 hex digits, or a public key file's text). Required
    /// when security is on: only these keys are accepted (topology freeze).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Protection of this link: "authenticate" or "encrypt" (default: the
    /// `[security] mode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// One interface: a UDP socket and the neighbours reached through it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    /// Interface name, for counters and logs.
    pub name: String,
    /// Local UDP address to bind.
    pub listen: SocketAddr,
    /// Neighbours reached through this interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbors: Vec<NeighborConfig>,
    /// The link's rate, bits/s: the node schedules and paces its
    /// transmissions on it (docs/rcane.md, "Transmit scheduling per link").
    /// None: sent as produced, no pacing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<u64>,
    /// The period of the guarantees that sessions' transmit reservations
    /// become on this link, µs (default 6000, the paper's 6 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_period_us: Option<u64>,
    /// Each client's transmit queue on this link, bytes (default 256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_queue_bytes: Option<u64>,
}

/// A static route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StaticRoute {
    /// Destination overlay address.
    pub dest: Ipv4Addr,
    /// Next hop: a neighbour's address.
    pub via: Ipv4Addr,
}

/// Routing configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesConfig {
    /// Static routes (take precedence over the topology).
    #[serde(default, rename = "static", skip_serializing_if = "Vec::is_empty")]
    pub static_routes: Vec<StaticRoute>,
    /// A topology file shared by all nodes; routes are its shortest paths.
    /// Relative paths are relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<PathBuf>,
    /// Next hop for destinations without a route, and for ANEP packets of
    /// unknown type whose flags say "pass on".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_via: Option<Ipv4Addr>,
}

/// The `[security]` section: SANE authentication between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// On unless set false (false is for baseline measurements only).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The node's secret key file (relative paths: to the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// Default protection of links: "encrypt" (default) or "authenticate".
    /// Encrypt is the default because it is also the faster: see
    /// docs/security.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Public keys of users allowed to connect with Noise XX.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Rekey an SA this node initiated after this many seconds.
    #[serde(default = "rekey_after_secs")]
    pub rekey_after_secs: u64,
    /// Never use an SA older than this (seconds).
    #[serde(default = "reject_after_secs")]
    pub reject_after_secs: u64,
    /// Rekey after sending this many packets on an SA.
    #[serde(default = "rekey_after_packets")]
    pub rekey_after_packets: u64,
    /// How long a replaced SA still accepts packets in flight (ms).
    #[serde(default = "grace_ms")]
    pub grace_ms: u64,
    /// Handshake first messages accepted per second from one source.
    #[serde(default = "handshake_rate")]
    pub handshake_rate: u32,
    /// Handshake timestamps further than this from our clock are refused (s).
    #[serde(default = "max_clock_skew_secs")]
    pub max_clock_skew_secs: u64,
}

fn yes() -> bool {
    true
}
fn rekey_after_secs() -> u64 {
    120
}
fn reject_after_secs() -> u64 {
    180
}
fn rekey_after_packets() -> u64 {
    1 << 60
}
fn grace_ms() -> u64 {
    10_000
}
fn handshake_rate() -> u32 {
    10
}
fn max_clock_skew_secs() -> u64 {
    120
}

/// Parses a protection mode name.
pub fn parse_mode(what: ModeField, m: Option<&str>, default: anode_sec::Mode) -> Result<anode_sec::Mode, ConfigError> {
    match m {
        None => Ok(default),
        Some("authenticate") => Ok(anode_sec::Mode::Authenticate),
        Some("encrypt") => Ok(anode_sec::Mode::Encrypt),
        Some(o) => Err(ConfigError::BadMode { what, mode: o.to_string() }),
    }
}

impl Default for SecurityConfig {
    /// Security on, every setting at its default, no key file yet.
    fn default() -> Self {
        SecurityConfig {
            enabled: true,
            key: None,
            mode: None,
            users: Vec::new(),
            rekey_after_secs: rekey_after_secs(),
            reject_after_secs: reject_after_secs(),
            rekey_after_packets: rekey_after_packets(),
            grace_ms: grace_ms(),
            handshake_rate: handshake_rate(),
            max_clock_skew_secs: max_clock_skew_secs(),
        }
    }
}

impl SecurityConfig {
    /// The default link mode.
    pub fn default_mode(&self) -> Result<anode_sec::Mode, ConfigError> {
        parse_mode(ModeField::Security, self.mode.as_deref(), anode_sec::Mode::Encrypt)
    }
}

fn epoch_one() -> u32 {
    1
}

fn one_per_sec() -> u32 {
    1
}

fn default_ticket_secs() -> u64 {
    300
}

/// The `[domain]` section: the node's administrative domain (SANE §4.7,
/// `docs/security.md`). With it, the node serves the domain's key
/// distribution service over its SAs (`CONTROL` body `0x22`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The domain operator's Ed25519 public key: names the domain and roots
    /// the credentials the service accepts.
    pub operator: String,
    /// The domain secret file (`anode-domain-secret-v1 <64 hex digits>`,
    /// mode 0600; relative paths: to the config file).
    pub secret: PathBuf,
    /// The current key epoch (from 1).
    #[serde(default = "epoch_one")]
    pub epoch: u32,
    /// Serve the key distribution service (tickets over SAs).
    #[serde(default = "yes")]
    pub kdc: bool,
    /// Longest ticket lifetime, seconds (1..=86400).
    #[serde(default = "default_ticket_secs")]
    pub max_ticket_secs: u64,
    /// Tickets per second per user (burst 5 times as many); 1..=1000.
    #[serde(default = "one_per_sec")]
    pub tickets_per_user_per_sec: u32,
    /// A border (perimeter) node: admits ticket packets entering the domain
    /// for other members and sends them on with a perimeter attachment.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub border: bool,
    /// The public keys (hex) of the domain's nodes. A neighbour whose key is
    /// not listed is outside the domain: a node that is not a border refuses
    /// its traffic (it bypassed the perimeter). Empty: every neighbour is
    /// taken to be inside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// What a border takes away from every credential it attaches, on top
    /// of what the user's ticket grants (`[domain.border_policy]`; only a
    /// border uses it). Interior nodes enforce the narrowed credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub border_policy: Option<BorderPolicy>,
    /// What the node revokes from its start (`[domain.revoked]`), before
    /// any revocation update arrives over the operator's SA. Updates live
    /// in memory; what must survive a restart goes here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<RevokedConfig>,
}

/// `[domain.revoked]`: revocations in force from the node's start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RevokedConfig {
    /// Tickets and attachments of key epochs below this are refused.
    #[serde(default)]
    pub min_epoch: u32,
    /// Revoked ticket ids, as `0x` hex strings (ids are 64-bit; TOML
    /// integers are signed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tickets: Vec<String>,
    /// Revoked users' public keys (hex).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
}

impl RevokedConfig {
    /// The revocation it describes.
    ///
    /// # Errors
    /// [`ConfigError::Domain`] for a ticket id that is not `0x` hex, a
    /// list over `anode_sec::domain::MAX_REVOKED`; [`ConfigError::BadKey`]
    /// for a user key.
    pub fn revocation(&self) -> Result<anode_sec::Revocation, ConfigError> {
        let max = anode_sec::domain::MAX_REVOKED;
        if self.tickets.len() > max || self.users.len() > max {
            return Err(ConfigError::Domain("revoked: too many tickets or users"));
        }
        let mut r = anode_sec::Revocation { min_epoch: self.min_epoch, ..Default::default() };
        for t in &self.tickets {
            let id = t
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or(ConfigError::Domain("revoked: ticket ids are 0x hex strings"))?;
            r.tickets.insert(id);
        }
        for u in &self.users {
            r.users.insert(*parse_key(KeyField::DomainRevokedUser, u)?.as_bytes());
        }
        Ok(r)
    }
}

/// `[domain.border_policy]`: the border's attenuation of admitted
/// credentials (SANE §4.7: "policy specified at the edge, enforced in the
/// interior"). Each key present narrows; none widens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BorderPolicy {
    /// Only these host interfaces (`log`, `route`, `net`, `time`, `state`,
    /// `marshal`); absent: as the ticket grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
    /// At most this much module memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<u64>,
    /// At most this much fuel per invocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<u64>,
    /// At most this much soft state, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_state: Option<u64>,
}

impl BorderPolicy {
    /// The attenuation a border appends to admitted credentials.
    ///
    /// # Errors
    /// [`ConfigError::Domain`] for an unknown interface name.
    pub fn attenuation(&self) -> Result<anode_cred::Attenuation, ConfigError> {
        let interfaces = match &self.interfaces {
            None => None,
            Some(names) => {
                let mut set = anode_cred::InterfaceSet::EMPTY;
                for n in names {
                    let i = anode_cred::Interface::from_name(n)
                        .ok_or(ConfigError::Domain("border_policy interfaces: unknown interface"))?;
                    set.insert(i);
                }
                Some(set)
            }
        };
        Ok(anode_cred::Attenuation {
            interfaces,
            max_memory: self.max_memory,
            max_cpu: self.max_cpu,
            max_state: self.max_state,
            ..anode_cred::Attenuation::default()
        })
    }
}

impl DomainConfig {
    /// A section for the domain of `operator` with its secret in `secret`,
    /// the defaults otherwise (epoch 1, a service, 300 s tickets, interior).
    pub fn new(operator: String, secret: PathBuf) -> DomainConfig {
        DomainConfig {
            operator,
            secret,
            epoch: 1,
            kdc: true,
            max_ticket_secs: default_ticket_secs(),
            tickets_per_user_per_sec: 1,
            border: false,
            members: Vec::new(),
            border_policy: None,
            revoked: None,
        }
    }
}

/// The `[modules]` section: the sandbox for switchlets and capsules.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModulesConfig {
    /// The administrator's Ed25519 public key (hex): the root every module
    /// credential must be issued from.
    pub admin_key: String,
    /// Modules loaded from disk at start.
    #[serde(default, rename = "load", skip_serializing_if = "Vec::is_empty")]
    pub loads: Vec<ModuleLoad>,
    /// Pods (Expert's protected modules, docs/pods.md) loaded from disk at start.
    #[serde(default, rename = "pod", skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodLoadConfig>,
    /// How long a principal's RCANE session outlives its last security
    /// association with this node (s): past it, the session is closed
    /// (`principal-gone`). An SA lasts `[security] reject_after_secs`
    /// from its handshake, so a principal keeps its session by contacting
    /// the node again (`anode session hold`).
    #[serde(default = "session_grace_secs")]
    pub session_grace_secs: u64,
    /// What each principal's modules may send, bytes per second, on top of
    /// its session's transmit reservation (bursts of a tenth of a second,
    /// 64 KiB at least); beyond it their packets are dropped (`tx_limit`).
    #[serde(default = "tx_bytes_per_sec")]
    pub tx_bytes_per_sec: u64,
    /// Share of one CPU that may be guaranteed in total, System and
    /// Best-Effort included, percent (`1..=100`).
    #[serde(default = "cpu_capacity_percent")]
    pub cpu_capacity_percent: u32,
    /// The System session's guarantee (handshakes, loads, session
    /// requests), `SLICE/PERIOD`; it always may use slack.
    #[serde(default = "system_vp")]
    pub system_vp: String,
    /// The Best-Effort session's guarantee (SNAP forwarding, principals
    /// without a session), `SLICE/PERIOD`; it always may use slack.
    #[serde(default = "best_effort_vp")]
    pub best_effort_vp: String,
    /// Whether a module credential needs `channel` grants to open receive
    /// channels (`anode cred issue --channel`). Off (the default), an
    /// ordinary credential without any may open every channel, as before
    /// channel grants existed; on, it may open none. Administrative
    /// credentials may open any either way.
    #[serde(default)]
    pub require_channel_grants: bool,
    /// The most fuel a module credential may grant one invocation (the
    /// node's limit: a credential asking more is refused at load). The
    /// default, 10,000,000, is less than one frame of an MP3 encode (the
    /// transcoder's silver path, docs/transcoder.md, takes about 11 M).
    #[serde(default = "max_cpu")]
    pub max_cpu: u64,
    /// Packets one invocation of a module may send, `1..=4096` (16 by
    /// default: a module serving more clients per packet, as the
    /// transcoder's all-in-one variant does, needs more).
    #[serde(default = "max_sends", skip_serializing_if = "is_default_max_sends")]
    pub max_sends: u32,
    /// How often a guaranteed dispatch of module work looks for waiting
    /// network input, µs. When a datagram waits, the dispatch ends at its
    /// next preemption point, the input is read (channel packets into their
    /// FIFOs, waking their VPs) and EDF picks again, so a VP with an
    /// earlier deadline runs before the interrupted one resumes, as a
    /// Nemesis device driver fed RCANE's channels while a CPU-bound
    /// session ran (§IV-D, §VI-C; Fig. 13). 0 (the default): a guaranteed
    /// dispatch runs its budget out and input waits up to one slice.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub input_preempts_us: u64,
    /// Code replies (cached capsule code sent to a neighbour that asked
    /// for it by hash) per neighbour, bytes per second; all neighbours
    /// together get four times that. Bursts of a tenth of a second and at
    /// least one reply of the largest module. A request over it is refused
    /// (`capsule_refused`, reason `code_reply_limited`). 0: never serve code.
    #[serde(default = "code_reply_bytes_per_sec", skip_serializing_if = "is_default_code_reply")]
    pub code_reply_bytes_per_sec: u64,
    /// Sessions the administrator opens at start (before the loads), for
    /// principals that need a reservation without contacting the node.
    #[serde(default, rename = "session", skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<StaticSession>,
}

/// A session opened at start, `[[modules.session]]`: decided by its
/// credential and admitted like one opened over the network, but not
/// closed when its principal has no SA (the administrator opened it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StaticSession {
    /// The principal's Ed25519 public key (hex).
    pub principal: String,
    /// Its session credential (from `anode cred issue --kind session`;
    /// relative paths: to the config file).
    pub credential: PathBuf,
    /// Its virtual processors, `SLICE/PERIOD[+extra]`, e.g. `1200us/4ms`.
    pub vp: Vec<String>,
}

impl StaticSession {
    /// The principal's key and the VPs, checked.
    pub fn parsed(&self, index: usize) -> Result<(anode_sec::PublicKey, Vec<anode_sched::VpParams>), ConfigError> {
        let key = parse_key(KeyField::SessionPrincipal(index), &self.principal)?;
        let vps = self
            .vp
            .iter()
            .map(|v| v.parse().map_err(|e| ConfigError::StaticSession { index, reason: format!("{e}") }))
            .collect::<Result<Vec<_>, _>>()?;
        if vps.is_empty() {
            return Err(ConfigError::StaticSession { index, reason: "no `vp`: a session needs one at least".into() });
        }
        Ok((key, vps))
    }
}

fn session_grace_secs() -> u64 {
    60
}

fn max_cpu() -> u64 {
    anode_cred::VerifierConfig::default().node_limits.cpu
}

fn max_sends() -> u32 {
    anode_sandbox::HostLimits::default().sends_per_invocation
}

fn is_default_max_sends(v: &u32) -> bool {
    *v == max_sends()
}

/// The most `[modules] max_sends` may be.
pub const MAX_SENDS: u32 = 4096;

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn code_reply_bytes_per_sec() -> u64 {
    anode_sandbox::DEFAULT_CODE_REPLY_BYTES_PER_SEC
}

fn is_default_code_reply(v: &u64) -> bool {
    *v == code_reply_bytes_per_sec()
}

fn tx_bytes_per_sec() -> u64 {
    crate::core::DEFAULT_TX_BYTES_PER_SEC
}

fn cpu_capacity_percent() -> u32 {
    95
}

fn system_vp() -> String {
    "500us/10ms".into()
}

fn best_effort_vp() -> String {
    "1ms/10ms".into()
}

impl ModulesConfig {
    /// A `[modules]` section with this administrator key and defaults.
    pub fn new(admin_key: String) -> ModulesConfig {
        ModulesConfig {
            admin_key,
            loads: Vec::new(),
            pods: Vec::new(),
            session_grace_secs: session_grace_secs(),
            tx_bytes_per_sec: tx_bytes_per_sec(),
            cpu_capacity_percent: cpu_capacity_percent(),
            system_vp: system_vp(),
            best_effort_vp: best_effort_vp(),
            require_channel_grants: false,
            max_cpu: max_cpu(),
            max_sends: max_sends(),
            input_preempts_us: 0,
            code_reply_bytes_per_sec: code_reply_bytes_per_sec(),
            sessions: Vec::new(),
        }
    }

    /// The resource-control configuration these settings make (the
    /// scheduler's defaults otherwise), checked.
    pub fn rcane(&self) -> Result<anode_sched::RcaneConfig, ConfigError> {
        let bad = |key: &'static str, reason: String| ConfigError::Rcane { key, reason };
        let mut c = anode_sched::RcaneConfig::default();
        if !(1..=MAX_SENDS).contains(&self.max_sends) {
            return Err(bad("max_sends", format!("{} is not in 1..={MAX_SENDS}", self.max_sends)));
        }
        if !(1..=100).contains(&self.cpu_capacity_percent) {
            return Err(bad("cpu_capacity_percent", format!("{} is not in 1..=100", self.cpu_capacity_percent)));
        }
        c.capacity.cpu_ppm = u64::from(self.cpu_capacity_percent) * 10_000;
        let vp = |key: &'static str, text: &str| -> Result<anode_sched::VpParams, ConfigError> {
            let v: anode_sched::VpParams = text.parse().map_err(|e| bad(key, format!("{e}")))?;
            Ok(anode_sched::VpParams { extra: true, ..v })
        };
        c.system = vp("system_vp", &self.system_vp)?;
        c.best_effort = vp("best_effort_vp", &self.best_effort_vp)?;
        anode_sched::Rcane::<()>::new(c, 0)
            .map_err(|e| bad("system_vp/best_effort_vp/cpu_capacity_percent", e.to_string()))?;
        Ok(c)
    }
}

/// One module loaded at start.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleLoad {
    /// The wasm file (relative paths: to the config file).
    pub file: PathBuf,
    /// Its credential (Biscuit bytes; relative to the config file).
    pub credential: PathBuf,
    /// The loader's name for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One pod loaded at start (`[[modules.pod]]`, docs/pods.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PodLoadConfig {
    /// The wasm file (relative paths: to the config file).
    pub file: PathBuf,
    /// Its credential (Biscuit bytes; relative to the config file); it
    /// must grant the `pod` interface.
    pub credential: PathBuf,
    /// The pod's name: its offers are `<name>.<entry>`.
    pub name: String,
    /// Principals (hex Ed25519 keys) that may bind; absent: any principal
    /// whose module's credential grants `pod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Vec<String>>,
    /// `reset` (the default) or `retire`: what happens when it traps or is cut off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_fault: Option<String>,
    /// Fuel a caller must have left for a call to enter the pod (default 0).
    #[serde(default)]
    pub min_fuel: u64,
}

impl PodLoadConfig {
    /// Its access list and fault policy, checked.
    ///
    /// # Errors
    /// A client that is not 64 hex digits, or an unknown `on_fault`.
    pub fn policy(&self) -> Result<(Option<Vec<anode_sandbox::PrincipalId>>, anode_sandbox::pods::OnFault), String> {
        use anode_sandbox::pods::OnFault;
        let on_fault = match self.on_fault.as_deref() {
            None | Some("reset") => OnFault::Reset,
            Some("retire") => OnFault::Retire,
            Some("rollback") => OnFault::Rollback,
            Some(o) => return Err(format!("pod {}: on_fault {o:?} is not reset, retire or rollback", self.name)),
        };
        let clients = match &self.clients {
            None => None,
            Some(l) => Some(
                l.iter()
                    .map(|h| {
                        anode_sandbox::PrincipalId::from_hex(h)
                            .ok_or_else(|| format!("pod {}: client {h:?} is not 64 hex digits", self.name))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok((clients, on_fault))
    }
}

/// The `[monitor]` section: the FLAME tap on this node's data path
/// (`docs/monitor.md`). Absent, or `enabled = false`: no tap, no cost.
/// Writing it is the administrator's grant; each module's credential (a
/// monitoring credential rooted in `admin_key`) decides what it sees.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorSection {
    /// The tap is on only when this is true.
    #[serde(default)]
    pub enabled: bool,
    /// The administrator's Ed25519 public key (hex, or a public key file's
    /// text): the root every monitoring credential must chain to.
    pub admin_key: String,
    /// Crypto-PAn key file (`anode monitor keygen`, mode 0600), needed when
    /// a credential anonymizes addresses (relative: to the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_key: Option<PathBuf>,
    /// Monitoring modules loaded at start, each with its monitoring
    /// credential.
    #[serde(default, rename = "load", skip_serializing_if = "Vec::is_empty")]
    pub loads: Vec<ModuleLoad>,
    /// Packets per module call (1: one call per packet).
    #[serde(default = "monitor_batch")]
    pub batch: u32,
    /// CPU budget overruns after which a module is unloaded.
    #[serde(default = "monitor_unload_after")]
    pub unload_after: u32,
    /// Interval of the modules' periodic part, ms.
    #[serde(default = "monitor_tick_ms")]
    pub tick_ms: u64,
    /// Names of the interfaces tapped (default: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Packets that may wait for the monitor; beyond it they are not
    /// monitored (counted as `queue_full`) and still forwarded.
    #[serde(default = "monitor_queue")]
    pub queue: usize,
    /// JSON lines of the records (default: `<run_dir>/monitor.jsonl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<PathBuf>,
    /// IPFIX file of the records (default: `<run_dir>/monitor.ipfix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipfix: Option<PathBuf>,
    /// pcap of the sampled packets (default: `<run_dir>/monitor.pcap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcap: Option<PathBuf>,
}

fn monitor_batch() -> u32 {
    32
}
fn monitor_unload_after() -> u32 {
    64
}
fn monitor_tick_ms() -> u64 {
    1000
}
fn monitor_queue() -> usize {
    4096
}

impl MonitorSection {
    /// A section that is off, rooted in `admin_key`, every setting at its
    /// default.
    pub fn new(admin_key: &str) -> MonitorSection {
        MonitorSection {
            enabled: false,
            admin_key: admin_key.to_string(),
            anon_key: None,
            loads: Vec::new(),
            batch: monitor_batch(),
            unload_after: monitor_unload_after(),
            tick_ms: monitor_tick_ms(),
            interfaces: Vec::new(),
            queue: monitor_queue(),
            json: None,
            ipfix: None,
            pcap: None,
        }
    }

    /// Parses the keys of a `[monitor]` section (without its header), as
    /// `anode testbed up --monitor NODE=FILE` reads them. Interface names
    /// are checked when the section is part of a node's configuration.
    pub fn from_toml(text: &str) -> Result<MonitorSection, ConfigError> {
        let m: MonitorSection = toml::from_str(text).map_err(ConfigError::Syntax)?;
        m.validate(&[])?;
        Ok(m)
    }

    fn validate(&self, ifaces: &[InterfaceConfig]) -> Result<(), ConfigError> {
        parse_key(KeyField::MonitorAdminKey, &self.admin_key)?;
        let bad = |key, reason| Err(ConfigError::BadMonitorSetting { key, reason });
        if !(1..=1024).contains(&self.batch) {
            return bad("batch", "must be in 1..=1024");
        }
        if self.unload_after == 0 {
            return bad("unload_after", "must be at least 1");
        }
        if !(10..=3_600_000).contains(&self.tick_ms) {
            return bad("tick_ms", "must be in 10..=3600000");
        }
        if !(1..=1 << 20).contains(&self.queue) {
            return bad("queue", "must be in 1..=1048576");
        }
        for n in &self.interfaces {
            if !ifaces.is_empty() && !ifaces.iter().any(|i| &i.name == n) {
                return Err(ConfigError::MonitorUnknownInterface(n.clone()));
            }
        }
        Ok(())
    }
}

/// The `[io]` section: how the daemon moves datagrams (`docs/node.md`,
/// "Packet I/O"). Every offload falls back to plain batched system calls
/// where the kernel refuses it, so the defaults are safe everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IoConfig {
    /// Send runs of equal-sized datagrams to one neighbour as one UDP GSO
    /// (`UDP_SEGMENT`) message.
    pub gso: bool,
    /// Let the kernel coalesce arriving datagrams (`UDP_GRO`); the daemon
    /// splits them again before the core sees them.
    pub gro: bool,
    /// After a receive batch, poll the sockets without sleeping for this
    /// long before sleeping in `epoll_wait` (0: sleep at once). Bounded by
    /// [`MAX_SPIN_US`]; an idle node does not spin.
    pub spin_us: u64,
    /// `SO_BUSY_POLL` on the interface sockets, µs (0: off). Only helps on
    /// devices with NAPI polling; loopback and veth have none.
    pub busy_poll_us: u32,
    /// Data path worker threads, each with its own `SO_REUSEPORT` socket
    /// per interface (0: one per CPU; 1: the event loop's thread does the
    /// data path itself, as before workers existed). At most
    /// [`MAX_WORKERS`].
    pub workers: usize,
}

/// Largest `[io] workers`.
pub const MAX_WORKERS: usize = 64;

/// Largest `[io] spin_us`.
pub const MAX_SPIN_US: u64 = 10_000;

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig { gso: true, gro: true, spin_us: 50, busy_poll_us: 0, workers: 1 }
    }
}

/// The `[local]` section: the local application API and the control
/// socket (see `docs/node.md`, "Local trust model").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocalConfig {
    /// Application clients connected at once.
    pub max_clients: usize,
    /// Ports one application client may register.
    pub max_ports_per_client: usize,
    /// Messages the node queues for one client whose socket is full;
    /// beyond this its deliveries are dropped (`app_queue_full`).
    pub client_queue: usize,
    /// A client that leaves its queue unread this long is disconnected.
    pub stall_timeout_ms: u64,
    /// Group allowed to use `app.sock` and `control.sock` (mode 0660, run
    /// directory 0750); without it only the node's user may (0600, 0700).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<String>,
    /// Control-socket connections open at once (the oldest is closed for a
    /// new one).
    pub max_control_conns: usize,
    /// Metrics connections open at once (the oldest is closed for a new one).
    pub max_metrics_conns: usize,
    /// A control or metrics connection must deliver its whole request and
    /// take its whole answer within this time.
    pub request_timeout_ms: u64,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            max_clients: 64,
            max_ports_per_client: 64,
            client_queue: 256,
            stall_timeout_ms: 5_000,
            socket_group: None,
            max_control_conns: 16,
            max_metrics_conns: 16,
            request_timeout_ms: 2_000,
        }
    }
}

/// A node's configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's overlay address.
    pub address: Ipv4Addr,
    /// Largest SNAP packet, in bytes.
    #[serde(default = "default_mtu", skip_serializing_if = "is_default_mtu")]
    pub mtu: usize,
    /// Largest resource bound a SNAP packet may carry into this node
    /// (injected or arriving); a larger one is lowered to it and counted
    /// (`rb_clamped`). SNAP bounds a packet's total transmissions by its
    /// resource bound, so this bounds what one datagram can cause.
    #[serde(default = "default_max_rb", skip_serializing_if = "is_default_max_rb")]
    pub max_resource_bound: u16,
    /// IP MTU of the node's links, bytes: a datagram longer than this less
    /// 28 (the IPv4 and UDP headers) is sent as fragments
    /// (`anode_wire::frag`), which the next hop reassembles. 0 (the
    /// default) sends every datagram whole and leaves it to the kernel.
    /// Fragments are reassembled whatever this is.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub link_mtu: usize,
    /// Directory for the control and application sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<PathBuf>,
    /// Prometheus metrics listen address (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<SocketAddr>,
    /// Interfaces.
    #[serde(default, rename = "interface")]
    pub interfaces: Vec<InterfaceConfig>,
    /// Routes.
    #[serde(default)]
    pub routes: RoutesConfig,
    /// Authentication between nodes (off when the section is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<SecurityConfig>,
    /// The node's administrative domain (none when the section is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<DomainConfig>,
    /// Switchlets and capsules (off when the section is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<ModulesConfig>,
    /// The FLAME tap (off when the section is absent or not enabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<MonitorSection>,
    /// The local application API and control socket.
    #[serde(default, skip_serializing_if = "is_default_local")]
    pub local: LocalConfig,
    /// How the daemon moves datagrams: segmentation offload and polling.
    #[serde(default, skip_serializing_if = "is_default_io")]
    pub io: IoConfig,
}

impl NodeConfig {
    /// A node at `address` with every setting at its default and no
    /// interfaces yet (not valid until it has one).
    pub fn new(address: Ipv4Addr) -> NodeConfig {
        NodeConfig {
            address,
            mtu: default_mtu(),
            max_resource_bound: DEFAULT_MAX_RESOURCE_BOUND,
            link_mtu: 0,
            run_dir: None,
            metrics: None,
            interfaces: Vec::new(),
            routes: RoutesConfig::default(),
            security: None,
            domain: None,
            modules: None,
            monitor: None,
            local: LocalConfig::default(),
            io: IoConfig::default(),
        }
    }

    /// The configuration as TOML text (what `anode testbed` writes), which
    /// [`from_toml`](Self::from_toml) reads back to an equal value.
    ///
    /// # Errors
    /// [`ConfigError::Serialize`] if a value has no TOML form.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(ConfigError::Serialize)
    }

    /// Parses and validates a configuration.
    pub fn from_toml(text: &str) -> Result<NodeConfig, ConfigError> {
        let c: NodeConfig = toml::from_str(text).map_err(ConfigError::Syntax)?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the rules that the schema alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(128..=8192).contains(&self.mtu) {
            return Err(ConfigError::BadMtu(self.mtu));
        }
        if self.link_mtu != 0 && !(576..=65_535).contains(&self.link_mtu) {
            return Err(ConfigError::BadLinkMtu(self.link_mtu));
        }
        if self.io.spin_us > MAX_SPIN_US {
            return Err(ConfigError::BadSpin(self.io.spin_us));
        }
        if self.io.busy_poll_us > 1_000_000 {
            return Err(ConfigError::BadBusyPoll(self.io.busy_poll_us));
        }
        if self.io.workers > MAX_WORKERS {
            return Err(ConfigError::BadWorkers(self.io.workers));
        }
        if self.max_resource_bound == 0 {
            return Err(ConfigError::BadMaxResourceBound);
        }
        for i in &self.interfaces {
            let bad = |reason| Err(ConfigError::BadLinkRate { name: i.name.clone(), reason });
            match (i.rate_bps, i.tx_period_us, i.tx_queue_bytes) {
                (None, None, None) => {}
                (None, _, _) => return bad("tx_period_us and tx_queue_bytes need rate_bps"),
                (Some(r), _, _) if !(1_000..=100_000_000_000).contains(&r) => {
                    return bad("rate_bps must be within 1000..=100000000000");
                }
                (_, Some(p), _) if !(100..=1_000_000).contains(&p) => {
                    return bad("tx_period_us must be within 100..=1000000");
                }
                (_, _, Some(q)) if !(2048..=(64 << 20)).contains(&q) => {
                    return bad("tx_queue_bytes must be within 2048..=67108864");
                }
                _ => {}
            }
        }
        let l = &self.local;
        for (name, v) in [
            ("max_clients", l.max_clients as u64),
            ("max_ports_per_client", l.max_ports_per_client as u64),
            ("client_queue", l.client_queue as u64),
            ("max_control_conns", l.max_control_conns as u64),
            ("max_metrics_conns", l.max_metrics_conns as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::BadLocalSetting { key: name, reason: "must be at least 1" });
            }
        }
        for (name, v) in [("stall_timeout_ms", l.stall_timeout_ms), ("request_timeout_ms", l.request_timeout_ms)] {
            if v < 100 {
                return Err(ConfigError::BadLocalSetting { key: name, reason: "must be at least 100 ms" });
            }
        }
        if self.interfaces.is_empty() {
            return Err(ConfigError::NoInterfaces);
        }
        let mut names = BTreeSet::new();
        let mut listens = BTreeSet::new();
        let mut nbrs = BTreeSet::new();
        for i in &self.interfaces {
            if !names.insert(i.name.clone()) || !listens.insert(i.listen) {
                return Err(ConfigError::DuplicateInterface(i.name.clone()));
            }
            for n in &i.neighbors {
                if n.address == self.address {
                    return Err(ConfigError::SelfNeighbor(n.address));
                }
                if !nbrs.insert(n.address) {
                    return Err(ConfigError::DuplicateNeighbor(n.address));
                }
            }
        }
        for n in self.interfaces.iter().flat_map(|i| &i.neighbors) {
            let ep = n.endpoint;
            let is_self = |l: &SocketAddr| {
                *l == ep
                    || (l.port() == ep.port()
                        && l.ip().is_unspecified()
                        && (ep.ip().is_loopback() || ep.ip() == l.ip()))
            };
            if listens.iter().any(is_self) {
                return Err(ConfigError::EndpointIsSelf { neighbor: n.address, endpoint: ep });
            }
        }
        for r in &self.routes.static_routes {
            if !nbrs.contains(&r.via) {
                return Err(ConfigError::ViaNotNeighbor { dest: r.dest, via: r.via });
            }
        }
        if let Some(via) = self.routes.default_via
            && !nbrs.contains(&via)
        {
            return Err(ConfigError::ViaNotNeighbor { dest: Ipv4Addr::UNSPECIFIED, via });
        }
        if let Some(m) = &self.modules {
            parse_key(KeyField::AdminKey, &m.admin_key)?;
            for p in &m.pods {
                p.policy().map_err(ConfigError::Pod)?;
            }
            for (i, s) in m.sessions.iter().enumerate() {
                s.parsed(i)?;
            }
            m.rcane()?;
        }
        if let Some(m) = &self.monitor {
            m.validate(&self.interfaces)?;
        }
        if let Some(sec) = self.security.as_ref().filter(|s| s.enabled) {
            if sec.key.is_none() {
                return Err(ConfigError::MissingKeyFile);
            }
            let default = sec.default_mode()?;
            let mut keys: BTreeMap<anode_sec::PublicKey, Ipv4Addr> = BTreeMap::new();
            for n in self.interfaces.iter().flat_map(|i| &i.neighbors) {
                let k = n.key.as_deref().ok_or(ConfigError::MissingNeighborKey(n.address))?;
                let k = parse_key(KeyField::Neighbor(n.address), k)?;
                parse_mode(ModeField::Neighbor(n.address), n.mode.as_deref(), default)?;
                if let Some(other) = keys.insert(k, n.address) {
                    return Err(ConfigError::DuplicateNeighborKey(other, n.address));
                }
            }
            for (i, u) in sec.users.iter().enumerate() {
                parse_key(KeyField::User(i), u)?;
            }
            if sec.rekey_after_secs == 0 || sec.reject_after_secs <= sec.rekey_after_secs {
                return Err(ConfigError::BadLifetimes { rekey: sec.rekey_after_secs, reject: sec.reject_after_secs });
            }
            if sec.rekey_after_packets == 0 {
                return Err(ConfigError::ZeroSecuritySetting("rekey_after_packets"));
            }
            if sec.handshake_rate == 0 {
                return Err(ConfigError::ZeroSecuritySetting("handshake_rate"));
            }
        }
        if let Some(d) = &self.domain {
            parse_key(KeyField::DomainOperator, &d.operator)?;
            if !self.security_enabled() {
                return Err(ConfigError::Domain("needs [security] on: the key distribution service answers over SAs"));
            }
            if d.epoch == 0 {
                return Err(ConfigError::Domain("epoch must be at least 1"));
            }
            if !(1..=86_400).contains(&d.max_ticket_secs) {
                return Err(ConfigError::Domain("max_ticket_secs must be 1..=86400"));
            }
            if !(1..=1000).contains(&d.tickets_per_user_per_sec) {
                return Err(ConfigError::Domain("tickets_per_user_per_sec must be 1..=1000"));
            }
            for m in &d.members {
                parse_key(KeyField::DomainMember, m)?;
            }
            if let Some(p) = &d.border_policy {
                if !d.border {
                    return Err(ConfigError::Domain("border_policy is for a border node (border = true)"));
                }
                p.attenuation()?;
            }
            if let Some(r) = &d.revoked {
                r.revocation()?;
            }
        }
        Ok(())
    }

    /// Whether authentication between nodes is on.
    pub fn security_enabled(&self) -> bool {
        self.security.as_ref().is_some_and(|s| s.enabled)
    }

    /// Neighbour addresses, in interface order.
    pub fn neighbor_addrs(&self) -> Vec<Ipv4Addr> {
        self.interfaces.iter().flat_map(|i| i.neighbors.iter().map(|n| n.address)).collect()
    }
}

/// A topology node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TopoNode {
    /// Short name.
    pub name: String,
    /// Overlay address.
    pub address: Ipv4Addr,
}

/// A topology link between two nodes, by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TopoLink {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
}

/// A topology file shared by all nodes of a network.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Nodes.
    #[serde(rename = "node")]
    pub nodes: Vec<TopoNode>,
    /// Links.
    #[serde(default, rename = "link")]
    pub links: Vec<TopoLink>,
}

impl Topology {
    /// Parses and validates a topology.
    pub fn from_toml(text: &str) -> Result<Topology, ConfigError> {
        let t: Topology = toml::from_str(text).map_err(ConfigError::Syntax)?;
        t.validate()?;
        Ok(t)
    }

    /// Checks the rules the schema alone cannot: unique names and
    /// addresses, links between two distinct known nodes, each link once.
    /// The node and `anode testbed` use this one check.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        let mut addrs: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
        for n in &self.nodes {
            if !names.insert(n.name.as_str()) {
                return Err(ConfigError::DuplicateNode(n.name.clone()));
            }
            if let Some(first) = addrs.insert(n.address, n.name.as_str()) {
                return Err(ConfigError::DuplicateAddress {
                    address: n.address,
                    first: first.to_string(),
                    second: n.name.clone(),
                });
            }
        }
        let mut links = BTreeSet::new();
        for l in &self.links {
            for end in [&l.a, &l.b] {
                if !names.contains(end.as_str()) {
                    return Err(ConfigError::UnknownNode(end.clone()));
                }
            }
            if l.a == l.b {
                return Err(ConfigError::SelfLink(l.a.clone()));
            }
            let key = if l.a < l.b { (l.a.as_str(), l.b.as_str()) } else { (l.b.as_str(), l.a.as_str()) };
            if !links.insert(key) {
                return Err(ConfigError::DuplicateLink(key.0.to_string(), key.1.to_string()));
            }
        }
        Ok(())
    }

    /// The address of the node called `name`.
    pub fn address_of(&self, name: &str) -> Option<Ipv4Addr> {
        self.nodes.iter().find(|n| n.name == name).map(|n| n.address)
    }

    /// Neighbours of `a`, sorted.
    pub fn neighbors(&self, a: Ipv4Addr) -> Vec<Ipv4Addr> {
        let mut v = BTreeSet::new();
        for l in &self.links {
            let (x, y) = (self.address_of(&l.a), self.address_of(&l.b));
            if x == Some(a)
                && let Some(y) = y
            {
                v.insert(y);
            }
            if y == Some(a)
                && let Some(x) = x
            {
                v.insert(x);
            }
        }
        v.remove(&a);
        v.into_iter().collect()
    }

    /// Hop counts from `from` to every node reachable from it (breadth
    /// first; `from` itself at 0).
    pub fn hop_counts(&self, from: Ipv4Addr) -> BTreeMap<Ipv4Addr, usize> {
        let mut d = BTreeMap::from([(from, 0)]);
        let mut q = std::collections::VecDeque::from([from]);
        while let Some(u) = q.pop_front() {
            let du = d[&u];
            for v in self.neighbors(u) {
                d.entry(v).or_insert_with(|| {
                    q.push_back(v);
                    du + 1
                });
            }
        }
        d
    }

    /// Shortest-path next hops from `from` to every reachable node
    /// (breadth first; ties go to the lowest neighbour address, so every
    /// node computes consistent routes).
    pub fn next_hops(&self, from: Ipv4Addr) -> Result<BTreeMap<Ipv4Addr, Ipv4Addr>, ConfigError> {
        if !self.nodes.iter().any(|n| n.address == from) {
            return Err(ConfigError::NotInTopology(from));
        }
        let first = anode_snap::sim::first_hops(from, |a| self.neighbors(a));
        Ok(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fuzzing::NODE;

    #[test]
    fn parses_and_validates() {
        let c = NodeConfig::from_toml(NODE).expect("valid");
        assert_eq!(c.mtu, 1400);
        assert_eq!(c.neighbor_addrs(), vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3)]);
    }

    #[test]
    fn config_errors_are_clear() {
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert!(e("address = \"10.0.0.1\"").contains("no [[interface]]"));
        assert!(e("address = \"10.0.0.300\"").contains("invalid"));
        assert!(
            e(&NODE.replace(
                "static = [{ dest = \"10.0.0.4\", via = \"10.0.0.3\" }]",
                "static = [{ dest = \"10.0.0.4\", via = \"10.0.0.9\" }]"
            ))
            .contains("not a neighbour")
        );
        assert!(e(&NODE.replace("name = \"east\"", "name = \"west\"")).contains("defined twice"));
        assert!(e(&NODE.replace("address = \"10.0.0.3\"", "address = \"10.0.0.2\"")).contains("own address"));
        assert!(e(&format!("mtu = 10\n{NODE}")).contains("mtu 10"));
        assert!(e(&format!("link_mtu = 100\n{NODE}")).contains("link_mtu 100"));
        assert!(e(&format!("link_mtu = 70000\n{NODE}")).contains("link_mtu 70000"));
        assert_eq!(NodeConfig::from_toml(&format!("link_mtu = 1500\n{NODE}")).map(|c| c.link_mtu), Ok(1500));
        assert!(e(&format!("bogus = 1\n{NODE}")).contains("unknown field"));
    }

    #[test]
    fn the_io_section_has_safe_defaults_and_each_bound_is_checked() {
        let c = NodeConfig::from_toml(NODE).expect("valid");
        assert_eq!(c.io, IoConfig { gso: true, gro: true, spin_us: 50, busy_poll_us: 0, workers: 1 });
        let e = |io: &str| NodeConfig::from_toml(&format!("{NODE}\n[io]\n{io}\n")).expect_err("invalid").to_string();
        assert!(e("spin_us = 10001").contains("spin_us 10001"));
        assert!(e("busy_poll_us = 1000001").contains("busy_poll_us 1000001"));
        assert!(e("workers = 65").contains("workers 65"));
        assert!(e("gso = 1").contains("invalid type"));
        assert!(e("polling = true").contains("unknown field"));
        let ok = NodeConfig::from_toml(&format!("{NODE}\n[io]\nworkers = 0\nspin_us = 10000\ngso = false\n"));
        assert_eq!(ok.map(|c| (c.io.workers, c.io.spin_us, c.io.gso)), Ok((0, 10_000, false)));
    }

    #[test]
    fn a_link_rate_is_optional_and_each_bound_is_checked() {
        let c = NodeConfig::from_toml(NODE).expect("valid");
        assert!(c.interfaces.iter().all(|i| i.rate_bps.is_none()));
        let with = |extra: &str| NODE.replace("name = \"east\"\n", &format!("name = \"east\"\n{extra}\n"));
        let ok = NodeConfig::from_toml(&with("rate_bps = 100000000\ntx_period_us = 6000\ntx_queue_bytes = 65536"));
        let east = ok.expect("valid").interfaces.into_iter().find(|i| i.name == "east").expect("east");
        assert_eq!(
            (east.rate_bps, east.tx_period_us, east.tx_queue_bytes),
            (Some(100_000_000), Some(6000), Some(65536))
        );
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert!(e(&with("rate_bps = 999")).contains("interface east: rate_bps"));
        assert!(e(&with("rate_bps = 100000000000000")).contains("rate_bps"));
        assert!(e(&with("tx_period_us = 6000")).contains("need rate_bps"));
        assert!(e(&with("rate_bps = 1000000\ntx_period_us = 10")).contains("tx_period_us"));
        assert!(e(&with("rate_bps = 1000000\ntx_queue_bytes = 10")).contains("tx_queue_bytes"));
        // Paced links work with any number of workers.
        assert!(NodeConfig::from_toml(&format!("{}\n[io]\nworkers = 2\n", with("rate_bps = 1000000"))).is_ok());
        assert!(e(&with("rate_bps = -1")).contains("invalid value"));
    }

    #[test]
    fn static_sessions_parse_and_each_mistake_is_named() {
        let key = anode_sec::Identity::from_seed(&[3; 32]).public().to_string();
        let with = |principal: &str, vp: &str| {
            format!(
                "{NODE}[modules]\nadmin_key = \"{key}\"\n[[modules.session]]\nprincipal = \"{principal}\"\n\
                 credential = \"s.cred\"\nvp = [{vp}]\n"
            )
        };
        let c = NodeConfig::from_toml(&with(&key, "\"1200us/4ms\", \"0.5ms/10ms+extra\"")).expect("valid");
        let m = c.modules.as_ref().expect("modules");
        assert_eq!(m.session_grace_secs, 60);
        let (_, vps) = m.sessions[0].parsed(0).expect("parsed");
        assert_eq!(vps[0], anode_sched::VpParams { slice_ns: 1_200_000, period_ns: 4_000_000, extra: false });
        assert_eq!(vps[1], anode_sched::VpParams { slice_ns: 500_000, period_ns: 10_000_000, extra: true });
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert!(e(&with("abcd", "\"1ms/4ms\"")).contains("[[modules.session]] #0 principal"));
        assert!(e(&with(&key, "\"1ms\"")).contains("expected SLICE/PERIOD"));
        assert!(e(&with(&key, "\"1 fortnight/4ms\"")).contains("bad time span"));
        assert!(e(&with(&key, "\"99999999999999999999s/4ms\"")).contains("out of range"));
        assert!(e(&with(&key, "")).contains("no `vp`"));
        // The node's own guarantees.
        let rc = |extra: &str| format!("{NODE}[modules]\nadmin_key = \"{key}\"\n{extra}\n");
        let c = NodeConfig::from_toml(&rc("cpu_capacity_percent = 80\nsystem_vp = \"1ms/10ms\""))
            .expect("valid")
            .modules
            .expect("modules")
            .rcane()
            .expect("rcane");
        assert_eq!(c.capacity.cpu_ppm, 800_000);
        assert_eq!(c.system, anode_sched::VpParams { slice_ns: 1_000_000, period_ns: 10_000_000, extra: true });
        assert!(e(&rc("cpu_capacity_percent = 0")).contains("cpu_capacity_percent"));
        assert!(e(&rc("cpu_capacity_percent = 101")).contains("not in 1..=100"));
        assert!(e(&rc("system_vp = \"10ms\"")).contains("[modules] system_vp"));
        assert!(e(&rc("best_effort_vp = \"9ms/10ms\"\ncpu_capacity_percent = 50")).contains("[modules]"));
        // Channel grants: off unless asked for; a wrong type is refused.
        let m = |extra: &str| NodeConfig::from_toml(&rc(extra)).expect("valid").modules.expect("modules");
        assert!(!m("").require_channel_grants);
        assert!(m("require_channel_grants = true").require_channel_grants);
        assert!(NodeConfig::from_toml(&rc("require_channel_grants = \"yes\"")).is_err());
        // The per-invocation fuel maximum: the verifier's default unless set.
        assert_eq!(m("").max_cpu, 10_000_000);
        assert_eq!(m("max_cpu = 500000000").max_cpu, 500_000_000);
        assert!(NodeConfig::from_toml(&rc("max_cpu = -1")).is_err());
        // Sends per invocation: 16 unless set, within 1..=4096.
        assert_eq!(m("").max_sends, 16);
        assert_eq!(m("max_sends = 256").max_sends, 256);
        assert!(e(&rc("max_sends = 0")).contains("[modules] max_sends"));
        assert!(e(&rc("max_sends = 4097")).contains("not in 1..=4096"));
        // Input preempting guaranteed dispatches: off unless asked for,
        // written back only when on.
        assert_eq!(m("").input_preempts_us, 0);
        let on = m("input_preempts_us = 50");
        assert_eq!(on.input_preempts_us, 50);
        let text = toml::to_string(&on).expect("serialises");
        assert!(text.contains("input_preempts_us = 50"), "{text}");
        assert!(!toml::to_string(&m("")).expect("serialises").contains("input_preempts_us"));
        assert!(NodeConfig::from_toml(&rc("input_preempts_us = -1")).is_err());
    }

    #[test]
    fn pods_parse_and_their_policy_is_checked() {
        let key = anode_sec::Identity::from_seed(&[3; 32]).public().to_string();
        let with = |extra: &str| {
            format!(
                "{NODE}[modules]\nadmin_key = \"{key}\"\n[[modules.pod]]\nfile = \"aes.wasm\"\n\
                 credential = \"aes.cred\"\nname = \"aes\"\n{extra}\n"
            )
        };
        let c = NodeConfig::from_toml(&with("")).expect("valid");
        let p = &c.modules.as_ref().expect("modules").pods[0];
        assert_eq!(p.policy().expect("policy"), (None, anode_sandbox::pods::OnFault::Reset));
        let c = NodeConfig::from_toml(&with(&format!("clients = [\"{key}\"]\non_fault = \"retire\""))).expect("valid");
        let (clients, on_fault) = c.modules.as_ref().expect("modules").pods[0].policy().expect("policy");
        assert_eq!((clients.map(|l| l.len()), on_fault), (Some(1), anode_sandbox::pods::OnFault::Retire));
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert!(e(&with("on_fault = \"explode\"")).contains("not reset, retire or rollback"));
        assert!(e(&with("clients = [\"abcd\"]")).contains("not 64 hex digits"));
        assert!(e(&with("colour = \"red\"")).contains("unknown field"));
    }

    #[test]
    fn the_monitor_section_is_off_by_default_and_checked() {
        assert_eq!(NodeConfig::from_toml(NODE).expect("valid").monitor, None);
        let key = "3981782f1d32f1d6fbd807c7b02acb1cc8f09743e1b49d15d0b7a984d65474c0";
        let with = |extra: &str| NodeConfig::from_toml(&format!("{NODE}\n[monitor]\nadmin_key = \"{key}\"\n{extra}"));
        let m = with("").expect("valid").monitor.expect("present");
        assert!(!m.enabled, "present but not enabled: off");
        assert_eq!(m, MonitorSection::new(key));
        let on =
            with("enabled = true\ninterfaces = [\"east\"]\nload = [{ file = \"m.wasm\", credential = \"m.cred\" }]")
                .expect("valid")
                .monitor
                .expect("present");
        assert!(on.enabled && on.loads.len() == 1);
        let e = |extra: &str| with(extra).expect_err("invalid");
        for (extra, key) in [
            ("batch = 0", "batch"),
            ("batch = 5000", "batch"),
            ("unload_after = 0", "unload_after"),
            ("tick_ms = 1", "tick_ms"),
            ("queue = 0", "queue"),
        ] {
            assert!(matches!(e(extra), ConfigError::BadMonitorSetting { key: k, .. } if k == key), "{extra}");
        }
        assert_eq!(e("interfaces = [\"nope\"]"), ConfigError::MonitorUnknownInterface("nope".into()));
        assert!(matches!(e("bogus = 1"), ConfigError::Syntax(_)));
        let bad_key = NodeConfig::from_toml(&format!("{NODE}\n[monitor]\nadmin_key = \"zz\"\n")).expect_err("bad key");
        assert!(matches!(bad_key, ConfigError::BadKey { what: KeyField::MonitorAdminKey, .. }), "{bad_key}");
        assert!(bad_key.to_string().starts_with("[monitor] admin_key"), "{bad_key}");
        let mut c = NodeConfig::from_toml(NODE).expect("valid");
        c.monitor = Some(on);
        assert_eq!(NodeConfig::from_toml(&c.to_toml().expect("toml")).expect("reads back"), c);
        assert_eq!(
            MonitorSection::from_toml(&format!("admin_key = \"{key}\"\nbatch = 0")).expect_err("batch 0"),
            ConfigError::BadMonitorSetting { key: "batch", reason: "must be in 1..=1024" }
        );
    }

    #[test]
    fn topology_errors_name_what_is_wrong() {
        let e = |t: &str| Topology::from_toml(t).expect_err("invalid");
        let two = "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.2\" }]\n";
        assert_eq!(e(&format!("{two}link = [{{ a = \"a\", b = \"a\" }}]")), ConfigError::SelfLink("a".into()));
        assert_eq!(
            e(&format!("{two}link = [{{ a = \"b\", b = \"a\" }}, {{ a = \"a\", b = \"b\" }}]")),
            ConfigError::DuplicateLink("a".into(), "b".into())
        );
        assert_eq!(
            e("node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"a\", address = \"10.0.0.2\" }]"),
            ConfigError::DuplicateNode("a".into())
        );
        let dup = e("node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.1\" }]");
        assert_eq!(dup.to_string(), "topology address 10.0.0.1 is used by both \"a\" and \"b\"");
        assert_eq!(e(&format!("{two}link = [{{ a = \"a\", b = \"z\" }}]")), ConfigError::UnknownNode("z".into()));
    }

    #[test]
    fn a_neighbour_at_our_own_listen_address_is_refused() {
        let me = NodeConfig::from_toml(NODE).expect("valid");
        let listen = me.interfaces[0].listen;
        let mut c = me.clone();
        c.interfaces[1].neighbors[0].endpoint = listen;
        let e = c.validate().expect_err("loops to itself");
        assert!(matches!(e, ConfigError::EndpointIsSelf { endpoint, .. } if endpoint == listen), "{e}");
        let mut c = me.clone();
        c.interfaces[0].listen = SocketAddr::from(([0, 0, 0, 0], listen.port()));
        c.interfaces[1].neighbors[0].endpoint = SocketAddr::from(([127, 0, 0, 1], listen.port()));
        assert!(matches!(c.validate(), Err(ConfigError::EndpointIsSelf { .. })), "wildcard listen, loopback endpoint");
    }

    #[test]
    fn configurations_round_trip_through_toml() {
        let mut c = NodeConfig::from_toml(NODE).expect("valid");
        assert_eq!(NodeConfig::from_toml(&c.to_toml().expect("toml")).expect("reads back"), c);
        c.security = Some(SecurityConfig { key: Some("k.key".into()), users: vec!["ab".into()], ..Default::default() });
        c.modules = Some(ModulesConfig::new("cd".into()));
        c.local.client_queue = 9;
        c.mtu = 2000;
        let text = c.to_toml().expect("toml");
        let back: NodeConfig = toml::from_str(&text).expect("parses (keys are not checked here)");
        assert_eq!(back, c);
        assert!(
            !NodeConfig::from_toml(NODE).expect("valid").to_toml().expect("toml").contains("[local]"),
            "defaults left out"
        );
    }

    #[test]
    fn limits_in_range() {
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert_eq!(e(&format!("max_resource_bound = 0\n{NODE}")), "max_resource_bound must be at least 1");
        assert_eq!(NodeConfig::from_toml(NODE).expect("valid").max_resource_bound, DEFAULT_MAX_RESOURCE_BOUND);
        assert_eq!(e(&format!("{NODE}\n[local]\nmax_clients = 0\n")), "[local] max_clients must be at least 1");
        assert_eq!(
            e(&format!("{NODE}\n[local]\nstall_timeout_ms = 5\n")),
            "[local] stall_timeout_ms must be at least 100 ms"
        );
        assert!(e(&format!("{NODE}\n[local]\nbogus = 1\n")).contains("unknown field"));
        let c = NodeConfig::from_toml(&format!("{NODE}\n[local]\nclient_queue = 8\n")).expect("valid");
        assert_eq!((c.local.client_queue, c.local.max_clients), (8, LocalConfig::default().max_clients));
    }

    #[test]
    fn shortest_paths() {
        let t = Topology::from_toml(
            r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" },
        { name = "c", address = "10.0.0.3" }, { name = "d", address = "10.0.0.4" }]
link = [{ a = "a", b = "b" }, { a = "b", b = "c" }, { a = "c", b = "d" }, { a = "d", b = "a" }]
"#,
        )
        .expect("topology");
        let a = |n| Ipv4Addr::new(10, 0, 0, n);
        let h = t.next_hops(a(1)).expect("routes");
        assert_eq!(h[&a(2)], a(2));
        assert_eq!(h[&a(4)], a(4));
        assert_eq!(h[&a(3)], a(2), "tie broken toward the lower neighbour");
        assert!(
            Topology::from_toml("node = [{ name = \"a\", address = \"10.0.0.1\" }]\nlink = [{ a = \"a\", b = \"z\" }]")
                .is_err()
        );
        assert_eq!(t.next_hops(a(9)), Err(ConfigError::NotInTopology(a(9))));
    }

    #[test]
    fn a_domain_section_needs_security_a_valid_operator_and_sane_settings() {
        let op = anode_sec::Identity::from_seed(&[3; 32]).public().to_string();
        let peer = anode_sec::Identity::from_seed(&[4; 32]).public().to_string();
        let cfg = |sec: bool, domain: &str| {
            let mut t = "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n\
                         neighbors = [{ address = \"10.0.0.2\", endpoint = \"127.0.0.1:2\", key = \"PEER\" }]\n"
                .replace("PEER", &peer);
            if sec {
                t.push_str("[security]\nkey = \"n.key\"\n");
            }
            t.push_str("[domain]\n");
            t.push_str(domain);
            NodeConfig::from_toml(&t)
        };
        let ok = format!("operator = \"{op}\"\nsecret = \"d.secret\"\n");
        let c = cfg(true, &ok).expect("valid");
        let d = c.domain.expect("domain");
        assert_eq!((d.epoch, d.kdc, d.max_ticket_secs, d.border, d.members.len()), (1, true, 300, false, 0));
        let b = cfg(true, &format!("{ok}border = true\nmembers = [\"{peer}\"]\n")).expect("valid");
        assert_eq!(b.domain.as_ref().map(|d| (d.border, d.members.clone())), Some((true, vec![peer.clone()])));
        assert!(matches!(
            cfg(true, &format!("{ok}members = [\"00\"]\n")),
            Err(ConfigError::BadKey { what: KeyField::DomainMember, .. })
        ));
        assert!(matches!(cfg(false, &ok), Err(ConfigError::Domain(m)) if m.contains("[security]")));
        assert!(matches!(cfg(true, "operator = \"00\"\nsecret = \"d\"\n"), Err(ConfigError::BadKey { .. })));
        assert!(matches!(cfg(true, &format!("{ok}epoch = 0\n")), Err(ConfigError::Domain(_))));
        assert!(matches!(cfg(true, &format!("{ok}max_ticket_secs = 0\n")), Err(ConfigError::Domain(_))));
        assert!(matches!(cfg(true, &format!("{ok}max_ticket_secs = 86401\n")), Err(ConfigError::Domain(_))));
        let pol = format!(
            "{ok}border = true\n[domain.border_policy]\ninterfaces = [\"log\", \"time\"]\nmax_memory = 65536\n"
        );
        let p = cfg(true, &pol).expect("border policy").domain.and_then(|d| d.border_policy).expect("policy");
        let a = p.attenuation().expect("attenuation");
        assert_eq!(
            a.interfaces,
            Some(anode_cred::InterfaceSet::of(&[anode_cred::Interface::Log, anode_cred::Interface::Time]))
        );
        assert_eq!((a.max_memory, a.max_cpu), (Some(65536), None));
        let interior = format!("{ok}[domain.border_policy]\nmax_cpu = 5\n");
        assert!(matches!(cfg(true, &interior), Err(ConfigError::Domain(m)) if m.contains("border")));
        let bad = pol.replace("\"time\"", "\"teleport\"");
        assert!(matches!(cfg(true, &bad), Err(ConfigError::Domain(m)) if m.contains("interface")));
        let unknown = format!("{ok}border = true\n[domain.border_policy]\nmax_bandwidth = 5\n");
        assert!(cfg(true, &unknown).is_err());
        let rev =
            format!("{ok}[domain.revoked]\nmin_epoch = 2\ntickets = [\"0xffffffffffffffff\"]\nusers = [\"{peer}\"]\n");
        let r = cfg(true, &rev).expect("revoked").domain.and_then(|d| d.revoked).expect("revoked");
        let r = r.revocation().expect("revocation");
        assert_eq!((r.min_epoch, r.tickets.first().copied(), r.users.len()), (2, Some(u64::MAX), 1));
        assert!(matches!(cfg(true, &rev.replace("0xffff", "ffff")), Err(ConfigError::Domain(m)) if m.contains("hex")));
        assert!(matches!(
            cfg(true, &rev.replace(&peer, "zz")),
            Err(ConfigError::BadKey { what: KeyField::DomainRevokedUser, .. })
        ));
        assert!(matches!(cfg(true, &format!("{ok}color = 1\n")), Err(ConfigError::Syntax(_))));
        assert!(matches!(cfg(true, "operator = \"x\"\n"), Err(ConfigError::Syntax(_))), "secret is required");
    }
}
