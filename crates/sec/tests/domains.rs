//! Administrative domains in memory (several nodes of two domains in one
//! test, boringtun style): a user obtains a ticket from one node of domain A
//! and reaches the others without a handshake; border nodes admit packets
//! and interior nodes enforce what the attachment allows. Every attack ends
//! in a typed error and a counted refusal, with nothing changed.
#![allow(clippy::unwrap_used)]

use anode_cred::Interface;
use anode_cred::{
    Attenuation, CodeInfo, CredError, GrantSpec, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId,
    RequestedLimits,
};
use anode_sec::domain::{DomainError, DomainKey, DomainNode, Kdc, KdcConfig, Revocation, TicketHolder, Via};
use anode_sec::replay::ReplayError;
use anode_sec::ticket::KdcMessage;
use anode_sec::{Identity, PublicKey};

const NOW: u64 = 1_800_000_000;
const CODE: &[u8] = b"\0asm module the user may load";

fn id(n: u8) -> Identity {
    Identity::from_seed(&[n; 32])
}

fn addr(n: u8) -> u32 {
    u32::from_be_bytes([10, 0, 0, n])
}

/// Two domains: A (operator 1) with nodes a1 (its key distribution service
/// and border), a2, a3; B (operator 2) with node b1.
struct World {
    kdc_a: Kdc,
    kdc_b: Kdc,
    a1: DomainNode,
    a2: DomainNode,
    a3: DomainNode,
    b1: DomainNode,
    user: Identity,
}

fn domain(op: u8, secret: u8) -> DomainKey {
    DomainKey::new(id(op).public(), &[secret; 32])
}

fn world() -> World {
    let node = |op, s, n| DomainNode::new(domain(op, s), 1, id(n).public(), addr(n)).unwrap();
    World {
        kdc_a: Kdc::new(domain(1, 0xA), KdcConfig::default(), 0).unwrap(),
        kdc_b: Kdc::new(domain(2, 0xB), KdcConfig::default(), 0).unwrap(),
        a1: node(1, 0xA, 11),
        a2: node(1, 0xA, 12),
        a3: node(1, 0xA, 13),
        b1: node(2, 0xB, 21),
        user: id(9),
    }
}

/// The user's credential from operator `op`: load CODE with log and time.
fn credential(op: u8, user: &PublicKey) -> Vec<u8> {
    let issuer = Issuer::from_secret(&id(op).secret_seed()).unwrap();
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(CODE))],
        interfaces: InterfaceSet::of(&[Interface::Log, Interface::Time]),
        limits: Limits { memory: 1 << 20, cpu: 100_000, state: 4096 },
        expires: None,
    };
    issuer.issue(PrincipalId(*user.as_bytes()), &spec).unwrap().to_bytes().to_vec()
}

/// The user asks a1 (over its SA, whose principal is `user`) for a ticket.
fn ticket(w: &mut World, lifetime: u16) -> TicketHolder {
    let cred = credential(1, &w.user.public());
    let req = KdcMessage::Request { lifetime_s: lifetime, credential: &cred }.to_vec();
    let reply = w.kdc_a.handle_request(w.user.public(), &req, 0, NOW);
    TicketHolder::from_reply(&reply).unwrap()
}

fn code() -> CodeInfo {
    CodeInfo { hash: ModuleHash::of(CODE), signed: None }
}

fn log_only() -> InterfaceSet {
    InterfaceSet::of(&[Interface::Log])
}

#[test]
fn a_ticket_reaches_every_interior_node_without_a_handshake() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    for (node, n) in [(&mut w.a2, 12), (&mut w.a3, 13), (&mut w.a1, 11)] {
        let first = t.seal(addr(n), b"load module");
        let a = node.open_packet(&first, NOW + 1).unwrap();
        assert_eq!((a.user, &a.payload[..]), (w.user.public(), &b"load module"[..]));
        assert!(matches!(a.via, Via::Ticket(_)));
        // Later packets need not carry the ticket.
        let next = t.seal(addr(n), b"more");
        assert!(next.len() < first.len());
        assert_eq!(node.open_packet(&next, NOW + 2).unwrap().payload, b"more");
        // The node enforces the ticket's credential itself.
        node.authorize(&a, &code(), log_only(), RequestedLimits::default(), NOW + 2).unwrap();
        assert_eq!(node.counters().by_ticket, 2);
    }
    assert_eq!(w.kdc_a.counters().issued, 1);
}

#[test]
fn forged_and_altered_tickets() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    let good = t.seal(addr(12), b"x");
    // A byte of the sealed body flipped: the ticket no longer opens.
    let mut bad = good.clone();
    bad[24 + 60] ^= 1;
    assert_eq!(w.a2.open_packet(&bad, NOW), Err(DomainError::ForgedTicket));
    // The ticket's epoch or id rewritten: its header is authenticated.
    let mut bad = good.clone();
    bad[24 + 31] ^= 1;
    assert!(matches!(w.a2.open_packet(&bad, NOW), Err(DomainError::ForgedTicket | DomainError::BadPacket)));
    // A payload byte flipped: the ticket opens, the packet does not.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 17] ^= 1;
    assert_eq!(w.a2.open_packet(&bad, NOW), Err(DomainError::BadPacket));
    // The genuine packet still goes through: the forgeries moved no window.
    assert!(w.a2.open_packet(&good, NOW).is_ok());
    assert_eq!(w.a2.counters().refused.values().sum::<u64>(), 3);
}

#[test]
fn an_expired_ticket_is_refused_and_lifetimes_are_capped() {
    let mut w = world();
    let mut t = ticket(&mut w, 3600);
    assert_eq!(t.expires(), NOW + 300, "capped at max_lifetime_s");
    let p = t.seal(addr(12), b"x");
    assert_eq!(w.a2.open_packet(&p, NOW + 300), Err(DomainError::Expired));
    assert_eq!(w.a2.counters().refused["expired"], 1);
    // A held ticket expires too.
    let p = t.seal(addr(13), b"x");
    assert!(w.a3.open_packet(&p, NOW + 10).is_ok());
    let p = t.seal(addr(13), b"y");
    assert_eq!(w.a3.open_packet(&p, NOW + 301), Err(DomainError::Expired));
}

#[test]
fn a_ticket_of_another_domain_is_refused() {
    let mut w = world();
    // A ticket from domain B's service, presented in domain A.
    let cred_b = credential(2, &w.user.public());
    let ib = w.kdc_b.issue(w.user.public(), &cred_b, 60, 0, NOW).unwrap();
    let mut tb = TicketHolder::from_issued(&ib).unwrap();
    assert_eq!(w.a2.open_packet(&tb.seal(addr(12), b"x"), NOW), Err(DomainError::WrongDomain));
    // Domain B relabelling its ticket as domain A's: it does not open (B
    // cannot mint tickets for A).
    let mut relabelled = ib.ticket.clone();
    relabelled[4..20].copy_from_slice(&domain(1, 0xA).id());
    let forged = anode_sec::domain::Issued { ticket: relabelled, ..ib.clone() };
    let mut tf = TicketHolder::from_issued(&forged).unwrap();
    assert_eq!(w.a2.open_packet(&tf.seal(addr(12), b"x"), NOW), Err(DomainError::ForgedTicket));
    // And domain A's service refuses a credential of domain B's operator.
    assert!(matches!(
        w.kdc_a.issue(w.user.public(), &cred_b, 60, 0, NOW),
        Err(DomainError::Credential(CredError::WrongIssuer))
    ));
    // Domain B's nodes refuse domain A's tickets.
    let mut ta = ticket(&mut w, 60);
    assert_eq!(w.b1.open_packet(&ta.seal(addr(21), b"x"), NOW), Err(DomainError::WrongDomain));
}

#[test]
fn a_replayed_ticket_packet_is_refused() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    let p = t.seal(addr(12), b"once");
    assert!(w.a2.open_packet(&p, NOW).is_ok());
    assert_eq!(w.a2.open_packet(&p, NOW), Err(DomainError::Replay(ReplayError::Replayed)));
    // Replayed toward another node of the domain: bound to its destination.
    assert_eq!(w.a3.open_packet(&p, NOW), Err(DomainError::NotForMe));
    // A packet without the ticket at a node that never saw it.
    let q = t.seal_with(addr(13), b"no ticket", false);
    assert!(matches!(w.a3.open_packet(&q, NOW), Err(DomainError::UnknownTicket(_))));
    assert_eq!(w.a2.counters().refused["replay"], 1);
}

#[test]
fn revocation_by_ticket_user_and_epoch() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    let p = t.seal(addr(12), b"x");
    let id = anode_sec::ticket::TicketRepr::parse(t.ticket()).unwrap().id;
    w.a2.set_revocation(Revocation { tickets: [id].into(), ..Revocation::default() });
    assert_eq!(w.a2.open_packet(&p, NOW), Err(DomainError::Revoked));
    w.a3.set_revocation(Revocation { users: [*w.user.public().as_bytes()].into(), ..Revocation::default() });
    assert_eq!(w.a3.open_packet(&t.seal(addr(13), b"x"), NOW), Err(DomainError::Revoked));
    // Raising the epoch floor revokes every ticket of older epochs.
    w.a1.set_epoch(2);
    w.a1.set_revocation(Revocation { min_epoch: 2, ..Revocation::default() });
    assert_eq!(w.a1.open_packet(&t.seal(addr(11), b"x"), NOW), Err(DomainError::Epoch(1)));
}

#[test]
fn a_revocation_update_is_merged_whole_and_reaches_held_tickets_and_the_service() {
    use anode_sec::domain::MAX_REVOKED;
    use anode_sec::ticket::RevokeUpdate;
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    // a2 holds the ticket: later packets leave it out.
    w.a2.open_packet(&t.seal(addr(12), b"x"), NOW).unwrap();
    assert!(w.a2.open_packet(&t.seal_with(addr(12), b"x", false), NOW).is_ok());
    // Raising the floor drops the held ticket of epoch 1 at once and moves
    // the node to epoch 2.
    let up = RevokeUpdate { min_epoch: 2, ..RevokeUpdate::default() };
    let r = w.a2.revocation().merged(&up).unwrap();
    w.a2.set_revocation(r);
    assert!(matches!(w.a2.open_packet(&t.seal_with(addr(12), b"x", false), NOW), Err(DomainError::UnknownTicket(_))));
    assert_eq!(w.a2.open_packet(&t.seal_with(addr(12), b"x", true), NOW), Err(DomainError::Epoch(1)));
    // The service issues under the new floor; a node at the floor accepts it.
    let r = w.a2.revocation().clone();
    w.kdc_a.set_revocation(r);
    let mut t2 = ticket(&mut w, 60);
    assert_eq!(anode_sec::ticket::TicketRepr::parse(t2.ticket()).unwrap().epoch, 2);
    assert!(w.a2.open_packet(&t2.seal(addr(12), b"x"), NOW).is_ok());
    // A floor never goes down; a revoked user gets no ticket.
    let back = w.a2.revocation().merged(&RevokeUpdate { min_epoch: 1, ..RevokeUpdate::default() }).unwrap();
    assert_eq!(back.min_epoch, 2);
    let user = *w.user.public().as_bytes();
    let r = w.a2.revocation().merged(&RevokeUpdate { users: vec![user], ..RevokeUpdate::default() }).unwrap();
    w.kdc_a.set_revocation(r);
    let cred = credential(1, &w.user.public());
    assert_eq!(w.kdc_a.issue(w.user.public(), &cred, 60, 5_000, NOW).map(|_| ()), Err(DomainError::Revoked));
    // An update that would overflow a list is refused whole.
    let full = Revocation { tickets: (0..MAX_REVOKED as u64).collect(), ..Revocation::default() };
    let over = RevokeUpdate { min_epoch: 9, tickets: vec![u64::MAX], users: vec![user] };
    assert_eq!(full.merged(&over), Err(DomainError::RevocationFull));
}

#[test]
fn ticket_issuance_is_rate_limited() {
    let mut w = world();
    let cred = credential(1, &w.user.public());
    let burst = KdcConfig::default().per_user_burst;
    for _ in 0..burst {
        w.kdc_a.issue(w.user.public(), &cred, 60, 0, NOW).unwrap();
    }
    assert!(matches!(w.kdc_a.issue(w.user.public(), &cred, 60, 0, NOW), Err(DomainError::RateLimited)));
    // Refused before the credential is even parsed.
    assert!(matches!(w.kdc_a.issue(w.user.public(), b"garbage", 60, 10, NOW), Err(DomainError::RateLimited)));
    let reply = w.kdc_a.handle_request(
        w.user.public(),
        &KdcMessage::Request { lifetime_s: 60, credential: &cred }.to_vec(),
        20,
        NOW,
    );
    assert!(matches!(TicketHolder::from_reply(&reply), Err(DomainError::RateLimited)));
    // Another user has its own allowance; a second later the first has one again.
    assert!(w.kdc_a.issue(id(10).public(), &credential(1, &id(10).public()), 60, 30, NOW).is_ok());
    assert!(w.kdc_a.issue(w.user.public(), &cred, 60, 1_100, NOW).is_ok());
    assert_eq!(w.kdc_a.counters().refused["rate_limited"], 3);
}

#[test]
fn the_perimeter_attaches_and_the_interior_enforces() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    // The packet enters domain A at its border a1, on its way to a3.
    let p = t.seal(addr(13), b"load CODE");
    let policy = Attenuation { interfaces: Some(log_only()), ..Attenuation::default() };
    let (admitted, att) = w.a1.admit(&p, &policy, NOW).unwrap();
    // a2 relays it, a3 runs it: both accept it on the attachment alone.
    let at2 = w.a2.accept_attached(Some(&att), &admitted.payload, NOW).unwrap();
    let at3 = w.a3.accept_attached(Some(&att), &admitted.payload, NOW).unwrap();
    assert_eq!(at3.user, w.user.public());
    assert_eq!(at3.via, Via::Perimeter(id(11).public().fingerprint()));
    // What the attachment allows is allowed...
    w.a3.authorize(&at3, &code(), log_only(), RequestedLimits::default(), NOW).unwrap();
    // ...and the interior refuses more than it allows: an interface the border
    // took away, a module the credential does not name, more memory.
    let more = InterfaceSet::of(&[Interface::Log, Interface::Time]);
    assert!(matches!(
        w.a3.authorize(&at3, &code(), more, RequestedLimits::default(), NOW),
        Err(DomainError::Credential(CredError::CheckFailed { .. }))
    ));
    let other = CodeInfo { hash: ModuleHash::of(b"other code"), signed: None };
    assert!(matches!(
        w.a2.authorize(&at2, &other, log_only(), RequestedLimits::default(), NOW),
        Err(DomainError::Credential(CredError::NotGranted { .. }))
    ));
    let big = RequestedLimits { memory: Some(1 << 30), ..RequestedLimits::default() };
    assert!(matches!(
        w.a2.authorize(&at2, &code(), log_only(), big, NOW),
        Err(DomainError::Credential(CredError::LimitExceeded { resource: "memory", .. }))
    ));
    assert_eq!(w.a3.counters().refused["credential"], 1);
    // The attachment cannot be replayed in the interior.
    assert_eq!(
        w.a3.accept_attached(Some(&att), &admitted.payload, NOW),
        Err(DomainError::Replay(ReplayError::Replayed))
    );
}

#[test]
fn a_packet_that_bypasses_the_perimeter_is_refused() {
    let mut w = world();
    let mut t = ticket(&mut w, 60);
    let p = t.seal(addr(13), b"payload");
    let (admitted, att) = w.a1.admit(&p, &Attenuation::default(), NOW).unwrap();
    // Straight to an interior node, without an attachment.
    assert_eq!(w.a3.accept_attached(None, b"payload", NOW), Err(DomainError::NoAttachment));
    // A valid attachment moved onto another packet.
    assert_eq!(w.a3.accept_attached(Some(&att), b"another payload", NOW), Err(DomainError::BadAttachment));
    // A credential swapped inside the attachment.
    let mut swapped = att.clone();
    swapped[88] ^= 1;
    assert_eq!(w.a3.accept_attached(Some(&swapped), &admitted.payload, NOW), Err(DomainError::BadAttachment));
    // An attachment made by domain B's border (it holds no key of A).
    let b_att = w.b1.attach(&w.user.public(), &admitted.credential, NOW + 60, &admitted.payload).unwrap();
    assert_eq!(w.a3.accept_attached(Some(&b_att), &admitted.payload, NOW), Err(DomainError::WrongDomain));
    let mut relabelled = b_att.clone();
    relabelled[4..20].copy_from_slice(&domain(1, 0xA).id());
    assert_eq!(w.a3.accept_attached(Some(&relabelled), &admitted.payload, NOW), Err(DomainError::BadAttachment));
    // An expired attachment.
    assert_eq!(w.a2.accept_attached(Some(&att), &admitted.payload, NOW + 61), Err(DomainError::Expired));
    // None of the refusals moved the window: the genuine one is still accepted once.
    assert!(w.a3.accept_attached(Some(&att), &admitted.payload, NOW).is_ok());
    assert_eq!(w.a3.counters().refused.values().sum::<u64>(), 5);
}

/// The shipped two-domain testbed: every node in exactly one domain, borders
/// and services among the members, every link between domains joins two
/// borders, and each domain is connected on its own links.
#[test]
fn the_shipped_two_domain_topology_is_consistent() {
    use std::collections::{BTreeMap, BTreeSet};
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/topologies");
    let topo: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("domains.toml")).unwrap()).unwrap();
    let map: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("domains-map.toml")).unwrap()).unwrap();
    let names = |v: &toml::Value| -> BTreeSet<String> {
        v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
    };
    let nodes: BTreeSet<String> =
        topo["node"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap().to_string()).collect();
    let links: Vec<(String, String)> = topo["link"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["a"].as_str().unwrap().to_string(), l["b"].as_str().unwrap().to_string()))
        .collect();
    let mut domain_of = BTreeMap::new();
    let mut borders = BTreeSet::new();
    let domains = map["domain"].as_array().unwrap();
    assert_eq!(domains.len(), 2);
    for d in domains {
        let members = names(&d["members"]);
        for m in &members {
            assert!(nodes.contains(m), "{m} is not in the topology");
            assert!(domain_of.insert(m.clone(), d["name"].as_str().unwrap()).is_none(), "{m} in two domains");
        }
        assert!(names(&d["borders"]).is_subset(&members) && names(&d["kdc"]).is_subset(&members));
        borders.extend(names(&d["borders"]));
        // Connected on its own links.
        let mut seen = BTreeSet::from([members.iter().next().unwrap().clone()]);
        loop {
            let before = seen.len();
            for (a, b) in &links {
                if members.contains(a) && members.contains(b) && (seen.contains(a) || seen.contains(b)) {
                    seen.insert(a.clone());
                    seen.insert(b.clone());
                }
            }
            if seen.len() == before {
                break;
            }
        }
        assert_eq!(seen, members, "domain {} is not connected", d["name"]);
    }
    assert_eq!(domain_of.len(), nodes.len(), "every node in a domain");
    let crossing: Vec<&(String, String)> = links.iter().filter(|(a, b)| domain_of[a] != domain_of[b]).collect();
    assert!(!crossing.is_empty());
    for (a, b) in crossing {
        assert!(borders.contains(a) && borders.contains(b), "{a}-{b} crosses domains between non-border nodes");
    }
}

#[test]
fn a_user_that_starts_again_continues_its_counter_and_an_old_one_is_a_replay() {
    let mut w = world();
    let mut h = ticket(&mut w, 60);
    let first = h.seal(addr(12), b"one");
    assert!(w.a2.open_packet(&first, NOW).is_ok());
    // A second process with the same ticket (as `anode domain send` runs
    // again) starts past every counter used: accepted.
    h.set_counter(1_000_000);
    let later = h.seal_with(addr(12), b"two", false);
    assert_eq!(w.a2.open_packet(&later, NOW).map(|a| a.payload), Ok(b"two".to_vec()));
    // One that starts at 0 again reuses counters the node has seen.
    h.set_counter(0);
    let again = h.seal_with(addr(12), b"three", false);
    assert!(matches!(w.a2.open_packet(&again, NOW), Err(DomainError::Replay(_))));
}
