//! Every built-in key extractor, through the layer: who a request is counted as.
//!
//! Most tests use a limiter of one request per hour, so the second request of a caller is
//! refused: two requests share a bucket exactly when the second one gets 429.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::header::FORWARDED;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::decision::UnlimitedReason;
use tollgate::key::{AsyncKeyExtractor, Extracted, KeyRejection};
use tollgate::response::ResponseBody;
use tollgate::store::CallerKey;
use tollgate::{
    Caller, Decision, Limiter, Policy, Quota, RateLimitLayer,
    key::{AsyncFnKey, ClientIp, ExtensionKey, FnKey, HeaderKey, KeyExtractor, MissingKey},
};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

/// One request per hour: a caller's second request is refused.
fn one_per_hour() -> Limiter {
    Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1)))
        .build()
}

fn layered<K: AsyncKeyExtractor>(limiter: Limiter, key: K, missing: MissingKey) -> Svc {
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter)
                    .decision_on_every_response(true)
                    .key(key)
                    .on_missing_key(missing),
            )
            .service(service_fn(ok_handler)),
    )
}

/// A fresh one-per-hour service keyed by `key`; requests without a key get 401.
fn service<K: KeyExtractor>(key: K) -> Svc {
    layered(
        one_per_hour(),
        key,
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
    )
}

/// A GET whose headers may hold any bytes.
fn raw(headers: &[(&str, &[u8])]) -> Request<Full<Bytes>> {
    let mut request = get("/", &[]);
    for (name, value) in headers {
        request.headers_mut().append(
            http::HeaderName::try_from(*name).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    request
}

/// A GET from `peer` as axum's `ConnectInfo` reports it.
fn from_peer(peer: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = get("/", headers);
    request
        .extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

/// A GET from `peer` as a plain hyper service would record it: a bare `SocketAddr`.
fn from_socket(peer: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = get("/", headers);
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

/// Whether `second` is counted in the same bucket as `first`, on a fresh limiter.
async fn same_bucket<K: KeyExtractor>(
    key: K,
    first: Request<Full<Bytes>>,
    second: Request<Full<Bytes>>,
) -> bool {
    let mut svc = service(key);
    let a = send(&mut svc, first).await;
    assert_eq!(a.status, StatusCode::OK, "first request: {a:?}");
    let b = send(&mut svc, second).await;
    match b.status {
        StatusCode::TOO_MANY_REQUESTS => true,
        StatusCode::OK => false,
        other => panic!("second request answered {other}: {b:?}"),
    }
}

fn decision(reply: &Reply) -> &Decision {
    reply
        .extensions
        .get::<Decision>()
        .expect("the decision is in the response's extensions")
}

fn assert_problem(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.headers.get(http::header::CONTENT_TYPE).unwrap(),
        "application/problem+json"
    );
    let body = reply.json();
    assert_eq!(body["status"], status.as_u16());
    assert!(body["title"].is_string(), "{body}");
}

async fn extract<K: AsyncKeyExtractor>(key: &K, request: &Request<Full<Bytes>>) -> Option<Caller> {
    match key.extract_async(request).await {
        Extracted::Caller(caller) => Some(caller),
        Extracted::NoKey => None,
        Extracted::Rejected(rejection) => panic!("rejected: {rejection}"),
    }
}

fn addr(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

// ---------------------------------------------------------------------------------------
// HeaderKey

#[tokio::test]
async fn header_key_counts_each_value_apart() {
    let key = HeaderKey::new("x-customer-id");
    let acme = || get("/", &[("x-customer-id", "acme")]);
    let globex = || get("/", &[("x-customer-id", "globex")]);
    assert!(same_bucket(key.clone(), acme(), acme()).await);
    assert!(!same_bucket(key.clone(), acme(), globex()).await);

    let mut svc = service(key);
    let first = send(&mut svc, acme()).await;
    assert!(matches!(decision(&first), Decision::Allowed(_)));
    let second = send(&mut svc, acme()).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(matches!(decision(&second), Decision::Limited(_)));
}

#[tokio::test]
async fn header_key_without_the_header_has_no_key() {
    let key = HeaderKey::new("x-customer-id");
    assert_eq!(extract(&key, &get("/", &[("x-other", "acme")])).await, None);

    let mut svc = service(key);
    let reply = send(&mut svc, get("/", &[])).await;
    assert_problem(&reply, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn header_key_with_an_empty_value_has_no_key() {
    let key = HeaderKey::new("x-customer-id");
    assert_eq!(
        extract(&key, &get("/", &[("x-customer-id", "")])).await,
        None
    );

    let mut svc = service(key);
    let reply = send(&mut svc, get("/", &[("x-customer-id", "")])).await;
    assert_problem(&reply, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn header_key_takes_the_first_of_repeated_headers() {
    let key = HeaderKey::new("x-customer-id");
    let both = || raw(&[("x-customer-id", b"acme"), ("x-customer-id", b"globex")]);
    let caller = extract(&key, &both()).await.unwrap();
    assert_eq!(caller.key(), &CallerKey::new("acme"));

    assert!(same_bucket(key.clone(), both(), get("/", &[("x-customer-id", "acme")])).await);
    assert!(
        !same_bucket(
            key.clone(),
            both(),
            get("/", &[("x-customer-id", "globex")])
        )
        .await
    );
    // Repeating the header does not give a caller a fresh bucket.
    assert!(same_bucket(key, get("/", &[("x-customer-id", "acme")]), both()).await);
}

#[tokio::test]
async fn header_key_accepts_non_utf8_values() {
    let key = HeaderKey::new("x-customer-id");
    let latin1 = || raw(&[("x-customer-id", b"caf\xe9")]);
    let caller = extract(&key, &latin1()).await.unwrap();
    assert_eq!(caller.key(), &CallerKey::new(b"caf\xe9"));

    assert!(same_bucket(key.clone(), latin1(), latin1()).await);
    // Neither the UTF-8 spelling nor a lossy conversion (U+FFFD) shares its bucket.
    assert!(
        !same_bucket(
            key.clone(),
            latin1(),
            raw(&[("x-customer-id", "café".as_bytes())])
        )
        .await
    );
    assert!(
        !same_bucket(
            key,
            latin1(),
            raw(&[("x-customer-id", "caf\u{fffd}".as_bytes())])
        )
        .await
    );
}

// ---------------------------------------------------------------------------------------
// ExtensionKey

/// What an authentication layer would put in the request.
#[derive(Clone, Debug)]
struct Principal {
    account: String,
    plan: &'static str,
}

impl From<&Principal> for Caller {
    fn from(p: &Principal) -> Self {
        Caller::new(p.account.as_str()).with_tier(p.plan)
    }
}

fn as_principal(account: &str, plan: &'static str) -> Request<Full<Bytes>> {
    let mut request = get("/", &[]);
    request.extensions_mut().insert(Principal {
        account: account.to_owned(),
        plan,
    });
    request
}

#[tokio::test]
async fn extension_key_uses_the_principal_and_its_tier() {
    let key = ExtensionKey::<Principal>::new();
    let caller = extract(&key, &as_principal("acme", "gold")).await.unwrap();
    assert_eq!(caller.key(), &CallerKey::new("acme"));
    assert_eq!(caller.tier(), Some("gold"));

    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1)))
        .tier(
            "gold",
            [Policy::sliding_window("per-hour", Quota::per_hour(3))],
        )
        .build();
    let mut svc = layered(limiter, key, MissingKey::Reject(StatusCode::UNAUTHORIZED));

    // The free plan gets one request, the gold plan three; accounts stay apart.
    assert_eq!(
        send(&mut svc, as_principal("initech", "free")).await.status,
        200
    );
    assert_eq!(
        send(&mut svc, as_principal("initech", "free")).await.status,
        429
    );
    for _ in 0..3 {
        let reply = send(&mut svc, as_principal("acme", "gold")).await;
        assert_eq!(reply.status, 200);
        let policy = reply.policy_params("ratelimit-policy");
        assert_eq!(policy[0].0, "per-hour");
        assert!(policy[0].1.contains(&("q".to_owned(), 3)), "{policy:?}");
    }
    assert_eq!(
        send(&mut svc, as_principal("acme", "gold")).await.status,
        429
    );
    assert_eq!(
        send(&mut svc, as_principal("globex", "gold")).await.status,
        200
    );
}

#[tokio::test]
async fn extension_key_without_the_extension_has_no_key() {
    let key = ExtensionKey::<Principal>::new();
    assert_eq!(extract(&key, &get("/", &[])).await, None);
    let mut svc = service(key);
    assert_problem(
        &send(&mut svc, get("/", &[])).await,
        StatusCode::UNAUTHORIZED,
    );
}

// ---------------------------------------------------------------------------------------
// A fixed Caller, FnKey, AsyncFnKey

#[tokio::test]
async fn a_fixed_caller_puts_everybody_in_one_bucket() {
    assert!(
        same_bucket(
            Caller::new("*"),
            from_peer("203.0.113.7:1000", &[("x-customer-id", "acme")]),
            from_peer("198.51.100.1:2000", &[("x-customer-id", "globex")]),
        )
        .await
    );
    assert!(same_bucket(Caller::new("*"), get("/a", &[]), get("/b", &[])).await);
}

#[tokio::test]
async fn fn_key_counts_what_the_closure_names() {
    // Tenant from the first path segment; no segment, no key; `/admin` is refused.
    let key = FnKey::new(|request: &Request<()>| {
        let segment = request.uri().path().split('/').nth(1).unwrap_or("");
        match segment {
            "" => Ok(None),
            "admin" => Err(KeyRejection::new(StatusCode::FORBIDDEN, "not for you")),
            tenant => Ok(Some(Caller::new(tenant).with_tier("free"))),
        }
    });
    let caller = extract(&key, &get("/acme/orders", &[])).await.unwrap();
    assert_eq!(caller.key(), &CallerKey::new("acme"));
    assert_eq!(caller.tier(), Some("free"));

    assert!(
        same_bucket(
            key.clone(),
            get("/acme/orders", &[]),
            get("/acme/invoices", &[])
        )
        .await
    );
    assert!(
        !same_bucket(
            key.clone(),
            get("/acme/orders", &[]),
            get("/globex/orders", &[])
        )
        .await
    );

    let mut svc = service(key);
    assert_problem(
        &send(&mut svc, get("/", &[])).await,
        StatusCode::UNAUTHORIZED,
    );
    let refused = send(&mut svc, get("/admin", &[])).await;
    assert_problem(&refused, StatusCode::FORBIDDEN);
    assert_eq!(refused.json()["detail"], "not for you");
}

#[tokio::test]
async fn async_fn_key_awaits_a_lookup() {
    // The caller's plan lives in a table that can only be read asynchronously.
    let plans: Arc<tokio::sync::RwLock<HashMap<String, &'static str>>> = Arc::new(
        tokio::sync::RwLock::new(HashMap::from([("acme".to_owned(), "gold")])),
    );
    let lookups = Arc::new(AtomicUsize::new(0));
    let key = {
        let (plans, lookups) = (plans.clone(), lookups.clone());
        AsyncFnKey::new(move |request: &Request<()>| {
            let api_key = request
                .headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let (plans, lookups) = (plans.clone(), lookups.clone());
            async move {
                tokio::task::yield_now().await;
                let Some(api_key) = api_key else {
                    return Extracted::NoKey;
                };
                let plan = plans.read().await.get(&api_key).copied().unwrap_or("free");
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                lookups.fetch_add(1, Ordering::SeqCst);
                Extracted::Caller(Caller::new(api_key).with_tier(plan))
            }
        })
    };
    let caller = extract(&key, &get("/", &[("x-api-key", "acme")]))
        .await
        .unwrap();
    assert_eq!(caller.tier(), Some("gold"));

    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1)))
        .tier(
            "gold",
            [Policy::sliding_window("per-hour", Quota::per_hour(2))],
        )
        .build();
    let mut svc = layered(limiter, key, MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let acme = || get("/", &[("x-api-key", "acme")]);
    let globex = || get("/", &[("x-api-key", "globex")]);
    assert_eq!(send(&mut svc, acme()).await.status, 200);
    assert_eq!(send(&mut svc, acme()).await.status, 200);
    assert_eq!(send(&mut svc, acme()).await.status, 429);
    assert_eq!(send(&mut svc, globex()).await.status, 200);
    assert_eq!(send(&mut svc, globex()).await.status, 429);
    assert_problem(
        &send(&mut svc, get("/", &[])).await,
        StatusCode::UNAUTHORIZED,
    );
    assert_eq!(lookups.load(Ordering::SeqCst), 1 + 5);

    // A plan change is seen by the next lookup.
    plans.write().await.insert("globex".to_owned(), "gold");
    assert_eq!(send(&mut svc, globex()).await.status, 200);
    assert_eq!(send(&mut svc, globex()).await.status, 429);
}

// ---------------------------------------------------------------------------------------
// ClientIp: the peer

#[tokio::test]
async fn client_ip_reads_the_peer_from_connect_info() {
    let ip = ClientIp::new();
    assert_eq!(
        ip.client_addr(&from_peer("203.0.113.7:5000", &[])),
        Ok(addr("203.0.113.7"))
    );
    // Another port of the same host is the same caller; another host is not.
    assert!(
        same_bucket(
            ip.clone(),
            from_peer("203.0.113.7:5000", &[]),
            from_peer("203.0.113.7:6000", &[])
        )
        .await
    );
    assert!(
        !same_bucket(
            ip,
            from_peer("203.0.113.7:5000", &[]),
            from_peer("203.0.113.8:5000", &[])
        )
        .await
    );
}

#[tokio::test]
async fn client_ip_reads_the_peer_from_a_bare_socket_addr() {
    let ip = ClientIp::new();
    assert_eq!(
        ip.client_addr(&from_socket("198.51.100.4:443", &[])),
        Ok(addr("198.51.100.4"))
    );
    assert!(
        same_bucket(
            ip.clone(),
            from_socket("198.51.100.4:443", &[]),
            from_peer("198.51.100.4:80", &[])
        )
        .await
    );
    assert!(
        !same_bucket(
            ip,
            from_socket("198.51.100.4:443", &[]),
            from_socket("198.51.100.5:443", &[])
        )
        .await
    );
}

#[tokio::test]
async fn client_ip_without_a_peer_has_no_key() {
    let ip = ClientIp::new();
    assert_eq!(ip.client_addr(&get("/", &[])), Ok(None));
    let mut svc = service(ip);
    assert_problem(
        &send(&mut svc, get("/", &[])).await,
        StatusCode::UNAUTHORIZED,
    );
}

/// A `tracing` subscriber that keeps the messages of tollgate's warnings.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn messages(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let metadata = event.metadata();
        if *metadata.level() == tracing::Level::WARN && metadata.target().starts_with("tollgate") {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn a_server_without_connect_info_is_reported_once() {
    let warnings = Warnings::default();
    // A current-thread runtime: every request below runs on this thread, under this subscriber.
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    // Whether an event is wanted is cached per callsite for the whole process: a test on
    // another thread that reached one first, with no subscriber, may have left it off.
    tracing::callsite::rebuild_interest_cache();

    let ip = ClientIp::new();
    let mut svc = service(ip.clone());
    for _ in 0..3 {
        assert_eq!(ip.client_addr(&get("/", &[])), Ok(None));
        assert_problem(
            &send(&mut svc, get("/", &[])).await,
            StatusCode::UNAUTHORIZED,
        );
    }
    let messages = warnings.messages();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "the warning says how to fix the server: {}",
        messages[0]
    );

    // Requests that do carry the peer address are not reported.
    let other = ClientIp::new();
    assert_eq!(
        other.client_addr(&from_peer("203.0.113.7:5000", &[])),
        Ok(addr("203.0.113.7"))
    );
    assert_eq!(warnings.messages().len(), 1);
}

#[tokio::test]
async fn spoofed_forwarding_headers_from_an_untrusted_peer_are_ignored() {
    // Without trusted proxies, and with proxies that do not include this peer.
    for ip in [
        ClientIp::new(),
        ClientIp::new().trusted_proxies(["10.0.0.0/8"]).unwrap(),
        ClientIp::new()
            .trusted_proxies(["10.0.0.0/8"])
            .unwrap()
            .forwarded_header(FORWARDED),
    ] {
        let spoofed = |forged: &str| {
            from_peer(
                "203.0.113.7:5000",
                &[
                    ("x-forwarded-for", forged),
                    ("forwarded", &format!("for={forged}")),
                ],
            )
        };
        assert_eq!(
            ip.client_addr(&spoofed("198.51.100.1")),
            Ok(addr("203.0.113.7"))
        );
        // A new forged address per request does not buy a new bucket.
        assert!(same_bucket(ip.clone(), spoofed("198.51.100.1"), spoofed("198.51.100.2")).await);
        assert!(
            same_bucket(
                ip.clone(),
                from_peer("203.0.113.7:5000", &[]),
                spoofed("198.51.100.1")
            )
            .await
        );
        // Nor does a garbage header get an untrusted client refused: it is not read at all.
        assert_eq!(
            ip.client_addr(&spoofed("not-an-ip")),
            Ok(addr("203.0.113.7"))
        );
    }
}

// ---------------------------------------------------------------------------------------
// ClientIp: trusted proxies

fn behind_proxies() -> ClientIp {
    ClientIp::new()
        .trusted_proxies(["10.0.0.0/8", "192.168.0.0/16", "fd00::/8", "172.16.5.4"])
        .unwrap()
}

#[tokio::test]
async fn trusted_hops_are_skipped_to_the_rightmost_untrusted_address() {
    let ip = behind_proxies();
    // client (spoofed entry) -> 203.0.113.50 -> 172.16.5.4 -> 192.168.1.1 -> 10.1.2.3 -> us
    let chain = "198.51.100.9, 203.0.113.50, 172.16.5.4, 192.168.1.1, 10.1.2.3";
    let via = |chain: &str| from_peer("10.0.0.1:40000", &[("x-forwarded-for", chain)]);
    assert_eq!(ip.client_addr(&via(chain)), Ok(addr("203.0.113.50")));
    // Entries with ports and bracketed IPv6 hops count too.
    assert_eq!(
        ip.client_addr(&via("203.0.113.50:1234, [fd00::1]:443, 10.1.2.3")),
        Ok(addr("203.0.113.50"))
    );
    assert_eq!(
        ip.client_addr(&via("2001:db8::7, fd12::1")),
        Ok(addr("2001:db8::7"))
    );

    // The forwarded client shares a bucket with the same client connecting directly,
    // whatever it wrote to the left of its own address, and not with the spoofed one.
    assert!(same_bucket(ip.clone(), via(chain), from_peer("203.0.113.50:1", &[])).await);
    assert!(
        same_bucket(
            ip.clone(),
            via(chain),
            via("192.0.2.1, 203.0.113.50, 10.9.9.9")
        )
        .await
    );
    assert!(!same_bucket(ip.clone(), via(chain), from_peer("198.51.100.9:1", &[])).await);
    // The proxy's own address is never the key: two clients behind it stay apart.
    assert!(!same_bucket(ip, via("203.0.113.50"), via("203.0.113.51")).await);
}

#[tokio::test]
async fn several_x_forwarded_for_lines_read_as_one_list() {
    let ip = behind_proxies();
    let lines = |lines: &[&str]| {
        let mut request = from_peer("10.0.0.1:40000", &[]);
        for line in lines {
            request
                .headers_mut()
                .append("x-forwarded-for", HeaderValue::from_str(line).unwrap());
        }
        request
    };
    assert_eq!(
        ip.client_addr(&lines(&["198.51.100.9", "203.0.113.50, 10.1.2.3"])),
        Ok(addr("203.0.113.50"))
    );
    // The last line holds only trusted hops: the client is on an earlier line.
    assert_eq!(
        ip.client_addr(&lines(&[
            "198.51.100.9, 203.0.113.50",
            "10.1.2.3",
            "192.168.0.7"
        ])),
        Ok(addr("203.0.113.50"))
    );
    assert!(
        same_bucket(
            ip,
            lines(&["203.0.113.50", "10.1.2.3"]),
            lines(&["203.0.113.50, 10.1.2.3"])
        )
        .await
    );
}

#[tokio::test]
async fn a_single_address_header_of_a_trusted_proxy_names_the_client() {
    let ip = behind_proxies().forwarded_header(HeaderName::from_static("cf-connecting-ip"));
    let from = |peer: &str, client: &str| {
        from_peer(
            peer,
            &[
                ("cf-connecting-ip", client),
                ("x-forwarded-for", "198.51.100.77"),
            ],
        )
    };

    // From a trusted proxy, the header's address is the key, IPv6 grouped as usual, and
    // X-Forwarded-For is not read.
    assert_eq!(
        ip.client_addr(&from("10.0.0.1:40000", "203.0.113.50")),
        Ok(addr("203.0.113.50"))
    );
    assert_eq!(
        extract(&ip, &from("10.0.0.1:40000", "2001:db8::7")).await,
        Some(Caller::new("2001:db8::/64"))
    );
    assert!(
        same_bucket(
            ip.clone(),
            from("10.0.0.1:40000", "203.0.113.50"),
            from("10.0.0.2:40000", "203.0.113.50")
        )
        .await
    );
    assert!(
        same_bucket(
            ip.clone(),
            from("10.0.0.1:40000", "203.0.113.50"),
            from_peer("203.0.113.50:1", &[])
        )
        .await
    );
    assert!(
        !same_bucket(
            ip.clone(),
            from("10.0.0.1:40000", "203.0.113.50"),
            from("10.0.0.1:40000", "203.0.113.51")
        )
        .await
    );
    // A trusted proxy that sent no such header: its own address is not used.
    assert_eq!(
        ip.client_addr(&from_peer(
            "10.0.0.1:40000",
            &[("x-forwarded-for", "203.0.113.50")]
        )),
        Ok(None)
    );

    // From an untrusted peer the header is ignored: the peer is the client, whatever it
    // writes there.
    assert_eq!(
        ip.client_addr(&from("203.0.113.7:5000", "198.51.100.1")),
        Ok(addr("203.0.113.7"))
    );
    assert_eq!(
        ip.client_addr(&from("203.0.113.7:5000", "not-an-ip")),
        Ok(addr("203.0.113.7"))
    );
    assert!(
        same_bucket(
            ip,
            from("203.0.113.7:5000", "198.51.100.1"),
            from("203.0.113.7:5000", "198.51.100.2")
        )
        .await
    );
}

#[tokio::test]
async fn rfc_7239_forwarded_with_quoted_ipv6_and_ports() {
    let ip = behind_proxies().forwarded_header(FORWARDED);
    let via = |value: &str| from_peer("10.0.0.1:40000", &[("forwarded", value)]);
    assert_eq!(
        ip.client_addr(&via(
            r#"for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.5"#
        )),
        Ok(addr("2001:db8:cafe::17"))
    );
    assert_eq!(
        ip.client_addr(&via(
            r#"for=198.51.100.9, For="203.0.113.50:8080";by=10.0.0.1, for="[fd00::2]""#
        )),
        Ok(addr("203.0.113.50"))
    );
    assert_eq!(
        ip.client_addr(&via(r#"proto=https;for="[2001:db8::1]""#)),
        Ok(addr("2001:db8::1"))
    );
    // X-Forwarded-For is not read when Forwarded is the configured header.
    assert_eq!(
        ip.client_addr(&from_peer(
            "10.0.0.1:40000",
            &[("x-forwarded-for", "203.0.113.50")]
        )),
        Ok(None)
    );
    // With the header chosen, the client is counted like any other.
    assert!(
        same_bucket(
            ip.clone(),
            via(r#"for="[2001:db8:cafe::17]:4711""#),
            via(r#"for="[2001:db8:cafe::99]", for=10.0.0.5"#)
        )
        .await
    );
    assert!(
        !same_bucket(
            ip,
            via(r#"for="203.0.113.50:8080""#),
            via(r#"for="203.0.113.51:8080""#)
        )
        .await
    );
}

#[tokio::test]
async fn ipv6_peers_are_grouped_by_64_by_default() {
    let ip = ClientIp::new();
    assert!(
        same_bucket(
            ip.clone(),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:2:ffff:eeee:dddd:cccc]:443", &[])
        )
        .await
    );
    assert!(
        !same_bucket(
            ip.clone(),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:3::1]:443", &[])
        )
        .await
    );
    // The same grouping applies to forwarded IPv6 clients.
    let proxied = behind_proxies();
    assert!(
        same_bucket(
            proxied,
            from_peer("10.0.0.1:1", &[("x-forwarded-for", "2001:db8:1:2::1")]),
            from_peer("[2001:db8:1:2::abcd]:9", &[])
        )
        .await
    );
    // Other prefixes group accordingly.
    assert!(
        same_bucket(
            ip.ipv6_prefix(48),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:3::1]:443", &[])
        )
        .await
    );
}

#[tokio::test]
async fn ipv6_prefix_128_keys_every_address() {
    let ip = ClientIp::new().ipv6_prefix(128);
    assert!(
        !same_bucket(
            ip.clone(),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:2::2]:443", &[])
        )
        .await
    );
    assert!(
        same_bucket(
            ip.clone(),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:2::1]:8443", &[])
        )
        .await
    );
    // Above 128 is taken as 128.
    assert!(
        !same_bucket(
            ClientIp::new().ipv6_prefix(200),
            from_peer("[2001:db8:1:2::1]:443", &[]),
            from_peer("[2001:db8:1:2::2]:443", &[])
        )
        .await
    );
}

#[tokio::test]
async fn ipv4_mapped_ipv6_counts_as_ipv4() {
    let ip = ClientIp::new();
    assert_eq!(
        ip.client_addr(&from_peer("[::ffff:203.0.113.7]:443", &[])),
        Ok(addr("203.0.113.7"))
    );
    assert!(
        same_bucket(
            ip.clone(),
            from_peer("[::ffff:203.0.113.7]:443", &[]),
            from_peer("203.0.113.7:80", &[])
        )
        .await
    );
    // Not grouped with its IPv4 neighbours as a /64 would.
    assert!(
        !same_bucket(
            ip,
            from_peer("[::ffff:203.0.113.7]:443", &[]),
            from_peer("[::ffff:203.0.113.8]:443", &[])
        )
        .await
    );
    // A mapped proxy address is trusted by its IPv4 network, and a mapped forwarded
    // client is its IPv4 self.
    let proxied = behind_proxies();
    assert_eq!(
        proxied.client_addr(&from_peer(
            "[::ffff:10.0.0.1]:443",
            &[("x-forwarded-for", "::ffff:203.0.113.7, ::ffff:10.2.3.4")]
        )),
        Ok(addr("203.0.113.7"))
    );
}

#[test]
fn ipv4_mapped_cidr_blocks_are_accepted() {
    let mapped = ClientIp::new()
        .trusted_proxies(["::ffff:10.0.0.0/104"])
        .expect("a valid CIDR block");
    assert!(mapped.trusts("10.1.2.3".parse().unwrap()));
    assert!(mapped.trusts("::ffff:10.1.2.3".parse().unwrap()));
    assert!(!mapped.trusts("11.0.0.1".parse().unwrap()));
    let all_mapped = ClientIp::new()
        .trusted_proxies(["::ffff:0:0/96"])
        .expect("a valid CIDR block");
    assert!(all_mapped.trusts("203.0.113.7".parse().unwrap()));
    assert!(!all_mapped.trusts("2001:db8::1".parse().unwrap()));
}

// ---------------------------------------------------------------------------------------
// No key: all-trusted chains, `unknown`, and the layer's MissingKey choice

#[tokio::test]
async fn an_all_trusted_chain_or_unknown_gives_no_key() {
    let ip = behind_proxies();
    let via = |chain: &str| from_peer("10.0.0.1:40000", &[("x-forwarded-for", chain)]);
    for chain in [
        "10.0.0.2, 10.0.0.3",
        "192.168.1.1",
        "unknown, 10.0.0.2",
        "203.0.113.5, unknown",
        "_hidden",
    ] {
        assert_eq!(ip.client_addr(&via(chain)), Ok(None), "{chain}");
    }
    // A trusted peer that sent no forwarding header at all: its own address is not used.
    assert_eq!(ip.client_addr(&from_peer("10.0.0.1:40000", &[])), Ok(None));
    let forwarded = behind_proxies().forwarded_header(FORWARDED);
    assert_eq!(
        forwarded.client_addr(&from_peer("10.0.0.1:1", &[("forwarded", "for=unknown")])),
        Ok(None)
    );

    let mut svc = service(ip);
    for chain in ["10.0.0.2, 10.0.0.3", "unknown"] {
        assert_problem(&send(&mut svc, via(chain)).await, StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test]
async fn missing_key_reject_answers_a_problem() {
    let mut svc = service(HeaderKey::new("x-customer-id"));
    let reply = send(&mut svc, get("/", &[])).await;
    assert_problem(&reply, StatusCode::UNAUTHORIZED);
    assert!(reply.extensions.get::<Decision>().is_none());
    assert!(reply.headers.get("ratelimit").is_none());

    // The default is 400; a status that is not 4xx is taken as 400.
    let mut default = BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(one_per_hour())
                    .decision_on_every_response(true)
                    .key(HeaderKey::new("x-customer-id")),
            )
            .service(service_fn(ok_handler)),
    );
    assert_problem(
        &send(&mut default, get("/", &[])).await,
        StatusCode::BAD_REQUEST,
    );
    let mut not_4xx = layered(
        one_per_hour(),
        HeaderKey::new("x-customer-id"),
        MissingKey::Reject(StatusCode::OK),
    );
    assert_problem(
        &send(&mut not_4xx, get("/", &[])).await,
        StatusCode::BAD_REQUEST,
    );
}

#[tokio::test]
async fn missing_key_anonymous_shares_one_bucket() {
    let mut svc = layered(one_per_hour(), behind_proxies(), MissingKey::Anonymous);
    let all_trusted = || from_peer("10.0.0.1:1", &[("x-forwarded-for", "10.0.0.2")]);
    let unknown = || from_peer("10.0.0.1:1", &[("x-forwarded-for", "unknown")]);
    let first = send(&mut svc, all_trusted()).await;
    assert_eq!(first.status, 200);
    assert!(matches!(decision(&first), Decision::Allowed(_)));
    // Another keyless request, for another reason, lands in the same bucket.
    let second = send(&mut svc, unknown()).await;
    assert_eq!(second.status, 429);
    assert!(matches!(decision(&second), Decision::Limited(_)));
    // A real client is unaffected.
    assert_eq!(
        send(&mut svc, from_peer("203.0.113.7:1", &[])).await.status,
        200
    );
}

#[tokio::test]
async fn the_anonymous_bucket_never_meets_a_caller_named_anonymous() {
    let mut svc = layered(
        one_per_hour(),
        HeaderKey::new("x-customer-id"),
        MissingKey::Anonymous,
    );
    let named = |name: &str| get("/", &[("x-customer-id", name)]);
    assert_eq!(send(&mut svc, get("/", &[])).await.status, 200);
    for name in ["anonymous", "<anonymous>", "?", "*"] {
        assert_eq!(send(&mut svc, named(name)).await.status, 200, "{name}");
    }
    assert_eq!(send(&mut svc, get("/", &[])).await.status, 429);
    assert_eq!(send(&mut svc, named("anonymous")).await.status, 429);
    assert_ne!(CallerKey::anonymous(), CallerKey::new("anonymous"));
}

#[tokio::test]
async fn missing_key_pass_lets_requests_through_uncounted() {
    let mut svc = layered(
        one_per_hour(),
        HeaderKey::new("x-customer-id"),
        MissingKey::Pass,
    );
    for _ in 0..5 {
        let reply = send(&mut svc, get("/", &[])).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "ok");
        assert_eq!(
            decision(&reply),
            &Decision::Unlimited(UnlimitedReason::NoKey)
        );
        assert!(reply.headers.get("ratelimit").is_none());
        assert!(reply.headers.get("ratelimit-policy").is_none());
    }
    // Keyed callers are still limited.
    assert_eq!(
        send(&mut svc, get("/", &[("x-customer-id", "acme")]))
            .await
            .status,
        200
    );
    assert_eq!(
        send(&mut svc, get("/", &[("x-customer-id", "acme")]))
            .await
            .status,
        429
    );

    // A client IP layer passes the keyless requests of a trusted proxy the same way.
    let mut proxied = layered(one_per_hour(), behind_proxies(), MissingKey::Pass);
    for _ in 0..3 {
        let reply = send(
            &mut proxied,
            from_peer("10.0.0.1:1", &[("x-forwarded-for", "unknown")]),
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            decision(&reply),
            &Decision::Unlimited(UnlimitedReason::NoKey)
        );
    }
}
