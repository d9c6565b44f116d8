//! Monitoring credentials and the policy they grant (FLAME §2; SANE §4.3).
//!
//! A monitoring credential is a Biscuit token rooted in the node
//! administrator's Ed25519 key, like a switchlet credential (`anode-cred`
//! parses and verifies it). Its vocabulary:
//!
//! | authority fact | meaning |
//! |---|---|
//! | `principal("<hex key>")` | who it is issued to (exactly one) |
//! | `right("monitor")` | a monitoring credential (required) |
//! | `right("admin")` | every field, the whole payload, no anonymization, the node's maximum limits, every export |
//! | `filter_proto(p)` | packets of IP protocol `p` (facts of one kind are alternatives) |
//! | `filter_net("<prefix>")` | packets with the source *or* destination in the prefix |
//! | `filter_src("<prefix>")`, `filter_dst("<prefix>")` | source / destination in the prefix |
//! | `filter_port(n)` | TCP/UDP source or destination port `n` |
//! | `read("<field>")` | a readable header field ([`Field`] names: `ip.src`, `tcp.seq`, …) |
//! | `payload(n)` / `payload_all(true)` | the first `n` payload bytes / all captured payload (default: none) |
//! | `anonymize("<prefix>")` / `anonymize("all")` | addresses in the prefix are replaced by their Crypto-PAn image |
//! | `limit("budget", n)` | fuel per packet (≈ wasm instructions) |
//! | `limit("periodic", n)` | fuel per periodic call |
//! | `limit("memory", n)` | linear memory bytes |
//! | `export("records")` / `export("packets")` | may export records / sampled packets |
//! | `check if time($t), $t < <date>` | expiry |
//!
//! A packet is visible iff it is IP and every *kind* of filter present has
//! at least one matching fact (alternatives within a kind, conjunction
//! across kinds). No filter fact: every IP packet.
//!
//! # Attenuation only narrows
//!
//! Any holder may append a block ([`Narrowing`]) with `narrow_*` facts, each a
//! set, and checks (expiry). The verifier reads the authority block's facts
//! with the authorizer's default scope (facts of later blocks are not
//! trusted), and the `narrow_*` facts of every block, which can only narrow:
//! `narrow_read(set)` intersects the fields, `narrow_payload(n)` takes the
//! minimum, `narrow_anonymize(set)` adds anonymized prefixes,
//! `narrow_limit(kind, n)` takes the minimum, `narrow_export(set)`
//! intersects, and each `narrow_proto/net/src/dst/port(set)` adds one more
//! filter clause that must also match. A block that states `read(..)`,
//! `payload(..)` or `right("admin")` gains nothing: those facts are read from
//! the authority block only.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::SystemTime;

use anode_cred::{CredError, Credential, Issuer, PrincipalId, RootKey};
use anode_monitor_apps::abi::Field;
use biscuit_auth::builder::{BlockBuilder, Fact, Term, fact};
use biscuit_auth::error::{Logic, Token};
use biscuit_auth::{AuthorizerBuilder, AuthorizerLimits};

use crate::parse::Packet;

/// An address prefix (IPv4 or IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    v6: bool,
    addr: [u8; 16],
    len: u8,
}

impl Prefix {
    /// Every IPv4 address.
    pub const ALL_V4: Prefix = Prefix { v6: false, addr: [0; 16], len: 0 };
    /// Every IPv6 address.
    pub const ALL_V6: Prefix = Prefix { v6: true, addr: [0; 16], len: 0 };

    /// Parses `a.b.c.d/n` or `x:y::/n` (a bare address is a host prefix).
    pub fn parse(s: &str) -> Option<Prefix> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
            None => (s, None),
        };
        let ip: IpAddr = a.parse().ok()?;
        let (v6, max, mut addr) = match ip {
            IpAddr::V4(v) => {
                let mut b = [0; 16];
                b[..4].copy_from_slice(&v.octets());
                (false, 32, b)
            }
            IpAddr::V6(v) => (true, 128, v.octets()),
        };
        let len = l.unwrap_or(max);
        if len > max {
            return None;
        }
        mask(&mut addr, len);
        Some(Prefix { v6, addr, len })
    }

    /// Whether `addr` (4 or 16 bytes per `version`) is in the prefix.
    pub fn contains(&self, version: u8, addr: &[u8; 16]) -> bool {
        if self.v6 != (version == 6) {
            return false;
        }
        let mut a = *addr;
        mask(&mut a, self.len);
        a == self.addr
    }

    /// Whether every address of `other` is in `self`.
    pub fn covers(&self, other: &Prefix) -> bool {
        self.v6 == other.v6 && self.len <= other.len && {
            let mut a = other.addr;
            mask(&mut a, self.len);
            a == self.addr
        }
    }
}

fn mask(a: &mut [u8; 16], len: u8) {
    for (i, b) in a.iter_mut().enumerate() {
        let keep = (len as usize).saturating_sub(i * 8).min(8);
        *b &= if keep == 0 { 0 } else { 0xffu8 << (8 - keep) };
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.v6 {
            write!(f, "{}/{}", std::net::Ipv6Addr::from(self.addr), self.len)
        } else {
            write!(
                f,
                "{}/{}",
                std::net::Ipv4Addr::new(self.addr[0], self.addr[1], self.addr[2], self.addr[3]),
                self.len
            )
        }
    }
}

/// One filter clause: a packet matches if it matches any alternative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Clause {
    /// IP protocol numbers.
    Proto(Vec<u8>),
    /// Source or destination in a prefix.
    Net(Vec<Prefix>),
    /// Source in a prefix.
    Src(Vec<Prefix>),
    /// Destination in a prefix.
    Dst(Vec<Prefix>),
    /// TCP/UDP source or destination port.
    Port(Vec<u16>),
}

impl Clause {
    fn matches(&self, p: &Packet<'_>) -> bool {
        match self {
            Clause::Proto(v) => v.contains(&p.proto),
            Clause::Net(v) => v.iter().any(|x| x.contains(p.version, &p.src) || x.contains(p.version, &p.dst)),
            Clause::Src(v) => v.iter().any(|x| x.contains(p.version, &p.src)),
            Clause::Dst(v) => v.iter().any(|x| x.contains(p.version, &p.dst)),
            Clause::Port(v) => {
                let (s, d) = p.ports();
                !matches!(p.l4, crate::parse::L4::None) && (v.contains(&s) || v.contains(&d))
            }
        }
    }
}

/// The packet filter: every clause must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The clauses (empty: every IP packet).
    pub clauses: Vec<Clause>,
}

impl Filter {
    /// Whether the packet is visible.
    pub fn matches(&self, p: &Packet<'_>) -> bool {
        self.clauses.iter().all(|c| c.matches(p))
    }
}

/// What a module may export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ExportRights {
    /// Records (JSON lines, IPFIX).
    pub records: bool,
    /// Sampled packets (pcap).
    pub packets: bool,
}

/// Resource limits of a monitoring module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyLimits {
    /// Fuel per packet.
    pub budget: u64,
    /// Fuel per periodic call.
    pub periodic: u64,
    /// Linear memory bytes.
    pub memory: u64,
}

impl PolicyLimits {
    fn min(self, o: PolicyLimits) -> PolicyLimits {
        PolicyLimits {
            budget: self.budget.min(o.budget),
            periodic: self.periodic.min(o.periodic),
            memory: self.memory.min(o.memory),
        }
    }
}

/// Payload bytes a grant allows: all captured bytes.
pub const PAYLOAD_ALL: u32 = u32::MAX;

/// The effective policy of a credential, decided once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The credential's principal.
    pub principal: PrincipalId,
    /// An administrative credential.
    pub admin: bool,
    /// Which packets the module sees.
    pub filter: Filter,
    /// Readable fields, as a mask of [`Field::bit`].
    pub fields: u32,
    /// Payload bytes per packet ([`PAYLOAD_ALL`]: all captured bytes).
    pub payload: u32,
    /// Addresses in these prefixes are anonymized.
    pub anonymize: Vec<Prefix>,
    /// Limits.
    pub limits: PolicyLimits,
    /// Export rights.
    pub export: ExportRights,
}

impl Policy {
    /// Whether `f` is readable.
    pub fn reads(&self, f: Field) -> bool {
        self.fields & f.bit() != 0
    }
    /// Whether some address needs anonymizing.
    pub fn anonymizes(&self) -> bool {
        !self.anonymize.is_empty()
    }
}

/// What an administrator grants when issuing a monitoring credential.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MonitorSpec {
    /// Filter clauses (authority block: one clause per kind).
    pub filter: Vec<Clause>,
    /// Readable fields.
    pub read: Vec<Field>,
    /// Payload bytes ([`PAYLOAD_ALL`] for all, 0 for none).
    pub payload: u32,
    /// Anonymized prefixes.
    pub anonymize: Vec<Prefix>,
    /// Limits (`None`: the node's defaults).
    pub limits: Option<PolicyLimits>,
    /// Export rights.
    pub export: ExportRights,
    /// Expiry.
    pub expires: Option<SystemTime>,
    /// An administrative credential (sees everything).
    pub admin: bool,
}

/// Restrictions a holder adds before passing a monitoring credential on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Narrowing {
    /// Extra filter clauses.
    pub filter: Vec<Clause>,
    /// Only these fields.
    pub read: Option<Vec<Field>>,
    /// At most this many payload bytes.
    pub payload: Option<u32>,
    /// Anonymize these prefixes too.
    pub anonymize: Vec<Prefix>,
    /// Lower limits.
    pub budget: Option<u64>,
    /// Lower periodic fuel.
    pub periodic: Option<u64>,
    /// Lower memory.
    pub memory: Option<u64>,
    /// Only these exports.
    pub export: Option<ExportRights>,
    /// Expire at this time.
    pub expires: Option<SystemTime>,
}

/// Why a monitoring credential was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Parsing or verifying the token failed (size, format, issuer).
    #[error(transparent)]
    Credential(#[from] CredError),
    /// The credential lacks `right("monitor")`.
    #[error("not a monitoring credential (no right(\"monitor\"))")]
    NotMonitoring,
    /// The authority block lacks exactly one `principal(..)` fact.
    #[error("credential names no principal")]
    NoPrincipal,
    /// An expiry check failed.
    #[error("credential expired: {0}")]
    Expired(String),
    /// Another check of the token failed.
    #[error("credential check failed: {0}")]
    CheckFailed(String),
    /// A policy fact is malformed (unknown field, bad prefix, bad number).
    #[error("malformed policy fact: {0}")]
    BadFact(String),
    /// Datalog evaluation exceeded its limits.
    #[error("credential evaluation exceeded the run limits: {0}")]
    RunLimit(String),
}

impl PolicyError {
    /// A short stable label for counters.
    pub fn label(&self) -> &'static str {
        match self {
            PolicyError::Credential(e) => e.label(),
            PolicyError::NotMonitoring => "not_monitoring",
            PolicyError::NoPrincipal => "no_principal",
            PolicyError::Expired(_) => "expired",
            PolicyError::CheckFailed(_) => "check_failed",
            PolicyError::BadFact(_) => "bad_fact",
            PolicyError::RunLimit(_) => "run_limit",
        }
    }
}

fn s(v: impl Into<String>) -> Term {
    Term::Str(v.into())
}

fn build(e: Token) -> PolicyError {
    PolicyError::Credential(CredError::Build(e.to_string()))
}

fn clause_facts(c: &Clause, prefix: &str) -> Vec<Fact> {
    let one = |kind: &str, t: Term| fact(&format!("{prefix}{kind}"), &[t]);
    match c {
        Clause::Proto(v) => v.iter().map(|p| one("proto", Term::Integer(i64::from(*p)))).collect(),
        Clause::Net(v) => v.iter().map(|p| one("net", s(p.to_string()))).collect(),
        Clause::Src(v) => v.iter().map(|p| one("src", s(p.to_string()))).collect(),
        Clause::Dst(v) => v.iter().map(|p| one("dst", s(p.to_string()))).collect(),
        Clause::Port(v) => v.iter().map(|p| one("port", Term::Integer(i64::from(*p)))).collect(),
    }
}

fn clause_set_fact(c: &Clause) -> Fact {
    let (kind, set): (&str, BTreeSet<Term>) = match c {
        Clause::Proto(v) => ("proto", v.iter().map(|p| Term::Integer(i64::from(*p))).collect()),
        Clause::Net(v) => ("net", v.iter().map(|p| s(p.to_string())).collect()),
        Clause::Src(v) => ("src", v.iter().map(|p| s(p.to_string())).collect()),
        Clause::Dst(v) => ("dst", v.iter().map(|p| s(p.to_string())).collect()),
        Clause::Port(v) => ("port", v.iter().map(|p| Term::Integer(i64::from(*p))).collect()),
    };
    fact(&format!("narrow_{kind}"), &[Term::Set(set)])
}

/// Issues a monitoring credential for `principal` with the administrator's key.
///
/// # Errors
/// [`PolicyError::Credential`] if the token cannot be built.
pub fn issue(issuer: &Issuer, principal: PrincipalId, spec: &MonitorSpec) -> Result<Credential, PolicyError> {
    let mut facts = vec![fact("principal", &[s(principal.to_hex())]), fact("right", &[s("monitor")])];
    if spec.admin {
        facts.push(fact("right", &[s("admin")]));
    }
    for c in &spec.filter {
        facts.extend(clause_facts(c, "filter_"));
    }
    facts.extend(spec.read.iter().map(|f| fact("read", &[s(f.name())])));
    match spec.payload {
        0 => {}
        PAYLOAD_ALL => facts.push(fact("payload_all", &[Term::Bool(true)])),
        n => facts.push(fact("payload", &[Term::Integer(i64::from(n))])),
    }
    facts.extend(spec.anonymize.iter().map(|p| fact("anonymize", &[s(p.to_string())])));
    if let Some(l) = spec.limits {
        for (k, v) in [("budget", l.budget), ("periodic", l.periodic), ("memory", l.memory)] {
            facts.push(fact("limit", &[s(k), Term::Integer(i64::try_from(v).unwrap_or(i64::MAX))]));
        }
    }
    if spec.export.records {
        facts.push(fact("export", &[s("records")]));
    }
    if spec.export.packets {
        facts.push(fact("export", &[s("packets")]));
    }
    let mut b = biscuit_auth::Biscuit::builder();
    for f in facts {
        b = b.fact(f).map_err(build)?;
    }
    if let Some(t) = spec.expires {
        let mut p = std::collections::HashMap::new();
        p.insert("exp".to_string(), Term::from(t));
        b = b.code_with_params("check if time($t), $t < {exp};", p, std::collections::HashMap::new()).map_err(build)?;
    }
    Ok(issuer.issue_builder(b)?)
}

/// Appends a narrowing block: anyone holding the credential can, nobody can widen.
///
/// # Errors
/// [`PolicyError::Credential`] if the block cannot be built.
pub fn attenuate(cred: &Credential, n: &Narrowing) -> Result<Credential, PolicyError> {
    Ok(cred.attenuate_block(narrowing_block(n)?)?)
}

/// The block [`attenuate`] appends (for tools that append it to a token they
/// have not verified).
///
/// # Errors
/// [`PolicyError::Credential`] if the block cannot be built.
pub fn narrowing_block(n: &Narrowing) -> Result<BlockBuilder, PolicyError> {
    let mut facts: Vec<Fact> = n.filter.iter().map(clause_set_fact).collect();
    if let Some(r) = &n.read {
        facts.push(fact("narrow_read", &[Term::Set(r.iter().map(|f| s(f.name())).collect())]));
    }
    if let Some(p) = n.payload {
        facts.push(fact("narrow_payload", &[Term::Integer(i64::from(p))]));
    }
    if !n.anonymize.is_empty() {
        facts.push(fact("narrow_anonymize", &[Term::Set(n.anonymize.iter().map(|p| s(p.to_string())).collect())]));
    }
    for (k, v) in [("budget", n.budget), ("periodic", n.periodic), ("memory", n.memory)] {
        if let Some(v) = v {
            facts.push(fact("narrow_limit", &[s(k), Term::Integer(i64::try_from(v).unwrap_or(i64::MAX))]));
        }
    }
    if let Some(e) = n.export {
        let mut set = BTreeSet::new();
        if e.records {
            set.insert(s("records"));
        }
        if e.packets {
            set.insert(s("packets"));
        }
        facts.push(fact("narrow_export", &[Term::Set(set)]));
    }
    let mut b = BlockBuilder::new();
    for f in facts {
        b = b.fact(f).map_err(build)?;
    }
    if let Some(t) = n.expires {
        let mut p = std::collections::HashMap::new();
        p.insert("exp".to_string(), Term::from(t));
        b = b.code_with_params("check if time($t), $t < {exp};", p, std::collections::HashMap::new()).map_err(build)?;
    }
    Ok(b)
}

/// Verifies monitoring credentials and computes their policy.
#[derive(Debug, Clone)]
pub struct PolicyVerifier {
    root: RootKey,
    /// Limits when the credential states none; also what `right("admin")` gets.
    pub defaults: PolicyLimits,
    /// Caps on every grant.
    pub max: PolicyLimits,
    /// Datalog run limits.
    pub run_limits: AuthorizerLimits,
}

fn run_err(e: Token) -> PolicyError {
    match e {
        Token::RunLimit(r) => PolicyError::RunLimit(r.to_string()),
        other => PolicyError::Credential(CredError::Malformed(other.to_string())),
    }
}

fn field_set(names: &BTreeSet<String>) -> Result<u32, PolicyError> {
    names.iter().try_fold(0u32, |m, n| {
        Field::from_name(n).map(|f| m | f.bit()).ok_or_else(|| PolicyError::BadFact(format!("unknown field {n:?}")))
    })
}

fn prefix(s: &str) -> Result<Vec<Prefix>, PolicyError> {
    if s == "all" {
        return Ok(vec![Prefix::ALL_V4, Prefix::ALL_V6]);
    }
    Prefix::parse(s).map(|p| vec![p]).ok_or_else(|| PolicyError::BadFact(format!("bad prefix {s:?}")))
}

fn small<T: TryFrom<i64>>(v: i64, what: &str) -> Result<T, PolicyError> {
    T::try_from(v).map_err(|_| PolicyError::BadFact(format!("{what} {v} out of range")))
}

impl PolicyVerifier {
    /// A verifier for credentials rooted in `root`.
    pub fn new(root: RootKey) -> PolicyVerifier {
        PolicyVerifier {
            root,
            defaults: PolicyLimits { budget: 20_000, periodic: 5_000_000, memory: 4 << 20 },
            max: PolicyLimits { budget: 1_000_000, periodic: 100_000_000, memory: 64 << 20 },
            run_limits: AuthorizerLimits {
                max_facts: 1000,
                max_iterations: 100,
                max_time: std::time::Duration::from_millis(50),
            },
        }
    }

    /// Decides a credential at `now`: verifies the signature chain, runs its
    /// checks, and computes the effective policy.
    ///
    /// # Errors
    /// See [`PolicyError`].
    pub fn authorize(&self, now: SystemTime, credential: &[u8]) -> Result<Policy, PolicyError> {
        let cred = Credential::parse(credential, &self.root)?;
        let mut params = std::collections::HashMap::new();
        params.insert("now".to_string(), Term::from(now));
        let mut a = AuthorizerBuilder::new()
            .code_with_params("time({now}); allow if true;", params, std::collections::HashMap::new())
            .map_err(build)?
            .set_limits(self.run_limits.clone())
            .build(cred.token())
            .map_err(run_err)?;
        match a.authorize() {
            Ok(_) => {}
            Err(Token::FailedLogic(Logic::Unauthorized { checks, .. } | Logic::NoMatchingPolicy { checks })) => {
                let text: Vec<String> = checks.iter().map(|c| format!("{c:?}")).collect();
                let t = text.join("; ");
                return Err(if t.contains("time(") { PolicyError::Expired(t) } else { PolicyError::CheckFailed(t) });
            }
            Err(e) => return Err(run_err(e)),
        }
        // Authority facts (default scope: authority block and authorizer only).
        let principals: Vec<(String,)> = a.query("q($p) <- principal($p)").map_err(run_err)?;
        let principal = match principals.as_slice() {
            [(p,)] => PrincipalId::from_hex(p).ok_or(PolicyError::NoPrincipal)?,
            _ => return Err(PolicyError::NoPrincipal),
        };
        let rights: Vec<(String,)> = a.query("q($r) <- right($r)").map_err(run_err)?;
        // Every monitoring credential states right("monitor"), the
        // administrative one too: a module credential's right("admin")
        // alone does not make a monitoring credential.
        if !rights.iter().any(|(r,)| r == "monitor") {
            return Err(PolicyError::NotMonitoring);
        }
        let admin = rights.iter().any(|(r,)| r == "admin");
        let mut p = Policy {
            principal,
            admin,
            filter: Filter::default(),
            fields: 0,
            payload: 0,
            anonymize: Vec::new(),
            limits: self.defaults,
            export: ExportRights::default(),
        };
        // Filter: one clause per kind present in the authority block.
        let protos: Vec<(i64,)> = a.query("q($p) <- filter_proto($p)").map_err(run_err)?;
        if !protos.is_empty() {
            p.filter
                .clauses
                .push(Clause::Proto(protos.iter().map(|(v,)| small(*v, "protocol")).collect::<Result<_, _>>()?));
        }
        for kind in ["net", "src", "dst"] {
            let v: Vec<(String,)> = a.query(format!("q($p) <- filter_{kind}($p)").as_str()).map_err(run_err)?;
            if !v.is_empty() {
                let mut ps = Vec::new();
                for (x,) in &v {
                    ps.extend(prefix(x)?);
                }
                p.filter.clauses.push(match kind {
                    "net" => Clause::Net(ps),
                    "src" => Clause::Src(ps),
                    _ => Clause::Dst(ps),
                });
            }
        }
        let ports: Vec<(i64,)> = a.query("q($p) <- filter_port($p)").map_err(run_err)?;
        if !ports.is_empty() {
            p.filter.clauses.push(Clause::Port(ports.iter().map(|(v,)| small(*v, "port")).collect::<Result<_, _>>()?));
        }
        if admin {
            p.fields = Field::ALL.iter().fold(0, |m, f| m | f.bit());
            p.payload = PAYLOAD_ALL;
            p.limits = self.max;
            p.export = ExportRights { records: true, packets: true };
        } else {
            let reads: Vec<(String,)> = a.query("q($f) <- read($f)").map_err(run_err)?;
            p.fields = field_set(&reads.into_iter().map(|(f,)| f).collect())?;
            let all: Vec<(bool,)> = a.query("q($p) <- payload_all($p)").map_err(run_err)?;
            let n: Vec<(i64,)> = a.query("q($p) <- payload($p)").map_err(run_err)?;
            if all.iter().any(|(v,)| *v) {
                p.payload = PAYLOAD_ALL;
            } else if let Some(m) = n.iter().map(|(v,)| *v).max() {
                p.payload = small(m, "payload")?;
            }
            let anon: Vec<(String,)> = a.query("q($p) <- anonymize($p)").map_err(run_err)?;
            for (x,) in &anon {
                p.anonymize.extend(prefix(x)?);
            }
            let lims: Vec<(String, i64)> = a.query("q($k, $v) <- limit($k, $v)").map_err(run_err)?;
            for (k, v) in lims {
                let v: u64 = small(v, "limit")?;
                match k.as_str() {
                    "budget" => p.limits.budget = v,
                    "periodic" => p.limits.periodic = v,
                    "memory" => p.limits.memory = v,
                    other => return Err(PolicyError::BadFact(format!("unknown limit {other:?}"))),
                }
            }
            p.limits = p.limits.min(self.max);
            let ex: Vec<(String,)> = a.query("q($e) <- export($e)").map_err(run_err)?;
            p.export.records = ex.iter().any(|(e,)| e == "records");
            p.export.packets = ex.iter().any(|(e,)| e == "packets");
        }
        self.narrow(&mut a, &mut p)?;
        Ok(p)
    }

    /// Applies every block's `narrow_*` facts (they can only narrow).
    fn narrow(&self, a: &mut biscuit_auth::Authorizer, p: &mut Policy) -> Result<(), PolicyError> {
        let reads: Vec<(BTreeSet<String>,)> = a.query_all("q($s) <- narrow_read($s)").map_err(run_err)?;
        for (set,) in reads {
            p.fields &= field_set(&set)?;
        }
        let pay: Vec<(i64,)> = a.query_all("q($n) <- narrow_payload($n)").map_err(run_err)?;
        for (n,) in pay {
            p.payload = p.payload.min(u32::try_from(n.max(0)).unwrap_or(u32::MAX));
        }
        let anon: Vec<(BTreeSet<String>,)> = a.query_all("q($s) <- narrow_anonymize($s)").map_err(run_err)?;
        for (set,) in anon {
            for x in &set {
                p.anonymize.extend(prefix(x)?);
            }
        }
        let lims: Vec<(String, i64)> = a.query_all("q($k, $v) <- narrow_limit($k, $v)").map_err(run_err)?;
        for (k, v) in lims {
            let v = u64::try_from(v.max(0)).unwrap_or(0);
            match k.as_str() {
                "budget" => p.limits.budget = p.limits.budget.min(v),
                "periodic" => p.limits.periodic = p.limits.periodic.min(v),
                "memory" => p.limits.memory = p.limits.memory.min(v),
                other => return Err(PolicyError::BadFact(format!("unknown limit {other:?}"))),
            }
        }
        let ex: Vec<(BTreeSet<String>,)> = a.query_all("q($s) <- narrow_export($s)").map_err(run_err)?;
        for (set,) in ex {
            p.export.records &= set.contains("records");
            p.export.packets &= set.contains("packets");
        }
        let protos: Vec<(BTreeSet<i64>,)> = a.query_all("q($s) <- narrow_proto($s)").map_err(run_err)?;
        for (set,) in protos {
            p.filter.clauses.push(Clause::Proto(set.iter().map(|v| small(*v, "protocol")).collect::<Result<_, _>>()?));
        }
        let ports: Vec<(BTreeSet<i64>,)> = a.query_all("q($s) <- narrow_port($s)").map_err(run_err)?;
        for (set,) in ports {
            p.filter.clauses.push(Clause::Port(set.iter().map(|v| small(*v, "port")).collect::<Result<_, _>>()?));
        }
        for kind in ["net", "src", "dst"] {
            let v: Vec<(BTreeSet<String>,)> =
                a.query_all(format!("q($s) <- narrow_{kind}($s)").as_str()).map_err(run_err)?;
            for (set,) in v {
                let mut ps = Vec::new();
                for x in &set {
                    ps.extend(prefix(x)?);
                }
                p.filter.clauses.push(match kind {
                    "net" => Clause::Net(ps),
                    "src" => Clause::Src(ps),
                    _ => Clause::Dst(ps),
                });
            }
        }
        Ok(())
    }
}
