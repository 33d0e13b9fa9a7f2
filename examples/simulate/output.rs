//! The command line's text: the tables per phase and the JSON rows.

use std::fmt::Write as _;

use serde::Serialize;
use tollgate::store::Algorithm;
use tollgate_simulator::{Phase, PolicyName, Report, Row, Scenario};

use crate::Options;

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// One row of `--json`, and of the page's answer: the same numbers, rounded the same way.
#[derive(Debug, Serialize)]
pub(crate) struct JsonRow {
    policy: String,
    phase: &'static str,
    customer: String,
    sent_per_sec: f64,
    admitted_per_sec: f64,
    refused_429: u64,
    refused_503: u64,
    /// The most admitted in one window of the scenario's length ending in the phase, as
    /// the table's "worst N s" column says.
    worst_window_admitted: u64,
    /// On the recovery rows only: when the group's last breaker closed (null: not within
    /// the phase), as the table's "all breakers closed after" column says.
    #[serde(skip_serializing_if = "Option::is_none")]
    all_breakers_closed_after_ms: Option<Option<f64>>,
}

impl JsonRow {
    fn new(row: &Row) -> Self {
        Self {
            policy: row.policy.clone(),
            phase: row.phase.name(),
            customer: row.customer.clone(),
            sent_per_sec: round2(row.sent_per_sec),
            admitted_per_sec: round2(row.admitted_per_sec),
            refused_429: row.refused_429,
            refused_503: row.refused_503,
            worst_window_admitted: row.worst_window_admitted,
            all_breakers_closed_after_ms: (row.phase == Phase::Recovery).then(|| {
                row.all_breakers_closed_after
                    .map(|d| round2(d.as_secs_f64() * 1_000.0))
            }),
        }
    }
}

/// Every row of the report, group by group, phase by phase, customer by customer.
pub(crate) fn json_rows(report: &Report) -> Vec<JsonRow> {
    report.rows().iter().map(JsonRow::new).collect()
}

/// The rows as a JSON array, one object per line, keys in reading order.
pub(crate) fn json(report: &Report) -> String {
    let mut rows = Vec::new();
    for row in json_rows(report) {
        let closed = match row.all_breakers_closed_after_ms {
            Some(ms) => format!(", \"all_breakers_closed_after_ms\": {}", text(&ms)),
            None => String::new(),
        };
        rows.push(format!(
            "  {{\"policy\": {}, \"phase\": {}, \"customer\": {}, \"sent_per_sec\": {}, \
             \"admitted_per_sec\": {}, \"refused_429\": {}, \"refused_503\": {}, \
             \"worst_window_admitted\": {}{closed}}}",
            text(&row.policy),
            text(&row.phase),
            text(&row.customer),
            text(&row.sent_per_sec),
            text(&row.admitted_per_sec),
            row.refused_429,
            row.refused_503,
            row.worst_window_admitted,
        ));
    }
    format!("[\n{}\n]\n", rows.join(",\n"))
}

/// A value as JSON text.
fn text(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("strings and numbers are JSON")
}

/// The worst-window column's heading: `worst 1 s`, `worst 60 s`.
pub(crate) fn worst_heading(scenario: &Scenario) -> String {
    format!("worst {} s", scenario.window_secs_value())
}

/// A rate with at most two decimals and no trailing zeros.
pub(crate) fn rate_text(rate: f64) -> String {
    let text = format!("{rate:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// "25 per 2 s (12.5/s)", or a token bucket's rate and burst.
/// What each of `n` instances enforces of `policy` while the store is down: its part in
/// the policy's own window, the remainder on the first places, or turns for a quota below
/// the instance count.
pub(crate) fn share_text(policy: &Algorithm, n: u64) -> String {
    let n = n.max(1);
    let (quota, window_ms) = match *policy {
        Algorithm::SlidingWindow { limit, window_ms } => (limit, window_ms),
        Algorithm::TokenBucket {
            rate, period_ms, ..
        } => (rate, period_ms),
        _ => return describe(&policy.divided_by(n)),
    };
    let secs = rate_text(window_ms as f64 / 1_000.0);
    if quota < n {
        return format!(
            "{quota} per {secs} s shared by {n}: the instances take turns, one window each,              {quota} request(s) a window across them"
        );
    }
    let part = describe(&policy.divided_by(n));
    match quota % n {
        0 => format!("{part} per instance"),
        extra => format!(
            "{part} per instance, one more on the first {extra} by place (together {quota} per {secs} s)"
        ),
    }
}

pub(crate) fn describe(algorithm: &Algorithm) -> String {
    let secs = |ms: u64| rate_text(ms as f64 / 1_000.0);
    match *algorithm {
        Algorithm::SlidingWindow { limit, window_ms } => format!(
            "{limit} per {} s ({}/s)",
            secs(window_ms),
            rate_text(limit as f64 * 1_000.0 / window_ms as f64)
        ),
        Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        } => format!(
            "{rate} tokens per {} s ({}/s), burst {burst}",
            secs(period_ms),
            rate_text(rate as f64 * 1_000.0 / period_ms as f64)
        ),
        other => format!("{other:?}"),
    }
}

pub(crate) fn policy_note(scenario: &Scenario, policy: PolicyName) -> Option<String> {
    let n = scenario.instances_value();
    let first = scenario.traffic_value()[0].name();
    match policy {
        PolicyName::LocalShareNoDivisor => Some(format!(
            "each of the {n} instances enforces the full limit of {}",
            scenario.limit_value()
        )),
        PolicyName::LocalShareStaleDivisor => Some(format!(
            "{} instances run, the share is still divided by {n}",
            n * 2
        )),
        PolicyName::LocalSharePinned => {
            Some(format!("all of {first}'s requests land on one instance"))
        }
        _ => None,
    }
}

pub(crate) fn table(options: &Options, report: &Report) -> String {
    let mut out = String::new();
    let n = options.scenario.instances_value();
    let customers: Vec<String> = options
        .scenario
        .traffic_value()
        .iter()
        .map(|c| format!("{} ({}/s)", c.name(), rate_text(c.rate())))
        .collect();
    let share = options.scenario.policy().algorithm().divided_by(n as u64);
    let _ = writeln!(
        out,
        "tollgate outage simulator: the running example on tollgate's own \
         layer, limiter, breaker and failure policies."
    );
    let _ = writeln!(
        out,
        "{n} instances, round robin; limit {} per {} s per customer ({}); traffic {}.",
        options.scenario.limit_value(),
        options.scenario.window_secs_value(),
        options.algorithm_name(),
        options
            .scenario
            .traffic_value()
            .iter()
            .map(|c| format!("{} {}/s", c.name(), rate_text(c.rate())))
            .collect::<Vec<_>>()
            .join(", ")
    );
    match &options.redis {
        None => {
            let _ = writeln!(
                out,
                "Store: an in-process store shared by the instances stands in for Redis; virtual \
                 time ({} s simulated).",
                options.scenario.total_secs()
            );
        }
        Some(url) => {
            let _ = writeln!(
                out,
                "Store: Redis at {} behind a fault proxy; real time ({} s).",
                url.url,
                options.scenario.total_secs()
            );
        }
    }
    let breaker = options.scenario.breaker();
    let base_ms = breaker.base_open_duration().as_millis();
    let _ = writeln!(
        out,
        "Store timeout {} ms; the breaker ({}) opens after {} consecutive failures and stays open \
         {}-{base_ms} ms at first, the ceiling doubling per failed probe to at most {} ms \
         (jittered).",
        options.scenario.store_timeout_ms_value(),
        if !options.scenario.breaker_overridden() {
            "the library's default"
        } else {
            "set by the flags"
        },
        breaker.threshold(),
        (base_ms.min(breaker.max_open_duration().as_millis()) / 2).max(1),
        breaker.max_open_duration().as_millis(),
    );
    let _ = writeln!(
        out,
        "Rates are whole-phase averages (admitted in the phase / its length): counters that start \
         cold and the breaker's lag after the store returns are included, not trimmed."
    );
    let _ = writeln!(
        out,
        "{worst}: the most requests admitted within one {} s window (by send time) that ends in \
         the phase, one number per customer in the columns' order; a window straddling the \
         phase's start counts toward it, so the outage's shows the store's last admissions \
         with the failure policy's first, the recovery's the outage's last with the store's \
         first.",
        options.scenario.window_secs_value(),
        worst = worst_heading(&options.scenario),
    );
    let _ = writeln!(
        out,
        "A local share is the policy as the crate divides it by the {n} configured instances: {}.",
        share_text(options.scenario.policy().algorithm(), n as u64)
    );
    if let (
        Algorithm::SlidingWindow { limit, .. },
        Algorithm::SlidingWindow {
            limit: share_limit, ..
        },
    ) = (*options.scenario.policy().algorithm(), share)
    {
        let _ = writeln!(
            out,
            "Under steady overload a sliding window counter admits about one request less than its \
             quota per window (the window's last request would overshoot it): about {} of {limit} \
             per window from the shared store, {} of {share_limit} per window of a local share.",
            limit.saturating_sub(1).max(1),
            share_limit.saturating_sub(1).max(1),
        );
    }
    for policy in options.scenario.policies_value() {
        if let Some(note) = policy_note(&options.scenario, *policy) {
            let _ = writeln!(out, "{}: {note}.", policy.name());
        }
    }

    for (phase, phase_name) in Phase::ALL.iter().map(|p| p.name()).enumerate() {
        let secs = options.scenario.phase_secs(Phase::ALL[phase]);
        let what = match phase {
            0 => "the store answers".to_owned(),
            1 => options
                .scenario
                .fault_value()
                .describe(options.scenario.store_timeout_ms_value()),
            _ => "the store is back".to_owned(),
        };
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "## {phase_name}: {secs} s, {what}; admitted requests per second"
        );
        let _ = writeln!(out);
        let mut header: Vec<String> = vec!["policy".to_owned()];
        header.extend(customers.iter().cloned());
        header.push(worst_heading(&options.scenario));
        header.push("429s".to_owned());
        header.push("503s".to_owned());
        if phase == 2 {
            header.push("all breakers closed after".to_owned());
        }
        let mut rows: Vec<Vec<String>> = Vec::new();
        for (policy, tally) in options
            .scenario
            .policies_value()
            .iter()
            .zip(report.groups())
        {
            let mut row = vec![policy.name().to_owned()];
            let mut r429 = 0;
            let mut r503 = 0;
            let mut worst = Vec::new();
            for counts in (0..report.customers().len()).map(|c| tally.counts(c, Phase::ALL[phase]))
            {
                row.push(format!("{:.1}", per_sec(counts.admitted, secs)));
                worst.push(counts.worst_window_admitted.to_string());
                r429 += counts.refused_429;
                r503 += counts.refused_503;
            }
            row.push(worst.join(" / "));
            row.push(r429.to_string());
            row.push(r503.to_string());
            if phase == 2 {
                row.push(
                    match tally
                        .all_breakers_closed_after()
                        .map(|d| d.as_secs_f64() * 1_000.0)
                    {
                        Some(ms) => format!("{ms:.0} ms"),
                        None => "not within the phase".to_owned(),
                    },
                );
            }
            rows.push(row);
        }
        markdown(&mut out, &header, &rows, 1);
    }
    out
}

pub(crate) fn per_sec(count: u64, secs: u64) -> f64 {
    count as f64 / secs as f64
}

/// A Markdown table, its first `left` columns left-aligned, the others right-aligned.
pub(crate) fn markdown(out: &mut String, header: &[String], rows: &[Vec<String>], left: usize) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| -> String {
        let cells: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i < left {
                    format!("{cell:<w$}", w = widths[i])
                } else {
                    format!("{cell:>w$}", w = widths[i])
                }
            })
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    let _ = writeln!(out, "{}", line(header));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i < left {
                "-".repeat(w + 2)
            } else {
                format!("{}:", "-".repeat(w + 1))
            }
        })
        .collect();
    let _ = writeln!(out, "|{}|", rule.join("|"));
    for row in rows {
        let _ = writeln!(out, "{}", line(row));
    }
}
