//! RCANE Fig. 15, memory with ARM (§VI-D.1), in anode's terms.
//!
//! The router runs `modules/arm` (ARM's caching router, Rust, the SDK) in
//! a real [`Sandbox`], in a session whose heap reservation starts small; the
//! harness plays the rest of the paper's Fig. 14 testbed: the sender
//! (Rocket) emits data packets at a fixed rate over a lossless link; the
//! router-to-receiver link (Vixen to Barehands) drops [`Params::loss1`] of
//! the packets, then [`Params::loss2`] from [`Params::change_at`]; the
//! receiver NACKs each gap after a short delay and again after a timeout
//! until it is repaired; NACKs go to the module, and the misses it forwards
//! reach the sender, which resends. The harness is also the node around the
//! sandbox: it runs channel packets, alarms and heap-pressure callbacks as
//! jobs (`demux_into`, `due_jobs`, `poll_at`, as the node does), and
//! decides the module's `HeapRequest`s as the node's admission control
//! does (`Node::module_heap_request`): granted whole if within the
//! ceiling, then given to the sandbox with `set_session_heap`.
//!
//! Sans-I/O and deterministic: time is virtual (µs), losses and timeouts
//! come from a seeded generator, so the figure is the same on every
//! machine. What it records per second: the reservation and use of the
//! session heap, packets sent by the sender, NACKs received by the router,
//! and the hits and misses among them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anode_cred::{Issuer, PrincipalId, RequestedLimits};
use anode_sandbox::{Action, Job, LoadSpec, ModuleId, Now, Sandbox, SandboxConfig, StaticRoutes, Step};
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

/// `anode experiment fig15`.
#[derive(Debug, clap::Args)]
pub struct Fig15Args {
    /// Virtual seconds in all (the paper's loss doubles after 90 s).
    #[arg(long, default_value_t = 180)]
    seconds: u32,
    /// When the loss doubles, virtual seconds (default: half way).
    #[arg(long)]
    change_at: Option<u32>,
    /// Data packets per second from the sender.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// The session's heap reservation at the start, KiB.
    #[arg(long, default_value_t = 192)]
    start_heap_kib: u32,
    /// The most the node grants the session, KiB (admission control).
    #[arg(long, default_value_t = 4096)]
    ceiling_kib: u32,
    /// Seed of the losses and timeouts.
    #[arg(long, default_value_t = 15)]
    seed: u64,
    /// The ARM module (built by scripts/setup).
    #[arg(long, default_value = "modules/out/arm.wasm")]
    module: PathBuf,
    /// Output directory (fig15.csv, fig15.png).
    #[arg(short, long, default_value = "fig15-out")]
    out: PathBuf,
}

/// The module's ports (modules/arm).
const DATA_PORT: u16 = 4500;
const NACK_PORT: u16 = 4501;
const SENDER: Ipv4Addr = Ipv4Addr::new(10, 0, 14, 1);
const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 0, 14, 2);
const RECEIVER: Ipv4Addr = Ipv4Addr::new(10, 0, 14, 3);

/// The experiment's parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Virtual seconds.
    pub seconds: u32,
    /// When the loss becomes `loss2`, seconds.
    pub change_at: u32,
    /// Data packets per second.
    pub rate: u32,
    /// Payload bytes per data packet (after the 4-byte sequence number).
    pub payload: usize,
    /// Loss on the router-to-receiver link before `change_at`.
    pub loss1: f64,
    /// And after.
    pub loss2: f64,
    /// One-way delay of each link, µs.
    pub link_us: u64,
    /// The receiver's delay before its first NACK for a gap, µs.
    pub nack_delay_us: u64,
    /// Its timeout before NACKing again, µs (± 20 %, random).
    pub retry_us: u64,
    /// NACKs per packet before the receiver gives up.
    pub max_tries: u32,
    /// Initial heap reservation, bytes.
    pub start_heap: usize,
    /// The node's ceiling for the session, bytes.
    pub ceiling: usize,
    /// Seed.
    pub seed: u64,
}

impl Params {
    fn from_args(a: &Fig15Args) -> Params {
        Params {
            seconds: a.seconds,
            change_at: a.change_at.unwrap_or(a.seconds / 2),
            rate: a.rate,
            payload: 1000,
            loss1: 0.25,
            loss2: 0.5,
            link_us: 5_000,
            nack_delay_us: 20_000,
            retry_us: 200_000,
            max_tries: 16,
            start_heap: a.start_heap_kib as usize * 1024,
            ceiling: a.ceiling_kib as usize * 1024,
            seed: a.seed,
        }
    }
}

/// One second of the run.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// End of the second, s.
    pub t: u32,
    /// Loss on the router-to-receiver link.
    pub loss: f64,
    /// The session's heap reservation at the end of the second, bytes.
    pub reservation: usize,
    /// Charged to the session's heap then, bytes.
    pub used: usize,
    /// Packets the sender sent (new and resent).
    pub sent: u32,
    /// Of those, resent for a NACK.
    pub resent: u32,
    /// NACKs the router received.
    pub nacks: u32,
    /// NACKs it served from its cache.
    pub hits: u32,
    /// NACKs it forwarded to the sender.
    pub misses: u32,
}

/// What the run ends with beside its rows.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Heap requests granted and refused.
    pub granted: u32,
    /// Refused (above the ceiling).
    pub refused: u32,
    /// Pressure callbacks the sandbox flagged.
    pub pressure_calls: u64,
    /// Packets the receiver never got (gave up after `max_tries` NACKs).
    pub gave_up: u32,
    /// Invocations that failed (trap, fuel, memory).
    pub failed: u32,
    /// The module's own counters at the end (`stats` entry).
    pub module: Vec<(&'static str, i32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// Sample the second that ends now.
    Sample,
    /// The sender emits its next packet.
    Emit,
    /// A data packet (from the sender) reaches the router.
    RouterData(u32),
    /// A NACK reaches the router.
    RouterNack(u32),
    /// A data packet reaches the receiver.
    ReceiverData(u32),
    /// The receiver checks whether `seq` arrived; NACK number `tries + 1` if not.
    ReceiverCheck(u32, u32),
    /// A NACK forwarded by the router reaches the sender.
    SenderNack(u32),
}

/// splitmix64: a seeded, reproducible stream for losses and jitter.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn now(t_us: u64) -> Now {
    Now { ms: t_us / 1000, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

struct Sim {
    p: Params,
    sb: Sandbox,
    module: ModuleId,
    principal: PrincipalId,
    t: u64,
    order: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    rng: Rng,
    next_seq: u32,
    /// Receiver: which sequence numbers arrived, and the next one expected.
    received: Vec<bool>,
    expected: u32,
    cur: Row,
    rows: Vec<Row>,
    totals: Totals,
}

impl Sim {
    fn new(p: Params, code: &[u8]) -> Result<Sim> {
        let issuer = Issuer::from_secret(&[15; 32]).map_err(|e| anyhow!("{e}"))?;
        let table = [(SENDER, SENDER), (RECEIVER, RECEIVER)].into_iter().collect();
        let routes = StaticRoutes { this: ROUTER, table };
        let mut sb = Sandbox::new(issuer.public_key(), SandboxConfig::default(), Arc::new(routes))
            .map_err(|e| anyhow!("{e}"))?;
        let principal = PrincipalId([15; 32]);
        sb.set_session_heap(principal, Some(p.start_heap));
        let cred = issuer.admin(principal, None).map_err(|e| anyhow!("{e}"))?;
        let limits = RequestedLimits { cpu: Some(10_000_000), memory: Some(64 << 20), ..Default::default() };
        let spec =
            LoadSpec { code, credential: Some(cred.to_bytes()), requester: None, local_name: Some("arm"), limits };
        let mut out = Vec::new();
        let module = sb.load_with(now(0), &spec, &mut out).map_err(|e| anyhow!("loading the ARM module: {e}"))?;
        let mut sim = Sim {
            rng: Rng(p.seed),
            received: Vec::new(),
            p,
            sb,
            module,
            principal,
            t: 0,
            order: 0,
            queue: BinaryHeap::new(),
            next_seq: 0,
            expected: 0,
            cur: Row::default(),
            rows: Vec::new(),
            totals: Totals::default(),
        };
        sim.apply(out, None);
        let r = sim.sb.invoke(now(0), module, "downstream", &RECEIVER.octets(), &mut Vec::new());
        if r != Ok(0) {
            bail!("the module did not take its downstream address: {r:?}");
        }
        Ok(sim)
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.order += 1;
        self.queue.push(Reverse((t, self.order, ev)));
    }

    fn loss(&self) -> f64 {
        if self.t < u64::from(self.p.change_at) * 1_000_000 { self.p.loss1 } else { self.p.loss2 }
    }

    fn packet(&self, seq: u32) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + self.p.payload);
        v.extend_from_slice(&seq.to_be_bytes());
        v.resize(4 + self.p.payload, seq as u8);
        v
    }

    /// Runs a job to its end and applies its actions; `nack` says whether
    /// it is a NACK's (its sends are hits or misses).
    fn run(&mut self, job: Job, nack: Option<()>) -> Result<()> {
        let mut out = Vec::new();
        match self.sb.start(now(self.t), job) {
            Ok(Some(task)) => match self.sb.resume(task, &mut || true, &mut out) {
                Step::Done(Ok(_)) => {}
                Step::Done(Err(_)) => self.totals.failed += 1,
                Step::Yielded(_) => bail!("an invocation yielded without a yield bound"),
            },
            Ok(None) => {}
            Err(_) => self.totals.failed += 1,
        }
        self.apply(out, nack);
        let mut inv = Vec::new();
        self.sb.take_invocations(&mut inv);
        Ok(())
    }

    /// The node's part: route the module's packets, decide its heap requests.
    fn apply(&mut self, out: Vec<Action>, nack: Option<()>) {
        for a in out {
            match a {
                Action::SendPacket { dst, port, payload, .. } => {
                    let Some(seq) = payload.get(..4).map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]])) else {
                        continue;
                    };
                    if dst == RECEIVER && port == DATA_PORT {
                        if nack.is_some() {
                            self.cur.hits += 1;
                        }
                        if self.rng.next_f64() >= self.loss() {
                            self.at(self.t + self.p.link_us, Ev::ReceiverData(seq));
                        }
                    } else if dst == SENDER && port == NACK_PORT {
                        if nack.is_some() {
                            self.cur.misses += 1;
                        }
                        self.at(self.t + self.p.link_us, Ev::SenderNack(seq));
                    }
                }
                Action::HeapRequest { principal, bytes, .. } => {
                    // Admission control: the whole request within the ceiling, or nothing.
                    match usize::try_from(bytes) {
                        Ok(b) if b <= self.p.ceiling => {
                            self.sb.set_session_heap(principal, Some(b));
                            self.totals.granted += 1;
                        }
                        _ => self.totals.refused += 1,
                    }
                }
                _ => {}
            }
        }
    }

    /// A packet for the router: early demultiplexing into its channels'
    /// jobs, then each job.
    fn router_receives(&mut self, source: Ipv4Addr, port: u16, payload: &[u8]) -> Result<()> {
        let mut jobs = Vec::new();
        self.sb.demux_into(source, port, payload, &mut jobs);
        for j in jobs {
            self.run(j, (port == NACK_PORT).then_some(()))?;
        }
        Ok(())
    }

    fn event(&mut self, ev: Ev) -> Result<()> {
        match ev {
            Ev::Sample => {
                let h = self.sb.heap(&self.principal);
                let t = (self.t / 1_000_000) as u32;
                let row = Row {
                    t,
                    // The loss during the second that ends now.
                    loss: if t <= self.p.change_at { self.p.loss1 } else { self.p.loss2 },
                    reservation: h.as_ref().and_then(|h| h.reservation).unwrap_or(0),
                    used: h.as_ref().map_or(0, |h| h.used),
                    ..std::mem::take(&mut self.cur)
                };
                self.rows.push(row);
            }
            Ev::Emit => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.cur.sent += 1;
                self.at(self.t + self.p.link_us, Ev::RouterData(seq));
                self.at(self.t + 1_000_000 / u64::from(self.p.rate.max(1)), Ev::Emit);
            }
            Ev::SenderNack(seq) => {
                if seq < self.next_seq {
                    self.cur.sent += 1;
                    self.cur.resent += 1;
                    self.at(self.t + self.p.link_us, Ev::RouterData(seq));
                }
            }
            Ev::RouterData(seq) => {
                let pkt = self.packet(seq);
                self.router_receives(SENDER, DATA_PORT, &pkt)?;
            }
            Ev::RouterNack(seq) => {
                self.cur.nacks += 1;
                self.router_receives(RECEIVER, NACK_PORT, &seq.to_be_bytes())?;
            }
            Ev::ReceiverData(seq) => {
                let i = seq as usize;
                if self.received.len() <= i {
                    self.received.resize(i + 1, false);
                }
                if let Some(r) = self.received.get_mut(i) {
                    *r = true;
                }
                if seq >= self.expected {
                    for s in self.expected..seq {
                        self.at(self.t + self.p.nack_delay_us, Ev::ReceiverCheck(s, 0));
                    }
                    self.expected = seq + 1;
                }
            }
            Ev::ReceiverCheck(seq, tries) => {
                if self.received.get(seq as usize).copied().unwrap_or(false) {
                    return Ok(());
                }
                if tries >= self.p.max_tries {
                    self.totals.gave_up += 1;
                    return Ok(());
                }
                self.at(self.t + self.p.link_us, Ev::RouterNack(seq));
                let jitter = 0.8 + 0.4 * self.rng.next_f64();
                let retry = (self.p.retry_us as f64 * jitter) as u64;
                self.at(self.t + retry, Ev::ReceiverCheck(seq, tries + 1));
            }
        }
        Ok(())
    }

    fn run_all(&mut self) -> Result<()> {
        let end = u64::from(self.p.seconds) * 1_000_000;
        for s in 1..=self.p.seconds {
            self.at(u64::from(s) * 1_000_000, Ev::Sample);
        }
        self.at(0, Ev::Emit);
        loop {
            let ev_t = self.queue.peek().map(|Reverse((t, _, _))| *t);
            let sb_t = self.sb.poll_at().map(|ms| ms.saturating_mul(1000).max(self.t));
            match (ev_t, sb_t) {
                (_, Some(s)) if s <= end && ev_t.is_none_or(|e| s <= e) => {
                    // Alarms and pressure callbacks, as jobs.
                    self.t = s;
                    let mut jobs = Vec::new();
                    self.sb.due_jobs(now(self.t), &mut jobs);
                    if jobs.is_empty() && self.sb.poll_at().map(|ms| ms.saturating_mul(1000).max(self.t)) == Some(s) {
                        bail!("the sandbox is due at {s} µs but has no jobs");
                    }
                    for j in jobs {
                        self.run(j, None)?;
                    }
                }
                (Some(e), _) if e <= end => {
                    let Some(Reverse((t, _, ev))) = self.queue.pop() else { break };
                    self.t = t;
                    self.event(ev)?;
                }
                _ => break,
            }
        }
        let mut module = Vec::new();
        for name in ["data", "nacks", "hits", "misses", "recycled", "evicted", "pages", "grow_refused", "requests"] {
            let v = self.sb.invoke(now(end), self.module, "stats", name.as_bytes(), &mut Vec::new()).unwrap_or(-1);
            module.push((name, v));
        }
        self.totals.module = module;
        self.totals.pressure_calls = self.sb.heap(&self.principal).map_or(0, |h| h.pressure_calls);
        Ok(())
    }
}

/// Runs the experiment: one row per second.
pub fn simulate(p: Params, code: &[u8]) -> Result<(Vec<Row>, Totals)> {
    let mut sim = Sim::new(p, code)?;
    sim.run_all()?;
    Ok((sim.rows, sim.totals))
}

/// The figures that say whether the shape is the paper's.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Reservation at the start, bytes.
    pub start: usize,
    /// At the end of the first (lower-loss) phase.
    pub end1: usize,
    /// At the end of the run.
    pub end2: usize,
    /// Hits per NACK over the last fifth of each phase.
    pub hits1_late: f64,
    /// Over the first five seconds after the change.
    pub hits2_early: f64,
    /// Over the last fifth of the run.
    pub hits2_late: f64,
}

/// Hits per NACK over `rows`.
fn ratio(rows: &[Row]) -> f64 {
    let n: u32 = rows.iter().map(|r| r.nacks).sum();
    let h: u32 = rows.iter().map(|r| r.hits).sum();
    if n == 0 { 1.0 } else { f64::from(h) / f64::from(n) }
}

/// The shape of a run whose loss changed at `change_at` seconds.
pub fn shape(rows: &[Row], p: &Params) -> Shape {
    let (one, two): (Vec<Row>, Vec<Row>) = rows.iter().cloned().partition(|r| r.t <= p.change_at);
    let fifth = |v: &[Row]| v.len().saturating_sub(v.len() / 5);
    Shape {
        start: p.start_heap,
        end1: one.last().map_or(0, |r| r.reservation),
        end2: two.last().map_or(0, |r| r.reservation),
        hits1_late: ratio(one.get(fifth(&one)..).unwrap_or_default()),
        hits2_early: ratio(two.get(..5.min(two.len())).unwrap_or_default()),
        hits2_late: ratio(two.get(fifth(&two)..).unwrap_or_default()),
    }
}

/// Runs `anode experiment fig15`.
pub fn run(a: Fig15Args) -> Result<std::process::ExitCode> {
    if !(10..=3600).contains(&a.seconds) {
        bail!("--seconds must be 10..3600");
    }
    if !(1..=100_000).contains(&a.rate) {
        bail!("--rate must be 1..100000 packets per second");
    }
    let p = Params::from_args(&a);
    if p.change_at == 0 || p.change_at >= p.seconds {
        bail!("--change-at must be within the run");
    }
    if p.start_heap > p.ceiling {
        bail!("--start-heap-kib must not exceed --ceiling-kib");
    }
    let code = std::fs::read(&a.module)
        .with_context(|| format!("reading {} (build it with scripts/setup)", a.module.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let (rows, totals) = simulate(p.clone(), &code)?;
    let mut csv = String::from("t_s,loss,reservation_kib,used_kib,sent,resent,nacks,hits,misses\n");
    for r in &rows {
        csv.push_str(&format!(
            "{},{:.2},{:.1},{:.1},{},{},{},{},{}\n",
            r.t,
            r.loss,
            r.reservation as f64 / 1024.0,
            r.used as f64 / 1024.0,
            r.sent,
            r.resent,
            r.nacks,
            r.hits,
            r.misses
        ));
    }
    let csv_path = a.out.join("fig15.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let png = a.out.join("fig15.png");
    plot(&rows, &p, &png)?;
    let s = shape(&rows, &p);
    eprintln!(
        "reservation: start {} KiB, end of {:.0} % loss {} KiB, end of {:.0} % loss {} KiB",
        s.start / 1024,
        p.loss1 * 100.0,
        s.end1 / 1024,
        p.loss2 * 100.0,
        s.end2 / 1024
    );
    eprintln!(
        "hits per NACK: last fifth of phase 1 {:.1} %, first 5 s of phase 2 {:.1} %, last fifth of phase 2 {:.1} %",
        100.0 * s.hits1_late,
        100.0 * s.hits2_early,
        100.0 * s.hits2_late
    );
    eprintln!(
        "heap requests granted {}, refused {}; pressure calls {}; packets given up {}; failed invocations {}",
        totals.granted, totals.refused, totals.pressure_calls, totals.gave_up, totals.failed
    );
    let m: Vec<String> = totals.module.iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!("module: {}", m.join(", "));
    eprintln!("wrote {} and {}", csv_path.display(), png.display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// A plotted series: name, colour, value of a row.
type Series = (&'static str, RGBColor, fn(&Row) -> f64);

fn plot(rows: &[Row], p: &Params, out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (1100, 800)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (top, bottom) = root.split_vertically(380);
    let xmax = f64::from(p.seconds);
    let kib_max = rows.iter().map(|r| r.reservation.max(r.used)).max().unwrap_or(1) as f64 / 1024.0 * 1.1;
    let mut c = ChartBuilder::on(&top)
        .caption(
            format!(
                "ARM router's session heap (loss {:.0} %, then {:.0} % from {} s)",
                p.loss1 * 100.0,
                p.loss2 * 100.0,
                p.change_at
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..kib_max)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("time (s)").y_desc("KiB").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
    let series: [Series; 2] = [
        ("heap reservation", RGBColor(31, 119, 180), |r| r.reservation as f64 / 1024.0),
        ("heap used", RGBColor(255, 127, 14), |r| r.used as f64 / 1024.0),
    ];
    for (name, col, f) in series {
        c.draw_series(LineSeries::new(rows.iter().map(|r| (f64::from(r.t), f(r))), col.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
    }
    super::plot::legend(&mut c, SeriesLabelPosition::LowerRight, 13).map_err(|x| e(&x))?;
    let pmax = rows.iter().map(|r| r.sent.max(r.nacks)).max().unwrap_or(1) as f64 * 1.1;
    let mut c = ChartBuilder::on(&bottom)
        .caption("per second: packets sent by the sender, NACKs at the router, cache hits", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, 0f64..pmax)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("packets / s")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    let series: [Series; 3] = [
        ("packets sent", RGBColor(44, 160, 44), |r| f64::from(r.sent)),
        ("NACKs received", RGBColor(214, 39, 40), |r| f64::from(r.nacks)),
        ("cache hits", RGBColor(148, 103, 189), |r| f64::from(r.hits)),
    ];
    for (name, col, f) in series {
        c.draw_series(LineSeries::new(rows.iter().map(|r| (f64::from(r.t), f(r))), col.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
    }
    super::plot::legend(&mut c, SeriesLabelPosition::UpperLeft, 13).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn module() -> Vec<u8> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/arm.wasm");
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup)", p.display()))
    }

    fn params(seconds: u32, change_at: u32) -> Params {
        let a = Fig15Args {
            seconds,
            change_at: Some(change_at),
            rate: 1000,
            start_heap_kib: 192,
            ceiling_kib: 4096,
            seed: 15,
            module: PathBuf::new(),
            out: PathBuf::new(),
        };
        Params::from_args(&a)
    }

    /// On virtual time the run is deterministic: its shape is checked, not timed.
    #[test]
    fn the_reservation_grows_settles_and_grows_again_when_the_loss_doubles() {
        let p = params(40, 20);
        let (rows, totals) = simulate(p.clone(), &module()).unwrap();
        assert_eq!(rows.len(), 40);
        let s = shape(&rows, &p);
        assert!(s.end1 > s.start, "the reservation grows under 25 % loss: {s:?}");
        assert!(s.end2 > s.end1, "and grows again under 50 % loss: {s:?}");
        // It settles: no growth over the last fifth of the first phase.
        let one: Vec<&Row> = rows.iter().filter(|r| r.t <= p.change_at).collect();
        let late = &one[one.len() - one.len() / 5..];
        assert!(late.iter().all(|r| r.reservation == s.end1), "settled before the change: {s:?}");
        assert!(s.hits1_late >= 0.9, "the settled cache serves 90 % of NACKs: {s:?}");
        assert!(s.hits2_early < 0.9, "doubling the loss costs hits: {s:?}");
        assert!(s.hits2_late >= 0.9 && s.hits2_late > s.hits2_early, "the hits recover after growth: {s:?}");
        // The reservation never shrinks, use stays within it, and the
        // module grew under pressure without failing.
        assert!(rows.windows(2).all(|w| w[1].reservation >= w[0].reservation));
        assert!(rows.iter().all(|r| r.used <= r.reservation));
        assert!(totals.pressure_calls > 0 && totals.granted > 0 && totals.refused == 0, "{totals:?}");
        assert_eq!(totals.failed, 0);
        assert_eq!(totals.gave_up, 0);
        // The module's own counters agree with what the harness saw.
        let m = |k: &str| totals.module.iter().find(|(n, _)| *n == k).map(|(_, v)| *v).unwrap();
        let sum = |f: fn(&Row) -> u32| rows.iter().map(f).sum::<u32>() as i32;
        assert_eq!(m("nacks"), sum(|r| r.nacks));
        assert_eq!(m("hits"), sum(|r| r.hits));
        assert_eq!(m("misses"), sum(|r| r.misses));
        assert!(m("recycled") > 0, "pressure recycled entries");
    }

    /// Bad input is counted and dropped: the module never traps on it.
    #[test]
    fn the_module_drops_bad_input_without_trapping() {
        let mut sim = Sim::new(params(10, 5), &module()).unwrap();
        let long = vec![7u8; 3000];
        let cases: [(u16, &[u8]); 6] = [
            (DATA_PORT, b""),
            (DATA_PORT, b"abc"),
            (DATA_PORT, &long),
            (NACK_PORT, b""),
            (NACK_PORT, b"12345"),
            (NACK_PORT, &long),
        ];
        for (port, payload) in cases {
            sim.router_receives(SENDER, port, payload).unwrap();
        }
        let mut out = Vec::new();
        let bad = sim.sb.invoke(now(0), sim.module, "stats", b"bad", &mut out).unwrap();
        assert_eq!(bad, 6);
        assert_eq!(sim.totals.failed, 0);
        for name in ["data", "nacks"] {
            assert_eq!(sim.sb.invoke(now(0), sim.module, "stats", name.as_bytes(), &mut out), Ok(0));
        }
        // A well-formed NACK for a packet never seen is a miss, forwarded
        // upstream once a data packet has named the sender.
        sim.router_receives(SENDER, DATA_PORT, &sim.packet(1)).unwrap();
        sim.router_receives(RECEIVER, NACK_PORT, &9u32.to_be_bytes()).unwrap();
        sim.router_receives(RECEIVER, NACK_PORT, &1u32.to_be_bytes()).unwrap();
        assert_eq!(sim.sb.invoke(now(0), sim.module, "stats", b"misses", &mut out), Ok(1));
        assert_eq!(sim.sb.invoke(now(0), sim.module, "stats", b"hits", &mut out), Ok(1));
        assert_eq!(sim.sb.invoke(now(0), sim.module, "stats", b"unknown", &mut out), Ok(-1));
    }
}
