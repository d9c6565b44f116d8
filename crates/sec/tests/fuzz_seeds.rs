//! Replays the `sec_handshake` fuzz target over its seeds and a few
//! thousand deterministic mutations of them, as an ordinary test.
//! `ANODE_BLESS=1` rewrites `fuzz/seeds/sec_handshake/`.

use anode_sec::fuzzing;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/sec_handshake")
}

#[test]
fn seeds_and_mutations() {
    let fresh = fuzzing::seeds();
    assert!(fresh.len() >= 5, "IK and XX first messages, a cookie reply, XX with cookie, a datagram");
    if std::env::var_os("ANODE_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(dir());
        std::fs::create_dir_all(dir()).expect("seed dir");
        for (i, s) in fresh.iter().enumerate() {
            std::fs::write(dir().join(format!("seed-{i}")), s).expect("write seed");
        }
    }
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir())
        .expect("fuzz/seeds/sec_handshake exists (ANODE_BLESS=1 writes it)")
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    seeds.extend(fresh);
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
