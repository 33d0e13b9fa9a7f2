//! Key extraction: who a request is counted as.
//!
//! A [`KeyExtractor`] reads a request and names its [`Caller`]. The built-ins cover the
//! usual sources: a request header ([`HeaderKey`]), a request extension set by earlier
//! authentication middleware ([`ExtensionKey`]), the client IP behind trusted proxies
//! ([`ClientIp`]), one key for everybody ([`GlobalKey`]) and a closure ([`FnKey`]);
//! [`ConfiguredKey`] is one of the first kinds chosen at run time.

mod client_ip;
mod configured;
mod extension;
mod header;

use std::fmt;
use std::future::{Future, Ready, ready};
use std::sync::Arc;

use http::{Request, StatusCode};

use crate::store::caller::{Caller, CallerKey};

pub use client_ip::{ClientIp, ForwardedHeader, InvalidCidr, TrustedProxies};
pub use configured::ConfiguredKey;
pub use extension::ExtensionKey;
pub use header::HeaderKey;

/// What a key extractor found: a caller, no key at all (`Ok(None)`, handled by the layer's
/// [`MissingKey`] choice), or a rejection that becomes a 4xx response.
pub type KeyResult = Result<Option<Caller>, KeyRejection>;

/// Names the caller of a request.
///
/// Extraction may be asynchronous (a lookup of the caller's plan, say): the extractor reads
/// what it needs from the request synchronously and returns an owned future, so the request
/// itself is not borrowed while the future runs. Synchronous extractors return
/// [`std::future::Ready`] and also answer [`extract_now`](KeyExtractor::extract_now), so
/// the layer decides within `call`.
///
/// ```
/// use std::future::{Ready, ready};
/// use http::Request;
/// use tollgate::{Caller, KeyExtractor};
/// use tollgate::key::KeyResult;
///
/// /// Counts callers by the first path segment, e.g. `/tenants/acme/...` -> `tenants`.
/// #[derive(Clone, Debug)]
/// struct FirstSegment;
///
/// impl KeyExtractor for FirstSegment {
///     type Future = Ready<KeyResult>;
///     fn extract<B>(&self, request: &Request<B>) -> Self::Future {
///         let segment = request.uri().path().split('/').nth(1).filter(|s| !s.is_empty());
///         ready(Ok(segment.map(Caller::new)))
///     }
///
///     fn extract_now<B>(&self, request: &Request<B>) -> Option<KeyResult> {
///         Some(self.extract(request).into_inner())
///     }
/// }
/// let request = Request::builder().uri("/tenants/acme").body(()).unwrap();
/// let caller = FirstSegment.extract_now(&request).unwrap().unwrap().unwrap();
/// assert_eq!(caller.key().encoded(), b"=tenants");
/// ```
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The future that resolves to the caller.
    type Future: Future<Output = KeyResult> + Send + 'static;

    /// Starts extracting the caller of `request`.
    fn extract<B>(&self, request: &Request<B>) -> Self::Future;

    /// The key without waiting, when this extractor can tell it at once; `None` (the
    /// default) means the layer awaits [`extract`](Self::extract). Every built-in extractor
    /// but [`AsyncFnKey`] answers here, and the layer then decides the request within
    /// `call`, so its response future carries no copy of the request.
    ///
    /// ```
    /// use tollgate::{HeaderKey, KeyExtractor};
    ///
    /// let request = http::Request::builder().header("x-api-key", "k-1").body(()).unwrap();
    /// let caller = HeaderKey::new("x-api-key").extract_now(&request);
    /// assert_eq!(caller.unwrap().unwrap().unwrap().key().encoded(), b"=k-1");
    /// ```
    fn extract_now<B>(&self, request: &Request<B>) -> Option<KeyResult> {
        let _ = request;
        None
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
/// use tollgate::MissingKey;
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
    /// Count every such request in one shared bucket, [`CallerKey::anonymous`].
    Anonymous,
    /// Let the request through without counting it.
    Pass,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// One key for every request: a limit on the whole route rather than per caller.
///
/// ```
/// use tollgate::{GlobalKey, Limiter, Policy, Quota, RateLimitLayer};
///
/// // At most 1,000 requests a second to this route, whoever sends them.
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("route", Quota::per_second(1_000)))
///     .build();
/// let layer = RateLimitLayer::new(limiter).key(GlobalKey);
/// # drop(layer);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Future = Ready<KeyResult>;

    fn extract<B>(&self, _request: &Request<B>) -> Self::Future {
        ready(Ok(Some(Caller::new(CallerKey::new("*")))))
    }

    fn extract_now<B>(&self, request: &Request<B>) -> Option<KeyResult> {
        Some(self.extract(request).into_inner())
    }
}

/// A key extractor from a closure over the request's head.
///
/// The closure sees [`http::request::Parts`]-like access through `&Request<()>`: method, URI,
/// headers and extensions, but not the body.
///
/// ```
/// use tollgate::{Caller, FnKey};
///
/// // Count callers by tenant, taken from the host name.
/// let by_host = FnKey::new(|request: &http::Request<()>| {
///     Ok(request.uri().host().map(Caller::new))
/// });
/// # drop(by_host);
/// ```
#[derive(Clone)]
pub struct FnKey<F> {
    f: F,
}

impl<F> FnKey<F>
where
    F: Fn(&Request<()>) -> KeyResult + Clone + Send + Sync + 'static,
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

impl<F> KeyExtractor for FnKey<F>
where
    F: Fn(&Request<()>) -> KeyResult + Clone + Send + Sync + 'static,
{
    type Future = Ready<KeyResult>;

    fn extract<B>(&self, request: &Request<B>) -> Self::Future {
        ready((self.f)(&head_of(request)))
    }

    fn extract_now<B>(&self, request: &Request<B>) -> Option<KeyResult> {
        Some(self.extract(request).into_inner())
    }
}

/// An asynchronous key extractor from a closure that returns a future, for lookups such as
/// the caller's plan.
///
/// ```
/// use tollgate::{AsyncFnKey, Caller};
///
/// let with_plan = AsyncFnKey::new(|request: &http::Request<()>| {
///     let key = request.headers().get("x-api-key").cloned();
///     async move {
///         let Some(key) = key else { return Ok(None) };
///         // A real service would look the plan up in its database here.
///         let plan = if key.as_bytes().starts_with(b"gold-") { "gold" } else { "free" };
///         Ok(Some(Caller::new(key.as_bytes()).with_tier(plan)))
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
    Fut: Future<Output = KeyResult> + Send + 'static,
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

impl<F, Fut> KeyExtractor for AsyncFnKey<F>
where
    F: Fn(&Request<()>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = KeyResult> + Send + 'static,
{
    type Future = Fut;

    fn extract<B>(&self, request: &Request<B>) -> Self::Future {
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
