#![no_main]
//! Arbitrary bytes as boot-chain recovery messages: parse, re-emit, serve, and a fetch waiting for a reply.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_boot::fuzzing::recovery_message(data));
