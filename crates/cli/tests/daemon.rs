//! Real `anode node` daemons on loopback: a three-node line pings through
//! the middle node, survives its restart, counts bad input, reports config
//! errors, and shuts down cleanly on SIGTERM.
//!
//! Every test uses its own ports (bound to port 0 first, then released) and
//! its own temporary directory, so the tests run in parallel.

mod common;

use anode_daemon::{self as daemon, APP_SOCKET, CONTROL_SOCKET};
use anode_snap::asm;
use anode_snap::value::Value as SnapValue;
use anode_wire::local::{Reply, Request};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_anode")
}

fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

/// A temporary directory removed at drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "anode-t{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` UDP ports free right now on 127.0.0.1.
use common::free_ports;

/// A running daemon, killed at drop if still alive.
struct Daemon {
    child: Child,
    config: PathBuf,
    run_dir: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(config: &Path) -> Daemon {
        let dir = config.parent().expect("dir");
        let log = dir.join("node.log");
        let err = std::fs::File::create(&log).expect("log");
        let child = Command::new(bin())
            .args(["node", "--log", "info", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn anode node");
        let mut d = Daemon { child, config: config.to_path_buf(), run_dir: dir.join("run"), log };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("node {} exited early ({st}):\n{}", self.config.display(), self.log_text());
            }
            if daemon::query(&self.run_dir, "status", TIMEOUT).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("node {} not ready:\n{}", self.config.display(), self.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn status(&self) -> Value {
        let s = daemon::query(&self.run_dir, "status", TIMEOUT).expect("status");
        serde_json::from_str(&s).expect("status JSON")
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).expect("kill");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "node did not exit:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Three nodes in a line 10.0.0.1 — 10.0.0.2 — 10.0.0.3 with a shared
/// topology file. `extra[i]` is appended to node i+1's config.
struct Line {
    /// Removed when the line is dropped.
    _dir: TempDir,
    /// UDP listen ports: n1 east, n2 west, n2 east, n3 west.
    ports: Vec<u16>,
    configs: Vec<PathBuf>,
}

impl Line {
    fn new(tag: &str, extra: [&str; 3]) -> Line {
        let dir = TempDir::new(tag);
        let p = free_ports(4);
        std::fs::write(
            dir.0.join("topology.toml"),
            "node = [{ name = \"n1\", address = \"10.0.0.1\" }, { name = \"n2\", address = \"10.0.0.2\" },\n\
                     { name = \"n3\", address = \"10.0.0.3\" }]\n\
             link = [{ a = \"n1\", b = \"n2\" }, { a = \"n2\", b = \"n3\" }]\n",
        )
        .expect("topology");
        let ifaces = common::line3_interfaces(&p);
        let mut configs = Vec::new();
        for (i, iface) in ifaces.iter().enumerate() {
            let nd = dir.0.join(format!("n{}", i + 1));
            std::fs::create_dir_all(&nd).expect("node dir");
            let cfg = nd.join("node.toml");
            let text = format!(
                "address = \"10.0.0.{}\"\nrun_dir = \"run\"\n{}\n{iface}[routes]\ntopology = \"../topology.toml\"\n",
                i + 1,
                extra[i]
            );
            std::fs::write(&cfg, text).expect("config");
            configs.push(cfg);
        }
        Line { _dir: dir, ports: p, configs }
    }

    fn start(&self) -> Vec<Daemon> {
        self.configs.iter().map(|c| Daemon::start(c)).collect()
    }
}

/// A raw local-API client: its own `SOCK_SEQPACKET` connection to the
/// node's app.sock, sending any bytes it is given.
struct Client {
    sock: std::os::fd::OwnedFd,
}

impl Client {
    fn new(node: &Daemon) -> Client {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, setsockopt, socket, sockopt};
        let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).expect("socket");
        let addr = UnixAddr::new(&node.run_dir.join(APP_SOCKET)).expect("address");
        connect(sock.as_raw_fd(), &addr).expect("connect");
        let t = nix::sys::time::TimeVal::new(TIMEOUT.as_secs() as i64, 0);
        setsockopt(&sock, sockopt::ReceiveTimeout, &t).expect("timeout");
        Client { sock }
    }

    fn send_raw(&self, b: &[u8]) {
        nix::sys::socket::send(self.sock.as_raw_fd(), b, nix::sys::socket::MsgFlags::MSG_NOSIGNAL).expect("send");
    }

    fn send(&self, r: &Request<'_>) {
        self.send_raw(&r.encode());
    }

    fn recv(&self) -> Vec<u8> {
        let mut b = vec![0; 70_000];
        let n = nix::sys::socket::recv(self.sock.as_raw_fd(), &mut b, nix::sys::socket::MsgFlags::empty())
            .expect("reply within the timeout");
        b.truncate(n);
        b
    }

    /// Sends a request and returns its reply (OK, INFO or ERROR).
    fn call(&self, r: &Request<'_>) -> Vec<u8> {
        self.send(r);
        self.recv()
    }

    /// Waits for a DELIVER to `port`; returns its payload.
    fn delivery(&self, port: u16) -> Vec<u8> {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            let m = self.recv();
            if let Ok(Reply::Deliver { port: p, payload }) = Reply::decode(&m)
                && p == port
            {
                return payload.to_vec();
            }
        }
        panic!("no delivery to port {port} within {TIMEOUT:?}");
    }
}

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/snap").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The Fig. 1 ping from `src` to `dst`, replying to `port`.
fn ping_packet(src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut r = asm::assemble(&example("ping.s")).expect("ping.s assembles");
    let old = SnapValue::int(i32::from(r.port)).0;
    for w in r.stack.iter_mut().filter(|w| **w == old) {
        *w = SnapValue::int(i32::from(port)).0;
    }
    r.port = port;
    r.src = src;
    r.dst = dst;
    r.to_bytes().expect("ping packet")
}

fn ping(c: &Client, port: u16) {
    let pkt = ping_packet(addr(1), addr(3), port);
    let reply = c.call(&Request::Inject(&pkt));
    assert_eq!(Reply::decode(&reply), Ok(Reply::Ok));
    assert_eq!(c.delivery(port), b"ping");
}

fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[*k],
    })
}

fn count(v: &Value, path: &[&str]) -> u64 {
    get(v, path).as_u64().unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

/// Polls node status until `cond` holds.
fn wait_status(d: &Daemon, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let v = d.status();
        if cond(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {v:#}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn ping_through_three_daemons_and_a_restarted_middle() {
    let line = Line::new("ping", ["", "metrics = \"127.0.0.1:0\"", ""]);
    let mut nodes = line.start();
    let c = Client::new(&nodes[0]);

    let info = c.call(&Request::Hello);
    assert_eq!(Reply::decode(&info), Ok(Reply::Info { address: addr(1), mtu: 1400 }));
    assert_eq!(Reply::decode(&c.call(&Request::Register(4242))), Ok(Reply::Ok));
    ping(&c, 4242);

    let s2 = wait_status(&nodes[1], "node 2 forwarding twice", |v| count(v, &["packets", "snap_forwarded"]) == 2);
    assert_eq!(count(&s2, &["packets", "rx_snap"]), 2);
    assert_eq!(get(&s2, &["address"]), "10.0.0.2");
    assert_eq!(count(&s2, &["interfaces", "0", "rx_packets"]) + count(&s2, &["interfaces", "1", "rx_packets"]), 2);
    assert_eq!(s2["interfaces"][0]["listen"], format!("127.0.0.1:{}", line.ports[1]));
    assert_eq!(s2["interfaces"][1]["tx_packets"], 1);
    let s1 = nodes[0].status();
    assert_eq!(count(&s1, &["packets", "injected"]), 1);
    assert_eq!(count(&s1, &["packets", "delivered"]), 1);
    assert_eq!(s1["local"]["ports"], serde_json::json!([4242]));

    // Prometheus, over the control socket and over HTTP.
    let m = daemon::query(&nodes[1].run_dir, "metrics", TIMEOUT).expect("metrics");
    assert!(m.contains("anode_packets_total{kind=\"snap_forwarded\"} 2"), "{m}");
    let maddr: SocketAddr = s2["metrics"].as_str().expect("metrics address").parse().expect("addr");
    let http = |req: &str| {
        let mut t = TcpStream::connect(maddr).expect("connect metrics");
        t.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        t.write_all(req.as_bytes()).expect("write");
        let mut s = String::new();
        t.read_to_string(&mut s).expect("read");
        s
    };
    let ok = http("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("anode_packets_total{kind=\"snap_forwarded\"} 2"), "{ok}");
    assert!(http("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));

    // `anode status`, as a person reads it.
    let out = Command::new(bin()).args(["status", "--config"]).arg(&line.configs[1]).output().expect("anode status");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("node 10.0.0.2"), "{table}");
    assert!(table.contains("snap_forwarded"), "{table}");
    assert!(table.contains(&format!("127.0.0.1:{}", line.ports[2])), "{table}");

    // Restart the middle node: the line works again.
    assert!(nodes[1].stop().success());
    nodes[1] = Daemon::start(&line.configs[1]);
    ping(&c, 4242);
    let s2 = wait_status(&nodes[1], "restarted node 2 forwarding", |v| count(v, &["packets", "snap_forwarded"]) == 2);
    assert_eq!(count(&s2, &["packets", "rx_snap"]), 2, "counters start afresh");

    // A client that goes away loses its port at once; a delivery to it
    // then finds no listener.
    let gone = Client::new(&nodes[0]);
    assert_eq!(Reply::decode(&gone.call(&Request::Register(5000))), Ok(Reply::Ok));
    drop(gone);
    let s1 = wait_status(&nodes[0], "client gone", |v| count(v, &["local", "clients_gone"]) == 1);
    assert_eq!(s1["local"]["ports"], serde_json::json!([4242]));
    let pkt = ping_packet(addr(1), addr(3), 5000);
    assert_eq!(Reply::decode(&c.call(&Request::Inject(&pkt))), Ok(Reply::Ok));
    wait_status(&nodes[0], "no listener", |v| count(v, &["drops", "no_listener"]) == 1);
    ping(&c, 4242);

    for n in &mut nodes {
        assert!(n.stop().success());
    }
}

#[test]
fn bad_input_is_counted_and_the_line_still_works() {
    let line = Line::new("bad", ["", "", ""]);
    let nodes = line.start();
    let n2: SocketAddr = format!("127.0.0.1:{}", line.ports[1]).parse().expect("addr");
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut sent = 0u64;
    let rx = |v: &Value| count(v, &["interfaces", "0", "rx_packets"]);
    let mut send = |b: &[u8]| {
        s.send_to(b, n2).expect("send");
        sent += 1;
        // Let the node catch up now and then, so no socket buffer overflows.
        if sent.is_multiple_of(50) {
            wait_status(&nodes[1], "node 2 reading", |v| rx(v) == sent);
        }
    };
    // Random datagrams (deterministic), all but impossible to be valid ANEP.
    let mut x: u32 = 0x1234_5678;
    for i in 0..200 {
        let len = 1 + i % 300;
        let b: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        send(&b);
    }
    let snap = |p: &[u8]| anode_node::anep::frame(0x80, anode_node::anep::TYPE_SNAP, p);
    let good = snap(&ping_packet(addr(1), addr(3), 7));
    for cut in [0, 1, 5, 7] {
        send(&good[..cut]); // truncated ANEP header
    }
    let mut long = good.clone();
    long.push(0);
    send(&long); // packet length disagrees with the datagram
    send(&good[..good.len() - 1]);
    let mut v2 = good.clone();
    v2[0] = 2;
    send(&v2); // unknown version
    send(&anode_node::anep::frame(0x80, 0x7777, b"what is this")); // unknown type, discard flag set
    // SNAP packets that fault at node 2.
    let faulting = [
        example("bad_backward.s"),
        ".src 10.0.0.1\n.dst 10.0.0.3\n.rb 4\npop\nexit\n".to_string(),
        ".src 10.0.0.1\n.dst 10.0.0.3\n.rb 4\npush 1\npush 0\ndiv\nexit\n".to_string(),
    ];
    for src in &faulting {
        let r = asm::assemble(src).expect("assembles");
        send(&snap(&r.to_bytes().expect("bytes")));
    }
    send(&snap(b"\x00\x01garbage that is not a SNAP packet"));

    let v = wait_status(&nodes[1], "all bad input counted", |v| rx(v) == sent);
    let drops = &v["drops"];
    let total_drops: u64 = drops.as_object().expect("drops").values().filter_map(Value::as_u64).sum();
    assert_eq!(total_drops, sent, "every bad datagram is dropped and counted: {v:#}");
    assert!(count(drops, &["anep_truncated"]) >= 4, "{v:#}");
    assert!(count(drops, &["anep_bad_length"]) >= 2, "{v:#}");
    assert!(count(drops, &["anep_bad_version"]) >= 1, "{v:#}");
    assert!(count(drops, &["unknown_type"]) >= 1, "{v:#}");
    assert_eq!(count(drops, &["vm_fault"]), 4, "{v:#}");
    let faults = &v["vm_faults"];
    assert_eq!(count(faults, &["backward_branch"]), 1, "{v:#}");
    assert_eq!(count(faults, &["stack_underflow"]), 1, "{v:#}");
    assert_eq!(count(faults, &["divide_by_zero"]), 1, "{v:#}");
    assert_eq!(count(faults, &["wire"]), 1, "{v:#}");
    assert_eq!(count(&v, &["packets", "snap_forwarded"]), 0);

    // Bad requests on the application socket get ERROR replies.
    let c = Client::new(&nodes[0]);
    for bad in [&[0x09][..], &[0x02, 1], &[0x01, 0]] {
        c.send_raw(bad);
        assert!(matches!(Reply::decode(&c.recv()), Ok(Reply::Error(_))), "{bad:?}");
    }
    // An empty message cannot be told from the end of the connection: the
    // node closes it.
    let e = Client::new(&nodes[0]);
    e.send_raw(&[]);
    assert!(e.recv().is_empty(), "closed");
    let r = c.call(&Request::Inject(b"not a packet"));
    assert!(matches!(Reply::decode(&r), Ok(Reply::Error(e)) if e.contains("faulted")), "{r:?}");

    // The line still works; the drops were logged (at a bounded rate).
    assert_eq!(Reply::decode(&c.call(&Request::Register(7))), Ok(Reply::Ok));
    ping(&c, 7);
    let log = nodes[1].log_text();
    assert!(log.contains("dropped packets"), "{log}");
    let warn_lines = log.lines().filter(|l| l.contains("dropped packets")).count();
    assert!(warn_lines <= 2 * anode_node::counters::N_DROPS, "drop logging is rate limited: {log}");
}

fn run_node(config: &Path) -> (ExitStatus, String) {
    let out = Command::new(bin())
        .args(["node", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .expect("run anode node");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn config_errors_are_reported() {
    let dir = TempDir::new("cfg");
    // Hold the port for the whole test: a port only picked as free could be
    // taken by a test running beside this one before the bind below.
    let hold = UdpSocket::bind(("127.0.0.1", 0)).expect("hold a port");
    let ports = [hold.local_addr().expect("held port").port()];
    let good = format!(
        "address = \"10.0.0.1\"\nrun_dir = \"run\"\n[[interface]]\nname = \"east\"\nlisten = \"127.0.0.1:{}\"\n\
         neighbors = [{{ address = \"10.0.0.2\", endpoint = \"127.0.0.1:9\" }}]\n",
        ports[0]
    );
    let cases = [
        ("syntax.toml", "address = \"10.0.0.1\n".to_string(), "syntax.toml", "invalid"),
        ("unknown.toml", format!("bogus = 1\n{good}"), "unknown.toml", "unknown field `bogus`"),
        (
            "via.toml",
            format!("{good}[routes]\nstatic = [{{ dest = \"10.0.0.9\", via = \"10.0.0.5\" }}]\n"),
            "via.toml",
            "goes via 10.0.0.5, which is not a neighbour",
        ),
        (
            "topo.toml",
            format!("{good}[routes]\ntopology = \"missing-topology.toml\"\n"),
            "missing-topology.toml",
            "cannot read",
        ),
    ];
    for (name, text, file, msg) in cases {
        let p = dir.0.join(name);
        std::fs::write(&p, text).expect("write");
        let (st, err) = run_node(&p);
        assert_eq!(st.code(), Some(2), "{name}: {err}");
        assert!(err.contains(file) && err.contains(msg), "{name}: expected {file:?} and {msg:?} in:\n{err}");
    }
    let (st, err) = run_node(&dir.0.join("absent.toml"));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("absent.toml"), "{err}");

    // A port in use names the interface and the address.
    let p = dir.0.join("inuse.toml");
    std::fs::write(&p, &good).expect("write");
    let (st, err) = run_node(&p);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("interface \"east\"") && err.contains(&format!("127.0.0.1:{}", ports[0])), "{err}");
    assert!(err.to_lowercase().contains("in use"), "{err}");
    drop(hold);
    assert!(!dir.0.join("run").join(APP_SOCKET).exists(), "no sockets left behind");
}

#[test]
fn sigterm_and_sigint_stop_cleanly() {
    for sig in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        let dir = TempDir::new("sig");
        let ports = free_ports(1);
        let cfg = dir.0.join("node.toml");
        std::fs::write(
            &cfg,
            format!(
                "address = \"10.0.0.1\"\nrun_dir = \"run\"\n[[interface]]\nname = \"lo\"\nlisten = \"127.0.0.1:{}\"\n",
                ports[0]
            ),
        )
        .expect("write");
        let mut d = Daemon::start(&cfg);
        let run = dir.0.join("run");
        assert!(run.join(APP_SOCKET).exists() && run.join(CONTROL_SOCKET).exists());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&run).expect("run dir").permissions());
        assert_eq!(mode & 0o777, 0o700, "run dir is private");
        // A second node on the same run directory refuses to start.
        let other = dir.0.join("other.toml");
        std::fs::write(
            &other,
            format!(
                "address = \"10.0.0.1\"\nrun_dir = \"run\"\n[[interface]]\nname = \"lo\"\nlisten = \"127.0.0.1:{}\"\n",
                free_ports(1)[0]
            ),
        )
        .expect("write");
        let (st, err) = run_node(&other);
        assert_eq!(st.code(), Some(1));
        assert!(err.contains("already running"), "{err}");

        d.signal(sig);
        let st = d.wait_exit();
        assert!(st.success(), "{sig:?}: {st}\n{}", d.log_text());
        assert!(!run.join(APP_SOCKET).exists(), "app socket removed");
        assert!(!run.join(CONTROL_SOCKET).exists(), "control socket removed");
        let log = d.log_text();
        assert!(log.contains("shutting down") && log.contains("final counters"), "{log}");
    }
}

#[test]
fn stale_sockets_are_replaced() {
    let dir = TempDir::new("stale");
    let run = dir.0.join("run");
    std::fs::create_dir_all(&run).expect("run");
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("mode");
    // Sockets left by a node that died: bound, then closed.
    drop(std::os::unix::net::UnixDatagram::bind(run.join(APP_SOCKET)).expect("stale app"));
    drop(std::os::unix::net::UnixListener::bind(run.join(CONTROL_SOCKET)).expect("stale control"));
    let cfg = dir.0.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "address = \"10.0.0.1\"\nrun_dir = \"run\"\n[[interface]]\nname = \"lo\"\nlisten = \"127.0.0.1:{}\"\n",
            free_ports(1)[0]
        ),
    )
    .expect("write");
    let mut d = Daemon::start(&cfg);
    assert_eq!(d.status()["address"], "10.0.0.1");
    assert!(d.stop().success());
}
