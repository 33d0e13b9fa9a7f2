//! What each instance runs: a rate-limit layer (the simulator's, or yours) around a
//! handler that answers as each customer's settings say, with your layers in front if
//! any, behind one type-erased call that sends a request, reads the answer's body to its
//! end and keeps what the tally needs.

use std::convert::Infallible;
use std::fmt;
use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

use tollgate::Decision;
use tollgate::Limiter;
use tollgate::RateLimitLayer;
use tollgate::decision::Settlement;
use tollgate::key::AsyncKeyExtractor;
use tollgate::response::ResponseBody;

/// What the handler's answer bodies are made of, a frame at a time.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The error of a [`SimBody`] that carries another body: that body's error, boxed.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the simulated requests and of the handler's answers: the bytes a
/// [`Customer`](crate::Customer) sends ([`body`](crate::Customer::body)), in one frame,
/// or is answered with ([`answers_bytes`](crate::Customer::answers_bytes)), in frames of
/// up to 64 KiB, or nothing. A
/// layer given to [`Scenario::in_front`](crate::Scenario::in_front) that hands the
/// request on with a body of its own (a [`BodyCostLayer`](tollgate::cost::BodyCostLayer)
/// does) has it carried in one of these too.
///
/// ```
/// use http_body::Body;
/// use tollgate_simulator::SimBody;
///
/// assert!(SimBody::empty().is_end_stream());
/// let body = SimBody::from_bytes(&b"{\"max_tokens\": 300}"[..]);
/// assert_eq!(body.size_hint().exact(), Some(19));
/// ```
pub struct SimBody {
    kind: Kind,
}

enum Kind {
    Full(Option<Bytes>),
    /// This many zero bytes to come, in frames of at most [`ZEROS`]' length.
    Zeros(usize),
    Boxed(Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send + 'static>>),
}

impl SimBody {
    /// A body with nothing in it.
    ///
    /// ```
    /// use http_body::Body;
    /// assert_eq!(tollgate_simulator::SimBody::empty().size_hint().exact(), Some(0));
    /// ```
    pub fn empty() -> Self {
        Self {
            kind: Kind::Full(None),
        }
    }

    /// A body of `bytes`, in one frame.
    ///
    /// ```
    /// use http_body::Body;
    /// let body = tollgate_simulator::SimBody::from_bytes("hello");
    /// assert!(!body.is_end_stream());
    /// ```
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Self {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// A body of `len` zero bytes, sent in frames of up to 64 KiB, as a download is.
    pub(crate) fn zeros(len: usize) -> Self {
        Self {
            kind: Kind::Zeros(len),
        }
    }

    /// Any body, as the rate limit layer's request body: one of these unchanged, any other
    /// boxed.
    fn of<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mut body = Some(body);
        if let Some(own) = (&mut body as &mut dyn std::any::Any).downcast_mut::<Option<SimBody>>()
            && let Some(own) = own.take()
        {
            return own;
        }
        match body {
            Some(body) => Self {
                kind: Kind::Boxed(Box::pin(BoxedErrors(Box::pin(body)))),
            },
            None => Self::empty(),
        }
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Zeros(0) => Poll::Ready(None),
            Kind::Zeros(left) => {
                let frame = (*left).min(ZEROS.len());
                *left -= frame;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&ZEROS[..frame])))))
            }
            Kind::Boxed(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Zeros(left) => *left == 0,
            Kind::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Zeros(left) => SizeHint::with_exact(*left as u64),
            Kind::Boxed(body) => body.size_hint(),
        }
    }
}

impl fmt::Debug for SimBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Full(bytes) => f
                .debug_struct("SimBody")
                .field("len", &bytes.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Zeros(left) => f.debug_struct("SimBody").field("len", left).finish(),
            Kind::Boxed(_) => f.debug_struct("SimBody").finish_non_exhaustive(),
        }
    }
}

/// A body whose errors are boxed (pinned on the heap, so that it needs no projection).
struct BoxedErrors<B>(Pin<Box<B>>);

impl<B> Body for BoxedErrors<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let body = self.get_mut().0.as_mut();
        body.poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// How the handler answers one customer's requests; each request carries its customer's
/// in its extensions.
#[derive(Clone, Debug)]
pub(crate) struct Answering {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// The length of the answer's body.
    pub(crate) body_len: usize,
}

/// The handler's mark on its answers, so that an answer of the handler is told from a
/// refusal whatever its status.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Handled {
    /// A soft limit let the request through over its limit.
    pub(crate) soft_limited: bool,
}

/// The service behind the rate limit: answers each request as its customer's
/// [`Answering`] says (200 with no header and no body unless told otherwise).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Handler;

impl<B> Service<Request<B>> for Handler {
    type Response = Response<SimBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<SimBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let soft_limited = matches!(
            request.extensions().get::<Decision>(),
            Some(Decision::SoftLimited(_))
        );
        let mut response = match request.extensions().get::<Arc<Answering>>() {
            Some(answering) => {
                let mut response = Response::new(SimBody::zeros(answering.body_len));
                *response.status_mut() = answering.status;
                *response.headers_mut() = answering.headers.clone();
                response
            }
            None => Response::new(SimBody::empty()),
        };
        response.extensions_mut().insert(Handled { soft_limited });
        std::future::ready(Ok(response))
    }
}

/// The future of a [`RateLimited`] call.
type LimitedFuture =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<SimBody>>, Infallible>> + Send>>;

/// One instance's rate-limited service: the rate limit layer (yours, from
/// [`Scenario::layer`](crate::Scenario::layer), or the simulator's, keyed on
/// `x-customer-id`) around the simulated handler. It is what a layer given to
/// [`Scenario::in_front`](crate::Scenario::in_front) wraps, so any tower layer over it
/// whose service takes a `Request<SimBody>` can run in front of the rate limit; the
/// request body it hands on may be of any type.
///
/// ```
/// use tollgate_simulator::{PolicyName, Scenario};
///
/// // `Identity` adds nothing: the instances answer as without it.
/// let scenario = Scenario::new()
///     .policies([PolicyName::Closed])
///     .normal_secs(1).outage_secs(1).recovery_secs(1)
///     .in_front(tower_layer::Identity::new());
/// assert!(scenario.run_blocking().is_ok());
/// ```
#[derive(Clone)]
pub struct RateLimited {
    call: Arc<dyn Fn(Request<SimBody>) -> LimitedFuture + Send + Sync>,
}

impl RateLimited {
    /// `layer` around the simulated handler; every response carries its decision.
    fn new<K: AsyncKeyExtractor>(layer: RateLimitLayer<K>) -> Self {
        let service = layer.decision_on_every_response(true).layer(Handler);
        Self {
            call: Arc::new(move |request| {
                let service = service.clone();
                Box::pin(oneshot(service, request))
            }),
        }
    }
}

impl fmt::Debug for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited").finish_non_exhaustive()
    }
}

impl<B> Service<Request<B>> for RateLimited
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<SimBody>>;
    type Error = Infallible;
    type Future = LimitedFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        (self.call)(request.map(SimBody::of))
    }
}

/// What the tally reads of one answer, once its body has been read to the end.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    /// The service answered an error, not a response.
    pub(crate) failed: bool,
    /// The handler's mark: `None` when the request did not reach it.
    pub(crate) handled: Option<Handled>,
    pub(crate) decision: Option<Decision>,
    pub(crate) settlement: Option<Settlement>,
}

/// One instance as the engine calls it: a request in, its answer out.
pub(crate) type Endpoint =
    Arc<dyn Fn(Request<SimBody>) -> Pin<Box<dyn Future<Output = Answer> + Send>> + Send + Sync>;

/// Calls clones of `service`, reading each response's body to its end (so that a layer
/// that charges the bytes a body sends is charged them).
pub(crate) fn endpoint<S, B>(service: S) -> Endpoint
where
    S: Service<Request<SimBody>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    Arc::new(move |request| {
        let service = service.clone();
        Box::pin(async move {
            let Ok(response) = oneshot(service, request).await else {
                return Answer {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    failed: true,
                    handled: None,
                    decision: None,
                    settlement: None,
                };
            };
            let (mut parts, body) = response.into_parts();
            let mut body = std::pin::pin!(body);
            while let Some(Ok(_)) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {}
            Answer {
                status: parts.status,
                failed: false,
                handled: parts.extensions.get::<Handled>().copied(),
                decision: parts.extensions.remove::<Decision>(),
                settlement: parts.extensions.remove::<Settlement>(),
            }
        })
    })
}

/// Builds each instance's [`RateLimited`] around the limiter made for it, and says which
/// limiter decides (the one the layer holds).
#[derive(Clone)]
pub(crate) struct UserLayer(Arc<dyn Fn(Limiter) -> (RateLimited, Limiter) + Send + Sync>);

impl UserLayer {
    pub(crate) fn new<K, F>(build: F) -> Self
    where
        K: AsyncKeyExtractor,
        F: Fn(Limiter) -> RateLimitLayer<K> + Send + Sync + 'static,
    {
        Self(Arc::new(move |limiter| {
            let layer = build(limiter);
            let deciding = layer.limiter().clone();
            (RateLimited::new(layer), deciding)
        }))
    }

    /// The simulator's own: each customer keyed on its name, from `header`.
    pub(crate) fn keyed_on(header: &'static str) -> Self {
        Self::new(move |limiter| {
            RateLimitLayer::new(limiter).key(tollgate::key::HeaderKey::new(header))
        })
    }

    pub(crate) fn build(&self, limiter: Limiter) -> (RateLimited, Limiter) {
        (self.0)(limiter)
    }
}

impl fmt::Debug for UserLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserLayer(..)")
    }
}

/// Puts a layer of the caller's in front of each instance's [`RateLimited`].
#[derive(Clone)]
pub(crate) struct FrontLayer(Arc<dyn Fn(RateLimited) -> Endpoint + Send + Sync>);

impl FrontLayer {
    pub(crate) fn new<L, B>(layer: L) -> Self
    where
        L: Layer<RateLimited> + Send + Sync + 'static,
        L::Service:
            Service<Request<SimBody>, Response = Response<B>> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request<SimBody>>>::Future: Send + 'static,
        <L::Service as Service<Request<SimBody>>>::Error: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
    {
        Self(Arc::new(move |inner| endpoint(layer.layer(inner))))
    }

    pub(crate) fn wrap(&self, inner: RateLimited) -> Endpoint {
        (self.0)(inner)
    }
}

impl fmt::Debug for FrontLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FrontLayer(..)")
    }
}

/// Waits for the service to be ready, then calls it once.
pub(crate) async fn oneshot<S, R>(mut service: S, request: R) -> Result<S::Response, S::Error>
where
    S: Service<R>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(request).await
}
