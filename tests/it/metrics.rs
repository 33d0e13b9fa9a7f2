//! The documented metrics, seen by a test recorder through a scripted run: requests,
//! refusals, cached refusals, an outage and the recovery; their help text in a Prometheus
//! scrape; and the `tracing` span each decision gets.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tollgate::client::AdaptiveThrottleLayer;
use tollgate::decision::BreakerState;
use tollgate::shed::ConcurrencyShedLayer;
use tollgate::store::LiveInstances;
use tollgate::{
    BreakerConfig, Caller, FailurePolicy, InstanceCount, InstanceRegistry, Limiter, Mode,
    ModeSwitch, Policy, Quota, RedisBackend,
};
use tollgate_testkit::proxy::{Fault, FaultProxy};
use tollgate_testkit::recorder::{counter, gauge, histogram_len, with_recorder};
use tollgate_testkit::redis::RedisServer;
use tower::{Layer, Service, ServiceExt, service_fn};
use tracing::level_filters::LevelFilter;

#[test]
fn a_scripted_run_shows_every_documented_metric() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());

    let (during_outage, after) = with_recorder(|snapshotter| async move {
        let store = RedisBackend::builder(proxy.url())
            .prefix("orders")
            .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
            .build()
            .unwrap();
        store.ping().await.unwrap();
        let registry = InstanceRegistry::builder(&store)
            .heartbeat_every(Duration::from_millis(100))
            .start()
            .unwrap();
        let limiter = Limiter::builder()
            .name("orders")
            .backend(store)
            .store_timeout(Duration::from_millis(200))
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(3)))
            .on_store_failure(FailurePolicy::local_share(InstanceCount::live(
                registry.clone(),
            )))
            .breaker(
                BreakerConfig::default()
                    .failure_threshold(2)
                    .base_open(Duration::from_millis(300))
                    .max_open(Duration::from_millis(300)),
            )
            .build();
        // Let a few heartbeats (every 100 ms, the first at once) reach Redis.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(registry.live_instances(), 1);
        let (acme, globex) = (Caller::new("acme"), Caller::new("globex"));

        // 3 admitted by the store; the third leaves r=0, so the next 2 are refused
        // from the denial cache.
        for _ in 0..5 {
            limiter.check(&acme).await;
        }
        // The outage: 2 refused calls open the breaker, 3 more skip the store; all 5 go
        // to the local share (3 a minute for 1 live instance): 3 admitted, 2 refused.
        proxy.set(Fault::Refuse);
        for _ in 0..5 {
            limiter.check(&globex).await;
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Open);
        let during_outage = snapshotter.snapshot().into_vec();

        // Recovery: once the breaker lets a probe through, it succeeds and closes it.
        proxy.set(Fault::Pass);
        tokio::time::sleep(Duration::from_millis(350)).await;
        limiter.check(&globex).await;
        assert_eq!(limiter.breaker_state(), BreakerState::Closed);
        during_outage
    });

    let layer = ("layer", "orders");
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_decisions_total",
            &[layer, ("outcome", "allowed")]
        ),
        3 + 3
    );
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_decisions_total",
            &[layer, ("outcome", "limited"), ("policy", "per-minute")]
        ),
        2 + 2
    );
    assert_eq!(
        counter(&during_outage, "tollgate_denial_cache_hits_total", &[layer]),
        2
    );
    // Two failed store calls: refused at once, or timed out while the connection manager
    // was still trying to reconnect; either way a fallback with its reason.
    let failed: u64 = ["refused", "timeout"]
        .iter()
        .map(|reason| {
            counter(
                &during_outage,
                "tollgate_fallbacks_total",
                &[layer, ("reason", reason), ("policy", "local_share")],
            )
        })
        .sum();
    assert_eq!(failed, 2);
    assert_eq!(
        counter(
            &during_outage,
            "tollgate_fallbacks_total",
            &[layer, ("reason", "breaker_open"), ("policy", "local_share")]
        ),
        3
    );
    assert_eq!(
        gauge(&during_outage, "tollgate_breaker_state", &[layer]),
        1.0
    );
    // One latency sample per store call: 3 answered, 2 refused.
    assert_eq!(
        histogram_len(&during_outage, "tollgate_store_latency_seconds", &[layer]),
        5
    );
    assert_eq!(
        gauge(
            &during_outage,
            "tollgate_live_instances",
            &[("registry", "orders:instances")]
        ),
        1.0
    );

    assert_eq!(gauge(&after, "tollgate_breaker_state", &[layer]), 0.0);
    assert_eq!(
        counter(
            &after,
            "tollgate_decisions_total",
            &[layer, ("outcome", "allowed")]
        ),
        1
    );
    for (key, ..) in during_outage.iter().chain(&after) {
        for label in key.key().labels() {
            assert!(
                !["acme", "globex"].contains(&label.value()),
                "a caller key in a label: {key:?}"
            );
        }
    }
}

/// Every metric family tollgate records, as the crate docs' table lists them.
pub(crate) const FAMILIES: [&str; 9] = [
    "tollgate_decisions_total",
    "tollgate_fallbacks_total",
    "tollgate_breaker_state",
    "tollgate_store_latency_seconds",
    "tollgate_denial_cache_hits_total",
    "tollgate_live_instances",
    "tollgate_shed_total",
    "tollgate_in_flight",
    "tollgate_client_throttled_total",
];

/// The store latency buckets the scrape below (and the `orders_api` example) gives the
/// Prometheus exporter, so the latency is a histogram with `_bucket` series.
pub(crate) const LATENCY_BUCKETS: [f64; 8] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5];

/// What a Prometheus exporter renders after a scripted run that records every family: a
/// limiter on Redis through an outage (fallbacks, breaker, latency, denial cache), an
/// instance registry, a shed request and a locally throttled outgoing call. Run once per
/// test binary and shared.
pub(crate) fn prometheus_scrape() -> &'static str {
    static SCRAPE: OnceLock<String> = OnceLock::new();
    SCRAPE.get_or_init(scripted_scrape)
}

fn scripted_scrape() -> String {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tollgate_store_latency_seconds".into()),
            &LATENCY_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A local recorder: this thread's, and the runtime's tasks (the heartbeat) run on it.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = RedisBackend::builder(proxy.url())
                .prefix("orders")
                .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
                .build()
                .unwrap();
            store.ping().await.unwrap();
            let registry = InstanceRegistry::builder(&store)
                .heartbeat_every(Duration::from_millis(100))
                .start()
                .unwrap();
            let limiter = Limiter::builder()
                .name("orders")
                .backend(store)
                .store_timeout(Duration::from_millis(200))
                .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
                .on_store_failure(FailurePolicy::local_share(InstanceCount::live(
                    registry.clone(),
                )))
                .breaker(BreakerConfig::default().failure_threshold(1))
                .build();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let acme = Caller::new("acme");
            // Admitted, then refused from the denial cache.
            assert!(limiter.check(&acme).await.is_allowed());
            assert!(!limiter.check(&acme).await.is_allowed());
            // The outage: a failed call opens the breaker, the next skips the store.
            proxy.set(Fault::Refuse);
            let globex = Caller::new("globex");
            limiter.check(&globex).await;
            limiter.check(&globex).await;
            assert_eq!(limiter.breaker_state(), BreakerState::Open);

            // One request held in the only slot, so the next is shed.
            let mut shed = ConcurrencyShedLayer::new(1)
                .name("orders")
                .layer(service_fn(|_: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }));
            let held = shed.ready().await.unwrap().call(Request::new(()));
            let refused = shed.ready().await.unwrap().call(Request::new(())).await;
            assert_eq!(refused.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
            drop(held);

            // A backend that answers 503: the second call is refused locally.
            let mut client = AdaptiveThrottleLayer::builder()
                .name("payments")
                .random(|| 0.0)
                .build()
                .layer(service_fn(|_: Request<()>| async {
                    let mut response = Response::new(());
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    Ok::<_, Infallible>(response)
                }));
            for _ in 0..2 {
                let _ = client.ready().await.unwrap().call(Request::new(())).await;
            }
        })
    });
    handle.render()
}

/// The `# HELP` and `# TYPE` lines of `scrape`, by family name.
fn headers(scrape: &str, kind: &str) -> HashMap<String, String> {
    let prefix = format!("# {kind} ");
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, text)| (name.to_owned(), text.to_owned()))
        .collect()
}

#[test]
fn every_tollgate_metric_in_a_prometheus_scrape_has_help_and_a_type() {
    let scrape = prometheus_scrape();
    let help = headers(scrape, "HELP");
    let types = headers(scrape, "TYPE");
    let mut recorded: Vec<&str> = types
        .keys()
        .map(String::as_str)
        .filter(|name| name.starts_with("tollgate_"))
        .collect();
    recorded.sort_unstable();
    let mut documented = FAMILIES.to_vec();
    documented.sort_unstable();
    assert_eq!(recorded, documented, "{scrape}");
    for family in FAMILIES {
        let text = help.get(family).map(String::as_str).unwrap_or_default();
        assert!(text.len() > 20, "{family} has no help text:\n{scrape}");
    }
    let kind = |family: &str| types[family].as_str();
    assert_eq!(kind("tollgate_decisions_total"), "counter");
    assert_eq!(kind("tollgate_breaker_state"), "gauge");
    assert_eq!(kind("tollgate_live_instances"), "gauge");
    assert_eq!(kind("tollgate_store_latency_seconds"), "histogram");
    assert!(scrape.contains("tollgate_store_latency_seconds_bucket{layer=\"orders\",le=\"0.5\"}"));
}

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
}

impl tracing::Subscriber for Spans {
    // Tests run side by side, each with a subscriber of its own on its thread: a callsite's
    // interest must not be cached from whichever subscriber saw it first, so every use asks
    // `enabled` of the subscriber in scope.
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
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
    let mode = ModeSwitch::new(Mode::Enforce);
    let limiter = Limiter::builder()
        .name("orders")
        .mode(mode.clone())
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
        .build();
    let acme = Caller::new("acme");
    assert!(limiter.check(&acme).await.is_allowed());
    assert!(!limiter.check(&acme).await.is_allowed());
    mode.set(Mode::Shadow);
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

#[test]
fn a_decision_that_waits_on_redis_is_recorded_in_its_span() {
    let server = RedisServer::start();
    let spans = Spans::new(LevelFilter::DEBUG);
    let _subscriber = tracing::subscriber::set_default(spans.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = RedisBackend::builder(server.url()).build().unwrap();
        store.ping().await.unwrap();
        let limiter = Limiter::builder()
            .name("orders")
            .backend(store)
            .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
            .denial_cache(0)
            .build();
        let acme = Caller::new("acme");
        assert!(limiter.check(&acme).await.is_allowed());
        assert!(!limiter.check(&acme).await.is_allowed());
    });
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
