#![no_main]
//! Arbitrary text as a node configuration and as a topology file.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::config(data));
