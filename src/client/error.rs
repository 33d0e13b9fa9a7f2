//! The error of a request rejected locally.

use std::error::Error;
use std::fmt;

use super::stats::ThrottleStats;

/// tower's boxed error: what the client middlewares fail with.
pub(super) type BoxError = Box<dyn Error + Send + Sync>;

/// A request rejected locally by an [`AdaptiveThrottle`](super::AdaptiveThrottle), with the
/// window it found.
///
/// The service's error is tower's boxed error (`Box<dyn Error + Send + Sync>`), as with
/// tower's own `Timeout` and `LoadShed`: a local rejection downcasts to `Throttled`; any
/// other error is the inner service's own, boxed as it boxes itself (an error already
/// boxed stays as it is, so the throttle composes with `Buffer` and `Timeout`).
///
/// ```
/// use tollgate::client::{AdaptiveThrottleLayer, Throttled};
/// use tollgate::store::ManualClock;
/// use http::{Request, Response, StatusCode};
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
/// let throttled = error.downcast_ref::<Throttled>().expect("rejected locally");
/// // One request, none accepted: (1 - 2 * 0) / (1 + 1).
/// assert_eq!(throttled.probability(), 0.5);
/// assert_eq!(throttled.stats().requests(), 1);
/// assert!(throttled.to_string().contains("rejected locally"));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttled {
    pub(super) stats: ThrottleStats,
}

impl Throttled {
    /// The rejection probability the request met.
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, Throttled};
    /// # use http::{Request, Response, StatusCode};
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
    /// assert_eq!(error.downcast_ref::<Throttled>().unwrap().probability(), 2.0 / 3.0);
    /// # }
    /// ```
    pub fn probability(&self) -> f64 {
        self.stats.probability
    }

    /// The window as the request found it (before counting the request itself).
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, Throttled};
    /// # use http::{Request, Response};
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    /// # });
    /// # let client = AdaptiveThrottleLayer::new().random(|| 0.0).layer(backend);
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// let error = client.oneshot(Request::new(())).await.unwrap_err();
    /// let stats = error.downcast_ref::<Throttled>().unwrap().stats();
    /// assert_eq!((stats.requests(), stats.accepts()), (1, 0));
    /// # }
    /// ```
    pub fn stats(&self) -> ThrottleStats {
        self.stats
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request rejected locally by the adaptive client throttle: the backend accepted \
             {} of the {} requests attempted in its window (rejection probability {:.3})",
            self.stats.accepts, self.stats.requests, self.stats.probability
        )
    }
}

impl Error for Throttled {}
