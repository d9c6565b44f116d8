//! Session credentials: the most a principal may reserve on a node (RCANE
//! §IV-B; the join of SANE and RCANE sketched in §VII of the costs paper).
//!
//! A session credential is a Biscuit token rooted in the node
//! administrator's Ed25519 key, like a module credential
//! ([`crate::credential`]), with its own vocabulary. The node decides it with
//! [`Verifier::authorize_session`] when a principal opens a session over its
//! security association, and again whenever the session asks for a different
//! reservation.
//!
//! # Token vocabulary
//!
//! Authority block (written by the administrator's [`Issuer::issue_session`]):
//!
//! | fact | meaning |
//! |---|---|
//! | `kind("session")` | a session credential (required: a module or monitoring credential is refused with [`CredError::WrongKind`], and a session credential presented for a module load is refused the same way) |
//! | `principal("<hex key>")` | the principal it is issued to (exactly one) |
//! | `ceiling("vp_share", n)` | largest CPU share of one virtual processor, ppm of one CPU |
//! | `ceiling("total_share", n)` | largest sum of the session's VP shares, ppm |
//! | `ceiling("vps", n)` | most virtual processors |
//! | `ceiling("extra", 0\|1)` | whether VPs may use slack beyond their guarantee |
//! | `ceiling("heap", n)` | largest heap reservation, bytes |
//! | `ceiling("tx", n)`, `ceiling("rx", n)` | largest transmit / receive reservation, bytes per second |
//! | `ceiling("pools", n)` | most event pools |
//! | `ceiling("queued", n)` | most events queued over all the session's pools |
//! | `check if time($t), $t < <date>` | expiry |
//!
//! A ceiling the authority block does not state is 0 (nothing may be
//! reserved); if it states one twice, the smaller counts.
//!
//! # Attenuation only narrows
//!
//! Facts of later blocks are never trusted (the authorizer reads the
//! authority block and its own facts only), so a holder narrows a credential
//! by appending *checks* ([`SessionAttenuation`]). For each decision the node
//! states the request as authorizer facts, which those checks test:
//!
//! | authorizer fact | meaning |
//! |---|---|
//! | `time(<date>)` | now |
//! | `requester("<hex key>")` | the principal of the security association the request came over |
//! | `vp_share(n)` | the largest share of one VP the session would hold, ppm |
//! | `total_share(n)` | the sum of its VP shares, ppm |
//! | `vps(n)` | its number of VPs |
//! | `extra(true\|false)` | whether any of its VPs would use slack |
//! | `heap(n)` | its heap reservation, bytes |
//! | `tx(n)`, `rx(n)` | its transmit / receive reservations, bytes per second |
//! | `pools(n)` | its number of pools |
//! | `queued(n)` | the events its pools may queue in total |
//!
//! The amounts are the session's totals *after* the request (an opening
//! session with no reservation yet states zeros). So
//! `check if vp_share($s), $s <= 100000` refuses any request that would give
//! one VP more than 10 %, `check if extra(false)` any VP with slack, and
//! `check if time($t), $t < 2030-01-01T00:00:00Z` ends the session then.
//!
//! The returned [`SessionGrant::ceilings`] are the authority block's,
//! narrowed by every check of the recognized form
//! `check if <amount>($v), $v <= n` (or `< n`) and `check if extra(false)`
//! in any block ([`check_bound`]); a request above them is refused with
//! [`CredError::LimitExceeded`] stating the narrowed ceiling. Checks of other forms (say
//! `check if heap($h), vps($n), $h <= $n * 1048576`) are enforced only
//! when a request is decided, so **the node must call
//! [`Verifier::authorize_session`] with the session's new totals on every
//! reservation change**, not only at opening.
//!
//! # Errors and order of the decision
//!
//! Size, format and signature ([`CredError::TooLarge`],
//! [`CredError::Malformed`], [`CredError::WrongIssuer`]); kind
//! ([`CredError::WrongKind`]); principal ([`CredError::NoPrincipal`],
//! [`CredError::WrongPrincipal`]); the request against the ceilings, the
//! administrator's narrowed by the recognized checks
//! ([`CredError::LimitExceeded`], `resource` being the fact name, `allowed`
//! the effective ceiling); then every check with the request as facts
//! ([`CredError::Expired`] if a failed check mentions `time`, else
//! [`CredError::CheckFailed`]: a check of another form).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use biscuit_auth::builder::{Binary, BlockBuilder, Check, CheckKind, Op, Term};
use biscuit_auth::{Authorizer, AuthorizerBuilder, Biscuit};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::credential::{
    CredError, Credential, Issuer, Verifier, authorize_checks, build_err, check_dates, clamp_i64, fact1, run_err,
    with_expiry,
};
use crate::naming::PrincipalId;

/// The most a session credential lets its principal reserve. The same
/// fields as `anode_sched::Ceilings` (this crate does not depend on the
/// scheduler; the node maps one onto the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionCeilings {
    /// Largest share of one VP, ppm.
    pub max_vp_share_ppm: u64,
    /// Largest sum of the session's VP shares, ppm.
    pub max_total_share_ppm: u64,
    /// Most VPs.
    pub max_vps: u32,
    /// Whether VPs may use slack (`extra`).
    pub extra: bool,
    /// Largest heap reservation, bytes.
    pub max_heap_bytes: u64,
    /// Largest transmit reservation, bytes per second.
    pub max_tx_bytes_per_sec: u64,
    /// Largest receive reservation, bytes per second.
    pub max_rx_bytes_per_sec: u64,
    /// Most pools.
    pub max_pools: u32,
    /// Most events queued over all the session's pools.
    pub max_queued_events: u32,
}

impl SessionCeilings {
    /// Ceilings that allow nothing.
    pub const NONE: SessionCeilings = SessionCeilings {
        max_vp_share_ppm: 0,
        max_total_share_ppm: 0,
        max_vps: 0,
        extra: false,
        max_heap_bytes: 0,
        max_tx_bytes_per_sec: 0,
        max_rx_bytes_per_sec: 0,
        max_pools: 0,
        max_queued_events: 0,
    };

    /// The amount named `name` (one of [`AMOUNTS`]; `extra` as 0 or 1).
    pub fn get(&self, name: &str) -> Option<u64> {
        amount(name).map(|a| (a.ceiling)(self))
    }

    /// Field-wise minimum (`extra` only if both allow it).
    pub fn min(self, o: SessionCeilings) -> SessionCeilings {
        let mut out = self;
        for a in &AMOUNT_TABLE {
            (a.set)(&mut out, (a.ceiling)(&self).min((a.ceiling)(&o)));
        }
        out
    }
}

/// A request for reservations: the session's totals after it. All zero
/// (the [`Default`]) when a session opens with no reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SessionRequest {
    /// The largest share of one of its VPs, ppm.
    pub vp_share_ppm: u64,
    /// The sum of its VP shares, ppm.
    pub total_share_ppm: u64,
    /// Its number of VPs.
    pub vps: u32,
    /// Whether any VP uses slack.
    pub extra: bool,
    /// Heap reservation, bytes.
    pub heap_bytes: u64,
    /// Transmit reservation, bytes per second.
    pub tx_bytes_per_sec: u64,
    /// Receive reservation, bytes per second.
    pub rx_bytes_per_sec: u64,
    /// Number of pools.
    pub pools: u32,
    /// Events its pools may queue in total.
    pub queued_events: u32,
}

impl SessionRequest {
    /// The amount named `name` (one of [`AMOUNTS`]; `extra` as 0 or 1).
    pub fn get(&self, name: &str) -> Option<u64> {
        amount(name).map(|a| (a.request)(self))
    }
}

/// A positive decision on a session credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionGrant {
    /// The credential's principal (the requester).
    pub principal: PrincipalId,
    /// The most the session may reserve: the authority block's ceilings
    /// narrowed by the recognized checks of every block (module docs).
    pub ceilings: SessionCeilings,
    /// The earliest date any check of the token mentions (its expiry): the
    /// session must end then, or be authorized again (`None`: no check
    /// mentions a date).
    pub recheck_at: Option<SystemTime>,
}

/// What an administrator grants in a session credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSpec {
    /// The ceilings.
    pub ceilings: SessionCeilings,
    /// Expiry, if any.
    pub expires: Option<SystemTime>,
}

/// An attenuation block for a session credential: checks a holder adds
/// before passing it on (or before presenting it, to bound its own session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionAttenuation {
    /// Expire at this time.
    pub expires: Option<SystemTime>,
    /// At most this share of one VP, ppm.
    pub max_vp_share_ppm: Option<u64>,
    /// At most this total share, ppm.
    pub max_total_share_ppm: Option<u64>,
    /// At most this many VPs.
    pub max_vps: Option<u32>,
    /// No VP may use slack.
    pub no_extra: bool,
    /// At most this heap reservation, bytes.
    pub max_heap_bytes: Option<u64>,
    /// At most this transmit reservation, bytes per second.
    pub max_tx_bytes_per_sec: Option<u64>,
    /// At most this receive reservation, bytes per second.
    pub max_rx_bytes_per_sec: Option<u64>,
    /// At most this many pools.
    pub max_pools: Option<u32>,
    /// At most this many queued events.
    pub max_queued_events: Option<u32>,
}

impl SessionAttenuation {
    /// The bounds this attenuation sets, by fact name.
    pub fn bounds(&self) -> Vec<(&'static str, u64)> {
        let u = |v: Option<u32>| v.map(u64::from);
        [
            ("vp_share", self.max_vp_share_ppm),
            ("total_share", self.max_total_share_ppm),
            ("vps", u(self.max_vps)),
            ("heap", self.max_heap_bytes),
            ("tx", self.max_tx_bytes_per_sec),
            ("rx", self.max_rx_bytes_per_sec),
            ("pools", u(self.max_pools)),
            ("queued", u(self.max_queued_events)),
        ]
        .into_iter()
        .filter_map(|(n, v)| v.map(|v| (n, v)))
        .collect()
    }

    /// Whether this attenuation restricts nothing (an empty block).
    pub fn is_empty(&self) -> bool {
        self.expires.is_none() && !self.no_extra && self.bounds().is_empty()
    }

    /// The block of checks (for tools that append it to a token whose root
    /// they do not check).
    ///
    /// # Errors
    /// [`CredError::Build`] if the block cannot be built.
    pub fn to_block(&self) -> Result<BlockBuilder, CredError> {
        let mut src = String::new();
        let mut p: HashMap<String, Term> = HashMap::new();
        if let Some(t) = self.expires {
            src.push_str("check if time($t), $t < {exp};\n");
            p.insert("exp".into(), Term::from(t));
        }
        for (name, v) in self.bounds() {
            src.push_str(&format!("check if {name}($v), $v <= {{{name}}};\n"));
            p.insert(name.into(), Term::Integer(clamp_i64(v)));
        }
        if self.no_extra {
            src.push_str("check if extra(false);\n");
        }
        BlockBuilder::new().code_with_params(src, p, HashMap::new()).map_err(build_err)
    }
}

/// One reservable amount: its fact name and where it lives in the ceilings
/// and the request. One table drives issuing, deciding and narrowing.
struct Amount {
    name: &'static str,
    ceiling: fn(&SessionCeilings) -> u64,
    set: fn(&mut SessionCeilings, u64),
    request: fn(&SessionRequest) -> u64,
}

fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

const AMOUNT_TABLE: [Amount; 9] = [
    Amount {
        name: "vp_share",
        ceiling: |c| c.max_vp_share_ppm,
        set: |c, v| c.max_vp_share_ppm = v,
        request: |r| r.vp_share_ppm,
    },
    Amount {
        name: "total_share",
        ceiling: |c| c.max_total_share_ppm,
        set: |c, v| c.max_total_share_ppm = v,
        request: |r| r.total_share_ppm,
    },
    Amount {
        name: "vps",
        ceiling: |c| u64::from(c.max_vps),
        set: |c, v| c.max_vps = sat32(v),
        request: |r| u64::from(r.vps),
    },
    Amount {
        name: "extra",
        ceiling: |c| u64::from(c.extra),
        set: |c, v| c.extra = v != 0,
        request: |r| u64::from(r.extra),
    },
    Amount { name: "heap", ceiling: |c| c.max_heap_bytes, set: |c, v| c.max_heap_bytes = v, request: |r| r.heap_bytes },
    Amount {
        name: "tx",
        ceiling: |c| c.max_tx_bytes_per_sec,
        set: |c, v| c.max_tx_bytes_per_sec = v,
        request: |r| r.tx_bytes_per_sec,
    },
    Amount {
        name: "rx",
        ceiling: |c| c.max_rx_bytes_per_sec,
        set: |c, v| c.max_rx_bytes_per_sec = v,
        request: |r| r.rx_bytes_per_sec,
    },
    Amount {
        name: "pools",
        ceiling: |c| u64::from(c.max_pools),
        set: |c, v| c.max_pools = sat32(v),
        request: |r| u64::from(r.pools),
    },
    Amount {
        name: "queued",
        ceiling: |c| u64::from(c.max_queued_events),
        set: |c, v| c.max_queued_events = sat32(v),
        request: |r| u64::from(r.queued_events),
    },
];

/// The fact names of the reservable amounts, in the order of
/// [`SessionCeilings`]' fields (`extra` is 0 or 1 in `ceiling(..)` facts and
/// a boolean in the request's `extra(..)` fact).
pub const AMOUNTS: [&str; 9] = ["vp_share", "total_share", "vps", "extra", "heap", "tx", "rx", "pools", "queued"];

fn amount(name: &str) -> Option<&'static Amount> {
    AMOUNT_TABLE.iter().find(|a| a.name == name)
}

impl Issuer {
    /// A session credential for `principal`.
    ///
    /// # Errors
    /// [`CredError::Build`] if the token cannot be built.
    pub fn issue_session(&self, principal: PrincipalId, spec: &SessionSpec) -> Result<Credential, CredError> {
        let mut b = Biscuit::builder()
            .fact(fact1("kind", "session".into()))
            .map_err(build_err)?
            .fact(fact1("principal", principal.to_hex()))
            .map_err(build_err)?;
        for a in &AMOUNT_TABLE {
            let v = Term::Integer(clamp_i64((a.ceiling)(&spec.ceilings)));
            b = b.fact(biscuit_auth::builder::fact("ceiling", &[Term::Str(a.name.into()), v])).map_err(build_err)?;
        }
        if let Some(t) = spec.expires {
            b = with_expiry(b, t)?;
        }
        self.issue_builder(b)
    }
}

impl Credential {
    /// A narrower session credential: this one plus a block of checks.
    ///
    /// # Errors
    /// [`CredError::Build`] if the block cannot be built or appended.
    pub fn attenuate_session(&self, a: &SessionAttenuation) -> Result<Credential, CredError> {
        self.attenuate_block(a.to_block()?)
    }
}

/// A bound a check puts on a single-valued fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The fact's name (`vp_share`, `memory`, …).
    pub fact: String,
    /// The largest value the check lets through.
    pub max: u64,
}

/// The bound a check of the form `check if <fact>($v), $v <= n` (or
/// `$v < n`, `n >= $v`, `n > $v`; also `check all`) puts on `fact`, or
/// `extra(false)` (a bound of 0 on `extra`). `None` for any other form: such
/// a check is still enforced, only not summarized.
pub fn check_bound(c: &Check) -> Option<Bound> {
    if c.kind == CheckKind::Reject {
        return None;
    }
    let [q] = c.queries.as_slice() else { return None };
    let [p] = q.body.as_slice() else { return None };
    match (p.terms.as_slice(), q.expressions.as_slice()) {
        ([Term::Bool(false)], []) if p.name == "extra" => Some(Bound { fact: p.name.clone(), max: 0 }),
        ([Term::Variable(v)], [e]) => {
            let (n, op) = match e.ops.as_slice() {
                [Op::Value(Term::Variable(x)), Op::Value(Term::Integer(n)), Op::Binary(op)] if x == v => {
                    (*n, op.clone())
                }
                [Op::Value(Term::Integer(n)), Op::Value(Term::Variable(x)), Op::Binary(op)] if x == v => {
                    let flipped = match op {
                        Binary::GreaterOrEqual => Binary::LessOrEqual,
                        Binary::GreaterThan => Binary::LessThan,
                        _ => return None,
                    };
                    (*n, flipped)
                }
                _ => return None,
            };
            let max = match op {
                Binary::LessOrEqual => n,
                Binary::LessThan => n.saturating_sub(1),
                _ => return None,
            };
            Some(Bound { fact: p.name.clone(), max: u64::try_from(max).unwrap_or(0) })
        }
        _ => None,
    }
}

/// The earliest date a check mentions (an expiry), if any.
pub fn check_expiry(c: &Check) -> Option<SystemTime> {
    check_dates(c).into_iter().min().map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d))
}

/// The kind an authority block states: its `kind(..)` fact, `monitor` for a
/// monitoring credential (`right("monitor")`), `module` when it states
/// none; several kinds come back joined with `+`, matching no kind.
pub(crate) fn kind_of(a: &mut Authorizer) -> Result<String, CredError> {
    let mut kinds: Vec<String> =
        a.query("q($k) <- kind($k)").map_err(run_err)?.into_iter().map(|(k,): (String,)| k).collect();
    let monitor: Vec<(bool,)> = a.query("q(true) <- right(\"monitor\")").map_err(run_err)?;
    if !monitor.is_empty() {
        kinds.push("monitor".into());
    }
    kinds.sort();
    kinds.dedup();
    Ok(if kinds.is_empty() { "module".into() } else { kinds.join("+") })
}

/// Cached session decisions (see [`Verifier::authorize_session`]).
#[derive(Default)]
pub(crate) struct SessionCache {
    map: HashMap<[u8; 32], (Result<SessionGrant, CredError>, SystemTime)>,
}

fn session_key(credential: &[u8], requester: PrincipalId, r: &SessionRequest) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"anode-session-decision-v1");
    h.update((credential.len() as u64).to_le_bytes());
    h.update(credential);
    h.update(requester.0);
    for a in &AMOUNT_TABLE {
        h.update((a.request)(r).to_le_bytes());
    }
    h.finalize().into()
}

impl Verifier {
    /// Decides a session credential presented by `requester` (the principal
    /// of the security association it came over) for `request` (the
    /// session's totals after the request; [`SessionRequest::default`] to
    /// open one with no reservation). Logs and counts the decision.
    ///
    /// Call it at opening and on every reservation change (module docs).
    /// Decisions are cached like module loads: a positive one until the
    /// earlier of `decision_ttl` and [`SessionGrant::recheck_at`], a negative
    /// one for `decision_ttl`.
    ///
    /// # Errors
    /// See the module docs for the refusals and their order.
    ///
    /// # DoS
    /// The credential is bounded by [`crate::credential::MAX_CREDENTIAL`]
    /// and its evaluation by the configured Datalog run limits.
    pub fn authorize_session(
        &mut self,
        now: SystemTime,
        credential: &[u8],
        requester: PrincipalId,
        request: &SessionRequest,
    ) -> Result<SessionGrant, CredError> {
        let key = session_key(credential, requester, request);
        if let Some((r, until)) = self.session_cache.map.get(&key)
            && now < *until
        {
            let r = r.clone();
            self.counters.cache_hits += 1;
            match &r {
                Ok(_) => self.counters.allowed += 1,
                Err(e) => {
                    *self.counters.denied.entry(e.label()).or_default() += 1;
                    debug!(requester = %requester, reason = %e, "session credential refused (cached decision)");
                }
            }
            return r;
        }
        let r = self.decide_session(now, credential, requester, request);
        let (cached, until) = match &r {
            Ok((g, until)) => {
                self.counters.allowed += 1;
                info!(principal = %g.principal, ceilings = ?g.ceilings, "session credential allowed");
                (Ok(g.clone()), *until)
            }
            Err(e) => {
                *self.counters.denied.entry(e.label()).or_default() += 1;
                warn!(requester = %requester, reason = %e, "session credential refused");
                (Err(e.clone()), now + self.cfg.decision_ttl)
            }
        };
        if until > now {
            let cache = &mut self.session_cache.map;
            if cache.len() >= self.cfg.decision_cache {
                cache.retain(|_, (_, u)| *u > now);
                if cache.len() >= self.cfg.decision_cache {
                    cache.clear();
                }
            }
            cache.insert(key, (cached, until));
        }
        r.map(|(g, _)| g)
    }

    fn decide_session(
        &self,
        now: SystemTime,
        bytes: &[u8],
        requester: PrincipalId,
        req: &SessionRequest,
    ) -> Result<(SessionGrant, SystemTime), CredError> {
        if bytes.is_empty() {
            return Err(CredError::NoCredential);
        }
        let cred = Credential::parse(bytes, &self.root)?;
        // Phase 1: the authority block (facts of later blocks are not trusted).
        let mut a =
            AuthorizerBuilder::new().set_limits(self.cfg.run_limits.clone()).build(cred.token()).map_err(run_err)?;
        let found = kind_of(&mut a)?;
        if found != "session" {
            return Err(CredError::WrongKind { expected: "session", found });
        }
        let principals: Vec<(String,)> = a.query("q($p) <- principal($p)").map_err(run_err)?;
        let principal = match principals.as_slice() {
            [(p,)] => PrincipalId::from_hex(p).ok_or(CredError::NoPrincipal)?,
            _ => return Err(CredError::NoPrincipal),
        };
        if requester != principal {
            return Err(CredError::WrongPrincipal { owner: principal, requester });
        }
        let facts: Vec<(String, i64)> = a.query("q($k, $v) <- ceiling($k, $v)").map_err(run_err)?;
        let mut authority = SessionCeilings::NONE;
        for am in &AMOUNT_TABLE {
            let v = facts.iter().filter(|(k, _)| k == am.name).map(|(_, v)| u64::try_from(*v).unwrap_or(0)).min();
            (am.set)(&mut authority, v.unwrap_or(0));
        }
        // Narrowed by the recognized checks of every block; enforced here
        // too, so a grant's ceilings always cover what it allowed (a block
        // could make its own check vacuous with a fact of its own).
        let (_, _, checks, _) = a.dump();
        let mut ceilings = authority;
        for b in checks.iter().filter_map(check_bound) {
            if let Some(am) = amount(&b.fact) {
                let v = (am.ceiling)(&ceilings).min(b.max);
                (am.set)(&mut ceilings, v);
            }
        }
        let recheck_at = checks.iter().filter_map(check_expiry).min();
        for am in &AMOUNT_TABLE {
            let (requested, allowed) = ((am.request)(req), (am.ceiling)(&ceilings));
            if requested > allowed {
                return Err(CredError::LimitExceeded { resource: am.name, requested, allowed });
            }
        }

        // Phase 2: the request as facts, every block's checks.
        let mut src = String::from("time({now}); requester({requester}); extra({extra});\n");
        let mut p: HashMap<String, Term> = HashMap::new();
        p.insert("now".into(), Term::from(now));
        p.insert("requester".into(), Term::Str(requester.to_hex()));
        p.insert("extra".into(), Term::Bool(req.extra));
        for am in AMOUNT_TABLE.iter().filter(|a| a.name != "extra") {
            src.push_str(&format!("{0}({{{0}}});\n", am.name));
            p.insert(am.name.into(), Term::Integer(clamp_i64((am.request)(req))));
        }
        src.push_str("allow if kind(\"session\");\n");
        authorize_checks(cred.token(), src, p, self.cfg.run_limits.clone(), || CredError::WrongKind {
            expected: "session",
            found: "unknown".into(),
        })?;
        let until = recheck_at.map_or(now + self.cfg.decision_ttl, |t| t.min(now + self.cfg.decision_ttl));
        Ok((SessionGrant { principal, ceilings, recheck_at }, until))
    }
}
