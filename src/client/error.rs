//! The error: a local rejection, or the inner service's own error.

use std::error::Error;
use std::fmt;

use super::stats::ThrottleStats;

/// tower's boxed error.
type BoxError = Box<dyn Error + Send + Sync>;

/// The error of an [`AdaptiveThrottle`](super::AdaptiveThrottle) service: the request was
/// rejected locally, or the inner service failed.
///
/// Display and [`source`](Error::source) are those of the inner error for
/// [`Inner`](ThrottleError::Inner) (the wrapper adds nothing to an error chain). Where the
/// stack wants a boxed error (`Box<dyn Error + Send + Sync>`, tower's `BoxError`),
/// [`into_box_error`](ThrottleError::into_box_error) gives one
/// from which [`Throttled`] can be downcast, as tower's own middleware errors are.
///
/// ```
/// use tollgate::client::{ThrottleError, Throttled};
///
/// fn retry_later<E>(error: &ThrottleError<E>) -> bool {
///     match error {
///         // Not sent at all: the backend has been refusing; back off rather than retry.
///         ThrottleError::Throttled(throttled) => throttled.probability() < 0.5,
///         // Sent and failed: the caller's own retry policy applies.
///         ThrottleError::Inner(_) => true,
///     }
/// }
/// # let _ = retry_later::<std::io::Error>;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum ThrottleError<E> {
    /// Rejected locally: the request never reached the inner service.
    Throttled(Throttled),
    /// The inner service failed (or was not ready).
    Inner(E),
}

impl<E> ThrottleError<E> {
    /// Whether the request was rejected locally.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert!(!ThrottleError::Inner("boom").is_throttled());
    /// ```
    pub fn is_throttled(&self) -> bool {
        matches!(self, ThrottleError::Throttled(_))
    }

    /// The local rejection, if it was one.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert!(ThrottleError::Inner("boom").throttled().is_none());
    /// ```
    pub fn throttled(&self) -> Option<&Throttled> {
        match self {
            ThrottleError::Throttled(throttled) => Some(throttled),
            ThrottleError::Inner(_) => None,
        }
    }

    /// The inner service's error, if it was one.
    ///
    /// ```
    /// use tollgate::client::ThrottleError;
    /// assert_eq!(ThrottleError::Inner("boom").into_inner(), Some("boom"));
    /// ```
    pub fn into_inner(self) -> Option<E> {
        match self {
            ThrottleError::Throttled(_) => None,
            ThrottleError::Inner(error) => Some(error),
        }
    }

    /// A boxed error (tower's `BoxError`): the inner error as it boxes itself, or the boxed
    /// [`Throttled`]. Use it with `map_err` when the inner service's error is already boxed
    /// (after tower's `Buffer` or `Timeout`), as a box is not itself an [`Error`].
    ///
    /// ```
    /// use tollgate::client::{ThrottleError, Throttled};
    ///
    /// let inner: Box<dyn std::error::Error + Send + Sync> = "connection reset".into();
    /// let error = ThrottleError::Inner(inner).into_box_error();
    /// assert_eq!(error.to_string(), "connection reset");
    /// assert!(!error.is::<Throttled>());
    /// ```
    pub fn into_box_error(self) -> Box<dyn Error + Send + Sync>
    where
        E: Into<BoxError>,
    {
        match self {
            ThrottleError::Throttled(throttled) => Box::new(throttled),
            ThrottleError::Inner(error) => error.into(),
        }
    }
}

impl<E> From<Throttled> for ThrottleError<E> {
    fn from(throttled: Throttled) -> Self {
        ThrottleError::Throttled(throttled)
    }
}

impl<E: fmt::Display> fmt::Display for ThrottleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::Throttled(throttled) => throttled.fmt(f),
            ThrottleError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: Error + 'static> Error for ThrottleError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ThrottleError::Throttled(_) => None,
            ThrottleError::Inner(error) => error.source(),
        }
    }
}

/// A request rejected locally by an [`AdaptiveThrottle`](super::AdaptiveThrottle), with the
/// window it found.
///
/// ```
/// use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
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
/// let Err(ThrottleError::Throttled(throttled)) = client.oneshot(Request::new(())).await else {
///     panic!("not throttled");
/// };
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
    /// # use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
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
    /// assert_eq!(error.throttled().unwrap().probability(), 2.0 / 3.0);
    /// # }
    /// ```
    pub fn probability(&self) -> f64 {
        self.stats.probability
    }

    /// The window as the request found it (before counting the request itself).
    ///
    /// ```
    /// # use tollgate::client::{AdaptiveThrottleLayer, ThrottleError};
    /// # use http::{Request, Response};
    /// # use tower::{Layer, ServiceExt};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let backend = tower::service_fn(|_req: Request<()>| async {
    /// #     Err::<Response<()>, _>(std::io::Error::other("connection refused"))
    /// # });
    /// # let client = AdaptiveThrottleLayer::new().random(|| 0.0).layer(backend);
    /// # let _ = client.clone().oneshot(Request::new(())).await;
    /// let error = client.oneshot(Request::new(())).await.unwrap_err();
    /// let stats = error.throttled().unwrap().stats();
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
