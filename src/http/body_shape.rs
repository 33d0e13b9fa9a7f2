//! The body type the layer's responses carry: its own wrapper around the inner service's
//! body, which works for any body, or the inner service's body type itself, for the types
//! that can box another body (axum's, tonic's).

use std::fmt::Debug;

use bytes::Bytes;

use crate::http::body::ResponseBody;

/// How a [`RateLimit`](crate::RateLimit) service's responses carry the inner service's body
/// `B`: [`Wrapped`] (the default) or [`InnerBody`], chosen with
/// [`RateLimitLayer::response_body`](crate::RateLimitLayer::response_body).
///
/// Implement it on a type of your own, or on [`InnerBody`] for a body type of your own,
/// when your body type can box another body.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
/// use tollgate::response::{BodyShape, InnerBody, ResponseBody};
///
/// /// A body type of this service's: every response is boxed anyway.
/// struct AppBody(UnsyncBoxBody<Bytes, std::convert::Infallible>);
/// # impl http_body::Body for AppBody {
/// #     type Data = Bytes;
/// #     type Error = std::convert::Infallible;
/// #     fn poll_frame(
/// #         self: std::pin::Pin<&mut Self>,
/// #         cx: &mut std::task::Context<'_>,
/// #     ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
/// #         std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
/// #     }
/// # }
///
/// impl BodyShape<AppBody> for InnerBody {
///     type Body = AppBody;
///
///     fn pass(body: AppBody) -> AppBody {
///         body
///     }
///
///     fn wrap(body: ResponseBody<AppBody>) -> AppBody {
///         AppBody(body.boxed_unsync())
///     }
/// }
/// ```
pub trait BodyShape<B>: Clone + Debug + Send + Sync + 'static {
    /// The body type of the layer's responses.
    type Body: http_body::Body<Data = Bytes>;

    /// The inner service's body of a response the layer only passes on.
    fn pass(body: B) -> Self::Body;

    /// A body the layer made: its own refusal, or the inner service's body metered as it is
    /// sent.
    fn wrap(body: ResponseBody<B>) -> Self::Body;
}

/// Responses carry a [`ResponseBody`] around the inner service's body, whatever its type:
/// the default.
///
/// ```
/// use tollgate::response::{BodyShape, ResponseBody, Wrapped};
///
/// let body: ResponseBody<String> = Wrapped::pass("hello".to_owned());
/// # drop(body);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Wrapped;

impl<B: http_body::Body<Data = Bytes>> BodyShape<B> for Wrapped {
    type Body = ResponseBody<B>;

    #[inline(always)]
    fn pass(body: B) -> ResponseBody<B> {
        ResponseBody::inner(body)
    }

    #[inline(always)]
    fn wrap(body: ResponseBody<B>) -> ResponseBody<B> {
        body
    }
}

/// Responses carry the inner service's own body type: an admitted response passes through
/// as it is, and the layer's own bodies (refusals, a metered body) are boxed into that type.
///
/// In an axum router this saves a copy of each response and an allocation per request:
/// axum boxes any body that is not its own. For `axum::body::Body` (feature `axum`) and
/// `tonic::body::Body` (feature `tonic`).
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::{Router, routing::get};
/// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer, response::InnerBody};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// let app: Router = Router::new().route("/orders", get(|| async { "[]" })).layer(
///     RateLimitLayer::new(limiter)
///         .key(Caller::new("*"))
///         .response_body::<InnerBody>(),
/// );
/// # drop(app);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct InnerBody;

#[cfg(feature = "axum")]
impl BodyShape<axum::body::Body> for InnerBody {
    type Body = axum::body::Body;

    #[inline(always)]
    fn pass(body: axum::body::Body) -> axum::body::Body {
        body
    }

    fn wrap(body: ResponseBody<axum::body::Body>) -> axum::body::Body {
        axum::body::Body::new(body)
    }
}

#[cfg(feature = "tonic")]
impl BodyShape<tonic::body::Body> for InnerBody {
    type Body = tonic::body::Body;

    #[inline(always)]
    fn pass(body: tonic::body::Body) -> tonic::body::Body {
        body
    }

    fn wrap(body: ResponseBody<tonic::body::Body>) -> tonic::body::Body {
        tonic::body::Body::new(body)
    }
}
