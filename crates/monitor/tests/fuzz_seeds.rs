//! The fuzz targets' entry points over their seeds (fuzz/seeds/monitor_*)
//! and deterministic mutations of them. `ANODE_BLESS=1` rewrites the seeds
//! from tests/traces.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Cursor;
use std::path::PathBuf;

use anode_monitor::{CaptureReader, fuzzing};

fn seeds(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds").join(target)
}

fn mutations(seed: &[u8], n: usize) -> Vec<Vec<u8>> {
    let mut out = vec![seed.to_vec()];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut m = seed.to_vec();
        if m.is_empty() {
            break;
        }
        let p = (x as usize) % m.len();
        match i % 4 {
            0 => m.truncate(p),
            1 => m[p] ^= (x >> 32) as u8 | 1,
            2 => m.insert(p, (x >> 40) as u8),
            _ => {
                // A length-looking field set to something large.
                let q = p & !3;
                if q + 4 <= m.len() {
                    m[q..q + 4].copy_from_slice(&((x >> 16) as u32 | 0x8000).to_le_bytes());
                }
            }
        }
        out.push(m);
    }
    out
}

fn bless() {
    let t = common::traces_dir();
    let cap = seeds("monitor_capture");
    let view = seeds("monitor_view");
    std::fs::create_dir_all(&cap).unwrap();
    std::fs::create_dir_all(&view).unwrap();
    for name in ["rtt-client-side.pcap", "codered.pcap"] {
        let b = std::fs::read(t.join(name)).unwrap();
        std::fs::write(cap.join(name), &b[..b.len().min(4096)]).unwrap();
        let mut r = CaptureReader::new(Cursor::new(&b)).unwrap();
        let mut i = 0;
        while let Some(f) = r.next_frame().unwrap() {
            if i % 7 == 0 || f.data.len() > 200 {
                let mut s = vec![0u8];
                s.extend_from_slice(f.data);
                std::fs::write(view.join(format!("{}-{i}", name.trim_end_matches(".pcap"))), s).unwrap();
            }
            i += 1;
            if i > 40 {
                break;
            }
        }
    }
}

fn each_seed(target: &str, f: fn(&[u8])) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(seeds(target)).unwrap() {
        let b = std::fs::read(e.unwrap().path()).unwrap();
        for m in mutations(&b, 300) {
            f(&m);
            n += 1;
        }
    }
    n
}

#[test]
fn seeds_and_their_mutations() {
    if std::env::var_os("ANODE_BLESS").is_some() {
        bless();
    }
    assert!(each_seed("monitor_capture", fuzzing::capture) > 300);
    assert!(each_seed("monitor_view", fuzzing::view_builder) > 3000);
}
