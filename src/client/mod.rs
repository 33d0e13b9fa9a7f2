//! Client-side adaptive throttling for outgoing calls (Google SRE book, "Handling Overload").
//!
//! The client keeps, over a sliding window (two minutes by default), how many requests it
//! attempted and how many of them the backend accepted. Before each call it rejects the
//! request locally, without sending it, with probability
//!
//! ```text
//! max(0, (requests - K * accepts) / (requests + 1))
//! ```
//!
//! so that, when the backend keeps refusing, the traffic that still reaches it settles at
//! about K times what it accepts: enough to notice when it recovers, without spending its
//! capacity on refusals. Locally rejected requests count in `requests`, as in the book.
//!
//! This layer needs no store and knows nothing of the rate limiter above it: its only
//! inputs are the responses of the service it wraps, a [`Clock`](crate::store::Clock) and a
//! random source (replaceable in tests).
//!
//! [`HoldBackLayer`] listens to what the server says instead: after a 429 or 503 with
//! `Retry-After`, a `RateLimit` policy with nothing left, or gRPC's
//! `grpc-retry-pushback-ms`, calls to that server (or partition of it) stay local until the
//! advertised time. Put it outside the adaptive throttle; see its docs.
//!
//! A call either layer does not send fails with tower's boxed error holding a [`NotSent`],
//! whose [`reason`](NotSent::reason) says which layer kept it and why.

#[macro_use]
mod plumbing;

mod config;
mod error;
pub(crate) mod future;
pub(crate) mod hold;
mod layer;
mod rejection;
mod service;
mod stats;
mod window;

pub use error::{HoldReason, NotSent};
pub use hold::{HoldBack, HoldBackBody, HoldBackLayer};
pub use layer::AdaptiveThrottleLayer;
pub use service::AdaptiveThrottle;
