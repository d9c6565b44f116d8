//! A small blocking client for the local application API ([`crate::local`]).
//!
//! ```no_run
//! # fn main() -> Result<(), anode_node::client::ClientError> {
//! use anode_node::client::Client;
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
//! The client binds its own datagram socket at a unique path in the
//! temporary directory (removed when the client is dropped; sockets of
//! clients that were killed are swept up by the next one) and connects it
//! to `<run_dir>/app.sock`. Every request waits for the node's OK (or INFO)
//! or ERROR; DELIVER messages that arrive meanwhile are queued for
//! [`Client::recv`].

use crate::local::{self, LocalError, Reply, Request};
use core::net::Ipv4Addr;
use std::collections::VecDeque;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Name of the node's application socket inside its run directory.
pub const APP_SOCKET: &str = "app.sock";

/// How long a request waits for its answer by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest socket path the kernel accepts (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

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
    sock: UnixDatagram,
    own_path: PathBuf,
    node_path: PathBuf,
    timeout: Duration,
    queued: VecDeque<(u16, Vec<u8>)>,
    buf: Vec<u8>,
}

/// The socket path of the node whose run directory is `run_dir`.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(APP_SOCKET)
}

fn unique_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let name = format!("anode-client-{}-{n}-{nanos:08x}.sock", std::process::id());
    let dir = std::env::temp_dir();
    let p = dir.join(&name);
    if p.as_os_str().len() <= MAX_SOCKET_PATH { p } else { Path::new("/tmp").join(name) }
}

/// Removes client sockets left behind by clients that were killed before
/// they could clean up (`anode ping` stopped with Ctrl-C): files named like
/// ours in `dir` whose process no longer exists. Only where `/proc` shows
/// which processes exist.
fn sweep_stale(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("anode-client-"))
            .filter(|n| n.ends_with(".sock"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
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
        let own_path = unique_path();
        if let Some(dir) = own_path.parent() {
            sweep_stale(dir);
        }
        let sock = UnixDatagram::bind(&own_path)
            .map_err(|source| ClientError::Io { what: format!("binding {}", own_path.display()), source })?;
        // From here on `c` removes `own_path` when dropped, even on error.
        let c = Client {
            sock,
            own_path,
            node_path,
            timeout: DEFAULT_REQUEST_TIMEOUT,
            queued: VecDeque::new(),
            buf: vec![0; local::MAX_MESSAGE + 64],
        };
        c.sock.connect(&c.node_path).map_err(|source| c.io_error("connecting", source))?;
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

    /// Receives one datagram into `self.buf`, or `None` at the deadline.
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
            match self.sock.recv(&mut self.buf) {
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

impl Drop for Client {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.own_path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// A fake node on a socket in a fresh directory: answers with `answer`.
    fn fake_node(answer: impl Fn(Request<'_>) -> Vec<Vec<u8>> + Send + 'static) -> (PathBuf, thread::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("anode-client-test-{}-{}", std::process::id(), unique_suffix()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let node = UnixDatagram::bind(socket_path(&dir)).expect("bind node");
        node.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let h = thread::spawn(move || {
            let mut buf = vec![0; 70_000];
            while let Ok((n, from)) = node.recv_from(&mut buf) {
                let Ok(req) = Request::decode(&buf[..n]) else { continue };
                let stop = req == Request::Unregister(0);
                for m in answer(req) {
                    if let Some(p) = from.as_pathname() {
                        let _ = node.send_to(&m, p);
                    }
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
        let own = c.own_path.clone();
        assert!(own.exists());
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
        assert!(matches!(e, ClientError::Timeout { .. } | ClientError::NoNode { .. }), "{e}");
        drop(c);
        assert!(!own.exists(), "client socket removed on drop");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn same_socket_name_as_the_daemon() {
        assert_eq!(APP_SOCKET, crate::daemon::APP_SOCKET);
    }

    #[test]
    fn stale_sockets_of_dead_clients_are_removed() {
        let dir = std::env::temp_dir().join(format!("anode-client-sweep-{}-{}", std::process::id(), unique_suffix()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        // No process has pid u32::MAX - 1; this one is alive.
        let dead = dir.join(format!("anode-client-{}-0-0.sock", u32::MAX - 1));
        let alive = dir.join(format!("anode-client-{}-0-0.sock", std::process::id()));
        let other = dir.join("unrelated.sock");
        for p in [&dead, &alive, &other] {
            std::fs::write(p, b"").expect("file");
        }
        sweep_stale(&dir);
        assert_eq!(dead.exists(), !Path::new("/proc/self").exists());
        assert!(alive.exists() && other.exists());
        let _ = std::fs::remove_dir_all(&dir);
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
