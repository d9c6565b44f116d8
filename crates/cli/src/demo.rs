//! `anode demo`: SNAP active packets on a simulated line of nodes.
//!
//! Until the node daemon exists this is the project's main job: it assembles
//! the paper's programs, runs them hop by hop through the real VM on an
//! in-memory network, and prints what every node did.

use crate::{describe_end, print_report, show_payload};
use anode_snap::asm;
use anode_snap::bound::bounds;
use anode_snap::sim::Network;
use anode_snap::vm::{End, VmConfig};
use anode_snap::wire::Repr;
use anyhow::{Result, anyhow, bail};
use std::net::Ipv4Addr;

const PING: &str = include_str!("../../../examples/snap/ping.s");
const PING_COMPILED: &str = include_str!("../../../examples/snap/ping_compiled.s");
const TRACEROUTE: &str = include_str!("../../../examples/snap/traceroute.s");
const BAD_BACKWARD: &str = include_str!("../../../examples/snap/bad_backward.s");
const BAD_SENDS: &str = include_str!("../../../examples/snap/bad_sends.s");

fn addr(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i)
}

fn program(name: &str, src: &str, dst: Ipv4Addr, rb: Option<u16>) -> Result<Repr> {
    let mut r = asm::assemble(src).map_err(|e| anyhow!("{name}:{e}"))?;
    r.dst = dst;
    if let Some(rb) = rb {
        r.resource_bound = rb;
    }
    Ok(r)
}

fn section(title: &str) {
    println!();
    println!("== {title}");
}

/// Runs the demonstration; fails (exit 1) if any expected result is missing,
/// so the README command doubles as a smoke test.
pub fn run(n: u8, quiet: bool) -> Result<std::process::ExitCode> {
    if !(2..=8).contains(&n) {
        bail!("--nodes must be between 2 and 8");
    }
    let cfg = VmConfig::default();
    let mut net = Network::line(n, cfg);
    let first = addr(1);
    let last = addr(n);
    let path: Vec<String> = (1..=n).map(|i| addr(i).to_string()).collect();
    println!("anode demo: SNAP active packets on a simulated line of {n} nodes (MTU {} bytes)", cfg.mtu);
    println!("  {}", path.join(" -- "));
    println!("  every hop runs the real VM; end nodes have 1 interface, middle nodes 2");

    // 1. Fig. 1 ping.
    section(&format!("ping (SNAP Fig. 1) from {first} to {last}"));
    let ping = program("ping.s", PING, last, None)?;
    let bytes = ping.to_bytes()?;
    println!("program: {} instructions, {}-byte packet; bounds at a 2-interface node:", ping.code.len(), bytes.len());
    for line in bounds(&bytes, 2, cfg.mtu)?.to_string().lines() {
        println!("    {line}");
    }
    let r = net.inject(first, &bytes, !quiet);
    print_report(&r, !quiet);
    let ok = r.deliveries.len() == 1 && r.deliveries[0].node == first && r.deliveries[0].payload == b"ping";
    println!(
        "result: {} after {} transmissions; resource bound {} -> {}",
        if ok { "reply delivered at the source" } else { "NO REPLY" },
        r.transmissions,
        ping.resource_bound,
        r.hops.last().map_or(0, |h| h.rb_in.saturating_sub(1))
    );
    if !ok {
        bail!("ping did not come back");
    }

    // 2. Fig. 2 compiled ping.
    section(&format!("compiled ping (SNAP Fig. 2, as PLAN compiles it) from {first} to {last}"));
    let cping = program("ping_compiled.s", PING_COMPILED, last, None)?;
    let cbytes = cping.to_bytes()?;
    println!(
        "program: {} instructions, {}-byte packet (hand-written ping: {} bytes)",
        cping.code.len(),
        cbytes.len(),
        bytes.len()
    );
    let r = net.inject(first, &cbytes, false);
    print_report(&r, false);
    if r.deliveries.len() != 1 || r.deliveries[0].node != first {
        bail!("compiled ping did not come back");
    }

    // 3. Traceroute.
    section(&format!("traceroute from {first} to {last}: one report per hop, sent with `send`"));
    let tr = program("traceroute.s", TRACEROUTE, last, None)?;
    let r = net.inject(first, &tr.to_bytes()?, false);
    print_report(&r, false);
    println!("hops reported to {first}:");
    for d in &r.deliveries {
        match decode_report(&d.payload) {
            Some((a, k)) => println!("  {k:2}  {a}"),
            None => println!("  ??  {}", show_payload(&d.payload)),
        }
    }
    if r.deliveries.len() != (n - 1) as usize {
        bail!("traceroute reported {} hops, expected {}", r.deliveries.len(), n - 1);
    }

    // 4. Hostile packets.
    section("hostile packets: each ends with a typed fault and no effect on the network");
    let cases = [
        ("backward paj", program("bad_backward.s", BAD_BACKWARD, first, None)?),
        ("3 sends on a 1-interface node", program("bad_sends.s", BAD_SENDS, last, None)?),
        ("ping with resource bound 2 over the whole line", program("ping.s", PING, last, Some(2))?),
    ];
    for (what, p) in cases {
        let r = net.inject(first, &p.to_bytes()?, false);
        let last_hop = r.hops.last().ok_or_else(|| anyhow!("no execution"))?;
        println!(
            "  {what:<48} -> {} at {} ({} transmissions, {} deliveries)",
            describe_end(&last_hop.end),
            last_hop.node,
            r.transmissions,
            r.deliveries.len()
        );
        if !matches!(last_hop.end, End::Fault { .. }) {
            bail!("{what}: expected a fault");
        }
    }
    println!();
    println!("demo complete");
    Ok(std::process::ExitCode::SUCCESS)
}

/// Decodes a traceroute report: the delivered tuple (address, hops) in the
/// tag-length-value encoding `demux` uses for tuples.
fn decode_report(p: &[u8]) -> Option<(Ipv4Addr, i32)> {
    // [tag 3][len 0 4][a b c d][tag 0][len 0 4][i32 BE]
    if p.len() != 14 || p[0] != 3 || p[1..3] != [0, 4] || p[7] != 0 || p[8..10] != [0, 4] {
        return None;
    }
    let a = Ipv4Addr::new(p[3], p[4], p[5], p[6]);
    let k = i32::from_be_bytes([p[10], p[11], p[12], p[13]]);
    Some((a, k))
}
