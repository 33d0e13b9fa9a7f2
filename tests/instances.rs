//! The registry of live instances: heartbeats in Redis, refreshed in the background, the
//! last known count kept through an outage.

mod support;

use std::time::{Duration, Instant};

use support::proxy::{Fault, FaultProxy};
use support::redis::RedisServer;
use tollgate::{InstanceRegistry, LiveInstances, RedisBackend};

fn registry(url: &str) -> InstanceRegistry {
    let store = RedisBackend::builder(url)
        .prefix("orders")
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .unwrap();
    InstanceRegistry::builder(&store).start()
}

async fn until(what: &str, within: Duration, condition: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_see_three_then_two_and_keep_it_through_an_outage() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let a = registry(&proxy.url());
    let b = registry(&proxy.url());
    let c = registry(&server.url());
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
