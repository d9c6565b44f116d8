#![no_main]
//! Bytes as a module credential (Biscuit) presented for a load, and as a module's signature section.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_cred::fuzzing::credential(data));
