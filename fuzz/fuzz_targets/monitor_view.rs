#![no_main]
//! A link-type byte and a frame: the policy view holds no forbidden field, no payload beyond the grant, no clear address.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_monitor::fuzzing::view_builder(data));
