//! A token bucket's key in Redis outlives its state's refill, whichever script wrote it
//! last (a decision, a lease, a refund, or an older version of the decision script), yet
//! a busy key sets its expiry about once per full refill rather than on every write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::{Algorithm, Backend, CallerKey, Refund};
use tollgate::{Policy, RedisBackend};
use tollgate_testkit::redis::RedisServer;

/// A bucket's parameters, as the scripts receive them.
struct Bucket {
    rate: u64,
    period_ms: u64,
    burst: u64,
}

impl Bucket {
    fn of(policy: &Policy) -> Self {
        let Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        } = *policy.algorithm()
        else {
            panic!("not a token bucket: {policy:?}")
        };
        Self {
            rate,
            period_ms,
            burst,
        }
    }

    /// Asserts that `key` expires no earlier than its stored level has refilled:
    /// t + ceil((capacity - l) / rate), on the server's clock.
    fn assert_covered(&self, server: &RedisServer, key: &str, after: &str) {
        let stored = server.must(&["HMGET", key, "l", "t"]);
        let stored: Vec<u64> = stored
            .lines()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{after}: {key} holds {v:?}"))
            })
            .collect();
        let (level, updated) = (stored[0], stored[1]);
        let refilled_at = updated + (self.burst * self.period_ms - level).div_ceil(self.rate);
        // The absolute expiry: no clock reading between the write and this check to
        // round.
        let expires_at: i64 = server.must(&["PEXPIRETIME", key]).trim().parse().unwrap();
        assert!(
            expires_at >= 0 && expires_at as u64 >= refilled_at,
            "after {after}: {key} expires at {expires_at}, but its level {level} at {updated} \
             refills only at {refilled_at}"
        );
    }
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

fn bucket_store(server: &RedisServer, policy: &Policy) -> (RedisBackend, Arc<[Policy]>, String) {
    let store = RedisBackend::builder(server.url()).build().unwrap();
    let key = String::from_utf8(store.key(&CallerKey::new("acme"), policy)).unwrap();
    (store, vec![policy.clone()].into(), key)
}

#[tokio::test]
async fn the_key_outlives_every_state_written() {
    let server = RedisServer::start();
    // 10 tokens a second, 20 at most: a full refill takes 2 s.
    let policy = Policy::new(
        "bucket",
        Algorithm::token_bucket(10, Duration::from_secs(1), 20),
    );
    let bucket = Bucket::of(&policy);
    let (store, limits, key) = bucket_store(&server, &policy);
    let acme = CallerKey::new("acme");

    // Drained to empty in steps of 1 to 3 tokens: the first writes find the expiry set by
    // the first one long enough, the last ones (nearly 2 s of refill ahead) do not.
    let mut admitted = Vec::new();
    for cost in [1, 2, 3].into_iter().cycle() {
        let outcome = store.check(&acme, &limits, cost).await.unwrap();
        if !outcome.admitted() {
            break;
        }
        admitted.push((cost, outcome.counted_at_ms()));
        bucket.assert_covered(&server, &key, &format!("a decision of cost {cost}"));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert!(admitted.len() >= 9, "{admitted:?}");

    let (cost, counted_at) = admitted.pop().unwrap();
    store
        .refund(&acme, &limits, Refund::new(cost, counted_at))
        .await
        .unwrap();
    bucket.assert_covered(&server, &key, "a refund");

    // Whatever has refilled, leased at once: the bucket is empty again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grant = store.lease(&acme, &limits, 1, 100).unwrap().await.unwrap();
    assert!(grant.granted() >= 3, "{grant:?}");
    assert_eq!(grant.outcome().limits()[0].remaining, 0, "{grant:?}");
    bucket.assert_covered(&server, &key, "a lease");

    store
        .refund(
            &acme,
            &limits,
            Refund::new(1, grant.outcome().counted_at_ms()),
        )
        .await
        .unwrap();
    bucket.assert_covered(&server, &key, "a refund of a lease");
}

/// An older version of the decision script set the expiry to a full refill from its own time on
/// every write; one writing between two of today's decisions may bring the expiry earlier
/// than today's scripts last set it, and the next decision must still be covered.
#[tokio::test]
async fn the_key_outlives_its_state_after_an_older_script_wrote_it() {
    const OLDER_WRITE: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], 'l', ARGV[1], 't', now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return now
";
    let server = RedisServer::start();
    let policy = Policy::new(
        "bucket",
        Algorithm::token_bucket(10, Duration::from_secs(1), 20),
    );
    let bucket = Bucket::of(&policy);
    let full_ms = (bucket.burst * bucket.period_ms).div_ceil(bucket.rate);
    let (store, limits, key) = bucket_store(&server, &policy);
    let acme = CallerKey::new("acme");

    assert!(store.check(&acme, &limits, 1).await.unwrap().admitted());
    bucket.assert_covered(&server, &key, "the first decision");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The older script takes the last token: its expiry, a full refill from now, covers its
    // own state.
    server.must(&["EVAL", OLDER_WRITE, "1", &key, "0", &full_ms.to_string()]);
    bucket.assert_covered(&server, &key, "the older script's write");
    // The next token, taken as soon as it is there, leaves nearly a full refill ahead.
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if store.check(&acme, &limits, 1).await.unwrap().admitted() {
            break;
        }
        assert!(Instant::now() < deadline, "no token came back in 1 s");
    }
    bucket.assert_covered(&server, &key, "a decision after the older script's write");
}

#[tokio::test]
async fn a_busy_bucket_sets_its_expiry_about_once_per_refill() {
    let server = RedisServer::start();
    // 1,000 tokens a second, 1,000 at most: a full refill takes 1 s.
    let policy = Policy::new(
        "bucket",
        Algorithm::token_bucket(1_000, Duration::from_secs(1), 1_000),
    );
    let bucket = Bucket::of(&policy);
    let (store, limits, key) = bucket_store(&server, &policy);
    let acme = CallerKey::new("acme");

    server.must(&["CONFIG", "RESETSTAT"]);
    let start = Instant::now();
    let mut last = 0;
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
        }
    }
    let elapsed = start.elapsed();
    bucket.assert_covered(&server, &key, "300 calls");
    // Each expiry set covers a full refill, less the refill its own state still needs
    // (under 500 tokens taken in all: under half of it), so at most one more per half a
    // refill that passed.
    let calls = expiry_calls(&server);
    let most = 1 + elapsed.as_millis() / 500;
    assert!(
        (1..=most as u64).contains(&calls),
        "{calls} expiries set in 300 calls over {elapsed:?}"
    );
}
