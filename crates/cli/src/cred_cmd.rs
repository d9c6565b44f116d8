//! `anode cred`: issue, show and attenuate the node's credentials (module,
//! session and monitoring), as `biscuit-cli` does for plain tokens.
//!
//! The vocabularies live in the libraries (`anode_cred::credential`,
//! `anode_cred::session`, `anode_monitor::policy`); this module reads
//! files and keys, parses human units, and prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anode_cred::{
    AMOUNTS, Attenuation, CodeInfo, Credential, GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant,
    ModuleHash, SessionAttenuation, SessionCeilings, SessionRequest, SessionSpec, Verifier, VerifierConfig,
    check_bound, check_expiry,
};
use anode_monitor::policy::{self, MonitorSpec, Narrowing, PAYLOAD_ALL, PolicyLimits};
use anyhow::{Context, Result, anyhow, bail};
use biscuit_auth::UnverifiedBiscuit;
use biscuit_auth::builder::{Binary, BlockBuilder, Check, Op, Term};

use crate::monitor_cmd;

/// `anode cred` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CredCmd {
    /// Issue a credential with the administrator's secret key: a module
    /// credential (which code, which host interfaces, which limits), a session
    /// credential (the most the principal may reserve), or a monitoring
    /// credential (what a FLAME module may see).
    ///
    /// Examples:
    ///   anode cred issue --admin-key admin.key --principal alice.pub --kind module
    ///       --module fwd.wasm --interface log,net --memory 16MiB --expires 30d -o fwd.cred
    ///   anode cred issue --admin-key admin.key --principal alice.pub --kind session
    ///       --vp-share 10% --total-share 30% --heap 64MiB --tx 10Mbit/s --expires 2030-01-01T00:00:00Z -o s.cred
    #[command(verbatim_doc_comment)]
    Issue(Box<IssueArgs>),
    /// Print every fact and check of every block of a credential, what it
    /// allows in words, and whether its signatures chain to the
    /// administrator's key (exit status 1 if they do not).
    Show(ShowArgs),
    /// Narrow a credential you hold: append a block of checks (an earlier
    /// expiry, lower limits or ceilings, fewer modules or interfaces). No
    /// secret key is needed, and nobody can widen a credential: facts in
    /// appended blocks are never trusted. Refused if nothing would narrow.
    Attenuate(Box<AttenuateArgs>),
}

/// The kind of credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Loading modules (SANE): code, host interfaces, limits.
    Module,
    /// Opening a session (RCANE): reservation ceilings.
    Session,
    /// Running a FLAME monitoring module: packets, fields, exports.
    Monitor,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Module => "module",
            Kind::Session => "session",
            Kind::Monitor => "monitor",
        }
    }
}

/// `anode cred issue`.
#[derive(Debug, clap::Args)]
pub struct IssueArgs {
    /// The administrator's secret key file (.key).
    #[arg(long, value_name = "FILE")]
    admin_key: PathBuf,
    /// Who it is issued to: a .pub/.key file or a hex public key.
    #[arg(long, value_name = "KEYFILE|HEX")]
    principal: String,
    /// The kind of credential.
    #[arg(long, value_enum)]
    kind: Kind,
    /// Validity: a duration (`3600s`, `90m`, `12h`, `30d`) or an RFC 3339 date. Default: no expiry.
    #[arg(long, value_name = "DURATION|RFC3339")]
    expires: Option<String>,
    /// Output file.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    #[command(flatten, next_help_heading = "Module credentials (--kind module)")]
    module: ModuleOpts,
    #[command(flatten, next_help_heading = "Session credentials (--kind session)")]
    session: SessionOpts,
    #[command(flatten, next_help_heading = "Monitoring credentials (--kind monitor)")]
    monitor: MonitorOpts,
}

/// `anode cred show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The credential file.
    file: PathBuf,
    /// The administrator's public key (.pub/.key file or hex): check that the
    /// signatures chain to it, and decide the credential now.
    #[arg(long, value_name = "FILE|HEX")]
    admin_pub: Option<String>,
}

/// `anode cred attenuate`.
#[derive(Debug, clap::Args)]
pub struct AttenuateArgs {
    /// The credential file.
    file: PathBuf,
    /// Your key (.key/.pub file or hex): refuse to attenuate a credential
    /// that is not yours (a safety check; attenuation needs no secret).
    #[arg(long, value_name = "HOLDER_KEY")]
    key: Option<String>,
    /// Expire sooner: a duration from now or an RFC 3339 date.
    #[arg(long, value_name = "DURATION|RFC3339")]
    expires: Option<String>,
    /// Output file.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    #[command(flatten, next_help_heading = "Module credentials: only these modules, interfaces, at most these limits")]
    module: ModuleOpts,
    #[command(flatten, next_help_heading = "Session credentials: at most these ceilings")]
    session: SessionOpts,
    #[command(flatten, next_help_heading = "Monitoring credentials: see less")]
    monitor: MonitorOpts,
}

/// Options of module credentials.
#[derive(Debug, clap::Args)]
struct ModuleOpts {
    /// Grant (attenuate: only) the code of this wasm file, by its hash. Repeatable.
    #[arg(long = "module", value_name = "WASM")]
    modules: Vec<PathBuf>,
    /// Grant (attenuate: only) the code with this SHA-256 hash (hex). Repeatable.
    #[arg(long = "hash", value_name = "HEX")]
    hashes: Vec<String>,
    /// Grant any version of NAME signed by PROGRAMMER (.pub file or hex). Repeatable.
    #[arg(long = "signed", value_name = "NAME:PROGRAMMER")]
    signed: Vec<String>,
    /// Grant installing code under the principal's own name NAME. Repeatable.
    #[arg(long = "local", value_name = "NAME")]
    local: Vec<String>,
    /// Host interfaces its modules may import, comma separated (log, route,
    /// net, time, state, marshal, or all). Issue default: none.
    #[arg(long = "interface", value_delimiter = ',', value_name = "NAMES")]
    interfaces: Option<Vec<String>>,
    /// Receive channels its modules may open: PORTS/SOURCE, e.g.
    /// `5000-5099@10.0.1.0/24` or `7@*` (docs/channels.md). Repeatable.
    /// None: any channel (as credentials issued before channel grants).
    #[arg(long = "channel", value_name = "PORTS@SOURCE")]
    channels: Vec<String>,
    /// Linear memory, e.g. 16MiB (module and monitoring credentials). Issue default: 16MiB (monitor: 8MiB).
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Fuel per invocation (≈ wasm instructions). Issue default: 1000000.
    #[arg(long, value_name = "FUEL")]
    cpu: Option<u64>,
    /// Soft state, e.g. 64KiB. Issue default: 64KiB.
    #[arg(long, value_name = "SIZE")]
    state: Option<String>,
    /// Administrative credential: any module, every interface, the node's
    /// maximum limits (with --kind monitor: sees everything).
    #[arg(long)]
    admin_right: bool,
}

/// Options of session credentials.
#[derive(Debug, clap::Args)]
struct SessionOpts {
    /// Largest CPU share of one virtual processor: `10%`, `100000ppm`, or
    /// SLICE/PERIOD such as `4ms/40ms`. Issue default: 10%.
    #[arg(long, value_name = "SHARE")]
    vp_share: Option<String>,
    /// Largest sum of the session's VP shares (same forms). Issue default: 20%.
    #[arg(long, value_name = "SHARE")]
    total_share: Option<String>,
    /// Most virtual processors. Issue default: 2.
    #[arg(long, value_name = "N")]
    vps: Option<u32>,
    /// Issue: VPs may use slack beyond their guarantee (default: they may not).
    #[arg(long)]
    extra: bool,
    /// Attenuate: no VP may use slack.
    #[arg(long)]
    no_extra: bool,
    /// Largest heap reservation, e.g. 16MiB. Issue default: 16MiB.
    #[arg(long, value_name = "SIZE")]
    heap: Option<String>,
    /// Largest transmit reservation, e.g. 1Mbit/s, 125kB/s, 125000 (bytes/s). Issue default: 1Mbit/s.
    #[arg(long, value_name = "RATE")]
    tx: Option<String>,
    /// Largest receive reservation (same forms). Issue default: 1Mbit/s.
    #[arg(long, value_name = "RATE")]
    rx: Option<String>,
    /// Most event pools. Issue default: 4.
    #[arg(long, value_name = "N")]
    pools: Option<u32>,
    /// Most events queued over all pools. Issue default: 1024.
    #[arg(long, value_name = "N")]
    queued: Option<u32>,
}

/// Options of monitoring credentials (the vocabulary of `anode monitor credential`).
#[derive(Debug, clap::Args)]
struct MonitorOpts {
    /// Readable fields, comma separated (`all` for every field). Issue default: ts.
    #[arg(long, value_delimiter = ',', value_name = "FIELDS")]
    read: Option<Vec<String>>,
    /// Payload bytes: `none`, `all` or a number. Issue default: none.
    #[arg(long, value_name = "BYTES")]
    payload: Option<String>,
    /// Anonymize addresses in these prefixes (`all` for every address).
    #[arg(long, value_delimiter = ',', value_name = "PREFIXES")]
    anonymize: Vec<String>,
    /// Only packets of these IP protocols.
    #[arg(long, value_delimiter = ',', value_name = "PROTOS")]
    proto: Vec<u8>,
    /// Only packets with source or destination in these prefixes.
    #[arg(long, value_delimiter = ',', value_name = "PREFIXES")]
    net: Vec<String>,
    /// Only packets with one of these TCP/UDP ports.
    #[arg(long, value_delimiter = ',', value_name = "PORTS")]
    port: Vec<u16>,
    /// Fuel per packet. Issue default: 20000.
    #[arg(long, value_name = "FUEL")]
    budget: Option<u64>,
    /// Fuel per periodic call. Issue default: 5000000.
    #[arg(long, value_name = "FUEL")]
    periodic: Option<u64>,
    /// Export rights: `records`, `packets` (comma separated) or `none`. Issue default: records.
    #[arg(long, value_delimiter = ',', value_name = "RIGHTS")]
    export: Option<Vec<String>>,
}

impl ModuleOpts {
    fn given(&self) -> Vec<&'static str> {
        let mut g = Vec::new();
        for (on, name) in [
            (!self.modules.is_empty(), "--module"),
            (!self.hashes.is_empty(), "--hash"),
            (!self.signed.is_empty(), "--signed"),
            (!self.local.is_empty(), "--local"),
            (self.interfaces.is_some(), "--interface"),
            (!self.channels.is_empty(), "--channel"),
            (self.cpu.is_some(), "--cpu"),
            (self.state.is_some(), "--state"),
        ] {
            if on {
                g.push(name);
            }
        }
        g
    }
}

impl SessionOpts {
    fn given(&self) -> Vec<&'static str> {
        [
            (self.vp_share.is_some(), "--vp-share"),
            (self.total_share.is_some(), "--total-share"),
            (self.vps.is_some(), "--vps"),
            (self.extra, "--extra"),
            (self.no_extra, "--no-extra"),
            (self.heap.is_some(), "--heap"),
            (self.tx.is_some(), "--tx"),
            (self.rx.is_some(), "--rx"),
            (self.pools.is_some(), "--pools"),
            (self.queued.is_some(), "--queued"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

impl MonitorOpts {
    fn given(&self) -> Vec<&'static str> {
        [
            (self.read.is_some(), "--read"),
            (self.payload.is_some(), "--payload"),
            (!self.anonymize.is_empty(), "--anonymize"),
            (!self.proto.is_empty(), "--proto"),
            (!self.net.is_empty(), "--net"),
            (!self.port.is_empty(), "--port"),
            (self.budget.is_some(), "--budget"),
            (self.periodic.is_some(), "--periodic"),
            (self.export.is_some(), "--export"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// Refuses options of the other kinds (`--memory` and `--admin-right` are shared by module and monitor).
fn only_for(kind: Kind, m: &ModuleOpts, s: &SessionOpts, mon: &MonitorOpts) -> Result<()> {
    let mut wrong: Vec<(&str, &str)> = Vec::new();
    if kind != Kind::Module {
        wrong.extend(m.given().into_iter().map(|g| (g, "module")));
    }
    if kind == Kind::Session {
        if m.memory.is_some() {
            wrong.push(("--memory", "module and monitoring"));
        }
        if m.admin_right {
            wrong.push(("--admin-right", "module and monitoring"));
        }
    }
    if kind != Kind::Session {
        wrong.extend(s.given().into_iter().map(|g| (g, "session")));
    }
    if kind != Kind::Monitor {
        wrong.extend(mon.given().into_iter().map(|g| (g, "monitoring")));
    }
    if let Some((opt, k)) = wrong.first() {
        bail!("{opt} applies to {k} credentials only, and this is a {} credential", kind.name());
    }
    Ok(())
}

/// Runs `anode cred`.
pub fn run(c: CredCmd) -> Result<ExitCode> {
    match c {
        CredCmd::Issue(a) => issue(*a),
        CredCmd::Show(a) => show(a),
        CredCmd::Attenuate(a) => attenuate(*a),
    }
}

// ---------------------------------------------------------------- units

/// A size: `16MiB`, `64KiB`, `1GiB`, `10MB`, `1kB`, or bytes.
pub(crate) fn size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "kB" | "KB" => 1000,
        "Ki" | "KiB" => 1 << 10,
        "M" | "MB" => 1_000_000,
        "Mi" | "MiB" => 1 << 20,
        "G" | "GB" => 1_000_000_000,
        "Gi" | "GiB" => 1 << 30,
        u => bail!("bad size unit {u:?} in {s:?}: use B, kB, KiB, MB, MiB, GB or GiB"),
    };
    scaled(n, mul).with_context(|| format!("bad size {s:?}"))
}

/// A rate in bytes per second: `1Mbit/s`, `10Mbps`, `125kB/s`, `1MiB/s`, or bytes/s.
pub(crate) fn rate(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let unit = unit.trim().trim_end_matches("/s").trim_end_matches("ps");
    let (num, bits) = match unit {
        "" | "B" => (1u64, false),
        "kB" | "KB" => (1000, false),
        "KiB" => (1 << 10, false),
        "MB" => (1_000_000, false),
        "MiB" => (1 << 20, false),
        "GB" => (1_000_000_000, false),
        "bit" | "b" => (1, true),
        "kbit" | "Kbit" | "kb" => (1000, true),
        "Mbit" | "Mb" => (1_000_000, true),
        "Gbit" | "Gb" => (1_000_000_000, true),
        u => bail!("bad rate unit {u:?} in {s:?}: use bit/s, kbit/s, Mbit/s, Gbit/s, B/s, kB/s, MB/s or MiB/s"),
    };
    let v = scaled(n, num).with_context(|| format!("bad rate {s:?}"))?;
    Ok(if bits { v / 8 } else { v })
}

/// A CPU share in ppm: `10%`, `2.5%`, `100000ppm`, `0.1`, or `4ms/40ms`.
fn share(s: &str) -> Result<u64> {
    let t = s.trim();
    let ppm = if let Some((slice, period)) = t.split_once('/') {
        let (a, b) = (span(slice)?, span(period)?);
        if b.is_zero() {
            bail!("bad share {s:?}: zero period");
        }
        (a.as_nanos().saturating_mul(1_000_000) / b.as_nanos()) as u64
    } else if let Some(p) = t.strip_suffix('%') {
        scaled(p.trim(), 10_000)?
    } else if let Some(p) = t.strip_suffix("ppm") {
        scaled(p.trim(), 1)?
    } else {
        scaled(t, 1_000_000)?
    };
    if ppm > 1_000_000 {
        bail!("share {s:?} is more than one CPU (100%)");
    }
    Ok(ppm)
}

/// [`span`] for clap's `value_parser`.
pub(crate) fn span_arg(s: &str) -> Result<Duration, String> {
    span(s).map_err(|e| e.to_string())
}

/// A short time span: `4ms`, `500us`, `1s`, `250000ns`.
pub(crate) fn span(s: &str) -> Result<Duration> {
    Ok(Duration::from_nanos(anode_sched::parse_span_ns(s)?))
}

/// `n` (maybe with a decimal point) times `mul`, rounded to an integer.
fn scaled(n: &str, mul: u64) -> Result<u64> {
    if n.is_empty() {
        bail!("no number");
    }
    if let Ok(v) = n.parse::<u64>() {
        return v.checked_mul(mul).ok_or_else(|| anyhow!("{n} is too large"));
    }
    let v: f64 = n.parse().with_context(|| format!("{n:?} is not a number"))?;
    let r = (v * mul as f64).round();
    if !(0.0..1.8e19).contains(&r) {
        bail!("{n} is out of range");
    }
    Ok(r as u64)
}

/// An expiry: a duration from now or an RFC 3339 date.
fn expiry(s: &str) -> Result<SystemTime> {
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(s) {
        let secs = u64::try_from(d.timestamp()).map_err(|_| anyhow!("{s}: before 1970"))?;
        return Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
    }
    let d = monitor_cmd::duration(s)
        .with_context(|| format!("--expires {s:?}: a duration (90m, 12h, 30d) or an RFC 3339 date"))?;
    Ok(SystemTime::now() + d)
}

fn date(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let when = chrono::DateTime::from_timestamp(i64::try_from(secs).unwrap_or(i64::MAX), 0)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| format!("{secs} s after 1970"));
    match t.duration_since(SystemTime::now()) {
        Ok(left) => format!("{when} (in {})", human_span(left)),
        Err(_) => format!("{when} (EXPIRED)"),
    }
}

fn human_span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn human_bytes(b: u64) -> String {
    for (unit, m) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if b >= m && b.is_multiple_of((m / 1024).max(1)) {
            let v = b as f64 / m as f64;
            return if b.is_multiple_of(m) { format!("{} {unit}", b / m) } else { format!("{v:.2} {unit}") };
        }
    }
    format!("{b} bytes")
}

fn human_rate(b: u64) -> String {
    let bits = b.saturating_mul(8);
    let s = match bits {
        0..1000 => format!("{bits} bit/s"),
        1000..1_000_000 => format!("{} kbit/s", trim(bits as f64 / 1e3)),
        1_000_000..1_000_000_000 => format!("{} Mbit/s", trim(bits as f64 / 1e6)),
        _ => format!("{} Gbit/s", trim(bits as f64 / 1e9)),
    };
    format!("{s} ({b} bytes/s)")
}

fn human_share(ppm: u64) -> String {
    format!("{} % ({ppm} ppm)", trim(ppm as f64 / 1e4))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

// ---------------------------------------------------------------- issue

fn interfaces(names: &[String]) -> Result<InterfaceSet> {
    let mut set = InterfaceSet::EMPTY;
    for n in names.iter().filter(|n| !n.is_empty()) {
        if n == "all" {
            return Ok(InterfaceSet::ALL);
        }
        let all: Vec<&str> = Interface::ALL.iter().map(|i| i.name()).collect();
        set.insert(
            Interface::from_name(n)
                .ok_or_else(|| anyhow!("unknown interface {n:?}; interfaces: {}", all.join(", ")))?,
        );
    }
    Ok(set)
}

fn module_hashes(m: &ModuleOpts) -> Result<Vec<ModuleHash>> {
    let mut out = Vec::new();
    for f in &m.modules {
        let code = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let info = CodeInfo::inspect(&code).map_err(|e| anyhow!("{}: not a module: {e}", f.display()))?;
        out.push(info.hash);
    }
    for h in &m.hashes {
        out.push(ModuleHash::from_hex(h).ok_or_else(|| anyhow!("--hash {h:?}: 64 hex digits (a SHA-256)"))?);
    }
    Ok(out)
}

fn issue(a: IssueArgs) -> Result<ExitCode> {
    only_for(a.kind, &a.module, &a.session, &a.monitor)?;
    if a.session.no_extra {
        bail!("--no-extra is for attenuation; a session credential allows no slack unless issued with --extra");
    }
    let admin = anode_sec::Identity::load(&a.admin_key)
        .with_context(|| format!("{}: not an administrator secret key", a.admin_key.display()))?;
    let issuer = Issuer::from_secret(&admin.secret_seed()).map_err(|e| anyhow!("{e}"))?;
    let who = monitor_cmd::principal(&a.principal).context("--principal: a .pub/.key file or a hex public key")?;
    let expires = a.expires.as_deref().map(expiry).transpose()?;
    let m = &a.module;
    let cred = match a.kind {
        Kind::Module => {
            let mut grants: Vec<ModuleGrant> = module_hashes(m)?.into_iter().map(ModuleGrant::Hash).collect();
            for s in &m.signed {
                let (name, key) =
                    s.split_once(':').ok_or_else(|| anyhow!("--signed {s:?}: NAME:PROGRAMMER (key file or hex)"))?;
                grants.push(ModuleGrant::Signed { programmer: monitor_cmd::principal(key)?, name: name.into() });
            }
            grants.extend(m.local.iter().map(|n| ModuleGrant::Local(n.clone())));
            if m.admin_right {
                if let Some(g) = m.given().first() {
                    bail!("--admin-right grants every module, interface and the node's limits: drop {g}");
                }
                issuer.admin(who, expires)
            } else {
                if grants.is_empty() {
                    bail!("a module credential names its modules: give --module, --hash, --signed or --local (or --admin-right)");
                }
                let limits = Limits {
                    memory: m.memory.as_deref().map(size).transpose()?.unwrap_or(16 << 20),
                    cpu: m.cpu.unwrap_or(1_000_000),
                    state: m.state.as_deref().map(size).transpose()?.unwrap_or(64 << 10),
                };
                let interfaces = interfaces(m.interfaces.as_deref().unwrap_or(&[]))?;
                let channels = m
                    .channels
                    .iter()
                    .map(|c| {
                        let (ports, source) = c.split_once('@').unwrap_or((c.as_str(), "*"));
                        anode_cred::ChannelGrant::parse(ports, source).map_err(|e| anyhow!("--channel {c}: {e}"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let spec = GrantSpec { modules: grants, interfaces, limits, expires };
                if channels.is_empty() {
                    issuer.issue(who, &spec)
                } else {
                    issuer.issue_channels(who, &spec, &channels)
                }
            }
            .map_err(|e| anyhow!("{e}"))?
        }
        Kind::Session => {
            let s = &a.session;
            let ceilings = SessionCeilings {
                max_vp_share_ppm: s.vp_share.as_deref().map(share).transpose()?.unwrap_or(100_000),
                max_total_share_ppm: s.total_share.as_deref().map(share).transpose()?.unwrap_or(200_000),
                max_vps: s.vps.unwrap_or(2),
                extra: s.extra,
                max_heap_bytes: s.heap.as_deref().map(size).transpose()?.unwrap_or(16 << 20),
                max_tx_bytes_per_sec: s.tx.as_deref().map(rate).transpose()?.unwrap_or(125_000),
                max_rx_bytes_per_sec: s.rx.as_deref().map(rate).transpose()?.unwrap_or(125_000),
                max_pools: s.pools.unwrap_or(4),
                max_queued_events: s.queued.unwrap_or(1024),
            };
            if ceilings.max_vp_share_ppm > ceilings.max_total_share_ppm {
                bail!(
                    "--vp-share {} is more than --total-share {}: one VP could never get it",
                    human_share(ceilings.max_vp_share_ppm),
                    human_share(ceilings.max_total_share_ppm)
                );
            }
            issuer.issue_session(who, &SessionSpec { ceilings, expires }).map_err(|e| anyhow!("{e}"))?
        }
        Kind::Monitor => {
            let o = &a.monitor;
            let payload = match o.payload.as_deref().unwrap_or("none") {
                "none" => 0,
                "all" => PAYLOAD_ALL,
                n => n.parse().with_context(|| format!("--payload {n:?}: none, all or a number"))?,
            };
            let spec = MonitorSpec {
                filter: monitor_cmd::clauses(&o.proto, &o.net, &o.port)?,
                read: monitor_cmd::fields(o.read.as_deref().unwrap_or(&["ts".to_string()]))?,
                payload,
                anonymize: monitor_cmd::prefixes(&o.anonymize)?,
                limits: Some(PolicyLimits {
                    budget: o.budget.unwrap_or(20_000),
                    periodic: o.periodic.unwrap_or(5_000_000),
                    memory: m.memory.as_deref().map(size).transpose()?.unwrap_or(8 << 20),
                }),
                export: monitor_cmd::exports(o.export.as_deref().unwrap_or(&["records".to_string()]))?,
                expires,
                admin: m.admin_right,
            };
            policy::issue(&issuer, who, &spec)?
        }
    };
    write(&a.output, cred.to_bytes())?;
    println!(
        "{}: {} credential for {}, {} bytes{}",
        a.output.display(),
        a.kind.name(),
        who.to_hex(),
        cred.to_bytes().len(),
        expires.map(|t| format!(", expires {}", date(t))).unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

// ---------------------------------------------------------------- reading

/// A credential read without its root key: its blocks' Datalog, parsed back.
struct Parsed {
    token: UnverifiedBiscuit,
    /// Each block's source and its facts and checks (`None`: the source does not parse back).
    blocks: Vec<(String, Option<BlockBuilder>)>,
}

fn read_credential(path: &Path) -> Result<(Vec<u8>, Parsed)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let token = UnverifiedBiscuit::from(&bytes)
        .map_err(|e| anyhow!("{}: not a credential (not a Biscuit token): {e}", path.display()))?;
    let mut blocks = Vec::new();
    for i in 0..token.block_count() {
        let src = token.print_block_source(i).map_err(|e| anyhow!("{}: block {i}: {e}", path.display()))?;
        let parsed = BlockBuilder::new().code(src.as_str()).ok();
        blocks.push((src, parsed));
    }
    Ok((bytes, Parsed { token, blocks }))
}

fn str_term(t: &Term) -> String {
    match t {
        Term::Str(s) => s.clone(),
        other => other.to_string(),
    }
}

fn int_term(t: &Term) -> Option<u64> {
    match t {
        Term::Integer(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// What the authority block states, read back from its facts.
#[derive(Default)]
struct Authority {
    kinds: BTreeSet<String>,
    principals: Vec<String>,
    rights: BTreeSet<String>,
    facts: Vec<(String, Vec<Term>)>,
}

impl Authority {
    fn of(b: &BlockBuilder) -> Authority {
        let mut a = Authority::default();
        for f in &b.facts {
            let (name, terms) = (&f.predicate.name, &f.predicate.terms);
            match (name.as_str(), terms.as_slice()) {
                ("kind", [k]) => {
                    a.kinds.insert(str_term(k));
                }
                ("principal", [p]) => a.principals.push(str_term(p)),
                ("right", [r]) => {
                    a.rights.insert(str_term(r));
                }
                _ => {}
            }
            a.facts.push((name.clone(), terms.clone()));
        }
        a
    }

    fn kind(&self) -> String {
        let mut k = self.kinds.clone();
        if self.rights.contains("monitor") {
            k.insert("monitor".into());
        }
        if k.is_empty() { "module".into() } else { k.into_iter().collect::<Vec<_>>().join("+") }
    }

    fn all(&self, name: &str) -> impl Iterator<Item = &[Term]> {
        self.facts.iter().filter(move |(n, _)| n == name).map(|(_, t)| t.as_slice())
    }

    fn limit(&self, kind: &str) -> Option<u64> {
        self.all("limit")
            .filter(|t| t.first().map(str_term).as_deref() == Some(kind))
            .filter_map(|t| t.get(1))
            .filter_map(int_term)
            .max()
    }

    fn ceilings(&self) -> SessionCeilings {
        let mut c = SessionCeilings::NONE;
        for name in AMOUNTS {
            let v = self
                .all("ceiling")
                .filter(|t| t.first().map(str_term).as_deref() == Some(name))
                .filter_map(|t| t.get(1))
                .map(|t| int_term(t).unwrap_or(0))
                .min()
                .unwrap_or(0);
            set_ceiling(&mut c, name, v);
        }
        c
    }

    fn interfaces(&self) -> InterfaceSet {
        if self.rights.contains("admin") {
            return InterfaceSet::ALL;
        }
        let mut s = InterfaceSet::EMPTY;
        for t in self.all("interface") {
            if let Some(i) = t.first().and_then(|t| Interface::from_name(&str_term(t))) {
                s.insert(i);
            }
        }
        s
    }
}

fn set_ceiling(c: &mut SessionCeilings, name: &str, v: u64) {
    let n32 = u32::try_from(v).unwrap_or(u32::MAX);
    match name {
        "vp_share" => c.max_vp_share_ppm = v,
        "total_share" => c.max_total_share_ppm = v,
        "vps" => c.max_vps = n32,
        "extra" => c.extra = v != 0,
        "heap" => c.max_heap_bytes = v,
        "tx" => c.max_tx_bytes_per_sec = v,
        "rx" => c.max_rx_bytes_per_sec = v,
        "pools" => c.max_pools = n32,
        "queued" => c.max_queued_events = n32,
        _ => {}
    }
}

/// A bound in words, by fact name.
fn bound_words(fact: &str, v: u64) -> String {
    match fact {
        "vp_share" => format!("one VP's CPU share at most {}", human_share(v)),
        "total_share" => format!("total CPU share at most {}", human_share(v)),
        "vps" => format!("at most {v} VPs"),
        "extra" => "no slack for any VP".into(),
        "heap" => format!("heap reservation at most {}", human_bytes(v)),
        "tx" => format!("transmit reservation at most {}", human_rate(v)),
        "rx" => format!("receive reservation at most {}", human_rate(v)),
        "pools" => format!("at most {v} pools"),
        "queued" => format!("at most {v} queued events"),
        "memory" => format!("module memory at most {}", human_bytes(v)),
        "cpu" => format!("at most {v} fuel per invocation"),
        "state" => format!("soft state at most {}", human_bytes(v)),
        other => format!("{other} at most {v}"),
    }
}

fn ceilings_words(c: &SessionCeilings) -> Vec<String> {
    vec![
        format!("one VP: at most {}", human_share(c.max_vp_share_ppm)),
        format!("all its VPs together: at most {}", human_share(c.max_total_share_ppm)),
        format!("VPs: at most {}; slack beyond the guarantee: {}", c.max_vps, if c.extra { "allowed" } else { "no" }),
        format!("heap: at most {}", human_bytes(c.max_heap_bytes)),
        format!("transmit: at most {}", human_rate(c.max_tx_bytes_per_sec)),
        format!("receive: at most {}", human_rate(c.max_rx_bytes_per_sec)),
        format!("pools: at most {}; queued events: at most {}", c.max_pools, c.max_queued_events),
    ]
}

/// `check if <fact>($x), {set}.contains($x)` (or `check all`): the set and the fact.
fn check_set(c: &Check) -> Option<(String, Vec<String>)> {
    let [q] = c.queries.as_slice() else { return None };
    let [p] = q.body.as_slice() else { return None };
    let [e] = q.expressions.as_slice() else { return None };
    match (p.terms.as_slice(), e.ops.as_slice()) {
        (
            [Term::Variable(v)],
            [Op::Value(Term::Set(s)), Op::Value(Term::Variable(x)), Op::Binary(Binary::Contains)],
        ) if v == x => Some((p.name.clone(), s.iter().map(str_term).collect())),
        _ => None,
    }
}

/// The effect of every block, as the node would decide it (without the
/// request): what `show` prints and what `attenuate` must narrow.
struct Effect {
    kind: String,
    authority: Authority,
    expires: Option<SystemTime>,
    /// Module limits (memory, cpu, state); `None`: administrative (node maxima).
    limits: Option<Limits>,
    interfaces: InterfaceSet,
    /// Only modules with these hashes (`None`: no such restriction).
    only_hashes: Option<BTreeSet<String>>,
    ceilings: SessionCeilings,
    /// Per block: lines in words.
    words: Vec<Vec<String>>,
}

fn effect(p: &Parsed) -> Result<Effect> {
    let auth_block =
        p.blocks.first().and_then(|(_, b)| b.as_ref()).ok_or_else(|| anyhow!("authority block unreadable"))?;
    let authority = Authority::of(auth_block);
    let kind = authority.kind();
    let admin = authority.rights.contains("admin");
    let mut e = Effect {
        kind: kind.clone(),
        expires: None,
        limits: (!admin).then(|| Limits {
            memory: authority.limit("memory").unwrap_or(0),
            cpu: authority.limit("cpu").unwrap_or(0),
            state: authority.limit("state").unwrap_or(0),
        }),
        interfaces: authority.interfaces(),
        only_hashes: None,
        ceilings: authority.ceilings(),
        words: Vec::new(),
        authority,
    };
    for (i, (src, b)) in p.blocks.iter().enumerate() {
        let mut w = Vec::new();
        let Some(b) = b else {
            w.push(format!("(cannot read this block back; its source is above: {} bytes)", src.len()));
            e.words.push(w);
            continue;
        };
        if i == 0 {
            w.extend(authority_words(&e));
        } else {
            for f in &b.facts {
                if kind == "monitor" && f.predicate.name.starts_with("narrow_") {
                    w.push(format!("narrows: {f}"));
                } else {
                    w.push(format!("fact ignored by the node (facts of appended blocks are never trusted): {f}"));
                }
            }
            if !b.rules.is_empty() {
                w.push(format!("{} rule(s): they can only derive facts for this block's own checks", b.rules.len()));
            }
        }
        for c in &b.checks {
            if let Some(t) = check_expiry(c) {
                e.expires = Some(e.expires.map_or(t, |x| x.min(t)));
                w.push(format!("expires {}", date(t)));
            } else if let Some(bd) = check_bound(c) {
                match bd.fact.as_str() {
                    "memory" | "cpu" | "state" => {
                        if let Some(l) = e.limits.as_mut() {
                            let f = match bd.fact.as_str() {
                                "memory" => &mut l.memory,
                                "cpu" => &mut l.cpu,
                                _ => &mut l.state,
                            };
                            *f = (*f).min(bd.max);
                        } else {
                            e.limits = Some(Limits { memory: u64::MAX, cpu: u64::MAX, state: u64::MAX });
                            if let Some(l) = e.limits.as_mut() {
                                match bd.fact.as_str() {
                                    "memory" => l.memory = bd.max,
                                    "cpu" => l.cpu = bd.max,
                                    _ => l.state = bd.max,
                                }
                            }
                        }
                    }
                    name if AMOUNTS.contains(&name) => {
                        let v = e.ceilings.get(name).unwrap_or(0).min(bd.max);
                        set_ceiling(&mut e.ceilings, name, v);
                    }
                    _ => {}
                }
                w.push(bound_words(&bd.fact, bd.max));
            } else if let Some((fact, set)) = check_set(c) {
                match fact.as_str() {
                    "uses" => {
                        let mut s = InterfaceSet::EMPTY;
                        for i in set.iter().filter_map(|n| Interface::from_name(n)) {
                            if e.interfaces.contains(i) {
                                s.insert(i);
                            }
                        }
                        e.interfaces = s;
                        w.push(format!("only modules importing no more than: {}", set.join(", ")));
                    }
                    "module_hash" => {
                        let s: BTreeSet<String> = set.iter().cloned().collect();
                        e.only_hashes = Some(match &e.only_hashes {
                            Some(o) => o.intersection(&s).cloned().collect(),
                            None => s,
                        });
                        w.push(format!("only the modules with hash {}", set.join(", ")));
                    }
                    _ => w.push(format!("check (decided at each use): {c}")),
                }
            } else {
                w.push(format!("check (decided at each use): {c}"));
            }
        }
        e.words.push(w);
    }
    Ok(e)
}

fn authority_words(e: &Effect) -> Vec<String> {
    let a = &e.authority;
    let mut w = vec![format!("kind: {} credential", e.kind)];
    match a.principals.as_slice() {
        [p] => w.push(format!("issued to principal {p}")),
        [] => w.push("names NO principal: every node refuses it".into()),
        _ => w.push("names several principals: every node refuses it".into()),
    }
    let admin = a.rights.contains("admin");
    match e.kind.as_str() {
        "module" => {
            if admin {
                w.push(
                    "administrative: may load any module, import every interface, with the node's maximum limits"
                        .into(),
                );
            }
            for t in a.all("grant_hash") {
                w.push(format!("may load the code with hash {}", t.first().map(str_term).unwrap_or_default()));
            }
            for t in a.all("grant_signed") {
                if let [k, n] = t {
                    w.push(format!("may load any version of {} signed by programmer {}", str_term(n), str_term(k)));
                }
            }
            for t in a.all("grant_local") {
                w.push(format!("may install code under its own name {}", t.first().map(str_term).unwrap_or_default()));
            }
            if !admin {
                let names: Vec<&str> = e.interfaces.iter().map(|i| i.name()).collect();
                w.push(format!(
                    "its modules may import: {}",
                    if names.is_empty() { "no host interface".into() } else { names.join(", ") }
                ));
                let channels: Vec<String> = a
                    .all("channel")
                    .map(|t| match t {
                        [p, s] => format!("port(s) {} from {}", str_term(p), str_term(s)),
                        _ => "a malformed grant (every node refuses the credential)".into(),
                    })
                    .collect();
                w.push(if channels.is_empty() {
                    "its modules may open receive channels for any traffic (no channel grant)".into()
                } else {
                    format!("its modules may open receive channels only for: {}", channels.join("; "))
                });
                let l = e.limits.unwrap_or(Limits { memory: 0, cpu: 0, state: 0 });
                w.push(format!(
                    "limits: memory {}, {} fuel per invocation, soft state {}",
                    human_bytes(l.memory),
                    l.cpu,
                    human_bytes(l.state)
                ));
            }
        }
        "session" => {
            w.push("may open a session on the node and reserve within these ceilings:".into());
            w.extend(ceilings_words(&e.ceilings).into_iter().map(|l| format!("ceiling: {l}")));
        }
        "monitor" => {
            if admin {
                w.push(
                    "administrative monitoring: every field, the whole payload, no anonymization, every export".into(),
                );
            }
            for (name, terms) in &a.facts {
                let v: Vec<String> = terms.iter().map(str_term).collect();
                let v = v.join(", ");
                match name.as_str() {
                    "read" => w.push(format!("may read field {v}")),
                    "payload" => w.push(format!("may read {v} payload bytes")),
                    "payload_all" => w.push("may read the whole captured payload".into()),
                    "anonymize" => w.push(format!("addresses in {v} are anonymized")),
                    "limit" => w.push(format!("limit {v}")),
                    "export" => w.push(format!("may export {v}")),
                    n if n.starts_with("filter_") => w.push(format!("sees only packets with {} {v}", &n[7..])),
                    _ => {}
                }
            }
        }
        other => w.push(format!("unknown kind {other:?}: no node accepts it")),
    }
    w
}

// ---------------------------------------------------------------- show

fn show(a: ShowArgs) -> Result<ExitCode> {
    let (bytes, p) = read_credential(&a.file)?;
    println!("{}: {} bytes, {} blocks", a.file.display(), bytes.len(), p.token.block_count());
    let mut status = ExitCode::SUCCESS;
    let root = a.admin_pub.as_deref().map(monitor_cmd::root_key).transpose().context("--admin-pub")?;
    match &root {
        Some(r) => match Credential::parse(&bytes, r) {
            Ok(_) => println!("signature: chains to the administrator key {}", hex(&r.to_bytes())),
            Err(e) => {
                println!("signature: does NOT chain to the administrator key {}: {e}", hex(&r.to_bytes()));
                status = ExitCode::FAILURE;
            }
        },
        None => println!("signature: not checked (give --admin-pub to check it)"),
    }
    let e = effect(&p)?;
    for (i, (src, _)) in p.blocks.iter().enumerate() {
        println!();
        if i == 0 {
            println!("block 0 (authority, signed by the administrator):");
        } else {
            println!("block {i} (attenuation appended by a holder: only its checks count):");
        }
        for l in src.lines().filter(|l| !l.trim().is_empty()) {
            println!("    {l}");
        }
        println!("  in words:");
        for l in e.words.get(i).into_iter().flatten() {
            println!("    - {l}");
        }
    }
    println!();
    println!("in effect:");
    println!("  kind: {}", e.kind);
    if let [pr] = e.authority.principals.as_slice() {
        println!("  principal: {pr}");
    }
    println!("  expires: {}", e.expires.map(date).unwrap_or_else(|| "never".into()));
    match e.kind.as_str() {
        "module" => {
            match e.limits {
                None => println!("  limits: the node's maxima (administrative)"),
                Some(l) => println!(
                    "  limits: memory {}, {} fuel per invocation, soft state {}",
                    human_bytes(l.memory),
                    l.cpu,
                    human_bytes(l.state)
                ),
            }
            let names: Vec<&str> = e.interfaces.iter().map(|i| i.name()).collect();
            println!("  interfaces: {}", if names.is_empty() { "none".into() } else { names.join(", ") });
            if let Some(h) = &e.only_hashes {
                println!("  only modules: {}", h.iter().cloned().collect::<Vec<_>>().join(", "));
            }
        }
        "session" => {
            println!("  ceilings:");
            for l in ceilings_words(&e.ceilings) {
                println!("    {l}");
            }
        }
        _ => {}
    }
    if let (Some(r), ExitCode::SUCCESS) = (root, status) {
        decide_now(&e, &bytes, r)?;
    }
    Ok(status)
}

/// With a verified root: the node's own decision now, where it needs no request.
fn decide_now(e: &Effect, bytes: &[u8], root: anode_cred::RootKey) -> Result<()> {
    let now = SystemTime::now();
    match e.kind.as_str() {
        "session" => {
            let who = e.authority.principals.first().and_then(|p| anode_cred::PrincipalId::from_hex(p));
            let Some(who) = who else { return Ok(()) };
            let mut v = Verifier::new(root, VerifierConfig::default());
            match v.authorize_session(now, bytes, who, &SessionRequest::default()) {
                Ok(g) => println!(
                    "decision now: a session may open (ceilings above; recheck at {})",
                    g.recheck_at.map(date).unwrap_or_else(|| "never".into())
                ),
                Err(err) => println!("decision now: REFUSED: {err}"),
            }
        }
        "monitor" => match anode_monitor::PolicyVerifier::new(root).authorize(now, bytes) {
            Ok(p) => println!(
                "decision now: a monitoring module may run: {} readable fields, payload {}, limits budget {} fuel/packet, export records {}, packets {}",
                p.fields.count_ones(),
                if p.payload == PAYLOAD_ALL { "all".to_string() } else { p.payload.to_string() },
                p.limits.budget,
                p.export.records,
                p.export.packets
            ),
            Err(err) => println!("decision now: REFUSED: {err}"),
        },
        _ => match e.expires {
            Some(t) if t <= now => println!("decision now: REFUSED: expired"),
            _ => println!("decision now: valid (each load is decided against the module's code and imports)"),
        },
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------- attenuate

fn attenuate(a: AttenuateArgs) -> Result<ExitCode> {
    let (_, p) = read_credential(&a.file)?;
    let e = effect(&p)?;
    let kind = match e.kind.as_str() {
        "module" => Kind::Module,
        "session" => Kind::Session,
        "monitor" => Kind::Monitor,
        other => bail!("{}: a credential of unknown kind {other:?}", a.file.display()),
    };
    only_for(kind, &a.module, &a.session, &a.monitor)?;
    if let Some(k) = &a.key {
        let mine = monitor_cmd::principal(k).context("--key")?.to_hex();
        if e.authority.principals.first() != Some(&mine) {
            bail!(
                "{} belongs to {}, not to --key {mine}: you can only usefully attenuate your own credential",
                a.file.display(),
                e.authority.principals.first().map(String::as_str).unwrap_or("nobody")
            );
        }
    }
    let mut skipped: Vec<String> = Vec::new();
    let expires = match a.expires.as_deref().map(expiry).transpose()? {
        Some(t) if e.expires.is_some_and(|x| x <= t) => {
            skipped.push(format!(
                "--expires {} (already expires {})",
                date(t),
                e.expires.map(date).unwrap_or_default()
            ));
            None
        }
        other => other,
    };
    let block = match kind {
        Kind::Module => {
            let m = &a.module;
            if m.admin_right || !m.signed.is_empty() || !m.local.is_empty() {
                bail!(
                    "--admin-right, --signed and --local grant; attenuation can only narrow (use --module/--hash for \"only these modules\")"
                );
            }
            if !m.channels.is_empty() {
                bail!("--channel grants: channel grants are issued, not added by attenuation (docs/channels.md)");
            }
            let cur = e.limits.unwrap_or(Limits { memory: u64::MAX, cpu: u64::MAX, state: u64::MAX });
            let hb = |v: u64| human_bytes(v);
            let fuel = |v: u64| format!("{v} fuel");
            let max_memory =
                lower(&mut skipped, "--memory", m.memory.as_deref().map(size).transpose()?, cur.memory, &hb);
            let max_cpu = lower(&mut skipped, "--cpu", m.cpu, cur.cpu, &fuel);
            let max_state = lower(&mut skipped, "--state", m.state.as_deref().map(size).transpose()?, cur.state, &hb);
            let ifaces = match &m.interfaces {
                Some(n) => {
                    let s = interfaces(n)?;
                    if e.interfaces.is_subset(s) {
                        skipped.push(format!("--interface {} (grants no more than that already)", n.join(",")));
                        None
                    } else {
                        Some(s)
                    }
                }
                None => None,
            };
            let hashes = module_hashes(m)?;
            let hashes = (!hashes.is_empty()).then_some(hashes);
            let at = Attenuation { expires, max_memory, max_cpu, max_state, interfaces: ifaces, hashes };
            refuse_empty(at.is_empty(), &skipped)?;
            at.to_block().map_err(|err| anyhow!("{err}"))?
        }
        Kind::Session => {
            let s = &a.session;
            if s.extra {
                bail!("--extra grants slack; attenuation can only narrow (--no-extra takes it away)");
            }
            let c = e.ceilings;
            let hs = |v: u64| human_share(v);
            let hb = |v: u64| human_bytes(v);
            let hr = |v: u64| human_rate(v);
            let n = |v: u64| v.to_string();
            let n32 = |v: Option<u64>| v.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
            let at = SessionAttenuation {
                expires,
                max_vp_share_ppm: lower(
                    &mut skipped,
                    "--vp-share",
                    s.vp_share.as_deref().map(share).transpose()?,
                    c.max_vp_share_ppm,
                    &hs,
                ),
                max_total_share_ppm: lower(
                    &mut skipped,
                    "--total-share",
                    s.total_share.as_deref().map(share).transpose()?,
                    c.max_total_share_ppm,
                    &hs,
                ),
                max_vps: n32(lower(&mut skipped, "--vps", s.vps.map(u64::from), u64::from(c.max_vps), &n)),
                no_extra: if s.no_extra && !c.extra {
                    skipped.push("--no-extra (no slack is allowed already)".into());
                    false
                } else {
                    s.no_extra
                },
                max_heap_bytes: lower(
                    &mut skipped,
                    "--heap",
                    s.heap.as_deref().map(size).transpose()?,
                    c.max_heap_bytes,
                    &hb,
                ),
                max_tx_bytes_per_sec: lower(
                    &mut skipped,
                    "--tx",
                    s.tx.as_deref().map(rate).transpose()?,
                    c.max_tx_bytes_per_sec,
                    &hr,
                ),
                max_rx_bytes_per_sec: lower(
                    &mut skipped,
                    "--rx",
                    s.rx.as_deref().map(rate).transpose()?,
                    c.max_rx_bytes_per_sec,
                    &hr,
                ),
                max_pools: n32(lower(&mut skipped, "--pools", s.pools.map(u64::from), u64::from(c.max_pools), &n)),
                max_queued_events: n32(lower(
                    &mut skipped,
                    "--queued",
                    s.queued.map(u64::from),
                    u64::from(c.max_queued_events),
                    &n,
                )),
            };
            refuse_empty(at.is_empty(), &skipped)?;
            at.to_block().map_err(|err| anyhow!("{err}"))?
        }
        Kind::Monitor => {
            let o = &a.monitor;
            let n = Narrowing {
                filter: monitor_cmd::clauses(&o.proto, &o.net, &o.port)?,
                read: o.read.as_deref().map(monitor_cmd::fields).transpose()?,
                payload: o
                    .payload
                    .as_deref()
                    .map(|p| match p {
                        "none" => Ok(0),
                        n => n.parse::<u32>().with_context(|| format!("--payload {n:?}: none or a number")),
                    })
                    .transpose()?,
                anonymize: monitor_cmd::prefixes(&o.anonymize)?,
                budget: o.budget,
                periodic: o.periodic,
                memory: a.module.memory.as_deref().map(size).transpose()?,
                export: o.export.as_deref().map(monitor_cmd::exports).transpose()?,
                expires,
            };
            refuse_empty(n == Narrowing::default(), &skipped)?;
            policy::narrowing_block(&n)?
        }
    };
    for s in &skipped {
        eprintln!("note: left out {s}: it would not narrow anything");
    }
    let out = p.token.append(block).map_err(|err| anyhow!("appending the block: {err}"))?;
    let bytes = out.to_vec().map_err(|err| anyhow!("{err}"))?;
    write(&a.output, &bytes)?;
    println!("{}: {} credential with {} blocks, {} bytes", a.output.display(), e.kind, out.block_count(), bytes.len());
    Ok(ExitCode::SUCCESS)
}

/// `new` if it is below `cur`; otherwise noted in `skipped`.
fn lower(
    skipped: &mut Vec<String>,
    opt: &str,
    new: Option<u64>,
    cur: u64,
    show: &dyn Fn(u64) -> String,
) -> Option<u64> {
    let v = new?;
    if v < cur {
        Some(v)
    } else {
        skipped.push(format!("{opt} {} (already at most {})", show(v), show(cur)));
        None
    }
}

fn refuse_empty(empty: bool, skipped: &[String]) -> Result<()> {
    if !empty {
        return Ok(());
    }
    if skipped.is_empty() {
        bail!("nothing to narrow: give at least one restriction (see --help)");
    }
    bail!("this attenuation would not narrow anything: {}", skipped.join("; "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(size("16MiB").unwrap(), 16 << 20);
        assert_eq!(size("1.5KiB").unwrap(), 1536);
        assert_eq!(size("10MB").unwrap(), 10_000_000);
        assert_eq!(size("4096").unwrap(), 4096);
        assert!(size("3 parsecs").is_err());
        assert_eq!(rate("1Mbit/s").unwrap(), 125_000);
        assert_eq!(rate("10Mbps").unwrap(), 1_250_000);
        assert_eq!(rate("125kB/s").unwrap(), 125_000);
        assert_eq!(rate("1000").unwrap(), 1000);
        assert_eq!(share("10%").unwrap(), 100_000);
        assert_eq!(share("2.5%").unwrap(), 25_000);
        assert_eq!(share("4ms/40ms").unwrap(), 100_000);
        assert_eq!(share("300us/1ms").unwrap(), 300_000);
        assert_eq!(share("1234ppm").unwrap(), 1234);
        assert!(share("150%").is_err());
        assert!(share("4ms/0ms").is_err());
        assert_eq!(human_share(100_000), "10 % (100000 ppm)");
        assert_eq!(human_rate(125_000), "1 Mbit/s (125000 bytes/s)");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        let t = expiry("2030-01-01T00:00:00Z").unwrap();
        assert_eq!(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_893_456_000);
        assert!(expiry("soon").is_err());
    }
}
