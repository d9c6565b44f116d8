//! The sans-I/O node: datagrams and `now` in, owned transmissions,
//! deliveries and executions out. The daemon owns the sockets; tests run
//! many nodes in one process.
//!
//! - `classify`: the outer ANEP check, the security layer, the inner ANEP
//!   check, and the dispatch on the type id: each header checked once.
//! - `data`: the data plane: SNAP in the VM, plain forwarding, pass-on.
//! - `control`: the control plane: requests from authenticated users.
//! - `modules`: switchlets and capsules in the embedded sandbox, module
//!   channels on the packet path, module loads.
//! - `seal`: protection of every transmission for its next hop, and the
//!   security layer's own messages.
//!
//! A packet forwarded in place is transmitted straight from the receive
//! buffer ([`Data::Input`]); child packets are built in the outbox arena.
//! Steady-state handling of a forwarded packet allocates nothing.

mod capture;
mod classify;
mod control;
mod data;
mod domain;
mod kdc;
mod modules;
mod recovery;
mod seal;
pub use seal::{SEAL_HEADROOM, SEAL_OVERHEAD};
mod sessions;
pub(crate) mod staging;
mod tap;

pub use capture::{
    CAPTURE_QUEUE, CAPTURE_QUEUE_BYTES, CaptureConfig, CaptureCounters, CaptureDir, CaptureStartError, CaptureStop,
    Captured,
};
pub use domain::drop_of as domain_drop_of;
pub use kdc::KDC_OP;
pub use modules::LoadFailure;
pub use recovery::{RECOVERY_OP, RecoveryCounters, RepoFn};
pub use sessions::{
    BE_POOL, DEFAULT_SESSION_GRACE_MS, DEFAULT_TX_BYTES_PER_SEC, RcaneSetupError, SchedCounters, StaticSessionError,
};
pub use tap::{TAP_OUTPUTS, TapConfig, TapCounters, TapLoadError};

use crate::config::{ConfigError, NodeConfig, Topology};
use crate::counters::Counters;
use crate::secure::{Guard, SecurityInit};
use crate::switchlets::Switch;
use anode_sandbox::{ModuleId, PrincipalId};
use anode_snap::services::ServiceTable;
use anode_snap::vm::{NodeContext, Vm, VmConfig};
use anode_wire::anep;
use core::net::{Ipv4Addr, SocketAddr};
use core::ops::Range;
use std::collections::{BTreeSet, HashMap};

/// Bytes of room a receive buffer needs for a packet of `mtu` bytes: the
/// ANEP header, the packet, and the room the SNAP stack may grow into.
pub fn recv_buffer_len(mtu: usize) -> usize {
    anep::HEADER_LEN + 64 + 2 * mtu
}

/// Where the bytes of a transmission or delivery are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    /// In the buffer passed to [`Node::handle_datagram`] (zero copy).
    Input(Range<usize>),
    /// In the outbox's arena.
    Arena(Range<usize>),
}

/// Who a transmission, delivery or execution is done for: the principal a
/// scheduler serves it under and the ledger charges it to (RCANE's
/// sessions, §IV-B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// The node's own work: handshakes, keepalives, control replies, code
    /// served to neighbours.
    System,
    /// Work for nobody in particular: SNAP packets, plain packets, and
    /// local applications' packets.
    BestEffort,
    /// Work for an authenticated principal: its capsules and modules.
    Principal(PrincipalId),
}

impl core::fmt::Display for Owner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Owner::System => f.write_str("system"),
            Owner::BestEffort => f.write_str("best-effort"),
            Owner::Principal(p) => write!(f, "{p}"),
        }
    }
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Interface index.
    pub iface: usize,
    /// Neighbour endpoint.
    pub to: SocketAddr,
    /// The whole datagram, ANEP header included.
    pub data: Data,
    /// Whom it is sent for.
    pub owner: Owner,
    /// Left unsealed for the daemon to seal when it sends it
    /// ([`Node::seal_for`]; only on the interfaces of
    /// [`Node::set_seal_at_send`], with security on).
    pub unsealed: bool,
    /// The owner's channel it was sent on (`net.channel_send`), if any: a
    /// flow of its own on a paced link, with the channel's transmit
    /// reservation (docs/rcane.md, "Transmit reservations of channels").
    pub flow: Option<anode_sandbox::Flow>,
}

/// A payload for a local application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The application port.
    pub port: u16,
    /// The payload.
    pub data: Data,
    /// Whom it is delivered for.
    pub owner: Owner,
}

/// What was executed while handling an input, and for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// A SNAP packet ran in the VM (always for Best-Effort).
    Snap {
        /// Instructions executed.
        instructions: u32,
    },
    /// A module entry ran in the sandbox (capsule, channel packet, alarm,
    /// initialisation).
    Module {
        /// The module or capsule instance.
        module: ModuleId,
        /// Its principal.
        principal: PrincipalId,
        /// Fuel it used.
        fuel: u64,
    },
}

impl Run {
    /// Whom the execution was for.
    pub fn owner(&self) -> Owner {
        match self {
            Run::Snap { .. } => Owner::BestEffort,
            Run::Module { principal, .. } => Owner::Principal(*principal),
        }
    }
}

/// What handling one input produced. Reuse it: clearing keeps capacity.
#[derive(Debug, Clone, Default)]
pub struct Outbox {
    /// Datagrams to send, in order.
    pub transmits: Vec<Transmit>,
    /// Payloads to deliver, in order.
    pub deliveries: Vec<Delivery>,
    /// What was executed, for whom.
    pub runs: Vec<Run>,
    /// `print` output of SNAP packets and module log lines, if any.
    pub log: String,
    /// Security events worth a log line (links up, rekeys), if any.
    pub events: Vec<String>,
    /// The datagram was the node's own work (a handshake, a keepalive, a
    /// control request): System's, not Best-Effort's, for charging.
    pub system: bool,
    /// The datagram was a capsule or a channel packet accepted for this
    /// principal's session: its receive processing (verification, and
    /// instantiation on a code-cache miss) is that session's, for charging.
    pub rx_for: Option<PrincipalId>,
    arena: Vec<u8>,
}

impl Outbox {
    /// An outbox with room for what handling one datagram usually produces
    /// (a few transmissions, deliveries and runs, a child packet in the
    /// arena), so that a receive batch's outboxes do not allocate on the
    /// warm data path whichever slots a batch happens to fill.
    pub fn preallocated() -> Outbox {
        Outbox {
            transmits: Vec::with_capacity(8),
            deliveries: Vec::with_capacity(4),
            runs: Vec::with_capacity(4),
            log: String::new(),
            events: Vec::new(),
            system: false,
            rx_for: None,
            arena: Vec::with_capacity(4096),
        }
    }

    /// Empties the outbox, keeping its buffers.
    pub fn clear(&mut self) {
        self.transmits.clear();
        self.deliveries.clear();
        self.runs.clear();
        self.log.clear();
        self.events.clear();
        self.arena.clear();
        self.system = false;
        self.rx_for = None;
    }
    /// The bytes of `d`; `input` is the buffer passed to the node.
    pub fn bytes<'a>(&'a self, d: &Data, input: &'a [u8]) -> &'a [u8] {
        match d {
            Data::Input(r) => input.get(r.clone()).unwrap_or(&[]),
            Data::Arena(r) => self.arena.get(r.clone()).unwrap_or(&[]),
        }
    }
    fn push_arena(&mut self, parts: &[&[u8]]) -> Data {
        let start = self.arena.len();
        for p in parts {
            self.arena.extend_from_slice(p);
        }
        Data::Arena(start..self.arena.len())
    }
    /// A datagram of type `type_id` with `payload`, built in the arena.
    fn push_frame(&mut self, type_id: u16, payload: &[&[u8]]) -> Data {
        let mut hdr = [0u8; anep::HEADER_LEN];
        let n = payload.iter().map(|p| p.len()).sum();
        anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, type_id, n);
        let start = self.arena.len();
        self.arena.extend_from_slice(&hdr);
        for p in payload {
            self.arena.extend_from_slice(p);
        }
        Data::Arena(start..self.arena.len())
    }
}

/// The node's view of the network, as the VM sees it.
#[derive(Debug, Clone)]
struct Env {
    here: Ipv4Addr,
    interfaces: u8,
    neighbors: Vec<Ipv4Addr>,
    /// Destination → next-hop neighbour address.
    next_hop: crate::FastMap<Ipv4Addr, Ipv4Addr>,
    /// Neighbour address → (interface, endpoint).
    link: crate::FastMap<Ipv4Addr, (usize, SocketAddr)>,
    default_via: Option<Ipv4Addr>,
    now_ms: u64,
    services: ServiceTable,
}

impl NodeContext for Env {
    fn here(&self) -> Ipv4Addr {
        self.here
    }
    fn interfaces(&self) -> u8 {
        self.interfaces
    }
    fn next_hop(&self, dest: Ipv4Addr) -> Option<Ipv4Addr> {
        self.next_hop.get(&dest).copied().or(self.default_via)
    }
    fn neighbors(&self) -> &[Ipv4Addr] {
        &self.neighbors
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn services(&self) -> Option<&ServiceTable> {
        Some(&self.services)
    }
}

impl Env {
    fn route(&self, dest: Ipv4Addr) -> Option<(usize, SocketAddr)> {
        let via = self.next_hop(dest)?;
        self.link.get(&via).copied()
    }
}

/// Most packets a single arrival may send to this node itself (`send` to
/// its own address); each also costs resource bound, so this only caps the
/// work of one call.
pub const MAX_LOOPBACK: usize = 64;

/// An anode node, without I/O.
#[derive(Debug)]
pub struct Node {
    env: Env,
    vm: Vm,
    mtu: usize,
    max_rb: u16,
    ports: BTreeSet<u16>,
    /// Counters.
    pub counters: Counters,
    loopback: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    sec: Option<Box<Guard>>,
    /// Interfaces whose transmissions the daemon seals when it sends them
    /// ([`Node::seal_for`]), not when they are produced: the paced links,
    /// whose scheduler reorders datagrams across clients.
    seal_at_send: Vec<bool>,
    now_ms: u64,
    modules: Option<Box<Switch>>,
    /// Neighbour endpoint → neighbour address (who sent a datagram).
    ep_addr: crate::FastMap<SocketAddr, Ipv4Addr>,
    /// Jobs for module channels queued by early demultiplexing, posted
    /// by `channel_deliveries` (the VM's outcome is borrowed meanwhile).
    to_channels: Vec<anode_sandbox::Job>,
    /// RCANE scheduling of module work, when on.
    pub(super) sched: Option<Box<sessions::Sched>>,
    /// The FLAME tap, when `[monitor]` turns it on.
    tap: Option<Box<tap::Tap>>,
    /// The operator's capture (`anode capture`), when one runs.
    capture: capture::CaptureSlot,
    /// Code staged ahead of its load request (`staging`).
    staging: staging::Staging,
    /// Boot recovery served to peers.
    recovery: recovery::Recovery,
    /// The domain's key distribution service.
    kdc: kdc::KdcState,
    /// Membership of an administrative domain: tickets, perimeter.
    domain: Option<Box<domain::DomainState>>,
}

impl Node {
    /// Builds a node from its configuration and, if routes come from a
    /// topology, the parsed topology file.
    ///
    /// A configuration with security on needs [`Node::with_security`].
    pub fn new(cfg: &NodeConfig, topology: Option<&Topology>) -> Result<Node, ConfigError> {
        Node::with_security(cfg, topology, None, 0)
    }

    /// Builds a node; with security on in `cfg`, `sec` gives its identity.
    /// `now_ms` is the time base of later calls (link keys are scheduled
    /// from it).
    pub fn with_security(
        cfg: &NodeConfig,
        topology: Option<&Topology>,
        sec: Option<SecurityInit>,
        now_ms: u64,
    ) -> Result<Node, ConfigError> {
        cfg.validate()?;
        let sec = match (cfg.security_enabled(), sec) {
            (true, Some(init)) => Some(Box::new(Guard::new(cfg, init, now_ms)?)),
            (true, None) => return Err(ConfigError::MissingKeyFile),
            (false, _) => None,
        };
        let mut link = crate::FastMap::default();
        for (i, iface) in cfg.interfaces.iter().enumerate() {
            for n in &iface.neighbors {
                link.insert(n.address, (i, n.endpoint));
            }
        }
        let mut next_hop = crate::FastMap::default();
        for n in cfg.neighbor_addrs() {
            next_hop.insert(n, n);
        }
        if let Some(t) = topology {
            for (dest, via) in t.next_hops(cfg.address)? {
                if link.contains_key(&via) {
                    next_hop.entry(dest).or_insert(via);
                }
            }
        }
        for r in &cfg.routes.static_routes {
            next_hop.insert(r.dest, r.via);
        }
        let names: Vec<String> = cfg.interfaces.iter().map(|i| i.name.clone()).collect();
        let ep_addr = link.iter().map(|(a, (_, ep))| (*ep, *a)).collect();
        Ok(Node {
            env: Env {
                here: cfg.address,
                interfaces: cfg.interfaces.len().clamp(1, u8::MAX as usize) as u8,
                neighbors: cfg.neighbor_addrs(),
                next_hop,
                link,
                default_via: cfg.routes.default_via,
                now_ms: 0,
                services: ServiceTable::with_builtins(),
            },
            vm: Vm::new(VmConfig { mtu: cfg.mtu }),
            mtu: cfg.mtu,
            max_rb: cfg.max_resource_bound,
            ports: BTreeSet::new(),
            counters: Counters::new(&names),
            loopback: Vec::new(),
            scratch: Vec::new(),
            sec,
            seal_at_send: Vec::new(),
            now_ms,
            modules: None,
            ep_addr,
            to_channels: Vec::new(),
            sched: None,
            tap: None,
            capture: capture::CaptureSlot::default(),
            staging: staging::Staging::default(),
            recovery: recovery::Recovery::default(),
            kdc: kdc::KdcState::default(),
            domain: None,
        })
    }

    fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.env.now_ms = now_ms;
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work:
    /// handshake retries and rekeys, SA expiry, module alarms, code-fetch
    /// timeouts, credential expiry. `None`: nothing is scheduled, so the
    /// caller may sleep until the next datagram.
    pub fn poll_at(&self) -> Option<u64> {
        let s = self.sec.as_ref().and_then(|g| g.links.poll_at());
        let m = self.modules.as_ref().and_then(|m| m.sb.poll_at());
        // A session whose credential expires is closed then.
        let e = self.sched.as_ref().and_then(|s| s.rcane.next_expiry()).map(|ns| ns.div_ceil(1_000_000));
        // A session whose principal's SAs are gone is closed after the grace.
        let g = self.gone_check_at();
        let t = self.tap_poll_at();
        [s, m, e, g, t].into_iter().flatten().min()
    }

    /// Runs what is due at `now_ms` (see [`poll_at`](Self::poll_at)): link
    /// keys at boot, retries with backoff, rekeying, expiry, module alarms.
    pub fn handle_timeout(&mut self, now_ms: u64, out: &mut Outbox) {
        self.set_now(now_ms);
        self.post_due_jobs(now_ms, out);
        self.expire_sessions(out);
        self.close_gone_sessions(now_ms);
        self.tap_timeout(now_ms);
        self.poll_security(now_ms, out);
    }

    /// This node's address.
    pub fn address(&self) -> Ipv4Addr {
        self.env.here
    }

    /// The MTU for SNAP packets.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Next hop toward `dest`, if any.
    pub fn next_hop(&self, dest: Ipv4Addr) -> Option<Ipv4Addr> {
        self.env.next_hop(dest)
    }

    /// The routing table: (destination, next-hop neighbour), sorted by
    /// destination. Without a default route.
    pub fn routes(&self) -> Vec<(Ipv4Addr, Ipv4Addr)> {
        let mut v: Vec<_> = self.env.next_hop.iter().map(|(d, v)| (*d, *v)).collect();
        v.sort();
        v
    }

    /// The routing table as the sandbox's `route` interface sees it.
    pub fn route_table(&self) -> HashMap<Ipv4Addr, Ipv4Addr> {
        self.env.next_hop.iter().map(|(d, v)| (*d, *v)).collect()
    }

    /// The service table, to register node services at run time.
    pub fn services_mut(&mut self) -> &mut ServiceTable {
        &mut self.env.services
    }

    /// Registers a local application port; deliveries to unregistered ports
    /// are dropped (`no_listener`).
    pub fn register_port(&mut self, port: u16) {
        self.ports.insert(port);
    }

    /// Removes a port registration.
    pub fn unregister_port(&mut self, port: u16) {
        self.ports.remove(&port);
    }

    /// [`count_tx`](Self::count_tx) for many datagrams at once: `packets`
    /// sent on `iface` with `bytes` in all, and `failed` refused (a data
    /// path worker counts its sends outside the node's lock and adds them
    /// here after).
    pub fn count_tx_batch(&mut self, iface: usize, packets: u64, bytes: u64, failed: u64) {
        if let Some(c) = self.counters.ifaces.get_mut(iface) {
            c.tx_packets += packets;
            c.tx_bytes += bytes;
        }
        for _ in 0..failed {
            self.counters.drop(crate::counters::Drop::TxFailed);
        }
    }

    /// Counts a finished transmission (the daemon calls this after the
    /// socket accepted it, or with `ok` false if it did not).
    pub fn count_tx(&mut self, iface: usize, bytes: usize, ok: bool) {
        if ok {
            if let Some(c) = self.counters.ifaces.get_mut(iface) {
                c.tx_packets += 1;
                c.tx_bytes += bytes as u64;
            }
        } else {
            self.counters.drop(crate::counters::Drop::TxFailed);
        }
    }
}
#[cfg(test)]
mod send_check {
    fn is_send<T: Send>() {}
    #[test]
    fn node_is_send() {
        is_send::<super::Node>();
    }
}
