//! A limiter's leasing: what it was given, the leases its callers hold, and its counters.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use metrics::SharedString;

use crate::limiter::lease::config::Leases;
use crate::limiter::lease::metrics::LeaseMetrics;
use crate::limiter::lease::table::{LeaseTable, Sizing};
use crate::store::caller::CallerKey;
use crate::store::policy::Policy;

/// A limiter's leasing: its configuration, its callers' leases and its counters.
pub(crate) struct Leasing {
    pub(super) config: Leases,
    pub(super) table: LeaseTable,
    pub(super) metrics: LeaseMetrics,
    /// The store answered that it does not lease: every request asks it.
    pub(super) unsupported: AtomicBool,
}

impl Leasing {
    pub(crate) fn new(config: Leases, layer: &Arc<str>) -> Self {
        Self {
            table: LeaseTable::new(config.caller_capacity()),
            metrics: LeaseMetrics::new(&SharedString::from_shared(layer.clone())),
            config,
            unsupported: AtomicBool::new(false),
        }
    }

    /// Whether this instance holds a lease of `caller`'s under the set `set_id`, or is
    /// taking one.
    pub(crate) fn holds(&self, caller: &CallerKey, set_id: u64) -> bool {
        self.table.holds(caller, set_id)
    }

    pub(super) fn sizing(&self, limits: &[Policy]) -> Sizing {
        let instances = self.config.instance_count().max(1);
        let cap = limits
            .iter()
            .map(|limit| limit.algorithm().quota() / instances)
            .min()
            .unwrap_or(0);
        Sizing {
            threshold_per_sec: self.config.threshold(),
            period_ms: self.config.period_ms(),
            cap,
        }
    }
}

impl std::fmt::Debug for Leasing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leasing")
            .field("config", &self.config)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}
