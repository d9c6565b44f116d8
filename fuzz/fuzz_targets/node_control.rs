#![no_main]
//! Arbitrary bytes as an authenticated control message: a load request, and
//! a session request to a node with RCANE on (seeds: fuzz/seeds/sched_control).
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::control(data));
