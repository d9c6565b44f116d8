//! What `anode capture` costs the data path (issue 19), through the whole
//! sans-I/O node (`Node::handle_datagram_from`: ANEP, classification, the
//! SNAP VM or the plain path, the capture hooks), in one process, at a
//! middle node `b` forwarding `a`'s datagrams to `c`, security off:
//!
//! - **off**: no capture (the hooks are one branch each);
//! - **on**: a capture of both interfaces, drained after every 32
//!   datagrams (a receive batch) as the daemon does, the frames encoded;
//! - **full**: a capture whose queue is full (every copy dropped and
//!   counted): what a stalled client costs.
//!
//! Each case runs `REPS` times `N` datagrams, alternating; prints the
//! median ns per datagram. `cargo bench -p anode-node --bench capture`.

use anode_node::config::NodeConfig;
use anode_node::core::{CaptureConfig, CaptureStop, Node, Outbox, recv_buffer_len};
use std::net::SocketAddr;
use std::time::Instant;

const N: usize = 200_000;
const REPS: usize = 7;
const PING: &str = include_str!("../../../examples/snap/ping.s");

fn ep(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn node_b() -> Node {
    let cfg = format!(
        "address = \"10.0.0.2\"\n\
         [[interface]]\nname = \"west\"\nlisten = \"{}\"\nneighbors = [{{ address = \"10.0.0.1\", endpoint = \"{}\" }}]\n\
         [[interface]]\nname = \"east\"\nlisten = \"{}\"\nneighbors = [{{ address = \"10.0.0.3\", endpoint = \"{}\" }}]\n",
        ep(21_002),
        ep(21_001),
        ep(21_003),
        ep(21_004)
    );
    Node::new(&NodeConfig::from_toml(&cfg).expect("config"), None).expect("node")
}

fn snap_ping() -> Vec<u8> {
    let mut r = anode_snap::asm::assemble(PING).expect("ping.s");
    r.dst = std::net::Ipv4Addr::new(10, 0, 0, 3);
    r.resource_bound = 64;
    let p = r.to_bytes().expect("packet");
    let mut d = vec![0u8; anode_wire::anep::HEADER_LEN];
    anode_wire::anep::write_header(
        &mut d,
        anode_wire::anep::FLAG_DISCARD_UNKNOWN,
        anode_wire::anep::TYPE_SNAP,
        p.len(),
    );
    d.extend_from_slice(&p);
    d
}

fn plain(len: usize) -> Vec<u8> {
    let payload = len - anode_wire::anep::HEADER_LEN - anode_wire::plain::HEADER_LEN;
    let mut p = vec![0u8; anode_wire::plain::HEADER_LEN];
    p[0..4].copy_from_slice(&[10, 0, 0, 3]);
    p[4..8].copy_from_slice(&[10, 0, 0, 1]);
    p[8] = 64;
    p[10..12].copy_from_slice(&9u16.to_be_bytes());
    p.resize(p.len() + payload, 0x5a);
    let mut d = vec![0u8; anode_wire::anep::HEADER_LEN];
    anode_wire::anep::write_header(
        &mut d,
        anode_wire::anep::FLAG_DISCARD_UNKNOWN,
        anode_wire::anep::TYPE_PLAIN,
        p.len(),
    );
    d.extend_from_slice(&p);
    d
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Off,
    On,
    Full,
}

/// ns per datagram for `N` copies of `dgram` through `b`.
fn run(b: &mut Node, dgram: &[u8], case: Case) -> f64 {
    if case != Case::Off {
        let queue = if case == Case::Full { 1 } else { 4096 };
        let cfg = CaptureConfig {
            interfaces: vec![true, true],
            local: vec![ep(21_002), ep(21_003)],
            queue,
            queue_bytes: 16 << 20,
            unix_ms_at_zero: 1_800_000_000_000,
        };
        b.capture_start(cfg).expect("start");
        if case == Case::Full {
            // Fill it once: from now on every copy is dropped.
            let mut buf = vec![0u8; recv_buffer_len(1500).max(dgram.len())];
            buf[..dgram.len()].copy_from_slice(dgram);
            b.handle_datagram_from(0, Some(ep(21_001)), &mut buf, dgram.len(), 0, &mut Outbox::default());
        }
    }
    let mut buf = vec![0u8; recv_buffer_len(1500).max(dgram.len())];
    let mut out = Outbox::preallocated();
    let mut frames = Vec::with_capacity(1 << 20);
    let t = Instant::now();
    for i in 0..N {
        buf[..dgram.len()].copy_from_slice(dgram);
        out.clear();
        b.handle_datagram_from(0, Some(ep(21_001)), &mut buf, dgram.len(), 1, &mut out);
        std::hint::black_box(&out);
        if case == Case::On && i % 32 == 31 {
            frames.clear();
            b.capture_drain(usize::MAX, |p| {
                // What the daemon writes per datagram: a frame header and the bytes.
                frames.extend_from_slice(&(p.data.len() as u32).to_be_bytes());
                frames.extend_from_slice(&p.data);
                true
            });
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / N as f64;
    b.capture_stop(CaptureStop::ClientGone);
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    println!("| datagram | capture off | on (drained per 32) | on, queue full (drops) |");
    println!("|---|---:|---:|---:|");
    for (name, d) in [("SNAP ping (7 insns)", snap_ping()), ("plain 100 B", plain(100)), ("plain 1,400 B", plain(1400))]
    {
        let mut b = node_b();
        let mut res = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..REPS {
            for (k, c) in [Case::Off, Case::On, Case::Full].into_iter().enumerate() {
                res[k].push(run(&mut b, &d, c));
            }
        }
        let [off, on, full] = res.map(median);
        println!("| {name} | {off:.0} ns | {on:.0} ns | {full:.0} ns |");
        let k = b.capture_counters();
        assert!(k.drops > 0 && k.drained > 0, "{k:?}");
        assert!(b.counters.total_drops() == 0, "every datagram was forwarded: {:?}", b.counters.to_json());
    }
}
