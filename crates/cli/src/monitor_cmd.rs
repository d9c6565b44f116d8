//! `anode monitor`: FLAME's monitor on a capture file or a live interface,
//! monitoring credentials, Crypto-PAn keys and trace anonymization.
//!
//! The library (`anode-monitor`) is sans-I/O; this module owns the files,
//! the clock, the AF_PACKET socket, pacing and the progress line.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufWriter, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anode_cred::{Issuer, PrincipalId, RootKey};
use anode_monitor::apps::abi::{Field, Record};
use anode_monitor::policy::{self, Clause, ExportRights, MonitorSpec, Narrowing, PAYLOAD_ALL, PolicyLimits, Prefix};
use anode_monitor::{
    CaptureReader, CryptoPan, Frame, IpfixEncoder, LinkType, Monitor, MonitorConfig, Output, PcapSink,
};
use anyhow::{Context, Result, anyhow, bail};

/// `anode monitor` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum MonitorCmd {
    /// Run monitoring modules on a capture file (pcap/pcapng) or a live interface.
    Run(RunArgs),
    /// Rewrite the IP addresses of a pcap, or of a list of addresses, with Crypto-PAn.
    Anonymize(AnonArgs),
    /// Generate a Crypto-PAn key file (mode 0600, never overwritten).
    Keygen {
        /// The key file to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// Monitoring credentials: issue, attenuate, show.
    #[command(subcommand)]
    Credential(CredCmd),
}

/// `anode monitor run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A pcap or pcapng file (`-` for stdin), a network interface for live capture, or `node`: the
    /// verified traffic of the running node in --run-dir, through its tap (which its administrator
    /// turns on with `[monitor] enabled = true`); the node runs the modules and writes their records
    /// to its own `[monitor]` exports.
    #[arg(long)]
    source: String,
    /// With --source node: the node's run directory (its control socket).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// With --source node: the name of the (single) module on the node's tap (default: its file stem).
    #[arg(long)]
    name: Option<String>,
    /// A monitoring module (wasm); repeat for several. Each needs its --credential, in the same order.
    #[arg(long = "module", required = true)]
    modules: Vec<PathBuf>,
    /// The monitoring credential of each --module, in order.
    #[arg(long = "credential", required = true)]
    credentials: Vec<PathBuf>,
    /// The administrator's public key (.pub or .key file, or hex) that credentials chain to (not with
    /// --source node, whose own `[monitor] admin_key` decides).
    #[arg(long, required_unless_present = "run_dir")]
    admin_pub: Option<String>,
    /// Export: `json:FILE` (JSON lines, `-` for stdout), `ipfix:FILE`, `ipfix-udp:HOST:PORT`, `pcap:FILE`
    /// (sampled packets). Repeatable.
    #[arg(long = "export")]
    exports: Vec<String>,
    /// Crypto-PAn key file, needed when a credential anonymizes addresses.
    #[arg(long)]
    anon_key: Option<PathBuf>,
    /// Replay pacing: `max` (as fast as possible), `recorded` (the capture's timing) or a speed factor.
    #[arg(long, default_value = "max")]
    speed: String,
    /// Packets per module call (1: one call per packet).
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// CPU budget overruns after which a module is unloaded.
    #[arg(long, default_value_t = 64)]
    unload_after: u32,
    /// Interval of the modules' periodic part, ms (capture time on replay, wall time live).
    #[arg(long, default_value_t = 1000)]
    tick_ms: u64,
    /// Stop after this many frames.
    #[arg(long)]
    count: Option<u64>,
    /// Stop live capture after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Replay the file this many times (benchmarks; timestamps advance by the file's span each time).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
}

/// `anode monitor anonymize`.
#[derive(Debug, clap::Args)]
pub struct AnonArgs {
    /// Crypto-PAn key file (`anode monitor keygen`).
    #[arg(long)]
    key: PathBuf,
    /// A pcap/pcapng file whose IPv4/IPv6 addresses to rewrite (written as pcap).
    #[arg(long, conflicts_with = "addresses")]
    pcap: Option<PathBuf>,
    /// A file with one address per line (`-` for stdin); prints `original anonymized`.
    #[arg(long)]
    addresses: Option<PathBuf>,
    /// Output pcap (with --pcap).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// `anode monitor credential`.
#[derive(Debug, clap::Subcommand)]
pub enum CredCmd {
    /// Issue a monitoring credential with the administrator's secret key.
    Issue {
        /// The administrator's secret key file.
        #[arg(long)]
        admin_key: PathBuf,
        /// The principal it is issued to (hex public key, or a .pub/.key file).
        #[arg(long)]
        principal: String,
        /// Readable fields, comma separated (`all` for every field); see docs/monitor.md.
        #[arg(long, value_delimiter = ',', default_value = "ts")]
        read: Vec<String>,
        /// Payload bytes: `none`, `all` or a number.
        #[arg(long, default_value = "none")]
        payload: String,
        /// Anonymize addresses in these prefixes (`all` for every address).
        #[arg(long, value_delimiter = ',')]
        anonymize: Vec<String>,
        /// Only packets of these IP protocols.
        #[arg(long, value_delimiter = ',')]
        proto: Vec<u8>,
        /// Only packets with source or destination in these prefixes.
        #[arg(long, value_delimiter = ',')]
        net: Vec<String>,
        /// Only packets with one of these TCP/UDP ports.
        #[arg(long, value_delimiter = ',')]
        port: Vec<u16>,
        /// Fuel per packet.
        #[arg(long, default_value_t = 20_000)]
        budget: u64,
        /// Fuel per periodic call.
        #[arg(long, default_value_t = 5_000_000)]
        periodic: u64,
        /// Memory, bytes.
        #[arg(long, default_value_t = 8 << 20)]
        memory: u64,
        /// Export rights: `records`, `packets` (comma separated), or `none`.
        #[arg(long, value_delimiter = ',', default_value = "records")]
        export: Vec<String>,
        /// Validity, e.g. `3600s`, `90m`, `12h`, `7d`.
        #[arg(long)]
        expires_in: Option<String>,
        /// An administrative monitoring credential (sees everything).
        #[arg(long)]
        admin: bool,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Narrow a credential (anyone holding it can; nobody can widen it).
    Attenuate {
        /// The credential.
        #[arg(long)]
        credential: PathBuf,
        /// Only these fields.
        #[arg(long, value_delimiter = ',')]
        read: Option<Vec<String>>,
        /// At most this many payload bytes.
        #[arg(long)]
        payload: Option<u32>,
        /// Anonymize these prefixes too.
        #[arg(long, value_delimiter = ',')]
        anonymize: Vec<String>,
        /// Only these protocols (an extra filter clause).
        #[arg(long, value_delimiter = ',')]
        proto: Vec<u8>,
        /// Only these prefixes (an extra filter clause).
        #[arg(long, value_delimiter = ',')]
        net: Vec<String>,
        /// Only these ports (an extra filter clause).
        #[arg(long, value_delimiter = ',')]
        port: Vec<u16>,
        /// Lower fuel per packet.
        #[arg(long)]
        budget: Option<u64>,
        /// Only these exports (`records`, `packets`, `none`).
        #[arg(long, value_delimiter = ',')]
        export: Option<Vec<String>>,
        /// Expire sooner.
        #[arg(long)]
        expires_in: Option<String>,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Verify a credential and print the policy it grants now.
    Show {
        /// The credential.
        #[arg(long)]
        credential: PathBuf,
        /// The administrator's public key.
        #[arg(long)]
        admin_pub: String,
    },
}

/// Runs `anode monitor`.
pub fn run(c: MonitorCmd) -> Result<ExitCode> {
    match c {
        MonitorCmd::Run(a) => run_monitor(a),
        MonitorCmd::Anonymize(a) => anonymize(a),
        MonitorCmd::Keygen { out } => keygen(&out),
        MonitorCmd::Credential(c) => credential(c),
    }
}

pub(crate) fn root_key(s: &str) -> Result<RootKey> {
    let p = Path::new(s);
    let pk = if p.exists() { crate::keys_cmd::public_of(p)? } else { anode_sec::PublicKey::parse(s)? };
    anode_cred::root_key_from_ed25519(pk.as_bytes()).map_err(|e| anyhow!("{e}"))
}

pub(crate) fn principal(s: &str) -> Result<PrincipalId> {
    let p = Path::new(s);
    let pk = if p.exists() { crate::keys_cmd::public_of(p)? } else { anode_sec::PublicKey::parse(s)? };
    Ok(PrincipalId(*pk.as_bytes()))
}

fn load_anon_key(path: &Path) -> Result<CryptoPan> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "{}: a Crypto-PAn key must not be readable by group or others (chmod 600 {})",
                path.display(),
                path.display()
            );
        }
    }
    let text =
        zeroize::Zeroizing::new(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?);
    CryptoPan::from_key_text(&text).with_context(|| path.display().to_string())
}

fn keygen(out: &Path) -> Result<ExitCode> {
    let mut key = zeroize::Zeroizing::new([0u8; 32]);
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut key[..])).context("reading /dev/urandom")?;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(out).with_context(|| format!("creating {} (never overwritten)", out.display()))?;
    f.write_all(CryptoPan::key_text(&key).as_bytes())?;
    println!("Crypto-PAn key {} (key id {})", out.display(), CryptoPan::new(&key).key_id_hex());
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn duration(s: &str) -> Result<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().with_context(|| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => bail!("bad duration unit in {s:?}: use s, m, h or d"),
    };
    Ok(Duration::from_secs(secs))
}

pub(crate) fn fields(names: &[String]) -> Result<Vec<Field>> {
    if names.iter().any(|n| n == "all") {
        return Ok(Field::ALL.to_vec());
    }
    names
        .iter()
        .filter(|n| !n.is_empty())
        .map(|n| {
            Field::from_name(n).ok_or_else(|| {
                let all: Vec<&str> = Field::ALL.iter().map(|f| f.name()).collect();
                anyhow!("unknown field {n:?}; fields: {}", all.join(", "))
            })
        })
        .collect()
}

pub(crate) fn prefixes(v: &[String]) -> Result<Vec<Prefix>> {
    let mut out = Vec::new();
    for s in v {
        if s == "all" {
            out.extend([Prefix::ALL_V4, Prefix::ALL_V6]);
        } else {
            out.push(Prefix::parse(s).ok_or_else(|| anyhow!("bad prefix {s:?} (a.b.c.d/n or x::/n)"))?);
        }
    }
    Ok(out)
}

pub(crate) fn exports(v: &[String]) -> Result<ExportRights> {
    let mut e = ExportRights::default();
    for x in v {
        match x.as_str() {
            "records" => e.records = true,
            "packets" => e.packets = true,
            "none" | "" => {}
            other => bail!("unknown export right {other:?}: records, packets or none"),
        }
    }
    Ok(e)
}

pub(crate) fn clauses(proto: &[u8], net: &[String], port: &[u16]) -> Result<Vec<Clause>> {
    let mut c = Vec::new();
    if !proto.is_empty() {
        c.push(Clause::Proto(proto.to_vec()));
    }
    if !net.is_empty() {
        c.push(Clause::Net(prefixes(net)?));
    }
    if !port.is_empty() {
        c.push(Clause::Port(port.to_vec()));
    }
    Ok(c)
}

fn credential(c: CredCmd) -> Result<ExitCode> {
    match c {
        CredCmd::Issue {
            admin_key,
            principal: who,
            read,
            payload,
            anonymize,
            proto,
            net,
            port,
            budget,
            periodic,
            memory,
            export,
            expires_in,
            admin,
            output,
        } => {
            let admin_id = anode_sec::Identity::load(&admin_key)?;
            let issuer = Issuer::from_secret(&admin_id.secret_seed()).map_err(|e| anyhow!("{e}"))?;
            let payload = match payload.as_str() {
                "none" => 0,
                "all" => PAYLOAD_ALL,
                n => n.parse().with_context(|| format!("--payload {n:?}: none, all or a number"))?,
            };
            let spec = MonitorSpec {
                filter: clauses(&proto, &net, &port)?,
                read: fields(&read)?,
                payload,
                anonymize: prefixes(&anonymize)?,
                limits: Some(PolicyLimits { budget, periodic, memory }),
                export: exports(&export)?,
                expires: expires_in.map(|d| duration(&d).map(|d| SystemTime::now() + d)).transpose()?,
                admin,
            };
            let cred = policy::issue(&issuer, principal(&who)?, &spec)?;
            std::fs::write(&output, cred.to_bytes()).with_context(|| format!("writing {}", output.display()))?;
            println!("{}: {} bytes", output.display(), cred.to_bytes().len());
        }
        CredCmd::Attenuate {
            credential,
            read,
            payload,
            anonymize,
            proto,
            net,
            port,
            budget,
            export,
            expires_in,
            output,
        } => {
            let bytes = std::fs::read(&credential).with_context(|| format!("reading {}", credential.display()))?;
            // Attenuation needs no key: parse the token without verifying its root.
            let token =
                biscuit_auth::UnverifiedBiscuit::from(&bytes).map_err(|e| anyhow!("{}: {e}", credential.display()))?;
            let n = Narrowing {
                filter: clauses(&proto, &net, &port)?,
                read: read.map(|r| fields(&r)).transpose()?,
                payload,
                anonymize: prefixes(&anonymize)?,
                budget,
                export: export.map(|e| exports(&e)).transpose()?,
                expires: expires_in.map(|d| duration(&d).map(|d| SystemTime::now() + d)).transpose()?,
                ..Narrowing::default()
            };
            let out = attenuate_unverified(token, &n)?;
            std::fs::write(&output, &out).with_context(|| format!("writing {}", output.display()))?;
            println!("{}: {} bytes", output.display(), out.len());
        }
        CredCmd::Show { credential, admin_pub } => {
            let bytes = std::fs::read(&credential).with_context(|| format!("reading {}", credential.display()))?;
            let v = anode_monitor::PolicyVerifier::new(root_key(&admin_pub)?);
            let p = v.authorize(SystemTime::now(), &bytes)?;
            println!("principal {}", p.principal.to_hex());
            println!("admin     {}", p.admin);
            let f: Vec<&str> = Field::ALL.iter().filter(|f| p.reads(**f)).map(|f| f.name()).collect();
            println!("read      {}", f.join(", "));
            println!("payload   {}", if p.payload == PAYLOAD_ALL { "all".to_string() } else { p.payload.to_string() });
            let a: Vec<String> = p.anonymize.iter().map(|x| x.to_string()).collect();
            println!("anonymize {}", if a.is_empty() { "none".to_string() } else { a.join(", ") });
            println!("filter    {:?}", p.filter.clauses);
            println!(
                "limits    budget {} fuel/packet, periodic {} fuel, memory {} bytes",
                p.limits.budget, p.limits.periodic, p.limits.memory
            );
            println!("export    records {}, packets {}", p.export.records, p.export.packets);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Appends a narrowing block to a token whose root is not checked here
/// (the monitor checks it at load).
fn attenuate_unverified(token: biscuit_auth::UnverifiedBiscuit, n: &Narrowing) -> Result<Vec<u8>> {
    let block = policy::narrowing_block(n)?;
    let t = token.append(block).map_err(|e| anyhow!("{e}"))?;
    t.to_vec().map_err(|e| anyhow!("{e}"))
}

// ---------------------------------------------------------------- run

enum Export {
    Json(Box<dyn Write>),
    Ipfix(Box<dyn Write>),
    IpfixUdp(UdpSocket, SocketAddr),
    Pcap(PcapSink<BufWriter<File>>),
}

fn open_exports(specs: &[String]) -> Result<Vec<Export>> {
    let mut v = Vec::new();
    for s in specs {
        let (kind, arg) = s.split_once(':').ok_or_else(|| anyhow!("--export {s:?}: expected KIND:TARGET"))?;
        let file = |a: &str| -> Result<Box<dyn Write>> {
            if a == "-" {
                Ok(Box::new(BufWriter::new(std::io::stdout())))
            } else {
                Ok(Box::new(BufWriter::new(File::create(a).with_context(|| format!("creating {a}"))?)))
            }
        };
        v.push(match kind {
            "json" => Export::Json(file(arg)?),
            "ipfix" => Export::Ipfix(file(arg)?),
            "ipfix-udp" => {
                let to: SocketAddr =
                    arg.parse().with_context(|| format!("--export ipfix-udp:{arg}: expected HOST:PORT"))?;
                let sock = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
                Export::IpfixUdp(sock, to)
            }
            "pcap" => Export::Pcap(PcapSink::new(
                BufWriter::new(File::create(arg).with_context(|| format!("creating {arg}"))?),
                LinkType::Raw,
            )?),
            other => bail!("--export {other}: json, ipfix, ipfix-udp or pcap"),
        });
    }
    Ok(v)
}

struct Exporter {
    sinks: Vec<Export>,
    ipfix: IpfixEncoder,
    pending: BTreeMap<u32, Vec<Vec<u8>>>,
    names: BTreeMap<u32, String>,
}

impl Exporter {
    fn write(&mut self, outs: &mut Vec<Output>) -> Result<()> {
        for o in outs.drain(..) {
            match o {
                Output::Record { module, name, bytes } => {
                    let Ok(r) = Record::parse(&bytes) else { continue };
                    for s in &mut self.sinks {
                        if let Export::Json(w) = s {
                            writeln!(w, "{}", anode_monitor::json_line(&name, module.0, &r))?;
                        }
                    }
                    self.names.entry(module.0).or_insert_with(|| name.to_string());
                    self.pending.entry(module.0).or_default().push(bytes);
                }
                Output::Sample { ts_ns, wire_len, data, .. } => {
                    for s in &mut self.sinks {
                        if let Export::Pcap(p) = s {
                            p.write(ts_ns, wire_len, &data)?;
                        }
                    }
                }
                Output::Unloaded { module, name, reason } => {
                    eprintln!("anode: module {module} ({name}) unloaded: {reason}")
                }
            }
        }
        Ok(())
    }

    fn flush_ipfix(&mut self) -> Result<()> {
        let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as u32).unwrap_or(0);
        let has_ipfix = self.sinks.iter().any(|s| matches!(s, Export::Ipfix(_) | Export::IpfixUdp(..)));
        for (domain, recs) in std::mem::take(&mut self.pending) {
            if !has_ipfix {
                continue;
            }
            let parsed: Vec<Record<'_>> = recs.iter().filter_map(|r| Record::parse(r).ok()).collect();
            // One message per 64 records keeps UDP datagrams under the usual MTU-sized limits.
            for chunk in parsed.chunks(32) {
                let mut buf = Vec::new();
                self.ipfix.encode(domain, secs, chunk, &mut buf);
                for s in &mut self.sinks {
                    match s {
                        Export::Ipfix(w) => w.write_all(&buf)?,
                        Export::IpfixUdp(sock, to) => {
                            sock.send_to(&buf, *to)?;
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.flush_ipfix()?;
        for s in self.sinks {
            match s {
                Export::Json(mut w) | Export::Ipfix(mut w) => w.flush()?,
                Export::Pcap(p) => p.into_inner().flush()?,
                Export::IpfixUdp(..) => {}
            }
        }
        Ok(())
    }
}

struct Progress {
    quiet: bool,
    start: Instant,
    last: Instant,
    last_frames: u64,
}

impl Progress {
    fn show(&mut self, m: &Monitor, force: bool) {
        if self.quiet || (!force && self.last.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let c = m.counters();
        let skipped: u64 = c.skipped.values().sum();
        let lost: u64 = m.modules().iter().map(|i| i.counters.packets_lost).sum();
        let dt = self.last.elapsed().as_secs_f64().max(1e-9);
        let rate = (c.frames - self.last_frames) as f64 / dt;
        eprint!(
            "\r{} packets  {:>10.0} pps  skipped {}  dropped by modules {}  elapsed {:.1} s   ",
            c.frames,
            rate,
            skipped,
            lost,
            self.start.elapsed().as_secs_f64()
        );
        if force {
            eprintln!();
        }
        self.last = Instant::now();
        self.last_frames = c.frames;
    }
}

/// The `monitor` section of `anode status` as text.
pub(crate) fn render_tap(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let Some(m) = v.get("monitor") else { return s };
    if m["enabled"].as_bool() != Some(true) {
        s.push_str("\nmonitor tap: off\n");
        return s;
    }
    let t = &m["tap"];
    let _ = writeln!(
        s,
        "\nmonitor tap: on, interfaces {}  queued {}  monitored {}  queue full {}  other interfaces {}  ticks {}  outputs dropped {}",
        m["interfaces"],
        t["queued"],
        t["monitored"],
        t["queue_full"],
        t["other_interface"],
        t["ticks"],
        t["outputs_dropped"]
    );
    for x in m["modules"].as_array().into_iter().flatten() {
        let c = &x["counters"];
        let _ = writeln!(
            s,
            "  {} {:<16} packets {}  records {}  samples {}  overruns {}  traps {}{}",
            x["id"].as_str().unwrap_or("?"),
            x["name"].as_str().unwrap_or("?"),
            c["packets"],
            c["records"],
            c["samples"],
            c["overruns"],
            c["traps"],
            x["unloaded"].as_str().map_or(String::new(), |r| format!("  UNLOADED: {r}"))
        );
    }
    s
}

fn run_monitor(a: RunArgs) -> Result<ExitCode> {
    if a.source == "node" {
        return run_on_node(&a);
    }
    if a.run_dir.is_some() || a.name.is_some() {
        bail!("--run-dir and --name go with --source node");
    }
    let Some(admin_pub) = a.admin_pub.as_deref() else { bail!("--admin-pub is needed to decide the credentials") };
    if a.modules.len() != a.credentials.len() {
        bail!(
            "{} --module but {} --credential: give one credential per module, in order",
            a.modules.len(),
            a.credentials.len()
        );
    }
    let key = a.anon_key.as_deref().map(load_anon_key).transpose()?;
    if let Some(k) = &key {
        eprintln!("anonymizing with Crypto-PAn key id {}", k.key_id_hex());
    }
    let cfg = MonitorConfig { batch: a.batch.max(1), unload_after: a.unload_after, ..MonitorConfig::default() };
    let mut m = Monitor::new(root_key(admin_pub)?, cfg, key)?;
    for (path, cred) in a.modules.iter().zip(&a.credentials) {
        let code = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let c = std::fs::read(cred).with_context(|| format!("reading {}", cred.display()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let id = m.load(SystemTime::now(), &name, &code, &c).with_context(|| format!("loading {}", path.display()))?;
        eprintln!("loaded {} as {id}", path.display());
    }
    let mut ex = Exporter {
        sinks: open_exports(&a.exports)?,
        ipfix: IpfixEncoder::new(),
        pending: BTreeMap::new(),
        names: BTreeMap::new(),
    };
    let mut prog = Progress { quiet: a.quiet, start: Instant::now(), last: Instant::now(), last_frames: 0 };
    let live =
        !Path::new(&a.source).exists() && a.source != "-" && Path::new("/sys/class/net").join(&a.source).exists();
    if live {
        live_capture(&a, &mut m, &mut ex, &mut prog)?;
    } else {
        replay(&a, &mut m, &mut ex, &mut prog)?;
    }
    prog.show(&m, true);
    ex.finish()?;
    summary(&m);
    Ok(ExitCode::SUCCESS)
}

fn replay(a: &RunArgs, m: &mut Monitor, ex: &mut Exporter, prog: &mut Progress) -> Result<()> {
    let speed: Option<f64> = match a.speed.as_str() {
        "max" => None,
        "recorded" => Some(1.0),
        s => Some(
            s.parse::<f64>()
                .ok()
                .filter(|x| *x > 0.0)
                .ok_or_else(|| anyhow!("--speed {s:?}: max, recorded or a factor > 0"))?,
        ),
    };
    let tick = a.tick_ms.max(1) * 1_000_000;
    let mut out = Vec::new();
    let mut frames = 0u64;
    let (mut first_ts, mut last_ts) = (None::<u64>, 0u64);
    let mut next_tick = 0u64;
    let wall0 = Instant::now();
    let mut offset = 0u64;
    'outer: for round in 0..a.repeat.max(1) {
        let src: Box<dyn Read> = if a.source == "-" {
            if round > 0 {
                break;
            }
            Box::new(std::io::stdin())
        } else {
            Box::new(File::open(&a.source).with_context(|| format!("opening {}", a.source))?)
        };
        let mut r =
            CaptureReader::new(std::io::BufReader::with_capacity(1 << 20, src)).with_context(|| a.source.clone())?;
        let mut span_end = 0;
        while let Some(f) = r.next_frame().with_context(|| format!("{} after {frames} frames", a.source))? {
            let ts = f.ts_ns + offset;
            let t0 = *first_ts.get_or_insert(ts);
            if next_tick == 0 {
                next_tick = ts + tick;
            }
            if let Some(s) = speed {
                let due = Duration::from_nanos(((ts - t0) as f64 / s) as u64);
                if let Some(wait) = due.checked_sub(wall0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let f = Frame { ts_ns: ts, ..f };
            m.handle_frame(&f, &mut out);
            while ts >= next_tick {
                m.periodic(next_tick, &mut out);
                next_tick += tick;
            }
            if !out.is_empty() {
                ex.write(&mut out)?;
            }
            last_ts = ts;
            span_end = ts;
            frames += 1;
            if frames & 0xfff == 0 {
                prog.show(m, false);
                ex.flush_ipfix()?;
            }
            if a.count.is_some_and(|c| frames >= c) {
                break 'outer;
            }
        }
        offset = span_end.saturating_sub(first_ts.unwrap_or(0)) + 1_000_000;
    }
    m.periodic(last_ts, &mut out);
    ex.write(&mut out)?;
    Ok(())
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn live_capture(a: &RunArgs, m: &mut Monitor, ex: &mut Exporter, prog: &mut Progress) -> Result<()> {
    use nix::sys::socket::{
        AddressFamily, LinkAddr, SockFlag, SockProtocol, SockType, recvfrom, setsockopt, socket, sockopt,
    };
    let ifindex =
        nix::net::if_::if_nametoindex(a.source.as_str()).with_context(|| format!("interface {}", a.source))?;
    let fd = socket(AddressFamily::Packet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::EthAll)
        .context("opening an AF_PACKET socket (needs root or CAP_NET_RAW)")?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &nix::sys::time::TimeVal::new(0, 100_000))?;
    let _ = setsockopt(&fd, sockopt::RcvBuf, &(8 << 20));
    eprintln!("capturing on {} (ifindex {ifindex}); Ctrl-C or --duration/--count to stop", a.source);
    let tick = a.tick_ms.max(1) * 1_000_000;
    let deadline = a.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
    let mut buf = vec![0u8; 65_536 + 64];
    let mut out = Vec::new();
    let mut next_tick = now_ns() + tick;
    let mut frames = 0u64;
    use std::os::fd::AsRawFd;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || a.count.is_some_and(|c| frames >= c) {
            break;
        }
        match recvfrom::<LinkAddr>(fd.as_raw_fd(), &mut buf) {
            Ok((n, Some(addr))) if addr.ifindex() == ifindex as usize => {
                let f = Frame {
                    ts_ns: now_ns(),
                    wire_len: n as u32,
                    iface: 0,
                    link: LinkType::Ethernet,
                    data: &buf[..n.min(buf.len())],
                };
                m.handle_frame(&f, &mut out);
                frames += 1;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(anyhow!("capture on {}: {e}", a.source)),
        }
        let now = now_ns();
        if now >= next_tick {
            m.periodic(now, &mut out);
            next_tick = now + tick;
            ex.flush_ipfix()?;
        }
        if !out.is_empty() {
            ex.write(&mut out)?;
        }
        prog.show(m, false);
    }
    m.periodic(now_ns(), &mut out);
    ex.write(&mut out)?;
    Ok(())
}

fn summary(m: &Monitor) {
    let c = m.counters();
    let skipped: Vec<String> = c.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!(
        "frames {}  ip packets {}  skipped: {}",
        c.frames,
        c.packets,
        if skipped.is_empty() { "none".into() } else { skipped.join(", ") }
    );
    if let Some((h, miss)) = m.anonymizer_stats() {
        eprintln!("Crypto-PAn cache: {h} hits, {miss} misses");
    }
    for i in m.modules() {
        let k = i.counters;
        eprintln!(
            "{} {}: packets {} (filtered {}), calls {}, fuel {}, overruns {}, lost {}, traps {}, memory {}, records {} (denied {}), samples {} (denied {}){}",
            i.id,
            i.name,
            k.packets,
            k.filtered,
            k.calls,
            k.fuel,
            k.overruns,
            k.packets_lost,
            k.traps,
            k.memory,
            k.records,
            k.records_denied,
            k.samples,
            k.samples_denied,
            i.unloaded.map(|r| format!(" — UNLOADED: {r}")).unwrap_or_default()
        );
    }
}

// ---------------------------------------------------------------- anonymize

fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn anonymize(a: AnonArgs) -> Result<ExitCode> {
    let mut anon = anode_monitor::Anonymizer::new(load_anon_key(&a.key)?);
    if let Some(list) = a.addresses {
        let input: Box<dyn BufRead> = if list.as_os_str() == "-" {
            Box::new(std::io::BufReader::new(std::io::stdin()))
        } else {
            Box::new(std::io::BufReader::new(File::open(&list).with_context(|| format!("opening {}", list.display()))?))
        };
        for line in input.lines() {
            let line = line?;
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            match t.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V4(v)) => println!("{t} {}", std::net::Ipv4Addr::from(anon.v4(v.into()))),
                Ok(std::net::IpAddr::V6(v)) => println!("{t} {}", std::net::Ipv6Addr::from(anon.v6(v.into()))),
                Err(_) => bail!("not an address: {t:?}"),
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(input) = a.pcap else { bail!("give --pcap FILE -o OUT or --addresses FILE") };
    let Some(output) = a.output else { bail!("--pcap needs -o OUT") };
    let mut r = CaptureReader::new(std::io::BufReader::new(
        File::open(&input).with_context(|| format!("opening {}", input.display()))?,
    ))?;
    let mut sink: Option<PcapSink<BufWriter<File>>> = None;
    let (mut n, mut rewritten) = (0u64, 0u64);
    let mut buf = Vec::new();
    while let Some(f) = r.next_frame()? {
        if sink.is_none() {
            let file = File::create(&output).with_context(|| format!("creating {}", output.display()))?;
            sink = Some(PcapSink::new(BufWriter::new(file), f.link)?);
        }
        let Some(s) = sink.as_mut() else { continue };
        buf.clear();
        buf.extend_from_slice(f.data);
        if let Ok(p) = anode_monitor::parse::parse(&f) {
            let (ip, al) = (p.ip_off, p.addr_len());
            let (so, dof) = if p.version == 4 { (12, 16) } else { (8, 24) };
            if let (Some(sa), Some(_)) =
                (buf.get(ip + so..ip + so + al).map(|x| x.to_vec()), buf.get(ip + dof..ip + dof + al))
            {
                let mut s2 = sa;
                anon.bytes(&mut s2);
                buf[ip + so..ip + so + al].copy_from_slice(&s2);
                let mut d2 = buf[ip + dof..ip + dof + al].to_vec();
                anon.bytes(&mut d2);
                buf[ip + dof..ip + dof + al].copy_from_slice(&d2);
                if p.version == 4 && buf.len() >= ip + p.ip_hdr_len.min(60) {
                    buf[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
                    let c = ip_checksum(&buf[ip..ip + (p.ip_hdr_len.min(60))]);
                    buf[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
                }
                // TCP/UDP checksums cover the addresses: zero them (UDP: "no checksum").
                let l4 = p.l4_off;
                match p.l4 {
                    anode_monitor::parse::L4::Tcp { .. } => {
                        if let Some(c) = buf.get_mut(l4 + 16..l4 + 18) {
                            c.fill(0);
                        }
                    }
                    anode_monitor::parse::L4::Udp { .. } => {
                        if let Some(c) = buf.get_mut(l4 + 6..l4 + 8) {
                            c.fill(0);
                        }
                    }
                    anode_monitor::parse::L4::None => {}
                }
                rewritten += 1;
            }
        }
        s.write(f.ts_ns, f.wire_len, &buf)?;
        n += 1;
    }
    if let Some(s) = sink {
        s.into_inner().flush()?;
    }
    eprintln!(
        "{n} frames, {rewritten} with addresses rewritten (key id {}) -> {}",
        anon.key_id_hex(),
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// One control request to the node in `run_dir`, its answer line.
fn node_control(run_dir: &Path, req: &str) -> Result<String> {
    anode_daemon::query(run_dir, req, Duration::from_secs(10)).with_context(|| {
        format!("no node answers on {} (is it running?)", run_dir.join(anode_daemon::CONTROL_SOCKET).display())
    })
}

/// `anode monitor run --source node`: loads the modules into the running
/// node's tap over its control socket, prints their counters every second
/// until --duration is over or Ctrl-C, then unloads them. The node runs
/// them on its verified traffic and writes their records to its own
/// `[monitor]` exports.
fn run_on_node(a: &RunArgs) -> Result<ExitCode> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let Some(run_dir) = a.run_dir.as_deref() else {
        bail!("--source node needs --run-dir DIR (the node's run directory)")
    };
    if !a.exports.is_empty() || a.anon_key.is_some() || a.admin_pub.is_some() {
        bail!(
            "with --source node the node decides credentials with its own [monitor] admin_key, anonymizes with its \
             anon_key and writes records to its [monitor] json/ipfix/pcap files: drop --export, --anon-key and --admin-pub"
        );
    }
    if a.modules.len() != a.credentials.len() {
        bail!(
            "{} --module but {} --credential: give one credential per module, in order",
            a.modules.len(),
            a.credentials.len()
        );
    }
    if a.name.is_some() && a.modules.len() != 1 {
        bail!("--name names a single --module");
    }
    let mut names = Vec::new();
    for (m, c) in a.modules.iter().zip(&a.credentials) {
        let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
        let (m, c) = (abs(m)?, abs(c)?);
        let name = match &a.name {
            Some(n) => n.clone(),
            None => m.file_stem().and_then(|s| s.to_str()).unwrap_or("module").to_string(),
        };
        let (ms, cs) = (m.to_string_lossy(), c.to_string_lossy());
        if ms.contains(char::is_whitespace) || cs.contains(char::is_whitespace) {
            bail!("{ms} or {cs}: the node's control socket takes paths without spaces");
        }
        let answer = node_control(run_dir, &format!("monitor-load {name} {ms} {cs}"))?;
        if let Some(e) = answer.strip_prefix("error: ") {
            for n in &names {
                let _ = node_control(run_dir, &format!("monitor-unload {n}"));
            }
            bail!("{}: the node refused {name}: {}", run_dir.display(), e.trim());
        }
        eprint!("{answer}");
        names.push(name);
    }
    let status = node_control(run_dir, "status")?;
    let v: serde_json::Value = serde_json::from_str(&status).context("the node's status is not JSON")?;
    eprintln!("records go to the node's {}", v["monitor"]["files"]);
    eprintln!("Ctrl-C or --duration to stop (the modules are unloaded then)");
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    let signals = mask.thread_block().ok().and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK).ok());
    let start = Instant::now();
    let end = a.duration.map(|d| start + Duration::from_secs_f64(d.max(0.0)));
    let mut last = String::new();
    loop {
        std::thread::sleep(
            Duration::from_millis(200).min(end.map_or(Duration::MAX, |e| e.saturating_duration_since(Instant::now()))),
        );
        let stop = end.is_some_and(|e| Instant::now() >= e)
            || signals.as_ref().is_some_and(|s| matches!(s.read_signal(), Ok(Some(_))));
        if let Ok(st) = node_control(run_dir, "status")
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&st)
        {
            let mods = v["monitor"]["modules"].as_array().cloned().unwrap_or_default();
            let line: Vec<String> = mods
                .iter()
                .filter(|m| m["name"].as_str().is_some_and(|n| names.iter().any(|x| x == n)) && m["unloaded"].is_null())
                .map(|m| {
                    let c = &m["counters"];
                    format!(
                        "{} {}: {} packets, {} records, {} overruns",
                        m["name"].as_str().unwrap_or("?"),
                        m["id"].as_str().unwrap_or("?"),
                        c["packets"],
                        c["records"],
                        c["overruns"]
                    )
                })
                .collect();
            let line = line.join("; ");
            if !a.quiet && (line != last || stop) {
                eprintln!("{:>6.1} s  {line}", start.elapsed().as_secs_f64());
                last = line;
            }
        }
        if stop {
            break;
        }
    }
    for n in &names {
        let answer = node_control(run_dir, &format!("monitor-unload {n}"))?;
        eprint!("{answer}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_checksum() {
        assert_eq!(duration("90m").ok(), Some(Duration::from_secs(5400)));
        assert_eq!(duration("2d").ok(), Some(Duration::from_secs(172_800)));
        assert!(duration("5y").is_err());
        // RFC 1071 example header.
        let h = [0x45, 0, 0, 0x73, 0, 0, 0x40, 0, 0x40, 0x11, 0, 0, 0xc0, 0xa8, 0, 1, 0xc0, 0xa8, 0, 0xc7];
        assert_eq!(ip_checksum(&h), 0xb861);
    }
}
