//! Administrative domains on real daemons (issue 18, SANE §4.7): the
//! two-domain testbed (`examples/topologies/domains.toml` with
//! `domains-map.toml`), a user with one SA (to a1, domain A's border and key
//! distribution service) reaching every interior node with tickets and no
//! further handshake, and the issue's hostile cases, each ending in a typed
//! error (the `domain.node.refused` label), a counted drop reason and a log
//! line, with nothing applied.

mod common;

use anode_sec::ticket::Envelope;
use anode_sec::{DomainKey, Kdc, KdcConfig, PublicKey, TicketHolder};
use anode_wire::anep;
use common::{ANODE, Scratch, eventually, first_listen, modules_dir, status, text, user_keys};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;

fn topologies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/topologies")
}

fn anode(args: &[&str]) -> (bool, String) {
    let o = Command::new(ANODE).args(args).output().expect("run anode");
    (o.status.success(), text(&o))
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs()
}

/// The testbed: its directory and the user's key files.
struct Bed {
    tb: PathBuf,
    user_key: PathBuf,
    user_pub: PathBuf,
    dir: PathBuf,
}

impl Bed {
    fn node_dir(&self, n: &str) -> PathBuf {
        self.tb.join(n)
    }
    fn listen(&self, n: &str) -> SocketAddr {
        first_listen(&self.node_dir(n)).parse().expect("listen address")
    }
    fn path(&self, f: &str) -> String {
        self.dir.join(f).display().to_string()
    }
    fn key(&self, f: &str) -> PathBuf {
        self.tb.join("keys").join(f)
    }
    fn public(&self, f: &str) -> PublicKey {
        PublicKey::parse(&std::fs::read_to_string(self.key(f)).expect("public key")).expect("public key")
    }
    fn domain_key(&self, d: &str) -> DomainKey {
        let s = std::fs::read_to_string(self.key(&format!("domain-{d}.secret"))).expect("secret");
        DomainKey::new(self.public(&format!("operator-{d}.pub")), &DomainKey::parse_secret(&s).expect("secret"))
    }
    /// A module credential for the user, rooted in domain `d`'s operator.
    fn credential(&self, d: &str, out: &str) -> Vec<u8> {
        let (ok, o) = anode(&[
            "cred",
            "issue",
            "--admin-key",
            &self.key(&format!("operator-{d}.key")).display().to_string(),
            "--principal",
            &self.user_pub.display().to_string(),
            "--kind",
            "module",
            "--module",
            &modules_dir().join("channel.wasm").display().to_string(),
            "--interface",
            "net",
            "--interface",
            "log",
            "--interface",
            "state",
            "--interface",
            "time",
            "-o",
            &self.path(out),
        ]);
        assert!(ok, "{o}");
        std::fs::read(self.dir.join(out)).expect("credential")
    }
    /// A ticket from `kdc`'s service over an XX SA, written to `out`.
    fn ticket(&self, kdc: &str, cred: &str, out: &str) {
        let (ok, o) = anode(&[
            "domain",
            "ticket",
            "--node",
            &self.listen(kdc).to_string(),
            "--node-key",
            &self.key(&format!("{kdc}.pub")).display().to_string(),
            "--key",
            &self.user_key.display().to_string(),
            "--credential",
            &self.path(cred),
            "-o",
            &self.path(out),
        ]);
        assert!(ok && o.contains("expires at"), "{o}");
    }
    /// `anode domain send` of `what` (["--snap", F] or ["--load", F]) with
    /// `ticket` to the UDP endpoint of `via`, for overlay address `to`.
    fn send(&self, ticket: &str, via: &str, to: Ipv4Addr, what: &[&str]) {
        let (ok, o) = anode(
            &[
                &["domain", "send", "--ticket", &self.path(ticket), "--node", &self.listen(via).to_string()][..],
                &["--to", &to.to_string()],
                what,
            ]
            .concat(),
        );
        assert!(ok && o.contains("sent"), "{o}");
    }
    fn status(&self, n: &str) -> serde_json::Value {
        status(&self.node_dir(n))
    }
    fn log(&self, n: &str) -> String {
        std::fs::read_to_string(self.node_dir(n).join("node.log")).unwrap_or_default()
    }
}

fn count(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A SNAP packet for `dst` (examples/snap/udp.s: forward, deliver to port 7).
fn snap_for(bed: &Bed, dst: Ipv4Addr) -> String {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/snap/udp.s"))
        .expect("udp.s")
        .replace(".dst 10.0.0.3", &format!(".dst {dst}"));
    let (s, p) = (bed.path(&format!("to-{dst}.s")), bed.path(&format!("to-{dst}.snap")));
    std::fs::write(&s, src).expect("write");
    let (ok, o) = anode(&["snap", "asm", &s, "-o", &p]);
    assert!(ok, "{o}");
    p
}

/// `inner` as an ANEP datagram of `type_id`.
fn datagram(type_id: u16, inner: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; anep::HEADER_LEN];
    anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, type_id, inner.len());
    d.extend_from_slice(inner);
    d
}

fn domain_datagram(e: Envelope<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    e.emit(&mut v).expect("envelope");
    datagram(anep::TYPE_DOMAIN, &v)
}

fn udp_send(to: SocketAddr, bytes: &[u8]) {
    let s = UdpSocket::bind("127.0.0.1:0").expect("socket");
    s.send_to(bytes, to).expect("send");
}

/// Waits until node `n` has refused with domain error `label` (drop reason
/// `domain_<label>`) at least once: the typed error's label counted by the
/// domain node, the drop reason counted, and its (rate-limited) log line.
fn refused(bed: &Bed, n: &str, label: &str) {
    let reason = format!("domain_{label}");
    let ok = eventually(15.0, || {
        let st = bed.status(n);
        count(&st["drops"][&reason]) >= 1
            && count(&st["domain"]["node"]["refused"][label]) >= 1
            && bed.log(n).contains(&format!("reason=\"{reason}\""))
    });
    assert!(ok, "{n}: {label} refused, counted and logged:\n{}\n{}", bed.status(n), bed.log(n));
}

#[test]
fn two_domains_tickets_reach_every_interior_node_and_hostile_packets_are_refused() {
    let s = Scratch::new("domains", "tb");
    let (user_key, user_pub) = user_keys(&s.0, "u");
    let bed = Bed { tb: s.tb(), user_key, user_pub, dir: s.0.clone() };
    let topo = topologies();
    let (ok, o) = anode(&[
        "testbed",
        "up",
        &topo.join("domains.toml").display().to_string(),
        "--domains",
        &topo.join("domains-map.toml").display().to_string(),
        "--dir",
        &bed.tb.display().to_string(),
        "--user",
        &bed.user_pub.display().to_string(),
    ]);
    assert!(ok, "{o}");
    let a = |n| Ipv4Addr::new(10, 0, 0, n);
    // Every member has its domain; a1 and b1 are the borders and services.
    for (n, border) in [("a1", true), ("a2", false), ("a3", false), ("b1", true), ("b2", false)] {
        let d = &bed.status(n)["domain"];
        assert_eq!((d["node"]["border"].as_bool(), d["kdc"].as_bool()), (Some(border), Some(border)), "{n}: {d}");
    }

    // ---- The good case: one SA (to a1), then tickets only.
    bed.credential("A", "a.cred");
    bed.ticket("a1", "a.cred", "a.ticket");
    let xx = |n: &str| count(&bed.status(n)["security"]["handshakes"]["completed_xx"]);
    assert_eq!(xx("a1"), 1, "the user's one handshake");
    let to_a2 = snap_for(&bed, a(2));
    let to_a3 = snap_for(&bed, a(3));
    // Straight to an interior node (it verifies the ticket itself) ...
    bed.send("a.ticket", "a2", a(2), &["--snap", &to_a2]);
    // ... and through the border, which admits it and attaches what it may do.
    bed.send("a.ticket", "a1", a(3), &["--snap", &to_a3]);
    let channel = modules_dir().join("channel.wasm").display().to_string();
    bed.send("a.ticket", "a1", a(3), &["--load", &channel, "--name", "ch"]);
    assert!(
        eventually(15.0, || {
            let (s2, s3) = (bed.status("a2"), bed.status("a3"));
            count(&s2["domain"]["node"]["by_ticket"]) >= 1
                && count(&s2["packets"]["rx_snap"]) >= 1
                && count(&s3["domain"]["node"]["by_attachment"]) >= 2
                && count(&s3["domain"]["node"]["allowed"]) >= 1
                && count(&s3["modules"]["loads"]) >= 1
        }),
        "a2: {}\na3: {}",
        bed.status("a2")["domain"],
        bed.status("a3")
    );
    assert!(count(&bed.status("a1")["domain"]["node"]["attached"]) >= 2);
    assert!(bed.log("a3").contains("domain: module"), "{}", bed.log("a3"));
    for n in ["a2", "a3"] {
        assert_eq!(xx(n), 0, "{n}: the user reached it with no handshake");
    }
    let (ok, o) = anode(&["status", "--run-dir", &bed.node_dir("a1").display().to_string()]);
    assert!(ok && o.contains("domain: service on  tickets issued 1") && o.contains("node (border)"), "{o}");

    // ---- Hostile cases, each at an interior node.
    let a2 = bed.listen("a2");
    let inner_a2 = datagram(anep::TYPE_SNAP, &std::fs::read(&to_a2).expect("snap"));
    let cred_a = std::fs::read(bed.dir.join("a.cred")).expect("cred");
    let user = PublicKey::parse(&std::fs::read_to_string(&bed.user_pub).expect("u.pub")).expect("u.pub");
    let by_ticket = count(&bed.status("a2")["domain"]["node"]["by_ticket"]);
    // A forged ticket: sealed by someone without the domain secret.
    let mut forger =
        Kdc::new(DomainKey::new(bed.public("operator-A.pub"), &[0x55; 32]), KdcConfig::default(), 0).expect("kdc");
    let forged = forger.issue(user, &cred_a, 60, 0, now_s()).expect("issue");
    let mut h = TicketHolder::from_issued(&forged).expect("holder");
    udp_send(a2, &domain_datagram(Envelope::Ticket(&h.seal(u32::from(a(2)), &inner_a2))));
    refused(&bed, "a2", "forged_ticket");
    // An expired ticket (the domain's own key, issued long ago).
    let mut old_kdc = Kdc::new(bed.domain_key("A"), KdcConfig::default(), 0).expect("kdc");
    let old = old_kdc.issue(user, &cred_a, 60, 0, now_s() - 3600).expect("issue");
    let mut h = TicketHolder::from_issued(&old).expect("holder");
    udp_send(a2, &domain_datagram(Envelope::Ticket(&h.seal(u32::from(a(2)), &inner_a2))));
    refused(&bed, "a2", "expired");
    // A ticket from the other domain (b1's service, over the user's SA with b1).
    bed.credential("B", "b.cred");
    bed.ticket("b1", "b.cred", "b.ticket");
    bed.send("b.ticket", "a2", a(2), &["--snap", &to_a2]);
    refused(&bed, "a2", "wrong_domain");
    // A replayed packet: the same datagram twice.
    let mut kdc = Kdc::new(bed.domain_key("A"), KdcConfig::default(), 0).expect("kdc");
    let fresh = kdc.issue(user, &cred_a, 60, 0, now_s()).expect("issue");
    let mut h = TicketHolder::from_issued(&fresh).expect("holder");
    let d = domain_datagram(Envelope::Ticket(&h.seal(u32::from(a(2)), &inner_a2)));
    udp_send(a2, &d);
    assert!(eventually(10.0, || count(&bed.status("a2")["domain"]["node"]["by_ticket"]) > by_ticket));
    udp_send(a2, &d);
    refused(&bed, "a2", "replay");
    // A packet that bypasses the perimeter: it claims to come from outside
    // the domain through a border, with no attachment; and one with a
    // forged attachment.
    udp_send(
        a2,
        &domain_datagram(Envelope::Attached { destination: u32::from(a(2)), attachment: None, inner: &inner_a2 }),
    );
    refused(&bed, "a2", "no_attachment");
    // An attachment that looks right but was not made with the domain's
    // perimeter key.
    let mut fake = vec![1, 0, 0, 0];
    fake.extend_from_slice(&bed.domain_key("A").id());
    fake.extend_from_slice(&1u32.to_be_bytes());
    fake.extend_from_slice(&[9; 16]);
    fake.extend_from_slice(&1u64.to_be_bytes());
    fake.extend_from_slice(user.as_bytes());
    fake.extend_from_slice(&(now_s() + 60).to_be_bytes());
    fake.extend_from_slice(&[0xAA; 32]);
    let e = Envelope::Attached { destination: u32::from(a(2)), attachment: Some(&fake), inner: &inner_a2 };
    udp_send(a2, &domain_datagram(e));
    refused(&bed, "a2", "bad_attachment");
    // More than the attached credential allows: a module it does not name,
    // sent through the border; the interior node refuses it.
    let counter = modules_dir().join("counter.wasm").display().to_string();
    bed.send("a.ticket", "a1", a(2), &["--load", &counter]);
    refused(&bed, "a2", "credential");
    let st = bed.status("a2");
    assert_eq!(count(&st["modules"]["loads"]), 0, "nothing loaded at a2: {}", st["modules"]);
    assert_eq!(xx("a2"), 0, "a2 never ran a handshake with the user");
}

/// Nodes this test started itself; dropping it stops them.
struct Started(Vec<std::process::Child>);

impl Drop for Started {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the testbed nodes `names` from their (edited) configs, as
/// `anode testbed up` does, and waits until each answers.
fn start_nodes(bed: &Bed, names: &[&str]) -> Started {
    let mut started = Started(Vec::new());
    for n in names {
        let nd = bed.node_dir(n);
        let log = std::fs::File::create(nd.join("node.log")).expect("log");
        let child = Command::new(ANODE)
            .arg("node")
            .arg("--config")
            .arg(nd.join("node.toml"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start node");
        // `anode testbed down` (the scratch directory's drop) finds it too.
        std::fs::write(nd.join("pid"), child.id().to_string()).expect("pid");
        started.0.push(child);
    }
    for n in names {
        let ok = eventually(30.0, || {
            Command::new(ANODE)
                .args(["status", "--json", "--run-dir"])
                .arg(bed.node_dir(n))
                .output()
                .is_ok_and(|o| o.status.success())
        });
        assert!(ok, "{n} not ready:\n{}", bed.log(n));
    }
    // Members pass attached packets on only over their SAs with each other,
    // and a ticket send is one-way: wait until every link among the started
    // nodes is up (under load they come up after the first requests).
    for n in names {
        let ok = eventually(30.0, || {
            bed.status(n)["security"]["peers"].as_array().is_some_and(|ps| {
                ps.iter()
                    .filter(|p| p["kind"] == "neighbor")
                    .all(|p| p["up"] == true || !names.iter().any(|m| bed.status(m)["address"] == p["address"]))
            })
        });
        assert!(ok, "{n}: links not up: {}", bed.status(n)["security"]);
    }
    started
}

impl Bed {
    /// `anode domain revoke` at node `n` as the holder of `key`, with
    /// `what`: (exit status, output).
    fn revoke(&self, n: &str, key: &Path, what: &[&str]) -> (bool, String) {
        let (node, node_key) = (self.listen(n).to_string(), self.key(&format!("{n}.pub")).display().to_string());
        let key = key.display().to_string();
        anode(&[&["domain", "revoke", "--node", &node, "--node-key", &node_key, "--key", &key][..], what].concat())
    }
    /// The id of the ticket in file `f`.
    fn ticket_id(&self, f: &str) -> u64 {
        TicketHolder::from_reply(&std::fs::read(self.dir.join(f)).expect("ticket")).expect("ticket").id()
    }
    /// Node `n`'s count of domain refusals labelled `label`.
    fn refusals(&self, n: &str, label: &str) -> u64 {
        count(&self.status(n)["domain"]["node"]["refused"][label])
    }
    /// Sends `snap` with `ticket` straight to `n` (overlay address `to`)
    /// and waits until `n` has accepted one more packet by ticket.
    fn accepted(&self, ticket: &str, n: &str, to: Ipv4Addr, snap: &str) {
        let before = count(&self.status(n)["domain"]["node"]["by_ticket"]);
        self.send(ticket, n, to, &["--snap", snap]);
        let ok = eventually(15.0, || count(&self.status(n)["domain"]["node"]["by_ticket"]) > before);
        assert!(ok, "{n} accepts {ticket}: {}", self.status(n)["domain"]);
    }
    /// Sends `snap` with `ticket` to `n` and waits until `n` has refused it
    /// once more with `label` (typed error, drop reason, log line).
    fn refused_again(&self, ticket: &str, n: &str, to: Ipv4Addr, snap: &str, label: &str) {
        let before = self.refusals(n, label);
        self.send(ticket, n, to, &["--snap", snap]);
        let ok = eventually(15.0, || self.refusals(n, label) > before);
        assert!(ok, "{n} refuses {ticket} as {label}: {}", self.status(n)["domain"]);
        refused(self, n, label);
    }
}

#[test]
fn the_operator_revokes_at_running_nodes_and_the_border_policy_narrows_what_interior_nodes_allow() {
    let s = Scratch::new("domains", "revoke");
    let (user_key, user_pub) = user_keys(&s.0, "u");
    let bed = Bed { tb: s.tb(), user_key, user_pub, dir: s.0.clone() };
    let topo = topologies();
    // The nodes this test starts listen from a free base port, not 7000.
    let base = common::free_block(64);
    let up = |users: &[&Path]| {
        let mut args = vec![
            "testbed".to_string(),
            "up".into(),
            topo.join("domains.toml").display().to_string(),
            "--configs-only".into(),
            "--base-port".into(),
            base.to_string(),
            "--domains".into(),
            topo.join("domains-map.toml").display().to_string(),
            "--dir".into(),
            bed.tb.display().to_string(),
        ];
        for u in users {
            args.extend(["--user".to_string(), u.display().to_string()]);
        }
        let o = Command::new(ANODE).args(&args).output().expect("testbed up");
        assert!(o.status.success(), "{}", text(&o));
    };
    // The first run makes the operator keys; the second lets the operator
    // of domain A (and a stranger) hold SAs with the nodes, as users.
    up(&[&bed.user_pub]);
    let (stranger_key, stranger_pub) = user_keys(&s.0, "stranger");
    let op_a = bed.key("operator-A.key");
    up(&[&bed.user_pub, &bed.key("operator-A.pub"), &stranger_pub]);
    // a1's border policy takes `net` away from every credential it attaches.
    let a1_cfg = bed.node_dir("a1").join("node.toml");
    let mut cfg = std::fs::read_to_string(&a1_cfg).expect("a1 config");
    cfg.push_str("\n[domain.border_policy]\ninterfaces = [\"log\", \"state\", \"time\"]\n");
    std::fs::write(&a1_cfg, cfg).expect("a1 config");
    // a2 starts with one ticket id revoked in its config (what survives a
    // restart).
    let a2_cfg = bed.node_dir("a2").join("node.toml");
    let mut cfg = std::fs::read_to_string(&a2_cfg).expect("a2 config");
    cfg.push_str("\n[domain.revoked]\ntickets = [\"0x1\"]\n");
    std::fs::write(&a2_cfg, cfg).expect("a2 config");
    let _nodes = start_nodes(&bed, &["a1", "a2", "a3"]);
    let a = |n| Ipv4Addr::new(10, 0, 0, n);
    bed.credential("A", "a.cred");
    bed.ticket("a1", "a.cred", "t1.ticket");
    bed.ticket("a1", "a.cred", "t2.ticket");
    let (to_a2, to_a3) = (snap_for(&bed, a(2)), snap_for(&bed, a(3)));

    // ---- The border policy: the ticket's credential allows channel.wasm
    // (net, log, state, time). Sent straight to a3 it loads; through the
    // border a1, whose policy removed `net`, a3 refuses it.
    let channel = modules_dir().join("channel.wasm").display().to_string();
    bed.send("t1.ticket", "a3", a(3), &["--load", &channel, "--name", "direct"]);
    assert!(
        eventually(15.0, || count(&bed.status("a3")["modules"]["loads"]) >= 1),
        "a3 loads by ticket: {}",
        bed.status("a3")
    );
    bed.send("t1.ticket", "a1", a(3), &["--load", &channel, "--name", "via-border"]);
    // Refused by the sandbox against the module's real imports: typed
    // (InterfaceNotGranted, the `credential` label), counted, logged.
    refused(&bed, "a3", "credential");
    assert!(count(&bed.status("a3")["domain"]["node"]["by_attachment"]) >= 1);
    assert_eq!(count(&bed.status("a3")["modules"]["loads"]), 1, "only the direct load: {}", bed.status("a3"));
    assert!(count(&bed.status("a1")["domain"]["node"]["attached"]) >= 1);

    // ---- Revocation. Both tickets work at a2.
    bed.accepted("t1.ticket", "a2", a(2), &to_a2);
    bed.accepted("t2.ticket", "a2", a(2), &to_a2);
    let t1 = format!("{:#x}", bed.ticket_id("t1.ticket"));
    // A revocation from anyone but the operator: refused whole, counted,
    // logged; the ticket still works.
    for who in [&stranger_key, &bed.user_key] {
        let (ok, o) = bed.revoke("a2", who, &["--ticket", &t1, "--min-epoch", "9"]);
        assert!(!ok && o.contains("refused: not_operator"), "{o}");
    }
    let r = &bed.status("a2")["domain"]["revocation"];
    assert_eq!((count(&r["refused"]["not_operator"]), count(&r["applied"])), (2, 0), "{r}");
    assert_eq!((count(&r["tickets"]), count(&r["min_epoch"])), (1, 0), "only the config's: {r}");
    assert!(bed.log("a2").contains("refused: not_operator"), "{}", bed.log("a2"));
    bed.accepted("t1.ticket", "a2", a(2), &to_a2);
    // The operator revokes t1 at a2: refused at once, t2 still accepted.
    let (ok, o) = bed.revoke("a2", &op_a, &["--ticket", &t1]);
    assert!(ok && o.contains("2 tickets and 0 users revoked"), "{o}");
    bed.refused_again("t1.ticket", "a2", a(2), &to_a2, "revoked");
    bed.accepted("t2.ticket", "a2", a(2), &to_a2);
    // The operator revokes the user: its other ticket is refused too.
    let (ok, o) = bed.revoke("a2", &op_a, &["--user", &bed.user_pub.display().to_string()]);
    assert!(ok && o.contains("2 tickets and 1 users revoked"), "{o}");
    bed.refused_again("t2.ticket", "a2", a(2), &to_a2, "revoked");
    let r = &bed.status("a2")["domain"]["revocation"];
    assert_eq!((count(&r["applied"]), count(&r["tickets"]), count(&r["users"])), (2, 2, 1), "{r}");
    assert!(bed.log("a2").contains("revocation applied"), "{}", bed.log("a2"));
    // Raising the epoch floor at a3 refuses the tickets of epoch 1.
    bed.accepted("t2.ticket", "a3", a(3), &to_a3);
    let (ok, o) = bed.revoke("a3", &op_a, &["--min-epoch", "2"]);
    assert!(ok && o.contains("epoch floor 2"), "{o}");
    bed.refused_again("t2.ticket", "a3", a(3), &to_a3, "epoch");
    // a2 never saw the floor: revocations reach only the nodes sent them.
    assert_eq!(count(&bed.status("a2")["domain"]["revocation"]["min_epoch"]), 0);
}
