//! `anode account` and `anode experiment`: the ledger reader, the Fig. 11
//! statistics and plot, and (as root, with cgroup v1) a short run of the
//! Linux baselines.
#![allow(clippy::unwrap_used)]

use anode_ledger::{Batch, Ledger, LedgerConfig, SessionRecord};
use anode_sched::trace::{Trace, TraceRow};
use anode_sched::{Charge, CloseReason, Owner, PrincipalId, ResourceKind, SessionId};
use std::path::PathBuf;
use std::process::Command;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("anode-rcane-cli-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn anode(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_anode")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn account_reads_the_ledger() {
    let s = Scratch::new("account");
    let db = s.0.join("ledger.db");
    let mut l = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let boot = l.begin_boot(1_000, "n").unwrap();
    let alice = Owner::Principal(PrincipalId([0xa1; 32]));
    let c = |owner, kind, amount| Charge { owner, session: SessionId::from_raw(1 << 32 | 2), kind, amount };
    for seq in 0..3u64 {
        let b = Batch {
            boot,
            seq,
            start_ms: 1_000 + seq * 1_000,
            end_ms: 2_000 + seq * 1_000,
            charges: vec![c(alice, ResourceKind::CpuGuaranteedNs, 100), c(Owner::System, ResourceKind::CpuSlackNs, 7)],
            sessions: if seq == 2 {
                vec![SessionRecord {
                    session: SessionId::from_raw(1 << 32 | 2),
                    owner: alice,
                    closed: Some(CloseReason::ByPrincipal),
                    at_ms: 3_500,
                }]
            } else {
                vec![]
            },
        };
        l.write(&b).unwrap();
    }
    drop(l);
    let path = db.to_str().unwrap();
    let (ok, out, err) = anode(&["account", "--ledger", path, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let totals = v["totals"].as_array().unwrap();
    let find = |p: &str, k: &str| {
        totals
            .iter()
            .find(|t| t["principal"].as_str().unwrap().starts_with(p) && t["kind"] == k)
            .map(|t| t["amount"].as_u64().unwrap())
    };
    assert_eq!(find("a1a1", "cpu_guaranteed_ns"), Some(300));
    assert_eq!(find("system", "cpu_slack_ns"), Some(21));
    assert_eq!(v["sessions"][0]["reason"], "closed-by-principal");
    let (ok, out, _) =
        anode(&["account", "--run-dir", s.0.to_str().unwrap(), "--principal", "a1a1", "--since", "2000", "--csv"]);
    assert!(ok);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec!["principal,kind,amount", &format!("{},cpu_guaranteed_ns,200", "a1".repeat(32))]
    );
    let (ok, out, _) = anode(&["account", "--ledger", path, "--rows", "--csv", "--principal", "system"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 4);
    // Errors: a missing ledger, a bad filter, a bad time.
    let (ok, _, err) = anode(&["account", "--ledger", s.0.join("none.db").to_str().unwrap()]);
    assert!(!ok && err.contains("cannot open"), "{err}");
    let (ok, _, err) = anode(&["account", "--ledger", path, "--principal", "xyz"]);
    assert!(!ok && err.contains("principal filter"), "{err}");
    let (ok, _, err) = anode(&["account", "--ledger", path, "--since", "3w"]);
    assert!(!ok && err.contains("unit"), "{err}");
}

#[test]
fn stats_and_plot_of_a_trace() {
    let s = Scratch::new("plot");
    let mut rows = Vec::new();
    for k in 0..100u64 {
        let got = if k == 7 { 200_000 } else { 400_000 };
        rows.push(TraceRow {
            source: "anode".into(),
            load: "B".into(),
            period: k,
            start_ns: 3_000_000_000 + k * 4_000_000,
            length_ns: 4_000_000,
            slice_ns: 400_000,
            received_ns: got,
        });
    }
    for k in 0..10u64 {
        rows.push(TraceRow {
            source: "anode".into(),
            load: "A".into(),
            period: k,
            start_ns: k * 100_000_000,
            length_ns: 100_000_000,
            slice_ns: 0,
            received_ns: 90_000_000,
        });
    }
    let csv = s.0.join("t.csv");
    std::fs::write(&csv, Trace { rows, meta: vec![("steal_percent_cpu".into(), "0.5".into())] }.to_csv()).unwrap();
    let (ok, out, err) = anode(&["experiment", "stats", csv.to_str().unwrap(), "--markdown"]);
    assert!(ok, "{err}");
    assert!(out.contains("| anode | B | 10.00 | 100 | 9.95 | 5.00 | 10.00 | 10.00 | 99.00 % |"), "{out}");
    assert!(out.contains("- steal_percent_cpu = 0.5"), "{out}");
    let png = s.0.join("t.png");
    let (ok, _, err) = anode(&["experiment", "plot-fig11", csv.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert!(ok, "{err}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // A file that is not a trace.
    std::fs::write(&csv, "hello\n").unwrap();
    let (ok, _, err) = anode(&["experiment", "stats", csv.to_str().unwrap()]);
    assert!(!ok && err.contains("not a Fig. 11 trace"), "{err}");
}

/// A short run of both Linux baselines (1 s each). Needs root and a cgroup
/// v1 cpu controller, as the experiment itself does; elsewhere it says why
/// it did not run.
#[test]
fn linux_baselines_short_run() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    if !root || !std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
        eprintln!("linux_baselines_short_run: needs root and cgroup v1 cpu; not run");
        return;
    }
    const SYSCTL: &str = "/proc/sys/kernel/sched_rt_runtime_us";
    let before = std::fs::read_to_string(SYSCTL).unwrap();
    let s = Scratch::new("baseline");
    for sched in ["deadline", "cfs"] {
        let csv = s.0.join(format!("{sched}.csv"));
        let (ok, out, err) = anode(&[
            "experiment",
            "fig11",
            "--sched",
            sched,
            "--stagger",
            "0.2",
            "--tail",
            "0.6",
            "-o",
            csv.to_str().unwrap(),
        ]);
        assert!(ok, "{sched}: {err}");
        assert!(out.contains(&format!("linux-{sched}")), "{out}");
        let t = Trace::parse(&std::fs::read_to_string(&csv).unwrap()).unwrap();
        for (load, slice) in [
            ("B", if sched == "cfs" { 1_000_000 } else { 400_000 }),
            ("C", if sched == "cfs" { 1_000_000 } else { 800_000 }),
            ("D", 1_200_000),
        ] {
            let mine: Vec<&TraceRow> = t.rows.iter().filter(|r| r.load == load).collect();
            assert!(mine.len() > 20, "{sched} {load}: {} periods", mine.len());
            assert!(mine.iter().all(|r| r.slice_ns == slice), "{sched} {load}");
            assert!(
                mine.windows(2)
                    .all(|w| w[1].period == w[0].period + 1 && w[1].start_ns == w[0].start_ns + w[0].length_ns)
            );
        }
        assert!(t.rows.iter().any(|r| r.load == "A"));
        assert!(t.meta.iter().any(|(k, _)| k == "steal_ticks_cpu"));
    }
    assert_eq!(std::fs::read_to_string(SYSCTL).unwrap(), before, "the sysctl is restored");
}

#[test]
fn from_periods_makes_a_trace_and_can_leave_out_idle_periods() {
    let s = Scratch::new("periods");
    let log = s.0.join("periods.csv");
    // VP 2.1 (a load B with 400 µs per 4 ms): a full period, one it was
    // idle in for part of the time (short of its slice), a short one it
    // was not idle in; Best-Effort's VP 1.1 in between.
    std::fs::write(
        &log,
        "vp,session,start_ns,end_ns,slice_ns,received_ns,slack_ns,idle\n\
         2.1,2.1,1000000,5000000,400000,400000,0,0\n\
         1.1,1.1,1000000,11000000,1000000,3000000,2000000,0\n\
         2.1,2.1,5000000,9000000,400000,100000,0,1\n\
         2.1,2.1,9000000,13000000,400000,200000,0,0\n",
    )
    .unwrap();
    let trace = |extra: &[&str]| -> Trace {
        let out = s.0.join("t.csv");
        let mut args =
            vec!["experiment", "from-periods", log.to_str().unwrap(), "--load", "B=2.1", "--best-effort", "A=1.1"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", out.to_str().unwrap()]);
        let (ok, _, err) = anode(&args);
        assert!(ok, "{err}");
        Trace::parse(&std::fs::read_to_string(&out).unwrap()).unwrap()
    };
    let all = trace(&[]);
    let b: Vec<&TraceRow> = all.rows.iter().filter(|r| r.load == "B").collect();
    assert_eq!(b.len(), 3);
    assert_eq!((b[0].start_ns, b[0].received_ns), (0, 400_000));
    assert!(all.meta.contains(&("idle_periods_B".into(), "1".into())), "{:?}", all.meta);
    let busy = trace(&["--skip-idle"]);
    let b: Vec<&TraceRow> = busy.rows.iter().filter(|r| r.load == "B").collect();
    assert_eq!(
        b.iter().map(|r| r.received_ns).collect::<Vec<_>>(),
        vec![400_000, 200_000],
        "only the idle one left out"
    );
    assert!(busy.meta.contains(&("idle_periods_skipped".into(), "true".into())));
    // A malformed log is refused, saying where.
    std::fs::write(&log, "vp,session,start_ns,end_ns,slice_ns,received_ns,slack_ns,idle\n2.1,2.1,0,1,1,1,0,7\n")
        .unwrap();
    let (ok, _, err) =
        anode(&["experiment", "from-periods", log.to_str().unwrap(), "--load", "B=2.1", "-o", "/dev/null"]);
    assert!(!ok && err.contains("line 2"), "{err}");
}
