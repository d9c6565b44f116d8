//! Administrative domains (SANE §4.7): a key distribution service that
//! issues short-lived tickets, packets authenticated by ticket, and
//! perimeter verification. Sans-I/O: bytes and the time in, verdicts out.
//!
//! > "Once the user has established an SA with some active node in another
//! > administrative domain, that node can act as a key distribution server
//! > (KDC) similar to Kerberos. Only nodes at the perimeter of an
//! > administrative cloud need verify the cryptographic integrity of
//! > packets. They can then specify what the active packet can do in the
//! > interior of the domain. [...] policy can be specified but not enforced
//! > at the edges; enforcement of access and resource management policies
//! > has to take place in the interior." (SANE §4.7)
//!
//! - A domain is named by its operator's Ed25519 key ([`DomainKey::id`] is
//!   that key's fingerprint). Its nodes share a 32-byte domain secret
//!   (`anode-domain-secret-v1` key files). Keys per epoch are derived with
//!   HKDF-SHA256 (ring): `ticket` keys (AES-256-GCM) seal tickets,
//!   `perimeter` keys (HMAC-SHA256) tag attachments. A node holds only its
//!   own domain's secret, so it cannot mint tickets or attachments for
//!   another domain.
//! - [`Kdc`]: on a node where the user has an XX SA, issues a ticket bound
//!   to the user's key, a fresh session key, an expiry (short: at most
//!   `max_lifetime_s`) and the user's credential attenuated to that expiry.
//!   Issuance is rate limited per user and globally, before any parsing.
//! - [`TicketHolder`]: the user's side; seals packets under the session key
//!   (the ticket rides along on the first packet to each node).
//! - [`DomainNode`]: every node of the domain: opens ticket-authenticated
//!   packets addressed to it (replay window per ticket: check before the
//!   tag, commit after), admits packets at the border by attaching an
//!   attenuated credential tagged under the perimeter key and bound to the
//!   packet's digest, accepts attached packets in the interior (replay
//!   window per border), and enforces the attached credential itself
//!   ([`DomainNode::authorize`], with `anode_cred`'s verifier).
//! - Revocation: an epoch floor (raising it revokes every older ticket and
//!   attachment), and lists of revoked ticket ids and users.
//!
//! Formats: [`crate::ticket`]; design notes: `docs/security.md`.

use crate::identity::{Fingerprint, PublicKey};
use crate::replay::{ReplayError, ReplayWindow};
use crate::ticket::{
    ATTACH_TAG, AttachmentRepr, KdcMessage, MAX_CREDENTIAL, RefusalCode, TAG_LEN, TICKET_HEADER, TicketBody,
    TicketPacketRepr, TicketRepr, WireError,
};
use anode_cred::{Attenuation, CodeInfo, CredError, Credential, Grant, InterfaceSet, PrincipalId, RequestedLimits};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::{hkdf, hmac};
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};
use zeroize::Zeroizing;

/// First word of a domain secret file.
pub const SECRET_TAG: &str = "anode-domain-secret-v1";
/// HKDF salt prefix (the operator's key follows).
const SALT: &[u8] = b"anode/sane/domain/v1";
/// Most tickets a node keeps open at once.
pub const MAX_OPEN_TICKETS: usize = 4096;
/// Most border nodes whose sequence windows a node keeps.
pub const MAX_BORDERS: usize = 1024;
/// Most revoked ticket ids and users kept.
pub const MAX_REVOKED: usize = 65_536;

/// Why a domain operation was refused. Each is counted by its label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DomainError {
    /// The bytes are not a well-formed message.
    #[error("malformed: {0}")]
    Malformed(#[from] WireError),
    /// Issued by (or for) another domain.
    #[error("ticket or attachment of another domain")]
    WrongDomain,
    /// Sealed under an epoch older than the revocation floor, or not yet known.
    #[error("key epoch {0} is revoked or unknown")]
    Epoch(u32),
    /// The ticket does not open under this domain's key (forged or altered).
    #[error("forged or altered ticket")]
    ForgedTicket,
    /// The packet does not verify under the ticket's session key.
    #[error("packet fails authentication under its ticket")]
    BadPacket,
    /// The attachment's tag does not verify (forged, altered, or moved to another packet).
    #[error("perimeter attachment fails verification")]
    BadAttachment,
    /// A packet reached an interior node without a perimeter attachment.
    #[error("packet without a perimeter attachment (bypassed the perimeter)")]
    NoAttachment,
    /// Past its expiry, or not yet valid.
    #[error("ticket or attachment expired or not yet valid")]
    Expired,
    /// Replayed (or too old for the replay window).
    #[error("replay: {0}")]
    Replay(ReplayError),
    /// The ticket or user is revoked.
    #[error("revoked")]
    Revoked,
    /// No ticket included and none held for this id.
    #[error("unknown ticket {0:#x} (send the ticket with the packet)")]
    UnknownTicket(u64),
    /// Addressed to another node.
    #[error("packet for another node")]
    NotForMe,
    /// Over the issuance rate.
    #[error("ticket issuance rate limit")]
    RateLimited,
    /// The credential was refused (at issuance) or does not allow the request (in the interior).
    #[error("credential: {0}")]
    Credential(CredError),
    /// The lifetime asked for is zero.
    #[error("ticket lifetime must be positive")]
    Lifetime,
    /// The system random number generator failed.
    #[error("random number generator failed")]
    Random,
    /// HKDF refused to derive a key (cannot happen with these lengths).
    #[error("key derivation failed")]
    KeyDerivation,
    /// A revocation update would take a list past [`MAX_REVOKED`].
    #[error("revocation lists full")]
    RevocationFull,
}

impl DomainError {
    /// A short stable label for counters and logs.
    pub fn label(&self) -> &'static str {
        match self {
            DomainError::Malformed(_) => "malformed",
            DomainError::WrongDomain => "wrong_domain",
            DomainError::Epoch(_) => "epoch",
            DomainError::ForgedTicket => "forged_ticket",
            DomainError::BadPacket => "bad_packet",
            DomainError::BadAttachment => "bad_attachment",
            DomainError::NoAttachment => "no_attachment",
            DomainError::Expired => "expired",
            DomainError::Replay(_) => "replay",
            DomainError::Revoked => "revoked",
            DomainError::UnknownTicket(_) => "unknown_ticket",
            DomainError::NotForMe => "not_for_me",
            DomainError::RateLimited => "rate_limited",
            DomainError::Credential(_) => "credential",
            DomainError::Lifetime => "lifetime",
            DomainError::Random => "random",
            DomainError::RevocationFull => "revocation_full",
            DomainError::KeyDerivation => "key_derivation",
        }
    }
}

fn random<const N: usize>() -> Result<[u8; N], DomainError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|_| DomainError::Random)?;
    Ok(b)
}

fn unix(now_s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(now_s)
}

/// A domain's identity (its operator's key) and secret.
pub struct DomainKey {
    operator: PublicKey,
    prk: hkdf::Prk,
}

impl core::fmt::Debug for DomainKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DomainKey({})", self.operator.fingerprint())
    }
}

impl DomainKey {
    /// The domain of `operator` with shared secret `secret`.
    pub fn new(operator: PublicKey, secret: &[u8; 32]) -> DomainKey {
        let mut salt = SALT.to_vec();
        salt.extend_from_slice(operator.as_bytes());
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(secret);
        DomainKey { operator, prk }
    }

    /// A fresh random domain secret.
    pub fn generate_secret() -> Result<Zeroizing<[u8; 32]>, DomainError> {
        Ok(Zeroizing::new(random()?))
    }

    /// Parses a secret file's text (`anode-domain-secret-v1 <64 hex digits>`).
    pub fn parse_secret(text: &str) -> Option<Zeroizing<[u8; 32]>> {
        let hex = text.trim().strip_prefix(SECRET_TAG)?.trim();
        let b = hex.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut out = Zeroizing::new([0u8; 32]);
        for (i, o) in out.iter_mut().enumerate() {
            *o = nib(b[2 * i])? << 4 | nib(b[2 * i + 1])?;
        }
        Some(out)
    }

    /// The text of a secret file.
    pub fn secret_file_text(secret: &[u8; 32]) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::from(SECRET_TAG));
        s.push(' ');
        for b in secret {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }

    /// The operator's key: the domain's name.
    pub fn operator(&self) -> PublicKey {
        self.operator
    }

    /// The domain's id on the wire: the operator's fingerprint.
    pub fn id(&self) -> [u8; 16] {
        self.operator.fingerprint().0
    }

    fn ticket_key(&self, epoch: u32) -> Result<LessSafeKey, DomainError> {
        let e = epoch.to_be_bytes();
        let info = [b"ticket".as_slice(), &e];
        let okm = self.prk.expand(&info, &AES_256_GCM).map_err(|_| DomainError::KeyDerivation)?;
        Ok(LessSafeKey::new(UnboundKey::from(okm)))
    }

    fn perimeter_key(&self, epoch: u32) -> Result<hmac::Key, DomainError> {
        let e = epoch.to_be_bytes();
        let info = [b"perimeter".as_slice(), &e];
        let okm = self.prk.expand(&info, hmac::HMAC_SHA256).map_err(|_| DomainError::KeyDerivation)?;
        Ok(hmac::Key::from(okm))
    }
}

/// Revoked tickets, users and epochs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocation {
    /// Tickets and attachments sealed under an older epoch are refused.
    pub min_epoch: u32,
    /// Revoked ticket ids.
    pub tickets: BTreeSet<u64>,
    /// Revoked users.
    pub users: BTreeSet<[u8; 32]>,
}

impl Revocation {
    /// This revocation with `u` added: the floor raised (never lowered),
    /// the ids and users added. Checked whole before anything changes.
    ///
    /// # Errors
    /// [`DomainError::RevocationFull`] if a list would pass [`MAX_REVOKED`].
    pub fn merged(&self, u: &crate::ticket::RevokeUpdate) -> Result<Revocation, DomainError> {
        let mut r = self.clone();
        r.min_epoch = r.min_epoch.max(u.min_epoch);
        r.tickets.extend(u.tickets.iter().copied());
        r.users.extend(u.users.iter().copied());
        if r.tickets.len() > MAX_REVOKED || r.users.len() > MAX_REVOKED {
            return Err(DomainError::RevocationFull);
        }
        Ok(r)
    }
}

/// A token bucket (rates per second, checked with a monotonic clock in ms).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: u64,
    at: u64,
}

impl Bucket {
    fn full(burst: u32, now: u64) -> Bucket {
        Bucket { milli: u64::from(burst) * 1000, at: now }
    }
    fn take(&mut self, rate: u32, burst: u32, now: u64) -> bool {
        let dt = now.saturating_sub(self.at);
        self.at = now;
        self.milli = (self.milli + dt * u64::from(rate)).min(u64::from(burst) * 1000);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// Settings of a key distribution service.
#[derive(Debug, Clone)]
pub struct KdcConfig {
    /// The current key epoch.
    pub epoch: u32,
    /// Longest ticket lifetime, seconds (tickets are short-lived: they
    /// cannot be recalled once issued except by revocation).
    pub max_lifetime_s: u64,
    /// Tickets per second per user.
    pub per_user_per_sec: u32,
    /// Burst per user.
    pub per_user_burst: u32,
    /// Tickets per second in all.
    pub global_per_sec: u32,
    /// Global burst.
    pub global_burst: u32,
    /// Extra restrictions the domain puts on every ticket's credential.
    pub policy: Attenuation,
}

impl Default for KdcConfig {
    fn default() -> Self {
        KdcConfig {
            epoch: 1,
            max_lifetime_s: 300,
            per_user_per_sec: 1,
            per_user_burst: 5,
            global_per_sec: 200,
            global_burst: 400,
            policy: Attenuation::default(),
        }
    }
}

/// A ticket just issued.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The ticket bytes.
    pub ticket: Vec<u8>,
    /// Its id.
    pub id: u64,
    /// The session key (travels to the user inside its SA only).
    pub session_key: Zeroizing<[u8; 32]>,
    /// Expiry, Unix seconds.
    pub expires: u64,
}

/// Key distribution service counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KdcCounters {
    /// Tickets issued.
    pub issued: u64,
    /// Refusals by label.
    pub refused: HashMap<&'static str, u64>,
}

/// The key distribution service of a domain node.
#[derive(Debug)]
pub struct Kdc {
    key: DomainKey,
    cfg: KdcConfig,
    root: anode_cred::RootKey,
    users: HashMap<[u8; 32], Bucket>,
    global: Bucket,
    counters: KdcCounters,
    revocation: Revocation,
}

impl Kdc {
    /// A service for `key`'s domain; credentials must be rooted in the
    /// domain operator's key.
    pub fn new(key: DomainKey, cfg: KdcConfig, now_ms: u64) -> Result<Kdc, DomainError> {
        let root = anode_cred::root_key_from_ed25519(key.operator.as_bytes()).map_err(DomainError::Credential)?;
        let global = Bucket::full(cfg.global_burst, now_ms);
        Ok(Kdc {
            key,
            cfg,
            root,
            users: HashMap::new(),
            global,
            counters: KdcCounters::default(),
            revocation: Revocation::default(),
        })
    }

    /// Counters.
    pub fn counters(&self) -> &KdcCounters {
        &self.counters
    }

    /// The domain operator's key.
    pub fn operator(&self) -> PublicKey {
        self.key.operator()
    }

    /// Replaces what the service revokes: a revoked user gets no ticket
    /// ([`DomainError::Revoked`]), and a floor above the current epoch
    /// moves the service to it (tickets are issued under the floor).
    pub fn set_revocation(&mut self, r: Revocation) {
        self.cfg.epoch = self.cfg.epoch.max(r.min_epoch);
        self.revocation = r;
    }

    /// Issues a ticket to `user` (the principal of the SA the request came
    /// over) for `credential`, valid `lifetime_s` (capped) from `now_s`.
    ///
    /// # Errors
    /// [`DomainError::RateLimited`] (checked first, before any parsing),
    /// [`DomainError::Credential`] if the credential is not the domain
    /// operator's, [`DomainError::Lifetime`].
    pub fn issue(
        &mut self,
        user: PublicKey,
        credential: &[u8],
        lifetime_s: u64,
        now_ms: u64,
        now_s: u64,
    ) -> Result<Issued, DomainError> {
        let r = self.issue_inner(user, credential, lifetime_s, now_ms, now_s);
        match &r {
            Ok(_) => self.counters.issued += 1,
            Err(e) => *self.counters.refused.entry(e.label()).or_default() += 1,
        }
        r
    }

    fn issue_inner(
        &mut self,
        user: PublicKey,
        credential: &[u8],
        lifetime_s: u64,
        now_ms: u64,
        now_s: u64,
    ) -> Result<Issued, DomainError> {
        let c = &self.cfg;
        if self.users.len() >= MAX_OPEN_TICKETS && !self.users.contains_key(user.as_bytes()) {
            // Forget users whose buckets are full again (idle for a while).
            let full = u64::from(c.per_user_burst) * 1000;
            let (rate, burst) = (c.per_user_per_sec, c.per_user_burst);
            self.users.retain(|_, b| {
                let mut t = *b;
                t.take(rate, burst, now_ms);
                t.milli + 1000 < full
            });
        }
        let b = self.users.entry(*user.as_bytes()).or_insert_with(|| Bucket::full(c.per_user_burst, now_ms));
        if !b.take(c.per_user_per_sec, c.per_user_burst, now_ms)
            || !self.global.take(c.global_per_sec, c.global_burst, now_ms)
        {
            return Err(DomainError::RateLimited);
        }
        if lifetime_s == 0 {
            return Err(DomainError::Lifetime);
        }
        if self.revocation.users.contains(user.as_bytes()) {
            return Err(DomainError::Revoked);
        }
        if credential.len() > MAX_CREDENTIAL {
            return Err(DomainError::Credential(CredError::TooLarge(credential.len())));
        }
        let lifetime = lifetime_s.min(self.cfg.max_lifetime_s);
        let expires = now_s.saturating_add(lifetime);
        let cred = Credential::parse(credential, &self.root).map_err(DomainError::Credential)?;
        let cred = cred
            .attenuate(&Attenuation { expires: Some(unix(expires)), ..Attenuation::default() })
            .map_err(DomainError::Credential)?;
        let p = &self.cfg.policy;
        let cred = if restricts(p) { cred.attenuate(p).map_err(DomainError::Credential)? } else { cred };
        let session_key = Zeroizing::new(random::<32>()?);
        let id = u64::from_be_bytes(random()?);
        let nonce: [u8; 12] = random()?;
        let body = TicketBody {
            user: *user.as_bytes(),
            not_before: now_s,
            expires,
            session_key: *session_key,
            credential: cred.to_bytes(),
        };
        let mut sealed = Zeroizing::new(Vec::with_capacity(body.buffer_len() + TAG_LEN));
        body.emit(&mut sealed);
        let mut ticket = vec![0u8; TICKET_HEADER];
        TicketRepr::emit_header(self.key.id(), self.cfg.epoch, id, nonce, sealed.len() + TAG_LEN, &mut ticket);
        let key = self.key.ticket_key(self.cfg.epoch)?;
        key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&ticket[..]), &mut *sealed)
            .map_err(|_| DomainError::Random)?;
        ticket.extend_from_slice(&sealed);
        Ok(Issued { ticket, id, session_key, expires })
    }

    /// Answers a ticket request that arrived over the SA of `user`: the
    /// reply (a ticket, or a refusal) to send back over the same SA.
    pub fn handle_request(&mut self, user: PublicKey, msg: &[u8], now_ms: u64, now_s: u64) -> Vec<u8> {
        let refusal = |e: &DomainError| {
            KdcMessage::Refusal(match e {
                DomainError::RateLimited => RefusalCode::RateLimited,
                DomainError::Malformed(_) | DomainError::Lifetime => RefusalCode::Malformed,
                _ => RefusalCode::CredentialRefused,
            })
            .to_vec()
        };
        match KdcMessage::parse(msg) {
            Ok(KdcMessage::Request { lifetime_s, credential }) => {
                match self.issue(user, credential, u64::from(lifetime_s), now_ms, now_s) {
                    Ok(i) => KdcMessage::Reply { expires: i.expires, session_key: *i.session_key, ticket: &i.ticket }
                        .to_vec(),
                    Err(e) => refusal(&e),
                }
            }
            Ok(_) => KdcMessage::Refusal(RefusalCode::Malformed).to_vec(),
            Err(e) => refusal(&DomainError::Malformed(e)),
        }
    }
}

fn packet_nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn session(key: &[u8; 32]) -> Option<LessSafeKey> {
    UnboundKey::new(&AES_256_GCM, key).ok().map(LessSafeKey::new)
}

/// The user's side: a ticket and its session key.
pub struct TicketHolder {
    ticket: Vec<u8>,
    id: u64,
    expires: u64,
    key: LessSafeKey,
    counter: u64,
    introduced: BTreeSet<u32>,
}

impl core::fmt::Debug for TicketHolder {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "TicketHolder({:#x}, expires {})", self.id, self.expires)
    }
}

impl TicketHolder {
    /// From the service's reply.
    ///
    /// # Errors
    /// [`DomainError::Malformed`] for a message that is not a reply;
    /// [`DomainError::RateLimited`] or [`DomainError::Credential`] for a refusal.
    pub fn from_reply(msg: &[u8]) -> Result<TicketHolder, DomainError> {
        match KdcMessage::parse(msg)? {
            KdcMessage::Reply { expires, session_key, ticket } => {
                let id = TicketRepr::parse(ticket)?.id;
                let key = session(&session_key).ok_or(DomainError::Random)?;
                Ok(TicketHolder { ticket: ticket.to_vec(), id, expires, key, counter: 0, introduced: BTreeSet::new() })
            }
            KdcMessage::Refusal(RefusalCode::RateLimited) => Err(DomainError::RateLimited),
            KdcMessage::Refusal(_) => Err(DomainError::Credential(CredError::NoCredential)),
            KdcMessage::Request { .. } => Err(DomainError::Malformed(WireError::Kind(1))),
        }
    }

    /// From an [`Issued`] ticket (tests, and a service issuing to itself).
    pub fn from_issued(i: &Issued) -> Option<TicketHolder> {
        Some(TicketHolder {
            ticket: i.ticket.clone(),
            id: i.id,
            expires: i.expires,
            key: session(&i.session_key)?,
            counter: 0,
            introduced: BTreeSet::new(),
        })
    }

    /// Continues sealing after packet counter `counter` (the next packet
    /// gets `counter + 1`). A user process that starts again with the same
    /// ticket must not reuse counters, or the nodes refuse its packets as
    /// replays: `anode domain send` starts at the Unix time in microseconds.
    pub fn set_counter(&mut self, counter: u64) {
        self.counter = counter;
    }

    /// The ticket's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The ticket's bytes.
    pub fn ticket(&self) -> &[u8] {
        &self.ticket
    }

    /// Expiry, Unix seconds.
    pub fn expires(&self) -> u64 {
        self.expires
    }

    /// Seals `payload` for the node at overlay address `dest`. The first
    /// packet to each node carries the ticket.
    pub fn seal(&mut self, dest: u32, payload: &[u8]) -> Vec<u8> {
        let with = self.introduced.insert(dest);
        self.seal_with(dest, payload, with)
    }

    /// Seals, including the ticket or not as asked.
    pub fn seal_with(&mut self, dest: u32, payload: &[u8], include_ticket: bool) -> Vec<u8> {
        self.counter += 1;
        let ticket = include_ticket.then_some(&self.ticket[..]);
        let mut out = Vec::with_capacity(24 + ticket.map_or(0, <[u8]>::len) + payload.len() + TAG_LEN);
        TicketPacketRepr::emit_aad(dest, self.counter, self.id, ticket, &mut out);
        let aad_len = out.len();
        out.extend_from_slice(payload);
        let (aad, body) = out.split_at_mut(aad_len);
        let tag = self.key.seal_in_place_separate_tag(packet_nonce(self.counter), Aad::from(&*aad), body);
        if let Ok(t) = tag {
            out.extend_from_slice(t.as_ref());
        }
        out
    }
}

/// How a packet was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// By its ticket, at this node.
    Ticket(u64),
    /// By a border node's attachment.
    Perimeter(Fingerprint),
}

/// A packet a domain node accepted: who sent it, what it may do, its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The user.
    pub user: PublicKey,
    /// What the packet may do (an attenuated credential, Biscuit bytes).
    pub credential: Vec<u8>,
    /// Its expiry (Unix seconds).
    pub expires: u64,
    /// The payload.
    pub payload: Vec<u8>,
    /// How it was admitted.
    pub via: Via,
}

struct OpenTicket {
    user: PublicKey,
    epoch: u32,
    expires: u64,
    not_before: u64,
    key: LessSafeKey,
    credential: Vec<u8>,
    window: ReplayWindow,
}

/// Domain node counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainCounters {
    /// Packets accepted by ticket.
    pub by_ticket: u64,
    /// Packets accepted by attachment.
    pub by_attachment: u64,
    /// Attachments made (as a border).
    pub attached: u64,
    /// Requests allowed by the attached credential.
    pub allowed: u64,
    /// Refusals by label.
    pub refused: HashMap<&'static str, u64>,
}

/// A node of a domain: verifies tickets at the perimeter or at itself,
/// attaches and checks perimeter attachments, enforces credentials.
pub struct DomainNode {
    key: DomainKey,
    epoch: u32,
    me: Fingerprint,
    address: u32,
    revocation: Revocation,
    tickets: HashMap<u64, OpenTicket>,
    borders: HashMap<[u8; 16], ReplayWindow>,
    seq: u64,
    verifier: anode_cred::Verifier,
    counters: DomainCounters,
}

impl core::fmt::Debug for DomainNode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DomainNode({:?}, node {}, {} tickets)", self.key, self.me, self.tickets.len())
    }
}

impl DomainNode {
    /// Node `me` (its identity key) at overlay address `address` in `key`'s
    /// domain, current epoch `epoch`.
    pub fn new(key: DomainKey, epoch: u32, me: PublicKey, address: u32) -> Result<DomainNode, DomainError> {
        let root = anode_cred::root_key_from_ed25519(key.operator.as_bytes()).map_err(DomainError::Credential)?;
        let verifier = anode_cred::Verifier::new(root, anode_cred::VerifierConfig::default());
        Ok(DomainNode {
            key,
            epoch,
            me: me.fingerprint(),
            address,
            revocation: Revocation::default(),
            tickets: HashMap::new(),
            borders: HashMap::new(),
            seq: 0,
            verifier,
            counters: DomainCounters::default(),
        })
    }

    /// Counters.
    pub fn counters(&self) -> &DomainCounters {
        &self.counters
    }

    /// Replaces the revocation lists (bounded by [`MAX_REVOKED`] each). Open
    /// tickets that are now revoked (by id, by user, or sealed under an
    /// epoch below the floor) are forgotten at once; a floor above the
    /// current epoch moves the node to it.
    pub fn set_revocation(&mut self, mut r: Revocation) {
        while r.tickets.len() > MAX_REVOKED {
            r.tickets.pop_first();
        }
        while r.users.len() > MAX_REVOKED {
            r.users.pop_first();
        }
        self.tickets
            .retain(|id, t| !r.tickets.contains(id) && !r.users.contains(t.user.as_bytes()) && t.epoch >= r.min_epoch);
        self.epoch = self.epoch.max(r.min_epoch);
        self.revocation = r;
    }

    /// What this node revokes now.
    pub fn revocation(&self) -> &Revocation {
        &self.revocation
    }

    /// Counts the outcome of an authorization the node made itself with an
    /// accepted packet's credential (a module load checked by the sandbox
    /// against the module's real imports): `Ok` as allowed, an error as a
    /// refusal by its label.
    pub fn record_authorization(&mut self, r: Result<(), DomainError>) {
        if r.is_ok() {
            self.counters.allowed += 1;
        }
        let _ = self.count(r);
    }

    /// The domain operator's key (the only principal whose revocation
    /// updates a node applies).
    pub fn operator(&self) -> PublicKey {
        self.key.operator()
    }

    /// Moves to a new key epoch (after the operator rotated keys).
    pub fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    fn count<T>(&mut self, r: Result<T, DomainError>) -> Result<T, DomainError> {
        if let Err(e) = &r {
            *self.counters.refused.entry(e.label()).or_default() += 1;
        }
        r
    }

    fn epoch_ok(&self, epoch: u32) -> Result<(), DomainError> {
        if epoch < self.revocation.min_epoch || epoch > self.epoch {
            return Err(DomainError::Epoch(epoch));
        }
        Ok(())
    }

    fn open_ticket(&mut self, bytes: &[u8], now_s: u64) -> Result<u64, DomainError> {
        let t = TicketRepr::parse(bytes)?;
        if t.domain != self.key.id() {
            return Err(DomainError::WrongDomain);
        }
        self.epoch_ok(t.epoch)?;
        if self.revocation.tickets.contains(&t.id) {
            return Err(DomainError::Revoked);
        }
        if self.tickets.contains_key(&t.id) {
            return Ok(t.id);
        }
        let mut sealed = Zeroizing::new(t.sealed.to_vec());
        let key = self.key.ticket_key(t.epoch)?;
        let body = key
            .open_in_place(Nonce::assume_unique_for_key(t.nonce), Aad::from(&bytes[..TICKET_HEADER]), &mut sealed)
            .map_err(|_| DomainError::ForgedTicket)?;
        let body = TicketBody::parse(body)?;
        let user = PublicKey::from_bytes(&body.user).ok_or(DomainError::ForgedTicket)?;
        if self.revocation.users.contains(&body.user) {
            return Err(DomainError::Revoked);
        }
        if now_s >= body.expires || now_s + 120 < body.not_before {
            return Err(DomainError::Expired);
        }
        let k = session(&body.session_key).ok_or(DomainError::ForgedTicket)?;
        if self.tickets.len() >= MAX_OPEN_TICKETS {
            self.tickets.retain(|_, t| now_s < t.expires);
            if self.tickets.len() >= MAX_OPEN_TICKETS
                && let Some(id) = self.tickets.iter().min_by_key(|(_, t)| t.expires).map(|(id, _)| *id)
            {
                self.tickets.remove(&id);
            }
        }
        self.tickets.insert(
            t.id,
            OpenTicket {
                user,
                epoch: t.epoch,
                expires: body.expires,
                not_before: body.not_before,
                key: k,
                credential: body.credential.to_vec(),
                window: ReplayWindow::new(),
            },
        );
        Ok(t.id)
    }

    /// Verifies a ticket-authenticated packet; `any_dest`: a border admits
    /// packets for any node of its domain.
    fn verify_packet(&mut self, packet: &[u8], any_dest: bool, now_s: u64) -> Result<Accepted, DomainError> {
        let p = TicketPacketRepr::parse(packet)?;
        if !any_dest && p.destination != self.address {
            return Err(DomainError::NotForMe);
        }
        let id = match p.ticket {
            Some(t) => {
                let id = self.open_ticket(t, now_s)?;
                if id != p.ticket_id {
                    return Err(DomainError::BadPacket);
                }
                id
            }
            None => p.ticket_id,
        };
        if self.revocation.tickets.contains(&id) {
            return Err(DomainError::Revoked);
        }
        let t = self.tickets.get_mut(&id).ok_or(DomainError::UnknownTicket(id))?;
        if now_s >= t.expires || now_s + 120 < t.not_before {
            return Err(DomainError::Expired);
        }
        // Check first, commit second: a forged packet cannot move the window.
        t.window.check(p.counter).map_err(DomainError::Replay)?;
        let aad_len = packet.len() - p.sealed.len();
        let mut body = p.sealed.to_vec();
        let n = t
            .key
            .open_in_place(packet_nonce(p.counter), Aad::from(&packet[..aad_len]), &mut body)
            .map_err(|_| DomainError::BadPacket)?
            .len();
        t.window.commit(p.counter);
        body.truncate(n);
        Ok(Accepted {
            user: t.user,
            credential: t.credential.clone(),
            expires: t.expires,
            payload: body,
            via: Via::Ticket(id),
        })
    }

    /// Opens a ticket-authenticated packet addressed to this node.
    ///
    /// # Errors
    /// A [`DomainError`]: malformed, another domain, forged or expired
    /// ticket, revoked, unknown ticket, replay, wrong tag, not for this node.
    pub fn open_packet(&mut self, packet: &[u8], now_s: u64) -> Result<Accepted, DomainError> {
        let r = self.verify_packet(packet, false, now_s);
        if r.is_ok() {
            self.counters.by_ticket += 1;
        }
        self.count(r)
    }

    /// The border's side of perimeter verification: verifies a packet
    /// entering the domain (authenticated by the user's ticket) and returns
    /// it with the attachment interior nodes require, carrying the ticket's
    /// credential further attenuated by `policy`.
    ///
    /// # Errors
    /// As [`DomainNode::open_packet`] (any destination is admitted), or
    /// [`DomainError::Credential`] if the attenuation fails.
    pub fn admit(
        &mut self,
        packet: &[u8],
        policy: &Attenuation,
        now_s: u64,
    ) -> Result<(Accepted, Vec<u8>), DomainError> {
        let r = self.verify_packet(packet, true, now_s).and_then(|a| {
            let cred = if !restricts(policy) {
                a.credential.clone()
            } else {
                let root =
                    anode_cred::root_key_from_ed25519(self.key.operator.as_bytes()).map_err(DomainError::Credential)?;
                let c = Credential::parse(&a.credential, &root).map_err(DomainError::Credential)?;
                c.attenuate(policy).map_err(DomainError::Credential)?.to_bytes().to_vec()
            };
            let att = self.attach(&a.user, &cred, a.expires, &a.payload)?;
            Ok((Accepted { credential: cred, ..a }, att))
        });
        self.count(r)
    }

    /// Makes a perimeter attachment for `payload` from `user` (verified by
    /// this border by any means: a ticket, or the user's own SA with it).
    ///
    /// # Errors
    /// [`DomainError::Credential`] for a credential over the size limit.
    pub fn attach(
        &mut self,
        user: &PublicKey,
        credential: &[u8],
        expires: u64,
        payload: &[u8],
    ) -> Result<Vec<u8>, DomainError> {
        if credential.len() > MAX_CREDENTIAL {
            return Err(DomainError::Credential(CredError::TooLarge(credential.len())));
        }
        self.seq += 1;
        let a = AttachmentRepr {
            domain: self.key.id(),
            epoch: self.epoch,
            border: self.me.0,
            seq: self.seq,
            user: *user.as_bytes(),
            expires,
            credential,
            tag: &[],
        };
        let mut out = Vec::with_capacity(crate::ticket::ATTACH_HEADER + credential.len() + ATTACH_TAG);
        a.emit_unsigned(&mut out);
        let mut ctx = hmac::Context::with_key(&self.key.perimeter_key(self.epoch)?);
        ctx.update(&out);
        ctx.update(&Sha256::digest(payload));
        out.extend_from_slice(ctx.sign().as_ref());
        self.counters.attached += 1;
        Ok(out)
    }

    /// The interior's side: accepts `payload` only with a valid attachment
    /// of this domain bound to it (`None`: the packet came without one, so
    /// it bypassed the perimeter).
    ///
    /// # Errors
    /// [`DomainError::NoAttachment`], [`DomainError::BadAttachment`],
    /// [`DomainError::WrongDomain`], [`DomainError::Epoch`],
    /// [`DomainError::Expired`], [`DomainError::Revoked`],
    /// [`DomainError::Replay`], [`DomainError::Malformed`].
    pub fn accept_attached(
        &mut self,
        attachment: Option<&[u8]>,
        payload: &[u8],
        now_s: u64,
    ) -> Result<Accepted, DomainError> {
        let r = self.accept_attached_inner(attachment, payload, now_s);
        if r.is_ok() {
            self.counters.by_attachment += 1;
        }
        self.count(r)
    }

    fn accept_attached_inner(
        &mut self,
        attachment: Option<&[u8]>,
        payload: &[u8],
        now_s: u64,
    ) -> Result<Accepted, DomainError> {
        let bytes = attachment.ok_or(DomainError::NoAttachment)?;
        let a = AttachmentRepr::parse(bytes)?;
        if a.domain != self.key.id() {
            return Err(DomainError::WrongDomain);
        }
        self.epoch_ok(a.epoch)?;
        let window = self.borders.get(&a.border).cloned().unwrap_or_default();
        window.check(a.seq).map_err(DomainError::Replay)?;
        let mut signed = bytes[..bytes.len() - ATTACH_TAG].to_vec();
        signed.extend_from_slice(&Sha256::digest(payload));
        hmac::verify(&self.key.perimeter_key(a.epoch)?, &signed, a.tag).map_err(|_| DomainError::BadAttachment)?;
        if now_s >= a.expires {
            return Err(DomainError::Expired);
        }
        if self.revocation.users.contains(&a.user) {
            return Err(DomainError::Revoked);
        }
        let user = PublicKey::from_bytes(&a.user).ok_or(DomainError::BadAttachment)?;
        if self.borders.len() >= MAX_BORDERS && !self.borders.contains_key(&a.border) {
            self.borders.clear();
        }
        self.borders.entry(a.border).or_default().commit(a.seq);
        Ok(Accepted {
            user,
            credential: a.credential.to_vec(),
            expires: a.expires,
            payload: payload.to_vec(),
            via: Via::Perimeter(Fingerprint(a.border)),
        })
    }

    /// Interior enforcement: may the accepted packet load (or run) `code`
    /// with these interfaces and limits? Decided by the attached credential
    /// for the packet's user, as `anode_cred` decides module loads.
    ///
    /// # Errors
    /// [`DomainError::Credential`] naming what the credential does not allow.
    pub fn authorize(
        &mut self,
        accepted: &Accepted,
        code: &CodeInfo,
        interfaces: InterfaceSet,
        limits: RequestedLimits,
        now_s: u64,
    ) -> Result<Grant, DomainError> {
        let req = anode_cred::LoadRequest {
            credential: Some(&accepted.credential),
            requester: Some(PrincipalId(*accepted.user.as_bytes())),
            code,
            local_name: None,
            interfaces,
            limits,
        };
        let r = self.verifier.authorize(unix(now_s), &req).map_err(DomainError::Credential);
        if r.is_ok() {
            self.counters.allowed += 1;
        }
        self.count(r)
    }
}

/// Whether an attenuation restricts anything.
fn restricts(p: &Attenuation) -> bool {
    p.expires.is_some()
        || p.max_memory.is_some()
        || p.max_cpu.is_some()
        || p.max_state.is_some()
        || p.interfaces.is_some()
        || p.hashes.is_some()
}
