//! The accounting ledger's writer (RCANE §IV-A, docs/ledger.md): what the
//! node's sessions were charged, drained from the core once a second and
//! written to `<run_dir>/ledger.db` by a thread of its own, off the data
//! path. At SIGTERM the loop drains once more and the thread flushes before
//! the daemon exits, so nothing is lost; a SIGKILL loses at most the last
//! flush interval ([`FLUSH_INTERVAL`]).

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anode_ledger::{Ledger, LedgerConfig, Recorder, SessionRecord};
use anode_sched::{Charge, SessionEvent};
use tracing::warn;

/// How often charges go to the ledger.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Batches in flight to the writer before the loop waits for it (it never
/// does in practice: one batch a second).
const QUEUE: usize = 64;

type Msg = (Vec<Charge>, Vec<SessionRecord>);

/// The writer thread and the channel to it.
pub(crate) struct LedgerWriter {
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl LedgerWriter {
    /// Opens (or creates) the ledger at `path` and starts the writer.
    pub fn start(path: &Path, node: &str) -> Result<LedgerWriter, String> {
        let ledger = Ledger::open(path, LedgerConfig::default()).map_err(|e| e.to_string())?;
        let rec = Recorder::new(ledger, wall_ms(), node).map_err(|e| e.to_string())?;
        let (tx, rx) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("anode-ledger".into())
            .spawn(move || writer(rec, rx))
            .map_err(|e| format!("starting the ledger thread: {e}"))?;
        Ok(LedgerWriter { tx: Some(tx), thread: Some(thread) })
    }

    /// Hands charges and session events to the writer.
    pub fn send(&self, charges: Vec<Charge>, events: &[SessionEvent]) {
        if charges.is_empty() && events.is_empty() {
            return;
        }
        let at = wall_ms();
        let sessions = events.iter().map(|e| SessionRecord::from_event(e, at)).collect();
        if let Some(tx) = &self.tx
            && tx.send((charges, sessions)).is_err()
        {
            warn!("the ledger writer is gone: charges not recorded");
        }
    }

    /// Closes the channel and waits for the final flush.
    pub fn finish(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LedgerWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Writes what the daemon sends; sleeps (no timer: an idle node stays
/// asleep) until the next batch or the channel's end.
fn writer(mut rec: Recorder, rx: Receiver<Msg>) {
    loop {
        match rx.recv() {
            Ok((c, s)) => {
                rec.add(&c, &s);
                // Take whatever else is queued, then write one batch.
                while let Ok((c, s)) = rx.try_recv() {
                    rec.add(&c, &s);
                }
                if let Err(e) = rec.flush(wall_ms()) {
                    warn!(error = %e, "ledger write failed; kept for the next flush");
                }
            }
            Err(_) => {
                if let Err(e) = rec.flush(wall_ms()) {
                    warn!(error = %e, "final ledger write failed");
                }
                return;
            }
        }
    }
}
