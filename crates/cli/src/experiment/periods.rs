//! `anode experiment from-periods`: turns a node's period log (`anode node
//! --period-log`) into a Fig. 11 trace: the rows of the VPs named as loads,
//! and a best-effort load as CPU per notional window.

use anode_sched::trace::{self, Trace, TraceRow};
use anyhow::{Context, Result, anyhow, bail};
use std::path::PathBuf;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct FromPeriodsArgs {
    /// The node's period log.
    pub log: PathBuf,
    /// A load with a guarantee: `NAME=VP` (the VP handle `anode session
    /// open` printed, INDEX.GENERATION). Repeatable.
    #[arg(long = "load", value_name = "NAME=VP")]
    pub loads: Vec<String>,
    /// A load without a guarantee, measured as the CPU its VP received in
    /// windows of `--window`: `NAME=VP` (Best-Effort's VP is 1.1).
    #[arg(long = "best-effort", value_name = "NAME=VP")]
    pub best_effort: Vec<String>,
    /// The window of best-effort loads (Fig. 11 gives A 100 ms), ms.
    #[arg(long, default_value_t = 100)]
    pub window_ms: u64,
    /// The trace's source column.
    #[arg(long, default_value = "anode")]
    pub source: String,
    /// Leave out the periods of guaranteed loads in which the VP was not
    /// runnable for some of the time (it had no work: a shortfall there is
    /// the load's choice, as the scheduler's own `honoured` says, not a
    /// broken guarantee); how many is recorded in the trace's metadata
    /// (`idle_periods_<load>`).
    #[arg(long)]
    pub skip_idle: bool,
    /// Output trace (CSV).
    #[arg(short, long)]
    pub output: PathBuf,
}

struct Rec {
    vp: String,
    start: u64,
    end: u64,
    slice: u64,
    received: u64,
    idle: bool,
}

fn parse_log(text: &str) -> Result<Vec<Rec>> {
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i == 0 || line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 8 {
            bail!("line {}: expected 8 fields, found {}", i + 1, f.len());
        }
        let n = |k: usize| -> Result<u64> { f[k].parse().with_context(|| format!("line {}: field {}", i + 1, k + 1)) };
        let idle = match f[7] {
            "0" => false,
            "1" => true,
            x => bail!("line {}: idle is {x:?}, not 0 or 1", i + 1),
        };
        v.push(Rec { vp: f[0].to_string(), start: n(2)?, end: n(3)?, slice: n(4)?, received: n(5)?, idle });
    }
    Ok(v)
}

fn pairs(v: &[String]) -> Result<Vec<(String, String)>> {
    v.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| anyhow!("{s:?}: expected NAME=VP"))
        })
        .collect()
}

/// Runs it.
pub fn run(a: FromPeriodsArgs) -> Result<std::process::ExitCode> {
    let text = std::fs::read_to_string(&a.log).with_context(|| format!("reading {}", a.log.display()))?;
    let recs = parse_log(&text)?;
    let (loads, be) = (pairs(&a.loads)?, pairs(&a.best_effort)?);
    let named = |vp: &str| loads.iter().chain(&be).any(|(_, v)| v == vp);
    // Time zero: the first period in which any named load received CPU.
    let t0 = recs.iter().filter(|r| named(&r.vp) && r.received > 0).map(|r| r.start).min().unwrap_or(0);
    let end = recs.iter().filter(|r| named(&r.vp)).map(|r| r.end).max().unwrap_or(t0);
    let mut t = Trace::default();
    for (name, vp) in &loads {
        let idle = recs.iter().filter(|r| &r.vp == vp && r.start >= t0 && r.idle).count();
        t.meta.push((format!("idle_periods_{name}"), idle.to_string()));
        let keep = |r: &&Rec| &r.vp == vp && r.start >= t0 && !(a.skip_idle && r.idle);
        for (k, r) in recs.iter().filter(keep).enumerate() {
            t.rows.push(TraceRow {
                source: a.source.clone(),
                load: name.clone(),
                period: k as u64,
                start_ns: r.start - t0,
                length_ns: (r.end - r.start).max(1),
                slice_ns: r.slice,
                received_ns: r.received,
            });
        }
    }
    for (name, vp) in &be {
        let samples = recs.iter().filter(|r| &r.vp == vp).map(|r| (r.start.saturating_sub(t0), r.received));
        let rows = trace::windows(&a.source, name, samples, 0, end - t0, a.window_ms.max(1) * 1_000_000);
        t.rows.extend(rows);
    }
    t.meta.push(("period_log".into(), a.log.display().to_string()));
    t.meta.push(("idle_periods_skipped".into(), a.skip_idle.to_string()));
    std::fs::write(&a.output, t.to_csv()).with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!("wrote {} ({} rows)", a.output.display(), t.rows.len());
    Ok(std::process::ExitCode::SUCCESS)
}
