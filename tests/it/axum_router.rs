//! The layer on axum: `Router::layer`, `route_layer`, per-route layers, shared clones,
//! decisions in response extensions, and client IPs from a real TCP peer.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio::net::TcpListener;
use tollgate::store::ManualClock;
use tollgate::{
    Decision, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer,
    key::{ClientIp, HeaderKey, MissingKey},
};
use tollgate_testkit::http::{Reply, exchange, get as get_request, parse_response, send};

/// One millisecond past the start of a second, so that no test straddles a window.
const START_MS: u64 = 1_000_000;

/// A limiter on a clock that does not move: requests in one test all land in one window.
fn limiter(policies: impl IntoIterator<Item = Policy>) -> Limiter {
    let backend = InMemoryBackend::new().clock(ManualClock::new(START_MS));
    policies
        .into_iter()
        .fold(
            Limiter::builder().name("axum-router").backend(backend),
            |builder, policy| builder.policy(policy),
        )
        .build()
}

fn per_second(limit: u64) -> Policy {
    Policy::sliding_window("per-second", Quota::per_second(limit))
}

/// Per `x-customer-id`; no header is 401.
fn per_customer(limiter: Limiter) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(limiter)
        .decision_on_every_response(true)
        .key(HeaderKey::new("x-customer-id"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
}

fn customer(uri: &str, id: &str) -> Request<Full<Bytes>> {
    get_request(uri, &[("x-customer-id", id)])
}

fn from_peer(mut request: Request<Full<Bytes>>, peer: &str) -> Request<Full<Bytes>> {
    let peer: SocketAddr = peer.parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn post_request(uri: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::post(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

fn content_type(reply: &Reply) -> &str {
    reply
        .headers
        .get(http::header::CONTENT_TYPE)
        .expect("content-type")
        .to_str()
        .unwrap()
}

/// The names of the policies that refused, from the Decision in the response's extensions.
fn violated(reply: &Reply) -> Vec<String> {
    match reply.extensions.get::<Decision>() {
        Some(Decision::Limited(info)) => info.violated().map(|p| p.name().to_owned()).collect(),
        other => panic!("expected Decision::Limited in the extensions, got {other:?}"),
    }
}

#[tokio::test]
async fn router_layer_limits_each_customer_to_exactly_its_quota() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .layer(per_customer(limiter([per_second(50)])));

    let mut ok = 0;
    let mut limited = 0;
    for i in 0..60 {
        let reply = send(&mut app, customer("/orders", "acme")).await;
        match reply.status {
            StatusCode::OK => {
                assert_eq!(reply.body, "orders");
                assert_eq!(limited, 0, "request {i} admitted after a refusal");
                ok += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("request {i}: unexpected status {other}"),
        }
    }
    assert_eq!((ok, limited), (50, 10));

    // Other customers have their own counters.
    for id in ["globex", "initech", "acme}", "ACME"] {
        let reply = send(&mut app, customer("/orders", id)).await;
        assert_eq!(reply.status, StatusCode::OK, "customer {id:?}");
    }
    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn router_layer_answers_401_problem_json_without_a_customer_header() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .layer(per_customer(limiter([per_second(50)])));

    for request in [
        get_request("/orders", &[]),
        get_request("/orders", &[("x-customer-id", "")]),
    ] {
        let reply = send(&mut app, request).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(content_type(&reply), "application/problem+json");
        let body = reply.json();
        assert_eq!(body["status"], 401);
        assert!(body["title"].is_string(), "{body}");
        assert!(reply.headers.get(http::header::RETRY_AFTER).is_none());
    }
}

#[tokio::test]
async fn route_layer_leaves_unmatched_routes_to_the_404_fallback() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .route_layer(per_customer(limiter([per_second(3)])));

    for _ in 0..3 {
        let reply = send(&mut app, customer("/orders", "acme")).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);

    // acme is exhausted, yet an unknown path is a plain 404, with or without a key.
    let reply = send(&mut app, customer("/nope", "acme")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(reply.headers.get("ratelimit").is_none());
    assert!(reply.extensions.get::<Decision>().is_none());
    let reply = send(&mut app, get_request("/nope", &[])).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    // The matched route still refuses.
    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn decisions_can_be_left_off_admitted_responses_but_never_off_refusals() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .route_layer(per_customer(limiter([per_second(1)])).decision_on_every_response(false));

    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.extensions.get::<Decision>().is_none());
    // The fields do not depend on the extension.
    assert!(reply.headers.get("ratelimit").is_some());

    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(matches!(
        reply.extensions.get::<Decision>(),
        Some(Decision::Limited(_))
    ));
}

#[tokio::test]
async fn router_layer_by_contrast_also_covers_the_fallback() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .layer(per_customer(limiter([per_second(1)])));

    assert_eq!(
        send(&mut app, customer("/orders", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut app, customer("/nope", "acme")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&mut app, customer("/nope", "globex")).await.status,
        StatusCode::NOT_FOUND
    );
}

/// `/orders` and `/login` under a router-wide per-customer limit (10 per second), and
/// `/login` also under its own per-IP limit (3 per minute, policy `login`).
fn orders_and_login() -> Router {
    let login = limiter([Policy::sliding_window("login", Quota::per_minute(3))]);
    let router_wide = RateLimitLayer::new(limiter([per_second(10)]))
        .decision_on_every_response(true)
        .key(HeaderKey::new("x-customer-id"))
        .on_missing_key(MissingKey::Pass);
    Router::new()
        .route("/orders", get(|| async { "orders" }))
        .route(
            "/login",
            post(|| async { "welcome" })
                .layer(RateLimitLayer::new(login).decision_on_every_response(true)),
        )
        .layer(router_wide)
}

#[tokio::test]
async fn per_route_layer_applies_to_login_only() {
    let mut app = orders_and_login();
    let peer = "203.0.113.7:40000";

    for _ in 0..3 {
        let reply = send(&mut app, from_peer(post_request("/login", &[]), peer)).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "welcome");
    }
    let reply = send(&mut app, from_peer(post_request("/login", &[]), peer)).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["login"])
    );

    // The same address, another port: the same client.
    let reply = send(
        &mut app,
        from_peer(post_request("/login", &[]), "203.0.113.7:40001"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // Another address has its own login budget.
    let reply = send(
        &mut app,
        from_peer(post_request("/login", &[]), "198.51.100.9:40000"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);

    // The login limit does not reach /orders, not even for the exhausted address.
    for _ in 0..5 {
        let reply = send(
            &mut app,
            from_peer(customer("/orders", "acme"), "203.0.113.7:40000"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn router_wide_layer_applies_to_login_and_orders() {
    let mut app = orders_and_login();

    // acme spends its router-wide budget on /orders...
    for _ in 0..10 {
        let reply = send(
            &mut app,
            from_peer(customer("/orders", "acme"), "203.0.113.7:1"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = send(
        &mut app,
        from_peer(customer("/orders", "acme"), "203.0.113.7:1"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(violated(&reply), ["per-second"]);

    // ...and is refused on /login by the router-wide limit, from a fresh address whose
    // login budget is untouched.
    let reply = send(
        &mut app,
        from_peer(
            post_request("/login", &[("x-customer-id", "acme")]),
            "198.51.100.9:1",
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(violated(&reply), ["per-second"]);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["per-second"])
    );

    // Another customer from that address gets in.
    let reply = send(
        &mut app,
        from_peer(
            post_request("/login", &[("x-customer-id", "globex")]),
            "198.51.100.9:1",
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
}

/// When the inner (per-route) layer refuses and the outer (router-wide) one admitted, the
/// 429 must still describe the refusal: a 429 carries `RateLimit`
/// for the exhausted policy with r=0, and Retry-After never earlier than its t.
#[tokio::test]
async fn a_refusal_by_the_inner_layer_keeps_its_own_fields() {
    let mut app = orders_and_login();
    let peer = "203.0.113.7:40000";
    let login = || from_peer(post_request("/login", &[("x-customer-id", "acme")]), peer);
    for _ in 0..3 {
        assert_eq!(send(&mut app, login()).await.status, StatusCode::OK);
    }
    let reply = send(&mut app, login()).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["login"])
    );

    let state = reply.policy_params("ratelimit");
    let login_state = state
        .iter()
        .find(|(name, _)| name == "login")
        .unwrap_or_else(|| panic!("RateLimit on a 429 from the login limit: {state:?}"));
    assert!(login_state.1.contains(&("r".to_owned(), 0)), "{state:?}");
    assert!(
        state
            .iter()
            .all(|(_, params)| params.contains(&("r".to_owned(), 0))),
        "a 429 lists only exhausted policies in RateLimit: {state:?}"
    );
    assert_eq!(violated(&reply), ["login"]);
    let decision = reply
        .extensions
        .get::<tollgate::Decision>()
        .expect("a decision");
    assert!(
        matches!(decision, tollgate::Decision::Limited(_)),
        "{decision:?}"
    );
}

/// On an allowed response both layers' policies are listed: an inner per-route limit does
/// not hide the router-wide one, nor the other way round.
#[tokio::test]
async fn an_allowed_response_lists_both_layers_policies() {
    let mut app = orders_and_login();
    let reply = send(
        &mut app,
        from_peer(
            post_request("/login", &[("x-customer-id", "acme")]),
            "203.0.113.8:1",
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let policies: Vec<String> = reply
        .policy_params("ratelimit-policy")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(policies, ["login", "per-second"]);
    let state: Vec<String> = reply
        .policy_params("ratelimit")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(state, ["login", "per-second"]);
}

#[tokio::test]
async fn clones_of_one_layer_count_together() {
    let layer = per_customer(limiter([per_second(3)]));
    let mut a = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(layer.clone());
    let mut b = Router::new()
        .route("/b", get(|| async { "b" }))
        .layer(layer);

    assert_eq!(
        send(&mut a, customer("/a", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut b, customer("/b", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut a, customer("/a", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut b, customer("/b", "acme")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&mut a, customer("/a", "acme")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Clones of the routers share the same counters too.
    assert_eq!(
        send(&mut a.clone(), customer("/a", "acme")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn layers_built_from_clones_of_one_limiter_count_together() {
    let limiter = limiter([per_second(2)]);
    let mut a = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(per_customer(limiter.clone()));
    let mut b = Router::new()
        .route("/b", get(|| async { "b" }))
        .layer(per_customer(limiter));

    assert_eq!(
        send(&mut a, customer("/a", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut b, customer("/b", "acme")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut a, customer("/a", "acme")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_decision_is_in_the_response_extensions() {
    let mut app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .layer(per_customer(limiter([
            per_second(2),
            Policy::sliding_window("per-day", Quota::per_day(1_000_000)),
        ])));

    for remaining in [1, 0] {
        let reply = send(&mut app, customer("/orders", "acme")).await;
        assert_eq!(reply.status, StatusCode::OK);
        let Some(Decision::Allowed(info)) = reply.extensions.get::<Decision>() else {
            panic!(
                "expected Decision::Allowed, got {:?}",
                reply.extensions.get::<Decision>()
            );
        };
        let names: Vec<_> = info.policies().map(|p| p.name()).collect();
        assert_eq!(names, ["per-second", "per-day"]);
        assert_eq!(info.policy(0).expect("a policy").remaining(), remaining);
        assert_eq!(info.policy(0).expect("a policy").quota(), 2);
        assert_eq!(info.policy(1).expect("a policy").quota(), 1_000_000);
        assert_eq!(info.min_remaining(), Some(remaining));
        assert!(info.violated().next().is_none());
        assert!(info.policies().all(|p| p.reset_secs() >= 1));
    }

    let reply = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let Some(decision @ Decision::Limited(info)) = reply.extensions.get::<Decision>() else {
        panic!(
            "expected Decision::Limited, got {:?}",
            reply.extensions.get::<Decision>()
        );
    };
    assert!(!decision.is_allowed());
    assert_eq!(violated(&reply), ["per-second"]);
    assert_eq!(info.policy(0).expect("a policy").remaining(), 0);
    assert!(info.policy(0).expect("a policy").is_exhausted());
    assert!(!info.policy(1).expect("a policy").is_exhausted());
    assert_eq!(Some(info.retry_after_secs()), reply.retry_after());
}

#[tokio::test]
async fn handlers_see_the_decision_through_a_middleware() {
    // A logging middleware outside the layer reads the decision from the response.
    let app = Router::new()
        .route("/orders", get(|| async { "orders" }))
        .layer(per_customer(limiter([per_second(1)])))
        .layer(axum::middleware::map_response(
            |mut response: axum::response::Response| async move {
                let outcome = match response.extensions().get::<Decision>() {
                    Some(Decision::Allowed(_)) => "allowed",
                    Some(Decision::Limited(_)) => "limited",
                    Some(_) => "other",
                    None => "none",
                };
                response
                    .headers_mut()
                    .insert("x-decision", outcome.parse().unwrap());
                response
            },
        ));
    let mut app = app;
    let first = send(&mut app, customer("/orders", "acme")).await;
    let second = send(&mut app, customer("/orders", "acme")).await;
    assert_eq!(first.headers["x-decision"], "allowed");
    assert_eq!(second.headers["x-decision"], "limited");
}

// ---- A real server on a real socket ----

/// Sends one HTTP/1.1 request over a fresh connection from `source` and reads the reply.
async fn wire_request(
    server: SocketAddr,
    source: IpAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {server}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    parse_response(&exchange(server, source, &request).await)
}

#[tokio::test]
async fn client_ip_keys_on_the_real_tcp_peer() {
    let app = orders_and_login();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });

    let first = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let second = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    // Each request comes over its own connection (its own source port); the key is the
    // address, so they count together.
    for _ in 0..3 {
        let reply = wire_request(server, first, "POST", "/login", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "welcome");
        let policies = reply.policy_params("ratelimit-policy");
        assert!(!policies.is_empty(), "{:?}", reply.headers);
    }
    let reply = wire_request(server, first, "POST", "/login", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(content_type(&reply), "application/problem+json");
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["login"])
    );
    assert!(reply.retry_after().unwrap() >= 1);

    // The peer is not a trusted proxy, so a forged X-Forwarded-For changes nothing.
    let reply = wire_request(
        server,
        first,
        "POST",
        "/login",
        &[("x-forwarded-for", "198.51.100.1")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);

    // Another peer address has its own budget.
    let reply = wire_request(server, second, "POST", "/login", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);

    // /orders is not under the login limit.
    let reply = wire_request(
        server,
        first,
        "GET",
        "/orders",
        &[("x-customer-id", "acme")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "orders");

    serving.abort();
}

#[tokio::test]
async fn client_ip_without_connect_info_has_no_key() {
    // Served without `into_make_service_with_connect_info`, there is no peer address: the
    // request has no key and is rejected with the configured 4xx, never a 5xx.
    let mut app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .layer(
            RateLimitLayer::new(limiter([per_second(5)]))
                .decision_on_every_response(true)
                .key(ClientIp::new())
                .on_missing_key(MissingKey::Reject(StatusCode::FORBIDDEN)),
        );
    let reply = send(&mut app, post_request("/login", &[])).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(content_type(&reply), "application/problem+json");
}
