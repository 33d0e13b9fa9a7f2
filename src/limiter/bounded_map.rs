//! A map from callers to what the limiter keeps of them, bounded in size, whose entries
//! each matter until a time: a full map makes room by looking at a few entries, never by
//! scanning them all, so a flood of new callers costs each decision the same.

use std::collections::HashMap;

use crate::store::caller::CallerKey;

/// How many entries a full map looks at, from where it last stopped, for one that no longer
/// matters.
const SAMPLE: usize = 8;

/// What a full map does with a new caller when none of the entries it looked at is over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WhenFull {
    /// The callers already kept stay; the new one is not kept.
    KeepOld,
    /// The entry looked at that matters for the shortest time makes room.
    ReplaceSoonest,
}

/// At most `capacity` callers, each with a value and the time until which it matters.
pub(crate) struct BoundedMap<V> {
    /// The entries, found by one lookup.
    entries: HashMap<CallerKey, Entry<V>>,
    /// The callers in the order a full map looks at them for room.
    places: Vec<CallerKey>,
    capacity: usize,
    /// Where the next look for room starts: every entry is looked at in turn.
    hand: usize,
    /// No entry matters for less than this: until then a full map has no room to find.
    earliest_until_ms: u64,
    when_full: WhenFull,
}

struct Entry<V> {
    /// Where the caller is in `places`.
    place: usize,
    until_ms: u64,
    value: V,
}

impl<V> BoundedMap<V> {
    pub(crate) fn new(capacity: usize, when_full: WhenFull) -> Self {
        Self {
            entries: HashMap::new(),
            places: Vec::new(),
            capacity: capacity.max(1),
            hand: 0,
            earliest_until_ms: u64::MAX,
            when_full,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.places.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// The value kept for `caller`, whether or not it still matters.
    pub(crate) fn get(&self, caller: &CallerKey) -> Option<&V> {
        self.entries.get(caller).map(|entry| &entry.value)
    }

    /// The value kept for `caller` and the time until which it matters, to change in
    /// place (a later time only).
    pub(crate) fn get_mut(&mut self, caller: &CallerKey) -> Option<(&mut V, &mut u64)> {
        self.entries
            .get_mut(caller)
            .map(|entry| (&mut entry.value, &mut entry.until_ms))
    }

    /// Keeps `value` for `caller` until `until_ms`, replacing what was kept for it, and
    /// making room as [`WhenFull`] says when the map is full at `now_ms`: whether it is kept.
    pub(crate) fn insert(
        &mut self,
        caller: &CallerKey,
        value: V,
        until_ms: u64,
        now_ms: u64,
    ) -> bool {
        self.earliest_until_ms = self.earliest_until_ms.min(until_ms);
        if let Some(entry) = self.entries.get_mut(caller) {
            entry.value = value;
            entry.until_ms = until_ms;
            return true;
        }
        let place = if self.places.len() < self.capacity {
            self.places.push(caller.clone());
            self.places.len() - 1
        } else {
            let Some(place) = self.room(now_ms) else {
                return false;
            };
            let old = std::mem::replace(&mut self.places[place], caller.clone());
            self.entries.remove(&old);
            place
        };
        self.entries.insert(
            caller.clone(),
            Entry {
                place,
                until_ms,
                value,
            },
        );
        true
    }

    /// Forgets `caller`: what was kept for it.
    pub(crate) fn remove(&mut self, caller: &CallerKey) -> Option<V> {
        let removed = self.entries.remove(caller)?;
        self.places.swap_remove(removed.place);
        if let Some(moved) = self.places.get(removed.place)
            && let Some(entry) = self.entries.get_mut(moved)
        {
            entry.place = removed.place;
        }
        Some(removed.value)
    }

    /// The place of an entry to replace in a full map, looking at [`SAMPLE`] entries from
    /// the hand: the first that no longer matters at `now_ms`, else as [`WhenFull`] says.
    fn room(&mut self, now_ms: u64) -> Option<usize> {
        let over_possible = self.earliest_until_ms <= now_ms;
        if !over_possible && self.when_full == WhenFull::KeepOld {
            return None;
        }
        let len = self.places.len();
        let until = |place: usize| {
            self.entries
                .get(&self.places[place])
                .map_or(0, |e| e.until_ms)
        };
        let mut soonest = self.hand % len;
        let mut soonest_until = until(soonest);
        for step in 0..SAMPLE.min(len) {
            let place = (self.hand + step) % len;
            let until_ms = until(place);
            if until_ms <= now_ms {
                self.hand = place + 1;
                return Some(place);
            }
            if until_ms < soonest_until {
                (soonest, soonest_until) = (place, until_ms);
            }
        }
        self.hand = (self.hand + SAMPLE) % len;
        match self.when_full {
            WhenFull::KeepOld => None,
            WhenFull::ReplaceSoonest => Some(soonest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(i: usize) -> CallerKey {
        CallerKey::new(format!("c{i}"))
    }

    #[test]
    fn a_full_map_keeps_its_callers_or_replaces_the_soonest_as_asked() {
        let mut keep = BoundedMap::new(4, WhenFull::KeepOld);
        let mut replace = BoundedMap::new(4, WhenFull::ReplaceSoonest);
        for i in 0..4 {
            assert!(keep.insert(&caller(i), i, 1_000 + i as u64, 0));
            assert!(replace.insert(&caller(i), i, 1_000 + i as u64, 0));
        }
        assert!(!keep.insert(&caller(9), 9, 5_000, 10));
        assert_eq!((keep.len(), keep.get(&caller(9))), (4, None));
        assert!(replace.insert(&caller(9), 9, 5_000, 10));
        assert_eq!(replace.get(&caller(0)), None, "the soonest made room");
        assert_eq!(replace.get(&caller(9)), Some(&9));
        // Once an entry no longer matters, it makes room in either.
        assert!(keep.insert(&caller(8), 8, 5_000, 1_002));
        assert_eq!(keep.len(), 4);
        assert!(keep.get(&caller(8)).is_some());
        // A caller kept is changed in place, and removed whole.
        assert!(keep.insert(&caller(8), 80, 6_000, 1_002));
        assert_eq!(keep.get(&caller(8)), Some(&80));
        assert_eq!(keep.remove(&caller(8)), Some(80));
        assert_eq!(keep.len(), 3);
        for i in 0..4 {
            if let Some(value) = keep.get(&caller(i)) {
                assert_eq!(*value, i);
            }
        }
    }

    #[test]
    fn regression_a_full_map_finds_room_in_a_bounded_number_of_looks() {
        // 1,000 callers that matter for a long time fill the map; 100,000 new ones arrive.
        // Each is turned away without looking at more than the sample, and the map's
        // callers stay.
        let mut map = BoundedMap::new(1_000, WhenFull::KeepOld);
        for i in 0..1_000 {
            map.insert(&caller(i), (), 86_400_000, 0);
        }
        for i in 1_000..101_000 {
            assert!(!map.insert(&caller(i), (), 86_400_000, 1));
            assert_eq!(map.hand, 0, "looked for room where none can be");
        }
        assert!((0..1_000).all(|i| map.get(&caller(i)).is_some()));
        // Once some are over, each insert looks at most at the sample, and the hand goes
        // round so that every entry over is found in turn.
        let mut short = BoundedMap::new(1_000, WhenFull::KeepOld);
        for i in 0..1_000 {
            short.insert(&caller(i), (), if i % 10 == 0 { 5 } else { 86_400_000 }, 0);
        }
        let mut kept = 0;
        for i in 1_000..3_000 {
            let hand = short.hand;
            kept += usize::from(short.insert(&caller(i), (), 86_400_000, 10));
            let looked = (short.hand + 1_000 - hand) % 1_000;
            assert!(looked <= SAMPLE, "looked at {looked}");
        }
        assert_eq!(
            kept, 100,
            "every entry that was over made room, and only those"
        );
    }
}
