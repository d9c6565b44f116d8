//! Receive channels (RCANE §IV-D): `net.open_channel_spec` with checked
//! specs, the credential's channel grants, per-channel FIFOs with counters,
//! per-channel VPs, and the fuzz seeds of `demux_spec`.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anode_cred::{
    ChannelGrant, GrantSpec, Interface, InterfaceSet, ModuleGrant, ModuleHash, PrincipalId, RequestedLimits,
};
use anode_sandbox::demux::{DemuxSpec, SourcePrefix, SubKey};
use anode_sandbox::host::{E_DENIED, E_INVAL};
use anode_sandbox::{Job, JobKind, LoadSpec, ModuleId, Sandbox};
use common::heap::{principal, run_job};
use common::*;

/// `open` (arg: the VP index; input: spec bytes) opens a channel whose
/// entry is `pkt`; `pkt` counts packets; `count` returns the count.
const RX_WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $input (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $n (mut i32) (i32.const 0))
  (data (i32.const 0) "open")
  (data (i32.const 8) "pkt")
  (data (i32.const 16) "count")
  (func $open_f (param i32 i32) (result i32) (local $len i32)
    (local.set $len (call $input (i32.const 1024) (i32.const 512) (i32.const 0)))
    (call $open (i32.const 1024) (local.get $len) (i32.const 8) (i32.const 3) (local.get 0)))
  (func $pkt (param i32 i32) (result i32)
    (global.set $n (i32.add (global.get $n) (i32.const 1))) (i32.const 0))
  (func $count (param i32 i32) (result i32) (global.get $n))
  (table (export "__indirect_function_table") 3 funcref)
  (elem (i32.const 0) $open_f $pkt $count)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 3) (i32.const 1)))
    (drop (call $reg (i32.const 16) (i32.const 5) (i32.const 2)))))"#;

fn rx_module() -> Vec<u8> {
    wat(RX_WAT)
}

/// Loads the receive module for `p` under `grants` (`None`: an
/// administrative credential).
fn load(sb: &mut Sandbox, p: PrincipalId, grants: Option<&[ChannelGrant]>) -> ModuleId {
    let code = rx_module();
    let cred = match grants {
        None => admin(p),
        Some(g) => {
            let spec = GrantSpec {
                modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
                interfaces: InterfaceSet::of(&[Interface::Net]),
                limits: limits(),
                expires: None,
            };
            issuer().issue_channels(p, &spec, g).unwrap()
        }
    };
    let limits = RequestedLimits { cpu: Some(1_000_000), memory: Some(1 << 20), ..Default::default() };
    let spec = LoadSpec { code: &code, credential: Some(cred.to_bytes()), requester: None, local_name: None, limits };
    sb.load(now(0), &spec).unwrap()
}

fn open(sb: &mut Sandbox, m: ModuleId, spec: &[u8], vp: i32) -> i32 {
    let mut out = Vec::new();
    let job = Job::new(m, JobKind::Entry { entry: "open".into(), arg: vp }, spec.to_vec(), 0);
    run_job(sb, job, &mut out).unwrap()
}

fn bytes(s: &DemuxSpec) -> Vec<u8> {
    let mut v = Vec::new();
    s.emit(&mut v);
    v
}

fn spec(port: u16, source: Option<(Ipv4Addr, u8)>, buffer: u32) -> DemuxSpec {
    DemuxSpec {
        port,
        source: source.map(|(a, l)| SourcePrefix::new(a, l).unwrap()),
        source_granted: false,
        prefix: Vec::new(),
        keys: Vec::new(),
        buffer,
    }
}

fn count(sb: &mut Sandbox, m: ModuleId) -> i32 {
    let mut out = Vec::new();
    run_job(sb, Job::new(m, JobKind::Entry { entry: "count".into(), arg: 0 }, Vec::new(), 0), &mut out).unwrap()
}

const NET1: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 0);

#[test]
fn the_credential_authorises_the_filter() {
    let mut sb = sandbox();
    let grant = ChannelGrant::parse("5000-5010", "10.0.1.0/24").unwrap();
    let m = load(&mut sb, principal(1), Some(&[grant]));
    // Within the grant: a port in range, a source prefix inside it.
    assert!(open(&mut sb, m, &bytes(&spec(5000, Some((NET1, 24)), 0)), 0) >= 0);
    assert!(open(&mut sb, m, &bytes(&spec(5010, Some((Ipv4Addr::new(10, 0, 1, 128), 25)), 0)), 0) >= 0);
    // Any source would capture other principals' flows.
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, None, 0)), 0), E_DENIED);
    // A wider prefix, another prefix, a port outside.
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, Some((Ipv4Addr::new(10, 0, 0, 0), 16)), 0)), 0), E_DENIED);
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, Some((Ipv4Addr::new(10, 0, 2, 0), 24)), 0)), 0), E_DENIED);
    assert_eq!(open(&mut sb, m, &bytes(&spec(5011, Some((NET1, 24)), 0)), 0), E_DENIED);
    // Malformed spec bytes and a VP index beyond u8: bad arguments, not refusals.
    assert_eq!(open(&mut sb, m, &[1, 0], 0), E_INVAL);
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, Some((NET1, 24)), 0)), 256), E_INVAL);
    assert_eq!(sb.counters().channel_refused, 4);
    assert_eq!(sb.channel_infos().len(), 2);
    // An administrative credential may open anything.
    let a = load(&mut sb, principal(2), None);
    assert!(open(&mut sb, a, &bytes(&spec(7, None, 0)), 0) >= 0);
}

#[test]
fn a_granted_source_spec_listens_where_the_credential_says() {
    // The operator grants ports 7100-7199 from 10.0.0.1 only and 5000 from
    // anywhere; the module asks for "the source my credential grants".
    let mut sb = sandbox();
    let ctl = ChannelGrant::parse("7100-7199", "10.0.0.1/32").unwrap();
    let any = ChannelGrant::parse("5000", "*").unwrap();
    let m = load(&mut sb, principal(1), Some(&[ctl, any]));
    let granted = |port| DemuxSpec { source_granted: true, ..spec(port, None, 0) };
    assert!(open(&mut sb, m, &bytes(&granted(7105)), 0) >= 0);
    assert!(open(&mut sb, m, &bytes(&granted(5000)), 0) >= 0);
    let infos = sb.channel_infos();
    assert_eq!(infos[0].source.as_deref(), Some("10.0.0.1/32"));
    assert_eq!(infos[1].source, None);
    let mut jobs = Vec::new();
    assert_eq!(sb.demux_into(Ipv4Addr::new(10, 0, 0, 1), 7105, b"S", &mut jobs).queued, 1);
    assert_eq!(sb.demux_into(Ipv4Addr::new(10, 0, 0, 9), 7105, b"S", &mut jobs).matched, 0, "another source");
    // No grant for the port: refused, and counted.
    assert_eq!(open(&mut sb, m, &bytes(&granted(6000)), 0), E_DENIED);
    assert_eq!(sb.counters().channel_refused, 1);
    // A credential without channel grants (and a node that does not
    // require them) grants any source.
    let a = load(&mut sb, principal(2), None);
    assert!(open(&mut sb, a, &bytes(&granted(6000)), 0) >= 0);
    assert!(sb.channel_infos().iter().any(|i| i.port == 6000 && i.source.is_none()));
}

#[test]
fn a_full_fifo_drops_against_its_own_channel_only() {
    let mut sb = sandbox();
    let a = load(&mut sb, principal(1), None);
    let b = load(&mut sb, principal(2), None);
    // A: 3,000 bytes of FIFO for 10.0.1.0/24; B: 88 KB for 10.0.2.0/24; same port.
    assert!(open(&mut sb, a, &bytes(&spec(5000, Some((NET1, 24)), 3000)), 0) >= 0);
    assert!(open(&mut sb, b, &bytes(&spec(5000, Some((Ipv4Addr::new(10, 0, 2, 0), 24)), 88_000)), 1) >= 0);
    let (src_a, src_b) = (Ipv4Addr::new(10, 0, 1, 7), Ipv4Addr::new(10, 0, 2, 7));
    let mut jobs = Vec::new();
    for _ in 0..100 {
        sb.demux_into(src_a, 5000, &[0; 1000], &mut jobs);
        let o = sb.demux_into(src_b, 5000, &[0; 500], &mut jobs);
        assert_eq!(o.queued, 1, "B's channel takes every packet");
    }
    let infos = sb.channel_infos();
    let (ia, ib) = (&infos[0], &infos[1]);
    assert_eq!((ia.delivered, ia.dropped_full, ia.queued_bytes), (3, 97, 3000));
    assert_eq!((ib.delivered, ib.dropped_full, ib.queued_bytes, ib.vp), (100, 0, 50_000, 1));
    assert!(jobs.iter().filter(|j| j.module == b).all(|j| j.vp == 1));
    // Running the jobs gives the FIFO back; the entries ran.
    let mut out = Vec::new();
    for j in jobs.drain(..) {
        run_job(&mut sb, j, &mut out).unwrap();
    }
    assert_eq!((count(&mut sb, a), count(&mut sb, b)), (3, 100));
    let infos = sb.channel_infos();
    assert_eq!((infos[0].queued_bytes, infos[1].queued_bytes), (0, 0));
    // Room again.
    assert_eq!(sb.demux_into(src_a, 5000, &[0; 1000], &mut jobs).queued, 1);
}

#[test]
fn short_packets_are_malformed_for_a_keyed_channel_and_cost_it_nothing_else() {
    let mut sb = sandbox();
    let a = load(&mut sb, principal(1), None);
    let mut s = spec(6000, None, 0);
    s.keys = vec![SubKey::Source, SubKey::Payload { offset: 4, len: 4 }];
    assert!(open(&mut sb, a, &bytes(&s), 0) >= 0);
    let mut jobs = Vec::new();
    let o = sb.demux_into(Ipv4Addr::new(1, 2, 3, 4), 6000, &[0; 7], &mut jobs);
    assert_eq!((o.matched, o.queued, o.malformed), (1, 0, 1));
    assert!(jobs.is_empty());
    assert_eq!(sb.demux_into(Ipv4Addr::new(1, 2, 3, 4), 6000, &[0; 8], &mut jobs).queued, 1);
    let i = &sb.channel_infos()[0];
    assert_eq!((i.dropped_malformed, i.delivered), (1, 1));
}

#[test]
fn a_flooding_source_cannot_take_a_keyed_channels_fifo_from_a_steady_one() {
    // One channel keyed on the source, 10,000 bytes of FIFO; source F
    // floods, source S sends one packet in 20; the channel's jobs run 5 per
    // round, oldest first. F's excess is refused at its share (counted as
    // `dropped_share`), S loses nothing. Sources hash into buckets with a
    // key drawn per channel: F and S share one with odds 1/1024, and then
    // share its share, so a run that lost is tried again on a new channel
    // (a new key); a broken share rule loses in every run.
    let run = || {
        let mut sb = sandbox();
        let m = load(&mut sb, principal(1), None);
        let mut s = spec(6000, None, 10_000);
        s.keys = vec![SubKey::Source];
        assert!(open(&mut sb, m, &bytes(&s), 0) >= 0);
        let (flood, steady) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
        let mut queue = std::collections::VecDeque::new();
        let (mut sent, mut lost) = (0, 0);
        for _ in 0..40 {
            for i in 0..20 {
                let src = if i == 10 { steady } else { flood };
                let mut jobs = Vec::new();
                let o = sb.demux_into(src, 6000, &[7; 100], &mut jobs);
                if src == steady {
                    sent += 1;
                    lost += 1 - o.queued;
                }
                queue.extend(jobs);
            }
            for _ in 0..5 {
                if let Some(j) = queue.pop_front() {
                    run_job(&mut sb, j, &mut Vec::new()).unwrap();
                }
            }
        }
        let i = sb.channel_infos()[0].clone();
        assert_eq!(count(&mut sb, m), 200, "5 jobs run in each of 40 rounds");
        (sent, lost, i)
    };
    let (sent, lost, i) = (0..3).map(|_| run()).find(|r| r.1 == 0).unwrap_or_else(run);
    assert_eq!((sent, lost), (40, 0), "{i:?}");
    assert!(i.dropped_share > 500 && i.dropped_full == 0, "{i:?}");
    assert!(i.queued_bytes <= 10_000 && i.active_subflows >= 1, "{i:?}");
}

#[test]
fn a_keyed_channels_share_table_is_charged_to_its_session() {
    let mut sb = sandbox();
    let m = load(&mut sb, principal(1), None);
    let handles = |sb: &Sandbox| sb.heap(&principal(1)).unwrap().handles;
    let before = handles(&sb);
    assert!(open(&mut sb, m, &bytes(&spec(6000, None, 0)), 0) >= 0);
    let plain = handles(&sb) - before;
    let mut s = spec(6001, None, 0);
    s.keys = vec![SubKey::Source];
    assert!(open(&mut sb, m, &bytes(&s), 0) >= 0);
    let keyed = handles(&sb) - before - plain;
    assert_eq!(keyed - plain, anode_sandbox::demux::SHARE_TABLE_BYTES);
}

#[test]
fn closing_by_unload_removes_the_route() {
    let mut sb = sandbox();
    let a = load(&mut sb, principal(1), None);
    assert!(open(&mut sb, a, &bytes(&spec(5000, None, 0)), 0) >= 0);
    assert!(sb.has_channel(5000, Ipv4Addr::new(1, 1, 1, 1), b"x"));
    assert!(!sb.has_channel(5001, Ipv4Addr::new(1, 1, 1, 1), b"x"));
    assert!(sb.unload(a));
    assert!(!sb.has_channels());
}

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds").join(target);
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn demux_spec_fuzz_seeds() {
    let s = seeds("demux_spec");
    assert!(s.len() >= 5);
    for (name, data) in &s {
        anode_sandbox::fuzzing::demux_spec(data);
        let ok = DemuxSpec::parse(data).is_ok();
        let expect_bad = ["bad_", "trailing", "truncated"].iter().any(|p| name.starts_with(p));
        assert_eq!(ok, !expect_bad, "seed {name}");
        // Truncations and flips of each seed: typed errors only.
        for n in 0..data.len() {
            anode_sandbox::fuzzing::demux_spec(&data[..n]);
            let mut m = data.clone();
            m[n] ^= 0x5a;
            anode_sandbox::fuzzing::demux_spec(&m);
        }
    }
}

#[test]
fn the_session_heap_binds_a_fifo_larger_than_the_reservation() {
    let mut sb = sandbox();
    sb.set_session_heap(principal(1), Some(1 << 20));
    let a = load(&mut sb, principal(1), None);
    // A 16 MiB FIFO in a 1 MiB session: the heap stops it.
    assert!(open(&mut sb, a, &bytes(&spec(5000, None, 16 << 20)), 0) >= 0);
    let mut jobs = Vec::new();
    for _ in 0..2000 {
        sb.demux_into(Ipv4Addr::new(1, 1, 1, 1), 5000, &[0; 1000], &mut jobs);
    }
    let held = jobs.len();
    assert!(held > 100 && held < 1000, "{held}");
    let i = &sb.channel_infos()[0];
    assert_eq!((i.delivered as usize, i.dropped_full as usize), (held, 2000 - held));
    let u = sb.heap(&principal(1)).unwrap();
    assert!(u.used <= 1 << 20 && u.refusals as usize >= 2000 - held, "{u:?}");
    drop(jobs);
    assert_eq!(sb.channel_infos()[0].queued_bytes, 0);
    assert_eq!(sb.heap(&principal(1)).unwrap().queued, 0);
}

#[test]
fn a_node_that_requires_grants_refuses_channels_to_credentials_without_any() {
    let mut cfg = anode_sandbox::SandboxConfig::default();
    cfg.verifier.require_channel_grants = true;
    let mut sb = sandbox_with(cfg, line_routes(1, 1));
    // An ordinary credential with no channel fact: no channel at all.
    let m = load(&mut sb, principal(1), Some(&[]));
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, Some((NET1, 24)), 0)), 0), E_DENIED);
    assert_eq!(open(&mut sb, m, &bytes(&spec(5000, None, 0)), 0), E_DENIED);
    // A granted one gets what it was granted; an administrative one anything.
    let grant = ChannelGrant::parse("5000", "10.0.1.0/24").unwrap();
    let g = load(&mut sb, principal(2), Some(&[grant]));
    assert!(open(&mut sb, g, &bytes(&spec(5000, Some((NET1, 24)), 0)), 0) >= 0);
    let a = load(&mut sb, principal(3), None);
    assert!(open(&mut sb, a, &bytes(&spec(7, None, 0)), 0) >= 0);
    // Without the requirement the first credential may open anything (as before grants).
    let mut sb = sandbox();
    let m = load(&mut sb, principal(1), Some(&[]));
    assert!(open(&mut sb, m, &bytes(&spec(5000, None, 0)), 0) >= 0);
}

/// `open` as in [`RX_WAT`]; `pkt` records `net.subflow` of each packet;
/// `last` returns the last one's low 32 bits, `high` its high 32 bits.
const SUBFLOW_WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $input (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "net" "subflow" (func $subflow (result i64)))
  (memory (export "memory") 1)
  (global $last (mut i64) (i64.const -1))
  (data (i32.const 0) "open")
  (data (i32.const 8) "pkt")
  (data (i32.const 16) "last")
  (data (i32.const 24) "high")
  (func $open_f (param i32 i32) (result i32) (local $len i32)
    (local.set $len (call $input (i32.const 1024) (i32.const 512) (i32.const 0)))
    (call $open (i32.const 1024) (local.get $len) (i32.const 8) (i32.const 3) (local.get 0)))
  (func $pkt (param i32 i32) (result i32) (global.set $last (call $subflow)) (i32.const 0))
  (func $last_f (param i32 i32) (result i32) (i32.wrap_i64 (global.get $last)))
  (func $high_f (param i32 i32) (result i32) (i32.wrap_i64 (i64.shr_u (global.get $last) (i64.const 32))))
  (table (export "__indirect_function_table") 4 funcref)
  (elem (i32.const 0) $open_f $pkt $last_f $high_f)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 3) (i32.const 1)))
    (drop (call $reg (i32.const 16) (i32.const 4) (i32.const 2)))
    (drop (call $reg (i32.const 24) (i32.const 4) (i32.const 3)))))"#;

#[test]
fn each_packet_carries_its_subflow_to_the_channels_entry() {
    let mut sb = sandbox();
    let code = wat(SUBFLOW_WAT);
    let cred = admin(principal(1));
    let limits = RequestedLimits { cpu: Some(1_000_000), memory: Some(1 << 20), ..Default::default() };
    let ls = LoadSpec { code: &code, credential: Some(cred.to_bytes()), requester: None, local_name: None, limits };
    let m = sb.load(now(0), &ls).unwrap();
    // Port 6000 keyed on payload bytes 0..2; port 6001 without keys.
    let mut keyed = spec(6000, None, 0);
    keyed.keys = vec![SubKey::Payload { offset: 0, len: 2 }];
    assert!(open(&mut sb, m, &bytes(&keyed), 0) >= 0);
    assert!(open(&mut sb, m, &bytes(&spec(6001, None, 0)), 0) >= 0);
    let run = |sb: &mut Sandbox, entry: &str| {
        let mut out = Vec::new();
        run_job(sb, Job::new(m, JobKind::Entry { entry: entry.into(), arg: 0 }, Vec::new(), 0), &mut out).unwrap()
    };
    let flow = |sb: &mut Sandbox, port: u16, payload: &[u8]| -> u64 {
        let mut jobs = Vec::new();
        sb.demux_into(NET1, port, payload, &mut jobs);
        assert_eq!(jobs.len(), 1);
        let job = jobs.pop().unwrap();
        let mut out = Vec::new();
        run_job(sb, job, &mut out).unwrap();
        (u64::from(run(sb, "high") as u32) << 32) | u64::from(run(sb, "last") as u32)
    };
    let a1 = flow(&mut sb, 6000, b"AAxxxx");
    let a2 = flow(&mut sb, 6000, b"AAyy");
    let b = flow(&mut sb, 6000, b"BBxxxx");
    assert_eq!(a1, a2, "same key fields, same sub-flow");
    assert_ne!(a1, b, "other key fields, another sub-flow");
    assert_ne!(a1, 0);
    assert_eq!(flow(&mut sb, 6001, b"AAxxxx"), 0, "a channel without keys: 0");
    // The immediate path gives the same value.
    assert_eq!(sb.deliver(now(1), NET1, 6000, b"BBzz", &mut Vec::new()), 1);
    assert_eq!((u64::from(run(&mut sb, "high") as u32) << 32) | u64::from(run(&mut sb, "last") as u32), b);
}
