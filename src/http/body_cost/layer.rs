//! The body-cost layer and its builder.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::estimate::Settings;
use super::service::BodyCost;

/// A layer that reads each request's body into a buffer of at most `max_bytes`, estimates
/// its cost from it, and puts the estimate in the request's extensions as a
/// [`RequestCost`](super::RequestCost) before the request goes on, its body unchanged (see
/// [the module](crate::cost) for where it goes in a router).
///
/// ```
/// use std::convert::Infallible;
/// use tollgate::cost::{BodyCostLayer, RequestCost};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let service = ServiceBuilder::new()
///     .layer(BodyCostLayer::new(1_024, |body: &[u8]| std::str::from_utf8(body).ok()?.trim().parse().ok()))
///     .service_fn(|request: http::Request<_>| async move {
///         let cost = request.extensions().get::<RequestCost>().map(|c| c.units());
///         Ok::<_, Infallible>(http::Response::new(format!("{cost:?}")))
///     });
/// let request = http::Request::post("/batch").body(http_body_util::Full::new(bytes::Bytes::from("42"))).unwrap();
/// let response = service.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # }
/// ```
#[derive(Clone)]
pub struct BodyCostLayer {
    pub(super) settings: Arc<Settings>,
}

impl BodyCostLayer {
    /// Reads up to `max_bytes` of each body and asks `estimate` what the request costs.
    pub fn new<F>(max_bytes: usize, estimate: F) -> Self
    where
        F: Fn(&[u8]) -> Option<u64> + Send + Sync + 'static,
    {
        Self {
            settings: Arc::new(Settings {
                max_bytes,
                estimate: Box::new(estimate),
                default_estimate: 1,
                too_large: None,
            }),
        }
    }

    /// The cost of a request whose body the estimator finds nothing in (default 1).
    pub fn default_estimate(self, units: u64) -> Self {
        self.with(|settings| settings.default_estimate = units)
    }

    /// The cost of a request whose body is longer than the buffer, which then goes on
    /// whole; without it (the default) such a request is refused with 413 Content Too
    /// Large.
    pub fn too_large_estimate(self, units: u64) -> Self {
        self.with(|settings| settings.too_large = Some(units))
    }

    fn with(self, change: impl FnOnce(&mut Settings)) -> Self {
        match Arc::try_unwrap(self.settings) {
            Ok(mut settings) => {
                change(&mut settings);
                Self {
                    settings: Arc::new(settings),
                }
            }
            // Shared: its settings are fixed. Built once per route, so never in practice.
            Err(shared) => Self { settings: shared },
        }
    }
}

impl<S> Layer<S> for BodyCostLayer {
    type Service = BodyCost<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BodyCost::new(inner, self.settings.clone())
    }
}

impl fmt::Debug for BodyCostLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyCostLayer")
            .field("max_bytes", &self.settings.max_bytes)
            .field("default_estimate", &self.settings.default_estimate)
            .field("too_large_estimate", &self.settings.too_large)
            .finish_non_exhaustive()
    }
}
