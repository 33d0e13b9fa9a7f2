//! A token bucket's key in Redis holds its level and time in one value, packed, written
//! with its end in one command: it ends exactly when its state has refilled, whichever
//! operation wrote it last (a decision, a lease, a refund), and a key an older version of
//! the scripts wrote (a hash, or the text "<level>:<time>") is read, then replaced.

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

    /// Writes `key` as an older version of the scripts would have: `older_write` is given
    /// the level, then how long a full refill takes.
    fn write_older(&self, server: &RedisServer, older_write: &str, key: &str, level: u64) {
        let full_ms = (self.burst * self.period_ms).div_ceil(self.rate);
        let (level, full_ms) = (level.to_string(), full_ms.to_string());
        server.must(&["EVAL", older_write, "1", key, &level, &full_ms]);
    }

    /// Asserts that `key` ends exactly when its stored level has refilled:
    /// t + ceil((capacity - l) / rate), on the server's clock.
    fn assert_ends_when_refilled(&self, server: &RedisServer, key: &str, after: &str) {
        // The value and its absolute expiry, read together by one script.
        let mut connection = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let (expires_at, stored): (i64, Vec<u8>) = redis::cmd("EVAL")
            .arg("return { redis.call('PEXPIRETIME', KEYS[1]), redis.call('GET', KEYS[1]) }")
            .arg(1)
            .arg(key)
            .query(&mut connection)
            .unwrap();
        let (level, updated) = bucket_state(&stored)
            .unwrap_or_else(|| panic!("after {after}: {key} holds {stored:?}"));
        let refilled_at = updated + (self.burst * self.period_ms - level).div_ceil(self.rate);
        assert_eq!(
            expires_at, refilled_at as i64,
            "after {after}: {key} holds level {level} at {updated}, which refills at \
             {refilled_at}, but ends at {expires_at}"
        );
    }
}

/// A token bucket's level and time as the scripts store them: a zero byte, then the two as
/// little-endian doubles (integers, exact below 2^53); `None` for any other value.
pub(crate) fn bucket_state(stored: &[u8]) -> Option<(u64, u64)> {
    let [0, rest @ ..] = stored else {
        return None;
    };
    let (level, time) = rest.split_at_checked(8)?;
    let number = |bytes: &[u8]| -> Option<u64> {
        let value = f64::from_le_bytes(bytes.try_into().ok()?);
        (value >= 0.0 && value.fract() == 0.0 && value < 2f64.powi(53)).then_some(value as u64)
    };
    Some((number(level)?, number(time)?))
}

/// How many times redis-server ran `command` (scripts' own calls included).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    server
        .must(&["INFO", "commandstats"])
        .lines()
        .filter(|line| line.starts_with(&prefix))
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
async fn the_key_ends_when_each_state_written_has_refilled() {
    let server = RedisServer::start();
    // 10 tokens a second, 20 at most: a full refill takes 2 s.
    let policy = Policy::new(
        "bucket",
        Algorithm::token_bucket(10, Duration::from_secs(1), 20),
    );
    let bucket = Bucket::of(&policy);
    let (store, limits, key) = bucket_store(&server, &policy);
    let acme = CallerKey::new("acme");

    // Drained to empty in steps of 1 to 3 tokens: each write moves the key's end further.
    let mut admitted = Vec::new();
    for cost in [1, 2, 3].into_iter().cycle() {
        let outcome = store.check(&acme, &limits, cost).await.unwrap();
        if !outcome.admitted() {
            break;
        }
        admitted.push((cost, outcome.counted_at_ms()));
        bucket.assert_ends_when_refilled(&server, &key, &format!("a decision of cost {cost}"));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    assert!(admitted.len() >= 9, "{admitted:?}");

    let (cost, counted_at) = admitted.pop().unwrap();
    store
        .refund(&acme, &limits, Refund::new(cost, counted_at))
        .await
        .unwrap();
    bucket.assert_ends_when_refilled(&server, &key, "a refund");

    // Whatever has refilled, leased at once: the bucket is empty again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grant = store.lease(&acme, &limits, 1, 100).unwrap().await.unwrap();
    assert!(grant.granted() >= 3, "{grant:?}");
    assert_eq!(grant.outcome().limits()[0].remaining, 0, "{grant:?}");
    bucket.assert_ends_when_refilled(&server, &key, "a lease");

    store
        .refund(
            &acme,
            &limits,
            Refund::new(1, grant.outcome().counted_at_ms()),
        )
        .await
        .unwrap();
    bucket.assert_ends_when_refilled(&server, &key, "a refund of a lease");
}

/// A bucket of 10 tokens a second, 20 at most, that `older_write` (a script: ARGV the level,
/// then how long a full refill takes) left empty in an older form. A refusal writes
/// nothing, so the older form stands (`still_older` says so); the first token refills from
/// its time, within 100 ms, and the admission that takes it writes the packed form, which
/// ends when it has refilled. Returns what a test goes on with.
async fn an_older_form_is_read_then_replaced(
    older_write: &str,
    still_older: impl Fn(&RedisServer, &str) -> bool,
) -> (RedisServer, Bucket, RedisBackend, Arc<[Policy]>, String) {
    let server = RedisServer::start();
    let policy = Policy::new(
        "bucket",
        Algorithm::token_bucket(10, Duration::from_secs(1), 20),
    );
    let bucket = Bucket::of(&policy);
    let (store, limits, key) = bucket_store(&server, &policy);
    let acme = CallerKey::new("acme");

    bucket.write_older(&server, older_write, &key, 0);
    let refused = store.check(&acme, &limits, 1).await.unwrap();
    assert!(!refused.admitted(), "{refused:?}");
    assert_eq!(refused.limits()[0].remaining, 0);
    assert!(still_older(&server, &key), "a refusal wrote the bucket");
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if store.check(&acme, &limits, 1).await.unwrap().admitted() {
            break;
        }
        assert!(Instant::now() < deadline, "no token came back in 1 s");
    }
    bucket.assert_ends_when_refilled(&server, &key, "a decision after the older form");
    (server, bucket, store, limits, key)
}

/// An older version of the script kept a bucket in a hash (l, t, and x, a time before which
/// the key did not expire): its state goes on, read from the hash, until a write replaces it.
#[tokio::test]
async fn a_bucket_an_older_script_wrote_is_read_then_replaced() {
    const HASH_WRITE: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], 'l', ARGV[1], 't', now, 'x', now + ARGV[2])
redis.call('PEXPIREAT', KEYS[1], now + ARGV[2])
return now
";
    let is_hash = |server: &RedisServer, key: &str| server.must(&["TYPE", key]).trim() == "hash";
    let (server, _, _, _, key) = an_older_form_is_read_then_replaced(HASH_WRITE, is_hash).await;
    assert_eq!(server.must(&["TYPE", &key]).trim(), "string");
}

/// Before the packed form, a bucket's key held the text "<level>:<time>": both scripts read
/// it (the lone bucket's decision, and the general one's lease), and their first write
/// replaces it.
#[tokio::test]
async fn a_bucket_in_the_text_form_is_read_then_replaced() {
    const TEXT_WRITE: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('SET', KEYS[1], string.format('%d:%d', ARGV[1], now), 'PXAT', now + ARGV[2])
return now
";
    // The text starts with a digit, the packed form with a zero byte.
    let is_text = |server: &RedisServer, key: &str| {
        let first = [
            "EVAL",
            "return string.byte(redis.call('GET', KEYS[1]))",
            "1",
            key,
        ];
        let first: u8 = server.must(&first).trim().parse().unwrap();
        first.is_ascii_digit()
    };
    let (server, bucket, store, limits, key) =
        an_older_form_is_read_then_replaced(TEXT_WRITE, is_text).await;

    // Two tokens, in the text form: the general script leases exactly those.
    bucket.write_older(&server, TEXT_WRITE, &key, 2 * bucket.period_ms);
    let acme = CallerKey::new("acme");
    let grant = store.lease(&acme, &limits, 1, 5).unwrap().await.unwrap();
    assert_eq!(grant.granted(), 2, "{grant:?}");
    bucket.assert_ends_when_refilled(&server, &key, "a lease after the text form");
}

#[tokio::test]
async fn a_bucket_is_written_with_its_end_in_one_command() {
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
    let mut last = 0;
    let mut writes = 0;
    for i in 0..300 {
        if i % 10 == 9 {
            let grant = store.lease(&acme, &limits, 1, 5).unwrap().await.unwrap();
            assert_eq!(grant.granted(), 5);
            writes += 1;
        } else if i % 10 == 5 {
            store
                .refund(&acme, &limits, Refund::new(1, last))
                .await
                .unwrap();
        } else {
            let outcome = store.check(&acme, &limits, 1).await.unwrap();
            assert!(outcome.admitted());
            last = outcome.counted_at_ms();
            writes += 1;
        }
    }
    bucket.assert_ends_when_refilled(&server, &key, "300 calls");
    // Every write is one SET (its end with it); refunds write too, unless the bucket had
    // refilled by then. Nothing else writes the key or its expiry.
    let sets = command_calls(&server, "set");
    assert!(
        (writes..=writes + 30).contains(&sets),
        "{sets} SETs for {writes} decisions and leases and 30 refunds"
    );
    for command in ["pexpire", "pexpireat", "hset", "hmget"] {
        assert_eq!(command_calls(&server, command), 0, "{command}");
    }
}
