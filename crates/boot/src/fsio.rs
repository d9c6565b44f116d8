//! The filesystem driver: the node's boot directory, its component files,
//! and local mirror directories as recovery sources. This is the only
//! module of the crate that touches files and clocks.
//!
//! A boot directory holds:
//!
//! ```text
//! DIR/boot.toml        settings (BootConfig): node name, policy, mirrors, binary
//! DIR/root.json        the trust anchor (the operator's root metadata)
//! DIR/N.root.json      rotations of the root, if any
//! DIR/timestamp.json   DIR/snapshot.json   DIR/targets.json
//! DIR/state.json       written by the node: newest versions trusted, latest known time
//! ```
//!
//! A repository (a mirror, or what a peer node serves) holds
//! `REPO/metadata/<file>` and `REPO/targets/<node>/<layer>/<file>`; it never
//! holds a secret (`anode boot sign` does not copy key files there, and the
//! mirror refuses to serve a file that is one).

use crate::boot::{BootError, BootEvent, BootIo, BootParams, Policy, Source, boot};
use crate::chain::{ChainError, VerifiedChain};
use crate::layer::{ComponentName, Layer};
use crate::recovery::{FetchLimits, Lookup, serve};
use crate::verify::Limits;
use serde::Deserialize;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{Instant, SystemTime};

/// The settings file of a boot directory.
pub const SETTINGS: &str = "boot.toml";

fn attempts() -> u32 {
    3
}
fn request_timeout_ms() -> u64 {
    2_000
}
fn attempt_deadline_ms() -> u64 {
    30_000
}

/// `DIR/boot.toml`: how this node boots.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootConfig {
    /// This node's name in the targets metadata.
    pub node: String,
    /// `refuse` (default), `recover` or `degraded`.
    #[serde(default)]
    pub policy: Policy,
    /// Local repository directories to recover from, tried in order
    /// (relative paths: to the boot directory).
    #[serde(default)]
    pub mirrors: Vec<PathBuf>,
    /// Peer nodes to recover from over a security association, as UDP
    /// endpoints (`host:port` of one of their interfaces); tried after the
    /// mirrors. Used by `anode node --boot` (not by this crate).
    #[serde(default)]
    pub peers: Vec<String>,
    /// The secret key file the node opens its recovery SAs with (relative:
    /// to the boot directory). Not the node's own key: that is a verified
    /// component, and a peer knows it as a neighbour, not as a user. Peers
    /// must list its public key in `[security] users`. Needed with `peers`.
    pub recovery_key: Option<PathBuf>,
    /// The node binary to verify (default: the running executable).
    pub binary: Option<PathBuf>,
    /// The node's base directory, which component names are relative to
    /// (default: the directory of the node's configuration file; relative
    /// paths: to the boot directory).
    pub base: Option<PathBuf>,
    /// Recovery attempts per component, over all sources in turn.
    #[serde(default = "attempts")]
    pub max_attempts: u32,
    /// A recovery request unanswered this long ends the attempt.
    #[serde(default = "request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// A recovery attempt not complete this long ends.
    #[serde(default = "attempt_deadline_ms")]
    pub attempt_deadline_ms: u64,
}

/// A boot that could not even begin, or that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsBootError {
    /// The settings file does not parse.
    #[error("{file}: {reason}")]
    Settings {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The boot failed: the node must not start.
    #[error(transparent)]
    Boot(#[from] BootError),
}

impl BootConfig {
    /// Parses `boot.toml` text.
    pub fn from_toml(text: &str) -> Result<BootConfig, String> {
        let c: BootConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        if !crate::layer::valid_node(&c.node) {
            return Err(format!("node {:?}: 1..=32 characters of [A-Za-z0-9._-]", c.node));
        }
        Ok(c)
    }

    /// Reads `DIR/boot.toml`.
    pub fn load(dir: &Path) -> Result<BootConfig, FsBootError> {
        let file = dir.join(SETTINGS);
        let text = read_bounded(&file, 64 << 10)
            .map_err(|reason| FsBootError::Settings { file: file.clone(), reason })?
            .ok_or_else(|| FsBootError::Settings { file: file.clone(), reason: "missing".into() })?;
        let text = String::from_utf8(text)
            .map_err(|_| FsBootError::Settings { file: file.clone(), reason: "not UTF-8".into() })?;
        BootConfig::from_toml(&text).map_err(|reason| FsBootError::Settings { file, reason })
    }

    /// Recovery limits from these settings.
    pub fn fetch_limits(&self) -> FetchLimits {
        FetchLimits {
            max_attempts: self.max_attempts,
            request_timeout_ms: self.request_timeout_ms,
            attempt_deadline_ms: self.attempt_deadline_ms,
            ..FetchLimits::default()
        }
    }
}

/// Reads at most `max` + 1 bytes of `path`; `Ok(None)` if it does not exist.
pub fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut v = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut v).map_err(|e| e.to_string())?;
    Ok(Some(v))
}

/// Replaces `path` atomically: a temporary file in the same directory,
/// synced, then renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.anode-tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// Lexical normalisation to an absolute path (no symlinks followed): `.`
/// dropped, `..` pops.
pub fn normalize(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The boot directory and the node's files.
#[derive(Debug)]
pub struct FsIo {
    dir: PathBuf,
    base: PathBuf,
    binary: PathBuf,
    start: Instant,
}

impl FsIo {
    /// Files of boot directory `dir`; components relative to `base`; the
    /// binary component read from `binary`.
    pub fn new(dir: &Path, base: &Path, binary: &Path) -> FsIo {
        FsIo { dir: dir.to_path_buf(), base: base.to_path_buf(), binary: binary.to_path_buf(), start: Instant::now() }
    }

    fn path_of(&self, name: &ComponentName) -> PathBuf {
        match name.layer {
            Layer::Binary => self.binary.clone(),
            _ => self.base.join(&name.file),
        }
    }
}

impl BootIo for FsIo {
    fn read_boot_file(&mut self, file: &str, max: usize) -> Result<Option<Vec<u8>>, String> {
        read_bounded(&self.dir.join(file), max as u64)
    }
    fn write_boot_file(&mut self, file: &str, bytes: &[u8]) -> Result<(), String> {
        write_atomic(&self.dir.join(file), bytes)
    }
    fn read_component(&mut self, name: &ComponentName, max: u64) -> Result<Vec<u8>, String> {
        let p = self.path_of(name);
        read_bounded(&p, max.saturating_sub(1))?.ok_or_else(|| format!("{}: no such file", p.display()))
    }
    fn write_component(&mut self, name: &ComponentName, bytes: &[u8]) -> Result<(), String> {
        write_atomic(&self.path_of(name), bytes)
    }
    fn now_ms(&mut self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
    fn wait_until(&mut self, ms: u64) {
        let now = self.now_ms();
        if ms > now {
            std::thread::sleep(std::time::Duration::from_millis((ms - now).min(1_000)));
        }
    }
}

/// A file's length and modification time: a cached copy is used only
/// while they are unchanged.
type Stamp = (u64, Option<SystemTime>);

/// A local repository directory as a recovery source: answers recovery
/// requests with the same protocol a peer node would, in process. The file
/// being fetched is cached (one request per chunk) for as long as its length
/// and modification time do not change, so a repository updated while a
/// node serves it is served as it is now.
#[derive(Debug)]
pub struct MirrorSource {
    dir: PathBuf,
    cache: Option<(String, Stamp, Vec<u8>)>,
    max: u64,
}

impl MirrorSource {
    /// The repository at `dir`.
    pub fn new(dir: &Path) -> MirrorSource {
        MirrorSource { dir: dir.to_path_buf(), cache: None, max: Limits::default().component }
    }

    fn path(&self, name: &str) -> PathBuf {
        match name.strip_prefix("metadata/") {
            Some(f) => self.dir.join("metadata").join(f),
            None => self.dir.join("targets").join(name),
        }
    }

    fn stamp(&self, name: &str) -> Option<Stamp> {
        std::fs::metadata(self.path(name)).ok().map(|m| (m.len(), m.modified().ok()))
    }

    /// What the repository holds under a (validated) resource name.
    fn load(&mut self, name: &str) -> Option<Result<Vec<u8>, ()>> {
        match read_bounded(&self.path(name), self.max) {
            Ok(Some(b)) if crate::layer::is_secret_file(&b) => Some(Err(())),
            Ok(Some(b)) => Some(Ok(b)),
            _ => None,
        }
    }
}

impl Source for MirrorSource {
    fn name(&self) -> String {
        format!("mirror {}", self.dir.display())
    }
    fn exchange(&mut self, request: &[u8]) -> Option<Vec<u8>> {
        let name = match crate::recovery::parse(request) {
            Ok(crate::recovery::Repr::Fetch { name, .. }) => name.to_string(),
            _ => String::new(),
        };
        let stamp = if name.is_empty() { None } else { self.stamp(&name) };
        if stamp.is_some() && self.cache.as_ref().is_none_or(|(n, st, _)| *n != name || Some(*st) != stamp) {
            self.cache = None;
            match (self.load(&name), stamp) {
                (Some(Ok(b)), Some(st)) => self.cache = Some((name.clone(), st, b)),
                (Some(Err(())), _) => return serve(request, |_| Lookup::Refused),
                _ => {}
            }
        }
        let found =
            self.cache.as_ref().filter(|(n, st, _)| *n == name && Some(*st) == stamp).map(|(_, _, b)| b.as_slice());
        serve(request, |_| found.map_or(Lookup::NotFound, Lookup::Found))
    }
}

/// A node's boot, as the daemon runs it.
#[derive(Debug, Clone)]
pub struct NodeBoot {
    /// The settings used.
    pub config: BootConfig,
    /// The verified chain.
    pub chain: VerifiedChain,
    /// What happened.
    pub events: Vec<BootEvent>,
    base: PathBuf,
}

impl NodeBoot {
    /// The verified bytes of the node file at `path` (as named in its
    /// config: relative to the working directory or absolute). Use these
    /// instead of reading the file.
    ///
    /// # Errors
    /// [`ChainError::NotInChain`] for a file the metadata does not list (it
    /// must not be used), [`ChainError::Skipped`] for one a degraded start
    /// left out.
    pub fn read(&self, path: &Path) -> Result<&[u8], ChainError> {
        let p = normalize(path);
        let rel = p
            .strip_prefix(&self.base)
            .ok()
            .and_then(|r| {
                let parts: Option<Vec<&str>> = r.components().map(|c| c.as_os_str().to_str()).collect();
                parts.map(|v| v.join("/"))
            })
            .ok_or_else(|| ChainError::NotInChain(p.display().to_string()))?;
        self.chain.find(&rel).map(|(_, b)| b)
    }

    /// The verified binary.
    pub fn binary(&self) -> Result<&[u8], ChainError> {
        self.chain.get(Layer::Binary, "anode")
    }
}

/// Boots a node from boot directory `dir`, its components relative to
/// `base` (the directory of its configuration file, unless `boot.toml` names
/// a `base`), with the mirrors of
/// `DIR/boot.toml` and then `extra` sources (peer nodes) for recovery.
/// `commit`: store recovered copies and record the new state.
///
/// # Errors
/// [`FsBootError`]: the node must not start.
pub fn boot_node(
    dir: &Path,
    base: &Path,
    now: SystemTime,
    commit: bool,
    extra: Vec<Box<dyn Source>>,
) -> Result<NodeBoot, FsBootError> {
    boot_node_with(dir, base, now, commit, |_| Ok(extra))
}

/// [`boot_node`], the extra sources made by `extra` from the settings (the
/// daemon's peers, from `peers` and `recovery_key`).
///
/// # Errors
/// [`FsBootError`]: the node must not start (`Settings` if `extra` fails).
pub fn boot_node_with(
    dir: &Path,
    base: &Path,
    now: SystemTime,
    commit: bool,
    extra: impl FnOnce(&BootConfig) -> Result<Vec<Box<dyn Source>>, String>,
) -> Result<NodeBoot, FsBootError> {
    let config = BootConfig::load(dir)?;
    let extra = extra(&config).map_err(|reason| FsBootError::Settings { file: dir.join(SETTINGS), reason })?;
    let binary = match &config.binary {
        Some(b) => dir.join(b),
        None => std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
    };
    let base = match &config.base {
        Some(b) => normalize(&dir.join(b)),
        None => normalize(base),
    };
    let mut io = FsIo::new(dir, &base, &binary);
    let mut sources: Vec<Box<dyn Source>> =
        config.mirrors.iter().map(|m| Box::new(MirrorSource::new(&dir.join(m))) as Box<dyn Source>).collect();
    sources.extend(extra);
    let params = BootParams {
        node: config.node.clone(),
        policy: config.policy,
        limits: Limits::default(),
        fetch: config.fetch_limits(),
        commit,
    };
    let out = boot(&mut io, &mut sources, &params, now)?;
    Ok(NodeBoot { config, chain: out.chain, events: out.events, base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_with_their_defaults_and_refuse_what_they_do_not_know() {
        let c = BootConfig::from_toml("node = \"b\"\n").expect("minimal");
        assert_eq!(
            (c.policy, c.max_attempts, c.request_timeout_ms, c.attempt_deadline_ms),
            (Policy::Refuse, 3, 2_000, 30_000)
        );
        assert!(c.peers.is_empty() && c.recovery_key.is_none() && c.mirrors.is_empty());
        let c = BootConfig::from_toml(
            "node = \"b\"\npolicy = \"degraded\"\npeers = [\"127.0.0.1:7000\"]\nrecovery_key = \"r.key\"\n",
        )
        .expect("peers");
        assert_eq!(c.peers, ["127.0.0.1:7000"]);
        assert_eq!(c.recovery_key.as_deref(), Some(Path::new("r.key")));
        assert_eq!(c.policy, Policy::Degraded);
        for bad in ["", "node = \"b\"\nkey = 1\n", "node = \"b/c\"\n", "node = \"b\"\npolicy = \"maybe\"\n"] {
            assert!(BootConfig::from_toml(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_mirror_serves_a_file_as_it_is_now_not_as_it_was_cached() {
        use crate::recovery::{Repr, parse};
        let dir = std::env::temp_dir().join(format!("anode-mirror-cache-{}", std::process::id()));
        let file = dir.join("targets/b/switchlets/m.wasm");
        write_atomic(&file, b"first copy").expect("write");
        let mut m = MirrorSource::new(&dir);
        let ask = |m: &mut MirrorSource, id| {
            let req = Repr::Fetch { id, offset: 0, max: 1024, name: "b/switchlets/m.wasm" }.to_vec();
            let reply = m.exchange(&req).expect("a reply");
            match parse(&reply) {
                Ok(Repr::Data { data, .. }) => data.to_vec(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(ask(&mut m, 1), b"first copy");
        assert_eq!(ask(&mut m, 2), b"first copy", "cached");
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_atomic(&file, b"other copy").expect("rewrite, same length");
        assert_eq!(ask(&mut m, 3), b"other copy", "the cache follows the file");
        std::fs::remove_file(&file).expect("remove");
        let req = Repr::Fetch { id: 4, offset: 0, max: 1024, name: "b/switchlets/m.wasm" }.to_vec();
        assert!(matches!(parse(&m.exchange(&req).expect("reply")), Ok(Repr::Error { .. })), "gone: not found");
        // Secrets are never served: a node key or a domain secret put there by mistake.
        for (i, secret) in [anode_sec::identity::SECRET_TAG, anode_sec::domain::SECRET_TAG].iter().enumerate() {
            write_atomic(&dir.join("targets/b/keys/s"), format!("{secret} 00\n").as_bytes()).expect("write");
            let req = Repr::Fetch { id: 5 + i as u32, offset: 0, max: 1024, name: "b/keys/s" }.to_vec();
            assert!(
                matches!(
                    parse(&m.exchange(&req).expect("reply")),
                    Ok(Repr::Error { code: crate::recovery::ErrorCode::Refused, .. })
                ),
                "{secret}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
