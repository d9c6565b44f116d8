//! The cost of SANE with real daemons (issue 6), side by side in one run:
//! security off, authenticate-only, and encrypt, at 100- and 1,400-byte
//! datagrams.
//!
//! 1. **Throughput through a middle node.** One daemon `b` per mode. The
//!    harness plays its neighbours `a` and `c` with the same sans-I/O
//!    security layer the daemon embeds (`anode_sec::Links`): it runs the
//!    handshakes with `b`, then floods `b` with plain packets for `c`,
//!    sealed per packet for `b` (as `a` would), and counts what reaches
//!    `c`. Trials alternate between the modes.
//! 2. **SNAP ping RTT** (Fig. 1 ping) over a line `a – b – c` of real
//!    daemons per mode, from `a`'s application socket to `c` and back:
//!    four protected hops per round trip. Pings alternate between modes.
//!
//! 3. **The data path (issue 19)**, `ANODE_BENCH_ONLY=datapath`: with
//!    encryption on, the harness's `a` sends each burst of 32 sealed
//!    datagrams as one UDP GSO run, as an anode neighbour does, and `c`
//!    receives with GRO, as an anode neighbour does; through `b` with the
//!    default `[io]` (GSO, GRO, 50 µs spin), `b` with `[io]` off (plain
//!    `recvmmsg`/`sendmmsg`, no spin), a bare relay process
//!    (`recvmmsg` → `sendmmsg`, 32 at a time, no anode code, no crypto)
//!    carrying datagrams of the same length, `b` with two workers, and `b`
//!    with `SO_BUSY_POLL` at 50 µs, `b` with transmit scheduling on its
//!    link to c (`rate_bps` far above what it forwards: the scheduler's
//!    cost only); and, as root, the kernel forwarding
//!    between three network namespaces joined by veth pairs (the same
//!    plain datagrams to c's address through b, as GSO runs and one by
//!    one; its CPU is not attributable to a process). Trials alternate; the
//!    forwarder's CPU time per packet comes from its `/proc/<pid>/stat`
//!    (user + system, all its threads).
//!
//! `cargo bench -p anode --bench secure`; `ANODE_BENCH_QUICK=1` for a smoke
//! run. `ANODE_BENCH_TRIAL_S` (default 2), `ANODE_BENCH_REPS` (default 6),
//! `ANODE_BENCH_PINGS` (default 1000), `ANODE_BENCH_ONLY` (a comma list of
//! `throughput`, `latency`, `datapath`, `pacing`, `workers`,
//! `pacing-sweep`; default the first two; `pacing-sweep` and `workers` take `ANODE_BENCH_OFFER_PPS`, a comma list of
//! offered rates, `pacing-sweep` `ANODE_BENCH_SIZE` (default 1400);
//! `workers` takes `ANODE_BENCH_WORKERS_MODE=off` for security off,
//! `ANODE_BENCH_WORKERS_MODULES=1` for b with modules (RCANE) on, and
//! `ANODE_BENCH_WORKERS_EXTRA`, more `[io]` lines for a third rig of two
//! workers; `ANODE_BENCH_SOURCES`, the generator's source ports, default
//! 16). Results: docs/benchmarks.md, "SANE" and "Data path".

#[path = "relay/mod.rs"]
mod relay;

use anode_daemon::client::Client;
use anode_node::anep;
use anode_node::plain;
use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::{Identity, Links, LinksConfig, Mode, Output, PeerConfig};
use anode_snap::asm;
use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, sendmmsg, sendmsg};
use serde_json::Value;
use std::fmt::Write as _;
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");
const PING_S: &str = include_str!("../../../examples/snap/ping.s");
const SIZES: [usize; 2] = [100, 1400];
const BATCH: usize = 32;
const REPLY_PORT: u16 = 50_001;
const MODES: [Option<Mode>; 3] = [None, Some(Mode::Authenticate), Some(Mode::Encrypt)];

fn mode_name(m: Option<Mode>) -> &'static str {
    m.map_or("off", Mode::name)
}

fn ad(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn id(n: u8) -> Identity {
    Identity::from_seed(&[n; 32])
}

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

fn now_ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

struct Daemon {
    child: Child,
    run_dir: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, name: &str, config: &str) -> Daemon {
        let nd = dir.join(name);
        std::fs::create_dir_all(&nd).expect("node dir");
        std::fs::write(nd.join("node.toml"), config).expect("config");
        let log = std::fs::File::create(nd.join("node.log")).expect("log");
        let child = Command::new(ANODE)
            .args(["node", "--log", "warn", "--config"])
            .arg(nd.join("node.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("anode node");
        let d = Daemon { child, run_dir: nd.join("run") };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Client::connect(&d.run_dir).is_ok_and(|mut c| c.hello().is_ok()) {
            assert!(Instant::now() < deadline, "{name} not ready");
            thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn status(&self) -> Value {
        let o =
            Command::new(ANODE).args(["status", "--json", "--run-dir"]).arg(&self.run_dir).output().expect("status");
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    }

    fn links_up(&self) -> bool {
        match self.status().get("security") {
            None => true,
            Some(s) => s["peers"].as_array().is_some_and(|p| p.iter().all(|p| p["up"] == true)),
        }
    }

    fn cpu_secs(&self) -> f64 {
        cpu_secs(self.child.id())
    }
}

/// User + system CPU seconds of process `pid`, all its threads.
fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

/// Three network namespaces `a – b – c` joined by veth pairs, b an IP
/// router (`ip_forward`): the kernel's forwarding between namespaces, the
/// anchor issue 19 compares with. Deleted on drop.
struct KernelPath {
    names: [String; 3],
}

/// Addresses of the kernel path: a's and c's veth ends.
const KA: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
const KC: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);

impl KernelPath {
    /// Why it cannot be built here, if it cannot.
    fn unavailable() -> Option<String> {
        if !nix::unistd::geteuid().is_root() {
            return Some("not root".into());
        }
        match Command::new("ip").args(["netns", "list"]).output() {
            Ok(o) if o.status.success() => None,
            _ => Some("no working `ip netns`".into()),
        }
    }

    fn build(tag: &str) -> KernelPath {
        let id = std::process::id();
        let names = ["a", "b", "c"].map(|n| format!("anode-kf{id}{tag}{n}"));
        let [na, nb, nc] = &names;
        let path = KernelPath { names: names.clone() };
        let ip = |args: &str| {
            let o = Command::new("ip").args(args.split_whitespace()).output().expect("ip");
            assert!(o.status.success(), "ip {args}: {}", String::from_utf8_lossy(&o.stderr));
        };
        for n in &names {
            ip(&format!("netns add {n}"));
            ip(&format!("-n {n} link set lo up"));
        }
        ip(&format!("link add kfa{id} type veth peer name kfb1{id}"));
        ip(&format!("link set kfa{id} netns {na}"));
        ip(&format!("link set kfb1{id} netns {nb}"));
        ip(&format!("link add kfb2{id} type veth peer name kfc{id}"));
        ip(&format!("link set kfb2{id} netns {nb}"));
        ip(&format!("link set kfc{id} netns {nc}"));
        for (n, dev, addr) in [
            (na, format!("kfa{id}"), "198.18.1.1/24"),
            (nb, format!("kfb1{id}"), "198.18.1.2/24"),
            (nb, format!("kfb2{id}"), "198.18.2.2/24"),
            (nc, format!("kfc{id}"), "198.18.2.1/24"),
        ] {
            ip(&format!("-n {n} addr add {addr} dev {dev}"));
            ip(&format!("-n {n} link set {dev} up"));
        }
        ip(&format!("-n {na} route add 198.18.2.0/24 via 198.18.1.2"));
        ip(&format!("-n {nc} route add 198.18.1.0/24 via 198.18.2.2"));
        ip(&format!("netns exec {nb} sysctl -q -w net.ipv4.ip_forward=1"));
        path
    }

    /// A UDP socket bound to `addr` inside namespace `ns` (this thread
    /// enters it for the bind and comes back).
    fn socket_in(ns: &str, addr: SocketAddr) -> UdpSocket {
        use nix::sched::{CloneFlags, setns};
        let home = std::fs::File::open("/proc/thread-self/ns/net").expect("own netns");
        let there = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns");
        setns(&there, CloneFlags::CLONE_NEWNET).expect("enter netns");
        let s = UdpSocket::bind(addr);
        setns(&home, CloneFlags::CLONE_NEWNET).expect("leave netns");
        s.expect("bind in netns")
    }
}

impl Drop for KernelPath {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// What forwards a rig's traffic.
enum Forwarder {
    Node(Daemon),
    Relay(relay::Relay),
    /// The kernel: its forwarding runs in softirq context, charged to
    /// whichever task the interrupt or the sender's system call was on, so
    /// no process clock measures it. Held until the rig goes, then deleted.
    Kernel {
        _namespaces: KernelPath,
    },
}

impl Forwarder {
    fn cpu_secs(&self) -> f64 {
        match self {
            Forwarder::Node(d) => d.cpu_secs(),
            Forwarder::Relay(r) => cpu_secs(r.child.id()),
            Forwarder::Kernel { .. } => f64::NAN,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_key(dir: &Path, name: &str, who: &Identity) -> PathBuf {
    std::fs::create_dir_all(dir).expect("key dir");
    let p = dir.join(format!("{name}.key"));
    std::fs::write(&p, who.to_file_text().as_bytes()).expect("key");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

fn iface(name: &str, listen: SocketAddr, nb: Ipv4Addr, ep: SocketAddr, key: Option<&Identity>) -> String {
    let key = key.map(|k| format!(", key = \"{}\"", k.public())).unwrap_or_default();
    format!(
        "[[interface]]\nname = \"{name}\"\nlisten = \"{listen}\"\nneighbors = [{{ address = \"{nb}\", endpoint = \"{ep}\"{key} }}]\n"
    )
}

fn security(mode: Option<Mode>, key: &Path) -> String {
    match mode {
        None => String::new(),
        Some(m) => format!("[security]\nkey = \"{}\"\nmode = \"{}\"\n", key.display(), m.name()),
    }
}

/// Free loopback addresses, below the ephemeral range (`anode_daemon::ports`).
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let s = anode_daemon::ports::reserve_loopback(n).expect("free loopback ports");
    s.iter().map(|s| s.local_addr().expect("addr")).collect()
}

fn plain_datagram(size: usize) -> Vec<u8> {
    let mut p = vec![0x5a; size - anep::HEADER_LEN];
    plain::Repr { dst: ad(3), src: ad(1), ttl: 64, port: 7 }.emit(&mut p[..plain::HEADER_LEN]).expect("header room");
    anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, &p)
}

/// The harness's side of one link: a socket and a security layer.
struct Side {
    sock: UdpSocket,
    links: Option<Links>,
}

impl Side {
    fn new(
        sock: UdpSocket,
        who: Identity,
        b_key: &Identity,
        b_ep: SocketAddr,
        mode: Option<Mode>,
        t0: Instant,
    ) -> Side {
        let links = mode.map(|m| {
            let cfg = LinksConfig {
                peers: vec![PeerConfig { key: b_key.public(), endpoint: b_ep, mode: m }],
                unix_offset_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0)
                    - now_ms(t0),
                ..LinksConfig::default()
            };
            Links::new(who, cfg, now_ms(t0)).expect("links")
        });
        Side { sock, links }
    }

    /// Seals `inner` for b into `buf`; returns the datagram length.
    fn seal(&mut self, inner: &[u8], buf: &mut Vec<u8>, t: u64) -> usize {
        let Some(l) = self.links.as_mut() else {
            buf.clear();
            buf.extend_from_slice(inner);
            return inner.len();
        };
        let n = inner.len();
        buf.resize(8 + OVERHEAD + n, 0);
        buf[8 + AH_LEN..8 + AH_LEN + n].copy_from_slice(inner);
        let ty = if l.mode(0) == Mode::Encrypt { anep::TYPE_ESP } else { anep::TYPE_AUTH };
        anep::write_header(buf, anep::FLAG_DISCARD_UNKNOWN, ty, AH_LEN + n + 16);
        l.seal(0, buf, 8, n, t).expect("SA up")
    }

    /// Runs handshakes until the harness side is up.
    fn pump(&mut self, t0: Instant) {
        let Some(l) = self.links.as_mut() else { return };
        let mut out = Vec::new();
        l.poll(now_ms(t0), &mut out);
        self.sock.set_nonblocking(true).expect("nonblocking");
        let mut buf = vec![0u8; 2048];
        while let Ok((n, from)) = self.sock.recv_from(&mut buf) {
            let Ok(a) = anep::Packet::new_checked(&buf[..n]) else { continue };
            let (type_id, payload_start) = (a.type_id(), a.payload_start());
            let l = self.links.as_mut().expect("links");
            if type_id == anep::TYPE_HANDSHAKE {
                let _ = l.handle_handshake(from, &buf[payload_start..n], now_ms(t0), &mut out);
            } else {
                let _ = l.open(&mut buf[..n], payload_start, type_id == anep::TYPE_ESP, now_ms(t0));
            }
        }
        self.sock.set_nonblocking(false).expect("blocking");
        self.send(out, t0);
    }

    /// A datagram the sink received: a handshake (a rekey by b) goes to the
    /// security layer and is answered; true if it was one.
    fn sink_handshake(&mut self, from: SocketAddr, d: &[u8], t0: Instant) -> bool {
        let Some(l) = self.links.as_mut() else { return false };
        let Ok(a) = anep::Packet::new_checked(d) else { return false };
        if a.type_id() != anep::TYPE_HANDSHAKE {
            return false;
        }
        let mut out = Vec::new();
        let _ = l.handle_handshake(from, &d[a.payload_start()..], now_ms(t0), &mut out);
        self.send(out, t0);
        true
    }

    /// The security layer's timers (rekeys, keepalives), for the sink.
    fn tick(&mut self, t0: Instant) {
        let Some(l) = self.links.as_mut() else { return };
        let mut out = Vec::new();
        l.poll(now_ms(t0), &mut out);
        self.send(out, t0);
    }

    /// Sends what the security layer asked for.
    fn send(&mut self, out: Vec<Output>, t0: Instant) {
        for o in out {
            match o {
                Output::Handshake { to, msg, .. } => {
                    let _ = self.sock.send_to(&anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg), to);
                }
                Output::Keepalive { .. } => {
                    let mut b = Vec::new();
                    let n = self.seal(&[], &mut b, now_ms(t0));
                    let to = self.links.as_ref().and_then(|l| l.endpoint_of(0)).expect("endpoint");
                    let _ = self.sock.send_to(&b[..n], to);
                }
                Output::Established { .. } => {}
            }
        }
    }

    fn up(&self) -> bool {
        self.links.as_ref().is_none_or(|l| l.is_up(0))
    }
}

struct Rig {
    mode: Option<Mode>,
    label: String,
    b: Forwarder,
    a: Side,
    b_in: SocketAddr,
    /// The generator sends each burst as one GSO run.
    gso: bool,
    /// More source sockets for the generator's bursts, in turn with a's
    /// own (one SA: b opens by SPI), so that SO_REUSEPORT spreads them
    /// over b's workers (`ANODE_BENCH_SOURCES` in all, 16 by default).
    extra: Vec<UdpSocket>,
    /// Datagrams the generator handed to the kernel in the last trial's
    /// window.
    offered: f64,
    /// When set, the generator offers this many datagrams a second (sleeping
    /// between bursts) instead of as many as it can.
    offer_pps: Option<f64>,
    /// Bytes received at the sink (with GRO a receive holds several
    /// datagrams, all of one length in a trial).
    sink: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sink_thread: Option<thread::JoinHandle<()>>,
}

impl Rig {
    /// b in `mode` with `io` as its `[io]` section, named `tag`; the
    /// generator sends GSO runs when `gso`.
    fn start(dir: &Path, mode: Option<Mode>, t0: Instant, tag: &str, io: &str, gso: bool) -> Rig {
        Rig::start_with(dir, mode, t0, tag, io, gso, "")
    }

    /// [`Rig::start`] with `c_link` added to b's interface towards c (a
    /// `rate_bps`, say).
    fn start_with(dir: &Path, mode: Option<Mode>, t0: Instant, tag: &str, io: &str, gso: bool, c_link: &str) -> Rig {
        let (sa, sc) = (UdpSocket::bind("127.0.0.1:0").expect("a"), UdpSocket::bind("127.0.0.1:0").expect("c"));
        let (ea, ec) = (sa.local_addr().expect("a"), sc.local_addr().expect("c"));
        let ports = free_addrs(2);
        let key = write_key(&dir.join("keys"), tag, &id(2));
        let cfg = format!(
            "address = \"10.0.0.2\"\nrun_dir = \"{}\"\n{}{}{}[io]\n{io}\n",
            dir.join(tag).join("run").display(),
            iface("to-a", ports[0], ad(1), ea, mode.map(|_| id(1)).as_ref()),
            iface("to-c", ports[1], ad(3), ec, mode.map(|_| id(3)).as_ref()) + c_link,
            security(mode, &key)
        );
        let b = Daemon::start(dir, tag, &cfg);
        let mut a = Side::new(sa, id(1), &id(2), ports[0], mode, t0);
        let mut c = Side::new(sc, id(3), &id(2), ports[1], mode, t0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(a.up() && c.up() && b.links_up()) {
            a.pump(t0);
            c.pump(t0);
            assert!(Instant::now() < deadline, "{tag}: links did not come up");
            thread::sleep(Duration::from_millis(5));
        }
        let (sink, stop, sink_thread) = sink(c, t0);
        // Sixteen source ports in all: the SO_REUSEPORT hash of four put 73 %
        // of the datagrams on one of two workers in one run.
        let sources = env_num("ANODE_BENCH_SOURCES", 16.0).max(1.0) as usize;
        let extra = (1..sources).map(|_| UdpSocket::bind("127.0.0.1:0").expect("source")).collect();
        Rig {
            mode,
            label: tag.to_string(),
            b: Forwarder::Node(b),
            a,
            b_in: ports[0],
            gso,
            extra,
            offered: 0.0,
            offer_pps: None,
            sink,
            stop,
            sink_thread,
        }
    }

    /// A bare relay in b's place; `a` (no security layer) sends datagrams
    /// of the length a sealed one has, as GSO runs.
    fn relay() -> Rig {
        let (sa, sc) = (UdpSocket::bind("127.0.0.1:0").expect("a"), UdpSocket::bind("127.0.0.1:0").expect("c"));
        let relay = relay::Relay::start(sc.local_addr().expect("c"));
        let b_in = relay.addr;
        let (sink, stop, sink_thread) = sink(Side { sock: sc, links: None }, Instant::now());
        let a = Side { sock: sa, links: None };
        Rig {
            mode: None,
            label: "relay".into(),
            b: Forwarder::Relay(relay),
            a,
            b_in,
            gso: true,
            extra: Vec::new(),
            offered: 0.0,
            offer_pps: None,
            sink,
            stop,
            sink_thread,
        }
    }

    /// The kernel forwarding between namespaces in b's place; `a` (no
    /// security layer) sends plain datagrams of a sealed one's length to c's
    /// address through b, as GSO runs when `gso`.
    fn kernel(gso: bool) -> Rig {
        let path = KernelPath::build(if gso { "g" } else { "m" });
        let sa = KernelPath::socket_in(&path.names[0], SocketAddr::from((KA, 0)));
        let sc = KernelPath::socket_in(&path.names[2], SocketAddr::from((KC, 0)));
        let b_in = sc.local_addr().expect("c");
        let (sink, stop, sink_thread) = sink(Side { sock: sc, links: None }, Instant::now());
        Rig {
            mode: None,
            label: if gso { "kernel-netns".into() } else { "kernel-netns-no-gso".into() },
            b: Forwarder::Kernel { _namespaces: path },
            a: Side { sock: sa, links: None },
            b_in,
            gso,
            extra: Vec::new(),
            offered: 0.0,
            offer_pps: None,
            sink,
            stop,
            sink_thread,
        }
    }

    /// Floods b for `window` (after a warm-up) with `size`-byte plain
    /// packets (sealed when b has security; padded by `pad` bytes when it
    /// has not); returns (packets/s at the sink, b's CPU µs per forwarded
    /// packet).
    fn trial(&mut self, size: usize, pad: usize, window: Duration, t0: Instant) -> (f64, f64) {
        let mut inner = plain_datagram(size);
        if pad > 0 {
            inner = plain_datagram(size + pad);
        }
        let dlen = {
            let mut b = Vec::new();
            self.a.seal(&inner, &mut b, now_ms(t0))
        } as u64;
        // a answers b's rekeys and starts its own between trials (the
        // generator thread does not), so a long run keeps its SA.
        for _ in 0..10 {
            self.a.pump(t0);
            thread::sleep(Duration::from_millis(5));
        }
        assert!(self.a.up(), "{}: a's SA with b is down", self.label);
        let gso = self.gso;
        let stop = AtomicBool::new(false);
        let (mut c0, mut c1, mut cpu0, mut cpu1, mut secs) = (0, 0, 0.0, 0.0, 0.0);
        let (mut o0, mut o1) = (0, 0);
        let b_in = self.b_in;
        let a = &mut self.a;
        let extra = &self.extra;
        let offered = AtomicU64::new(0);
        let offer_pps = self.offer_pps;
        thread::scope(|sc| {
            sc.spawn(|| {
                let start = Instant::now();
                let mut bufs: Vec<Vec<u8>> = vec![Vec::new(); BATCH];
                let mut lens = [0usize; BATCH];
                let addrs = [Some(SockaddrStorage::from(b_in)); BATCH];
                let mut hdrs = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
                let mut turn = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // A paced generator sleeps until its next burst is due
                    // (late, it sends at once and catches up).
                    if let Some(r) = offer_pps {
                        let due = start + Duration::from_secs_f64(offered.load(Ordering::Relaxed) as f64 / r);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            thread::sleep(wait);
                        }
                    }
                    let t = now_ms(t0);
                    turn = (turn + 1) % (extra.len() + 1);
                    let fd = if turn == 0 { a.sock.as_raw_fd() } else { extra[turn - 1].as_raw_fd() };
                    for (b, l) in bufs.iter_mut().zip(lens.iter_mut()) {
                        *l = a.seal(&inner, b, t);
                    }
                    let iovs: Vec<[IoSlice<'_>; 1]> =
                        bufs.iter().zip(&lens).map(|(b, l)| [IoSlice::new(&b[..*l])]).collect();
                    let r = if gso {
                        // One GSO run of the 32 (all of one length).
                        let flat: Vec<IoSlice<'_>> = iovs.iter().map(|i| i[0]).collect();
                        let seg = lens[0] as u16;
                        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
                        sendmsg(fd, &flat, &cmsg, MsgFlags::empty(), addrs.first().and_then(|x| x.as_ref()))
                            .map(|_| BATCH)
                    } else {
                        let none: [ControlMessage<'_>; 0] = [];
                        sendmmsg(fd, &mut hdrs, iovs.iter(), addrs, none, MsgFlags::empty()).map(Iterator::count)
                    };
                    match r {
                        Ok(k) => {
                            offered.fetch_add(k as u64, Ordering::Relaxed);
                        }
                        Err(Errno::EINTR | Errno::EAGAIN | Errno::ENOBUFS) => {}
                        Err(e) => panic!("send: {e}"),
                    }
                }
            });
            thread::sleep(Duration::from_millis(300));
            c0 = self.sink.load(Ordering::Relaxed);
            o0 = offered.load(Ordering::Relaxed);
            cpu0 = self.b.cpu_secs();
            let s = Instant::now();
            thread::sleep(window);
            c1 = self.sink.load(Ordering::Relaxed);
            o1 = offered.load(Ordering::Relaxed);
            cpu1 = self.b.cpu_secs();
            secs = s.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
        });
        thread::sleep(Duration::from_millis(100));
        self.offered = (o1 - o0) as f64 / secs;
        let n = ((c1 - c0) / dlen.max(1)) as f64;
        (n / secs, if n > 0.0 { (cpu1 - cpu0) * 1e6 / n } else { f64::NAN })
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sink_thread.take() {
            let _ = t.join();
        }
    }
}

/// c's receiving thread: GRO on (as an anode neighbour has it), counts
/// bytes until stopped. With a security layer it also answers b's rekeys
/// and runs its timers, so a run longer than an SA's lifetime keeps its
/// links.
#[allow(clippy::type_complexity)]
fn sink(mut c: Side, t0: Instant) -> (Arc<AtomicU64>, Arc<AtomicBool>, Option<thread::JoinHandle<()>>) {
    let sink = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let _ = nix::sys::socket::setsockopt(&c.sock, nix::sys::socket::sockopt::UdpGroSegment, &true);
    let _ = nix::sys::socket::setsockopt(&c.sock, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    let t = {
        let (sink, stop) = (sink.clone(), stop.clone());
        thread::spawn(move || {
            c.sock.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
            let mut buf = vec![0u8; 65_536];
            let mut ticked = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = c.sock.recv_from(&mut buf)
                    && !c.sink_handshake(from, &buf[..n], t0)
                {
                    sink.fetch_add(n as u64, Ordering::Relaxed);
                }
                if ticked.elapsed() > Duration::from_millis(100) {
                    c.tick(t0);
                    ticked = Instant::now();
                }
            }
        })
    };
    (sink, stop, Some(t))
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 }
}

fn throughput(dir: &Path, reps: usize, window: Duration, report: &mut String) {
    let t0 = Instant::now();
    let mut rigs: Vec<Rig> = MODES.iter().map(|m| Rig::start(dir, *m, t0, mode_name(*m), "", false)).collect();
    let mut res = vec![vec![(Vec::new(), Vec::new()); SIZES.len()]; MODES.len()];
    for rep in 0..reps {
        for (si, size) in SIZES.iter().enumerate() {
            for k in 0..MODES.len() {
                let mi = (k + rep) % MODES.len();
                let (rate, us) = rigs[mi].trial(*size, 0, window, t0);
                eprintln!("  rep {rep} {size} B {}: {rate:.0} pkt/s, {us:.2} µs/pkt", mode_name(rigs[mi].mode));
                res[mi][si].0.push(rate);
                res[mi][si].1.push(us);
            }
        }
    }
    let _ = writeln!(report, "\n## Throughput through a middle node (plain packets)\n");
    let _ = writeln!(
        report,
        "| size | off pkt/s | authenticate pkt/s | encrypt pkt/s | auth / off | encrypt / off | b µs/pkt off / auth / encrypt |"
    );
    let _ = writeln!(report, "|---:|---:|---:|---:|---:|---:|---|");
    for (si, size) in SIZES.iter().enumerate() {
        let r: Vec<f64> = (0..3).map(|m| median(&res[m][si].0)).collect();
        let u: Vec<f64> = (0..3).map(|m| median(&res[m][si].1)).collect();
        let _ = writeln!(
            report,
            "| {size} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} | {:.2} / {:.2} / {:.2} |",
            r[0],
            r[1],
            r[2],
            r[1] / r[0],
            r[2] / r[0],
            u[0],
            u[1],
            u[2]
        );
    }
    rigs.clear();
}

/// Issue 19: b with the offloads on, b with them off, and a bare relay,
/// encryption on, the generator sending GSO runs, in one run. With
/// `pacing_only` (`ANODE_BENCH_ONLY=pacing`), only b unpaced, b paced and the
/// relay (issue 15's transmit scheduling cost, quicker).
fn datapath(dir: &Path, reps: usize, window: Duration, report: &mut String, pacing_only: bool) {
    let t0 = Instant::now();
    let on = Rig::start(dir, Some(Mode::Encrypt), t0, "io-on", "", true);
    if pacing_only {
        let paced = Rig::start_with(dir, Some(Mode::Encrypt), t0, "io-on-paced", "", true, "rate_bps = 40000000000\n");
        let rigs = vec![on, paced, Rig::relay()];
        return compare(rigs, vec![0, 0, 8 + OVERHEAD], reps, window, t0, report);
    }
    let off = Rig::start(dir, Some(Mode::Encrypt), t0, "io-off", "gso = false\ngro = false\nspin_us = 0", true);
    let w2 = Rig::start(dir, Some(Mode::Encrypt), t0, "io-on-2-workers", "workers = 2", true);
    // SO_BUSY_POLL as an option (raising it needs CAP_NET_ADMIN; the node
    // says so in its log when refused).
    let bp = Rig::start(dir, Some(Mode::Encrypt), t0, "io-on-busy-poll-50", "busy_poll_us = 50", true);
    // Transmit scheduling (issue 15) on b's link to c, at a rate far above
    // what b forwards, so that only the scheduler's cost shows.
    let paced = Rig::start_with(dir, Some(Mode::Encrypt), t0, "io-on-paced", "", true, "rate_bps = 40000000000\n");
    let mut rigs = vec![on, off, Rig::relay(), w2, bp, paced];
    // The relay carries plain datagrams as long as the sealed ones.
    let mut pads = vec![0, 0, 8 + OVERHEAD, 0, 0, 0];
    // The kernel forwarding between namespaces, where it can be built.
    match KernelPath::unavailable() {
        None => {
            rigs.extend([Rig::kernel(true), Rig::kernel(false)]);
            pads.extend([8 + OVERHEAD, 8 + OVERHEAD]);
        }
        Some(why) => {
            let _ = writeln!(report, "\nkernel forwarding between namespaces skipped: {why}");
        }
    }
    compare(rigs, pads, reps, window, t0, report);
}

/// Issue 19, two workers against one when the load generator is not the
/// bottleneck: the generator offers a fixed rate (sleeping between bursts,
/// so it takes only the CPU that rate needs) instead of all it can, and the
/// rate steps up past what one worker forwards. One worker is bounded by
/// one CPU; two may use what the generator and the sink leave of the
/// second. `ANODE_BENCH_OFFER_PPS` (a comma list) sets the rates.
fn workers_sweep(dir: &Path, reps: usize, window: Duration, report: &mut String) {
    let t0 = Instant::now();
    // `ANODE_BENCH_WORKERS_MODE=off`: security off, so that little of a
    // datagram's work is done holding the node's lock.
    let plain = std::env::var("ANODE_BENCH_WORKERS_MODE").is_ok_and(|m| m == "off");
    let mode = if plain { None } else { Some(Mode::Encrypt) };
    // `ANODE_BENCH_WORKERS_MODULES=1`: b with modules on, and so RCANE's
    // sessions and charging, as a node that runs modules is.
    let modules = if std::env::var("ANODE_BENCH_WORKERS_MODULES").is_ok_and(|m| m == "1") {
        format!("[modules]\nadmin_key = \"{}\"\n", id(9).public())
    } else {
        String::new()
    };
    let mut rigs = vec![
        Rig::start(dir, mode, t0, "io-on", &format!("\n{modules}"), true),
        Rig::start(dir, mode, t0, "io-on-2-workers", &format!("workers = 2\n{modules}"), true),
    ];
    if let Ok(io) = std::env::var("ANODE_BENCH_WORKERS_EXTRA") {
        // A third rig: two workers with more `[io]` settings (`spin_us = 0`, say).
        rigs.push(Rig::start(dir, mode, t0, "io-on-2-workers-extra", &format!("workers = 2\n{io}\n{modules}"), true));
    }
    let title = format!("Two workers against one, the generator paced (1400 B, security {})", mode_name(mode));
    sweep(rigs, 1400, "200000,300000,350000,400000,450000,500000", &title, (reps, window, t0), report);
}

/// Issue 15, transmit scheduling on against off with the generator paced
/// (`ANODE_BENCH_ONLY=pacing-sweep`): b unpaced and b with its link to c
/// paced far above what it forwards (as in [`datapath`]), encryption on,
/// at fixed offered rates around what b forwards, so that the generator
/// takes the same CPU in both trials of a rate and what b delivers past
/// saturation is what its own CPU allows. `ANODE_BENCH_SIZE` (default
/// 1400), `ANODE_BENCH_OFFER_PPS` (a comma list) and
/// `ANODE_BENCH_PACING_AA=1` (an A/A check: both rigs unpaced).
fn pacing_sweep(dir: &Path, reps: usize, window: Duration, report: &mut String) {
    let t0 = Instant::now();
    let size = env_num("ANODE_BENCH_SIZE", 1400.0) as usize;
    // `ANODE_BENCH_PACING_AA=1`: the second rig unpaced too, the same
    // node twice, to see what the harness alone makes of two rigs.
    let aa = std::env::var("ANODE_BENCH_PACING_AA").is_ok_and(|v| v == "1");
    let second = if aa {
        Rig::start(dir, Some(Mode::Encrypt), t0, "io-on-again", "", true)
    } else {
        Rig::start_with(dir, Some(Mode::Encrypt), t0, "io-on-paced", "", true, "rate_bps = 40000000000\n")
    };
    let rigs = vec![Rig::start(dir, Some(Mode::Encrypt), t0, "io-on", "", true), second];
    let default = if size < 700 { "500000,600000,700000,800000,900000" } else { "250000,300000,350000,400000" };
    let title = format!("Transmit scheduling on against off, the generator paced ({size} B, encrypted)");
    sweep(rigs, size, default, &title, (reps, window, t0), report);
}

/// Trials of `rigs` at each offered rate of `ANODE_BENCH_OFFER_PPS` (or
/// `default`), alternated, and their table under `title` in `report`.
fn sweep(
    mut rigs: Vec<Rig>,
    size: usize,
    default: &str,
    title: &str,
    (reps, window, t0): (usize, Duration, Instant),
    report: &mut String,
) {
    let rates: Vec<f64> = std::env::var("ANODE_BENCH_OFFER_PPS")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    // (rate, rig) -> trials of (delivered, offered, µs per packet).
    let mut res = vec![vec![Vec::new(); rigs.len()]; rates.len()];
    for rep in 0..reps {
        for (ri, rate) in rates.iter().enumerate() {
            for k in 0..rigs.len() {
                let g = (k + rep + ri) % rigs.len();
                rigs[g].offer_pps = Some(*rate);
                let fwd = |r: &Rig| match &r.b {
                    Forwarder::Node(d) => d.status()["packets"]["plain_forwarded"].as_u64().unwrap_or(0),
                    _ => 0,
                };
                let f0 = fwd(&rigs[g]);
                let (got, us) = rigs[g].trial(size, 0, window, t0);
                let f1 = fwd(&rigs[g]);
                eprintln!("  b forwarded {} datagrams in the trial", f1.saturating_sub(f0));
                let offered = rigs[g].offered;
                eprintln!(
                    "  rep {rep} offer {rate:.0} {}: {got:.0} pkt/s ({offered:.0} offered), {us:.2} µs/pkt",
                    rigs[g].label
                );
                res[ri][g].push((got, offered, us));
            }
        }
    }
    report_io(&rigs, report);
    let _ = writeln!(report, "\n## {title}\n");
    let _ = writeln!(report, "Medians over {reps} trials per cell; b's CPU in cores = pkt/s × µs per packet.\n");
    let _ = writeln!(
        report,
        "| offered (target) | forwarder | offered pkt/s | pkt/s at sink | delivered / offered | CPU µs per packet | b's CPU, cores | pkt/s / first rig's |"
    );
    let _ = writeln!(report, "|---:|---|---:|---:|---:|---:|---:|---:|");
    for (ri, rate) in rates.iter().enumerate() {
        let first = res[ri].first().map_or(f64::NAN, |t| median(&t.iter().map(|x| x.0).collect::<Vec<_>>()));
        for (g, r) in rigs.iter().enumerate() {
            let t = &res[ri][g];
            let got = median(&t.iter().map(|x| x.0).collect::<Vec<_>>());
            let off = median(&t.iter().map(|x| x.1).collect::<Vec<_>>());
            let us = median(&t.iter().map(|x| x.2).collect::<Vec<_>>());
            let _ = writeln!(
                report,
                "| {rate:.0} | {} | {off:.0} | {got:.0} | {:.3} | {us:.2} | {:.2} | {:.3} |",
                r.label,
                got / off,
                got * us / 1e6,
                got / first
            );
        }
    }
    rigs.clear();
}

/// Each node rig's `io` counters (GSO, GRO, workers), for the report.
fn report_io(rigs: &[Rig], report: &mut String) {
    for r in rigs {
        if let Forwarder::Node(d) = &r.b {
            let _ = writeln!(report, "\n`{}` io counters: {}", r.label, d.status()["io"]);
        }
    }
}

/// Trials of `rigs` alternated, `reps` times at each size (`pads`: what each
/// rig's generator adds to a datagram), and their table in `report`.
fn compare(mut rigs: Vec<Rig>, pads: Vec<usize>, reps: usize, window: Duration, t0: Instant, report: &mut String) {
    let mut res = vec![vec![(Vec::new(), Vec::new(), Vec::new()); SIZES.len()]; rigs.len()];
    for rep in 0..reps {
        for (si, size) in SIZES.iter().enumerate() {
            for k in 0..rigs.len() {
                let ri = (k + rep) % rigs.len();
                let (rate, us) = rigs[ri].trial(*size, pads[ri], window, t0);
                let offered = rigs[ri].offered;
                eprintln!(
                    "  rep {rep} {size} B {}: {rate:.0} pkt/s ({offered:.0} offered), {us:.2} µs/pkt",
                    rigs[ri].label
                );
                res[ri][si].0.push(rate);
                res[ri][si].1.push(us);
                res[ri][si].2.push(offered);
            }
        }
    }
    report_io(&rigs, report);
    let _ = writeln!(report, "\n## Data path: through b with encryption, GSO runs in, GRO at the sink\n");
    let _ = writeln!(
        report,
        "Medians over {reps} trials per cell; offered = datagrams/s the generator handed to the kernel.\n"
    );
    let _ = writeln!(
        report,
        "| size | forwarder | pkt/s at sink | offered pkt/s | CPU µs per packet | CPU per packet / relay's |"
    );
    let _ = writeln!(report, "|---:|---|---:|---:|---:|---:|");
    let relay = rigs.iter().position(|r| r.label == "relay").unwrap_or(0);
    for (si, size) in SIZES.iter().enumerate() {
        let relay_us = median(&res[relay][si].1);
        for (ri, r) in rigs.iter().enumerate() {
            let (rate, us, off) = (median(&res[ri][si].0), median(&res[ri][si].1), median(&res[ri][si].2));
            if us.is_nan() {
                let _ = writeln!(report, "| {size} | {} | {rate:.0} | {off:.0} | n/a | n/a |", r.label);
                continue;
            }
            let _ =
                writeln!(report, "| {size} | {} | {rate:.0} | {off:.0} | {us:.2} | {:.3} |", r.label, us / relay_us);
        }
    }
    rigs.clear();
}

fn ping_packet(size: usize, seq: u32) -> Vec<u8> {
    let mut text: String =
        PING_S.lines().filter(|l| !l.trim_start().starts_with(".stack")).flat_map(|l| [l, "\n"]).collect();
    let mut payload = vec![0u8; size.saturating_sub(8 + 68).max(4)];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
    let _ = writeln!(text, ".stack 0, {REPLY_PORT}, blob 0x{hex}");
    let mut r = asm::assemble(&text).expect("ping");
    r.src = ad(1);
    r.dst = ad(3);
    r.resource_bound = 16;
    r.port = REPLY_PORT;
    r.to_bytes().expect("ping bytes")
}

fn latency(dir: &Path, pings: usize, report: &mut String) {
    // One line a – b – c of daemons per mode.
    let mut lines = Vec::new();
    for m in MODES {
        let tag = format!("line-{}", mode_name(m));
        let d = dir.join(&tag);
        let e = free_addrs(4);
        let keys: Vec<PathBuf> = (1..=3).map(|n| write_key(&d.join("keys"), &format!("n{n}"), &id(n))).collect();
        let k = |n: u8| m.map(|_| id(n));
        let cfgs = [
            format!(
                "address = \"10.0.0.1\"\nrun_dir = \"{}\"\n{}",
                d.join("a/run").display(),
                iface("e", e[0], ad(2), e[1], k(2).as_ref())
            ),
            format!(
                "address = \"10.0.0.2\"\nrun_dir = \"{}\"\n{}{}",
                d.join("b/run").display(),
                iface("w", e[1], ad(1), e[0], k(1).as_ref()),
                iface("e", e[2], ad(3), e[3], k(3).as_ref())
            ),
            format!(
                "address = \"10.0.0.3\"\nrun_dir = \"{}\"\n{}",
                d.join("c/run").display(),
                iface("w", e[3], ad(2), e[2], k(2).as_ref())
            ),
        ];
        let mut ds = Vec::new();
        for (i, c) in cfgs.iter().enumerate() {
            let mut c = c.clone();
            c += "[routes]\n";
            c += match i {
                0 => "static = [{ dest = \"10.0.0.3\", via = \"10.0.0.2\" }]\n",
                2 => "static = [{ dest = \"10.0.0.1\", via = \"10.0.0.2\" }]\n",
                _ => "",
            };
            c += &security(m, &keys[i]);
            ds.push(Daemon::start(&d, ["a", "b", "c"][i], &c));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ds.iter().all(Daemon::links_up) {
            assert!(Instant::now() < deadline, "{tag}: links did not come up");
            thread::sleep(Duration::from_millis(20));
        }
        let mut client = Client::connect(&ds[0].run_dir).expect("client");
        client.register(REPLY_PORT).expect("register");
        lines.push((ds, client));
    }
    let mut rtts = vec![vec![Vec::new(); SIZES.len()]; MODES.len()];
    let mut lost = vec![0usize; MODES.len()];
    for i in 0..pings {
        for (si, size) in SIZES.iter().enumerate() {
            for k in 0..MODES.len() {
                let mi = (k + i) % MODES.len();
                let c = &mut lines[mi].1;
                let p = ping_packet(*size, i as u32);
                let t = Instant::now();
                c.inject(&p).expect("inject");
                match c.recv(Duration::from_secs(1)) {
                    Ok(Some(_)) => rtts[mi][si].push(t.elapsed().as_secs_f64() * 1e6),
                    _ => lost[mi] += 1,
                }
                thread::sleep(Duration::from_micros(200));
            }
        }
    }
    let _ = writeln!(report, "\n## SNAP ping RTT over a – b – c (four protected hops per round trip)\n");
    let _ = writeln!(report, "| size | off µs | authenticate µs | encrypt µs | auth / off | encrypt / off |");
    let _ = writeln!(report, "|---:|---:|---:|---:|---:|---:|");
    for (si, size) in SIZES.iter().enumerate() {
        let m: Vec<f64> = (0..3).map(|k| median(&rtts[k][si])).collect();
        let _ = writeln!(
            report,
            "| {size} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} |",
            m[0],
            m[1],
            m[2],
            m[1] / m[0],
            m[2] / m[0]
        );
    }
    let _ = writeln!(report, "\nlost: off {}, authenticate {}, encrypt {}", lost[0], lost[1], lost[2]);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("secure: bench");
        return;
    }
    if let Ok(to) = std::env::var(relay::ENV) {
        let input = UdpSocket::bind("127.0.0.1:0").expect("relay input");
        let output = UdpSocket::bind("127.0.0.1:0").expect("relay output");
        for s in [&input, &output] {
            let _ = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
            let _ = nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::SndBuf, &(4 << 20));
        }
        relay::main(&to, input, output);
    }
    let only = std::env::var("ANODE_BENCH_ONLY").unwrap_or_else(|_| "throughput,latency".into());
    let wants = |p: &str| only.split(',').any(|o| o.trim() == p);
    let quick = std::env::var("ANODE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
        || !std::env::args().any(|a| a == "--bench");
    let reps = if quick { 1 } else { env_num("ANODE_BENCH_REPS", 6.0) as usize };
    let window = Duration::from_secs_f64(if quick { 0.3 } else { env_num("ANODE_BENCH_TRIAL_S", 2.0) });
    let pings = if quick { 20 } else { env_num("ANODE_BENCH_PINGS", 1000.0) as usize };
    let dir = std::env::temp_dir().join(format!("anode-bench-sec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut report =
        format!("# SANE benchmark ({} reps, {:.1} s windows, {pings} pings)\n", reps, window.as_secs_f64());
    if wants("throughput") {
        throughput(&dir, reps, window, &mut report);
    }
    if wants("datapath") || wants("pacing") {
        datapath(&dir, reps, window, &mut report, !wants("datapath"));
    }
    if wants("workers") {
        workers_sweep(&dir, reps, window, &mut report);
    }
    if wants("pacing-sweep") {
        pacing_sweep(&dir, reps, window, &mut report);
    }
    if wants("latency") {
        latency(&dir, pings, &mut report);
    }
    println!("{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
