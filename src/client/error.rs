//! The error of a call a client layer did not send, and why it did not.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::stats::ThrottleStats;

/// tower's boxed error: what the client middlewares fail with.
pub(super) type BoxError = Box<dyn Error + Send + Sync>;

/// A call that a client layer answered locally, without sending it: an
/// [`AdaptiveThrottle`](super::AdaptiveThrottle) rejected it, or a
/// [`HoldBack`](super::HoldBack) held it back because its partition's server had said to
/// wait. [`reason`](Self::reason) tells which.
///
/// Both layers fail with tower's boxed error (`Box<dyn Error + Send + Sync>`), as tower's
/// own `Timeout` and `LoadShed` do: a call not sent downcasts to `NotSent`; any other error
/// is the inner service's own, boxed as it boxes itself (an error already boxed stays as it
/// is, so the layers compose with `Buffer` and `Timeout`).
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{HoldBackLayer, HoldReason, NotSent};
/// use tollgate::store::ManualClock;
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = tower::service_fn(|_req: Request<()>| async {
///     let response = Response::builder()
///         .status(StatusCode::TOO_MANY_REQUESTS)
///         .header("retry-after", "3")
///         .body(())
///         .unwrap();
///     Ok::<_, std::convert::Infallible>(response)
/// });
/// let client = HoldBackLayer::new().clock(ManualClock::new(0)).layer(backend);
/// let call = || Request::get("http://api.example.com/orders").body(()).unwrap();
/// assert_eq!(client.clone().oneshot(call()).await.unwrap().status(), 429);
/// let error = client.oneshot(call()).await.unwrap_err();
/// let not_sent = error.downcast_ref::<NotSent>().expect("held back");
/// assert_eq!(not_sent.reason(), HoldReason::RetryAfter);
/// assert_eq!(not_sent.partition(), Some("api.example.com"));
/// assert_eq!(not_sent.retry_after(), Some(Duration::from_secs(3)));
/// assert!(not_sent.to_string().contains("held back"));
/// # }
/// ```
///
/// The adaptive throttle's refusals carry the rejection probability the call met instead:
///
/// ```
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{AdaptiveThrottleLayer, HoldReason, NotSent};
/// use tollgate::store::ManualClock;
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let backend = tower::service_fn(|_req: Request<()>| async {
///     let mut response = Response::new(());
///     *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///     Ok::<_, std::io::Error>(response)
/// });
/// let client = AdaptiveThrottleLayer::new()
///     .clock(ManualClock::new(0))
///     .random(|| 0.0) // reject whenever the probability is above 0
///     .layer(backend);
/// assert_eq!(client.clone().oneshot(Request::new(())).await.unwrap().status(), 429);
/// let error = client.oneshot(Request::new(())).await.unwrap_err();
/// let not_sent = error.downcast_ref::<NotSent>().expect("rejected locally");
/// assert_eq!(not_sent.reason(), HoldReason::Throttled);
/// // One request, none accepted: (1 - 2 * 0) / (1 + 1).
/// assert_eq!(not_sent.rejection_probability(), Some(0.5));
/// assert_eq!((not_sent.partition(), not_sent.retry_after()), (None, None));
/// assert!(not_sent.to_string().contains("rejected locally"));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NotSent {
    kind: Kind,
}

/// What each layer knows about the call it did not send.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    /// Held back by a hold-back layer, for `retry_after` from when the call failed.
    Held {
        partition: Arc<str>,
        reason: HoldReason,
        retry_after: Duration,
    },
    /// Rejected by an adaptive throttle, with its window as the call found it.
    Throttled(ThrottleStats),
}

// The rejection probability is never NaN (the window's formula clamps at 0 and K is at
// least 1), so equality is total.
impl Eq for NotSent {}

impl NotSent {
    /// A call held back: `partition` stays held for `retry_after`, for `reason`.
    pub(super) fn held(partition: Arc<str>, reason: HoldReason, retry_after: Duration) -> Self {
        Self {
            kind: Kind::Held {
                partition,
                reason,
                retry_after,
            },
        }
    }

    /// A call the adaptive throttle rejected, with the window it found.
    pub(super) fn throttled(stats: ThrottleStats) -> Self {
        Self {
            kind: Kind::Throttled(stats),
        }
    }

    /// Why the call was not sent: [`HoldReason::Throttled`] for the adaptive throttle's
    /// own refusal, otherwise what the server had said.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, HoldReason, NotSent};
    /// # use tollgate::store::ManualClock;
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     let response = Response::builder().header("ratelimit", r#""s";r=0;t=4"#).body(()).unwrap();
    /// #     Ok::<_, std::convert::Infallible>(response)
    /// # });
    /// # let client = HoldBackLayer::new().clock(ManualClock::new(0)).layer(backend);
    /// # let call = || Request::get("http://api.example.com/").body(()).unwrap();
    /// # client.clone().oneshot(call()).await.unwrap();
    /// let error = client.oneshot(call()).await.unwrap_err();
    /// let not_sent = error.downcast_ref::<NotSent>().unwrap();
    /// assert_eq!(not_sent.reason(), HoldReason::RateLimitHeader);
    /// # }
    /// ```
    pub fn reason(&self) -> HoldReason {
        match &self.kind {
            Kind::Held { reason, .. } => *reason,
            Kind::Throttled(_) => HoldReason::Throttled,
        }
    }

    /// The partition that is held; `None` for a call the adaptive throttle rejected (it
    /// keeps one window for every call it wraps).
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, NotSent};
    /// # use tollgate::store::ManualClock;
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     let response = Response::builder().header("ratelimit", r#""s";r=0;t=4"#).body(()).unwrap();
    /// #     Ok::<_, std::convert::Infallible>(response)
    /// # });
    /// # let client = HoldBackLayer::new().clock(ManualClock::new(0)).layer(backend);
    /// # let call = || Request::get("http://api.example.com/").body(()).unwrap();
    /// # client.clone().oneshot(call()).await.unwrap();
    /// let error = client.oneshot(call()).await.unwrap_err();
    /// let not_sent = error.downcast_ref::<NotSent>().unwrap();
    /// assert_eq!(not_sent.partition(), Some("api.example.com"));
    /// # }
    /// ```
    pub fn partition(&self) -> Option<&str> {
        match &self.kind {
            Kind::Held { partition, .. } => Some(partition),
            Kind::Throttled(_) => None,
        }
    }

    /// How long the partition stays held from when the call failed: a call made after
    /// that is sent. `None` for a call the adaptive throttle rejected, which names no time
    /// (each later call is sent or not with the probability its window gives then).
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, NotSent};
    /// # use tollgate::store::ManualClock;
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     let response = Response::builder().header("ratelimit", r#""s";r=0;t=4"#).body(()).unwrap();
    /// #     Ok::<_, std::convert::Infallible>(response)
    /// # });
    /// # let client = HoldBackLayer::new().clock(ManualClock::new(0)).layer(backend);
    /// # let call = || Request::get("http://api.example.com/").body(()).unwrap();
    /// # client.clone().oneshot(call()).await.unwrap();
    /// let error = client.oneshot(call()).await.unwrap_err();
    /// let not_sent = error.downcast_ref::<NotSent>().unwrap();
    /// assert_eq!(not_sent.retry_after(), Some(std::time::Duration::from_secs(4)));
    /// # }
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.kind {
            Kind::Held { retry_after, .. } => Some(*retry_after),
            Kind::Throttled(_) => None,
        }
    }

    /// The rejection probability a call the adaptive throttle rejected met; `None` for a
    /// call held back.
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, NotSent};
    /// # use http::{Request, Response};
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    /// # });
    /// # let client = AdaptiveThrottleLayer::new().random(|| 0.0).layer(backend);
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// // After two failed calls:
    /// let error = client.oneshot(Request::new(())).await.unwrap_err();
    /// let not_sent = error.downcast_ref::<NotSent>().unwrap();
    /// assert_eq!(not_sent.rejection_probability(), Some(2.0 / 3.0));
    /// # }
    /// ```
    pub fn rejection_probability(&self) -> Option<f64> {
        match &self.kind {
            Kind::Held { .. } => None,
            Kind::Throttled(stats) => Some(stats.probability),
        }
    }
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Held {
                partition,
                reason,
                retry_after,
            } => {
                let ms = retry_after.as_millis();
                write!(f, "call to {partition:?} held back locally, not sent: ")?;
                let said = match reason {
                    HoldReason::RetryAfter => "Retry-After",
                    HoldReason::RateLimitHeader => "a RateLimit policy with nothing left",
                    HoldReason::GrpcPushback => "grpc-retry-pushback-ms",
                    HoldReason::GrpcNoRetry => {
                        return write!(
                            f,
                            "the server said not to retry (grpc-retry-pushback-ms below zero \
                             or not an integer), so the partition is held for the layer's \
                             longest hold: another {ms} ms"
                        );
                    }
                    // Never held for it; said for completeness.
                    HoldReason::Throttled => "its refusals",
                };
                write!(f, "the server said to wait ({said}) for another {ms} ms")
            }
            Kind::Throttled(stats) => write!(
                f,
                "request rejected locally by the adaptive client throttle, not sent: the \
                 backend accepted {} of the {} requests attempted in its window (rejection \
                 probability {:.3})",
                stats.accepts, stats.requests, stats.probability
            ),
        }
    }
}

impl Error for NotSent {}

/// Why a client layer did not send a call: the adaptive throttle's own refusal, or what
/// the server had said.
///
/// ```
/// use tollgate::client::HoldReason;
/// assert_eq!(HoldReason::RetryAfter.as_str(), "retry_after");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldReason {
    /// A 429 or 503 with `Retry-After`.
    RetryAfter,
    /// A `RateLimit` field with a policy at `r=0`, held for its `t`.
    RateLimitHeader,
    /// gRPC's `grpc-retry-pushback-ms` with a number of milliseconds above zero, held for
    /// that long.
    GrpcPushback,
    /// gRPC's "do not retry": `grpc-retry-pushback-ms` below zero or not an integer, beside
    /// RESOURCE_EXHAUSTED or UNAVAILABLE. The server names no time, so the partition is held
    /// for the layer's [`max_hold`](super::HoldBackLayer::max_hold).
    GrpcNoRetry,
    /// Rejected by an [`AdaptiveThrottleLayer`](super::AdaptiveThrottleLayer): the backend
    /// has been refusing calls. No server said to wait, so a
    /// [`HoldBackLayer`](super::HoldBackLayer) never holds a partition for it.
    Throttled,
}

impl HoldReason {
    /// The reason as a label: `retry_after`, `ratelimit`, `grpc_pushback`,
    /// `grpc_no_retry` (the `reason` of `tollgate_client_held_back_total`), or `throttled`
    /// (which the throttle counts in `tollgate_client_throttled_total` instead).
    ///
    /// ```
    /// use tollgate::client::HoldReason;
    /// assert_eq!(HoldReason::GrpcPushback.as_str(), "grpc_pushback");
    /// assert_eq!(HoldReason::GrpcNoRetry.as_str(), "grpc_no_retry");
    /// assert_eq!(HoldReason::Throttled.as_str(), "throttled");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::RetryAfter => "retry_after",
            HoldReason::RateLimitHeader => "ratelimit",
            HoldReason::GrpcPushback => "grpc_pushback",
            HoldReason::GrpcNoRetry => "grpc_no_retry",
            HoldReason::Throttled => "throttled",
        }
    }
}
