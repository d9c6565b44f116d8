//! Switchlets: authorized, thinned, sandboxed WebAssembly modules loaded into
//! a node at run time (SANE §2, §4.8–4.9; RCANE's Loader/Core/Modules).
//!
//! Sans-I/O: every entry point takes its inputs and [`Now`] and appends
//! [`Action`]s to a caller-owned vector; the node owns sockets, threads and
//! clocks. See `docs/modules.md`.
//!
//! - [`Sandbox::load`]: a module from disk or an authenticated control
//!   message: size check, hash and programmer signature, import scan,
//!   credential decision (once), compile (or code-cache hit), instantiate in
//!   the principal's own store with only the granted host interfaces, run
//!   `anode_init`, register its names.
//! - [`Sandbox::invoke`], [`Sandbox::deliver`] (channels),
//!   [`Sandbox::handle_timeout`] (alarms): call registered entries by name,
//!   each call under a CPU bound; a trap, out-of-memory or overrun ends that
//!   call only and is counted against the module.
//! - [`Sandbox::handle_capsule`]: capsules carrying code or its hash, code
//!   fetch from the previous hop, and serving cached code to neighbours.
//! - [`Sandbox::load_pod`] and the `pod` interface ([`pods`]): Expert's
//!   protected modules, entered by two-phase binding and run on the
//!   caller's budget.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cache;
pub mod capsule;
pub mod demux;
pub mod fuzzing;
pub mod handles;
pub mod heap;
pub mod host;
pub mod marshal;
pub mod ping;
pub mod pods;
mod sandbox;
pub mod state;
pub mod txbook;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::SystemTime;

pub use anode_cred::{self as cred, PrincipalId};
pub use cache::{CacheStats, Import};
pub use heap::{HeapCharge, HeapUse};
pub use host::HostLimits;
pub use sandbox::PodSpec;
pub use sandbox::{
    CapsuleError, CapsuleJob, CapsuleOutcome, CpuBound, DEFAULT_CODE_REPLY_BYTES_PER_SEC, DEFAULT_HOST_CALL_FUEL,
    DEFAULT_YIELD_FUEL, Invocation, InvokeError, Job, JobKind, LoadError, LoadSpec, ModuleCounters, ModuleInfo,
    ModuleKind, Sandbox, SandboxConfig, SandboxCounters, SetupError, Step, Task,
};
pub use txbook::{Flow, TxBook, TxBookError};

/// Most entries one module may register.
pub const MAX_ENTRIES: usize = 32;

/// For profiling, on every engine the node makes (its modules' and its
/// pods'): with `ANODE_WASM_PERFMAP` set, wasmtime writes
/// `/tmp/perf-PID.map`, so that `perf report` names wasm functions
/// (docs/node.md 7.4).
pub(crate) fn perf_map_if_asked(c: &mut wasmtime::Config) {
    if std::env::var_os("ANODE_WASM_PERFMAP").is_some() {
        c.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
}

/// The time of an event: the node's monotonic milliseconds (alarms, rate
/// limits, `time.now_ms`) and wall-clock time (credential expiry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic milliseconds.
    pub ms: u64,
    /// Wall-clock time.
    pub wall: SystemTime,
}

/// A loaded module (or a cached capsule instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

impl core::fmt::Display for ModuleId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "m{}", self.0)
    }
}

/// What the node must do on behalf of modules. Each action names the
/// principal it is done for, so the node can schedule and charge it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a plain packet to `dst` (the node routes it) on `port`.
    SendPacket {
        /// The module's principal.
        principal: PrincipalId,
        /// Destination address.
        dst: Ipv4Addr,
        /// Destination port.
        port: u16,
        /// Payload.
        payload: Vec<u8>,
        /// The channel it was sent on (`net.channel_send`): with a transmit
        /// reservation of its own, its flow on a paced link; `None` for
        /// `net.send` (the session's other packets).
        flow: Option<Flow>,
    },
    /// Send a capsule-protocol message (capsule, code request or code reply)
    /// to the neighbour `to`.
    SendCapsule {
        /// The capsule's principal; `None` for the node's own code requests
        /// and replies (done for the network, not for a principal).
        principal: Option<PrincipalId>,
        /// The neighbour.
        to: Ipv4Addr,
        /// The encoded message ([`capsule`]).
        bytes: Vec<u8>,
    },
    /// Deliver to a local application bound to `port`.
    DeliverLocal {
        /// The module's principal.
        principal: PrincipalId,
        /// Local port.
        port: u16,
        /// Payload.
        payload: Vec<u8>,
    },
    /// A module asks for its session's heap reservation to become `bytes`
    /// (`session.heap_request`): the node decides with its admission control,
    /// and gives the sandbox the outcome with
    /// [`Sandbox::set_session_heap`]. At most one per invocation.
    HeapRequest {
        /// The module's principal.
        principal: PrincipalId,
        /// The module.
        module: ModuleId,
        /// The reservation asked for, bytes.
        bytes: u64,
    },
    /// A line for the node's log from a module (already rate-limited).
    Log {
        /// The module.
        module: ModuleId,
        /// Its principal.
        principal: PrincipalId,
        /// The message (lossy UTF-8, at most [`HostLimits::log_max`] bytes).
        text: String,
    },
}

/// Routing answers for the `route` interface; the node implements it.
pub trait Routes: Send + Sync {
    /// This node's address.
    fn this_host(&self) -> Ipv4Addr;
    /// The neighbour to send to for `dst`, if any (`dst` itself for a neighbour).
    fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr>;
}

/// A fixed routing table.
#[derive(Debug, Clone)]
pub struct StaticRoutes {
    /// This node's address.
    pub this: Ipv4Addr,
    /// Destination to next hop.
    pub table: HashMap<Ipv4Addr, Ipv4Addr>,
}

impl Routes for StaticRoutes {
    fn this_host(&self) -> Ipv4Addr {
        self.this
    }
    fn next_hop(&self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        self.table.get(&dst).copied()
    }
}
