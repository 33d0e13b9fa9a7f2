//! Counters of leases: taken, spent to the last unit, expired with units left, and given
//! back; and decisions served from a lease.

use metrics::{Counter, SharedString};

pub(crate) const LEASES: &str = "tollgate_leases_total";
pub(crate) const LEASED_DECISIONS: &str = "tollgate_leased_decisions_total";

/// One limiter's lease counters.
pub(crate) struct LeaseMetrics {
    taken: Counter,
    spent: Counter,
    expired: Counter,
    returned: Counter,
    served: Counter,
}

impl LeaseMetrics {
    pub(crate) fn new(layer: &SharedString) -> Self {
        metrics::describe_counter!(
            LEASES,
            "Leases of quota by event: taken from the store, spent to the last unit, expired \
             with units left, and those units given back to the store"
        );
        metrics::describe_counter!(
            LEASED_DECISIONS,
            "Decisions made locally from a lease of quota"
        );
        let event = |event: &'static str| metrics::counter!(LEASES, "layer" => layer.clone(), "event" => event);
        Self {
            taken: event("taken"),
            spent: event("spent"),
            expired: event("expired"),
            returned: event("returned"),
            served: metrics::counter!(LEASED_DECISIONS, "layer" => layer.clone()),
        }
    }

    pub(crate) fn taken(&self) {
        self.taken.increment(1);
    }

    pub(crate) fn spent(&self) {
        self.spent.increment(1);
    }

    pub(crate) fn expired(&self) {
        self.expired.increment(1);
    }

    pub(crate) fn returned(&self) {
        self.returned.increment(1);
    }

    pub(crate) fn served(&self) {
        self.served.increment(1);
    }
}

impl std::fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseMetrics").finish_non_exhaustive()
    }
}
