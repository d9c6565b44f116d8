//! Active ping latency (issue 7), side by side in one run over a line of
//! four real daemons (`anode testbed`, encrypted links, switchlets on):
//! SNAP ping (Fig. 1), capsule ping with the code carried on every hop, and
//! capsule ping by hash with warm caches, to 1, 2 and 3 hops.
//!
//! `cargo bench -p anode --bench capsule` (needs `scripts/setup` for the
//! ping module); `ANODE_BENCH_PINGS` pings per case (default 300);
//! `ANODE_BENCH_QUICK=1` for a smoke run. Results: docs/benchmarks.md.

#![allow(clippy::needless_range_loop)] // rtt[kind][hops] reads best with indices

use anode_cred::{GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
use anode_daemon::client::Client;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const ANODE: &str = env!("CARGO_BIN_EXE_anode");
const PING_S: &str = include_str!("../../../examples/snap/ping.s");
const LINE4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/topologies/line4.toml");
const PORT: u16 = 50_011;

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn snap_ping(dst: Ipv4Addr) -> Vec<u8> {
    let mut text: String =
        PING_S.lines().filter(|l| !l.trim_start().starts_with(".stack")).flat_map(|l| [l, "\n"]).collect();
    text.push_str(&format!(".stack 0, {PORT}, blob 0x00000000\n"));
    let mut r = anode_snap::asm::assemble(&text).expect("ping");
    r.src = Ipv4Addr::new(10, 0, 0, 1);
    r.dst = dst;
    r.resource_bound = 16;
    r.port = PORT;
    r.to_bytes().expect("ping bytes")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let quick = std::env::var("ANODE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
        || !std::env::args().any(|a| a == "--bench");
    let pings: usize =
        if quick { 10 } else { std::env::var("ANODE_BENCH_PINGS").ok().and_then(|v| v.parse().ok()).unwrap_or(300) };
    let dir = std::env::temp_dir().join(format!("anode-bench-caps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = Command::new(ANODE).args(["testbed", "up", LINE4, "--dir"]).arg(&dir).output().expect("testbed");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let code = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/ping.wasm"))
        .expect("modules/out/ping.wasm (run scripts/setup)");
    let admin = anode_sec::Identity::load(&dir.join("keys/admin.key")).expect("admin key");
    let issuer = Issuer::from_secret(&admin.secret_seed()).expect("issuer");
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
        interfaces: InterfaceSet::of(&[Interface::Route, Interface::Net, Interface::Time]),
        limits: Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 },
        expires: None,
    };
    let cred = issuer.issue(PrincipalId([1; 32]), &spec).expect("credential").to_bytes().to_vec();
    let mut c = Client::connect(dir.join("a")).expect("client");
    c.register(PORT).expect("register");
    let kinds = ["SNAP ping", "capsule, code carried", "capsule by hash, warm"];
    let mut rtt = vec![vec![Vec::new(); 3]; 3];
    let mut lost = [0usize; 3];
    let once = |c: &mut Client, k: usize, dst: Ipv4Addr| -> Option<f64> {
        let t = Instant::now();
        if k == 0 {
            c.inject(&snap_ping(dst)).ok()?;
        } else {
            let mut b = Vec::new();
            anode_sandbox::ping::capsule(&code, &cred, Ipv4Addr::new(10, 0, 0, 1), dst, 0, PORT, k == 1, &mut b)
                .ok()?;
            c.capsule(&b).ok()?;
        }
        loop {
            match c.recv(Duration::from_secs(2)) {
                Ok(Some((p, _))) if p == PORT => return Some(t.elapsed().as_secs_f64() * 1e6),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    };
    // Warm every cache (and every code fetch) first.
    for h in 1..=3u8 {
        for k in 0..3 {
            let _ = once(&mut c, k, Ipv4Addr::new(10, 0, 0, 1 + h));
        }
    }
    for i in 0..pings {
        for h in 0..3usize {
            for j in 0..3 {
                let k = (i + j) % 3;
                match once(&mut c, k, Ipv4Addr::new(10, 0, 0, 2 + h as u8)) {
                    Some(us) => rtt[k][h].push(us),
                    None => lost[k] += 1,
                }
            }
        }
    }
    let mut r = format!("# Active ping RTT, line4 testbed, encrypted links ({pings} pings per case)\n\n");
    let _ = writeln!(r, "| hops | {} µs | {} µs | {} µs |", kinds[0], kinds[1], kinds[2]);
    let _ = writeln!(r, "|---:|---:|---:|---:|");
    for h in 0..3 {
        let m: Vec<f64> = (0..3).map(|k| median(&mut rtt[k][h])).collect();
        let _ = writeln!(r, "| {} | {:.1} | {:.1} | {:.1} |", h + 1, m[0], m[1], m[2]);
    }
    let _ = writeln!(r, "\nlost: {lost:?}");
    println!("{r}");
    let _ = Command::new(ANODE).args(["testbed", "down", "--dir"]).arg(&dir).output();
    let _ = std::fs::remove_dir_all(&dir);
}
