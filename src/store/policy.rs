//! Named quotas with the algorithm each counts with, and the counter each is kept in.

use std::sync::Arc;
use std::time::Duration;

use crate::store::algorithm::{Algorithm, WordUnits};
use crate::store::build_error::BuildError;

/// A number of requests over a span of time, read the way people say it:
/// `Quota::per_second(50)` is 50 requests in one second.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let quota = Quota::per_second(50);
/// assert_eq!(quota.count(), 50);
/// assert_eq!(quota.period(), Duration::from_secs(1));
/// assert_eq!(Quota::per_day(1_000_000).period(), Duration::from_secs(86_400));
/// assert_eq!(Quota::new(5, Duration::from_secs(60)), Quota::per_minute(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    count: u64,
    period: Duration,
}

impl Quota {
    /// `count` requests in every `period`.
    pub const fn new(count: u64, period: Duration) -> Self {
        Self { count, period }
    }

    /// `count` requests per second.
    pub const fn per_second(count: u64) -> Self {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` requests per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` requests per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::new(count, Duration::from_secs(3_600))
    }

    /// `count` requests per day (86,400 s).
    pub const fn per_day(count: u64) -> Self {
        Self::new(count, Duration::from_secs(86_400))
    }

    /// `count` requests in every `seconds` seconds: `Quota::per_seconds(100, 10)` is 100
    /// requests in any 10 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_seconds(100, 10).period(), Duration::from_secs(10));
    /// ```
    pub const fn per_seconds(count: u64, seconds: u64) -> Self {
        Self::new(count, Duration::from_secs(seconds))
    }

    /// `count` requests in every `minutes` minutes, as people say it: 5 login attempts per
    /// 15 minutes is `Quota::per_minutes(5, 15)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Policy, Quota};
    /// let quota = Quota::per_minutes(5, 15);
    /// assert_eq!((quota.count(), quota.period()), (5, Duration::from_secs(900)));
    /// assert_eq!(Quota::per_minutes(5, 1), Quota::per_minute(5));
    /// let login = Policy::sliding_window("per-15-minutes", quota);
    /// assert_eq!(login.counter(), "per-15-minutes:w900000");
    /// ```
    pub const fn per_minutes(count: u64, minutes: u64) -> Self {
        Self::new(count, Duration::from_secs(minutes.saturating_mul(60)))
    }

    /// `count` requests in every `hours` hours: 1,000 exports per 6 hours is
    /// `Quota::per_hours(1_000, 6)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_hours(1_000, 6).period(), Duration::from_secs(6 * 3_600));
    /// assert_eq!(Quota::per_hours(10, 1), Quota::per_hour(10));
    /// ```
    pub const fn per_hours(count: u64, hours: u64) -> Self {
        Self::new(count, Duration::from_secs(hours.saturating_mul(3_600)))
    }

    /// How many requests.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// Over how long.
    pub const fn period(&self) -> Duration {
        self.period
    }
}

/// A named quota with its algorithm: one item of `RateLimit-Policy`, and one counter per
/// caller in the store.
///
/// The name is what clients see in the headers and the problem body (`"per-second"`), so
/// it must be 1 to 64 printable ASCII characters; the constructors panic otherwise, as
/// they do for a zero quota or period.
///
/// ```
/// use tollgate::{Policy, Quota};
///
/// // 50 requests in any one second.
/// let per_second = Policy::sliding_window("per-second", Quota::per_second(50));
/// // 1,000,000 a day.
/// let per_day = Policy::sliding_window("per-day", Quota::per_day(1_000_000));
/// // 10 a second on average, with bursts of up to 30.
/// let smooth = Policy::token_bucket("smooth", Quota::per_second(10), 30);
/// // Never more than 5 in any 15 minutes, exactly.
/// let attempts = Policy::sliding_log("attempts", Quota::per_minutes(5, 15));
/// assert_eq!(per_second.name(), "per-second");
/// assert_eq!(per_day.quota(), 1_000_000);
/// assert_eq!(smooth.quota(), 30);
/// assert_eq!(attempts.counter(), "attempts:l900000");
/// ```
///
/// # Whose count it is
///
/// A counter's identity is the limiter it belongs to (its scope), the policy's name and the
/// unit it counts in: the sliding window's length, or the token bucket's refill period. So
/// two limiters never share a count, and a caller moved to a tier whose policy of the same
/// name counts in other units starts that policy afresh instead of reading a count it
/// cannot interpret. Policies of one name and one unit keep the caller's count across a
/// tier change: the new quota applies to what was already used. Stores key their state on
/// [`counter`](Self::counter), never on the name alone.
///
/// A policy can also lock a caller out for a while once it has used the quota up
/// (credential and one-time-code routes): see [`lock_out_for`](Self::lock_out_for).
///
/// ```
/// use tollgate::{Policy, Quota};
/// let limit = Policy::sliding_window("per-second", Quota::per_second(50));
/// assert_eq!(limit.counter(), "per-second:w1000");
/// let bigger = Policy::sliding_window("per-second", Quota::per_second(500));
/// assert_eq!(bigger.counter(), limit.counter());
/// let per_minute = Policy::sliding_window("per-second", Quota::per_minute(50));
/// assert_ne!(per_minute.counter(), limit.counter());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    name: Arc<str>,
    algorithm: Algorithm,
    scope: Option<Arc<str>>,
    counter: Arc<str>,
    /// How long a caller who uses the quota up is refused, and the identity its block is
    /// kept under: `<scope>:<name>:lock`, without the unit, so that limits reloaded with a
    /// policy of the same name keep a block that stands.
    lockout: Option<Lockout>,
    /// Whether its units are bytes of content (`qu="content-bytes"`), not requests.
    content_bytes: bool,
    // Computed once (each takes a division): read on every decision and every response.
    window_ms: u64,
    retention_ms: u64,
    /// Its numbers in the terms of its packed word, for a policy whose states the
    /// in-process store keeps in one word (and decides there), divisions made
    /// multiplications.
    word_units: Option<WordUnits>,
}

impl Policy {
    /// Counts with the sliding window counter: the requests of the current fixed window of
    /// `quota.period()` plus those of the previous one, weighted by how much of it the
    /// sliding window still overlaps, at most `quota.count()`.
    ///
    /// # How close to the quota
    ///
    /// The weighting assumes the previous window's requests were spread evenly; it is an
    /// approximation, not a cap on every window. A full quota `q` spent at the very end of
    /// one fixed window, then requests through the next one, admits up to `2q - 1` within
    /// one period: the worst case. On steady random traffic over the quota it is close:
    /// measured by the crate's own arithmetic (`src/store/algorithm/model_tests.rs`,
    /// Poisson arrivals at 1.1, 2 and 10 times the quota), the busiest window held at most
    /// 1.6 q for q = 5, 1.11 q for q = 100 and 1.03 q for q = 1,000, and the count over q,
    /// averaged over the windows ending at each admitted request, stayed under 1% of q. Bursty traffic (floods
    /// after quiet spells) comes nearer the worst case: up to 1.88 q, and 2.4% to 5.4% of q
    /// over it on average.
    ///
    /// 5 per 10 s: 5 requests at 9.9 s, then one every 100 ms, admits 9 within 8.1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::ManualClock;
    /// use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = ManualClock::new(9_900);
    /// let limiter = Limiter::builder()
    ///     .name("login")
    ///     .backend(InMemoryBackend::new().clock(clock.clone()))
    ///     .clock(clock.clone())
    ///     .policy(Policy::sliding_window("per-10s", Quota::per_seconds(5, 10)))
    ///     .build();
    /// let alice = Caller::new("alice");
    /// let mut admitted = Vec::new();
    /// for _ in 0..5 {
    ///     assert!(limiter.check(&alice).await.is_allowed());
    ///     admitted.push(9_900);
    /// }
    /// for t in (10_000..=19_800).step_by(100) {
    ///     clock.set(t);
    ///     if limiter.check(&alice).await.is_allowed() {
    ///         admitted.push(t);
    ///     }
    /// }
    /// assert_eq!(admitted, [9_900, 9_900, 9_900, 9_900, 9_900, 12_000, 14_000, 16_000, 18_000]);
    /// # }
    /// ```
    ///
    /// Where no window may ever hold more than `q` (credentials, one-time codes, spend),
    /// use the exact [sliding log](Self::sliding_log), or a [token bucket](Self::token_bucket)
    /// whose burst plus its refill per period is at most `q`, which no span can exceed.
    ///
    /// # Panics
    ///
    /// On an invalid name, a zero count, a period under 1 ms, or count x period (ms) of
    /// 2^53 or more.
    pub fn sliding_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Algorithm::sliding_window(quota.count, quota.period))
    }

    /// Counts with a token bucket refilled at `rate` (`Quota::per_second(10)`: ten tokens a
    /// second) that holds at most `burst` tokens.
    ///
    /// # How close to the quota
    ///
    /// Exact: any span of time `T` admits at most `burst` plus what `rate` refills in `T`,
    /// and this is reached (a full bucket spent at once, then each token as it comes). A
    /// bucket with `burst = rate.count()` therefore admits up to twice the count within one
    /// period, like the [sliding window](Self::sliding_window)'s worst case. For a hard cap
    /// of `q` in every period, keep burst plus the refill per period at `q`: 5 login
    /// attempts in any 15 minutes is a burst of 3 and 2 more per 15 minutes (at most 4 in
    /// any span shorter than 15 minutes, 5 in one of exactly 15).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::ManualClock;
    /// use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = ManualClock::new(0);
    /// let limiter = Limiter::builder()
    ///     .name("login")
    ///     .backend(InMemoryBackend::new().clock(clock.clone()))
    ///     .clock(clock.clone())
    ///     .policy(Policy::token_bucket("attempts", Quota::per_minutes(2, 15), 3))
    ///     .build();
    /// let alice = Caller::new("alice");
    /// // One attempt a second for an hour: never more than 4 in any 15 minutes.
    /// let mut admitted = Vec::new();
    /// for second in 0..3_600u64 {
    ///     clock.set(second * 1_000);
    ///     if limiter.check(&alice).await.is_allowed() {
    ///         admitted.push(second);
    ///     }
    /// }
    /// for (i, &start) in admitted.iter().enumerate() {
    ///     let in_15_minutes = admitted[i..].iter().take_while(|&&t| t < start + 900).count();
    ///     assert!(in_15_minutes <= 4, "{in_15_minutes} from {start} s");
    /// }
    /// assert_eq!(&admitted[..5], [0, 1, 2, 450, 900]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// On an invalid name, a zero rate or burst, or a period under 1 ms.
    pub fn token_bucket(name: impl Into<Arc<str>>, rate: Quota, burst: u64) -> Self {
        Self::new(
            name,
            Algorithm::token_bucket(rate.count, rate.period, burst),
        )
    }

    /// Counts exactly with a sliding log: the time of every unit admitted in the last
    /// `quota.period()`, so that no window of that length ever holds more than
    /// `quota.count()` (see [`Algorithm::SlidingLog`] for the measured difference from the
    /// [sliding window](Self::sliding_window) and the memory per caller).
    ///
    /// 5 per 10 s: the same requests as the sliding window's example (5 at 9.9 s, then one
    /// every 100 ms, where the sliding window admits 9 within 8.1 s) admit the next only
    /// once the first ones are 10 s old.
    ///
    /// ```
    /// use tollgate::store::ManualClock;
    /// use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = ManualClock::new(9_900);
    /// let limiter = Limiter::builder()
    ///     .name("login")
    ///     .backend(InMemoryBackend::new().clock(clock.clone()))
    ///     .clock(clock.clone())
    ///     .policy(Policy::sliding_log("per-10s", Quota::per_seconds(5, 10)))
    ///     .build();
    /// let alice = Caller::new("alice");
    /// let mut admitted = Vec::new();
    /// for _ in 0..5 {
    ///     assert!(limiter.check(&alice).await.is_allowed());
    ///     admitted.push(9_900);
    /// }
    /// for t in (10_000..=19_900).step_by(100) {
    ///     clock.set(t);
    ///     if limiter.check(&alice).await.is_allowed() {
    ///         admitted.push(t);
    ///     }
    /// }
    /// // Nothing in between: the five at 9.9 s leave the window together at 19.9 s.
    /// assert_eq!(admitted, [9_900, 9_900, 9_900, 9_900, 9_900, 19_900]);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// On an invalid name, a zero count, a count above
    /// [`Algorithm::MAX_LOG_LIMIT`], a period under 1 ms, or count x period (ms) of 2^53 or
    /// more.
    pub fn sliding_log(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Algorithm::sliding_log(quota.count, quota.period))
    }

    /// A named policy counted by `algorithm`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    /// use tollgate::store::Algorithm;
    /// let policy = Policy::new("per-second", Algorithm::sliding_window(50, Duration::from_secs(1)));
    /// assert_eq!(policy.quota(), 50);
    /// ```
    ///
    /// # Panics
    ///
    /// When the name is empty, longer than 64 bytes, or not printable ASCII (it appears in
    /// HTTP headers and store keys).
    pub fn new(name: impl Into<Arc<str>>, algorithm: Algorithm) -> Self {
        Self::try_new(name, algorithm).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`new`](Self::new), or why the name cannot name a policy: for names read at run
    /// time. With [`Algorithm::try_sliding_window`] and [`Algorithm::try_token_bucket`],
    /// builds any policy without a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::Algorithm;
    /// use tollgate::{BuildError, Policy};
    /// let window = Algorithm::try_sliding_window(50, Duration::from_secs(1)).unwrap();
    /// assert!(Policy::try_new("per-second", window).is_ok());
    /// assert!(matches!(Policy::try_new("", window), Err(BuildError::InvalidPolicyName(_))));
    /// ```
    pub fn try_new(name: impl Into<Arc<str>>, algorithm: Algorithm) -> Result<Self, BuildError> {
        let name = name.into();
        if !is_valid_name(&name) {
            return Err(BuildError::InvalidPolicyName(name.to_string()));
        }
        Ok(Self::assemble(name, algorithm, None, None, false))
    }

    fn assemble(
        name: Arc<str>,
        algorithm: Algorithm,
        scope: Option<Arc<str>>,
        lockout_ms: Option<u64>,
        content_bytes: bool,
    ) -> Self {
        let mut counter = counter_id(scope.as_deref(), &name, &algorithm);
        // Bytes are never read as requests, nor requests as bytes.
        if content_bytes {
            counter.push_str(":B");
        }
        let counter = counter.into();
        let lockout = lockout_ms.map(|ms| Lockout {
            ms,
            counter: lockout_id(scope.as_deref(), &name).into(),
        });
        Self {
            name,
            window_ms: algorithm.window_ms(),
            retention_ms: algorithm.retention_ms(),
            word_units: WordUnits::of(&algorithm),
            algorithm,
            scope,
            counter,
            lockout,
            content_bytes,
        }
    }

    /// The same policy, and a lockout: the request that uses the quota up (the N-th
    /// counted within the window, for `Quota::per_minutes(5, 10)` the fifth) also refuses
    /// the caller for `duration`, whatever it sends meanwhile. Rounded up to whole
    /// milliseconds, at most 2^40 ms (about 34 years); zero turns the lockout off. The block is kept in the store, beside
    /// the caller's counters.
    ///
    /// Under a layer's [`count_only`](crate::RateLimitLayer::count_only), only the
    /// responses that count (the wrong codes) bring the caller towards the block: a
    /// request whose response does not count gives its unit back, and lifts the block it
    /// started if it was the one that used the quota up.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::ManualClock;
    /// use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = ManualClock::new(0);
    /// let limiter = Limiter::builder()
    ///     .name("otp")
    ///     .backend(InMemoryBackend::new().clock(clock.clone()))
    ///     .clock(clock.clone())
    ///     .policy(
    ///         Policy::sliding_window("wrong-codes", Quota::per_minutes(5, 10))
    ///             .lock_out_for(Duration::from_secs(15 * 60)),
    ///     )
    ///     .build();
    /// let ip = Caller::new("203.0.113.7");
    /// for _ in 0..5 {
    ///     assert!(limiter.check(&ip).await.is_allowed());
    /// }
    /// // The fifth used the quota up: 15 minutes of refusals, then a fresh start.
    /// clock.set(14 * 60 * 1_000);
    /// let refused = limiter.check(&ip).await;
    /// assert!(!refused.is_allowed());
    /// assert_eq!(refused.info().unwrap().retry_after_secs(), 60);
    /// clock.set(15 * 60 * 1_000);
    /// assert!(limiter.check(&ip).await.is_allowed());
    /// # }
    /// ```
    ///
    /// # What an attacker can do with it
    ///
    /// A lockout stops guessing: 5 wrong codes per block, however fast they come. It also
    /// lets anyone who can send requests under a caller's key lock that caller out on
    /// purpose, by failing 5 times: keyed on an account alone, a stranger who knows the
    /// account's name locks its owner out for as long as they keep failing. Key it on what
    /// an attacker cannot choose freely for a victim, such as the client IP, or the client
    /// IP and the account together (see [`key::ClientIp`](crate::key::ClientIp) and its
    /// trusted proxies), and keep a looser per-account limit beside it. An attacker with
    /// many addresses still gets 5 guesses per address per block: the lockout bounds the
    /// guessing rate per key, not the number of keys.
    ///
    /// # When the store loses its data
    ///
    /// The block is kept in the store: a Redis that restarts without persistence, fails
    /// over to a replica the block had not reached, or evicts it forgets it, and tollgate
    /// does not write it back. The caller then starts afresh on
    /// the store, with the policy's quota of attempts (the last one starts a new block),
    /// while an instance that started the block or refused the caller during it goes on
    /// refusing from its denial cache until the block would have ended. Run the limiter's
    /// Redis with the append-only file, a replica promoted by Sentinel or Cluster, and no
    /// eviction: see [the lockout guide](crate::guide::cost_and_counting).
    pub fn lock_out_for(self, duration: Duration) -> Self {
        let ms = u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        // Kept within exact arithmetic in Redis's Lua, as every other number.
        let ms = ms.min(MAX_LOCKOUT_MS);
        Self::assemble(
            self.name,
            self.algorithm,
            self.scope,
            (ms > 0).then_some(ms),
            self.content_bytes,
        )
    }

    /// The same policy, counting bytes of content instead of requests: its quota is a
    /// number of bytes (`Quota::per_minute(10_485_760)`, 10 MiB a minute), advertised with
    /// `qu="content-bytes"` as the RateLimit fields define it, and kept in a counter of its
    /// own (a count of bytes is never read as one of requests). A layer counts a response
    /// body's bytes as they pass with
    /// [`RateLimitLayer::count_response_bytes`](crate::RateLimitLayer::count_response_bytes).
    ///
    /// ```
    /// use tollgate::{Policy, Quota};
    /// let egress = Policy::sliding_window("egress", Quota::per_minute(10_485_760)).content_bytes();
    /// assert!(egress.counts_content_bytes());
    /// assert_eq!(egress.counter(), "egress:w60000:B");
    /// ```
    pub fn content_bytes(self) -> Self {
        let lockout = self.lockout_ms();
        Self::assemble(self.name, self.algorithm, self.scope, lockout, true)
    }

    /// Whether its quota counts bytes of content (see [`content_bytes`](Self::content_bytes)).
    pub fn counts_content_bytes(&self) -> bool {
        self.content_bytes
    }

    /// How long a caller who uses the quota up is refused, if this policy locks out (see
    /// [`lock_out_for`](Self::lock_out_for)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Policy, Quota};
    /// let plain = Policy::sliding_window("attempts", Quota::per_minute(5));
    /// assert_eq!(plain.lockout(), None);
    /// let locking = plain.lock_out_for(Duration::from_secs(600));
    /// assert_eq!(locking.lockout(), Some(Duration::from_secs(600)));
    /// ```
    pub fn lockout(&self) -> Option<Duration> {
        self.lockout.as_ref().map(|l| Duration::from_millis(l.ms))
    }

    /// The lockout in milliseconds.
    pub(crate) fn lockout_ms(&self) -> Option<u64> {
        self.lockout.as_ref().map(|l| l.ms)
    }

    /// The identity a caller's block is kept under, if this policy locks out:
    /// `<scope>:<name>:lock`, escaped as [`counter`](Self::counter) is. It names no unit,
    /// so a policy of the same name keeps a standing block across a reload that changes
    /// its quota, window or algorithm.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Policy, Quota};
    /// let codes = Policy::sliding_window("wrong-codes", Quota::per_minutes(5, 10))
    ///     .lock_out_for(Duration::from_secs(600));
    /// assert_eq!(codes.lockout_counter(), Some("wrong-codes:lock"));
    /// let reloaded = Policy::sliding_window("wrong-codes", Quota::per_minutes(3, 30))
    ///     .lock_out_for(Duration::from_secs(900));
    /// assert_eq!(reloaded.lockout_counter(), codes.lockout_counter());
    /// ```
    pub fn lockout_counter(&self) -> Option<&str> {
        self.lockout.as_ref().map(|l| &*l.counter)
    }

    /// The block's identity, cheap to clone.
    pub(crate) fn lockout_arc(&self) -> Option<&Arc<str>> {
        self.lockout.as_ref().map(|l| &l.counter)
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shared name, cheap to clone.
    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// The quota advertised as `q`: the window's limit, or the bucket's burst.
    pub fn quota(&self) -> u64 {
        self.algorithm.quota()
    }

    /// How it counts.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
    /// The identity of the counter this policy is kept in, the same on every instance:
    /// `<scope>:<name>:<unit>`, each part escaped so that no two policies collide
    /// (`%`, `:` and bytes outside printable ASCII become `%XX`). The scope is the
    /// limiter's (see [`LimiterBuilder::counter_scope`](crate::LimiterBuilder::counter_scope));
    /// the unit is `w` and the window in milliseconds for a sliding window, `b` and the
    /// refill period in milliseconds for a token bucket, `l` and the window in milliseconds
    /// for a sliding log.
    ///
    /// ```
    /// use tollgate::{Policy, Quota};
    /// let bucket = Policy::token_bucket("burst", Quota::per_second(10), 20);
    /// assert_eq!(bucket.counter(), "burst:b1000");
    /// ```
    pub fn counter(&self) -> &str {
        &self.counter
    }

    /// The counter's identity, cheap to clone.
    pub(crate) fn counter_arc(&self) -> &Arc<str> {
        &self.counter
    }

    /// The same policy with another algorithm (a local share, say), in the same scope.
    /// Its lockout, if any, goes with it.
    pub fn with_algorithm(&self, algorithm: Algorithm) -> Self {
        Self::assemble(
            self.name.clone(),
            algorithm,
            self.scope.clone(),
            self.lockout_ms(),
            self.content_bytes,
        )
    }

    /// [`Algorithm::window_ms`], computed when the policy was built.
    pub(crate) fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// [`Algorithm::retention_ms`], computed when the policy was built.
    pub(crate) fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    /// How much longer than its retention the in-process store may keep a caller of this
    /// policy: the largest power of two no greater than a sixteenth of the retention, less
    /// one (none below 32 ms). A shift and a bit scan: nothing worth keeping beside it.
    pub(crate) fn keep_slack_ms(&self) -> u64 {
        (self.retention_ms / 16)
            .checked_ilog2()
            .map_or(0, |bits| (1 << bits) - 1)
    }

    /// Whether the in-process store keeps this policy's states in one word, decided by a
    /// compare-and-swap.
    pub(crate) fn packs_in_one_word(&self) -> bool {
        self.word_units.is_some()
    }

    /// Its numbers in the terms of its packed word, for a policy whose states pack.
    pub(crate) fn word_units(&self) -> Option<&WordUnits> {
        self.word_units.as_ref()
    }

    /// The same policy under the name `<level>:<name>`, as a budget level's policies are
    /// advertised; its counter is the member's (see [`of_member`](Self::of_member)).
    pub(crate) fn for_level(&self, level: &str) -> Self {
        let mut renamed = self.clone();
        renamed.name = format!("{level}:{}", self.name).into();
        renamed
    }

    /// The same policy counting for one member of a nested budget, `key` at `level` (the
    /// caller's own policies at the empty level): its counters carry the member, since all
    /// of a budget's counters live under one caller key, the outermost level's.
    pub(crate) fn of_member(&self, level: &str, key: &[u8]) -> Self {
        let mut prefix = String::with_capacity(level.len() + key.len() + 2);
        push_escaped(&mut prefix, level);
        prefix.push('=');
        for &byte in key {
            // The key's bytes, escaped as a counter's parts are.
            if (0x21..0x7f).contains(&byte) && !matches!(byte, b'%' | b':' | b'{' | b'}' | b'/') {
                prefix.push(char::from(byte));
            } else {
                prefix.push_str(&format!("%{byte:02X}"));
            }
        }
        prefix.push('/');
        let mut member = self.clone();
        member.counter = format!("{prefix}{}", self.counter).into();
        if let Some(lockout) = &mut member.lockout {
            lockout.counter = format!("{prefix}{}", lockout.counter).into();
        }
        member
    }

    /// The same policy counted under `scope` (a limiter's counter scope).
    pub(crate) fn scoped(&self, scope: &Arc<str>) -> Self {
        Self::assemble(
            self.name.clone(),
            self.algorithm,
            Some(scope.clone()),
            self.lockout_ms(),
            self.content_bytes,
        )
    }
}

/// The longest lockout, about 34 years: the Redis script receives ten times it (see
/// lua/policies.lua), and hands it and the block's end back to Redis as numbers, which
/// stay exact in any of Lua's number formats well below 10^14.
const MAX_LOCKOUT_MS: u64 = 1 << 40;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Lockout {
    ms: u64,
    counter: Arc<str>,
}

fn lockout_id(scope: Option<&str>, name: &str) -> String {
    let mut id = String::with_capacity(name.len() + scope.map_or(0, str::len) + 6);
    if let Some(scope) = scope {
        push_escaped(&mut id, scope);
        id.push(':');
    }
    push_escaped(&mut id, name);
    id.push_str(":lock");
    id
}

/// Whether `name` can name a policy: 1 to 64 printable ASCII characters.
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}

fn counter_id(scope: Option<&str>, name: &str, algorithm: &Algorithm) -> String {
    let mut id = String::with_capacity(name.len() + scope.map_or(0, str::len) + 16);
    if let Some(scope) = scope {
        push_escaped(&mut id, scope);
        id.push(':');
    }
    push_escaped(&mut id, name);
    match *algorithm {
        Algorithm::SlidingWindow { window_ms, .. } => {
            id.push_str(":w");
            id.push_str(&window_ms.to_string());
        }
        Algorithm::TokenBucket { period_ms, .. } => {
            id.push_str(":b");
            id.push_str(&period_ms.to_string());
        }
        Algorithm::SlidingLog { window_ms, .. } => {
            id.push_str(":l");
            id.push_str(&window_ms.to_string());
        }
    }
    id
}

/// `:` separates the parts of a counter id, so it (and `%`, and anything a store key
/// should not carry) is percent-escaped inside a part.
fn push_escaped(out: &mut String, part: &str) {
    for byte in part.bytes() {
        if (0x21..0x7f).contains(&byte) && !matches!(byte, b'%' | b':' | b'{' | b'}') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}
