//! Replays the `plan_compile` fuzz target over its seeds (every example and
//! golden program) and over every truncation and single-byte mutation of
//! each, as an ordinary test.
use std::path::PathBuf;

fn seeds() -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut v = Vec::new();
    for dir in [root.join("../../examples/plan"), root.join("tests/golden")] {
        for e in std::fs::read_dir(&dir).expect("seed dir") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "plan") {
                v.push(std::fs::read(&p).expect("read"));
            }
        }
    }
    assert!(v.len() >= 8, "expected the example programs");
    v
}

#[test]
fn seeds_truncations_and_mutations() {
    for s in seeds() {
        anode_plan::fuzzing::compile(&s);
        for cut in (0..s.len()).step_by(7) {
            anode_plan::fuzzing::compile(&s[..cut]);
        }
        for i in (0..s.len()).step_by(5) {
            for b in [b'(', b')', b'[', b'0', b'x', b',', b';', b' '] {
                let mut m = s.clone();
                m[i] = b;
                anode_plan::fuzzing::compile(&m);
            }
        }
    }
}
