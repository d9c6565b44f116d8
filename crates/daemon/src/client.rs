//! A small blocking client for the local application API ([`crate::local`]).
//!
//! ```no_run
//! # fn main() -> Result<(), anode_daemon::client::ClientError> {
//! use anode_daemon::client::Client;
//! use std::time::Duration;
//! let mut c = Client::connect("/tmp/anode-10.0.0.1")?;
//! let (addr, mtu) = c.hello()?;
//! c.register(40_000)?;
//! // ... c.inject(&packet)? ...
//! if let Some((port, payload)) = c.recv(Duration::from_secs(1))? {
//!     println!("{addr} (mtu {mtu}): {} bytes on port {port}", payload.len());
//! }
//! # Ok(()) }
//! ```
//!
//! The client opens one `SOCK_SEQPACKET` connection to `<run_dir>/app.sock`
//! (the node serves each client on its own connection, so one client that
//! stops reading cannot block another). Every request waits for the node's
//! OK (or INFO) or ERROR; DELIVER messages that arrive meanwhile are queued
//! for [`Client::recv`]. Ports the client registered are released when it
//! is dropped (the node sees the connection close).

use anode_wire::local::{self, LocalError, Reply, Request};
use core::net::Ipv4Addr;
use socket2::{Domain, SockAddr, Socket, Type};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Name of the node's application socket inside its run directory.
pub const APP_SOCKET: &str = "app.sock";

/// How long a request waits for its answer by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A failed local-API exchange.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No socket at `<run_dir>/app.sock`, or nobody listening on it.
    #[error("is `anode node` running? no socket at {}", .path.display())]
    NoNode {
        /// The socket path tried.
        path: PathBuf,
    },
    /// The node did not answer in time.
    #[error("no answer from the node at {} to {request} within {timeout:?}", .path.display())]
    Timeout {
        /// The request.
        request: &'static str,
        /// How long we waited.
        timeout: Duration,
        /// The node's socket.
        path: PathBuf,
    },
    /// The node refused the request.
    #[error("node refused {request}: {reason}")]
    Refused {
        /// The request.
        request: &'static str,
        /// The node's reason.
        reason: String,
    },
    /// The node sent a message that does not decode.
    #[error("malformed message from the node: {0}")]
    Malformed(#[from] LocalError),
    /// The node sent a well-formed but unexpected answer.
    #[error("unexpected answer to {request}: {got}")]
    Unexpected {
        /// The request.
        request: &'static str,
        /// What came back.
        got: &'static str,
    },
    /// A request larger than the API allows.
    #[error("message of {0} bytes exceeds the local API limit of {max} bytes", max = local::MAX_MESSAGE)]
    TooLarge(usize),
    /// The node closed the connection (it stopped, or it disconnected this
    /// client for leaving its deliveries unread too long).
    #[error("the node at {} closed the connection", .path.display())]
    Closed {
        /// The node's socket.
        path: PathBuf,
    },
    /// A socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A connection to a node's local application API.
#[derive(Debug)]
pub struct Client {
    sock: Socket,
    node_path: PathBuf,
    timeout: Duration,
    queued: VecDeque<(u16, Vec<u8>)>,
    buf: Vec<u8>,
}

/// The socket path of the node whose run directory is `run_dir`.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(APP_SOCKET)
}

fn is_no_node(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused)
}

impl Client {
    /// Connects to the node whose run directory is `run_dir`.
    pub fn connect(run_dir: impl AsRef<Path>) -> Result<Client, ClientError> {
        let node_path = socket_path(run_dir.as_ref());
        if !node_path.exists() {
            return Err(ClientError::NoNode { path: node_path });
        }
        let io = |what: &str, source| ClientError::Io { what: format!("{what} {}", node_path.display()), source };
        let addr = SockAddr::unix(&node_path).map_err(|e| io("addressing", e))?;
        let sock = Socket::new(Domain::UNIX, Type::SEQPACKET, None).map_err(|e| io("a socket for", e))?;
        let c = Client {
            sock,
            node_path: node_path.clone(),
            timeout: DEFAULT_REQUEST_TIMEOUT,
            queued: VecDeque::new(),
            buf: vec![0; local::MAX_MESSAGE + 64],
        };
        c.sock.connect(&addr).map_err(|source| c.io_error("connecting to", source))?;
        Ok(c)
    }

    /// Sets how long requests wait for an answer.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t.max(Duration::from_millis(1));
    }

    /// The node's socket path.
    pub fn node_socket(&self) -> &Path {
        &self.node_path
    }

    fn io_error(&self, what: &str, source: io::Error) -> ClientError {
        if is_no_node(&source) {
            ClientError::NoNode { path: self.node_path.clone() }
        } else {
            ClientError::Io { what: format!("{what} {}", self.node_path.display()), source }
        }
    }

    fn closed(&self) -> ClientError {
        ClientError::Closed { path: self.node_path.clone() }
    }

    /// Asks for the node's address and SNAP MTU.
    pub fn hello(&mut self) -> Result<(Ipv4Addr, u16), ClientError> {
        match self.request("HELLO", &Request::Hello)? {
            Answer::Info(a, m) => Ok((a, m)),
            Answer::Ok => Err(ClientError::Unexpected { request: "HELLO", got: "OK" }),
        }
    }

    /// Registers `port`: payloads delivered to it come to this client.
    pub fn register(&mut self, port: u16) -> Result<(), ClientError> {
        self.expect_ok("REGISTER", &Request::Register(port))
    }

    /// Unregisters `port`.
    pub fn unregister(&mut self, port: u16) -> Result<(), ClientError> {
        self.expect_ok("UNREGISTER", &Request::Unregister(port))
    }

    /// Has the node execute the SNAP packet `packet` (its first hop).
    pub fn inject(&mut self, packet: &[u8]) -> Result<(), ClientError> {
        self.expect_ok("INJECT", &Request::Inject(packet))
    }

    /// Has the node run a capsule (its first hop): switchlets must be on.
    pub fn capsule(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.expect_ok("CAPSULE", &Request::Capsule(bytes))
    }

    /// Sends a plain (no VM) packet.
    pub fn plain(&mut self, dst: Ipv4Addr, port: u16, ttl: u8, payload: &[u8]) -> Result<(), ClientError> {
        self.expect_ok("PLAIN", &Request::Plain { dst, port, ttl, payload })
    }

    /// Waits up to `timeout` for a delivered payload: `(port, payload)`, or
    /// `None` if nothing came.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<(u16, Vec<u8>)>, ClientError> {
        if let Some(d) = self.queued.pop_front() {
            return Ok(Some(d));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some(n) = self.recv_until(deadline)? else { return Ok(None) };
            match Reply::decode(&self.buf[..n])? {
                Reply::Deliver { port, payload } => return Ok(Some((port, payload.to_vec()))),
                // A late answer to a request that already timed out.
                Reply::Ok | Reply::Info { .. } | Reply::Error(_) => continue,
            }
        }
    }

    fn expect_ok(&mut self, name: &'static str, req: &Request<'_>) -> Result<(), ClientError> {
        match self.request(name, req)? {
            Answer::Ok => Ok(()),
            Answer::Info(..) => Err(ClientError::Unexpected { request: name, got: "INFO" }),
        }
    }

    fn request(&mut self, name: &'static str, req: &Request<'_>) -> Result<Answer, ClientError> {
        let msg = req.encode();
        if msg.len() > local::MAX_MESSAGE {
            return Err(ClientError::TooLarge(msg.len()));
        }
        loop {
            match self.sock.send(&msg) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(self.closed()),
                Err(e) => return Err(self.io_error(&format!("sending {name} to"), e)),
            }
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let Some(n) = self.recv_until(deadline)? else {
                return Err(ClientError::Timeout {
                    request: name,
                    timeout: self.timeout,
                    path: self.node_path.clone(),
                });
            };
            match Reply::decode(&self.buf[..n])? {
                Reply::Deliver { port, payload } => {
                    let d = (port, payload.to_vec());
                    self.queued.push_back(d);
                }
                Reply::Ok => return Ok(Answer::Ok),
                Reply::Info { address, mtu } => return Ok(Answer::Info(address, mtu)),
                Reply::Error(reason) => return Err(ClientError::Refused { request: name, reason: reason.to_owned() }),
            }
        }
    }

    /// Receives one message into `self.buf`, or `None` at the deadline.
    fn recv_until(&mut self, deadline: Instant) -> Result<Option<usize>, ClientError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // A zero timeout means "block forever", so never pass one.
            self.sock
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|source| ClientError::Io { what: "setting a socket timeout".into(), source })?;
            match (&self.sock).read(&mut self.buf) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => return Ok(Some(n)),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_error("receiving from", e)),
            }
        }
    }
}

enum Answer {
    Ok,
    Info(Ipv4Addr, u16),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::thread;

    /// A fake node on a socket in a fresh directory: serves one connection,
    /// answering each request with `answer`, until UNREGISTER 0.
    fn fake_node(answer: impl Fn(Request<'_>) -> Vec<Vec<u8>> + Send + 'static) -> (PathBuf, thread::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("anode-client-test-{}-{}", std::process::id(), unique_suffix()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let node = Socket::new(Domain::UNIX, Type::SEQPACKET, None).expect("socket");
        node.bind(&SockAddr::unix(socket_path(&dir)).expect("addr")).expect("bind node");
        node.listen(4).expect("listen");
        let h = thread::spawn(move || {
            let Ok((conn, _)) = node.accept() else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = vec![0; 70_000];
            while let Ok(n) = (&conn).read(&mut buf) {
                if n == 0 {
                    break;
                }
                let Ok(req) = Request::decode(&buf[..n]) else { continue };
                let stop = req == Request::Unregister(0);
                for m in answer(req) {
                    let _ = conn.send(&m);
                }
                if stop {
                    break;
                }
            }
        });
        (dir, h)
    }

    fn unique_suffix() -> u32 {
        static N: AtomicU32 = AtomicU32::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn requests_and_deliveries() {
        let (dir, h) = fake_node(|req| match req {
            Request::Hello => vec![Reply::Info { address: Ipv4Addr::new(10, 0, 0, 1), mtu: 1400 }.encode()],
            // A delivery overtakes the OK: the client must queue it.
            Request::Inject(p) => {
                vec![Reply::Deliver { port: 9, payload: p }.encode(), Reply::Ok.encode()]
            }
            Request::Register(7) => vec![Reply::Error("port 7 is reserved").encode()],
            Request::Plain { .. } => vec![b"\x80\x01".to_vec()],
            _ => vec![Reply::Ok.encode()],
        });
        let mut c = Client::connect(&dir).expect("connect");
        assert_eq!(c.hello().expect("hello"), (Ipv4Addr::new(10, 0, 0, 1), 1400));
        c.register(9).expect("register");
        c.inject(b"packet").expect("inject");
        assert_eq!(c.recv(Duration::from_millis(10)).expect("recv"), Some((9, b"packet".to_vec())));
        assert_eq!(c.recv(Duration::from_millis(10)).expect("recv"), None);
        let e = c.register(7).expect_err("refused");
        assert!(matches!(&e, ClientError::Refused { reason, .. } if reason == "port 7 is reserved"), "{e}");
        let e = c.plain(Ipv4Addr::new(10, 0, 0, 3), 1, 64, b"x").expect_err("malformed");
        assert!(matches!(e, ClientError::Malformed(LocalError::BadLength(0x80))), "{e}");
        c.unregister(0).expect("unregister");
        h.join().expect("fake node");
        c.set_timeout(Duration::from_millis(50));
        let e = c.hello().expect_err("node gone");
        assert!(matches!(e, ClientError::Closed { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn same_socket_name_as_the_daemon() {
        assert_eq!(APP_SOCKET, crate::APP_SOCKET);
    }

    #[test]
    fn missing_node_is_explained() {
        let e = Client::connect("/nonexistent/anode-run").expect_err("no node");
        assert_eq!(e.to_string(), "is `anode node` running? no socket at /nonexistent/anode-run/app.sock");
    }

    #[test]
    fn oversized_requests_are_refused_locally() {
        let (dir, h) = fake_node(|req| if req == Request::Unregister(0) { vec![Reply::Ok.encode()] } else { vec![] });
        let mut c = Client::connect(&dir).expect("connect");
        let e = c.inject(&vec![0; local::MAX_MESSAGE]).expect_err("too large");
        assert!(matches!(e, ClientError::TooLarge(_)), "{e}");
        c.unregister(0).expect("stop");
        h.join().expect("fake node");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
