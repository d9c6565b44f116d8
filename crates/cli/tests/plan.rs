//! `anode plan`: compile, check and run PLAN programs, on the in-process
//! simulator and on real `anode testbed`s on loopback (every example of
//! `examples/plan/`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example(name: &str) -> String {
    root().join("examples/plan").join(format!("{name}.plan")).to_str().expect("utf-8").to_owned()
}

fn topology(name: &str) -> String {
    root().join("examples/topologies").join(format!("{name}.toml")).to_str().expect("utf-8").to_owned()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn anode(args: &[&str]) -> Output {
    Command::new(ANODE).args(args).output().expect("run anode")
}

/// A testbed on loopback, brought down and removed when dropped.
struct Testbed(PathBuf);

impl Testbed {
    fn up(topo: &str) -> Testbed {
        let p = std::env::temp_dir().join(format!("anode-plantest-{}-{topo}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        let t = Testbed(std::fs::canonicalize(&p).expect("canonical"));
        let o = Command::new(ANODE).args(["testbed", "up", &topology(topo), "--dir"]).arg(&t.0).output().expect("up");
        assert!(o.status.success(), "testbed up {topo}: {}", text(&o));
        t
    }
    fn dir(&self, node: &str) -> String {
        self.0.join(node).to_str().expect("utf-8").to_owned()
    }
    /// `anode plan run FILE` at `node`, listening on `port` for `count` deliveries.
    fn run(&self, node: &str, file: &str, port: u16, count: u32) -> String {
        let o = anode(&[
            "plan",
            "run",
            file,
            "--run-dir",
            &self.dir(node),
            "--port",
            &port.to_string(),
            "--count",
            &count.to_string(),
            "-W",
            "5",
        ]);
        assert!(o.status.success(), "plan run {file} at {node}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    /// `anode recv PORT` at `node`, once it has registered the port.
    fn recv(&self, node: &str, port: u16) -> Child {
        let c = Command::new(ANODE)
            .args(["recv", &port.to_string(), "--count", "1", "--timeout", "5", "--run-dir", &self.dir(node)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn recv");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let st = anode(&["status", "--json", "--run-dir", &self.dir(node)]);
            if String::from_utf8_lossy(&st.stdout).contains(&port.to_string()) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = Command::new(ANODE).args(["testbed", "down", "--dir"]).arg(&self.0).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn compile_s_reassembles_to_the_same_packet() {
    let dir = std::env::temp_dir().join(format!("anode-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (s, a, b) = (dir.join("p.s"), dir.join("a.snap"), dir.join("b.snap"));
    let ping = example("ping");
    let o = Command::new(ANODE).args(["plan", "compile", &ping, "-S", "-o"]).arg(&s).output().expect("run");
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(ANODE).args(["snap", "asm"]).arg(&s).arg("-o").arg(&a).output().expect("run");
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(ANODE).args(["plan", "compile", &ping, "-o"]).arg(&b).output().expect("run");
    assert!(o.status.success() && text(&o).contains("88 bytes"), "{}", text(&o));
    assert_eq!(std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn errors_name_file_line_and_column() {
    let dir = std::env::temp_dir().join(format!("anode-plan-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let f = dir.join("bad.plan");
    std::fs::write(&f, "fun f(x: int) : int =\n  g(x)\nfun g(x: int) : int = f(x)\n").expect("write");
    let o = Command::new(ANODE).args(["plan", "compile"]).arg(&f).output().expect("run");
    assert!(!o.status.success());
    let want = format!("{}:3:23: recursive function: f -> g -> f", f.display());
    assert!(text(&o).contains(&want), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_example_runs_on_the_simulator() {
    for (name, topo, want) in [
        ("ping", "line4", "delivered at 10.0.0.1 on port 7: \"ping\""),
        ("traceroute", "line4", "delivered at 10.0.0.1 on port 9: 0300040a000004"),
        ("multicast", "star5", "delivered at 10.0.0.5 on port 7000: \"hello, group\""),
        ("flowroute", "ring5", "delivered at 10.0.0.3 on port 7001: \"pinned\""),
        ("cache", "line4", "delivered at 10.0.0.1 on port 7002: 000004000000900300040a000004"),
        ("census", "ring5", "delivered at 10.0.0.1 on port 7003: 000004000000050000040000000a"),
    ] {
        let o = anode(&["plan", "run", "--sim", &example(name), "--topology", &topology(topo)]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        assert!(text(&o).contains(want), "{name}: {}", text(&o));
    }
}

/// ping, traceroute and the cache on real daemons: a 4-node line.
#[test]
fn examples_on_a_line4_testbed() {
    let t = Testbed::up("line4");
    let out = t.run("a", &example("ping"), 7, 1);
    assert!(out.contains("delivered on port 7: \"ping\""), "{out}");
    let out = t.run("a", &example("traceroute"), 9, 3);
    for k in 1..=3 {
        let want = format!("0300040a0000{:02x}000004{k:08x}", k + 1);
        assert!(out.contains(&want), "hop {k}: {out}");
    }
    // The server answers first; then the first router on the path.
    let out = t.run("a", &example("cache"), 7002, 1);
    assert!(out.contains("000004000000900300040a000004"), "{out}");
    let out = t.run("a", &example("cache"), 7002, 1);
    assert!(out.contains("000004000000900300040a000002"), "{out}");
}

/// Multicast by fold from the hub of a real star.
#[test]
fn multicast_on_a_star5_testbed() {
    let t = Testbed::up("star5");
    let receivers: Vec<_> = ["a", "b", "c", "d"].iter().map(|n| (*n, t.recv(n, 7000))).collect();
    let o = anode(&["plan", "run", &example("multicast"), "--run-dir", &t.dir("hub")]);
    assert!(o.status.success(), "{}", text(&o));
    for (n, r) in receivers {
        let o = r.wait_with_output().expect("recv");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "hello, group", "node {n}: {}", text(&o));
    }
}

/// Flow routing and the census on a real ring.
#[test]
fn flowroute_and_census_on_a_ring5_testbed() {
    let t = Testbed::up("ring5");
    let r = t.recv("c", 7001);
    let o = anode(&["plan", "run", &example("flowroute"), "--run-dir", &t.dir("a")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = r.wait_with_output().expect("recv");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "pinned", "{}", text(&o));
    // (That the data takes the pinned path through 10.0.0.5 is checked hop
    // by hop on the simulator, crates/plan/tests/golden.rs.)
    let out = t.run("a", &example("census"), 7003, 1);
    assert!(out.contains("000004000000050000040000000a000004000000020300040a000001"), "{out}");
}
