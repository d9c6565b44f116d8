//! `anode experiment fig12-wire`: a kernel capture of the Fig. 12 link into
//! the receiver's arrival format. Built from a synthetic capture: what it
//! keeps (datagrams to the port, with the tag at its offset and the
//! capture's time), what it skips and counts (other ports, frames that are
//! not IP, payloads too short for the tag), and the GSO run it refuses.

mod common;

use anode_monitor::{LinkType, PcapSink};
use common::Scratch;
use std::process::Command;

const ANODE: &str = env!("CARGO_BIN_EXE_anode");
const PORT: u16 = 29603;

/// An Ethernet frame with an IPv4 UDP datagram from port 17356 to `dport`.
fn udp_frame(dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend([0x08, 0x00]);
    let total = (20 + 8 + payload.len()) as u16;
    f.extend([0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend([127, 0, 0, 1, 127, 0, 0, 1]);
    let udp_len = (8 + payload.len()) as u16;
    f.extend(17356u16.to_be_bytes());
    f.extend(dport.to_be_bytes());
    f.extend(udp_len.to_be_bytes());
    f.extend([0, 0]);
    f.extend_from_slice(payload);
    f
}

/// A payload with `tag` at offset 40, as `--security authenticate` lays it out.
fn tagged(tag: u8, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[40] = tag;
    p
}

fn capture(dir: &std::path::Path, frames: &[(u64, Vec<u8>)]) -> std::path::PathBuf {
    let path = dir.join("link.pcap");
    let mut sink = PcapSink::new(std::fs::File::create(&path).expect("create"), LinkType::Ethernet).expect("header");
    for (ts, f) in frames {
        sink.write(*ts, f.len() as u32, f).expect("frame");
    }
    drop(sink.into_inner());
    path
}

fn run(pcap: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    Command::new(ANODE)
        .args(["experiment", "fig12-wire", "--port", &PORT.to_string(), "--pcap"])
        .arg(pcap)
        .arg("-o")
        .arg(out)
        .output()
        .expect("runs")
}

#[test]
fn datagrams_to_the_port_become_arrivals_with_the_kernel_time_and_the_rest_is_counted() {
    let dir = Scratch::new("fig12wire", "kept");
    let t0 = 1_764_460_000_000_000_000u64;
    let mut not_ip = udp_frame(PORT, &tagged(b'D', 1456));
    not_ip[12] = 0x88; // an ethertype that is not IP
    let frames = vec![
        (t0, udp_frame(PORT, &tagged(b'E', 1456))),
        (t0 + 1_000, udp_frame(PORT + 1, &tagged(b'D', 1456))),
        (t0 + 2_000, not_ip),
        (t0 + 3_000, udp_frame(PORT, &[7u8; 30])),
        (t0 + 117_000, udp_frame(PORT, &tagged(b'F', 1456))),
    ];
    let pcap = capture(dir.0.as_path(), &frames);
    let out = dir.0.as_path().join("arrivals.csv");
    let r = run(&pcap, &out);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "fig12-wire failed: {stderr}");
    let text = std::fs::read_to_string(&out).expect("output");
    assert_eq!(text, format!("unix_ns,tag,len\n{t0},E,1456\n{},F,1456\n", t0 + 117_000));
    assert!(
        stderr.contains("2 datagrams to port 29603 kept; 2 other frames, 1 too short for the tag, 0 GSO runs"),
        "{stderr}"
    );
}

#[test]
fn a_gso_run_in_the_capture_is_refused_with_the_reason() {
    let dir = Scratch::new("fig12wire", "gso");
    let frames = vec![(1u64, udp_frame(PORT, &tagged(b'E', 1456))), (2, udp_frame(PORT, &tagged(b'E', 4 * 1456)))];
    let pcap = capture(dir.0.as_path(), &frames);
    let r = run(&pcap, &dir.0.as_path().join("arrivals.csv"));
    assert!(!r.status.success());
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(stderr.contains("1 GSO runs in the capture") && stderr.contains("--no-gso"), "{stderr}");
}

#[test]
fn a_file_that_is_not_a_capture_is_refused() {
    let dir = Scratch::new("fig12wire", "bad");
    let bad = dir.0.as_path().join("link.pcap");
    std::fs::write(&bad, b"not a capture at all").expect("write");
    let r = run(&bad, &dir.0.as_path().join("arrivals.csv"));
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("is not a capture"));
}
