//! Administrative domains on the packet path (SANE §4.7): ticket-
//! authenticated packets, perimeter attachments, interior enforcement.
//! The logic is `anode_sec::DomainNode`'s; here, where packets come from
//! and go to.
//!
//! ```text
//! DOMAIN (0xA008) datagram, outside an SA or inside one
//!   ├─ ticket packet for this node ──► DomainNode::open_packet ──► inner
//!   ├─ ticket packet for another member, at a border ──► DomainNode::admit
//!   │      ──► attached envelope, routed toward the member (sealed hop by hop)
//!   ├─ attached envelope for this node ──► DomainNode::accept_attached ──► inner
//!   └─ attached envelope for another node, from a member over an SA ──► routed on
//! inner: an ANEP datagram, one of
//!   SNAP ──► run as any SNAP packet (Best-Effort: safe by construction)
//!   CONTROL load request ──► load_module with the attached credential, the
//!        ticket's user as requester (the sandbox checks the module, its real
//!        imports and limits against it) ──► DomainNode::record_authorization
//!   anything else ──► drop(domain_inner)
//! ```
//!
//! Every refusal is a drop reason (`domain_*`, in `anode status` and
//! `/metrics`, logged at a bounded rate by the daemon) and a refusal by
//! label in the `domain.node` counters; nothing is half-applied: a packet
//! is verified before anything it asks for is looked at.
//!
//! The perimeter: a node that is not a border refuses traffic, other than
//! control messages, from a neighbour outside the domain (`[domain]
//! members`): it would have bypassed the border (`domain_no_attachment`).

use super::LoadFailure;
use super::{Node, Outbox, Owner, Transmit};
use crate::config::NodeConfig;
use crate::counters::Drop;
use anode_cred::CredError;
use anode_sandbox::{LoadError, LoadSpec, PrincipalId};
use anode_sec::ticket::{Envelope, TicketPacketRepr};
use anode_sec::{Accepted, DomainError, DomainKey, DomainNode};
use anode_wire::anep;
use anode_wire::control::Message;
use core::net::Ipv4Addr;
use std::collections::HashSet;

/// The domain's state on this node.
#[derive(Debug)]
pub(crate) struct DomainState {
    node: DomainNode,
    border: bool,
    /// Neighbours' keys that are not members of the domain.
    outsiders: HashSet<[u8; 32]>,
    /// Wall-clock ms at `now_ms` = 0 (tickets carry Unix times).
    unix0: u64,
    /// The border's attenuation of admitted credentials
    /// (`[domain.border_policy]`).
    policy: anode_cred::Attenuation,
}

/// The drop reason of a domain refusal.
pub fn drop_of(e: &DomainError) -> Drop {
    match e {
        DomainError::Malformed(_) => Drop::DomainMalformed,
        DomainError::WrongDomain => Drop::DomainWrongDomain,
        DomainError::Epoch(_) => Drop::DomainEpoch,
        DomainError::ForgedTicket => Drop::DomainForgedTicket,
        DomainError::BadPacket => Drop::DomainBadPacket,
        DomainError::BadAttachment => Drop::DomainBadAttachment,
        DomainError::NoAttachment => Drop::DomainNoAttachment,
        DomainError::Expired => Drop::DomainExpired,
        DomainError::Replay(_) => Drop::DomainReplay,
        DomainError::Revoked => Drop::DomainRevoked,
        DomainError::UnknownTicket(_) => Drop::DomainUnknownTicket,
        DomainError::NotForMe => Drop::DomainNotForMe,
        _ => Drop::DomainCredential,
    }
}

impl Node {
    /// Makes this node a member of `key`'s domain as `[domain]` in `cfg`
    /// says (border or interior, its members); `unix_ms_at_zero` is the
    /// wall-clock time at `now_ms` = 0. Needs security on (the node's
    /// identity is its name in attachments).
    ///
    /// # Errors
    /// [`DomainError::Credential`] if the operator key is unusable, or
    /// [`DomainError::KeyDerivation`] without security. An invalid
    /// `[domain.border_policy]` or `[domain.revoked]` (both refused by
    /// `NodeConfig::validate`) is taken as absent. `[domain.revoked]` is
    /// applied to the domain node and to the service (before or after
    /// [`Node::enable_kdc`]).
    pub fn enable_domain(&mut self, cfg: &NodeConfig, key: DomainKey, unix_ms_at_zero: u64) -> Result<(), DomainError> {
        let me = self.sec.as_ref().map(|g| g.links.public()).ok_or(DomainError::KeyDerivation)?;
        let d = cfg.domain.as_ref();
        let epoch = d.map_or(1, |d| d.epoch);
        let members: HashSet<[u8; 32]> = d
            .map(|d| {
                d.members.iter().filter_map(|m| anode_sec::PublicKey::parse(m).ok()).map(|k| *k.as_bytes()).collect()
            })
            .unwrap_or_default();
        let outsiders = if members.is_empty() {
            HashSet::new()
        } else {
            cfg.interfaces
                .iter()
                .flat_map(|i| &i.neighbors)
                .filter_map(|n| n.key.as_deref().and_then(|k| anode_sec::PublicKey::parse(k).ok()))
                .map(|k| *k.as_bytes())
                .filter(|k| !members.contains(k))
                .collect()
        };
        let node = DomainNode::new(key, epoch, me, u32::from(cfg.address))?;
        let revoked = d.and_then(|d| d.revoked.as_ref()).and_then(|r| r.revocation().ok());
        self.domain = Some(Box::new(DomainState {
            node,
            border: d.is_some_and(|d| d.border),
            outsiders,
            unix0: unix_ms_at_zero,
            policy: d.and_then(|d| d.border_policy.as_ref()).and_then(|p| p.attenuation().ok()).unwrap_or_default(),
        }));
        if let Some(r) = revoked {
            self.set_revocation(r);
        }
        Ok(())
    }

    /// The domain operator's key (None without a domain).
    pub(super) fn domain_operator(&self) -> Option<anode_sec::PublicKey> {
        self.domain.as_ref().map(|d| d.node.operator())
    }

    /// Replaces what the domain node revokes (no-op without a domain).
    pub(super) fn domain_set_revocation(&mut self, r: anode_sec::Revocation) {
        if let Some(d) = self.domain.as_mut() {
            d.node.set_revocation(r);
        }
    }

    /// The domain node's counters for `status` (None without a domain).
    pub(super) fn domain_node_json(&self) -> Option<serde_json::Value> {
        let d = self.domain.as_ref()?;
        let c = d.node.counters();
        Some(serde_json::json!({"border": d.border, "by_ticket": c.by_ticket, "by_attachment": c.by_attachment,
                                "attached": c.attached, "allowed": c.allowed, "refused": c.refused}))
    }

    /// Whether a datagram from SA principal `from` must be refused because
    /// it comes from outside the domain past no border (counted).
    pub(super) fn bypasses_perimeter(&mut self, from: Option<&anode_sec::PublicKey>) -> bool {
        let Some(d) = self.domain.as_ref() else { return false };
        let outside = !d.border && from.is_some_and(|k| d.outsiders.contains(k.as_bytes()));
        if outside {
            self.counters.drop(Drop::DomainNoAttachment);
        }
        outside
    }

    /// A `DOMAIN` datagram `buf[f.payload..f.end]`; `from`: the SA principal
    /// it came in (None: it came outside any SA). Transmissions it causes
    /// are sealed by the caller.
    pub(super) fn domain_datagram(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        buf: &mut [u8],
        f: super::classify::Frame,
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let here = u32::from(self.env.here);
        let Some(d) = self.domain.as_mut() else {
            self.counters.drop(Drop::DomainOff);
            return;
        };
        let now_s = d.unix0.saturating_add(now_ms) / 1000;
        let bytes = buf.get(f.payload..f.end).unwrap_or(&[]);
        let accepted = match Envelope::parse(bytes) {
            Err(e) => Err(DomainError::Malformed(e)),
            Ok(Envelope::Ticket(p)) => {
                let dest = TicketPacketRepr::parse(p).map(|r| r.destination).unwrap_or(here);
                if dest != here && d.border {
                    match d.node.admit(p, &d.policy, now_s) {
                        Ok((a, att)) => {
                            let env =
                                Envelope::Attached { destination: dest, attachment: Some(&att), inner: &a.payload };
                            let mut v = Vec::with_capacity(env.buffer_len());
                            match env.emit(&mut v) {
                                Ok(()) => self.domain_route(dest, &v, out),
                                Err(e) => self.counters.drop(drop_of(&DomainError::Malformed(e))),
                            }
                            return;
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    d.node.open_packet(p, now_s)
                }
            }
            Ok(Envelope::Attached { destination, attachment, inner }) => {
                if destination != here {
                    // Only members pass attached packets on, over their SAs.
                    let member = from.is_some_and(|k| !d.outsiders.contains(k.as_bytes()));
                    if member {
                        let v = bytes.to_vec();
                        self.domain_route(destination, &v, out);
                    } else {
                        self.counters.drop(Drop::DomainNotForMe);
                    }
                    return;
                }
                d.node.accept_attached(attachment, inner, now_s)
            }
        };
        match accepted {
            Ok(a) => self.domain_inner(a, buf, now_ms, out),
            Err(e) => self.counters.drop(drop_of(&e)),
        }
    }

    /// Routes an envelope toward the member at `dest`.
    fn domain_route(&mut self, dest: u32, envelope: &[u8], out: &mut Outbox) {
        match self.env.route(Ipv4Addr::from(dest)) {
            Some((iface, to)) => {
                let data = out.push_frame(anep::TYPE_DOMAIN, &[envelope]);
                out.transmits.push(Transmit { iface, to, data, owner: Owner::BestEffort, unsealed: false, flow: None });
            }
            None => self.counters.drop(Drop::NoRoute),
        }
    }

    /// What an accepted packet carries: a SNAP packet (run), or a module
    /// load (authorized by the attached credential, then loaded with it).
    fn domain_inner(&mut self, a: Accepted, buf: &mut [u8], now_ms: u64, out: &mut Outbox) {
        let Ok(p) = anep::Packet::new_checked(&a.payload[..]) else {
            self.counters.drop(Drop::DomainInner);
            return;
        };
        match p.type_id() {
            anep::TYPE_SNAP if a.payload.len() <= buf.len() => {
                // The outer datagram is done with: the inner one runs in
                // place in the receive buffer, as any SNAP packet does.
                let n = a.payload.len();
                buf[..n].copy_from_slice(&a.payload);
                let Some(f) = self.frame(buf, 0, n) else { return };
                self.dispatch(None, buf, f, out);
                self.drain_loopback(now_ms, out);
            }
            anep::TYPE_CONTROL => {
                let Ok(Message::Load(req)) = Message::parse(p.payload()) else {
                    self.counters.drop(Drop::DomainInner);
                    return;
                };
                self.domain_load(&a, req.code, req.name, now_ms, out);
            }
            _ => self.counters.drop(Drop::DomainInner),
        }
    }

    /// A module load asked for by an accepted packet.
    fn domain_load(&mut self, a: &Accepted, code: &[u8], name: Option<&str>, now_ms: u64, out: &mut Outbox) {
        if self.domain.is_none() {
            return;
        }
        // Interior enforcement: the sandbox authorizes the load with the
        // attached credential, the ticket's user as requester, and the
        // interfaces the code really imports (so a border policy that took
        // an interface away refuses exactly the code that needs it). A
        // check made here without the imports could not tell: Biscuit's
        // `check all uses($i), ...` fails when no `uses` fact is given.
        let spec = LoadSpec {
            code,
            credential: Some(&a.credential),
            requester: Some(PrincipalId(*a.user.as_bytes())),
            local_name: name,
            limits: Default::default(),
        };
        let r = self.load_module(&spec, now_ms, out);
        let outcome = match &r {
            Ok(_) => Ok(()),
            // The code needs more than the attached credential grants (a
            // module it does not name, an interface, memory): the interior's
            // enforcement, counted as the domain's refusal.
            Err(LoadFailure::Refused(LoadError::Denied(e))) => Err(DomainError::Credential(e.clone())),
            Err(LoadFailure::Refused(LoadError::ForbiddenImport { import, right })) => {
                Err(DomainError::Credential(match right {
                    Some(right) => CredError::InterfaceNotGranted { import: import.clone(), right: *right },
                    None => CredError::Malformed(format!("import {import} of no host interface")),
                }))
            }
            Err(LoadFailure::Refused(LoadError::MemoryLimit { cap })) => {
                Err(DomainError::Credential(CredError::LimitExceeded {
                    resource: "memory",
                    requested: u64::try_from(*cap).unwrap_or(u64::MAX),
                    allowed: u64::try_from(*cap).unwrap_or(u64::MAX),
                }))
            }
            Err(_) => {
                self.counters.drop(Drop::CapsuleRefused);
                return;
            }
        };
        if let Some(d) = self.domain.as_mut() {
            d.node.record_authorization(outcome.clone());
        }
        match r {
            Ok((id, already)) => out.events.push(format!(
                "domain: module {} {} for {} ({:?})",
                id.0,
                if already { "already loaded" } else { "loaded" },
                a.user,
                a.via
            )),
            Err(_) => self.counters.drop(Drop::DomainCredential),
        }
    }
}
