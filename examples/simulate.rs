//! The outage simulator's command line: the running example (an orders API on 4
//! instances, 50 requests a second per customer, a 30 s outage) on tollgate's own layer,
//! limiter, circuit breaker and failure policies, through `tollgate::simulator`.
//!
//! ```text
//! cargo run --release --example simulate -- [FLAGS]
//! ```
//!
//! An orders API on 4 instances limits each customer to 50 requests per second; acme sends
//! 120 req/s, globex 20, initech 5, each customer's requests spread round robin over the
//! instances. After 30 s the store fails for 30 s, then 30 s of recovery follow. Every
//! failure policy runs its own group of instances through the same timeline; each instance
//! is a real `RateLimitLayer` (keyed on `x-customer-id`) around a tower service answering
//! `GET /orders`, and the simulator prints the admitted requests per second per customer in
//! each phase.
//!
//! By default an in-process store shared by the instances stands in for Redis and time is
//! virtual (tokio's paused clock drives the store timeout, the breaker, the denial cache and
//! every counter), so the 90 s take a few seconds. `--redis URL` runs the same scenario in
//! real time against a real Redis, through a fault proxy that the simulator starts itself.
//! Run with `--help` for the flags. The engine is the library's `simulator` feature; this
//! file parses the flags and prints the tables, the JSON and the chart.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use plotters::prelude::{
    ChartBuilder, Color, FontStyle, IntoDrawingArea, IntoFont, LineSeries, RGBColor, Rectangle,
    SVGBackend, TRANSPARENT, Text, WHITE,
};
use tollgate::simulator::{
    AlgorithmKind, Customer, FaultKind, Phase, PolicyName, Report, Scenario, ScenarioError,
    SimulationError,
};
use tollgate::store::Algorithm;

/// The customers' colours in the chart, in the order of `--traffic`.
const COLORS: [RGBColor; 8] = [
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
const OUTAGE_SHADE: RGBColor = RGBColor(0xfd, 0xe2, 0xe2);
/// The frame around each panel of the chart.
const FRAME: RGBColor = RGBColor(0x88, 0x88, 0x88);

// ---------------------------------------------------------------------------------------
// Flags

/// The tollgate outage simulator: the running example's store outage, replayed through
/// tollgate's layer, limiter, breaker and failure policies.
#[derive(Debug, Parser)]
#[command(name = "simulate")]
struct Flags {
    /// Requests per window per customer [default: 50]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    limit: Option<u64>,
    /// The window, in seconds [default: 1]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    window_secs: Option<u64>,
    /// Limiter instances behind the round robin [default: 4]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    instances: Option<usize>,
    /// sliding-window (default) or token-bucket
    #[arg(long, value_name = "A", value_parser = parse_algorithm)]
    algorithm: Option<AlgorithmKind>,
    /// The token bucket's capacity [default: the limit]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    burst: Option<u64>,
    /// Length of the phase before the outage [default: 30]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    normal_secs: Option<u64>,
    /// Length of the store outage [default: 30]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    outage_secs: Option<u64>,
    /// Length of the phase after it [default: 30]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    recovery_secs: Option<u64>,
    /// A customer sending RATE requests per second; repeat it; replaces the default
    /// acme=120, globex=20, initech=5
    #[arg(long, value_name = "NAME=RATE", value_parser = parse_customer)]
    traffic: Vec<Customer>,
    /// Run only this failure policy; repeat it (default: all of open, closed, local-share,
    /// static, static-then-local-share, local-share-no-divisor, local-share-stale-divisor,
    /// local-share-pinned)
    #[arg(long, value_name = "NAME", value_parser = parse_policy)]
    policy: Vec<PolicyName>,
    /// refuse: the store refuses every call at once (default); blackhole: calls never
    /// return, the store timeout ends them; slow: the store answers after twice the store
    /// timeout
    #[arg(long, value_name = "F", value_parser = parse_fault)]
    fault: Option<FaultKind>,
    /// The limiter's store timeout [default: 20]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    store_timeout_ms: Option<u64>,
    /// How long the breaker first stays open at most (default: the library's
    /// BreakerConfig::default(), 500)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    breaker_base_open_ms: Option<u64>,
    /// The most the breaker's open interval grows to as it doubles per failed probe
    /// (default: the library's BreakerConfig::default(), 1000)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    breaker_max_open_ms: Option<u64>,
    /// Print the rows as a JSON array, and nothing else, on stdout
    #[arg(long)]
    json: bool,
    /// Also draw the admitted rate over time, one panel per policy
    #[arg(long, value_name = "FILE.svg", value_parser = parse_chart)]
    chart: Option<PathBuf>,
    /// Run in real time against the Redis at URL (redis://127.0.0.1:PORT/) through a fault
    /// proxy that the simulator starts itself
    #[arg(long, value_name = "URL", value_parser = parse_redis_url)]
    redis: Option<RedisUrl>,
}

fn parse_algorithm(value: &str) -> Result<AlgorithmKind, String> {
    value.parse().map_err(|e: ScenarioError| e.to_string())
}

fn parse_customer(value: &str) -> Result<Customer, String> {
    value.parse().map_err(|e: ScenarioError| e.to_string())
}

fn parse_policy(value: &str) -> Result<PolicyName, String> {
    value.parse().map_err(|e: ScenarioError| e.to_string())
}

fn parse_fault(value: &str) -> Result<FaultKind, String> {
    value.parse().map_err(|e: ScenarioError| e.to_string())
}

fn parse_chart(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err("--chart needs a file name".to_owned());
    }
    Ok(PathBuf::from(value))
}

/// What the run does: the scenario, and how to report it.
#[derive(Clone, Debug)]
struct Options {
    scenario: Scenario,
    json: bool,
    chart: Option<PathBuf>,
    redis: Option<RedisUrl>,
}

impl Options {
    /// The scenario the flags describe, checked: a bad number says which flag it was.
    fn from_flags(flags: Flags) -> Result<Self, String> {
        let mut scenario = Scenario::default();
        if let Some(n) = flags.limit {
            scenario = scenario.limit(n);
        }
        if let Some(n) = flags.window_secs {
            scenario = scenario.window_secs(n);
        }
        if let Some(n) = flags.instances {
            scenario = scenario.instances(n);
        }
        if let Some(algorithm) = flags.algorithm {
            scenario = scenario.algorithm(algorithm);
        }
        if let Some(n) = flags.burst {
            scenario = scenario.burst(n);
        }
        if let Some(n) = flags.normal_secs {
            scenario = scenario.normal_secs(n);
        }
        if let Some(n) = flags.outage_secs {
            scenario = scenario.outage_secs(n);
        }
        if let Some(n) = flags.recovery_secs {
            scenario = scenario.recovery_secs(n);
        }
        if !flags.traffic.is_empty() {
            scenario = scenario.traffic(flags.traffic);
        }
        if !flags.policy.is_empty() {
            // Always in the canonical order, each once.
            scenario = scenario.policies(
                PolicyName::ALL
                    .into_iter()
                    .filter(|p| flags.policy.contains(p)),
            );
        }
        if let Some(fault) = flags.fault {
            scenario = scenario.fault(fault);
        }
        if let Some(n) = flags.store_timeout_ms {
            scenario = scenario.store_timeout_ms(n);
        }
        if let Some(n) = flags.breaker_base_open_ms {
            scenario = scenario.breaker_base_open_ms(n);
        }
        if let Some(n) = flags.breaker_max_open_ms {
            scenario = scenario.breaker_max_open_ms(n);
        }
        scenario.validate().map_err(|e| flag_error(&e))?;
        if flags.redis.is_some() && cfg!(not(feature = "redis")) {
            return Err("--redis needs the crate's `redis` feature".to_owned());
        }
        Ok(Self {
            scenario,
            json: flags.json,
            chart: flags.chart,
            redis: flags.redis,
        })
    }

    fn algorithm_name(&self) -> String {
        match self.scenario.algorithm_value() {
            AlgorithmKind::TokenBucket => {
                format!("token bucket, burst {}", self.scenario.burst_value())
            }
            _ => "sliding window".to_owned(),
        }
    }

    /// The ends of the normal and outage phases, in milliseconds from the start.
    fn boundaries_ms(&self) -> [f64; 2] {
        let normal = self.scenario.phase_secs(Phase::Normal);
        let outage = self.scenario.phase_secs(Phase::Outage);
        [(normal * 1_000) as f64, ((normal + outage) * 1_000) as f64]
    }
}

/// A scenario error in terms of the flags.
fn flag_error(error: &ScenarioError) -> String {
    match error {
        ScenarioError::OutOfRange {
            setting,
            value,
            min,
            max,
        } => format!(
            "--{}: {value} is out of range ({min} to {max})",
            setting.replace('_', "-")
        ),
        ScenarioError::BurstNeedsTokenBucket => "--burst needs --algorithm token-bucket".to_owned(),
        ScenarioError::BreakerBaseAboveMax { base_ms, max_ms } => format!(
            "--breaker-base-open-ms ({base_ms} ms) must not exceed --breaker-max-open-ms \
             ({max_ms} ms); the defaults are 500 and 1000"
        ),
        ScenarioError::QuotaTooLarge => {
            "--limit (or --burst) x --window-secs (ms) must stay below 2^53".to_owned()
        }
        ScenarioError::BadCustomerName(_)
        | ScenarioError::BadRate { .. }
        | ScenarioError::DuplicateCustomer(_)
        | ScenarioError::NotNameRate(_) => format!("--traffic: {error}"),
        other => other.to_string(),
    }
}

/// `redis://[userinfo@]host[:port][/db]` split around its host and port.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct RedisUrl {
    /// As given.
    url: String,
    userinfo: String,
    port: u16,
    path: String,
}

fn parse_redis_url(url: &str) -> Result<RedisUrl, String> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| format!("{url:?} is not a redis:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (format!("{userinfo}@"), host_port),
        None => (String::new(), authority),
    };
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| format!("bad port in {url:?}"))?,
        ),
        None => (host_port, 6379),
    };
    if !matches!(host, "127.0.0.1" | "localhost") {
        return Err(format!(
            "the fault proxy forwards to 127.0.0.1 only; {host:?} is not loopback"
        ));
    }
    Ok(RedisUrl {
        url: url.to_owned(),
        userinfo,
        port,
        path: path.to_owned(),
    })
}

// ---------------------------------------------------------------------------------------
// Running

#[cfg(feature = "redis")]
mod real {
    //! The same groups on a real Redis, through the fault proxy, in real time.

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use tollgate::RedisBackend;
    use tollgate::simulator::{FaultKind, FaultSwitch, Report, SimulationError};
    use tollgate_testkit::proxy::{Fault, FaultProxy};

    use super::{Options, RedisUrl};

    /// Switches the proxy's fault, and tells the operator (on stderr).
    #[derive(Debug)]
    struct ProxySwitch {
        proxy: Arc<FaultProxy>,
        slow_by: Duration,
    }

    impl FaultSwitch for ProxySwitch {
        fn set(
            &self,
            fault: Option<FaultKind>,
        ) -> Pin<Box<dyn Future<Output = Result<(), SimulationError>> + Send + '_>> {
            eprintln!(
                "simulate: {}",
                if fault.is_some() {
                    "the store fails now"
                } else {
                    "the store is back"
                }
            );
            let proxy = self.proxy.clone();
            let fault = match fault {
                Some(FaultKind::Refuse) => Fault::Refuse,
                Some(FaultKind::Blackhole) => Fault::Blackhole,
                Some(_) => Fault::Delay(self.slow_by),
                None => Fault::Pass,
            };
            Box::pin(async move {
                tokio::task::spawn_blocking(move || proxy.set(fault))
                    .await
                    .map_err(|e| SimulationError::FaultSwitch(e.to_string()))
            })
        }
    }

    /// Starts the proxy in front of `target`, connects every instance through it, and
    /// runs the scenario.
    pub(super) async fn run(options: &Options, target: &RedisUrl) -> Result<Report, String> {
        let scenario = &options.scenario;
        let proxy = Arc::new(FaultProxy::start(target.port));
        let proxied = format!(
            "redis://{}127.0.0.1:{}{}",
            target.userinfo,
            proxy.port(),
            target.path
        );
        // Fresh keys for every run, apart for every group.
        let run = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut stores: Vec<Vec<RedisBackend>> = Vec::new();
        for (name, instances) in scenario
            .group_names()
            .iter()
            .zip(scenario.group_instances())
        {
            let mut group = Vec::new();
            for _ in 0..instances {
                let store = RedisBackend::builder(proxied.clone())
                    .prefix(format!("tollgate-sim-{}-{run}-{name}", std::process::id()))
                    .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
                    .build()
                    .map_err(|e| format!("--redis: {e}"))?;
                store.ping().await.map_err(|e| {
                    format!(
                        "cannot reach Redis at {} (through the fault proxy): {e}",
                        target.url
                    )
                })?;
                group.push(store);
            }
            stores.push(group);
        }
        let switch = ProxySwitch {
            proxy,
            slow_by: Duration::from_millis(scenario.store_timeout_ms_value() * 2),
        };
        eprintln!(
            "simulate: running {} s in real time against {}",
            scenario.total_secs(),
            target.url
        );
        scenario
            .run_against(|g, i| stores[g][i].clone(), &switch)
            .await
            .map_err(|e| e.to_string())
    }
}

fn run(options: &Options) -> Result<Report, String> {
    match &options.redis {
        None => options
            .scenario
            .run_blocking()
            .map_err(|e: SimulationError| e.to_string()),
        #[cfg(feature = "redis")]
        Some(url) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
            runtime.block_on(real::run(options, url))
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => Err("--redis needs the crate's `redis` feature".to_owned()),
    }
}

// ---------------------------------------------------------------------------------------
// Output

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The rows as a JSON array, one object per line, keys in reading order.
fn json(report: &Report) -> String {
    let quote = |text: &str| serde_json::to_string(text).expect("a JSON string");
    let number = |x: f64| serde_json::to_string(&round2(x)).expect("a JSON number");
    let mut rows = Vec::new();
    for row in report.rows() {
        // The recovery rows also say when the group's last breaker closed (null: not
        // within the phase), as the table's "all breakers closed after" column does.
        let closed = if row.phase == Phase::Recovery {
            let ms = row
                .all_breakers_closed_after
                .map_or("null".to_owned(), |d| number(d.as_secs_f64() * 1_000.0));
            format!(", \"all_breakers_closed_after_ms\": {ms}")
        } else {
            String::new()
        };
        rows.push(format!(
            "  {{\"policy\": {}, \"phase\": {}, \"customer\": {}, \"sent_per_sec\": {}, \
             \"admitted_per_sec\": {}, \"refused_429\": {}, \"refused_503\": {}{closed}}}",
            quote(&row.policy),
            quote(row.phase.name()),
            quote(&row.customer),
            number(row.sent_per_sec),
            number(row.admitted_per_sec),
            row.refused_429,
            row.refused_503,
        ));
    }
    format!("[\n{}\n]\n", rows.join(",\n"))
}

/// A rate with at most two decimals and no trailing zeros.
fn rate_text(rate: f64) -> String {
    let text = format!("{rate:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// "25 per 2 s (12.5/s)", or a token bucket's rate and burst.
fn describe(algorithm: &Algorithm) -> String {
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

fn policy_note(options: &Options, policy: PolicyName) -> Option<String> {
    let n = options.scenario.instances_value();
    let first = options.scenario.traffic_value()[0].name();
    match policy {
        PolicyName::LocalShareNoDivisor => Some(format!(
            "each of the {n} instances enforces the full limit of {}",
            options.scenario.limit_value()
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

fn table(options: &Options, report: &Report) -> String {
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
        "A local share is the policy as the crate divides it by the {n} configured instances: {} \
         per instance.",
        describe(&share)
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
        if let Some(note) = policy_note(options, *policy) {
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
            for counts in (0..report.customers().len()).map(|c| tally.counts(c, Phase::ALL[phase]))
            {
                row.push(format!("{:.1}", per_sec(counts.admitted, secs)));
                r429 += counts.refused_429;
                r503 += counts.refused_503;
            }
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
                    if i == 0 {
                        format!("{cell:<w$}", w = widths[i])
                    } else {
                        format!("{cell:>w$}", w = widths[i])
                    }
                })
                .collect();
            format!("| {} |", cells.join(" | "))
        };
        let _ = writeln!(out, "{}", line(&header));
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if i == 0 {
                    "-".repeat(w + 2)
                } else {
                    format!("{}:", "-".repeat(w + 1))
                }
            })
            .collect();
        let _ = writeln!(out, "|{}|", rule.join("|"));
        for row in &rows {
            let _ = writeln!(out, "{}", line(row));
        }
    }
    out
}

/// The admitted rate over time as an SVG drawn with plotters: one panel per policy, one
/// line per customer, the store outage shaded, and one legend for all panels at the top.
fn chart(options: &Options, report: &Report) -> Result<String, Box<dyn std::error::Error>> {
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
            let title = match policy_note(options, *policy) {
                Some(note) => format!("{} ({note})", policy.name()),
                None => policy.name().to_owned(),
            };
            let mut panel = ChartBuilder::on(cell)
                .caption(title, ("sans-serif", 17, FontStyle::Bold))
                .margin(10)
                .x_label_area_size(38)
                .y_label_area_size(50)
                .build_cartesian_2d(0.0..total, 0.0..y_max)?;
            panel.draw_series(std::iter::once(Rectangle::new(
                [(normal_end, 0.0), (outage_end, y_max)],
                OUTAGE_SHADE.filled(),
            )))?;
            panel
                .configure_mesh()
                .x_desc("time (s)")
                .y_desc("admitted/s")
                .x_labels(10)
                .y_labels(6)
                .light_line_style(TRANSPARENT)
                // No axis lines nor tick marks: the frame below stands for them, and the
                // SVG's only polylines are the customers' lines.
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

/// plotters' SVG puts each text on a line of its own between its `<text ...>` and
/// `</text>` tags; SVG drops those line breaks anyway, so take them out and keep each text
/// element on one line: `<text ...>closed</text>`.
fn tight_text(svg: &str) -> String {
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

fn per_sec(count: u64, secs: u64) -> f64 {
    count as f64 / secs as f64
}

fn main() -> ExitCode {
    let flags = match Flags::try_parse() {
        Ok(flags) => flags,
        // --help and --version print on stdout and succeed; a bad flag exits with 2.
        Err(error) => error.exit(),
    };
    let options = match Options::from_flags(flags) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("simulate: {message}\nTry `simulate --help` for the flags.");
            return ExitCode::from(2);
        }
    };
    let report = match run(&options) {
        Ok(report) => report,
        Err(message) => {
            eprintln!("simulate: {message}");
            return ExitCode::FAILURE;
        }
    };
    let text = if options.json {
        json(&report)
    } else {
        table(&options, &report)
    };
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("simulate: cannot write the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &options.chart {
        let written = chart(&options, &report)
            .map_err(|e| e.to_string())
            .and_then(|svg| std::fs::write(path, svg).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!(
                "simulate: cannot write the chart to {}: {e}",
                path.display()
            );
            return ExitCode::FAILURE;
        }
        if !options.json {
            eprintln!("simulate: chart written to {}", path.display());
        }
    }
    let unexpected = report.unexpected_statuses();
    if unexpected > 0 {
        eprintln!(
            "simulate: {unexpected} requests were answered with a status other than 200, 429 or 503"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
