//! The Core: host interfaces as wasm imports, and thinned linkers.
//!
//! Each interface is a wasm import module (`log`, `route`, `net`, `time`,
//! `state`, `marshal`). [`linker_for`] defines exactly the interfaces a grant
//! allows, plus the always-present `anode` module (entry registration and
//! input). Host functions return `i32`/`i64` status codes: `>= 0` success,
//! [`E_INVAL`] bad argument or out-of-bounds pointer, [`E_SMALL`] output
//! buffer too small, [`E_LIMIT`] a limit was reached, [`E_NOTFOUND`] no such
//! object or key, [`E_CONTEXT`] not available in this invocation,
//! [`E_DENIED`] the module's credential does not grant it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use anode_cred::{Interface, InterfaceSet, ModuleHash, PrincipalId};
use wasmtime::{Caller, Engine, Extern, Linker, Memory, ResourceLimiter, TypedFunc};

/// A registered entry function: `(arg, input_len) -> status`.
pub(crate) type Entry = TypedFunc<(i32, i32), i32>;

use crate::capsule::{Capsule, valid_entry};
use crate::handles::HandleTable;
use crate::heap::{self, HANDLE_BYTES, Part, STATE_ENTRY_BYTES, SharedHeap, TABLE_ELEMENT_BYTES};
use crate::marshal;
use crate::state::SoftState;
use crate::{Action, ModuleId, Routes};

/// Bad argument, or a pointer/length outside the module's memory.
pub const E_INVAL: i32 = -1;
/// The output buffer is too small.
pub const E_SMALL: i32 = -2;
/// A limit was reached (rate, count, size, memory).
pub const E_LIMIT: i32 = -3;
/// No such object or key.
pub const E_NOTFOUND: i32 = -4;
/// Not available in this invocation (e.g. forwarding outside a capsule).
pub const E_CONTEXT: i32 = -5;
/// The module's credential does not grant it (a channel whose filter could
/// match traffic outside its `channel` grants).
pub const E_DENIED: i32 = -6;

/// Host-side limits applied inside host functions.
#[derive(Debug, Clone, Copy)]
pub struct HostLimits {
    /// Log messages per second per module (token bucket refill).
    pub log_per_sec: u32,
    /// Log burst per module.
    pub log_burst: u32,
    /// Longest log message, bytes (longer ones are cut).
    pub log_max: usize,
    /// Packets a single invocation may send.
    pub sends_per_invocation: u32,
    /// Largest packet payload a module may send.
    pub max_payload: usize,
    /// Channels per principal.
    pub channels: usize,
    /// Pending alarms per principal.
    pub alarms: usize,
    /// Longest demux prefix.
    pub max_prefix: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            log_per_sec: 10,
            log_burst: 20,
            log_max: 256,
            sends_per_invocation: 16,
            max_payload: 1400,
            channels: 16,
            alarms: 64,
            max_prefix: 16,
        }
    }
}

/// An object a module holds a handle to.
#[derive(Debug, Clone)]
pub(crate) enum Obj {
    Channel { entry: String, keyed: bool },
    Alarm { deadline: u64, entry: String },
}

impl Obj {
    /// What the handle costs its session's heap: [`HANDLE_BYTES`], and a
    /// keyed channel's share table.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Obj::Channel { keyed: true, .. } => HANDLE_BYTES + crate::demux::SHARE_TABLE_BYTES,
            _ => HANDLE_BYTES,
        }
    }
}

/// Changes the sandbox must mirror in its demux and timer indexes.
#[derive(Debug)]
pub(crate) enum HostOp {
    ChannelOpened {
        module: ModuleId,
        handle: i32,
        spec: crate::demux::DemuxSpec,
        vp: u8,
    },
    /// An open refused by the module's channel grants (counted).
    ChannelRefused,
    ChannelClosed {
        module: ModuleId,
        handle: i32,
    },
    AlarmSet {
        module: ModuleId,
        handle: i32,
        deadline: u64,
    },
}

/// The capsule being run, for `net.forward_capsule`.
#[derive(Debug, Clone)]
pub(crate) struct CapsuleCtx {
    pub hash: ModuleHash,
    pub credential: Arc<[u8]>,
    pub code: Arc<[u8]>,
}

/// Per-invocation context.
#[derive(Default)]
pub(crate) struct CallCtx {
    pub module: u32,
    pub now_ms: u64,
    pub source: u32,
    /// The channel packet's sub-flow (`net.subflow`), 0 otherwise.
    pub subflow: u64,
    pub input: Vec<u8>,
    pub out: Vec<Action>,
    pub sends: u32,
    pub registrations: Vec<(String, Entry)>,
    pub capsule: Option<CapsuleCtx>,
    pub log_dropped: u32,
    /// Whether this invocation already asked for a heap change.
    pub heap_asked: bool,
    /// The invoked instance's exported memory, when it has one: host
    /// calls use it instead of looking the export up by name each time.
    pub memory: Option<Memory>,
}

struct LogBucket {
    tokens: u32,
    last_ms: u64,
}

/// Memory accounting for one store: the sum of its linear memories (and
/// tables), charged to its principal's heap account too (`crate::heap`).
pub(crate) struct MemLimiter {
    /// This store's own cap (its principal's credentials' `memory`), used
    /// while the account holds no session reservation.
    pub cap: usize,
    /// Linear memory bytes this store holds.
    pub used: usize,
    /// Table bytes this store holds.
    pub tables: usize,
    pub exceeded: bool,
    /// The principal's account (`None`: a store charged to no one, such as a
    /// pod hub's own tests).
    pub heap: Option<SharedHeap>,
    /// Whether `cap` applies even while the account holds a reservation
    /// (a pod: its credential's memory is its own bound, and its owner's
    /// session reservation bounds it too).
    pub cap_always: bool,
}

impl MemLimiter {
    /// A limiter of `cap` bytes for a store charged to `heap`.
    pub fn new(cap: usize, heap: Option<SharedHeap>) -> MemLimiter {
        MemLimiter { cap, used: 0, tables: 0, exceeded: false, heap, cap_always: false }
    }

    /// A pod's limiter: `cap` always, and its owner's account `heap`.
    pub fn for_pod(cap: usize, heap: Option<SharedHeap>) -> MemLimiter {
        let mut l = MemLimiter::new(cap, heap);
        l.cap_always = true;
        l
    }

    /// Charges `bytes` more of `part`: to the session's reservation when
    /// the account has one, else to this store's own cap (linear memory
    /// only, as before sessions: tables are bounded by their element count).
    fn grow(&mut self, part: Part, bytes: usize) -> bool {
        let over_cap = part == Part::Memory && self.used.saturating_add(bytes) > self.cap;
        let ok = match &self.heap {
            Some(h) => heap::with(h, |a| {
                if over_cap && (self.cap_always || !a.reserved()) {
                    a.refuse();
                    false
                } else if a.reserved() {
                    a.charge(part, bytes)
                } else {
                    a.force(part, bytes);
                    true
                }
            }),
            None => !over_cap,
        };
        if !ok {
            self.exceeded = true;
            return false;
        }
        match part {
            Part::Tables => self.tables += bytes,
            _ => self.used += bytes,
        }
        true
    }
}

impl Drop for MemLimiter {
    /// The store's memories and tables go with it: give them back.
    fn drop(&mut self) {
        if let Some(h) = &self.heap {
            heap::with(h, |a| {
                a.release(Part::Memory, self.used);
                a.release(Part::Tables, self.tables);
            });
        }
    }
}

impl ResourceLimiter for MemLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(self.grow(Part::Memory, desired.saturating_sub(current)))
    }
    fn table_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        // Tables are small and fixed in practice; bound them anyway.
        if desired > 100_000 {
            self.exceeded = true;
            return Ok(false);
        }
        let bytes = desired.saturating_sub(current).saturating_mul(TABLE_ELEMENT_BYTES);
        Ok(self.grow(Part::Tables, bytes))
    }
    fn instances(&self) -> usize {
        100_000
    }
    fn memories(&self) -> usize {
        100_000
    }
    fn tables(&self) -> usize {
        100_000
    }
}

/// The data of one principal's store.
pub(crate) struct TenantState {
    pub principal: PrincipalId,
    pub limiter: MemLimiter,
    pub call: CallCtx,
    pub handles: HandleTable<Obj>,
    pub state: Arc<Mutex<SoftState>>,
    pub routes: Arc<dyn Routes>,
    pub limits: HostLimits,
    pub ops: Vec<HostOp>,
    logs: HashMap<u32, LogBucket>,
    /// The pod binder, for the `pod` interface (docs/pods.md).
    pub pods: Option<Arc<crate::pods::HubLock>>,
    /// Fuel left at the last pod call that was a preemption point.
    pub pod_mark: u64,
    /// Preemption points passed by this store's invocations, counted by
    /// [`Sandbox::resume`](crate::Sandbox::resume) (shared: the store is
    /// inside its task's future while it runs).
    pub yield_count: Arc<std::sync::atomic::AtomicU64>,
    /// Host-call fuel charged but not yet taken off the store's fuel:
    /// taking it off (`set_fuel`) restarts wasmtime's yield interval, so
    /// it is done at most once per preemption point (see `new_space`).
    pub fuel_owed: u64,
    /// `yield_count` when the owed fuel was last taken off.
    pub fuel_paid_at: u64,
    /// Fuel each host call costs (`SandboxConfig::host_call_fuel`; 0:
    /// free), taken by [`charge_host`] in every host function.
    pub host_call_fuel: u64,
    /// Whether the store yields every so much fuel (then owed host-call
    /// fuel is taken off once per preemption point, see [`charge_host`]).
    pub yields: bool,
    /// The principal's heap account (`crate::heap`), shared by its stores.
    pub heap: SharedHeap,
    /// What each of its modules' credentials lets it open channels for.
    pub channel_auth: HashMap<u32, anode_cred::ChannelAuthority>,
    /// The principal's channel transmit reservations (`crate::txbook`),
    /// shared with the sandbox, which the node reads.
    pub tx: Arc<Mutex<crate::txbook::TxBook>>,
    /// Handle bytes this store has charged to `heap`.
    handles_charged: usize,
}

impl Drop for TenantState {
    /// The store's handles go with it.
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.handles_charged);
        heap::with(&self.heap, |a| a.release(Part::Handles, b));
    }
}

impl TenantState {
    pub fn new(
        principal: PrincipalId,
        mem_cap: usize,
        heap: SharedHeap,
        state: Arc<Mutex<SoftState>>,
        routes: Arc<dyn Routes>,
        limits: HostLimits,
    ) -> TenantState {
        TenantState {
            principal,
            limiter: MemLimiter::new(mem_cap, Some(heap.clone())),
            call: CallCtx::default(),
            handles: HandleTable::new(limits.channels + limits.alarms),
            state,
            routes,
            limits,
            ops: Vec::new(),
            logs: HashMap::new(),
            pods: None,
            pod_mark: 0,
            yield_count: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            fuel_owed: 0,
            fuel_paid_at: 0,
            host_call_fuel: 0,
            yields: false,
            heap,
            channel_auth: HashMap::new(),
            tx: Arc::default(),
            handles_charged: 0,
        }
    }

    /// Charges one more handle of `bytes` ([`Obj::bytes`]) to the heap;
    /// `false` (a refusal counted) if it does not fit in the session's
    /// reservation.
    fn charge_handle(&mut self, bytes: usize) -> bool {
        let ok = heap::with(&self.heap, |a| a.charge(Part::Handles, bytes));
        if ok {
            self.handles_charged += bytes;
        }
        ok
    }

    /// Brings the heap's handle charge in step with the live handles (after
    /// handles went: closed, fired, their module unloaded).
    pub(crate) fn sync_handles(&mut self) {
        let want = self.handles.iter().map(|(_, _, o)| o.bytes()).fold(0usize, usize::saturating_add);
        let have = self.handles_charged;
        heap::with(&self.heap, |a| {
            if want > have {
                a.force(Part::Handles, want - have);
            } else {
                a.release(Part::Handles, have - want);
            }
        });
        self.handles_charged = want;
    }

    fn count_objs(&self, channel: bool) -> usize {
        self.handles.iter().filter(|(_, _, o)| matches!(o, Obj::Channel { .. }) == channel).count()
    }
}

type C<'a> = Caller<'a, TenantState>;

/// Charges one host call to the calling module's store: every host
/// function a module may import calls this (a call hook did it before, at
/// the price of two hook dispatches on every host call). `set_fuel`
/// restarts wasmtime's yield interval: done at every host call, a module
/// calling the host more often than once per interval would never reach a
/// preemption point. So the cost is owed, and taken off at the first host
/// call after each preemption point; a debt larger than what is left ends
/// the invocation at once.
#[inline]
pub(crate) fn charge_host(c: &mut C<'_>) {
    let cost = c.data().host_call_fuel;
    if cost == 0 {
        return;
    }
    let Ok(f) = c.get_fuel() else { return };
    let d = c.data_mut();
    d.fuel_owed = d.fuel_owed.saturating_add(cost);
    let y = d.yield_count.load(std::sync::atomic::Ordering::Relaxed);
    let owed = d.fuel_owed;
    if owed >= f {
        d.fuel_owed = 0;
        // Out of fuel: the next check in wasm stops it.
        let _ = c.set_fuel(0);
    } else if !d.yields || y != d.fuel_paid_at {
        d.fuel_owed = 0;
        d.fuel_paid_at = y;
        let _ = c.set_fuel(f - owed);
    }
}

/// The calling instance's memory (the one recorded for the invocation,
/// or its export by name): the same lookup as a pod caller's.
fn memory(c: &mut C<'_>) -> Option<Memory> {
    crate::pods::caller_memory(c)
}

/// Copies `len` bytes at `ptr` out of the module's memory (at most `max`).
fn read(c: &mut C<'_>, ptr: i32, len: i32, max: usize) -> Option<Vec<u8>> {
    let (ptr, len) = (usize::try_from(ptr).ok()?, usize::try_from(len).ok()?);
    if len > max {
        return None;
    }
    let m = memory(c)?;
    let data = m.data(&*c);
    data.get(ptr..ptr.checked_add(len)?).map(<[u8]>::to_vec)
}

/// Copies `src` into the module's memory at `ptr` if it fits in `cap`.
fn write(c: &mut C<'_>, ptr: i32, cap: i32, src: &[u8]) -> i32 {
    let (Ok(p), Ok(cap)) = (usize::try_from(ptr), usize::try_from(cap)) else { return E_INVAL };
    if src.len() > cap {
        return E_SMALL;
    }
    let Some(m) = memory(c) else { return E_INVAL };
    let data = m.data_mut(&mut *c);
    match p.checked_add(src.len()).and_then(|e| data.get_mut(p..e)) {
        Some(dst) => {
            dst.copy_from_slice(src);
            src.len() as i32
        }
        None => E_INVAL,
    }
}

fn read_str(c: &mut C<'_>, ptr: i32, len: i32, max: usize) -> Option<String> {
    String::from_utf8(read(c, ptr, len, max)?).ok()
}

fn to_addr(a: i32) -> Ipv4Addr {
    Ipv4Addr::from(a as u32)
}

/// A linker with exactly the granted interfaces.
///
/// Every host function defined here calls [`charge_host`] first (the
/// host-call fuel of RCANE I; a module store has no call hook): a new one
/// must too.
pub(crate) fn linker_for(engine: &Engine, granted: InterfaceSet) -> wasmtime::Result<Linker<TenantState>> {
    let mut l = Linker::new(engine);
    define_core(&mut l)?;
    define_session(&mut l)?;
    for i in granted.iter() {
        match i {
            Interface::Log => define_log(&mut l)?,
            Interface::Route => define_route(&mut l)?,
            Interface::Net => define_net(&mut l)?,
            Interface::Time => define_time(&mut l)?,
            Interface::State => define_state(&mut l)?,
            Interface::Marshal => define_marshal(&mut l)?,
            // Defined by the loader, which knows whether calls may yield (`crate::pods`).
            Interface::Pod => {}
        }
    }
    Ok(l)
}

/// Name of the always-present core import module.
pub const CORE_MODULE: &str = "anode";

/// Name of the always-present session import module (`session.heap_*`):
/// a module may always ask about and for its own session's heap, which its
/// session credential's ceiling and the node's admission bound.
pub const SESSION_MODULE: &str = "session";

/// Every host function, by import module: what a module may import at all.
pub const FUNCTIONS: &[(&str, &[&str])] = &[
    (CORE_MODULE, &["register", "input_read"]),
    (SESSION_MODULE, &["heap_request", "heap_reserved", "heap_used"]),
    ("log", &["write"]),
    ("route", &["this_host", "next_hop"]),
    (
        "net",
        &[
            "send",
            "deliver_local",
            "source",
            "subflow",
            "forward_capsule",
            "open_channel",
            "open_channel_spec",
            "close_channel",
            "channel_tx",
            "channel_send",
        ],
    ),
    ("time", &["now_ms", "set_alarm", "cancel_alarm"]),
    ("state", &["put", "get", "remove"]),
    ("marshal", &["encode", "field", "count"]),
    ("pod", &["bind", "call", "unbind"]),
];

/// Whether `module.name` is a host function.
pub fn is_host_function(module: &str, name: &str) -> bool {
    FUNCTIONS.iter().any(|(m, fs)| *m == module && fs.contains(&name))
}

fn define_core(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // register(name_ptr, name_len, table_index) -> 0 | error
    l.func_wrap(CORE_MODULE, "register", |mut c: C<'_>, np: i32, nl: i32, idx: i32| -> i32 {
        charge_host(&mut c);
        let Some(name) = read_str(&mut c, np, nl, crate::capsule::MAX_ENTRY) else { return E_INVAL };
        if !valid_entry(&name) || idx < 0 {
            return E_INVAL;
        }
        if c.data().call.registrations.len() >= crate::MAX_ENTRIES {
            return E_LIMIT;
        }
        let Some(Extern::Table(t)) = c.get_export("__indirect_function_table") else { return E_CONTEXT };
        let Some(r) = t.get(&mut c, idx as u64) else { return E_INVAL };
        let Some(Some(f)) = r.as_func() else { return E_INVAL };
        let f = *f;
        let Ok(tf) = f.typed::<(i32, i32), i32>(&c) else { return E_INVAL };
        c.data_mut().call.registrations.push((name, tf));
        0
    })?;
    // input_read(ptr, cap, offset) -> bytes copied
    l.func_wrap(CORE_MODULE, "input_read", |mut c: C<'_>, ptr: i32, cap: i32, off: i32| -> i32 {
        charge_host(&mut c);
        let Ok(off) = usize::try_from(off) else { return E_INVAL };
        let input = std::mem::take(&mut c.data_mut().call.input);
        let chunk = input.get(off..).unwrap_or(&[]);
        let n = chunk.len().min(usize::try_from(cap).unwrap_or(0));
        let r = write(&mut c, ptr, n as i32, &chunk[..n]);
        c.data_mut().call.input = input;
        r
    })?;
    Ok(())
}

fn define_session(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // heap_request(bytes) -> 0 asked | E_INVAL | E_LIMIT below current
    // use (pressure is flagged) or already asked in this invocation. The
    // node's admission control decides, for the principal's session
    // (within its credential's ceiling and the node's heap capacity; a
    // principal without a session is refused); the answer is the
    // reservation `heap_reserved` returns from then on.
    l.func_wrap(SESSION_MODULE, "heap_request", |mut c: C<'_>, bytes: i64| -> i32 {
        charge_host(&mut c);
        let Ok(bytes) = u64::try_from(bytes) else { return E_INVAL };
        let d = c.data_mut();
        let used = heap::with(&d.heap, |a| a.used());
        if d.call.heap_asked {
            return E_LIMIT;
        }
        if usize::try_from(bytes).unwrap_or(usize::MAX) < used {
            // Shrinking below use is refused; the pressure entry is called
            // so the module can free, then ask again.
            heap::with(&d.heap, |a| {
                a.refuse();
                a.flag_pressure();
            });
            return E_LIMIT;
        }
        d.call.heap_asked = true;
        d.call.out.push(Action::HeapRequest { principal: d.principal, module: ModuleId(d.call.module), bytes });
        0
    })?;
    // heap_reserved() -> the session's heap reservation, bytes | E_CONTEXT none
    l.func_wrap(SESSION_MODULE, "heap_reserved", |mut c: C<'_>| -> i64 {
        charge_host(&mut c);
        heap::with(&c.data().heap, |a| a.reservation()).map_or(i64::from(E_CONTEXT), |r| r as i64)
    })?;
    // heap_used() -> bytes charged to the principal's heap
    l.func_wrap(SESSION_MODULE, "heap_used", |mut c: C<'_>| -> i64 {
        charge_host(&mut c);
        heap::with(&c.data().heap, |a| a.used()) as i64
    })?;
    Ok(())
}

fn define_log(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // write(ptr, len) -> 0 logged | E_LIMIT dropped by the rate limit
    l.func_wrap("log", "write", |mut c: C<'_>, ptr: i32, len: i32| -> i32 {
        charge_host(&mut c);
        let max = c.data().limits.log_max;
        let len = len.min(max as i32);
        let Some(bytes) = read(&mut c, ptr, len, max) else { return E_INVAL };
        let d = c.data_mut();
        let (module, now) = (d.call.module, d.call.now_ms);
        let (per_sec, burst) = (d.limits.log_per_sec, d.limits.log_burst);
        let b = d.logs.entry(module).or_insert(LogBucket { tokens: burst, last_ms: now });
        let refill = (now.saturating_sub(b.last_ms) * per_sec as u64 / 1000) as u32;
        if refill > 0 {
            b.tokens = (b.tokens + refill).min(burst);
            b.last_ms = now;
        }
        if b.tokens == 0 {
            d.call.log_dropped += 1;
            return E_LIMIT;
        }
        b.tokens -= 1;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        d.call.out.push(Action::Log { module: ModuleId(module), principal: d.principal, text });
        0
    })?;
    Ok(())
}

fn define_route(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    l.func_wrap("route", "this_host", |mut c: C<'_>| -> i32 {
        charge_host(&mut c);
        u32::from(c.data().routes.this_host()) as i32
    })?;
    // next_hop(dst) -> neighbour address as u32 in an i64 | -1 no route
    l.func_wrap("route", "next_hop", |mut c: C<'_>, dst: i32| -> i64 {
        charge_host(&mut c);
        match c.data().routes.next_hop(to_addr(dst)) {
            Some(a) => u32::from(a) as i64,
            None => -1,
        }
    })?;
    Ok(())
}

fn send_budget(c: &mut C<'_>, len: i32) -> Result<(), i32> {
    let d = c.data();
    if len < 0 || len as usize > d.limits.max_payload {
        return Err(E_INVAL);
    }
    if d.call.sends >= d.limits.sends_per_invocation {
        return Err(E_LIMIT);
    }
    Ok(())
}

/// Handle `h` as a transmit flow, if it is an open channel of the calling
/// module (`net.channel_tx`, `net.channel_send`).
fn channel_flow(d: &TenantState, h: i32) -> Option<crate::txbook::Flow> {
    let module = d.call.module;
    matches!(d.handles.get(module, h), Some(Obj::Channel { .. })).then_some(crate::txbook::Flow { module, handle: h })
}

/// `net.send` and `net.channel_send`: `len` bytes at `ptr` to `dst:port`,
/// on channel `flow` if given.
fn send_packet(c: &mut C<'_>, (dst, port, ptr, len): (i32, i32, i32, i32), flow: Option<crate::txbook::Flow>) -> i32 {
    if let Err(e) = send_budget(c, len) {
        return e;
    }
    let Ok(port) = u16::try_from(port) else { return E_INVAL };
    let Some(payload) = read(c, ptr, len, usize::MAX) else { return E_INVAL };
    let d = c.data_mut();
    d.call.sends += 1;
    d.call.out.push(Action::SendPacket { principal: d.principal, dst: to_addr(dst), port, payload, flow });
    0
}

fn define_net(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // send(dst, port, ptr, len) -> 0: a packet to dst (routed by the node)
    l.func_wrap("net", "send", |mut c: C<'_>, dst: i32, port: i32, ptr: i32, len: i32| -> i32 {
        charge_host(&mut c);
        send_packet(&mut c, (dst, port, ptr, len), None)
    })?;
    // deliver_local(port, ptr, len) -> 0: to a local application
    l.func_wrap("net", "deliver_local", |mut c: C<'_>, port: i32, ptr: i32, len: i32| -> i32 {
        charge_host(&mut c);
        if let Err(e) = send_budget(&mut c, len) {
            return e;
        }
        let Ok(port) = u16::try_from(port) else { return E_INVAL };
        let Some(payload) = read(&mut c, ptr, len, usize::MAX) else { return E_INVAL };
        let d = c.data_mut();
        d.call.sends += 1;
        d.call.out.push(Action::DeliverLocal { principal: d.principal, port, payload });
        0
    })?;
    // source() -> the address the current packet came from (0: none)
    l.func_wrap("net", "source", |mut c: C<'_>| -> i32 {
        charge_host(&mut c);
        c.data().call.source as i32
    })?;
    // subflow() -> the channel packet's sub-flow (RCANE §IV-D step 3): a
    // hash of its channel's key fields, 0 without keys or outside a packet.
    l.func_wrap("net", "subflow", |mut c: C<'_>| -> i64 {
        charge_host(&mut c);
        c.data().call.subflow as i64
    })?;
    // forward_capsule(to, entry_ptr, entry_len, data_ptr, data_len, carry_code) -> 0:
    // the running capsule, with a new entry and data, to neighbour `to`.
    l.func_wrap(
        "net",
        "forward_capsule",
        |mut c: C<'_>, to: i32, ep: i32, el: i32, dp: i32, dl: i32, carry: i32| -> i32 {
            charge_host(&mut c);
            if let Err(e) = send_budget(&mut c, 0) {
                return e;
            }
            let Some(cap) = c.data().call.capsule.clone() else { return E_CONTEXT };
            let Some(entry) = read_str(&mut c, ep, el, crate::capsule::MAX_ENTRY) else { return E_INVAL };
            let Some(data) = read(&mut c, dp, dl, crate::capsule::MAX_DATA) else { return E_INVAL };
            let capsule = Capsule {
                entry: &entry,
                credential: &cap.credential,
                data: &data,
                code: (carry != 0).then_some(&cap.code[..]),
                hash: cap.hash,
            };
            let mut bytes = Vec::new();
            if capsule.encode(&mut bytes).is_err() {
                return E_INVAL;
            }
            let d = c.data_mut();
            d.call.sends += 1;
            d.call.out.push(Action::SendCapsule { principal: Some(d.principal), to: to_addr(to), bytes });
            0
        },
    )?;
    // open_channel(port, prefix_ptr, prefix_len, entry_ptr, entry_len) -> handle
    l.func_wrap("net", "open_channel", |mut c: C<'_>, port: i32, pp: i32, pl: i32, ep: i32, el: i32| -> i32 {
        charge_host(&mut c);
        let Ok(port) = u16::try_from(port) else { return E_INVAL };
        let max_prefix = c.data().limits.max_prefix;
        let Some(prefix) = read(&mut c, pp, pl, max_prefix) else { return E_INVAL };
        let Ok(spec) = crate::demux::DemuxSpec::port_prefix(port, prefix) else { return E_INVAL };
        open_channel(&mut c, spec, ep, el, 0)
    })?;
    // open_channel_spec(spec_ptr, spec_len, entry_ptr, entry_len, vp) -> handle
    // (the spec's bytes: docs/channels.md)
    l.func_wrap("net", "open_channel_spec", |mut c: C<'_>, sp: i32, sl: i32, ep: i32, el: i32, vp: i32| -> i32 {
        charge_host(&mut c);
        let Some(bytes) = read(&mut c, sp, sl, crate::demux::MAX_SPEC_LEN) else { return E_INVAL };
        let Ok(spec) = crate::demux::DemuxSpec::parse(&bytes) else { return E_INVAL };
        let Ok(vp) = u8::try_from(vp) else { return E_INVAL };
        open_channel(&mut c, spec, ep, el, vp)
    })?;
    l.func_wrap("net", "close_channel", |mut c: C<'_>, h: i32| -> i32 {
        charge_host(&mut c);
        let d = c.data_mut();
        let module = d.call.module;
        match d.handles.get(module, h) {
            Some(Obj::Channel { .. }) => {
                d.handles.remove(module, h);
                d.sync_handles();
                d.ops.push(HostOp::ChannelClosed { module: ModuleId(module), handle: h });
                if let Ok(mut b) = d.tx.lock() {
                    b.remove(crate::txbook::Flow { module, handle: h });
                }
                0
            }
            _ => E_NOTFOUND,
        }
    })?;
    // channel_tx(handle, bytes_per_sec) -> 0 | E_*: gives open channel
    // `handle` that much of the session's transmit reservation (0 gives it
    // back); what it sends with channel_send is then its own flow on each
    // paced link (docs/rcane.md, "Transmit reservations of channels").
    l.func_wrap("net", "channel_tx", |mut c: C<'_>, h: i32, bps: i64| -> i32 {
        charge_host(&mut c);
        let Ok(bps) = u64::try_from(bps) else { return E_INVAL };
        let d = c.data();
        let Some(flow) = channel_flow(d, h) else { return E_NOTFOUND };
        let Ok(mut b) = d.tx.lock() else { return E_CONTEXT };
        match b.set(flow, bps) {
            Ok(()) => 0,
            Err(_) => E_LIMIT,
        }
    })?;
    // channel_send(handle, dst, port, ptr, len) -> 0 | E_*: send as
    // net.send does, on open channel `handle` (its flow, with the channel's
    // transmit reservation if it holds one).
    l.func_wrap("net", "channel_send", |mut c: C<'_>, h: i32, dst: i32, port: i32, ptr: i32, len: i32| -> i32 {
        charge_host(&mut c);
        let Some(flow) = channel_flow(c.data(), h) else { return E_NOTFOUND };
        send_packet(&mut c, (dst, port, ptr, len), Some(flow))
    })?;
    Ok(())
}

/// Opens a channel for `spec` processed by VP index `vp` of the module's
/// session, if the module's credential grants the filter.
fn open_channel(c: &mut C<'_>, spec: crate::demux::DemuxSpec, ep: i32, el: i32, vp: u8) -> i32 {
    let Some(entry) = read_str(c, ep, el, crate::capsule::MAX_ENTRY) else { return E_INVAL };
    if !valid_entry(&entry) {
        return E_INVAL;
    }
    let d = c.data_mut();
    let module = d.call.module;
    let mut spec = spec;
    if spec.source_granted {
        // The source the credential grants for the port (none granted:
        // refused below, as any filter it does not cover).
        match d.channel_auth.get(&module).map_or(Some(None), |a| a.granted_source(spec.port)) {
            Some(g) => {
                spec.source = g.and_then(|(a, l)| crate::demux::SourcePrefix::new(a, l).ok());
                spec.source_granted = false;
            }
            None => {
                d.ops.push(HostOp::ChannelRefused);
                return E_DENIED;
            }
        }
    }
    let source = spec.source.map(|s| (s.addr(), s.len()));
    if !d.channel_auth.get(&module).is_none_or(|a| a.allows(spec.port, source)) {
        d.ops.push(HostOp::ChannelRefused);
        return E_DENIED;
    }
    let obj = Obj::Channel { entry, keyed: !spec.keys.is_empty() };
    if d.count_objs(true) >= d.limits.channels || !d.charge_handle(obj.bytes()) {
        return E_LIMIT;
    }
    let Some(h) = d.handles.insert(module, obj) else {
        d.sync_handles();
        return E_LIMIT;
    };
    d.ops.push(HostOp::ChannelOpened { module: ModuleId(module), handle: h, spec, vp });
    h
}

fn define_time(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    l.func_wrap("time", "now_ms", |mut c: C<'_>| -> i64 {
        charge_host(&mut c);
        c.data().call.now_ms as i64
    })?;
    // set_alarm(delay_ms, entry_ptr, entry_len) -> handle; the entry is called with the handle
    l.func_wrap("time", "set_alarm", |mut c: C<'_>, delay: i64, ep: i32, el: i32| -> i32 {
        charge_host(&mut c);
        let Some(entry) = read_str(&mut c, ep, el, crate::capsule::MAX_ENTRY) else { return E_INVAL };
        if !valid_entry(&entry) || !(0..=86_400_000).contains(&delay) {
            return E_INVAL;
        }
        let d = c.data_mut();
        let module = d.call.module;
        if d.count_objs(false) >= d.limits.alarms || !d.charge_handle(HANDLE_BYTES) {
            return E_LIMIT;
        }
        let deadline = d.call.now_ms + delay as u64;
        let Some(h) = d.handles.insert(module, Obj::Alarm { deadline, entry }) else {
            d.sync_handles();
            return E_LIMIT;
        };
        d.ops.push(HostOp::AlarmSet { module: ModuleId(module), handle: h, deadline });
        h
    })?;
    l.func_wrap("time", "cancel_alarm", |mut c: C<'_>, h: i32| -> i32 {
        charge_host(&mut c);
        let d = c.data_mut();
        let module = d.call.module;
        match d.handles.get(module, h) {
            Some(Obj::Alarm { .. }) => {
                d.handles.remove(module, h);
                d.sync_handles();
                0
            }
            _ => E_NOTFOUND,
        }
    })?;
    Ok(())
}

fn define_state(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // put(key_ptr, key_len, val_ptr, val_len, ttl_ms) -> 0 | E_LIMIT
    l.func_wrap("state", "put", |mut c: C<'_>, kp: i32, kl: i32, vp: i32, vl: i32, ttl: i64| -> i32 {
        charge_host(&mut c);
        let Some(k) = read(&mut c, kp, kl, crate::state::MAX_KEY) else { return E_INVAL };
        let Some(v) = read(&mut c, vp, vl, crate::state::MAX_VALUE) else { return E_INVAL };
        let now = c.data().call.now_ms;
        let expires = if ttl > 0 { Some(now.saturating_add(ttl as u64)) } else { None };
        let d = c.data();
        let Ok(mut s) = d.state.lock() else { return E_CONTEXT };
        // Checked against the session's heap before, charged exactly after.
        let cost = k.len() + v.len() + STATE_ENTRY_BYTES;
        if !heap::with(&d.heap, |a| {
            a.fits(cost) || {
                a.refuse();
                false
            }
        }) {
            return E_LIMIT;
        }
        let ok = s.put(now, k, v, expires);
        sync_state(&d.heap, &s);
        if ok { 0 } else { E_LIMIT }
    })?;
    // get(key_ptr, key_len, out_ptr, out_cap) -> value length | E_NOTFOUND | E_SMALL
    l.func_wrap("state", "get", |mut c: C<'_>, kp: i32, kl: i32, op: i32, oc: i32| -> i32 {
        charge_host(&mut c);
        let Some(k) = read(&mut c, kp, kl, crate::state::MAX_KEY) else { return E_INVAL };
        let now = c.data().call.now_ms;
        let d = c.data();
        let v = match d.state.lock() {
            Ok(mut s) => {
                let v = s.get(now, &k).map(<[u8]>::to_vec);
                sync_state(&d.heap, &s);
                v
            }
            Err(_) => return E_CONTEXT,
        };
        match v {
            Some(v) => write(&mut c, op, oc, &v),
            None => E_NOTFOUND,
        }
    })?;
    l.func_wrap("state", "remove", |mut c: C<'_>, kp: i32, kl: i32| -> i32 {
        charge_host(&mut c);
        let Some(k) = read(&mut c, kp, kl, crate::state::MAX_KEY) else { return E_INVAL };
        let d = c.data();
        match d.state.lock() {
            Ok(mut s) => {
                let found = s.remove(&k);
                sync_state(&d.heap, &s);
                if found { 0 } else { E_NOTFOUND }
            }
            Err(_) => E_CONTEXT,
        }
    })?;
    Ok(())
}

/// Sets the heap's soft-state part from the state itself (entries expire
/// on their own, so it is recomputed rather than tracked).
pub(crate) fn sync_state(heap: &SharedHeap, s: &SoftState) {
    let bytes = s.bytes().saturating_add(s.len().saturating_mul(STATE_ENTRY_BYTES));
    heap::with(heap, |a| a.set(Part::State, bytes));
}

fn define_marshal(l: &mut Linker<TenantState>) -> wasmtime::Result<()> {
    // encode(iov_ptr, iov_count, out_ptr, out_cap) -> length; iov = [(ptr u32, len u32)] little-endian
    l.func_wrap("marshal", "encode", |mut c: C<'_>, iov: i32, n: i32, op: i32, oc: i32| -> i32 {
        charge_host(&mut c);
        let Ok(n) = usize::try_from(n) else { return E_INVAL };
        if n > marshal::MAX_FIELDS {
            return E_LIMIT;
        }
        let Some(desc) = read(&mut c, iov, (n * 8) as i32, marshal::MAX_FIELDS * 8) else { return E_INVAL };
        let mut fields = Vec::with_capacity(n);
        let mut total = 0usize;
        for d in desc.chunks_exact(8) {
            let p = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as i32;
            let l = u32::from_le_bytes([d[4], d[5], d[6], d[7]]) as i32;
            total = total.saturating_add(l.max(0) as usize);
            if total > marshal::MAX_ENCODED {
                return E_LIMIT;
            }
            let Some(f) = read(&mut c, p, l, marshal::MAX_ENCODED) else { return E_INVAL };
            fields.push(f);
        }
        let mut out = Vec::new();
        if marshal::encode(fields.iter().map(Vec::as_slice), &mut out).is_err() {
            return E_LIMIT;
        }
        write(&mut c, op, oc, &out)
    })?;
    // field(in_ptr, in_len, index, out_ptr, out_cap) -> field length | E_NOTFOUND | E_INVAL malformed
    l.func_wrap("marshal", "field", |mut c: C<'_>, ip: i32, il: i32, idx: i32, op: i32, oc: i32| -> i32 {
        charge_host(&mut c);
        let Some(input) = read(&mut c, ip, il, marshal::MAX_ENCODED) else { return E_INVAL };
        let Ok(fields) = marshal::decode(&input) else { return E_INVAL };
        let Some(f) = usize::try_from(idx).ok().and_then(|i| fields.get(i)) else { return E_NOTFOUND };
        let f = f.to_vec();
        write(&mut c, op, oc, &f)
    })?;
    // count(in_ptr, in_len) -> number of fields | E_INVAL malformed
    l.func_wrap("marshal", "count", |mut c: C<'_>, ip: i32, il: i32| -> i32 {
        charge_host(&mut c);
        let Some(input) = read(&mut c, ip, il, marshal::MAX_ENCODED) else { return E_INVAL };
        match marshal::decode(&input) {
            Ok(f) => f.len() as i32,
            Err(_) => E_INVAL,
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use wasmtime::{Config, Extern, Store, Val, ValType};

    /// Every host function a module may import ([`FUNCTIONS`]) takes one
    /// host call's fuel ([`charge_host`]): called from the host with zero
    /// arguments (each then refuses: no memory, no context), each costs
    /// exactly `host_call_fuel`. A host function added without the charge
    /// fails here.
    #[test]
    fn every_host_function_charges_one_host_call() {
        let mut cfg = Config::new();
        cfg.consume_fuel(true);
        let engine = Engine::new(&cfg).unwrap();
        let mut l = linker_for(&engine, InterfaceSet::ALL).unwrap();
        crate::pods::define_pod(&mut l).unwrap();
        let heap = crate::heap::HeapAccount::shared(Arc::new(std::sync::atomic::AtomicBool::new(false)), None);
        let routes: Arc<dyn Routes> =
            Arc::new(crate::StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: HashMap::new() });
        let state = Arc::new(Mutex::new(SoftState::new(4096, 16)));
        let mut data = TenantState::new(PrincipalId([1; 32]), 1 << 20, heap, state, routes, HostLimits::default());
        data.host_call_fuel = 500;
        let mut store = Store::new(&engine, data);
        let mut n = 0;
        for (module, names) in FUNCTIONS {
            for name in *names {
                let Ok(Extern::Func(f)) = l.get(&mut store, module, name) else {
                    panic!("{module}.{name} is not defined");
                };
                let ty = f.ty(&store);
                let args: Vec<Val> = ty
                    .params()
                    .map(|p| match p {
                        ValType::I64 => Val::I64(0),
                        _ => Val::I32(0),
                    })
                    .collect();
                let mut results: Vec<Val> = ty.results().map(|_| Val::I32(0)).collect();
                store.set_fuel(1_000_000).unwrap();
                f.call(&mut store, &args, &mut results).unwrap();
                assert_eq!(1_000_000 - store.get_fuel().unwrap(), 500, "{module}.{name}");
                n += 1;
            }
        }
        assert_eq!(n, FUNCTIONS.iter().map(|(_, f)| f.len()).sum::<usize>());
    }
}
