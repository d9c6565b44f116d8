#![no_main]
//! Arbitrary bytes as administrative-domain messages: tickets, ticket packets, perimeter attachments, ticket requests, revocation updates.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_sec::fuzzing::domain_message(data));
