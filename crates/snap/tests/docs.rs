//! docs/snap.md carries the opcode table generated from `for_each_op!`; this
//! test keeps them identical. Regenerate with
//! `ANODE_BLESS=1 cargo test -p anode-snap --test docs`.
use std::path::PathBuf;

const BEGIN: &str = "<!-- BEGIN OPCODE TABLE";
const END: &str = "<!-- END OPCODE TABLE -->";

#[test]
fn docs_opcode_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/snap.md");
    let doc = std::fs::read_to_string(&path).expect("docs/snap.md");
    let b = doc.find(BEGIN).expect("begin marker");
    let b = b + doc[b..].find('\n').expect("marker line") + 1;
    let e = doc.find(END).expect("end marker");
    let want = anode_snap::ops::markdown_table();
    if std::env::var_os("ANODE_BLESS").is_some() {
        let new = format!("{}{}{}", &doc[..b], want, &doc[e..]);
        std::fs::write(&path, new).expect("write docs");
        return;
    }
    assert_eq!(&doc[b..e], want, "docs/snap.md opcode table is stale: run with ANODE_BLESS=1");
    assert!(doc.contains(&format!("There are {} instructions", anode_snap::ops::ALL_OPS.len())));
}
