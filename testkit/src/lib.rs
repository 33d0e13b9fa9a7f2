//! tollgate's test doubles, shared by its integration tests, examples and benchmarks.
//!
//! Everything here is real: [`redis`] starts redis-server processes (a single node, a
//! Redis Cluster with replicas, or a master, its replica and three Sentinels) on free ports
//! in temporary directories, never the machine's own Redis on 6379; [`proxy`] is a TCP
//! proxy that can pass, refuse, blackhole, delay, cut and hold a connection's first bytes; [`checks`] asks a
//! limiter directly; [`counting`] counts the calls that reach a backend; [`recorder`] captures metrics;
//! [`http`] sends raw HTTP/1.1 and parses the answer; [`orders_api`] starts the example
//! service and drives it with traffic over HTTP; [`rates`] measures admitted rates and
//! worst windows; [`temp_file`] writes a file for a test and removes it after.

pub mod checks;
pub mod counting;
pub mod example;
pub mod http;
pub mod orders_api;
pub mod proxy;
pub mod random;
pub mod rates;
pub mod recorder;
pub mod redis;
pub mod remote;
pub mod temp_file;
