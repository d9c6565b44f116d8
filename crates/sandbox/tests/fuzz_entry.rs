//! The fuzz targets' entry points over real inputs and deterministic
//! mutations of them (truncations, byte flips): no panic, typed errors only.
#![allow(clippy::unwrap_used)]

mod common;

use anode_cred::{ModuleHash, PrincipalId};
use anode_sandbox::capsule::Capsule;
use anode_sandbox::fuzzing;
use common::module;

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
        match i % 3 {
            0 => m.truncate((x as usize) % m.len()),
            1 => {
                let p = (x as usize) % m.len();
                m[p] ^= (x >> 32) as u8 | 1;
            }
            _ => {
                let p = (x as usize) % m.len();
                m.insert(p, (x >> 40) as u8);
            }
        }
        out.push(m);
    }
    out
}

#[test]
fn module_load_entry_point() {
    let mut sb = fuzzing::sandbox();
    for name in ["ping", "counter", "channel", "spin", "membomb", "trapper", "sneaky"] {
        for m in mutations(&module(name), 12) {
            fuzzing::module_load(&mut sb, &m);
        }
    }
    assert!(sb.counters().loads >= 7, "the unmutated modules load");
}

#[test]
fn capsule_parse_and_credential_entry_points() {
    let code = module("ping");
    let cred = anode_cred::fuzzing::issuer().admin(PrincipalId([1; 32]), None).unwrap();
    let mut bytes = Vec::new();
    Capsule {
        entry: "ping",
        credential: cred.to_bytes(),
        data: b"data",
        code: Some(&code),
        hash: ModuleHash::of(&code),
    }
    .encode(&mut bytes)
    .unwrap();
    for m in mutations(&bytes, 300) {
        fuzzing::capsule_parse(&m);
    }
    for m in mutations(cred.to_bytes(), 100) {
        anode_cred::fuzzing::credential(&m);
    }
}
