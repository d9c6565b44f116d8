//! The filesystem driver: a node's boot directory and files on disk, a local
//! mirror directory as the recovery source, and the rule "verify the bytes
//! you load, not a path".
#![allow(clippy::unwrap_used)]

mod common;

use anode_boot::ChainError;
use anode_boot::boot::BootEvent;
use anode_boot::fsio::{FsBootError, boot_node};
use common::*;
use std::path::{Path, PathBuf};

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("anode-boot-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write(p: &Path, b: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b).unwrap();
}

/// Node b's files under DIR/node, its boot directory DIR/boot (policy
/// `policy`), and a mirror DIR/repo holding every non-secret component.
fn install(dir: &Path, policy: &str) -> Published {
    let p = repo(1);
    for (t, b) in &p.files {
        let n = name(t);
        if n.node != "b" {
            continue;
        }
        let file =
            if n.layer == anode_boot::Layer::Binary { dir.join("anode") } else { dir.join("node").join(&n.file) };
        write(&file, b);
        if !t.ends_with("b.key") {
            write(&dir.join("repo/targets").join(t), b);
        }
    }
    for (f, b) in [("timestamp.json", &p.timestamp), ("snapshot.json", &p.snapshot), ("targets.json", &p.targets)] {
        write(&dir.join("boot").join(f), b);
        write(&dir.join("repo/metadata").join(f), b);
    }
    write(&dir.join("boot/root.json"), &p.root);
    let settings = format!(
        "node = \"b\"\npolicy = \"{policy}\"\nmirrors = [\"../repo\"]\nbinary = \"../anode\"\nrequest_timeout_ms = 200\n"
    );
    write(&dir.join("boot/boot.toml"), settings.as_bytes());
    p
}

#[test]
fn a_file_swapped_after_verification_is_not_used() {
    let s = Scratch::new("swap");
    let p = install(&s.0, "refuse");
    let nb = boot_node(&s.0.join("boot"), &s.0.join("node"), now(), true, vec![]).unwrap();
    let config = s.0.join("node/config/../node.toml");
    // The file changes on disk after it verified...
    std::fs::write(s.0.join("node/node.toml"), b"address = \"6.6.6.6\"\n").unwrap();
    // ...the node uses the bytes that verified, not the path.
    assert_eq!(nb.read(&config).unwrap(), &p.files["b/config/node.toml"][..]);
    assert_eq!(nb.binary().unwrap(), &p.files["b/binary/anode"][..]);
    // A file the metadata never listed is not handed out, wherever it is.
    write(&s.0.join("node/mods/extra.wasm"), b"\0asm");
    assert!(matches!(nb.read(&s.0.join("node/mods/extra.wasm")), Err(ChainError::NotInChain(_))));
    assert!(matches!(nb.read(Path::new("/etc/passwd")), Err(ChainError::NotInChain(_))));
    assert!(std::fs::read(s.0.join("boot/state.json")).is_ok(), "state recorded");
    // The next boot sees the swapped file and refuses (policy refuse).
    let e = boot_node(&s.0.join("boot"), &s.0.join("node"), now(), true, vec![]).unwrap_err();
    assert!(matches!(e, FsBootError::Boot(anode_boot::BootError::Component { .. })), "{e}");
}

#[test]
fn recovery_from_a_local_mirror_directory() {
    let s = Scratch::new("mirror");
    let p = install(&s.0, "recover");
    std::fs::write(s.0.join("node/mods/counter.wasm"), b"corrupted").unwrap();
    std::fs::remove_file(s.0.join("node/topology.toml")).unwrap();
    let nb = boot_node(&s.0.join("boot"), &s.0.join("node"), now(), true, vec![]).unwrap();
    let recovered: Vec<&BootEvent> = nb.events.iter().filter(|e| matches!(e, BootEvent::Recovered { .. })).collect();
    assert_eq!(recovered.len(), 2, "{recovered:?}");
    assert_eq!(std::fs::read(s.0.join("node/mods/counter.wasm")).unwrap(), p.files["b/switchlets/mods/counter.wasm"]);
    assert_eq!(std::fs::read(s.0.join("node/topology.toml")).unwrap(), p.files["b/config/topology.toml"]);
    // A mirror without the file: the node refuses to start (policy recover).
    std::fs::write(s.0.join("node/mods/counter.wasm"), b"corrupted").unwrap();
    std::fs::remove_file(s.0.join("repo/targets/b/switchlets/mods/counter.wasm")).unwrap();
    let e = boot_node(&s.0.join("boot"), &s.0.join("node"), now(), true, vec![]).unwrap_err();
    assert!(e.to_string().contains("NotFound"), "{e}");
    // A bad boot.toml is a typed error naming the file.
    std::fs::write(s.0.join("boot/boot.toml"), b"node = \"b\"\npolicy = \"sometimes\"\n").unwrap();
    let e = boot_node(&s.0.join("boot"), &s.0.join("node"), now(), true, vec![]).unwrap_err();
    assert!(matches!(e, FsBootError::Settings { .. }), "{e}");
}
