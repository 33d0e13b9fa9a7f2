//! The Lua that Redis runs and the Rust that the in-process backend runs are the same
//! arithmetic: the shipped lua/policies.lua (decisions, leases, refunds and charges),
//! driven with explicit timestamps through a test-only harness, agrees with
//! `PolicyState::evaluate`, `Algorithm::refund` and `Algorithm::charge` on every step of
//! random sequences of requests of random costs (above the quota included), leases,
//! refunds and charges past the quota (debts), for the sliding window, the token bucket
//! and the sliding log (a token bucket's decisions alternating with
//! lua/lone.lua made for the bucket, and a sliding window's with it made for the window,
//! their own scripts, on the same key); and after every step the key expires no earlier than its state
//! stops weighing in decisions, and no later than the longest such a state can weigh.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::Policy;
use tollgate::store::{Algorithm, PolicyOutcome, PolicyState};
use tollgate_testkit::redis::RedisServer;

/// The shipped lua/policies.lua, with the sections of lua/algorithm/ build.rs inserts, run at `now` given as an argument instead of Redis's TIME,
/// so both sides can be stepped through the same instants. Arguments: kind, the three
/// policy numbers, now, then the script's own trailing arguments (the cost, and for a
/// lease or a refund a number and the operation).
fn harness() -> String {
    [
        include_str!("../../lua/common.lua"),
        r#"
-- the parameters stand in for the script's ARGV and lua/clock.lua's `now`
local function policies(ARGV, now)
"#,
        include_str!(concat!(env!("OUT_DIR"), "/policies.lua")),
        r#"
end
local args = { ARGV[1], ARGV[2], ARGV[3], ARGV[4] }
for i = 6, #ARGV do
  args[#args + 1] = ARGV[i]
end
local reply = policies(args, tonumber(ARGV[5]))
if type(reply) == 'number' then
  return reply
end
return { reply[1], reply[2], reply[3], reply[4] }
"#,
    ]
    .concat()
}

/// The shipped script of a lone policy's decisions (lua/lone.lua, made for the algorithm
/// by build.rs), run at `now` given as an argument as [`harness`] runs
/// lua/policies.lua, with the same arguments: kind, the three policy numbers, now, the
/// cost. `packed` is the Lua that packs those the script reads into its one argument; its
/// packed reply is read back in the general script's shape.
fn lone_harness(script: &str, packed: &str) -> String {
    [
        "local function decide(ARGV, now)\n",
        script,
        "\nend\nlocal packed = ",
        packed,
        r#"
local admitted, remaining, reset = struct.unpack('<Bddd', decide({ packed }, tonumber(ARGV[5])))
return { admitted, admitted, remaining, reset }
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
        Algorithm::SlidingLog { limit, window_ms } => [3, limit, window_ms, 0],
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
        (1u64..200, 1_000u64..30_000).prop_map(|(limit, window)| Algorithm::sliding_log(
            limit,
            Duration::from_millis(window)
        )),
    ]
}

/// Asserts what the key of `algorithm` holds after `after` expires when its state stops
/// weighing in decisions, or after, and no later than the longest such a state can weigh:
/// - a sliding window's state (s, p, c) weighs until s + 2w while c > 0 (c becomes the
///   previous count at s + w), until s + w while only p > 0; it never weighs past s + 2w;
/// - a token bucket's level l at t weighs until it has refilled, t + ceil((capacity - l) /
///   rate), and its key ends exactly then;
/// - a sliding log's newest member at t weighs until t + w, and it was written no later
///   than `now`: its expiry is between the two.
fn assert_expiry(
    connection: &mut redis::Connection,
    key: &str,
    algorithm: &Algorithm,
    now: u64,
    after: &str,
) -> Result<(), TestCaseError> {
    let expires_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(connection)
        .unwrap();
    if expires_at == -2 {
        // never written: nothing to outlive
        return Ok(());
    }
    prop_assert!(
        expires_at >= 0,
        "after {}: {} has no expiry ({})",
        after,
        key,
        expires_at
    );
    let expires_at = expires_at as u64;
    match *algorithm {
        Algorithm::SlidingWindow { window_ms, .. } => {
            let (s, p, c): (u64, u64, u64) = redis::cmd("HMGET")
                .arg(key)
                .arg(&["s", "p", "c"])
                .query(connection)
                .unwrap();
            let weighs_until = if c > 0 {
                s + 2 * window_ms
            } else if p > 0 {
                s + window_ms
            } else {
                0
            };
            prop_assert!(
                weighs_until <= expires_at && expires_at <= s + 2 * window_ms,
                "after {}: {} (s {}, p {}, c {}) expires at {}, its state weighs until {}, \
                 and no state of that window past {}",
                after,
                key,
                s,
                p,
                c,
                expires_at,
                weighs_until,
                s + 2 * window_ms
            );
        }
        Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        } => {
            // The value and its expiry read together: a bucket that has refilled is gone.
            let (expires_at, stored): (i64, Option<Vec<u8>>) = redis::cmd("EVAL")
                .arg("return { redis.call('PEXPIRETIME', KEYS[1]), redis.call('GET', KEYS[1]) }")
                .arg(1)
                .arg(key)
                .query(connection)
                .unwrap();
            let Some(stored) = stored else {
                return Ok(());
            };
            let (level, updated) = crate::bucket_expiry::bucket_state(&stored)
                .unwrap_or_else(|| panic!("after {after}: {key} holds {stored:?}"));
            let refilled_at = updated + (burst * period_ms - level).div_ceil(rate);
            prop_assert!(
                expires_at >= 0 && expires_at as u64 == refilled_at,
                "after {}: {} (l {}, t {}) expires at {}, its level refills at {}",
                after,
                key,
                level,
                updated,
                expires_at,
                refilled_at
            );
        }
        Algorithm::SlidingLog { window_ms, .. } => {
            let newest: Vec<(String, u64)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(-1)
                .arg(-1)
                .arg("WITHSCORES")
                .query(connection)
                .unwrap();
            let newest = newest.first().map_or(0, |(_, score)| *score);
            prop_assert!(
                newest + window_ms <= expires_at && expires_at <= now + window_ms,
                "after {}: {} expires at {}, its newest member ({}) weighs until {}, \
                 and it was written by {}",
                after,
                key,
                expires_at,
                newest,
                newest + window_ms,
                now
            );
        }
        other => panic!("no script for {other:?}"),
    }
    Ok(())
}

/// What a step does.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Decides `burst` requests of the step's cost.
    Decide,
    /// Gives back one of the admitted requests (or leases), chosen at random.
    Refund,
    /// Leases up to the step's cost plus `extra` units, the cost at least 1.
    Lease { extra: u64 },
    /// Charges the step's cost whether or not it fits (past the quota: a debt).
    Charge,
}

fn steps() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => Just(Step::Decide),
        2 => Just(Step::Refund),
        2 => (0u64..120).prop_map(|extra| Step::Lease { extra }),
        2 => Just(Step::Charge),
    ]
}

static CASE: AtomicU64 = AtomicU64::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn lua_and_rust_agree(
        algorithm in algorithms(),
        steps in prop::collection::vec(
            (0u64..3_000, 1usize..6, 0u64..120, steps(), any::<prop::sample::Index>()),
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
            let bucket = redis::Script::new(&lone_harness(
                include_str!(concat!(env!("OUT_DIR"), "/lone_token_bucket.lua")),
                "struct.pack('<dddd', tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6]))",
            ));
            let window = redis::Script::new(&lone_harness(
                include_str!(concat!(env!("OUT_DIR"), "/lone_sliding_window.lua")),
                "struct.pack('<ddd', tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6]))",
            ));
            let key = format!("case:{}", CASE.fetch_add(1, Ordering::Relaxed));
            let [kind, a, b, c] = args(&algorithm);

            // From the real clock: keys expire at absolute times (PEXPIREAT) computed from
            // `now`, which must not lie in the server's past.
            let mut now = u64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis(),
            )
            .unwrap();
            let mut state: Option<PolicyState> = None;
            // Admitted requests and leases as (cost, when), the ones a refund may give back.
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (step, (advance, burst, percent, what, which)) in steps.iter().enumerate() {
                now += advance;
                // Costs from 0 to a little over the quota.
                let cost = algorithm.quota() * percent / 100;
                match *what {
                    // Any admitted request, so refunds come at random delays after their
                    // decisions.
                    Step::Refund if !admitted.is_empty() => {
                        let (cost, counted_at) = admitted.remove(which.index(admitted.len()));
                        if let Some(given_back) = algorithm.refund(state.clone(), counted_at, cost, now) {
                            state = Some(given_back);
                        }
                        let _: u64 = script
                            .key(&key)
                            .arg(kind).arg(a).arg(b).arg(c).arg(now)
                            .arg(cost).arg(counted_at).arg("refund")
                            .invoke(&mut connection)
                            .unwrap();
                        assert_expiry(&mut connection, &key, &algorithm, now, &format!("step {step}, a refund"))?;
                    }
                    Step::Refund => {}
                    Step::Lease { extra } => {
                        // As the lease's grant is made: the most every policy admits at
                        // once, up to the units wanted, or none below the cost.
                        let cost = cost.max(1);
                        let wanted = cost + extra * algorithm.quota() / 100;
                        let room = decide(&algorithm, state.clone(), now, 0).outcome.remaining;
                        let grant = room.min(wanted);
                        let rust = if grant >= cost {
                            let rust = decide(&algorithm, state.clone(), now, grant);
                            prop_assert!(rust.admitted, "a grant of {} refused: {:?}", grant, rust);
                            state = rust.admitted_state;
                            admitted.push((grant, now));
                            vec![grant, 1, rust.outcome.remaining, rust.outcome.reset_ms]
                        } else {
                            let rust = decide(&algorithm, state.clone(), now, cost);
                            vec![0, u64::from(rust.admitted), rust.outcome.remaining, rust.outcome.reset_ms]
                        };
                        let lua: Vec<u64> = script
                            .key(&key)
                            .arg(kind).arg(a).arg(b).arg(c).arg(now)
                            .arg(cost).arg(wanted).arg("lease")
                            .invoke(&mut connection)
                            .unwrap();
                        prop_assert_eq!(
                            lua, rust,
                            "step {} at {} ms, a lease of {} to {}, with {:?}", step, now, cost, wanted, algorithm
                        );
                        assert_expiry(&mut connection, &key, &algorithm, now, &format!("step {step}, a lease"))?;
                    }
                    Step::Charge => {
                        let (charged, outcome) = algorithm.charge(state.clone(), now, cost);
                        state = Some(charged);
                        admitted.push((cost, now));
                        let lua: Vec<u64> = script
                            .key(&key)
                            .arg(kind).arg(a).arg(b).arg(c).arg(now)
                            .arg(cost).arg(0).arg("charge")
                            .invoke(&mut connection)
                            .unwrap();
                        prop_assert_eq!(
                            lua, vec![1, 1, outcome.remaining, outcome.reset_ms],
                            "step {} at {} ms, a charge of {}, with {:?}", step, now, cost, algorithm
                        );
                        assert_expiry(&mut connection, &key, &algorithm, now, &format!("step {step}, a charge"))?;
                    }
                    Step::Decide => {
                        for request in 0..*burst {
                            let rust = decide(&algorithm, state.clone(), now, cost);
                            if rust.admitted {
                                state = rust.admitted_state;
                                admitted.push((cost, now));
                            }
                            // A token bucket's or a sliding window's decisions alternate
                            // between its own script and the one for every policy, on the
                            // same key.
                            let decides = match kind {
                                1 if (step + request) % 2 == 1 => &window,
                                2 if (step + request) % 2 == 1 => &bucket,
                                _ => &script,
                            };
                            let lua: Vec<u64> = decides
                                .key(&key)
                                .arg(kind).arg(a).arg(b).arg(c).arg(now).arg(cost)
                                .invoke(&mut connection)
                                .unwrap();
                            prop_assert_eq!(
                                &lua[1..],
                                &[u64::from(rust.admitted), rust.outcome.remaining, rust.outcome.reset_ms][..],
                                "step {} at {} ms, cost {}, with {:?}", step, now, cost, algorithm
                            );
                            prop_assert_eq!(lua[0], u64::from(rust.admitted));
                            assert_expiry(&mut connection, &key, &algorithm, now, &format!("step {step}, a decision"))?;
                        }
                    }
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
    // A decision at `at`, or with `refund_of` the refund of the decision made then.
    let mut step = |at: u64, refund_of: Option<u64>| -> Vec<u64> {
        let mut invocation = script.key("bucket");
        invocation
            .arg(kind)
            .arg(a)
            .arg(b)
            .arg(c)
            .arg(start + at)
            .arg(1);
        match refund_of {
            Some(counted_at) => {
                let _changed: u64 = invocation
                    .arg(start + counted_at)
                    .arg("refund")
                    .invoke(&mut connection)
                    .unwrap();
                Vec::new()
            }
            None => invocation.invoke(&mut connection).unwrap(),
        }
    };
    assert_eq!(step(0, None)[0], 1, "R1");
    assert_eq!(step(1_200, None)[0], 1, "R2");
    assert_eq!(step(1_200, None)[0], 1, "R3");
    step(1_234, Some(0));
    let r4 = step(1_234, None);
    assert_eq!(
        r4[0], 0,
        "R4 admitted after the refund: {r4:?} (admitted, remaining, reset)"
    );
}

/// One request of `cost` units against one policy, as a store decides it through
/// [`PolicyState::evaluate`]: whether it is admitted, the state to keep when it is, and the report.
#[derive(Debug)]
struct Decided {
    admitted: bool,
    admitted_state: Option<PolicyState>,
    outcome: PolicyOutcome,
}

fn decide(algorithm: &Algorithm, state: Option<PolicyState>, now: u64, cost: u64) -> Decided {
    let policies = [Policy::new("lua", *algorithm)];
    let (outcome, admitted) = PolicyState::evaluate(&policies, |_| state.clone(), now, cost);
    Decided {
        admitted: outcome.admitted(),
        admitted_state: admitted.map(|mut states| states.remove(0)),
        outcome: outcome.limits()[0],
    }
}
