//! `anode node --boot DIR` on real daemons (issue 18): the node starts only
//! on a verified chain and uses the verified bytes; each policy's outcome
//! for a corrupted component; recovery from a mirror and from a peer node
//! over an SA; a stalling or bad source ends in the policy's outcome.
//!
//! Layer 1 verifies a stand-in binary (`boot.toml` `binary`), not the
//! 100 MB debug `anode`, so that each test does not copy it into a
//! repository (the disk is shared); the real binary's check is the same
//! code (`anode boot verify` without `--binary` in docs/boot.md).

mod common;

use anode_daemon::client::Client;
use common::{ANODE, Scratch, free_ports, issue_credential, modules_dir, text};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOPO: &str = r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }]
link = [{ a = "a", b = "b" }]
"#;

/// Nodes a and b of a testbed (security on), b loading a switchlet at
/// start, b's chain signed into `repo` and installed in `boot`.
struct Bed {
    s: Scratch,
    ports: Vec<u16>,
}

impl Bed {
    fn new(tag: &str) -> Bed {
        let s = Scratch::new("bootnode", tag);
        let bed = Bed { s, ports: free_ports(2) };
        std::fs::write(bed.p("t.toml"), TOPO).expect("topology");
        std::fs::write(bed.p("fake-anode"), b"\x7fELF a stand-in for the node binary").expect("binary");
        bed.ok(&["testbed", "up", &bed.ps("t.toml"), "--configs-only", "--dir", &bed.ps("tb")]);
        // Free ports instead of the testbed's 7000 and 7001.
        for n in ["a", "b"] {
            let f = bed.p(&format!("tb/{n}/node.toml"));
            let c = std::fs::read_to_string(&f).expect("config");
            let c = c
                .replace("127.0.0.1:7000", &format!("127.0.0.1:{}", bed.ports[0]))
                .replace("127.0.0.1:7001", &format!("127.0.0.1:{}", bed.ports[1]));
            std::fs::write(&f, c).expect("config");
        }
        // The switchlet b loads at start, with its credential.
        std::fs::create_dir_all(bed.p("tb/mods")).expect("mods");
        let code = std::fs::read(modules_dir().join("channel.wasm")).expect("channel.wasm (run scripts/setup)");
        std::fs::write(bed.p("tb/mods/channel.wasm"), &code).expect("module");
        let cred = issue_credential(
            &bed.p("tb/keys/admin.key"),
            [9; 32],
            &code,
            &[
                anode_cred::Interface::Net,
                anode_cred::Interface::State,
                anode_cred::Interface::Time,
                anode_cred::Interface::Log,
            ],
            None,
        );
        std::fs::write(bed.p("tb/mods/channel.cred"), cred).expect("credential");
        let b = bed.p("tb/b/node.toml");
        let c = std::fs::read_to_string(&b).expect("config");
        std::fs::write(
            &b,
            format!(
                "{c}\n[[modules.load]]\nfile = \"../mods/channel.wasm\"\ncredential = \"../mods/channel.cred\"\n\
                 name = \"echo\"\n"
            ),
        )
        .expect("config");
        bed.ok(&["boot", "keygen", "--out", &bed.ps("keys")]);
        bed.sign_b();
        bed
    }

    /// `anode boot sign` of node b's chain (policy refuse) into DIR/boot;
    /// its output.
    fn sign_b(&self) -> String {
        self.ok(&[
            "boot",
            "sign",
            "--keys",
            &self.ps("keys"),
            "--repo",
            &self.ps("repo"),
            "--node",
            "b",
            "--config",
            &self.ps("tb/b/node.toml"),
            "--base",
            &self.ps("tb"),
            "--binary",
            &self.ps("fake-anode"),
            "--install",
            &self.ps("boot"),
            "--policy",
            "refuse",
        ])
    }

    /// Verifies node b's chain now (what `anode node --boot` does first).
    fn verify_b(&self) -> anode_boot::fsio::NodeBoot {
        let cfg = self.p("tb/b/node.toml");
        anode_boot::fsio::boot_node(
            &self.p("boot"),
            cfg.parent().expect("dir"),
            std::time::SystemTime::now(),
            false,
            Vec::new(),
        )
        .expect("boot")
    }

    /// Binds node b's daemon from the chain `nb` verified, as `anode node
    /// --boot` does: the config and every file it names from the chain.
    fn bind_b(&self, nb: anode_boot::fsio::NodeBoot) -> anode_daemon::Daemon {
        let cfg = self.p("tb/b/node.toml");
        let loaded =
            anode_daemon::load_config_from(&cfg, anode_daemon::StartFiles::Chain(&nb)).expect("config from the chain");
        let opts = anode_daemon::Options { boot: Some(std::sync::Arc::new(nb)), ..Default::default() };
        anode_daemon::Daemon::bind(&loaded.config, loaded.topology.as_ref(), &opts).expect("bind")
    }

    /// Binds node b's daemon without the chain (files read from their
    /// paths); the error it must stop with.
    fn bind_b_without_chain(&self) -> anode_daemon::DaemonError {
        let plain = anode_daemon::load_config(&self.p("tb/b/node.toml")).expect("config");
        anode_daemon::Daemon::bind(&plain.config, plain.topology.as_ref(), &anode_daemon::Options::default())
            .map(|_| ())
            .expect_err("a daemon from the swapped files")
    }

    fn p(&self, x: &str) -> PathBuf {
        self.s.0.join(x)
    }

    fn ps(&self, x: &str) -> String {
        self.p(x).display().to_string()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = Command::new(ANODE).args(args).output().expect("run anode");
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        text(&o)
    }

    /// Rewrites `key = ...` lines of boot.toml (adding the key if missing).
    fn settings(&self, set: &[(&str, &str)]) {
        let f = self.p("boot/boot.toml");
        let mut lines: Vec<String> =
            std::fs::read_to_string(&f).expect("boot.toml").lines().map(String::from).collect();
        for (k, v) in set {
            lines.retain(|l| !l.starts_with(&format!("{k} =")));
            lines.push(format!("{k} = {v}"));
        }
        std::fs::write(&f, lines.join("\n") + "\n").expect("boot.toml");
    }

    fn module(&self) -> PathBuf {
        self.p("tb/mods/channel.wasm")
    }

    /// Flips a byte of `file`; returns its good bytes.
    fn corrupt(&self, file: &Path) -> Vec<u8> {
        let good = std::fs::read(file).expect("file");
        let mut bad = good.clone();
        let i = bad.len() / 2;
        bad[i] ^= 0x5a;
        std::fs::write(file, bad).expect("corrupt");
        good
    }

    /// `anode node --config tb/NODE/node.toml ARGS`, its log in NODE.log.
    fn spawn(&self, node: &str, args: &[&str]) -> Node {
        let log = self.p(&format!("{node}.log"));
        let f = std::fs::File::create(&log).expect("log");
        let child = Command::new(ANODE)
            .args(["node", "--config", &self.ps(&format!("tb/{node}/node.toml"))])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("start anode node");
        Node { child, log, run_dir: self.p(&format!("tb/{node}")) }
    }

    /// Node b booted from `boot/`: Ok(running node) or Err((exit code, log)).
    fn boot_b(&self) -> Result<Node, (Option<i32>, String)> {
        let mut n = self.spawn("b", &["--boot", &self.ps("boot")]);
        match n.ready() {
            Ok(()) => Ok(n),
            Err(code) => Err((code, n.log())),
        }
    }
}

struct Node {
    child: Child,
    log: PathBuf,
    run_dir: PathBuf,
}

impl Node {
    /// Waits until the node answers on its local socket, or exits.
    fn ready(&mut self) -> Result<(), Option<i32>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut c) = Client::connect(&self.run_dir)
                && c.hello().is_ok()
            {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(st.code());
            }
            assert!(Instant::now() < deadline, "node not ready after 60 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn status(&self) -> serde_json::Value {
        common::status(&self.run_dir)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn verdicts(st: &serde_json::Value) -> Vec<(String, String)> {
    st["boot"]["components"]
        .as_array()
        .expect("boot components")
        .iter()
        .map(|c| (c["name"].as_str().unwrap_or("?").to_string(), c["verdict"].as_str().unwrap_or("?").to_string()))
        .collect()
}

#[test]
fn a_node_on_a_good_chain_starts_says_so_and_runs_its_switchlet() {
    let bed = Bed::new("good");
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    let log = n.log();
    assert!(log.contains("boot chain verified: the node starts on the verified bytes"), "{log}");
    assert!(log.contains("module loaded from the config"), "{log}");
    let st = n.status();
    let v = verdicts(&st);
    let names: Vec<&str> = v.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "b/binary/anode",
            "b/config/b/node.toml",
            "b/config/topology.toml",
            "b/keys/keys/b.key",
            "b/keys/mods/channel.cred",
            "b/switchlets/mods/channel.wasm"
        ],
        "{st}"
    );
    assert!(v.iter().all(|(_, w)| w == "verified"), "{v:?}");
    assert_eq!(st["boot"]["policy"], "refuse");
    assert_eq!(st["boot"]["verified"], 6);
    assert_eq!(st["boot"]["metadata"]["targets"]["version"], 1, "{}", st["boot"]);
    assert_eq!(st["modules"]["loads"].as_u64(), Some(1), "{}", st["modules"]);
    assert!(bed.p("boot/state.json").exists(), "the state was recorded");
    let o = Command::new(ANODE).args(["status", "--run-dir"]).arg(&n.run_dir).output().expect("anode status");
    let shown = text(&o);
    assert!(shown.contains("boot chain: node b  policy refuse  verified 6  recovered 0  skipped 0"), "{shown}");
    assert!(shown.contains("  layer switchlets\n    verified   b/switchlets/mods/channel.wasm"), "{shown}");
}

#[test]
fn a_corrupted_config_key_or_switchlet_stops_the_start_under_refuse() {
    let bed = Bed::new("refuse");
    for (file, name) in [
        ("tb/b/node.toml", "b/config/b/node.toml"),
        ("tb/topology.toml", "b/config/topology.toml"),
        ("tb/keys/b.key", "b/keys/keys/b.key"),
        ("tb/mods/channel.wasm", "b/switchlets/mods/channel.wasm"),
    ] {
        let f = bed.p(file);
        let good = std::fs::read(&f).expect("file");
        let mut bad = good.clone();
        bad.extend_from_slice(b"\n# tampered\n");
        std::fs::write(&f, &bad).expect("tamper");
        let (code, log) = bed.boot_b().map(|_| ()).expect_err(file);
        assert_eq!(code, Some(3), "{log}");
        assert!(log.contains("boot chain refused, the node does not start"), "{log}");
        assert!(log.contains(name), "{name} not named:\n{log}");
        assert!(!log.contains("node started"), "{log}");
        std::fs::write(&f, &good).expect("restore");
    }
    // An unsigned file the config names stops the start too: a second
    // module not in the metadata.
    let b = bed.p("tb/b/node.toml");
    let good = std::fs::read_to_string(&b).expect("config");
    std::fs::copy(bed.module(), bed.p("tb/mods/extra.wasm")).expect("copy");
    std::fs::write(&b, good.replace("channel.wasm", "extra.wasm")).expect("config");
    let (code, log) = bed.boot_b().map(|_| ()).expect_err("config changed");
    assert_eq!(code, Some(3), "{log}");
    std::fs::write(&b, &good).expect("restore");
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    assert!(n.log().contains("boot chain verified"));
}

#[test]
fn recover_restores_a_corrupted_switchlet_from_the_mirror_and_runs_it() {
    let bed = Bed::new("recover");
    bed.settings(&[("policy", "\"recover\"")]);
    let good = bed.corrupt(&bed.module());
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    let st = n.status();
    let v = verdicts(&st);
    assert!(v.contains(&("b/switchlets/mods/channel.wasm".into(), "recovered".into())), "{v:?}");
    assert_eq!(st["boot"]["recovered"], 1);
    assert_eq!(st["modules"]["loads"].as_u64(), Some(1), "the recovered switchlet runs: {}", st["modules"]);
    assert_eq!(std::fs::read(bed.module()).expect("module"), good, "the verified copy was stored");
    let log = n.log();
    assert!(log.contains("boot: recovered") && log.contains("boot: stored verified copy"), "{log}");
}

#[test]
fn degraded_starts_without_a_switchlet_whose_recovery_fails_recover_does_not_start() {
    let bed = Bed::new("degraded");
    bed.corrupt(&bed.module());
    // The mirror's copy is bad too: recovery fails.
    bed.corrupt(&bed.p("repo/targets/b/switchlets/mods/channel.wasm"));
    bed.settings(&[("policy", "\"recover\"")]);
    let (code, log) = bed.boot_b().map(|_| ()).expect_err("recover");
    assert_eq!(code, Some(3), "{log}");
    assert!(log.contains("b/switchlets/mods/channel.wasm"), "{log}");
    bed.settings(&[("policy", "\"degraded\"")]);
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    let st = n.status();
    assert_eq!(st["boot"]["skipped"], 1, "{}", st["boot"]);
    assert_eq!(st["boot"]["degraded"], true);
    assert_eq!(st["modules"]["loads"].as_u64(), Some(0), "{}", st["modules"]);
    let log = n.log();
    assert!(log.contains("module not loaded: the degraded boot left it out"), "{log}");
    assert!(log.contains("degraded start without this component"), "{log}");
}

#[test]
fn a_stalling_source_ends_in_the_policy_outcome_in_bounded_time() {
    let bed = Bed::new("stall");
    // A peer that never answers, and no mirror.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("silent peer");
    let peer = format!("[\"{}\"]", silent.local_addr().expect("addr"));
    bed.ok(&["keys", "gen", "--name", "recovery", "--out", &bed.ps("boot")]);
    bed.settings(&[
        ("recovery_key", "\"recovery.key\""),
        ("mirrors", "[]"),
        ("peers", &peer),
        ("request_timeout_ms", "300"),
        ("attempt_deadline_ms", "1000"),
        ("max_attempts", "2"),
        ("policy", "\"degraded\""),
    ]);
    bed.corrupt(&bed.module());
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    assert_eq!(n.status()["boot"]["skipped"], 1);
    assert!(n.log().contains("no SA with the peer"), "{}", n.log());
    drop(n);
    bed.settings(&[("policy", "\"recover\"")]);
    let (code, log) = bed.boot_b().map(|_| ()).expect_err("recover");
    assert_eq!(code, Some(3), "{log}");
}

#[test]
fn a_switchlet_is_recovered_from_a_peer_node_over_its_sa() {
    let bed = Bed::new("peer");
    // Node a serves the repository to its peers; b recovers only from a,
    // over a client SA (Noise XX) opened with b's recovery key, which a
    // lists among its users.
    bed.ok(&["keys", "gen", "--name", "recovery", "--out", &bed.ps("boot")]);
    let r_pub = std::fs::read_to_string(bed.p("boot/recovery.pub")).expect("recovery.pub");
    let r_pub = anode_sec::PublicKey::parse(&r_pub).expect("recovery.pub");
    let a_cfg = bed.p("tb/a/node.toml");
    let c = std::fs::read_to_string(&a_cfg).expect("config");
    std::fs::write(&a_cfg, c.replace("[security]\n", &format!("[security]\nusers = [\"{r_pub}\"]\n"))).expect("config");
    let mut a = bed.spawn("a", &["--recovery-repo", &bed.ps("repo")]);
    a.ready().unwrap_or_else(|c| panic!("a exited {c:?}:\n{}", a.log()));
    assert_eq!(a.status()["recovery"]["serving"], true, "{}", a.status());
    let peer = format!("[\"127.0.0.1:{}\"]", bed.ports[0]);
    bed.settings(&[
        ("mirrors", "[]"),
        ("peers", &peer),
        ("recovery_key", "\"recovery.key\""),
        ("policy", "\"recover\""),
    ]);
    let good = bed.corrupt(&bed.module());
    // `anode boot verify --peer` (the operator's tool, as b's key).
    let out = bed.ok(&[
        "boot",
        "verify",
        "--boot",
        &bed.ps("boot"),
        "--config",
        &bed.ps("tb/b/node.toml"),
        "--peer",
        &format!("127.0.0.1:{}", bed.ports[0]),
        "--peer-as",
        &bed.ps("boot/recovery.key"),
        "--peer-key",
        &bed.ps("tb/keys/a.pub"),
        "--no-mirrors",
    ]);
    assert!(
        out.contains(&format!("recovered b/switchlets/mods/channel.wasm from peer 127.0.0.1:{}", bed.ports[0])),
        "{out}"
    );
    // A peer serving a bad copy: the copy fails verification, recover
    // refuses to start, nothing is stored.
    let repo_copy = bed.p("repo/targets/b/switchlets/mods/channel.wasm");
    let repo_good = bed.corrupt(&repo_copy);
    let (code, log) = bed.boot_b().map(|_| ()).expect_err("a bad copy from the peer");
    assert_eq!(code, Some(3), "{log}");
    assert!(log.contains("boot chain refused") && log.contains("channel.wasm"), "{log}");
    assert_ne!(std::fs::read(bed.module()).expect("module"), good, "nothing stored");
    std::fs::write(&repo_copy, repo_good).expect("restore the repository");
    // The node itself, at start, as its recovery key.
    let n = bed.boot_b().unwrap_or_else(|(c, log)| panic!("exit {c:?}:\n{log}"));
    let st = n.status();
    assert!(verdicts(&st).contains(&("b/switchlets/mods/channel.wasm".into(), "recovered".into())), "{st}");
    assert_eq!(st["modules"]["loads"].as_u64(), Some(1), "{}", st["modules"]);
    assert_eq!(std::fs::read(bed.module()).expect("module"), good);
    let served = a.status()["recovery"]["served"].as_u64().unwrap_or(0);
    let chunks = good.len().div_ceil(1024) as u64;
    assert!(served >= 3 * chunks, "a served {served} requests for three fetches of {chunks} chunks");
}

#[test]
fn the_node_uses_the_verified_bytes_not_a_file_swapped_after_verification() {
    let bed = Bed::new("swap");
    let cfg = bed.p("tb/b/node.toml");
    let nb = bed.verify_b();
    // Swapped after verification: another address, another module, another key.
    let good = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(&cfg, good.replace("10.0.0.2", "10.0.0.9")).expect("swap config");
    std::fs::write(bed.module(), b"not wasm").expect("swap module");
    std::fs::copy(bed.p("tb/keys/a.key"), bed.p("tb/keys/b.key")).expect("swap key");
    let files = anode_daemon::StartFiles::Chain(&nb);
    let loaded = anode_daemon::load_config_from(&cfg, files).expect("config from the chain");
    assert_eq!(loaded.config.address.to_string(), "10.0.0.2");
    let opts = anode_daemon::Options { boot: Some(std::sync::Arc::new(nb)), ..Default::default() };
    let d = anode_daemon::Daemon::bind(&loaded.config, loaded.topology.as_ref(), &opts).expect("bind");
    let st = d.node().security_json().expect("security");
    let b_pub = std::fs::read_to_string(bed.p("tb/keys/b.pub")).expect("b.pub");
    let fp = anode_sec::PublicKey::parse(b_pub.trim()).expect("b.pub").fingerprint().to_string();
    assert_eq!(st["identity"].as_str(), Some(fp.as_str()), "the verified key, not the swapped one");
    assert_eq!(d.node().modules_json().expect("modules")["loads"].as_u64(), Some(1), "the verified module");
    // Without the chain a plain start reads the swapped files.
    let e = anode_daemon::load_config(&cfg).expect_err("10.0.0.9 is not in the topology");
    assert!(e.to_string().contains("10.0.0.9"), "{e}");
}

#[test]
fn monitoring_modules_at_start_are_the_verified_bytes_of_layer_5() {
    let bed = Bed::new("monitor");
    // b also runs a monitoring module on its tap at start: `boot sign` puts
    // it in layer 5 and its credential in the keys layer, from the config.
    let code = std::fs::read(modules_dir().join("mon-count.wasm")).expect("mon-count.wasm (run scripts/setup)");
    std::fs::write(bed.p("tb/mods/count.wasm"), &code).expect("module");
    bed.ok(&[
        "monitor",
        "credential",
        "issue",
        "--admin-key",
        &bed.ps("tb/keys/admin.key"),
        "--principal",
        &bed.ps("tb/keys/a.pub"),
        "--read",
        "ts,ip.proto,ip.len",
        "--export",
        "records",
        "--expires-in",
        "1h",
        "-o",
        &bed.ps("tb/mods/count.cred"),
    ]);
    let admin = std::fs::read_to_string(bed.p("tb/keys/admin.pub")).expect("admin.pub");
    let cfg = bed.p("tb/b/node.toml");
    let c = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(
        &cfg,
        format!(
            "{c}\n[monitor]\nenabled = true\nadmin_key = \"{}\"\n[[monitor.load]]\nfile = \"../mods/count.wasm\"\n\
             credential = \"../mods/count.cred\"\nname = \"count\"\n",
            admin.trim()
        ),
    )
    .expect("config");
    let out = bed.sign_b();
    assert!(out.contains("monitor"), "{out}");
    let nb = bed.verify_b();
    // Swapped after verification: the daemon loads the verified bytes.
    std::fs::write(bed.p("tb/mods/count.wasm"), b"not wasm").expect("swap module");
    let d = bed.bind_b(nb);
    let tap = d.node().tap_json();
    assert_eq!(tap["modules"].as_array().map(Vec::len), Some(1), "the verified module is on the tap: {tap}");
    drop(d);
    // Without the chain the swapped file is read, and refused.
    let e = bed.bind_b_without_chain();
    assert!(e.to_string().contains("count.wasm"), "{e}");
}

#[test]
fn pods_at_start_are_the_verified_bytes_of_layer_5() {
    let bed = Bed::new("pods");
    // b loads a pod at start: `boot sign` puts it in layer 5 and its
    // credential in the keys layer, from the config.
    let pod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/pod_load/seed-0.wasm");
    std::fs::create_dir_all(bed.p("tb/mods")).expect("mods");
    std::fs::copy(&pod, bed.p("tb/mods/vault.wasm")).expect("pod");
    bed.ok(&[
        "cred",
        "issue",
        "--admin-key",
        &bed.ps("tb/keys/admin.key"),
        "--principal",
        &bed.ps("tb/keys/a.pub"),
        "--kind",
        "module",
        "--module",
        &bed.ps("tb/mods/vault.wasm"),
        "--interface",
        "pod",
        "-o",
        &bed.ps("tb/mods/vault.cred"),
    ]);
    let cfg = bed.p("tb/b/node.toml");
    let c = std::fs::read_to_string(&cfg).expect("config");
    assert!(c.contains("[modules]"), "the testbed gives b a [modules] section: {c}");
    std::fs::write(
        &cfg,
        format!("{c}\n[[modules.pod]]\nfile = \"../mods/vault.wasm\"\ncredential = \"../mods/vault.cred\"\nname = \"vault\"\n"),
    )
    .expect("config");
    let out = bed.sign_b();
    assert!(out.contains("vault.wasm"), "{out}");
    let nb = bed.verify_b();
    // Swapped after verification: the daemon loads the verified bytes.
    std::fs::write(bed.p("tb/mods/vault.wasm"), b"not wasm").expect("swap pod");
    let d = bed.bind_b(nb);
    let list = d.node().modules_list_json();
    let pods = list.as_array().map(|a| a.iter().filter(|m| m["kind"] == "pod").count());
    assert_eq!(pods, Some(1), "the verified pod is loaded: {list}");
    drop(d);
    // Without the chain the swapped file is read, and refused.
    let e = bed.bind_b_without_chain();
    assert!(e.to_string().contains("vault.wasm"), "{e}");
}
