//! Counters in Redis: the backend with its decision script, and the registry of live
//! instances kept by heartbeats.

pub(crate) mod backend;
mod cluster;
pub(crate) mod registry;
