//! Channels: packets for a port whose demultiplexing specification (port
//! and payload prefix) a module's channel matches are delivered to that
//! module's entry.

use super::*;

impl Sandbox {
    /// Delivers a packet for `port` from `source` to every channel whose demux
    /// spec matches (port, and payload prefix). Returns how many entries ran.
    pub fn deliver(&mut self, now: Now, source: Ipv4Addr, port: u16, payload: &[u8], out: &mut Vec<Action>) -> usize {
        let targets: Vec<(ModuleId, i32)> = self
            .channels
            .iter()
            .filter(|c| c.port == port && payload.starts_with(&c.prefix))
            .map(|c| (c.module, c.handle))
            .collect();
        let mut n = 0;
        for (module, handle) in targets {
            let Ok(Some(entry)) = self.object_entry(module, handle) else { continue };
            self.counters.channel_deliveries += 1;
            let _ = self.call(now, module, &entry, handle, payload, u32::from(source), None, out);
            n += 1;
        }
        n
    }

    /// Whether any module has a channel open.
    pub fn has_channels(&self) -> bool {
        !self.channels.is_empty()
    }

    /// Whether some module's channel would take a packet for `port` with
    /// this payload (a cheap check before [`Sandbox::deliver`]).
    pub fn has_channel(&self, port: u16, payload: &[u8]) -> bool {
        self.channels.iter().any(|c| c.port == port && payload.starts_with(&c.prefix))
    }

    /// The entry of `module`'s channel or alarm `handle`; `Ok(None)` if the
    /// handle is gone.
    pub(super) fn object_entry(&self, module: ModuleId, handle: i32) -> Result<Option<String>, InvokeError> {
        let m = self.modules.get(&module).ok_or(InvokeError::NoSuchModule)?;
        let t = self.tenants.get(&m.principal).ok_or(InvokeError::NoSuchModule)?;
        let s = t.space(m.kind).ok_or(InvokeError::NoSuchModule)?;
        let store = s.store.as_ref().ok_or(InvokeError::Busy)?;
        Ok(store.data().handles.get(module.0, handle).map(|o| match o {
            Obj::Channel { entry, .. } | Obj::Alarm { entry, .. } => entry.clone(),
        }))
    }

    /// Jobs for a packet for `port` from `source`: one per channel whose
    /// demultiplexing specification (port, payload prefix) matches. The
    /// node queues them on the pools of the modules' principals.
    pub fn channel_jobs(&self, source: Ipv4Addr, port: u16, payload: &[u8], jobs: &mut Vec<Job>) -> usize {
        let before = jobs.len();
        for c in self.channels.iter().filter(|c| c.port == port && payload.starts_with(&c.prefix)) {
            // The queued packet is charged to its principal's heap: a
            // session that never reads its channel stops at its reservation.
            let Some(heap) = self.job_charge(c.module, payload.len()) else { continue };
            let mut job =
                Job::new(c.module, JobKind::Channel { handle: c.handle }, payload.to_vec(), u32::from(source));
            job.heap = heap;
            jobs.push(job);
        }
        jobs.len() - before
    }

    /// Charges a queued job of `input` bytes for `module` to its
    /// principal's heap; `None` (a refusal counted) if it does not fit.
    pub(super) fn job_charge(&self, module: ModuleId, input: usize) -> Option<HeapCharge> {
        let m = self.modules.get(&module)?;
        let t = self.tenants.get(&m.principal)?;
        HeapCharge::job(&t.heap, input)
    }
}
