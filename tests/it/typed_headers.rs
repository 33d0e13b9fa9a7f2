//! The layer's fields read back as `tollgate::headers` values, as an HTTP client or axum's
//! `TypedHeader` reads them: what an allowed response and a refusal say, partition key
//! included.

use std::time::Duration;

use headers::HeaderMapExt;
use tollgate::headers::{RateLimitHeader, RateLimitPolicyHeader};
use tollgate::store::ManualClock;
use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer};
use tollgate_testkit::http::{get, ok_handler, send};
use tower::{ServiceBuilder, service_fn};

#[tokio::test]
async fn an_allowed_response_and_a_refusal_decode_to_what_the_limiter_decided() {
    // The start of a minute: windows begin here.
    let clock = ManualClock::new(60_000_000);
    let backend = InMemoryBackend::new().clock(clock.clone());
    let limiter = Limiter::builder()
        .name("typed_headers")
        .backend(backend)
        .policy(Policy::sliding_window("per-second", Quota::per_second(2)))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(100)))
        .build();
    let mut service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter)
                .key(Caller::new("*"))
                .partition_key("a secret of at least sixteen bytes"),
        )
        .service(service_fn(ok_handler));

    let allowed = send(&mut service, get("/", &[])).await;
    assert_eq!(allowed.status, 200);
    let policy: RateLimitPolicyHeader =
        allowed.headers.typed_get().expect("RateLimitHeader-Policy");
    let per_second = policy.get("per-second").unwrap();
    assert_eq!((per_second.quota(), per_second.window_secs()), (2, Some(1)));
    assert_eq!(policy.get("per-minute").unwrap().quota(), 100);
    let pk = per_second.partition_key().expect("pk").to_vec();
    assert_eq!(pk.len(), 16);
    let state: RateLimitHeader = allowed.headers.typed_get().expect("RateLimitHeader");
    assert_eq!(state.get("per-second").unwrap().remaining(), 1);
    assert_eq!(
        state.get("per-second").unwrap().partition_key(),
        Some(&pk[..])
    );
    assert_eq!(state.exhausted_for(), None);

    send(&mut service, get("/", &[])).await;
    let refused = send(&mut service, get("/", &[])).await;
    assert_eq!(refused.status, 429);
    let state: RateLimitHeader = refused.headers.typed_get().expect("RateLimitHeader");
    let per_second = state.get("per-second").unwrap();
    assert_eq!(per_second.remaining(), 0);
    // The sliding window frees a unit once the two requests of this second weigh less than
    // two: half way through the next second, 1.5 s from now, advertised in whole seconds.
    assert_eq!(per_second.reset_secs(), Some(2));
    assert_eq!(state.exhausted_for(), Some(Duration::from_secs(2)));
    // Each refusing policy has nothing left, so the field says Retry-After's wait.
    assert_eq!(
        refused.retry_after().map(Duration::from_secs),
        state.exhausted_for()
    );
}

#[tokio::test]
async fn a_weighted_refusal_with_units_left_says_its_wait_only_in_retry_after() {
    let clock = ManualClock::new(60_000_000);
    let limiter = Limiter::builder()
        .name("typed_headers_cost")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::sliding_window("items", Quota::per_second(5)))
        .build();
    let mut service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter)
                .key(Caller::new("*"))
                .cost(|request| {
                    request
                        .headers
                        .get("x-items")
                        .and_then(|items| items.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                }),
        )
        .service(service_fn(ok_handler));

    let batch = || get("/", &[("x-items", "3")]);
    assert_eq!(send(&mut service, batch()).await.status, 200);
    let refused = send(&mut service, batch()).await;
    assert_eq!(refused.status, 429);
    let state: RateLimitHeader = refused.headers.typed_get().expect("RateLimit");
    // Two units are left, fewer than the batch costs: the policy is not at r=0.
    assert_eq!(state.get("items").unwrap().remaining(), 2);
    assert_eq!(state.exhausted_for(), None);
    assert!(refused.retry_after().is_some_and(|secs| secs >= 1));
}
