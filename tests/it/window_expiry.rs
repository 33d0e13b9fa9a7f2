//! A sliding window's key in Redis expires when its state stops weighing in decisions, two
//! windows after the start of the window it counts in, and no later, whichever operation
//! wrote it last (a decision, a lease or a refund); and it sets that expiry once per window
//! rather than on every write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::{Algorithm, Backend, CallerKey, Refund};
use tollgate::{Policy, RedisBackend};
use tollgate_testkit::redis::RedisServer;

/// One second: the test crosses a window boundary within a second.
const WINDOW_MS: u64 = 1_000;

/// Asserts that `key` expires no earlier than its state stops weighing (s + 2w while it
/// counts in its own window, s + w while only the previous window's count is left) and no
/// later than s + 2w, on the server's clock.
fn assert_expiry(server: &RedisServer, key: &str, after: &str) {
    let stored: Vec<u64> = server
        .must(&["HMGET", key, "s", "p", "c"])
        .lines()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{after}: {key} holds {v:?}"))
        })
        .collect();
    let (s, p, c) = (stored[0], stored[1], stored[2]);
    let weighs_until = if c > 0 {
        s + 2 * WINDOW_MS
    } else if p > 0 {
        s + WINDOW_MS
    } else {
        0
    };
    let expires_at: i64 = server.must(&["PEXPIRETIME", key]).trim().parse().unwrap();
    assert!(
        expires_at >= 0
            && expires_at as u64 >= weighs_until
            && expires_at as u64 <= s + 2 * WINDOW_MS,
        "after {after}: {key} (s {s}, p {p}, c {c}) expires at {expires_at}, its state \
         weighs until {weighs_until}, and no state of its window past {}",
        s + 2 * WINDOW_MS
    );
}

/// How many times redis-server ran a command that sets a key's expiry (scripts' own calls
/// included).
fn expiry_calls(server: &RedisServer) -> u64 {
    server
        .must(&["INFO", "commandstats"])
        .lines()
        .filter(|line| {
            line.starts_with("cmdstat_pexpire:") || line.starts_with("cmdstat_pexpireat:")
        })
        .map(|line| {
            let calls = line.split_once("calls=").unwrap().1;
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

fn window_store(server: &RedisServer, limit: u64) -> (RedisBackend, Arc<[Policy]>, String) {
    let policy = Policy::new(
        "window",
        Algorithm::sliding_window(limit, Duration::from_millis(WINDOW_MS)),
    );
    let store = RedisBackend::builder(server.url()).build().unwrap();
    let key = String::from_utf8(store.key(&CallerKey::new("acme"), &policy)).unwrap();
    (store, vec![policy].into(), key)
}

/// The start of the window `ms` falls in, on the server's clock.
fn window_of(ms: u64) -> u64 {
    ms - ms % WINDOW_MS
}

#[tokio::test]
async fn the_key_expires_when_its_state_stops_weighing() {
    let server = RedisServer::start();
    let (store, limits, key) = window_store(&server, 100);
    let acme = CallerKey::new("acme");

    let first = store.check(&acme, &limits, 1).await.unwrap();
    assert!(first.admitted());
    assert_expiry(&server, &key, "a decision");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Later in a window (or in the next one): the expiry stays with the window's start.
    let grant = store.lease(&acme, &limits, 1, 5).unwrap().await.unwrap();
    assert_eq!(grant.granted(), 5, "{grant:?}");
    assert_expiry(&server, &key, "a lease");
    store
        .refund(
            &acme,
            &limits,
            Refund::new(2, grant.outcome().counted_at_ms()),
        )
        .await
        .unwrap();
    assert_expiry(&server, &key, "a refund of a lease");
    let second = store.check(&acme, &limits, 3).await.unwrap();
    assert!(second.admitted());
    assert_expiry(&server, &key, "a decision later");

    // In the next window: the count moves to the previous one, the expiry with the start.
    let next = window_of(second.counted_at_ms()) + WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(
        next + 10 - second.counted_at_ms().min(next),
    ))
    .await;
    let third = store.check(&acme, &limits, 1).await.unwrap();
    assert!(third.admitted());
    assert!(window_of(third.counted_at_ms()) > window_of(second.counted_at_ms()));
    assert_expiry(&server, &key, "a decision in the next window");
    // A refund to the previous window, then of everything in this one: only the previous
    // count is left, and the key outlives it.
    store
        .refund(&acme, &limits, Refund::new(1, second.counted_at_ms()))
        .await
        .unwrap();
    assert_expiry(&server, &key, "a refund to the previous window");
    store
        .refund(&acme, &limits, Refund::new(1, third.counted_at_ms()))
        .await
        .unwrap();
    assert_expiry(&server, &key, "a refund emptying this window");
}

#[tokio::test]
async fn a_busy_window_sets_its_expiry_about_once_per_window() {
    let server = RedisServer::start();
    let (store, limits, key) = window_store(&server, 1_000_000);
    let acme = CallerKey::new("acme");

    server.must(&["CONFIG", "RESETSTAT"]);
    let start = Instant::now();
    let (mut first, mut last) = (None, 0);
    for i in 0..300 {
        if i % 10 == 9 {
            let grant = store.lease(&acme, &limits, 1, 5).unwrap().await.unwrap();
            assert_eq!(grant.granted(), 5);
        } else if i % 10 == 5 {
            store
                .refund(&acme, &limits, Refund::new(1, last))
                .await
                .unwrap();
        } else {
            let outcome = store.check(&acme, &limits, 1).await.unwrap();
            assert!(outcome.admitted());
            last = outcome.counted_at_ms();
            first.get_or_insert(last);
        }
    }
    let elapsed = start.elapsed();
    assert_expiry(&server, &key, "300 calls");
    // One when each window opens, and one per refund that reached back into the previous
    // window (a refund crossing a boundary): at most two per window the decisions touched,
    // and one for the lease after the last decision.
    let windows = (window_of(last) - window_of(first.unwrap())) / WINDOW_MS + 1;
    let calls = expiry_calls(&server);
    assert!(
        (1..=2 * windows + 1).contains(&calls),
        "{calls} expiries set in 300 calls over {elapsed:?} ({windows} windows)"
    );
}
