//! `anode cred` end to end, for each kind: issue → show → attenuate → show,
//! then the attenuated credential decided by the node's own verifiers with
//! the narrower limits; and the errors an operator meets.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anode_cred::{
    CodeInfo, CredError, InterfaceSet, LoadRequest, PrincipalId, RequestedLimits, RootKey, SessionRequest, Verifier,
    VerifierConfig,
};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

fn anode(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(ANODE).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

fn ok(args: &[&str]) -> String {
    let (ok, out, err) = anode(args);
    assert!(ok, "anode {args:?} failed:\n{out}\n{err}");
    out
}

fn fails(args: &[&str]) -> String {
    let (ok, out, err) = anode(args);
    assert!(!ok, "anode {args:?} should fail:\n{out}");
    err
}

fn p(d: &Path, f: &str) -> String {
    d.join(f).to_string_lossy().into()
}

fn public(d: &Path, name: &str) -> anode_sec::PublicKey {
    anode_sec::PublicKey::parse(&std::fs::read_to_string(d.join(format!("{name}.pub"))).unwrap()).unwrap()
}

fn root(d: &Path) -> RootKey {
    anode_cred::root_key_from_ed25519(public(d, "admin").as_bytes()).unwrap()
}

fn setup(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("anode-cred-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let ds = d.to_string_lossy().to_string();
    ok(&["keys", "gen", "--out", &ds, "--name", "admin"]);
    ok(&["keys", "gen", "--out", &ds, "--name", "alice"]);
    ok(&["keys", "gen", "--out", &ds, "--name", "mallory"]);
    d
}

#[test]
fn session_credential_issue_show_attenuate_show() {
    let d = setup("session");
    let (cred, narrow) = (p(&d, "s.cred"), p(&d, "s2.cred"));
    let out = ok(&[
        "cred",
        "issue",
        "--admin-key",
        &p(&d, "admin.key"),
        "--principal",
        &p(&d, "alice.pub"),
        "--kind",
        "session",
        "--vp-share",
        "30%",
        "--total-share",
        "50%",
        "--vps",
        "4",
        "--extra",
        "--heap",
        "64MiB",
        "--tx",
        "10Mbit/s",
        "--rx",
        "125kB/s",
        "--pools",
        "8",
        "--queued",
        "2048",
        "--expires",
        "2h",
        "-o",
        &cred,
    ]);
    assert!(out.contains("session credential for"), "{out}");
    let out = ok(&["cred", "show", &cred, "--admin-pub", &p(&d, "admin.pub")]);
    for want in [
        "signature: chains to the administrator key",
        "kind(\"session\");",
        "ceiling(\"vp_share\", 300000);",
        "check if time($t), $t <",
        "kind: session credential",
        "ceiling: one VP: at most 30 % (300000 ppm)",
        "ceiling: all its VPs together: at most 50 % (500000 ppm)",
        "ceiling: VPs: at most 4; slack beyond the guarantee: allowed",
        "ceiling: heap: at most 64 MiB",
        "ceiling: transmit: at most 10 Mbit/s (1250000 bytes/s)",
        "ceiling: receive: at most 1 Mbit/s (125000 bytes/s)",
        "pools: at most 8; queued events: at most 2048",
        "decision now: a session may open",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(out.contains("(in 119m)") || out.contains("(in 2h)"), "{out}");
    let out = ok(&[
        "cred",
        "attenuate",
        &cred,
        "--key",
        &p(&d, "alice.pub"),
        "--vp-share",
        "4ms/40ms",
        "--no-extra",
        "--heap",
        "8MiB",
        "--expires",
        "30m",
        "-o",
        &narrow,
    ]);
    assert!(out.contains("session credential with 2 blocks"), "{out}");
    let out = ok(&["cred", "show", &narrow, "--admin-pub", &p(&d, "admin.pub")]);
    for want in [
        "block 1 (attenuation appended by a holder: only its checks count):",
        "check if vp_share($v), $v <= 100000;",
        "check if extra(false);",
        "one VP's CPU share at most 10 % (100000 ppm)",
        "heap reservation at most 8 MiB",
        "no slack for any VP",
        "one VP: at most 10 % (100000 ppm)",
        "VPs: at most 4; slack beyond the guarantee: no",
        "heap: at most 8 MiB",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(out.contains("(in 29m)") || out.contains("(in 30m)"), "{out}");
    // The node's verifier grants the narrower ceilings and refuses above them.
    let bytes = std::fs::read(&narrow).unwrap();
    let alice = PrincipalId(*public(&d, "alice").as_bytes());
    let mut v = Verifier::new(root(&d), VerifierConfig::default());
    let now = SystemTime::now();
    let g = v.authorize_session(now, &bytes, alice, &SessionRequest::default()).unwrap();
    assert_eq!(g.ceilings.max_vp_share_ppm, 100_000);
    assert_eq!(g.ceilings.max_total_share_ppm, 500_000);
    assert_eq!(g.ceilings.max_heap_bytes, 8 << 20);
    assert!(!g.ceilings.extra);
    assert!(g.recheck_at.unwrap() < now + std::time::Duration::from_secs(1801));
    let r = SessionRequest { vp_share_ppm: 200_000, total_share_ppm: 200_000, vps: 1, ..Default::default() };
    assert_eq!(
        v.authorize_session(now, &bytes, alice, &r).unwrap_err(),
        CredError::LimitExceeded { resource: "vp_share", requested: 200_000, allowed: 100_000 }
    );
    // The original still allows it.
    v.authorize_session(now, &std::fs::read(&cred).unwrap(), alice, &r).unwrap();
    // An attenuation that narrows nothing is refused, saying why.
    let err = fails(&["cred", "attenuate", &narrow, "--heap", "1GiB", "-o", &p(&d, "s3.cred")]);
    assert!(err.contains("would not narrow anything: --heap 1 GiB (already at most 8 MiB)"), "{err}");
    assert!(!d.join("s3.cred").exists());
    let err = fails(&["cred", "attenuate", &narrow, "-o", &p(&d, "s3.cred")]);
    assert!(err.contains("nothing to narrow"), "{err}");
    let err = fails(&["cred", "attenuate", &narrow, "--extra", "-o", &p(&d, "s3.cred")]);
    assert!(err.contains("attenuation can only narrow"), "{err}");
    // Someone else's credential, and another administrator's key.
    let err = fails(&["cred", "attenuate", &narrow, "--key", &p(&d, "mallory.pub"), "--vps", "1", "-o", &p(&d, "x")]);
    assert!(err.contains("not to --key"), "{err}");
    let (good, out, _) = anode(&["cred", "show", &narrow, "--admin-pub", &p(&d, "mallory.pub")]);
    assert!(!good && out.contains("signature: does NOT chain to the administrator key"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn module_credential_issue_show_attenuate_show() {
    let d = setup("module");
    std::fs::write(d.join("m.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let (cred, narrow) = (p(&d, "m.cred"), p(&d, "m2.cred"));
    ok(&[
        "cred",
        "issue",
        "--admin-key",
        &p(&d, "admin.key"),
        "--principal",
        &p(&d, "alice.pub"),
        "--kind",
        "module",
        "--module",
        &p(&d, "m.wasm"),
        "--local",
        "fwd",
        "--interface",
        "log,net,time",
        "--memory",
        "16MiB",
        "--cpu",
        "500000",
        "--expires",
        "2099-01-01T00:00:00Z",
        "-o",
        &cred,
    ]);
    let code = CodeInfo::inspect(b"\0asm\x01\0\0\0").unwrap();
    let out = ok(&["cred", "show", &cred]);
    for want in [
        "signature: not checked (give --admin-pub to check it)",
        "kind(\"module\");",
        &format!("may load the code with hash {}", code.hash.to_hex()),
        "may install code under its own name fwd",
        "its modules may import: log, net, time",
        "limits: memory 16 MiB, 500000 fuel per invocation, soft state 64 KiB",
        "expires 2099-01-01T00:00:00Z",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    ok(&["cred", "attenuate", &cred, "--memory", "4MiB", "--interface", "log", "--cpu", "1000", "-o", &narrow]);
    let out = ok(&["cred", "show", &narrow, "--admin-pub", &p(&d, "admin.pub")]);
    for want in [
        "check if memory($v), $v <= 4194304;",
        "module memory at most 4 MiB",
        "only modules importing no more than: log",
        "limits: memory 4 MiB, 1000 fuel per invocation, soft state 64 KiB",
        "interfaces: log",
        "signature: chains to the administrator key",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let bytes = std::fs::read(&narrow).unwrap();
    let mut v = Verifier::new(root(&d), VerifierConfig::default());
    let req = |memory: u64, interfaces| LoadRequest {
        credential: Some(&bytes),
        requester: None,
        code: &code,
        local_name: None,
        interfaces,
        limits: RequestedLimits { memory: Some(memory), cpu: Some(1000), state: None },
    };
    let g = v.authorize(SystemTime::now(), &req(4 << 20, InterfaceSet::of(&[anode_cred::Interface::Log]))).unwrap();
    assert_eq!(g.limits.memory, 4 << 20);
    assert!(matches!(
        v.authorize(SystemTime::now(), &req(8 << 20, InterfaceSet::EMPTY)).unwrap_err(),
        CredError::CheckFailed { .. }
    ));
    assert!(matches!(
        v.authorize(SystemTime::now(), &req(1 << 20, InterfaceSet::of(&[anode_cred::Interface::Net]))).unwrap_err(),
        CredError::CheckFailed { .. }
    ));
    let err = fails(&["cred", "attenuate", &narrow, "--memory", "4MiB", "-o", &p(&d, "x")]);
    assert!(err.contains("would not narrow anything"), "{err}");
    let err = fails(&["cred", "attenuate", &narrow, "--vps", "1", "-o", &p(&d, "x")]);
    assert!(err.contains("--vps applies to session credentials only, and this is a module credential"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn monitoring_credential_issue_show_attenuate_show() {
    let d = setup("monitor");
    let (cred, narrow) = (p(&d, "mon.cred"), p(&d, "mon2.cred"));
    ok(&[
        "cred",
        "issue",
        "--admin-key",
        &p(&d, "admin.key"),
        "--principal",
        &p(&d, "alice.pub"),
        "--kind",
        "monitor",
        "--read",
        "ts,ip.src,ip.dst",
        "--budget",
        "50000",
        "--export",
        "records,packets",
        "--expires",
        "1h",
        "-o",
        &cred,
    ]);
    let out = ok(&["cred", "show", &cred, "--admin-pub", &p(&d, "admin.pub")]);
    for want in [
        "right(\"monitor\");",
        "kind: monitor credential",
        "may read field ip.src",
        "limit budget, 50000",
        "may export packets",
        "decision now: a monitoring module may run: 3 readable fields",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    ok(&["cred", "attenuate", &cred, "--read", "ts", "--budget", "10000", "--export", "records", "-o", &narrow]);
    let out = ok(&["cred", "show", &narrow, "--admin-pub", &p(&d, "admin.pub")]);
    for want in [
        "narrow_read({\"ts\"});",
        "narrows: narrow_limit(\"budget\", 10000)",
        "decision now: a monitoring module may run: 1 readable fields, payload 0, limits budget 10000 fuel/packet, export records true, packets false",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let pol =
        anode_monitor::PolicyVerifier::new(root(&d)).authorize(SystemTime::now(), &std::fs::read(&narrow).unwrap());
    let pol = pol.unwrap();
    assert_eq!(pol.limits.budget, 10_000);
    assert_eq!(pol.fields.count_ones(), 1);
    assert!(!pol.export.packets);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn useful_errors() {
    let d = setup("errors");
    std::fs::write(d.join("junk"), b"not a token").unwrap();
    let err = fails(&["cred", "show", &p(&d, "junk")]);
    assert!(err.contains("not a credential"), "{err}");
    let err = fails(&["cred", "show", &p(&d, "missing")]);
    assert!(err.contains("reading"), "{err}");
    let base = ["cred", "issue", "--principal", "00", "--kind", "session", "-o"];
    let err = fails(&[&base[..], &[&p(&d, "x"), "--admin-key", &p(&d, "alice.pub")]].concat());
    assert!(err.contains("not an administrator secret key"), "{err}");
    let admin = p(&d, "admin.key");
    let alice = p(&d, "alice.pub");
    let x = p(&d, "x");
    let issue = |extra: &[&str]| {
        let mut a = vec!["cred", "issue", "--admin-key", &admin, "--principal", &alice, "-o", &x];
        a.extend_from_slice(extra);
        fails(&a)
    };
    assert!(issue(&["--kind", "session", "--memory", "1MiB"]).contains("--memory applies to module and monitoring"));
    assert!(issue(&["--kind", "module"]).contains("a module credential names its modules"));
    assert!(issue(&["--kind", "session", "--vp-share", "150%"]).contains("more than one CPU"));
    assert!(
        issue(&["--kind", "session", "--vp-share", "30%", "--total-share", "20%"])
            .contains("one VP could never get it")
    );
    assert!(
        issue(&["--kind", "session", "--expires", "soon"]).contains("a duration (90m, 12h, 30d) or an RFC 3339 date")
    );
    assert!(issue(&["--kind", "module", "--local", "x", "--interface", "teleport"]).contains("unknown interface"));
    let (good, out, _) = anode(&["cred", "issue", "--help"]);
    assert!(good && out.contains("Session credentials (--kind session)") && out.contains("4ms/40ms"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn module_credential_with_channel_grants() {
    let d = setup("channels");
    std::fs::write(d.join("m.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let cred = p(&d, "c.cred");
    let issue = |extra: &[&str], out: &str| {
        let mut a = vec!["cred", "issue", "--admin-key"];
        let (admin, alice, wasm) = (p(&d, "admin.key"), p(&d, "alice.pub"), p(&d, "m.wasm"));
        a.extend_from_slice(&[
            admin.as_str(),
            "--principal",
            alice.as_str(),
            "--kind",
            "module",
            "--module",
            wasm.as_str(),
        ]);
        a.extend_from_slice(&["--interface", "net"]);
        a.extend_from_slice(extra);
        a.extend_from_slice(&["-o", out]);
        anode(&a)
    };
    let (good, _, err) = issue(&["--channel", "5000-5099@10.0.1.0/24", "--channel", "7"], &cred);
    assert!(good, "{err}");
    let out = ok(&["cred", "show", &cred]);
    for want in [
        "channel(\"5000-5099\", \"10.0.1.0/24\");",
        "its modules may open receive channels only for: port(s) 5000-5099 from 10.0.1.0/24; port(s) 7 from *",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // Malformed grants are refused at issue, with the reason.
    for (bad, why) in [("5-4@*", "bad channel ports"), ("5@10.0.0.1/24", "host bits"), ("5@any", "bad channel source")]
    {
        let (good, _, err) = issue(&["--channel", bad], &p(&d, "x.cred"));
        assert!(!good && err.contains(why), "{bad}: {err}");
    }
    // Attenuation cannot add one.
    let err = fails(&["cred", "attenuate", &cred, "--channel", "1@*", "-o", &p(&d, "y.cred")]);
    assert!(err.contains("channel grants are issued"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
