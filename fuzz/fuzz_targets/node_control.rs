#![no_main]
//! Arbitrary bytes as the load request of an authenticated control message.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::control(data));
