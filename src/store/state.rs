//! A caller's stored state for one policy, as a backend keeps it: opaque, so that the
//! arithmetic's representation (the sliding log's shared ring, say) can change freely.

use crate::store::algorithm::{AdmissionLog, State};

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
