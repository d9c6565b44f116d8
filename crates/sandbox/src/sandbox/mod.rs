//! The sandbox: the [`Sandbox`] and its types, split by concern:
//!
//! - `loader`: checking, authorizing, compiling, instantiating, unloading;
//! - `invoke`: calling entries under a CPU bound;
//! - `channels`: packets to modules by demultiplexing specification;
//! - `timers`: alarms, fetch timeouts, credential rechecks;
//! - `capsules`: the capsule engine and code by hash.
//!
//! The host interfaces modules import are in `crate::host`.

mod capsules;
mod channels;
mod invoke;
mod loader;
mod pods;
mod task;
mod timers;

use invoke::{arm, begin_call, classify, drop_call};
pub use pods::PodSpec;
use task::run_to_end;
pub use task::{CapsuleJob, Job, JobKind, Step, Task};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use anode_cred::{
    CodeInfo, CredError, Grant, Interface, InterfaceSet, LoadRequest, ModuleHash, ModuleName, NameError, NameRequest,
    PrincipalId, RequestedLimits, RootKey, Verifier, VerifierConfig,
};
use tracing::{debug, info, warn};
use wasmtime::{Config, Engine, InstancePre, Linker, Module, Store, Trap};

use crate::cache::{CacheStats, CodeCache, Import};
use crate::capsule::{self, Capsule, Message, WireError};
use crate::heap::{HeapAccount, HeapCharge, HeapUse, SharedHeap};
use crate::host::{self, CapsuleCtx, Entry, HostLimits, HostOp, Obj, TenantState};
use crate::state::SoftState;
use crate::{Action, ModuleId, Now, Routes};

/// How each invocation's CPU is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuBound {
    /// Fuel: each invocation gets the grant's `cpu` units (≈ wasm
    /// instructions). Deterministic, needs no thread. The default.
    Fuel,
    /// Epoch interruption: each invocation may run for `ticks` epoch ticks;
    /// the node must call [`Sandbox::tick`] periodically (e.g. every ms from
    /// a timer thread). The grant's `cpu` is not used.
    Epoch {
        /// Ticks per invocation.
        ticks: u64,
    },
}

/// Sandbox configuration.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// CPU bound per invocation.
    pub cpu: CpuBound,
    /// Largest module binary, bytes.
    pub max_module: usize,
    /// Code cache bound, bytes (code plus compiled image).
    pub cache_bytes: usize,
    /// Limits inside host functions.
    pub host: HostLimits,
    /// Loaded modules per principal.
    pub modules_per_principal: usize,
    /// Cached capsule instances per principal before its capsule store is recycled.
    pub capsule_instances: usize,
    /// Capsules waiting for code, in total.
    pub max_pending: usize,
    /// How long to wait for fetched code, ms.
    pub fetch_timeout_ms: u64,
    /// Soft-state entries per principal.
    pub state_entries: usize,
    /// Alarms fired per [`Sandbox::handle_timeout`] call.
    pub alarms_per_poll: usize,
    /// Credential verification.
    pub verifier: VerifierConfig,
    /// Optimize compiled code (Cranelift `speed`); `false` compiles faster
    /// (`none`), for nodes where cold capsule loads dominate.
    pub optimize: bool,
    /// With [`CpuBound::Fuel`]: fuel between preemption points, where
    /// [`Sandbox::resume`] may stop an invocation and continue it later
    /// (`None`: invocations run to their end or their fuel bound).
    pub yield_fuel: Option<u64>,
    /// With [`CpuBound::Fuel`]: fuel charged for every host call, on top of
    /// the wasm it ran, so that a module cannot escape its CPU bound (or its
    /// slice) through cheap-looking host calls: 100,000 refused
    /// `set_alarm`s cost 100,000 × this. Host calls copy at most a few KiB
    /// (payloads, state entries, log lines: see [`HostLimits`]).
    pub host_call_fuel: u64,
    /// Code replies sent to one neighbour, bytes per second (bursts of a
    /// tenth of a second, and at least one reply of the largest module);
    /// all neighbours together get four times that. A code request is 34
    /// bytes and its reply as large as the module, so without this a
    /// neighbour (or, on links without security, anyone who can spoof its
    /// address) turns the node into an amplifier. 0: code is never served.
    pub code_reply_bytes_per_sec: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            cpu: CpuBound::Fuel,
            max_module: 256 * 1024,
            cache_bytes: 64 << 20,
            host: HostLimits::default(),
            modules_per_principal: 32,
            capsule_instances: 32,
            max_pending: 64,
            fetch_timeout_ms: 1000,
            state_entries: 1024,
            alarms_per_poll: 256,
            verifier: VerifierConfig::default(),
            optimize: true,
            yield_fuel: Some(DEFAULT_YIELD_FUEL),
            host_call_fuel: DEFAULT_HOST_CALL_FUEL,
            code_reply_bytes_per_sec: DEFAULT_CODE_REPLY_BYTES_PER_SEC,
        }
    }
}

/// Default [`SandboxConfig::code_reply_bytes_per_sec`]: 1 MiB/s per neighbour.
pub const DEFAULT_CODE_REPLY_BYTES_PER_SEC: u64 = 1 << 20;

/// Default fuel between preemption points: about 7 µs of a tight wasm loop on this
/// machine (see docs/benchmarks.md, "Preemption points").
pub const DEFAULT_YIELD_FUEL: u64 = 50_000;

/// Default fuel charged per host call (about what 500 wasm instructions
/// take; a host call of anode's interfaces takes 50-500 ns here).
pub const DEFAULT_HOST_CALL_FUEL: u64 = 500;

/// The wasm engine could not be configured on this host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// wasmtime refused the configuration.
    #[error("cannot set up the wasm engine: {0}")]
    Engine(String),
}

/// Why a load was refused. Nothing is registered and no other module is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The binary exceeds [`SandboxConfig::max_module`].
    #[error("module of {size} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Not a valid WebAssembly module.
    #[error("malformed module: {0}")]
    Malformed(String),
    /// Its programmer signature section is invalid.
    #[error("bad module signature: {0}")]
    BadSignature(NameError),
    /// The credential decision was negative.
    #[error("load denied: {0}")]
    Denied(CredError),
    /// The module imports something its credential does not grant (or that
    /// no host interface provides). Module thinning.
    #[error("forbidden import {import:?}: {}", match right { Some(r) => format!("needs right {r:?}, which the credential does not grant"), None => "no host interface provides it".to_string() })]
    ForbiddenImport {
        /// `module.field`.
        import: String,
        /// The missing right, or `None` if no interface provides it.
        right: Option<Interface>,
    },
    /// The module imports a function its interface does not have.
    #[error("unknown import {import:?}: no such host function")]
    UnknownImport {
        /// `module.field`.
        import: String,
    },
    /// The module's memory or tables exceed the principal's memory limit.
    #[error("module needs more memory than the principal's {cap}-byte limit")]
    MemoryLimit {
        /// The limit.
        cap: usize,
    },
    /// Instantiation failed (e.g. an import with the wrong signature).
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    /// `anode_init` (or the start function) failed.
    #[error("module initialisation failed: {0}")]
    InitFailed(InvokeError),
    /// The principal already has the most modules allowed.
    #[error("principal has {0} modules loaded, the most allowed")]
    TooManyModules(usize),
    /// An invocation of the principal's is suspended (preempted) and holds
    /// its store; try again when it has finished.
    #[error("the principal's store is busy with a preempted invocation; try again")]
    Busy,
}

impl LoadError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            LoadError::TooLarge { .. } => "too_large",
            LoadError::Malformed(_) => "malformed",
            LoadError::BadSignature(_) => "bad_signature",
            LoadError::Denied(e) => e.label(),
            LoadError::ForbiddenImport { .. } => "forbidden_import",
            LoadError::UnknownImport { .. } => "unknown_import",
            LoadError::MemoryLimit { .. } => "memory_limit",
            LoadError::Instantiate(_) => "instantiate",
            LoadError::InitFailed(_) => "init_failed",
            LoadError::TooManyModules(_) => "too_many_modules",
            LoadError::Busy => "busy",
        }
    }
}

/// Why an invocation failed. It ended that invocation only; its actions were discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvokeError {
    /// No such module (never loaded, or unloaded).
    #[error("no such module")]
    NoSuchModule,
    /// The module registered no entry by that name.
    #[error("module has no registered entry {0:?}")]
    UnregisteredEntry(String),
    /// The CPU bound was reached.
    #[error("CPU bound exceeded (invocation interrupted)")]
    CpuExhausted,
    /// Memory growth beyond the principal's limit, then a trap.
    #[error("memory limit exceeded")]
    MemoryLimit,
    /// A trap (including stack overflow and host errors).
    #[error("trap: {0}")]
    Trap(String),
    /// Another invocation of the same principal is suspended and holds its
    /// store: run this one after it.
    #[error("the principal's store is busy with a preempted invocation")]
    Busy,
}

impl InvokeError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            InvokeError::NoSuchModule => "no_such_module",
            InvokeError::UnregisteredEntry(_) => "unregistered_entry",
            InvokeError::CpuExhausted => "cpu_exhausted",
            InvokeError::MemoryLimit => "memory_limit",
            InvokeError::Trap(_) => "trap",
            InvokeError::Busy => "busy",
        }
    }
}

/// Why a capsule-protocol message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapsuleError {
    /// Bad wire format.
    #[error("bad capsule message: {0}")]
    Wire(#[from] WireError),
    /// The code does not hash to the name it was sent under.
    #[error("code hash mismatch: named {named}, code hashes to {actual}")]
    WrongHash {
        /// The hash in the message.
        named: ModuleHash,
        /// The hash of the code.
        actual: ModuleHash,
    },
    /// Loading the capsule's code was refused.
    #[error("capsule refused: {0}")]
    Load(#[from] LoadError),
    /// The capsule's entry failed.
    #[error("capsule entry failed: {0}")]
    Invoke(#[from] InvokeError),
    /// Too many capsules are waiting for code.
    #[error("too many capsules waiting for code")]
    PendingFull,
    /// Queued, the capsule would take its principal's heap past its
    /// session's reservation.
    #[error("the principal's heap reservation is full")]
    HeapFull,
    /// A code request over the requesting neighbour's (or all neighbours')
    /// code-reply rate ([`SandboxConfig::code_reply_bytes_per_sec`]).
    #[error("code reply refused: over the code-reply rate to {0}")]
    CodeReplyLimited(Ipv4Addr),
}

impl CapsuleError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            CapsuleError::Wire(_) => "wire",
            CapsuleError::WrongHash { .. } => "wrong_hash",
            CapsuleError::Load(e) => e.label(),
            CapsuleError::Invoke(e) => e.label(),
            CapsuleError::PendingFull => "pending_full",
            CapsuleError::HeapFull => "heap_full",
            CapsuleError::CodeReplyLimited(_) => "code_reply_limited",
        }
    }
}

/// What became of a capsule-protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapsuleOutcome {
    /// The capsule's entry ran and returned this value.
    Ran {
        /// The capsule instance.
        module: ModuleId,
        /// The entry's return value.
        result: i32,
    },
    /// The code is not cached: the capsule waits while it is fetched.
    Pending {
        /// The code's hash.
        hash: ModuleHash,
        /// Whether this capsule sent the code request (the first to wait).
        requested: bool,
    },
    /// Answered a code request from the cache.
    CodeServed,
    /// Fetched code arrived; the waiting capsules were run (with these results).
    CodeArrived {
        /// Results of the capsules that waited.
        results: Vec<Result<i32, CapsuleError>>,
    },
    /// Nothing to do (a request for code not cached, or an unsolicited reply).
    Ignored,
    /// The capsule was verified and its instance made; its entry waits, as
    /// a [`Job`] of its principal, for [`Sandbox::take_capsule_jobs`]
    /// (only with [`Sandbox::defer_capsules`]).
    Queued {
        /// The capsule instance.
        module: ModuleId,
    },
}

/// A module to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec<'a> {
    /// The module binary.
    pub code: &'a [u8],
    /// The credential (Biscuit bytes).
    pub credential: Option<&'a [u8]>,
    /// The authenticated requester (from a security association), if any.
    pub requester: Option<PrincipalId>,
    /// The loader's own name for the module.
    pub local_name: Option<&'a str>,
    /// Limits asked for (default: the credential's maxima).
    pub limits: RequestedLimits,
}

/// Records kept between [`Sandbox::take_invocations`] calls, at most.
const MAX_INVOCATION_RECORDS: usize = 4096;

/// One invocation of a module entry: who ran and what it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation {
    /// The module (or capsule instance).
    pub module: ModuleId,
    /// Its principal, which the invocation is done for.
    pub principal: PrincipalId,
    /// Fuel used (≈ wasm instructions; 0 under epoch interruption).
    pub fuel: u64,
    /// Whether it returned normally.
    pub ok: bool,
}

/// Module or capsule instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleKind {
    /// A loaded switchlet (its instance persists until unloaded).
    Module,
    /// A cached capsule instance (may be recycled at any time).
    Capsule,
}

/// Per-module counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModuleCounters {
    /// Entry invocations.
    pub invocations: u64,
    /// Invocations that returned normally.
    pub ok: u64,
    /// Traps.
    pub traps: u64,
    /// CPU bound reached.
    pub cpu_exhausted: u64,
    /// Memory limit reached.
    pub memory_exhausted: u64,
    /// Calls naming an entry it never registered.
    pub unregistered_entry: u64,
    /// Log messages dropped by the rate limit.
    pub log_dropped: u64,
}

/// A description of a loaded module.
#[derive(Debug, Clone)]
pub struct ModuleInfo {
    /// Its id.
    pub id: ModuleId,
    /// Module or capsule.
    pub kind: ModuleKind,
    /// Its principal.
    pub principal: PrincipalId,
    /// SHA-256 of the code.
    pub hash: ModuleHash,
    /// The names it is registered under.
    pub names: Vec<ModuleName>,
    /// Its registered entries.
    pub entries: Vec<String>,
    /// The interfaces it imports.
    pub interfaces: InterfaceSet,
    /// The grant it was loaded under.
    pub grant: Grant,
    /// Its counters.
    pub counters: ModuleCounters,
}

/// Sandbox-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxCounters {
    /// Modules loaded.
    pub loads: u64,
    /// Loads refused, by [`LoadError::label`].
    pub load_refused: HashMap<&'static str, u64>,
    /// Modules unloaded.
    pub unloads: u64,
    /// Entry invocations (all kinds).
    pub invocations: u64,
    /// Failed invocations, by [`InvokeError::label`].
    pub invoke_failed: HashMap<&'static str, u64>,
    /// Capsules whose entry ran.
    pub capsules_run: u64,
    /// Capsule messages refused, by [`CapsuleError::label`].
    pub capsule_refused: HashMap<&'static str, u64>,
    /// Code requests sent to previous hops.
    pub code_requests_sent: u64,
    /// Code requests answered from the cache.
    pub code_served: u64,
    /// Fetched code verified and used.
    pub code_fetched: u64,
    /// Fetches that timed out (their capsules dropped).
    pub fetch_timeouts: u64,
    /// Capsules dropped because their fetch timed out.
    pub pending_dropped: u64,
    /// Unsolicited or unknown code replies and requests.
    pub ignored: u64,
    /// Alarms fired.
    pub alarms_fired: u64,
    /// Packets delivered to channels.
    pub channel_deliveries: u64,
    /// Channel opens refused because the module's credential does not
    /// grant the filter (`E_DENIED`).
    pub channel_refused: u64,
    /// Capsule stores recycled to bound per-principal instances.
    pub capsule_store_recycles: u64,
    /// Loads that found the same code already loaded for the same
    /// principal under the same name (a retried request): no second copy.
    pub reloads: u64,
    /// Modules unloaded because their credential no longer allowed them
    /// (expired, mostly).
    pub credential_unloads: u64,
    /// Preemption points reached (fuel yields).
    pub yields: u64,
    /// Invocations stopped at a preemption point, to resume later.
    pub preempted: u64,
}

struct Space {
    /// `None` while a [`Task`] holds it.
    store: Option<Store<TenantState>>,
    /// Distinguishes this space from a later one of the same principal.
    id: u64,
    /// Whether its invocations yield at preemption points.
    yields: bool,
    live: usize,
    instances: usize,
    /// Modules unloaded while a task held the store: their handles go when
    /// it is given back.
    unloaded: Vec<u32>,
    /// Linear memory in use when the store was last seen.
    mem_used: usize,
}

struct Tenant {
    modules: Option<Space>,
    capsules: Option<Space>,
    capsule_insts: HashMap<ModuleHash, ModuleId>,
    state: Arc<Mutex<SoftState>>,
    /// The most generous memory cap of the principal's live grants.
    mem_cap: usize,
    /// Its session's heap reservation, when it holds one: then this, not
    /// its grants, caps each of its stores (RCANE §IV-E).
    session_heap: Option<usize>,
    /// Its one heap account (`crate::heap`): both stores and its host
    /// state draw from it; with `session_heap` set, bounded by it.
    heap: SharedHeap,
    /// Its channels' transmit reservations, within its session's
    /// (`crate::txbook`), shared with its stores.
    tx: Arc<Mutex<crate::txbook::TxBook>>,
}

impl Tenant {
    /// The cap on each of the principal's stores.
    fn cap(&self) -> usize {
        self.session_heap.unwrap_or(self.mem_cap)
    }

    /// Applies [`Tenant::cap`] to the stores in hand (a store a task holds
    /// gets it when it comes back).
    fn apply_cap(&mut self) {
        let cap = self.cap();
        for s in [self.modules.as_mut(), self.capsules.as_mut()].into_iter().flatten() {
            if let Some(st) = s.store.as_mut() {
                st.data_mut().limiter.cap = cap;
            }
        }
    }

    /// The principal's store for modules or for capsule instances.
    fn slot(&mut self, kind: ModuleKind) -> &mut Option<Space> {
        match kind {
            ModuleKind::Module => &mut self.modules,
            ModuleKind::Capsule => &mut self.capsules,
        }
    }

    /// The same, read-only.
    fn space(&self, kind: ModuleKind) -> Option<&Space> {
        match kind {
            ModuleKind::Module => self.modules.as_ref(),
            ModuleKind::Capsule => self.capsules.as_ref(),
        }
    }
}

struct Loaded {
    kind: ModuleKind,
    principal: PrincipalId,
    hash: ModuleHash,
    names: Vec<ModuleName>,
    entries: HashMap<String, Entry>,
    interfaces: InterfaceSet,
    grant: Grant,
    counters: ModuleCounters,
    /// The loader's name for it (loads are idempotent per principal, code and name).
    local_name: Option<String>,
    /// What its authorization is decided again with when a date its
    /// credential mentions comes (modules only).
    recheck: Option<Recheck>,
    /// Its instance's exported memory (`CallCtx::memory`).
    memory: Option<wasmtime::Memory>,
}

/// A loaded module's load request, kept to authorize it again.
#[derive(Clone)]
struct Recheck {
    credential: Arc<[u8]>,
    requester: Option<PrincipalId>,
    limits: RequestedLimits,
    info: CodeInfo,
}

impl Recheck {
    /// Decides again, at `now`, on a load of `local_name` importing
    /// `interfaces` under this credential: when to look again (`None`:
    /// never), or why it no longer allows the load. Dates are whole
    /// seconds: a check that still holds at its own date is looked at again
    /// a second later.
    fn decide(
        &self,
        verifier: &mut Verifier,
        now: Now,
        local_name: Option<&str>,
        interfaces: InterfaceSet,
    ) -> Result<Option<std::time::SystemTime>, CredError> {
        let req = LoadRequest {
            credential: Some(&self.credential),
            requester: self.requester,
            code: &self.info,
            local_name,
            interfaces,
            limits: self.limits,
        };
        let g = verifier.authorize(now.wall, &req)?;
        Ok(g.recheck_at.map(|t| if t > now.wall { t } else { now.wall + std::time::Duration::from_secs(1) }))
    }
}

/// The time on the node's clock (ms) at which wall time `at` falls
/// (`now.ms` if it has passed).
fn due_ms(now: Now, at: std::time::SystemTime) -> u64 {
    let delay = at.duration_since(now.wall).map_or(0, |d| d.as_millis().min(u64::MAX as u128) as u64);
    now.ms.saturating_add(delay)
}

struct Fetch {
    deadline: u64,
    waiting: Vec<(Ipv4Addr, Vec<u8>)>,
}

/// Code checked before authorization.
struct Inspected {
    info: CodeInfo,
    imports: Vec<Import>,
    interfaces: InterfaceSet,
}

/// The loader, the Core's host interfaces and the capsule engine of one node.
pub struct Sandbox {
    engine: Engine,
    cfg: SandboxConfig,
    verifier: Verifier,
    routes: Arc<dyn Routes>,
    linkers: HashMap<InterfaceSet, Linker<TenantState>>,
    cache: CodeCache,
    tenants: HashMap<PrincipalId, Tenant>,
    modules: HashMap<ModuleId, Loaded>,
    names: HashMap<ModuleName, ModuleId>,
    channels: crate::demux::DemuxTable,
    alarms: BinaryHeap<Reverse<(u64, ModuleId, i32)>>,
    /// When loaded modules' credentials must be decided again (ms, module).
    rechecks: BinaryHeap<Reverse<(u64, ModuleId)>>,
    /// The same for pods (ms, pod); what to decide on is in `pod_recheck`.
    pod_rechecks: BinaryHeap<Reverse<(u64, crate::pods::PodId)>>,
    /// Loaded pods whose credential has a date: the request to decide
    /// again, with the pod's name and interfaces.
    pod_recheck: HashMap<crate::pods::PodId, (Recheck, String, InterfaceSet)>,
    /// Invocations since the node last took them (who ran, and what it used).
    invocations: Vec<Invocation>,
    fetches: HashMap<ModuleHash, Fetch>,
    replies: capsules::ReplyBudget,
    /// Capsules run as [`Job`]s of their principal rather than at once
    /// (see [`Sandbox::defer_capsules`]).
    defer_capsules: bool,
    /// Verified capsules waiting for the node to queue them.
    capsule_jobs: Vec<Job>,
    /// Session heap reservations by principal ([`Sandbox::set_session_heap`]).
    session_heaps: HashMap<PrincipalId, usize>,
    /// Session transmit reservations by principal, bytes/s
    /// ([`Sandbox::set_session_tx`]).
    session_txs: HashMap<PrincipalId, u64>,
    /// Set by a heap account when it flags pressure (`crate::heap`).
    heap_signal: Arc<std::sync::atomic::AtomicBool>,
    pending: usize,
    next_id: u32,
    next_space: u64,
    counters: SandboxCounters,
    /// The pod binder and the pods (`sandbox/pods.rs`, docs/pods.md).
    pods: Arc<crate::pods::HubLock>,
}

/// Sets `principal`'s entry of a session reservation map to `v`, or
/// removes it with `None`.
fn set_or_clear<V>(map: &mut HashMap<PrincipalId, V>, principal: PrincipalId, v: Option<V>) {
    match v {
        Some(v) => {
            map.insert(principal, v);
        }
        None => {
            map.remove(&principal);
        }
    }
}

impl Sandbox {
    /// A sandbox that verifies credentials against the administrator key `root`.
    pub fn new(root: RootKey, cfg: SandboxConfig, routes: Arc<dyn Routes>) -> Result<Sandbox, SetupError> {
        let mut c = Config::new();
        match cfg.cpu {
            CpuBound::Fuel => {
                c.consume_fuel(true);
                if cfg.yield_fuel == Some(0) {
                    return Err(SetupError::Engine("yield_fuel must not be 0".into()));
                }
            }
            CpuBound::Epoch { .. } => {
                c.epoch_interruption(true);
            }
        }
        c.max_wasm_stack(256 * 1024);
        crate::perf_map_if_asked(&mut c);
        // No .eh_frame for JIT code: libgcc registers and deregisters unwind info
        // in a linked list, so with it on every module load or eviction cost grew
        // with the number of cached modules (measured: 1.7 -> 3.2 ms per cold
        // capsule over 10,000), the paper's symbol-table problem again. Wasm
        // backtraces on traps do not need it.
        c.native_unwind_info(false);
        if !cfg.optimize {
            c.cranelift_opt_level(wasmtime::OptLevel::None);
        }
        let engine = Engine::new(&c).map_err(|e| SetupError::Engine(format!("{e:#}")))?;
        let verifier = Verifier::new(root, cfg.verifier.clone());
        let pods = crate::pods::PodHub::shared().map_err(|e| SetupError::Engine(e.0))?;
        Ok(Sandbox {
            pods,
            engine,
            cache: CodeCache::new(cfg.cache_bytes),
            cfg,
            verifier,
            routes,
            linkers: HashMap::new(),
            tenants: HashMap::new(),
            modules: HashMap::new(),
            names: HashMap::new(),
            channels: crate::demux::DemuxTable::new(),
            alarms: BinaryHeap::new(),
            rechecks: BinaryHeap::new(),
            pod_rechecks: BinaryHeap::new(),
            pod_recheck: HashMap::new(),
            invocations: Vec::new(),
            fetches: HashMap::new(),
            replies: capsules::ReplyBudget::default(),
            defer_capsules: false,
            capsule_jobs: Vec::new(),
            session_heaps: HashMap::new(),
            session_txs: HashMap::new(),
            heap_signal: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pending: 0,
            next_id: 1,
            next_space: 1,
            counters: SandboxCounters::default(),
        })
    }

    /// Replaces the routing answers given to the `route` interface (new stores use them).
    pub fn set_routes(&mut self, routes: Arc<dyn Routes>) {
        self.routes = routes.clone();
        for t in self.tenants.values_mut() {
            for s in [t.modules.as_mut(), t.capsules.as_mut()].into_iter().flatten() {
                if let Some(st) = s.store.as_mut() {
                    st.data_mut().routes = routes.clone();
                }
            }
        }
    }

    /// Advances the epoch (only meaningful with [`CpuBound::Epoch`]).
    pub fn tick(&self) {
        self.engine.increment_epoch();
    }

    /// The engine, for a timer thread that calls `increment_epoch` itself.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Sandbox-wide counters.
    pub fn counters(&self) -> &SandboxCounters {
        &self.counters
    }

    /// The credential verifier (session credentials are decided with it too).
    pub fn verifier_mut(&mut self) -> &mut Verifier {
        &mut self.verifier
    }

    /// Credential decision counters.
    pub fn auth_counters(&self) -> &anode_cred::AuthCounters {
        self.verifier.counters()
    }

    /// Code cache statistics.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Bytes of soft state held by `principal`.
    pub fn state_bytes(&self, principal: &PrincipalId) -> usize {
        self.tenants.get(principal).and_then(|t| t.state.lock().ok().map(|s| s.bytes())).unwrap_or(0)
    }

    /// Sets (or, with `None`, clears) the heap reservation of `principal`'s
    /// session: while set, it caps the linear memory of each of the
    /// principal's stores in place of its grants' `memory` (a store
    /// already above it keeps what it has, and grows no more). Charging
    /// is by this reserved size, in the node's accounts.
    pub fn set_session_heap(&mut self, principal: PrincipalId, bytes: Option<usize>) {
        set_or_clear(&mut self.session_heaps, principal, bytes);
        if let Some(t) = self.tenants.get_mut(&principal) {
            t.session_heap = bytes;
            t.apply_cap();
            crate::heap::with(&t.heap, |a| a.set_reservation(bytes));
        }
    }

    /// Sets (or, with `None`, clears) the transmit reservation of
    /// `principal`'s session, bytes/s: its channels may reserve parts of it
    /// (`net.channel_tx`); lowering it releases the channels that asked
    /// last until the rest fit (`crate::txbook`).
    pub fn set_session_tx(&mut self, principal: PrincipalId, bytes_per_sec: Option<u64>) {
        set_or_clear(&mut self.session_txs, principal, bytes_per_sec);
        if let Some(t) = self.tenants.get(&principal)
            && let Ok(mut b) = t.tx.lock()
        {
            b.set_session(bytes_per_sec.unwrap_or(0));
        }
    }

    /// The principals with a session transmit reservation set.
    pub fn session_tx_principals(&self) -> Vec<PrincipalId> {
        self.session_txs.keys().copied().collect()
    }

    /// A copy of `principal`'s channel transmit reservations (`None`
    /// before it has loaded anything).
    pub fn tx_book(&self, principal: &PrincipalId) -> Option<crate::txbook::TxBook> {
        self.tenants.get(principal).and_then(|t| t.tx.lock().ok().map(|b| b.clone()))
    }

    /// What `principal`'s channels reserve together, and `flow`'s own
    /// reservation (0 if it holds none), bytes/s: what the node's link
    /// scheduler reads for each packet of a principal.
    pub fn flow_tx(&self, principal: &PrincipalId, flow: Option<crate::txbook::Flow>) -> (u64, u64) {
        let Some(t) = self.tenants.get(principal) else { return (0, 0) };
        let Ok(b) = t.tx.lock() else { return (0, 0) };
        (b.channels_total(), flow.and_then(|f| b.channel(f)).unwrap_or(0))
    }

    /// Charges `bytes` of code that `principal` staged ahead of a load (a
    /// module sent in chunks) to its heap account while its session holds a
    /// heap reservation; the bytes are given back when the returned charge
    /// drops (the load, or the staging's end). `None`: they do not fit in
    /// the reservation (the refusal is counted on the account). Without a
    /// session heap reservation nothing is charged (the node's own staging
    /// limits bound the code).
    pub fn charge_staged(&mut self, principal: PrincipalId, bytes: usize) -> Option<HeapCharge> {
        if !self.session_heaps.contains_key(&principal) {
            return Some(HeapCharge::default());
        }
        let heap = self.heap_account(principal);
        HeapCharge::staged(&heap, bytes)
    }

    /// `principal`'s heap account: its reservation, what is charged to it
    /// (memories, tables, handles, soft state, queued jobs, staged code),
    /// refusals and pressure calls (`crate::heap`). `None` before it has
    /// loaded or staged anything.
    pub fn heap(&self, principal: &PrincipalId) -> Option<HeapUse> {
        self.tenants.get(principal).map(|t| crate::heap::with(&t.heap, |a| a.snapshot()))
    }

    /// The largest module binary this sandbox loads, bytes
    /// ([`SandboxConfig::max_module`]).
    pub fn max_module(&self) -> usize {
        self.cfg.max_module
    }

    /// The principals with a session heap set.
    pub fn session_heap_principals(&self) -> Vec<PrincipalId> {
        self.session_heaps.keys().copied().collect()
    }

    /// Linear memory charged to `principal`'s module store, bytes.
    pub fn memory_used(&self, principal: &PrincipalId) -> usize {
        self.tenants
            .get(principal)
            .and_then(|t| t.modules.as_ref())
            .map_or(0, |s| s.store.as_ref().map_or(s.mem_used, |st| st.data().limiter.used))
    }

    /// Loaded modules (switchlets, not capsule instances).
    pub fn modules(&self) -> Vec<ModuleId> {
        let mut v: Vec<ModuleId> =
            self.modules.iter().filter(|(_, m)| m.kind == ModuleKind::Module).map(|(id, _)| *id).collect();
        v.sort();
        v
    }

    /// A description of module `id`.
    pub fn module(&self, id: ModuleId) -> Option<ModuleInfo> {
        let m = self.modules.get(&id)?;
        let mut entries: Vec<String> = m.entries.keys().cloned().collect();
        entries.sort();
        Some(ModuleInfo {
            id,
            kind: m.kind,
            principal: m.principal,
            hash: m.hash,
            names: m.names.clone(),
            entries,
            interfaces: m.interfaces,
            grant: m.grant.clone(),
            counters: m.counters,
        })
    }

    /// The first loaded module matching a name request (version preference
    /// lists fall back in order).
    pub fn resolve(&self, req: &NameRequest) -> Option<ModuleId> {
        req.candidates().iter().find_map(|n| self.names.get(n).copied())
    }
}
