//! The `--chart` SVG, drawn with plotters.

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::{
    Cartesian2d, ChartBuilder, ChartContext, Color, DrawingArea, FontStyle, IntoDrawingArea,
    IntoFont, LineSeries, RGBColor, Rectangle, SVGBackend, TRANSPARENT, Text, WHITE,
};
use tollgate_simulator::Report;

use crate::Options;
use crate::output::{policy_note, rate_text};

/// The customers' colours in the chart, in the order of `--traffic`.
pub(crate) const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];
/// The store outage in the chart.
pub(crate) const OUTAGE_SHADE: RGBColor = RGBColor(0xfd, 0xe2, 0xe2);
/// The frame around each panel of the chart.
pub(crate) const FRAME: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// The admitted rate over time as an SVG drawn with plotters: one panel per policy, one
/// line per customer, the store outage shaded, and one legend for all panels at the top.
pub(crate) fn chart(
    options: &Options,
    report: &Report,
) -> Result<String, Box<dyn std::error::Error>> {
    const PANEL_W: u32 = 620;
    const PANEL_H: u32 = 270;
    const MARGIN: i32 = 12;
    const LEGEND_LINE_H: i32 = 24;
    let panels = report.groups().len();
    let columns = if panels > 1 { 2 } else { 1 };
    let rows = panels.div_ceil(columns);
    let width = if columns > 1 {
        columns as u32 * PANEL_W
    } else {
        PANEL_W * 3 / 2
    };
    let total = options.scenario.total_secs() as f64;
    let customers = report.customers().len();
    let peak = report
        .groups()
        .iter()
        .flat_map(|t| (0..customers).flat_map(move |c| t.admitted_each_second(c)))
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let peak = peak
        .max(options.scenario.limit_value() as f64 / options.scenario.window_secs_value() as f64);
    let y_max = peak * 1.1;
    let [normal_end, outage_end] = options.boundaries_ms().map(|ms| ms / 1_000.0);

    // The legend: the outage's shade, then each customer's line, wrapped to the width.
    let legend_font = ("sans-serif", 16).into_font();
    let mut legend = vec![(None, "store outage".to_owned())];
    for (c, customer) in options.scenario.traffic_value().iter().enumerate() {
        legend.push((
            Some(COLORS[c % COLORS.len()]),
            format!(
                "{} ({}/s sent)",
                customer.name(),
                rate_text(customer.rate())
            ),
        ));
    }
    let mut placed = Vec::with_capacity(legend.len());
    let (mut x, mut line) = (MARGIN, 0);
    for (color, label) in legend {
        let entry_w = 30 + legend_font.box_size(&label)?.0 as i32;
        if x > MARGIN && x + entry_w > width as i32 - MARGIN {
            x = MARGIN;
            line += 1;
        }
        placed.push((x, line, color, label));
        x += entry_w + 26;
    }
    let head_h = 64 + LEGEND_LINE_H * (line + 1);

    let mut svg = String::new();
    {
        let size = (width, head_h as u32 + rows as u32 * PANEL_H);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (head, body) = root.split_vertically(head_h);
        head.draw(&Text::new(
            "Admitted requests per second per customer",
            (MARGIN, 10),
            ("sans-serif", 22, FontStyle::Bold),
        ))?;
        head.draw(&Text::new(
            format!(
                "{} instances, limit {} per {} s; during the outage {}",
                options.scenario.instances_value(),
                options.scenario.limit_value(),
                options.scenario.window_secs_value(),
                options
                    .scenario
                    .fault_value()
                    .describe(options.scenario.store_timeout_ms_value())
            ),
            (MARGIN, 36),
            ("sans-serif", 16),
        ))?;
        for (x, line, color, label) in placed {
            let y = 64 + LEGEND_LINE_H * line;
            let mid = y + 7;
            match color {
                None => head.draw(&Rectangle::new(
                    [(x, mid - 6), (x + 22, mid + 6)],
                    OUTAGE_SHADE.filled(),
                ))?,
                Some(color) => head.draw(&Rectangle::new(
                    [(x, mid - 2), (x + 22, mid + 2)],
                    color.filled(),
                ))?,
            }
            head.draw(&Text::new(label, (x + 30, y), legend_font.clone()))?;
        }
        let cells = body.split_evenly((rows, columns));
        for ((policy, tally), cell) in options
            .scenario
            .policies_value()
            .iter()
            .zip(report.groups())
            .zip(&cells)
        {
            let title = match policy_note(&options.scenario, *policy) {
                Some(note) => format!("{} ({note})", policy.name()),
                None => policy.name().to_owned(),
            };
            let mut panel = panel(cell, &title, total, y_max, (normal_end, outage_end))?;
            for (c, seconds) in (0..customers)
                .map(|c| tally.admitted_each_second(c))
                .enumerate()
            {
                panel.draw_series(LineSeries::new(
                    seconds
                        .iter()
                        .enumerate()
                        .map(|(s, &admitted)| (s as f64 + 0.5, admitted as f64)),
                    COLORS[c % COLORS.len()].stroke_width(2),
                ))?;
            }
        }
        root.present()?;
    }
    Ok(tight_text(&svg))
}

/// One panel of a chart, ready for its lines: the caption, seconds up to `total` across,
/// admitted requests a second up to `y_max` up, the span `fault` shaded, the axes labelled
/// and a frame.
pub(crate) fn panel<'a, 'b>(
    cell: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    total: f64,
    y_max: f64,
    fault: (f64, f64),
) -> Result<Panel<'a, 'b>, Box<dyn std::error::Error>> {
    let mut panel = ChartBuilder::on(cell)
        .caption(title, ("sans-serif", 17, FontStyle::Bold))
        .margin(10)
        .x_label_area_size(38)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..total, 0.0..y_max)?;
    panel.draw_series(std::iter::once(Rectangle::new(
        [(fault.0, 0.0), (fault.1, y_max)],
        OUTAGE_SHADE.filled(),
    )))?;
    panel
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("admitted/s")
        .x_labels(10)
        .y_labels(6)
        .light_line_style(TRANSPARENT)
        // No axis lines nor tick marks: the frame below stands for them, and the SVG's
        // only polylines are the data's lines.
        .axis_style(TRANSPARENT)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 14))
        .x_label_formatter(&|secs| format!("{secs:.0}"))
        .y_label_formatter(&|rate| rate_text(*rate))
        .draw()?;
    panel.draw_series(std::iter::once(Rectangle::new(
        [(0.0, 0.0), (total, y_max)],
        FRAME.stroke_width(1),
    )))?;
    Ok(panel)
}

/// A chart panel: seconds across, admitted requests a second up.
pub(crate) type Panel<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// plotters' SVG puts each text on a line of its own between its `<text ...>` and
/// `</text>` tags; SVG drops those line breaks anyway, so take them out and keep each text
/// element on one line: `<text ...>closed</text>`.
pub(crate) fn tight_text(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    for line in svg.lines() {
        out.push_str(line);
        let opens_text = line.starts_with("<text ") && !line.ends_with("/>");
        if !opens_text {
            out.push('\n');
        }
    }
    out.replace("\n</text>", "</text>")
}
