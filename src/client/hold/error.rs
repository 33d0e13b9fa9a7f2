//! The error: a call held back locally, or the inner service's own error.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::signals::HoldReason;

type BoxError = Box<dyn Error + Send + Sync>;

/// The error of a [`HoldBack`](super::HoldBack) service: the call was held back (never
/// sent), or the inner service failed.
///
/// Display and [`source`](Error::source) are those of the inner error for
/// [`Inner`](HoldBackError::Inner). [`into_box_error`](HoldBackError::into_box_error) gives
/// tower's boxed error, from which [`HeldBack`] can be downcast.
///
/// ```
/// use tollgate::client::{HoldBackError, HoldReason};
///
/// fn give_up<E>(error: &HoldBackError<E>) -> bool {
///     match error {
///         // The server said to wait this long: a retry before then is refused locally.
///         HoldBackError::HeldBack(held) => held.retry_after().as_secs() > 10,
///         HoldBackError::Inner(_) => false,
///     }
/// }
/// # let _ = give_up::<std::io::Error>;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum HoldBackError<E> {
    /// Held back: the partition's server had said to wait, and the call never went out.
    HeldBack(HeldBack),
    /// The inner service failed (or was not ready).
    Inner(E),
}

impl<E> HoldBackError<E> {
    /// Whether the call was held back.
    ///
    /// ```
    /// use tollgate::client::HoldBackError;
    /// assert!(!HoldBackError::Inner("boom").is_held_back());
    /// ```
    pub fn is_held_back(&self) -> bool {
        matches!(self, HoldBackError::HeldBack(_))
    }

    /// The hold, if the call was held back.
    ///
    /// ```
    /// use tollgate::client::HoldBackError;
    /// assert!(HoldBackError::Inner("boom").held_back().is_none());
    /// ```
    pub fn held_back(&self) -> Option<&HeldBack> {
        match self {
            HoldBackError::HeldBack(held) => Some(held),
            HoldBackError::Inner(_) => None,
        }
    }

    /// The inner service's error, if it was one.
    ///
    /// ```
    /// use tollgate::client::HoldBackError;
    /// assert_eq!(HoldBackError::Inner("boom").into_inner(), Some("boom"));
    /// ```
    pub fn into_inner(self) -> Option<E> {
        match self {
            HoldBackError::HeldBack(_) => None,
            HoldBackError::Inner(error) => Some(error),
        }
    }

    /// A boxed error (tower's `BoxError`): the inner error as it boxes itself, or the boxed
    /// [`HeldBack`].
    ///
    /// ```
    /// use tollgate::client::HoldBackError;
    /// let inner: Box<dyn std::error::Error + Send + Sync> = "reset".into();
    /// assert_eq!(HoldBackError::Inner(inner).into_box_error().to_string(), "reset");
    /// ```
    pub fn into_box_error(self) -> BoxError
    where
        E: Into<BoxError>,
    {
        match self {
            HoldBackError::HeldBack(held) => Box::new(held),
            HoldBackError::Inner(error) => error.into(),
        }
    }
}

impl<E> From<HeldBack> for HoldBackError<E> {
    fn from(held: HeldBack) -> Self {
        HoldBackError::HeldBack(held)
    }
}

impl<E: fmt::Display> fmt::Display for HoldBackError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldBackError::HeldBack(held) => held.fmt(f),
            HoldBackError::Inner(error) => error.fmt(f),
        }
    }
}

impl<E: Error + 'static> Error for HoldBackError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            HoldBackError::HeldBack(_) => None,
            HoldBackError::Inner(error) => error.source(),
        }
    }
}

/// A call held back locally by a [`HoldBackLayer`](super::HoldBackLayer): its partition's
/// server had said to wait, and the wait outlasted what the call may wait.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{HoldBackError, HoldBackLayer, HoldReason};
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
/// let Err(HoldBackError::HeldBack(held)) = client.oneshot(call()).await else {
///     panic!("sent");
/// };
/// assert_eq!(held.partition(), "api.example.com");
/// assert_eq!(held.reason(), HoldReason::RetryAfter);
/// assert_eq!(held.retry_after(), Duration::from_secs(3));
/// assert!(held.to_string().contains("held back"));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBack {
    pub(super) partition: Arc<str>,
    pub(super) reason: HoldReason,
    pub(super) retry_after: Duration,
}

impl HeldBack {
    /// The partition that is held.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, HoldReason};
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
    /// let held = client.oneshot(call()).await.unwrap_err().held_back().cloned().unwrap();
    /// assert_eq!(held.partition(), "api.example.com");
    /// # }
    /// ```
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// What the server said.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, HoldReason};
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
    /// let held = client.oneshot(call()).await.unwrap_err().held_back().cloned().unwrap();
    /// assert_eq!(held.reason(), HoldReason::RateLimitHeader);
    /// # }
    /// ```
    pub fn reason(&self) -> HoldReason {
        self.reason
    }

    /// How long the partition stays held from when the call failed: a call made after
    /// that is sent.
    ///
    /// ```
    /// # use http::{Request, Response};
    /// # use tollgate::client::{HoldBackLayer, HoldReason};
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
    /// let held = client.oneshot(call()).await.unwrap_err().held_back().cloned().unwrap();
    /// assert_eq!(held.retry_after(), std::time::Duration::from_secs(4));
    /// # }
    /// ```
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for HeldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let said = match self.reason {
            HoldReason::RetryAfter => "Retry-After",
            HoldReason::RateLimitHeader => "a RateLimitHeader policy with nothing left",
            HoldReason::GrpcPushback => "grpc-retry-pushback-ms",
        };
        write!(
            f,
            "call to {:?} held back locally, not sent: the server said to wait ({said}) for \
             another {} ms",
            self.partition,
            self.retry_after.as_millis()
        )
    }
}

impl Error for HeldBack {}
