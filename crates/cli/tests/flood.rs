//! Issue 4's flood: three real `anode node` daemons in a line
//! 10.0.0.1 (a) — 10.0.0.2 (b) — 10.0.0.3 (c) on loopback. A flooder
//! thread sends 1,000,000 hostile datagrams to b's interface that faces a,
//! cycling through a fixed set of kinds (random bytes, broken ANEP headers,
//! unknown types, plain packets that cannot go on, SNAP packets that fault
//! in many ways), while the main thread pings c from a through a's
//! application socket (the Fig. 1 ping of `examples/snap/ping.s`).
//!
//! Checked: every ping is answered; b counts every hostile datagram under
//! exactly the drop reason (and VM fault kind) expected of its kind; b's
//! resident memory stays flat; b's drop logging stays rate limited.
//!
//! The flooder paces itself on b's socket receive queue (`rx_queue` of
//! `/proc/net/udp`), so the kernel buffer never overflows: the point is
//! what the daemon does with what it receives, and with no kernel drops the
//! test can demand that b's counters account for every datagram sent.
//! Nothing here asserts a timing; the figures go to stderr
//! (`cargo test --test flood -- --nocapture`).

mod common;

use anode_daemon as daemon;
use anode_daemon::client::Client;
use anode_node::anep::{self, FLAG_DISCARD_UNKNOWN, TYPE_AUTH, TYPE_CAPSULE, TYPE_PLAIN, TYPE_SNAP};
use anode_snap::asm;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");
/// Hostile datagrams sent (issue 4: "a flood of 1,000,000").
const FLOOD: u64 = 1_000_000;
/// Datagrams after which b counts as warmed up (first memory sample).
const WARM_UP: u64 = 50_000;
/// Pings that must be answered while the flood runs, at least.
const MIN_PINGS: u32 = 50;
/// How long one ping waits for its reply.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between pings.
const PING_GAP: Duration = Duration::from_millis(20);
/// Most resident-memory growth of b between warm-up and the end.
const MAX_RSS_GROWTH_KB: u64 = 2048;
/// The flooder looks at b's receive queue every this many datagrams.
const PACE_EVERY: u64 = 256;
/// The application port the pings reply to.
const PING_PORT: u16 = 4242;
/// How long to wait for daemons to start, and for b to catch up.
const WAIT: Duration = Duration::from_secs(20);

/// Three daemons in a line, each with its run directory and log file in a
/// fresh temporary directory; dropping it kills them (printing their logs
/// if the test failed) and removes the directory.
struct Line {
    dir: PathBuf,
    nodes: Vec<Child>,
    /// b's UDP port facing a.
    b_west: u16,
}

impl Line {
    fn start() -> Line {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "anode-flood-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ports = common::free_ports(4);
        let bw = ports[1];
        let ifaces = common::line3_interfaces(&ports);
        // b has no default route: unknown types and plain packets to
        // unknown destinations end at b.
        let routes = ["[routes]\ndefault_via = \"10.0.0.2\"\n", "", "[routes]\ndefault_via = \"10.0.0.2\"\n"];
        let configs: Vec<String> = (0..3)
            .map(|i| {
                let run = dir.join(Line::name(i));
                format!("address = \"10.0.0.{}\"\nrun_dir = \"{}\"\n{}{}", i + 1, run.display(), ifaces[i], routes[i])
            })
            .collect();
        let mut line = Line { dir: dir.clone(), nodes: Vec::new(), b_west: bw };
        for (name, cfg) in ["a", "b", "c"].iter().zip(&configs) {
            let file = dir.join(format!("{name}.toml"));
            std::fs::write(&file, cfg).expect("config");
            let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
            let child = Command::new(ANODE)
                .args(["node", "--log", "info", "--config"])
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start anode node");
            line.nodes.push(child);
        }
        for i in 0..3 {
            line.wait_ready(i);
        }
        line
    }

    fn name(i: usize) -> &'static str {
        ["a", "b", "c"][i]
    }

    fn run_dir(&self, i: usize) -> PathBuf {
        self.dir.join(Line::name(i))
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", Line::name(i)))
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + WAIT;
        loop {
            if daemon::query(&self.run_dir(i), "status", WAIT).is_ok() {
                return;
            }
            if let Ok(Some(st)) = self.nodes[i].try_wait() {
                panic!("node {} exited with {st}:\n{}", Line::name(i), self.log(i));
            }
            assert!(Instant::now() < deadline, "node {} not ready:\n{}", Line::name(i), self.log(i));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn status(&self, i: usize) -> Value {
        let s = daemon::query(&self.run_dir(i), "status", WAIT).expect("status");
        serde_json::from_str(&s).expect("status JSON")
    }

    fn pid(&self, i: usize) -> u32 {
        self.nodes[i].id()
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for i in 0..3 {
                let log = self.log(i);
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                eprintln!("--- node {} log (last lines) ---", Line::name(i));
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One kind of hostile datagram and what b must make of it.
struct Kind {
    name: String,
    bytes: Vec<u8>,
    /// The drop reason b counts it under.
    reason: &'static str,
    /// For `vm_fault`: the fault kind.
    fault: Option<&'static str>,
}

fn kind(name: impl Into<String>, bytes: Vec<u8>, reason: &'static str) -> Kind {
    Kind { name: name.into(), bytes, reason, fault: None }
}

fn example(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/snap").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A SNAP packet assembled from `src`, framed in ANEP.
fn snap(src: &str) -> Vec<u8> {
    let r = asm::assemble(src).unwrap_or_else(|e| panic!("{e}:\n{src}"));
    anep::frame(FLAG_DISCARD_UNKNOWN, TYPE_SNAP, &r.to_bytes().expect("packet bytes"))
}

/// A plain packet (ANEP framed) to `dst` with `ttl`.
fn plain(dst: [u8; 4], ttl: u8, reserved: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::from(dst);
    p.extend_from_slice(&[10, 0, 0, 1, ttl, reserved, 0x1f, 0x90]);
    p.extend_from_slice(payload);
    anep::frame(FLAG_DISCARD_UNKNOWN, TYPE_PLAIN, &p)
}

/// The fixed set of hostile kinds the flooder cycles through. None of them
/// may leave b: each is dropped there, for the reason it names.
fn hostile_kinds() -> Vec<Kind> {
    let mut k = Vec::new();
    // Random bytes (deterministic xorshift), 1..=400 bytes. One that
    // happens to start with ANEP version 1 is drawn again, so that the
    // expected reason is known without re-implementing the parser:
    // shorter than 8 bytes is `anep_truncated`, else `anep_bad_version`.
    let mut x: u32 = 0x9e37_79b9;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    for i in 0..24 {
        let len = [1, 3, 7, 8, 9, 40, 123, 400][i % 8] + (next() % 8) as usize * (i % 8 / 4);
        let bytes = loop {
            let b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if b[0] != anep::VERSION {
                break b;
            }
        };
        let reason = if len < anep::HEADER_LEN { "anep_truncated" } else { "anep_bad_version" };
        k.push(kind(format!("random{i}"), bytes, reason));
    }

    // ANEP header trouble, around a good Fig. 1 ping.
    let good = snap(&example("ping.s"));
    for cut in [0, 1, 4, 7] {
        k.push(kind(format!("truncated{cut}"), good[..cut].to_vec(), "anep_truncated"));
    }
    let mut v = good.clone();
    v[0] = 2;
    k.push(kind("version2", v, "anep_bad_version"));
    let mut v = good.clone();
    v.push(0);
    k.push(kind("length_short_of_datagram", v, "anep_bad_length"));
    k.push(kind("length_beyond_datagram", good[..good.len() - 4].to_vec(), "anep_bad_length"));
    let mut v = good.clone();
    v[6..8].copy_from_slice(&0xffffu16.to_be_bytes());
    k.push(kind("length_65535", v, "anep_bad_length"));
    let mut v = good.clone();
    v[4..6].copy_from_slice(&1u16.to_be_bytes());
    k.push(kind("header_length_1", v, "anep_bad_length"));
    let mut v = good.clone();
    v[4..6].copy_from_slice(&0x4000u16.to_be_bytes());
    k.push(kind("header_length_beyond", v, "anep_bad_length"));
    // Options: one with the discard bit set, one of length 0.
    for (name, opt) in [("option_discard", [0x80, 0x01, 0, 1]), ("option_len0", [0x00, 0x01, 0, 0])] {
        let mut v = vec![anep::VERSION, FLAG_DISCARD_UNKNOWN, 0xa0, 0x01, 0, 3, 0, 0];
        v.extend_from_slice(&opt);
        v.extend_from_slice(&good[anep::HEADER_LEN..]);
        let n = v.len() as u16;
        v[6..8].copy_from_slice(&n.to_be_bytes());
        k.push(kind(name, v, "anep_bad_option"));
    }

    // Unknown type ids: with the discard flag; without it b has no
    // default route to pass them on to.
    for (t, flags) in [(0x7777, FLAG_DISCARD_UNKNOWN), (TYPE_CAPSULE, FLAG_DISCARD_UNKNOWN), (TYPE_AUTH, 0x80 | 0x01)] {
        k.push(kind(format!("unknown_type_{t:#06x}"), anep::frame(flags, t, b"what is this"), "unknown_type"));
    }
    k.push(kind("unknown_type_no_default", anep::frame(0, 0x1234, b"pass me on?"), "unknown_type"));

    // Plain packets that cannot go on.
    k.push(kind("plain_ttl0", plain([10, 0, 0, 3], 0, 0, b"expired"), "ttl_exceeded"));
    k.push(kind("plain_reserved", plain([10, 0, 0, 3], 9, 1, b"x"), "plain_malformed"));
    k.push(kind("plain_short", anep::frame(FLAG_DISCARD_UNKNOWN, TYPE_PLAIN, &[10, 0, 0, 3, 10]), "plain_malformed"));
    k.push(kind("plain_no_route", plain([10, 9, 9, 9], 9, 0, b"nowhere"), "no_route"));
    k.push(kind("plain_no_listener", plain([10, 0, 0, 2], 9, 0, b"nobody"), "no_listener"));

    // SNAP packets that fault at b: every fault kind of the VM but
    // `stack_overflow` and `out_of_memory`, which no packet can reach
    // (crates/snap/tests/insns.rs, UNREACHABLE_FAULTS).
    let hdr = ".src 10.0.0.1\n.dst 10.0.0.3\n.rb 8\n";
    let big = "x".repeat(1500);
    let faulting: Vec<(&str, String, &'static str)> = vec![
        ("backward_paj", example("bad_backward.s"), "backward_branch"),
        ("stack_underflow", format!("{hdr}pop\nexit\n"), "stack_underflow"),
        ("divide_by_zero", format!("{hdr}push 1\npush 0\ndiv\nexit\n"), "divide_by_zero"),
        ("too_many_sends", example("bad_sends.s"), "too_many_sends"),
        ("rb0_on_arrival", ".src 10.0.0.1\n.dst 10.0.0.3\n.rb 0\nforw\nexit\n".into(), "resource_bound_exhausted"),
        ("invalid_opcode", format!("{hdr}.word 0x16000000\nexit\n"), "invalid_opcode"),
        ("type_mismatch", format!("{hdr}push 1\nforwto\nexit\n"), "type_mismatch"),
        ("branch_out_of_bounds", format!("{hdr}ji 100\nexit\n"), "branch_out_of_bounds"),
        ("unknown_service", format!("{hdr}calls \"no.such.service\"\nexit\n"), "unknown_service"),
        ("packet_too_large", format!("{hdr}push blob \"{big}\"\nforw\nexit\n"), "packet_too_large"),
        ("send_rb_too_large", format!("{hdr}push 0\npush 0\npush 100\nhere\nsend\n"), "resource_bound_exhausted"),
        ("invalid_immediate", format!("{hdr}.word 0x04000002\nexit\n"), "invalid_immediate"),
        ("heap_out_of_bounds", format!("{hdr}pushh 0\nexit\n"), "heap_out_of_bounds"),
        ("index_out_of_bounds", format!("{hdr}push blob \"ab\"\nbget 5\nexit\n"), "index_out_of_bounds"),
        ("mktup_too_close", format!("{hdr}push 1\npush 2\npush 3\nmktup 2\nmktup 1\nnop\n"), "mktup_too_close"),
        ("mktup_past_end", format!("{hdr}push 1\npush 2\nmktup 2\n"), "mktup_past_end"),
        ("bad_entry_point", format!("{hdr}push 99\npush 0\npush 1\nhere\nsend\n"), "bad_entry_point"),
        ("invalid_send_bound", format!("{hdr}push 0\npush 0\npush 0\nhere\nsend\n"), "invalid_send_bound"),
        ("bad_port", format!("{hdr}push 1\npush 70000\ndemux\n"), "bad_port"),
        ("service_failed", format!("{hdr}push 5\npush 1\npush 0\ncalls \"state.put\"\n"), "service_failed"),
    ];
    for (name, src, fault) in faulting {
        k.push(Kind { name: name.into(), bytes: snap(&src), reason: "vm_fault", fault: Some(fault) });
    }
    let garbage = anep::frame(FLAG_DISCARD_UNKNOWN, TYPE_SNAP, b"\x00\x01 not a SNAP packet at all");
    k.push(Kind { name: "snap_garbage".into(), bytes: garbage, reason: "vm_fault", fault: Some("wire") });
    k
}

/// b's UDP socket on `port` in `/proc/net/udp`: (bytes queued for
/// receiving, datagrams the kernel dropped).
fn udp_queue(port: u16) -> Option<(u64, u64)> {
    let t = std::fs::read_to_string("/proc/net/udp").ok()?;
    let local = format!("0100007F:{port:04X}");
    // With N workers b has N sockets on the port (SO_REUSEPORT) and the
    // kernel hashes the flood to one of them: the fullest queue, and the
    // drops of all.
    let mut found: Option<(u64, u64)> = None;
    for l in t.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&local.as_str()) {
            continue;
        }
        let rx_queue = u64::from_str_radix(f.get(4)?.split(':').nth(1)?, 16).ok()?;
        let drops: u64 = f.last()?.parse().ok()?;
        let (q, d) = found.unwrap_or((0, 0));
        found = Some((q.max(rx_queue), d + drops));
    }
    found
}

/// A `/proc/<pid>/status` field in kB (VmRSS, VmHWM).
fn proc_kb(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().strip_suffix(" kB")?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// What the flooder did.
#[derive(Debug, Default)]
struct FloodReport {
    sent: u64,
    per_kind: Vec<u64>,
    elapsed: Duration,
    /// b's VmRSS (kB) after [`WARM_UP`] datagrams.
    rss_warm_kb: u64,
    /// Times the flooder waited for b to drain its queue.
    waits: u64,
    /// Largest receive queue seen, in bytes.
    max_queue: u64,
}

/// Sends [`FLOOD`] hostile datagrams to `to`, cycling through `kinds`,
/// keeping b's receive queue under `queue_limit` bytes.
fn flood(kinds: &[Kind], to: u16, queue_limit: u64, b_pid: u32) -> FloodReport {
    let s = UdpSocket::bind("127.0.0.1:0").expect("flooder socket");
    let target = ("127.0.0.1", to);
    let mut r = FloodReport { per_kind: vec![0; kinds.len()], ..FloodReport::default() };
    let t0 = Instant::now();
    for i in 0..FLOOD {
        let k = (i % kinds.len() as u64) as usize;
        s.send_to(&kinds[k].bytes, target).expect("send to b");
        r.per_kind[k] += 1;
        r.sent += 1;
        let n = i + 1;
        if n.is_multiple_of(PACE_EVERY) {
            // Pace on b's receive queue: wait while it holds more than the
            // limit, until it is down to a quarter of it.
            let (mut q, _) = udp_queue(to).expect("b's socket in /proc/net/udp");
            r.max_queue = r.max_queue.max(q);
            if q > queue_limit {
                r.waits += 1;
                while q > queue_limit / 4 {
                    std::thread::sleep(Duration::from_micros(200));
                    q = udp_queue(to).expect("b's socket").0;
                }
            }
        }
        if n == WARM_UP {
            r.rss_warm_kb = proc_kb(b_pid, "VmRSS");
        }
    }
    r.elapsed = t0.elapsed();
    r
}

/// The Fig. 1 ping of `examples/snap/ping.s`, replying to [`PING_PORT`]
/// with payload `ping <seq>` so each reply names its request.
fn ping_packet(seq: u32) -> Vec<u8> {
    let src = example("ping.s");
    let (port, stack) = (".port 7\n", ".stack 0, 7, blob \"ping\"\n");
    assert!(src.contains(port) && src.contains(stack), "ping.s changed:\n{src}");
    let src = src
        .replace(port, &format!(".port {PING_PORT}\n"))
        .replace(stack, &format!(".stack 0, {PING_PORT}, blob \"ping {seq}\"\n"));
    asm::assemble(&src).expect("ping assembles").to_bytes().expect("ping bytes")
}

fn count(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| match k.parse::<usize>() {
            Ok(i) => &v[i],
            Err(_) => &v[*k],
        })
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

/// The nonzero counters of a JSON object of counters.
fn nonzero(v: &Value) -> BTreeMap<String, u64> {
    v.as_object()
        .expect("counter object")
        .iter()
        .filter_map(|(k, n)| n.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n)))
        .collect()
}

#[test]
fn a_million_hostile_datagrams_while_pings_go_through() {
    let line = Line::start();
    let kinds = Arc::new(hostile_kinds());
    let b_pid = line.pid(1);
    // b asks for 4 MiB (`UDP_SOCKET_BUFFER`); the kernel caps the request at
    // rmem_max and doubles it. Keep the queue well under that.
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(212_992);
    let rcvbuf = 2 * rmem_max.min(daemon::UDP_SOCKET_BUFFER as u64);
    let queue_limit = rcvbuf / 4;
    let (_, kernel_drops_before) = udp_queue(line.b_west).expect("b's socket in /proc/net/udp");
    let rss_start_kb = proc_kb(b_pid, "VmRSS");

    let mut c = Client::connect(line.run_dir(0)).expect("connect to a");
    c.set_timeout(PING_TIMEOUT);
    c.register(PING_PORT).expect("register");
    // One ping before the flood: the line works.
    c.inject(&ping_packet(0)).expect("inject");
    assert!(c.recv(PING_TIMEOUT).expect("recv").is_some(), "no reply before the flood");

    let done = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (kinds, done, port) = (Arc::clone(&kinds), Arc::clone(&done), line.b_west);
        std::thread::spawn(move || {
            let r = flood(&kinds, port, queue_limit, b_pid);
            done.store(true, Ordering::Relaxed);
            r
        })
    };

    // Ping while the flood lasts (and at least MIN_PINGS times).
    let t0 = Instant::now();
    let (mut pings, mut answered, mut late) = (0u32, 0u32, 0u32);
    let mut lost: Vec<(u32, Value)> = Vec::new();
    let mut rtts: Vec<Duration> = Vec::new();
    let mut pings_in_flood = 0u32;
    while !done.load(Ordering::Relaxed) || pings < MIN_PINGS {
        pings += 1;
        let seq = pings;
        let want = format!("ping {seq}").into_bytes();
        let t = Instant::now();
        c.inject(&ping_packet(seq)).unwrap_or_else(|e| panic!("inject ping {seq}: {e}"));
        let deadline = t + PING_TIMEOUT;
        let mut got = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match c.recv(left).expect("recv") {
                Some((PING_PORT, p)) if p == want => {
                    got = true;
                    break;
                }
                Some(_) => late += 1,
                None => break,
            }
        }
        if got {
            answered += 1;
            rtts.push(t.elapsed());
        } else {
            let s = line.status(1);
            eprintln!("ping {seq} lost; b's drops: {} vm_faults: {}", s["drops"], s["vm_faults"]);
            lost.push((seq, s));
        }
        if !done.load(Ordering::Relaxed) {
            pings_in_flood += 1;
        }
        std::thread::sleep(PING_GAP);
    }
    let ping_time = t0.elapsed();
    let rep = flooder.join().expect("flooder");

    // b has read everything once its interface counted every datagram.
    let rx_west = |v: &Value| count(v, &["interfaces", "0", "rx_packets"]);
    // Ping packets that crossed b westward: every ping sent, answered or not
    // (plus the one before the flood).
    let pings_total = u64::from(pings) + 1;
    let deadline = Instant::now() + WAIT;
    let mut s = line.status(1);
    while rx_west(&s) < rep.sent + pings_total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        s = line.status(1);
    }
    let rss_end_kb = proc_kb(b_pid, "VmRSS");
    let hwm_kb = proc_kb(b_pid, "VmHWM");
    let (_, kernel_drops_after) = udp_queue(line.b_west).expect("b's socket");
    let kernel_drops = kernel_drops_after - kernel_drops_before;

    // Figures.
    let secs = rep.elapsed.as_secs_f64();
    let rate = rep.sent as f64 / secs;
    eprintln!("flood: {} hostile datagrams of {} kinds in {secs:.2} s = {rate:.0}/s", rep.sent, kinds.len());
    eprintln!(
        "pacing: waited {} times for b's queue (limit {} KiB of a {} KiB buffer), largest queue {} KiB; \
         kernel drops {kernel_drops}",
        rep.waits,
        queue_limit / 1024,
        rcvbuf / 1024,
        rep.max_queue / 1024
    );
    rtts.sort();
    let pct = |p: usize| rtts.get((rtts.len().saturating_sub(1)) * p / 100).map_or(0.0, |d| d.as_secs_f64() * 1e3);
    eprintln!(
        "pings: {answered}/{pings} answered ({pings_in_flood} sent during the flood) in {:.1} s; \
         rtt p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; late replies {late}",
        ping_time.as_secs_f64(),
        pct(50),
        pct(99),
        pct(100)
    );
    eprintln!(
        "b VmRSS: {rss_start_kb} kB at start, {} kB after {WARM_UP} datagrams, {rss_end_kb} kB at the end \
         ({:+} kB); VmHWM {hwm_kb} kB",
        rep.rss_warm_kb,
        rss_end_kb as i64 - rep.rss_warm_kb as i64
    );
    let names: Vec<&str> = kinds.iter().map(|k| k.name.as_str()).collect();
    eprintln!("kinds: {}", names.join(" "));
    eprintln!("b drops: {}", s["drops"]);
    eprintln!("b vm_faults: {}", s["vm_faults"]);
    eprintln!("b packets: {}", s["packets"]);

    // Every ping answered.
    assert!(
        lost.is_empty(),
        "{} of {pings} pings lost: {:?}",
        lost.len(),
        lost.iter().map(|l| l.0).collect::<Vec<_>>()
    );
    assert_eq!(answered, pings);
    assert!(pings_in_flood >= MIN_PINGS, "only {pings_in_flood} pings during the flood");

    // Every hostile datagram reached b and was counted, under the reason
    // (and fault kind) of its kind; nothing else was dropped, nothing
    // hostile left b.
    assert_eq!(kernel_drops, 0, "b's socket buffer overflowed despite the pacing");
    let hostile = rx_west(&s) - pings_total;
    assert_eq!(hostile, rep.sent, "b received {} datagrams on its west interface: {s:#}", rx_west(&s));
    let mut want_drops: BTreeMap<String, u64> = BTreeMap::new();
    let mut want_faults: BTreeMap<String, u64> = BTreeMap::new();
    for (k, n) in kinds.iter().zip(&rep.per_kind) {
        *want_drops.entry(k.reason.to_string()).or_default() += n;
        if let Some(f) = k.fault {
            *want_faults.entry(f.to_string()).or_default() += n;
        }
    }
    let drops = nonzero(&s["drops"]);
    let faults = nonzero(&s["vm_faults"]);
    assert_eq!(drops.values().sum::<u64>(), hostile, "drops account for every hostile datagram");
    assert_eq!(drops, want_drops, "drops by reason");
    assert_eq!(faults, want_faults, "VM faults by kind");
    assert_eq!(faults.values().sum::<u64>(), drops.get("vm_fault").copied().unwrap_or(0));
    // b forwarded the pings (out and back) and nothing else.
    assert_eq!(count(&s, &["packets", "snap_forwarded"]), 2 * pings_total, "{s:#}");
    assert_eq!(count(&s, &["packets", "snap_children"]), 0);
    assert_eq!(count(&s, &["packets", "passed_on"]), 0);
    assert_eq!(count(&s, &["packets", "plain_forwarded"]), 0);
    assert_eq!(count(&s, &["interfaces", "1", "tx_packets"]), pings_total, "only pings went on to c");
    let sc = line.status(2);
    assert_eq!(count(&sc, &["interfaces", "0", "rx_packets"]), pings_total, "c saw only the pings");

    // Memory stays flat once warmed up.
    assert!(
        rss_end_kb <= rep.rss_warm_kb + MAX_RSS_GROWTH_KB,
        "b's VmRSS grew from {} kB to {rss_end_kb} kB",
        rep.rss_warm_kb
    );

    // Drop logging is rate limited: at most one line per reason per
    // interval, however many drops.
    let log = line.log(1);
    let log_lines = log.lines().count();
    let drop_lines = log.lines().filter(|l| l.contains("dropped packets")).count();
    let interval = daemon::DROP_LOG_INTERVAL.as_secs_f64();
    let bound = ((t0.elapsed().as_secs_f64() / interval).ceil() as usize + 2) * want_drops.len();
    eprintln!(
        "b log: {log_lines} lines ({} bytes), {drop_lines} drop warnings (bound {bound}) for {} drops",
        log.len(),
        drops.values().sum::<u64>()
    );
    assert!(drop_lines > 0, "drops are logged:\n{log}");
    assert!(drop_lines <= bound, "drop logging is rate limited: {drop_lines} lines");
    assert!(log_lines <= drop_lines + 10, "nothing else is logged per packet:\n{log}");

    // The daemons are still up.
    for i in 0..3 {
        assert_eq!(line.status(i)["address"], format!("10.0.0.{}", i + 1));
    }
}
