//! `response_body::<InnerBody>()`: the layer answers in the inner service's own body type
//! (axum's, tonic's), admitted responses passing through as they are, and its own bodies
//! (refusals, key rejections, a body metered as it is sent) boxed into that type, saying
//! what they say in the default shape.

use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::response::InnerBody;
use tollgate::store::ManualClock;
use tollgate::{
    Caller, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer,
    key::{HeaderKey, MissingKey},
};
use tollgate_testkit::http::{get as get_request, send};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

fn limiter(policy: Policy) -> Limiter {
    Limiter::builder()
        .name("inner-body")
        .backend(InMemoryBackend::new().clock(ManualClock::new(1_000_000)))
        .policy(policy)
        .build()
}

/// Per `x-customer-id`, no header is 401: in the default shape, until the test sets one.
fn per_customer(limiter: Limiter) -> RateLimitLayer<HeaderKey> {
    RateLimitLayer::new(limiter)
        .key(HeaderKey::new("x-customer-id"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
}

fn acme() -> Request<Full<Bytes>> {
    get_request("/orders", &[("x-customer-id", "acme")])
}

fn anonymous() -> Request<Full<Bytes>> {
    get_request("/orders", &[])
}

#[tokio::test]
async fn an_axum_service_keeps_axums_body_through_admissions_refusals_and_rejections() {
    let orders = service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Body::from("[]")))
    });
    let policy = || Policy::sliding_window("per-second", Quota::per_second(2));
    let mut inner_body = ServiceBuilder::new()
        .layer(per_customer(limiter(policy())).response_body::<InnerBody>())
        .service(orders);
    let mut wrapped = ServiceBuilder::new()
        .layer(per_customer(limiter(policy())))
        .service(orders);

    // The response type is the inner service's: nothing for a router to box again.
    let admitted: Response<Body> = inner_body
        .ready()
        .await
        .unwrap()
        .call(acme())
        .await
        .unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let body = admitted.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "[]");
    send(&mut wrapped, acme()).await;

    // Then each answer says what the default shape's says: an admission, a refusal and a
    // rejected key.
    let mut statuses = Vec::new();
    for request in [acme, acme, anonymous] {
        let answer = send(&mut inner_body, request()).await;
        let expected = send(&mut wrapped, request()).await;
        assert_eq!(answer.status, expected.status);
        assert_eq!(answer.headers, expected.headers);
        assert_eq!(answer.body, expected.body);
        statuses.push(answer.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::UNAUTHORIZED
        ]
    );
}

#[tokio::test]
async fn in_an_axum_router_the_limit_and_its_fields_hold() {
    let limiter = limiter(Policy::sliding_window("per-second", Quota::per_second(1)));
    let mut app = Router::new()
        .route("/orders", get(|| async { "[]" }))
        .route_layer(per_customer(limiter).response_body::<InnerBody>());
    let first = send(&mut app, acme()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body, "[]");
    assert_eq!(first.headers["ratelimit"], r#""per-second";r=0;t=2"#);
    let second = send(&mut app, acme()).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.json()["status"], 429);
}

/// A body metered as it is sent (`count_response_bytes`) is boxed into axum's body type,
/// and is charged its bytes as in the default shape.
#[tokio::test]
async fn a_metered_body_in_axums_type_is_charged_what_it_sent() {
    let limiter =
        limiter(Policy::sliding_window("egress", Quota::per_minute(1_000)).content_bytes());
    let mut export = ServiceBuilder::new()
        .layer(
            per_customer(limiter.clone())
                .count_response_bytes()
                .response_body::<InnerBody>(),
        )
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Body::from(vec![b'x'; 300])))
        }));
    let reply = send(&mut export, acme()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body.len(), 300);
    let left = limiter.check_cost(&Caller::new("acme"), 0).await;
    assert_eq!(left.info().unwrap().min_remaining(), Some(700));
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn a_grpc_refusal_in_tonics_body_is_a_trailers_only_status() {
    let limiter = limiter(Policy::sliding_window("per-second", Quota::per_second(1)));
    let mut service = ServiceBuilder::new()
        .layer(per_customer(limiter).response_body::<InnerBody>())
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(tonic::body::Body::empty()))
        }));
    let call = || {
        Request::post("/orders.Orders/List")
            .header("content-type", "application/grpc")
            .header("x-customer-id", "acme")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let admitted: Response<tonic::body::Body> =
        service.ready().await.unwrap().call(call()).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert!(admitted.headers().get("grpc-status").is_none());
    let refused = send(&mut service, call()).await;
    assert_eq!(refused.status, StatusCode::OK);
    assert_eq!(refused.headers["grpc-status"], "8");
    assert!(refused.body.is_empty());
}
