//! What a limiter does when its store cannot decide: the policy chosen per route, and its
//! execution ([`Fallback`]), with the local share's own counters.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::limiter::Conclusion;
use crate::limiter::bounded_map::{BoundedMap, WhenFull};
use crate::limiter::breaker::Breaker;
use crate::limiter::decision::{
    Decision, DecisionSource, FallbackReason, RateLimitInfo, Receipt, UnlimitedReason,
    whole_seconds,
};
use crate::limiter::denial_cache::DenialCache;
use crate::limiter::instances::InstanceCount;
use crate::limiter::last_answers::LastAnswers;
use crate::limiter::policy_set::PolicySet;
use crate::limiter::reported_set::ReportedSet;
use crate::limiter::telemetry::FallbackCounters;
use crate::store::algorithm::{Algorithm, PolicyOutcome, Share};
use crate::store::backend::{Backend, CheckOutcome, Refund, StoreError};
use crate::store::caller::Caller;
use crate::store::clock::Clock;
use crate::store::future::StoreFuture;
use crate::store::memory::InMemoryBackend;
use crate::store::policy::Policy;

/// The choice made for a route when the store is slow or down.
///
/// | policy | during an outage | for |
/// |---|---|---|
/// | [`open`](Self::open) | everything passes, uncounted | routes where availability beats the limit |
/// | [`closed`](Self::closed) | 503 + Retry-After (never 500) | credentials, one-time codes, password-reset mails, hard spend limits |
/// | [`local_share`](Self::local_share) | each instance enforces the limit divided by the live instance count | most API routes: fairness between customers |
/// | [`fail_static`](Self::fail_static) | cached refusals keep refusing until they expire, the rest passes | long quotas (per day) |
/// | [`static_then`](Self::static_then) | cached refusals first, then another policy for the rest | long quotas with a local share |
///
/// ```
/// use tollgate::{FailurePolicy, InstanceCount};
///
/// let orders = FailurePolicy::local_share(InstanceCount::fixed(4));
/// let login = FailurePolicy::closed();
/// let daily = FailurePolicy::static_then(FailurePolicy::local_share(InstanceCount::fixed(4)));
/// # drop((orders, login, daily));
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through uncounted.
    #[default]
    Open,
    /// Refuse (503 by default, never 500; see
    /// [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status))
    /// with a Retry-After of the breaker's remaining open time (at least 1 s).
    Closed,
    /// Enforce every policy's quota divided by the live instance count, with an in-process
    /// counter of the same algorithm, starting from the store's last answer; the headers
    /// advertise the share.
    LocalShare(InstanceCount),
    /// Keep refusing callers whose refusal is cached until it expires; let the rest pass.
    Static,
    /// Cached refusals first, then the inner policy for everybody else.
    StaticThen(Box<FailurePolicy>),
}

impl FailurePolicy {
    /// Fail open: allow.
    pub fn open() -> Self {
        FailurePolicy::Open
    }

    /// Fail closed: refuse with 503 and Retry-After. The layer answers with the status
    /// of [`RateLimitLayer::unavailable_status`](crate::RateLimitLayer::unavailable_status)
    /// (503 unless set).
    pub fn closed() -> Self {
        FailurePolicy::Closed
    }

    /// Enforce a local share of the limit: quota / `instances`, in the limit's own window,
    /// the remainder spread by place ([`InstanceCount::at_place`], or the Redis registry's
    /// places). The shares together never exceed the limit, whatever the quota and the
    /// count; a quota smaller than the count is taken in turns, one window each by place,
    /// and so is a token bucket whose burst is smaller than the count (turns of as many
    /// requests as the burst, as many per period as the rate allows).
    ///
    /// A caller's share starts from the store's last answer for it, and after the store's
    /// return a caller the share counted is decided by both until that count no longer
    /// weighs, so neither edge of an outage admits more than the limit (the
    /// [failure policies](crate::guide::failure_policies) guide has the rules and the
    /// measurements).
    pub fn local_share(instances: InstanceCount) -> Self {
        FailurePolicy::LocalShare(instances)
    }

    /// Fail static: cached refusals keep refusing, everything else passes.
    pub fn fail_static() -> Self {
        FailurePolicy::Static
    }

    /// Cached refusals first, then `rest` for everybody else.
    pub fn static_then(rest: FailurePolicy) -> Self {
        FailurePolicy::StaticThen(Box::new(rest))
    }

    /// A short, stable name for logs and metric labels.
    ///
    /// ```
    /// assert_eq!(tollgate::FailurePolicy::closed().as_str(), "closed");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::LocalShare(_) => "local_share",
            FailurePolicy::Static => "static",
            FailurePolicy::StaticThen(rest) => match **rest {
                FailurePolicy::Open => "static_then_open",
                FailurePolicy::Closed => "static_then_closed",
                FailurePolicy::LocalShare(_) => "static_then_local_share",
                _ => "static_then_static",
            },
        }
    }
}

/// Why and where a store could not decide, with what the failure policy reads there.
pub(super) struct Failure<'a> {
    pub(super) reason: FallbackReason,
    /// The fallback counters of the part of the store that failed.
    pub(super) counters: &'a FallbackCounters,
    /// That part's breaker, if it has one: how long it stays open is a closed route's
    /// Retry-After, read (with the clock) only by a closed route.
    pub(super) breaker: Option<&'a Breaker>,
    /// Refusals known from the store, which a static policy keeps serving.
    pub(super) denials: Option<&'a DenialCache>,
    /// The limiter's time, when already read.
    pub(super) now: Option<u64>,
}

impl Failure<'_> {
    /// How long the breaker of the part that failed stays open; 0 when there is none.
    fn open_for_ms(&self) -> u64 {
        self.breaker.map_or(0, Breaker::open_for_ms)
    }
}

/// How many callers' last answers a local share keeps to start from.
const LAST_ANSWERS: usize = 100_000;

/// A policy set divided among the instances: what this instance's counters enforce of it.
pub(in crate::limiter) struct ShareSet {
    original: Arc<[Policy]>,
    instances: u64,
    place: Option<u64>,
    /// The parts as policies, under the original counters' names.
    policies: Arc<[Policy]>,
    /// The same, as the decisions made against them hold them.
    reported: ReportedSet,
    parts: Box<[Share]>,
    /// Whether a part is taken in turns: without one, no decision reads the turns.
    takes_turns: bool,
    /// How long a decision on these counters weighs.
    retention_ms: u64,
}

impl std::fmt::Debug for ShareSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareSet")
            .field("instances", &self.instances)
            .field("place", &self.place)
            .field("policies", &self.policies)
            .finish_non_exhaustive()
    }
}

impl ShareSet {
    fn new(original: &Arc<[Policy]>, instances: u64, place: Option<u64>, drawn: u64) -> Self {
        let parts: Box<[Share]> = original
            .iter()
            .map(|limit| Share::of(*limit.algorithm(), instances, place, drawn))
            .collect();
        let policies: Arc<[Policy]> = original
            .iter()
            .zip(parts.iter())
            .map(|(limit, part)| limit.with_algorithm(part.algorithm))
            .collect();
        let retention_ms = policies.iter().map(|p| p.retention_ms()).max().unwrap_or(0);
        let takes_turns = parts.iter().any(|part| part.turns.is_some());
        Self {
            original: original.clone(),
            instances,
            place,
            reported: ReportedSet::store(&policies),
            policies,
            parts,
            takes_turns,
            retention_ms,
        }
    }

    /// Whether this is the share for `instances` as they stand now.
    fn is_for(&self, instances: &InstanceCount) -> bool {
        self.instances == instances.get() && self.place == instances.place()
    }

    /// 0 while every policy taken in turns is in this instance's turn; else the longest
    /// wait for one.
    #[inline]
    fn turn_wait_ms(&self, now_ms: u64) -> u64 {
        if !self.takes_turns {
            return 0;
        }
        self.turns_wait_ms(now_ms)
    }

    /// [`turn_wait_ms`](Self::turn_wait_ms) of a share that takes turns. Out of line: most
    /// shares take none, and their decisions skip it with one test.
    #[inline(never)]
    fn turns_wait_ms(&self, now_ms: u64) -> u64 {
        self.parts
            .iter()
            .filter_map(|part| part.turns.map(|turns| turns.wait_ms(now_ms)))
            .max()
            .unwrap_or(0)
    }
}

/// Units a local share counted for a request that the store still decides, to give back
/// if the store refuses it, and what the share knew of the caller then.
pub(super) struct Held {
    share: Arc<ShareSet>,
    refund: Refund,
    /// What the share had counted that the store did not see, to consume there along with
    /// the request.
    pub(super) unseen: u64,
    /// The share's own answer for the request.
    local: CheckOutcome,
}

/// The failure policy in execution: the policy, and a local share's own counters with
/// the divided policy sets they count against.
pub(super) struct Fallback {
    policy: FailurePolicy,
    clock: Arc<dyn Clock>,
    /// Counters of the local share, kept apart from the store's.
    local: InMemoryBackend,
    /// Divided policy sets, so a share costs no allocation per request.
    shares: ArcSwap<Vec<Arc<ShareSet>>>,
    /// Where each caller's share starts: the store's last answer for it (with a local
    /// share only).
    last_answers: Option<LastAnswers>,
    /// Until when what the local share counted still weighs (0: it never counted): the
    /// store, which did not see it, is not left to decide alone before then.
    weighs_until_ms: AtomicU64,
    /// A place among the instances drawn for this one, for turns when none is known.
    drawn_place: u64,
    /// Per caller the share counted while the store was away, the units still to tell the
    /// store; a caller not in it has not been told since the share last decided it.
    owed: Mutex<BoundedMap<u64>>,
    /// Whether `owed` holds a caller, read without its lock; written under it, and cleared
    /// when the map empties: left set, every later share decision would take the one lock
    /// all of the instance's threads share.
    owes: AtomicBool,
}

impl Fallback {
    /// `policy`, its local share counting on `clock`.
    pub(super) fn new(policy: FailurePolicy, clock: Arc<dyn Clock>) -> Self {
        let local = InMemoryBackend::new()
            .clock(SharedClock(clock.clone()))
            .exact_idle_times();
        let last_answers = share_count(&policy).map(|_| LastAnswers::new(LAST_ANSWERS));
        Self {
            policy,
            clock,
            local,
            shares: ArcSwap::default(),
            last_answers,
            weighs_until_ms: AtomicU64::new(0),
            drawn_place: RandomState::new().hash_one(std::process::id()),
            // Full, the caller told longest ago makes room: told again, the store counts
            // its units twice, which refuses more, never less.
            owed: Mutex::new(BoundedMap::new(LAST_ANSWERS, WhenFull::ReplaceSoonest)),
            owes: AtomicBool::new(false),
        }
    }

    /// The policy executed.
    pub(super) fn policy(&self) -> &FailurePolicy {
        &self.policy
    }

    /// Keeps what the store answered for `caller` (asked at `at_ms`), where its local share
    /// starts if the store goes away.
    pub(super) fn remember(
        &self,
        caller: &Caller,
        set: &PolicySet,
        outcome: &CheckOutcome,
        at_ms: u64,
    ) {
        if let Some(last) = &self.last_answers {
            last.record(caller.key(), set, outcome, at_ms);
            // Decided by the store alone, the caller's share counters no longer say what
            // it has used: when the store goes away again, its share starts from this
            // answer, not from counters that refilled while the store was admitting.
            if self.may_weigh() && !self.share_weighs(at_ms) {
                self.local.forget(caller.key());
            }
        }
    }

    /// Whether the local share ever counted anything (without reading the clock).
    pub(super) fn may_weigh(&self) -> bool {
        self.weighs_until_ms.load(Ordering::Relaxed) != 0
    }

    /// Whether what the local share counted may still weigh at `now_ms`.
    pub(super) fn share_weighs(&self, now_ms: u64) -> bool {
        now_ms < self.weighs_until_ms.load(Ordering::Relaxed)
    }

    /// While what the local share counted still weighs, a caller it counted is decided by
    /// its share too, before the store (which did not see those requests): the share's
    /// refusal (`Err`), or the units it counted (`Ok`), to give back if the store refuses.
    /// `None`: the store decides alone.
    pub(super) fn recovering(
        &self,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        now_ms: u64,
    ) -> Option<Result<Held, Decision>> {
        let instances = share_count(&self.policy)?;
        let share = self.share_of(&set.limits, instances);
        let outcome = self
            .local
            .decide_tracked_at(caller.key(), &share.policies, cost, now_ms)?;
        if outcome.admitted() {
            // The first time the store hears of the caller again, a token bucket is told
            // what this share counted (as far as every policy still holds it); later, what
            // the store's answers show it still lacks. (The store's bucket refilled through
            // the outage as if nobody had spent: unless told, it would admit a full burst
            // on top of the shares. A sliding window's count needs no telling: what the
            // store did not see leaves with the window, and until then the share decides
            // too; told, it would weigh a window longer than it should. A sliding log is
            // told all the same: it is a hard cap, and untold, the instances that return
            // to the store first admit beside what the others' shares still hold.)
            let mut owed = self
                .owed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let unseen = match owed.get_mut(caller.key()) {
                Some((units, _)) => std::mem::take(units),
                None => {
                    // Kept while the share's count weighs: after that, nobody asks.
                    let until_ms = now_ms.saturating_add(share.retention_ms);
                    owed.insert(caller.key(), 0, until_ms, now_ms);
                    self.owes.store(true, Ordering::Release);
                    share
                        .policies
                        .iter()
                        .zip(outcome.limits())
                        .zip(share.original.iter())
                        .filter(|(_, original)| is_told(original))
                        .map(|((part, outcome), _)| {
                            part.algorithm()
                                .quota()
                                .saturating_sub(outcome.remaining)
                                .saturating_sub(cost)
                        })
                        .min()
                        .unwrap_or(0)
                }
            };
            drop(owed);
            Some(Ok(Held {
                share,
                refund: Refund::new(cost, outcome.counted_at_ms()),
                unseen,
                local: outcome,
            }))
        } else {
            Some(Err(self.share_decision(&share, &outcome, cost)))
        }
    }

    /// The store admitted a request that the share counted too (`held`), and answered
    /// `store`: where a token bucket has more left than the shares together (this one's,
    /// times the instances), it refilled while the instances were still telling it what
    /// they counted, and this instance owes it its part of the difference, told with the
    /// caller's next request.
    pub(super) fn reconcile(&self, caller: &Caller, held: &Held, store: &CheckOutcome) {
        let share = &held.share;
        let excess = share
            .original
            .iter()
            .zip(share.policies.iter())
            .zip(store.limits().iter().zip(held.local.limits()))
            .filter(|((original, _), _)| is_bucket(original))
            .map(|((original, part), (store, local))| {
                let part_quota = part.algorithm().quota().max(1);
                let expected = u128::from(local.remaining)
                    * u128::from(original.algorithm().quota())
                    / u128::from(part_quota);
                u128::from(store.remaining).saturating_sub(expected)
            })
            .min()
            .unwrap_or(0);
        if excess == 0 {
            return;
        }
        let part =
            u64::try_from(excess.div_ceil(u128::from(share.instances.max(1)))).unwrap_or(u64::MAX);
        let mut owed = self
            .owed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((units, _)) = owed.get_mut(caller.key()) {
            *units = part;
        }
    }

    /// Gives back what [`recovering`](Self::recovering) counted.
    pub(super) fn release(&self, caller: &Caller, held: Held) {
        let _ = self
            .local
            .refund(caller.key(), &held.share.policies, held.refund)
            .try_take_ready();
    }

    /// Counts the failure, and decides the request by the failure policy.
    #[inline]
    pub(super) fn decide(
        &self,
        failure: &Failure<'_>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        failure.counters.count(failure.reason);
        // Through an outage, the usual request of a local share: its set's share resolved.
        if let FailurePolicy::LocalShare(instances) = &self.policy
            && let Some(share) = resolved_share(set, instances)
        {
            return self.decide_share(caller, set, share, cost, failure.now);
        }
        self.apply(&self.policy, failure, caller, set, cost)
    }

    /// [`decide`](Self::decide), concluded as `conclusion` says: the usual decision of a
    /// local share as it is built.
    #[inline]
    pub(in crate::limiter) fn decide_concluded(
        &self,
        failure: &Failure<'_>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
        conclusion: &Conclusion<'_>,
    ) -> StoreFuture<Decision> {
        if let FailurePolicy::LocalShare(instances) = &self.policy
            && let Some(share) = resolved_share(set, instances)
        {
            failure.counters.count(failure.reason);
            let now = self.share_time(share, failure.now);
            return match self.share_packed(caller, share, cost, now) {
                Some(outcome) => {
                    let admitted = outcome.admitted;
                    conclusion.of(admitted, share.reported.locks_out(), cost, move || {
                        share_answer_one(share, outcome, now, cost)
                    })
                }
                None => {
                    conclusion.decision(self.decide_share_counted(caller, set, share, cost, now))
                }
            };
        }
        conclusion.decision(self.decide(failure, caller, set, cost))
    }

    fn apply(
        &self,
        policy: &FailurePolicy,
        failure: &Failure<'_>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Decision {
        let limits = &set.limits;
        match policy {
            FailurePolicy::Open => Decision::Unlimited(UnlimitedReason::StoreFailedOpen),
            FailurePolicy::Closed => Decision::Unavailable {
                retry_after_secs: whole_seconds(failure.open_for_ms()),
                policies: limits.clone(),
            },
            FailurePolicy::LocalShare(instances) => {
                if let Some(share) = resolved_share(set, instances) {
                    return self.decide_share(caller, set, share, cost, failure.now);
                }
                // The first share decision of this set, or the instance count changed
                // since: found among the divided sets (the set keeps the first it met).
                let share = self.share_of(limits, instances);
                let _ = set.share.set(share.clone());
                self.decide_share(caller, set, &share, cost, failure.now)
            }
            FailurePolicy::Static => self
                .cached_refusal(failure.denials, caller, set, cost)
                .unwrap_or(Decision::Unlimited(UnlimitedReason::StoreFailedOpen)),
            FailurePolicy::StaticThen(rest) => self
                .cached_refusal(failure.denials, caller, set, cost)
                .unwrap_or_else(|| self.apply(rest, failure, caller, set, cost)),
        }
    }

    /// Gives back what a request admitted by the local share consumed, to the local
    /// counters that counted it.
    pub(super) fn refund(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        refund: Refund,
    ) -> Result<(), StoreError> {
        self.local
            .refund(caller.key(), limits, refund)
            .try_take_ready()
            .unwrap_or_else(|| Err(StoreError::other("pending")))
    }

    /// Charges what a request admitted by the local share cost beyond its reservation, to
    /// the local counters that counted it.
    pub(super) fn charge(&self, caller: &Caller, limits: &[Policy], units: u64) -> CheckOutcome {
        let now = self.clock.now_millis();
        self.local.charge_at(caller.key(), limits, units, now)
    }

    /// Gives back, or charges (`charge` units), on this instance's share of `limits` what a
    /// request the store admitted while the share's count still weighed changed: the
    /// share counted it too ([`recovering`](Self::recovering)), and decides the caller
    /// beside the store until that count no longer weighs.
    pub(super) fn settle_share_too(
        &self,
        caller: &Caller,
        limits: &Arc<[Policy]>,
        refund: Option<Refund>,
        charge: u64,
    ) {
        let Some(instances) = share_count(&self.policy) else {
            return;
        };
        let share = self.share_of(limits, instances);
        if let Some(refund) = refund {
            let _ = self
                .local
                .refund(caller.key(), &share.policies, refund)
                .try_take_ready();
        }
        if charge > 0 {
            let now = self.clock.now_millis();
            self.local
                .charge_at(caller.key(), &share.policies, charge, now);
        }
    }

    /// A refusal the store made that still holds, for a request of `cost` or more.
    fn cached_refusal(
        &self,
        denials: Option<&DenialCache>,
        caller: &Caller,
        set: &PolicySet,
        cost: u64,
    ) -> Option<Decision> {
        denials?
            .covering(caller.key(), set.id, self.clock.now_millis(), cost)
            .map(Decision::Limited)
    }

    /// Decides a request of `cost` units on this instance's own counters of `share`. A
    /// caller they do not count yet starts from the store's last answer for it.
    fn decide_share(
        &self,
        caller: &Caller,
        set: &PolicySet,
        share: &ShareSet,
        cost: u64,
        now: Option<u64>,
    ) -> Decision {
        let now = self.share_time(share, now);
        match self.share_packed(caller, share, cost, now) {
            Some(outcome) => share_answer_one(share, outcome, now, cost),
            None => self.decide_share_counted(caller, set, share, cost, now),
        }
    }

    /// The time a share decision is made at (the local counters run on the limiter's
    /// clock: a time just read serves them too), noted as the time until which what the
    /// share counts weighs on the store's decisions after it.
    #[inline]
    fn share_time(&self, share: &ShareSet, now: Option<u64>) -> u64 {
        let now = now.unwrap_or_else(|| self.clock.now_millis());
        // Read first: the line is written at most once a millisecond, not per decision.
        let weighs_until_ms = now.saturating_add(share.retention_ms);
        if weighs_until_ms > self.weighs_until_ms.load(Ordering::Relaxed) {
            self.weighs_until_ms
                .fetch_max(weighs_until_ms, Ordering::Relaxed);
        }
        now
    }

    /// The usual share decision: a caller of one packed policy the share already counts,
    /// decided by its short path at `now`, when it is this instance's turn. `None`, having
    /// counted nothing, for any other.
    #[inline]
    fn share_packed(
        &self,
        caller: &Caller,
        share: &ShareSet,
        cost: u64,
        now: u64,
    ) -> Option<PolicyOutcome> {
        self.no_longer_owed(caller);
        if share.turn_wait_ms(now) > 0 {
            return None;
        }
        let [limit] = &*share.policies else {
            return None;
        };
        self.local.decide_one_at(caller.key(), limit, cost, now)
    }

    /// Counted again here: the store is to be told again when it is back. (The lock only
    /// while somebody is owed: through an outage nobody is.)
    #[inline]
    fn no_longer_owed(&self, caller: &Caller) {
        if self.owes.load(Ordering::Acquire)
            && let Ok(mut owed) = self.owed.lock()
        {
            owed.remove(caller.key());
            if owed.is_empty() {
                self.owes.store(false, Ordering::Release);
            }
        }
    }

    /// A share decision other than [`share_packed`](Self::share_packed)'s: refused while
    /// it is not this instance's turn, or decided on the local counters, a caller they do
    /// not count yet starting from the store's last answer for it.
    fn decide_share_counted(
        &self,
        caller: &Caller,
        set: &PolicySet,
        share: &ShareSet,
        cost: u64,
        now: u64,
    ) -> Decision {
        if share.turn_wait_ms(now) > 0 {
            // Not this instance's turn: refused until it is, counting nothing.
            let peeked = self.local.peek_at(caller.key(), &share.policies, cost, now);
            let outcomes = peeked
                .limits()
                .iter()
                .zip(share.parts.iter())
                .map(
                    |(peeked, part)| match part.turns.map(|turns| turns.wait_ms(now)) {
                        Some(wait) if wait > 0 => PolicyOutcome {
                            admitted: false,
                            remaining: 0,
                            reset_ms: wait,
                        },
                        _ => *peeked,
                    },
                );
            let outcome = CheckOutcome::collect(share.parts.len(), outcomes).counted_at(now);
            return self.share_decision(share, &outcome, cost);
        }
        let mut answer = None;
        let outcome = self
            .local
            .decide_seeded_at(caller.key(), &share.policies, cost, now, |i| {
                let answer = *answer.get_or_insert_with(|| {
                    self.last_answers
                        .as_ref()
                        .and_then(|last| last.get(caller.key(), set.id, now))
                });
                let answer = answer?;
                share.parts[i].seed(share.original[i].algorithm(), answer.used(i)?, answer.at_ms)
            });
        self.share_decision(share, &outcome, cost)
    }

    /// The local counters' answer as a decision, advertising the share.
    fn share_decision(&self, share: &ShareSet, outcome: &CheckOutcome, cost: u64) -> Decision {
        let (admitted, counted_at_ms) = (outcome.admitted(), outcome.counted_at_ms());
        share_answer(share, admitted, outcome.limits(), counted_at_ms, cost)
    }

    /// `limits` divided among `instances` as this instance's share, computed once per set,
    /// count and place: later requests find it in a snapshot read without a lock.
    fn share_of(&self, limits: &Arc<[Policy]>, instances: &InstanceCount) -> Arc<ShareSet> {
        let find = |shares: &[Arc<ShareSet>]| find_share(shares, limits, instances).cloned();
        if let Some(share) = find(&self.shares.load()) {
            return share;
        }
        let (count, place) = (instances.get(), instances.place());
        let share = Arc::new(ShareSet::new(limits, count, place, self.drawn_place));
        // Two requests may divide the same set at once: the first stored wins, so every
        // request decides against one allocation (the local counters are keyed by the
        // policies' contents, so either would count the same).
        let mut stored = share.clone();
        self.shares.rcu(|shares| {
            if let Some(existing) = find(shares) {
                stored = existing;
                return Vec::clone(shares);
            }
            stored = share.clone();
            let mut shares = Vec::clone(shares);
            // A handful of sets times the counts seen; keep the newest few.
            if shares.len() >= 64 {
                shares.remove(0);
            }
            shares.push(share.clone());
            shares
        });
        stored
    }
}

/// The share of `set` for `instances` as they stand, when a decision resolved it already:
/// borrowed, no reference counted, no lookup.
#[inline]
fn resolved_share<'a>(set: &'a PolicySet, instances: &InstanceCount) -> Option<&'a ShareSet> {
    set.share
        .get()
        .filter(|share| share.is_for(instances))
        .map(|share| &**share)
}

/// The local counters' answer, given as its parts, as a decision advertising the share.
#[inline]
fn share_answer(
    share: &ShareSet,
    admitted: bool,
    outcomes: &[PolicyOutcome],
    counted_at_ms: u64,
    cost: u64,
) -> Decision {
    let info = RateLimitInfo::of_store(
        share.reported.clone(),
        outcomes,
        DecisionSource::LocalShare,
        cost,
        Receipt::of_admission(admitted, counted_at_ms),
    );
    Decision::answered(admitted, info)
}

/// [`share_answer`] for the answer about a share of one policy: its outcome, and when it
/// was counted.
#[inline(always)]
fn share_answer_one(
    share: &ShareSet,
    outcome: PolicyOutcome,
    counted_at_ms: u64,
    cost: u64,
) -> Decision {
    let info = RateLimitInfo::of_store_one(
        share.reported.clone(),
        outcome,
        DecisionSource::LocalShare,
        cost,
        Receipt::of_admission(outcome.admitted, counted_at_ms),
    );
    Decision::answered(outcome.admitted, info)
}

/// The share of `limits` divided among `instances`, among those already divided.
fn find_share<'a>(
    shares: &'a [Arc<ShareSet>],
    limits: &Arc<[Policy]>,
    instances: &InstanceCount,
) -> Option<&'a Arc<ShareSet>> {
    shares
        .iter()
        .find(|share| Arc::ptr_eq(&share.original, limits) && share.is_for(instances))
}

/// Whether `policy` counts with a token bucket.
fn is_bucket(policy: &Policy) -> bool {
    matches!(policy.algorithm(), Algorithm::TokenBucket { .. })
}

/// Whether the store is told what a share of `policy` counted when it hears of the caller
/// again: a token bucket's, and a sliding log's (it must hold the limit in every window;
/// told, the units count from the store's return, a little longer than they should).
fn is_told(policy: &Policy) -> bool {
    matches!(
        policy.algorithm(),
        Algorithm::TokenBucket { .. } | Algorithm::SlidingLog { .. }
    )
}

/// The instance count of a policy that divides the limit, if it does.
fn share_count(policy: &FailurePolicy) -> Option<&InstanceCount> {
    match policy {
        FailurePolicy::LocalShare(instances) => Some(instances),
        FailurePolicy::StaticThen(rest) => share_count(rest),
        _ => None,
    }
}

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The limiter's clock, shared with the local share's counters.
#[derive(Debug)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    use super::*;
    use crate::store::clock::ManualClock;

    fn remaining(decision: &Decision) -> Option<u64> {
        decision.info().and_then(|info| info.min_remaining())
    }

    #[test]
    fn a_set_keeps_its_share_until_the_instance_count_changes() {
        let count = Arc::new(AtomicU64::new(2));
        let counted = count.clone();
        let instances = InstanceCount::from_fn(move || counted.load(Ordering::Relaxed));
        let fallback = Fallback::new(
            FailurePolicy::local_share(instances),
            Arc::new(ManualClock::new(1_000)),
        );
        let policy = Policy::new(
            "per-second",
            Algorithm::sliding_window(100, Duration::from_secs(1)),
        );
        let set = PolicySet::new(None, &[policy], &Arc::from("test"), 0).expect("a set");
        let counters = FallbackCounters::new(&Arc::from("test"), "local_share", &Arc::from("node"));
        let failure = Failure {
            reason: FallbackReason::BreakerOpen,
            counters: &counters,
            breaker: None,
            denials: None,
            now: Some(1_000),
        };
        let decide = |caller: &str| fallback.decide(&failure, &Caller::new(caller), &set, 1);

        // Two instances: each enforces 50 of the 100, and the set keeps that share.
        assert_eq!(remaining(&decide("acme")), Some(49));
        assert_eq!(set.share.get().map(|share| share.instances), Some(2));
        assert_eq!(remaining(&decide("acme")), Some(48));

        // Four: the set's share no longer holds, and the next decision divides by four.
        count.store(4, Ordering::Relaxed);
        assert_eq!(remaining(&decide("globex")), Some(24));
        // Two again: the share the set kept is the right one again.
        count.store(2, Ordering::Relaxed);
        assert_eq!(remaining(&decide("acme")), Some(47));
    }
}
