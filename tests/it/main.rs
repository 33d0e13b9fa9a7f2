//! tollgate's integration tests: one binary, a module per concern. Redis tests start their own
//! redis-server processes on free ports (see `tollgate_testkit::redis`).

mod algorithms;
mod axum_router;
mod bad_input;
mod client_throttle;
mod conformance;
mod counting;
mod counts;
mod custom_backend;
mod dashboard;
mod denial_cache;
mod failure_policies;
mod fault_proxy;
mod grpc;
mod headers;
mod hyper_service;
mod instances;
mod keys;
mod local_and_global;
mod lua_arithmetic;
mod memory;
mod metrics;
mod modes;
mod orders_api_e2e;
mod orders_api_reload;
mod outage;
mod quickstart;
mod recovery;
mod redis_backend;
mod redis_cluster;
mod reload;
mod request_cost;
mod shed;
mod simulate;
mod simulator_page;
mod skip_and_refusal;
