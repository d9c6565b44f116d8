//! Crypto-PAn against the reference distribution's sample trace.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use anode_monitor::CryptoPan;
use anode_monitor::cryptopan::Anonymizer;

fn reference() -> (CryptoPan, Vec<(String, String, String)>) {
    let text = include_str!("data/cryptopan-reference.txt");
    let mut key = None;
    let mut vectors = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "key" => {
                let k: Vec<u8> = w[1..].iter().map(|x| x.parse().unwrap()).collect();
                key = Some(CryptoPan::new(&k.try_into().unwrap()));
            }
            kind => vectors.push((kind.to_string(), w[1].to_string(), w[2].to_string())),
        }
    }
    (key.unwrap(), vectors)
}

#[test]
fn reproduces_the_reference_sample_trace_exactly() {
    let (pan, vectors) = reference();
    let mut cached = Anonymizer::new(pan.clone());
    let mut v4 = 0;
    for (kind, orig, anon) in &vectors {
        match kind.as_str() {
            "v4" => {
                let o: Ipv4Addr = orig.parse().unwrap();
                let a: Ipv4Addr = anon.parse().unwrap();
                assert_eq!(Ipv4Addr::from(pan.anonymize_v4(o.into())), a, "{o}");
                // Twice through the cache: a miss, then a hit.
                assert_eq!(Ipv4Addr::from(cached.v4(o.into())), a);
                assert_eq!(Ipv4Addr::from(cached.v4(o.into())), a);
                v4 += 1;
            }
            "v6" => {
                let o: Ipv6Addr = orig.parse().unwrap();
                let a: Ipv6Addr = anon.parse().unwrap();
                assert_eq!(Ipv6Addr::from(pan.anonymize_v6(o.into())), a, "{o}");
            }
            _ => panic!("bad line"),
        }
    }
    assert_eq!(v4, 71);
    assert_eq!(cached.hits, 71);
}

#[test]
fn prefix_preserving_and_one_to_one() {
    let pan = CryptoPan::new(&[7; 32]);
    let mut seen = std::collections::HashSet::new();
    for i in 0..2000u32 {
        let a = 0x0a00_0000 | ((i * 7919) % 65536);
        let b = a ^ (1 << (i % 16));
        let (x, y) = (pan.anonymize_v4(a), pan.anonymize_v4(b));
        let shared = (a ^ b).leading_zeros();
        assert_eq!((x ^ y).leading_zeros(), shared, "{a:x} {b:x}");
        seen.insert(x);
    }
    assert!(seen.len() > 1500);
}

#[test]
fn key_files_round_trip_and_bad_ones_are_refused() {
    let text = CryptoPan::key_text(&[9; 32]);
    let a = CryptoPan::from_key_text(&text).unwrap();
    assert_eq!(a.anonymize_v4(0x01020304), CryptoPan::new(&[9; 32]).anonymize_v4(0x01020304));
    assert_eq!(a.key_id_hex().len(), 16);
    for bad in [
        "",
        "anode-cryptopan-v1",
        "anode-cryptopan-v1 abcd",
        "other 0000",
        &format!("anode-cryptopan-v1 {}", "zz".repeat(32)),
    ] {
        assert!(CryptoPan::from_key_text(bad).is_err(), "{bad:?}");
    }
}
