//! `anode testbed`: the configs it writes for every shipped topology, its
//! errors, and a real `up`/`status`/`down` of a 4-node line on loopback.

mod common;

use anode_node::config::{InterfaceConfig, NodeConfig, Topology};
use common::{ANODE, Scratch, text};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TOPOLOGIES: [&str; 4] = ["line4", "ring5", "star5", "tree7"];

fn topology_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/topologies").join(format!("{name}.toml"))
}

fn anode(args: &[&str], dir: &Path) -> Output {
    Command::new(ANODE).args(args).arg("--dir").arg(dir).output().expect("run anode")
}

fn read_config(dir: &Path, name: &str) -> NodeConfig {
    let p = dir.join(name).join("node.toml");
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    NodeConfig::from_toml(&t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn iface<'a>(c: &'a NodeConfig, name: &str) -> &'a InterfaceConfig {
    c.interfaces.iter().find(|i| i.name == name).unwrap_or_else(|| panic!("{} has no interface {name}", c.address))
}

/// Checks the configs `up --configs-only` wrote for `topo` into `dir`.
fn check_configs(topo_name: &str, topo: &Topology, dir: &Path) {
    let copy = std::fs::read_to_string(dir.join("topology.toml")).expect("topology copy");
    assert_eq!(&Topology::from_toml(&copy).expect("copy parses"), topo, "{topo_name}: the copy is the topology");
    let mut listens = BTreeSet::new();
    for n in &topo.nodes {
        let c = read_config(dir, &n.name);
        assert_eq!(c.address, n.address, "{topo_name}/{}", n.name);
        assert_eq!(c.run_dir.as_deref(), Some(dir.join(&n.name).as_path()));
        assert_eq!(c.routes.topology.as_deref(), Some(dir.join("topology.toml").as_path()));
        assert_eq!(
            c.interfaces.len(),
            topo.neighbors(n.address).len(),
            "{topo_name}/{}: one interface per link",
            n.name
        );
        for i in &c.interfaces {
            assert!(listens.insert(i.listen), "{topo_name}: listen address {} used twice", i.listen);
            assert_eq!(i.neighbors.len(), 1);
        }
    }
    // Every link is symmetric: x's interface toward y sends to y's interface
    // toward x, and the other way round.
    for l in &topo.links {
        let (x, y) = (read_config(dir, &l.a), read_config(dir, &l.b));
        let (xy, yx) = (iface(&x, &l.b), iface(&y, &l.a));
        assert_eq!(xy.neighbors[0].address, y.address, "{topo_name}: {}-{}", l.a, l.b);
        assert_eq!(yx.neighbors[0].address, x.address, "{topo_name}: {}-{}", l.a, l.b);
        assert_eq!(xy.neighbors[0].endpoint, yx.listen, "{topo_name}: {} sends to {}", l.a, l.b);
        assert_eq!(yx.neighbors[0].endpoint, xy.listen, "{topo_name}: {} sends to {}", l.b, l.a);
    }
}

#[test]
fn shipped_topologies_give_valid_symmetric_configs() {
    for name in TOPOLOGIES {
        let path = topology_path(name);
        let topo = Topology::from_toml(&std::fs::read_to_string(&path).expect("read")).expect("valid topology");
        // Every node reaches every other (the examples are connected).
        for n in &topo.nodes {
            assert_eq!(topo.next_hops(n.address).expect("routes").len(), topo.nodes.len() - 1, "{name}: connected");
        }
        let path = path.to_str().expect("utf-8 path");

        let lo = Scratch::new("tbtest", &format!("cfg-{name}"));
        let o = anode(&["testbed", "up", path, "--configs-only"], &lo.0);
        assert!(o.status.success(), "{name}: {}", text(&o));
        check_configs(name, &topo, &lo.0);
        for n in &topo.nodes {
            for i in &read_config(&lo.0, &n.name).interfaces {
                assert!(i.listen.ip().is_loopback(), "{name}: loopback mode listens on 127.0.0.1");
            }
        }

        let ns = Scratch::new("tbtest", &format!("netns-{name}"));
        let o = anode(&["testbed", "up", path, "--netns", "--configs-only"], &ns.0);
        assert!(o.status.success(), "{name}: {}", text(&o));
        check_configs(name, &topo, &ns.0);
        let script = std::fs::read_to_string(ns.0.join("netns.sh")).expect("netns.sh");
        let n = topo.nodes.len();
        assert_eq!(script.lines().filter(|l| l.starts_with("ip netns add anode-")).count(), n);
        assert_eq!(script.lines().filter(|l| l.contains(" type veth ")).count(), topo.links.len());
        assert_eq!(script.lines().filter(|l| l.contains(" route add ")).count(), n * (n - 1), "{name}: full routes");
    }
}

#[test]
fn bad_topologies_are_refused_with_the_reason() {
    let s = Scratch::new("tbtest", "bad");
    let cases = [
        (
            "unknown.toml",
            "node = [{ name = \"a\", address = \"10.0.0.1\" }]\nlink = [{ a = \"a\", b = \"z\" }]\n",
            "\"z\"",
        ),
        ("syntax.toml", "node = [{ name = \"a\", address = \"10.0.0.1\" }\n", "line 1"),
        ("address.toml", "node = [{ name = \"a\", address = \"10.0.0.256\" }]\n", "invalid"),
        (
            "twice.toml",
            "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.2\" }]\n\
             link = [{ a = \"a\", b = \"b\" }, { a = \"b\", b = \"a\" }]\n",
            "listed twice",
        ),
        ("alone.toml", "node = [{ name = \"a\", address = \"10.0.0.1\" }]\n", "no links"),
    ];
    for (file, body, why) in cases {
        let p = s.0.join(file);
        std::fs::write(&p, body).expect("write");
        let o = anode(&["testbed", "up", p.to_str().expect("utf-8")], &s.0.join("tb"));
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{file}: {t}");
        assert!(t.contains(file) && t.contains(why), "{file}: expected the file and {why:?} in: {t}");
    }
    let o = anode(&["testbed", "up", "/nonexistent/topology.toml"], &s.0.join("tb"));
    assert!(!o.status.success() && text(&o).contains("/nonexistent/topology.toml"), "{}", text(&o));
}

/// Whether `pid` is still a live process (zombies count as gone: they have
/// exited and hold nothing).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()) != Some('Z'),
        Err(_) => false,
    }
}

#[test]
fn line4_up_status_down_leaves_no_process() {
    let s = Scratch::new("tbtest", "live");
    let line4 = topology_path("line4");
    let line4 = line4.to_str().expect("utf-8");
    let o = anode(&["testbed", "up", line4], &s.0);
    let t = text(&o);
    assert!(o.status.success(), "up failed: {t}");
    assert!(t.contains("anode ping 10.0.0.4 --run-dir") && t.contains("10.0.0.3"), "{t}");

    let names = ["a", "b", "c", "d"];
    let pids: Vec<u32> = names
        .iter()
        .map(|n| {
            let p = std::fs::read_to_string(s.0.join(n).join("pid")).expect("pid file");
            p.trim().parse().expect("pid")
        })
        .collect();
    assert!(pids.iter().all(|p| alive(*p)), "every node runs");
    for n in names {
        assert!(s.0.join(n).join("app.sock").exists(), "{n} has its socket");
    }

    let o = anode(&["testbed", "status"], &s.0);
    assert!(o.status.success() && text(&o).contains("4 of 4 nodes running"), "{}", text(&o));

    // A second testbed in the same directory is refused, with the way out.
    let o = anode(&["testbed", "up", line4], &s.0);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("already running") && t.contains("testbed down"), "{t}");

    let o = anode(&["testbed", "down"], &s.0);
    assert!(o.status.success() && text(&o).contains("stopped 4 node(s)"), "{}", text(&o));
    let still: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(still.is_empty(), "processes left after down: {still:?}");
    for n in names {
        assert!(!s.0.join(n).join("pid").exists(), "{n}'s pid file is removed");
    }
    let o = anode(&["testbed", "status"], &s.0);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("0 of 4 nodes running"), "{}", text(&o));
}

/// Issue 4's multicast example on real daemons: one SNAP packet injected at
/// the root of the 7-node tree floods it; every other node delivers the
/// payload exactly once, with one network operation per interface.
#[test]
fn tree_multicast_reaches_every_node_once() {
    let s = Scratch::new("tbtest", "tree");
    let tree7 = topology_path("tree7");
    let tree7 = tree7.to_str().expect("utf-8");
    let o = anode(&["testbed", "up", tree7], &s.0);
    assert!(o.status.success(), "up: {}", text(&o));
    let nodes = ["b", "c", "d", "e", "f", "g"];
    let receivers: Vec<_> = nodes
        .iter()
        .map(|n| {
            Command::new(ANODE)
                .args(["recv", "7100", "--count", "2", "--timeout", "3", "--run-dir"])
                .arg(s.0.join(n))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn recv")
        })
        .collect();
    // Let every receiver register its port before the packet goes out.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for n in nodes {
        loop {
            let st = Command::new(ANODE).args(["status", "--json", "--run-dir"]).arg(s.0.join(n)).output();
            let ready = st.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("7100"));
            if ready || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let m = Command::new(ANODE)
        .args(["multicast", "--tree", "--port", "7100", "hello tree", "--run-dir"])
        .arg(s.0.join("a"))
        .output()
        .expect("multicast");
    assert!(m.status.success(), "multicast: {}", text(&m));
    for (n, r) in nodes.iter().zip(receivers) {
        // --count 2 with a 3 s timeout: exactly one copy arrives, so recv
        // ends on the timeout having received one packet.
        let o = r.wait_with_output().expect("recv");
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out, "hello tree", "node {n} received {out:?}; {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("in 1 packets"), "node {n}: {}", text(&o));
    }
}
