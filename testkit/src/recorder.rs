//! Reading what tollgate records through a test recorder.

use std::future::Future;

use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Everything recorded up to a point. Taking a snapshot resets the recorder's counters,
/// so take one and read it as often as needed.
pub type Snapshot = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Runs `run` on a current-thread runtime with a fresh recorder as this thread's recorder
/// (build the limiters inside `run`), and returns its output with what was recorded after.
pub fn with_recorder<T, F>(run: impl FnOnce(Snapshotter) -> F) -> (T, Snapshot)
where
    F: Future<Output = T>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let output =
        metrics::with_local_recorder(&recorder, || runtime.block_on(run(snapshotter.clone())));
    (output, snapshotter.snapshot().into_vec())
}

fn find<'a>(snapshot: &'a Snapshot, name: &str, labels: &[(&str, &str)]) -> Vec<&'a DebugValue> {
    snapshot
        .iter()
        .filter(|(key, ..)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| value)
        .collect()
}

/// The sum of the counters `name` whose labels include `labels`.
pub fn counter(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> u64 {
    find(snapshot, name, labels)
        .into_iter()
        .map(|value| match value {
            DebugValue::Counter(count) => *count,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

/// The one gauge `name` whose labels include `labels`.
pub fn gauge(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> f64 {
    match find(snapshot, name, labels)[..] {
        [DebugValue::Gauge(value)] => value.into_inner(),
        ref other => panic!("{name}{labels:?}: {other:?}"),
    }
}

/// How many values the histograms `name` whose labels include `labels` received.
pub fn histogram_len(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> usize {
    find(snapshot, name, labels)
        .into_iter()
        .map(|value| match value {
            DebugValue::Histogram(values) => values.len(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}
