//! Group `settle`: a request reserved at an estimate and settled at what its response
//! reports (`RateLimitLayer::settle`), beside the same layer deciding a plain request, on
//! an in-memory service and the in-process store.

use std::convert::Infallible;

use axum::body::Body;
use criterion::{Criterion, Throughput};
use http::{Request, Response};
use tollgate::{InMemoryBackend, Limiter, RateLimitLayer, key::HeaderKey, response::HeaderMode};
use tower::ServiceBuilder;

use crate::report::{Row, median_ns, ns, ran, write_rows};
use crate::support::{big_bucket, drive, wanted};

pub(crate) fn bench(c: &mut Criterion) {
    const GROUP: &str = "settle";
    if !wanted(GROUP) {
        return;
    }
    let (runtime, customers) = crate::support::layer_setup();
    // The answer reports a use between 1 and 19 of the 10 reserved: a third of them given
    // back, a third charged more, a third exact, in turn.
    let used = std::sync::atomic::AtomicU64::new(0);
    let used = std::sync::Arc::new(used);
    let answer = {
        let used = used.clone();
        tower::service_fn(move |_request: Request<()>| {
            let n = used.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3;
            let tokens = [4, 10, 16][n as usize];
            async move {
                let mut response = Response::new(Body::from("{}"));
                response
                    .headers_mut()
                    .insert("x-tokens-used", http::HeaderValue::from(tokens));
                Ok::<_, Infallible>(response)
            }
        })
    };
    let layer = || {
        RateLimitLayer::new(
            Limiter::builder()
                .name("settle")
                .backend(InMemoryBackend::new())
                .policy(big_bucket())
                .build(),
        )
        .key(HeaderKey::new("x-customer-id"))
        .headers(HeaderMode::Always)
    };
    let plain = ServiceBuilder::new().layer(layer()).service(answer.clone());
    let settled = ServiceBuilder::new()
        .layer(layer().cost(|_| 10).settle(|response| {
            response
                .headers
                .get("x-tokens-used")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        }))
        .service(answer);

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(1));
    group.bench_function("plain", |b| {
        ran(GROUP, "plain");
        drive(b, &runtime, &plain, &customers)
    });
    group.bench_function("settled", |b| {
        ran(GROUP, "settled");
        drive(b, &runtime, &settled, &customers)
    });
    group.finish();

    let (Some(base), Some(ours)) = (median_ns(GROUP, "plain"), median_ns(GROUP, "settled")) else {
        return;
    };
    let rows = vec![(
        "settle/settled",
        Row::new(
            "Reserve, then settle: a layered request reserved at 10 units and settled at what its response reports (4, 10 or 16 in turn), 10,000 callers, in-process store",
            ns(ours),
        )
        .peer(format!("the same layer, a plain request: {}", ns(base)))
        .ratio(format!("{:.2}x", ours / base)),
    )];
    write_rows("settle.tsv", &rows);
}
