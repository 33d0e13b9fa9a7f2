//! Skip and custom refusal on an axum router: skipped requests pass uncounted (no key, no
//! store call, no RateLimit fields) under their own metric outcome, and a refusal hook
//! writes 429 and fail-closed 503 bodies in its own JSON format, the RateLimit fields and
//! Retry-After kept unless the hook removes them.

use std::net::{IpAddr, SocketAddr};
#[cfg(feature = "redis")]
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{Response, StatusCode};
#[cfg(feature = "redis")]
use tollgate::FailurePolicy;
#[cfg(feature = "redis")]
use tollgate::RedisBackend;
const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
use tollgate::store::ManualClock;
use tollgate::{Decision, decision::UnlimitedReason};
use tollgate::{InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer, key::HeaderKey};
use tollgate_testkit::counting::Counting;
use tollgate_testkit::http::{Reply, get as get_request, send};
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, with_recorder};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const DECISIONS: &str = "tollgate_decisions_total";

/// A limiter named `name` of `limit` requests a second on a clock that does not move, its
/// store calls counted.
fn counted_limiter(
    name: &str,
    limit: u64,
) -> (Limiter, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let backend = Counting::new(InMemoryBackend::new().clock(ManualClock::new(1_000_000)));
    let calls = backend.counter();
    let limiter = Limiter::builder()
        .name(name)
        .backend(backend)
        .policy(Policy::sliding_window(
            "per-second",
            Quota::per_second(limit),
        ))
        .build();
    (limiter, calls)
}

fn calls(counter: &std::sync::Arc<std::sync::atomic::AtomicU64>) -> u64 {
    counter.load(std::sync::atomic::Ordering::SeqCst)
}

fn from_peer(
    mut request: http::Request<http_body_util::Full<Bytes>>,
    peer: &str,
) -> http::Request<http_body_util::Full<Bytes>> {
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn decision(reply: &Reply) -> Option<&Decision> {
    reply.extensions.get::<Decision>()
}

fn has_rate_limit_fields(reply: &Reply) -> bool {
    reply.headers.contains_key(RATELIMIT) || reply.headers.contains_key(RATELIMIT_POLICY)
}

#[test]
fn a_skipped_path_passes_uncounted_while_another_is_limited() {
    let ((), snapshot) = with_recorder(|_| async {
        let (limiter, store_calls) = counted_limiter("api", 5);
        let layer = RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(HeaderKey::new("x-customer-id"))
            .skip(|request: &Parts| request.uri.path() == "/healthz");
        let mut app: Router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/orders", get(|| async { "[]" }))
            .layer(layer);

        // The probes carry no key: were the key extracted, each would be a 400.
        for _ in 0..100 {
            let reply = send(&mut app, get_request("/healthz", &[])).await;
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.body, "ok");
            assert!(!has_rate_limit_fields(&reply), "{:?}", reply.headers);
            assert_eq!(
                decision(&reply),
                Some(&Decision::Unlimited(UnlimitedReason::Skipped))
            );
        }
        assert_eq!(
            calls(&store_calls),
            0,
            "a skipped request made a store call"
        );

        let mut statuses = Vec::new();
        for _ in 0..8 {
            let reply = send(
                &mut app,
                get_request("/orders", &[("x-customer-id", "acme")]),
            )
            .await;
            assert!(has_rate_limit_fields(&reply));
            statuses.push(reply.status.as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
        assert_eq!(calls(&store_calls), 8);

        // Probes still pass while the customer is refused.
        let reply = send(&mut app, get_request("/healthz", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(calls(&store_calls), 8);
    });

    let by_outcome = |outcome: &str| {
        counter(
            &snapshot,
            DECISIONS,
            &[("layer", "api"), ("outcome", outcome)],
        )
    };
    assert_eq!(by_outcome("skipped"), 101);
    assert_eq!(by_outcome("allowed"), 5);
    assert_eq!(by_outcome("limited"), 3);
    assert_eq!(by_outcome("unlimited"), 0);
}

#[test]
fn skip_by_peer_network_and_by_an_allow_list_of_keys() {
    let ((), snapshot) = with_recorder(|_| async {
        let (limiter, store_calls) = counted_limiter("partners", 1);
        let internal = |parts: &Parts| {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .is_some_and(|ConnectInfo(peer)| match peer.ip() {
                    IpAddr::V4(ip) => ip.octets()[0] == 10,
                    IpAddr::V6(_) => false,
                })
        };
        let allow_listed = |parts: &Parts| {
            parts
                .headers
                .get("x-api-key")
                .is_some_and(|key| key == "monitoring" || key == "billing-batch")
        };
        let layer = RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(HeaderKey::new("x-api-key"))
            .skip(move |parts| internal(parts) || allow_listed(parts));
        let mut app: Router = Router::new()
            .route("/quotes", get(|| async { "quotes" }))
            .layer(layer);

        for _ in 0..10 {
            let request = get_request("/quotes", &[("x-api-key", "k1")]);
            let reply = send(&mut app, from_peer(request, "10.1.2.3:40000")).await;
            assert_eq!(reply.status, StatusCode::OK, "internal peer refused");
            assert!(!has_rate_limit_fields(&reply));

            let request = get_request("/quotes", &[("x-api-key", "monitoring")]);
            let reply = send(&mut app, from_peer(request, "203.0.113.9:40000")).await;
            assert_eq!(reply.status, StatusCode::OK, "allow-listed key refused");
            assert!(!has_rate_limit_fields(&reply));
        }
        assert_eq!(calls(&store_calls), 0);

        // The same key from outside is counted: one a second.
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let request = get_request("/quotes", &[("x-api-key", "k1")]);
            let reply = send(&mut app, from_peer(request, "203.0.113.9:40000")).await;
            statuses.push(reply.status.as_u16());
        }
        assert_eq!(statuses, [200, 429, 429]);
        assert_eq!(calls(&store_calls), 3);
    });
    let by_outcome = |outcome: &str| {
        counter(
            &snapshot,
            DECISIONS,
            &[("layer", "partners"), ("outcome", outcome)],
        )
    };
    assert_eq!(by_outcome("skipped"), 20);
    assert_eq!(by_outcome("allowed"), 1);
    assert_eq!(by_outcome("limited"), 2);
}

/// The service's own error format: `{"error":{"code":..,"retry_after":..}}`.
fn json_error(decision: &Decision, default: Response<Bytes>) -> Response<Bytes> {
    let code = match decision {
        Decision::Limited(_) => "rate_limited",
        Decision::Unavailable { .. } => "temporarily_unavailable",
        other => panic!("the hook was called for {other:?}"),
    };
    let retry_after: u64 = default.headers()[RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let (mut parts, _problem) = default.into_parts();
    parts
        .headers
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    let body = serde_json::json!({"error": {"code": code, "retry_after": retry_after}});
    Response::from_parts(parts, Bytes::from(body.to_string()))
}

/// [`json_error`], without the RateLimit fields and Retry-After.
fn json_error_without_fields(decision: &Decision, default: Response<Bytes>) -> Response<Bytes> {
    let mut response = json_error(decision, default);
    let headers = response.headers_mut();
    headers.remove(RATELIMIT);
    headers.remove(RATELIMIT_POLICY);
    headers.remove(RETRY_AFTER);
    response
}

fn assert_json_error(reply: &Reply, status: StatusCode, code: &str) {
    assert_eq!(reply.status, status);
    assert_eq!(reply.headers[CONTENT_TYPE], "application/json");
    let body = reply.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["retry_after"].as_u64().unwrap() >= 1,
        "{body}"
    );
}

#[test]
fn a_custom_429_keeps_the_fields_unless_the_hook_removes_them() {
    let ((), snapshot) = with_recorder(|_| async {
        let (kept, _) = counted_limiter("kept", 1);
        let (stripped, _) = counted_limiter("stripped", 1);
        let key = HeaderKey::new("x-customer-id");
        let mut app: Router = Router::new()
            .route(
                "/kept",
                get(|| async { "kept" }).layer(
                    RateLimitLayer::new(kept)
                        .decision_on_every_response(true)
                        .key(key.clone())
                        .on_refusal(json_error),
                ),
            )
            .route(
                "/stripped",
                get(|| async { "stripped" }).layer(
                    RateLimitLayer::new(stripped)
                        .decision_on_every_response(true)
                        .key(key)
                        .on_refusal(json_error_without_fields),
                ),
            );
        let acme = [("x-customer-id", "acme")];

        // Allowed responses do not go through the hook.
        let first = send(&mut app, get_request("/kept", &acme)).await;
        assert_eq!(first.status, StatusCode::OK);
        assert_eq!(first.body, "kept");

        let refused = send(&mut app, get_request("/kept", &acme)).await;
        assert_json_error(&refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
        assert_eq!(refused.headers[RATELIMIT_POLICY], r#""per-second";q=1;w=1"#);
        assert!(refused.headers.contains_key(RATELIMIT));
        let retry_after = refused.retry_after().expect("Retry-After kept");
        assert_eq!(
            refused.json()["error"]["retry_after"].as_u64(),
            Some(retry_after)
        );
        assert!(matches!(decision(&refused), Some(Decision::Limited(_))));

        assert_eq!(
            send(&mut app, get_request("/stripped", &acme)).await.status,
            StatusCode::OK
        );
        let refused = send(&mut app, get_request("/stripped", &acme)).await;
        assert_json_error(&refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
        assert!(!has_rate_limit_fields(&refused), "{:?}", refused.headers);
        assert!(!refused.headers.contains_key(RETRY_AFTER));
        assert!(matches!(decision(&refused), Some(Decision::Limited(_))));
    });
    // A custom refusal is still a refusal in the metrics.
    for layer in ["kept", "stripped"] {
        let labels = |outcome| [("layer", layer), ("outcome", outcome)];
        assert_eq!(counter(&snapshot, DECISIONS, &labels("allowed")), 1);
        assert_eq!(counter(&snapshot, DECISIONS, &labels("limited")), 1);
    }
}

#[cfg(feature = "redis")]
fn closed_limiter(name: &str, url: &str) -> Limiter {
    let store = RedisBackend::builder(url)
        .prefix(name)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .build()
        .unwrap();
    Limiter::builder()
        .name(name)
        .backend(store)
        .store_timeout(Duration::from_millis(200))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .on_store_failure(FailurePolicy::closed())
        .build()
}

#[cfg(feature = "redis")]
#[test]
fn a_custom_fail_closed_503_keeps_the_fields_unless_the_hook_removes_them() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let url = proxy.url();
    let ((), snapshot) = with_recorder(|_| async {
        let key = HeaderKey::new("x-customer-id");
        let mut app: Router = Router::new()
            .route(
                "/kept",
                get(|| async { "kept" }).layer(
                    RateLimitLayer::new(closed_limiter("login-kept", &url))
                        .decision_on_every_response(true)
                        .key(key.clone())
                        .on_refusal(json_error),
                ),
            )
            .route(
                "/stripped",
                get(|| async { "stripped" }).layer(
                    RateLimitLayer::new(closed_limiter("login-stripped", &url))
                        .decision_on_every_response(true)
                        .key(key)
                        .on_refusal(json_error_without_fields),
                ),
            );
        let acme = [("x-customer-id", "acme")];
        for path in ["/kept", "/stripped"] {
            let reply = send(&mut app, get_request(path, &acme)).await;
            assert_eq!(reply.status, StatusCode::OK, "{path} with Redis up");
        }

        proxy.set(Fault::Refuse);
        let refused = send(&mut app, get_request("/kept", &acme)).await;
        assert_json_error(
            &refused,
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
        );
        assert_eq!(
            refused.headers[RATELIMIT_POLICY],
            r#""per-minute";q=0;w=60"#
        );
        assert!(refused.headers.contains_key(RATELIMIT));
        assert!(refused.retry_after().is_some());
        assert!(matches!(
            decision(&refused),
            Some(Decision::Unavailable { .. })
        ));

        let refused = send(&mut app, get_request("/stripped", &acme)).await;
        assert_json_error(
            &refused,
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
        );
        assert!(!has_rate_limit_fields(&refused), "{:?}", refused.headers);
        assert!(!refused.headers.contains_key(RETRY_AFTER));
        assert!(matches!(
            decision(&refused),
            Some(Decision::Unavailable { .. })
        ));
    });
    for layer in ["login-kept", "login-stripped"] {
        let labels = |outcome| [("layer", layer), ("outcome", outcome)];
        assert_eq!(counter(&snapshot, DECISIONS, &labels("allowed")), 1);
        assert_eq!(counter(&snapshot, DECISIONS, &labels("unavailable")), 1);
    }
}
