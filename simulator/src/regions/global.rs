//! The global store: each caller's global counters, one WAN round trip away from every
//! region, and what it remembers of each region so that a region cut off from it can fall
//! back to a share without the regions together exceeding the limit.
//!
//! The counters are an ordinary tollgate store ([`InMemoryBackend`] here, a Redis of its
//! own in a deployment): a region's lease is [`Backend::lease`] against them, consumed at
//! once, so the leases the regions hold never add up to more than the limit while the
//! store is reachable. Everything [`GlobalStore::serve`] does for one call happens under
//! one lock, as one Lua script would do it on the global Redis, with the region records
//! kept beside the caller's counters under its hash tag (a few numbers per region and
//! caller: two snapshots, a demand, and three small window counters).
//!
//! # The rule that keeps a partition under the limit
//!
//! A region cut off from this store enforces a share `s` of the limit `L`, starting from
//! what this store last told it: its share of the caller's count then, `ceil(used * s /
//! L)`, counted in the window of that answer (the local share's rule). From then on it may
//! admit up to its share's *room*, which grows as that seed slides out. This store never
//! learns when a region is cut off (a partition looks like a region that has not called
//! yet), so it keeps every region's fall-back possible at all times: it grants a lease
//! only if, after it, the caller's count plus the room of any one other region's share
//! would still fit in the limit. Once a region is cut off its room is reserved, and the
//! other regions lease what is left; while it calls, it has seen a count close to the
//! current one, and its room is small.
//!
//! Which snapshot a region would start from is the one it last received. It says so with
//! each call (`ack`); the answer to that call, which may be lost, carries a newer one. So
//! the store reserves the larger of the two rooms, the first less what the region has
//! reported admitting on that share since.
//!
//! The asking region's own room is not reserved against its own lease: were the answer
//! lost, the lease would be counted and never spent, which only makes the count larger
//! than what was admitted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use tollgate::InMemoryBackend;
use tollgate::Policy;
use tollgate::store::{Algorithm, Backend, CallerKey, Clock, Refund};

use super::ShareBy;
use super::window::Window;
use crate::store::SimClock;

/// What this store told a region in an answer: the caller's count as it estimated it
/// after the answer's grant (`used`, rounded up), the region's share of the limit, and
/// when. A region cut off starts its share from the last one it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) used: u64,
    pub(crate) share: u64,
    pub(crate) at_ms: u64,
}

impl Snapshot {
    /// The counter a region cut off starts its share from: its share of the count it was
    /// told, `ceil(used * share / limit)`, in the current window of the answer (the local
    /// share's rule: all of it weighs until that window ends).
    pub(crate) fn seed(self, limit: u64, window_ms: u64) -> Window {
        let part = (u128::from(self.used.min(limit)) * u128::from(self.share))
            .div_ceil(u128::from(limit.max(1)));
        Window::seeded(
            u64::try_from(part).unwrap_or(u64::MAX),
            window_ms,
            self.at_ms,
        )
    }

    /// The most a region starting from this snapshot could admit on its share from
    /// `now_ms` on: the room its seeded counter has left then.
    pub(crate) fn room(self, limit: u64, window_ms: u64, now_ms: u64) -> u64 {
        self.seed(limit, window_ms)
            .room(self.share, window_ms, now_ms)
    }
}

/// A region's call: what it holds, owes, gives back and wants.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) region: usize,
    /// The snapshot the region holds: the one it would start its share from if cut off.
    pub(crate) ack: Option<Snapshot>,
    /// What the region admitted on its share while cut off, which this store has not
    /// counted yet.
    pub(crate) owed: Window,
    /// Leased units the region spent after the window they were counted in (they come
    /// back in `returns` too).
    pub(crate) moved: Window,
    /// Leased units that expired unspent, to give back to the window they came from.
    pub(crate) returns: Vec<Refund>,
    /// The units asked of the region for this caller per window of the limit (measured
    /// over the last second).
    pub(crate) demand: u64,
    /// The units it would like to lease.
    pub(crate) want: u64,
}

/// The answer to a [`Call`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answer {
    /// Units leased, already counted in the caller's global count.
    pub(crate) granted: u64,
    /// When they were counted, on this store's clock: they may be spent until that window
    /// ends.
    pub(crate) counted_at_ms: u64,
    pub(crate) snapshot: Snapshot,
}

/// What this store remembers of one region, for one caller.
#[derive(Clone, Copy, Debug, Default)]
struct Record {
    /// The snapshot the region said it held with its latest call.
    known: Option<Snapshot>,
    /// The snapshot of the answer to that call, which the region may not have received.
    sent: Option<Snapshot>,
    /// The demand it reported with its latest call.
    demand: u64,
    /// What it admitted that the counters never counted.
    owed: Window,
    /// What it admitted on its share since the snapshot it acknowledges.
    share_used: Window,
    /// What it was granted, and what it admitted on its share: what it got of the limit.
    granted: Window,
}

/// The global store of the two-tier model.
#[derive(Debug)]
pub(crate) struct GlobalStore {
    counters: InMemoryBackend,
    clock: SimClock,
    share_by: ShareBy,
    /// Each region's weight, for shares by weight.
    weights: Vec<u64>,
    records: Mutex<HashMap<CallerKey, Vec<Record>>>,
}

impl GlobalStore {
    pub(crate) fn new(clock: SimClock, share_by: ShareBy, weights: Vec<u64>) -> Arc<Self> {
        Arc::new(Self {
            counters: InMemoryBackend::new().clock(clock),
            clock,
            share_by,
            weights,
            records: Mutex::new(HashMap::new()),
        })
    }

    /// Serves one call of `region` for `caller`, as one atomic step.
    pub(crate) fn serve(&self, caller: &CallerKey, limits: &Arc<[Policy]>, call: Call) -> Answer {
        let now = self.clock.now_millis();
        let (limit, window_ms) = sliding_window(limits);
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let records = records
            .entry(caller.clone())
            .or_insert_with(|| vec![Record::default(); self.weights.len()]);

        // 1. Leased units go back to the window they were counted in, while it still
        //    weighs: those that expired unspent, and those spent after that window, which
        //    count in the window they were spent in instead (in the current one, as much
        //    as they still weigh: all of them, unless the call comes a window later).
        for refund in &call.returns {
            let _ = self
                .counters
                .refund(caller, limits, *refund)
                .try_take_ready();
        }
        let moved = call.moved.used(window_ms, now);
        if moved > 0 {
            let _ = self.counters.charge(caller, limits, moved).try_take_ready();
        }
        // 2. What the region admitted on its share while it was cut off is kept beside the
        //    counters, a sliding window counter per region, in the windows the region
        //    counted it in: it counts in the caller's count as much as it still weighs,
        //    no more, no less.
        let region = call.region;
        records[region].owed = records[region].owed.merged(call.owed, window_ms, now);
        records[region].granted = records[region].granted.merged(call.owed, window_ms, now);
        // 3. The region's record: what it would start from if cut off now, what it has
        //    admitted on its share since, and its demand. A region on its share keeps
        //    acknowledging the snapshot its share started from; once it acknowledges
        //    another, it has left its share (the new snapshot's count holds what it owed
        //    until then, or the call that carries the rest was sent before it switched).
        if records[region].known == call.ack {
            records[region].share_used =
                records[region].share_used.merged(call.owed, window_ms, now);
        } else {
            records[region].share_used = Window::default();
        }
        records[region].known = call.ack;
        records[region].demand = call.demand;
        let share = self.share_of(region, records, limit);

        // 4. The grant: what the region wants, as far as the caller's count has room (the
        //    lease's own rule, and what the regions owe), and no further than leaves room
        //    for any one other region's share, should it be cut off now.
        let used = self.used(caller, limits, records, window_ms, now);
        let reserved = records
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != region)
            .map(|(other, record)| self.room_of(other, record, limit, window_ms, now))
            .max()
            .unwrap_or(0);
        let cap = limit.saturating_sub(reserved).saturating_sub(used);
        // 5. Fairness: each region may lease up to its share of the limit (its part of
        //    the demand, or of the weights) in any window; beyond it, only what the other
        //    regions' shares leave, each as far as it asks for it (its demand). Under
        //    overload each region then gets the same part of what it was asked, as if
        //    every request went to one store.
        let others_due: u64 = records
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != region)
            .map(|(other, record)| {
                self.share_of(other, records, limit)
                    .min(record.demand)
                    .saturating_sub(record.granted.used(window_ms, now))
            })
            .sum();
        let own_due = share.saturating_sub(records[region].granted.used(window_ms, now));
        let fair = own_due.max(limit.saturating_sub(used).saturating_sub(others_due));
        let want = call.want.min(cap).min(fair);
        let granted = if want == 0 {
            0
        } else {
            match self.counters.lease(caller, limits, 1, want) {
                Some(mut lease) => lease
                    .try_take_ready()
                    .and_then(Result::ok)
                    .map_or(0, |grant| grant.granted()),
                None => 0,
            }
        };
        let snapshot = Snapshot {
            used: self.used(caller, limits, records, window_ms, now),
            share,
            at_ms: now,
        };
        records[region].sent = Some(snapshot);
        records[region].granted.add(granted, window_ms, now);
        Answer {
            granted,
            counted_at_ms: now,
            snapshot,
        }
    }

    /// The caller's count now: the counters' (the limit less what they have left, so
    /// rounded up) and what the regions owe, each rounded up.
    fn used(
        &self,
        caller: &CallerKey,
        limits: &Arc<[Policy]>,
        records: &[Record],
        window_ms: u64,
        now: u64,
    ) -> u64 {
        let (limit, _) = sliding_window(limits);
        let owed: u64 = records.iter().map(|r| r.owed.used(window_ms, now)).sum();
        limit
            .saturating_sub(self.remaining(caller, limits))
            .saturating_add(owed)
    }

    /// What the caller's counters have left now (a cost of 0 consumes nothing).
    fn remaining(&self, caller: &CallerKey, limits: &Arc<[Policy]>) -> u64 {
        self.counters
            .check(caller, limits, 0)
            .try_take_ready()
            .and_then(Result::ok)
            .and_then(|outcome| outcome.limits().iter().map(|l| l.remaining).min())
            .unwrap_or(0)
    }

    /// The share of the limit that `region` falls back to: its weight's part, or its part
    /// of the demand the regions last reported. Either way the parts of all regions add up
    /// to the limit at most (each rounded down).
    fn share_of(&self, region: usize, records: &[Record], limit: u64) -> u64 {
        let (mine, all) = match self.share_by {
            ShareBy::Weight => (self.weights[region], self.weights.iter().sum::<u64>()),
            ShareBy::Demand => (
                records[region].demand,
                records.iter().map(|r| r.demand).sum::<u64>(),
            ),
        };
        if all == 0 {
            return 0;
        }
        u64::try_from(u128::from(limit) * u128::from(mine) / u128::from(all)).unwrap_or(limit)
    }

    /// The most `region` could admit on its share from `now_ms` on, were it cut off now (or
    /// is, already): the larger room of the share started from the snapshot it last
    /// acknowledged (less what it told of admitting on it) and of one started from the
    /// snapshot last sent to it.
    /// A region that has no snapshot falls back to its whole share by weight, and to
    /// nothing by demand (its share is its part of a demand it never reported).
    fn room_of(&self, region: usize, record: &Record, limit: u64, window_ms: u64, now: u64) -> u64 {
        let unknown = match self.share_by {
            ShareBy::Weight => {
                let all = self.weights.iter().sum::<u64>().max(1);
                u64::try_from(
                    u128::from(limit) * u128::from(self.weights[region]) / u128::from(all),
                )
                .unwrap_or(limit)
            }
            ShareBy::Demand => 0,
        };
        // Its share's counter, as far as this store knows it: seeded from the snapshot it
        // acknowledges, with what it admitted on it since.
        let known = match record.known {
            Some(s) => s
                .seed(limit, window_ms)
                .merged(record.share_used, window_ms, now)
                .room(s.share, window_ms, now),
            None => unknown.saturating_sub(record.share_used.used(window_ms, now)),
        };
        known.max(record.sent.map_or(0, |s| s.room(limit, window_ms, now)))
    }
}

/// The limit and window of the one sliding window policy the two-tier model decides.
pub(crate) fn sliding_window(limits: &[Policy]) -> (u64, u64) {
    match limits.first().map(Policy::algorithm) {
        Some(&Algorithm::SlidingWindow { limit, window_ms }) => (limit, window_ms),
        _ => (0, 1),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::{Policy, Quota};

    use super::*;

    fn call(region: usize, ack: Option<Snapshot>, demand: u64, want: u64) -> Call {
        Call {
            region,
            ack,
            owed: Window::default(),
            moved: Window::default(),
            returns: Vec::new(),
            demand,
            want,
        }
    }

    #[test]
    fn the_room_of_a_regions_share_stays_in_reserve() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let clock = SimClock::virtual_time(1_000_000, tokio::time::Instant::now());
            let global = GlobalStore::new(clock, ShareBy::Demand, vec![1, 1]);
            let limits: Arc<[Policy]> =
                vec![Policy::sliding_window("per-second", Quota::per_second(50))].into();
            let acme = CallerKey::new("acme");

            // Region 0 alone has asked: all of the demand is its, so is the whole limit.
            let first = global.serve(&acme, &limits, call(0, None, 40, 40));
            assert_eq!(first.granted, 40);
            assert_eq!((first.snapshot.used, first.snapshot.share), (40, 50));
            // Cut off with that snapshot, region 0 could still admit 10 on its share:
            // region 1 gets nothing of the 10 left.
            let second = global.serve(&acme, &limits, call(1, None, 10, 20));
            assert_eq!(second.granted, 0);
            // Region 0 calls again: its share is 40 now (40 of a demand of 50). Until it
            // says it holds the new snapshot, the old one's room stays in reserve.
            let third = global.serve(&acme, &limits, call(0, Some(first.snapshot), 40, 0));
            assert_eq!((third.snapshot.used, third.snapshot.share), (40, 40));
            assert_eq!(
                global.serve(&acme, &limits, call(1, None, 10, 20)).granted,
                0
            );
            // Once it does, its share's room is 40 - ceil(40 * 40 / 50) = 8: region 1
            // gets the other 2.
            global.serve(&acme, &limits, call(0, Some(third.snapshot), 40, 0));
            assert_eq!(
                global.serve(&acme, &limits, call(1, None, 10, 20)).granted,
                2
            );

            // Region 0 falls silent (cut off). Half a window into the next one, the 42
            // counted weigh 21, and region 0's share could admit 40 - 32 / 2 = 24: region
            // 1 gets 5.
            tokio::time::advance(Duration::from_millis(1_500)).await;
            assert_eq!(
                global.serve(&acme, &limits, call(1, None, 10, 20)).granted,
                5
            );
            // A window later the seed has slid out: region 0's whole share (40) stays in
            // reserve, and region 1 leases what the other 10 leave, its 5 of the last
            // window still weighing half: 7, however often it asks.
            tokio::time::advance(Duration::from_millis(1_000)).await;
            let granted: u64 = (0..4)
                .map(|_| global.serve(&acme, &limits, call(1, None, 10, 20)).granted)
                .sum();
            assert_eq!(granted, 7);
        });
    }
}
