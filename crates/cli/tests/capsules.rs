//! Switchlets with real daemons on loopback: `anode ping --capsule` over an
//! encrypted testbed, code carried and by hash; and a flood of capsules
//! whose code is an endless loop, sent at the middle node while SNAP pings
//! and another principal's capsule pings cross it, starves neither.
#![allow(clippy::unwrap_used)]

mod common;

use common::{ANODE, Scratch, first_listen, status, text, up_line3};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn modules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out")
}

fn module(name: &str) -> Vec<u8> {
    let p = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup)", p.display()))
}

fn up(s: &Scratch, security: &str) {
    up_line3(s, &["--security", security]);
}

#[test]
fn capsule_ping_code_carried_and_by_hash() {
    let s = Scratch::new("capstest", "ping");
    up(&s, "encrypt");
    let admin = s.tb().join("keys").join("admin.key");
    // By hash first, while no node has the code: each hop fetches it once.
    for extra in [&["--by-hash"][..], &[][..]] {
        let o = Command::new(ANODE)
            .args(["ping", "10.0.0.3", "--capsule", "-c", "3", "-i", "0.05", "-W", "3", "--module"])
            .arg(modules_dir().join("ping.wasm"))
            .arg("--admin-key")
            .arg(&admin)
            .args(extra)
            .arg("--run-dir")
            .arg(s.tb().join("a"))
            .output()
            .unwrap();
        assert!(text(&o).contains("3 received"), "{extra:?}: {}", text(&o));
    }
    let b = status(&s.tb().join("b"));
    assert!(b["modules"]["capsules_run"].as_u64().unwrap() >= 12, "{}", b["modules"]);
    assert!(b["modules"]["code_fetched"].as_u64().unwrap() >= 1, "by hash: b fetched the code once");
    // No credential: refused before anything is sent.
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "--capsule", "-c", "1", "--module"])
        .arg(modules_dir().join("ping.wasm"))
        .arg("--run-dir")
        .arg(s.tb().join("a"))
        .output()
        .unwrap();
    assert!(!o.status.success() && text(&o).contains("needs a credential"), "{}", text(&o));
}

/// A capsule longer than the links' MTU (issue 19): with `link_mtu = 1500`
/// the ping capsule carrying its ~1.6 KB of code goes hop by hop as
/// fragments (`anode_wire::frag`) and is reassembled at each next hop;
/// replies that fit go whole.
#[test]
fn a_capsule_longer_than_the_link_mtu_crosses_as_fragments() {
    let s = Scratch::new("capstest", "frag");
    up_line3(&s, &["--security", "encrypt", "--link-mtu", "1500"]);
    let admin = s.tb().join("keys").join("admin.key");
    assert!(module("ping").len() > 1500 - 28, "the test needs a capsule longer than the MTU");
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "--capsule", "-c", "3", "-i", "0.05", "-W", "3", "--module"])
        .arg(modules_dir().join("ping.wasm"))
        .arg("--admin-key")
        .arg(&admin)
        .arg("--run-dir")
        .arg(s.tb().join("a"))
        .output()
        .unwrap();
    assert!(text(&o).contains("3 received"), "{}", text(&o));
    let (a, b) = (status(&s.tb().join("a")), status(&s.tb().join("b")));
    let (fa, fb) = (&a["fragments"], &b["fragments"]);
    assert_eq!(fa["link_mtu_payload"], 1472, "{fa}");
    assert!(fa["tx_datagrams"].as_u64().unwrap() >= 3, "a sent each capsule as fragments: {fa}");
    assert!(fa["tx_fragments"].as_u64().unwrap() >= 6, "{fa}");
    assert!(fb["rx_reassembled"].as_u64().unwrap() >= 3, "b put them back together: {fb}");
    assert!(fb["tx_datagrams"].as_u64().unwrap() >= 3, "and sent them on as fragments: {fb}");
    assert_eq!(fb["rx_held_bytes"], 0, "nothing is left half-reassembled: {fb}");
    for d in ["malformed", "duplicate", "overlap", "out_of_order", "no_room", "oversized"] {
        assert_eq!(fb["drops"][d], 0, "{d}: {fb}");
    }
    // A fragment set that is never completed is dropped and counted.
    let b_listen = first_listen(&s.tb().join("b"));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut piece = Vec::new();
    anode_wire::frag::fragment(&[7u8; 3000], 1472, 99, &mut Vec::new(), |f| piece.push(f.to_vec())).unwrap();
    sock.send_to(&piece[0], &b_listen).unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    // The next datagram from anyone lets b expire it.
    sock.send_to(&piece[0], &b_listen).unwrap();
    assert!(
        common::eventually(3.0, || status(&s.tb().join("b"))["fragments"]["drops"]["incomplete"].as_u64() >= Some(1)),
        "{}",
        status(&s.tb().join("b"))["fragments"]
    );
}

#[test]
fn looping_capsules_starve_neither_snap_forwarding_nor_other_capsules() {
    use anode_cred::{GrantSpec, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
    let s = Scratch::new("capstest", "spin");
    up(&s, "off");
    let admin = anode_sec::Identity::load(&s.tb().join("keys").join("admin.key")).unwrap();
    let spin = module("spin");
    let issuer = Issuer::from_secret(&admin.secret_seed()).unwrap();
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(&spin))],
        interfaces: InterfaceSet::of(&[]),
        limits: Limits { memory: 4 << 20, cpu: 200_000, state: 0 },
        expires: None,
    };
    let cred = issuer.issue(PrincipalId([3; 32]), &spec).unwrap();
    let mut caps = Vec::new();
    anode_sandbox::capsule::Capsule {
        entry: "run",
        credential: cred.to_bytes(),
        data: b"",
        code: Some(&spin),
        hash: ModuleHash::of(&spin),
    }
    .encode(&mut caps)
    .unwrap();
    let dgram = [&[1u8, 0x80, 0xA0, 0x03, 0, 2][..], &((8 + caps.len()) as u16).to_be_bytes(), &caps].concat();
    let listen = first_listen(&s.tb().join("b"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..5 {
                    let _ = sock.send_to(&dgram, &listen);
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            sent
        })
    };
    // Beside the flood: everyone's SNAP pings, and another principal's
    // capsules (capsule pings from a to c, run at every hop, b included).
    let honest = {
        let (admin, a) = (s.tb().join("keys").join("admin.key"), s.tb().join("a"));
        std::thread::spawn(move || {
            Command::new(ANODE)
                .args(["ping", "10.0.0.3", "--capsule", "-c", "20", "-i", "0.05", "-W", "2", "--module"])
                .arg(modules_dir().join("ping.wasm"))
                .arg("--admin-key")
                .arg(admin)
                .arg("--run-dir")
                .arg(a)
                .output()
                .unwrap()
        })
    };
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "-c", "20", "-i", "0.05", "-W", "2", "--run-dir"])
        .arg(s.tb().join("a"))
        .output()
        .unwrap();
    let honest = honest.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().unwrap();
    assert!(text(&o).contains("20 received"), "{}", text(&o));
    assert!(text(&honest).contains("20 received"), "the other principal's capsules: {}", text(&honest));
    let b = status(&s.tb().join("b"));
    // Each capsule is verified on arrival, then its entry runs as an event
    // in Best-Effort's VP (the principal has no session), where the CPU
    // bound ends it.
    let cpu = b["modules"]["invoke_failed"]["cpu_exhausted"].as_u64().unwrap_or(0);
    assert!(sent > 100 && cpu > 50, "sent {sent}, ended by the CPU bound {cpu}: {}", b["modules"]);
    assert_eq!(b["drops"]["capsule_refused"].as_u64().unwrap(), 0, "{}", b["drops"]);
    let run = b["modules"]["capsules_run"].as_u64().unwrap();
    let refused_full = b["drops"]["pool_full"].as_u64().unwrap_or(0);
    let rx = b["packets"]["rx_capsule"].as_u64().unwrap();
    assert!(run >= cpu && run + refused_full <= rx, "run {run}, pool full {refused_full}, received {rx}");
}

#[test]
fn a_user_loads_a_module_over_an_authenticated_control_message() {
    use anode_cred::{GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
    let s = Scratch::new("capstest", "load");
    let kd = s.0.join("user");
    let o = Command::new(ANODE).args(["keys", "gen", "--name", "u", "--out"]).arg(&kd).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    up_line3(&s, &["--user", kd.join("u.pub").to_str().unwrap()]);
    let user = anode_sec::Identity::load(&kd.join("u.key")).unwrap();
    let admin = anode_sec::Identity::load(&s.tb().join("keys").join("admin.key")).unwrap();
    let counter = module("counter");
    let issue = |code: &[u8], ifaces: &[Interface]| {
        let spec = GrantSpec {
            modules: vec![ModuleGrant::Hash(ModuleHash::of(code))],
            interfaces: InterfaceSet::of(ifaces),
            limits: Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 },
            expires: None,
        };
        Issuer::from_secret(&admin.secret_seed())
            .unwrap()
            .issue(PrincipalId(*user.public().as_bytes()), &spec)
            .unwrap()
            .to_bytes()
            .to_vec()
    };
    let cred = s.0.join("counter.cred");
    std::fs::write(&cred, issue(&counter, &[Interface::State, Interface::Log, Interface::Net, Interface::Marshal]))
        .unwrap();
    let b = s.tb().join("b");
    let listen = first_listen(&b);
    let load = |cred: &Path| {
        Command::new(ANODE)
            .args(["module", "load"])
            .arg(modules_dir().join("counter.wasm"))
            .arg("--credential")
            .arg(cred)
            .args(["--name", "counter", "--node", &listen, "--node-key"])
            .arg(s.tb().join("keys").join("b.pub"))
            .arg("--key")
            .arg(kd.join("u.key"))
            .output()
            .unwrap()
    };
    let o = load(&cred);
    assert!(o.status.success() && text(&o).contains("loaded"), "{}", text(&o));
    let st = status(&b);
    assert_eq!(st["modules"]["loads"].as_u64(), Some(1), "{}", st["modules"]);
    // A credential that does not grant this module's imports: refused, with
    // the reason sent back, and nothing loaded.
    let narrow = s.0.join("narrow.cred");
    std::fs::write(&narrow, issue(&counter, &[])).unwrap();
    let o = load(&narrow);
    assert!(!o.status.success() && text(&o).contains("refused"), "{}", text(&o));
    assert_eq!(status(&b)["modules"]["loads"].as_u64(), Some(1));
}

/// Why a namespace test cannot run here, if it cannot: it needs root and
/// iproute2 (`scripts/setup` installs iproute2).
fn netns_unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some(format!("not root (uid {uid:?})"));
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`ip netns list` failed: {}", text(&o))),
        Err(e) => Some(format!("no `ip` command: {e}")),
    }
}

/// The same capsule on real hosts (issue 19, "Real MTUs"): three network
/// namespaces joined by veth pairs whose MTU is 1,500 bytes, encrypted
/// links, `--link-mtu 1500`. The ping capsule carrying its code is longer
/// than a veth frame can hold, so it crosses as anode fragments, each of
/// which fits the veth MTU, and is reassembled at every hop. Skipped, with
/// the reason printed, without root or iproute2.
#[test]
fn a_capsule_longer_than_a_veth_mtu_crosses_namespaces_as_fragments() {
    if let Some(why) = netns_unavailable() {
        println!("skipped: {why}");
        return;
    }
    // Namespaces are named after the nodes: unique per test process.
    let id = std::process::id();
    let (a, b, c) = (format!("f{id}a"), format!("f{id}b"), format!("f{id}c"));
    let s = Scratch::new("capstest", "netns");
    let topo = s.0.join("line3.toml");
    std::fs::write(
        &topo,
        format!(
            "node = [{{ name = \"{a}\", address = \"10.0.0.1\" }}, {{ name = \"{b}\", address = \"10.0.0.2\" }}, \
             {{ name = \"{c}\", address = \"10.0.0.3\" }}]\nlink = [{{ a = \"{a}\", b = \"{b}\" }}, {{ a = \"{b}\", b = \"{c}\" }}]\n"
        ),
    )
    .unwrap();
    let o = Command::new(ANODE)
        .args(["testbed", "up"])
        .arg(&topo)
        .args(["--netns", "--security", "encrypt", "--link-mtu", "1500", "--dir"])
        .arg(s.tb())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The links really are 1,500-byte veths.
    let links = Command::new("ip").args(["-n", &format!("anode-{b}"), "-o", "link", "show", "type", "veth"]).output();
    let links = text(&links.unwrap());
    assert_eq!(links.matches("mtu 1500").count(), 2, "{links}");
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "--capsule", "-c", "3", "-i", "0.05", "-W", "3", "--module"])
        .arg(modules_dir().join("ping.wasm"))
        .arg("--admin-key")
        .arg(s.tb().join("keys").join("admin.key"))
        .arg("--run-dir")
        .arg(s.tb().join(&a))
        .output()
        .unwrap();
    assert!(text(&o).contains("3 received"), "{}", text(&o));
    let (fa, fb) = (&status(&s.tb().join(&a))["fragments"], &status(&s.tb().join(&b))["fragments"]);
    assert!(fa["tx_fragments"].as_u64().unwrap() >= 6, "a sent each capsule as fragments: {fa}");
    assert!(fb["rx_reassembled"].as_u64().unwrap() >= 3, "b put them back together: {fb}");
    assert!(fb["tx_fragments"].as_u64().unwrap() >= 6, "and sent them on as fragments: {fb}");
    assert_eq!(fb["rx_held_bytes"], 0, "{fb}");
    for d in ["malformed", "duplicate", "overlap", "out_of_order", "no_room", "oversized", "incomplete"] {
        assert_eq!(fb["drops"][d], 0, "{d}: {fb}");
    }
}
