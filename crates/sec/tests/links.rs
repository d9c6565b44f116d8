//! Two (or three) security layers in memory, exchanging messages through a
//! test harness, in the style of boringtun's `noise` tests: handshakes,
//! data both ways, and every attack the issue lists, each ending in a
//! typed rejection.
#![allow(clippy::unwrap_used)]

use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::{HsReject, Identity, Lifetime, Links, LinksConfig, Mode, Output, PeerConfig, RateLimit, Reject};
use core::net::SocketAddr;

const HDR: usize = 8;

fn ep(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn id(n: u8) -> Identity {
    Identity::from_seed(&[n; 32])
}

struct Node {
    links: Links,
    addr: SocketAddr,
}

/// Nodes 0..n with given identities; `links` lists (i, j) neighbour pairs.
struct Net {
    nodes: Vec<Node>,
    now: u64,
    /// Handshake messages captured in flight: (from, to, msg).
    wire: Vec<(usize, SocketAddr, Vec<u8>)>,
    rejects: Vec<(usize, HsReject)>,
    keepalives: usize,
}

fn config(peers: Vec<PeerConfig>, mode_life: Lifetime) -> LinksConfig {
    LinksConfig { peers, lifetime: mode_life, unix_offset_ms: 1_800_000_000_000, ..LinksConfig::default() }
}

impl Net {
    fn new(ids: &[u8], edges: &[(usize, usize)], mode: Mode, life: Lifetime) -> Net {
        let nodes = ids
            .iter()
            .enumerate()
            .map(|(i, seed)| {
                let peers = edges
                    .iter()
                    .filter_map(|&(a, b)| {
                        if a == i {
                            Some(b)
                        } else if b == i {
                            Some(a)
                        } else {
                            None
                        }
                    })
                    .map(|j| PeerConfig { key: id(ids[j]).public(), endpoint: ep(7000 + j as u16), mode })
                    .collect();
                Node { links: Links::new(id(*seed), config(peers, life), 0).unwrap(), addr: ep(7000 + i as u16) }
            })
            .collect();
        // Start after the boot delay of the higher key, so both ends initiate
        // at once and the collision rule is exercised.
        Net { nodes, now: 1_000, wire: Vec::new(), rejects: Vec::new(), keepalives: 0 }
    }

    fn index(&self, a: SocketAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr == a)
    }

    fn outputs(&mut self, from: usize, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Handshake { to, msg, .. } => self.wire.push((from, to, msg)),
                Output::Keepalive { peer } => {
                    self.keepalives += 1;
                    let d = self.seal(from, peer, b"").unwrap();
                    let to = self.nodes[from].links.endpoint_of(peer).unwrap();
                    let j = self.index(to).unwrap();
                    let _ = self.open(j, d);
                }
                Output::Established { .. } => {}
            }
        }
    }

    fn poll_all(&mut self) {
        for i in 0..self.nodes.len() {
            let mut out = Vec::new();
            let now = self.now;
            self.nodes[i].links.poll(now, &mut out);
            self.outputs(i, out);
        }
    }

    /// Delivers captured handshake messages until none are left.
    fn deliver(&mut self) {
        let mut rounds = 0;
        while !self.wire.is_empty() && rounds < 100 {
            rounds += 1;
            for (from, to, msg) in std::mem::take(&mut self.wire) {
                self.inject(from, to, &msg);
            }
        }
    }

    fn inject(&mut self, from: usize, to: SocketAddr, msg: &[u8]) {
        let Some(j) = self.index(to) else { return };
        let mut out = Vec::new();
        let src = self.nodes[from].addr;
        let now = self.now;
        if let Err(e) = self.nodes[j].links.handle_handshake(src, msg, now, &mut out) {
            self.rejects.push((j, e));
        }
        self.outputs(j, out);
    }

    fn settle(&mut self) {
        self.poll_all();
        self.deliver();
    }

    fn seal(&mut self, i: usize, peer: usize, inner: &[u8]) -> Result<Vec<u8>, anode_sec::SealError> {
        let mut v = vec![0u8; HDR + OVERHEAD + inner.len()];
        v[..HDR].copy_from_slice(b"OUTERHDR");
        v[HDR + AH_LEN..HDR + AH_LEN + inner.len()].copy_from_slice(inner);
        let now = self.now;
        let n = self.nodes[i].links.seal(peer, &mut v, HDR, inner.len(), now)?;
        v.truncate(n);
        Ok(v)
    }

    fn open(&mut self, j: usize, mut d: Vec<u8>) -> Result<Vec<u8>, Reject> {
        let enc = self.nodes[j].links.mode(0) == Mode::Encrypt;
        let now = self.now;
        let o = self.nodes[j].links.open(&mut d, HDR, enc, now)?;
        Ok(d[o.inner].to_vec())
    }

    fn peer(&self, i: usize, j: usize) -> usize {
        self.nodes[i].links.peer_of_key(&self.nodes[j].links.public()).unwrap()
    }

    /// Seals at i for j, opens at j.
    fn send(&mut self, i: usize, j: usize, inner: &[u8]) -> Result<Vec<u8>, Reject> {
        let p = self.peer(i, j);
        let d = self.seal(i, p, inner).map_err(|_| Reject::UnknownSpi)?;
        self.open(j, d)
    }
}

/// A layer for `id(me)` with `id(other)` at 127.0.0.1:`port` as its one neighbour.
fn one_peer(me: u8, other: u8, port: u16, mode: Mode, now: u64) -> Links {
    let peers = vec![PeerConfig { key: id(other).public(), endpoint: ep(port), mode }];
    Links::new(id(me), config(peers, Lifetime::default()), now).unwrap()
}

/// A layer with no neighbours (a user, or a node that only accepts `users`).
fn lone(who: Identity, users: Vec<anode_sec::PublicKey>) -> Links {
    Links::new(who, LinksConfig { users, unix_offset_ms: 1_800_000_000_000, ..LinksConfig::default() }, 0).unwrap()
}

fn pair(mode: Mode) -> Net {
    let mut n = Net::new(&[1, 2], &[(0, 1)], mode, Lifetime::default());
    n.settle();
    n
}

#[test]
fn link_keys_at_boot_both_directions_both_modes() {
    for mode in [Mode::Authenticate, Mode::Encrypt] {
        let mut n = pair(mode);
        assert!(n.nodes[0].links.is_up(0) && n.nodes[1].links.is_up(0), "{mode:?}");
        // Both started a handshake at boot; the higher key yielded.
        let yielded = n.nodes[0].links.stats.yielded + n.nodes[1].links.stats.yielded;
        assert_eq!(yielded, 1);
        assert_eq!(n.send(0, 1, b"hello b").unwrap(), b"hello b");
        assert_eq!(n.send(1, 0, b"hello a").unwrap(), b"hello a");
        let st = n.nodes[0].links.status(n.now);
        assert!(st[0].up && st[0].pattern == Some("IK"));
    }
}

#[test]
fn tampered_truncated_replayed_and_reordered_packets() {
    let mut n = pair(Mode::Encrypt);
    let d = n.seal(0, 0, b"some inner packet").unwrap();
    for i in HDR + 4..d.len() {
        let mut t = d.clone();
        t[i] ^= 1;
        assert_eq!(n.open(1, t), Err(Reject::TagMismatch), "byte {i}");
    }
    let mut t = d.clone();
    t[0] ^= 1; // the outer header is covered too
    assert_eq!(n.open(1, t), Err(Reject::TagMismatch));
    let mut t = d.clone();
    t[HDR] ^= 1; // SPI
    assert_eq!(n.open(1, t), Err(Reject::UnknownSpi));
    assert_eq!(n.open(1, d[..HDR + OVERHEAD - 1].to_vec()), Err(Reject::Truncated));
    assert!(n.open(1, d.clone()).is_ok());
    assert_eq!(n.open(1, d.clone()), Err(Reject::Replay));
    // Reordered within the window: all accepted.
    let batch: Vec<_> = (0..3000).map(|_| n.seal(0, 0, b"r").unwrap()).collect();
    for d in batch.iter().rev() {
        assert!(n.open(1, d.clone()).is_ok());
    }
    // Beyond the window: the oldest of 5000 arrives after the newest.
    let batch: Vec<_> = (0..5000).map(|_| n.seal(0, 0, b"w").unwrap()).collect();
    assert!(n.open(1, batch[4999].clone()).is_ok());
    assert_eq!(n.open(1, batch[0].clone()), Err(Reject::BeyondWindow));
    assert!(n.open(1, batch[4999 - 4000].clone()).is_ok());
}

#[test]
fn authenticate_only_refused_where_encryption_is_required() {
    // Node 0 demands encryption; node 1 is configured for authentication only.
    let mut n = Net::new(&[1, 2], &[], Mode::Encrypt, Lifetime::default());
    n.nodes[0].links = one_peer(1, 2, 7001, Mode::Encrypt, 0);
    n.nodes[1].links = one_peer(2, 1, 7000, Mode::Authenticate, 0);
    n.settle();
    let d = n.seal(1, 0, b"clear").unwrap();
    let mut d2 = d.clone();
    let o = n.nodes[0].links.open(&mut d2, HDR, false, 0);
    assert_eq!(o, Err(Reject::ModeTooWeak));
}

#[test]
fn handshake_replay_unknown_key_and_wrong_config_key() {
    let mut n = Net::new(&[1, 2], &[(0, 1)], Mode::Authenticate, Lifetime::default());
    n.poll_all();
    let first = n.wire.clone();
    n.deliver();
    assert!(n.nodes[0].links.is_up(0));
    // Replay every first message: refused, no new SA.
    let sas = n.nodes[1].links.sa_count();
    for (from, to, msg) in first {
        n.inject(from, to, &msg);
    }
    assert!(n.rejects.iter().any(|(_, e)| *e == HsReject::Replay), "{:?}", n.rejects);
    assert_eq!(n.nodes[1].links.sa_count(), sas);

    // A stranger (key 9) that knows node 1's key: refused as unknown.
    let mut stranger = Net::new(&[9, 2], &[(0, 1)], Mode::Authenticate, Lifetime::default());
    stranger.poll_all();
    let (_, _, msg) = stranger.wire.iter().find(|(f, _, _)| *f == 0).cloned().unwrap();
    n.rejects.clear();
    n.inject(0, ep(7001), &msg);
    assert_eq!(n.rejects, vec![(1, HsReject::UnknownKey)]);

    // A node configured with a wrong key for its neighbour never comes up.
    let mut w = Net::new(&[1, 2], &[], Mode::Authenticate, Lifetime::default());
    w.nodes[0].links = one_peer(1, 3, 7001, Mode::Authenticate, 0);
    w.nodes[1].links = one_peer(2, 1, 7000, Mode::Authenticate, 0);
    for _ in 0..5 {
        w.settle();
        w.now += 20_000;
    }
    assert!(!w.nodes[0].links.is_up(0) && !w.nodes[1].links.is_up(0));
    assert!(w.rejects.iter().any(|(j, e)| *j == 1 && *e == HsReject::Decrypt), "{:?}", w.rejects);
    assert!(w.rejects.iter().any(|(j, e)| *j == 0 && *e == HsReject::UnknownKey), "{:?}", w.rejects);
}

#[test]
fn stale_timestamps_are_refused() {
    let mut n = Net::new(&[1, 2], &[(0, 1)], Mode::Authenticate, Lifetime::default());
    // Node 0's first message (from a twin layer), delivered ten minutes later.
    let mut out = Vec::new();
    let mut m = one_peer(1, 2, 7001, Mode::Authenticate, 0);
    m.poll(1_000, &mut out);
    let Output::Handshake { msg, .. } = &out[0] else { panic!("no handshake") };
    n.now = 600_000;
    n.inject(0, ep(7001), msg);
    assert_eq!(n.rejects, vec![(1, HsReject::Stale)]);
}

#[test]
fn handshake_flood_is_rate_limited_and_the_link_still_comes_up() {
    let mut n = Net::new(&[1, 2], &[(0, 1)], Mode::Authenticate, Lifetime::default());
    n.poll_all();
    let legit = n.wire.clone();
    n.wire.clear();
    // 10,000 garbage first messages from one source, in one millisecond.
    let mut junk = vec![0u8; 12 + 108];
    junk[0] = 1;
    junk[7] = 1;
    let flooder = SocketAddr::from(([127, 0, 0, 9], 9999));
    let mut limited = 0;
    let mut decrypt = 0;
    for _ in 0..10_000 {
        match n.nodes[1].links.handle_handshake(flooder, &junk, 0, &mut Vec::new()) {
            Err(HsReject::RateLimited) => limited += 1,
            Err(HsReject::Decrypt) => decrypt += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(decrypt, RateLimit::default().per_source_burst as usize, "only the burst reaches the cryptography");
    assert_eq!(limited, 10_000 - decrypt);
    for (from, to, msg) in legit {
        n.inject(from, to, &msg);
    }
    n.deliver();
    assert!(n.nodes[0].links.is_up(0) && n.nodes[1].links.is_up(0), "{:?}", n.rejects);
}

#[test]
fn forged_response_does_not_cancel_a_handshake() {
    // A response forged for the index of the real first message.
    let mut out = Vec::new();
    let mut l = one_peer(1, 2, 7001, Mode::Authenticate, 0);
    l.poll(1_000, &mut out);
    let Output::Handshake { msg, .. } = &out[0] else { panic!() };
    let spi = u32::from_be_bytes(msg[4..8].try_into().unwrap());
    let mut forged = vec![0u8; 12 + 56];
    forged[0] = 2;
    forged[4..8].copy_from_slice(&77u32.to_be_bytes());
    forged[8..12].copy_from_slice(&spi.to_be_bytes());
    assert_eq!(l.handle_handshake(ep(7001), &forged, 1, &mut Vec::new()), Err(HsReject::Decrypt));
    // The real responder's answer still completes it.
    let mut r = one_peer(2, 1, 7000, Mode::Authenticate, 0);
    let mut out2 = Vec::new();
    r.handle_handshake(ep(7000), msg, 1, &mut out2).unwrap();
    let Output::Handshake { msg: resp, .. } = &out2[0] else { panic!() };
    l.handle_handshake(ep(7001), resp, 2, &mut Vec::new()).unwrap();
    assert!(l.is_up(0));
    assert_eq!(l.handle_handshake(ep(7001), resp, 3, &mut Vec::new()), Err(HsReject::Unexpected));
}

#[test]
fn rekey_on_time_keeps_packets_in_flight() {
    let life = Lifetime { rekey_after_ms: 10_000, reject_after_ms: 15_000, grace_ms: 2_000, ..Lifetime::default() };
    let mut n = Net::new(&[1, 2], &[(0, 1)], Mode::Encrypt, life);
    n.settle();
    let old_spi = n.nodes[0].links.status(0)[0].out_spi;
    // Packets sealed on the old SA, still in flight across the rekey.
    let in_flight: Vec<_> = (0..3).map(|_| n.seal(0, 0, b"old").unwrap()).collect();
    let back: Vec<_> = (0..3).map(|_| n.seal(1, 0, b"old").unwrap()).collect();
    n.now = 11_500;
    n.settle();
    let s0 = n.nodes[0].links.status(n.now);
    assert!(s0[0].up);
    assert_ne!(s0[0].out_spi, old_spi, "rekeyed");
    let rekeys = n.nodes[0].links.stats.rekeys + n.nodes[1].links.stats.rekeys;
    assert_eq!(rekeys, 1);
    for d in in_flight {
        assert_eq!(n.open(1, d).unwrap(), b"old");
    }
    assert_eq!(n.open(0, back[0].clone()).unwrap(), b"old");
    assert_eq!(n.send(0, 1, b"new").unwrap(), b"new");
    assert_eq!(n.send(1, 0, b"new").unwrap(), b"new");
    // After the grace period the old SA is refused as expired.
    n.now += 2_500;
    n.poll_all();
    assert_eq!(n.open(0, back[1].clone()), Err(Reject::Expired));
    // And much later it is forgotten altogether.
    n.now += 120_000;
    n.settle();
    assert_eq!(n.open(0, back[2].clone()), Err(Reject::UnknownSpi));
    assert_eq!(n.send(0, 1, b"still up").unwrap(), b"still up");
}

#[test]
fn rekey_on_packet_count() {
    let life = Lifetime { rekey_after_packets: 100, reject_after_packets: 150, ..Lifetime::default() };
    let mut n = Net::new(&[1, 2], &[(0, 1)], Mode::Authenticate, life);
    n.settle();
    for i in 0..1000 {
        assert!(n.send(0, 1, b"p").is_ok(), "packet {i}");
        if i % 50 == 0 {
            n.now += 1;
            n.settle();
        }
    }
    assert!(n.nodes[0].links.stats.rekeys + n.nodes[1].links.stats.rekeys >= 6);
}

#[test]
fn restarted_peer_recovers() {
    let mut n = pair(Mode::Authenticate);
    assert!(n.send(0, 1, b"before").is_ok());
    n.now = 5_000;
    // Node 1 restarts: a fresh layer, same identity, no SAs.
    n.nodes[1].links = one_peer(2, 1, 7000, Mode::Authenticate, n.now);
    // Node 0 still sends on the old SA: refused as an unknown SPI.
    assert_eq!(n.send(0, 1, b"lost"), Err(Reject::UnknownSpi));
    n.settle();
    assert_eq!(n.send(1, 0, b"after").unwrap(), b"after");
    assert_eq!(n.send(0, 1, b"after").unwrap(), b"after");
}

#[test]
fn three_nodes_hop_by_hop() {
    let mut n = Net::new(&[1, 2, 3], &[(0, 1), (1, 2)], Mode::Encrypt, Lifetime::default());
    n.settle();
    // 0 → 1, verified, re-protected by 1 for 2.
    let inner = n.send(0, 1, b"via the middle").unwrap();
    assert_eq!(n.send(1, 2, &inner).unwrap(), b"via the middle");
    // 0 and 2 are not neighbours: 2 has no SA for 0's packets.
    let p = n.peer(0, 1);
    let d = n.seal(0, p, b"direct").unwrap();
    assert_eq!(n.open(2, d), Err(Reject::UnknownSpi));
}

#[test]
fn user_connects_with_xx() {
    let user = id(7);
    let node_id = id(2);
    let node_key = node_id.public();
    let mut node = lone(node_id, vec![user.public()]);
    let mut u = lone(user.clone(), vec![]);
    let p = u.connect(ep(7001), Some(node_key), Mode::Authenticate, 0);
    let uep = ep(9000);
    let mut out = Vec::new();
    u.poll(0, &mut out);
    let mut steps = 0;
    while let Some(Output::Handshake { msg, .. }) = out.iter().find(|o| matches!(o, Output::Handshake { .. })).cloned()
    {
        steps += 1;
        out.clear();
        let mut back = Vec::new();
        node.handle_handshake(uep, &msg, 1, &mut back).unwrap();
        for b in back {
            if let Output::Handshake { msg, .. } = b {
                u.handle_handshake(ep(7001), &msg, 2, &mut out).unwrap();
            }
        }
        if steps > 3 {
            break;
        }
    }
    assert!(u.is_up(p));
    assert_eq!(u.key_of(p), Some(node_key));
    // The user's first packet confirms the node's SA.
    let mut v = vec![0u8; HDR + OVERHEAD + 5];
    v[HDR + AH_LEN..HDR + AH_LEN + 5].copy_from_slice(b"hello");
    let len = u.seal(p, &mut v, HDR, 5, 3).unwrap();
    let o = node.open(&mut v[..len], HDR, false, 3).unwrap();
    assert_eq!(&v[o.inner], b"hello");
    assert_eq!(node.key_of(o.peer), Some(user.public()));
    assert!(node.status(3)[o.peer].up);

    // An unlisted user completes the Noise handshake but is refused.
    let mut stranger = lone(id(8), vec![]);
    stranger.connect(ep(7001), None, Mode::Authenticate, 0);
    let msg = second_message(&mut stranger, &mut node, ep(9001));
    let mut out = Vec::new();
    stranger.handle_handshake(ep(7001), &msg, 2, &mut out).unwrap();
    let Some(Output::Handshake { msg, .. }) = out.into_iter().find(|o| matches!(o, Output::Handshake { .. })) else {
        panic!()
    };
    assert_eq!(node.handle_handshake(ep(9001), &msg, 3, &mut Vec::new()), Err(HsReject::UnknownKey));

    // A user expecting a different node key refuses the node.
    let mut wary = lone(id(7), vec![]);
    wary.connect(ep(7001), Some(id(5).public()), Mode::Authenticate, 0);
    let msg = second_message(&mut wary, &mut node, ep(9002));
    assert_eq!(wary.handle_handshake(ep(7001), &msg, 2, &mut Vec::new()), Err(HsReject::UnknownKey));
}

/// Runs an XX initiator's first flight against `node` from `from`: first
/// message, cookie reply, first message again with the cookie. Returns the
/// node's second message.
fn second_message(user: &mut Links, node: &mut Links, from: SocketAddr) -> Vec<u8> {
    let mut out = Vec::new();
    user.poll(0, &mut out);
    let Some(Output::Handshake { msg: first, .. }) = out.pop() else { panic!("no first message") };
    let mut back = Vec::new();
    node.handle_handshake(from, &first, 1, &mut back).unwrap();
    let Some(Output::Handshake { msg: cookie, .. }) = back.pop() else { panic!("no cookie reply") };
    let mut out = Vec::new();
    user.handle_handshake(ep(7001), &cookie, 1, &mut out).unwrap();
    let Some(Output::Handshake { msg: again, .. }) = out.pop() else { panic!("first message not sent again") };
    let mut back = Vec::new();
    node.handle_handshake(from, &again, 1, &mut back).unwrap();
    let Some(Output::Handshake { msg, .. }) = back.pop() else { panic!("no second message") };
    msg
}

#[test]
fn xx_first_messages_get_a_small_cookie_reply_until_the_source_proves_its_address() {
    let node_id = id(2);
    let mut node = lone(node_id.clone(), vec![id(7).public()]);
    let mut u = lone(id(7), vec![]);
    let p = u.connect(ep(7001), Some(node_id.public()), Mode::Encrypt, 0);
    let mut out = Vec::new();
    u.poll(0, &mut out);
    let Some(Output::Handshake { msg: first, .. }) = out.pop() else { panic!() };
    // From any (claimed) source: a cookie reply no larger than the request,
    // with nothing that names the node.
    let mut back = Vec::new();
    node.handle_handshake(ep(9000), &first, 1, &mut back).unwrap();
    let Some(Output::Handshake { msg: cookie, to, .. }) = back.pop() else { panic!() };
    assert_eq!(to, ep(9000));
    assert!(cookie.len() < first.len(), "{} >= {}", cookie.len(), first.len());
    assert!(!cookie.windows(32).any(|w| w == node_id.public().as_bytes()));
    assert_eq!(node.stats.cookies_sent, 1);
    let mut out = Vec::new();
    u.handle_handshake(ep(7001), &cookie, 1, &mut out).unwrap();
    let Some(Output::Handshake { msg: again, .. }) = out.pop() else { panic!() };
    // A cookie is bound to its source address.
    assert_eq!(node.handle_handshake(ep(9001), &again, 1, &mut Vec::new()), Err(HsReject::BadCookie));
    // A forged or flipped cookie is refused.
    let mut bad = again.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(node.handle_handshake(ep(9000), &bad, 1, &mut Vec::new()), Err(HsReject::BadCookie));
    // A second cookie reply does not make the initiator send again.
    assert_eq!(u.handle_handshake(ep(7001), &cookie, 1, &mut Vec::new()), Err(HsReject::Unexpected));
    // The right source with its cookie gets the second message, and the
    // handshake completes.
    let mut back = Vec::new();
    node.handle_handshake(ep(9000), &again, 1, &mut back).unwrap();
    let Some(Output::Handshake { msg: second, .. }) = back.pop() else { panic!() };
    assert!(second.len() > first.len());
    let mut out = Vec::new();
    u.handle_handshake(ep(7001), &second, 2, &mut out).unwrap();
    let Some(Output::Handshake { msg: third, .. }) = out.into_iter().find(|o| matches!(o, Output::Handshake { .. }))
    else {
        panic!()
    };
    node.handle_handshake(ep(9000), &third, 3, &mut Vec::new()).unwrap();
    assert_eq!(node.stats.completed_xx, 1);
    // The node's users default to authenticate-only; a user who encrypts
    // gets encrypted answers (the modes of the two ends agree).
    let mut v = vec![0u8; HDR + OVERHEAD + 2];
    v[HDR + AH_LEN..HDR + AH_LEN + 2].copy_from_slice(b"hi");
    let len = u.seal(p, &mut v, HDR, 2, 4).unwrap();
    let o = node.open(&mut v[..len], HDR, true, 4).unwrap();
    assert_eq!(node.mode(o.peer), Mode::Encrypt);
    // Cookies expire: an old one is refused after two rotations.
    let late = 1 + 2 * anode_sec::cookie::ROTATE_MS + 1;
    assert_eq!(node.handle_handshake(ep(9000), &again, late, &mut Vec::new()), Err(HsReject::BadCookie));
}

#[test]
fn own_or_duplicate_keys_in_config_are_refused() {
    let peers = vec![PeerConfig { key: id(1).public(), endpoint: ep(1), mode: Mode::Authenticate }];
    assert!(Links::new(id(1), config(peers.clone(), Lifetime::default()), 0).is_err());
    let mut two = peers.clone();
    two.extend(peers);
    assert!(Links::new(id(2), config(two, Lifetime::default()), 0).is_err());
}
