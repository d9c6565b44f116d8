//! Replays the fuzz targets over their seed corpora (the example programs),
//! plus every single-bit flip of each seed packet, as an ordinary test.
//! `ANODE_BLESS=1` rewrites the binary seeds under `fuzz/seeds/`.
use anode_snap::fuzzing;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn examples() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(root().join("examples/snap")).expect("examples/snap") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "s") {
            let name = p.file_stem().expect("stem").to_string_lossy().into_owned();
            v.push((name, std::fs::read_to_string(&p).expect("read")));
        }
    }
    v.sort();
    assert!(v.len() >= 5, "expected the example programs");
    v
}

#[test]
fn seeds_and_bit_flips() {
    let bless = std::env::var_os("ANODE_BLESS").is_some();
    for (name, src) in examples() {
        fuzzing::assemble(src.as_bytes());
        let bytes = anode_snap::asm::assemble(&src).expect("example assembles").to_bytes().expect("emit");
        if bless {
            let dir = root().join("fuzz/seeds/snap_parse_execute");
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join(format!("{name}.snap")), &bytes).expect("write seed");
        }
        fuzzing::parse_execute(&bytes);
        for i in 0..bytes.len() * 8 {
            let mut m = bytes.clone();
            m[i / 8] ^= 1 << (i % 8);
            fuzzing::parse_execute(&m);
        }
        for cut in 0..bytes.len() {
            fuzzing::parse_execute(&bytes[..cut]);
        }
    }
}

#[test]
fn committed_seeds_replay() {
    // snap_assemble is seeded from examples/snap itself.
    for (target, dir) in [
        ("snap_parse_execute", root().join("fuzz/seeds/snap_parse_execute")),
        ("snap_assemble", root().join("examples/snap")),
    ] {
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("seed dir") {
            let data = std::fs::read(e.expect("entry").path()).expect("read");
            match target {
                "snap_parse_execute" => fuzzing::parse_execute(&data),
                _ => fuzzing::assemble(&data),
            }
            n += 1;
        }
        assert!(n >= 5, "{target}: only {n} seeds");
    }
}
