//! Decision spans through `tracing`: each decision gets a span with its outcome and the
//! refusing policy, and none is made when no subscriber wants them.
//!
//! A binary of its own: tracing caches each callsite's interest process-wide, and in the
//! shared integration binary other tests hitting the same callsites on their threads (with
//! no subscriber) at the same moment could leave this test's subscriber unasked. Here only
//! these tests run, each with its subscriber.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[cfg(feature = "redis")]
use tollgate::RedisBackend;
use tollgate::{Caller, Limiter, Policy, Quota, reload::Mode};
#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;
use tracing::level_filters::LevelFilter;

#[cfg(not(feature = "redis"))]
#[path = "it/skipped/redis.rs"]
mod skipped;

/// A `tracing` subscriber that keeps tollgate's decision spans (fields as recorded) and
/// which span each "request refused" event happened in, up to a maximum level.
#[derive(Clone)]
struct Spans {
    max: LevelFilter,
    state: Arc<Mutex<SpanState>>,
}

#[derive(Default)]
struct SpanState {
    /// Every span created, in order: its name and fields.
    spans: Vec<(&'static str, BTreeMap<String, String>)>,
    /// The spans entered on this thread, innermost last (ids are indices + 1).
    entered: Vec<u64>,
    /// For each refusal event, the span it happened in.
    refusals_in: Vec<Option<u64>>,
    /// The message of every warning, in order.
    warnings: Vec<String>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Spans {
    fn new(max: LevelFilter) -> Self {
        Self {
            max,
            state: Arc::default(),
        }
    }

    /// The decision spans' fields, in order of creation.
    fn decisions(&self) -> Vec<BTreeMap<String, String>> {
        let state = self.state.lock().unwrap();
        state
            .spans
            .iter()
            .filter(|(name, _)| *name == "tollgate.decision")
            .map(|(_, fields)| fields.clone())
            .collect()
    }

    fn refusals_in(&self) -> Vec<Option<u64>> {
        self.state.lock().unwrap().refusals_in.clone()
    }

    fn warnings(&self) -> Vec<String> {
        self.state.lock().unwrap().warnings.clone()
    }
}

impl tracing::Subscriber for Spans {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        self.max >= *metadata.level()
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }
    fn new_span(&self, attributes: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = BTreeMap::new();
        attributes.record(&mut Fields(&mut fields));
        let mut state = self.state.lock().unwrap();
        state.spans.push((attributes.metadata().name(), fields));
        tracing::span::Id::from_u64(state.spans.len() as u64)
    }
    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut state = self.state.lock().unwrap();
        let index = span.into_u64() as usize - 1;
        values.record(&mut Fields(&mut state.spans[index].1));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        if *event.metadata().level() == tracing::Level::WARN {
            let message = fields.get("message").cloned().unwrap_or_default();
            self.state.lock().unwrap().warnings.push(message);
        }
        if fields.get("message").map(String::as_str) == Some("request refused") {
            let mut state = self.state.lock().unwrap();
            let current = state.entered.last().copied();
            state.refusals_in.push(current);
        }
    }
    fn enter(&self, span: &tracing::span::Id) {
        self.state.lock().unwrap().entered.push(span.into_u64());
    }
    fn exit(&self, _: &tracing::span::Id) {
        self.state.lock().unwrap().entered.pop();
    }
}

fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn each_decision_gets_a_span_with_its_outcome_and_refusing_policy() {
    let spans = Spans::new(LevelFilter::DEBUG);
    // A current-thread runtime: every check below runs on this thread, under this subscriber.
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let limiter = Limiter::builder()
        .name("orders")
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    assert!(!limiter.check(&acme).await.is_allowed());
    limiter.set_mode(Mode::Shadow);
    assert!(limiter.check(&acme).await.is_allowed());

    let layer = ("layer", "orders");
    assert_eq!(
        spans.decisions(),
        [
            fields(&[layer, ("outcome", "allowed")]),
            fields(&[layer, ("outcome", "limited"), ("policy", "per-minute")]),
            fields(&[
                layer,
                ("outcome", "shadow_limited"),
                ("policy", "per-minute")
            ]),
        ]
    );
    // The refusal's log line sits inside its decision's span (span ids count from 1).
    assert_eq!(spans.refusals_in(), [Some(2)]);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_decision_that_waits_on_redis_is_recorded_in_its_span() {
    let server = RedisServer::start();
    let spans = Spans::new(LevelFilter::DEBUG);
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let store = RedisBackend::builder(server.url()).build().unwrap();
    store.ping().await.unwrap();
    let limiter = Limiter::builder()
        .name("orders")
        .backend(store)
        // A test of spans, not of latency: on a loaded 2-core machine the first call, which
        // loads the script, sometimes took longer than the default 20 ms and fell back.
        .store_timeout(std::time::Duration::from_secs(2))
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
        .denial_cache(0)
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    assert!(!limiter.check(&acme).await.is_allowed());
    let decisions = spans.decisions();
    let layer = ("layer", "orders");
    assert_eq!(
        decisions,
        [
            fields(&[layer, ("outcome", "allowed")]),
            fields(&[layer, ("outcome", "limited"), ("policy", "per-minute")]),
        ]
    );
    // The refusal was concluded in the future the store call made, inside its span.
    let refusal_span = spans.refusals_in()[0].expect("a refusal outside any span");
    let state = spans.state.lock().unwrap();
    assert_eq!(
        state.spans[refusal_span as usize - 1].0,
        "tollgate.decision"
    );
    assert_eq!(
        state.spans[refusal_span as usize - 1]
            .1
            .get("outcome")
            .map(String::as_str),
        Some("limited")
    );
}

#[tokio::test]
async fn no_decision_span_when_the_subscriber_wants_nothing_below_info() {
    let spans = Spans::new(LevelFilter::INFO);
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let limiter = Limiter::builder()
        .name("orders")
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    assert!(!limiter.check(&acme).await.is_allowed());
    assert_eq!(spans.decisions(), Vec::<BTreeMap<String, String>>::new());
    assert!(spans.state.lock().unwrap().spans.is_empty());
}

#[tokio::test]
async fn an_extension_key_without_its_extension_says_once_where_the_auth_layer_goes() {
    use std::convert::Infallible;
    use tollgate::{RateLimitLayer, key::ExtensionKey};
    use tower::{ServiceBuilder, ServiceExt};

    #[derive(Clone)]
    struct Principal(String);
    impl From<&Principal> for Caller {
        fn from(principal: &Principal) -> Self {
            Caller::new(principal.0.as_str())
        }
    }

    let spans = Spans::new(LevelFilter::WARN);
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let limiter = Limiter::builder()
        .name("otp")
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
        .build();
    // The auth middleware would insert `Principal`; here it runs inside the limit layer (or
    // not at all), so the layer never sees the extension.
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter).key(ExtensionKey::<Principal>::new()))
        .service_fn(|_request: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        });
    for _ in 0..3 {
        let response = service
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .unwrap();
        assert_eq!(response.status(), 400);
    }
    let warnings = spans.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("before the rate-limit layer"),
        "{}",
        warnings[0]
    );
}

/// A recorder installed after a limiter was built never gets its metrics (the handles
/// are registered at build time): the first decision says so, once. A limiter built with
/// the recorder already in force says nothing.
#[tokio::test]
async fn a_recorder_installed_after_the_limiter_was_built_is_warned_about_once() {
    use metrics_util::debugging::DebuggingRecorder;

    let spans = Spans::new(LevelFilter::WARN);
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let policy = || Policy::sliding_window("per-minute", Quota::per_minute(5));
    let early = Limiter::builder().name("early").policy(policy()).build();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let late = Limiter::builder().name("late").policy(policy()).build();
    let alice = Caller::new("alice");
    for _ in 0..3 {
        early.check(&alice).await;
        late.check(&alice).await;
    }
    let warnings = spans.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("install the recorder before building limiters"),
        "{}",
        warnings[0]
    );
    // What the warning is about: only the limiter built under the recorder is recorded.
    let layers: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, ..)| {
            key.key()
                .labels()
                .find(|label| label.key() == "layer")
                .map(|label| label.value().to_owned())
        })
        .collect();
    assert!(layers.iter().all(|layer| layer == "late"), "{layers:?}");
    assert!(!layers.is_empty());
}
