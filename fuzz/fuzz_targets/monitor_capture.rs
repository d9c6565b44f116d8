#![no_main]
//! Bytes as a pcap or pcapng file: every frame read and parsed, typed errors only, bounded buffering.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_monitor::fuzzing::capture(data));
