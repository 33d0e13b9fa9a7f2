//! The `orders_api` example's server on the in-process store, with or without its
//! rate-limit layers, for the HTTP benchmark in `scripts/bench` (wrk on loopback).
//!
//! ```text
//! bench_server [--listen ADDR] [--limit N] [--no-limit]
//! ```
//!
//! The router is `orders_api`'s without `--redis`: `GET /orders` limited to `--limit`
//! requests a second per `x-customer-id` (sliding window, local share on store failure, a
//! missing header is 401), `POST /login` limited per client IP and failing closed,
//! `GET /healthz`, and `GET /metrics` from an installed Prometheus recorder. With
//! `--no-limit` the same router is built without the two rate-limit layers, the recorder
//! still installed. Prints `listening on http://ADDR` once it accepts connections; use
//! `--listen 127.0.0.1:0` for a free port.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tollgate::{
    ClientIp, FailurePolicy, HeaderKey, InMemoryBackend, InstanceCount, Limiter, MissingKey,
    Policy, Quota, RateLimitLayer,
};

const USAGE: &str = "usage: bench_server [--listen ADDR] [--limit N] [--no-limit]";

struct Options {
    listen: SocketAddr,
    limit: u64,
    limited: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        limit: 50,
        limited: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--listen" => {
                options.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?
            }
            "--limit" => {
                options.limit = value()?.parse().map_err(|e| format!("--limit: {e}"))?;
                if options.limit == 0 {
                    return Err("--limit must be at least 1".to_owned());
                }
            }
            "--no-limit" => options.limited = false,
            "--help" | "-h" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(options)
}

fn app(options: &Options, metrics: PrometheusHandle) -> Router {
    let mut app = Router::new().route("/orders", get(|| async { "[]" }));
    if options.limited {
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
        app = app.route_layer(
            RateLimitLayer::new(orders)
                .key(HeaderKey::new("x-customer-id"))
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        );
    }
    let login = post(|| async { "welcome" });
    let login = if options.limited {
        let limiter = Limiter::builder()
            .name("login")
            .backend(InMemoryBackend::new())
            .store_timeout(Duration::from_millis(20))
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
            .on_store_failure(FailurePolicy::closed())
            .build();
        login.layer(RateLimitLayer::new(limiter).key(ClientIp::new()))
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
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
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
