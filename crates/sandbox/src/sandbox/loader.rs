//! The loader (ALIEN's Loader, SANE §2): a module's code is checked (size,
//! hash, programmer signature, imports), its credential decided once,
//! compiled (or found in the code cache), and instantiated in its
//! principal's own store with only the granted host interfaces (module
//! thinning); loads are idempotent; unloading frees the principal's store
//! with its last module.

use super::*;

impl Sandbox {
    pub(super) fn inspect(&self, code: &[u8]) -> Result<Inspected, LoadError> {
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

    pub(super) fn inspected_cached(&mut self, hash: &ModuleHash) -> Option<Inspected> {
        let e = self.cache.get(hash)?;
        Some(Inspected { info: e.info.clone(), imports: e.imports.clone(), interfaces: e.interfaces })
    }

    pub(super) fn authorize(
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
    pub(super) fn pre_for(
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

    pub(super) fn linker(&mut self, granted: InterfaceSet) -> Result<&Linker<TenantState>, LoadError> {
        if !self.linkers.contains_key(&granted) {
            let mut l =
                host::linker_for(&self.engine, granted).map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
            if granted.contains(Interface::Pod) {
                let yields = self.cfg.yield_fuel.filter(|_| self.cfg.cpu == CpuBound::Fuel);
                crate::pods::define_for_modules(&mut l, yields)
                    .map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
            }
            self.linkers.insert(granted, l);
        }
        self.linkers.get(&granted).ok_or_else(|| LoadError::Instantiate("no linker".into()))
    }

    /// `principal`'s heap account, made (with nothing charged and no
    /// store) if it has none yet: a pod's owner may load no module.
    pub(super) fn heap_account(&mut self, principal: PrincipalId) -> SharedHeap {
        self.tenant_entry(principal).heap.clone()
    }

    /// `principal`'s tenant, made bare if it has none: no store, nothing
    /// charged, caps of 0 until a grant raises them ([`Sandbox::tenant`]).
    fn tenant_entry(&mut self, principal: PrincipalId) -> &mut Tenant {
        let entries = self.cfg.state_entries;
        let session_heap = self.session_heaps.get(&principal).copied();
        let session_tx = self.session_txs.get(&principal).copied().unwrap_or(0);
        let signal = self.heap_signal.clone();
        self.tenants.entry(principal).or_insert_with(|| Tenant {
            modules: None,
            capsules: None,
            capsule_insts: HashMap::new(),
            state: Arc::new(Mutex::new(SoftState::new(0, entries))),
            mem_cap: 0,
            session_heap,
            heap: HeapAccount::shared(signal, session_heap),
            tx: {
                let mut b = crate::txbook::TxBook::default();
                b.set_session(session_tx);
                Arc::new(Mutex::new(b))
            },
        })
    }

    pub(super) fn tenant(&mut self, principal: PrincipalId, grant: &Grant) -> &mut Tenant {
        let t = self.tenant_entry(principal);
        // The principal's caps follow its most generous live grant (unless
        // its session's heap reservation caps it).
        let mem = grant.limits.memory as usize;
        if mem > t.mem_cap {
            t.mem_cap = mem;
            t.apply_cap();
        }
        if let Ok(mut s) = t.state.lock() {
            let cap = s.bytes().max(grant.limits.state as usize);
            s.set_cap(cap);
        }
        t
    }

    pub(super) fn new_space(&mut self, principal: PrincipalId) -> Option<Space> {
        let t = self.tenants.get(&principal)?;
        let mut data =
            TenantState::new(principal, t.cap(), t.heap.clone(), t.state.clone(), self.routes.clone(), self.cfg.host);
        data.pods = Some(self.pods.clone());
        data.tx = t.tx.clone();
        let mut store = Store::new(&self.engine, data);
        store.limiter(|d| &mut d.limiter);
        let mut yields = false;
        match self.cfg.cpu {
            CpuBound::Epoch { .. } => store.epoch_deadline_trap(),
            CpuBound::Fuel => {
                // Fails only for Some(0), refused in Sandbox::new.
                yields = self.cfg.yield_fuel.is_some() && store.fuel_async_yield_interval(self.cfg.yield_fuel).is_ok();
                // Each host function takes its call's fuel itself
                // (`host::charge_host`), with these.
                let d = store.data_mut();
                d.host_call_fuel = self.cfg.host_call_fuel;
                d.yields = yields;
            }
        }
        let id = self.next_space;
        self.next_space += 1;
        Some(Space { store: Some(store), id, yields, live: 0, instances: 0, unloaded: Vec::new(), mem_used: 0 })
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
    pub(super) fn find_loaded(
        &self,
        principal: PrincipalId,
        hash: ModuleHash,
        local_name: Option<&str>,
    ) -> Option<ModuleId> {
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

    pub(super) fn load_inner(
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
    /// Instantiates `pre` in `principal`'s store of this kind (made if
    /// needed), runs `anode_init` under the grant's CPU bound, and registers
    /// the module with the entries it registered. A failure leaves no trace
    /// (the store goes if it held nothing else).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn instantiate(
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
        let space = self.space_for(principal, grant, kind)?;
        match start_instance(space, id, now, cpu, grant, pre, actions) {
            Ok((regs, ops, memory)) => {
                self.register(id, principal, grant, kind, ins, regs);
                if let Some(m) = self.modules.get_mut(&id) {
                    m.memory = memory;
                }
                self.apply_ops(ops);
                Ok(id)
            }
            Err(e) => {
                self.reclaim_if_empty(principal, kind);
                Err(e)
            }
        }
    }

    /// The principal's store for modules or capsule instances, made on
    /// first use with the principal's memory cap.
    fn space_for(&mut self, principal: PrincipalId, grant: &Grant, kind: ModuleKind) -> Result<&mut Space, LoadError> {
        self.tenant(principal, grant);
        let missing = self.tenants.get(&principal).is_some_and(|t| t.space(kind).is_none());
        if missing {
            let s = self.new_space(principal).ok_or(LoadError::Instantiate("tenant".into()))?;
            let t = self.tenants.get_mut(&principal).ok_or(LoadError::Instantiate("tenant".into()))?;
            *t.slot(kind) = Some(s);
        }
        let t = self.tenants.get_mut(&principal).ok_or(LoadError::Instantiate("tenant".into()))?;
        t.slot(kind).as_mut().ok_or(LoadError::Instantiate("space".into()))
    }

    /// Records an instantiated module under `id`.
    fn register(
        &mut self,
        id: ModuleId,
        principal: PrincipalId,
        grant: &Grant,
        kind: ModuleKind,
        ins: &Inspected,
        regs: Vec<(String, Entry)>,
    ) {
        self.modules.insert(
            id,
            Loaded {
                kind,
                principal,
                hash: ins.info.hash,
                names: if kind == ModuleKind::Module { grant.names.clone() } else { Vec::new() },
                entries: regs.into_iter().collect(),
                interfaces: ins.interfaces,
                grant: grant.clone(),
                counters: ModuleCounters::default(),
                local_name: None,
                recheck: None,
                memory: None,
            },
        );
    }

    pub(super) fn reclaim_if_empty(&mut self, principal: PrincipalId, kind: ModuleKind) {
        if let Some(t) = self.tenants.get_mut(&principal) {
            let slot = t.slot(kind);
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
        self.channels.remove_module(id);
        self.forget_pod_client(id);
        if let Some(t) = self.tenants.get_mut(&m.principal) {
            if let Ok(mut b) = t.tx.lock() {
                b.remove_module(id.0);
            }
            if let Some(s) = t.slot(m.kind).as_mut() {
                match s.store.as_mut() {
                    Some(st) => {
                        st.data_mut().channel_auth.remove(&id.0);
                        drop(st.data_mut().handles.remove_owner(id.0))
                    }
                    None => s.unloaded.push(id.0),
                }
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
}

pub(super) fn forbidden(imports: &[Import], right: Interface) -> LoadError {
    let import = imports
        .iter()
        .find(|i| i.interface == Some(right))
        .map_or_else(|| format!("{}.*", right.name()), |i| format!("{}.{}", i.module, i.name));
    LoadError::ForbiddenImport { import, right: Some(right) }
}

/// Lists a module's imports and the interfaces they need; an import from no
/// host interface is refused.
pub(super) fn scan_imports(code: &[u8]) -> Result<(Vec<Import>, InterfaceSet), LoadError> {
    use wasmtime::wasmparser::{Parser, Payload};
    let mut imports = Vec::new();
    let mut set = InterfaceSet::EMPTY;
    for p in Parser::new(0).parse_all(code) {
        let p = p.map_err(|e| LoadError::Malformed(e.to_string()))?;
        if let Payload::ImportSection(r) = p {
            for imp in r.into_imports() {
                let imp = imp.map_err(|e| LoadError::Malformed(e.to_string()))?;
                let interface = if imp.module == host::CORE_MODULE || imp.module == host::SESSION_MODULE {
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

/// What a started instance registered: its entries, and the handle
/// operations (channels, alarms) to mirror.
type Started = (Vec<(String, Entry)>, Vec<HostOp>, Option<wasmtime::Memory>);

/// Instantiates `pre` in `space` and runs its `anode_init` (and start
/// function) under the grant's CPU bound: the entries it registered and the
/// handle operations to mirror; its actions are appended to `actions`.
fn start_instance(
    space: &mut Space,
    id: ModuleId,
    now: Now,
    cpu: CpuBound,
    grant: &Grant,
    pre: &InstancePre<TenantState>,
    actions: &mut Vec<Action>,
) -> Result<Started, LoadError> {
    let yields = space.yields;
    let store = space.store.as_mut().ok_or(LoadError::Busy)?;
    begin_call(store, id, now, (0, 0), &[], None, None);
    store.data_mut().channel_auth.insert(id.0, grant.channels.clone());
    arm(store, cpu, grant.limits.cpu);
    space.instances += 1;
    let instance = if yields { run_to_end(pre.instantiate_async(&mut *store)) } else { pre.instantiate(&mut *store) };
    let instance = match instance {
        Ok(i) => i,
        Err(e) => {
            let ex = store.data().limiter.exceeded;
            drop_call(store);
            drop(store.data_mut().handles.remove_owner(id.0));
            let cap = store.data().limiter.cap;
            return Err(if ex {
                LoadError::MemoryLimit { cap }
            } else if e.downcast_ref::<Trap>().is_some() {
                LoadError::InitFailed(classify(&e, false))
            } else {
                LoadError::Instantiate(format!("{e:#}"))
            });
        }
    };
    let memory = instance.get_memory(&mut *store, "memory");
    store.data_mut().call.memory = memory;
    // anode_init registers the module's entries.
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "anode_init") {
        arm(store, cpu, grant.limits.cpu);
        store.data_mut().limiter.exceeded = false;
        let r = if yields { run_to_end(init.call_async(&mut *store, ())) } else { init.call(&mut *store, ()) };
        if let Err(e) = r {
            let err = classify(&e, store.data().limiter.exceeded);
            drop_call(store);
            // What its init opened (alarms, channels) goes with it, or the
            // handles would count against the principal's limits forever.
            drop(store.data_mut().handles.remove_owner(id.0));
            return Err(LoadError::InitFailed(err));
        }
    }
    let d = store.data_mut();
    let regs = std::mem::take(&mut d.call.registrations);
    let ops = std::mem::take(&mut d.ops);
    actions.append(&mut d.call.out);
    drop_call(store);
    space.live += 1;
    Ok((regs, ops, memory))
}
