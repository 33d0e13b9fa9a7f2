//! The running example as a server: an orders API rate-limited per customer, a login form
//! that fails closed, optional load shedding that keeps capacity for logins and health
//! checks, and Prometheus metrics.
//!
//! ```text
//! orders_api [--listen ADDR]
//!            [--redis URL | --redis-cluster URL[,URL...]
//!             | --redis-sentinel URL[,URL...] --sentinel-master NAME]
//!            [--limit N] [--window-secs N] [--config FILE]
//!            [--on-store-failure open|closed|local-share|static|static-then-local-share]
//!            [--instances N | --expected-instances N]
//!            [--lease-threshold N [--lease-period-ms N]]
//!            [--region NAME --global-redis URL [--wan-rtt-ms N]]
//!            [--store-timeout-ms N] [--trusted-proxy CIDR]...
//!            [--max-in-flight N] [--slot-ttl-ms N]
//!            [--plans FILE] [--org-limit N] [--fields LIST] [--stamp-admissions]
//! ```
//!
//! - `GET /orders`: `--limit` requests per `--window-secs` per `x-customer-id` (a missing
//!   header is 401), with the chosen failure policy (default local share).
//!   - With `--plans FILE` (a JSON object from customer id to requests a minute, such as
//!     `{"acme": 250, "globex": 100}`), each listed customer also has a `per-minute` policy
//!     of its own quota, looked up at request time and reloaded on SIGHUP; customers not
//!     listed have no per-minute limit.
//!   - A request with an `x-org-id` header is counted in that organisation's budget too:
//!     its customers share `--org-limit` requests a second (default 200, the policy
//!     `org:per-second`), each keeping its own limit, all decided together.
//!   - `--stamp-admissions` adds `x-admitted-at-ms` to each admitted response: the Unix
//!     time in milliseconds when its handler ran, right after the limiter admitted it
//!     (for measuring admissions by when they were decided, not when they were sent).
//!   - `--fields LIST` chooses the forms of the rate-limit fields on /orders,
//!     comma-separated from `draft-11` (the default), `draft-7`, `draft-6` and
//!     `x-ratelimit`.
//! - `POST /login`: 5 per minute per client IP, failing closed.
//! - `POST /otp/verify`: checks a one-time code, body `{"code": "..."}`. The right code is
//!   `424242` (200); any other is 401, a body without a string `code` is 400. Only wrong
//!   codes count: the fifth wrong code within 10 minutes from one client IP locks that IP
//!   out for 10 minutes (policy `wrong-codes`, a lockout kept in the store): every attempt
//!   meanwhile is 429 with `Retry-After` the time left, the right code included. Fails
//!   closed. Blocks started are counted in `tollgate_lockouts_total`.
//! - `GET /reports?ms=N`: a slow report (N milliseconds, at most 60,000), at most 2 in
//!   flight per `x-customer-id` across the instances (a missing header is 401): a third
//!   while two run is 429 with `RateLimit-Policy: "in-flight";q=2;qu="concurrent-requests"`
//!   and `Retry-After: 1`. A slot is freed when its response has been sent or the client
//!   hangs up; in Redis it lives `--slot-ttl-ms` (default 10,000) unrenewed, the longest an
//!   instance that died keeps its slots taken. The same failure policy as `/orders`.
//! - `POST /v1/completions`: a pretend LLM endpoint, body `{"max_tokens": N}` (at most 64
//!   KiB; a body without a number there is 400). It answers 200 with a random number of
//!   tokens up to N in `x-tokens-used`. Each `x-customer-id` has 10,000 tokens a minute
//!   (policy `tokens`): a request is reserved at its `max_tokens` before the handler runs
//!   and settled at `x-tokens-used` once it has answered, the rest given back. A request
//!   whose `max_tokens` is over what remains is 429. The same store and failure policy as
//!   `/orders`.
//! - `GET /export?bytes=N`: streams N bytes (at most 1 GiB) in chunks of 64 KiB, charged as
//!   they are sent against 10 MiB (10,485,760 bytes) a minute of `content-bytes` per
//!   `x-customer-id` (policy `egress`); a customer with nothing left is 429 before its next
//!   export starts, one in progress is never cut, and one dropped by its client is charged
//!   what it sent. The same store and failure policy as `/orders`.
//! - `GET /healthz`: never limited.
//! - `GET /metrics`: Prometheus text format.
//!
//! With `--max-in-flight N`, at most N requests are served at once across all routes, and
//! the others are answered 503 with `Retry-After` before any rate limit is checked. `/login`
//! and `/healthz` are critical: a fifth of the N slots (rounded up) is kept for them, so a
//! flood of orders can neither lock users out nor make the load balancer think the
//! instance is dead. Shed requests are counted in `tollgate_shed_total` by class. Without
//! the flag nothing is shed.
//!
//! Without `--redis` the counters live in this process. With it, they live in Redis and the
//! local share divides by `--instances`, or by the live instances that heartbeat into Redis
//! when `--instances` is not given; `--expected-instances` is then required, the count
//! divided by until the first heartbeat answers (an instance started during an outage
//! knows no other). `--redis-cluster` does the same on a Redis Cluster, reached through
//! any of the comma-separated node URLs (the others are discovered); `--redis-sentinel`
//! on the master that the Sentinels at the comma-separated URLs monitor as
//! `--sentinel-master`, following its failovers. The three exclude each other.
//!
//! With `--lease-threshold N` (only with one of those three: leases are taken from Redis),
//! a customer sending `/orders` at least N requests a second on this instance is decided
//! here from leases of its quota, taken from Redis in one call each and lasting at most
//! `--lease-period-ms` (default 100), instead of one Redis call per request; the instances
//! together still never exceed the limit. A lease holds at most the limit divided by the
//! instances the local share divides by. `/metrics` counts them in `tollgate_leases_total`
//! and `tollgate_leased_decisions_total`.
//!
//! With `--region NAME --global-redis URL` (only with `--redis`, the region's own Redis),
//! `/orders` keeps one limit across regions: each region's instances decide on their
//! region's Redis against units leased of each customer's quota from the global Redis at
//! URL (`tollgate::store::TwoTierBackend`), one regional round trip per request and a WAN
//! call now and then in the background, expected to take `--wan-rtt-ms` (default 100)
//! until measured. Give each region another NAME. A region cut off from the global Redis
//! falls back to its share of the limit (its part of the regions' demand). `/orders` then
//! decides its one policy per customer on the two-tier store; plans (`--plans`, `--config`
//! tiers) and organisations' budgets, which add policies, are refused there, as a store
//! error its failure policy answers.
//!
//! With `--config FILE` (instead of `--limit` and `--window-secs`), the policies of
//! `/orders`, its plan tiers and which customer is on which plan come from a TOML file
//! (`tollgate::config`'s format under `[orders]`):
//!
//! ```toml
//! [plans]
//! acme = "enterprise"
//!
//! [[orders.policies]]
//! name = "per-second"
//! algorithm = "sliding_window"
//! limit = 50
//! window = "1s"
//!
//! [[orders.tiers.enterprise]]
//! name = "per-second"
//! algorithm = "sliding_window"
//! limit = 120
//! window = "1s"
//! ```
//!
//! On SIGHUP the file is read again and its limits and plans replace those in force,
//! without a restart; a file that cannot be read or does not make valid limits is refused
//! (stderr says why, with the line) and the limits in force stay.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::{ArgGroup, Parser};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tollgate::config::LimiterDefinition;
use tollgate::cost::{BodyCostLayer, RequestCost};
use tollgate::in_flight::InFlightLayer;
use tollgate::key::Extracted;
use tollgate::response::{FieldForm, InnerBody};
use tollgate::shed::ConcurrencyShedLayer;
use tollgate::store::{Backend, SlotStore, TwoTierBackend};
use tollgate::{
    Caller, FailurePolicy, InMemoryBackend, InstanceCount, InstanceRegistry, Leases, Limiter,
    Policy, Quota, RateLimitLayer, RedisBackend,
    key::{ClientIp, KeyExtractor, MissingKey},
    reload::Limits,
};

/// An orders API rate-limited per customer, a login form that fails closed, optional load
/// shedding, and Prometheus metrics.
#[derive(Debug, Parser)]
#[command(name = "orders_api")]
#[command(group(
    ArgGroup::new("remote")
        .args(["redis", "redis_cluster", "redis_sentinel"])
        .multiple(true)
))]
struct Options {
    /// The address to serve on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Keep the counters in the Redis at URL (default: in this process)
    #[arg(long, value_name = "URL", conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// Keep the counters in the Redis Cluster reached through any of these node URLs
    #[arg(long, value_name = "URL[,URL...]", value_parser = parse_nodes)]
    redis_cluster: Option<Nodes>,
    /// Keep the counters on the master that the Redis Sentinels at these URLs monitor as
    /// --sentinel-master
    #[arg(
        long,
        value_name = "URL[,URL...]",
        value_parser = parse_nodes,
        conflicts_with_all = ["redis", "redis_cluster"],
        requires = "sentinel_master"
    )]
    redis_sentinel: Option<Nodes>,
    /// The name the Sentinels of --redis-sentinel monitor the master under
    #[arg(long, value_name = "NAME", requires = "redis_sentinel")]
    sentinel_master: Option<String>,
    /// Requests per window per customer on /orders
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = at_least_one)]
    limit: u64,
    /// The window of /orders, in seconds
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    window_secs: u64,
    /// Read the policies, plan tiers and plans of /orders from this TOML file, again on
    /// SIGHUP
    #[arg(long, value_name = "FILE", conflicts_with_all = ["limit", "window_secs"])]
    config: Option<PathBuf>,
    /// What /orders does when the store cannot decide: open, closed, local-share, static or
    /// static-then-local-share
    #[arg(
        long,
        value_name = "POLICY",
        default_value = "local-share",
        value_parser = ["open", "closed", "local-share", "static", "static-then-local-share"]
    )]
    on_store_failure: String,
    /// The instances a local share divides by (default: the live instances heartbeating
    /// into Redis, or 1 without Redis)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    instances: Option<u64>,
    /// With the live instance count: the instances the deployment runs, divided by until
    /// the count first answers (required with --redis and no --instances)
    #[arg(long, value_name = "N", value_parser = at_least_one, conflicts_with = "instances")]
    expected_instances: Option<u64>,
    /// Decide a customer of /orders from leases of its quota once it sends N requests a
    /// second to this instance, instead of asking Redis about each request (needs
    /// --redis, --redis-cluster or --redis-sentinel)
    #[arg(long, value_name = "N", value_parser = at_least_one, requires = "remote")]
    lease_threshold: Option<u64>,
    /// The longest a lease of --lease-threshold lasts, in milliseconds [default: 100]
    #[arg(long, value_name = "N", value_parser = at_least_one, requires = "lease_threshold")]
    lease_period_ms: Option<u64>,
    /// Keep one limit of /orders across regions: this instance's region, whose Redis is
    /// --redis, leasing from --global-redis
    #[arg(long, value_name = "NAME", requires_all = ["redis", "global_redis"], conflicts_with = "lease_threshold")]
    region: Option<String>,
    /// The global Redis the regions of --region lease each customer's quota from
    #[arg(long, value_name = "URL", requires = "region")]
    global_redis: Option<String>,
    /// The round trip to --global-redis to expect until one is measured, in milliseconds
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = at_least_one)]
    wan_rtt_ms: u64,
    /// How long a decision waits for the store before its failure policy applies
    #[arg(long, value_name = "N", default_value_t = 20)]
    store_timeout_ms: u64,
    /// A proxy (address or CIDR block) whose X-Forwarded-For is trusted on /login; repeat it
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<String>,
    /// Serve at most N requests at once and shed the others with 503, keeping a fifth of
    /// the slots for /login and /healthz (default: no shedding)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    max_in_flight: Option<u64>,
    /// How long a slot of /reports lives in Redis unrenewed, in milliseconds: the longest
    /// an instance that died keeps its customers' slots taken
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = at_least_one)]
    slot_ttl_ms: u64,
    /// A JSON object from customer id to requests a minute on /orders, again on SIGHUP
    #[arg(long, value_name = "FILE")]
    plans: Option<PathBuf>,
    /// Requests a second an organisation's customers share on /orders (`x-org-id`)
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = at_least_one)]
    org_limit: u64,
    /// The forms of the rate-limit fields on /orders: draft-11, draft-7, draft-6,
    /// x-ratelimit, comma-separated
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "draft-11"
    )]
    fields: Vec<FieldForm>,
    /// Add x-admitted-at-ms (Unix milliseconds) to each admitted /orders response
    #[arg(long)]
    stamp_admissions: bool,
}

/// Customer id to its own requests a minute on /orders (`--plans`), swapped whole on
/// reload.
type Quotas = HashMap<String, u64>;

fn load_quotas(path: &Path) -> Result<Quotas, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// The tier of customers with a quota of their own: the default policies and a per-minute
/// one, whose quota each customer's is.
const PLANNED: &str = "planned";

/// The node URLs of `--redis-cluster`, or the Sentinel URLs of `--redis-sentinel`: at least
/// one.
#[derive(Clone, Debug)]
struct Nodes(Vec<String>);

fn parse_nodes(value: &str) -> Result<Nodes, String> {
    let nodes: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if nodes.is_empty() {
        return Err("needs at least one node URL".to_owned());
    }
    Ok(Nodes(nodes))
}

fn at_least_one(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The `--config` file: the /orders limiter's definition (only its policies and tiers: the
/// rest is set by flags), and each customer's plan tier.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrdersConfig {
    orders: LimiterDefinition,
    /// Customer id (`x-customer-id`) to plan tier; customers not listed get the defaults.
    #[serde(default)]
    plans: HashMap<String, String>,
}

/// What a `--config` file sets: the limits of /orders and the plans.
struct Loaded {
    limits: Limits,
    plans: Plans,
}

/// Customer id to plan tier, swapped whole on reload.
type Plans = HashMap<String, Arc<str>>;

fn load(path: &Path) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let config: OrdersConfig = toml::from_str(&text).map_err(|e| e.to_string())?;
    let orders = &config.orders;
    let set_by_flag = [
        (
            "name",
            orders.name().is_some(),
            "the limiter is named orders",
        ),
        (
            "key",
            !matches!(orders.key(), Ok(None)),
            "the key is x-customer-id",
        ),
        (
            "on_store_failure",
            !matches!(orders.on_store_failure(), Ok(None)),
            "use --on-store-failure",
        ),
        (
            "store_timeout",
            orders.store_timeout().is_some(),
            "use --store-timeout-ms",
        ),
    ];
    if let Some((field, _, instead)) = set_by_flag.iter().find(|(_, set, _)| *set) {
        return Err(format!(
            "orders.{field} cannot be set in the file ({instead})"
        ));
    }
    let limits = orders.limits().map_err(|e| format!("[orders]: {e}"))?;
    let plans = config
        .plans
        .into_iter()
        .map(|(customer, tier)| (customer, Arc::from(tier)))
        .collect();
    Ok(Loaded { limits, plans })
}

/// `per-second q=50 w=1s, ...; tier enterprise: ...`, for the log.
fn describe(limits: &Limits) -> String {
    let set = |policies: &[Policy]| {
        policies
            .iter()
            .map(|p| {
                format!(
                    "{} q={} w={}ms",
                    p.name(),
                    p.quota(),
                    p.algorithm().window_ms()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = set(limits.policies());
    for (tier, policies) in limits.tiers() {
        text.push_str(&format!("; tier {tier}: {}", set(policies)));
    }
    text
}

/// The instances /orders shares its limit among: `--instances`, or the live count of the
/// registry, or this one alone.
fn instance_count(options: &Options, registry: Option<InstanceRegistry>) -> InstanceCount {
    match (options.instances, registry) {
        (Some(count), _) => InstanceCount::fixed(count),
        (None, Some(registry)) => InstanceCount::registry(registry),
        (None, None) => InstanceCount::fixed(1),
    }
}

fn failure_policy(options: &Options, instances: InstanceCount) -> FailurePolicy {
    // clap accepts only these five.
    match options.on_store_failure.as_str() {
        "open" => FailurePolicy::open(),
        "closed" => FailurePolicy::closed(),
        "static" => FailurePolicy::fail_static(),
        "static-then-local-share" => {
            FailurePolicy::static_then(FailurePolicy::local_share(instances))
        }
        _ => FailurePolicy::local_share(instances),
    }
}

/// The leases of `--lease-threshold`, among the instances the local share divides by.
fn leases(options: &Options, instances: InstanceCount) -> Option<Leases> {
    let threshold = options.lease_threshold?;
    let leases = Leases::new()
        .threshold_per_sec(threshold)
        .instances(instances);
    Some(match options.lease_period_ms {
        Some(ms) => leases.period(Duration::from_millis(ms)),
        None => leases,
    })
}

fn store(options: &Options, prefix: &str) -> Result<Option<RedisBackend>, String> {
    if let Some(url) = &options.redis {
        return RedisBackend::builder(url.as_str())
            .prefix(prefix)
            .build()
            .map(Some)
            .map_err(|e| format!("--redis: {e}"));
    }
    if let Some(Nodes(nodes)) = &options.redis_cluster {
        return RedisBackend::cluster_builder(nodes.iter().cloned())
            .prefix(prefix)
            .build()
            .map(Some)
            .map_err(|e| format!("--redis-cluster: {e}"));
    }
    if let (Some(Nodes(sentinels)), Some(master)) =
        (&options.redis_sentinel, &options.sentinel_master)
    {
        return RedisBackend::sentinel_builder(sentinels.iter().cloned(), master.as_str())
            .prefix(prefix)
            .build()
            .map(Some)
            .map_err(|e| format!("--redis-sentinel: {e}"));
    }
    Ok(None)
}

/// The two-tier store of `--region`, on `regional` (the store of `--redis`) and a
/// connection of its own to `--global-redis`.
fn two_tier(
    options: &Options,
    regional: Option<RedisBackend>,
) -> Result<Option<TwoTierBackend>, String> {
    let (Some(region), Some(global), Some(regional)) =
        (&options.region, &options.global_redis, regional)
    else {
        return Ok(None);
    };
    let global = RedisBackend::builder(global.as_str())
        .prefix("orders")
        .build()
        .map_err(|e| format!("--global-redis: {e}"))?;
    TwoTierBackend::builder(region.as_str(), regional, global)
        .wan_rtt(Duration::from_millis(options.wan_rtt_ms))
        .build()
        .map(Some)
        .map_err(|e| format!("--region: {e}"))
}

fn limiter(name: &str, store: Option<RedisBackend>, options: &Options) -> tollgate::LimiterBuilder {
    match store {
        Some(store) => limiter_on(name, store, options),
        None => limiter_on(name, InMemoryBackend::new(), options),
    }
}

fn limiter_on(name: &str, store: impl Backend, options: &Options) -> tollgate::LimiterBuilder {
    Limiter::builder()
        .name(name)
        .store_timeout(Duration::from_millis(options.store_timeout_ms))
        .backend(store)
}

/// `limits` with what the flags add to /orders: the tier of the customers `--plans` lists
/// (the default policies and a `per-minute` one, whose quota is each customer's own), and
/// the organisations' budget (`--org-limit` a second).
fn with_plans_and_budgets(limits: Limits, options: &Options) -> Limits {
    FlagsOfLimits {
        org_limit: options.org_limit,
        with_plans: options.plans.is_some(),
    }
    .apply(limits)
}

impl FlagsOfLimits {
    fn apply(&self, limits: Limits) -> Limits {
        let limits = limits.level(
            "org",
            [Policy::sliding_window(
                "per-second",
                Quota::per_second(self.org_limit),
            )],
        );
        if !self.with_plans {
            return limits;
        }
        let mut planned = limits.policies().to_vec();
        // The quota here is never used: every customer on this tier has its own.
        planned.push(Policy::sliding_window("per-minute", Quota::per_minute(1)));
        limits.tier(PLANNED, planned)
    }
}

/// `per-second`, `per-minute`, or `per-<n>s`: the name clients see in the headers.
fn policy_name(window_secs: u64) -> String {
    match window_secs {
        1 => "per-second".to_owned(),
        60 => "per-minute".to_owned(),
        3_600 => "per-hour".to_owned(),
        86_400 => "per-day".to_owned(),
        n => format!("per-{n}s"),
    }
}

/// The caller of /orders: its `x-customer-id` (none without the header, which the layer
/// answers with 401), on the plan tier `plans` gives it.
#[derive(Clone)]
struct CustomerKey {
    plans: Arc<ArcSwap<Plans>>,
}

impl KeyExtractor for CustomerKey {
    fn extract<B>(&self, request: &axum::http::Request<B>) -> Extracted {
        let Some(id) = request
            .headers()
            .get("x-customer-id")
            .map(|value| value.as_bytes())
            .filter(|id| !id.is_empty())
        else {
            return Extracted::NoKey;
        };
        let caller = Caller::new(id);
        let tier = std::str::from_utf8(id)
            .ok()
            .and_then(|id| self.plans.load().get(id).cloned());
        Extracted::Caller(match tier {
            Some(tier) => caller.with_tier(tier),
            None => caller,
        })
    }
}

/// The caller of /orders: [`CustomerKey`]'s, with its own per-minute quota from
/// `--plans`, looked up at request time (a database would be asked here), and its
/// organisation's budget when it names one in `x-org-id`.
#[derive(Clone)]
struct OrdersKey {
    customers: CustomerKey,
    quotas: Arc<ArcSwap<Quotas>>,
}

impl tollgate::key::AsyncKeyExtractor for OrdersKey {
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Extracted> + Send>>;

    fn extract_async<B>(&self, request: &axum::http::Request<B>) -> Self::Future {
        let extracted = self.customers.extract(request);
        let id = request
            .headers()
            .get("x-customer-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let org = request
            .headers()
            .get("x-org-id")
            .map(|value| value.as_bytes().to_vec())
            .filter(|org| !org.is_empty());
        let quotas = self.quotas.clone();
        Box::pin(async move {
            let Extracted::Caller(caller) = extracted else {
                return extracted;
            };
            let quota = id.and_then(|id| quotas.load().get(&id).copied());
            let caller = match quota {
                Some(quota) => caller.with_tier(PLANNED).with_quota("per-minute", quota),
                None => caller,
            };
            Extracted::Caller(match org {
                Some(org) => caller.within("org", org),
                None => caller,
            })
        })
    }
}

/// The router, and what a reload of `--config` or `--plans` changes under it.
struct App {
    router: Router,
    /// The /orders limiter (a clone of the one its layer holds), whose limits a reload swaps.
    orders: Limiter,
    plans: Arc<ArcSwap<Plans>>,
    quotas: Arc<ArcSwap<Quotas>>,
}

async fn app(
    options: &Options,
    config: Option<Loaded>,
    metrics: PrometheusHandle,
) -> Result<App, String> {
    let orders_store = store(options, "orders")?;
    let login_store = store(options, "login")?;
    let otp_store = store(options, "otp")?;
    let reports_store = store(options, "reports")?;
    let completions_store = store(options, "completions")?;
    let exports_store = store(options, "exports")?;
    for store in orders_store
        .iter()
        .chain(&login_store)
        .chain(&otp_store)
        .chain(&reports_store)
        .chain(&completions_store)
        .chain(&exports_store)
    {
        if let Err(error) = store.ping().await {
            eprintln!(
                "warning: Redis does not answer yet ({error}); failure policies apply until it does"
            );
        }
    }
    let registry = match (&orders_store, options.instances) {
        (Some(store), None) => {
            let expected = options.expected_instances.ok_or(
                "with a Redis store and no --instances, give --expected-instances N: the \
                 instances this deployment runs, divided by until the live count first answers \
                 (an instance started while Redis is unreachable knows no other count)",
            )?;
            Some(InstanceRegistry::start(store, expected).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let (limits, plans) = match config {
        Some(Loaded { limits, plans }) => (limits, plans),
        None => (
            Limits::new().policy(Policy::sliding_window(
                policy_name(options.window_secs),
                Quota::new(options.limit, Duration::from_secs(options.window_secs)),
            )),
            Plans::new(),
        ),
    };
    let limits = with_plans_and_budgets(limits, options);
    let described = match &options.config {
        Some(path) => format!("{} (from {})", describe(&limits), path.display()),
        None => format!("{} per {} s", options.limit, options.window_secs),
    };
    let quotas = match &options.plans {
        Some(path) => {
            load_quotas(path).map_err(|message| format!("--plans {}: {message}", path.display()))?
        }
        None => Quotas::new(),
    };
    let quotas = Arc::new(ArcSwap::from_pointee(quotas));
    let instances = instance_count(options, registry);
    let plans = Arc::new(ArcSwap::from_pointee(plans));
    let leased = leases(options, instances.clone());
    let leasing = match &leased {
        Some(leases) => format!(
            ", leases for a customer from {}/s on this instance, {} ms at most",
            leases.threshold(),
            leases.lease_period().as_millis()
        ),
        None => String::new(),
    };
    // At most 2 reports of one customer at a time, across the instances sharing Redis.
    let slots: Arc<dyn SlotStore> = match reports_store {
        Some(store) => Arc::new(store),
        None => Arc::new(InMemoryBackend::new()),
    };
    let reports = InFlightLayer::new("reports", 2, slots)
        .key(CustomerKey {
            plans: plans.clone(),
        })
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .slot_ttl(Duration::from_millis(options.slot_ttl_ms))
        .store_timeout(Duration::from_millis(options.store_timeout_ms))
        .on_store_failure(failure_policy(options, instances.clone()));
    // Tokens of a pretend LLM and bytes of exports, per customer.
    let completions = limiter("completions", completions_store, options)
        .policy(Policy::sliding_window("tokens", Quota::per_minute(10_000)))
        .on_store_failure(failure_policy(options, instances.clone()))
        .try_build()
        .map_err(|e| e.to_string())?;
    let exports = limiter("exports", exports_store, options)
        .policy(Policy::sliding_window("egress", Quota::per_minute(10_485_760)).content_bytes())
        .on_store_failure(failure_policy(options, instances.clone()))
        .try_build()
        .map_err(|e| e.to_string())?;
    let orders = match two_tier(options, orders_store.clone())? {
        Some(store) => limiter_on("orders", store, options),
        None => limiter("orders", orders_store, options),
    }
    .limits(limits)
    .on_store_failure(failure_policy(options, instances));
    let orders = match leased {
        Some(leases) => orders.leases(leases),
        None => orders,
    }
    .try_build()
    .map_err(|e| e.to_string())?;
    let login = limiter("login", login_store, options)
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .try_build()
        .map_err(|e| e.to_string())?;
    // Guessing a 6-digit code: 5 tries per 10 minutes per client IP, then 10 minutes of
    // nothing. Keyed on the IP, not the account, so that a stranger cannot lock a user out.
    let otp = limiter("otp", otp_store, options)
        .policy(
            Policy::sliding_window("wrong-codes", Quota::per_minutes(5, 10))
                .lock_out_for(Duration::from_secs(600)),
        )
        .on_store_failure(FailurePolicy::closed())
        .try_build()
        .map_err(|e| e.to_string())?;
    let client_ip = ClientIp::new()
        .trusted_proxies(&options.trusted_proxies)
        .map_err(|e| e.to_string())?;
    let where_ = match (
        &options.redis,
        &options.redis_cluster,
        &options.redis_sentinel,
    ) {
        (Some(url), _, _) => url.clone(),
        (None, Some(Nodes(nodes)), _) => format!("the Redis Cluster at {}", nodes.join(",")),
        (None, None, Some(Nodes(sentinels))) => format!(
            "the master {} of the Redis Sentinels at {}",
            options.sentinel_master.as_deref().unwrap_or_default(),
            sentinels.join(",")
        ),
        (None, None, None) => "this process".to_owned(),
    };
    let where_ = match (&options.region, &options.global_redis) {
        (Some(region), Some(global)) => {
            format!("region {region}'s {where_}, leased from the global Redis at {global}")
        }
        _ => where_,
    };
    eprintln!(
        "/orders: {described} per customer, counters in {where_}, on store failure: {}{leasing}",
        options.on_store_failure
    );
    let reloadable = orders.clone();

    let stamp = options.stamp_admissions;
    let router = Router::new()
        .route(
            "/orders",
            get(move || async move {
                let mut response = axum::response::IntoResponse::into_response("[]");
                if stamp {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |elapsed| elapsed.as_millis() as u64);
                    response
                        .headers_mut()
                        .insert("x-admitted-at-ms", now.into());
                }
                response
            }),
        )
        .route_layer(
            RateLimitLayer::new(orders)
                .key(OrdersKey {
                    customers: CustomerKey {
                        plans: plans.clone(),
                    },
                    quotas: quotas.clone(),
                })
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
                .field_forms(options.fields.iter().copied())
                // Answers in axum's body type: no second box per response.
                .response_body::<InnerBody>(),
        )
        .route(
            "/login",
            post(|| async { "welcome" }).layer(RateLimitLayer::new(login).key(client_ip.clone())),
        )
        .route(
            "/otp/verify",
            post(verify_otp).layer(
                RateLimitLayer::new(otp)
                    .key(client_ip)
                    .count_only(|response| response.status == StatusCode::UNAUTHORIZED),
            ),
        )
        .route("/reports", get(report).route_layer(reports))
        .route(
            "/v1/completions",
            post(complete)
                // Runs second: reserves the estimate, settles at what the answer used.
                .route_layer(
                    RateLimitLayer::new(completions)
                        .key(CustomerKey {
                            plans: plans.clone(),
                        })
                        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
                        .cost(RequestCost::of_request)
                        .settle(|response| {
                            response
                                .headers
                                .get("x-tokens-used")?
                                .to_str()
                                .ok()?
                                .parse()
                                .ok()
                        }),
                )
                // Runs first: the estimate, from the body's max_tokens.
                .route_layer(BodyCostLayer::new(64 * 1024, max_tokens).default_estimate(0)),
        )
        .route(
            "/export",
            get(export).route_layer(
                RateLimitLayer::new(exports)
                    .key(CustomerKey {
                        plans: plans.clone(),
                    })
                    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
                    .count_response_bytes(),
            ),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        );
    // Added last, so it wraps the rate limits: a shed request costs no store call.
    let router = match options.max_in_flight {
        Some(max) => {
            let max = usize::try_from(max).unwrap_or(usize::MAX);
            let reserve = max.div_ceil(5);
            eprintln!(
                "load shedding: at most {max} requests in flight, {reserve} kept for /login \
                 and /healthz"
            );
            router.layer(
                ConcurrencyShedLayer::new(max)
                    .name("orders_api")
                    .critical_when(|request| matches!(request.uri.path(), "/login" | "/healthz"))
                    .reserve(reserve),
            )
        }
        None => router,
    };
    Ok(App {
        router,
        orders: reloadable,
        plans,
        quotas,
    })
}

/// On SIGHUP, reads `--config` and `--plans` again (those given) and swaps their limits,
/// plans and quotas in; a file that does not load leaves what is in force. The handler is
/// installed before this returns, so a SIGHUP from then on never ends the process.
#[cfg(unix)]
fn reload_on_hangup(options: &Options, app: &App) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut hangups = signal(SignalKind::hangup())?;
    let (limits, plans, quotas) = (app.orders.clone(), app.plans.clone(), app.quotas.clone());
    let (config, plans_file) = (options.config.clone(), options.plans.clone());
    let (org_limit, with_plans) = (options.org_limit, options.plans.is_some());
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            if let Some(path) = &config {
                let reloaded = load(path).and_then(|loaded| {
                    let described = describe(&loaded.limits);
                    let flags = FlagsOfLimits {
                        org_limit,
                        with_plans,
                    };
                    limits
                        .set_limits(flags.apply(loaded.limits))
                        .map_err(|e| e.to_string())?;
                    plans.store(Arc::new(loaded.plans));
                    Ok(described)
                });
                match reloaded {
                    Ok(described) => {
                        eprintln!("{}: reloaded: /orders: {described}", path.display())
                    }
                    Err(message) => eprintln!(
                        "{}: not reloaded, the limits in force stay: {message}",
                        path.display()
                    ),
                }
            }
            if let Some(path) = &plans_file {
                match load_quotas(path) {
                    Ok(loaded) => {
                        eprintln!("{}: reloaded: {} plans", path.display(), loaded.len());
                        quotas.store(Arc::new(loaded));
                    }
                    Err(message) => eprintln!(
                        "{}: not reloaded, the plans in force stay: {message}",
                        path.display()
                    ),
                }
            }
        }
    });
    Ok(())
}

/// What the flags add to limits reloaded from `--config`.
struct FlagsOfLimits {
    org_limit: u64,
    with_plans: bool,
}

/// The one-time code `/otp/verify` accepts.
const OTP_CODE: &str = "424242";

/// The longest report /reports makes, so that a request cannot hold a slot for ever.
const MAX_REPORT_MS: u64 = 60_000;

/// A slow report: `?ms=N` takes N milliseconds (at most a minute; 0 without it), then
/// answers. 400 if N is not a number.
async fn report(Query(query): Query<HashMap<String, String>>) -> (StatusCode, String) {
    let ms = match query.get("ms").map(|ms| ms.parse::<u64>()) {
        None => 0,
        Some(Ok(ms)) => ms.min(MAX_REPORT_MS),
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "ms must be a whole number of milliseconds\n".to_owned(),
            );
        }
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    (StatusCode::OK, format!("report made in {ms} ms\n"))
}

/// 200 for the right code, 401 for a wrong one, 400 without a string `code`.
/// The `max_tokens` of a completion request's JSON body.
fn max_tokens(body: &[u8]) -> Option<u64> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    json.get("max_tokens")?.as_u64()
}

/// A pretend completion: 400 without a `max_tokens`, else 200 with a random number of
/// tokens used, up to it, in `x-tokens-used`.
async fn complete(
    Json(body): Json<serde_json::Value>,
) -> Result<([(&'static str, String); 1], &'static str), StatusCode> {
    let max = body
        .get("max_tokens")
        .and_then(serde_json::Value::as_u64)
        .ok_or(StatusCode::BAD_REQUEST)?;
    let used = random_below(max + 1);
    Ok(([("x-tokens-used", used.to_string())], "{\"choices\":[]}"))
}

/// A number below `bound` (at least 1), from a generator seeded once per process.
fn random_below(bound: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
    }
    // xorshift64
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x % bound.max(1)
}

/// `bytes` bytes in chunks of 64 KiB, produced as the client reads them.
struct Download {
    left: u64,
}

impl http_body::Body for Download {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        const CHUNK: u64 = 64 * 1024;
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let size = self.left.min(CHUNK);
        self.left -= size;
        let chunk = bytes::Bytes::from(vec![b'x'; size as usize]);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// `GET /export?bytes=N`: N bytes, streamed (at most 1 GiB; 400 without a number).
async fn export(
    Query(query): Query<HashMap<String, String>>,
) -> Result<axum::body::Body, StatusCode> {
    let bytes: u64 = query
        .get("bytes")
        .and_then(|n| n.parse().ok())
        .filter(|&n| n <= 1 << 30)
        .ok_or(StatusCode::BAD_REQUEST)?;
    Ok(axum::body::Body::new(Download { left: bytes }))
}

async fn verify_otp(Json(body): Json<serde_json::Value>) -> StatusCode {
    let Some(code) = body.get("code").and_then(|code| code.as_str()) else {
        return StatusCode::BAD_REQUEST;
    };
    // Every byte is compared, so the time taken does not tell how much of a guess was right.
    let same = code.len() == OTP_CODE.len()
        && code
            .bytes()
            .zip(OTP_CODE.bytes())
            .fold(0, |differ, (a, b)| differ | (a ^ b))
            == 0;
    if same {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // --help prints on stdout and succeeds; a bad flag exits with 2.
    let options = Options::try_parse().unwrap_or_else(|error| error.exit());
    let config = match &options.config {
        Some(path) => match load(path) {
            Ok(loaded) => Some(loaded),
            Err(message) => {
                eprintln!("--config {}: {message}", path.display());
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    // Buckets make the store latency a histogram (`_bucket` series), which the dashboard in
    // docs/ reads quantiles from; without them the exporter renders a summary.
    let builder = PrometheusBuilder::new().set_buckets_for_metric(
        Matcher::Full("tollgate_store_latency_seconds".into()),
        &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5],
    );
    let metrics = match builder.and_then(PrometheusBuilder::install_recorder) {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("cannot install the metrics recorder: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = match app(&options, config, metrics).await {
        Ok(app) => app,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(options.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", options.listen);
            return ExitCode::FAILURE;
        }
    };
    #[cfg(unix)]
    if (options.config.is_some() || options.plans.is_some())
        && let Err(e) = reload_on_hangup(&options, &app)
    {
        eprintln!("cannot watch for SIGHUP: {e}");
        return ExitCode::FAILURE;
    }
    let address = listener.local_addr().unwrap_or(options.listen);
    println!("listening on http://{address}");
    let served = axum::serve(
        listener,
        app.router
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("server error: {e}");
            ExitCode::FAILURE
        }
    }
}
