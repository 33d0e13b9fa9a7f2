//! What a run leaves behind: the rows `scripts/bench` turns into BENCHMARKS.md, read from
//! criterion's estimates of the benchmarks that ran in this process, and the formatting
//! of the figures in them.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// Set to run every scenario with a Prometheus recorder installed (diagnostics; the
/// published figures run without one).
pub(crate) const PROMETHEUS: &str = "TOLLGATE_BENCH_PROMETHEUS";

/// Where to leave the rows, when not in this crate's `target/` (the peers' benchmarks,
/// a crate of their own, leave theirs beside tollgate's).
const RESULTS: &str = "TOLLGATE_BENCH_RESULTS";

/// One line of the table in BENCHMARKS.md.
pub(crate) struct Row {
    scenario: String,
    tollgate: String,
    peer: String,
    ratio: String,
    target: String,
    met: &'static str,
}

impl Row {
    pub(crate) fn new(scenario: impl Into<String>, tollgate: impl Into<String>) -> Self {
        Self {
            scenario: scenario.into(),
            tollgate: tollgate.into(),
            peer: "—".into(),
            ratio: "—".into(),
            target: "—".into(),
            met: "—",
        }
    }

    pub(crate) fn peer(mut self, peer: impl Into<String>) -> Self {
        self.peer = peer.into();
        self
    }

    pub(crate) fn ratio(mut self, ratio: impl Into<String>) -> Self {
        self.ratio = ratio.into();
        self
    }

    pub(crate) fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = target.into();
        self.met = if met { "yes" } else { "no" };
        self
    }
}

/// Where the rows go: `$TOLLGATE_BENCH_RESULTS`, or `target/tollgate-bench/`
/// (`-prometheus` with a recorder installed).
fn results_dir() -> PathBuf {
    // Diagnostic runs with a recorder keep their rows apart from the published ones.
    let name = match std::env::var_os(PROMETHEUS) {
        Some(_) => "target/tollgate-bench-prometheus",
        None => "target/tollgate-bench",
    };
    let dir = match std::env::var_os(RESULTS) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name),
    };
    fs::create_dir_all(&dir).expect("results dir");
    dir
}

/// Writes a scenario's rows as `id <TAB> scenario <TAB> tollgate <TAB> peer <TAB> ratio
/// <TAB> target <TAB> met`, one per line, for `scripts/bench`.
pub(crate) fn write_rows(file: &str, rows: &[(impl AsRef<str>, Row)]) {
    let mut text = String::new();
    for (id, row) in rows {
        let id = id.as_ref();
        let _ = writeln!(
            text,
            "{id}\t{}\t{}\t{}\t{}\t{}\t{}",
            row.scenario, row.tollgate, row.peer, row.ratio, row.target, row.met
        );
        println!(
            "{id}: {} | tollgate {} | peer {} | ratio {} | target {} | met {}",
            row.scenario, row.tollgate, row.peer, row.ratio, row.target, row.met
        );
    }
    fs::write(results_dir().join(file), text).expect("write results");
}

/// Where criterion writes its estimates (as criterion itself decides, made explicit).
pub(crate) fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        PathBuf::from(home)
    } else if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        PathBuf::from(target).join("criterion")
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/criterion")
    }
}

/// Benchmarks that ran in this process, so that a filtered run never reads a figure left
/// over from an earlier one.
static RAN: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

/// Records that `group/id` ran in this process (call it inside the bench closure).
pub(crate) fn ran(group: &str, id: &str) {
    RAN.lock().unwrap().insert(format!("{group}/{id}"));
}

/// The median time per iteration criterion estimated for `group/id`, in nanoseconds.
pub(crate) fn median_ns(group: &str, id: &str) -> Option<f64> {
    if !RAN.lock().unwrap().contains(&format!("{group}/{id}")) {
        return None;
    }
    let path = criterion_dir()
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let text = fs::read_to_string(path).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(&text).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

/// The median of `values` (the upper one of an even count); `None` when there are none.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// Nanoseconds, one decimal below 100.
pub(crate) fn ns(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0} ns")
    } else {
        format!("{value:.1} ns")
    }
}

/// A rate per second, with thousands separators.
pub(crate) fn per_sec(value: f64) -> String {
    let mut digits = format!("{value:.0}");
    let mut i = digits.len();
    while i > 3 {
        i -= 3;
        digits.insert(i, ',');
    }
    format!("{digits}/s")
}

/// Milliseconds, one decimal.
pub(crate) fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}
