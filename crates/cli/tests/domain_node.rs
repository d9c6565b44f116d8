//! The domain's key distribution service on a real daemon (issue 18, second
//! half, first step): `[domain]` in a node's config, `anode domain secret`,
//! and `anode domain ticket` over an SA (`CONTROL` body 0x22). A ticket the
//! node issues opens at another node of the domain with no handshake (in
//! process here; on real daemons: tests/domains_testbed.rs).

mod common;

use common::{ANODE, Scratch, free_ports, text, user_keys};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOPO: &str = r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }]
link = [{ a = "a", b = "b" }]
"#;

struct Running(Child, PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn anode(args: &[&str]) -> (bool, String) {
    let o = Command::new(ANODE).args(args).output().expect("run anode");
    (o.status.success(), text(&o))
}

/// Starts node b; Ok once it answers, Err(log) if it exits.
fn start(cfg: &std::path::Path, run_dir: &std::path::Path, log: &std::path::Path) -> Result<Running, String> {
    let f = std::fs::File::create(log).expect("log");
    let child = Command::new(ANODE)
        .args(["node", "--config"])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("log"))
        .stderr(f)
        .spawn()
        .expect("start");
    let mut r = Running(child, run_dir.to_path_buf());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if Command::new(ANODE)
            .args(["status", "--json", "--run-dir"])
            .arg(run_dir)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(r);
        }
        if let Ok(Some(_)) = r.0.try_wait() {
            return Err(std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(Instant::now() < deadline, "not ready:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_of_the_domain_issues_tickets_over_an_sa_within_its_limits() {
    let s = Scratch::new("domainnode", "kdc");
    let p = |x: &str| s.0.join(x);
    let ps = |x: &str| p(x).display().to_string();
    let (ukey, upub) = user_keys(&p("u"), "u");
    std::fs::write(p("t.toml"), TOPO).expect("topology");
    let (ok, out) = anode(&[
        "testbed",
        "up",
        &ps("t.toml"),
        "--configs-only",
        "--dir",
        &ps("tb"),
        "--user",
        &upub.display().to_string(),
    ]);
    assert!(ok, "{out}");
    let ports = free_ports(2);
    let cfg = p("tb/b/node.toml");
    let c = std::fs::read_to_string(&cfg).expect("config");
    let c = c
        .replace("127.0.0.1:7000", &format!("127.0.0.1:{}", ports[0]))
        .replace("127.0.0.1:7001", &format!("127.0.0.1:{}", ports[1]));
    let (ok, out) = anode(&["domain", "secret", "--out", &ps("tb/keys/domain.secret")]);
    assert!(ok, "{out}");
    let (ok, out) = anode(&["domain", "secret", "--out", &ps("tb/keys/domain.secret")]);
    assert!(!ok && out.contains("refused if it exists"), "{out}");
    let admin_pub = std::fs::read_to_string(p("tb/keys/admin.pub")).expect("admin.pub");
    let admin_pub = anode_sec::PublicKey::parse(&admin_pub).expect("admin.pub");
    std::fs::write(
        &cfg,
        format!(
            "{c}\n[domain]\noperator = \"{admin_pub}\"\nsecret = \"../keys/domain.secret\"\nmax_ticket_secs = 120\n"
        ),
    )
    .expect("config");
    let b = start(&cfg, &p("tb/b"), &p("b.log")).unwrap_or_else(|log| panic!("{log}"));
    // A credential rooted in the operator's key.
    let issue = |admin: &str, out: &str| {
        let (ok, o) = anode(&[
            "cred",
            "issue",
            "--admin-key",
            admin,
            "--principal",
            &upub.display().to_string(),
            "--kind",
            "module",
            "--module",
            &common::modules_dir().join("channel.wasm").display().to_string(),
            "--interface",
            "net",
            "-o",
            out,
        ]);
        assert!(ok, "{o}");
    };
    issue(&ps("tb/keys/admin.key"), &ps("u.cred"));
    let ticket = |cred: &str, out: &str| {
        anode(&[
            "domain",
            "ticket",
            "--node",
            &format!("127.0.0.1:{}", ports[1]),
            "--node-key",
            &ps("tb/keys/b.pub"),
            "--key",
            &ukey.display().to_string(),
            "--credential",
            cred,
            "--lifetime",
            "600",
            "-o",
            out,
        ])
    };
    let (ok, out) = ticket(&ps("u.cred"), &ps("u.ticket"));
    assert!(ok && out.contains("expires at"), "{out}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(p("u.ticket")).expect("ticket").permissions().mode() & 0o777, 0o600);
    // The ticket opens at another node of the domain, with no handshake:
    // the user seals a packet under the session key.
    let reply = std::fs::read(p("u.ticket")).expect("ticket");
    let mut holder = anode_sec::TicketHolder::from_reply(&reply).expect("a ticket reply");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs();
    assert!(holder.expires() <= now + 121, "the service capped the lifetime at 120 s: {}", holder.expires());
    let secret = std::fs::read_to_string(p("tb/keys/domain.secret")).expect("secret");
    let secret = anode_sec::DomainKey::parse_secret(&secret).expect("secret");
    let a_pub = anode_sec::PublicKey::parse(&std::fs::read_to_string(p("tb/keys/a.pub")).expect("a.pub")).expect("a");
    let to_a = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
    let mut node_a =
        anode_sec::DomainNode::new(anode_sec::DomainKey::new(admin_pub, &secret), 1, a_pub, to_a).expect("a");
    let got = node_a.open_packet(&holder.seal(to_a, b"hello a"), now).expect("opens at a");
    assert_eq!(got.payload, b"hello a");
    assert_eq!(got.user, anode_sec::PublicKey::parse(&std::fs::read_to_string(&upub).expect("u")).expect("u"));
    // A credential of another operator is refused, and counted.
    let (other, _) = user_keys(&p("other"), "admin");
    issue(&other.display().to_string(), &ps("other.cred"));
    let (ok, out) = ticket(&ps("other.cred"), &ps("other.ticket"));
    assert!(!ok && out.contains("ticket refused: CredentialRefused"), "{out}");
    assert!(!p("other.ticket").exists());
    // Issuance is rate limited per user (burst 5, 1 a second).
    let mut limited = false;
    for i in 0..8 {
        let (ok, out) = ticket(&ps("u.cred"), &ps(&format!("u{i}.ticket")));
        limited |= !ok && out.contains("RateLimited");
    }
    assert!(limited, "the per-user rate limit refused a request");
    let st = common::status(&b.1);
    let d = &st["domain"];
    assert_eq!(d["kdc"], true, "{st}");
    assert!(d["issued"].as_u64().unwrap_or(0) >= 1 && d["refused"]["rate_limited"].as_u64().unwrap_or(0) >= 1, "{d}");
    drop(b);
    // A secret others can read stops the start; so does [domain] without security.
    std::fs::set_permissions(p("tb/keys/domain.secret"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let log = start(&cfg, &p("tb/b"), &p("b2.log")).map(|_| ()).expect_err("a readable secret");
    assert!(log.contains("chmod 600"), "{log}");
}
