//! Timers: module alarms, code-fetch timeouts, and the dates at which
//! loaded modules' credentials are decided again (a module its credential
//! no longer allows is unloaded).

use super::*;

impl Sandbox {
    /// The earliest time [`Sandbox::handle_timeout`] has work (alarms, fetch timeouts).
    pub fn poll_at(&self) -> Option<u64> {
        if self.heap_signal.load(std::sync::atomic::Ordering::Relaxed) {
            // Heap pressure: its callbacks are due now.
            return Some(0);
        }
        let a = self.alarms.peek().map(|Reverse((d, _, _))| *d);
        let f = self.fetches.values().map(|f| f.deadline).min();
        let r = self.rechecks.peek().map(|Reverse((d, _))| *d);
        let p = self.pod_rechecks.peek().map(|Reverse((d, _))| *d);
        [a, f, r, p].into_iter().flatten().min()
    }

    /// Fires due alarms (at most [`SandboxConfig::alarms_per_poll`]), expires
    /// fetches, and unloads modules whose credentials no longer allow them.
    pub fn handle_timeout(&mut self, now: Now, out: &mut Vec<Action>) {
        let mut jobs = Vec::new();
        self.due_jobs(now, &mut jobs);
        for job in jobs {
            if let Ok(Some(task)) = self.start(now, job) {
                let _ = self.resume(task, &mut || true, out);
            }
        }
    }

    /// Takes the alarms due at `now` (at most [`SandboxConfig::alarms_per_poll`])
    /// as jobs, for the node to queue on their principals' pools; also
    /// expires code fetches and decides again on credentials whose date has
    /// come. An alarm cancelled or re-armed after this is skipped when its
    /// job starts.
    pub fn due_jobs(&mut self, now: Now, jobs: &mut Vec<Job>) {
        self.recheck_due(now);
        self.recheck_pods_due(now);
        let mut n = 0;
        while n < self.cfg.alarms_per_poll {
            let Some(Reverse((d, module, handle))) = self.alarms.peek().copied() else { break };
            if d > now.ms {
                break;
            }
            self.alarms.pop();
            if self.modules.contains_key(&module) {
                n += 1;
                jobs.push(Job::new(module, JobKind::Alarm { handle, deadline: d }, Vec::new(), 0));
            }
        }
        self.pressure_jobs(jobs);
        self.expire_fetches(now);
    }

    /// The heap-pressure callbacks due: for each principal whose account
    /// flagged pressure, a job for the [`PRESSURE_ENTRY`](crate::heap::PRESSURE_ENTRY)
    /// of each of its modules that registered one (argument: its use in
    /// percent of its reservation).
    fn pressure_jobs(&mut self, jobs: &mut Vec<Job>) {
        use crate::heap::PRESSURE_ENTRY;
        if !self.heap_signal.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut ids: Vec<(ModuleId, i32)> = Vec::new();
        for (p, t) in &self.tenants {
            let (flagged, pct) = crate::heap::with(&t.heap, |a| (a.take_pressure(), a.percent()));
            if !flagged {
                continue;
            }
            ids.extend(
                self.modules
                    .iter()
                    .filter(|(_, m)| m.principal == *p && m.kind == ModuleKind::Module)
                    .filter(|(_, m)| m.entries.contains_key(PRESSURE_ENTRY))
                    .map(|(id, _)| (*id, pct)),
            );
        }
        ids.sort();
        for (id, pct) in ids {
            jobs.push(Job::new(id, JobKind::Entry { entry: PRESSURE_ENTRY.into(), arg: pct }, Vec::new(), 0));
        }
    }

    fn expire_fetches(&mut self, now: Now) {
        let expired: Vec<ModuleHash> =
            self.fetches.iter().filter(|(_, f)| f.deadline <= now.ms).map(|(h, _)| *h).collect();
        for h in expired {
            if let Some(f) = self.fetches.remove(&h) {
                self.counters.fetch_timeouts += 1;
                self.counters.pending_dropped += f.waiting.len() as u64;
                self.pending -= f.waiting.len();
                debug!(hash = %h, dropped = f.waiting.len(), "code fetch timed out");
            }
        }
    }

    /// Schedules the next decision on module `id`'s credential at `at`.
    pub(super) fn schedule_recheck(&mut self, now: Now, id: ModuleId, at: Option<std::time::SystemTime>) {
        if let Some(t) = at {
            self.rechecks.push(Reverse((due_ms(now, t), id)));
        }
    }

    /// Decides again on the credentials of modules whose recheck time has
    /// come; a module its credential no longer allows is unloaded.
    pub(super) fn recheck_due(&mut self, now: Now) {
        while let Some(Reverse((at, id))) = self.rechecks.peek().copied() {
            if at > now.ms {
                break;
            }
            self.rechecks.pop();
            let Some((rc, name, interfaces, principal)) = self
                .modules
                .get(&id)
                .and_then(|m| Some((m.recheck.clone()?, m.local_name.clone(), m.interfaces, m.principal)))
            else {
                continue;
            };
            match rc.decide(&mut self.verifier, now, name.as_deref(), interfaces) {
                Ok(next) => self.schedule_recheck(now, id, next),
                Err(e) => {
                    warn!(module = %id, principal = %principal, reason = %e,
                          "module unloaded: its credential no longer allows it");
                    self.unload(id);
                    self.counters.credential_unloads += 1;
                }
            }
        }
    }
}
