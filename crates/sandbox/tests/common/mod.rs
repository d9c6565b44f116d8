//! Shared test setup: example modules, keys, credentials, a line of nodes.
#![allow(dead_code, clippy::unwrap_used)]

pub mod heap;
pub mod tc;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anode_cred::{
    Credential, GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, PrincipalId, SigningKey,
};
use anode_sandbox::{Action, Now, Sandbox, SandboxConfig, StaticRoutes};

/// Where `scripts/setup` puts the example modules built from `modules/`.
pub fn modules_dir() -> PathBuf {
    match std::env::var_os("ANODE_MODULES_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../modules/out"),
    }
}

/// An example module's binary; a clear failure if it was not built.
pub fn module(name: &str) -> Vec<u8> {
    let p = modules_dir().join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!("cannot read example module {}: {e}. Build the modules first: scripts/setup", p.display())
    })
}

pub fn wat(src: &str) -> Vec<u8> {
    wat::parse_str(src).unwrap()
}

pub fn issuer() -> Issuer {
    Issuer::from_secret(&[1; 32]).unwrap()
}

pub fn user_key() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}

pub fn user() -> PrincipalId {
    PrincipalId::of(&user_key())
}

pub fn now(ms: u64) -> Now {
    Now { ms, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(ms) }
}

pub fn admin(p: PrincipalId) -> Credential {
    issuer().admin(p, None).unwrap()
}

pub fn limits() -> Limits {
    Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 }
}

/// An ordinary credential for `p` granting `modules` and `ifaces`.
pub fn ordinary(p: PrincipalId, modules: Vec<ModuleGrant>, ifaces: &[Interface]) -> Credential {
    let spec = GrantSpec { modules, interfaces: InterfaceSet::of(ifaces), limits: limits(), expires: None };
    issuer().issue(p, &spec).unwrap()
}

pub fn addr(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

/// A node `n` in a line 1 - 2 - ... - len.
pub fn line_routes(n: u8, len: u8) -> StaticRoutes {
    let mut table = HashMap::new();
    for d in 1..=len {
        if d != n {
            table.insert(addr(d), addr(if d > n { n + 1 } else { n - 1 }));
        }
    }
    StaticRoutes { this: addr(n), table }
}

pub fn sandbox_with(cfg: SandboxConfig, routes: StaticRoutes) -> Sandbox {
    Sandbox::new(issuer().public_key(), cfg, Arc::new(routes)).unwrap()
}

pub fn sandbox() -> Sandbox {
    sandbox_with(SandboxConfig::default(), line_routes(1, 1))
}

/// Runs capsule messages between the sandboxes of a line until quiet.
/// Returns local deliveries per node (1-based index) and the number of
/// capsule-protocol messages exchanged.
pub fn run_line(nodes: &mut [Sandbox], first: Vec<(u8, u8, Vec<u8>)>, t: u64) -> (Vec<(u8, u16, Vec<u8>)>, usize) {
    let mut queue: std::collections::VecDeque<(u8, u8, Vec<u8>)> = first.into();
    let mut delivered = Vec::new();
    let mut msgs = 0;
    while let Some((from, to, bytes)) = queue.pop_front() {
        msgs += 1;
        assert!(msgs < 1000, "capsules loop");
        let mut out = Vec::new();
        let r = nodes[to as usize - 1].handle_capsule(now(t), addr(from), &bytes, &mut out);
        assert!(r.is_ok(), "node {to}: {r:?}");
        for a in out {
            match a {
                Action::SendCapsule { to: next, bytes, .. } => queue.push_back((to, next.octets()[3], bytes)),
                Action::DeliverLocal { port, payload, .. } => delivered.push((to, port, payload)),
                other => panic!("unexpected action {other:?}"),
            }
        }
    }
    (delivered, msgs)
}
