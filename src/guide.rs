//! Guides: what to install and in which order, recipes for the setups people ask about,
//! then one page per topic. Each page is documentation only; every Rust example in it is
//! compiled (and most are run) as a test of the crate. The pages are also in the
//! repository, as `docs/guide/*.md`.
//!
//! Start here:
//!
//! - [`getting_started`]: the dependencies (the metrics exporter that pairs with the
//!   crate's `metrics` version, a `tracing` subscriber), the order of setup (the recorder
//!   first), and a first limited route.
//! - [`recipes`]: authentication middleware with [`ExtensionKey`](crate::key::ExtensionKey)
//!   and the layer order it needs (and the `NewError` inference error on the way), one
//!   Redis store for many limiters, a 15-minute login limit.
//! - [`failure_policies`]: what happens when the store cannot answer, chosen per route:
//!   the store timeout and the circuit breaker, what each policy admits during an outage
//!   (simulated and measured), and which to choose where.
//!
//! By topic:
//!
//! - [`concepts`]: keys, whose count is whose, policies and tiers, skipping requests, your
//!   own refusal format, the stores, where things are in the crate.
//! - [`headers`]: the 429 and 503 responses, the `RateLimit-Policy`, `RateLimit` and
//!   `Retry-After` fields and what their numbers mean.
//! - [`cost_and_counting`]: requests that cost more than one unit, counting only failed
//!   attempts (a refund from the response), and locking a caller out after repeated
//!   failures (and what an attacker can do with that).
//! - [`hard_caps`]: the exact sliding log for "never more than `q` in any window", measured
//!   against the sliding window counter, and what it costs.
//! - [`leases`]: leased quota, so that a hot caller's decisions are made locally.
//! - [`operating`]: metrics, the Grafana dashboard, tracing, load shedding, client-side
//!   throttling, what to alert on, shadow mode before enforcing.
//! - [`reload`]: changing limits at run time, and reading them from a configuration file.
//! - [`grpc`]: the layer on a tonic server, and refusals as gRPC statuses.
//! - [`redis_deployments`]: Redis on a single node, behind Sentinel, or as a Cluster, and
//!   what each failure does to decisions (this page needs the `redis` feature).
//! - [`simulator`]: the outage simulator, its command line, page and tables, and replaying
//!   an outage through your own limiter and layer in a test (`tollgate-simulator`).
//! - [`regions`]: one limit across regions, each with a Redis of its own: the two-tier
//!   store designed and measured in the simulator, what it guarantees through a partition
//!   and what it costs.

#[doc = include_str!("../docs/guide/getting_started.md")]
pub mod getting_started {}

#[doc = include_str!("../docs/guide/recipes.md")]
pub mod recipes {}

#[doc = include_str!("../docs/guide/failure_policies.md")]
pub mod failure_policies {}

#[doc = include_str!("../docs/guide/concepts.md")]
pub mod concepts {}

#[doc = include_str!("../docs/guide/headers.md")]
pub mod headers {}

#[doc = include_str!("../docs/guide/cost_and_counting.md")]
pub mod cost_and_counting {}

#[doc = include_str!("../docs/guide/hard_caps.md")]
pub mod hard_caps {}

#[doc = include_str!("../docs/guide/leases.md")]
pub mod leases {}

#[doc = include_str!("../docs/guide/operating.md")]
pub mod operating {}

#[doc = include_str!("../docs/guide/reload.md")]
pub mod reload {}

#[doc = include_str!("../docs/guide/grpc.md")]
pub mod grpc {}

// Every example on this page uses `RedisBackend`: without the feature the page says so
// instead of failing to compile.
#[cfg_attr(
    feature = "redis",
    doc = include_str!("../docs/guide/redis_deployments.md")
)]
#[cfg_attr(
    not(feature = "redis"),
    doc = "Redis on a single node, behind Sentinel, or as a Cluster: this page is built \
           with the `redis` feature, which these docs were built without."
)]
pub mod redis_deployments {}

// The chart is inlined (it has no blank line, so it stays one HTML block): docs.rs serves
// the generated docs and no other file of the package, so an image link would be broken.
#[doc = include_str!("../docs/guide/simulator.md")]
#[doc = ""]
#[doc = "<div style=\"overflow-x: auto\">"]
#[doc = ""]
#[doc = include_str!("../docs/outage.svg")]
#[doc = ""]
#[doc = "</div>"]
pub mod simulator {}

// The chart is inlined, as the simulator page's is. The page configures the two-tier
// store, a `RedisBackend`: without the feature it says so instead of failing to compile.
#[cfg_attr(feature = "redis", doc = include_str!("../docs/guide/regions.md"))]
#[cfg_attr(feature = "redis", doc = "")]
#[cfg_attr(feature = "redis", doc = "<div style=\"overflow-x: auto\">")]
#[cfg_attr(feature = "redis", doc = "")]
#[cfg_attr(feature = "redis", doc = include_str!("../docs/regions.svg"))]
#[cfg_attr(feature = "redis", doc = "")]
#[cfg_attr(feature = "redis", doc = "</div>")]
#[cfg_attr(
    not(feature = "redis"),
    doc = "One limit across regions, the two-tier store: this page is built with the \
           `redis` feature, which these docs were built without."
)]
pub mod regions {}
