#![no_main]
//! Bytes as a capsule-protocol message: parse, and what parses re-encodes to the same bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_sandbox::fuzzing::capsule_parse(data));
