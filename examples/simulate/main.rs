//! The outage simulator's command line: the running example (an orders API on 4
//! instances, 50 requests a second per customer, a 30 s outage) on tollgate's own layer,
//! limiter, circuit breaker and failure policies, through the `tollgate-simulator` crate.
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
//! `--serve ADDR` serves a page instead (see `serve.rs`) whose controls edit the same
//! scenario and rerun it on every change.
//!
//! `--regions` replays the running example across three regions instead, one limit per
//! customer across them: the two-tier store (regional stores leasing each caller's global
//! quota from a global store a WAN round trip away) beside each region counting alone,
//! with the busiest region cut off from the global store (see `regions.rs`).
//!
//! Run with `--help` for the flags. The engine is the `tollgate-simulator` crate; this
//! file parses the flags, `output.rs` prints the tables and the JSON, `chart.rs` draws the
//! chart, `real.rs` runs against Redis, `regions.rs` prints and draws the regions' run, and
//! `serve.rs` with `api.rs` serves the page.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tollgate_simulator::{
    AlgorithmKind, Customer, FaultKind, Phase, PolicyName, RegionFault, Report, Scenario,
    ScenarioError, ShareBy, SimulationError,
};

mod api;
mod chart;
mod output;
#[cfg(feature = "redis")]
mod real;
mod regions;
mod serve;

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
    /// local-share-pinned, local-share-leased)
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
    /// Serve the interactive page on ADDR (127.0.0.1:8080; port 0 picks a free one) instead
    /// of running once: its controls start at the scenario these flags describe, and it
    /// reruns on every change. Prints the address it listens on
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["json", "chart", "redis"])]
    serve: Option<SocketAddr>,
    /// One limit across regions instead: the running example on three regions (us-east,
    /// eu-west, ap-south, 4 instances each), acme's requests spread 80/15/5 over them
    /// (globex 25/50/25, initech all in ap-south), us-east cut off from the global store
    /// during the outage; the two-tier store (regional stores leasing the global quota)
    /// beside each region counting alone. Takes --limit, --window-secs, the phases and
    /// --chart
    #[arg(long, conflicts_with_all = [
        "instances", "algorithm", "burst", "traffic", "policy", "fault", "store_timeout_ms",
        "breaker_base_open_ms", "breaker_max_open_ms", "json", "redis", "serve",
    ])]
    regions: bool,
    /// With --regions: the WAN round trip between a region and the global store
    /// [default: 100]
    #[arg(
        long,
        value_name = "N",
        requires = "regions",
        allow_negative_numbers = true
    )]
    wan_rtt_ms: Option<u64>,
    /// With --regions: what fails during the outage: partition:REGION (default
    /// partition:us-east), store-lost:REGION or global-lost
    #[arg(long, value_name = "F", requires = "regions", value_parser = regions::parse_fault)]
    region_fault: Option<RegionFault>,
    /// With --regions: a region cut off falls back to its share of the limit by demand
    /// (default) or weight
    #[arg(long, value_name = "S", requires = "regions", value_parser = regions::parse_share_by)]
    share_by: Option<ShareBy>,
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
    serve: Option<SocketAddr>,
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
            serve: flags.serve,
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

fn main() -> ExitCode {
    let flags = match Flags::try_parse() {
        Ok(flags) => flags,
        // --help and --version print on stdout and succeed; a bad flag exits with 2.
        Err(error) => error.exit(),
    };
    if flags.regions {
        return regions::run(&flags);
    }
    let options = match Options::from_flags(flags) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("simulate: {message}\nTry `simulate --help` for the flags.");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = options.serve {
        return match serve::serve(addr, options.scenario) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("simulate: {message}");
                ExitCode::FAILURE
            }
        };
    }
    let report = match run(&options) {
        Ok(report) => report,
        Err(message) => {
            eprintln!("simulate: {message}");
            return ExitCode::FAILURE;
        }
    };
    let text = if options.json {
        output::json(&report)
    } else {
        output::table(&options, &report)
    };
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("simulate: cannot write the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &options.chart {
        let written = chart::chart(&options, &report)
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
