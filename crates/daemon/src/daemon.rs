//! The [`Daemon`]: binds every socket of a node, then runs its event loop.

use crate::app::app_listener;
use crate::app::{AppClients, LocalLimits};
use crate::control::{Conn, Listener};
use crate::droplog::DropLog;
use crate::files::{SocketFiles, StartFiles, bind_socket, prepare_run_dir, run_dir_of};
use crate::udp::Rx;
use crate::{
    APP_SOCKET, BATCH, CONTROL_SOCKET, DROP_LOG_INTERVAL, DaemonError, MAX_DATAGRAM, TOKEN_APP, TOKEN_APP_CLIENT,
    TOKEN_CONN, TOKEN_CONTROL, TOKEN_KICK, TOKEN_METRICS, TOKEN_METRICS_CONN, TOKEN_SIGNAL, TOKEN_STOP, TOKEN_TIMER,
    UDP_SOCKET_BUFFER, interest, ratelog, sys, sys_io,
};
use anode_node::config::ConfigError;
use anode_node::config::{NodeConfig, Topology};
use anode_node::core::{Node, Outbox, recv_buffer_len};
use anode_node::counters::{Counters, DROP_NAMES};
use anode_wire::local;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{MultiHeaders, SockaddrStorage};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use socket2::Socket;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How the daemon runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Handle SIGTERM and SIGINT: they are blocked in the calling thread and
    /// read from a signalfd, and either one stops the loop. Set it when the
    /// daemon runs in the main thread of its own process (as `anode node`
    /// does), before other threads start.
    pub signals: bool,
    /// Append every virtual processor's completed periods (the scheduler's
    /// period records) to this CSV file, for experiments (Fig. 11). Written
    /// in batches, flushed every 100 ms and at exit.
    pub period_log: Option<PathBuf>,
    /// The node's verified boot chain (`anode node --boot`): the key file,
    /// modules and credentials read at start are taken from it, never read
    /// again from their paths, and `status` shows its verdicts.
    pub boot: Option<Arc<anode_boot::fsio::NodeBoot>>,
    /// A repository directory (laid out as a boot mirror) served to peers
    /// over their SAs for boot recovery (`CONTROL` body 0x21).
    pub recovery_repo: Option<PathBuf>,
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

/// Stops a running daemon from another thread: sets its flag and wakes its
/// loop (an eventfd in its epoll set).
#[derive(Debug, Clone)]
pub struct Stopper {
    flag: Arc<AtomicBool>,
    event: Arc<EventFd>,
}

impl Stopper {
    /// Asks the loop to stop after the batch in hand.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::Relaxed);
        let _ = self.event.write(1);
    }
}

/// How closely timers fire: each wakeup of the timer against the deadline
/// it was armed for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerStats {
    /// Timer wakeups.
    pub fired: u64,
    /// Sum of lateness, µs (for the mean).
    pub late_us_sum: u64,
    /// Largest lateness, µs.
    pub late_us_max: u64,
    /// Wakeups more than 1 ms late.
    pub late_over_1ms: u64,
}

/// A running node: sockets bound, ready to [`run`](Daemon::run).
pub struct Daemon {
    /// The core, behind the lock the data path workers share (held by the
    /// event loop except while it waits).
    pub(crate) node: crate::workers::NodeCell,
    /// Workers to start when the loop runs (`[io] workers` > 1).
    pending_workers: Vec<crate::workers::WorkerSetup>,
    /// What the event loop shares with its workers, when there are any.
    pub(crate) shared: Option<Arc<crate::workers::Shared>>,
    pub(crate) cfg: NodeConfig,
    pub(crate) run_dir: PathBuf,
    pub(crate) udp: Vec<UdpSocket>,
    pub(crate) listen: Vec<SocketAddr>,
    pub(crate) app: Socket,
    pub(crate) control: UnixListener,
    pub(crate) metrics: Option<TcpListener>,
    pub(crate) signals: Option<SignalFd>,
    /// The ledger writer (when RCANE is on) and when charges last went to it.
    ledger: Option<(crate::ledger::LedgerWriter, Instant)>,
    /// Something was charged since the last drain to the ledger (the loop
    /// then wakes for the next one; an idle node does not).
    pub(crate) charged: bool,
    /// The period log, when asked for, and when it was last flushed.
    period_log: Option<crate::periodlog::PeriodLog>,
    pub(crate) epoll: Epoll,
    pub(crate) timer: TimerFd,
    /// The deadline the timer is armed for.
    pub(crate) armed: Option<Instant>,
    pub(crate) timers: TimerStats,
    pub(crate) stopper: Stopper,
    pub(crate) control_conns: Vec<Option<Conn>>,
    pub(crate) metrics_conns: Vec<Option<Conn>>,
    pub(crate) request_timeout: Duration,
    pub(crate) clients: AppClients,
    /// The receive buffers (taken out while a batch is handled).
    pub(crate) rx: Option<Box<Rx>>,
    pub(crate) tx_hdrs: MultiHeaders<SockaddrStorage>,
    pub(crate) inject_out: Outbox,
    pub(crate) timer_out: Outbox,
    /// Link-layer fragmentation and reassembly (`[node] link_mtu`).
    pub(crate) frag: crate::frag::Frag,
    /// UDP GSO and GRO per interface (`[io]`), and the I/O counters.
    pub(crate) offload: crate::offload::Offload,
    /// Transmissions counted by the send path, added to the node's
    /// counters after each send.
    pub(crate) tally: crate::udp::TxTally,
    /// Transmit scheduling of the interfaces with a `rate_bps`. Behind a
    /// lock because the data path workers queue on them too; only the event
    /// loop releases. Lock order: the node first, then the pacer.
    pub(crate) pacer: Arc<parking_lot::Mutex<crate::pacer::Pacer>>,
    /// Which interfaces are paced (fixed at start), read without the lock.
    pub(crate) paced: Arc<[bool]>,
    /// What the paced links released, reused wakeup after wakeup.
    pub(crate) released: Vec<(crate::pacer::TxKey, crate::pacer::Queued)>,
    /// The batch's datagrams their paced links let go at once (outbox,
    /// transmission), reused batch after batch.
    pub(crate) send_now: Vec<(usize, usize)>,
    /// A paced link's burst being looked at: places and lengths (scratch).
    pub(crate) burst: (Vec<(usize, usize)>, Vec<u32>),
    /// When the receive batch being handled arrived (ns on the daemon's
    /// clock; taken only when a link is paced).
    pub(crate) batch_at_ns: u64,
    pub(crate) app_buf: Vec<u8>,
    pub(crate) msg: Vec<u8>,
    pub(crate) started: Instant,
    pub(crate) stats: LocalStats,
    pub(crate) droplog: DropLog,
    pub(crate) last_report: Instant,
    pub(crate) stopping: bool,
    pub(crate) _files: SocketFiles,
    /// The FLAME tap's export files, when `[monitor]` turns the tap on.
    pub(crate) tap: Option<crate::tap::TapFiles>,
    /// The `boot` section of `status`: the verified chain the node started
    /// from, if any (verdicts only; the chain's bytes are not kept).
    pub(crate) boot: Option<serde_json::Value>,
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

/// The node core for `cfg`: its identity when security is on, its sandbox
/// when modules are on. Modules listed in the configuration are loaded later,
/// through the core ([`Daemon::load_start_modules`]).
fn build_node(
    cfg: &NodeConfig,
    topology: Option<&Topology>,
    unix_ms_at_zero: u64,
    files: StartFiles<'_>,
) -> Result<Node, DaemonError> {
    let config = |source| DaemonError::Config { file: "<config>".into(), source };
    let sec = match cfg.security.as_ref().filter(|s| s.enabled) {
        Some(s) => {
            let path = s.key.clone().ok_or(config(ConfigError::MissingKeyFile))?;
            let identity = match files {
                StartFiles::Disk => anode_sec::Identity::load(&path)?,
                StartFiles::Chain(_) => {
                    // The verified bytes; the file's mode is still checked.
                    let io = |source| anode_sec::KeyError::Io { path: path.clone(), source };
                    let mode =
                        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).map_err(io)?.permissions());
                    if mode & 0o077 != 0 {
                        return Err(anode_sec::KeyError::Permissions { path, mode: mode & 0o777 }.into());
                    }
                    let bytes = files.read_needed(&path)?;
                    let text = std::str::from_utf8(&bytes).map_err(|_| anode_sec::KeyError::Format {
                        what: path.display().to_string(),
                        kind: "secret",
                        tag: anode_sec::identity::SECRET_TAG,
                    })?;
                    anode_sec::Identity::parse(text)?
                }
            };
            Some(anode_node::secure::SecurityInit { identity, unix_ms_at_zero })
        }
        None => None,
    };
    let mut node = Node::with_security(cfg, topology, sec, 0).map_err(config)?;
    if let Some(d) = cfg.domain.as_ref().filter(|d| d.kdc) {
        node.enable_kdc(crate::files::domain_kdc(d, files)?, unix_ms_at_zero);
    }
    if let Some(d) = cfg.domain.as_ref() {
        let key = crate::files::domain_key(d, files)?;
        node.enable_domain(cfg, key, unix_ms_at_zero).map_err(|e| DaemonError::Domain(e.to_string()))?;
    }
    if let Some(m) = &cfg.modules {
        let sb = anode_node::switchlets::sandbox(m, cfg.address, node.route_table()).map_err(config)?;
        node.enable_modules(sb, unix_ms_at_zero);
        // Module work runs in sessions under EDF (RCANE); the scheduler's
        // clock starts with the daemon's.
        let rcane = m.rcane().map_err(config)?;
        node.enable_rcane(rcane, 0).map_err(|e| DaemonError::Rcane(e.to_string()))?;
        node.set_session_grace_ms(m.session_grace_secs.saturating_mul(1000));
        node.set_tx_allowance(m.tx_bytes_per_sec);
    }
    Ok(node)
}

/// One UDP socket per interface, non-blocking, with large buffers.
fn bind_interfaces(cfg: &NodeConfig, workers: usize) -> Result<(Vec<Vec<UdpSocket>>, Vec<SocketAddr>), DaemonError> {
    // shards[w][i]: worker w's socket of interface i. With one worker the
    // sockets are plain; with more, each interface's sockets share its port
    // through SO_REUSEPORT (only sockets of this user may join the group).
    let mut shards: Vec<Vec<UdpSocket>> = (0..workers.max(1)).map(|_| Vec::new()).collect();
    let mut listen = Vec::new();
    for i in &cfg.interfaces {
        let bind_err = |source| DaemonError::Bind { iface: i.name.clone(), addr: i.listen, source };
        let mut addr = i.listen;
        for shard in shards.iter_mut() {
            let s = if workers > 1 {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
                    .map_err(bind_err)?;
                s.set_reuse_port(true).map_err(bind_err)?;
                s.bind(&addr.into()).map_err(bind_err)?;
                UdpSocket::from(s)
            } else {
                UdpSocket::bind(addr).map_err(bind_err)?
            };
            s.set_nonblocking(true).map_err(bind_err)?;
            // Best effort: room for bursts. The kernel caps it at rmem_max.
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &UDP_SOCKET_BUFFER);
            let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::SndBuf, &UDP_SOCKET_BUFFER);
            // A port 0 listen: the others join the port the first one got.
            addr = s.local_addr().map_err(bind_err)?;
            shard.push(s);
        }
        listen.push(addr);
    }
    Ok((shards, listen))
}

/// The Prometheus endpoint, if configured (with a warning off loopback).
fn bind_metrics(cfg: &NodeConfig) -> Result<Option<TcpListener>, DaemonError> {
    let Some(addr) = cfg.metrics else { return Ok(None) };
    let merr = |source| DaemonError::MetricsBind { addr, source };
    let l = TcpListener::bind(addr).map_err(merr)?;
    l.set_nonblocking(true).map_err(merr)?;
    if !addr.ip().is_loopback() {
        warn!(%addr, "the metrics endpoint is bound to {addr}, not a loopback address: anyone who can reach it \
              can read the node's counters");
    }
    Ok(Some(l))
}

/// SIGTERM and SIGINT, blocked and read from a signalfd.
fn signal_fd() -> Result<SignalFd, DaemonError> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block().map_err(sys("blocking SIGTERM/SIGINT"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map_err(sys("signalfd"))
}

/// The local sockets in the run directory, with their modes set whatever
/// the umask.
fn local_sockets(cfg: &NodeConfig) -> Result<(PathBuf, Socket, UnixListener, SocketFiles), DaemonError> {
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
    files.files.push(app_path);
    let control = bind_socket(&control_path, sock_mode, group, |p| {
        let l = UnixListener::bind(p)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })?;
    files.files.push(control_path);
    Ok((run_dir, app, control, files))
}

impl Daemon {
    /// Binds every socket of the node described by `cfg` (interfaces first,
    /// so a port in use fails before the run directory is touched), then
    /// loads the modules the configuration lists, through the core.
    pub fn bind(cfg: &NodeConfig, topology: Option<&Topology>, opts: &Options) -> Result<Daemon, DaemonError> {
        // Wall-clock time at now_ms = 0: handshake timestamps and credential expiry.
        let unix_ms_at_zero = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let started = Instant::now();
        let files = opts.boot.as_deref().map_or(StartFiles::Disk, StartFiles::Chain);
        let mut node = build_node(cfg, topology, unix_ms_at_zero, files)?;
        if let Some(repo) = &opts.recovery_repo {
            let mut mirror = anode_boot::fsio::MirrorSource::new(repo);
            node.serve_recovery(Box::new(move |req| anode_boot::Source::exchange(&mut mirror, req)));
            info!(repository = %repo.display(), "serving boot recovery to peers over their SAs");
        }
        let workers = match cfg.io.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()).min(anode_node::config::MAX_WORKERS),
            n => n,
        };
        let (mut shards, listen) = bind_interfaces(cfg, workers)?;
        let names: Vec<String> = cfg.interfaces.iter().map(|i| i.name.clone()).collect();
        // With workers, the event loop sends (timers, application
        // requests) on a second handle of worker 0's sockets and receives
        // nothing.
        let udp: Vec<UdpSocket> = if workers > 1 {
            shards
                .first()
                .map(|s0| s0.iter().map(UdpSocket::try_clone).collect::<Result<Vec<_>, _>>())
                .transpose()
                .map_err(sys_io("dup"))?
                .unwrap_or_default()
        } else {
            shards.pop().unwrap_or_default()
        };
        let offload = crate::offload::Offload::setup(&udp, &names, &cfg.io);
        // Room for the largest UDP datagram: a control message (a module
        // load) is not bound by the MTU, and a shorter buffer truncates it
        // (it was dropped as `anep_bad_length` above ~2.8 KB). Pages never
        // written stay unmapped.
        let blen = recv_buffer_len(cfg.mtu).max(MAX_DATAGRAM);
        let pending_workers: Vec<crate::workers::WorkerSetup> = shards
            .into_iter()
            .enumerate()
            .map(|(id, socks)| crate::workers::WorkerSetup {
                id,
                socks,
                names: names.clone(),
                io: cfg.io.clone(),
                link_mtu: cfg.link_mtu,
                blen,
                started,
            })
            .collect();
        let shared = if workers > 1 {
            Some(Arc::new(crate::workers::Shared::new(workers).map_err(sys("eventfd"))?))
        } else {
            None
        };
        let metrics = bind_metrics(cfg)?;
        let signals = if opts.signals { Some(signal_fd()?) } else { None };
        let (run_dir, app, control, socket_files) = local_sockets(cfg)?;
        let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .map_err(sys("timerfd_create"))?;
        let event = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).map_err(sys("eventfd"))?;
        let stopper = Stopper { flag: Arc::new(AtomicBool::new(false)), event: Arc::new(event) };

        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(sys("epoll_create"))?;
        if let Some(sh) = &shared {
            interest(&sh.kick, &epoll, EpollFlags::EPOLLIN, TOKEN_KICK)?;
        } else {
            for (i, s) in udp.iter().enumerate() {
                interest(s, &epoll, EpollFlags::EPOLLIN, i as u64)?;
            }
        }
        interest(&app, &epoll, EpollFlags::EPOLLIN, TOKEN_APP)?;
        interest(&control, &epoll, EpollFlags::EPOLLIN, TOKEN_CONTROL)?;
        interest(&timer, &epoll, EpollFlags::EPOLLIN, TOKEN_TIMER)?;
        interest(&*stopper.event, &epoll, EpollFlags::EPOLLIN, TOKEN_STOP)?;
        if let Some(s) = &signals {
            interest(s, &epoll, EpollFlags::EPOLLIN, TOKEN_SIGNAL)?;
        }
        if let Some(m) = &metrics {
            interest(m, &epoll, EpollFlags::EPOLLIN, TOKEN_METRICS)?;
        }

        let pacer = crate::pacer::Pacer::new(&cfg.interfaces);
        let paced = pacer.mask();
        let mut d = Daemon {
            rx: Some(Box::new(Rx::new(blen))),
            tx_hdrs: MultiHeaders::preallocate(BATCH, None),
            node: crate::workers::NodeCell::new(node),
            pending_workers,
            shared,
            cfg: cfg.clone(),
            run_dir,
            udp,
            listen,
            app,
            control,
            metrics,
            signals,
            epoll,
            timer,
            armed: None,
            timers: TimerStats::default(),
            stopper,
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
            frag: crate::frag::Frag::new(cfg.link_mtu),
            offload,
            tally: crate::udp::TxTally::default(),
            pacer: Arc::new(parking_lot::Mutex::new(pacer)),
            paced,
            released: Vec::with_capacity(BATCH),
            send_now: Vec::with_capacity(BATCH),
            burst: (Vec::with_capacity(BATCH), Vec::with_capacity(BATCH)),
            batch_at_ns: 0,
            app_buf: vec![0; local::MAX_MESSAGE + 1],
            msg: Vec::with_capacity(3 + blen),
            charged: false,
            ledger: None,
            period_log: match &opts.period_log {
                None => None,
                Some(p) => Some(
                    crate::periodlog::PeriodLog::create(p)
                        .map_err(|source| DaemonError::ReadFile { file: p.clone(), source })?,
                ),
            },
            started,
            stats: LocalStats::default(),
            droplog: DropLog::new(),
            last_report: started,
            stopping: false,
            _files: socket_files,
            boot: opts.boot.as_deref().map(crate::files::boot_json),
            tap: None,
        };
        if d.paced.iter().any(|p| *p) {
            d.node.set_paced(d.paced.to_vec());
            d.node.set_seal_at_send(d.paced.to_vec());
        }
        if d.node.rcane_on() {
            let file = d.run_dir.join("ledger.db");
            let w = crate::ledger::LedgerWriter::start(&file, &d.node.address().to_string())
                .map_err(|reason| DaemonError::Ledger { file, reason })?;
            d.ledger = Some((w, Instant::now()));
        }
        d.load_start_modules(files)?;
        d.start_tap(unix_ms_at_zero, files)?;
        d.log_start();
        Ok(d)
    }

    /// Loads the modules listed in `[modules] load`, through the same path
    /// as loads over the network (the core's `load_module`: one credential
    /// decision, the init actions carried out and sent, the same logs).
    fn load_start_modules(&mut self, files: StartFiles<'_>) -> Result<(), DaemonError> {
        let Some(m) = self.cfg.modules.clone() else { return Ok(()) };
        // The administrator's sessions first, so that their principals'
        // modules start in them.
        for (index, s) in m.sessions.iter().enumerate() {
            let err = |reason: String| DaemonError::StaticSession { index, reason };
            let (key, vps) = s.parsed(index).map_err(|e| err(e.to_string()))?;
            let cred = files.read_needed(&s.credential)?;
            let now_ms = self.now_ms();
            let principal = anode_sandbox::PrincipalId(*key.as_bytes());
            let sid = self.node.open_static_session(principal, &cred, &vps, now_ms).map_err(|e| err(e.to_string()))?;
            info!(session = %sid, principal = %principal, vps = vps.len(), "session opened from the config");
        }
        // Pods before modules: a module's anode_init may bind to one.
        for p in &m.pods {
            let err = |reason: String| DaemonError::Pod { file: p.file.clone(), reason };
            let Some(code) = files.read(&p.file)? else {
                warn!(file = %p.file.display(), "pod not loaded: the degraded boot left it out");
                continue;
            };
            let cred = files.read_needed(&p.credential)?;
            let (clients, on_fault) = p.policy().map_err(err)?;
            let spec = anode_sandbox::PodSpec {
                code: &code,
                credential: Some(&cred),
                requester: None,
                name: &p.name,
                limits: Default::default(),
                clients,
                on_fault,
                min_fuel: p.min_fuel,
            };
            let now_ms = self.now_ms();
            match self.node.load_pod(&spec, now_ms) {
                Some(Ok(id)) => {
                    info!(pod = ?id, name = %p.name, file = %p.file.display(), "pod loaded from the config")
                }
                Some(Err(e)) => return Err(err(e.to_string())),
                None => return Err(err("modules are off".into())),
            }
        }
        for l in &m.loads {
            let Some(code) = files.read(&l.file)? else {
                warn!(file = %l.file.display(), "module not loaded: the degraded boot left it out");
                continue;
            };
            let cred = files.read_needed(&l.credential)?;
            let spec = anode_sandbox::LoadSpec {
                code: &code,
                credential: Some(&cred),
                requester: None,
                local_name: l.name.as_deref(),
                limits: Default::default(),
            };
            self.timer_out.clear();
            let now_ms = self.now_ms();
            match self.node.load_module(&spec, now_ms, &mut self.timer_out) {
                Ok((id, _)) => info!(module = %id, file = %l.file.display(), "module loaded from the config"),
                Err(source) => return Err(DaemonError::Module { file: l.file.clone(), source }),
            }
            self.send_timer_out();
        }
        Ok(())
    }

    fn log_start(&self) {
        let ifaces: Vec<String> =
            self.cfg.interfaces.iter().zip(&self.listen).map(|(i, l)| format!("{}={}", i.name, l)).collect();
        info!(
            address = %self.node.address(),
            mtu = self.cfg.mtu,
            interfaces = %ifaces.join(","),
            neighbors = self.cfg.neighbor_addrs().len(),
            routes = self.node.routes().len(),
            default_via = ?self.cfg.routes.default_via,
            run_dir = %self.run_dir.display(),
            metrics = %self.metrics_addr().map_or("off".to_string(), |a| format!("http://{a}/metrics")),
            security = %self.node.security_json().map_or("off".to_string(), |s| format!("on, identity {}", s["identity"].as_str().unwrap_or("?"))),
            "node started"
        );
    }

    /// A handle that stops [`run`](Self::run) from another thread.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// How closely timers have fired so far.
    pub fn timer_stats(&self) -> TimerStats {
        self.timers
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

    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Monotonic ns since start: the scheduler's clock.
    pub(crate) fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// Sends what sessions were charged to the ledger writer, once per
    /// flush interval, or now (at exit: then waits for the final write).
    fn record_charges(&mut self, last: bool) {
        let Some((_, at)) = self.ledger.as_ref() else { return };
        if !last && at.elapsed() < crate::ledger::FLUSH_INTERVAL {
            return;
        }
        let now_ns = self.now_ns();
        let (charges, events) = self.node.drain_charges(now_ns);
        self.charged = false;
        // The workers' next charge wakes the loop for the next flush.
        if let Some(shared) = &self.shared {
            shared.charged.store(false, Ordering::Relaxed);
        }
        if let Some((w, at)) = self.ledger.as_mut() {
            w.send(charges, &events);
            *at = Instant::now();
            if last {
                w.finish();
            }
        }
    }

    /// Drains the scheduler's completed periods into the period log (or
    /// drops them when there is none); flushes every 100 ms, or now.
    fn write_periods(&mut self, flush: bool) {
        let Some(log) = self.period_log.as_mut() else {
            self.node.drain_periods(&mut |_| {});
            return;
        };
        self.node.drain_periods(&mut |r| log.record(&r));
        if flush {
            log.finish();
        } else {
            log.flush(false);
        }
    }

    /// Runs one dispatch of module work, if a virtual processor is
    /// runnable: at most its budget of wall time (checked at every
    /// preemption point), charged with what the thread CPU clock measured.
    /// Returns whether it ran one (there may be more).
    fn run_sessions(&mut self) -> bool {
        let now_ns = self.now_ns();
        let Some(d) = self.node.pick(now_ns) else { return false };
        let end = Instant::now() + Duration::from_nanos(d.budget_ns);
        let cpu0 = thread_cpu_ns();
        self.timer_out.clear();
        let now_ms = self.now_ms();
        // Slack goes to network input first: a dispatch on slack time
        // (Best-Effort's module work beyond its guarantee, or a VP with
        // `extra`) stops at its next preemption point when a datagram is
        // waiting. A guaranteed dispatch runs its budget out (unless
        // `input_preempts_us`, below): forwarding waits at most one slice.
        let slack = d.kind == anode_sched::DispatchKind::Slack;
        // A slack dispatch also ends when one of the core's timers is due
        // (a module alarm above all): the events it posts may belong to a
        // VP with a guarantee, which EDF must see at once rather than
        // after the slack runs out (a VP whose next event is an alarm would
        // otherwise look idle for that long).
        let end = match self.node.poll_at().filter(|_| slack) {
            Some(ms) => end.min(self.started + Duration::from_millis(ms)),
            None => end,
        };
        // And when a paced link may send again (its queued datagrams wait
        // for the loop).
        let end = match self.pacer.lock().next_due_ns(now_ns).filter(|_| slack) {
            Some(ns) => end.min(self.started + Duration::from_nanos(ns)),
            None => end,
        };
        // With `[modules] input_preempts_us`, a guaranteed dispatch also
        // looks for waiting input, at most that often, and ends for it: the
        // input may wake a VP with an earlier deadline (a channel's packets),
        // which EDF must see before this one's slice runs out.
        let every = self.cfg.modules.as_ref().map_or(0, |m| m.input_preempts_us);
        let mut look = InputLook::new(slack, every, Instant::now());
        // With workers the loop reads no datagrams: they wait for the lock
        // instead (`worker_waits`).
        let mut fds: Vec<nix::poll::PollFd<'_>> = if look.ever() && self.shared.is_none() {
            self.udp.iter().map(|s| nix::poll::PollFd::new(s.as_fd(), nix::poll::PollFlags::POLLIN)).collect()
        } else {
            Vec::new()
        };
        let waiting = self.shared.clone();
        let worker_waits = || waiting.as_ref().is_some_and(|w| w.waiting.load(Ordering::Relaxed) > 0);
        let mut keep_going = || {
            let now = Instant::now();
            now < end && !(look.due(now) && (input_waiting(&mut fds) || worker_waits()))
        };
        self.node.run_dispatch(&d, now_ms, &mut keep_going, &mut self.timer_out);
        let used = thread_cpu_ns().saturating_sub(cpu0);
        let now_ns = self.now_ns();
        self.node.charge(&d, used, now_ns);
        self.charged = true;
        self.send_timer_out();
        true
    }

    /// Runs the event loop until [`Stopper::stop`] or, with
    /// [`Options::signals`], SIGTERM or SIGINT. The batch in hand is
    /// finished first; the final counters are logged and the sockets
    /// removed when the daemon is dropped.
    ///
    /// There is no tick: the loop sleeps in `epoll_wait` until a socket is
    /// ready or the timer fires, and the timer is armed for the earliest
    /// deadline anything has (the core's `poll_at`, connection deadlines,
    /// stalled clients, due log lines). An idle node with nothing scheduled
    /// sleeps until a packet comes.
    pub fn run(&mut self) -> Result<(), DaemonError> {
        let mut events = [EpollEvent::empty(); 64];
        self.timeouts(Instant::now());
        let mut more = false;
        // Adaptive polling: after a batch of datagrams the loop polls for
        // up to `[io] spin_us` before it sleeps, so the next datagram of a
        // burst or of a ping train costs no wakeup. A wakeup without
        // datagrams (a timer, a control request) does not spin, so an idle
        // node sleeps.
        let spin = Duration::from_micros(self.cfg.io.spin_us);
        let mut spin_until: Option<Instant> = None;
        let threads = self.start_workers();
        while !self.stopping && !self.stopper.flag.load(Ordering::Relaxed) {
            // With module work runnable the loop does not sleep, and checks
            // every deadline each time round (`timeouts`): the timer is
            // armed only before it may sleep or spin. Re-arming it after
            // every dispatch cost a `timerfd_settime` each (12 a frame for
            // the transcoder's paths, docs/transcoder.md).
            if !more {
                self.arm_timer(Instant::now());
            }
            // With module work runnable, only look at the sockets (network
            // input runs between dispatches), then dispatch again.
            let mut n = 0;
            if let (false, Some(until)) = (more, spin_until) {
                n = crate::offload::spin_wait(&self.epoll, &mut events, until, &mut self.offload.counters);
            }
            if n == 0 {
                let wait = if more { EpollTimeout::ZERO } else { EpollTimeout::NONE };
                // Workers take the node while the loop waits.
                if self.shared.is_some() {
                    self.node.release();
                }
                let r = wait_events(&self.epoll, &mut events, wait);
                self.node.acquire();
                n = r?;
            }
            let udp = self.udp.len() as u64;
            spin_until = (!spin.is_zero() && events[..n].iter().any(|e| e.data() < udp)).then(|| Instant::now() + spin);
            for ev in &events[..n] {
                match ev.data() {
                    t if t < udp => self.udp_ready(t as usize),
                    TOKEN_APP => self.accept_app(),
                    TOKEN_CONTROL => self.accept_conns(Listener::Control),
                    TOKEN_METRICS => self.accept_conns(Listener::Metrics),
                    TOKEN_SIGNAL => self.signal_ready(),
                    TOKEN_TIMER => self.timer_fired(),
                    TOKEN_STOP => {
                        let _ = self.stopper.event.read();
                    }
                    TOKEN_KICK => self.kicked(),
                    t if t >= TOKEN_APP_CLIENT => self.app_client_ready((t - TOKEN_APP_CLIENT) as usize, ev.events()),
                    t if t >= TOKEN_METRICS_CONN => {
                        self.conn_ready(Listener::Metrics, (t - TOKEN_METRICS_CONN) as usize, ev.events())
                    }
                    t if t >= TOKEN_CONN => self.conn_ready(Listener::Control, (t - TOKEN_CONN) as usize, ev.events()),
                    _ => {}
                }
            }
            self.timeouts(Instant::now());
            self.run_tap();
            self.run_capture();
            more = self.run_sessions();
            self.write_periods(false);
            self.record_charges(false);
        }
        self.stop_workers(threads);
        self.finish_tap();
        self.write_periods(true);
        self.record_charges(true);
        self.log_drops(Instant::now() + DROP_LOG_INTERVAL);
        self.log_summary();
        Ok(())
    }

    /// Starts the data path workers (`[io] workers` > 1).
    fn start_workers(&mut self) -> Vec<std::thread::JoinHandle<()>> {
        let (Some(shared), Some(node)) = (self.shared.clone(), self.node.shared()) else { return Vec::new() };
        let mut threads = Vec::new();
        for w in std::mem::take(&mut self.pending_workers) {
            let (node, shared, pacer) = (node.clone(), shared.clone(), self.pacer.clone());
            let name = format!("anode-worker-{}", w.id);
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || crate::workers::run_worker(w, node, shared, pacer))
            {
                Ok(t) => threads.push(t),
                Err(e) => warn!(error = %e, "could not start a data path worker"),
            }
        }
        info!(workers = threads.len(), "data path workers started");
        threads
    }

    /// Stops the workers and waits for them (the node released meanwhile,
    /// so that one waiting for it can finish its batch).
    fn stop_workers(&mut self, threads: Vec<std::thread::JoinHandle<()>>) {
        let Some(shared) = self.shared.clone() else { return };
        shared.stop.store(true, Ordering::Relaxed);
        let _ = shared.stop_fd.write(1);
        self.node.release();
        for t in threads {
            let _ = t.join();
        }
        self.node.acquire();
        self.kicked();
    }

    /// A worker's batch left work: deliveries to hand to the application
    /// clients, charges, a send error to log.
    fn kicked(&mut self) {
        let Some(shared) = self.shared.clone() else { return };
        let _ = shared.kick.read();
        // Left set until the charges are drained (`record_charges`), so that
        // the workers wake the loop for their charges once per ledger flush,
        // not once per batch: measured, 6,800 wake-ups a second, each taking
        // the node's lock from the workers.
        if shared.charged.load(Ordering::Relaxed) {
            self.charged = true;
        }
        if let Some(e) = shared.tx_error.lock().take() {
            self.droplog.tx_error = Some(e);
        }
        let batch: Vec<crate::workers::Delivered> = shared.deliveries.lock().drain(..).collect();
        let mut local = crate::app::Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        for d in &batch {
            local.deliver_one(&mut self.node, &mut self.msg, d.port, &d.bytes);
        }
    }

    /// The earliest deadline of anything scheduled.
    fn next_deadline(&self) -> Option<Instant> {
        let node = self.node.next_due_ns().map(|ns| self.started + Duration::from_nanos(ns));
        let conns = self.control_conns.iter().chain(&self.metrics_conns).flatten().map(|c| c.deadline).min();
        let stalled = self.clients.next_stall_deadline();
        let drops = self.droplog.next_due(&self.node.counters);
        let report = ratelog::pending().then_some(self.last_report + DROP_LOG_INTERVAL);
        let ledger = self.ledger.as_ref().filter(|_| self.charged).map(|(_, at)| *at + crate::ledger::FLUSH_INTERVAL);
        let paced = self.pacer.lock().next_due_ns(self.now_ns()).map(|ns| self.started + Duration::from_nanos(ns));
        [node, conns, stalled, drops, report, ledger, paced].into_iter().flatten().min()
    }

    /// Arms the timer for the next deadline (one system call, and only when
    /// the deadline changed).
    fn arm_timer(&mut self, now: Instant) {
        let next = self.next_deadline();
        if next == self.armed {
            return;
        }
        let r = match next {
            // Zero would disarm: at least a microsecond.
            Some(t) => {
                let d = t.saturating_duration_since(now).max(Duration::from_micros(1));
                self.timer.set(Expiration::OneShot(TimeSpec::from_duration(d)), TimerSetTimeFlags::empty())
            }
            None => self.timer.unset(),
        };
        if r.is_ok() {
            self.armed = next;
            if let Some(sh) = &self.shared {
                let ns = next.map_or(u64::MAX, |t| t.saturating_duration_since(self.started).as_nanos() as u64);
                sh.armed_ns.store(ns, Ordering::Relaxed);
            }
        }
    }

    /// The timer fired: note how late, and let [`timeouts`](Self::timeouts) run.
    fn timer_fired(&mut self) {
        // Clears its readiness; nothing else is in it.
        let _ = self.timer.wait();
        if let Some(t) = self.armed.take() {
            let late = t.elapsed().as_micros().min(u64::MAX as u128) as u64;
            self.timers.fired += 1;
            self.timers.late_us_sum += late;
            self.timers.late_us_max = self.timers.late_us_max.max(late);
            if late > 1000 {
                self.timers.late_over_1ms += 1;
            }
        }
    }

    /// Runs everything due at `now`: the core's timers, connection
    /// deadlines, stalled clients, log lines.
    fn timeouts(&mut self, now: Instant) {
        let now_ms = self.now_ms();
        if self.node.poll_at().is_some_and(|t| t <= now_ms) {
            self.timer_out.clear();
            self.node.handle_timeout(now_ms, &mut self.timer_out);
            self.send_timer_out();
        }
        self.expire_conns(now);
        self.reap_clients(now);
        self.log_drops(now);
        if self.paced.iter().any(|p| *p) {
            self.pace();
        }
    }

    /// Sends (and logs) what `timer_out` holds.
    fn send_timer_out(&mut self) {
        for e in &self.timer_out.events {
            info!("{e}");
        }
        if !self.timer_out.log.is_empty() {
            debug!(target: "anode::snap", "{}", self.timer_out.log.trim_end());
        }
        self.transmit(crate::udp::Outs::Timer);
        let outs = std::slice::from_ref(&self.timer_out);
        let mut local = crate::app::Local { clients: &mut self.clients, epoll: &self.epoll, stats: &mut self.stats };
        local.deliver(&mut self.node, &mut self.msg, outs, &[Vec::new()]);
    }

    pub(crate) fn signal_ready(&mut self) {
        let Some(sfd) = &self.signals else { return };
        while let Ok(Some(info)) = sfd.read_signal() {
            let name = Signal::try_from(info.ssi_signo as i32).map(|s| s.as_str()).unwrap_or("signal");
            info!(signal = name, "shutting down");
            self.stopping = true;
        }
    }

    pub(crate) fn log_drops(&mut self, now: Instant) {
        if now.duration_since(self.last_report) >= DROP_LOG_INTERVAL {
            self.last_report = now;
            ratelog::report();
        }
        for l in self.droplog.due(&self.node.counters, now) {
            if l.detail.is_empty() {
                warn!(target: ratelog::DROPS_TARGET, reason = l.reason, count = l.count, total = l.total,
                      "dropped packets");
            } else {
                warn!(target: ratelog::DROPS_TARGET, reason = l.reason, count = l.count, total = l.total,
                      detail = %l.detail, "dropped packets");
            }
        }
    }

    pub(crate) fn log_summary(&self) {
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

/// The period log's header: VP and session handles (INDEX.GENERATION),
/// the interval in ns since the daemon started, the CPU guaranteed and
/// received in it (ns), the part that was slack, and whether the VP was
/// idle for part of it.
pub const PERIOD_LOG_HEADER: &str = "vp,session,start_ns,end_ns,slice_ns,received_ns,slack_ns,idle";

/// `epoll_wait`, with EINTR as no events.
fn wait_events(epoll: &Epoll, events: &mut [EpollEvent], wait: EpollTimeout) -> Result<usize, DaemonError> {
    match epoll.wait(events, wait) {
        Ok(n) => Ok(n),
        Err(Errno::EINTR) => Ok(0),
        Err(e) => Err(DaemonError::Sys { what: "epoll_wait", source: e }),
    }
}

/// When a dispatch looks for waiting network input, at its preemption
/// points: a slack dispatch at the first one and then at most once per
/// [`SLACK_LOOK`], a guaranteed dispatch at most once per `[modules]
/// input_preempts_us` (never when it is 0).
#[derive(Debug, Clone, Copy)]
struct InputLook {
    every: Option<Duration>,
    next: Instant,
}

/// How often a slack dispatch looks for waiting input, at most. Each look
/// is a `poll` system call, and preemption points come about every 7 µs
/// of wasm: looking at every one cost the transcoder's paths 100 system
/// calls a frame (docs/transcoder.md). Input waits at most this much
/// longer for a slack dispatch to end.
const SLACK_LOOK: Duration = Duration::from_micros(20);

impl InputLook {
    fn new(slack: bool, every_us: u64, now: Instant) -> InputLook {
        if slack {
            return InputLook { every: Some(SLACK_LOOK), next: now };
        }
        let every = (every_us > 0).then(|| Duration::from_micros(every_us));
        InputLook { every, next: now + every.unwrap_or_default() }
    }

    /// Whether this dispatch looks at all.
    fn ever(&self) -> bool {
        self.every.is_some()
    }

    /// Whether to look at the preemption point reached at `now`.
    fn due(&mut self, now: Instant) -> bool {
        match self.every {
            Some(every) if now >= self.next => {
                self.next = now + every;
                true
            }
            _ => false,
        }
    }
}

/// Whether a datagram waits on any of `fds` (one `poll`, no wait).
fn input_waiting(fds: &mut [nix::poll::PollFd<'_>]) -> bool {
    nix::poll::poll(fds, nix::poll::PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

/// CPU time this thread has used, ns (what a dispatch is charged with).
pub(crate) fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0, |t| (t.tv_sec() as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec() as u64))
}

#[cfg(test)]
mod tests {
    use super::InputLook;
    use std::time::{Duration, Instant};

    #[test]
    fn a_guaranteed_dispatch_looks_for_input_only_when_configured_and_at_most_that_often() {
        let t0 = Instant::now();
        let us = |n: u64| t0 + Duration::from_micros(n);
        // Slack: at the first preemption point, then at most once per
        // SLACK_LOOK (20 µs), whatever the setting.
        for every in [0, 50] {
            let mut l = InputLook::new(true, every, t0);
            assert!(l.ever());
            let looked: Vec<u64> = (0..70).step_by(7).filter(|i| l.due(us(*i))).collect();
            assert_eq!(looked, vec![0, 21, 42, 63]);
        }
        // Guaranteed, off (the default): never; the slice runs out.
        let mut l = InputLook::new(false, 0, t0);
        assert!(!l.ever());
        assert!((0..1000).step_by(7).all(|i| !l.due(us(i))));
        // Guaranteed, every 50 µs: points 7 µs apart look once per 50 µs.
        let mut l = InputLook::new(false, 50, t0);
        assert!(l.ever());
        let looked: Vec<u64> = (0..200).step_by(7).filter(|i| l.due(us(*i))).collect();
        assert_eq!(looked, vec![56, 112, 168]);
    }
}
