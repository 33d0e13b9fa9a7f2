//! A lease made of ordinary decisions, for stores that decide in process (the lease script
//! is Redis's single-call version of the same steps).

use std::sync::Arc;

use crate::store::backend::{Backend, CheckOutcome, LeaseGrant, StoreError};
use crate::store::caller::CallerKey;
use crate::store::policy::Policy;

/// Grants up to `units` units to `caller` with at most three decisions of a store that
/// answers at once: a peek (cost 0) for what every limit has room for, a decision of that
/// many units, and when that lost a race, a decision of the asking request's `cost` alone.
/// Each decision is all or nothing, so a grant never exceeds what the limits admit.
pub(crate) fn lease_by_checks(
    store: &impl Backend,
    caller: &CallerKey,
    limits: &Arc<[Policy]>,
    cost: u64,
    units: u64,
) -> Result<LeaseGrant, StoreError> {
    let decide = |units: u64| -> Result<CheckOutcome, StoreError> {
        store
            .check(caller, limits, units)
            .try_take_ready()
            .unwrap_or_else(|| {
                Err(StoreError::other(
                    "an in-process lease needs a store that answers at once",
                ))
            })
    };
    let room = decide(0)?
        .limits()
        .iter()
        .map(|limit| limit.remaining)
        .min()
        .unwrap_or(0);
    let grant = units.min(room);
    if grant > cost {
        let outcome = decide(grant)?;
        if outcome.admitted() {
            return Ok(LeaseGrant::new(grant, outcome));
        }
    }
    let outcome = decide(cost)?;
    let granted = if outcome.admitted() { cost } else { 0 };
    Ok(LeaseGrant::new(granted, outcome))
}
