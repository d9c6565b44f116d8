#![no_main]
//! Arbitrary bytes as local application API requests and replies, re-encoded and applied to a node.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::local(data));
