//! The local application socket: one `SOCK_SEQPACKET` connection per
//! client, so clients are isolated as a kernel isolates sockets.
//!
//! With one datagram socket for every client, the kernel charged each
//! client's unread messages to the node's single send buffer: one client
//! that stopped reading made every send fail, for everyone. Here each
//! client has its own connection, with its own kernel buffers, and beyond
//! them a bounded queue in the node ([`LocalLimits::client_queue`]
//! messages). What does not fit is dropped and counted for that client
//! only; a client whose queue stays non-empty for
//! [`LocalLimits::stall_timeout`] is disconnected, and its ports freed.
//!
//! A port belongs to the client that registered it until that client
//! unregisters it or goes away; another client's REGISTER is refused with
//! the owner's process id. Each client may hold at most
//! [`LocalLimits::max_ports_per_client`] ports, and at most
//! [`LocalLimits::max_clients`] clients are connected at once.

use crate::daemon::{Daemon, LocalStats};
use crate::{APP_BATCH, TOKEN_APP_CLIENT, interest};
use anode_node::core::{Node, Outbox};
use anode_node::counters::{Counters, DROP_NAMES, Drop};
use anode_wire::local::{self, Reply, Request};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{MsgFlags, getsockopt, recv, send, sockopt};
use socket2::{Domain, SockAddr, Socket, Type};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// Limits of the local application API (`[local]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimits {
    /// Clients connected at once; more are refused.
    pub max_clients: usize,
    /// Ports one client may hold.
    pub max_ports_per_client: usize,
    /// Messages queued in the node for one client whose socket is full.
    pub client_queue: usize,
    /// How long a client may leave its queue unread before it is
    /// disconnected.
    pub stall_timeout: Duration,
}

/// Why a client was disconnected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// It closed its end.
    Closed,
    /// It left its messages unread for too long.
    Stalled,
    /// Its socket failed.
    Error,
}

/// One connected client.
#[derive(Debug)]
pub(crate) struct AppClient {
    pub sock: Socket,
    /// Its process and user, from `SO_PEERCRED`.
    pub pid: Option<i32>,
    pub uid: Option<u32>,
    pub ports: BTreeSet<u16>,
    queue: VecDeque<Vec<u8>>,
    /// Since when messages wait in `queue`.
    stalled_since: Option<Instant>,
    /// Messages dropped because its queue was full.
    pub dropped: u64,
    /// Set when a send failed for good; reaped by the daemon.
    pub dead: Option<Gone>,
}

impl AppClient {
    fn new(sock: Socket) -> AppClient {
        let cred = getsockopt(&sock.as_fd(), sockopt::PeerCredentials).ok();
        AppClient {
            sock,
            pid: cred.map(|c| c.pid()),
            uid: cred.map(|c| c.uid()),
            ports: BTreeSet::new(),
            queue: VecDeque::new(),
            stalled_since: None,
            dropped: 0,
            dead: None,
        }
    }

    /// How the client is named in errors and logs.
    pub fn who(&self) -> String {
        match (self.pid, self.uid) {
            (Some(p), Some(u)) => format!("pid {p}, uid {u}"),
            _ => "unknown process".to_string(),
        }
    }

    /// Whether writes are waiting for the socket.
    pub fn wants_write(&self) -> bool {
        !self.queue.is_empty()
    }
}

/// What [`AppClients::send`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Handed to the kernel.
    Now,
    /// Queued in the node until the socket has room (now wants EPOLLOUT).
    Queued,
    /// The queue was full: dropped and counted.
    Dropped,
    /// The client is gone.
    Gone,
}

/// The connected clients and who holds which port.
#[derive(Debug)]
pub(crate) struct AppClients {
    pub limits: LocalLimits,
    pub slots: Vec<Option<AppClient>>,
    /// Port → slot of the client holding it.
    pub ports: BTreeMap<u16, usize>,
}

fn send_now(sock: &Socket, msg: &[u8]) -> Result<bool, Errno> {
    loop {
        match send(sock.as_raw_fd(), msg, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => return Ok(true),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

impl AppClients {
    pub fn new(limits: LocalLimits) -> AppClients {
        AppClients { limits, slots: Vec::new(), ports: BTreeMap::new() }
    }

    /// Clients connected now.
    pub fn connected(&self) -> usize {
        self.slots.iter().filter(|c| c.is_some()).count()
    }

    /// Adds an accepted connection; None (and the socket closed) when the
    /// limit is reached.
    pub fn add(&mut self, sock: Socket) -> Option<usize> {
        if self.connected() >= self.limits.max_clients {
            return None;
        }
        let c = AppClient::new(sock);
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(c);
                Some(i)
            }
            None => {
                self.slots.push(Some(c));
                Some(self.slots.len() - 1)
            }
        }
    }

    pub fn get(&self, slot: usize) -> Option<&AppClient> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut AppClient> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Removes a client; returns it (its ports are released here).
    pub fn remove(&mut self, slot: usize) -> Option<AppClient> {
        let c = self.slots.get_mut(slot).and_then(Option::take)?;
        for p in &c.ports {
            self.ports.remove(p);
        }
        Some(c)
    }

    /// Sends `msg` to the client in `slot`: straight to its socket, or
    /// queued behind what already waits, or dropped when its queue is full.
    pub fn send(&mut self, slot: usize, msg: &[u8]) -> Sent {
        let limit = self.limits.client_queue;
        let Some(c) = self.get_mut(slot) else { return Sent::Gone };
        if c.dead.is_some() {
            return Sent::Gone;
        }
        if c.queue.is_empty() {
            match send_now(&c.sock, msg) {
                Ok(true) => return Sent::Now,
                Ok(false) => {}
                Err(_) => {
                    c.dead = Some(Gone::Error);
                    return Sent::Gone;
                }
            }
        }
        if c.queue.len() >= limit {
            c.dropped += 1;
            return Sent::Dropped;
        }
        if c.queue.is_empty() {
            c.stalled_since = Some(Instant::now());
        }
        c.queue.push_back(msg.to_vec());
        Sent::Queued
    }

    /// Writes what the client's socket takes now; true when its queue is
    /// empty again.
    pub fn flush(&mut self, slot: usize) -> bool {
        let Some(c) = self.get_mut(slot) else { return true };
        while let Some(m) = c.queue.front() {
            match send_now(&c.sock, m) {
                Ok(true) => {
                    c.queue.pop_front();
                }
                Ok(false) => return false,
                Err(_) => {
                    c.dead = Some(Gone::Error);
                    c.queue.clear();
                    break;
                }
            }
        }
        c.stalled_since = None;
        true
    }

    /// When the first of the stalled clients reaches the stall limit.
    pub fn next_stall_deadline(&self) -> Option<Instant> {
        let t = self.limits.stall_timeout;
        self.slots.iter().flatten().filter_map(|c| c.stalled_since.map(|s| s + t)).min()
    }

    /// Slots of clients stalled for longer than the limit at `now`.
    pub fn stalled(&self, now: Instant) -> Vec<usize> {
        let t = self.limits.stall_timeout;
        (0..self.slots.len())
            .filter(|&i| self.get(i).is_some_and(|c| c.stalled_since.is_some_and(|s| now.duration_since(s) >= t)))
            .collect()
    }

    /// Slots of clients whose sockets failed.
    pub fn dead(&self) -> Vec<(usize, Gone)> {
        (0..self.slots.len()).filter_map(|i| self.get(i).and_then(|c| c.dead).map(|g| (i, g))).collect()
    }
}

/// Receives one message from a client socket into `buf`: `Ok(None)` when
/// nothing is waiting, `Ok(Some(0))` at end of stream.
pub(crate) fn recv_msg(sock: &Socket, buf: &mut [u8]) -> Result<Option<usize>, Errno> {
    loop {
        match recv(sock.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => return Ok(Some(n)),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// The listening application socket (`SOCK_SEQPACKET`, non-blocking).
pub(crate) fn app_listener(path: &Path) -> io::Result<Socket> {
    let s = Socket::new(Domain::UNIX, Type::SEQPACKET.nonblocking(), None)?;
    s.bind(&SockAddr::unix(path)?)?;
    s.listen(128)?;
    Ok(s)
}

impl Daemon {
    /// Accepts waiting application clients, each on its own connection.
    pub(crate) fn accept_app(&mut self) {
        loop {
            let sock = match self.app.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            let Some(slot) = self.clients.add(sock) else {
                self.stats.clients_refused += 1;
                debug!(max = self.clients.limits.max_clients, "application client refused: too many connected");
                continue;
            };
            let ok = self.clients.get(slot).is_some_and(|c| {
                interest(
                    &c.sock,
                    &self.epoll,
                    EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP,
                    TOKEN_APP_CLIENT + slot as u64,
                )
                .is_ok()
            });
            if !ok {
                self.clients.remove(slot);
                continue;
            }
            self.stats.clients_accepted += 1;
            if let Some(c) = self.clients.get(slot) {
                debug!(client = %c.who(), "application client connected");
            }
        }
    }

    /// Reads an application client's requests (a bounded batch), and writes
    /// what waits for it.
    pub(crate) fn app_client_ready(&mut self, slot: usize, ev: EpollFlags) {
        if ev.contains(EpollFlags::EPOLLOUT) && self.clients.flush(slot) {
            self.watch_client(slot, false);
        }
        let mut buf = std::mem::take(&mut self.app_buf);
        for _ in 0..APP_BATCH {
            let Some(c) = self.clients.get(slot) else { break };
            match recv_msg(&c.sock, &mut buf) {
                Ok(None) => {
                    if ev.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
                        self.drop_client(slot, Gone::Closed);
                    }
                    break;
                }
                Ok(Some(0)) => {
                    self.drop_client(slot, Gone::Closed);
                    break;
                }
                Ok(Some(n)) => {
                    self.stats.requests += 1;
                    self.app_request(slot, &buf[..n]);
                }
                Err(_) => {
                    self.drop_client(slot, Gone::Error);
                    break;
                }
            }
        }
        self.app_buf = buf;
    }

    /// Whether the loop waits for room in client `slot`'s socket.
    fn watch_client(&mut self, slot: usize, write: bool) {
        let Some(c) = self.clients.get(slot) else { return };
        let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        if write {
            flags |= EpollFlags::EPOLLOUT;
        }
        let mut e = EpollEvent::new(flags, TOKEN_APP_CLIENT + slot as u64);
        let _ = self.epoll.modify(&c.sock, &mut e);
    }

    /// Disconnects a client and releases its ports.
    fn drop_client(&mut self, slot: usize, why: Gone) {
        let Some(c) = self.clients.remove(slot) else { return };
        let _ = self.epoll.delete(&c.sock);
        for p in &c.ports {
            self.node.unregister_port(*p);
        }
        match why {
            Gone::Stalled => {
                self.stats.clients_stalled += 1;
                info!(client = %c.who(), ports = ?c.ports, dropped = c.dropped,
                      "application client left its messages unread too long; disconnected");
            }
            Gone::Closed | Gone::Error => {
                self.stats.clients_gone += 1;
                debug!(client = %c.who(), ports = ?c.ports, "application client gone; its ports released");
            }
        }
    }

    /// Disconnects clients whose sockets failed or that stayed stalled.
    pub(crate) fn reap_clients(&mut self, now: Instant) {
        for (slot, why) in self.clients.dead() {
            self.drop_client(slot, why);
        }
        for slot in self.clients.stalled(now) {
            self.drop_client(slot, Gone::Stalled);
        }
    }

    /// Queues `bytes` for client `slot`, watching for room if needed.
    fn reply(&mut self, slot: usize, bytes: &[u8]) {
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.send(slot, bytes);
    }

    fn app_request(&mut self, slot: usize, msg: &[u8]) {
        let now_ms = self.now_ms();
        let mtu = self.cfg.mtu;
        let reply: Result<Reply<'_>, String> = if msg.len() > local::MAX_MESSAGE {
            Err(format!("message longer than {} bytes", local::MAX_MESSAGE))
        } else {
            match Request::decode(msg) {
                Err(e) => Err(e.to_string()),
                Ok(Request::Hello) => {
                    Ok(Reply::Info { address: self.node.address(), mtu: mtu.min(u16::MAX as usize) as u16 })
                }
                Ok(Request::Register(port)) => self.register(slot, port).map(|()| Reply::Ok),
                Ok(Request::Unregister(port)) => match self.clients.ports.get(&port) {
                    Some(owner) if *owner != slot => {
                        let who = self.clients.get(*owner).map(|c| c.who()).unwrap_or_default();
                        Err(format!("port {port} is registered by another client ({who})"))
                    }
                    Some(_) => {
                        self.clients.ports.remove(&port);
                        if let Some(c) = self.clients.get_mut(slot) {
                            c.ports.remove(&port);
                        }
                        self.node.unregister_port(port);
                        Ok(Reply::Ok)
                    }
                    None => Ok(Reply::Ok),
                },
                Ok(Request::Inject(packet)) => {
                    if packet.len() > mtu {
                        Err(format!("packet is {} bytes, larger than the MTU ({mtu})", packet.len()))
                    } else {
                        let before = snapshot(&self.node.counters);
                        self.inject_out.clear();
                        self.node.inject_snap(packet, now_ms, &mut self.inject_out);
                        self.outcome(&before)
                    }
                }
                Ok(Request::Capsule(bytes)) => {
                    if !self.node.modules_on() {
                        Err("this node runs no modules (no [modules] section in its config)".to_string())
                    } else {
                        let before = snapshot(&self.node.counters);
                        self.inject_out.clear();
                        match self.node.inject_capsule(bytes, now_ms, &mut self.inject_out) {
                            Err(e) => Err(e.to_string()),
                            Ok(()) => self.outcome(&before),
                        }
                    }
                }
                Ok(Request::Plain { dst, port, ttl, payload }) => {
                    if payload.len() + anode_wire::plain::HEADER_LEN > mtu {
                        Err(format!("payload is {} bytes, too large for the MTU ({mtu})", payload.len()))
                    } else {
                        let before = snapshot(&self.node.counters);
                        self.inject_out.clear();
                        self.node.inject_plain(dst, port, ttl, payload, now_ms, &mut self.inject_out);
                        self.outcome(&before)
                    }
                }
            }
        };
        let bytes = match &reply {
            Ok(r) => r.encode(),
            Err(reason) => {
                self.stats.refused += 1;
                debug!(client = %self.clients.get(slot).map(|c| c.who()).unwrap_or_default(), %reason, "request refused");
                Reply::Error(reason).encode()
            }
        };
        self.reply(slot, &bytes);
        // Reply first, then what the request produced (a ping to this node
        // itself gets OK, then DELIVER).
        self.transmit(crate::udp::Outs::Inject);
        let outs = std::slice::from_ref(&self.inject_out);
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, outs, &[[0u8; 0]]);
        self.inject_out.clear();
    }

    /// REGISTER: a port belongs to the client that registered it until it
    /// unregisters it or goes away; each client holds a bounded number.
    fn register(&mut self, slot: usize, port: u16) -> Result<(), String> {
        let max = self.clients.limits.max_ports_per_client;
        match self.clients.ports.get(&port) {
            Some(owner) if *owner == slot => return Ok(()),
            Some(owner) => {
                let who = self.clients.get(*owner).map(|c| c.who()).unwrap_or_default();
                return Err(format!("port {port} is registered by another client ({who})"));
            }
            None => {}
        }
        let Some(c) = self.clients.get_mut(slot) else { return Err("client gone".into()) };
        if c.ports.len() >= max {
            return Err(format!("this client holds {max} ports, the most allowed ([local] max_ports_per_client)"));
        }
        c.ports.insert(port);
        self.clients.ports.insert(port, slot);
        self.node.register_port(port);
        debug!(port, "port registered");
        Ok(())
    }

    /// The reply to an INJECT or PLAIN request: ERROR if the packet was
    /// dropped at this node.
    fn outcome(&self, before: &(Vec<u64>, Vec<u64>)) -> Result<Reply<'static>, String> {
        let c = &self.node.counters;
        for (k, (now, was)) in c.vm_faults.iter().zip(&before.1).enumerate() {
            if now > was {
                return Err(format!("packet faulted at this node: {}", anode_snap::vm::FAULT_KINDS[k]));
            }
        }
        for (r, (now, was)) in c.drops.iter().zip(&before.0).enumerate() {
            if now > was {
                return Err(format!("packet dropped at this node: {}", DROP_NAMES[r]));
            }
        }
        Ok(Reply::Ok)
    }
}

/// The local application clients, as the data path sends to them.
pub(crate) struct Local<'a> {
    pub(crate) clients: &'a mut AppClients,
    pub(crate) epoll: &'a Epoll,
    pub(crate) stats: &'a mut LocalStats,
}

impl Local<'_> {
    /// Sends one message to client `slot` (or queues or drops it: [`Sent`]).
    pub(crate) fn send(&mut self, slot: usize, bytes: &[u8]) -> Sent {
        let r = self.clients.send(slot, bytes);
        match r {
            Sent::Queued => {
                self.stats.queued += 1;
                if let Some(c) = self.clients.get(slot) {
                    let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLOUT;
                    let mut e = EpollEvent::new(flags, TOKEN_APP_CLIENT + slot as u64);
                    let _ = self.epoll.modify(&c.sock, &mut e);
                }
            }
            Sent::Dropped => self.stats.queue_dropped += 1,
            Sent::Now | Sent::Gone => {}
        }
        r
    }

    /// Sends the deliveries of `outs` to their clients as DELIVER messages.
    pub(crate) fn deliver<B: AsRef<[u8]>>(&mut self, node: &mut Node, msg: &mut Vec<u8>, outs: &[Outbox], bufs: &[B]) {
        for (out, buf) in outs.iter().zip(bufs) {
            let buf = buf.as_ref();
            for d in &out.deliveries {
                self.deliver_one(node, msg, d.port, out.bytes(&d.data, buf));
            }
        }
    }

    /// Sends `payload` to the client holding `port` (DELIVER), counting a
    /// drop if there is none or its queue is full.
    pub(crate) fn deliver_one(&mut self, node: &mut Node, msg: &mut Vec<u8>, port: u16, payload: &[u8]) {
        let Some(&slot) = self.clients.ports.get(&port) else {
            node.counters.drop(Drop::NoListener);
            return;
        };
        msg.clear();
        msg.push(0x82);
        msg.extend_from_slice(&port.to_be_bytes());
        msg.extend_from_slice(payload);
        match self.send(slot, msg) {
            Sent::Dropped => node.counters.drop(Drop::AppQueueFull),
            Sent::Gone => node.counters.drop(Drop::NoListener),
            Sent::Now | Sent::Queued => {}
        }
    }
}

fn snapshot(c: &Counters) -> (Vec<u64>, Vec<u64>) {
    (c.drops.to_vec(), c.vm_faults.clone())
}
