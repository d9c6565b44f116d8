#![no_main]
//! Arbitrary sequences of code chunks and staged loads (modules too large
//! for one control datagram): bounded, and staged code comes out whole.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::staging(data));
