//! RCANE Fig. 15 on real daemons (`anode experiment fig15-node`;
//! docs/rcane.md, "Fig. 15 on daemons"): a short run, checked for
//! properties that do not depend on the machine's speed.
//!
//! - The harness and the router work: data reaches the receiver (which
//!   joined the flow with its first NACK: the router has no other way to
//!   learn it), NACKs are sent and some are served from the router's cache.
//! - The heap reservation, read from `anode status` every second, starts
//!   at what the session opened with, never shrinks (the module only asks
//!   for more), grows past its start (a cache of one page cannot serve 90 %
//!   of a 25 % loss, so the module asks and admission grants), and stays
//!   within the session credential's ceiling.
//! - The module's heap use stays within the reservation.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

const ANODE: &str = env!("CARGO_BIN_EXE_anode");

#[test]
fn the_arm_router_asks_for_heap_on_a_real_node_and_admission_grants_it() {
    let arm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../modules/out/arm.wasm");
    assert!(arm.exists(), "{} is missing: run scripts/setup", arm.display());
    let out = std::env::temp_dir().join(format!("anode-test-fig15-node-{}", std::process::id()));
    let o = Command::new(ANODE)
        .args(["experiment", "fig15-node", "--seconds", "8", "--change-at", "4", "--rate", "300", "--module"])
        .arg(&arm)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    assert!(std::fs::metadata(out.join("fig15-node.png")).unwrap().len() > 0);
    let csv = std::fs::read_to_string(out.join("fig15-node.csv")).unwrap();
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<f64>> = lines.map(|l| l.split(',').map(|x| x.parse().unwrap()).collect()).collect();
    assert_eq!(rows.len(), 8, "{csv}");
    let get = |r: &Vec<f64>, name: &str| r[col(name)];
    let sum = |name: &str| rows.iter().map(|r| get(r, name)).sum::<f64>();
    assert!(sum("received") > 0.0, "{csv}");
    assert!(sum("nacks") > 0.0, "{csv}");
    assert!(sum("hits") > 0.0, "{csv}");
    let res: Vec<f64> = rows.iter().map(|r| get(r, "reservation_kib")).collect();
    assert!(res.iter().all(|r| (192.0..=4096.0).contains(r)), "{csv}");
    assert!(res.windows(2).all(|w| w[1] >= w[0]), "the reservation never shrinks\n{csv}");
    assert!(res.last().unwrap() > &192.0, "the module asked for more and was granted it\n{csv}");
    assert!(rows.iter().all(|r| get(r, "used_kib") <= get(r, "reservation_kib")), "{csv}");
    let _ = std::fs::remove_dir_all(&out);
}
