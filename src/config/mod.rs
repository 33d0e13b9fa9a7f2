//! Limiter definitions read from a configuration file (the `serde` feature): policies,
//! tiers, the failure policy, the store timeout and the key, in any format serde reads.
//!
//! A [`LimiterDefinition`] is read whole from the file; [`limits`](LimiterDefinition::limits),
//! [`builder`](LimiterDefinition::builder) and [`key`](LimiterDefinition::key) turn it into
//! the crate's types, and refuse what cannot work with a [`BuildError`](crate::BuildError),
//! never a panic. Durations are strings of a whole number and a unit: `"500ms"`, `"1s"`, `"1m"`,
//! `"1h"`, `"1d"`.
//!
//! A complete definition in TOML (any field may be left out, except one default policy):
//!
//! ```
//! use tollgate::config::LimiterDefinition;
//! use tollgate::{InMemoryBackend, RateLimitLayer};
//!
//! let text = r#"
//! name = "orders"
//! store_timeout = "20ms"
//! ## "open", "closed", "static", or a local share:
//! on_store_failure = { local_share = { instances = 4 } }
//! ## { header = "..." }, "client_ip" or "global":
//! key = { header = "x-customer-id" }
//!
//! [[policies]]
//! name = "per-second"
//! algorithm = "sliding_window"
//! limit = 50
//! window = "1s"
//!
//! [[policies]]
//! name = "burst"
//! algorithm = "token_bucket"
//! rate = 10        # tokens added every period
//! period = "1s"
//! burst = 30       # at most this many held
//!
//! ## The fifth failure within 10 minutes locks the caller out for 10 minutes
//! ## (Policy::lock_out_for; with RateLimitLayer::count_only, only failures count):
//! [[tiers.signin]]
//! name = "wrong-codes"
//! algorithm = "sliding_window"
//! limit = 5
//! window = "10m"
//! lockout = "10m"
//!
//! ## An organisation's budget, shared by its callers (Caller::within("org", ...)):
//! [[levels.org]]
//! name = "per-second"
//! algorithm = "sliding_window"
//! limit = 200
//! window = "1s"
//!
//! ## Callers on the enterprise plan (Caller::with_tier("enterprise")):
//! [[tiers.enterprise]]
//! name = "per-second"
//! algorithm = "sliding_window"
//! limit = 120
//! window = "1s"
//! "#;
//! let definition: LimiterDefinition = toml::from_str(text).unwrap();
//! let limiter = definition.builder().unwrap().backend(InMemoryBackend::new()).build();
//! assert_eq!(limiter.name(), "orders");
//! assert_eq!(limiter.policies().len(), 2);
//! let limits = definition.limits().unwrap();
//! let (_, signin) = limits.tiers().find(|(tier, _)| *tier == "signin").unwrap();
//! assert_eq!(signin[0].lockout(), Some(std::time::Duration::from_secs(600)));
//! let layer = RateLimitLayer::new(limiter.clone()).key(definition.key().unwrap().unwrap());
//! # drop(layer);
//!
//! // Later, the file changed: new limits for the running limiter.
//! let changed: LimiterDefinition = toml::from_str(&text.replace("limit = 50", "limit = 100")).unwrap();
//! limiter.set_limits(changed.limits().unwrap()).unwrap();
//! assert_eq!(limiter.policies()[0].quota(), 100);
//! ```
//!
//! A counter keeps its count across such a change when its policy keeps its name,
//! algorithm and unit (see [`Limiter::set_limits`](crate::Limiter::set_limits)).

mod definition;
mod duration;

pub use definition::LimiterDefinition;
