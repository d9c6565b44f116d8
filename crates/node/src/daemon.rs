//! The node daemon (`anode node`): UDP sockets around the sans-I/O
//! [`core`](crate::core).
//!
//! ```text
//!  UDP iface 0..n ──recvmmsg──► Node::handle_datagram ──sendmmsg──► UDP iface (per next hop)
//!  app.sock (Unix seqpacket) ─► HELLO/REGISTER/INJECT/PLAIN   └────► DELIVER to app clients
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
//! # Local clients
//!
//! Each application client has its own connection to [`APP_SOCKET`] with a
//! bounded queue in the node ([`app`]): a client that stops reading loses
//! its own deliveries and, if it stays stalled, its connection, never
//! another client's service. Control and metrics connections have their own
//! slots and a deadline for the whole request ([`conn`]). Every log line is
//! rate-limited per source line ([`ratelog`]).
//!
//! # Files
//!
//! The run directory (`run_dir`, default [`default_run_dir`]) is created
//! with mode 0700 (0750 with `[local] socket_group`) and holds
//! [`APP_SOCKET`] and [`CONTROL_SOCKET`], mode 0600 (0660), set by the
//! daemon whatever the umask; a run directory that other users can write to
//! is refused. Stale sockets left by a dead daemon are removed at start (a
//! live one is detected through its control socket) and both are removed
//! at exit.

pub(crate) mod app;
mod conn;
mod droplog;
pub mod ratelog;

pub use app::LocalLimits;
pub use conn::MAX_REQUEST;
pub use droplog::DROP_LOG_INTERVAL;

use crate::config::{ConfigError, NodeConfig, Topology};
use crate::core::{Node, Outbox, recv_buffer_len};
use crate::counters::{Counters, DROP_NAMES, Drop};
use crate::local::{self, Reply, Request};
use app::{AppClients, Gone, Sent};
use conn::{Conn, Progress, Stream};
use droplog::DropLog;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Datagrams received (and transmissions sent) per system call.
pub const BATCH: usize = 32;
/// Longest the event loop sleeps before looking at the stop flag and timers.
pub const TICK: Duration = Duration::from_millis(100);
/// Requests handled per application client per wakeup (then the loop moves
/// on, so one client cannot starve the network or the others).
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
/// Control connections: this plus the slot.
const TOKEN_CONN: u64 = 1 << 33;
/// Metrics connections: this plus the slot.
const TOKEN_METRICS_CONN: u64 = TOKEN_CONN + (1 << 24);
/// Application clients: this plus the slot.
const TOKEN_APP_CLIENT: u64 = 1 << 34;

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
    /// The configured socket group does not exist.
    #[error("[local] socket_group {0:?}: no such group")]
    NoSuchGroup(String),
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
    /// Application clients connected since start.
    pub clients_accepted: u64,
    /// Application clients refused because `max_clients` were connected.
    pub clients_refused: u64,
    /// Application clients that closed their connection (or whose socket
    /// failed); their ports were released.
    pub clients_gone: u64,
    /// Application clients disconnected for leaving their messages unread
    /// longer than `stall_timeout_ms`.
    pub clients_stalled: u64,
    /// Messages queued in the node because a client's socket was full.
    pub queued: u64,
    /// Messages dropped because a client's queue was full (deliveries also
    /// count as `app_queue_full` drops).
    pub queue_dropped: u64,
    /// Control and metrics connections served.
    pub control_requests: u64,
    /// Control and metrics connections closed at their deadline.
    pub conns_expired: u64,
    /// Control and metrics connections closed to make room for a new one.
    pub conns_evicted: u64,
}

/// Which listener a short-lived connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listener {
    Control,
    Metrics,
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
    app: Socket,
    control: UnixListener,
    metrics: Option<TcpListener>,
    signals: Option<SignalFd>,
    epoll: Epoll,
    control_conns: Vec<Option<Conn>>,
    metrics_conns: Vec<Option<Conn>>,
    request_timeout: Duration,
    clients: AppClients,
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
    last_report: Instant,
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

/// Makes sure `dir` is a directory of ours that no other user can write
/// to, without a live node; removes stale sockets. Says whether it created
/// the directory (mode 0700, or 0750 and the group `group`).
fn prepare_run_dir(dir: &Path, group: Option<u32>) -> Result<bool, DaemonError> {
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
            let mode = m.mode() & 0o777;
            // Whoever can write to the directory can replace the sockets.
            let group_ok = group.is_some_and(|g| g == m.gid());
            if mode & 0o002 != 0 || (mode & 0o020 != 0 && !group_ok) {
                return Err(bad(format!(
                    "is writable by other users (mode {mode:o}); make it private (chmod 700), or 0750 with \
                     [local] socket_group"
                )));
            }
            if mode & 0o005 != 0 {
                warn!(run_dir = %dir.display(), mode = format!("{mode:o}"),
                      "run directory is readable by other users (its sockets keep their own mode)");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mode = if group.is_some() { 0o750 } else { 0o700 };
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(|e| bad(format!("cannot create: {e}")))?;
            // The mode above is masked by the umask; set it exactly.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                .map_err(|e| bad(format!("cannot set mode {mode:o}: {e}")))?;
            if let Some(g) = group {
                std::os::unix::fs::chown(dir, None, Some(g)).map_err(|e| bad(format!("cannot set group {g}: {e}")))?;
            }
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

/// Binds a Unix socket at `path` with exactly `mode` (and `group`), whatever
/// the umask: bound under a temporary name, its mode and group set, then
/// renamed into place, so it is never reachable with a looser mode.
fn bind_socket<T>(
    path: &Path,
    mode: u32,
    group: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<T>,
) -> Result<T, DaemonError> {
    let err = |source| DaemonError::LocalSocket { path: path.to_path_buf(), source };
    let name = path.file_name().map_or_else(|| "socket".into(), |n| n.to_string_lossy());
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let sock = bind(&tmp).map_err(err)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .and_then(|()| group.map_or(Ok(()), |g| std::os::unix::fs::chown(&tmp, None, Some(g))))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(sock)
}

/// The listening application socket (`SOCK_SEQPACKET`, non-blocking).
fn app_listener(path: &Path) -> io::Result<Socket> {
    let s = Socket::new(Domain::UNIX, Type::SEQPACKET.nonblocking(), None)?;
    s.bind(&SockAddr::unix(path)?)?;
    s.listen(128)?;
    Ok(s)
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
        if let Some(addr) = cfg.metrics
            && !addr.ip().is_loopback()
        {
            warn!(%addr, "the metrics endpoint is bound to {addr}, not a loopback address: anyone who can reach it \
                  can read the node's counters");
        }
        let signals = if opts.signals {
            let mut mask = SigSet::empty();
            mask.add(Signal::SIGTERM);
            mask.add(Signal::SIGINT);
            mask.thread_block().map_err(sys("blocking SIGTERM/SIGINT"))?;
            Some(SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map_err(sys("signalfd"))?)
        } else {
            None
        };

        let group = match &cfg.local.socket_group {
            Some(name) => Some(
                nix::unistd::Group::from_name(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| DaemonError::NoSuchGroup(name.clone()))?
                    .gid
                    .as_raw(),
            ),
            None => None,
        };
        let sock_mode = if group.is_some() { 0o660 } else { 0o600 };
        let run_dir = run_dir_of(cfg);
        let created = prepare_run_dir(&run_dir, group)?;
        let app_path = run_dir.join(APP_SOCKET);
        let control_path = run_dir.join(CONTROL_SOCKET);
        let mut files = SocketFiles { files: Vec::new(), created_dir: created.then(|| run_dir.clone()) };
        let app = bind_socket(&app_path, sock_mode, group, app_listener)?;
        files.files.push(app_path.clone());
        let control = bind_socket(&control_path, sock_mode, group, |p| {
            let l = UnixListener::bind(p)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        files.files.push(control_path.clone());

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
            control_conns: (0..cfg.local.max_control_conns).map(|_| None).collect(),
            metrics_conns: (0..cfg.local.max_metrics_conns).map(|_| None).collect(),
            request_timeout: Duration::from_millis(cfg.local.request_timeout_ms),
            clients: AppClients::new(LocalLimits {
                max_clients: cfg.local.max_clients,
                max_ports_per_client: cfg.local.max_ports_per_client,
                client_queue: cfg.local.client_queue,
                stall_timeout: Duration::from_millis(cfg.local.stall_timeout_ms),
            }),
            inject_out: Outbox::default(),
            timer_out: Outbox::default(),
            last_poll: None,
            no_input: [Vec::new()],
            app_buf: vec![0; local::MAX_MESSAGE + 1],
            msg: Vec::with_capacity(3 + blen),
            started: Instant::now(),
            stats: LocalStats::default(),
            droplog: DropLog::new(),
            last_report: Instant::now(),
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
                    TOKEN_APP => self.accept_app(),
                    TOKEN_CONTROL => self.accept_conns(Listener::Control),
                    TOKEN_METRICS => self.accept_conns(Listener::Metrics),
                    TOKEN_SIGNAL => self.signal_ready(),
                    t if t >= TOKEN_APP_CLIENT => self.app_client_ready((t - TOKEN_APP_CLIENT) as usize, ev.events()),
                    t if t >= TOKEN_METRICS_CONN => {
                        self.conn_ready(Listener::Metrics, (t - TOKEN_METRICS_CONN) as usize, ev.events())
                    }
                    t if t >= TOKEN_CONN => self.conn_ready(Listener::Control, (t - TOKEN_CONN) as usize, ev.events()),
                    _ => {}
                }
            }
            let now = Instant::now();
            self.poll_security(now);
            self.expire_conns(now);
            self.reap_clients(now);
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
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, &outs[..n], &bufs[..n]);
    }

    /// Accepts waiting application clients, each on its own connection.
    fn accept_app(&mut self) {
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
    fn app_client_ready(&mut self, slot: usize, ev: EpollFlags) {
        if ev.contains(EpollFlags::EPOLLOUT) && self.clients.flush(slot) {
            self.watch_client(slot, false);
        }
        let mut buf = std::mem::take(&mut self.app_buf);
        for _ in 0..APP_BATCH {
            let Some(c) = self.clients.get(slot) else { break };
            match app::recv_msg(&c.sock, &mut buf) {
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
    fn reap_clients(&mut self, now: Instant) {
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
                debug!(client = %self.clients.get(slot).map(|c| c.who()).unwrap_or_default(), %reason, "request refused");
                Reply::Error(reason).encode()
            }
        };
        self.reply(slot, &bytes);
        // Reply first, then what the request produced (a ping to this node
        // itself gets OK, then DELIVER).
        let outs = std::slice::from_ref(&self.inject_out);
        send_transmits(&self.udp, &mut self.tx_hdrs, &mut self.node, &mut self.droplog, outs, &self.no_input);
        let mut local = Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, outs, &self.no_input);
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

    fn conns_mut(&mut self, l: Listener) -> &mut Vec<Option<Conn>> {
        match l {
            Listener::Control => &mut self.control_conns,
            Listener::Metrics => &mut self.metrics_conns,
        }
    }

    fn conn_token(l: Listener, slot: usize) -> u64 {
        match l {
            Listener::Control => TOKEN_CONN + slot as u64,
            Listener::Metrics => TOKEN_METRICS_CONN + slot as u64,
        }
    }

    /// Accepts waiting control or metrics connections, each listener in its
    /// own slots; when they are full the oldest connection makes room.
    fn accept_conns(&mut self, l: Listener) {
        loop {
            let stream = match l {
                Listener::Control => match self.control.accept() {
                    Ok((s, _)) => s.set_nonblocking(true).map(|()| Stream::Unix(s)),
                    Err(e) => Err(e),
                },
                Listener::Metrics => match self.metrics.as_ref().map(TcpListener::accept) {
                    Some(Ok((s, _))) => s.set_nonblocking(true).map(|()| Stream::Tcp(s)),
                    Some(Err(e)) => Err(e),
                    None => return,
                },
            };
            match stream {
                Ok(s) => self.add_conn(l, s),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn add_conn(&mut self, l: Listener, s: Stream) {
        let slot = match self.conns_mut(l).iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                let oldest = self
                    .conns_mut(l)
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().map(|c| (c.deadline, i)))
                    .min()
                    .map(|(_, i)| i);
                let Some(slot) = oldest else { return };
                self.close_conn(l, slot);
                self.stats.conns_evicted += 1;
                debug!(listener = ?l, "connections full; closed the oldest for a new one");
                slot
            }
        };
        if interest(&s, &self.epoll, EpollFlags::EPOLLIN, Self::conn_token(l, slot)).is_err() {
            return;
        }
        let deadline = Instant::now() + self.request_timeout;
        self.conns_mut(l)[slot] = Some(Conn::new(s, deadline));
    }

    fn close_conn(&mut self, l: Listener, slot: usize) {
        if let Some(c) = self.conns_mut(l).get_mut(slot).and_then(Option::take) {
            let _ = self.epoll.delete(&c.stream);
        }
    }

    fn conn_ready(&mut self, l: Listener, slot: usize, ev: EpollFlags) {
        let Some(mut c) = self.conns_mut(l).get_mut(slot).and_then(Option::take) else { return };
        let progress = if c.responding {
            c.on_writable()
        } else {
            match c.on_readable() {
                Progress::Request(r) => {
                    self.stats.control_requests += 1;
                    let answer = self.answer(&r, l == Listener::Metrics);
                    let p = c.respond(answer);
                    if p == Progress::Pending {
                        let mut e = EpollEvent::new(EpollFlags::EPOLLOUT, Self::conn_token(l, slot));
                        let _ = self.epoll.modify(&c.stream, &mut e);
                    }
                    p
                }
                Progress::Pending if ev.contains(EpollFlags::EPOLLERR) => Progress::Close,
                p => p,
            }
        };
        self.conns_mut(l)[slot] = Some(c);
        if progress == Progress::Close {
            self.close_conn(l, slot);
        }
    }

    /// Closes connections past their deadline: a whole request and its
    /// answer must fit in `[local] request_timeout_ms`, however the bytes
    /// trickle.
    fn expire_conns(&mut self, now: Instant) {
        for l in [Listener::Control, Listener::Metrics] {
            for slot in 0..self.conns_mut(l).len() {
                if self.conns_mut(l)[slot].as_ref().is_some_and(|c| now >= c.deadline) {
                    debug!(listener = ?l, slot, "connection timed out");
                    self.close_conn(l, slot);
                    self.stats.conns_expired += 1;
                }
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
        let st = &self.stats;
        for (name, help, v) in [
            ("clients_accepted", "Application clients connected since start.", st.clients_accepted),
            ("clients_refused", "Application clients refused (max_clients connected).", st.clients_refused),
            ("clients_gone", "Application clients that closed their connection.", st.clients_gone),
            ("clients_stalled", "Application clients disconnected for leaving messages unread.", st.clients_stalled),
            ("queue_dropped", "Messages dropped because a client's queue was full.", st.queue_dropped),
            ("requests", "Requests received on the application socket.", st.requests),
            ("refused", "Application requests refused.", st.refused),
            ("conns_expired", "Control and metrics connections closed at their deadline.", st.conns_expired),
            ("conns_evicted", "Control and metrics connections closed for a new one.", st.conns_evicted),
        ] {
            s.push_str(&format!(
                "# HELP anode_local_{name}_total {help}\n# TYPE anode_local_{name}_total counter\nanode_local_{name}_total {v}\n"
            ));
        }
        s.push_str("# HELP anode_local_clients Application clients connected now.\n# TYPE anode_local_clients gauge\n");
        s.push_str(&format!("anode_local_clients {}\n", self.clients.connected()));
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
            let clients: Vec<serde_json::Value> = self
                .clients
                .slots
                .iter()
                .flatten()
                .map(|c| {
                    json!({"pid": c.pid, "uid": c.uid, "ports": c.ports, "queued": c.wants_write(),
                           "dropped": c.dropped})
                })
                .collect();
            let st = &self.stats;
            o.insert(
                "local".into(),
                json!({
                    "ports": ports,
                    "clients": clients,
                    "requests": st.requests,
                    "refused": st.refused,
                    "clients_accepted": st.clients_accepted,
                    "clients_refused": st.clients_refused,
                    "clients_gone": st.clients_gone,
                    "clients_stalled": st.clients_stalled,
                    "queued": st.queued,
                    "queue_dropped": st.queue_dropped,
                    "control_requests": st.control_requests,
                    "conns_expired": st.conns_expired,
                    "conns_evicted": st.conns_evicted,
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
        if now.duration_since(self.last_report) >= DROP_LOG_INTERVAL {
            self.last_report = now;
            ratelog::report();
        }
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

/// The local application clients, as the data path sends to them.
struct Local<'a> {
    clients: &'a mut AppClients,
    epoll: &'a Epoll,
    stats: &'a mut LocalStats,
}

impl Local<'_> {
    /// Sends one message to client `slot` (or queues or drops it: [`Sent`]).
    fn send(&mut self, slot: usize, bytes: &[u8]) -> Sent {
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
    fn deliver(&mut self, node: &mut Node, msg: &mut Vec<u8>, outs: &[Outbox], bufs: &[Vec<u8>]) {
        for (out, buf) in outs.iter().zip(bufs) {
            for d in &out.deliveries {
                let Some(&slot) = self.clients.ports.get(&d.port) else {
                    node.counters.drop(Drop::NoListener);
                    continue;
                };
                msg.clear();
                msg.push(0x82);
                msg.extend_from_slice(&d.port.to_be_bytes());
                msg.extend_from_slice(out.bytes(&d.data, buf));
                match self.send(slot, msg) {
                    Sent::Dropped => node.counters.drop(Drop::AppQueueFull),
                    Sent::Gone => node.counters.drop(Drop::NoListener),
                    Sent::Now | Sent::Queued => {}
                }
            }
        }
    }
}

fn snapshot(c: &Counters) -> (Vec<u64>, Vec<u64>) {
    (c.drops.to_vec(), c.vm_faults.clone())
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
