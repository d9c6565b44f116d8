//! The anode daemon (`anode node`): the I/O around the I/O-free node.
//!
//! ```text
//!  UDP iface 0..n ──recvmmsg──► Node::handle_datagram ──sendmmsg──► UDP iface (per next hop)
//!  app.sock (Unix seqpacket) ─► HELLO/REGISTER/INJECT/PLAIN/CAPSULE   └──► DELIVER to app clients
//!  control.sock (Unix stream) ► "status" (JSON) | "metrics" (Prometheus) | "capture" (frames)
//!  metrics TCP (optional) ────► GET /metrics
//!  signalfd ──────────────────► SIGTERM/SIGINT: finish the batch, clean up, exit
//! ```
//!
//! # Layer
//!
//! This crate owns everything the node core does not: sockets, `epoll`,
//! timers, signals, the run directory and its files, the local application
//! API and the control socket, and the log. `anode_node::core::Node` takes
//! datagrams and `now` and returns transmissions; this crate carries them.
//!
//! - [`files`]: reading the configuration and topology files, the run
//!   directory and the socket files (modes set whatever the umask).
//! - [`daemon`]: the [`Daemon`]: binding, the event loop, timers, signals.
//! - `udp`: batched receive and send on the interface sockets.
//! - `app`: the local application API, one connection per client.
//! - `control`: the control socket and the metrics endpoint.
//! - `capture`: `anode capture`, the operator's stream of plaintext
//!   datagrams over the control socket.
//! - `droplog`, [`ratelog`]: rate-limited logging.
//! - [`client`]: a blocking client for the local API.
//!
//! # Invariants
//!
//! - One thread runs the loop; it never blocks except in `epoll_wait`.
//! - A receive batch's buffers are not reused before every transmission
//!   pointing into them was handed to the kernel.
//! - No client, connection or input can make the loop do unbounded work per
//!   wakeup: receives, requests and accepts are batched with fixed bounds,
//!   queues have fixed bounds, log lines are rate-limited.
// One module, `mmsg` (`recvmmsg` with per-message control buffers, for
// UDP GRO), allows `unsafe`; everything else denies it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod app;
mod capture;
pub mod client;
mod control;
pub mod daemon;
mod droplog;
pub mod files;
pub(crate) mod frag;
mod ledger;
mod mmsg;
mod offload;
mod pacer;
mod periodlog;
pub mod ports;
pub mod ratelog;
mod tap;
mod udp;
mod workers;

pub use app::LocalLimits;
pub use control::{MAX_REQUEST, query};
pub use daemon::{Daemon, LocalStats, Options, Stopper, TimerStats};
pub use droplog::DROP_LOG_INTERVAL;
pub use files::{LoadedConfig, StartFiles, default_run_dir, load_config, load_config_from, run_dir_of};

use anode_node::config::ConfigError;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;

/// Datagrams received (and transmissions sent) per system call.
pub const BATCH: usize = 32;

/// The largest datagram the daemon receives whole (UDP's limit).
pub const MAX_DATAGRAM: usize = 65_536;
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
const TOKEN_TIMER: u64 = TOKEN_APP + 4;
const TOKEN_STOP: u64 = TOKEN_APP + 5;
/// A data path worker left the event loop work (`workers::Shared::kick`).
const TOKEN_KICK: u64 = TOKEN_APP + 6;
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
    /// The accounting ledger cannot be opened.
    #[error("ledger {}: {reason}", file.display())]
    Ledger {
        /// The ledger file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The resource-control configuration is invalid.
    #[error("resource control: {0}")]
    Rcane(String),
    /// A module listed in `[modules]` was refused.
    #[error("module {}: {source}", file.display())]
    Module {
        /// The module file.
        file: PathBuf,
        /// Why it was refused.
        source: anode_node::core::LoadFailure,
    },
    /// A pod listed in `[[modules.pod]]` was refused.
    #[error("pod {}: {reason}", file.display())]
    Pod {
        /// The pod's file.
        file: PathBuf,
        /// Why it was refused.
        reason: String,
    },
    /// A session listed in `[modules]` is malformed or was refused.
    #[error("[[modules.session]] #{index}: {reason}")]
    StaticSession {
        /// Which one (from 0).
        index: usize,
        /// Why.
        reason: String,
    },
    /// The `[monitor]` tap could not start.
    #[error(transparent)]
    Tap(#[from] tap::TapError),
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
    /// A file needed at start is not usable from the verified boot chain:
    /// not signed (`NotInChain`), or left out by a degraded start where it
    /// cannot be.
    #[error("boot chain: {}: {source}", file.display())]
    Boot {
        /// The file.
        file: PathBuf,
        /// Why.
        source: anode_boot::ChainError,
    },
    /// The `[domain]` secret or service is unusable.
    #[error("[domain]: {0}")]
    Domain(String),
    /// A system call the event loop needs failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: Errno,
    },
}

fn sys(what: &'static str) -> impl FnOnce(Errno) -> DaemonError {
    move |source| DaemonError::Sys { what, source }
}

fn sys_io(what: &'static str) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |e| DaemonError::Sys { what, source: Errno::from_raw(e.raw_os_error().unwrap_or(0)) }
}

fn interest(fd: impl AsFd, epoll: &Epoll, flags: EpollFlags, token: u64) -> Result<(), DaemonError> {
    epoll.add(fd, EpollEvent::new(flags, token)).map_err(sys("epoll_ctl"))
}

/// Runs a node from its configuration until SIGTERM/SIGINT (with
/// [`Options::signals`]): the whole of `anode node` but logging setup.
/// Errors are returned, not logged.
pub fn run(cfg: &LoadedConfig, opts: &Options) -> Result<(), DaemonError> {
    let mut d = Daemon::bind(&cfg.config, cfg.topology.as_ref(), opts)?;
    d.run()
}
