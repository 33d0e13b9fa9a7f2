//! The two counting algorithms against independent reference models on a fake clock, the
//! worked example of the sliding window counter, several policies at once, plan tiers, and token bucket bursts.
//!
//! The models below are written from the definitions, not from the crate's code:
//!
//! - Sliding window counter: a map of fixed-window index to admitted count. At time `t`
//!   with window `w`, the current window is `t / w`, `elapsed = t % w`, and a request is
//!   admitted iff `prev * (w - elapsed) + (cur + 1) * w <= limit * w` (exact, in u128).
//! - Token bucket: the level as an exact rational `numerator / period_ms` tokens, refilled by
//!   `elapsed * rate / period_ms` tokens and capped at `burst`; a request takes one token.
//!
//! `remaining` is checked against the number of requests the model would still admit at the
//! same instant (found by simulation), and `reset_ms` is checked for exactness: at
//! `now + reset_ms` the model's remaining has grown by at least one (for a refused request:
//! the model admits), and at `now + reset_ms - 1` it has not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::{PolicyReport, RateLimitInfo};
use crate::store::algorithm::State;
use crate::store::{Algorithm, Backend, CallerKey, ManualClock, PolicyOutcome};
use crate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota};
use proptest::prelude::*;
use proptest::test_runner::Config;

// ---------------------------------------------------------------------------------------
// Reference models
// ---------------------------------------------------------------------------------------

/// What a reference model must answer, at any instant, without being changed.
trait Model {
    /// Whether one request at `t` would be admitted.
    fn admits(&self, t: u64) -> bool;
    /// Admits one request at `t` (only called when `admits(t)`).
    fn take(&mut self, t: u64);
    /// Counts `units` at `t` whether or not they fit: what a request admitted earlier
    /// turned out to cost beyond its reservation.
    fn charge(&mut self, t: u64, units: u64);
    /// The advertised quota: the most `remaining` can ever be.
    fn quota(&self) -> u64;

    /// How many requests in a row would be admitted at `t`, counted by simulating them on
    /// a copy of the model.
    fn remaining(&self, t: u64) -> u64
    where
        Self: Clone,
    {
        let mut copy = self.clone();
        let mut n = 0;
        while copy.admits(t) {
            copy.take(t);
            n += 1;
            assert!(
                n <= self.quota(),
                "model admitted more than its quota at once"
            );
        }
        n
    }
}

/// The sliding window counter as a map of fixed-window index to count.
#[derive(Clone, Debug)]
struct WindowModel {
    limit: u64,
    window_ms: u64,
    counts: BTreeMap<u64, u64>,
}

impl WindowModel {
    fn new(limit: u64, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            counts: BTreeMap::new(),
        }
    }

    fn count(&self, index: Option<u64>) -> u128 {
        index
            .and_then(|i| self.counts.get(&i))
            .map_or(0, |&c| u128::from(c))
    }
}

impl Model for WindowModel {
    fn admits(&self, t: u64) -> bool {
        let w = u128::from(self.window_ms);
        let index = t / self.window_ms;
        let elapsed = u128::from(t % self.window_ms);
        let prev = self.count(index.checked_sub(1));
        let cur = self.count(Some(index));
        prev * (w - elapsed) + (cur + 1) * w <= u128::from(self.limit) * w
    }

    fn take(&mut self, t: u64) {
        *self.counts.entry(t / self.window_ms).or_insert(0) += 1;
    }

    fn charge(&mut self, t: u64, units: u64) {
        *self.counts.entry(t / self.window_ms).or_insert(0) += units;
    }

    fn quota(&self) -> u64 {
        self.limit
    }
}

/// The token bucket, its level an exact rational: `numerator / period_ms` tokens, below 0
/// in debt (a charge past the bucket). A debt is whole milliseconds of refill, rounded up.
#[derive(Clone, Debug)]
struct BucketModel {
    rate: u64,
    period_ms: u64,
    burst: u64,
    numerator: i128,
    at_ms: u64,
}

impl BucketModel {
    fn new(rate: u64, period_ms: u64, burst: u64) -> Self {
        Self {
            rate,
            period_ms,
            burst,
            // A caller never seen has a full bucket.
            numerator: i128::from(burst) * i128::from(period_ms),
            at_ms: 0,
        }
    }

    /// The level at `t` (never before the last update), as a numerator over `period_ms`.
    fn numerator_at(&self, t: u64) -> i128 {
        assert!(t >= self.at_ms, "the fake clock never runs back");
        let refill = i128::from(t - self.at_ms) * i128::from(self.rate);
        let full = i128::from(self.burst) * i128::from(self.period_ms);
        (self.numerator + refill).min(full)
    }
}

impl Model for BucketModel {
    fn admits(&self, t: u64) -> bool {
        // At least one whole token.
        self.numerator_at(t) >= i128::from(self.period_ms)
    }

    fn take(&mut self, t: u64) {
        self.numerator = self.numerator_at(t) - i128::from(self.period_ms);
        self.at_ms = t;
    }

    fn charge(&mut self, t: u64, units: u64) {
        let left = self.numerator_at(t) - i128::from(units) * i128::from(self.period_ms);
        let rate = i128::from(self.rate);
        // A debt in whole milliseconds of refill.
        self.numerator = if left < 0 {
            -((-left + rate - 1) / rate * rate)
        } else {
            left
        };
        self.at_ms = t;
    }

    fn quota(&self) -> u64 {
        self.burst
    }
}

/// Checks one reported outcome against the model, after the model has taken the request
/// (if it was admitted): `remaining` as the model counts it, and `reset_ms` exact.
fn check_report<M: Model + Clone>(
    model: &M,
    now: u64,
    outcome: &PolicyOutcome,
    context: &str,
) -> Result<(), TestCaseError> {
    let remaining = model.remaining(now);
    prop_assert_eq!(outcome.remaining, remaining, "remaining; {}", context);
    if remaining >= model.quota() {
        prop_assert_eq!(outcome.reset_ms, 0, "reset of a full policy; {}", context);
        return Ok(());
    }
    let reset = outcome.reset_ms;
    let later = now
        .checked_add(reset)
        .ok_or_else(|| TestCaseError::fail(format!("reset_ms {reset} overflows; {context}")))?;
    prop_assert!(
        model.remaining(later) > remaining,
        "remaining has not grown after reset_ms {} (still {}); {}",
        reset,
        model.remaining(later),
        context
    );
    if remaining == 0 {
        prop_assert!(
            model.admits(later),
            "not admitted at now + reset_ms; {}",
            context
        );
    }
    // reset_ms > 0 here: the model's remaining at `now` is `remaining` itself.
    prop_assert!(
        reset > 0,
        "reset_ms 0 while remaining can grow; {}",
        context
    );
    prop_assert!(
        model.remaining(later - 1) <= remaining,
        "remaining grew already at now + reset_ms - 1 = {}, so reset_ms {} is late; {}",
        later - 1,
        reset,
        context
    );
    if remaining == 0 {
        prop_assert!(
            !model.admits(later - 1),
            "admitted already at now + reset_ms - 1; {}",
            context
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Generated inputs
// ---------------------------------------------------------------------------------------

/// One step of a generated run: move the clock, then send some requests.
#[derive(Clone, Copy, Debug)]
struct Step {
    /// How the raw number becomes a time step: 0 none, 1 a few ms, 2 within one scale, 3
    /// up to three scales (a window, or the time an empty bucket takes to fill).
    kind: u8,
    raw: u64,
    requests: u8,
    /// After a refusal, store the refused evaluation's (normalized, unchanged) state as a
    /// backend may, which must not change any later decision.
    store_refused: bool,
    /// Which caller sends the requests (backend runs only).
    caller: usize,
    /// Units charged after the requests whether or not they fit (0: none), as a settle
    /// of a request that cost more than it reserved does (direct runs only).
    charge: u64,
}

impl Step {
    fn advance(&self, scale: u64) -> u64 {
        match self.kind {
            0 => 0,
            1 => self.raw % 8,
            2 => self.raw % (scale + 1),
            _ => self.raw % (3 * scale + 1),
        }
    }
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let charge = prop_oneof![6 => Just(0u64), 1 => 1u64..=40];
    let step = (
        0u8..4,
        any::<u64>(),
        0u8..=4,
        any::<bool>(),
        0usize..2,
        charge,
    )
        .prop_map(
            |(kind, raw, requests, store_refused, caller, charge)| Step {
                kind,
                raw,
                requests,
                store_refused,
                caller,
                charge,
            },
        );
    prop::collection::vec(step, 1..100)
}

/// A start time: the epoch, a round number, or anywhere up to about the year 2300.
fn start_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1_000_000_000_000u64),
        0u64..10_000_000_000_000
    ]
}

fn window_params() -> impl Strategy<Value = (u64, u64)> {
    let window = prop_oneof![
        1u64..=20,
        21u64..=5_000,
        Just(1_000u64),
        Just(10_000u64),
        Just(60_000u64),
        Just(86_400_000u64),
    ];
    (1u64..=30, window)
}

fn bucket_params() -> impl Strategy<Value = (u64, u64, u64)> {
    let period = prop_oneof![1u64..=10, 11u64..=5_000, Just(1_000u64), Just(60_000u64)];
    (1u64..=20, period, 1u64..=30)
}

fn config() -> Config {
    Config {
        cases: 256,
        // Failures are reported with their minimal case; keep the tree free of
        // regression files.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Drives `algorithm` directly through `Algorithm::evaluate` and `peek` with explicit
/// timestamps, storing state the way a backend does, and compares with `model`.
fn run_direct<M: Model + Clone + std::fmt::Debug>(
    algorithm: Algorithm,
    mut model: M,
    scale: u64,
    start: u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut now = start;
    let mut state: Option<State> = None;
    for (i, step) in steps.iter().enumerate() {
        now += step.advance(scale);
        for j in 0..step.requests {
            let context = format!("{algorithm:?}, step {i} request {j}, now {now} ms");
            let expected = model.admits(now);

            let peeked = algorithm.peek(state.clone(), now);
            prop_assert_eq!(peeked.admitted, expected, "peek admitted; {}", context);
            check_report(&model, now, &peeked, &format!("peek; {context}"))?;

            let evaluation = algorithm.evaluate(state.clone(), now);
            prop_assert_eq!(evaluation.admitted, expected, "admitted; {}", context);
            prop_assert_eq!(
                evaluation.outcome.admitted,
                expected,
                "outcome; {}",
                context
            );
            if expected {
                model.take(now);
                state = Some(evaluation.admitted_state);
            } else {
                // Nothing consumed: the refusal reports what peek reported.
                prop_assert_eq!(evaluation.outcome, peeked, "refusal vs peek; {}", context);
                if step.store_refused {
                    state = Some(evaluation.admitted_state);
                }
            }
            check_report(&model, now, &evaluation.outcome, &context)?;

            // A state the algorithm calls idle decides exactly like no state at all.
            if let Some(s) = state.clone()
                && algorithm.is_idle_state(s.clone(), now)
            {
                prop_assert_eq!(
                    algorithm.evaluate(Some(s), now).outcome,
                    algorithm.evaluate(None, now).outcome,
                    "idle state differs from a fresh one; {}",
                    context
                );
            }
        }
        if step.charge > 0 {
            let context = format!(
                "{algorithm:?}, step {i}, a charge of {}, now {now} ms",
                step.charge
            );
            let charged = algorithm.charge_state(state.clone(), now, step.charge);
            model.charge(now, step.charge);
            state = Some(charged.admitted_state);
            check_report(&model, now, &charged.outcome, &context)?;
        }
    }
    Ok(())
}

/// One caller's models in a backend run: a sliding window and a token bucket.
#[derive(Clone, Debug)]
struct CallerModels {
    window: WindowModel,
    bucket: BucketModel,
}

/// A token bucket's level at `now`, in its units (one token is `period_ms` of them).
fn bucket_level(algorithm: &Algorithm, state: Option<State>, now: u64) -> u128 {
    match algorithm
        .evaluate_cost(state.clone(), now, 0)
        .admitted_state
    {
        State::TokenBucket { level, .. } => u128::from(level),
        other => panic!("not a token bucket's state: {other:?}"),
    }
}

proptest! {
    #![proptest_config(config())]

    /// Requests of random costs at random instants, some of them given back a random
    /// number of steps later: at every instant the bucket holds no more than a bucket that
    /// never counted the refunded requests and took the others exactly as this one did, so
    /// no refund admits a request that not counting would have refused.
    #[test]
    fn a_token_bucket_refund_never_admits_more_than_not_counting(
        (rate, period_ms, burst) in bucket_params(),
        start in start_ms(),
        steps in prop::collection::vec(
            (0u64..3_000, 1u64..=3, prop::bool::weighted(0.4), 0usize..6),
            1..80,
        ),
    ) {
        let algorithm = Algorithm::token_bucket(rate, Duration::from_millis(period_ms), burst);
        let capacity = u128::from(burst) * u128::from(period_ms);
        let mut state: Option<State> = None;
        // The bucket that never counted what is given back: its level and when.
        let (mut never, mut never_at) = (capacity, start);
        // Admitted requests to give back: (at step, cost, counted at).
        let mut pending: Vec<(usize, u64, u64)> = Vec::new();
        let mut now = start;
        for (i, &(advance, cost, refunded, after)) in steps.iter().enumerate() {
            now += advance;
            never = (never + u128::from(now - never_at) * u128::from(rate)).min(capacity);
            never_at = now;
            for &(_, cost, counted_at) in pending.iter().filter(|p| p.0 == i) {
                if let Some(given_back) = algorithm.refund_state(state.clone(), counted_at, cost, now) {
                    state = Some(given_back);
                }
            }
            pending.retain(|p| p.0 != i);
            prop_assert!(
                bucket_level(&algorithm, state.clone(), now) <= never,
                "step {}: {} units after the refunds, {} had they never counted",
                i, bucket_level(&algorithm, state.clone(), now), never
            );
            let decision = algorithm.evaluate_cost(state.clone(), now, cost);
            if decision.admitted {
                state = Some(decision.admitted_state);
                if refunded {
                    pending.push((i + 1 + after, cost, now));
                } else {
                    never -= u128::from(cost) * u128::from(period_ms);
                }
            }
        }
    }

    #[test]
    fn sliding_window_matches_the_model(
        (limit, window_ms) in window_params(),
        start in start_ms(),
        steps in steps(),
    ) {
        let algorithm = Algorithm::sliding_window(limit, Duration::from_millis(window_ms));
        prop_assert_eq!(algorithm.quota(), limit);
        prop_assert_eq!(algorithm.window_ms(), window_ms);
        run_direct(algorithm, WindowModel::new(limit, window_ms), window_ms, start, &steps)?;
    }

    #[test]
    fn token_bucket_matches_the_model(
        (rate, period_ms, burst) in bucket_params(),
        start in start_ms(),
        steps in steps(),
    ) {
        let algorithm = Algorithm::token_bucket(rate, Duration::from_millis(period_ms), burst);
        prop_assert_eq!(algorithm.quota(), burst);
        // The time an empty bucket takes to fill, rounded up to whole milliseconds.
        let fill_ms = (burst * period_ms).div_ceil(rate);
        prop_assert_eq!(algorithm.window_ms(), fill_ms);
        let mut model = BucketModel::new(rate, period_ms, burst);
        model.at_ms = start;
        run_direct(algorithm, model, fill_ms.max(1), start, &steps)?;
    }

    /// Both algorithms as two policies of one check on `InMemoryBackend`, with a
    /// `ManualClock`, two callers, and idle callers swept on every request: a request is
    /// admitted only when both models admit it, a refusal consumes nothing from either, and
    /// every policy's report matches its model.
    #[test]
    fn in_memory_backend_matches_the_models(
        (limit, window_ms) in window_params(),
        (rate, period_ms, burst) in bucket_params(),
        bucket_first in any::<bool>(),
        start in start_ms(),
        steps in steps(),
    ) {
        let clock = ManualClock::new(start);
        let backend = InMemoryBackend::new()
            .shards(1)
            .sweep_interval(Duration::from_millis(1))
            .clock(clock.clone());
        let window = Policy::new(
            "window",
            Algorithm::sliding_window(limit, Duration::from_millis(window_ms)),
        );
        let bucket = Policy::new(
            "bucket",
            Algorithm::token_bucket(rate, Duration::from_millis(period_ms), burst),
        );
        let limits: Arc<[Policy]> = if bucket_first {
            vec![bucket, window].into()
        } else {
            vec![window, bucket].into()
        };
        let (wi, bi) = if bucket_first { (1, 0) } else { (0, 1) };
        let callers = [CallerKey::new("acme"), CallerKey::new("acme}")];
        let fresh = CallerModels {
            window: WindowModel::new(limit, window_ms),
            bucket: {
                let mut b = BucketModel::new(rate, period_ms, burst);
                b.at_ms = start;
                b
            },
        };
        let mut models = [fresh.clone(), fresh];
        let fill_ms = (burst * period_ms).div_ceil(rate);
        let mut now = start;
        for (i, step) in steps.iter().enumerate() {
            // Alternate the scale between the two policies' natural time scales.
            let scale = if step.raw % 2 == 0 { window_ms } else { fill_ms.max(1) };
            let advance = step.advance(scale);
            clock.advance(Duration::from_millis(advance));
            now += advance;
            let m = &mut models[step.caller];
            for j in 0..step.requests {
                let context = format!(
                    "window {limit}/{window_ms} ms, bucket {rate}/{period_ms} ms burst {burst}, \
                     caller {}, step {i} request {j}, now {now} ms",
                    step.caller
                );
                let window_admits = m.window.admits(now);
                let bucket_admits = m.bucket.admits(now);
                let outcome = backend
                    .check(&callers[step.caller], &limits, 1)
                    .try_take_ready()
                    .expect("the in-process backend answers at once")
                    .expect("the in-process backend never fails");
                let reports = outcome.limits();
                prop_assert_eq!(reports.len(), 2);
                prop_assert_eq!(
                    outcome.admitted(),
                    window_admits && bucket_admits,
                    "admitted; {}",
                    context
                );
                prop_assert_eq!(reports[wi].admitted, window_admits, "window; {}", context);
                prop_assert_eq!(reports[bi].admitted, bucket_admits, "bucket; {}", context);
                if window_admits && bucket_admits {
                    m.window.take(now);
                    m.bucket.take(now);
                }
                check_report(&m.window, now, &reports[wi], &format!("window; {context}"))?;
                check_report(&m.bucket, now, &reports[bi], &format!("bucket; {context}"))?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worked example
// ---------------------------------------------------------------------------------------

/// The worked example: a 10-second window with a limit of 10.
#[test]
fn worked_example_ten_second_window() {
    let algorithm = Algorithm::sliding_window(10, Duration::from_secs(10));
    let mut state = None;

    // At 19.0 s we are 9 s into the fixed window [10 s, 20 s); the window before it, [0 s,
    // 10 s), is empty. Each request costs a whole window's weight: 10 requests make
    // 10 x 10,000 = 100,000 <= 10 x 10,000, so all 10 are admitted.
    for n in 1..=10 {
        let e = algorithm.evaluate(state.clone(), 19_000);
        assert!(e.admitted, "request {n} at 19.0 s");
        assert_eq!(e.outcome.remaining, 10 - n);
        state = Some(e.admitted_state);
    }
    // An 11th at 19.0 s would make 11 x 10,000 > 100,000: refused. It can come back only
    // in the next window, once enough of these 10 has slid out: 21.0 s (see below), 2 s on.
    let eleventh = algorithm.evaluate(state.clone(), 19_000);
    assert!(!eleventh.admitted);
    assert_eq!(eleventh.outcome.remaining, 0);
    assert_eq!(eleventh.outcome.reset_ms, 2_000);

    // At 20.5 s we are 0.5 s into [20 s, 30 s): the previous window's 10 requests still
    // overlap the sliding window by (10 - 0.5) / 10 = 95%, weighing 10 x 0.95 = 9.5. One
    // more request makes 9.5 + 1 = 10.5 > 10: refused. In integers (ms):
    // 10 x (10,000 - 500) + 1 x 10,000 = 105,000 > 10 x 10,000 = 100,000.
    let at_20_5 = algorithm.evaluate(state.clone(), 20_500);
    assert!(!at_20_5.admitted);
    assert_eq!(at_20_5.outcome.remaining, 0);
    // It fits once 10 x (10,000 - elapsed) + 10,000 <= 100,000, i.e. elapsed >= 1,000 ms:
    // at 21.0 s, 500 ms after 20.5 s.
    assert_eq!(at_20_5.outcome.reset_ms, 500);

    // At 20.999 s: 10 x 9,001 + 10,000 = 100,010 > 100,000, still refused.
    assert!(!algorithm.evaluate(state.clone(), 20_999).admitted);
    // At 21.0 s: 10 x 9,000 + 10,000 = 100,000 <= 100,000, admitted.
    let at_21 = algorithm.evaluate(state.clone(), 21_000);
    assert!(at_21.admitted);
    assert_eq!(at_21.outcome.remaining, 0);
}

/// The same example through the limiter, the in-process backend and a manual clock.
#[tokio::test]
async fn worked_example_through_the_limiter() {
    let clock = ManualClock::new(19_000);
    let limiter = Limiter::builder()
        .name("algorithms")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::sliding_window(
            "ten-seconds",
            Quota::new(10, Duration::from_secs(10)),
        ))
        .build();
    let acme = Caller::new("acme");
    for n in 1..=10 {
        let decision = limiter.check(&acme).await;
        assert!(matches!(decision, Decision::Allowed(_)), "request {n}");
    }
    assert!(matches!(limiter.check(&acme).await, Decision::Limited(_)));
    clock.set(20_500);
    let info = limited(limiter.check(&acme).await);
    let report = only(&info);
    assert_eq!(report.remaining(), 0);
    // 500 ms, rounded up to whole seconds for the headers.
    assert_eq!(report.reset_secs(), 1);
    assert_eq!(info.retry_after_secs(), 1);
    clock.set(20_999);
    assert!(matches!(limiter.check(&acme).await, Decision::Limited(_)));
    clock.set(21_000);
    assert!(matches!(limiter.check(&acme).await, Decision::Allowed(_)));
}

// ---------------------------------------------------------------------------------------
// Several policies
// ---------------------------------------------------------------------------------------

fn allowed(decision: Decision) -> RateLimitInfo {
    match decision {
        Decision::Allowed(info) => info,
        other => panic!("expected Allowed, got {other:?}"),
    }
}

fn limited(decision: Decision) -> RateLimitInfo {
    match decision {
        Decision::Limited(info) => info,
        other => panic!("expected Limited, got {other:?}"),
    }
}

fn only(info: &RateLimitInfo) -> PolicyReport<'_> {
    assert_eq!(info.policies().len(), 1, "{info:?}");
    info.policy(0).expect("a policy")
}

fn report<'a>(info: &'a RateLimitInfo, name: &str) -> PolicyReport<'a> {
    info.policies()
        .find(|p| p.name() == name)
        .unwrap_or_else(|| panic!("no report for {name:?} in {info:?}"))
}

fn violated(info: &RateLimitInfo) -> Vec<&str> {
    info.violated().map(|p| p.name()).collect()
}

const DAY_MS: u64 = 86_400_000;

fn per_second_and_per_day(clock: &ManualClock) -> Limiter {
    Limiter::builder()
        .name("algorithms")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(7)))
        .build()
}

#[tokio::test]
async fn refused_by_per_day_consumes_nothing_from_per_second() {
    // The start of a day (and of a second), with nothing counted the day before.
    let clock = ManualClock::new(20_000 * DAY_MS);
    let limiter = per_second_and_per_day(&clock);
    let acme = Caller::new("acme");

    // Second 1: five admitted; per-day has 2 left.
    for n in 1..=5u64 {
        let info = allowed(limiter.check(&acme).await);
        assert_eq!(report(&info, "per-second").remaining(), 5 - n);
        assert_eq!(report(&info, "per-day").remaining(), 7 - n);
    }
    // Two seconds later, the per-second window has slid past them.
    clock.advance(Duration::from_secs(2));
    for n in 1..=2u64 {
        let info = allowed(limiter.check(&acme).await);
        assert_eq!(report(&info, "per-second").remaining(), 5 - n);
        assert_eq!(report(&info, "per-day").remaining(), 2 - n);
    }

    // per-day is spent. Every further request in this second is refused by per-day alone,
    // and per-second keeps its 3: were refused requests counted, it would reach 0 after
    // three more and start refusing too.
    for _ in 0..10 {
        let info = limited(limiter.check(&acme).await);
        assert_eq!(violated(&info), ["per-day"]);
        let per_second = report(&info, "per-second");
        assert_eq!(per_second.remaining(), 3);
        assert!(!per_second.is_exhausted());
        let per_day = report(&info, "per-day");
        assert_eq!(per_day.remaining(), 0);
        assert!(per_day.is_exhausted());
        assert_eq!(per_day.quota(), 7);
        assert_eq!(per_day.window_secs(), 86_400);
        // The client must wait for per-day, which is most of a day away.
        assert_eq!(info.retry_after_secs(), per_day.reset_secs());
        assert!(info.retry_after_secs() > 86_000, "{info:?}");
    }
    // Later the same day, per-second is full again and per-day still refuses.
    clock.advance(Duration::from_secs(60));
    let info = limited(limiter.check(&acme).await);
    assert_eq!(violated(&info), ["per-day"]);
    assert_eq!(report(&info, "per-second").remaining(), 5);
}

#[tokio::test]
async fn refused_by_per_second_consumes_nothing_from_per_day() {
    let clock = ManualClock::new(20_000 * DAY_MS);
    let limiter = per_second_and_per_day(&clock);
    let acme = Caller::new("acme");

    for _ in 0..5 {
        allowed(limiter.check(&acme).await);
    }
    // per-second is spent; per-day has 2 left and keeps them through these refusals.
    for _ in 0..20 {
        let info = limited(limiter.check(&acme).await);
        assert_eq!(violated(&info), ["per-second"]);
        assert_eq!(report(&info, "per-day").remaining(), 2);
        assert!(!report(&info, "per-day").is_exhausted());
        assert_eq!(report(&info, "per-second").remaining(), 0);
        // Window [1 s, 2 s) holds 5 at full weight; at 1 s + e one more fits once
        // 5 x (1,000 - e) + 1,000 <= 5,000, e >= 200 ms: 1.2 s, 1.2 s from now -> t = 2.
        assert_eq!(report(&info, "per-second").reset_secs(), 2);
        assert_eq!(info.retry_after_secs(), 2);
    }
    // Once per-second admits again, per-day still has exactly 2.
    clock.advance(Duration::from_secs(2));
    let info = allowed(limiter.check(&acme).await);
    assert_eq!(report(&info, "per-day").remaining(), 1);
    let info = allowed(limiter.check(&acme).await);
    assert_eq!(report(&info, "per-day").remaining(), 0);
    let info = limited(limiter.check(&acme).await);
    assert_eq!(violated(&info), ["per-day"]);
}

#[tokio::test]
async fn callers_do_not_share_counters() {
    let clock = ManualClock::new(20_000 * DAY_MS);
    let limiter = per_second_and_per_day(&clock);
    for _ in 0..5 {
        allowed(limiter.check(&Caller::new("acme")).await);
    }
    limited(limiter.check(&Caller::new("acme")).await);
    let info = allowed(limiter.check(&Caller::new("acme}")).await);
    assert_eq!(report(&info, "per-second").remaining(), 4);
    assert_eq!(report(&info, "per-day").remaining(), 6);
}

// ---------------------------------------------------------------------------------------
// Tiers
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn tiers_choose_the_quota() {
    let clock = ManualClock::new(1_000_000);
    let limiter = Limiter::builder()
        .name("algorithms")
        .backend(InMemoryBackend::new().clock(clock.clone()))
        .policy(Policy::sliding_window("per-second", Quota::per_second(2)))
        .tier(
            "gold",
            [Policy::sliding_window("per-second", Quota::per_second(6))],
        )
        .build();

    let gold = Caller::new("acme").with_tier("gold");
    for n in 1..=6u64 {
        let info = allowed(limiter.check(&gold).await);
        assert_eq!(only(&info).quota(), 6);
        assert_eq!(only(&info).remaining(), 6 - n);
    }
    let info = limited(limiter.check(&gold).await);
    assert_eq!(only(&info).quota(), 6);

    for (key, caller) in [
        ("globex", Caller::new("globex").with_tier("platinum")),
        ("initech", Caller::new("initech")),
    ] {
        for n in 1..=2u64 {
            let info = allowed(limiter.check(&caller).await);
            assert_eq!(only(&info).quota(), 2, "{key}");
            assert_eq!(only(&info).remaining(), 2 - n, "{key}");
        }
        let info = limited(limiter.check(&caller).await);
        assert_eq!(only(&info).quota(), 2, "{key}");
        assert_eq!(violated(&info), ["per-second"], "{key}");
    }
}

// ---------------------------------------------------------------------------------------
// Token bucket: a burst, then the steady rate
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn token_bucket_burst_then_steady_rate() {
    let start = 5_000_000;
    let clock = ManualClock::new(start);
    let backend = InMemoryBackend::new().clock(clock.clone());
    let limiter = Limiter::builder()
        .name("algorithms")
        .backend(backend.clone())
        // 10 a second on average (one token per 100 ms), bursts of up to 20.
        .policy(Policy::token_bucket("smooth", Quota::per_second(10), 20))
        .build();
    let acme = Caller::new("acme");

    // A full bucket: a burst of 20 at one instant, then a refusal.
    for n in 1..=20u64 {
        let info = allowed(limiter.check(&acme).await);
        let report = only(&info);
        assert_eq!(report.quota(), 20);
        // An empty bucket fills in 20 / 10 per s = 2 s.
        assert_eq!(report.window_secs(), 2);
        assert_eq!(report.remaining(), 20 - n);
    }
    let info = limited(limiter.check(&acme).await);
    assert_eq!(only(&info).remaining(), 0);
    assert_eq!(only(&info).reset_secs(), 1);

    // The exact wait, in milliseconds, from the backend: one token takes 100 ms.
    let limits: Arc<[Policy]> = limiter.policies().to_vec().into();
    let exact = |backend: &InMemoryBackend| {
        backend
            .check(acme.key(), &limits, 1)
            .try_take_ready()
            .expect("ready")
            .expect("ok")
            .limits()[0]
    };
    let refused = exact(&backend);
    assert!(!refused.admitted);
    assert_eq!(refused.reset_ms, 100);

    // Then the steady rate: for 5 s, exactly one request per 100 ms gets through.
    let mut admitted = 0;
    for _ in 0..50 {
        clock.advance(Duration::from_millis(99));
        assert!(
            matches!(limiter.check(&acme).await, Decision::Limited(_)),
            "a token after only 99 ms"
        );
        clock.advance(Duration::from_millis(1));
        assert!(matches!(limiter.check(&acme).await, Decision::Allowed(_)));
        admitted += 1;
        assert!(matches!(limiter.check(&acme).await, Decision::Limited(_)));
    }
    assert_eq!(admitted, 50);

    // Half a token, then the other half.
    clock.advance(Duration::from_millis(50));
    assert_eq!(exact(&backend).reset_ms, 50);
    clock.advance(Duration::from_millis(50));
    assert!(exact(&backend).admitted);

    // A long rest refills only up to the burst.
    clock.advance(Duration::from_secs(60));
    for _ in 0..20 {
        allowed(limiter.check(&acme).await);
    }
    limited(limiter.check(&acme).await);
}

#[test]
fn token_bucket_refills_fractional_rates_exactly() {
    // 3 tokens per 1,000 ms: one token every 333.33 ms, bursts of 2.
    let algorithm = Algorithm::token_bucket(3, Duration::from_secs(1), 2);
    let first = algorithm.evaluate(None, 0);
    let second = algorithm.evaluate(Some(first.admitted_state), 0);
    assert!(first.admitted && second.admitted);
    let state = Some(second.admitted_state);
    // Empty now. 333 ms give 999/1000 of a token; 334 ms a whole one.
    let refused = algorithm.evaluate(state.clone(), 0);
    assert!(!refused.admitted);
    assert_eq!(refused.outcome.reset_ms, 334);
    assert!(!algorithm.evaluate(state.clone(), 333).admitted);
    assert!(algorithm.evaluate(state.clone(), 334).admitted);
    // The fractions carry over: admitted at 334 ms (2/1000 of a token left), 667 ms (1/1000)
    // and 1,000 ms (none): three in the first second, as the rate says.
    let mut state = state;
    let admitted: Vec<u64> = (1..=1_000u64)
        .filter(|&t| {
            let e = algorithm.evaluate(state.clone(), t);
            if e.admitted {
                state = Some(e.admitted_state);
            }
            e.admitted
        })
        .collect();
    assert_eq!(admitted, [334, 667, 1_000]);
}

#[test]
fn token_bucket_loses_what_overflows_the_burst() {
    // The same rate with a burst of 1: the 2/1000 of a token beyond a full bucket at
    // 334 ms is lost, so the next token comes 334 ms later, not 333.
    let algorithm = Algorithm::token_bucket(3, Duration::from_secs(1), 1);
    let mut state = Some(algorithm.evaluate(None, 0).admitted_state);
    let admitted: Vec<u64> = (1..=1_002u64)
        .filter(|&t| {
            let e = algorithm.evaluate(state.clone(), t);
            if e.admitted {
                state = Some(e.admitted_state);
            }
            e.admitted
        })
        .collect();
    assert_eq!(admitted, [334, 668, 1_002]);
}

// ---------------------------------------------------------------------------------------
// How far the sliding window counter can go over its quota
// ---------------------------------------------------------------------------------------

/// The requests of `arrivals` (ms, in order) that the sliding window counter of `quota`
/// per `window_ms` admits, by the crate's own arithmetic.
fn admitted_by_the_counter(quota: u64, window_ms: u64, arrivals: &[u64]) -> Vec<u64> {
    let counter = Algorithm::sliding_window(quota, Duration::from_millis(window_ms));
    let mut state = None;
    let mut admitted = Vec::new();
    for &t in arrivals {
        let evaluation = counter.evaluate(state.clone(), t);
        if evaluation.admitted {
            state = Some(evaluation.admitted_state);
            admitted.push(t);
        }
    }
    admitted
}

/// For each admitted request, how many were admitted in the window of `window_ms` ending
/// with it: the most of them, and the mean excess over `quota`, as shares of `quota`.
fn over_the_quota(quota: u64, window_ms: u64, admitted: &[u64]) -> (f64, f64) {
    let (mut worst, mut excess) = (0u64, 0u64);
    for (i, &t) in admitted.iter().enumerate() {
        let first = admitted.partition_point(|&a| a + window_ms <= t);
        let in_window = (i - first + 1) as u64;
        worst = worst.max(in_window);
        excess += in_window.saturating_sub(quota);
    }
    let q = quota as f64;
    (worst as f64 / q, excess as f64 / admitted.len() as f64 / q)
}

/// Deterministic exponential gaps (a Poisson process) from a fixed-seed xorshift.
fn poisson(rate_per_ms: f64, until_ms: u64, seed: u64) -> Vec<u64> {
    let mut x = seed;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (mut t, mut arrivals) = (0.0f64, Vec::new());
    loop {
        t += -uniform().ln() / rate_per_ms;
        if t >= until_ms as f64 {
            return arrivals;
        }
        arrivals.push(t as u64);
    }
}

/// The bound the docs of `Policy::sliding_window` state, measured: a full quota at the end
/// of one fixed window and the rest of the next one admit 2q - 1 within one window (5 per
/// 10 s: 9 within 8.1 s), never more. On steady random traffic over the quota the busiest
/// window stays well under that and the excess over q averages about 1% of q at most;
/// floods after quiet spells come near the worst case. Prints the figures the docs quote.
#[test]
fn the_sliding_window_counter_admits_under_twice_its_quota_in_any_window() {
    // The worst case: q at the last moment of a window, then a request every ms.
    for (quota, window_ms) in [(5, 10_000), (5, 900_000), (100, 1_000), (1_000, 60_000)] {
        let mut arrivals = vec![window_ms - 1; quota as usize];
        arrivals.extend(window_ms..2 * window_ms);
        let admitted = admitted_by_the_counter(quota, window_ms, &arrivals);
        let (worst, _) = over_the_quota(quota, window_ms, &admitted);
        let worst = (worst * quota as f64).round() as u64;
        eprintln!("{quota} per {window_ms} ms, worst case: {worst} in one window");
        assert_eq!(worst, 2 * quota - 1);
    }
    // The case of the docs.
    let mut arrivals = vec![9_900; 5];
    arrivals.extend((10_000..=19_800).step_by(100));
    let admitted = admitted_by_the_counter(5, 10_000, &arrivals);
    assert_eq!(
        admitted,
        [
            9_900, 9_900, 9_900, 9_900, 9_900, 12_000, 14_000, 16_000, 18_000
        ]
    );

    for (quota, window_ms, windows) in
        [(5, 900_000, 2_000), (100, 1_000, 200), (1_000, 60_000, 100)]
    {
        let twice = (2 * quota - 1) as f64 / quota as f64;
        for load in [1.1, 2.0, 10.0] {
            let rate = load * quota as f64 / window_ms as f64;
            let arrivals = poisson(rate, windows * window_ms, 0x9e37_79b9_7f4a_7c15);
            let admitted = admitted_by_the_counter(quota, window_ms, &arrivals);
            let (worst, mean_excess) = over_the_quota(quota, window_ms, &admitted);
            eprintln!(
                "{quota} per {window_ms} ms, random traffic at {load}x: busiest window {worst:.3} q, \
                 mean excess {:.3}% of q",
                mean_excess * 100.0
            );
            assert!(worst <= twice, "{worst}");
            assert!(mean_excess < 0.015, "{mean_excess}");
        }
        // Bursty: floods at 10x the quota for 0.1 to 1 window, then silence for up to two.
        let mut arrivals = Vec::new();
        let mut offset = 0;
        for burst in 0..windows / 2 {
            let on = window_ms / 10 + (burst * 7_919 % 9) * window_ms / 10;
            let flood = poisson(10.0 * quota as f64 / window_ms as f64, on, 0x5eed ^ burst);
            arrivals.extend(flood.into_iter().map(|t| offset + t));
            offset += on + (burst * 104_729 % 20) * window_ms / 10;
        }
        let admitted = admitted_by_the_counter(quota, window_ms, &arrivals);
        let (worst, mean_excess) = over_the_quota(quota, window_ms, &admitted);
        eprintln!(
            "{quota} per {window_ms} ms, bursty traffic: busiest window {worst:.3} q, mean \
             excess {:.3}% of q",
            mean_excess * 100.0
        );
        assert!(worst <= twice, "{worst}");
    }
}
