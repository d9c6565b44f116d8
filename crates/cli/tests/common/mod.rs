//! Helpers shared by the integration tests that start real daemons.
#![allow(dead_code)]

use anode_daemon::client::Client;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// `n` distinct free UDP ports on 127.0.0.1, below the kernel's ephemeral
/// range so no other test's socket takes one before the daemon binds it
/// (`anode_daemon::ports`): bound together so they differ, then released for
/// the daemons to take.
pub fn free_ports(n: usize) -> Vec<u16> {
    let socks = anode_daemon::ports::reserve_loopback(n).expect("free loopback ports");
    socks.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

/// The first of `n` consecutive free UDP ports on 127.0.0.1 (below the
/// ephemeral range, as [`free_ports`]), for `anode testbed up --configs-only
/// --base-port`, whose nodes a test starts itself: without `--base-port`
/// those configs all listen from port 7000, which a concurrent testbed may
/// hold.
pub fn free_block(n: u16) -> u16 {
    for _ in 0..64 {
        let base = free_ports(1)[0];
        if u32::from(base) + u32::from(n) > u32::from(anode_daemon::ports::ephemeral_floor()) {
            continue;
        }
        let held: Vec<_> = (base..base + n).map_while(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).ok()).collect();
        if held.len() == usize::from(n) {
            return base;
        }
    }
    panic!("no block of {n} free loopback ports");
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

/// A testbed line a - b - c whose nodes accept a set of users, with the
/// control commands pointed at c over each user's SA.
pub struct UserLine {
    /// The scratch directory (the testbed in its `tb/`).
    pub s: Scratch,
    /// The testbed administrator's secret key.
    pub admin: PathBuf,
    /// c's first listen address.
    pub node: String,
    /// c's public key.
    pub node_key: PathBuf,
}

impl UserLine {
    /// `anode testbed up` of [`LINE3`] in a [`Scratch`] of `kind`/`tag`, with
    /// a key pair per user of `names` (in order) and `extra` testbed
    /// arguments: the line, c's node directory, and each user's (secret
    /// key, public key) files.
    pub fn up(kind: &str, tag: &str, names: &[&str], extra: &[&str]) -> (UserLine, PathBuf, Vec<(PathBuf, PathBuf)>) {
        let s = Scratch::new(kind, tag);
        let keys: Vec<_> = names.iter().map(|n| user_keys(&s.0.join(n), n)).collect();
        let mut args = extra.to_vec();
        for (_, p) in &keys {
            args.push("--user");
            args.push(p.to_str().expect("utf-8 path"));
        }
        up_line3(&s, &args);
        let c = s.tb().join("c");
        let line = UserLine {
            admin: s.tb().join("keys").join("admin.key"),
            node: first_listen(&c),
            node_key: s.tb().join("keys").join("c.pub"),
            s,
        };
        (line, c, keys)
    }

    /// `anode ARGS --node c --node-key c.pub --key KEY`, run to the end.
    pub fn run(&self, key: &Path, args: &[&str]) -> Output {
        self.command(key, args).output().expect("anode")
    }

    /// The command [`UserLine::run`] runs.
    pub fn command(&self, key: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(ANODE);
        c.args(args).args(["--node", &self.node, "--node-key"]).arg(&self.node_key).arg("--key").arg(key);
        c
    }

    /// `anode cred issue` by the administrator for the holder of
    /// `principal`, with `args`, saved in the scratch directory as `name`.
    pub fn cred(&self, principal: &Path, name: &str, args: &[&str]) -> PathBuf {
        issue_cred(&self.admin, principal, &self.s.0.join(name), args)
    }
}

/// `anode cred issue` with the administrator key `admin` for the holder of
/// `principal`, into `out`.
pub fn issue_cred(admin: &Path, principal: &Path, out: &Path, args: &[&str]) -> PathBuf {
    let o = Command::new(ANODE)
        .args(["cred", "issue", "--admin-key"])
        .arg(admin)
        .arg("--principal")
        .arg(principal)
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .expect("anode cred issue");
    assert!(o.status.success(), "{}", text(&o));
    out.to_path_buf()
}

/// A running line of three nodes; dropping it kills them and removes their
/// files.
pub struct Line {
    pub dir: PathBuf,
    pub nodes: Vec<Child>,
}

impl Line {
    /// Starts the line with security off.
    pub fn start() -> Line {
        Line::start_with(["", "", ""])
    }

    /// Starts the line; `extra[i]` is appended to node i+1's configuration
    /// (top-level keys first in it, then sections).
    pub fn start_with(extra: [&str; 3]) -> Line {
        Line::start_env(extra, &[])
    }

    /// [`Line::start_with`], with environment variables for the daemons.
    pub fn start_env(extra: [&str; 3], env: &[(&str, &str)]) -> Line {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "anode-apps-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ifaces = line3_interfaces(&free_ports(4));
        let routes = ["[routes]\ndefault_via = \"10.0.0.2\"\n", "", "[routes]\ndefault_via = \"10.0.0.2\"\n"];
        let configs: Vec<String> = (0..3)
            .map(|i| {
                let run = dir.join(format!("n{}", i + 1));
                format!(
                    "address = \"10.0.0.{}\"\nrun_dir = \"{}\"\n{}\n{}{}",
                    i + 1,
                    run.display(),
                    extra[i],
                    ifaces[i],
                    routes[i]
                )
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
                .envs(env.iter().copied())
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

    pub fn run_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    pub fn wait_ready(&mut self, i: usize) {
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

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("n{i}.log"))).unwrap_or_default()
    }

    /// `anode ARGS --run-dir <node i>`, to completion.
    pub fn run(&self, i: usize, args: &[&str]) -> Output {
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
    pub fn recv(&self, i: usize, args: &[&str]) -> Proc {
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
pub struct Proc {
    pub child: Option<Child>,
    err: BufReader<std::process::ChildStderr>,
}

impl Proc {
    /// Waits for it to finish: (exit code, stdout, rest of stderr).
    pub fn finish(mut self) -> (Option<i32>, Vec<u8>, String) {
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

/// The example modules built by `scripts/setup`.
pub fn modules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out")
}

/// The bytes of example module `name`.
pub fn module(name: &str) -> Vec<u8> {
    let p = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup)", p.display()))
}

/// A module credential for `code`, issued by the administrator key file
/// `admin` to `principal`, granting `ifaces`, expiring at `expires`.
pub fn issue_credential(
    admin: &Path,
    principal: [u8; 32],
    code: &[u8],
    ifaces: &[anode_cred::Interface],
    expires: Option<std::time::SystemTime>,
) -> Vec<u8> {
    use anode_cred::{GrantSpec, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
    let admin = anode_sec::Identity::load(admin).expect("admin key");
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(code))],
        interfaces: InterfaceSet::of(ifaces),
        limits: Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 },
        expires,
    };
    Issuer::from_secret(&admin.secret_seed())
        .expect("issuer")
        .issue(PrincipalId(principal), &spec)
        .expect("issue")
        .to_bytes()
        .to_vec()
}

/// `anode keys gen --name NAME` into `dir`: (secret key file, public key file).
pub fn user_keys(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let o = Command::new(ANODE).args(["keys", "gen", "--name", name, "--out"]).arg(dir).output().expect("keys gen");
    assert!(o.status.success(), "{}", text(&o));
    (dir.join(format!("{name}.key")), dir.join(format!("{name}.pub")))
}

/// Waits up to `secs` seconds for `f` to hold, polling every 50 ms.
pub fn eventually(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `anode node` on a one-interface node at 10.0.0.9 whose config
/// ends with `tail` (e.g. a `[modules]` section), in `dir`, where it must
/// refuse to start: waits for it to exit (killing it after 20 s) and
/// asserts that it exited, with a failure. Its output, for the reason.
pub fn node_refuses_to_start(dir: &Path, tail: &str) -> Output {
    let file = dir.join("refused.toml");
    let port = free_ports(1)[0];
    std::fs::write(
        &file,
        format!(
            "address = \"10.0.0.9\"\nrun_dir = \"{}\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:{port}\"\n{tail}",
            dir.join("run").display()
        ),
    )
    .expect("config");
    let mut child = Command::new(ANODE)
        .args(["node", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("anode node");
    let exited = eventually(20.0, || child.try_wait().expect("wait").is_some());
    if !exited {
        let _ = child.kill();
    }
    let o = child.wait_with_output().expect("output");
    assert!(exited && !o.status.success(), "{}", text(&o));
    o
}

/// Pads the wasm module `code` to `size` bytes with a custom section (which
/// wasm ignores) named "pad", its size LEB128-encoded in 5 bytes: a module
/// larger than one control datagram that loads as the original does.
pub fn pad_wasm(code: &mut Vec<u8>, size: usize) {
    let payload = u32::try_from(size - code.len() - 1 - 5).expect("a u32 section size");
    code.push(0);
    code.extend([0, 7, 14, 21].map(|sh| ((payload >> sh) & 0x7f) as u8 | 0x80));
    code.push((payload >> 28) as u8 & 0x0f);
    code.extend([3, b'p', b'a', b'd']);
    code.resize(size, 0xab);
}
