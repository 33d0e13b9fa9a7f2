//! Deciding one request: a slot from the store, or from the failure policy when the
//! store cannot answer.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::Unit;

use crate::limiter::decision::FallbackReason;
use crate::limiter::failure::FailurePolicy;
use crate::limiter::instances::InstanceCount;
use crate::limiter::telemetry::FALLBACKS;
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::held_slot::{HeldHere, HeldSlot};
use crate::store::slot_release::{Releases, SlotId};
use crate::store::slots::{Slot, SlotStore};

const DECISIONS: &str = "tollgate_in_flight_decisions_total";
pub(super) const IN_FLIGHT: &str = "tollgate_in_flight";

/// What a request gets.
#[derive(Debug)]
pub(super) enum Admission {
    /// A slot, with the quota in force (the limit, or the local share) and what remains.
    Held {
        slot: HeldSlot,
        quota: u64,
        remaining: u64,
    },
    /// All of the caller's slots are taken (of the quota in force).
    Limited { quota: u64 },
    /// The store failed and the failure policy refuses.
    Unavailable,
    /// The store failed and the failure policy lets the request run without a slot.
    Unlimited,
}

impl Admission {
    pub(super) fn outcome(&self) -> &'static str {
        match self {
            Admission::Held { .. } => "allowed",
            Admission::Limited { .. } => "limited",
            Admission::Unavailable => "unavailable",
            Admission::Unlimited => "unlimited",
        }
    }
}

/// What a layer was built with.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) name: Arc<str>,
    pub(super) limit: u64,
    pub(super) store: Arc<dyn SlotStore>,
    pub(super) ttl: Duration,
    pub(super) timeout: Duration,
    pub(super) on_failure: FailurePolicy,
}

/// One layer's state, shared by its services.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) settings: Settings,
    here: Arc<HeldHere>,
    ids: SlotIds,
    /// Releases of this layer's slots still on their way to the store.
    pub(super) releases: Arc<Releases>,
}

impl Shared {
    pub(super) fn new(settings: Settings) -> Self {
        metrics::describe_counter!(
            DECISIONS,
            Unit::Count,
            "Requests decided by an InFlightLayer, by layer and outcome (allowed, limited, \
             unavailable, unlimited)."
        );
        metrics::describe_gauge!(
            IN_FLIGHT,
            Unit::Count,
            "Requests in flight through a ConcurrencyShedLayer, or holding a slot of an \
             InFlightLayer, by layer."
        );
        Self {
            settings,
            here: Arc::default(),
            ids: SlotIds::new(),
            releases: Arc::default(),
        }
    }

    /// Takes a slot of `caller`'s, from the store, or as the failure policy says.
    pub(super) async fn admit(&self, caller: &CallerKey) -> Admission {
        let Settings {
            name,
            limit,
            store,
            ttl,
            timeout,
            ..
        } = &self.settings;
        let id = SlotId {
            store: store.clone(),
            slot: Slot::new(caller.clone(), name.clone(), self.ids.next(), *ttl),
        };
        let asked = store.acquire(&id.slot, *limit);
        let answer = if store.is_remote() {
            // The store may still take the slot after the answer stops mattering (the
            // timeout fired, the request went away): unless it says how it decided, the
            // slot is released, or it would be held for nobody until it expired.
            let mut asking = Asking {
                id: Some(id.clone()),
                releases: &self.releases,
            };
            let answer = tokio::time::timeout(*timeout, asked)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::timeout(format!(
                        "no answer from the store within {timeout:?}"
                    )))
                });
            // A call that was never made took nothing.
            if answer.as_ref().is_ok() || answer.as_ref().is_err_and(StoreError::is_not_connected) {
                asking.id = None;
            }
            answer
        } else {
            asked.await
        };
        let admission = match answer {
            Ok(Some(held)) => {
                self.here.take(caller, None);
                let slot = HeldSlot::in_store(self.here.clone(), id, self.releases.clone());
                self.held(slot, *limit, held)
            }
            Ok(None) => Admission::Limited { quota: *limit },
            Err(error) => self.fall_back(caller, &error),
        };
        self.count(admission.outcome());
        admission
    }

    /// Counts one decision of `outcome` in `tollgate_in_flight_decisions_total`.
    pub(super) fn count(&self, outcome: &'static str) {
        metrics::counter!(
            DECISIONS,
            "layer" => self.settings.name.clone(),
            "outcome" => outcome
        )
        .increment(1);
    }

    fn held(&self, slot: HeldSlot, quota: u64, held: u64) -> Admission {
        let gauge = metrics::gauge!(IN_FLIGHT, "layer" => self.settings.name.clone());
        gauge.increment(1.0);
        Admission::Held {
            slot: slot.on_release(move || gauge.decrement(1.0)),
            quota,
            remaining: quota.saturating_sub(held),
        }
    }

    fn fall_back(&self, caller: &CallerKey, error: &StoreError) -> Admission {
        metrics::counter!(
            FALLBACKS,
            "layer" => self.settings.name.clone(),
            "reason" => FallbackReason::of(error).as_str(),
            "policy" => self.settings.on_failure.as_str(),
            "node" => ""
        )
        .increment(1);
        tracing::debug!(layer = %self.settings.name, %error, "the slots store failed: falling back");
        let share_of = match &self.settings.on_failure {
            FailurePolicy::LocalShare(instances) => instances,
            FailurePolicy::StaticThen(rest) => match rest.as_ref() {
                FailurePolicy::LocalShare(instances) => instances,
                FailurePolicy::Closed => return Admission::Unavailable,
                _ => return Admission::Unlimited,
            },
            FailurePolicy::Closed => return Admission::Unavailable,
            _ => return Admission::Unlimited,
        };
        let share = share(self.settings.limit, share_of);
        match self.here.take(caller, Some(share)) {
            Some(held) => self.held(
                HeldSlot::local(self.here.clone(), caller.clone()),
                share,
                held,
            ),
            None => Admission::Limited { quota: share },
        }
    }
}

/// A slot asked of a remote store whose answer has not said how the store decided: freed
/// in the store if the answer never does.
struct Asking<'a> {
    id: Option<SlotId>,
    releases: &'a Arc<Releases>,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.releases.send(id);
        }
    }
}

/// This instance's share of `limit` slots: `limit / instances`, one more for the first
/// `limit % instances` places, so that the shares add up to the limit; without a place,
/// rounded down but at least 1.
fn share(limit: u64, instances: &InstanceCount) -> u64 {
    let count = instances.get().max(1);
    let base = limit / count;
    match instances.place() {
        Some(place) => base + u64::from(place % count < limit % count),
        None => base.max(1),
    }
}

/// Slot ids unique across instances: a random 64-bit prefix per layer, then a count.
#[derive(Debug)]
struct SlotIds {
    prefix: u64,
    next: AtomicU64,
}

impl SlotIds {
    fn new() -> Self {
        Self {
            // std's hasher keys are drawn from the OS's randomness, per process.
            prefix: std::collections::hash_map::RandomState::new()
                .hash_one((std::time::SystemTime::now(), std::process::id())),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> u128 {
        (u128::from(self.prefix) << 64) | u128::from(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_limit_by_place() {
        for limit in 0..12u64 {
            for count in 1..6u64 {
                let total: u64 = (0..count)
                    .map(|place| share(limit, &InstanceCount::fixed(count).at_place(place)))
                    .sum();
                assert_eq!(total, limit, "limit {limit}, {count} instances");
            }
        }
        assert_eq!(share(2, &InstanceCount::fixed(4)), 1);
        assert_eq!(share(20, &InstanceCount::fixed(4)), 5);
    }
}
