//! The region's record of each caller, in the region's Redis, changed by lua/regional.lua:
//! a decision, and the outcome of a call to the global store written back.

use std::sync::LazyLock;

use redis::Script;

use super::{TwoTier, record_key};
use crate::store::algorithm::PolicyOutcome;
use crate::store::backend::{CheckOutcome, StoreError};
use crate::store::caller::CallerKey;
use crate::store::policy::Policy;

const REGIONAL_SOURCE: &str = concat!(
    include_str!("../../../../lua/clock.lua"),
    include_str!("../../../../lua/common.lua"),
    include_str!("../../../../lua/window.lua"),
    include_str!("../../../../lua/regional.lua"),
);

static REGIONAL: LazyLock<Script> = LazyLock::new(|| Script::new(REGIONAL_SOURCE));

/// A call to the global store that a decision handed to this instance.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refill {
    /// Units to lease.
    pub(super) want: u64,
    /// Units to give back, and when the global store counted them.
    pub(super) give_back: u64,
    pub(super) given_at_ms: u64,
    /// What the region's share admitted, for the global store to count in the windows it
    /// was admitted in: a sliding window counter (start, previous, current).
    pub(super) owed: [u64; 3],
    /// Leased units the region spent after the end of the window they were counted in,
    /// for the global store to count again in the windows they were spent in (they go
    /// back to their own with `give_back`): the same kind of counter.
    pub(super) moved: [u64; 3],
    /// The leased units the region held after the decision, and when the global store
    /// counted them: spent after their window, they are counted in the next one, which
    /// the global store keeps room for.
    pub(super) held: u64,
    pub(super) held_at_ms: u64,
    /// The region's demand per window of the limit.
    pub(super) demand: u64,
    /// The snapshot the region holds (the count it was told, its share, when the global
    /// store counted it), or `None`.
    pub(super) ack: Option<Snapshot>,
    pub(super) limit: u64,
    pub(super) window_ms: u64,
}

/// What the global store told a region: the caller's count, the region's share, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) used: u64,
    pub(super) share: u64,
    pub(super) at_ms: u64,
}

/// The region's decision, and the call it hands over, if any.
#[derive(Debug)]
pub(super) struct Decided {
    pub(super) outcome: CheckOutcome,
    pub(super) refill: Option<Refill>,
}

async fn run(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    args: &(impl redis::ToRedisArgs + Sync),
) -> Result<Vec<i64>, StoreError> {
    let keys = [record_key(&two_tier.regional, caller, limits, b":regional")];
    two_tier
        .regional
        .connection()
        .clone()
        .run(
            &REGIONAL,
            REGIONAL_SOURCE,
            &keys,
            args,
            two_tier.regional.response_timeout(),
        )
        .await
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Decides a request of `cost` units on the region's record: one round trip to the
/// region's Redis.
pub(super) async fn decide(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    cost: u64,
    limit: u64,
    window_ms: u64,
) -> Result<Decided, StoreError> {
    let args = (
        "decide",
        &[
            cost,
            limit,
            window_ms,
            two_tier.rtt_ms(),
            two_tier.horizon_ms,
            two_tier.claim_ms,
        ],
    );
    let reply = run(two_tier, caller, limits, &args).await?;
    let &[
        admitted,
        remaining,
        reset_ms,
        now,
        refill,
        want,
        give_back,
        given_at,
        owed_start,
        owed_previous,
        owed_current,
        demand,
        ack_used,
        ack_share,
        ack_at,
        moved_start,
        moved_previous,
        moved_current,
        held,
        held_at,
    ] = reply.as_slice()
    else {
        return Err(StoreError::other(format!(
            "the regional script answered {reply:?} to a decision"
        )));
    };
    let outcome = CheckOutcome::new(vec![PolicyOutcome {
        admitted: admitted == 1,
        remaining: unsigned(remaining),
        reset_ms: unsigned(reset_ms),
    }])
    .counted_at(unsigned(now));
    let refill = (refill == 1).then(|| Refill {
        want: unsigned(want),
        give_back: unsigned(give_back),
        given_at_ms: unsigned(given_at),
        owed: [owed_start, owed_previous, owed_current].map(unsigned),
        moved: [moved_start, moved_previous, moved_current].map(unsigned),
        held: unsigned(held),
        held_at_ms: unsigned(held_at),
        demand: unsigned(demand),
        ack: (ack_at >= 0).then(|| Snapshot {
            used: unsigned(ack_used),
            share: unsigned(ack_share),
            at_ms: unsigned(ack_at),
        }),
        limit,
        window_ms,
    });
    Ok(Decided { outcome, refill })
}

/// What the global store answered a call, as the region writes it down.
#[derive(Clone, Copy, Debug)]
pub(super) struct Answered {
    pub(super) granted: u64,
    pub(super) asked: u64,
    /// How long, from the answer's arrival, until the end of the global window the units
    /// were counted in (spent later, they are counted again in the window they are spent
    /// in).
    pub(super) spendable_ms: u64,
    /// When the global store counted them, on its clock.
    pub(super) counted_at_ms: u64,
    /// The caller's count there after the grant, and the region's share.
    pub(super) used: u64,
    pub(super) share: u64,
}

/// Writes an answer into the region's record: the units leased, and the count the region
/// starts its share from should it be cut off.
pub(super) async fn answered(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    refill: &Refill,
    answer: Answered,
) -> Result<(), StoreError> {
    let args = (
        "answered",
        &[
            answer.granted,
            answer.spendable_ms,
            answer.counted_at_ms,
            answer.used,
            answer.share,
            answer.asked,
            refill.window_ms,
            two_tier.horizon_ms,
        ],
    );
    run(two_tier, caller, limits, &args).await.map(drop)
}

/// Writes a call without an answer into the region's record: the region is cut off (or
/// stays so) and owes again what the call was to have counted.
pub(super) async fn failed(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    refill: &Refill,
) -> Result<(), StoreError> {
    let [owed_start, owed_previous, owed_current] = refill.owed;
    let [moved_start, moved_previous, moved_current] = refill.moved;
    let args = (
        "failed",
        &[
            refill.limit,
            refill.window_ms,
            two_tier.share_of(refill.limit),
            two_tier.probe_ms,
            owed_start,
            owed_previous,
            owed_current,
            moved_start,
            moved_previous,
            moved_current,
        ],
    );
    run(two_tier, caller, limits, &args).await.map(drop)
}
