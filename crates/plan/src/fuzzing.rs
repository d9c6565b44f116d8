//! Entry points for the cargo-fuzz targets under `fuzz/`.

/// Compiles arbitrary bytes as PLAN source. Must never panic; when the
/// compiler accepts the input, the packet must parse and its code must obey
/// SNAP's structural rules.
pub fn compile(data: &[u8]) {
    let Ok(src) = core::str::from_utf8(data) else { return };
    if let Ok(c) = crate::compile("fuzz.plan", src, &crate::Options::default()) {
        let ok = anode_snap::wire::Repr::parse_bytes(&c.bytes).is_ok();
        assert!(ok, "compiled packet does not parse");
        if let Err(e) = crate::structural_check(&c.packet, &c.chunk_starts) {
            panic!("compiled code breaks a structural rule: {e}\n{}", c.asm);
        }
    }
}
