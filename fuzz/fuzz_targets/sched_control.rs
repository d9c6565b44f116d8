#![no_main]
//! Bytes as session control messages: parse/emit round trips, then a stream applied to a node.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    anode_sched::fuzzing::control_parse(data);
    anode_sched::fuzzing::control_apply(data);
});
