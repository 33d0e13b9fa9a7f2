//! The alert rules in docs/alerts.yml are the ones the operating guide shows, query only what the crate records,
//! and docs/alerts.test.yml (run by `promtool test rules` in scripts/test) feeds them series
//! exactly as `orders_api` exports them: the same names, the same label names, label values
//! it records. A metric or label renamed in the crate fails here, before an alert silently
//! stops firing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use tollgate_testkit::http::{exchange, parse_response};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::redis::RedisServer;

use crate::dashboard::{check_queries, series};

const RULES: &str = include_str!("../../docs/alerts.yml");
const RULE_TESTS: &str = include_str!("../../docs/alerts.test.yml");
const OPERATING_GUIDE: &str = include_str!("../../docs/guide/operating.md");

/// Labels a Prometheus scrape adds to every series, which no exporter writes.
const SCRAPE_LABELS: [&str; 2] = ["instance", "job"];

/// The value after `key:` on the lines of `text` that hold it, unquoted.
fn values_of<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}:");
    text.lines()
        .filter_map(|line| {
            line.trim()
                .trim_start_matches("- ")
                .strip_prefix(prefix.as_str())
        })
        .map(|value| value.trim().trim_matches('\''))
        .collect()
}

/// The queries of the operating guide's alerting block (its first `promql` block), comments
/// aside.
fn guide_alerts() -> Vec<String> {
    let block = OPERATING_GUIDE
        .split("```promql")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a promql block in docs/guide/operating.md");
    block
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_operating_guide_shows_the_rules_of_docs_alerts_yml() {
    let rules: Vec<String> = values_of(RULES, "expr")
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(rules.len(), 4, "{rules:?}");
    assert_eq!(rules, guide_alerts());
    // The rules query recorded metrics, labels and values only.
    let queried = check_queries(&rules);
    for family in [
        "tollgate_fallbacks_total",
        "tollgate_breaker_state",
        "tollgate_live_instances",
    ] {
        assert!(queried.contains(family), "no rule on {family}");
    }
    // Each has a name, a `for`, a severity and a summary.
    assert_eq!(values_of(RULES, "alert").len(), rules.len());
    assert_eq!(values_of(RULES, "for").len(), rules.len());
    assert_eq!(values_of(RULES, "severity").len(), rules.len());
    assert_eq!(values_of(RULES, "summary").len(), rules.len());
}

/// `name{label="value",...}` as a name and its labels.
fn parse_series(text: &str) -> (String, BTreeMap<String, String>) {
    let (name, rest) = text.split_once('{').unwrap_or((text, "}"));
    let labels = rest
        .trim_end_matches('}')
        .split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (label, value) = pair.split_once('=').expect("label=value");
            (label.to_owned(), value.trim_matches('"').to_owned())
        })
        .collect();
    (name.to_owned(), labels)
}

/// What `orders_api` serves at /metrics after deciding on Redis and then through a store
/// that refuses connections (fallbacks, an open breaker, the live-instance registry).
fn orders_api_scrape() -> String {
    use std::io::BufRead;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut child = std::process::Command::new(tollgate_testkit::example::binary("orders_api"))
        .args(["--listen", "127.0.0.1:0", "--redis", &proxy.url()])
        .args(["--expected-instances", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start orders_api");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the listening line");
    let address: SocketAddr = line
        .trim()
        .strip_prefix("listening on http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let scrape = runtime.block_on(async {
        let local = "127.0.0.1".parse().unwrap();
        let get = |path: &str, headers: &str| {
            format!("GET {path} HTTP/1.1\r\nhost: orders\r\n{headers}connection: close\r\n\r\n")
        };
        let orders = get("/orders", "x-customer-id: acme\r\n");
        let login = "POST /login HTTP/1.1\r\nhost: orders\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        for _ in 0..3 {
            exchange(address, local, &orders).await;
            exchange(address, local, login).await;
        }
        // A heartbeat or two into the registry.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let refuse = std::thread::spawn(move || {
            proxy.set(Fault::Refuse);
            proxy
        });
        let _proxy = refuse.join().unwrap();
        for _ in 0..10 {
            exchange(address, local, &orders).await;
            exchange(address, local, login).await;
        }
        let reply = parse_response(&exchange(address, local, &get("/metrics", "")).await);
        String::from_utf8(reply.body.to_vec()).expect("a text scrape")
    });
    let _ = child.kill();
    let _ = child.wait();
    scrape
}

#[test]
fn every_series_the_rule_tests_feed_is_one_orders_api_exports() {
    let exported = series(&orders_api_scrape());
    let fed: Vec<(String, BTreeMap<String, String>)> = values_of(RULE_TESTS, "series")
        .into_iter()
        .map(parse_series)
        .collect();
    assert!(fed.len() >= 10, "{fed:?}");
    let mut families = BTreeSet::new();
    for (name, labels) in &fed {
        let recorded = exported
            .get(name)
            .unwrap_or_else(|| panic!("orders_api exports no {name}: {exported:?}"));
        let fed_names: BTreeSet<&str> = labels
            .keys()
            .map(String::as_str)
            .filter(|label| !SCRAPE_LABELS.contains(label))
            .collect();
        let exported_names: BTreeSet<&str> = recorded.keys().map(String::as_str).collect();
        assert_eq!(
            fed_names, exported_names,
            "{name}: the rule tests' labels are not orders_api's"
        );
        for label in SCRAPE_LABELS {
            assert!(labels.contains_key(label), "{name}: no {label} label");
        }
        // The values an alert groups or is read by are values orders_api records; a node
        // is an address, which differs between deployments.
        for (label, value) in labels {
            if SCRAPE_LABELS.contains(&label.as_str()) || label == "node" {
                continue;
            }
            assert!(
                recorded[label].contains(value),
                "{name}{{{label}={value:?}}}: orders_api records {:?}",
                recorded[label]
            );
        }
        families.insert(name.as_str());
    }
    assert_eq!(
        families,
        BTreeSet::from([
            "tollgate_breaker_state",
            "tollgate_fallbacks_total",
            "tollgate_live_instances"
        ])
    );
}
