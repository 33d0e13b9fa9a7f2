//! A caller's stored state for one policy, as a backend keeps it: opaque, so that the
//! arithmetic's representation (the sliding log's shared ring, say) can change freely.

use crate::store::algorithm::{AdmissionLog, Algorithm, PolicyOutcome, State};

/// A caller's stored state for one policy: what a [`Backend`](crate::store::Backend) keeps
/// per caller and [`counter`](crate::Policy::counter) between decisions.
///
/// It is opaque: [`PolicyState::evaluate`] makes and reads it,
/// [`Algorithm::refund`](crate::store::Algorithm::refund) gives units back to it, and
/// [`Algorithm::is_idle`](crate::store::Algorithm::is_idle) says when it can be forgotten.
/// A caller never seen has no state: `None` wherever a state is asked for. Cheap to clone
/// (a sliding log's times are shared).
///
/// A store that keeps states out of process writes each as [`to_bytes`](Self::to_bytes)
/// and reads it back with [`from_bytes`](Self::from_bytes):
///
/// ```
/// use std::time::Duration;
/// use tollgate::Policy;
/// use tollgate::store::{Algorithm, PolicyState};
///
/// let codes = [Policy::new("codes", Algorithm::sliding_log(3, Duration::from_secs(900)))];
/// let (_, admitted) = PolicyState::evaluate(&codes, |_| None, 1_000, 1);
/// let state = admitted.unwrap().remove(0);
/// let stored = state.to_bytes();
/// assert_eq!(PolicyState::from_bytes(&stored), Some(state));
/// assert_eq!(PolicyState::from_bytes(b"not a state"), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyState(State);

/// The first byte of [`PolicyState::to_bytes`]: which algorithm's state follows.
const SLIDING_WINDOW: u8 = 1;
const TOKEN_BUCKET: u8 = 2;
const SLIDING_LOG: u8 = 3;

impl PolicyState {
    /// The state as bytes, to keep out of process: one byte saying which algorithm's state
    /// it is, then its numbers (a sliding window's three counts, a token bucket's level
    /// and time, or a sliding log's admission times), each 8 bytes big-endian. A sliding
    /// log's takes 8 bytes per unit in its window.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (kind, numbers): (u8, Vec<u64>) = match &self.0 {
            State::SlidingWindow {
                window_start,
                previous,
                current,
            } => (SLIDING_WINDOW, vec![*window_start, *previous, *current]),
            State::TokenBucket { level, updated_ms } => (TOKEN_BUCKET, vec![*level, *updated_ms]),
            State::SlidingLog(log) => (SLIDING_LOG, log.times().collect()),
        };
        let mut bytes = Vec::with_capacity(1 + 8 * numbers.len());
        bytes.push(kind);
        for number in numbers {
            bytes.extend_from_slice(&number.to_be_bytes());
        }
        bytes
    }

    /// A state written by [`to_bytes`](Self::to_bytes), or `None` for bytes it did not
    /// write. A store can treat `None` as a caller never seen, which the next decision
    /// starts afresh.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let (&kind, rest) = bytes.split_first()?;
        if rest.len() % 8 != 0 {
            return None;
        }
        let mut numbers = rest
            .chunks_exact(8)
            .map(|chunk| u64::from_be_bytes(chunk.try_into().expect("chunks of 8 bytes")));
        let state = match (kind, rest.len() / 8) {
            (SLIDING_WINDOW, 3) => State::SlidingWindow {
                window_start: numbers.next()?,
                previous: numbers.next()?,
                current: numbers.next()?,
            },
            (TOKEN_BUCKET, 2) => State::TokenBucket {
                level: numbers.next()?,
                updated_ms: numbers.next()?,
            },
            (SLIDING_LOG, _) => State::SlidingLog(AdmissionLog::from_times(numbers)),
            _ => return None,
        };
        Some(Self(state))
    }

    /// The state the arithmetic reads.
    pub(crate) fn into_state(self) -> State {
        self.0
    }

    /// The public face of a state the arithmetic made.
    pub(crate) fn from_state(state: State) -> Self {
        Self(state)
    }
}

/// What a backend asks of an algorithm about a stored state, on the opaque form.
impl Algorithm {
    /// Gives back `cost` units consumed at `counted_at_ms`: the state to store at `now_ms`,
    /// or `None` when there is nothing to give back.
    ///
    /// A refund never admits more than the request had not been counted at all: a sliding
    /// window takes the units off the window they were counted in while it is the current
    /// window or the previous one (where they still weigh), never below 0, and does nothing
    /// once that window has slid out; a token bucket puts back the tokens less what it has
    /// refilled between the count and its last write (a bucket that never counted the
    /// request may have been full meanwhile, and lost that refill), capped at its capacity;
    /// a sliding log takes out up to `cost` of the units admitted at `counted_at_ms` that are
    /// still in its window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    /// use tollgate::store::{Algorithm, PolicyState};
    ///
    /// let per_minute = Algorithm::sliding_window(5, Duration::from_secs(60));
    /// let policies = [Policy::new("per-minute", per_minute)];
    /// // One request counted at 1 s, as a store decides it.
    /// let (outcome, admitted) = PolicyState::evaluate(&policies, |_| None, 1_000, 1);
    /// assert_eq!(outcome.limits()[0].remaining, 4);
    /// let counted = admitted.unwrap().remove(0);
    /// let refunded = per_minute.refund(Some(counted), 1_000, 1, 2_000).unwrap();
    /// // A cost of 0 consumes nothing: it reports what remains.
    /// let (outcome, _) = PolicyState::evaluate(&policies, |_| Some(refunded.clone()), 2_000, 0);
    /// assert_eq!(outcome.limits()[0].remaining, 5);
    ///
    /// // Burst 2, one token a second: R1 at 0, then R2 and R3 at 1.2 s, when the bucket
    /// // was full again. Had R1 never counted it would have been full all the same, so
    /// // giving R1 back at 1.234 s puts nothing back.
    /// let bucket = [Policy::new("bucket", Algorithm::token_bucket(1, Duration::from_secs(1), 2))];
    /// let count = |state: Option<PolicyState>, now| {
    ///     PolicyState::evaluate(&bucket, |_| state.clone(), now, 1).1.unwrap().remove(0)
    /// };
    /// let r3 = count(Some(count(Some(count(None, 0)), 1_200)), 1_200);
    /// let algorithm = bucket[0].algorithm();
    /// assert_eq!(algorithm.refund(Some(r3), 0, 1, 1_234), None);
    /// ```
    pub fn refund(
        &self,
        state: Option<PolicyState>,
        counted_at_ms: u64,
        cost: u64,
        now_ms: u64,
    ) -> Option<PolicyState> {
        self.refund_state(
            state.map(PolicyState::into_state),
            counted_at_ms,
            cost,
            now_ms,
        )
        .map(PolicyState::from_state)
    }

    /// Counts `units` more against `state` at `now_ms`, whether or not they fit: what a
    /// request admitted earlier turned out to cost beyond its reservation
    /// ([`Backend::charge`](crate::store::Backend::charge)). The state to store, and what
    /// the policy reports after it (what remains, and when nothing does, the wait until one
    /// unit fits).
    ///
    /// Past the quota the caller is in debt: a sliding window counts past its limit in the
    /// current window (refused until that count has slid out, within two windows); a token
    /// bucket takes what it holds and keeps the rest as a wait before its level starts
    /// refilling; a sliding log holds the units at `now_ms` (refused until they leave the
    /// window). So over any window, a caller is charged at most its quota plus what one
    /// request cost beyond its reservation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    /// use tollgate::store::{Algorithm, PolicyState};
    ///
    /// // 10 tokens a second, burst 10: a request admitted for 1 token that cost 25.
    /// let bucket = Algorithm::token_bucket(10, Duration::from_secs(1), 10);
    /// let (state, after) = bucket.charge(None, 0, 24);
    /// // 14 tokens past the bucket: 1.4 s of refill pays the debt, 0.1 s more makes a token.
    /// assert_eq!((after.remaining, after.reset_ms), (0, 1_500));
    /// let policies = [Policy::new("tokens", bucket)];
    /// let decide = |now| PolicyState::evaluate(&policies, |_| Some(state.clone()), now, 1).0;
    /// assert!(!decide(1_499).admitted());
    /// assert!(decide(1_500).admitted());
    /// ```
    pub fn charge(
        &self,
        state: Option<PolicyState>,
        now_ms: u64,
        units: u64,
    ) -> (PolicyState, PolicyOutcome) {
        let charged = self.charge_state(state.map(PolicyState::into_state), now_ms, units);
        (
            PolicyState::from_state(charged.admitted_state),
            charged.outcome,
        )
    }

    /// Whether `state` has no effect any more at `now_ms` (an idle caller that can be
    /// forgotten without changing any decision): what a backend may evict.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    /// use tollgate::store::{Algorithm, PolicyState};
    ///
    /// let per_second = Algorithm::sliding_window(5, Duration::from_secs(1));
    /// let policies = [Policy::new("per-second", per_second)];
    /// let (_, admitted) = PolicyState::evaluate(&policies, |_| None, 1_000, 1);
    /// let state = admitted.unwrap().remove(0);
    /// // Counted in the window from 1 s: it still weighs in the next one, not after.
    /// assert!(!per_second.is_idle(state.clone(), 2_500));
    /// assert!(per_second.is_idle(state, 3_000));
    /// ```
    pub fn is_idle(&self, state: PolicyState, now_ms: u64) -> bool {
        self.is_idle_state(state.into_state(), now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_state_reads_back_from_its_bytes() {
        let states = [
            State::SlidingWindow {
                window_start: 1_000,
                previous: 4,
                current: u64::MAX,
            },
            State::TokenBucket {
                level: 7_000,
                updated_ms: 1_234,
            },
            State::SlidingLog(AdmissionLog::from_times([1_000, 1_000, 1_250])),
            State::SlidingLog(AdmissionLog::default()),
        ];
        for state in states {
            let state = PolicyState(state);
            let bytes = state.to_bytes();
            assert_eq!(PolicyState::from_bytes(&bytes), Some(state));
        }
    }

    #[test]
    fn bytes_it_did_not_write_are_no_state() {
        let window = PolicyState(State::SlidingWindow {
            window_start: 1,
            previous: 2,
            current: 3,
        })
        .to_bytes();
        assert_eq!(PolicyState::from_bytes(&window[..window.len() - 1]), None);
        assert_eq!(PolicyState::from_bytes(&window[..17]), None);
        assert_eq!(PolicyState::from_bytes(&[]), None);
        assert_eq!(PolicyState::from_bytes(&[9, 0, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
