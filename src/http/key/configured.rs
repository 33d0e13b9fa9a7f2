//! One extractor type over the built-in ones, chosen at run time (from a configuration
//! file, say), where the layer's type cannot depend on the choice.

use std::collections::HashMap;
use std::sync::Arc;

use http::Request;

use crate::http::key::client_ip::ClientIp;
use crate::http::key::header::HeaderKey;
use crate::http::key::{Extracted, KeyExtractor};
use crate::store::caller::{Caller, CallerKey};

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
    /// One of the above, with budgets read from headers and callers' own quotas: as a
    /// limiter definition's key declares them.
    Defined(DefinedKey),
}

/// A key as a limiter definition declares it beyond the built-ins: the caller found by
/// another key, made a member of the budgets whose keys its request's headers name
/// ([`Caller::within`]), and given the quotas listed for its key
/// ([`Caller::with_quota`]). Built by `tollgate::config::LimiterDefinition::key` (the
/// `serde` feature), or by hand as below.
///
/// ```
/// use tollgate::Caller;
/// use tollgate::key::{DefinedKey, HeaderKey, KeyExtractor, Extracted};
///
/// let key = DefinedKey::new(HeaderKey::new("x-customer-id").into())
///     .within("org", HeaderKey::new("x-org-id"))
///     .quota("acme", "per-minute", 250);
/// let request = http::Request::get("/")
///     .header("x-customer-id", "acme")
///     .header("x-org-id", "initech")
///     .body(())
///     .unwrap();
/// let Extracted::Caller(caller) = key.extract(&request) else { panic!() };
/// assert_eq!(caller, Caller::new("acme").with_quota("per-minute", 250).within("org", "initech"));
/// ```
#[derive(Clone, Debug)]
pub struct DefinedKey {
    key: Box<ConfiguredKey>,
    within: Arc<[(Arc<str>, HeaderKey)]>,
    quotas: Arc<QuotasByCaller>,
}

/// Callers' own quotas: by caller key, (policy name, quota) pairs.
type QuotasByCaller = HashMap<CallerKey, Vec<(Arc<str>, u64)>>;

impl DefinedKey {
    /// Callers as `key` finds them, no budget, no quota of their own yet.
    pub fn new(key: ConfiguredKey) -> Self {
        Self {
            key: Box::new(key),
            within: Arc::from([]),
            quotas: Arc::default(),
        }
    }

    /// Makes each caller a member of the budget at `level` whose key is in the header
    /// `header` reads (none when the request has no such header). Innermost level first.
    pub fn within(mut self, level: impl Into<Arc<str>>, header: HeaderKey) -> Self {
        let mut within = self.within.to_vec();
        within.push((level.into(), header));
        self.within = within.into();
        self
    }

    /// Gives the caller of key `caller` a quota of `quota` for its policy `policy`.
    pub fn quota(
        mut self,
        caller: impl Into<CallerKey>,
        policy: impl Into<Arc<str>>,
        quota: u64,
    ) -> Self {
        Arc::make_mut(&mut self.quotas)
            .entry(caller.into())
            .or_default()
            .push((policy.into(), quota));
        self
    }
}

impl From<HeaderKey> for ConfiguredKey {
    fn from(key: HeaderKey) -> Self {
        ConfiguredKey::Header(key)
    }
}

impl KeyExtractor for DefinedKey {
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        let caller = match self.key.extract(request) {
            Extracted::Caller(caller) => caller,
            other => return other,
        };
        let caller = match self.quotas.get(caller.key()) {
            Some(quotas) => quotas.iter().fold(caller, |caller, (policy, quota)| {
                caller.with_quota(policy.clone(), *quota)
            }),
            None => caller,
        };
        let caller = self.within.iter().fold(caller, |caller, (level, header)| {
            match header.extract(request) {
                Extracted::Caller(budget) => caller.within(level.clone(), budget.key().clone()),
                _ => caller,
            }
        });
        Extracted::Caller(caller)
    }
}

impl KeyExtractor for ConfiguredKey {
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        match self {
            ConfiguredKey::Header(key) => key.extract(request),
            ConfiguredKey::ClientIp(key) => key.extract(request),
            ConfiguredKey::Global(key) => key.extract(request),
            ConfiguredKey::Defined(key) => key.extract(request),
        }
    }
}
