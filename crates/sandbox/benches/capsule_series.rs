//! 10,000 consecutive capsule loads, timed per batch of 1,000, to show the
//! cost does not grow (the paper's grew with the Caml symbol table, SANE
//! §V-E.2). Two series: the same code carried every time (cache hit after the
//! first), and distinct code every time (parse, credential, compile,
//! instantiate on every capsule, with LRU eviction and capsule-store
//! recycling keeping memory bounded). Needs `scripts/setup`.
//!
//!     cargo bench -p anode-sandbox --bench capsule_series
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anode_cred::{Issuer, ModuleHash, PrincipalId};
use anode_sandbox::capsule::Capsule;
use anode_sandbox::{Now, Sandbox, SandboxConfig, StaticRoutes};

fn now() -> Now {
    Now { ms: 1, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) }
}

fn variant(n: u32) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
            (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 0) "run")
            (table (export "__indirect_function_table") 2 funcref)
            (elem (i32.const 1) $run)
            (func $run (param i32 i32) (result i32) (i32.const {n}))
            (func (export "anode_init") (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 1)))))"#
    ))
    .unwrap()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("capsule_series: bench");
        return;
    }
    let quick = std::env::args().any(|a| a == "--test");
    let (batches, per) = if quick { (2, 10) } else { (10, 1000) };
    let issuer = Issuer::from_secret(&[1; 32]).unwrap();
    let cred = issuer.admin(PrincipalId([3; 32]), None).unwrap();
    let routes = Arc::new(StaticRoutes { this: Ipv4Addr::new(10, 0, 0, 1), table: HashMap::new() });
    let from = Ipv4Addr::new(10, 0, 0, 2);
    for distinct in [false, true] {
        let cache_mb: usize = std::env::var("ANODE_SERIES_CACHE_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
        let cfg = SandboxConfig { cache_bytes: cache_mb << 20, ..SandboxConfig::default() };
        let mut sb = Sandbox::new(issuer.public_key(), cfg, routes.clone()).unwrap();
        let same = variant(0);
        let mut out = Vec::new();
        let mut bytes = Vec::new();
        println!(
            "series: {} ({} capsules)",
            if distinct { "distinct code every capsule (cold)" } else { "same code carried (warm)" },
            batches * per
        );
        println!("  batch   mean µs/capsule   cache entries   capsule-store recycles");
        for b in 0..batches {
            let codes: Vec<Vec<u8>> =
                (0..per).map(|i| if distinct { variant((b * per + i) as u32 + 1) } else { same.clone() }).collect();
            let start = Instant::now();
            for code in &codes {
                Capsule {
                    entry: "run",
                    credential: cred.to_bytes(),
                    data: b"",
                    code: Some(code),
                    hash: ModuleHash::of(code),
                }
                .encode(&mut bytes)
                .unwrap();
                sb.handle_capsule(now(), from, &bytes, &mut out).unwrap();
                out.clear();
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / per as f64;
            println!(
                "  {:>5}   {:>15.1}   {:>13}   {:>22}",
                b + 1,
                us,
                sb.cache_stats().entries,
                sb.counters().capsule_store_recycles
            );
        }
    }
}
