//! `anode session open|list|show|reserve|close`: a principal's RCANE
//! sessions on a node (RCANE §IV-B), over the user's security association.
//! The credential (`anode cred issue --kind session`) states the most the
//! principal may reserve; the node grants a request whole or refuses it
//! saying what was asked, what is left and what the credential allows.

use anode_sched::wire::{Reply, Request};
use anode_sched::{ReserveRequest, SessionId, VpId, VpOp, VpParams};
use anyhow::{Context, Result, anyhow, bail};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::cred_cmd::{rate, size};
use crate::sa_client::{self, Target};

/// What to reserve.
#[derive(Debug, Clone, clap::Args)]
pub struct Reservation {
    /// Add a virtual processor: `SLICE/PERIOD`, e.g. `400us/4ms`; append
    /// `+extra` to let it use slack. Repeatable.
    #[arg(long = "vp", value_name = "SLICE/PERIOD[+extra]")]
    pub add: Vec<String>,
    /// Heap reservation, e.g. `16MiB`.
    #[arg(long)]
    pub heap: Option<String>,
    /// Transmit reservation, e.g. `1Mbit/s`.
    #[arg(long)]
    pub tx: Option<String>,
    /// Receive reservation, e.g. `1Mbit/s`.
    #[arg(long)]
    pub rx: Option<String>,
}

/// `anode session` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SessionCmd {
    /// Open a session with a session credential and an initial reservation.
    Open {
        /// The session credential (from `anode cred issue --kind session`).
        #[arg(long)]
        credential: PathBuf,
        #[command(flatten)]
        reservation: Reservation,
        #[command(flatten)]
        target: Target,
    },
    /// Change a session's reservation at run time: add VPs (`--vp`), change
    /// (`--change VP=SLICE/PERIOD`) or remove (`--remove VP`) them, or
    /// change the heap and network reservations. All of it, or nothing.
    Reserve {
        /// The session (as `open` printed it: INDEX.GENERATION).
        session: String,
        #[command(flatten)]
        reservation: Reservation,
        /// Change a VP: `VP=SLICE/PERIOD[+extra]`.
        #[arg(long, value_name = "VP=SLICE/PERIOD[+extra]")]
        change: Vec<String>,
        /// Remove a VP.
        #[arg(long, value_name = "VP")]
        remove: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Close a session, freeing what it held; prints its final account.
    Close {
        /// The session.
        session: String,
        #[command(flatten)]
        target: Target,
    },
    /// List this principal's sessions.
    List {
        /// Send the request this many times at once over the one SA and
        /// print how many answers of each kind came back (to see the node's
        /// per-principal rate limit of session requests).
        #[arg(long, default_value_t = 1, hide = true)]
        repeat: usize,
        #[command(flatten)]
        target: Target,
    },
    /// Show one of this principal's sessions.
    Show {
        /// The session.
        session: String,
        #[command(flatten)]
        target: Target,
    },
    /// Keep a session alive: the node closes a session whose principal has
    /// held no security association with it for its grace period
    /// (`[modules] session_grace_secs`, default 60 s, after the SA's
    /// `reject_after_secs`, default 180 s). This contacts the node over a
    /// fresh SA every `--every` and prints the session, until the session
    /// ends (exit 1, with the node's answer), `--for` is over, or Ctrl-C.
    Hold {
        /// The session.
        session: String,
        /// How often to contact the node, e.g. `60s` (less than the node's
        /// `reject_after_secs`).
        #[arg(long, default_value = "60s", value_parser = crate::cred_cmd::span_arg)]
        every: std::time::Duration,
        /// Stop after this long, e.g. `600s` (default: until Ctrl-C).
        #[arg(long = "for", value_parser = crate::cred_cmd::span_arg)]
        duration: Option<std::time::Duration>,
        #[command(flatten)]
        target: Target,
    },
}

fn handle(s: &str) -> Result<u64> {
    let (i, g) = s.split_once('.').ok_or_else(|| anyhow!("bad handle {s:?}: expected INDEX.GENERATION"))?;
    let i: u32 = i.parse().with_context(|| format!("bad handle {s:?}"))?;
    let g: u32 = g.parse().with_context(|| format!("bad handle {s:?}"))?;
    Ok(u64::from(g) << 32 | u64::from(i))
}

fn vp(s: &str) -> Result<VpParams> {
    Ok(s.parse::<VpParams>()?)
}

fn reservation(r: &Reservation, change: &[String], remove: &[String]) -> Result<ReserveRequest> {
    let mut vps = Vec::new();
    for a in &r.add {
        vps.push(VpOp::Add(vp(a)?));
    }
    for c in change {
        let (h, p) = c.split_once('=').ok_or_else(|| anyhow!("bad --change {c:?}: expected VP=SLICE/PERIOD"))?;
        vps.push(VpOp::Change(VpId::from_raw(handle(h)?), vp(p)?));
    }
    for h in remove {
        vps.push(VpOp::Remove(VpId::from_raw(handle(h)?)));
    }
    Ok(ReserveRequest {
        vps,
        heap_bytes: r.heap.as_deref().map(size).transpose()?,
        tx_bytes_per_sec: r.tx.as_deref().map(rate).transpose()?,
        rx_bytes_per_sec: r.rx.as_deref().map(rate).transpose()?,
    })
}

fn pct(ppm: u64) -> String {
    format!("{:.2}%", ppm as f64 / 10_000.0)
}

fn print(reply: &Reply) -> bool {
    match reply {
        Reply::Granted { session, added } => {
            let vps: Vec<String> = added.iter().map(|v| v.to_string()).collect();
            println!(
                "session {session} granted; VPs added: {}",
                if vps.is_empty() { "none".into() } else { vps.join(" ") }
            );
            true
        }
        Reply::Closed { session, reason, account } => {
            println!("session {session} closed ({reason}); used {:?}", account);
            true
        }
        Reply::Sessions(list) => {
            if list.is_empty() {
                println!("no sessions");
            }
            for s in list {
                println!(
                    "session {}: share {} heap {} B tx {} B/s rx {} B/s; cpu used {} ns guaranteed + {} ns slack",
                    s.session,
                    pct(s.share_ppm),
                    s.heap_bytes,
                    s.tx_bytes_per_sec,
                    s.rx_bytes_per_sec,
                    s.account.cpu_guaranteed_ns,
                    s.account.cpu_slack_ns
                );
                for (v, p) in &s.vps {
                    println!(
                        "  vp {v}: {} ns every {} ns ({}){}",
                        p.slice_ns,
                        p.period_ns,
                        pct(p.share_ppm()),
                        if p.extra { ", may use slack" } else { "" }
                    );
                }
            }
            true
        }
        Reply::Refused { resource, by, asked, left, allowed } => {
            println!(
                "refused by {by}: {resource}: asked {asked}, {left} left on the node, the credential allows {allowed}"
            );
            false
        }
        Reply::BadVp { params, min_period_ns, max_period_ns, min_slice_ns } => {
            println!(
                "refused: VP {} ns / {} ns is outside the node's bounds (period {min_period_ns}..={max_period_ns} ns, slice >= {min_slice_ns} ns)",
                params.slice_ns, params.period_ns
            );
            false
        }
        Reply::Error { code, detail } => {
            println!("refused: {code:?} ({detail})");
            false
        }
    }
}

/// Runs `anode session`.
pub fn run(c: SessionCmd) -> Result<ExitCode> {
    let (req, target) = match c {
        SessionCmd::Open { credential, reservation: r, target } => {
            let credential = std::fs::read(&credential).with_context(|| format!("reading {}", credential.display()))?;
            (Request::Open { credential, reservation: reservation(&r, &[], &[])? }, target)
        }
        SessionCmd::Reserve { session, reservation: r, change, remove, target } => (
            Request::Reserve {
                session: SessionId::from_raw(handle(&session)?),
                reservation: reservation(&r, &change, &remove)?,
            },
            target,
        ),
        SessionCmd::Close { session, target } => {
            (Request::Close { session: SessionId::from_raw(handle(&session)?) }, target)
        }
        SessionCmd::List { repeat, target } if repeat > 1 => {
            let body = Request::List.to_bytes().map_err(|e| anyhow!("session request: {e}"))?;
            let answers = sa_client::requests(&target, &body, repeat.min(10_000), "session requests")?;
            let (mut ok, mut limited, mut other) = (0, 0, 0);
            for a in &answers {
                match Reply::parse_bytes(a) {
                    Ok(Reply::Sessions(_)) => ok += 1,
                    Ok(Reply::Error { code: anode_sched::wire::ErrorCode::RateLimited, .. }) => limited += 1,
                    _ => other += 1,
                }
            }
            println!(
                "{} answers to {repeat} requests: {ok} listed, {limited} rate limited, {other} other",
                answers.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        SessionCmd::List { target, .. } => (Request::List, target),
        SessionCmd::Show { session, target } => {
            (Request::Show { session: SessionId::from_raw(handle(&session)?) }, target)
        }
        SessionCmd::Hold { session, every, duration, target } => return hold(&session, every, duration, &target),
    };
    let body = req.to_bytes().map_err(|e| anyhow!("session request: {e}"))?;
    let node = target.node;
    let answer = sa_client::request(&target, &body, "session request")?;
    let reply = match Reply::parse_bytes(&answer) {
        Ok(r) => r,
        Err(e) => bail!("{node} answered with a malformed session reply: {e}"),
    };
    Ok(if print(&reply) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `anode session hold`: a fresh SA and a `show` every `every`.
fn hold(
    session: &str,
    every: std::time::Duration,
    duration: Option<std::time::Duration>,
    target: &Target,
) -> Result<ExitCode> {
    if every.is_zero() {
        bail!("--every must be more than 0");
    }
    let body = Request::Show { session: SessionId::from_raw(handle(session)?) }
        .to_bytes()
        .map_err(|e| anyhow!("session request: {e}"))?;
    let start = std::time::Instant::now();
    loop {
        let answer = sa_client::request(target, &body, "session request")?;
        let reply = Reply::parse_bytes(&answer)
            .map_err(|e| anyhow!("{} answered with a malformed session reply: {e}", target.node))?;
        if !print(&reply) {
            return Ok(ExitCode::from(1));
        }
        if duration.is_some_and(|d| start.elapsed() + every > d) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(every);
    }
}
