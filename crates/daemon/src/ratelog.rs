//! Rate limits for every log line, so no input can flood the log.
//!
//! Any line that a packet, a local client, a user or a module can cause
//! must be bounded, whichever crate writes it (the daemon, the sandbox, the
//! credential verifier, the security layer). Rather than guard each call, a
//! [`tracing_subscriber::Layer`] limits every *callsite* (each `info!`,
//! `warn!`, ... in the source) to a burst of [`BURST`] lines and then
//! [`PER_SEC`] lines a second; lines beyond that are dropped and counted.
//! [`report`], called by the daemon once a second, writes one line with the
//! count of what was suppressed since the last report, and at which source
//! lines. Lines that no input can repeat (start, stop, configuration) never
//! reach the limit.
//!
//! The state is process-wide (one subscriber per process), behind a mutex:
//! log lines are rare next to packets, and the drop logs of the data path
//! are themselves one line per reason per second (`droplog`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tracing::callsite::Identifier;
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines one callsite may write at once.
pub const BURST: f64 = 20.0;
/// Lines a callsite may write per second after its burst.
pub const PER_SEC: f64 = 5.0;
/// The target of the report line (never limited itself).
pub const REPORT_TARGET: &str = "anode::ratelimit";
/// The target of the drop lines, which `droplog` already limits to one line
/// per drop reason per second (one callsite writes every reason's line, so
/// a per-callsite limit would hide reasons).
pub const DROPS_TARGET: &str = "anode::drops";

struct Site {
    tokens: f64,
    at: Instant,
    suppressed: u64,
    place: String,
}

#[derive(Default)]
struct State {
    sites: HashMap<Identifier, Site>,
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(Mutex::default)
}

/// The layer that applies the limit (install it before the formatting layer).
#[derive(Debug, Clone, Copy, Default)]
pub struct RateLimit;

/// The rate-limiting layer for the process's subscriber.
pub fn layer() -> RateLimit {
    RateLimit
}

impl<S: Subscriber> Layer<S> for RateLimit {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if meta.target() == REPORT_TARGET || meta.target() == DROPS_TARGET {
            return true;
        }
        let now = Instant::now();
        let Ok(mut st) = state().lock() else { return true };
        let site = st.sites.entry(meta.callsite()).or_insert_with(|| Site {
            tokens: BURST,
            at: now,
            suppressed: 0,
            place: format!("{}:{}", meta.file().unwrap_or(meta.target()), meta.line().unwrap_or(0)),
        });
        site.tokens = (site.tokens + now.duration_since(site.at).as_secs_f64() * PER_SEC).min(BURST);
        site.at = now;
        if site.tokens >= 1.0 {
            site.tokens -= 1.0;
            true
        } else {
            site.suppressed += 1;
            false
        }
    }
}

/// Whether lines were suppressed since the last [`report`] (so a report
/// is due).
pub fn pending() -> bool {
    state().lock().is_ok_and(|st| st.sites.values().any(|s| s.suppressed > 0))
}

/// Lines suppressed since the last call, per source place, most first;
/// resets the counts.
pub fn take_suppressed() -> Vec<(String, u64)> {
    let Ok(mut st) = state().lock() else { return Vec::new() };
    let mut v: Vec<(String, u64)> = st
        .sites
        .values_mut()
        .filter(|s| s.suppressed > 0)
        .map(|s| (s.place.clone(), std::mem::take(&mut s.suppressed)))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// Writes one line with what the limit suppressed since the last report,
/// if anything.
pub fn report() {
    let v = take_suppressed();
    if v.is_empty() {
        return;
    }
    let total: u64 = v.iter().map(|(_, n)| n).sum();
    let places: Vec<String> = v.iter().take(8).map(|(p, n)| format!("{p} x{n}")).collect();
    tracing::warn!(target: REPORT_TARGET, suppressed = total, at = %places.join(", "),
                   "log lines suppressed by the rate limit");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tracing_subscriber::layer::SubscriberExt;

    /// Counts the events that reach it.
    #[derive(Clone, Default)]
    struct Count(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Count {
        fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
            if let Ok(mut v) = self.0.lock() {
                v.push(event.metadata().target().to_string());
            }
        }
    }

    #[test]
    fn a_callsite_is_limited_and_the_rest_counted() {
        let seen = Count::default();
        let sub = tracing_subscriber::registry().with(layer()).with(seen.clone());
        tracing::subscriber::with_default(sub, || {
            for i in 0..1000 {
                tracing::info!(i, "flood");
            }
            tracing::info!("another place");
            report();
        });
        let v = seen.0.lock().map(|v| v.clone()).unwrap_or_default();
        let floods = v.iter().filter(|t| t.as_str() != REPORT_TARGET).count();
        // The burst, one line for the other callsite, perhaps a token refilled meanwhile.
        assert!((21..=24).contains(&floods), "{floods} lines passed");
        assert_eq!(v.last().map(String::as_str), Some(REPORT_TARGET), "the report line is written");
        assert!(take_suppressed().is_empty(), "report took the counts");
    }
}
