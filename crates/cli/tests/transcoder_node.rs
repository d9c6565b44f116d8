//! Expert's tiered transcoder on real daemons (`anode experiment transcoder
//! --steps one`; docs/transcoder.md, "On real daemons"): a short run of 1
//! gold, 1 silver and 1 bronze client in both variants, with every packet
//! the clients received written out (`--dump`), checked for properties
//! that hold whatever the machine's load, never for timings:
//!
//! - every client received frames, each once, in order, of its own tier;
//! - gold decrypts with the client's key to a 192 kbit/s 44.1 kHz stereo
//!   frame, silver to a 128 kbit/s one (417 bytes), both of 1,152 samples;
//!   bronze is a 22.05 kHz mono frame of 576 samples; under another
//!   client's key an encrypted frame does not decode;
//! - the two variants send the same gold and bronze bytes for a frame
//!   both delivered (same key, same IV, same encode).
//!
//! Needs the modules: `scripts/setup` (modules/out/tc-*.wasm).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use aes::cipher::{KeyIvInit, StreamCipher};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

fn modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out")
}

fn decrypt(key: &[u8; 16], seq: u32, body: &[u8]) -> Vec<u8> {
    let mut iv = [0u8; 16];
    iv[..4].copy_from_slice(&seq.to_be_bytes());
    let mut b = body.to_vec();
    Aes128Ctr::new(&(*key).into(), &iv.into()).apply_keystream(&mut b);
    b
}

/// Decodes one frame on its own: (samples per channel, channels, rate).
fn decode(frame: &[u8]) -> Option<(usize, u8, u32)> {
    let mut d = nanomp3_core::Decoder::new();
    let mut pcm = vec![0f32; nanomp3_core::MAX_SAMPLES_PER_FRAME];
    let (_, r) = d.decode(frame, &mut pcm);
    let i = r.ok()?;
    (i.samples_produced > 0).then_some((i.samples_produced, i.channels.num(), i.sample_rate))
}

/// A client: its tier and key (hex in clients.json).
struct Client {
    port: u64,
    tier: String,
    key: Option<[u8; 16]>,
}

fn clients(dir: &Path) -> Vec<Client> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("clients.json")).unwrap()).unwrap();
    v["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Client {
            port: c["port"].as_u64().unwrap(),
            tier: c["tier"].as_str().unwrap().to_string(),
            key: c["key"].as_str().map(|h| {
                let b: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap()).collect();
                b.try_into().unwrap()
            }),
        })
        .collect()
}

/// The packets of `client-PORT.bin`: seq -> (tier, body).
fn packets(dir: &Path, port: u64) -> Vec<(u32, u8, Vec<u8>)> {
    let bytes = std::fs::read(dir.join(format!("client-{port}.bin"))).unwrap_or_default();
    let mut out = Vec::new();
    let mut rest = &bytes[..];
    while let Some((len, r)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_be_bytes(*len));
        let (p, r) = r.split_at(len);
        assert!(p.len() > 5, "a packet of {len} bytes");
        out.push((u32::from_be_bytes(p[..4].try_into().unwrap()), p[4], p[5..].to_vec()));
        rest = r;
    }
    out
}

/// Checks one variant's deliveries; returns port -> seq -> plaintext.
fn check(dir: &Path) -> BTreeMap<u64, BTreeMap<u32, Vec<u8>>> {
    let cs = clients(dir);
    assert_eq!(cs.len(), 3, "{}", dir.display());
    let keys: Vec<[u8; 16]> = cs.iter().filter_map(|c| c.key).collect();
    let mut all = BTreeMap::new();
    for c in &cs {
        let ps = packets(dir, c.port);
        assert!(!ps.is_empty(), "client {} ({}) received nothing in {}", c.port, c.tier, dir.display());
        let tier = match c.tier.as_str() {
            "gold" => 0,
            "silver" => 1,
            _ => 2,
        };
        let mut plain = BTreeMap::new();
        let mut last = None;
        for (seq, t, body) in &ps {
            assert_eq!(*t, tier, "client {} got another tier", c.port);
            assert!(last.is_none_or(|l| l < *seq), "client {}: frame {seq} after {last:?}", c.port);
            last = Some(*seq);
            let p = c.key.map_or(body.clone(), |k| decrypt(&k, *seq, body));
            match tier {
                0 => assert_eq!(decode(&p), Some((1152, 2, 44_100)), "gold frame {seq}"),
                1 => {
                    assert_eq!(decode(&p), Some((1152, 2, 44_100)), "silver frame {seq}");
                    assert_eq!(p.len(), 417, "128 kbit/s at 44.1 kHz");
                }
                _ => assert_eq!(decode(&p), Some((576, 1, 22_050)), "bronze frame {seq}"),
            }
            if let Some(k) = c.key {
                let other = keys.iter().find(|o| **o != k).unwrap();
                assert_eq!(decode(&decrypt(other, *seq, body)), None, "frame {seq} of {} under another key", c.port);
            }
            plain.insert(*seq, p);
        }
        if tier == 0 {
            // 192 kbit/s at 44.1 kHz: 626 or 627 bytes (padding).
            assert!(plain.values().all(|p| p.len() == 626 || p.len() == 627), "gold frame sizes");
        }
        all.insert(c.port, plain);
    }
    all
}

/// Runs `anode experiment transcoder` (the debug build's receive-path VP)
/// with `args` into `out`; panics with its output if it fails.
fn transcoder(out: &Path, args: &[&str]) {
    let o = Command::new(ANODE)
        .args(["experiment", "transcoder", "--rx-vp", "3ms/26ms"])
        .args(args)
        .arg("--modules")
        .arg(modules())
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
}

#[test]
fn every_client_gets_decodable_frames_of_its_tier_in_both_variants() {
    let out = std::env::temp_dir().join(format!("anode-test-transcoder-{}", std::process::id()));
    // The debug build's VPs: a silver frame costs about 2.4 ms here.
    transcoder(&out, &["--steps", "one", "--seconds", "3", "--dump", "--silver-vp", "2500us/26ms"]);
    let csv = std::fs::read_to_string(out.join("transcoder-one.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let path = check(&out.join("one-path-based"));
    let all = check(&out.join("one-all-in-one"));
    // Every source, set-up and control channel on c listens to node a only
    // (the modules ask for the source their credentials grant).
    for variant in ["one-path-based", "one-all-in-one"] {
        let st = std::fs::read_to_string(out.join(variant).join("node-c-status.json")).unwrap();
        let st: serde_json::Value = serde_json::from_str(&st).unwrap();
        let chans = st["channels"].as_array().unwrap();
        assert!(!chans.is_empty(), "{variant}: {st}");
        for c in chans {
            assert_eq!(c["source"], "10.0.0.1/32", "{variant}: {c}");
        }
    }
    // Gold (port 5000) and bronze (5002): the same bytes for a frame both delivered.
    for port in [5000, 5002] {
        let common: Vec<u32> = path[&port].keys().filter(|s| all[&port].contains_key(s)).copied().collect();
        assert!(!common.is_empty(), "no frame of {port} in both variants");
        for s in common {
            assert_eq!(path[&port][&s], all[&port][&s], "port {port}, frame {s}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `--side-by-side`: both variants on one node at once, each with its own
/// clients, fed by the same source packets; each row's CPU is what the
/// node charged that variant's sessions, which is part of the node's
/// process CPU, and both variants served their clients.
#[test]
fn side_by_side_serves_both_variants_and_charges_each_its_own_cpu() {
    let out = std::env::temp_dir().join(format!("anode-test-transcoder-side-{}", std::process::id()));
    let side = ["--table3", "1", "--side-by-side", "--silver-vp", "2500us/26ms+extra"];
    transcoder(&out, &[&["--steps", "table3", "--seconds", "3"][..], &side].concat());
    let csv = std::fs::read_to_string(out.join("transcoder-table3.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}: {csv}"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let mut variants: Vec<&str> = rows.iter().map(|r| r[col("variant")]).collect();
    variants.sort_unstable();
    assert_eq!(variants, ["all-in-one", "path-based"], "{csv}");
    let f = |r: &Vec<&str>, c: &str| r[col(c)].parse::<f64>().unwrap();
    let mut charged = 0.0;
    for r in &rows {
        assert_eq!(r[col("cpu_measure")], "charged", "{csv}");
        assert_eq!(f(r, "cpu_pct"), f(r, "charged_cpu_pct"), "{csv}");
        // Each variant worked (a debug build's silver frame is ~2.4 ms of
        // 26 ms) and its clients got frames of every tier.
        assert!(f(r, "charged_cpu_pct") > 1.0, "{csv}");
        assert!(f(r, "min_received_fraction") > 0.0, "{csv}");
        for t in ["gold_kbps", "silver_kbps", "bronze_kbps"] {
            assert!(f(r, t) > 0.0, "{t}: {csv}");
        }
        charged += f(r, "charged_cpu_pct");
    }
    // Both variants' charges are parts of the one node's CPU.
    assert!(charged <= f(&rows[0], "node_cpu_pct") + 0.01, "{csv}");
    assert_eq!(f(&rows[0], "node_cpu_pct"), f(&rows[1], "node_cpu_pct"), "{csv}");
    let summary = std::fs::read_to_string(out.join("transcoder-table3-summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 2, "{summary}");
    let _ = std::fs::remove_dir_all(&out);
}
