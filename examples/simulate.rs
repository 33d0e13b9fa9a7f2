//! The outage simulator: the running example (an orders API on 4 instances, 50 requests a
//! second per customer, a 30 s outage) on tollgate's own layer, limiter, circuit breaker
//! and failure policies.
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
//! `GET /orders`, each request an `http::Request` through it, and the simulator prints the
//! admitted requests per second per customer in each phase.
//!
//! By default an in-process store shared by the instances stands in for Redis and time is
//! virtual (tokio's paused clock drives the store timeout, the breaker, the denial cache and
//! every counter), so the 90 s take a few seconds. `--redis URL` runs the same scenario in
//! real time against a real Redis, through a fault proxy that the simulator starts itself.
//! Run with `--help` for the flags.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Ready;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use plotters::prelude::{
    ChartBuilder, Color, FontStyle, IntoDrawingArea, IntoFont, LineSeries, RGBColor, Rectangle,
    SVGBackend, TRANSPARENT, Text, WHITE,
};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate::store::{
    Algorithm, Backend, CallerKey, CheckFuture, Clock, StoreError, StoreErrorKind,
};
use tollgate::{
    BreakerConfig, FailurePolicy, HeaderKey, InMemoryBackend, InstanceCount, Limiter, Policy,
    Quota, RateLimit, RateLimitLayer,
};
use tower::{Layer, Service, ServiceExt};

const USAGE: &str = "\
usage: simulate [--limit N] [--window-secs N] [--instances N] [--algorithm sliding-window|token-bucket]
                [--burst N] [--normal-secs N] [--outage-secs N] [--recovery-secs N]
                [--traffic NAME=RATE]... [--policy NAME]... [--fault refuse|blackhole|slow]
                [--store-timeout-ms N] [--breaker-base-open-ms N] [--breaker-max-open-ms N]
                [--json] [--chart FILE.svg] [--redis URL]

  --limit N               requests per window per customer (default 50)
  --window-secs N         the window, in seconds (default 1)
  --instances N           limiter instances behind the round robin (default 4)
  --algorithm A           sliding-window (default) or token-bucket
  --burst N               the token bucket's capacity (default: the limit)
  --normal-secs N         length of the phase before the outage (default 30)
  --outage-secs N         length of the store outage (default 30)
  --recovery-secs N       length of the phase after it (default 30)
  --traffic NAME=RATE     a customer sending RATE requests per second; repeat it; replaces
                          the default acme=120, globex=20, initech=5
  --policy NAME           run only this failure policy; repeat it (default: all of
                          open, closed, local-share, static, static-then-local-share,
                          local-share-no-divisor, local-share-stale-divisor, local-share-pinned)
  --fault F               refuse: the store refuses every call at once (default);
                          blackhole: calls never return, the store timeout ends them;
                          slow: the store answers after twice the store timeout
  --store-timeout-ms N    the limiter's store timeout (default 20)
  --breaker-base-open-ms N, --breaker-max-open-ms N
                          how long the breaker stays open: the ceiling of the first interval,
                          and the most it grows to as it doubles per failed probe (default:
                          the library's BreakerConfig::default(), 500 and 1000)
  --json                  print the rows as a JSON array, and nothing else, on stdout
  --chart FILE.svg        also draw the admitted rate over time, one panel per policy
  --redis URL             run in real time against the Redis at URL (redis://127.0.0.1:PORT/)
                          through a fault proxy that the simulator starts itself";

/// Where the virtual clock starts: 2026-01-01T00:00:00Z, rounded down to the window so
/// that the phases start on window boundaries.
const VIRTUAL_EPOCH_MS: u64 = 1_767_225_600_000;
/// Past this many simulated requests, the run would take too long to be a demo.
const MAX_REQUESTS: f64 = 50_000_000.0;
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
// Options

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PolicyName {
    Open,
    Closed,
    LocalShare,
    Static,
    StaticThenLocalShare,
    LocalShareNoDivisor,
    LocalShareStaleDivisor,
    LocalSharePinned,
}

const ALL_POLICIES: [PolicyName; 8] = [
    PolicyName::Open,
    PolicyName::Closed,
    PolicyName::LocalShare,
    PolicyName::Static,
    PolicyName::StaticThenLocalShare,
    PolicyName::LocalShareNoDivisor,
    PolicyName::LocalShareStaleDivisor,
    PolicyName::LocalSharePinned,
];

impl PolicyName {
    fn name(self) -> &'static str {
        match self {
            PolicyName::Open => "open",
            PolicyName::Closed => "closed",
            PolicyName::LocalShare => "local-share",
            PolicyName::Static => "static",
            PolicyName::StaticThenLocalShare => "static-then-local-share",
            PolicyName::LocalShareNoDivisor => "local-share-no-divisor",
            PolicyName::LocalShareStaleDivisor => "local-share-stale-divisor",
            PolicyName::LocalSharePinned => "local-share-pinned",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        ALL_POLICIES.into_iter().find(|p| p.name() == name)
    }

    /// What the limiters of this group do when the store fails; `instances` is the number
    /// of instances the deployment is configured with.
    fn failure_policy(self, instances: u64) -> FailurePolicy {
        let share = || FailurePolicy::local_share(InstanceCount::fixed(instances));
        match self {
            PolicyName::Open => FailurePolicy::open(),
            PolicyName::Closed => FailurePolicy::closed(),
            PolicyName::Static => FailurePolicy::fail_static(),
            PolicyName::StaticThenLocalShare => FailurePolicy::static_then(share()),
            PolicyName::LocalShareNoDivisor => FailurePolicy::local_share(InstanceCount::fixed(1)),
            PolicyName::LocalShare
            | PolicyName::LocalShareStaleDivisor
            | PolicyName::LocalSharePinned => share(),
        }
    }

    /// How many instances actually run: twice the divisor when it is stale.
    fn running_instances(self, instances: usize) -> usize {
        match self {
            PolicyName::LocalShareStaleDivisor => instances * 2,
            _ => instances,
        }
    }

    /// Whether the first customer's traffic all lands on the first instance.
    fn pins_first_customer(self) -> bool {
        self == PolicyName::LocalSharePinned
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Refuse,
    Blackhole,
    Slow,
}

impl FaultKind {
    fn describe(self, timeout_ms: u64) -> String {
        match self {
            FaultKind::Refuse => "the store refuses every call".to_owned(),
            FaultKind::Blackhole => format!(
                "the store is blackholed: calls never return, the {timeout_ms} ms store timeout ends them"
            ),
            FaultKind::Slow => format!(
                "the store is slow: it answers after {} ms, twice the store timeout",
                timeout_ms * 2
            ),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AlgorithmKind {
    SlidingWindow,
    TokenBucket,
}

#[derive(Clone, Debug)]
struct Customer {
    name: String,
    rate: f64,
}

#[derive(Clone, Debug)]
struct Options {
    limit: u64,
    window_secs: u64,
    instances: usize,
    algorithm: AlgorithmKind,
    burst: Option<u64>,
    normal_secs: u64,
    outage_secs: u64,
    recovery_secs: u64,
    traffic: Vec<Customer>,
    policies: Vec<PolicyName>,
    fault: FaultKind,
    store_timeout_ms: u64,
    /// Overrides of the library's default breaker; `None` keeps the default.
    breaker_base_open_ms: Option<u64>,
    breaker_max_open_ms: Option<u64>,
    json: bool,
    chart: Option<PathBuf>,
    redis: Option<RedisUrl>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            limit: 50,
            window_secs: 1,
            instances: 4,
            algorithm: AlgorithmKind::SlidingWindow,
            burst: None,
            normal_secs: 30,
            outage_secs: 30,
            recovery_secs: 30,
            traffic: [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)]
                .into_iter()
                .map(|(name, rate)| Customer {
                    name: name.to_owned(),
                    rate,
                })
                .collect(),
            policies: ALL_POLICIES.to_vec(),
            fault: FaultKind::Refuse,
            store_timeout_ms: 20,
            breaker_base_open_ms: None,
            breaker_max_open_ms: None,
            json: false,
            chart: None,
            redis: None,
        }
    }
}

impl Options {
    fn policy(&self) -> Policy {
        let name = match self.window_secs {
            1 => "per-second".to_owned(),
            60 => "per-minute".to_owned(),
            n => format!("per-{n}s"),
        };
        let quota = Quota::new(self.limit, Duration::from_secs(self.window_secs));
        match self.algorithm {
            AlgorithmKind::SlidingWindow => Policy::sliding_window(name, quota),
            AlgorithmKind::TokenBucket => {
                Policy::token_bucket(name, quota, self.burst.unwrap_or(self.limit))
            }
        }
    }

    /// The library's default breaker, with the flags' overrides: what a user gets unless
    /// they configure it.
    fn breaker(&self) -> BreakerConfig {
        let mut config = BreakerConfig::default();
        if let Some(ms) = self.breaker_base_open_ms {
            config = config.base_open(Duration::from_millis(ms));
        }
        if let Some(ms) = self.breaker_max_open_ms {
            config = config.max_open(Duration::from_millis(ms));
        }
        config
    }

    fn algorithm_name(&self) -> String {
        match self.algorithm {
            AlgorithmKind::SlidingWindow => "sliding window".to_owned(),
            AlgorithmKind::TokenBucket => {
                format!("token bucket, burst {}", self.burst.unwrap_or(self.limit))
            }
        }
    }

    fn total_secs(&self) -> u64 {
        self.normal_secs + self.outage_secs + self.recovery_secs
    }

    /// The ends of the normal and outage phases, in milliseconds from the start.
    fn boundaries_ms(&self) -> [f64; 2] {
        [
            (self.normal_secs * 1_000) as f64,
            ((self.normal_secs + self.outage_secs) * 1_000) as f64,
        ]
    }

    fn phase_secs(&self, phase: usize) -> u64 {
        [self.normal_secs, self.outage_secs, self.recovery_secs][phase]
    }
}

const PHASES: [&str; 3] = ["normal", "outage", "recovery"];

/// Parses the command line: `Ok(None)` asks for the usage text.
fn parse_options(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut options = Options::default();
    let mut traffic: Vec<Customer> = Vec::new();
    let mut policies: Vec<PolicyName> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let takes_value = !matches!(flag.as_str(), "--json" | "--help" | "-h");
        if !takes_value && inline.is_some() {
            return Err(format!("{flag} takes no value"));
        }
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(value) => Ok(value),
                None => args.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "--help" | "-h" => return Ok(None),
            "--json" => options.json = true,
            "--limit" => options.limit = number(&flag, &value()?, 1, 1_000_000_000)?,
            "--window-secs" => options.window_secs = number(&flag, &value()?, 1, 86_400)?,
            "--instances" => options.instances = number(&flag, &value()?, 1, 1_000)? as usize,
            "--burst" => options.burst = Some(number(&flag, &value()?, 1, 1_000_000_000)?),
            "--normal-secs" => options.normal_secs = number(&flag, &value()?, 1, 86_400)?,
            "--outage-secs" => options.outage_secs = number(&flag, &value()?, 1, 86_400)?,
            "--recovery-secs" => options.recovery_secs = number(&flag, &value()?, 1, 86_400)?,
            "--store-timeout-ms" => {
                options.store_timeout_ms = number(&flag, &value()?, 1, 60_000)?;
            }
            "--breaker-base-open-ms" => {
                options.breaker_base_open_ms = Some(number(&flag, &value()?, 1, 3_600_000)?);
            }
            "--breaker-max-open-ms" => {
                options.breaker_max_open_ms = Some(number(&flag, &value()?, 1, 3_600_000)?);
            }
            "--algorithm" => {
                options.algorithm = match value()?.as_str() {
                    "sliding-window" => AlgorithmKind::SlidingWindow,
                    "token-bucket" => AlgorithmKind::TokenBucket,
                    other => {
                        return Err(format!(
                            "--algorithm: unknown algorithm {other:?} (sliding-window or token-bucket)"
                        ));
                    }
                }
            }
            "--fault" => {
                options.fault = match value()?.as_str() {
                    "refuse" => FaultKind::Refuse,
                    "blackhole" => FaultKind::Blackhole,
                    "slow" => FaultKind::Slow,
                    other => {
                        return Err(format!(
                            "--fault: unknown fault {other:?} (refuse, blackhole or slow)"
                        ));
                    }
                }
            }
            "--policy" => {
                let name = value()?;
                let policy = PolicyName::parse(&name).ok_or_else(|| {
                    let known: Vec<&str> = ALL_POLICIES.iter().map(|p| p.name()).collect();
                    format!(
                        "--policy: unknown policy {name:?} (one of {})",
                        known.join(", ")
                    )
                })?;
                if !policies.contains(&policy) {
                    policies.push(policy);
                }
            }
            "--traffic" => {
                let customer = parse_traffic(&value()?)?;
                if traffic.iter().any(|c| c.name == customer.name) {
                    return Err(format!(
                        "--traffic: customer {:?} given twice",
                        customer.name
                    ));
                }
                traffic.push(customer);
            }
            "--chart" => {
                let path = value()?;
                if path.is_empty() {
                    return Err("--chart needs a file name".to_owned());
                }
                options.chart = Some(PathBuf::from(path));
            }
            "--redis" => options.redis = Some(parse_redis_url(&value()?)?),
            other if other.starts_with('-') => {
                return Err(format!("unknown flag {other}"));
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if !traffic.is_empty() {
        options.traffic = traffic;
    }
    if !policies.is_empty() {
        // Always in the canonical order.
        options.policies = ALL_POLICIES
            .into_iter()
            .filter(|p| policies.contains(p))
            .collect();
    }
    if options.burst.is_some() && options.algorithm != AlgorithmKind::TokenBucket {
        return Err("--burst needs --algorithm token-bucket".to_owned());
    }
    let breaker = options.breaker();
    if breaker.base_open_duration() > breaker.max_open_duration() {
        return Err(format!(
            "--breaker-base-open-ms ({} ms) must not exceed --breaker-max-open-ms ({} ms); \
             the defaults are 500 and 1000",
            breaker.base_open_duration().as_millis(),
            breaker.max_open_duration().as_millis()
        ));
    }
    let period_ms = u128::from(options.window_secs) * 1_000;
    let largest = u128::from(options.limit.max(options.burst.unwrap_or(0)));
    if largest * period_ms >= 1 << 53 {
        return Err("--limit (or --burst) x --window-secs (ms) must stay below 2^53".to_owned());
    }
    let instances: usize = options
        .policies
        .iter()
        .map(|p| p.running_instances(options.instances))
        .max()
        .unwrap_or(0);
    let requests = options.traffic.iter().map(|c| c.rate).sum::<f64>()
        * options.total_secs() as f64
        * options.policies.len() as f64;
    if requests > MAX_REQUESTS || instances > 2_000 {
        return Err(format!(
            "that is {requests:.0} requests over {instances} instances: too many to simulate \
             (at most {MAX_REQUESTS:.0}); lower the rates, the phases or the policies"
        ));
    }
    if options.redis.is_some() && cfg!(not(feature = "redis")) {
        return Err("--redis needs the crate's `redis` feature".to_owned());
    }
    Ok(Some(options))
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
        .ok_or_else(|| format!("--redis: {url:?} is not a redis:// URL"))?;
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
                .map_err(|_| format!("--redis: bad port in {url:?}"))?,
        ),
        None => (host_port, 6379),
    };
    if !matches!(host, "127.0.0.1" | "localhost") {
        return Err(format!(
            "--redis: the fault proxy forwards to 127.0.0.1 only; {host:?} is not loopback"
        ));
    }
    Ok(RedisUrl {
        url: url.to_owned(),
        userinfo,
        port,
        path: path.to_owned(),
    })
}

fn number(flag: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    let n: u64 = value
        .parse()
        .map_err(|_| format!("{flag}: {value:?} is not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{flag}: {n} is out of range ({min} to {max})"));
    }
    Ok(n)
}

fn parse_traffic(value: &str) -> Result<Customer, String> {
    let (name, rate) = value
        .split_once('=')
        .ok_or_else(|| format!("--traffic: {value:?} is not NAME=RATE"))?;
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid_name {
        return Err(format!(
            "--traffic: customer name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    let rate: f64 = rate
        .parse()
        .map_err(|_| format!("--traffic: rate {rate:?} of {name} is not a number"))?;
    if !rate.is_finite() || rate <= 0.0 || rate > 100_000.0 {
        return Err(format!(
            "--traffic: rate {rate} of {name} must be above 0 and at most 100000 per second"
        ));
    }
    Ok(Customer {
        name: name.to_owned(),
        rate,
    })
}

// ---------------------------------------------------------------------------------------
// The simulated store and clock

/// Milliseconds since the Unix epoch on tokio's clock: virtual while the runtime is
/// paused, so the limiters, the breakers and the store all read the simulated time.
#[derive(Clone, Copy, Debug)]
struct VirtualClock {
    epoch_ms: u64,
    start: Instant,
}

impl Clock for VirtualClock {
    fn now_millis(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(elapsed)
    }
}

/// The fault in force, shared by every simulated store (0: none).
#[derive(Clone, Debug, Default)]
struct FaultCell(Arc<AtomicU8>);

impl FaultCell {
    fn get(&self) -> Option<FaultKind> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(FaultKind::Refuse),
            2 => Some(FaultKind::Blackhole),
            3 => Some(FaultKind::Slow),
            _ => None,
        }
    }

    fn set(&self, fault: Option<FaultKind>) {
        let value = match fault {
            None => 0,
            Some(FaultKind::Refuse) => 1,
            Some(FaultKind::Blackhole) => 2,
            Some(FaultKind::Slow) => 3,
        };
        self.0.store(value, Ordering::SeqCst);
    }
}

/// Stands in for Redis: one in-process store shared by every instance of a group,
/// reporting itself remote (so the limiter puts the breaker, the store timeout and the
/// denial cache in front of it) and failing on command.
#[derive(Clone, Debug)]
struct SimulatedStore {
    counters: InMemoryBackend,
    fault: FaultCell,
    slow_by: Duration,
}

impl Backend for SimulatedStore {
    fn check(&self, caller: &CallerKey, limits: &Arc<[Policy]>) -> CheckFuture {
        match self.fault.get() {
            None => self.counters.check(caller, limits),
            Some(FaultKind::Refuse) => CheckFuture::ready(Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "connection refused (simulated)",
            ))),
            Some(FaultKind::Blackhole) => CheckFuture::boxed(std::future::pending()),
            Some(FaultKind::Slow) => {
                // The store does the work when the command reaches it, late, whether or not
                // the limiter is still waiting, as a slow Redis would.
                let (answer, answered) = tokio::sync::oneshot::channel();
                let counters = self.counters.clone();
                let caller = caller.clone();
                let limits = limits.clone();
                let delay = self.slow_by;
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = answer.send(counters.check(&caller, &limits).await);
                });
                CheckFuture::boxed(async move {
                    answered.await.unwrap_or_else(|_| {
                        Err(StoreError::new(StoreErrorKind::Unavailable, "store gone"))
                    })
                })
            }
        }
    }

    fn is_remote(&self) -> bool {
        true
    }
}

/// A reproducible jitter source for each breaker, so that runs print the same table.
fn jitter(seed: u64) -> impl Fn() -> f64 + Send + Sync + 'static {
    let state = AtomicU64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    move || {
        let mut x = state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---------------------------------------------------------------------------------------
// Groups of instances

/// One failure policy's deployment: its instances, and their limiters (for the breakers).
struct Group {
    policy: PolicyName,
    instances: Vec<Instance>,
    limiters: Vec<Limiter>,
}

enum FaultSwitch {
    Simulated(FaultCell),
    #[cfg(feature = "redis")]
    Proxy {
        proxy: Arc<tollgate_testkit::proxy::FaultProxy>,
        slow_by: Duration,
    },
}

impl FaultSwitch {
    async fn set(&self, fault: Option<FaultKind>) -> Result<(), String> {
        match self {
            FaultSwitch::Simulated(cell) => {
                cell.set(fault);
                Ok(())
            }
            #[cfg(feature = "redis")]
            FaultSwitch::Proxy { proxy, slow_by } => {
                let proxy = proxy.clone();
                let fault = match fault {
                    None => tollgate_testkit::proxy::Fault::Pass,
                    Some(FaultKind::Refuse) => tollgate_testkit::proxy::Fault::Refuse,
                    Some(FaultKind::Blackhole) => tollgate_testkit::proxy::Fault::Blackhole,
                    Some(FaultKind::Slow) => tollgate_testkit::proxy::Fault::Delay(*slow_by),
                };
                tokio::task::spawn_blocking(move || proxy.set(fault))
                    .await
                    .map_err(|e| format!("the fault proxy failed: {e}"))
            }
        }
    }
}

fn limiter(options: &Options, policy: PolicyName, seed: u64) -> tollgate::LimiterBuilder {
    Limiter::builder()
        .name(policy.name())
        .policy(options.policy())
        .on_store_failure(policy.failure_policy(options.instances as u64))
        .store_timeout(Duration::from_millis(options.store_timeout_ms))
        .breaker(options.breaker())
        .breaker_jitter(jitter(seed))
}

/// One instance of the orders API: the rate-limit layer around the `GET /orders` handler.
type Instance = RateLimit<Orders, HeaderKey>;

/// The inner service: answers every request with an empty list of orders.
#[derive(Clone, Copy, Debug)]
struct Orders;

impl Service<Request<Empty<Bytes>>> for Orders {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Empty<Bytes>>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"[]")))))
    }
}

fn instance(limiter: Limiter) -> Instance {
    RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-customer-id"))
        .layer(Orders)
}

fn group(policy: PolicyName, limiters: Vec<Limiter>) -> Group {
    Group {
        policy,
        instances: limiters.iter().cloned().map(instance).collect(),
        limiters,
    }
}

/// Groups on the simulated store, all on virtual time.
fn simulated_groups(options: &Options, fault: &FaultCell, start: Instant) -> Vec<Group> {
    let window_ms = options.window_secs * 1_000;
    let clock = VirtualClock {
        epoch_ms: VIRTUAL_EPOCH_MS - VIRTUAL_EPOCH_MS % window_ms,
        start,
    };
    let slow_by = Duration::from_millis(options.store_timeout_ms * 2);
    options
        .policies
        .iter()
        .enumerate()
        .map(|(g, &policy)| {
            // Each group has its own counters: the groups never share a store.
            let counters = InMemoryBackend::builder().clock(clock).build();
            let limiters = (0..policy.running_instances(options.instances))
                .map(|i| {
                    let store = SimulatedStore {
                        counters: counters.clone(),
                        fault: fault.clone(),
                        slow_by,
                    };
                    limiter(options, policy, (g * 1_000 + i + 1) as u64)
                        .backend(store)
                        .clock(clock)
                        .build()
                })
                .collect();
            group(policy, limiters)
        })
        .collect()
}

#[cfg(feature = "redis")]
mod real {
    //! The same groups on a real Redis, through the fault proxy.

    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use tollgate::RedisBackend;

    use super::{FaultSwitch, Group, Options, RedisUrl, group, limiter};

    /// Starts the proxy in front of `url` and builds every group on it.
    pub(super) async fn groups(
        options: &Options,
        target: &RedisUrl,
    ) -> Result<(Vec<Group>, FaultSwitch), String> {
        let proxy = Arc::new(tollgate_testkit::proxy::FaultProxy::start(target.port));
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
        let mut groups = Vec::new();
        for (g, &policy) in options.policies.iter().enumerate() {
            let mut limiters = Vec::new();
            for i in 0..policy.running_instances(options.instances) {
                let store = RedisBackend::builder(proxied.clone())
                    .prefix(format!(
                        "tollgate-sim-{}-{run}-{}",
                        std::process::id(),
                        policy.name()
                    ))
                    .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
                    .build()
                    .map_err(|e| format!("--redis: {e}"))?;
                store.ping().await.map_err(|e| {
                    format!(
                        "cannot reach Redis at {} (through the fault proxy): {e}",
                        target.url
                    )
                })?;
                limiters.push(
                    limiter(options, policy, (g * 1_000 + i + 1) as u64)
                        .backend(store)
                        .build(),
                );
            }
            groups.push(group(policy, limiters));
        }
        let slow_by = Duration::from_millis(options.store_timeout_ms * 2);
        Ok((groups, FaultSwitch::Proxy { proxy, slow_by }))
    }
}

// ---------------------------------------------------------------------------------------
// Driving the traffic

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    sent: u64,
    admitted: u64,
    refused_429: u64,
    refused_503: u64,
    other: u64,
}

/// What one group's customers got: per phase, and admitted per second for the chart.
#[derive(Clone, Debug)]
struct Tally {
    phases: Vec<[Counts; 3]>,
    per_second: Vec<Vec<u64>>,
}

#[derive(Debug)]
struct Outcome {
    tallies: Vec<Tally>,
    /// Per group: how long after the store came back every breaker of the group was
    /// closed again.
    back_on_store_ms: Vec<Option<f64>>,
}

fn phase_of(t_ms: f64, boundaries: [f64; 2]) -> usize {
    boundaries.iter().take_while(|&&b| t_ms >= b).count()
}

/// Sends every customer's requests on schedule (request `k` of a customer sending `rate`
/// per second at `k / rate` s) to the instances in turn, switches the fault at the phase
/// boundaries, and tallies the answers by the phase and second each request was sent in.
async fn drive(
    options: &Options,
    groups: Vec<Group>,
    fault: FaultSwitch,
    start: Instant,
) -> Result<Outcome, String> {
    let customers = &options.traffic;
    let headers: Vec<HeaderValue> = customers
        .iter()
        .map(|c| HeaderValue::from_str(&c.name).expect("validated customer names"))
        .collect();
    let total_ms = (options.total_secs() * 1_000) as f64;
    let boundaries = options.boundaries_ms();
    let tallies = Arc::new(Mutex::new(
        groups
            .iter()
            .map(|_| Tally {
                phases: vec![[Counts::default(); 3]; customers.len()],
                per_second: vec![vec![0; options.total_secs() as usize]; customers.len()],
            })
            .collect::<Vec<_>>(),
    ));
    let groups = Arc::new(groups);
    let mut next = vec![vec![0u64; customers.len()]; groups.len()];
    let mut back_on_store_ms: Vec<Option<f64>> = vec![None; groups.len()];
    let mut restored_at: Option<Instant> = None;
    let mut boundary = 0;
    let mut tasks = JoinSet::new();

    // Sends every request due by `until_ms`; returns when the next one is due.
    let mut dispatch = |until_ms: f64, inclusive: bool, tasks: &mut JoinSet<()>| -> f64 {
        let mut next_due = f64::INFINITY;
        for (g, group) in groups.iter().enumerate() {
            for (c, customer) in customers.iter().enumerate() {
                loop {
                    let k = next[g][c];
                    let t_ms = k as f64 * 1_000.0 / customer.rate;
                    let due = if inclusive {
                        t_ms <= until_ms
                    } else {
                        t_ms < until_ms
                    };
                    if t_ms >= total_ms {
                        break;
                    }
                    if !due {
                        next_due = next_due.min(t_ms);
                        break;
                    }
                    next[g][c] += 1;
                    let instance = if c == 0 && group.policy.pins_first_customer() {
                        0
                    } else {
                        (k % group.instances.len() as u64) as usize
                    };
                    let phase = phase_of(t_ms, boundaries);
                    let second = (t_ms / 1_000.0) as usize;
                    tallies.lock().expect("tally lock")[g].phases[c][phase].sent += 1;
                    let service = group.instances[instance].clone();
                    let header = headers[c].clone();
                    let tallies = tallies.clone();
                    tasks.spawn(async move {
                        let request = Request::get("/orders")
                            .header("x-customer-id", header)
                            .body(Empty::new())
                            .expect("a valid request");
                        let status = match service.oneshot(request).await {
                            Ok(response) => response.status(),
                            Err(never) => match never {},
                        };
                        let mut tallies = tallies.lock().expect("tally lock");
                        let tally = &mut tallies[g];
                        let counts = &mut tally.phases[c][phase];
                        match status {
                            StatusCode::OK => {
                                counts.admitted += 1;
                                tally.per_second[c][second] += 1;
                            }
                            StatusCode::TOO_MANY_REQUESTS => counts.refused_429 += 1,
                            StatusCode::SERVICE_UNAVAILABLE => counts.refused_503 += 1,
                            _ => counts.other += 1,
                        }
                    });
                }
            }
        }
        next_due
    };

    // Wake up when the next request or phase boundary is due: on virtual time the clock
    // jumps straight there (through any timer that fires first, such as a store timeout).
    // (Nothing is due before 0 ms: this only finds the first request.)
    let mut next_due = dispatch(-1.0, false, &mut tasks);
    loop {
        let wake_ms = match boundaries.get(boundary) {
            Some(&b) => next_due.min(b),
            None => next_due,
        };
        if wake_ms.is_infinite() {
            break;
        }
        tokio::time::sleep_until(start + Duration::from_secs_f64(wake_ms / 1_000.0)).await;
        // Never behind the time slept to (a timer may round its deadline to the millisecond).
        let now_ms = (start.elapsed().as_secs_f64() * 1_000.0).max(wake_ms);
        while boundary < 2 && boundaries[boundary] <= now_ms {
            // Everything sent before the boundary goes out before the fault changes.
            dispatch(boundaries[boundary], false, &mut tasks);
            if boundary == 0 {
                progress(options, "the store fails now");
                fault.set(Some(options.fault)).await?;
            } else {
                progress(options, "the store is back");
                fault.set(None).await?;
                restored_at = Some(Instant::now());
            }
            boundary += 1;
        }
        next_due = dispatch(now_ms, true, &mut tasks);
        if let Some(restored_at) = restored_at {
            for (g, group) in groups.iter().enumerate() {
                if back_on_store_ms[g].is_none()
                    && group
                        .limiters
                        .iter()
                        .all(|l| l.breaker_state() == tollgate::decision::BreakerState::Closed)
                {
                    back_on_store_ms[g] = Some(restored_at.elapsed().as_secs_f64() * 1_000.0);
                }
            }
        }
        while let Some(done) = tasks.try_join_next() {
            done.map_err(|e| format!("a request task failed: {e}"))?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| format!("a request task failed: {e}"))?;
    }
    let tallies = tallies.lock().expect("tally lock").clone();
    Ok(Outcome {
        tallies,
        back_on_store_ms,
    })
}

/// In real time, tell the operator what is going on (on stderr).
fn progress(options: &Options, what: &str) {
    if options.redis.is_some() {
        eprintln!("simulate: {what}");
    }
}

async fn run(options: &Options) -> Result<Outcome, String> {
    match &options.redis {
        None => {
            let start = Instant::now();
            let fault = FaultCell::default();
            let groups = simulated_groups(options, &fault, start);
            drive(options, groups, FaultSwitch::Simulated(fault), start).await
        }
        #[cfg(feature = "redis")]
        Some(url) => {
            let (groups, fault) = real::groups(options, url).await?;
            eprintln!(
                "simulate: running {} s in real time against {}",
                options.total_secs(),
                url.url
            );
            drive(options, groups, fault, Instant::now()).await
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => Err("--redis needs the crate's `redis` feature".to_owned()),
    }
}

// ---------------------------------------------------------------------------------------
// Output

fn per_sec(count: u64, secs: u64) -> f64 {
    count as f64 / secs as f64
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The rows as a JSON array, one object per line, keys in reading order.
fn json(options: &Options, outcome: &Outcome) -> String {
    let quote = |text: &str| serde_json::to_string(text).expect("a JSON string");
    let number = |x: f64| serde_json::to_string(&round2(x)).expect("a JSON number");
    let mut rows = Vec::new();
    for (g, (policy, tally)) in options.policies.iter().zip(&outcome.tallies).enumerate() {
        for (phase, phase_name) in PHASES.iter().enumerate() {
            let secs = options.phase_secs(phase);
            // The recovery rows also say when the group's last breaker closed (null: not
            // within the phase), as the table's "all breakers closed after" column does.
            let closed = if phase == 2 {
                let ms = outcome.back_on_store_ms[g].map_or("null".to_owned(), number);
                format!(", \"all_breakers_closed_after_ms\": {ms}")
            } else {
                String::new()
            };
            for (c, customer) in options.traffic.iter().enumerate() {
                let counts = tally.phases[c][phase];
                rows.push(format!(
                    "  {{\"policy\": {}, \"phase\": {}, \"customer\": {}, \"sent_per_sec\": {}, \
                     \"admitted_per_sec\": {}, \"refused_429\": {}, \"refused_503\": {}{closed}}}",
                    quote(policy.name()),
                    quote(phase_name),
                    quote(&customer.name),
                    number(per_sec(counts.sent, secs)),
                    number(per_sec(counts.admitted, secs)),
                    counts.refused_429,
                    counts.refused_503,
                ));
            }
        }
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
    let n = options.instances;
    let first = &options.traffic[0].name;
    match policy {
        PolicyName::LocalShareNoDivisor => Some(format!(
            "each of the {n} instances enforces the full limit of {}",
            options.limit
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

fn table(options: &Options, outcome: &Outcome) -> String {
    let mut out = String::new();
    let n = options.instances;
    let customers: Vec<String> = options
        .traffic
        .iter()
        .map(|c| format!("{} ({}/s)", c.name, rate_text(c.rate)))
        .collect();
    let share = options.policy().algorithm().divided_by(n as u64);
    let _ = writeln!(
        out,
        "tollgate outage simulator: the running example on tollgate's own \
         layer, limiter, breaker and failure policies."
    );
    let _ = writeln!(
        out,
        "{n} instances, round robin; limit {} per {} s per customer ({}); traffic {}.",
        options.limit,
        options.window_secs,
        options.algorithm_name(),
        options
            .traffic
            .iter()
            .map(|c| format!("{} {}/s", c.name, rate_text(c.rate)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    match &options.redis {
        None => {
            let _ = writeln!(
                out,
                "Store: an in-process store shared by the instances stands in for Redis; virtual \
                 time ({} s simulated).",
                options.total_secs()
            );
        }
        Some(url) => {
            let _ = writeln!(
                out,
                "Store: Redis at {} behind a fault proxy; real time ({} s).",
                url.url,
                options.total_secs()
            );
        }
    }
    let breaker = options.breaker();
    let base_ms = breaker.base_open_duration().as_millis();
    let _ = writeln!(
        out,
        "Store timeout {} ms; the breaker ({}) opens after {} consecutive failures and stays open \
         {}-{base_ms} ms at first, the ceiling doubling per failed probe to at most {} ms \
         (jittered).",
        options.store_timeout_ms,
        if options.breaker_base_open_ms.is_none() && options.breaker_max_open_ms.is_none() {
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
    ) = (*options.policy().algorithm(), share)
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
    for policy in &options.policies {
        if let Some(note) = policy_note(options, *policy) {
            let _ = writeln!(out, "{}: {note}.", policy.name());
        }
    }

    for (phase, phase_name) in PHASES.iter().enumerate() {
        let secs = options.phase_secs(phase);
        let what = match phase {
            0 => "the store answers".to_owned(),
            1 => options.fault.describe(options.store_timeout_ms),
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
        for (g, (policy, tally)) in options.policies.iter().zip(&outcome.tallies).enumerate() {
            let mut row = vec![policy.name().to_owned()];
            let mut r429 = 0;
            let mut r503 = 0;
            for counts in tally.phases.iter().map(|p| p[phase]) {
                row.push(format!("{:.1}", per_sec(counts.admitted, secs)));
                r429 += counts.refused_429;
                r503 += counts.refused_503;
            }
            row.push(r429.to_string());
            row.push(r503.to_string());
            if phase == 2 {
                row.push(match outcome.back_on_store_ms[g] {
                    Some(ms) => format!("{ms:.0} ms"),
                    None => "not within the phase".to_owned(),
                });
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
fn chart(options: &Options, outcome: &Outcome) -> Result<String, Box<dyn std::error::Error>> {
    const PANEL_W: u32 = 620;
    const PANEL_H: u32 = 270;
    const MARGIN: i32 = 12;
    const LEGEND_LINE_H: i32 = 24;
    let panels = outcome.tallies.len();
    let columns = if panels > 1 { 2 } else { 1 };
    let rows = panels.div_ceil(columns);
    let width = if columns > 1 {
        columns as u32 * PANEL_W
    } else {
        PANEL_W * 3 / 2
    };
    let total = options.total_secs() as f64;
    let peak = outcome
        .tallies
        .iter()
        .flat_map(|t| t.per_second.iter().flatten())
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let peak = peak.max(options.limit as f64 / options.window_secs as f64);
    let y_max = peak * 1.1;
    let [normal_end, outage_end] = options.boundaries_ms().map(|ms| ms / 1_000.0);

    // The legend: the outage's shade, then each customer's line, wrapped to the width.
    let legend_font = ("sans-serif", 16).into_font();
    let mut legend = vec![(None, "store outage".to_owned())];
    for (c, customer) in options.traffic.iter().enumerate() {
        legend.push((
            Some(COLORS[c % COLORS.len()]),
            format!("{} ({}/s sent)", customer.name, rate_text(customer.rate)),
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
                options.instances,
                options.limit,
                options.window_secs,
                options.fault.describe(options.store_timeout_ms)
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
        for ((policy, tally), cell) in options.policies.iter().zip(&outcome.tallies).zip(&cells) {
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
            for (c, seconds) in tally.per_second.iter().enumerate() {
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

fn main() -> ExitCode {
    let options = match parse_options(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("simulate: {message}\nTry `simulate --help` for the flags.");
            return ExitCode::from(2);
        }
    };
    let runtime = if options.redis.is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        // Virtual time: the clock stands still while anything can run and jumps to the next
        // timer when nothing can, so the store timeout and the breaker run as they would.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("simulate: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match runtime.block_on(run(&options)) {
        Ok(outcome) => outcome,
        Err(message) => {
            eprintln!("simulate: {message}");
            return ExitCode::FAILURE;
        }
    };
    let report = if options.json {
        json(&options, &outcome)
    } else {
        table(&options, &outcome)
    };
    if let Err(e) = std::io::stdout().lock().write_all(report.as_bytes()) {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("simulate: cannot write the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &options.chart {
        let written = chart(&options, &outcome)
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
    let unexpected: u64 = outcome
        .tallies
        .iter()
        .flat_map(|t| t.phases.iter().flatten())
        .map(|c| c.other)
        .sum();
    if unexpected > 0 {
        eprintln!(
            "simulate: {unexpected} requests were answered with a status other than 200, 429 or 503"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
