//! Group `layer`: the tower layer on an in-memory service vs tower_governor, and the bare
//! service.

use std::convert::Infallible;

use axum::body::Body;
use criterion::{Criterion, Throughput};
use http::{Request, Response};
use tollgate::{InMemoryBackend, Limiter, RateLimitLayer, key::HeaderKey, response::HeaderMode};
use tower::ServiceBuilder;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;

use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{CUSTOMER, big_bucket, drive};

/// tower_governor's key extractor for the customer header, written as its docs suggest.
#[derive(Clone, Debug)]
struct CustomerHeader;

impl tower_governor::key_extractor::KeyExtractor for CustomerHeader {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get(&CUSTOMER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "layer";
    let (runtime, customers) = crate::support::layer_setup();
    let orders = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Body::from("[]")))
    });
    let tollgate = |mode: HeaderMode, decision_on_every_response: bool| {
        let limiter = Limiter::builder()
            .name("layer")
            .backend(InMemoryBackend::new())
            .policy(big_bucket())
            .build();
        ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(limiter)
                    .key(HeaderKey::new("x-customer-id"))
                    .headers(mode)
                    .decision_on_every_response(decision_on_every_response),
            )
            .service(orders)
    };
    let governed = |builder: &mut GovernorConfigBuilder<_, _>| {
        builder
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(CustomerHeader)
    };

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    group.bench_function("bare", |b| {
        ran(GROUP, "bare");
        drive(b, &runtime, &orders, &customers)
    });
    // The default: the decision in the extensions of refusals only.
    let service = tollgate(HeaderMode::Always, false);
    group.bench_function("tollgate_headers", |b| {
        ran(GROUP, "tollgate_headers");
        drive(b, &runtime, &service, &customers)
    });
    // Like tower_governor without headers, nothing added to an admitted response.
    let service = tollgate(HeaderMode::Never, false);
    group.bench_function("tollgate_no_headers", |b| {
        ran(GROUP, "tollgate_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    let service = tollgate(HeaderMode::Never, true);
    group.bench_function("tollgate_extension", |b| {
        ran(GROUP, "tollgate_extension");
        drive(b, &runtime, &service, &customers)
    });
    let config = governed(&mut GovernorConfigBuilder::default())
        .use_headers()
        .finish()
        .expect("governor config");
    let service = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);
    group.bench_function("tower_governor_headers", |b| {
        ran(GROUP, "tower_governor_headers");
        drive(b, &runtime, &service, &customers)
    });
    let config = governed(&mut GovernorConfigBuilder::default())
        .finish()
        .expect("governor config");
    let service = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);
    group.bench_function("tower_governor_no_headers", |b| {
        ran(GROUP, "tower_governor_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    group.finish();

    let get = |id| median_ns(GROUP, id);
    let mut rows = Vec::new();
    // (row, tollgate's bench, the peer's, what is measured, the peer's label, the target)
    let compared = [
        (
            "layer/headers",
            "tollgate_headers",
            "tower_governor_headers",
            "Layer on an in-memory service, 10,000 callers, RateLimit headers on allowed responses (`HeaderMode::Always`, the `Decision` on refusals only: the default)",
            "tower_governor `.use_headers()`",
            1.0,
        ),
        (
            "layer/no_headers",
            "tollgate_no_headers",
            "tower_governor_no_headers",
            "Layer on an in-memory service, 10,000 callers, nothing added to admitted responses (`HeaderMode::Never`)",
            "tower_governor without headers",
            1.2,
        ),
    ];
    for (row, ours, peer, what, peer_label, target) in compared {
        let (Some(ours), Some(peer)) = (get(ours), get(peer)) else {
            continue;
        };
        let ratio = ours / peer;
        rows.push((
            row,
            Row::new(what, format!("{}/request", ns(ours)))
                .peer(format!("{peer_label}: {}/request", ns(peer)))
                .ratio(format!("{ratio:.2}x"))
                .target(format!("≤ {target:.2}x"), ratio <= target),
        ));
    }
    if let (Some(ours), Some(bare)) = (get("tollgate_no_headers"), get("bare")) {
        let added = ours - bare;
        rows.push((
            "layer/overhead",
            Row::new(
                "Layer, no headers: time added to the bare service",
                format!("+{}/request", ns(added)),
            )
            .peer(format!("bare service: {}/request", ns(bare)))
            .ratio(format!("+{}", ns(added)))
            .target("≤ +300 ns", added <= 300.0),
        ));
    }
    if let (Some(ours), Some(bare), Some(peer)) = (
        get("tollgate_headers"),
        get("bare"),
        get("tower_governor_headers"),
    ) {
        rows.push((
            "layer/overhead_headers",
            Row::new(
                "Layer, RateLimit headers on: time added to the bare service",
                format!("+{}/request", ns(ours - bare)),
            )
            .peer(format!("tower_governor with headers: +{}", ns(peer - bare)))
            .ratio(format!("{:.2}x", (ours - bare) / (peer - bare))),
        ));
    }
    if let (Some(ours), Some(without)) = (get("tollgate_extension"), get("tollgate_no_headers")) {
        rows.push((
            "layer/extension",
            Row::new(
                "Layer, no headers, the `Decision` in every response's extensions (`decision_on_every_response(true)`)",
                format!("{}/request", ns(ours)),
            )
            .peer(format!("on refusals only (the default): {}/request", ns(without)))
            .ratio(format!("{:.2}x", ours / without)),
        ));
    }
    if !rows.is_empty() {
        write_rows("layer.tsv", &rows);
    }
}
