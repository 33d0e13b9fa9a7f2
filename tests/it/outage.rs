//! The outage matrix: the running example (4 instances, 50 requests per second per
//! customer; acme sends 120/s, globex 20/s, initech 5/s) compressed in time, against a real
//! redis-server behind a fault proxy. Each fault in {refused, blackholed, delayed past the
//! timeout, SIGSTOP, kill and restart} hits four groups of four instances at once, one group
//! per failure policy in {open, closed, local share, static}. The limiters run the default
//! circuit breaker, so the recovery measured here is what a user gets: the normal rates
//! again from at most 1.5 s after the store's return.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::{Request, StatusCode};
use tollgate::decision::DecisionSource;
use tollgate::{
    BreakerConfig, Decision, FailurePolicy, InstanceCount, Limiter, Policy, Quota, RateLimitLayer,
    RedisBackend, key::HeaderKey,
};
use tollgate_testkit::counting::Counting;
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::rates::{steady_span, unix_millis};
use tollgate_testkit::redis::RedisServer;
use tower::ServiceExt;

const INSTANCES: usize = 4;
const LIMIT: u64 = 50;
const CUSTOMERS: [(&str, f64); 3] = [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)];
// Long enough for whole steady windows (testkit/src/rates.rs): of 1 s on the store, of
// 2 s for the local share.
const NORMAL: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(7);
const RECOVERY: Duration = Duration::from_secs(6);
/// The recovery is measured from this long after the store's return: the default breaker
/// keeps an instance off the store at most 1 s after it (plus a reconnection).
const SETTLE: Duration = Duration::from_millis(1_500);
/// The latest the recovery measurement may start after the store's return.
const RECOVERED_WITHIN: Duration = Duration::from_millis(1_500);
const STORE_TIMEOUT: Duration = Duration::from_millis(20);
const TOLERANCE: f64 = 0.15;

/// One fault matrix row at a time: the rows measure rates in real time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Refused,
    Blackholed,
    Delayed,
    Stopped,
    Restarted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PolicyKind {
    Open,
    Closed,
    LocalShare,
    Static,
}

const POLICIES: [PolicyKind; 4] = [
    PolicyKind::Open,
    PolicyKind::Closed,
    PolicyKind::LocalShare,
    PolicyKind::Static,
];

impl PolicyKind {
    /// The policy of the instance at `place`, as a deployment that numbers its instances
    /// configures it.
    fn failure_policy(self, place: u64) -> FailurePolicy {
        match self {
            PolicyKind::Open => FailurePolicy::open(),
            PolicyKind::Closed => FailurePolicy::closed(),
            PolicyKind::LocalShare => {
                FailurePolicy::local_share(InstanceCount::fixed(INSTANCES as u64).at_place(place))
            }
            PolicyKind::Static => FailurePolicy::fail_static(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            PolicyKind::Open => "open",
            PolicyKind::Closed => "closed",
            PolicyKind::LocalShare => "local-share",
            PolicyKind::Static => "static",
        }
    }
}

struct Sample {
    policy: PolicyKind,
    customer: usize,
    sent: Duration,
    status: StatusCode,
    source: Option<DecisionSource>,
}

struct Group {
    policy: PolicyKind,
    routers: Vec<Router>,
    store_calls: Vec<Arc<AtomicU64>>,
}

fn group(policy: PolicyKind, url: &str) -> Group {
    let mut routers = Vec::new();
    let mut store_calls = Vec::new();
    for place in 0..INSTANCES as u64 {
        let store = RedisBackend::builder(url)
            .prefix(policy.name())
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
            .build()
            .expect("valid URL");
        let store = Counting::new(store);
        store_calls.push(store.counter());
        let limiter = Limiter::builder()
            .name(policy.name())
            .backend(store)
            .policy(Policy::sliding_window(
                "per-second",
                Quota::per_second(LIMIT),
            ))
            .on_store_failure(policy.failure_policy(place))
            .store_timeout(STORE_TIMEOUT)
            .breaker(BreakerConfig::default())
            .build();
        routers.push(
            Router::new()
                .route("/orders", get(|| async { "[]" }))
                .layer(
                    RateLimitLayer::new(limiter)
                        .decision_on_every_response(true)
                        .key(HeaderKey::new("x-customer-id")),
                ),
        );
    }
    Group {
        policy,
        routers,
        store_calls,
    }
}

async fn apply(
    fault: FaultKind,
    proxy: Arc<FaultProxy>,
    server: Arc<Mutex<RedisServer>>,
    on: bool,
) {
    tokio::task::spawn_blocking(move || match (fault, on) {
        (FaultKind::Refused, true) => proxy.set(Fault::Refuse),
        (FaultKind::Blackholed, true) => proxy.set(Fault::Blackhole),
        (FaultKind::Delayed, true) => proxy.set(Fault::Delay(STORE_TIMEOUT * 2)),
        (FaultKind::Refused | FaultKind::Blackholed | FaultKind::Delayed, false) => {
            proxy.set(Fault::Pass)
        }
        (FaultKind::Stopped, true) => server.lock().unwrap().pause(),
        (FaultKind::Stopped, false) => server.lock().unwrap().resume(),
        (FaultKind::Restarted, true) => server.lock().unwrap().kill(),
        (FaultKind::Restarted, false) => server.lock().unwrap().restart(),
    })
    .await
    .expect("fault switch");
}

struct Run {
    samples: Vec<Sample>,
    start_unix_ms: u64,
    fault_on: Duration,
    fault_off: Duration,
    end: Duration,
    calls_during_outage: HashMap<PolicyKind, u64>,
}

async fn run(fault: FaultKind) -> Run {
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let server = Arc::new(Mutex::new(server));
    let groups: Arc<Vec<Group>> =
        Arc::new(POLICIES.iter().map(|p| group(*p, &proxy.url())).collect());
    let samples = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let start_unix_ms = unix_millis();

    let driver = {
        let groups = groups.clone();
        let samples = samples.clone();
        tokio::spawn(async move {
            let total = NORMAL + OUTAGE + RECOVERY;
            let mut sent = [[0u64; 3]; 4];
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut tasks = Vec::new();
            while start.elapsed() < total {
                tick.tick().await;
                let elapsed = start.elapsed().min(total);
                for (g, group) in groups.iter().enumerate() {
                    for (c, (customer, rate)) in CUSTOMERS.iter().enumerate() {
                        let owed = (elapsed.as_secs_f64() * rate) as u64;
                        while sent[g][c] < owed {
                            // Each customer's requests go round the instances.
                            let router = group.routers[(sent[g][c] as usize) % INSTANCES].clone();
                            sent[g][c] += 1;
                            let samples = samples.clone();
                            let policy = group.policy;
                            let sent_at = start.elapsed();
                            tasks.push(tokio::spawn(async move {
                                let request = Request::get("/orders")
                                    .header("x-customer-id", *customer)
                                    .body(axum::body::Body::empty())
                                    .unwrap();
                                let response = router.oneshot(request).await.unwrap();
                                let source = response
                                    .extensions()
                                    .get::<Decision>()
                                    .and_then(Decision::info)
                                    .map(|info| info.source());
                                samples.lock().unwrap().push(Sample {
                                    policy,
                                    customer: c,
                                    sent: sent_at,
                                    status: response.status(),
                                    source,
                                });
                            }));
                        }
                    }
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };

    tokio::time::sleep_until((start + NORMAL).into()).await;
    let calls_before: Vec<u64> = groups
        .iter()
        .map(|g| g.store_calls.iter().map(|c| c.load(Ordering::SeqCst)).sum())
        .collect();
    apply(fault, proxy.clone(), server.clone(), true).await;
    let fault_on = start.elapsed();
    tokio::time::sleep_until((start + NORMAL + OUTAGE).into()).await;
    let fault_off = start.elapsed();
    let calls_after: Vec<u64> = groups
        .iter()
        .map(|g| g.store_calls.iter().map(|c| c.load(Ordering::SeqCst)).sum())
        .collect();
    apply(fault, proxy.clone(), server.clone(), false).await;
    driver.await.unwrap();

    let calls_during_outage = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (g.policy, calls_after[i] - calls_before[i]))
        .collect();
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    Run {
        samples,
        start_unix_ms,
        fault_on,
        fault_off,
        end: start.elapsed(),
        calls_during_outage,
    }
}

/// The recovery: from `SETTLE` after the store's return to the end of the last whole
/// window (aligned to the Unix epoch, as tollgate's are) before the run ends. It starts
/// mid-window: under steady overload a sliding window admits evenly through the window,
/// and not waiting for the next window boundary keeps the start within `SETTLE`.
fn recovery_span(run: &Run, window: Duration) -> (Duration, Duration) {
    let w = window.as_millis() as u64;
    let from = run.fault_off + SETTLE;
    let to_unix = run.start_unix_ms + run.end.as_millis() as u64;
    let last = Duration::from_millis(to_unix / w * w - run.start_unix_ms);
    assert!(last >= from + 3 * window, "lengthen the recovery phase");
    (from, last)
}

fn rate(run: &Run, policy: PolicyKind, customer: usize, from: Duration, to: Duration) -> f64 {
    let admitted = run
        .samples
        .iter()
        .filter(|s| s.policy == policy && s.customer == customer && s.sent >= from && s.sent < to)
        .filter(|s| s.status == StatusCode::OK)
        .count();
    admitted as f64 / (to - from).as_secs_f64()
}

fn assert_near(what: &str, actual: f64, expected: f64) {
    let slack = (expected * TOLERANCE).max(0.5);
    assert!(
        (actual - expected).abs() <= slack,
        "{what}: {actual:.1}/s admitted, expected {expected:.1}/s within {:.0}%",
        TOLERANCE * 100.0
    );
}

async fn outage_matrix_row(fault: FaultKind) {
    let _serial = SERIAL.lock().await;
    let run = run(fault).await;

    for sample in &run.samples {
        assert!(
            [
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(&sample.status),
            "{fault:?}/{:?}: answered {}",
            sample.policy,
            sample.status
        );
    }

    let second = Duration::from_secs(1);
    let normal = steady_span(run.start_unix_ms, Duration::ZERO, run.fault_on, second);
    // From SETTLE after the store's return to the last whole window: that leaves out the
    // breakers' last open intervals (at most 1 s) and a reconnection, no more.
    let recovery = recovery_span(&run, second);
    assert!(
        recovery.0 - run.fault_off <= RECOVERED_WITHIN,
        "the recovery measurement starts {:?} after the store's return",
        recovery.0 - run.fault_off
    );
    // Without counters to warm up (open, closed, static), the whole outage counts; the
    // local share counts over its own (stretched) windows.
    let outage = (run.fault_on + Duration::from_millis(50), run.fault_off);
    let share_window = Duration::from_millis(
        tollgate::store::Algorithm::sliding_window(LIMIT, second)
            .divided_by(INSTANCES as u64)
            .window_ms(),
    );
    let share_outage = steady_span(run.start_unix_ms, run.fault_on, run.fault_off, share_window);
    let limit = LIMIT as f64;
    let outage_for = |policy| match policy {
        PolicyKind::LocalShare => share_outage,
        _ => outage,
    };

    // The measured table (run with --nocapture): admitted per second during the outage.
    for policy in POLICIES {
        let rates: Vec<String> = (0..CUSTOMERS.len())
            .map(|c| {
                let (from, to) = outage_for(policy);
                format!("{:.1}", rate(&run, policy, c, from, to))
            })
            .collect();
        println!("| {fault:?} | {} | {} |", policy.name(), rates.join(" | "));
    }

    // And the recovery, measured from at most 1.5 s after the store's return.
    for policy in POLICIES {
        let rates: Vec<String> = (0..CUSTOMERS.len())
            .map(|c| format!("{:.1}", rate(&run, policy, c, recovery.0, recovery.1)))
            .collect();
        println!(
            "| {fault:?} | {} | recovery from +{} ms | {} |",
            policy.name(),
            (recovery.0 - run.fault_off).as_millis(),
            rates.join(" | ")
        );
    }

    for policy in POLICIES {
        for (c, (customer, sends)) in CUSTOMERS.iter().enumerate() {
            let fair = sends.min(limit);
            let what = |phase: &str| format!("{fault:?}, {}, {customer}, {phase}", policy.name());
            assert_near(
                &what("normal"),
                rate(&run, policy, c, normal.0, normal.1),
                fair,
            );
            assert_near(
                &what("recovery"),
                rate(&run, policy, c, recovery.0, recovery.1),
                fair,
            );
            let (from, to) = outage_for(policy);
            let during = rate(&run, policy, c, from, to);
            match policy {
                PolicyKind::Open => assert_near(&what("outage"), during, *sends),
                PolicyKind::Closed => assert_near(&what("outage"), during, 0.0),
                // The instances enforce 13, 13, 12 and 12 a second, by place.
                PolicyKind::LocalShare => assert_near(&what("outage"), during, fair),
                // A per-second limit's cached refusals expire within the second, so once
                // they have, static passes everything as open does. (Static earns its keep
                // on long quotas: tests/it/failure_policies.rs.)
                PolicyKind::Static => assert_near(&what("outage"), during, *sends),
            }
        }

        // Once the breaker is open nobody waits on the store: the calls that reached it
        // during the outage are the ones that opened the breakers, the probes (one per
        // open interval, none shorter than half the base interval), and what was in
        // flight, far fewer than the requests.
        let breaker = BreakerConfig::default();
        let shortest_open = breaker.base_open_duration() / 2;
        let requests = run
            .samples
            .iter()
            .filter(|s| s.policy == policy && s.sent >= run.fault_on && s.sent < run.fault_off)
            .count() as u64;
        let probes = INSTANCES as u64 * (OUTAGE.as_millis() / shortest_open.as_millis() + 1) as u64;
        let in_flight = 10;
        let bound = INSTANCES as u64 * u64::from(breaker.threshold()) + probes + in_flight;
        let calls = run.calls_during_outage[&policy];
        assert!(
            calls <= bound,
            "{fault:?}/{}: {calls} store calls during the outage, bound {bound} ({requests} requests)",
            policy.name()
        );
        assert!(
            requests > 3 * bound,
            "{fault:?}/{}: the bound says nothing with {requests} requests",
            policy.name()
        );

        // After the fault clears, decisions return to Redis within one probe interval
        // (plus one reconnection).
        let back = run
            .samples
            .iter()
            .filter(|s| {
                s.policy == policy
                    && s.sent >= run.fault_off
                    && s.source == Some(DecisionSource::Store)
            })
            .map(|s| s.sent)
            .min()
            .unwrap_or_else(|| {
                panic!(
                    "{fault:?}/{}: no decision came from Redis after the fault cleared",
                    policy.name()
                )
            });
        assert!(
            back - run.fault_off <= breaker.max_open_duration() + Duration::from_millis(500),
            "{fault:?}/{}: back on Redis only after {:?}",
            policy.name(),
            back - run.fault_off
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_refused() {
    outage_matrix_row(FaultKind::Refused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_blackholed() {
    outage_matrix_row(FaultKind::Blackholed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_slower_than_the_timeout() {
    outage_matrix_row(FaultKind::Delayed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_frozen_by_sigstop() {
    outage_matrix_row(FaultKind::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_killed_and_restarted_empty() {
    outage_matrix_row(FaultKind::Restarted).await;
}
