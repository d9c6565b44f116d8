#![no_main]
//! Bytes as a session credential (Biscuit) presented to open a session and to reserve.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_cred::fuzzing::session_credential(data));
