//! End to end: four `orders_api` processes against one real redis-server behind the fault
//! proxy, the running example's traffic over HTTP, the store cut and restored. Local share
//! (with the instance count from the Redis registry) and fail closed, side by side.
//! And `/otp/verify`, which counts only wrong codes, `--lease-threshold`, whose leases
//! hold a hot customer to exactly its limit, `/v1/completions`, settled at the tokens each
//! answer used, and `/export`, charged the bytes it sent, against a real redis-server.

use std::process::Command;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_testkit::orders_api::{Deployments, Server, Traffic, breakers_closed, spawn};
use tollgate_testkit::rates::{steady_span, unix_millis};
use tollgate_testkit::redis::RedisServer;

const INSTANCES: usize = 4;
const CUSTOMERS: [(&str, f64); 3] = [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)];
// Long enough for whole steady windows (testkit/src/rates.rs): of 1 s on the store, of
// 2 s for the local share.
const NORMAL: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(7);
/// How long the recovery is measured once every instance's breaker has closed again.
const RECOVERY: Duration = Duration::from_secs(4);
/// The longest the breakers may take to close after the store returns. The default
/// breaker's part is at most 1 s; the rest is the Redis client's reconnection after the
/// outage's refused connections (the backend's default backoff grows to 1 s), a probe, and
/// the polling of /metrics below. Measured: 1.5 to 2.2 s; the rest is margin for a busy
/// machine.
const BREAKERS_CLOSE_WITHIN: Duration = Duration::from_secs(4);
const TOLERANCE: f64 = 0.15;

pub(crate) fn start_with(redis: &str, policy: &str, extra: &[&str]) -> Server {
    let expected = INSTANCES.to_string();
    let mut args = vec![
        "--redis",
        redis,
        "--on-store-failure",
        policy,
        "--expected-instances",
        &expected,
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_through_an_outage() {
    let policies = ["local-share", "closed"];
    // One Redis and one proxy per policy: the two groups share nothing but the fault.
    // Admissions are measured by when the instances decided them (`--stamp-admissions`):
    // on 2 cores with the rest of the suite running, the client's sends and the decisions
    // drift apart by up to half a second, enough to move a steady second's admissions.
    let deployments = Deployments::start(policies.len(), INSTANCES, |group, redis| {
        start_with(redis, policies[group], &["--stamp-admissions"])
    });
    let bases = deployments.bases();
    let client = tollgate_testkit::orders_api::client();

    // Let the instances find each other in the registry (one heartbeat a second).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let start = Instant::now();
    let start_unix_ms = unix_millis();
    let total = NORMAL + OUTAGE + BREAKERS_CLOSE_WITHIN + RECOVERY;
    let traffic = Traffic::start(&client, bases.clone(), &CUSTOMERS, start, total);

    let (cut, restored) = deployments.outage(start, NORMAL, OUTAGE).await;
    // Recovery is measured once every instance's breaker has let a probe through and closed.
    let closed_after = breakers_closed(&client, &bases, BREAKERS_CLOSE_WITHIN).await;
    println!("each instance's breaker closed after {closed_after:?}");
    let back = start.elapsed();
    tokio::time::sleep(RECOVERY).await;
    let samples = traffic.stop().await;
    let end = start.elapsed();
    println!(
        "breakers closed {:?} after the store returned",
        back - restored
    );

    for sample in &samples {
        assert!(
            [200, 429, 503].contains(&sample.status),
            "answered {}",
            sample.status
        );
    }
    let rate = |group: usize, customer: usize, from: Duration, to: Duration| {
        let admitted = samples
            .iter()
            .filter(|s| s.group == group && s.customer == customer && s.status == 200)
            .map(|s| {
                let at = s
                    .admitted_at_ms
                    .expect("x-admitted-at-ms on an admitted answer");
                Duration::from_millis(at.saturating_sub(start_unix_ms))
            })
            .filter(|at| *at >= from && *at < to)
            .count();
        admitted as f64 / (to - from).as_secs_f64()
    };
    let near = |what: String, actual: f64, expected: f64| {
        let slack = (expected * TOLERANCE).max(0.5);
        assert!(
            (actual - expected).abs() <= slack,
            "{what}: {actual:.1}/s, expected {expected:.1}/s"
        );
    };
    let second = Duration::from_secs(1);
    let normal = steady_span(start_unix_ms, Duration::ZERO, cut, second);
    let recovery = steady_span(start_unix_ms, back, end, second);
    let share_outage = steady_span(start_unix_ms, cut, restored, 2 * second);
    for (group, policy) in policies.iter().enumerate() {
        for (customer, (name, sends)) in CUSTOMERS.iter().enumerate() {
            let fair = sends.min(50.0);
            near(
                format!("{policy} {name} normal"),
                rate(group, customer, normal.0, normal.1),
                fair,
            );
            let (during, expected) = match *policy {
                // 50 shared by the 4 instances the registry counted: 13, 13, 12 and 12 by place.
                "local-share" => (rate(group, customer, share_outage.0, share_outage.1), fair),
                _ => (
                    rate(group, customer, cut + Duration::from_millis(50), restored),
                    0.0,
                ),
            };
            near(format!("{policy} {name} outage"), during, expected);
            near(
                format!("{policy} {name} recovery"),
                rate(group, customer, recovery.0, recovery.1),
                fair,
            );
        }
    }

    // The fallback counter in /metrics: every instance counted its fallbacks.
    for (group, policy) in policies.iter().enumerate() {
        let label = policy.replace('-', "_");
        let response = client
            .get(format!("{}/metrics", bases[group][0]).parse().unwrap())
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        let fallbacks: f64 = text
            .lines()
            .filter(|line| {
                line.starts_with("tollgate_fallbacks_total{")
                    && line.contains("layer=\"orders\"")
                    && line.contains(&format!("policy=\"{label}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(
            fallbacks > 0.0,
            "{policy}: no fallback counted in /metrics:\n{text}"
        );
    }
}

/// `/otp/verify` on a real redis-server: right codes never count, the fifth wrong code
/// within 10 minutes is the last one let through and locks the client IP out for 10
/// minutes: then even the right code is refused, with `Retry-After` the block's time left.
#[tokio::test]
async fn otp_verify_locks_out_after_five_wrong_codes() {
    let redis = RedisServer::start();
    // A test of what counts, not of latency: a store timeout that a loaded 2-core machine
    // does not reach (with the default 20 ms, the first script load there sometimes timed
    // out, and /otp/verify failed closed).
    let server = start_with(&redis.url(), "local-share", &["--store-timeout-ms", "2000"]);
    let client: Client<_, http_body_util::Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let verify = |body: &'static str| {
        let request = hyper::Request::post(format!("{}/otp/verify", server.base))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from_static(
                body.as_bytes(),
            )))
            .expect("a request");
        let client = client.clone();
        async move {
            let response = client.request(request).await.expect("an HTTP answer");
            let status = response.status().as_u16();
            let has_policy = response.headers().contains_key("ratelimit-policy");
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let body = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes();
            (status, has_policy, retry_after, body)
        }
    };
    const RIGHT: &str = r#"{"code": "424242"}"#;
    const WRONG: &str = r#"{"code": "000000"}"#;
    for _ in 0..10 {
        assert_eq!(verify(RIGHT).await.0, 200, "a right code");
    }
    assert_eq!(verify(r#"{"code": 424242}"#).await.0, 400, "not a string");
    // Four wrong codes, then the right one: it passes, and does not count.
    for i in 0..4 {
        let (status, has_policy, ..) = verify(WRONG).await;
        assert_eq!((status, has_policy), (401, true), "wrong code {i}");
    }
    assert_eq!(
        verify(RIGHT).await.0,
        200,
        "the right code after four wrong ones"
    );
    assert_eq!(
        verify(RIGHT).await.0,
        200,
        "and again: right codes never lock out"
    );
    assert_eq!(
        verify(WRONG).await.0,
        401,
        "the fifth wrong code is let through"
    );
    assert!(
        redis
            .must(&["EXISTS", "otp:{127.0.0.1}:otp:wrong-codes:lock"])
            .contains('1'),
        "the block is in Redis"
    );
    for attempt in [RIGHT, WRONG, RIGHT] {
        let (status, has_policy, retry_after, body) = verify(attempt).await;
        assert_eq!((status, has_policy), (429, true), "locked out: {attempt}");
        let retry_after = retry_after.expect("a Retry-After");
        assert!(
            (590..=600).contains(&retry_after),
            "Retry-After {retry_after}: the block's 10 minutes, less what has passed"
        );
        let problem: serde_json::Value = serde_json::from_slice(&body).expect("problem+json");
        assert_eq!(problem["policy"], "wrong-codes", "{problem}");
    }
    // The block expires with its 10 minutes; the counters are the "otp" limiter's own.
    let ttl: i64 = redis
        .must(&["PTTL", "otp:{127.0.0.1}:otp:wrong-codes:lock"])
        .trim()
        .parse()
        .expect("a PTTL");
    assert!((590_000..=600_000).contains(&ttl), "PTTL {ttl}");
    let keys = redis.must(&["KEYS", "otp:*"]);
    assert!(
        keys.contains("otp:{127.0.0.1}:otp:wrong-codes:w600000"),
        "{keys}"
    );
}

/// `GET /orders` as `customer`: the status.
async fn get_orders<C>(client: &Client<C, Empty<Bytes>>, base: &str, customer: &str) -> u16
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let request = hyper::Request::get(format!("{base}/orders"))
        .header("x-customer-id", customer)
        .body(Empty::new())
        .expect("a request");
    let response = client.request(request).await.expect("an HTTP answer");
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

/// The sum of the `orders` layer's samples of `metric` in an instance's /metrics whose
/// labels include `label` (`event="taken"`, say; empty: any).
async fn orders_metric<C>(
    client: &Client<C, Empty<Bytes>>,
    base: &str,
    metric: &str,
    label: &str,
) -> f64
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let response = client
        .get(format!("{base}/metrics").parse().expect("a URI"))
        .await
        .expect("/metrics answers");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{metric}{{"))
                && line.contains("layer=\"orders\"")
                && line.contains(label)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `workers` connections sending `sent` requests as `customer` between them, each one
/// after the other, all within one second: the windows are aligned to Unix time (Redis's
/// clock, the same machine's), so the burst starts just after a second begins. `None`
/// when the machine stalled and the burst ran into the next second.
async fn burst_in_one_second<C>(
    client: &Client<C, Empty<Bytes>>,
    base: &str,
    customer: &str,
    sent: usize,
    workers: usize,
) -> Option<Vec<u16>>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let into_second = unix_millis() % 1_000;
    tokio::time::sleep(Duration::from_millis(1_000 - into_second)).await;
    let began = unix_millis();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (client, base, customer) = (client.clone(), base.to_owned(), customer.to_owned());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..sent / workers {
                    statuses.push(get_orders(&client, &base, &customer).await);
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.expect("a worker"));
    }
    let ended = unix_millis();
    println!(
        "{customer}: {} of {sent} admitted in {} ms on {workers} connections",
        statuses.iter().filter(|&&s| s == 200).count(),
        ended - began
    );
    (began / 1_000 == ended / 1_000).then_some(statuses)
}

/// `--lease-threshold` on a real redis-server, one instance: a hot customer sends 120
/// requests within one second of its 50-per-second limit, far over the threshold of 20 a
/// second. It is decided from leases, and exactly 50 pass; /metrics counts the leases
/// taken and the decisions they made. Over concurrent connections, exactly 50 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_customer_on_leases_gets_exactly_the_limit() {
    const SENT: usize = 120;
    const LIMIT: usize = 50;
    let redis = RedisServer::start();
    let url = redis.url();
    // A test of what is admitted, not of latency: a store timeout that a loaded 2-core
    // machine does not reach.
    let server = spawn(&[
        "--redis",
        &url,
        "--instances",
        "1",
        "--lease-threshold",
        "20",
        "--lease-period-ms",
        "100",
        "--store-timeout-ms",
        "2000",
    ]);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4)
        .build_http();
    // The script loaded and a connection open before the burst.
    assert_eq!(get_orders(&client, &server.base, "warm-up").await, 200);
    let count = |statuses: &[u16], status: u16| statuses.iter().filter(|&&s| s == status).count();

    // One request after another: exactly the limit. A burst that ran into the next second
    // is tried again, by a customer of its own, in the next.
    let mut exact = None;
    for attempt in 0..5 {
        let customer = format!("hot-{attempt}");
        if let Some(statuses) = burst_in_one_second(&client, &server.base, &customer, SENT, 1).await
        {
            exact = Some(statuses);
            break;
        }
    }
    let statuses = exact.expect("no burst fit in one second in 5 attempts");
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (LIMIT, SENT - LIMIT),
        "{statuses:?}"
    );
    let taken = orders_metric(
        &client,
        &server.base,
        "tollgate_leases_total",
        "event=\"taken\"",
    )
    .await;
    let leased = orders_metric(&client, &server.base, "tollgate_leased_decisions_total", "").await;
    assert!(taken >= 1.0, "no lease taken: {taken}");
    // Until the customer is hot its requests ask Redis; from then on the leases decide.
    assert!(
        (1.0..=SENT as f64).contains(&leased),
        "{leased} leased decisions"
    );

    // Four connections at once: exactly the limit too. (A request that Redis refused while
    // a lease being taken held the last units once left a cached refusal behind, which
    // then refused requests the lease would have admitted: 46 to 49 passed.)
    for attempt in 0..5 {
        let customer = format!("hot-concurrent-{attempt}");
        if let Some(statuses) = burst_in_one_second(&client, &server.base, &customer, SENT, 4).await
        {
            let admitted = count(&statuses, 200);
            assert_eq!(admitted, LIMIT, "{statuses:?}");
            assert_eq!(admitted + count(&statuses, 429), SENT, "{statuses:?}");
            break;
        }
    }
    let more = orders_metric(&client, &server.base, "tollgate_leased_decisions_total", "").await;
    assert!(more > leased, "no leased decision on 4 connections: {more}");
}

#[test]
fn leases_without_a_redis_store_are_refused() {
    for args in [
        &["--lease-threshold", "20"][..],
        &["--lease-threshold", "20", "--lease-period-ms", "50"],
        &["--redis", "redis://127.0.0.1:1/", "--lease-period-ms", "50"],
        &["--redis", "redis://127.0.0.1:1/", "--lease-threshold", "0"],
    ] {
        let output = Command::new(tollgate_testkit::example::binary("orders_api"))
            .args(args)
            .output()
            .expect("run orders_api");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--lease-threshold") || stderr.contains("--redis"),
            "{args:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let output = Command::new(tollgate_testkit::example::binary("orders_api"))
        .args(["--lease-threshold", "20"])
        .output()
        .expect("run orders_api");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--redis <URL>"), "{stderr}");
}

/// `--max-in-flight 1`: a fifth of one slot, rounded up, is the whole of it, so every
/// request but the critical `/login` and `/healthz` is shed, and shed before its rate
/// limit is checked: acme's orders are 503 and never counted in Redis.
#[tokio::test]
async fn with_max_in_flight_logins_and_health_checks_are_critical() {
    let redis = RedisServer::start();
    let server = start_with(
        &redis.url(),
        "local-share",
        &["--store-timeout-ms", "2000", "--max-in-flight", "1"],
    );
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let status = |method: &str, path: &str| {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", server.base))
            .header("x-customer-id", "acme")
            .body(Empty::new())
            .expect("a request");
        let client = client.clone();
        async move {
            let response = client.request(request).await.expect("an HTTP answer");
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|value| value.to_str().unwrap().to_owned());
            (response.status().as_u16(), retry_after)
        }
    };
    for _ in 0..3 {
        assert_eq!(status("GET", "/healthz").await, (200, None));
        assert_eq!(status("GET", "/orders").await, (503, Some("1".to_owned())));
    }
    assert_eq!(status("POST", "/login").await.0, 200);
    let keys = redis.must(&["KEYS", "*"]);
    assert!(keys.contains("login:"), "the login was counted: {keys}");
    assert!(!keys.contains("acme"), "no order was counted: {keys}");
}

/// What one answer of two orders_api instances said: its status, what it reported using,
/// and the `r` of its `tokens` policy.
async fn complete(
    client: &Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<Bytes>,
    >,
    base: &str,
    customer: &str,
    max_tokens: u64,
) -> (u16, Option<u64>, Option<u64>) {
    let request = hyper::Request::post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .header("x-customer-id", customer)
        .body(http_body_util::Full::new(Bytes::from(format!(
            r#"{{"max_tokens": {max_tokens}}}"#
        ))))
        .expect("a request");
    let response = client.request(request).await.expect("an HTTP answer");
    let status = response.status().as_u16();
    let used = response
        .headers()
        .get("x-tokens-used")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let remaining = response
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(';')
                .find_map(|p| p.strip_prefix("r=")?.parse().ok())
        });
    let _ = response.into_body().collect().await;
    (status, used, remaining)
}

/// `POST /v1/completions` on two orders_api processes sharing a real redis-server: 50
/// completions of acme at once, each reserved at its `max_tokens` (50 to 150) and settled at
/// the random number of tokens its answer reports. The store ends with exactly the sum of
/// what the answers reported, and a request for more than remains is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_settle_to_what_the_answers_used_over_two_instances() {
    let redis = RedisServer::start();
    let servers: Vec<Server> = (0..2)
        .map(|_| start_with(&redis.url(), "local-share", &["--store-timeout-ms", "2000"]))
        .collect();
    let client: Client<_, http_body_util::Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    // Within one minute's window: a window that rolls over halfway would weigh what was
    // used in the last one.
    while unix_millis() % 60_000 > 45_000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut tasks = Vec::new();
    for i in 0..50u64 {
        let (client, base) = (client.clone(), servers[(i % 2) as usize].base.clone());
        tasks.push(tokio::spawn(async move {
            complete(&client, &base, "acme", 50 + i * 2).await
        }));
    }
    let mut used_in_all = 0;
    for task in tasks {
        let (status, used, _) = task.await.unwrap();
        assert_eq!(status, 200);
        used_in_all += used.expect("x-tokens-used");
    }
    // A request reserving nothing tells what remains.
    let (status, _, remaining) = complete(&client, &servers[0].base, "acme", 0).await;
    assert_eq!(status, 200);
    let remaining = remaining.expect("the tokens policy's r");
    println!("{used_in_all} tokens used, {remaining} left");
    assert_eq!(remaining + used_in_all, 10_000, "used {used_in_all}");
    let (status, ..) = complete(&client, &servers[1].base, "acme", remaining + 1).await;
    assert_eq!(status, 429, "more than remains");
}

/// `GET /export` on a real redis-server: an export read whole is charged its bytes, one the
/// client drops after the first chunks is charged what was sent (at most what the server
/// wrote before it saw the client go), and with nothing left the next export is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_charged_the_bytes_they_sent() {
    let redis = RedisServer::start();
    let server = start_with(&redis.url(), "local-share", &["--store-timeout-ms", "2000"]);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    while unix_millis() % 60_000 > 45_000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let export = |bytes: u64| {
        hyper::Request::get(format!("{}/export?bytes={bytes}", server.base))
            .header("x-customer-id", "acme")
            .body(Empty::new())
            .expect("a request")
    };
    let egress = |redis: &RedisServer| -> u64 {
        redis
            .cli(&["HGET", "exports:{acme}:exports:egress:w60000:B", "c"])
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let whole = client.request(export(3 * 65_536)).await.expect("an answer");
    assert_eq!(whole.status(), 200);
    assert_eq!(
        whole.headers()["ratelimit-policy"],
        r#""egress";q=10485760;w=60;qu="content-bytes""#
    );
    let body = whole
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    assert_eq!(body.len(), 3 * 65_536);
    let deadline = Instant::now() + Duration::from_secs(5);
    while egress(&redis) != 3 * 65_536 {
        assert!(Instant::now() < deadline, "charged {}", egress(&redis));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // 1,000 chunks asked, the client gone after reading 2: charged what the server sent.
    let mut dropped = client
        .request(export(1_000 * 65_536))
        .await
        .expect("an answer")
        .into_body();
    let mut read = 0;
    while read < 2 * 65_536 {
        let frame = dropped.frame().await.expect("a frame").expect("data");
        read += frame.data_ref().map_or(0, Bytes::len);
    }
    drop(dropped);
    let deadline = Instant::now() + Duration::from_secs(5);
    // Admitted, the request reserved one unit; what it sent is settled when the server
    // sees the body dropped, and the client read at least that much of it.
    let charged = loop {
        let charged = egress(&redis) - 3 * 65_536;
        if charged >= read as u64 {
            break charged;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped export was charged {charged}, less than the {read} bytes read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("a download dropped after {read} bytes was charged {charged}");
    // What the server had written by then, kernel buffers included (a few MiB on a
    // loopback), far from the 1,000 chunks asked.
    assert!(
        (2 * 65_536..500 * 65_536).contains(&(charged as usize)),
        "charged {charged} for a download dropped after {read} bytes"
    );

    // Over the quota: the rest of the 10 MiB if any is left, and the export after it is
    // refused.
    let left = 10_485_760u64.saturating_sub(egress(&redis));
    if left > 0 {
        let last = client
            .request(export(left + 65_536))
            .await
            .expect("an answer");
        assert_eq!(last.status(), 200);
        let _ = last.into_body().collect().await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while egress(&redis) < 10_485_760 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = client.request(export(1)).await.expect("an answer");
    assert_eq!(refused.status(), 429);
}

/// One limit across two regions (`--region`, `--global-redis`): a Redis per region and a
/// global one 80 ms each way behind a proxy per region, two processes per region, acme
/// sending 40 a second to each region against its 50; the first region cut off from the
/// global Redis from 6 s to 12 s. In no second of the limit's window do the regions
/// together admit more than 50, before, through or after the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_keep_one_limit_through_a_partition() {
    use tollgate_testkit::proxy::{Fault, FaultProxy};

    let wan_rtt = Duration::from_millis(160);
    let global = RedisServer::start();
    let regional: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let wans: Vec<FaultProxy> = (0..2)
        .map(|_| {
            let proxy = FaultProxy::start(global.port());
            proxy.set(Fault::Delay(wan_rtt));
            proxy
        })
        .collect();
    let names = ["us-east", "eu-west"];
    let instances: Vec<Vec<Server>> = (0..2)
        .map(|region| {
            let (redis, wan) = (regional[region].url(), wans[region].url());
            (0..2)
                .map(|_| {
                    spawn(&[
                        "--redis",
                        &redis,
                        "--region",
                        names[region],
                        "--global-redis",
                        &wan,
                        "--wan-rtt-ms",
                        "160",
                        "--instances",
                        "2",
                        // The regional Redis is on this machine: a busy one, not a slow store.
                        "--store-timeout-ms",
                        "1000",
                        "--stamp-admissions",
                    ])
                })
                .collect()
        })
        .collect();
    let bases: Vec<Vec<String>> = instances
        .iter()
        .map(|region| region.iter().map(|s| s.base.clone()).collect())
        .collect();
    let client = tollgate_testkit::orders_api::client();
    let start = Instant::now();
    let start_unix_ms = unix_millis();
    let (cut, back, total) = (
        Duration::from_secs(6),
        Duration::from_secs(12),
        Duration::from_secs(18),
    );
    let traffic = Traffic::start(&client, bases, &[("acme", 40.0)], start, total);
    tokio::time::sleep_until((start + cut).into()).await;
    wans[0].set(Fault::Blackhole);
    tokio::time::sleep_until((start + back).into()).await;
    wans[0].set(Fault::Delay(wan_rtt));
    tokio::time::sleep_until((start + total).into()).await;
    let samples = traffic.stop().await;

    for sample in &samples {
        assert!(
            [200, 429].contains(&sample.status),
            "answered {}",
            sample.status
        );
    }
    let admitted: Vec<(usize, u64)> = samples
        .iter()
        .filter(|s| s.status == 200)
        .map(|s| {
            let at = s
                .admitted_at_ms
                .expect("x-admitted-at-ms on an admitted answer");
            (s.group, at)
        })
        .collect();
    // Every whole second of the run after the first, all regions together.
    let first = (start_unix_ms + 1_000).div_ceil(1_000) * 1_000;
    let last = (start_unix_ms + total.as_millis() as u64) / 1_000 * 1_000;
    let mut seconds = Vec::new();
    for second in (first..last).step_by(1_000) {
        let by_region: Vec<usize> = (0..2)
            .map(|region| {
                admitted
                    .iter()
                    .filter(|(group, at)| *group == region && (second..second + 1_000).contains(at))
                    .count()
            })
            .collect();
        seconds.push(by_region);
    }
    println!("admitted per second, by region: {seconds:?}");
    for (i, by_region) in seconds.iter().enumerate() {
        let together: usize = by_region.iter().sum();
        assert!(
            together <= 50,
            "second {i}: the regions together admitted {together} ({by_region:?}) of 50"
        );
    }
    // Through the partition the cut-off region keeps to its share (its part of the
    // demand, about half), and admits all the while.
    let partition = &seconds[(cut.as_secs() as usize)..(back.as_secs() as usize - 1)];
    assert!(
        partition.iter().all(|by_region| by_region[0] > 0),
        "the cut-off region admitted on its share: {partition:?}"
    );
}
