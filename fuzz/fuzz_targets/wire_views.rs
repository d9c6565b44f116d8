#![no_main]
//! Arbitrary bytes through every wire view and Repr: ANEP, plain, control, local API, capture stream.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_wire::fuzzing::views(data));
