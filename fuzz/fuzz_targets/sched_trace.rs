#![no_main]
//! Text as a Fig. 11 CPU trace (CSV): what parses re-emits to the same trace.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_sched::fuzzing::trace_parse(data));
