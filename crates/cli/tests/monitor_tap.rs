//! The FLAME tap on running nodes (issue 16): two taps on one path sample
//! exactly the same packets with trajectory sampling; the tap is off by
//! default; a looping module on the tap does not stop forwarding and is
//! unloaded as the monitor does; the view on the tap withholds what the
//! credential does not grant; the periodic part runs in an RCANE session of
//! its own.
#![allow(clippy::unwrap_used)]

mod common;

use anode_daemon::client::Client;
use common::{ANODE, Scratch, eventually, modules_dir, status, text, up_line3, user_keys};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The testbed's administrator key made before `testbed up` (which keeps
/// it), and a researcher's key pair: (admin public key text, researcher .pub).
fn keys(s: &Scratch) -> (String, PathBuf) {
    user_keys(&s.tb().join("keys"), "admin");
    let (_, alice) = user_keys(&s.0.join("alice"), "alice");
    let admin = std::fs::read_to_string(s.tb().join("keys").join("admin.pub")).unwrap();
    (admin.trim().to_string(), alice)
}

/// `anode monitor credential issue` by the testbed's administrator.
fn mcred(s: &Scratch, alice: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = s.0.join(name);
    let o = Command::new(ANODE)
        .args(["monitor", "credential", "issue", "--admin-key"])
        .arg(s.tb().join("keys").join("admin.key"))
        .arg("--principal")
        .arg(alice)
        .args(args)
        .args(["--expires-in", "1h", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    out
}

/// A `[monitor]` section file: on, rooted in `admin`, with `extra` keys and
/// these (module file, credential, name) loads.
fn section(s: &Scratch, file: &str, admin: &str, extra: &str, loads: &[(&Path, &Path, &str)]) -> PathBuf {
    let mut t = format!("enabled = true\nadmin_key = \"{admin}\"\n{extra}\n");
    for (m, c, n) in loads {
        t.push_str(&format!(
            "[[load]]\nfile = \"{}\"\ncredential = \"{}\"\nname = \"{n}\"\n",
            m.display(),
            c.display()
        ));
    }
    let p = s.0.join(file);
    std::fs::write(&p, t).unwrap();
    p
}

fn monitor_arg(node: &str, file: &Path) -> String {
    format!("{node}={}", file.display())
}

/// The JSON lines a node's tap exported.
fn records(node_dir: &Path) -> Vec<serde_json::Value> {
    let t = std::fs::read_to_string(node_dir.join("monitor.jsonl")).unwrap_or_default();
    t.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The (hash, length) of every packet module `name` sampled (schema 2).
fn sampled(node_dir: &Path, name: &str) -> BTreeSet<(u64, u64)> {
    records(node_dir)
        .iter()
        .filter(|r| r["module"] == name && r["schema"] == 2)
        .map(|r| (r["hash"].as_u64().unwrap(), r["len"].as_u64().unwrap()))
        .collect()
}

/// The flow labels module `name` reported (schema 1).
fn flows(node_dir: &Path, name: &str) -> BTreeSet<u64> {
    records(node_dir)
        .iter()
        .filter(|r| r["module"] == name && r["schema"] == 1)
        .map(|r| r["flow"].as_u64().unwrap())
        .collect()
}

/// Waits until the node's tap has handed `n` datagrams to the monitor and
/// the periodic part has run twice since (so every batch is flushed and
/// written).
fn settled(node_dir: &Path, n: u64) {
    let tap = |d: &Path| status(d)["monitor"]["tap"].clone();
    assert!(
        eventually(10.0, || tap(node_dir)["monitored"].as_u64().unwrap_or(0) >= n),
        "{}: {}",
        node_dir.display(),
        tap(node_dir)
    );
    assert_eq!(tap(node_dir)["monitored"].as_u64(), Some(n), "{}: nothing lost, nothing extra", node_dir.display());
    let t0 = tap(node_dir)["ticks"].as_u64().unwrap();
    assert!(eventually(10.0, || tap(node_dir)["ticks"].as_u64().unwrap_or(0) >= t0 + 2));
}

/// Plain packets from node `from` to 10.0.0.3, one of each payload length
/// in `lengths` (the content hashed is the ANEP and plain headers, so the
/// length is what varies).
fn send_plain(from: &Path, lengths: std::ops::RangeInclusive<usize>) {
    let mut c = Client::connect(from).unwrap();
    for n in lengths {
        c.plain(Ipv4Addr::new(10, 0, 0, 3), 9, 64, &vec![b'x'; n]).unwrap();
        if n % 50 == 0 {
            // Let the receive batches drain: loopback UDP is not lossless under a burst.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn two_taps_on_one_path_sample_exactly_the_same_packets() {
    let s = Scratch::new("monitor-tap", "traj");
    let (admin, alice) = keys(&s);
    let traj = modules_dir().join("mon-trajectory.wasm");
    // What no hop rewrites: the IP/UDP envelope's protocol and length and
    // the first 16 payload bytes (the ANEP header and the plain header's
    // addresses; the TTL is byte 16). The endpoints change every hop.
    let invariant = mcred(
        &s,
        &alice,
        "traj.cred",
        &["--read", "ts,ip.proto,ip.len", "--payload", "16", "--export", "records,packets"],
    );
    let endpoints = mcred(
        &s,
        &alice,
        "endpoints.cred",
        &["--read", "ts,ip.proto,ip.len,ip.src,ip.dst,l4.sport,l4.dport", "--payload", "16", "--export", "records"],
    );
    let sec = section(
        &s,
        "mon.toml",
        &admin,
        "batch = 8\ntick_ms = 100",
        &[(&traj, &invariant, "traj"), (&traj, &endpoints, "traj-endpoints")],
    );
    up_line3(&s, &["--monitor", &monitor_arg("b", &sec), "--monitor", &monitor_arg("c", &sec)]);
    let (a, b, c) = (s.tb().join("a"), s.tb().join("b"), s.tb().join("c"));

    // a → c through b: both taps see the same 200 packets.
    send_plain(&a, 1..=200);
    settled(&b, 200);
    settled(&c, 200);
    let (sb, sc) = (sampled(&b, "traj"), sampled(&c, "traj"));
    assert!(!sb.is_empty() && sb.len() < 200, "about 10 % sampled: {}", sb.len());
    assert_eq!(sb, sc, "the same packets, with the same labels, on both sides of b");
    assert_eq!(flows(&b, "traj"), flows(&c, "traj"));
    // Each sample is also in each node's pcap (24-byte header, 16 + packet per record).
    for d in [&b, &c] {
        let pcap = std::fs::read(d.join("monitor.pcap")).unwrap();
        assert!(pcap.len() > 24 + 16 * sb.len(), "{}: {} bytes", d.display(), pcap.len());
        assert!(std::fs::metadata(d.join("monitor.ipfix")).unwrap().len() > 0);
    }
    // Control 1: a grant that includes the per-hop endpoints hashes them, so
    // the two taps disagree (the comparison above can fail).
    let (eb, ec) = (sampled(&b, "traj-endpoints"), sampled(&c, "traj-endpoints"));
    assert!(!eb.is_empty() && !ec.is_empty());
    assert_ne!(eb, ec, "endpoints differ per hop, so the samples do");

    // Control 2: packets that only c's tap sees (b originates them; a tap
    // sees what a node receives) add samples only at c.
    send_plain(&b, 1..=200);
    settled(&c, 400);
    assert_eq!(sampled(&b, "traj"), sb, "b saw none of them");
    let sc2 = sampled(&c, "traj");
    assert!(sc2.is_superset(&sb) && sc2.len() > sb.len(), "c sampled some of its own: {} vs {}", sc2.len(), sb.len());
}

/// A monitoring module whose per-packet entry never returns.
const LOOPER: &str = r#"(module
    (memory (export "memory") 2)
    (func (export "mon_init") (param i32 i32) (result i32) (i32.const 1024))
    (func (export "mon_packet") (param i32) (result i32) (loop $l (br $l)) (i32.const 0)))"#;

#[test]
fn the_tap_is_off_by_default_and_a_looping_module_on_it_does_not_stop_forwarding() {
    let s = Scratch::new("monitor-tap", "hostile");
    let (admin, alice) = keys(&s);
    let looper = s.0.join("looper.wasm");
    std::fs::write(&looper, wat::parse_str(LOOPER).unwrap()).unwrap();
    let loop_cred = mcred(&s, &alice, "loop.cred", &["--read", "ts", "--budget", "20000"]);
    // The hostile module reads every field, granted or not, and reports the
    // non-zero bytes of the withheld ones.
    let hostile = modules_dir().join("mon-hostile.wasm");
    let hostile_cred = mcred(&s, &alice, "hostile.cred", &["--read", "ts,ip.proto", "--payload", "16"]);
    let sec = section(
        &s,
        "mon.toml",
        &admin,
        "batch = 1\nunload_after = 3\ntick_ms = 100",
        &[(&looper, &loop_cred, "looper"), (&hostile, &hostile_cred, "hostile")],
    );
    up_line3(&s, &["--monitor", &monitor_arg("b", &sec)]);
    let (a, b, c) = (s.tb().join("a"), s.tb().join("b"), s.tb().join("c"));

    let o =
        Command::new(ANODE).args(["ping", "10.0.0.3", "-c", "10", "-i", "0.05", "--run-dir"]).arg(&a).output().unwrap();
    assert!(o.status.success() && text(&o).contains(" 0% packet loss"), "{}", text(&o));

    // Off by default: a and c have no [monitor], so no tap and no files.
    for d in [&a, &c] {
        assert_eq!(status(d)["monitor"], serde_json::json!({"enabled": false}));
        assert!(!d.join("monitor.jsonl").exists());
    }
    // On b: the looper overran on each of its first packets and was unloaded
    // after three; the hostile module went on and never saw a withheld byte.
    let st = status(&b);
    let m = &st["monitor"];
    assert_eq!(m["enabled"], true);
    assert_eq!(m["tap"]["monitored"], 20, "10 pings there and back: {m}");
    assert_eq!(m["monitor"]["unloads"], 1, "{m}");
    let mods = m["modules"].as_array().unwrap();
    let by = |n: &str| mods.iter().find(|x| x["name"] == n).unwrap().clone();
    let (l, h) = (by("looper"), by("hostile"));
    assert_eq!(l["counters"]["overruns"], 3, "{l}");
    assert!(l["unloaded"].as_str().unwrap().contains("overruns"), "{l}");
    assert_eq!(h["unloaded"], serde_json::Value::Null);
    assert_eq!(h["counters"]["packets"], 20, "{h}");
    assert!(eventually(5.0, || records(&b).iter().filter(|r| r["module"] == "hostile").count() == 20));
    for r in records(&b).iter().filter(|r| r["module"] == "hostile") {
        assert_eq!((r["packets"].as_u64(), r["flow"].as_u64()), (Some(0), Some(0)), "{r}");
    }
    // The periodic part runs in a VP of the tap's own RCANE session, which
    // is charged for it.
    let sid = m["periodic_session"].as_str().unwrap().to_string();
    let cpu = |st: &serde_json::Value| {
        st["rcane"]["sessions"].as_array().unwrap().iter().find(|x| x["session"] == sid.as_str()).map(|x| {
            x["charges"]["cpu_guaranteed_ns"].as_u64().unwrap() + x["charges"]["cpu_slack_ns"].as_u64().unwrap()
        })
    };
    assert!(cpu(&st).is_some(), "{}", st["rcane"]);
    assert!(eventually(5.0, || cpu(&status(&b)).unwrap_or(0) > 0), "{}", status(&b)["rcane"]);
    let metrics = Command::new(ANODE).args(["status", "--metrics", "--run-dir"]).arg(&b).output().unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(metrics.contains("anode_monitor_unloads_total 1"), "{metrics}");
    assert!(metrics.contains("anode_monitor_module_overruns_total{module=\"looper\",id=\"m1\"} 3"), "{metrics}");
    let text_status = Command::new(ANODE).args(["status", "--run-dir"]).arg(&b).output().unwrap();
    assert!(String::from_utf8_lossy(&text_status.stdout).contains("UNLOADED"), "{}", text(&text_status));
}

#[test]
fn monitor_run_source_node_runs_a_module_on_the_tap_of_a_running_node_and_unloads_it() {
    let s = Scratch::new("monitor-tap", "run-node");
    let (admin, alice) = keys(&s);
    // b's tap is on, with no module of its own; c's is off.
    let b_section = section(&s, "b.monitor", &admin, "tick_ms = 100", &[]);
    up_line3(&s, &["--monitor", &monitor_arg("b", &b_section)]);
    let count = modules_dir().join("mon-count.wasm");
    let cred = mcred(&s, &alice, "count.cred", &[]);
    let (b, c) = (s.tb().join("b"), s.tb().join("c"));
    let run = |dir: &Path, extra: &[&str]| {
        Command::new(ANODE)
            .args(["monitor", "run", "--source", "node", "--run-dir"])
            .arg(dir)
            .arg("--module")
            .arg(&count)
            .arg("--credential")
            .arg(&cred)
            .args(extra)
            .output()
            .unwrap()
    };
    // Traffic crosses b while the researcher's module runs there for 2 s.
    let sender = {
        let a = s.tb().join("a");
        std::thread::spawn(move || {
            for _ in 0..8 {
                send_plain(&a, 100..=150);
                std::thread::sleep(std::time::Duration::from_millis(150));
            }
        })
    };
    let o = run(&b, &["--duration", "2", "--name", "alice-count"]);
    sender.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("loaded alice-count as"), "{out}");
    assert!(out.contains("unloaded alice-count"), "{out}");
    // It saw packets while it ran, its records are in b's export, and it is gone now.
    let st = status(&b);
    let m = st["monitor"]["modules"].as_array().unwrap().iter().find(|m| m["name"] == "alice-count").cloned().unwrap();
    assert!(m["counters"]["packets"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["unloaded"].as_str(), Some("unloaded by the operator"), "{m}");
    assert!(records(&b).iter().any(|r| r["module"] == "alice-count"), "its records went to b's export");
    // A node whose tap is off says so; a credential the node does not accept is refused with the reason.
    let o = run(&c, &["--duration", "1"]);
    assert!(!o.status.success() && text(&o).contains("tap is off"), "{}", text(&o));
    let (other, _) = user_keys(&s.0.join("other"), "other");
    let foreign = s.0.join("foreign.cred");
    let o2 = Command::new(ANODE)
        .args(["monitor", "credential", "issue", "--admin-key"])
        .arg(&other)
        .arg("--principal")
        .arg(&alice)
        .arg("-o")
        .arg(&foreign)
        .output()
        .unwrap();
    assert!(o2.status.success(), "{}", text(&o2));
    let o = Command::new(ANODE)
        .args(["monitor", "run", "--source", "node", "--run-dir"])
        .arg(&b)
        .arg("--module")
        .arg(&count)
        .arg("--credential")
        .arg(&foreign)
        .output()
        .unwrap();
    assert!(!o.status.success() && text(&o).contains("refused"), "{}", text(&o));
    // Options that belong to a local run are refused with node.
    let o = Command::new(ANODE)
        .args(["monitor", "run", "--source", "node", "--run-dir"])
        .arg(&b)
        .args(["--module", "m.wasm", "--credential", "c", "--export", "json:-"])
        .output()
        .unwrap();
    assert!(!o.status.success() && text(&o).contains("drop --export"), "{}", text(&o));
}

#[test]
fn a_node_whose_tap_cannot_start_says_why_and_does_not_start() {
    let s = Scratch::new("monitor-tap", "refused");
    let (admin, alice) = keys(&s);
    let count = modules_dir().join("mon-count.wasm");
    // A credential from another administrator: refused at load.
    let (other, _) = user_keys(&s.0.join("other"), "other");
    let out = s.0.join("foreign.cred");
    let o = Command::new(ANODE)
        .args(["monitor", "credential", "issue", "--admin-key"])
        .arg(&other)
        .arg("--principal")
        .arg(&alice)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let up = |sec: &Path| {
        let topo = s.0.join("line3.toml");
        std::fs::write(&topo, common::LINE3).unwrap();
        Command::new(ANODE)
            .args(["testbed", "up"])
            .arg(&topo)
            .arg("--monitor")
            .arg(monitor_arg("b", sec))
            .arg("--dir")
            .arg(s.tb())
            .output()
            .unwrap()
    };
    let sec = section(&s, "foreign.toml", &admin, "", &[(&count, &out, "count")]);
    let o = up(&sec);
    assert!(!o.status.success());
    assert!(text(&o).contains("[monitor] module") && text(&o).contains("credential refused"), "{}", text(&o));
    // A Crypto-PAn key readable by others: refused before anything runs.
    let key = s.0.join("pan.key");
    let o = Command::new(ANODE).args(["monitor", "keygen", "--out"]).arg(&key).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut p = std::fs::metadata(&key).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o644);
    std::fs::set_permissions(&key, p).unwrap();
    let cred = mcred(&s, &alice, "count.cred", &["--read", "ts,len"]);
    let sec =
        section(&s, "open.toml", &admin, &format!("anon_key = \"{}\"", key.display()), &[(&count, &cred, "count")]);
    let o = up(&sec);
    assert!(!o.status.success());
    assert!(text(&o).contains("must not be readable by group or others"), "{}", text(&o));
    // A setting out of range is refused by `testbed up` itself.
    let sec = section(&s, "batch.toml", &admin, "batch = 0", &[]);
    let o = up(&sec);
    assert!(!o.status.success() && text(&o).contains("[monitor] batch must be in 1..=1024"), "{}", text(&o));
}
