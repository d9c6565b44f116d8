//! The paper's ping (Fig. 1) traced through source → router → destination →
//! back, in memory.
use anode_snap::ops::{Insn, Op};
use anode_snap::sim::Network;
use anode_snap::value::{Tag, Value, header};
use anode_snap::vm::{End, SendKind, VmConfig};
use anode_snap::wire::Repr;
use std::net::Ipv4Addr;

fn ping(src: Ipv4Addr, dst: Ipv4Addr, rb: u16) -> Vec<u8> {
    let i = |op, v| Insn::new(op, v).expect("imm").encode();
    Repr {
        little_endian: false,
        entry: 0,
        resource_bound: rb,
        port: 7,
        src,
        dst,
        code: vec![
            i(Op::Forw, 0),
            i(Op::Bne, 5),
            i(Op::Push, 1),
            i(Op::GetSrc, 0),
            i(Op::ForwTo, 0),
            i(Op::Pop, 0),
            i(Op::Demux, 0),
        ],
        heap: vec![header(Tag::Blob, 4), u32::from_be_bytes(*b"ping")],
        stack: vec![Value::heap(Tag::Blob, 0).0, Value::int(7).0, Value::int(0).0],
    }
    .to_bytes()
    .expect("emit")
}

fn a(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

#[test]
fn ping_over_two_hops_and_back() {
    let mut net = Network::line(3, VmConfig::default());
    let r = net.inject(a(1), &ping(a(1), a(3), 16), true);
    let path: Vec<_> = r.hops.iter().map(|h| (h.node, h.end)).collect();
    assert_eq!(
        path,
        vec![
            (a(1), End::Forwarded),
            (a(2), End::Forwarded),
            (a(3), End::Forwarded),
            (a(2), End::Forwarded),
            (a(1), End::Delivered),
        ]
    );
    // Forwarding hops run one instruction; the destination runs forw bne push getsrc forwto.
    let executed: Vec<_> = r.hops.iter().map(|h| h.executed).collect();
    assert_eq!(executed, vec![1, 1, 5, 1, 3]);
    assert_eq!(r.deliveries.len(), 1);
    assert_eq!(r.deliveries[0].node, a(1));
    assert_eq!(r.deliveries[0].port, 7);
    assert_eq!(r.deliveries[0].payload, b"ping");
    // Resource bound: decremented once per hop.
    let rbs: Vec<_> = r.hops.iter().map(|h| h.rb_in).collect();
    assert_eq!(rbs, vec![16, 15, 14, 13, 12]);
    assert_eq!(r.transmissions, 4);
    assert!(r.hops.iter().all(|h| h.sends.iter().all(|s| s.2 == SendKind::Forward)));
    for h in &r.hops {
        eprintln!("{}:", h.node);
        for l in &h.trace {
            eprintln!("  {l}");
        }
    }
}

#[test]
fn ping_self_zero_hops() {
    let mut net = Network::line(1, VmConfig::default());
    let r = net.inject(a(1), &ping(a(1), a(1), 4), false);
    assert_eq!(r.hops.len(), 1);
    assert_eq!(r.hops[0].end, End::Delivered);
    assert_eq!(r.deliveries[0].payload, b"ping");
}

#[test]
fn resource_bound_runs_out_mid_path() {
    let mut net = Network::line(4, VmConfig::default());
    let r = net.inject(a(1), &ping(a(1), a(4), 2), false);
    let ends: Vec<_> = r.hops.iter().map(|h| h.end).collect();
    assert!(matches!(ends.last(), Some(End::Fault { fault: anode_snap::Fault::ResourceBoundExhausted, .. })));
    assert!(r.deliveries.is_empty());
    assert!(r.transmissions <= 2);
}
