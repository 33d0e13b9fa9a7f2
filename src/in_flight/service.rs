//! The in-flight service: a slot for each request before it runs, held by its response
//! body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use tower_service::Service;

use super::admission::{Admission, Shared};
use crate::http::body::ResponseBody;
use crate::http::grpc;
use crate::http::key::{AsyncKeyExtractor, Extracted, KeyRejection, MissingKey};
use crate::http::refusal::Refusal;
use crate::http::response::{self, RATELIMIT, RATELIMIT_POLICY};
use crate::store::caller::CallerKey;

/// The name of the in-flight limit in the RateLimit fields.
const POLICY: &str = "in-flight";
/// How long a refused caller is told to wait: the shortest wait the fields can say (the
/// server cannot know when one of the caller's requests will end).
const RETRY_AFTER_SECS: u64 = 1;

/// The service of an [`InFlightLayer`](crate::in_flight::InFlightLayer): takes one of the
/// caller's slots, then calls the inner service, whose response body holds the slot until
/// it ends or is dropped.
///
/// ```
/// use std::convert::Infallible;
/// use tollgate::InMemoryBackend;
/// use tollgate::in_flight::InFlightLayer;
/// use tollgate::Caller;
/// use tower::{Layer, Service, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = InFlightLayer::new("reports", 1, InMemoryBackend::new()).key(Caller::new("*"));
/// let mut service = layer.layer(service_fn(|_req: http::Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(String::from("report")))
/// }));
/// let first = service.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// // The first response's body still holds the only slot.
/// let second = service.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(second.status(), 429);
/// drop(first);
/// let third = service.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(third.status(), 200);
/// # }
/// ```
#[derive(Clone)]
pub struct InFlight<S, K> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
    missing_key: MissingKey,
}

impl<S, K> InFlight<S, K> {
    pub(super) fn new(inner: S, shared: Arc<Shared>, key: K, missing_key: MissingKey) -> Self {
        Self {
            inner,
            shared,
            key,
            missing_key,
        }
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for InFlight<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: AsyncKeyExtractor,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
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
        let shared = self.shared.clone();
        let missing_key = self.missing_key;
        let grpc = grpc::is_grpc(request.headers());
        let extracted = self.key.extract_now(&request);
        let extracting = extracted
            .is_none()
            .then(|| self.key.extract_async(&request));
        Box::pin(async move {
            let extracted = match (extracted, extracting) {
                (Some(extracted), _) => extracted,
                (None, Some(extracting)) => extracting.await,
                (None, None) => Extracted::NoKey,
            };
            let caller = match extracted {
                Extracted::Caller(caller) => caller.key().clone(),
                Extracted::NoKey => match missing_key {
                    MissingKey::Anonymous => CallerKey::anonymous(),
                    MissingKey::Pass => {
                        shared.count("unlimited");
                        let response = inner.call(request).await?;
                        return Ok(response.map(ResponseBody::inner));
                    }
                    MissingKey::Reject(status) => {
                        let rejection =
                            KeyRejection::new(status, "the request does not say who is calling");
                        return Ok(rejected(&rejection, grpc));
                    }
                },
                Extracted::Rejected(rejection) => return Ok(rejected(&rejection, grpc)),
            };
            match shared.admit(&caller).await {
                Admission::Held {
                    slot,
                    quota,
                    remaining,
                } => {
                    // Dropped with this future if the inner service fails or panics.
                    let response = inner.call(request).await?;
                    let mut response = response.map(|body| ResponseBody::holding(body, slot));
                    append_fields(response.headers_mut(), quota, remaining, false);
                    Ok(response)
                }
                Admission::Limited { quota } => {
                    let mut response = if grpc {
                        grpc::slots_taken(POLICY, quota, RETRY_AFTER_SECS * 1_000)
                            .map(ResponseBody::full)
                    } else {
                        response::slots_taken(POLICY, RETRY_AFTER_SECS)
                    };
                    append_fields(response.headers_mut(), quota, 0, true);
                    Ok(response)
                }
                Admission::Unavailable if grpc => {
                    Ok(grpc::unavailable(RETRY_AFTER_SECS * 1_000).map(ResponseBody::full))
                }
                Admission::Unavailable => Ok(response::overloaded(RETRY_AFTER_SECS)),
                Admission::Unlimited => {
                    let response = inner.call(request).await?;
                    Ok(response.map(ResponseBody::inner))
                }
            }
        })
    }
}

/// A key rejection: its 4xx as a problem, or to a gRPC request the status it stands for.
fn rejected<B>(rejection: &KeyRejection, grpc: bool) -> Response<ResponseBody<B>> {
    let refusal = Refusal::Rejected(rejection);
    let response = if grpc {
        grpc::status_of(&refusal)
    } else {
        response::problem_of(&refusal)
    };
    response.map(ResponseBody::full)
}

/// `RateLimit-Policy: "in-flight";q=N;qu="concurrent-requests"` and
/// `RateLimit: "in-flight";r=N` (with `t=1` on a refusal), appended beside any other
/// layer's.
fn append_fields(headers: &mut http::HeaderMap, quota: u64, remaining: u64, refused: bool) {
    let policy = format!("\"{POLICY}\";q={quota};qu=\"concurrent-requests\"");
    let state = if refused {
        format!("\"{POLICY}\";r={remaining};t=1")
    } else {
        format!("\"{POLICY}\";r={remaining}")
    };
    for (name, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, state)] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.append(name, value);
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for InFlight<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("inner", &self.inner)
            .field("name", &self.shared.settings.name)
            .field("limit", &self.shared.settings.limit)
            .field("key", &self.key)
            .finish()
    }
}
