//! The Grafana dashboard in docs/ queries only what tollgate records: every metric name in
//! its PromQL is a series of a Prometheus scrape taken after a scripted run (see
//! [`crate::metrics::prometheus_scrape`]), with the labels and label values it selects on,
//! and it has a panel for each thing an operator watches. The operating guide's
//! alerting and shadow-mode queries (docs/guide/operating.md) are held to the same check.

#[cfg(feature = "redis")]
use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde_json::Value;

#[cfg(feature = "redis")]
use crate::metrics::prometheus_scrape;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// Every metric family tollgate records, as the crate docs' table lists them.
pub(crate) const FAMILIES: [&str; 13] = [
    "tollgate_decisions_total",
    "tollgate_fallbacks_total",
    "tollgate_breaker_state",
    "tollgate_store_latency_seconds",
    "tollgate_denial_cache_hits_total",
    "tollgate_refunds_total",
    "tollgate_settlements_total",
    "tollgate_lockouts_total",
    "tollgate_live_instances",
    "tollgate_shed_total",
    "tollgate_in_flight",
    "tollgate_client_throttled_total",
    "tollgate_client_held_back_total",
];

const DASHBOARD: &str = include_str!("../../docs/grafana-dashboard.json");
#[cfg(feature = "redis")]
const OPERATING_GUIDE: &str = include_str!("../../docs/guide/operating.md");

/// Every PromQL text in the dashboard: panel targets and template variable queries.
#[cfg(feature = "redis")]
fn queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    Value::String(text) if ["expr", "definition", "query"].contains(&&**key) => {
                        out.push(text.clone())
                    }
                    other => queries(other, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, out)),
        _ => {}
    }
}

/// One label matcher of a selector: label, operator, value.
type Matcher = (String, String, String);

/// What a query uses: metric names with the matchers of their selectors, and the labels
/// its `by (...)` and `without (...)` clauses group on.
#[derive(Debug, Default)]
struct Uses {
    metrics: Vec<(String, Vec<Matcher>)>,
    grouped_by: Vec<String>,
    /// Names followed by a selector that are not tollgate's.
    foreign: Vec<String>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The text between the opening bracket or quote at `chars[start]` and the first `close`
/// after it, and the index after that.
fn enclosed(chars: &[char], start: usize, close: char) -> (String, usize) {
    let end = chars[start + 1..]
        .iter()
        .position(|&c| c == close)
        .map(|offset| start + 1 + offset)
        .expect("an unclosed bracket");
    (chars[start + 1..end].iter().collect(), end + 1)
}

fn parse_matchers(text: &str) -> Vec<Matcher> {
    text.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| {
            let at = m.find(['=', '!']).expect("a matcher without an operator");
            let (label, rest) = m.split_at(at);
            let op_len =
                if rest.starts_with("=~") || rest.starts_with("!=") || rest.starts_with("!~") {
                    2
                } else {
                    1
                };
            let (op, value) = rest.split_at(op_len);
            (
                label.trim().to_owned(),
                op.to_owned(),
                value.trim().trim_matches('"').to_owned(),
            )
        })
        .collect()
}

fn uses(query: &str) -> Uses {
    let chars: Vec<char> = query.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i = enclosed(&chars, i, '"').1;
        } else if c == '[' {
            // A range: `[5m]`, `[$__rate_interval]`.
            i = enclosed(&chars, i, ']').1;
        } else if c == '$' {
            while i + 1 < chars.len() && is_ident(chars[i + 1]) {
                i += 1;
            }
            i += 1;
        } else if is_ident(c) && !c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next] == ' ' {
                next += 1;
            }
            let follows = chars.get(next).copied();
            if (word == "by" || word == "without") && follows == Some('(') {
                let (labels, after) = enclosed(&chars, next, ')');
                uses.grouped_by
                    .extend(labels.split(',').map(|l| l.trim().to_owned()));
                i = after;
            } else if word.starts_with("tollgate_") {
                let matchers = if follows == Some('{') {
                    let (text, after) = enclosed(&chars, next, '}');
                    i = after;
                    parse_matchers(&text)
                } else {
                    Vec::new()
                };
                uses.metrics.push((word, matchers));
            } else if follows == Some('{') {
                uses.foreign.push(word);
            }
        } else {
            i += 1;
        }
    }
    uses
}

/// The scrape's series: name -> label -> the values seen.
#[cfg(feature = "redis")]
pub(crate) fn series(scrape: &str) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut series: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = series.entry(line[..name_end].to_owned()).or_default();
        if line[name_end..].starts_with('{') {
            let close = line.rfind('}').unwrap();
            for (label, _, value) in parse_matchers(&line[name_end + 1..close]) {
                labels.entry(label).or_default().insert(value);
            }
        }
    }
    series
}

/// The family a series belongs to: histograms add `_bucket`, `_sum` and `_count`.
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .find(|base| FAMILIES.contains(base))
        .unwrap_or(name)
}

/// Checks that every metric, label and literal label value `texts` use is recorded, and
/// returns the families they query.
#[cfg(feature = "redis")]
pub(crate) fn check_queries(texts: &[String]) -> BTreeSet<String> {
    let recorded = series(prometheus_scrape());
    let mut queried = BTreeSet::new();
    for text in texts {
        let uses = uses(text);
        assert!(uses.foreign.is_empty(), "{text}: {:?}", uses.foreign);
        for (name, matchers) in &uses.metrics {
            assert!(
                FAMILIES.contains(&family(name)),
                "{text}: {name} is no documented metric"
            );
            let labels = recorded
                .get(name)
                .unwrap_or_else(|| panic!("{text}: no series {name} in the scrape"));
            for (label, op, value) in matchers {
                let values = labels
                    .get(label)
                    .unwrap_or_else(|| panic!("{text}: {name} has no label {label}"));
                // A literal value, or alternatives of literals, must be values recorded.
                if !value.starts_with('$') && (op == "=" || op == "=~") {
                    for alternative in value.split('|') {
                        assert!(
                            values.contains(alternative),
                            "{text}: {name}{{{label}}} is never {alternative:?}: {values:?}"
                        );
                    }
                }
            }
            queried.insert(family(name).to_owned());
        }
        for label in &uses.grouped_by {
            assert!(
                label == "le"
                    || uses
                        .metrics
                        .iter()
                        .any(|(name, _)| recorded[name].contains_key(label)),
                "{text}: grouped by {label}, which none of its metrics has"
            );
        }
    }
    queried
}

#[cfg(feature = "redis")]
#[test]
fn every_series_the_dashboard_queries_is_one_the_crate_records() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is not JSON");
    let mut texts = Vec::new();
    queries(&dashboard, &mut texts);
    let queried = check_queries(&texts);
    // Decisions by outcome, fallbacks by reason, breaker state, store latency, live
    // instances and shed requests, at least.
    for family in [
        "tollgate_decisions_total",
        "tollgate_fallbacks_total",
        "tollgate_breaker_state",
        "tollgate_store_latency_seconds",
        "tollgate_live_instances",
        "tollgate_shed_total",
    ] {
        assert!(
            queried.contains(family),
            "the dashboard never queries {family}"
        );
    }
}

#[test]
fn the_query_reader_finds_names_selectors_and_groupings() {
    let read = uses(
        r#"histogram_quantile(0.99, sum by (le, layer) (rate(tollgate_store_latency_seconds_bucket{layer=~"$layer"}[$__rate_interval]))) / up{job="x"}"#,
    );
    assert_eq!(
        read.metrics,
        [(
            "tollgate_store_latency_seconds_bucket".to_owned(),
            vec![("layer".to_owned(), "=~".to_owned(), "$layer".to_owned())]
        )]
    );
    assert_eq!(read.grouped_by, ["le", "layer"]);
    assert_eq!(read.foreign, ["up"]);
    assert_eq!(
        family("tollgate_store_latency_seconds_count"),
        "tollgate_store_latency_seconds"
    );
    assert_eq!(
        family("tollgate_decisions_total"),
        "tollgate_decisions_total"
    );
}

#[test]
fn every_panel_has_a_title_a_query_and_a_place() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let mut titles = BTreeSet::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().unwrap();
        assert!(titles.insert(title), "two panels called {title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("tollgate_"))
            );
        }
        let place = &panel["gridPos"];
        assert!(place["w"].as_u64().unwrap() > 0 && place["h"].as_u64().unwrap() > 0);
    }
}

#[cfg(feature = "redis")]
#[test]
fn the_operating_guide_queries_only_what_the_crate_records() {
    // The lines of the guide's `promql` blocks, comments aside.
    let mut texts = Vec::new();
    let mut inside = false;
    for line in OPERATING_GUIDE.lines() {
        match line.trim() {
            "```promql" => inside = true,
            "```" => inside = false,
            query if inside && !query.is_empty() && !query.starts_with('#') => {
                texts.push(query.to_owned())
            }
            _ => {}
        }
    }
    let queried = check_queries(&texts);
    for family in [
        "tollgate_fallbacks_total",
        "tollgate_breaker_state",
        "tollgate_live_instances",
        "tollgate_decisions_total",
    ] {
        assert!(
            queried.contains(family),
            "the operating guide never queries {family}"
        );
    }
}
