//! The running example as a server: an orders API rate-limited per customer, a login form
//! that fails closed, and Prometheus metrics.
//!
//! ```text
//! orders_api [--listen ADDR] [--redis URL | --redis-cluster URL[,URL...]]
//!            [--limit N] [--window-secs N]
//!            [--on-store-failure open|closed|local-share|static] [--instances N]
//!            [--store-timeout-ms N] [--trusted-proxy CIDR]...
//! ```
//!
//! - `GET /orders`: `--limit` requests per `--window-secs` per `x-customer-id` (a missing
//!   header is 401), with the chosen failure policy (default local share).
//! - `POST /login`: 5 per minute per client IP, failing closed.
//! - `POST /otp/verify`: checks a one-time code, body `{"code": "..."}`. The right code is
//!   `424242` (200); any other is 401, a body without a string `code` is 400. Only wrong
//!   codes count: 5 failed attempts per minute per client IP, then 429 until the minute
//!   has passed, the right code included. Fails closed.
//! - `GET /healthz`: never limited.
//! - `GET /metrics`: Prometheus text format.
//!
//! Without `--redis` the counters live in this process. With it, they live in Redis and the
//! local share divides by `--instances`, or by the live instances that heartbeat into Redis
//! when `--instances` is not given. `--redis-cluster` does the same on a Redis Cluster,
//! reached through any of the comma-separated node URLs (the others are discovered); it
//! and `--redis` exclude each other.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate::{
    ClientIp, FailurePolicy, HeaderKey, InMemoryBackend, InstanceCount, InstanceRegistry, Limiter,
    MissingKey, Policy, Quota, RateLimitLayer, RedisBackend, TrustedProxies,
};

const USAGE: &str = "usage: orders_api [--listen ADDR] [--redis URL | --redis-cluster URL[,URL...]]
                  [--limit N] [--window-secs N]
                  [--on-store-failure open|closed|local-share|static] [--instances N]
                  [--store-timeout-ms N] [--trusted-proxy CIDR]...";

struct Options {
    listen: SocketAddr,
    redis: Option<String>,
    redis_cluster: Option<Vec<String>>,
    limit: u64,
    window_secs: u64,
    on_store_failure: String,
    instances: Option<u64>,
    store_timeout_ms: u64,
    trusted_proxies: Vec<String>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        redis: None,
        redis_cluster: None,
        limit: 50,
        window_secs: 1,
        on_store_failure: "local-share".to_owned(),
        instances: None,
        store_timeout_ms: 20,
        trusted_proxies: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let number = |value: String| value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--listen" => {
                options.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?
            }
            "--redis" => options.redis = Some(value()?),
            "--redis-cluster" => {
                let nodes: Vec<String> = value()?
                    .split(',')
                    .map(str::trim)
                    .filter(|url| !url.is_empty())
                    .map(str::to_owned)
                    .collect();
                if nodes.is_empty() {
                    return Err(format!(
                        "--redis-cluster needs at least one node URL\n{USAGE}"
                    ));
                }
                options.redis_cluster = Some(nodes);
            }
            "--limit" => options.limit = number(value()?)?,
            "--window-secs" => options.window_secs = number(value()?)?,
            "--on-store-failure" => options.on_store_failure = value()?,
            "--instances" => options.instances = Some(number(value()?)?),
            "--store-timeout-ms" => options.store_timeout_ms = number(value()?)?,
            "--trusted-proxy" => options.trusted_proxies.push(value()?),
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    if options.redis.is_some() && options.redis_cluster.is_some() {
        return Err(format!(
            "--redis and --redis-cluster exclude each other: give one Redis or one cluster\n{USAGE}"
        ));
    }
    if options.limit == 0 || options.window_secs == 0 {
        return Err("--limit and --window-secs must be at least 1".to_owned());
    }
    if options.instances == Some(0) {
        return Err("--instances must be at least 1".to_owned());
    }
    Ok(options)
}

fn failure_policy(
    options: &Options,
    registry: Option<InstanceRegistry>,
) -> Result<FailurePolicy, String> {
    let instances = match (options.instances, registry) {
        (Some(count), _) => InstanceCount::fixed(count),
        (None, Some(registry)) => InstanceCount::live(registry),
        (None, None) => InstanceCount::fixed(1),
    };
    match options.on_store_failure.as_str() {
        "open" => Ok(FailurePolicy::open()),
        "closed" => Ok(FailurePolicy::closed()),
        "local-share" => Ok(FailurePolicy::local_share(instances)),
        "static" => Ok(FailurePolicy::fail_static()),
        other => Err(format!(
            "--on-store-failure: unknown policy {other:?}\n{USAGE}"
        )),
    }
}

fn store(options: &Options, prefix: &str) -> Result<Option<RedisBackend>, String> {
    match (&options.redis, &options.redis_cluster) {
        (Some(url), _) => RedisBackend::builder(url.as_str())
            .prefix(prefix)
            .build()
            .map(Some)
            .map_err(|e| format!("--redis: {e}")),
        (None, Some(nodes)) => RedisBackend::cluster_builder(nodes.iter().cloned())
            .prefix(prefix)
            .build()
            .map(Some)
            .map_err(|e| format!("--redis-cluster: {e}")),
        (None, None) => Ok(None),
    }
}

fn limiter(name: &str, store: Option<RedisBackend>, options: &Options) -> tollgate::LimiterBuilder {
    let builder = Limiter::builder()
        .name(name)
        .store_timeout(Duration::from_millis(options.store_timeout_ms));
    match store {
        Some(store) => builder.backend(store),
        None => builder.backend(InMemoryBackend::new()),
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

async fn app(options: &Options, metrics: PrometheusHandle) -> Result<Router, String> {
    let orders_store = store(options, "orders")?;
    let login_store = store(options, "login")?;
    let otp_store = store(options, "otp")?;
    for store in orders_store.iter().chain(&login_store).chain(&otp_store) {
        if let Err(error) = store.ping().await {
            eprintln!(
                "warning: Redis does not answer yet ({error}); failure policies apply until it does"
            );
        }
    }
    let registry = match (&orders_store, options.instances) {
        (Some(store), None) => Some(
            InstanceRegistry::builder(store)
                .start()
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let orders = limiter("orders", orders_store, options)
        .policy(Policy::sliding_window(
            policy_name(options.window_secs),
            Quota::new(options.limit, Duration::from_secs(options.window_secs)),
        ))
        .on_store_failure(failure_policy(options, registry)?)
        .build();
    let login = limiter("login", login_store, options)
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .build();
    let otp = limiter("otp", otp_store, options)
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .build();
    let trusted = TrustedProxies::parse(&options.trusted_proxies).map_err(|e| e.to_string())?;
    let where_ = match (&options.redis, &options.redis_cluster) {
        (Some(url), _) => url.clone(),
        (None, Some(nodes)) => format!("the Redis Cluster at {}", nodes.join(",")),
        (None, None) => "this process".to_owned(),
    };
    eprintln!(
        "/orders: {} per {} s per customer, counters in {where_}, on store failure: {}",
        options.limit, options.window_secs, options.on_store_failure
    );

    Ok(Router::new()
        .route("/orders", get(|| async { "[]" }))
        .route_layer(
            RateLimitLayer::new(orders)
                .key(HeaderKey::new("x-customer-id"))
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .route(
            "/login",
            post(|| async { "welcome" }).layer(
                RateLimitLayer::new(login).key(ClientIp::new().trusted_proxies(trusted.clone())),
            ),
        )
        .route(
            "/otp/verify",
            post(verify_otp).layer(
                RateLimitLayer::new(otp)
                    .key(ClientIp::new().trusted_proxies(trusted))
                    .count_only(|response| response.status == StatusCode::UNAUTHORIZED),
            ),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        ))
}

/// The one-time code `/otp/verify` accepts.
const OTP_CODE: &str = "424242";

/// 200 for the right code, 401 for a wrong one, 400 without a string `code`.
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
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
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
    let app = match app(&options, metrics).await {
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
    let address = listener.local_addr().unwrap_or(options.listen);
    println!("listening on http://{address}");
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
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
