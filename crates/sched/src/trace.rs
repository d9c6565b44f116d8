//! The CPU trace format of the Fig. 11 experiment (RCANE §VI-A), shared by
//! the anode node, the Linux baselines (`anode experiment fig11`) and the
//! plot (`anode experiment plot-fig11`).
//!
//! One CSV file, UTF-8, one row per period of one load:
//!
//! ```text
//! # key=value            (optional comment lines anywhere: run metadata)
//! source,load,period,start_ns,length_ns,slice_ns,received_ns,share
//! linux-deadline,B,0,3000012345,4000000,400000,400120,0.100030
//! ```
//!
//! | column | meaning |
//! |---|---|
//! | `source` | what produced the row: `anode`, `anode-sim`, `linux-deadline`, `linux-cfs`, ... |
//! | `load` | the load's name (`A`..`D` in Fig. 11) |
//! | `period` | index of the period in that load's own sequence, from 0 |
//! | `start_ns` | start of the period, ns since the experiment began |
//! | `length_ns` | its length (the VP's period; A's notional 100 ms) |
//! | `slice_ns` | CPU guaranteed in it (0 without a guarantee) |
//! | `received_ns` | CPU the load received in it, by the thread CPU clock |
//! | `share` | `received_ns / length_ns`, a fraction of one CPU |
//!
//! Names may not contain `,`, `#` or line breaks. Comment lines are
//! `# key=value`; the experiment records e.g. `steal_ticks` there.

use core::fmt;

/// The header line.
pub const HEADER: &str = "source,load,period,start_ns,length_ns,slice_ns,received_ns,share";

/// One period of one load.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow {
    /// What produced it.
    pub source: String,
    /// Which load.
    pub load: String,
    /// Index of the period in the load's sequence.
    pub period: u64,
    /// Start, ns since the experiment began.
    pub start_ns: u64,
    /// Length, ns (≥ 1).
    pub length_ns: u64,
    /// CPU guaranteed, ns.
    pub slice_ns: u64,
    /// CPU received, ns.
    pub received_ns: u64,
}

impl TraceRow {
    /// Received CPU as a fraction of the period.
    pub fn share(&self) -> f64 {
        self.received_ns as f64 / self.length_ns.max(1) as f64
    }

    /// Received CPU as a fraction of the slice (`None` without a slice).
    pub fn of_slice(&self) -> Option<f64> {
        (self.slice_ns > 0).then(|| self.received_ns as f64 / self.slice_ns as f64)
    }
}

impl fmt::Display for TraceRow {
    /// The CSV line, without a line break.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{},{},{},{},{},{:.6}",
            self.source,
            self.load,
            self.period,
            self.start_ns,
            self.length_ns,
            self.slice_ns,
            self.received_ns,
            self.share()
        )
    }
}

/// A malformed trace line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Not 8 comma-separated fields.
    #[error("line {line}: {fields} fields, expected 8")]
    Fields {
        /// 1-based line number.
        line: usize,
        /// Fields found.
        fields: usize,
    },
    /// A numeric field does not parse.
    #[error("line {line}: column {column} is not a number")]
    Number {
        /// 1-based line number.
        line: usize,
        /// Column name.
        column: &'static str,
    },
    /// A period of length 0, or a `share` that disagrees with
    /// `received_ns / length_ns` by more than 1e-5.
    #[error("line {line}: inconsistent row")]
    Inconsistent {
        /// 1-based line number.
        line: usize,
    },
    /// An empty source or load name.
    #[error("line {line}: empty name")]
    EmptyName {
        /// 1-based line number.
        line: usize,
    },
    /// The first non-comment line is not [`HEADER`].
    #[error("missing header line `{HEADER}`")]
    NoHeader,
}

/// A parsed trace: rows and `# key=value` metadata, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The rows.
    pub rows: Vec<TraceRow>,
    /// Metadata from comment lines.
    pub meta: Vec<(String, String)>,
}

impl Trace {
    /// Parses a whole file. A header must come before the first row;
    /// further header lines (files concatenated) are skipped.
    ///
    /// # Errors
    /// The first malformed line's [`TraceError`].
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut t = Trace::default();
        let mut header = false;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if let Some(c) = line.strip_prefix('#') {
                if let Some((k, v)) = c.trim().split_once('=') {
                    t.meta.push((k.trim().to_string(), v.trim().to_string()));
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            if line == HEADER {
                header = true;
                continue;
            }
            if !header {
                return Err(TraceError::NoHeader);
            }
            t.rows.push(parse_row(i + 1, line)?);
        }
        Ok(t)
    }

    /// The file text: metadata, header, rows.
    pub fn to_csv(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.meta {
            s.push_str(&format!("# {k}={v}\n"));
        }
        s.push_str(HEADER);
        s.push('\n');
        for r in &self.rows {
            s.push_str(&r.to_string());
            s.push('\n');
        }
        s
    }

    /// The `(source, load)` pairs in order of first appearance.
    pub fn series(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = Vec::new();
        for r in &self.rows {
            if !v.iter().any(|(s, l)| *s == r.source && *l == r.load) {
                v.push((r.source.clone(), r.load.clone()));
            }
        }
        v
    }
}

fn parse_row(line: usize, s: &str) -> Result<TraceRow, TraceError> {
    let f: Vec<&str> = s.split(',').collect();
    let [source, load, period, start, length, slice, received, share] = f[..] else {
        return Err(TraceError::Fields { line, fields: f.len() });
    };
    let num = |v: &str, column: &'static str| v.trim().parse::<u64>().map_err(|_| TraceError::Number { line, column });
    if source.is_empty() || load.is_empty() {
        return Err(TraceError::EmptyName { line });
    }
    let row = TraceRow {
        source: source.to_string(),
        load: load.to_string(),
        period: num(period, "period")?,
        start_ns: num(start, "start_ns")?,
        length_ns: num(length, "length_ns")?,
        slice_ns: num(slice, "slice_ns")?,
        received_ns: num(received, "received_ns")?,
    };
    let share: f64 = share.trim().parse().map_err(|_| TraceError::Number { line, column: "share" })?;
    if row.length_ns == 0 || !share.is_finite() || (share - row.share()).abs() > 1e-5 {
        return Err(TraceError::Inconsistent { line });
    }
    Ok(row)
}

/// Statistics of one load's periods.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadStats {
    /// Source.
    pub source: String,
    /// Load.
    pub load: String,
    /// Periods.
    pub periods: usize,
    /// Guaranteed share (slice / length of the first row), fraction.
    pub guaranteed: f64,
    /// Mean received share, fraction of one CPU.
    pub mean: f64,
    /// 1st percentile of the received share per period.
    pub p1: f64,
    /// 5th percentile.
    pub p5: f64,
    /// Median.
    pub p50: f64,
    /// Fraction of periods with at least 95 % of the slice (`None` without
    /// a slice).
    pub met_95: Option<f64>,
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Statistics for every `(source, load)` of a trace.
pub fn stats(rows: &[TraceRow]) -> Vec<LoadStats> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.source.as_str(), r.load.as_str())) {
            keys.push((&r.source, &r.load));
        }
    }
    keys.into_iter()
        .map(|(source, load)| {
            let mine: Vec<&TraceRow> = rows.iter().filter(|r| r.source == source && r.load == load).collect();
            let mut shares: Vec<f64> = mine.iter().map(|r| r.share()).collect();
            shares.sort_by(f64::total_cmp);
            let with_slice: Vec<f64> = mine.iter().filter_map(|r| r.of_slice()).collect();
            let met_95 = (!with_slice.is_empty())
                .then(|| with_slice.iter().filter(|x| **x >= 0.95).count() as f64 / with_slice.len() as f64);
            LoadStats {
                source: source.to_string(),
                load: load.to_string(),
                periods: mine.len(),
                guaranteed: mine.first().map_or(0.0, |r| r.slice_ns as f64 / r.length_ns.max(1) as f64),
                mean: shares.iter().sum::<f64>() / shares.len().max(1) as f64,
                p1: quantile(&shares, 0.01),
                p5: quantile(&shares, 0.05),
                p50: quantile(&shares, 0.50),
                met_95,
            }
        })
        .collect()
}

/// Turns CPU samples `(start_ns, received_ns)` of a load without a
/// guarantee into rows of a notional period (Fig. 11 gives A 100 ms): each
/// sample counts in the window its start falls in; windows from `from_ns`
/// to `to_ns`, the last one only if complete.
pub fn windows(
    source: &str,
    load: &str,
    samples: impl IntoIterator<Item = (u64, u64)>,
    from_ns: u64,
    to_ns: u64,
    length_ns: u64,
) -> Vec<TraceRow> {
    let length_ns = length_ns.max(1);
    let n = (to_ns.saturating_sub(from_ns) / length_ns) as usize;
    let mut got = vec![0u64; n];
    for (start, received) in samples {
        if start < from_ns {
            continue;
        }
        if let Some(w) = got.get_mut(((start - from_ns) / length_ns) as usize) {
            *w += received;
        }
    }
    got.into_iter()
        .enumerate()
        .map(|(i, received_ns)| TraceRow {
            source: source.to_string(),
            load: load.to_string(),
            period: i as u64,
            start_ns: from_ns + i as u64 * length_ns,
            length_ns,
            slice_ns: 0,
            received_ns,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn row(load: &str, slice: u64, received: u64) -> TraceRow {
        TraceRow {
            source: "t".into(),
            load: load.into(),
            period: 0,
            start_ns: 0,
            length_ns: 4_000_000,
            slice_ns: slice,
            received_ns: received,
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        let t = Trace {
            rows: vec![row("B", 400_000, 400_120), row("A", 0, 1_000_000)],
            meta: vec![("steal_ticks".into(), "3".into())],
        };
        let text = t.to_csv();
        assert!(text.contains("t,B,0,0,4000000,400000,400120,0.100030"));
        assert_eq!(Trace::parse(&text), Ok(t));
        assert_eq!(Trace::parse("t,B,0,0,1,0,0,0\n"), Err(TraceError::NoHeader));
        let h = |l: &str| Trace::parse(&format!("{HEADER}\n{l}\n"));
        assert_eq!(h("t,B,0,0,1,0,0"), Err(TraceError::Fields { line: 2, fields: 7 }));
        assert_eq!(h("t,B,x,0,1,0,0,0"), Err(TraceError::Number { line: 2, column: "period" }));
        assert_eq!(h("t,B,0,0,1,0,0,z"), Err(TraceError::Number { line: 2, column: "share" }));
        assert_eq!(h("t,B,0,0,0,0,0,0"), Err(TraceError::Inconsistent { line: 2 }));
        assert_eq!(h("t,B,0,0,2,0,1,0.9"), Err(TraceError::Inconsistent { line: 2 }));
        assert_eq!(h(",B,0,0,2,0,1,0.5"), Err(TraceError::EmptyName { line: 2 }));
    }

    #[test]
    fn statistics() {
        let mut rows: Vec<TraceRow> = (0..99).map(|_| row("B", 400_000, 400_000)).collect();
        rows.push(row("B", 400_000, 200_000));
        let s = &stats(&rows)[0];
        assert_eq!(s.periods, 100);
        assert_eq!(s.met_95, Some(0.99));
        assert_eq!((s.p1, s.p50), (0.05, 0.1));
        assert!((s.guaranteed - 0.1).abs() < 1e-12);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn notional_windows() {
        let w = windows("s", "A", [(0, 5), (99, 5), (100, 7), (250, 1), (310, 9)], 0, 300, 100);
        assert_eq!(w.iter().map(|r| r.received_ns).collect::<Vec<_>>(), vec![10, 7, 1]);
        assert_eq!(w[2].start_ns, 200);
    }
}
