//! Replays the `sec_domain` fuzz target over its seeds and deterministic
//! mutations, as an ordinary test. `ANODE_BLESS=1` rewrites
//! `fuzz/seeds/sec_domain/`.

use anode_sec::fuzzing;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/sec_domain")
}

#[test]
fn seeds_and_mutations() {
    let fresh = fuzzing::domain_seeds();
    assert!(fresh.len() >= 6, "request, reply, ticket, packets and an attachment");
    if std::env::var_os("ANODE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(dir());
        std::fs::create_dir_all(dir()).expect("seed dir");
        for (i, s) in fresh.iter().enumerate() {
            std::fs::write(dir().join(format!("seed-{i}")), s).expect("write seed");
        }
    }
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir())
        .expect("fuzz/seeds/sec_domain exists (ANODE_BLESS=1 writes it)")
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    seeds.extend(fresh);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for s in &seeds {
        fuzzing::domain_message(s);
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut m = s.clone();
            match x % 3 {
                0 if !m.is_empty() => {
                    let i = (x >> 8) as usize % m.len();
                    m[i] ^= (x >> 32) as u8 | 1;
                }
                1 => m.truncate((x >> 8) as usize % (m.len() + 1)),
                _ => m.extend_from_slice(&x.to_le_bytes()),
            }
            fuzzing::domain_message(&m);
        }
    }
}
