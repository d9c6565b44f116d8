//! Shared test setup: the administrator key, credentials, modules, frames.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anode_cred::{Issuer, PrincipalId, SigningKey};
use anode_monitor::apps::abi::Field;
use anode_monitor::policy::{self, ExportRights, MonitorSpec, PAYLOAD_ALL, PolicyLimits};
use anode_monitor::{CryptoPan, Frame, LinkType, Monitor, MonitorConfig};

pub fn issuer() -> Issuer {
    Issuer::from_secret(&[1; 32]).unwrap()
}

pub fn user() -> PrincipalId {
    PrincipalId::of(&SigningKey::from_bytes(&[9; 32]))
}

/// The time at which the tests run their monitors.
pub fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

pub fn all_fields() -> Vec<Field> {
    Field::ALL.to_vec()
}

pub fn spec(read: &[Field], payload: u32, export: ExportRights) -> MonitorSpec {
    MonitorSpec {
        read: read.to_vec(),
        payload,
        export,
        limits: Some(PolicyLimits { budget: 200_000, periodic: 50_000_000, memory: 8 << 20 }),
        ..MonitorSpec::default()
    }
}

pub fn records() -> ExportRights {
    ExportRights { records: true, packets: false }
}

pub fn everything() -> ExportRights {
    ExportRights { records: true, packets: true }
}

pub fn cred(spec: &MonitorSpec) -> Vec<u8> {
    policy::issue(&issuer(), user(), spec).unwrap().to_bytes().to_vec()
}

/// A credential that sees every field and the whole payload, exports everything.
pub fn full_cred() -> Vec<u8> {
    cred(&spec(&all_fields(), PAYLOAD_ALL, everything()))
}

pub fn monitor(cfg: MonitorConfig) -> Monitor {
    Monitor::new(issuer().public_key(), cfg, Some(CryptoPan::new(&[5; 32]))).unwrap()
}

pub fn modules_dir() -> PathBuf {
    match std::env::var_os("ANODE_MODULES_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../modules/out"),
    }
}

pub fn module(name: &str) -> Vec<u8> {
    let p = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&p)
        .unwrap_or_else(|e| panic!("cannot read module {}: {e}. Build the modules first: scripts/setup", p.display()))
}

pub fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/traces")
}

/// An Ethernet/IPv4/TCP frame.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32, flags: &str, payload: &[u8]) -> Vec<u8> {
    let mut b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src, dst, 64)
        .tcp(sport, dport, seq, 64000);
    for c in flags.chars() {
        b = match c {
            'S' => b.syn(),
            'A' => b.ack(7),
            'F' => b.fin(),
            'R' => b.rst(),
            'P' => b.psh(),
            _ => b,
        };
    }
    let mut out = Vec::new();
    b.write(&mut out, payload).unwrap();
    out
}

pub fn frame(ts_ns: u64, data: &[u8]) -> Frame<'_> {
    Frame { ts_ns, wire_len: data.len() as u32, iface: 0, link: LinkType::Ethernet, data }
}

/// A pcap (microsecond) file of Ethernet frames.
pub fn pcap(frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (ts, f) in frames {
        out.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
        out.extend_from_slice(&((ts % 1_000_000_000 / 1000) as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}
