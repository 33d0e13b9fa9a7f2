//! Hostile input: oversized, non-UTF-8 and brace-laden keys, garbage forwarding headers.
//! Every answer is a normal decision or a clear 4xx, never a panic or a 5xx.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use support::http::{Reply, get, ok_handler, send};
use tollgate::{
    CallerKey, ClientIp, ForwardedHeader, HeaderKey, KeyExtractor, Limiter, MAX_KEY_BYTES,
    MissingKey, Policy, Quota, RateLimitLayer, ResponseBody, TrustedProxies,
};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, service_fn};

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

/// One request per hour, and a roomy daily policy beside it.
fn one_per_hour() -> Limiter {
    Limiter::builder()
        .policy(Policy::sliding_window("per-hour", Quota::per_hour(1)))
        .policy(Policy::sliding_window("per-day", Quota::per_day(1_000)))
        .build()
}

fn layered<K: KeyExtractor>(key: K, missing: MissingKey) -> Svc {
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(one_per_hour())
                    .key(key)
                    .on_missing_key(missing),
            )
            .service(service_fn(ok_handler)),
    )
}

fn by_customer() -> Svc {
    layered(
        HeaderKey::new("x-customer-id"),
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
    )
}

/// A request with the given header values, which may hold any bytes a header can.
fn with_header(name: &str, values: &[&[u8]]) -> Request<Full<Bytes>> {
    let mut request = get("/", &[]);
    for value in values {
        request.headers_mut().append(
            HeaderName::try_from(name).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    request
}

fn customer(key: &[u8]) -> Request<Full<Bytes>> {
    with_header("x-customer-id", &[key])
}

/// A request that a trusted proxy (10.0.0.1) forwarded with these header values.
fn proxied(name: &str, values: &[&[u8]]) -> Request<Full<Bytes>> {
    let mut request = with_header(name, values);
    request
        .extensions_mut()
        .insert(ConnectInfo("10.0.0.1:40000".parse::<SocketAddr>().unwrap()));
    request
}

fn behind_proxy(header: ForwardedHeader) -> ClientIp {
    ClientIp::new()
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8", "fd00::/8"]).unwrap())
        .forwarded_header(header)
}

/// A normal decision or a clear 4xx with a problem body; never a 5xx.
fn assert_sane(reply: &Reply, what: &str) {
    let status = reply.status.as_u16();
    assert!(
        matches!(status, 200 | 400 | 401 | 429),
        "{what}: answered {status}: {reply:?}"
    );
    if status != 200 {
        assert_eq!(
            reply.headers.get(http::header::CONTENT_TYPE).unwrap(),
            "application/problem+json",
            "{what}"
        );
        assert_eq!(reply.json()["status"], status, "{what}");
    }
}

/// Sends each key once (all must be admitted: no two share a bucket), then once more
/// (all must be refused: each has its own bucket, and it is the same one again).
async fn assert_all_apart(svc: &mut Svc, keys: &[Vec<u8>]) {
    for key in keys {
        let reply = send(svc, customer(key)).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{:?} shares a bucket with an earlier key",
            CallerKey::new(key)
        );
    }
    for key in keys {
        let reply = send(svc, customer(key)).await;
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{:?} was not counted under its own key",
            CallerKey::new(key)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Keys

#[tokio::test]
async fn a_ten_kilobyte_key_is_hashed_and_kept_apart() {
    let prefix = vec![b'k'; 10 * 1024];
    let long = |last: u8| {
        let mut key = prefix.clone();
        key.push(last);
        key
    };
    let caller = HeaderKey::new("x-customer-id")
        .extract(&customer(&long(b'a')))
        .await
        .unwrap()
        .unwrap();
    assert!(caller.key().is_digest());
    assert!(caller.key().encoded().len() <= 1 + MAX_KEY_BYTES);

    let mut svc = by_customer();
    // Same 10 KB key: one bucket. Two 10 KB keys that differ only in their last byte: two.
    let first = send(&mut svc, customer(&long(b'a'))).await;
    assert_eq!(first.status, StatusCode::OK);
    let other = send(&mut svc, customer(&long(b'b'))).await;
    assert_eq!(other.status, StatusCode::OK);
    let again = send(&mut svc, customer(&long(b'a'))).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    // Nor does a key equal to the common prefix, or a 128-byte prefix of it, share one.
    assert_all_apart(
        &mut svc,
        &[
            prefix.clone(),
            prefix[..MAX_KEY_BYTES].to_vec(),
            prefix[..MAX_KEY_BYTES + 1].to_vec(),
        ],
    )
    .await;
    // The refusal does not echo the key back.
    assert!(again.body.len() < 1024, "{} bytes", again.body.len());
    assert!(!again.headers.iter().any(|(_, v)| v.len() > 1024));
}

#[tokio::test]
async fn a_raw_key_never_meets_a_digest() {
    // Find a long key whose SHA-256 digest is itself a valid header value, then send the
    // digest's bytes as a key of their own.
    let (long, digest) = (0u32..)
        .map(|i| format!("{i:0>200}").into_bytes())
        .find_map(|long| {
            let digest = CallerKey::new(&long).encoded()[1..].to_vec();
            HeaderValue::from_bytes(&digest)
                .is_ok()
                .then_some((long, digest))
        })
        .unwrap();
    let mut svc = by_customer();
    assert_all_apart(&mut svc, &[long, digest]).await;
}

#[tokio::test]
async fn non_utf8_keys_are_counted_byte_for_byte() {
    let keys: Vec<Vec<u8>> = vec![
        b"\xff".to_vec(),
        b"\xfe".to_vec(),
        b"\xff\xfe".to_vec(),
        b"caf\xe9".to_vec(),
        "café".as_bytes().to_vec(),
        "caf\u{fffd}".as_bytes().to_vec(),
        b"caf\\xe9".to_vec(),
        b"\x80\x81\x82".to_vec(),
        b"tab\there".to_vec(),
        vec![0xa0; 300],
        vec![0xa1; 300],
    ];
    let mut svc = by_customer();
    assert_all_apart(&mut svc, &keys).await;
}

#[tokio::test]
async fn braces_and_separators_never_merge_keys() {
    let keys: Vec<Vec<u8>> = [
        "acme",
        "acme}",
        "{acme}",
        "{acme",
        "acme:per-second",
        "acme:per-hour",
        "rl:{acme}",
        "rl:{acme}:per-hour",
        "rl:acme",
        "{acme}:per-hour",
        "ACME",
        "acme%7D",
        "=acme",
        "#acme",
        "?",
        "*",
        "anonymous",
        "acme\\}",
        "acme\"",
        "acme,globex",
        "acme;globex",
        "}{",
        "{}",
        ":",
    ]
    .iter()
    .map(|k| k.as_bytes().to_vec())
    .collect();
    let mut svc = by_customer();
    assert_all_apart(&mut svc, &keys).await;
}

#[tokio::test]
async fn non_utf8_and_odd_values_in_any_header_are_harmless() {
    // Keyed by IP from an untrusted peer: whatever the forwarding headers hold is ignored.
    let mut by_ip = layered(
        ClientIp::new(),
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
    );
    let mut request = with_header("x-forwarded-for", &[b"\xff\xfe", b"\x80"]);
    request.headers_mut().append(
        http::header::FORWARDED,
        HeaderValue::from_bytes(b"for=\xff").unwrap(),
    );
    request
        .extensions_mut()
        .insert(ConnectInfo("203.0.113.7:1".parse::<SocketAddr>().unwrap()));
    let reply = send(&mut by_ip, request).await;
    assert_eq!(reply.status, StatusCode::OK);

    // The same bytes from a trusted proxy cannot be read: a 400, not a 5xx.
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let name = match header {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        };
        let mut svc = layered(behind_proxy(header), MissingKey::Anonymous);
        let reply = send(&mut svc, proxied(name, &[b"1.2.3.4\xff"])).await;
        assert_sane(&reply, name);
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Garbage forwarding headers from a trusted proxy

fn garbage_x_forwarded_for() -> Vec<Vec<Vec<u8>>> {
    let one = |s: &str| vec![s.as_bytes().to_vec()];
    let mut cases = vec![
        one("not-an-ip"),
        one("1.2.3.4.5"),
        one("256.1.1.1"),
        one("[::1"),
        one("::1]"),
        one("[::1]:"),
        one("[::1]:99999"),
        one("[1.2.3.4]"),
        one("[]"),
        one("1.2.3.4:"),
        one("1.2.3.4:99999"),
        one("1.2.3.4 5.6.7.8"),
        one("fe80::1%eth0"),
        one("for=1.2.3.4"),
        one("\"1.2.3.4\""),
        one(""),
        one(" "),
        one("\t"),
        one(","),
        one(" , ,\t,"),
        one("1.2.3.4,,,,"),
        one(",,,,1.2.3.4"),
        one("unknown"),
        one("UNKNOWN, 10.0.0.2"),
        one("_"),
        one("_obfuscated, garbage"),
        one("garbage, 203.0.113.5"),
        one("203.0.113.5, garbage"),
        one("203.0.113.5, 10.0.0.2, garbage"),
        one(&",".repeat(1000)),
        one(&"1.2.3.4, ".repeat(10_000)),
        one(&"10.0.0.2, ".repeat(10_000)),
        one(&"x".repeat(64 * 1024)),
        one(&"[".repeat(1000)),
        one(&":".repeat(1000)),
        one(&"9".repeat(1000)),
        vec![b"\xff\xfe".to_vec()],
        vec![b"1.2.3.4, \x80".to_vec()],
        vec![b"203.0.113.5".to_vec(), b"\xff".to_vec()],
        vec![b"garbage".to_vec(), b"203.0.113.5".to_vec()],
        vec![Vec::new(), Vec::new(), Vec::new()],
    ];
    cases.extend((0..20).map(|_| vec![b",".to_vec()]));
    cases
}

fn garbage_forwarded() -> Vec<Vec<Vec<u8>>> {
    let one = |s: &str| vec![s.as_bytes().to_vec()];
    vec![
        one("for="),
        one("for"),
        one("for=\""),
        one("for=\"\""),
        one("for=\"[::1]"),
        one("for=\"[::1]:\""),
        one("for=[::1"),
        one("for=not-an-ip"),
        one("for=1.2.3.4.5"),
        one("for=\"1.2.3.4, 5.6.7.8\""),
        one("for=1.2.3.4;for=5.6.7.8"),
        one("by=1.2.3.4"),
        one("proto=https"),
        one(";;;;"),
        one("=;=;="),
        one("==="),
        one("for==1.2.3.4"),
        one("for=\"_hidden\""),
        one("for=unknown"),
        one(""),
        one(&",".repeat(1000)),
        one(&";".repeat(1000)),
        one(&"for=1.2.3.4, ".repeat(10_000)),
        one(&"for=\"".repeat(1000)),
        one(&"x".repeat(64 * 1024)),
        vec![b"for=\xff".to_vec()],
        vec![b"for=203.0.113.5".to_vec(), b"for=garbage".to_vec()],
    ]
}

async fn assert_garbage_is_harmless(header: ForwardedHeader, name: &str, cases: Vec<Vec<Vec<u8>>>) {
    for missing in [
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
        MissingKey::Anonymous,
        MissingKey::Pass,
    ] {
        let mut svc = layered(behind_proxy(header), missing);
        for values in &cases {
            let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let what = format!(
                "{name} {:?} with {missing:?}",
                values
                    .iter()
                    .map(|v| String::from_utf8_lossy(&v[..v.len().min(40)]))
                    .collect::<Vec<_>>()
            );
            let reply = send(&mut svc, proxied(name, &values)).await;
            assert_sane(&reply, &what);
        }
    }
}

#[tokio::test]
async fn garbage_x_forwarded_for_from_a_trusted_proxy() {
    assert_garbage_is_harmless(
        ForwardedHeader::XForwardedFor,
        "x-forwarded-for",
        garbage_x_forwarded_for(),
    )
    .await;
}

#[tokio::test]
async fn garbage_forwarded_from_a_trusted_proxy() {
    assert_garbage_is_harmless(ForwardedHeader::Forwarded, "forwarded", garbage_forwarded()).await;
}

#[tokio::test]
async fn garbage_entries_are_refused_with_400_not_skipped_past() {
    // An unreadable entry to the right of the client is a 400: the chain cannot be trusted.
    // One to the left (written by the client itself) is never reached.
    let ip = behind_proxy(ForwardedHeader::XForwardedFor);
    let via = |chain: &str| proxied("x-forwarded-for", &[chain.as_bytes()]);
    assert!(ip.client_addr(&via("203.0.113.5, garbage")).is_err());
    assert_eq!(
        ip.client_addr(&via("garbage, 203.0.113.5")),
        Ok(Some("203.0.113.5".parse().unwrap()))
    );
    let rejection = ip.client_addr(&via("1.2.3.4.5")).unwrap_err();
    assert_eq!(rejection.status(), StatusCode::BAD_REQUEST);

    let mut svc = layered(ip, MissingKey::Anonymous);
    let reply = send(&mut svc, via("1.2.3.4.5")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_sane(&reply, "1.2.3.4.5");
}

// ---------------------------------------------------------------------------------------
// Arbitrary bytes

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Bytes that look a little like forwarding headers, to reach deeper into the parsers.
fn forwarding_like() -> impl Strategy<Value = Vec<u8>> {
    let alphabet: Vec<u8> = b"0123456789abcdefABCDEF:.[]%, ;\"=_-xunkowfrbypt\t\xff".to_vec();
    proptest::collection::vec(proptest::sample::select(alphabet), 0..120)
}

/// Any bytes a header value can hold: every octet but the controls (tab excepted) and DEL.
fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    let octets: Vec<u8> = (0..=255u8)
        .filter(|b| *b == b'\t' || (*b >= 0x20 && *b != 0x7f))
        .collect();
    proptest::collection::vec(proptest::sample::select(octets), 0..300)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_key_bytes_are_counted_never_5xx(key in any_bytes()) {
        runtime().block_on(async {
            let mut svc = by_customer();
            let first = send(&mut svc, customer(&key)).await;
            let second = send(&mut svc, customer(&key)).await;
            assert_sane(&first, "first");
            assert_sane(&second, "second");
            if key.is_empty() {
                assert_eq!(first.status, StatusCode::UNAUTHORIZED);
            } else {
                assert_eq!(first.status, StatusCode::OK);
                assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
            }
        });
    }

    #[test]
    fn arbitrary_forwarding_bytes_never_5xx(
        xff in prop_oneof![any_bytes(), forwarding_like()],
        forwarded in prop_oneof![any_bytes(), forwarding_like()],
        key in any_bytes(),
    ) {
        runtime().block_on(async {
            for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
                for missing in [
                    MissingKey::Reject(StatusCode::UNAUTHORIZED),
                    MissingKey::Anonymous,
                    MissingKey::Pass,
                ] {
                    let mut svc = layered(behind_proxy(header), missing);
                    for _ in 0..2 {
                        let mut request = proxied("x-forwarded-for", &[&xff]);
                        let headers = request.headers_mut();
                        headers.insert(http::header::FORWARDED, HeaderValue::from_bytes(&forwarded).unwrap());
                        headers.insert("x-customer-id", HeaderValue::from_bytes(&key).unwrap());
                        let reply = send(&mut svc, request).await;
                        assert_sane(&reply, &format!("{header:?} {missing:?}"));
                    }
                }
            }
        });
    }
}
