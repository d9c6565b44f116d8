#![no_main]
//! Arbitrary text through the assembler, and the disassembly round trip.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_snap::fuzzing::assemble(data));
