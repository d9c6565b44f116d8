//! `anode boot`: the verified boot chain (AEGIS with TUF metadata; see
//! docs/boot.md). `keygen` and `sign` are the operator's side; `verify`
//! runs the node's side and prints the chain layer by layer.

use anode_boot::boot::{BootEvent, BootParams, Policy, SNAPSHOT, Source, TARGETS, TIMESTAMP, boot_with_events};
use anode_boot::fsio::{BootConfig, FsIo, MirrorSource, SETTINGS, normalize, read_bounded, write_atomic};
use anode_boot::sign::{self, RoleKeys, RootSpec, Targets};
use anode_boot::verify::sha256_hex;
use anode_boot::{ComponentName, Layer, Limits};
use anode_sec::Identity;
use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

const DAY: u64 = 86_400;

/// `anode boot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BootCmd {
    /// Generate the operator's role keys: KEYS/root-N.key, targets-N.key,
    /// snapshot.key, timestamp.key (and .pub). Keep root and targets keys
    /// offline.
    Keygen {
        /// Directory to write into (created with mode 0700).
        #[arg(long)]
        out: PathBuf,
        /// Number of root keys.
        #[arg(long, default_value_t = 1)]
        root_keys: u8,
        /// Number of targets keys.
        #[arg(long, default_value_t = 1)]
        targets_keys: u8,
    },
    /// Sign a node's components into a repository: TUF root (created once),
    /// targets, snapshot and timestamp metadata, with every other node's
    /// components kept. Components: the binary, the config and its topology,
    /// the key file and credentials, the modules it loads at start.
    Sign(SignArgs),
    /// Verify a node's boot chain layer by layer, as the node does at start,
    /// and print each verdict. Exit status 0 if the node would start.
    Verify(VerifyArgs),
}

/// Arguments of `anode boot sign`.
#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The operator's role keys (from `anode boot keygen`).
    #[arg(long)]
    pub keys: PathBuf,
    /// The repository: REPO/metadata/*.json and REPO/targets/<node>/<layer>/<file>.
    #[arg(long)]
    pub repo: PathBuf,
    /// The node's name in the metadata.
    #[arg(long)]
    pub node: String,
    /// The node's configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// The node's base directory: component names are relative to it, and
    /// every component must lie under it (default: the config's directory).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The node binary (default: this executable).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Monitoring or pod modules the node loads at start (relative to the base).
    #[arg(long)]
    pub monitor: Vec<PathBuf>,
    /// Days until targets and snapshot expire.
    #[arg(long, default_value_t = 30)]
    pub expires_days: u64,
    /// Days until timestamp expires (re-sign before then).
    #[arg(long, default_value_t = 7)]
    pub timestamp_days: u64,
    /// Root signatures required (when the root is created; default: a majority of the root keys).
    #[arg(long)]
    pub root_threshold: Option<u32>,
    /// Targets signatures required (when the root is created; default: a majority).
    #[arg(long)]
    pub targets_threshold: Option<u32>,
    /// Also install the metadata into this boot directory (the root only if
    /// it has none) and write its boot.toml if missing.
    #[arg(long)]
    pub install: Option<PathBuf>,
    /// Policy written into a new boot.toml: refuse, recover or degraded.
    #[arg(long, default_value = "recover", value_parser = ["refuse", "recover", "degraded"])]
    pub policy: String,
}

/// Arguments of `anode boot verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The node's boot directory (boot.toml, root.json, …).
    #[arg(long)]
    pub boot: PathBuf,
    /// The node's configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// The node's base directory, as given to `sign` (default: the config's directory).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Policy instead of boot.toml's: refuse, recover or degraded.
    #[arg(long, value_parser = ["refuse", "recover", "degraded"])]
    pub policy: Option<String>,
    /// Store recovered copies and record the state, as the node does
    /// (without it, verify changes nothing on disk).
    #[arg(long)]
    pub repair: bool,
    /// Verify at this time (Unix seconds) instead of now.
    #[arg(long)]
    pub at: Option<u64>,
    /// Also recover from this peer node (its UDP endpoint), which serves a
    /// repository over an SA (`anode node --recovery-repo`); repeatable,
    /// tried after the mirrors.
    #[arg(long, value_name = "ADDR", requires = "peer_as")]
    pub peer: Vec<std::net::SocketAddr>,
    /// The secret key to open the SA with a peer as (a key the peer knows).
    #[arg(long, value_name = "KEY")]
    pub peer_as: Option<PathBuf>,
    /// The peer's public key (hex, or a .pub/.key file): the handshake
    /// fails unless the peer proves it.
    #[arg(long, value_name = "KEY")]
    pub peer_key: Option<String>,
    /// Do not use boot.toml's mirrors (recover from --peer only).
    #[arg(long)]
    pub no_mirrors: bool,
}

/// The boot of `anode node --boot DIR --config CONFIG`: boot.toml's mirrors,
/// then its `peers` (UDP endpoints of nodes serving recovery over an SA,
/// opened as `recovery_key`). `commit`: store recovered copies and record
/// the state.
pub fn boot_at_start(dir: &Path, config: &Path, commit: bool) -> Result<anode_boot::fsio::NodeBoot> {
    let base = config.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let nb = anode_boot::fsio::boot_node_with(dir, base, SystemTime::now(), commit, |cfg| {
        if cfg.peers.is_empty() {
            return Ok(Vec::new());
        }
        let key = cfg.recovery_key.as_ref().ok_or("peers need a recovery_key (a key the peers list as a user)")?;
        let wait = Duration::from_millis(cfg.request_timeout_ms);
        cfg.peers
            .iter()
            .map(|p| {
                let addr: std::net::SocketAddr =
                    p.parse().map_err(|_| format!("peers: {p:?} is not a UDP endpoint (host:port)"))?;
                let who = Identity::load(&dir.join(key)).map_err(|e| format!("recovery_key: {e}"))?;
                Ok(Box::new(crate::boot_peer::PeerSource::new(addr, None, who, wait)) as Box<dyn Source>)
            })
            .collect()
    })?;
    let count = |w: &str| nb.chain.report().iter().filter(|r| r.verdict.word() == w).count();
    tracing::info!(
        node = nb.config.node,
        policy = nb.config.policy.name(),
        verified = count("verified"),
        recovered = count("recovered"),
        skipped = count("skipped"),
        "boot chain verified: the node starts on the verified bytes"
    );
    for r in nb.chain.report().iter().filter(|r| matches!(r.verdict, anode_boot::Verdict::Skipped { .. })) {
        tracing::warn!(component = %r.name, "boot: degraded start without this component");
    }
    Ok(nb)
}

/// Runs `anode boot`.
pub fn run(c: BootCmd) -> Result<ExitCode> {
    match c {
        BootCmd::Keygen { out, root_keys, targets_keys } => keygen(&out, root_keys, targets_keys),
        BootCmd::Sign(a) => sign_node(&a),
        BootCmd::Verify(a) => verify(&a),
    }
}

fn keygen(out: &Path, root: u8, targets: u8) -> Result<ExitCode> {
    if root == 0 || targets == 0 {
        bail!("--root-keys and --targets-keys must be at least 1");
    }
    let mut names: Vec<String> = (1..=root).map(|i| format!("root-{i}")).collect();
    names.extend((1..=targets).map(|i| format!("targets-{i}")));
    names.extend(["snapshot".to_string(), "timestamp".to_string()]);
    for n in &names {
        let id = Identity::generate()?;
        let (sk, _) = id.save(out, n)?;
        println!("{:<12} {}  {}", n, id.public().fingerprint(), sk.display());
    }
    println!("keep the root-* and targets-* keys offline; snapshot and timestamp sign every release");
    Ok(ExitCode::SUCCESS)
}

/// Every key KEYS/<prefix>*.key, sorted by name.
fn role_keys(dir: &Path, prefix: &str) -> Result<Vec<Identity>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "key")
                && p.file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|s| s == prefix || s.starts_with(&format!("{prefix}-")))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no {prefix} key in {} (run `anode boot keygen --out {}`)", dir.display(), dir.display());
    }
    files.iter().map(|f| Identity::load(f).with_context(|| f.display().to_string())).collect()
}

/// The node's base directory: `base`, or the config file's directory.
fn base_of(config: &Path, base: Option<&Path>) -> PathBuf {
    match base {
        Some(b) => normalize(b),
        None => config.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/")),
    }
}

/// A node file's name relative to the base directory.
fn relative(base: &Path, p: &Path) -> Result<String> {
    let abs = normalize(&base.join(p));
    let rel = abs
        .strip_prefix(base)
        .map_err(|_| anyhow!("{} is outside the node's base directory {}", abs.display(), base.display()))?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    parts.map(|v| v.join("/")).ok_or_else(|| anyhow!("{}: not UTF-8", rel.display()))
}

/// The node's components: (name, path on disk).
fn components(a: &SignArgs) -> Result<Vec<(ComponentName, PathBuf)>> {
    let config = normalize(&a.config);
    let base = base_of(&config, a.base.as_deref());
    let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let cfg = anode_node::config::NodeConfig::from_toml(&text).with_context(|| config.display().to_string())?;
    let binary = match &a.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("finding this executable")?,
    };
    let mut out = vec![(ComponentName::new(&a.node, Layer::Binary, "anode")?, binary)];
    let cfg_dir = config.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let mut add = |layer: Layer, p: &Path| -> Result<()> {
        let rel = relative(&base, &cfg_dir.join(p))?;
        let name = ComponentName::new(&a.node, layer, &rel).with_context(|| rel.clone())?;
        // A file named twice (a `--monitor` file the config also loads) is one component.
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, base.join(&rel)));
        }
        Ok(())
    };
    add(Layer::Config, &config)?;
    if let Some(t) = &cfg.routes.topology {
        add(Layer::Config, t)?;
    }
    if let Some(k) = cfg.security.as_ref().filter(|s| s.enabled).and_then(|s| s.key.as_ref()) {
        add(Layer::Keys, k)?;
    }
    if let Some(d) = &cfg.domain {
        add(Layer::Keys, &d.secret)?;
    }
    if let Some(m) = &cfg.modules {
        for s in &m.sessions {
            add(Layer::Keys, &s.credential)?;
        }
        for l in &m.loads {
            add(Layer::Keys, &l.credential)?;
            add(Layer::Switchlets, &l.file)?;
        }
        // Pods loaded at start are layer 5 with the monitoring modules.
        for p in &m.pods {
            add(Layer::Keys, &p.credential)?;
            add(Layer::Monitor, &p.file)?;
        }
    }
    if let Some(m) = &cfg.monitor {
        for l in &m.loads {
            add(Layer::Keys, &l.credential)?;
            add(Layer::Monitor, &l.file)?;
        }
    }
    for m in &a.monitor {
        add(Layer::Monitor, m)?;
    }
    Ok(out)
}

fn at(days: u64) -> SystemTime {
    SystemTime::now() + Duration::from_secs(days * DAY)
}

fn sign_node(a: &SignArgs) -> Result<ExitCode> {
    let comps = components(a)?;
    let root_ids = role_keys(&a.keys, "root")?;
    let targets_ids = role_keys(&a.keys, "targets")?;
    let snapshot_ids = role_keys(&a.keys, "snapshot")?;
    let timestamp_ids = role_keys(&a.keys, "timestamp")?;
    let meta = a.repo.join("metadata");
    let read = |f: &str| -> Result<Option<Vec<u8>>> {
        read_bounded(&meta.join(f), 16 << 20).map_err(|e| anyhow!("{}: {e}", meta.join(f).display()))
    };
    let root = match read("root.json")? {
        Some(r) => r,
        None => {
            let majority = |n: usize| (n / 2 + 1) as u32;
            let spec = RootSpec {
                version: 1,
                expires: at(365),
                root: RoleKeys {
                    keys: root_ids.iter().map(|k| k.public()).collect(),
                    threshold: a.root_threshold.unwrap_or(majority(root_ids.len())),
                },
                targets: RoleKeys {
                    keys: targets_ids.iter().map(|k| k.public()).collect(),
                    threshold: a.targets_threshold.unwrap_or(majority(targets_ids.len())),
                },
                snapshot: RoleKeys { keys: snapshot_ids.iter().map(|k| k.public()).collect(), threshold: 1 },
                timestamp: RoleKeys { keys: timestamp_ids.iter().map(|k| k.public()).collect(), threshold: 1 },
            };
            let r = sign::root(&spec, &root_ids.iter().collect::<Vec<_>>())?;
            write_atomic(&meta.join("root.json"), &r).map_err(|e| anyhow!("{e}"))?;
            println!("created root metadata v1 ({} root key(s), {} targets key(s))", root_ids.len(), targets_ids.len());
            r
        }
    };
    let old_targets = read(TARGETS)?;
    let mut t = match &old_targets {
        Some(b) => Targets::from_existing(b)?,
        None => Targets::new(),
    };
    t.remove_node(&a.node);
    let mut bytes = Vec::new();
    for (name, path) in &comps {
        let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        t.add(name, &b)?;
        bytes.push((name.clone(), b));
    }
    let next = |old: Option<Vec<u8>>| old.as_deref().and_then(sign::version_of).unwrap_or(0) + 1;
    let tv = next(old_targets);
    let sv = next(read(SNAPSHOT)?);
    let ttv = next(read(TIMESTAMP)?);
    let targets = t.sign(tv, at(a.expires_days), &targets_ids.iter().collect::<Vec<_>>())?;
    let snapshot = sign::snapshot(sv, at(a.expires_days), &targets, &snapshot_ids.iter().collect::<Vec<_>>())?;
    let timestamp = sign::timestamp(ttv, at(a.timestamp_days), &snapshot, &timestamp_ids.iter().collect::<Vec<_>>())?;
    for (name, b) in &bytes {
        let secret = t.is_secret(&name.target());
        if !secret {
            write_atomic(&a.repo.join("targets").join(name.target()), b).map_err(|e| anyhow!("{e}"))?;
        }
        println!(
            "{:<10} {:<44} {:>9} B  {}{}",
            name.layer,
            name.target(),
            b.len(),
            &sha256_hex(&sha256(b))[..16],
            if secret { "  (secret: not copied to the repository)" } else { "" }
        );
    }
    for (f, b) in [(TARGETS, &targets), (SNAPSHOT, &snapshot), (TIMESTAMP, &timestamp)] {
        write_atomic(&meta.join(f), b).map_err(|e| anyhow!("{e}"))?;
    }
    println!("signed targets v{tv}, snapshot v{sv}, timestamp v{ttv} into {}", meta.display());
    if let Some(dir) = &a.install {
        install(a, dir, &root, [&timestamp, &snapshot, &targets])?;
    }
    Ok(ExitCode::SUCCESS)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

fn install(a: &SignArgs, dir: &Path, root: &[u8], [ts, snap, targets]: [&Vec<u8>; 3]) -> Result<()> {
    let w = |f: &str, b: &[u8]| write_atomic(&dir.join(f), b).map_err(|e| anyhow!("{}: {e}", dir.join(f).display()));
    if !dir.join("root.json").exists() {
        w("root.json", root)?;
    }
    w(TIMESTAMP, ts)?;
    w(SNAPSHOT, snap)?;
    w(TARGETS, targets)?;
    if !dir.join(SETTINGS).exists() {
        let mirror = normalize(&a.repo);
        let mut s = format!(
            "# How node {node} boots (docs/boot.md).\nnode = \"{node}\"\npolicy = \"{policy}\"\nmirrors = [{mirror:?}]\n",
            node = a.node,
            policy = a.policy,
        );
        if let Some(b) = &a.binary {
            s.push_str(&format!("binary = {:?}\n", normalize(b)));
        }
        if let Some(b) = &a.base {
            s.push_str(&format!("base = {:?}\n", normalize(b)));
        }
        w(SETTINGS, s.as_bytes())?;
    }
    println!("installed into {}", dir.display());
    Ok(())
}

fn verify(a: &VerifyArgs) -> Result<ExitCode> {
    let mut cfg = BootConfig::load(&a.boot)?;
    if let Some(p) = &a.policy {
        cfg.policy = Policy::parse(p).ok_or_else(|| anyhow!("bad policy {p}"))?;
    }
    let from_settings = cfg.base.as_ref().map(|b| a.boot.join(b));
    let base = base_of(&normalize(&a.config), a.base.as_deref().or(from_settings.as_deref()));
    let binary = match &cfg.binary {
        Some(b) => a.boot.join(b),
        None => std::env::current_exe()?,
    };
    let mut io = FsIo::new(&a.boot, &base, &binary);
    let mirrors = if a.no_mirrors { &[][..] } else { &cfg.mirrors[..] };
    let mut sources: Vec<Box<dyn Source>> =
        mirrors.iter().map(|m| Box::new(MirrorSource::new(&a.boot.join(m))) as Box<dyn Source>).collect();
    if let Some(k) = &a.peer_as {
        let expect = match &a.peer_key {
            None => None,
            Some(k) if Path::new(k).exists() => Some(crate::keys_cmd::public_of(Path::new(k))?),
            Some(k) => Some(anode_sec::PublicKey::parse(k)?),
        };
        for p in &a.peer {
            let wait = Duration::from_millis(cfg.request_timeout_ms);
            sources.push(Box::new(crate::boot_peer::PeerSource::new(*p, expect, Identity::load(k)?, wait)));
        }
    }
    let params = BootParams {
        node: cfg.node.clone(),
        policy: cfg.policy,
        limits: Limits::default(),
        fetch: cfg.fetch_limits(),
        commit: a.repair,
    };
    let now = a.at.map_or_else(SystemTime::now, |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    let t0 = std::time::Instant::now();
    let (r, events) = boot_with_events(&mut io, &mut sources, &params, now);
    let took = t0.elapsed();
    println!("boot chain of node {} (policy {}), boot directory {}", cfg.node, cfg.policy.name(), a.boot.display());
    print!("{}", render(&events));
    match r {
        Ok(chain) => {
            println!("metadata:");
            for role in chain.roles() {
                println!("  {:<10} v{:<4} expires {}", role.role.to_string(), role.version, role.expires);
            }
            println!("chain:");
            let mut layer = None;
            for line in chain.report() {
                if layer != Some(line.name.layer) {
                    layer = Some(line.name.layer);
                    let n = Layer::ALL.iter().position(|l| *l == line.name.layer).unwrap_or(0) + 1;
                    println!("  layer {n} {}", line.name.layer);
                }
                println!(
                    "    {:<40} {:>9} B  sha256 {}…  {}",
                    line.name.file,
                    line.length,
                    &line.sha256[..16],
                    line.verdict.word()
                );
            }
            let state = if a.repair { "state recorded" } else { "nothing written (--repair to store and record)" };
            println!(
                "the node would start{} ({} components, {:.1} ms; {state})",
                if chain.degraded() { " DEGRADED" } else { "" },
                chain.report().len(),
                took.as_secs_f64() * 1e3
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("REFUSED: the node would not start: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

/// The events as lines: one per component verdict, recovery step and notice.
fn render(events: &[BootEvent]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for e in events {
        let _ = match e {
            BootEvent::FirstBoot => writeln!(s, "  state     none: first boot (trust on first use of root.json)"),
            BootEvent::StateIgnored(x) => writeln!(s, "  state     IGNORED: {x}"),
            BootEvent::MetadataVerified { versions: v } => writeln!(
                s,
                "  metadata  verified: root v{}, timestamp v{}, snapshot v{}, targets v{}",
                v[0], v[1], v[2], v[3]
            ),
            BootEvent::Notice(n) => writeln!(s, "  notice    {n:?}"),
            BootEvent::MetadataRefused(x) => writeln!(s, "  metadata  REFUSED: {x}"),
            BootEvent::MetadataSourceRefused { source, reason } => writeln!(s, "  recovery  {source}: {reason}"),
            BootEvent::MetadataRecovered { source } => writeln!(s, "  metadata  recovered from {source}"),
            BootEvent::Verified(_) => Ok(()),
            BootEvent::Failed { name, error } => writeln!(s, "  FAILED    {name}: {error}"),
            BootEvent::Fetch { name, source, event } => {
                writeln!(s, "  recovery  {name} {}: {event:?}", source.as_deref().unwrap_or("-"))
            }
            BootEvent::Recovered { name, source } => writeln!(s, "  recovered {name} from {source}"),
            BootEvent::Stored(f) => writeln!(s, "  stored    {f}"),
            BootEvent::StoreFailed { name, reason } => writeln!(s, "  NOT STORED {name}: {reason}"),
            BootEvent::Skipped { name, reason } => writeln!(s, "  SKIPPED   {name}: {reason}"),
            BootEvent::StateRecorded(v) => writeln!(s, "  state     recorded {v:?}"),
            other => writeln!(s, "  {other:?}"),
        };
    }
    s
}
