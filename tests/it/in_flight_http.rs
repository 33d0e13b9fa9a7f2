//! `/reports` of two `orders_api` processes on one real redis-server, over HTTP: 5
//! concurrent reports of one customer over both instances, exactly 2 run; an instance
//! killed with two reports running frees their slots within `--slot-ttl-ms`, and not
//! before; a client that hangs up mid-report frees its slot at once.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate_testkit::orders_api::Server;
use tollgate_testkit::redis::RedisServer;

use crate::orders_api_e2e::start_with;

const SLOT_TTL: Duration = Duration::from_millis(1_000);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn instance(server: &RedisServer) -> Server {
    let ttl = SLOT_TTL.as_millis().to_string();
    start_with(&server.url(), "closed", &["--slot-ttl-ms", &ttl])
}

/// The status of `GET /reports?ms=N` for `customer`, or 0 without an answer.
async fn report(client: &HttpClient, base: &str, customer: &str, ms: u64) -> u16 {
    let request = http::Request::get(format!("{base}/reports?ms={ms}"))
        .header("x-customer-id", customer)
        .body(Empty::new())
        .unwrap();
    // No answer (the instance was killed mid-request) is 0.
    let Ok(response) = client.request(request).await else {
        return 0;
    };
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

async fn metrics_of(client: &HttpClient, base: &str) -> String {
    let response = client
        .get(format!("{base}/metrics").parse().unwrap())
        .await
        .expect("/metrics answers");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// The slots Redis holds for `customer`.
fn held(server: &RedisServer, customer: &str) -> u64 {
    let key = format!("reports:{{{customer}}}:reports:in-flight");
    server.must(&["ZCARD", &key]).trim().parse().unwrap()
}

/// Waits until Redis holds `count` slots of `customer` (the reports have started).
async fn until_held(server: &RedisServer, customer: &str, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(server, customer) != count {
        assert!(
            Instant::now() < deadline,
            "{customer} never held {count} slots"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_over_two_instances_a_killed_instance_and_a_client_gone() {
    let server = RedisServer::start();
    let a = instance(&server);
    let b = instance(&server);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // Both instances answer before the burst.
    for base in [&a.base, &b.base] {
        assert_eq!(report(&client, base, "warmup", 0).await, 200);
    }

    // 5 concurrent reports of acme over both instances (and globex beside it): 2 run.
    let mut tasks = Vec::new();
    for customer in ["acme", "globex"] {
        for i in 0..5 {
            let base = if i % 2 == 0 { &a.base } else { &b.base }.clone();
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                (customer, report(&client, &base, customer, 2_000).await)
            }));
        }
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    for customer in ["acme", "globex"] {
        let of = |status| {
            statuses
                .iter()
                .filter(|(c, s)| *c == customer && *s == status)
                .count()
        };
        assert_eq!((of(200), of(429)), (2, 3), "{customer}: {statuses:?}");
    }
    assert_eq!(held(&server, "acme"), 0, "slots left after the burst");
    let metrics = metrics_of(&client, &a.base).await;
    for line in [
        "# HELP tollgate_in_flight_decisions_total ",
        "# HELP tollgate_in_flight ",
        "tollgate_in_flight_decisions_total{layer=\"reports\",outcome=\"limited\"}",
        "tollgate_in_flight{layer=\"reports\"} 0",
    ] {
        assert!(
            metrics.contains(line),
            "/metrics has no {line:?}:\n{metrics}"
        );
    }

    // Two long reports on a, then a dies: b refuses acme until their slots expire.
    let running: Vec<_> = (0..2)
        .map(|_| {
            let (client, base) = (client.clone(), a.base.clone());
            tokio::spawn(async move { report(&client, &base, "acme", 30_000).await })
        })
        .collect();
    until_held(&server, "acme", 2).await;
    // Renewed while they run: still held after more than a slot's time to live.
    tokio::time::sleep(SLOT_TTL + SLOT_TTL / 2).await;
    assert_eq!(held(&server, "acme"), 2, "running reports lost their slots");
    drop(a);
    let killed = Instant::now();
    for task in running {
        let _ = task.await;
    }
    assert_eq!(
        report(&client, &b.base, "acme", 0).await,
        429,
        "freed at once"
    );
    let freed = loop {
        if report(&client, &b.base, "acme", 0).await == 200 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < SLOT_TTL * 5,
            "a dead instance's slots were never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The bound is one slot ttl; the rest is the polling and a busy machine.
    assert!(
        freed <= SLOT_TTL + Duration::from_millis(500),
        "freed after {freed:?}"
    );

    // A client that hangs up mid-report frees its slot at once.
    let hung_up: Vec<_> = (0..2)
        .map(|_| {
            let (client, base) = (client.clone(), b.base.clone());
            tokio::spawn(async move { report(&client, &base, "initech", 30_000).await })
        })
        .collect();
    until_held(&server, "initech", 2).await;
    assert_eq!(report(&client, &b.base, "initech", 0).await, 429);
    for task in hung_up {
        task.abort();
    }
    let hung = Instant::now();
    until_held(&server, "initech", 0).await;
    assert!(
        hung.elapsed() < SLOT_TTL / 2,
        "freed after {:?}, not at once",
        hung.elapsed()
    );
    assert_eq!(report(&client, &b.base, "initech", 0).await, 200);
}
