//! The Fig. 11 PNG: CPU share per period over time, one panel per source
//! (anode, linux-deadline, linux-cfs, ...), one trace per load, with
//! `plotters`' bitmap backend. Text is drawn with DejaVu Sans compiled into
//! the binary (the `dejavu` crate through plotters' `ab_glyph` feature), so
//! no system font or library is needed.

use anode_sched::trace::{Trace, TraceRow};
use anyhow::{Result, anyhow};
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 6] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

pub(super) fn register_font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok { Ok(()) } else { Err(anyhow!("the embedded DejaVu Sans font did not load")) }
}

/// Draws the traces of `t` into a PNG at `out`.
pub fn fig11(t: &Trace, out: &Path) -> Result<()> {
    register_font()?;
    let mut sources: Vec<String> = Vec::new();
    for (s, _) in t.series() {
        if !sources.contains(&s) {
            sources.push(s);
        }
    }
    if sources.is_empty() {
        return Err(anyhow!("no rows to plot"));
    }
    let xmax = t.rows.iter().map(|r| (r.start_ns + r.length_ns) as f64 / 1e9).fold(1.0, f64::max);
    let height = 300 * sources.len() as u32;
    let root = BitMapBackend::new(out, (1200, height)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    for (area, source) in root.split_evenly((sources.len(), 1)).iter().zip(&sources) {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{source}: CPU share per scheduling period"), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..xmax, 0f64..100f64)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("share of the CPU (%)")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|x| e(&x))?;
        let loads: Vec<String> = t.series().into_iter().filter(|(s, _)| s == source).map(|(_, l)| l).collect();
        for (i, load) in loads.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let rows: Vec<&TraceRow> = t.rows.iter().filter(|r| r.source == *source && r.load == *load).collect();
            let label = match rows.first() {
                Some(r) if r.slice_ns > 0 => format!(
                    "{load}: {:.0} % in {} ms",
                    100.0 * r.slice_ns as f64 / r.length_ns as f64,
                    r.length_ns as f64 / 1e6
                ),
                Some(r) => format!("{load}: best effort ({} ms periods)", r.length_ns as f64 / 1e6),
                None => load.clone(),
            };
            // One point per period, at its end (the paper plots the share
            // "between consecutive deadlines").
            let pts = rows.iter().map(|r| ((r.start_ns + r.length_ns) as f64 / 1e9, 100.0 * r.share()));
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(1)))
                .map_err(|x| e(&x))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 14).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Draws a chart's legend at `pos` in the box every figure uses (white,
/// 85 % opaque, black border, sans-serif at `font` points).
///
/// # Errors
/// The backend's drawing error.
pub fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
    font: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(pos)
        .label_font(("sans-serif", font))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}
