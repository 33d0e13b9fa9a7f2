//! The holds: per partition, until when calls stay local and why; shared by a layer, every
//! service it wraps and their clones.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use metrics::SharedString;

use super::config::Config;
use super::signals::{advertised_wait, grpc_pushback};
use super::table::{Hold, HoldTable};
use crate::client::error::HoldReason;

/// The counter of calls held back, labelled `layer`, `reason` and `outcome`.
pub(super) const HELD_BACK_TOTAL: &str = "tollgate_client_held_back_total";

/// The most partitions a layer holds at once. Each costs about a hundred bytes and its
/// name, so the holds of one layer stay within a few megabytes; past it, a new hold
/// replaces the one that ends soonest.
const MAX_HOLDS: usize = 10_000;

pub(super) struct Shared {
    pub(super) config: Config,
    holds: Mutex<HoldTable>,
}

impl Shared {
    pub(super) fn new(config: Config) -> Self {
        // Described for each layer built, so a recorder installed after an earlier layer
        // gets the description too.
        metrics::describe_counter!(
            HELD_BACK_TOTAL,
            metrics::Unit::Count,
            "Outgoing calls a HoldBackLayer kept from a server that had said to wait, by \
             layer, reason (retry_after, ratelimit, grpc_pushback, grpc_no_retry) and \
             outcome (failed: answered locally without being sent; waited: sent once the \
             wait was over)."
        );
        Self {
            config,
            holds: Mutex::new(HoldTable::new(MAX_HOLDS)),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.config.clock.now_millis()
    }

    /// The hold on `partition` at `now_ms`, if one is still running.
    pub(super) fn hold(&self, partition: &str, now_ms: u64) -> Option<Hold> {
        self.lock().get(partition, now_ms)
    }

    /// Reads what a response of `partition` says in its status and headers, and holds the
    /// partition for the longest wait asked for.
    pub(super) fn observe(&self, partition: &str, status: StatusCode, headers: &HeaderMap) {
        let now = self.now_ms();
        if let Some((wait, reason)) = advertised_wait(status, headers, now) {
            self.hold_for(partition, wait, reason, now);
        }
    }

    /// Reads the trailers of a response of `partition`, where a gRPC answer that is not
    /// Trailers-Only carries its pushback, and holds the partition if they say to wait.
    pub(super) fn observe_trailers(&self, partition: &str, trailers: &HeaderMap) {
        if let Some((wait, reason)) = grpc_pushback(trailers) {
            self.hold_for(partition, wait, reason, self.now_ms());
        }
    }

    /// Holds `partition` for `wait` from `now`, capped at the layer's longest hold, never
    /// shortening a hold already running.
    fn hold_for(&self, partition: &str, wait: Duration, reason: HoldReason, now: u64) {
        let wait = wait.min(self.config.max_hold);
        let until_ms = now.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        let added = self.lock().hold(partition, Hold { until_ms, reason }, now);
        if !added {
            return;
        }
        tracing::debug!(
            layer = %self.config.name,
            partition,
            reason = reason.as_str(),
            wait_ms = wait.as_millis() as u64,
            "client hold: the server said to wait"
        );
    }

    /// Counts a call held back.
    pub(super) fn count(&self, reason: HoldReason, outcome: &'static str) {
        metrics::counter!(
            HELD_BACK_TOTAL,
            "layer" => SharedString::from_shared(self.config.name.clone()),
            "reason" => reason.as_str(),
            "outcome" => outcome,
        )
        .increment(1);
    }

    /// How long calls to `partition` stay held, from now.
    pub(super) fn held_for(&self, partition: &str) -> Option<(Duration, HoldReason)> {
        let now = self.now_ms();
        self.hold(partition, now)
            .map(|hold| (Duration::from_millis(hold.until_ms - now), hold.reason))
    }

    // Nothing done under this lock panics between the table's two indexes being updated,
    // so a poisoned lock still guards a whole table.
    fn lock(&self) -> MutexGuard<'_, HoldTable> {
        self.holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A call's partition and the holds it is kept in: what reads the call's answer, its head
/// when the response arrives and its trailers when the body yields them.
pub(super) struct Partition {
    holds: Arc<Shared>,
    name: Arc<str>,
}

impl Partition {
    pub(super) fn new(holds: Arc<Shared>, name: Arc<str>) -> Self {
        Self { holds, name }
    }

    pub(super) fn observe(&self, status: StatusCode, headers: &HeaderMap) {
        self.holds.observe(&self.name, status, headers);
    }

    pub(super) fn observe_trailers(&self, trailers: &HeaderMap) {
        self.holds.observe_trailers(&self.name, trailers);
    }
}

impl fmt::Debug for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Partition")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
