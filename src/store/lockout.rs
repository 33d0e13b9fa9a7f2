//! Lockouts, as the in-process store applies them around a decision (lua/policies.lua is
//! their transcription for Redis): a standing block refuses the caller whatever its
//! counters say, the admission that uses a locking policy's quota up starts one, and a
//! block that has ended leaves the caller's counter fresh.

use crate::store::algorithm::State;
use crate::store::backend::CheckOutcome;
use crate::store::policy::Policy;

/// The refusal of a request of `cost` units by the blocks standing at `now_ms`, if any:
/// a blocked policy reports nothing left until its block ends (`until_ms(i)`, 0 for none),
/// the others what they would report, counting nothing.
pub(crate) fn refusal(
    limits: &[Policy],
    now_ms: u64,
    cost: u64,
    until_ms: impl Fn(usize) -> u64,
    mut state: impl FnMut(usize) -> Option<State>,
) -> Option<CheckOutcome> {
    if !(0..limits.len()).any(|i| until_ms(i) > now_ms) {
        return None;
    }
    let outcomes = limits.iter().enumerate().map(|(i, limit)| {
        let until = until_ms(i);
        if until > now_ms {
            crate::store::algorithm::PolicyOutcome {
                admitted: false,
                remaining: 0,
                reset_ms: until - now_ms,
            }
        } else {
            limit.algorithm().peek_cost(state(i), now_ms, cost)
        }
    });
    Some(CheckOutcome::collect(limits.len(), outcomes).counted_at(now_ms))
}

/// After an admission of `cost` units at `now_ms`: each locking policy left with nothing
/// remaining starts a block, which its outcome reports as the wait (a peek, of no cost,
/// starts none). `block(i, since_ms, until_ms)` is called for every locking policy, with
/// `(0, 0)` for one that starts none.
pub(crate) fn start_blocks(
    limits: &[Policy],
    outcome: &mut CheckOutcome,
    now_ms: u64,
    cost: u64,
    mut block: impl FnMut(usize, u64, u64),
) {
    for (i, limit) in limits.iter().enumerate() {
        let Some(lockout_ms) = limit.lockout_ms() else {
            continue;
        };
        match outcome.limits_mut().get_mut(i) {
            Some(reported) if reported.remaining == 0 && cost > 0 => {
                reported.reset_ms = lockout_ms;
                block(i, now_ms, now_ms.saturating_add(lockout_ms));
            }
            _ => block(i, 0, 0),
        }
    }
}

/// The state a counter starts afresh with at `now_ms`, once a block ends.
pub(crate) fn fresh(limit: &Policy, now_ms: u64) -> State {
    limit
        .algorithm()
        .evaluate_cost(None, now_ms, 0)
        .admitted_state
}
