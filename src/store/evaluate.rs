//! One decision over all of a caller's policies, all or nothing: the loop every backend
//! runs around the per-policy arithmetic (lua/policies.lua is its transcription for Redis).

use crate::store::algorithm::{Evaluation, State};
use crate::store::backend::CheckOutcome;
use crate::store::policy::Policy;
use crate::store::state::PolicyState;

impl PolicyState {
    /// For custom [`Backend`](crate::store::Backend) authors: decides one request of
    /// `cost` units against `policies`, given each policy's stored state
    /// (`stored(policy)`, `None` for a caller never seen) at `now_ms`, exactly as the
    /// crate's own stores do.
    ///
    /// Answers what to report (one outcome per policy, in order) and, when every policy
    /// admitted the request, the state to store for each policy, in order; a refused
    /// request stores nothing.
    ///
    /// The request is admitted only if every policy admits it; a refused request consumes
    /// nothing, and each policy reports its state as it stands (a policy that would have
    /// admitted reports what it still has). A backend reads the states, calls this, and
    /// writes back the admitted states under one lock or transaction. It applies no
    /// [lockout](Policy::lock_out_for): a store that supports them keeps each caller's block
    /// itself (see [`Backend`](crate::store::Backend)).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::{Arc, Mutex};
    /// use std::time::{SystemTime, UNIX_EPOCH};
    /// use tollgate::store::{Backend, CallerKey, CheckOutcome, PolicyState, StoreError};
    /// use tollgate::future::StoreFuture;
    /// use tollgate::Policy;
    ///
    /// /// The store's time, in milliseconds since the Unix epoch.
    /// fn now_ms() -> u64 {
    ///     let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    ///     u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    /// }
    ///
    /// /// One global lock around a map: simple, correct, and slow under contention.
    /// #[derive(Debug, Default)]
    /// struct LockedMap(Mutex<HashMap<(CallerKey, String), PolicyState>>);
    ///
    /// impl Backend for LockedMap {
    ///     fn check(
    ///         &self,
    ///         caller: &CallerKey,
    ///         policies: &Arc<[Policy]>,
    ///         cost: u64,
    ///     ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
    ///         let mut map = self.0.lock().unwrap();
    ///         // Keyed on the counter, never on the name alone.
    ///         let key = |p: &Policy| (caller.clone(), p.counter().to_owned());
    ///         let now = now_ms();
    ///         let (outcome, admitted) =
    ///             PolicyState::evaluate(policies, |p| map.get(&key(p)).cloned(), now, cost);
    ///         for (policy, state) in policies.iter().zip(admitted.into_iter().flatten()) {
    ///             map.insert(key(policy), state);
    ///         }
    ///         StoreFuture::ready(Ok(outcome))
    ///     }
    /// }
    /// ```
    pub fn evaluate(
        policies: &[Policy],
        mut stored: impl FnMut(&Policy) -> Option<PolicyState>,
        now_ms: u64,
        cost: u64,
    ) -> (CheckOutcome, Option<Vec<PolicyState>>) {
        let mut admitted = Vec::with_capacity(policies.len());
        let outcome = decide(
            policies,
            &mut admitted,
            |_, _, policy| stored(policy).map(PolicyState::into_state),
            now_ms,
            cost,
            |admitted, _, state| admitted.push(PolicyState::from_state(state)),
        );
        let admitted_states = outcome.admitted().then_some(admitted);
        (outcome, admitted_states)
    }
}

/// How many policies [`decide`] evaluates on the stack; more take one allocation (and, in
/// the in-process store, the shard's write lock).
pub(crate) const INLINE_POLICIES: usize = 4;

/// [`PolicyState::evaluate`] without allocating for up to [`INLINE_POLICIES`] policies: `stored(store,
/// i, policy)` reads the state of the `i`th policy, and `admit(store, i, state)` is called
/// for every policy, in order, only when all of them admitted the request. Both reach the
/// store through `store`, so that one can read and the other write the same entry.
pub(crate) fn decide<S>(
    policies: &[Policy],
    store: &mut S,
    mut stored: impl FnMut(&mut S, usize, &Policy) -> Option<State>,
    now_ms: u64,
    cost: u64,
    mut admit: impl FnMut(&mut S, usize, State),
) -> CheckOutcome {
    // One policy, the usual case: its verdict is the decision.
    if let [policy] = policies {
        let state = stored(store, 0, policy);
        let evaluation = policy.algorithm().evaluate_cost(state, now_ms, cost);
        if evaluation.admitted {
            admit(store, 0, evaluation.admitted_state);
        }
        return CheckOutcome::one(evaluation.outcome).counted_at(now_ms);
    }
    let evaluate_one = |(i, policy): (usize, &Policy)| {
        let state = stored(store, i, policy);
        let evaluation = policy
            .algorithm()
            .evaluate_cost(state.clone(), now_ms, cost);
        Some((state, evaluation))
    };
    if policies.len() <= INLINE_POLICIES {
        let mut evaluations = [const { None }; INLINE_POLICIES];
        for (slot, evaluation) in evaluations
            .iter_mut()
            .zip(policies.iter().enumerate().map(evaluate_one))
        {
            *slot = evaluation;
        }
        settle(
            policies,
            &mut evaluations[..policies.len()],
            now_ms,
            cost,
            |i, state| admit(store, i, state),
        )
    } else {
        let mut evaluations: Vec<_> = policies.iter().enumerate().map(evaluate_one).collect();
        settle(policies, &mut evaluations, now_ms, cost, |i, state| {
            admit(store, i, state)
        })
    }
}

/// Each policy's stored state and its evaluation, in order.
type Evaluations = [Option<(Option<State>, Evaluation)>];

/// The answer from every policy's evaluation: all admitted, the states are handed to
/// `admit` and the outcomes reported; otherwise nothing is consumed, and a policy that
/// would have admitted reports what it still has.
fn settle(
    policies: &[Policy],
    evaluations: &mut Evaluations,
    now_ms: u64,
    cost: u64,
    mut admit: impl FnMut(usize, State),
) -> CheckOutcome {
    if evaluations.iter().flatten().all(|(_, e)| e.admitted) {
        let outcome = CheckOutcome::collect(
            policies.len(),
            evaluations.iter().flatten().map(|(_, e)| e.outcome),
        )
        .counted_at(now_ms);
        for (i, slot) in evaluations.iter_mut().enumerate() {
            if let Some((_, evaluation)) = slot.take() {
                admit(i, evaluation.admitted_state);
            }
        }
        return outcome;
    }
    let outcomes = policies.iter().zip(evaluations.iter_mut().flatten()).map(
        |(policy, (state, evaluation))| {
            if evaluation.admitted {
                policy.algorithm().peek_cost(state.take(), now_ms, cost)
            } else {
                evaluation.outcome
            }
        },
    );
    CheckOutcome::collect(policies.len(), outcomes).counted_at(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::policy::Quota;

    #[test]
    fn a_refusal_by_one_policy_consumes_nothing_from_the_others() {
        let policies = [
            Policy::sliding_window("per-second", Quota::per_second(5)),
            Policy::sliding_window("per-day", Quota::per_day(1)),
        ];
        let (first, states) = PolicyState::evaluate(&policies, |_| None, 1_000, 1);
        assert!(first.admitted());
        let states = states.expect("admitted");
        let (second, stored) = PolicyState::evaluate(
            &policies,
            |p| Some(states[usize::from(p.name() == "per-day")].clone()),
            1_000,
            1,
        );
        assert!(!second.admitted() && stored.is_none());
        let outcomes = second.limits();
        // per-second would admit, and reports its 4 left without taking one.
        assert!(outcomes[0].admitted);
        assert_eq!(outcomes[0].remaining, 4);
        assert!(!outcomes[1].admitted);
    }
}
