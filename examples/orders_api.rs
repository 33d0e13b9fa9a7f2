//! The running example: an orders API rate-limited per customer.
//!
//! ```text
//! cargo run --example orders_api -- [--listen ADDR] [--limit N] [--window-secs N]
//!                                   [--trusted-proxy CIDR]...
//! ```
//!
//! - `GET /orders`: 50 requests per second per `x-customer-id` (a missing header is 401).
//! - `POST /login`: 5 per minute per client IP, failing closed when the store is down.
//! - `GET /healthz`: never limited.
//!
//! Try it: `for i in $(seq 60); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-customer-id: acme' localhost:3000/orders; done | sort | uniq -c`

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tollgate::{
    ClientIp, FailurePolicy, HeaderKey, Limiter, MissingKey, Policy, Quota, RateLimitLayer,
    TrustedProxies,
};

struct Options {
    listen: SocketAddr,
    limit: u64,
    window_secs: u64,
    trusted_proxies: Vec<String>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        limit: 50,
        window_secs: 1,
        trusted_proxies: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => {
                options.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?;
            }
            "--limit" => {
                options.limit = value()?.parse().map_err(|e| format!("--limit: {e}"))?;
            }
            "--window-secs" => {
                options.window_secs = value()?
                    .parse()
                    .map_err(|e| format!("--window-secs: {e}"))?;
            }
            "--trusted-proxy" => options.trusted_proxies.push(value()?),
            "--help" | "-h" => {
                return Err(
                    "usage: orders_api [--listen ADDR] [--limit N] [--window-secs N] [--trusted-proxy CIDR]..."
                        .to_owned(),
                );
            }
            other => return Err(format!("unknown flag {other}; try --help")),
        }
    }
    if options.limit == 0 || options.window_secs == 0 {
        return Err("--limit and --window-secs must be at least 1".to_owned());
    }
    Ok(options)
}

fn app(options: &Options) -> Result<Router, String> {
    let orders = Limiter::builder()
        .policy(Policy::sliding_window(
            "per-second",
            Quota::new(options.limit, Duration::from_secs(options.window_secs)),
        ))
        .build();
    let login = Limiter::builder()
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .build();
    let trusted = TrustedProxies::parse(&options.trusted_proxies).map_err(|e| e.to_string())?;

    Ok(Router::new()
        .route("/orders", get(list_orders))
        .route_layer(
            RateLimitLayer::new(orders)
                .key(HeaderKey::new("x-customer-id"))
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .route(
            "/login",
            post(login_handler)
                .layer(RateLimitLayer::new(login).key(ClientIp::new().trusted_proxies(trusted))),
        )
        .route("/healthz", get(|| async { "ok" })))
}

async fn list_orders() -> &'static str {
    "[]"
}

async fn login_handler() -> &'static str {
    "welcome"
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
    let app = match app(&options) {
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
