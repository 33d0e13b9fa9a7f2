//! The error of a call held back locally.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::signals::HoldReason;

/// A call held back locally by a [`HoldBackLayer`](super::HoldBackLayer): its partition's
/// server had said to wait, and the wait outlasted what the call may wait.
///
/// The service's error is tower's boxed error (`Box<dyn Error + Send + Sync>`): a call held
/// back downcasts to `HeldBack`, which carries the wait; any other error is the inner
/// service's own, boxed as it boxes itself.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{HeldBack, HoldBackLayer, HoldReason};
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
/// let held = error.downcast_ref::<HeldBack>().expect("held back");
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
    /// # use tollgate::client::{HeldBack, HoldBackLayer, HoldReason};
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
    /// let held = error.downcast_ref::<HeldBack>().unwrap();
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
    /// # use tollgate::client::{HeldBack, HoldBackLayer, HoldReason};
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
    /// let held = error.downcast_ref::<HeldBack>().unwrap();
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
    /// # use tollgate::client::{HeldBack, HoldBackLayer, HoldReason};
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
    /// let held = error.downcast_ref::<HeldBack>().unwrap();
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
