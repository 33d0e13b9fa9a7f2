//! Hostile input: oversized, non-UTF-8 and brace-laden keys, garbage forwarding headers.
//! Every answer is a normal decision or a clear 4xx, never a panic or a 5xx.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::header::FORWARDED;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tollgate::key::Extracted;
use tollgate::response::ResponseBody;
use tollgate::store::CallerKey;

const MAX_KEY_BYTES: usize = CallerKey::MAX_KEY_BYTES;
use tollgate::{
    Limiter, Policy, Quota, RateLimitLayer,
    key::{ClientIp, HeaderKey, KeyExtractor, MissingKey},
};
use tollgate_testkit::http::{Reply, get, ok_handler, send};
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

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

fn behind_proxy(header: &HeaderName) -> ClientIp {
    ClientIp::new()
        .trusted_proxies(["10.0.0.0/8", "fd00::/8"])
        .unwrap()
        .forwarded_header(header.clone())
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
    let Extracted::Caller(caller) = HeaderKey::new("x-customer-id").extract(&customer(&long(b'a')))
    else {
        panic!("a long key is still a key");
    };
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
    request
        .headers_mut()
        .append(FORWARDED, HeaderValue::from_bytes(b"for=\xff").unwrap());
    request
        .extensions_mut()
        .insert(ConnectInfo("203.0.113.7:1".parse::<SocketAddr>().unwrap()));
    let reply = send(&mut by_ip, request).await;
    assert_eq!(reply.status, StatusCode::OK);

    // The same bytes from a trusted proxy cannot be read: a 400, not a 5xx.
    let x_real_ip = HeaderName::from_static("x-real-ip");
    for header in [X_FORWARDED_FOR, FORWARDED, x_real_ip] {
        let name = header.as_str();
        let mut svc = layered(behind_proxy(&header), MissingKey::Anonymous);
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

async fn assert_garbage_is_harmless(header: HeaderName, cases: Vec<Vec<Vec<u8>>>) {
    let name = header.as_str();
    for missing in [
        MissingKey::Reject(StatusCode::UNAUTHORIZED),
        MissingKey::Anonymous,
        MissingKey::Pass,
    ] {
        let mut svc = layered(behind_proxy(&header), missing);
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
    assert_garbage_is_harmless(X_FORWARDED_FOR, garbage_x_forwarded_for()).await;
}

#[tokio::test]
async fn garbage_forwarded_from_a_trusted_proxy() {
    assert_garbage_is_harmless(FORWARDED, garbage_forwarded()).await;
}

#[tokio::test]
async fn garbage_entries_are_refused_with_400_not_skipped_past() {
    // An unreadable entry to the right of the client is a 400: the chain cannot be trusted.
    // One to the left (written by the client itself) is never reached.
    let ip = behind_proxy(&X_FORWARDED_FOR);
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
            for header in [X_FORWARDED_FOR, FORWARDED] {
                for missing in [
                    MissingKey::Reject(StatusCode::UNAUTHORIZED),
                    MissingKey::Anonymous,
                    MissingKey::Pass,
                ] {
                    let mut svc = layered(behind_proxy(&header), missing);
                    for _ in 0..2 {
                        let mut request = proxied("x-forwarded-for", &[&xff]);
                        let headers = request.headers_mut();
                        headers.insert(FORWARDED, HeaderValue::from_bytes(&forwarded).unwrap());
                        headers.insert("x-customer-id", HeaderValue::from_bytes(&key).unwrap());
                        let reply = send(&mut svc, request).await;
                        assert_sane(&reply, &format!("{header} {missing:?}"));
                    }
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------------------
// Bytes left of the client are never read

#[tokio::test]
async fn non_ascii_left_of_the_client_is_never_read() {
    let client = Ok(Some("203.0.113.5".parse().unwrap()));
    let xff = behind_proxy(&X_FORWARDED_FOR);
    let forwarded = behind_proxy(&FORWARDED);

    // One header line: a client-written entry that is not UTF-8, left of the client.
    let line: &[u8] = b"caf\xc3\xa9 \xff, 203.0.113.5, 10.0.0.2";
    assert_eq!(
        xff.client_addr(&proxied("x-forwarded-for", &[line])),
        client
    );
    let line: &[u8] = b"for=\xff\xfe, for=203.0.113.5;proto=https, for=10.0.0.2";
    assert_eq!(
        forwarded.client_addr(&proxied("forwarded", &[line])),
        client
    );

    // Several lines of one header are one list: the unreadable line is left of the client.
    let lines: [&[u8]; 3] = [b"\x80garbage", b"203.0.113.5", b"10.0.0.2, fd00::9"];
    assert_eq!(xff.client_addr(&proxied("x-forwarded-for", &lines)), client);
    let lines: [&[u8]; 2] = [b"for=\"\x80\"", b"for=203.0.113.5, for=\"[fd00::9]:443\""];
    assert_eq!(forwarded.client_addr(&proxied("forwarded", &lines)), client);

    // A needed Forwarded element may carry obs-text in a parameter other than for=.
    let line: &[u8] = b"for=203.0.113.5;host=\"caf\xe9\", for=10.0.0.2";
    assert_eq!(
        forwarded.client_addr(&proxied("forwarded", &[line])),
        client
    );

    // Through the layer: a normal decision, counted under the client's address.
    let mut svc = layered(xff.clone(), MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let via = || proxied("x-forwarded-for", &[b"\xff, 203.0.113.5"]);
    assert_eq!(send(&mut svc, via()).await.status, StatusCode::OK);
    assert_eq!(
        send(&mut svc, via()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // An unreadable entry that must be read (right of the client) is still a 400.
    for (ip, name, line) in [
        (&xff, "x-forwarded-for", &b"203.0.113.5, \xff"[..]),
        (&xff, "x-forwarded-for", &b"203.0.113.5\xff"[..]),
        (&forwarded, "forwarded", &b"for=203.0.113.5, for=\xff"[..]),
    ] {
        let rejection = ip.client_addr(&proxied(name, &[line])).unwrap_err();
        assert_eq!(rejection.status(), StatusCode::BAD_REQUEST, "{line:?}");
    }
    let rejection = xff
        .client_addr(&proxied("x-forwarded-for", &[b"203.0.113.5", b"\xff"]))
        .unwrap_err();
    assert_eq!(rejection.status(), StatusCode::BAD_REQUEST);
}

/// An address that no trusted proxy of [`behind_proxy`] owns.
fn untrusted_addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
    .prop_filter("a trusted proxy's address", |addr| {
        !behind_proxy(&X_FORWARDED_FOR)
            .client_addr(&proxied("x-forwarded-for", &[addr.to_string().as_bytes()]))
            .is_ok_and(|found| found.is_none())
    })
}

/// Addresses of trusted proxies (10.0.0.0/8 and fd00::/8).
fn trusted_hops() -> impl Strategy<Value = Vec<IpAddr>> {
    let hop = prop_oneof![
        any::<[u8; 3]>().prop_map(|[a, b, c]| IpAddr::from([10, a, b, c])),
        any::<u128>().prop_map(|low| IpAddr::from(Ipv6Addr::from((0xfd_u128 << 120) | (low >> 8)))),
    ];
    proptest::collection::vec(hop, 0..4)
}

/// How a proxy writes `addr` into the header: bare, with a port, bracketed IPv6, and for
/// Forwarded as a (quoted) `for=` parameter among others.
fn written(header: &HeaderName, addr: IpAddr, port: Option<u16>) -> String {
    let node = match (addr, port) {
        (IpAddr::V4(v4), None) => v4.to_string(),
        (IpAddr::V4(v4), Some(port)) => format!("{v4}:{port}"),
        (IpAddr::V6(v6), None) => format!("[{v6}]"),
        (IpAddr::V6(v6), Some(port)) => format!("[{v6}]:{port}"),
    };
    if *header == FORWARDED {
        format!("proto=https;for=\"{node}\";by=_lb")
    } else {
        node
    }
}

/// The address as the extractor reports it: IPv4-mapped IPv6 counts as IPv4.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn garbage_left_of_the_client_never_hides_it(
        garbage in prop_oneof![any_bytes(), forwarding_like()],
        client in untrusted_addr(),
        port in proptest::option::of(any::<u16>()),
        hops in trusted_hops(),
        split in 0..3usize,
    ) {
        for header in [X_FORWARDED_FOR, FORWARDED] {
            let name = header.as_str();
            let right: Vec<String> = std::iter::once(written(&header, client, port))
                .chain(hops.iter().map(|hop| written(&header, *hop, None)))
                .collect();
            let right = right.join(", ");
            // The garbage ends its own entry (or its own header line) left of the client.
            let lines: Vec<Vec<u8>> = match split {
                0 => vec![[&garbage[..], b",", right.as_bytes()].concat()],
                1 => vec![garbage.clone(), right.into_bytes()],
                _ => vec![
                    garbage.clone(),
                    [&garbage[..], b", ", right.as_bytes()].concat(),
                ],
            };
            let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
            let ip = behind_proxy(&header);
            let found = ip.client_addr(&proxied(name, &lines));
            prop_assert_eq!(found, Ok(Some(canonical(client))), "{} {:?}", name, lines);

            runtime().block_on(async {
                let mut svc = layered(ip, MissingKey::Reject(StatusCode::UNAUTHORIZED));
                let first = send(&mut svc, proxied(name, &lines)).await;
                let second = send(&mut svc, proxied(name, &lines)).await;
                assert_sane(&first, name);
                assert_eq!(first.status, StatusCode::OK, "{name} {lines:?}");
                assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS, "{name} {lines:?}");
            });
        }
    }
}
