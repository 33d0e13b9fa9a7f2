//! The body-cost service: read the first bytes, estimate, go on.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use tower_service::Service;

use super::body::PrefixedBody;
use super::estimate::{RequestCost, Settings};
use crate::http::body::ResponseBody;
use crate::http::key::KeyRejection;
use crate::http::refusal::Refusal;
use crate::http::response;

/// The service of a [`BodyCostLayer`](crate::cost::BodyCostLayer).
///
/// ```
/// use std::convert::Infallible;
/// use tollgate::cost::BodyCostLayer;
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = BodyCostLayer::new(4, |_body: &[u8]| Some(1));
/// let service = layer.layer(service_fn(|_req: http::Request<_>| async {
///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
/// }));
/// let big = http::Request::post("/").body(http_body_util::Full::new(bytes::Bytes::from("too long"))).unwrap();
/// assert_eq!(service.oneshot(big).await.unwrap().status(), 413);
/// # }
/// ```
#[derive(Clone)]
pub struct BodyCost<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> BodyCost<S> {
    pub(super) fn new(inner: S, settings: Arc<Settings>) -> Self {
        Self { inner, settings }
    }
}

/// What reading the first bytes of a body found.
enum Read<B> {
    /// The frames read, the rest of the body (`None`: it ended), and whether it ended
    /// within the buffer.
    Prefix(Vec<Frame<Bytes>>, Option<B>, bool),
    /// The body failed while it was read.
    Failed,
}

/// Reads frames of `body` until it ends or more than `max_bytes` of data have come.
async fn read_prefix<B>(mut body: B, max_bytes: usize) -> Read<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut frames = Vec::new();
    let mut read = 0usize;
    loop {
        if read > max_bytes {
            return Read::Prefix(frames, Some(body), false);
        }
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => return Read::Prefix(frames, None, true),
            Some(Err(_)) => return Read::Failed,
            Some(Ok(frame)) => {
                read = read.saturating_add(frame.data_ref().map_or(0, Bytes::len));
                frames.push(frame);
            }
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BodyCost<S>
where
    S: Service<Request<PrefixedBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready goes with this request; its clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = self.settings.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let (frames, rest, whole) = match read_prefix(body, settings.max_bytes).await {
                Read::Prefix(frames, rest, whole) => (frames, rest, whole),
                Read::Failed => {
                    return Ok(refused(
                        StatusCode::BAD_REQUEST,
                        "the request body could not be read",
                    ));
                }
            };
            let units = if whole {
                let mut bytes = BytesMut::new();
                for data in frames.iter().filter_map(Frame::data_ref) {
                    bytes.extend_from_slice(data);
                }
                (settings.estimate)(&bytes).unwrap_or(settings.default_estimate)
            } else {
                match settings.too_large {
                    Some(units) => units,
                    None => {
                        return Ok(refused(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            &format!(
                                "the request body is longer than the {} bytes its cost is read from",
                                settings.max_bytes
                            ),
                        ));
                    }
                }
            };
            parts.extensions.insert(RequestCost::new(units));
            let request = Request::from_parts(parts, PrefixedBody::new(frames, rest));
            let response = inner.call(request).await?;
            Ok(response.map(ResponseBody::inner))
        })
    }
}

/// A 4xx with a problem+json body saying why.
fn refused<B>(status: StatusCode, detail: &str) -> Response<ResponseBody<B>> {
    let rejection = KeyRejection::new(status, detail.to_owned());
    response::problem_of(&Refusal::Rejected(&rejection)).map(ResponseBody::full)
}

impl<S: fmt::Debug> fmt::Debug for BodyCost<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyCost")
            .field("inner", &self.inner)
            .field("max_bytes", &self.settings.max_bytes)
            .finish_non_exhaustive()
    }
}
