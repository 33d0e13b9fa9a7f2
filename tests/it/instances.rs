//! The registry of live instances: heartbeats in Redis, refreshed in the background, the
//! last known count kept through an outage, one process counted once, and a count rebuilt
//! after Redis lost the registry never trusted before every instance has beaten again.

use std::time::{Duration, Instant};

use tollgate::store::RedisBackendBuilder;
use tollgate::{BuildError, InstanceRegistry, RedisBackend};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::redis::RedisServer;

fn store_builder(url: &str) -> RedisBackendBuilder {
    RedisBackend::builder(url)
        .prefix("orders")
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
}

fn store(url: &str) -> RedisBackend {
    store_builder(url).build().unwrap()
}

/// A registry on the store `builder` builds, started expecting itself alone until the
/// first heartbeat answers: the tests watch the count from there.
fn start(builder: RedisBackendBuilder) -> InstanceRegistry {
    InstanceRegistry::start(&builder.build().unwrap(), 1).unwrap()
}

/// A registry that counts as the instance `id` (as if it ran in a process of its own).
fn instance(url: &str, id: &str) -> InstanceRegistry {
    start(store_builder(url).instance_id(id))
}

async fn until(what: &str, within: Duration, condition: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// Samples `registries` every 10 ms for `period`; returns the lowest count any of them gave.
async fn lowest_during(period: Duration, registries: &[&InstanceRegistry]) -> u64 {
    let start = Instant::now();
    let mut lowest = u64::MAX;
    while start.elapsed() < period {
        for registry in registries {
            lowest = lowest.min(registry.live_instances());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_see_three_then_two_and_keep_it_through_an_outage() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let a = instance(&proxy.url(), "a");
    let b = instance(&proxy.url(), "b");
    let c = instance(&server.url(), "c");
    assert_eq!(a.key(), "orders:instances");
    assert_ne!(a.id(), b.id());

    until("all three see 3", Duration::from_secs(3), || {
        [&a, &b, &c].iter().all(|r| r.live_instances() == 3)
    })
    .await;

    // c stops heartbeating: the others see 2 within the 3 s liveness window plus a beat.
    drop(c);
    let took = until("the others see 2", Duration::from_secs(4), || {
        a.live_instances() == 2 && b.live_instances() == 2
    })
    .await;
    println!("a stopped instance left the count after {took:?}");

    // During an outage the last known count stays.
    proxy.set(Fault::Refuse);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(a.live_instances(), 2);
    assert_eq!(b.live_instances(), 2);

    // Never below 1: a registry alone in Redis counts itself.
    proxy.set(Fault::Pass);
    drop(b);
    until("a alone sees 1", Duration::from_secs(6), || {
        a.live_instances() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_in_one_process_count_as_one_instance() {
    let server = RedisServer::start();
    let every = Duration::from_millis(100);
    // Two registries with one prefix in one process (say, one per limiter): one instance.
    let first = start(store_builder(&server.url()).instance_heartbeat(every));
    let second = start(store_builder(&server.url()).instance_heartbeat(every));
    assert_eq!(first.id(), second.id());
    assert_eq!(first.key(), second.key());
    let lowest_highest = async {
        let start = Instant::now();
        let mut highest = 0;
        while start.elapsed() < Duration::from_secs(1) {
            highest = highest
                .max(first.live_instances())
                .max(second.live_instances());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        highest
    };
    assert_eq!(
        lowest_highest.await,
        1,
        "one process counted more than once"
    );
    let members = server.must(&["ZRANGEBYSCORE", "orders:instances", "0", "+inf"]);
    assert_eq!(members.trim(), first.id(), "one member per process");

    // An instance named explicitly (another process, as far as the registry knows) counts.
    let other = start(
        store_builder(&server.url())
            .instance_heartbeat(every)
            .instance_id("other-process"),
    );
    assert_eq!(other.id(), "other-process");
    until("all see 2", Duration::from_secs(2), || {
        [&first, &second, &other]
            .iter()
            .all(|r| r.live_instances() == 2)
    })
    .await;

    // Dropping one of the two registries of a process leaves that process counted.
    drop(second);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(other.live_instances(), 2);
    assert_eq!(first.live_instances(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_rebuilt_after_a_restart_never_replaces_the_trusted_one_early() {
    let mut server = RedisServer::start();
    let every = Duration::from_millis(250);
    let window = Duration::from_secs(3);
    let url = server.url();
    let registry = |id: &str| {
        start(
            store_builder(&url)
                .instance_heartbeat(every)
                .instance_live_within(window)
                .instance_id(id),
        )
    };
    let a = registry("a");
    let b = registry("b");
    let c = registry("c");
    until("all three see 3", Duration::from_secs(3), || {
        [&a, &b, &c].iter().all(|r| r.live_instances() == 3)
    })
    .await;

    // Redis dies and comes back empty; c went away meanwhile, so 2 is the truth.
    server.kill();
    drop(c);
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    let restarted = Instant::now();
    // The first beats rebuild the registry from 1; until the rebuild is a whole window
    // old, the trusted 3 stays (a low count must not become the next outage's divisor).
    let lowest = lowest_during(window - Duration::from_millis(300), &[&a, &b]).await;
    assert_eq!(
        lowest, 3,
        "a count rebuilt from an empty registry was trusted early"
    );
    // After the window, the rebuilt count is complete and taken, decrease and all.
    until("a and b see 2", Duration::from_secs(3), || {
        a.live_instances() == 2 && b.live_instances() == 2
    })
    .await;
    println!(
        "the rebuilt count of 2 was taken {:?} after the restart",
        restarted.elapsed()
    );

    // Again, and two instances join while the registry is being rebuilt: an increase is
    // taken at once (it only makes shares smaller), long before the window has passed.
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    let restarted = Instant::now();
    let d = registry("d");
    let e = registry("e");
    until("a and b see 4", Duration::from_millis(2500), || {
        a.live_instances() == 4 && b.live_instances() == 4
    })
    .await;
    assert!(restarted.elapsed() < window);
    until("d and e see 4", Duration::from_secs(4), || {
        d.live_instances() == 4 && e.live_instances() == 4
    })
    .await;
}

#[tokio::test]
async fn a_heartbeat_not_shorter_than_the_window_is_refused() {
    let server = RedisServer::start();
    let url = server.url();
    // A beat every 5 s against a 3 s window: each instance would count only itself.
    let slow = store_builder(&url)
        .instance_heartbeat(Duration::from_secs(5))
        .build()
        .unwrap();
    let error = InstanceRegistry::start(&slow, 1).unwrap_err();
    assert_eq!(
        error,
        BuildError::HeartbeatNotShorterThanWindow {
            heartbeat_every: Duration::from_secs(5),
            live_within: Duration::from_secs(3),
        }
    );
    assert!(error.to_string().contains("heartbeat"), "{error}");
    let equal = store_builder(&url)
        .instance_heartbeat(Duration::from_secs(2))
        .instance_live_within(Duration::from_secs(2))
        .build()
        .unwrap();
    assert!(matches!(
        InstanceRegistry::start(&equal, 1),
        Err(BuildError::HeartbeatNotShorterThanWindow { .. })
    ));
    let unnamed = store_builder(&url).instance_id("").build().unwrap();
    assert!(matches!(
        InstanceRegistry::start(&unnamed, 1),
        Err(BuildError::InvalidInstanceId(_))
    ));

    // A longer window makes the same interval fine.
    let registry = start(
        store_builder(&url)
            .instance_heartbeat(Duration::from_secs(5))
            .instance_live_within(Duration::from_secs(12)),
    );
    until("it counts itself", Duration::from_secs(2), || {
        registry.live_instances() == 1
    })
    .await;
}

#[test]
fn starting_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(async { store("redis://127.0.0.1:1/") });
    let outside = InstanceRegistry::start(&store, 1);
    assert_eq!(outside.unwrap_err(), BuildError::NoRuntime);
    drop(runtime);
}

/// Four instances restarted while Redis is unreachable have never heard from the registry:
/// a registry started with no deployment size (0) is refused, and one given it divides
/// each local share by it until the first heartbeat answers. Two callers at 120/s each
/// over the four instances, on virtual time: each held to its limit over every whole window
/// of the share (50 a second shared by 4 is 12 a second on each instance).
#[tokio::test]
async fn regression_instances_restarted_in_an_outage_never_divide_by_one() {
    use tollgate::store::ManualClock;
    use tollgate::{Caller, FailurePolicy, InMemoryBackend, InstanceCount, Limiter, Policy, Quota};
    use tollgate_testkit::remote::Remote;

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set(Fault::Refuse);
    let unset = InstanceRegistry::start(
        &store_builder(&proxy.url())
            .instance_id("unset")
            .build()
            .unwrap(),
        0,
    );
    assert!(
        unset.is_err(),
        "started in an outage with an initial count of 0, dividing by {:?}",
        unset.as_ref().map(|registry| registry.live_instances())
    );
    assert_eq!(
        unset.unwrap_err().to_string(),
        "the instance registry needs the deployment's instance count (initial_count), used \
         until the first heartbeat answers: an instance started while Redis is unreachable \
         would otherwise divide by 1"
    );

    const LIMIT: u64 = 50;
    let clock = ManualClock::new(1_800_000_000_000);
    let down = Remote::new(InMemoryBackend::new().clock(clock.clone()));
    down.set_down(true);
    let limiters: Vec<Limiter> = (0..4)
        .map(|i| {
            let store = store_builder(&proxy.url())
                .instance_id(format!("restarted-{i}"))
                .build()
                .unwrap();
            let registry = InstanceRegistry::start(&store, 4).unwrap();
            Limiter::builder()
                .name("orders")
                .backend(down.clone())
                .clock(clock.clone())
                .policy(Policy::sliding_window(
                    "per-second",
                    Quota::per_second(LIMIT),
                ))
                .on_store_failure(FailurePolicy::local_share(InstanceCount::registry(
                    registry,
                )))
                .build()
        })
        .collect();
    let callers = [Caller::new("acme"), Caller::new("globex")];
    // Admissions per caller per whole second.
    let mut admitted = [[0u64; 10]; 2];
    // 120 a second per caller: a request of each every 1000/120 ms, round robin.
    for i in 0..1_200u64 {
        clock.set(1_800_000_000_000 + i * 1_000 / 120);
        for (c, caller) in callers.iter().enumerate() {
            let instance = (i as usize + c) % limiters.len();
            if limiters[instance].check(caller).await.is_allowed() {
                admitted[c][(i * 1_000 / 120 / 1_000) as usize] += 1;
            }
        }
    }
    for (caller, seconds) in callers.iter().zip(admitted) {
        let windows: Vec<u64> = seconds.chunks(2).map(|w| w.iter().sum()).collect();
        eprintln!(
            "{caller:?}: admitted per second {seconds:?}, per 2 s {windows:?} (limit {})",
            2 * LIMIT
        );
        for window in windows {
            assert!(
                window <= 2 * LIMIT,
                "{caller:?}: {window} admitted in 2 s over a limit of {}: {seconds:?}",
                2 * LIMIT
            );
        }
    }
}
