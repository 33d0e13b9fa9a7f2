//! The edges of an outage over HTTP: four orders_api processes on one real redis-server
//! behind the fault proxy (the instance count and places from the Redis registry), acme
//! at 120 requests a second and umbrella at 90, round robin, the store refused for 6 s.
//! The worst second of each caller's admissions, by when each instance admitted them,
//! around the outage's start and around the store's return stays within 10% of the limit
//! of 50, and the outage's steady rate near 50.
//!
//! The worst second is a timing measurement. It is taken by admission time (orders_api's
//! `--stamp-admissions`), not by send time: the client's sends and the instances'
//! decisions drift apart on 2 cores, so a second of sends can hold the admissions of more
//! than a second of decisions (with the rest of the suite running beside it, up to 74;
//! on a quiet machine, once in a while, 56). Both are printed. The tests are still
//! ignored in the parallel run, and scripts/test runs them on their own, one after the
//! other.

use std::time::{Duration, Instant};

use tollgate_testkit::orders_api::{Deployments, Traffic, breakers_closed};
use tollgate_testkit::rates::{rate_between, worst_window};
use tollgate_testkit::temp_file::TempFile;

use crate::orders_api_e2e::start_with;

const INSTANCES: usize = 4;
/// Each caller over the limit, at its rate a second.
const CALLERS: [(&str, f64); 2] = [("acme", 120.0), ("umbrella", 90.0)];
const LIMIT: usize = 50;
const NORMAL: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(6);
/// Measured once every breaker has closed again.
const RECOVERY: Duration = Duration::from_secs(4);
const BREAKERS_CLOSE_WITHIN: Duration = Duration::from_secs(4);
/// At most this many admitted in any second around an edge: the limit and 10%.
const WORST_SECOND: usize = 55;

const TOKEN_BUCKET: &str = r#"
[[orders.policies]]
name = "per-second"
algorithm = "token_bucket"
rate = 50
period = "1s"
burst = 50
"#;

/// One deployment under test: its failure policy and further flags.
struct Case {
    name: &'static str,
    policy: &'static str,
    extra: Vec<String>,
}

struct Measured {
    name: String,
    /// The worst second around each edge by admission time, and by send time.
    start: usize,
    back: usize,
    start_by_send: usize,
    back_by_send: usize,
    outage_rate: f64,
}

/// Runs each case on its own redis-server and proxy, side by side, through one outage.
async fn run(cases: Vec<Case>) -> Vec<Measured> {
    let deployments = Deployments::start(cases.len(), INSTANCES, |group, redis| {
        let mut extra: Vec<&str> = cases[group].extra.iter().map(String::as_str).collect();
        extra.push("--stamp-admissions");
        start_with(redis, cases[group].policy, &extra)
    });
    let bases = deployments.bases();
    let client = tollgate_testkit::orders_api::client();
    // Two heartbeats: every instance knows the others and its place among them.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let start = Instant::now();
    let start_unix_ms = tollgate_testkit::rates::unix_millis();
    let traffic = Traffic::start(&client, bases.clone(), &CALLERS, start, Duration::MAX);
    let (cut, restored) = deployments.outage(start, NORMAL, OUTAGE).await;
    breakers_closed(&client, &bases, BREAKERS_CLOSE_WITHIN).await;
    let back = start.elapsed();
    tokio::time::sleep(RECOVERY).await;
    let samples = traffic.stop().await;

    let second = Duration::from_secs(1);
    let mut measured = Vec::new();
    for (group, case) in cases.iter().enumerate() {
        for (customer, (caller, _)) in CALLERS.iter().enumerate() {
            let admitted: Vec<_> = samples
                .iter()
                .filter(|s| s.group == group && s.customer == customer)
                .inspect(|s| assert!([200, 429, 503].contains(&s.status), "answered {}", s.status))
                .filter(|s| s.status == 200)
                .collect();
            let mut by_send: Vec<Duration> = admitted.iter().map(|s| s.sent).collect();
            by_send.sort();
            // When each instance admitted it, on the same clock as the sends (the
            // processes share this machine's).
            let mut by_admission: Vec<Duration> = admitted
                .iter()
                .map(|s| {
                    let at = s
                        .admitted_at_ms
                        .expect("x-admitted-at-ms on an admitted answer");
                    Duration::from_millis(at.saturating_sub(start_unix_ms))
                })
                .collect();
            by_admission.sort();
            let edges = |times: &[Duration]| {
                (
                    worst_window(times, second, cut - second, cut + 2 * second),
                    worst_window(times, second, restored - second, back + 2 * second),
                )
            };
            let (start, back) = edges(&by_admission);
            let (start_by_send, back_by_send) = edges(&by_send);
            measured.push(Measured {
                name: format!("{}, {caller}", case.name),
                start,
                back,
                start_by_send,
                back_by_send,
                outage_rate: rate_between(&by_admission, cut + OUTAGE / 2, restored),
            });
        }
    }
    measured
}

fn check(measured: &[Measured]) {
    for m in measured {
        println!(
            "{}: worst second {} at the outage's start, {} at the store's return (by send \
             time {} and {}); {:.1}/s in the outage",
            m.name, m.start, m.back, m.start_by_send, m.back_by_send, m.outage_rate
        );
    }
    for m in measured {
        assert!(
            m.start <= WORST_SECOND && m.back <= WORST_SECOND,
            "{}: {} and {} admitted in a second around the edges, the limit is {LIMIT}",
            m.name,
            m.start,
            m.back
        );
        assert!(
            (m.outage_rate - LIMIT as f64).abs() <= LIMIT as f64 * 0.1,
            "{}: {:.1}/s during the outage",
            m.name,
            m.outage_rate
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worst-second measurement of 4 processes on a 2-core machine: scripts/test runs it alone, after the parallel run"]
async fn the_sliding_window_and_the_static_chain_hold_the_limit_at_both_edges() {
    let measured = run(vec![
        Case {
            name: "local share",
            policy: "local-share",
            extra: vec![],
        },
        Case {
            name: "fail static, then local share",
            policy: "static-then-local-share",
            extra: vec![],
        },
    ])
    .await;
    check(&measured);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worst-second measurement of 4 processes on a 2-core machine: scripts/test runs it alone, after the parallel run"]
async fn the_token_bucket_and_leases_hold_the_limit_at_both_edges() {
    let file = TempFile::write("edges-token-bucket", TOKEN_BUCKET);
    let config = file.path().to_string_lossy().into_owned();
    let measured = run(vec![
        Case {
            name: "token bucket, local share",
            policy: "local-share",
            extra: vec!["--config".into(), config],
        },
        Case {
            name: "leases, local share",
            policy: "local-share",
            extra: vec!["--lease-threshold".into(), "20".into()],
        },
    ])
    .await;
    check(&measured);
}
