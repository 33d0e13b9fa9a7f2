//! The outage simulator (examples/simulate.rs), run as a user runs it: its defaults
//! reproduce the README's table of the running example, the other faults and the token
//! bucket tell the same story, its flags change the scenario, and bad flags exit with 2.
//! It runs the library's default breaker unless flags override it, so its recovery is what
//! a user gets: every group back on the store within about a second.
//!
//! The simulator runs on virtual time, so even a debug build simulates the 90 s of the
//! defaults in seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tollgate::store::Algorithm;
use tollgate_testkit::redis::RedisServer;

/// Within 10% of the expected rate (exactly 0 when 0 is expected).
const TOLERANCE: f64 = 0.10;
const KEYS: [&str; 7] = [
    "policy",
    "phase",
    "customer",
    "sent_per_sec",
    "admitted_per_sec",
    "refused_429",
    "refused_503",
];
/// On the recovery rows only: when the policy's last breaker closed after the store returned.
const CLOSED_AFTER: &str = "all_breakers_closed_after_ms";
/// Every instance is back on the store within this long of its return (the default
/// breaker's 1 s cap, plus a little).
const BACK_WITHIN_MS: f64 = 1_200.0;
const CUSTOMERS: [(&str, f64); 3] = [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)];
const ALL_POLICIES: [&str; 8] = [
    "open",
    "closed",
    "local-share",
    "static",
    "static-then-local-share",
    "local-share-no-divisor",
    "local-share-stale-divisor",
    "local-share-pinned",
];

/// Builds the example once, with this test's profile and features, and returns its path.
/// (`cargo test --test it simulate::` alone does not build examples.)
fn simulator() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut features = Vec::new();
        if cfg!(feature = "axum") {
            features.push("axum");
        }
        if cfg!(feature = "redis") {
            features.push("redis");
        }
        if cfg!(feature = "redis-tls") {
            features.push("redis-tls");
        }
        let mut command = Command::new(env!("CARGO"));
        command
            .args(["build", "--example", "simulate", "--message-format=json"])
            .args([
                "--manifest-path",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            ])
            .args(["--no-default-features", "--features", &features.join(",")]);
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let output = command.output().expect("run cargo build");
        assert!(
            output.status.success(),
            "cargo build --example simulate failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "simulate")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported no simulate executable")
    })
}

fn simulate(args: &[&str]) -> Output {
    Command::new(simulator())
        .args(args)
        .output()
        .expect("run the simulator")
}

/// Runs the simulator with `--json` and returns its rows, checking that stdout holds the
/// JSON array and nothing else, with exactly the documented keys.
fn rows(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let output = simulate(&all);
    assert!(
        output.status.success(),
        "simulate {all:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let value: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout of simulate {all:?} is not one JSON document ({e}):\n{stdout}")
    });
    let rows = value.as_array().expect("a JSON array").clone();
    for row in &rows {
        let object = row.as_object().expect("rows are objects");
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut expected = KEYS.to_vec();
        if row["phase"] == "recovery" {
            expected.push(CLOSED_AFTER);
            let closed = &row[CLOSED_AFTER];
            assert!(
                closed.is_null() || closed.is_f64() || closed.is_u64(),
                "{row}"
            );
        }
        expected.sort_unstable();
        assert_eq!(keys, expected, "keys of {row}");
        assert!(row["policy"].is_string() && row["phase"].is_string());
        assert!(row["customer"].is_string());
        assert!(row["sent_per_sec"].is_f64() || row["sent_per_sec"].is_u64());
        assert!(row["admitted_per_sec"].is_f64() || row["admitted_per_sec"].is_u64());
        assert!(row["refused_429"].is_u64() && row["refused_503"].is_u64());
    }
    rows
}

/// What one instance admits per second under a local share of `algorithm` over
/// `instances`, as the crate divides it.
fn share_per_sec(algorithm: Algorithm, instances: u64) -> f64 {
    match algorithm.divided_by(instances) {
        Algorithm::SlidingWindow { limit, window_ms } => limit as f64 * 1_000.0 / window_ms as f64,
        Algorithm::TokenBucket {
            rate, period_ms, ..
        } => rate as f64 * 1_000.0 / period_ms as f64,
        other => panic!("no rate known for {other:?}"),
    }
}

fn row<'a>(rows: &'a [Value], policy: &str, phase: &str, customer: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["policy"] == policy && r["phase"] == phase && r["customer"] == customer)
        .unwrap_or_else(|| panic!("no row for {policy}/{phase}/{customer}"))
}

/// When the last breaker of `policy`'s instances closed after the store returned.
fn closed_after_ms(rows: &[Value], policy: &str) -> f64 {
    let row = row(rows, policy, "recovery", CUSTOMERS[0].0);
    row[CLOSED_AFTER]
        .as_f64()
        .unwrap_or_else(|| panic!("{policy}: the breakers did not close within the phase: {row}"))
}

fn admitted(rows: &[Value], policy: &str, phase: &str, customer: &str) -> f64 {
    row(rows, policy, phase, customer)["admitted_per_sec"]
        .as_f64()
        .expect("a number")
}

fn assert_near(rows: &[Value], policy: &str, phase: &str, customer: &str, expected: f64) {
    let actual = admitted(rows, policy, phase, customer);
    let slack = (expected * TOLERANCE).max(0.0);
    assert!(
        (actual - expected).abs() <= slack + 1e-9,
        "{policy}, {phase}, {customer}: {actual}/s admitted, expected {expected}/s within {:.0}%",
        TOLERANCE * 100.0
    );
}

/// Normal and recovery phases: every customer gets min(what it sends, the limit).
fn assert_fair_outside_the_outage(rows: &[Value], policy: &str, limit: f64) {
    for phase in ["normal", "recovery"] {
        for (customer, sends) in CUSTOMERS {
            assert_near(rows, policy, phase, customer, sends.min(limit));
        }
    }
}

#[test]
fn the_defaults_reproduce_the_design_table() {
    let rows = rows(&[]);
    assert_eq!(rows.len(), ALL_POLICIES.len() * 3 * CUSTOMERS.len());
    for policy in ALL_POLICIES {
        for phase in ["normal", "outage", "recovery"] {
            for (customer, sends) in CUSTOMERS {
                let row = row(&rows, policy, phase, customer);
                assert_eq!(row["sent_per_sec"].as_f64(), Some(sends), "{row}");
                if policy != "closed" || phase == "normal" {
                    assert_eq!(row["refused_503"], 0, "{row}");
                }
            }
        }
        assert_fair_outside_the_outage(&rows, policy, 50.0);
    }

    // The running example, during the outage, with each instance's share as the crate
    // computes it (12.5/s when it keeps the rate exact, 12 when it rounds down): about
    // 4 x share for the local share, 8 x share with the stale divisor, 1 x share pinned.
    let share = share_per_sec(Algorithm::sliding_window(50, Duration::from_secs(1)), 4);
    let outage = |policy: &str, acme: f64, others_too: bool| {
        assert_near(&rows, policy, "outage", "acme", acme);
        let (globex, initech) = if others_too { (20.0, 5.0) } else { (0.0, 0.0) };
        assert_near(&rows, policy, "outage", "globex", globex);
        assert_near(&rows, policy, "outage", "initech", initech);
    };
    outage("open", 120.0, true);
    outage("closed", 0.0, false);
    outage("local-share", 4.0 * share, true);
    outage("local-share-no-divisor", 120.0, true);
    outage("local-share-stale-divisor", 8.0 * share, true);
    outage("local-share-pinned", share, true);
    // A per-second limit's cached refusals expire within the second: fail static then
    // passes everything, and the chain falls through to its local share.
    outage("static", 120.0, true);
    outage("static-then-local-share", 4.0 * share, true);

    // On the library's default breaker, every instance is back on the store within about
    // a second of its return, so fail closed refuses only that second's share of requests.
    for policy in ALL_POLICIES {
        let closed = closed_after_ms(&rows, policy);
        assert!(
            closed <= BACK_WITHIN_MS,
            "{policy}: closed after {closed} ms"
        );
    }
    let needless: u64 = CUSTOMERS
        .iter()
        .map(|(customer, _)| {
            row(&rows, "closed", "recovery", customer)["refused_503"]
                .as_u64()
                .unwrap()
        })
        .sum();
    let per_second: f64 = CUSTOMERS.iter().map(|(_, sends)| sends).sum();
    assert!(
        needless as f64 <= per_second * BACK_WITHIN_MS / 1_000.0,
        "{needless} needless 503s after the store returned"
    );

    // Fail closed answers 503 (never 500) to every request of the outage.
    for (customer, sends) in CUSTOMERS {
        let row = row(&rows, "closed", "outage", customer);
        assert_eq!(row["refused_503"].as_f64(), Some(sends * 30.0), "{row}");
        assert_eq!(row["refused_429"], 0, "{row}");
    }
}

#[test]
fn back_on_the_store_within_a_second_of_a_10_minute_outage() {
    let rows = rows(&[
        "--outage-secs",
        "600",
        "--normal-secs",
        "5",
        "--recovery-secs",
        "5",
        "--policy",
        "open",
        "--policy",
        "closed",
        "--policy",
        "local-share",
    ]);
    for policy in ["open", "closed", "local-share"] {
        let closed = closed_after_ms(&rows, policy);
        assert!(
            closed <= BACK_WITHIN_MS,
            "{policy}: closed after {closed} ms"
        );
    }
}

#[test]
fn the_breaker_flags_override_the_library_defaults() {
    // The old defaults (1 s growing to 30 s): after 30 s of failed probes the instances
    // stay on their failure policy for seconds after the store returns.
    let slow = rows(&[
        "--breaker-base-open-ms",
        "1000",
        "--breaker-max-open-ms",
        "30000",
        "--policy",
        "closed",
    ]);
    let closed = closed_after_ms(&slow, "closed");
    assert!(closed > 2_000.0, "closed after {closed} ms");
    let needless = row(&slow, "closed", "recovery", "acme")["refused_503"]
        .as_u64()
        .unwrap();
    assert!(needless > 200, "{needless} 503s after the store returned");

    let output = simulate(&["--policy", "closed", "--outage-secs", "2"]);
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(
        text.contains("the breaker (the library's default)")
            && text.contains("250-500 ms at first")
            && text.contains("at most 1000 ms"),
        "{text}"
    );
    assert!(text.contains("all breakers closed after"), "{text}");
    let output = simulate(&[
        "--policy",
        "closed",
        "--outage-secs",
        "2",
        "--breaker-max-open-ms",
        "2000",
    ]);
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(
        text.contains("the breaker (set by the flags)") && text.contains("at most 2000 ms"),
        "{text}"
    );
}

#[test]
fn a_blackholed_or_slow_store_gives_the_same_outage() {
    for fault in ["blackhole", "slow"] {
        let rows = rows(&[
            "--fault",
            fault,
            "--policy",
            "open",
            "--policy",
            "closed",
            "--policy",
            "local-share",
        ]);
        assert_eq!(rows.len(), 3 * 3 * CUSTOMERS.len(), "{fault}");
        for policy in ["open", "closed", "local-share"] {
            assert_fair_outside_the_outage(&rows, policy, 50.0);
        }
        assert_near(&rows, "open", "outage", "acme", 120.0);
        assert_near(&rows, "closed", "outage", "acme", 0.0);
        assert_near(&rows, "closed", "outage", "globex", 0.0);
        let share = share_per_sec(Algorithm::sliding_window(50, Duration::from_secs(1)), 4);
        assert_near(&rows, "local-share", "outage", "acme", 4.0 * share);
        assert_near(&rows, "local-share", "outage", "globex", 20.0);
        assert_near(&rows, "local-share", "outage", "initech", 5.0);
    }
}

#[test]
fn the_token_bucket_shares_the_same_way() {
    let rows = rows(&[
        "--algorithm",
        "token-bucket",
        "--burst",
        "50",
        "--policy",
        "local-share",
        "--policy",
        "local-share-pinned",
    ]);
    for policy in ["local-share", "local-share-pinned"] {
        assert_fair_outside_the_outage(&rows, policy, 50.0);
    }
    let share = share_per_sec(Algorithm::token_bucket(50, Duration::from_secs(1), 50), 4);
    assert_near(&rows, "local-share", "outage", "acme", 4.0 * share);
    assert_near(&rows, "local-share-pinned", "outage", "acme", share);
    assert_near(&rows, "local-share-pinned", "outage", "globex", 20.0);
}

#[test]
fn flags_change_the_scenario_and_draw_a_chart() {
    let chart = std::env::temp_dir().join(format!("tollgate-simulate-{}.svg", std::process::id()));
    let rows = rows(&[
        "--limit",
        "40",
        "--window-secs",
        "2",
        "--instances",
        "2",
        "--traffic",
        "big=60",
        "--traffic",
        "small=2",
        "--normal-secs",
        "10",
        "--outage-secs",
        "20",
        "--recovery-secs",
        "10",
        "--policy",
        "local-share",
        "--policy=closed",
        "--chart",
        chart.to_str().expect("a UTF-8 temp path"),
    ]);
    // 2 policies x 3 phases x 2 customers, nobody else.
    assert_eq!(rows.len(), 12);
    assert!(
        rows.iter()
            .all(|r| r["customer"] == "big" || r["customer"] == "small")
    );
    // 40 per 2 s is 20/s, 10/s for each of the 2 instances' shares.
    for policy in ["local-share", "closed"] {
        for phase in ["normal", "recovery"] {
            assert_near(&rows, policy, phase, "big", 20.0);
            assert_near(&rows, policy, phase, "small", 2.0);
        }
    }
    let share = share_per_sec(Algorithm::sliding_window(40, Duration::from_secs(2)), 2);
    assert_near(&rows, "local-share", "outage", "big", 2.0 * share);
    assert_near(&rows, "local-share", "outage", "small", 2.0);
    assert_near(&rows, "closed", "outage", "big", 0.0);
    let row = row(&rows, "closed", "outage", "small");
    assert_eq!(row["refused_503"], 40, "{row}");

    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    let _ = std::fs::remove_file(&chart);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // One panel per policy, one line per customer in each.
    assert!(
        svg.contains(">local-share<") && svg.contains(">closed<"),
        "{svg}"
    );
    assert_eq!(svg.matches("<polyline").count(), 2 * 2);
}

/// `--redis`: the same scenario in real time on a real redis-server, through the fault
/// proxy the simulator starts itself; short phases, so looser bounds than the virtual runs.
#[test]
fn a_real_redis_behind_the_fault_proxy() {
    let server = RedisServer::start();
    let rows = rows(&[
        "--redis",
        &server.url(),
        "--normal-secs",
        "2",
        "--outage-secs",
        "5",
        "--recovery-secs",
        "3",
        "--policy",
        "local-share",
        "--policy",
        "closed",
    ]);
    assert_eq!(rows.len(), 2 * 3 * CUSTOMERS.len());
    for policy in ["local-share", "closed"] {
        for phase in ["normal", "recovery"] {
            // A cold window at the start of a short phase admits a burst: up to a window's
            // quota more than the limit.
            let acme = admitted(&rows, policy, phase, "acme");
            assert!(
                (40.0..=80.0).contains(&acme),
                "{policy}, {phase}: acme {acme}/s"
            );
        }
        assert_near(&rows, policy, "normal", "globex", 20.0);
        assert_near(&rows, policy, "normal", "initech", 5.0);
    }
    for (customer, _) in CUSTOMERS {
        assert_eq!(
            admitted(&rows, "closed", "outage", customer),
            0.0,
            "{customer}"
        );
    }
    // Over a 5 s outage, the cold local counters' first window (a whole window's quota per
    // instance, at once) is not amortized: allow it on top of the share's rate.
    let per_second = Algorithm::sliding_window(50, Duration::from_secs(1));
    let share = 4.0 * share_per_sec(per_second, 4);
    let burst = 4.0 * per_second.divided_by(4).quota() as f64 / 5.0;
    let acme = admitted(&rows, "local-share", "outage", "acme");
    assert!(
        (share * 0.8..=(share + burst) * 1.1).contains(&acme),
        "local-share, outage: acme {acme}/s, expected {share}/s plus at most {burst}/s"
    );
    assert_near(&rows, "local-share", "outage", "globex", 20.0);
    assert_near(&rows, "local-share", "outage", "initech", 5.0);
}

#[test]
fn the_table_explains_itself() {
    let output = simulate(&[
        "--policy",
        "local-share",
        "--normal-secs",
        "2",
        "--outage-secs",
        "2",
        "--recovery-secs",
        "2",
    ]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    for phase in ["## normal", "## outage", "## recovery"] {
        assert!(text.contains(phase), "{text}");
    }
    assert!(text.contains("whole-phase averages"), "{text}");
    assert!(text.contains("| local-share "), "{text}");
}

#[test]
fn bad_flags_exit_with_2_and_say_why() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "unknown flag --bogus"),
        (&["stray"], "unexpected argument"),
        (&["--limit"], "--limit needs a value"),
        (&["--limit", "many"], "--limit"),
        (&["--limit", "0"], "--limit"),
        (&["--instances", "0"], "--instances"),
        (&["--window-secs", "-1"], "--window-secs"),
        (&["--outage-secs", "0"], "--outage-secs"),
        (&["--policy", "fail-sideways"], "--policy"),
        (&["--fault", "fire"], "--fault"),
        (&["--algorithm", "leaky"], "--algorithm"),
        (&["--burst", "10"], "--burst needs --algorithm token-bucket"),
        (&["--traffic", "acme"], "--traffic"),
        (&["--traffic", "acme=-3"], "--traffic"),
        (&["--traffic", "a b=3"], "--traffic"),
        (&["--traffic", "a=1", "--traffic", "a=2"], "twice"),
        (&["--json=yes"], "--json takes no value"),
        (
            &["--breaker-max-open-ms", "100"],
            "--breaker-base-open-ms (500 ms)",
        ),
        (&["--breaker-base-open-ms", "0"], "--breaker-base-open-ms"),
        (&["--redis", "redis://10.1.2.3:6379/"], "--redis"),
    ];
    for (args, says) in cases {
        let output = simulate(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "simulate {args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "simulate {args:?} says {stderr:?}, not {says:?}"
        );
        assert!(
            output.stdout.is_empty(),
            "simulate {args:?} printed to stdout"
        );
    }
}

#[test]
fn help_prints_the_flags() {
    let output = simulate(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let usage = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--limit",
        "--window-secs",
        "--instances",
        "--outage-secs",
        "--traffic",
        "--algorithm",
        "--burst",
        "--policy",
        "--fault",
        "--json",
        "--chart",
        "--redis",
        "--breaker-base-open-ms",
        "--breaker-max-open-ms",
    ] {
        assert!(usage.contains(flag), "--help does not mention {flag}");
    }
}
