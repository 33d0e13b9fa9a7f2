//! Back on the store within about a second of its return, whatever the outage's length:
//! several limiter instances on the default circuit breaker (each with its own jitter) fail
//! closed through an outage, and none of them answers 503 much after the store is back.
//!
//! First on the injectable clock (a store that refuses, then answers again; no sleeping),
//! over a 30 s and a 10 min outage; then in real time on a real redis-server behind the
//! fault proxy, over a 10 s outage.

use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::decision::BreakerState;
use tollgate::future::StoreFuture;
use tollgate::store::{Backend, CallerKey, CheckOutcome, ManualClock, StoreError};
use tollgate::{Caller, Decision, FailurePolicy, InMemoryBackend, Limiter, Policy, Quota};
#[cfg(feature = "redis")]
use tollgate_testkit::proxy::{Fault, FaultProxy};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

const INSTANCES: usize = 6;
/// Every instance is back on the store this long after its return: the default breaker's
/// 1 s cap, plus a little.
const BACK_WITHIN: Duration = Duration::from_millis(1_200);
const CUSTOMERS: [&str; 3] = ["acme", "globex", "initech"];
/// High enough that nobody is refused: every answer is the store's or the failure policy's,
/// never a cached denial.
const QUOTA: u64 = 100_000;

/// A distinct, reproducible jitter source per instance.
fn jitter(seed: u64) -> impl Fn() -> f64 + Send + Sync + 'static {
    tollgate_testkit::random::seeded(seed)
}

// ---------------------------------------------------------------------------------------
// On the injectable clock

/// An in-process store that can be switched off: while down it refuses every call at once,
/// as a store whose connections are refused does. Remote as far as the limiter knows, so
/// the breaker applies.
#[derive(Debug)]
struct Switchable {
    inner: InMemoryBackend,
    down: AtomicBool,
}

impl Backend for Switchable {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        if self.down.load(Ordering::SeqCst) {
            return StoreFuture::ready(Err(StoreError::unavailable("the store is down")));
        }
        self.inner.check(caller, limits, cost)
    }
}

struct Recovery {
    /// Per instance: when its breaker closed for good, after the store's return.
    closed_after: Vec<Duration>,
    /// The last 503 any instance answered, after the store's return (`None`: none at all).
    last_unavailable_after: Option<Duration>,
    unavailable_during_outage: u64,
}

/// Runs `INSTANCES` fail-closed limiters sharing one switchable store through 5 s on the
/// store, `outage` without it and 5 s after, each instance deciding one request every
/// `tick` (round robin over the customers).
async fn on_manual_clock(outage: Duration, tick: Duration) -> Recovery {
    // Not while a real-time scenario runs: this one keeps a core busy.
    let _serial = SERIAL.lock().await;
    let clock = ManualClock::new(1_767_225_600_000);
    let store = Arc::new(Switchable {
        inner: InMemoryBackend::new().clock(clock.clone()),
        down: AtomicBool::new(false),
    });
    let limiters: Vec<Limiter> = (0..INSTANCES)
        .map(|i| {
            Limiter::builder()
                .name("orders")
                .backend(store.clone())
                .clock(clock.clone())
                .policy(Policy::sliding_window(
                    "per-second",
                    Quota::per_second(QUOTA),
                ))
                .on_store_failure(FailurePolicy::closed())
                .breaker_jitter(jitter(i as u64 + 1))
                .build()
        })
        .collect();
    let callers: Vec<Caller> = CUSTOMERS.iter().map(|c| Caller::new(*c)).collect();
    let start = Instant::now();
    let normal = Duration::from_secs(5);
    let back_at = normal + outage;
    let end = back_at + Duration::from_secs(5);
    let mut elapsed = Duration::ZERO;
    let mut step = 0usize;
    let mut closed_after = vec![None; INSTANCES];
    let mut last_unavailable_after = None;
    let mut unavailable_during_outage = 0;
    while elapsed < end {
        store
            .down
            .store(elapsed >= normal && elapsed < back_at, Ordering::SeqCst);
        for (i, limiter) in limiters.iter().enumerate() {
            let decision = limiter.check(&callers[(step + i) % callers.len()]).await;
            if let Decision::Unavailable { .. } = decision {
                if elapsed >= back_at {
                    last_unavailable_after = Some(elapsed - back_at);
                } else {
                    unavailable_during_outage += 1;
                }
            }
            if elapsed >= back_at {
                // The first moment from which the breaker stays closed.
                match limiter.breaker_state() {
                    BreakerState::Closed => {
                        closed_after[i].get_or_insert(elapsed - back_at);
                    }
                    _ => closed_after[i] = None,
                }
            }
        }
        step += 1;
        clock.advance(tick);
        elapsed += tick;
    }
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the manual clock should not take real time"
    );
    Recovery {
        closed_after: closed_after
            .into_iter()
            .enumerate()
            .map(|(i, c)| c.unwrap_or_else(|| panic!("instance {i}: the breaker never closed")))
            .collect(),
        last_unavailable_after,
        unavailable_during_outage,
    }
}

fn assert_back_within_a_second(recovery: &Recovery, outage: Duration, tick: Duration) {
    // The store refused every call of the outage, so every instance failed closed.
    let requests = (outage.as_millis() / tick.as_millis()) as u64 * INSTANCES as u64;
    assert_eq!(recovery.unavailable_during_outage, requests);
    for (i, closed) in recovery.closed_after.iter().enumerate() {
        assert!(
            *closed <= BACK_WITHIN,
            "instance {i}: breaker closed {closed:?} after the store returned"
        );
    }
    if let Some(last) = recovery.last_unavailable_after {
        assert!(
            last <= BACK_WITHIN,
            "a 503 {last:?} after the store returned"
        );
    }
    // Different jitter: the instances do not all come back at the same moment.
    let first = recovery.closed_after[0];
    assert!(
        recovery.closed_after.iter().any(|c| *c != first),
        "all instances closed together: {:?}",
        recovery.closed_after
    );
    println!(
        "outage {outage:?}: breakers closed after {:?}; last 503 after {:?}",
        recovery.closed_after, recovery.last_unavailable_after
    );
}

#[tokio::test]
async fn back_within_a_second_of_a_30_s_outage_on_the_manual_clock() {
    let outage = Duration::from_secs(30);
    let tick = Duration::from_millis(5);
    let recovery = on_manual_clock(outage, tick).await;
    assert_back_within_a_second(&recovery, outage, tick);
}

#[tokio::test]
async fn back_within_a_second_of_a_10_min_outage_on_the_manual_clock() {
    let outage = Duration::from_secs(600);
    let tick = Duration::from_millis(10);
    let recovery = on_manual_clock(outage, tick).await;
    assert_back_within_a_second(&recovery, outage, tick);
}

// ---------------------------------------------------------------------------------------
// On a real redis-server behind the fault proxy

#[cfg(feature = "redis")]
const REAL_INSTANCES: usize = 4;
#[cfg(feature = "redis")]
const NORMAL: Duration = Duration::from_secs(2);
#[cfg(feature = "redis")]
const OUTAGE: Duration = Duration::from_secs(10);
#[cfg(feature = "redis")]
const RECOVERY: Duration = Duration::from_secs(3);
/// What a real store adds to the breaker's 1 s: the store timeout of a probe, the client's
/// reconnection (its backoff is set to 20-100 ms below; the backend's default grows to
/// 1 s, and with it this scenario measured up to 2.4 s), and scheduling on a busy machine.
#[cfg(feature = "redis")]
const REAL_ALLOWANCE: Duration = Duration::from_millis(300);
/// Longer than the default 20 ms so that a debug build on a busy 2-core machine does not
/// time out calls to a healthy store (5 of them in a row would reopen a breaker).
#[cfg(feature = "redis")]
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// A connection that lived through a blackhole is cut when it ends, and the Redis client
/// notices only when its next command fails: each instance's first call after the store's
/// return fails and buys one more open interval (at most 1 s) before the next probe.
#[cfg(feature = "redis")]
const FIRST_CALL_LOST: Duration = Duration::from_secs(1);

/// One scenario at a time: the real-time ones measure latencies.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(feature = "redis")]
struct Sample {
    sent: Duration,
    unavailable: bool,
    from_store: bool,
}

#[cfg(feature = "redis")]
async fn on_real_redis(fault: Fault) {
    let bound = match fault {
        Fault::Blackhole => BACK_WITHIN + REAL_ALLOWANCE + FIRST_CALL_LOST,
        _ => BACK_WITHIN + REAL_ALLOWANCE,
    };
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.port()));
    let limiters: Vec<Limiter> = (0..REAL_INSTANCES)
        .map(|i| {
            let store = RedisBackend::builder(proxy.url())
                .prefix("recovery")
                .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
                .build()
                .expect("a valid URL");
            Limiter::builder()
                .name("orders")
                .backend(store)
                .policy(Policy::sliding_window(
                    "per-second",
                    Quota::per_second(QUOTA),
                ))
                .on_store_failure(FailurePolicy::closed())
                .store_timeout(STORE_TIMEOUT)
                .breaker_jitter(jitter(i as u64 + 11))
                .build()
        })
        .collect();
    let limiters = Arc::new(limiters);
    let samples = Arc::new(Mutex::new(Vec::new()));
    let restored_at: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let closed_at: Arc<Mutex<Vec<Option<Duration>>>> =
        Arc::new(Mutex::new(vec![None; REAL_INSTANCES]));
    let start = Instant::now();

    // Each instance decides one request every 5 ms; the breakers are watched as often.
    let driver = {
        let (limiters, samples, restored_at, closed_at) = (
            limiters.clone(),
            samples.clone(),
            restored_at.clone(),
            closed_at.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tasks = Vec::new();
            let mut step = 0usize;
            while start.elapsed() < NORMAL + OUTAGE + RECOVERY {
                tick.tick().await;
                let now = start.elapsed();
                let restored = *restored_at.lock().unwrap();
                for (i, limiter) in limiters.iter().enumerate() {
                    if restored.is_some() {
                        let mut closed = closed_at.lock().unwrap();
                        match limiter.breaker_state() {
                            BreakerState::Closed => {
                                closed[i].get_or_insert(now);
                            }
                            _ => closed[i] = None,
                        }
                    }
                    let limiter = limiter.clone();
                    let caller = Caller::new(CUSTOMERS[(step + i) % CUSTOMERS.len()]);
                    let samples = samples.clone();
                    tasks.push(tokio::spawn(async move {
                        let decision = limiter.check(&caller).await;
                        let from_store = decision.info().is_some_and(|info| {
                            info.source() == tollgate::decision::DecisionSource::Store
                        });
                        samples.lock().unwrap().push(Sample {
                            sent: now,
                            unavailable: matches!(decision, Decision::Unavailable { .. }),
                            from_store,
                        });
                    }));
                }
                step += 1;
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };

    tokio::time::sleep_until((start + NORMAL).into()).await;
    let switch = |fault: Fault| {
        let proxy = proxy.clone();
        tokio::task::spawn_blocking(move || proxy.set(fault))
    };
    switch(fault).await.unwrap();
    let fault_on = start.elapsed();
    tokio::time::sleep_until((start + NORMAL + OUTAGE).into()).await;
    switch(Fault::Pass).await.unwrap();
    let restored = start.elapsed();
    *restored_at.lock().unwrap() = Some(restored);
    driver.await.unwrap();

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let outage_503s = samples
        .iter()
        .filter(|s| s.sent >= fault_on + Duration::from_millis(100) && s.sent < restored)
        .filter(|s| s.unavailable)
        .count();
    let outage_requests = samples
        .iter()
        .filter(|s| s.sent >= fault_on + Duration::from_millis(100) && s.sent < restored)
        .count();
    assert!(
        outage_503s * 100 >= outage_requests * 99,
        "{fault:?}: only {outage_503s} of {outage_requests} requests failed closed in the outage"
    );
    let last_503 = samples
        .iter()
        .filter(|s| s.unavailable && s.sent >= restored)
        .map(|s| s.sent - restored)
        .max();
    let first_from_store = samples
        .iter()
        .filter(|s| s.from_store && s.sent >= restored)
        .map(|s| s.sent - restored)
        .min();
    let closed: Vec<Duration> = closed_at
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.unwrap_or_else(|| panic!("{fault:?}: instance {i}'s breaker did not close"))
                .saturating_sub(restored)
        })
        .collect();
    println!(
        "{fault:?}: breakers closed {closed:?} after the store returned; last 503 {last_503:?} \
         after; first decision from Redis {first_from_store:?} after"
    );
    for (i, closed) in closed.iter().enumerate() {
        assert!(
            *closed <= bound,
            "{fault:?}: instance {i}'s breaker closed {closed:?} after the store returned"
        );
    }
    if let Some(last) = last_503 {
        assert!(
            last <= bound,
            "{fault:?}: a 503 {last:?} after the store returned"
        );
    }
    // After that, every decision comes from Redis again.
    let late = samples
        .iter()
        .filter(|s| s.sent >= restored + bound)
        .collect::<Vec<_>>();
    assert!(!late.is_empty());
    assert!(
        late.iter().all(|s| s.from_store),
        "{fault:?}: decisions not from Redis after recovery"
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_within_a_second_of_a_10_s_refused_store_on_real_redis() {
    on_real_redis(Fault::Refuse).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_within_a_second_of_a_10_s_blackholed_store_on_real_redis() {
    on_real_redis(Fault::Blackhole).await;
}

// ---------------------------------------------------------------------------------------
// With the library's defaults: killed and restarted, or blackholed

/// How many times each default-settings scenario runs: the worst of them is what counts.
#[cfg(feature = "redis")]
const RUNS: usize = 3;
/// How long the store is away in each run.
#[cfg(feature = "redis")]
const AWAY: Duration = Duration::from_secs(3);
/// The bound of the default settings: back on the store within a second of its return,
/// plus what a loaded 2-core machine adds to a probe (scheduling, a debug build).
#[cfg(feature = "redis")]
const DEFAULTS_BACK_WITHIN: Duration = Duration::from_millis(1_250);

/// How the store goes away in a default-settings scenario.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Away {
    /// Killed (SIGKILL) and started again on the same port with no data.
    Restarted,
    /// Behind the fault proxy, accepting connections and never answering; the connections
    /// that lived through it are cut when it ends.
    Blackholed,
}

/// One run: `REAL_INSTANCES` limiters on the backend's defaults (only the prefix set),
/// failing closed, each deciding one request every 5 ms; the store goes away for `AWAY`.
/// Returns, per instance, how long after the store's return its first decision came from
/// Redis, and how long after it its last decision did not.
#[cfg(feature = "redis")]
async fn with_the_defaults(away: Away, run: usize) -> Vec<(Duration, Option<Duration>)> {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let url = match away {
        Away::Restarted => server.url(),
        Away::Blackholed => proxy.url(),
    };
    let limiters: Vec<Limiter> = (0..REAL_INSTANCES)
        .map(|i| {
            let store = RedisBackend::builder(url.as_str())
                .prefix("defaults")
                .build()
                .expect("a valid URL");
            Limiter::builder()
                .name("defaults")
                .backend(store)
                .policy(Policy::sliding_window(
                    "per-second",
                    Quota::per_second(QUOTA),
                ))
                .on_store_failure(FailurePolicy::closed())
                .store_timeout(STORE_TIMEOUT)
                .breaker_jitter(jitter((run * REAL_INSTANCES + i) as u64 + 101))
                .build()
        })
        .collect();
    let start = Instant::now();
    let samples: Arc<Mutex<Vec<(usize, Duration, bool)>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let drivers: Vec<_> = limiters
        .into_iter()
        .enumerate()
        .map(|(i, limiter)| {
            let (samples, stop) = (samples.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut step = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let sent = start.elapsed();
                    let caller = Caller::new(CUSTOMERS[(step + i) % CUSTOMERS.len()]);
                    step += 1;
                    let decision = limiter.check(&caller).await;
                    let from_store = decision.info().is_some_and(|info| {
                        info.source() == tollgate::decision::DecisionSource::Store
                    });
                    samples.lock().unwrap().push((i, sent, from_store));
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(1)).await;
    let proxy = Arc::new(proxy);
    let returned = {
        let proxy = proxy.clone();
        tokio::task::spawn_blocking(move || {
            match away {
                Away::Restarted => server.kill(),
                Away::Blackholed => proxy.set(Fault::Blackhole),
            }
            std::thread::sleep(AWAY);
            match away {
                Away::Restarted => server.restart(),
                Away::Blackholed => proxy.set(Fault::Pass),
            }
            (start.elapsed(), server)
        })
    };
    let (returned, _server) = returned.await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for driver in drivers {
        driver.await.unwrap();
    }
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    (0..REAL_INSTANCES)
        .map(|i| {
            let mine = || samples.iter().filter(move |s| s.0 == i && s.1 >= returned);
            // By the time each request was sent (they are recorded as they are answered).
            let first = mine()
                .filter(|s| s.2)
                .map(|s| s.1 - returned)
                .min()
                .unwrap_or_else(|| panic!("{away:?}: instance {i} never decided on Redis again"));
            let last_not = mine().filter(|s| !s.2).map(|s| s.1 - returned).max();
            (first, last_not)
        })
        .collect()
}

#[cfg(feature = "redis")]
async fn back_within_a_second_with_the_defaults(away: Away) {
    let _serial = SERIAL.lock().await;
    let mut worst = Duration::ZERO;
    for run in 0..RUNS {
        let back = with_the_defaults(away, run).await;
        println!(
            "{away:?} ({AWAY:?}), library defaults, run {run}: per instance, (first decision \
             from Redis, last decision not from Redis) after the store's return: {back:?}"
        );
        for (first, last_not) in back {
            worst = worst.max(first).max(last_not.unwrap_or_default());
        }
    }
    println!("{away:?}, library defaults: every instance back on Redis within {worst:?}");
    assert!(
        worst <= DEFAULTS_BACK_WITHIN,
        "{away:?}: an instance decided without Redis {worst:?} after its return"
    );
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_within_a_second_of_a_restart_with_the_defaults() {
    back_within_a_second_with_the_defaults(Away::Restarted).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_within_a_second_of_a_blackhole_with_the_defaults() {
    back_within_a_second_with_the_defaults(Away::Blackholed).await;
}
