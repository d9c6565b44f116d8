//! `anode boot keygen|sign|verify` end to end on a testbed node's files:
//! the chain verifies layer by layer; a tampered topology is recovered from
//! the mirror (policy recover) or refused (policy refuse); a tampered key
//! file is never fetched; the key never reaches the repository.

mod common;

use common::{ANODE, LINE3, Scratch, text};
use std::process::Command;

fn anode(args: &[&str]) -> (bool, String) {
    let o = Command::new(ANODE).args(args).output().expect("run anode");
    (o.status.success(), text(&o))
}

#[test]
fn sign_then_verify_recover_and_refuse() {
    let s = Scratch::new("boot", "chain");
    let p = |x: &str| s.0.join(x).display().to_string();
    std::fs::write(s.0.join("line3.toml"), LINE3).expect("topology");
    std::fs::write(s.0.join("fake-anode"), b"\x7fELF a stand-in for the node binary").expect("binary");
    let (ok, out) = anode(&["testbed", "up", &p("line3.toml"), "--configs-only", "--dir", &p("tb")]);
    assert!(ok, "{out}");
    let (ok, out) = anode(&["boot", "keygen", "--out", &p("keys"), "--root-keys", "3", "--targets-keys", "2"]);
    assert!(ok, "{out}");
    let (ok, out) = anode(&[
        "boot",
        "sign",
        "--keys",
        &p("keys"),
        "--repo",
        &p("repo"),
        "--node",
        "b",
        "--config",
        &p("tb/b/node.toml"),
        "--base",
        &p("tb"),
        "--binary",
        &p("fake-anode"),
        "--install",
        &p("boot"),
        "--policy",
        "recover",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("created root metadata v1 (3 root key(s), 2 targets key(s))"), "{out}");
    assert!(out.contains("(secret: not copied to the repository)"), "{out}");
    assert!(!s.0.join("repo/targets/b/keys/keys/b.key").exists(), "the secret key never reaches the repository");

    let verify = |policy: &str| {
        anode(&["boot", "verify", "--boot", &p("boot"), "--config", &p("tb/b/node.toml"), "--policy", policy])
    };
    let (ok, out) = verify("refuse");
    assert!(ok, "{out}");
    for l in ["layer 1 binary", "layer 2 config", "layer 3 keys", "b/node.toml", "topology.toml", "keys/b.key"] {
        assert!(out.contains(l), "{l} missing from:\n{out}");
    }
    assert!(out.contains("the node would start"), "{out}");

    // A tampered topology: refused under refuse, recovered under recover.
    let topo = s.0.join("tb/topology.toml");
    let good = std::fs::read(&topo).expect("topology");
    std::fs::write(&topo, [good.as_slice(), b"# tampered\n"].concat()).expect("tamper");
    let (ok, out) = verify("refuse");
    assert!(!ok && out.contains("REFUSED") && out.contains("topology.toml"), "{out}");
    let (ok, out) = verify("recover");
    assert!(ok && out.contains("recovered b/config/topology.toml from mirror"), "{out}");
    assert_ne!(std::fs::read(&topo).expect("topology"), good, "verify without --repair writes nothing");
    let (ok, out) = anode(&["boot", "verify", "--boot", &p("boot"), "--config", &p("tb/b/node.toml"), "--repair"]);
    assert!(ok && out.contains("stored"), "{out}");
    assert_eq!(std::fs::read(&topo).expect("topology"), good, "--repair stored the verified copy");

    // A tampered key file is never fetched: even degraded refuses.
    let key = s.0.join("tb/keys/b.key");
    let k = std::fs::read_to_string(&key).expect("key");
    std::fs::write(&key, k.replace('a', "b").replace('1', "2")).expect("tamper key");
    let (ok, out) = verify("degraded");
    assert!(!ok && out.contains("never fetched"), "{out}");

    // A signed component outside the base directory is refused at signing.
    let (ok, out) = anode(&[
        "boot",
        "sign",
        "--keys",
        &p("keys"),
        "--repo",
        &p("repo"),
        "--node",
        "b",
        "--config",
        &p("tb/b/node.toml"),
        "--base",
        &p("tb/b"),
        "--binary",
        &p("fake-anode"),
    ]);
    assert!(!ok && out.contains("outside the node's base directory"), "{out}");
}
