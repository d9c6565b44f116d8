//! Entry points for the fuzz targets (also run over seeds as tests).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::capsule::Message;
use crate::{LoadSpec, Now, Sandbox, SandboxConfig, StaticRoutes};

/// Bytes as a capsule-protocol message: what parses re-encodes to the same bytes.
pub fn capsule_parse(data: &[u8]) {
    if let Ok(Message::Capsule(c)) = Message::parse(data) {
        let mut out = Vec::new();
        if c.encode(&mut out).is_ok() {
            assert_eq!(out, data, "capsule re-encoding differs");
        }
    }
}

fn now() -> Now {
    Now { ms: 1_000, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

/// A sandbox rooted in the fuzzing administrator key, with small limits.
pub fn sandbox() -> Sandbox {
    let cfg = SandboxConfig { max_module: 64 * 1024, ..SandboxConfig::default() };
    let routes = Arc::new(StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: Default::default() });
    match Sandbox::new(anode_cred::fuzzing::issuer().public_key(), cfg, routes) {
        Ok(s) => s,
        Err(e) => panic!("sandbox: {e}"),
    }
}

/// Bytes as a module loaded under an administrative credential: loading
/// either succeeds or fails with a typed error; loaded entries are called;
/// the same bytes as a capsule message never panic.
pub fn module_load(sb: &mut Sandbox, data: &[u8]) {
    let cred = match anode_cred::fuzzing::issuer().admin(crate::PrincipalId([1; 32]), None) {
        Ok(c) => c,
        Err(e) => panic!("credential: {e}"),
    };
    let spec = LoadSpec {
        code: data,
        credential: Some(cred.to_bytes()),
        requester: None,
        local_name: None,
        limits: anode_cred::RequestedLimits { memory: Some(4 << 20), cpu: Some(100_000), state: Some(4096) },
    };
    let mut out = Vec::new();
    if let Ok(id) = sb.load(now(), &spec) {
        if let Some(info) = sb.module(id) {
            for e in info.entries {
                let _ = sb.invoke(now(), id, &e, b"fuzz", &mut out);
            }
        }
        sb.unload(id);
    }
    let _ = sb.handle_capsule(now(), Ipv4Addr::new(10, 0, 0, 2), data, &mut out);
}

/// Bytes as a pod loaded under an administrative credential: a typed error,
/// or a listed pod with at least one offer, which unloads; the same bytes
/// as an offer name, and the rollback check over them, never panic. Whether
/// it loaded.
pub fn pod_load(sb: &mut Sandbox, data: &[u8]) -> bool {
    let cred = match anode_cred::fuzzing::issuer().admin(crate::PrincipalId([1; 32]), None) {
        Ok(c) => c,
        Err(e) => panic!("credential: {e}"),
    };
    let spec = crate::PodSpec {
        code: data,
        credential: Some(cred.to_bytes()),
        requester: None,
        name: "fuzz",
        limits: anode_cred::RequestedLimits { memory: Some(4 << 20), cpu: Some(100_000), state: Some(4096) },
        clients: None,
        on_fault: crate::pods::OnFault::Reset,
        min_fuel: 0,
    };
    let loaded = sb.load_pod(now(), &spec);
    if let Ok(id) = loaded {
        let listed = sb.pods().into_iter().find(|p| p.id == id);
        assert!(listed.is_some_and(|p| !p.offers.is_empty()), "a loaded pod is listed with its offers");
        assert!(sb.unload_pod(id));
    }
    let _ = crate::pods::parse_offer(&String::from_utf8_lossy(data));
    let _ = crate::pods::rollback_check(data);
    loaded.is_ok()
}

/// Bytes as a channel's demultiplexing specification
/// (`net.open_channel_spec`): a typed refusal, or a spec that re-emits to
/// the same bytes and whose matching, sub-flow keys and FIFO never panic,
/// hold no more than its buffer, and give every byte back.
pub fn demux_spec(data: &[u8]) {
    use crate::demux::{DemuxSpec, DemuxTable, Route};
    let Ok(spec) = DemuxSpec::parse(data) else { return };
    let mut out = Vec::new();
    spec.emit(&mut out);
    assert_eq!(out, data, "demux spec re-encoding differs");
    let src = spec.source.map_or(Ipv4Addr::new(10, 0, 0, 2), |s| s.addr());
    let mut payload = spec.prefix.clone();
    payload.extend_from_slice(data);
    let route = Route::new(spec.clone(), crate::ModuleId(1), 1, 0);
    let mut held = Vec::new();
    for _ in 0..4 {
        let _ = route.subflow(src, &payload);
        if let Ok((c, _)) = route.admit(src, &payload) {
            held.push(c);
        }
    }
    let info = route.info();
    assert!(info.queued_bytes as usize <= spec.buffer_bytes(), "a FIFO over its buffer");
    drop(held);
    assert_eq!(route.info().queued_bytes, 0, "queued bytes not given back");
    let mut t = DemuxTable::new();
    t.insert(route);
    assert_eq!(t.lookup(spec.port, src, &payload).count(), usize::from(spec.matches(src, &payload)));
}
