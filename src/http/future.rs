//! The response future: extract the key, decide, then call the inner service or refuse.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::http::body::ResponseBody;
use crate::http::body_shape::{BodyShape, Wrapped};
use crate::http::byte_meter::ByteMeter;
use crate::http::config::{AfterResponse, Config};
use crate::http::grpc;
use crate::http::headers::PARTITION_KEY_LEN;
use crate::http::key::{AsyncKeyExtractor, Extracted, KeyRejection, MissingKey};
use crate::http::refusal::Refusal;
use crate::http::render::Protocol;
use crate::http::response::{self, Draft11Fields, Fields};
use crate::limiter::decision::{Decision, UnlimitedReason};
use crate::limiter::settlement::Settlement;
use crate::store::caller::{Caller, CallerKey};
use crate::store::future::StoreFuture;

pin_project! {
    /// The future of [`RateLimit`](crate::RateLimit)'s responses.
    ///
    /// With a key extractor that knows the key at once and a store that answers at once
    /// (the in-process one, a cached refusal), the request is decided and the inner
    /// service called within `call`: this future then only drives the inner service's.
    pub struct ResponseFuture<S, K, ReqBody, Shape = Wrapped>
    where
        S: Service<Request<ReqBody>>,
        K: AsyncKeyExtractor,
    {
        #[pin]
        state: State<S::Future>,
        // The request on its way to a decision `call` could not make at once: an extractor
        // that waits, or a store that answers later. Boxed, so that the future decided
        // within `call` stays small: every request's future is moved whole.
        waiting: Option<Pin<Box<Waiting<K::Future, S, ReqBody>>>>,
        head: Head<K>,
        // The inner service's response while the units of a request that did not count
        // are given back, or its cost settled. Boxed, as few requests take this path.
        refunding: Option<Box<(StoreFuture<Option<Settlement>>, S::Response, Option<Decision>)>>,
        shape: PhantomData<fn() -> Shape>,
    }
}

/// What the steps of one request share.
struct Head<K> {
    // The layer's configuration, held only when a step after `call` reads it: for a
    // request that waits, or a response that gets fields, the decision or a settlement.
    // A request decided within `call` whose response gets none of them touches no
    // reference count of the layer's.
    config: Option<Arc<Config<K>>>,
    // The caller's partition key, when the layer sends one.
    pk: Option<[u8; PARTITION_KEY_LEN]>,
    // The units the request costs.
    cost: u64,
    // Who is calling, kept under `count_only` and `settle` only: a refund names the
    // caller.
    caller: Option<Box<Caller>>,
}

pin_project! {
    #[project = StateProj]
    enum State<InnerFuture> {
        // `waiting` holds the request.
        Waiting,
        Calling {
            #[pin]
            future: InnerFuture,
            decision: Option<Decision>,
        },
        // Admitted, with the fields its response gets written already (see
        // `Config::only_draft11_fields`).
        Decorating {
            #[pin]
            future: InnerFuture,
            fields: Option<Draft11Fields>,
        },
        // Answered without the inner service: a refusal or a key rejection.
        Answered {
            response: Option<Response<Bytes>>,
        },
        Refunding,
        Done,
    }
}

pin_project! {
    #[project = WaitingProj]
    enum Waiting<KeyFuture, S, ReqBody> {
        Key {
            #[pin]
            key: KeyFuture,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        Decision {
            decision: StoreFuture<Decision>,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
    }
}

/// Where a request goes after a step. A request that waits is boxed at once, so that the
/// future of one decided within `call` stays small.
enum Step<InnerFuture, KeyFuture, S, ReqBody> {
    Call(InnerFuture, Option<Decision>),
    Decorate(InnerFuture, Draft11Fields),
    Answer(Response<Bytes>),
    Wait(Pin<Box<Waiting<KeyFuture, S, ReqBody>>>),
}

/// What the steps made of a request they read by reference: the request (240 bytes in an
/// axum router) is moved once, into the inner service or into the box of one that waits,
/// rather than from step to step.
enum Verdict {
    // The decision, when a step after the response reads it.
    Call(Option<Decision>),
    // Admitted, with the fields its response gets.
    Decorate(Draft11Fields),
    Answer(Response<Bytes>),
    Wait(StoreFuture<Decision>),
}

impl<S, K, ReqBody, Shape> ResponseFuture<S, K, ReqBody, Shape>
where
    S: Service<Request<ReqBody>>,
    K: AsyncKeyExtractor,
{
    /// Decides `request` (of `cost` units) as far as can be done now, and calls `inner`
    /// (driven to readiness) if it is admitted by then. A request that waits takes `inner`
    /// along and leaves a clone in its place, so that one admitted at once is handed to it
    /// with no clone (reference counts, or an allocation, for services that share state).
    #[inline(always)]
    pub(crate) fn new(
        mut request: Request<ReqBody>,
        inner: &mut S,
        config: &Arc<Config<K>>,
        cost: u64,
    ) -> Self
    where
        S: Clone,
    {
        let mut head = Head {
            config: None,
            pk: None,
            cost,
            caller: None,
        };
        let Some(key) = config.key.extract_now(&request) else {
            head.config = Some(config.clone());
            let waiting = Waiting::Key {
                key: config.key.extract_async(&request),
                request: Some(request),
                inner: Some(take_ready(inner)),
            };
            return Self::waiting(Box::pin(waiting), head);
        };
        match after_key(config, &mut head, key, &mut request) {
            Verdict::Call(decision) => {
                if config.reads_responses() {
                    head.config = Some(config.clone());
                }
                Self {
                    state: State::Calling {
                        future: inner.call(request),
                        decision,
                    },
                    waiting: None,
                    head,
                    refunding: None,
                    shape: PhantomData,
                }
            }
            Verdict::Decorate(fields) => Self {
                state: State::Decorating {
                    future: inner.call(request),
                    fields: Some(fields),
                },
                waiting: None,
                head,
                refunding: None,
                shape: PhantomData,
            },
            Verdict::Answer(response) => Self {
                state: State::Answered {
                    response: Some(response),
                },
                waiting: None,
                head,
                refunding: None,
                shape: PhantomData,
            },
            Verdict::Wait(decision) => {
                head.config = Some(config.clone());
                let waiting = Waiting::Decision {
                    decision,
                    request: Some(request),
                    inner: Some(take_ready(inner)),
                };
                Self::waiting(Box::pin(waiting), head)
            }
        }
    }

    fn waiting(waiting: Pin<Box<Waiting<K::Future, S, ReqBody>>>, head: Head<K>) -> Self {
        Self {
            state: State::Waiting,
            waiting: Some(waiting),
            head,
            refunding: None,
            shape: PhantomData,
        }
    }

    /// The future of a request the skip predicate let through: the inner service is
    /// already called, and nothing is counted or added to its response.
    pub(crate) fn skipped(future: S::Future, config: &Arc<Config<K>>) -> Self {
        Self {
            state: State::Calling {
                future,
                decision: Some(Decision::Unlimited(UnlimitedReason::Skipped)),
            },
            waiting: None,
            head: Head {
                // Only the decision, when every response carries it.
                config: config.reads_responses().then(|| config.clone()),
                pk: None,
                cost: 1,
                caller: None,
            },
            refunding: None,
            shape: PhantomData,
        }
    }
}

/// The service driven to readiness, taken for a request that waits, with a fresh clone
/// left in its place.
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}

/// The step after the key extractor answered: refuse, let through uncounted, or decide.
#[inline(always)]
fn after_key<K, ReqBody>(
    config: &Config<K>,
    head: &mut Head<K>,
    key: Extracted,
    request: &mut Request<ReqBody>,
) -> Verdict
where
    K: AsyncKeyExtractor,
{
    // Read where the extractor built it: a caller moved right after it was written is read
    // back before the writes have landed. Moved only when a step after the response needs it.
    let anonymous;
    let caller = match &key {
        Extracted::Caller(caller) => caller,
        Extracted::NoKey => match config.missing_key {
            MissingKey::Reject(status) => {
                let rejection =
                    KeyRejection::new(status, "the request does not say who is calling");
                return Verdict::Answer(rejected(config, &rejection, request));
            }
            MissingKey::Anonymous => {
                anonymous = Caller::new(CallerKey::anonymous());
                &anonymous
            }
            MissingKey::Pass => {
                return Verdict::Call(Some(Decision::Unlimited(UnlimitedReason::NoKey)));
            }
        },
        Extracted::Rejected(rejection) => {
            return Verdict::Answer(rejected(config, rejection, request));
        }
    };
    head.pk = config
        .partition_key
        .as_ref()
        .map(|key| key.of(caller.key().encoded()));
    let mut decision = config
        .limiter
        .check_with(caller, head.cost, config.refusals);
    if config.after_response.is_some() {
        head.caller = Some(Box::new(match key {
            Extracted::Caller(caller) => caller,
            _ => caller.clone(),
        }));
    }
    // Read where it lies, and moved out only if a step after this one needs it: a decision
    // moved right after it was written is read back before the writes have landed.
    match decision.ready_slot() {
        Some(decided) => after_decision(config, head, decided, request),
        None => Verdict::Wait(decision),
    }
}

/// The step after the decision (in `decided`, taken from it only where it is kept): the
/// refusal, or the inner service's call.
#[inline(always)]
fn after_decision<K, ReqBody>(
    config: &Config<K>,
    head: &Head<K>,
    decided: &mut Option<Decision>,
    request: &mut Request<ReqBody>,
) -> Verdict
where
    K: AsyncKeyExtractor,
{
    let Some(decision) = decided.as_ref() else {
        unreachable!("a decision is taken once, by the step after it");
    };
    let fields = fields(config, head.pk.as_ref());
    let default = Refusal::of(decision, config.unavailable_status)
        .map(|refusal| refusal.render(protocol_of(request), fields));
    match default {
        Some(default) => {
            let mut refusal = match &config.refusal {
                Some(hook) => (hook.0)(decision, default),
                None => default,
            };
            if let Some(decision) = decided.take() {
                refusal.extensions_mut().insert(decision);
            }
            Verdict::Answer(refusal)
        }
        None => {
            // The handler of a soft limit's refusal is told, so that it can degrade.
            if let Decision::SoftLimited(_) = decision {
                request.extensions_mut().insert(decision.clone());
            }
            if let Decision::Allowed(info) | Decision::SoftLimited(info) = decision
                && config.only_draft11_fields()
            {
                return Verdict::Decorate(Draft11Fields::of(info, fields));
            }
            // Kept for the response only when a step after it reads it.
            Verdict::Call(if config.reads_responses() {
                decided.take()
            } else {
                None
            })
        }
    }
}

/// Where a waiting request goes after its step: the request, and the service taken along
/// for it, are moved on only here.
fn proceed<S, KeyFuture, ReqBody>(
    verdict: Verdict,
    request: Request<ReqBody>,
    mut inner: S,
) -> Step<S::Future, KeyFuture, S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    match verdict {
        Verdict::Call(decision) => Step::Call(inner.call(request), decision),
        Verdict::Decorate(fields) => Step::Decorate(inner.call(request), fields),
        Verdict::Answer(response) => Step::Answer(response),
        Verdict::Wait(decision) => Step::Wait(Box::pin(Waiting::Decision {
            decision,
            request: Some(request),
            inner: Some(inner),
        })),
    }
}

impl<S, K, ReqBody, Shape> std::fmt::Debug for ResponseFuture<S, K, ReqBody, Shape>
where
    S: Service<Request<ReqBody>>,
    K: AsyncKeyExtractor,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match (&self.state, self.waiting.as_deref()) {
            (State::Waiting, Some(Waiting::Key { .. })) => "extracting key",
            (State::Waiting, _) => "deciding",
            (State::Calling { .. } | State::Decorating { .. }, _) => "calling inner service",
            (State::Answered { .. }, _) => "answered",
            (State::Refunding, _) => "giving back the units of a request that did not count",
            (State::Done, _) => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, K, ReqBody, Shape, ResBody> Future for ResponseFuture<S, K, ReqBody, Shape>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    K: AsyncKeyExtractor,
    Shape: BodyShape<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<Shape::Body>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The usual request, decided within `call` with nothing to add to its response,
        // takes this step alone: the code an admitted request runs stays small, and the
        // other steps are out of its way. Its answer is the inner service's, passed on
        // where it lies; the state is left as it is (a future polled after it completed
        // may do anything but be unsafe), so that the answer is not copied around a change
        // of state.
        let this = self.as_mut().project();
        match this.state.project() {
            StateProj::Calling { future, .. } if this.head.config.is_none() => {
                return future
                    .poll(cx)
                    .map(|response| response.map(|response| response.map(Shape::pass)));
            }
            StateProj::Decorating { future, fields } => {
                return poll_decorated::<Shape, _, _, _>(future, fields, cx);
            }
            _ => {}
        }
        self.poll_steps(cx)
    }
}

impl<S, K, ReqBody, Shape, ResBody> ResponseFuture<S, K, ReqBody, Shape>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    K: AsyncKeyExtractor,
    Shape: BodyShape<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
{
    /// Every step but the usual one: a request that waits, a refusal, a response that gets
    /// fields, the decision or a settlement.
    #[inline(never)]
    fn poll_steps(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<<Self as Future>::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting => {
                    let Some(waiting) = this.waiting.as_mut() else {
                        unreachable!("a waiting request is stored before the state is set");
                    };
                    match ready!(poll_waiting(waiting.as_mut(), this.head, cx)) {
                        Step::Wait(next) => *waiting = next,
                        Step::Call(future, decision) => {
                            *this.waiting = None;
                            this.state.set(State::Calling { future, decision });
                        }
                        Step::Decorate(future, fields) => {
                            *this.waiting = None;
                            this.state.set(State::Decorating {
                                future,
                                fields: Some(fields),
                            });
                        }
                        Step::Answer(response) => {
                            *this.waiting = None;
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(answer::<Shape, _>(response)));
                        }
                    }
                }
                StateProj::Answered { response } => {
                    let Some(response) = response.take() else {
                        unreachable!("an answer is taken exactly once");
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(answer::<Shape, _>(response)));
                }
                StateProj::Calling { future, decision } => {
                    let response = ready!(future.poll(cx))?;
                    let decision = decision.take();
                    let head = &*this.head;
                    let (response, work) = after_response(head, response, decision.as_ref());
                    // Ready at once for an in-process store, or when nothing was counted;
                    // otherwise the response waits for the store.
                    let settlement = match work {
                        Some(mut work) => match work.try_take_ready() {
                            Some(settlement) => settlement,
                            None => {
                                *this.refunding = Some(Box::new((work, response, decision)));
                                this.state.set(State::Refunding);
                                continue;
                            }
                        },
                        None => None,
                    };
                    this.state.set(State::Done);
                    let response = finish::<Shape, _, _>(response, decision, settlement, head);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Decorating { future, fields } => {
                    return poll_decorated::<Shape, _, _, _>(future, fields, cx);
                }
                StateProj::Refunding => {
                    let Some((refund, _, _)) = this.refunding.as_deref_mut() else {
                        unreachable!("a refunding response is stored before the state is set");
                    };
                    // A failed refund or settlement was logged and counted; the response
                    // goes out as it is.
                    let settlement = ready!(Pin::new(refund).poll(cx));
                    let Some((_, response, decision)) = this.refunding.take().map(|boxed| *boxed)
                    else {
                        unreachable!("the refunding response is taken exactly once");
                    };
                    this.state.set(State::Done);
                    let head = &*this.head;
                    let response = finish::<Shape, _, _>(response, decision, settlement, head);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

/// Drives a waiting request's step, its key or its decision, to the step after it.
fn poll_waiting<K, S, ReqBody>(
    waiting: Pin<&mut Waiting<K::Future, S, ReqBody>>,
    head: &mut Head<K>,
    cx: &mut Context<'_>,
) -> Poll<Step<S::Future, K::Future, S, ReqBody>>
where
    S: Service<Request<ReqBody>>,
    K: AsyncKeyExtractor,
{
    // Taken out for the step and put back: a waiting request holds the configuration.
    let Some(config) = head.config.take() else {
        unreachable!("a waiting request keeps the layer's configuration");
    };
    let step = match waiting.project() {
        WaitingProj::Key {
            key,
            request,
            inner,
        } => match key.poll(cx) {
            Poll::Ready(key) => {
                let (mut request, inner) = take(request, inner);
                let verdict = after_key(&config, head, key, &mut request);
                Poll::Ready(proceed(verdict, request, inner))
            }
            Poll::Pending => Poll::Pending,
        },
        WaitingProj::Decision {
            decision,
            request,
            inner,
        } => match Pin::new(decision).poll(cx) {
            Poll::Ready(decision) => {
                let (mut request, inner) = take(request, inner);
                let verdict = after_decision(&config, head, &mut Some(decision), &mut request);
                Poll::Ready(proceed(verdict, request, inner))
            }
            Poll::Pending => Poll::Pending,
        },
    };
    head.config = Some(config);
    step
}

/// Under `count_only`, a response that does not count gives its units back; under
/// `settle`, the request is settled at what its response says it cost: the response, and
/// the store's work when there is some (its settlement, when it was settled).
fn after_response<K, ResBody>(
    head: &Head<K>,
    response: Response<ResBody>,
    decision: Option<&Decision>,
) -> (Response<ResBody>, Option<StoreFuture<Option<Settlement>>>) {
    let (Some(config), Some(caller), Some(decided)) =
        (head.config.as_deref(), head.caller.as_deref(), decision)
    else {
        return (response, None);
    };
    let Some(after) = &config.after_response else {
        return (response, None);
    };
    let (parts, body) = response.into_parts();
    let work = match after {
        AfterResponse::CountOnly(counts) => (!counts(&parts)).then(|| {
            let mut refund = config.limiter.refund(caller, decided);
            match refund.try_take_ready() {
                Some(_) => StoreFuture::ready(None),
                None => StoreFuture::boxed(async move {
                    let _ = refund.await;
                    None
                }),
            }
        }),
        // Settled by the body, once it has been sent.
        AfterResponse::CountBytes => None,
        AfterResponse::Settle(settle) => settle(&parts).map(|actual| {
            let mut settled = config.limiter.settle(caller, decided, actual);
            match settled.try_take_ready() {
                Some(result) => StoreFuture::ready(result.ok()),
                None => StoreFuture::boxed(async move { settled.await.ok() }),
            }
        }),
    };
    (Response::from_parts(parts, body), work)
}

/// The inner service's response, with the RateLimit fields of `decision` (as `settlement`
/// left them, when the request was settled) and the decision in its extensions.
fn finish<Shape, K, ResBody>(
    response: Response<ResBody>,
    decision: Option<Decision>,
    settlement: Option<Settlement>,
    head: &Head<K>,
) -> Response<Shape::Body>
where
    Shape: BodyShape<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
{
    // Without the configuration nothing is added: see `Config::reads_responses`.
    let Some(config) = head.config.as_deref() else {
        return response.map(Shape::pass);
    };
    let pk = head.pk.as_ref();
    let mut response = match (&config.after_response, &decision, head.caller.as_deref()) {
        // The body's bytes are charged as it is sent.
        (Some(AfterResponse::CountBytes), Some(admitted @ Decision::Allowed(_)), Some(caller)) => {
            let meter = ByteMeter::new(config.limiter.clone(), caller.clone(), admitted.clone());
            response.map(|body| Shape::wrap(ResponseBody::counting(body, meter)))
        }
        _ => response.map(Shape::pass),
    };
    let decision = match (decision, &settlement) {
        (Some(Decision::Allowed(info)), Some(settled)) if settled.counted() => {
            Some(Decision::Allowed(info.settled(settled)))
        }
        (decision, _) => decision,
    };
    if let Some(settlement) = settlement {
        response.extensions_mut().insert(settlement);
    }
    // On an allowed response both layers' policies are listed, the inner layer's decision
    // kept in the extensions.
    let inner_decision = inner_layer_admitted(&response);
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
        if inner_decision.is_none() && config.decision_on_every_response {
            response.extensions_mut().insert(decision);
        }
    }
    response
}

/// The inner service's response to an admitted request, with `fields` (written within
/// `call`) when its status gets them and no inner layer refused it. Like the usual
/// request's, the state is left as it is once answered.
fn poll_decorated<Shape, ResBody, InnerFuture, E>(
    future: Pin<&mut InnerFuture>,
    fields: &mut Option<Draft11Fields>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<Shape::Body>, E>>
where
    InnerFuture: Future<Output = Result<Response<ResBody>, E>>,
    Shape: BodyShape<ResBody>,
    ResBody: http_body::Body<Data = Bytes>,
{
    let mut response = ready!(future.poll(cx))?;
    if let Some(fields) = fields.take()
        && inner_layer_admitted(&response) != Some(false)
        && fields.on_allowed(response.status())
    {
        fields.append_to(response.headers_mut());
    }
    Poll::Ready(Ok(response.map(Shape::pass)))
}

/// Whether an inner tollgate layer (a per-route limit inside a router-wide one) admitted
/// the request, if one decided: its refusal stands as it is, with no fields of this layer.
fn inner_layer_admitted<B>(response: &Response<B>) -> Option<bool> {
    response
        .extensions()
        .get::<Decision>()
        .map(Decision::is_allowed)
}

/// The layer's own answer, in the shape of the layer's responses.
fn answer<Shape, ResBody>(response: Response<Bytes>) -> Response<Shape::Body>
where
    Shape: BodyShape<ResBody>,
{
    response.map(|bytes| Shape::wrap(ResponseBody::full(bytes)))
}

fn fields<'a, K>(config: &'a Config<K>, pk: Option<&'a [u8; PARTITION_KEY_LEN]>) -> Fields<'a> {
    Fields {
        mode: config.header_mode,
        forms: config.field_forms,
        cache: &config.policy_fields,
        cap: config.remaining_cap,
        pk: pk.map(|pk| &pk[..]),
    }
}

/// A key rejection in the request's protocol. A missing key is rejected without the
/// RateLimit fields, which only a decision has.
fn rejected<K, ReqBody>(
    config: &Config<K>,
    rejection: &KeyRejection,
    request: &Request<ReqBody>,
) -> Response<Bytes> {
    let fields = fields(config, None);
    Refusal::Rejected(rejection).render(protocol_of(request), fields)
}

/// A gRPC request gets its refusals as gRPC statuses, not HTTP errors. Read only when
/// refusing: an admitted request costs no header lookup for it.
fn protocol_of<ReqBody>(request: &Request<ReqBody>) -> Protocol {
    if grpc::is_grpc(request.headers()) {
        Protocol::Grpc
    } else {
        Protocol::Http
    }
}

fn take<R, S>(request: &mut Option<R>, inner: &mut Option<S>) -> (R, S) {
    match (request.take(), inner.take()) {
        (Some(request), Some(inner)) => (request, inner),
        _ => unreachable!("the request and the ready service are taken exactly once"),
    }
}
