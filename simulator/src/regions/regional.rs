//! A region's store in the two-tier model: the store its instances' limiters decide on, one
//! regional round trip away, deciding each request against the units it has leased of the
//! caller's global quota, and leasing more from the global store one WAN round trip away,
//! in the background, ahead of the demand.
//!
//! In a deployment this is a Redis per region whose Lua script decides against the leased
//! units (and the region's share while it is cut off), and a background task on the
//! region's instances that makes the WAN calls when the script's answer says a refill is
//! due (claiming the refill in the regional Redis, so one instance makes it), and writes
//! the answer back. Here both are one object, and a WAN call is a task that sleeps half the
//! round trip each way on virtual time.
//!
//! Per caller it keeps:
//!
//! - the demand: the units asked of it over the last second (a sliding window counter),
//!   admitted or refused; leases are sized by it, and shares by demand come from it;
//! - the leased units, each lease with the time the global store counted it. A unit spent
//!   after the end of the global window it was counted in is *moved*: given back to that
//!   window and counted again in the one it was spent in, with the next call. What is
//!   left a lease's life after that window goes back;
//! - the last snapshot the global store sent: what it starts its share from if cut off;
//! - while cut off, its share's counter, and what the share admitted, which the global
//!   store counts (in the windows it was admitted in) when a call gets through.
//!
//! # Cut off, and back
//!
//! A call without an answer within the WAN timeout means the region is cut off: it keeps
//! spending the leases it holds (counted already), then decides on its share, whose
//! counter starts from the last snapshot with the room it had then (what has freed while
//! the call timed out counts as spent). It probes the global store every probe interval,
//! with what its share admitted. Once a call gets through, it stays on its share until a
//! lease is granted, which pays first for what the share admitted while the answer was on
//! its way; from then on it decides on leases again.
//!
//! # Lost
//!
//! While the regional store itself is lost its instances' limiters fall back to their own
//! failure policy, and it makes no call. For two windows after it is back its calls leave
//! its whole share in reserve at the global store, for what the limiters' local shares
//! admitted meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tollgate::Policy;
use tollgate::future::StoreFuture;
use tollgate::store::{Backend, CallerKey, CheckOutcome, Clock, PolicyOutcome, Refund, StoreError};

use super::ShareBy;
use super::global::{Answer, Call, GlobalStore, Snapshot, sliding_window};
use super::window::Window;
use crate::store::SimClock;

/// The window a region measures its demand over: a second, whatever the limit's window
/// (a lease covers a fraction of a second of it, and a caller's demand in a new minute
/// should not take a minute to be seen).
const DEMAND_MS: u64 = 1_000;

/// How a region reaches the global store, and how it sizes its leases.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    /// The WAN round trip, in milliseconds.
    pub(crate) rtt_ms: u64,
    /// How long a region waits for an answer before it takes the call as failed.
    pub(crate) timeout_ms: u64,
    /// How much demand beyond one round trip a lease covers.
    pub(crate) horizon_ms: u64,
    /// How often a region cut off tries the global store again.
    pub(crate) probe_ms: u64,
    /// Set while the region is cut off from the global store.
    pub(crate) cut: Arc<AtomicBool>,
}

/// One leased part of the caller's global quota.
#[derive(Clone, Copy, Debug)]
struct Held {
    units: u64,
    counted_at_ms: u64,
    /// The end of the global window it was counted in: a unit spent later is moved to the
    /// window it was spent in.
    window_end_ms: u64,
    /// When what is left of it goes back: a lease's life (a round trip and the horizon)
    /// after that window's end, so that a lease taken near the end of a window bridges
    /// the round trip to the first lease of the next.
    expires_ms: u64,
}

/// A region's share while it is cut off.
#[derive(Clone, Copy, Debug)]
struct CutOff {
    /// Its counter: seeded from the last snapshot, then every unit the share admits.
    counter: Window,
    /// The share: the counter's limit per window.
    share: u64,
}

/// A call on its way.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    asked: u64,
    /// What the call asks the global store to count: the share's admissions, and leased
    /// units spent after their window.
    owed: Window,
    owed_units: u64,
    moved: Window,
}

/// What the region keeps for one caller.
#[derive(Debug, Default)]
struct Caller {
    demand: Window,
    held: VecDeque<Held>,
    returns: Vec<Refund>,
    snapshot: Option<Snapshot>,
    cut_off: Option<CutOff>,
    /// What the share admitted that the global store has not counted yet, and how many
    /// units that is.
    owed: Window,
    owed_units: u64,
    /// Leased units spent after their window, to count again in the window they were
    /// spent in (they go back to their own with `returns`).
    moved: Window,
    in_flight: Option<InFlight>,
    /// No call before this time: the probe interval while cut off.
    next_call_ms: u64,
    /// When each WAN call was sent, in ms of the run's clock.
    calls: Vec<u64>,
}

impl Caller {
    fn held(&self) -> u64 {
        self.held.iter().map(|h| h.units).sum()
    }

    /// Leases whose window has ended go back.
    fn expire(&mut self, now_ms: u64) {
        while let Some(first) = self.held.front().copied() {
            if first.expires_ms > now_ms {
                break;
            }
            self.held.pop_front();
            give_back(&mut self.returns, first.units, first.counted_at_ms);
        }
    }

    /// Spends `cost` leased units, the oldest first (they expire first). A unit spent
    /// after the end of the global window it was counted in is moved to the window it is
    /// spent in, with the next call: given back to the window it was counted in and
    /// counted again now. The sliding window weighs the previous window's count less and
    /// less as the current one goes on; left there, a unit spent now would weigh less than
    /// it should.
    fn spend(&mut self, mut cost: u64, window_ms: u64, now_ms: u64) {
        for held in self.held.iter_mut() {
            let taken = held.units.min(cost);
            held.units -= taken;
            cost -= taken;
            if taken > 0 && held.window_end_ms <= now_ms {
                give_back(&mut self.returns, taken, held.counted_at_ms);
                self.moved.add(taken, window_ms, now_ms);
            }
            if cost == 0 {
                break;
            }
        }
        while self.held.front().is_some_and(|h| h.units == 0) {
            self.held.pop_front();
        }
    }
}

/// A region's store; clones share it.
#[derive(Clone, Debug)]
pub(crate) struct RegionalStore(Arc<Regional>);

#[derive(Debug)]
struct Regional {
    region: usize,
    global: Arc<GlobalStore>,
    clock: SimClock,
    link: Link,
    /// Set while the regional store itself is lost.
    lost: Arc<AtomicBool>,
    /// When the regional store came back after being lost.
    back_after_loss: Mutex<Option<u64>>,
    /// Set when a decision found the regional store lost.
    was_lost: AtomicBool,
    share_by: ShareBy,
    /// This region's weight and all regions' together, for shares by weight.
    weight: (u64, u64),
    callers: Mutex<HashMap<CallerKey, Caller>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl RegionalStore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        region: usize,
        global: Arc<GlobalStore>,
        clock: SimClock,
        link: Link,
        lost: Arc<AtomicBool>,
        share_by: ShareBy,
        weight: (u64, u64),
    ) -> Self {
        Self(Arc::new(Regional {
            region,
            global,
            clock,
            link,
            lost,
            back_after_loss: Mutex::new(None),
            was_lost: AtomicBool::new(false),
            share_by,
            weight,
            callers: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        }))
    }

    /// When each WAN call made for `caller` was sent, in ms of the run's clock.
    pub(crate) fn calls(&self, caller: &CallerKey) -> Vec<u64> {
        lock(&self.0.callers)
            .get(caller)
            .map(|c| c.calls.clone())
            .unwrap_or_default()
    }

    /// Ends the calls still on their way (at the end of a run).
    pub(crate) fn abort_calls(&self) {
        for task in lock(&self.0.tasks).drain(..) {
            task.abort();
        }
    }
}

impl Regional {
    /// The share a region that holds no snapshot falls back to: its weight's part by
    /// weight, nothing by demand (the global store reserves the same for it).
    fn unknown_share(&self, limit: u64) -> u64 {
        match self.share_by {
            ShareBy::Weight => {
                let (mine, all) = self.weight;
                u64::try_from(u128::from(limit) * u128::from(mine) / u128::from(all.max(1)))
                    .unwrap_or(limit)
            }
            ShareBy::Demand => 0,
        }
    }

    fn decide(
        self: &Arc<Self>,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> Result<CheckOutcome, StoreError> {
        if self.lost.load(Ordering::SeqCst) {
            self.was_lost.store(true, Ordering::SeqCst);
            return Err(StoreError::unavailable("regional store lost (simulated)"));
        }
        let (limit, window_ms) = sliding_window(limits);
        if limit == 0 || limits.len() != 1 {
            return Err(StoreError::other(
                "the two-tier model decides one sliding window policy",
            ));
        }
        let now = self.clock.now_millis();
        if self.was_lost.swap(false, Ordering::SeqCst) {
            *lock(&self.back_after_loss) = Some(now);
        }
        let mut callers = lock(&self.callers);
        let state = callers.entry(caller.clone()).or_default();
        state.demand.add(cost, DEMAND_MS, now);
        state.expire(now);
        // Leased units first: they are counted in the global count already. Then, while
        // cut off, the share (counted by the global store when the region is back).
        let admitted = if state.held() >= cost {
            state.spend(cost, window_ms, now);
            true
        } else if let Some(cut) = &mut state.cut_off {
            let taken = cut.counter.take(cost, cut.share, window_ms, now);
            if taken {
                state.owed.add(cost, window_ms, now);
                state.owed_units += cost;
            }
            taken
        } else {
            false
        };
        let share_room = state
            .cut_off
            .map_or(0, |cut| cut.counter.room(cut.share, window_ms, now));
        let remaining = state.held() + share_room;
        let reset_ms = if admitted || remaining > 0 {
            0
        } else {
            // A guess: when the next lease should have come.
            self.link.rtt_ms.max(1)
        };
        self.maybe_call(caller, limits, state, limit, window_ms, now);
        let outcome = PolicyOutcome {
            admitted,
            remaining,
            reset_ms,
        };
        Ok(CheckOutcome::new(vec![outcome]).counted_at(now))
    }

    /// Sends a WAN call for `caller` if one is due: while linked, when the leased units
    /// would not last a round trip and a half at the current demand, or the global store
    /// has something to count or take back; while cut off, every probe interval. One call
    /// at a time per caller.
    fn maybe_call(
        self: &Arc<Self>,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        state: &mut Caller,
        limit: u64,
        window_ms: u64,
        now: u64,
    ) {
        if state.in_flight.is_some() || now < state.next_call_ms {
            return;
        }
        let rtt = self.link.rtt_ms;
        // Units per second asked of this region, admitted or not.
        let demand = state.demand.used(DEMAND_MS, now);
        let over = |ms: u64| {
            u64::try_from((u128::from(demand) * u128::from(ms)).div_ceil(u128::from(DEMAND_MS)))
                .unwrap_or(u64::MAX)
        };
        // What a lease should cover: the demand over a round trip and the horizon (topped
        // up by any call, so that a call made only to give units back does not hold up the
        // next refill).
        let want = over(rtt + self.link.horizon_ms)
            .saturating_sub(state.held())
            .min(limit);
        if state.cut_off.is_none() {
            // Linked: call when the units held would run out before an answer comes back.
            // (Unrounded, with half a round trip to spare: the requests come one by one,
            // and a slow caller's last unit may well last until the next lease comes.)
            let refill_due = u128::from(state.held()) * u128::from(DEMAND_MS)
                <= u128::from(demand) * u128::from(rtt + rtt / 2);
            let owes = !state.owed.is_empty(window_ms, now)
                || !state.returns.is_empty()
                || !state.moved.is_empty(window_ms, now);
            if !refill_due && !owes {
                return;
            }
        }
        let call = Call {
            region: self.region,
            ack: self.ack(state, now, window_ms),
            owed: std::mem::take(&mut state.owed),
            moved: std::mem::take(&mut state.moved),
            returns: std::mem::take(&mut state.returns),
            // Per window of the limit, as the share is counted.
            demand: over(window_ms),
            want,
        };
        state.in_flight = Some(InFlight {
            asked: want,
            owed: call.owed,
            owed_units: std::mem::take(&mut state.owed_units),
            moved: call.moved,
        });
        state.calls.push(now);
        let this = Arc::clone(self);
        let (caller, limits) = (caller.clone(), limits.clone());
        let task = tokio::spawn(async move {
            let there = rtt / 2;
            let back = rtt - there;
            let timeout = this.link.timeout_ms.max(rtt);
            tokio::time::sleep(Duration::from_millis(there)).await;
            if this.link.cut.load(Ordering::SeqCst) {
                // Lost on the way there: nothing happened at the global store.
                tokio::time::sleep(Duration::from_millis(timeout - there)).await;
                return this.failed(&caller, &limits);
            }
            let answer = this.global.serve(&caller, &limits, call);
            tokio::time::sleep(Duration::from_millis(back)).await;
            if this.link.cut.load(Ordering::SeqCst) {
                // Lost on the way back: the global store served it, the region never
                // learns how.
                tokio::time::sleep(Duration::from_millis(timeout - rtt)).await;
                return this.failed(&caller, &limits);
            }
            this.answered(&caller, &limits, answer);
        });
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task.abort_handle());
    }

    /// The snapshot a call says the region holds. For two windows after the regional store
    /// was lost, a snapshot that leaves the region's whole share in reserve: while the
    /// regional store was lost its instances decided on their own local shares, which the
    /// global store never counted and which still weigh that long.
    fn ack(&self, state: &Caller, now: u64, window_ms: u64) -> Option<Snapshot> {
        let back = *lock(&self.back_after_loss);
        match (back, state.snapshot) {
            (Some(back), Some(snapshot)) if now < back + 2 * window_ms => Some(Snapshot {
                used: 0,
                share: snapshot.share,
                at_ms: now,
            }),
            _ => state.snapshot,
        }
    }

    /// A call got no answer in time: the region is cut off, and falls back to its share
    /// (or stays on it).
    fn failed(&self, caller: &CallerKey, limits: &Arc<[Policy]>) {
        let (limit, window_ms) = sliding_window(limits);
        let now = self.clock.now_millis();
        let mut callers = lock(&self.callers);
        let Some(state) = callers.get_mut(caller) else {
            return;
        };
        let Some(in_flight) = state.in_flight.take() else {
            return;
        };
        // The global store may or may not have counted what the call owed: owe it again
        // (counted twice at worst, never not at all).
        state.owed = state.owed.merged(in_flight.owed, window_ms, now);
        state.owed_units += in_flight.owed_units;
        state.moved = state.moved.merged(in_flight.moved, window_ms, now);
        state.next_call_ms = now + self.link.probe_ms;
        // A lease the call may have been granted is counted in the global count, and
        // never spent: it makes the count larger than what was admitted, never smaller,
        // so the share need not count it.
        if state.cut_off.is_none() {
            let (counter, share) = match state.snapshot {
                Some(snapshot) => {
                    // The share starts with the room it had when the global store last
                    // answered, and what has freed since then counts as spent: the region
                    // did not admit on it while it waited for its call to time out, and
                    // admitting it all at once now would put a window's worth of the
                    // share into the rest of the window (a sliding window counter takes
                    // a window's count as spread evenly over it).
                    let mut counter = snapshot.seed(limit, window_ms);
                    let freed = counter
                        .room(snapshot.share, window_ms, now)
                        .saturating_sub(counter.room(snapshot.share, window_ms, snapshot.at_ms));
                    counter.add(freed, window_ms, now);
                    (counter, snapshot.share)
                }
                None => (Window::default(), self.unknown_share(limit)),
            };
            state.cut_off = Some(CutOff { counter, share });
        }
    }

    /// An answer came back: the lease is the region's, the snapshot is the one it starts
    /// from should it be cut off, and a region that was cut off is linked again.
    fn answered(&self, caller: &CallerKey, limits: &Arc<[Policy]>, answer: Answer) {
        let (_, window_ms) = sliding_window(limits);
        let mut callers = lock(&self.callers);
        let Some(state) = callers.get_mut(caller) else {
            return;
        };
        let Some(in_flight) = state.in_flight.take() else {
            return;
        };
        let asked = in_flight.asked;
        if self.lost.load(Ordering::SeqCst) {
            // The regional store cannot take the answer: the lease is lost (counted
            // globally, never spent), and the region keeps the snapshot it had.
            return;
        }
        let now = self.clock.now_millis();
        if answer.granted < asked {
            // The caller's count had no room for all of it: asking again at once would
            // find only the room freed by the round trip. Half the horizon later there is
            // more of it for fewer calls.
            state.next_call_ms = now + self.link.horizon_ms / 2;
        }
        let mut granted = answer.granted;
        if state.cut_off.is_some() {
            if granted == 0 {
                // Reachable again, but nothing to lease yet: the region stays on its
                // share, and keeps saying so (its calls acknowledge the snapshot its share
                // started from, so the global store keeps its room in reserve).
                state.next_call_ms = state.next_call_ms.max(now);
                return;
            }
            // Linked again. What the share admitted while this answer was on its way is
            // paid for by the lease itself, as far as it goes; the rest stays owed.
            let covered = granted.min(state.owed_units);
            granted -= covered;
            if covered == state.owed_units {
                state.owed = Window::default();
            }
            state.owed_units -= covered;
            state.cut_off = None;
        }
        state.snapshot = Some(answer.snapshot);
        if granted > 0 {
            let counted = answer.counted_at_ms;
            let window_end_ms = counted - counted % window_ms + window_ms;
            state.held.push_back(Held {
                units: granted,
                counted_at_ms: counted,
                window_end_ms,
                expires_ms: window_end_ms + self.link.rtt_ms + self.link.horizon_ms,
            });
        }
    }
}

impl Backend for RegionalStore {
    fn check(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        cost: u64,
    ) -> StoreFuture<Result<CheckOutcome, StoreError>> {
        StoreFuture::ready(self.0.decide(caller, limits, cost))
    }

    fn is_remote(&self) -> bool {
        true
    }
}

/// Adds `units` counted at `counted_at_ms` to what goes back, one refund per time.
fn give_back(returns: &mut Vec<Refund>, units: u64, counted_at_ms: u64) {
    if units == 0 {
        return;
    }
    match returns
        .iter_mut()
        .find(|r| r.counted_at_ms() == counted_at_ms)
    {
        Some(refund) => *refund = Refund::new(refund.cost() + units, counted_at_ms),
        None => returns.push(Refund::new(units, counted_at_ms)),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
