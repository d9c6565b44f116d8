//! RCANE Fig. 16 on real daemons (`anode experiment fig16-node`; docs/rcane.md,
//! "Fig. 16 on daemons"): a short run of both scenarios, checked for
//! properties that hold whatever the machine's load, never for timings.
//!
//! - The harness works: every request was sent, and in two sessions B
//!   replied to requests in both phases, kept results among them.
//! - Two sessions share nothing: B's allocations are never refused, its
//!   heap account refuses nothing, no job was dropped because a store was
//!   busy, B's channel drops nothing, while A's own account (filled by its
//!   heavy phase) refuses A's allocations.
//! - One session shares its heap and its store: A's heavy phase fills the
//!   shared account (refusals counted on it), and B loses service to it: a
//!   refused allocation, a request dropped because A's invocation held the
//!   store, or a request its channel could not queue. Which of them, and
//!   how often, depends on the timing; that one of them happens does not:
//!   after its first heavy request A leaves the shared account full, and
//!   until then its invocation holds the store.
#![allow(clippy::unwrap_used)]

use std::process::Command;

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn two_sessions_keep_b_whole_and_one_session_shares_the_heap_and_the_store() {
    let out = std::env::temp_dir().join(format!("anode-test-fig16-node-{}", std::process::id()));
    let o =
        Command::new(ANODE).args(["experiment", "fig16-node", "--seconds", "1.5", "-o"]).arg(&out).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("fig16-node-summary.json")).unwrap()).unwrap();
    for f in ["fig16-node.csv", "fig16-node-periods.csv", "fig16-node.png"] {
        assert!(std::fs::metadata(out.join(f)).unwrap().len() > 0, "{f} is empty");
    }
    let sc = s["scenarios"].as_array().unwrap();
    let one = sc.iter().find(|x| x["shared"] == true).unwrap();
    let two = sc.iter().find(|x| x["shared"] == false).unwrap();
    for x in [one, two] {
        // 1.5 s of 4 ms slots: 375 requests, a third light.
        assert_eq!(n(&x["a_light"]["requests"]) + n(&x["a_heavy"]["requests"]), 375, "{x}");
    }

    // Two sessions: the harness's replies arrive, B keeps its results.
    for p in ["a_light", "a_heavy"] {
        let b = &two[p];
        assert!(n(&b["replies"]) > 0, "{text}\n{b}");
        assert!(n(&b["keeps"]) > 0, "{b}");
        assert_eq!(n(&b["alloc_failed"]), 0, "two sessions: B's allocation refused\n{b}");
    }
    let node = &two["node"];
    assert_eq!(n(&node["jobs_busy"]), 0, "two sessions share no store\n{node}");
    assert_eq!(n(&node["jobs_helped"]), 0, "two sessions share no store\n{node}");
    let (a, b) = (&node["a"], &node["b"]);
    assert_ne!(a["principal"], b["principal"]);
    assert_eq!(n(&b["heap"]["refusals"]), 0, "B's own account refuses nothing\n{b}");
    assert!(n(&a["heap"]["refusals"]) > 0, "A's heavy phase fills its own account\n{a}");
    assert_eq!(n(&b["channel"]["dropped_full"]), 0, "{b}");
    assert!(n(&b["channel"]["delivered"]) > 0, "{b}");

    // One session: A fills the shared account, and B loses service to A.
    let node = &one["node"];
    let (a, b) = (&node["a"], &node["b"]);
    assert_eq!(a["principal"], b["principal"], "one principal");
    assert_eq!(a["heap"], b["heap"], "one principal, one account");
    assert!(n(&a["heap"]["refusals"]) > 0, "A's heavy phase fills the shared account\n{a}");
    let h = &one["a_heavy"];
    // No job is dropped for a busy store: B's VP runs A's preempted
    // invocation first (jobs_helped), as RCANE's B does A's work.
    assert_eq!(n(&node["jobs_busy"]), 0, "one session: a job dropped for a busy store\n{node}");
    let crosstalk = n(&h["alloc_failed"]) + n(&h["lost"]) + n(&node["jobs_helped"]) + n(&b["channel"]["dropped_full"]);
    assert!(crosstalk > 0, "one session: B unaffected by A?\n{one}");
    let _ = std::fs::remove_dir_all(&out);
}
