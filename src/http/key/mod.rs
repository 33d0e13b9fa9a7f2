//! Key extraction: who a request is counted as.
//!
//! A [`KeyExtractor`] reads a request and names its [`Caller`]. The built-ins cover the
//! usual sources: a request header ([`HeaderKey`]), a request extension set by earlier
//! authentication middleware ([`ExtensionKey`]), the client IP behind trusted proxies
//! ([`ClientIp`]), one key for everybody (a fixed [`Caller`]) and a closure ([`FnKey`]);
//! [`ConfiguredKey`] is one of the first kinds chosen at run time.

mod client_ip;
mod configured;
mod extension;
mod header;

use std::fmt;
use std::future::{Future, Ready, ready};
use std::sync::Arc;

use http::{Request, StatusCode};

use crate::store::caller::Caller;

pub use client_ip::ClientIp;
pub use configured::{ConfiguredKey, DefinedKey};
pub use extension::ExtensionKey;
pub use header::HeaderKey;

/// What a key extractor found for one request.
///
/// `From` conversions let an extractor return what it has: a [`Caller`], an
/// `Option<Caller>` (`None` is [`NoKey`](Self::NoKey)), a [`KeyRejection`], or a `Result`
/// of any of those with a rejection as its error (so a closure can use `?`).
///
/// ```
/// use tollgate::Caller;
/// use tollgate::key::Extracted;
///
/// assert!(matches!(Extracted::from(Some(Caller::new("acme"))), Extracted::Caller(_)));
/// assert!(matches!(Extracted::from(None::<Caller>), Extracted::NoKey));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
// Its kind in a whole word: kept in the caller's key's first byte, the kind made each move
// of the caller copy from its second byte, in pieces the next move had to wait on.
#[repr(u64)]
pub enum Extracted {
    /// The request is counted as this caller.
    Caller(Caller),
    /// The request does not say who is calling: the layer's [`MissingKey`] choice decides.
    NoKey,
    /// The request is refused with this 4xx, whatever the limits.
    Rejected(KeyRejection),
}

impl From<Caller> for Extracted {
    #[inline]
    fn from(caller: Caller) -> Self {
        Extracted::Caller(caller)
    }
}

impl From<Option<Caller>> for Extracted {
    #[inline]
    fn from(caller: Option<Caller>) -> Self {
        caller.map_or(Extracted::NoKey, Extracted::Caller)
    }
}

impl From<KeyRejection> for Extracted {
    #[inline]
    fn from(rejection: KeyRejection) -> Self {
        Extracted::Rejected(rejection)
    }
}

impl<T: Into<Extracted>> From<Result<T, KeyRejection>> for Extracted {
    fn from(result: Result<T, KeyRejection>) -> Self {
        result.map_or_else(Extracted::Rejected, Into::into)
    }
}

/// Names the caller of a request, synchronously: one method, as most extractors need.
///
/// Every `KeyExtractor` is also an [`AsyncKeyExtractor`], which is what the layer takes,
/// and the layer decides its requests within `call` (no key future to wait on). For a
/// key that needs a lookup (the caller's plan in a database, say), implement
/// [`AsyncKeyExtractor`] instead, or use [`AsyncFnKey`].
///
/// ```
/// use http::Request;
/// use tollgate::{Caller, key::KeyExtractor};
/// use tollgate::key::Extracted;
///
/// /// Counts callers by the first path segment, e.g. `/tenants/acme/...` -> `tenants`.
/// #[derive(Clone, Debug)]
/// struct FirstSegment;
///
/// impl KeyExtractor for FirstSegment {
///     fn extract<B>(&self, request: &Request<B>) -> Extracted {
///         let segment = request.uri().path().split('/').nth(1).filter(|s| !s.is_empty());
///         segment.map(Caller::new).into()
///     }
/// }
///
/// let request = Request::builder().uri("/tenants/acme").body(()).unwrap();
/// assert_eq!(FirstSegment.extract(&request), Extracted::Caller(Caller::new("tenants")));
/// ```
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// Who `request` is counted as.
    fn extract<B>(&self, request: &Request<B>) -> Extracted;
}

/// Names the caller of a request, possibly after waiting: what
/// [`RateLimitLayer::key`](crate::RateLimitLayer::key) takes.
///
/// Every [`KeyExtractor`] is one, answering at once. Implement this trait directly only for
/// an extractor that must wait (a lookup of the caller's plan, say): it reads what it needs
/// from the request synchronously and returns an owned future, so the request itself is
/// not borrowed while the future runs.
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use http::Request;
/// use tollgate::Caller;
/// use tollgate::key::{AsyncKeyExtractor, Extracted};
///
/// /// Looks the caller's plan up by its API key.
/// #[derive(Clone, Debug)]
/// struct PlanLookup;
///
/// impl AsyncKeyExtractor for PlanLookup {
///     type Future = Pin<Box<dyn Future<Output = Extracted> + Send>>;
///
///     fn extract_async<B>(&self, request: &Request<B>) -> Self::Future {
///         let key = request.headers().get("x-api-key").cloned();
///         Box::pin(async move {
///             let Some(key) = key else { return Extracted::NoKey };
///             // A real service would ask its database here.
///             let plan = if key.as_bytes().starts_with(b"gold-") { "gold" } else { "free" };
///             Caller::new(key.as_bytes()).with_tier(plan).into()
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let request = Request::builder().header("x-api-key", "gold-1").body(()).unwrap();
/// let Extracted::Caller(caller) = PlanLookup.extract_async(&request).await else { panic!() };
/// assert_eq!(caller.tier(), Some("gold"));
/// # }
/// ```
pub trait AsyncKeyExtractor: Clone + Send + Sync + 'static {
    /// The future that resolves to the caller.
    type Future: Future<Output = Extracted> + Send + 'static;

    /// Starts extracting the caller of `request`.
    fn extract_async<B>(&self, request: &Request<B>) -> Self::Future;

    /// The caller without waiting, when this extractor knows it at once (every
    /// [`KeyExtractor`] does); `None`, the default, makes the layer await
    /// [`extract_async`](Self::extract_async).
    fn extract_now<B>(&self, request: &Request<B>) -> Option<Extracted> {
        let _ = request;
        None
    }
}

impl<K: KeyExtractor> AsyncKeyExtractor for K {
    type Future = Ready<Extracted>;

    fn extract_async<B>(&self, request: &Request<B>) -> Self::Future {
        ready(self.extract(request))
    }

    // Inlined into the layer's `call`, so that the caller is built where the decision reads
    // it: returned, it is read back right after it was written, before the writes land.
    #[inline(always)]
    fn extract_now<B>(&self, request: &Request<B>) -> Option<Extracted> {
        Some(self.extract(request))
    }
}

/// An extractor's refusal of a request, answered with a 4xx problem+json response.
///
/// ```
/// use http::StatusCode;
/// use tollgate::key::KeyRejection;
///
/// let rejection = KeyRejection::new(StatusCode::BAD_REQUEST, "malformed X-Forwarded-For");
/// assert_eq!(rejection.status(), StatusCode::BAD_REQUEST);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRejection {
    status: StatusCode,
    detail: Arc<str>,
}

impl KeyRejection {
    /// A rejection with a 4xx status and a human-readable detail. A status outside 4xx is
    /// replaced by 400, so an extractor can never make the layer answer 5xx.
    pub fn new(status: StatusCode, detail: impl Into<Arc<str>>) -> Self {
        let status = if status.is_client_error() {
            status
        } else {
            StatusCode::BAD_REQUEST
        };
        Self {
            status,
            detail: detail.into(),
        }
    }

    /// The response status, always 4xx.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What was wrong with the request.
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.detail)
    }
}

/// What the layer does with a request for which the extractor found no key.
///
/// ```
/// use http::StatusCode;
/// use tollgate::key::MissingKey;
///
/// let reject = MissingKey::Reject(StatusCode::UNAUTHORIZED);
/// assert_eq!(MissingKey::default(), MissingKey::Reject(StatusCode::BAD_REQUEST));
/// # drop(reject);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this 4xx status and a problem+json body (a non-4xx status is taken as 400).
    Reject(StatusCode),
    /// Count every such request in one shared bucket, [`CallerKey::anonymous`](crate::store::CallerKey::anonymous).
    Anonymous,
    /// Let the request through without counting it.
    Pass,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// A fixed caller counts every request as itself: one key for every request, a limit on
/// the whole route rather than per caller.
///
/// ```
/// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
///
/// // At most 1,000 requests a second to this route, whoever sends them.
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("route", Quota::per_second(1_000)))
///     .build();
/// let layer = RateLimitLayer::new(limiter).key(Caller::new("*"));
/// # drop(layer);
/// ```
impl KeyExtractor for Caller {
    fn extract<B>(&self, _request: &Request<B>) -> Extracted {
        Extracted::Caller(self.clone())
    }
}

/// A key extractor from a closure over the request's head.
///
/// The closure sees [`http::request::Parts`]-like access through `&Request<()>`: method, URI,
/// headers and extensions, but not the body. It returns anything that converts into
/// [`Extracted`]: an `Option<Caller>`, a [`Caller`], a [`KeyRejection`] or `Extracted`
/// itself.
///
/// ```
/// use tollgate::{Caller, key::FnKey};
///
/// // Count callers by tenant, taken from the host name.
/// let by_host = FnKey::new(|request: &http::Request<()>| request.uri().host().map(Caller::new));
/// # drop(by_host);
/// ```
#[derive(Clone)]
pub struct FnKey<F> {
    f: F,
}

impl<F, O> FnKey<F>
where
    F: Fn(&Request<()>) -> O + Clone + Send + Sync + 'static,
    O: Into<Extracted>,
{
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> fmt::Debug for FnKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnKey").finish_non_exhaustive()
    }
}

impl<F, O> KeyExtractor for FnKey<F>
where
    F: Fn(&Request<()>) -> O + Clone + Send + Sync + 'static,
    O: Into<Extracted>,
{
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        (self.f)(&head_of(request)).into()
    }
}

/// An asynchronous key extractor from a closure that returns a future, for lookups such as
/// the caller's plan.
///
/// ```
/// use tollgate::{Caller, key::AsyncFnKey};
/// use tollgate::key::Extracted;
///
/// let with_plan = AsyncFnKey::new(|request: &http::Request<()>| {
///     let key = request.headers().get("x-api-key").cloned();
///     async move {
///         let Some(key) = key else { return Extracted::NoKey };
///         // A real service would look the plan up in its database here.
///         let plan = if key.as_bytes().starts_with(b"gold-") { "gold" } else { "free" };
///         Caller::new(key.as_bytes()).with_tier(plan).into()
///     }
/// });
/// # drop(with_plan);
/// ```
#[derive(Clone)]
pub struct AsyncFnKey<F> {
    f: F,
}

impl<F, Fut> AsyncFnKey<F>
where
    F: Fn(&Request<()>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Extracted> + Send + 'static,
{
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> fmt::Debug for AsyncFnKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncFnKey").finish_non_exhaustive()
    }
}

impl<F, Fut> AsyncKeyExtractor for AsyncFnKey<F>
where
    F: Fn(&Request<()>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Extracted> + Send + 'static,
{
    type Future = Fut;

    fn extract_async<B>(&self, request: &Request<B>) -> Self::Future {
        (self.f)(&head_of(request))
    }
}

// The closures see the head without the body; copying the head is the price of a
// closure that does not need to be generic over the body type.
fn head_of<B>(request: &Request<B>) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = request.method().clone();
    *head.uri_mut() = request.uri().clone();
    *head.version_mut() = request.version();
    *head.headers_mut() = request.headers().clone();
    *head.extensions_mut() = request.extensions().clone();
    head
}
