//! A decision's report as a decision holds it: the usual report in three words, any other
//! boxed.
//!
//! A decision is moved on every request (out of the future that made it, into the
//! response's future), and each move copies the whole report. The usual report (one or two
//! policies of a set stored for the process, numbers below 2^32) fits three words: the
//! set's index, the report's small fields and the receipt's time in one, each policy's
//! numbers in another. Anything else (longer sets, sets shared by count, larger numbers)
//! is kept in one allocation (two past four policies), and reads the same.

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::limiter::reported_set::{MAX_STORED_SETS, ReportedSet, StoredSet};
use crate::store::algorithm::{OutcomeWords, PolicyOutcome};
use crate::store::policy::Policy;

/// What a report says besides each policy's numbers: who decided, whether it gives
/// something back and where, and what the request cost. The codes are the decision's
/// (see `DecisionSource` and `Receipted` there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Terms {
    /// Who decided, below [`Terms::SOURCES`].
    pub(crate) source: u8,
    /// Whether there is a receipt and whose counters it names, below [`Terms::RECEIPTS`].
    pub(crate) receipt: u8,
    /// When the store counted the admission, with a receipt; 0 without.
    pub(crate) counted_at_ms: u64,
    /// The request's units.
    pub(crate) cost: u64,
}

impl Terms {
    /// How many sources the packed form can name.
    pub(crate) const SOURCES: u8 = 1 << SOURCE_BITS;
    /// How many receipt kinds the packed form can name.
    pub(crate) const RECEIPTS: u8 = 1 << RECEIPT_BITS;
}

/// One decision's report.
#[derive(Clone)]
pub(crate) enum Report {
    /// One or two policies of a stored set, every number small enough.
    Packed(Packed),
    /// Anything else.
    Full(Box<Full>),
}

/// The packed form: `head` names the set and holds the small fields, `first` and
/// `second` the policies' numbers (for a set of one policy, `second` is the cost).
#[derive(Clone, Copy)]
pub(crate) struct Packed {
    head: NonZeroU64,
    first: u64,
    second: u64,
}

// The head, from its lowest bit: the set's index plus one, whether the set has two
// policies, each policy's admission, the source, the receipt, the cost of a request
// decided by two policies, and when its units were counted.
const INDEX_BITS: u32 = 12;
const TWO_AT: u32 = INDEX_BITS;
const ADMITTED_AT: u32 = TWO_AT + 1;
const SOURCE_AT: u32 = ADMITTED_AT + 2;
const SOURCE_BITS: u32 = 3;
const RECEIPT_AT: u32 = SOURCE_AT + SOURCE_BITS;
const RECEIPT_BITS: u32 = 2;
const PAIR_COST_AT: u32 = RECEIPT_AT + RECEIPT_BITS;
const PAIR_COST_BITS: u32 = 2;
const COUNTED_AT: u32 = PAIR_COST_AT + PAIR_COST_BITS;
const COUNTED_BITS: u32 = u64::BITS - COUNTED_AT;

// Every stored set's index, plus one, fits.
const _: () = assert!(MAX_STORED_SETS < 1 << INDEX_BITS);

fn bits(word: u64, at: u32, width: u32) -> u64 {
    (word >> at) & ((1 << width) - 1)
}

fn fits(value: u64, width: u32) -> bool {
    value >> width == 0
}

/// A policy's numbers in one word: `r` below, the wait above.
fn numbers(outcome: &PolicyOutcome) -> Option<u64> {
    (fits(outcome.remaining, 32) && fits(outcome.reset_ms, 32))
        .then_some(outcome.remaining | (outcome.reset_ms << 32))
}

impl Packed {
    /// The packed report of one policy's numbers, or two's (`second`), if they fit. Taken
    /// by value: numbers an answer just wrote are read from registers, not copied through
    /// memory.
    #[inline(always)]
    fn new(
        index: usize,
        first: PolicyOutcome,
        second: Option<PolicyOutcome>,
        terms: &Terms,
    ) -> Option<Self> {
        let pair_cost = if second.is_some() { terms.cost } else { 0 };
        if terms.source >= Terms::SOURCES
            || terms.receipt >= Terms::RECEIPTS
            || !fits(pair_cost, PAIR_COST_BITS)
            || !fits(terms.counted_at_ms, COUNTED_BITS)
        {
            return None;
        }
        let (second_word, two, second_admitted) = match second {
            Some(outcome) => (numbers(&outcome)?, 1, u64::from(outcome.admitted)),
            None => (terms.cost, 0, 0),
        };
        let head = (index as u64 + 1)
            | (two << TWO_AT)
            | (u64::from(first.admitted) << ADMITTED_AT)
            | (second_admitted << (ADMITTED_AT + 1))
            | (u64::from(terms.source) << SOURCE_AT)
            | (u64::from(terms.receipt) << RECEIPT_AT)
            | (pair_cost << PAIR_COST_AT)
            | (terms.counted_at_ms << COUNTED_AT);
        Some(Self {
            head: NonZeroU64::new(head)?,
            first: numbers(&first)?,
            second: second_word,
        })
    }

    fn head(&self, at: u32, width: u32) -> u64 {
        bits(self.head.get(), at, width)
    }

    fn set(&self) -> &'static StoredSet {
        StoredSet::at(self.head(0, INDEX_BITS) as usize - 1)
    }

    fn len(&self) -> usize {
        1 + self.head(TWO_AT, 1) as usize
    }

    /// The numbers of the policy at `index`, below [`len`](Self::len).
    fn outcome_at(&self, index: usize) -> PolicyOutcome {
        let word = if index == 0 { self.first } else { self.second };
        PolicyOutcome {
            admitted: self.head(ADMITTED_AT + index as u32, 1) == 1,
            remaining: word & u64::from(u32::MAX),
            reset_ms: word >> 32,
        }
    }

    fn terms(&self) -> Terms {
        Terms {
            source: self.head(SOURCE_AT, SOURCE_BITS) as u8,
            receipt: self.head(RECEIPT_AT, RECEIPT_BITS) as u8,
            counted_at_ms: self.head(COUNTED_AT, COUNTED_BITS),
            cost: match self.len() {
                1 => self.second,
                _ => self.head(PAIR_COST_AT, PAIR_COST_BITS),
            },
        }
    }
}

/// The boxed form.
#[derive(Clone)]
pub(crate) struct Full {
    set: ReportedSet,
    outcomes: FullOutcomes,
    terms: Terms,
}

/// How many policies' numbers the boxed form keeps in its own allocation: a report of
/// more takes a second one.
const KEPT_INLINE: usize = 4;

/// Each policy's numbers in the boxed form.
#[derive(Clone)]
enum FullOutcomes {
    Inline {
        len: usize,
        words: [OutcomeWords; KEPT_INLINE],
    },
    Heap(Box<[OutcomeWords]>),
}

impl FullOutcomes {
    fn as_slice(&self) -> &[OutcomeWords] {
        match self {
            FullOutcomes::Inline { len, words } => &words[..*len],
            FullOutcomes::Heap(words) => words,
        }
    }
}

impl Report {
    /// The report of `outcomes` against `set`, packed when it fits.
    #[inline(always)]
    pub(crate) fn new(set: ReportedSet, outcomes: &[PolicyOutcome], terms: Terms) -> Self {
        let outcomes = &outcomes[..set.get().len().min(outcomes.len())];
        let packed = match (set.index(), outcomes) {
            (Some(index), [first]) => Packed::new(index, *first, None, &terms),
            (Some(index), [first, second]) => Packed::new(index, *first, Some(*second), &terms),
            _ => None,
        };
        match packed {
            Some(packed) => Report::Packed(packed),
            None => Self::full(set, outcomes, terms),
        }
    }

    /// [`new`](Self::new) for the numbers of a set of one policy.
    #[inline(always)]
    pub(crate) fn one(set: ReportedSet, outcome: PolicyOutcome, terms: Terms) -> Self {
        if let Some(index) = set.index()
            && set.get().len() == 1
            && let Some(packed) = Packed::new(index, outcome, None, &terms)
        {
            return Report::Packed(packed);
        }
        Self::new(set, &[outcome], terms)
    }

    #[cold]
    fn full(set: ReportedSet, outcomes: &[PolicyOutcome], terms: Terms) -> Self {
        // A wait of 2^63 ms or more (never computed) is kept as the longest that fits.
        let kept =
            |outcome: &PolicyOutcome| OutcomeWords::of(*outcome, OutcomeWords::LONGEST_WAIT_MS);
        let outcomes = if outcomes.len() <= KEPT_INLINE {
            let mut words = [OutcomeWords::marker(0); KEPT_INLINE];
            for (word, outcome) in words.iter_mut().zip(outcomes) {
                *word = kept(outcome);
            }
            FullOutcomes::Inline {
                len: outcomes.len(),
                words,
            }
        } else {
            FullOutcomes::Heap(outcomes.iter().map(kept).collect())
        };
        Report::Full(Box::new(Full {
            set,
            outcomes,
            terms,
        }))
    }

    /// The policy set reported on.
    pub(crate) fn set(&self) -> ReportedSet {
        match self {
            Report::Packed(packed) => ReportedSet::Stored(packed.set()),
            Report::Full(full) => full.set.clone(),
        }
    }

    /// The policies reported on.
    pub(crate) fn policies(&self) -> &Arc<[Policy]> {
        match self {
            Report::Packed(packed) => packed.set().policies(),
            Report::Full(full) => full.set.get(),
        }
    }

    /// How many policies have numbers.
    pub(crate) fn len(&self) -> usize {
        match self {
            Report::Packed(packed) => packed.len(),
            Report::Full(full) => full.outcomes.as_slice().len(),
        }
    }

    /// The numbers of the policy at `index`, if it has any.
    #[inline]
    pub(crate) fn outcome(&self, index: usize) -> Option<PolicyOutcome> {
        (index < self.len()).then(|| self.outcome_at(index))
    }

    /// The numbers of the policy at `index`, below [`len`](Self::len).
    #[inline]
    pub(crate) fn outcome_at(&self, index: usize) -> PolicyOutcome {
        match self {
            Report::Packed(packed) => packed.outcome_at(index),
            Report::Full(full) => full.outcomes.as_slice()[index].get(),
        }
    }

    /// Each policy's numbers, in order.
    pub(crate) fn outcomes(&self) -> impl ExactSizeIterator<Item = PolicyOutcome> + Clone + '_ {
        (0..self.len()).map(|i| self.outcome_at(i))
    }

    /// The report's other fields.
    pub(crate) fn terms(&self) -> Terms {
        match self {
            Report::Packed(packed) => packed.terms(),
            Report::Full(full) => full.terms,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::algorithm::Algorithm;

    fn set(policies: usize) -> Arc<[Policy]> {
        (0..policies)
            .map(|i| {
                Policy::new(
                    format!("report-words-{i}"),
                    Algorithm::sliding_window(10 + i as u64, Duration::from_secs(1)),
                )
            })
            .collect()
    }

    fn outcome(admitted: bool, remaining: u64, reset_ms: u64) -> PolicyOutcome {
        PolicyOutcome {
            admitted,
            remaining,
            reset_ms,
        }
    }

    fn terms(cost: u64, receipt: u8, counted_at_ms: u64) -> Terms {
        Terms {
            source: 4,
            receipt,
            counted_at_ms,
            cost,
        }
    }

    /// What `report` says, read back.
    fn read(report: &Report) -> (Arc<[Policy]>, Vec<PolicyOutcome>, Terms) {
        (
            report.policies().clone(),
            report.outcomes().collect(),
            report.terms(),
        )
    }

    #[test]
    fn the_usual_report_is_packed_and_reads_back_as_written() {
        let now_ms = 1_764_000_000_123;
        for (policies, outcomes, terms) in [
            (1, vec![outcome(true, 49, 20)], terms(1, 1, now_ms)),
            (1, vec![outcome(false, 0, 999)], terms(u64::MAX, 0, 0)),
            (
                2,
                vec![
                    outcome(true, u32::MAX.into(), u32::MAX.into()),
                    outcome(false, 0, 1),
                ],
                terms(3, 2, (1 << COUNTED_BITS) - 1),
            ),
        ] {
            let set = set(policies);
            let report = Report::new(ReportedSet::store(&set), &outcomes, terms);
            assert!(matches!(report, Report::Packed(_)));
            assert_eq!(read(&report), (set, outcomes, terms));
        }
    }

    #[test]
    fn a_report_that_does_not_fit_is_boxed_and_reads_back_the_same() {
        let now_ms = 1_764_000_000_123;
        let one = outcome(true, 1, 2);
        for (set, outcomes, terms) in [
            // Shared by count, not stored.
            ((&set(1)).into(), vec![one], terms(1, 1, now_ms)),
            // Three policies, and more than are kept inline.
            (
                ReportedSet::store(&set(3)),
                vec![one; 3],
                terms(1, 1, now_ms),
            ),
            (
                ReportedSet::store(&set(6)),
                vec![one; 6],
                terms(1, 1, now_ms),
            ),
            // A number past 32 bits.
            (
                ReportedSet::store(&set(1)),
                vec![outcome(true, 1 << 32, 0)],
                terms(1, 0, 0),
            ),
            (
                ReportedSet::store(&set(1)),
                vec![outcome(false, 0, 1 << 32)],
                terms(1, 0, 0),
            ),
            // A cost past two bits with two policies.
            (
                ReportedSet::store(&set(2)),
                vec![one; 2],
                terms(4, 1, now_ms),
            ),
            // A time past the head's bits.
            (
                ReportedSet::store(&set(1)),
                vec![one],
                terms(1, 1, 1 << COUNTED_BITS),
            ),
        ] {
            let report = Report::new(set.clone(), &outcomes, terms);
            assert!(matches!(report, Report::Full(_)));
            assert_eq!(read(&report), (set.get().clone(), outcomes, terms));
        }
    }

    #[test]
    fn numbers_past_the_set_are_not_reported() {
        let set = set(1);
        let report = Report::new(
            ReportedSet::store(&set),
            &[outcome(true, 1, 1), outcome(true, 2, 2)],
            terms(1, 0, 0),
        );
        assert_eq!(report.len(), 1);
        assert_eq!(report.outcome(1), None);
    }
}
