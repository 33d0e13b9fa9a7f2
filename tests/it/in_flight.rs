//! Requests in flight per caller (`InFlightLayer`): of 5 concurrent requests of one
//! customer at most 2 reach the handler, whoever else calls, in one process, over two
//! instances on a real redis-server and on a Redis Cluster; a slot is freed when the body
//! ends, when it is dropped unread, when the service fails or panics; the fields say
//! `qu="concurrent-requests"`; and with the store down the failure policy decides.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::Full;
use tollgate::in_flight::InFlightLayer;
use tollgate::key::HeaderKey;
use tollgate::store::SlotStore;
use tollgate::{FailurePolicy, InMemoryBackend, InstanceCount};
use tollgate_testkit::http::{Reply, get, send};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt, service_fn};

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

type Reports = BoxCloneService<
    Request<Full<Bytes>>,
    Response<tollgate::response::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// What ran in the handler: per customer, how many run now and the most that ever ran at
/// once.
#[derive(Clone, Default)]
struct Running {
    by_customer: Arc<Mutex<HashMap<String, (usize, usize)>>>,
}

impl Running {
    fn enter(&self, customer: &str) {
        let mut map = self.by_customer.lock().unwrap();
        let (now, most) = map.entry(customer.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
    }

    fn leave(&self, customer: &str) {
        self.by_customer
            .lock()
            .unwrap()
            .get_mut(customer)
            .unwrap()
            .0 -= 1;
    }

    fn most(&self, customer: &str) -> usize {
        self.by_customer
            .lock()
            .unwrap()
            .get(customer)
            .map_or(0, |c| c.1)
    }
}

/// A route whose handler takes `work` and records who runs, behind `layer`.
fn reports(layer: &InFlightLayer<HeaderKey>, running: &Running, work: Duration) -> Reports {
    let running = running.clone();
    let handler = service_fn(move |request: Request<Full<Bytes>>| {
        let running = running.clone();
        async move {
            let customer = request.headers()["x-customer-id"]
                .to_str()
                .unwrap()
                .to_owned();
            running.enter(&customer);
            tokio::time::sleep(work).await;
            running.leave(&customer);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"report"))))
        }
    });
    BoxCloneService::new(layer.layer(handler))
}

fn layer(store: impl SlotStore) -> InFlightLayer<HeaderKey> {
    InFlightLayer::new("reports", 2, store)
        .key(HeaderKey::new("x-customer-id"))
        // A healthy store on a loaded test machine answers within this.
        .store_timeout(Duration::from_secs(5))
}

/// Sends `per_customer` concurrent requests of each customer, spread over `instances` in
/// turn, and answers their replies by customer.
async fn burst(
    instances: &[Reports],
    customers: &[&str],
    per_customer: usize,
) -> HashMap<String, Vec<Reply>> {
    let mut tasks = Vec::new();
    for customer in customers {
        for i in 0..per_customer {
            let mut service = instances[i % instances.len()].clone();
            let customer = (*customer).to_owned();
            tasks.push(tokio::spawn(async move {
                let reply = send(
                    &mut service,
                    get("/reports", &[("x-customer-id", customer.as_str())]),
                )
                .await;
                (customer, reply)
            }));
        }
    }
    let mut replies: HashMap<String, Vec<Reply>> = HashMap::new();
    for task in tasks {
        let (customer, reply) = task.await.unwrap();
        replies.entry(customer).or_default().push(reply);
    }
    replies
}

/// Exactly 2 of each customer's 5 ran, never more than 2 at once; the others were 429
/// with the fields and Retry-After the module documents.
fn assert_two_of_five(replies: &HashMap<String, Vec<Reply>>, running: &Running) {
    for (customer, replies) in replies {
        let admitted: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
        let refused: Vec<&Reply> = replies
            .iter()
            .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
            .collect();
        assert_eq!(admitted.len(), 2, "{customer}: admitted");
        assert_eq!(refused.len(), 3, "{customer}: refused");
        assert_eq!(running.most(customer), 2, "{customer}: most at once");
        for reply in &admitted {
            assert_eq!(in_flight_policy(reply), 2);
            let remaining = in_flight_state(reply, "r");
            assert!(remaining <= 1, "{customer}: r={remaining}");
        }
        for reply in &refused {
            assert_eq!(in_flight_policy(reply), 2);
            assert_eq!(in_flight_state(reply, "r"), 0);
            assert_eq!(in_flight_state(reply, "t"), 1);
            assert_eq!(reply.retry_after(), Some(1));
            let problem = reply.json();
            assert_eq!(problem["policy"], "in-flight");
            assert_eq!(problem["violated-policies"][0], "in-flight");
        }
    }
}

/// The in-flight item of RateLimit-Policy, parsed back: its quota, after checking that its
/// unit is `concurrent-requests` and that it has no window.
fn in_flight_policy(reply: &Reply) -> i64 {
    let list = reply.sf_list("ratelimit-policy").expect("RateLimit-Policy");
    let item = in_flight_item(&list);
    let param = |name: &str| item.params.iter().find(|(k, _)| k.as_str() == name);
    match param("qu").map(|(_, v)| v) {
        Some(sfv::BareItem::String(unit)) => assert_eq!(unit.as_str(), "concurrent-requests"),
        other => panic!("qu is {other:?}"),
    }
    assert!(param("w").is_none(), "a window on a limit of slots");
    match param("q").map(|(_, v)| v) {
        Some(sfv::BareItem::Integer(q)) => i64::from(*q),
        other => panic!("q is {other:?}"),
    }
}

fn in_flight_state(reply: &Reply, name: &str) -> i64 {
    let list = reply.sf_list("ratelimit").expect("RateLimit");
    let item = in_flight_item(&list);
    match item.params.iter().find(|(k, _)| k.as_str() == name) {
        Some((_, sfv::BareItem::Integer(n))) => i64::from(*n),
        other => panic!("{name} is {other:?}"),
    }
}

fn in_flight_item(list: &sfv::List) -> &sfv::Item {
    list.iter()
        .find_map(|entry| match entry {
            sfv::ListEntry::Item(item)
                if matches!(&item.bare_item, sfv::BareItem::String(s) if s.as_str() == "in-flight") =>
            {
                Some(item)
            }
            _ => None,
        })
        .expect("an \"in-flight\" item")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_two_of_five_reach_the_handler_per_customer() {
    let running = Running::default();
    let service = reports(
        &layer(InMemoryBackend::new()),
        &running,
        Duration::from_secs(1),
    );
    let replies = burst(&[service], &["acme", "globex"], 5).await;
    assert_two_of_five(&replies, &running);
}

#[tokio::test]
async fn slots_come_back_when_the_bodies_end() {
    let running = Running::default();
    let mut service = reports(
        &layer(InMemoryBackend::new()),
        &running,
        Duration::from_millis(1),
    );
    // One after the other, each body read to its end: never more than one held.
    for i in 0..10 {
        let reply = send(&mut service, get("/reports", &[("x-customer-id", "acme")])).await;
        assert_eq!(reply.status, 200, "request {i}");
        assert_eq!(in_flight_state(&reply, "r"), 1, "request {i}");
    }
}

/// A body that sends one frame and then never ends: a long download.
struct Endless {
    sent: bool,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent {
            Poll::Pending
        } else {
            self.sent = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"part")))))
        }
    }
}

#[tokio::test]
async fn a_body_dropped_unread_frees_its_slot_at_once() {
    let layer = InFlightLayer::new("downloads", 1, InMemoryBackend::new())
        .key(HeaderKey::new("x-customer-id"));
    let mut service = layer.layer(service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Endless { sent: false }))
    }));
    let request = || {
        Request::get("/download")
            .header("x-customer-id", "acme")
            .body(())
            .unwrap()
    };
    let first = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    // The download runs: the only slot is held by its body.
    let second = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    // The client goes away mid-download: the server drops the body.
    drop(first);
    let third = service
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .unwrap();
    assert_eq!(third.status(), 200, "the dropped body's slot was not freed");
}

#[tokio::test]
async fn a_failing_or_panicking_service_frees_its_slot() {
    let layer = InFlightLayer::new("reports", 1, InMemoryBackend::new())
        .key(HeaderKey::new("x-customer-id"));
    let request = |what: &str| {
        Request::get(format!("/{what}"))
            .header("x-customer-id", "acme")
            .body(())
            .unwrap()
    };
    let service = layer.layer(service_fn(|request: Request<()>| async move {
        match request.uri().path() {
            "/fail" => Err("the handler failed"),
            "/panic" => panic!("the handler panicked"),
            _ => Ok(Response::new(Full::new(Bytes::from_static(b"ok")))),
        }
    }));
    let mut failing = service.clone();
    let failed = failing.ready().await.unwrap().call(request("fail")).await;
    assert!(failed.is_err());
    let mut panicking = service.clone();
    let panicked = tokio::spawn(async move {
        let _ = panicking
            .ready()
            .await
            .unwrap()
            .call(request("panic"))
            .await;
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let mut service = service;
    let ok = service.ready().await.unwrap().call(request("ok")).await;
    assert_eq!(ok.unwrap().status(), 200, "a slot stayed taken");
}

#[tokio::test]
async fn a_request_without_a_key_is_answered_as_the_layer_says() {
    let running = Running::default();
    let mut service = reports(
        &layer(InMemoryBackend::new()),
        &running,
        Duration::from_millis(1),
    );
    let reply = send(&mut service, get("/reports", &[])).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["status"], 400);
}

#[cfg(feature = "redis")]
mod on_redis {
    use std::time::{Duration, Instant};

    use tollgate::store::CallerKey;
    use tollgate::{FailurePolicy, InstanceCount, RedisBackend};
    use tollgate_testkit::http::{get, send};
    use tollgate_testkit::redis::{RedisCluster, RedisServer};

    use tower::{Service, ServiceExt};

    use super::{Running, assert_two_of_five, burst, layer, reports};

    fn instance(store: RedisBackend, running: &Running) -> super::Reports {
        // Longer than the whole burst takes to be decided on a loaded machine: no slot is
        // freed before the last request of the burst has asked for one.
        reports(&layer(store), running, Duration::from_secs(2))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_on_redis_admit_two_of_five_per_customer() {
        let server = RedisServer::start();
        let running = Running::default();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store = RedisBackend::builder(server.url()).build().unwrap();
            store.ping().await.expect("redis-server answers");
            instances.push(instance(store, &running));
        }
        let replies = burst(&instances, &["acme", "globex", "initech"], 5).await;
        assert_two_of_five(&replies, &running);
        // Every slot was freed: no key is left behind. A response body's drop sends its
        // release from a spawned task, so the last ones may still be on their way; 2 s is
        // far inside the slots' 10 s time to live, so a key gone by then was released.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut keys = server.must(&["KEYS", "rl:*in-flight"]);
        while !keys.trim().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            keys = server.must(&["KEYS", "rl:*in-flight"]);
        }
        assert!(keys.trim().is_empty(), "slots left: {keys}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_on_a_redis_cluster_admit_two_of_five_per_customer() {
        let cluster = RedisCluster::start();
        let running = Running::default();
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store = RedisBackend::cluster_builder(cluster.urls())
                .build()
                .unwrap();
            store.ping().await.expect("the cluster answers");
            instances.push(instance(store, &running));
        }
        let replies = burst(&instances, &["acme", "globex", "initech", "umbrella"], 5).await;
        assert_two_of_five(&replies, &running);
    }

    /// A slot that is not renewed (its holder died) frees itself within its time to live;
    /// a slot that is renewed stays taken however long its request runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unrenewed_slots_expire_and_renewed_ones_stay() {
        use tollgate::store::{Slot, SlotStore};

        let server = RedisServer::start();
        let store = RedisBackend::builder(server.url()).build().unwrap();
        store.ping().await.unwrap();
        let ttl = Duration::from_millis(600);
        let slot = |id, ttl| Slot::new(CallerKey::new("acme"), "reports", id, ttl);
        // A dead instance's slots: taken, never renewed.
        assert_eq!(store.acquire(&slot(1, ttl), 2).await.unwrap(), Some(1));
        assert_eq!(store.acquire(&slot(2, ttl), 2).await.unwrap(), Some(2));
        let taken = Instant::now();
        assert_eq!(store.acquire(&slot(3, ttl), 2).await.unwrap(), None);
        let freed = loop {
            if store.acquire(&slot(3, ttl), 2).await.unwrap().is_some() {
                break taken.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            freed <= ttl + Duration::from_millis(500),
            "freed after {freed:?}"
        );
        assert!(
            freed >= ttl - Duration::from_millis(50),
            "freed early: {freed:?}"
        );
        // A renewed slot outlives many ttls (renewed every third of a longer one, as the
        // layer does); a renewal of an expired one says so.
        let long = Duration::from_secs(3);
        assert!(store.renew(&slot(3, long)).await.unwrap());
        for _ in 0..3 {
            tokio::time::sleep(long / 3).await;
            assert!(store.renew(&slot(3, long)).await.unwrap());
        }
        assert!(!store.renew(&slot(1, ttl)).await.unwrap());
        assert_eq!(store.acquire(&slot(4, ttl), 2).await.unwrap(), Some(2));
        assert_eq!(store.acquire(&slot(5, ttl), 2).await.unwrap(), None);
        // The key lives as long as its last slot, not for ever.
        let pttl: i64 = server
            .must(&["PTTL", "rl:{acme}:reports:in-flight"])
            .trim()
            .parse()
            .unwrap();
        assert!((1..=3_000).contains(&pttl), "PTTL {pttl}");
        store.release(&slot(3, ttl)).await.unwrap();
        store.release(&slot(4, ttl)).await.unwrap();
        assert_eq!(
            server
                .must(&["EXISTS", "rl:{acme}:reports:in-flight"])
                .trim(),
            "0"
        );
    }

    /// The number of slots `caller` holds of the limit "reports" on `server`.
    fn slots_held(server: &RedisServer, caller: &str) -> u64 {
        server
            .must(&["ZCARD", &format!("rl:{{{caller}}}:reports:in-flight")])
            .trim()
            .parse()
            .unwrap()
    }

    /// A slot the store takes after the layer stopped waiting for it (its answer came
    /// after the store timeout) is released, so the caller is not refused for a whole
    /// `slot_ttl` with nothing running. The fault proxy holds each request to the store
    /// 300 ms: the request fails open after 20 ms, the slot is taken 300 ms later and
    /// released after it, and the caller's next request gets the slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_a_slot_taken_after_the_timeout_is_released() {
        use tollgate_testkit::proxy::{Fault, FaultProxy};

        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port());
        let store = RedisBackend::builder(proxy.url())
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        store.ping().await.unwrap();
        let running = Running::default();
        let layer = tollgate::in_flight::InFlightLayer::new("reports", 1, store)
            .key(tollgate::key::HeaderKey::new("x-customer-id"))
            .store_timeout(Duration::from_millis(20));
        let mut service = reports(&layer, &running, Duration::from_millis(1));
        let acme = [("x-customer-id", "acme")];
        // The script is loaded (a first EVALSHA answered NOSCRIPT would be sent again only
        // while someone waits for its answer).
        assert_eq!(send(&mut service, get("/reports", &acme)).await.status, 200);
        assert!(layer.flush(Duration::from_secs(2)).await);

        proxy.set(Fault::Delay(Duration::from_millis(300)));
        let started = Instant::now();
        let first = send(&mut service, get("/reports", &acme)).await;
        assert_eq!(first.status, 200, "failed open");
        assert!(started.elapsed() < Duration::from_millis(250));
        // The release goes out behind the acquire, which the proxy holds 300 ms more: both
        // have reached the store 800 ms in, and the release has been answered.
        tokio::time::sleep(Duration::from_millis(800).saturating_sub(started.elapsed())).await;
        assert!(layer.flush(Duration::from_secs(2)).await);
        proxy.set(Fault::Pass);
        assert_eq!(slots_held(&server, "acme"), 0, "a slot is held for nobody");
        let second = send(&mut service, get("/reports", &acme)).await;
        assert_eq!(second.status, 200, "refused at +{:?}", started.elapsed());
        assert!(layer.flush(Duration::from_secs(2)).await);
        assert_eq!(slots_held(&server, "acme"), 0);
    }

    /// A request that goes away while its slot is being asked for (a client that hung up,
    /// a timeout around the service) does not leave the slot to the store either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_a_slot_asked_by_a_request_that_went_away_is_released() {
        use tollgate_testkit::proxy::{Fault, FaultProxy};

        let server = RedisServer::start();
        let proxy = FaultProxy::start(server.port());
        let store = RedisBackend::builder(proxy.url())
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        store.ping().await.unwrap();
        let running = Running::default();
        let layer = tollgate::in_flight::InFlightLayer::new("reports", 1, store)
            .key(tollgate::key::HeaderKey::new("x-customer-id"))
            .store_timeout(Duration::from_secs(1));
        let mut service = reports(&layer, &running, Duration::from_millis(1));
        let acme = [("x-customer-id", "acme")];
        // The script is loaded (a first EVALSHA answered NOSCRIPT would be sent again only
        // while someone waits for its answer).
        assert_eq!(send(&mut service, get("/reports", &acme)).await.status, 200);
        assert!(layer.flush(Duration::from_secs(2)).await);

        proxy.set(Fault::Delay(Duration::from_millis(300)));
        let gone = tokio::time::timeout(
            Duration::from_millis(50),
            send(&mut service, get("/reports", &acme)),
        )
        .await;
        assert!(
            gone.is_err(),
            "the request went away before the store answered"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.set(Fault::Pass);
        assert!(layer.flush(Duration::from_secs(2)).await);
        assert_eq!(slots_held(&server, "acme"), 0, "a slot is held for nobody");
        assert_eq!(send(&mut service, get("/reports", &acme)).await.status, 200);
    }

    /// A runtime that is shutting down runs no task, so a release left to one never
    /// reaches the store; `flush` before the runtime ends sends the last ones.
    #[test]
    fn regression_slots_freed_before_a_shutdown_reach_the_store() {
        let server = RedisServer::start();
        let url = server.url();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = RedisBackend::builder(url).build().unwrap();
            store.ping().await.unwrap();
            let running = Running::default();
            let layer = layer(store);
            let mut service = reports(&layer, &running, Duration::from_millis(1));
            let mut bodies = Vec::new();
            for customer in ["acme", "globex", "initech"] {
                let response = service
                    .ready()
                    .await
                    .unwrap()
                    .call(get("/reports", &[("x-customer-id", customer)]))
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
                bodies.push(response);
            }
            for customer in ["acme", "globex", "initech"] {
                assert_eq!(slots_held(&server, customer), 1);
            }
            // The server has stopped: the last responses are dropped, then flushed.
            drop(bodies);
            assert!(layer.flush(Duration::from_secs(2)).await);
        });
        drop(runtime);
        for customer in ["acme", "globex", "initech"] {
            assert_eq!(
                slots_held(&server, customer),
                0,
                "{customer}'s slot is held"
            );
        }
    }

    /// Redis gone: closed answers 503; a local share of 3 slots over 2 instances runs 2 at
    /// place 0 (and would run 1 at place 1); open lets everything run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_the_store_down_the_failure_policy_decides() {
        let mut server = RedisServer::start();
        let url = server.url();
        server.kill();
        let down = || {
            RedisBackend::builder(url.as_str())
                .connect_timeout(Duration::from_millis(50))
                .build()
                .unwrap()
        };
        let running = Running::default();
        let work = Duration::from_secs(1);
        let of = |policy: FailurePolicy, limit: u64| {
            let layer = tollgate::in_flight::InFlightLayer::new("reports", limit, down())
                .key(tollgate::key::HeaderKey::new("x-customer-id"))
                .on_store_failure(policy);
            super::reports(&layer, &running, work)
        };
        let mut closed = of(FailurePolicy::closed(), 2);
        let reply = send(&mut closed, get("/reports", &[("x-customer-id", "acme")])).await;
        assert_eq!(reply.status, 503);
        assert_eq!(reply.retry_after(), Some(1));

        let share = of(
            FailurePolicy::local_share(InstanceCount::fixed(2).at_place(0)),
            3,
        );
        let replies = burst(&[share], &["globex"], 5).await;
        let admitted = replies["globex"].iter().filter(|r| r.status == 200).count();
        assert_eq!(admitted, 2, "place 0's share of 3 over 2");
        assert_eq!(running.most("globex"), 2);
        for reply in replies["globex"].iter() {
            assert_eq!(super::in_flight_policy(reply), 2, "the share is advertised");
        }

        let open = of(FailurePolicy::open(), 2);
        let replies = burst(&[open], &["initech"], 4).await;
        assert!(replies["initech"].iter().all(|r| r.status == 200));
        assert!(
            replies["initech"]
                .iter()
                .all(|r| r.headers.get("ratelimit").is_none())
        );
    }
}

#[test]
fn the_layer_is_debug_and_clone() {
    let layer = InFlightLayer::new("reports", 2, InMemoryBackend::new())
        .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(2)));
    let copy = layer.clone();
    assert!(format!("{copy:?}").contains("limit: 2"));
}
