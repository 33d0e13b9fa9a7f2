//! The holds by partition, with their ends in order: a new hold costs a bounded amount of
//! work however many are held, and the table never grows past its capacity.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::client::error::HoldReason;

/// How many ended holds each new one removes at most. More than one, so that ended holds
/// go faster than new ones come and never pile up beside the live ones, even when no call
/// looks their partitions up again.
const ENDED_PER_INSERT: usize = 4;

/// A partition's hold: calls wait until `until_ms` (the layer's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hold {
    pub(super) until_ms: u64,
    pub(super) reason: HoldReason,
}

/// A hold and the number that ranks it among holds ending in the same millisecond.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hold: Hold,
    id: u64,
}

/// Holds by partition, and the same holds by when they end.
#[derive(Debug)]
pub(super) struct HoldTable {
    by_partition: HashMap<Arc<str>, Entry>,
    // Keyed by (end, id): the first key is the hold that ends soonest, and the id sets apart
    // holds ending in the same millisecond without comparing their partitions.
    by_end: BTreeMap<(u64, u64), Arc<str>>,
    next_id: u64,
    capacity: usize,
}

impl HoldTable {
    /// An empty table that holds at most `capacity` partitions (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            by_partition: HashMap::new(),
            by_end: BTreeMap::new(),
            next_id: 0,
            capacity: capacity.max(1),
        }
    }

    /// The hold on `partition` at `now_ms`, if one is still running; an ended one is
    /// removed.
    pub(super) fn get(&mut self, partition: &str, now_ms: u64) -> Option<Hold> {
        let entry = *self.by_partition.get(partition)?;
        if entry.hold.until_ms > now_ms {
            return Some(entry.hold);
        }
        self.by_partition.remove(partition);
        self.by_end.remove(&(entry.hold.until_ms, entry.id));
        None
    }

    /// Holds `partition` as `hold` says, unless it is already held as long or longer.
    /// Returns whether the partition was not in the table before.
    pub(super) fn hold(&mut self, partition: &str, hold: Hold, now_ms: u64) -> bool {
        if let Some(entry) = self.by_partition.get_mut(partition) {
            if entry.hold.until_ms < hold.until_ms {
                let name = self
                    .by_end
                    .remove(&(entry.hold.until_ms, entry.id))
                    .unwrap_or_else(|| partition.into());
                self.by_end.insert((hold.until_ms, entry.id), name);
                entry.hold = hold;
            }
            return false;
        }
        self.make_room(now_ms);
        let id = self.next_id;
        self.next_id += 1;
        let name: Arc<str> = partition.into();
        self.by_end.insert((hold.until_ms, id), name.clone());
        self.by_partition.insert(name, Entry { hold, id });
        true
    }

    /// Before a new partition is added: removes up to [`ENDED_PER_INSERT`] ended holds,
    /// then, if the table is still full, the live hold that ends soonest (the one whose
    /// loss sends the fewest calls early). Returns how many holds it looked at, which is
    /// never more than `ENDED_PER_INSERT + 1`, however many are held.
    fn make_room(&mut self, now_ms: u64) -> usize {
        let mut looked_at = 0;
        while looked_at < ENDED_PER_INSERT
            && let Some(first) = self.by_end.first_entry()
        {
            looked_at += 1;
            if first.key().0 > now_ms {
                break;
            }
            let partition = first.remove();
            self.by_partition.remove(&partition);
        }
        if self.by_partition.len() >= self.capacity
            && let Some((_, partition)) = self.by_end.pop_first()
        {
            looked_at += 1;
            self.by_partition.remove(&partition);
        }
        looked_at
    }

    /// How many partitions the table holds, ended holds not yet removed included.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.by_partition.len(), self.by_end.len());
        self.by_partition.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn until(until_ms: u64) -> Hold {
        Hold {
            until_ms,
            reason: HoldReason::RetryAfter,
        }
    }

    #[test]
    fn regression_a_new_partition_looks_at_a_bounded_number_of_holds() {
        // Far more live holds than the old sweep threshold (1,024), and room for them all.
        let mut table = HoldTable::new(100_000);
        for i in 0..20_000u64 {
            table.hold(&format!("live-{i}"), until(10_000 + i), 0);
        }
        assert_eq!(
            table.make_room(5_000),
            1,
            "the first hold is live: stop there"
        );

        // Ended holds: a few go with each new partition, not all of them at once.
        let mut table = HoldTable::new(100_000);
        for i in 0..20_000u64 {
            table.hold(&format!("ended-{i}"), until(1 + i % 100), 0);
        }
        assert_eq!(table.make_room(1_000), ENDED_PER_INSERT);
        assert_eq!(table.len(), 20_000 - ENDED_PER_INSERT);
    }

    #[test]
    fn regression_live_holds_past_the_capacity_replace_the_one_that_ends_soonest() {
        let mut table = HoldTable::new(100);
        for i in 0..100u64 {
            table.hold(&format!("p{i}"), until(1_000 + i), 0);
        }
        assert!(table.hold("newcomer", until(5_000), 0));
        assert_eq!(table.len(), 100);
        assert_eq!(table.get("p0", 0), None, "p0 ended soonest");
        assert_eq!(table.get("p1", 0), Some(until(1_001)));
        assert_eq!(table.get("newcomer", 0), Some(until(5_000)));
        // However many more come, the table stays at its capacity.
        for i in 0..10_000u64 {
            table.hold(&format!("q{i}"), until(2_000 + i), 0);
            assert!(table.len() <= 100);
        }
    }

    #[test]
    fn ended_holds_drain_faster_than_new_ones_come() {
        let mut table = HoldTable::new(100_000);
        for i in 0..1_000u64 {
            table.hold(&format!("ended-{i}"), until(10), 0);
        }
        // Each new partition removes ENDED_PER_INSERT ended holds and adds one.
        for i in 0..400u64 {
            table.hold(&format!("new-{i}"), until(1_000), 20);
        }
        assert_eq!(table.len(), 400);
    }

    #[test]
    fn a_lengthened_hold_moves_in_the_order_of_ends() {
        let mut table = HoldTable::new(2);
        assert!(table.hold("a", until(100), 0));
        assert!(table.hold("b", until(200), 0));
        // a now ends last, so a new partition replaces b.
        assert!(!table.hold("a", until(300), 0));
        // Never shortened.
        assert!(!table.hold("a", until(150), 0));
        assert!(table.hold("c", until(250), 0));
        assert_eq!(table.get("a", 0), Some(until(300)));
        assert_eq!(table.get("b", 0), None);
        assert_eq!(table.get("c", 0), Some(until(250)));
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn looking_up_an_ended_hold_removes_it() {
        let mut table = HoldTable::new(10);
        table.hold("a", until(100), 0);
        assert_eq!(table.get("a", 99), Some(until(100)));
        assert_eq!(table.get("a", 100), None);
        assert_eq!(table.len(), 0);
    }
}
