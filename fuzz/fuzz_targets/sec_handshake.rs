#![no_main]
//! Arbitrary bytes as handshake messages and protected datagrams, into a node's security layer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_sec::fuzzing::handshake_and_packet(data));
