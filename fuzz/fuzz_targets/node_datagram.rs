#![no_main]
//! Arbitrary bytes into a two-interface node's handle_datagram, with the counter accounting checked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_node::fuzzing::datagram(data));
