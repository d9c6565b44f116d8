//! The ledger: round trips, idempotency, restarts, retention, every
//! rejection, and crash consistency with a child process killed mid-write.
#![allow(clippy::unwrap_used)]

use anode_ledger::{
    Batch, BootId, Ledger, LedgerConfig, LedgerError, Query, Recorder, Retention, SessionRecord, WriteOutcome,
};
use anode_sched::{Charge, CloseReason, Owner, PrincipalId, ResourceKind, SessionId};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("anode-ledger-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn db(&self) -> PathBuf {
        self.0.join("ledger.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ALICE: Owner = Owner::Principal(PrincipalId([0xa1; 32]));
const BOB: Owner = Owner::Principal(PrincipalId([0xb0; 32]));

fn charge(owner: Owner, session: u64, kind: ResourceKind, amount: u64) -> Charge {
    Charge { owner, session: SessionId::from_raw(session), kind, amount }
}

fn total(l: &Ledger, principal: Option<&str>, kind: ResourceKind) -> u64 {
    let q = Query { principal: principal.map(str::to_string), ..Query::default() };
    l.totals(&q).unwrap().iter().filter(|t| t.kind == kind).map(|t| t.amount).sum()
}

#[test]
fn batches_round_trip_and_replays_count_once() {
    let s = Scratch::new("roundtrip");
    let mut l = Ledger::open(&s.db(), LedgerConfig::default()).unwrap();
    let boot = l.begin_boot(1_000, "node-a").unwrap();
    let b0 = Batch {
        boot,
        seq: 0,
        start_ms: 1_000,
        end_ms: 2_000,
        charges: vec![
            charge(ALICE, 2, ResourceKind::CpuGuaranteedNs, 400_000),
            charge(BOB, 3, ResourceKind::TxBytes, 1500),
            charge(Owner::BestEffort, 1, ResourceKind::CpuSlackNs, 9),
        ],
        sessions: vec![
            SessionRecord { session: SessionId::from_raw(2), owner: ALICE, closed: None, at_ms: 1_100 },
            SessionRecord { session: SessionId::from_raw(3), owner: BOB, closed: None, at_ms: 1_200 },
        ],
    };
    assert_eq!(l.write(&b0).unwrap(), WriteOutcome::Applied);
    assert_eq!(l.write(&b0).unwrap(), WriteOutcome::AlreadyApplied);
    let b1 = Batch {
        seq: 1,
        start_ms: 2_000,
        end_ms: 3_000,
        charges: vec![charge(ALICE, 2, ResourceKind::CpuGuaranteedNs, 100)],
        sessions: vec![SessionRecord {
            session: SessionId::from_raw(2),
            owner: ALICE,
            closed: Some(CloseReason::CredentialExpired),
            at_ms: 2_500,
        }],
        ..b0.clone()
    };
    assert_eq!(l.write(&b1).unwrap(), WriteOutcome::Applied);
    assert_eq!(total(&l, None, ResourceKind::CpuGuaranteedNs), 400_100);
    assert_eq!(total(&l, Some("a1a1"), ResourceKind::CpuGuaranteedNs), 400_100);
    assert_eq!(total(&l, Some("B0B0B0"), ResourceKind::TxBytes), 1500);
    assert_eq!(total(&l, Some("best-effort"), ResourceKind::CpuSlackNs), 9);
    assert_eq!(total(&l, Some("system"), ResourceKind::CpuSlackNs), 0);
    let since = Query { since_ms: Some(2_000), ..Query::default() };
    assert_eq!(l.rows(&since).unwrap().len(), 1);
    assert_eq!(l.rows(&Query::default()).unwrap().len(), 4);
    let sessions = l.sessions(&Query { principal: Some("a1".into()), ..Query::default() }).unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(
        (sessions[0].opened_ms, sessions[0].closed_ms, sessions[0].reason.as_deref()),
        (Some(1_100), Some(2_500), Some("credential-expired"))
    );
    assert_eq!(l.last_seq(boot).unwrap(), Some(1));
    // A restart: the same file, a new boot; the old boot's last batch is
    // replayed (the daemon was killed before it learnt it was committed).
    drop(l);
    let mut l = Ledger::open(&s.db(), LedgerConfig::default()).unwrap();
    assert_eq!(l.write(&b1).unwrap(), WriteOutcome::AlreadyApplied);
    let boot2 = l.begin_boot(5_000, "node-a").unwrap();
    assert!(boot2 > boot);
    let b = Batch {
        boot: boot2,
        seq: 0,
        start_ms: 5_000,
        end_ms: 6_000,
        charges: vec![charge(ALICE, 2, ResourceKind::CpuGuaranteedNs, 1)],
        sessions: vec![],
    };
    assert_eq!(l.write(&b).unwrap(), WriteOutcome::Applied);
    assert_eq!(total(&l, None, ResourceKind::CpuGuaranteedNs), 400_101);
    assert_eq!(l.batch_count().unwrap(), 3);
}

#[test]
fn recorder_sums_flushes_and_numbers_batches() {
    let s = Scratch::new("recorder");
    let l = Ledger::open(&s.db(), LedgerConfig::default()).unwrap();
    let mut r = Recorder::new(l, 10_000, "n").unwrap();
    r.add(&[charge(ALICE, 2, ResourceKind::RxPackets, 3), charge(ALICE, 2, ResourceKind::RxPackets, 4)], &[]);
    assert_eq!(r.flush(11_000).unwrap().written, 1);
    assert_eq!(r.flush(12_000).unwrap().written, 0, "an empty interval writes nothing");
    r.add(&[charge(BOB, 3, ResourceKind::ModuleLoads, 1)], &[]);
    r.flush(13_000).unwrap();
    let l = r.ledger();
    assert_eq!(l.last_seq(r.boot()).unwrap(), Some(1));
    assert_eq!(total(l, None, ResourceKind::RxPackets), 7);
    let rows = l.rows(&Query::default()).unwrap();
    assert_eq!((rows[0].start_ms, rows[0].length_ms), (10_000, 1_000));
    assert_eq!((rows[1].start_ms, rows[1].length_ms), (12_000, 1_000));
}

#[test]
fn retention_merges_old_rows_and_keeps_totals() {
    let s = Scratch::new("retention");
    let mut l = Ledger::open(&s.db(), LedgerConfig::default()).unwrap();
    let boot = l.begin_boot(0, "n").unwrap();
    const H: u64 = 3_600_000;
    // One-second batches over three hours, starting on an hour boundary.
    for seq in 0..(3 * 3600) {
        let t = seq * 1000;
        let b = Batch {
            boot,
            seq,
            start_ms: t,
            end_ms: t + 1000,
            charges: vec![
                charge(ALICE, 2, ResourceKind::CpuGuaranteedNs, 1000),
                charge(BOB, 3, ResourceKind::TxBytes, 7),
            ],
            sessions: vec![],
        };
        l.write(&b).unwrap();
    }
    let before = (total(&l, None, ResourceKind::CpuGuaranteedNs), total(&l, None, ResourceKind::TxBytes));
    // At 4 h with 2 h of fine rows kept: the first two hours become buckets.
    let r = Retention { fine_for_ms: 2 * H, coarse_ms: H, coarse_for_ms: None, batches_for_ms: 30 * 24 * H };
    let st = l.compact(&r, 4 * H).unwrap();
    assert_eq!(st.merged, 2 * 2 * 3600);
    assert_eq!(st.coarse_rows, 2 * 2);
    assert_eq!((total(&l, None, ResourceKind::CpuGuaranteedNs), total(&l, None, ResourceKind::TxBytes)), before);
    let rows = l.rows(&Query::default()).unwrap();
    assert_eq!(rows.len(), 2 * 2 + 2 * 3600);
    assert_eq!((rows[0].start_ms, rows[0].length_ms, rows[0].amount), (0, H, 3600 * 1000));
    // Compacting again changes nothing.
    assert_eq!(l.compact(&r, 4 * H).unwrap().merged, 0);
    assert_eq!((total(&l, None, ResourceKind::CpuGuaranteedNs), total(&l, None, ResourceKind::TxBytes)), before);
    // Expiry of coarse rows and batch records.
    let r = Retention { coarse_for_ms: Some(3 * H), batches_for_ms: 2 * H, ..r };
    let st = l.compact(&r, 4 * H).unwrap();
    assert_eq!(st.expired, 2);
    assert_eq!(st.batches_pruned, 7199);
}

#[test]
fn rejections_are_typed() {
    let s = Scratch::new("reject");
    // Corrupt: not a database at all.
    let junk = s.0.join("junk.db");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    assert!(matches!(Ledger::open(&junk, LedgerConfig::default()), Err(LedgerError::Corrupt { .. })));
    assert!(matches!(Ledger::open_read_only(&junk), Err(LedgerError::Corrupt { .. })));
    // A database, but not a ledger.
    let other = s.0.join("other.db");
    rusqlite::Connection::open(&other).unwrap().execute_batch("CREATE TABLE t (x);").unwrap();
    assert!(matches!(Ledger::open(&other, LedgerConfig::default()), Err(LedgerError::NotALedger { found: 0, .. })));
    // A ledger of another schema version.
    let newer = s.0.join("newer.db");
    drop(Ledger::open(&newer, LedgerConfig::default()).unwrap());
    rusqlite::Connection::open(&newer).unwrap().execute_batch("PRAGMA user_version = 2;").unwrap();
    assert!(matches!(Ledger::open(&newer, LedgerConfig::default()), Err(LedgerError::SchemaVersion { found: 2, .. })));
    assert!(matches!(Ledger::open_read_only(&newer), Err(LedgerError::SchemaVersion { found: 2, .. })));
    // A missing directory, and a file where a directory should be.
    assert!(matches!(
        Ledger::open(&s.0.join("missing/ledger.db"), LedgerConfig::default()),
        Err(LedgerError::CannotOpen { .. })
    ));
    assert!(matches!(
        Ledger::open(&junk.join("ledger.db"), LedgerConfig::default()),
        Err(LedgerError::CannotOpen { .. })
    ));
    assert!(matches!(Ledger::open_read_only(&s.0.join("absent.db")), Err(LedgerError::CannotOpen { .. })));
    // Writing through a read-only handle.
    let ok = s.db();
    let mut l = Ledger::open(&ok, LedgerConfig::default()).unwrap();
    let boot = l.begin_boot(0, "n").unwrap();
    drop(l);
    let mut ro = Ledger::open_read_only(&ok).unwrap();
    assert!(matches!(ro.begin_boot(1, "n"), Err(LedgerError::ReadOnly { .. })));
    // Values that do not fit, an unknown boot, a bad filter.
    let mut l = Ledger::open(&ok, LedgerConfig::default()).unwrap();
    let big = Batch {
        boot,
        seq: 0,
        start_ms: 0,
        end_ms: 1,
        charges: vec![charge(ALICE, 2, ResourceKind::TxBytes, u64::MAX)],
        sessions: vec![],
    };
    assert!(matches!(l.write(&big), Err(LedgerError::TooLarge { what: "amount", .. })));
    assert_eq!(l.batch_count().unwrap(), 0, "the failed batch left nothing behind");
    let stray = Batch { boot: BootId(99), ..big.clone() };
    assert!(matches!(l.write(&stray), Err(LedgerError::UnknownBoot(99))));
    for bad in ["", "zz", "a1%", "_"] {
        let q = Query { principal: Some(bad.into()), ..Query::default() };
        assert!(matches!(l.totals(&q), Err(LedgerError::BadPrincipalFilter(_))), "{bad:?}");
    }
}

/// A read-only directory. Root may write anywhere, so the check runs in a
/// copy of this test binary as `nobody` when the test runs as root.
#[test]
fn read_only_directory_is_a_typed_error() {
    let s = Scratch::new("rodir");
    let ro = s.0.join("ro");
    std::fs::create_dir(&ro).unwrap();
    // A ledger made before the directory became read-only: readable, not writable.
    drop(Ledger::open(&ro.join("old.db"), LedgerConfig::default()).unwrap());
    set_mode(&ro, 0o555);
    set_mode(&s.0, 0o755);
    let out = if is_root() {
        let exe = s.0.join("self-test");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        set_mode(&exe, 0o755);
        use std::os::unix::process::CommandExt;
        let out = Command::new(&exe)
            .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
            .env("ANODE_LEDGER_CHILD", format!("rodir:{}", ro.display()))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        rodir_checks(&ro)
    };
    set_mode(&ro, 0o755);
    eprint!("{out}");
    assert!(out.contains("new: CannotOpen"), "{out}");
    assert!(out.contains("old: ReadOnly") || out.contains("old: CannotOpen"), "{out}");
}

fn rodir_checks(ro: &Path) -> String {
    let name = |r: Result<Ledger, LedgerError>| match r {
        Ok(_) => "opened".to_string(),
        Err(e) => format!("{e:?}").split([' ', '{']).next().unwrap_or("").to_string(),
    };
    let new = name(Ledger::open(&ro.join("new.db"), LedgerConfig::default()));
    let old = name(Ledger::open(&ro.join("old.db"), LedgerConfig::default()).and_then(|mut l| {
        l.begin_boot(1, "n")?;
        Ok(l)
    }));
    format!("new: {new}\nold: {old}\n")
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The child side of the process tests: does nothing unless
/// `ANODE_LEDGER_CHILD` says what to do.
#[test]
fn child_process_entry() {
    let Ok(what) = std::env::var("ANODE_LEDGER_CHILD") else { return };
    if let Some(dir) = what.strip_prefix("rodir:") {
        print!("{}", rodir_checks(Path::new(dir)));
    } else if let Some(db) = what.strip_prefix("writer:") {
        // Writes batches as fast as it can until killed: batch `seq` charges
        // `seq + 1` CPU ns to Alice and one received packet to Bob.
        let l = Ledger::open(Path::new(db), LedgerConfig::default()).unwrap();
        let mut r = Recorder::new(l, 0, "child").unwrap();
        for seq in 0u64.. {
            r.add(
                &[charge(ALICE, 2, ResourceKind::CpuGuaranteedNs, seq + 1), charge(BOB, 3, ResourceKind::RxPackets, 1)],
                &[],
            );
            r.flush(seq + 1).unwrap();
        }
    }
}

#[test]
fn a_killed_writer_leaves_a_consistent_ledger() {
    let s = Scratch::new("crash");
    let db = s.db();
    drop(Ledger::open(&db, LedgerConfig::default()).unwrap());
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
            .env("ANODE_LEDGER_CHILD", format!("writer:{}", db.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Let it write a few hundred batches, then SIGKILL it mid-stream.
        let t0 = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let n = Ledger::open_read_only(&db).and_then(|l| l.batch_count()).unwrap_or(0);
            if n >= 200 * (round + 1) || t0.elapsed() > Duration::from_secs(60) {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // Reopen read-write (recovers the WAL) and check every boot: the
        // charges are exactly those of the batches recorded as applied.
        let l = Ledger::open(&db, LedgerConfig::default()).unwrap();
        let conn = rusqlite::Connection::open(&db).unwrap();
        let (batches, seq_sum): (i64, i64) = conn
            .query_row("SELECT count(*), coalesce(sum(seq + 1), 0) FROM batches", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert!(batches >= 200 * (round as i64 + 1), "round {round}: only {batches} batches written");
        assert_eq!(total(&l, None, ResourceKind::CpuGuaranteedNs), seq_sum as u64, "round {round}");
        assert_eq!(total(&l, None, ResourceKind::RxPackets), batches as u64, "round {round}");
        let gaps: i64 = conn
            .query_row("SELECT count(*) FROM batches b WHERE seq > 0 AND NOT EXISTS (SELECT 1 FROM batches p WHERE p.boot = b.boot AND p.seq = b.seq - 1)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(gaps, 0, "batches are applied in order, none missing before the last");
    }
}
