//! The policy set a decision reports on, held without a reference count where it can be.
//!
//! Every decision carries its set (the headers advertise it, a refund gives units back to
//! it). Cloning an `Arc` per decision writes the set's count, one cache line that every
//! core deciding for the limiter then pulls back and forth. A limiter's sets are few and
//! made when it is built or its limits swapped, so each distinct set is stored once for
//! the process and decisions refer to it by a plain reference. The store is bounded: past
//! [`MAX_STORED_SETS`] distinct sets (limits swapped in a loop with ever new values), new
//! sets are shared by reference count as before.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use http::HeaderValue;

use crate::store::policy::Policy;

/// How many distinct policy sets the process keeps for good: a few per limiter, and the
/// sets of every swap with new values, up to here.
pub(crate) const MAX_STORED_SETS: usize = 4_095;

/// The stored sets by the order they were stored in: what a packed report names.
static BY_INDEX: [OnceLock<&'static StoredSet>; MAX_STORED_SETS] =
    [const { OnceLock::new() }; MAX_STORED_SETS];

/// A policy set as a decision holds it.
#[derive(Clone)]
pub(crate) enum ReportedSet {
    /// Stored for the process: copying it touches no count.
    Stored(&'static StoredSet),
    /// Shared by reference count.
    Counted(Arc<[Policy]>),
}

/// A set stored for the process, with what every admission asks of it worked out once.
pub(crate) struct StoredSet {
    policies: Arc<[Policy]>,
    /// Where it is in [`BY_INDEX`].
    index: usize,
    locks_out: bool,
    /// The set's RateLimit-Policy field, of static bytes, made for the first response
    /// that carried it: the responses after it copy it without a lookup.
    policy_field: OnceLock<Option<HeaderValue>>,
}

impl StoredSet {
    /// The set stored at `index`, which a stored set's index names.
    pub(crate) fn at(index: usize) -> &'static StoredSet {
        BY_INDEX[index]
            .get()
            .expect("an index is named only once its set is in place")
    }

    /// Its policies.
    pub(crate) fn policies(&'static self) -> &'static Arc<[Policy]> {
        &self.policies
    }
}

impl std::borrow::Borrow<[Policy]> for &'static StoredSet {
    fn borrow(&self) -> &[Policy] {
        &self.policies
    }
}

impl PartialEq for StoredSet {
    fn eq(&self, other: &Self) -> bool {
        self.policies == other.policies
    }
}

impl Eq for StoredSet {}

impl std::hash::Hash for StoredSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the slice hashes, so that a lookup by `&[Policy]` finds it.
        self.policies[..].hash(state);
    }
}

fn locks_out(policies: &[Policy]) -> bool {
    policies.iter().any(|policy| policy.lockout_ms().is_some())
}

impl ReportedSet {
    /// `set`, stored for the process if it is not yet and there is room.
    pub(crate) fn store(set: &Arc<[Policy]>) -> Self {
        Self::store_up_to(set, MAX_STORED_SETS)
    }

    /// The set of a caller's own plan, stored as [`store`](Self::store) stores, while
    /// plans take at most three quarters of the room: plans come and go, and the rest is
    /// kept for the sets of limits swapped in.
    pub(crate) fn store_plan(set: &Arc<[Policy]>) -> Self {
        Self::store_up_to(set, MAX_STORED_SETS / 4 * 3)
    }

    fn store_up_to(set: &Arc<[Policy]>, room: usize) -> Self {
        static STORED: OnceLock<Mutex<HashSet<&'static StoredSet>>> = OnceLock::new();
        let stored = STORED.get_or_init(Default::default);
        // A panic while the set was locked left it whole (one insert): still usable.
        let mut stored = stored
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = stored.get(&set[..]) {
            return ReportedSet::Stored(found);
        }
        if stored.len() >= room {
            return ReportedSet::Counted(set.clone());
        }
        let index = stored.len();
        let kept: &'static StoredSet = Box::leak(Box::new(StoredSet {
            policies: set.clone(),
            index,
            locks_out: locks_out(set),
            policy_field: OnceLock::new(),
        }));
        stored.insert(kept);
        // Set before the set is handed out, and once: the index is new.
        let _ = BY_INDEX[index].set(kept);
        ReportedSet::Stored(kept)
    }

    pub(crate) fn get(&self) -> &Arc<[Policy]> {
        match self {
            ReportedSet::Stored(set) => &set.policies,
            ReportedSet::Counted(set) => set,
        }
    }

    /// Where a set stored for the process is among them.
    #[inline]
    pub(crate) fn index(&self) -> Option<usize> {
        match self {
            ReportedSet::Stored(set) => Some(set.index),
            ReportedSet::Counted(_) => None,
        }
    }

    /// The set's RateLimit-Policy field as `make` makes it (a value of static bytes),
    /// made once for a set stored for the process. `None` for a set shared by count, or
    /// when `make` made none: the caller finds it another way.
    pub(crate) fn policy_field(
        &self,
        make: impl FnOnce() -> Option<HeaderValue>,
    ) -> Option<HeaderValue> {
        match self {
            ReportedSet::Stored(set) => set.policy_field.get_or_init(make).clone(),
            ReportedSet::Counted(_) => None,
        }
    }

    /// Whether a policy of the set locks callers out.
    pub(crate) fn locks_out(&self) -> bool {
        match self {
            ReportedSet::Stored(set) => set.locks_out,
            ReportedSet::Counted(set) => locks_out(set),
        }
    }
}

impl From<&Arc<[Policy]>> for ReportedSet {
    fn from(set: &Arc<[Policy]>) -> Self {
        ReportedSet::Counted(set.clone())
    }
}

impl PartialEq for ReportedSet {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for ReportedSet {}

impl fmt::Debug for ReportedSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::policy::Quota;

    #[test]
    fn equal_sets_are_stored_once() {
        let set = |n| -> Arc<[Policy]> {
            vec![Policy::sliding_window("stored-once", Quota::per_second(n))].into()
        };
        let (ReportedSet::Stored(a), ReportedSet::Stored(b)) =
            (ReportedSet::store(&set(7)), ReportedSet::store(&set(7)))
        else {
            panic!("stored");
        };
        assert!(Arc::ptr_eq(&a.policies, &b.policies));
        let ReportedSet::Stored(c) = ReportedSet::store(&set(8)) else {
            panic!("stored");
        };
        assert!(!Arc::ptr_eq(&a.policies, &c.policies));
    }
}
