//! The backend trait: what a store of counters must do, so that users can bring their own.

use std::fmt;
use std::sync::Arc;

use crate::store::algorithm::PolicyOutcome;
use crate::store::caller::CallerKey;
use crate::store::domain::FailureDomain;
use crate::store::future::StoreFuture;
use crate::store::policy::Policy;

/// A store that decides requests against a caller's counters.
///
/// One call decides every policy of one request atomically: the request is admitted only
/// if every limit admits it, consuming the request's cost (in units) from each, and a
/// refused request consumes nothing from any limit.
/// [`PolicyState::evaluate`](crate::store::PolicyState::evaluate) carries the arithmetic
/// (a backend that leases finds its grant with it too, see the [module docs](crate::store)),
/// so a backend only has to store [`PolicyState`](crate::store::PolicyState)s and apply
/// them under one lock or transaction. Key each state on the caller and [`Policy::counter`], never on the policy's
/// name alone: the counter identity keeps limiters and units apart.
///
/// A policy may lock out ([`Policy::lock_out_for`]): the in-process and Redis stores keep
/// the block beside the counters, under [`Policy::lockout_counter`], refuse the caller while
/// it stands, start it on the admission that leaves the policy with nothing remaining
/// (reporting the lockout as that policy's `reset_ms`), and lift it on a refund of a
/// request counted no later than it began.
/// [`PolicyState::evaluate`](crate::store::PolicyState::evaluate) applies no lockout: a
/// store built on it alone ignores it.
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::{SystemTime, UNIX_EPOCH};
/// use tollgate::Policy;
/// use tollgate::store::{Backend, CallerKey, CheckOutcome, PolicyState, Refund, StoreError};
/// use tollgate::future::StoreFuture;
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
///         limits: &Arc<[Policy]>,
///         cost: u64,
///     ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
///         let now = now_ms();
///         let mut map = self.0.lock().unwrap();
///         let key = |l: &Policy| (caller.clone(), l.counter().to_owned());
///         // All or nothing: the states to store only when every limit admits.
///         let (outcome, admitted) =
///             PolicyState::evaluate(limits, |l| map.get(&key(l)).cloned(), now, cost);
///         for (limit, state) in limits.iter().zip(admitted.into_iter().flatten()) {
///             map.insert(key(limit), state);
///         }
///         StoreFuture::ready(Ok(outcome))
///     }
///
///     fn refund(
///         &self,
///         caller: &CallerKey,
///         limits: &Arc<[Policy]>,
///         refund: Refund,
///     ) -> StoreFuture<Result<(), StoreError>> {
///         let now = now_ms();
///         let mut map = self.0.lock().unwrap();
///         for limit in limits.iter() {
///             let key = (caller.clone(), limit.counter().to_owned());
///             let given_back = limit.algorithm().refund(
///                 map.get(&key).cloned(),
///                 refund.counted_at_ms(),
///                 refund.cost(),
///                 now,
///             );
///             if let Some(state) = given_back {
///                 map.insert(key, state);
///             }
///         }
///         StoreFuture::ready(Ok(()))
///     }
/// }
/// ```
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Decides one request of `caller` against `limits`, consuming `cost` units from each
    /// limit only if all of them admit it. Outcomes come back in the order of `limits`,
    /// with the store's time of the decision
    /// ([`CheckOutcome::counted_at`]) for a later [`refund`](Self::refund).
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>>;

    /// Gives back what an admitted request consumed from `limits`, when it turned out not
    /// to count (see [`Algorithm::refund`](crate::store::Algorithm::refund) for the exact
    /// rule, which never admits more than not counting the request at all would have).
    ///
    /// The default answers an error: a store that does not implement refunds keeps every
    /// unit it counted, and the limiter logs and counts each refund it could not make.
    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        let _ = (caller, limits, refund);
        StoreFuture::ready(Err(StoreError::other(
            "this store does not give units back",
        )))
    }

    /// Counts `units` more for `caller` against every one of `limits`, whether or not they
    /// fit: what a request admitted earlier turned out to cost beyond what it reserved
    /// ([`Limiter::settle`](crate::Limiter::settle)). Past a quota the caller is in debt,
    /// and the policy refuses later requests until it has drained (see
    /// [`Algorithm`](crate::store::Algorithm) for how each algorithm keeps it). Answers what
    /// each policy reports afterwards: what remains and, when nothing does, how long until
    /// one unit fits. A policy that locks out and is left with nothing starts its block.
    ///
    /// The default answers that this store does not charge; the crate's stores do, in one
    /// atomic step.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::{InMemoryBackend, Policy, Quota};
    /// use tollgate::store::{Backend, CallerKey};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = InMemoryBackend::new();
    /// let tokens: Arc<[Policy]> = vec![Policy::sliding_window("tokens", Quota::per_minute(100))].into();
    /// let acme = CallerKey::new("acme");
    /// let after = store.charge(&acme, &tokens, 130).await.unwrap();
    /// // 30 over the quota: nothing remains, and the next request waits.
    /// assert_eq!(after.limits()[0].remaining, 0);
    /// assert!(!store.check(&acme, &tokens, 1).await.unwrap().admitted());
    /// # }
    /// ```
    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        let _ = (caller, limits, units);
        StoreFuture::ready(Err(StoreError::other(
            "this store does not charge units after the fact",
        )))
    }

    /// Takes a lease of up to `units` units of `caller`'s quota in one atomic step, for a
    /// limiter that decides a hot caller locally (see
    /// [`LimiterBuilder::leases`](crate::LimiterBuilder::leases)).
    ///
    /// The grant is the largest count up to `units` that every limit admits at once, and
    /// is consumed from every limit before the answer; a grant below `cost` (the request
    /// that asked) is no grant at all, and the request is refused as [`check`](Self::check)
    /// would refuse it. `None` (the default) means the store does not lease: the limiter
    /// then asks it about every request.
    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        let _ = (caller, limits, cost, units);
        None
    }

    /// Whether decisions cross a network and can be slow or fail (default `true`). A
    /// remote store's calls go through the limiter's circuit breaker, store timeout and
    /// denial cache; a local one is called directly.
    fn is_remote(&self) -> bool {
        true
    }

    /// Whether a refusal holds until its reset (default `true`), so that the limiter's denial
    /// cache may answer for the store meanwhile. A store whose refusals can end sooner and
    /// that must hear every request says `false`: the two-tier store (`TwoTierBackend`,
    /// with the `redis` feature), whose next lease may come any moment and whose leases
    /// are sized by the requests it is asked, refused ones included.
    ///
    /// ```
    /// use tollgate::{InMemoryBackend, store::Backend};
    /// assert!(InMemoryBackend::new().refusals_hold());
    /// ```
    fn refusals_hold(&self) -> bool {
        true
    }

    /// The part of the store that decides `caller`, and whether it is connected (default:
    /// the whole store, [`FailureDomain::WHOLE`], connected). A remote store's limiter keeps
    /// one circuit breaker per domain, and falls back at once, without a call, for a caller
    /// whose domain is not connected. Called before every remote decision: keep it cheap.
    /// A call that this part passes on to another, and that fails there, says so with
    /// [`StoreError::with_failure_domain`]: the failure is then the other part's.
    ///
    /// ```
    /// use tollgate::{InMemoryBackend, store::{Backend, CallerKey, FailureDomain}};
    /// let store = InMemoryBackend::new();
    /// assert_eq!(store.failure_domain(&CallerKey::new("acme")), FailureDomain::WHOLE);
    /// assert_eq!(store.failure_domain_label(0).as_deref(), Some(""));
    /// ```
    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        let _ = caller;
        FailureDomain::WHOLE
    }

    /// What metrics call the failure domain `id`, as its `node` label: a node's address,
    /// never a caller key (default: an empty label for domain 0). `None` once the store no
    /// longer has that domain (a master that left the cluster, its slots served by
    /// another): the limiter then resets that domain's breaker, so a node that is gone
    /// leaves no breaker open behind it. Called when the limiter first meets a domain.
    fn failure_domain_label(&self, id: u32) -> Option<String> {
        (id == 0).then(String::new)
    }
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        (**self).check(caller, limits, cost)
    }

    fn refund(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> StoreFuture<Result<(), StoreError>> {
        (**self).refund(caller, limits, refund)
    }

    fn charge(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        units: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        (**self).charge(caller, limits, units)
    }

    fn lease(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
        units: u64,
    ) -> Option<StoreFuture<Result<LeaseGrant, StoreError>>> {
        (**self).lease(caller, limits, cost, units)
    }

    fn is_remote(&self) -> bool {
        (**self).is_remote()
    }

    fn refusals_hold(&self) -> bool {
        (**self).refusals_hold()
    }

    fn failure_domain(&self, caller: &CallerKey) -> FailureDomain {
        (**self).failure_domain(caller)
    }

    fn failure_domain_label(&self, id: u32) -> Option<String> {
        (**self).failure_domain_label(id)
    }
}

/// A store's answer to [`Backend::lease`]: how many units it granted (0, or at least the
/// asking request's cost), and per limit what remains in the shared counter after the
/// grant, with the store's time of the grant.
///
/// ```
/// use tollgate::store::{CheckOutcome, LeaseGrant, PolicyOutcome};
/// let outcome = CheckOutcome::new(vec![PolicyOutcome { admitted: true, remaining: 60, reset_ms: 5 }])
///     .counted_at(1_700_000_000_000);
/// let grant = LeaseGrant::new(40, outcome);
/// assert_eq!(grant.granted(), 40);
/// assert_eq!(grant.outcome().limits()[0].remaining, 60);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    granted: u64,
    outcome: CheckOutcome,
}

impl LeaseGrant {
    /// `granted` units, with `outcome` as the store reports the caller after the grant
    /// (or, for no grant, the refusal of the asking request).
    pub fn new(granted: u64, outcome: CheckOutcome) -> Self {
        Self { granted, outcome }
    }

    /// The units granted and already consumed from every limit; 0 for a refusal.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// What remains per limit after the grant, and when the store granted it.
    pub fn outcome(&self) -> &CheckOutcome {
        &self.outcome
    }
}

/// A store's answer for one request: one outcome per limit, in order, and when the store
/// decided.
///
/// ```
/// use tollgate::store::{CheckOutcome, PolicyOutcome};
/// let outcome = CheckOutcome::new(vec![PolicyOutcome { admitted: true, remaining: 4, reset_ms: 200 }])
///     .counted_at(1_700_000_000_000);
/// assert!(outcome.admitted());
/// assert_eq!(outcome.counted_at_ms(), 1_700_000_000_000);
/// ```
#[derive(Clone)]
pub struct CheckOutcome {
    limits: Outcomes,
    counted_at_ms: u64,
}

/// How many outcomes a [`CheckOutcome`] holds without allocating: most limiters apply one
/// or two policies, and the in-process store answers without touching the heap.
const INLINE_OUTCOMES: usize = 2;

#[derive(Clone)]
enum Outcomes {
    Inline {
        len: u8,
        items: [PolicyOutcome; INLINE_OUTCOMES],
    },
    Spilled(Vec<PolicyOutcome>),
}

const NO_OUTCOME: PolicyOutcome = PolicyOutcome {
    admitted: false,
    remaining: 0,
    reset_ms: 0,
};

impl Outcomes {
    fn as_slice(&self) -> &[PolicyOutcome] {
        match self {
            Outcomes::Inline { len, items } => &items[..usize::from(*len)],
            Outcomes::Spilled(items) => items,
        }
    }
}

impl CheckOutcome {
    /// An answer from the per-limit outcomes, decided at time 0 unless
    /// [`counted_at`](Self::counted_at) says otherwise.
    pub fn new(limits: Vec<PolicyOutcome>) -> Self {
        Self {
            limits: Outcomes::Spilled(limits),
            counted_at_ms: 0,
        }
    }

    /// The answer of a single limit, without allocating.
    pub(crate) fn one(outcome: PolicyOutcome) -> Self {
        Self {
            limits: Outcomes::Inline {
                len: 1,
                items: [outcome, NO_OUTCOME],
            },
            counted_at_ms: 0,
        }
    }

    /// The same as [`new`](Self::new) from an iterator of exactly `len` outcomes, kept
    /// inline (no allocation) when there are few.
    pub(crate) fn collect(len: usize, outcomes: impl Iterator<Item = PolicyOutcome>) -> Self {
        let limits = if len <= INLINE_OUTCOMES {
            let mut items = [NO_OUTCOME; INLINE_OUTCOMES];
            let mut count = 0;
            for (item, outcome) in items.iter_mut().zip(outcomes) {
                *item = outcome;
                count += 1;
            }
            Outcomes::Inline {
                // At most INLINE_OUTCOMES, far below u8::MAX.
                len: count as u8,
                items,
            }
        } else {
            Outcomes::Spilled(outcomes.collect())
        };
        Self {
            limits,
            counted_at_ms: 0,
        }
    }

    /// The same answer, decided at `now_ms` on the store's clock (ms since the epoch): the
    /// instant a [`Refund`] of this request names, so the store gives back to the window
    /// it counted in.
    pub fn counted_at(mut self, now_ms: u64) -> Self {
        self.counted_at_ms = now_ms;
        self
    }

    /// When the store decided, on its own clock.
    pub fn counted_at_ms(&self) -> u64 {
        self.counted_at_ms
    }

    /// Whether every limit admitted the request.
    pub fn admitted(&self) -> bool {
        self.limits().iter().all(|l| l.admitted)
    }

    /// The per-limit outcomes, in the order the limits were given.
    pub fn limits(&self) -> &[PolicyOutcome] {
        self.limits.as_slice()
    }

    /// The per-limit outcomes, to amend.
    pub(crate) fn limits_mut(&mut self) -> &mut [PolicyOutcome] {
        match &mut self.limits {
            Outcomes::Inline { len, items } => &mut items[..usize::from(*len)],
            Outcomes::Spilled(items) => items,
        }
    }
}

// Equality and the debug form are those of the outcomes, however they are held.
impl PartialEq for CheckOutcome {
    fn eq(&self, other: &Self) -> bool {
        self.counted_at_ms == other.counted_at_ms && self.limits() == other.limits()
    }
}

impl Eq for CheckOutcome {}

impl fmt::Debug for CheckOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckOutcome")
            .field("limits", &self.limits())
            .field("counted_at_ms", &self.counted_at_ms)
            .finish()
    }
}

/// Why a store could not decide: what happened, as one of four kinds (each with its
/// constructor and, but for "other", its predicate), and a message for logs.
///
/// The limiter falls back on any of them; the kind only names the reason (its
/// [`kind_name`](Self::kind_name)) and, for [`not_connected`](Self::not_connected), lets its
/// circuit breaker probe again as soon as the store is connected.
///
/// ```
/// use tollgate::store::StoreError;
/// let error = StoreError::timeout("no answer within 20 ms");
/// assert!(error.is_timeout());
/// assert_eq!(error.kind_name(), "timeout");
/// assert_eq!(error.to_string(), "store timeout: no answer within 20 ms");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: Arc<str>,
    /// The part of the store the call failed at, when the store knows it.
    failure_domain: Option<u32>,
}

/// The kind of a [`StoreError`], matched inside the crate to name a fallback's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum StoreErrorKind {
    /// The store did not answer in time.
    Timeout,
    /// The store could not be reached (connection refused or lost).
    Unavailable,
    /// The store has no connection to ask yet (it is still being made, or made again): the
    /// call was not made.
    NotConnected,
    /// Anything else: a script error, a protocol error.
    Other,
}

impl StoreError {
    fn with_kind(kind: StoreErrorKind, message: impl Into<Arc<str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            failure_domain: None,
        }
    }

    /// The same error, from the part of the store whose
    /// [`FailureDomain`](crate::store::FailureDomain) id is `id`: the part the call went
    /// to, for a call that did not end where
    /// [`Backend::failure_domain`] said the caller's decisions go (a Redis Cluster call
    /// that a `MOVED` or `ASK` sent to another master). The limiter counts the failure, and
    /// the fallback it leads to, against that part's breaker and `node` label, not the one
    /// it asked.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let error = StoreError::unavailable("connection refused").with_failure_domain(2);
    /// assert_eq!(error.failure_domain(), Some(2));
    /// assert_eq!(StoreError::unavailable("connection refused").failure_domain(), None);
    /// ```
    pub fn with_failure_domain(mut self, id: u32) -> Self {
        self.failure_domain = Some(id);
        self
    }

    /// The id of the part of the store the call failed at, if the store said
    /// ([`with_failure_domain`](Self::with_failure_domain)).
    pub fn failure_domain(&self) -> Option<u32> {
        self.failure_domain
    }

    /// The store did not answer in time.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let error = StoreError::timeout("no answer within 20 ms");
    /// assert!(error.is_timeout() && !error.is_unavailable());
    /// ```
    pub fn timeout(message: impl Into<Arc<str>>) -> Self {
        Self::with_kind(StoreErrorKind::Timeout, message)
    }

    /// The store could not be reached: it refused the connection, or the connection was
    /// lost.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let error = StoreError::unavailable("connection refused");
    /// assert!(error.is_unavailable());
    /// assert_eq!(error.kind_name(), "unavailable");
    /// ```
    pub fn unavailable(message: impl Into<Arc<str>>) -> Self {
        Self::with_kind(StoreErrorKind::Unavailable, message)
    }

    /// The store has no connection to ask yet (it is still being made, or made again), so
    /// the call was not made. The limiter's breaker counts it as a failure, and then lets a
    /// probe through as soon as the connection is there again, without waiting out its
    /// interval.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let error = StoreError::not_connected("reconnecting");
    /// assert!(error.is_not_connected());
    /// assert_eq!(error.kind_name(), "not_connected");
    /// ```
    pub fn not_connected(message: impl Into<Arc<str>>) -> Self {
        Self::with_kind(StoreErrorKind::NotConnected, message)
    }

    /// Anything else: a script error, a protocol error, an answer of the wrong shape.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let error = StoreError::other("the script returned 3 values for 2 policies");
    /// assert!(!error.is_timeout() && !error.is_unavailable() && !error.is_not_connected());
    /// assert_eq!(error.kind_name(), "other");
    /// ```
    pub fn other(message: impl Into<Arc<str>>) -> Self {
        Self::with_kind(StoreErrorKind::Other, message)
    }

    /// Whether the store did not answer in time ([`timeout`](Self::timeout)).
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// assert!(StoreError::timeout("no answer").is_timeout());
    /// assert!(!StoreError::other("bad reply").is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        self.kind == StoreErrorKind::Timeout
    }

    /// Whether the store could not be reached ([`unavailable`](Self::unavailable)).
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// assert!(StoreError::unavailable("connection refused").is_unavailable());
    /// assert!(!StoreError::not_connected("reconnecting").is_unavailable());
    /// ```
    pub fn is_unavailable(&self) -> bool {
        self.kind == StoreErrorKind::Unavailable
    }

    /// Whether the store had no connection to make the call on
    /// ([`not_connected`](Self::not_connected)).
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// assert!(StoreError::not_connected("reconnecting").is_not_connected());
    /// assert!(!StoreError::unavailable("connection refused").is_not_connected());
    /// ```
    pub fn is_not_connected(&self) -> bool {
        self.kind == StoreErrorKind::NotConnected
    }

    /// A short, stable name of the kind, for logs and metric labels: `"timeout"`,
    /// `"unavailable"`, `"not_connected"` or `"other"`.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// let names = [
    ///     StoreError::timeout("").kind_name(),
    ///     StoreError::unavailable("").kind_name(),
    ///     StoreError::not_connected("").kind_name(),
    ///     StoreError::other("").kind_name(),
    /// ];
    /// assert_eq!(names, ["timeout", "unavailable", "not_connected", "other"]);
    /// ```
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::NotConnected => "not_connected",
            StoreErrorKind::Other => "other",
        }
    }

    /// What went wrong, in words.
    ///
    /// ```
    /// use tollgate::store::StoreError;
    /// assert_eq!(StoreError::unavailable("connection refused").message(), "connection refused");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What went wrong, as a kind, for the crate's exhaustive matches.
    pub(crate) fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store {}: {}", self.kind_name(), self.message)
    }
}

impl std::error::Error for StoreError {}

/// What an admitted request consumed, to give back: its cost, and when the store counted
/// it ([`CheckOutcome::counted_at_ms`]).
///
/// ```
/// use tollgate::store::Refund;
/// let refund = Refund::new(1, 1_700_000_000_000);
/// assert_eq!((refund.cost(), refund.counted_at_ms()), (1, 1_700_000_000_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refund {
    cost: u64,
    counted_at_ms: u64,
}

impl Refund {
    /// `cost` units counted at `counted_at_ms` on the store's clock.
    pub fn new(cost: u64, counted_at_ms: u64) -> Self {
        Self {
            cost,
            counted_at_ms,
        }
    }

    /// The units to give back.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// When the store counted them.
    pub fn counted_at_ms(&self) -> u64 {
        self.counted_at_ms
    }
}
