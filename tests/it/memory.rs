//! The in-process backend's memory bounds: a flood of unique keys stays under the cap
//! without freeing a busy caller from its limit, and idle callers are forgotten.
//!
//! The million-key flood goes through the `Backend` trait on two threads: through the
//! `Limiter` it took 20 s and more in a debug build on two cores. `a_flood_through_the_limiter`
//! checks the cap on a smaller flood through the limiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use tollgate::store::{Algorithm, Backend, CallerKey, CheckOutcome, ManualClock};
use tollgate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota};

const START_MS: u64 = 1_700_000_000_000;
const CHECKPOINT: usize = 10_000;

/// Awaits a check that an in-process backend answers at once.
fn now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("the in-process backend answers at once"),
    }
}

fn check(backend: &InMemoryBackend, key: &CallerKey, limits: &Arc<[Policy]>) -> CheckOutcome {
    now(backend.check(key, limits, 1)).expect("the in-process backend never fails")
}

fn per_second(limit: u64) -> Arc<[Policy]> {
    vec![Policy::new(
        "per-second",
        Algorithm::sliding_window(limit, Duration::from_secs(1)),
    )]
    .into()
}

/// A unique flood key: 8 bytes, cheap to make, never equal to a named caller.
fn flood_key(i: usize) -> CallerKey {
    CallerKey::new((i as u64).to_le_bytes())
}

/// Checks the cap after every `CHECKPOINT` keys sent by any thread, and records what went
/// wrong rather than panicking, so that a flooding thread never leaves another waiting.
struct Checkpoints<'a> {
    backend: &'a InMemoryBackend,
    sent: AtomicUsize,
    checked: AtomicUsize,
    peak: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

impl<'a> Checkpoints<'a> {
    fn new(backend: &'a InMemoryBackend) -> Self {
        Self {
            backend,
            sent: AtomicUsize::new(0),
            checked: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            failures: Mutex::new(Vec::new()),
        }
    }

    fn fail(&self, failure: String) {
        self.failures.lock().unwrap().push(failure);
    }

    fn sent_one(&self) {
        let sent = self.sent.fetch_add(1, Ordering::Relaxed) + 1;
        if sent.is_multiple_of(CHECKPOINT) {
            let tracked = self.backend.tracked_keys();
            if tracked > self.backend.key_capacity() {
                self.fail(format!(
                    "{tracked} keys tracked after {sent} unique keys, cap {}",
                    self.backend.key_capacity()
                ));
            }
            self.peak.fetch_max(tracked, Ordering::Relaxed);
            self.checked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn assert_all_passed(&self, expected_checks: usize) {
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} failures, the first: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        assert_eq!(self.checked.load(Ordering::Relaxed), expected_checks);
        let peak = self.peak.load(Ordering::Relaxed);
        assert!(
            peak > self.backend.key_capacity() / 2,
            "the cap was never approached: {peak}"
        );
    }
}

/// A million unique keys, sent on two threads, on a backend capped at 10,000 (5 s on a
/// manual clock). Thread 0 drives the clock and sends the `steady` callers' requests:
/// one each every 8 ms (125 a second); the threads keep within 1,000 keys of each other.
/// Returns, per steady caller, whether each of its requests was admitted.
fn flood_a_million(
    backend: &InMemoryBackend,
    clock: &ManualClock,
    limits: &Arc<[Policy]>,
    steady: &[CallerKey],
) -> Vec<Vec<bool>> {
    const FLOOD: usize = 1_000_000;
    const THREADS: usize = 2;
    let checkpoints = Checkpoints::new(backend);
    let in_step = Barrier::new(THREADS);
    let flood = |thread: usize, admitted: &mut Vec<Vec<bool>>| {
        for (n, i) in (thread..FLOOD).step_by(THREADS).enumerate() {
            if n % 1_000 == 0 {
                in_step.wait();
            }
            if thread == 0 && n % 100 == 0 {
                clock.advance(Duration::from_millis(1));
                if n % 800 == 0 {
                    for (caller, admitted) in steady.iter().zip(admitted.iter_mut()) {
                        admitted.push(check(backend, caller, limits).admitted());
                    }
                }
            }
            if !check(backend, &flood_key(i), limits).admitted() {
                checkpoints.fail(format!("flood key {i} was refused"));
            }
            checkpoints.sent_one();
        }
    };
    let mut admitted = vec![Vec::new(); steady.len()];
    std::thread::scope(|scope| {
        for thread in 1..THREADS {
            let flood = &flood;
            scope.spawn(move || flood(thread, &mut Vec::new()));
        }
        flood(0, &mut admitted);
    });
    checkpoints.assert_all_passed(FLOOD / CHECKPOINT);
    admitted
}

fn capped_at_10_000(clock: &ManualClock) -> InMemoryBackend {
    let backend = InMemoryBackend::new().max_keys(10_000).clock(clock.clone());
    // Rounded down to a multiple of the shard count, never up.
    assert!(backend.key_capacity() <= 10_000 && backend.key_capacity() > 9_900);
    backend
}

#[test]
fn a_million_unique_keys_stay_under_the_cap() {
    let clock = ManualClock::new(START_MS);
    let backend = capped_at_10_000(&clock);
    flood_a_million(&backend, &clock, &per_second(50), &[]);
    assert!(backend.tracked_keys() <= backend.key_capacity());
}

/// Steady callers at 125 requests a second against a limit of 50 keep calling through the
/// million-key flood: each must be counted exactly as it would be without the flood, and
/// be refused at the end. (Twenty of them, so that the test does not depend on where one
/// caller's key happens to land in the backend's tables.)
#[test]
fn steady_callers_in_a_flood_are_still_limited() {
    let clock = ManualClock::new(START_MS);
    let backend = capped_at_10_000(&clock);
    let limits = per_second(50);
    let steady: Vec<CallerKey> = (0..20)
        .map(|c| CallerKey::new(format!("steady-{c}")))
        .collect();
    let admitted = flood_a_million(&backend, &clock, &limits, &steady);

    // The same requests, on a backend that never saw the flood.
    let reference_clock = ManualClock::new(START_MS + 1);
    let reference = InMemoryBackend::new().clock(reference_clock.clone());
    let expected: Vec<bool> = (0..admitted[0].len())
        .map(|_| {
            let admitted = check(&reference, &steady[0], &limits).admitted();
            reference_clock.advance(Duration::from_millis(8));
            admitted
        })
        .collect();
    let count = |v: &[bool]| v.iter().filter(|a| **a).count();
    assert!(expected.iter().any(|a| !a));
    let wrong: Vec<String> = steady
        .iter()
        .zip(&admitted)
        .filter(|(_, admitted)| count(admitted) != count(&expected))
        .map(|(caller, admitted)| format!("{caller} admitted {}", count(admitted)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} steady callers were counted wrongly in the flood (without it: {} of {} \
         requests admitted): {wrong:?}",
        wrong.len(),
        steady.len(),
        count(&expected),
        expected.len()
    );
    // Right after the flood, still over their limit, they are refused.
    let mut refused_at_the_end = vec![false; steady.len()];
    for _ in 0..10 {
        clock.advance(Duration::from_millis(1));
        for (caller, refused) in steady.iter().zip(&mut refused_at_the_end) {
            *refused |= !check(&backend, caller, &limits).admitted();
        }
    }
    for (caller, refused) in steady.iter().zip(refused_at_the_end) {
        assert!(refused, "{caller:?} was forgotten in the flood");
    }
}

/// The cap through the `Limiter`, on a smaller flood with two policies.
#[test]
fn a_flood_through_the_limiter() {
    const FLOOD: usize = 100_000;
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new().max_keys(1_000).clock(clock.clone());
    let limiter = Limiter::builder()
        .name("memory")
        .backend(backend.clone())
        .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1_000)))
        .build();
    let checkpoints = Checkpoints::new(&backend);
    for i in 0..FLOOD {
        if i % 10 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        let flood = Caller::new(flood_key(i));
        assert!(matches!(now(limiter.check(&flood)), Decision::Allowed(_)));
        checkpoints.sent_one();
    }
    checkpoints.assert_all_passed(FLOOD / CHECKPOINT);
}

/// Callers refused throughout a flood (over an hourly quota, calling steadily) must stay
/// refused: a refused request is activity too, and the flood must not reset them.
#[test]
fn refused_callers_are_not_evicted_by_a_flood() {
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new().max_keys(10_000).clock(clock.clone());
    let limits: Arc<[Policy]> = vec![Policy::new(
        "per-hour",
        Algorithm::sliding_window(5, Duration::from_secs(3_600)),
    )]
    .into();
    let steady: Vec<CallerKey> = (0..20)
        .map(|c| CallerKey::new(format!("steady-{c}")))
        .collect();
    for key in &steady {
        for _ in 0..5 {
            assert!(check(&backend, key, &limits).admitted());
        }
    }
    for i in 0..200_000 {
        if i % 1_000 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        if i % 100 == 0 {
            for key in &steady {
                assert!(
                    !check(&backend, key, &limits).admitted(),
                    "{key:?} was forgotten after {i} flood keys and admitted again"
                );
            }
        }
        check(&backend, &flood_key(i), &limits);
    }
}

#[test]
fn idle_keys_go_away_after_their_windows() {
    let clock = ManualClock::new(START_MS);
    // One shard (its callers fit one), so that one request sweeps them all.
    let backend = InMemoryBackend::new()
        .max_keys(10_000)
        .shards(1)
        .sweep_interval(Duration::from_secs(1))
        .clock(clock.clone());
    let per_second = per_second(5);
    let per_minute: Arc<[Policy]> = vec![Policy::new(
        "per-minute",
        Algorithm::sliding_window(5, Duration::from_secs(60)),
    )]
    .into();
    for i in 0..1_000 {
        check(&backend, &CallerKey::new(format!("brief-{i}")), &per_second);
    }
    let patient = CallerKey::new("patient");
    for _ in 0..5 {
        check(&backend, &patient, &per_minute);
    }
    assert_eq!(backend.tracked_keys(), 1_001);

    // Within the windows nothing is forgotten, however much traffic passes.
    clock.advance(Duration::from_millis(1_500));
    check(&backend, &CallerKey::new("late-0"), &per_second);
    assert_eq!(backend.tracked_keys(), 1_002);

    // Past two per-second windows the brief callers (late-0 too) no longer affect any
    // decision: the next request, which sweeps the shard, forgets them. The per-minute
    // caller stays, still refused.
    clock.advance(Duration::from_secs(2));
    check(&backend, &CallerKey::new("late-1"), &per_second);
    assert_eq!(backend.tracked_keys(), 2, "patient and late-1");
    assert!(!check(&backend, &patient, &per_minute).admitted());

    // Past its windows, the per-minute caller goes too, and starts afresh.
    clock.advance(Duration::from_secs(121));
    check(&backend, &CallerKey::new("late-2"), &per_second);
    assert_eq!(backend.tracked_keys(), 1, "only late-2");
    assert!(check(&backend, &patient, &per_minute).admitted());
}

#[test]
fn idle_keys_go_away_from_every_shard_that_sees_traffic() {
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new()
        .sweep_interval(Duration::from_secs(1))
        .clock(clock.clone());
    let limiter = Limiter::builder()
        .name("memory")
        .backend(backend.clone())
        .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
        .policy(Policy::token_bucket("smooth", Quota::per_second(10), 10))
        .build();
    for i in 0..10_000 {
        assert!(now(limiter.check(&Caller::new(format!("early-{i}")))).is_allowed());
    }
    assert_eq!(backend.tracked_keys(), 10_000);
    // Not yet: the sweep interval has passed but the windows have not.
    clock.advance(Duration::from_millis(1_100));
    for i in 0..2_000 {
        now(limiter.check(&Caller::new(format!("middle-{i}"))));
    }
    assert_eq!(backend.tracked_keys(), 12_000);
    clock.advance(Duration::from_secs(3));
    // Enough later callers to reach every shard; each shard sweeps when traffic hits it.
    for i in 0..2_000 {
        assert!(now(limiter.check(&Caller::new(format!("late-{i}")))).is_allowed());
    }
    assert_eq!(backend.tracked_keys(), 2_000);
}

/// Four threads race on the same few callers under two policies, with time frozen: each
/// caller gets exactly the tighter limit, never one more, and the looser policy counts
/// exactly what was admitted (a refusal by one policy consumes nothing from the other).
/// The callers' first requests race too, so the shard's insert path meets its lock-free
/// path on the same keys.
#[test]
fn racing_threads_never_admit_past_the_limit() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 2_000;
    const CALLERS: usize = 3;
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new().shards(2).clock(clock.clone());
    let limits: Arc<[Policy]> = vec![
        Policy::new(
            "per-second",
            Algorithm::sliding_window(500, Duration::from_secs(1)),
        ),
        Policy::new(
            "per-minute",
            Algorithm::token_bucket(1_000, Duration::from_secs(60), 1_000),
        ),
    ]
    .into();
    let keys: Vec<CallerKey> = (0..CALLERS)
        .map(|i| CallerKey::new(format!("racer-{i}")))
        .collect();
    let admitted: Vec<AtomicUsize> = (0..CALLERS).map(|_| AtomicUsize::new(0)).collect();
    let start = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (backend, limits, keys, admitted, start) =
                (&backend, &limits, &keys, &admitted, &start);
            scope.spawn(move || {
                start.wait();
                for n in 0..PER_THREAD {
                    let caller = (n + thread) % CALLERS;
                    if check(backend, &keys[caller], limits).admitted() {
                        admitted[caller].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    for (key, admitted) in keys.iter().zip(&admitted) {
        assert_eq!(admitted.load(Ordering::Relaxed), 500, "{key}");
        // One more is refused; the per-minute bucket spent exactly the 500 admitted.
        let outcome = check(&backend, key, &limits);
        assert!(!outcome.admitted());
        assert_eq!(outcome.limits()[1].remaining, 500, "{key}");
    }
}

/// A caller of one sliding window or one token bucket is decided by a compare-and-swap on
/// one word, with no lock of its own: four threads racing on the same callers, time
/// frozen, get exactly the limit each, never one more, and the first requests race the
/// insert.
#[test]
fn racing_threads_on_one_policy_admit_exactly_the_limit() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 2_000;
    const CALLERS: usize = 3;
    for policy in [
        Policy::new(
            "per-second",
            Algorithm::sliding_window(500, Duration::from_secs(1)),
        ),
        Policy::new(
            "per-minute",
            Algorithm::token_bucket(1_000, Duration::from_secs(60), 500),
        ),
    ] {
        let clock = ManualClock::new(START_MS);
        let backend = InMemoryBackend::new().shards(2).clock(clock.clone());
        let limits: Arc<[Policy]> = vec![policy.clone()].into();
        let keys: Vec<CallerKey> = (0..CALLERS)
            .map(|i| CallerKey::new(format!("racer-{i}")))
            .collect();
        let admitted: Vec<AtomicUsize> = (0..CALLERS).map(|_| AtomicUsize::new(0)).collect();
        let start = Barrier::new(THREADS);
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (backend, limits, keys, admitted, start) =
                    (&backend, &limits, &keys, &admitted, &start);
                scope.spawn(move || {
                    start.wait();
                    for n in 0..PER_THREAD {
                        let caller = (n + thread) % CALLERS;
                        if check(backend, &keys[caller], limits).admitted() {
                            admitted[caller].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        for (key, admitted) in keys.iter().zip(&admitted) {
            assert_eq!(
                admitted.load(Ordering::Relaxed),
                500,
                "{key} under {policy:?}"
            );
            let outcome = check(&backend, key, &limits);
            assert!(!outcome.admitted());
            assert_eq!(outcome.limits()[0].remaining, 0, "{key}");
        }
    }
}

/// A caller's state stays exact when it stops fitting its packed word: a token bucket
/// packed in units of its rate and period decides on after its rate changes under the same
/// counter (a reload), exactly as the arithmetic on its states does, step by step.
#[test]
fn a_state_that_stops_fitting_its_word_decides_on_exactly() {
    let clock = ManualClock::new(START_MS);
    let backend = InMemoryBackend::new().clock(clock.clone());
    let acme = CallerKey::new("acme");
    let before: Arc<[Policy]> = vec![Policy::new(
        "bucket",
        Algorithm::token_bucket(50, Duration::from_secs(1), 20),
    )]
    .into();
    // The same counter (name and period), a rate whose refill is no multiple of the first.
    let after: Arc<[Policy]> = vec![Policy::new(
        "bucket",
        Algorithm::token_bucket(7, Duration::from_secs(1), 20),
    )]
    .into();
    assert_eq!(before[0].counter(), after[0].counter());
    let mut stored = None;
    for step in 0..200u64 {
        let limits = if step < 60 { &before } else { &after };
        let now = START_MS + step * 37;
        clock.set(now);
        let (expected, states) =
            tollgate::store::PolicyState::evaluate(limits, |_| stored.clone(), now, 1);
        let outcome = check(&backend, &acme, limits);
        assert_eq!(outcome.admitted(), expected.admitted(), "step {step}");
        assert_eq!(outcome.limits(), expected.limits(), "step {step}");
        if let Some(states) = states {
            stored = states.into_iter().next();
        }
    }
}
