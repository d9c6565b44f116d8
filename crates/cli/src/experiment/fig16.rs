//! RCANE Fig. 16, isolation of allocation (§VI-D.2), in anode's terms.
//!
//! Two workloads: B has a guarantee of 1 ms in every 4 ms and serves one
//! request per period (about 485 µs of work, keeping a 64 KiB result every
//! 25th request); A runs best effort, lightly at first, then (from the
//! middle of the run) allocating and freeing heavily: long invocations
//! whose allocator writes its blocks and grows its memory as it goes.
//! They run (a) in ONE session (one principal: one store, one heap account
//! of 4 MiB) and (b) in two sessions (two principals, 4 MiB each).
//!
//! RCANE's crosstalk was garbage collection in a shared heap. anode has no
//! collector; what a shared session shares is the store (one invocation of
//! the principal at a time: B's request waits until A's preempted
//! invocation has finished, and its VP's time goes into finishing it, as
//! the node does with `finish_suspended_of`) and the heap account (A's
//! growth leaves B's allocations refused).
//!
//! Sans-I/O and deterministic: the sandbox runs the real wasm; time is
//! virtual, one unit of fuel (≈ one wasm instruction) = 1 ns, advanced at
//! each preemption point (every [`YIELD`] units) and by the rest of the
//! fuel when an invocation ends. The two-VP EDF is written out here (B is
//! the only guaranteed VP: it runs whenever it has work and budget); the
//! node cannot yet bind two modules of one session to two VPs, which the
//! paper's scenario (a) needs.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anode_cred::{Issuer, PrincipalId, RequestedLimits};
use anode_sandbox::{
    InvokeError, Job, JobKind, LoadSpec, ModuleId, Now, Sandbox, SandboxConfig, StaticRoutes, Step, Task,
};
use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;

/// `anode experiment fig16`.
#[derive(Debug, clap::Args)]
pub struct Fig16Args {
    /// Virtual seconds per scenario (A turns heavy half way).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Output directory (fig16.csv, fig16.png).
    #[arg(short, long, default_value = "fig16-out")]
    out: PathBuf,
}

const PERIOD: u64 = 4_000_000;
const SLICE: u64 = 1_000_000;
/// Fuel between preemption points (= virtual ns).
const YIELD: u64 = 50_000;
/// Each session's heap reservation.
const HEAP: usize = 4 << 20;
/// B's loop iterations per request (≈ 8 fuel each: ≈ 485 µs).
const B_ITERS: i32 = 60_000;
/// A's iterations per invocation (≈ 24 fuel each): light (≈ 0.5 ms), heavy (≈ 6 ms).
const A_LIGHT: i32 = 20_000;
const A_HEAVY: i32 = 250_000;

const WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $served (mut i32) (i32.const 0))
  (data (i32.const 0) "serve")
  (data (i32.const 8) "churn")
  ;; B: one request of `arg` iterations; every 25th keeps a 64 KiB result
  ;; (a refused grow is a failed allocation: trap, as Rust's allocator does).
  (func $serve (param i32 i32) (result i32) (local $i i32)
    (global.set $served (i32.add (global.get $served) (i32.const 1)))
    (if (i32.eqz (i32.rem_u (global.get $served) (i32.const 25)))
      (then (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))))
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get 0))))
    (local.get $i))
  ;; A: `arg` allocate-write-free steps; heavy runs (arg >= 100000) do not
  ;; coalesce what they free, so they grow a page every 4096 steps.
  (func $churn (param i32 i32) (result i32) (local $i i32)
    (loop $l
      (i32.store (i32.and (i32.mul (local.get $i) (i32.const 64)) (i32.const 65535)) (local.get $i))
      (if (i32.and (i32.ge_u (local.get 0) (i32.const 100000))
                   (i32.eq (i32.and (local.get $i) (i32.const 4095)) (i32.const 4095)))
        (then (drop (memory.grow (i32.const 1)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get 0))))
    (local.get $i))
  (table (export "__indirect_function_table") 2 funcref)
  (elem (i32.const 0) $serve $churn)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 5) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 5) (i32.const 1)))))"#;

/// One period of B.
#[derive(Debug, Clone, Default)]
struct Row {
    start_ns: u64,
    /// B's own work in the period, ns.
    service_ns: u64,
    /// Time B's VP spent finishing A's invocation (shared store), ns.
    lent_ns: u64,
    /// Worst latency of B's requests completed in the period (release to end), ns.
    latency_ns: Option<u64>,
    /// B's requests that failed (allocation refused) in the period.
    failed: u32,
}

struct Running {
    task: Task,
    /// Preemption points passed (time already advanced for them).
    yields: u64,
    /// B's request release time (None for A).
    release: Option<u64>,
}

struct Sim {
    sb: Sandbox,
    a: ModuleId,
    b: ModuleId,
    t: u64,
}

fn now(t_ns: u64) -> Now {
    Now { ms: t_ns / 1_000_000, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

impl Sim {
    fn new(shared: bool) -> Result<Sim> {
        let issuer = Issuer::from_secret(&[1; 32]).map_err(|e| anyhow!("{e}"))?;
        let routes = StaticRoutes { this: std::net::Ipv4Addr::new(10, 0, 0, 1), table: Default::default() };
        let cfg = SandboxConfig { yield_fuel: Some(YIELD), ..SandboxConfig::default() };
        let mut sb = Sandbox::new(issuer.public_key(), cfg, Arc::new(routes)).map_err(|e| anyhow!("{e}"))?;
        let code = wat::parse_str(WAT).context("the fig16 module")?;
        let pa = PrincipalId([11; 32]);
        let pb = if shared { pa } else { PrincipalId([12; 32]) };
        let mut load = |p: PrincipalId, name: &str| -> Result<ModuleId> {
            sb.set_session_heap(p, Some(HEAP));
            let c = issuer.admin(p, None).map_err(|e| anyhow!("{e}"))?;
            let limits = RequestedLimits { cpu: Some(10_000_000), memory: Some(64 << 20), ..Default::default() };
            let spec = LoadSpec {
                code: &code,
                credential: Some(c.to_bytes()),
                requester: None,
                local_name: Some(name),
                limits,
            };
            sb.load(now(0), &spec).map_err(|e| anyhow!("loading {name}: {e}"))
        };
        let a = load(pa, "a")?;
        let b = load(pb, "b")?;
        Ok(Sim { sb, a, b, t: 0 })
    }

    fn start(&mut self, module: ModuleId, entry: &str, arg: i32, release: Option<u64>) -> Result<Running, InvokeError> {
        let job = Job::new(module, JobKind::Entry { entry: entry.into(), arg }, Vec::new(), 0);
        match self.sb.start(now(self.t), job)? {
            Some(task) => Ok(Running { task, yields: 0, release }),
            None => Err(InvokeError::NoSuchModule),
        }
    }

    /// Runs `r` until it ends or the time reaches `until`; returns the
    /// time it ran, and its result if it ended.
    fn run(&mut self, mut r: Running, until: u64) -> (u64, Result<Option<Running>, InvokeError>) {
        let t0 = self.t;
        let mut t = self.t;
        let mut points = 0u64;
        let mut out = Vec::new();
        let step = self.sb.resume(
            r.task,
            &mut || {
                points += 1;
                t += YIELD;
                t < until
            },
            &mut out,
        );
        r.yields += points;
        match step {
            Step::Yielded(task) => {
                self.t = t;
                (t - t0, Ok(Some(Running { task, ..r })))
            }
            Step::Done(res) => {
                // The rest of the invocation's fuel, after its last preemption point.
                let mut inv = Vec::new();
                self.sb.take_invocations(&mut inv);
                let fuel = inv.last().map_or(0, |i| i.fuel);
                let rest = fuel.saturating_sub(r.yields * YIELD);
                self.t = t + rest;
                (self.t - t0, res.map(|_| None))
            }
        }
    }
}

/// Runs one scenario: B's rows, one per period.
fn scenario(shared: bool, seconds: f64) -> Result<Vec<Row>> {
    let mut sim = Sim::new(shared)?;
    let end = (seconds * 1e9) as u64;
    let heavy_from = end / 2;
    let mut rows: Vec<Row> = Vec::new();
    let mut queue: VecDeque<u64> = VecDeque::new();
    let (mut a_run, mut b_run): (Option<Running>, Option<Running>) = (None, None);
    let mut budget = 0u64;
    let mut next_release = 0u64;
    while sim.t < end {
        if sim.t >= next_release {
            rows.push(Row { start_ns: next_release, ..Row::default() });
            queue.push_back(next_release);
            budget = SLICE;
            next_release += PERIOD;
        }
        let row = rows.len() - 1;
        let b_wants = budget > 0 && (b_run.is_some() || !queue.is_empty());
        if b_wants {
            let until = next_release.min(sim.t + budget);
            if b_run.is_none() {
                match queue.front().copied() {
                    Some(rel) => match sim.start(sim.b, "serve", B_ITERS, Some(rel)) {
                        Ok(r) => {
                            queue.pop_front();
                            b_run = Some(r);
                        }
                        Err(InvokeError::Busy) => {
                            // The shared store is held by A's preempted
                            // invocation: B's VP finishes it first.
                            let Some(r) = a_run.take() else { return Err(anyhow!("busy without a task")) };
                            let (ran, res) = sim.run(r, until);
                            budget = budget.saturating_sub(ran);
                            rows[row].lent_ns += ran;
                            a_run = res.ok().flatten();
                            continue;
                        }
                        Err(e) => return Err(anyhow!("B's request did not start: {e}")),
                    },
                    None => continue,
                }
            }
            let Some(r) = b_run.take() else { continue };
            let release = r.release.unwrap_or(0);
            let (ran, res) = sim.run(r, until);
            budget = budget.saturating_sub(ran);
            rows[row].service_ns += ran;
            match res {
                Ok(Some(r)) => b_run = Some(r),
                Ok(None) => {
                    let lat = sim.t.saturating_sub(release);
                    rows[row].latency_ns = Some(rows[row].latency_ns.map_or(lat, |l| l.max(lat)));
                }
                Err(_) => rows[row].failed += 1,
            }
        } else {
            // Best effort: A, until B's next release.
            let r = match a_run.take() {
                Some(r) => r,
                None => {
                    let arg = if sim.t >= heavy_from { A_HEAVY } else { A_LIGHT };
                    match sim.start(sim.a, "churn", arg, None) {
                        Ok(r) => r,
                        Err(InvokeError::Busy) => {
                            // B's request holds the shared store (it ran out
                            // of budget mid-request): idle until the release.
                            sim.t = next_release;
                            continue;
                        }
                        Err(e) => return Err(anyhow!("A did not start: {e}")),
                    }
                }
            };
            let (_, res) = sim.run(r, next_release);
            a_run = res.ok().flatten();
        }
    }
    Ok(rows)
}

/// Runs `anode experiment fig16`.
pub fn run(a: Fig16Args) -> Result<std::process::ExitCode> {
    if !(0.1..=60.0).contains(&a.seconds) {
        anyhow::bail!("--seconds must be 0.1..60");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut csv = String::from("scenario,period_start_ms,b_service_us,b_lent_us,b_latency_us,b_failed\n");
    let mut all = Vec::new();
    for (name, shared) in [("one session", true), ("two sessions", false)] {
        let rows = scenario(shared, a.seconds)?;
        for r in &rows {
            let lat = r.latency_ns.map_or(String::new(), |l| format!("{:.1}", l as f64 / 1e3));
            csv.push_str(&format!(
                "{name},{:.3},{:.1},{:.1},{lat},{}\n",
                r.start_ns as f64 / 1e6,
                r.service_ns as f64 / 1e3,
                r.lent_ns as f64 / 1e3,
                r.failed
            ));
        }
        eprintln!("{}", summary(name, &rows, a.seconds));
        all.push((name, rows));
    }
    let csv_path = a.out.join("fig16.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let png = a.out.join("fig16.png");
    plot(&all, &png)?;
    eprintln!("wrote {} and {}", csv_path.display(), png.display());
    Ok(std::process::ExitCode::SUCCESS)
}

/// B's figures before and after A turns heavy.
fn summary(name: &str, rows: &[Row], seconds: f64) -> String {
    let half = (seconds * 1e9) as u64 / 2;
    let part = |heavy: bool| {
        let rs: Vec<&Row> = rows.iter().filter(|r| (r.start_ns >= half) == heavy).collect();
        let n = rs.len().max(1) as f64;
        let service = rs.iter().map(|r| r.service_ns).sum::<u64>() as f64 / n / 1e3;
        let mut lats: Vec<u64> = rs.iter().filter_map(|r| r.latency_ns).collect();
        lats.sort_unstable();
        let p = |q: f64| lats.get(((lats.len() as f64 - 1.0) * q) as usize).map_or(0.0, |l| *l as f64 / 1e3);
        let failed: u32 = rs.iter().map(|r| r.failed).sum();
        format!(
            "service {service:.0} µs/period, latency median {:.0} µs, p99 {:.0} µs, failed {failed}",
            p(0.5),
            p(0.99)
        )
    };
    format!("{name}: A light: {}; A heavy: {}", part(false), part(true))
}

fn plot(all: &[(&str, Vec<Row>)], out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (1400, 700)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = all.iter().flat_map(|(_, r)| r.last()).map(|r| r.start_ns as f64 / 1e9).fold(0.1, f64::max);
    let areas = root.split_evenly((2, all.len()));
    let lat_max = all
        .iter()
        .flat_map(|(_, r)| r.iter().filter_map(|x| x.latency_ns))
        .map(|l| l as f64 / 1e3)
        .fold(1000.0, f64::max);
    for (col, (name, rows)) in all.iter().enumerate() {
        let (Some(top), Some(bottom)) = (areas.get(col), areas.get(all.len() + col)) else { continue };
        let mut c = ChartBuilder::on(top)
            .caption(format!("{name}: B's service per 4 ms period (guarantee 1 ms)"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..1100f64)
            .map_err(|x| e(&x))?;
        c.configure_mesh().x_desc("time (s)").y_desc("µs").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
        let pts = |f: fn(&Row) -> f64| rows.iter().map(move |r| (r.start_ns as f64 / 1e9, f(r))).collect::<Vec<_>>();
        c.draw_series(LineSeries::new(pts(|r| r.service_ns as f64 / 1e3), RGBColor(31, 119, 180).stroke_width(1)))
            .map_err(|x| e(&x))?
            .label("B's own work")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(31, 119, 180).stroke_width(2)));
        c.draw_series(LineSeries::new(pts(|r| r.lent_ns as f64 / 1e3), RGBColor(214, 39, 40).stroke_width(1)))
            .map_err(|x| e(&x))?
            .label("B's time spent finishing A's invocation")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(214, 39, 40).stroke_width(2)));
        super::plot::legend(&mut c, SeriesLabelPosition::LowerLeft, 13).map_err(|x| e(&x))?;
        let mut c = ChartBuilder::on(bottom)
            .caption(format!("{name}: B's request latency (release to end); x: failed"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..lat_max * 1.05)
            .map_err(|x| e(&x))?;
        c.configure_mesh().x_desc("time (s)").y_desc("µs").label_style(("sans-serif", 13)).draw().map_err(|x| e(&x))?;
        c.draw_series(
            rows.iter()
                .filter_map(|r| r.latency_ns.map(|l| (r.start_ns as f64 / 1e9, l as f64 / 1e3)))
                .map(|p| Circle::new(p, 2, RGBColor(31, 119, 180).filled())),
        )
        .map_err(|x| e(&x))?;
        c.draw_series(
            rows.iter()
                .filter(|r| r.failed > 0)
                .map(|r| Cross::new((r.start_ns as f64 / 1e9, lat_max), 5, RGBColor(214, 39, 40).stroke_width(2))),
        )
        .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// On virtual time the outcome is deterministic: checked, not timed.
    #[test]
    fn two_sessions_keep_b_whole_and_one_session_does_not() {
        let two = scenario(false, 0.4).unwrap();
        assert_eq!(two.len(), 100);
        assert!(two.iter().all(|r| r.lent_ns == 0 && r.failed == 0), "two sessions share nothing");
        assert!(two.iter().all(|r| r.latency_ns.is_some_and(|l| l < SLICE)), "every request within its slice");
        let one = scenario(true, 0.4).unwrap();
        let heavy: Vec<&Row> = one.iter().filter(|r| r.start_ns >= 200_000_000).collect();
        assert!(heavy.iter().any(|r| r.lent_ns > 0), "B's VP finishes A's invocations");
        assert!(heavy.iter().any(|r| r.latency_ns.is_some_and(|l| l > PERIOD)), "B waits for periods");
    }
}
