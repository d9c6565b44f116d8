//! An operator's repository and a node's files, in memory.
#![allow(dead_code, clippy::unwrap_used)]

use anode_boot::boot::{BootIo, BootParams, Policy, SNAPSHOT, Source, TARGETS, TIMESTAMP};
use anode_boot::recovery::{FetchLimits, Lookup, serve};
use anode_boot::sign::{self, RoleKeys, RootSpec, Targets};
use anode_boot::{ComponentName, Layer, Limits};
use anode_sec::Identity;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

pub const DAY: Duration = Duration::from_secs(86_400);

pub fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

pub fn id(n: u8) -> Identity {
    Identity::from_seed(&[n; 32])
}

/// The operator's keys: root 2-of-3, targets 2-of-2, one snapshot and one
/// timestamp key.
pub struct Keys {
    pub root: Vec<Identity>,
    pub targets: Vec<Identity>,
    pub snapshot: Identity,
    pub timestamp: Identity,
}

impl Keys {
    pub fn new() -> Keys {
        Keys { root: vec![id(1), id(2), id(3)], targets: vec![id(4), id(5)], snapshot: id(6), timestamp: id(7) }
    }
    pub fn spec(&self, version: u32) -> RootSpec {
        RootSpec {
            version,
            expires: now() + 365 * DAY,
            root: RoleKeys { keys: self.root.iter().map(|k| k.public()).collect(), threshold: 2 },
            targets: RoleKeys { keys: self.targets.iter().map(|k| k.public()).collect(), threshold: 2 },
            snapshot: RoleKeys::one(self.snapshot.public()),
            timestamp: RoleKeys::one(self.timestamp.public()),
        }
    }
}

/// The components of node `b` (and one of node `c`), by target name.
pub fn components(tag: &str) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    m.insert("b/binary/anode".into(), format!("\x7fELF anode binary {tag}").into_bytes());
    m.insert("b/config/node.toml".into(), format!("address = \"10.0.0.2\" # {tag}\n").into_bytes());
    m.insert("b/config/topology.toml".into(), b"node = []\n".to_vec());
    m.insert(
        "b/keys/keys/b.key".into(),
        format!("{} {}\n", anode_sec::identity::SECRET_TAG, "ab".repeat(32)).into_bytes(),
    );
    m.insert("b/keys/keys/cred.bin".into(), b"biscuit credential bytes".to_vec());
    m.insert("b/switchlets/mods/counter.wasm".into(), format!("\0asm counter {tag}").into_bytes());
    m.insert("b/monitor/mods/flows.wasm".into(), b"\0asm flows".to_vec());
    m.insert("c/config/node.toml".into(), b"address = \"10.0.0.3\"\n".to_vec());
    m
}

/// One published state of the repository.
#[derive(Clone)]
pub struct Published {
    pub root: Vec<u8>,
    pub timestamp: Vec<u8>,
    pub snapshot: Vec<u8>,
    pub targets: Vec<u8>,
    pub files: BTreeMap<String, Vec<u8>>,
}

/// Signs a repository: root v1 with `keys`, targets/snapshot/timestamp at `version`.
pub fn publish(keys: &Keys, version: u32, files: BTreeMap<String, Vec<u8>>, expires: SystemTime) -> Published {
    let root = sign::root(&keys.spec(1), &[&keys.root[0], &keys.root[1]]).unwrap();
    let mut t = Targets::new();
    for (n, b) in &files {
        t.add(&ComponentName::parse(n).unwrap(), b).unwrap();
    }
    let targets = t.sign(version, expires, &[&keys.targets[0], &keys.targets[1]]).unwrap();
    let snapshot = sign::snapshot(version, expires, &targets, &[&keys.snapshot]).unwrap();
    let timestamp = sign::timestamp(version, expires, &snapshot, &[&keys.timestamp]).unwrap();
    Published { root, timestamp, snapshot, targets, files }
}

pub fn repo(version: u32) -> Published {
    publish(&Keys::new(), version, components(&format!("v{version}")), now() + 30 * DAY)
}

/// A shared fake monotonic clock.
#[derive(Clone, Default)]
pub struct Clock(pub Rc<Cell<u64>>);

impl Clock {
    pub fn advance(&self, ms: u64) {
        self.0.set(self.0.get() + ms);
    }
}

/// A node's boot directory and files in memory.
pub struct MemIo {
    pub boot: BTreeMap<String, Vec<u8>>,
    pub files: BTreeMap<String, Vec<u8>>,
    pub clock: Clock,
    pub writes: Vec<String>,
}

impl MemIo {
    /// A node `b` installed from `p`: metadata in the boot directory, its components on disk.
    pub fn installed(p: &Published) -> MemIo {
        let mut boot = BTreeMap::new();
        boot.insert("root.json".to_string(), p.root.clone());
        boot.insert(TIMESTAMP.to_string(), p.timestamp.clone());
        boot.insert(SNAPSHOT.to_string(), p.snapshot.clone());
        boot.insert(TARGETS.to_string(), p.targets.clone());
        let files = p.files.iter().filter(|(k, _)| k.starts_with("b/")).map(|(k, v)| (k.clone(), v.clone())).collect();
        MemIo { boot, files, clock: Clock::default(), writes: Vec::new() }
    }
    pub fn set(&mut self, target: &str, bytes: &[u8]) {
        self.files.insert(target.to_string(), bytes.to_vec());
    }
}

impl BootIo for MemIo {
    fn read_boot_file(&mut self, file: &str, max: usize) -> Result<Option<Vec<u8>>, String> {
        Ok(self.boot.get(file).map(|b| b[..b.len().min(max + 1)].to_vec()))
    }
    fn write_boot_file(&mut self, file: &str, bytes: &[u8]) -> Result<(), String> {
        self.writes.push(file.to_string());
        self.boot.insert(file.to_string(), bytes.to_vec());
        Ok(())
    }
    fn read_component(&mut self, name: &ComponentName, max: u64) -> Result<Vec<u8>, String> {
        let b = self.files.get(&name.target()).ok_or("no such file")?;
        Ok(b[..b.len().min(max as usize)].to_vec())
    }
    fn write_component(&mut self, name: &ComponentName, bytes: &[u8]) -> Result<(), String> {
        self.writes.push(name.target());
        self.files.insert(name.target(), bytes.to_vec());
        Ok(())
    }
    fn now_ms(&mut self) -> u64 {
        self.clock.advance(1);
        self.clock.0.get()
    }
    fn wait_until(&mut self, ms: u64) {
        if ms > self.clock.0.get() {
            self.clock.0.set(ms);
        }
    }
}

/// How a test repository behaves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Behaviour {
    /// Serves its files.
    Good,
    /// Never answers.
    Stall,
    /// Serves its files with one byte flipped.
    Corrupt,
    /// Announces an enormous total length and keeps sending.
    Endless,
    /// Answers the first request of each resource, then stalls.
    Dribble,
}

/// A repository serving `files` (target names and `metadata/<file>`).
pub struct MemSource {
    pub name: String,
    pub files: BTreeMap<String, Vec<u8>>,
    pub behaviour: Behaviour,
    pub clock: Clock,
    pub requests: Rc<Cell<u32>>,
}

impl MemSource {
    pub fn new(name: &str, p: &Published, behaviour: Behaviour, clock: &Clock) -> MemSource {
        let mut files: BTreeMap<String, Vec<u8>> = p
            .files
            .iter()
            .filter(|(k, _)| !k.contains("/keys/keys/b.key"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        files.insert(format!("metadata/{TIMESTAMP}"), p.timestamp.clone());
        files.insert(format!("metadata/{SNAPSHOT}"), p.snapshot.clone());
        files.insert(format!("metadata/{TARGETS}"), p.targets.clone());
        MemSource { name: name.into(), files, behaviour, clock: clock.clone(), requests: Rc::default() }
    }
    pub fn boxed(self) -> Box<dyn Source> {
        Box::new(self)
    }
}

impl Source for MemSource {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn exchange(&mut self, request: &[u8]) -> Option<Vec<u8>> {
        self.requests.set(self.requests.get() + 1);
        let offset = match anode_boot::recovery::parse(request) {
            Ok(anode_boot::recovery::Repr::Fetch { offset, .. }) => offset,
            _ => 0,
        };
        match self.behaviour {
            Behaviour::Stall => {
                self.clock.advance(500);
                None
            }
            Behaviour::Dribble if offset > 0 => {
                self.clock.advance(500);
                None
            }
            Behaviour::Endless => {
                let m = anode_boot::recovery::parse(request).ok()?;
                let anode_boot::recovery::Repr::Fetch { id, offset, .. } = m else { return None };
                Some(anode_boot::recovery::Repr::Data { id, offset, total: u32::MAX, data: &[0u8; 1024] }.to_vec())
            }
            b => {
                let files = &self.files;
                let mut owned = None;
                let r = serve(request, |name| match files.get(name) {
                    Some(f) if b == Behaviour::Corrupt => {
                        let mut f = f.clone();
                        if let Some(x) = f.last_mut() {
                            *x ^= 1;
                        }
                        owned = Some(f);
                        Lookup::NotFound
                    }
                    Some(f) => Lookup::Found(f),
                    None => Lookup::NotFound,
                });
                match owned {
                    Some(f) => serve(request, |_| Lookup::Found(&f)),
                    None => r,
                }
            }
        }
    }
}

pub fn params(policy: Policy) -> BootParams {
    BootParams {
        node: "b".into(),
        policy,
        limits: Limits::default(),
        fetch: FetchLimits {
            request_timeout_ms: 1_000,
            attempt_deadline_ms: 5_000,
            max_attempts: 3,
            ..FetchLimits::default()
        },
        commit: true,
    }
}

pub fn name(t: &str) -> ComponentName {
    ComponentName::parse(t).unwrap()
}

pub fn layer_of(t: &str) -> Layer {
    name(t).layer
}
