//! Node daemon benchmarks (issue 4): real `anode node` processes on loopback.
//!
//! 1. **Throughput** through one middle node `b`: the harness owns a's and
//!    c's UDP sockets, floods b with SNAP `forw; demux` packets (the paper's
//!    "SNAP UDP") or plain packets destined to c, and counts what reaches c.
//!    Same run, alternating trials, 100- and 1,400-byte datagrams (UDP
//!    payload, ANEP header included). A raw UDP relay process (recvmmsg →
//!    sendmmsg, no anode) is the baseline for the daemon's own overhead.
//! 2. **Latency**: SNAP ping (Fig. 1) and a plain ping (the harness echoes
//!    plain packets through the far node's local API) over 0–3 hops on a
//!    line of four daemons; as root also the same line in network
//!    namespaces with kernel ICMP ping between the same hosts.
//! 3. **Profile**: `perf record` of b during a SNAP (and a plain) trial; the
//!    VM's share of b's CPU time.
//! 4. **Relays** (`relays`): the floor a process per hop sets on this
//!    machine. Chains of 0-6 bare relay processes on loopback (the same
//!    relay as the throughput baseline); a probe goes from the harness
//!    through a chain back to the harness, one probe in flight, the same gap
//!    between probes as the pings. The slope over the chain length is what
//!    one wake-up-and-forward costs; an anode hop is two of them (one more
//!    node each way).
//!
//! `cargo bench -p anode --bench forwarding`; `ANODE_BENCH_QUICK=1` for a
//! smoke run (`cargo test --benches` runs only a quick throughput and latency
//! smoke run). Other knobs:
//!
//! - `ANODE_BENCH_TRIAL_S` seconds per throughput trial (default 2);
//! - `ANODE_BENCH_REPS` trials per throughput case (default 6; multiples of
//!   6 balance the order of the paths);
//! - `ANODE_BENCH_PINGS` pings per latency case (default 1000);
//! - `ANODE_BENCH_PROFILE_S` seconds of each perf recording (default 6);
//! - `ANODE_BENCH_ONLY` comma list of `throughput`, `profile`, `latency`,
//!   `netns`, `relays` (default all);
//! - `ANODE_BENCH_PIN=1` pins b and the relay to CPU 1, the generator and
//!   sink to CPU 0 (default off);
//! - `ANODE_BENCH_BASELINE=/path/to/anode` also runs a second middle node
//!   from that (older) binary, its SNAP and plain trials interleaved with
//!   this build's in the same run, for a before/after comparison side by
//!   side (build the baseline from a git worktree of the older commit).
//! - `ANODE_BENCH_LOADED=N` instead runs, as the second middle node, this
//!   build with N CPU-bound modules (`modules/out/burn.wasm`, each for its
//!   own principal, loaded from the node's configuration, running all the
//!   time): forwarding through a busy node against the same node idle, in
//!   one run (issue 14). Reported as "loaded/idle" in the baseline table.
//! - `ANODE_BENCH_SESSIONS=10,20,30` with `ANODE_BENCH_LOADED`: the first
//!   loaded modules' principals hold sessions (`[[modules.session]]`) of
//!   these percentages of the CPU in 4 ms periods, without slack (Fig. 11's
//!   B, C, D); the others run best-effort.
//! - `ANODE_BENCH_TAP=1` instead runs, as the second middle node, this build
//!   with the FLAME tap on (`[monitor]`, one trivial module,
//!   `modules/out/mon-count.wasm`): forwarding with the tap on against off,
//!   in one run (issue 16). Reported as "tap on/off" in the baseline table.
//!
//! Results: docs/benchmarks.md, "Node daemon (issue 4)".
//!
//! Every daemon started is stopped when its guard drops, and on SIGINT,
//! SIGTERM or SIGHUP (a signalfd thread runs the cleanups and exits).

#[path = "relay/mod.rs"]
mod relay;

use anode_daemon::client::Client;
use anode_node::anep;
use anode_node::plain;
use anode_snap::asm;
use nix::errno::Errno;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg, setsockopt, sockopt,
};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");
const PING_S: &str = include_str!("../../../examples/snap/ping.s");
const UDP_S: &str = include_str!("../../../examples/snap/udp.s");
const LINE4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/topologies/line4.toml");

/// Datagram sizes measured: UDP payload bytes, ANEP header included.
const SIZES: [usize; 2] = [100, 1400];
/// Datagrams per sendmmsg/recvmmsg in the harness (as the daemon's BATCH).
const BATCH: usize = 32;
/// Socket buffers of the harness sockets (the kernel caps them at rmem_max).
const SOCK_BUF: usize = 4 << 20;
/// SNAP program overhead of Fig. 1 ping (SNAP §VII-A).
const PING_OVERHEAD: usize = 68;
/// SNAP UDP (`forw; demux`) overhead without data (SNAP §VII-A).
const UDP_OVERHEAD: usize = 44;
const SNAP_REPLY_PORT: u16 = 50_001;
const PLAIN_REPLY_PORT: u16 = 50_002;
const ECHO_PORT: u16 = 50_003;
const DATA_PORT: u16 = 7;

fn ad(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

// ------------------------------------------------------------------ settings

#[derive(Debug, Clone)]
struct Settings {
    quick: bool,
    trial: Duration,
    profile: Duration,
    warmup: Duration,
    reps: usize,
    pings: usize,
    gap: Duration,
    pin: bool,
    only: Option<Vec<String>>,
    baseline: Option<PathBuf>,
    loaded: usize,
    /// Percent of the CPU reserved (4 ms periods) by the first loaded
    /// modules' principals, one session each.
    sessions: Vec<u64>,
    tap: bool,
}

fn env_num(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl Settings {
    fn from_env() -> Settings {
        let quick = std::env::var("ANODE_BENCH_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Settings {
            quick,
            trial: Duration::from_secs_f64(env_num("ANODE_BENCH_TRIAL_S").unwrap_or(if quick { 0.5 } else { 2.0 })),
            profile: Duration::from_secs_f64(env_num("ANODE_BENCH_PROFILE_S").unwrap_or(if quick { 0.5 } else { 6.0 })),
            warmup: Duration::from_millis(if quick { 150 } else { 300 }),
            reps: env_num("ANODE_BENCH_REPS").map_or(if quick { 1 } else { 6 }, |r| r.max(1.0) as usize),
            pings: env_num("ANODE_BENCH_PINGS").map_or(if quick { 20 } else { 1000 }, |p| p.max(2.0) as usize),
            gap: Duration::from_millis(1),
            pin: env_num("ANODE_BENCH_PIN").is_some_and(|p| p != 0.0) && cpus >= 2,
            only: std::env::var("ANODE_BENCH_ONLY")
                .ok()
                .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()),
            baseline: std::env::var_os("ANODE_BENCH_BASELINE").map(PathBuf::from),
            loaded: env_num("ANODE_BENCH_LOADED").map_or(0, |n| n.max(0.0) as usize),
            sessions: std::env::var("ANODE_BENCH_SESSIONS")
                .ok()
                .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect())
                .unwrap_or_default(),
            tap: env_num("ANODE_BENCH_TAP").is_some_and(|t| t != 0.0),
        }
    }
    fn wants(&self, part: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|p| p == part))
    }
}

// ------------------------------------------------------------------ cleanup

/// Something to undo if the bench is interrupted.
#[derive(Debug, Clone)]
enum Cleanup {
    /// A daemon we started: SIGKILL it.
    Pid(i32),
    /// A testbed we started: `anode testbed down`.
    Testbed(PathBuf),
    /// Our work directory.
    Dir(PathBuf),
}

static CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());
static NEXT_CLEANUP: AtomicU64 = AtomicU64::new(0);

fn register(c: Cleanup) -> u64 {
    let id = NEXT_CLEANUP.fetch_add(1, Ordering::Relaxed);
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()).push((id, c));
    id
}

fn unregister(id: u64) {
    CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()).retain(|(i, _)| *i != id);
}

fn run_cleanup(c: &Cleanup) {
    match c {
        Cleanup::Pid(p) => {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
        Cleanup::Testbed(dir) => {
            let _ = Command::new(ANODE)
                .args(["testbed", "down", "--dir"])
                .arg(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        Cleanup::Dir(d) => {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Blocks SIGINT/SIGTERM/SIGHUP in this (the main) thread, so in every
/// thread started later, and reads them from a signalfd in a watcher thread
/// that runs the registered cleanups and exits. (Children get an empty
/// signal mask from std::process.)
fn watch_signals() {
    let mut mask = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        mask.add(s);
    }
    if mask.thread_block().is_err() {
        return;
    }
    let Ok(sfd) = SignalFd::new(&mask) else { return };
    thread::spawn(move || {
        if let Ok(Some(info)) = sfd.read_signal() {
            eprintln!("\nforwarding bench: signal {}, stopping everything it started", info.ssi_signo);
            let list: Vec<Cleanup> =
                CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()).drain(..).map(|(_, c)| c).collect();
            for c in list.iter().rev() {
                run_cleanup(c);
            }
            std::process::exit(128 + info.ssi_signo as i32);
        }
    });
}

/// The bench's work directory, removed on drop.
struct WorkDir {
    path: PathBuf,
    id: u64,
}

impl WorkDir {
    fn new() -> WorkDir {
        let path = std::env::temp_dir().join(format!("anode-bench-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("work dir");
        let id = register(Cleanup::Dir(path.clone()));
        WorkDir { path, id }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        unregister(self.id);
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ------------------------------------------------------------------ daemons

/// One `anode node` process, stopped (SIGTERM, then SIGKILL) on drop.
struct Daemon {
    name: String,
    child: Child,
    run_dir: PathBuf,
    log: PathBuf,
    id: u64,
}

impl Daemon {
    fn start(dir: &Path, name: &str, config: &str) -> Daemon {
        Daemon::start_bin(Path::new(ANODE), dir, name, config)
    }

    /// Starts node `name` from the binary `bin` (this build's, or a baseline).
    fn start_bin(bin: &Path, dir: &Path, name: &str, config: &str) -> Daemon {
        let nd = dir.join(name);
        std::fs::create_dir_all(&nd).expect("node dir");
        let file = nd.join("node.toml");
        std::fs::write(&file, config).expect("config");
        let log = nd.join("node.log");
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new(bin)
            .args(["node", "--log", "warn", "--config"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start anode node");
        let id = register(Cleanup::Pid(child.id() as i32));
        let mut d = Daemon { name: name.to_owned(), child, run_dir: nd.join("run"), log, id };
        d.wait_ready();
        d
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The control socket's protocol is the same in older builds.
            if anode_daemon::query(&self.run_dir, "status", Duration::from_secs(1)).is_ok() {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "node {} exited with {st}:\n{}",
                    self.name,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "node {} not ready after 10 s", self.name);
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `anode status --json` of this node.
    fn status(&self) -> Value {
        let out = Command::new(ANODE)
            .args(["status", "--json", "--run-dir"])
            .arg(&self.run_dir)
            .stdin(Stdio::null())
            .output()
            .expect("anode status");
        assert!(out.status.success(), "anode status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        unregister(self.id);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free UDP ports on 127.0.0.1, below the ephemeral range (bound together so
/// they differ, then let go).
fn free_ports(n: usize) -> Vec<u16> {
    let socks = anode_daemon::ports::reserve_loopback(n).expect("free loopback ports");
    socks.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

fn iface(name: &str, listen: u16, nb: Ipv4Addr, nb_port: u16) -> String {
    format!(
        "\n[[interface]]\nname = \"{name}\"\nlisten = \"127.0.0.1:{listen}\"\n\
         neighbors = [{{ address = \"{nb}\", endpoint = \"127.0.0.1:{nb_port}\" }}]\n"
    )
}

fn pin(pid: Pid, cpu: usize) {
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(pid, &set);
    }
}

fn pin_self(s: &Settings, cpu: usize) {
    if s.pin {
        pin(Pid::from_raw(0), cpu);
    }
}

// ------------------------------------------------------------------ packets

/// Assembles an example program with its `.stack` line replaced.
fn assemble(src: &str, stack: &str, dst: Ipv4Addr, rb: u16, port: u16) -> Vec<u8> {
    let mut text: String =
        src.lines().filter(|l| !l.trim_start().starts_with(".stack")).flat_map(|l| [l, "\n"]).collect();
    let _ = writeln!(text, ".stack {stack}");
    let mut r = asm::assemble(&text).expect("assemble");
    r.src = ad(1);
    r.dst = dst;
    r.resource_bound = rb;
    r.port = port;
    r.to_bytes().expect("encode")
}

fn blob(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "blob \"\"".into();
    }
    let mut s = String::from("blob 0x");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The throughput datagrams, `size` bytes with the ANEP header.
fn snap_udp_datagram(size: usize) -> Vec<u8> {
    let data = vec![0x5a; size - anep::HEADER_LEN - UDP_OVERHEAD];
    let pkt = assemble(UDP_S, &format!("{DATA_PORT}, {}", blob(&data)), ad(3), 16, DATA_PORT);
    let d = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, &pkt);
    assert_eq!(d.len(), size, "SNAP datagram size");
    d
}

fn plain_datagram(size: usize) -> Vec<u8> {
    let mut p = vec![0x5a; size - anep::HEADER_LEN];
    plain::Repr { dst: ad(3), src: ad(1), ttl: 64, port: DATA_PORT }
        .emit(&mut p[..plain::HEADER_LEN])
        .expect("header room");
    let d = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, &p);
    assert_eq!(d.len(), size, "plain datagram size");
    d
}

fn ping_payload(seq: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0; len.max(4)];
    p[..4].copy_from_slice(&seq.to_be_bytes());
    p
}

/// Fig. 1 SNAP ping from 10.0.0.1 to `dst` whose datagram is `size` bytes.
fn snap_ping(dst: Ipv4Addr, seq: u32, size: usize) -> Vec<u8> {
    let payload = ping_payload(seq, size - anep::HEADER_LEN - PING_OVERHEAD);
    let pkt = assemble(PING_S, &format!("0, {SNAP_REPLY_PORT}, {}", blob(&payload)), dst, 16, SNAP_REPLY_PORT);
    assert_eq!(pkt.len() + anep::HEADER_LEN, size, "ping size");
    pkt
}

fn plain_ping_len(size: usize) -> usize {
    size - anep::HEADER_LEN - plain::HEADER_LEN
}

// ------------------------------------------------------------------ /proc

fn clk_tck() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100.0, |t| t as f64)
}

/// User + system CPU seconds of a process or thread (`/proc/.../stat`).
fn cpu_secs(stat_path: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(stat_path) else { return 0.0 };
    let Some((_, rest)) = s.rsplit_once(')') else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat: utime, stime; `rest` starts at field 3.
    (num(11) + num(12)) / clk_tck()
}

/// Kernel drop counters of the UDP sockets on 127.0.0.1, by local port.
fn udp_drops() -> HashMap<u16, u64> {
    let mut m = HashMap::new();
    let Ok(s) = std::fs::read_to_string("/proc/net/udp") else { return m };
    for l in s.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(local), Some(drops)) = (f.get(1), f.last()) else { continue };
        let Some((ip, port)) = local.split_once(':') else { continue };
        if ip != "0100007F" {
            continue;
        }
        if let (Ok(p), Ok(d)) = (u16::from_str_radix(port, 16), drops.parse::<u64>()) {
            m.insert(p, d);
        }
    }
    m
}

// ------------------------------------------------------------------ throughput

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Snap,
    Plain,
    Raw,
    /// SNAP through the baseline binary's node.
    BaseSnap,
    /// Plain through the baseline binary's node.
    BasePlain,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Snap => "SNAP forw",
            Kind::Plain => "plain",
            Kind::Raw => "raw relay",
            Kind::BaseSnap => "SNAP forw (baseline)",
            Kind::BasePlain => "plain (baseline)",
        }
    }

    fn is_base(self) -> bool {
        matches!(self, Kind::BaseSnap | Kind::BasePlain)
    }
}

fn udp_socket() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").expect("udp");
    let _ = setsockopt(&s, sockopt::RcvBuf, &SOCK_BUF);
    let _ = setsockopt(&s, sockopt::SndBuf, &SOCK_BUF);
    s
}

fn port_of(s: &UdpSocket) -> u16 {
    s.local_addr().expect("addr").port()
}

/// Receives batches until `stop`, adding the count to `count`.
fn receive_loop(sock: &UdpSocket, stop: &AtomicBool, count: &AtomicU64) {
    sock.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0; 2048]).collect();
    let mut rh = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    while !stop.load(Ordering::Relaxed) {
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
        let n = match recvmmsg(sock.as_raw_fd(), &mut rh, iovs.iter_mut(), MsgFlags::MSG_WAITFORONE, None) {
            Ok(r) => r.count(),
            Err(Errno::EAGAIN | Errno::EINTR) => 0,
            Err(e) => panic!("recvmmsg: {e}"),
        };
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Sends `dgram` to `to` in batches as fast as it can until `stop`.
fn generate(sock: &UdpSocket, to: SocketAddr, dgram: &[u8], stop: &AtomicBool, sent: &AtomicU64) {
    let addrs = [Some(SockaddrStorage::from(to)); BATCH];
    let iovs = [[IoSlice::new(dgram)]; BATCH];
    let mut hdrs = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    while !stop.load(Ordering::Relaxed) {
        let none: [ControlMessage<'_>; 0] = [];
        match sendmmsg(sock.as_raw_fd(), &mut hdrs, iovs.iter(), addrs, none, MsgFlags::empty()).map(Iterator::count) {
            Ok(k) => {
                sent.fetch_add(k as u64, Ordering::Relaxed);
            }
            Err(Errno::EINTR | Errno::EAGAIN | Errno::ENOBUFS) => thread::yield_now(),
            Err(e) => panic!("sendmmsg: {e}"),
        }
    }
}

/// One trial's figures.
#[derive(Debug, Clone)]
struct Trial {
    kind: Kind,
    size: usize,
    /// Packets per second at the sink during the measurement window.
    rate: f64,
    /// CPU seconds of the forwarder (b or the relay thread) per second of the window.
    cpu: f64,
    /// Forwarder CPU µs per packet that reached the sink.
    us_per_pkt: f64,
    /// Whole trial (warm-up, window, drain): offered, dropped at the
    /// forwarder's input socket, forwarder rx, its drops by reason, its tx,
    /// dropped at the sink's socket, received at the sink.
    offered: u64,
    in_sock_drops: u64,
    node_rx: u64,
    node_drops: BTreeMap<String, u64>,
    node_tx: u64,
    node_tx_bytes: u64,
    sink_sock_drops: u64,
    sink_rx: u64,
}

/// The raw relay baseline ([`relay::Relay`]), registered for the cleanup
/// on a signal.
struct Relay {
    inner: relay::Relay,
    id: u64,
}

impl Relay {
    fn start(to: SocketAddr) -> Relay {
        let inner = relay::Relay::start(to);
        let id = register(Cleanup::Pid(inner.child.id() as i32));
        Relay { inner, id }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        unregister(self.id);
    }
}

/// A `[modules]` section loading `n` CPU-bound modules (modules/burn), each
/// for its own principal, with credentials from a throwaway admin key.
///
/// The principal of module i gets a session (`[[modules.session]]`) with
/// one VP of `sessions[i]` % of the CPU in 4 ms periods, without slack,
/// while there are shares left; the others run best-effort.
fn loaded_modules(dir: &Path, n: usize, sessions: &[u64]) -> String {
    use anode_cred::{
        GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId, SessionCeilings,
        SessionSpec,
    };
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/burn.wasm");
    let code = std::fs::read(&wasm).expect("modules/out/burn.wasm (run scripts/setup)");
    let issuer = Issuer::from_secret(&[7; 32]).expect("issuer");
    let admin = anode_sec::Identity::from_seed(&[7; 32]).public().to_string();
    let mut s = format!("[modules]\nadmin_key = \"{admin}\"\n");
    for i in 0..n {
        let spec = GrantSpec {
            modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
            interfaces: InterfaceSet::of(&[Interface::Time]),
            limits: Limits { memory: 4 << 20, cpu: 5_000_000, state: 4096 },
            expires: None,
        };
        let principal = anode_sec::Identity::from_seed(&[i as u8 + 1; 32]).public();
        let pid = PrincipalId(*principal.as_bytes());
        if let Some(pct) = sessions.get(i) {
            let ppm = pct * 10_000;
            let ceilings = SessionCeilings {
                max_vp_share_ppm: ppm,
                max_total_share_ppm: ppm,
                max_vps: 1,
                max_pools: 4,
                max_queued_events: 1024,
                ..SessionCeilings::NONE
            };
            let c = issuer.issue_session(pid, &SessionSpec { ceilings, expires: None }).expect("session credential");
            let file = dir.join(format!("session{i}.cred"));
            std::fs::write(&file, c.to_bytes()).expect("credential file");
            s.push_str(&format!(
                "[[modules.session]]\nprincipal = \"{principal}\"\ncredential = \"{}\"\nvp = [\"{}us/4ms\"]\n",
                file.display(),
                pct * 40
            ));
        }
        let cred = issuer.issue(pid, &spec).expect("credential");
        let file = dir.join(format!("burn{i}.cred"));
        std::fs::write(&file, cred.to_bytes()).expect("credential file");
        s.push_str(&format!("[[modules.load]]\nfile = \"{}\"\ncredential = \"{}\"\n", wasm.display(), file.display()));
    }
    s
}

/// A `[monitor]` section turning the tap on with one trivial module
/// (modules/mon-count: counts packets and bytes), its credential from a
/// throwaway admin key (the timestamp and frame length; records only).
fn tap_section(dir: &Path) -> String {
    use anode_monitor::apps::abi::Field;
    let wasm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/mon-count.wasm");
    assert!(wasm.exists(), "modules/out/mon-count.wasm (run scripts/setup)");
    let issuer = anode_cred::Issuer::from_secret(&[7; 32]).expect("issuer");
    let admin = anode_sec::Identity::from_seed(&[7; 32]).public().to_string();
    let spec = anode_monitor::MonitorSpec {
        read: vec![Field::Ts, Field::WireLen],
        export: anode_monitor::ExportRights { records: true, packets: false },
        ..anode_monitor::MonitorSpec::default()
    };
    let cred = anode_monitor::policy::issue(&issuer, anode_cred::PrincipalId([9; 32]), &spec).expect("credential");
    let file = dir.join("count.cred");
    std::fs::write(&file, cred.to_bytes()).expect("credential file");
    format!(
        "[monitor]\nenabled = true\nadmin_key = \"{admin}\"\nload = [{{ file = \"{}\", credential = \"{}\" }}]\n",
        wasm.display(),
        file.display()
    )
}

/// The throughput rig: daemon b between the harness's a and c sockets, and
/// the raw relay.
struct Rig {
    generator: UdpSocket,
    b: Daemon,
    b_in: SocketAddr,
    /// The baseline binary's middle node, and its input address.
    base: Option<(Daemon, SocketAddr)>,
    relay: Relay,
    sink_port: u16,
    sink_count: std::sync::Arc<AtomicU64>,
    stop: std::sync::Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Rig {
    fn start(dir: &Path, s: &Settings) -> Rig {
        use std::sync::Arc;
        let generator = udp_socket();
        let sink = udp_socket();
        let ports = free_ports(2);
        let cfg = format!(
            "address = \"10.0.0.2\"\nmtu = 1400\nrun_dir = \"{}\"\n{}{}",
            dir.join("b").join("run").display(),
            iface("to-a", ports[0], ad(1), port_of(&generator)),
            iface("to-c", ports[1], ad(3), port_of(&sink)),
        );
        let b = Daemon::start(dir, "b", &cfg);
        if s.pin {
            pin(Pid::from_raw(b.pid()), 1);
        }
        let second = match (&s.baseline, s.loaded) {
            (Some(bin), _) => Some((bin.clone(), String::new())),
            (None, _) if s.tap => Some((PathBuf::from(ANODE), tap_section(dir))),
            (None, 0) => None,
            (None, n) => Some((PathBuf::from(ANODE), loaded_modules(dir, n, &s.sessions))),
        };
        let base = second.map(|(bin, modules)| {
            let ports = free_ports(2);
            let cfg = format!(
                "address = \"10.0.0.2\"\nmtu = 1400\nrun_dir = \"{}\"\n{}{}{modules}",
                dir.join("b0").join("run").display(),
                iface("to-a", ports[0], ad(1), port_of(&generator)),
                iface("to-c", ports[1], ad(3), port_of(&sink)),
            );
            let d = Daemon::start_bin(&bin, dir, "b0", &cfg);
            if s.pin {
                pin(Pid::from_raw(d.pid()), 1);
            }
            (d, SocketAddr::from((Ipv4Addr::LOCALHOST, ports[0])))
        });
        let stop = Arc::new(AtomicBool::new(false));
        let sink_count = Arc::new(AtomicU64::new(0));
        let sink_addr = sink.local_addr().expect("addr");
        let relay = Relay::start(sink_addr);
        let mut threads = Vec::new();
        {
            let (stop, count, s) = (stop.clone(), sink_count.clone(), s.clone());
            threads.push(thread::spawn(move || {
                pin_self(&s, 0);
                receive_loop(&sink, &stop, &count);
            }));
        }
        let b_in = SocketAddr::from((Ipv4Addr::LOCALHOST, ports[0]));
        Rig { generator, b, b_in, base, relay, sink_port: sink_addr.port(), sink_count, stop, threads }
    }

    /// The node a kind of trial goes through (None: the raw relay).
    fn node(&self, kind: Kind) -> Option<&Daemon> {
        match kind {
            Kind::Raw => None,
            k if k.is_base() => self.base.as_ref().map(|(d, _)| d),
            _ => Some(&self.b),
        }
    }

    fn forwarder_cpu(&self, kind: Kind) -> f64 {
        match self.node(kind) {
            None => cpu_secs(&format!("/proc/{}/stat", self.relay.inner.child.id())),
            Some(d) => cpu_secs(&format!("/proc/{}/stat", d.pid())),
        }
    }

    /// One trial: flood for warm-up + window, measure the window, drain.
    /// `during`, if given, runs instead of sleeping through the window.
    fn trial(
        &self,
        kind: Kind,
        size: usize,
        s: &Settings,
        window: Duration,
        during: Option<&dyn Fn(Duration)>,
    ) -> Trial {
        let dgram = match kind {
            Kind::Snap | Kind::BaseSnap => snap_udp_datagram(size),
            Kind::Plain | Kind::Raw | Kind::BasePlain => plain_datagram(size),
        };
        let target = match kind {
            Kind::Raw => self.relay.inner.addr,
            k if k.is_base() => self.base.as_ref().map_or(self.b_in, |(_, a)| *a),
            _ => self.b_in,
        };
        let in_port = target.port();
        let st0 = self.node(kind).map(Daemon::status);
        let udp0 = udp_drops();
        let sink0 = self.sink_count.load(Ordering::Relaxed);
        let stop = AtomicBool::new(false);
        let sent = AtomicU64::new(0);
        let (mut c0, mut c1, mut cpu0, mut cpu1, mut secs) = (0, 0, 0.0, 0.0, 0.0);
        thread::scope(|sc| {
            sc.spawn(|| {
                pin_self(s, 0);
                generate(&self.generator, target, &dgram, &stop, &sent);
            });
            thread::sleep(s.warmup);
            c0 = self.sink_count.load(Ordering::Relaxed);
            cpu0 = self.forwarder_cpu(kind);
            let t0 = Instant::now();
            match during {
                Some(f) => f(window),
                None => thread::sleep(window),
            }
            c1 = self.sink_count.load(Ordering::Relaxed);
            cpu1 = self.forwarder_cpu(kind);
            secs = t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
        });
        thread::sleep(Duration::from_millis(200));
        let udp1 = udp_drops();
        let st1 = self.node(kind).map(Daemon::status);
        let d = |m0: &HashMap<u16, u64>, m1: &HashMap<u16, u64>, p: u16| {
            m1.get(&p).copied().unwrap_or(0).saturating_sub(m0.get(&p).copied().unwrap_or(0))
        };
        let window = c1 - c0;
        let offered = sent.load(Ordering::Relaxed);
        let in_sock_drops = d(&udp0, &udp1, in_port);
        let sink_sock_drops = d(&udp0, &udp1, self.sink_port);
        let sink_rx = self.sink_count.load(Ordering::Relaxed) - sink0;
        let (node_rx, node_tx, node_tx_bytes, node_drops) = match (&st0, &st1) {
            (Some(a), Some(b)) => {
                let iface = |v: &Value, i: usize, k: &str| v["interfaces"][i][k].as_u64().unwrap_or(0);
                let mut drops = BTreeMap::new();
                if let (Some(x), Some(y)) = (a["drops"].as_object(), b["drops"].as_object()) {
                    for (k, v) in y {
                        let n = v.as_u64().unwrap_or(0) - x.get(k).and_then(Value::as_u64).unwrap_or(0);
                        if n > 0 {
                            drops.insert(k.clone(), n);
                        }
                    }
                }
                (
                    iface(b, 0, "rx_packets") - iface(a, 0, "rx_packets"),
                    iface(b, 1, "tx_packets") - iface(a, 1, "tx_packets"),
                    iface(b, 1, "tx_bytes") - iface(a, 1, "tx_bytes"),
                    drops,
                )
            }
            // The relay keeps no counters: what entered its socket, and what
            // reached (or was dropped at) the sink's.
            _ => (offered - in_sock_drops, sink_rx + sink_sock_drops, 0, BTreeMap::new()),
        };
        Trial {
            kind,
            size,
            rate: window as f64 / secs,
            cpu: (cpu1 - cpu0) / secs,
            us_per_pkt: if window > 0 { (cpu1 - cpu0) * 1e6 / window as f64 } else { f64::NAN },
            offered,
            in_sock_drops,
            node_rx,
            node_drops,
            node_tx,
            node_tx_bytes,
            sink_sock_drops,
            sink_rx,
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// Quantile by linear interpolation between order statistics.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let pos = q * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
}

fn throughput(dir: &Path, s: &Settings, report: &mut String) -> Option<Rig> {
    let rig = Rig::start(dir, s);
    let mut kinds = vec![Kind::Snap, Kind::Plain, Kind::Raw];
    if rig.base.is_some() {
        kinds.extend([Kind::BaseSnap, Kind::BasePlain]);
    }
    let n = kinds.len();
    let mut trials: Vec<Trial> = Vec::new();
    eprintln!(
        "throughput: {} reps x {} sizes x {n} paths, {:.1} s windows (pinned: {})",
        s.reps,
        SIZES.len(),
        s.trial.as_secs_f64(),
        s.pin
    );
    // Repetition r runs the paths rotated by r, and every other round of n
    // rotations in reverse (both sizes alike, the sizes themselves
    // alternating), so over 2n repetitions each path takes every position
    // equally often and follows and precedes each other path: drift within
    // a repetition and carry-over from the previous trial hit all paths
    // alike. (For three paths these are all six orders.)
    for rep in 0..s.reps {
        let mut order: Vec<usize> = (0..n).map(|i| (i + rep) % n).collect();
        if (rep / n) % 2 == 1 {
            order.reverse();
        }
        let sizes = if rep % 2 == 0 { SIZES } else { [SIZES[1], SIZES[0]] };
        for size in sizes {
            for &k in &order {
                let kind = kinds[k];
                let t = rig.trial(kind, size, s, s.trial, None);
                eprintln!(
                    "  rep {rep} {size:>4} B {:<10} {:>8.0} pkt/s  cpu {:>4.0}%  {:.2} us/pkt",
                    kind.name(),
                    t.rate,
                    t.cpu * 100.0,
                    t.us_per_pkt
                );
                trials.push(t);
            }
        }
    }
    let _ = writeln!(
        report,
        "\n## Throughput through one node ({} trials of {:.1} s per case, alternating; pinned: {})\n",
        s.reps,
        s.trial.as_secs_f64(),
        s.pin
    );
    let _ = writeln!(
        report,
        "| size | path | median pkt/s at sink | min–max | fwd CPU % | fwd CPU µs/pkt (min–max) | vs plain: ratio of medians \
         (95 % bootstrap) | vs plain: paired, median | vs plain per CPU-second |"
    );
    let _ = writeln!(report, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for size in SIZES {
        let of = |k: Kind| -> Vec<&Trial> { trials.iter().filter(|t| t.size == size && t.kind == k).collect() };
        let plain = of(Kind::Plain);
        let plain_med = median(&plain.iter().map(|t| t.rate).collect::<Vec<_>>());
        let plain_us = median(&plain.iter().map(|t| t.us_per_pkt).collect::<Vec<_>>());
        for &kind in &kinds {
            let ts = of(kind);
            let rates: Vec<f64> = ts.iter().map(|t| t.rate).collect();
            let med = median(&rates);
            let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let max = rates.iter().copied().fold(0.0, f64::max);
            let paired: Vec<f64> = ts.iter().zip(&plain).map(|(a, p)| a.rate / p.rate).collect();
            // Bootstrap interval of the ratio of medians (trials resampled).
            let prates: Vec<f64> = plain.iter().map(|t| t.rate).collect();
            let mut boot: Vec<f64> =
                (0..BOOTSTRAP).map(|_| median(&rng.resample(&rates)) / median(&rng.resample(&prates))).collect();
            boot.sort_by(f64::total_cmp);
            let uss: Vec<f64> = ts.iter().map(|t| t.us_per_pkt).collect();
            let us = median(&uss);
            let vs = if kind == Kind::Plain {
                "1 (reference) | 1 | 1".to_string()
            } else {
                format!(
                    "{:.3} ({:.2}–{:.2}) | {:.3} | {:.3}",
                    med / plain_med,
                    quantile(&boot, 0.025),
                    quantile(&boot, 0.975),
                    median(&paired),
                    plain_us / us
                )
            };
            let _ = writeln!(
                report,
                "| {size} | {} | {:.0} | {:.0}–{:.0} | {:.0} | {:.2} ({:.2}–{:.2}) | {vs} |",
                kind.name(),
                med,
                min,
                max,
                median(&ts.iter().map(|t| t.cpu * 100.0).collect::<Vec<_>>()),
                us,
                quantile(&uss, 0.0),
                quantile(&uss, 1.0),
            );
        }
    }
    // The second middle node against b, one table: the same build with the
    // tap on or loaded (read b0/b), or a baseline binary (read b/b0).
    let second = match (&rig.base, s.baseline.is_some(), s.tap) {
        (None, ..) => None,
        (Some(_), false, true) => Some((
            "This build with the tap off (b) against the same build with the FLAME tap on, one trivial module \
             (b0, `ANODE_BENCH_TAP`), same run, interleaved trials; the columns read tap on/off:"
                .to_string(),
            "on/off",
            true,
        )),
        (Some(_), false, false) => Some((
            format!(
                "This build idle (b) against the same build running {} CPU-bound modules (b0, `ANODE_BENCH_LOADED`; \
                 sessions reserving {:?} % of the CPU, `ANODE_BENCH_SESSIONS`), same run, interleaved trials; the \
                 columns read loaded/idle:",
                s.loaded, s.sessions
            ),
            "loaded/idle",
            true,
        )),
        (Some(_), true, _) => Some((
            "This build against the baseline binary (`ANODE_BENCH_BASELINE`), same run, interleaved trials:"
                .to_string(),
            "this/baseline",
            false,
        )),
    };
    if let Some((intro, cols, second_over_first)) = second {
        let _ = writeln!(report, "\n{intro}\n");
        let _ = writeln!(report, "| size | path | {cols} pkt/s, ratio of medians | {cols} fwd CPU µs/pkt |");
        let _ = writeln!(report, "|---:|---|---:|---:|");
        for size in SIZES {
            for (now, base) in [(Kind::Snap, Kind::BaseSnap), (Kind::Plain, Kind::BasePlain)] {
                let med = |k: Kind, f: &dyn Fn(&Trial) -> f64| {
                    median(&trials.iter().filter(|t| t.size == size && t.kind == k).map(f).collect::<Vec<_>>())
                };
                let (top, bottom) = if second_over_first { (base, now) } else { (now, base) };
                let _ = writeln!(
                    report,
                    "| {size} | {} | {:.3} | {:.3} |",
                    now.name(),
                    med(top, &|t| t.rate) / med(bottom, &|t| t.rate),
                    med(top, &|t| t.us_per_pkt) / med(bottom, &|t| t.us_per_pkt),
                );
            }
        }
    }
    if let (true, Some((d, _))) = (s.tap, rig.base.as_ref()) {
        let m = d.status()["monitor"].clone();
        let _ = writeln!(
            report,
            "\nThe tap of b0 at the end: {} (module: {})",
            m["tap"],
            m["modules"].get(0).map_or(Value::Null, |x| x["counters"].clone())
        );
    }
    let _ = writeln!(report, "\nWhere packets went (sums over all trials of a case, warm-up and drain included):\n");
    let _ = writeln!(
        report,
        "| size | path | offered | dropped at fwd input socket | fwd rx | fwd drops | fwd tx | bytes per tx | dropped at \
         sink socket | sink rx |"
    );
    let _ = writeln!(report, "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|");
    for size in SIZES {
        for &kind in &kinds {
            let ts: Vec<&Trial> = trials.iter().filter(|t| t.size == size && t.kind == kind).collect();
            let sum = |f: &dyn Fn(&Trial) -> u64| ts.iter().map(|t| f(t)).sum::<u64>();
            let mut drops: BTreeMap<String, u64> = BTreeMap::new();
            for t in &ts {
                for (k, v) in &t.node_drops {
                    *drops.entry(k.clone()).or_default() += v;
                }
            }
            let drops = if drops.is_empty() {
                "none".to_string()
            } else {
                drops.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
            };
            let tx_bytes = sum(&|t| t.node_tx_bytes);
            let per = if tx_bytes == 0 {
                "—".to_string()
            } else {
                format!("{:.0}", tx_bytes as f64 / sum(&|t| t.node_tx) as f64)
            };
            let _ = writeln!(
                report,
                "| {size} | {} | {} | {} | {} | {drops} | {} | {per} | {} | {} |",
                kind.name(),
                sum(&|t| t.offered),
                sum(&|t| t.in_sock_drops),
                sum(&|t| t.node_rx),
                sum(&|t| t.node_tx),
                sum(&|t| t.sink_sock_drops),
                sum(&|t| t.sink_rx),
            );
        }
    }
    Some(rig)
}

// ------------------------------------------------------------------ profile

fn perf_works(dir: &Path) -> bool {
    let f = dir.join("perf-probe.data");
    let ok = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&f)
        .arg("true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    let _ = std::fs::remove_file(&f);
    ok
}

/// `perf report` lines as (percent, dso, symbol).
fn perf_report(data: &Path, children: bool) -> Vec<(f64, String, String)> {
    let out = Command::new("perf")
        .args(["report", "--stdio", "-g", "none", "--percent-limit", "0.01", "--sort", "dso,sym", "-i"])
        .arg(data)
        .arg(if children { "--children" } else { "--no-children" })
        .stderr(Stdio::null())
        .output();
    let Ok(out) = out else { return Vec::new() };
    let mut v = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let l = l.trim();
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        // "12.34%  anode  [.] sym" or with --children "12.34%  1.00%  dso  [.] sym".
        let mut parts = l.split_whitespace();
        let Some(first) = parts.next().and_then(|p| p.strip_suffix('%')).and_then(|p| p.parse::<f64>().ok()) else {
            continue;
        };
        let rest: Vec<&str> = parts.collect();
        let skip = usize::from(children);
        let Some(dso) = rest.get(skip) else { continue };
        let sym = rest.get(skip + 2..).map(|s| s.join(" ")).unwrap_or_default();
        v.push((first, (*dso).to_owned(), sym));
    }
    v
}

/// Number of samples in a perf data file (`perf report` header line
/// "# Samples: 12K of event 'cpu-clock'" is rounded, so count them).
fn perf_samples(data: &Path) -> u64 {
    let out = Command::new("perf").args(["script", "-F", "ip", "-G", "-i"]).arg(data).stderr(Stdio::null()).output();
    out.map_or(0, |o| o.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count() as u64)
}

/// Category of a leaf sample.
fn category(dso: &str, sym: &str) -> &'static str {
    if dso.contains("kernel") || sym.starts_with("[k]") {
        "kernel"
    } else if sym.contains("anode_snap::") {
        "VM (anode_snap)"
    } else if sym.contains("anode_node::core") || sym.contains("anode_node::anep") || sym.contains("anode_node::plain")
    {
        "node core (ANEP, routes, counters)"
    } else if sym.contains("anode_daemon") {
        "daemon loop (batches, sendmmsg setup)"
    } else if sym.contains("nix::") {
        "nix wrappers"
    } else if dso.starts_with("libc") {
        "libc (syscall stubs, memcpy)"
    } else {
        "other user (std, alloc, ...)"
    }
}

struct Profile {
    kind: Kind,
    size: usize,
    samples_pct: BTreeMap<&'static str, f64>,
    kernel_split: Vec<(&'static str, f64)>,
    top: Vec<(f64, String)>,
    us_per_pkt: f64,
    rate: f64,
    samples: u64,
}

fn profile(rig: &Rig, dir: &Path, s: &Settings, kind: Kind, size: usize) -> Option<Profile> {
    let data = dir.join(format!("perf-{kind:?}.data"));
    let pid = rig.b.pid().to_string();
    let record = |d: Duration| {
        let _ = Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "4999", "-g", "-p", &pid, "-o"])
            .arg(&data)
            .args(["--", "sleep", &format!("{:.3}", d.as_secs_f64())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    };
    let t = rig.trial(kind, size, s, s.profile, Some(&record));
    let leaves = perf_report(&data, false);
    if leaves.is_empty() {
        return None;
    }
    let mut pct: BTreeMap<&'static str, f64> = BTreeMap::new();
    for (p, dso, sym) in &leaves {
        *pct.entry(category(dso, sym)).or_default() += p;
    }
    let incl = perf_report(&data, true);
    let find = |pat: &[&str]| -> f64 {
        incl.iter()
            .filter(|(_, dso, sym)| dso.contains("kernel") && pat.iter().any(|p| sym.ends_with(p)))
            .map(|(p, _, _)| *p)
            .fold(0.0, f64::max)
    };
    let kernel_split = vec![
        (
            "kernel: sendmmsg (incl. loopback delivery to the next socket)",
            find(&["__x64_sys_sendmmsg", "__sys_sendmmsg"]),
        ),
        ("kernel: recvmmsg", find(&["__x64_sys_recvmmsg", "__sys_recvmmsg", "do_recvmmsg"])),
        ("kernel: epoll_wait", find(&["__x64_sys_epoll_wait", "do_epoll_wait"])),
    ];
    let top = leaves.iter().take(200).map(|(p, dso, sym)| (*p, format!("{dso} {sym}"))).collect();
    let samples = perf_samples(&data);
    let _ = std::fs::remove_file(&data);
    Some(Profile { kind, size, samples_pct: pct, kernel_split, top, us_per_pkt: t.us_per_pkt, rate: t.rate, samples })
}

fn profiles(rig: &Rig, dir: &Path, s: &Settings, report: &mut String) {
    if !perf_works(dir) {
        let _ = writeln!(report, "\n## Profile of b\n\nskipped: `perf record -e cpu-clock` does not work here\n");
        return;
    }
    let mut ps = Vec::new();
    for size in SIZES {
        for kind in [Kind::Snap, Kind::Plain] {
            eprintln!("profile: perf record of b during a {size}-byte {} trial", kind.name());
            if let Some(p) = profile(rig, dir, s, kind, size) {
                ps.push(p);
            }
        }
    }
    let _ = writeln!(
        report,
        "\n## Profile of b (perf record -e cpu-clock -F 4999 -g -p <b>, {:.1} s per case)\n",
        s.profile.as_secs_f64()
    );
    let _ = write!(report, "| share of b's samples |");
    for p in &ps {
        let _ = write!(report, " {} {} |", p.kind.name(), p.size);
    }
    let _ = writeln!(report, "\n|---|{}", "---:|".repeat(ps.len()));
    let mut cats: Vec<&'static str> = ps.iter().flat_map(|p| p.samples_pct.keys().copied()).collect();
    cats.sort();
    cats.dedup();
    for c in &cats {
        let _ = write!(report, "| {c} (self) |");
        for p in &ps {
            let _ = write!(report, " {:.2} % |", p.samples_pct.get(c).copied().unwrap_or(0.0));
        }
        let _ = writeln!(report);
    }
    for i in 0..3 {
        let Some(name) = ps.first().map(|p| p.kernel_split[i].0) else { break };
        let _ = write!(report, "| {name} (incl.) |");
        for p in &ps {
            let _ = write!(report, " {:.1} % |", p.kernel_split[i].1);
        }
        let _ = writeln!(report);
    }
    let _ = write!(report, "| samples |");
    for p in &ps {
        let _ = write!(report, " {} |", p.samples);
    }
    let _ = write!(report, "\n| b CPU µs per forwarded packet (this trial) |");
    for p in &ps {
        let _ = write!(report, " {:.2} |", p.us_per_pkt);
    }
    let _ = write!(report, "\n| pkt/s at sink (this trial, perf attached) |");
    for p in &ps {
        let _ = write!(report, " {:.0} |", p.rate);
    }
    let _ = writeln!(report, "\n\nThe same in ns per forwarded packet (share × b CPU per packet):\n");
    let _ = write!(report, "| ns per packet |");
    for p in &ps {
        let _ = write!(report, " {} {} |", p.kind.name(), p.size);
    }
    let _ = writeln!(report, "\n|---|{}", "---:|".repeat(ps.len()));
    for c in &cats {
        let _ = write!(report, "| {c} |");
        for p in &ps {
            let _ = write!(report, " {:.0} |", p.samples_pct.get(c).copied().unwrap_or(0.0) * p.us_per_pkt * 10.0);
        }
        let _ = writeln!(report);
    }
    for p in ps.iter().filter(|p| p.kind == Kind::Snap) {
        let vm = p.samples_pct.get("VM (anode_snap)").copied().unwrap_or(0.0);
        let user = 100.0 - p.samples_pct.get("kernel").copied().unwrap_or(0.0);
        let _ = writeln!(
            report,
            "\nVM share while forwarding {}-byte SNAP: {vm:.2} % of b's CPU time (of {} samples) = {:.0} ns per \
             packet; user space is {user:.1} % of b's time, the VM {:.0} % of that.",
            p.size,
            p.samples,
            vm / 100.0 * p.us_per_pkt * 1e3,
            100.0 * vm / user
        );
    }
    for p in ps.iter().filter(|p| p.kind == Kind::Snap) {
        let _ = writeln!(report, "\nTop user-space leaf symbols, {} {}:\n", p.kind.name(), p.size);
        for (pc, sym) in p.top.iter().filter(|(_, sym)| !sym.contains("kernel")).take(10) {
            let _ = writeln!(report, "    {pc:6.2} %  {sym}");
        }
    }
}

// ------------------------------------------------------------------ latency

/// A line of four nodes a — b — c — d on loopback, each link its own ports.
fn start_line(dir: &Path) -> Vec<Daemon> {
    let p = free_ports(6);
    let names = ["a", "b", "c", "d"];
    let mut nodes = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut cfg = format!(
            "address = \"{}\"\nmtu = 1400\nrun_dir = \"{}\"\n",
            ad(i as u8 + 1),
            dir.join(format!("line-{name}")).join("run").display()
        );
        if i > 0 {
            // Link i-1: left end p[2(i-1)], right end p[2(i-1)+1].
            cfg.push_str(&iface(names[i - 1], p[2 * (i - 1) + 1], ad(i as u8), p[2 * (i - 1)]));
        }
        if i < 3 {
            cfg.push_str(&iface(names[i + 1], p[2 * i], ad(i as u8 + 2), p[2 * i + 1]));
        }
        let _ = writeln!(cfg, "\n[routes]\ntopology = \"{LINE4}\"");
        nodes.push(Daemon::start(dir, &format!("line-{name}"), &cfg));
    }
    nodes
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum PingKind {
    Snap,
    Plain,
    Icmp,
}

impl PingKind {
    fn name(self) -> &'static str {
        match self {
            PingKind::Snap => "SNAP ping",
            PingKind::Plain => "plain echo",
            PingKind::Icmp => "kernel ICMP",
        }
    }
}

/// Echo servers for plain pings: at each node, every payload delivered to
/// ECHO_PORT goes back to 10.0.0.1's PLAIN_REPLY_PORT as a plain packet.
struct Echoes {
    stop: std::sync::Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Echoes {
    fn start(run_dirs: &[PathBuf]) -> Echoes {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel();
        for rd in run_dirs {
            let (rd, stop, tx) = (rd.clone(), stop.clone(), tx.clone());
            threads.push(thread::spawn(move || {
                let mut c = Client::connect(&rd).expect("echo client");
                c.register(ECHO_PORT).expect("register echo port");
                let _ = tx.send(());
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some((ECHO_PORT, p))) = c.recv(Duration::from_millis(50)) {
                        let _ = c.plain(ad(1), PLAIN_REPLY_PORT, 64, &p);
                    }
                }
                let _ = c.unregister(ECHO_PORT);
            }));
        }
        for _ in run_dirs {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
        Echoes { stop, threads }
    }
}

impl Drop for Echoes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One SNAP or plain ping from a's client; the RTT in µs, or None if lost.
fn ping_once(c: &mut Client, kind: PingKind, hops: u8, size: usize, seq: u32) -> Option<f64> {
    let dst = ad(hops + 1);
    let (pkt, payload) = match kind {
        PingKind::Snap => (snap_ping(dst, seq, size), Vec::new()),
        _ => (Vec::new(), ping_payload(seq, plain_ping_len(size))),
    };
    let t0 = Instant::now();
    let sent = match kind {
        PingKind::Snap => c.inject(&pkt),
        _ => c.plain(dst, ECHO_PORT, 64, &payload),
    };
    if sent.is_err() {
        return None;
    }
    let deadline = t0 + Duration::from_secs(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        match c.recv(left) {
            Ok(Some((_, p))) if p.get(..4) == Some(&seq.to_be_bytes()[..]) => {
                return Some(t0.elapsed().as_secs_f64() * 1e6);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Kernel ICMP pings from namespace anode-a; RTTs in µs.
fn icmp_batch(hops: u8, size: usize, count: usize) -> Vec<f64> {
    let out = Command::new("ip")
        .args(["netns", "exec", "anode-a", "ping", "-n", "-c", &count.to_string(), "-i", "0.002", "-W", "1", "-s"])
        .arg((size - 8).to_string())
        .arg(ad(hops + 1).to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ms| ms * 1e3)
        .collect()
}

type Samples = BTreeMap<(PingKind, usize, u8), Vec<f64>>;

/// Pings over 0–3 hops from the node whose run dir is `run_dirs[0]`,
/// interleaving every (kind, size, hops) case round by round; with `icmp`,
/// also kernel ICMP in batches between rounds.
fn ping_matrix(run_dirs: &[PathBuf], s: &Settings, icmp: bool) -> (Samples, BTreeMap<(PingKind, usize, u8), usize>) {
    let _echo = Echoes::start(run_dirs);
    let mut c = Client::connect(&run_dirs[0]).expect("pinger");
    c.register(SNAP_REPLY_PORT).expect("register");
    c.register(PLAIN_REPLY_PORT).expect("register");
    let mut cases = Vec::new();
    for size in SIZES {
        for hops in 0..4u8 {
            for kind in [PingKind::Snap, PingKind::Plain] {
                cases.push((kind, size, hops));
            }
        }
    }
    let mut samples: Samples = BTreeMap::new();
    let mut lost: BTreeMap<(PingKind, usize, u8), usize> = BTreeMap::new();
    let warm = if s.quick { 3 } else { 20 };
    let mut seq = 1u32;
    let icmp_chunk = 20usize;
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for round in 0..warm + s.pings {
        // A fresh random order every round: no case always follows the same
        // other case (which would leave the same nodes warm or idle before it).
        rng.shuffle(&mut cases);
        for &case in &cases {
            seq += 1;
            let r = ping_once(&mut c, case.0, case.2, case.1, seq);
            if round >= warm {
                match r {
                    Some(us) => samples.entry(case).or_default().push(us),
                    None => *lost.entry(case).or_default() += 1,
                }
            }
            thread::sleep(s.gap);
        }
        let done = (round + 1).saturating_sub(warm);
        let last = round + 1 == warm + s.pings;
        if icmp && done > 0 && (done % icmp_chunk == 0 || last) {
            let n = if done % icmp_chunk == 0 { icmp_chunk } else { done % icmp_chunk };
            for size in SIZES {
                for hops in 0..4u8 {
                    let v = icmp_batch(hops, size, n);
                    *lost.entry((PingKind::Icmp, size, hops)).or_default() += n.saturating_sub(v.len());
                    samples.entry((PingKind::Icmp, size, hops)).or_default().extend(v);
                }
            }
        }
    }
    let _ = c.unregister(SNAP_REPLY_PORT);
    let _ = c.unregister(PLAIN_REPLY_PORT);
    (samples, lost)
}

/// A small deterministic PRNG for shuffling the order of measurements.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// `v.len()` draws from `v` with replacement.
    fn resample(&mut self, v: &[f64]) -> Vec<f64> {
        if v.is_empty() {
            return Vec::new();
        }
        (0..v.len()).map(|_| v[(self.next() % v.len() as u64) as usize]).collect()
    }
    /// Fisher–Yates.
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Bootstrap resamples for the confidence intervals.
const BOOTSTRAP: usize = 400;

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    sxy / sxx
}

fn latency_report(title: &str, samples: &Samples, lost: &BTreeMap<(PingKind, usize, u8), usize>, report: &mut String) {
    let kinds: Vec<PingKind> = {
        let mut k: Vec<PingKind> = samples.keys().map(|k| k.0).collect();
        k.dedup();
        k
    };
    let _ = writeln!(report, "\n## Latency: {title}\n");
    let _ = write!(report, "| size | hops |");
    for k in &kinds {
        let _ = write!(report, " {} median µs | p90 |", k.name());
    }
    let _ = writeln!(report, " SNAP / plain (medians) |");
    let _ = writeln!(report, "|---:|---:|{}---:|", "---:|---:|".repeat(kinds.len()));
    for size in SIZES {
        for hops in 0..4u8 {
            let _ = write!(report, "| {size} | {hops} |");
            for k in &kinds {
                let v = samples.get(&(*k, size, hops)).map(Vec::as_slice).unwrap_or(&[]);
                let _ = write!(report, " {:.1} | {:.1} |", median(v), quantile(v, 0.9));
            }
            let m = |k| median(samples.get(&(k, size, hops)).map(Vec::as_slice).unwrap_or(&[]));
            let _ = writeln!(report, " {:.3} |", m(PingKind::Snap) / m(PingKind::Plain));
        }
    }
    let _ = writeln!(
        report,
        "\nPer-hop cost (least-squares slope of the median RTT over hops 0–3; one hop = one more link each way):\n"
    );
    let _ = write!(report, "| size |");
    for k in &kinds {
        let _ = write!(report, " {} µs/hop |", k.name());
    }
    let _ = writeln!(report, " SNAP / plain per hop | 95 % bootstrap interval | goal ≤ 1.10 |");
    let _ = writeln!(report, "|---:|{}---:|---:|---|", "---:|".repeat(kinds.len()));
    let get = |k: PingKind, size: usize, h: u8| samples.get(&(k, size, h)).map(Vec::as_slice).unwrap_or(&[]);
    let slope_of = |meds: &[f64]| slope(&meds.iter().enumerate().map(|(h, m)| (h as f64, *m)).collect::<Vec<_>>());
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for size in SIZES {
        let _ = write!(report, "| {size} |");
        let mut per = BTreeMap::new();
        for k in &kinds {
            let sl = slope_of(&(0..4u8).map(|h| median(get(*k, size, h))).collect::<Vec<_>>());
            per.insert(*k, sl);
            let _ = write!(report, " {sl:.1} |");
        }
        let r = per.get(&PingKind::Snap).copied().unwrap_or(f64::NAN)
            / per.get(&PingKind::Plain).copied().unwrap_or(f64::NAN);
        // Bootstrap: resample every case's RTTs, recompute both slopes.
        let mut ratios: Vec<f64> = (0..BOOTSTRAP)
            .map(|_| {
                let mut sl = [0.0; 2];
                for (i, k) in [PingKind::Snap, PingKind::Plain].into_iter().enumerate() {
                    let meds: Vec<f64> = (0..4u8).map(|h| median(&rng.resample(get(k, size, h)))).collect();
                    sl[i] = slope_of(&meds);
                }
                sl[0] / sl[1]
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let _ = writeln!(
            report,
            " {r:.3} | {:.3}–{:.3} | {} |",
            quantile(&ratios, 0.025),
            quantile(&ratios, 0.975),
            if r <= 1.10 { "met" } else { "missed" }
        );
    }
    let total_lost: usize = lost.values().sum();
    let n: usize = samples.values().map(Vec::len).sum();
    let _ = writeln!(report, "\n{n} RTTs, {total_lost} lost (no reply within 1 s).");
}

/// Longest relay chain of the `relays` part.
const MAX_CHAIN: usize = 6;

/// The `relays` part: RTT of a probe through chains of 0..=[`MAX_CHAIN`]
/// bare relay processes and back to the harness, cases in a fresh random
/// order each round, one probe in flight.
fn relay_chains(s: &Settings, report: &mut String) {
    eprintln!("relays: chains of 0-{MAX_CHAIN} bare relay processes on loopback, {} probes per case", s.pings);
    let sink = udp_socket();
    sink.set_nonblocking(false).expect("blocking");
    sink.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    let sink_addr = sink.local_addr().expect("sink");
    let src = udp_socket();
    // Chain k: k relays, the last one relaying to the sink.
    let mut relays = Vec::new();
    let mut entries = Vec::new();
    for k in 0..=MAX_CHAIN {
        let mut to = sink_addr;
        for _ in 0..k {
            let r = Relay::start(to);
            to = r.inner.addr;
            relays.push(r);
        }
        entries.push(to);
    }
    let mut cases: Vec<(usize, usize)> = SIZES.iter().flat_map(|&z| (0..=MAX_CHAIN).map(move |k| (z, k))).collect();
    let mut samples: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    let mut lost: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let warm = if s.quick { 3 } else { 20 };
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut seq = 0u32;
    let mut buf = vec![0u8; 2048];
    for round in 0..warm + s.pings {
        rng.shuffle(&mut cases);
        for &(size, k) in &cases {
            seq += 1;
            let probe = ping_payload(seq, size);
            let t = Instant::now();
            src.send_to(&probe, entries[k]).expect("send");
            let mut got = None;
            while let Ok((n, _)) = sink.recv_from(&mut buf) {
                if n >= 4 && buf[..4] == probe[..4] {
                    got = Some(t.elapsed().as_secs_f64() * 1e6);
                    break;
                }
            }
            if round >= warm {
                match got {
                    Some(us) => samples.entry((size, k)).or_default().push(us),
                    None => *lost.entry((size, k)).or_default() += 1,
                }
            }
            thread::sleep(s.gap);
        }
    }
    drop(relays);
    let _ = writeln!(
        report,
        "\n## Latency: chains of bare relay processes (loopback)\n\n\
         µs; {} probes per cell, one in flight, {} µs between probes\n\n\
         | size | relays | median | p90 | lost |\n|---:|---:|---:|---:|---:|",
        s.pings,
        s.gap.as_micros()
    );
    for &size in &SIZES {
        for k in 0..=MAX_CHAIN {
            let v = samples.get(&(size, k)).map(Vec::as_slice).unwrap_or(&[]);
            let l = lost.get(&(size, k)).copied().unwrap_or(0);
            let _ = writeln!(report, "| {size} | {k} | {:.1} | {:.1} | {l} |", median(v), quantile(v, 0.9));
        }
    }
    let _ = writeln!(
        report,
        "\n| size | µs per relay (slope of the medians) | × 2 (what an anode hop crosses) |\n|---:|---:|---:|"
    );
    for &size in &SIZES {
        let pts: Vec<(f64, f64)> = (0..=MAX_CHAIN)
            .filter_map(|k| samples.get(&(size, k)).map(|v| (k as f64, median(v))))
            .filter(|p| p.1.is_finite())
            .collect();
        let per = slope(&pts);
        let _ = writeln!(report, "| {size} | {per:.1} | {:.1} |", 2.0 * per);
    }
}

fn netns_possible() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root".into());
    }
    let ok = |c: &mut Command| c.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !ok(Command::new("ip").args(["netns", "list"])) {
        return Err("`ip netns` does not work".into());
    }
    if !ok(Command::new("ping").arg("-V")) {
        return Err("no ping".into());
    }
    for n in ["a", "b", "c", "d"] {
        if Path::new("/run/netns").join(format!("anode-{n}")).exists() {
            return Err(format!("namespace anode-{n} already exists (another testbed is running)"));
        }
    }
    Ok(())
}

/// A `anode testbed up --netns` testbed, brought down on drop.
struct NetnsTestbed {
    dir: PathBuf,
    id: u64,
}

impl NetnsTestbed {
    fn up(dir: &Path) -> Result<NetnsTestbed, String> {
        let id = register(Cleanup::Testbed(dir.to_path_buf()));
        let tb = NetnsTestbed { dir: dir.to_path_buf(), id };
        let out = Command::new(ANODE)
            .args(["testbed", "up", LINE4, "--netns", "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(tb)
    }
}

impl Drop for NetnsTestbed {
    fn drop(&mut self) {
        run_cleanup(&Cleanup::Testbed(self.dir.clone()));
        unregister(self.id);
    }
}

// ------------------------------------------------------------------ main

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "CPU {model}, {cpus} CPUs, load average at start {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

fn main() {
    if let Ok(to) = std::env::var(relay::ENV) {
        pin_self(&Settings::from_env(), 1);
        relay::main(&to, udp_socket(), udp_socket());
    }
    // `cargo bench` passes `--bench`; other arguments (filters) are ignored.
    // Without it (`cargo test --benches`) only a quick smoke run of the
    // throughput and latency parts is made.
    let mut s = Settings::from_env();
    if !std::env::args().any(|a| a == "--bench") {
        s.quick = true;
        s.trial = s.trial.min(Duration::from_millis(500));
        s.reps = 1;
        s.pings = s.pings.min(20);
        s.only.get_or_insert_with(|| vec!["throughput".into(), "latency".into()]);
    }
    watch_signals();
    let work = WorkDir::new();
    let mut report = String::new();
    let _ = writeln!(report, "# anode forwarding bench{}\n\n{}", if s.quick { " (quick)" } else { "" }, machine());
    eprintln!("forwarding bench: work dir {}", work.path.display());

    if s.wants("throughput") || s.wants("profile") {
        let rig = if s.wants("throughput") {
            throughput(&work.path, &s, &mut report)
        } else {
            Some(Rig::start(&work.path, &s))
        };
        if let Some(rig) = rig
            && s.wants("profile")
        {
            profiles(&rig, &work.path, &s, &mut report);
        }
    }
    if s.wants("latency") {
        eprintln!("latency: line of 4 daemons on loopback, {} pings per case", s.pings);
        let line = start_line(&work.path);
        let dirs: Vec<PathBuf> = line.iter().map(|d| d.run_dir.clone()).collect();
        let (samples, lost) = ping_matrix(&dirs, &s, false);
        latency_report("line of 4 daemons on loopback UDP (a pings a, b, c, d)", &samples, &lost, &mut report);
        drop(line);
    }
    if s.wants("relays") {
        relay_chains(&s, &mut report);
    }
    if s.wants("netns") {
        match netns_possible() {
            Err(why) => {
                let _ = writeln!(report, "\n## Latency: network namespaces\n\nskipped: {why}\n");
            }
            Ok(()) => {
                eprintln!("netns: anode testbed up --netns, SNAP/plain pings and kernel ICMP");
                let dir = work.path.join("netns");
                match NetnsTestbed::up(&dir) {
                    Err(e) => {
                        let _ = writeln!(report, "\n## Latency: network namespaces\n\nskipped: testbed failed: {e}\n");
                    }
                    Ok(tb) => {
                        let dirs: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(|n| dir.join(n)).collect();
                        let (samples, lost) = ping_matrix(&dirs, &s, true);
                        latency_report(
                            "line of 4 namespaces (veth), anode daemons and kernel routers on the same hosts",
                            &samples,
                            &lost,
                            &mut report,
                        );
                        drop(tb);
                    }
                }
            }
        }
    }
    println!("{report}");
}
