//! RateLimit-Policy, RateLimit, Retry-After and the problem+json body, parsed back with a
//! Structured Fields parser and checked field by field.
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::response::{ProblemType, ResponseBody};
use tollgate::store::ManualClock;
use tollgate::{
    Caller, Decision, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota,
    RateLimitLayer, key::HeaderKey, reload::Mode, response::HeaderMode,
};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
use tollgate_testkit::remote::Remote;
use tower::{Service, ServiceBuilder, service_fn};

/// The start of a second (and of a minute): windows begin here.
const START_MS: u64 = 1_000_000 * 60;

fn limiter_at(clock: &ManualClock, policies: impl IntoIterator<Item = Policy>) -> Limiter {
    let backend = InMemoryBackend::new().clock(clock.clone());
    policies
        .into_iter()
        .fold(
            Limiter::builder().name("headers").backend(backend),
            |builder, policy| builder.policy(policy),
        )
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
    // Uncapped: these tests check the store's arithmetic as the fields carry it; the cap
    // has tests of its own.
    ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter)
                .decision_on_every_response(true)
                .key(Caller::new("*"))
                .headers(mode)
                .uncapped_remaining(),
        )
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
    assert_eq!(body["type"], ProblemType::QuotaExceeded.uri());
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
    assert_eq!(body["retry-after-seconds"], retry_after);
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
    // Exactly as docs/guide/headers.md shows it, parameters in order q then w.
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
    assert_eq!(body["type"], ProblemType::QuotaExceeded.uri());
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["per-second"]));
    assert_eq!(body["retry-after-seconds"], retry_after);
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

// ---- The draft, point by point: every response shape parsed back as Structured Fields ----

/// One list item: the policy name and its parameters, parsed by sfv.
type Item = (String, Vec<(String, sfv::BareItem)>);

/// A RateLimit or RateLimit-Policy field parsed strictly: a List of String items whose
/// parameters are Integers except `pk`, a Byte Sequence; nothing else is allowed.
fn items(reply: &Reply, name: &str, allowed: &[&str]) -> Vec<Item> {
    let Some(list) = reply.sf_list(name) else {
        return Vec::new();
    };
    list.iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{name}: inner list {entry:?}");
            };
            let sfv::BareItem::String(policy) = &item.bare_item else {
                panic!("{name}: policy name is not a String: {item:?}");
            };
            let params: Vec<(String, sfv::BareItem)> = item
                .params
                .iter()
                .map(|(k, v)| {
                    let k = k.as_str();
                    assert!(allowed.contains(&k), "{name}: unexpected parameter {k:?}");
                    match (k, v) {
                        ("pk", sfv::BareItem::ByteSequence(_)) => {}
                        ("pk", other) => panic!("{name}: pk is not a Byte Sequence: {other:?}"),
                        (_, sfv::BareItem::Integer(i)) => assert!(i64::from(*i) >= 0),
                        (k, other) => panic!("{name}: {k} is not an Integer: {other:?}"),
                    }
                    (k.to_owned(), v.clone())
                })
                .collect();
            (policy.as_str().to_owned(), params)
        })
        .collect()
}

fn int(item: &Item, key: &str) -> i64 {
    let mut found = item.1.iter().filter(|(k, _)| k == key);
    let value = match found.next() {
        Some((_, sfv::BareItem::Integer(i))) => i64::from(*i),
        other => panic!("{key} of {item:?}: {other:?}"),
    };
    assert!(found.next().is_none(), "{key} twice in {item:?}");
    value
}

fn pk(item: &Item) -> Option<Vec<u8>> {
    item.1.iter().find_map(|(k, v)| match v {
        sfv::BareItem::ByteSequence(bytes) if k == "pk" => Some(bytes.clone()),
        _ => None,
    })
}

/// Every member name of a problem body is lower case with words joined by hyphens, as the
/// draft's own `violated-policies`.
fn assert_member_names(body: &serde_json::Value) {
    let object = body.as_object().expect("a problem is a JSON object");
    for name in object.keys() {
        assert!(
            !name.is_empty()
                && name.split('-').all(|word| {
                    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase())
                }),
            "problem member {name:?} is not lower-case-hyphenated"
        );
    }
    assert!(object.get("retry_after_seconds").is_none());
}

fn serve<K: tollgate::key::KeyExtractor>(
    layer: RateLimitLayer<K>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<ResponseBody<Full<Bytes>>>,
    Error = Infallible,
> + Clone {
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(ok_handler))
}

/// A limiter in front of a store that is down from the start.
fn down_limiter(
    clock: &ManualClock,
    on_failure: FailurePolicy,
    policies: impl IntoIterator<Item = Policy>,
) -> Limiter {
    let remote = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    remote.set_down(true);
    policies
        .into_iter()
        .fold(
            Limiter::builder()
                .name("headers")
                .backend(remote)
                .clock(clock.clone())
                .on_store_failure(on_failure),
            |builder, policy| builder.policy(policy),
        )
        .build()
}

fn daily_bucket(limit: u64) -> Policy {
    Policy::token_bucket("daily", Quota::per_day(limit), limit)
}

#[tokio::test]
async fn r_is_capped_against_t_by_default_for_windows_longer_than_a_minute() {
    let clock = ManualClock::new(START_MS);
    let policies = || [per_second(50), daily_bucket(1_000_000)];
    let fresh = |layer: RateLimitLayer<Caller>| {
        let mut svc = serve(layer);
        async move { send(&mut svc, get("/", &[])).await }
    };

    // A daily bucket refills a token every 86.4 ms, so t=1 while 999,999 remain: uncapped,
    // a client dividing r by t would go at 999,999 per second. By default r is a minute's
    // worth of the daily average, ceil(1e6 * 60 / 86400) = 695; the per-second policy (its
    // quota fits in a minute) is reported as it is, its t=2 beside w=1.
    let reply = fresh(
        RateLimitLayer::new(limiter_at(&clock, policies()))
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let state = items(&reply, "ratelimit", &["r", "t"]);
    assert_eq!(state[0].0, "per-second");
    assert_eq!((int(&state[0], "r"), int(&state[0], "t")), (49, 2));
    assert_eq!(state[1].0, "daily");
    assert_eq!((int(&state[1], "r"), int(&state[1], "t")), (695, 1));
    // The quota itself is advertised unchanged, and the decision keeps the exact count.
    let policy = items(&reply, "ratelimit-policy", &["q", "w"]);
    assert_eq!(
        (int(&policy[1], "q"), int(&policy[1], "w")),
        (1_000_000, 86_400)
    );
    let Some(Decision::Allowed(info)) = reply.extensions.get::<Decision>() else {
        panic!("no decision");
    };
    assert_eq!(info.policy(1).expect("a policy").remaining(), 999_999);

    // A zero horizon: r / t is at most q / w exactly, ceil(1e6 / 86400) = 12.
    let reply = fresh(
        RateLimitLayer::new(limiter_at(&clock, policies()))
            .decision_on_every_response(true)
            .key(Caller::new("*"))
            .remaining_horizon(Duration::ZERO),
    )
    .await;
    let state = items(&reply, "ratelimit", &["r", "t"]);
    assert_eq!(int(&state[0], "r"), 49);
    assert_eq!(int(&state[1], "r"), 12);

    // Ten minutes: 6,945.
    let reply = fresh(
        RateLimitLayer::new(limiter_at(&clock, policies()))
            .decision_on_every_response(true)
            .key(Caller::new("*"))
            .remaining_horizon(Duration::from_secs(600)),
    )
    .await;
    assert_eq!(int(&items(&reply, "ratelimit", &["r", "t"])[1], "r"), 6_945);

    // Uncapped: what the store computed.
    let reply = fresh(
        RateLimitLayer::new(limiter_at(&clock, policies()))
            .decision_on_every_response(true)
            .key(Caller::new("*"))
            .uncapped_remaining(),
    )
    .await;
    assert_eq!(
        int(&items(&reply, "ratelimit", &["r", "t"])[1], "r"),
        999_999
    );
}

#[tokio::test]
async fn a_sliding_daily_window_keeps_r_over_t_at_the_daily_average() {
    // Two requests at 16:40: they count until the window ends (26,400 s) and then fade, so
    // r grows again after t = 69,600 s; r is capped at ceil(1e6 * 69600 / 86400).
    let clock = ManualClock::new(START_MS);
    let mut svc = serve(
        RateLimitLayer::new(limiter_at(&clock, [per_day(1_000_000)]))
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    );
    let mut last = None;
    for _ in 0..2 {
        let reply = send(&mut svc, get("/", &[])).await;
        let state = items(&reply, "ratelimit", &["r", "t"]);
        let (r, t) = (int(&state[0], "r"), int(&state[0], "t"));
        assert!(r * 86_400 <= 1_000_000 * t.max(60) + 86_400, "r={r};t={t}");
        last = Some((r, t));
    }
    assert_eq!(last, Some((805_556, 69_600)));
}

#[tokio::test]
async fn the_cap_never_hides_the_last_request_nor_raises_r() {
    // 3 a day, a token every 8 hours: ceil(3 * 28800 / 86400) = 1 while 2 remain, then
    // the last one is still advertised, then nothing.
    let clock = ManualClock::new(START_MS);
    let mut svc = serve(
        RateLimitLayer::new(limiter_at(&clock, [daily_bucket(3)]))
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    );
    let mut seen = Vec::new();
    for _ in 0..3 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        let state = items(&reply, "ratelimit", &["r", "t"]);
        seen.push((int(&state[0], "r"), int(&state[0], "t")));
    }
    assert_eq!(seen, [(1, 28_800), (1, 28_800), (0, 28_800)]);
    let reply = send(&mut svc, get("/", &[])).await;
    check_refusal(&reply, &["daily"]);
}

fn redirect_service(
    mode: Option<HeaderMode>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<ResponseBody<Full<Bytes>>>,
    Error = Infallible,
> + Clone {
    let clock = ManualClock::new(START_MS);
    let layer = RateLimitLayer::new(limiter_at(&clock, [per_second(1)]))
        .decision_on_every_response(true)
        .key(Caller::new("*"));
    let layer = match mode {
        Some(mode) => layer.headers(mode),
        None => layer,
    };
    ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_request: Request<Full<Bytes>>| async {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::FOUND;
            response
                .headers_mut()
                .insert(http::header::LOCATION, "/elsewhere".parse().unwrap());
            Ok::<_, Infallible>(response)
        }))
}

#[tokio::test]
async fn redirects_carry_no_fields_by_default() {
    assert_eq!(HeaderMode::default(), HeaderMode::ExceptRedirects);
    let mut svc = redirect_service(None);
    // The one request left r=0: a client must not wait t before following Location.
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::FOUND);
    assert!(reply.headers.get("ratelimit-policy").is_none());
    assert!(reply.headers.get("ratelimit").is_none());
    assert!(matches!(
        reply.extensions.get::<Decision>(),
        Some(Decision::Allowed(_))
    ));
    // A refusal still carries them.
    let reply = send(&mut svc, get("/", &[])).await;
    check_refusal(&reply, &["per-second"]);
    assert_eq!(
        items(&reply, "ratelimit-policy", &["q", "w"])[0].0,
        "per-second"
    );

    // Always: redirections included.
    let mut svc = redirect_service(Some(HeaderMode::Always));
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::FOUND);
    assert_eq!(policy_field(&reply), owned(&[("per-second", 1, 1)]));
    let state = state_field(&reply);
    assert_eq!((state[0].0.as_str(), state[0].1), ("per-second", 0));
    assert!(state[0].2 >= 1);
}

#[tokio::test]
async fn a_fail_closed_refusal_is_temporary_reduced_capacity_with_a_zero_quota() {
    let clock = ManualClock::new(START_MS);
    let limiter = down_limiter(
        &clock,
        FailurePolicy::closed(),
        [per_second(50), per_day(1_000_000)],
    );
    let mut svc = serve(
        RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    );
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let retry_after = reply.retry_after().expect("Retry-After on a 503");
    assert!(retry_after >= 1);

    // The reduced quota: nothing in each window, until Retry-After.
    let policy = items(&reply, "ratelimit-policy", &["q", "w"]);
    let policy: Vec<(String, i64, i64)> = policy
        .iter()
        .map(|item| (item.0.clone(), int(item, "q"), int(item, "w")))
        .collect();
    assert_eq!(
        policy,
        owned(&[("per-second", 0, 1), ("per-day", 0, 86_400)])
    );
    let state = items(&reply, "ratelimit", &["r", "t"]);
    for item in &state {
        assert_eq!(int(item, "r"), 0);
        assert_eq!(u64::try_from(int(item, "t")).unwrap(), retry_after);
    }
    assert_eq!(state.len(), 2);

    let body = reply.json();
    assert_eq!(body["type"], ProblemType::TemporaryReducedCapacity.uri());
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(body["title"], "Temporary reduced capacity");
    assert_eq!(body["status"], 503);
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["per-second", "per-day"])
    );
    assert_eq!(body["retry-after-seconds"], retry_after);
    assert_member_names(&body);

    // Never mode: the fields go, Retry-After and the problem stay.
    let limiter = down_limiter(&clock, FailurePolicy::closed(), [per_second(50)]);
    let mut svc = serve(
        RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(Caller::new("*"))
            .headers(HeaderMode::Never),
    );
    let reply = send(&mut svc, get("/", &[])).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(reply.headers.get("ratelimit-policy").is_none());
    assert!(reply.headers.get("ratelimit").is_none());
    assert!(reply.retry_after().is_some());
    assert_eq!(
        reply.json()["type"],
        ProblemType::TemporaryReducedCapacity.uri()
    );
}

#[tokio::test]
async fn a_local_share_advertises_the_share_on_allowed_and_refused_responses() {
    let clock = ManualClock::new(START_MS);
    let limiter = down_limiter(
        &clock,
        FailurePolicy::local_share(InstanceCount::fixed(4)),
        [per_second(8)],
    );
    let mut svc = serve(
        RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    );
    let mut admitted = 0;
    loop {
        let reply = send(&mut svc, get("/", &[])).await;
        let policy = items(&reply, "ratelimit-policy", &["q", "w"]);
        assert_eq!(policy.len(), 1);
        let (q, w) = (int(&policy[0], "q"), int(&policy[0], "w"));
        // The share, not the quota: four instances together stay within 8 per second.
        assert!(q * 4 <= 8 * w, "q={q};w={w}");
        let state = items(&reply, "ratelimit", &["r", "t"]);
        assert_eq!(state.len(), 1);
        assert!(int(&state[0], "r") <= q);
        if reply.status == StatusCode::OK {
            admitted += 1;
            assert!(admitted <= 8, "the share never admits the whole quota");
            continue;
        }
        check_refusal(&reply, &["per-second"]);
        assert_member_names(&reply.json());
        let Some(Decision::Limited(info)) = reply.extensions.get::<Decision>() else {
            panic!("no decision");
        };
        assert_eq!(
            info.source(),
            tollgate::decision::DecisionSource::LocalShare
        );
        break;
    }
    assert_eq!(admitted, 2);
}

#[tokio::test]
async fn shadow_mode_refuses_nothing_and_advertises_nothing() {
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new().clock(clock.clone());
    let limiter = Limiter::builder()
        .name("headers")
        .backend(backend)
        .clock(clock.clone())
        .mode(Mode::Shadow)
        .policy(per_second(1))
        .build();
    let mut svc = serve(
        RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(Caller::new("*")),
    );
    for _ in 0..3 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.sf_list("ratelimit-policy").is_none());
        assert!(reply.sf_list("ratelimit").is_none());
        assert!(reply.retry_after().is_none());
        assert!(matches!(
            reply.extensions.get::<Decision>(),
            Some(Decision::Shadowed(_))
        ));
    }
}

#[tokio::test]
async fn a_partition_key_is_a_keyed_digest_of_the_caller_never_the_key() {
    let clock = ManualClock::new(START_MS);
    let layer = |secret: &[u8]| {
        RateLimitLayer::new(limiter_at(&clock, [per_second(2), per_day(1_000_000)]))
            .decision_on_every_response(true)
            .key(HeaderKey::new("x-api-key"))
            .partition_key(secret)
    };
    let mut svc = serve(layer(b"secret one"));
    let as_caller = |key: &'static str| get("/", &[("x-api-key", key)]);

    // Every item of both fields carries one pk, 16 bytes, the same for one caller.
    let pks = |reply: &Reply| -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        for (field, allowed) in [
            ("ratelimit-policy", &["q", "w", "pk"][..]),
            ("ratelimit", &["r", "t", "pk"][..]),
        ] {
            for item in items(reply, field, allowed) {
                all.push(pk(&item).unwrap_or_else(|| panic!("no pk in {field}: {item:?}")));
            }
        }
        all
    };
    let first = send(&mut svc, as_caller("sk_live_alice")).await;
    assert_eq!(first.status, StatusCode::OK);
    let alice = pks(&first);
    assert_eq!(alice.len(), 4);
    assert!(alice.iter().all(|pk| pk.len() == 16 && *pk == alice[0]));
    let alice = alice[0].clone();
    assert!(
        !alice.windows(4).any(|w| w == b"sk_l" || w == b"alic"),
        "pk carries the key"
    );
    for header in ["ratelimit-policy", "ratelimit"] {
        let raw = first.headers[header].to_str().unwrap();
        assert!(!raw.contains("sk_live"), "{raw}");
    }

    let bob = send(&mut svc, as_caller("sk_live_bob")).await;
    assert!(pks(&bob).iter().all(|pk| *pk != alice && pk.len() == 16));

    // Alice's 429 carries her pk too.
    let _ = send(&mut svc, as_caller("sk_live_alice")).await;
    let refused = send(&mut svc, as_caller("sk_live_alice")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(pks(&refused).iter().all(|pk| *pk == alice));

    // Another instance with the same secret sends the same pk; another secret, another.
    let mut same = serve(layer(b"secret one"));
    let reply = send(&mut same, as_caller("sk_live_alice")).await;
    assert!(pks(&reply).iter().all(|pk| *pk == alice));
    let mut other = serve(layer(b"secret two"));
    let reply = send(&mut other, as_caller("sk_live_alice")).await;
    assert!(pks(&reply).iter().all(|pk| *pk != alice));

    // A fail-closed 503 names the partition as well.
    let limiter = down_limiter(&clock, FailurePolicy::closed(), [per_second(2)]);
    let mut down = serve(
        RateLimitLayer::new(limiter)
            .decision_on_every_response(true)
            .key(HeaderKey::new("x-api-key"))
            .partition_key(b"secret one"),
    );
    let reply = send(&mut down, as_caller("sk_live_alice")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let down_pks = pks(&reply);
    assert_eq!(down_pks.len(), 2);
    assert!(down_pks.iter().all(|pk| *pk == alice));
}

#[tokio::test]
async fn problem_members_are_named_as_the_draft_names_them() {
    let clock = ManualClock::new(START_MS);
    let mut svc = service(limiter_at(&clock, [per_second(1)]), HeaderMode::default());
    let _ = send(&mut svc, get("/", &[])).await;
    let reply = send(&mut svc, get("/", &[])).await;
    let retry_after = check_refusal(&reply, &["per-second"]);
    let body = reply.json();
    assert_member_names(&body);
    assert_eq!(body["retry-after-seconds"], retry_after);
    assert_eq!(body["title"], "Quota exceeded");
}
