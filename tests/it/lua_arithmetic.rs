//! The Lua that Redis runs and the Rust that the in-process backend runs are the same
//! arithmetic: the shipped lua/ files (the decision script itself, and the algorithm
//! modules refunds use), driven with explicit timestamps through a test-only harness, agree
//! with `Algorithm::evaluate_cost` and `Algorithm::refund` on every step of random
//! sequences of requests of random costs (above the quota included) and refunds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::{Algorithm, PolicyState};
use tollgate_testkit::redis::RedisServer;

/// The shipped lua/check.lua, run at `now` given as an argument instead of Redis's TIME,
/// for a decision, and lua/refund.lua's steps through the shipped algorithm modules for a
/// refund, so both sides can be stepped through the same instants. Arguments: kind, the
/// three policy numbers, now, cost, then the refunded decision's time or -1 to decide.
fn harness() -> String {
    [
        include_str!("../../lua/common.lua"),
        include_str!("../../lua/sliding_window.lua"),
        include_str!("../../lua/token_bucket.lua"),
        r#"
local algorithms = { sliding_window, token_bucket }
local algorithm = algorithms[tonumber(ARGV[1])]
local a, b, c, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, refund_of = tonumber(ARGV[6]), tonumber(ARGV[7])
if refund_of >= 0 then
  -- as lua/refund.lua does: nothing for a key that is gone
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local st = algorithm.load(KEYS[1], now, a, b, c)
    if algorithm.refund(st, refund_of, cost, a, b, c) then
      algorithm.store(KEYS[1], st, now, a, b, c)
    end
  end
  return {}
end
-- the parameters stand in for the script's ARGV and lua/clock.lua's `now`
local function check(ARGV, now)
"#,
        include_str!("../../lua/check.lua"),
        r#"
end
local reply = check({ ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6] }, now)
return { reply[2], reply[3], reply[4] }
"#,
    ]
    .concat()
}

fn args(algorithm: &Algorithm) -> [u64; 4] {
    match *algorithm {
        Algorithm::SlidingWindow { limit, window_ms } => [1, limit, window_ms, 0],
        Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        } => [2, rate, period_ms, burst],
        other => panic!("no script arguments for {other:?}"),
    }
}

fn algorithms() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1u64..200, 1_000u64..100_000).prop_map(|(limit, window)| Algorithm::sliding_window(
            limit,
            Duration::from_millis(window)
        )),
        (1u64..50, 1_000u64..60_000, 1u64..100).prop_map(|(rate, period, extra)| {
            // burst >= rate keeps the key's expiry (a full refill) at a second or more of
            // real time, longer than a case runs.
            Algorithm::token_bucket(rate, Duration::from_millis(period), rate + extra)
        }),
    ]
}

static CASE: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn lua_and_rust_agree(
        algorithm in algorithms(),
        steps in prop::collection::vec(
            (0u64..3_000, 1usize..6, 0u64..120, prop::bool::weighted(0.3), any::<prop::sample::Index>()),
            1..60,
        ),
    ) {
        thread_local! {
            static SERVER: RedisServer = RedisServer::start();
        }
        SERVER.with(|server| {
            let client = redis::Client::open(server.url()).unwrap();
            let mut connection = client.get_connection().unwrap();
            let script = redis::Script::new(&harness());
            let key = format!("case:{}", CASE.fetch_add(1, Ordering::Relaxed));
            let [kind, a, b, c] = args(&algorithm);

            // From the real clock: a token bucket's key expires at an absolute time
            // (PEXPIREAT) computed from `now`, which must not lie in the server's past.
            let mut now = u64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis(),
            )
            .unwrap();
            let mut state: Option<PolicyState> = None;
            // Admitted requests as (cost, when), the ones a refund may give back.
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (step, (advance, burst, percent, refund, which)) in steps.iter().enumerate() {
                now += advance;
                // Costs from 0 to a little over the quota.
                let cost = algorithm.quota() * percent / 100;
                // Any admitted request, so refunds come at random delays after their
                // decisions.
                if *refund && !admitted.is_empty() {
                    let (cost, counted_at) = admitted.remove(which.index(admitted.len()));
                    if let Some(given_back) = algorithm.refund(state, counted_at, cost, now) {
                        state = Some(given_back);
                    }
                    let _: Vec<u64> = script
                        .key(&key)
                        .arg(kind).arg(a).arg(b).arg(c).arg(now).arg(cost).arg(counted_at)
                        .invoke(&mut connection)
                        .unwrap();
                }
                for _ in 0..*burst {
                    let rust = algorithm.evaluate_cost(state, now, cost);
                    if rust.admitted {
                        state = Some(rust.admitted_state);
                        admitted.push((cost, now));
                    }
                    let lua: Vec<u64> = script
                        .key(&key)
                        .arg(kind).arg(a).arg(b).arg(c).arg(now).arg(cost).arg(-1)
                        .invoke(&mut connection)
                        .unwrap();
                    prop_assert_eq!(
                        lua,
                        vec![u64::from(rust.admitted), rust.outcome.remaining, rust.outcome.reset_ms],
                        "step {} at {} ms, cost {}, with {:?}", step, now, cost, algorithm
                    );
                }
            }
            Ok(())
        })?;
    }
}

/// The shipped Lua on a real redis-server, on explicit instants: burst 2, one token a
/// second; R1 at 0, R2 and R3 at 1.2 s (the bucket full again), R1 given back at 1.234 s.
/// Had R1 never counted, R4 at 1.234 s would be refused: the refund must not admit it.
#[test]
fn regression_a_lua_token_bucket_refund_never_adds_tokens_the_bucket_refilled() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_connection().unwrap();
    let script = redis::Script::new(&harness());
    let [kind, a, b, c] = args(&Algorithm::token_bucket(1, Duration::from_secs(1), 2));
    let start = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let mut step = |at: u64, refund_of: i64| -> Vec<u64> {
        script
            .key("bucket")
            .arg(kind)
            .arg(a)
            .arg(b)
            .arg(c)
            .arg(start + at)
            .arg(1)
            .arg(refund_of)
            .invoke(&mut connection)
            .unwrap()
    };
    assert_eq!(step(0, -1)[0], 1, "R1");
    assert_eq!(step(1_200, -1)[0], 1, "R2");
    assert_eq!(step(1_200, -1)[0], 1, "R3");
    step(1_234, i64::try_from(start).unwrap());
    let r4 = step(1_234, -1);
    assert_eq!(
        r4[0], 0,
        "R4 admitted after the refund: {r4:?} (admitted, remaining, reset)"
    );
}
