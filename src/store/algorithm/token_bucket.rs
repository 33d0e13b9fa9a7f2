//! The token bucket: holds up to `burst` tokens, refills `rate` tokens every `period_ms`,
//! and each request takes one. The level is kept in units where one token is `period_ms`
//! units and `rate` units flow in per millisecond, so refill stays in integers.
//! lua/algorithm/token_bucket.lua is its transcription for Redis.

use super::{Divisor, PolicyOutcome, State, gcd};

/// The state brought to `now_ms`: the bucket refilled, or a full one. A state of another
/// algorithm starts afresh.
///
/// The stored time never moves back: a request that read the clock before another but
/// reached the bucket after it refills nothing and keeps the later time (moved back, the
/// interval in between would be refilled a second time by the next request).
pub(super) fn normalize(
    rate: u64,
    period_ms: u64,
    burst: u64,
    state: Option<State>,
    now_ms: u64,
) -> State {
    let stored = match state {
        Some(State::TokenBucket { level, updated_ms }) => Some([level, updated_ms]),
        _ => None,
    };
    let [level, updated_ms] = refill(rate, period_ms, burst, stored, now_ms);
    State::TokenBucket { level, updated_ms }
}

/// [`normalize`] on the numbers of a bucket's state, `[level, updated_ms]`: the arithmetic
/// itself, which the in-process store's packed states use without building a
/// [`State`].
#[inline]
pub(super) fn refill(
    rate: u64,
    period_ms: u64,
    burst: u64,
    stored: Option<[u64; 2]>,
    now_ms: u64,
) -> [u64; 2] {
    // In 64 bits when the products fit (always, for the quotas the constructors allow: a
    // capacity below 2^53), in 128 otherwise; the result is the same.
    let elapsed = now_ms.saturating_sub(updated_ms_of(stored, now_ms));
    if let Some(capacity) = burst.checked_mul(period_ms) {
        return match stored {
            Some([level, updated_ms]) => {
                let refilled = elapsed
                    .checked_mul(rate)
                    .and_then(|flowed| flowed.checked_add(level))
                    .map_or(capacity, |level| level.min(capacity));
                [refilled, updated_ms.max(now_ms)]
            }
            None => [capacity, now_ms],
        };
    }
    let capacity = u128::from(burst) * u128::from(period_ms);
    match stored {
        Some([level, updated_ms]) => {
            let level = (u128::from(level) + u128::from(elapsed) * u128::from(rate)).min(capacity);
            [level as u64, updated_ms.max(now_ms)]
        }
        None => [capacity as u64, now_ms],
    }
}

/// The time of a stored state (none: now, so nothing flows in).
fn updated_ms_of(stored: Option<[u64; 2]>, now_ms: u64) -> u64 {
    stored.map_or(now_ms, |[_, updated_ms]| updated_ms)
}

/// The state after taking `cost` tokens (at most the burst), if there are that many.
pub(super) fn consume(period_ms: u64, state: &State, cost: u64) -> Option<State> {
    let State::TokenBucket { level, updated_ms } = *state else {
        return None;
    };
    let [level, updated_ms] = take(period_ms, [level, updated_ms], cost)?;
    Some(State::TokenBucket { level, updated_ms })
}

/// [`consume`] on the numbers of a refilled bucket's state.
#[inline]
pub(super) fn take(period_ms: u64, [level, updated_ms]: [u64; 2], cost: u64) -> Option<[u64; 2]> {
    let needed = cost * period_ms;
    (level >= needed).then(|| [level - needed, updated_ms])
}

/// The state after taking `units` tokens at `now_ms` whether or not there are that many:
/// what a bucket holds goes first, and the rest is a debt, kept as a time of the level after
/// `now_ms` (the level, 0, starts refilling only then), so later requests wait until it has
/// refilled.
pub(super) fn charge(rate: u64, period_ms: u64, state: State, now_ms: u64, units: u64) -> State {
    let State::TokenBucket { level, updated_ms } = state else {
        return state;
    };
    let needed = u128::from(units) * u128::from(period_ms);
    if u128::from(level) >= needed {
        return State::TokenBucket {
            level: level - needed as u64,
            updated_ms,
        };
    }
    let debt = needed - u128::from(level);
    let wait = u64::try_from(debt.div_ceil(u128::from(rate))).unwrap_or(u64::MAX);
    State::TokenBucket {
        level: 0,
        updated_ms: updated_ms.max(now_ms).saturating_add(wait),
    }
}

/// The state `current` (the stored state brought to now) with the tokens of a request of
/// `cost` counted at `counted_at_ms` put back, as many as a bucket that never counted it
/// would hold more; `None` when that is none. `stored_ms` is the stored state's time, the
/// last write before now.
///
/// Such a bucket holds `cost` tokens more from the count on, less the refill it lost to
/// being full, which this one did not. Up to the last write that loss is at most what
/// flowed in since the count; after it this bucket only filled, so capping at the capacity
/// accounts for the rest. A state written before the count does not hold it: nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn refund(
    rate: u64,
    period_ms: u64,
    burst: u64,
    stored_ms: u64,
    current: State,
    counted_at_ms: u64,
    cost: u64,
    now_ms: u64,
) -> Option<State> {
    let State::TokenBucket { level, updated_ms } = current else {
        return None;
    };
    if updated_ms > now_ms {
        // In debt (a charge past the bucket): what comes back pays the debt off first, as
        // much of it as the refill would have, rounded down to whole milliseconds.
        let owed = u128::from(cost) * u128::from(period_ms);
        let paid_ms = u64::try_from(owed / u128::from(rate))
            .unwrap_or(u64::MAX)
            .min(updated_ms - now_ms);
        let left = owed - u128::from(paid_ms) * u128::from(rate);
        let capacity = u128::from(burst) * u128::from(period_ms);
        let updated_ms = updated_ms - paid_ms;
        let level = if updated_ms > now_ms {
            0
        } else {
            left.min(capacity) as u64
        };
        return (paid_ms > 0 || level > 0).then_some(State::TokenBucket { level, updated_ms });
    }
    let since = stored_ms.checked_sub(counted_at_ms)?;
    let capacity = u128::from(burst) * u128::from(period_ms);
    let owed = u128::from(cost.min(burst)) * u128::from(period_ms);
    let back = owed.saturating_sub(u128::from(since) * u128::from(rate));
    let refilled = (u128::from(level) + back).min(capacity);
    (refilled > u128::from(level)).then_some(State::TokenBucket {
        level: refilled as u64,
        updated_ms,
    })
}

/// The whole tokens left, and how long until one more is (for a refusal, until `cost`
/// are).
pub(super) fn report(
    rate: u64,
    period_ms: u64,
    burst: u64,
    state: &State,
    now_ms: u64,
    admitted: bool,
    cost: u64,
) -> PolicyOutcome {
    let State::TokenBucket { level, updated_ms } = *state else {
        return PolicyOutcome::nothing(admitted);
    };
    report_level(
        Divisor::new(rate),
        Divisor::new(period_ms),
        burst,
        [level, updated_ms],
        now_ms,
        admitted,
        cost,
    )
}

/// [`report`] on a bucket's level and its time (after `now_ms` while in debt: the refill
/// starts then).
#[inline]
pub(super) fn report_level(
    rate: Divisor,
    period: Divisor,
    burst: u64,
    [level, updated_ms]: [u64; 2],
    now_ms: u64,
    admitted: bool,
    cost: u64,
) -> PolicyOutcome {
    let remaining = period.divide(level);
    let units = if admitted { remaining + 1 } else { cost };
    let reset_ms = if (admitted && remaining >= burst) || units > burst {
        0
    } else {
        let needed =
            (u128::from(units) * u128::from(period.get())).saturating_sub(u128::from(level));
        rate.divide_ceil_wide(needed)
            .saturating_add(updated_ms.saturating_sub(now_ms))
    };
    PolicyOutcome {
        admitted,
        remaining,
        reset_ms,
    }
}

/// Whether a normalized state is a full bucket, which affects no decision.
pub(super) fn is_idle(period_ms: u64, burst: u64, state: State) -> bool {
    match state {
        State::TokenBucket { level, .. } => {
            u128::from(level) >= u128::from(burst) * u128::from(period_ms)
        }
        _ => true,
    }
}

/// A token bucket's numbers in the units the in-process store's packed level counts in:
/// the greatest common divisor of its rate and period, so that levels stay small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BucketUnits {
    pub(super) unit: u64,
    /// Units flowing in per millisecond.
    rate: Divisor,
    /// Units a token takes.
    period: Divisor,
    burst: u64,
    /// Units in a full bucket.
    capacity: u64,
}

impl BucketUnits {
    /// For a bucket whose states pack: its packing checked that a full bucket, in these
    /// units, fits the word's level bits.
    pub(super) fn new(rate: u64, period_ms: u64, burst: u64) -> Self {
        let unit = gcd(rate, period_ms);
        let period = period_ms / unit;
        Self {
            unit,
            rate: Divisor::new(rate / unit),
            period: Divisor::new(period),
            burst,
            capacity: burst * period,
        }
    }
}

/// The decision, the report and the state to write (the state brought to now, for a
/// refusal) for a request of `cost` tokens, on a level counted in `bucket`'s units and its
/// time: the arithmetic of [`refill`], [`take`] and [`report_level`], on levels `unit`
/// times smaller. It divides out exactly: the refill, the take and the whole tokens left
/// are the same, and so is the wait, `ceil(unit·x / unit·r)`; and no product needs more
/// than 64 bits.
#[inline]
pub(super) fn decide_in_units(
    bucket: &BucketUnits,
    [level, updated_ms]: [u64; 2],
    now_ms: u64,
    cost: u64,
) -> (PolicyOutcome, [u64; 2]) {
    let BucketUnits {
        rate,
        period,
        burst,
        capacity,
        ..
    } = *bucket;
    // A product too large for 64 bits fills the bucket, as in `refill`.
    let flowed = now_ms.saturating_sub(updated_ms).saturating_mul(rate.get());
    let level = level.saturating_add(flowed).min(capacity);
    // The stored time never moves back.
    let updated_ms = updated_ms.max(now_ms);
    let needed = cost.saturating_mul(period.get());
    let admitted = cost <= burst && level >= needed;
    let level = if admitted { level - needed } else { level };
    let remaining = period.divide(level);
    let units = if admitted { remaining + 1 } else { cost };
    let reset_ms = if (admitted && remaining >= burst) || units > burst {
        0
    } else {
        // `units` is at most the burst here, so its product is at most the capacity.
        rate.divide_ceil((units * period.get()).saturating_sub(level))
            .saturating_add(updated_ms - now_ms)
    };
    let outcome = PolicyOutcome {
        admitted,
        remaining,
        reset_ms,
    };
    (outcome, [level, updated_ms])
}
