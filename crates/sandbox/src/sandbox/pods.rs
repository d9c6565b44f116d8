//! Loading pods (Expert §3.1) through the module loader: the code is checked
//! and its credential decided as a module's is, then the pod hub compiles
//! and instantiates it on its own engine. See `crate::pods` and docs/pods.md.

use super::*;
use crate::pods::{Client, HubCounters, OnFault, PodError, PodId, PodInfo, PodLoad};

/// What a pod is loaded from.
#[derive(Debug, Clone)]
pub struct PodSpec<'a> {
    /// The wasm binary.
    pub code: &'a [u8],
    /// The credential (Biscuit bytes); it must grant the `pod` interface.
    pub credential: Option<&'a [u8]>,
    /// The authenticated requester, if any.
    pub requester: Option<PrincipalId>,
    /// The pod's name: its offers are `<name>.<entry>`.
    pub name: &'a str,
    /// Limits asked for: `cpu` is the most one call may spend, `memory`
    /// caps the pod's linear memory.
    pub limits: RequestedLimits,
    /// Principals that may bind (`None`: any principal whose module's
    /// credential grants `pod`).
    pub clients: Option<Vec<PrincipalId>>,
    /// What to do when the pod traps or is cut off.
    pub on_fault: OnFault,
    /// Fuel a caller must have left for a call to enter the pod (Expert
    /// §3.4: "reject calls from threads with insufficient CPU guarantees");
    /// 0: none. See `crate::pods::PodLoad::min_fuel`.
    pub min_fuel: u64,
}

impl Sandbox {
    /// Loads a pod: size, signature and import checks and the credential
    /// decision as for [`Sandbox::load`]; the credential must grant `pod`
    /// and the pod may import nothing but the `pod` interface.
    ///
    /// # Errors
    /// [`PodError`]; nothing is kept on error.
    pub fn load_pod(&mut self, now: Now, spec: &PodSpec<'_>) -> Result<PodId, PodError> {
        let r = self.load_pod_inner(now, spec);
        match &r {
            Ok(id) => info!(pod = %id, name = spec.name, "pod loaded"),
            Err(e) => warn!(reason = %e, name = spec.name, "pod load refused"),
        }
        r
    }

    fn load_pod_inner(&mut self, now: Now, spec: &PodSpec<'_>) -> Result<PodId, PodError> {
        let ins = self.inspect(spec.code)?;
        let grant = self.authorize(now, &ins, spec.credential, spec.requester, Some(spec.name), spec.limits)?;
        if !grant.interfaces.contains(Interface::Pod) {
            return Err(PodError::NotGranted);
        }
        if let Some(i) = ins.imports.iter().find(|i| i.interface != Some(Interface::Pod)) {
            return Err(PodError::ForbiddenImport(format!("{}.{}", i.module, i.name)));
        }
        let recheck_at = grant.recheck_at;
        let load = PodLoad {
            name: spec.name,
            principal: grant.principal,
            code: spec.code,
            cpu: grant.limits.cpu,
            memory: usize::try_from(grant.limits.memory).unwrap_or(usize::MAX),
            clients: spec.clients.clone(),
            on_fault: spec.on_fault,
            min_fuel: spec.min_fuel,
        };
        // The pod is one of its owner's module instances: its memories and
        // tables are charged to the owner's heap account, within its
        // session's reservation (RCANE §IV-E), as well as to its own cap.
        let heap = self.heap_account(grant.principal);
        let id = self.pods.lock().load_charged(&load, Some(heap))?;
        // A credential with a date is decided again then, as a module's is.
        if let (Some(at), Some(c)) = (recheck_at, spec.credential) {
            let rc = Recheck { credential: c.into(), requester: spec.requester, limits: spec.limits, info: ins.info };
            self.pod_recheck.insert(id, (rc, spec.name.to_string(), ins.interfaces));
            self.pod_rechecks.push(Reverse((due_ms(now, at), id)));
        }
        Ok(id)
    }

    /// Decides again on the credentials of pods whose date has come; a pod
    /// its credential no longer allows is unloaded (its clients get
    /// `E_GONE`), counted in `credential_unloads`.
    pub(super) fn recheck_pods_due(&mut self, now: Now) {
        while let Some(Reverse((at, id))) = self.pod_rechecks.peek().copied() {
            if at > now.ms {
                break;
            }
            self.pod_rechecks.pop();
            let Some((rc, name, interfaces)) = self.pod_recheck.get(&id) else { continue };
            match rc.decide(&mut self.verifier, now, Some(name), *interfaces) {
                Ok(Some(t)) => self.pod_rechecks.push(Reverse((due_ms(now, t), id))),
                Ok(None) => {
                    self.pod_recheck.remove(&id);
                }
                Err(e) => {
                    warn!(pod = %id, name = %name, reason = %e, "pod unloaded: its credential no longer allows it");
                    self.unload_pod(id);
                    self.counters.credential_unloads += 1;
                }
            }
        }
    }

    /// Unloads a pod; later calls on bindings to it get `E_GONE`.
    pub fn unload_pod(&mut self, id: PodId) -> bool {
        self.pod_recheck.remove(&id);
        self.pods.lock().unload(id)
    }

    /// The loaded pods, with their counters.
    pub fn pods(&self) -> Vec<PodInfo> {
        self.pods.lock().list()
    }

    /// The pod binder's refusal counters.
    pub fn pod_counters(&self) -> HubCounters {
        self.pods.lock().counters()
    }

    /// Bindings module `id` holds.
    pub fn pod_bindings(&self, id: ModuleId) -> usize {
        self.pods.lock().bindings_of(Client::Module(id.0))
    }

    pub(super) fn forget_pod_client(&mut self, id: ModuleId) {
        self.pods.lock().forget_client(Client::Module(id.0));
    }
}
