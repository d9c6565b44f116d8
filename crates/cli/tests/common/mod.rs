//! Helpers shared by the integration tests that start real daemons.
#![allow(dead_code)]

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `n` distinct free UDP ports on 127.0.0.1: bound together so they differ,
/// then released for the daemons to take.
pub fn free_ports(n: usize) -> Vec<u16> {
    let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind")).collect();
    socks.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

/// The `[[interface]]` sections of the line 10.0.0.1 – 10.0.0.2 – 10.0.0.3 on
/// loopback, one string per node, from four ports: node 1 east, node 2
/// west, node 2 east, node 3 west.
pub fn line3_interfaces(p: &[u16]) -> [String; 3] {
    let iface = |name: &str, listen: u16, nbr: u8, endpoint: u16| {
        format!(
            "[[interface]]\nname = \"{name}\"\nlisten = \"127.0.0.1:{listen}\"\n\
             neighbors = [{{ address = \"10.0.0.{nbr}\", endpoint = \"127.0.0.1:{endpoint}\" }}]\n"
        )
    };
    [
        iface("east", p[0], 2, p[1]),
        format!("{}{}", iface("west", p[1], 1, p[0]), iface("east", p[2], 3, p[3])),
        iface("west", p[3], 2, p[2]),
    ]
}

/// The `anode` binary under test.
pub const ANODE: &str = env!("CARGO_BIN_EXE_anode");

/// Three nodes in a line: a – b – c.
pub const LINE3: &str = r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }, { name = "c", address = "10.0.0.3" }]
link = [{ a = "a", b = "b" }, { a = "b", b = "c" }]
"#;

/// A scratch directory `<tmp>/anode-<kind>-<pid>-<tag>`; a testbed goes in
/// its `tb/` (or in the directory itself). Dropping it brings down any
/// testbed in either place, then removes the directory.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(kind: &str, tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("anode-{kind}-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(std::fs::canonicalize(&p).expect("canonical"))
    }

    /// The testbed directory.
    pub fn tb(&self) -> PathBuf {
        self.0.join("tb")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for d in [self.tb(), self.0.clone()] {
            let _ = Command::new(ANODE).args(["testbed", "down", "--dir"]).arg(d).output();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// stdout and stderr of a finished command.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `anode status --json` of the node whose run directory is `dir`.
pub fn status(dir: &Path) -> serde_json::Value {
    let o = Command::new(ANODE).args(["status", "--json", "--run-dir"]).arg(dir).output().expect("anode status");
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("status JSON")
}

/// `anode testbed up` of [`LINE3`] into `s.tb()`, with `args` added.
pub fn up_line3(s: &Scratch, args: &[&str]) {
    let topo = s.0.join("line3.toml");
    std::fs::write(&topo, LINE3).expect("topology");
    let o = Command::new(ANODE).args(["testbed", "up"]).arg(&topo).args(args).arg("--dir").arg(s.tb()).output();
    let o = o.expect("anode testbed up");
    assert!(o.status.success(), "{}", text(&o));
}

/// The first interface's listen address in a testbed node's `node.toml`.
pub fn first_listen(node_dir: &Path) -> String {
    let cfg = std::fs::read_to_string(node_dir.join("node.toml")).expect("node.toml");
    cfg.lines().find_map(|l| l.strip_prefix("listen = \"")).expect("a listen line").trim_end_matches('"').to_string()
}
