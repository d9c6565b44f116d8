//! Pods (Expert §3): protected modules with private memory and state,
//! entered by binding, run on their caller's budget.
//!
//! A pod is a WebAssembly module instantiated in a [`Store`] of its own (its
//! own linear memory, globals and tables), on an engine of its own. It has no
//! thread and no entry the node calls: it runs only when a client (a module,
//! or another pod) calls it through the `pod` host interface:
//!
//! - `pod.bind(name_ptr, name_len, buf_ptr, buf_len) -> binding` (phase 1,
//!   Expert Fig. 2 stage 1): the binder checks the client's right to the
//!   named offer (`<pod>.<entry>`) and gives it a *temporary* binding: an
//!   index into the client's own binding table. No pod code runs.
//! - the first `pod.call(binding, 0)` is delivered to the pod's `pod_bind`
//!   export as a bind request (stage 2.1) with the client's particulars; the
//!   pod may refuse (the binding goes) or return a per-client state word,
//!   kept in the binding record and passed to every later call; the binding
//!   is then full (stage 2.3).
//! - later `pod.call(binding, in_len) -> out_len` copy `in_len` bytes of the
//!   client's buffer (negotiated at bind: the client's region, bounded by the
//!   pod's buffer) into the pod's buffer, run the offer's entry
//!   `(state, in_len) -> out_len`, and copy `out_len` bytes back.
//! - `pod.unbind(binding)` frees the slot; if the binding was full and the
//!   pod exports `pod_unbind(state)`, that runs first, on the caller's
//!   budget, so the pod can free the client's state. A client that goes
//!   away (its module unloaded) has its full bindings unbound the same way,
//!   on the pod's own per-call `cpu`.
//!
//! Invariants:
//! - A pod never sees its caller's memory, nor the caller its pod's: the host
//!   copies the argument bytes between two stores; there is no shared memory.
//! - Binding identifiers are `generation << 16 | slot` in a per-client table
//!   of at most [`MAX_BINDINGS`] entries: another client's identifier, a made
//!   up one, or one used after unbind is not found in the caller's table and
//!   the call returns [`E_BADID`] before any pod code runs.
//! - Time is charged to the caller (thread tunnelling): a call may spend at
//!   most the caller's remaining fuel and the pod's per-call `cpu`, and what it
//!   spends is taken from the caller's fuel, so the caller's invocation record
//!   (and through it the caller's session and VP) pays.
//! - A pod instance is never re-entered: while it runs it is out of the hub,
//!   and a call that reaches it (recursion, a cycle of pods) gets [`E_BUSY`].
//! - A pod that traps or is cut off is restored by its declared [`OnFault`]
//!   policy before anyone can call it again. After a reset, bindings to the
//!   old instance are dropped ([`E_GONE`]) because the per-client state they
//!   name is gone; after a rollback the instance is the one from before the
//!   call (memory and every mutable global), so bindings stay.
//! - Nesting stops at [`MAX_DEPTH`] pods ([`E_DEPTH`]).
//!
//! See `docs/pods.md`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Weak};

use anode_cred::PrincipalId;
use wasmtime::{
    Caller, Config, Engine, Extern, Global, InstancePre, Linker, Memory, Module, Mutability, Store, Trap, TypedFunc,
    Val,
};

use crate::handles::HandleTable;
use crate::heap::SharedHeap;
use crate::host::{E_CONTEXT, E_INVAL, E_LIMIT, E_NOTFOUND, MemLimiter};

/// Deepest nesting of pod calls: a module's call runs its pod at depth 1, and
/// a pod at depth `MAX_DEPTH` cannot call another.
pub const MAX_DEPTH: u32 = 4;
/// Bindings one client (module or pod) may hold at once.
pub const MAX_BINDINGS: usize = 64;
/// Largest argument or result buffer, bytes.
pub const MAX_ARG: usize = 64 * 1024;
/// Smallest buffer a pod may offer (it must hold a bind request).
pub const MIN_POD_BUFFER: usize = 64;
/// Longest pod name and longest entry name, bytes.
pub const MAX_NAME: usize = 24;
/// Pods one hub holds.
pub const MAX_PODS: usize = 256;
/// Fuel charged for each host call a pod makes (as the sandbox's
/// `DEFAULT_HOST_CALL_FUEL` for modules).
pub const POD_HOST_CALL_FUEL: u64 = 500;
/// Largest wasm stack of a pod. Pods run on their caller's native stack (as
/// in Expert, §3.5), [`MAX_DEPTH`] deep, so each gets a quarter of a
/// module's 256 KiB.
pub const POD_WASM_STACK: usize = 64 * 1024;
/// Length of a bind request: principal (32), client kind (1), client id (4,
/// big-endian), entry name length (1), entry name.
pub const BIND_INFO_FIXED: usize = 38;

/// The binding is not in the caller's table: forged, another client's, or
/// used after unbind.
pub const E_BADID: i32 = -10;
/// The bind was refused: by the offer's access list at phase 1, or by the
/// pod's `pod_bind` at phase 2 (the binding is gone).
pub const E_REFUSED: i32 = -11;
/// The pod is running (a re-entrant or cyclic call).
pub const E_BUSY: i32 = -12;
/// The call would nest deeper than [`MAX_DEPTH`].
pub const E_DEPTH: i32 = -13;
/// The pod was cut off: it spent the call's budget. It has been restored.
pub const E_CPU: i32 = -14;
/// The pod trapped. It has been restored.
pub const E_TRAP: i32 = -15;
/// The pod returned an error (negative) or a length beyond the buffer.
pub const E_POD: i32 = -16;
/// The pod was unloaded or restored since the bind: the binding is dropped;
/// bind again.
pub const E_GONE: i32 = -17;
/// The caller has less fuel left than the pod's `min_fuel`: the pod was not
/// entered.
pub const E_SHORT: i32 = -18;

/// A hasher for the hub's maps on every pod call, whose keys are small
/// integers the node assigns (pod ids, module ids), never chosen by a
/// client: FxHash's multiply-rotate instead of SipHash, which the call path
/// paid four times per call (docs/benchmarks.md, "Pods").
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_isize(&mut self, n: isize) {
        self.write_u64(n as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A map keyed by node-assigned ids.
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A loaded pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u32);

impl core::fmt::Display for PodId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// Who calls a pod: a module (by [`crate::ModuleId`] number) or a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// A loaded module.
    Module(u32),
    /// A pod calling another pod.
    Pod(u32),
}

/// What happens to a pod that traps or is cut off mid-call (Expert §3.4:
/// "forced failure of the whole component", rollback, shadow copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFault {
    /// Throw the instance away and instantiate the pod again from its code:
    /// its memory and globals are as after its first instantiation, and
    /// every binding to it is dropped (their per-client state is gone).
    #[default]
    Reset,
    /// Unload the pod: every later call gets [`E_GONE`].
    Retire,
    /// A checked rollback: the pod's memory and mutable globals are copied
    /// before every call and put back after a fault, then the pod's optional
    /// `pod_check` export (`() -> i32`, 0 for consistent) runs on the caller's
    /// account; the instance and every binding stay. When the memory grew
    /// during the faulting call, or the check fails, traps or overruns, the
    /// pod is reset instead. Loaded only if the node can capture all of the
    /// pod's mutable state ([`rollback_check`]). Costs a copy of the pod's
    /// memory per call.
    Rollback,
}

/// Why a pod was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PodError {
    /// Refused by the module loader (size, signature, credential, imports).
    #[error("pod refused by the loader: {0}")]
    Load(#[from] crate::LoadError),
    /// The credential does not grant the `pod` interface.
    #[error("the credential does not grant the pod interface")]
    NotGranted,
    /// The pod imports something other than the `pod` interface.
    #[error("a pod may import only the pod interface, not {0}")]
    ForbiddenImport(String),
    /// The pod or entry name is empty, too long or has other characters than `[A-Za-z0-9_-]`.
    #[error("bad pod or offer name {0:?}")]
    BadName(String),
    /// A pod of that name is loaded.
    #[error("a pod named {0:?} is loaded")]
    NameTaken(String),
    /// The hub holds [`MAX_PODS`] pods.
    #[error("too many pods")]
    TooMany,
    /// The code does not compile.
    #[error("pod does not compile: {0}")]
    Compile(String),
    /// A required export is missing or has the wrong type.
    #[error("pod export {0} missing or of the wrong type")]
    Export(String),
    /// The pod offers no `offer.<name>` entry.
    #[error("pod offers no entry")]
    NoOffers,
    /// The pod's buffer is smaller than [`MIN_POD_BUFFER`], larger than
    /// [`MAX_ARG`], or outside its memory.
    #[error("pod buffer at {ptr} of {len} bytes is not usable")]
    Buffer {
        /// Its address.
        ptr: i64,
        /// Its length.
        len: i64,
    },
    /// Instantiation failed (start function trapped or overran, memory cap).
    #[error("pod instantiation failed: {0}")]
    Instantiate(String),
    /// [`OnFault::Rollback`] was asked for a pod whose mutable state the node
    /// cannot capture (see [`rollback_check`]).
    #[error("pod cannot be rolled back: {0}")]
    NoRollback(String),
}

/// What a pod's loader decided: the hub's part of a load.
#[derive(Debug, Clone)]
pub struct PodLoad<'a> {
    /// The pod's name: offers are `<name>.<entry>`.
    pub name: &'a str,
    /// Whose pod it is (its credential's principal).
    pub principal: PrincipalId,
    /// The wasm binary.
    pub code: &'a [u8],
    /// Most fuel one call (or the instantiation) may use.
    pub cpu: u64,
    /// Most linear memory, bytes.
    pub memory: usize,
    /// Principals that may bind (`None`: any whose credential grants `pod`).
    pub clients: Option<Vec<PrincipalId>>,
    /// What to do when it traps or is cut off.
    pub on_fault: OnFault,
    /// Fuel a caller must have left for a call to enter the pod (0: none).
    /// A pod whose state is shared by clients should set it to at least its
    /// longest call: otherwise a client calling with almost no fuel left can
    /// cut the pod off mid-update, and the reset that follows drops every
    /// other client's binding.
    pub min_fuel: u64,
}

/// Per-pod counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    /// Temporary bindings handed out.
    pub binds: u64,
    /// Bind requests the pod accepted (full bindings).
    pub accepted: u64,
    /// Bind requests the pod refused.
    pub refused: u64,
    /// Binds refused by the access list.
    pub denied: u64,
    /// Calls run (bind requests included).
    pub calls: u64,
    /// Calls cut off by their budget.
    pub cut_off: u64,
    /// Calls that trapped.
    pub traps: u64,
    /// Times the pod was reset (re-instantiated), by its policy or after a
    /// rollback that could not be done.
    pub resets: u64,
    /// Faults undone by a checked rollback (the instance and bindings kept).
    pub rollbacks: u64,
    /// Rollbacks that could not be done (the memory grew, `pod_check`
    /// failed): the pod was reset instead.
    pub rollback_failed: u64,
    /// Calls refused because the pod was running.
    pub busy: u64,
    /// Calls refused because the caller had less than `min_fuel` left.
    pub short: u64,
    /// `pod_unbind` runs (a client unbound, or went away, with a full
    /// binding).
    pub unbinds: u64,
    /// Full bindings dropped without `pod_unbind`, because the pod was
    /// running at the time (a cycle of pods) or was restored since.
    pub unbinds_missed: u64,
    /// Fuel spent in the pod, charged to its callers.
    pub fuel: u64,
}

/// Hub-wide counters of refusals that belong to no pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HubCounters {
    /// Calls or unbinds with an identifier not in the caller's table.
    pub bad_binding: u64,
    /// Binds refused because the caller's table was full.
    pub table_full: u64,
    /// Binds naming no loaded offer.
    pub no_offer: u64,
    /// Calls refused by the nesting limit.
    pub too_deep: u64,
    /// Calls on a binding whose pod was unloaded or restored.
    pub gone: u64,
}

/// A pod as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Its id.
    pub id: PodId,
    /// Its name.
    pub name: String,
    /// Its principal.
    pub principal: PrincipalId,
    /// Its entries (offers are `<name>.<entry>`).
    pub offers: Vec<String>,
    /// Its fault policy.
    pub on_fault: OnFault,
    /// How many principals its access list names (`None`: any principal
    /// whose module's credential grants `pod`).
    pub clients: Option<usize>,
    /// Its buffer length.
    pub buffer: u32,
    /// Its counters.
    pub counters: PodCounters,
}

/// The data of a pod's store.
pub struct PodState {
    hub: Weak<HubLock>,
    pod: PodId,
    /// Whose pod it is (fixed at load).
    principal: PrincipalId,
    depth: u32,
    limiter: MemLimiter,
    /// Its exported memory, once instantiated.
    memory: Option<Memory>,
}

/// A store's view of itself as a pod client: the hub, who it is, whose it
/// is, and how deep it runs.
pub(crate) trait PodClient {
    /// Takes one host call's fuel off the caller's store (the `pod`
    /// functions call it on their way back).
    fn charge_call(c: &mut Caller<'_, Self>)
    where
        Self: Sized;
    fn pod_client(&self) -> Option<(Arc<HubLock>, Client, PrincipalId, u32)>;
    /// Runs `f` on the binder, borrowed: a module's store holds it and
    /// lends it without touching its reference count (two atomic
    /// operations a call saved); a pod's store holds it weakly and
    /// upgrades. `None` without a binder.
    fn with_hub<R>(&self, f: impl FnOnce(&HubLock) -> R) -> Option<R>;
    /// Who calls: the client, its principal, and how deep it runs.
    fn who(&self) -> (Client, PrincipalId, u32);
    /// The memory of the instance making the call, when the store knows it
    /// without a lookup by name.
    fn caller_memory(&self) -> Option<Memory>;
}

impl PodClient for PodState {
    fn charge_call(c: &mut Caller<'_, Self>) {
        if let Ok(f) = c.get_fuel() {
            let _ = c.set_fuel(f.saturating_sub(POD_HOST_CALL_FUEL));
        }
    }
    fn pod_client(&self) -> Option<(Arc<HubLock>, Client, PrincipalId, u32)> {
        Some((self.hub.upgrade()?, Client::Pod(self.pod.0), self.principal, self.depth))
    }
    fn with_hub<R>(&self, f: impl FnOnce(&HubLock) -> R) -> Option<R> {
        self.hub.upgrade().map(|h| f(&h))
    }
    fn who(&self) -> (Client, PrincipalId, u32) {
        (Client::Pod(self.pod.0), self.principal, self.depth)
    }
    fn caller_memory(&self) -> Option<Memory> {
        self.memory
    }
}

impl PodClient for crate::host::TenantState {
    fn charge_call(c: &mut Caller<'_, Self>) {
        crate::host::charge_host(c);
    }
    fn pod_client(&self) -> Option<(Arc<HubLock>, Client, PrincipalId, u32)> {
        Some((self.pods.clone()?, Client::Module(self.call.module), self.principal, 0))
    }
    fn with_hub<R>(&self, f: impl FnOnce(&HubLock) -> R) -> Option<R> {
        self.pods.as_deref().map(f)
    }
    fn who(&self) -> (Client, PrincipalId, u32) {
        (Client::Module(self.call.module), self.principal, 0)
    }
    fn caller_memory(&self) -> Option<Memory> {
        self.call.memory
    }
}

type Offer = TypedFunc<(i32, i32), i32>;

/// A pod's running instance.
struct Live {
    store: Store<PodState>,
    memory: Memory,
    bind: TypedFunc<i32, i32>,
    offers: Vec<Offer>,
    buf: (usize, usize),
    /// The pod's optional `pod_unbind(state)`.
    unbind: Option<TypedFunc<i32, ()>>,
    /// With [`OnFault::Rollback`]: the state before the running call.
    snapshot: Option<Snapshot>,
}

/// What a rollback puts back: the pod's memory and its mutable globals as
/// they were before the call. Kept with the instance; its buffers are reused
/// call after call.
struct Snapshot {
    globals: Vec<Global>,
    values: Vec<Val>,
    memory: Vec<u8>,
    check: Option<TypedFunc<(), i32>>,
}

impl Snapshot {
    fn take(&mut self, memory: &Memory, store: &mut Store<PodState>) {
        self.memory.clear();
        self.memory.extend_from_slice(memory.data(&*store));
        self.values.clear();
        for g in &self.globals {
            self.values.push(g.get(&mut *store));
        }
    }

    /// Puts the state back; false if it cannot (the memory grew).
    fn restore(&self, memory: &Memory, store: &mut Store<PodState>) -> bool {
        let data = memory.data_mut(&mut *store);
        if data.len() != self.memory.len() {
            return false;
        }
        data.copy_from_slice(&self.memory);
        self.globals.iter().zip(&self.values).all(|(g, v)| g.set(&mut *store, *v).is_ok())
    }
}

/// Whether the node can capture all of a pod's mutable state, which
/// [`OnFault::Rollback`] needs: every mutable global it defines must be
/// exported (a wasm host can read only exported globals; Rust's
/// `__stack_pointer` is exported with `-C link-arg=--export=__stack_pointer`),
/// it may import no global, and its code may not change a table or drop a
/// segment (`table.set`, `table.grow`, `table.fill`, `table.copy`,
/// `table.init`, `elem.drop`, `data.drop`), since neither can be copied
/// back. Memory is copied whole.
///
/// # Errors
/// What stands in the way, or a parse error of `code`.
pub fn rollback_check(code: &[u8]) -> Result<(), String> {
    use wasmtime::wasmparser::{ExternalKind, Operator, Parser, Payload};
    let mut mutable = Vec::new();
    let mut exported = std::collections::HashSet::new();
    for payload in Parser::new(0).parse_all(code) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(r) => {
                for i in r.into_imports() {
                    if let wasmtime::wasmparser::TypeRef::Global(_) = i.map_err(|e| e.to_string())?.ty {
                        return Err("it imports a global".into());
                    }
                }
            }
            Payload::GlobalSection(r) => {
                for (i, g) in r.into_iter().enumerate() {
                    if g.map_err(|e| e.to_string())?.ty.mutable {
                        mutable.push(i as u32);
                    }
                }
            }
            Payload::ExportSection(r) => {
                for e in r {
                    let e = e.map_err(|e| e.to_string())?;
                    if e.kind == ExternalKind::Global {
                        exported.insert(e.index);
                    }
                }
            }
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(|e| e.to_string())?;
                while !ops.eof() {
                    let op = ops.read().map_err(|e| e.to_string())?;
                    let what = match op {
                        Operator::TableSet { .. } => "table.set",
                        Operator::TableGrow { .. } => "table.grow",
                        Operator::TableFill { .. } => "table.fill",
                        Operator::TableCopy { .. } => "table.copy",
                        Operator::TableInit { .. } => "table.init",
                        Operator::ElemDrop { .. } => "elem.drop",
                        Operator::DataDrop { .. } => "data.drop",
                        _ => continue,
                    };
                    return Err(format!("its code uses {what}"));
                }
            }
            _ => {}
        }
    }
    match mutable.iter().find(|i| !exported.contains(i)) {
        Some(i) => Err(format!("mutable global {i} is not exported")),
        None => Ok(()),
    }
}

struct Pod {
    name: String,
    principal: PrincipalId,
    pre: InstancePre<PodState>,
    entries: Vec<String>,
    clients: Option<Vec<PrincipalId>>,
    on_fault: OnFault,
    cpu: u64,
    min_fuel: u64,
    memory: usize,
    /// Its owner's heap account (RCANE §IV-E): its store's memories and
    /// tables are charged there, within the owner's session reservation.
    heap: Option<SharedHeap>,
    /// Bumped on every restore: bindings to an older instance are gone.
    epoch: u64,
    /// `None` while a call runs in it. Boxed: it moves out of the hub and
    /// back on every call.
    live: Option<Box<Live>>,
    buf_len: usize,
    counters: PodCounters,
}

#[derive(Debug, Clone)]
struct Binding {
    pod: PodId,
    epoch: u64,
    offer: usize,
    /// The client's region: (offset, length) in its memory.
    region: (u32, u32),
    /// `None` while temporary; the pod's per-client state once full.
    state: Option<i32>,
}

/// The pod binder's lock. The call path only ever takes it with `try_lock`
/// (a module's call that finds it held, which only a re-entrant call could,
/// gets `E_CONTEXT`), and a spin mutex releases it with a plain store where
/// `std::sync::Mutex` swaps atomically to look for waiters: two locked
/// instructions less per pod call (docs/benchmarks.md, "Pods", run H).
pub type HubLock = spin::mutex::SpinMutex<PodHub>;

/// The pod binder and every loaded pod of a sandbox. Shared
/// (`Arc<HubLock>`) by the stores whose modules call pods; the lock is
/// never held while pod code runs.
pub struct PodHub {
    engine: Engine,
    linker: Linker<PodState>,
    me: Weak<HubLock>,
    pods: IdMap<PodId, Pod>,
    names: HashMap<String, PodId>,
    tables: IdMap<Client, HandleTable<Binding>>,
    next: u32,
    counters: HubCounters,
}

impl core::fmt::Debug for PodHub {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PodHub").field("pods", &self.pods.len()).field("clients", &self.tables.len()).finish()
    }
}

/// Whether `s` is a usable pod or entry name.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Splits an offer name `<pod>.<entry>`.
pub fn parse_offer(s: &str) -> Option<(&str, &str)> {
    let (pod, entry) = s.split_once('.')?;
    (valid_name(pod) && valid_name(entry)).then_some((pod, entry))
}

/// The hub could not build its engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot set up the pod engine: {0}")]
pub struct HubSetupError(pub String);

impl PodHub {
    /// A hub with no pods, shared.
    ///
    /// # Errors
    /// When wasmtime refuses the engine configuration.
    pub fn shared() -> Result<Arc<HubLock>, HubSetupError> {
        let mut c = Config::new();
        c.consume_fuel(true);
        c.max_wasm_stack(POD_WASM_STACK);
        c.native_unwind_info(false);
        crate::perf_map_if_asked(&mut c);
        let engine = Engine::new(&c).map_err(|e| HubSetupError(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        define_pod(&mut linker).map_err(|e| HubSetupError(format!("{e:#}")))?;
        Ok(Arc::new_cyclic(|me| {
            HubLock::new(PodHub {
                engine,
                linker,
                me: me.clone(),
                pods: IdMap::default(),
                names: HashMap::new(),
                tables: IdMap::default(),
                next: 1,
                counters: HubCounters::default(),
            })
        }))
    }

    /// Compiles and instantiates a pod whose loader has decided its
    /// credential. Its start function (if any) runs under `cpu`.
    ///
    /// # Errors
    /// See [`PodError`]; nothing is kept on error.
    ///
    /// # DoS
    /// `code` is untrusted: compiling is bounded by the loader's size limit,
    /// the start function by `cpu` and `memory`.
    pub fn load(&mut self, spec: &PodLoad<'_>) -> Result<PodId, PodError> {
        self.load_charged(spec, None)
    }

    /// [`PodHub::load`], the pod's memories and tables charged to `heap`
    /// (its owner's account: the sandbox's loader).
    pub(crate) fn load_charged(&mut self, spec: &PodLoad<'_>, heap: Option<SharedHeap>) -> Result<PodId, PodError> {
        if !valid_name(spec.name) {
            return Err(PodError::BadName(spec.name.into()));
        }
        if self.names.contains_key(spec.name) {
            return Err(PodError::NameTaken(spec.name.into()));
        }
        if self.pods.len() >= MAX_PODS {
            return Err(PodError::TooMany);
        }
        let module = Module::from_binary(&self.engine, spec.code).map_err(|e| PodError::Compile(format!("{e:#}")))?;
        let mut entries = Vec::new();
        for e in module.exports() {
            if let Some(n) = e.name().strip_prefix("offer.") {
                if !valid_name(n) {
                    return Err(PodError::BadName(e.name().into()));
                }
                entries.push(n.to_string());
            }
        }
        if entries.is_empty() {
            return Err(PodError::NoOffers);
        }
        if spec.on_fault == OnFault::Rollback {
            rollback_check(spec.code).map_err(PodError::NoRollback)?;
        }
        let pre = self.linker.instantiate_pre(&module).map_err(|e| PodError::Instantiate(format!("{e:#}")))?;
        let id = PodId(self.next);
        let live =
            self.instantiate(id, spec.principal, &pre, &entries, (spec.cpu, spec.memory, heap.clone()), spec.on_fault)?;
        self.next = self.next.wrapping_add(1).max(1);
        let buf_len = live.buf.1;
        self.names.insert(spec.name.into(), id);
        self.pods.insert(
            id,
            Pod {
                name: spec.name.into(),
                principal: spec.principal,
                pre,
                entries,
                clients: spec.clients.clone(),
                on_fault: spec.on_fault,
                cpu: spec.cpu,
                min_fuel: spec.min_fuel,
                memory: spec.memory,
                heap,
                epoch: 0,
                live: Some(live),
                buf_len,
                counters: PodCounters::default(),
            },
        );
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)] // a pod's particulars, kept apart in `Pod`
    fn instantiate(
        &self,
        id: PodId,
        principal: PrincipalId,
        pre: &InstancePre<PodState>,
        entries: &[String],
        (cpu, memory, heap): (u64, usize, Option<SharedHeap>),
        on_fault: OnFault,
    ) -> Result<Box<Live>, PodError> {
        let data = PodState {
            hub: self.me.clone(),
            pod: id,
            principal,
            depth: 0,
            limiter: MemLimiter::for_pod(memory, heap),
            memory: None,
        };
        let mut store = Store::new(&self.engine, data);
        store.limiter(|d| &mut d.limiter);
        // No call hook: a pod's only host functions are `pod.*`, which
        // charge its host-call fuel themselves (`PodClient::charge_call`);
        // a hook would run on every entry to the pod and every return.
        let _ = store.set_fuel(cpu);
        let inst = pre.instantiate(&mut store).map_err(|e| PodError::Instantiate(format!("{e:#}")))?;
        let memory = inst.get_memory(&mut store, "memory").ok_or_else(|| PodError::Export("memory".into()))?;
        store.data_mut().memory = Some(memory);
        let bind =
            inst.get_typed_func::<i32, i32>(&mut store, "pod_bind").map_err(|_| PodError::Export("pod_bind".into()))?;
        let mut offers = Vec::with_capacity(entries.len());
        for e in entries {
            let name = format!("offer.{e}");
            offers.push(inst.get_typed_func::<(i32, i32), i32>(&mut store, &name).map_err(|_| PodError::Export(name))?);
        }
        let ptr_f = inst
            .get_typed_func::<(), i32>(&mut store, "pod_buffer")
            .map_err(|_| PodError::Export("pod_buffer".into()))?;
        let len_f = inst
            .get_typed_func::<(), i32>(&mut store, "pod_buffer_len")
            .map_err(|_| PodError::Export("pod_buffer_len".into()))?;
        let (ptr, len) = match (ptr_f.call(&mut store, ()), len_f.call(&mut store, ())) {
            (Ok(p), Ok(l)) => (p, l),
            (Err(e), _) | (_, Err(e)) => return Err(PodError::Instantiate(format!("{e:#}"))),
        };
        let bad = PodError::Buffer { ptr: i64::from(ptr), len: i64::from(len) };
        let (Ok(p), Ok(l)) = (usize::try_from(ptr), usize::try_from(len)) else { return Err(bad) };
        if !(MIN_POD_BUFFER..=MAX_ARG).contains(&l) || p.checked_add(l).is_none_or(|end| end > memory.data_size(&store))
        {
            return Err(bad);
        }
        let snapshot = (on_fault == OnFault::Rollback).then(|| {
            let globals: Vec<Global> = inst
                .exports(&mut store)
                .filter_map(|e| e.into_global())
                .collect::<Vec<_>>()
                .into_iter()
                .filter(|g| g.ty(&store).mutability() == Mutability::Var)
                .collect();
            let check = inst.get_typed_func::<(), i32>(&mut store, "pod_check").ok();
            Snapshot { values: Vec::with_capacity(globals.len()), globals, memory: Vec::new(), check }
        });
        let unbind = inst.get_typed_func::<i32, ()>(&mut store, "pod_unbind").ok();
        Ok(Box::new(Live { store, memory, bind, offers, buf: (p, l), unbind, snapshot }))
    }

    /// Unloads a pod. Bindings to it fail with [`E_GONE`] at their next use.
    pub fn unload(&mut self, id: PodId) -> bool {
        match self.pods.remove(&id) {
            Some(p) => {
                self.names.remove(&p.name);
                self.tables.remove(&Client::Pod(id.0));
                true
            }
            None => false,
        }
    }

    /// The pod named `name`.
    pub fn by_name(&self, name: &str) -> Option<PodId> {
        self.names.get(name).copied()
    }

    /// Every pod, by id.
    pub fn list(&self) -> Vec<PodInfo> {
        let mut v: Vec<PodInfo> = self
            .pods
            .iter()
            .map(|(id, p)| PodInfo {
                id: *id,
                name: p.name.clone(),
                principal: p.principal,
                offers: p.entries.clone(),
                on_fault: p.on_fault,
                clients: p.clients.as_ref().map(Vec::len),
                buffer: p.buf_len as u32,
                counters: p.counters,
            })
            .collect();
        v.sort_by_key(|i| i.id);
        v
    }

    /// Hub-wide refusal counters.
    pub fn counters(&self) -> HubCounters {
        self.counters
    }

    /// Bindings `client` holds.
    pub fn bindings_of(&self, client: Client) -> usize {
        self.tables.get(&client).map_or(0, HandleTable::len)
    }

    /// Clients holding a binding table.
    pub fn clients(&self) -> usize {
        self.tables.len()
    }

    /// Forgets a client's bindings (the module was unloaded). Each full
    /// binding is unbound in its pod (`pod_unbind`, under the pod's own
    /// per-call `cpu`, with the binder locked: it cannot call other pods).
    pub fn forget_client(&mut self, client: Client) {
        let Some(table) = self.tables.remove(&client) else { return };
        for (_, _, b) in table.iter() {
            let Some(begun) = self.unbind_begin(b) else { continue };
            let Some(mut live) = self.pods.get_mut(&begun.pod).and_then(|p| p.live.take()) else { continue };
            let ran = run_pod(&mut live, &begun, 0, begun.cap, &[]);
            self.finish(client, &begun, live, &ran);
        }
    }

    /// Whether binding `b`, being removed, should have `pod_unbind` run: it
    /// is full, its pod is the instance it was made with and has the export.
    /// Counts an unbind the pod misses because it is running.
    fn unbind_begin(&mut self, b: &Binding) -> Option<Begun> {
        let state = b.state?;
        let pod = self.pods.get_mut(&b.pod).filter(|p| p.epoch == b.epoch)?;
        match pod.live.as_ref() {
            Some(l) if l.unbind.is_none() => return None,
            Some(_) => {}
            None => {
                pod.counters.unbinds_missed += 1;
                return None;
            }
        }
        pod.counters.unbinds += 1;
        Some(Begun { binding: 0, pod: b.pod, offer: UNBIND, state: Some(state), region: (0, 0), cap: pod.cpu })
    }

    /// Phase 1: a temporary binding of `client` to the offer `name`, if the
    /// offer's access list admits `principal` and the client's table has room.
    pub fn bind(&mut self, client: Client, principal: PrincipalId, name: &str, region: (u32, u32)) -> i32 {
        let Some((pod_name, entry)) = parse_offer(name) else {
            self.counters.no_offer += 1;
            return E_NOTFOUND;
        };
        let Some(&id) = self.names.get(pod_name) else {
            self.counters.no_offer += 1;
            return E_NOTFOUND;
        };
        let Some(pod) = self.pods.get_mut(&id) else { return E_NOTFOUND };
        let Some(offer) = pod.entries.iter().position(|e| e == entry) else {
            self.counters.no_offer += 1;
            return E_NOTFOUND;
        };
        if pod.clients.as_ref().is_some_and(|l| !l.contains(&principal)) {
            pod.counters.denied += 1;
            return E_REFUSED;
        }
        let table = self.tables.entry(client).or_insert_with(|| HandleTable::new(MAX_BINDINGS));
        match table.insert(0, Binding { pod: id, epoch: pod.epoch, offer, region, state: None }) {
            Some(h) => {
                pod.counters.binds += 1;
                h
            }
            None => {
                self.counters.table_full += 1;
                E_LIMIT
            }
        }
    }

    /// Removes a binding of `client`; a full one whose pod exports
    /// `pod_unbind` is returned with the pod's instance taken out, for the
    /// caller to run it (the binder is not locked while pod code runs).
    fn unbind_take(&mut self, client: Client, binding: i32) -> Result<Option<(Begun, Box<Live>)>, i32> {
        let Some(b) = self.tables.get_mut(&client).and_then(|t| t.remove(0, binding)) else {
            self.counters.bad_binding += 1;
            return Err(E_BADID);
        };
        let Some(begun) = self.unbind_begin(&b) else { return Ok(None) };
        let live = self.pods.get_mut(&begun.pod).and_then(|p| p.live.take());
        Ok(live.map(|l| (begun, l)))
    }

    /// The checks before a call, then the pod's instance taken out.
    fn begin(
        &mut self,
        client: Client,
        binding: i32,
        depth: u32,
        caller_fuel: Option<u64>,
    ) -> Result<(Begun, Box<Live>), i32> {
        let Some(table) = self.tables.get_mut(&client) else {
            self.counters.bad_binding += 1;
            return Err(E_BADID);
        };
        let Some(b) = table.get(0, binding) else {
            self.counters.bad_binding += 1;
            return Err(E_BADID);
        };
        if depth >= MAX_DEPTH {
            self.counters.too_deep += 1;
            return Err(E_DEPTH);
        }
        let Some(pod) = self.pods.get_mut(&b.pod).filter(|p| p.epoch == b.epoch) else {
            self.counters.gone += 1;
            table.remove(0, binding);
            return Err(E_GONE);
        };
        if caller_fuel.is_some_and(|f| f < pod.min_fuel) {
            pod.counters.short += 1;
            return Err(E_SHORT);
        }
        let Some(live) = pod.live.take() else {
            pod.counters.busy += 1;
            return Err(E_BUSY);
        };
        pod.counters.calls += 1;
        let n = (b.region.1 as usize).min(pod.buf_len);
        let begun = Begun {
            binding,
            pod: b.pod,
            offer: b.offer,
            state: b.state,
            region: (b.region.0 as usize, n),
            cap: pod.cpu,
        };
        Ok((begun, live))
    }

    /// Puts the instance back (or restores the pod after a fault) and
    /// updates the binding.
    fn finish(&mut self, client: Client, begun: &Begun, live: Box<Live>, outcome: &Ran) {
        let Some(pod) = self.pods.get_mut(&begun.pod) else { return };
        pod.counters.fuel += outcome.used;
        let fault = matches!(outcome.result, Err(E_CPU) | Err(E_TRAP));
        match outcome.result {
            Err(E_CPU) => pod.counters.cut_off += 1,
            Err(E_TRAP) => pod.counters.traps += 1,
            _ => {}
        }
        if begun.state.is_none() {
            let accepted = matches!(outcome.result, Ok(s) if s >= 0);
            if let Some(t) = self.tables.get_mut(&client) {
                if accepted {
                    if let (Some(b), Ok(s)) = (t.get_mut(0, begun.binding), outcome.result) {
                        b.state = Some(s);
                    }
                } else {
                    t.remove(0, begun.binding);
                }
            }
            if accepted {
                pod.counters.accepted += 1;
            } else if !fault {
                pod.counters.refused += 1;
            }
        }
        if !fault || outcome.rolled_back == Some(true) {
            if fault {
                pod.counters.rollbacks += 1;
            }
            pod.live = Some(live);
            return;
        }
        drop(live);
        if outcome.rolled_back == Some(false) {
            pod.counters.rollback_failed += 1;
        }
        match pod.on_fault {
            OnFault::Reset | OnFault::Rollback => {
                // The new instance knows none of the old one's bindings either.
                self.tables.remove(&Client::Pod(begun.pod.0));
                let Some(pod) = self.pods.get_mut(&begun.pod) else { return };
                pod.epoch += 1;
                pod.counters.resets += 1;
                let (pre, entries, limits, on_fault, principal) = (
                    pod.pre.clone(),
                    pod.entries.clone(),
                    (pod.cpu, pod.memory, pod.heap.clone()),
                    pod.on_fault,
                    pod.principal,
                );
                match self.instantiate(begun.pod, principal, &pre, &entries, limits, on_fault) {
                    Ok(l) => {
                        if let Some(p) = self.pods.get_mut(&begun.pod) {
                            p.live = Some(l);
                        }
                    }
                    Err(_) => {
                        self.unload(begun.pod);
                    }
                }
            }
            OnFault::Retire => {
                self.unload(begun.pod);
            }
        }
    }
}

/// [`Begun::offer`] of a `pod_unbind` run.
const UNBIND: usize = usize::MAX;

/// A call under way: what [`PodHub::begin`] found.
struct Begun {
    binding: i32,
    pod: PodId,
    offer: usize,
    state: Option<i32>,
    /// The client's region offset, and the negotiated length.
    region: (usize, usize),
    cap: u64,
}

/// What running the pod gave: its result (an `E_*` code for faults) and the
/// fuel it used.
struct Ran {
    result: Result<i32, i32>,
    used: u64,
    /// After a fault of a pod with [`OnFault::Rollback`]: whether the
    /// rollback (and its check) succeeded.
    rolled_back: Option<bool>,
}

/// After a fault: puts the pod's state back as it was before the call and
/// runs its `pod_check` under `budget`. Whether the pod may be kept, and the
/// fuel the check used.
fn roll_back(live: &mut Live, budget: u64) -> (bool, u64) {
    let Some(s) = live.snapshot.as_ref() else { return (false, 0) };
    if !s.restore(&live.memory, &mut live.store) {
        return (false, 0);
    }
    let Some(check) = s.check.clone() else { return (true, 0) };
    let _ = live.store.set_fuel(budget);
    let ok = matches!(check.call(&mut live.store, ()), Ok(0));
    (ok, budget.saturating_sub(live.store.get_fuel().unwrap_or(0)))
}

/// The caller's memory: the one its store recorded for the running
/// instance, or its export by name.
pub(crate) fn caller_memory<T: PodClient>(c: &mut Caller<'_, T>) -> Option<Memory> {
    if let Some(m) = c.data().caller_memory() {
        return Some(m);
    }
    match c.get_export("memory") {
        Some(Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

/// The bind request the pod's `pod_bind` reads from its buffer.
fn bind_info(principal: PrincipalId, client: Client, entry: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(BIND_INFO_FIXED + entry.len());
    v.extend_from_slice(&principal.0);
    let (kind, id) = match client {
        Client::Module(m) => (0u8, m),
        Client::Pod(p) => (1u8, p),
    };
    v.push(kind);
    v.extend_from_slice(&id.to_be_bytes());
    v.push(entry.len() as u8);
    v.extend_from_slice(entry.as_bytes());
    v
}

/// Runs the bind request or the call in the pod's own store: copies `input`
/// into its buffer and runs under `budget`. A result beyond the negotiated
/// length is `E_POD`; the result bytes stay in the pod's buffer.
fn run_pod(live: &mut Live, b: &Begun, depth: u32, budget: u64, input: &[u8]) -> Ran {
    let (p, l) = live.buf;
    let n = input.len();
    if let Some(s) = live.snapshot.as_mut() {
        s.take(&live.memory, &mut live.store);
    }
    match live.memory.data_mut(&mut live.store).get_mut(p..p + l.min(n)).filter(|d| d.len() == n) {
        Some(dst) => dst.copy_from_slice(input),
        None => return Ran { result: Err(E_POD), used: 0, rolled_back: None },
    }
    live.store.data_mut().depth = depth + 1;
    let _ = live.store.set_fuel(budget);
    let r = match (b.state, live.offers.get(b.offer)) {
        (Some(s), _) if b.offer == UNBIND => match live.unbind.as_ref() {
            Some(f) => f.call(&mut live.store, s).map(|()| 0),
            None => Ok(0),
        },
        (None, _) => live.bind.call(&mut live.store, n as i32),
        (Some(s), Some(f)) => f.call(&mut live.store, (s, n as i32)),
        (Some(_), None) => Ok(E_POD),
    };
    let used = budget.saturating_sub(live.store.get_fuel().unwrap_or(0));
    let result = match r {
        Ok(v) if b.state.is_some() && v >= 0 && v as usize > b.region.1.min(l) => Ok(E_POD),
        Ok(v) => Ok(v),
        Err(e) => match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Err(E_CPU),
            _ => Err(E_TRAP),
        },
    };
    // A rollback is done here, with the instance out of the hub (the
    // binder is not locked while pod code runs), and its check is paid by
    // the caller like the call itself.
    let (rolled_back, used) = match result {
        Err(E_CPU | E_TRAP) if live.snapshot.is_some() => {
            let (ok, check) = roll_back(live, b.cap);
            (Some(ok), used.saturating_add(check))
        }
        _ => (None, used),
    };
    Ran { result, used, rolled_back }
}

/// `pod.call(binding, in_len) -> out_len | E_*`.
fn call<T: PodClient>(c: &mut Caller<'_, T>, binding: i32, in_len: i32) -> i32 {
    let fuel = c.get_fuel().ok();
    let r = call_with(c, binding, in_len, fuel).0;
    T::charge_call(c);
    r
}

/// [`call`] with the caller's fuel already read: the status, and the
/// caller's fuel after the call.
fn call_with<T: PodClient>(
    c: &mut Caller<'_, T>,
    binding: i32,
    in_len: i32,
    caller_fuel: Option<u64>,
) -> (i32, Option<u64>) {
    let (client, principal, depth) = c.data().who();
    let begun = c.data().with_hub(|hub| match hub.try_lock() {
        Some(mut h) => h.begin(client, binding, depth, caller_fuel).map(|(b, l)| {
            // A bind request carries the client's particulars.
            let info = b.state.is_none().then(|| {
                let entry = h.pods.get(&b.pod).and_then(|p| p.entries.get(b.offer)).map_or("", String::as_str);
                bind_info(principal, client, entry)
            });
            (b, l, info)
        }),
        None => Err(E_CONTEXT),
    });
    let (begun, mut live, info) = match begun {
        Some(Ok(b)) => b,
        Some(Err(e)) => return (e, caller_fuel),
        None => return (E_CONTEXT, caller_fuel),
    };
    // Thread tunnelling: the pod runs on what is left of the caller's fuel
    // (at most the pod's per-call cpu), and the caller pays what it used.
    let budget = caller_fuel.map_or(begun.cap, |f| f.min(begun.cap));
    let (off, n) = begun.region;
    let memory = caller_memory(c);
    // The argument bytes go straight from the caller's memory into the
    // pod's buffer. Nothing else of the caller reaches the pod.
    let ran = match (&info, memory) {
        (Some(i), _) => Some(run_pod(&mut live, &begun, depth, budget, i)),
        (None, Some(m)) => usize::try_from(in_len)
            .ok()
            .filter(|&len| len <= n)
            .and_then(|len| m.data(&*c).get(off..off.checked_add(len)?))
            .map(|src| run_pod(&mut live, &begun, depth, budget, src)),
        (None, None) => None,
    };
    let Some(ran) = ran else {
        // A bad length or region: the pod was not entered.
        let _ = c.data().with_hub(|hub| {
            if let Some(mut h) = hub.try_lock() {
                h.finish(client, &begun, live, &Ran { result: Ok(0), used: 0, rolled_back: None });
            }
        });
        return (E_INVAL, caller_fuel);
    };
    // The result, straight from the pod's buffer into the caller's region.
    let mut status = match (begun.state, ran.result) {
        (None, Ok(s)) if s >= 0 => 0,
        (None, Ok(_)) => E_REFUSED,
        (_, Err(e)) => e,
        (Some(_), Ok(v)) if v < 0 => E_POD,
        (Some(_), Ok(v)) => v,
    };
    if begun.state.is_some() && status > 0 {
        let (p, len) = (live.buf.0, status as usize);
        let src = live.memory.data(&live.store).get(p..p + len);
        let dst = memory.and_then(|m| m.data_mut(&mut *c).get_mut(off..off + len));
        match (src, dst) {
            (Some(s), Some(d)) => d.copy_from_slice(s),
            _ => status = E_INVAL,
        }
    }
    let after = caller_fuel.map(|f| f.saturating_sub(ran.used));
    if let Some(f) = after {
        let _ = c.set_fuel(f);
    }
    let _ = c.data().with_hub(|hub| {
        if let Some(mut h) = hub.try_lock() {
            h.finish(client, &begun, live, &ran);
        }
    });
    (status, after)
}

/// `pod.bind(name_ptr, name_len, buf_ptr, buf_len) -> binding | E_*`.
fn bind<T: PodClient>(c: &mut Caller<'_, T>, np: i32, nl: i32, bp: i32, bl: i32) -> i32 {
    let r = bind_inner(c, np, nl, bp, bl);
    T::charge_call(c);
    r
}

fn bind_inner<T: PodClient>(c: &mut Caller<'_, T>, np: i32, nl: i32, bp: i32, bl: i32) -> i32 {
    let Some((hub, client, principal, _)) = c.data().pod_client() else { return E_CONTEXT };
    let (Ok(np), Ok(nl), Ok(bp), Ok(bl)) =
        (usize::try_from(np), usize::try_from(nl), u32::try_from(bp), u32::try_from(bl))
    else {
        return E_INVAL;
    };
    if nl > 2 * MAX_NAME + 1 || bl == 0 || bl as usize > MAX_ARG {
        return E_INVAL;
    }
    let Some(m) = caller_memory(c) else { return E_INVAL };
    let data = m.data(&*c);
    let Some(name) = np.checked_add(nl).and_then(|e| data.get(np..e)) else { return E_INVAL };
    let Ok(name) = std::str::from_utf8(name).map(str::to_string) else { return E_INVAL };
    // The client's region must lie in its memory now (it cannot shrink).
    if (bp as usize).checked_add(bl as usize).is_none_or(|e| e > data.len()) {
        return E_INVAL;
    }
    match hub.try_lock() {
        Some(mut h) => h.bind(client, principal, &name, (bp, bl)),
        None => E_CONTEXT,
    }
}

/// Defines the `pod` import module for modules. With `yields` (their
/// stores yield at preemption points), `pod.call` is itself a preemption
/// point once the caller has spent a slice's fuel since the last one:
/// charging the caller resets wasmtime's fuel slice, so without this a module
/// that spends its time in pods would never reach one.
pub(crate) fn define_for_modules(
    l: &mut Linker<crate::host::TenantState>,
    yields: Option<u64>,
) -> wasmtime::Result<()> {
    let Some(every) = yields else { return define_pod(l) };
    l.func_wrap_async(
        "pod",
        "bind",
        |mut c: Caller<'_, crate::host::TenantState>, (np, nl, bp, bl): (i32, i32, i32, i32)| {
            let r = bind(&mut c, np, nl, bp, bl);
            Box::new(async move { r })
        },
    )?;
    l.func_wrap_async("pod", "call", move |mut c: Caller<'_, crate::host::TenantState>, (b, len): (i32, i32)| {
        let fuel = c.get_fuel().ok();
        let (r, left) = call_with(&mut c, b, len, fuel);
        crate::host::charge_host(&mut c);
        let (before, after) = (fuel.unwrap_or(0), left.unwrap_or(0));
        let d = c.data_mut();
        // A mark below the fuel left is from an earlier invocation.
        if d.pod_mark < before {
            d.pod_mark = before;
        }
        let point = d.pod_mark.saturating_sub(after) >= every;
        if point {
            d.pod_mark = after;
        }
        if point {
            Box::new(async move {
                YieldOnce(false).await;
                r
            }) as Box<dyn core::future::Future<Output = i32> + Send>
        } else {
            // The common case: no allocation for the future.
            STATUS.with(|s| s.set(r));
            Box::new(Status)
        }
    })?;
    l.func_wrap_async("pod", "unbind", |mut c: Caller<'_, crate::host::TenantState>, (b,): (i32,)| {
        let r = unbind(&mut c, b);
        Box::new(async move { r })
    })?;
    Ok(())
}

std::thread_local! {
    /// The status of the `pod.call` this thread has just made, for the
    /// [`Status`] future that wasmtime polls at once, on this thread,
    /// before any other host function of it can run.
    static STATUS: core::cell::Cell<i32> = const { core::cell::Cell::new(0) };
}

/// A future ready at first poll with the status in [`STATUS`]: `pod.call`'s
/// result when the call is not a preemption point. It is zero-sized, so
/// the box wasmtime's asynchronous host functions return costs no
/// allocation (a `malloc` and a `free` per call otherwise).
struct Status;

impl core::future::Future for Status {
    type Output = i32;
    fn poll(self: core::pin::Pin<&mut Self>, _: &mut core::task::Context<'_>) -> core::task::Poll<i32> {
        core::task::Poll::Ready(STATUS.with(core::cell::Cell::get))
    }
}

/// A future that is pending once: a preemption point inside a host call.
struct YieldOnce(bool);

impl core::future::Future for YieldOnce {
    type Output = ();
    fn poll(mut self: core::pin::Pin<&mut Self>, cx: &mut core::task::Context<'_>) -> core::task::Poll<()> {
        if self.0 {
            return core::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        core::task::Poll::Pending
    }
}

/// `pod.unbind(binding) -> 0 | E_*`: the binding goes; a full one first
/// runs the pod's `pod_unbind(state)`, if it has one, on the caller's budget
/// (charged to the caller like a call; its faults restore the pod by its
/// policy, and the unbind still succeeds).
fn unbind<T: PodClient>(c: &mut Caller<'_, T>, b: i32) -> i32 {
    let r = unbind_inner(c, b);
    T::charge_call(c);
    r
}

fn unbind_inner<T: PodClient>(c: &mut Caller<'_, T>, b: i32) -> i32 {
    let Some((hub, client, _, depth)) = c.data().pod_client() else { return E_CONTEXT };
    let caller_fuel = c.get_fuel().ok();
    let taken = match hub.try_lock() {
        Some(mut h) => h.unbind_take(client, b),
        None => return E_CONTEXT,
    };
    let (begun, mut live) = match taken {
        Ok(Some(t)) => t,
        Ok(None) => return 0,
        Err(e) => return e,
    };
    let budget = caller_fuel.map_or(begun.cap, |f| f.min(begun.cap));
    let ran = run_pod(&mut live, &begun, depth, budget, &[]);
    if let Some(f) = caller_fuel {
        let _ = c.set_fuel(f.saturating_sub(ran.used));
    }
    if let Some(mut h) = hub.try_lock() {
        h.finish(client, &begun, live, &ran);
    }
    0
}

/// Defines the `pod` import module in `l` (synchronous calls).
pub(crate) fn define_pod<T: PodClient + Send + 'static>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap("pod", "bind", |mut c: Caller<'_, T>, np: i32, nl: i32, bp: i32, bl: i32| -> i32 {
        bind(&mut c, np, nl, bp, bl)
    })?;
    l.func_wrap("pod", "call", |mut c: Caller<'_, T>, b: i32, len: i32| -> i32 { call(&mut c, b, len) })?;
    l.func_wrap("pod", "unbind", |mut c: Caller<'_, T>, b: i32| -> i32 { unbind(&mut c, b) })?;
    Ok(())
}
