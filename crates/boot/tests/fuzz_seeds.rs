//! Replays the `boot_recovery` and `boot_metadata` fuzz targets over their
//! seeds and a few thousand deterministic mutations, as an ordinary test.
//! `ANODE_BLESS=1` rewrites `fuzz/seeds/boot_*/`.

use anode_boot::fuzzing;
use std::path::PathBuf;

fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds").join(target)
}

fn replay(target: &str, fresh: Vec<Vec<u8>>, run: fn(&[u8]), rounds: usize) {
    if std::env::var_os("ANODE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(dir(target));
        std::fs::create_dir_all(dir(target)).expect("seed dir");
        for (i, s) in fresh.iter().enumerate() {
            std::fs::write(dir(target).join(format!("seed-{i}")), s).expect("write seed");
        }
    }
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir(target))
        .unwrap_or_else(|_| panic!("fuzz/seeds/{target} exists (ANODE_BLESS=1 writes it)"))
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    seeds.extend(fresh);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for s in &seeds {
        run(s);
        for _ in 0..rounds {
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
            run(&m);
        }
    }
}

#[test]
fn recovery_seeds_and_mutations() {
    replay("boot_recovery", fuzzing::recovery_seeds(), fuzzing::recovery_message, 500);
}

#[test]
fn metadata_seeds_and_mutations() {
    replay("boot_metadata", fuzzing::metadata_seeds(), fuzzing::metadata, 150);
}
