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

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, getsockopt, recv, send, sockopt};
use socket2::Socket;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

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
