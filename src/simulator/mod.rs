//! Replays a store outage on virtual time: callers sending requests at steady rates to a
//! deployment of rate-limited instances, a phase on a healthy store, an outage, and a
//! recovery, through tollgate's real layer, limiter, circuit breaker and failure policies.
//!
//! Each instance is a [`RateLimitLayer`](crate::RateLimitLayer) keyed on the
//! `x-customer-id` header around a service that answers 200; the instances of a group share
//! one in-process store that stands in for Redis (remote as far as the limiter can tell, so
//! the breaker, the store timeout and the denial cache are in front of it) and fails as the
//! [`Scenario`](crate::simulator::Scenario) says: refusing every call, never answering, or
//! answering too late. Time is tokio's paused clock, so a 90 s timeline takes a few
//! seconds; the [`Report`](crate::simulator::Report) says, per group, per customer and per
//! phase, how many requests were sent, admitted and refused with 429 or 503, and how long
//! after the store came back every breaker of the group was closed again.
//!
//! [`Scenario::default`](crate::simulator::Scenario::default) is the running example (4
//! instances, 50 requests per second per customer, a 30 s outage) comparing every built-in
//! [`PolicyName`](crate::simulator::PolicyName). To see what *your* configuration does, add
//! a group whose limiters you build yourself: the factory receives each instance's
//! [`InstanceContext`](crate::simulator::InstanceContext), whose
//! [`limiter_builder`](crate::simulator::InstanceContext::limiter_builder) is already on
//! the group's store and the run's clock.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::simulator::{Customer, Phase, Scenario};
//! use tollgate::{FailurePolicy, InstanceCount, Policy, Quota};
//!
//! // Two instances; one customer sends 40 req/s against 20 per second; the store is down
//! // for 4 s in the middle.
//! let scenario = Scenario::new()
//!     .policies([])
//!     .instances(2)
//!     .traffic([Customer::new("acme", 40.0)])
//!     .normal_secs(2)
//!     .outage_secs(4)
//!     .recovery_secs(2)
//!     .group("my-limiter", |instance| {
//!         instance
//!             .limiter_builder()
//!             .policy(Policy::token_bucket("per-second", Quota::per_second(20), 20))
//!             .on_store_failure(FailurePolicy::local_share(InstanceCount::fixed(2)))
//!             .store_timeout(Duration::from_millis(20))
//!             .try_build()
//!     });
//! let report = scenario.run_blocking()?;
//! let outage = report.row("my-limiter", Phase::Outage, "acme").unwrap();
//! // While the store is down each instance enforces half the quota on its own: 20 per
//! // second in all, plus the two fresh buckets' burst (10 each) over the 4 s.
//! assert!(outage.admitted_per_sec <= 20.0 + 20.0 / 4.0 + 0.5, "{outage:?}");
//! assert!(outage.refused_429 > 0);
//! assert_eq!(outage.refused_503, 0);
//! let normal = report.row("my-limiter", Phase::Normal, "acme").unwrap();
//! assert!(normal.admitted_per_sec > 19.0 && normal.admitted_per_sec <= 31.0, "{normal:?}");
//! # Ok::<(), tollgate::simulator::SimulationError>(())
//! ```
//!
//! Inside a tokio test of your own, `.await`
//! [`Scenario::run`](crate::simulator::Scenario::run) on a paused clock
//! (`#[tokio::test(start_paused = true)]`) instead of calling
//! [`run_blocking`](crate::simulator::Scenario::run_blocking).
//! [`Scenario::run_against`](crate::simulator::Scenario::run_against) runs the same
//! timeline in real time against stores of your own (a real Redis behind a fault proxy,
//! say), with a [`FaultSwitch`](crate::simulator::FaultSwitch) to make them fail.

mod engine;
mod report;
mod scenario;
mod store;

pub use engine::{FaultSwitch, SimulationError};
pub use report::{Counts, GroupReport, Phase, Report, Row, Traced};
pub use scenario::{AlgorithmKind, Customer, FaultKind, PolicyName, Scenario, ScenarioError};
pub use store::{InstanceContext, SharedStore, SimClock};
