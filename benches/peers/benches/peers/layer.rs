//! Group `peers_layer`: the layer on an in-memory service, 10,000 callers named by a
//! header: tollgate's `RateLimitLayer` vs tower-rate-limiter's `RateLimitLayer` on its
//! in-memory GCRA, with RateLimit fields on allowed responses and without.

use std::convert::Infallible;
use std::sync::Arc;

use criterion::{Criterion, Throughput};
use http::{HeaderValue, Request, Response};
use tollgate::{InMemoryBackend, Limiter, key::HeaderKey, response::HeaderMode};
use tower::ServiceBuilder;
use tower_rate_limiter::{MemoryGcra, RateLimitError, RateLimitFields};

use crate::big_gcra;
use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{CALLERS, CUSTOMER, big_bucket, drive, wanted};

/// tower-rate-limiter's key extractor for the customer header.
#[derive(Clone, Debug)]
struct CustomerHeader;

impl tower_rate_limiter::KeyExtractor for CustomerHeader {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, RateLimitError> {
        request
            .headers()
            .get(&CUSTOMER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| RateLimitError::Key("missing".into(), "no x-customer-id".into()))
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "peers_layer";
    if !wanted(GROUP) {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let customers: Arc<[HeaderValue]> = (0..CALLERS)
        .map(|i| HeaderValue::try_from(format!("customer-{i:05}")).expect("header value"))
        .collect();
    let orders = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("[]")))
    });
    let tollgate = |mode: HeaderMode| {
        let limiter = Limiter::builder()
            .name("layer")
            .backend(InMemoryBackend::new())
            .policy(big_bucket())
            .build();
        ServiceBuilder::new()
            .layer(
                tollgate::RateLimitLayer::new(limiter)
                    .key(HeaderKey::new("x-customer-id"))
                    .headers(mode),
            )
            .service(orders)
    };
    let peer = |fields: RateLimitFields| {
        let layer = tower_rate_limiter::RateLimitLayer::builder(CustomerHeader)
            .policy_name("per-second")
            .with_policy(MemoryGcra::new(big_gcra()))
            .rate_limit_fields(fields)
            .build()
            .expect("tower-rate-limiter layer");
        ServiceBuilder::new().layer(layer).service(orders)
    };

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    let service = tollgate(HeaderMode::Always);
    group.bench_function("tollgate_headers", |b| {
        ran(GROUP, "tollgate_headers");
        drive(b, &runtime, &service, &customers)
    });
    let service = tollgate(HeaderMode::Never);
    group.bench_function("tollgate_no_headers", |b| {
        ran(GROUP, "tollgate_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    let service = peer(RateLimitFields::Draft11);
    group.bench_function("tower_rate_limiter_headers", |b| {
        ran(GROUP, "tower_rate_limiter_headers");
        drive(b, &runtime, &service, &customers)
    });
    let service = peer(RateLimitFields::Disabled);
    group.bench_function("tower_rate_limiter_no_headers", |b| {
        ran(GROUP, "tower_rate_limiter_no_headers");
        drive(b, &runtime, &service, &customers)
    });
    group.finish();

    let get = |id| median_ns(GROUP, id);
    let mut rows = Vec::new();
    for (row_id, ours, theirs, what, their_what) in [
        (
            "peers/layer_headers",
            "tollgate_headers",
            "tower_rate_limiter_headers",
            "RateLimit fields on allowed responses",
            "draft-11 fields",
        ),
        (
            "peers/layer_no_headers",
            "tollgate_no_headers",
            "tower_rate_limiter_no_headers",
            "no fields",
            "`RateLimitFields::Disabled`",
        ),
    ] {
        let (Some(ours), Some(peer)) = (get(ours), get(theirs)) else {
            continue;
        };
        rows.push((
            row_id,
            Row::new(
                format!(
                    "Layer on an in-memory service, 10,000 callers, {what}, vs tower-rate-limiter"
                ),
                format!("{}/request", ns(ours)),
            )
            .peer(format!(
                "tower-rate-limiter `MemoryGcra`, {their_what}: {}/request",
                ns(peer)
            ))
            .ratio(format!("{:.2}x", ours / peer)),
        ));
    }
    if !rows.is_empty() {
        write_rows("peers_layer.tsv", &rows);
    }
}
