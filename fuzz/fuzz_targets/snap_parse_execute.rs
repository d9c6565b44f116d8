#![no_main]
//! Arbitrary bytes as a SNAP packet: structural checks, then execution.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_snap::fuzzing::parse_execute(data));
