//! The domain's key distribution service (SANE §4.7): a `CONTROL` body of
//! type [`KDC_OP`] carries one ticket request (`anode_sec::ticket`); the
//! requester is the principal of the SA it came in (never a name in the
//! request); the answer, a ticket or a refusal, goes back over the same SA
//! as `0x22 ‖ reply`. Rate limits, credential checks and lifetimes are the
//! service's own (`anode_sec::Kdc`).

use super::{Node, Outbox};
use anode_sec::Kdc;
use core::net::SocketAddr;

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
}

impl Node {
    /// Serves the domain's key distribution service; `unix_ms_at_zero` is
    /// the wall-clock time at `now_ms` = 0 (tickets carry Unix times).
    pub fn enable_kdc(&mut self, kdc: Kdc, unix_ms_at_zero: u64) {
        self.kdc.kdc = Some((Box::new(kdc), unix_ms_at_zero));
    }

    /// The `domain` section of `status` (None without a service and
    /// without requests).
    pub fn kdc_json(&self) -> Option<serde_json::Value> {
        let k = &self.kdc;
        let c = k.kdc.as_ref().map(|(kdc, _)| kdc.counters().clone());
        let node = self.domain_node_json();
        (c.is_some() || node.is_some() || k.off > 0 || k.unauthenticated > 0).then(|| {
            let c = c.unwrap_or_default();
            serde_json::json!({"kdc": k.kdc.is_some(), "issued": c.issued, "refused": c.refused,
                               "unauthenticated": k.unauthenticated, "no_service": k.off, "node": node})
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
}
