//! One instance's part of a limit that the live instances share while the store cannot
//! decide, and the state such a part starts from.

use super::{AdmissionLog, Algorithm, State, ceil_div};

/// What one of the instances sharing a policy enforces with its own counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    /// What the instance's counters enforce.
    pub(crate) algorithm: Algorithm,
    /// For a quota below one request per instance and window: the windows this instance
    /// may admit in.
    pub(crate) turns: Option<Turns>,
}

/// Turns of one window each, for a quota below one request per instance and window, or a
/// token bucket's burst below the instance count (the window is then a turn's length). The
/// window `i` (counted from the epoch) is the turn of the instances at the places
/// `(i * quota + j) % instances` for `j` below `quota`, one request each: every window holds
/// at most `quota` admissions across the instances, and any span of a window's length at
/// most twice that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Turns {
    window_ms: u64,
    instances: u64,
    quota: u64,
    place: u64,
}

impl Turns {
    /// 0 when `now_ms` falls in one of this instance's windows; otherwise how long until
    /// the next one begins.
    pub(crate) fn wait_ms(&self, now_ms: u64) -> u64 {
        let index = now_ms / self.window_ms;
        if self.is_turn(index) {
            return 0;
        }
        // Every `instances` windows hold `quota` turns of each place's: one comes within
        // that many.
        (1..=self.instances)
            .map(|ahead| index + ahead)
            .find(|&next| self.is_turn(next))
            .map_or(self.window_ms, |next| {
                (next * self.window_ms).saturating_sub(now_ms)
            })
    }

    fn is_turn(&self, index: u64) -> bool {
        let n = u128::from(self.instances);
        let first = (u128::from(index) % n) * u128::from(self.quota) % n;
        (u128::from(self.place) + n - first) % n < u128::from(self.quota)
    }
}

impl Share {
    /// The part of `policy` that the instance at `place` among `instances` enforces;
    /// without a known place, the rounded-down part, and for turns the place `drawn`.
    pub(crate) fn of(policy: Algorithm, instances: u64, place: Option<u64>, drawn: u64) -> Self {
        let n = instances.max(1);
        // The remainder goes to the first places, one unit each: the parts sum to the quota.
        let part = |quota: u64| quota / n + u64::from(place.is_some_and(|k| k % n < quota % n));
        let turns = |quota: u64, window_ms: u64| Share {
            algorithm: Algorithm::TokenBucket {
                rate: 1,
                period_ms: window_ms,
                burst: 1,
            },
            turns: Some(Turns {
                window_ms,
                instances: n,
                quota,
                place: place.unwrap_or(drawn) % n,
            }),
        };
        match policy {
            Algorithm::SlidingWindow { limit, window_ms } if limit >= n => Share {
                algorithm: Algorithm::SlidingWindow {
                    limit: part(limit),
                    window_ms,
                },
                turns: None,
            },
            Algorithm::SlidingWindow { limit, window_ms } => turns(limit, window_ms),
            // Divided like a sliding window; each part is exact in its own counters.
            Algorithm::SlidingLog { limit, window_ms } if limit >= n => Share {
                algorithm: Algorithm::SlidingLog {
                    limit: part(limit),
                    window_ms,
                },
                turns: None,
            },
            Algorithm::SlidingLog { limit, window_ms } => turns(limit, window_ms),
            // Both the rate and the burst divide: the parts' rates sum to the rate and
            // their bursts to the burst.
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } if rate >= n && burst >= n => Share {
                algorithm: Algorithm::TokenBucket {
                    rate: part(rate),
                    period_ms,
                    burst: part(burst),
                },
                turns: None,
            },
            // A burst (or a rate) below the instance count cannot be divided, since a part
            // that admits at all holds at least one token: the instances take turns of
            // `per_turn` requests each, as many turns per period as the rate allows. At
            // one instant at most `per_turn` (never more than the burst) are admitted, and
            // in any span of a period, which meets at most `period / turn + 1` turns, at
            // most `rate + per_turn`, never more than `rate + burst`.
            Algorithm::TokenBucket {
                rate,
                period_ms,
                burst,
            } => {
                let per_turn = burst.min(rate).min(n).max(1);
                let turns_per_period = (rate / per_turn).max(1);
                turns(per_turn, period_ms.div_ceil(turns_per_period).max(1))
            }
        }
    }

    /// The state this part starts from for a caller that had used `used` units of
    /// `policy`'s quota when the store last answered for it, at `at_ms`: the same fraction
    /// of this part, rounded up (rounded down for what is left in a bucket), a log's units
    /// placed at `at_ms`. `None`: it starts as a caller never seen.
    pub(crate) fn seed(&self, policy: &Algorithm, used: u64, at_ms: u64) -> Option<State> {
        let quota = policy.quota().max(1);
        let used = used.min(quota);
        match self.algorithm {
            Algorithm::SlidingWindow { limit, window_ms } => {
                let used = ceil_div(u128::from(used) * u128::from(limit), u128::from(quota));
                (used > 0).then_some(State::SlidingWindow {
                    window_start: at_ms - at_ms % window_ms,
                    previous: 0,
                    current: used.min(limit),
                })
            }
            Algorithm::SlidingLog { limit, .. } => {
                let used = ceil_div(u128::from(used) * u128::from(limit), u128::from(quota));
                (used > 0).then(|| {
                    State::SlidingLog(AdmissionLog::from_times(std::iter::repeat_n(
                        at_ms,
                        used.min(limit) as usize,
                    )))
                })
            }
            Algorithm::TokenBucket {
                period_ms, burst, ..
            } => {
                let left = u128::from(quota - used) * u128::from(burst) / u128::from(quota);
                let tokens = u64::try_from(left).unwrap_or(burst).min(burst);
                (tokens < burst).then_some(State::TokenBucket {
                    level: tokens * period_ms,
                    updated_ms: at_ms,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn per_second(limit: u64) -> Algorithm {
        Algorithm::sliding_window(limit, Duration::from_secs(1))
    }

    fn quota(share: Share) -> u64 {
        share.algorithm.quota()
    }

    #[test]
    fn the_parts_sum_to_the_quota_in_its_own_window() {
        let parts: Vec<u64> = (0..4)
            .map(|k| quota(Share::of(per_second(50), 4, Some(k), 0)))
            .collect();
        assert_eq!(parts, [13, 13, 12, 12]);
        // Without a place, rounded down.
        assert_eq!(quota(Share::of(per_second(50), 4, None, 3)), 12);
        for limit in 1..40 {
            for n in 1..12 {
                let sum: u64 = (0..n)
                    .map(|k| Share::of(per_second(limit), n, Some(k), 0))
                    .filter(|s| s.turns.is_none())
                    .map(quota)
                    .sum();
                assert!(sum <= limit, "{limit} over {n}: {sum}");
                if limit >= n {
                    assert_eq!(sum, limit);
                }
            }
        }
    }

    #[test]
    fn turns_hold_the_quota_in_every_window() {
        for (limit, n) in [(1, 10), (3, 7), (2, 4), (5, 6)] {
            let shares: Vec<Share> = (0..n)
                .map(|k| Share::of(per_second(limit), n, Some(k), 0))
                .collect();
            for window in 0..100u64 {
                let at = window * 1_000 + 500;
                let open = shares
                    .iter()
                    .filter(|s| s.turns.is_some_and(|t| t.wait_ms(at) == 0))
                    .count() as u64;
                assert_eq!(open, limit, "{limit} over {n} in window {window}");
            }
            // Each place gets its turns: `limit` in every `n` windows.
            for share in &shares {
                let turns = share.turns.expect("turns");
                let mine = (0..n).filter(|w| turns.wait_ms(w * 1_000) == 0).count() as u64;
                assert_eq!(mine, limit);
            }
        }
    }

    /// Every instance sends a request every millisecond for `duration_ms`, deciding on its
    /// own part of `policy` divided over `n`: the times of what they admitted, all
    /// instances together.
    fn hammer(policy: Algorithm, n: u64, duration_ms: u64) -> Vec<u64> {
        let mut admitted = Vec::new();
        for place in 0..n {
            let part = Share::of(policy, n, Some(place), 0);
            let mut state = None;
            for now in 0..duration_ms {
                if part.turns.is_some_and(|turns| turns.wait_ms(now) > 0) {
                    continue;
                }
                let evaluation = part.algorithm.evaluate(state.clone(), now);
                if evaluation.admitted {
                    state = Some(evaluation.admitted_state);
                    admitted.push(now);
                }
            }
        }
        admitted.sort_unstable();
        admitted
    }

    /// The most of `times` (sorted) within any `span` ms, and at any one instant.
    fn worst(times: &[u64], span: u64) -> (usize, usize) {
        let mut in_span = 0;
        let mut at_once = 0;
        let mut start = 0;
        for (end, &time) in times.iter().enumerate() {
            while times[start] + span <= time {
                start += 1;
            }
            in_span = in_span.max(end + 1 - start);
            at_once = at_once.max(times[start..=end].iter().filter(|&&t| t == time).count());
        }
        (in_span, at_once)
    }

    #[test]
    fn regression_a_bucket_burst_below_the_instance_count_is_not_multiplied() {
        // (rate per second, burst, instances): the review's cases, and bursts and rates
        // on either side of the count.
        for (rate, burst, n) in [
            (10, 1, 4),
            (100, 3, 8),
            (10, 3, 4),
            (50, 4, 4),
            (50, 5, 4),
            (3, 1, 8),
            (3, 5, 8),
            (7, 2, 3),
            (1, 1, 2),
        ] {
            let bucket = Algorithm::token_bucket(rate, Duration::from_secs(1), burst);
            let admitted = hammer(bucket, n, 10_000);
            let (in_a_second, at_once) = worst(&admitted, 1_000);
            let case = format!("{rate}/s burst {burst} over {n}");
            assert!(at_once as u64 <= burst, "{case}: {at_once} at one instant");
            assert!(
                in_a_second as u64 <= rate + burst,
                "{case}: {in_a_second} in a second"
            );
            // Turns give up the burst, not the rate: over 10 s the instances together
            // admit at least half of what the bucket would, and nearly all of it when
            // the turns fit the period evenly.
            assert!(
                admitted.len() as u64 * 2 >= rate * 10,
                "{case}: {} in 10 s",
                admitted.len()
            );
        }
    }

    #[test]
    fn the_wait_ends_at_the_next_turn() {
        let login = Algorithm::sliding_window(1, Duration::from_secs(60));
        let third = Share::of(login, 10, Some(3), 0).turns.expect("turns");
        assert_eq!(third.wait_ms(3 * 60_000 + 5), 0);
        assert_eq!(third.wait_ms(4 * 60_000), 9 * 60_000);
        assert_eq!(third.wait_ms(12 * 60_000 + 30_000), 30_000);
    }

    #[test]
    fn a_part_starts_where_the_store_left_off() {
        let share = Share::of(per_second(50), 4, Some(3), 0);
        // 50 used of 50: all 12 of the part, in the window of the answer.
        let seeded = share.seed(&per_second(50), 50, 10_400).expect("seeded");
        assert_eq!(
            seeded,
            State::SlidingWindow {
                window_start: 10_000,
                previous: 0,
                current: 12
            }
        );
        assert!(
            !share
                .algorithm
                .evaluate(Some(seeded.clone()), 10_900)
                .admitted
        );
        // 10 of 50: 2.4, rounded up.
        assert!(matches!(
            share.seed(&per_second(50), 10, 0),
            Some(State::SlidingWindow { current: 3, .. })
        ));
        assert_eq!(share.seed(&per_second(50), 0, 0), None);

        let bucket = Algorithm::token_bucket(40, Duration::from_secs(1), 40);
        let part = Share::of(bucket, 4, Some(0), 0);
        // 30 of 40 tokens gone: 2 of the part's 10 left (2.5, rounded down).
        let seeded = part.seed(&bucket, 30, 5_000).expect("seeded");
        assert_eq!(part.algorithm.peek(Some(seeded), 5_000).remaining, 2);
        assert_eq!(part.seed(&bucket, 0, 5_000), None);

        // A log's part holds its used units at the answer's time, leaving a window later.
        let log = Algorithm::sliding_log(50, Duration::from_secs(1));
        let part = Share::of(log, 4, Some(0), 0);
        assert_eq!(
            part.algorithm,
            Algorithm::sliding_log(13, Duration::from_secs(1))
        );
        let seeded = part.seed(&log, 25, 10_400).expect("seeded");
        let outcome = part.algorithm.peek(Some(seeded.clone()), 10_400);
        assert_eq!(outcome.remaining, 6);
        // One more is free once the seeded units leave, a window after the answer.
        assert_eq!(outcome.reset_ms, 1_000);
        let full = part.seed(&log, 50, 10_400).expect("seeded");
        let refused = part.algorithm.peek(Some(full.clone()), 10_900);
        assert!(!refused.admitted);
        assert_eq!(refused.reset_ms, 500);
        assert!(part.algorithm.peek(Some(full), 11_400).admitted);
        let login = Algorithm::sliding_log(1, Duration::from_secs(60));
        assert!(Share::of(login, 10, Some(0), 0).turns.is_some());

        // A turn starts empty when the caller used any of its quota.
        let login = Algorithm::sliding_window(1, Duration::from_secs(60));
        let turn = Share::of(login, 10, Some(0), 0);
        let seeded = turn.seed(&login, 1, 0).expect("seeded");
        assert!(
            !turn
                .algorithm
                .evaluate(Some(seeded.clone()), 59_999)
                .admitted
        );
        assert!(turn.algorithm.evaluate(Some(seeded), 60_000).admitted);
    }
}
