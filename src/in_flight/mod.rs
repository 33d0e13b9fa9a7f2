//! Requests in flight per caller, across instances: at most N of one caller's requests
//! run at once, wherever they land.
//!
//! A rate limit bounds how often a caller may start a request; it does not bound how many
//! of its slow requests run at once (a report that takes 30 s, an export). An
//! [`InFlightLayer`] does: it takes one of the caller's slots in a shared store before the
//! request runs, and frees it when the response body has been sent, or is dropped (a
//! client gone away), or the service fails or panics. A request that finds all of its
//! caller's slots taken is refused at once with 429.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use tollgate::InMemoryBackend;
//! use tollgate::in_flight::InFlightLayer;
//! use tollgate::key::HeaderKey;
//!
//! // At most 2 reports of one customer at a time (a RedisBackend shares the slots
//! // between instances; an InMemoryBackend keeps them in this process).
//! let reports = InFlightLayer::new("reports", 2, InMemoryBackend::new())
//!     .key(HeaderKey::new("x-customer-id"))
//!     .slot_ttl(Duration::from_secs(10));
//! let app: Router = Router::new()
//!     .route("/reports", get(|| async { "report" }))
//!     .route_layer(reports);
//! # drop(app);
//! ```
//!
//! # What a response says
//!
//! Admitted responses carry the limit in the RateLimit fields of
//! [draft 11](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/11/),
//! with the quota unit it defines for this, and no window (the quota is not spent over
//! time, it is held):
//!
//! ```text
//! RateLimit-Policy: "in-flight";q=2;qu="concurrent-requests"
//! RateLimit: "in-flight";r=1
//! ```
//!
//! `r` is what remained when the request took its slot. A refusal is 429 with the
//! quota-exceeded problem (`"policy":"in-flight"`), `RateLimit: "in-flight";r=0;t=1` and
//! `Retry-After: 1`. The server cannot know when one of the caller's requests will end:
//! one second is the shortest wait the field can say, and it frees the client to try again
//! as soon as a typical request may have finished, without inviting a retry storm (a
//! client that retries at once would only be refused again). The fields are appended, so
//! a [`RateLimitLayer`](crate::RateLimitLayer) on the same route lists its policies beside
//! this one.
//!
//! To a gRPC request (`content-type: application/grpc`) a refusal is a gRPC status in a
//! Trailers-Only response, as the rate limit's are: RESOURCE_EXHAUSTED with
//! `grpc-retry-pushback-ms: 1000` when the slots are taken, UNAVAILABLE with the same
//! pushback when the store failed and the failure policy refuses, and the code of the
//! rejection's 4xx for a request without a key.
//!
//! # Crash safety
//!
//! A slot in a remote store is taken for the layer's [`slot_ttl`](InFlightLayer::slot_ttl)
//! (10 s unless set) and renewed every third of it while its request runs. If an instance
//! dies (or loses the store) with requests in flight, their slots are no longer renewed
//! and free themselves: **at most one `slot_ttl` after the instance stopped**, since the
//! last renewal happened before that and gave the slot one `slot_ttl` to live. On Redis the
//! slots are a sorted set per caller scored by each slot's expiry on Redis's own clock, so
//! instances' clocks play no part; expired slots are dropped by the next request's atomic
//! check. A request still running when its slot expired unrenewed (its instance was cut
//! from Redis for longer than `slot_ttl`) runs on; its slot may then go to another request.
//!
//! A slot the store took after its answer stopped mattering (it came after the store
//! timeout, or the request went away while waiting for it) is released at once: the slot
//! id is chosen before the call, and freeing a slot the store does not hold does nothing.
//!
//! # Shutting down
//!
//! A remote store's slot is freed by a task on the runtime when its response ends. A
//! runtime that is shutting down runs none of its tasks, so the slots of the requests that
//! ended last would stay taken until their `slot_ttl` ends. A graceful shutdown therefore
//! awaits [`InFlightLayer::flush`] after the server has stopped serving, while the runtime
//! still runs:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use axum::{Router, routing::get};
//! # use tollgate::InMemoryBackend;
//! # use tollgate::in_flight::InFlightLayer;
//! # #[tokio::main] async fn main() -> std::io::Result<()> {
//! let reports = InFlightLayer::new("reports", 2, InMemoryBackend::new());
//! let app: Router = Router::new()
//!     .route("/reports", get(|| async { "report" }))
//!     .route_layer(reports.clone());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! axum::serve(listener, app)
//!     .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
//!     .await?;
//! // Every response has ended: their slots' releases go out before the runtime ends.
//! reports.flush(Duration::from_secs(1)).await;
//! # Ok(()) }
//! ```
//!
//! # When the store fails
//!
//! Each store call is bounded by the layer's [`store_timeout`](InFlightLayer::store_timeout)
//! (20 ms unless set), and the failure policy of
//! [`on_store_failure`](InFlightLayer::on_store_failure) decides a request the store could
//! not: [`FailurePolicy::Open`](crate::FailurePolicy::Open) (the default) and `Static` let
//! it run without a slot, `Closed` answers 503 with `Retry-After: 1`, and `LocalShare`
//! (also after `StaticThen`) lets each instance run its share of the limit, `limit /
//! instances` with the remainder given by place (an instance with no place known rounds
//! down, and takes 1 if that is 0). The share counts the caller's requests this instance
//! already runs, whoever granted their slots, so the outage's start admits no more than
//! the share. At the store's return, requests that the shares admitted and that still run
//! are not in the store: until they end, the store may admit up to the limit beside them.
//! Fallbacks are counted in `tollgate_fallbacks_total` with the layer's name and `node`
//! empty.
//!
//! # Metrics
//!
//! `tollgate_in_flight_decisions_total{layer, outcome}`: `allowed`, `limited`,
//! `unavailable` (failed closed) or `unlimited` (no key with
//! [`MissingKey::Pass`](crate::key::MissingKey::Pass), or failed open); and
//! `tollgate_in_flight{layer}`, the slots this instance holds (the gauge
//! [`ConcurrencyShedLayer`](crate::shed::ConcurrencyShedLayer) writes too, under its own
//! layer name).

mod admission;
mod layer;
mod service;

pub use layer::InFlightLayer;
pub use service::InFlight;
