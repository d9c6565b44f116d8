//! `anode experiment`: reproductions of the papers' figures.
//!
//! - `fig11`: RCANE Fig. 11 (CPU share per scheduling period of four
//!   CPU-bound loads) for the Linux baselines: SCHED_DEADLINE and CFS
//!   bandwidth control, on one pinned CPU.
//! - `plot-fig11`: the PNG of one or more Fig. 11 traces.
//! - `stats`: per-load statistics of Fig. 11 traces.
//! - `fig13`: RCANE Fig. 13 (reception: received bandwidth over the
//!   receiver's VP period and FIFO size) on real daemons.
//! - `fig16`: RCANE Fig. 16 (isolation of allocation) in the sandbox.
//! - `fig16-node`: RCANE Fig. 16 on a testbed of real daemons.
//! - `fig15`: RCANE Fig. 15 (memory with ARM) in the sandbox.
//! - `fig15-node`: RCANE Fig. 15 on a testbed of real daemons.
//! - `fig12`, `fig12-module`, `fig12-receive`, `fig12-wire`: RCANE Fig. 12 (transmit
//!   reservations per link) on real daemons, with `scripts/fig12`.
//! - `transcoder`: Expert's tiered transcoder (Table 3, Fig. 4) on real
//!   daemons, with `scripts/transcoder`.
//!
//! The trace format is `anode_sched::trace` (docs/rcane.md), shared with the
//! anode node's own run.

mod bed;
mod fig11;
mod fig12;
mod fig13;
mod fig15;
mod fig15_node;
mod fig16;
mod fig16_node;
mod periods;
mod plot;
mod transcoder;

use anode_sched::trace::{self, Trace};
use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;

/// `anode experiment` subcommands.
#[derive(Debug, Subcommand)]
pub enum ExperimentCmd {
    /// RCANE Fig. 11 on Linux: A best-effort, B/C/D with 10/20/30 % of one CPU
    /// in 4 ms periods, started 3 s apart, as threads pinned to one CPU.
    /// Needs root.
    Fig11(fig11::Fig11Args),
    /// Plot Fig. 11 traces (CSV) as a PNG: share per period over time, one
    /// panel per source, one trace per load.
    #[command(name = "plot-fig11")]
    PlotFig11 {
        /// Trace files (the CSV format of docs/rcane.md).
        #[arg(required = true)]
        csv: Vec<PathBuf>,
        /// Output PNG.
        #[arg(short, long, default_value = "fig11.png")]
        output: PathBuf,
    },
    /// RCANE Fig. 16 (isolation of allocation) in the sandbox, on virtual
    /// time: B (1 ms in 4 ms) beside A allocating heavily, in one session
    /// and in two; writes fig16.csv and fig16.png.
    Fig16(fig16::Fig16Args),
    /// RCANE Fig. 16 (isolation of allocation) on a testbed of real daemons:
    /// B (1 ms in 4 ms) serving requests beside A allocating heavily, in one
    /// session (two VPs) and in two; writes fig16-node.csv, fig16-node.png.
    #[command(name = "fig16-node")]
    Fig16Node(fig16_node::Fig16NodeArgs),
    /// RCANE Fig. 15 (memory with ARM) in the sandbox, on virtual time: the
    /// ARM caching module (modules/out/arm.wasm) between a sender and a lossy
    /// link, asking for heap as the loss grows; writes fig15.csv and fig15.png.
    Fig15(fig15::Fig15Args),
    /// RCANE Fig. 15 (memory with ARM) on a testbed of real daemons: the ARM
    /// module on a node in a session with a small heap reservation, between
    /// a sender and a lossy receiver played by the harness; writes
    /// fig15-node.csv and fig15-node.png.
    #[command(name = "fig15-node")]
    Fig15Node(fig15_node::Fig15NodeArgs),
    /// RCANE Fig. 13 (reception) on a testbed of real daemons: received
    /// bandwidth of a 10 % session over its VP period and channel FIFO size,
    /// beside a 40 % CPU hog, without and with slack; writes fig13.csv and
    /// fig13.png.
    Fig13(fig13::Fig13Args),
    /// RCANE Fig. 12 from a run of scripts/fig12: rates per 6 ms and per
    /// second by sender (CSV, PNG) and statistics against the reservations.
    Fig12(fig12::Fig12Args),
    /// The Fig. 12 sending module (WAT compiled to wasm) for one sender tag.
    #[command(name = "fig12-module")]
    Fig12Module(fig12::ModuleArgs),
    /// The Fig. 12 receiver: registers a port at a node and timestamps
    /// every packet by sender tag.
    #[command(name = "fig12-receive")]
    Fig12Receive(fig12::ReceiveArgs),
    /// The Fig. 12 arrivals at the receiving node's link socket, from a
    /// kernel capture of the link, in the receiver's format.
    #[command(name = "fig12-wire")]
    Fig12Wire(fig12::WireArgs),
    /// Expert's tiered transcoder on a testbed of real daemons: one
    /// configuration, Table 3 (CPU) and Fig. 4 (per-tier rates), path-based
    /// against all-in-one (docs/transcoder.md).
    Transcoder(transcoder::TranscoderArgs),
    /// A Fig. 11 trace from a node's period log (`anode node --period-log`).
    #[command(name = "from-periods")]
    FromPeriods(periods::FromPeriodsArgs),
    /// Per-load statistics of Fig. 11 traces: percentiles of the share per
    /// period and the fraction of periods with at least 95 % of the slice.
    Stats {
        /// Trace files.
        #[arg(required = true)]
        csv: Vec<PathBuf>,
        /// Print a Markdown table.
        #[arg(long)]
        markdown: bool,
    },
}

/// Runs `anode experiment`.
pub fn run(c: ExperimentCmd) -> Result<std::process::ExitCode> {
    match c {
        ExperimentCmd::Fig11(a) => fig11::run(a),
        ExperimentCmd::Fig16(a) => fig16::run(a),
        ExperimentCmd::Fig16Node(a) => fig16_node::run(a),
        ExperimentCmd::Fig15(a) => fig15::run(a),
        ExperimentCmd::Fig15Node(a) => fig15_node::run(a),
        ExperimentCmd::Fig13(a) => fig13::run(a),
        ExperimentCmd::Fig12(a) => fig12::run(a),
        ExperimentCmd::Fig12Module(a) => fig12::module(a),
        ExperimentCmd::Fig12Receive(a) => fig12::receive(a),
        ExperimentCmd::Fig12Wire(a) => fig12::wire(a),
        ExperimentCmd::Transcoder(a) => transcoder::run(a),
        ExperimentCmd::FromPeriods(a) => periods::run(a),
        ExperimentCmd::PlotFig11 { csv, output } => {
            let t = load(&csv)?;
            plot::fig11(&t, &output)?;
            eprintln!("wrote {}", output.display());
            Ok(std::process::ExitCode::SUCCESS)
        }
        ExperimentCmd::Stats { csv, markdown } => {
            let t = load(&csv)?;
            print!("{}", stats_text(&t, markdown));
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// Reads and concatenates traces.
pub fn load(files: &[PathBuf]) -> Result<Trace> {
    let mut all = Trace::default();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let t = Trace::parse(&text).with_context(|| format!("{} is not a Fig. 11 trace", f.display()))?;
        all.rows.extend(t.rows);
        all.meta.extend(t.meta);
    }
    Ok(all)
}

/// The statistics table (plain or Markdown), with the run metadata.
pub fn stats_text(t: &Trace, markdown: bool) -> String {
    let mut s = String::new();
    let pct = |x: f64| format!("{:.2}", 100.0 * x);
    if markdown {
        s.push_str("| source | load | guaranteed % | periods | mean % | p1 % | p5 % | p50 % | periods with ≥ 95 % of slice |\n");
        s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    } else {
        s.push_str(&format!(
            "{:<16} {:<4} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>9}\n",
            "source", "load", "guar%", "periods", "mean%", "p1%", "p5%", "p50%", ">=95%slc"
        ));
    }
    for l in trace::stats(&t.rows) {
        let met = l.met_95.map_or("-".to_string(), |m| format!("{:.2} %", 100.0 * m));
        if markdown {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                l.source,
                l.load,
                pct(l.guaranteed),
                l.periods,
                pct(l.mean),
                pct(l.p1),
                pct(l.p5),
                pct(l.p50),
                met
            ));
        } else {
            s.push_str(&format!(
                "{:<16} {:<4} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>9}\n",
                l.source,
                l.load,
                pct(l.guaranteed),
                l.periods,
                pct(l.mean),
                pct(l.p1),
                pct(l.p5),
                pct(l.p50),
                met
            ));
        }
    }
    if markdown && !t.meta.is_empty() {
        s.push('\n');
    }
    for (k, v) in &t.meta {
        s.push_str(&format!("{}{k} = {v}\n", if markdown { "- " } else { "# " }));
    }
    s
}
