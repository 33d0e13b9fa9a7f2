//! A Redis that refuses connections (killed, or nothing listening on its port) is counted
//! and reported as refused, not as a timeout: alerts and operators read the reason.

use std::net::TcpListener;
use std::time::Duration;

use tollgate::{Caller, FailurePolicy, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::recorder::{Snapshot, counter, with_recorder};
use tollgate_testkit::redis::RedisServer;

/// Longer than the backend's response timeout (500 ms), as a route that would rather wait
/// for Redis than fall back sets it: the backend's own timeout runs out first.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// A port nothing listens on: bound, read and closed.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

fn limiter(store: RedisBackend) -> Limiter {
    Limiter::builder()
        .name("login")
        .backend(store)
        .policy(Policy::sliding_window(
            "per-minute",
            Quota::per_minute(1_000),
        ))
        .store_timeout(STORE_TIMEOUT)
        .on_store_failure(FailurePolicy::closed())
        .build()
}

fn fallbacks(snapshot: &Snapshot, reason: &str) -> u64 {
    counter(
        snapshot,
        "tollgate_fallbacks_total",
        &[("layer", "login"), ("reason", reason)],
    )
}

fn report(snapshot: &Snapshot) {
    for reason in [
        "timeout",
        "refused",
        "not_connected",
        "breaker_open",
        "other_error",
    ] {
        eprintln!("fallbacks {reason}: {}", fallbacks(snapshot, reason));
    }
}

fn all_fallbacks(snapshot: &Snapshot) -> u64 {
    counter(snapshot, "tollgate_fallbacks_total", &[("layer", "login")])
}

#[test]
fn regression_a_closed_port_is_refused_not_a_timeout() {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let (ping, recorded) = with_recorder(|_| async move {
        let store = RedisBackend::builder(url).build().expect("valid URL");
        let ping = store.ping().await;
        let limiter = limiter(store);
        for _ in 0..4 {
            limiter.check(&Caller::new("alice")).await;
        }
        ping
    });
    let error = ping.expect_err("nothing listens on the port");
    eprintln!("ping: {} {error}", error.kind_name());
    report(&recorded);
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("refused"), "{error}");
    assert_eq!(fallbacks(&recorded, "refused"), 4, "{recorded:#?}");
    assert_eq!(all_fallbacks(&recorded), 4);
}

#[test]
fn regression_a_killed_redis_is_refused_not_a_timeout() {
    let mut server = RedisServer::start();
    let url = server.url();
    let (pinged, recorded) = with_recorder(|snapshotter| async move {
        let store = RedisBackend::builder(url).build().expect("valid URL");
        store.ping().await.expect("Redis answers");
        let limiter = limiter(store.clone());
        limiter.check(&Caller::new("alice")).await;
        snapshotter.snapshot();
        server.kill();
        for _ in 0..4 {
            limiter.check(&Caller::new("alice")).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        store.ping().await
    });
    let error = pinged.expect_err("Redis was killed");
    eprintln!("ping: {} {error}", error.kind_name());
    report(&recorded);
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("refused"), "{error}");
    assert_eq!(fallbacks(&recorded, "timeout"), 0, "{recorded:#?}");
    assert_eq!(fallbacks(&recorded, "refused"), 4, "{recorded:#?}");
}
