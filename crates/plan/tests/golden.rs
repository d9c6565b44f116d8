//! Golden tests: PLAN source → expected assembler → expected outcome on the
//! in-process simulator. `ANODE_BLESS=1` rewrites the expected files.
#![allow(clippy::unwrap_used)]

use anode_node::config::Topology;
use anode_plan::{Options, compile, outcome_text};
use anode_snap::sim::Network;
use anode_snap::vm::VmConfig;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn network(topo: &str) -> Network {
    if let Some(n) = topo.strip_prefix("line") {
        return Network::line(n.parse().unwrap(), VmConfig::default());
    }
    let text = std::fs::read_to_string(root().join("examples/topologies").join(format!("{topo}.toml"))).unwrap();
    let t = Topology::from_toml(&text).unwrap();
    let addrs: Vec<Ipv4Addr> = t.nodes.iter().map(|n| n.address).collect();
    let by = |n: &str| t.nodes.iter().find(|x| x.name == n).unwrap().address;
    let links: Vec<_> = t.links.iter().map(|l| (by(&l.a), by(&l.b))).collect();
    Network::new(&addrs, &links, VmConfig::default())
}

fn check_golden(path: &Path, actual: &str) {
    if std::env::var_os("ANODE_BLESS").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with ANODE_BLESS=1 to create it)", path.display()));
    assert_eq!(expected, actual, "{} differs (ANODE_BLESS=1 regenerates it)", path.display());
}

/// Compiles `file`, checks the assembler against `NAME.s`, runs it `runs`
/// times on `topo` (the same network, so soft state carries over) and
/// checks the outcome against `NAME.out`. Returns the outcome.
fn golden(file: &Path, topo: &str, runs: usize) -> String {
    let name = file.file_stem().unwrap().to_str().unwrap();
    let src = std::fs::read_to_string(file).unwrap();
    let c = compile(&format!("{name}.plan"), &src, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    anode_plan::structural_check(&c.packet, &c.chunk_starts).unwrap();
    // The assembler text is what `anode snap asm` accepts: it reassembles
    // to the same packet.
    assert_eq!(anode_snap::asm::assemble(&c.asm).unwrap().to_bytes().unwrap(), c.bytes);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    check_golden(&dir.join(format!("{name}.s")), &c.asm);
    let mut net = network(topo);
    let mut out = format!("; {topo}, {} bytes\n", c.bytes.len());
    for i in 0..runs {
        if runs > 1 {
            out.push_str(&format!("; run {}\n", i + 1));
        }
        out.push_str(&outcome_text(&net.inject(c.packet.src, &c.bytes, false)));
    }
    check_golden(&dir.join(format!("{name}.out")), &out);
    out
}

fn example(name: &str) -> PathBuf {
    root().join("examples/plan").join(format!("{name}.plan"))
}

#[test]
fn ping() {
    let out = golden(&example("ping"), "line3", 1);
    assert!(out.contains("delivered at 10.0.0.1 on port 7: \"ping\""), "{out}");
}

/// The compiled ping behaves as the hand-written one of Fig. 1: the same
/// delivery at the same node, the same number of link transmissions.
#[test]
fn compiled_ping_behaves_like_fig1() {
    let src = std::fs::read_to_string(example("ping")).unwrap();
    let c = compile("ping.plan", &src, &Options::default()).unwrap();
    let hand =
        anode_snap::asm::assemble(&std::fs::read_to_string(root().join("examples/snap/ping.s")).unwrap()).unwrap();
    for n in 2..=6u8 {
        let dst = Ipv4Addr::new(10, 0, 0, n);
        let c = compile("ping.plan", &src, &Options { dst: Some(dst), ..Options::default() }).unwrap();
        let mut h = hand.clone();
        h.dst = dst;
        let a = network("line6").inject(c.packet.src, &c.bytes, false);
        let b = network("line6").inject(h.src, &h.to_bytes().unwrap(), false);
        assert_eq!(a.deliveries, b.deliveries, "to {dst}");
        assert_eq!(a.transmissions, b.transmissions, "to {dst}");
        assert_eq!(a.transmissions, 2 * (u32::from(n) - 1));
    }
    assert_eq!(c.bytes.len(), 88);
}

#[test]
fn traceroute() {
    let out = golden(&example("traceroute"), "line4", 1);
    // (10.0.0.k+1, k) for k = 1, 2, 3: tag 3 (addr), then tag 0 (int).
    for k in 1..=3 {
        let want = format!("0300040a0000{:02x}000004{k:08x}", k + 1);
        assert!(out.contains(&want), "hop {k}: {out}");
    }
}

#[test]
fn multicast() {
    let out = golden(&example("multicast"), "star5", 1);
    for n in 2..=5 {
        assert!(out.contains(&format!("delivered at 10.0.0.{n} on port 7000: \"hello, group\"")), "{out}");
    }
}

#[test]
fn flowroute_takes_the_pinned_path() {
    let out = golden(&example("flowroute"), "ring5", 1);
    assert!(out.contains("delivered at 10.0.0.3 on port 7001: \"pinned\""), "{out}");
    // The data packet leaves 10.0.0.1 for 10.0.0.5, not the shortest way.
    assert!(out.contains("10.0.0.1: forwarded after 14 instructions; forward to 10.0.0.5 via 10.0.0.5"), "{out}");
}

#[test]
fn cache_answers_from_the_router_the_second_time() {
    let out = golden(&example("cache"), "line4", 2);
    let (first, second) = out.split_once("; run 2").unwrap();
    // (144, 10.0.0.4) then (144, 10.0.0.2).
    assert!(first.contains("on port 7002: 0000040000009003000") && first.contains("0a000004"), "{first}");
    assert!(second.contains("0a000002"), "{second}");
}

#[test]
fn census() {
    let out = golden(&example("census"), "ring5", 1);
    // 5 hosts, 10 link ends, best degree 2 first found at 10.0.0.1.
    assert!(out.contains("on port 7003: 000004000000050000040000000a000004000000020300040a000001"), "{out}");
}

#[test]
fn foldr_sum() {
    let out = golden(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/foldr_sum.plan"), "line2", 1);
    // foldr: ((0*10+3)*10+2)*10+1... over 4::[1,2,3]: 3214; foldl: 4123; 2*(0.5+10) = 21.
    let t = |v: i32| format!("000004{:08x}", v);
    assert!(out.contains(&format!("{}{}{}", t(3214), t(4123), t(21))), "{out}");
}

#[test]
fn fold_overflow_aborts_without_effect() {
    let out = golden(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/fold_overflow.plan"), "star5", 1);
    assert!(out.contains("fault service_failed") && out.contains("foldl[2] overflow at 7:42"), "{out}");
    assert!(out.contains("0 link transmissions") && !out.contains("delivered"), "{out}");
}

#[test]
fn logic() {
    let out = golden(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/logic.plan"), "line3", 1);
    // classify 5, 12, ~3, 7 = 3, 1, 2, 2; then true.
    let t = |v: i32| format!("000004{:08x}", v);
    assert!(out.contains(&format!("{}{}{}{}0100010", t(3), t(1), t(2), t(2))), "{out}");
}

/// Without optimisation the same programs still run the same way.
#[test]
fn unoptimised_code_behaves_the_same() {
    for (name, topo) in [("ping", "line3"), ("traceroute", "line4"), ("multicast", "star5"), ("flowroute", "ring5")] {
        let src = std::fs::read_to_string(example(name)).unwrap();
        let a = compile(name, &src, &Options::default()).unwrap();
        let b = compile(name, &src, &Options { optimize: false, ..Options::default() }).unwrap();
        assert!(b.bytes.len() > a.bytes.len(), "{name}: optimisation saves space");
        anode_plan::structural_check(&b.packet, &b.chunk_starts).unwrap();
        let ra = network(topo).inject(a.packet.src, &a.bytes, false);
        let rb = network(topo).inject(b.packet.src, &b.bytes, false);
        assert_eq!(ra.deliveries, rb.deliveries, "{name}");
    }
}
