//! Invocation: calling a registered entry under a CPU bound (fuel or
//! epoch) to its end; a trap, running out of memory or of CPU ends that
//! call only and is counted. Every invocation is recorded for the node (who
//! ran, what it used). Preemptible invocations are in `task`.

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
        let task = self.start_call(now, id, entry, arg, input, (source, 0), capsule)?;
        match self.resume(task, &mut || true, out) {
            Step::Done(r) => r,
            // keep_going never says stop.
            Step::Yielded(_) => Err(InvokeError::Busy),
        }
    }

    pub(super) fn apply_ops(&mut self, ops: Vec<HostOp>) {
        for op in ops {
            match op {
                HostOp::ChannelOpened { module, handle, spec, vp } => {
                    self.channels.insert(crate::demux::Route::new(spec, module, handle, vp))
                }
                HostOp::ChannelClosed { module, handle } => self.channels.remove(module, handle),
                HostOp::ChannelRefused => self.counters.channel_refused += 1,
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
    (source, subflow): (u32, u64),
    input: &[u8],
    capsule: Option<CapsuleCtx>,
    memory: Option<wasmtime::Memory>,
) {
    let d = store.data_mut();
    d.call.memory = memory;
    d.fuel_owed = 0;
    d.fuel_paid_at = d.yield_count.load(std::sync::atomic::Ordering::Relaxed);
    d.call.module = id.0;
    d.call.now_ms = now.ms;
    d.call.source = source;
    d.call.subflow = subflow;
    d.call.input.clear();
    d.call.input.extend_from_slice(input);
    d.call.out.clear();
    d.call.sends = 0;
    d.call.capsule = capsule;
    d.call.log_dropped = 0;
    d.call.heap_asked = false;
    d.limiter.exceeded = false;
}

pub(super) fn drop_call(store: &mut Store<TenantState>) {
    let d = store.data_mut();
    d.call.out.clear();
    d.call.capsule = None;
    d.call.memory = None;
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
