//! Lockouts (`Policy::lock_out_for`) on a one-time-code route that counts only wrong codes:
//! four wrong codes and a right one pass; the fifth wrong code locks the caller out, right
//! codes included, with `Retry-After` the block's time left; a second instance on the same
//! store sees the block; limits swapped in with the same policy keep it; and it ends when
//! its time is over, the caller starting afresh. In process (on a `ManualClock`), on a real
//! redis-server and on a Redis Cluster (short lockouts, real time).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::Caller;
use tollgate::reload::Limits;
use tollgate::store::{Backend, CallerKey, ManualClock, Refund};
use tollgate::{Decision, InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer};
use tollgate_testkit::checks::admitted_burst;
use tollgate_testkit::http::{Reply, get, send};
use tollgate_testkit::recorder::{counter, with_recorder};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

type Otp = BoxCloneService<
    Request<Full<Bytes>>,
    Response<tollgate::response::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// The fifth wrong code within 10 minutes locks the caller out for `lockout`.
fn wrong_codes(lockout: Duration) -> Policy {
    Policy::sliding_window("wrong-codes", Quota::per_minutes(5, 10)).lock_out_for(lockout)
}

/// A one-time-code route: `?code=right` is 200, anything else 401, and only 401s count.
fn otp(limiter: &Limiter) -> Otp {
    let layer = RateLimitLayer::new(limiter.clone())
        .key(Caller::new("*"))
        .count_only(|response| response.status == StatusCode::UNAUTHORIZED);
    let handler = service_fn(|request: Request<Full<Bytes>>| async move {
        let mut response = Response::new(Full::new(Bytes::new()));
        if request.uri().query() != Some("code=right") {
            *response.status_mut() = StatusCode::UNAUTHORIZED;
        }
        Ok::<_, Infallible>(response)
    });
    BoxCloneService::new(ServiceBuilder::new().layer(layer).service(handler))
}

async fn attempt(service: &mut Otp, right: bool) -> Reply {
    let code = if right { "right" } else { "wrong" };
    send(service, get(&format!("/otp/verify?code={code}"), &[])).await
}

/// A refusal by the block: a 429 naming the policy, `Retry-After` within `retry_after`,
/// the RateLimit field at `r=0`.
fn assert_locked_out(reply: &Reply, retry_after: std::ops::RangeInclusive<u64>, what: &str) {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{what}");
    let secs = reply.retry_after().expect("a Retry-After");
    assert!(retry_after.contains(&secs), "{what}: Retry-After {secs}");
    let problem = reply.json();
    assert_eq!(problem["policy"], "wrong-codes", "{what}: {problem}");
    let fields = reply.policy_params("ratelimit");
    let (name, params) = &fields[0];
    assert_eq!(name, "wrong-codes");
    assert!(params.contains(&("r".to_owned(), 0)), "{what}: {params:?}");
}

/// Four wrong codes and two right ones on `a` and `b` (two limiters on one store), then a
/// fifth wrong code on `b`: every attempt on either is refused until the lockout is over,
/// limits swapped in on `a` keep the block. `retry_after` is the range the refusals'
/// `Retry-After` must fall in.
async fn lock_out(a: &Limiter, b: &Limiter, lockout: Duration, retry_after: (u64, u64)) {
    let (mut on_a, mut on_b) = (otp(a), otp(b));
    for i in 0..4 {
        assert_eq!(
            attempt(&mut on_a, false).await.status,
            401,
            "wrong code {i}"
        );
    }
    // The right code would be the fifth counted: it passes, and does not count.
    assert_eq!(attempt(&mut on_a, true).await.status, 200);
    assert_eq!(attempt(&mut on_b, true).await.status, 200);
    // The fifth wrong code reaches the handler, and starts the block.
    let fifth = attempt(&mut on_b, false).await;
    assert_eq!(fifth.status, 401, "the fifth wrong code is let through");
    let lockout_secs = i64::try_from(lockout.as_secs()).unwrap();
    assert_eq!(
        fifth.policy_params("ratelimit"),
        [(
            "wrong-codes".to_owned(),
            vec![("r".to_owned(), 0), ("t".to_owned(), lockout_secs)]
        )]
    );
    let range = retry_after.0..=retry_after.1;
    assert_locked_out(
        &attempt(&mut on_b, true).await,
        range.clone(),
        "the right code on b",
    );
    assert_locked_out(
        &attempt(&mut on_a, true).await,
        range.clone(),
        "the right code on a",
    );
    assert_locked_out(
        &attempt(&mut on_a, false).await,
        range.clone(),
        "a wrong code on a",
    );
    // The same limits swapped in: the block is kept under the policy's name.
    a.set_limits(Limits::new().policy(wrong_codes(lockout)))
        .unwrap();
    assert_locked_out(
        &attempt(&mut on_a, true).await,
        range.clone(),
        "after the swap",
    );
    // A wider quota under the same name keeps it too.
    b.set_limits(Limits::new().policy(
        Policy::sliding_window("wrong-codes", Quota::per_minutes(50, 10)).lock_out_for(lockout),
    ))
    .unwrap();
    assert_locked_out(&attempt(&mut on_b, true).await, range, "a wider quota");
    b.set_limits(Limits::new().policy(wrong_codes(lockout)))
        .unwrap();
}

/// After the block: the right code passes on both, and the caller starts afresh (the five
/// wrong codes before the block no longer weigh: four more are let through).
async fn after_the_block(a: &Limiter, b: &Limiter) {
    let (mut on_a, mut on_b) = (otp(a), otp(b));
    assert_eq!(
        attempt(&mut on_a, true).await.status,
        200,
        "the block is over"
    );
    assert_eq!(attempt(&mut on_b, true).await.status, 200);
    for i in 0..4 {
        assert_eq!(
            attempt(&mut on_b, false).await.status,
            401,
            "afresh: wrong code {i}"
        );
    }
}

fn in_process(store: &InMemoryBackend, clock: &ManualClock) -> Limiter {
    Limiter::builder()
        .name("otp")
        .backend(store.clone())
        .clock(clock.clone())
        .policy(wrong_codes(Duration::from_secs(600)))
        .build()
}

#[tokio::test]
async fn a_lockout_in_process() {
    let clock = ManualClock::new(1_000_000);
    let store = InMemoryBackend::new().clock(clock.clone());
    let (a, b) = (in_process(&store, &clock), in_process(&store, &clock));
    lock_out(&a, &b, Duration::from_secs(600), (600, 600)).await;
    // Retry-After counts down with the block.
    clock.advance(Duration::from_secs(60));
    let reply = attempt(&mut otp(&a), true).await;
    assert_locked_out(&reply, 540..=540, "a minute later");
    clock.advance(Duration::from_millis(539_999));
    let reply = attempt(&mut otp(&b), true).await;
    assert_locked_out(&reply, 1..=1, "a millisecond before the end");
    clock.advance(Duration::from_millis(1));
    after_the_block(&a, &b).await;
}

/// Below HTTP: the fifth check starts the block, and the refund of that check (it did not
/// count) lifts it; a refund of a check counted after the block began does not.
#[tokio::test]
async fn a_refund_of_the_request_that_used_the_quota_up_lifts_its_block() {
    let clock = ManualClock::new(1_000_000);
    let store = InMemoryBackend::new().clock(clock.clone());
    let limiter = in_process(&store, &clock);
    let ip = Caller::new("203.0.113.7");
    admitted_burst(&limiter, &ip, 4, "attempt").await;
    let fifth = limiter.check(&ip).await;
    assert!(fifth.is_allowed());
    assert!(!limiter.check(&ip).await.is_allowed(), "locked out");
    limiter.refund(&ip, &fifth).await.unwrap();
    let sixth = limiter.check(&ip).await;
    assert!(
        sixth.is_allowed(),
        "the block went with the refunded request"
    );
    let Decision::Limited(info) = limiter.check(&ip).await else {
        panic!("locked out again by the sixth");
    };
    assert_eq!(info.retry_after_secs(), 600);
    // A refund naming a later count than the block's start leaves it standing.
    let later = Refund::new(1, 1_000_001);
    let key = CallerKey::new("203.0.113.7");
    Backend::refund(&store, &key, &limiter.policies(), later)
        .await
        .unwrap();
    assert!(!limiter.check(&ip).await.is_allowed(), "still locked out");
}

/// A token bucket locks out too: 3 attempts at once empty it, and start the block.
async fn a_bucket_locks_out(limiter: &Limiter, lockout_secs: u64) {
    let ip = Caller::new(BUCKET_CALLER);
    admitted_burst(limiter, &ip, 3, "attempt").await;
    assert_blocked(limiter.check(&ip).await, "attempts", lockout_secs);
}

const BUCKET_CALLER: &str = "198.51.100.7";

fn attempts(lockout: Duration) -> Policy {
    Policy::token_bucket("attempts", Quota::per_hour(1), 3).lock_out_for(lockout)
}

/// A refusal by `policy`'s block, whose `Retry-After` is within a second of `lockout_secs`.
fn assert_blocked(decision: Decision, policy: &str, lockout_secs: u64) {
    let Decision::Limited(info) = decision else {
        panic!("locked out: {decision:?}");
    };
    assert_eq!(info.violated().next().map(|p| p.name()), Some(policy));
    assert!(
        (lockout_secs - 1..=lockout_secs).contains(&info.retry_after_secs()),
        "{}",
        info.retry_after_secs()
    );
}

/// `locks_out` on a limiter named "pin" with `policy` (a lockout of a minute) alone, in
/// process; a minute later the block is over, and `afresh` attempts of `caller` pass.
async fn in_process_for_a_minute(
    policy: fn(Duration) -> Policy,
    locks_out: impl AsyncFn(&Limiter, u64),
    caller: &str,
    afresh: usize,
) {
    let clock = ManualClock::new(5_000);
    let limiter = Limiter::builder()
        .name("pin")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .clock(clock.clone())
        .policy(policy(Duration::from_secs(60)))
        .build();
    locks_out(&limiter, 60).await;
    clock.advance(Duration::from_secs(60));
    admitted_burst(&limiter, &Caller::new(caller), afresh, "afresh: attempt").await;
}

/// Once the block is over the bucket is full again, though an hour's refill has not passed.
#[tokio::test]
async fn a_token_bucket_locks_out_in_process() {
    in_process_for_a_minute(attempts, a_bucket_locks_out, BUCKET_CALLER, 2).await;
}

fn logged(lockout: Duration) -> Policy {
    Policy::sliding_log("logged", Quota::per_hour(3)).lock_out_for(lockout)
}

const LOG_CALLER: &str = "192.0.2.9";

/// A sliding log locks out too; the refund of the check that used it up lifts the block,
/// and the log holds its count again (the next check uses it up once more).
async fn a_log_locks_out(limiter: &Limiter, lockout_secs: u64) {
    let ip = Caller::new(LOG_CALLER);
    admitted_burst(limiter, &ip, 2, "attempt").await;
    let third = limiter.check(&ip).await;
    assert!(third.is_allowed());
    assert!(!limiter.check(&ip).await.is_allowed(), "locked out");
    limiter.refund(&ip, &third).await.unwrap();
    assert!(
        limiter.check(&ip).await.is_allowed(),
        "the block went with the refund"
    );
    assert_blocked(limiter.check(&ip).await, "logged", lockout_secs);
}

#[tokio::test]
async fn a_sliding_log_locks_out_in_process() {
    in_process_for_a_minute(logged, a_log_locks_out, LOG_CALLER, 3).await;
}

#[test]
fn blocks_started_are_counted() {
    let ((), snapshot) = with_recorder(|_| async {
        let clock = ManualClock::new(0);
        let store = InMemoryBackend::new().clock(clock.clone());
        let limiter = in_process(&store, &clock);
        let ip = Caller::new("203.0.113.7");
        for _ in 0..7 {
            limiter.check(&ip).await;
        }
        clock.advance(Duration::from_secs(600));
        for _ in 0..5 {
            limiter.check(&ip).await;
        }
    });
    let lockouts = counter(
        &snapshot,
        "tollgate_lockouts_total",
        &[("layer", "otp"), ("policy", "wrong-codes")],
    );
    assert_eq!(lockouts, 2);
    let limited = counter(
        &snapshot,
        "tollgate_decisions_total",
        &[
            ("layer", "otp"),
            ("outcome", "limited"),
            ("policy", "wrong-codes"),
        ],
    );
    assert_eq!(limited, 2);
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::time::Duration;

    use tokio::time::Instant;
    use tollgate::{
        Caller, FailurePolicy, InstanceCount, Limiter, LimiterBuilder, Policy, RedisBackend,
        decision::DecisionSource,
    };
    use tollgate_testkit::checks::admitted_burst;
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use super::{after_the_block, lock_out, wrong_codes};

    /// A store timeout no healthy server on a loaded test machine reaches.
    const SLOW_TEST_MACHINE: Duration = Duration::from_secs(5);
    /// Short enough to wait out, long enough for the attempts made within it.
    const LOCKOUT: Duration = Duration::from_secs(3);

    fn limiter(store: RedisBackend, lockout: Duration) -> LimiterBuilder {
        Limiter::builder()
            .name("otp")
            .backend(store)
            .store_timeout(SLOW_TEST_MACHINE)
            .policy(wrong_codes(lockout))
    }

    /// A single node's store, under the test timeouts.
    async fn store(server: &RedisServer) -> RedisBackend {
        crate::redis_backend::connected(RedisBackend::builder(server.url())).await
    }

    async fn on(server: &RedisServer) -> Limiter {
        limiter(store(server).await, LOCKOUT).build()
    }

    /// The one-time-code limiter on `server`, failing closed, its lockout `lockout`.
    async fn closed_on(server: &RedisServer, lockout: Duration) -> Limiter {
        limiter(store(server).await, lockout)
            .on_store_failure(FailurePolicy::closed())
            .build()
    }

    /// A limiter named "pin" with `policy` alone, on `server`.
    async fn pin_on(server: &RedisServer, policy: Policy) -> Limiter {
        Limiter::builder()
            .name("pin")
            .backend(store(server).await)
            .store_timeout(SLOW_TEST_MACHINE)
            .policy(policy)
            .build()
    }

    /// The milliseconds `key` has left to live.
    fn pttl(server: &RedisServer, key: &str) -> i64 {
        server.must(&["PTTL", key]).trim().parse().unwrap()
    }

    async fn on_cluster(cluster: &RedisCluster) -> Limiter {
        let store =
            crate::redis_backend::connected(RedisBackend::cluster_builder(cluster.urls())).await;
        limiter(store, LOCKOUT).build()
    }

    #[tokio::test]
    async fn a_lockout_on_redis() {
        let server = RedisServer::start();
        let (a, b) = (on(&server).await, on(&server).await);
        lock_out(&a, &b, LOCKOUT, (1, 3)).await;
        // The block is a key of its own, expiring when it ends; the counter ends with it.
        let ttl = pttl(&server, "rl:{*}:otp:wrong-codes:lock");
        assert!((1..=3_000).contains(&ttl), "PTTL {ttl}");
        let counter_ttl = pttl(&server, "rl:{*}:otp:wrong-codes:w600000");
        assert!(
            counter_ttl <= ttl,
            "the counter outlives the block: {counter_ttl} > {ttl}"
        );
        tokio::time::sleep(Duration::from_millis(u64::try_from(ttl).unwrap() + 50)).await;
        after_the_block(&a, &b).await;
    }

    #[tokio::test]
    async fn a_token_bucket_locks_out_on_redis() {
        let server = RedisServer::start();
        let limiter = pin_on(&server, super::attempts(LOCKOUT)).await;
        super::a_bucket_locks_out(&limiter, LOCKOUT.as_secs()).await;
        // The bucket's key ends with the block, an hour's refill before it would have.
        let ttl = pttl(&server, "rl:{198.51.100.7}:pin:attempts:b3600000");
        assert!((1..=3_000).contains(&ttl), "PTTL {ttl}");
        tokio::time::sleep(LOCKOUT + Duration::from_millis(100)).await;
        let ip = Caller::new(super::BUCKET_CALLER);
        admitted_burst(&limiter, &ip, 2, "afresh: attempt").await;
    }

    #[tokio::test]
    async fn a_sliding_log_locks_out_on_redis() {
        let server = RedisServer::start();
        let limiter = pin_on(&server, super::logged(LOCKOUT)).await;
        super::a_log_locks_out(&limiter, LOCKOUT.as_secs()).await;
        tokio::time::sleep(LOCKOUT + Duration::from_millis(100)).await;
        let ip = Caller::new(super::LOG_CALLER);
        admitted_burst(&limiter, &ip, 3, "afresh: attempt").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lockout_on_a_redis_cluster() {
        let cluster = RedisCluster::start();
        let (a, b) = (on_cluster(&cluster).await, on_cluster(&cluster).await);
        lock_out(&a, &b, LOCKOUT, (1, 3)).await;
        tokio::time::sleep(LOCKOUT + Duration::from_millis(100)).await;
        after_the_block(&a, &b).await;
    }

    /// Decides `caller` on `limiter`, asking again while the decision is a fail-closed 503
    /// (the connection is being made again after a restart): at most for 10 s.
    async fn decided(limiter: &Limiter, caller: &Caller) -> tollgate::Decision {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let decision = limiter.check(caller).await;
            if !matches!(decision, tollgate::Decision::Unavailable { .. }) {
                return decision;
            }
            assert!(Instant::now() < deadline, "the store did not come back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Who decided a refusal, or `None` for an admission.
    fn refused_by(decision: &tollgate::Decision) -> Option<DecisionSource> {
        match decision {
            tollgate::Decision::Limited(info) => Some(info.source()),
            other => {
                assert!(other.is_allowed(), "{other:?}");
                None
            }
        }
    }

    /// A block lives in the store, so a store restarted without its data forgets it, and
    /// the instances disagree until the block would have ended: `a`, which started the
    /// block before the restart, keeps refusing the caller from its denial cache; `b`,
    /// which never decided for the caller, asks the empty store and admits it afresh, up
    /// to the quota, whose last unit starts a new block in the store. Once its cached
    /// refusal ends, `a` finds that new block. The lockout guide says so ("When the store
    /// loses its data").
    #[tokio::test]
    async fn regression_a_store_restarted_empty_keeps_a_block_only_on_the_instances_that_knew_it() {
        let lockout = Duration::from_secs(6);
        let mut server = RedisServer::start();
        let (a, b) = (
            closed_on(&server, lockout).await,
            closed_on(&server, lockout).await,
        );
        let ip = Caller::new("203.0.113.7");
        for i in 0..5 {
            assert_eq!(refused_by(&decided(&a, &ip).await), None, "attempt {i}");
        }
        // The fifth started the block, and `a` cached it as a refusal until the block ends:
        // it refuses the sixth without asking the store.
        assert_eq!(
            refused_by(&decided(&a, &ip).await),
            Some(DecisionSource::DenialCache)
        );
        let key = "rl:{203.0.113.7}:otp:wrong-codes:lock";
        let left = u64::try_from(pttl(&server, key)).unwrap();
        let block_ends = Instant::now() + Duration::from_millis(left);

        server.restart();
        assert_eq!(
            server.must(&["DBSIZE"]).trim(),
            "0",
            "restarted without data"
        );

        // For 2 s only `a` is asked: it refuses from its cache, with the old block's time
        // left, without asking the empty store.
        let b_starts = Instant::now() + Duration::from_secs(2);
        let (mut sent_to_a, mut refused_by_a) = cached_refusals(&a, &ip, b_starts, lockout).await;

        // `b` never decided for the caller: the empty store admits it afresh, and the
        // fifth unit starts a new block, which `b` caches as `a` cached the old one.
        let mut admitted_by_b = 0;
        let b_refused = loop {
            match refused_by(&decided(&b, &ip).await) {
                None => admitted_by_b += 1,
                Some(source) => break source,
            }
            assert!(admitted_by_b <= 5, "b admitted more than the quota");
        };
        let left = u64::try_from(pttl(&server, key)).unwrap();
        let new_block_ends = Instant::now() + Duration::from_millis(left);

        // `a` goes on refusing from its cache until the old block's end.
        let (sent, refused) =
            cached_refusals(&a, &ip, block_ends - Duration::from_millis(200), lockout).await;
        (sent_to_a, refused_by_a) = (sent_to_a + sent, refused_by_a + refused);
        eprintln!(
            "after the restart, until the old block's end: a refused {refused_by_a} of \
             {sent_to_a} from its cache; b admitted {admitted_by_b}, then refused \
             ({b_refused:?}) with a new block of {left} ms in the store"
        );
        assert!(sent_to_a > 0);
        assert_eq!(refused_by_a, sent_to_a, "a refuses from its cache");
        assert_eq!(admitted_by_b, 5, "b admits a fresh quota");
        assert_eq!(
            b_refused,
            DecisionSource::DenialCache,
            "b caches the new block"
        );

        // Past the old block's end, `a` asks the store, which holds b's block.
        tokio::time::sleep_until(block_ends + Duration::from_millis(300)).await;
        assert!(
            Instant::now() + Duration::from_millis(500) < new_block_ends,
            "the new block stands a while longer"
        );
        let after = decided(&a, &ip).await;
        assert_eq!(refused_by(&after), Some(DecisionSource::Store), "{after:?}");
    }

    /// The remedy the lockout guide gives: with the append-only file, a server killed and
    /// restarted reads its blocks back, and an instance that never decided for the caller
    /// refuses it too. `appendfsync always`, because under `everysec` Redis postpones the
    /// file's write while an earlier fsync is still running (up to 2 s on a busy disk), and
    /// a kill in that time loses the block however long ago it was acknowledged.
    #[tokio::test]
    async fn a_block_survives_a_restart_with_the_append_only_file() {
        let lockout = Duration::from_secs(600);
        let mut server =
            RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
        let (a, b) = (
            closed_on(&server, lockout).await,
            closed_on(&server, lockout).await,
        );
        let ip = Caller::new("203.0.113.7");
        for i in 0..5 {
            assert_eq!(refused_by(&decided(&a, &ip).await), None, "attempt {i}");
        }
        server.restart();
        let key = "rl:{203.0.113.7}:otp:wrong-codes:lock";
        assert_eq!(
            server.must(&["EXISTS", key]).trim(),
            "1",
            "the block was read back"
        );
        let refused = decided(&b, &ip).await;
        assert_eq!(
            refused_by(&refused),
            Some(DecisionSource::Store),
            "{refused:?}"
        );
        let secs = refused.info().unwrap().retry_after_secs();
        assert!((590..=600).contains(&secs), "Retry-After {secs}");
    }

    /// Asks `limiter` about `caller` every 100 ms until `until`; returns how many times it
    /// was asked and how many of those it refused from its denial cache, checking that each
    /// such refusal waits no longer than `lockout`.
    async fn cached_refusals(
        limiter: &Limiter,
        caller: &Caller,
        until: Instant,
        lockout: Duration,
    ) -> (u32, u32) {
        let (mut sent, mut refused) = (0, 0);
        while Instant::now() < until {
            sent += 1;
            let decision = decided(limiter, caller).await;
            if refused_by(&decision) == Some(DecisionSource::DenialCache) {
                refused += 1;
                let secs = decision.info().unwrap().retry_after_secs();
                assert!(secs <= lockout.as_secs(), "Retry-After {secs}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (sent, refused)
    }

    /// Redis down: a route that fails closed answers 503 whatever the block; a local share
    /// counts and blocks on its own.
    #[tokio::test]
    async fn with_the_store_down_the_failure_policy_applies() {
        let mut server = RedisServer::start();
        let store = || {
            RedisBackend::builder(server.url())
                .build()
                .expect("valid URL")
        };
        let closed = limiter(store(), Duration::from_secs(600))
            .on_store_failure(FailurePolicy::closed())
            .build();
        let shared = limiter(store(), Duration::from_secs(600))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(1)))
            .build();
        let ip = Caller::new("203.0.113.7");
        assert!(closed.check(&ip).await.is_allowed());
        server.kill();
        let refused = closed.check(&ip).await;
        assert!(
            matches!(refused, tollgate::Decision::Unavailable { .. }),
            "{refused:?}"
        );
        let other = Caller::new("198.51.100.1");
        for i in 0..5 {
            let decision = shared.check(&other).await;
            assert!(decision.is_allowed(), "attempt {i}: {decision:?}");
        }
        let tollgate::Decision::Limited(info) = shared.check(&other).await else {
            panic!("the share's own block");
        };
        assert_eq!(info.source(), DecisionSource::LocalShare);
        assert!(
            (599..=600).contains(&info.retry_after_secs()),
            "{}",
            info.retry_after_secs()
        );
    }
}
