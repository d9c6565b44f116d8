//! Boot verification time (issue 18) for the shipped configurations, and
//! recovery time from a local mirror.
//!
//! - `examples/node`: the three-node line; node b's chain (its config and
//!   the shared topology), with and without a binary of `BINARY_MIB` MiB.
//! - `examples/topologies/*.toml` testbeds: one repository listing every
//!   node's binary, config, topology, key file, credential and one module
//!   (as `anode testbed up` gives each node); one node's whole chain.
//! - Recovery: node b's module (`MODULE_KIB` KiB) corrupted on disk and
//!   fetched, verified and stored from a mirror directory, through the real
//!   filesystem driver and recovery protocol.
//!
//! `cargo bench -p anode-boot --bench boot -- --warm-up-time 1 --measurement-time 5`

use anode_boot::boot::{BootParams, Policy, Source, boot};
use anode_boot::fsio::{FsIo, MirrorSource};
use anode_boot::recovery::FetchLimits;
use anode_boot::sign::{self, RoleKeys, RootSpec, Targets};
use anode_boot::{BootIo, ComponentName, Limits};
use anode_sec::Identity;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const BINARY_MIB: usize = 16;
const MODULE_KIB: usize = 64;

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

struct Repo {
    root: Vec<u8>,
    timestamp: Vec<u8>,
    snapshot: Vec<u8>,
    targets: Vec<u8>,
}

fn publish(files: &BTreeMap<String, Vec<u8>>) -> Repo {
    let id = |n: u8| Identity::from_seed(&[n; 32]);
    let later = now() + Duration::from_secs(86_400 * 30);
    let spec = RootSpec {
        version: 1,
        expires: later,
        root: RoleKeys { keys: vec![id(1).public(), id(2).public(), id(3).public()], threshold: 2 },
        targets: RoleKeys::one(id(4).public()),
        snapshot: RoleKeys::one(id(5).public()),
        timestamp: RoleKeys::one(id(6).public()),
    };
    let mut t = Targets::new();
    for (n, b) in files {
        t.add(&ComponentName::parse(n).unwrap_or_else(|e| panic!("{e}")), b).unwrap_or_else(|e| panic!("{e}"));
    }
    let targets = t.sign(1, later, &[&id(4)]).unwrap_or_else(|e| panic!("{e}"));
    let snapshot = sign::snapshot(1, later, &targets, &[&id(5)]).unwrap_or_else(|e| panic!("{e}"));
    Repo {
        root: sign::root(&spec, &[&id(1), &id(2)]).unwrap_or_else(|e| panic!("{e}")),
        timestamp: sign::timestamp(1, later, &snapshot, &[&id(6)]).unwrap_or_else(|e| panic!("{e}")),
        snapshot,
        targets,
    }
}

/// A node's boot directory and files in memory (reads are copies, as from a page cache).
struct Mem {
    boot: BTreeMap<String, Vec<u8>>,
    files: BTreeMap<String, Vec<u8>>,
}

impl BootIo for Mem {
    fn read_boot_file(&mut self, f: &str, _: usize) -> Result<Option<Vec<u8>>, String> {
        Ok(self.boot.get(f).cloned())
    }
    fn write_boot_file(&mut self, _: &str, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
    fn read_component(&mut self, n: &ComponentName, _: u64) -> Result<Vec<u8>, String> {
        self.files.get(&n.target()).cloned().ok_or_else(|| "missing".into())
    }
    fn write_component(&mut self, _: &ComponentName, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
    fn now_ms(&mut self) -> u64 {
        0
    }
    fn wait_until(&mut self, _: u64) {}
}

fn mem(repo: &Repo, files: &BTreeMap<String, Vec<u8>>, node: &str) -> Mem {
    let mut boot = BTreeMap::new();
    boot.insert("root.json".into(), repo.root.clone());
    boot.insert("timestamp.json".into(), repo.timestamp.clone());
    boot.insert("snapshot.json".into(), repo.snapshot.clone());
    boot.insert("targets.json".into(), repo.targets.clone());
    let files =
        files.iter().filter(|(k, _)| k.starts_with(&format!("{node}/"))).map(|(k, v)| (k.clone(), v.clone())).collect();
    Mem { boot, files }
}

fn params(node: &str) -> BootParams {
    BootParams {
        node: node.into(),
        policy: Policy::Refuse,
        limits: Limits::default(),
        fetch: FetchLimits::default(),
        commit: false,
    }
}

fn run(m: &mut Mem, node: &str) {
    let mut none: Vec<Box<dyn Source>> = Vec::new();
    let out = boot(m, &mut none, &params(node), now()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.chain.report().is_empty());
}

fn example_node(c: &mut Criterion) {
    let binary = vec![0x7fu8; BINARY_MIB << 20];
    for with_binary in [false, true] {
        let mut files = BTreeMap::new();
        for n in ["a", "b", "c"] {
            files.insert(format!("{n}/config/{n}.toml"), read(&examples().join(format!("node/{n}.toml"))));
            files.insert(format!("{n}/config/topology.toml"), read(&examples().join("node/topology.toml")));
            if with_binary {
                files.insert(format!("{n}/binary/anode"), binary.clone());
            }
        }
        let repo = publish(&files);
        let name = if with_binary {
            format!("examples/node b: chain with a {BINARY_MIB} MiB binary, config, topology")
        } else {
            "examples/node b: chain of config and topology (no binary)".to_string()
        };
        c.bench_function(&name, |b| {
            b.iter_batched(|| mem(&repo, &files, "b"), |mut m| run(&mut m, "b"), BatchSize::LargeInput)
        });
    }
}

/// Every node of a topology gets what `anode testbed up` gives it.
fn topology(c: &mut Criterion) {
    let binary = vec![0x7fu8; BINARY_MIB << 20];
    let module = vec![0u8; 20 << 10];
    for t in ["line4", "ring5", "star5", "tree7"] {
        let topo = read(&examples().join(format!("topologies/{t}.toml")));
        let text = String::from_utf8_lossy(&topo).into_owned();
        let names: Vec<String> =
            text.split("name = \"").skip(1).filter_map(|s| s.split('"').next().map(str::to_string)).collect();
        let mut files = BTreeMap::new();
        for n in &names {
            let cfg = format!("address = \"10.0.0.{}\"\n# node {n}\n{}", names.len(), "x".repeat(900));
            files.insert(format!("{n}/binary/anode"), binary.clone());
            files.insert(format!("{n}/config/node.toml"), cfg.into_bytes());
            files.insert(format!("{n}/config/topology.toml"), topo.clone());
            files.insert(
                format!("{n}/keys/keys/{n}.key"),
                format!("anode-ed25519-secret-v1 {}\n", "ab".repeat(32)).into_bytes(),
            );
            files.insert(format!("{n}/keys/cred.bin"), vec![1u8; 400]);
            files.insert(format!("{n}/switchlets/mods/counter.wasm"), module.clone());
        }
        let repo = publish(&files);
        let node = names.first().cloned().unwrap_or_default();
        c.bench_function(&format!("testbed {t} ({} nodes in the repository): one node's chain", names.len()), |b| {
            b.iter_batched(|| mem(&repo, &files, &node), |mut m| run(&mut m, &node), BatchSize::LargeInput)
        });
        c.bench_function(&format!("testbed {t}: metadata only"), |b| {
            b.iter(|| {
                let input = anode_boot::MetadataInput {
                    root: &repo.root,
                    root_updates: &[],
                    timestamp: &repo.timestamp,
                    snapshot: &repo.snapshot,
                    targets: &repo.targets,
                };
                anode_boot::verify_metadata(&input, None, &node, now(), &Limits::default())
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        });
    }
}

/// Node b's module corrupted on disk, recovered from a mirror directory.
fn recovery(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("anode-boot-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let module: Vec<u8> = (0..MODULE_KIB << 10).map(|i| i as u8).collect();
    let mut files = BTreeMap::new();
    files.insert("b/config/node.toml".to_string(), read(&examples().join("node/b.toml")));
    files.insert("b/switchlets/mods/counter.wasm".to_string(), module.clone());
    let repo = publish(&files);
    let w = |p: PathBuf, b: &[u8]| {
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&p, b).unwrap_or_else(|e| panic!("{e}"));
    };
    for (f, b) in [
        ("root.json", &repo.root),
        ("timestamp.json", &repo.timestamp),
        ("snapshot.json", &repo.snapshot),
        ("targets.json", &repo.targets),
    ] {
        w(dir.join("boot").join(f), b);
    }
    for (t, b) in &files {
        w(dir.join("repo/targets").join(t), b);
    }
    w(dir.join("node/node.toml"), &files["b/config/node.toml"]);
    let mut p = params("b");
    p.policy = Policy::Recover;
    p.commit = true;
    c.bench_function(&format!("recover a {MODULE_KIB} KiB module from a local mirror (fetch, verify, store)"), |b| {
        b.iter_batched(
            || w(dir.join("node/mods/counter.wasm"), b"corrupted"),
            |()| {
                let mut io = FsIo::new(&dir.join("boot"), &dir.join("node"), &dir.join("none"));
                let mut s: Vec<Box<dyn Source>> = vec![Box::new(MirrorSource::new(&dir.join("repo")))];
                let out = boot(&mut io, &mut s, &p, now()).unwrap_or_else(|e| panic!("{e}"));
                assert!(out.events.iter().any(|e| matches!(e, anode_boot::BootEvent::Recovered { .. })));
            },
            BatchSize::PerIteration,
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, example_node, topology, recovery);
criterion_main!(benches);
