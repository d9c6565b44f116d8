//! The sans-I/O node: datagrams and `now` in, transmissions and deliveries
//! out. The daemon owns the sockets; tests run many nodes in one process.
//!
//! ```text
//! datagram ──► ANEP check ──► SNAP: VM in place ──► forward │ children │ deliver │ drop(reason)
//!                         └─► plain: ttl, route  ──► forward │ deliver │ drop(reason)
//!                         └─► unknown type      ──► pass on (flag clear, default route) │ drop
//! ```
//!
//! A packet forwarded in place is transmitted straight from the receive
//! buffer ([`Data::Input`]); child packets are built in the outbox arena.
//! Steady-state handling allocates nothing.

use crate::anep::{self, Anep, AnepError};
use crate::config::{ConfigError, NodeConfig, Topology};
use crate::counters::{Counters, Drop};
use crate::plain::{self, Plain};
use crate::secure::{self, Guard, SecurityInit};
use crate::switchlets::Switch;
use anode_snap::services::ServiceTable;
use anode_snap::vm::{Action, End, Loc, NodeContext, Vm, VmConfig};
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

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Interface index.
    pub iface: usize,
    /// Neighbour endpoint.
    pub to: SocketAddr,
    /// The whole datagram, ANEP header included.
    pub data: Data,
}

/// A payload for a local application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The application port.
    pub port: u16,
    /// The payload.
    pub data: Data,
}

/// What handling one datagram produced. Reuse it: clearing keeps capacity.
#[derive(Debug, Clone, Default)]
pub struct Outbox {
    /// Datagrams to send, in order.
    pub transmits: Vec<Transmit>,
    /// Payloads to deliver, in order.
    pub deliveries: Vec<Delivery>,
    /// `print` output of SNAP packets, if any.
    pub log: String,
    /// Security events worth a log line (links up, rekeys), if any.
    pub events: Vec<String>,
    arena: Vec<u8>,
}

impl Outbox {
    /// Empties the outbox, keeping its buffers.
    pub fn clear(&mut self) {
        self.transmits.clear();
        self.deliveries.clear();
        self.log.clear();
        self.events.clear();
        self.arena.clear();
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
}

/// The node's view of the network, as the VM sees it.
#[derive(Debug, Clone)]
struct Env {
    here: Ipv4Addr,
    interfaces: u8,
    neighbors: Vec<Ipv4Addr>,
    /// Destination → next-hop neighbour address.
    next_hop: HashMap<Ipv4Addr, Ipv4Addr>,
    /// Neighbour address → (interface, endpoint).
    link: HashMap<Ipv4Addr, (usize, SocketAddr)>,
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

/// Whether a local application registered `port`: counts the delivery, or
/// a `no_listener` drop.
fn listener(ports: &BTreeSet<u16>, counters: &mut Counters, port: u16) -> bool {
    if ports.contains(&port) {
        counters.delivered += 1;
        true
    } else {
        counters.drop(Drop::NoListener);
        false
    }
}

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
    now_ms: u64,
    modules: Option<Box<Switch>>,
    /// Neighbour endpoint → neighbour address (who sent a datagram).
    ep_addr: HashMap<SocketAddr, Ipv4Addr>,
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
        let mut link = HashMap::new();
        for (i, iface) in cfg.interfaces.iter().enumerate() {
            for n in &iface.neighbors {
                link.insert(n.address, (i, n.endpoint));
            }
        }
        let mut next_hop = HashMap::new();
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
            now_ms,
            modules: None,
            ep_addr,
        })
    }

    /// Turns on switchlets and capsules with this sandbox (built from the
    /// `[modules]` section by [`crate::switchlets::sandbox`]).
    /// `unix_ms_at_zero` is the wall-clock time when `now_ms` was 0
    /// (credential expiry).
    pub fn enable_modules(&mut self, sb: anode_sandbox::Sandbox, unix_ms_at_zero: u64) {
        self.modules = Some(Box::new(Switch { sb, actions: Vec::new(), unix_ms_at_zero }));
    }

    /// The routing table as the sandbox's `route` interface sees it.
    pub fn route_table(&self) -> HashMap<Ipv4Addr, Ipv4Addr> {
        self.env.next_hop.clone()
    }

    /// The sandbox, when modules are on (to load modules at start).
    pub fn sandbox_mut(&mut self) -> Option<&mut anode_sandbox::Sandbox> {
        self.modules.as_mut().map(|m| &mut m.sb)
    }

    /// The wall-clock time the sandbox sees at `now_ms`.
    pub fn sandbox_now(&self, now_ms: u64) -> Option<anode_sandbox::Now> {
        self.modules.as_ref().map(|m| m.now(now_ms))
    }

    /// The modules section of `anode status` (None when modules are off).
    pub fn modules_json(&self) -> Option<serde_json::Value> {
        self.modules.as_ref().map(|m| crate::switchlets::to_json(&m.sb))
    }

    /// Whether switchlets and capsules are on.
    pub fn modules_on(&self) -> bool {
        self.modules.is_some()
    }

    /// Runs a capsule from a local application here (its first hop).
    /// A refusal is returned, so the application learns why (expired,
    /// wrong issuer, missing right, ...).
    pub fn inject_capsule(
        &mut self,
        bytes: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) -> Result<(), anode_sandbox::CapsuleError> {
        self.env.now_ms = now_ms;
        self.now_ms = now_ms;
        self.counters.injected += 1;
        let mark = out.transmits.len();
        let here = self.env.here;
        let r = self.capsule(here, bytes, now_ms, out);
        self.protect(&[], out, mark, now_ms);
        r
    }

    /// Hands a capsule-protocol message from neighbour `prev` to the
    /// sandbox and carries out its actions; a refusal is counted and returned.
    fn capsule(
        &mut self,
        prev: Ipv4Addr,
        msg: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) -> Result<(), anode_sandbox::CapsuleError> {
        if self.modules.is_none() {
            self.counters.drop(Drop::UnknownType);
            return Ok(());
        }
        self.counters.rx_capsule += 1;
        match self.with_sandbox(now_ms, out, |sb, now, a| sb.handle_capsule(now, prev, msg, a)) {
            Some(Err(e)) => {
                self.counters.drop(Drop::CapsuleRefused);
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Calls the sandbox with its (reused, cleared) action list, then
    /// carries out the actions. None when modules are off.
    fn with_sandbox<R>(
        &mut self,
        now_ms: u64,
        out: &mut Outbox,
        f: impl FnOnce(&mut anode_sandbox::Sandbox, anode_sandbox::Now, &mut Vec<anode_sandbox::Action>) -> R,
    ) -> Option<R> {
        let m = self.modules.as_mut()?;
        let now = m.now(now_ms);
        let mut actions = std::mem::take(&mut m.actions);
        actions.clear();
        let r = f(&mut m.sb, now, &mut actions);
        self.module_actions(&mut actions, out);
        if let Some(m) = self.modules.as_mut() {
            m.actions = actions;
        }
        Some(r)
    }

    /// Carries out what modules asked for.
    fn module_actions(&mut self, actions: &mut Vec<anode_sandbox::Action>, out: &mut Outbox) {
        for a in actions.drain(..) {
            match a {
                anode_sandbox::Action::SendCapsule { to, bytes } => match self.env.link.get(&to).copied() {
                    Some((iface, ep)) => {
                        let mut hdr = [0u8; anep::HEADER_LEN];
                        anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_CAPSULE, bytes.len());
                        let data = out.push_arena(&[&hdr, &bytes]);
                        out.transmits.push(Transmit { iface, to: ep, data });
                    }
                    None => self.counters.drop(Drop::NoRoute),
                },
                anode_sandbox::Action::SendPacket { dst, port, payload } => {
                    self.send_plain(dst, port, 64, &payload, out);
                }
                anode_sandbox::Action::DeliverLocal { port, payload } => {
                    if listener(&self.ports, &mut self.counters, port) {
                        let data = out.push_arena(&[&payload]);
                        out.deliveries.push(Delivery { port, data });
                    }
                }
                anode_sandbox::Action::Log { module, principal, text } => {
                    use core::fmt::Write;
                    let _ = writeln!(out.log, "module {module} ({principal:?}): {text}");
                }
            }
        }
    }

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
    pub fn link_up(&self, addr: Ipv4Addr) -> bool {
        let Some(g) = &self.sec else { return true };
        let Some(&(_, ep)) = self.env.link.get(&addr) else { return false };
        g.peer_at(&ep).is_some_and(|p| g.links.is_up(p))
    }

    /// Drives the security layer's timers: link keys at boot, retries with
    /// backoff, rekeying, expiry. Call it periodically (the daemon does on
    /// every tick) and at start. A no-op when security is off.
    pub fn poll(&mut self, now_ms: u64, out: &mut Outbox) {
        self.now_ms = now_ms;
        self.env.now_ms = now_ms;
        if self.modules.as_ref().is_some_and(|m| m.sb.poll_at().is_some_and(|t| t <= now_ms)) {
            let mark = out.transmits.len();
            self.with_sandbox(now_ms, out, |sb, now, a| sb.handle_timeout(now, a));
            self.protect(&[], out, mark, now_ms);
        }
        let Some(g) = self.sec.as_mut() else { return };
        let mut outs = std::mem::take(&mut g.outs);
        outs.clear();
        g.links.poll(now_ms, &mut outs);
        self.emit_security(&mut outs, None, now_ms, out);
        if let Some(g) = self.sec.as_mut() {
            g.outs = outs;
        }
    }

    /// Turns the security layer's outputs into transmissions.
    fn emit_security(
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
                    let mut hdr = [0u8; anep::HEADER_LEN];
                    anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, msg.len());
                    let data = out.push_arena(&[&hdr, &msg]);
                    out.transmits.push(Transmit { iface, to, data });
                }
                anode_sec::Output::Keepalive { peer } => {
                    let Some(to) = g.links.endpoint_of(peer) else { continue };
                    let Some(iface) = g.iface_of(&to).or(rx_iface) else { continue };
                    if let Some(data) = seal_into(g, peer, &mut out.arena, Inner::Empty, now_ms) {
                        self.counters.keepalives_tx += 1;
                        out.transmits.push(Transmit { iface, to, data });
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
    fn protect(&mut self, buf: &[u8], out: &mut Outbox, mark: usize, now_ms: u64) {
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

    /// Handles one received datagram in `buf[..len]` from interface `iface`.
    ///
    /// `buf` should be [`recv_buffer_len`] long so SNAP packets execute in
    /// place; a shorter buffer works but copies. Results go to `out`, which
    /// is not cleared first.
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
        self.env.now_ms = now_ms;
        self.now_ms = now_ms;
        let len = len.min(buf.len());
        if let Some(c) = self.counters.ifaces.get_mut(iface) {
            c.rx_packets += 1;
            c.rx_bytes += len as u64;
        }
        let mark = out.transmits.len();
        if self.sec.is_none() {
            let prev = from.and_then(|f| self.ep_addr.get(&f).copied());
            self.dispatch(iface, prev, buf, 0, len, out);
            self.drain_loopback(now_ms, out);
            return;
        }
        let a = match self.outer(&buf[..len]) {
            Some(a) => a,
            None => return,
        };
        let Some(g) = self.sec.as_mut() else { return };
        match a.type_id {
            anep::TYPE_HANDSHAKE => {
                let src = from.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
                let mut outs = std::mem::take(&mut g.outs);
                outs.clear();
                let res = g.links.handle_handshake(src, &buf[a.payload_start..len], now_ms, &mut outs);
                match res {
                    Ok(()) => self.counters.handshakes_rx += 1,
                    Err(e) => self.counters.drop(secure::drop_of_handshake(e)),
                }
                self.emit_security(&mut outs, Some(iface), now_ms, out);
                if let Some(g) = self.sec.as_mut() {
                    g.outs = outs;
                }
            }
            anep::TYPE_AUTH | anep::TYPE_ESP => {
                let enc = a.type_id == anep::TYPE_ESP;
                match g.links.open(&mut buf[..len], a.payload_start, enc, now_ms) {
                    Ok(o) if o.inner.is_empty() => self.counters.keepalives_rx += 1,
                    Ok(o) if Node::is_control(buf, &o.inner) => {
                        self.counters.rx_authenticated += 1;
                        let from = g.links.key_of(o.peer);
                        let to = g.links.endpoint_of(o.peer);
                        self.control(from, to, iface, buf, o.inner.clone(), now_ms, out);
                        self.protect(buf, out, mark, now_ms);
                    }
                    Ok(o) => {
                        self.counters.rx_authenticated += 1;
                        let prev = g.links.endpoint_of(o.peer).and_then(|e| self.ep_addr.get(&e).copied());
                        self.dispatch(iface, prev, buf, o.inner.start, o.inner.end, out);
                        self.drain_loopback(now_ms, out);
                        self.protect(buf, out, mark, now_ms);
                    }
                    Err(r) => {
                        if r == anode_sec::Reject::UnknownSpi
                            && let Some(p) = from.and_then(|f| g.peer_at(&f))
                        {
                            g.links.kick(p, now_ms);
                        }
                        self.counters.drop(secure::drop_of_reject(r));
                    }
                }
            }
            _ => self.counters.drop(Drop::NonNeighbor),
        }
    }

    /// Whether the verified inner datagram is a control message.
    fn is_control(buf: &[u8], inner: &core::ops::Range<usize>) -> bool {
        buf.get(inner.clone()).and_then(|b| Anep::parse(b).ok()).is_some_and(|a| a.type_id == anep::TYPE_CONTROL)
    }

    /// A control message from an authenticated principal (`from`): today
    /// one request, loading a module (`docs/modules.md`). The answer goes
    /// back over the same SA as a control message.
    #[allow(clippy::too_many_arguments)]
    fn control(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        to: Option<SocketAddr>,
        iface: usize,
        buf: &[u8],
        inner: core::ops::Range<usize>,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let Some(body) = buf.get(inner).and_then(|b| Anep::parse(b).ok().map(|a| &b[a.payload_start..])) else {
            return;
        };
        let reply = match (crate::switchlets::LoadRequest::parse(body), from) {
            (Err(e), _) => format!("refused: {e}"),
            _ if self.modules.is_none() => "refused: this node runs no modules".to_string(),
            (_, None) => "refused: unknown principal".to_string(),
            (Ok(req), Some(key)) => {
                let spec = anode_sandbox::LoadSpec {
                    code: req.code,
                    credential: Some(req.credential),
                    requester: Some(anode_sandbox::PrincipalId(*key.as_bytes())),
                    local_name: req.name,
                    limits: Default::default(),
                };
                match self.with_sandbox(now_ms, out, |sb, now, a| sb.load_once(now, &spec, a)) {
                    Some(Ok((id, false))) => format!("loaded {id}"),
                    Some(Ok((id, true))) => format!("already loaded {id}"),
                    Some(Err(e)) => {
                        self.counters.drop(Drop::CapsuleRefused);
                        format!("refused: {e}")
                    }
                    None => "refused: this node runs no modules".to_string(),
                }
            }
        };
        let Some(to) = to else { return };
        let mut hdr = [0u8; anep::HEADER_LEN];
        anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_CONTROL, reply.len());
        let data = out.push_arena(&[&hdr, reply.as_bytes()]);
        out.transmits.push(Transmit { iface, to, data });
    }

    /// Checks an ANEP datagram, counting the drop reason if it is bad.
    fn outer(&mut self, datagram: &[u8]) -> Option<Anep> {
        match Anep::parse(datagram) {
            Ok(a) => Some(a),
            Err(e) => {
                self.counters.drop(match e {
                    AnepError::Truncated(_) => Drop::AnepTruncated,
                    AnepError::BadVersion(_) => Drop::AnepBadVersion,
                    AnepError::BadHeaderLength { .. } | AnepError::BadPacketLength { .. } => Drop::AnepBadLength,
                    _ => Drop::AnepBadOption,
                });
                None
            }
        }
    }

    /// Handles the ANEP datagram at `buf[base..end]` (the whole received
    /// datagram, or the inner one of a verified protected datagram).
    fn dispatch(
        &mut self,
        iface: usize,
        prev: Option<Ipv4Addr>,
        buf: &mut [u8],
        base: usize,
        end: usize,
        out: &mut Outbox,
    ) {
        let _ = iface;
        let Some(a) = self.outer(&buf[base..end]) else { return };
        let (ps, len) = (base + a.payload_start, end);
        match a.type_id {
            anep::TYPE_SNAP => {
                self.counters.rx_snap += 1;
                self.run_snap(buf, ps, len, out);
            }
            anep::TYPE_PLAIN => {
                self.counters.rx_plain += 1;
                self.plain(buf, base, ps, len, out);
            }
            anep::TYPE_CAPSULE if self.modules.is_some() => {
                let now = self.now_ms;
                // A neighbour's refused capsule is counted by reason (status).
                let _ = self.capsule(prev.unwrap_or(Ipv4Addr::UNSPECIFIED), &buf[ps..len], now, out);
            }
            anep::TYPE_AUTH | anep::TYPE_ESP | anep::TYPE_HANDSHAKE if self.sec.is_some() => {
                // Nested in a verified datagram: not something to forward.
                self.counters.drop(Drop::NonNeighbor);
            }
            _ => {
                self.counters.rx_unknown += 1;
                let pass = if a.discard_if_unknown() { None } else { self.env.default_via };
                match pass.and_then(|v| self.env.link.get(&v).copied()) {
                    Some((iface, to)) => {
                        self.counters.passed_on += 1;
                        self.transmit(out, iface, to, Data::Input(base..len));
                    }
                    None => self.counters.drop(Drop::UnknownType),
                }
            }
        }
    }

    /// Executes a SNAP packet injected by a local application, as if it had
    /// arrived here (this is its first hop: its resource bound is
    /// decremented here).
    pub fn inject_snap(&mut self, packet: &[u8], now_ms: u64, out: &mut Outbox) {
        self.env.now_ms = now_ms;
        self.counters.injected += 1;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.resize(recv_buffer_len(self.mtu).max(anep::HEADER_LEN + packet.len() * 5), 0);
        anep::write_header(&mut buf, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, packet.len());
        buf[anep::HEADER_LEN..anep::HEADER_LEN + packet.len()].copy_from_slice(packet);
        let mark = (out.transmits.len(), out.deliveries.len());
        self.run_snap(&mut buf, anep::HEADER_LEN, anep::HEADER_LEN + packet.len(), out);
        // Transmissions that point into `buf` must move to the arena.
        self.detach(&buf, out, mark);
        self.scratch = buf;
        self.drain_loopback(now_ms, out);
        self.now_ms = now_ms;
        self.protect(&[], out, mark.0, now_ms);
    }

    /// Sends a plain packet from a local application.
    pub fn inject_plain(&mut self, dst: Ipv4Addr, port: u16, ttl: u8, payload: &[u8], now_ms: u64, out: &mut Outbox) {
        self.env.now_ms = now_ms;
        self.now_ms = now_ms;
        self.counters.injected += 1;
        let mark = out.transmits.len();
        self.send_plain(dst, port, ttl, payload, out);
        self.protect(&[], out, mark, now_ms);
    }

    /// Builds a plain packet from this node and routes it (or delivers it
    /// here). The caller protects the transmission.
    fn send_plain(&mut self, dst: Ipv4Addr, port: u16, ttl: u8, payload: &[u8], out: &mut Outbox) {
        let mut hdr = [0u8; anep::HEADER_LEN + plain::HEADER_LEN];
        anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, plain::HEADER_LEN + payload.len());
        Plain { dst, src: self.env.here, ttl, port }.emit(&mut hdr[anep::HEADER_LEN..]);
        if dst == self.env.here {
            if listener(&self.ports, &mut self.counters, port) {
                let data = out.push_arena(&[payload]);
                out.deliveries.push(Delivery { port, data });
            }
            return;
        }
        match self.env.route(dst) {
            Some((iface, to)) => {
                let d = out.push_arena(&[&hdr, payload]);
                self.transmit(out, iface, to, d);
            }
            None => self.counters.drop(Drop::NoRoute),
        }
    }

    /// Moves the bytes of the transmissions and deliveries from index `mark`
    /// on that point into `buf` to the arena. Earlier entries point into
    /// other buffers (the caller's receive buffer) and are left alone.
    fn detach(&self, buf: &[u8], out: &mut Outbox, mark: (usize, usize)) {
        for i in mark.0..out.transmits.len() {
            if let Data::Input(r) = out.transmits[i].data.clone() {
                let d = out.push_arena(&[buf.get(r).unwrap_or(&[])]);
                out.transmits[i].data = d;
            }
        }
        for i in mark.1..out.deliveries.len() {
            if let Data::Input(r) = out.deliveries[i].data.clone() {
                let d = out.push_arena(&[buf.get(r).unwrap_or(&[])]);
                out.deliveries[i].data = d;
            }
        }
    }

    fn drain_loopback(&mut self, now_ms: u64, out: &mut Outbox) {
        let mut n = 0;
        while let Some(p) = self.loopback.pop() {
            n += 1;
            if n > MAX_LOOPBACK {
                self.counters.drop(Drop::LoopbackLimit);
                continue;
            }
            self.counters.rx_snap += 1;
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.resize(recv_buffer_len(self.mtu).max(p.len() * 5), 0);
            buf[..p.len()].copy_from_slice(&p);
            self.env.now_ms = now_ms;
            let mark = (out.transmits.len(), out.deliveries.len());
            self.run_snap(&mut buf, anep::HEADER_LEN, p.len(), out);
            self.detach(&buf, out, mark);
            self.scratch = buf;
        }
    }

    fn transmit(&mut self, out: &mut Outbox, iface: usize, to: SocketAddr, data: Data) {
        out.transmits.push(Transmit { iface, to, data });
    }

    /// Runs the SNAP packet at `buf[ps..len]` (the ANEP header is in
    /// `buf[..ps]`) and turns its actions into transmissions and deliveries.
    fn run_snap(&mut self, buf: &mut [u8], ps: usize, len: usize, out: &mut Outbox) {
        // Like IP's TTL cap: no packet brings more resource bound into this
        // node than it allows (the VM checks the rest of the header).
        if ps + 6 <= len
            && let Some(rb) = buf.get_mut(ps + 4..ps + 6)
            && u16::from_be_bytes([rb[0], rb[1]]) > self.max_rb
        {
            rb.copy_from_slice(&self.max_rb.to_be_bytes());
            self.counters.rb_clamped += 1;
        }
        let res = self.vm.execute(&mut buf[ps..], len - ps, &self.env);
        self.counters.vm_instructions += res.executed as u64;
        if let End::Fault { fault, .. } = res.end {
            self.counters.vm_faults[fault.kind_index()] += 1;
            self.counters.drop(Drop::VmFault);
            return;
        }
        out.log.push_str(&res.log);
        let mut in_place = None;
        for act in res.actions() {
            match act {
                Action::Send { dest, kind, packet } => {
                    match kind {
                        anode_snap::vm::SendKind::Forward => self.counters.snap_forwarded += 1,
                        anode_snap::vm::SendKind::Child => self.counters.snap_children += 1,
                    }
                    let bytes = res.bytes(packet, &buf[ps..]);
                    if *dest == self.env.here {
                        // SNAP `send` to this node: run it here again.
                        let mut v = vec![0; anep::HEADER_LEN + bytes.len()];
                        anep::write_header(&mut v, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, bytes.len());
                        v[anep::HEADER_LEN..].copy_from_slice(bytes);
                        self.loopback.push(v);
                        continue;
                    }
                    let Some((iface, to)) = self.env.route(*dest) else {
                        self.counters.drop(Drop::NoRoute);
                        continue;
                    };
                    let data = match packet {
                        Loc::Input(r) if r.start == 0 => {
                            // Forwarded in place: the ANEP header just before
                            // the packet is rewritten below; send from the buffer.
                            in_place = Some(r.end);
                            Data::Input(ps - anep::HEADER_LEN..ps + r.end)
                        }
                        _ => {
                            let mut hdr = [0u8; anep::HEADER_LEN];
                            anep::write_header(&mut hdr, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, bytes.len());
                            out.push_arena(&[&hdr, bytes])
                        }
                    };
                    out.transmits.push(Transmit { iface, to, data });
                }
                Action::Deliver { port, payload } => {
                    if !listener(&self.ports, &mut self.counters, *port) {
                        continue;
                    }
                    let data = match payload {
                        Loc::Input(r) => Data::Input(ps + r.start..ps + r.end),
                        Loc::Arena(_) => out.push_arena(&[res.bytes(payload, &buf[ps..])]),
                    };
                    out.deliveries.push(Delivery { port: *port, data });
                }
            }
        }
        if let Some(n) = in_place {
            anep::write_header(&mut buf[ps - anep::HEADER_LEN..], anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, n);
        }
    }

    fn plain(&mut self, buf: &mut [u8], base: usize, ps: usize, len: usize, out: &mut Outbox) {
        let p = match Plain::parse(&buf[ps..len]) {
            Ok(p) => p,
            Err(_) => {
                self.counters.drop(Drop::PlainMalformed);
                return;
            }
        };
        if p.dst == self.env.here {
            if listener(&self.ports, &mut self.counters, p.port) {
                out.deliveries.push(Delivery { port: p.port, data: Data::Input(ps + plain::HEADER_LEN..len) });
            }
            return;
        }
        if p.ttl == 0 {
            self.counters.drop(Drop::TtlExceeded);
            return;
        }
        let Some((iface, to)) = self.env.route(p.dst) else {
            self.counters.drop(Drop::NoRoute);
            return;
        };
        buf[ps + 8] = p.ttl - 1;
        self.counters.plain_forwarded += 1;
        self.transmit(out, iface, to, Data::Input(base..len));
    }

    /// Counts a finished transmission (the daemon calls this after the
    /// socket accepted it, or `tx_failed` if it did not).
    pub fn count_tx(&mut self, iface: usize, bytes: usize, ok: bool) {
        if ok {
            if let Some(c) = self.counters.ifaces.get_mut(iface) {
                c.tx_packets += 1;
                c.tx_bytes += bytes as u64;
            }
        } else {
            self.counters.drop(Drop::TxFailed);
        }
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
