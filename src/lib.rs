//! Per-caller rate limiting for axum and hyper services, as a tower layer, with the counters
//! in process ([`InMemoryBackend`]) or in Redis (`RedisBackend`, with the `redis` feature),
//! and a [`FailurePolicy`] per route for when the store cannot answer.
//!
//! Each caller (an API key, a customer id, an authenticated principal, a client IP behind
//! trusted proxies) is counted against named quotas; a refusal is a 429 with the IETF
//! RateLimit fields, `Retry-After` and an RFC 9457 problem body.
//!
//! ```
//! use tollgate::{Caller, Limiter, Policy, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let limiter = Limiter::builder()
//!     .name("hello")
//!     .policy(Policy::sliding_window("per-second", Quota::per_second(5)))
//!     .build();
//! let caller = Caller::new("203.0.113.7");
//! for _ in 0..5 {
//!     assert!(limiter.check(&caller).await.is_allowed());
//! }
//! // The sixth request within the second is refused.
//! assert!(!limiter.check(&caller).await.is_allowed());
//! # }
//! ```
//!
//! The [`guide`] starts from an empty project ([`guide::getting_started`]), then has
//! recipes and a page per topic: [the failure policies](guide::failure_policies), the
//! [responses and headers](guide::headers), [request cost and counting only
//! failures](guide::cost_and_counting), [leases](guide::leases),
//! [operating it](guide::operating), [changing limits at run time](guide::reload),
//! [gRPC](guide::grpc), [Redis deployments](guide::redis_deployments) and [the outage
//! simulator](guide::simulator). [`RateLimitLayer`] is where a router starts.
// On docs.rs (nightly rustdoc), each item shows the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
//!
//! # The request path
//!
//! A request meets, in this order: the [key extractor](key::KeyExtractor) (who is calling); the
//! [`Limiter`]'s [mode](reload::Mode) (enforce, shadow or off); the denial cache (a caller known to
//! be over a limit is refused without a store call); the circuit breaker; the
//! [store](store::Backend) under a short timeout, or on failure the route's
//! [`FailurePolicy`]; then either the inner service, whose response gains the
//! `RateLimit-Policy` and `RateLimit` fields, or a refusal: 429 with `Retry-After` and an
//! RFC 9457 problem body, or 503 when the store is down and the route fails closed.
//!
//! The crate is built in three floors, each importing only from those below it, and the
//! source tree shows them as folders in the order a request meets them:
//!
//! - HTTP (`src/http/`): [`RateLimitLayer`], [`RateLimit`], its
//!   [future](future::ResponseFuture) and [body](response::ResponseBody), [key
//!   extraction](key), headers and refusals.
//! - Decision (`src/limiter/`): [`Limiter`] and its builder, the breaker, the denial cache,
//!   executing the [`FailurePolicy`], the [mode](reload::Mode), the [`Decision`], metrics.
//! - Store (`src/store/`, public as [`store`] for backend authors): the
//!   [`Backend`](store::Backend) trait, [`Policy`] and [`Quota`], the
//!   [`Algorithm`](store::Algorithm) arithmetic and the all-or-nothing
//!   [`evaluate`](store::PolicyState::evaluate) over the [`PolicyState`](store::PolicyState)s,
//!   [`InMemoryBackend`], `RedisBackend` with its Lua and `InstanceRegistry`, the
//!   [`CallerKey`](store::CallerKey), the [`Clock`](store::Clock) and [`BuildError`], the
//!   crate's one configuration error.
//!
//! Two middlewares of their own need no store: [`shed`] (load shedding by concurrency) and
//! [`client`] (adaptive throttling of outgoing calls).
//!
//! # A local bucket in front of the global one
//!
//! As Envoy combines its local and global rate limits, two layers compose: an outer layer
//! on an [`InMemoryBackend`] (per instance, no network) absorbs bursts, and only what it
//! admits reaches the inner layer on Redis, so a burst far over the limit costs no store
//! call per request. Give the local bucket a little more than the instance's share of the
//! global limit, so that it only cuts what the global limit would refuse anyway.
//!
//! ```
//! use axum::{Router, routing::get};
//! use tollgate::{InMemoryBackend, Limiter, Policy, Quota, RateLimitLayer, key::HeaderKey};
//!
//! # fn global_store() -> InMemoryBackend { InMemoryBackend::new() }
//! // Per instance: at most 30 a second per customer, bursts of 30.
//! let local = Limiter::builder()
//!     .name("orders-local")
//!     .backend(InMemoryBackend::new())
//!     .policy(Policy::token_bucket("local-burst", Quota::per_second(30), 30))
//!     .build();
//! // Shared by all instances (a RedisBackend in production): 50 a second per customer.
//! let global = Limiter::builder()
//!     .name("orders")
//!     .backend(global_store())
//!     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
//!     .build();
//! let key = HeaderKey::new("x-customer-id");
//! let app: Router = Router::new()
//!     .route("/orders", get(|| async { "[]" }))
//!     // Layers added later wrap the earlier ones: the local bucket runs first.
//!     .route_layer(RateLimitLayer::new(global).key(key.clone()))
//!     .route_layer(RateLimitLayer::new(local).key(key));
//! # drop(app);
//! ```
//!
//! # Metrics
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade, so any exporter works
//! (the `orders_api` example serves them in the Prometheus format at `/metrics`). Labels
//! never carry a caller key. Install the recorder before building limiters and layers: the
//! handles are registered when a limiter is built, so a recorder installed later never
//! sees its metrics. That mistake is not silent: a limiter whose first decision finds
//! another recorder in force than at its build logs one warning (through `tracing`) saying
//! so. [`guide::getting_started`] shows the order.
//!
//! | name | type | labels | unit | what |
//! |---|---|---|---|---|
//! | `tollgate_decisions_total` | counter | `layer`, `outcome`, `policy` | requests | one per decision; `outcome` is `allowed`, `limited`, `unavailable` (failed closed), `unlimited` (passed uncounted: no key, failed open), `skipped` (matched the layer's skip predicate), or in shadow mode `shadow_allowed`, `shadow_limited`, `shadow_unavailable`, `shadow_unlimited`; `policy` names the first refusing policy of a `limited` outcome and is empty otherwise |
//! | `tollgate_fallbacks_total` | counter | `layer`, `reason`, `policy`, `node` | requests | decisions the store could not make; `reason` is `timeout`, `refused` (the store refused or dropped the connection; also without a call while the latest attempt to connect was refused, as with a killed Redis or a closed port), `other_error`, `breaker_open` or `not_connected` (no connection yet, or being made again: the store was not asked); `policy` is the failure policy applied (`open`, `closed`, `local_share`, `static`, `static_then_…`); `node` is the part of the store (a cluster master's address, a single node's address, a Sentinel master's name; empty for a store that names no parts) |
//! | `tollgate_breaker_state` | gauge | `layer`, `node` | state | the breaker in front of each part of the store: 0 closed, 1 open, 2 half-open |
//! | `tollgate_store_latency_seconds` | histogram | `layer` | seconds | each call made to a remote store (a decision, a lease taken, a refund, a lease's unused units given back), from start to answer, error or timeout; calls to an in-process store (an `InMemoryBackend` as the limiter's store, or the local share's) are not timed |
//! | `tollgate_denial_cache_hits_total` | counter | `layer` | requests | refusals served from the denial cache, without a store call |
//! | `tollgate_settlements_total` | counter | `layer`, `result` | requests | admitted requests settled at what their responses cost (a layer's [`settle`](RateLimitLayer::settle), or [`Limiter::settle`]); `result` is `exact`, `refunded` (it cost less than it reserved), `charged` (it cost more: the extra charged, past the quota if need be), `failed` (the store could not be told: the reservation stands) or `not_counted` (the decision counted nothing) |
//! | `tollgate_refunds_total` | counter | `layer`, `result` | requests | admitted requests whose units were given back because they did not count (a layer's [`count_only`](RateLimitLayer::count_only), or [`Limiter::refund`]); `result` is `given_back` or `failed` (the store could not take them back: the units stay consumed) |
//! | `tollgate_lockouts_total` | counter | `layer`, `policy` | blocks | blocks started by a policy's [lockout](Policy::lock_out_for): a caller used the quota up and is refused for the lockout's duration (counted where the decision was made: the store's, or the local share's while the store is down) |
//! | `tollgate_leases_total` | counter | `layer`, `event` | leases | leases of quota of a limiter with [`leases`](LimiterBuilder::leases); `event` is `taken` (from the store), `spent` (to the last unit), `expired` (ended with units left) or `returned` (those units given back to the store) |
//! | `tollgate_leased_decisions_total` | counter | `layer` | requests | decisions made locally from a lease, without a store call |
//! | `tollgate_wan_calls_total` | counter | `region`, `result` | calls | calls a region of a two-tier store (`store::TwoTierBackend`, with the `redis` feature) made to the global store; `result` is `granted` (units leased), `empty` (answered with none: the limit had no room for the region) or `failed` (no answer within the WAN timeout, or an error: the region counts itself cut off and decides on its share) |
//! | `tollgate_live_instances` | gauge | `registry` | instances | the count an `InstanceRegistry` divides by (its key, e.g. `orders:instances`): what it last read, except that a count rebuilt after a Redis restart replaces a higher trusted one only after a full liveness window |
//! | `tollgate_shed_total` | counter | `layer`, `class` | requests | requests refused by [`ConcurrencyShedLayer`](shed::ConcurrencyShedLayer); `class` is the request's [priority class](shed::ConcurrencyShedLayer#priority-classes): `critical`, `normal` (every request of a layer without classes) or `sheddable` |
//! | `tollgate_in_flight` | gauge | `layer` | requests | requests in flight through [`ConcurrencyShedLayer`](shed::ConcurrencyShedLayer), or holding a slot of an [`InFlightLayer`](in_flight::InFlightLayer) on this instance |
//! | `tollgate_in_flight_decisions_total` | counter | `layer`, `outcome` | requests | requests decided by an [`InFlightLayer`](in_flight::InFlightLayer): `allowed` (a slot taken), `limited` (all of the caller's slots taken: 429), `unavailable` (the store failed and the layer fails closed: 503) or `unlimited` (run without a slot: no key with `MissingKey::Pass`, or failed open) |
//! | `tollgate_client_throttled_total` | counter | `layer` | requests | outgoing requests refused locally by [`AdaptiveThrottleLayer`](client::AdaptiveThrottleLayer) |
//! | `tollgate_client_held_back_total` | counter | `layer`, `reason`, `outcome` | requests | outgoing calls kept from a server that had said to wait, by [`HoldBackLayer`](client::HoldBackLayer); `reason` is `retry_after`, `ratelimit`, `grpc_pushback` or `grpc_no_retry`; `outcome` is `failed` (answered locally, never sent) or `waited` (sent once the wait was over) |
//!
//! `layer` is the name given with [`LimiterBuilder::name`] (or the shed and throttle
//! layers' own `name`). Each metric is described (help text, and the unit where it has one)
//! to the recorder installed when the limiter, layer or registry that records it is built,
//! so a Prometheus `/metrics` carries `# HELP` lines. The exporter renders the store latency
//! as a histogram (`_bucket` series) only if given buckets for it, as the `orders_api`
//! example does. A Grafana dashboard on these metrics is in the repository at
//! `docs/grafana-dashboard.json`.
//!
//! # Tracing
//!
//! Breaker state changes and mode switches are logged through `tracing` at warn level; each
//! refusal at debug level. Each decision runs in a `tollgate.decision` span at debug level
//! with the fields `layer`, then `outcome` (as in `tollgate_decisions_total`) and, for a
//! refusal, `policy` once known; it nests under the caller's request span. Unless a
//! subscriber enables it (e.g. `tollgate=debug`), the span is never built: no allocation
//! and no field formatting per decision.

mod http;
mod limiter;

pub mod client;
#[cfg(feature = "serde")]
pub mod config;
pub mod guide;
pub mod in_flight;
pub mod shed;
pub mod store;

pub use http::layer::RateLimitLayer;
pub use http::service::RateLimit;
pub use limiter::Limiter;
pub use limiter::breaker::BreakerConfig;
pub use limiter::builder::LimiterBuilder;
pub use limiter::decision::Decision;
pub use limiter::failure::FailurePolicy;
pub use limiter::instances::InstanceCount;
pub use limiter::lease::config::Leases;
pub use store::build_error::BuildError;
pub use store::caller::Caller;
pub use store::memory::InMemoryBackend;
pub use store::policy::{Policy, Quota};
#[cfg(feature = "redis")]
pub use store::redis::backend::RedisBackend;
#[cfg(feature = "redis")]
pub use store::redis::registry::InstanceRegistry;

pub mod cost {
    //! A request's cost estimated from its body, before the rate limit decides: the body is read
    //! into a bounded buffer, an estimate is made from it (an LLM request's `max_tokens` in its
    //! JSON), and the request goes on with the estimate in its extensions and its body
    //! unchanged.
    //!
    //! [`RateLimitLayer::cost`](crate::RateLimitLayer::cost) sees only a request's head, so a
    //! cost that lies in the body is read here, in a layer that runs before it: its
    //! [`RequestCost`] is what the rate limit reserves, and
    //! [`RateLimitLayer::settle`](crate::RateLimitLayer::settle) settles it at what the
    //! response says was used.
    //!
    //! ```
    //! use axum::{Router, routing::post};
    //! use tollgate::cost::{BodyCostLayer, RequestCost};
    //! use tollgate::key::HeaderKey;
    //! use tollgate::{Limiter, Policy, Quota, RateLimitLayer};
    //!
    //! let tokens = Limiter::builder()
    //!     .name("tokens")
    //!     .policy(Policy::sliding_window("tokens", Quota::per_minute(10_000)))
    //!     .build();
    //! let app: Router = Router::new()
    //!     .route("/v1/completions", post(|| async { "{}" }))
    //!     // Layers run from the last added: the body is read first.
    //!     .route_layer(
    //!         RateLimitLayer::new(tokens)
    //!             .key(HeaderKey::new("x-customer-id"))
    //!             .cost(RequestCost::of_request)
    //!             .settle(|response| response.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()),
    //!     )
    //!     .route_layer(
    //!         // Up to 64 KiB of JSON; a body without max_tokens is estimated at 1,000.
    //!         BodyCostLayer::new(64 * 1024, |body: &[u8]| {
    //!             let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    //!             json.get("max_tokens")?.as_u64()
    //!         })
    //!         .default_estimate(1_000),
    //!     );
    //! # drop(app);
    //! ```
    //!
    //! A body longer than the buffer cannot be looked into: it is refused with 413 Content Too
    //! Large (a problem+json body) unless [`BodyCostLayer::too_large_estimate`] gives such
    //! requests an estimate of their own, in which case it goes on whole (what was read, then
    //! the rest as it arrives). A body the estimator finds nothing in gets the
    //! [`default_estimate`](BodyCostLayer::default_estimate) (1 unless set). The buffer holds
    //! the request's first bytes until the rate limit has decided; its bound is the memory a
    //! request can hold here.

    pub use crate::http::body_cost::{BodyCost, BodyCostLayer, PrefixedBody, RequestCost};
}

pub mod decision {
    //! What a decision says: the [`Decision`](crate::Decision) itself, the state of each policy it reports,
    //! where it came from, why it was not counted, and the breaker in front of the store.

    pub use crate::limiter::breaker::BreakerState;
    pub use crate::limiter::decision::{
        DecisionSource, PolicyReport, RateLimitInfo, UnlimitedReason,
    };
    pub use crate::limiter::settlement::Settlement;
}

pub mod key {
    //! Who is calling: the key extractors, and what a rejected key answers.

    pub use crate::http::key::{
        AsyncFnKey, AsyncKeyExtractor, ClientIp, ConfiguredKey, DefinedKey, ExtensionKey,
        Extracted, FnKey, HeaderKey, KeyExtractor, KeyRejection, MissingKey,
    };
}

pub mod response {
    //! What responses carry: the RateLimit field names, the problem types of a refusal, and
    //! the body type the layer answers with.

    pub use crate::http::body::ResponseBody;
    pub use crate::http::body_shape::{BodyShape, InnerBody, Wrapped};
    pub use crate::http::field_forms::{FieldForm, UnknownFieldForm};
    pub use crate::http::headers::HeaderMode;
    pub use crate::http::problem_type::ProblemType;
}

pub mod headers {
    //! The RateLimit fields the layer writes, as typed values for clients and for axum's
    //! `TypedHeader`: [`RateLimitPolicyHeader`] and [`RateLimitHeader`] of
    //! [draft 11](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/11/).
    //!
    //! Each implements [`headers::Header`] (the `headers` crate, 0.4), so
    //! `headers::HeaderMapExt::typed_get` and axum-extra's `TypedHeader<RateLimit>` decode
    //! them. They are written by the same code that writes the layer's responses, and read
    //! by the [`sfv`](https://docs.rs/sfv) crate, which accepts exactly the Structured Field
    //! lists RFC 9651 defines. A field
    //! that does not decode is the `headers` crate's [`headers::Error`] wherever it is read
    //! (`decode`, or each type's `parse`); what was wrong with it goes to a debug-level
    //! `tracing` event.
    //!
    //! A refusal also carries `Retry-After`, in whole seconds: the longest `t` among the
    //! policies that refused. When each of them has nothing left, as when a request of one
    //! unit is refused or the limiter fails closed, their items all say `r=0`, so
    //! [`RateLimitHeader::exhausted_for`] gives the same wait. Only `Retry-After` gives it
    //! for a request of several units refused while fewer remain (its policy's item shows
    //! `r` above 0), for a request shed by
    //! [`ConcurrencyShedLayer`](crate::shed::ConcurrencyShedLayer) (no RateLimit field), and
    //! under [`HeaderMode::Never`](crate::response::HeaderMode::Never).
    //! [`HoldBackLayer`](crate::client::HoldBackLayer) reads both.
    //!
    //! ```
    //! use std::time::Duration;
    //! use headers::HeaderMapExt;
    //! use tollgate::headers::{RateLimitHeader, RateLimitPolicyHeader};
    //!
    //! // A refusal as a tollgate server writes it.
    //! let mut headers = http::HeaderMap::new();
    //! headers.insert("ratelimit-policy", r#""per-second";q=5;w=1"#.parse().unwrap());
    //! headers.insert("ratelimit", r#""per-second";r=0;t=1"#.parse().unwrap());
    //! headers.insert("retry-after", "1".parse().unwrap());
    //!
    //! let policy: RateLimitPolicyHeader = headers.typed_get().unwrap();
    //! let state: RateLimitHeader = headers.typed_get().unwrap();
    //! assert_eq!(policy.get("per-second").unwrap().quota(), 5);
    //! // Retry-After's wait.
    //! assert_eq!(state.exhausted_for(), Some(Duration::from_secs(1)));
    //! ```

    pub use crate::http::typed_headers::policy::{QuotaPolicy, RateLimitPolicyHeader};
    pub use crate::http::typed_headers::single_limit::SingleLimit;
    pub use crate::http::typed_headers::state::{QuotaState, RateLimitHeader};
}

pub mod future {
    //! The futures the layers and the limiter return: [`RateLimit`](crate::RateLimit)'s,
    //! [`ConcurrencyShed`](crate::shed::ConcurrencyShed)'s, the [client](crate::client)
    //! layers', and the store's.

    pub use crate::client::future::ClientFuture;
    pub use crate::client::hold::HoldBackFuture;
    pub use crate::http::future::ResponseFuture;
    pub use crate::shed::future::ShedFuture;
    pub use crate::store::future::StoreFuture;
}

pub mod reload {
    //! Changing a running limiter: its limits ([`Limits`], swapped by
    //! [`Limiter::set_limits`](crate::Limiter::set_limits)) and its [`Mode`] (switched by
    //! [`Limiter::set_mode`](crate::Limiter::set_mode)), without rebuilding the router.

    pub use crate::limiter::limits::Limits;
    pub use crate::limiter::mode::Mode;
}
