//! Preemptible invocations (RCANE §IV-C): a [`Job`] (an entry, an alarm,
//! a channel packet) is started as a [`Task`] that owns its principal's
//! store while it runs, and is resumed until it is done.
//!
//! With fuel as the CPU bound, the store yields every
//! [`SandboxConfig::yield_fuel`] units of fuel (wasmtime's async support on
//! a fiber): at each yield [`Sandbox::resume`] asks the caller whether to
//! go on. When the caller's slice is over, the task comes back
//! [`Step::Yielded`] and resumes later, in its own virtual processor,
//! exactly where it stopped. The per-invocation fuel bound still holds
//! across yields: a module that spins forever is stopped when its grant's
//! `cpu` is spent, however many slices that takes.
//!
//! While a task holds a store, other invocations for the same principal's
//! store are refused with [`InvokeError::Busy`] (the node keeps them and
//! retries), and loads for that principal with [`LoadError::Busy`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::*;

type Running = Pin<Box<dyn Future<Output = (Store<TenantState>, wasmtime::Result<i32>)> + Send>>;

/// What a [`Job`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobKind {
    /// A registered entry, by name, with its argument.
    Entry {
        /// The entry's name.
        entry: String,
        /// Its argument.
        arg: i32,
    },
    /// Alarm `handle`, due at `deadline` (ms): runs its entry if the alarm
    /// is still set (not cancelled, not re-armed).
    Alarm {
        /// The alarm's handle.
        handle: i32,
        /// Its deadline when it was taken from the timer queue.
        deadline: u64,
    },
    /// A packet for channel `handle` (the input is the payload).
    Channel {
        /// The channel's handle.
        handle: i32,
    },
    /// A verified capsule's entry (the input is its data, the source its
    /// previous hop).
    Capsule {
        /// The entry's name.
        entry: String,
        /// What the capsule's code may ask about itself.
        ctx: CapsuleJob,
    },
}

/// A queued capsule's own context (its code hash, credential and code, for
/// the capsule interfaces), opaque outside the sandbox.
#[derive(Debug, Clone)]
pub struct CapsuleJob(pub(crate) CapsuleCtx);

impl PartialEq for CapsuleJob {
    fn eq(&self, other: &Self) -> bool {
        self.0.hash == other.0.hash && self.0.credential == other.0.credential && self.0.code == other.0.code
    }
}

impl Eq for CapsuleJob {}

/// One unit of module work, an RCANE event: queued on a pool, run by the
/// pool's virtual processor. A queued packet or capsule holds its bytes of
/// its principal's heap until the job starts or is dropped (`crate::heap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The module.
    pub module: ModuleId,
    /// What to run.
    pub kind: JobKind,
    /// The invocation's input (a packet payload, say).
    pub input: Vec<u8>,
    /// The source address (`net.source`), 0 if none.
    pub source: u32,
    /// What it holds of its principal's heap (nothing for a clone).
    pub(crate) heap: HeapCharge,
    /// What it holds of its channel's FIFO (channel packets only).
    pub(crate) fifo: crate::demux::FifoCharge,
    /// The index of its session's VP that runs it (a channel's VP; 0
    /// otherwise).
    pub vp: u8,
    /// The packet's sub-flow (`net.subflow`): the hash of its channel's
    /// key fields; 0 for a channel without keys and for other jobs.
    pub subflow: u64,
}

impl Job {
    /// A job that holds nothing of any heap.
    pub fn new(module: ModuleId, kind: JobKind, input: Vec<u8>, source: u32) -> Job {
        Job {
            module,
            kind,
            input,
            source,
            heap: HeapCharge::default(),
            fifo: crate::demux::FifoCharge::default(),
            vp: 0,
            subflow: 0,
        }
    }

    /// Bytes of its principal's heap it holds while queued.
    pub fn heap_bytes(&self) -> usize {
        self.heap.bytes()
    }
}

/// A started invocation that owns its principal's store until it is done.
pub struct Task {
    module: ModuleId,
    principal: PrincipalId,
    kind: ModuleKind,
    space: u64,
    fuel: u64,
    yields: u64,
    /// The store's preemption-point counter (`TenantState::yield_count`).
    yield_count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    running: Running,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("module", &self.module)
            .field("principal", &self.principal)
            .field("yields", &self.yields)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// The module it runs.
    pub fn module(&self) -> ModuleId {
        self.module
    }

    /// The principal it runs for.
    pub fn principal(&self) -> PrincipalId {
        self.principal
    }

    /// How many times it has yielded so far.
    pub fn yields(&self) -> u64 {
        self.yields
    }
}

/// What [`Sandbox::resume`] did.
#[derive(Debug)]
pub enum Step {
    /// The invocation ended: its result (its actions were appended).
    Done(Result<i32, InvokeError>),
    /// The caller said stop at a preemption point: resume it later.
    Yielded(Task),
}

/// Drives `f` to its end, resuming at every yield (only fuel yields occur:
/// no host function is asynchronous).
pub(super) fn run_to_end<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

impl Sandbox {
    /// The principal whose module `job` runs (to choose its pool).
    pub fn job_principal(&self, job: &Job) -> Option<PrincipalId> {
        self.modules.get(&job.module).map(|m| m.principal)
    }

    /// Starts `job`. `Ok(None)`: nothing to run (its alarm was cancelled or
    /// re-armed, its channel closed).
    ///
    /// # Errors
    /// [`InvokeError::NoSuchModule`], [`InvokeError::UnregisteredEntry`], or
    /// [`InvokeError::Busy`] when another task holds the principal's store.
    pub fn start(&mut self, now: Now, job: Job) -> Result<Option<Task>, InvokeError> {
        let (entry, arg) = match job.kind {
            JobKind::Entry { entry, arg } => (entry, arg),
            JobKind::Alarm { handle, deadline } => match self.take_alarm(job.module, handle, deadline)? {
                Some(e) => {
                    self.counters.alarms_fired += 1;
                    (e, handle)
                }
                None => return Ok(None),
            },
            JobKind::Channel { handle } => match self.object_entry(job.module, handle)? {
                Some(e) => {
                    self.counters.channel_deliveries += 1;
                    (e, handle)
                }
                None => return Ok(None),
            },
            JobKind::Capsule { entry, ctx } => {
                let t = self.start_call(now, job.module, &entry, 0, &job.input, (job.source, 0), Some(ctx.0))?;
                self.counters.capsules_run += 1;
                return Ok(Some(t));
            }
        };
        self.start_call(now, job.module, &entry, arg, &job.input, (job.source, job.subflow), None).map(Some)
    }

    /// Runs `task` until it ends or, at a preemption point, `keep_going`
    /// returns `false`. Actions of a finished invocation go to `out`.
    pub fn resume(&mut self, mut task: Task, keep_going: &mut dyn FnMut() -> bool, out: &mut Vec<Action>) -> Step {
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match task.running.as_mut().poll(&mut cx) {
                Poll::Ready((store, r)) => return Step::Done(self.finish(task, store, r, out)),
                Poll::Pending => {
                    task.yields += 1;
                    task.yield_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.counters.yields += 1;
                    if !keep_going() {
                        self.counters.preempted += 1;
                        return Step::Yielded(task);
                    }
                }
            }
        }
    }

    /// Takes alarm `handle` of `module` if it is still due at `deadline`.
    fn take_alarm(&mut self, module: ModuleId, handle: i32, deadline: u64) -> Result<Option<String>, InvokeError> {
        let m = self.modules.get(&module).ok_or(InvokeError::NoSuchModule)?;
        let s = self.space_mut(m.principal, m.kind).ok_or(InvokeError::NoSuchModule)?;
        let store = s.store.as_mut().ok_or(InvokeError::Busy)?;
        let d = store.data_mut();
        match d.handles.get(module.0, handle) {
            Some(Obj::Alarm { deadline: dl, entry }) if *dl == deadline => {
                let e = entry.clone();
                d.handles.remove(module.0, handle);
                d.sync_handles();
                Ok(Some(e))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn space_mut(&mut self, principal: PrincipalId, kind: ModuleKind) -> Option<&mut Space> {
        self.tenants.get_mut(&principal)?.slot(kind).as_mut()
    }

    /// Starts entry `entry` of module `id`: takes the principal's store,
    /// arms the CPU bound, and makes the task.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_call(
        &mut self,
        now: Now,
        id: ModuleId,
        entry: &str,
        arg: i32,
        input: &[u8],
        (source, subflow): (u32, u64),
        capsule: Option<CapsuleCtx>,
    ) -> Result<Task, InvokeError> {
        self.counters.invocations += 1;
        let cpu = self.cfg.cpu;
        let r = (|| {
            let m = self.modules.get_mut(&id).ok_or(InvokeError::NoSuchModule)?;
            let Some(f) = m.entries.get(entry).cloned() else {
                m.counters.invocations += 1;
                m.counters.unregistered_entry += 1;
                return Err(InvokeError::UnregisteredEntry(entry.into()));
            };
            let (principal, kind, fuel) = (m.principal, m.kind, m.grant.limits.cpu);
            let t = self.tenants.get_mut(&principal).ok_or(InvokeError::NoSuchModule)?;
            let space = t.slot(kind).as_mut().ok_or(InvokeError::NoSuchModule)?;
            let mut store = space.store.take().ok_or(InvokeError::Busy)?;
            m.counters.invocations += 1;
            begin_call(&mut store, id, now, (source, subflow), input, capsule, m.memory);
            arm(&mut store, cpu, fuel);
            let len = input.len() as i32;
            let yield_count = store.data().yield_count.clone();
            let running: Running = if space.yields {
                Box::pin(async move {
                    let r = f.call_async(&mut store, (arg, len)).await;
                    (store, r)
                })
            } else {
                Box::pin(async move {
                    let r = f.call(&mut store, (arg, len));
                    (store, r)
                })
            };
            Ok(Task { module: id, principal, kind, space: space.id, fuel, yields: 0, yield_count, running })
        })();
        if let Err(e) = &r {
            *self.counters.invoke_failed.entry(e.label()).or_default() += 1;
        }
        r
    }

    /// Puts the task's store back and turns the outcome into a result,
    /// counters, an invocation record and actions.
    fn finish(
        &mut self,
        task: Task,
        mut store: Store<TenantState>,
        r: wasmtime::Result<i32>,
        out: &mut Vec<Action>,
    ) -> Result<i32, InvokeError> {
        let id = task.module;
        let used = match self.cfg.cpu {
            CpuBound::Fuel => {
                // Host-call fuel still owed is used too (never more than the grant).
                let owed = std::mem::take(&mut store.data_mut().fuel_owed);
                task.fuel.saturating_sub(store.get_fuel().unwrap_or(0)).saturating_add(owed).min(task.fuel)
            }
            CpuBound::Epoch { .. } => 0,
        };
        if self.invocations.len() < MAX_INVOCATION_RECORDS {
            self.invocations.push(Invocation { module: id, principal: task.principal, fuel: used, ok: r.is_ok() });
        }
        let d = store.data_mut();
        let regs = std::mem::take(&mut d.call.registrations);
        let ops = std::mem::take(&mut d.ops);
        let log_dropped = d.call.log_dropped;
        let mem_exceeded = d.limiter.exceeded;
        let mut actions = std::mem::take(&mut d.call.out);
        drop_call(&mut store);
        self.restore(&task, store);
        let r = match self.modules.get_mut(&id) {
            None => Err(InvokeError::NoSuchModule),
            Some(m) => {
                m.counters.log_dropped += u64::from(log_dropped);
                for (n, f) in regs {
                    if m.entries.len() < crate::MAX_ENTRIES || m.entries.contains_key(&n) {
                        m.entries.insert(n, f);
                    }
                }
                match r {
                    Ok(v) => {
                        m.counters.ok += 1;
                        out.append(&mut actions);
                        Ok(v)
                    }
                    Err(e) => {
                        let err = classify(&e, mem_exceeded);
                        match err {
                            InvokeError::CpuExhausted => m.counters.cpu_exhausted += 1,
                            InvokeError::MemoryLimit => m.counters.memory_exhausted += 1,
                            _ => m.counters.traps += 1,
                        }
                        Err(err)
                    }
                }
            }
        };
        if r.is_ok() || self.modules.contains_key(&id) {
            self.apply_ops(ops);
        }
        if let Err(e) = &r {
            *self.counters.invoke_failed.entry(e.label()).or_default() += 1;
            debug!(module = %id, error = %e, "invocation failed");
        }
        r
    }

    /// Gives a store back to its space, if that space still exists (it may
    /// have been freed, and even replaced, while the task ran): with the
    /// principal's current memory cap and routes, and the handles of
    /// modules unloaded meanwhile removed.
    fn restore(&mut self, task: &Task, mut store: Store<TenantState>) {
        let routes = self.routes.clone();
        let Some(t) = self.tenants.get_mut(&task.principal) else { return };
        let cap = t.cap();
        let Some(space) = t.slot(task.kind).as_mut().filter(|s| s.id == task.space && s.store.is_none()) else {
            return;
        };
        let d = store.data_mut();
        d.limiter.cap = cap;
        d.routes = routes;
        for owner in space.unloaded.drain(..) {
            drop(d.handles.remove_owner(owner));
        }
        d.sync_handles();
        space.mem_used = d.limiter.used;
        space.store = Some(store);
    }
}
