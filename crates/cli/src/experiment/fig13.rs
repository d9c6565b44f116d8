//! RCANE Fig. 13, reception (§VI-C), on real daemons: the received
//! bandwidth of a session holding 10 % of the CPU, over the period of its
//! VP and the size of its channel's FIFO, beside a CPU-bound session
//! holding 40 % in 10 ms periods; with and without slack for the receiver.
//!
//! A testbed line a - b - c (`anode testbed up`, in a scratch directory)
//! with two users. On c: the CPU hog (`burn.wasm`, its own session with
//! 4 ms in every 10 ms) and, for the receiving user, one module per FIFO
//! size, each with a channel on port 5000 for its own payload prefix
//! (a digit), whose entry does `--work` loop iterations per packet. For
//! each (slack, period) the receiver's session is opened anew with one VP
//! of 10 % of that period; for each FIFO size node a sends `--seconds` of
//! 1000-byte packets at `--rate` packets per second to that module's
//! prefix. Every link is paced at `--link-rate` (`anode testbed up
//! --link-rate`), so b delivers to c at no more than the link rate, and the
//! default rate is about 97 % of it, as in the paper. Node c runs with
//! `[modules] input_preempts_us` (`--input-preempts`): the hog's guaranteed
//! dispatches end when a datagram waits, so the channel's packets reach its
//! FIFO as they arrive and its VP runs when EDF says, as on the paper's
//! Nemesis node; without it they wait in the socket buffer behind the hog's
//! whole slice at every period. By default the daemons and the sender run
//! under SCHED_FIFO (`--rt-priority`), so that other work on a shared
//! machine does not turn the paced arrivals into bursts.
//!
//! Two counts per point: the channel's `delivered` counter (packets taken
//! into its FIFO) read 300 ms after the last packet, and the module's
//! invocations (packets processed) read as the last packet is sent, which
//! is what the session received while the traffic lasted (a large FIFO can
//! take a CPU-short session's whole backlog and process it after the
//! sending stops). Beside them, the counters that show the mechanism: the
//! channel's `dropped_full`, the kernel's drops on c's sockets, and the
//! receiver's and the hog's VP CPU and dispatches.
//!
//! Writes `fig13.csv` (one row per point with all of these and the load
//! average) and `fig13.png` (one panel per slack setting, processed % over
//! the period, one line per FIFO size). Not asserted anywhere: a shared
//! machine makes it noisy (docs/channels.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::bed::Testbed;
use anode_daemon::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

/// `anode experiment fig13`.
#[derive(Debug, clap::Args)]
pub struct Fig13Args {
    /// Seconds of traffic per point.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Packets per second sent to the receiver (1000-byte payloads; the
    /// default is about 97 % of the default --link-rate, counting the
    /// datagram as the link carries it).
    #[arg(long, default_value_t = 4500)]
    rate: u32,
    /// The rate of every link, bits/s (`anode testbed up --link-rate`: each
    /// node paces its transmissions to it); 0: unpaced loopback.
    #[arg(long, default_value_t = 40_000_000)]
    link_rate: u64,
    /// Node c's guaranteed dispatches look for waiting network input every
    /// this many µs and end for it (`[modules] input_preempts_us`); 0: they
    /// run their budget out, and input waits behind the hog's whole slice.
    #[arg(long, default_value_t = 50)]
    input_preempts: u64,
    /// Run the three daemons and the sender under SCHED_FIFO at this
    /// priority (`chrt`; needs root), so that other work on a shared machine
    /// does not deschedule them for milliseconds and turn paced arrivals into
    /// bursts; 0: normal priority.
    #[arg(long, default_value_t = 10)]
    rt_priority: u32,
    /// Loop iterations of the receiver's work per packet.
    #[arg(long, default_value_t = 3_000)]
    work: u32,
    /// The receiver's VP periods, ms.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,5,7,10,15,20")]
    periods: Vec<u32>,
    /// FIFO sizes, bytes (at most 9).
    #[arg(long, value_delimiter = ',', default_value = "1500,4000,11000,30000,88000")]
    buffers: Vec<u32>,
    /// The CPU hog module (`scripts/setup` builds it).
    #[arg(long, default_value = "modules/out/burn.wasm")]
    burn: PathBuf,
    /// Output directory (fig13.csv, fig13.png).
    #[arg(short, long, default_value = "fig13-out")]
    out: PathBuf,
}

const PORT: u16 = 5000;
const PAYLOAD: usize = 1000;

/// One point of the figure.
#[derive(Debug, Clone)]
struct Point {
    slack: bool,
    period_ms: u32,
    buffer: u32,
    sent: u64,
    /// Taken into the channel's FIFO (its `delivered`), 300 ms after the last packet.
    received: u64,
    /// Processed by the module by the time the last packet was sent.
    processed: u64,
    /// What changed on c while the point ran (to 300 ms after the last packet).
    d: Snap,
    /// The 1-minute load average as the point ended.
    load: f64,
}

/// Counters of node c at one moment (or their change over a point).
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    /// The channel's packets taken, and dropped because its FIFO was full.
    delivered: u64,
    dropped_full: u64,
    /// The module's invocations (packets processed).
    processed: u64,
    /// Datagrams the kernel dropped on c's sockets (receive buffer full).
    sock_drops: u64,
    /// The receiver's VP: CPU on guaranteed time and on slack (ns), dispatches.
    rx_guaranteed_ns: u64,
    rx_slack_ns: u64,
    rx_dispatches: u64,
    /// The hog's VP: CPU (ns) and dispatches.
    hog_ns: u64,
    hog_dispatches: u64,
}

impl Snap {
    fn since(&self, before: &Snap) -> Snap {
        Snap {
            delivered: self.delivered.saturating_sub(before.delivered),
            dropped_full: self.dropped_full.saturating_sub(before.dropped_full),
            processed: self.processed.saturating_sub(before.processed),
            sock_drops: self.sock_drops.saturating_sub(before.sock_drops),
            rx_guaranteed_ns: self.rx_guaranteed_ns.saturating_sub(before.rx_guaranteed_ns),
            rx_slack_ns: self.rx_slack_ns.saturating_sub(before.rx_slack_ns),
            rx_dispatches: self.rx_dispatches.saturating_sub(before.rx_dispatches),
            hog_ns: self.hog_ns.saturating_sub(before.hog_ns),
            hog_dispatches: self.hog_dispatches.saturating_sub(before.hog_dispatches),
        }
    }
}

/// The 1-minute load average (0 if unreadable).
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

/// Datagrams the kernel dropped on the UDP sockets bound to `addrs`
/// (`/proc/net/udp`, last column).
fn socket_drops(addrs: &[std::net::SocketAddr]) -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/net/udp") else { return 0 };
    let keys: Vec<String> = addrs
        .iter()
        .filter_map(|a| match a {
            std::net::SocketAddr::V4(a) => {
                Some(format!("{:08X}:{:04X}", u32::from_le_bytes(a.ip().octets()), a.port()))
            }
            std::net::SocketAddr::V6(_) => None,
        })
        .collect();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = f.get(1)?;
            keys.iter().any(|k| k == local).then(|| f.last()?.parse::<u64>().ok())?
        })
        .sum()
}

/// One VP's (CPU on guaranteed time, on slack, dispatches) in session `id`.
fn vp_totals(status: &serde_json::Value, id: &str) -> (u64, u64, u64) {
    let t = status["rcane"]["sessions"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["session"].as_str() == Some(id)))
        .map(|s| s["vps"][0]["received_ns_total"].clone())
        .unwrap_or_default();
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    (n("guaranteed") + n("overrun"), n("slack"), n("dispatches"))
}

/// The receiver module: a channel on port 5000 for payloads starting with
/// `digit`, a FIFO of `buffer` bytes, `work` iterations per packet.
fn receiver(digit: u8, buffer: u32, work: u32) -> Result<Vec<u8>> {
    let b = buffer.to_be_bytes();
    let spec =
        format!("\\01\\00\\13\\88\\{:02x}\\{:02x}\\{:02x}\\{:02x}\\01\\{:02x}\\00", b[0], b[1], b[2], b[3], digit);
    let src = format!(
        r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $acc (mut i32) (i32.const 0))
  (data (i32.const 0) "pkt")
  (data (i32.const 16) "{spec}")
  (func $pkt (param i32 i32) (result i32) (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (global.set $acc (i32.xor (global.get $acc) (local.get $i)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const {work}))))
    (global.get $acc))
  (table (export "__indirect_function_table") 1 funcref)
  (elem (i32.const 0) $pkt)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 0)))
    (drop (call $open (i32.const 16) (i32.const 11) (i32.const 0) (i32.const 3) (i32.const 0)))))"#
    );
    wat::parse_str(src).context("the fig13 receiver module")
}

/// What this experiment does on its testbed (the line a - b - c, users'
/// commands to c).
trait Reception {
    /// Loads `wasm` for `u` with interfaces `ifaces`.
    fn load(&self, u: &str, wasm: &str, ifaces: &str) -> Result<()>;
    /// Opens a session of `u` with one VP `vp`: its id.
    fn open_session(&self, u: &str, vp: &str) -> Result<String>;
    /// Node c's counters now for the channel with a `buffer`-byte FIFO, its
    /// module, the sessions `rx` and `hog` and c's sockets `addrs`.
    fn snap(&self, buffer: u32, rx: &str, hog: &str, addrs: &[std::net::SocketAddr]) -> Result<Snap>;
    /// The addresses node c's interfaces listen on.
    fn listens(&self) -> Result<Vec<std::net::SocketAddr>>;
}

impl Reception for Testbed {
    fn load(&self, u: &str, wasm: &str, ifaces: &str) -> Result<()> {
        let stem = Path::new(wasm).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let cred = self.cred(
            u,
            &format!("{u}-{stem}.cred"),
            &["--kind", "module", "--module", wasm, "--interface", ifaces, "--cpu", "10000000"],
        )?;
        self.user(u, &["module", "load", wasm, "--credential", &cred]).map(|_| ())
    }

    fn open_session(&self, u: &str, vp: &str) -> Result<String> {
        let sc = self.cred(
            u,
            &format!("{u}.session"),
            &["--kind", "session", "--vp-share", "50%", "--total-share", "50%", "--extra"],
        )?;
        let out = self.user(u, &["session", "open", "--credential", &sc, "--vp", vp])?;
        out.split_whitespace().nth(1).map(str::to_string).ok_or_else(|| anyhow!("no session id in {out:?}"))
    }

    /// Node c's counters now for the channel with a `buffer`-byte FIFO, its
    /// module, the sessions `rx` and `hog` and c's sockets `addrs`.
    fn snap(&self, buffer: u32, rx: &str, hog: &str, addrs: &[std::net::SocketAddr]) -> Result<Snap> {
        let out = self.cmd(&["status", "--json", "--run-dir", &self.p("tb/c")])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("status JSON")?;
        let ch = v["modules"]["channels"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["buffer"].as_u64() == Some(u64::from(buffer))))
            .ok_or_else(|| anyhow!("no channel with a {buffer}-byte FIFO on c"))?;
        let module = ch["module"].as_str().map(str::to_string).ok_or_else(|| anyhow!("channel without module"))?;
        let (delivered, dropped_full) =
            (ch["delivered"].as_u64().unwrap_or(0), ch["dropped_full"].as_u64().unwrap_or(0));
        let (rx_guaranteed_ns, rx_slack_ns, rx_dispatches) = vp_totals(&v, rx);
        let (hog_g, hog_s, hog_dispatches) = vp_totals(&v, hog);
        let out = self.cmd(&["module", "list", "--json", "--run-dir", &self.p("tb/c")])?;
        let m: serde_json::Value = serde_json::from_str(&out).context("module list JSON")?;
        let processed = m
            .as_array()
            .and_then(|a| a.iter().find(|x| x["id"].as_str() == Some(module.as_str())))
            .and_then(|x| x["counters"]["invocations"].as_u64())
            .ok_or_else(|| anyhow!("module {module} not listed on c"))?;
        Ok(Snap {
            delivered,
            dropped_full,
            processed,
            sock_drops: socket_drops(addrs),
            rx_guaranteed_ns,
            rx_slack_ns,
            rx_dispatches,
            hog_ns: hog_g + hog_s,
            hog_dispatches,
        })
    }

    /// The addresses node c's interfaces listen on.
    fn listens(&self) -> Result<Vec<std::net::SocketAddr>> {
        let out = self.cmd(&["status", "--json", "--run-dir", &self.p("tb/c")])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("status JSON")?;
        Ok(v["interfaces"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i["listen"].as_str().and_then(|l| l.parse().ok())).collect())
            .unwrap_or_default())
    }
}

/// Sends `n` packets starting with `digit` to c's port 5000 from a, at `rate` a second.
fn send(a: &mut Client, digit: u8, n: u64, rate: u32) -> Result<()> {
    let c = std::net::Ipv4Addr::new(10, 0, 0, 3);
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut p = vec![digit; PAYLOAD];
    for i in 0..n {
        let due = start + gap.mul_f64(i as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        p[1..9].copy_from_slice(&i.to_be_bytes());
        a.plain(c, PORT, 64, &p).map_err(|e| anyhow!("sending: {e}"))?;
    }
    Ok(())
}

pub fn run(a: Fig13Args) -> Result<std::process::ExitCode> {
    if a.buffers.is_empty() || a.buffers.len() > 9 || a.periods.is_empty() {
        bail!("give 1 to 9 --buffers and at least one --period");
    }
    if a.periods.iter().any(|p| *p == 0 || *p > 1000) || a.buffers.iter().any(|b| *b == 0 || *b > 16 << 20) {
        bail!("periods must be 1..=1000 ms, buffers 1..=16 MiB");
    }
    let burn = std::fs::canonicalize(&a.burn)
        .with_context(|| format!("{} (build the example modules: scripts/setup)", a.burn.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let dir = std::env::temp_dir().join(format!("anode-fig13-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut extra = Vec::new();
    let (link_rate, preempts) = (a.link_rate.to_string(), a.input_preempts.to_string());
    if a.link_rate > 0 {
        extra.extend_from_slice(&["--link-rate", link_rate.as_str()]);
    }
    if a.input_preempts > 0 {
        extra.extend_from_slice(&["--input-preempts", preempts.as_str()]);
    }
    let line3 = "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.2\" }, \
                 { name = \"c\", address = \"10.0.0.3\" }]\nlink = [{ a = \"a\", b = \"b\" }, { a = \"b\", b = \"c\" }]\n";
    let bed = Testbed::up(std::env::current_exe()?, dir.clone(), line3, &["hog", "rx"], &extra, "c")?;

    // The hog: 40 % in 10 ms periods, always busy.
    if a.rt_priority > 0 {
        let prio = a.rt_priority.to_string();
        let mut pids = vec![std::process::id().to_string()];
        for n in ["a", "b", "c"] {
            pids.push(std::fs::read_to_string(dir.join(format!("tb/{n}/pid")))?.trim().to_string());
        }
        for (i, pid) in pids.iter().enumerate() {
            // The daemons with all their threads; this process's sending thread only.
            let all = if i == 0 { vec!["-f", "-p"] } else { vec!["-a", "-f", "-p"] };
            let o =
                Command::new("chrt").args(all).args([prio.as_str(), pid.as_str()]).output().context("running chrt")?;
            if !o.status.success() {
                bail!("chrt -f -p {prio} {pid}: {}", String::from_utf8_lossy(&o.stderr));
            }
        }
    }
    let hog = bed.open_session("hog", "4ms/10ms")?;
    bed.load("hog", &burn.to_string_lossy(), "time")?;
    // One receiver module per FIFO size.
    for (i, b) in a.buffers.iter().enumerate() {
        let wasm = dir.join(format!("rx{i}.wasm"));
        std::fs::write(&wasm, receiver(b'1' + i as u8, *b, a.work)?)?;
        bed.load("rx", &wasm.to_string_lossy(), "net")?;
    }
    let mut sender = Client::connect(dir.join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
    let addrs = bed.listens()?;
    let n = (a.seconds * f64::from(a.rate)).round().max(1.0) as u64;
    let mut points = Vec::new();
    let mut session: Option<String> = None;
    for slack in [false, true] {
        for period in &a.periods {
            if let Some(s) = session.take() {
                bed.user("rx", &["session", "close", &s])?;
            }
            let slice_us = period * 100;
            let vp = format!("{slice_us}us/{period}ms{}", if slack { "+extra" } else { "" });
            let rx = bed.open_session("rx", &vp)?;
            session = Some(rx.clone());
            for (i, b) in a.buffers.iter().enumerate() {
                let digit = b'1' + i as u8;
                let before = bed.snap(*b, &rx, &hog, &addrs)?;
                send(&mut sender, digit, n, a.rate)?;
                let processed = bed.snap(*b, &rx, &hog, &addrs)?.processed.saturating_sub(before.processed);
                std::thread::sleep(Duration::from_millis(300));
                let d = bed.snap(*b, &rx, &hog, &addrs)?.since(&before);
                let pt = Point {
                    slack,
                    period_ms: *period,
                    buffer: *b,
                    sent: n,
                    received: d.delivered,
                    processed,
                    d,
                    load: loadavg(),
                };
                eprintln!(
                    "slack {slack:5} period {period:3} ms buffer {b:6} B: taken {}/{n} ({:.1} %), processed {processed} ({:.1} %), \
                     FIFO full {}, socket drops {}, rx VP {:.1} ms (+{:.1} slack) in {} dispatches, hog {:.1} ms in {}",
                    d.delivered,
                    100.0 * d.delivered as f64 / n as f64,
                    100.0 * processed as f64 / n as f64,
                    d.dropped_full,
                    d.sock_drops,
                    d.rx_guaranteed_ns as f64 / 1e6,
                    d.rx_slack_ns as f64 / 1e6,
                    d.rx_dispatches,
                    d.hog_ns as f64 / 1e6,
                    d.hog_dispatches,
                );
                points.push(pt);
                // Let the FIFO drain before the next point.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    let csv = a.out.join("fig13.csv");
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut text = format!(
        "# rate_pps={} seconds={} work={} payload={PAYLOAD} link_rate_bps={} input_preempts_us={} rt_priority={} written_unix={started}\n\
         slack,period_ms,buffer_bytes,sent,received,received_pct,processed,processed_pct,dropped_full,socket_drops,\
         rx_guaranteed_ms,rx_slack_ms,rx_dispatches,hog_ms,hog_dispatches,load1\n",
        a.rate, a.seconds, a.work, a.link_rate, a.input_preempts, a.rt_priority
    );
    for p in &points {
        text.push_str(&format!(
            "{},{},{},{},{},{:.2},{},{:.2},{},{},{:.3},{:.3},{},{:.3},{},{:.2}\n",
            p.slack,
            p.period_ms,
            p.buffer,
            p.sent,
            p.received,
            100.0 * p.received as f64 / p.sent.max(1) as f64,
            p.processed,
            100.0 * p.processed as f64 / p.sent.max(1) as f64,
            p.d.dropped_full,
            p.d.sock_drops,
            p.d.rx_guaranteed_ns as f64 / 1e6,
            p.d.rx_slack_ns as f64 / 1e6,
            p.d.rx_dispatches,
            p.d.hog_ns as f64 / 1e6,
            p.d.hog_dispatches,
            p.load,
        ));
    }
    std::fs::write(&csv, text)?;
    let png = a.out.join("fig13.png");
    plot(&points, &a.buffers, &png)?;
    eprintln!("wrote {} and {}", csv.display(), png.display());
    drop(bed);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(std::process::ExitCode::SUCCESS)
}

const COLORS: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(23, 190, 207),
];

fn plot(points: &[Point], buffers: &[u32], out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (1200, 500)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = points.iter().map(|p| p.period_ms).max().unwrap_or(20) as f64;
    for (area, slack) in root.split_evenly((1, 2)).iter().zip([false, true]) {
        let title = if slack { "receiver may use slack" } else { "receiver without slack" };
        let mut chart = ChartBuilder::on(area)
            .caption(format!("Fig. 13: received bandwidth, {title}"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..xmax * 1.05, 0f64..105f64)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("receiver's VP period (ms), 10 % of the CPU")
            .y_desc("processed while sent (% of sent)")
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
        for (i, b) in buffers.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.slack == slack && p.buffer == *b)
                .map(|p| (f64::from(p.period_ms), 100.0 * p.processed as f64 / p.sent.max(1) as f64))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(format!("FIFO {:.1} KB", f64::from(*b) / 1000.0))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|x| e(&x))?;
        }
        super::plot::legend(&mut chart, SeriesLabelPosition::LowerLeft, 13).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
