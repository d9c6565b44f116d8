//! The node daemon (`anode node`): UDP sockets around the sans-I/O
//! [`core`](crate::core).
//!
//! ```text
//!  UDP iface 0..n ──recvmmsg──► Node::handle_datagram ──sendmmsg──► UDP iface (per next hop)
//!  app.sock (Unix dgram) ─────► HELLO/REGISTER/INJECT/PLAIN   └────► DELIVER to app clients
//!  control.sock (Unix stream) ► "status" (JSON) | "metrics" (Prometheus)
//!  metrics TCP (optional) ────► GET /metrics
//!  signalfd ──────────────────► SIGTERM/SIGINT: finish the batch, clean up, exit
//! ```
//!
//! One thread, one `epoll` set over every socket (nix's safe wrappers),
//! woken at least every [`TICK`] so a stop request is seen promptly. epoll
//! rather than `poll`: the interest set is registered once, so waiting
//! allocates nothing, and control connections come and go without
//! rebuilding a pollfd array that would borrow every socket.
//!
//! # Batching and buffers
//!
//! Each interface socket is read with `recvmmsg` into [`BATCH`]
//! preallocated buffers of [`recv_buffer_len`]`(mtu)` bytes. Every datagram
//! of the batch is handled with its own preallocated [`Outbox`], so a
//! transmission that forwards a packet in place ([`Data::Input`]) keeps
//! pointing into its own receive buffer. When the whole batch is handled,
//! the transmissions are grouped by outgoing interface and sent with one
//! `sendmmsg` per interface (per [`BATCH`] of them), straight from the
//! receive buffers and outbox arenas: no copy and, once the outboxes have
//! grown to their working size, no allocation. Deliveries then go to the
//! local clients. Only then are the buffers reused by the next `recvmmsg`.
//!
//! # Files
//!
//! The run directory (`run_dir`, default [`default_run_dir`]) is created
//! with mode 0700 and holds [`APP_SOCKET`] and [`CONTROL_SOCKET`]; stale
//! sockets left by a dead daemon are removed at start (a live one is
//! detected through its control socket) and both are removed at exit.

mod conn;
mod droplog;

pub use conn::{CONN_TIMEOUT, MAX_REQUEST};
pub use droplog::DROP_LOG_INTERVAL;

use crate::config::{ConfigError, NodeConfig, Topology};
use crate::core::{Node, Outbox, recv_buffer_len};
use crate::counters::{Counters, DROP_NAMES, Drop};
use crate::local::{self, Reply, Request};
use conn::{Conn, Progress, Stream};
use droplog::DropLog;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use std::collections::BTreeMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Datagrams received (and transmissions sent) per system call.
pub const BATCH: usize = 32;
/// Longest the event loop sleeps before looking at the stop flag and timers.
pub const TICK: Duration = Duration::from_millis(100);
/// Most control and metrics connections open at once; more are refused.
pub const MAX_CONNS: usize = 16;
/// Local application requests handled per wakeup (then the loop moves on,
/// so applications cannot starve the network).
pub const APP_BATCH: usize = 64;
/// The application socket's file name in the run directory.
pub const APP_SOCKET: &str = "app.sock";
/// The control socket's file name in the run directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// Socket buffer size requested for each interface socket (best effort).
pub const UDP_SOCKET_BUFFER: usize = 4 << 20;

const TOKEN_APP: u64 = 1 << 32;
const TOKEN_CONTROL: u64 = TOKEN_APP + 1;
const TOKEN_SIGNAL: u64 = TOKEN_APP + 2;
const TOKEN_METRICS: u64 = TOKEN_APP + 3;
const TOKEN_CONN: u64 = 1 << 33;

/// Why the daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// A module listed in `[modules]` was refused.
    #[error("module {}: {reason}", file.display())]
    Module {
        /// The module file.
        file: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// The node's secret key file is unusable.
    #[error("security: {0}")]
    Key(#[from] anode_sec::KeyError),
    /// A configuration or topology file could not be read.
    #[error("cannot read {}: {source}", file.display())]
    ReadFile {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A configuration or topology file is invalid.
    #[error("{}: {source}", file.display())]
    Config {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        source: ConfigError,
    },
    /// An interface socket could not be bound.
    #[error("interface {iface:?}: cannot bind UDP {addr}: {source}")]
    Bind {
        /// Interface name.
        iface: String,
        /// Its listen address.
        addr: SocketAddr,
        /// The I/O error (e.g. address in use).
        source: io::Error,
    },
    /// The metrics endpoint could not be bound.
    #[error("metrics endpoint: cannot bind TCP {addr}: {source}")]
    MetricsBind {
        /// The configured address.
        addr: SocketAddr,
        /// The I/O error.
        source: io::Error,
    },
    /// The run directory is unusable.
    #[error("run directory {}: {reason}", dir.display())]
    RunDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another daemon answers on this run directory's control socket.
    #[error("another node is already running with run directory {} (its control socket answers)", .0.display())]
    AlreadyRunning(PathBuf),
    /// A local socket could not be created.
    #[error("cannot create {}: {source}", path.display())]
    LocalSocket {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A system call the event loop needs failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: Errno,
    },
}

/// A configuration file read with its topology.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The configuration file.
    pub path: PathBuf,
    /// Its contents.
    pub config: NodeConfig,
    /// The topology file, if `routes.topology` names one (resolved
    /// relative to the configuration file).
    pub topology_path: Option<PathBuf>,
    /// The parsed topology.
    pub topology: Option<Topology>,
}

fn read(path: &Path) -> Result<String, DaemonError> {
    std::fs::read_to_string(path).map_err(|source| DaemonError::ReadFile { file: path.to_path_buf(), source })
}

/// Reads and validates a node configuration file and its topology file;
/// errors name the file at fault. Relative `run_dir` and `routes.topology`
/// paths are resolved against the configuration file's directory.
pub fn load_config(path: &Path) -> Result<LoadedConfig, DaemonError> {
    let mut config = NodeConfig::from_toml(&read(path)?)
        .map_err(|source| DaemonError::Config { file: path.to_path_buf(), source })?;
    let base = path.parent().unwrap_or(Path::new("."));
    if let Some(rd) = &config.run_dir
        && rd.is_relative()
    {
        config.run_dir = Some(base.join(rd));
    }
    if let Some(m) = config.modules.as_mut() {
        for l in &mut m.loads {
            if l.file.is_relative() {
                l.file = base.join(&l.file);
            }
            if l.credential.is_relative() {
                l.credential = base.join(&l.credential);
            }
        }
    }
    if let Some(sec) = config.security.as_mut()
        && let Some(k) = &sec.key
        && k.is_relative()
    {
        sec.key = Some(base.join(k));
    }
    let (mut topology_path, mut topology) = (None, None);
    if let Some(t) = &config.routes.topology {
        let tp = base.join(t);
        let topo =
            Topology::from_toml(&read(&tp)?).map_err(|source| DaemonError::Config { file: tp.clone(), source })?;
        topo.next_hops(config.address).map_err(|source| DaemonError::Config { file: tp.clone(), source })?;
        topology_path = Some(tp);
        topology = Some(topo);
    }
    Ok(LoadedConfig { path: path.to_path_buf(), config, topology_path, topology })
}

/// The run directory used when the configuration names none:
/// `<temp dir>/anode-<address>`.
pub fn default_run_dir(address: core::net::Ipv4Addr) -> PathBuf {
    std::env::temp_dir().join(format!("anode-{address}"))
}

/// The run directory of a configuration.
pub fn run_dir_of(cfg: &NodeConfig) -> PathBuf {
    cfg.run_dir.clone().unwrap_or_else(|| default_run_dir(cfg.address))
}

/// Sends one control request (`status` or `metrics`) to the daemon whose
/// run directory is `run_dir` and returns its answer.
pub fn query(run_dir: &Path, request: &str, timeout: Duration) -> io::Result<String> {
    let mut s = UnixStream::connect(run_dir.join(CONTROL_SOCKET))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(request.as_bytes())?;
    s.write_all(b"\n")?;
    let _ = s.shutdown(Shutdown::Write);
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// How the daemon runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Handle SIGTERM and SIGINT: they are blocked in the calling thread and
    /// read from a signalfd, and either one stops the loop. Set it when the
    /// daemon runs in the main thread of its own process (as `anode node`
    /// does), before other threads start.
    pub signals: bool,
}

/// Daemon-level counters, beside the node's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalStats {
    /// Requests received on the application socket.
    pub requests: u64,
    /// Requests refused (malformed, or an ERROR reply).
    pub refused: u64,
    /// Clients found gone when a delivery was sent to them; their port was
    /// unregistered (the delivery counts as a `no_listener` drop).
    pub clients_gone: u64,
    /// Deliveries a client's full socket refused (counted as `tx_failed`).
    pub deliver_failed: u64,
    /// Control and metrics connections served.
    pub control_requests: u64,
}

/// Registered application ports and their clients.
#[derive(Debug, Default)]
struct Clients {
    ports: BTreeMap<u16, UnixAddr>,
}

fn same_client(a: &UnixAddr, b: &UnixAddr) -> bool {
    a.as_pathname() == b.as_pathname()
        && a.as_abstract_name() == b.as_abstract_name()
        && a.is_unnamed() == b.is_unnamed()
}

fn show_client(a: &UnixAddr) -> String {
    if let Some(p) = a.as_pathname() {
        p.display().to_string()
    } else if let Some(n) = a.as_abstract_name() {
        format!("@{}", String::from_utf8_lossy(n))
    } else {
        "(unnamed)".into()
    }
}

/// Receive side of the data path: the batch buffers and their outboxes.
struct Rx {
    bufs: [Vec<u8>; BATCH],
    lens: [usize; BATCH],
    outs: [Outbox; BATCH],
    hdrs: MultiHeaders<SockaddrStorage>,
    froms: [Option<SocketAddr>; BATCH],
}

/// Removes the socket files when the daemon goes away, however it does,
/// and the run directory too if the daemon created it and it is empty.
#[derive(Debug)]
struct SocketFiles {
    files: Vec<PathBuf>,
    created_dir: Option<PathBuf>,
}

impl core::ops::Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.files {
            let _ = std::fs::remove_file(p);
        }
        if let Some(d) = &self.created_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A running node: sockets bound, ready to [`run`](Daemon::run).
pub struct Daemon {
    node: Node,
    cfg: NodeConfig,
    run_dir: PathBuf,
    udp: Vec<UdpSocket>,
    listen: Vec<SocketAddr>,
    app: UnixDatagram,
    control: UnixListener,
    metrics: Option<TcpListener>,
    signals: Option<SignalFd>,
    epoll: Epoll,
    conns: Vec<Option<Conn>>,
    clients: Clients,
    rx: Rx,
    tx_hdrs: MultiHeaders<SockaddrStorage>,
    inject_out: Outbox,
    timer_out: Outbox,
    last_poll: Option<Instant>,
    no_input: [Vec<u8>; 1],
    app_buf: Vec<u8>,
    msg: Vec<u8>,
    started: Instant,
    stats: LocalStats,
    droplog: DropLog,
    stopping: bool,
    _files: SocketFiles,
}

impl core::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Daemon")
            .field("address", &self.node.address())
            .field("run_dir", &self.run_dir)
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

fn sys(what: &'static str) -> impl FnOnce(Errno) -> DaemonError {
    move |source| DaemonError::Sys { what, source }
}

/// Makes sure `dir` is a private directory of ours without a live node;
/// removes stale sockets. Says whether it created the directory.
fn prepare_run_dir(dir: &Path) -> Result<bool, DaemonError> {
    let bad = |reason: String| DaemonError::RunDir { dir: dir.to_path_buf(), reason };
    let mut created = false;
    match std::fs::symlink_metadata(dir) {
        Ok(m) => {
            if !m.is_dir() {
                return Err(bad("exists and is not a directory".into()));
            }
            let me = nix::unistd::getuid().as_raw();
            if m.uid() != me {
                return Err(bad(format!("owned by uid {}, not by this user (uid {me})", m.uid())));
            }
            if m.mode() & 0o077 != 0 {
                warn!(run_dir = %dir.display(), mode = format!("{:o}", m.mode() & 0o777),
                      "run directory is accessible to other users; its sockets are too");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| bad(format!("cannot create: {e}")))?;
            // The mode above is masked by the umask; make sure.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| bad(format!("cannot set mode 0700: {e}")))?;
            created = true;
        }
        Err(e) => return Err(bad(e.to_string())),
    }
    let control = dir.join(CONTROL_SOCKET);
    if UnixStream::connect(&control).is_ok() {
        return Err(DaemonError::AlreadyRunning(dir.to_path_buf()));
    }
    for name in [APP_SOCKET, CONTROL_SOCKET] {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => info!(path = %p.display(), "removed stale socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(format!("cannot remove stale {}: {e}", p.display()))),
        }
    }
    Ok(created)
}

fn interest(fd: impl AsFd, epoll: &Epoll, flags: EpollFlags, token: u64) -> Result<(), DaemonError> {
    epoll.add(fd, EpollEvent::new(flags, token)).map_err(sys("epoll_ctl"))
}

impl Daemon {
    /// Binds every socket of the node described by `cfg` (interfaces first,
    /// so a port in use fails before the run directory is touched).
    pub fn bind(cfg: &NodeConfig, topology: Option<&Topology>, opts: &Options) -> Result<Daemon, DaemonError> {
        // Wall-clock time at now_ms = 0: handshake timestamps and credential expiry.
        let unix_ms_at_zero = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let sec = match cfg.security.as_ref().filter(|s| s.enabled) {
            Some(s) => {
                let path = s.key.clone().ok_or(DaemonError::Config {
                    file: "<config>".into(),
                    source: crate::config::ConfigError::MissingKeyFile,
                })?;
                let identity = anode_sec::Identity::load(&path)?;
                Some(crate::secure::SecurityInit { identity, unix_ms_at_zero })
            }
            None => None,
        };
        let mut node = Node::with_security(cfg, topology, sec, 0)
            .map_err(|source| DaemonError::Config { file: "<config>".into(), source })?;
        if let Some(m) = &cfg.modules {
            let sb = crate::switchlets::sandbox(m, cfg.address, node.route_table())
                .map_err(|source| DaemonError::Config { file: "<config>".into(), source })?;
            node.enable_modules(sb, unix_ms_at_zero);
            for l in &m.loads {
                let code =
                    std::fs::read(&l.file).map_err(|source| DaemonError::ReadFile { file: l.file.clone(), source })?;
                let cred = std::fs::read(&l.credential)
                    .map_err(|source| DaemonError::ReadFile { file: l.credential.clone(), source })?;
                let now = node.sandbox_now(0);
                let (Some(sb), Some(now)) = (node.sandbox_mut(), now) else { continue };
                let spec = anode_sandbox::LoadSpec {
                    code: &code,
                    credential: Some(&cred),
                    requester: None,
                    local_name: l.name.as_deref(),
                    limits: Default::default(),
                };
                match sb.load(now, &spec) {
                    Ok(id) => info!(module = %id, file = %l.file.display(), "module loaded from the config"),
                    Err(e) => {
                        return Err(DaemonError::Module { file: l.file.clone(), reason: e.to_string() });
                    }
                }
            }
        }
        let mut udp = Vec::new();
        let mut listen = Vec::new();
        for i in &cfg.interfaces {
            let bind_err = |source| DaemonError::Bind { iface: i.name.clone(), addr: i.listen, source };
            let s = UdpSocket::bind(i.listen).map_err(bind_err)?;
            s.set_nonblocking(true).map_err(bind_err)?;
            // Best effort: room for bursts. The kernel caps it at rmem_max.
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &UDP_SOCKET_BUFFER);
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::SndBuf, &UDP_SOCKET_BUFFER);
            listen.push(s.local_addr().map_err(bind_err)?);
            udp.push(s);
        }
        let metrics = match cfg.metrics {
            Some(addr) => {
                let merr = |source| DaemonError::MetricsBind { addr, source };
                let l = TcpListener::bind(addr).map_err(merr)?;
                l.set_nonblocking(true).map_err(merr)?;
                Some(l)
            }
            None => None,
        };
        let signals = if opts.signals {
            let mut mask = SigSet::empty();
            mask.add(Signal::SIGTERM);
            mask.add(Signal::SIGINT);
            mask.thread_block().map_err(sys("blocking SIGTERM/SIGINT"))?;
            Some(SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map_err(sys("signalfd"))?)
        } else {
            None
        };

        let run_dir = run_dir_of(cfg);
        let created = prepare_run_dir(&run_dir)?;
        let app_path = run_dir.join(APP_SOCKET);
        let control_path = run_dir.join(CONTROL_SOCKET);
        let lerr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DaemonError::LocalSocket { path, source }
        };
        let mut files = SocketFiles { files: Vec::new(), created_dir: created.then(|| run_dir.clone()) };
        let app = UnixDatagram::bind(&app_path).map_err(lerr(&app_path))?;
        files.files.push(app_path.clone());
        app.set_nonblocking(true).map_err(lerr(&app_path))?;
        let control = UnixListener::bind(&control_path).map_err(lerr(&control_path))?;
        files.files.push(control_path.clone());
        control.set_nonblocking(true).map_err(lerr(&control_path))?;

        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(sys("epoll_create"))?;
        for (i, s) in udp.iter().enumerate() {
            interest(s, &epoll, EpollFlags::EPOLLIN, i as u64)?;
        }
        interest(&app, &epoll, EpollFlags::EPOLLIN, TOKEN_APP)?;
        interest(&control, &epoll, EpollFlags::EPOLLIN, TOKEN_CONTROL)?;
        if let Some(s) = &signals {
            interest(s, &epoll, EpollFlags::EPOLLIN, TOKEN_SIGNAL)?;
        }
        if let Some(m) = &metrics {
            interest(m, &epoll, EpollFlags::EPOLLIN, TOKEN_METRICS)?;
        }

        let blen = recv_buffer_len(cfg.mtu);
        let d = Daemon {
            rx: Rx {
                bufs: std::array::from_fn(|_| vec![0; blen]),
                lens: [0; BATCH],
                outs: std::array::from_fn(|_| Outbox::default()),
                hdrs: MultiHeaders::preallocate(BATCH, None),
                froms: [None; BATCH],
            },
            tx_hdrs: MultiHeaders::preallocate(BATCH, None),
            node,
            cfg: cfg.clone(),
            run_dir,
            udp,
            listen,
            app,
            control,
            metrics,
            signals,
            epoll,
            conns: (0..MAX_CONNS).map(|_| None).collect(),
            clients: Clients::default(),
            inject_out: Outbox::default(),
            timer_out: Outbox::default(),
            last_poll: None,
            no_input: [Vec::new()],
            app_buf: vec![0; local::MAX_MESSAGE + 1],
            msg: Vec::with_capacity(3 + blen),
            started: Instant::now(),
            stats: LocalStats::default(),
            droplog: DropLog::new(),
            stopping: false,
            _files: files,
        };
        let ifaces: Vec<String> =
            d.cfg.interfaces.iter().zip(&d.listen).map(|(i, l)| format!("{}={}", i.name, l)).collect();
        info!(
            address = %d.node.address(),
            mtu = d.cfg.mtu,
            interfaces = %ifaces.join(","),
            neighbors = d.cfg.neighbor_addrs().len(),
            routes = d.node.routes().len(),
            default_via = ?d.cfg.routes.default_via,
            run_dir = %d.run_dir.display(),
            metrics = %d.metrics_addr().map_or("off".to_string(), |a| format!("http://{a}/metrics")),
            security = %d.node.security_json().map_or("off".to_string(), |s| format!("on, identity {}", s["identity"].as_str().unwrap_or("?"))),
            "node started"
        );
        Ok(d)
    }

    /// The node core, e.g. for its counters.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node core, mutably (e.g. to register services).
    pub fn node_mut(&mut self) -> &mut Node {
        &mut self.node
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The bound address of each interface, in configuration order.
    pub fn listen_addrs(&self) -> &[SocketAddr] {
        &self.listen
    }

    /// The bound metrics address, if the endpoint is on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|m| m.local_addr().ok())
    }

    /// Daemon-level counters.
    pub fn local_stats(&self) -> &LocalStats {
        &self.stats
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs the event loop until `stop` is set or, with
    /// [`Options::signals`], SIGTERM or SIGINT arrives. The batch in hand is
    /// finished first; the final counters are logged and the sockets
    /// removed when the daemon is dropped.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), DaemonError> {
        let mut events = [EpollEvent::empty(); 64];
        let tick = EpollTimeout::from(TICK.as_millis().min(u16::MAX as u128) as u16);
        self.poll_security(Instant::now());
        while !self.stopping && !stop.load(Ordering::Relaxed) {
            let n = match self.epoll.wait(&mut events, tick) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => return Err(DaemonError::Sys { what: "epoll_wait", source: e }),
            };
            for ev in &events[..n] {
                match ev.data() {
                    t if t < self.udp.len() as u64 => self.udp_ready(t as usize),
                    TOKEN_APP => self.app_ready(),
                    TOKEN_CONTROL => self.accept_control(),
                    TOKEN_METRICS => self.accept_metrics(),
                    TOKEN_SIGNAL => self.signal_ready(),
                    t if t >= TOKEN_CONN => self.conn_ready((t - TOKEN_CONN) as usize, ev.events()),
                    _ => {}
                }
            }
            let now = Instant::now();
            self.poll_security(now);
            self.expire_conns(now);
            self.log_drops(now);
        }
        self.log_drops(Instant::now() + DROP_LOG_INTERVAL);
        self.log_summary();
        Ok(())
    }

    /// Runs the security layer's timers (handshakes, rekeys, expiry), at
    /// most every 10 ms, and sends what they produce.
    fn poll_security(&mut self, now: Instant) {
        if !(self.node.security_on() || self.node.modules_on())
            || self.last_poll.is_some_and(|t| now.duration_since(t) < Duration::from_millis(10))
        {
            return;
        }
        self.last_poll = Some(now);
        let now_ms = self.now_ms();
        self.timer_out.clear();
        self.node.poll(now_ms, &mut self.timer_out);
        for e in &self.timer_out.events {
            info!("{e}");
        }
        let outs = std::slice::from_ref(&self.timer_out);
        send_transmits(&self.udp, &mut self.tx_hdrs, &mut self.node, &mut self.droplog, outs, &[Vec::new()]);
    }

    /// Handles one batch from interface `iface`: recvmmsg, the core, then
    /// sendmmsg per outgoing interface and the deliveries.
    fn udp_ready(&mut self, iface: usize) {
        let n = match recv_batch(&self.udp[iface], &mut self.rx) {
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return,
            Err(e) => {
                // Nothing a datagram socket returns here is fatal (e.g. a
                // queued ICMP error); note it and go on.
                debug!(iface = %self.cfg.interfaces[iface].name, error = %e, "recvmmsg");
                return;
            }
        };
        let now_ms = self.now_ms();
        let Rx { bufs, lens, outs, froms, .. } = &mut self.rx;
        for i in 0..n {
            outs[i].clear();
            self.node.handle_datagram_from(iface, froms[i], &mut bufs[i], lens[i], now_ms, &mut outs[i]);
            if !outs[i].log.is_empty() {
                debug!(target: "anode::snap", "{}", outs[i].log.trim_end());
            }
            for e in &outs[i].events {
                info!("{e}");
            }
        }
        send_transmits(&self.udp, &mut self.tx_hdrs, &mut self.node, &mut self.droplog, &outs[..n], &bufs[..n]);
        deliver(&self.app, &mut self.clients, &mut self.node, &mut self.stats, &mut self.msg, &outs[..n], &bufs[..n]);
    }

    fn app_ready(&mut self) {
        for _ in 0..APP_BATCH {
            let (len, from) = match self.app.recv_from(&mut self.app_buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!(error = %e, "application socket");
                    return;
                }
            };
            self.stats.requests += 1;
            let buf = std::mem::take(&mut self.app_buf);
            self.app_request(&buf[..len], &from);
            self.app_buf = buf;
        }
    }

    fn app_request(&mut self, msg: &[u8], from: &UnixAddr) {
        if from.is_unnamed() {
            // Nothing can be sent back to an unbound client.
            self.stats.refused += 1;
            debug!("request from an unbound client socket ignored (bind the client socket to a path)");
            return;
        }
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
                Ok(Request::Register(port)) => {
                    if let Some(old) = self.clients.ports.insert(port, from.clone())
                        && !same_client(&old, from)
                    {
                        info!(port, from = %show_client(&old), to = %show_client(from), "port taken over");
                    }
                    self.node.register_port(port);
                    debug!(port, client = %show_client(from), "port registered");
                    Ok(Reply::Ok)
                }
                Ok(Request::Unregister(port)) => match self.clients.ports.get(&port) {
                    Some(owner) if !same_client(owner, from) => {
                        Err(format!("port {port} is registered by another client"))
                    }
                    _ => {
                        self.clients.ports.remove(&port);
                        self.node.unregister_port(port);
                        Ok(Reply::Ok)
                    }
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
                        self.node.inject_capsule(bytes, now_ms, &mut self.inject_out);
                        self.outcome(&before)
                    }
                }
                Ok(Request::Plain { dst, port, ttl, payload }) => {
                    if payload.len() + crate::plain::HEADER_LEN > mtu {
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
                debug!(client = %show_client(from), %reason, "request refused");
                Reply::Error(reason).encode()
            }
        };
        if let Err(e) = self.app.send_to_addr(&bytes, from) {
            debug!(client = %show_client(from), error = %e, "cannot reply");
        }
        // Reply first, then what the request produced (a ping to this node
        // itself gets OK, then DELIVER).
        let outs = std::slice::from_ref(&self.inject_out);
        send_transmits(&self.udp, &mut self.tx_hdrs, &mut self.node, &mut self.droplog, outs, &self.no_input);
        deliver(&self.app, &mut self.clients, &mut self.node, &mut self.stats, &mut self.msg, outs, &self.no_input);
        self.inject_out.clear();
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

    fn accept_control(&mut self) {
        loop {
            match self.control.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_ok() {
                        self.add_conn(Stream::Unix(s));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn accept_metrics(&mut self) {
        loop {
            let Some(r) = self.metrics.as_ref().map(TcpListener::accept) else { return };
            match r {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_ok() {
                        self.add_conn(Stream::Tcp(s));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn add_conn(&mut self, s: Stream) {
        let Some(slot) = self.conns.iter().position(Option::is_none) else {
            debug!("too many control connections; refused one");
            return; // dropping `s` closes it
        };
        if interest(&s, &self.epoll, EpollFlags::EPOLLIN, TOKEN_CONN + slot as u64).is_err() {
            return;
        }
        self.conns[slot] = Some(Conn::new(s, Instant::now()));
    }

    fn close_conn(&mut self, slot: usize) {
        if let Some(c) = self.conns.get_mut(slot).and_then(Option::take) {
            let _ = self.epoll.delete(&c.stream);
        }
    }

    fn conn_ready(&mut self, slot: usize, ev: EpollFlags) {
        let Some(mut c) = self.conns.get_mut(slot).and_then(Option::take) else { return };
        let progress = if c.responding {
            c.on_writable()
        } else {
            match c.on_readable() {
                Progress::Request(r) => {
                    self.stats.control_requests += 1;
                    let answer = self.answer(&r, matches!(c.stream, Stream::Tcp(_)));
                    let p = c.respond(answer);
                    if p == Progress::Pending {
                        let mut e = EpollEvent::new(EpollFlags::EPOLLOUT, TOKEN_CONN + slot as u64);
                        let _ = self.epoll.modify(&c.stream, &mut e);
                    }
                    p
                }
                Progress::Pending if ev.contains(EpollFlags::EPOLLERR) => Progress::Close,
                p => p,
            }
        };
        self.conns[slot] = Some(c);
        if progress == Progress::Close {
            self.close_conn(slot);
        }
    }

    fn expire_conns(&mut self, now: Instant) {
        for slot in 0..self.conns.len() {
            if self.conns[slot].as_ref().is_some_and(|c| now >= c.deadline) {
                debug!(slot, "control connection timed out");
                self.close_conn(slot);
            }
        }
    }

    fn answer(&self, r: &conn::Request, http: bool) -> Vec<u8> {
        use conn::Request as R;
        match (r, http) {
            (R::Status, _) => {
                let mut v = serde_json::to_vec_pretty(&self.status_json()).unwrap_or_default();
                v.push(b'\n');
                v
            }
            (R::Metrics, false) => self.metrics_text().into_bytes(),
            (R::Metrics, true) => conn::http_response(
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics_text().as_bytes(),
            ),
            (R::UnknownControl(l), _) => {
                format!("error: unknown request {l:?} (try \"status\" or \"metrics\")\n").into_bytes()
            }
            (R::HttpNotFound, _) => conn::http_response("404 Not Found", "text/plain", b"not found; try /metrics\n"),
        }
    }

    fn metrics_text(&self) -> String {
        let mut s = self.node.counters.to_prometheus();
        s.push_str("# HELP anode_uptime_seconds Seconds since the node started.\n# TYPE anode_uptime_seconds gauge\n");
        s.push_str(&format!("anode_uptime_seconds {:.3}\n", self.started.elapsed().as_secs_f64()));
        s.push_str("# HELP anode_local_clients_gone_total Application clients found gone at delivery.\n");
        s.push_str("# TYPE anode_local_clients_gone_total counter\n");
        s.push_str(&format!("anode_local_clients_gone_total {}\n", self.stats.clients_gone));
        s
    }

    /// The `status` answer: the node counters plus address, uptime,
    /// interfaces with their listen addresses, routes and local clients.
    pub fn status_json(&self) -> serde_json::Value {
        use serde_json::json;
        let mut v = self.node.counters.to_json();
        if let Some(ifaces) = v.get_mut("interfaces").and_then(|x| x.as_array_mut()) {
            for ((j, l), cfg) in ifaces.iter_mut().zip(&self.listen).zip(&self.cfg.interfaces) {
                if let Some(o) = j.as_object_mut() {
                    o.insert("listen".into(), json!(l.to_string()));
                    o.insert("neighbors".into(), json!(cfg.neighbors.len()));
                }
            }
        }
        if let Some(o) = v.as_object_mut() {
            if let Some(sec) = self.node.security_json() {
                o.insert("security".into(), sec);
            }
            if let Some(m) = self.node.modules_json() {
                o.insert("modules".into(), m);
            }
            o.insert("address".into(), json!(self.node.address().to_string()));
            o.insert("uptime_s".into(), json!(self.started.elapsed().as_secs_f64()));
            o.insert("mtu".into(), json!(self.cfg.mtu));
            o.insert("pid".into(), json!(std::process::id()));
            o.insert("run_dir".into(), json!(self.run_dir.display().to_string()));
            o.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
            o.insert("metrics".into(), json!(self.metrics_addr().map(|a| a.to_string())));
            let routes: serde_json::Map<String, serde_json::Value> =
                self.node.routes().iter().map(|(d, v)| (d.to_string(), json!(v.to_string()))).collect();
            o.insert("routes".into(), serde_json::Value::Object(routes));
            let ports: Vec<u16> = self.clients.ports.keys().copied().collect();
            o.insert(
                "local".into(),
                json!({
                    "ports": ports,
                    "requests": self.stats.requests,
                    "refused": self.stats.refused,
                    "clients_gone": self.stats.clients_gone,
                    "deliver_failed": self.stats.deliver_failed,
                    "control_requests": self.stats.control_requests,
                }),
            );
        }
        v
    }

    fn signal_ready(&mut self) {
        let Some(sfd) = &self.signals else { return };
        while let Ok(Some(info)) = sfd.read_signal() {
            let name = Signal::try_from(info.ssi_signo as i32).map(|s| s.as_str()).unwrap_or("signal");
            info!(signal = name, "shutting down");
            self.stopping = true;
        }
    }

    fn log_drops(&mut self, now: Instant) {
        for l in self.droplog.due(&self.node.counters, now) {
            if l.detail.is_empty() {
                warn!(reason = l.reason, count = l.count, total = l.total, "dropped packets");
            } else {
                warn!(reason = l.reason, count = l.count, total = l.total, detail = %l.detail, "dropped packets");
            }
        }
    }

    fn log_summary(&self) {
        let c: &Counters = &self.node.counters;
        let (rx, tx) = c.ifaces.iter().fold((0, 0), |(r, t), i| (r + i.rx_packets, t + i.tx_packets));
        let drops: Vec<String> = DROP_NAMES
            .iter()
            .zip(c.drops.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        info!(
            uptime_s = self.started.elapsed().as_secs(),
            rx_packets = rx,
            tx_packets = tx,
            rx_snap = c.rx_snap,
            rx_plain = c.rx_plain,
            injected = c.injected,
            snap_forwarded = c.snap_forwarded,
            plain_forwarded = c.plain_forwarded,
            delivered = c.delivered,
            vm_instructions = c.vm_instructions,
            drops = %if drops.is_empty() { "none".to_string() } else { drops.join(",") },
            "node stopped; final counters"
        );
    }
}

/// Reads one batch of datagrams into `rx.bufs`, their lengths into
/// `rx.lens`; returns how many.
fn recv_batch(sock: &UdpSocket, rx: &mut Rx) -> Result<usize, Errno> {
    let Rx { bufs, lens, hdrs, froms, .. } = rx;
    let mut iovs: [[IoSliceMut<'_>; 1]; BATCH] = bufs.each_mut().map(|b| [IoSliceMut::new(b.as_mut_slice())]);
    let msgs = recvmmsg(sock.as_raw_fd(), hdrs, iovs.iter_mut(), MsgFlags::MSG_DONTWAIT, None)?;
    let mut n = 0;
    for ((m, l), f) in msgs.zip(lens.iter_mut()).zip(froms.iter_mut()) {
        // A datagram longer than the buffer arrives truncated (MSG_TRUNC);
        // its ANEP length then disagrees and the core drops it.
        *l = m.bytes;
        *f = m.address.and_then(|a| a.as_sockaddr_in().map(|s| SocketAddr::V4((*s).into())));
        n += 1;
    }
    Ok(n)
}

/// Sends every transmission of `outs` (the outbox of datagram `i` points
/// into `bufs[i]`), grouped by interface, [`BATCH`] per `sendmmsg`.
fn send_transmits(
    udp: &[UdpSocket],
    hdrs: &mut MultiHeaders<SockaddrStorage>,
    node: &mut Node,
    droplog: &mut DropLog,
    outs: &[Outbox],
    bufs: &[Vec<u8>],
) {
    for (iface, sock) in udp.iter().enumerate() {
        let mut iovs = [[IoSlice::new(&[])]; BATCH];
        let mut addrs: [Option<SockaddrStorage>; BATCH] = [None; BATCH];
        let mut k = 0;
        for (out, buf) in outs.iter().zip(bufs) {
            for t in out.transmits.iter().filter(|t| t.iface == iface) {
                iovs[k] = [IoSlice::new(out.bytes(&t.data, buf))];
                addrs[k] = Some(SockaddrStorage::from(t.to));
                k += 1;
                if k == BATCH {
                    send_chunk(sock, iface, hdrs, node, droplog, &iovs[..k], &addrs[..k]);
                    k = 0;
                }
            }
        }
        if k > 0 {
            send_chunk(sock, iface, hdrs, node, droplog, &iovs[..k], &addrs[..k]);
        }
    }
    // Transmissions naming an interface that does not exist cannot happen
    // (the core only routes to configured neighbours), but count them.
    for out in outs {
        for t in out.transmits.iter().filter(|t| t.iface >= udp.len()) {
            node.count_tx(t.iface, 0, false);
        }
    }
}

fn send_chunk(
    sock: &UdpSocket,
    iface: usize,
    hdrs: &mut MultiHeaders<SockaddrStorage>,
    node: &mut Node,
    droplog: &mut DropLog,
    iovs: &[[IoSlice<'_>; 1]],
    addrs: &[Option<SockaddrStorage>],
) {
    let fd = sock.as_raw_fd();
    let mut start = 0;
    while start < iovs.len() {
        let no_cmsgs: [ControlMessage<'_>; 0] = [];
        // The result iterator yields one item per message sent; only the
        // count matters here.
        let r = sendmmsg(fd, hdrs, iovs[start..].iter(), &addrs[start..], no_cmsgs, MsgFlags::MSG_DONTWAIT)
            .map(Iterator::count);
        match r {
            Ok(sent) if sent > 0 => {
                for io in &iovs[start..start + sent] {
                    node.count_tx(iface, io[0].len(), true);
                }
                start += sent;
            }
            Err(Errno::EINTR) => {}
            other => {
                // The first message was refused (e.g. EAGAIN: the socket
                // buffer is full). Drop it, as a router would, and go on.
                let e = other.err().unwrap_or(Errno::EAGAIN);
                node.count_tx(iface, iovs[start][0].len(), false);
                droplog.tx_error = Some(format!("{e} (to {:?})", addrs[start].map(|a| a.to_string())));
                start += 1;
            }
        }
    }
}

/// Sends the deliveries of `outs` to their clients as DELIVER messages.
fn deliver(
    app: &UnixDatagram,
    clients: &mut Clients,
    node: &mut Node,
    stats: &mut LocalStats,
    msg: &mut Vec<u8>,
    outs: &[Outbox],
    bufs: &[Vec<u8>],
) {
    for (out, buf) in outs.iter().zip(bufs) {
        for d in &out.deliveries {
            let Some(client) = clients.ports.get(&d.port) else {
                node.counters.drop(Drop::NoListener);
                continue;
            };
            let payload = out.bytes(&d.data, buf);
            msg.clear();
            msg.push(0x82);
            msg.extend_from_slice(&d.port.to_be_bytes());
            msg.extend_from_slice(payload);
            match app.send_to_addr(msg, client) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc_errno) if is_gone(libc_errno)) => {
                    info!(port = d.port, client = %show_client(client), error = %e,
                          "application client is gone; port unregistered");
                    clients.ports.remove(&d.port);
                    node.unregister_port(d.port);
                    node.counters.drop(Drop::NoListener);
                    stats.clients_gone += 1;
                }
                Err(e) => {
                    debug!(port = d.port, client = %show_client(client), error = %e, "delivery refused");
                    node.counters.drop(Drop::TxFailed);
                    stats.deliver_failed += 1;
                }
            }
        }
    }
}

fn snapshot(c: &Counters) -> (Vec<u64>, Vec<u64>) {
    (c.drops.to_vec(), c.vm_faults.clone())
}

/// Errors that mean nobody listens on a client's socket any more.
fn is_gone(errno: i32) -> bool {
    [Errno::ECONNREFUSED, Errno::ENOENT, Errno::ENOTCONN, Errno::ENOTSOCK].iter().any(|e| *e as i32 == errno)
}

/// Runs a node from its configuration until SIGTERM/SIGINT (with
/// [`Options::signals`]) or `stop`: the whole of `anode node` but logging
/// setup. Errors are returned, not logged.
pub fn run(cfg: &LoadedConfig, opts: &Options, stop: &AtomicBool) -> Result<(), DaemonError> {
    let mut d = Daemon::bind(&cfg.config, cfg.topology.as_ref(), opts)?;
    d.run(stop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/node").join(name)
    }

    #[test]
    fn example_line_loads_with_routes_from_the_topology() {
        let a = |n| Ipv4Addr::new(10, 0, 0, n);
        for (file, addr, far, via) in
            [("a.toml", a(1), a(3), a(2)), ("b.toml", a(2), a(3), a(3)), ("c.toml", a(3), a(1), a(2))]
        {
            let l = load_config(&example(file)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(l.config.address, addr);
            assert!(l.topology_path.as_ref().is_some_and(|p| p.ends_with("examples/node/topology.toml")));
            let node = Node::new(&l.config, l.topology.as_ref()).expect("node");
            assert_eq!(node.next_hop(far), Some(via), "{file}");
            assert_eq!(run_dir_of(&l.config), default_run_dir(addr));
        }
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let dir = std::env::temp_dir().join(format!("anode-cfgtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let cfg = dir.join("n.toml");
        std::fs::write(
            &cfg,
            "address = \"10.0.0.9\"\nrun_dir = \"run\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n\
             [routes]\ntopology = \"t.toml\"\n",
        )
        .expect("write");
        let e = load_config(&cfg).expect_err("no topology file");
        assert!(e.to_string().starts_with(&format!("cannot read {}", dir.join("t.toml").display())), "{e}");
        std::fs::write(dir.join("t.toml"), "node = [{ name = \"a\", address = \"10.0.0.1\" }]\n").expect("write");
        let e = load_config(&cfg).expect_err("not in topology");
        assert_eq!(
            e.to_string(),
            format!("{}: this node's address 10.0.0.9 is not in the topology", dir.join("t.toml").display())
        );
        std::fs::write(dir.join("t.toml"), "node = [{ name = \"a\", address = \"10.0.0.9\" }]\n").expect("write");
        let l = load_config(&cfg).expect("loads");
        assert_eq!(run_dir_of(&l.config), dir.join("run"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
