//! What a body-cost layer estimates with, and the estimate it leaves in a request.

use http::request::Parts;

/// The estimator: a cost from a body's bytes, `None` when they say nothing.
pub(crate) type EstimateFn = dyn Fn(&[u8]) -> Option<u64> + Send + Sync;

/// What a body-cost layer was built with, shared by its services.
pub(super) struct Settings {
    pub(super) max_bytes: usize,
    pub(super) estimate: Box<EstimateFn>,
    pub(super) default_estimate: u64,
    /// The estimate of a body longer than the buffer; `None`: such a request is refused
    /// with 413.
    pub(super) too_large: Option<u64>,
}

/// The cost a [`BodyCostLayer`](super::BodyCostLayer) estimated for a request, in its extensions.
///
/// ```
/// use tollgate::cost::RequestCost;
/// let (mut parts, ()) = http::Request::new(()).into_parts();
/// assert_eq!(RequestCost::of_request(&parts), 1);
/// parts.extensions.insert(RequestCost::new(300));
/// assert_eq!(RequestCost::of_request(&parts), 300);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestCost(u64);

impl RequestCost {
    /// An estimate of `units`.
    pub fn new(units: u64) -> Self {
        Self(units)
    }

    /// The units estimated.
    pub fn units(&self) -> u64 {
        self.0
    }

    /// The estimate in a request's extensions, or 1 without one: a
    /// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost) function as it is.
    pub fn of_request(request: &Parts) -> u64 {
        request
            .extensions
            .get::<RequestCost>()
            .map_or(1, RequestCost::units)
    }
}
