//! Counters in Redis: the backend with its decision script, its connections (a single node,
//! a Sentinel master, a cluster with its slot map), the registry of live instances kept by
//! heartbeats, and the two-tier store that keeps one limit across regions.

pub(crate) mod backend;
mod cluster;
mod cluster_link;
mod connecting;
mod eval;
mod link;
mod race;
pub(crate) mod registry;
mod sentinel;
mod sentinel_announcements;
mod slots;
mod topology;
pub(crate) mod two_tier;
