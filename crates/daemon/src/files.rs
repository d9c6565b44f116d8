//! Files: the configuration and topology files (read and validated, with
//! relative paths resolved against the configuration file), the run
//! directory and the socket files in it.

use crate::{APP_SOCKET, CONTROL_SOCKET, DaemonError};
use anode_node::config::{NodeConfig, Topology};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// A configuration file read with its topology.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The configuration file.
    pub path: PathBuf,
    /// Its contents.
    pub config: NodeConfig,
    /// The topology file, if `routes.topology` names one (resolved
    /// relative to the configuration file).
    pub topology_path: Option<PathBuf>,
    /// The parsed topology.
    pub topology: Option<Topology>,
}

/// Where the files read at start come from: the filesystem, or a verified
/// boot chain (`anode node --boot`), whose bytes are used instead of
/// reading the path again.
#[derive(Debug, Clone, Copy)]
pub enum StartFiles<'a> {
    /// Read each file from its path.
    Disk,
    /// Take each file's verified bytes from the chain.
    Chain(&'a anode_boot::fsio::NodeBoot),
}

impl StartFiles<'_> {
    /// The bytes of `path`: `Ok(None)` for a component a degraded start left
    /// out.
    ///
    /// # Errors
    /// [`DaemonError::ReadFile`] from the disk; [`DaemonError::Boot`] for a
    /// file the chain does not hold (unsigned).
    pub fn read(self, path: &Path) -> Result<Option<Vec<u8>>, DaemonError> {
        match self {
            StartFiles::Disk => std::fs::read(path)
                .map(Some)
                .map_err(|source| DaemonError::ReadFile { file: path.to_path_buf(), source }),
            StartFiles::Chain(nb) => match nb.read(path) {
                Ok(b) => Ok(Some(b.to_vec())),
                Err(anode_boot::ChainError::Skipped(_)) => Ok(None),
                Err(source) => Err(DaemonError::Boot { file: path.to_path_buf(), source }),
            },
        }
    }

    /// The bytes of `path`, which no start may leave out.
    ///
    /// # Errors
    /// As [`StartFiles::read`], and [`DaemonError::Boot`] for a skipped one.
    pub fn read_needed(self, path: &Path) -> Result<Vec<u8>, DaemonError> {
        self.read(path)?.ok_or_else(|| DaemonError::Boot {
            file: path.to_path_buf(),
            source: anode_boot::ChainError::Skipped(path.display().to_string()),
        })
    }

    /// The text of `path`.
    fn read_text(self, path: &Path) -> Result<String, DaemonError> {
        String::from_utf8(self.read_needed(path)?).map_err(|_| DaemonError::ReadFile {
            file: path.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"),
        })
    }
}

/// The `boot` section of `status`: policy, metadata versions, and each
/// component's verdict, layer by layer.
pub fn boot_json(nb: &anode_boot::fsio::NodeBoot) -> serde_json::Value {
    use anode_boot::Verdict;
    let c = &nb.chain;
    let components: Vec<serde_json::Value> = c
        .report()
        .iter()
        .map(|r| {
            let why = match &r.verdict {
                Verdict::Verified => None,
                Verdict::Recovered { source, local } => Some(format!("{local}; good copy from {source}")),
                Verdict::Skipped { error, recovery } => Some(format!("{error}; {recovery}")),
                Verdict::Failed(e) => Some(e.to_string()),
            };
            serde_json::json!({"layer": r.name.layer.name(), "name": r.name.target(), "length": r.length,
                               "verdict": r.verdict.word(), "why": why})
        })
        .collect();
    let count = |w: &str| c.report().iter().filter(|r| r.verdict.word() == w).count();
    let roles: serde_json::Map<String, serde_json::Value> = c
        .roles()
        .iter()
        .map(|r| (r.role.to_string(), serde_json::json!({"version": r.version, "expires": r.expires.to_string()})))
        .collect();
    serde_json::json!({
        "node": c.node(),
        "policy": nb.config.policy.name(),
        "degraded": c.degraded(),
        "verified": count("verified"),
        "recovered": count("recovered"),
        "skipped": count("skipped"),
        "events": nb.events.len(),
        "metadata": roles,
        "components": components,
    })
}

/// The key distribution service of `[domain]` `d`: its secret read from
/// `files` (a file group or others can read is refused, as for node keys).
///
/// # Errors
/// [`DaemonError::Domain`], or the secret's read error.
pub fn domain_kdc(d: &anode_node::config::DomainConfig, files: StartFiles<'_>) -> Result<anode_sec::Kdc, DaemonError> {
    let rate = d.tickets_per_user_per_sec;
    let cfg = anode_sec::KdcConfig {
        epoch: d.epoch,
        max_lifetime_s: d.max_ticket_secs,
        per_user_per_sec: rate,
        per_user_burst: rate.saturating_mul(5),
        ..Default::default()
    };
    anode_sec::Kdc::new(domain_key(d, files)?, cfg, 0).map_err(|e| DaemonError::Domain(e.to_string()))
}

/// The domain of `[domain]` `d`: its operator's key and its secret, read
/// from `files` (a file group or others can read is refused, as for node
/// keys).
///
/// # Errors
/// [`DaemonError::Domain`], or the secret's read error.
pub fn domain_key(
    d: &anode_node::config::DomainConfig,
    files: StartFiles<'_>,
) -> Result<anode_sec::DomainKey, DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |what: String| DaemonError::Domain(format!("secret {}: {what}", d.secret.display()));
    let mode = std::fs::metadata(&d.secret).map_err(|e| bad(e.to_string()))?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(format!("accessible by group or others (mode {mode:o}); run `chmod 600`")));
    }
    let bytes = zeroize::Zeroizing::new(files.read_needed(&d.secret)?);
    let secret = std::str::from_utf8(&bytes)
        .ok()
        .and_then(anode_sec::DomainKey::parse_secret)
        .ok_or_else(|| bad(format!("not `{} <64 hex digits>`", anode_sec::domain::SECRET_TAG)))?;
    let operator = anode_sec::PublicKey::parse(&d.operator).map_err(|e| DaemonError::Domain(e.to_string()))?;
    Ok(anode_sec::DomainKey::new(operator, &secret))
}

/// Reads and validates a node configuration file and its topology file;
/// errors name the file at fault. Relative `run_dir` and `routes.topology`
/// paths are resolved against the configuration file's directory.
pub fn load_config(path: &Path) -> Result<LoadedConfig, DaemonError> {
    load_config_from(path, StartFiles::Disk)
}

/// [`load_config`], the configuration and topology taken from `files`.
pub fn load_config_from(path: &Path, files: StartFiles<'_>) -> Result<LoadedConfig, DaemonError> {
    let read = |p: &Path| files.read_text(p);
    let mut config = NodeConfig::from_toml(&read(path)?)
        .map_err(|source| DaemonError::Config { file: path.to_path_buf(), source })?;
    let base = path.parent().unwrap_or(Path::new("."));
    if let Some(rd) = &config.run_dir
        && rd.is_relative()
    {
        config.run_dir = Some(base.join(rd));
    }
    if let Some(m) = config.modules.as_mut() {
        for l in &mut m.loads {
            if l.file.is_relative() {
                l.file = base.join(&l.file);
            }
            if l.credential.is_relative() {
                l.credential = base.join(&l.credential);
            }
        }
        for s in &mut m.sessions {
            if s.credential.is_relative() {
                s.credential = base.join(&s.credential);
            }
        }
        for p in &mut m.pods {
            if p.file.is_relative() {
                p.file = base.join(&p.file);
            }
            if p.credential.is_relative() {
                p.credential = base.join(&p.credential);
            }
        }
    }
    if let Some(m) = config.monitor.as_mut() {
        for l in &mut m.loads {
            for p in [&mut l.file, &mut l.credential] {
                if p.is_relative() {
                    *p = base.join(&*p);
                }
            }
        }
        for p in [&mut m.anon_key, &mut m.json, &mut m.ipfix, &mut m.pcap].into_iter().flatten() {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
    if let Some(sec) = config.security.as_mut()
        && let Some(k) = &sec.key
        && k.is_relative()
    {
        sec.key = Some(base.join(k));
    }
    if let Some(d) = config.domain.as_mut()
        && d.secret.is_relative()
    {
        d.secret = base.join(&d.secret);
    }
    let (mut topology_path, mut topology) = (None, None);
    if let Some(t) = &config.routes.topology {
        let tp = base.join(t);
        let topo =
            Topology::from_toml(&read(&tp)?).map_err(|source| DaemonError::Config { file: tp.clone(), source })?;
        topo.next_hops(config.address).map_err(|source| DaemonError::Config { file: tp.clone(), source })?;
        topology_path = Some(tp);
        topology = Some(topo);
    }
    Ok(LoadedConfig { path: path.to_path_buf(), config, topology_path, topology })
}

/// The run directory used when the configuration names none:
/// `<temp dir>/anode-<address>`.
pub fn default_run_dir(address: core::net::Ipv4Addr) -> PathBuf {
    std::env::temp_dir().join(format!("anode-{address}"))
}

/// The run directory of a configuration.
pub fn run_dir_of(cfg: &NodeConfig) -> PathBuf {
    cfg.run_dir.clone().unwrap_or_else(|| default_run_dir(cfg.address))
}

/// Removes the socket files when the daemon goes away, however it does,
/// and the run directory too if the daemon created it and it is empty.
#[derive(Debug)]
pub(crate) struct SocketFiles {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) created_dir: Option<PathBuf>,
}

impl core::ops::Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.files {
            let _ = std::fs::remove_file(p);
        }
        if let Some(d) = &self.created_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Makes sure `dir` is a directory of ours that no other user can write
/// to, without a live node; removes stale sockets. Says whether it created
/// the directory (mode 0700, or 0750 and the group `group`).
pub(crate) fn prepare_run_dir(dir: &Path, group: Option<u32>) -> Result<bool, DaemonError> {
    let bad = |reason: String| DaemonError::RunDir { dir: dir.to_path_buf(), reason };
    let mut created = false;
    match std::fs::symlink_metadata(dir) {
        Ok(m) => {
            if !m.is_dir() {
                return Err(bad("exists and is not a directory".into()));
            }
            let me = nix::unistd::getuid().as_raw();
            if m.uid() != me {
                return Err(bad(format!("owned by uid {}, not by this user (uid {me})", m.uid())));
            }
            let mode = m.mode() & 0o777;
            // Whoever can write to the directory can replace the sockets.
            let group_ok = group.is_some_and(|g| g == m.gid());
            if mode & 0o002 != 0 || (mode & 0o020 != 0 && !group_ok) {
                return Err(bad(format!(
                    "is writable by other users (mode {mode:o}); make it private (chmod 700), or 0750 with \
                     [local] socket_group"
                )));
            }
            if mode & 0o005 != 0 {
                warn!(run_dir = %dir.display(), mode = format!("{mode:o}"),
                      "run directory is readable by other users (its sockets keep their own mode)");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mode = if group.is_some() { 0o750 } else { 0o700 };
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(|e| bad(format!("cannot create: {e}")))?;
            // The mode above is masked by the umask; set it exactly.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                .map_err(|e| bad(format!("cannot set mode {mode:o}: {e}")))?;
            if let Some(g) = group {
                std::os::unix::fs::chown(dir, None, Some(g)).map_err(|e| bad(format!("cannot set group {g}: {e}")))?;
            }
            created = true;
        }
        Err(e) => return Err(bad(e.to_string())),
    }
    let control = dir.join(CONTROL_SOCKET);
    if UnixStream::connect(&control).is_ok() {
        return Err(DaemonError::AlreadyRunning(dir.to_path_buf()));
    }
    for name in [APP_SOCKET, CONTROL_SOCKET] {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => info!(path = %p.display(), "removed stale socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(format!("cannot remove stale {}: {e}", p.display()))),
        }
    }
    Ok(created)
}

/// Binds a Unix socket at `path` with exactly `mode` (and `group`), whatever
/// the umask: bound under a temporary name, its mode and group set, then
/// renamed into place, so it is never reachable with a looser mode.
pub(crate) fn bind_socket<T>(
    path: &Path,
    mode: u32,
    group: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<T>,
) -> Result<T, DaemonError> {
    let err = |source| DaemonError::LocalSocket { path: path.to_path_buf(), source };
    let name = path.file_name().map_or_else(|| "socket".into(), |n| n.to_string_lossy());
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let sock = bind(&tmp).map_err(err)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .and_then(|()| group.map_or(Ok(()), |g| std::os::unix::fs::chown(&tmp, None, Some(g))))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anode_node::core::Node;
    use core::net::Ipv4Addr;

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/node").join(name)
    }

    #[test]
    fn example_line_loads_with_routes_from_the_topology() {
        let a = |n| Ipv4Addr::new(10, 0, 0, n);
        for (file, addr, far, via) in
            [("a.toml", a(1), a(3), a(2)), ("b.toml", a(2), a(3), a(3)), ("c.toml", a(3), a(1), a(2))]
        {
            let l = load_config(&example(file)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(l.config.address, addr);
            assert!(l.topology_path.as_ref().is_some_and(|p| p.ends_with("examples/node/topology.toml")));
            let node = Node::new(&l.config, l.topology.as_ref()).expect("node");
            assert_eq!(node.next_hop(far), Some(via), "{file}");
            assert_eq!(run_dir_of(&l.config), default_run_dir(addr));
        }
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let dir = std::env::temp_dir().join(format!("anode-cfgtest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let cfg = dir.join("n.toml");
        std::fs::write(
            &cfg,
            "address = \"10.0.0.9\"\nrun_dir = \"run\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:1\"\n\
             [routes]\ntopology = \"t.toml\"\n",
        )
        .expect("write");
        let e = load_config(&cfg).expect_err("no topology file");
        assert!(e.to_string().starts_with(&format!("cannot read {}", dir.join("t.toml").display())), "{e}");
        std::fs::write(dir.join("t.toml"), "node = [{ name = \"a\", address = \"10.0.0.1\" }]\n").expect("write");
        let e = load_config(&cfg).expect_err("not in topology");
        assert_eq!(
            e.to_string(),
            format!("{}: this node's address 10.0.0.9 is not in the topology", dir.join("t.toml").display())
        );
        std::fs::write(dir.join("t.toml"), "node = [{ name = \"a\", address = \"10.0.0.9\" }]\n").expect("write");
        let l = load_config(&cfg).expect("loads");
        assert_eq!(run_dir_of(&l.config), dir.join("run"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
