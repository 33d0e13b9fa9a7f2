//! RateLimit-Policy, RateLimit, Retry-After and the problem+json body, parsed back with a
//! Structured Fields parser and checked field by field.
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::response::{QUOTA_EXCEEDED, ResponseBody};
use tollgate::store::ManualClock;
use tollgate::{
    Decision, GlobalKey, HeaderMode, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer,
};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
use tower::{Service, ServiceBuilder, service_fn};

/// The start of a second (and of a minute): windows begin here.
const START_MS: u64 = 1_000_000 * 60;

fn limiter_at(clock: &ManualClock, policies: impl IntoIterator<Item = Policy>) -> Limiter {
    let backend = InMemoryBackend::builder().clock(clock.clone()).build();
    policies
        .into_iter()
        .fold(Limiter::builder().backend(backend), |builder, policy| {
            builder.policy(policy)
        })
        .build()
}

fn service(
    limiter: Limiter,
    mode: HeaderMode,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<ResponseBody<Full<Bytes>>>,
    Error = Infallible,
> + Clone {
    ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter).key(GlobalKey).headers(mode))
        .service(service_fn(ok_handler))
}

fn per_second(limit: u64) -> Policy {
    Policy::sliding_window("per-second", Quota::per_second(limit))
}

fn per_day(limit: u64) -> Policy {
    Policy::sliding_window("per-day", Quota::per_day(limit))
}

type Params = Vec<(String, i64)>;

/// The value of parameter `key` of one list item; every parameter must be one of `allowed`.
fn param(params: &Params, key: &str, allowed: &[&str]) -> i64 {
    for (k, _) in params {
        assert!(allowed.contains(&k.as_str()), "unexpected parameter {k:?}");
    }
    let mut found = params.iter().filter(|(k, _)| k == key);
    let (_, value) = found
        .next()
        .unwrap_or_else(|| panic!("no {key:?} in {params:?}"));
    assert!(found.next().is_none(), "{key:?} twice in {params:?}");
    *value
}

/// RateLimit-Policy as `(name, q, w)`.
fn policy_field(reply: &Reply) -> Vec<(String, i64, i64)> {
    reply
        .policy_params("ratelimit-policy")
        .into_iter()
        .map(|(name, params)| {
            let q = param(&params, "q", &["q", "w"]);
            let w = param(&params, "w", &["q", "w"]);
            (name, q, w)
        })
        .collect()
}

/// RateLimit as `(name, r, t)`.
fn state_field(reply: &Reply) -> Vec<(String, i64, i64)> {
    reply
        .policy_params("ratelimit")
        .into_iter()
        .map(|(name, params)| {
            let r = param(&params, "r", &["r", "t"]);
            let t = param(&params, "t", &["r", "t"]);
            (name, r, t)
        })
        .collect()
}

fn owned(items: &[(&str, i64, i64)]) -> Vec<(String, i64, i64)> {
    items
        .iter()
        .map(|(n, a, b)| ((*n).to_owned(), *a, *b))
        .collect()
}

/// Checks a 429 field by field: only exhausted policies in RateLimit, with r=0 and t >= 1;
/// Retry-After whole seconds, at least 1 and at least every t; the problem body.
/// Returns Retry-After.
fn check_refusal(reply: &Reply, violated: &[&str]) -> u64 {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let retry_after = reply.retry_after().expect("Retry-After on a 429");
    assert!(retry_after >= 1);

    let state = state_field(reply);
    let names: Vec<&str> = state.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names, violated,
        "RateLimit on a 429 lists the exhausted policies"
    );
    for (name, r, t) in &state {
        assert_eq!(*r, 0, "{name}: r on a 429");
        assert!(*t >= 1, "{name}: t={t}");
        assert!(
            retry_after >= u64::try_from(*t).unwrap(),
            "Retry-After {retry_after} is earlier than t={t} of {name}"
        );
    }

    let body = reply.json();
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert!(
        body["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{body}"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], violated[0]);
    assert_eq!(body["violated-policies"], serde_json::json!(violated));
    assert_eq!(body["retry_after_seconds"], retry_after);
    retry_after
}

#[tokio::test]
async fn policy_field_lists_every_policy_with_q_and_w() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(&clock, [per_second(50), per_day(1_000_000)]),
        HeaderMode::Always,
    );
    let expected = owned(&[("per-second", 50, 1), ("per-day", 1_000_000, 86_400)]);

    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(policy_field(&reply), expected);
    // Exactly as the README shows it, parameters in order q then w.
    assert_eq!(
        reply.policy_params("ratelimit-policy")[0].1,
        [("q".to_owned(), 50), ("w".to_owned(), 1)]
    );

    for _ in 0..49 {
        assert_eq!(send(&mut svc, get("/", &[])).await.status, StatusCode::OK);
    }
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // A 429 advertises every policy too, not only the exhausted one.
    assert_eq!(policy_field(&reply), expected);
}

#[tokio::test]
async fn allowed_responses_report_every_policy_counting_down() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(&clock, [per_second(50), per_day(1_000_000)]),
        HeaderMode::Always,
    );

    for n in 1..=50 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK, "request {n}");
        assert_eq!(reply.body, "ok");
        assert!(reply.retry_after().is_none());
        let state = state_field(&reply);
        let names: Vec<&str> = state.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["per-second", "per-day"]);
        let (_, r_second, t_second) = &state[0];
        let (_, r_day, t_day) = &state[1];
        assert_eq!(*r_second, 50 - n, "per-second r after {n} requests");
        assert_eq!(*r_day, 1_000_000 - n, "per-day r after {n} requests");
        assert!(*t_second >= 1 && *t_day >= 1, "{state:?}");
        // The state changes within the window.
        assert!(*t_second <= 2, "{state:?}");
    }

    let reply = send(&mut svc, get("/", &[])).await;
    let retry_after = check_refusal(&reply, &["per-second"]);
    assert!(
        retry_after <= 2,
        "Retry-After {retry_after} for a 1 s window"
    );
}

#[tokio::test]
async fn a_refusal_by_the_daily_quota_reports_only_that_policy() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(&clock, [per_second(50), per_day(3)]),
        HeaderMode::Always,
    );
    for _ in 0..3 {
        assert_eq!(send(&mut svc, get("/", &[])).await.status, StatusCode::OK);
    }
    let reply = send(&mut svc, get("/", &[])).await;
    let retry_after = check_refusal(&reply, &["per-day"]);
    assert!(
        retry_after > 3_600,
        "Retry-After {retry_after} for a spent daily quota"
    );
    assert_eq!(
        policy_field(&reply),
        owned(&[("per-second", 50, 1), ("per-day", 3, 86_400)])
    );

    // A second later per-second would admit again, but per-day still refuses, and only
    // per-day is reported.
    clock.advance(Duration::from_secs(1));
    let reply = send(&mut svc, get("/", &[])).await;
    check_refusal(&reply, &["per-day"]);
}

#[tokio::test]
async fn a_refusal_by_two_policies_lists_both_and_waits_for_the_later() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(
            &clock,
            [
                per_second(2),
                Policy::sliding_window("per-minute", Quota::per_minute(2)),
            ],
        ),
        HeaderMode::Always,
    );
    for _ in 0..2 {
        assert_eq!(send(&mut svc, get("/", &[])).await.status, StatusCode::OK);
    }
    let reply = send(&mut svc, get("/", &[])).await;
    let retry_after = check_refusal(&reply, &["per-second", "per-minute"]);
    let longest = state_field(&reply)
        .iter()
        .map(|(_, _, t)| *t)
        .max()
        .unwrap();
    assert_eq!(retry_after, u64::try_from(longest).unwrap());
    assert!(retry_after > 1);
}

#[tokio::test]
async fn on_refusal_mode_omits_the_fields_on_allowed_responses() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(&clock, [per_second(2), per_day(1_000_000)]),
        HeaderMode::OnRefusal,
    );
    for _ in 0..2 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.headers.get("ratelimit-policy").is_none());
        assert!(reply.headers.get("ratelimit").is_none());
        assert!(reply.headers.get(http::header::RETRY_AFTER).is_none());
        // The decision is still there for handlers and logs.
        assert!(matches!(
            reply.extensions.get::<Decision>(),
            Some(Decision::Allowed(_))
        ));
    }
    let reply = send(&mut svc, get("/", &[])).await;
    check_refusal(&reply, &["per-second"]);
    assert_eq!(
        policy_field(&reply),
        owned(&[("per-second", 2, 1), ("per-day", 1_000_000, 86_400)])
    );
}

#[tokio::test]
async fn never_mode_omits_the_fields_but_keeps_retry_after() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(limiter_at(&clock, [per_second(2)]), HeaderMode::Never);
    for _ in 0..2 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.headers.get("ratelimit-policy").is_none());
        assert!(reply.headers.get("ratelimit").is_none());
    }
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(reply.headers.get("ratelimit-policy").is_none());
    assert!(reply.headers.get("ratelimit").is_none());
    let retry_after = reply.retry_after().expect("Retry-After even in Never mode");
    assert!(retry_after >= 1);
    let body = reply.json();
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per-second"]));
    assert_eq!(body["retry_after_seconds"], retry_after);
}

#[tokio::test]
async fn token_buckets_advertise_the_burst_over_the_refill_time() {
    // (rate per period, burst) -> (q, w): q is the burst, w = ceil(burst / rate) in seconds.
    let cases = [
        (Quota::per_second(10), 30, 30, 3),
        (Quota::per_second(3), 10, 10, 4),
        (Quota::per_second(50), 50, 50, 1),
        (Quota::per_second(100), 10, 10, 1),
        (Quota::per_minute(1), 5, 5, 300),
        (Quota::new(2, Duration::from_millis(500)), 7, 7, 2),
    ];
    for (rate, burst, q, w) in cases {
        let clock = ManualClock::new(START_MS);
        let mut svc = service(
            limiter_at(&clock, [Policy::token_bucket("bucket", rate, burst)]),
            HeaderMode::Always,
        );
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            policy_field(&reply),
            owned(&[("bucket", q, w)]),
            "{rate:?} burst {burst}"
        );
        let state = state_field(&reply);
        assert_eq!(state[0].1, i64::try_from(burst).unwrap() - 1);
        assert!(state[0].2 >= 1);
    }
}

#[tokio::test]
async fn token_bucket_refusals_carry_the_same_fields() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(
            &clock,
            [Policy::token_bucket("bucket", Quota::per_second(2), 5)],
        ),
        HeaderMode::Always,
    );
    for n in 1..=5 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(state_field(&reply)[0].1, 5 - n);
    }
    let reply = send(&mut svc, get("/", &[])).await;
    let retry_after = check_refusal(&reply, &["bucket"]);
    assert_eq!(policy_field(&reply), owned(&[("bucket", 5, 3)]));
    // One token comes back after 500 ms: Retry-After rounds up to 1 s, and it is enough.
    assert_eq!(retry_after, 1);
    clock.advance(Duration::from_secs(retry_after));
    assert_eq!(send(&mut svc, get("/", &[])).await.status, StatusCode::OK);
}

/// For a sliding window whose previous window is full, a refusal at every position of the
/// current window tells the client a Retry-After that is at least t, and after which a
/// request is indeed admitted.
#[tokio::test]
async fn retry_after_is_never_earlier_than_t_across_the_window() {
    for (limit, fill_at_ms) in [(50, 0), (50, 700), (7, 999), (1, 250)] {
        for offset_ms in (0..1_000).step_by(37).chain([999]) {
            let clock = ManualClock::new(START_MS + fill_at_ms);
            let mut svc = service(limiter_at(&clock, [per_second(limit)]), HeaderMode::Always);
            let context = format!("limit {limit}, filled at {fill_at_ms} ms, offset {offset_ms}");

            // Fill the first window.
            let mut admitted = 0;
            loop {
                let reply = send(&mut svc, get("/", &[])).await;
                if reply.status != StatusCode::OK {
                    check_refusal(&reply, &["per-second"]);
                    break;
                }
                admitted += 1;
            }
            assert_eq!(admitted, limit, "{context}");

            // Into the next window; send until refused.
            clock.set(START_MS + 1_000 + offset_ms);
            let reply = loop {
                let reply = send(&mut svc, get("/", &[])).await;
                if reply.status == StatusCode::OK {
                    let state = state_field(&reply);
                    assert!(state[0].2 >= 1, "{context}: {state:?}");
                    continue;
                }
                break reply;
            };
            let retry_after = check_refusal(&reply, &["per-second"]);
            let t = state_field(&reply)[0].2;
            assert_eq!(
                retry_after,
                u64::try_from(t).unwrap(),
                "{context}: one exhausted policy"
            );
            assert!(retry_after <= 2, "{context}: Retry-After {retry_after}");

            // Coming back after Retry-After works.
            clock.advance(Duration::from_secs(retry_after));
            let reply = send(&mut svc, get("/", &[])).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{context}: refused again {retry_after} s later"
            );
        }
    }
}

#[tokio::test]
async fn the_fields_are_valid_structured_fields_lists() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(
        limiter_at(&clock, [per_second(1), per_day(1_000_000)]),
        HeaderMode::Always,
    );
    let replies = [
        send(&mut svc, get("/", &[])).await,
        send(&mut svc, get("/", &[])).await,
    ];
    for reply in &replies {
        for name in ["ratelimit-policy", "ratelimit"] {
            let list = reply.sf_list(name).expect(name);
            for entry in &list {
                let sfv::ListEntry::Item(item) = entry else {
                    panic!("{name}: inner list");
                };
                assert!(
                    matches!(item.bare_item, sfv::BareItem::String(_)),
                    "{name}: the policy name is a String item"
                );
            }
        }
    }
}

/// The same over a 10-second window (limit 10), where t spans many seconds: at every probed
/// position Retry-After equals t, a request Retry-After seconds later is admitted, and one
/// a second earlier than that is still refused (t is not padded beyond rounding up).
#[tokio::test]
async fn retry_after_matches_the_earliest_admission_on_a_ten_second_window() {
    let window = Quota::new(10, Duration::from_secs(10));
    for fill_at_ms in [0, 3_000, 9_500] {
        for offset_ms in (0..10_000).step_by(370).chain([9_999]) {
            let context = format!("filled at {fill_at_ms} ms, refused at offset {offset_ms} ms");
            let clock = ManualClock::new(START_MS + fill_at_ms);
            let mut svc = service(
                limiter_at(&clock, [Policy::sliding_window("ten", window)]),
                HeaderMode::Always,
            );
            for _ in 0..10 {
                assert_eq!(send(&mut svc, get("/", &[])).await.status, StatusCode::OK);
            }
            clock.set(START_MS + 10_000 + offset_ms);
            let reply = loop {
                let reply = send(&mut svc, get("/", &[])).await;
                if reply.status != StatusCode::OK {
                    break reply;
                }
            };
            let retry_after = check_refusal(&reply, &["ten"]);
            assert_eq!(
                retry_after,
                u64::try_from(state_field(&reply)[0].2).unwrap(),
                "{context}"
            );
            if retry_after > 1 {
                clock.advance(Duration::from_secs(retry_after - 1));
                let early = send(&mut svc, get("/", &[])).await;
                assert_eq!(
                    early.status,
                    StatusCode::TOO_MANY_REQUESTS,
                    "{context}: admitted a second before Retry-After {retry_after}"
                );
            }
            clock.advance(Duration::from_secs(1));
            let reply = send(&mut svc, get("/", &[])).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{context}: refused after waiting Retry-After {retry_after} s"
            );
        }
    }
}
