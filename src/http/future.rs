//! The response future: extract the key, decide, then call the inner service or refuse.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::http::body::ResponseBody;
use crate::http::config::Config;
use crate::http::grpc;
use crate::http::headers::PARTITION_KEY_LEN;
use crate::http::key::{KeyExtractor, KeyRejection, MissingKey};
use crate::http::response::{self, Fields};
use crate::limiter::decision::{Decision, UnlimitedReason};
use crate::limiter::future::DecisionFuture;
use crate::store::backend::RefundFuture;
use crate::store::caller::{Caller, CallerKey};

pin_project! {
    /// The future of [`RateLimit`](crate::RateLimit)'s responses.
    pub struct ResponseFuture<S, K, ReqBody>
    where
        S: Service<Request<ReqBody>>,
        K: KeyExtractor,
    {
        #[pin]
        state: State<K::Future, S::Future, S, ReqBody>,
        config: Arc<Config<K>>,
        // The caller's partition key, when the layer sends one.
        pk: Option<[u8; PARTITION_KEY_LEN]>,
        // A gRPC request: refusals are gRPC statuses, not HTTP errors.
        grpc: bool,
        // The units the request costs.
        cost: u64,
        // Who is calling, once known: a refund names the caller.
        caller: Option<Caller>,
        // The inner service's response while the units of a request that did not count
        // are given back. Boxed: few requests take this path, and every request's future
        // is moved whole, so it is kept small.
        refunding: Option<Box<(RefundFuture, S::Response, Option<Decision>)>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<KeyFuture, InnerFuture, S, ReqBody> {
        Extracting {
            #[pin]
            key: KeyFuture,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        Deciding {
            decision: DecisionFuture,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        Calling {
            #[pin]
            future: InnerFuture,
            decision: Option<Decision>,
        },
        Refunding,
        Done,
    }
}

impl<S, K, ReqBody> ResponseFuture<S, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    K: KeyExtractor,
{
    pub(crate) fn new(
        key: K::Future,
        request: Request<ReqBody>,
        inner: S,
        config: Arc<Config<K>>,
        cost: u64,
    ) -> Self {
        let grpc = grpc::is_grpc(request.headers());
        Self {
            state: State::Extracting {
                key,
                request: Some(request),
                inner: Some(inner),
            },
            config,
            pk: None,
            grpc,
            cost,
            caller: None,
            refunding: None,
        }
    }

    /// The future of a request the skip predicate let through: the inner service is
    /// already called, and nothing is counted or added to its response.
    pub(crate) fn skipped(future: S::Future, config: Arc<Config<K>>) -> Self {
        Self {
            state: State::Calling {
                future,
                decision: Some(Decision::Unlimited(UnlimitedReason::Skipped)),
            },
            config,
            pk: None,
            // Nothing is refused on this path.
            grpc: false,
            cost: 1,
            caller: None,
            refunding: None,
        }
    }
}

impl<S, K, ReqBody> std::fmt::Debug for ResponseFuture<S, K, ReqBody>
where
    S: Service<Request<ReqBody>>,
    K: KeyExtractor,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Extracting { .. } => "extracting key",
            State::Deciding { .. } => "deciding",
            State::Calling { .. } => "calling inner service",
            State::Refunding => "giving back the units of a request that did not count",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, K, ReqBody, ResBody> Future for ResponseFuture<S, K, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    K: KeyExtractor,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Extracting {
                    key,
                    request,
                    inner,
                } => {
                    let caller = match ready!(key.poll(cx)) {
                        Ok(Some(caller)) => caller,
                        Ok(None) => match this.config.missing_key {
                            MissingKey::Reject(status) => {
                                this.state.set(State::Done);
                                let rejection = KeyRejection::new(
                                    status,
                                    "the request does not say who is calling",
                                );
                                return Poll::Ready(Ok(rejected(&rejection, *this.grpc)));
                            }
                            MissingKey::Anonymous => Caller::new(CallerKey::anonymous()),
                            MissingKey::Pass => {
                                let (request, mut inner) = take(request, inner);
                                let future = inner.call(request);
                                this.state.set(State::Calling {
                                    future,
                                    decision: Some(Decision::Unlimited(UnlimitedReason::NoKey)),
                                });
                                continue;
                            }
                        },
                        Err(rejection) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(rejected(&rejection, *this.grpc)));
                        }
                    };
                    *this.pk = this
                        .config
                        .partition_key
                        .as_ref()
                        .map(|key| key.of(caller.key().encoded()));
                    let decision = this.config.limiter.check_cost(&caller, *this.cost);
                    if this.config.count_only.is_some() {
                        *this.caller = Some(caller);
                    }
                    let (request, inner) = (request.take(), inner.take());
                    this.state.set(State::Deciding {
                        decision,
                        request,
                        inner,
                    });
                }
                StateProj::Deciding {
                    decision,
                    request,
                    inner,
                } => {
                    let decision = ready!(Pin::new(decision).poll(cx));
                    let fields = fields(this.config, this.pk.as_ref());
                    let default = match &decision {
                        Decision::Limited(info) => Some(match (info.unaffordable(), *this.grpc) {
                            (Some(policy), false) => {
                                response::cost_exceeds_quota(info, &policy, fields)
                            }
                            (Some(policy), true) => grpc::cost_exceeds_quota(info, &policy, fields),
                            (None, false) => response::limited(info, fields),
                            (None, true) => grpc::limited(info, fields),
                        }),
                        Decision::Unavailable {
                            retry_after_secs,
                            policies,
                            ..
                        } if *this.grpc => {
                            Some(grpc::unavailable(*retry_after_secs, policies, fields))
                        }
                        Decision::Unavailable {
                            retry_after_secs,
                            policies,
                            ..
                        } => Some(response::unavailable(
                            this.config.unavailable_status,
                            *retry_after_secs,
                            policies,
                            fields,
                        )),
                        Decision::Allowed(_) | Decision::Unlimited(_) | Decision::Shadowed(_) => {
                            None
                        }
                    };
                    if let Some(default) = default {
                        let refusal = match &this.config.refusal {
                            Some(hook) => (hook.0)(&decision, default),
                            None => default,
                        };
                        let mut refusal = refusal.map(ResponseBody::full);
                        refusal.extensions_mut().insert(decision);
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(refusal));
                    }
                    let (request, mut inner) = take(request, inner);
                    let future = inner.call(request);
                    this.state.set(State::Calling {
                        future,
                        decision: Some(decision),
                    });
                }
                StateProj::Calling { future, decision } => {
                    let response = ready!(future.poll(cx))?;
                    let decision = decision.take();
                    // Under `count_only`, a response that does not count gives its units back.
                    let (response, refund) =
                        match (&this.config.count_only, this.caller.as_ref(), &decision) {
                            (Some(count_only), Some(caller), Some(decided)) => {
                                let (parts, body) = response.into_parts();
                                let counts = (count_only.0)(&parts);
                                let response = Response::from_parts(parts, body);
                                let refund =
                                    (!counts).then(|| this.config.limiter.refund(caller, decided));
                                (response, refund)
                            }
                            _ => (response, None),
                        };
                    // Ready at once for an in-process store, or when nothing was counted;
                    // otherwise the response waits for the store.
                    if let Some(mut refund) = refund
                        && refund.try_take_ready().is_none()
                    {
                        *this.refunding = Some(Box::new((refund, response, decision)));
                        this.state.set(State::Refunding);
                        continue;
                    }
                    this.state.set(State::Done);
                    let response = finish(response, decision, this.config, this.pk.as_ref());
                    return Poll::Ready(Ok(response));
                }
                StateProj::Refunding => {
                    let Some((refund, _, _)) = this.refunding.as_deref_mut() else {
                        unreachable!("a refunding response is stored before the state is set");
                    };
                    // A failed refund was logged and counted; the response goes out as it is.
                    let _ = ready!(Pin::new(refund).poll(cx));
                    let Some((_, response, decision)) = this.refunding.take().map(|boxed| *boxed)
                    else {
                        unreachable!("the refunding response is taken exactly once");
                    };
                    this.state.set(State::Done);
                    let response = finish(response, decision, this.config, this.pk.as_ref());
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

/// The inner service's response, with the RateLimit fields of `decision` and the decision
/// in its extensions.
fn finish<K, ResBody>(
    response: Response<ResBody>,
    decision: Option<Decision>,
    config: &Config<K>,
    pk: Option<&[u8; PARTITION_KEY_LEN]>,
) -> Response<ResponseBody<ResBody>>
where
    ResBody: http_body::Body<Data = Bytes>,
{
    let mut response = response.map(ResponseBody::inner);
    // An inner tollgate layer may have decided too (a per-route limit inside a router-wide
    // one): its refusal stands as it is, and on an allowed response both layers' policies
    // are listed, the inner layer's decision kept in the extensions.
    let inner_decision = response
        .extensions()
        .get::<Decision>()
        .map(Decision::is_allowed);
    if let Some(decision) = decision
        && inner_decision != Some(false)
    {
        let status = response.status();
        response::decorate_allowed(
            response.headers_mut(),
            status,
            &decision,
            fields(config, pk),
        );
        if inner_decision.is_none() {
            response.extensions_mut().insert(decision);
        }
    }
    response
}

fn fields<'a, K>(config: &'a Config<K>, pk: Option<&'a [u8; PARTITION_KEY_LEN]>) -> Fields<'a> {
    Fields {
        mode: config.header_mode,
        cache: &config.policy_fields,
        cap: config.remaining_cap,
        pk: pk.map(|pk| &pk[..]),
    }
}

/// A key rejection in the request's protocol.
fn rejected<B>(rejection: &KeyRejection, grpc: bool) -> Response<ResponseBody<B>> {
    if grpc {
        grpc::rejected(rejection)
    } else {
        response::rejected(rejection)
    }
}

fn take<R, S>(request: &mut Option<R>, inner: &mut Option<S>) -> (R, S) {
    match (request.take(), inner.take()) {
        (Some(request), Some(inner)) => (request, inner),
        _ => unreachable!("the request and the ready service are taken exactly once"),
    }
}
