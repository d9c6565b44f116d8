//! The applications against real daemons: three `anode node` processes on
//! loopback in a line 10.0.0.1 — 10.0.0.2 — 10.0.0.3, each test with its own
//! network (fresh ports and run directories), killed when the test ends.
mod common;

use anode_node::client::Client;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

/// A running line of three nodes; dropping it kills them and removes their
/// files.
struct Line {
    dir: PathBuf,
    nodes: Vec<Child>,
}

impl Line {
    fn start() -> Line {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "anode-apps-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ifaces = common::line3_interfaces(&common::free_ports(4));
        let routes = ["[routes]\ndefault_via = \"10.0.0.2\"\n", "", "[routes]\ndefault_via = \"10.0.0.2\"\n"];
        let configs: Vec<String> = (0..3)
            .map(|i| {
                let run = dir.join(format!("n{}", i + 1));
                format!("address = \"10.0.0.{}\"\nrun_dir = \"{}\"\n{}{}", i + 1, run.display(), ifaces[i], routes[i])
            })
            .collect();
        let mut line = Line { dir: dir.clone(), nodes: Vec::new() };
        for (i, cfg) in configs.iter().enumerate() {
            let file = dir.join(format!("n{}.toml", i + 1));
            std::fs::write(&file, cfg).expect("config");
            let log = std::fs::File::create(dir.join(format!("n{}.log", i + 1))).expect("log");
            let child = Command::new(ANODE)
                .args(["node", "--config"])
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start anode node");
            line.nodes.push(child);
        }
        for i in 1..=3 {
            line.wait_ready(i);
        }
        line
    }

    fn run_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Client::connect(self.run_dir(i))
                && c.hello().is_ok()
            {
                return;
            }
            if let Ok(Some(st)) = self.nodes[i - 1].try_wait() {
                panic!("node {i} exited with {st}:\n{}", self.log(i));
            }
            assert!(Instant::now() < deadline, "node {i} not ready after 10 s:\n{}", self.log(i));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("n{i}.log"))).unwrap_or_default()
    }

    /// `anode ARGS --run-dir <node i>`, to completion.
    fn run(&self, i: usize, args: &[&str]) -> Output {
        let out = Command::new(ANODE)
            .args(args)
            .arg("--run-dir")
            .arg(self.run_dir(i))
            .stdin(Stdio::null())
            .output()
            .expect("run anode");
        assert!(out.status.code().is_some(), "{args:?} killed by a signal");
        out
    }

    /// Starts `anode recv ARGS --run-dir <node i>` and waits until it has
    /// registered its port.
    fn recv(&self, i: usize, args: &[&str]) -> Proc {
        let mut child = Command::new(ANODE)
            .arg("recv")
            .args(args)
            .arg("--run-dir")
            .arg(self.run_dir(i))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start anode recv");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        err.read_line(&mut line).expect("recv stderr");
        assert!(line.contains("listening on"), "anode recv did not start: {line:?}");
        Proc { child: Some(child), err }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for i in 1..=3 {
                eprintln!("--- node {i} log ---\n{}", self.log(i));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running `anode recv`, killed if the test ends before it does.
struct Proc {
    child: Option<Child>,
    err: BufReader<std::process::ChildStderr>,
}

impl Proc {
    /// Waits for it to finish: (exit code, stdout, rest of stderr).
    fn finish(mut self) -> (Option<i32>, Vec<u8>, String) {
        let child = self.child.take().expect("child");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.err, &mut rest);
        let out = child.wait_with_output().expect("wait recv");
        (out.status.code(), out.stdout, rest)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn ping_across_two_hops() {
    let net = Line::start();
    for extra in [&[][..], &["--compiled"][..]] {
        let mut args = vec!["ping", "10.0.0.3", "-c", "3", "-i", "0.1", "-W", "2"];
        args.extend_from_slice(extra);
        let out = net.run(1, &args);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}:\n{stdout}{}", text(&out.stderr));
        for seq in 1..=3 {
            let l = format!(" bytes from 10.0.0.3: seq={seq} time=");
            assert!(stdout.lines().any(|x| x.contains(&l) && x.ends_with(" ms")), "no reply {seq}:\n{stdout}");
        }
        assert!(stdout.contains("\n--- 10.0.0.3 snap ping statistics ---\n"), "{stdout}");
        assert!(stdout.contains("\n3 packets transmitted, 3 received, 0% packet loss\n"), "{stdout}");
        let rtt = stdout.lines().find_map(|l| l.strip_prefix("rtt min/avg/max/mdev = ")).expect("rtt line");
        let v: Vec<f64> = rtt.strip_suffix(" ms").expect("ms").split('/').map(|x| x.parse().expect("number")).collect();
        assert_eq!(v.len(), 4);
        assert!(v[0] <= v[1] && v[1] <= v[2], "{rtt}");
    }
}

#[test]
fn ping_without_replies_fails() {
    let net = Line::start();
    // No route anywhere from 10.0.0.2 to 10.0.0.9: nothing comes back.
    let out = net.run(2, &["ping", "10.0.0.9", "-c", "1", "-W", "0.3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("1 packets transmitted, 0 received, 100% packet loss"));
}

#[test]
fn traceroute_lists_each_hop() {
    let net = Line::start();
    let out = net.run(1, &["traceroute", "10.0.0.3", "-W", "3"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let hops: Vec<(u32, String)> = stdout
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.get(3), Some(&"ms"), "{l}");
            (f[0].parse().expect("hop"), f[1].to_owned())
        })
        .collect();
    assert_eq!(hops, vec![(1, "10.0.0.2".to_owned()), (2, "10.0.0.3".to_owned())], "{stdout}");
}

#[test]
fn send_and_recv_a_file_over_two_hops() {
    let net = Line::start();
    let data: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let input = net.dir.join("in.bin");
    let output = net.dir.join("out.bin");
    std::fs::write(&input, &data).expect("input");
    // 5000 bytes in chunks of 1356 (MTU 1400 less 44 bytes of program): 4.
    let out_s = output.to_string_lossy().into_owned();
    let rx = net.recv(3, &["9000", "--count", "4", "--timeout", "5", "-o", &out_s]);
    let out = net.run(1, &["send", "10.0.0.3", "9000", &input.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("5000 bytes in 4 packets"), "{}", text(&out.stderr));
    let (code, _, err) = rx.finish();
    assert_eq!(code, Some(0), "recv: {err}");
    assert!(err.contains("5000 bytes in 4 packets"), "{err}");
    assert!(std::fs::read(&output).expect("output") == data, "file changed in transit");
}

#[test]
fn multicast_reaches_each_listed_host_once() {
    let net = Line::start();
    let msg = "hello, listed hosts";
    let rx: Vec<Proc> = (1..=3).map(|i| net.recv(i, &["7100", "--timeout", "0.7"])).collect();
    let out = net.run(1, &["multicast", "--to", "10.0.0.2,10.0.0.3", "--port", "7100", msg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got: Vec<String> = rx.into_iter().map(|p| text(&p.finish().1)).collect();
    assert_eq!(got, vec![String::new(), msg.to_owned(), msg.to_owned()], "unlisted 10.0.0.1 gets nothing");
    // 10.0.0.1 has one interface: it cannot keep a copy and move on.
    let out = net.run(1, &["multicast", "--to", "10.0.0.1,10.0.0.3", msg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("too_many_sends"), "{}", text(&out.stderr));
}

#[test]
fn missing_node_is_explained() {
    let dir = Path::new("/nonexistent/anode-run");
    let out = Command::new(ANODE).args(["ping", "10.0.0.3", "--run-dir"]).arg(dir).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("is `anode node` running? no socket at /nonexistent/anode-run/app.sock"), "{err}");
}
