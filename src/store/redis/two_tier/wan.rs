//! The call to the global store, one WAN round trip and one atomic call of lua/global.lua:
//! what the region gives back, what its share admitted, and the lease; then its outcome
//! written back into the region's record.

use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;

use super::regional::{self, Answered, Refill};
use super::{TwoTier, record_key};
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::policy::Policy;

const GLOBAL_SOURCE: &str = concat!(
    include_str!("../../../../lua/clock.lua"),
    include_str!("../../../../lua/common.lua"),
    include_str!("../../../../lua/window.lua"),
    include_str!("../../../../lua/global.lua"),
);

static GLOBAL: LazyLock<Script> = LazyLock::new(|| Script::new(GLOBAL_SOURCE));

/// The global store's answer: units granted, the caller's count after them, the region's
/// share, and when (its clock).
struct Grant {
    granted: u64,
    used: u64,
    share: u64,
    at_ms: u64,
}

/// The WAN calls' outcomes as a metric: `tollgate_wan_calls_total{region, result}`.
const WAN_CALLS: &str = "tollgate_wan_calls_total";

/// A region's counters of WAN calls by outcome, registered once, when the store is built.
#[derive(Debug)]
pub(super) struct Outcomes {
    granted: metrics::Counter,
    empty: metrics::Counter,
    failed: metrics::Counter,
}

impl Outcomes {
    pub(super) fn new(region: &str) -> Self {
        // Described at each build, so a recorder installed after an earlier store gets it.
        metrics::describe_counter!(
            WAN_CALLS,
            metrics::Unit::Count,
            "Calls a two-tier store's region made to the global store, by region and result \
             (granted: units leased; empty: answered with none; failed: no answer in time, or \
             an error, which cuts the region off)."
        );
        let counter = |result: &'static str| metrics::counter!(WAN_CALLS, "region" => region.to_owned(), "result" => result);
        Self {
            granted: counter("granted"),
            empty: counter("empty"),
            failed: counter("failed"),
        }
    }
}

/// How many times a refill that came back empty, to a region that holds nothing, is asked
/// again before the next request asks.
const EMPTY_RETRIES: u32 = 3;

/// Makes the call a decision handed to this instance, and writes its outcome back. Errors
/// writing it back are left: the region's claim on the call runs out, and the next
/// decision hands the call to an instance again (a lease lost that way is counted at the
/// global store and never spent, which only lowers what the regions admit).
///
/// A grant of nothing to a region that holds nothing is asked again half a horizon later
/// (when the region's record lets a refill go again), a few times: the room it lacked is
/// often kept for units other regions held over the window's start, or for a share whose
/// snapshot the next call renews, and a caller with seconds between its requests would
/// otherwise meet its next request with nothing to spend.
pub(super) async fn call(
    two_tier: Arc<TwoTier>,
    caller: CallerKey,
    limits: Arc<[Policy]>,
    mut refill: Refill,
) {
    for retry in 0..=EMPTY_RETRIES {
        let granted = call_once(&two_tier, &caller, &limits, &refill).await;
        if granted != Some(0) || refill.held > 0 || retry == EMPTY_RETRIES {
            return;
        }
        tokio::time::sleep(Duration::from_millis(two_tier.horizon_ms / 2 + 1)).await;
        let Ok(decided) = regional::decide(
            &two_tier,
            &caller,
            &limits,
            0,
            refill.limit,
            refill.window_ms,
        )
        .await
        else {
            return;
        };
        match decided.refill {
            Some(next) => {
                two_tier.calls.fetch_add(1, Ordering::Relaxed);
                refill = next;
            }
            // Another instance's request asked meanwhile, or the region was given units.
            None => return,
        }
    }
}

/// One call to the global store and its outcome written back: the units granted, `None`
/// when the call failed.
async fn call_once(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    refill: &Refill,
) -> Option<u64> {
    // A connection being made (at start, after a partition: several round trips) is
    // waited for, as long as the global store's connect timeout: the call's own timeout
    // is for the call. Without a connection by then, the call fails at once.
    two_tier.global.connected().await;
    let started = Instant::now();
    let answer = tokio::time::timeout(
        two_tier.wan_timeout,
        global_call(two_tier, caller, limits, refill),
    )
    .await;
    let elapsed = started.elapsed();
    let grant = match answer {
        Ok(Ok(grant)) => grant,
        Ok(Err(error)) => {
            tracing::debug!(%error, region = %two_tier.region, "tollgate: the global store failed a lease; the region counts itself cut off");
            return cut_off(two_tier, caller, limits, refill).await;
        }
        Err(_) => {
            tracing::debug!(
                timeout = ?two_tier.wan_timeout,
                region = %two_tier.region,
                "tollgate: the global store did not answer a lease in time; the region counts itself cut off"
            );
            return cut_off(two_tier, caller, limits, refill).await;
        }
    };
    two_tier.measured(elapsed);
    let window_ms = refill.window_ms.max(1);
    // Their global window ends this much after the answer arrives, which spent about half
    // the round trip on its way back.
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let spendable_ms = (window_ms - grant.at_ms % window_ms).saturating_sub(elapsed_ms.div_ceil(2));
    let answer = Answered {
        granted: grant.granted,
        asked: refill.want,
        spendable_ms,
        counted_at_ms: grant.at_ms,
        used: grant.used,
        share: grant.share,
    };
    let _ = regional::answered(two_tier, caller, limits, refill, answer).await;
    match grant.granted {
        0 => two_tier.outcomes.empty.increment(1),
        _ => two_tier.outcomes.granted.increment(1),
    }
    Some(grant.granted)
}

/// A call without an answer: counted, and written into the region's record, which counts
/// itself cut off. Always `None`.
async fn cut_off(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    refill: &Refill,
) -> Option<u64> {
    two_tier.outcomes.failed.increment(1);
    let _ = regional::failed(two_tier, caller, limits, refill).await;
    None
}

/// One call of the global script. What was to be counted is owed again when it fails,
/// and what was to be given back is not sent again (it stays counted, never spent).
async fn global_call(
    two_tier: &TwoTier,
    caller: &CallerKey,
    limits: &[Policy],
    refill: &Refill,
) -> Result<Grant, StoreError> {
    let (by, weight, all) = match two_tier.weights {
        Some((weight, all)) => ("weight", weight, all),
        None => ("demand", 0, 0),
    };
    let (ack_used, ack_share, ack_at) = match refill.ack {
        Some(snapshot) => (
            snapshot.used.to_string(),
            snapshot.share.to_string(),
            snapshot.at_ms.to_string(),
        ),
        None => ("0".to_owned(), "0".to_owned(), "-1".to_owned()),
    };
    let args = [
        refill.limit.to_string(),
        refill.window_ms.to_string(),
        two_tier.region.clone(),
        by.to_owned(),
        weight.to_string(),
        all.to_string(),
        ack_used,
        ack_share,
        ack_at,
        refill.owed[0].to_string(),
        refill.owed[1].to_string(),
        refill.owed[2].to_string(),
        refill.demand.to_string(),
        refill.want.to_string(),
        refill.give_back.to_string(),
        refill.given_at_ms.to_string(),
        refill.moved[0].to_string(),
        refill.moved[1].to_string(),
        refill.moved[2].to_string(),
        refill.held.to_string(),
        refill.held_at_ms.to_string(),
    ];
    let keys = [record_key(&two_tier.global, caller, limits, b":two-tier")];
    let reply: Vec<i64> = two_tier
        .global
        .connection()
        .clone()
        .run(
            &GLOBAL,
            GLOBAL_SOURCE,
            &keys,
            &args.as_slice(),
            two_tier.global.response_timeout(),
        )
        .await?;
    let unsigned = |value: i64| u64::try_from(value).unwrap_or(0);
    match reply.as_slice() {
        &[granted, used, share, at] => Ok(Grant {
            granted: unsigned(granted),
            used: unsigned(used),
            share: unsigned(share),
            at_ms: unsigned(at),
        }),
        other => Err(StoreError::other(format!(
            "the global script answered {other:?} to a lease"
        ))),
    }
}
