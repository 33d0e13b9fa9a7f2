//! End to end: four `orders_api` processes against one real redis-server behind the fault
//! proxy, the running example's traffic over HTTP, the store cut and restored. Local share
//! (with the instance count from the Redis registry) and fail closed, side by side.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::proxy::{Fault, FaultProxy};
use support::redis::RedisServer;

const INSTANCES: usize = 4;
const CUSTOMERS: [(&str, f64); 3] = [("acme", 120.0), ("globex", 20.0), ("initech", 5.0)];
const NORMAL: Duration = Duration::from_secs(3);
const OUTAGE: Duration = Duration::from_secs(4);
const RECOVERY: Duration = Duration::from_secs(8);
/// Skipped at the start of the recovery: with the default breaker (open 1 s, growing up to
/// 4 s after the probes of a 4 s outage fail) the next probe can come 4 s after the store
/// does, then the counters warm up.
const RECOVERY_SETTLE: Duration = Duration::from_secs(5);
/// Skipped at the start of each phase: registry heartbeats and cold counters (see
/// tests/outage.rs) settle first.
const WARM_UP: Duration = Duration::from_millis(1_500);
const TOLERANCE: f64 = 0.15;

/// The example binary, built by `cargo test` next to this test's own binary.
fn orders_api() -> PathBuf {
    let mut dir = std::env::current_exe().expect("test binary path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("examples").join("orders_api");
    assert!(
        path.exists(),
        "{} is missing: run through cargo test, which builds examples",
        path.display()
    );
    path
}

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(redis: &str, policy: &str) -> Server {
    let mut child = Command::new(orders_api())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--redis",
            redis,
            "--on-store-failure",
            policy,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start orders_api");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the listening line");
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    Server { child, base }
}

struct Sample {
    group: usize,
    customer: usize,
    sent: Duration,
    status: u16,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_through_an_outage() {
    let policies = ["local-share", "closed"];
    // One Redis and one proxy per policy: the two groups share nothing but the fault.
    let servers: Vec<RedisServer> = policies.iter().map(|_| RedisServer::start()).collect();
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .map(|s| FaultProxy::start(s.port()))
        .collect();
    let groups: Vec<Vec<Server>> = policies
        .iter()
        .zip(&proxies)
        .map(|(policy, proxy)| {
            (0..INSTANCES)
                .map(|_| start(&proxy.url(), policy))
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
    let samples = Arc::new(Mutex::new(Vec::new()));

    // Let the instances find each other in the registry (one heartbeat a second).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let start = Instant::now();
    let driver = {
        let (client, bases, samples) = (client.clone(), bases.clone(), samples.clone());
        tokio::spawn(async move {
            let total = NORMAL + OUTAGE + RECOVERY;
            let mut sent = vec![[0u64; 3]; bases.len()];
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            let mut tasks = Vec::new();
            while start.elapsed() < total {
                tick.tick().await;
                let elapsed = start.elapsed().min(total).as_secs_f64();
                for (group, instances) in bases.iter().enumerate() {
                    for (customer, (name, rate)) in CUSTOMERS.iter().enumerate() {
                        while sent[group][customer] < (elapsed * rate) as u64 {
                            let base = &instances[sent[group][customer] as usize % INSTANCES];
                            sent[group][customer] += 1;
                            let request = hyper::Request::get(format!("{base}/orders"))
                                .header("x-customer-id", *name)
                                .body(Empty::new())
                                .unwrap();
                            let (client, samples) = (client.clone(), samples.clone());
                            let sent_at = start.elapsed();
                            tasks.push(tokio::spawn(async move {
                                let response =
                                    client.request(request).await.expect("an HTTP answer");
                                let status = response.status().as_u16();
                                let _ = response.into_body().collect().await;
                                samples.lock().unwrap().push(Sample {
                                    group,
                                    customer,
                                    sent: sent_at,
                                    status,
                                });
                            }));
                        }
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
    driver.await.unwrap();
    let end = start.elapsed();

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    for sample in &samples {
        assert!(
            [200, 429, 503].contains(&sample.status),
            "answered {}",
            sample.status
        );
    }
    let rate = |group: usize, customer: usize, from: Duration, to: Duration| {
        let admitted = samples
            .iter()
            .filter(|s| {
                s.group == group
                    && s.customer == customer
                    && s.sent >= from
                    && s.sent < to
                    && s.status == 200
            })
            .count();
        admitted as f64 / (to - from).as_secs_f64()
    };
    let near = |what: String, actual: f64, expected: f64| {
        let slack = (expected * TOLERANCE).max(0.5);
        assert!(
            (actual - expected).abs() <= slack,
            "{what}: {actual:.1}/s, expected {expected:.1}/s"
        );
    };
    for (group, policy) in policies.iter().enumerate() {
        for (customer, (name, sends)) in CUSTOMERS.iter().enumerate() {
            let fair = sends.min(50.0);
            near(
                format!("{policy} {name} normal"),
                rate(group, customer, WARM_UP, cut),
                fair,
            );
            let during = rate(group, customer, cut + WARM_UP, restored);
            let expected = match *policy {
                // 50 shared by the 4 instances the registry counted: 12 each.
                "local-share" => sends.min(48.0),
                _ => 0.0,
            };
            near(format!("{policy} {name} outage"), during, expected);
            near(
                format!("{policy} {name} recovery"),
                rate(group, customer, restored + RECOVERY_SETTLE, end),
                fair,
            );
        }
    }

    // The fallback counter in /metrics: every instance counted its fallbacks.
    for (group, policy) in policies.iter().enumerate() {
        let label = policy.replace('-', "_");
        let response = client
            .get(format!("{}/metrics", bases[group][0]).parse().unwrap())
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        let fallbacks: f64 = text
            .lines()
            .filter(|line| {
                line.starts_with("tollgate_fallbacks_total{")
                    && line.contains("layer=\"orders\"")
                    && line.contains(&format!("policy=\"{label}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(
            fallbacks > 0.0,
            "{policy}: no fallback counted in /metrics:\n{text}"
        );
    }
}
