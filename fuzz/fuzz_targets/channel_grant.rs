#![no_main]
//! Text as a credential's `channel("<ports>", "<source>")` fact (split at the first newline).
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_cred::fuzzing::channel_grant(data));
