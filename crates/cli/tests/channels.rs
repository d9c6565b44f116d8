//! Module channels on the node's real packet path (issue 13): a UDP-like
//! service module on one node answers requests sent by `anode send` from
//! another node, whether it was loaded over the network or from the
//! configuration at start (both through the core).
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::Interface;
use common::{
    ANODE, Line, Scratch, first_listen, issue_credential, module, modules_dir, status, text, up_line3, user_keys,
};
use std::io::Write;
use std::process::{Command, Stdio};

const IFACES: [Interface; 4] = [Interface::Net, Interface::State, Interface::Time, Interface::Log];

/// `anode send` from node `from` of `run_dirs` to 10.0.0.3:4000, with
/// `anode recv 4001` listening on `from`: what came back.
fn ask(recv_dir: &std::path::Path, send_dir: &std::path::Path, message: &[u8]) -> String {
    let mut rx = Command::new(ANODE)
        .args(["recv", "4001", "--count", "1", "--timeout", "2", "--run-dir"])
        .arg(recv_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has registered its port.
    let mut err = std::io::BufReader::new(rx.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    let mut tx = Command::new(ANODE)
        .args(["send", "10.0.0.3", "4000", "--run-dir"])
        .arg(send_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tx.stdin.take().unwrap().write_all(message).unwrap();
    let o = tx.wait_with_output().unwrap();
    assert!(o.status.success(), "send: {}", text(&o));
    let o = rx.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_module_loaded_over_the_network_answers_through_its_channel() {
    let s = Scratch::new("channels", "net");
    let (ukey, upub) = user_keys(&s.0.join("user"), "u");
    up_line3(&s, &["--user", upub.to_str().unwrap()]);
    let user = anode_sec::Identity::load(&ukey).unwrap();
    let code = module("channel");
    let cred = s.0.join("channel.cred");
    let admin = s.tb().join("keys").join("admin.key");
    std::fs::write(&cred, issue_credential(&admin, *user.public().as_bytes(), &code, &IFACES, None)).unwrap();
    let c = s.tb().join("c");
    let o = Command::new(ANODE)
        .args(["module", "load"])
        .arg(modules_dir().join("channel.wasm"))
        .arg("--credential")
        .arg(&cred)
        .args(["--node", &first_listen(&c), "--node-key"])
        .arg(s.tb().join("keys").join("c.pub"))
        .arg("--key")
        .arg(&ukey)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The module echoes packets that start with "hi" to their source on 4001.
    let got = ask(&s.tb().join("a"), &s.tb().join("a"), b"hi from a");
    assert_eq!(got, "hi from a", "the module's answer came back through the network");
    let st = status(&c);
    assert!(st["modules"]["channel_deliveries"].as_u64().unwrap() >= 1, "{}", st["modules"]);
    // Packets the channel's specification does not match are not the module's.
    let before = st["drops"]["no_listener"].as_u64().unwrap();
    let got = ask(&s.tb().join("a"), &s.tb().join("a"), b"bye");
    assert_eq!(got, "", "no answer for a packet the channel does not match");
    assert_eq!(status(&c)["drops"]["no_listener"].as_u64().unwrap(), before + 1);
}

#[test]
fn modules_listed_in_the_configuration_load_through_the_core() {
    let s = Scratch::new("channels", "start");
    let (admin_key, _) = user_keys(&s.0.join("admin"), "admin");
    let admin = anode_sec::Identity::load(&admin_key).unwrap();
    let code = module("channel");
    let cred = s.0.join("channel.cred");
    std::fs::write(&cred, issue_credential(&admin_key, [9; 32], &code, &IFACES, None)).unwrap();
    let modules = format!(
        "[modules]\nadmin_key = \"{}\"\nload = [{{ file = \"{}\", credential = \"{}\", name = \"echo\" }}]\n",
        admin.public(),
        modules_dir().join("channel.wasm").display(),
        cred.display()
    );
    let net = Line::start_with(["", "", &modules]);
    let st = status(&net.run_dir(3));
    assert_eq!(st["modules"]["loads"].as_u64(), Some(1), "{}", st["modules"]);
    assert!(net.log(3).contains("module loaded from the config"), "{}", net.log(3));
    let got = ask(&net.run_dir(1), &net.run_dir(1), b"hi at start");
    assert_eq!(got, "hi at start");
    // Its alarm (armed by anode_init, 100 ms) fired through the core's timers.
    let st = status(&net.run_dir(3));
    assert!(st["modules"]["alarms_fired"].as_u64().unwrap() >= 1, "{}", st["modules"]);
    // A credential that does not allow the module stops the node at start,
    // with the reason.
    let bad = s.0.join("bad.cred");
    std::fs::write(&bad, issue_credential(&admin_key, [9; 32], &code, &[Interface::Net], None)).unwrap();
    let cfg = s.0.join("bad.toml");
    std::fs::write(
        &cfg,
        format!(
            "address = \"10.0.0.9\"\nrun_dir = \"{}\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:{}\"\n\
             [modules]\nadmin_key = \"{}\"\nload = [{{ file = \"{}\", credential = \"{}\" }}]\n",
            s.0.join("run").display(),
            common::free_ports(1)[0],
            admin.public(),
            modules_dir().join("channel.wasm").display(),
            bad.display()
        ),
    )
    .unwrap();
    let o = Command::new(ANODE).args(["node", "--config"]).arg(&cfg).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("needs right"), "{}", text(&o));
}
