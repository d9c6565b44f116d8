//! Transmit scheduling per link on real daemons (docs/rcane.md, "Transmit
//! scheduling per link"): a guaranteed session keeps its share of a paced
//! link while a hostile principal floods the same link.

#![allow(clippy::unwrap_used)]

mod common;

use common::{ANODE, Scratch, first_listen, status, text, up_line3, user_keys};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The link rate of the test: 32 Mbit/s (4 MB/s).
const RATE: u64 = 32_000_000;

fn run(args: &[&str]) -> Output {
    Command::new(ANODE).args(args).output().unwrap()
}

fn issue(admin: &Path, pubk: &Path, out: &Path, args: &[&str]) -> PathBuf {
    let o = Command::new(ANODE)
        .args(["cred", "issue", "--admin-key"])
        .arg(admin)
        .arg("--principal")
        .arg(pubk)
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    out.to_path_buf()
}

/// The paced link's client of `owner` in a node's status.
fn client(st: &serde_json::Value, owner: &str) -> serde_json::Value {
    st["interfaces"][0]["tx"]["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["owner"].as_str().is_some_and(|o| o.contains(owner)))
        .cloned()
        .unwrap_or_else(|| panic!("no client {owner}: {}", st["interfaces"][0]["tx"]))
}

#[test]
fn a_guaranteed_session_keeps_its_share_while_a_hostile_principal_floods_the_link() {
    let s = Scratch::new("tx", "hostile");
    let (vkey, vpub) = user_keys(&s.0.join("v"), "v");
    let (hkey, hpub) = user_keys(&s.0.join("h"), "h");
    // Every link paced at 32 Mbit/s; everyone's best-effort allowance is the
    // whole link, so only the link's scheduler stands between the flood and
    // the victim.
    let rate = RATE.to_string();
    up_line3(
        &s,
        &[
            "--link-rate",
            &rate,
            "--tx-allowance",
            "4000000",
            "--user",
            vpub.to_str().unwrap(),
            "--user",
            hpub.to_str().unwrap(),
        ],
    );
    let a = s.tb().join("a");
    let admin = s.tb().join("keys").join("admin.key");
    let target = |key: &Path| -> Vec<String> {
        vec![
            "--node".into(),
            first_listen(&a),
            "--node-key".into(),
            s.tb().join("keys").join("a.pub").display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ]
    };
    // V sends one 1,400-byte packet per millisecond (about 1.43 MB/s),
    // below its reservation of 2 MB/s (half the link: 3 ms in every 6 ms);
    // H, without a session, sends as fast as the sandbox lets it (16 per
    // millisecond, about 23 MB/s: nearly six times the link).
    let mut wasm = Vec::new();
    for (tag, per_tick) in [("V", "1"), ("H", "64")] {
        let w = s.0.join(format!("{tag}.wasm"));
        let o = run(&["experiment", "fig12-module", "--tag", tag, "--per-tick", per_tick, "-o", w.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
        wasm.push(w);
    }
    let scred = issue(
        &admin,
        &vpub,
        &s.0.join("v.session"),
        &["--kind", "session", "--vp-share", "20%", "--total-share", "20%", "--tx", "4MB/s"],
    );
    let mut open = vec!["session".to_string(), "open".into(), "--credential".into(), scred.display().to_string()];
    open.extend(["--vp", "1ms/6ms", "--tx", "2000000B/s"].map(String::from));
    open.extend(target(&vkey));
    let o = Command::new(ANODE).args(&open).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for ((key, pubk), w) in [(&vkey, &vpub), (&hkey, &hpub)].into_iter().zip(&wasm) {
        let cred = issue(
            &admin,
            pubk,
            &w.with_extension("cred"),
            &["--kind", "module", "--module", w.to_str().unwrap(), "--interface", "net,time"],
        );
        let mut load = vec![
            "module".to_string(),
            "load".into(),
            w.display().to_string(),
            "--credential".into(),
            cred.display().to_string(),
        ];
        load.extend(target(key));
        let o = Command::new(ANODE).args(&load).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    // Receive at b for 3 s, per sender.
    let arrivals = s.0.join("arrivals.csv");
    let o = run(&[
        "experiment",
        "fig12-receive",
        "--run-dir",
        s.tb().join("b").to_str().unwrap(),
        "--seconds",
        "3",
        "-o",
        arrivals.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let st = status(&a);
    let tx = &st["interfaces"][0]["tx"];
    assert_eq!(tx["rate_bps"].as_u64(), Some(RATE), "{tx}");
    let principal =
        |k: &Path| anode_cred::PrincipalId(*anode_sec::Identity::load(k).unwrap().public().as_bytes()).to_string();
    let (vp, hp) = (principal(&vkey), principal(&hkey));
    let v = client(&st, &vp);
    let h = client(&st, &hp);
    // V holds a guarantee of 3 ms in every 6 ms and lost nothing on the
    // link; H's flood overflowed only its own queue.
    assert_eq!(v["guarantee"]["slice_ns"].as_u64(), Some(3_000_000), "{v}");
    assert_eq!(v["guarantee"]["period_ns"].as_u64(), Some(6_000_000), "{v}");
    assert!(v["sent_packets"].as_u64().unwrap() > 500, "{v}");
    assert_eq!(v["dropped_packets"].as_u64(), Some(0), "the victim lost nothing: {v}");
    assert!(h["guarantee"].is_null(), "{h}");
    assert!(h["dropped_packets"].as_u64().unwrap() > 0, "the flood overflowed its own queue: {h}");
    assert!(st["drops"]["tx_queue_full"].as_u64().unwrap() > 0, "{}", st["drops"]);
    // At b: V's packets arrive, and the link carried no more than its rate
    // (with room for the catch-up after a late wakeup and for scheduling
    // noise on a shared machine).
    let csv = std::fs::read_to_string(&arrivals).unwrap();
    let count = |tag: &str| csv.lines().filter(|l| l.split(',').nth(1) == Some(tag)).count() as f64;
    let (nv, nh) = (count("V"), count("H"));
    let dgram = tx["sent_bytes"].as_u64().unwrap() as f64 / tx["sent_packets"].as_u64().unwrap() as f64;
    let total_bps = (nv + nh) * dgram * 8.0 / 3.0;
    assert!(nv > 0.0 && nh > 0.0, "V {nv}, H {nh}");
    assert!(total_bps <= 1.1 * RATE as f64, "{total_bps:.0} bit/s received, link paced at {RATE}");
    // V's packets are all of what it sent in the window (none lost), and H
    // received what the link had left, not V's share.
    let v_bps = nv * dgram * 8.0 / 3.0;
    assert!(v_bps <= 0.5 * RATE as f64 * 1.1, "V {v_bps:.0} bit/s");
    // The bytes sent on the paced link were charged to V's session.
    let sessions = st["rcane"]["sessions"].as_array().unwrap();
    let vs = sessions
        .iter()
        .find(|x| x["owner"].as_str().is_some_and(|o| o.contains(&vp)))
        .unwrap_or_else(|| panic!("{sessions:?}"));
    assert!(vs["charges"]["tx_bytes"].as_u64().unwrap() >= v["sent_bytes"].as_u64().unwrap() * 9 / 10, "{vs} {v}");
}

/// On an idle paced link a datagram is not queued: the link counts it as
/// sent at once (`sent_at_once`), it is sealed where it was received, and
/// the next node opens it. Encrypted links paced at 1 Gbit/s; pings from a
/// to c and back cross four paced links, each finding its link idle.
#[test]
fn an_idle_paced_link_sends_at_once_what_the_next_node_opens() {
    let s = Scratch::new("tx", "at-once");
    up_line3(&s, &["--link-rate", "1000000000", "--security", "encrypt"]);
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "-c", "20", "-i", "0.01", "-W", "2", "--run-dir"])
        .arg(s.tb().join("a"))
        .output()
        .unwrap();
    assert!(text(&o).contains("20 received"), "{}", text(&o));
    let b = status(&s.tb().join("b"));
    let mut at_once = 0;
    for i in b["interfaces"].as_array().unwrap() {
        let tx = &i["tx"];
        assert_eq!(tx["rate_bps"].as_u64(), Some(1_000_000_000), "{tx}");
        assert_eq!(tx["queued_packets"].as_u64(), Some(0), "{tx}");
        at_once += tx["sent_at_once"].as_u64().unwrap();
    }
    // b forwarded 20 requests and 20 replies, each at once (its own
    // keepalives and handshakes may have waited behind one another). With
    // data path workers (scripts/test reruns this file with
    // ANODE_WORKERS=2) the workers queue every datagram and only the event
    // loop sends at once: then delivery and sealing are what is checked.
    let workers = std::env::var("ANODE_WORKERS").ok().and_then(|w| w.parse::<u32>().ok()).unwrap_or(1);
    if workers <= 1 {
        assert!(at_once >= 40, "{at_once} sent at once: {}", b["interfaces"]);
    } else {
        eprintln!("ANODE_WORKERS={workers}: the workers queued b's forwarding ({at_once} sent at once)");
    }
    let c = status(&s.tb().join("c"));
    for d in ["auth_tag_mismatch", "auth_replay", "auth_beyond_window", "no_sa"] {
        assert_eq!(c["drops"][d].as_u64().unwrap(), 0, "c dropped {d}: {}", c["drops"]);
        assert_eq!(b["drops"][d].as_u64().unwrap(), 0, "b dropped {d}: {}", b["drops"]);
    }
}
