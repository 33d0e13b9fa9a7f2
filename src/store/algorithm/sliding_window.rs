//! The sliding window counter: the previous fixed window's count, weighted by how much of
//! it still overlaps the sliding window, plus the current window's count.
//! lua/algorithm/sliding_window.lua is its transcription for Redis.

use super::{Divisor, PolicyOutcome, State, floor_div};

/// The state brought to `now_ms`: the window rolled forward, or a fresh one. A state of
/// another algorithm starts afresh.
pub(super) fn normalize(window_ms: u64, state: Option<State>, now_ms: u64) -> State {
    let counts = match state {
        Some(State::SlidingWindow {
            window_start,
            previous,
            current,
        }) => [window_start, previous, current],
        _ => [0, 0, 0],
    };
    let [window_start, previous, current] = roll(Divisor::new(window_ms), counts, now_ms);
    State::SlidingWindow {
        window_start,
        previous,
        current,
    }
}

/// [`normalize`] on the numbers of a window's state, `[window_start, previous, current]`
/// (`[0, 0, 0]` for none): the arithmetic itself, which the in-process store's packed
/// states use without building a [`State`].
#[inline]
pub(super) fn roll(
    window: Divisor,
    [window_start, previous, current]: [u64; 3],
    now_ms: u64,
) -> [u64; 3] {
    let window_ms = window.get();
    let start = now_ms - window.remainder(now_ms);
    if window_start == start {
        [start, previous, current]
    } else if window_start.checked_add(window_ms) == Some(start) {
        [start, current, 0]
    } else if window_start > start {
        // A state from the future (clock moved back): keep it, it only makes the
        // limiter stricter until time catches up.
        [window_start, previous, current]
    } else {
        [start, 0, 0]
    }
}

/// The state after admitting a request of `cost` units (at most `limit`), if it fits.
pub(super) fn consume(
    limit: u64,
    window_ms: u64,
    state: &State,
    now_ms: u64,
    cost: u64,
) -> Option<State> {
    let State::SlidingWindow {
        window_start,
        previous,
        current,
    } = *state
    else {
        return None;
    };
    let [window_start, previous, current] = take(
        limit,
        window_ms,
        [window_start, previous, current],
        now_ms,
        cost,
    )?;
    Some(State::SlidingWindow {
        window_start,
        previous,
        current,
    })
}

/// [`consume`] on the numbers of a rolled window's state.
#[inline]
pub(super) fn take(
    limit: u64,
    window_ms: u64,
    [window_start, previous, current]: [u64; 3],
    now_ms: u64,
    cost: u64,
) -> Option<[u64; 3]> {
    let elapsed = now_ms.saturating_sub(window_start).min(window_ms);
    fits(limit, window_ms, previous, current, elapsed, cost)
        .then(|| [window_start, previous, current + cost])
}

/// The state after counting `units` in the current window whether or not they fit: past
/// the limit, later requests are refused until the count has slid out.
pub(super) fn charge(state: State, units: u64) -> State {
    let State::SlidingWindow {
        window_start,
        previous,
        current,
    } = state
    else {
        return state;
    };
    State::SlidingWindow {
        window_start,
        previous,
        current: current.saturating_add(units),
    }
}

/// The state with `cost` units taken off the window they were counted in (at
/// `counted_at_ms`), if that window still weighs: the current one or the previous one.
pub(super) fn refund(window_ms: u64, state: State, counted_at_ms: u64, cost: u64) -> Option<State> {
    let State::SlidingWindow {
        window_start,
        previous,
        current,
    } = state
    else {
        return None;
    };
    let counted_in = counted_at_ms - counted_at_ms % window_ms;
    if counted_in == window_start {
        (current > 0).then(|| State::SlidingWindow {
            window_start,
            previous,
            current: current.saturating_sub(cost),
        })
    } else if counted_in.checked_add(window_ms) == Some(window_start) {
        (previous > 0).then(|| State::SlidingWindow {
            window_start,
            previous: previous.saturating_sub(cost),
            current,
        })
    } else {
        None
    }
}

/// What remains, and how long until one more unit fits (for a refusal, until `cost` do).
pub(super) fn report(
    limit: u64,
    window_ms: u64,
    state: &State,
    now_ms: u64,
    admitted: bool,
    cost: u64,
) -> PolicyOutcome {
    let State::SlidingWindow {
        window_start,
        previous,
        current,
    } = *state
    else {
        return PolicyOutcome::nothing(admitted);
    };
    report_counts(
        limit,
        Divisor::new(window_ms),
        [window_start, previous, current],
        now_ms,
        admitted,
        cost,
    )
}

/// [`report`] on the numbers of a window's state.
#[inline]
pub(super) fn report_counts(
    limit: u64,
    window: Divisor,
    [window_start, previous, current]: [u64; 3],
    now_ms: u64,
    admitted: bool,
    cost: u64,
) -> PolicyOutcome {
    let window_ms = window.get();
    let w = u128::from(window_ms);
    let elapsed = u128::from(now_ms.saturating_sub(window_start).min(window_ms));
    let used = u128::from(previous) * (w - elapsed) + u128::from(current) * w;
    let budget = u128::from(limit) * w;
    let remaining = window.divide_wide(budget.saturating_sub(used)) as u64;
    let units = if admitted { remaining + 1 } else { cost };
    let reset_ms = if (admitted && remaining >= limit) || units > limit {
        0
    } else {
        wait(limit, window_ms, previous, current, elapsed as u64, units)
    };
    PolicyOutcome {
        admitted,
        remaining,
        reset_ms,
    }
}

/// Whether a normalized state no longer affects any decision.
pub(super) fn is_idle(state: State) -> bool {
    matches!(
        state,
        State::SlidingWindow {
            previous: 0,
            current: 0,
            ..
        }
    )
}

/// Whether `cost` more units (at most `limit`) fit beside `previous`, weighted by its
/// overlap, and `current`. Written as `used <= (limit - cost) * w` so that, in Lua too,
/// neither side exceeds `limit * w`.
fn fits(limit: u64, window_ms: u64, previous: u64, current: u64, elapsed: u64, cost: u64) -> bool {
    let w = u128::from(window_ms);
    u128::from(previous) * (w - u128::from(elapsed)) + u128::from(current) * w
        <= u128::from(limit - cost) * w
}

/// Milliseconds from `elapsed` (into the current window) until `units` more requests fit.
fn wait(limit: u64, window_ms: u64, previous: u64, current: u64, elapsed: u64, units: u64) -> u64 {
    let w = u128::from(window_ms);
    if current + units <= limit {
        // Fits in this window once enough of the previous window has slid out.
        if previous == 0 {
            return 0;
        }
        let slack = u128::from(limit - current - units) * w;
        let earliest = w.saturating_sub(floor_div(slack, u128::from(previous)));
        (earliest as u64).saturating_sub(elapsed)
    } else if units <= limit {
        // Only in the next window, where this window's count becomes the previous one.
        let slack = u128::from(limit - units) * w;
        let earliest = if current == 0 {
            0
        } else {
            w.saturating_sub(floor_div(slack, u128::from(current)))
        };
        (window_ms - elapsed) + earliest as u64
    } else {
        u64::MAX
    }
}

/// A sliding window's numbers for the in-process store's packed states, whose counts stay
/// below `2^count_bits`, for a window that `2^(count_bits + 1)` times still fits in 64
/// bits (its packing checked it, see [`fits_in_64_bits`]): what two such counts weigh then
/// does too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct WindowUnits {
    limit: u64,
    pub(super) window: Divisor,
}

impl WindowUnits {
    pub(super) fn new(limit: u64, window_ms: u64) -> Self {
        Self {
            limit,
            window: Divisor::new(window_ms),
        }
    }
}

/// Whether the weighed counts of a window of `window_ms` with counts below `2^count_bits`
/// fit in 64 bits (see [`WindowUnits`]).
pub(super) fn fits_in_64_bits(window_ms: u64, count_bits: u32) -> bool {
    u128::from(window_ms) << (count_bits + 1) <= u128::from(u64::MAX)
}

/// The decision, the report and the state to write (the state brought to now, for a
/// refusal) for a request of `cost` units, on a state whose window is given by its index
/// (its start over the window): the arithmetic of [`roll`], [`take`] and
/// [`report_counts`], with windows compared by index and every product in 64 bits.
#[inline]
pub(super) fn decide_by_index(
    units: &WindowUnits,
    [stored_index, previous, current]: [u64; 3],
    now_ms: u64,
    cost: u64,
) -> (PolicyOutcome, [u64; 3]) {
    let WindowUnits { limit, window } = *units;
    let now_index = window.divide(now_ms);
    // Rolled to now's window; a state from a later window (a clock that moved back) is
    // kept as it is.
    let (index, previous, current) = if stored_index >= now_index {
        (stored_index, previous, current)
    } else if stored_index + 1 == now_index {
        (now_index, current, 0)
    } else {
        (now_index, 0, 0)
    };
    let w = window.get();
    let elapsed = now_ms.saturating_sub(index * w).min(w);
    let weighed = previous * (w - elapsed) + current * w;
    let admitted = cost <= limit && weighed <= (limit - cost) * w;
    let (current, weighed) = if admitted {
        (current + cost, weighed + cost * w)
    } else {
        (current, weighed)
    };
    let remaining = window.divide((limit * w).saturating_sub(weighed));
    let units = if admitted { remaining + 1 } else { cost };
    let reset_ms = if (admitted && remaining >= limit) || units > limit {
        0
    } else if current + units <= limit {
        // Fits in this window once enough of the previous window has slid out.
        let slack = (limit - current - units) * w;
        slack
            .checked_div(previous)
            .map_or(0, |slid| w.saturating_sub(slid).saturating_sub(elapsed))
    } else {
        // Only in the next window, where this window's count becomes the previous one.
        let earliest = ((limit - units) * w)
            .checked_div(current)
            .map_or(0, |slid| w.saturating_sub(slid));
        (w - elapsed) + earliest
    };
    let outcome = PolicyOutcome {
        admitted,
        remaining,
        reset_ms,
    };
    (outcome, [index, previous, current])
}
