//! `anode node` (the daemon) and `anode status`.
use anode_daemon::{self as daemon, DaemonError, Options};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

/// Arguments of `anode node`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The node binds one UDP socket per [[interface]], forwards SNAP and plain \
packets between its neighbours, and serves local applications on \
<run_dir>/app.sock and `anode status` on <run_dir>/control.sock \
(run_dir defaults to <tmp>/anode-<address>). SIGTERM or SIGINT stops it \
cleanly. See docs/node.md and examples/node/ for the configuration format.")]
pub struct NodeArgs {
    /// Node configuration file (TOML).
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing
    /// directives like `anode_node=debug`. Default: $RUST_LOG, else info.
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// Check the configuration and topology, print a summary, and exit.
    #[arg(long)]
    check: bool,
    /// Append every virtual processor's completed scheduling periods to
    /// this CSV file (for the Fig. 11 experiment; see docs/rcane.md).
    #[arg(long, value_name = "FILE")]
    period_log: Option<PathBuf>,
    /// Verified boot (docs/boot.md): before anything else, verify the node's
    /// boot chain from this boot directory (its boot.toml, TUF metadata and
    /// state) and start only on what verified: the config, topology, key,
    /// modules and credentials are taken from the verified bytes, never read
    /// again. A chain that does not verify (after recovery, as the policy
    /// allows) stops the start with exit status 3.
    #[arg(long, value_name = "DIR")]
    boot: Option<PathBuf>,
    /// Serve this repository directory (a boot mirror: metadata/ and
    /// targets/) to peers over their SAs, for their boot recovery.
    #[arg(long, value_name = "DIR")]
    recovery_repo: Option<PathBuf>,
    /// Data path worker threads, overriding `[io] workers` (0: one per
    /// CPU; 1: none, the event loop's thread forwards). Also read from
    /// $ANODE_WORKERS.
    #[arg(long, value_name = "N", env = "ANODE_WORKERS")]
    workers: Option<usize>,
    /// Microseconds to poll the sockets after traffic before sleeping,
    /// overriding `[io] spin_us` (0: sleep at once). Also read from
    /// $ANODE_SPIN_US.
    #[arg(long, value_name = "US", env = "ANODE_SPIN_US")]
    spin_us: Option<u64>,
}

/// Arguments of `anode status`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").args(["run_dir", "config"])))]
pub struct StatusArgs {
    /// The node's run directory (holds control.sock).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// The node's configuration file, to find its run directory.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the raw JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Print the Prometheus text exposition instead.
    #[arg(long, conflicts_with = "json")]
    metrics: bool,
}

fn init_logging(filter: Option<&str>) -> Result<()> {
    let filter = match filter {
        Some(f) => EnvFilter::try_new(f).with_context(|| format!("bad --log filter {f:?}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // Every log line is rate-limited per source line: no input can flood
    // the log (anode_daemon::ratelog).
    tracing_subscriber::registry()
        .with(filter)
        .with(daemon::ratelog::layer())
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    Ok(())
}

/// Runs the daemon.
pub fn run(a: NodeArgs) -> Result<ExitCode> {
    init_logging(a.log.as_deref())?;
    let boot = match &a.boot {
        None => None,
        Some(dir) => match crate::boot_cmd::boot_at_start(dir, &a.config, !a.check) {
            Ok(nb) => Some(std::sync::Arc::new(nb)),
            Err(e) => {
                tracing::error!(boot = %dir.display(), "boot chain refused, the node does not start: {e:#}");
                return Ok(ExitCode::from(3));
            }
        },
    };
    let files = boot.as_deref().map_or(daemon::StartFiles::Disk, daemon::StartFiles::Chain);
    let mut cfg = match daemon::load_config_from(&a.config, files) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    // The command line's `[io]` overrides, checked by the config's own rules.
    if a.workers.is_some() || a.spin_us.is_some() {
        cfg.config.io.workers = a.workers.unwrap_or(cfg.config.io.workers);
        cfg.config.io.spin_us = a.spin_us.unwrap_or(cfg.config.io.spin_us);
        if let Err(e) = cfg.config.validate() {
            tracing::error!("--workers/--spin-us: {e}");
            return Ok(ExitCode::from(2));
        }
    }
    if a.check {
        let c = &cfg.config;
        println!("{}: node {} with {} interface(s), MTU {}", cfg.path.display(), c.address, c.interfaces.len(), c.mtu);
        if let Some(t) = &cfg.topology_path {
            println!("topology {}", t.display());
        }
        println!("run directory {}", daemon::run_dir_of(c).display());
        return Ok(ExitCode::SUCCESS);
    }
    let opts =
        Options { signals: true, period_log: a.period_log.clone(), boot, recovery_repo: a.recovery_repo.clone() };
    // The chain (with the key's bytes) is dropped once the node is bound.
    let r = daemon::Daemon::bind(&cfg.config, cfg.topology.as_ref(), &opts).and_then(|mut d| {
        drop(opts);
        d.run()
    });
    match r {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            tracing::error!("{}: {e}", cfg.path.display());
            Ok(ExitCode::from(match e {
                DaemonError::Config { .. } | DaemonError::ReadFile { .. } => 2,
                DaemonError::Boot { .. } => 3,
                _ => 1,
            }))
        }
    }
}

/// Prints a running node's counters.
pub fn status(a: StatusArgs) -> Result<ExitCode> {
    let run_dir = match (&a.run_dir, &a.config) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => daemon::run_dir_of(&daemon::load_config(c)?.config),
        (None, None) => bail!("say which node: --run-dir DIR or --config FILE"),
    };
    let request = if a.metrics { "metrics" } else { "status" };
    let answer = daemon::query(&run_dir, request, Duration::from_secs(5)).with_context(|| {
        format!("no node answers on {} (is it running?)", run_dir.join(daemon::CONTROL_SOCKET).display())
    })?;
    if a.metrics || a.json {
        print!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let v: Value = serde_json::from_str(&answer).context("the node's status is not JSON")?;
    print!("{}", render(&v));
    Ok(ExitCode::SUCCESS)
}

/// The non-zero counters of an object of counters, in its order.
fn nonzero(v: &Value) -> Vec<(String, u64)> {
    v.as_object()
        .map(|o| o.iter().filter_map(|(k, n)| n.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n))).collect())
        .unwrap_or_default()
}

/// `"a 1, b 2"` for the non-zero counters of an object, or `"none"`.
fn nonzero_list(v: &Value) -> String {
    let parts: Vec<String> = nonzero(v).into_iter().map(|(k, n)| format!("{k} {n}")).collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("?")
}

/// Renders a status JSON as tables: interfaces, packets, nonzero drops, VM
/// faults by kind.
pub(crate) fn render(v: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let up = v.get("uptime_s").and_then(Value::as_f64).unwrap_or(0.0);
    let _ = writeln!(
        s,
        "node {}  up {}  mtu {}  pid {}",
        text(v, "address"),
        human_duration(up),
        num(v, "mtu"),
        num(v, "pid")
    );
    let _ = writeln!(
        s,
        "\n{:<12} {:<22} {:>10} {:>12} {:>10} {:>12}",
        "interface", "listen", "rx pkts", "rx bytes", "tx pkts", "tx bytes"
    );
    for i in v.get("interfaces").and_then(Value::as_array).into_iter().flatten() {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>10} {:>12} {:>10} {:>12}",
            text(i, "name"),
            text(i, "listen"),
            num(i, "rx_packets"),
            num(i, "rx_bytes"),
            num(i, "tx_packets"),
            num(i, "tx_bytes")
        );
    }
    let _ = writeln!(s, "\npackets");
    if let Some(p) = v.get("packets").and_then(Value::as_object) {
        // The order packets flow in, then anything newer.
        const ORDER: [&str; 10] = [
            "rx_snap",
            "rx_plain",
            "rx_unknown",
            "injected",
            "snap_forwarded",
            "snap_children",
            "plain_forwarded",
            "passed_on",
            "delivered",
            "vm_instructions",
        ];
        let rest = p.keys().filter(|k| !ORDER.contains(&k.as_str())).map(String::as_str);
        for k in ORDER.into_iter().filter(|k| p.contains_key(*k)).chain(rest) {
            let _ = writeln!(s, "  {:<20} {:>12}", k, num(&v["packets"], k));
        }
    }
    let drops = nonzero(&v["drops"]);
    let total: u64 = drops.iter().map(|d| d.1).sum();
    let _ = writeln!(s, "\ndrops: {total}");
    for (k, n) in &drops {
        let _ = writeln!(s, "  {k:<20} {n:>12}");
    }
    match v.get("security") {
        None => {
            let _ = writeln!(s, "\nsecurity: off");
        }
        Some(sec) => {
            let h = &sec["handshakes"];
            let _ = writeln!(
                s,
                "\nsecurity: identity {}  handshakes initiated {}  completed {}  rekeys {}  timeouts {}",
                text(sec, "identity"),
                num(h, "initiated"),
                num(h, "completed_ik") + num(h, "completed_xx"),
                num(h, "rekeys"),
                num(h, "timeouts")
            );
            let _ = writeln!(
                s,
                "  {:<10} {:<8} {:<34} {:<12} {:<4} {:<8} {:<8} {:>8} {:>10} {:>10}",
                "peer", "kind", "fingerprint", "mode", "up", "out spi", "in spi", "sa age", "tx", "rx"
            );
            for p in sec.get("peers").and_then(Value::as_array).into_iter().flatten() {
                let age = p.get("sa_age_ms").and_then(Value::as_u64).map(|ms| human_duration(ms as f64 / 1000.0));
                let _ = writeln!(
                    s,
                    "  {:<10} {:<8} {:<34} {:<12} {:<4} {:<8} {:<8} {:>8} {:>10} {:>10}",
                    p.get("address").and_then(Value::as_str).unwrap_or("-"),
                    text(p, "kind"),
                    p.get("fingerprint").and_then(Value::as_str).unwrap_or("-"),
                    text(p, "mode"),
                    if p.get("up").and_then(Value::as_bool) == Some(true) { "yes" } else { "no" },
                    p.get("out_spi").and_then(Value::as_str).unwrap_or("-"),
                    p.get("in_spi").and_then(Value::as_str).unwrap_or("-"),
                    age.unwrap_or_else(|| "-".into()),
                    num(p, "tx_packets"),
                    num(p, "rx_packets")
                );
            }
        }
    }
    let faults = nonzero(&v["vm_faults"]);
    let total: u64 = faults.iter().map(|d| d.1).sum();
    let _ = writeln!(s, "\nvm faults: {total}");
    for (k, n) in &faults {
        let _ = writeln!(s, "  {k:<20} {n:>12}");
    }
    s.push_str(&crate::monitor_cmd::render_tap(v));
    s.push_str(&crate::capture_cmd::render_status(v));
    if let Some(sessions) = v.pointer("/rcane/sessions").and_then(Value::as_array) {
        let _ = writeln!(s, "\nsessions (RCANE): {}", sessions.len());
        for x in sessions {
            let c = &x["charges"];
            let _ = writeln!(
                s,
                "  {} {:<16} share {:>6.2} %  cpu {} ms guaranteed + {} ms slack  tx {} pkts",
                x["session"].as_str().unwrap_or("?"),
                x["owner"].as_str().map_or("?".to_string(), |o| o.chars().take(16).collect()),
                x["share_ppm"].as_u64().unwrap_or(0) as f64 / 10_000.0,
                c["cpu_guaranteed_ns"].as_u64().unwrap_or(0) / 1_000_000,
                c["cpu_slack_ns"].as_u64().unwrap_or(0) / 1_000_000,
                c["tx_packets"].as_u64().unwrap_or(0)
            );
            for vp in x["vps"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "    vp {}: {} µs / {} µs{}  received {:.1} % of its slices over {} recent periods ({} with >= 95 %)",
                    vp["vp"].as_str().unwrap_or("?"),
                    vp["slice_ns"].as_u64().unwrap_or(0) / 1000,
                    vp["period_ns"].as_u64().unwrap_or(0) / 1000,
                    if vp["extra"].as_bool() == Some(true) { " +slack" } else { "" },
                    100.0 * vp["received_share_of_slice"].as_f64().unwrap_or(0.0),
                    vp["recent_periods"],
                    vp["periods_with_95pct_of_slice"]
                );
            }
            for p in x["pools"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "    pool {}: {} queued of {}, {}",
                    p["pool"].as_str().unwrap_or("?"),
                    p["queued"],
                    p["max_queued"],
                    p["stats"].as_str().unwrap_or("")
                );
            }
        }
    }
    if let Some(d) = v.get("domain") {
        let n = &d["node"];
        let _ = writeln!(
            s,
            "\ndomain: service {}  tickets issued {} refused {}\n  node{}: accepted by ticket {}, by attachment {}; \
             attached {}; loads allowed {}; refused {}",
            if d["kdc"].as_bool() == Some(true) { "on" } else { "off" },
            num(d, "issued"),
            d["refused"],
            if n["border"].as_bool() == Some(true) { " (border)" } else { "" },
            num(n, "by_ticket"),
            num(n, "by_attachment"),
            num(n, "attached"),
            num(n, "allowed"),
            n["refused"]
        );
        if let Some(r) = d.get("revocation") {
            let _ = writeln!(
                s,
                "  revocation: min epoch {}, {} tickets and {} users revoked; updates applied {}, refused {}",
                num(r, "min_epoch"),
                num(r, "tickets"),
                num(r, "users"),
                num(r, "applied"),
                r["refused"]
            );
        }
    }
    if let Some(f) = v
        .get("fragments")
        .filter(|f| num(f, "rx_fragments") + num(f, "tx_fragments") > 0 || !f["link_mtu_payload"].is_null())
    {
        let _ = writeln!(
            s,
            "
fragments: sent {} datagrams as {} fragments ({} too long to split); received {} fragments, \
             {} datagrams reassembled, {} held ({} bytes); dropped {}",
            num(f, "tx_datagrams"),
            num(f, "tx_fragments"),
            num(f, "tx_refused"),
            num(f, "rx_fragments"),
            num(f, "rx_reassembled"),
            num(f, "rx_held_sets"),
            num(f, "rx_held_bytes"),
            nonzero_list(&f["drops"])
        );
    }
    if let Some(b) = v.get("boot") {
        let _ = writeln!(
            s,
            "\nboot chain: node {}  policy {}  verified {}  recovered {}  skipped {}{}",
            text(b, "node"),
            text(b, "policy"),
            num(b, "verified"),
            num(b, "recovered"),
            num(b, "skipped"),
            if b.get("degraded").and_then(Value::as_bool) == Some(true) { "  (DEGRADED start)" } else { "" }
        );
        let mut layer = "";
        for c in b.get("components").and_then(Value::as_array).into_iter().flatten() {
            if text(c, "layer") != layer {
                layer = text(c, "layer");
                let _ = writeln!(s, "  layer {layer}");
            }
            let why = c.get("why").and_then(Value::as_str).map(|w| format!("  ({w})")).unwrap_or_default();
            let _ = writeln!(s, "    {:<10} {}{why}", text(c, "verdict"), text(c, "name"));
        }
    }
    if let Some(r) = v.get("recovery") {
        let _ = writeln!(
            s,
            "\nrecovery served: {}  rate limited {}  unauthenticated {}  no repository {}  unanswered {}",
            num(r, "served"),
            num(r, "rate_limited"),
            num(r, "unauthenticated"),
            num(r, "no_repository"),
            num(r, "unanswered")
        );
    }
    if let Some(l) = v.get("local") {
        let ports: Vec<String> = l
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(|p| p.to_string())
            .collect();
        let _ = writeln!(
            s,
            "\nlocal: ports [{}]  requests {}  refused {}  clients gone {}",
            ports.join(", "),
            num(l, "requests"),
            num(l, "refused"),
            num(l, "clients_gone")
        );
    }
    s
}

fn human_duration(secs: f64) -> String {
    let t = secs as u64;
    match t {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", t / 60, t % 60),
        _ => format!("{}h{:02}m", t / 3600, (t % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_nonzero_drops_and_faults() {
        let v: Value = serde_json::json!({
            "address": "10.0.0.2", "uptime_s": 75.2, "mtu": 1400, "pid": 42,
            "interfaces": [{"name": "west", "listen": "127.0.0.1:7002", "rx_packets": 3, "rx_bytes": 300,
                            "tx_packets": 2, "tx_bytes": 200}],
            "packets": {"rx_snap": 2, "snap_forwarded": 2},
            "drops": {"no_route": 0, "vm_fault": 4, "anep_truncated": 1},
            "vm_faults": {"stack_underflow": 4, "bad_port": 0},
            "local": {"ports": [7, 9], "requests": 5, "refused": 1, "clients_gone": 0}
        });
        let s = render(&v);
        assert!(s.contains("node 10.0.0.2  up 1m15s"), "{s}");
        assert!(s.contains("west         127.0.0.1:7002"), "{s}");
        assert!(s.contains("drops: 5"), "{s}");
        assert!(s.contains("vm_fault"), "{s}");
        assert!(!s.contains("no_route"), "zero drops are not shown: {s}");
        assert!(!s.contains("bad_port"), "{s}");
        assert!(s.contains("stack_underflow"), "{s}");
        assert!(s.contains("ports [7, 9]"), "{s}");
        assert!(!s.contains("boot chain"), "no boot section without --boot: {s}");
    }

    #[test]
    fn renders_the_boot_chain_layer_by_layer() {
        let v: Value = serde_json::json!({
            "boot": {"node": "b", "policy": "degraded", "degraded": true, "verified": 1, "recovered": 1, "skipped": 1,
                     "components": [
                         {"layer": "config", "name": "b/config/node.toml", "verdict": "verified", "why": null},
                         {"layer": "switchlets", "name": "b/switchlets/m.wasm", "verdict": "recovered",
                          "why": "hash; good copy from mirror /r"},
                         {"layer": "switchlets", "name": "b/switchlets/n.wasm", "verdict": "skipped", "why": "gone"}]},
            "recovery": {"serving": true, "served": 12, "rate_limited": 3}
        });
        let s = render(&v);
        assert!(
            s.contains("boot chain: node b  policy degraded  verified 1  recovered 1  skipped 1  (DEGRADED start)"),
            "{s}"
        );
        assert!(s.contains("  layer config\n    verified   b/config/node.toml\n  layer switchlets\n"), "{s}");
        assert!(s.contains("    recovered  b/switchlets/m.wasm  (hash; good copy from mirror /r)"), "{s}");
        assert!(s.contains("recovery served: 12  rate limited 3"), "{s}");
    }
}
