//! The `orders_api` example as a process under test: started on a free port, driven with
//! steady traffic over HTTP (round robin over each group's instances), and its breakers read
//! from `/metrics`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;

use crate::proxy::{Fault, FaultProxy};
use crate::redis::RedisServer;

/// An HTTP/1.1 client for the instances, with room for the traffic's connections.
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A client that keeps up to 64 idle connections per instance.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http()
}

/// One `orders_api` process, killed when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `orders_api --listen 127.0.0.1:0 ARGS`, once it says where it listens (its standard
/// error is dropped).
pub fn spawn(args: &[&str]) -> Server {
    let mut child = Command::new(crate::example::binary("orders_api"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start orders_api");
    let base = listening(&mut child);
    Server { child, base }
}

/// Reads the first line `orders_api` writes to its standard output: the base URL it
/// listens on.
pub fn listening(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the listening line");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned()
}

/// Groups of instances side by side, each group on a redis-server of its own behind a
/// fault proxy: they share nothing but the outage.
#[derive(Debug)]
pub struct Deployments {
    /// By group, each instance (dropped before the proxies and the servers).
    pub instances: Vec<Vec<Server>>,
    proxies: Vec<FaultProxy>,
    _servers: Vec<RedisServer>,
}

impl Deployments {
    /// `groups` groups of `instances` instances each: `start(group, redis_url)` starts one,
    /// its store at the group's proxy.
    pub fn start(groups: usize, instances: usize, start: impl Fn(usize, &str) -> Server) -> Self {
        let servers: Vec<RedisServer> = (0..groups).map(|_| RedisServer::start()).collect();
        let proxies: Vec<FaultProxy> = servers
            .iter()
            .map(|s| FaultProxy::start(s.port()))
            .collect();
        let instances = proxies
            .iter()
            .enumerate()
            .map(|(group, proxy)| (0..instances).map(|_| start(group, &proxy.url())).collect())
            .collect();
        Self {
            instances,
            proxies,
            _servers: servers,
        }
    }

    /// By group, each instance's base URL.
    pub fn bases(&self) -> Vec<Vec<String>> {
        self.instances
            .iter()
            .map(|group| group.iter().map(|s| s.base.clone()).collect())
            .collect()
    }

    /// Every group's store refused from `start + normal` for `outage`, then let through
    /// again: when each of the two happened, from `start`.
    pub async fn outage(
        &self,
        start: Instant,
        normal: Duration,
        outage: Duration,
    ) -> (Duration, Duration) {
        tokio::time::sleep_until((start + normal).into()).await;
        for proxy in &self.proxies {
            proxy.set(Fault::Refuse);
        }
        let cut = start.elapsed();
        tokio::time::sleep_until((start + normal + outage).into()).await;
        for proxy in &self.proxies {
            proxy.set(Fault::Pass);
        }
        (cut, start.elapsed())
    }
}

/// One request of the traffic: to which group, as which customer (indices into what
/// [`Traffic::start`] was given), when it was sent (from the traffic's start), its status,
/// and when the server admitted it (Unix ms, from `x-admitted-at-ms`, which orders_api
/// writes under `--stamp-admissions`).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub group: usize,
    pub customer: usize,
    pub sent: Duration,
    pub status: u16,
    pub admitted_at_ms: Option<u64>,
}

/// `GET /orders` to groups of instances, each customer at its own steady rate (request `k`
/// at `k / rate` s after the start, as `x-customer-id`), round robin over the instances
/// of each group, every answer read to its end.
#[derive(Debug)]
pub struct Traffic {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    driver: JoinHandle<()>,
}

impl Traffic {
    /// Starts sending from `start` until [`stop`](Self::stop) or for `total`, whichever
    /// comes first; `groups` holds each group's base URLs, `customers` each customer's
    /// name and rate a second.
    pub fn start(
        client: &HttpClient,
        groups: Vec<Vec<String>>,
        customers: &[(&str, f64)],
        start: Instant,
        total: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let customers: Vec<(String, f64)> = customers
            .iter()
            .map(|(n, r)| ((*n).to_owned(), *r))
            .collect();
        let driver = {
            let (client, stop, samples) = (client.clone(), stop.clone(), samples.clone());
            tokio::spawn(async move {
                let mut sent = vec![vec![0u64; customers.len()]; groups.len()];
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                let mut tasks = Vec::new();
                while start.elapsed() < total && !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let elapsed = start.elapsed().min(total).as_secs_f64();
                    for (group, instances) in groups.iter().enumerate() {
                        for (customer, (name, rate)) in customers.iter().enumerate() {
                            let count = &mut sent[group][customer];
                            while *count < (elapsed * rate) as u64 {
                                let base = &instances[*count as usize % instances.len()];
                                *count += 1;
                                let request = http::Request::get(format!("{base}/orders"))
                                    .header("x-customer-id", name.as_str())
                                    .body(Empty::new())
                                    .expect("a request");
                                let (client, samples) = (client.clone(), samples.clone());
                                let sent = start.elapsed();
                                tasks.push(tokio::spawn(async move {
                                    let response =
                                        client.request(request).await.expect("an HTTP answer");
                                    let status = response.status().as_u16();
                                    let admitted_at_ms = response
                                        .headers()
                                        .get("x-admitted-at-ms")
                                        .and_then(|v| v.to_str().ok()?.parse().ok());
                                    let _ = response.into_body().collect().await;
                                    samples.lock().unwrap().push(Sample {
                                        group,
                                        customer,
                                        sent,
                                        status,
                                        admitted_at_ms,
                                    });
                                }));
                            }
                        }
                    }
                }
                for task in tasks {
                    task.await.expect("a request's task");
                }
            })
        };
        Self {
            stop,
            samples,
            driver,
        }
    }

    /// Stops sending, waits for every answer, and hands back every request, in the order
    /// they were answered.
    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.driver.await.expect("the traffic's driver");
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// The `orders` layer's breaker state as an instance's `/metrics` reports it (0 closed);
/// `None` without an answer.
pub async fn breaker_state(client: &HttpClient, base: &str) -> Option<f64> {
    let response = client
        .get(format!("{base}/metrics").parse().ok()?)
        .await
        .ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    String::from_utf8_lossy(&body)
        .lines()
        .find(|line| {
            line.starts_with("tollgate_breaker_state{") && line.contains("layer=\"orders\"")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Waits until the breaker of every instance of every group is closed, asking every 50
/// ms: how long after the call each one was first seen closed, by group and instance.
///
/// # Panics
///
/// When one is still open `within` after the call.
pub async fn breakers_closed(
    client: &HttpClient,
    groups: &[Vec<String>],
    within: Duration,
) -> Vec<Vec<Duration>> {
    let asked = Instant::now();
    let deadline = asked + within;
    let mut closed_after: Vec<Vec<Option<Duration>>> =
        groups.iter().map(|g| vec![None; g.len()]).collect();
    while closed_after.iter().flatten().any(Option::is_none) {
        for (g, group) in groups.iter().enumerate() {
            for (i, base) in group.iter().enumerate() {
                if closed_after[g][i].is_none() && breaker_state(client, base).await == Some(0.0) {
                    closed_after[g][i] = Some(asked.elapsed());
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every breaker closed within {within:?}: {closed_after:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    closed_after
        .into_iter()
        .map(|group| group.into_iter().flatten().collect())
        .collect()
}
