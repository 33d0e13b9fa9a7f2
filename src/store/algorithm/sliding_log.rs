//! The sliding log: the time of every admitted unit in the last window, so that no window
//! of its length ever holds more than the limit. lua/algorithm/sliding_log.lua is its
//! transcription for Redis (a sorted set of admissions scored by their time).

use std::collections::VecDeque;
use std::sync::Arc;

use super::{PolicyOutcome, State};

/// The times (ms since the epoch) of a caller's admitted units, oldest first, one per
/// unit: the state of a [sliding log](super::Algorithm::SlidingLog).
///
/// Cheap to clone (the times are shared); a decision that admits copies them once when
/// they are shared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AdmissionLog {
    times: Arc<VecDeque<u64>>,
}

impl AdmissionLog {
    /// A log of these times (sorted here, oldest first).
    pub(crate) fn from_times(times: impl IntoIterator<Item = u64>) -> Self {
        let mut times: Vec<u64> = times.into_iter().collect();
        times.sort_unstable();
        Self {
            times: Arc::new(times.into()),
        }
    }

    /// The admitted units it holds.
    pub(crate) fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether it holds no admission.
    pub(crate) fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// The admission times, oldest first.
    pub(crate) fn times(&self) -> impl Iterator<Item = u64> + '_ {
        self.times.iter().copied()
    }

    fn newest(&self) -> Option<u64> {
        self.times.back().copied()
    }
}

/// The state brought to `now_ms`: the units older than one window dropped (an entry at
/// `t` counts while `t > now - window`), or an empty log. A state of another algorithm
/// starts afresh.
pub(super) fn normalize(window_ms: u64, state: Option<State>, now_ms: u64) -> State {
    let mut log = match state {
        Some(State::SlidingLog(log)) => log,
        _ => AdmissionLog::default(),
    };
    let expired = |t: &u64| t.saturating_add(window_ms) <= now_ms;
    if log.times.front().is_some_and(expired) {
        let times = Arc::make_mut(&mut log.times);
        while times.front().is_some_and(expired) {
            times.pop_front();
        }
    }
    State::SlidingLog(log)
}

/// Whether `cost` more units fit beside the units in a normalized log.
pub(super) fn fits(limit: u64, state: &State, cost: u64) -> bool {
    let State::SlidingLog(log) = state else {
        return false;
    };
    log.len() as u64 + cost <= limit
}

/// The state after admitting `cost` units at `now_ms` (`Err` with the state unchanged when
/// they do not fit). The log stays sorted: after a clock that moved back, the units are
/// counted at the newest time already there (later, so only stricter).
pub(super) fn consume(limit: u64, state: State, now_ms: u64, cost: u64) -> Result<State, State> {
    if !fits(limit, &state, cost) {
        return Err(state);
    }
    let State::SlidingLog(mut log) = state else {
        return Err(state);
    };
    if cost > 0 {
        let at = log.newest().map_or(now_ms, |newest| newest.max(now_ms));
        let times = Arc::make_mut(&mut log.times);
        times.extend(std::iter::repeat_n(at, cost as usize));
    }
    Ok(State::SlidingLog(log))
}

/// The state after counting `units` at `now_ms` whether or not they fit: past the limit,
/// later requests are refused until enough of them have left the window.
pub(super) fn charge(state: State, now_ms: u64, units: u64) -> State {
    let State::SlidingLog(mut log) = state else {
        return state;
    };
    if units > 0 {
        let at = log.newest().map_or(now_ms, |newest| newest.max(now_ms));
        Arc::make_mut(&mut log.times).extend(std::iter::repeat_n(at, units as usize));
    }
    State::SlidingLog(log)
}

/// The state with up to `cost` of the units admitted at `counted_at_ms` taken out (the
/// ones that admission added: any other unit left out would make the log less strict than
/// never counting the request), if it still holds any.
pub(super) fn refund(state: State, counted_at_ms: u64, cost: u64) -> Option<State> {
    let State::SlidingLog(mut log) = state else {
        return None;
    };
    let first = log.times.partition_point(|&t| t < counted_at_ms);
    let last = log.times.partition_point(|&t| t <= counted_at_ms);
    let taken = (last - first).min(usize::try_from(cost).unwrap_or(usize::MAX));
    if taken == 0 {
        return None;
    }
    Arc::make_mut(&mut log.times).drain(last - taken..last);
    Some(State::SlidingLog(log))
}

/// What remains, and how long until one more unit fits (for a refusal, until `cost` do):
/// until the oldest unit that must leave for them leaves.
pub(super) fn report(
    limit: u64,
    window_ms: u64,
    state: &State,
    now_ms: u64,
    admitted: bool,
    cost: u64,
) -> PolicyOutcome {
    let State::SlidingLog(log) = state else {
        return PolicyOutcome::nothing(admitted);
    };
    let count = log.len() as u64;
    let remaining = limit.saturating_sub(count);
    let units = if admitted { remaining + 1 } else { cost };
    let reset_ms = if (admitted && remaining >= limit) || units > limit {
        0
    } else {
        // The `leaving`th oldest unit must leave for `units` to fit.
        let leaving = (count + units).saturating_sub(limit);
        match leaving
            .checked_sub(1)
            .and_then(|i| log.times.get(usize::try_from(i).ok()?))
        {
            Some(&t) => t.saturating_add(window_ms).saturating_sub(now_ms),
            None => 0,
        }
    };
    PolicyOutcome {
        admitted,
        remaining,
        reset_ms,
    }
}

/// Whether a normalized log no longer affects any decision.
pub(super) fn is_idle(state: &State) -> bool {
    match state {
        State::SlidingLog(log) => log.is_empty(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_times_oldest_first() {
        let log = AdmissionLog::from_times([1_250, 1_000, 1_000]);
        assert_eq!(log.len(), 3);
        assert_eq!(log.times().collect::<Vec<_>>(), [1_000, 1_000, 1_250]);
        assert!(AdmissionLog::default().is_empty());
    }
}
