#![no_main]
//! Arbitrary text through the PLAN compiler: never a panic; accepted
//! programs give packets that parse and obey SNAP's structural rules.
//! Seeds: `examples/plan/*.plan` and `crates/plan/tests/golden/*.plan`
//! (`cargo +nightly fuzz run plan_compile examples/plan`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_plan::fuzzing::compile(data));
