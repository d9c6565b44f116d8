//! RCANE Fig. 12, network transmission (§VI-B), on real daemons.
//!
//! Three principals' modules at node a each send 1,400-byte packets to
//! node b as fast as their allowances let them, over a link that a paces
//! at 100 Mbit/s (`rate_bps`): D has no session (best effort), E a session
//! with a transmit reservation of a third of the link (2 ms of every 6 ms),
//! F one of 25 %, then 45 %, 65 % and 25 % again. A receiver at b (a local
//! application on the modules' port) timestamps every arrival per sender
//! (the first payload byte names it). `scripts/fig12` runs it all.
//!
//! - `fig12-module`: writes the sending module (WAT, one per sender tag).
//! - `fig12-receive`: the receiver: one line per packet (unix ns, tag).
//! - `fig12`: the per-6 ms and per-1 s rates (CSV), the PNG and the
//!   statistics against the reservations (Markdown).

use anode_daemon::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The payload of every packet, bytes (the sandbox's largest).
pub const PAYLOAD: usize = 1400;
/// The scheduling period of the experiment (the paper's 6 ms).
const PERIOD_NS: u64 = 6_000_000;

/// `anode experiment fig12-module`.
#[derive(Debug, clap::Args)]
pub struct ModuleArgs {
    /// The sender's tag: the first byte of every payload (e.g. D, E, F).
    #[arg(long)]
    tag: char,
    /// Where the packets go.
    #[arg(long, default_value = "10.0.0.2")]
    dst: Ipv4Addr,
    /// Their port.
    #[arg(long, default_value_t = 9012)]
    port: u16,
    /// Packets per alarm (one alarm per millisecond); the sandbox allows 16
    /// sends per invocation, so more means "as many as allowed".
    #[arg(long, default_value_t = 64)]
    per_tick: u32,
    /// Output .wasm.
    #[arg(short, long)]
    out: PathBuf,
}

/// `anode experiment fig12-receive`.
#[derive(Debug, clap::Args)]
pub struct ReceiveArgs {
    /// The receiving node's run directory.
    #[arg(long)]
    run_dir: PathBuf,
    /// The port to register.
    #[arg(long, default_value_t = 9012)]
    port: u16,
    /// How long to receive, seconds.
    #[arg(long)]
    seconds: f64,
    /// Output: one line per packet, `unix_ns,tag,len`.
    #[arg(short, long)]
    out: PathBuf,
}

/// `anode experiment fig12-wire`.
#[derive(Debug, clap::Args)]
pub struct WireArgs {
    /// A capture (pcap or pcapng) of the link into the receiving node,
    /// taken by the kernel (`dumpcap -i lo`), with the senders' tags in the
    /// clear (`--security authenticate`) and one datagram per packet
    /// (`--no-gso`).
    #[arg(long)]
    pcap: PathBuf,
    /// The receiving node's link port: UDP datagrams to it are counted.
    #[arg(long)]
    port: u16,
    /// Where the sender's tag lies in the UDP payload: ANEP 8 + AH 12 +
    /// inner ANEP 8 + plain header 12 = 40 with `authenticate`.
    #[arg(long, default_value_t = 40)]
    tag_offset: usize,
    /// Output: the receiver's format, one line per datagram (`unix_ns,tag,len`).
    #[arg(short, long)]
    out: PathBuf,
}

/// `anode experiment fig12`.
#[derive(Debug, clap::Args)]
pub struct Fig12Args {
    /// The receiver's arrivals (`fig12-receive`).
    #[arg(long)]
    arrivals: PathBuf,
    /// Reservation changes, one per line: `unix_s,TAG,PERCENT` (a
    /// guaranteed sender's share of the link from then on).
    #[arg(long)]
    events: PathBuf,
    /// The sending node's `anode status --json` at the end of the run (for
    /// the datagram size on the link: sent bytes / sent packets).
    #[arg(long, required_unless_present = "datagram_bytes")]
    sender_status: Option<PathBuf>,
    /// The datagram size on the link, bytes, when the sender has no paced
    /// link to read it from (the tc baseline).
    #[arg(long)]
    datagram_bytes: Option<f64>,
    /// The link rate, bits/s.
    #[arg(long, default_value_t = 100_000_000)]
    rate_bps: u64,
    /// A label for this run (e.g. anode, tc-htb).
    #[arg(long, default_value = "anode")]
    source: String,
    /// Output directory: fig12.csv, fig12.png, stats.md.
    #[arg(short, long, default_value = "fig12-out")]
    out: PathBuf,
}

/// The sending module: an alarm every millisecond sends `per_tick` packets
/// or as many as one invocation may (16), each `[tag][seq u32 LE][zeros]`.
fn wat(tag: u8, dst: Ipv4Addr, port: u16, per_tick: u32) -> String {
    format!(
        r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "time" "set_alarm" (func $alarm (param i64 i32 i32) (result i32)))
  (import "net" "send" (func $send (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $seq (mut i32) (i32.const 0))
  (data (i32.const 0) "tick")
  (func $tick (param i32 i32) (result i32) (local $n i32)
    (i32.store8 (i32.const 1024) (i32.const {tag}))
    (block $done
      (loop $l
        (i32.store (i32.const 1025) (global.get $seq))
        (br_if $done (call $send (i32.const {dst}) (i32.const {port}) (i32.const 1024) (i32.const {PAYLOAD})))
        (global.set $seq (i32.add (global.get $seq) (i32.const 1)))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $n) (i32.const {per_tick})))))
    (drop (call $alarm (i64.const 1) (i32.const 0) (i32.const 4)))
    (local.get $n))
  (table (export "__indirect_function_table") 1 funcref)
  (elem (i32.const 0) $tick)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $alarm (i64.const 1) (i32.const 0) (i32.const 4)))))"#,
        dst = u32::from(dst) as i32,
    )
}

/// `anode experiment fig12-module`.
pub fn module(a: ModuleArgs) -> Result<std::process::ExitCode> {
    let tag = u8::try_from(a.tag).map_err(|_| anyhow!("the tag must be one ASCII character"))?;
    let wasm = ::wat::parse_str(wat(tag, a.dst, a.port, a.per_tick.max(1))).context("the sender's WAT")?;
    std::fs::write(&a.out, wasm).with_context(|| format!("writing {}", a.out.display()))?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// `anode experiment fig12-receive`.
pub fn receive(a: ReceiveArgs) -> Result<std::process::ExitCode> {
    let mut c = Client::connect(&a.run_dir)?;
    c.hello()?;
    c.register(a.port)?;
    // Arrival times on the monotonic clock, anchored to the wall clock once.
    let (t0, u0) = (Instant::now(), unix_ns());
    let end = t0 + Duration::from_secs_f64(a.seconds);
    let mut got: Vec<(u64, u8, u16)> = Vec::with_capacity(200_000);
    while Instant::now() < end {
        if let Some((port, payload)) = c.recv(Duration::from_millis(100))?
            && port == a.port
            && let Some(&tag) = payload.first()
        {
            let t = u0 + t0.elapsed().as_nanos() as u64;
            got.push((t, tag, payload.len() as u16));
        }
    }
    let mut w = std::io::BufWriter::new(std::fs::File::create(&a.out)?);
    writeln!(w, "unix_ns,tag,len")?;
    for (t, tag, len) in &got {
        writeln!(w, "{t},{},{len}", char::from(*tag))?;
    }
    w.flush()?;
    eprintln!("{} packets in {:.1} s", got.len(), a.seconds);
    Ok(std::process::ExitCode::SUCCESS)
}

/// `anode experiment fig12-wire`: the arrivals at the receiving node's link
/// socket as the kernel timestamped them, in the receiver's format, so that
/// `anode experiment fig12` can read them instead of the application's.
pub fn wire(a: WireArgs) -> Result<std::process::ExitCode> {
    let f = std::fs::File::open(&a.pcap).with_context(|| format!("reading {}", a.pcap.display()))?;
    let mut cap = anode_monitor::CaptureReader::new(std::io::BufReader::new(f))
        .with_context(|| format!("{} is not a capture", a.pcap.display()))?;
    let (mut kept, mut other, mut short, mut gso) = (0u64, 0u64, 0u64, 0u64);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&a.out)?);
    writeln!(w, "unix_ns,tag,len")?;
    while let Some(frame) = cap.next_frame().with_context(|| format!("reading {}", a.pcap.display()))? {
        let Ok(p) = anode_monitor::parse::parse(&frame) else {
            other += 1;
            continue;
        };
        if !matches!(p.l4, anode_monitor::parse::L4::Udp { dport, .. } if dport == a.port) {
            other += 1;
            continue;
        }
        // A datagram longer than an IPv4 MTU is a GSO run that the kernel
        // did not split on loopback: its segments would share one time.
        if p.payload_len > 1472 {
            gso += 1;
            continue;
        }
        let Some(&tag) = p.payload.get(a.tag_offset) else {
            short += 1;
            continue;
        };
        kept += 1;
        writeln!(w, "{},{},{}", p.ts_ns, char::from(tag), p.payload_len)?;
    }
    w.flush()?;
    eprintln!(
        "{kept} datagrams to port {} kept; {other} other frames, {short} too short for the tag, {gso} GSO runs skipped",
        a.port
    );
    if gso > 0 {
        bail!("{gso} GSO runs in the capture: take it from a testbed started with --no-gso");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A guaranteed sender's share from a time on.
#[derive(Debug, Clone)]
struct Event {
    unix_ns: u64,
    tag: char,
    pct: f64,
}

fn read_arrivals(p: &Path) -> Result<Vec<(u64, char)>> {
    let f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
    let mut v = Vec::new();
    for line in std::io::BufReader::new(f).lines().skip(1) {
        let line = line?;
        let mut it = line.split(',');
        let (Some(t), Some(tag)) = (it.next(), it.next()) else { bail!("bad arrival line {line:?}") };
        v.push((t.parse()?, tag.chars().next().ok_or_else(|| anyhow!("no tag in {line:?}"))?));
    }
    Ok(v)
}

fn read_events(p: &Path) -> Result<Vec<Event>> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let mut v = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let [t, tag, pct] = f.as_slice() else { bail!("bad event line {line:?}: unix_s,TAG,PERCENT") };
        let secs: f64 = t.parse().with_context(|| format!("time in {line:?}"))?;
        v.push(Event {
            unix_ns: (secs * 1e9) as u64,
            tag: tag.chars().next().ok_or_else(|| anyhow!("no tag in {line:?}"))?,
            pct: pct.parse().with_context(|| format!("percent in {line:?}"))?,
        });
    }
    v.sort_by_key(|e| e.unix_ns);
    Ok(v)
}

/// Bytes per datagram on the paced link: its sent bytes / sent packets.
fn datagram_bytes(status: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(status).with_context(|| format!("reading {}", status.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let ifaces = v["interfaces"].as_array().ok_or_else(|| anyhow!("no interfaces in the status"))?;
    for i in ifaces {
        let tx = &i["tx"];
        if let (Some(b), Some(p)) = (tx["sent_bytes"].as_u64(), tx["sent_packets"].as_u64())
            && p > 0
        {
            // Only the modules' packets are large: take theirs.
            let mut bytes = 0u64;
            let mut pkts = 0u64;
            for c in tx["clients"].as_array().into_iter().flatten() {
                if c["owner"] != "system" && c["owner"] != "best-effort" {
                    bytes += c["sent_bytes"].as_u64().unwrap_or(0);
                    pkts += c["sent_packets"].as_u64().unwrap_or(0);
                }
            }
            return Ok(if pkts > 0 { bytes as f64 / pkts as f64 } else { b as f64 / p as f64 });
        }
    }
    Err(anyhow!("the sender's status has no paced link with packets sent"))
}

/// The guaranteed share of `tag` at `t` (None: best effort).
fn share_at(events: &[Event], tag: char, t: u64) -> Option<f64> {
    events.iter().rfind(|e| e.tag == tag && e.unix_ns <= t).map(|e| e.pct).filter(|p| *p > 0.0)
}

/// `anode experiment fig12`.
pub fn run(a: Fig12Args) -> Result<std::process::ExitCode> {
    let arrivals = read_arrivals(&a.arrivals)?;
    let events = read_events(&a.events)?;
    let dgram = match (a.datagram_bytes, &a.sender_status) {
        (Some(b), _) => b,
        (None, Some(s)) => datagram_bytes(s)?,
        (None, None) => bail!("--sender-status or --datagram-bytes"),
    };
    let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) else { bail!("no arrivals") };
    let (t0, t1) = (first.0, last.0);
    let mut tags: Vec<char> = arrivals.iter().map(|x| x.1).collect();
    tags.sort_unstable();
    tags.dedup();
    std::fs::create_dir_all(&a.out)?;
    // Packets per window of `w` ns, per tag.
    let bin = |w: u64| -> BTreeMap<u64, BTreeMap<char, u64>> {
        let mut m: BTreeMap<u64, BTreeMap<char, u64>> = BTreeMap::new();
        for (t, tag) in &arrivals {
            *m.entry((t - t0) / w).or_default().entry(*tag).or_default() += 1;
        }
        m
    };
    let mbps = |pkts: u64, w: u64| pkts as f64 * dgram * 8.0 / (w as f64 / 1e9) / 1e6;
    let (per_period, per_sec) = (bin(PERIOD_NS), bin(1_000_000_000));
    let nwin = |w: u64| (t1 - t0) / w; // complete windows only
    let mut csv = String::from("source,window_ms,start_s,sender,mbit_per_s,packets,reserved_pct\n");
    for (w, m) in [(PERIOD_NS, &per_period), (1_000_000_000, &per_sec)] {
        for k in 0..nwin(w) {
            for tag in &tags {
                let n = m.get(&k).and_then(|x| x.get(tag)).copied().unwrap_or(0);
                let res = share_at(&events, *tag, t0 + k * w).map_or(String::new(), |p| format!("{p}"));
                csv.push_str(&format!(
                    "{},{},{:.3},{tag},{:.3},{n},{res}\n",
                    a.source,
                    w / 1_000_000,
                    (k * w) as f64 / 1e9,
                    mbps(n, w)
                ));
            }
        }
    }
    std::fs::write(a.out.join("fig12.csv"), &csv)?;
    let mut stats = stats(&a, &arrivals, &events, &tags, dgram, t0, t1);
    if let Some(s) = a.sender_status.as_ref().filter(|_| a.datagram_bytes.is_none()) {
        stats.push_str(&sender_side(s)?);
    }
    std::fs::write(a.out.join("stats.md"), &stats)?;
    print!("{stats}");
    plot(&a, &per_period, &per_sec, &tags, dgram, t0, t1)?;
    eprintln!("wrote {}", a.out.display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// Statistics per phase (a constant set of reservations), leaving out half
/// a second after each change: each guaranteed sender's share per 1 s
/// window against its reservation, and its packets per two periods (12 ms)
/// against its reservation's (the paper's "within one packet"); the best
/// effort sender's share against what the reservations leave.
fn stats(a: &Fig12Args, arr: &[(u64, char)], events: &[Event], tags: &[char], dgram: f64, t0: u64, t1: u64) -> String {
    let rate = a.rate_bps as f64;
    let mut bounds: Vec<u64> = vec![t0];
    bounds.extend(events.iter().map(|e| e.unix_ns).filter(|t| *t > t0 && *t < t1));
    bounds.push(t1);
    bounds.dedup();
    let mut out = format!(
        "# Fig. 12 ({}): {dgram:.0}-byte datagrams on a {:.0} Mbit/s link\n\n\
         | phase (s) | sender | reserved | 1 s windows: mean share, worst deviation | 12 ms windows: expected packets, within 1 packet, worst deviation |\n\
         |---|---|---|---|---|\n",
        a.source,
        rate / 1e6
    );
    for pair in bounds.windows(2) {
        let (from, to) = (pair[0] + 500_000_000, pair[1]);
        if to < from + 1_000_000_000 {
            continue;
        }
        let reserved: Vec<(char, f64)> =
            tags.iter().filter_map(|t| share_at(events, *t, from).map(|p| (*t, p))).collect();
        let left = 100.0 - reserved.iter().map(|(_, p)| p).sum::<f64>();
        for tag in tags {
            let pct = share_at(events, *tag, from);
            let count =
                |a0: u64, w: u64| arr.iter().filter(|(t, g)| g == tag && *t >= a0 && *t < a0 + w).count() as f64;
            let share = |n: f64, w: u64| 100.0 * n * dgram * 8.0 / rate / (w as f64 / 1e9);
            let secs: Vec<f64> = (0..(to - from) / 1_000_000_000)
                .map(|k| share(count(from + k * 1_000_000_000, 1_000_000_000), 1_000_000_000))
                .collect();
            let want = pct.unwrap_or(left);
            let mean = secs.iter().sum::<f64>() / secs.len().max(1) as f64;
            let worst = secs.iter().map(|s| (s - want).abs()).fold(0.0, f64::max);
            let w2 = 2 * PERIOD_NS;
            let expect = want / 100.0 * rate * (w2 as f64 / 1e9) / 8.0 / dgram;
            let pairs: Vec<f64> = (0..(to - from) / w2).map(|k| count(from + k * w2, w2) - expect).collect();
            let within = pairs.iter().filter(|d| d.abs() <= 1.0).count();
            let worst2 = pairs.iter().map(|d| d.abs()).fold(0.0, f64::max);
            out.push_str(&format!(
                "| {:.1}-{:.1} | {tag} | {} | {mean:.2} % (want {want:.2} %), {worst:.2} points | {expect:.2}, {within}/{} ({:.1} %), {worst2:.1} |\n",
                (pair[0] - t0) as f64 / 1e9,
                (pair[1] - t0) as f64 / 1e9,
                pct.map_or("best effort".to_string(), |p| format!("{p:.2} %")),
                pairs.len(),
                100.0 * within as f64 / pairs.len().max(1) as f64,
            ));
        }
    }
    out
}

/// The sending node's own account (its link scheduler's counters): for
/// each guaranteed client, the windows of two periods in which it was
/// backlogged, and how many were within one packet of two slices.
fn sender_side(status: &Path) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(status)?)?;
    let mut out = String::from(
        "\nAt the sender (node a's link scheduler, the whole run):\n\n| owner | guarantee at the end | windows of two periods backlogged | within one packet of two slices |\n|---|---|---|---|\n",
    );
    for i in v["interfaces"].as_array().into_iter().flatten() {
        for c in i["tx"]["clients"].as_array().into_iter().flatten().filter(|c| !c["guarantee"].is_null()) {
            let (w, k) = (
                c["two_period_windows"].as_u64().unwrap_or(0),
                c["two_period_within_one_packet"].as_u64().unwrap_or(0),
            );
            out.push_str(&format!(
                "| {} | {} ns / {} ns | {w} | {k} ({:.1} %) |\n",
                c["owner"].as_str().unwrap_or("?"),
                c["guarantee"]["slice_ns"],
                c["guarantee"]["period_ns"],
                100.0 * k as f64 / w.max(1) as f64
            ));
        }
    }
    Ok(out)
}

fn plot(
    a: &Fig12Args,
    per_period: &BTreeMap<u64, BTreeMap<char, u64>>,
    per_sec: &BTreeMap<u64, BTreeMap<char, u64>>,
    tags: &[char],
    dgram: f64,
    t0: u64,
    t1: u64,
) -> Result<()> {
    super::plot::register_font()?;
    let path = a.out.join("fig12.png");
    let root = BitMapBackend::new(&path, (1200, 700)).into_drawing_area();
    let e = |x: &dyn std::fmt::Display| anyhow!("drawing {}: {x}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = (t1 - t0) as f64 / 1e9;
    let colors = [RGBColor(90, 90, 90), RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44)];
    let areas = root.split_evenly((2, 1));
    for (area, (w, m, what)) in
        areas.iter().zip([(PERIOD_NS, per_period, "per 6 ms period"), (1_000_000_000, per_sec, "per second")])
    {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{}: received rate {what}, by sender", a.source), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..(a.rate_bps as f64 / 1e6 * 1.1))
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("Mbit/s")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|x| e(&x))?;
        let n = (t1 - t0) / w;
        for (i, tag) in tags.iter().enumerate() {
            let color = colors[i % colors.len()];
            let pts = (0..n).map(|k| {
                let c = m.get(&k).and_then(|x| x.get(tag)).copied().unwrap_or(0);
                ((k * w) as f64 / 1e9, c as f64 * dgram * 8.0 / (w as f64 / 1e9) / 1e6)
            });
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(if w == PERIOD_NS { 1 } else { 2 })))
                .map_err(|x| e(&x))?
                .label(format!("{tag}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        super::plot::legend(&mut chart, SeriesLabelPosition::UpperRight, 14).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
