//! SANE with real daemons on loopback: a three-node line with encrypted
//! links pings through the middle node, the middle node restarts and the
//! links recover; a handshake flood at the middle node is rate-limited and
//! does not stall forwarding; unusable key files stop a node with a clear
//! error.
#![allow(clippy::unwrap_used)]

mod common;

use common::{ANODE, LINE3, Scratch, first_listen, status, text, up_line3};
use serde_json::Value;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A child process killed and reaped when dropped.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(ANODE).args(args).output().unwrap()
}

fn up(s: &Scratch, mode: &str) {
    up_line3(s, &["--security", mode]);
}

fn node_dir(s: &Scratch, n: &str) -> PathBuf {
    s.tb().join(n)
}

fn ping(s: &Scratch, count: &str, interval: &str) -> Output {
    Command::new(ANODE)
        .args(["ping", "10.0.0.3", "-c", count, "-i", interval, "-W", "2", "--run-dir"])
        .arg(node_dir(s, "a"))
        .output()
        .unwrap()
}

/// Whether the node at `dir` answers and has an SA with every neighbour.
fn links_up(dir: &Path) -> bool {
    let o = Command::new(ANODE).args(["status", "--json", "--run-dir"]).arg(dir).output().unwrap();
    let Ok(v) = serde_json::from_slice::<Value>(&o.stdout) else { return false };
    v["security"]["peers"].as_array().is_some_and(|p| p.iter().all(|p| p["up"] == Value::Bool(true)))
}

#[test]
fn encrypted_line_recovers_from_a_middle_restart() {
    let s = Scratch::new("sectest", "restart");
    up(&s, "encrypt");
    let o = ping(&s, "3", "0.05");
    assert!(text(&o).contains("3 received"), "{}", text(&o));
    let b = node_dir(&s, "b");
    let st = status(&b);
    for p in st["security"]["peers"].as_array().unwrap() {
        assert_eq!(p["mode"], "encrypt");
        assert_eq!(p["up"], true);
    }
    assert!(st["packets"]["rx_authenticated"].as_u64().unwrap() >= 6);

    // Restart b: SIGKILL (no goodbye), then start it again from its config.
    let pid: i32 = std::fs::read_to_string(b.join("pid")).unwrap().trim().parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let log = std::fs::File::create(b.join("node2.log")).unwrap();
    let mut child = Kill(
        Command::new(ANODE)
            .arg("node")
            .arg("--config")
            .arg(b.join("node.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    std::fs::write(b.join("pid"), format!("{}\n", child.0.id())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !links_up(&b) {
        assert!(
            Instant::now() < deadline,
            "links did not recover: {}",
            std::fs::read_to_string(b.join("node2.log")).unwrap()
        );
        assert!(child.0.try_wait().unwrap().is_none(), "b exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The neighbours took the restarted node's new SAs too.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let o = ping(&s, "2", "0.05");
        if text(&o).contains("2 received") {
            break;
        }
        assert!(Instant::now() < deadline, "no ping after the restart: {}", text(&o));
    }
    let log = std::fs::read_to_string(b.join("node2.log")).unwrap();
    assert!(
        log.contains("link up with neighbour 10.0.0.1") && log.contains("link up with neighbour 10.0.0.3"),
        "{log}"
    );
}

#[test]
fn handshake_flood_is_counted_and_forwarding_goes_on() {
    let s = Scratch::new("sectest", "flood");
    up(&s, "authenticate");
    let b = node_dir(&s, "b");
    let listen = first_listen(&b);
    // Garbage handshake first messages at about 20,000 a second (2,000
    // times the per-source handshake rate), for as long as the pings take.
    // Paced so the test measures the node, not a 2-core machine's
    // scheduler; `flood.rs` and `docs/benchmarks.md` cover full speed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut m = vec![0u8; 8 + 12 + 108];
            let n = m.len() as u8;
            m[..8].copy_from_slice(&[1, 0x80, 0xA0, 0x06, 0, 2, 0, n]);
            m[8] = 1;
            m[15] = 1;
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..20 {
                    m[20] = sent as u8;
                    let _ = sock.send_to(&m, &listen);
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            sent
        })
    };
    let o = ping(&s, "20", "0.05");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().unwrap();
    assert!(text(&o).contains("20 received"), "{}", text(&o));
    let st = status(&b);
    let limited = st["drops"]["handshake_rate_limited"].as_u64().unwrap();
    let failed = st["drops"]["handshake_failed"].as_u64().unwrap();
    assert!(sent > 1000 && limited > 0 && failed <= 40, "sent {sent}, rate limited {limited}, reached crypto {failed}");
    assert!(links_up(&b));
}

#[test]
fn unusable_key_files_stop_the_node_with_a_clear_error() {
    let s = Scratch::new("sectest", "keys");
    let topo = s.0.join("line3.toml");
    std::fs::write(&topo, LINE3).unwrap();
    let tb = s.0.join("tb");
    let o = Command::new(ANODE)
        .args(["testbed", "up"])
        .arg(&topo)
        .arg("--configs-only")
        .arg("--dir")
        .arg(&tb)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let key = tb.join("keys").join("a.key");
    let cfg = tb.join("a").join("node.toml");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(&["node", "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("chmod 600"), "{}", text(&o));
    std::fs::remove_file(&key).unwrap();
    let o = run(&["node", "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("a.key"), "{}", text(&o));
    // `keys gen` refuses to overwrite; `keys show` names the principal.
    let kd = s.0.join("k");
    let o = run(&["keys", "gen", "--out", kd.to_str().unwrap(), "--name", "u"]);
    assert!(o.status.success(), "{}", text(&o));
    let o2 = run(&["keys", "gen", "--out", kd.to_str().unwrap(), "--name", "u"]);
    assert!(!o2.status.success() && text(&o2).contains("refusing to overwrite"), "{}", text(&o2));
    let shown = run(&["keys", "show", kd.join("u.pub").to_str().unwrap()]);
    let fp = text(&shown).lines().find_map(|l| l.strip_prefix("fingerprint ")).unwrap().trim().to_string();
    assert!(text(&o).contains(&fp));
    assert_eq!(std::fs::metadata(kd.join("u.key")).unwrap().permissions().mode() & 0o777, 0o600);
}
