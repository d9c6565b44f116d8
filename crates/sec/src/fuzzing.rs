//! Entry points for the cargo-fuzz targets under `fuzz/` (and their seed
//! replay tests): the handshake parser and state machine, and the
//! authentication header parser and opener, fed arbitrary bytes.

use crate::identity::Identity;
use crate::links::{Links, LinksConfig, PeerConfig};
use crate::sa::Mode;
use core::net::SocketAddr;

/// Two fixed identities and a security layer for the first with the
/// second as its neighbour, as the fuzz targets use.
pub fn pair() -> (Links, Identity) {
    let a = Identity::from_seed(&[0xA1; 32]);
    let b = Identity::from_seed(&[0xB2; 32]);
    let cfg = LinksConfig {
        peers: vec![PeerConfig { key: b.public(), endpoint: endpoint(), mode: Mode::Authenticate }],
        users: vec![Identity::from_seed(&[0xC3; 32]).public()],
        ..LinksConfig::default()
    };
    match Links::new(a, cfg, 0) {
        Ok(l) => (l, b),
        Err(e) => unreachable!("fixed fuzzing config is valid: {e}"),
    }
}

fn endpoint() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7000))
}

/// Feeds `data` to the handshake handler, and then to the packet opener
/// (both modes). Must never panic.
pub fn handshake_and_packet(data: &[u8]) {
    let (mut l, _) = pair();
    let mut out = Vec::new();
    let _ = l.handle_handshake(endpoint(), data, 1, &mut out);
    let hdr = 8.min(data.len());
    let mut buf = data.to_vec();
    let _ = l.open(&mut buf, hdr, true, 1);
    let mut buf = data.to_vec();
    let _ = l.open(&mut buf, hdr, false, 1);
    let _ = crate::handshake::Header::parse(data);
}

/// Seeds for the `sec_handshake` target: a real IK first message from the
/// fuzzing pair's neighbour, an XX first message, the cookie reply to it and
/// the first message sent again with the cookie, and a protected datagram,
/// each of which the target's layer accepts or answers.
pub fn seeds() -> Vec<Vec<u8>> {
    let (_, b) = pair();
    let a = Identity::from_seed(&[0xA1; 32]);
    let cfg = LinksConfig {
        peers: vec![PeerConfig { key: a.public(), endpoint: endpoint(), mode: Mode::Authenticate }],
        ..LinksConfig::default()
    };
    let mut seeds = Vec::new();
    if let Ok(mut lb) = Links::new(b, cfg, 1_000) {
        let mut out = Vec::new();
        lb.poll(1_000, &mut out);
        for o in out {
            if let crate::links::Output::Handshake { msg, .. } = o {
                seeds.push(msg);
            }
        }
    }
    let mut user = match Links::new(Identity::from_seed(&[0xC3; 32]), LinksConfig::default(), 0) {
        Ok(u) => u,
        Err(_) => return seeds,
    };
    user.connect(endpoint(), None, Mode::Authenticate, 0);
    let mut out = Vec::new();
    user.poll(0, &mut out);
    let first: Vec<Vec<u8>> = out
        .into_iter()
        .filter_map(|o| match o {
            crate::links::Output::Handshake { msg, .. } => Some(msg),
            _ => None,
        })
        .collect();
    // The cookie reply the fuzzing layer gives an XX first message, and the
    // first message sent again with that cookie.
    let (mut l, _) = pair();
    for msg in &first {
        let mut back = Vec::new();
        let _ = l.handle_handshake(endpoint(), msg, 1, &mut back);
        for o in back {
            if let crate::links::Output::Handshake { msg: cookie, .. } = o {
                let mut again = Vec::new();
                let _ = user.handle_handshake(endpoint(), &cookie, 1, &mut again);
                seeds.push(cookie);
                seeds.extend(again.into_iter().filter_map(|o| match o {
                    crate::links::Output::Handshake { msg, .. } => Some(msg),
                    _ => None,
                }));
            }
        }
    }
    seeds.extend(first);
    let mut d = vec![0u8; 8 + crate::sa::OVERHEAD + 4];
    let n = d.len() as u8;
    d[..8].copy_from_slice(&[1, 0x80, 0xA0, 0x05, 0, 2, 0, n]);
    seeds.push(d);
    seeds
}

/// Bytes as every administrative-domain message: ticket, ticket body,
/// ticket-authenticated packet (opened by a domain node), perimeter
/// attachment (checked by an interior node), and ticket request or reply
/// (answered by a key distribution service), and revocation update, ack or
/// refusal (parsed and re-encoded). Must never panic.
pub fn domain_message(data: &[u8]) {
    use crate::domain::{DomainKey, DomainNode, Kdc, KdcConfig};
    use crate::ticket::{AttachmentRepr, KdcMessage, TicketBody, TicketPacketRepr, TicketRepr};
    let _ = TicketRepr::parse(data);
    let _ = TicketBody::parse(data);
    let _ = TicketPacketRepr::parse(data);
    let _ = AttachmentRepr::parse(data);
    if let Ok(e) = crate::ticket::Envelope::parse(data) {
        let mut v = Vec::new();
        assert!(e.emit(&mut v).is_ok() && v.len() == e.buffer_len(), "a parsed envelope re-encodes");
        assert_eq!(crate::ticket::Envelope::parse(&v), Ok(e), "to an equal one");
    }
    if let Ok(m) = KdcMessage::parse(data) {
        assert_eq!(KdcMessage::parse(&m.to_vec()), Ok(m), "a parsed message re-encodes to an equal one");
    }
    if let Ok(m) = crate::ticket::RevokeMessage::parse(data) {
        let v = m.to_vec();
        assert_eq!(v.as_deref().ok(), Some(data), "a parsed revocation message re-encodes to the same bytes");
    }
    let op = Identity::from_seed(&[0xD1; 32]).public();
    let user = Identity::from_seed(&[0xC3; 32]).public();
    if let Ok(mut n) = DomainNode::new(DomainKey::new(op, &[7; 32]), 1, user, 0x0a00_0002) {
        let _ = n.open_packet(data, 1_800_000_000);
        let half = data.len() / 2;
        let _ = n.accept_attached(Some(&data[..half]), &data[half..], 1_800_000_000);
    }
    if let Ok(mut k) = Kdc::new(DomainKey::new(op, &[7; 32]), KdcConfig::default(), 0) {
        let _ = k.handle_request(user, data, 0, 1_800_000_000);
    }
}

/// Seeds for `sec_domain`: a real ticket request, ticket reply, ticket
/// packet (with and without its ticket) and perimeter attachment of the
/// fuzzing domain.
pub fn domain_seeds() -> Vec<Vec<u8>> {
    use crate::domain::{DomainKey, DomainNode, Issued, TicketHolder};
    use crate::ticket::KdcMessage;
    let op = Identity::from_seed(&[0xD1; 32]);
    let user = Identity::from_seed(&[0xC3; 32]).public();
    let mut seeds = vec![KdcMessage::Request { lifetime_s: 60, credential: b"credential bytes" }.to_vec()];
    let revoke =
        crate::ticket::RevokeUpdate { min_epoch: 2, tickets: vec![0x0123_4567_89AB_CDEF], users: vec![[0xC3; 32]] };
    if let Ok(v) = crate::ticket::RevokeMessage::Update(revoke).to_vec() {
        seeds.push(v);
    }
    let Ok(issuer) = anode_cred::Issuer::from_secret(&op.secret_seed()) else { return seeds };
    let Ok(cred) = issuer.admin(anode_cred::PrincipalId(*user.as_bytes()), None) else { return seeds };
    seeds.push(KdcMessage::Request { lifetime_s: 60, credential: cred.to_bytes() }.to_vec());
    let Ok(mut kdc) = crate::domain::Kdc::new(DomainKey::new(op.public(), &[7; 32]), Default::default(), 0) else {
        return seeds;
    };
    let Ok(i): Result<Issued, _> = kdc.issue(user, cred.to_bytes(), 60, 0, 1_800_000_000) else { return seeds };
    seeds.push(KdcMessage::Reply { expires: i.expires, session_key: *i.session_key, ticket: &i.ticket }.to_vec());
    seeds.push(i.ticket.clone());
    if let Some(mut h) = TicketHolder::from_issued(&i) {
        let first = h.seal(0x0a00_0002, b"payload");
        seeds.push(first.clone());
        seeds.push(h.seal(0x0a00_0002, b"second"));
        if let Ok(mut border) = DomainNode::new(DomainKey::new(op.public(), &[7; 32]), 1, op.public(), 1)
            && let Ok((a, att)) = border.admit(&first, &Default::default(), 1_800_000_000)
        {
            let mut v = att.clone();
            v.extend_from_slice(&a.payload);
            seeds.push(v);
            let mut e = Vec::new();
            let env = crate::ticket::Envelope::Attached { destination: 2, attachment: Some(&att), inner: &a.payload };
            if env.emit(&mut e).is_ok() {
                seeds.push(e);
            }
            let mut t = Vec::new();
            if crate::ticket::Envelope::Ticket(&first).emit(&mut t).is_ok() {
                seeds.push(t);
            }
        }
    }
    seeds
}
