//! The counting algorithms, as exact integer arithmetic on milliseconds.
//!
//! Every backend runs the same arithmetic: the in-process backend calls it directly, the
//! Redis backend runs a Lua transcription of it. Integers keep the two identical (Lua
//! numbers are doubles, exact below 2^53, which the constructors guarantee).

mod divisor;
mod packed;
mod share;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub(crate) use divisor::{Divisor, gcd};
pub(crate) use packed::{Packing, WordDecision, WordUnits};
pub(crate) use share::Share;
pub(crate) use sliding_log::AdmissionLog;

use std::time::Duration;

use crate::store::build_error::BuildError;

/// Products such as `limit * window_ms` must stay exact in a Lua double.
const MAX_EXACT: u128 = 1 << 53;

/// How a policy counts.
///
/// | algorithm | exact? | state per caller and policy |
/// |---|---|---|
/// | [`SlidingWindow`](Self::SlidingWindow) | approximate: a window of its length can hold more than the limit (measured at [`SlidingLog`](Self::SlidingLog)) | in process 8 bytes in the caller's entry when it is the caller's one policy and packs, otherwise 48 beside the entry (80 for the first); in Redis a hash of 3 fields (about 80 bytes) |
/// | [`TokenBucket`](Self::TokenBucket) | exact for its own rule (burst plus refill) | in process 8 bytes in the caller's entry when it is the caller's one policy and packs, otherwise 48 beside the entry (80 for the first); in Redis a string of 17 bytes (its level and time) |
/// | [`SlidingLog`](Self::SlidingLog) | exact: no window of its length ever holds more than the limit | one entry per admitted unit in the last window |
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::Algorithm;
///
/// // 50 requests in any one second, smoothed across window edges.
/// let window = Algorithm::sliding_window(50, Duration::from_secs(1));
/// // 10 requests a second on average, bursts of up to 20.
/// let bucket = Algorithm::token_bucket(10, Duration::from_secs(1), 20);
/// assert_eq!(window.quota(), 50);
/// assert_eq!(bucket.quota(), 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// The sliding window counter: the previous fixed window's count, weighted by how much
    /// of it still overlaps the sliding window, plus the current window's count. A request
    /// is admitted when `previous * (window - elapsed) + (current + 1) * window <= limit *
    /// window`, with `elapsed` the time since the current fixed window began.
    SlidingWindow {
        /// Requests admitted per window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// The token bucket: holds up to `burst` tokens, refills `rate` tokens every
    /// `period_ms`, and each request takes one.
    TokenBucket {
        /// Tokens added per period.
        rate: u64,
        /// The refill period, in milliseconds.
        period_ms: u64,
        /// The bucket's capacity: the largest burst admitted at once.
        burst: u64,
    },
    /// The sliding log: the time of every unit admitted in the last window. A request of
    /// `cost` units is admitted when the units admitted in the last `window_ms` (an entry
    /// at `t` counts while `t > now - window_ms`) plus `cost` are at most `limit`, so no
    /// window of that length ever holds more than `limit`: for hard caps (logins, one-time
    /// codes, spend).
    ///
    /// # How close to the quota
    ///
    /// Exact, where the [sliding window counter](Self::SlidingWindow) is approximate. On a
    /// manual clock, 60 s of Poisson arrivals at a limit of 50 per second, in process
    /// (`cargo test --test it sliding_log_error_table -- --nocapture` measures it):
    ///
    #[doc = include_str!("../../../docs/sliding_log_table.md")]
    ///
    /// "Worst second" is the most admissions in any one-second window (every start, to
    /// the millisecond); the exact rule allows 50.
    ///
    /// # What it costs
    ///
    /// Memory grows with the quota, which is why the limit is bounded by
    /// [`MAX_LOG_LIMIT`](Self::MAX_LOG_LIMIT):
    ///
    /// - **In process**: 8 bytes per unit in the window (a ring of `u64` times, which may
    ///   hold up to as much again in spare capacity), plus about 120 bytes per caller and
    ///   log policy (its slot beside the caller's 64-byte entry, and the ring's header). A
    ///   decision that admits copies the ring once: its cost grows with the units in the
    ///   window.
    /// - **In Redis**: a sorted set per caller and policy, one member per unit in the
    ///   window, named `<time>:<sequence>` (19 bytes) and scored by Redis's clock. Up to
    ///   128 members (Redis's `zset-max-listpack-entries`) it is a listpack of about 32
    ///   bytes per member; beyond, a skiplist of about 120 to 130 bytes per member
    ///   (`MEMORY USAGE` on Redis 7.0: 4,144 bytes for 128 members, 17,984 for 129,
    ///   1,290,328 for 10,000). The key expires one window after its newest member.
    ///
    /// Leases ([`LimiterBuilder::leases`](crate::LimiterBuilder::leases)) are not taken for
    /// a caller with a sliding log among its policies: a leased unit spent after it was
    /// counted would count in a window that never saw it. Such a caller's requests each
    /// ask the store.
    SlidingLog {
        /// Units admitted in any window.
        limit: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
}

impl Algorithm {
    /// `limit` requests per `window`, counted by the sliding window counter.
    ///
    /// # Panics
    ///
    /// When `limit` is zero, `window` is under one millisecond, or `limit` times the window
    /// in milliseconds reaches 2^53 (beyond exact arithmetic in Redis's Lua). Use
    /// [`try_sliding_window`](Self::try_sliding_window) for values read at run time.
    pub fn sliding_window(limit: u64, window: Duration) -> Self {
        Self::try_sliding_window(limit, window).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`sliding_window`](Self::sliding_window), or why its arguments cannot work.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::BuildError;
    /// use tollgate::store::Algorithm;
    /// assert!(Algorithm::try_sliding_window(50, Duration::from_secs(1)).is_ok());
    /// assert_eq!(
    ///     Algorithm::try_sliding_window(u64::MAX, Duration::from_secs(1)),
    ///     Err(BuildError::Inexact)
    /// );
    /// ```
    pub fn try_sliding_window(limit: u64, window: Duration) -> Result<Self, BuildError> {
        let window_ms = millis(window);
        if limit == 0 {
            return Err(BuildError::ZeroLimit);
        }
        if window_ms == 0 {
            return Err(BuildError::ShortPeriod);
        }
        if u128::from(limit) * u128::from(window_ms) >= MAX_EXACT {
            return Err(BuildError::Inexact);
        }
        Ok(Algorithm::SlidingWindow { limit, window_ms })
    }

    /// The most units a [sliding log](Self::SlidingLog) may admit per window: it keeps one
    /// entry per unit.
    pub const MAX_LOG_LIMIT: u64 = 10_000;

    /// `limit` units in any `window`, counted exactly by a sliding log.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::Algorithm;
    ///
    /// let codes = Algorithm::sliding_log(5, Duration::from_secs(900));
    /// assert_eq!(codes.quota(), 5);
    /// ```
    ///
    /// # Panics
    ///
    /// When `limit` is zero or above [`MAX_LOG_LIMIT`](Self::MAX_LOG_LIMIT), `window` is
    /// under one millisecond, or `limit` times the window in milliseconds reaches 2^53. Use
    /// [`try_sliding_log`](Self::try_sliding_log) for values read at run time.
    pub fn sliding_log(limit: u64, window: Duration) -> Self {
        Self::try_sliding_log(limit, window).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`sliding_log`](Self::sliding_log), or why its arguments cannot work.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::BuildError;
    /// use tollgate::store::Algorithm;
    /// assert!(Algorithm::try_sliding_log(5, Duration::from_secs(60)).is_ok());
    /// assert_eq!(
    ///     Algorithm::try_sliding_log(20_000, Duration::from_secs(60)),
    ///     Err(BuildError::LogTooLarge { limit: 20_000, max: Algorithm::MAX_LOG_LIMIT })
    /// );
    /// assert_eq!(
    ///     Algorithm::try_sliding_log(5, Duration::from_micros(500)),
    ///     Err(BuildError::ShortPeriod)
    /// );
    /// assert_eq!(
    ///     Algorithm::try_sliding_log(0, Duration::from_secs(1)),
    ///     Err(BuildError::ZeroLimit)
    /// );
    /// ```
    pub fn try_sliding_log(limit: u64, window: Duration) -> Result<Self, BuildError> {
        let window_ms = millis(window);
        if limit == 0 {
            return Err(BuildError::ZeroLimit);
        }
        if window_ms == 0 {
            return Err(BuildError::ShortPeriod);
        }
        if limit > Self::MAX_LOG_LIMIT {
            return Err(BuildError::LogTooLarge {
                limit,
                max: Self::MAX_LOG_LIMIT,
            });
        }
        if u128::from(limit) * u128::from(window_ms) >= MAX_EXACT {
            return Err(BuildError::Inexact);
        }
        Ok(Algorithm::SlidingLog { limit, window_ms })
    }

    /// A bucket of `burst` tokens refilled at `rate` tokens per `period`.
    ///
    /// # Panics
    ///
    /// When `rate` or `burst` is zero, `period` is under one millisecond, or `burst` (or
    /// `rate`) times the period in milliseconds reaches 2^53. Use
    /// [`try_token_bucket`](Self::try_token_bucket) for values read at run time.
    pub fn token_bucket(rate: u64, period: Duration, burst: u64) -> Self {
        Self::try_token_bucket(rate, period, burst).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`token_bucket`](Self::token_bucket), or why its arguments cannot work.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::BuildError;
    /// use tollgate::store::Algorithm;
    /// assert!(Algorithm::try_token_bucket(10, Duration::from_secs(1), 20).is_ok());
    /// assert_eq!(
    ///     Algorithm::try_token_bucket(10, Duration::from_secs(1), 0),
    ///     Err(BuildError::ZeroBurst)
    /// );
    /// ```
    pub fn try_token_bucket(rate: u64, period: Duration, burst: u64) -> Result<Self, BuildError> {
        let period_ms = millis(period);
        if rate == 0 {
            return Err(BuildError::ZeroRate);
        }
        if burst == 0 {
            return Err(BuildError::ZeroBurst);
        }
        if period_ms == 0 {
            return Err(BuildError::ShortPeriod);
        }
        if u128::from(burst) * u128::from(period_ms) >= MAX_EXACT
            || u128::from(rate) * u128::from(period_ms) >= MAX_EXACT
        {
            return Err(BuildError::Inexact);
        }
        Ok(Algorithm::TokenBucket {
            rate,
            period_ms,
            burst,
        })
    }

    /// The quota advertised as `q`: the window's (or the log's) limit, or the bucket's
    /// burst.
    pub fn quota(&self) -> u64 {
        match *self {
            Algorithm::SlidingWindow { limit, .. } | Algorithm::SlidingLog { limit, .. } => limit,
            Algorithm::TokenBucket { burst, .. } => burst,
        }
    }

    /// The window advertised as `w`, in milliseconds: the sliding window, or the time an
    /// empty bucket takes to refill completely.
    pub fn window_ms(&self) -> u64 {
        match *self {
            Algorithm::SlidingWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. } => window_ms,
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => ceil_div(u128::from(burst) * u128::from(period_ms), u128::from(rate)),
        }
    }

    /// How long a caller's state must be kept: after this much silence it has no effect.
    pub fn retention_ms(&self) -> u64 {
        match *self {
            Algorithm::SlidingWindow { window_ms, .. } => window_ms.saturating_mul(2),
            Algorithm::TokenBucket { .. } => self.window_ms(),
            Algorithm::SlidingLog { window_ms, .. } => window_ms,
        }
    }

    /// The rate one of `divisor` instances enforces with its own counters while the store
    /// cannot decide, when its place among them is unknown (see
    /// [`FailurePolicy::local_share`](crate::FailurePolicy::local_share)).
    ///
    /// The shares of `divisor` instances together never exceed the limit. A quota of at
    /// least one request per instance is divided in the limit's own window and rounded
    /// down: 50 per second shared by 4 is 12 per second each (an instance that knows its
    /// place also takes its part of the remainder, so the four enforce 13, 13, 12 and 12).
    /// A smaller quota cannot be divided in its window: the instances take turns, one
    /// window each, and this is the rate that comes to on average, one request per as
    /// many windows as there are instances per request (1 per minute shared by 10 is 1 per
    /// 10 minutes each). A token bucket's rate is divided alike, and its burst too when it
    /// is at least the instance count; a smaller burst is taken in turns, and the average
    /// part has a burst of 1. A sliding log's limit is divided like a sliding window's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::Algorithm;
    ///
    /// let per_second = Algorithm::sliding_window(50, Duration::from_secs(1));
    /// assert_eq!(per_second.divided_by(4), Algorithm::sliding_window(12, Duration::from_secs(1)));
    /// assert_eq!(per_second.divided_by(5), Algorithm::sliding_window(10, Duration::from_secs(1)));
    /// // Fewer requests than instances: turns of one window each.
    /// let login = Algorithm::sliding_window(1, Duration::from_secs(60));
    /// assert_eq!(login.divided_by(10), Algorithm::sliding_window(1, Duration::from_secs(600)));
    /// ```
    pub fn divided_by(&self, divisor: u64) -> Self {
        let divisor = divisor.max(1);
        match *self {
            Algorithm::SlidingWindow { limit, window_ms } => {
                let (limit, window_ms) = average_share(limit, window_ms, divisor);
                Algorithm::SlidingWindow { limit, window_ms }
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                let (limit, window_ms) = average_share(limit, window_ms, divisor);
                Algorithm::SlidingLog { limit, window_ms }
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => {
                let (rate, period_ms) = average_share(rate, period_ms, divisor);
                Algorithm::TokenBucket {
                    rate,
                    period_ms,
                    burst: (burst / divisor).max(1),
                }
            }
        }
    }

    /// Decides one request against `state` (`None` for a caller never seen) at `now_ms`.
    ///
    /// The returned [`Evaluation`] says whether this policy alone admits the request, the
    /// state to store if the request is admitted by every policy, and what to report. The
    /// request costs one unit; `evaluate_cost` takes any cost.
    #[cfg(test)]
    pub(crate) fn evaluate(&self, state: Option<State>, now_ms: u64) -> Evaluation {
        self.evaluate_cost(state, now_ms, 1)
    }

    /// Decides one request that consumes `cost` units, all of them or none.
    ///
    /// A refused request reports how long until `cost` units fit (0 when the cost exceeds
    /// the [`quota`](Self::quota): no wait ever admits it). A cost of 0 consumes nothing
    /// and is admitted unless the caller is already over the limit (a peek).
    pub(crate) fn evaluate_cost(&self, state: Option<State>, now_ms: u64, cost: u64) -> Evaluation {
        let current = self.normalize(state, now_ms);
        match self.consume(current, now_ms, cost) {
            Ok(next) => Evaluation {
                admitted: true,
                outcome: self.report(&next, now_ms, true, cost),
                admitted_state: next,
            },
            Err(current) => Evaluation {
                admitted: false,
                outcome: self.report(&current, now_ms, false, cost),
                admitted_state: current,
            },
        }
    }

    /// What this policy reports for `state` without consuming anything: used for the
    /// policies that would have admitted a request that another policy refused.
    #[cfg(test)]
    pub(crate) fn peek(&self, state: Option<State>, now_ms: u64) -> PolicyOutcome {
        self.peek_cost(state, now_ms, 1)
    }

    /// What this policy reports for a request of `cost` units without consuming anything:
    /// whether they would fit, what remains, and for a cost that does not fit, how long
    /// until it does.
    pub(crate) fn peek_cost(&self, state: Option<State>, now_ms: u64, cost: u64) -> PolicyOutcome {
        let current = self.normalize(state, now_ms);
        let admits = match *self {
            // Decided without the copy that admitting makes.
            Algorithm::SlidingLog { limit, .. } => sliding_log::fits(limit, &current, cost),
            _ => self.consume(current.clone(), now_ms, cost).is_ok(),
        };
        self.report(&current, now_ms, admits, cost)
    }

    /// [`refund`](Self::refund) on the crate's own state.
    pub(crate) fn refund_state(
        &self,
        state: Option<State>,
        counted_at_ms: u64,
        cost: u64,
        now_ms: u64,
    ) -> Option<State> {
        // A caller with no state has nothing to give back (it expired: the units no longer
        // weigh).
        let stored_ms = match state.as_ref()? {
            State::TokenBucket { updated_ms, .. } => Some(*updated_ms),
            _ => None,
        };
        let current = self.normalize(state, now_ms);
        match *self {
            Algorithm::SlidingWindow { window_ms, .. } => {
                sliding_window::refund(window_ms, current, counted_at_ms, cost)
            }
            Algorithm::SlidingLog { .. } => sliding_log::refund(current, counted_at_ms, cost),
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => {
                // A state of another algorithm is a full bucket: nothing to give back.
                let updated_ms = stored_ms?;
                token_bucket::refund(
                    rate,
                    period_ms,
                    burst,
                    updated_ms,
                    current,
                    counted_at_ms,
                    cost,
                    now_ms,
                )
            }
        }
    }

    /// The same algorithm with a quota of `quota` units in the same window: a sliding
    /// window's or log's limit, or a token bucket's rate, its burst scaled alike (at least
    /// 1). Clamped to what the algorithm can count exactly (and a log's largest limit); 0 is
    /// taken as 1.
    pub(crate) fn with_quota(&self, quota: u64) -> Self {
        let quota = quota.max(1);
        let most = |window_ms: u64| ((MAX_EXACT - 1) / u128::from(window_ms.max(1))) as u64;
        match *self {
            Algorithm::SlidingWindow { window_ms, .. } => Algorithm::SlidingWindow {
                limit: quota.min(most(window_ms)),
                window_ms,
            },
            Algorithm::SlidingLog { window_ms, .. } => Algorithm::SlidingLog {
                limit: quota.min(most(window_ms)).min(Self::MAX_LOG_LIMIT),
                window_ms,
            },
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => {
                let rate_now = quota.min(most(period_ms));
                let scaled = u128::from(burst) * u128::from(rate_now) / u128::from(rate);
                Algorithm::TokenBucket {
                    rate: rate_now,
                    period_ms,
                    burst: (scaled as u64).clamp(1, most(period_ms)),
                }
            }
        }
    }

    /// Counts `units` more against `state` at `now_ms` whether or not they fit: what a
    /// request turned out to cost beyond what it was admitted for. Past the quota the
    /// caller is in debt, and later requests are refused until it has drained. The outcome
    /// reports what remains and, when nothing does, the wait until one unit fits.
    pub(crate) fn charge_state(&self, state: Option<State>, now_ms: u64, units: u64) -> Evaluation {
        let current = self.normalize(state, now_ms);
        let next = match *self {
            Algorithm::SlidingWindow { .. } => sliding_window::charge(current, units),
            Algorithm::TokenBucket {
                rate, period_ms, ..
            } => token_bucket::charge(rate, period_ms, current, now_ms, units),
            Algorithm::SlidingLog { .. } => sliding_log::charge(current, now_ms, units),
        };
        let outcome = self.peek_cost(Some(next.clone()), now_ms, 1);
        Evaluation {
            admitted: true,
            outcome,
            admitted_state: next,
        }
    }

    /// [`is_idle`](Self::is_idle) on the crate's own state.
    pub(crate) fn is_idle_state(&self, state: State, now_ms: u64) -> bool {
        let state = self.normalize(Some(state), now_ms);
        match *self {
            Algorithm::SlidingWindow { .. } => sliding_window::is_idle(state),
            Algorithm::TokenBucket {
                period_ms, burst, ..
            } => token_bucket::is_idle(period_ms, burst, state),
            Algorithm::SlidingLog { .. } => sliding_log::is_idle(&state),
        }
    }

    /// Brings a stored state to `now_ms`: rolls the windows, refills the bucket. A state of
    /// another algorithm (a policy whose algorithm changed) starts afresh.
    fn normalize(&self, state: Option<State>, now_ms: u64) -> State {
        match *self {
            Algorithm::SlidingWindow { window_ms, .. } => {
                sliding_window::normalize(window_ms, state, now_ms)
            }
            Algorithm::SlidingLog { window_ms, .. } => {
                sliding_log::normalize(window_ms, state, now_ms)
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => token_bucket::normalize(rate, period_ms, burst, state, now_ms),
        }
    }

    /// The state after consuming `cost` units, or (`Err`) the state unchanged when they do
    /// not fit.
    fn consume(&self, state: State, now_ms: u64, cost: u64) -> Result<State, State> {
        // Checked first, so the products below stay within the bounds the constructors set.
        if cost > self.quota() {
            return Err(state);
        }
        match *self {
            Algorithm::SlidingWindow { limit, window_ms } => {
                sliding_window::consume(limit, window_ms, &state, now_ms, cost).ok_or(state)
            }
            Algorithm::TokenBucket { period_ms, .. } => {
                token_bucket::consume(period_ms, &state, cost).ok_or(state)
            }
            Algorithm::SlidingLog { limit, .. } => sliding_log::consume(limit, state, now_ms, cost),
        }
    }

    /// What to report for `state`; `admitted` says whether `cost` units fit (a refusal
    /// reports the wait until they do).
    fn report(&self, state: &State, now_ms: u64, admitted: bool, cost: u64) -> PolicyOutcome {
        match *self {
            Algorithm::SlidingWindow { limit, window_ms } => {
                sliding_window::report(limit, window_ms, state, now_ms, admitted, cost)
            }
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => token_bucket::report(rate, period_ms, burst, state, now_ms, admitted, cost),
            Algorithm::SlidingLog { limit, window_ms } => {
                sliding_log::report(limit, window_ms, state, now_ms, admitted, cost)
            }
        }
    }
}

/// One of `divisor` shares of `quota` per `window_ms`, as a quota and a window whose rate
/// is at most `quota / divisor` per `window_ms`: rounded down in the same window, or for a
/// quota below the divisor, one request per as many windows as that takes (rounded up to
/// the next millisecond so the rate never rounds up).
fn average_share(quota: u64, window_ms: u64, divisor: u64) -> (u64, u64) {
    if quota >= divisor {
        return (quota / divisor, window_ms);
    }
    let stretched = ceil_div(
        u128::from(window_ms) * u128::from(divisor),
        u128::from(quota),
    );
    (1, stretched.min((MAX_EXACT - 1) as u64))
}

fn ceil_div(numerator: u128, denominator: u128) -> u64 {
    // Operands below 2^64 (the usual case: quotas keep products under 2^53) take the
    // native division, several times cheaper than the 128-bit one; the result is the same.
    if let (Ok(numerator), Ok(denominator)) = (u64::try_from(numerator), u64::try_from(denominator))
    {
        return numerator.div_ceil(denominator);
    }
    u64::try_from(numerator.div_ceil(denominator)).unwrap_or(u64::MAX)
}

/// `numerator / denominator`, rounded down: the native division when both fit 64 bits (the
/// usual case), the 128-bit one otherwise; the result is the same.
fn floor_div(numerator: u128, denominator: u128) -> u128 {
    if let (Ok(numerator), Ok(denominator)) = (u64::try_from(numerator), u64::try_from(denominator))
    {
        return u128::from(numerator / denominator);
    }
    numerator / denominator
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A caller's stored state for one policy, as the arithmetic reads it; public as the
/// opaque [`PolicyState`](crate::store::PolicyState).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Counts of the current and the previous fixed window.
    SlidingWindow {
        /// Start of the current fixed window, ms since the epoch.
        window_start: u64,
        /// Requests admitted in the previous window.
        previous: u64,
        /// Requests admitted in the current window.
        current: u64,
    },
    /// The bucket's level in units where one token is `period_ms` units and `rate` units
    /// flow in per millisecond, so refill stays in integers.
    TokenBucket {
        /// Tokens times `period_ms`.
        level: u64,
        /// When the level was computed, ms since the epoch.
        updated_ms: u64,
    },
    /// The times of the units admitted in the last window.
    SlidingLog(AdmissionLog),
}

/// A sliding window's or a token bucket's state on plain numbers, as the in-process store
/// packs it: `[window_start, previous, current]`, or `[level, updated_ms, 0]`.
pub(crate) type Numbers = [u64; 3];

/// One policy's verdict on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Evaluation {
    /// Whether this policy alone admits the request.
    pub(crate) admitted: bool,
    /// The state to store when every policy admits (the unchanged state otherwise).
    pub(crate) admitted_state: State,
    /// What to report for this policy.
    pub(crate) outcome: PolicyOutcome,
}

impl PolicyOutcome {
    /// An outcome that reports nothing left and nothing to wait for: what a state of the
    /// wrong shape reports.
    pub(crate) fn nothing(admitted: bool) -> Self {
        Self {
            admitted,
            remaining: 0,
            reset_ms: 0,
        }
    }
}

/// What a store reports for one policy of one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOutcome {
    /// Whether this policy admitted the request (or would have, when another refused).
    pub admitted: bool,
    /// Requests that would still be admitted now (`r`).
    pub remaining: u64,
    /// Milliseconds until `remaining` grows by one; for a refused policy, until the
    /// request's cost would fit (0 when it never can: it exceeds the quota). Zero when
    /// nothing is consumed.
    pub reset_ms: u64,
}

/// A [`PolicyOutcome`] in two words, whether it admitted as the wait's top bit: what a
/// report keeps per policy (16 bytes rather than 24), and what comes back from a
/// compare-and-swap in two registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutcomeWords {
    remaining: u64,
    reset_ms_admitted: u64,
}

impl OutcomeWords {
    const ADMITTED: u64 = 1 << 63;
    /// The longest wait the words can hold (about 292 million years).
    pub(crate) const LONGEST_WAIT_MS: u64 = Self::ADMITTED - 1;

    /// `outcome`, its wait kept as at most `longest_wait_ms` (at most
    /// [`LONGEST_WAIT_MS`](Self::LONGEST_WAIT_MS); a holder that keeps marker values above
    /// every outcome chooses less).
    #[inline]
    pub(crate) fn of(outcome: PolicyOutcome, longest_wait_ms: u64) -> Self {
        let admitted = if outcome.admitted { Self::ADMITTED } else { 0 };
        Self {
            remaining: outcome.remaining,
            reset_ms_admitted: outcome.reset_ms.min(longest_wait_ms) | admitted,
        }
    }

    /// Admitted words with a wait of `wait_bits`: no outcome's, for a holder that keeps
    /// every outcome's wait below it.
    pub(crate) const fn marker(wait_bits: u64) -> Self {
        Self {
            remaining: 0,
            reset_ms_admitted: Self::ADMITTED | wait_bits,
        }
    }

    #[inline]
    pub(crate) fn get(self) -> PolicyOutcome {
        PolicyOutcome {
            admitted: self.reset_ms_admitted & Self::ADMITTED != 0,
            remaining: self.remaining,
            reset_ms: self.reset_ms_admitted & !Self::ADMITTED,
        }
    }
}

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_third_of_two_waits_for_half_the_next_window() {
        let per_second = Algorithm::sliding_window(2, Duration::from_secs(1));
        let first = per_second.evaluate(None, 1_000);
        assert!(first.admitted);
        assert_eq!(first.outcome.remaining, 1);
        let second = per_second.evaluate(Some(first.admitted_state), 1_000);
        let third = per_second.evaluate(Some(second.admitted_state), 1_000);
        assert!(!third.admitted);
        // The next window starts at 2 s with both requests weighing fully; half of that
        // window must pass before one fits again.
        assert_eq!(third.outcome.reset_ms, 1_500);
    }

    #[test]
    fn a_cost_is_consumed_whole_or_not_at_all() {
        let per_second = Algorithm::sliding_window(50, Duration::from_secs(1));
        let batch = per_second.evaluate_cost(None, 1_000, 30);
        assert!(batch.admitted);
        assert_eq!(batch.outcome.remaining, 20);
        let too_big = per_second.evaluate_cost(Some(batch.admitted_state), 1_000, 21);
        assert!(!too_big.admitted);
        // 21 units fit once the next window has begun and enough of this one's 30 have
        // slid out (30 x 966/1000 + 21 <= 50): 1,034 ms from now.
        assert_eq!(too_big.outcome.reset_ms, 1_034);
    }

    #[test]
    fn a_peek_says_how_long_until_a_cost_fits() {
        let bucket = Algorithm::token_bucket(10, Duration::from_secs(1), 20);
        let state = bucket.evaluate_cost(None, 0, 15).admitted_state;
        let ten_more = bucket.peek_cost(Some(state), 0, 10);
        assert!(!ten_more.admitted);
        assert_eq!(ten_more.remaining, 5);
        // 5 more tokens at 10 a second.
        assert_eq!(ten_more.reset_ms, 500);
    }

    fn window(limit: u64, secs: u64) -> Algorithm {
        Algorithm::sliding_window(limit, Duration::from_secs(secs))
    }

    #[test]
    fn sliding_window_carries_the_previous_window() {
        let a = window(10, 10);
        let mut state = None;
        for _ in 0..10 {
            let e = a.evaluate(state, 19_000);
            assert!(e.admitted);
            state = Some(e.admitted_state);
        }
        // 0.5 s into the next window, 95% of the previous window still counts.
        let e = a.evaluate(state.clone(), 20_500);
        assert!(!e.admitted);
        assert_eq!(e.outcome.reset_ms, 500);
        assert!(a.evaluate(state, 21_000).admitted);
    }

    #[test]
    fn token_bucket_refills_at_its_rate() {
        let a = Algorithm::token_bucket(2, Duration::from_secs(1), 2);
        let first = a.evaluate(None, 0);
        let second = a.evaluate(Some(first.admitted_state), 0);
        let third = a.evaluate(Some(second.admitted_state.clone()), 0);
        assert!(first.admitted && second.admitted && !third.admitted);
        assert_eq!(third.outcome.reset_ms, 500);
        assert!(a.evaluate(Some(second.admitted_state), 500).admitted);
    }

    #[test]
    fn a_refund_goes_to_the_window_it_was_counted_in() {
        let a = window(5, 10);
        let counted = a.evaluate_cost(None, 12_000, 3).admitted_state;
        // Still the current window: its count goes down, never below 0.
        let back = a
            .refund_state(Some(counted.clone()), 12_000, 2, 15_000)
            .expect("given back");
        assert!(matches!(back, State::SlidingWindow { current: 1, .. }));
        let back = a
            .refund_state(Some(back), 12_000, 2, 15_000)
            .expect("given back");
        assert!(matches!(back, State::SlidingWindow { current: 0, .. }));
        assert_eq!(a.refund_state(Some(back), 12_000, 2, 15_000), None);
        // In the next window the units still weigh as the previous window's count.
        let back = a
            .refund_state(Some(counted.clone()), 12_000, 3, 21_000)
            .expect("given back");
        assert!(matches!(
            back,
            State::SlidingWindow {
                previous: 0,
                current: 0,
                ..
            }
        ));
        // Two windows on they weigh nothing: nothing to give back.
        assert_eq!(a.refund_state(Some(counted), 12_000, 3, 31_000), None);
        assert_eq!(a.refund_state(None, 12_000, 3, 12_000), None);
    }

    #[test]
    fn a_refund_never_overfills_the_bucket() {
        let a = Algorithm::token_bucket(1, Duration::from_secs(1), 4);
        let counted = a.evaluate_cost(None, 0, 3).admitted_state;
        // One token refilled since: giving back 3 would make 5; the bucket holds 4.
        let back = a
            .refund_state(Some(counted), 0, 3, 1_000)
            .expect("given back");
        assert_eq!(a.peek(Some(back.clone()), 1_000).remaining, 4);
        assert_eq!(a.refund_state(Some(back), 0, 1, 1_000), None);
    }

    /// Burst 2, one token a second: R1 admitted at 0; R2 and R3 admitted 1.2 s later
    /// (the bucket had refilled to full); R1 given back 34 ms after that. Had R1 never
    /// counted, the bucket would have been full at 1.2 s all the same and empty after R2
    /// and R3: R4 must be refused.
    #[test]
    fn regression_a_token_bucket_refund_never_adds_tokens_the_bucket_refilled() {
        let a = Algorithm::token_bucket(1, Duration::from_secs(1), 2);
        let r1 = a.evaluate(None, 0);
        let r2 = a.evaluate(Some(r1.admitted_state), 1_200);
        let r3 = a.evaluate(Some(r2.admitted_state), 1_200);
        assert!(r1.admitted && r2.admitted && r3.admitted);
        let state = a
            .refund_state(Some(r3.admitted_state.clone()), 0, 1, 1_234)
            .unwrap_or(r3.admitted_state);
        let r4 = a.evaluate(Some(state), 1_234);
        let never_counted = a.evaluate(
            Some(
                a.evaluate(Some(a.evaluate(None, 1_200).admitted_state), 1_200)
                    .admitted_state,
            ),
            1_234,
        );
        assert!(!never_counted.admitted);
        assert!(
            !r4.admitted,
            "R4 admitted after the refund with {} tokens left",
            r4.outcome.remaining
        );
    }

    /// A request that read the clock at 1,000 but reached the bucket after one that read
    /// 1,005 must not move the bucket's time back: the interval would be refilled twice.
    #[test]
    fn regression_a_token_bucket_time_never_moves_backwards() {
        // One token a millisecond, 100 at most.
        let a = Algorithm::token_bucket(1_000, Duration::from_secs(1), 100);
        let first = a.evaluate_cost(None, 1_005, 50);
        let late = a.evaluate_cost(Some(first.admitted_state.clone()), 1_000, 20);
        let after = a.evaluate_cost(Some(late.admitted_state), 1_005, 1);
        let in_order = a.evaluate_cost(
            Some(
                a.evaluate_cost(Some(first.admitted_state), 1_005, 20)
                    .admitted_state,
            ),
            1_005,
            1,
        );
        assert!(late.admitted && after.admitted);
        assert_eq!(
            after.outcome.remaining, in_order.outcome.remaining,
            "the level after a late request: {:?}",
            after.admitted_state
        );
    }

    #[test]
    fn a_cost_above_the_quota_never_fits_and_reports_no_wait() {
        let a = window(5, 1);
        let e = a.evaluate_cost(None, 0, 6);
        assert!(!e.admitted);
        assert_eq!((e.outcome.remaining, e.outcome.reset_ms), (5, 0));
        let b = Algorithm::token_bucket(1, Duration::from_secs(1), 4);
        let e = b.evaluate_cost(None, 0, 5);
        assert!(!e.admitted);
        assert_eq!((e.outcome.remaining, e.outcome.reset_ms), (4, 0));
    }

    #[test]
    fn a_sliding_log_counts_each_unit_for_one_window() {
        let a = Algorithm::sliding_log(3, Duration::from_secs(10));
        let first = a.evaluate_cost(None, 1_000, 2);
        assert!(first.admitted);
        assert_eq!(
            (first.outcome.remaining, first.outcome.reset_ms),
            (1, 10_000)
        );
        let second = a.evaluate(Some(first.admitted_state), 4_000);
        assert_eq!(
            (second.outcome.remaining, second.outcome.reset_ms),
            (0, 7_000)
        );
        // Full: two units must leave for 2 to fit, the second of them at 11 s.
        let refused = a.evaluate_cost(Some(second.admitted_state.clone()), 10_999, 2);
        assert!(!refused.admitted);
        assert_eq!(
            (refused.outcome.remaining, refused.outcome.reset_ms),
            (0, 1)
        );
        // At 11 s the two units of 1 s have left; the one of 4 s is still in.
        let later = a.evaluate_cost(Some(second.admitted_state.clone()), 11_000, 2);
        assert!(later.admitted);
        assert_eq!(later.outcome.remaining, 0);
        // A refund takes out the units of its own decision, not later ones.
        let back = a
            .refund_state(Some(second.admitted_state.clone()), 1_000, 5, 5_000)
            .expect("given back");
        assert_eq!(a.peek(Some(back.clone()), 5_000).remaining, 2);
        assert_eq!(a.refund_state(Some(back), 1_000, 1, 5_000), None);
        assert_eq!(
            a.refund_state(Some(second.admitted_state.clone()), 2_000, 1, 5_000),
            None
        );
        // Once out of the window, nothing to give back.
        assert_eq!(
            a.refund_state(Some(second.admitted_state), 1_000, 1, 11_000),
            None
        );
        // A cost above the limit never fits and reports no wait.
        let e = a.evaluate_cost(None, 0, 4);
        assert!(!e.admitted);
        assert_eq!((e.outcome.remaining, e.outcome.reset_ms), (3, 0));
    }

    #[test]
    fn a_sliding_log_stays_sorted_when_the_clock_moves_back() {
        let a = Algorithm::sliding_log(2, Duration::from_secs(1));
        let late = a.evaluate(None, 5_000).admitted_state;
        let early = a.evaluate(Some(late), 4_000).admitted_state;
        let State::SlidingLog(log) = &early else {
            panic!("a log: {early:?}");
        };
        assert_eq!(log.times().collect::<Vec<_>>(), [5_000, 5_000]);
        assert!(!a.evaluate(Some(early.clone()), 5_999).admitted);
        assert!(a.is_idle_state(early, 6_000));
    }

    #[test]
    fn idle_after_retention() {
        let a = window(5, 1);
        let e = a.evaluate(None, 10_500);
        assert!(!a.is_idle_state(e.admitted_state.clone(), 11_999));
        assert!(a.is_idle_state(e.admitted_state, 12_000));
    }
}
