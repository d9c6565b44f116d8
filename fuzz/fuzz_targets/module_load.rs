#![no_main]
//! Bytes as a WebAssembly module loaded under an administrative credential
//! (and as a capsule message): a typed error or a loaded, callable module.
use std::sync::Mutex;

static SANDBOX: Mutex<Option<anode_sandbox::Sandbox>> = Mutex::new(None);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut g = SANDBOX.lock().unwrap_or_else(|e| e.into_inner());
    let sb = g.get_or_insert_with(anode_sandbox::fuzzing::sandbox);
    anode_sandbox::fuzzing::module_load(sb, data);
});
