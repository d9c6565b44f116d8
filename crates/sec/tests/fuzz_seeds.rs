//! Replays the `sec_handshake` and `sec_domain` fuzz targets over their
//! seeds and a few thousand deterministic mutations of them, as ordinary
//! tests. `ANODE_BLESS=1` rewrites `fuzz/seeds/sec_handshake/` and
//! `fuzz/seeds/sec_domain/`.

use anode_sec::fuzzing;
use std::path::PathBuf;

/// The seeds of fuzz target `target` (written first from `fresh` with
/// `ANODE_BLESS=1`), followed by `fresh` itself.
fn seeds(target: &str, fresh: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds").join(target);
    if std::env::var_os("ANODE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("seed dir");
        for (i, s) in fresh.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).expect("write seed");
        }
    }
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz/seeds/{target} exists (ANODE_BLESS=1 writes it): {e}"))
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    seeds.extend(fresh);
    seeds
}

#[test]
fn seeds_and_mutations() {
    let fresh = fuzzing::seeds();
    assert!(fresh.len() >= 5, "IK and XX first messages, a cookie reply, XX with cookie, a datagram");
    let seeds = seeds("sec_handshake", fresh);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for s in &seeds {
        fuzzing::handshake_and_packet(s);
        for _ in 0..300 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut m = s.clone();
            match x % 4 {
                0 if !m.is_empty() => {
                    let i = (x >> 8) as usize % m.len();
                    m[i] ^= (x >> 32) as u8 | 1;
                }
                1 => m.truncate((x >> 8) as usize % (m.len() + 1)),
                2 => m.extend_from_slice(&x.to_le_bytes()),
                _ => {
                    if m.len() > 12 {
                        let i = 12 + (x >> 8) as usize % (m.len() - 12);
                        m[i] = m[i].wrapping_add(1);
                    }
                }
            }
            fuzzing::handshake_and_packet(&m);
        }
    }
}

#[test]
fn domain_seeds_and_mutations() {
    let fresh = fuzzing::domain_seeds();
    assert!(fresh.len() >= 6, "request, reply, ticket, packets and an attachment");
    let seeds = seeds("sec_domain", fresh);
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
