//! The `orders_api` example's server on the in-process store, with or without its
//! rate-limit layers, for the HTTP benchmark in `scripts/bench` (wrk on loopback).
//!
//! ```text
//! bench_server [--listen ADDR] [--limit N] [--no-limit] [--no-fields] [--tower-governor]
//!              [--pass-through]
//! ```
//!
//! The router is `orders_api`'s without `--redis`: `GET /orders` limited to `--limit`
//! requests a second per `x-customer-id` (sliding window, local share on store failure, a
//! missing header is 401), `POST /login` limited per client IP and failing closed,
//! `GET /healthz`, and `GET /metrics` from an installed Prometheus recorder. With
//! `--no-limit` the same router is built without the two rate-limit layers, the recorder
//! still installed; with `--no-fields` the layers stay but admitted responses carry no
//! RateLimit fields. With `--tower-governor`, `GET /orders` is limited by tower_governor
//! instead, the peer a user would pick: keyed on the same header as its docs show, at the
//! same rate (a burst of `--limit`, one more every 1/limit s), with its `x-ratelimit-*`
//! headers unless `--no-fields`; `POST /login` then has no layer, as wrk never calls it.
//! With `--pass-through`, `GET /orders` is mounted behind a layer that passes every request
//! on untouched, and `POST /login` has no layer: what mounting any layer costs in the router.
//! Prints `listening on http://ADDR` once it accepts connections; use `--listen
//! 127.0.0.1:0` for a free port.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::{get, post};
use clap::{ArgAction, Parser};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tollgate::{
    FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota, RateLimitLayer,
    key::{ClientIp, HeaderKey, MissingKey},
    response::{HeaderMode, InnerBody},
};
use tower::util::MapRequestLayer;

/// The orders_api router on the in-process store, for the HTTP benchmark.
#[derive(Debug, Parser)]
#[command(name = "bench_server")]
struct Options {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Requests a second per customer on GET /orders.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Builds the router without the rate-limit layers.
    #[arg(long = "no-limit", action = ArgAction::SetFalse)]
    limited: bool,
    /// Keeps the RateLimit fields off admitted responses (`HeaderMode::Never`), to tell
    /// the layer's own cost from the fields' encoding and parsing.
    #[arg(long = "no-fields")]
    no_fields: bool,
    /// Limits GET /orders with tower_governor in place of tollgate's layer.
    #[arg(long = "tower-governor", conflicts_with = "limited")]
    tower_governor: bool,
    /// Mounts GET /orders behind a layer that does nothing, in place of tollgate's layer.
    #[arg(long = "pass-through", conflicts_with_all = ["limited", "tower_governor"])]
    pass_through: bool,
}

/// tower_governor's key extractor for the customer header, written as its docs suggest.
#[derive(Clone, Debug)]
struct CustomerHeader;

impl tower_governor::key_extractor::KeyExtractor for CustomerHeader {
    type Key = String;

    fn extract<T>(
        &self,
        request: &axum::http::Request<T>,
    ) -> Result<String, tower_governor::GovernorError> {
        request
            .headers()
            .get("x-customer-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// GET /orders limited per customer by tower_governor, at `--limit` a second.
fn governed_orders(options: &Options) -> Router {
    let limit = u32::try_from(options.limit).unwrap_or(u32::MAX);
    let mut builder = tower_governor::governor::GovernorConfigBuilder::default()
        .period(Duration::from_secs(1) / limit)
        .burst_size(limit)
        .key_extractor(CustomerHeader);
    let orders = Router::new().route("/orders", get(|| async { "[]" }));
    // A period and a burst above zero always make a configuration.
    if options.no_fields {
        let config = builder.finish().expect("a configuration");
        orders.route_layer(tower_governor::GovernorLayer::new(config))
    } else {
        let config = builder.use_headers().finish().expect("a configuration");
        orders.route_layer(tower_governor::GovernorLayer::new(config))
    }
}

fn app(options: &Options, metrics: PrometheusHandle) -> Router {
    let mut app = Router::new().route("/orders", get(|| async { "[]" }));
    if options.tower_governor {
        app = governed_orders(options);
    } else if options.pass_through {
        app = app.route_layer(MapRequestLayer::new(|request: Request| request));
    } else if options.limited {
        let orders = Limiter::builder()
            .name("orders")
            .backend(InMemoryBackend::new())
            .store_timeout(Duration::from_millis(20))
            .policy(Policy::sliding_window(
                "per-second",
                Quota::per_second(options.limit),
            ))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(1)))
            .build();
        // In axum's body type, as the README mounts it in a router.
        let mut layer = RateLimitLayer::new(orders)
            .key(HeaderKey::new("x-customer-id"))
            .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
            .response_body::<InnerBody>();
        if options.no_fields {
            layer = layer.headers(HeaderMode::Never);
        }
        app = app.route_layer(layer);
    }
    let login = post(|| async { "welcome" });
    let login = if options.limited && !options.tower_governor && !options.pass_through {
        let limiter = Limiter::builder()
            .name("login")
            .backend(InMemoryBackend::new())
            .store_timeout(Duration::from_millis(20))
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
            .on_store_failure(FailurePolicy::closed())
            .build();
        login.layer(
            RateLimitLayer::new(limiter)
                .key(ClientIp::new())
                .response_body::<InnerBody>(),
        )
    } else {
        login
    };
    app.route("/login", login)
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = Options::parse();
    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("cannot install the metrics recorder: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = app(&options, metrics);
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
