//! Channels: packets whose port, source and payload a module channel's
//! demultiplexing specification matches ([`crate::demux`]) are queued in
//! that channel's bounded FIFO as jobs for its VP, or delivered at once.

use super::*;
use crate::demux::{ChannelInfo, DemuxOutcome, Refusal};

impl Sandbox {
    /// Delivers a packet for `port` from `source` to every channel whose demux
    /// spec matches, at once (no queue). Returns how many entries ran.
    pub fn deliver(&mut self, now: Now, source: Ipv4Addr, port: u16, payload: &[u8], out: &mut Vec<Action>) -> usize {
        let targets: Vec<(ModuleId, i32, u64)> = self
            .channels
            .lookup(port, source, payload)
            .filter_map(|c| Some((c.module, c.handle, c.subflow(source, payload)?)))
            .collect();
        let mut n = 0;
        for (module, handle, subflow) in targets {
            let Ok(Some(entry)) = self.object_entry(module, handle) else { continue };
            self.counters.channel_deliveries += 1;
            if let Ok(task) = self.start_call(now, module, &entry, handle, payload, (u32::from(source), subflow), None)
            {
                let _ = self.resume(task, &mut || true, out);
            }
            n += 1;
        }
        n
    }

    /// Whether any module has a channel open.
    pub fn has_channels(&self) -> bool {
        !self.channels.is_empty()
    }

    /// Whether some module's channel's filter takes a packet for `port`
    /// from `source` with this payload.
    pub fn has_channel(&self, port: u16, source: Ipv4Addr, payload: &[u8]) -> bool {
        self.channels.lookup(port, source, payload).next().is_some()
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

    /// Early demultiplexing of a packet for `port` from `source`: for each
    /// channel whose filter matches (only `port`'s channels are looked at),
    /// a job holding room in that channel's FIFO and in its principal's
    /// heap, or a drop counted against that channel only. The payload is
    /// copied for the channels that take it, and for no other.
    pub fn demux_into(&self, source: Ipv4Addr, port: u16, payload: &[u8], jobs: &mut Vec<Job>) -> DemuxOutcome {
        self.demux_policed(source, port, payload, jobs, &mut |_, _| true)
    }

    /// [`Sandbox::demux_into`], with each matching channel's principal's
    /// receive allowance asked first (`rx_allow(principal, bytes)`; false:
    /// dropped and counted as `dropped_rate` on that channel).
    pub fn demux_policed(
        &self,
        source: Ipv4Addr,
        port: u16,
        payload: &[u8],
        jobs: &mut Vec<Job>,
        rx_allow: &mut dyn FnMut(PrincipalId, usize) -> bool,
    ) -> DemuxOutcome {
        let mut o = DemuxOutcome::default();
        for c in self.channels.lookup(port, source, payload) {
            o.matched += 1;
            if let Some(m) = self.modules.get(&c.module)
                && !rx_allow(m.principal, payload.len())
            {
                c.count_rate_drop();
                o.rate += 1;
                continue;
            }
            // The queued packet is charged to its principal's heap: a
            // session that never reads its channel stops at its reservation.
            let Some(heap) = self.job_charge(c.module, payload.len()) else {
                c.count_full();
                o.full += 1;
                continue;
            };
            match c.admit(source, payload) {
                Ok((fifo, subflow)) => {
                    let mut job =
                        Job::new(c.module, JobKind::Channel { handle: c.handle }, payload.to_vec(), u32::from(source));
                    job.heap = heap;
                    job.fifo = fifo;
                    job.vp = c.vp;
                    job.subflow = subflow;
                    jobs.push(job);
                    o.queued += 1;
                }
                Err(Refusal::Full | Refusal::Share) => o.full += 1,
                Err(Refusal::Malformed) => o.malformed += 1,
                Err(Refusal::Rate) => o.rate += 1,
            }
        }
        o
    }

    /// Jobs for a packet for `port` from `source`: [`Sandbox::demux_into`]'s,
    /// returning how many were queued.
    pub fn channel_jobs(&self, source: Ipv4Addr, port: u16, payload: &[u8], jobs: &mut Vec<Job>) -> usize {
        self.demux_into(source, port, payload, jobs).queued
    }

    /// Every open channel's spec, VP, FIFO and counters (for `anode status`).
    pub fn channel_infos(&self) -> Vec<ChannelInfo> {
        let mut v: Vec<ChannelInfo> = self.channels.iter().map(|r| r.info()).collect();
        v.sort_by_key(|i| (i.module, i.handle));
        v
    }

    /// Charges a queued job of `input` bytes for `module` to its
    /// principal's heap; `None` (a refusal counted) if it does not fit.
    pub(super) fn job_charge(&self, module: ModuleId, input: usize) -> Option<HeapCharge> {
        let m = self.modules.get(&module)?;
        let t = self.tenants.get(&m.principal)?;
        HeapCharge::job(&t.heap, input)
    }
}
