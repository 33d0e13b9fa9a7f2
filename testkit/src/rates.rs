//! Measuring admitted rates over whole counting windows.
//!
//! A counter that starts cold (a store at start or after a restart, a local share at the
//! start of an outage) may spend a whole window's quota at once in its first window, and a
//! sliding window carries that into the next. Over the running example's 30 s phases that washes
//! out; over the few seconds of a test it would not, so rates are measured over whole
//! windows, aligned to the Unix epoch as tollgate's windows are, after the first full one.
//! And the worst window of a run: the most admissions in any window of the limit's length.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds now, to anchor a test's `Instant`-based offsets.
pub fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// The whole windows of `window` inside `[from, to)` after the one in progress at `from`
/// and the first whole one: offsets from a start whose Unix time is `start_unix_ms`.
///
/// # Panics
///
/// When no whole window is left: the phase is too short for the window.
pub fn steady_span(
    start_unix_ms: u64,
    from: Duration,
    to: Duration,
    window: Duration,
) -> (Duration, Duration) {
    let w = window.as_millis() as u64;
    let from_unix = start_unix_ms + from.as_millis() as u64;
    let to_unix = start_unix_ms + to.as_millis() as u64;
    let first = from_unix.div_ceil(w) * w + w;
    let last = to_unix / w * w;
    assert!(
        last >= first + w,
        "no steady window of {window:?} in [{from:?}, {to:?}): lengthen the phase"
    );
    (
        Duration::from_millis(first - start_unix_ms),
        Duration::from_millis(last - start_unix_ms),
    )
}

/// The largest number of `admitted` send times (sorted) in any window of `window` that
/// starts within `[from, to)`.
pub fn worst_window(
    admitted: &[Duration],
    window: Duration,
    from: Duration,
    to: Duration,
) -> usize {
    // A window's count only changes at a send time: the windows starting at each send
    // time (and at `from`) cover every count.
    let starts =
        std::iter::once(from).chain(admitted.iter().copied().filter(|t| *t >= from && *t < to));
    starts
        .map(|start| {
            let first = admitted.partition_point(|t| *t < start);
            let end = admitted.partition_point(|t| *t < start + window);
            end - first
        })
        .max()
        .unwrap_or(0)
}

/// How many of `admitted` (send times) fall in `[from, to)`, a second.
pub fn rate_between(admitted: &[Duration], from: Duration, to: Duration) -> f64 {
    admitted.iter().filter(|t| **t >= from && **t < to).count() as f64 / (to - from).as_secs_f64()
}
