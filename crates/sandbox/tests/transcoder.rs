//! The tiered transcoder of Expert §4 (issue 17, docs/transcoder.md) in the
//! sandbox: a short real MP3 stream goes through the path-based variant
//! (receive path, three cache pods, the AES pod, one path module per gold
//! and silver stream, one bronze path) and through the all-in-one module;
//! every client gets frames of its tier that decode (nanomp3, natively),
//! the encrypted tiers decrypt with the client's key and not with another's,
//! and no bad input traps a module or a pod.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::Ipv4Addr;

use aes::cipher::{KeyIvInit, StreamCipher};
use anode_cred::{ChannelGrant, PrincipalId, RequestedLimits};
use anode_sandbox::pods::{E_REFUSED, E_TRAP};
use anode_sandbox::{Action, LoadSpec, ModuleId, Sandbox};
use common::tc::{codec_sandbox, load, load_granted, load_pod, packet, setup_bytes, source};
use common::*;

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

const GOLD: u8 = 0;
const SILVER: u8 = 1;
const BRONZE: u8 = 2;

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

/// Invokes `entry` and returns its result and the packets it sent, by port.
fn run(sb: &mut Sandbox, m: ModuleId, entry: &str, input: &[u8]) -> (i32, Vec<(u16, Vec<u8>)>) {
    let mut out = Vec::new();
    let r = sb.invoke(now(1), m, entry, input, &mut out).unwrap();
    let sent = out
        .into_iter()
        .filter_map(|a| match a {
            Action::SendPacket { dst, port, payload, .. } if dst == Ipv4Addr::new(10, 0, 0, 9) => Some((port, payload)),
            _ => None,
        })
        .collect();
    (r, sent)
}

const KEYS: [[u8; 16]; 3] = [[1; 16], [2; 16], [3; 16]];

/// What one client received: (seq, tier, body) in order.
type Got = Vec<(u32, u8, Vec<u8>)>;

fn split(p: &[u8]) -> (u32, u8, Vec<u8>) {
    (u32::from_be_bytes(p[..4].try_into().unwrap()), p[4], p[5..].to_vec())
}

/// The clients: gold on 5000 (key 0), silver on 5001 (key 1) and 5002
/// (key 2), bronze on 5003 and 5004.
fn clients() -> Vec<(u8, u16, Option<[u8; 16]>)> {
    vec![
        (GOLD, 5000, Some(KEYS[0])),
        (SILVER, 5001, Some(KEYS[1])),
        (SILVER, 5002, Some(KEYS[2])),
        (BRONZE, 5003, None),
        (BRONZE, 5004, None),
    ]
}

/// The path-based variant: frames in, what each client port received.
fn path_based(frames: &[Vec<u8>]) -> (Sandbox, std::collections::HashMap<u16, Got>) {
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    load_pod(&mut sb, "tc-aes", "aes", Some(vec![user()]));
    let rx = load(&mut sb, "tc-rx", "rx");
    let mut paths = Vec::new();
    let mut bronze = None;
    for (tier, port, key) in clients() {
        let m = match (tier, bronze) {
            (BRONZE, Some(m)) => m,
            _ => load(&mut sb, "tc-path", &format!("path-{port}")),
        };
        let (r, _) = run(&mut sb, m, "setup", &setup_bytes(tier, port, key));
        assert!(r >= 1, "setup of {port}: {r}");
        if tier == BRONZE {
            bronze = Some(m);
        } else {
            paths.push(m);
        }
    }
    paths.push(bronze.unwrap());
    let mut got: std::collections::HashMap<u16, Got> = Default::default();
    for (seq, f) in frames.iter().enumerate() {
        let seq = seq as u32;
        assert_eq!(run(&mut sb, rx, "frame", &packet(seq, f)).0, 0, "receive path, frame {seq}");
        for &m in &paths {
            let (r, sent) = run(&mut sb, m, "frame", &seq.to_be_bytes());
            assert!(r >= 1, "path {m:?}, frame {seq}: {r}");
            for (port, p) in sent {
                got.entry(port).or_default().push(split(&p));
            }
        }
    }
    (sb, got)
}

/// The all-in-one variant on the same frames.
fn all_in_one(frames: &[Vec<u8>]) -> std::collections::HashMap<u16, Got> {
    let mut sb = codec_sandbox();
    let all = load(&mut sb, "tc-all", "all");
    for (tier, port, key) in clients() {
        assert!(run(&mut sb, all, "client", &setup_bytes(tier, port, key)).0 >= 1);
    }
    let mut got: std::collections::HashMap<u16, Got> = Default::default();
    for (seq, f) in frames.iter().enumerate() {
        let (r, sent) = run(&mut sb, all, "frame", &packet(seq as u32, f));
        assert_eq!(r, 5, "all-in-one, frame {seq}");
        for (port, p) in sent {
            got.entry(port).or_default().push(split(&p));
        }
    }
    got
}

/// Checks one variant's deliveries.
fn check_tiers(frames: &[Vec<u8>], got: &std::collections::HashMap<u16, Got>) {
    for (tier, port, key) in clients() {
        let g = &got[&port];
        assert_eq!(g.len(), frames.len(), "client {port} got every frame");
        for (i, (seq, t, body)) in g.iter().enumerate() {
            assert_eq!((*seq, *t), (i as u32, tier), "client {port}");
            let plain = key.map_or(body.clone(), |k| decrypt(&k, *seq, body));
            let d = decode(&plain);
            match tier {
                GOLD => assert_eq!(&plain, &frames[i], "gold is the original frame"),
                SILVER => {
                    assert_eq!(d, Some((1152, 2, 44_100)), "silver frame {i} of {port} decodes");
                    assert_eq!(plain.len(), 417, "128 kbit/s at 44.1 kHz, no padding");
                }
                _ => assert_eq!(d, Some((576, 1, 22_050)), "bronze frame {i} decodes"),
            }
            // Another client's key gives no frame.
            if let Some(k) = key {
                let wrong = KEYS.iter().find(|o| **o != k).unwrap();
                let p = decrypt(wrong, *seq, body);
                assert_ne!(p, plain);
                assert_eq!(decode(&p), None, "frame {i} of {port} under another key");
            }
        }
    }
    // The two silver clients get distinct encodes (their watermarks differ).
    assert_ne!(decrypt(&KEYS[1], 3, &got[&5001][3].2), decrypt(&KEYS[2], 3, &got[&5002][3].2));
    assert_eq!(got[&5003], got[&5004], "one bronze encode for every free client");
}

#[test]
fn a_stream_goes_through_both_variants_and_each_client_gets_its_tier() {
    let frames = source(12);
    let (sb, paths) = path_based(&frames);
    check_tiers(&frames, &paths);
    let all = all_in_one(&frames);
    check_tiers(&frames, &all);
    // Same codecs, same inputs, same keys: the two variants send the same bytes.
    assert_eq!(paths, all);
    // The key pod was never reset and no pod trapped.
    assert!(sb.pods().iter().all(|p| p.counters.resets == 0), "{:?}", sb.pods());
}

/// A client module: `bind` (offer name → binding), `call` (binding (4 LE)
/// ‖ argument → result; the bytes the pod returned are delivered locally
/// on port 1), with its argument region at 1024..9216.
fn raw_client() -> Vec<u8> {
    wat(r#"(module
        (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
        (import "anode" "input_read" (func $in (param i32 i32 i32) (result i32)))
        (import "pod" "bind" (func $bind (param i32 i32 i32 i32) (result i32)))
        (import "pod" "call" (func $call (param i32 i32) (result i32)))
        (import "net" "deliver_local" (func $dl (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 0) "bindcall")
        (func $bindf (param i32 i32) (result i32)
          (drop (call $in (i32.const 512) (i32.const 64) (i32.const 0)))
          (call $bind (i32.const 512) (local.get 1) (i32.const 1024) (i32.const 8192)))
        (func $callf (param i32 i32) (result i32) (local $r i32)
          (drop (call $in (i32.const 512) (i32.const 4) (i32.const 0)))
          (drop (call $in (i32.const 1024) (i32.const 8192) (i32.const 4)))
          (local.set $r (call $call (i32.load (i32.const 512)) (i32.sub (local.get 1) (i32.const 4))))
          (if (i32.gt_s (local.get $r) (i32.const 0))
            (then (drop (call $dl (i32.const 1) (i32.const 1024) (local.get $r)))))
          (local.get $r))
        (table (export "__indirect_function_table") 2 funcref)
        (elem (i32.const 0) $bindf $callf)
        (func (export "anode_init")
          (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
          (drop (call $reg (i32.const 4) (i32.const 4) (i32.const 1)))))"#)
}

fn load_raw(sb: &mut Sandbox, p: PrincipalId) -> ModuleId {
    let code = raw_client();
    let cred = admin(p);
    let c = cred.to_bytes();
    let spec = LoadSpec {
        code: &code,
        credential: Some(c),
        requester: None,
        local_name: None,
        limits: RequestedLimits::default(),
    };
    sb.load(now(0), &spec).unwrap()
}

fn raw_call(sb: &mut Sandbox, m: ModuleId, b: i32, arg: &[u8]) -> i32 {
    raw_call_bytes(sb, m, b, arg).0
}

/// The result and the bytes the pod returned.
fn raw_call_bytes(sb: &mut Sandbox, m: ModuleId, b: i32, arg: &[u8]) -> (i32, Vec<u8>) {
    let mut input = b.to_le_bytes().to_vec();
    input.extend_from_slice(arg);
    let mut out = Vec::new();
    let r = sb.invoke(now(2), m, "call", &input, &mut out).unwrap();
    let bytes = out
        .into_iter()
        .find_map(|a| match a {
            Action::DeliverLocal { port: 1, payload, .. } => Some(payload),
            _ => None,
        })
        .unwrap_or_default();
    (r, bytes)
}

fn raw_bind(sb: &mut Sandbox, m: ModuleId, offer: &str) -> i32 {
    let b = sb.invoke(now(1), m, "bind", offer.as_bytes(), &mut Vec::new()).unwrap();
    if b > 0 {
        let r = raw_call(sb, m, b, b"");
        if r < 0 {
            return r;
        }
    }
    b
}

#[test]
fn keys_stay_in_the_aes_pod_and_other_principals_cannot_bind_it() {
    let mut sb = codec_sandbox();
    load_pod(&mut sb, "tc-aes", "aes", Some(vec![user()]));
    // A principal outside the access list is refused at bind.
    let other = load_raw(&mut sb, PrincipalId::of(&anode_cred::SigningKey::from_bytes(&[7; 32])));
    assert_eq!(sb.invoke(now(1), other, "bind", b"aes.seal", &mut Vec::new()).unwrap(), E_REFUSED);
    // Two bindings of the owner: each seals under its own key only.
    let m = load_raw(&mut sb, user());
    let (a, b) = (raw_bind(&mut sb, m, "aes.seal"), raw_bind(&mut sb, m, "aes.seal"));
    assert!(a > 0 && b > 0 && a != b);
    assert_eq!(raw_call(&mut sb, m, a, &KEYS[0]), 0);
    assert_eq!(raw_call(&mut sb, m, b, &KEYS[1]), 0);
    let text = b"a frame of audio".to_vec();
    let mut arg = 7u32.to_le_bytes().to_vec();
    arg.extend_from_slice(&text);
    let (r, ca) = raw_call_bytes(&mut sb, m, a, &arg);
    let (_, cb) = raw_call_bytes(&mut sb, m, b, &arg);
    assert_eq!((r, ca.len()), (text.len() as i32, text.len()));
    assert_ne!(ca, text);
    assert_eq!(decrypt(&KEYS[0], 7, &ca), text, "binding a seals under key 0");
    assert_ne!(decrypt(&KEYS[1], 7, &ca), text);
    assert_eq!(decrypt(&KEYS[1], 7, &cb), text, "binding b under key 1");
    // A 16-byte call after the key is set is a seal of 12 bytes, not a
    // new key: a key cannot be replaced, and no offer returns one.
    let (r, again) = raw_call_bytes(&mut sb, m, a, &KEYS[2]);
    assert_eq!(r, 12);
    assert_eq!(decrypt(&KEYS[0], u32::from_le_bytes([3; 4]), &again), KEYS[2][4..].to_vec());
    // The pod's memory never holds a key in what it returns: the key of
    // binding a does not appear in any result.
    assert!(!ca.windows(16).any(|w| w == KEYS[0]) && !again.windows(16).any(|w| w == KEYS[0]));
    let pod = sb.pods().into_iter().find(|p| p.name == "aes").unwrap();
    assert_eq!(pod.counters.resets, 0);
}

#[test]
fn the_control_and_source_channels_listen_only_where_the_credential_grants() {
    // The experiment's grant: ports 7000-7199 from node a (10.0.0.1) only.
    // Set-ups, ticks and frames from anyone else never reach the modules,
    // so nobody but the operator can add a bronze client (and point a free
    // stream at a third party) or inject frames.
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    let grant = [ChannelGrant::parse("7000-7199", "10.0.0.1/32").unwrap()];
    load_granted(&mut sb, "tc-rx", "rx", &grant);
    load_granted(&mut sb, "tc-path", "path", &grant);
    load_granted(&mut sb, "tc-all", "all", &grant);
    let ports: Vec<(u16, Option<String>)> = sb.channel_infos().into_iter().map(|i| (i.port, i.source)).collect();
    let a = Some("10.0.0.1/32".to_string());
    let mut want = vec![(7000, a.clone()), (7100, a.clone()), (7000, a.clone()), (7001, a.clone())];
    let mut got = ports.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    let setup = [&b"S"[..], &setup_bytes(2, 9000, None)].concat();
    for (port, payload) in [(7100, &setup[..]), (7001, &setup[1..]), (7000, &[0u8; 8][..])] {
        let mut jobs = Vec::new();
        assert_eq!(sb.demux_into(Ipv4Addr::new(10, 0, 0, 9), port, payload, &mut jobs).matched, 0, "port {port}");
        assert!(sb.demux_into(Ipv4Addr::new(10, 0, 0, 1), port, payload, &mut jobs).queued >= 1, "port {port}");
    }
    // Without the grant for its port, the path's control channel is not
    // opened at all (the open is refused and counted).
    let mut sb = codec_sandbox();
    load_granted(&mut sb, "tc-path", "p", &[ChannelGrant::parse("7000", "10.0.0.1/32").unwrap()]);
    assert!(sb.channel_infos().is_empty());
    assert_eq!(sb.counters().channel_refused, 1);
}

#[test]
fn bad_input_never_traps_a_transcoder_module_or_pod() {
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    load_pod(&mut sb, "tc-aes", "aes", None);
    let rx = load(&mut sb, "tc-rx", "rx");
    let path = load(&mut sb, "tc-path", "path");
    let all = load(&mut sb, "tc-all", "all");
    let frames = source(3);
    let mut seed = 99u32;
    let mut rnd = move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        seed >> 8
    };
    let mut inputs: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0; 4], vec![0xff; 5000], vec![0xff; 631]];
    for _ in 0..40 {
        let len = rnd() as usize % 1600;
        inputs.push((0..len).map(|_| rnd() as u8).collect());
    }
    // Real frames cut short, corrupted, or with a valid header and noise after it.
    for f in &frames {
        for cut in [4, 40, 300, f.len() - 1] {
            inputs.push(packet(1, &f[..cut]));
        }
        let mut bad = packet(2, f);
        for i in (8..bad.len()).step_by(7) {
            bad[i] ^= rnd() as u8;
        }
        inputs.push(bad);
    }
    for i in &inputs {
        for (m, entry) in
            [(rx, "frame"), (all, "frame"), (all, "client"), (path, "setup"), (path, "frame"), (path, "poll")]
        {
            let r = sb.invoke(now(1), m, entry, i, &mut Vec::new());
            assert!(r.is_ok(), "{entry} trapped on {} bytes: {r:?}", i.len());
        }
    }
    // The pods, straight from a client, with any argument.
    let c = load_raw(&mut sb, user());
    for offer in ["gold.put", "gold.get", "gold.latest", "silver.get", "aes.seal"] {
        let b = raw_bind(&mut sb, c, offer);
        assert!(b > 0, "{offer}: {b}");
        for i in &inputs {
            let r = raw_call(&mut sb, c, b, &i[..i.len().min(8192)]);
            assert_ne!(r, E_TRAP, "{offer} trapped on {} bytes", i.len());
        }
    }
    // A second writer of a cache is refused.
    assert_eq!(raw_bind(&mut sb, c, "gold.put"), E_REFUSED);
    assert!(sb.pods().iter().all(|p| p.counters.resets == 0), "{:?}", sb.pods());
}

#[test]
fn a_std_modules_memory_growth_is_charged_to_its_principals_heap() {
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    let rx = load(&mut sb, "tc-rx", "rx");
    let before = sb.memory_used(&user());
    let frames = source(2);
    assert_eq!(run(&mut sb, rx, "frame", &packet(0, &frames[0])).0, 0);
    let after = sb.memory_used(&user());
    // The first frame builds the decoder, the encoder and the bindings'
    // regions on the heap: dlmalloc grows the linear memory, and the
    // sandbox's limiter charges the growth to the principal.
    assert!(after > before, "memory.grow of a std module is charged: {before} -> {after}");
}

/// Fuel of the invocations run since the last call.
fn fuel_since(sb: &mut Sandbox) -> u64 {
    let mut recs = Vec::new();
    sb.take_invocations(&mut recs);
    recs.iter().map(|i| i.fuel).sum()
}

/// Frames run before the fuel is counted: the first frame builds each
/// module's decoder, encoders and tables (once per path module, once for
/// the all-in-one).
const WARM: usize = 2;

/// Fuel per frame after [`WARM`] frames (pod calls included: they are
/// charged to their callers) of 1 gold + 1 bronze + `silver` silver
/// streams, path-based and all-in-one.
fn fuel_per_frame(frames: &[Vec<u8>], silver: usize) -> (u64, u64) {
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    load_pod(&mut sb, "tc-aes", "aes", None);
    let rx = load(&mut sb, "tc-rx", "rx");
    let all = load(&mut sb, "tc-all", "all");
    let mut streams = vec![(GOLD, 6000u16, Some(KEYS[0])), (BRONZE, 6001, None)];
    streams.extend((0..silver).map(|i| (SILVER, 6002 + i as u16, Some(KEYS[1]))));
    let mut paths = Vec::new();
    for &(tier, port, key) in &streams {
        let p = load(&mut sb, "tc-path", &format!("p{port}"));
        assert_eq!(run(&mut sb, p, "setup", &setup_bytes(tier, port, key)).0, 1);
        assert_eq!(run(&mut sb, all, "client", &setup_bytes(tier, port, key)).0 as usize, paths.len() + 1);
        paths.push(p);
    }
    let (mut path_fuel, mut all_fuel) = (0, 0);
    for (seq, f) in frames.iter().enumerate() {
        let seq = seq as u32;
        fuel_since(&mut sb);
        assert_eq!(run(&mut sb, rx, "frame", &packet(seq, f)).0, 0);
        for &p in &paths {
            assert_eq!(run(&mut sb, p, "frame", &seq.to_be_bytes()).0, 1);
        }
        let p = fuel_since(&mut sb);
        assert_eq!(run(&mut sb, all, "frame", &packet(seq, f)).0 as usize, streams.len());
        let a = fuel_since(&mut sb);
        if seq as usize >= WARM {
            (path_fuel, all_fuel) = (path_fuel + p, all_fuel + a);
        }
    }
    let n = (frames.len() - WARM) as u64;
    (path_fuel / n, all_fuel / n)
}

/// The load grows with the number of silver streams in both variants (each
/// silver stream is its own encode), and the path-based variant's pods,
/// copies and extra invocations add little to what the same work costs in
/// one module. Fuel counts wasm work (and a fixed charge per host call), not
/// time: wall-clock figures belong to the experiment (docs/transcoder.md).
/// `--nocapture` prints the table.
#[test]
fn fuel_per_frame_grows_with_each_silver_stream_in_both_variants() {
    let frames = source(5);
    let rows: Vec<(usize, u64, u64)> = [1, 2, 4]
        .into_iter()
        .map(|k| {
            let (p, a) = fuel_per_frame(&frames, k);
            (k, p, a)
        })
        .collect();
    println!("silver streams | path-based fuel/frame | all-in-one fuel/frame | path / all");
    for &(k, p, a) in &rows {
        println!("{k} | {p} | {a} | {:.4}", p as f64 / a as f64);
    }
    for w in rows.windows(2) {
        let ((k0, p0, a0), (k1, p1, a1)) = (w[0], w[1]);
        let per = |x0: u64, x1: u64| (x1 - x0) / (k1 - k0) as u64;
        // A silver stream costs at least a million units (an encode) in each.
        assert!(p1 > p0 && per(p0, p1) > 1_000_000, "path-based: {rows:?}");
        assert!(a1 > a0 && per(a0, a1) > 1_000_000, "all-in-one: {rows:?}");
    }
    // The same work: the pods' protection costs under 3 % of the fuel at
    // every size (measured: +0.2 to +0.3 %).
    for &(_, p, a) in &rows {
        assert!(p.abs_diff(a) * 100 < a * 3, "{rows:?}");
    }
}

/// `poll` serves what the cache holds and the path has not sent: the
/// latest frame first, then every new one, and after an overrun of the
/// cache's 16 entries only the 16 it still holds.
#[test]
fn a_polled_path_serves_each_new_frame_once() {
    let mut sb = codec_sandbox();
    for tier in ["gold", "silver", "bronze"] {
        load_pod(&mut sb, "tc-cache", tier, None);
    }
    load_pod(&mut sb, "tc-aes", "aes", Some(vec![user()]));
    let rx = load(&mut sb, "tc-rx", "rx");
    let gold = load(&mut sb, "tc-path", "gold");
    assert_eq!(run(&mut sb, gold, "setup", &setup_bytes(GOLD, 5000, Some(KEYS[0]))).0, 1);
    assert_eq!(run(&mut sb, gold, "poll", b"").0, 0, "nothing in the cache yet");
    let frames = source(22);
    let mut seqs = Vec::new();
    let mut poll = |sb: &mut Sandbox| {
        let (r, sent) = run(sb, gold, "poll", b"");
        seqs.extend(sent.iter().map(|(_, p)| split(p).0));
        assert_eq!(r as usize, sent.len());
        r
    };
    for seq in 0..3u32 {
        assert_eq!(run(&mut sb, rx, "frame", &packet(seq, &frames[seq as usize])).0, 0);
    }
    assert_eq!(poll(&mut sb), 1, "the first poll serves the latest frame");
    assert_eq!(poll(&mut sb), 0);
    for seq in 3..5u32 {
        assert_eq!(run(&mut sb, rx, "frame", &packet(seq, &frames[seq as usize])).0, 0);
    }
    assert_eq!(poll(&mut sb), 2);
    for seq in 5..22u32 {
        assert_eq!(run(&mut sb, rx, "frame", &packet(seq, &frames[seq as usize])).0, 0);
    }
    assert_eq!(poll(&mut sb), 16, "frame 5 was overwritten");
    assert_eq!(seqs, [2, 3, 4].into_iter().chain(6..22).collect::<Vec<u32>>());
    assert_eq!(run(&mut sb, gold, "poll", b"x").0, -1);
}
