//! The Redis backend on a real Redis Cluster of 3 masters and 3 replicas made with
//! `redis-cli --cluster create`: decisions on every master, hash tags, exactness under
//! concurrency, then a live reshard, a manual failover and a lost master while several
//! limiters keep deciding. The last three print what they measured (`--nocapture`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate::decision::{BreakerState, DecisionSource};
use tollgate::store::CallerKey;
use tollgate::{
    BreakerConfig, Caller, Decision, FailurePolicy, Limiter, Policy, Quota, RedisBackend,
};
use tollgate_testkit::recorder::{Snapshot, counter, with_recorder};
use tollgate_testkit::redis::RedisCluster;

// These tests are about decisions, not latency: every request is decided by Redis.
use crate::redis_backend::SLOW_TEST_MACHINE;

async fn cluster_limiter(cluster: &RedisCluster) -> Limiter {
    Limiter::builder()
        .name("redis-cluster")
        .store_timeout(SLOW_TEST_MACHINE)
        .backend(
            crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls())).await,
        )
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(5)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(3)))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_on_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::cluster_builder(cluster.urls())
        .build()
        .unwrap();
    let limiter = cluster_limiter(&cluster).await;

    // Two callers on each of the three masters.
    let mut by_node: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        let caller = format!("customer-{i}");
        let node = cluster.node_for_slot(
            cluster.keyslot(&store.key(&CallerKey::new(caller.as_str()), &limiter.policies()[0])),
        );
        let callers = by_node.entry(node).or_default();
        if callers.len() < 2 {
            callers.push(caller);
        }
        if by_node.len() == 3 && by_node.values().all(|c| c.len() == 2) {
            break;
        }
    }

    for (node, callers) in &by_node {
        for caller in callers {
            let who = Caller::new(caller.as_str());
            for _ in 0..3 {
                assert!(limiter.check(&who).await.is_allowed());
            }
            for _ in 0..3 {
                let Decision::Limited(info) = limiter.check(&who).await else {
                    panic!("{caller}: per-day should refuse")
                };
                assert_eq!(
                    info.violated().map(|p| p.name()).collect::<Vec<_>>(),
                    ["per-day"]
                );
                assert_eq!(
                    info.policy(0).expect("a policy").remaining(),
                    2,
                    "{caller}: a refusal consumed per-hour"
                );
            }
            // Both keys live on the master that owns the caller's slot.
            for policy in limiter.policies().iter() {
                let key = store.key(&CallerKey::new(caller.as_str()), policy);
                let key = std::str::from_utf8(&key).unwrap();
                assert_eq!(
                    cluster.nodes[*node].must(&["EXISTS", key]).trim(),
                    "1",
                    "{key} not on node {node}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_tags_hold_with_braces_and_separators() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::cluster_builder(cluster.urls())
        .build()
        .unwrap();
    let limiter = cluster_limiter(&cluster).await;
    let callers = [
        "acme",
        "acme}",
        "{acme}",
        "}{",
        "a:b:c",
        "rl:{acme}:per-hour",
        "{",
        "",
        "x".repeat(300).leak(),
    ];
    for caller in callers {
        let key = CallerKey::new(caller);
        let hour = cluster.keyslot(&store.key(&key, &limiter.policies()[0]));
        let day = cluster.keyslot(&store.key(&key, &limiter.policies()[1]));
        assert_eq!(hour, day, "{caller:?}: policies split across slots");
        // The script touches both keys in one call: a CROSSSLOT error would fail it.
        assert!(
            limiter.check(&Caller::new(caller)).await.is_allowed(),
            "{caller:?}"
        );
    }
    // Each caller has its own counters: one request each so far.
    for caller in callers {
        let Decision::Allowed(info) = limiter.check(&Caller::new(caller)).await else {
            panic!("{caller:?} refused early")
        };
        assert_eq!(
            info.policy(1).expect("a policy").remaining(),
            1,
            "{caller:?} shares a counter"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_under_concurrency_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let store =
            crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls())).await;
        limiters.push(
            Limiter::builder()
                .name("redis-cluster")
                .store_timeout(SLOW_TEST_MACHINE)
                .backend(store)
                .policy(Policy::sliding_window("per-hour", Quota::per_hour(50)))
                .build(),
        );
    }
    let mut tasks = Vec::new();
    for i in 0..256 {
        let limiter = limiters[i % 4].clone();
        tasks.push(tokio::spawn(async move {
            limiter.check(&Caller::new("acme")).await
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Decision::Allowed(_) => admitted += 1,
            Decision::Limited(_) => {}
            other => panic!("the store failed: {other:?}"),
        }
    }
    assert_eq!(admitted, 50);
}

// ---------------------------------------------------------------------------------------
// The cluster changing under traffic.
// ---------------------------------------------------------------------------------------

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The store admitted the request.
    Admitted,
    /// The store refused it.
    Refused,
    /// The failure policy decided: the store call failed or the breaker was open.
    Fallback,
}

fn outcome(decision: &Decision) -> Outcome {
    match decision {
        Decision::Allowed(info) if info.source() == DecisionSource::Store => Outcome::Admitted,
        Decision::Limited(info) if info.source() == DecisionSource::Store => Outcome::Refused,
        _ => Outcome::Fallback,
    }
}

/// One decision, when it was made (since the run started) and for whom.
#[derive(Clone, Copy, Debug)]
struct Record {
    at: Duration,
    group: usize,
    caller: usize,
    outcome: Outcome,
}

/// Limiters (separate instances, as separate service instances would be) sending traffic
/// for some callers.
struct Group {
    name: &'static str,
    limiters: Vec<Limiter>,
    callers: Vec<String>,
}

/// One limiter instance as a service instance would run it: its own cluster connection,
/// a store timeout no healthy call reaches on a loaded test machine, failing open (every
/// fallback is counted with its reason), no denial cache (every refusal asks the store),
/// and a breaker open 500 ms at first and never longer than 1 s, so an instance is back on
/// the store within about a second of the store's return.
fn instance(urls: &[String], name: &'static str, policy: Policy) -> Limiter {
    Limiter::builder()
        .name(name)
        .store_timeout(Duration::from_secs(2))
        .breaker(
            BreakerConfig::default()
                .base_open(Duration::from_millis(500))
                .max_open(Duration::from_secs(1)),
        )
        .on_store_failure(FailurePolicy::open())
        .denial_cache(0)
        .backend(
            RedisBackend::cluster_builder(urls.iter().cloned())
                .response_timeout(Duration::from_secs(2))
                .build()
                .expect("valid URLs"),
        )
        .policy(policy)
        .build()
}

/// What a run recorded.
struct Run<E> {
    records: Vec<Record>,
    snapshot: Snapshot,
    breakers: Vec<(&'static str, BreakerState)>,
    events: E,
}

impl<E> Run<E> {
    fn of(&self, group: usize) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(move |r| r.group == group)
    }

    fn fallbacks(&self, group: usize) -> Vec<Duration> {
        self.of(group)
            .filter(|r| r.outcome == Outcome::Fallback)
            .map(|r| r.at)
            .collect()
    }

    /// Fallbacks counted by the limiters of `layer`, by reason.
    fn reasons(&self, layer: &str) -> BTreeMap<&'static str, u64> {
        ["timeout", "refused", "other_error", "breaker_open"]
            .into_iter()
            .map(|reason| {
                let count = counter(
                    &self.snapshot,
                    "tollgate_fallbacks_total",
                    &[("layer", layer), ("reason", reason)],
                );
                (reason, count)
            })
            .filter(|(_, count)| *count > 0)
            .collect()
    }
}

/// Sets the flag when dropped, so traffic stops even when the operations panic.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `tasks` tasks per limiter, each deciding for its group's callers in turn with
/// `pause` between decisions, while `operations` runs on another thread (it starts once
/// every task has had its first decision, and gets the run's start instant); traffic
/// stops when `operations` returns.
fn traffic_during<E: Send>(
    groups: impl FnOnce() -> Vec<Group>,
    tasks: usize,
    pause: Duration,
    operations: impl FnOnce(Instant) -> E + Send,
) -> Run<E> {
    let start = Instant::now();
    let stop = AtomicBool::new(false);
    let warm = AtomicUsize::new(0);
    let expected = AtomicUsize::new(usize::MAX);
    std::thread::scope(|scope| {
        let ops = scope.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let deadline = Instant::now() + Duration::from_secs(30);
            while warm.load(Ordering::SeqCst) < expected.load(Ordering::SeqCst) {
                assert!(Instant::now() < deadline, "traffic never started");
                std::thread::sleep(Duration::from_millis(10));
            }
            operations(start)
        });
        let ((records, breakers), snapshot) = with_recorder(|_| async {
            let groups = groups();
            expected.store(
                groups.iter().map(|g| g.limiters.len()).sum::<usize>() * tasks,
                Ordering::SeqCst,
            );
            let records = std::sync::Mutex::new(Vec::new());
            let mut workers = Vec::new();
            for (g, group) in groups.iter().enumerate() {
                for limiter in &group.limiters {
                    for t in 0..tasks {
                        let (records, stop, warm) = (&records, &stop, &warm);
                        workers.push(async move {
                            let mut mine = Vec::new();
                            let mut i = t;
                            while !stop.load(Ordering::SeqCst) {
                                let caller = i % group.callers.len();
                                let decision = limiter
                                    .check(&Caller::new(group.callers[caller].as_str()))
                                    .await;
                                mine.push(Record {
                                    at: start.elapsed(),
                                    group: g,
                                    caller,
                                    outcome: outcome(&decision),
                                });
                                if i == t {
                                    warm.fetch_add(1, Ordering::SeqCst);
                                }
                                i += 1;
                                tokio::time::sleep(pause).await;
                            }
                            records.lock().unwrap().extend(mine);
                        });
                    }
                }
            }
            // All on this thread's runtime, so every limiter records into the recorder.
            futures_join_all(workers).await;
            let breakers = groups
                .iter()
                .flat_map(|g| g.limiters.iter().map(move |l| (g.name, l.breaker_state())))
                .collect();
            (records.into_inner().unwrap(), breakers)
        });
        let events = match ops.join() {
            Ok(events) => events,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let mut records: Vec<Record> = records;
        records.sort_by_key(|r| r.at);
        Run {
            records,
            snapshot,
            breakers,
            events,
        }
    })
}

/// Polls every future until all are done (they run concurrently on the current task).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(future) = slot {
                if future.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
}

/// The Redis key of `caller`'s per-day counter in a limiter named `limiter`. A caller's
/// keys share its hash tag, so any of them tells the caller's slot.
fn key_of(store: &RedisBackend, limiter: &str, caller: &str) -> Vec<u8> {
    let per_day = Limiter::builder()
        .name(limiter)
        .policy(Policy::sliding_window("per-day", Quota::per_day(1)))
        .build()
        .policies()[0]
        .clone();
    store.key(&CallerKey::new(caller), &per_day)
}

/// `count` callers whose keys live on the master `nodes[master]`, named `<prefix>-<n>`.
fn callers_on(cluster: &RedisCluster, master: usize, prefix: &str, count: usize) -> Vec<String> {
    let probe = RedisBackend::cluster_builder(["redis://127.0.0.1:1/"])
        .build()
        .expect("valid URL");
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|caller| {
            let key = key_of(&probe, "any", caller);
            cluster.node_for_slot(cluster.keyslot(&key)) == master
        })
        .take(count)
        .collect()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// When the first and the last of `times` were, after `since`.
fn span(times: &[Duration], since: Duration, what: &str) -> String {
    match (times.first(), times.last()) {
        (Some(first), Some(last)) => format!(
            "from {} ms to {} ms after {what}",
            ms(first.saturating_sub(since)),
            ms(last.saturating_sub(since))
        ),
        _ => "none".to_owned(),
    }
}

#[test]
fn a_live_reshard_loses_no_decision_and_no_count() {
    const LIMIT: u64 = 4_000;
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let source = masters[0];
    let target = masters[1];
    let busy = callers_on(&cluster, source, "busy", 1).remove(0);
    let probe = RedisBackend::cluster_builder(["redis://127.0.0.1:1/"])
        .build()
        .unwrap();
    let slot = cluster.keyslot(&key_of(&probe, "busy", &busy));
    // Nothing else runs the script on the target, so the first redirected calls find it
    // without the script once its cache is flushed.
    let others: Vec<String> = [source, masters[2]]
        .iter()
        .flat_map(|&m| callers_on(&cluster, m, "other", 3))
        .collect();
    let urls = cluster.master_urls();

    let run = traffic_during(
        || {
            vec![
                Group {
                    name: "busy",
                    limiters: (0..3)
                        .map(|_| {
                            instance(
                                &urls,
                                "busy",
                                Policy::sliding_window("per-day", Quota::per_day(LIMIT)),
                            )
                        })
                        .collect(),
                    callers: vec![busy.clone()],
                },
                Group {
                    name: "others",
                    limiters: vec![instance(
                        &urls,
                        "others",
                        Policy::sliding_window("per-day", Quota::per_day(1_000_000)),
                    )],
                    callers: others.clone(),
                },
            ]
        },
        3,
        Duration::from_millis(1),
        |start| {
            std::thread::sleep(Duration::from_millis(300));
            // The first calls redirected to the target find no cached script there.
            cluster.ok(target, &["SCRIPT", "FLUSH"]);
            let began = start.elapsed();
            cluster.move_slot(slot, target, Duration::from_millis(400));
            let moved = start.elapsed();
            // Traffic goes on until the caller has used its whole limit (on a slow machine
            // that may be well after the move), and a little longer so the store refuses.
            let key = String::from_utf8(key_of(&probe, "busy", &busy)).expect("an ASCII key");
            let deadline = Instant::now() + Duration::from_secs(20);
            while cluster.nodes[target].must(&["HGET", &key, "c"]).trim() != LIMIT.to_string()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(500));
            let errors = |node: usize, kind: &str| {
                errorstat(&cluster.nodes[node].must(&["INFO", "errorstats"]), kind)
            };
            let redirects = (errors(source, "ASK"), errors(source, "MOVED"));
            (began, moved, redirects, errors(target, "NOSCRIPT"))
        },
    );
    let (began, moved, (asks, moveds), noscripts) = run.events;
    assert_eq!(cluster.node_for_slot(slot), target, "the slot did not move");

    let busy_records: Vec<&Record> = run.of(0).collect();
    let during = busy_records
        .iter()
        .filter(|r| r.at >= began && r.at <= moved)
        .count();
    let after = busy_records.iter().filter(|r| r.at > moved).count();
    let admitted_after = busy_records
        .iter()
        .filter(|r| r.at > moved && r.outcome == Outcome::Admitted)
        .count();
    let admitted = busy_records
        .iter()
        .filter(|r| r.outcome == Outcome::Admitted)
        .count() as u64;
    let refused = busy_records
        .iter()
        .filter(|r| r.outcome == Outcome::Refused)
        .count();
    let fallbacks = run.fallbacks(0).len() + run.fallbacks(1).len();
    eprintln!(
        "live reshard of slot {slot} (migration {} ms): {} decisions for the busy caller \
         ({during} while the slot migrated, {after} after), {admitted} admitted ({admitted_after} after the move) of a limit of \
         {LIMIT}, {refused} refused; the source answered ASK {asks} times and MOVED \
         {moveds} times, the target NOSCRIPT {noscripts} times; {} decisions for callers on other slots; \
         fallbacks: {fallbacks} {:?} {:?}",
        ms(moved - began),
        busy_records.len(),
        run.of(1).count(),
        run.reasons("busy"),
        run.reasons("others"),
    );
    assert!(during > 0 && after > 0, "the traffic did not span the move");
    assert_eq!(fallbacks, 0, "decisions fell back during the reshard");
    assert!(
        run.breakers
            .iter()
            .all(|(_, state)| *state == BreakerState::Closed),
        "{:?}",
        run.breakers
    );
    // Every request beyond the limit was refused by the store, before and after the move:
    // the count moved with the keys, exactly (lost, the new node would admit again; counted
    // twice, fewer than the limit would be admitted).
    assert!(
        refused > 0,
        "the traffic never reached the limit; raise it or slow the move"
    );
    assert_eq!(admitted, LIMIT);
    // The redirects were real, and MOVED made the client refresh its slot map even though
    // the client itself retries nothing: after the first few, calls went straight to the
    // new owner instead of through the old one.
    assert!(asks > 0, "no call met the migrating slot");
    assert!(noscripts > 0, "no redirected call had to load the script");
    assert!(
        moveds > 0 && moveds < 50,
        "{moveds} MOVED replies for {after} decisions after the move: the slot map never refreshed"
    );
}

/// The count of `kind` errors in `INFO errorstats` output (0 if none).
fn errorstat(info: &str, kind: &str) -> u64 {
    let prefix = format!("errorstat_{kind}:count=");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_manual_failover_loses_at_most_the_calls_in_flight() {
    const LIMIT: u64 = 1_000_000;
    const TASKS: usize = 2;
    const LIMITERS: usize = 3;
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let callers: Vec<String> = masters
        .iter()
        .flat_map(|&m| callers_on(&cluster, m, "caller", 2))
        .collect();
    let replica = cluster.replica_of(masters[0]);
    let urls = cluster.master_urls();

    let run = traffic_during(
        || {
            vec![Group {
                name: "callers",
                limiters: (0..LIMITERS)
                    .map(|_| {
                        instance(
                            &urls,
                            "callers",
                            Policy::sliding_window("per-day", Quota::per_day(LIMIT)),
                        )
                    })
                    .collect(),
                callers: callers.clone(),
            }]
        },
        TASKS,
        Duration::from_millis(2),
        |start| {
            std::thread::sleep(Duration::from_millis(300));
            let began = start.elapsed();
            cluster.failover(replica);
            let settled = start.elapsed();
            std::thread::sleep(Duration::from_millis(1_000));
            (began, settled)
        },
    );
    let (began, settled) = run.events;
    assert_eq!(cluster.role(replica), "master");

    let fallbacks = run.fallbacks(0);
    let span = span(&fallbacks, began, "the failover began");
    let after = run.of(0).filter(|r| r.at > settled).count();
    eprintln!(
        "manual failover ({} ms until every node agreed): {} decisions, {} fallbacks ({span}) \
         {:?}, {after} decisions after it settled",
        ms(settled - began),
        run.records.len(),
        fallbacks.len(),
        run.reasons("callers"),
    );
    assert!(
        fallbacks.len() <= TASKS * LIMITERS,
        "more fallbacks than calls in flight"
    );
    assert!(after > 0);
    assert!(
        run.of(0)
            .filter(|r| r.at > settled)
            .all(|r| r.outcome == Outcome::Admitted),
        "decisions after the failover did not return to the store"
    );
    assert!(run.breakers.iter().all(|(_, s)| *s == BreakerState::Closed));

    // The counts went over with the failover: each caller's count is what was admitted
    // (plus at most its calls that fell back, which may have counted before failing).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The same name as the traffic's limiters: counters are scoped by limiter name.
    let limiter = runtime.block_on(async {
        instance(
            &urls,
            "callers",
            Policy::sliding_window("per-day", Quota::per_day(LIMIT)),
        )
    });
    for (c, caller) in callers.iter().enumerate() {
        let admitted = run
            .of(0)
            .filter(|r| r.caller == c && r.outcome == Outcome::Admitted)
            .count() as u64;
        let fell_back = run
            .of(0)
            .filter(|r| r.caller == c && r.outcome == Outcome::Fallback)
            .count() as u64;
        let Decision::Allowed(info) =
            runtime.block_on(limiter.check(&Caller::new(caller.as_str())))
        else {
            panic!("{caller}: the probe was not decided by the store")
        };
        let used = LIMIT - info.policy(0).expect("a policy").remaining() - 1;
        assert!(
            (admitted..=admitted + fell_back).contains(&used),
            "{caller}: {used} counted, {admitted} admitted, {fell_back} fell back"
        );
    }
}

/// Kills a master of `cluster` while three kinds of limiter instances send traffic: for
/// callers on that master (group 0), for callers on the others (group 1), and for callers on
/// every master (group 2). Prints what happened; returns the run with the instants of the
/// kill, the replica's promotion and the cluster settling.
fn lose_a_master(mut cluster: RedisCluster, what: &str) -> Run<(Duration, Duration, Duration)> {
    let masters = cluster.masters();
    let lost = masters[0];
    let on_lost = callers_on(&cluster, lost, "lost", 3);
    let elsewhere: Vec<String> = masters[1..]
        .iter()
        .flat_map(|&m| callers_on(&cluster, m, "healthy", 2))
        .collect();
    // A third kind of instance serves callers on every master, the lost one included.
    let mixed: Vec<String> = masters
        .iter()
        .map(|&m| callers_on(&cluster, m, "mixed", 1).remove(0))
        .collect();
    let urls = cluster.master_urls();
    let policy = || Policy::sliding_window("per-day", Quota::per_day(1_000_000));

    let run = traffic_during(
        || {
            vec![
                Group {
                    name: "lost",
                    limiters: (0..2).map(|_| instance(&urls, "lost", policy())).collect(),
                    callers: on_lost.clone(),
                },
                Group {
                    name: "healthy",
                    limiters: (0..2)
                        .map(|_| instance(&urls, "healthy", policy()))
                        .collect(),
                    callers: elsewhere.clone(),
                },
                Group {
                    name: "mixed",
                    limiters: (0..2).map(|_| instance(&urls, "mixed", policy())).collect(),
                    callers: mixed.clone(),
                },
            ]
        },
        2,
        Duration::from_millis(2),
        |start| {
            std::thread::sleep(Duration::from_millis(300));
            let killed = start.elapsed();
            cluster.kill_master_and_wait_for_promotion(lost);
            let promoted = start.elapsed();
            cluster.wait_until(
                "the cluster settles without the lost master",
                RedisCluster::is_settled,
            );
            let settled = start.elapsed();
            // Long enough for an open breaker (at most 1 s) to let the store back in.
            std::thread::sleep(Duration::from_millis(2_500));
            (killed, promoted, settled)
        },
    );
    let (killed, promoted, settled) = run.events;
    let fallbacks = run.fallbacks(0);
    let last = fallbacks.last().copied().unwrap_or_default();
    let back = run
        .of(0)
        .filter(|r| r.at > killed && r.outcome == Outcome::Admitted)
        .find(|r| r.at >= last)
        .map(|r| r.at);
    eprintln!(
        "lost master{what}: promotion {} ms after the kill (settled at {} ms); callers on its \
         slots: {} fallbacks {:?}, the last {} ms after the kill, back on the store at {} ms; \
         callers on the other masters: {} decisions, {} fallbacks {:?} ({})",
        ms(promoted - killed),
        ms(settled - killed),
        fallbacks.len(),
        run.reasons("lost"),
        ms(last.saturating_sub(killed)),
        back.map_or("never".to_owned(), |b| ms(b - killed).to_string()),
        run.of(1).count(),
        run.fallbacks(1).len(),
        run.reasons("healthy"),
        span(&run.fallbacks(1), killed, "the kill"),
    );
    // One breaker per limiter: where one limiter serves callers on every master, five
    // failures in a row for the lost master's callers would open it for all of them.
    // Reported, not asserted.
    let mixed_fallbacks = |on_lost: bool| {
        run.of(2)
            .filter(|r| r.outcome == Outcome::Fallback && (r.caller == 0) == on_lost)
            .count()
    };
    eprintln!(
        "lost master{what}, one limiter for callers on every master: {} fallbacks for its caller on \
         the lost master, {} for its callers on the other masters {:?}",
        mixed_fallbacks(true),
        mixed_fallbacks(false),
        run.reasons("mixed"),
    );
    run
}

#[test]
fn a_lost_master_falls_back_only_for_its_slots_until_its_replica_takes_over() {
    let run = lose_a_master(RedisCluster::start(), "");
    let (killed, promoted, settled) = run.events;
    let fallbacks = run.fallbacks(0);
    assert!(
        run.fallbacks(1).is_empty(),
        "callers on the healthy masters fell back"
    );
    assert!(!fallbacks.is_empty(), "killing the master changed nothing");
    assert!(
        fallbacks.iter().all(|&at| at >= killed),
        "fallbacks before the kill"
    );
    let counted: u64 = run.reasons("lost").values().sum();
    assert_eq!(
        counted,
        fallbacks.len() as u64,
        "every fallback counted by reason"
    );
    // Back on the store once the replica serves the slots and the breaker has let it in.
    let recovered = promoted.max(settled) + Duration::from_millis(1_500);
    let late: Vec<&Record> = run.of(0).filter(|r| r.at > recovered).collect();
    assert!(!late.is_empty());
    assert!(
        late.iter().all(|r| r.outcome == Outcome::Admitted),
        "decisions for the lost master's slots did not return to the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_split_by_a_migration_gets_a_bounded_retry_and_no_count() {
    const LIMIT: u64 = 100;
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let caller = callers_on(&cluster, masters[0], "split", 1).remove(0);
    let store = RedisBackend::cluster_builder(cluster.master_urls())
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .name("split")
        .store_timeout(Duration::from_secs(2))
        .on_store_failure(FailurePolicy::open())
        .denial_cache(0)
        .backend(store.clone())
        .policy(Policy::sliding_window("per-day", Quota::per_day(LIMIT)))
        .policy(Policy::sliding_window("per-day-too", Quota::per_day(LIMIT)))
        .build();
    let who = Caller::new(caller.as_str());
    let remaining = |decision: Decision| match decision {
        Decision::Allowed(info) if info.source() == DecisionSource::Store => {
            info.policies().map(|p| p.remaining()).collect::<Vec<_>>()
        }
        other => panic!("not decided by the store: {other:?}"),
    };
    for _ in 0..3 {
        limiter.check(&who).await;
    }
    let keys: Vec<String> = limiter
        .policies()
        .iter()
        .map(|p| String::from_utf8(store.key(&CallerKey::new(caller.as_str()), p)).unwrap())
        .collect();
    let slot = cluster.keyslot(keys[0].as_bytes());
    let (source, target) = (masters[0], masters[1]);
    let tries = |node: usize| {
        errorstat(
            &cluster.nodes[node].must(&["INFO", "errorstats"]),
            "TRYAGAIN",
        )
    };

    // One of the caller's two keys has moved, the other not yet: the source answers
    // TRYAGAIN. The call is repeated a bounded number of times, then fails; it never ran,
    // so it counted nothing.
    cluster.begin_migration(slot, target);
    cluster.migrate_keys(source, target, &[keys[0].as_str()]);
    let before = tries(source);
    let started = Instant::now();
    let decision = limiter.check(&who).await;
    let took = started.elapsed();
    let repeated = tries(source) - before;
    eprintln!(
        "a split caller: {repeated} TRYAGAIN replies in {} ms, then {decision:?}",
        ms(took)
    );
    assert!(matches!(decision, Decision::Unlimited(_)), "{decision:?}");
    assert_eq!(repeated, 6, "one call and five retries");

    // The rest of the caller's keys follow: ASK sends the call to the target, where the
    // count is exactly the three decisions made before (the failed one left no trace).
    cluster.migrate_keys(source, target, &[keys[1].as_str()]);
    assert_eq!(remaining(limiter.check(&who).await), [LIMIT - 4, LIMIT - 4]);
    cluster.finish_migration(slot, source, target);
    assert_eq!(remaining(limiter.check(&who).await), [LIMIT - 5, LIMIT - 5]);
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
}

/// Why the harness (and docs/guide/redis_deployments.md) runs the cluster with
/// `cluster-require-full-coverage no`: with the default `yes`, once the lost master is
/// flagged as failed every node answers CLUSTERDOWN for every slot until its replica is
/// promoted, so callers on the healthy masters fall back too.
#[test]
fn with_full_coverage_required_a_lost_master_stops_every_caller() {
    let run = lose_a_master(
        RedisCluster::start_requiring_full_coverage(),
        " (full coverage required)",
    );
    let (killed, promoted, _) = run.events;
    let healthy = run.fallbacks(1);
    assert!(
        !healthy.is_empty(),
        "callers on the healthy masters never fell back"
    );
    assert!(
        healthy
            .iter()
            .all(|&at| at >= killed && at <= promoted + Duration::from_secs(2))
    );
    assert!(run.reasons("healthy").contains_key("other_error"));
}

// ---------------------------------------------------------------------------------------
// A hot caller on the master that dies.

/// Which callers a decision was for, in the hot-caller scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// The hot caller, 120/s, whose keys live on the master that is killed.
    Hot,
    /// A background caller on the master that is killed.
    OnLost,
    /// A background caller on a healthy master.
    Healthy,
}

/// One decision of the hot-caller scenario.
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Duration,
    class: Class,
    outcome: Outcome,
    /// Failed closed: the request would have been answered 503.
    unavailable: bool,
}

/// Two limiter instances failing closed, each with the default breaker and its own cluster
/// connection; a store timeout a loaded 2-core machine never reaches for a healthy master
/// (so any fallback of a caller on one is the dead master's doing, not the machine's).
fn closed_instance(urls: &[String]) -> Limiter {
    Limiter::builder()
        .name("orders")
        .store_timeout(Duration::from_millis(250))
        .on_store_failure(FailurePolicy::closed())
        .backend(
            RedisBackend::cluster_builder(urls.iter().cloned())
                .build()
                .expect("valid URLs"),
        )
        .policy(Policy::sliding_window(
            "per-second",
            Quota::per_second(1_000_000),
        ))
        .build()
}

/// Sends `rate` decisions a second for `caller` (round robin over `limiters`) until `stop`.
async fn send_at(
    limiters: Vec<Limiter>,
    caller: String,
    class: Class,
    rate: f64,
    start: Instant,
    stop: std::sync::Arc<AtomicBool>,
    sent: std::sync::Arc<std::sync::Mutex<Vec<Sent>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = Vec::new();
    let mut n = 0usize;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let limiter = limiters[n % limiters.len()].clone();
        n += 1;
        let (caller, sent) = (caller.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let at = start.elapsed();
            let decision = limiter.check(&Caller::new(caller.as_str())).await;
            sent.lock().unwrap().push(Sent {
                at,
                class,
                outcome: outcome(&decision),
                unavailable: matches!(decision, Decision::Unavailable { .. }),
            });
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

#[test]
fn a_hot_caller_on_a_lost_master_leaves_the_callers_on_healthy_masters_alone() {
    const HOT_RATE: f64 = 120.0;
    const BACKGROUND_RATE: f64 = 8.0;
    let mut cluster = RedisCluster::start();
    let masters = cluster.masters();
    let lost = masters[0];
    let hot = callers_on(&cluster, lost, "hot", 1).remove(0);
    let lost_port = cluster.nodes[lost].port();
    // Twelve background callers spread over the slots: four on each master.
    let background: Vec<(String, Class)> = masters
        .iter()
        .flat_map(|&m| {
            let class = if m == lost {
                Class::OnLost
            } else {
                Class::Healthy
            };
            callers_on(&cluster, m, &format!("background-{m}"), 4)
                .into_iter()
                .map(move |c| (c, class))
        })
        .collect();
    let urls = cluster.master_urls();
    let start = Instant::now();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // On the recorder's thread, so that every limiter counts its fallbacks there.
    let ((killed, promoted, settled), snapshot) = with_recorder(|_| async {
        let limiters: Vec<Limiter> = (0..2).map(|_| closed_instance(&urls)).collect();
        let mut senders = vec![tokio::spawn(send_at(
            limiters.clone(),
            hot.clone(),
            Class::Hot,
            HOT_RATE,
            start,
            stop.clone(),
            sent.clone(),
        ))];
        for (caller, class) in &background {
            senders.push(tokio::spawn(send_at(
                limiters.clone(),
                caller.clone(),
                *class,
                BACKGROUND_RATE,
                start,
                stop.clone(),
                sent.clone(),
            )));
        }
        let events = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(1_500));
            let killed = start.elapsed();
            cluster.kill_master_and_wait_for_promotion(lost);
            let promoted = start.elapsed();
            cluster.wait_until(
                "the cluster settles without the lost master",
                RedisCluster::is_settled,
            );
            let settled = start.elapsed();
            std::thread::sleep(Duration::from_millis(2_500));
            ((killed, promoted, settled), cluster)
        })
        .await
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        for sender in senders {
            sender.await.unwrap();
        }
        // The cluster goes only once the traffic has stopped.
        drop(events.1);
        events.0
    });
    let mut sent = std::mem::take(&mut *sent.lock().unwrap());
    sent.sort_by_key(|s| s.at);
    // Fallbacks by the node (failure domain) and reason the limiters counted them under.
    let mut by_node: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (key, _, _, value) in &snapshot {
        let key = key.key();
        if key.name() != "tollgate_fallbacks_total" {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        if let metrics_util::debugging::DebugValue::Counter(count) = value
            && *count > 0
        {
            *by_node
                .entry(label("node"))
                .or_default()
                .entry(label("reason"))
                .or_default() += count;
        }
    }
    eprintln!(
        "fallbacks by node and reason (the lost master was 127.0.0.1:{}): {by_node:?}",
        lost_port
    );
    let of = |class: Class| sent.iter().filter(move |s| s.class == class);
    let fallbacks = |class: Class| of(class).filter(|s| s.outcome == Outcome::Fallback).count();
    let failed = |class: Class| of(class).filter(|s| s.unavailable).count();
    let hot_fallbacks: Vec<Duration> = of(Class::Hot)
        .filter(|s| s.outcome == Outcome::Fallback)
        .map(|s| s.at)
        .collect();
    let back = of(Class::Hot)
        .filter(|s| s.at > promoted && s.outcome == Outcome::Admitted)
        .find(|s| s.at >= hot_fallbacks.last().copied().unwrap_or_default())
        .map(|s| s.at);
    eprintln!(
        "hot caller ({HOT_RATE}/s) on the lost master: promotion {} ms after the kill (settled \
         at {} ms); the hot caller: {} decisions, {} fallbacks, back on the store {} ms after \
         the promotion; background callers on the lost master: {} decisions, {} fallbacks; \
         background callers on the healthy masters: {} decisions, {} fallbacks, {} failed \
         requests ({})",
        ms(promoted - killed),
        ms(settled - killed),
        of(Class::Hot).count(),
        fallbacks(Class::Hot),
        back.map_or("never".to_owned(), |b| ms(b.saturating_sub(promoted))
            .to_string()),
        of(Class::OnLost).count(),
        fallbacks(Class::OnLost),
        of(Class::Healthy).count(),
        fallbacks(Class::Healthy),
        failed(Class::Healthy),
        span(
            &of(Class::Healthy)
                .filter(|s| s.outcome == Outcome::Fallback)
                .map(|s| s.at)
                .collect::<Vec<_>>(),
            killed,
            "the kill"
        ),
    );
    assert!(
        !hot_fallbacks.is_empty(),
        "killing the master changed nothing"
    );
    assert!(
        of(Class::Healthy).count() > 200,
        "too little background traffic"
    );
    assert_eq!(
        fallbacks(Class::Healthy),
        0,
        "callers on healthy masters fell back"
    );
    assert_eq!(
        failed(Class::Healthy),
        0,
        "callers on healthy masters failed"
    );
    // The lost master's slots are decided on its promoted replica again soon after the
    // promotion (the topology is read every 250 ms; then one probe of a fresh breaker).
    let back = back.expect("the hot caller never came back to the store");
    assert!(
        back <= settled.max(promoted) + Duration::from_millis(1_500),
        "back {} ms after the promotion",
        ms(back - promoted)
    );
}

// ---------------------------------------------------------------------------------------
// A failure at the node a redirect names.

/// How many times the limiter read the slot map (`CLUSTER SLOTS`) from `nodes`.
fn slot_map_reads(cluster: &RedisCluster, nodes: &[usize]) -> u64 {
    nodes
        .iter()
        .filter_map(|&node| cluster.nodes[node].cli(&["INFO", "commandstats"]))
        .flat_map(|info| {
            info.lines()
                .filter_map(|line| line.trim().strip_prefix("cmdstat_cluster|slots:calls="))
                .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A caller's slot resharded to another master, which dies before this instance reads the
/// slot map again (it reads it every 250 ms): the decisions already under way go to the old
/// owner by the map, which answers `MOVED`, and fail at the dead target. The test moves the
/// caller's keys, waits for the instance to read the slot map, then hands the slot over,
/// kills the target and sends eight decisions for the caller at once, all under the map
/// that names the old owner.
///
/// The failures are the target's: its breaker counts them (eight failures open it) and its
/// label carries the fallbacks; the old owner's breaker stays closed, so its other callers
/// are decided by the store. Charged to the old owner, as the slot map named it, the eight
/// failures would open its breaker and send those callers to the failure policy.
#[test]
fn regression_a_failure_at_the_node_a_redirect_names_is_charged_to_that_node() {
    const BURST: usize = 8;
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let (owner, target, third) = (masters[0], masters[1], masters[2]);
    let moving = callers_on(&cluster, owner, "moving", 1).remove(0);
    let staying = callers_on(&cluster, owner, "staying", 3);
    let probe = RedisBackend::cluster_builder(["redis://127.0.0.1:1/"])
        .build()
        .unwrap();
    let moving_key = String::from_utf8(key_of(&probe, "redirected", &moving)).unwrap();
    let slot = cluster.keyslot(moving_key.as_bytes());
    let (owner_label, target_label) = (
        format!("127.0.0.1:{}", cluster.nodes[owner].port()),
        format!("127.0.0.1:{}", cluster.nodes[target].port()),
    );
    let target_id = cluster.id(target);
    let urls = cluster.master_urls();
    let moved = |cluster: &RedisCluster| {
        errorstat(&cluster.nodes[owner].must(&["INFO", "errorstats"]), "MOVED")
    };

    let (run, snapshot) = with_recorder(|_| async {
        let limiter = instance(
            &urls,
            "redirected",
            Policy::sliding_window("per-day", Quota::per_day(1_000_000)),
        );
        let decide = |caller: &str| {
            let limiter = limiter.clone();
            let caller = Caller::new(caller);
            async move { outcome(&limiter.check(&caller).await) }
        };
        for caller in std::iter::once(&moving).chain(&staying) {
            assert_eq!(decide(caller).await, Outcome::Admitted, "{caller}");
        }
        let cluster = tokio::task::spawn_blocking(move || {
            let mut cluster = cluster;
            // The caller's keys go over; the slot stays the owner's (it answers ASK).
            cluster.begin_migration(slot, target);
            cluster.migrate_keys(owner, target, &[moving_key.as_str()]);
            let masters = [owner, target, third];
            let before = slot_map_reads(&cluster, &masters);
            let deadline = Instant::now() + Duration::from_secs(5);
            while slot_map_reads(&cluster, &masters) == before {
                assert!(Instant::now() < deadline, "the slot map was never read");
                std::thread::sleep(Duration::from_millis(2));
            }
            // Read just now: the next reading is about 250 ms away.
            let slot_arg = slot.to_string();
            let owner_is_target = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id];
            for node in masters {
                cluster.ok(node, &owner_is_target);
            }
            cluster.nodes[target].kill();
            cluster
        })
        .await
        .unwrap();
        let moved_before = moved(&cluster);
        let burst: Vec<_> = (0..BURST)
            .map(|_| limiter.check(&Caller::new(moving.as_str())))
            .collect();
        let mut burst_outcomes = Vec::new();
        for decision in burst {
            burst_outcomes.push(outcome(&decision.await));
        }
        let moved_during_the_burst = moved(&cluster) - moved_before;
        let breakers = limiter.breaker_states();
        let mut staying_outcomes = Vec::new();
        for _ in 0..5 {
            for caller in &staying {
                staying_outcomes.push(decide(caller).await);
            }
        }
        (
            burst_outcomes,
            moved_during_the_burst,
            breakers,
            staying_outcomes,
            cluster,
        )
    });
    let (burst, moved_during_the_burst, breakers, staying_outcomes, cluster) = run;
    let fallbacks_at = |label: &str| {
        counter(
            &snapshot,
            "tollgate_fallbacks_total",
            &[("layer", "redirected"), ("node", label)],
        )
    };
    let breaker_of = |label: &str| {
        breakers
            .iter()
            .find(|(node, _)| node == label)
            .map(|(_, state)| *state)
    };
    let staying_fallbacks = staying_outcomes
        .iter()
        .filter(|o| **o == Outcome::Fallback)
        .count();
    eprintln!(
        "a failure at the node a redirect names: slot {slot} handed from {owner_label} to \
         {target_label}, which was then killed; {BURST} decisions for the moved caller: {:?}, \
         the old owner answered MOVED {moved_during_the_burst} times; fallbacks counted at the \
         old owner {}, at the target {}; breakers {breakers:?}; the old owner's other callers: \
         {} decisions, {staying_fallbacks} fell back",
        burst,
        fallbacks_at(&owner_label),
        fallbacks_at(&target_label),
        staying_outcomes.len(),
    );
    assert!(
        moved_during_the_burst > 0,
        "the slot map was read again before the decisions: no MOVED, nothing tested"
    );
    assert!(burst.iter().all(|o| *o == Outcome::Fallback), "{burst:?}");
    assert_eq!(
        fallbacks_at(&owner_label),
        0,
        "fallbacks charged to the old owner"
    );
    assert_eq!(fallbacks_at(&target_label), BURST as u64);
    assert_eq!(breaker_of(&owner_label), Some(BreakerState::Closed));
    assert_eq!(breaker_of(&target_label), Some(BreakerState::Open));
    assert_eq!(
        staying_fallbacks, 0,
        "the old owner's other callers fell back: {staying_outcomes:?}"
    );
    drop(cluster);
}
