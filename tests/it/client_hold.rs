//! `HoldBackLayer` against real tollgate servers: the orders_api example over HTTP (hyper's
//! client) and the grpc_health example over gRPC (a tonic channel). Clients hammer a
//! limited route; the servers' answers are checked: few refusals per window, and no call
//! sent while the server had said to wait.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use headers::HeaderMapExt;
use http::HeaderMap;
use tollgate::client::{HoldBackLayer, NotSent};
use tollgate::headers::RateLimitHeader;
use tower::{Layer, Service, ServiceExt};

#[cfg(not(all(feature = "axum", feature = "redis", feature = "serde")))]
#[path = "skipped/orders_api.rs"]
mod skipped;

/// How long each client hammers.
const HAMMER: Duration = Duration::from_millis(3_500);
/// Concurrent callers: at most this many calls are in flight when a hold starts.
const CALLERS: usize = 4;
/// Slack for the time between the layer reading an answer and the test reading it, on a
/// busy machine. A call sent just after the test read an answer may have passed the layer
/// (which checks, then sends) just before the layer read it, if its thread was preempted in
/// between; a hold, which starts when the layer reads the answer, ends up to the time the
/// test took to read it (tonic decodes the response in between) before the test's reading
/// says. Without the layer's holds, hundreds of calls a second fall between the two.
const SLACK_BEFORE: Duration = Duration::from_millis(50);
const SLACK_AFTER: Duration = Duration::from_millis(200);

struct Example {
    child: Child,
    /// What the example printed after `prefix` on its first line.
    addr: String,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(name: &str, args: &[&str], prefix: &str) -> Example {
    let mut child = Command::new(tollgate_testkit::example::binary(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the listening line");
    let addr = line
        .trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line of {name}: {line:?}"))
        .to_owned();
    Example { child, addr }
}

/// When each call left the client (below the hold layer), and each answer that said to
/// wait: when it was read and for how long.
#[derive(Clone, Default)]
struct Log {
    sent: Arc<Mutex<Vec<Instant>>>,
    waits: Arc<Mutex<Vec<(Instant, Duration)>>>,
}

impl Log {
    fn sent(&self) {
        self.sent.lock().unwrap().push(Instant::now());
    }

    /// Records what `headers` say, as the layer reads them.
    fn answered(&self, refused: bool, headers: &HeaderMap) {
        let mut wait = headers
            .typed_get::<RateLimitHeader>()
            .and_then(|state| state.exhausted_for())
            .unwrap_or_default();
        // Both servers write Retry-After in whole seconds.
        if refused
            && let Some(secs) = headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            wait = wait.max(Duration::from_secs(secs));
        }
        if let Some(ms) = headers
            .get("grpc-retry-pushback-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok())
        {
            wait = wait.max(Duration::from_millis(ms));
        }
        if !wait.is_zero() {
            self.waits.lock().unwrap().push((Instant::now(), wait));
        }
    }

    /// Calls sent while an answer read before them had said to wait.
    fn sent_while_told_to_wait(&self) -> Vec<Duration> {
        let sent = self.sent.lock().unwrap();
        let waits = self.waits.lock().unwrap();
        sent.iter()
            .filter_map(|at| {
                waits.iter().find_map(|(read, wait)| {
                    let since = at.checked_duration_since(*read + SLACK_BEFORE)?;
                    (since + SLACK_BEFORE + SLACK_AFTER < *wait).then_some(since)
                })
            })
            .collect()
    }
}

/// The most refusals in any one second of the run, from the refusals' times.
fn most_in_a_second(times: &[Instant]) -> usize {
    times
        .iter()
        .map(|start| {
            times
                .iter()
                .filter(|t| {
                    t.checked_duration_since(*start)
                        .is_some_and(|d| d < Duration::from_secs(1))
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Every call in flight when a hold ends may be refused, if the server's window has not
/// freed a unit yet; that happens about once a second, and each refusal holds the rest.
/// (Without holds: over 600 refusals in a second.)
fn assert_few_refusals(refused: &[Instant]) {
    let seconds = HAMMER.as_secs() as usize + 1;
    assert!(
        refused.len() <= CALLERS * seconds,
        "{} refusals in {HAMMER:?}",
        refused.len()
    );
    assert!(
        most_in_a_second(refused) <= 2 * CALLERS,
        "{} refusals in one second",
        most_in_a_second(refused)
    );
}

#[cfg(all(feature = "axum", feature = "redis", feature = "serde"))]
mod http_orders {
    use super::*;

    use http::StatusCode;
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    const LIMIT: u64 = 10;

    fn orders_api() -> Example {
        let limit = LIMIT.to_string();
        start(
            "orders_api",
            &[
                "--listen",
                "127.0.0.1:0",
                "--limit",
                &limit,
                "--window-secs",
                "1",
            ],
            "listening on ",
        )
    }

    fn get(base: &str, customer: &str) -> http::Request<Empty<Bytes>> {
        http::Request::get(format!("{base}/orders"))
            .header("x-customer-id", customer)
            .body(Empty::new())
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hammering_hyper_client_sends_nothing_while_told_to_wait() {
        let server = orders_api();
        let hyper = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let log = Log::default();
        let inner = tower::service_fn({
            let log = log.clone();
            move |request| {
                log.sent();
                hyper.request(request)
            }
        });
        let layer = HoldBackLayer::new().name("orders");
        let client = layer.layer(inner);

        let started = Instant::now();
        let tasks: Vec<_> = (0..CALLERS)
            .map(|_| {
                let client = client.clone();
                let log = log.clone();
                let base = server.addr.clone();
                tokio::spawn(async move {
                    let (mut allowed, mut refused, mut held) = (0, Vec::new(), 0);
                    while started.elapsed() < HAMMER {
                        match client.clone().oneshot(get(&base, "acme")).await {
                            Ok(response) => {
                                let is_refused = response.status() == StatusCode::TOO_MANY_REQUESTS;
                                log.answered(is_refused, response.headers());
                                if is_refused {
                                    refused.push(Instant::now());
                                } else {
                                    assert_eq!(response.status(), StatusCode::OK);
                                    allowed += 1;
                                }
                            }
                            Err(e) if e.is::<NotSent>() => {
                                held += 1;
                                // A caller that retries at once, a few hundred times a second.
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    (allowed, refused, held)
                })
            })
            .collect();
        let (mut allowed, mut refused, mut held) = (0usize, Vec::new(), 0usize);
        for task in tasks {
            let (a, r, h) = task.await.unwrap();
            allowed += a;
            refused.extend(r);
            held += h;
        }
        let sent = log.sent.lock().unwrap().len();
        eprintln!(
            "sent {sent}: {allowed} allowed, {} refused; {held} held back locally; at most {} refusals in a second",
            refused.len(),
            most_in_a_second(&refused)
        );
        let violations = log.sent_while_told_to_wait();
        assert!(
            violations.is_empty(),
            "sent while told to wait: {violations:?}"
        );
        assert_few_refusals(&refused);
        // Not starved: the client spent the server's quota in more than one window (a hold
        // lasts the advertised t, which rounds the window's reset up to whole seconds).
        assert!(allowed > LIMIT as usize, "{allowed} allowed in {HAMMER:?}");
        assert!(held > 0, "the layer never held a call back");
        assert_eq!(sent, allowed + refused.len());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_customer_told_to_wait_does_not_hold_back_another() {
        let server = orders_api();
        let hyper = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let layer = HoldBackLayer::new().partition(|parts| {
            let customer = parts
                .headers
                .get("x-customer-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            format!(
                "{}#{customer}",
                parts.uri.authority().map_or("", |a| a.as_str())
            )
        });
        let client = layer.layer(tower::service_fn(move |request| hyper.request(request)));
        let authority = server.addr.trim_start_matches("http://").to_owned();
        let mut held = None;
        for _ in 0..LIMIT * 3 {
            match client.clone().oneshot(get(&server.addr, "acme")).await {
                Ok(_) => {}
                Err(e) => match e.downcast::<NotSent>() {
                    Ok(h) => {
                        held = Some(*h);
                        break;
                    }
                    Err(e) => panic!("{e}"),
                },
            }
        }
        let held = held.expect("acme was never held back");
        assert_eq!(held.partition(), Some(format!("{authority}#acme").as_str()));
        assert!(layer.held_for(&format!("{authority}#acme")).is_some());
        let response = client
            .clone()
            .oneshot(get(&server.addr, "globex"))
            .await
            .expect("globex is sent");
        assert_eq!(response.status(), StatusCode::OK);
    }
}

mod grpc_health {
    use super::*;

    use tonic::Code;
    use tonic::transport::Channel;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    /// The example's limit: 5 calls a second per customer.
    const LIMIT: usize = 5;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hammering_tonic_channel_sends_nothing_while_pushed_back() {
        let server = start(
            "grpc_health",
            &["127.0.0.1:0"],
            "serving grpc.health.v1.Health on ",
        );
        let channel = Channel::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let log = Log::default();
        let inner = tower::service_fn({
            let log = log.clone();
            move |request| {
                log.sent();
                let mut channel = channel.clone();
                async move { channel.ready().await?.call(request).await }
            }
        });
        let client = HealthClient::new(HoldBackLayer::new().name("health").layer(inner));

        let started = Instant::now();
        let tasks: Vec<_> = (0..CALLERS)
            .map(|_| {
                let mut client = client.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    let (mut allowed, mut refused, mut held) = (0, Vec::new(), 0);
                    while started.elapsed() < HAMMER {
                        let mut request = tonic::Request::new(HealthCheckRequest {
                            service: String::new(),
                        });
                        request
                            .metadata_mut()
                            .insert("x-customer-id", "acme".parse().unwrap());
                        match client.check(request).await {
                            Ok(response) => {
                                log.answered(false, &response.metadata().clone().into_headers());
                                allowed += 1;
                            }
                            Err(status) if status.code() == Code::ResourceExhausted => {
                                log.answered(true, &status.metadata().clone().into_headers());
                                refused.push(Instant::now());
                            }
                            Err(status) => {
                                let held_back = std::error::Error::source(&status)
                                    .is_some_and(|e| e.is::<NotSent>());
                                assert!(held_back, "{status:?}");
                                held += 1;
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                        }
                    }
                    (allowed, refused, held)
                })
            })
            .collect();
        let (mut allowed, mut refused, mut held) = (0usize, Vec::new(), 0usize);
        for task in tasks {
            let (a, r, h) = task.await.unwrap();
            allowed += a;
            refused.extend(r);
            held += h;
        }
        let sent = log.sent.lock().unwrap().len();
        eprintln!(
            "sent {sent}: {allowed} allowed, {} refused; {held} held back locally; at most {} refusals in a second",
            refused.len(),
            most_in_a_second(&refused)
        );
        let violations = log.sent_while_told_to_wait();
        assert!(
            violations.is_empty(),
            "sent while told to wait: {violations:?}"
        );
        assert_few_refusals(&refused);
        // Not starved: the client spent the server's quota in more than one window (a hold
        // lasts the advertised t, which rounds the window's reset up to whole seconds).
        assert!(allowed > LIMIT, "{allowed} allowed in {HAMMER:?}");
        assert!(held > 0, "the layer never held a call back");
        assert_eq!(sent, allowed + refused.len());
    }
}
