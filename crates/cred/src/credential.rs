//! Credentials for loading modules: Biscuit tokens rooted in the node
//! administrator's Ed25519 key (SANE §4.3, §4.8).
//!
//! # Token vocabulary
//!
//! Authority block (written by the administrator's [`Issuer`]):
//!
//! | fact | meaning |
//! |---|---|
//! | `kind("module")` | a module credential (optional: a token with no `kind` fact is one; a token of another kind, `kind("session")` or `right("monitor")`, is refused with [`CredError::WrongKind`]) |
//! | `principal("<hex key>")` | the principal the credential is issued to (its tenant) |
//! | `right("admin")` | administrative credential: any module, every interface, node-maximum limits |
//! | `grant_hash("<hex sha256>")` | may load the code with this hash |
//! | `grant_signed("<hex programmer key>", "<name>")` | may load any version of `name` signed by that programmer |
//! | `grant_local("<name>")` | may install code under its own name `{principal, name}` |
//! | `interface("<name>")` | may import host interface `name` |
//! | `limit("memory"\|"cpu"\|"state", n)` | maxima: linear memory bytes, fuel per invocation, soft-state bytes |
//! | `check if time($t), $t < <date>` | expiry |
//!
//! Facts in later (attenuation) blocks are never trusted by the node's
//! authorizer, so a holder can only *add checks*: attenuation narrows, never
//! widens. The node supplies the request as authorizer facts, which those
//! checks can test: `time(now)`, `memory(m)`, `cpu(c)`, `state(s)`,
//! `uses("<interface>")` for each interface the module imports,
//! `module_hash(h)`, `module_signed(k, name, version)` (a verified signature),
//! `module_local(name)`, and `requester(k)` when the request came over an
//! authenticated channel.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use biscuit_auth::builder::{Algorithm, BlockBuilder, Check, Op, Term};
use biscuit_auth::error::{FailedCheck, Format, Logic, Token};
use biscuit_auth::{Authorizer, AuthorizerBuilder, AuthorizerLimits, Biscuit, KeyPair, PublicKey};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::interface::{Interface, InterfaceSet};
use crate::naming::{CodeInfo, MAX_NAME, ModuleHash, ModuleName, PrincipalId, valid_ident};

/// Largest credential accepted, in bytes.
pub const MAX_CREDENTIAL: usize = 4096;

/// Resource limits granted to a principal's modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Linear memory of the principal's store, in bytes.
    pub memory: u64,
    /// CPU per invocation, in fuel units (about one per wasm instruction).
    pub cpu: u64,
    /// Soft state of the principal, in bytes of keys plus values.
    pub state: u64,
}

impl Limits {
    /// Field-wise minimum.
    pub fn min(self, o: Limits) -> Limits {
        Limits { memory: self.memory.min(o.memory), cpu: self.cpu.min(o.cpu), state: self.state.min(o.state) }
    }
}

/// Limits a request asks for; `None` takes the credential's maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RequestedLimits {
    /// Memory bytes.
    pub memory: Option<u64>,
    /// Fuel per invocation.
    pub cpu: Option<u64>,
    /// Soft-state bytes.
    pub state: Option<u64>,
}

/// Why a credential was refused. Every variant is a denial that is logged and counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredError {
    /// No credential was presented.
    #[error("no credential presented")]
    NoCredential,
    /// The credential is larger than [`MAX_CREDENTIAL`].
    #[error("credential of {0} bytes exceeds the {MAX_CREDENTIAL}-byte limit")]
    TooLarge(usize),
    /// The bytes are not a Biscuit token.
    #[error("malformed credential: {0}")]
    Malformed(String),
    /// The token's signatures do not chain to this node's administrator key.
    #[error("credential not issued by this node's administrator (signature check failed)")]
    WrongIssuer,
    /// The authority block lacks exactly one `principal(..)` fact.
    #[error("credential names no principal (exactly one principal(\"<hex key>\") fact required)")]
    NoPrincipal,
    /// The request came from an authenticated principal other than the credential's.
    #[error("credential belongs to principal {owner}, presented by {requester}")]
    WrongPrincipal {
        /// The credential's principal.
        owner: PrincipalId,
        /// Who presented it.
        requester: PrincipalId,
    },
    /// A time check failed: the credential (or an attenuation of it) has expired.
    #[error("credential expired: {check}")]
    Expired {
        /// The failed check.
        check: String,
    },
    /// A check of the token (an attenuation) failed.
    #[error("credential check failed: {check}")]
    CheckFailed {
        /// The failed check(s).
        check: String,
    },
    /// The credential does not grant this module under any of its names.
    #[error("credential does not grant loading module {module}")]
    NotGranted {
        /// The module's hash name.
        module: ModuleHash,
    },
    /// The request asks for more of a resource than the credential allows.
    #[error("{resource} limit {requested} exceeds the {allowed} the credential allows")]
    LimitExceeded {
        /// `memory`, `cpu` or `state`.
        resource: &'static str,
        /// Asked for.
        requested: u64,
        /// Allowed.
        allowed: u64,
    },
    /// The module imports an interface the credential does not grant.
    #[error("import {import:?} needs right {right:?}, which the credential does not grant")]
    InterfaceNotGranted {
        /// The import, `module.field`.
        import: String,
        /// The missing right.
        right: Interface,
    },
    /// Datalog evaluation hit a run limit (too many facts, iterations or time).
    #[error("credential evaluation exceeded the run limits: {0}")]
    RunLimit(String),
    /// The local name is not a valid module name.
    #[error("invalid local module name {0:?}")]
    InvalidLocalName(String),
    /// Building or attenuating a token failed.
    #[error("cannot build credential: {0}")]
    Build(String),
    /// The credential is of another kind (a session credential presented
    /// for a module load, a module or monitoring credential presented to
    /// open a session).
    #[error("a {found} credential cannot be used as a {expected} credential")]
    WrongKind {
        /// The kind the request needs: `module` or `session`.
        expected: &'static str,
        /// The kind the authority block states (`module` when it states none).
        found: String,
    },
    /// A `channel` fact of the authority block is malformed
    /// ([`crate::channel`]).
    #[error("credential's channel grant: {0}")]
    ChannelGrant(#[from] crate::channel::ChannelGrantError),
}

impl CredError {
    /// A short stable label for counters and logs.
    pub fn label(&self) -> &'static str {
        match self {
            CredError::NoCredential => "no_credential",
            CredError::TooLarge(_) => "too_large",
            CredError::Malformed(_) => "malformed",
            CredError::WrongIssuer => "wrong_issuer",
            CredError::NoPrincipal => "no_principal",
            CredError::WrongPrincipal { .. } => "wrong_principal",
            CredError::Expired { .. } => "expired",
            CredError::CheckFailed { .. } => "check_failed",
            CredError::NotGranted { .. } => "not_granted",
            CredError::LimitExceeded { .. } => "limit_exceeded",
            CredError::InterfaceNotGranted { .. } => "interface_not_granted",
            CredError::RunLimit(_) => "run_limit",
            CredError::InvalidLocalName(_) => "invalid_local_name",
            CredError::Build(_) => "build",
            CredError::WrongKind { .. } => "wrong_kind",
            CredError::ChannelGrant(_) => "channel_grant",
        }
    }
}

pub(crate) fn build_err(e: Token) -> CredError {
    CredError::Build(e.to_string())
}

/// A token that could not be run: a run limit, or anything else as malformed.
pub(crate) fn run_err(e: Token) -> CredError {
    match e {
        Token::RunLimit(r) => CredError::RunLimit(r.to_string()),
        other => CredError::Malformed(other.to_string()),
    }
}

/// Phase 2 of a decision: every block's checks of `token`, run against
/// the authorizer code `src` (the request as facts, then its `allow`
/// policy) with `params`. A failed check is [`CredError::Expired`] when it
/// tests the time, else [`CredError::CheckFailed`]; no matching policy
/// otherwise is `refused()`. Returns the authorizer, to read the checks
/// from (their dates bound how long the decision holds).
pub(crate) fn authorize_checks(
    token: &Biscuit,
    src: String,
    params: HashMap<String, Term>,
    limits: AuthorizerLimits,
    refused: impl FnOnce() -> CredError,
) -> Result<Authorizer, CredError> {
    let mut az = AuthorizerBuilder::new()
        .code_with_params(src, params, HashMap::new())
        .map_err(build_err)?
        .set_limits(limits)
        .build(token)
        .map_err(run_err)?;
    match az.authorize() {
        Ok(_) => Ok(az),
        Err(Token::FailedLogic(Logic::Unauthorized { checks, .. } | Logic::NoMatchingPolicy { checks }))
            if !checks.is_empty() =>
        {
            let text: Vec<String> = checks.iter().map(failed_rule).collect();
            let check = text.join("; ");
            Err(if text.iter().any(|c| c.contains("time(")) {
                CredError::Expired { check }
            } else {
                CredError::CheckFailed { check }
            })
        }
        Err(Token::FailedLogic(_)) => Err(refused()),
        Err(e) => Err(run_err(e)),
    }
}

/// A module pattern an ordinary credential grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleGrant {
    /// The code with this hash.
    Hash(ModuleHash),
    /// Any version of `name` signed by `programmer`.
    Signed {
        /// Programmer key.
        programmer: PrincipalId,
        /// Module name.
        name: String,
    },
    /// Code installed under the holder's own name `name`.
    Local(String),
}

/// What an ordinary credential grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSpec {
    /// Modules that may be loaded.
    pub modules: Vec<ModuleGrant>,
    /// Host interfaces those modules may import.
    pub interfaces: InterfaceSet,
    /// Resource maxima.
    pub limits: Limits,
    /// Expiry, if any.
    pub expires: Option<SystemTime>,
}

/// A credential: a verified Biscuit token and its bytes.
#[derive(Clone)]
pub struct Credential {
    token: Biscuit,
    bytes: Vec<u8>,
}

impl core::fmt::Debug for Credential {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Credential({} bytes, {} blocks)", self.bytes.len(), self.token.block_count())
    }
}

impl Credential {
    /// Parses and verifies a credential against the administrator's public key.
    pub fn parse(bytes: &[u8], root: &PublicKey) -> Result<Credential, CredError> {
        if bytes.len() > MAX_CREDENTIAL {
            return Err(CredError::TooLarge(bytes.len()));
        }
        let token = Biscuit::from(bytes, *root).map_err(|e| match e {
            Token::Format(Format::Signature(_)) | Token::Format(Format::SealedSignature) => CredError::WrongIssuer,
            Token::Format(Format::UnknownPublicKey) => CredError::WrongIssuer,
            other => CredError::Malformed(other.to_string()),
        })?;
        Ok(Credential { token, bytes: bytes.to_vec() })
    }

    /// The serialized token.
    pub fn to_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A narrower credential: this one plus a block of checks. Anyone holding
    /// a credential can attenuate it; nobody can widen it.
    pub fn attenuate(&self, a: &Attenuation) -> Result<Credential, CredError> {
        let token = self.token.append(a.block()?).map_err(build_err)?;
        let bytes = token.to_vec().map_err(build_err)?;
        Ok(Credential { token, bytes })
    }

    /// The verified token, for authorizers of other credential vocabularies
    /// (the monitor's policy facts live in `anode-monitor`).
    pub fn token(&self) -> &Biscuit {
        &self.token
    }

    /// Appends a block built by the caller (e.g. with parameters). As with
    /// [`Credential::attenuate`], the node trusts only its checks.
    pub fn attenuate_block(&self, block: BlockBuilder) -> Result<Credential, CredError> {
        let token = self.token.append(block).map_err(build_err)?;
        let bytes = token.to_vec().map_err(build_err)?;
        Ok(Credential { token, bytes })
    }

    /// Appends a raw Datalog block (for tests and tools). Facts in it are ignored
    /// by the node; only its checks have effect.
    pub fn attenuate_datalog(&self, code: &str) -> Result<Credential, CredError> {
        let token = self.token.append(BlockBuilder::new().code(code).map_err(build_err)?).map_err(build_err)?;
        let bytes = token.to_vec().map_err(build_err)?;
        Ok(Credential { token, bytes })
    }
}

/// The node administrator's signing side: issues credentials.
pub struct Issuer {
    key: KeyPair,
}

impl Issuer {
    /// An issuer with a fresh random Ed25519 key.
    pub fn generate() -> Issuer {
        Issuer { key: KeyPair::new_with_algorithm(Algorithm::Ed25519) }
    }
    /// An issuer from a 32-byte Ed25519 secret.
    pub fn from_secret(secret: &[u8; 32]) -> Result<Issuer, CredError> {
        let key = KeyPair::from_bytes(secret, biscuit_auth::format::schema::public_key::Algorithm::Ed25519)
            .map_err(|e| CredError::Build(e.to_string()))?;
        Ok(Issuer { key })
    }
    /// The administrator's public key, which nodes verify credentials against.
    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    /// A credential whose authority block the caller built (another
    /// vocabulary, such as the monitor's policy facts), signed with this key.
    pub fn issue_builder(&self, builder: biscuit_auth::BiscuitBuilder) -> Result<Credential, CredError> {
        let token = builder.build(&self.key).map_err(build_err)?;
        let bytes = token.to_vec().map_err(build_err)?;
        Ok(Credential { token, bytes })
    }

    /// An administrative credential ("master key"): any module, every interface.
    pub fn admin(&self, principal: PrincipalId, expires: Option<SystemTime>) -> Result<Credential, CredError> {
        let mut b = Biscuit::builder()
            .fact(fact1("kind", "module".to_string()))
            .map_err(build_err)?
            .fact(fact1("principal", principal.to_hex()))
            .map_err(build_err)?
            .fact(fact1("right", "admin".to_string()))
            .map_err(build_err)?;
        if let Some(t) = expires {
            b = with_expiry(b, t)?;
        }
        let token = b.build(&self.key).map_err(build_err)?;
        let bytes = token.to_vec().map_err(build_err)?;
        Ok(Credential { token, bytes })
    }

    /// An ordinary credential: the named modules only, with limits and interfaces.
    pub fn issue(&self, principal: PrincipalId, spec: &GrantSpec) -> Result<Credential, CredError> {
        self.issue_builder(self.grant_builder(principal, spec)?)
    }

    /// The authority block of [`Issuer::issue`], before signing (see also
    /// [`Issuer::issue_channels`]).
    pub(crate) fn grant_builder(
        &self,
        principal: PrincipalId,
        spec: &GrantSpec,
    ) -> Result<biscuit_auth::builder::BiscuitBuilder, CredError> {
        let mut b = Biscuit::builder()
            .fact(fact1("kind", "module".to_string()))
            .map_err(build_err)?
            .fact(fact1("principal", principal.to_hex()))
            .map_err(build_err)?;
        for m in &spec.modules {
            let f = match m {
                ModuleGrant::Hash(h) => fact1("grant_hash", h.to_hex()),
                ModuleGrant::Signed { programmer, name } => {
                    if !valid_ident(name, MAX_NAME) {
                        return Err(CredError::InvalidLocalName(name.clone()));
                    }
                    biscuit_auth::builder::fact(
                        "grant_signed",
                        &[Term::Str(programmer.to_hex()), Term::Str(name.clone())],
                    )
                }
                ModuleGrant::Local(name) => {
                    if !valid_ident(name, MAX_NAME) {
                        return Err(CredError::InvalidLocalName(name.clone()));
                    }
                    fact1("grant_local", name.clone())
                }
            };
            b = b.fact(f).map_err(build_err)?;
        }
        for i in spec.interfaces.iter() {
            b = b.fact(fact1("interface", i.name().to_string())).map_err(build_err)?;
        }
        for (k, v) in [("memory", spec.limits.memory), ("cpu", spec.limits.cpu), ("state", spec.limits.state)] {
            let f = biscuit_auth::builder::fact("limit", &[Term::Str(k.into()), Term::Integer(clamp_i64(v))]);
            b = b.fact(f).map_err(build_err)?;
        }
        if let Some(t) = spec.expires {
            b = with_expiry(b, t)?;
        }
        Ok(b)
    }
}

pub(crate) fn fact1(name: &str, v: String) -> biscuit_auth::builder::Fact {
    biscuit_auth::builder::fact(name, &[Term::Str(v)])
}

pub(crate) fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn with_expiry(
    b: biscuit_auth::BiscuitBuilder,
    t: SystemTime,
) -> Result<biscuit_auth::BiscuitBuilder, CredError> {
    let mut p = HashMap::new();
    p.insert("exp".to_string(), Term::from(t));
    b.code_with_params("check if time($t), $t < {exp};", p, HashMap::new()).map_err(build_err)
}

/// An attenuation block: restrictions a holder adds before passing a credential on.
#[derive(Debug, Clone, Default)]
pub struct Attenuation {
    /// Expire at this time.
    pub expires: Option<SystemTime>,
    /// At most this much memory.
    pub max_memory: Option<u64>,
    /// At most this much fuel per invocation.
    pub max_cpu: Option<u64>,
    /// At most this much soft state.
    pub max_state: Option<u64>,
    /// Only these interfaces.
    pub interfaces: Option<InterfaceSet>,
    /// Only modules with these hashes.
    pub hashes: Option<Vec<ModuleHash>>,
}

impl Attenuation {
    /// Whether this attenuation restricts nothing (an empty block).
    pub fn is_empty(&self) -> bool {
        self.expires.is_none()
            && self.max_memory.is_none()
            && self.max_cpu.is_none()
            && self.max_state.is_none()
            && self.interfaces.is_none()
            && self.hashes.is_none()
    }

    /// The block of checks [`Credential::attenuate`] appends (for tools that
    /// append it to a token whose root they do not check).
    pub fn to_block(&self) -> Result<BlockBuilder, CredError> {
        self.block()
    }

    fn block(&self) -> Result<BlockBuilder, CredError> {
        let mut src = String::new();
        let mut p: HashMap<String, Term> = HashMap::new();
        if let Some(t) = self.expires {
            src.push_str("check if time($t), $t < {exp};\n");
            p.insert("exp".into(), Term::from(t));
        }
        for (name, v) in [("memory", self.max_memory), ("cpu", self.max_cpu), ("state", self.max_state)] {
            if let Some(v) = v {
                src.push_str(&format!("check if {name}($v), $v <= {{{name}}};\n"));
                p.insert(name.into(), Term::Integer(clamp_i64(v)));
            }
        }
        if let Some(set) = self.interfaces {
            src.push_str("check all uses($i), {ifaces}.contains($i);\n");
            let s: BTreeSet<Term> = set.iter().map(|i| Term::Str(i.name().into())).collect();
            p.insert("ifaces".into(), Term::Set(s));
        }
        if let Some(h) = &self.hashes {
            src.push_str("check if module_hash($h), {hashes}.contains($h);\n");
            let s: BTreeSet<Term> = h.iter().map(|h| Term::Str(h.to_hex())).collect();
            p.insert("hashes".into(), Term::Set(s));
        }
        BlockBuilder::new().code_with_params(src, p, HashMap::new()).map_err(build_err)
    }
}

/// A load request, as the node's authorizer sees it.
#[derive(Debug, Clone, Copy)]
pub struct LoadRequest<'a> {
    /// The credential bytes, if any.
    pub credential: Option<&'a [u8]>,
    /// The principal that sent the request over an authenticated channel
    /// (a security association); `None` for bearer use (capsules).
    pub requester: Option<PrincipalId>,
    /// The module's hash and verified programmer name.
    pub code: &'a CodeInfo,
    /// The loader's own name for the module, if it gives one.
    pub local_name: Option<&'a str>,
    /// Interfaces the module imports.
    pub interfaces: InterfaceSet,
    /// Limits asked for.
    pub limits: RequestedLimits,
}

/// A positive decision: what the module may use, decided once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The credential's principal: the tenant whose store the module runs in.
    pub principal: PrincipalId,
    /// An administrative credential.
    pub admin: bool,
    /// The interfaces the credential grants (a superset of what the module imports).
    pub interfaces: InterfaceSet,
    /// The effective limits.
    pub limits: Limits,
    /// The names under which the module becomes available.
    pub names: Vec<ModuleName>,
    /// The earliest date any check of the token mentions (its expiry, for
    /// the credentials this crate issues): from then on the decision may
    /// change, so a loaded module must be authorized again (`None`: no
    /// check mentions a date).
    pub recheck_at: Option<SystemTime>,
    /// What its modules may open receive channels for ([`crate::channel`]).
    pub channels: crate::channel::ChannelAuthority,
}

/// Authorization decision counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthCounters {
    /// Allowed decisions (including decision-cache hits).
    pub allowed: u64,
    /// Decisions (allowed or denied) served from the decision cache.
    pub cache_hits: u64,
    /// Denials by [`CredError::label`].
    pub denied: HashMap<&'static str, u64>,
}

impl AuthCounters {
    /// Total denials.
    pub fn denied_total(&self) -> u64 {
        self.denied.values().sum()
    }
}

/// Verifier configuration.
#[derive(Debug, Clone)]
pub struct VerifierConfig {
    /// Node maxima: what an administrative credential gets, and a cap on every grant.
    pub node_limits: Limits,
    /// Datalog run limits. Set explicitly: biscuit's default time limit (1 ms)
    /// is exceeded on slow or loaded machines.
    pub run_limits: AuthorizerLimits,
    /// How long a decision may be reused for the same credential, code and request.
    pub decision_ttl: Duration,
    /// Most cached decisions.
    pub decision_cache: usize,
    /// Whether an ordinary module credential needs `channel` facts to open
    /// receive channels (else one without any may open every channel, as
    /// before channel grants existed).
    pub require_channel_grants: bool,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            node_limits: Limits { memory: 64 << 20, cpu: 10_000_000, state: 1 << 20 },
            run_limits: AuthorizerLimits { max_facts: 1000, max_iterations: 100, max_time: Duration::from_millis(50) },
            decision_ttl: Duration::from_secs(1),
            decision_cache: 4096,
            require_channel_grants: false,
        }
    }
}

/// The node's side: verifies credentials against the administrator's key and
/// decides load requests. Logs and counts every decision.
pub struct Verifier {
    pub(crate) root: PublicKey,
    pub(crate) cfg: VerifierConfig,
    cache: HashMap<[u8; 32], (Result<Grant, CredError>, SystemTime)>,
    pub(crate) session_cache: crate::session::SessionCache,
    pub(crate) counters: AuthCounters,
}

impl Verifier {
    /// A verifier for credentials rooted in `root`.
    pub fn new(root: PublicKey, cfg: VerifierConfig) -> Verifier {
        Verifier {
            root,
            cfg,
            cache: HashMap::new(),
            session_cache: crate::session::SessionCache::default(),
            counters: AuthCounters::default(),
        }
    }

    /// Decision counters.
    pub fn counters(&self) -> &AuthCounters {
        &self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &VerifierConfig {
        &self.cfg
    }

    /// Decides a load request at time `now`. Logs and counts the decision.
    ///
    /// Decisions are cached by request (see the module docs): a positive one
    /// until the earlier of `decision_ttl` and the earliest date any check of
    /// the token mentions, a negative one for `decision_ttl`, so a flood of
    /// capsules with a refused credential costs one verification per second,
    /// and one `warn` line, not one per capsule.
    pub fn authorize(&mut self, now: SystemTime, req: &LoadRequest<'_>) -> Result<Grant, CredError> {
        let key = cache_key(req);
        if let Some((r, until)) = self.cache.get(&key)
            && now < *until
        {
            let r = r.clone();
            self.counters.cache_hits += 1;
            match &r {
                Ok(_) => self.counters.allowed += 1,
                Err(e) => {
                    *self.counters.denied.entry(e.label()).or_default() += 1;
                    debug!(module = %req.code.hash, reason = %e, "module load denied (cached decision)");
                }
            }
            return r;
        }
        let r = self.decide(now, req);
        let (cached, until) = match &r {
            Ok((g, until)) => {
                self.counters.allowed += 1;
                info!(principal = %g.principal, module = %req.code.hash, admin = g.admin,
                    interfaces = %g.interfaces, "module load allowed");
                (Ok(g.clone()), *until)
            }
            Err(e) => {
                *self.counters.denied.entry(e.label()).or_default() += 1;
                warn!(module = %req.code.hash, reason = %e, "module load denied");
                (Err(e.clone()), now + self.cfg.decision_ttl)
            }
        };
        if until > now {
            if self.cache.len() >= self.cfg.decision_cache {
                self.cache.retain(|_, (_, u)| *u > now);
                if self.cache.len() >= self.cfg.decision_cache {
                    self.cache.clear();
                }
            }
            self.cache.insert(key, (cached, until));
        }
        r.map(|(g, _)| g)
    }

    fn decide(&self, now: SystemTime, req: &LoadRequest<'_>) -> Result<(Grant, SystemTime), CredError> {
        let bytes = req.credential.ok_or(CredError::NoCredential)?;
        let cred = Credential::parse(bytes, &self.root)?;
        if let Some(n) = req.local_name
            && !valid_ident(n, MAX_NAME)
        {
            return Err(CredError::InvalidLocalName(n.into()));
        }
        // Phase 1: what the authority block says (facts of later blocks are not trusted).
        let mut a =
            AuthorizerBuilder::new().set_limits(self.cfg.run_limits.clone()).build(&cred.token).map_err(run_err)?;
        let found = crate::session::kind_of(&mut a)?;
        if found != "module" {
            return Err(CredError::WrongKind { expected: "module", found });
        }
        let principals: Vec<(String,)> = a.query("q($p) <- principal($p)").map_err(run_err)?;
        let principal = match principals.as_slice() {
            [(p,)] => PrincipalId::from_hex(p).ok_or(CredError::NoPrincipal)?,
            _ => return Err(CredError::NoPrincipal),
        };
        if let Some(r) = req.requester
            && r != principal
        {
            return Err(CredError::WrongPrincipal { owner: principal, requester: r });
        }
        let admin: Vec<(bool,)> = a.query("q(true) <- right(\"admin\")").map_err(run_err)?;
        let admin = !admin.is_empty();
        let channel_facts: Vec<(String, String)> = a.query("q($p, $s) <- channel($p, $s)").map_err(run_err)?;
        let channels = crate::channel::authority_of(admin, self.cfg.require_channel_grants, &channel_facts)?;
        let node = self.cfg.node_limits;
        let (granted_ifaces, max) = if admin {
            (InterfaceSet::ALL, node)
        } else {
            let ifs: Vec<(String,)> = a.query("q($i) <- interface($i)").map_err(run_err)?;
            let mut set = InterfaceSet::EMPTY;
            for (i,) in ifs {
                if let Some(i) = Interface::from_name(&i) {
                    set.insert(i);
                }
            }
            let lims: Vec<(String, i64)> = a.query("q($k, $v) <- limit($k, $v)").map_err(run_err)?;
            let mut m = Limits { memory: 0, cpu: 0, state: 0 };
            for (k, v) in lims {
                let v = u64::try_from(v).unwrap_or(0);
                match k.as_str() {
                    "memory" => m.memory = m.memory.max(v),
                    "cpu" => m.cpu = m.cpu.max(v),
                    "state" => m.state = m.state.max(v),
                    _ => {}
                }
            }
            (set, m.min(node))
        };
        let limits = Limits {
            memory: req.limits.memory.unwrap_or(max.memory),
            cpu: req.limits.cpu.unwrap_or(max.cpu),
            state: req.limits.state.unwrap_or(max.state),
        };
        for (resource, requested, allowed) in
            [("memory", limits.memory, max.memory), ("cpu", limits.cpu, max.cpu), ("state", limits.state, max.state)]
        {
            if requested > allowed {
                return Err(CredError::LimitExceeded { resource, requested, allowed });
            }
        }

        // Phase 2: the request as facts, the token's checks, the node's policies.
        let mut src = String::from(
            "time({now}); memory({memory}); cpu({cpu}); state({state}); module_hash({hash});\n\
             allow if right(\"admin\");\n\
             allow if module_hash($h), grant_hash($h);\n\
             allow if module_signed($k, $n, $v), grant_signed($k, $n);\n\
             allow if module_local($n), grant_local($n);\n",
        );
        let mut p: HashMap<String, Term> = HashMap::new();
        p.insert("now".into(), Term::from(now));
        p.insert("memory".into(), Term::Integer(clamp_i64(limits.memory)));
        p.insert("cpu".into(), Term::Integer(clamp_i64(limits.cpu)));
        p.insert("state".into(), Term::Integer(clamp_i64(limits.state)));
        p.insert("hash".into(), Term::Str(req.code.hash.to_hex()));
        for (n, i) in req.interfaces.iter().enumerate() {
            src.push_str(&format!("uses({{if{n}}});\n"));
            p.insert(format!("if{n}"), Term::Str(i.name().into()));
        }
        if let Some(s) = &req.code.signed {
            src.push_str("module_signed({sk}, {sn}, {sv});\n");
            p.insert("sk".into(), Term::Str(s.programmer.to_hex()));
            p.insert("sn".into(), Term::Str(s.name.clone()));
            p.insert("sv".into(), Term::Str(s.version.clone()));
        }
        if let Some(n) = req.local_name {
            src.push_str("module_local({ln});\n");
            p.insert("ln".into(), Term::Str(n.into()));
        }
        if let Some(r) = req.requester {
            src.push_str("requester({rq});\n");
            p.insert("rq".into(), Term::Str(r.to_hex()));
        }
        let az = authorize_checks(&cred.token, src, p, self.cfg.run_limits.clone(), || CredError::NotGranted {
            module: req.code.hash,
        })?;
        // Thinning at the authority level: every import needs its right.
        if let Some(missing) = req.interfaces.iter().find(|i| !granted_ifaces.contains(*i)) {
            return Err(CredError::InterfaceNotGranted { import: format!("{}.*", missing.name()), right: missing });
        }
        let mut names = vec![ModuleName::Hash(req.code.hash)];
        if let Some(s) = &req.code.signed {
            names.push(ModuleName::Signed {
                programmer: s.programmer,
                name: s.name.clone(),
                version: s.version.clone(),
            });
        }
        if let Some(n) = req.local_name {
            names.push(ModuleName::Local { loader: principal, name: n.into() });
        }
        // The decision may be reused until the earliest date any check mentions.
        let (_, _, checks, _) = az.dump();
        let recheck_at =
            checks.iter().flat_map(check_dates).map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d)).min();
        let until = recheck_at.map_or(now + self.cfg.decision_ttl, |t| t.min(now + self.cfg.decision_ttl));
        Ok((Grant { principal, admin, interfaces: granted_ifaces, limits, names, recheck_at, channels }, until))
    }
}

pub(crate) fn failed_rule(c: &FailedCheck) -> String {
    match c {
        FailedCheck::Block(b) => format!("block {}: {}", b.block_id, b.rule),
        FailedCheck::Authorizer(a) => format!("authorizer: {}", a.rule),
    }
}

pub(crate) fn check_dates(c: &Check) -> Vec<u64> {
    let mut out = Vec::new();
    for q in &c.queries {
        for e in &q.expressions {
            collect_dates(&e.ops, &mut out);
        }
    }
    out
}

fn collect_dates(ops: &[Op], out: &mut Vec<u64>) {
    for op in ops {
        match op {
            Op::Value(Term::Date(d)) => out.push(*d),
            Op::Closure(_, inner) => collect_dates(inner, out),
            _ => {}
        }
    }
}

fn cache_key(req: &LoadRequest<'_>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"anode-decision-v1");
    let cred = req.credential.unwrap_or(&[]);
    h.update((cred.len() as u64).to_le_bytes());
    h.update(cred);
    h.update(req.code.hash.0);
    match &req.code.signed {
        Some(s) => {
            h.update([1]);
            h.update(s.programmer.0);
            h.update([s.name.len() as u8]);
            h.update(s.name.as_bytes());
            h.update([s.version.len() as u8]);
            h.update(s.version.as_bytes());
        }
        None => h.update([0]),
    }
    match req.local_name {
        Some(n) => {
            h.update([1, n.len() as u8]);
            h.update(n.as_bytes());
        }
        None => h.update([0]),
    }
    match req.requester {
        Some(r) => {
            h.update([1]);
            h.update(r.0);
        }
        None => h.update([0]),
    }
    h.update([req.interfaces.iter().fold(0u8, |a, i| a | (1 << i as u8))]);
    for v in [req.limits.memory, req.limits.cpu, req.limits.state] {
        match v {
            Some(v) => {
                h.update([1]);
                h.update(v.to_le_bytes());
            }
            None => h.update([0]),
        }
    }
    h.finalize().into()
}
