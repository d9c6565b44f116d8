//! `anode account`: read the accounting ledger (docs/ledger.md).

use anode_ledger::{Ledger, Query};
use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// Arguments of `anode account`.
#[derive(Debug, Args)]
pub struct AccountArgs {
    /// The ledger file.
    #[arg(long, value_name = "FILE", conflicts_with = "run_dir")]
    ledger: Option<PathBuf>,
    /// The node's run directory; the ledger is DIR/ledger.db.
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Only this principal: a hex fingerprint or a prefix of one, `system` or `best-effort`.
    #[arg(long, value_name = "FP")]
    principal: Option<String>,
    /// Only intervals from T on: ms since the Unix epoch, or an age such as 30s, 10m, 2h, 7d.
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Only intervals before T (same forms as --since).
    #[arg(long, value_name = "T")]
    until: Option<String>,
    /// Print every stored interval instead of totals.
    #[arg(long)]
    rows: bool,
    /// JSON output.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// CSV output.
    #[arg(long)]
    csv: bool,
}

/// Parses `T`: ms since the epoch, or an age before `now_ms`.
fn parse_time(s: &str, now_ms: u64) -> Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().with_context(|| format!("bad time {s:?}: expected ms since the epoch or e.g. 10m"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("bad time {s:?}: unit must be ms, s, m, h or d"),
    };
    Ok(now_ms.saturating_sub(n.saturating_mul(ms)))
}

/// Runs `anode account`.
pub fn run(a: AccountArgs) -> Result<std::process::ExitCode> {
    let path = match (a.ledger, a.run_dir) {
        (Some(p), _) => p,
        (None, Some(d)) => d.join("ledger.db"),
        (None, None) => bail!("say which ledger: --ledger FILE or --run-dir DIR"),
    };
    let ledger = Ledger::open_read_only(&path).with_context(|| format!("opening {}", path.display()))?;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let q = Query {
        principal: a.principal,
        since_ms: a.since.as_deref().map(|s| parse_time(s, now_ms)).transpose()?,
        until_ms: a.until.as_deref().map(|s| parse_time(s, now_ms)).transpose()?,
    };
    if a.rows {
        let rows = ledger.rows(&q)?;
        if a.json {
            let v: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({"principal": r.principal, "boot": r.boot, "session": r.session, "kind": r.kind.name(),
                           "start_ms": r.start_ms, "length_ms": r.length_ms, "amount": r.amount})
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&json!({ "rows": v }))?);
        } else if a.csv {
            println!("principal,boot,session,kind,start_ms,length_ms,amount");
            for r in &rows {
                println!(
                    "{},{},{},{},{},{},{}",
                    r.principal,
                    r.boot,
                    r.session,
                    r.kind.name(),
                    r.start_ms,
                    r.length_ms,
                    r.amount
                );
            }
        } else {
            println!(
                "{:<16} {:>4} {:>12} {:<18} {:>14} {:>9} {:>16}",
                "principal", "boot", "session", "kind", "start_ms", "length", "amount"
            );
            for r in &rows {
                println!(
                    "{:<16} {:>4} {:>12} {:<18} {:>14} {:>9} {:>16}",
                    short(&r.principal),
                    r.boot,
                    r.session,
                    r.kind.name(),
                    r.start_ms,
                    r.length_ms,
                    r.amount
                );
            }
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let totals = ledger.totals(&q)?;
    let sessions = ledger.sessions(&q)?;
    if a.json {
        let t: Vec<_> = totals
            .iter()
            .map(|t| json!({"principal": t.principal, "kind": t.kind.name(), "amount": t.amount}))
            .collect();
        let s: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({"boot": s.boot, "session": s.session, "principal": s.principal, "opened_ms": s.opened_ms,
                       "closed_ms": s.closed_ms, "reason": s.reason})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({"totals": t, "sessions": s}))?);
    } else if a.csv {
        println!("principal,kind,amount");
        for t in &totals {
            println!("{},{},{}", t.principal, t.kind.name(), t.amount);
        }
    } else {
        println!("{:<64} {:<18} {:>20}", "principal", "kind", "amount");
        for t in &totals {
            println!("{:<64} {:<18} {:>20}", t.principal, t.kind.name(), t.amount);
        }
        println!(
            "{} sessions recorded ({} closed)",
            sessions.len(),
            sessions.iter().filter(|s| s.closed_ms.is_some()).count()
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn short(p: &str) -> &str {
    p.get(..16).unwrap_or(p)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("1700000000000", 5).unwrap(), 1_700_000_000_000);
        assert_eq!(parse_time("10m", 3_600_000).unwrap(), 3_000_000);
        assert_eq!(parse_time("2h", 3_600_000).unwrap(), 0);
        assert_eq!(parse_time("250ms", 1_000).unwrap(), 750);
        assert!(parse_time("5y", 0).is_err());
        assert!(parse_time("m", 0).is_err());
    }
}
