//! Expert pods on a running node (issue 17): `[[modules.pod]]` loads a pod
//! at start, `anode module list` shows it, and a pod whose credential does
//! not grant `pod` stops the start with the reason.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::Interface;
use common::{ANODE, Scratch, issue_credential, text, user_keys};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A test pod of the sandbox's (the fuzz seeds are the pods its tests load).
fn pod_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/pod_load/seed-0.wasm")
}

#[test]
fn a_pod_from_the_config_is_loaded_at_start_and_listed_and_a_refused_one_stops_the_start() {
    let s = Scratch::new("pods", "config");
    let (akey, apub) = user_keys(&s.0.join("admin"), "admin");
    let code = std::fs::read(pod_file()).unwrap();
    let cred = |name: &str, ifaces: &[Interface]| {
        let p = s.0.join(name);
        std::fs::write(&p, issue_credential(&akey, [7; 32], &code, ifaces, None)).unwrap();
        p
    };
    let hex = |p: &Path| std::fs::read_to_string(p).unwrap().trim().to_string();
    let pod = pod_file();
    let good = cred("pod.cred", &[Interface::Pod]);
    let modules = |cred: &Path| {
        format!(
            "[modules]\nadmin_key = \"{}\"\n[[modules.pod]]\nfile = \"{}\"\ncredential = \"{}\"\nname = \"vault\"\n",
            hex(&apub),
            pod.display(),
            cred.display()
        )
    };
    let line = common::Line::start_with(["", &modules(&good), ""]);
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(line.run_dir(2)).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pods: Vec<&serde_json::Value> = list.as_array().unwrap().iter().filter(|m| m["kind"] == "pod").collect();
    assert_eq!(pods.len(), 1, "{list}");
    assert!(line.log(2).contains("pod loaded from the config"), "{}", line.log(2));
    // The operator unloads it by its id; a second unload says there is none.
    let id = pods[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with('p'), "{id}");
    let unload =
        || Command::new(ANODE).args(["module", "unload", &id, "--run-dir"]).arg(line.run_dir(2)).output().unwrap();
    let o = unload();
    assert!(o.status.success() && text(&o).contains(&format!("unloaded {id}")), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(line.run_dir(2)).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(list.as_array().unwrap().iter().all(|m| m["kind"] != "pod"), "{list}");
    let o = unload();
    assert!(!o.status.success() && text(&o).contains("no pod"), "{}", text(&o));
    drop(line);
    // A credential without the `pod` interface: the node does not start, and says why.
    let bad = cred("nopod.cred", &[Interface::Log]);
    let o = common::node_refuses_to_start(&s.0, &modules(&bad));
    assert!(text(&o).contains("pod ") && text(&o).contains("seed-0.wasm"), "{}", text(&o));
}

/// `anode module load --pod` over the user's SA: the node loads the pod for
/// that principal and lists it; a credential without `pod` is refused with
/// the reason sent back, and a second pod of the same name is refused.
#[test]
fn a_user_loads_a_pod_over_an_authenticated_control_message() {
    let s = Scratch::new("pods", "net");
    let (ukey, upub) = user_keys(&s.0.join("user"), "u");
    common::up_line3(&s, &["--user", upub.to_str().unwrap()]);
    let user = anode_sec::Identity::load(&ukey).unwrap();
    let code = std::fs::read(pod_file()).unwrap();
    let cred = |name: &str, ifaces: &[Interface]| {
        let p = s.0.join(name);
        let bytes =
            issue_credential(&s.tb().join("keys").join("admin.key"), *user.public().as_bytes(), &code, ifaces, None);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let b = s.tb().join("b");
    let listen = common::first_listen(&b);
    let load_file = |file: &Path, cred: &Path, pod: &[&str]| {
        Command::new(ANODE)
            .args(["module", "load"])
            .arg(file)
            .arg("--credential")
            .arg(cred)
            .args(pod)
            .args(["--node", &listen, "--node-key"])
            .arg(s.tb().join("keys").join("b.pub"))
            .arg("--key")
            .arg(&ukey)
            .output()
            .unwrap()
    };
    let load_as = |cred: &Path, pod: &[&str]| load_file(&pod_file(), cred, pod);
    let load = |cred: &Path| load_as(cred, &["--pod", "vault", "--retire"]);
    let o = load(&cred("pod.cred", &[Interface::Pod]));
    assert!(o.status.success() && text(&o).contains("loaded pod p"), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&b).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pods: Vec<&serde_json::Value> = list.as_array().unwrap().iter().filter(|m| m["kind"] == "pod").collect();
    assert_eq!(pods.len(), 1, "{list}");
    let short: String = user.public().as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(pods[0]["principal"].as_str(), Some(short.as_str()), "loaded for the SA's principal: {list}");
    assert_eq!(pods[0]["on_fault"], "retire", "{list}");
    // The same name again: refused, with the reason.
    let o = load(&cred("pod2.cred", &[Interface::Pod]));
    assert!(!o.status.success() && text(&o).contains("refused"), "{}", text(&o));
    // Without the pod right: refused, with the reason, nothing more loaded.
    let o = load(&cred("nopod.cred", &[Interface::Log]));
    assert!(!o.status.success() && text(&o).contains("refused"), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&b).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().iter().filter(|m| m["kind"] == "pod").count(), 1, "{list}");
    // Rollback asked of a pod that keeps state in unexported globals: the
    // policy travels (control body on_fault 2) and the node says why not.
    let o = load_as(&cred("pod3.cred", &[Interface::Pod]), &["--pod", "vault2", "--on-fault", "rollback"]);
    assert!(!o.status.success() && text(&o).contains("cannot be rolled back"), "{}", text(&o));
    // An access list travels with the load (control body n_clients): two
    // principals, by their key files.
    let (_, other) = user_keys(&s.0.join("other"), "o");
    let o = load_as(
        &cred("pod4.cred", &[Interface::Pod]),
        &["--pod", "vault3", "--client", upub.to_str().unwrap(), "--client", other.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&b).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let clients: Vec<&serde_json::Value> =
        list.as_array().unwrap().iter().filter(|m| m["kind"] == "pod").map(|m| &m["clients"]).collect();
    assert_eq!(clients, [&serde_json::Value::Null, &serde_json::json!(2)], "{list}");
    // A key that is not one: refused before anything is sent.
    let o = load_as(&cred("pod5.cred", &[Interface::Pod]), &["--pod", "vault4", "--client", "/nonexistent.pub"]);
    assert!(!o.status.success() && text(&o).contains("--client"), "{}", text(&o));
    // A pod larger than one control datagram: its code staged in chunks
    // ahead of the pod load, which carries none (docs/modules.md).
    let mut big = code.clone();
    common::pad_wasm(&mut big, 100_000);
    let (big_file, big_cred) = (s.0.join("big-pod.wasm"), s.0.join("big-pod.cred"));
    std::fs::write(&big_file, &big).unwrap();
    let admin = s.tb().join("keys").join("admin.key");
    std::fs::write(&big_cred, issue_credential(&admin, *user.public().as_bytes(), &big, &[Interface::Pod], None))
        .unwrap();
    let o = load_file(&big_file, &big_cred, &["--pod", "vault5"]);
    assert!(
        o.status.success() && text(&o).contains("loaded pod p") && text(&o).contains("in 3 request(s)"),
        "{}",
        text(&o)
    );
}
