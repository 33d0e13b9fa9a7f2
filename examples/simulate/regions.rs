//! `--regions`: the running example across three regions, one limit per customer, with the
//! busiest region cut off from the global store; the two-tier store beside each region
//! counting alone. The table per customer and the chart of acme's admissions by region.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use plotters::prelude::{
    Color, DashedLineSeries, FontStyle, IntoDrawingArea, IntoFont, LineSeries, RGBColor, Rectangle,
    SVGBackend, ShapeStyle, Text, WHITE,
};
use tollgate_simulator::{
    Counting, Phase, RegionFault, Regions, RegionsReport, ScenarioError, ShareBy,
};

use crate::chart::{COLORS, panel, tight_text};
use crate::output::{markdown, rate_text};

/// Runs `--regions`: the scenario the flags describe, its tables on stdout, its chart
/// where `--chart` says.
pub(crate) fn run(flags: &crate::Flags) -> ExitCode {
    let mut scenario = Regions::default();
    if let Some(n) = flags.limit {
        scenario = scenario.limit(n);
    }
    if let Some(n) = flags.window_secs {
        scenario = scenario.window_secs(n);
    }
    if let Some(n) = flags.normal_secs {
        scenario = scenario.normal_secs(n);
    }
    if let Some(n) = flags.outage_secs {
        scenario = scenario.fault_secs(n);
    }
    if let Some(n) = flags.recovery_secs {
        scenario = scenario.recovery_secs(n);
    }
    if let Some(n) = flags.wan_rtt_ms {
        // The timeout stays three round trips.
        scenario = scenario.wan_rtt_ms(n).wan_timeout_ms(n.saturating_mul(3));
    }
    if let Some(fault) = &flags.region_fault {
        scenario = scenario.fault(fault.clone());
    }
    if let Some(share_by) = flags.share_by {
        scenario = scenario.share_by(share_by);
    }
    if let Err(error) = scenario.validate() {
        eprintln!(
            "simulate: {}\nTry `simulate --help` for the flags.",
            flag_error(&error)
        );
        return ExitCode::from(2);
    }
    let report = match scenario.run_blocking() {
        Ok(report) => report,
        Err(error) => {
            eprintln!("simulate: {error}");
            return ExitCode::FAILURE;
        }
    };
    let text = table(&scenario, &report);
    // A closed pipe (`| head`) is the reader's choice, not a failure.
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("simulate: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &flags.chart {
        let written = chart(&scenario, &report)
            .map_err(|e| e.to_string())
            .and_then(|svg| std::fs::write(path, svg).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!(
                "simulate: cannot write the chart to {}: {e}",
                path.display()
            );
            return ExitCode::FAILURE;
        }
        eprintln!("simulate: chart written to {}", path.display());
    }
    if report.unexpected_statuses() > 0 {
        eprintln!("simulate: some requests were answered with a status other than 200, 429 or 503");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The limit's line in the chart.
const LIMIT: RGBColor = RGBColor(0xc0, 0x20, 0x20);

/// `--region-fault`: `partition:REGION`, `store-lost:REGION` or `global-lost`.
pub(crate) fn parse_fault(value: &str) -> Result<RegionFault, String> {
    match value.split_once(':') {
        Some(("partition", region)) if !region.is_empty() => {
            Ok(RegionFault::Partition(region.to_owned()))
        }
        Some(("store-lost", region)) if !region.is_empty() => {
            Ok(RegionFault::StoreLost(region.to_owned()))
        }
        None if value == "global-lost" => Ok(RegionFault::GlobalLost),
        _ => Err(format!(
            "{value:?} is not partition:REGION, store-lost:REGION or global-lost"
        )),
    }
}

pub(crate) fn parse_share_by(value: &str) -> Result<ShareBy, String> {
    value.parse().map_err(|e: ScenarioError| e.to_string())
}

/// The fault phase's name in the tables.
fn fault_phase(fault: &RegionFault) -> &'static str {
    match fault {
        RegionFault::Partition(_) => "partition",
        RegionFault::GlobalLost => "global lost",
        RegionFault::StoreLost(_) => "store lost",
        _ => "fault",
    }
}

fn phase_name(scenario: &Regions, phase: Phase) -> &'static str {
    match phase {
        Phase::Outage => fault_phase(scenario.fault_value()),
        other => other.name(),
    }
}

/// A scenario error in terms of the flags.
pub(crate) fn flag_error(error: &ScenarioError) -> String {
    match error {
        ScenarioError::OutOfRange {
            setting: "fault_secs",
            value,
            min,
            max,
        } => format!("--outage-secs: {value} is out of range ({min} to {max})"),
        ScenarioError::UnknownRegion(_) => format!("--region-fault: {error}"),
        other => crate::flag_error(other),
    }
}

/// The tables: what the run is, then one table per customer, each way of counting by
/// phase: admitted per second, the worst window of all regions together (and its share of
/// the limit), each region's admitted per second, and the WAN calls per request.
pub(crate) fn table(scenario: &Regions, report: &RegionsReport) -> String {
    let mut out = String::new();
    let limit = scenario.limit_value();
    let window = scenario.window_secs_value();
    let regions: Vec<String> = scenario
        .regions_value()
        .iter()
        .map(|r| format!("{} {} instances", r.name(), r.instances()))
        .collect();
    let _ = writeln!(
        out,
        "tollgate simulator, one limit across regions: {limit} per {window} s per customer, all \
         regions together; {} regions ({}).",
        regions.len(),
        regions.join(", ")
    );
    for counting in scenario.counting_value() {
        let what = match counting {
            Counting::TwoTier => format!(
                "each region's store leases each caller's global quota from a global store \
                 {} ms away (WAN round trip), a lease covering the region's demand over the \
                 round trip and {} ms more, and decides on what it leased; cut off, a region \
                 enforces its share of the limit (by {}), started from what the global store \
                 last told it, and the global store keeps that share in reserve",
                scenario.wan_rtt_ms_value(),
                scenario.lease_horizon_ms_value(),
                scenario.share_by_value().name(),
            ),
            Counting::PerRegion => "each region's store counts alone and enforces the whole \
                                    limit (a Redis per region, no global store)"
                .to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(out, "{}: {what}.", counting.name());
    }
    let normal = scenario.phase_secs(Phase::Normal);
    let _ = writeln!(
        out,
        "Fault: {}, from {normal} s to {} s; virtual time ({} s simulated).",
        scenario.fault_value(),
        normal + scenario.phase_secs(Phase::Outage),
        scenario.total_secs()
    );
    let _ = writeln!(
        out,
        "worst {window} s: the most requests of the customer admitted by all regions together \
         within one {window} s window ending in the phase (a window straddling the phase's \
         start counts toward it), and that as a part of the limit. Rates are whole-phase \
         averages; a region's column is what it admitted of what it was sent."
    );
    for customer in report.customers() {
        let offered: Vec<String> = report
            .regions()
            .iter()
            .enumerate()
            .filter(|&(r, _)| customer.rate_in(r) > 0.0)
            .map(|(r, name)| format!("{name} {}/s", rate_text(customer.rate_in(r))))
            .collect();
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "## {}: {}/s sent ({})",
            customer.name(),
            rate_text(customer.rate()),
            offered.join(", ")
        );
        let _ = writeln!(out);
        let mut header = vec![
            "counting".to_owned(),
            "phase".to_owned(),
            "admitted/s".to_owned(),
            format!("worst {window} s"),
        ];
        for (r, name) in report.regions().iter().enumerate() {
            header.push(format!("{name} ({}/s)", rate_text(customer.rate_in(r))));
        }
        header.push("WAN calls/request".to_owned());
        let mut rows = Vec::new();
        for group in report.groups() {
            for phase in Phase::ALL {
                let Some(row) = report.row(group.name(), phase, customer.name()) else {
                    continue;
                };
                let worst = row.worst_window_admitted;
                let mut cells = vec![
                    group.name().to_owned(),
                    phase_name(scenario, phase).to_owned(),
                    format!("{:.1}", row.admitted_per_sec),
                    format!("{worst} ({:.0}%)", worst as f64 * 100.0 / limit as f64),
                ];
                cells.extend(
                    row.regions
                        .iter()
                        .map(|r| format!("{:.1}", r.admitted_per_sec)),
                );
                cells.push(match group.counting() {
                    Counting::PerRegion => "-".to_owned(),
                    _ => format!("{:.2}", row.wan_calls_per_request),
                });
                rows.push(cells);
            }
        }
        markdown(&mut out, &header, &rows, 2);
    }
    out
}

/// The first customer's admitted requests per second over the run, one panel per way of
/// counting: a line per region, one for all regions together, the limit, and the fault
/// shaded.
pub(crate) fn chart(
    scenario: &Regions,
    report: &RegionsReport,
) -> Result<String, Box<dyn std::error::Error>> {
    const WIDTH: u32 = 960;
    const PANEL_H: u32 = 300;
    const HEAD_H: u32 = 96;
    let customer = &report.customers()[0];
    let total = scenario.total_secs() as f64;
    let limit_per_sec = scenario.limit_value() as f64 / scenario.window_secs_value() as f64;
    let seconds = scenario.total_secs() as usize;
    let all = |group: &tollgate_simulator::RegionsGroup| -> Vec<u64> {
        (0..seconds)
            .map(|s| {
                (0..report.regions().len())
                    .map(|r| {
                        group
                            .admitted_each_second(0, r)
                            .get(s)
                            .copied()
                            .unwrap_or(0)
                    })
                    .sum()
            })
            .collect()
    };
    let peak = report.groups().iter().flat_map(all).max().unwrap_or(0) as f64;
    let y_max = peak.max(limit_per_sec) * 1.1;
    let normal_end = scenario.phase_secs(Phase::Normal) as f64;
    let fault_end = normal_end + scenario.phase_secs(Phase::Outage) as f64;

    let mut svg = String::new();
    {
        let panels = report.groups().len() as u32;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEAD_H + panels * PANEL_H))
            .into_drawing_area();
        root.fill(&WHITE)?;
        let (head, body) = root.split_vertically(HEAD_H);
        head.draw(&Text::new(
            format!(
                "{}'s admitted requests per second, by region and all together",
                customer.name()
            ),
            (12, 10),
            ("sans-serif", 22, FontStyle::Bold),
        ))?;
        head.draw(&Text::new(
            format!(
                "limit {} per {} s across the regions; shaded: {}",
                scenario.limit_value(),
                scenario.window_secs_value(),
                scenario.fault_value()
            ),
            (12, 38),
            ("sans-serif", 16),
        ))?;
        let mut legend: Vec<(RGBColor, String)> = report
            .regions()
            .iter()
            .enumerate()
            .map(|(r, name)| {
                (
                    COLORS[r % COLORS.len()],
                    format!("{name} ({}/s sent)", rate_text(customer.rate_in(r))),
                )
            })
            .collect();
        legend.push((RGBColor(0, 0, 0), "all regions".to_owned()));
        legend.push((LIMIT, format!("the limit ({}/s)", rate_text(limit_per_sec))));
        let font = ("sans-serif", 15).into_font();
        let mut x = 12;
        for (color, label) in legend {
            head.draw(&Rectangle::new([(x, 70), (x + 22, 74)], color.filled()))?;
            head.draw(&Text::new(label.clone(), (x + 28, 64), font.clone()))?;
            x += 40 + font.box_size(&label)?.0 as i32;
        }
        let cells = body.split_evenly((report.groups().len(), 1));
        for (group, cell) in report.groups().iter().zip(&cells) {
            let mut panel = panel(cell, group.name(), total, y_max, (normal_end, fault_end))?;
            panel.draw_series(DashedLineSeries::new(
                [(0.0, limit_per_sec), (total, limit_per_sec)],
                6,
                4,
                ShapeStyle::from(&LIMIT).stroke_width(2),
            ))?;
            for r in 0..report.regions().len() {
                panel.draw_series(LineSeries::new(
                    group
                        .admitted_each_second(0, r)
                        .iter()
                        .enumerate()
                        .map(|(s, &admitted)| (s as f64 + 0.5, admitted as f64)),
                    COLORS[r % COLORS.len()].stroke_width(2),
                ))?;
            }
            panel.draw_series(LineSeries::new(
                all(group)
                    .into_iter()
                    .enumerate()
                    .map(|(s, admitted)| (s as f64 + 0.5, admitted as f64)),
                RGBColor(0, 0, 0).stroke_width(2),
            ))?;
        }
        root.present()?;
    }
    Ok(tight_text(&svg))
}
