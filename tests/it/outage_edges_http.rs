//! The edges of an outage over HTTP: four orders_api processes on one real redis-server
//! behind the fault proxy (the instance count and places from the Redis registry), acme
//! at 120 requests a second round robin, the store refused for 6 s. The worst second of
//! acme's admissions, by send time, around the outage's start and around the store's
//! return stays within 10% of the limit of 50, and the outage's steady rate near 50.
//!
//! The worst second is a timing measurement: with the rest of the suite running beside
//! it (other tests start processes of their own) the client's sends and the instances'
//! decisions drift apart on 2 cores, and a second of sends held up to 74 admissions. So
//! these tests are ignored in the parallel run and scripts/test runs them on their own,
//! one after the other.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::redis::RedisServer;

use crate::orders_api_e2e::{Server, breaker_state, start_with};
use crate::outage_edges::worst_window;

const INSTANCES: usize = 4;
const RATE: f64 = 120.0;
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
    name: &'static str,
    start: usize,
    back: usize,
    outage_rate: f64,
}

/// Runs each case on its own redis-server and proxy, side by side, through one outage.
async fn run(cases: Vec<Case>) -> Vec<Measured> {
    let servers: Vec<RedisServer> = cases.iter().map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let groups: Vec<Vec<Server>> = cases
        .iter()
        .zip(&proxies)
        .map(|(case, proxy)| {
            let extra: Vec<&str> = case.extra.iter().map(String::as_str).collect();
            (0..INSTANCES)
                .map(|_| start_with(&proxy.url(), case.policy, &extra))
                .collect()
        })
        .collect();
    let bases: Arc<Vec<Vec<String>>> = Arc::new(
        groups
            .iter()
            .map(|g| g.iter().map(|s| s.base.clone()).collect())
            .collect(),
    );
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    // (group, sent, admitted)
    let samples: Arc<Mutex<Vec<(usize, Duration, bool)>>> = Arc::default();
    // Two heartbeats: every instance knows the others and its place among them.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let start = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = {
        let (client, bases, samples, stop) =
            (client.clone(), bases.clone(), samples.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = vec![0u64; bases.len()];
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut tasks = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let elapsed = start.elapsed().as_secs_f64();
                for (group, instances) in bases.iter().enumerate() {
                    while sent[group] < (elapsed * RATE) as u64 {
                        let base = &instances[sent[group] as usize % INSTANCES];
                        sent[group] += 1;
                        let request = hyper::Request::get(format!("{base}/orders"))
                            .header("x-customer-id", "acme")
                            .body(Empty::new())
                            .unwrap();
                        let (client, samples) = (client.clone(), samples.clone());
                        let sent_at = start.elapsed();
                        tasks.push(tokio::spawn(async move {
                            let response = client.request(request).await.expect("an HTTP answer");
                            let status = response.status().as_u16();
                            let _ = response.into_body().collect().await;
                            assert!([200, 429, 503].contains(&status), "answered {status}");
                            samples
                                .lock()
                                .unwrap()
                                .push((group, sent_at, status == 200));
                        }));
                    }
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };
    tokio::time::sleep_until((start + NORMAL).into()).await;
    for proxy in &proxies {
        proxy.set(Fault::Refuse);
    }
    let cut = start.elapsed();
    tokio::time::sleep_until((start + NORMAL + OUTAGE).into()).await;
    for proxy in &proxies {
        proxy.set(Fault::Pass);
    }
    let restored = start.elapsed();
    let deadline = Instant::now() + BREAKERS_CLOSE_WITHIN;
    for group in bases.iter() {
        for base in group {
            while breaker_state(&client, base).await != Some(0.0) {
                assert!(
                    Instant::now() < deadline,
                    "a breaker stayed open {BREAKERS_CLOSE_WITHIN:?} after the store returned"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let back = start.elapsed();
    tokio::time::sleep(RECOVERY).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    driver.await.unwrap();

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let second = Duration::from_secs(1);
    cases
        .iter()
        .enumerate()
        .map(|(group, case)| {
            let mut admitted: Vec<Duration> = samples
                .iter()
                .filter(|(g, _, admitted)| *g == group && *admitted)
                .map(|(_, sent, _)| *sent)
                .collect();
            admitted.sort();
            let steady_from = cut + OUTAGE / 2;
            let steady = admitted
                .iter()
                .filter(|t| **t >= steady_from && **t < restored)
                .count() as f64
                / (restored - steady_from).as_secs_f64();
            Measured {
                name: case.name,
                start: worst_window(&admitted, second, cut - second, cut + 2 * second),
                back: worst_window(&admitted, second, restored - second, back + 2 * second),
                outage_rate: steady,
            }
        })
        .collect()
}

fn check(measured: &[Measured]) {
    for m in measured {
        println!(
            "{}: worst second {} at the outage's start, {} at the store's return; {:.1}/s in the outage",
            m.name, m.start, m.back, m.outage_rate
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
    let dir = std::env::temp_dir().join(format!("tollgate-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("token_bucket.toml");
    std::fs::write(&config, TOKEN_BUCKET).unwrap();
    let config = config.to_string_lossy().into_owned();
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
