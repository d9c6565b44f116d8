//! Capture readers on good, malformed and hostile files.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Cursor;

use anode_monitor::capture::{CaptureError, CaptureReader, Format, LinkType, MAX_FRAME, PcapSink};
use common::*;

/// Frames (time, wire length, bytes), how reading ended, and the counters.
type Read = (Vec<(u64, u32, Vec<u8>)>, Result<(), CaptureError>, anode_monitor::capture::CaptureCounters);

fn frames_of(bytes: &[u8]) -> Read {
    let mut r = CaptureReader::new(Cursor::new(bytes)).unwrap();
    let mut v = Vec::new();
    let res = loop {
        match r.next_frame() {
            Ok(Some(f)) => v.push((f.ts_ns, f.wire_len, f.data.to_vec())),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    (v, res, r.counters())
}

fn sample_frames() -> Vec<(u64, Vec<u8>)> {
    (0..50u32)
        .map(|i| {
            (
                1_700_000_000_000_000_000 + u64::from(i) * 1_000_000,
                tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 80, i, "A", &vec![i as u8; i as usize * 7]),
            )
        })
        .collect()
}

#[test]
fn pcap_round_trip_through_the_writer() {
    let mut sink = PcapSink::new(Vec::new(), LinkType::Ethernet).unwrap();
    for (ts, f) in sample_frames() {
        sink.write(ts + 123, f.len() as u32 + 4, &f).unwrap();
    }
    let bytes = sink.into_inner();
    let (got, res, c) = frames_of(&bytes);
    res.unwrap();
    assert_eq!(got.len(), 50);
    assert_eq!(c.frames, 50);
    for ((ts, wire, data), (ets, ef)) in got.iter().zip(sample_frames()) {
        assert_eq!((*ts, *wire, data), (ets + 123, ef.len() as u32 + 4, &ef), "nanosecond pcap keeps ns");
    }
}

#[test]
fn truncated_files_deliver_what_precedes_the_cut() {
    let bytes = pcap(&sample_frames());
    for cut in [10, 24, 30, 100, bytes.len() - 1] {
        match CaptureReader::new(Cursor::new(&bytes[..cut])) {
            Err(e) => assert!(cut < 24, "cut {cut}: {e}"),
            Ok(mut r) => {
                let mut n = 0;
                let end = loop {
                    match r.next_frame() {
                        Ok(Some(_)) => n += 1,
                        other => break other.map(|_| ()),
                    }
                };
                assert!(matches!(end, Err(CaptureError::Truncated(_))) || cut == 24, "cut {cut}: {end:?}");
                assert!(n < 50);
            }
        }
    }
    assert!(matches!(
        CaptureReader::new(Cursor::new(b"hello world, not a capture at all")),
        Err(CaptureError::NotACapture(_))
    ));
    assert!(matches!(CaptureReader::new(Cursor::new(b"")), Err(CaptureError::Truncated(0))));
}

fn with_snaplen(mut bytes: Vec<u8>, snaplen: u32) -> Vec<u8> {
    bytes[16..20].copy_from_slice(&snaplen.to_le_bytes());
    bytes
}

#[test]
fn snap_lengths_of_zero_and_two_to_the_32_are_not_trusted() {
    for snap in [0u32, u32::MAX, 1] {
        let (got, res, _) = frames_of(&with_snaplen(pcap(&sample_frames()), snap));
        res.unwrap();
        assert_eq!(got.len(), 50, "snaplen {snap}");
    }
}

#[test]
fn lying_record_lengths() {
    let mut bytes = pcap(&sample_frames()[..3]);
    // Record 1: captured length > original length → skipped, counted.
    bytes[24 + 12..24 + 16].copy_from_slice(&1u32.to_le_bytes());
    let (got, res, c) = frames_of(&bytes);
    res.unwrap();
    assert_eq!((got.len(), c.bad_records), (2, 1));
    // A 4 GiB captured length: refused without buffering it.
    let mut huge = pcap(&sample_frames()[..2]);
    huge[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    huge[24 + 12..24 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    let (got, res, _) = frames_of(&huge);
    assert!(got.is_empty());
    assert!(matches!(res, Err(CaptureError::TooLarge) | Err(CaptureError::Truncated(_))), "{res:?}");
    // Just above MAX_FRAME, with the bytes present: skipped as a bad record.
    let big = vec![0u8; MAX_FRAME + 1];
    let mut f = pcap(&[(0, big)]);
    f.extend_from_slice(&pcap(&sample_frames()[..1])[24..]);
    let (got, res, c) = frames_of(&f);
    assert!(res.is_err() || (got.len() == 1 && c.bad_records == 1), "{res:?} {}", got.len());
}

/// A pcapng section: SHB, IDB (Ethernet, `if_tsresol` = 9: ns), then `blocks`.
fn pcapng(blocks: &[Vec<u8>]) -> Vec<u8> {
    fn block(t: u32, body: &[u8]) -> Vec<u8> {
        let len = 12 + body.len() as u32;
        let mut b = t.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }
    let mut shb = 0x1A2B_3C4Du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    let mut idb = 1u16.to_le_bytes().to_vec();
    idb.extend_from_slice(&[0, 0]);
    idb.extend_from_slice(&0u32.to_le_bytes());
    idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]); // if_tsresol = 9, end of options
    let mut out = block(0x0A0D_0D0A, &shb);
    out.extend(block(1, &idb));
    for b in blocks {
        out.extend_from_slice(b);
    }
    out
}

fn epb(iface: u32, ts: u64, data: &[u8]) -> Vec<u8> {
    let mut body = iface.to_le_bytes().to_vec();
    body.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&(ts as u32).to_le_bytes());
    body.extend_from_slice(&(data.len() as u32).to_le_bytes());
    body.extend_from_slice(&(data.len() as u32).to_le_bytes());
    body.extend_from_slice(data);
    body.resize(body.len().div_ceil(4) * 4, 0);
    let len = 12 + body.len() as u32;
    let mut b = 6u32.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&body);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

fn unknown_block(t: u32, n: usize) -> Vec<u8> {
    let len = 12 + n as u32;
    let mut b = t.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend(std::iter::repeat_n(0xab, n));
    b.extend_from_slice(&len.to_le_bytes());
    b
}

#[test]
fn pcapng_with_unknown_blocks_and_nanosecond_resolution() {
    let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 3, "S", b"");
    let bytes = pcapng(&[
        epb(0, 1_700_000_000_123_456_789, &f),
        unknown_block(0x0BAD_0001, 40),
        unknown_block(0x0000_0BAD, 0),
        unknown_block(0x8000_0001, 16), // a local-use block type
        epb(0, 1_700_000_001_000_000_000, &f),
        epb(7, 1, &f), // no such interface
    ]);
    let mut r = CaptureReader::new(Cursor::new(&bytes)).unwrap();
    assert_eq!(r.format(), Format::PcapNg);
    let first = r.next_frame().unwrap().unwrap();
    assert_eq!((first.ts_ns, first.link, first.data), (1_700_000_000_123_456_789, LinkType::Ethernet, &f[..]));
    assert!(r.next_frame().unwrap().is_some());
    let end = r.next_frame().map(|f| f.is_none());
    assert!(matches!(end, Ok(true)), "{end:?}");
    let c = r.counters();
    assert_eq!(c.frames, 2);
    assert_eq!(c.unknown_interface, 1);
    assert!(c.skipped_blocks >= 2, "{c:?}");
}

#[test]
fn malformed_pcapng_blocks_are_typed_errors() {
    let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 3, "S", b"");
    let mut bad_trailer = epb(0, 1, &f);
    let n = bad_trailer.len();
    bad_trailer[n - 4] ^= 1;
    let mut short_len = unknown_block(0x0BAD_0002, 8);
    short_len[4..8].copy_from_slice(&8u32.to_le_bytes());
    let mut huge = unknown_block(0x0BAD_0003, 8);
    huge[4..8].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    for (name, b) in [("trailer", bad_trailer), ("short", short_len), ("huge", huge)] {
        let bytes = pcapng(&[epb(0, 1, &f), b]);
        let (got, res, _) = frames_of(&bytes);
        assert_eq!(got.len(), 1, "{name}");
        assert!(res.is_err(), "{name}: {res:?}");
    }
}
