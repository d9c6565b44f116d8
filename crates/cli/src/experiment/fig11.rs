//! RCANE Fig. 11 on Linux: the same four CPU-bound loads as the anode run,
//! as threads pinned to one CPU (sched_setaffinity).
//!
//! - A: SCHED_OTHER, no guarantee, logged in notional 100 ms periods.
//! - B, C, D: 10, 20, 30 % of the CPU in 4 ms periods, started 3 s apart,
//!   - `deadline`: SCHED_DEADLINE with runtime = slice, deadline = period =
//!     4 ms (sched_setattr, through the `thread-priority` crate);
//!   - `cfs`: SCHED_OTHER in a cgroup v1 `cpu` group each, with
//!     `cpu.cfs_period_us` = 4000 and `cpu.cfs_quota_us` = the slice; the
//!     kernel refuses a quota under 1 ms, so B gets 1 ms per 10 ms and C
//!     1 ms per 5 ms instead (same shares, longer periods), and each load
//!     is measured against its own period.
//!
//! Every load measures the CPU it received in each of its own periods with
//! its thread CPU clock (CLOCK_THREAD_CPUTIME_ID) against CLOCK_MONOTONIC
//! period boundaries taken from its own start: the loop reads both clocks
//! and, when a boundary has passed, closes the period with the CPU time of
//! the last reading before it (the error is one loop iteration, well under a
//! microsecond, since the thread only reads clocks).
//!
//! SCHED_DEADLINE refuses a thread whose affinity is narrower than its root
//! domain (EPERM) while DL admission control is on; pinning to one CPU
//! therefore needs `kernel.sched_rt_runtime_us = -1` for the run. The
//! command sets it and restores the old value afterwards (also on error),
//! and says so; B+C+D take 60 % of the CPU, which it checks itself.

use anode_sched::trace::{Trace, TraceRow};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The Linux scheduling policy for B, C and D.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// SCHED_DEADLINE.
    Deadline,
    /// CFS bandwidth control (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us).
    Cfs,
}

impl Policy {
    fn source(self) -> &'static str {
        match self {
            Policy::Deadline => "linux-deadline",
            Policy::Cfs => "linux-cfs",
        }
    }
}

/// Arguments of `anode experiment fig11`.
#[derive(Debug, Args)]
pub struct Fig11Args {
    /// Policy for B, C and D.
    #[arg(long, value_enum, default_value = "deadline")]
    sched: Policy,
    /// The CPU every load is pinned to (default: the last one).
    #[arg(long)]
    cpu: Option<usize>,
    /// Seconds between the starts of A, B, C and D.
    #[arg(long, default_value_t = 3.0)]
    stagger: f64,
    /// Seconds the run goes on after D starts.
    #[arg(long, default_value_t = 6.0)]
    tail: f64,
    /// cpu.shares of B, C and D's cgroups (`cfs` only). Each group is a child
    /// of the controller's root, where A and every other task weigh 1024.
    #[arg(long, default_value_t = 1024)]
    cfs_shares: u64,
    /// Where the cgroup v1 cpu controller is mounted (`cfs` only).
    #[arg(long, default_value = "/sys/fs/cgroup/cpu")]
    cgroup: PathBuf,
    /// Output CSV.
    #[arg(short, long)]
    output: PathBuf,
}

const MS: u64 = 1_000_000;
/// The kernel's smallest `cpu.cfs_quota_us`.
const CFS_MIN_QUOTA_NS: u64 = 1_000_000;

struct Load {
    name: &'static str,
    /// Start, as a multiple of `stagger`.
    start: u32,
    /// Guaranteed share in ppm of one CPU (0: none).
    share_ppm: u64,
    period_ns: u64,
}

const LOADS: [Load; 4] = [
    Load { name: "A", start: 0, share_ppm: 0, period_ns: 100 * MS },
    Load { name: "B", start: 1, share_ppm: 100_000, period_ns: 4 * MS },
    Load { name: "C", start: 2, share_ppm: 200_000, period_ns: 4 * MS },
    Load { name: "D", start: 3, share_ppm: 300_000, period_ns: 4 * MS },
];

fn thread_cpu_ns() -> Result<u64> {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).context("CLOCK_THREAD_CPUTIME_ID")?;
    Ok(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Reads the `steal` ticks of all CPUs and of `cpu` from /proc/stat.
fn steal_ticks(cpu: usize) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let field = |label: &str| -> Option<u64> {
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some(label))?;
        line.split_whitespace().nth(8)?.parse().ok()
    };
    let all = field("cpu").context("no steal column in /proc/stat")?;
    let one = field(&format!("cpu{cpu}")).context("no steal column for the CPU in /proc/stat")?;
    Ok((all, one))
}

/// Restores a sysctl when dropped.
struct Sysctl {
    path: &'static str,
    old: Option<String>,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Result<Sysctl> {
        let old = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?.trim().to_string();
        if old == value {
            return Ok(Sysctl { path, old: None });
        }
        std::fs::write(path, value).with_context(|| format!("writing {value} to {path} (needs root)"))?;
        eprintln!("fig11: {path} = {value} for the run (was {old}; restored afterwards)");
        Ok(Sysctl { path, old: Some(old) })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Some(old) = &self.old
            && let Err(e) = std::fs::write(self.path, old)
        {
            eprintln!("fig11: could not restore {} to {old}: {e}", self.path);
        }
    }
}

/// A cgroup v1 cpu group for one load, removed when dropped.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn create(root: &Path, name: &str, period_us: u64, quota_us: u64, shares: u64) -> Result<Cgroup> {
        let dir = root.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("creating cgroup {} (needs root)", dir.display()))?;
        let g = Cgroup { dir };
        g.write("cpu.cfs_period_us", &period_us.to_string())?;
        g.write("cpu.cfs_quota_us", &quota_us.to_string())?;
        g.write("cpu.shares", &shares.to_string())?;
        Ok(g)
    }
    fn write(&self, file: &str, v: &str) -> Result<()> {
        let p = self.dir.join(file);
        std::fs::write(&p, v).with_context(|| format!("writing {v} to {}", p.display()))
    }
    fn join_current_thread(&self) -> Result<()> {
        self.write("tasks", &nix::unistd::gettid().to_string())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once the load's thread has exited.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One load thread's parameters.
struct LoadRun {
    name: &'static str,
    cpu: usize,
    source: &'static str,
    /// The experiment's time zero.
    t0: Instant,
    begin: Instant,
    end: Instant,
    period_ns: u64,
    slice_ns: u64,
}

/// What one load thread does: set itself up, spin, log its periods.
fn run_load(r: LoadRun, setup: impl FnOnce() -> Result<()>) -> Result<Vec<TraceRow>> {
    let LoadRun { name, cpu, source, t0, begin, end, period_ns, slice_ns } = r;
    std::thread::sleep(begin.saturating_duration_since(Instant::now()));
    let mut set = CpuSet::new();
    set.set(cpu).context("CPU number")?;
    sched_setaffinity(Pid::from_raw(0), &set).with_context(|| format!("{name}: pinning to CPU {cpu}"))?;
    setup().with_context(|| format!("{name}: setting the scheduling policy"))?;
    let period = Duration::from_nanos(period_ns);
    let cap = ((end - begin).as_nanos() / u128::from(period_ns) + 2) as usize;
    let mut rows = Vec::with_capacity(cap);
    let start = Instant::now();
    let mut next = start + period;
    let mut k = 0u64;
    let mut at_start = thread_cpu_ns()?;
    let mut last = at_start;
    let row = |k: u64, received: u64| TraceRow {
        source: source.to_string(),
        load: name.to_string(),
        period: k,
        start_ns: (start - t0).as_nanos() as u64 + k * period_ns,
        length_ns: period_ns,
        slice_ns,
        received_ns: received,
    };
    loop {
        let now = Instant::now();
        let c = thread_cpu_ns()?;
        if now >= next {
            // The period ended between the last reading and this one; the
            // CPU between them is one loop iteration.
            rows.push(row(k, last - at_start));
            at_start = last;
            k += 1;
            next += period;
            while now >= next {
                rows.push(row(k, 0));
                k += 1;
                next += period;
            }
            if next > end {
                break;
            }
        }
        last = c;
    }
    Ok(rows)
}

/// Runs `anode experiment fig11`.
pub fn run(a: Fig11Args) -> Result<std::process::ExitCode> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = a.cpu.unwrap_or(cpus.saturating_sub(1));
    if !(0.1..=60.0).contains(&a.stagger) || !(0.5..=600.0).contains(&a.tail) {
        bail!("--stagger must be 0.1..60 s and --tail 0.5..600 s");
    }
    let source = a.sched.source();
    let total: u64 = LOADS.iter().map(|l| l.share_ppm).sum();
    if total >= 1_000_000 {
        bail!("B, C and D ask for more than the CPU");
    }
    let _sysctl = match a.sched {
        Policy::Deadline => Some(Sysctl::set("/proc/sys/kernel/sched_rt_runtime_us", "-1")?),
        Policy::Cfs => None,
    };
    // One group per load directly under the controller's root, so each
    // competes with A (a task of the root group) as one entity of its own.
    let group_prefix = format!("anode-fig11-{}-", std::process::id());
    let (steal0, steal0_cpu) = steal_ticks(cpu)?;
    let t0 = Instant::now() + Duration::from_millis(100);
    let stagger = Duration::from_secs_f64(a.stagger);
    let end = t0 + stagger * 3 + Duration::from_secs_f64(a.tail);
    let mut groups = Vec::new();
    type Setup = Box<dyn FnOnce() -> Result<()> + Send>;
    let mut runs: Vec<(LoadRun, Setup)> = Vec::new();
    for l in &LOADS {
        // CFS cannot give less than 1 ms of quota: lengthen the period
        // until the share is at least 1 ms of it.
        let cfs_period_ns = (a.sched == Policy::Cfs && l.share_ppm > 0)
            .then(|| l.period_ns.max((CFS_MIN_QUOTA_NS * 1_000_000).div_ceil(l.share_ppm).div_ceil(1000) * 1000));
        let slice_ns = cfs_period_ns.unwrap_or(l.period_ns) * l.share_ppm / 1_000_000;
        let begin = t0 + stagger * l.start;
        let setup: Setup = match (a.sched, slice_ns) {
            (_, 0) => Box::new(|| Ok(())),
            (Policy::Deadline, _) => {
                let p = Duration::from_nanos(l.period_ns);
                let runtime = Duration::from_nanos(slice_ns);
                Box::new(move || {
                    use thread_priority::{
                        DeadlineFlags, RealtimeThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
                        set_thread_priority_and_policy,
                    };
                    set_thread_priority_and_policy(
                        0, // the calling thread
                        ThreadPriority::Deadline { runtime, deadline: p, period: p, flags: DeadlineFlags::empty() },
                        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Deadline),
                    )
                    .map_err(|e| anyhow::anyhow!("sched_setattr(SCHED_DEADLINE): {e:?}"))
                })
            }
            (Policy::Cfs, _) => {
                let g = std::sync::Arc::new(Cgroup::create(
                    &a.cgroup,
                    &format!("{group_prefix}{}", l.name),
                    cfs_period_ns.unwrap_or(l.period_ns) / 1000,
                    slice_ns / 1000,
                    a.cfs_shares,
                )?);
                groups.push(g.clone());
                Box::new(move || g.join_current_thread())
            }
        };
        let period_ns = cfs_period_ns.unwrap_or(l.period_ns);
        runs.push((LoadRun { name: l.name, cpu, source, t0, begin, end, period_ns, slice_ns }, setup));
    }
    // Every cgroup exists before any thread starts, so an error leaves no
    // thread behind in a group that cannot then be removed.
    let mut handles = Vec::new();
    for (r, setup) in runs {
        handles.push(std::thread::Builder::new().name(format!("fig11-{}", r.name)).spawn(move || run_load(r, setup))?);
    }
    eprintln!(
        "fig11: {source} on CPU {cpu}: A from 0 s, B, C, D from {:.1}, {:.1}, {:.1} s, until {:.1} s",
        a.stagger,
        2.0 * a.stagger,
        3.0 * a.stagger,
        (end - t0).as_secs_f64()
    );
    let mut rows = Vec::new();
    for h in handles {
        rows.extend(h.join().map_err(|_| anyhow::anyhow!("a load thread panicked"))??);
    }
    let (steal1, steal1_cpu) = steal_ticks(cpu)?;
    drop(groups);
    let tck = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let wall = (end - t0).as_secs_f64();
    // A's rows: only the complete notional periods.
    let trace = Trace {
        rows,
        meta: vec![
            ("source".into(), source.into()),
            ("cpu".into(), cpu.to_string()),
            ("cpus".into(), cpus.to_string()),
            ("kernel".into(), std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into()),
            ("duration_s".into(), format!("{wall:.3}")),
            ("steal_ticks_all".into(), (steal1 - steal0).to_string()),
            ("steal_ticks_cpu".into(), (steal1_cpu - steal0_cpu).to_string()),
            ("steal_percent_cpu".into(), format!("{:.3}", 100.0 * (steal1_cpu - steal0_cpu) as f64 / tck / wall)),
            ("cfs_shares".into(), if a.sched == Policy::Cfs { a.cfs_shares.to_string() } else { "-".into() }),
        ],
    };
    std::fs::write(&a.output, trace.to_csv()).with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("fig11: wrote {} ({} periods)", a.output.display(), trace.rows.len());
    print!("{}", super::stats_text(&trace, false));
    Ok(std::process::ExitCode::SUCCESS)
}
