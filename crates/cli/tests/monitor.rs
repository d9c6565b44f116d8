//! `anode monitor` end to end: keys, a credential issued and attenuated, a
//! module run on a real capture with JSON, IPFIX and pcap exports, and trace
//! anonymization.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn anode(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(ANODE).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

fn p(d: &Path, f: &str) -> String {
    d.join(f).to_string_lossy().into()
}

#[test]
fn issue_attenuate_run_export_and_anonymize() {
    let d = std::env::temp_dir().join(format!("anode-monitor-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let ds = d.to_string_lossy().to_string();
    assert!(anode(&["keys", "gen", "--out", &ds, "--name", "admin"]).0);
    assert!(anode(&["keys", "gen", "--out", &ds, "--name", "alice"]).0);
    assert!(anode(&["monitor", "keygen", "--out", &p(&d, "pan.key")]).0);
    let (ok, _, err) = anode(&[
        "monitor",
        "credential",
        "issue",
        "--admin-key",
        &p(&d, "admin.key"),
        "--principal",
        &p(&d, "alice.pub"),
        "--read",
        "ts,ip.proto,ip.src,ip.dst,l4.sport,l4.dport,tcp.seq,tcp.flags",
        "--anonymize",
        "all",
        "--budget",
        "50000",
        "--export",
        "records",
        "--expires-in",
        "1h",
        "-o",
        &p(&d, "rtt.cred"),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = anode(&[
        "monitor",
        "credential",
        "attenuate",
        "--credential",
        &p(&d, "rtt.cred"),
        "--port",
        "80",
        "-o",
        &p(&d, "web.cred"),
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = anode(&[
        "monitor",
        "credential",
        "show",
        "--credential",
        &p(&d, "web.cred"),
        "--admin-pub",
        &p(&d, "admin.pub"),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("Port([80])") && out.contains("0.0.0.0/0"), "{out}");
    let trace = root().join("tests/traces/rtt-client-side.pcap");
    let module = root().join("modules/out/mon-rtt.wasm");
    let (ok, _, err) = anode(&[
        "monitor",
        "run",
        "--source",
        &trace.to_string_lossy(),
        "--admin-pub",
        &p(&d, "admin.pub"),
        "--module",
        &module.to_string_lossy(),
        "--credential",
        &p(&d, "web.cred"),
        "--anon-key",
        &p(&d, "pan.key"),
        "--export",
        &format!("json:{}", p(&d, "rtt.jsonl")),
        "--export",
        &format!("ipfix:{}", p(&d, "rtt.ipfix")),
        "--quiet",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("records 33 (denied 0)"), "{err}");
    let lines = std::fs::read_to_string(d.join("rtt.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 33);
    for l in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["dport"], 80);
        assert!(!v["src"].as_str().unwrap().starts_with("10.77."), "address in clear: {l}");
        assert!(v["rtt_ns"].as_u64().unwrap() > 15_000_000);
    }
    let ipfix = std::fs::read(d.join("rtt.ipfix")).unwrap();
    assert_eq!(&ipfix[..2], &[0, 10]);
    // Without the Crypto-PAn key the anonymizing credential is refused.
    let (ok, _, err) = anode(&[
        "monitor",
        "run",
        "--source",
        &trace.to_string_lossy(),
        "--admin-pub",
        &p(&d, "admin.pub"),
        "--module",
        &module.to_string_lossy(),
        "--credential",
        &p(&d, "web.cred"),
        "--quiet",
    ]);
    assert!(!ok && err.contains("anonymization"), "{err}");
    // Anonymize an address list and a pcap.
    std::fs::write(d.join("addrs"), "128.11.68.132\n10.77.1.2\n").unwrap();
    let (ok, out, err) = anode(&["monitor", "anonymize", "--key", &p(&d, "pan.key"), "--addresses", &p(&d, "addrs")]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2);
    let (ok, _, err) = anode(&[
        "monitor",
        "anonymize",
        "--key",
        &p(&d, "pan.key"),
        "--pcap",
        &trace.to_string_lossy(),
        "-o",
        &p(&d, "anon.pcap"),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("463 frames, 463 with addresses rewritten"), "{err}");
    // A key readable by others is refused.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("pan.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let (ok, _, err) = anode(&["monitor", "anonymize", "--key", &p(&d, "pan.key"), "--addresses", &p(&d, "addrs")]);
        assert!(!ok && err.contains("chmod 600"), "{err}");
    }
    std::fs::remove_dir_all(&d).ok();
}
