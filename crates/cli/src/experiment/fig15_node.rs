//! RCANE Fig. 15, memory with ARM (§VI-D.1), on a testbed of real daemons.
//!
//! The paper's Fig. 14 as a line of three nodes, s - r - d (`anode testbed
//! up`, loopback): the ARM router (`modules/out/arm.wasm`) runs on r in a
//! session whose heap reservation starts small (`--start-heap-kib`) under
//! a ceiling of its session credential (`--ceiling-kib`); the sender and
//! the receiver are played by the harness through the application sockets
//! of s and d. The sender emits `--rate` data packets a second (`[seq u32
//! BE][1000 bytes]`) to r's port 4500 and resends what a NACK forwarded to
//! it (port 4501 at s) names. The router caches, forwards to the receiver,
//! serves NACKs from its cache (hits) or forwards them to the sender
//! (misses), recycles on its heap-pressure callback, and once a second
//! asks for 32 KiB more when fewer than 90 % of that second's NACKs were
//! hits; the node's admission control decides. The receiver (port 4500 at
//! d) loses each data packet from the router with probability `--loss1`,
//! `--loss2` from `--change-at` on (the harness drops them, as the paper's
//! Barehands dropped packets itself), NACKs each gap 20 ms after it sees
//! it and again every 200 ms (± 20 %) until repaired, at most 16 times. It
//! joins first by NACKing a sequence number that does not exist: the
//! router takes the first NACK's source as its downstream receiver.
//!
//! Recorded per second: the session's heap reservation (`anode status`,
//! `rcane.sessions[].heap_bytes`) and the module's heap use (`anode module
//! list`), packets sent and resent by the sender, NACKs sent by the
//! receiver, misses (NACKs that reached the sender) and hits (NACKs less
//! misses: the ones the router answered itself). Writes `fig15-node.csv`
//! and `fig15-node.png`. Nothing here is asserted on timing.

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bed::Testbed;
use anode_daemon::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

/// `anode experiment fig15-node`.
#[derive(Debug, clap::Args)]
pub struct Fig15NodeArgs {
    /// Seconds in all (the paper: the loss doubles after 90 s).
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    /// When the loss doubles, seconds (default: half way).
    #[arg(long)]
    change_at: Option<u32>,
    /// Data packets per second from the sender.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Loss on the router-to-receiver link before the change.
    #[arg(long, default_value_t = 0.25)]
    loss1: f64,
    /// Loss after the change.
    #[arg(long, default_value_t = 0.5)]
    loss2: f64,
    /// The session's heap reservation at the start, KiB.
    #[arg(long, default_value_t = 192)]
    start_heap_kib: u32,
    /// The session credential's heap ceiling, KiB.
    #[arg(long, default_value_t = 4096)]
    ceiling_kib: u32,
    /// Seed of the losses and NACK timeouts.
    #[arg(long, default_value_t = 15)]
    seed: u64,
    /// The ARM module (built by scripts/setup).
    #[arg(long, default_value = "modules/out/arm.wasm")]
    module: PathBuf,
    /// Output directory.
    #[arg(short, long, default_value = "fig15-node-out")]
    out: PathBuf,
}

const DATA_PORT: u16 = 4500;
const NACK_PORT: u16 = 4501;
const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PAYLOAD: usize = 1000;
const FIRST_NACK: Duration = Duration::from_millis(20);
const RETRY: Duration = Duration::from_millis(200);
const MAX_NACKS: u32 = 16;
/// The sequence number a receiver NACKs to join.
const JOIN: u32 = u32::MAX;

/// One second of the run.
#[derive(Debug, Clone, Default)]
struct Sec {
    loss: f64,
    reservation: u64,
    used: u64,
    sent: u64,
    resent: u64,
    nacks: u64,
    misses: u64,
    received: u64,
}

impl Sec {
    fn hits(&self) -> u64 {
        self.nacks.saturating_sub(self.misses)
    }
}

/// A small seeded generator (xorshift64*): losses and timeouts.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The line s - r - d of this experiment, users' commands to r.
type Bed = Testbed;

/// The session's heap reservation and the module's heap use, bytes.
/// (Use first: the reservation only grows, so use never exceeds it.)
fn heap(bed: &Bed) -> Result<(u64, u64)> {
    let m = bed.json(&["module", "list"])?;
    let used = m.as_array().and_then(|l| l.iter().find_map(|x| x["heap"]["used"].as_u64())).unwrap_or(0);
    let s = bed.json(&["status"])?;
    let reservation = s["rcane"]["sessions"]
        .as_array()
        .and_then(|l| l.iter().filter_map(|x| x["heap_bytes"].as_u64()).max())
        .ok_or_else(|| anyhow!("no session on r"))?;
    Ok((reservation, used))
}

/// Sets up the testbed, the session and the module.
fn setup(a: &Fig15NodeArgs, module: &Path, dir: PathBuf) -> Result<Bed> {
    let line3 = "node = [{ name = \"s\", address = \"10.0.0.1\" }, { name = \"r\", address = \"10.0.0.2\" }, \
                 { name = \"d\", address = \"10.0.0.3\" }]\nlink = [{ a = \"s\", b = \"r\" }, { a = \"r\", b = \"d\" }]\n";
    let bed = Testbed::up(std::env::current_exe()?, dir, line3, &["arm"], &[], "r")?;
    let ceiling = format!("{}KiB", a.ceiling_kib);
    let session = ["--kind", "session", "--vp-share", "20%", "--total-share", "20%", "--extra", "--heap", &ceiling];
    let sc = bed.cred("arm", "arm.session", &session)?;
    let wasm = module.to_string_lossy().into_owned();
    let grant = ["--kind", "module", "--module", &wasm, "--interface", "net,time,route", "--cpu", "10000000"];
    let mc = bed.cred("arm", "arm.cred", &grant)?;
    let start = format!("{}KiB", a.start_heap_kib);
    bed.user("arm", &["session", "open", "--credential", &sc, "--vp", "2ms/10ms+extra", "--heap", &start])?;
    bed.user("arm", &["module", "load", &wasm, "--credential", &mc])?;
    Ok(bed)
}

type Secs = Arc<Mutex<Vec<Sec>>>;

fn bump(secs: &Secs, start: Instant, f: impl FnOnce(&mut Sec)) {
    let i = start.elapsed().as_secs() as usize;
    if let Ok(mut v) = secs.lock()
        && let Some(s) = v.get_mut(i)
    {
        f(s);
    }
}

fn packet(seq: u32) -> Vec<u8> {
    let mut p = vec![0u8; 4 + PAYLOAD];
    p[..4].copy_from_slice(&seq.to_be_bytes());
    p
}

/// The sender at s: data at `rate`, a resend for every NACK that reaches it.
fn sender(mut c: Client, rate: u32, end: Instant, start: Instant, secs: Secs) -> Result<()> {
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut seq = 0u32;
    let mut due = Instant::now();
    while Instant::now() < end {
        let now = Instant::now();
        if now >= due {
            c.plain(ROUTER, DATA_PORT, 64, &packet(seq)).map_err(|e| anyhow!("sending data: {e}"))?;
            seq += 1;
            due += gap;
            bump(&secs, start, |s| s.sent += 1);
            continue;
        }
        if let Some((NACK_PORT, n)) = c.recv(due - now).map_err(|e| anyhow!("sender receiving: {e}"))?
            && let Ok(b) = <[u8; 4]>::try_from(n.as_slice())
        {
            let s = u32::from_be_bytes(b);
            if s != JOIN {
                bump(&secs, start, |x| x.misses += 1);
            }
            if s != JOIN && s < seq {
                c.plain(ROUTER, DATA_PORT, 64, &packet(s)).map_err(|e| anyhow!("resending: {e}"))?;
                bump(&secs, start, |x| x.resent += 1);
            }
        }
    }
    Ok(())
}

/// The receiver at d: loses packets, NACKs gaps until repaired.
fn receiver(mut c: Client, a: &ReceiverParams, start: Instant, secs: Secs, stop: Arc<AtomicBool>) -> Result<()> {
    let mut rng = Rng(a.seed | 1);
    let mut got: HashSet<u32> = HashSet::new();
    let mut next = 0u32; // every seq below this was seen or is pending
    // seq -> (next NACK at, NACKs sent)
    let mut pending: BTreeMap<u32, (Instant, u32)> = BTreeMap::new();
    let mut joined = false;
    let mut join_at = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if !joined && now >= join_at {
            c.plain(ROUTER, NACK_PORT, 64, &JOIN.to_be_bytes()).map_err(|e| anyhow!("joining: {e}"))?;
            join_at = now + Duration::from_millis(100);
        }
        // NACKs due.
        let due: Vec<u32> = pending.iter().filter(|(_, (t, _))| *t <= now).map(|(s, _)| *s).collect();
        for s in due {
            let Some((t, n)) = pending.get_mut(&s) else { continue };
            if *n >= MAX_NACKS {
                pending.remove(&s);
                continue;
            }
            c.plain(ROUTER, NACK_PORT, 64, &s.to_be_bytes()).map_err(|e| anyhow!("sending a NACK: {e}"))?;
            *n += 1;
            *t = now + RETRY.mul_f64(0.8 + 0.4 * rng.unit());
            bump(&secs, start, |x| x.nacks += 1);
        }
        let wait = pending.values().map(|(t, _)| *t).min().map_or(Duration::from_millis(5), |t| {
            t.saturating_duration_since(Instant::now()).min(Duration::from_millis(5))
        });
        let Some((DATA_PORT, p)) = c.recv(wait).map_err(|e| anyhow!("receiver receiving: {e}"))? else { continue };
        let Some(b) = p.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) else { continue };
        joined = true;
        let loss = if start.elapsed() >= a.change_at { a.loss2 } else { a.loss1 };
        if rng.unit() < loss {
            continue; // the lossy link
        }
        let s = u32::from_be_bytes(b);
        bump(&secs, start, |x| x.received += 1);
        got.insert(s);
        pending.remove(&s);
        let now = Instant::now();
        while next < s {
            if !got.contains(&next) {
                pending.entry(next).or_insert((now + FIRST_NACK, 0));
            }
            next += 1;
        }
        next = next.max(s + 1);
    }
    Ok(())
}

struct ReceiverParams {
    loss1: f64,
    loss2: f64,
    change_at: Duration,
    seed: u64,
}

/// Runs `anode experiment fig15-node`.
pub fn run(a: Fig15NodeArgs) -> Result<std::process::ExitCode> {
    let change_at = a.change_at.unwrap_or(a.seconds / 2);
    if a.seconds < 4 || change_at >= a.seconds || a.rate == 0 || a.rate > 5000 {
        bail!("give --seconds >= 4, --change-at below it, --rate 1..=5000");
    }
    if !(0.0..1.0).contains(&a.loss1) || !(0.0..1.0).contains(&a.loss2) || a.start_heap_kib > a.ceiling_kib {
        bail!("losses must be in 0..1, the start heap at most the ceiling");
    }
    let module = std::fs::canonicalize(&a.module)
        .with_context(|| format!("{} (build the example modules: scripts/setup)", a.module.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let dir = std::env::temp_dir().join(format!("anode-fig15-node-{}", std::process::id()));
    let bed = setup(&a, &module, dir.clone())?;
    let n = a.seconds as usize;
    let secs: Secs = Arc::new(Mutex::new(vec![Sec::default(); n + 1]));
    let tx = Client::connect(dir.join("tb/s")).map_err(|e| anyhow!("s's application socket: {e}"))?;
    let mut rx = Client::connect(dir.join("tb/d")).map_err(|e| anyhow!("d's application socket: {e}"))?;
    let mut tx = tx;
    tx.register(NACK_PORT).map_err(|e| anyhow!("registering {NACK_PORT} at s: {e}"))?;
    rx.register(DATA_PORT).map_err(|e| anyhow!("registering {DATA_PORT} at d: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let params = ReceiverParams {
        loss1: a.loss1,
        loss2: a.loss2,
        change_at: Duration::from_secs(u64::from(change_at)),
        seed: a.seed,
    };
    let recv_thread = {
        let (secs, stop) = (secs.clone(), stop.clone());
        std::thread::spawn(move || receiver(rx, &params, start, secs, stop))
    };
    // Let the receiver join before the data starts.
    std::thread::sleep(Duration::from_millis(300));
    let end = start + Duration::from_secs(u64::from(a.seconds));
    let send_thread = {
        let secs = secs.clone();
        let rate = a.rate;
        std::thread::spawn(move || sender(tx, rate, end, start, secs))
    };
    for i in 0..n {
        let due = start + Duration::from_secs(i as u64 + 1);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let (reservation, used) = heap(&bed)?;
        if let Ok(mut v) = secs.lock()
            && let Some(s) = v.get_mut(i)
        {
            s.reservation = reservation;
            s.used = used;
            s.loss = if i as u32 >= change_at { a.loss2 } else { a.loss1 };
        }
        if let Ok(v) = secs.lock()
            && let Some(s) = v.get(i)
        {
            eprintln!(
                "{:3} s loss {:.0} %: heap {} KiB (used {} KiB), sent {} (+{} resent), NACKs {}, hits {} ({:.1} %)",
                i + 1,
                100.0 * s.loss,
                s.reservation / 1024,
                s.used / 1024,
                s.sent,
                s.resent,
                s.nacks,
                s.hits(),
                100.0 * s.hits() as f64 / s.nacks.max(1) as f64
            );
        }
    }
    send_thread.join().map_err(|_| anyhow!("the sender panicked"))??;
    stop.store(true, Ordering::Relaxed);
    recv_thread.join().map_err(|_| anyhow!("the receiver panicked"))??;
    drop(bed);
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<Sec> = secs.lock().map_err(|_| anyhow!("poisoned"))?.iter().take(n).cloned().collect();
    let mut csv = format!(
        "# fig15-node: rate={} loss1={} loss2={} change_at={change_at} start_heap_kib={} ceiling_kib={} seed={}\n\
         second,loss,reservation_kib,used_kib,sent,resent,nacks,misses,hits,hit_pct,received\n",
        a.rate, a.loss1, a.loss2, a.start_heap_kib, a.ceiling_kib, a.seed
    );
    for (i, s) in rows.iter().enumerate() {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{:.1},{}\n",
            i + 1,
            s.loss,
            s.reservation / 1024,
            s.used / 1024,
            s.sent,
            s.resent,
            s.nacks,
            s.misses,
            s.hits(),
            100.0 * s.hits() as f64 / s.nacks.max(1) as f64,
            s.received
        ));
    }
    let p = a.out.join("fig15-node.csv");
    std::fs::write(&p, csv).with_context(|| format!("writing {}", p.display()))?;
    let png = a.out.join("fig15-node.png");
    plot(&rows, change_at, &png)?;
    eprintln!("wrote {} and {}", p.display(), png.display());
    Ok(std::process::ExitCode::SUCCESS)
}

fn plot(rows: &[Sec], change_at: u32, out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (1100, 800)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, bottom) = root.split_vertically(400);
    let xmax = rows.len() as f64 + 1.0;
    let kmax = rows.iter().map(|s| s.reservation / 1024).max().unwrap_or(256) as f64 * 1.1;
    let mut c = ChartBuilder::on(&top)
        .caption("Fig. 15 on daemons: ARM router's session heap", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..kmax)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("time (s)").y_desc("KiB").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
    let series =
        |f: fn(&Sec) -> f64| rows.iter().enumerate().map(move |(i, s)| (i as f64 + 1.0, f(s))).collect::<Vec<_>>();
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    let green = RGBColor(44, 160, 44);
    let grey = RGBColor(127, 127, 127);
    c.draw_series(LineSeries::new(series(|s| (s.reservation / 1024) as f64), blue.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("reservation (anode status)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    c.draw_series(LineSeries::new(series(|s| (s.used / 1024) as f64), orange.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("used (module list)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(2)));
    let ch = f64::from(change_at);
    c.draw_series(LineSeries::new(vec![(ch, 0.0), (ch, kmax)], grey.stroke_width(1)))
        .map_err(|x| e(&x))?
        .label("loss 25 % -> 50 %")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(2)));
    super::plot::legend(&mut c, SeriesLabelPosition::LowerRight, 13).map_err(|x| e(&x))?;
    let pmax = rows.iter().map(|s| s.sent.max(s.nacks)).max().unwrap_or(100) as f64 * 1.1;
    let mut c = ChartBuilder::on(&bottom)
        .caption("packets per second", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..pmax)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("packets")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    c.draw_series(LineSeries::new(series(|s| s.sent as f64), blue.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("data sent")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    c.draw_series(LineSeries::new(series(|s| s.nacks as f64), orange.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("NACKs")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(2)));
    c.draw_series(LineSeries::new(series(|s| s.hits() as f64), green.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("hits (NACKs less misses)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], green.stroke_width(2)));
    c.draw_series(LineSeries::new(vec![(ch, 0.0), (ch, pmax)], grey.stroke_width(1))).map_err(|x| e(&x))?;
    super::plot::legend(&mut c, SeriesLabelPosition::UpperLeft, 13).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_uniform_enough_for_a_loss_rate() {
        let mut r = Rng(15);
        let n = 100_000;
        let lost = (0..n).filter(|_| r.unit() < 0.25).count();
        assert!((24_000..26_000).contains(&lost), "{lost}");
        assert!((0..1000).map(|_| r.unit()).all(|x| (0.0..1.0).contains(&x)));
    }

    #[test]
    fn hits_are_nacks_less_misses() {
        let s = Sec { nacks: 10, misses: 3, ..Sec::default() };
        assert_eq!(s.hits(), 7);
        assert_eq!(Sec { nacks: 1, misses: 2, ..Sec::default() }.hits(), 0);
    }
}
