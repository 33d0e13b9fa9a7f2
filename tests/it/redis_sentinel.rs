//! The Redis backend on a master found through Redis Sentinel: three real
//! `redis-server --sentinel` processes, a master and its replica, on free ports. The master
//! is killed while limiter instances decide; the backend follows the failover without a
//! restart, fail-closed decisions are refusals (503) until the promotion, and what the
//! promoted replica counts differs from what the master counted only by the writes the
//! replica had not received when the master died. Each test prints what it measured
//! (`--nocapture`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::decision::DecisionSource;
use tollgate::store::{CallerKey, RedisBackendBuilder};
use tollgate::{
    Caller, Decision, FailurePolicy, InstanceRegistry, Limiter, Policy, Quota, RedisBackend,
};
use tollgate_testkit::orders_api::Server;
use tollgate_testkit::redis::{Failover, Promotion, RedisSentinels, RedisServer};

/// A store timeout no healthy call reaches on a loaded 2-core machine running a debug
/// build, so that every fallback is the failover's.
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// The capped caller's limit, per hour: reached well before the master is killed.
const CAP: u64 = 200;

fn store_builder(deployment: &RedisSentinels) -> RedisBackendBuilder {
    RedisBackend::sentinel_builder(deployment.sentinel_urls(), RedisSentinels::NAME)
        .prefix("sentinel")
}

fn store(deployment: &RedisSentinels) -> RedisBackend {
    store_builder(deployment)
        .build()
        .expect("valid Sentinel URLs")
}

fn limiter(name: &'static str, store: RedisBackend, quota: u64) -> Limiter {
    Limiter::builder()
        .name(name)
        .backend(store)
        .store_timeout(STORE_TIMEOUT)
        .on_store_failure(FailurePolicy::closed())
        // Every refusal asks the store, so that what the store counts is what it decided.
        .denial_cache(0)
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(quota)))
        .build()
}

/// The Redis key of `caller`'s per-hour counter in limiter `name`.
fn key(store: &RedisBackend, name: &'static str, caller: &str) -> String {
    let per_hour = limiter(name, store.clone(), 1).policies()[0].clone();
    String::from_utf8(store.key(&CallerKey::new(caller), &per_hour)).unwrap()
}

/// The current count (`c`) of a sliding window's hash on `node`, 0 if it has none.
fn count_on(node: &RedisServer, key: &str) -> u64 {
    node.cli(&["HGET", key, "c"])
        .and_then(|reply| reply.trim().parse().ok())
        .unwrap_or(0)
}

/// Sleeps past the next hour boundary when it is less than a minute away, so that a run
/// stays in one fixed per-hour window and counts compare exactly.
fn away_from_an_hour_boundary() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = now.as_secs() % 3_600;
    if into >= 3_540 {
        std::thread::sleep(Duration::from_secs(3_600 - into + 1));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Refused,
    /// Failed closed: a 503.
    Unavailable,
}

#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Instant,
    /// When the answer came.
    done: Instant,
    instance: usize,
    busy: bool,
    outcome: Outcome,
}

fn outcome(decision: &Decision) -> Outcome {
    match decision {
        Decision::Allowed(info) if info.source() == DecisionSource::Store => Outcome::Admitted,
        Decision::Limited(info) if info.source() == DecisionSource::Store => Outcome::Refused,
        Decision::Unavailable { .. } => Outcome::Unavailable,
        other => panic!("a fail-closed limiter decided otherwise: {other:?}"),
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// `at - since` in ms, negative when `at` came first.
fn signed_ms(at: Instant, since: Instant) -> i128 {
    at.saturating_duration_since(since).as_millis() as i128
        - since.saturating_duration_since(at).as_millis() as i128
}

#[test]
fn a_sentinel_failover_is_followed_without_a_restart() {
    const INSTANCES: usize = 2;
    const RATE: f64 = 100.0;
    away_from_an_hour_boundary();
    let mut deployment = RedisSentinels::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (capped_key, busy_key, instances) = runtime.block_on(async {
        let instances: Vec<(Limiter, Limiter)> = (0..INSTANCES)
            .map(|_| {
                // One backend (one connection) per instance, shared by its two limiters.
                let store = store(&deployment);
                (
                    limiter("capped", store.clone(), CAP),
                    limiter("busy", store, 1_000_000),
                )
            })
            .collect();
        let store = store(&deployment);
        (
            key(&store, "capped", "acme"),
            key(&store, "busy", "globex"),
            instances,
        )
    });
    let capped_key_for_reader = (capped_key.clone(), busy_key.clone());
    let drivers: Vec<_> = [false, true]
        .into_iter()
        .map(|busy| {
            let (instances, sent, stop) = (instances.clone(), sent.clone(), stop.clone());
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / RATE));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut tasks = Vec::new();
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let instance = n % INSTANCES;
                    n += 1;
                    let limiter = match busy {
                        true => instances[instance].1.clone(),
                        false => instances[instance].0.clone(),
                    };
                    let sent = sent.clone();
                    tasks.push(tokio::spawn(async move {
                        let at = Instant::now();
                        let caller = Caller::new(if busy { "globex" } else { "acme" });
                        let decision = limiter.check(&caller).await;
                        sent.lock().unwrap().push(Sent {
                            at,
                            done: Instant::now(),
                            instance,
                            busy,
                            outcome: outcome(&decision),
                        });
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
            })
        })
        .collect();

    // Long enough for the capped caller to reach its limit.
    std::thread::sleep(Duration::from_secs(3));
    let replica = 1;
    let replica_port = deployment.nodes[replica].port();
    // What the replica holds once the master is dead and before it is promoted: the writes
    // it received, no more (nothing else writes to it until then).
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let node = |key: &str| {
            std::process::Command::new("redis-cli")
                .args(["-p", &replica_port.to_string(), "HGET", key, "c"])
                .output()
                .ok()
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0)
        };
        (
            node(&capped_key_for_reader.0),
            node(&capped_key_for_reader.1),
        )
    });
    let Failover {
        killed,
        promoted,
        announced,
    } = deployment.kill_master_and_wait_for_promotion();
    let replicated = reader.join().unwrap();
    std::thread::sleep(Duration::from_millis(2_500));
    stop.store(true, Ordering::SeqCst);
    for driver in drivers {
        runtime.block_on(driver).unwrap();
    }
    let mut sent = std::mem::take(&mut *sent.lock().unwrap());
    sent.sort_by_key(|s| s.at);
    let after = |t: Instant, s: &Sent| s.at.saturating_duration_since(t);

    // Fail closed until the promotion, back on the new master soon after.
    let unavailable: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.outcome == Outcome::Unavailable)
        .collect();
    let first_503 = unavailable.first().map(|s| after(killed, s));
    let last_503 = unavailable.last().map(|s| s.at);
    let back_at: Vec<Instant> = (0..INSTANCES)
        .map(|i| {
            sent.iter()
                .filter(|s| s.instance == i && s.at >= last_503.unwrap_or(killed))
                .find(|s| s.outcome != Outcome::Unavailable)
                .map(|s| s.at)
                .unwrap_or_else(|| panic!("instance {i} never decided on the new master"))
        })
        .collect();
    let back: Vec<Duration> = back_at
        .iter()
        .map(|at| at.saturating_duration_since(announced))
        .collect();
    eprintln!(
        "Sentinel failover: the replica reported itself master {} ms after the kill, a Sentinel \
         named it {} ms after the kill; {} decisions, {} failed closed (503), from {:?} ms to {:?} \
         ms after the kill; per instance, the first decision on the new master {:?} ms after a \
         Sentinel named it ({:?} ms after the replica's promotion)",
        ms(promoted - killed),
        ms(announced - killed),
        sent.len(),
        unavailable.len(),
        first_503.map(ms),
        last_503.map(|t| ms(t - killed)),
        back_at
            .iter()
            .map(|at| signed_ms(*at, announced))
            .collect::<Vec<_>>(),
        back_at
            .iter()
            .map(|at| signed_ms(*at, promoted))
            .collect::<Vec<_>>(),
    );
    assert!(
        !unavailable.is_empty(),
        "killing the master changed nothing"
    );
    // (A request in flight when the master died may fail closed; none answered before.)
    assert!(
        sent.iter()
            .filter(|s| s.done < killed)
            .all(|s| s.outcome != Outcome::Unavailable),
        "503s before the kill"
    );
    for (i, back) in back.iter().enumerate() {
        assert!(
            *back <= Duration::from_secs(1),
            "instance {i}: back on the store {} ms after a Sentinel named the new master",
            ms(*back)
        );
    }
    // From then on, every decision is the new master's.
    let settled = announced + Duration::from_secs(1);
    assert!(
        sent.iter()
            .filter(|s| s.at >= settled)
            .all(|s| s.outcome != Outcome::Unavailable)
    );
    assert!(sent.iter().filter(|s| s.at >= settled).count() > 100);

    // Counts across the failover. The promoted replica holds every write the master had
    // sent it; a write the master acknowledged in its last moment may be missing, and
    // each such write can be admitted once more in the window. That is all.
    let (capped_replicated, busy_replicated) = replicated;
    let admitted = |busy: bool, until: Option<Instant>| {
        sent.iter()
            .filter(|s| s.busy == busy && s.outcome == Outcome::Admitted)
            .filter(|s| until.is_none_or(|t| s.at < t))
            .count() as u64
    };
    // Calls sent before the kill whose answers were lost: they may have counted there.
    let unknown = |busy: bool| {
        sent.iter()
            .filter(|s| s.busy == busy && s.at < killed && s.outcome == Outcome::Unavailable)
            .count() as u64
    };
    let new_master = &deployment.nodes[replica];
    let (capped_now, busy_now) = (
        count_on(new_master, &capped_key),
        count_on(new_master, &busy_key),
    );
    let capped_lost =
        (admitted(false, Some(killed)) + unknown(false)).saturating_sub(capped_replicated);
    let busy_lost = (admitted(true, Some(killed)) + unknown(true)).saturating_sub(busy_replicated);
    eprintln!(
        "counts across the failover: capped caller (limit {CAP}/h): {} admitted before the kill, \
         {capped_replicated} on the replica when the master died, {} admitted in all, \
         {capped_now} counted now; busy caller: {} admitted before the kill ({} answers lost \
         with the master), {busy_replicated} on the replica, so at most {busy_lost} writes lost; \
         {} admitted in all, {busy_now} counted now",
        admitted(false, Some(killed)),
        admitted(false, None),
        admitted(true, Some(killed)),
        unknown(true),
        admitted(true, None),
    );
    assert_eq!(
        admitted(false, Some(killed)),
        CAP,
        "the capped caller did not reach its limit"
    );
    assert!(
        admitted(false, None) <= CAP + capped_lost,
        "{} admitted for a limit of {CAP}, of which at most {capped_lost} the replica never saw",
        admitted(false, None)
    );
    // The new master counts on from what it received: what it holds now is what it had
    // plus what it admitted since.
    assert_eq!(
        capped_now,
        capped_replicated + (admitted(false, None) - admitted(false, Some(killed)))
    );
    assert_eq!(
        busy_now,
        busy_replicated + (admitted(true, None) - admitted(true, Some(killed)))
    );
    // On loopback the replica trails the master by well under a heartbeat: what it missed
    // is at most what was admitted in the master's last 250 ms.
    let last_moment = sent
        .iter()
        .filter(|s| s.busy && s.outcome == Outcome::Admitted)
        .filter(|s| s.at < killed && killed - s.at <= Duration::from_millis(250))
        .count() as u64;
    assert!(
        busy_lost <= last_moment + unknown(true),
        "{busy_lost} writes lost, more than the last 250 ms before the kill ({last_moment})"
    );
    drop(instances);
}

#[test]
fn the_instance_registry_beats_on_through_a_sentinel_failover() {
    let mut deployment = RedisSentinels::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registries: Vec<InstanceRegistry> = runtime.block_on(async {
        let mut registries = Vec::new();
        // Three instances, as if each ran in a process of its own: a store each.
        for id in ["orders-a", "orders-b", "orders-c"] {
            let store = store_builder(&deployment)
                .instance_id(id)
                .instance_heartbeat(Duration::from_millis(200))
                .instance_live_within(Duration::from_millis(1_000))
                .build()
                .expect("valid Sentinel URLs");
            store.ping().await.expect("the master answers");
            registries.push(InstanceRegistry::start(&store, 3).expect("a valid registry"));
        }
        registries
    });
    let counts = |registries: &[InstanceRegistry]| {
        registries
            .iter()
            .map(InstanceRegistry::live_instances)
            .collect::<Vec<_>>()
    };
    deployment.wait_until("every registry counts three instances", |_| {
        counts(&registries) == [3, 3, 3]
    });
    let Failover { announced, .. } = deployment.kill_master_and_wait_for_promotion();
    // The beats reach the new master: it lists every instance with a fresh beat (scores
    // from 0 up are beats; the registry's rebuild marker is scored below 0).
    let key = registries[0].key().to_owned();
    deployment.wait_until("the new master lists every instance", |d| {
        d.nodes[1]
            .cli(&["ZCOUNT", &key, "0", "+inf"])
            .is_some_and(|n| n.trim() == "3")
    });
    let listed = Instant::now();
    let beats_on_the_new_master = || {
        deployment.nodes[1]
            .cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"])
            .unwrap_or_default()
    };
    let before = beats_on_the_new_master();
    std::thread::sleep(Duration::from_millis(600));
    let later = beats_on_the_new_master();
    eprintln!(
        "instance registry through a Sentinel failover: every instance listed on the new master \
         {} ms after a Sentinel named it; counts {:?}",
        ms(listed.saturating_duration_since(announced)),
        counts(&registries)
    );
    assert_ne!(before, later, "the beats stopped");
    assert_eq!(counts(&registries), [3, 3, 3]);
}

/// A master cut off from the Sentinels but not from the limiter: the Sentinels' links to it
/// are blackholed by a proxy that passes every other client, so they promote its replica
/// while it goes on answering the limiter as a master, and nothing demotes it until the
/// Sentinels reach it again. Two limiter instances decide 50 times a second each, every
/// decision on the store, each for a caller of its own. What the old master admitted of a
/// caller after the promotion is its count at the end less its count when it was cut off,
/// less the caller's admissions between the cut and the promotion (all of them the old
/// master's); the caller's other admissions after the promotion are the new master's.
///
/// Every instance must decide on the new master within 1 s of the promotion (the replica
/// reporting itself master, as the test sees it, polling every 5 ms), so the old master
/// admits at most what an instance sends in that second: the bound asserted is 50
/// decisions per instance admitted by the old master after the promotion, plus one for a
/// decision in flight while a count is read.
#[test]
fn regression_a_master_cut_off_from_the_sentinels_is_left_within_a_second_of_the_promotion() {
    const INSTANCES: usize = 2;
    const RATE_PER_INSTANCE: f64 = 50.0;
    /// What an instance sends in the second the bound allows.
    const BOUND: u64 = RATE_PER_INSTANCE as u64;
    /// A decision in flight while the old master's count is read may be counted on either
    /// side.
    const SLACK: u64 = 1;
    away_from_an_hour_boundary();
    let deployment = RedisSentinels::start_behind_a_proxy();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let callers: Vec<String> = (0..INSTANCES).map(|i| format!("partitioned-{i}")).collect();
    let (instances, keys) = runtime.block_on(async {
        let instances: Vec<Limiter> = (0..INSTANCES)
            .map(|_| limiter("partitioned", store(&deployment), 1_000_000))
            .collect();
        let store = store(&deployment);
        let keys: Vec<String> = callers
            .iter()
            .map(|caller| key(&store, "partitioned", caller))
            .collect();
        (instances, keys)
    });
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let drivers: Vec<_> = instances
        .iter()
        .enumerate()
        .map(|(instance, limiter)| {
            let (limiter, sent, stop) = (limiter.clone(), sent.clone(), stop.clone());
            let caller = callers[instance].clone();
            runtime.spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_secs_f64(1.0 / RATE_PER_INSTANCE));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut tasks = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let (limiter, sent, caller) = (limiter.clone(), sent.clone(), caller.clone());
                    tasks.push(tokio::spawn(async move {
                        let at = Instant::now();
                        let decision = limiter.check(&Caller::new(caller)).await;
                        sent.lock().unwrap().push(Sent {
                            at,
                            done: Instant::now(),
                            instance,
                            busy: false,
                            outcome: outcome(&decision),
                        });
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
            })
        })
        .collect();
    let (old, new) = (&deployment.nodes[0], &deployment.nodes[1]);
    let counts = |node: &RedisServer| keys.iter().map(|k| count_on(node, k)).collect::<Vec<_>>();

    std::thread::sleep(Duration::from_secs(1));
    let old_at_cut = counts(old);
    let cut = Instant::now();
    deployment.cut_master_off_from_the_sentinels();
    // The Sentinels announce the promotion about a second after the replica takes the role.
    let deadline = cut + Duration::from_secs(30);
    while deployment.role(1).as_deref() != Some("master") {
        assert!(Instant::now() < deadline, "the replica was not promoted");
        std::thread::sleep(Duration::from_millis(5));
    }
    let promoted = Instant::now();
    let new_at_promotion = counts(new);
    let Promotion { announced, .. } = deployment.wait_for_promotion();
    std::thread::sleep(Duration::from_millis(2_500));
    stop.store(true, Ordering::SeqCst);
    for driver in drivers {
        runtime.block_on(driver).unwrap();
    }
    let (old_at_end, new_at_end) = (counts(old), counts(new));
    let old_role = deployment.role(0);
    let mut sent = std::mem::take(&mut *sent.lock().unwrap());
    sent.sort_by_key(|s| s.at);

    let mut report = Vec::new();
    for instance in 0..INSTANCES {
        let admitted = |from: Instant, until: Instant| -> Vec<&Sent> {
            sent.iter()
                .filter(|s| s.instance == instance && s.outcome == Outcome::Admitted)
                .filter(|s| s.at >= from && s.at < until)
                .collect()
        };
        let after_the_promotion = admitted(promoted, Instant::now());
        let on_the_old_master = (old_at_end[instance] - old_at_cut[instance])
            .saturating_sub(admitted(cut, promoted).len() as u64);
        // An instance moves once: its first admissions after the promotion are the old
        // master's, the rest the new master's.
        let first_on_the_new_master = usize::try_from(on_the_old_master)
            .ok()
            .and_then(|n| after_the_promotion.get(n))
            .map(|s| s.at);
        let unavailable = sent
            .iter()
            .filter(|s| s.instance == instance && s.outcome == Outcome::Unavailable)
            .count();
        report.push((
            on_the_old_master,
            after_the_promotion.len() as u64
                - on_the_old_master.min(after_the_promotion.len() as u64),
            new_at_end[instance] - new_at_promotion[instance],
            first_on_the_new_master,
            unavailable,
        ));
    }
    eprintln!(
        "master cut off from the Sentinels: the replica reported itself master {} ms after the \
         cut, a Sentinel named it {} ms after the cut; the old master still says {old_role:?}; \
         per instance (admitted after the promotion by the old master, by the new master, what \
         the new master's count grew by since the test saw the promotion, the first decision on \
         the new master in ms after the promotion, failed closed): {:?}",
        ms(promoted - cut),
        ms(announced - cut),
        report
            .iter()
            .map(|(old, new, grew, first, unavailable)| (
                old,
                new,
                grew,
                first.map(|at| signed_ms(at, promoted)),
                unavailable
            ))
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        old_role.as_deref(),
        Some("master"),
        "the old master was demoted: it was not cut off from the Sentinels"
    );
    for (instance, (on_the_old_master, _, _, first_on_the_new_master, _)) in
        report.iter().enumerate()
    {
        let first = first_on_the_new_master.unwrap_or_else(|| {
            panic!(
                "instance {instance} never decided on the new master; the old master admitted \
                 {on_the_old_master} of its decisions after the promotion"
            )
        });
        assert!(
            first <= promoted + Duration::from_secs(1),
            "instance {instance} moved to the new master {} ms after the promotion",
            signed_ms(first, promoted)
        );
        assert!(
            *on_the_old_master <= BOUND + SLACK,
            "the old master admitted {on_the_old_master} decisions of instance {instance} after \
             the promotion (bound {BOUND})"
        );
    }
    drop(instances);
}

/// A master demoted while decisions keep coming, by a switchover made by hand (`REPLICAOF
/// NO ONE` on the replica, then `REPLICAOF` to it on the master: unlike a Sentinel's
/// reconfiguration, it disconnects no client). The caller is at its limit, so every
/// decision is a refusal, which only reads: a replica answers it, from counts that no longer
/// change, and no `READONLY` ever tells the limiter. The Sentinels have not noticed yet (a
/// master reported as a replica is acted on only after 20 s), so they name no other master.
///
/// The limiter must stop deciding on the demoted node within 500 ms of the demotion (its
/// role is asked every 100 ms whatever the traffic); after that, with no master to be
/// found, it fails closed. The decisions the store answered later than that are counted:
/// the bound is none.
#[test]
fn regression_a_master_demoted_under_traffic_is_left_within_a_health_check() {
    const RATE: f64 = 50.0;
    const CAP: u64 = 20;
    away_from_an_hour_boundary();
    let deployment = RedisSentinels::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let limiter = runtime.block_on(async { limiter("demoted", store(&deployment), CAP) });
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (limiter, sent, stop) = (limiter.clone(), sent.clone(), stop.clone());
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tasks = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let (limiter, sent) = (limiter.clone(), sent.clone());
                tasks.push(tokio::spawn(async move {
                    let at = Instant::now();
                    let decision = limiter.check(&Caller::new("demoted")).await;
                    sent.lock().unwrap().push(Sent {
                        at,
                        done: Instant::now(),
                        instance: 0,
                        busy: false,
                        outcome: outcome(&decision),
                    });
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };
    // Long enough for the caller to reach its limit.
    std::thread::sleep(Duration::from_millis(1_500));
    let (master, replica) = (&deployment.nodes[0], &deployment.nodes[1]);
    assert_eq!(replica.must(&["REPLICAOF", "NO", "ONE"]).trim(), "OK");
    let new_master = replica.port().to_string();
    assert_eq!(
        master.must(&["REPLICAOF", "127.0.0.1", &new_master]).trim(),
        "OK"
    );
    let demoted = Instant::now();
    std::thread::sleep(Duration::from_millis(2_000));
    stop.store(true, Ordering::SeqCst);
    runtime.block_on(driver).unwrap();
    let mut sent = std::mem::take(&mut *sent.lock().unwrap());
    sent.sort_by_key(|s| s.at);
    let by_the_store = |s: &&Sent| s.outcome != Outcome::Unavailable;
    let last_by_the_store = sent.iter().filter(by_the_store).map(|s| s.at).next_back();
    let late: Vec<&Sent> = sent
        .iter()
        .filter(by_the_store)
        .filter(|s| s.at > demoted + Duration::from_millis(500))
        .collect();
    eprintln!(
        "master demoted under traffic: {} decisions, {} by the store before the demotion ({} \
         refused), {} by the store after it, the last {:?} ms after it; {} failed closed; the \
         demoted node says {:?}",
        sent.len(),
        sent.iter()
            .filter(by_the_store)
            .filter(|s| s.at <= demoted)
            .count(),
        sent.iter()
            .filter(|s| s.at <= demoted && s.outcome == Outcome::Refused)
            .count(),
        sent.iter()
            .filter(by_the_store)
            .filter(|s| s.at > demoted)
            .count(),
        last_by_the_store.map(|at| signed_ms(at, demoted)),
        sent.iter()
            .filter(|s| s.outcome == Outcome::Unavailable)
            .count(),
        deployment.role(0),
    );
    assert!(
        sent.iter()
            .any(|s| s.at <= demoted && s.outcome == Outcome::Refused),
        "the caller never reached its limit before the demotion"
    );
    assert_eq!(deployment.role(0).as_deref(), Some("slave"));
    assert!(
        late.is_empty(),
        "{} decisions answered by the demoted master more than 500 ms after the demotion",
        late.len()
    );
    drop(limiter);
}

/// `orders_api --redis-sentinel ... --sentinel-master ...`, failing closed on `/orders`
/// too, with a store timeout a loaded machine does not reach; its address.
fn orders_api(deployment: &RedisSentinels) -> Server {
    let sentinels = deployment.sentinel_urls().join(",");
    tollgate_testkit::orders_api::spawn(&[
        "--redis-sentinel",
        &sentinels,
        "--sentinel-master",
        RedisSentinels::NAME,
        "--expected-instances",
        "1",
        "--on-store-failure",
        "closed",
        "--store-timeout-ms",
        "100",
        // Logins carry their client's address in X-Forwarded-For, from this test's loopback.
        "--trusted-proxy",
        "127.0.0.1/32",
    ])
}

#[test]
fn orders_api_on_sentinel_answers_503_never_500_through_a_failover() {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let mut deployment = RedisSentinels::start();
    let servers: Vec<Server> = (0..2).map(|_| orders_api(&deployment)).collect();
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // (sent, route, status, answered)
    type Samples = Arc<Mutex<Vec<(Instant, &'static str, u16, Instant)>>>;
    let samples: Samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (samples, stop) = (samples.clone(), stop.clone());
        runtime.spawn(async move {
            let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(32)
                .build_http();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut tasks = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let base = &bases[n % bases.len()];
                n += 1;
                // A login (5 a minute per client IP, failing closed; each from an address
                // of its own, so that each asks the store) and an order (50 a second per
                // customer, failing closed here) each tick.
                let client_ip = format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255);
                for (route, request) in [
                    (
                        "/login",
                        hyper::Request::post(format!("{base}/login"))
                            .header("x-forwarded-for", client_ip)
                            .body(Empty::new())
                            .unwrap(),
                    ),
                    (
                        "/orders",
                        hyper::Request::get(format!("{base}/orders"))
                            .header("x-customer-id", "acme")
                            .body(Empty::new())
                            .unwrap(),
                    ),
                ] {
                    let (client, samples) = (client.clone(), samples.clone());
                    tasks.push(tokio::spawn(async move {
                        let at = Instant::now();
                        let response = client.request(request).await.expect("an HTTP answer");
                        let status = response.status().as_u16();
                        let _ = response.into_body().collect().await;
                        samples
                            .lock()
                            .unwrap()
                            .push((at, route, status, Instant::now()));
                    }));
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let Failover {
        killed,
        promoted,
        announced,
    } = deployment.kill_master_and_wait_for_promotion();
    std::thread::sleep(Duration::from_millis(2_500));
    stop.store(true, Ordering::SeqCst);
    runtime.block_on(driver).unwrap();
    let mut samples = std::mem::take(&mut *samples.lock().unwrap());
    samples.sort_by_key(|s| s.0);
    let statuses = |route: &str, status: u16| {
        samples
            .iter()
            .filter(|s| s.1 == route && s.2 == status)
            .count()
    };
    let last_503 = samples
        .iter()
        .filter(|s| s.2 == 503)
        .map(|s| s.0)
        .next_back();
    eprintln!(
        "orders_api x2 on Sentinel through a failover (replica promoted {} ms, named by a \
         Sentinel {} ms after the kill): /login {} x 200, {} x 429, {} x 503; /orders {} x 200, \
         {} x 429, {} x 503; the last 503 {:?} ms after a Sentinel named the new master",
        ms(promoted - killed),
        ms(announced - killed),
        statuses("/login", 200),
        statuses("/login", 429),
        statuses("/login", 503),
        statuses("/orders", 200),
        statuses("/orders", 429),
        statuses("/orders", 503),
        last_503.map(|t| signed_ms(t, announced)),
    );
    for (_, route, status, _) in &samples {
        assert!(
            [200, 429, 503].contains(status),
            "{route} answered {status}"
        );
    }
    assert!(statuses("/login", 503) > 0 && statuses("/orders", 503) > 0);
    // A request in flight when the master died may fail closed; none answered before.
    assert!(
        samples.iter().filter(|s| s.3 < killed).all(|s| s.2 != 503),
        "503 before the master was killed"
    );
    let last_503 = last_503.expect("503s");
    assert!(
        last_503 <= announced + Duration::from_secs(1),
        "a 503 {} ms after a Sentinel named the new master",
        ms(last_503 - announced)
    );
    assert!(
        samples
            .iter()
            .filter(|s| s.0 > announced + Duration::from_secs(1))
            .count()
            > 100
    );
}
