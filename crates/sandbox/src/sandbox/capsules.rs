//! The capsule engine: capsules carrying code or its hash, code fetched by
//! hash from the previous hop and verified, serving cached code to
//! neighbours, and running each capsule in its principal's capsule store.

use super::*;

impl Sandbox {
    /// Handles one capsule-protocol message from neighbour `from`.
    pub fn handle_capsule(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        let r = self.capsule_inner(now, from, msg, out);
        if let Err(e) = &r {
            *self.counters.capsule_refused.entry(e.label()).or_default() += 1;
            debug!(from = %from, error = %e, "capsule refused");
        }
        r
    }

    pub(super) fn capsule_inner(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        match Message::parse(msg)? {
            Message::Capsule(c) => {
                if let Some(code) = c.code {
                    let actual = ModuleHash::of(code);
                    if actual != c.hash {
                        return Err(CapsuleError::WrongHash { named: c.hash, actual });
                    }
                    return self.run_capsule(now, from, &c, code.into(), out);
                }
                let cached = self.cache.peek(&c.hash).map(|e| e.code.clone());
                match cached {
                    Some(code) => self.run_capsule(now, from, &c, code, out),
                    None => self.wait_for_code(now, from, c.hash, msg, out),
                }
            }
            Message::CodeRequest(h) => match self.cache.peek(&h) {
                Some(e) => {
                    let reply = (capsule::CODE_REPLY_HEADER + e.code.len()) as u64;
                    let rate = self.cfg.code_reply_bytes_per_sec;
                    let burst = (rate / 10).max((capsule::CODE_REPLY_HEADER + self.cfg.max_module) as u64);
                    if !self.replies.take(from, reply, (rate, burst), now.ms) {
                        return Err(CapsuleError::CodeReplyLimited(from));
                    }
                    let mut bytes = Vec::new();
                    capsule::encode_code_reply(&h, &e.code, &mut bytes)?;
                    out.push(Action::SendCapsule { principal: None, to: from, bytes });
                    self.counters.code_served += 1;
                    Ok(CapsuleOutcome::CodeServed)
                }
                None => {
                    self.counters.ignored += 1;
                    Ok(CapsuleOutcome::Ignored)
                }
            },
            Message::CodeReply { hash, code } => {
                if !self.fetches.contains_key(&hash) {
                    self.counters.ignored += 1;
                    return Ok(CapsuleOutcome::Ignored);
                }
                let actual = ModuleHash::of(code);
                if actual != hash {
                    // Keep waiting: a correct reply may still come before the timeout.
                    return Err(CapsuleError::WrongHash { named: hash, actual });
                }
                let Some(f) = self.fetches.remove(&hash) else { return Ok(CapsuleOutcome::Ignored) };
                self.pending -= f.waiting.len();
                self.counters.code_fetched += 1;
                let code: Arc<[u8]> = code.into();
                let mut results = Vec::with_capacity(f.waiting.len());
                for (prev, bytes) in f.waiting {
                    let r = match Message::parse(&bytes) {
                        Ok(Message::Capsule(c)) => self.run_capsule(now, prev, &c, code.clone(), out),
                        Ok(_) => Ok(CapsuleOutcome::Ignored),
                        Err(e) => Err(e.into()),
                    };
                    if let Err(e) = &r {
                        *self.counters.capsule_refused.entry(e.label()).or_default() += 1;
                    }
                    results.push(r.map(|o| match o {
                        CapsuleOutcome::Ran { result, .. } => result,
                        _ => 0,
                    }));
                }
                Ok(CapsuleOutcome::CodeArrived { results })
            }
        }
    }

    /// Whether verified capsules are run at once (`false`, the default) or
    /// handed to the node as [`Job`]s, so that they run as events of their
    /// principal's session, in its virtual processor (RCANE §IV-C). Only
    /// what precedes the entry is done at once: parsing, the code's hash,
    /// the credential's decision and the instance (with its `anode_init`).
    pub fn defer_capsules(&mut self, on: bool) {
        self.defer_capsules = on;
    }

    /// Moves the capsules verified since the last call (with
    /// [`Sandbox::defer_capsules`] on) into `into`, as jobs to queue on
    /// their principals' pools ([`Sandbox::job_principal`]).
    pub fn take_capsule_jobs(&mut self, into: &mut Vec<Job>) {
        into.append(&mut self.capsule_jobs);
    }

    pub(super) fn wait_for_code(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        hash: ModuleHash,
        msg: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        if self.pending >= self.cfg.max_pending {
            return Err(CapsuleError::PendingFull);
        }
        self.pending += 1;
        let requested = !self.fetches.contains_key(&hash);
        let deadline = now.ms + self.cfg.fetch_timeout_ms;
        self.fetches
            .entry(hash)
            .or_insert_with(|| Fetch { deadline, waiting: Vec::new() })
            .waiting
            .push((from, msg.to_vec()));
        if requested {
            let mut bytes = Vec::new();
            capsule::encode_code_request(&hash, &mut bytes);
            out.push(Action::SendCapsule { principal: None, to: from, bytes });
            self.counters.code_requests_sent += 1;
        }
        Ok(CapsuleOutcome::Pending { hash, requested })
    }

    pub(super) fn run_capsule(
        &mut self,
        now: Now,
        from: Ipv4Addr,
        c: &Capsule<'_>,
        code: Arc<[u8]>,
        out: &mut Vec<Action>,
    ) -> Result<CapsuleOutcome, CapsuleError> {
        let ins = match self.inspected_cached(&c.hash) {
            Some(i) => i,
            None => self.inspect(&code)?,
        };
        let cred = (!c.credential.is_empty()).then_some(c.credential);
        let grant = self.authorize(now, &ins, cred, None, None, RequestedLimits::default())?;
        let principal = grant.principal;
        let existing = self.tenants.get(&principal).and_then(|t| t.capsule_insts.get(&c.hash).copied());
        let id = match existing.filter(|id| self.modules.contains_key(id)) {
            Some(id) => {
                if let Some(m) = self.modules.get_mut(&id) {
                    m.grant = grant;
                }
                id
            }
            None => {
                self.maybe_recycle_capsules(principal);
                let pre = self.pre_for(&code, &ins, grant.interfaces)?;
                let id = self.instantiate(now, principal, &grant, &pre, ModuleKind::Capsule, &ins, out)?;
                if let Some(t) = self.tenants.get_mut(&principal) {
                    t.capsule_insts.insert(c.hash, id);
                }
                id
            }
        };
        let ctx = CapsuleCtx { hash: c.hash, credential: c.credential.into(), code };
        if self.defer_capsules {
            // Queued, it holds its data of its principal's heap.
            let Some(heap) = self.job_charge(id, c.data.len()) else {
                return Err(CapsuleError::HeapFull);
            };
            let mut job = Job::new(
                id,
                JobKind::Capsule { entry: c.entry.into(), ctx: CapsuleJob(ctx) },
                c.data.to_vec(),
                u32::from(from),
            );
            job.heap = heap;
            self.capsule_jobs.push(job);
            return Ok(CapsuleOutcome::Queued { module: id });
        }
        let result = self.call(now, id, c.entry, 0, c.data, u32::from(from), Some(ctx), out)?;
        self.counters.capsules_run += 1;
        Ok(CapsuleOutcome::Ran { module: id, result })
    }

    pub(super) fn maybe_recycle_capsules(&mut self, principal: PrincipalId) {
        let max = self.cfg.capsule_instances;
        let Some(t) = self.tenants.get_mut(&principal) else { return };
        if t.capsules.as_ref().is_some_and(|s| s.instances >= max) {
            let ids: Vec<ModuleId> = t.capsule_insts.drain().map(|(_, id)| id).collect();
            t.capsules = None;
            for id in ids {
                self.modules.remove(&id);
                self.channels.remove_module(id);
            }
            self.counters.capsule_store_recycles += 1;
        }
    }
}

/// The byte budgets for answering code requests: one bucket per requesting
/// neighbour (at most [`MAX_REPLY_BUCKETS`] tracked; a new requester finding
/// them all busy is refused) and one for all of them (four times the rate
/// and burst).
#[derive(Debug)]
pub(super) struct ReplyBudget {
    per: anode_sched::ByteBuckets<Ipv4Addr>,
    all: anode_sched::ByteBuckets<()>,
}

impl Default for ReplyBudget {
    fn default() -> Self {
        ReplyBudget { per: anode_sched::ByteBuckets::new(MAX_REPLY_BUCKETS), all: anode_sched::ByteBuckets::new(1) }
    }
}

/// Neighbours whose code-reply budgets are tracked at once.
const MAX_REPLY_BUCKETS: usize = 1024;

impl ReplyBudget {
    /// Takes `bytes` of `from`'s budget and of the node's (`rate` bytes/s,
    /// `burst` bytes, per neighbour) at `now_ms`; `false`: over one of them.
    /// A reply the node's budget refuses still spent its requester's.
    fn take(&mut self, from: Ipv4Addr, bytes: u64, (rate, burst): (u64, u64), now_ms: u64) -> bool {
        let now_ns = now_ms.saturating_mul(1_000_000);
        rate > 0
            && self.per.take(from, (rate, burst), bytes, now_ns)
            && self.all.take((), (rate.saturating_mul(4), burst.saturating_mul(4)), bytes, now_ns)
    }
}
