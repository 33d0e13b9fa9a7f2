//! Measuring admitted rates over whole counting windows.
//!
//! A counter that starts cold (a store at start or after a restart, a local share at the
//! start of an outage) may spend a whole window's quota at once in its first window, and a
//! sliding window carries that into the next. Over the running example's 30 s phases that washes
//! out; over the few seconds of a test it would not, so rates are measured over whole
//! windows, aligned to the Unix epoch as tollgate's windows are, after the first full one.

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
