//! Leased quota: a hot caller's decisions made locally from units taken from the shared
//! store in advance.
//!
//! [`config`] is what a limiter is given ([`Leases`](config::Leases)); [`table`] tracks each
//! caller's local rate and the lease it holds; [`leasing`] is a limiter's share of both, with
//! the [`metrics`] that count them; [`path`] takes, spends and gives back leases on the
//! limiter's request path.

pub(crate) mod config;
pub(crate) mod leasing;
pub(crate) mod metrics;
pub(crate) mod path;
pub(crate) mod table;
