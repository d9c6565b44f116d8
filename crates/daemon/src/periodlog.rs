//! The period log (`anode node --period-log FILE`, Fig. 11): every VP's
//! completed scheduling periods, one CSV line each. The event loop only
//! formats lines into a buffer; a thread of its own writes them, so a slow
//! disk never stalls the loop (it did: a 4 ms stall in a Fig. 11 run while
//! builds kept the disk busy). Batches go every 100 ms over a bounded
//! channel; if the writer falls 256 batches behind, batches are dropped and
//! counted rather than the loop waiting.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::daemon::PERIOD_LOG_HEADER;

/// Batches the writer may fall behind before batches are dropped.
const BACKLOG: usize = 256;

/// How often the loop hands a batch to the writer.
const BATCH_INTERVAL: Duration = Duration::from_millis(100);

/// The loop's side of the period log.
pub(crate) struct PeriodLog {
    buf: String,
    last: Instant,
    tx: Option<SyncSender<String>>,
    writer: Option<JoinHandle<std::io::Result<()>>>,
    /// Batches dropped because the writer was behind.
    pub dropped: u64,
}

impl PeriodLog {
    /// Creates `file` (with its header) and starts the writer thread.
    pub(crate) fn create(file: &Path) -> std::io::Result<PeriodLog> {
        let f = std::fs::File::create(file)?;
        let mut w = std::io::BufWriter::new(f);
        writeln!(w, "{PERIOD_LOG_HEADER}")?;
        w.flush()?;
        let (tx, rx) = sync_channel::<String>(BACKLOG);
        let writer = std::thread::Builder::new().name("period-log".into()).spawn(move || {
            for batch in rx {
                w.write_all(batch.as_bytes())?;
                w.flush()?;
            }
            w.flush()
        })?;
        Ok(PeriodLog { buf: String::new(), last: Instant::now(), tx: Some(tx), writer: Some(writer), dropped: 0 })
    }

    /// Appends one record.
    pub(crate) fn record(&mut self, r: &anode_sched::PeriodRecord) {
        let _ = writeln!(
            self.buf,
            "{},{},{},{},{},{},{},{}",
            r.vp,
            r.owner,
            r.start_ns,
            r.end_ns,
            r.slice_ns,
            r.received_ns,
            r.slack_ns,
            u8::from(r.idle)
        );
    }

    /// Hands the buffer to the writer every [`BATCH_INTERVAL`], or now.
    pub(crate) fn flush(&mut self, now: bool) {
        if self.buf.is_empty() || (!now && self.last.elapsed() < BATCH_INTERVAL) {
            return;
        }
        self.last = Instant::now();
        let batch = std::mem::take(&mut self.buf);
        if let Some(tx) = &self.tx {
            match tx.try_send(batch) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped += 1,
            }
        }
    }

    /// Hands over what is left and waits for the writer (at exit).
    pub(crate) fn finish(&mut self) {
        self.flush(true);
        self.tx = None;
        if let Some(w) = self.writer.take() {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "the period log could not be written"),
                Err(_) => tracing::warn!("the period log's writer panicked"),
            }
        }
        if self.dropped > 0 {
            tracing::warn!(batches = self.dropped, "period log batches dropped: its writer fell behind");
        }
    }
}
