//! The domain's key distribution service (SANE §4.7): a `CONTROL` body of
//! type [`KDC_OP`] carries one ticket request (`anode_sec::ticket`); the
//! requester is the principal of the SA it came in (never a name in the
//! request); the answer, a ticket or a refusal, goes back over the same SA
//! as `0x22 ‖ reply`. Rate limits, credential checks and lifetimes are the
//! service's own (`anode_sec::Kdc`).
//!
//! Revocation (a `CONTROL` body of type [`Node::REVOKE_OP`]): the domain's
//! operator, over its own SA with the node, sends an
//! `anode_sec::ticket::RevokeMessage::Update`; the node applies it whole to
//! its domain node and its service at once, or refuses it (not the
//! operator, malformed, no domain, lists full) with nothing applied. Either
//! answer goes back over the same SA as `0x23 ‖ message`; each is counted
//! (`domain.revocation` in `status`) and logged (refusals at a bounded
//! rate). Revocations live in memory: a restart forgets them (see
//! docs/security.md, "Expiry and revocation").

use super::{Node, Outbox};
use anode_sec::ticket::{RevokeMessage, RevokeRefusal};
use anode_sec::{Kdc, Revocation};
use core::net::SocketAddr;
use std::collections::BTreeMap;

/// The control body type of a ticket request or reply (`0x22` ‖ message).
pub const KDC_OP: u8 = 0x22;

/// The service and its clock.
#[derive(Debug, Default)]
pub(crate) struct KdcState {
    kdc: Option<(Box<Kdc>, u64)>,
    /// Requests dropped: no authenticated principal.
    unauthenticated: u64,
    /// Requests dropped: this node runs no service.
    off: u64,
    /// What this node revokes (the same in its domain node and service).
    revocation: Revocation,
    /// Revocation updates applied.
    revokes_applied: u64,
    /// Revocation updates refused, by label.
    revokes_refused: BTreeMap<&'static str, u64>,
}

/// Refusals logged one by one before only every power of two is.
const LOGGED_REFUSALS: u64 = 16;

impl Node {
    /// The control body type of a revocation update or its answer
    /// (`0x23` ‖ `anode_sec::ticket::RevokeMessage`).
    pub const REVOKE_OP: u8 = 0x23;

    /// Serves the domain's key distribution service; `unix_ms_at_zero` is
    /// the wall-clock time at `now_ms` = 0 (tickets carry Unix times).
    /// What the node already revokes applies to it.
    pub fn enable_kdc(&mut self, mut kdc: Kdc, unix_ms_at_zero: u64) {
        if self.kdc.revocation != Revocation::default() {
            kdc.set_revocation(self.kdc.revocation.clone());
        }
        self.kdc.kdc = Some((Box::new(kdc), unix_ms_at_zero));
    }

    /// The `domain` section of `status` (None without a service and
    /// without requests).
    pub fn kdc_json(&self) -> Option<serde_json::Value> {
        let k = &self.kdc;
        let c = k.kdc.as_ref().map(|(kdc, _)| kdc.counters().clone());
        let node = self.domain_node_json();
        let asked = k.off > 0 || k.unauthenticated > 0 || k.revokes_applied > 0 || !k.revokes_refused.is_empty();
        (c.is_some() || node.is_some() || asked).then(|| {
            let c = c.unwrap_or_default();
            let r = &k.revocation;
            let revocation = serde_json::json!({"applied": k.revokes_applied, "refused": k.revokes_refused,
                                                "min_epoch": r.min_epoch, "tickets": r.tickets.len(),
                                                "users": r.users.len()});
            serde_json::json!({"kdc": k.kdc.is_some(), "issued": c.issued, "refused": c.refused,
                               "unauthenticated": k.unauthenticated, "no_service": k.off, "node": node,
                               "revocation": revocation})
        })
    }

    /// A ticket request `msg` (the body after [`KDC_OP`]) from `from`,
    /// whose SA ends at `to`.
    pub(crate) fn kdc_request(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        to: Option<SocketAddr>,
        iface: usize,
        msg: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) {
        let k = &mut self.kdc;
        let (Some(user), Some(to)) = (from, to) else {
            k.unauthenticated += 1;
            return;
        };
        let Some((kdc, unix0)) = k.kdc.as_mut() else {
            k.off += 1;
            return;
        };
        let now_s = unix0.saturating_add(now_ms) / 1000;
        let reply = kdc.handle_request(user, msg, now_ms, now_s);
        super::control::send_control(out, iface, to, &[&[KDC_OP][..], &reply[..]]);
    }
}

impl Node {
    /// A revocation update `msg` (the body after [`Node::REVOKE_OP`]) from
    /// the SA principal `from`, whose SA ends at `to`: applied whole or
    /// refused, counted, logged, answered.
    pub(crate) fn revoke_request(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        to: Option<SocketAddr>,
        iface: usize,
        msg: &[u8],
        out: &mut Outbox,
    ) {
        let reply = match self.revoke(from.as_ref(), msg) {
            Ok(ack) => {
                self.kdc.revokes_applied += 1;
                let r = &self.kdc.revocation;
                out.events.push(format!(
                    "domain: revocation applied (epoch floor {}, {} tickets, {} users revoked)",
                    r.min_epoch,
                    r.tickets.len(),
                    r.users.len()
                ));
                ack
            }
            Err(code) => {
                let n = self.kdc.revokes_refused.entry(code.label()).or_default();
                *n += 1;
                if *n <= LOGGED_REFUSALS || n.is_power_of_two() {
                    let who = from.map_or_else(|| "no principal".to_string(), |k| k.to_string());
                    out.events.push(format!(
                        "domain: revocation from {who} refused: {} ({n} so far); nothing applied",
                        code.label()
                    ));
                }
                RevokeMessage::Refusal(code)
            }
        };
        let (Some(to), Ok(bytes)) = (to, reply.to_vec()) else { return };
        super::control::send_control(out, iface, to, &[&[Node::REVOKE_OP][..], &bytes[..]]);
    }

    /// Checks a revocation update whole, then applies it to the domain node
    /// and the service at once.
    fn revoke(&mut self, from: Option<&anode_sec::PublicKey>, msg: &[u8]) -> Result<RevokeMessage, RevokeRefusal> {
        let operator = self
            .domain_operator()
            .or_else(|| self.kdc.kdc.as_ref().map(|(k, _)| k.operator()))
            .ok_or(RevokeRefusal::NoDomain)?;
        // The principal first: nobody but the operator has any part of an
        // update looked at.
        if from != Some(&operator) {
            return Err(RevokeRefusal::NotOperator);
        }
        let Ok(RevokeMessage::Update(u)) = RevokeMessage::parse(msg) else { return Err(RevokeRefusal::Malformed) };
        let r = self.kdc.revocation.merged(&u).map_err(|_| RevokeRefusal::Full)?;
        self.set_revocation(r);
        let r = &self.kdc.revocation;
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(RevokeMessage::Ack { min_epoch: r.min_epoch, tickets: len(r.tickets.len()), users: len(r.users.len()) })
    }

    /// Makes `r` what this node revokes, in its domain node and its service
    /// (open tickets it revokes are dropped at once).
    pub fn set_revocation(&mut self, r: Revocation) {
        if let Some((k, _)) = self.kdc.kdc.as_mut() {
            k.set_revocation(r.clone());
        }
        self.domain_set_revocation(r.clone());
        self.kdc.revocation = r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Owner;
    use anode_sec::ticket::{KdcMessage, RefusalCode};
    use anode_wire::anep;

    #[test]
    fn a_request_is_answered_over_its_sa_and_drops_are_counted() {
        let cfg = crate::config::NodeConfig::from_toml(
            "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n",
        )
        .expect("config");
        let mut n = Node::new(&cfg, None).expect("node");
        let user = anode_sec::Identity::from_seed(&[1; 32]).public();
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let mut out = Outbox::default();
        n.kdc_request(Some(user), Some(to), 0, b"\x01", 1, &mut out);
        n.kdc_request(None, Some(to), 0, b"\x01", 1, &mut out);
        assert!(out.transmits.is_empty());
        let j = n.kdc_json().expect("asked");
        assert_eq!(
            (j["kdc"].as_bool(), j["no_service"].as_u64(), j["unauthenticated"].as_u64()),
            (Some(false), Some(1), Some(1))
        );
        let op = anode_sec::Identity::from_seed(&[2; 32]).public();
        let kdc = anode_sec::Kdc::new(anode_sec::DomainKey::new(op, &[7; 32]), Default::default(), 0).expect("kdc");
        n.enable_kdc(kdc, 1_700_000_000_000);
        n.kdc_request(Some(user), Some(to), 0, b"garbage", 2, &mut out);
        let [t] = out.transmits.as_slice() else { panic!("one reply") };
        assert_eq!((t.to, t.owner), (to, Owner::System));
        let f = anep::Packet::new_checked(out.bytes(&t.data, &[])).expect("frame");
        let (op_byte, reply) = f.payload().split_first().expect("body");
        assert_eq!(*op_byte, KDC_OP);
        assert_eq!(KdcMessage::parse(reply), Ok(KdcMessage::Refusal(RefusalCode::Malformed)));
        assert_eq!(n.kdc_json().expect("on")["kdc"], true);
    }

    /// The revocation answer in `out`'s last transmission.
    fn answer(out: &Outbox) -> RevokeMessage {
        let t = out.transmits.last().expect("an answer");
        let f = anep::Packet::new_checked(out.bytes(&t.data, &[])).expect("frame");
        let (op, m) = f.payload().split_first().expect("body");
        assert_eq!(*op, Node::REVOKE_OP);
        RevokeMessage::parse(m).expect("a revocation message")
    }

    #[test]
    fn only_the_operator_revokes_and_a_refused_update_changes_nothing() {
        use anode_sec::ticket::RevokeUpdate;
        let cfg = crate::config::NodeConfig::from_toml(
            "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n",
        )
        .expect("config");
        let mut n = Node::new(&cfg, None).expect("node");
        let (op, user) =
            (anode_sec::Identity::from_seed(&[2; 32]).public(), anode_sec::Identity::from_seed(&[1; 32]).public());
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let up = |u: RevokeUpdate| [&[Node::REVOKE_OP][..], &RevokeMessage::Update(u).to_vec().expect("emit")].concat();
        let revoke_user = RevokeUpdate { min_epoch: 3, tickets: vec![5], users: vec![*user.as_bytes()] };
        let mut out = Outbox::default();
        // No domain, no service: nothing to revoke in.
        n.control(Some(op), Some(to), 0, &up(revoke_user.clone()), 1, &mut out);
        assert_eq!(answer(&out), RevokeMessage::Refusal(RevokeRefusal::NoDomain));
        let kdc = anode_sec::Kdc::new(anode_sec::DomainKey::new(op, &[7; 32]), Default::default(), 0).expect("kdc");
        n.enable_kdc(kdc, 1_700_000_000_000);
        // Anyone but the operator: refused, counted, logged, nothing applied.
        n.control(Some(user), Some(to), 0, &up(revoke_user.clone()), 2, &mut out);
        assert_eq!(answer(&out), RevokeMessage::Refusal(RevokeRefusal::NotOperator));
        n.control(None, None, 0, &up(revoke_user.clone()), 2, &mut out);
        assert!(out.events.iter().any(|e| e.contains("refused: not_operator")), "{:?}", out.events);
        // The operator's malformed update: refused whole.
        n.control(Some(op), Some(to), 0, &[Node::REVOKE_OP, 1, 0, 0], 3, &mut out);
        assert_eq!(answer(&out), RevokeMessage::Refusal(RevokeRefusal::Malformed));
        let j = n.kdc_json().expect("on")["revocation"].clone();
        assert_eq!(j["applied"], 0);
        assert_eq!((j["refused"]["not_operator"].as_u64(), j["refused"]["no_domain"].as_u64()), (Some(2), Some(1)));
        assert_eq!((j["min_epoch"].as_u64(), j["users"].as_u64()), (Some(0), Some(0)), "nothing applied");
        // The operator's update: applied at once, acknowledged with the state.
        n.control(Some(op), Some(to), 0, &up(revoke_user), 4, &mut out);
        assert_eq!(answer(&out), RevokeMessage::Ack { min_epoch: 3, tickets: 1, users: 1 });
        assert!(out.events.iter().any(|e| e.contains("revocation applied")), "{:?}", out.events);
        let j = n.kdc_json().expect("on")["revocation"].clone();
        assert_eq!((j["applied"].as_u64(), j["min_epoch"].as_u64()), (Some(1), Some(3)));
        // The service issues the revoked user no ticket.
        n.kdc_request(
            Some(user),
            Some(to),
            0,
            &KdcMessage::Request { lifetime_s: 60, credential: b"c" }.to_vec(),
            5,
            &mut out,
        );
        assert_eq!(n.kdc_json().expect("on")["refused"]["revoked"], 1);
    }
}
