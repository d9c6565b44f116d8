//! The monitor: frames in, per-module policy views through fuel-bounded
//! modules, records and sampled packets out (sans-I/O).
//!
//! ```text
//! frame ─► parse (once) ─► for each module: filter ─► view (policy, anonymization)
//!        ─► batch in the module's memory ─► mon_batch / mon_packet (budget × n fuel)
//!        ─► records (checked) and samples (sanitized) ─► Output
//! ```
//!
//! The caller owns files, sockets, clocks and threads: it feeds
//! [`Monitor::handle_frame`] (or [`Monitor::handle_udp`], the node's tap),
//! calls [`Monitor::periodic`] at the interval it chooses with the current
//! time, [`Monitor::flush`] when a replay ends, and writes the [`Output`]s.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::SystemTime;

use anode_cred::RootKey;
use anode_monitor_apps::abi::{self, Record};
use anode_monitor_apps::{App, Sink};
use tracing::{info, warn};

use crate::capture::{Frame, LinkType};
use crate::cryptopan::{Anonymizer, CryptoPan};
use crate::parse::{Packet, parse};
use crate::policy::{Policy, PolicyError, PolicyVerifier};
use crate::runtime::{CallError, LoadError, LoadParams, Runtime, WasmModule};
use crate::view::ViewBuilder;

/// A loaded module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

impl std::fmt::Display for ModuleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "m{}", self.0)
    }
}

/// Monitor configuration (the operator's, not the credential's).
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Packets per `mon_batch` call (1: one call per packet). Modules that
    /// export only `mon_packet` are called per packet.
    pub batch: u32,
    /// Overruns after which a module is unloaded (FLAME: "persistently").
    pub unload_after: u32,
    /// Largest module binary, bytes.
    pub max_module: usize,
    /// Payload bytes a view can carry at most (a grant of "all" means this).
    pub max_view_payload: usize,
    /// Records (and samples) a module may emit per call.
    pub records_per_call: usize,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            batch: 32,
            unload_after: 64,
            max_module: 1 << 20,
            max_view_payload: 65_535,
            records_per_call: 256,
        }
    }
}

/// The monitor could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// wasmtime refused its configuration.
    #[error("cannot set up the wasm engine: {0}")]
    Engine(String),
}

/// Why a module was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MonitorLoadError {
    /// The credential was refused.
    #[error("credential refused: {0}")]
    Policy(#[from] PolicyError),
    /// The module was refused.
    #[error("module refused: {0}")]
    Module(#[from] LoadError),
    /// The policy anonymizes addresses but the monitor has no Crypto-PAn key.
    #[error("the credential requires anonymization but the monitor has no Crypto-PAn key (--anon-key)")]
    NoAnonymizationKey,
}

impl MonitorLoadError {
    /// A short stable label.
    pub fn label(&self) -> &'static str {
        match self {
            MonitorLoadError::Policy(e) => e.label(),
            MonitorLoadError::Module(e) => e.label(),
            MonitorLoadError::NoAnonymizationKey => "no_anonymization_key",
        }
    }
}

/// What the monitor produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A checked export record of a module with `export("records")`.
    Record {
        /// The module.
        module: ModuleId,
        /// Its name.
        name: Arc<str>,
        /// The record bytes (parse with [`Record::parse`]).
        bytes: Vec<u8>,
    },
    /// A sampled packet, sanitized per the module's policy, as `LINKTYPE_RAW`.
    Sample {
        /// The module.
        module: ModuleId,
        /// Capture time, ns.
        ts_ns: u64,
        /// Original IP length.
        wire_len: u32,
        /// The sanitized IP packet.
        data: Vec<u8>,
    },
    /// A module was unloaded.
    Unloaded {
        /// The module.
        module: ModuleId,
        /// Its name.
        name: Arc<str>,
        /// Why.
        reason: String,
    },
}

/// Per-module counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleCounters {
    /// Views delivered.
    pub packets: u64,
    /// Packets the filter hid from it.
    pub filtered: u64,
    /// Calls of its per-packet or batch entry.
    pub calls: u64,
    /// Calls cut off by the CPU budget (per-packet and periodic).
    pub overruns: u64,
    /// Packets lost to cut-off or trapped calls (the rest of their batch).
    pub packets_lost: u64,
    /// Traps.
    pub traps: u64,
    /// Calls that hit the memory limit.
    pub memory: u64,
    /// Fuel used by all calls.
    pub fuel: u64,
    /// Records exported.
    pub records: u64,
    /// Records refused: no export right.
    pub records_denied: u64,
    /// Samples exported.
    pub samples: u64,
    /// Samples refused: no export right.
    pub samples_denied: u64,
    /// Records refused: malformed.
    pub malformed: u64,
    /// Records or samples refused: per-call limit.
    pub limited: u64,
    /// Periodic calls.
    pub periodic: u64,
}

/// Monitor-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorCounters {
    /// Frames handed in.
    pub frames: u64,
    /// IP packets parsed.
    pub packets: u64,
    /// Frames skipped, by [`crate::parse::Skip::label`].
    pub skipped: BTreeMap<&'static str, u64>,
    /// Modules loaded.
    pub loads: u64,
    /// Loads refused, by label.
    pub load_refused: BTreeMap<&'static str, u64>,
    /// Modules unloaded for overruns.
    pub unloads: u64,
}

enum Runner {
    Wasm(Box<WasmModule>),
    Native(Box<dyn App + Send>),
    Gone,
}

struct Stored {
    ts_ns: u64,
    wire_len: u32,
    iface: u16,
    link: LinkType,
    data: Vec<u8>,
}

struct Slot {
    id: ModuleId,
    name: Arc<str>,
    policy: Policy,
    view: ViewBuilder,
    runner: Runner,
    batch: u32,
    region: usize,
    used: usize,
    n: u32,
    stored: Vec<Stored>,
    consecutive: u32,
    unloaded: Option<String>,
    counters: ModuleCounters,
    buf: Vec<u8>,
}

/// Information about a loaded module.
#[derive(Debug, Clone)]
pub struct ModuleInfo {
    /// Its id.
    pub id: ModuleId,
    /// Its name.
    pub name: Arc<str>,
    /// The policy it runs under.
    pub policy: Policy,
    /// Sandboxed (wasm) or native.
    pub sandboxed: bool,
    /// Why it was unloaded, if it was.
    pub unloaded: Option<String>,
    /// Its counters.
    pub counters: ModuleCounters,
}

/// The FLAME monitor.
pub struct Monitor {
    cfg: MonitorConfig,
    runtime: Runtime,
    verifier: PolicyVerifier,
    anonymizer: Option<Anonymizer>,
    slots: Vec<Slot>,
    next: u32,
    counters: MonitorCounters,
    udp_buf: Vec<u8>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("modules", &self.slots.len()).field("counters", &self.counters).finish()
    }
}

fn align8(n: usize) -> usize {
    (n + 7) & !7
}

/// Collects what a native application emits, applying the same checks as the host functions.
struct NativeSink<'a> {
    slot_export: crate::policy::ExportRights,
    max: usize,
    records: &'a mut Vec<Vec<u8>>,
    sampled: bool,
    counters: &'a mut ModuleCounters,
}

impl Sink for NativeSink<'_> {
    fn record(&mut self, rec: &[u8]) {
        if !self.slot_export.records {
            self.counters.records_denied += 1;
        } else if self.records.len() >= self.max {
            self.counters.limited += 1;
        } else if Record::parse(rec).is_err() {
            self.counters.malformed += 1;
        } else {
            self.records.push(rec.to_vec());
        }
    }
    fn sample(&mut self) {
        if self.slot_export.packets {
            self.sampled = true;
        } else {
            self.counters.samples_denied += 1;
        }
    }
}

impl Monitor {
    /// A monitor verifying credentials against the administrator key `root`,
    /// anonymizing with `key` when a policy asks for it.
    ///
    /// # Errors
    /// [`SetupError::Engine`].
    pub fn new(root: RootKey, cfg: MonitorConfig, key: Option<CryptoPan>) -> Result<Monitor, SetupError> {
        Ok(Monitor {
            runtime: Runtime::new().map_err(SetupError::Engine)?,
            verifier: PolicyVerifier::new(root),
            anonymizer: key.map(Anonymizer::new),
            cfg,
            slots: Vec::new(),
            next: 1,
            counters: MonitorCounters::default(),
            udp_buf: Vec::new(),
        })
    }

    /// The credential verifier (its default and maximum limits may be set).
    pub fn verifier_mut(&mut self) -> &mut PolicyVerifier {
        &mut self.verifier
    }

    /// Replaces the Crypto-PAn key (key rotation); later views use the new key.
    pub fn rotate_key(&mut self, key: CryptoPan) {
        match &mut self.anonymizer {
            Some(a) => a.rotate(key),
            None => self.anonymizer = Some(Anonymizer::new(key)),
        }
    }

    /// The anonymizer's cache statistics `(hits, misses)`.
    pub fn anonymizer_stats(&self) -> Option<(u64, u64)> {
        self.anonymizer.as_ref().map(|a| (a.hits, a.misses))
    }

    /// Monitor-wide counters.
    pub fn counters(&self) -> &MonitorCounters {
        &self.counters
    }

    /// Every module loaded (including unloaded ones, with their reason).
    pub fn modules(&self) -> Vec<ModuleInfo> {
        self.slots
            .iter()
            .map(|s| ModuleInfo {
                id: s.id,
                name: s.name.clone(),
                policy: s.policy.clone(),
                sandboxed: matches!(s.runner, Runner::Wasm(_)),
                unloaded: s.unloaded.clone(),
                counters: s.counters,
            })
            .collect()
    }

    /// One module's counters.
    pub fn module_counters(&self, id: ModuleId) -> Option<ModuleCounters> {
        self.slots.iter().find(|s| s.id == id).map(|s| s.counters)
    }

    fn authorize(&mut self, now: SystemTime, credential: &[u8]) -> Result<Policy, MonitorLoadError> {
        let policy = self.verifier.authorize(now, credential)?;
        if policy.anonymizes() && self.anonymizer.is_none() {
            return Err(MonitorLoadError::NoAnonymizationKey);
        }
        Ok(policy)
    }

    fn refused<T>(&mut self, r: Result<T, MonitorLoadError>, name: &str) -> Result<T, MonitorLoadError> {
        match &r {
            Ok(_) => {
                self.counters.loads += 1;
                info!(module = name, "monitoring module loaded");
            }
            Err(e) => {
                *self.counters.load_refused.entry(e.label()).or_default() += 1;
                warn!(module = name, reason = %e, "monitoring module refused");
            }
        }
        r
    }

    fn add(&mut self, name: &str, policy: Policy, view: ViewBuilder, runner: Runner, batch: u32) -> ModuleId {
        let id = ModuleId(self.next);
        self.next += 1;
        self.slots.push(Slot {
            id,
            name: Arc::from(name),
            policy,
            view,
            runner,
            batch: batch.max(1),
            region: 0,
            used: 0,
            n: 0,
            stored: Vec::new(),
            consecutive: 0,
            unloaded: None,
            counters: ModuleCounters::default(),
            buf: Vec::new(),
        });
        id
    }

    /// Loads a wasm module under a monitoring credential. The policy is
    /// decided and compiled here, once.
    ///
    /// # Errors
    /// See [`MonitorLoadError`]; nothing is loaded and no other module is affected.
    pub fn load(
        &mut self,
        now: SystemTime,
        name: &str,
        code: &[u8],
        credential: &[u8],
    ) -> Result<ModuleId, MonitorLoadError> {
        let r = self.load_inner(now, name, code, credential);
        self.refused(r, name)
    }

    fn load_inner(
        &mut self,
        now: SystemTime,
        name: &str,
        code: &[u8],
        credential: &[u8],
    ) -> Result<ModuleId, MonitorLoadError> {
        let policy = self.authorize(now, credential)?;
        let view = ViewBuilder::new(&policy, self.cfg.max_view_payload);
        let cap = align8(view.record_cap());
        let region = cap.max(self.cfg.batch as usize * cap.min(4096));
        let region = u32::try_from(region).unwrap_or(u32::MAX);
        let params = LoadParams {
            max_module: self.cfg.max_module,
            memory: policy.limits.memory,
            export: policy.export,
            init_fuel: policy.limits.periodic,
            region,
            max_batch: self.cfg.batch,
            max_records: self.cfg.records_per_call,
        };
        let wasm = self.runtime.load(code, &params)?;
        let batch = if wasm.has_batch() { self.cfg.batch } else { 1 };
        let id = self.add(name, policy, view, Runner::Wasm(Box::new(wasm)), batch);
        if let Some(s) = self.slots.last_mut() {
            s.region = region as usize;
        }
        Ok(id)
    }

    /// Runs a native (unsandboxed) application under a credential's policy:
    /// the same views and export checks, no wasm. For the benchmark that
    /// measures what the sandbox costs, and for trusted built-ins.
    ///
    /// # Errors
    /// [`MonitorLoadError::Policy`] and [`MonitorLoadError::NoAnonymizationKey`].
    pub fn load_native(
        &mut self,
        now: SystemTime,
        name: &str,
        app: Box<dyn App + Send>,
        credential: &[u8],
    ) -> Result<ModuleId, MonitorLoadError> {
        let r = self.authorize(now, credential);
        let policy = self.refused(r, name)?;
        let view = ViewBuilder::new(&policy, self.cfg.max_view_payload);
        Ok(self.add(name, policy, view, Runner::Native(app), 1))
    }

    /// Unloads a module (its pending batch is dropped).
    pub fn unload(&mut self, id: ModuleId, reason: &str) -> bool {
        match self.slots.iter_mut().find(|s| s.id == id && s.unloaded.is_none()) {
            Some(s) => {
                s.runner = Runner::Gone;
                s.unloaded = Some(reason.to_string());
                true
            }
            None => false,
        }
    }

    /// Handles one captured frame.
    pub fn handle_frame(&mut self, f: &Frame<'_>, out: &mut Vec<Output>) {
        self.counters.frames += 1;
        let p = match parse(f) {
            Ok(p) => p,
            Err(skip) => {
                *self.counters.skipped.entry(skip.label()).or_default() += 1;
                return;
            }
        };
        self.counters.packets += 1;
        let cfg = &self.cfg;
        for s in &mut self.slots {
            if s.unloaded.is_some() {
                continue;
            }
            if !s.view.visible(&p) {
                s.counters.filtered += 1;
                continue;
            }
            s.counters.packets += 1;
            let anon = self.anonymizer.as_mut();
            match &mut s.runner {
                Runner::Native(_) => native_packet(s, &p, anon, cfg, out),
                Runner::Wasm(_) => {
                    let cap = align8(s.view.record_cap());
                    if s.n > 0 && s.used + cap > s.region {
                        run_batch(s, self.anonymizer.as_mut(), out);
                    }
                    let anon = self.anonymizer.as_mut();
                    let Runner::Wasm(w) = &mut s.runner else { continue };
                    let Some(region) = w.region_mut() else { continue };
                    let Some(dst) = region.get_mut(s.used..(s.used + cap).min(region.len())) else { continue };
                    let Some(len) = s.view.build(&p, anon, dst) else { continue };
                    s.used = align8(s.used + len);
                    s.n += 1;
                    if s.policy.export.packets {
                        store_frame(s, &p);
                    }
                    if s.n >= s.batch {
                        run_batch(s, self.anonymizer.as_mut(), out);
                    }
                }
                Runner::Gone => {}
            }
            if let Some(reason) = check_unload(s, cfg) {
                self.counters.unloads += 1;
                out.push(Output::Unloaded { module: s.id, name: s.name.clone(), reason });
            }
        }
    }

    /// The node's tap: a verified datagram as the node received it (UDP from
    /// `src` to `dst`, the payload after the security layer), monitored as
    /// an IP/UDP packet on interface `iface`.
    pub fn handle_udp(
        &mut self,
        ts_ns: u64,
        iface: u16,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        out: &mut Vec<Output>,
    ) {
        let mut buf = std::mem::take(&mut self.udp_buf);
        buf.clear();
        let b = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                etherparse::PacketBuilder::ipv4(s.octets(), d.octets(), 64).udp(src.port(), dst.port())
            }
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
                    IpAddr::V6(v) => v.octets(),
                };
                etherparse::PacketBuilder::ipv6(v6(s), v6(d), 64).udp(src.port(), dst.port())
            }
        };
        if payload.len() <= 65_000 && b.write(&mut buf, payload).is_ok() {
            let f = Frame { ts_ns, wire_len: buf.len() as u32, iface, link: LinkType::Raw, data: &buf };
            self.handle_frame(&f, out);
        }
        self.udp_buf = buf;
    }

    /// Runs every pending batch (at the end of a replay, or before reading results).
    pub fn flush(&mut self, out: &mut Vec<Output>) {
        let cfg = &self.cfg;
        for s in &mut self.slots {
            if s.n > 0 && s.unloaded.is_none() {
                run_batch(s, self.anonymizer.as_mut(), out);
                if let Some(reason) = check_unload(s, cfg) {
                    self.counters.unloads += 1;
                    out.push(Output::Unloaded { module: s.id, name: s.name.clone(), reason });
                }
            }
        }
    }

    /// The periodic part of every module, at time `now_ns` (ns since the Unix
    /// epoch: capture time on replay, wall time live), each with its
    /// periodic budget. Pending batches run first.
    pub fn periodic(&mut self, now_ns: u64, out: &mut Vec<Output>) {
        self.flush(out);
        let cfg = &self.cfg;
        for s in &mut self.slots {
            if s.unloaded.is_some() {
                continue;
            }
            s.counters.periodic += 1;
            let fuel = s.policy.limits.periodic;
            match &mut s.runner {
                Runner::Wasm(w) => {
                    if let Some((used, r)) = w.tick(now_ns, fuel) {
                        s.counters.fuel += used;
                        let o = w.take_out();
                        finish_call(s, r, o, out);
                    }
                }
                Runner::Native(app) => {
                    let mut records = Vec::new();
                    let mut sink = NativeSink {
                        slot_export: s.policy.export,
                        max: cfg.records_per_call,
                        records: &mut records,
                        sampled: false,
                        counters: &mut s.counters,
                    };
                    app.tick(now_ns, &mut sink);
                    emit_records(s, records, out);
                }
                Runner::Gone => {}
            }
            if let Some(reason) = check_unload(s, cfg) {
                self.counters.unloads += 1;
                out.push(Output::Unloaded { module: s.id, name: s.name.clone(), reason });
            }
        }
    }
}

fn store_frame(s: &mut Slot, p: &Packet<'_>) {
    let i = s.n as usize - 1;
    if s.stored.len() <= i {
        s.stored.push(Stored { ts_ns: 0, wire_len: 0, iface: 0, link: LinkType::Raw, data: Vec::new() });
    }
    if let Some(st) = s.stored.get_mut(i) {
        st.ts_ns = p.ts_ns;
        st.wire_len = p.wire_len;
        st.iface = p.iface;
        st.link = p.link;
        st.data.clear();
        st.data.extend_from_slice(p.frame);
    }
}

fn emit_records(s: &mut Slot, records: Vec<Vec<u8>>, out: &mut Vec<Output>) {
    s.counters.records += records.len() as u64;
    for bytes in records {
        out.push(Output::Record { module: s.id, name: s.name.clone(), bytes });
    }
}

fn native_packet(
    s: &mut Slot,
    p: &Packet<'_>,
    anon: Option<&mut Anonymizer>,
    cfg: &MonitorConfig,
    out: &mut Vec<Output>,
) {
    let cap = s.view.record_cap();
    if s.buf.len() < cap {
        s.buf.resize(cap, 0);
    }
    let mut anon = anon;
    let Some(len) = s.view.build(p, anon.as_deref_mut(), &mut s.buf) else { return };
    let Some(v) = abi::View::new(&s.buf[..len]) else { return };
    let Runner::Native(app) = &mut s.runner else { return };
    let mut records = Vec::new();
    s.counters.calls += 1;
    let mut sink = NativeSink {
        slot_export: s.policy.export,
        max: cfg.records_per_call,
        records: &mut records,
        sampled: false,
        counters: &mut s.counters,
    };
    app.packet(&v, &mut sink);
    let sampled = sink.sampled;
    emit_records(s, records, out);
    if sampled {
        let mut data = Vec::new();
        let wire_len = s.view.sanitize(p, anon, &mut data);
        s.counters.samples += 1;
        out.push(Output::Sample { module: s.id, ts_ns: p.ts_ns, wire_len, data });
    }
}

fn run_batch(s: &mut Slot, mut anon: Option<&mut Anonymizer>, out: &mut Vec<Output>) {
    let n = s.n;
    let fuel = s.policy.limits.budget.saturating_mul(u64::from(n));
    let Runner::Wasm(w) = &mut s.runner else { return };
    let (used, r) = w.run(n, s.consecutive, fuel);
    let o = w.take_out();
    s.counters.calls += 1;
    s.counters.fuel += used;
    // Samples: re-parse the stored frame and sanitize it under the policy.
    for &i in &o.samples {
        let Some(st) = s.stored.get(i as usize) else { continue };
        let f = Frame { ts_ns: st.ts_ns, wire_len: st.wire_len, iface: st.iface, link: st.link, data: &st.data };
        if let Ok(p) = parse(&f) {
            let mut data = Vec::new();
            let wire_len = s.view.sanitize(&p, anon.as_deref_mut(), &mut data);
            s.counters.samples += 1;
            out.push(Output::Sample { module: s.id, ts_ns: p.ts_ns, wire_len, data });
        }
    }
    let lost = if r.is_err() { u64::from(n) } else { 0 };
    s.counters.packets_lost += lost;
    finish_call(s, r, o, out);
    s.used = 0;
    s.n = 0;
}

fn finish_call(s: &mut Slot, r: Result<(), CallError>, o: crate::runtime::CallOut, out: &mut Vec<Output>) {
    s.counters.records_denied += u64::from(o.denied_records);
    s.counters.samples_denied += u64::from(o.denied_samples);
    s.counters.malformed += u64::from(o.malformed);
    s.counters.limited += u64::from(o.limited);
    emit_records(s, o.records, out);
    match r {
        Ok(()) => s.consecutive = 0,
        Err(CallError::Overrun) => {
            s.counters.overruns += 1;
            s.consecutive = s.consecutive.saturating_add(1);
        }
        Err(CallError::Memory) => s.counters.memory += 1,
        Err(CallError::Trap(t)) => {
            s.counters.traps += 1;
            if s.counters.traps <= 3 {
                warn!(module = %s.name, trap = %t, "monitoring module trapped (that call ended; the module stays)");
            }
        }
    }
}

fn check_unload(s: &mut Slot, cfg: &MonitorConfig) -> Option<String> {
    if s.unloaded.is_some() || s.counters.overruns < u64::from(cfg.unload_after) {
        return None;
    }
    let reason = format!(
        "unloaded after {} CPU budget overruns (budget {} fuel per packet; threshold {})",
        s.counters.overruns, s.policy.limits.budget, cfg.unload_after
    );
    warn!(module = %s.name, %reason, "monitoring module unloaded");
    s.runner = Runner::Gone;
    s.unloaded = Some(reason.clone());
    Some(reason)
}
