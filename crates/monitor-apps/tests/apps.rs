//! The applications on views written as the host writes them.
#![allow(clippy::unwrap_used)]

use anode_monitor_apps::abi::{Element, Field, HEADER_LEN, Record, View, ViewWriter, be_uint, tcp_flags};
use anode_monitor_apps::codered::{CodeRed, LITERAL};
use anode_monitor_apps::rtt::Rtt;
use anode_monitor_apps::trajectory::Trajectory;
use anode_monitor_apps::{App, Sink};

#[derive(Default)]
struct Collect {
    records: Vec<Vec<u8>>,
    samples: usize,
}
impl Sink for Collect {
    fn record(&mut self, rec: &[u8]) {
        Record::parse(rec).unwrap();
        self.records.push(rec.to_vec());
    }
    fn sample(&mut self) {
        self.samples += 1;
    }
}

fn value(rec: &[u8], e: Element) -> Option<u64> {
    Record::parse(rec).unwrap().items().find(|(x, _)| *x == e).map(|(_, v)| be_uint(v))
}

struct Pkt<'a> {
    ts: u64,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    seq: u32,
    flags: u8,
    ttl: u8,
    payload: &'a [u8],
}

fn tcp(ts: u64, fwd: bool, seq: u32, flags: u8, payload: &[u8]) -> Pkt<'_> {
    let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
    let (src, dst, sport, dport) = if fwd { (a, b, 40000, 80) } else { (b, a, 80, 40000) };
    Pkt { ts, src, dst, sport, dport, seq, flags, ttl: 64, payload }
}

fn view(p: &Pkt<'_>, buf: &mut Vec<u8>) -> usize {
    buf.clear();
    buf.resize(HEADER_LEN + 2048, 0);
    let mut w = ViewWriter::new(buf).unwrap();
    w.set(Field::Ts, p.ts);
    w.set(Field::IpVersion, 4);
    w.set(Field::Proto, 6);
    w.set(Field::Ttl, u64::from(p.ttl));
    w.set(Field::IpLen, 40 + p.payload.len() as u64);
    w.set_bytes(Field::Src, &p.src);
    w.set_bytes(Field::Dst, &p.dst);
    w.set(Field::Sport, u64::from(p.sport));
    w.set(Field::Dport, u64::from(p.dport));
    w.set(Field::TcpSeq, u64::from(p.seq));
    w.set(Field::TcpFlags, u64::from(p.flags));
    w.finish(p.payload, usize::MAX).unwrap()
}

fn run(app: &mut dyn App, pkts: &[Pkt<'_>]) -> Collect {
    let mut c = Collect::default();
    let mut buf = Vec::new();
    for p in pkts {
        let n = view(p, &mut buf);
        app.packet(&View::new(&buf[..n]).unwrap(), &mut c);
    }
    c
}

#[test]
fn rtt_is_ack_time_minus_syn_time_in_the_syn_direction() {
    let mut app = Rtt::new(30_000_000_000);
    let c = run(
        &mut app,
        &[
            tcp(1_000, true, 999, tcp_flags::SYN, b""),
            tcp(5_000, false, 7, tcp_flags::SYN | tcp_flags::ACK, b""),
            tcp(9_500, true, 1000, tcp_flags::ACK, b""),
            tcp(9_600, true, 1000, tcp_flags::ACK | tcp_flags::PSH, b"x"),
        ],
    );
    assert_eq!(c.records.len(), 1);
    assert_eq!(value(&c.records[0], Element::RttNs), Some(8_500));
    assert_eq!(value(&c.records[0], Element::Sport), Some(40000));
}

#[test]
fn rtt_retransmitted_syn_yields_no_sample_and_old_syns_age_out() {
    let mut app = Rtt::new(1_000_000);
    let c = run(
        &mut app,
        &[
            tcp(0, true, 1, tcp_flags::SYN, b""),
            tcp(10, true, 1, tcp_flags::SYN, b""),
            tcp(20, true, 2, tcp_flags::ACK, b""),
            tcp(100, true, 50, tcp_flags::SYN, b""),
            tcp(100 + 2_000_000, true, 51, tcp_flags::ACK, b""),
        ],
    );
    assert!(c.records.is_empty());
    assert_eq!(app.counters.retransmitted, 1);
    assert_eq!(app.counters.ambiguous, 1);
    // A full sweep (SLOTS / SWEEP ticks) drops the SYN that never got its ACK.
    for _ in 0..anode_monitor_apps::rtt::SLOTS / anode_monitor_apps::rtt::SWEEP {
        app.tick(10_000_000_000, &mut Collect::default());
    }
    assert_eq!(app.counters.expired, 1);
}

#[test]
fn rtt_table_stays_bounded_under_a_syn_flood() {
    let mut app = Rtt::new(30_000_000_000);
    let mut c = Collect::default();
    let mut buf = Vec::new();
    for i in 0..100_000u32 {
        let mut p = tcp(u64::from(i), true, i.wrapping_mul(7919), tcp_flags::SYN, b"");
        p.sport = (i % 60000) as u16;
        let n = view(&p, &mut buf);
        app.packet(&View::new(&buf[..n]).unwrap(), &mut c);
    }
    assert_eq!(app.counters.syns, 100_000);
    assert!(app.counters.evicted >= 100_000 - 4096);
}

fn worm_request(pad: u8) -> Vec<u8> {
    let mut r = LITERAL.to_vec();
    r.extend(std::iter::repeat_n(pad, 224));
    r.extend_from_slice(b"%u9090%u6858%ucbd3%u7801%u9090 HTTP/1.0\r\nContent-type: text/xml\r\n\r\n");
    r
}

#[test]
fn code_red_is_found_across_segments_in_any_order() {
    let req = worm_request(b'N');
    let isn = 4_000_000_000u32; // the stream wraps the sequence space
    for cuts in [vec![1usize], vec![5, 17, 18, 100, 240], vec![3; 30]] {
        // Segments at the cut points, delivered in reverse order.
        let mut segs = Vec::new();
        let mut start = 0;
        let mut points: Vec<usize> = cuts
            .iter()
            .scan(0, |a, c| {
                *a += c;
                Some(*a)
            })
            .filter(|&p| p < req.len())
            .collect();
        points.push(req.len());
        for p in points {
            segs.push((start, &req[start..p]));
            start = p;
        }
        let mut pkts = vec![tcp(0, true, isn.wrapping_sub(1), tcp_flags::SYN, b"")];
        for (i, (off, s)) in segs.iter().rev().enumerate() {
            pkts.push(tcp(1 + i as u64, true, isn.wrapping_add(*off as u32), tcp_flags::ACK | tcp_flags::PSH, s));
        }
        // A duplicate of the first segment changes nothing.
        pkts.push(tcp(100, true, isn, tcp_flags::ACK, segs[0].1));
        let c = run(&mut CodeRed::new(), &pkts);
        assert_eq!(c.records.len(), 1, "cuts {cuts:?}");
        assert_eq!(value(&c.records[0], Element::Variant), Some(u64::from(b'N')));
        assert_eq!(value(&c.records[0], Element::Dport), Some(80));
    }
}

#[test]
fn code_red_ii_and_no_false_positive_on_normal_requests() {
    let c = run(&mut CodeRed::new(), &[tcp(0, true, 1, tcp_flags::ACK, &worm_request(b'X'))]);
    assert_eq!(value(&c.records[0], Element::Variant), Some(u64::from(b'X')));
    let mut short = LITERAL.to_vec();
    short.extend(std::iter::repeat_n(b'N', 150));
    short.extend_from_slice(b"&q=1 HTTP/1.0\r\n\r\n");
    for p in [&b"GET /default.ida HTTP/1.0\r\n\r\n"[..], &short, b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n"] {
        assert!(run(&mut CodeRed::new(), &[tcp(0, true, 1, tcp_flags::ACK, p)]).records.is_empty());
    }
}

#[test]
fn code_red_missing_segment_means_no_detection() {
    let req = worm_request(b'N');
    let c = run(
        &mut CodeRed::new(),
        &[
            tcp(0, true, 0, tcp_flags::SYN, b""),
            tcp(1, true, 1, tcp_flags::ACK, &req[..10]),
            tcp(2, true, 21, tcp_flags::ACK, &req[20..]),
        ],
    );
    assert!(c.records.is_empty());
}

#[test]
fn trajectory_sampling_ignores_ttl_and_matches_the_rate() {
    let mut a = Trajectory::new(100_000, 42);
    let mut b = Trajectory::new(100_000, 42);
    let mut buf = Vec::new();
    let (mut ca, mut cb) = (Collect::default(), Collect::default());
    for i in 0..20_000u32 {
        let mut p = tcp(u64::from(i), true, i * 1460, tcp_flags::ACK, b"data");
        let n = view(&p, &mut buf);
        a.packet(&View::new(&buf[..n]).unwrap(), &mut ca);
        p.ttl = 63; // one hop later
        p.ts += 1_000_000;
        let n = view(&p, &mut buf);
        b.packet(&View::new(&buf[..n]).unwrap(), &mut cb);
    }
    assert_eq!(ca.samples, cb.samples);
    let hashes = |c: &Collect| -> Vec<u64> { c.records.iter().filter_map(|r| value(r, Element::Digest)).collect() };
    assert_eq!(hashes(&ca), hashes(&cb));
    assert!((1_600..=2_400).contains(&ca.samples), "{}", ca.samples);
    // One flow: one flow record, then packet records only.
    assert_eq!(ca.records.iter().filter(|r| r[0] == 1).count(), 1);
}
