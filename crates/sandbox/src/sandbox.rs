//! The loader and the capsule engine.

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
        }
    }
}

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
    /// Capsule stores recycled to bound per-principal instances.
    pub capsule_store_recycles: u64,
    /// Loads that found the same code already loaded for the same
    /// principal under the same name (a retried request): no second copy.
    pub reloads: u64,
    /// Modules unloaded because their credential no longer allowed them
    /// (expired, mostly).
    pub credential_unloads: u64,
}

struct Space {
    store: Store<TenantState>,
    live: usize,
    instances: usize,
}

struct Tenant {
    modules: Option<Space>,
    capsules: Option<Space>,
    capsule_insts: HashMap<ModuleHash, ModuleId>,
    state: Arc<Mutex<SoftState>>,
    mem_cap: usize,
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
}

/// A loaded module's load request, kept to authorize it again.
#[derive(Clone)]
struct Recheck {
    credential: Arc<[u8]>,
    requester: Option<PrincipalId>,
    limits: RequestedLimits,
    info: CodeInfo,
}

struct ChannelRoute {
    port: u16,
    prefix: Vec<u8>,
    module: ModuleId,
    handle: i32,
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
    channels: Vec<ChannelRoute>,
    alarms: BinaryHeap<Reverse<(u64, ModuleId, i32)>>,
    /// When loaded modules' credentials must be decided again (ms, module).
    rechecks: BinaryHeap<Reverse<(u64, ModuleId)>>,
    /// Invocations since the node last took them (who ran, and what it used).
    invocations: Vec<Invocation>,
    fetches: HashMap<ModuleHash, Fetch>,
    pending: usize,
    next_id: u32,
    counters: SandboxCounters,
}

impl Sandbox {
    /// A sandbox that verifies credentials against the administrator key `root`.
    pub fn new(root: RootKey, cfg: SandboxConfig, routes: Arc<dyn Routes>) -> Result<Sandbox, SetupError> {
        let mut c = Config::new();
        match cfg.cpu {
            CpuBound::Fuel => {
                c.consume_fuel(true);
            }
            CpuBound::Epoch { .. } => {
                c.epoch_interruption(true);
            }
        }
        c.max_wasm_stack(256 * 1024);
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
        Ok(Sandbox {
            engine,
            cache: CodeCache::new(cfg.cache_bytes),
            cfg,
            verifier,
            routes,
            linkers: HashMap::new(),
            tenants: HashMap::new(),
            modules: HashMap::new(),
            names: HashMap::new(),
            channels: Vec::new(),
            alarms: BinaryHeap::new(),
            rechecks: BinaryHeap::new(),
            invocations: Vec::new(),
            fetches: HashMap::new(),
            pending: 0,
            next_id: 1,
            counters: SandboxCounters::default(),
        })
    }

    /// Replaces the routing answers given to the `route` interface (new stores use them).
    pub fn set_routes(&mut self, routes: Arc<dyn Routes>) {
        self.routes = routes.clone();
        for t in self.tenants.values_mut() {
            for s in [t.modules.as_mut(), t.capsules.as_mut()].into_iter().flatten() {
                s.store.data_mut().routes = routes.clone();
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

    /// Linear memory charged to `principal`'s module store, bytes.
    pub fn memory_used(&self, principal: &PrincipalId) -> usize {
        self.tenants.get(principal).and_then(|t| t.modules.as_ref()).map_or(0, |s| s.store.data().limiter.used)
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

    // ---- loading -------------------------------------------------------

    fn inspect(&self, code: &[u8]) -> Result<Inspected, LoadError> {
        if code.len() > self.cfg.max_module {
            return Err(LoadError::TooLarge { size: code.len(), max: self.cfg.max_module });
        }
        let info = CodeInfo::inspect(code).map_err(|e| match e {
            NameError::InvalidSignature { .. } | NameError::MalformedSignature(_) | NameError::InvalidName(_) => {
                LoadError::BadSignature(e)
            }
            other => LoadError::Malformed(other.to_string()),
        })?;
        let (imports, interfaces) = scan_imports(code)?;
        Ok(Inspected { info, imports, interfaces })
    }

    fn inspected_cached(&mut self, hash: &ModuleHash) -> Option<Inspected> {
        let e = self.cache.get(hash)?;
        Some(Inspected { info: e.info.clone(), imports: e.imports.clone(), interfaces: e.interfaces })
    }

    fn authorize(
        &mut self,
        now: Now,
        ins: &Inspected,
        credential: Option<&[u8]>,
        requester: Option<PrincipalId>,
        local_name: Option<&str>,
        limits: RequestedLimits,
    ) -> Result<Grant, LoadError> {
        let req =
            LoadRequest { credential, requester, code: &ins.info, local_name, interfaces: ins.interfaces, limits };
        let grant = self.verifier.authorize(now.wall, &req).map_err(|e| match e {
            CredError::InterfaceNotGranted { right, .. } => forbidden(&ins.imports, right),
            other => LoadError::Denied(other),
        })?;
        // Module thinning: every import must be an interface the grant includes.
        if let Some(imp) = ins.imports.iter().find(|i| i.interface.is_some_and(|f| !grant.interfaces.contains(f))) {
            return Err(LoadError::ForbiddenImport {
                import: format!("{}.{}", imp.module, imp.name),
                right: imp.interface,
            });
        }
        Ok(grant)
    }

    /// Compiles (or finds in the cache) and returns an `InstancePre` for the grant's interfaces.
    fn pre_for(
        &mut self,
        code: &[u8],
        ins: &Inspected,
        granted: InterfaceSet,
    ) -> Result<InstancePre<TenantState>, LoadError> {
        let hash = ins.info.hash;
        if !self.cache.contains(&hash) {
            let module = Module::from_binary(&self.engine, code).map_err(|e| LoadError::Malformed(format!("{e:#}")))?;
            let inserted =
                self.cache.insert(code.into(), module.clone(), ins.info.clone(), ins.imports.clone(), ins.interfaces);
            if inserted.is_none() {
                // Larger than the whole cache: use it uncached.
                let linker = self.linker(granted)?;
                return linker.instantiate_pre(&module).map_err(|e| LoadError::Instantiate(format!("{e:#}")));
            }
        }
        if !self.linkers.contains_key(&granted) {
            self.linker(granted)?;
        }
        let linker = self.linkers.get(&granted).ok_or_else(|| LoadError::Instantiate("no linker".into()))?;
        let Some(entry) = self.cache.get(&hash) else { return Err(LoadError::Instantiate("cache".into())) };
        if let Some((_, pre)) = entry.pres.iter().find(|(s, _)| *s == granted) {
            return Ok(pre.clone());
        }
        let pre = linker.instantiate_pre(&entry.module).map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
        entry.pres.push((granted, pre.clone()));
        Ok(pre)
    }

    fn linker(&mut self, granted: InterfaceSet) -> Result<&Linker<TenantState>, LoadError> {
        if !self.linkers.contains_key(&granted) {
            let l = host::linker_for(&self.engine, granted).map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
            self.linkers.insert(granted, l);
        }
        self.linkers.get(&granted).ok_or_else(|| LoadError::Instantiate("no linker".into()))
    }

    fn tenant(&mut self, principal: PrincipalId, grant: &Grant) -> &mut Tenant {
        let entries = self.cfg.state_entries;
        let t = self.tenants.entry(principal).or_insert_with(|| Tenant {
            modules: None,
            capsules: None,
            capsule_insts: HashMap::new(),
            state: Arc::new(Mutex::new(SoftState::new(grant.limits.state as usize, entries))),
            mem_cap: grant.limits.memory as usize,
        });
        // The principal's caps follow its most generous live grant.
        let mem = grant.limits.memory as usize;
        if mem > t.mem_cap {
            t.mem_cap = mem;
            for s in [t.modules.as_mut(), t.capsules.as_mut()].into_iter().flatten() {
                s.store.data_mut().limiter.cap = mem;
            }
        }
        if let Ok(mut s) = t.state.lock() {
            let cap = s.bytes().max(grant.limits.state as usize);
            s.set_cap(cap);
        }
        t
    }

    fn new_space(&self, principal: PrincipalId, t: &Tenant) -> Space {
        let data = TenantState::new(principal, t.mem_cap, t.state.clone(), self.routes.clone(), self.cfg.host);
        let mut store = Store::new(&self.engine, data);
        store.limiter(|d| &mut d.limiter);
        if let CpuBound::Epoch { .. } = self.cfg.cpu {
            store.epoch_deadline_trap();
        }
        Space { store, live: 0, instances: 0 }
    }

    /// Loads a module (from disk via the config, or from an authenticated
    /// control message). Authorization is decided here, once. Actions of its
    /// `anode_init` (e.g. log lines) are discarded; see [`Sandbox::load_with`].
    pub fn load(&mut self, now: Now, spec: &LoadSpec<'_>) -> Result<ModuleId, LoadError> {
        self.load_with(now, spec, &mut Vec::new())
    }

    /// [`Sandbox::load`], appending the actions of `anode_init` to `out`.
    pub fn load_with(&mut self, now: Now, spec: &LoadSpec<'_>, out: &mut Vec<Action>) -> Result<ModuleId, LoadError> {
        self.load_once(now, spec, out).map(|(id, _)| id)
    }

    /// [`Sandbox::load_with`], saying whether the module was already
    /// loaded: loads are idempotent, so a retried request (the same
    /// principal, code and local name) finds the module it loaded before
    /// and never loads a second copy. The credential is still decided
    /// again, so a retry with a credential that no longer allows the
    /// module is refused.
    pub fn load_once(
        &mut self,
        now: Now,
        spec: &LoadSpec<'_>,
        out: &mut Vec<Action>,
    ) -> Result<(ModuleId, bool), LoadError> {
        let r = self.load_inner(now, spec, out);
        match &r {
            Ok((id, false)) => {
                self.counters.loads += 1;
                info!(module = %id, size = spec.code.len(), "module loaded");
            }
            Ok((id, true)) => {
                self.counters.reloads += 1;
                debug!(module = %id, "module already loaded; not loaded again");
            }
            Err(e) => {
                *self.counters.load_refused.entry(e.label()).or_default() += 1;
                warn!(reason = %e, "module load refused");
            }
        }
        r
    }

    /// The module `principal` loaded from `hash` under `local_name`, if any.
    fn find_loaded(&self, principal: PrincipalId, hash: ModuleHash, local_name: Option<&str>) -> Option<ModuleId> {
        self.modules
            .iter()
            .find(|(_, m)| {
                m.kind == ModuleKind::Module
                    && m.principal == principal
                    && m.hash == hash
                    && m.local_name.as_deref() == local_name
            })
            .map(|(id, _)| *id)
    }

    /// Schedules the next decision on module `id`'s credential at `at`.
    fn schedule_recheck(&mut self, now: Now, id: ModuleId, at: Option<std::time::SystemTime>) {
        if let Some(t) = at {
            let delay = t.duration_since(now.wall).map_or(0, |d| d.as_millis().min(u64::MAX as u128) as u64);
            self.rechecks.push(Reverse((now.ms.saturating_add(delay), id)));
        }
    }

    /// Decides again on the credentials of modules whose recheck time has
    /// come; a module its credential no longer allows is unloaded.
    fn recheck_due(&mut self, now: Now) {
        while let Some(Reverse((at, id))) = self.rechecks.peek().copied() {
            if at > now.ms {
                break;
            }
            self.rechecks.pop();
            let Some((rc, name, interfaces, principal)) = self
                .modules
                .get(&id)
                .and_then(|m| Some((m.recheck.clone()?, m.local_name.clone(), m.interfaces, m.principal)))
            else {
                continue;
            };
            let req = LoadRequest {
                credential: Some(&rc.credential),
                requester: rc.requester,
                code: &rc.info,
                local_name: name.as_deref(),
                interfaces,
                limits: rc.limits,
            };
            match self.verifier.authorize(now.wall, &req) {
                Ok(g) => {
                    // Dates are whole seconds: a check that still holds at
                    // its own date is looked at again a second later.
                    let next = match g.recheck_at {
                        Some(t) if t > now.wall => Some(t),
                        Some(_) => Some(now.wall + std::time::Duration::from_secs(1)),
                        None => None,
                    };
                    self.schedule_recheck(now, id, next);
                }
                Err(e) => {
                    warn!(module = %id, principal = %principal, reason = %e,
                          "module unloaded: its credential no longer allows it");
                    self.unload(id);
                    self.counters.credential_unloads += 1;
                }
            }
        }
    }

    fn load_inner(
        &mut self,
        now: Now,
        spec: &LoadSpec<'_>,
        out: &mut Vec<Action>,
    ) -> Result<(ModuleId, bool), LoadError> {
        if spec.code.len() > self.cfg.max_module {
            return Err(LoadError::TooLarge { size: spec.code.len(), max: self.cfg.max_module });
        }
        let hash = ModuleHash::of(spec.code);
        let ins = match self.inspected_cached(&hash) {
            Some(i) => i,
            None => self.inspect(spec.code)?,
        };
        let grant = self.authorize(now, &ins, spec.credential, spec.requester, spec.local_name, spec.limits)?;
        let principal = grant.principal;
        if let Some(id) = self.find_loaded(principal, hash, spec.local_name) {
            return Ok((id, true));
        }
        let pre = self.pre_for(spec.code, &ins, grant.interfaces)?;
        let max = self.cfg.modules_per_principal;
        let live = self.tenants.get(&principal).and_then(|t| t.modules.as_ref()).map_or(0, |s| s.live);
        if live >= max {
            return Err(LoadError::TooManyModules(live));
        }
        let id = self.instantiate(now, principal, &grant, &pre, ModuleKind::Module, &ins, out)?;
        for n in &grant.names {
            if let Some(old) = self.names.insert(n.clone(), id) {
                debug!(name = %n, old = %old, new = %id, "module name rebound");
            }
        }
        if let Some(m) = self.modules.get_mut(&id) {
            m.local_name = spec.local_name.map(str::to_string);
            m.recheck = spec.credential.map(|c| Recheck {
                credential: c.into(),
                requester: spec.requester,
                limits: spec.limits,
                info: ins.info.clone(),
            });
        }
        self.schedule_recheck(now, id, grant.recheck_at);
        Ok((id, false))
    }

    #[allow(clippy::too_many_arguments)]
    fn instantiate(
        &mut self,
        now: Now,
        principal: PrincipalId,
        grant: &Grant,
        pre: &InstancePre<TenantState>,
        kind: ModuleKind,
        ins: &Inspected,
        actions: &mut Vec<Action>,
    ) -> Result<ModuleId, LoadError> {
        let id = ModuleId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let cpu = self.cfg.cpu;
        self.tenant(principal, grant);
        let need_space = {
            let t = &self.tenants[&principal];
            match kind {
                ModuleKind::Module => t.modules.is_none(),
                ModuleKind::Capsule => t.capsules.is_none(),
            }
        };
        if need_space {
            let s = self.new_space(principal, &self.tenants[&principal]);
            let t = self.tenants.get_mut(&principal).ok_or(LoadError::Instantiate("tenant".into()))?;
            match kind {
                ModuleKind::Module => t.modules = Some(s),
                ModuleKind::Capsule => t.capsules = Some(s),
            }
        }
        let t = self.tenants.get_mut(&principal).ok_or(LoadError::Instantiate("tenant".into()))?;
        let space = match kind {
            ModuleKind::Module => t.modules.as_mut(),
            ModuleKind::Capsule => t.capsules.as_mut(),
        }
        .ok_or(LoadError::Instantiate("space".into()))?;
        let store = &mut space.store;
        begin_call(store, id, now, 0, &[], None);
        arm(store, cpu, grant.limits.cpu);
        space.instances += 1;
        let r = pre.instantiate(&mut *store);
        let instance = match r {
            Ok(i) => i,
            Err(e) => {
                let ex = store.data().limiter.exceeded;
                drop_call(store);
                let cap = store.data().limiter.cap;
                let err = if ex {
                    LoadError::MemoryLimit { cap }
                } else if e.downcast_ref::<Trap>().is_some() {
                    LoadError::InitFailed(classify(&e, false))
                } else {
                    LoadError::Instantiate(format!("{e:#}"))
                };
                self.reclaim_if_empty(principal, kind);
                return Err(err);
            }
        };
        // anode_init registers the module's entries.
        let init = instance.get_typed_func::<(), ()>(&mut *store, "anode_init").ok();
        if let Some(init) = init {
            arm(store, cpu, grant.limits.cpu);
            store.data_mut().limiter.exceeded = false;
            if let Err(e) = init.call(&mut *store, ()) {
                let err = classify(&e, store.data().limiter.exceeded);
                drop_call(store);
                self.reclaim_if_empty(principal, kind);
                return Err(LoadError::InitFailed(err));
            }
        }
        let d = store.data_mut();
        let regs = std::mem::take(&mut d.call.registrations);
        let ops = std::mem::take(&mut d.ops);
        actions.append(&mut d.call.out);
        drop_call(store);
        space.live += 1;
        let mut entries = HashMap::new();
        for (n, f) in regs {
            entries.insert(n, f);
        }
        self.modules.insert(
            id,
            Loaded {
                kind,
                principal,
                hash: ins.info.hash,
                names: if kind == ModuleKind::Module { grant.names.clone() } else { Vec::new() },
                entries,
                interfaces: ins.interfaces,
                grant: grant.clone(),
                counters: ModuleCounters::default(),
                local_name: None,
                recheck: None,
            },
        );
        self.apply_ops(ops);
        Ok(id)
    }

    fn reclaim_if_empty(&mut self, principal: PrincipalId, kind: ModuleKind) {
        if let Some(t) = self.tenants.get_mut(&principal) {
            let slot = match kind {
                ModuleKind::Module => &mut t.modules,
                ModuleKind::Capsule => &mut t.capsules,
            };
            if slot.as_ref().is_some_and(|s| s.live == 0) {
                *slot = None;
            }
        }
    }

    /// Unloads a module: its names, channels and alarms go; when it was its
    /// principal's last module, the principal's store (and memory) is freed.
    pub fn unload(&mut self, id: ModuleId) -> bool {
        let Some(m) = self.modules.remove(&id) else { return false };
        self.names.retain(|_, v| *v != id);
        self.channels.retain(|c| c.module != id);
        if let Some(t) = self.tenants.get_mut(&m.principal) {
            let slot = match m.kind {
                ModuleKind::Module => &mut t.modules,
                ModuleKind::Capsule => &mut t.capsules,
            };
            if let Some(s) = slot.as_mut() {
                s.store.data_mut().handles.remove_owner(id.0);
                s.live = s.live.saturating_sub(1);
            }
            if m.kind == ModuleKind::Capsule {
                t.capsule_insts.retain(|_, v| *v != id);
            }
        }
        self.reclaim_if_empty(m.principal, m.kind);
        self.counters.unloads += 1;
        true
    }

    // ---- invocation ----------------------------------------------------

    /// Calls entry `entry` of module `id` with `input`; actions go to `out`.
    pub fn invoke(
        &mut self,
        now: Now,
        id: ModuleId,
        entry: &str,
        input: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<i32, InvokeError> {
        self.call(now, id, entry, 0, input, 0, None, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        now: Now,
        id: ModuleId,
        entry: &str,
        arg: i32,
        input: &[u8],
        source: u32,
        capsule: Option<CapsuleCtx>,
        out: &mut Vec<Action>,
    ) -> Result<i32, InvokeError> {
        self.counters.invocations += 1;
        let cpu = self.cfg.cpu;
        let r = (|| {
            let m = self.modules.get_mut(&id).ok_or(InvokeError::NoSuchModule)?;
            m.counters.invocations += 1;
            let Some(f) = m.entries.get(entry).cloned() else {
                m.counters.unregistered_entry += 1;
                return Err(InvokeError::UnregisteredEntry(entry.into()));
            };
            let t = self.tenants.get_mut(&m.principal).ok_or(InvokeError::NoSuchModule)?;
            let space = match m.kind {
                ModuleKind::Module => t.modules.as_mut(),
                ModuleKind::Capsule => t.capsules.as_mut(),
            }
            .ok_or(InvokeError::NoSuchModule)?;
            let store = &mut space.store;
            begin_call(store, id, now, source, input, capsule);
            arm(store, cpu, m.grant.limits.cpu);
            let len = input.len() as i32;
            let r = f.call(&mut *store, (arg, len));
            let fuel = match cpu {
                CpuBound::Fuel => m.grant.limits.cpu.saturating_sub(store.get_fuel().unwrap_or(0)),
                CpuBound::Epoch { .. } => 0,
            };
            if self.invocations.len() < MAX_INVOCATION_RECORDS {
                self.invocations.push(Invocation { module: id, principal: m.principal, fuel, ok: r.is_ok() });
            }
            let d = store.data_mut();
            m.counters.log_dropped += d.call.log_dropped as u64;
            let regs = std::mem::take(&mut d.call.registrations);
            for (n, f) in regs {
                if m.entries.len() < crate::MAX_ENTRIES || m.entries.contains_key(&n) {
                    m.entries.insert(n, f);
                }
            }
            let ops = std::mem::take(&mut d.ops);
            let r = match r {
                Ok(v) => {
                    m.counters.ok += 1;
                    out.append(&mut d.call.out);
                    Ok(v)
                }
                Err(e) => {
                    let err = classify(&e, d.limiter.exceeded);
                    match err {
                        InvokeError::CpuExhausted => m.counters.cpu_exhausted += 1,
                        InvokeError::MemoryLimit => m.counters.memory_exhausted += 1,
                        _ => m.counters.traps += 1,
                    }
                    Err(err)
                }
            };
            drop_call(store);
            Ok((r, ops))
        })();
        match r {
            Ok((r, ops)) => {
                self.apply_ops(ops);
                if let Err(e) = &r {
                    *self.counters.invoke_failed.entry(e.label()).or_default() += 1;
                    debug!(module = %id, entry, error = %e, "invocation failed");
                }
                r
            }
            Err(e) => {
                *self.counters.invoke_failed.entry(e.label()).or_default() += 1;
                Err(e)
            }
        }
    }

    fn apply_ops(&mut self, ops: Vec<HostOp>) {
        for op in ops {
            match op {
                HostOp::ChannelOpened { module, handle, port, prefix } => {
                    self.channels.push(ChannelRoute { port, prefix, module, handle })
                }
                HostOp::ChannelClosed { handle } => self.channels.retain(|c| c.handle != handle),
                HostOp::AlarmSet { module, handle, deadline } => self.alarms.push(Reverse((deadline, module, handle))),
            }
        }
    }

    /// Delivers a packet for `port` from `source` to every channel whose demux
    /// spec matches (port, and payload prefix). Returns how many entries ran.
    pub fn deliver(&mut self, now: Now, source: Ipv4Addr, port: u16, payload: &[u8], out: &mut Vec<Action>) -> usize {
        let targets: Vec<(ModuleId, i32)> = self
            .channels
            .iter()
            .filter(|c| c.port == port && payload.starts_with(&c.prefix))
            .map(|c| (c.module, c.handle))
            .collect();
        let mut n = 0;
        for (module, handle) in targets {
            let Some(entry) = self.object_entry(module, handle) else { continue };
            self.counters.channel_deliveries += 1;
            let _ = self.call(now, module, &entry, handle, payload, u32::from(source), None, out);
            n += 1;
        }
        n
    }

    /// Whether any module has a channel open.
    pub fn has_channels(&self) -> bool {
        !self.channels.is_empty()
    }

    /// Whether some module's channel would take a packet for `port` with
    /// this payload (a cheap check before [`Sandbox::deliver`]).
    pub fn has_channel(&self, port: u16, payload: &[u8]) -> bool {
        self.channels.iter().any(|c| c.port == port && payload.starts_with(&c.prefix))
    }

    /// Moves the record of invocations since the last call into `into`:
    /// which module of which principal ran, and the fuel it used. The node
    /// turns them into owned executions (and, later, charges them).
    pub fn take_invocations(&mut self, into: &mut Vec<Invocation>) {
        into.append(&mut self.invocations);
    }

    fn object_entry(&self, module: ModuleId, handle: i32) -> Option<String> {
        let m = self.modules.get(&module)?;
        let t = self.tenants.get(&m.principal)?;
        let s = match m.kind {
            ModuleKind::Module => t.modules.as_ref(),
            ModuleKind::Capsule => t.capsules.as_ref(),
        }?;
        match s.store.data().handles.get(module.0, handle)? {
            Obj::Channel { entry, .. } | Obj::Alarm { entry, .. } => Some(entry.clone()),
        }
    }

    /// The earliest time [`Sandbox::handle_timeout`] has work (alarms, fetch timeouts).
    pub fn poll_at(&self) -> Option<u64> {
        let a = self.alarms.peek().map(|Reverse((d, _, _))| *d);
        let f = self.fetches.values().map(|f| f.deadline).min();
        let r = self.rechecks.peek().map(|Reverse((d, _))| *d);
        [a, f, r].into_iter().flatten().min()
    }

    /// Fires due alarms (at most [`SandboxConfig::alarms_per_poll`]), expires
    /// fetches, and unloads modules whose credentials no longer allow them.
    pub fn handle_timeout(&mut self, now: Now, out: &mut Vec<Action>) {
        self.recheck_due(now);
        let mut fired = 0;
        while fired < self.cfg.alarms_per_poll {
            let Some(Reverse((d, module, handle))) = self.alarms.peek().copied() else { break };
            if d > now.ms {
                break;
            }
            self.alarms.pop();
            let live = self.modules.get(&module).and_then(|m| {
                let t = self.tenants.get_mut(&m.principal)?;
                let s = match m.kind {
                    ModuleKind::Module => t.modules.as_mut(),
                    ModuleKind::Capsule => t.capsules.as_mut(),
                }?;
                let h = &mut s.store.data_mut().handles;
                match h.get(module.0, handle) {
                    Some(Obj::Alarm { deadline, entry }) if *deadline == d => {
                        let e = entry.clone();
                        h.remove(module.0, handle);
                        Some(e)
                    }
                    _ => None,
                }
            });
            if let Some(entry) = live {
                fired += 1;
                self.counters.alarms_fired += 1;
                let _ = self.call(now, module, &entry, handle, &[], 0, None, out);
            }
        }
        let expired: Vec<ModuleHash> =
            self.fetches.iter().filter(|(_, f)| f.deadline <= now.ms).map(|(h, _)| *h).collect();
        for h in expired {
            if let Some(f) = self.fetches.remove(&h) {
                self.counters.fetch_timeouts += 1;
                self.counters.pending_dropped += f.waiting.len() as u64;
                self.pending -= f.waiting.len();
                debug!(hash = %h, dropped = f.waiting.len(), "code fetch timed out");
            }
        }
    }

    // ---- capsules ------------------------------------------------------

    /// Handles one capsule-protocol message from neighbour `from`.
    pub fn handle_capsule(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        let r = self.capsule_inner(now, from, msg, out);
        if let Err(e) = &r {
            *self.counters.capsule_refused.entry(e.label()).or_default() += 1;
            debug!(from = %from, error = %e, "capsule refused");
        }
        r
    }

    fn capsule_inner(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        match Message::parse(msg)? {
            Message::Capsule(c) => {
                if let Some(code) = c.code {
                    let actual = ModuleHash::of(code);
                    if actual != c.hash {
                        return Err(CapsuleError::WrongHash { named: c.hash, actual });
                    }
                    return self.run_capsule(now, from, &c, code.into(), out);
                }
                let cached = self.cache.peek(&c.hash).map(|e| e.code.clone());
                match cached {
                    Some(code) => self.run_capsule(now, from, &c, code, out),
                    None => self.wait_for_code(now, from, c.hash, msg, out),
                }
            }
            Message::CodeRequest(h) => match self.cache.peek(&h) {
                Some(e) => {
                    let mut bytes = Vec::new();
                    capsule::encode_code_reply(&h, &e.code, &mut bytes)?;
                    out.push(Action::SendCapsule { principal: None, to: from, bytes });
                    self.counters.code_served += 1;
                    Ok(CapsuleOutcome::CodeServed)
                }
                None => {
                    self.counters.ignored += 1;
                    Ok(CapsuleOutcome::Ignored)
                }
            },
            Message::CodeReply { hash, code } => {
                if !self.fetches.contains_key(&hash) {
                    self.counters.ignored += 1;
                    return Ok(CapsuleOutcome::Ignored);
                }
                let actual = ModuleHash::of(code);
                if actual != hash {
                    // Keep waiting: a correct reply may still come before the timeout.
                    return Err(CapsuleError::WrongHash { named: hash, actual });
                }
                let Some(f) = self.fetches.remove(&hash) else { return Ok(CapsuleOutcome::Ignored) };
                self.pending -= f.waiting.len();
                self.counters.code_fetched += 1;
                let code: Arc<[u8]> = code.into();
                let mut results = Vec::with_capacity(f.waiting.len());
                for (prev, bytes) in f.waiting {
                    let r = match Message::parse(&bytes) {
                        Ok(Message::Capsule(c)) => self.run_capsule(now, prev, &c, code.clone(), out),
                        Ok(_) => Ok(CapsuleOutcome::Ignored),
                        Err(e) => Err(e.into()),
                    };
                    if let Err(e) = &r {
                        *self.counters.capsule_refused.entry(e.label()).or_default() += 1;
                    }
                    results.push(r.map(|o| match o {
                        CapsuleOutcome::Ran { result, .. } => result,
                        _ => 0,
                    }));
                }
                Ok(CapsuleOutcome::CodeArrived { results })
            }
        }
    }

    fn wait_for_code(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        hash: ModuleHash,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        if self.pending >= self.cfg.max_pending {
            return Err(CapsuleError::PendingFull);
        }
        self.pending += 1;
        let requested = !self.fetches.contains_key(&hash);
        let deadline = now.ms + self.cfg.fetch_timeout_ms;
        self.fetches
            .entry(hash)
            .or_insert_with(|| Fetch { deadline, waiting: Vec::new() })
            .waiting
            .push((from, msg.to_vec()));
        if requested {
            let mut bytes = Vec::new();
            capsule::encode_code_request(&hash, &mut bytes);
            out.push(Action::SendCapsule { principal: None, to: from, bytes });
            self.counters.code_requests_sent += 1;
        }
        Ok(CapsuleOutcome::Pending { hash, requested })
    }

    fn run_capsule(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        c: &Capsule<'_>,
        code: Arc<[u8]>,
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        let ins = match self.inspected_cached(&c.hash) {
            Some(i) => i,
            None => self.inspect(&code)?,
        };
        let cred = (!c.credential.is_empty()).then_some(c.credential);
        let grant = self.authorize(now, &ins, cred, None, None, RequestedLimits::default())?;
        let principal = grant.principal;
        let existing = self.tenants.get(&principal).and_then(|t| t.capsule_insts.get(&c.hash).copied());
        let id = match existing.filter(|id| self.modules.contains_key(id)) {
            Some(id) => {
                if let Some(m) = self.modules.get_mut(&id) {
                    m.grant = grant;
                }
                id
            }
            None => {
                self.maybe_recycle_capsules(principal);
                let pre = self.pre_for(&code, &ins, grant.interfaces)?;
                let id = self.instantiate(now, principal, &grant, &pre, ModuleKind::Capsule, &ins, out)?;
                if let Some(t) = self.tenants.get_mut(&principal) {
                    t.capsule_insts.insert(c.hash, id);
                }
                id
            }
        };
        let ctx = CapsuleCtx { hash: c.hash, credential: c.credential.into(), code };
        let result = self.call(now, id, c.entry, 0, c.data, u32::from(from), Some(ctx), out)?;
        self.counters.capsules_run += 1;
        Ok(CapsuleOutcome::Ran { module: id, result })
    }

    fn maybe_recycle_capsules(&mut self, principal: PrincipalId) {
        let max = self.cfg.capsule_instances;
        let Some(t) = self.tenants.get_mut(&principal) else { return };
        if t.capsules.as_ref().is_some_and(|s| s.instances >= max) {
            let ids: Vec<ModuleId> = t.capsule_insts.drain().map(|(_, id)| id).collect();
            t.capsules = None;
            for id in ids {
                self.modules.remove(&id);
                self.channels.retain(|c| c.module != id);
            }
            self.counters.capsule_store_recycles += 1;
        }
    }
}

fn forbidden(imports: &[Import], right: Interface) -> LoadError {
    let import = imports
        .iter()
        .find(|i| i.interface == Some(right))
        .map_or_else(|| format!("{}.*", right.name()), |i| format!("{}.{}", i.module, i.name));
    LoadError::ForbiddenImport { import, right: Some(right) }
}

/// Lists a module's imports and the interfaces they need; an import from no
/// host interface is refused.
fn scan_imports(code: &[u8]) -> Result<(Vec<Import>, InterfaceSet), LoadError> {
    use wasmtime::wasmparser::{Parser, Payload};
    let mut imports = Vec::new();
    let mut set = InterfaceSet::EMPTY;
    for p in Parser::new(0).parse_all(code) {
        let p = p.map_err(|e| LoadError::Malformed(e.to_string()))?;
        if let Payload::ImportSection(r) = p {
            for imp in r.into_imports() {
                let imp = imp.map_err(|e| LoadError::Malformed(e.to_string()))?;
                let interface = if imp.module == host::CORE_MODULE {
                    None
                } else {
                    match Interface::from_name(imp.module) {
                        Some(i) => Some(i),
                        None => {
                            return Err(LoadError::ForbiddenImport {
                                import: format!("{}.{}", imp.module, imp.name),
                                right: None,
                            });
                        }
                    }
                };
                if !host::is_host_function(imp.module, imp.name) {
                    return Err(LoadError::UnknownImport { import: format!("{}.{}", imp.module, imp.name) });
                }
                if let Some(i) = interface {
                    set.insert(i);
                }
                if imports.len() >= 1024 {
                    return Err(LoadError::Malformed("more than 1024 imports".into()));
                }
                imports.push(Import { module: imp.module.into(), name: imp.name.into(), interface });
            }
        }
    }
    Ok((imports, set))
}

fn begin_call(
    store: &mut Store<TenantState>,
    id: ModuleId,
    now: Now,
    source: u32,
    input: &[u8],
    capsule: Option<CapsuleCtx>,
) {
    let d = store.data_mut();
    d.call.module = id.0;
    d.call.now_ms = now.ms;
    d.call.source = source;
    d.call.input.clear();
    d.call.input.extend_from_slice(input);
    d.call.out.clear();
    d.call.sends = 0;
    d.call.capsule = capsule;
    d.call.log_dropped = 0;
    d.limiter.exceeded = false;
}

fn drop_call(store: &mut Store<TenantState>) {
    let d = store.data_mut();
    d.call.out.clear();
    d.call.capsule = None;
    d.call.registrations.clear();
    d.ops.clear();
}

fn arm(store: &mut Store<TenantState>, cpu: CpuBound, fuel: u64) {
    match cpu {
        CpuBound::Fuel => {
            // Only fails when fuel is not enabled, which CpuBound::Fuel guarantees.
            let _ = store.set_fuel(fuel);
        }
        CpuBound::Epoch { ticks } => store.set_epoch_deadline(ticks),
    }
}

fn classify(e: &wasmtime::Error, mem_exceeded: bool) -> InvokeError {
    if mem_exceeded {
        return InvokeError::MemoryLimit;
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) | Some(Trap::Interrupt) => InvokeError::CpuExhausted,
        Some(t) => InvokeError::Trap(t.to_string()),
        None => InvokeError::Trap(format!("{e:#}")),
    }
}
