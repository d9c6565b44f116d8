//! The four applications on real captures (tests/traces, made by
//! scripts/mktraces): sandboxed and native give the same records; RTTs
//! match tshark's; Code Red is found in a reordered, segmented request;
//! trajectory sampling picks the same packets on both sides of a router;
//! IPFIX export decodes in tshark.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::process::Command;

use anode_monitor::apps::abi::{Element, Record, be_uint};
use anode_monitor::apps::{codered::CodeRed, hurst::Hurst, rtt::Rtt, trajectory::Trajectory};
use anode_monitor::{CaptureReader, IpfixEncoder, Monitor, MonitorConfig, Output, PcapSink};
use common::*;

fn trace(name: &str) -> Vec<u8> {
    std::fs::read(traces_dir().join(name)).unwrap()
}

/// Runs the capture through `m`, with a periodic call every second of capture time.
fn replay(m: &mut Monitor, bytes: &[u8]) -> Vec<Output> {
    let mut r = CaptureReader::new(Cursor::new(bytes)).unwrap();
    let mut out = Vec::new();
    let mut next_tick = 0u64;
    let mut last = 0;
    while let Some(f) = r.next_frame().unwrap() {
        if next_tick == 0 {
            next_tick = f.ts_ns + 1_000_000_000;
        }
        last = f.ts_ns;
        m.handle_frame(&f, &mut out);
        if f.ts_ns >= next_tick {
            m.periodic(f.ts_ns, &mut out);
            next_tick += 1_000_000_000;
        }
    }
    m.periodic(last, &mut out);
    out
}

fn records_by_module(out: &[Output]) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut m: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for o in out {
        if let Output::Record { name, bytes, .. } = o {
            m.entry(name.to_string()).or_default().push(bytes.clone());
        }
    }
    m
}

fn get(rec: &[u8], e: Element) -> Option<u64> {
    Record::parse(rec).unwrap().items().find(|(x, _)| *x == e).map(|(_, v)| be_uint(v))
}

/// Each app as a wasm module ("x") and natively ("x-native"), same credential.
fn all_apps(batch: u32) -> Monitor {
    let mut m = monitor(MonitorConfig { batch, ..MonitorConfig::default() });
    let c = full_cred();
    for name in ["trajectory", "rtt", "codered", "hurst"] {
        m.load(now(), name, &module(&format!("mon-{name}")), &c).unwrap();
    }
    m.load_native(now(), "trajectory-native", Box::new(Trajectory::new(100_000, 0x5a4d)), &c).unwrap();
    m.load_native(now(), "rtt-native", Box::new(Rtt::new(0)), &c).unwrap();
    m.load_native(now(), "codered-native", Box::new(CodeRed::new()), &c).unwrap();
    m.load_native(now(), "hurst-native", Box::new(Hurst::new(1_000_000, 2)), &c).unwrap();
    m
}

#[test]
fn sandboxed_and_native_applications_export_the_same_records() {
    for t in ["rtt-client-side.pcap", "rtt-server-side.pcap", "codered.pcap"] {
        for batch in [1, 32] {
            let mut m = all_apps(batch);
            let by = records_by_module(&replay(&mut m, &trace(t)));
            for name in ["trajectory", "rtt", "codered", "hurst"] {
                let (a, b) = (by.get(name), by.get(&format!("{name}-native")));
                assert_eq!(a, b, "{t}, batch {batch}: {name}");
            }
            assert!(by.get("rtt").is_some_and(|r| r.len() > 10) || t == "codered.pcap", "{t}");
            for i in m.modules() {
                assert_eq!((i.counters.overruns, i.counters.traps), (0, 0), "{t}: {}", i.name);
            }
        }
    }
}

fn tshark() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            println!("SKIPPED: tshark is not installed (apt-get install tshark); the tshark comparison did not run");
            false
        }
    }
}

#[test]
fn rtt_matches_tsharks_ack_rtt_on_a_real_capture() {
    let t = traces_dir().join("rtt-client-side.pcap");
    let mut m = monitor(MonitorConfig::default());
    m.load(now(), "rtt", &module("mon-rtt"), &full_cred()).unwrap();
    let out = replay(&mut m, &std::fs::read(&t).unwrap());
    let ours: BTreeMap<u64, u64> = records_by_module(&out)["rtt"]
        .iter()
        .map(|r| (get(r, Element::Sport).unwrap(), get(r, Element::RttNs).unwrap()))
        .collect();
    assert!(ours.len() >= 30, "{} samples", ours.len());
    if !tshark() {
        return;
    }
    // Per stream: the SYN/ACK's ack_rtt (SYN → SYN/ACK) plus the handshake
    // ACK's ack_rtt (SYN/ACK → ACK) is the SYN → ACK time FLAME measures.
    let o = Command::new("tshark")
        .args(["-r"])
        .arg(&t)
        .args(["-o", "tcp.relative_sequence_numbers:FALSE", "-T", "fields", "-E", "separator=,"])
        .args([
            "-e",
            "tcp.stream",
            "-e",
            "tcp.srcport",
            "-e",
            "tcp.flags",
            "-e",
            "tcp.analysis.ack_rtt",
            "-e",
            "tcp.analysis.retransmission",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mut synack: BTreeMap<u64, f64> = BTreeMap::new();
    let mut hs_ack: BTreeMap<u64, f64> = BTreeMap::new();
    let mut client_port: BTreeMap<u64, u64> = BTreeMap::new();
    let mut retrans: BTreeSet<u64> = BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        let (stream, port, flags) = (
            f[0].parse::<u64>().unwrap(),
            f[1].parse::<u64>().unwrap(),
            u16::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap(),
        );
        if !f[4].is_empty() {
            retrans.insert(stream);
        }
        if flags == 0x002 {
            client_port.insert(stream, port);
        }
        let Ok(rtt) = f[3].parse::<f64>() else { continue };
        if flags == 0x012 {
            synack.entry(stream).or_insert(rtt);
        } else if flags & 0x010 != 0 && !hs_ack.contains_key(&stream) && synack.contains_key(&stream) {
            hs_ack.insert(stream, rtt);
        }
    }
    let mut compared = 0;
    for (stream, port) in &client_port {
        let (Some(a), Some(b)) = (synack.get(stream), hs_ack.get(stream)) else { continue };
        if retrans.contains(stream) {
            continue;
        }
        let theirs = ((a + b) * 1e9).round() as i64;
        let ours = *ours.get(port).unwrap_or_else(|| panic!("no sample for stream {stream} (port {port})")) as i64;
        // pcap has microsecond timestamps; tshark prints ack_rtt to the ns.
        assert!((ours - theirs).abs() <= 1_000, "stream {stream}: ours {ours} ns, tshark {theirs} ns");
        compared += 1;
    }
    println!("RTT: {compared} connections compared with tshark; ours {} samples", ours.len());
    assert!(compared >= 30);
}

#[test]
fn code_red_found_in_a_segmented_reordered_request() {
    let mut m = monitor(MonitorConfig::default());
    m.load(now(), "codered", &module("mon-codered"), &full_cred()).unwrap();
    let out = replay(&mut m, &trace("codered.pcap"));
    let recs = records_by_module(&out).remove("codered").unwrap_or_default();
    assert_eq!(recs.len(), 1);
    let r = Record::parse(&recs[0]).unwrap();
    let v: BTreeMap<&str, Vec<u8>> = r.items().map(|(e, v)| (e.json_key(), v.to_vec())).collect();
    assert_eq!(v["src"], [10, 77, 1, 2]);
    assert_eq!(v["dst"], [10, 77, 2, 2]);
    assert_eq!(be_uint(&v["dport"]), 80);
    assert_eq!(v["variant"], [b'N']);
    // The same capture with the payload grant cut to 40 bytes per segment (the
    // request's third segment has 43): the stream has a gap, no detection.
    let mut m = monitor(MonitorConfig::default());
    m.load(now(), "codered", &module("mon-codered"), &cred(&spec(&all_fields(), 40, records()))).unwrap();
    assert!(records_by_module(&replay(&mut m, &trace("codered.pcap"))).is_empty());
}

#[test]
fn trajectory_sampling_picks_the_same_packets_on_both_sides_of_the_router() {
    let sampled = |t: &str, rate: u32| -> BTreeSet<u64> {
        let mut m = monitor(MonitorConfig::default());
        if rate == 100_000 {
            m.load(now(), "t", &module("mon-trajectory"), &full_cred()).unwrap();
        } else {
            m.load_native(now(), "t", Box::new(Trajectory::new(rate, 0x5a4d)), &full_cred()).unwrap();
        }
        records_by_module(&replay(&mut m, &trace(t)))["t"].iter().filter_map(|r| get(r, Element::Digest)).collect()
    };
    let (a, b) = (sampled("rtt-client-side.pcap", 100_000), sampled("rtt-server-side.pcap", 100_000));
    // Every packet both monitors saw (the router drops some toward the server).
    let (all_a, all_b) = (sampled("rtt-client-side.pcap", 1_000_000), sampled("rtt-server-side.pcap", 1_000_000));
    let both: BTreeSet<u64> = all_a.intersection(&all_b).copied().collect();
    assert!(both.len() > 300, "{}", both.len());
    let a_both: BTreeSet<u64> = a.intersection(&both).copied().collect();
    let b_both: BTreeSet<u64> = b.intersection(&both).copied().collect();
    assert_eq!(a_both, b_both, "the two monitors sampled different packets");
    assert!(a_both.len() > 20, "{} common samples", a_both.len());
    println!("trajectory: {} packets seen by both monitors, {} sampled by both", both.len(), a_both.len());
}

/// Wraps IPFIX messages in UDP/IPv4 frames to port 4739 in a pcap.
fn ipfix_pcap(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut sink = PcapSink::new(Vec::new(), anode_monitor::LinkType::Raw).unwrap();
    for (i, m) in messages.iter().enumerate() {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ipv4([127, 0, 0, 1], [127, 0, 0, 1], 64).udp(40000, 4739).write(&mut f, m).unwrap();
        sink.write(1_700_000_000_000_000_000 + i as u64, f.len() as u32, &f).unwrap();
    }
    sink.into_inner()
}

#[test]
fn ipfix_export_decodes_in_tsharks_dissector() {
    let mut m = monitor(MonitorConfig::default());
    let rtt = m.load(now(), "rtt", &module("mon-rtt"), &full_cred()).unwrap();
    let traj = m.load(now(), "trajectory", &module("mon-trajectory"), &full_cred()).unwrap();
    let out = replay(&mut m, &trace("rtt-client-side.pcap"));
    let mut enc = IpfixEncoder::new();
    let mut messages = Vec::new();
    let mut expected_rtt = Vec::new();
    for id in [rtt, traj] {
        let recs: Vec<Vec<u8>> = out
            .iter()
            .filter_map(|o| match o {
                Output::Record { module, bytes, .. } if *module == id => Some(bytes.clone()),
                _ => None,
            })
            .collect();
        if id == rtt {
            expected_rtt = recs.iter().map(|r| get(r, Element::Sport).unwrap()).collect();
        }
        let parsed: Vec<Record<'_>> = recs.iter().map(|r| Record::parse(r).unwrap()).collect();
        for chunk in parsed.chunks(20) {
            let mut buf = Vec::new();
            enc.encode(id.0, 1_800_000_000, chunk, &mut buf);
            messages.push(buf);
        }
    }
    if !tshark() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anode-ipfix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("ipfix.pcap");
    std::fs::write(&p, ipfix_pcap(&messages)).unwrap();
    let o = Command::new("tshark")
        .arg("-r")
        .arg(&p)
        .args([
            "-d",
            "udp.port==4739,cflow",
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
        ])
        .args([
            "-e",
            "cflow.version",
            "-e",
            "cflow.od_id",
            "-e",
            "cflow.srcport",
            "-e",
            "cflow.srcaddr",
            "-e",
            "_ws.expert.message",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    std::fs::remove_dir_all(&dir).ok();
    let mut rtt_ports = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(';').collect();
        assert_eq!(f[0].split(',').next(), Some("10"), "{line}");
        let expert = f.get(4).copied().unwrap_or("");
        assert!(!expert.to_lowercase().contains("malformed"), "tshark: {expert}");
        if f[1] == rtt.0.to_string() {
            rtt_ports.extend(f[2].split(',').filter(|s| !s.is_empty()).map(|s| s.parse::<u64>().unwrap()));
            assert!(f[3].split(',').all(|a| a.is_empty() || a.starts_with("10.77.")), "{line}");
        }
    }
    assert_eq!(rtt_ports, expected_rtt, "tshark decoded the RTT records' source ports");
    println!("IPFIX: {} messages, {} RTT records decoded by tshark", messages.len(), rtt_ports.len());
}

#[test]
fn sampled_packets_are_a_readable_pcap_with_policy_applied() {
    let mut m = monitor(MonitorConfig::default());
    use anode_monitor::apps::abi::Field;
    // IP id and ports keep the sampling hash varied; sequence numbers, flags,
    // window, TTL and length are withheld.
    let mut s = spec(
        &[Field::Ts, Field::Src, Field::Dst, Field::Proto, Field::IpId, Field::Sport, Field::Dport],
        4,
        everything(),
    );
    s.anonymize = vec![anode_monitor::Prefix::ALL_V4];
    m.load(now(), "t", &module("mon-trajectory"), &cred(&s)).unwrap();
    let out = replay(&mut m, &trace("rtt-client-side.pcap"));
    let mut sink = PcapSink::new(Vec::new(), anode_monitor::LinkType::Raw).unwrap();
    let mut n = 0;
    for o in &out {
        if let Output::Sample { ts_ns, wire_len, data, .. } = o {
            assert!(data.len() <= 20 + 60 + 4);
            assert_eq!(&data[10..12], &[0, 0], "IP checksum zeroed");
            sink.write(*ts_ns, *wire_len, data).unwrap();
            n += 1;
        }
    }
    assert!(n > 10);
    let bytes = sink.into_inner();
    let mut r = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    let mut frames = 0;
    while let Some(f) = r.next_frame().unwrap() {
        let p = anode_monitor::parse::parse(&f).unwrap();
        assert_ne!(&p.src[..2], &[10, 77], "address in clear");
        assert!(
            matches!(p.l4, anode_monitor::parse::L4::Tcp { seq: 0, ack: 0, flags: 0, window: 0, sport, dport } if sport != 0 && dport != 0),
            "{:?}",
            p.l4
        );
        assert!(p.payload.len() <= 4);
        assert_eq!(p.ttl, 0);
        frames += 1;
    }
    assert_eq!(frames, n);
    if tshark() {
        let p = std::env::temp_dir().join(format!("anode-samples-{}.pcap", std::process::id()));
        std::fs::write(&p, &bytes).unwrap();
        let o = Command::new("tshark").arg("-r").arg(&p).output().unwrap();
        std::fs::remove_file(&p).ok();
        assert!(o.status.success());
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), n);
    }
}
