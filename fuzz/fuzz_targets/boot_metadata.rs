#![no_main]
//! Arbitrary bytes as TUF metadata (root, timestamp, snapshot, targets split at a `\n%%\n` line), a boot state file and boot.toml.
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_boot::fuzzing::metadata(data));
