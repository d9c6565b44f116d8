//! Switchlets and capsules in the embedded sandbox: capsules from
//! neighbours and local applications, packets for module channels, module
//! loads (from the configuration at start and from users over the network,
//! by the same path), and the actions modules ask for, each done for the
//! module's principal.
//!
//! ```text
//! CAPSULE (0xA003) from neighbour N ──► Sandbox::handle_capsule(now, N) ──► actions
//!     (with RCANE on: verified here, then its entry is a Job on its principal's pool)
//! a payload for a port a module channel matches ──► Sandbox::deliver ──► actions
//! actions: SendCapsule{to} ──► CAPSULE datagram to that neighbour (sealed hop by hop)
//!          SendPacket{dst,port} ──► a plain packet, routed
//!          DeliverLocal{port} ──► the local application
//!          Log ──► the node's log
//! ```

use super::{Node, Outbox, Owner, Run, Transmit};
use crate::counters::Drop;
use crate::switchlets::Switch;
use anode_sandbox::{Action, CapsuleError, Invocation, LoadError, LoadSpec, ModuleId, Now, PrincipalId, Sandbox};
use anode_wire::anep;
use core::net::Ipv4Addr;

/// Why a module load did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadFailure {
    /// The node runs no modules (no `[modules]` section).
    #[error("this node runs no modules")]
    ModulesOff,
    /// The sandbox refused it.
    #[error("{0}")]
    Refused(#[from] LoadError),
}

impl Node {
    /// Loads a pod (docs/pods.md), e.g. from `[[modules.pod]]` at start;
    /// `None` when modules are off. Its calls are charged to the modules
    /// that make them, through their invocations' fuel; loading one runs
    /// only its start function.
    pub fn load_pod(
        &mut self,
        spec: &anode_sandbox::PodSpec<'_>,
        now_ms: u64,
    ) -> Option<Result<anode_sandbox::pods::PodId, anode_sandbox::pods::PodError>> {
        self.set_now(now_ms);
        let m = self.modules.as_mut()?;
        let now = m.now(now_ms);
        Some(m.sb.load_pod(now, spec))
    }

    /// Unloads pod `id`; bindings to it fail at their next use.
    pub fn unload_pod(&mut self, id: u32) -> bool {
        self.modules.as_mut().is_some_and(|m| m.sb.unload_pod(anode_sandbox::pods::PodId(id)))
    }

    /// Turns on switchlets and capsules with this sandbox (built from the
    /// `[modules]` section by [`crate::switchlets::sandbox`]).
    /// `unix_ms_at_zero` is the wall-clock time when `now_ms` was 0
    /// (credential expiry).
    ///
    /// With RCANE on, capsules run as events of their principal's session
    /// ([`Sandbox::defer_capsules`]).
    pub fn enable_modules(&mut self, mut sb: Sandbox, unix_ms_at_zero: u64) {
        sb.defer_capsules(self.sched.is_some());
        self.modules = Some(Box::new(Switch { sb, actions: Vec::new(), invocations: Vec::new(), unix_ms_at_zero }));
    }

    /// Loaded modules (not capsule instances): id, principal, names, code
    /// hash, entries, interfaces, limits, until when its credential allows
    /// it, and its counters; then the pods (`"kind": "pod"`, id `pN`, their
    /// name as `names`, their offers' entries as `entries`); `[]` when
    /// modules are off.
    pub fn modules_list_json(&self) -> serde_json::Value {
        use serde_json::json;
        let Some(m) = self.modules.as_ref() else { return json!([]) };
        let list: Vec<serde_json::Value> = m
            .sb
            .modules()
            .into_iter()
            .filter_map(|id| m.sb.module(id))
            .map(|i| {
                let until = i.grant.recheck_at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs());
                json!({
                    "id": i.id.to_string(),
                    "principal": i.principal.to_string(),
                    "names": i.names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                    "hash": i.hash.to_string(),
                    "entries": i.entries,
                    "interfaces": format!("{:?}", i.interfaces),
                    "limits": {"memory": i.grant.limits.memory, "cpu": i.grant.limits.cpu, "state": i.grant.limits.state},
                    "until_unix_s": until,
                    "memory_used": m.sb.memory_used(&i.principal),
                    "heap": m.sb.heap(&i.principal).map(|h| json!({
                        "reservation": h.reservation, "used": h.used, "memory": h.memory, "tables": h.tables,
                        "handles": h.handles, "state": h.state, "queued": h.queued, "staged": h.staged, "peak": h.peak,
                        "refusals": h.refusals, "pressure_calls": h.pressure_calls,
                    })),
                    "counters": {"invocations": i.counters.invocations, "ok": i.counters.ok, "traps": i.counters.traps,
                                 "cpu_exhausted": i.counters.cpu_exhausted, "memory_exhausted": i.counters.memory_exhausted},
                })
            })
            .collect();
        let mut list = list;
        list.extend(m.sb.pods().into_iter().map(|p| {
            let c = p.counters;
            json!({
                "kind": "pod",
                "id": p.id.to_string(),
                "principal": p.principal.to_string(),
                "names": [p.name],
                "entries": p.offers,
                "on_fault": format!("{:?}", p.on_fault).to_lowercase(),
                "clients": p.clients,
                "buffer": p.buffer,
                "counters": {"invocations": c.calls, "ok": c.calls.saturating_sub(c.traps + c.cut_off), "traps": c.traps,
                             "cpu_exhausted": c.cut_off, "memory_exhausted": 0, "binds": c.binds, "accepted": c.accepted,
                             "refused": c.refused, "denied": c.denied, "busy": c.busy, "resets": c.resets, "rollbacks": c.rollbacks,
                             "rollback_failed": c.rollback_failed, "unbinds": c.unbinds,
                             "unbinds_missed": c.unbinds_missed, "fuel": c.fuel},
            })
        }));
        json!(list)
    }

    /// Unloads module `id` (the operator's request); its principal, or
    /// `None` if no such module is loaded.
    pub fn unload_module(&mut self, id: u32) -> Option<PrincipalId> {
        let m = self.modules.as_mut()?;
        let info = m.sb.module(ModuleId(id)).filter(|i| i.kind == anode_sandbox::ModuleKind::Module)?;
        m.sb.unload(ModuleId(id)).then_some(info.principal)
    }

    /// Whether switchlets and capsules are on.
    pub fn modules_on(&self) -> bool {
        self.modules.is_some()
    }

    /// The sandbox, when modules are on.
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.modules.as_ref().map(|m| &m.sb)
    }

    /// The modules section of `anode status` (None when modules are off).
    pub fn modules_json(&self) -> Option<serde_json::Value> {
        self.modules.as_ref().map(|m| crate::switchlets::to_json(&m.sb))
    }

    /// Loads a module: the one path for modules listed in the configuration
    /// (loaded at start, `requester` None) and for users' load requests over
    /// the network (`requester` the SA's principal). The credential is
    /// decided once, here; the actions of its `anode_init` are carried out
    /// (sealed for their next hops) and logged like any module's. Loads are
    /// idempotent: `true` means the module was already loaded.
    pub fn load_module(
        &mut self,
        spec: &LoadSpec<'_>,
        now_ms: u64,
        out: &mut Outbox,
    ) -> Result<(ModuleId, bool), LoadFailure> {
        self.set_now(now_ms);
        let mark = out.transmits.len();
        let mut r = self.with_sandbox(now_ms, out, |sb, now, a| sb.load_once(now, spec, a));
        if let (Some(Err(LoadError::Busy)), Some(p)) = (&r, spec.requester)
            && self.finish_suspended_of(p, now_ms, out)
        {
            r = self.with_sandbox(now_ms, out, |sb, now, a| sb.load_once(now, spec, a));
        }
        if let (Some(Ok((_, false))), Some(p)) = (&r, spec.requester)
            && let Some(s) = self.sched.as_mut()
        {
            let sid = s.session_of(Owner::Principal(p));
            let _ = s.rcane.charge_module_load(sid);
        }
        self.protect(&mut [], out, mark, now_ms);
        match r {
            None => Err(LoadFailure::ModulesOff),
            Some(r) => r.map_err(LoadFailure::Refused),
        }
    }

    /// Runs a capsule from a local application here (its first hop).
    /// A refusal is returned, so the application learns why (expired,
    /// wrong issuer, missing right, ...).
    pub fn inject_capsule(&mut self, bytes: &[u8], now_ms: u64, out: &mut Outbox) -> Result<(), CapsuleError> {
        self.set_now(now_ms);
        self.counters.injected += 1;
        let mark = out.transmits.len();
        let here = self.env.here;
        let r = self.capsule(here, bytes, now_ms, out);
        self.protect(&mut [], out, mark, now_ms);
        r
    }

    /// Hands a capsule-protocol message from neighbour `prev` to the
    /// sandbox and carries out its actions; a refusal is counted and returned.
    pub(super) fn capsule(
        &mut self,
        prev: Ipv4Addr,
        msg: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) -> Result<(), CapsuleError> {
        if self.modules.is_none() {
            self.counters.drop(Drop::UnknownType);
            return Ok(());
        }
        self.counters.rx_capsule += 1;
        let r = match self.with_sandbox(now_ms, out, |sb, now, a| sb.handle_capsule(now, prev, msg, a)) {
            Some(Err(e)) => {
                self.counters.drop(Drop::CapsuleRefused);
                Err(e)
            }
            _ => Ok(()),
        };
        // Verified capsules (with RCANE on) wait as events of their
        // principal's session: queued on its pool, run by its VP.
        let mut jobs = Vec::new();
        if let Some(m) = self.modules.as_mut() {
            m.sb.take_capsule_jobs(&mut jobs);
        }
        self.post_jobs(&mut jobs, out);
        r
    }

    /// Whether `p` may send `bytes` more now (always, without RCANE).
    fn tx_allow(&mut self, p: PrincipalId, bytes: usize) -> bool {
        let now_ms = self.now_ms;
        match self.sched.as_mut() {
            Some(s) => {
                let now_ns = s.ns(now_ms);
                s.tx_allow(p, bytes as u64, now_ns)
            }
            None => true,
        }
    }

    /// Delivers to the local application that registered `port`, never to a
    /// module channel (a module's output does not loop into modules).
    pub(super) fn deliver_to_app(&mut self, port: u16, payload: &[u8], owner: Owner, out: &mut Outbox) {
        if self.ports.contains(&port) {
            self.counters.delivered += 1;
            let data = out.push_arena(&[payload]);
            out.deliveries.push(super::Delivery { port, data, owner });
        } else {
            self.counters.drop(Drop::NoListener);
        }
    }

    /// Posts the jobs early demultiplexing queued for module channels on
    /// their channels' VPs' pools.
    pub(super) fn channel_deliveries(&mut self, out: &mut Outbox) {
        if self.to_channels.is_empty() {
            return;
        }
        let mut jobs = std::mem::take(&mut self.to_channels);
        self.post_jobs(&mut jobs, out);
        // Keep the (now empty) buffer's capacity.
        jobs.clear();
        self.to_channels = jobs;
    }

    /// Calls the sandbox with its (reused, cleared) action list, then
    /// carries out the actions and records who ran. None when modules are off.
    pub(super) fn with_sandbox<R>(
        &mut self,
        now_ms: u64,
        out: &mut Outbox,
        f: impl FnOnce(&mut Sandbox, Now, &mut Vec<Action>) -> R,
    ) -> Option<R> {
        let m = self.modules.as_mut()?;
        let now = m.now(now_ms);
        let mut actions = std::mem::take(&mut m.actions);
        let mut runs = std::mem::take(&mut m.invocations);
        actions.clear();
        let r = f(&mut m.sb, now, &mut actions);
        m.sb.take_invocations(&mut runs);
        for Invocation { module, principal, fuel, .. } in runs.drain(..) {
            out.runs.push(Run::Module { module, principal, fuel });
        }
        self.module_actions(&mut actions, out);
        if let Some(m) = self.modules.as_mut() {
            m.actions = actions;
            m.invocations = runs;
        }
        Some(r)
    }

    /// Carries out what modules asked for, each for its principal.
    fn module_actions(&mut self, actions: &mut Vec<Action>, out: &mut Outbox) {
        for a in actions.drain(..) {
            // A principal's packets within its transmit allowance only.
            let over = match &a {
                Action::SendCapsule { principal: Some(p), bytes, .. } => !self.tx_allow(*p, bytes.len()),
                Action::SendPacket { principal, payload, .. } => !self.tx_allow(*principal, payload.len()),
                _ => false,
            };
            if over {
                self.counters.drop(Drop::TxLimit);
                continue;
            }
            match a {
                Action::SendCapsule { principal, to, bytes } => match self.env.link.get(&to).copied() {
                    Some((iface, ep)) => {
                        let data = out.push_frame(anep::TYPE_CAPSULE, &[&bytes]);
                        let owner = principal.map_or(Owner::System, Owner::Principal);
                        out.transmits.push(Transmit { iface, to: ep, data, owner, unsealed: false, flow: None });
                    }
                    None => self.counters.drop(Drop::NoRoute),
                },
                Action::SendPacket { principal, dst, port, payload, flow } => {
                    // A channel holding a transmit reservation is a flow of
                    // its own on paced links; any other packet goes with
                    // the session's others.
                    let flow = flow
                        .filter(|f| self.modules.as_ref().is_some_and(|m| m.sb.flow_tx(&principal, Some(*f)).1 > 0));
                    let n = out.transmits.len();
                    self.send_plain(dst, port, 64, &payload, Owner::Principal(principal), out);
                    if let Some(f) = flow {
                        for t in out.transmits.iter_mut().skip(n) {
                            t.flow = Some(f);
                        }
                    }
                }
                Action::DeliverLocal { principal, port, payload } => {
                    self.deliver_to_app(port, &payload, Owner::Principal(principal), out);
                }
                Action::HeapRequest { principal, module, bytes } => {
                    let now_ms = self.now_ms;
                    self.module_heap_request(principal, module, bytes, now_ms);
                }
                Action::Log { module, principal, text } => {
                    use core::fmt::Write;
                    let _ = writeln!(out.log, "module {module} ({principal}): {text}");
                }
            }
        }
    }
}
