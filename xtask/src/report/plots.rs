//! The report's plots, drawn with `plotters` as SVG text to inline in the page: hand-off
//! against clients on one lock, acquisitions per second against clients (peers beside
//! ours), the client sweep's turns per second and p99 against clients, and each store's
//! uncontended cycle against its raw floor.

use anyhow::{Result, anyhow};
use conformance_tests::bench;
use plotters::prelude::*;

use super::{Collected, summary::floor_ratio};

/// Width and height of every plot, in pixels.
const SIZE: (u32, u32) = (760, 420);

/// One line of a plot: its label and its points.
type Series = (String, Vec<(f64, f64)>);

/// The runs of separate clients holding 1 ms, as one series per store (and per peer), each
/// point `(clients, value(run))`.
fn fleet_series(
    benches: &[bench::Report],
    value: impl Fn(&bench::FleetRun) -> Option<f64>,
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for report in benches {
        for run in &report.fleets {
            if run.fleet.hold != std::time::Duration::from_millis(1) {
                continue;
            }
            let Some(y) = value(run) else { continue };
            let label = series_label(run.peer.as_deref(), &report.store);
            let point = (run.fleet.clients as f64, y);
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, points)) => points.push(point),
                None => series.push((label, vec![point])),
            }
        }
    }
    for (_, points) in &mut series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// The label of a series: the store, or the peer library and its store.
fn series_label(peer: Option<&str>, store: &str) -> String {
    match peer {
        Some(peer) => format!("{peer} ({store})"),
        None => store.to_owned(),
    }
}

/// A log-log line plot of `series`.
fn lines(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<String> {
    let mut svg = String::new();
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x_max, mut y_min, mut y_max) = (2.0_f64, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if y_min > y_max {
        (y_min, y_max) = (0.1, 1.0);
    }
    let y_range = (y_min * 0.5).max(1e-3)..(y_max * 2.0).max(1e-2);
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((1.0..x_max * 2.0).log_scale(), y_range.log_scale())
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, (label, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(svg)
}

/// Hand-off p50 to another client against the number of clients (one holds, the others
/// wait), in ms.
pub(crate) fn handoff_vs_waiters(collected: &Collected) -> Result<String> {
    let series = fleet_series(&collected.benches, |run| {
        (run.fleet.handoff.samples > 0).then_some(run.fleet.handoff.p50.as_secs_f64() * 1e3)
    });
    lines(
        "Hand-off p50 to another client (hold 1 ms)",
        "clients on one lock",
        "ms",
        &series,
    )
}

/// Acquisitions per second against the number of clients, peers beside ours.
pub(crate) fn rate_vs_clients(collected: &Collected) -> Result<String> {
    let series = fleet_series(&collected.benches, |run| {
        (run.fleet.per_second > 0.0).then_some(run.fleet.per_second)
    });
    lines(
        "Acquisitions per second on one lock (hold 1 ms)",
        "clients on one lock",
        "acquisitions/s",
        &series,
    )
}

/// The client sweep per store (and per peer): `value` of each step against its clients.
fn sweep_series(
    benches: &[bench::Report],
    value: impl Fn(&bench::SweepStep) -> Option<f64>,
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for report in benches {
        for step in &report.sweep {
            let Some(y) = value(step) else { continue };
            let label = series_label(step.peer.as_deref(), &report.store);
            let point = (step.clients as f64, y);
            match series.iter_mut().find(|(l, _)| *l == label) {
                Some((_, points)) => points.push(point),
                None => series.push((label, vec![point])),
            }
        }
    }
    series
}

/// The client sweep's turns per second against its clients.
pub(crate) fn sweep_rate(collected: &Collected) -> Result<String> {
    let series = sweep_series(&collected.benches, |step| {
        (step.per_second > 0.0).then_some(step.per_second)
    });
    lines(
        "Client sweep: turns per second (many names, Zipf)",
        "separate clients",
        "turns/s",
        &series,
    )
}

/// The client sweep's p99 turn latency against its clients, in ms.
pub(crate) fn sweep_p99(collected: &Collected) -> Result<String> {
    let series = sweep_series(&collected.benches, |step| {
        (step.turn.samples > 0).then_some(step.turn.p99.as_secs_f64() * 1e3)
    });
    lines(
        "Client sweep: p99 of a turn (acquire + release)",
        "separate clients",
        "ms",
        &series,
    )
}

/// Each store's uncontended cycle against its raw floor, as bars.
pub(crate) fn floor_ratios(collected: &Collected) -> Result<String> {
    let bars: Vec<(&str, f64)> = collected
        .benches
        .iter()
        .filter_map(|b| floor_ratio(b).map(|r| (b.store.as_str(), r)))
        .collect();
    let top = bars.iter().map(|b| b.1).fold(1.5_f64, f64::max) * 1.3;
    let rows = bars.len().max(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Uncontended acquire + release / the store's raw floor",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .build_cartesian_2d(0.0..top, 0.0..rows)
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc("ratio (1.0 = the raw floor)")
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (i, &(store, ratio)) in bars.iter().enumerate() {
            let y = rows - 1.0 - i as f64;
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series([Rectangle::new(
                    [(0.0, y + 0.15), (ratio, y + 0.85)],
                    color.filled(),
                )])
                .map_err(|e| anyhow!("{e}"))?;
            chart
                .draw_series([Text::new(
                    format!("{store} {ratio:.2}x"),
                    (ratio + top * 0.01, y + 0.6),
                    ("sans-serif", 14),
                )])
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .draw_series(LineSeries::new(
                [(1.0, 0.0), (1.0, rows)],
                BLACK.stroke_width(1),
            ))
            .map_err(|e| anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(svg)
}
