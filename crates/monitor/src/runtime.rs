//! The module runtime: untrusted monitoring modules in wasmtime, each in its
//! own store, CPU-bounded by fuel and memory-bounded by a limiter (the same
//! engine settings as `anode-sandbox`).
//!
//! # The module interface
//!
//! A module imports only from `mon` (anything else is refused at load — the
//! linker holds nothing else) and exports its linear `memory` and:
//!
//! | export | signature | called |
//! |---|---|---|
//! | `mon_init` | `(region_bytes, max_batch) -> ptr` | once at load: the module reserves `region_bytes` of its memory (the SDK grows memory) for the views; `ptr < 0` refuses |
//! | `mon_packet` | `(status) -> i32` | per packet, with one view at `ptr` (optional if `mon_batch` exists) |
//! | `mon_batch` | `(n, status) -> i32` | with `n` views at `ptr`, each at a multiple of 8 after the previous one's end (optional) |
//! | `mon_tick` | `(now_ns: i64) -> i32` | periodically, with the periodic budget (optional) |
//!
//! `status` is the number of consecutive calls before this one that were cut
//! off by the CPU budget: FLAME's environment variable that tells a module
//! on its next invocation that it was interrupted, so that it can clean up.
//!
//! | import | signature | meaning |
//! |---|---|---|
//! | `mon.emit` | `(ptr, len) -> i32` | an export record (see `anode_monitor_apps::abi`); needs `export("records")` |
//! | `mon.sample` | `(index) -> i32` | export packet `index` of the current call (0 for `mon_packet`) as a sanitized pcap frame; needs `export("packets")` |
//!
//! Both return `0`, or `-1` malformed/out of bounds, `-3` per-call limit
//! reached, `-6` no export right (counted as a denial).
//!
//! A call gets `budget × n` fuel (the per-packet budget times the packets in
//! the batch). When it runs out the call is cut off: the rest of that batch
//! is lost for this module only, the overrun is counted, and the module is
//! told on its next call. A trap ends the call the same way. Records already
//! emitted in a cut-off call are kept (they were checked when emitted).

use std::sync::Arc;

use anode_monitor_apps::abi::Record;
use wasmtime::{Caller, Config, Engine, Instance, Linker, Memory, Module, ResourceLimiter, Store, Trap, TypedFunc};

use crate::policy::ExportRights;

/// Bad argument or out of bounds.
pub const E_INVAL: i32 = -1;
/// A per-call limit was reached.
pub const E_LIMIT: i32 = -3;
/// The credential does not grant this export.
pub const E_DENIED: i32 = -6;

/// Why a module was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The binary is larger than the configured limit.
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
    /// An import other than `mon.emit` / `mon.sample`.
    #[error("forbidden import {0:?}: monitoring modules may import only mon.emit and mon.sample")]
    ForbiddenImport(String),
    /// A required export is missing (`memory`, `mon_init`, and `mon_packet` or `mon_batch`).
    #[error("module does not export {0}")]
    MissingExport(&'static str),
    /// The module's memory exceeds the policy's limit.
    #[error("module needs more memory than the {0}-byte limit")]
    MemoryLimit(u64),
    /// Instantiation failed (a wrong import signature, a trapping start function).
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    /// `mon_init` failed or returned an unusable region.
    #[error("mon_init failed: {0}")]
    Init(String),
}

impl LoadError {
    /// A short stable label.
    pub fn label(&self) -> &'static str {
        match self {
            LoadError::TooLarge { .. } => "too_large",
            LoadError::Malformed(_) => "malformed",
            LoadError::ForbiddenImport(_) => "forbidden_import",
            LoadError::MissingExport(_) => "missing_export",
            LoadError::MemoryLimit(_) => "memory_limit",
            LoadError::Instantiate(_) => "instantiate",
            LoadError::Init(_) => "init",
        }
    }
}

/// How a call ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The fuel budget ran out.
    Overrun,
    /// Memory growth beyond the limit, then a trap.
    Memory,
    /// A trap.
    Trap(String),
}

pub(crate) struct Limiter {
    cap: usize,
    used: usize,
    exceeded: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current);
        if self.used.saturating_add(grow) > self.cap {
            self.exceeded = true;
            return Ok(false);
        }
        self.used += grow;
        Ok(true)
    }
    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 10_000)
    }
}

/// What one call produced, collected by the host functions.
#[derive(Debug, Default)]
pub(crate) struct CallOut {
    pub records: Vec<Vec<u8>>,
    pub samples: Vec<u32>,
    pub denied_records: u32,
    pub denied_samples: u32,
    pub malformed: u32,
    pub limited: u32,
}

pub(crate) struct Host {
    limiter: Limiter,
    export: ExportRights,
    batch_n: u32,
    max_records: usize,
    pub out: CallOut,
}

/// What a load needs besides the code.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadParams {
    /// Largest binary.
    pub max_module: usize,
    /// Memory cap, bytes.
    pub memory: u64,
    /// Export rights.
    pub export: ExportRights,
    /// Fuel for the start function and `mon_init`.
    pub init_fuel: u64,
    /// View region, bytes.
    pub region: u32,
    /// Most packets per call.
    pub max_batch: u32,
    /// Records (and samples) per call.
    pub max_records: usize,
}

/// A shared engine and linker for monitoring modules.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<Host>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtime")
    }
}

fn memory_of(c: &mut Caller<'_, Host>) -> Option<Memory> {
    c.get_export("memory").and_then(|e| e.into_memory())
}

impl Runtime {
    /// A fuel-metered engine with the `mon` host functions.
    ///
    /// # Errors
    /// wasmtime's refusal of the configuration, as text.
    pub fn new() -> Result<Runtime, String> {
        let mut c = Config::new();
        c.consume_fuel(true);
        c.max_wasm_stack(256 * 1024);
        c.native_unwind_info(false);
        let engine = Engine::new(&c).map_err(|e| format!("{e:#}"))?;
        let mut linker: Linker<Host> = Linker::new(&engine);
        linker
            .func_wrap("mon", "emit", |mut c: Caller<'_, Host>, ptr: i32, len: i32| -> i32 {
                if !c.data().export.records {
                    c.data_mut().out.denied_records += 1;
                    return E_DENIED;
                }
                if c.data().out.records.len() >= c.data().max_records {
                    c.data_mut().out.limited += 1;
                    return E_LIMIT;
                }
                let Some(mem) = memory_of(&mut c) else { return E_INVAL };
                let (data, host) = mem.data_and_store_mut(&mut c);
                let (Ok(p), Ok(l)) = (usize::try_from(ptr), usize::try_from(len)) else { return E_INVAL };
                let Some(bytes) = data.get(p..p.saturating_add(l)) else { return E_INVAL };
                match Record::parse(bytes) {
                    Ok(_) => {
                        host.out.records.push(bytes.to_vec());
                        0
                    }
                    Err(_) => {
                        host.out.malformed += 1;
                        E_INVAL
                    }
                }
            })
            .map_err(|e| format!("{e:#}"))?;
        linker
            .func_wrap("mon", "sample", |mut c: Caller<'_, Host>, index: i32| -> i32 {
                let h = c.data_mut();
                if !h.export.packets {
                    h.out.denied_samples += 1;
                    return E_DENIED;
                }
                let Ok(i) = u32::try_from(index) else { return E_INVAL };
                if i >= h.batch_n {
                    return E_INVAL;
                }
                if h.out.samples.len() >= h.max_records {
                    h.out.limited += 1;
                    return E_LIMIT;
                }
                if !h.out.samples.contains(&i) {
                    h.out.samples.push(i);
                }
                0
            })
            .map_err(|e| format!("{e:#}"))?;
        Ok(Runtime { engine, linker: Arc::new(linker) })
    }

    /// Checks, compiles and instantiates a module.
    pub(crate) fn load(&self, code: &[u8], p: &LoadParams) -> Result<WasmModule, LoadError> {
        let LoadParams { max_module, memory, export, init_fuel, region, max_batch, max_records } = *p;
        if code.len() > max_module {
            return Err(LoadError::TooLarge { size: code.len(), max: max_module });
        }
        scan_imports(code)?;
        let module = Module::from_binary(&self.engine, code).map_err(|e| LoadError::Malformed(format!("{e:#}")))?;
        let cap = usize::try_from(memory).unwrap_or(usize::MAX);
        let host = Host {
            limiter: Limiter { cap, used: 0, exceeded: false },
            export,
            batch_n: 0,
            max_records,
            out: CallOut::default(),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|h| &mut h.limiter);
        let _ = store.set_fuel(init_fuel);
        let instance: Instance = self.linker.instantiate(&mut store, &module).map_err(|e| {
            if store.data().limiter.exceeded {
                LoadError::MemoryLimit(memory)
            } else {
                LoadError::Instantiate(format!("{e:#}"))
            }
        })?;
        let memory = instance.get_memory(&mut store, "memory").ok_or(LoadError::MissingExport("memory"))?;
        let init = instance
            .get_typed_func::<(i32, i32), i32>(&mut store, "mon_init")
            .map_err(|_| LoadError::MissingExport("mon_init"))?;
        let packet = instance.get_typed_func::<i32, i32>(&mut store, "mon_packet").ok();
        let batch = instance.get_typed_func::<(i32, i32), i32>(&mut store, "mon_batch").ok();
        let tick = instance.get_typed_func::<i64, i32>(&mut store, "mon_tick").ok();
        if packet.is_none() && batch.is_none() {
            return Err(LoadError::MissingExport("mon_packet or mon_batch"));
        }
        let _ = store.set_fuel(init_fuel);
        let ptr =
            init.call(&mut store, (region as i32, max_batch as i32)).map_err(|e| LoadError::Init(format!("{e:#}")))?;
        let ptr = u32::try_from(ptr).map_err(|_| LoadError::Init(format!("refused (returned {ptr})")))?;
        if (ptr as usize).saturating_add(region as usize) > memory.data_size(&store) {
            return Err(LoadError::Init(format!("region {ptr}+{region} outside the module's memory")));
        }
        store.data_mut().out = CallOut::default();
        Ok(WasmModule { store, memory, ptr, region, packet, batch, tick })
    }
}

fn scan_imports(code: &[u8]) -> Result<(), LoadError> {
    use wasmtime::wasmparser::{Parser, Payload};
    for p in Parser::new(0).parse_all(code) {
        let p = p.map_err(|e| LoadError::Malformed(e.to_string()))?;
        if let Payload::ImportSection(r) = p {
            for imp in r.into_imports() {
                let imp = imp.map_err(|e| LoadError::Malformed(e.to_string()))?;
                if imp.module != "mon" || !matches!(imp.name, "emit" | "sample") {
                    return Err(LoadError::ForbiddenImport(format!("{}.{}", imp.module, imp.name)));
                }
            }
        }
    }
    Ok(())
}

/// A loaded wasm monitoring module.
pub struct WasmModule {
    store: Store<Host>,
    memory: Memory,
    ptr: u32,
    region: u32,
    packet: Option<TypedFunc<i32, i32>>,
    batch: Option<TypedFunc<(i32, i32), i32>>,
    tick: Option<TypedFunc<i64, i32>>,
}

impl std::fmt::Debug for WasmModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WasmModule(region {} bytes at {})", self.region, self.ptr)
    }
}

impl WasmModule {
    /// The view region inside the module's memory.
    pub(crate) fn region_mut(&mut self) -> Option<&mut [u8]> {
        let (p, r) = (self.ptr as usize, self.region as usize);
        self.memory.data_mut(&mut self.store).get_mut(p..p + r)
    }

    /// Whether the module exports `mon_batch`.
    pub(crate) fn has_batch(&self) -> bool {
        self.batch.is_some()
    }

    fn classify(&self, e: &wasmtime::Error) -> CallError {
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => CallError::Overrun,
            _ if self.store.data().limiter.exceeded => CallError::Memory,
            Some(t) => CallError::Trap(t.to_string()),
            None => CallError::Trap(format!("{e:#}")),
        }
    }

    fn begin(&mut self, n: u32, fuel: u64) {
        let h = self.store.data_mut();
        h.batch_n = n;
        h.limiter.exceeded = false;
        h.out.records.clear();
        h.out.samples.clear();
        let _ = self.store.set_fuel(fuel);
    }

    /// Runs `n` views (already written into the region) with `fuel`.
    /// Returns the fuel used and the call's outcome.
    pub(crate) fn run(&mut self, n: u32, status: u32, fuel: u64) -> (u64, Result<(), CallError>) {
        self.begin(n, fuel);
        let st = status.min(i32::MAX as u32) as i32;
        let r = match (&self.batch, &self.packet) {
            (Some(b), _) if n > 1 || self.packet.is_none() => b.call(&mut self.store, (n as i32, st)).map(|_| ()),
            (_, Some(p)) => p.call(&mut self.store, st).map(|_| ()),
            (Some(b), None) => b.call(&mut self.store, (n as i32, st)).map(|_| ()),
            (None, None) => Ok(()),
        };
        let used = fuel.saturating_sub(self.store.get_fuel().unwrap_or(0));
        (used, r.map_err(|e| self.classify(&e)))
    }

    /// Runs the periodic entry, if any.
    pub(crate) fn tick(&mut self, now_ns: u64, fuel: u64) -> Option<(u64, Result<(), CallError>)> {
        let t = self.tick.clone()?;
        self.begin(0, fuel);
        let r = t.call(&mut self.store, now_ns.min(i64::MAX as u64) as i64).map(|_| ());
        let used = fuel.saturating_sub(self.store.get_fuel().unwrap_or(0));
        Some((used, r.map_err(|e| self.classify(&e))))
    }

    /// What the last call produced.
    pub(crate) fn take_out(&mut self) -> CallOut {
        std::mem::take(&mut self.store.data_mut().out)
    }

    /// Linear memory in use, bytes.
    pub fn memory_bytes(&self) -> usize {
        self.memory.data_size(&self.store)
    }
}
