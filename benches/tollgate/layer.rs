//! Group `layer`: the tower layer on an in-memory service vs tower_governor, and the bare
//! service.

use std::convert::Infallible;

use axum::body::Body;
use criterion::{Criterion, Throughput};
use http::{Request, Response};
use tollgate::response::{HeaderMode, InnerBody};
use tollgate::{InMemoryBackend, Limiter, RateLimitLayer, key::HeaderKey};
use tower::ServiceBuilder;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;

use crate::report::{Row, ns, write_rows};
use crate::support::{CUSTOMER, big_bucket, drive, in_rounds};

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
    let layer = |mode: HeaderMode, decision_on_every_response: bool| {
        let limiter = Limiter::builder()
            .name("layer")
            .backend(InMemoryBackend::new())
            .policy(big_bucket())
            .build();
        RateLimitLayer::new(limiter)
            .key(HeaderKey::new("x-customer-id"))
            .headers(mode)
            .decision_on_every_response(decision_on_every_response)
    };
    // In axum's own body type, as the README mounts the layer in a router.
    let tollgate = |mode: HeaderMode, decision_on_every_response: bool| {
        ServiceBuilder::new()
            .layer(layer(mode, decision_on_every_response).response_body::<InnerBody>())
            .service(orders)
    };
    let governed = |builder: &mut GovernorConfigBuilder<_, _>| {
        builder
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .key_extractor(CustomerHeader)
    };

    // The default: the decision in the extensions of refusals only.
    let with_headers = tollgate(HeaderMode::Always, false);
    // Like tower_governor without headers, nothing added to an admitted response.
    let without_headers = tollgate(HeaderMode::Never, false);
    let with_extension = tollgate(HeaderMode::Never, true);
    // The default shape, which wraps the body (any body type).
    let wrapped = ServiceBuilder::new()
        .layer(layer(HeaderMode::Never, false))
        .service(orders);
    let config = governed(&mut GovernorConfigBuilder::default())
        .use_headers()
        .finish()
        .expect("governor config");
    let governor_headers = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);
    let config = governed(&mut GovernorConfigBuilder::default())
        .finish()
        .expect("governor config");
    let governor_no_headers = ServiceBuilder::new()
        .layer(tower_governor::GovernorLayer::new(config))
        .service(orders);

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    let services = [
        "bare",
        "tollgate_headers",
        "tollgate_no_headers",
        "tollgate_extension",
        "tollgate_no_headers_wrapped",
        "tower_governor_headers",
        "tower_governor_no_headers",
    ];
    let rounds = in_rounds(&mut group, GROUP, &services, |b, name| match name {
        "bare" => drive(b, &runtime, &orders, &customers),
        "tollgate_headers" => drive(b, &runtime, &with_headers, &customers),
        "tollgate_no_headers" => drive(b, &runtime, &without_headers, &customers),
        "tollgate_extension" => drive(b, &runtime, &with_extension, &customers),
        "tollgate_no_headers_wrapped" => drive(b, &runtime, &wrapped, &customers),
        "tower_governor_headers" => drive(b, &runtime, &governor_headers, &customers),
        _ => drive(b, &runtime, &governor_no_headers, &customers),
    });
    group.finish();

    // A figure is the rounds' median; a ratio or a difference, the median of the rounds'.
    let mut rows = Vec::new();
    // (row, tollgate's bench, the one it is compared with, what is measured, that one's
    // label, the target if any)
    let compared = [
        (
            "layer/headers",
            "tollgate_headers",
            "tower_governor_headers",
            "Layer on an in-memory service answering in axum's body type (`response_body::<InnerBody>()`), 10,000 callers, RateLimit headers on allowed responses (`HeaderMode::Always`, the `Decision` on refusals only: the default)",
            "tower_governor `.use_headers()`",
            Some(1.0),
        ),
        (
            "layer/no_headers",
            "tollgate_no_headers",
            "tower_governor_no_headers",
            "Layer as above, nothing added to admitted responses (`HeaderMode::Never`)",
            "tower_governor without headers",
            Some(1.2),
        ),
        (
            "layer/extension",
            "tollgate_extension",
            "tollgate_no_headers",
            "Layer, no headers, the `Decision` in every response's extensions (`decision_on_every_response(true)`)",
            "on refusals only (the default)",
            None,
        ),
        (
            "layer/inner_body",
            "tollgate_no_headers",
            "tollgate_no_headers_wrapped",
            "Layer, no headers, in axum's body type (`response_body::<InnerBody>()`, as the rows above)",
            "in the default `ResponseBody` wrapper",
            None,
        ),
    ];
    for (row, ours_id, peer_id, what, peer_label, target) in compared {
        let (Some(ours), Some(peer), Some(ratio)) = (
            rounds.time(ours_id),
            rounds.time(peer_id),
            rounds.ratio(ours_id, peer_id),
        ) else {
            continue;
        };
        let mut compared = Row::new(what, format!("{}/request", ns(ours)))
            .peer(format!("{peer_label}: {}/request", ns(peer)))
            .ratio(format!("{ratio:.2}x"));
        if let Some(target) = target {
            compared = compared.target(format!("≤ {target:.2}x"), ratio <= target);
        }
        rows.push((row, compared));
    }
    if let (Some(bare), Some(added)) = (
        rounds.time("bare"),
        rounds.median_of(|round| Some(round.get("tollgate_no_headers")? - round.get("bare")?)),
    ) {
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
    if let (Some(ours), Some(peer), Some(ratio)) = (
        rounds.median_of(|round| Some(round.get("tollgate_headers")? - round.get("bare")?)),
        rounds.median_of(|round| Some(round.get("tower_governor_headers")? - round.get("bare")?)),
        rounds.median_of(|round| {
            let bare = round.get("bare")?;
            Some(
                (round.get("tollgate_headers")? - bare)
                    / (round.get("tower_governor_headers")? - bare),
            )
        }),
    ) {
        rows.push((
            "layer/overhead_headers",
            Row::new(
                "Layer, RateLimit headers on: time added to the bare service",
                format!("+{}/request", ns(ours)),
            )
            .peer(format!("tower_governor with headers: +{}", ns(peer)))
            .ratio(format!("{ratio:.2}x")),
        ));
    }
    if !rows.is_empty() {
        write_rows("layer.tsv", &rows);
    }
}
