#![no_main]
//! Fragments from a few sources through a small reassembler with time moving, and
//! split-then-reassemble round trips (`anode_wire::frag::fuzz`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_wire::frag::fuzz(data));
