//! One extractor type over the built-in ones, chosen at run time (from a configuration
//! file, say), where the layer's type cannot depend on the choice.

use http::Request;

use crate::http::key::client_ip::ClientIp;
use crate::http::key::header::HeaderKey;
use crate::http::key::{Extracted, KeyExtractor};
use crate::store::caller::Caller;

/// A header, the client IP, or one key for everybody, picked at run time: the layer has
/// one type whichever it is.
///
/// ```
/// use tollgate::{Limiter, Policy, Quota, RateLimitLayer, key::{ConfiguredKey, HeaderKey}};
///
/// let from_config = "x-customer-id";
/// let key = ConfiguredKey::Header(HeaderKey::new(from_config));
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// let layer = RateLimitLayer::new(limiter).key(key);
/// # drop(layer);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConfiguredKey {
    /// By a request header: [`HeaderKey`].
    Header(HeaderKey),
    /// By the client's address: [`ClientIp`].
    ClientIp(ClientIp),
    /// Every request together, as this one caller.
    Global(Caller),
}

impl KeyExtractor for ConfiguredKey {
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        match self {
            ConfiguredKey::Header(key) => key.extract(request),
            ConfiguredKey::ClientIp(key) => key.extract(request),
            ConfiguredKey::Global(key) => key.extract(request),
        }
    }
}
