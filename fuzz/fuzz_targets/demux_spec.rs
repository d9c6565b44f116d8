#![no_main]
//! Bytes as a channel's demultiplexing specification (`net.open_channel_spec`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| anode_sandbox::fuzzing::demux_spec(data));
