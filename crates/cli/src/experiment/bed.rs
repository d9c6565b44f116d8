//! A scratch testbed of real daemons driven through the `anode` binary, as
//! an operator and the testbed's users would drive it: the common part of
//! the experiments that run on daemons (Figs. 15 and 16 on daemons).

use anyhow::{Context, Result, anyhow, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A testbed in a scratch directory, brought down when dropped. Users'
/// commands go to one node of it, the target.
pub(crate) struct Testbed {
    anode: PathBuf,
    dir: PathBuf,
    /// The target node's name in the topology.
    target: String,
    /// The target node's first listen address.
    node: String,
}

impl Testbed {
    /// `anode testbed up` of `topology` (the topology file's text) in
    /// `dir`/tb, `dir` made afresh, with a key pair per user of `users`
    /// (`dir`/NAME.key, .pub) and `extra` arguments; users' commands go
    /// to node `target`.
    pub(crate) fn up(
        anode: PathBuf,
        dir: PathBuf,
        topology: &str,
        users: &[&str],
        extra: &[&str],
        target: &str,
    ) -> Result<Testbed> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut bed = Testbed { anode, dir, target: target.to_string(), node: String::new() };
        let topo = bed.dir.join("topology.toml");
        std::fs::write(&topo, topology).with_context(|| format!("writing {}", topo.display()))?;
        let mut up = vec!["testbed".to_string(), "up".into(), topo.to_string_lossy().into_owned()];
        for u in users {
            bed.cmd(&["keys", "gen", "--name", u, "--out", &bed.p("")])?;
            up.extend(["--user".to_string(), bed.p(&format!("{u}.pub"))]);
        }
        up.extend(extra.iter().map(|s| s.to_string()));
        up.extend(["--dir".to_string(), bed.p("tb")]);
        let args: Vec<&str> = up.iter().map(String::as_str).collect();
        bed.cmd(&args)?;
        let file = bed.dir.join("tb").join(target).join("node.toml");
        let cfg = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        bed.node = cfg
            .lines()
            .find_map(|l| l.strip_prefix("listen = \""))
            .map(|l| l.trim_end_matches('"').to_string())
            .ok_or_else(|| anyhow!("no listen line in {}", file.display()))?;
        Ok(bed)
    }

    /// Runs `anode ARGS`: its standard output, or an error with its output.
    pub(crate) fn cmd(&self, args: &[&str]) -> Result<String> {
        let o = Command::new(&self.anode).args(args).output().with_context(|| format!("running anode {args:?}"))?;
        if !o.status.success() {
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            bail!("anode {args:?} failed: {text}");
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The scratch directory (the testbed in its `tb/`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A path in the scratch directory, as a string for arguments.
    pub(crate) fn p(&self, rel: &str) -> String {
        self.dir.join(rel).to_string_lossy().into_owned()
    }

    /// A command of user `u` to the target node, over `u`'s SA.
    pub(crate) fn user(&self, u: &str, args: &[&str]) -> Result<String> {
        let mut a = args.to_vec();
        let (node_key, key) = (self.p(&format!("tb/keys/{}.pub", self.target)), self.p(&format!("{u}.key")));
        a.extend_from_slice(&["--node", &self.node, "--node-key", &node_key, "--key", &key]);
        self.cmd(&a)
    }

    /// `anode cred issue` by the testbed's administrator for user `u`
    /// with `args`, saved as `name` in the scratch directory: its path.
    pub(crate) fn cred(&self, u: &str, name: &str, args: &[&str]) -> Result<String> {
        let out = self.p(name);
        let (admin, principal) = (self.p("tb/keys/admin.key"), self.p(&format!("{u}.pub")));
        let mut a = vec!["cred", "issue", "--admin-key", &admin, "--principal", &principal];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", &out]);
        self.cmd(&a)?;
        Ok(out)
    }

    /// `anode ARGS --json --run-dir` of the target node, parsed.
    pub(crate) fn json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut a = args.to_vec();
        let rd = self.p(&format!("tb/{}", self.target));
        a.extend_from_slice(&["--json", "--run-dir", &rd]);
        serde_json::from_str(&self.cmd(&a)?).with_context(|| format!("JSON of anode {args:?}"))
    }

    /// `anode testbed down`.
    pub(crate) fn down(&self) {
        let _ = Command::new(&self.anode).args(["testbed", "down", "--dir"]).arg(self.dir.join("tb")).output();
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.down();
    }
}

/// The first of `n` consecutive free UDP ports on 127.0.0.1, below the
/// kernel's ephemeral range, for `anode testbed up --configs-only
/// --base-port` when the experiment starts the nodes itself (without
/// `--base-port` those configs listen from 7000, which another testbed
/// may hold).
pub(crate) fn free_base(n: u16) -> Result<u16> {
    let floor = anode_daemon::ports::ephemeral_floor();
    for _ in 0..64 {
        let held = anode_daemon::ports::reserve_loopback(1).context("reserving a loopback port")?;
        let base = held.first().and_then(|s| s.local_addr().ok()).map(|a| a.port()).unwrap_or(0);
        drop(held);
        if base == 0 || u32::from(base) + u32::from(n) > u32::from(floor) {
            continue;
        }
        let block: Vec<_> = (base..base + n)
            .map_while(|p| std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, p)).ok())
            .collect();
        if block.len() == usize::from(n) {
            return Ok(base);
        }
    }
    bail!("no block of {n} free loopback UDP ports")
}
