//! tollgate's integration tests: one binary, a module per concern. Redis tests start their own
//! redis-server processes on free ports (see `tollgate_testkit::redis`).
//!
//! A plain `cargo test` (default features) runs every test that needs no Redis;
//! `cargo test --all-features` runs them all. A module whose tests need a feature that is
//! off is compiled from `skipped/` instead: one test, which the output lists as ignored
//! with the feature it needs. A module with only some such tests leaves them out one by one
//! and has the same ignored test in a child module `skipped`.

#![allow(
    clippy::duplicate_mod,
    reason = "a file of skipped/ stands in for every module it replaces, so that the output names each"
)]

#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod alerts;
#[cfg_attr(not(feature = "axum"), path = "skipped/axum.rs")]
mod axum_router;
#[cfg_attr(not(feature = "axum"), path = "skipped/axum.rs")]
mod bad_input;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod bucket_expiry;
mod caller_quotas;
mod client_hold;
mod client_hold_trailers;
mod client_throttle;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod conformance;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod connection;
mod counting;
mod counts;
mod custom_backend;
mod dashboard;
mod denial_cache;
#[cfg_attr(
    not(all(feature = "redis", feature = "axum")),
    path = "skipped/redis_and_axum.rs"
)]
mod failure_policies;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod fault_proxy;
mod field_forms;
mod grpc;
#[cfg_attr(not(feature = "tonic"), path = "skipped/tonic.rs")]
mod grpc_client_ip;
mod headers;
mod hyper_service;
mod in_flight;
#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod in_flight_http;
#[cfg_attr(not(feature = "axum"), path = "skipped/axum.rs")]
mod inner_body;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod instances;
#[cfg_attr(not(feature = "axum"), path = "skipped/axum.rs")]
mod keys;
mod leases;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod local_and_global;
mod lockout;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod lua_arithmetic;
mod memory;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod metrics;
mod modes;
mod nested_budgets;
#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod orders_api_e2e;
#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod orders_api_reload;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod outage;
mod outage_edges;
#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod outage_edges_http;
mod quickstart;
mod recovery;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod redis_backend;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod redis_cluster;
#[cfg_attr(
    not(all(feature = "axum", feature = "redis", feature = "serde")),
    path = "skipped/orders_api.rs"
)]
mod redis_sentinel;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod refused_connections;
mod reload;
mod replay;
mod repository_map;
mod request_cost;
mod settle;
mod shed;
mod simulate;
mod simulator_page;
mod skip_and_refusal;
mod sliding_log;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod test_servers;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod two_tier;
mod typed_headers;
#[cfg_attr(not(feature = "redis"), path = "skipped/redis.rs")]
mod window_expiry;
