//! The sliding log is exact: against a reference log (every admitted unit's time, a request
//! admitted when the units of the last window plus its cost are at most the quota), on a
//! manual clock in process and on Redis's own clock on a real redis-server, no window of
//! the policy's length ever holds more than the quota, and nothing the reference admits is
//! refused. On a Redis Cluster a log's key lives in its caller's slot. Also the measured
//! error of the sliding window counter next to the log, which the docs' table shows.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::{Backend, CallerKey, CheckOutcome, Clock, ManualClock, Refund};
use tollgate::{InMemoryBackend, Policy, Quota};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// The exact rule, one entry per admitted unit.
#[derive(Debug)]
struct Reference {
    limit: u64,
    window_ms: u64,
    /// Admitted units' times, in order.
    times: Vec<u64>,
}

impl Reference {
    fn new(limit: u64, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            times: Vec::new(),
        }
    }

    /// The units of the last window at `now`: a unit at `t` counts while `t > now - w`.
    fn in_window(&self, now: u64) -> Vec<u64> {
        self.times
            .iter()
            .copied()
            .filter(|&t| t + self.window_ms > now)
            .collect()
    }

    /// Whether `cost` units fit at `now`, and if so counts them.
    fn decide(&mut self, now: u64, cost: u64) -> bool {
        let admits = self.in_window(now).len() as u64 + cost <= self.limit;
        if admits {
            self.times.extend(std::iter::repeat_n(now, cost as usize));
        }
        admits
    }

    /// What remains at `now`, and the wait until `units` fit (0 when they never can, or
    /// when nothing is counted).
    fn report(&self, now: u64, units: u64) -> (u64, u64) {
        let window = self.in_window(now);
        let remaining = self.limit.saturating_sub(window.len() as u64);
        let leaving = (window.len() as u64 + units).saturating_sub(self.limit);
        let reset = if units > self.limit || window.is_empty() || leaving == 0 {
            0
        } else {
            window[leaving as usize - 1] + self.window_ms - now
        };
        (remaining, reset)
    }

    /// Takes out up to `cost` of the units counted at `counted_at` that still count.
    fn refund(&mut self, now: u64, counted_at: u64, cost: u64) {
        if counted_at + self.window_ms <= now {
            return;
        }
        for _ in 0..cost {
            match self.times.iter().rposition(|&t| t == counted_at) {
                Some(i) => {
                    self.times.remove(i);
                }
                None => break,
            }
        }
    }
}

/// The most units admitted in any window of `window_ms` (every start at an admission).
fn busiest_window(times: &[u64], window_ms: u64) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    (0..sorted.len())
        .map(|i| sorted[i..].partition_point(|&t| t < sorted[i] + window_ms))
        .max()
        .unwrap_or(0)
}

/// What a step does.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Decides a request of the step's cost.
    Decide,
    /// Gives back one of the admitted requests, chosen at random.
    Refund,
}

fn steps() -> impl Strategy<Value = Step> {
    prop_oneof![6 => Just(Step::Decide), 1 => Just(Step::Refund)]
}

fn decided(
    mut future: tollgate::future::StoreFuture<Result<CheckOutcome, tollgate::store::StoreError>>,
) -> CheckOutcome {
    future
        .try_take_ready()
        .expect("the in-process store answers at once")
        .expect("the in-process store never fails")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random arrival times and costs (0 to a little over the quota), refunds of random
    /// admitted requests, alone or beside a sliding window that never refuses: every
    /// decision, what remains and the wait are the reference's.
    #[test]
    fn in_process_a_log_decides_as_the_exact_rule(
        limit in 1u64..20,
        window_ms in 1u64..2_000,
        with_window in any::<bool>(),
        steps in prop::collection::vec(
            (0u64..1_500, 0u64..24, steps(), any::<prop::sample::Index>()),
            1..200,
        ),
    ) {
        let clock = ManualClock::new(1_800_000_000_000);
        let backend = InMemoryBackend::new().clock(clock.clone());
        let log = Policy::sliding_log("log", Quota::new(limit, Duration::from_millis(window_ms)));
        let mut policies = vec![log];
        if with_window {
            policies.push(Policy::sliding_window("generous", Quota::per_second(1_000_000)));
        }
        let policies: Arc<[Policy]> = policies.into();
        let caller = CallerKey::new("acme");
        let mut reference = Reference::new(limit, window_ms);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (i, &(advance, cost, what, which)) in steps.iter().enumerate() {
            clock.advance(Duration::from_millis(advance));
            let now = clock.now_millis();
            let cost = cost.min(limit + 2);
            match what {
                Step::Refund if !admitted.is_empty() => {
                    let (cost, counted_at) = admitted.remove(which.index(admitted.len()));
                    let mut refunded = backend.refund(&caller, &policies, Refund::new(cost, counted_at));
                    refunded.try_take_ready().expect("at once").expect("no failure");
                    reference.refund(now, counted_at, cost);
                }
                _ => {
                    let expected = reference.decide(now, cost);
                    let outcome = decided(backend.check(&caller, &policies, cost));
                    let context = format!("step {i} at {now}, cost {cost} of {limit} per {window_ms} ms");
                    prop_assert_eq!(outcome.admitted(), expected, "{}", context);
                    let units = if expected { reference.report(now, 0).0 + 1 } else { cost };
                    let (remaining, reset) = reference.report(now, units);
                    let reported = outcome.limits()[0];
                    prop_assert_eq!(reported.remaining, remaining, "remaining; {}", context);
                    let reset = if expected && remaining >= limit { 0 } else { reset };
                    prop_assert_eq!(reported.reset_ms, reset, "reset; {}", context);
                    if expected && cost > 0 {
                        admitted.push((cost, outcome.counted_at_ms()));
                    }
                }
            }
        }
        prop_assert!(
            busiest_window(&reference.times, window_ms) as u64 <= limit,
            "a window held more than {} units: {:?}", limit, reference.times
        );
    }
}

/// The sliding window counter and the sliding log on the same Poisson arrivals, at 0.9,
/// 1.0 and 1.1 times 50 per second over 60 s on a manual clock, in process: what each
/// admitted against what the exact rule admits, and the most either held in any one second.
/// Writes the table the `Algorithm::SlidingLog` docs include (docs/sliding_log_table.md)
/// and the hard caps guide page's copy when `TOLLGATE_WRITE_TABLE` is set, and otherwise
/// checks that both are what it measured.
#[test]
fn sliding_log_error_table() {
    const LIMIT: u64 = 50;
    const SECONDS: u64 = 60;
    let mut rows = String::from(
        "| offered | sliding window: admitted | worst second | sliding log: admitted | worst second |\n\
         |---|---|---|---|---|\n",
    );
    for (offered, seed) in [(0.9, 9u64), (1.0, 10), (1.1, 11)] {
        let arrivals = poisson(offered * LIMIT as f64, SECONDS * 1_000, seed);
        let mut results = Vec::new();
        for policy in [
            Policy::sliding_window("per-second", Quota::per_second(LIMIT)),
            Policy::sliding_log("per-second", Quota::per_second(LIMIT)),
        ] {
            let clock = ManualClock::new(0);
            let backend = InMemoryBackend::new().clock(clock.clone());
            let policies: Arc<[Policy]> = vec![policy].into();
            let caller = CallerKey::new("acme");
            let mut admitted = Vec::new();
            for &t in &arrivals {
                clock.set(t);
                if decided(backend.check(&caller, &policies, 1)).admitted() {
                    admitted.push(t);
                }
            }
            results.push((admitted.len(), busiest_window(&admitted, 1_000)));
        }
        let mut exact = Reference::new(LIMIT, 1_000);
        let exact_admitted = arrivals.iter().filter(|&&t| exact.decide(t, 1)).count();
        let ((window, window_worst), (log, log_worst)) = (results[0], results[1]);
        println!(
            "{offered:.1}x 50/s over {SECONDS} s: {} arrivals; sliding window {window} admitted \
             (worst second {window_worst}), sliding log {log} (worst second {log_worst}), exact {exact_admitted}",
            arrivals.len()
        );
        assert_eq!(
            log, exact_admitted,
            "the log admits what the exact rule admits"
        );
        assert!(
            log_worst as u64 <= LIMIT,
            "the log held {log_worst} in a second"
        );
        rows.push_str(&format!(
            "| {offered:.1}x ({} arrivals) | {window} ({:+.1}% of exact) | {window_worst} | {log} (exact) | {log_worst} |\n",
            arrivals.len(),
            (window as f64 - exact_admitted as f64) * 100.0 / exact_admitted as f64,
        ));
    }
    let table = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sliding_log_table.md");
    let guide = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide/hard_caps.md");
    let page = std::fs::read_to_string(guide).expect("the guide page");
    // The page's copy: from its header row to the blank line after it.
    let start = page.find("| offered |").expect("a table on the guide page");
    let end = start
        + page[start..]
            .find("\n\n")
            .expect("a blank line after the table")
        + 1;
    if std::env::var_os("TOLLGATE_WRITE_TABLE").is_some() {
        std::fs::write(table, &rows).expect("write the table");
        std::fs::write(guide, format!("{}{rows}{}", &page[..start], &page[end..]))
            .expect("write the guide page");
        return;
    }
    let shipped = std::fs::read_to_string(table).expect("the shipped table");
    assert_eq!(
        shipped, rows,
        "the docs' table is not what this run measured: rerun with TOLLGATE_WRITE_TABLE=1"
    );
    assert_eq!(
        &page[start..end],
        rows,
        "the guide's table is not what this run measured: rerun with TOLLGATE_WRITE_TABLE=1"
    );
}

/// The running example's acme (120 a second against 50 a second, spread over 4 instances)
/// on a sliding log, the store down for 5 s in the middle and the local share in force:
/// while the store decides and while the shares do, no second holds more than 50; around
/// the outage's edges, where instances move between the store and their shares one by one,
/// within the 10% the local share promises (measured: 50 at the start, 50 or 51 at the
/// end, where the store is told what the shares counted). Prints the worst second of each
/// phase.
#[tokio::test]
async fn a_local_share_of_a_log_holds_the_limit_through_an_outage() {
    use tollgate::{Caller, FailurePolicy, InstanceCount, Limiter};
    use tollgate_testkit::remote::Remote;

    let clock = ManualClock::new(1_800_000_000_000);
    let start = clock.now_millis();
    let store = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    let instances: Vec<Limiter> = (0..4)
        .map(|_| {
            Limiter::builder()
                .name("orders")
                .backend(store.clone())
                .clock(clock.clone())
                .policy(Policy::sliding_log("per-second", Quota::per_second(50)))
                .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(4)))
                .build()
        })
        .collect();
    let acme = Caller::new("acme");
    let mut admitted = Vec::new();
    // One request every 25/3 ms (120 a second), round robin over the instances, for 11 s.
    for i in 0..1_320u64 {
        let now = start + i * 25 / 3;
        clock.set(now);
        store.set_down((3_000..8_000).contains(&(now - start)));
        if instances[i as usize % 4].check(&acme).await.is_allowed() {
            admitted.push(now - start);
        }
    }
    let worst = |from: u64, to: u64| {
        let inside: Vec<u64> = admitted
            .iter()
            .copied()
            .filter(|&t| t >= from && t < to)
            .collect();
        busiest_window(&inside, 1_000)
    };
    let (before, outage, after) = (worst(0, 3_000), worst(3_500, 8_000), worst(9_000, 11_000));
    let (start_edge, end_edge) = (worst(2_000, 4_000), worst(7_000, 10_000));
    println!(
        "worst second: store {before}, shares {outage}, after the return {after}; \
         around the outage's start {start_edge}, its end {end_edge}"
    );
    assert!(
        before <= 50 && after <= 50,
        "on the store: {before}, {after}"
    );
    assert!(outage <= 48, "the shares (12 each): {outage}");
    assert!(
        start_edge <= 55 && end_edge <= 55,
        "edges: {start_edge}, {end_edge}"
    );
}

/// Poisson arrivals at `per_second` over `span_ms`, in ms, from a fixed seed.
fn poisson(per_second: f64, span_ms: u64, seed: u64) -> Vec<u64> {
    let random = tollgate_testkit::random::seeded(seed);
    let mut arrivals = Vec::new();
    let mut t = 0.0f64;
    loop {
        t += -(1.0 - random()).ln() * 1_000.0 / per_second;
        if t >= span_ms as f64 {
            return arrivals;
        }
        arrivals.push(t as u64);
    }
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::collections::BTreeSet;

    use tollgate::{Caller, Decision, Limiter, RedisBackend};
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// The same rule on Redis's own clock, which cannot be set: short windows, real
        /// pauses between requests. Each decision's time is the one Redis reports, so the
        /// reference replays exactly what Redis saw: no window of the policy's length holds
        /// more than the quota, and nothing the reference admits is refused.
        #[test]
        fn on_redis_no_window_holds_more_than_the_quota(
            limit in 1u64..8,
            window_ms in 50u64..200,
            steps in prop::collection::vec(
                (0u64..40, 0u64..10, steps(), any::<prop::sample::Index>()),
                1..40,
            ),
        ) {
            thread_local! {
                static SERVER: RedisServer = RedisServer::start();
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            SERVER.with(|server| runtime.block_on(async {
                let backend = RedisBackend::builder(server.url()).build().unwrap();
                backend.ping().await.expect("redis answers");
                let log = Policy::sliding_log("log", Quota::new(limit, Duration::from_millis(window_ms)));
                let policies: Arc<[Policy]> = vec![log].into();
                let caller = CallerKey::new(format!("case-{}", next_case()));
                let mut reference = Reference::new(limit, window_ms);
                let mut admitted: Vec<(u64, u64)> = Vec::new();
                let mut last = 0;
                for (i, &(pause, cost, what, which)) in steps.iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    let cost = cost.min(limit + 1);
                    match what {
                        Step::Refund if !admitted.is_empty() => {
                            let (cost, counted_at) = admitted.remove(which.index(admitted.len()));
                            backend
                                .refund(&caller, &policies, Refund::new(cost, counted_at))
                                .await
                                .expect("refunded");
                            // Redis does not report the refund's time: at least the last
                            // decision's. Units that left the window by then stay (as in
                            // Redis); any that left between then and the refund no longer
                            // weigh in a decision either way.
                            reference.refund(last, counted_at, cost);
                        }
                        _ => {
                            let outcome = backend.check(&caller, &policies, cost).await.expect("decided");
                            let now = outcome.counted_at_ms();
                            prop_assert!(now >= last, "Redis's clock went back: {} after {}", now, last);
                            last = now;
                            let expected = reference.decide(now, cost);
                            prop_assert_eq!(
                                outcome.admitted(), expected,
                                "step {} at {}, cost {} of {} per {} ms: {:?}",
                                i, now, cost, limit, window_ms, reference
                            );
                            if expected && cost > 0 {
                                admitted.push((cost, now));
                            }
                        }
                    }
                }
                prop_assert!(
                    busiest_window(&reference.times, window_ms) as u64 <= limit,
                    "a window held more than {} units: {:?}", limit, reference.times
                );
                Ok(())
            }))?;
        }
    }

    fn next_case() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static CASE: AtomicU64 = AtomicU64::new(0);
        CASE.fetch_add(1, Ordering::Relaxed)
    }

    /// A log's key lives in its caller's slot, beside the caller's other keys, for callers
    /// whose names carry braces and separators: the script touches both in one call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_cluster_a_log_lives_in_its_callers_slot() {
        let cluster = RedisCluster::start();
        let store = RedisBackend::cluster_builder(cluster.urls())
            .build()
            .unwrap();
        let limiter = Limiter::builder()
            .name("redis-cluster-log")
            .store_timeout(Duration::from_secs(5))
            .backend(store.clone())
            .policy(Policy::sliding_log("codes", Quota::per_minutes(3, 15)))
            .policy(Policy::sliding_window("per-day", Quota::per_day(100)))
            .build();
        let mut slots = BTreeSet::new();
        for caller in [
            "acme",
            "acme}",
            "{acme}",
            "}{",
            "a:b:c",
            "rl:{acme}:codes",
            "",
        ] {
            let key = CallerKey::new(caller);
            let log = store.key(&key, &limiter.policies()[0]);
            let window = store.key(&key, &limiter.policies()[1]);
            let slot = cluster.keyslot(&log);
            assert_eq!(
                slot,
                cluster.keyslot(&window),
                "{caller:?}: policies split across slots"
            );
            slots.insert(cluster.node_for_slot(slot));
            for n in 0..4 {
                let decision = limiter.check(&Caller::new(caller)).await;
                match decision {
                    Decision::Allowed(_) => assert!(n < 3, "{caller:?}: a 4th admitted"),
                    Decision::Limited(_) => assert_eq!(n, 3, "{caller:?}: refused early"),
                    other => panic!("{caller:?}: the store failed: {other:?}"),
                }
            }
        }
        // The log is a sorted set on the master of its slot.
        let key = store.key(&CallerKey::new("acme"), &limiter.policies()[0]);
        let master = cluster.node_for_slot(cluster.keyslot(&key));
        let key = String::from_utf8(key).expect("a printable key");
        assert_eq!(cluster.nodes[master].must(&["TYPE", &key]).trim(), "zset");
        assert_eq!(cluster.nodes[master].must(&["ZCARD", &key]).trim(), "3");
        assert!(slots.len() > 1, "every caller on one master: {slots:?}");
    }
}
