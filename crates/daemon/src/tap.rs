//! The FLAME tap's I/O: the monitor built from `[monitor]` at start (its
//! modules, credentials and Crypto-PAn key read here, refusals are typed
//! start errors), the tap's work run after each receive batch with its CPU
//! charged to System, and its outputs written with the monitor library's
//! encoders: JSON lines, IPFIX (RFC 7011) and a pcap of the sampled packets.

use crate::DaemonError;
use crate::daemon::Daemon;
use crate::files::StartFiles;
use anode_monitor::apps::abi::Record;
use anode_monitor::{CryptoPan, IpfixEncoder, LinkType, ModuleCounters, Monitor, MonitorConfig, Output, PcapSink};
use anode_node::config::{MonitorSection, NodeConfig};
use anode_node::core::{Node, Owner, TAP_OUTPUTS, TapConfig};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tracing::{info, warn};

/// Why the tap could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TapError {
    /// The administrator key is not usable as a credential root.
    #[error("[monitor] admin_key: {0}")]
    AdminKey(String),
    /// The Crypto-PAn key file is readable by group or others.
    #[error("[monitor] anon_key {}: a Crypto-PAn key must not be readable by group or others (chmod 600)", .0.display())]
    AnonKeyMode(PathBuf),
    /// The Crypto-PAn key file does not parse.
    #[error("[monitor] anon_key {}: {reason}", file.display())]
    AnonKey {
        /// The key file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The wasm engine could not be set up.
    #[error("[monitor]: {0}")]
    Setup(#[from] anode_monitor::monitor::SetupError),
    /// A monitoring module was refused (credential, binary, key).
    #[error("[monitor] module {}: {source}", file.display())]
    Load {
        /// The module file.
        file: PathBuf,
        /// Why.
        source: anode_monitor::MonitorLoadError,
    },
    /// RCANE refused the periodic part's session (its VP: `TAP_VP`).
    #[error("[monitor]: the periodic part's session was refused: {0}")]
    Session(anode_sched::RcaneError),
    /// An export file could not be created or written.
    #[error("[monitor] export {}: {reason}", file.display())]
    Export {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A writer shared with the pcap encoder, so the daemon can flush it.
#[derive(Clone)]
struct Shared(Arc<Mutex<BufWriter<File>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.flush()
    }
}

/// The tap's export files.
pub(crate) struct TapFiles {
    json: (PathBuf, BufWriter<File>),
    ipfix: (PathBuf, BufWriter<File>, IpfixEncoder),
    pcap: (PathBuf, PcapSink<Shared>, Shared),
    outs: Vec<Output>,
    /// Records per module (IPFIX observation domain), encoded per drain.
    pending: BTreeMap<u32, Vec<Vec<u8>>>,
    /// Write errors (the first is logged; the tap goes on).
    pub(crate) write_errors: u64,
}

fn create(file: &Path) -> Result<BufWriter<File>, TapError> {
    File::create(file)
        .map(BufWriter::new)
        .map_err(|e| TapError::Export { file: file.to_path_buf(), reason: e.to_string() })
}

fn anon_key(file: &Path) -> Result<CryptoPan, TapError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |reason: String| TapError::AnonKey { file: file.to_path_buf(), reason };
    let mode = std::fs::metadata(file).map_err(|e| err(e.to_string()))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(TapError::AnonKeyMode(file.to_path_buf()));
    }
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?);
    CryptoPan::from_key_text(&text).map_err(|e| err(e.to_string()))
}

/// The monitor `[monitor]` describes, its modules loaded.
/// Module and credential files are read through `files`: with `--boot`,
/// the verified bytes of the chain (layer 5 and the keys layer), not the
/// paths again; a module a degraded boot left out is not loaded.
fn build_monitor(m: &MonitorSection, pk: &anode_sec::PublicKey, files: StartFiles<'_>) -> Result<Monitor, DaemonError> {
    let root = anode_cred::root_key_from_ed25519(pk.as_bytes()).map_err(|e| TapError::AdminKey(e.to_string()))?;
    let key = m.anon_key.as_deref().map(anon_key).transpose()?;
    if let Some(k) = &key {
        info!(key_id = %k.key_id_hex(), "monitor: anonymizing with Crypto-PAn");
    }
    let cfg = MonitorConfig { batch: m.batch, unload_after: m.unload_after, ..MonitorConfig::default() };
    let mut mon = Monitor::new(root, cfg, key).map_err(TapError::Setup)?;
    for l in &m.loads {
        let Some(code) = files.read(&l.file)? else {
            warn!(file = %l.file.display(), "monitoring module not loaded: the degraded boot left it out");
            continue;
        };
        let cred = files.read_needed(&l.credential)?;
        let stem = l.file.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let name = l.name.clone().unwrap_or(stem);
        let id = mon
            .load(std::time::SystemTime::now(), &name, &code, &cred)
            .map_err(|source| TapError::Load { file: l.file.clone(), source })?;
        info!(module = %id, name, file = %l.file.display(), "monitoring module loaded on the tap");
    }
    Ok(mon)
}

/// Turns the tap on when `[monitor]` is present and enabled: builds the
/// monitor, hands it to the core and opens the export files (in the run
/// directory unless the section names them). `listen`: the bound sockets.
pub(crate) fn start(
    node: &mut Node,
    cfg: &NodeConfig,
    run_dir: &Path,
    listen: &[SocketAddr],
    unix_ms_at_zero: u64,
    now_ms: u64,
    files: StartFiles<'_>,
) -> Result<Option<TapFiles>, DaemonError> {
    let Some(m) = cfg.monitor.as_ref().filter(|m| m.enabled) else { return Ok(None) };
    let pk = anode_sec::PublicKey::parse(&m.admin_key).map_err(|e| TapError::AdminKey(e.to_string()))?;
    let monitor = build_monitor(m, &pk, files)?;
    let interfaces = cfg.interfaces.iter().map(|i| m.interfaces.is_empty() || m.interfaces.contains(&i.name)).collect();
    let tc = TapConfig {
        interfaces,
        local: listen.to_vec(),
        tick_ms: m.tick_ms,
        queue: m.queue,
        outputs: TAP_OUTPUTS,
        unix_ms_at_zero,
        owner: *pk.as_bytes(),
    };
    let path = |p: &Option<PathBuf>, name: &str| p.clone().unwrap_or_else(|| run_dir.join(name));
    let (jp, ip, pp) = (path(&m.json, "monitor.jsonl"), path(&m.ipfix, "monitor.ipfix"), path(&m.pcap, "monitor.pcap"));
    let shared = Shared(Arc::new(Mutex::new(create(&pp)?)));
    let sink = PcapSink::new(shared.clone(), LinkType::Raw)
        .map_err(|e| TapError::Export { file: pp.clone(), reason: e.to_string() })?;
    let files = TapFiles {
        json: (jp.clone(), create(&jp)?),
        ipfix: (ip.clone(), create(&ip)?, IpfixEncoder::new()),
        pcap: (pp.clone(), sink, shared),
        outs: Vec::new(),
        pending: BTreeMap::new(),
        write_errors: 0,
    };
    node.enable_tap(monitor, tc, now_ms).map_err(TapError::Session)?;
    info!(json = %jp.display(), ipfix = %ip.display(), pcap = %pp.display(), tick_ms = m.tick_ms, "monitor tap on");
    Ok(Some(files))
}

impl TapFiles {
    /// Writes what the core's tap produced; flushes when anything was written.
    fn write(&mut self, node: &mut Node) {
        node.drain_tap(&mut self.outs);
        if self.outs.is_empty() {
            return;
        }
        if let Err(e) = self.write_outs() {
            self.write_errors += 1;
            if self.write_errors == 1 {
                warn!(error = %e, "monitor: cannot write the tap's exports (counted from now on)");
            }
        }
    }

    fn write_outs(&mut self) -> std::io::Result<()> {
        for o in self.outs.drain(..) {
            match o {
                Output::Record { module, name, bytes } => {
                    let Ok(r) = Record::parse(&bytes) else { continue };
                    writeln!(self.json.1, "{}", anode_monitor::json_line(&name, module.0, &r))?;
                    self.pending.entry(module.0).or_default().push(bytes);
                }
                Output::Sample { ts_ns, wire_len, data, .. } => {
                    self.pcap.1.write(ts_ns, wire_len, &data).map_err(|e| std::io::Error::other(e.to_string()))?;
                }
                Output::Unloaded { module, name, reason } => {
                    warn!(module = %module, name = %name, reason, "monitoring module unloaded from the tap");
                }
            }
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
            .unwrap_or(0);
        let mut buf = Vec::new();
        for (domain, recs) in std::mem::take(&mut self.pending) {
            let parsed: Vec<Record<'_>> = recs.iter().filter_map(|r| Record::parse(r).ok()).collect();
            for chunk in parsed.chunks(32) {
                buf.clear();
                self.ipfix.2.encode(domain, secs, chunk, &mut buf);
                self.ipfix.1.write_all(&buf)?;
            }
        }
        self.json.1.flush()?;
        self.ipfix.1.flush()?;
        self.pcap.2.flush()
    }

    /// The files, for `anode status`.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "json": self.json.0.display().to_string(),
            "ipfix": self.ipfix.0.display().to_string(),
            "pcap": self.pcap.0.display().to_string(),
            "write_errors": self.write_errors,
        })
    }
}

impl Daemon {
    /// Turns the tap on if `[monitor]` says so ([`start`]).
    pub(crate) fn start_tap(&mut self, unix_ms_at_zero: u64, files: StartFiles<'_>) -> Result<(), DaemonError> {
        let now_ms = self.now_ms();
        self.tap = start(&mut self.node, &self.cfg, &self.run_dir, &self.listen, unix_ms_at_zero, now_ms, files)?;
        Ok(())
    }

    /// Runs the tap's pending work (datagrams queued by the receive loop, a
    /// posted periodic run) with its thread CPU time charged to System, then
    /// writes its outputs. Nothing when the tap is off.
    pub(crate) fn run_tap(&mut self) {
        let Some(files) = self.tap.as_mut() else { return };
        if self.node.tap_has_work() {
            let rcane = self.node.rcane_on();
            let cpu0 = if rcane { crate::daemon::thread_cpu_ns() } else { 0 };
            self.node.run_tap();
            if rcane {
                let used = crate::daemon::thread_cpu_ns().saturating_sub(cpu0);
                self.node.charge_outside(Owner::System, used, 0, 0);
                self.charged = true;
            }
        }
        files.write(&mut self.node);
    }

    /// Runs the modules' pending batches and writes everything (at exit).
    pub(crate) fn finish_tap(&mut self) {
        let Some(files) = self.tap.as_mut() else { return };
        self.node.run_tap();
        self.node.flush_tap();
        files.write(&mut self.node);
    }

    /// The `monitor` section of `anode status`.
    pub(crate) fn tap_json(&self) -> serde_json::Value {
        let mut v = self.node.tap_json();
        if let (Some(f), Some(o)) = (self.tap.as_ref(), v.as_object_mut()) {
            o.insert("files".into(), f.json());
        }
        v
    }

    /// The tap's counters in Prometheus text (empty when the tap is off).
    pub(crate) fn tap_prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let (Some(t), Some(m)) = (self.node.tap_counters(), self.node.tap_monitor()) else { return s };
        let mut counter = |name: &str, help: &str, v: u64| {
            crate::control::prom_counter(&mut s, &format!("anode_monitor_{name}_total"), help, v)
        };
        let c = m.counters();
        for (name, help, v) in [
            ("tap_queued", "Verified datagrams queued for the monitor.", t.queued),
            ("tap_other_interface", "Datagrams on interfaces the tap does not cover.", t.other_interface),
            ("tap_queue_full", "Datagrams not monitored because the tap's queue was full.", t.queue_full),
            ("tap_monitored", "Datagrams handed to the monitor.", t.monitored),
            ("tap_ticks", "Periodic runs of the monitoring modules.", t.ticks),
            ("tap_outputs_dropped", "Monitor outputs lost because the daemon's queue was full.", t.outputs_dropped),
            ("frames", "Frames the monitor parsed or skipped.", c.frames),
            ("unloads", "Monitoring modules unloaded for CPU overruns.", c.unloads),
        ] {
            counter(name, help, v);
        }
        let mods = m.modules();
        for (name, help, get) in [
            ("module_packets", "Views delivered to the module.", (|k| k.packets) as fn(&ModuleCounters) -> u64),
            ("module_overruns", "Module calls cut off by the CPU budget.", |k| k.overruns),
            ("module_traps", "Module traps.", |k| k.traps),
            ("module_records", "Records the module exported.", |k| k.records),
            ("module_samples", "Packets the module sampled.", |k| k.samples),
            ("module_fuel", "Fuel the module used.", |k| k.fuel),
        ] {
            let _ = writeln!(s, "# HELP anode_monitor_{name}_total {help}\n# TYPE anode_monitor_{name}_total counter");
            for i in &mods {
                let label = i.name.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = writeln!(
                    s,
                    "anode_monitor_{name}_total{{module=\"{label}\",id=\"{}\"}} {}",
                    i.id,
                    get(&i.counters)
                );
            }
        }
        s
    }
}

/// Largest monitoring module file read for `monitor-load`, bytes.
const MAX_MONITOR_MODULE_FILE: u64 = 4 << 20;
/// Largest monitoring credential file read for `monitor-load`, bytes.
const MAX_MONITOR_CREDENTIAL_FILE: u64 = 64 << 10;

/// Reads at most `limit` bytes of `file`, refusing a longer one.
fn read_bounded(file: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut v = Vec::new();
    f.take(limit + 1).read_to_end(&mut v).map_err(|e| format!("{}: {e}", file.display()))?;
    if v.len() as u64 > limit {
        return Err(format!("{}: longer than {limit} bytes", file.display()));
    }
    Ok(v)
}

impl Daemon {
    /// Control `monitor-load`: the local operator's monitoring module into
    /// the running tap (files on this host, bounded reads); the answer line.
    pub(crate) fn monitor_load(&mut self, name: &str, module: &Path, credential: &Path) -> Vec<u8> {
        let read = read_bounded(module, MAX_MONITOR_MODULE_FILE)
            .and_then(|code| read_bounded(credential, MAX_MONITOR_CREDENTIAL_FILE).map(|cred| (code, cred)));
        let (code, cred) = match read {
            Ok(x) => x,
            Err(e) => return format!("error: {e}\n").into_bytes(),
        };
        match self.node.tap_load(std::time::SystemTime::now(), name, &code, &cred) {
            Ok(id) => {
                tracing::info!(module = %id, name, file = %module.display(), "monitoring module loaded by the operator");
                format!("loaded {name} as {id}\n").into_bytes()
            }
            Err(e) => {
                tracing::warn!(name, file = %module.display(), error = %e, "monitoring module refused");
                format!("error: {e}\n").into_bytes()
            }
        }
    }
}
