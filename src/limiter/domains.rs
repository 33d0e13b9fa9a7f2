//! One circuit breaker per failure domain of the store (each master of a Redis Cluster),
//! with that domain's fallback counters, so that a part of the store that fails sends only
//! its own callers to the failure policy.
//!
//! The store names the domain of each caller (`Backend::failure_domain`); a domain is made
//! the first time the limiter meets it, with today's breaker configuration, and labelled
//! in metrics as the store labels it. A store of one part has one domain, made with the
//! limiter.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::limiter::breaker::{
    Admission, Breaker, BreakerConfig, BreakerState, Jitter, default_jitter,
};
use crate::limiter::telemetry::FallbackCounters;
use crate::store::backend::{Backend, StoreError};
use crate::store::clock::Clock;
use crate::store::domain::FailureDomain;

/// A failure domain as the limiter keeps it: its breaker and its fallback counters.
pub(crate) struct Domain {
    pub(crate) id: u32,
    pub(crate) label: Arc<str>,
    pub(crate) breaker: Breaker,
    pub(crate) fallbacks: FallbackCounters,
}

/// What a new domain is made from.
struct Factory {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    /// A jitter source given to the builder, shared by every domain; otherwise each domain
    /// draws its own.
    jitter: Option<Jitter>,
    layer: Arc<str>,
    failure_policy: &'static str,
}

impl Domain {
    /// Permission to call the store for a caller whose part of the store is `reach` (`now`
    /// read only if the breaker is not closed). A part that has its connection again lets
    /// a breaker that was waiting for it probe at once.
    #[inline]
    pub(crate) fn admit_at(&self, reach: FailureDomain, now: impl FnOnce() -> u64) -> Admission {
        if reach.is_connected() {
            self.breaker.connected();
        }
        self.breaker.admit_at(now)
    }
}

/// The error of a decision whose part of the store has no connection: no call was made.
pub(crate) fn not_connected() -> StoreError {
    StoreError::not_connected("no connection to this part of the store: it was not asked")
}

impl Factory {
    fn make(&self, id: u32, label: String) -> Arc<Domain> {
        let label: Arc<str> = label.into();
        Arc::new(Domain {
            id,
            breaker: Breaker::new(
                self.config,
                self.clock.clone(),
                self.jitter.clone().unwrap_or_else(default_jitter),
                self.layer.clone(),
                label.clone(),
            ),
            fallbacks: FallbackCounters::new(&self.layer, self.failure_policy, &label),
            label,
        })
    }
}

/// A limiter's failure domains. Domain 0, which every store of one part answers, is made
/// with the limiter and read without a lock; the others are found in a snapshot.
pub(crate) struct Domains {
    first: Arc<Domain>,
    /// Every other domain met so far, in the order met.
    others: ArcSwap<Vec<Arc<Domain>>>,
    factory: Factory,
    /// Held while a domain is added, so that two requests meeting it at once make one.
    adding: Mutex<()>,
}

/// A domain, borrowed from the limiter (domain 0) or shared from its snapshot.
pub(crate) enum DomainRef<'a> {
    Borrowed(&'a Arc<Domain>),
    Shared(Arc<Domain>),
}

impl Deref for DomainRef<'_> {
    type Target = Domain;

    fn deref(&self) -> &Domain {
        match self {
            DomainRef::Borrowed(domain) => domain,
            DomainRef::Shared(domain) => domain,
        }
    }
}

impl DomainRef<'_> {
    /// The domain, owned, for a future that outlives the borrow.
    pub(crate) fn to_shared(&self) -> Arc<Domain> {
        match self {
            DomainRef::Borrowed(domain) => Arc::clone(domain),
            DomainRef::Shared(domain) => domain.clone(),
        }
    }
}

impl Domains {
    pub(crate) fn new(
        config: BreakerConfig,
        clock: Arc<dyn Clock>,
        jitter: Option<Jitter>,
        layer: Arc<str>,
        failure_policy: &'static str,
        backend: &dyn Backend,
    ) -> Self {
        let factory = Factory {
            config,
            clock,
            jitter,
            layer,
            failure_policy,
        };
        let first = factory.make(0, backend.failure_domain_label(0).unwrap_or_default());
        Self {
            first,
            others: ArcSwap::default(),
            factory,
            adding: Mutex::new(()),
        }
    }

    /// The domain `id`, made now if this is the first time it is met (labelled by
    /// `backend`). Meeting a new domain is also when the domains `backend` no longer has
    /// get their breakers reset: a failover that moved a lost master's slots to its replica
    /// leaves no breaker open for the master that is gone.
    #[inline]
    pub(crate) fn get(&self, id: u32, backend: &dyn Backend) -> DomainRef<'_> {
        if id == 0 {
            return DomainRef::Borrowed(&self.first);
        }
        self.get_other(id, backend)
    }

    /// [`get`](Self::get) for a part other than the first.
    #[inline(never)]
    fn get_other(&self, id: u32, backend: &dyn Backend) -> DomainRef<'_> {
        if let Some(domain) = self.others.load().iter().find(|d| d.id == id) {
            return DomainRef::Shared(domain.clone());
        }
        let _adding = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(domain) = self.others.load().iter().find(|d| d.id == id) {
            return DomainRef::Shared(domain.clone());
        }
        let label = backend.failure_domain_label(id).unwrap_or_default();
        let domain = self.factory.make(id, label);
        tracing::debug!(layer = %self.factory.layer, node = %domain.label, "a part of the store met");
        for gone in self
            .all()
            .filter(|d| backend.failure_domain_label(d.id).is_none())
        {
            gone.breaker.reset();
        }
        let mut others = Vec::clone(&self.others.load());
        others.push(domain.clone());
        self.others.store(Arc::new(others));
        DomainRef::Shared(domain)
    }

    /// Every domain met so far, domain 0 first.
    fn all(&self) -> impl Iterator<Item = Arc<Domain>> {
        let others = self.others.load_full();
        std::iter::once(self.first.clone()).chain((0..others.len()).map(move |i| others[i].clone()))
    }

    /// The most open of the breakers: open if any is, else half-open if any is, else
    /// closed.
    pub(crate) fn state(&self) -> BreakerState {
        let rank = |state: BreakerState| match state {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        };
        self.all()
            .map(|d| d.breaker.state())
            .max_by_key(|state| rank(*state))
            .unwrap_or(BreakerState::Closed)
    }

    /// Each domain's label and breaker state, domain 0 first.
    pub(crate) fn states(&self) -> Vec<(String, BreakerState)> {
        self.all()
            .map(|d| (d.label.to_string(), d.breaker.state()))
            .collect()
    }
}

impl fmt::Debug for Domains {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.all().map(|d| (d.label.to_string(), d.breaker.state())))
            .finish()
    }
}
