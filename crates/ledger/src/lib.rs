//! anode's durable accounting ledger (RCANE §IV-A: account resource
//! consumption to the client that caused it, so that it may be billed).
//!
//! Layer: storage. This is the one crate of the resource-control stack that
//! does file I/O; it owns no threads or clocks (the daemon calls it from a
//! background thread and passes wall-clock milliseconds in). It stores what
//! `anode_sched::Rcane::drain_charges` and `drain_events` return, in SQLite
//! (through `rusqlite`, with SQLite compiled in).
//!
//! - [`Ledger`]: the database: open (creating or checking the schema),
//!   [`Ledger::write`] one [`Batch`] per transaction, queries, retention.
//! - [`Recorder`]: the daemon's side: accumulates charges and session events
//!   between flushes, seals them into numbered batches and writes them,
//!   keeping a batch that failed to write for the next flush.
//!
//! # Invariants
//! - **Nothing is counted twice.** Every batch carries `(boot, seq)`; the
//!   `batches` table records each one applied in the same transaction as its
//!   rows, and a batch already recorded is skipped whole. A retried flush, a
//!   replayed batch, or a restart that re-sends the last batch changes
//!   nothing.
//! - **A batch is applied whole or not at all** (one transaction), so a
//!   crash mid-write leaves the ledger as it was before that batch.
//! - **A kill loses at most what was not yet flushed.** WAL mode: a committed
//!   batch survives the process being killed; with `synchronous = NORMAL`
//!   (the default) a power failure may lose the last committed batches but
//!   never corrupts the file; [`Synchronous::Full`] keeps those too, at the
//!   cost of an fsync per batch.
//! - Every problem is a typed [`LedgerError`]: corrupt file, a database that
//!   is not a ledger, a newer or older schema, a read-only or missing
//!   directory, values that do not fit.
//!
//! The schema and retention are documented in `docs/ledger.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use anode_sched::{Charge, CloseReason, Owner, ResourceKind, SessionEvent, SessionId};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, params};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

/// The schema version this crate writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;
/// The SQLite application id of an anode ledger (`PRAGMA application_id`,
/// "anLG").
pub const APPLICATION_ID: i64 = 0x616e_4c47;

const SCHEMA: &str = "
CREATE TABLE boots (
    boot       INTEGER PRIMARY KEY,
    started_ms INTEGER NOT NULL,
    node       TEXT NOT NULL
);
CREATE TABLE principals (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE batches (
    boot       INTEGER NOT NULL REFERENCES boots(boot),
    seq        INTEGER NOT NULL,
    start_ms   INTEGER NOT NULL,
    end_ms     INTEGER NOT NULL,
    charges    INTEGER NOT NULL,
    PRIMARY KEY (boot, seq)
) WITHOUT ROWID;
CREATE TABLE charges (
    principal   INTEGER NOT NULL REFERENCES principals(id),
    boot        INTEGER NOT NULL,
    session     INTEGER NOT NULL,
    kind        INTEGER NOT NULL,
    start_ms    INTEGER NOT NULL,
    length_ms   INTEGER NOT NULL,
    amount      INTEGER NOT NULL,
    PRIMARY KEY (start_ms, principal, boot, session, kind)
) WITHOUT ROWID;
CREATE TABLE sessions (
    boot       INTEGER NOT NULL,
    session    INTEGER NOT NULL,
    principal  INTEGER NOT NULL REFERENCES principals(id),
    opened_ms  INTEGER,
    closed_ms  INTEGER,
    reason     TEXT,
    PRIMARY KEY (boot, session)
) WITHOUT ROWID;
";

/// A ledger problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The file is not a SQLite database, or is damaged.
    #[error("{path}: corrupt or not a database: {detail}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// SQLite's message.
        detail: String,
    },
    /// A SQLite database, but not an anode ledger (another application id,
    /// or tables that are not ours).
    #[error("{path}: a database, but not an anode ledger (application id {found:#x})")]
    NotALedger {
        /// The file.
        path: PathBuf,
        /// Its application id.
        found: i64,
    },
    /// A ledger with a schema version this build does not speak.
    #[error("{path}: ledger schema version {found}, this build speaks {SCHEMA_VERSION}")]
    SchemaVersion {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: i64,
    },
    /// The file cannot be opened or created (missing or unwritable
    /// directory, permissions).
    #[error("{path}: cannot open the ledger: {detail}")]
    CannotOpen {
        /// The file.
        path: PathBuf,
        /// SQLite's message.
        detail: String,
    },
    /// The ledger (or its directory) is read-only, so it cannot be written.
    #[error("{path}: the ledger is read-only: {detail}")]
    ReadOnly {
        /// The file.
        path: PathBuf,
        /// SQLite's message.
        detail: String,
    },
    /// A value does not fit SQLite's signed 64-bit integers.
    #[error("{what} {value} is too large for the ledger")]
    TooLarge {
        /// Which value.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// A boot id that [`Ledger::begin_boot`] never returned.
    #[error("unknown boot {0}")]
    UnknownBoot(u64),
    /// A principal filter that is neither hex nor `system`/`best-effort`.
    #[error("principal filter {0:?}: expected hex fingerprint (prefix), `system` or `best-effort`")]
    BadPrincipalFilter(String),
    /// A row holds a value this build cannot read (an unknown resource kind).
    #[error("unreadable row: {0}")]
    BadRow(String),
    /// Any other SQLite error.
    #[error("{path}: {source}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: rusqlite::Error,
    },
}

/// How hard SQLite works to make a commit durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// WAL with `synchronous = NORMAL`: survives a killed process; a power
    /// failure may lose the last commits (never corrupts).
    #[default]
    Normal,
    /// `synchronous = FULL`: an fsync per commit; survives power failure.
    Full,
}

/// Ledger options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Durability of commits.
    pub synchronous: Synchronous,
    /// How long to wait for another connection's lock, ms.
    pub busy_timeout_ms: u32,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig { synchronous: Synchronous::Normal, busy_timeout_ms: 5_000 }
    }
}

/// A boot of the node (a run of the daemon), as numbered by the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BootId(pub u64);

/// A session's opening or closing, with the wall-clock time it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRecord {
    /// The session.
    pub session: SessionId,
    /// Its owner.
    pub owner: Owner,
    /// `Some(reason)` for a close.
    pub closed: Option<CloseReason>,
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
}

impl SessionRecord {
    /// From a scheduler event and the wall-clock time of its `at_ns`.
    pub fn from_event(e: &SessionEvent, at_ms: u64) -> SessionRecord {
        match *e {
            SessionEvent::Opened { session, owner, .. } => SessionRecord { session, owner, closed: None, at_ms },
            SessionEvent::Closed { session, owner, reason, .. } => {
                SessionRecord { session, owner, closed: Some(reason), at_ms }
            }
        }
    }
}

/// One flush: the charges of the interval `[start_ms, end_ms)` and the
/// session events in it, numbered `(boot, seq)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The boot.
    pub boot: BootId,
    /// Sequence number within the boot.
    pub seq: u64,
    /// Start of the interval, ms since the Unix epoch.
    pub start_ms: u64,
    /// End of the interval.
    pub end_ms: u64,
    /// What each session used in the interval.
    pub charges: Vec<Charge>,
    /// Sessions opened and closed in the interval.
    pub sessions: Vec<SessionRecord>,
}

/// What [`Ledger::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The batch was applied.
    Applied,
    /// The batch had been applied before; nothing changed.
    AlreadyApplied,
}

/// A query: which principal (fingerprint prefix, `system` or
/// `best-effort`), from when, to when.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Principal filter.
    pub principal: Option<String>,
    /// Only intervals starting at or after this (ms since the epoch).
    pub since_ms: Option<u64>,
    /// Only intervals starting before this.
    pub until_ms: Option<u64>,
}

/// A total per principal and resource kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Total {
    /// Principal (hex fingerprint, `system` or `best-effort`).
    pub principal: String,
    /// Resource kind.
    pub kind: ResourceKind,
    /// Sum of the amounts.
    pub amount: u64,
}

/// One stored charge row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRow {
    /// Principal.
    pub principal: String,
    /// Boot.
    pub boot: u64,
    /// Session (raw handle).
    pub session: u64,
    /// Resource kind.
    pub kind: ResourceKind,
    /// Interval start, ms since the epoch.
    pub start_ms: u64,
    /// Interval length, ms.
    pub length_ms: u64,
    /// Amount.
    pub amount: u64,
}

/// One stored session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// Boot.
    pub boot: u64,
    /// Session (raw handle).
    pub session: u64,
    /// Principal.
    pub principal: String,
    /// When it opened.
    pub opened_ms: Option<u64>,
    /// When it closed.
    pub closed_ms: Option<u64>,
    /// Why it closed.
    pub reason: Option<String>,
}

/// Retention: how long rows stay at what granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Rows finer than `coarse_ms` older than this are merged into
    /// `coarse_ms` buckets (default 7 days).
    pub fine_for_ms: u64,
    /// The coarse bucket length (default 1 hour).
    pub coarse_ms: u64,
    /// Coarse rows older than this are deleted (`None`: kept for ever, the
    /// default, since they are what a principal is billed on).
    pub coarse_for_ms: Option<u64>,
    /// Records of applied batches older than this are deleted (default 30
    /// days). A batch replayed after its record is gone would count twice;
    /// replays happen within seconds of a restart.
    pub batches_for_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 86_400_000;
        Retention { fine_for_ms: 7 * DAY, coarse_ms: 3_600_000, coarse_for_ms: None, batches_for_ms: 30 * DAY }
    }
}

/// What [`Ledger::compact`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Fine rows merged away.
    pub merged: u64,
    /// Coarse rows written or updated.
    pub coarse_rows: u64,
    /// Coarse rows deleted for age.
    pub expired: u64,
    /// Batch records deleted.
    pub batches_pruned: u64,
}

fn i64_of(what: &'static str, value: u64) -> Result<i64, LedgerError> {
    i64::try_from(value).map_err(|_| LedgerError::TooLarge { what, value })
}

fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The durable ledger. See the crate documentation.
#[derive(Debug)]
pub struct Ledger {
    conn: Connection,
    path: PathBuf,
}

impl Ledger {
    /// Opens the ledger at `path`, creating it (and its schema) if the file
    /// does not exist.
    ///
    /// # Errors
    /// [`LedgerError::CannotOpen`], [`LedgerError::ReadOnly`],
    /// [`LedgerError::Corrupt`], [`LedgerError::NotALedger`],
    /// [`LedgerError::SchemaVersion`].
    pub fn open(path: &Path, cfg: LedgerConfig) -> Result<Ledger, LedgerError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| classify(path, e))?;
        let mut l = Ledger { conn, path: path.to_path_buf() };
        l.conn.busy_timeout(std::time::Duration::from_millis(u64::from(cfg.busy_timeout_ms))).map_err(|e| l.err(e))?;
        l.check_or_create()?;
        let sync = match cfg.synchronous {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        };
        l.conn
            .execute_batch(&format!(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;"
            ))
            .map_err(|e| l.err(e))?;
        Ok(l)
    }

    /// Opens an existing ledger for reading only (`anode account`).
    ///
    /// # Errors
    /// As [`Ledger::open`]; a missing file is [`LedgerError::CannotOpen`].
    pub fn open_read_only(path: &Path) -> Result<Ledger, LedgerError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| classify(path, e))?;
        let l = Ledger { conn, path: path.to_path_buf() };
        l.check_existing()?.map_or(Ok(()), |found| Err(LedgerError::NotALedger { path: l.path.clone(), found }))?;
        Ok(l)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: rusqlite::Error) -> LedgerError {
        classify(&self.path, e)
    }

    /// Checks an existing database: `Ok(None)` if it is a ledger of our
    /// version, `Ok(Some(app_id))` if it is empty (a new file) or foreign.
    fn check_existing(&self) -> Result<Option<i64>, LedgerError> {
        let app: i64 = self.conn.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        let version: i64 = self.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        if app != APPLICATION_ID {
            return Ok(Some(app));
        }
        if version != SCHEMA_VERSION {
            return Err(LedgerError::SchemaVersion { path: self.path.clone(), found: version });
        }
        Ok(None)
    }

    fn check_or_create(&mut self) -> Result<(), LedgerError> {
        let Some(app) = self.check_existing()? else { return Ok(()) };
        let tables: i64 =
            self.conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        if app != 0 || tables != 0 {
            return Err(LedgerError::NotALedger { path: self.path.clone(), found: app });
        }
        let tx = self.conn.transaction().map_err(|e| classify(&self.path, e))?;
        tx.execute_batch(SCHEMA).map_err(|e| classify(&self.path, e))?;
        tx.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"))
            .map_err(|e| classify(&self.path, e))?;
        tx.commit().map_err(|e| classify(&self.path, e))
    }

    /// Records a new boot of the node and returns its id (ids only grow).
    ///
    /// # Errors
    /// A write error.
    pub fn begin_boot(&mut self, started_ms: u64, node: &str) -> Result<BootId, LedgerError> {
        let started = i64_of("boot time", started_ms)?;
        self.conn
            .execute("INSERT INTO boots (started_ms, node) VALUES (?1, ?2)", params![started, node])
            .map_err(|e| self.err(e))?;
        Ok(BootId(u64_of(self.conn.last_insert_rowid())))
    }

    /// The highest sequence number applied for `boot`.
    ///
    /// # Errors
    /// A read error.
    pub fn last_seq(&self, boot: BootId) -> Result<Option<u64>, LedgerError> {
        let b = i64_of("boot", boot.0)?;
        let v: Option<i64> = self
            .conn
            .query_row("SELECT max(seq) FROM batches WHERE boot = ?1", [b], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok(v.map(u64_of))
    }

    /// Applies one batch in one transaction, unless `(boot, seq)` was
    /// applied before.
    ///
    /// # Errors
    /// [`LedgerError::UnknownBoot`], [`LedgerError::TooLarge`], or a write
    /// error (then nothing of the batch was applied).
    pub fn write(&mut self, batch: &Batch) -> Result<WriteOutcome, LedgerError> {
        let path = self.path.clone();
        let e = |err| classify(&path, err);
        let boot = i64_of("boot", batch.boot.0)?;
        let seq = i64_of("sequence number", batch.seq)?;
        let start = i64_of("interval start", batch.start_ms)?;
        let end = i64_of("interval end", batch.end_ms.max(batch.start_ms))?;
        let tx = self.conn.transaction().map_err(e)?;
        let known: Option<i64> =
            tx.query_row("SELECT boot FROM boots WHERE boot = ?1", [boot], |r| r.get(0)).optional().map_err(e)?;
        if known.is_none() {
            return Err(LedgerError::UnknownBoot(batch.boot.0));
        }
        let inserted = tx
            .execute(
                "INSERT OR IGNORE INTO batches (boot, seq, start_ms, end_ms, charges) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![boot, seq, start, end, batch.charges.len() as i64],
            )
            .map_err(e)?;
        if inserted == 0 {
            return Ok(WriteOutcome::AlreadyApplied);
        }
        let mut principals: BTreeMap<Owner, i64> = BTreeMap::new();
        {
            let mut ins = tx
                .prepare(
                    "INSERT INTO charges (principal, boot, session, kind, start_ms, length_ms, amount)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT DO UPDATE SET amount = amount + excluded.amount",
                )
                .map_err(e)?;
            for c in &batch.charges {
                let p = principal_id(&tx, &mut principals, c.owner).map_err(e)?;
                let amount = i64_of("amount", c.amount)?;
                let session = i64::from_ne_bytes(c.session.to_raw().to_ne_bytes());
                ins.execute(params![p, boot, session, c.kind as u8, start, end - start, amount]).map_err(e)?;
            }
            let mut open = tx
                .prepare(
                    "INSERT INTO sessions (boot, session, principal, opened_ms) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT DO UPDATE SET opened_ms = excluded.opened_ms",
                )
                .map_err(e)?;
            let mut close = tx
                .prepare(
                    "INSERT INTO sessions (boot, session, principal, closed_ms, reason) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT DO UPDATE SET closed_ms = excluded.closed_ms, reason = excluded.reason",
                )
                .map_err(e)?;
            for s in &batch.sessions {
                let p = principal_id(&tx, &mut principals, s.owner).map_err(e)?;
                let session = i64::from_ne_bytes(s.session.to_raw().to_ne_bytes());
                let at = i64_of("session time", s.at_ms)?;
                match s.closed {
                    None => open.execute(params![boot, session, p, at]).map_err(e)?,
                    Some(r) => close.execute(params![boot, session, p, at, r.name()]).map_err(e)?,
                };
            }
        }
        tx.commit().map_err(e)?;
        Ok(WriteOutcome::Applied)
    }

    fn filter(&self, q: &Query) -> Result<(String, Vec<rusqlite::types::Value>), LedgerError> {
        use rusqlite::types::Value;
        let mut sql = String::from(" WHERE 1 = 1");
        let mut args: Vec<Value> = Vec::new();
        if let Some(p) = &q.principal {
            let p = p.to_ascii_lowercase();
            let named = p == "system" || p == "best-effort";
            if !named && (p.is_empty() || p.len() > 64 || !p.bytes().all(|b| b.is_ascii_hexdigit())) {
                return Err(LedgerError::BadPrincipalFilter(p));
            }
            if named {
                sql.push_str(" AND p.name = ?");
                args.push(Value::Text(p));
            } else {
                // Hex only, so no LIKE wildcard can be in it.
                sql.push_str(" AND p.name LIKE ?");
                args.push(Value::Text(format!("{p}%")));
            }
        }
        if let Some(s) = q.since_ms {
            sql.push_str(" AND c.start_ms >= ?");
            args.push(Value::Integer(i64_of("since", s)?));
        }
        if let Some(u) = q.until_ms {
            sql.push_str(" AND c.start_ms < ?");
            args.push(Value::Integer(i64_of("until", u)?));
        }
        Ok((sql, args))
    }

    /// Totals per principal and resource kind.
    ///
    /// # Errors
    /// [`LedgerError::BadPrincipalFilter`] or a read error.
    pub fn totals(&self, q: &Query) -> Result<Vec<Total>, LedgerError> {
        let (filter, args) = self.filter(q)?;
        let sql = format!(
            "SELECT p.name, c.kind, sum(c.amount) FROM charges c JOIN principals p ON p.id = c.principal{filter}
             GROUP BY p.name, c.kind ORDER BY p.name, c.kind"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in rows {
            let (principal, kind, amount) = r.map_err(|e| self.err(e))?;
            out.push(Total { principal, kind: kind_of(kind)?, amount: u64_of(amount) });
        }
        Ok(out)
    }

    /// The stored rows, oldest first.
    ///
    /// # Errors
    /// [`LedgerError::BadPrincipalFilter`] or a read error.
    pub fn rows(&self, q: &Query) -> Result<Vec<ChargeRow>, LedgerError> {
        let (filter, args) = self.filter(q)?;
        let sql = format!(
            "SELECT p.name, c.boot, c.session, c.kind, c.start_ms, c.length_ms, c.amount
             FROM charges c JOIN principals p ON p.id = c.principal{filter}
             ORDER BY c.start_ms, p.name, c.boot, c.session, c.kind"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for r in rows {
            let (principal, boot, session, kind, start, len, amount) = r.map_err(|e| self.err(e))?;
            out.push(ChargeRow {
                principal,
                boot: u64_of(boot),
                session: u64::from_ne_bytes(session.to_ne_bytes()),
                kind: kind_of(kind)?,
                start_ms: u64_of(start),
                length_ms: u64_of(len),
                amount: u64_of(amount),
            });
        }
        Ok(out)
    }

    /// The stored sessions of the principal filter (times are not filtered).
    ///
    /// # Errors
    /// [`LedgerError::BadPrincipalFilter`] or a read error.
    pub fn sessions(&self, q: &Query) -> Result<Vec<SessionRow>, LedgerError> {
        let q = Query { since_ms: None, until_ms: None, ..q.clone() };
        let (filter, args) = self.filter(&q)?;
        let sql = format!(
            "SELECT c.boot, c.session, p.name, c.opened_ms, c.closed_ms, c.reason
             FROM sessions c JOIN principals p ON p.id = c.principal{filter} ORDER BY c.boot, c.opened_ms"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| {
                Ok(SessionRow {
                    boot: u64_of(r.get(0)?),
                    session: u64::from_ne_bytes(r.get::<_, i64>(1)?.to_ne_bytes()),
                    principal: r.get(2)?,
                    opened_ms: r.get::<_, Option<i64>>(3)?.map(u64_of),
                    closed_ms: r.get::<_, Option<i64>>(4)?.map(u64_of),
                    reason: r.get(5)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Number of batches applied, in all boots.
    ///
    /// # Errors
    /// A read error.
    pub fn batch_count(&self) -> Result<u64, LedgerError> {
        let n: i64 = self.conn.query_row("SELECT count(*) FROM batches", [], |r| r.get(0)).map_err(|e| self.err(e))?;
        Ok(u64_of(n))
    }

    /// Applies the retention policy at wall-clock time `now_ms`, in one
    /// transaction: merges old fine rows into coarse buckets, deletes
    /// expired coarse rows and old batch records.
    ///
    /// # Errors
    /// A write error (then nothing changed).
    pub fn compact(&mut self, r: &Retention, now_ms: u64) -> Result<CompactStats, LedgerError> {
        let path = self.path.clone();
        let e = |err| classify(&path, err);
        let coarse = i64_of("coarse interval", r.coarse_ms.max(1))?;
        let fine_before = i64_of("time", now_ms.saturating_sub(r.fine_for_ms))?;
        let tx = self.conn.transaction().map_err(e)?;
        let mut st = CompactStats::default();
        // Fine rows whose whole coarse bucket is old enough: summed into a
        // scratch table first, deleted, then added to the coarse rows (so a
        // fine row that starts on a bucket boundary is not counted twice).
        let cond = "start_ms < ?2 AND length_ms < ?1 AND (start_ms / ?1) * ?1 + ?1 <= ?2";
        tx.execute_batch(
            "CREATE TEMP TABLE IF NOT EXISTS compact_buf (principal, boot, session, kind, start_ms, amount);
             DELETE FROM compact_buf;",
        )
        .map_err(e)?;
        tx.execute(
            &format!(
                "INSERT INTO compact_buf SELECT principal, boot, session, kind, (start_ms / ?1) * ?1, sum(amount)
                 FROM charges WHERE {cond} GROUP BY principal, boot, session, kind, start_ms / ?1"
            ),
            params![coarse, fine_before],
        )
        .map_err(e)?;
        st.merged =
            tx.execute(&format!("DELETE FROM charges WHERE {cond}"), params![coarse, fine_before]).map_err(e)? as u64;
        st.coarse_rows = tx
            .execute(
                "INSERT INTO charges (principal, boot, session, kind, start_ms, length_ms, amount)
                 SELECT principal, boot, session, kind, start_ms, ?1, amount FROM compact_buf WHERE true
                 ON CONFLICT DO UPDATE SET amount = amount + excluded.amount",
                [coarse],
            )
            .map_err(e)? as u64;
        tx.execute_batch("DELETE FROM compact_buf;").map_err(e)?;
        if let Some(keep) = r.coarse_for_ms {
            let before = i64_of("time", now_ms.saturating_sub(keep))?;
            st.expired = tx.execute("DELETE FROM charges WHERE start_ms < ?1", [before]).map_err(e)? as u64;
        }
        let before = i64_of("time", now_ms.saturating_sub(r.batches_for_ms))?;
        st.batches_pruned = tx.execute("DELETE FROM batches WHERE end_ms < ?1", [before]).map_err(e)? as u64;
        tx.commit().map_err(e)?;
        Ok(st)
    }

    /// Copies the WAL into the main file (a checkpoint), e.g. at shutdown.
    ///
    /// # Errors
    /// A write error.
    pub fn checkpoint(&self) -> Result<(), LedgerError> {
        self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").map_err(|e| self.err(e))
    }
}

fn principal_id(tx: &Transaction<'_>, cache: &mut BTreeMap<Owner, i64>, owner: Owner) -> rusqlite::Result<i64> {
    if let Some(id) = cache.get(&owner) {
        return Ok(*id);
    }
    let name = owner.to_string();
    tx.execute("INSERT OR IGNORE INTO principals (name) VALUES (?1)", [&name])?;
    let id: i64 = tx.query_row("SELECT id FROM principals WHERE name = ?1", [&name], |r| r.get(0))?;
    cache.insert(owner, id);
    Ok(id)
}

fn kind_of(code: i64) -> Result<ResourceKind, LedgerError> {
    ResourceKind::ALL
        .into_iter()
        .find(|k| i64::from(*k as u8) == code)
        .ok_or_else(|| LedgerError::BadRow(format!("unknown resource kind {code}")))
}

fn classify(path: &Path, e: rusqlite::Error) -> LedgerError {
    let path = path.to_path_buf();
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            LedgerError::Corrupt { path, detail: e.to_string() }
        }
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            LedgerError::CannotOpen { path, detail: e.to_string() }
        }
        Some(ErrorCode::ReadOnly) => LedgerError::ReadOnly { path, detail: e.to_string() },
        _ => LedgerError::Sqlite { path, source: e },
    }
}

/// The daemon's side of the ledger: collects what the scheduler drains,
/// flushes it as numbered batches, and retries a batch that failed.
///
/// Typical use, on a background thread: [`Recorder::add`] what
/// `Rcane::drain_charges`/`drain_events` returned, [`Recorder::flush`] every
/// flush interval and on SIGTERM. A SIGKILL loses what was added since the
/// last successful flush, and nothing else.
#[derive(Debug)]
pub struct Recorder {
    ledger: Ledger,
    boot: BootId,
    next_seq: u64,
    open_since_ms: u64,
    charges: BTreeMap<(Owner, SessionId, ResourceKind), u64>,
    sessions: Vec<SessionRecord>,
    pending: VecDeque<Batch>,
    max_pending: usize,
}

/// What [`Recorder::flush`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushOutcome {
    /// Batches written (including earlier ones that had failed).
    pub written: usize,
    /// Batches still waiting because a write failed.
    pub pending: usize,
}

impl Recorder {
    /// Starts recording a new boot at wall-clock `started_ms`.
    ///
    /// # Errors
    /// A write error.
    pub fn new(mut ledger: Ledger, started_ms: u64, node: &str) -> Result<Recorder, LedgerError> {
        let boot = ledger.begin_boot(started_ms, node)?;
        Ok(Recorder {
            ledger,
            boot,
            next_seq: 0,
            open_since_ms: started_ms,
            charges: BTreeMap::new(),
            sessions: Vec::new(),
            pending: VecDeque::new(),
            max_pending: 1024,
        })
    }

    /// The boot being recorded.
    pub fn boot(&self) -> BootId {
        self.boot
    }

    /// The ledger (for queries).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Adds charges and session events to the current interval (charges of
    /// the same session and kind are summed).
    pub fn add(&mut self, charges: &[Charge], sessions: &[SessionRecord]) {
        for c in charges {
            let e = self.charges.entry((c.owner, c.session, c.kind)).or_default();
            *e = e.saturating_add(c.amount);
        }
        self.sessions.extend_from_slice(sessions);
    }

    /// Seals the current interval (ending at `now_ms`) into a batch and
    /// writes every batch not yet written, oldest first.
    ///
    /// # Errors
    /// The write error; the batches stay pending and the next flush retries
    /// them (with the same `(boot, seq)`, so a batch that was in fact
    /// committed is not counted twice).
    pub fn flush(&mut self, now_ms: u64) -> Result<FlushOutcome, LedgerError> {
        if !self.charges.is_empty() || !self.sessions.is_empty() {
            let charges = std::mem::take(&mut self.charges)
                .into_iter()
                .map(|((owner, session, kind), amount)| Charge { owner, session, kind, amount })
                .collect();
            let batch = Batch {
                boot: self.boot,
                seq: self.next_seq,
                start_ms: self.open_since_ms,
                end_ms: now_ms.max(self.open_since_ms),
                charges,
                sessions: std::mem::take(&mut self.sessions),
            };
            if self.pending.len() >= self.max_pending {
                // The disk has been failing for long: merge into the newest
                // unwritten batch (never written, so merging is safe).
                if let Some(last) = self.pending.back_mut() {
                    last.charges.extend(batch.charges);
                    last.sessions.extend(batch.sessions);
                    last.end_ms = batch.end_ms;
                }
            } else {
                self.pending.push_back(batch);
                self.next_seq += 1;
            }
        }
        self.open_since_ms = now_ms.max(self.open_since_ms);
        let mut out = FlushOutcome::default();
        while let Some(b) = self.pending.front() {
            self.ledger.write(b)?;
            self.pending.pop_front();
            out.written += 1;
        }
        out.pending = self.pending.len();
        Ok(out)
    }

    /// Batches not yet written.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}
