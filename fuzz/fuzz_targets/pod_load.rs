#![no_main]
//! Bytes as a pod (Expert's protected module) loaded under an administrative
//! credential: a typed error, or a listed pod that unloads.
use std::sync::Mutex;

static SANDBOX: Mutex<Option<anode_sandbox::Sandbox>> = Mutex::new(None);

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut g = SANDBOX.lock().unwrap_or_else(|e| e.into_inner());
    let sb = g.get_or_insert_with(anode_sandbox::fuzzing::sandbox);
    let _ = anode_sandbox::fuzzing::pod_load(sb, data);
});
