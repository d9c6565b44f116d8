//! Issue 12: the defects that hostile probing of live nodes found, each
//! reproduced on real daemons as an attacker or a careless operator would,
//! and each expected to hold after the fix.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::Interface;
use anode_daemon::client::{Client, ClientError};
use common::{
    ANODE, Line, Scratch, eventually, first_listen, issue_credential, module, modules_dir, status, text, up_line3,
    user_keys,
};
use std::io::Write;
use std::net::{Ipv4Addr, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn ports_of(st: &serde_json::Value) -> Vec<u64> {
    st["local"]["ports"].as_array().map(|a| a.iter().filter_map(|p| p.as_u64()).collect()).unwrap_or_default()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

/// Item 1: A stalled local application (the issue's reproduction: `anode recv
/// 7000`, then SIGSTOP) loses its own deliveries and, if it stays stalled,
/// its connection; every other client keeps its service.
#[test]
fn a_stalled_application_costs_only_itself() {
    let net = Line::start();
    let stalled = net.recv(3, &["7000"]);
    let pid = stalled.child.as_ref().unwrap().id();
    signal(pid, nix::sys::signal::Signal::SIGSTOP);
    let mut good = Client::connect(net.run_dir(3)).unwrap();
    good.register(7001).unwrap();
    let mut src = Client::connect(net.run_dir(1)).unwrap();
    // Remote traffic for the stopped application: far more than any socket
    // buffer holds.
    for _ in 0..3000 {
        src.plain(addr(3), 7000, 8, &[0x5a; 200]).unwrap();
    }
    for i in 0..20u8 {
        src.plain(addr(3), 7001, 8, &[i]).unwrap();
    }
    let mut fresh = Client::connect(net.run_dir(3)).unwrap();
    fresh.hello().expect("HELLO is answered while another client is stalled");
    let mut got = Vec::new();
    while got.len() < 20 {
        match good.recv(Duration::from_secs(3)).unwrap() {
            Some((7001, p)) => got.extend(p),
            Some(other) => panic!("unexpected delivery {other:?}"),
            None => break,
        }
    }
    assert_eq!(got, (0..20u8).collect::<Vec<_>>(), "the well-behaved client received everything, in order");
    let st = status(&net.run_dir(3));
    assert!(st["local"]["queue_dropped"].as_u64().unwrap() > 0, "{}", st["local"]);
    // A client that stays stalled is disconnected and its port freed.
    let freed = eventually(20.0, || {
        let st = status(&net.run_dir(3));
        !ports_of(&st).contains(&7000) && st["local"]["clients_stalled"].as_u64() >= Some(1)
    });
    signal(pid, nix::sys::signal::Signal::SIGCONT);
    assert!(freed, "stalled client not disconnected: {}", status(&net.run_dir(3))["local"]);
    assert_eq!(ports_of(&status(&net.run_dir(3))), vec![7001]);
}

/// Item 2: `anode module load` gets its answer from a node whose links
/// authenticate only, and a retried load never loads a second copy.
#[test]
fn module_load_in_authenticate_mode_is_answered_and_idempotent() {
    let s = Scratch::new("hardening", "authload");
    let (ukey, upub) = user_keys(&s.0.join("user"), "u");
    up_line3(&s, &["--security", "authenticate", "--user", upub.to_str().unwrap()]);
    let user = anode_sec::Identity::load(&ukey).unwrap();
    let counter = module("counter");
    let cred = s.0.join("counter.cred");
    let ifaces = [Interface::State, Interface::Log, Interface::Net, Interface::Marshal];
    let admin = s.tb().join("keys").join("admin.key");
    std::fs::write(&cred, issue_credential(&admin, *user.public().as_bytes(), &counter, &ifaces, None)).unwrap();
    let b = s.tb().join("b");
    let listen = first_listen(&b);
    let load = || {
        Command::new(ANODE)
            .args(["module", "load"])
            .arg(modules_dir().join("counter.wasm"))
            .arg("--credential")
            .arg(&cred)
            .args(["--name", "counter", "--node", &listen, "--node-key"])
            .arg(s.tb().join("keys").join("b.pub"))
            .arg("--key")
            .arg(&ukey)
            .output()
            .unwrap()
    };
    let o = load();
    assert!(o.status.success() && text(&o).contains("loaded m"), "{}", text(&o));
    let o = load();
    assert!(o.status.success() && text(&o).contains("already loaded"), "retry: {}", text(&o));
    let st = status(&b);
    assert_eq!(st["modules"]["modules"].as_array().map(Vec::len), Some(1), "{}", st["modules"]);
}

/// Item 3: A port belongs to the client that registered it until it
/// unregisters or is gone; registrations per client are bounded; a gone
/// client's registrations go with it.
#[test]
fn ports_belong_to_their_client() {
    let net = Line::start();
    let mut a = Client::connect(net.run_dir(3)).unwrap();
    a.register(7000).unwrap();
    let mut b = Client::connect(net.run_dir(3)).unwrap();
    match b.register(7000) {
        Err(ClientError::Refused { reason, .. }) => {
            assert!(reason.contains("registered by another client") && reason.contains("pid"), "{reason}")
        }
        other => panic!("takeover not refused: {other:?}"),
    }
    let mut src = Client::connect(net.run_dir(1)).unwrap();
    src.plain(addr(3), 7000, 8, b"mine").unwrap();
    assert_eq!(a.recv(Duration::from_secs(3)).unwrap(), Some((7000, b"mine".to_vec())));
    assert_eq!(b.recv(Duration::from_millis(300)).unwrap(), None);
    for p in 0..64 {
        b.register(20_000 + p).unwrap();
    }
    match b.register(20_064) {
        Err(ClientError::Refused { reason, .. }) => assert!(reason.contains("64"), "{reason}"),
        other => panic!("65th port not refused: {other:?}"),
    }
    drop(b);
    // Clients that come and go leave nothing behind.
    for i in 0..300u16 {
        let mut c = Client::connect(net.run_dir(3)).unwrap();
        c.register(30_000 + i).unwrap();
    }
    assert!(
        eventually(5.0, || ports_of(&status(&net.run_dir(3))) == vec![7000]),
        "{}",
        status(&net.run_dir(3))["local"]
    );
}

/// Item 4: Input cannot flood the log: a sweep of refused REGISTERs and of
/// clients that come and go, with every log level on.
#[test]
fn input_cannot_flood_the_log() {
    let net = Line::start_env(["", "", ""], &[("RUST_LOG", "debug")]);
    let mut a = Client::connect(net.run_dir(3)).unwrap();
    a.register(7000).unwrap();
    let before = net.log(3).len();
    let t0 = Instant::now();
    let mut tries = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let mut c = Client::connect(net.run_dir(3)).unwrap();
        for p in 0..20u16 {
            let _ = c.register(7000);
            let _ = c.register(40_000 + p);
            tries += 2;
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let log = net.log(3);
    let grown = log.len() - before;
    assert!(tries > 1000, "only {tries} requests");
    assert!(grown < 256 * 1024, "{tries} requests grew the log by {grown} bytes");
    assert!(log.contains("suppressed"), "no count of suppressed lines:\n{}", &log[log.len().saturating_sub(3000)..]);
}

/// Item 5: Control and metrics connections have their own slots and a deadline
/// for the whole request: holding metrics connections, or trickling bytes
/// into control connections, does not stop `anode status`.
#[test]
fn held_connections_do_not_stop_status() {
    let ports = common::free_ports(2);
    let metrics = format!("metrics = \"127.0.0.1:{}\"", ports[0]);
    let open_metrics = format!("metrics = \"0.0.0.0:{}\"", ports[1]);
    let net = Line::start_with([&open_metrics, &metrics, ""]);
    assert!(net.log(1).contains("not a loopback address"), "no warning:\n{}", net.log(1));
    let held: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(("127.0.0.1", ports[0])).unwrap()).collect();
    let mut trickle: Vec<UnixStream> =
        (0..40).map(|_| UnixStream::connect(net.run_dir(2).join("control.sock")).unwrap()).collect();
    let t0 = Instant::now();
    let mut ok = 0;
    while t0.elapsed() < Duration::from_secs(4) {
        for c in &mut trickle {
            let _ = c.write_all(b"s");
        }
        let o = Command::new(ANODE).args(["status", "--json", "--run-dir"]).arg(net.run_dir(2)).output().unwrap();
        assert!(o.status.success(), "status failed after {ok} successes: {}", text(&o));
        ok += 1;
        let mut m = TcpStream::connect(("127.0.0.1", ports[0])).unwrap();
        m.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        m.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut body = String::new();
        let _ = std::io::Read::read_to_string(&mut m, &mut body);
        assert!(body.starts_with("HTTP/1.1 200"), "metrics: {body:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(held);
    let st = status(&net.run_dir(2));
    assert!(st["local"]["conns_expired"].as_u64().unwrap() > 0, "{}", st["local"]);
}

/// Item 6: The daemon sets its socket and directory modes itself, whatever the
/// umask, and refuses a run directory that others can write to; the testbed
/// writes no world-writable file.
#[test]
fn modes_do_not_follow_the_umask() {
    let s = Scratch::new("hardening", "umask");
    let port = common::free_ports(1)[0];
    let cfg = |run: &Path| {
        format!(
            "address = \"10.0.0.1\"\nrun_dir = \"{}\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:{port}\"\n",
            run.display()
        )
    };
    let run = s.0.join("run");
    std::fs::write(s.0.join("n.toml"), cfg(&run)).unwrap();
    let sh = format!("umask 000; exec {ANODE} node --config {}", s.0.join("n.toml").display());
    let mut node = Command::new("sh").args(["-c", &sh]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let up = eventually(10.0, || Client::connect(&run).and_then(|mut c| c.hello()).is_ok());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let modes = up.then(|| (mode(&run), mode(&run.join("app.sock")), mode(&run.join("control.sock"))));
    let _ = node.kill();
    let _ = node.wait();
    assert_eq!(modes, Some((0o700, 0o600, 0o600)));
    // A run directory that others can write to.
    let open = s.0.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(s.0.join("o.toml"), cfg(&open)).unwrap();
    let o = Command::new(ANODE).args(["node", "--config"]).arg(s.0.join("o.toml")).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("writable by other users"), "{}", text(&o));
    // The testbed under umask 000.
    let topo = s.0.join("line3.toml");
    std::fs::write(&topo, common::LINE3).unwrap();
    let sh = format!("umask 000; exec {ANODE} testbed up {} --security off --dir {}", topo.display(), s.tb().display());
    let o = Command::new("sh").args(["-c", &sh]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut loose = Vec::new();
    let mut stack = vec![s.tb()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.permissions().mode() & 0o002 != 0 {
                loose.push(e.path());
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    assert!(loose.is_empty(), "world-writable: {loose:?}");
}

/// Item 7: One small packet cannot cause thousands of transmissions: the
/// resource bound of injected and arriving packets is capped.
#[test]
fn resource_bound_is_capped() {
    let net = Line::start();
    let ping_pong = ".src 10.0.0.2\n.dst 10.0.0.2\n.rb 65535\ngetsrc\nforwto\n";
    let pkt = anode_snap::asm::assemble(ping_pong).unwrap().to_bytes().unwrap();
    assert!(pkt.len() <= 40, "{} bytes", pkt.len());
    let mut c = Client::connect(net.run_dir(1)).unwrap();
    c.inject(&pkt).unwrap();
    // With security off, from any UDP port.
    let listen = std::fs::read_to_string(net.dir.join("n2.toml")).unwrap();
    let listen = listen.lines().find_map(|l| l.strip_prefix("listen = \"")).unwrap().trim_end_matches('"').to_string();
    let dgram = anode_node::anep::frame(anode_node::anep::FLAG_DISCARD_UNKNOWN, anode_node::anep::TYPE_SNAP, &pkt);
    UdpSocket::bind("127.0.0.1:0").unwrap().send_to(&dgram, &listen).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let fwd = |i| status(&net.run_dir(i))["packets"]["snap_forwarded"].as_u64().unwrap();
    let total = fwd(1) + fwd(2) + fwd(3);
    assert!(total <= 2 * 64, "two packets made {total} transmissions");
    let clamped: u64 = (1..=3).map(|i| status(&net.run_dir(i))["packets"]["rb_clamped"].as_u64().unwrap()).sum();
    assert!(clamped >= 2, "{clamped}");
}

/// Item 8: An XX first message from an unverified source gets no more bytes
/// back than it sent, and nothing that identifies the node.
#[test]
fn xx_handshake_does_not_amplify() {
    let s = Scratch::new("hardening", "xx");
    let (_, upub) = user_keys(&s.0.join("user"), "u");
    up_line3(&s, &["--user", upub.to_str().unwrap()]);
    let b = s.tb().join("b");
    let listen = first_listen(&b);
    let bpub = std::fs::read_to_string(s.tb().join("keys").join("b.pub")).unwrap();
    let bkey = anode_sec::PublicKey::parse(bpub.trim()).unwrap();
    // ANEP header, handshake header (kind 3 = XX first, sender index 7), an ephemeral key.
    let mut msg = vec![3, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0];
    msg.extend((0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(9)));
    let dgram = anode_node::anep::frame(anode_node::anep::FLAG_DISCARD_UNKNOWN, anode_node::anep::TYPE_HANDSHAKE, &msg);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    sock.send_to(&dgram, &listen).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while let Ok(n) = sock.recv(&mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.len() <= dgram.len(), "sent {} bytes, got {} back", dgram.len(), got.len());
    let k = bkey.as_bytes();
    assert!(!got.windows(32).any(|w| w == k), "the reply names the node");
}

/// `anode module load FILE --credential CRED` as the user of key `ukey`,
/// over its SA with node b of the testbed in `s`.
fn load_at_b(s: &Scratch, file: &Path, cred: &Path, ukey: &Path) -> std::process::Output {
    Command::new(ANODE)
        .args(["module", "load"])
        .arg(file)
        .arg("--credential")
        .arg(cred)
        .args(["--node", &first_listen(&s.tb().join("b")), "--node-key"])
        .arg(s.tb().join("keys").join("b.pub"))
        .arg("--key")
        .arg(ukey)
        .output()
        .unwrap()
}

/// Item 9: A module stops when its credential expires: unloaded, logged.
#[test]
fn modules_do_not_outlive_their_credentials() {
    let s = Scratch::new("hardening", "expiry");
    let (ukey, upub) = user_keys(&s.0.join("user"), "u");
    up_line3(&s, &["--user", upub.to_str().unwrap()]);
    let user = anode_sec::Identity::load(&ukey).unwrap();
    let counter = module("counter");
    let cred = s.0.join("short.cred");
    let ifaces = [Interface::State, Interface::Log, Interface::Net, Interface::Marshal];
    let expires = SystemTime::now() + Duration::from_secs(3);
    let admin = s.tb().join("keys").join("admin.key");
    std::fs::write(&cred, issue_credential(&admin, *user.public().as_bytes(), &counter, &ifaces, Some(expires)))
        .unwrap();
    let b = s.tb().join("b");
    let o = load_at_b(&s, &modules_dir().join("counter.wasm"), &cred, &ukey);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(status(&b)["modules"]["modules"].as_array().map(Vec::len), Some(1));
    let gone = eventually(8.0, || status(&b)["modules"]["modules"].as_array().map(Vec::len) == Some(0));
    assert!(gone, "still loaded after expiry: {}", status(&b)["modules"]);
    // Not before the date the credential states (Biscuit dates are whole seconds).
    let stated =
        SystemTime::UNIX_EPOCH + Duration::from_secs(expires.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs());
    assert!(SystemTime::now() >= stated);
    let log = std::fs::read_to_string(b.join("node.log")).unwrap();
    assert!(log.contains("credential expired"), "{log}");
}

/// Item 10: A refused capsule tells its sender why.
#[test]
fn capsule_refusals_carry_their_reason() {
    let s = Scratch::new("hardening", "reasons");
    up_line3(&s, &["--security", "off"]);
    let ping = module("ping");
    let (other, _) = user_keys(&s.0.join("other"), "rogue");
    let ifaces = [Interface::Route, Interface::Net, Interface::Time];
    let admin = s.tb().join("keys").join("admin.key");
    let past = SystemTime::now() - Duration::from_secs(60);
    let cases = [
        (
            "wrong-issuer",
            issue_credential(&other, [1; 32], &ping, &ifaces, None),
            "not issued by this node's administrator",
        ),
        ("expired", issue_credential(&admin, [1; 32], &ping, &ifaces, Some(past)), "credential expired"),
        ("no-right", issue_credential(&admin, [1; 32], &ping, &[Interface::Route], None), "does not grant"),
    ];
    for (name, cred, reason) in cases {
        let f = s.0.join(format!("{name}.cred"));
        std::fs::write(&f, cred).unwrap();
        let o = Command::new(ANODE)
            .args(["ping", "10.0.0.3", "--capsule", "-c", "1", "-W", "1", "--module"])
            .arg(modules_dir().join("ping.wasm"))
            .arg("--credential")
            .arg(&f)
            .arg("--run-dir")
            .arg(s.tb().join("a"))
            .output()
            .unwrap();
        assert!(!o.status.success() && text(&o).contains(reason), "{name}: {}", text(&o));
    }
}

/// Item 11: The node and the testbed validate topologies and links alike, with
/// accurate messages.
#[test]
fn node_and_testbed_validate_alike() {
    let s = Scratch::new("hardening", "validate");
    let nodes = "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.2\" }]\n";
    let cases = [
        (
            "self-loop",
            format!("{nodes}link = [{{ a = \"a\", b = \"b\" }}, {{ a = \"b\", b = \"b\" }}]\n"),
            "joins node \"b\" to itself",
        ),
        (
            "duplicate",
            format!("{nodes}link = [{{ a = \"a\", b = \"b\" }}, {{ a = \"b\", b = \"a\" }}]\n"),
            "link a-b is listed twice",
        ),
        (
            "same-address",
            "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"b\", address = \"10.0.0.1\" }]\n\
             link = [{ a = \"a\", b = \"b\" }]\n"
                .to_string(),
            "address 10.0.0.1 is used by both \"a\" and \"b\"",
        ),
    ];
    let port = common::free_ports(2);
    for (name, topo, msg) in cases {
        let t = s.0.join(format!("{name}.toml"));
        std::fs::write(&t, &topo).unwrap();
        let cfg = s.0.join(format!("{name}-node.toml"));
        std::fs::write(
            &cfg,
            format!(
                "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:{}\"\n\
                 neighbors = [{{ address = \"10.0.0.2\", endpoint = \"127.0.0.1:{}\" }}]\n\
                 [routes]\ntopology = \"{}\"\n",
                port[0],
                port[1],
                t.display()
            ),
        )
        .unwrap();
        let o = Command::new(ANODE).args(["node", "--check", "--config"]).arg(&cfg).output().unwrap();
        assert!(!o.status.success() && text(&o).contains(msg), "node, {name}: {}", text(&o));
        let o = Command::new(ANODE).args(["testbed", "up"]).arg(&t).arg("--dir").arg(s.tb()).output().unwrap();
        assert!(!o.status.success() && text(&o).contains(msg), "testbed, {name}: {}", text(&o));
    }
    // A neighbour endpoint equal to the node's own listen address.
    let cfg = s.0.join("echo.toml");
    std::fs::write(
        &cfg,
        format!(
            "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:{0}\"\n\
             neighbors = [{{ address = \"10.0.0.2\", endpoint = \"127.0.0.1:{0}\" }}]\n",
            port[0]
        ),
    )
    .unwrap();
    let o = Command::new(ANODE).args(["node", "--check", "--config"]).arg(&cfg).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("neighbour 10.0.0.2 has endpoint 127.0.0.1"), "{}", text(&o));
}

/// A module larger than one control datagram (64 KiB) is staged in chunks
/// over the user's SA and then loaded (the client refused it before, and
/// before that panicked); one over the node's module size limit (256 KiB)
/// is refused at its first chunk with the reason, counted, and nothing of
/// it is kept.
#[test]
fn a_module_larger_than_one_datagram_is_loaded_in_chunks_and_one_over_the_limit_is_refused() {
    let s = Scratch::new("hardening", "bigload");
    let (ukey, upub) = user_keys(&s.0.join("user"), "u");
    up_line3(&s, &["--user", upub.to_str().unwrap()]);
    let user = anode_sec::Identity::load(&ukey).unwrap();
    let admin = s.tb().join("keys").join("admin.key");
    let b = s.tb().join("b");
    let ifaces = [Interface::State, Interface::Log, Interface::Net, Interface::Marshal];
    let load = |size: usize| {
        let mut code = module("counter");
        common::pad_wasm(&mut code, size);
        let file = s.0.join(format!("big-{size}.wasm"));
        std::fs::write(&file, &code).unwrap();
        let cred = s.0.join(format!("big-{size}.cred"));
        std::fs::write(&cred, issue_credential(&admin, *user.public().as_bytes(), &code, &ifaces, None)).unwrap();
        load_at_b(&s, &file, &cred, &ukey)
    };
    let o = load(150_000);
    let t = text(&o);
    assert!(o.status.success() && t.contains("loaded m") && t.contains("in 4 request(s)"), "{t}");
    assert_eq!(status(&b)["modules"]["modules"].as_array().map(Vec::len), Some(1));
    let o = load(300_000);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("staging the code") && t.contains("1 to 262144 bytes"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    let st = status(&b);
    assert_eq!(st["drops"]["staging_refused"], 1, "{}", st["drops"]);
    assert_eq!(st["modules"]["modules"].as_array().map(Vec::len), Some(1), "nothing of the refused one loaded");
}
