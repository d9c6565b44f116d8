//! Hostile modules: forbidden fields, payload beyond the grant, loops, traps,
//! unbounded allocation, exports without the right, and refused binaries.
#![allow(clippy::unwrap_used)]

mod common;

use anode_monitor::apps::abi::{Element, Field, Record, be_uint};
use anode_monitor::policy::{ExportRights, Prefix};
use anode_monitor::runtime::LoadError;
use anode_monitor::{MonitorConfig, MonitorLoadError, Output};
use common::*;

const SRC: [u8; 4] = [192, 0, 2, 77];
const DST: [u8; 4] = [198, 51, 100, 1];

/// A payload whose first byte is a command and whose bytes 40.. hold the secret.
fn payload(cmd: u8) -> Vec<u8> {
    let mut p = vec![b'.'; 40];
    p[0] = cmd;
    p.extend_from_slice(b"PAYLOAD-SECRET-7f3a and more");
    p
}

fn hostile_spec(export: ExportRights) -> anode_monitor::MonitorSpec {
    let mut s = spec(&[Field::Ts, Field::Dport, Field::TcpFlags, Field::Src], 16, export);
    s.anonymize = vec![Prefix::ALL_V4];
    s.limits = Some(anode_monitor::PolicyLimits { budget: 50_000_000, periodic: 1_000_000, memory: 8 << 20 });
    s
}

fn feed(m: &mut anode_monitor::Monitor, cmds: &[u8]) -> Vec<Output> {
    let mut out = Vec::new();
    for (i, c) in cmds.iter().enumerate() {
        let f = tcp4(SRC, DST, 40000, 80, 1000 + i as u32, "AP", &payload(*c));
        m.handle_frame(&frame(i as u64 * 1000, &f), &mut out);
    }
    m.flush(&mut out);
    out
}

fn hostile_records(out: &[Output]) -> Vec<(u64, u64)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Record { name, bytes, .. } if &**name == "hostile" => {
                let r = Record::parse(bytes).unwrap();
                let get = |e| r.items().find(|(x, _)| *x == e).map(|(_, v)| be_uint(v)).unwrap();
                Some((get(Element::Packets), get(Element::FlowId)))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn forbidden_fields_and_payload_beyond_the_grant_are_nowhere_in_module_memory() {
    // Scanning all of its memory takes the module tens of millions of instructions.
    let mut scan = hostile_spec(records());
    scan.limits = Some(anode_monitor::PolicyLimits { budget: 500_000_000, periodic: 1_000_000, memory: 8 << 20 });
    let mut m = monitor(MonitorConfig { batch: 4, ..MonitorConfig::default() });
    m.verifier_mut().max.budget = 500_000_000;
    let h = m.load(now(), "hostile", &module("mon-hostile"), &cred(&scan)).unwrap();
    let out = feed(&mut m, b"S..S.S");
    assert_eq!(m.module_counters(h).unwrap().overruns, 0);
    let recs = hostile_records(&out);
    assert_eq!(recs.len(), 6);
    // No forbidden field byte is non-zero; neither the secret beyond the
    // 16 granted bytes nor the clear source address is in its memory.
    assert!(recs.iter().all(|&(forbidden, secrets)| forbidden == 0 && secrets == 0), "{recs:?}");
    // The control: with the whole payload and no anonymization the scan finds both.
    let mut m = monitor(MonitorConfig::default());
    m.verifier_mut().max.budget = 500_000_000;
    let mut open = scan.clone();
    open.payload = anode_monitor::policy::PAYLOAD_ALL;
    open.anonymize.clear();
    m.load(now(), "hostile", &module("mon-hostile"), &cred(&open)).unwrap();
    let recs = hostile_records(&feed(&mut m, b"S"));
    assert!(recs[0].1 >= 2, "control scan found {recs:?}");
}

#[test]
fn loops_traps_and_memory_bombs_end_only_that_call() {
    let mut m = monitor(MonitorConfig { batch: 1, ..MonitorConfig::default() });
    let h = m.load(now(), "hostile", &module("mon-hostile"), &cred(&hostile_spec(records()))).unwrap();
    let c = m.load(now(), "count", &module("mon-count"), &cred(&spec(&[Field::WireLen], 0, records()))).unwrap();
    let out = feed(&mut m, b"L.T.M..");
    let hc = m.module_counters(h).unwrap();
    assert_eq!((hc.overruns, hc.traps, hc.memory), (1, 1, 1), "{hc:?}");
    assert_eq!(hc.packets, 7);
    // The four harmless packets were handled and exported.
    assert_eq!(hostile_records(&out).len(), 4);
    // The other module saw every packet.
    assert_eq!(m.module_counters(c).unwrap().packets, 7);
    assert_eq!(m.module_counters(c).unwrap().traps + m.module_counters(c).unwrap().overruns, 0);
    // And keeps working: its periodic part exports its count.
    let mut out = Vec::new();
    m.periodic(1, &mut out);
    assert!(out.iter().any(|o| matches!(o, Output::Record { name, .. } if &**name == "count")));
}

#[test]
fn a_loop_in_a_batch_loses_the_rest_of_that_batch_for_that_module_only() {
    let mut m = monitor(MonitorConfig { batch: 4, ..MonitorConfig::default() });
    let h = m.load(now(), "hostile", &module("mon-hostile"), &cred(&hostile_spec(records()))).unwrap();
    let out = feed(&mut m, b"..L.....");
    let hc = m.module_counters(h).unwrap();
    assert_eq!((hc.calls, hc.overruns, hc.packets_lost), (2, 1, 4));
    // Records of the two packets before the loop were kept, the second batch ran whole.
    assert_eq!(hostile_records(&out).len(), 6);
}

#[test]
fn persistent_overruns_unload_the_module_with_a_reason() {
    let mut m = monitor(MonitorConfig { batch: 1, unload_after: 3, ..MonitorConfig::default() });
    let h = m.load(now(), "hostile", &module("mon-hostile"), &cred(&hostile_spec(records()))).unwrap();
    let out = feed(&mut m, b"LLLLL..");
    let unloads: Vec<&String> =
        out.iter().filter_map(|o| if let Output::Unloaded { reason, .. } = o { Some(reason) } else { None }).collect();
    assert_eq!(unloads.len(), 1);
    assert!(unloads[0].contains("3 CPU budget overruns"), "{}", unloads[0]);
    let info = m.modules().into_iter().find(|i| i.id == h).unwrap();
    assert!(info.unloaded.is_some());
    assert_eq!(info.counters.overruns, 3);
    assert_eq!(info.counters.packets, 3, "nothing after the unload");
    assert_eq!(m.counters().unloads, 1);
}

#[test]
fn exports_without_the_right_are_refused_and_counted() {
    let mut m = monitor(MonitorConfig::default());
    let h = m.load(now(), "hostile", &module("mon-hostile"), &cred(&hostile_spec(ExportRights::default()))).unwrap();
    // Trajectory sampling samples packets, but may export neither records nor packets.
    let t = m
        .load(now(), "traj", &module("mon-trajectory"), &cred(&spec(&all_fields(), 0, ExportRights::default())))
        .unwrap();
    let mut out = Vec::new();
    for i in 0..400u32 {
        let f = tcp4(SRC, DST, 40000, 80, i * 100, "A", b"E");
        m.handle_frame(&frame(u64::from(i), &f), &mut out);
    }
    m.flush(&mut out);
    assert!(out.is_empty(), "{:?}", out.first());
    assert_eq!(m.module_counters(h).unwrap().records_denied, 400);
    let tc = m.module_counters(t).unwrap();
    assert!(tc.samples_denied > 10 && tc.records_denied > tc.samples_denied, "{tc:?}");
}

#[test]
fn the_module_is_told_of_an_overrun_on_its_next_call() {
    // mon_packet(status): status 0 → loop; status > 0 → export a record holding status.
    let wat = r#"(module
        (import "mon" "emit" (func $emit (param i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 16) "\01\0c\00\00\00\00\00\00\00\00")
        (func (export "mon_init") (param i32 i32) (result i32) (i32.const 1024))
        (func (export "mon_packet") (param $s i32) (result i32)
            (if (i32.eqz (local.get $s)) (then (loop $l (br $l))))
            (i32.store8 (i32.const 25) (local.get $s))
            (drop (call $emit (i32.const 16) (i32.const 10)))
            (i32.const 0)))"#;
    let mut m = monitor(MonitorConfig { batch: 1, ..MonitorConfig::default() });
    let mut s = spec(&[Field::Ts], 0, records());
    s.limits = Some(anode_monitor::PolicyLimits { budget: 10_000, periodic: 10_000, memory: 1 << 20 });
    let id = m.load(now(), "teller", &wat::parse_str(wat).unwrap(), &cred(&s)).unwrap();
    let out = feed(&mut m, b"..");
    assert_eq!(m.module_counters(id).unwrap().overruns, 1);
    let Output::Record { bytes, .. } = &out[0] else { panic!("{out:?}") };
    assert_eq!(be_uint(&bytes[2..10]), 1, "told of one overrun");
}

#[test]
fn refused_binaries() {
    let mut m = monitor(MonitorConfig::default());
    let c = cred(&spec(&[Field::Ts], 0, records()));
    let load = |m: &mut anode_monitor::Monitor, wat: &str| m.load(now(), "x", &wat::parse_str(wat).unwrap(), &c);
    let ok_exports = r#"(memory (export "memory") 1)
        (func (export "mon_init") (param i32 i32) (result i32) (i32.const 1024))
        (func (export "mon_packet") (param i32) (result i32) (i32.const 0))"#;
    assert!(matches!(
        load(&mut m, &format!(r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32))) {ok_exports})"#)),
        Err(MonitorLoadError::Module(LoadError::ForbiddenImport(i))) if i == "wasi_snapshot_preview1.fd_write"
    ));
    assert!(matches!(
        load(&mut m, &format!(r#"(module (import "mon" "raw_packet" (func (result i32))) {ok_exports})"#)),
        Err(MonitorLoadError::Module(LoadError::ForbiddenImport(_)))
    ));
    assert!(matches!(
        load(
            &mut m,
            r#"(module (memory (export "memory") 1) (func (export "mon_packet") (param i32) (result i32) (i32.const 0)))"#
        ),
        Err(MonitorLoadError::Module(LoadError::MissingExport("mon_init")))
    ));
    assert!(matches!(
        load(
            &mut m,
            r#"(module (memory (export "memory") 1) (func (export "mon_init") (param i32 i32) (result i32) (i32.const -1)) (func (export "mon_packet") (param i32) (result i32) (i32.const 0)))"#
        ),
        Err(MonitorLoadError::Module(LoadError::Init(_)))
    ));
    assert!(matches!(
        load(
            &mut m,
            r#"(module (memory (export "memory") 1) (func (export "mon_init") (param i32 i32) (result i32) (i32.const 65000)) (func (export "mon_packet") (param i32) (result i32) (i32.const 0)))"#
        ),
        Err(MonitorLoadError::Module(LoadError::Init(_)))
    ));
    assert!(matches!(
        load(
            &mut m,
            r#"(module (memory (export "memory") 1) (func (export "mon_init") (param i32 i32) (result i32) (loop $l (br $l)) (i32.const 0)) (func (export "mon_packet") (param i32) (result i32) (i32.const 0)))"#
        ),
        Err(MonitorLoadError::Module(LoadError::Init(_)))
    ));
    assert!(matches!(
        load(
            &mut m,
            r#"(module (memory (export "memory") 2000) (func (export "mon_init") (param i32 i32) (result i32) (i32.const 0)) (func (export "mon_packet") (param i32) (result i32) (i32.const 0)))"#
        ),
        Err(MonitorLoadError::Module(LoadError::MemoryLimit(_)))
    ));
    assert!(matches!(
        m.load(now(), "x", b"\0asm\x01\0\0\0garbage", &c),
        Err(MonitorLoadError::Module(LoadError::Malformed(_)))
    ));
    assert!(matches!(
        m.load(now(), "x", &vec![0; 2 << 20], &c),
        Err(MonitorLoadError::Module(LoadError::TooLarge { .. }))
    ));
    // An anonymizing credential on a monitor without a key.
    let mut bare = anode_monitor::Monitor::new(issuer().public_key(), MonitorConfig::default(), None).unwrap();
    let mut s = spec(&[Field::Src], 0, records());
    s.anonymize = vec![Prefix::ALL_V4];
    assert_eq!(bare.load(now(), "x", &module("mon-count"), &cred(&s)), Err(MonitorLoadError::NoAnonymizationKey));
    assert_eq!(m.counters().load_refused.values().sum::<u64>(), 9);
    assert_eq!(m.modules().len(), 0);
}
