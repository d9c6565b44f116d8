//! Invocation: calling a registered entry under a CPU bound (fuel or
//! epoch); a trap, running out of memory or of CPU ends that call only and
//! is counted. Every invocation is recorded for the node (who ran, what it
//! used).

use super::*;

impl Sandbox {
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
    pub(super) fn call(
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

    pub(super) fn apply_ops(&mut self, ops: Vec<HostOp>) {
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

    /// Moves the record of invocations since the last call into `into`:
    /// which module of which principal ran, and the fuel it used. The node
    /// turns them into owned executions (and, later, charges them).
    pub fn take_invocations(&mut self, into: &mut Vec<Invocation>) {
        into.append(&mut self.invocations);
    }
}

pub(super) fn begin_call(
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

pub(super) fn drop_call(store: &mut Store<TenantState>) {
    let d = store.data_mut();
    d.call.out.clear();
    d.call.capsule = None;
    d.call.registrations.clear();
    d.ops.clear();
}

pub(super) fn arm(store: &mut Store<TenantState>, cpu: CpuBound, fuel: u64) {
    match cpu {
        CpuBound::Fuel => {
            // Only fails when fuel is not enabled, which CpuBound::Fuel guarantees.
            let _ = store.set_fuel(fuel);
        }
        CpuBound::Epoch { ticks } => store.set_epoch_deadline(ticks),
    }
}

pub(super) fn classify(e: &wasmtime::Error, mem_exceeded: bool) -> InvokeError {
    if mem_exceeded {
        return InvokeError::MemoryLimit;
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) | Some(Trap::Interrupt) => InvokeError::CpuExhausted,
        Some(t) => InvokeError::Trap(t.to_string()),
        None => InvokeError::Trap(format!("{e:#}")),
    }
}
