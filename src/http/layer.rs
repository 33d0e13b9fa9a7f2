//! The tower layer.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use tower_layer::Layer;

use crate::http::body_shape::Wrapped;
use crate::http::config::{AfterResponse, Config, CostFn, RefusalHook, Skip};
use crate::http::field_forms::{FieldForm, FieldForms};
use crate::http::headers::{HeaderMode, PartitionKey, PolicyFieldCache, RemainingCap};
use crate::http::key::{AsyncKeyExtractor, ClientIp, MissingKey};
use crate::http::service::RateLimit;
use crate::limiter::decision::Decision;
use crate::limiter::telemetry;
use crate::limiter::{Limiter, Refusals};

/// Rate-limits each caller of the wrapped service.
///
/// Works with axum's `Router::layer` and `route_layer`, on a `MethodRouter`, and on plain
/// hyper or tower services whose response body yields [`bytes::Bytes`]. A refusal is an
/// HTTP response (429, or 503 when the store fails closed), or a gRPC status to a gRPC
/// request (see [below](#grpc)), never an error; errors of the inner service pass through
/// unchanged. Clones share one limiter.
///
/// The key extractor defaults to [`ClientIp`] without trusted proxies.
///
/// # gRPC
///
/// tonic services are tower services too: the layer goes on `Server::builder().layer(...)`
/// or on an axum router made from tonic's routes. A gRPC request (content-type
/// `application/grpc`, with or without a `+proto`-style suffix) is refused the way gRPC
/// clients understand, with a status in a Trailers-Only response: HTTP 200,
/// `content-type: application/grpc`, `grpc-status` and a percent-encoded `grpc-message`,
/// and no body, so the response headers end the stream.
///
/// - A limited call is RESOURCE_EXHAUSTED (8), a fail-closed one UNAVAILABLE (14) whatever
///   [`unavailable_status`](Self::unavailable_status) says. Both carry
///   `grpc-retry-pushback-ms` (when the refusal ends, in milliseconds), which gRPC retry
///   policies honour, and Retry-After, RateLimit-Policy and RateLimit as metadata, as
///   [`headers`](Self::headers) configures them.
/// - A key rejection is the gRPC code of its status: 401 UNAUTHENTICATED, 403
///   PERMISSION_DENIED, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 400 and other 4xx
///   INVALID_ARGUMENT; its detail is the message.
/// - [`on_refusal`](Self::on_refusal) receives this gRPC response as its default.
/// - Allowed calls carry RateLimit-Policy and RateLimit as response metadata.
///
/// gRPC-Web requests (`application/grpc-web`) get the HTTP refusals: put the layer inside
/// the gRPC-Web translation so that it sees gRPC. Behind tonic's own server, [`ClientIp`]
/// finds no peer address (tonic records it as its `TcpConnectInfo`): key on metadata with
/// [`HeaderKey`](crate::key::HeaderKey), or read `TcpConnectInfo` in an
/// [`FnKey`](crate::key::FnKey).
///
/// ```
/// use std::convert::Infallible;
/// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
///     .build();
/// let service = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter).key(Caller::new("*")))
///     .service_fn(|_req: http::Request<()>| async {
///         Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
///     });
/// let call = || {
///     let path = "/grpc.health.v1.Health/Check";
///     http::Request::post(path).header("content-type", "application/grpc").body(()).unwrap()
/// };
/// service.clone().oneshot(call()).await.unwrap();
/// let refused = service.oneshot(call()).await.unwrap();
/// assert_eq!(refused.status(), 200);
/// assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
/// assert_eq!(refused.headers()["grpc-message"], "quota exceeded: per-second");
/// assert!(refused.headers().contains_key("grpc-retry-pushback-ms"));
/// assert!(http_body::Body::is_end_stream(refused.body()));
/// # }
/// ```
///
/// # Example
///
/// ```
/// use axum::{Router, routing::{get, post}};
/// use http::StatusCode;
/// use tollgate::{FailurePolicy, Limiter, Policy, Quota, RateLimitLayer, key::{HeaderKey, MissingKey}};
///
/// let orders = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
///     .build();
/// let login = Limiter::builder()
///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
///     .on_store_failure(FailurePolicy::closed())
///     .build();
///
/// let app: Router = Router::new()
///     .route("/orders", get(|| async { "orders" }))
///     .route_layer(
///         RateLimitLayer::new(orders)
///             .key(HeaderKey::new("x-customer-id"))
///             .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
///     )
///     .route("/login", post(|| async { "welcome" }).layer(RateLimitLayer::new(login)));
/// # drop(app);
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitLayer<K = ClientIp, Shape = Wrapped> {
    config: Arc<Config<K>>,
    shape: PhantomData<fn() -> Shape>,
}

impl RateLimitLayer<ClientIp> {
    /// A layer that counts callers by client IP with `limiter`'s policies.
    pub fn new(limiter: Limiter) -> Self {
        Self {
            config: Arc::new(Config {
                limiter,
                key: ClientIp::new(),
                missing_key: MissingKey::default(),
                header_mode: HeaderMode::default(),
                field_forms: FieldForms::default(),
                decision_on_every_response: false,
                unavailable_status: StatusCode::SERVICE_UNAVAILABLE,
                policy_fields: PolicyFieldCache::default(),
                remaining_cap: RemainingCap::default(),
                partition_key: None,
                skip: None,
                refusal: None,
                cost: None,
                after_response: None,
                refusals: Refusals::Refuse,
            }),
            shape: PhantomData,
        }
    }
}

impl<K: AsyncKeyExtractor, Shape> RateLimitLayer<K, Shape> {
    /// Counts callers by what `key` extracts.
    pub fn key<K2: AsyncKeyExtractor>(self, key: K2) -> RateLimitLayer<K2, Shape> {
        let config = self.into_config();
        RateLimitLayer {
            config: Arc::new(Config {
                limiter: config.limiter,
                key,
                missing_key: config.missing_key,
                header_mode: config.header_mode,
                field_forms: config.field_forms,
                decision_on_every_response: config.decision_on_every_response,
                unavailable_status: config.unavailable_status,
                policy_fields: PolicyFieldCache::default(),
                remaining_cap: config.remaining_cap,
                partition_key: config.partition_key,
                skip: config.skip,
                refusal: config.refusal,
                cost: config.cost,
                after_response: config.after_response,
                refusals: config.refusals,
            }),
            shape: PhantomData,
        }
    }

    /// What to do with requests for which the extractor finds no key (default: 400; a gRPC
    /// request gets the matching gRPC code, see [gRPC](#grpc)).
    pub fn on_missing_key(self, missing_key: MissingKey) -> Self {
        let mut config = self.into_config();
        // A non-4xx status becomes 400 where the rejection is made (`KeyRejection::new`).
        config.missing_key = missing_key;
        Self::rebuilt(config)
    }

    /// Which responses carry RateLimit-Policy and RateLimit (default: every response the
    /// limiter decided except allowed redirections, [`HeaderMode::ExceptRedirects`]).
    pub fn headers(self, mode: HeaderMode) -> Self {
        let mut config = self.into_config();
        config.header_mode = mode;
        Self::rebuilt(config)
    }

    /// Which forms of the rate-limit fields responses carry (default: draft 11's alone),
    /// for the clients in the wild: draft 7's combined `RateLimit` (which has draft 11's
    /// name and so replaces it), draft 6's three fields, and the `X-RateLimit-*` headers of
    /// GitHub's API (`X-RateLimit-Reset` is the Unix time of the reset, in whole seconds).
    /// The forms but draft 11's carry one limit each: the policy that refused, or on an
    /// admitted response the one with the least left. The same [`headers`](Self::headers)
    /// mode decides which responses carry them. See [`FieldForm`](crate::response::FieldForm)
    /// for each form, and the [headers guide](crate::guide::headers) for which client reads
    /// which.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::response::FieldForm;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(50)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("acme"))
    ///     .field_forms([FieldForm::Draft11, FieldForm::XRateLimit]);
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// let response = service.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(response.headers()["ratelimit-policy"], r#""per-minute";q=50;w=60"#);
    /// assert_eq!(response.headers()["x-ratelimit-limit"], "50");
    /// assert_eq!(response.headers()["x-ratelimit-remaining"], "49");
    /// # }
    /// ```
    pub fn field_forms(self, forms: impl IntoIterator<Item = FieldForm>) -> Self {
        let mut config = self.into_config();
        config.field_forms = FieldForms::of(forms);
        Self::rebuilt(config)
    }

    /// Whether admitted responses carry the [`Decision`] in their extensions too, for outer
    /// middleware and logs; refusals always do. Off by default: inserting it allocates (a
    /// response's extensions are a map created on first use), which on a fast in-process
    /// path is a fair share of the layer's cost. With it on, every response the layer
    /// decided or let through (skipped requests, requests without a key, allowed ones)
    /// carries it.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    ///
    /// // An outer middleware logs what every request had left: put it on admitted ones too.
    /// let layer = RateLimitLayer::new(
    ///     Limiter::builder()
    ///         .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///         .build(),
    /// )
    /// .key(Caller::new("*"))
    /// .decision_on_every_response(true);
    /// # drop(layer);
    /// ```
    pub fn decision_on_every_response(self, every: bool) -> Self {
        let mut config = self.into_config();
        config.decision_on_every_response = every;
        Self::rebuilt(config)
    }

    /// Caps the `r` that RateLimit advertises against its `t`, as the draft asks of
    /// servers: `r` is at most `ceil(q * max(t, horizon) / w)`, what the policy's average
    /// rate admits over `t`, or over `horizon` (in whole seconds, rounded up) when `t` is
    /// shorter. Only what is advertised changes; what is admitted does not.
    ///
    /// The default horizon is one minute. A policy whose window is a minute or shorter is
    /// never capped (its whole quota fits in the horizon), while a fresh caller of a
    /// 1,000,000-per-day policy sees `r=695;t=1` instead of `r=1000000;t=1`: a client that
    /// spends all of `r` at once takes no more than a minute's worth of the daily average,
    /// and a client that paces `r` over `t` never goes faster than that average once `t`
    /// reaches a minute. A zero horizon caps `r / t` at exactly `q / w`.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // A daily bucket refills a token every 86.4 ms: after one request t=1, r=999999.
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::token_bucket("daily", Quota::per_day(1_000_000), 1_000_000))
    ///     .build();
    /// // r never exceeds ten minutes' worth of the daily average while t < 600 s.
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("*"))
    ///     .remaining_horizon(Duration::from_secs(600));
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// let response = service.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(response.headers()["ratelimit"], r#""daily";r=6945;t=1"#);
    /// # }
    /// ```
    pub fn remaining_horizon(self, horizon: Duration) -> Self {
        let mut config = self.into_config();
        let secs = horizon
            .as_secs()
            .saturating_add(u64::from(horizon.subsec_nanos() > 0));
        config.remaining_cap = RemainingCap {
            horizon_secs: Some(secs),
        };
        Self::rebuilt(config)
    }

    /// Advertises `r` exactly as the store computed it, uncapped (see
    /// [`remaining_horizon`](Self::remaining_horizon)).
    pub fn uncapped_remaining(self) -> Self {
        let mut config = self.into_config();
        config.remaining_cap = RemainingCap { horizon_secs: None };
        Self::rebuilt(config)
    }

    /// Adds the draft's partition key, `pk`, to every item of RateLimit-Policy and
    /// RateLimit: a Byte Sequence that tells a client which of its quotas a response is
    /// about (a client acting for several callers keeps their counts apart by it).
    ///
    /// The caller key is never sent: `pk` is a keyed digest of it (HMAC-SHA-256 under
    /// `secret`, the first 128 bits), the same for one caller on every instance that has the
    /// same secret, and not reversible or guessable without the secret. Give the layer a
    /// secret of its own (at least 32 random bytes from the service's secret store), not the
    /// one the Redis backend hashes key names with. Changing the secret changes every `pk`.
    /// Without a partition key (the default) no `pk` is sent.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::{Limiter, Policy, Quota, RateLimitLayer, key::HeaderKey};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(HeaderKey::new("x-api-key"))
    ///     .partition_key(b"a secret shared by every instance");
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// let request = http::Request::builder().header("x-api-key", "sk_live_1234").body(()).unwrap();
    /// let response = service.oneshot(request).await.unwrap();
    /// let state = response.headers()["ratelimit"].to_str().unwrap();
    /// assert!(state.starts_with(r#""per-second";r=49;t=2;pk=:"#), "{state}");
    /// assert!(!state.contains("sk_live"));
    /// # }
    /// ```
    pub fn partition_key(self, secret: impl AsRef<[u8]>) -> Self {
        let mut config = self.into_config();
        config.partition_key = Some(PartitionKey::new(secret.as_ref()));
        Self::rebuilt(config)
    }

    /// The status of a refusal when the store cannot decide and the limiter fails closed
    /// (default 503 Service Unavailable, with Retry-After). Anything outside 4xx and 5xx,
    /// and 500 itself, is taken as 503: clients retry a 500 at once. A gRPC request is
    /// refused with UNAVAILABLE whatever the status.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{FailurePolicy, Limiter, Policy, Quota, RateLimitLayer};
    ///
    /// let login = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(5)))
    ///     .on_store_failure(FailurePolicy::closed())
    ///     .build();
    /// let layer = RateLimitLayer::new(login).unavailable_status(StatusCode::TOO_MANY_REQUESTS);
    /// # drop(layer);
    /// ```
    pub fn unavailable_status(self, status: StatusCode) -> Self {
        let mut config = self.into_config();
        config.unavailable_status = if (status.is_client_error() || status.is_server_error())
            && status != StatusCode::INTERNAL_SERVER_ERROR
        {
            status
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        Self::rebuilt(config)
    }

    /// Lets the requests for which `predicate` returns `true` pass uncounted: no key is
    /// extracted, the store is not asked, and the response carries no RateLimit fields.
    /// Typical uses are health probes, internal networks (by peer address) and an
    /// allow-list of keys (the predicate may read any header).
    ///
    /// The predicate sees the request's [`Parts`] (method, URI, headers, extensions), not
    /// its body, so one predicate serves a layer whatever body type the service it wraps
    /// takes. The peer address is in the extensions, as axum's
    /// `ConnectInfo<SocketAddr>` or, for plain hyper services, a bare `SocketAddr`. Keep
    /// the predicate cheap: it runs on every request before anything else.
    ///
    /// Each skipped request is counted in `tollgate_decisions_total` with outcome
    /// `skipped`, and with [`decision_on_every_response`](Self::decision_on_every_response)
    /// on, its response's extensions hold
    /// `Decision::Unlimited(UnlimitedReason::Skipped)`. The counter is registered with the
    /// metrics recorder installed when `skip` is called. A later `skip` replaces an
    /// earlier one.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::{Decision, decision::UnlimitedReason};
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("*"))
    ///     .decision_on_every_response(true)
    ///     .skip(|request| request.uri.path() == "/healthz");
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// for _ in 0..3 {
    ///     let probe = http::Request::get("/healthz").body(()).unwrap();
    ///     let response = service.clone().oneshot(probe).await.unwrap();
    ///     assert_eq!(response.status(), 200);
    ///     assert!(!response.headers().contains_key("ratelimit"));
    ///     assert_eq!(
    ///         response.extensions().get::<Decision>(),
    ///         Some(&Decision::Unlimited(UnlimitedReason::Skipped)),
    ///     );
    /// }
    /// let order = http::Request::get("/orders").body(()).unwrap();
    /// assert_eq!(service.oneshot(order).await.unwrap().status(), 200);
    /// # }
    /// ```
    pub fn skip<F>(self, predicate: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        let mut config = self.into_config();
        config.skip = Some(Skip {
            predicate: Arc::new(predicate),
            counter: telemetry::skipped_counter(config.limiter.name()),
        });
        Self::rebuilt(config)
    }

    /// Builds the refusals (the 429 of a limited caller and the fail-closed 503, or the
    /// status set by [`unavailable_status`](Self::unavailable_status)) with `hook`, for
    /// services with an error format of their own.
    ///
    /// The hook receives the [`Decision`] (`Limited` or `Unavailable`) and the response the
    /// layer would have sent: its status, the RateLimit-Policy, RateLimit and Retry-After
    /// fields (as [`headers`](Self::headers) configures them) and a problem+json body (for
    /// a gRPC request, the Trailers-Only gRPC status described [above](#grpc)). It
    /// returns the response to send. The fields therefore stay unless the hook removes
    /// them; a hook that replaces the body sets its Content-Type too. Whatever status the hook returns is
    /// sent as it is, a 500 included: that is the hook's choice, not the layer's. The
    /// decision is added to the extensions of the returned response. Key rejections (see
    /// [`on_missing_key`](Self::on_missing_key)) are not refusals and do not go through
    /// the hook. A later `on_refusal` replaces an earlier one.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use bytes::Bytes;
    /// use http::header::CONTENT_TYPE;
    /// use tollgate::Decision;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("*"))
    ///     .on_refusal(|decision: &Decision, default: http::Response<Bytes>| {
    ///         let code = match decision {
    ///             Decision::Limited(_) => "rate_limited",
    ///             _ => "unavailable",
    ///         };
    ///         let (mut parts, _problem) = default.into_parts();
    ///         parts.headers.insert(CONTENT_TYPE, "application/json".parse().unwrap());
    ///         let body = format!(r#"{{"error":{{"code":"{code}"}}}}"#);
    ///         http::Response::from_parts(parts, Bytes::from(body))
    ///     });
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// service.clone().oneshot(http::Request::new(())).await.unwrap();
    /// let refused = service.oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(refused.status(), 429);
    /// assert_eq!(refused.headers()[CONTENT_TYPE], "application/json");
    /// assert!(refused.headers().contains_key("retry-after"));
    /// assert!(refused.headers().contains_key("ratelimit"));
    /// # }
    /// ```
    pub fn on_refusal<F>(self, hook: F) -> Self
    where
        F: Fn(&Decision, Response<Bytes>) -> Response<Bytes> + Send + Sync + 'static,
    {
        let mut config = self.into_config();
        config.refusal = Some(RefusalHook(Arc::new(hook)));
        Self::rebuilt(config)
    }

    /// Makes each request consume the units `cost` computes from its [`Parts`] (default
    /// 1), for endpoints whose requests are not all alike: a batch endpoint taking its item
    /// count from the query string or a header.
    ///
    /// The closure sees the request's head only (method, URI, headers, extensions), when
    /// the request arrives: the body has not been read, and the handler has not run. A
    /// cost that depends on the body must reach the head first: either the client sends
    /// it in a header or the query string, and the handler refuses a body that holds more
    /// than the client declared (or a client declares 1 and sends a thousand), or a
    /// [`BodyCostLayer`](crate::cost::BodyCostLayer) in front of this layer reads it from a
    /// bounded buffer of the body into the request's extensions, where
    /// [`RequestCost::of_request`](crate::cost::RequestCost::of_request) finds it. A cost
    /// known only once the response exists is reserved here and [`settle`](Self::settle)d.
    ///
    /// The cost is checked against every policy at once, all or nothing. A request that
    /// costs more than a policy's quota is never admitted, however long it waits: it is
    /// refused with 429 and the
    /// [`ProblemType::CostExceedsQuota`](crate::response::ProblemType::CostExceedsQuota) problem naming the
    /// policy, the cost and the quota, without Retry-After and without asking the store.
    /// A cost of 0 consumes nothing and is admitted unless the caller is already over a
    /// limit.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("items", Quota::per_second(50)))
    ///     .build();
    /// // `?items=30` costs 30 units; no query, one.
    /// let layer = RateLimitLayer::new(limiter).key(Caller::new("*")).cost(|request| {
    ///     request
    ///         .uri
    ///         .query()
    ///         .and_then(|q| q.strip_prefix("items="))
    ///         .and_then(|n| n.parse().ok())
    ///         .unwrap_or(1)
    /// });
    /// let service = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// });
    /// let batch = http::Request::post("/batch?items=30").body(()).unwrap();
    /// let response = service.clone().oneshot(batch).await.unwrap();
    /// // 20 left; `t` (when the next unit frees up) depends on where in the second it ran.
    /// let field = response.headers()["ratelimit"].to_str().unwrap();
    /// assert!(field.starts_with(r#""items";r=20;t="#), "{field}");
    /// let too_big = http::Request::post("/batch?items=60").body(()).unwrap();
    /// let refused = service.oneshot(too_big).await.unwrap();
    /// assert_eq!(refused.status(), 429);
    /// assert!(!refused.headers().contains_key("retry-after"));
    /// # }
    /// ```
    pub fn cost<F>(self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        let mut config = self.into_config();
        config.cost = Some(CostFn(Arc::new(cost)));
        Self::rebuilt(config)
    }

    /// Counts only the requests whose response `counts` says count, for credential and
    /// one-time-code routes where failed attempts are what a limit is for: a successful
    /// login should not bring a user closer to a lockout.
    ///
    /// Every request is still counted when it is decided, so a caller who has used up the
    /// quota is refused before the handler runs, and concurrent attempts are never
    /// over-admitted (50 concurrent wrong passwords against 5 a minute reach the handler
    /// exactly 5 times). When the response does not count, its units are given back
    /// ([`Limiter::refund`]) before the response is sent: to the store that counted them,
    /// or to the local share when that decided; nothing when the store was not asked
    /// (failed open, cached refusal). The price is that a request that will not count
    /// holds its units while its handler runs, and waits for the refund (one store call,
    /// under the store timeout) before its response goes out. A refund that fails is
    /// logged and counted in `tollgate_refunds_total`, and the response is sent as it is;
    /// the units stay consumed. The RateLimit fields of the response report the state
    /// when the request was admitted, before the refund.
    ///
    /// The predicate sees the response's [`Parts`](http::response::Parts): its status,
    /// headers and extensions (a handler may mark the outcome there). A response of an
    /// inner service that failed (an `Err`, not a response) counts. A later `count_only`
    /// replaces an earlier one, and a [`settle`](Self::settle) too.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::StatusCode;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("attempts", Quota::per_minute(2)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("*"))
    ///     .count_only(|response| response.status == StatusCode::UNAUTHORIZED);
    /// let login = ServiceBuilder::new().layer(layer).service_fn(|req: http::Request<()>| async move {
    ///     let status = if req.uri().query() == Some("password=right") { 200 } else { 401 };
    ///     let mut response = http::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
    ///     *response.status_mut() = StatusCode::from_u16(status).unwrap();
    ///     Ok::<_, Infallible>(response)
    /// });
    /// let attempt = |query: &str| http::Request::post(format!("/login?{query}")).body(()).unwrap();
    /// // Successful logins do not count...
    /// for _ in 0..5 {
    ///     let response = login.clone().oneshot(attempt("password=right")).await.unwrap();
    ///     assert_eq!(response.status(), 200);
    /// }
    /// // ...two failed ones use the quota up.
    /// for _ in 0..2 {
    ///     let response = login.clone().oneshot(attempt("password=wrong")).await.unwrap();
    ///     assert_eq!(response.status(), 401);
    /// }
    /// let response = login.oneshot(attempt("password=right")).await.unwrap();
    /// assert_eq!(response.status(), 429);
    /// # }
    /// ```
    pub fn count_only<F>(self, counts: F) -> Self
    where
        F: Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    {
        let mut config = self.into_config();
        config.after_response = Some(AfterResponse::CountOnly(Arc::new(counts)));
        Self::rebuilt(config)
    }

    /// Charges each request what its response says it cost: the request is admitted for
    /// the units [`cost`](Self::cost) reserves (an estimate, such as an LLM request's
    /// `max_tokens`), and once the inner service has answered, `settle` reads the response
    /// (status, headers, extensions) and returns what it actually cost, or `None` to keep
    /// the reservation. The difference is settled once, where the reservation was counted
    /// ([`Limiter::settle`]): the rest goes back when it cost less; when it cost more, the
    /// extra is charged past the quota if need be, a debt that refuses the caller's later
    /// requests until it has drained (their `t` and Retry-After cover it). An admitted
    /// request is never refused after the fact, so over any window a caller is charged at
    /// most its quota plus what one request cost beyond its reservation.
    ///
    /// The response waits for the settlement (one store call, under the store timeout)
    /// and then carries it: its RateLimit field says what remains after it, and its
    /// extensions hold the [`Settlement`](crate::decision::Settlement). A settlement the
    /// store could not take is logged and counted in `tollgate_settlements_total` as
    /// `failed`, and the response goes out as it is, the reservation kept. Settlements are
    /// counted there by result (`exact`, `refunded`, `charged`), apart from the decisions.
    /// A response of an inner service that failed (an `Err`) keeps its reservation. A later
    /// `settle` replaces an earlier one, and a [`count_only`](Self::count_only) too.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::decision::Settlement;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let tokens = Limiter::builder()
    ///     .policy(Policy::sliding_window("tokens", Quota::per_minute(10_000)))
    ///     .build();
    /// let layer = RateLimitLayer::new(tokens)
    ///     .key(Caller::new("acme"))
    ///     // Reserved at what the client may use at most...
    ///     .cost(|request| {
    ///         request.headers.get("x-max-tokens")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1_000)
    ///     })
    ///     // ...settled at what the answer used.
    ///     .settle(|response| {
    ///         response.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok()
    ///     });
    /// let completions = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     let response = http::Response::builder()
    ///         .header("x-tokens-used", "420")
    ///         .body(http_body_util::Empty::<bytes::Bytes>::new())
    ///         .unwrap();
    ///     Ok::<_, Infallible>(response)
    /// });
    /// let request = http::Request::post("/v1/completions").header("x-max-tokens", "2000").body(()).unwrap();
    /// let response = completions.oneshot(request).await.unwrap();
    /// let settled = response.extensions().get::<Settlement>().unwrap();
    /// assert_eq!((settled.reserved(), settled.actual(), settled.refunded()), (2_000, 420, 1_580));
    /// // What remains after the settlement: 10,000 - 420.
    /// let state = response.headers()["ratelimit"].to_str().unwrap();
    /// assert!(state.starts_with(r#""tokens";r=9580;"#), "{state}");
    /// # }
    /// ```
    pub fn settle<F>(self, settle: F) -> Self
    where
        F: Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    {
        let mut config = self.into_config();
        config.after_response = Some(AfterResponse::Settle(Arc::new(settle)));
        Self::rebuilt(config)
    }

    /// Charges each response the bytes of its body, counted as they are sent, for a
    /// limiter whose policies count [bytes of content](crate::Policy::content_bytes)
    /// (`RateLimit-Policy: "egress";q=10485760;w=60;qu="content-bytes"`): a download or a
    /// server-sent-events stream is charged what it actually sent.
    ///
    /// The request is decided for one byte, which admits it unless nothing is left of the
    /// caller's byte quota (then it is refused before its body starts, as any refusal), and
    /// a body in progress is never cut: its bytes are charged once it ends, or when it is
    /// dropped before the end (a client gone away), past the quota if need be, as a debt
    /// its later requests wait out ([`Limiter::settle`]). A later [`cost`](Self::cost)
    /// reserves an estimate instead, settled the same way. Settlements are counted in
    /// `tollgate_settlements_total`; one a remote store takes later is sent from a task on
    /// the runtime, under the store timeout. A later `count_response_bytes` replaces a
    /// [`settle`](Self::settle) or [`count_only`](Self::count_only), and they replace it.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http_body_util::BodyExt;
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let egress = Limiter::builder()
    ///     .policy(Policy::sliding_window("egress", Quota::per_minute(100_000)).content_bytes())
    ///     .build();
    /// let layer = RateLimitLayer::new(egress.clone())
    ///     .key(Caller::new("acme"))
    ///     .count_response_bytes();
    /// let export = ServiceBuilder::new().layer(layer).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::from(vec![0u8; 65_536]))))
    /// });
    /// let response = export.oneshot(http::Request::get("/export").body(()).unwrap()).await.unwrap();
    /// assert_eq!(
    ///     response.headers()["ratelimit-policy"],
    ///     r#""egress";q=100000;w=60;qu="content-bytes""#
    /// );
    /// // Sent: charged.
    /// let sent = response.into_body().collect().await.unwrap().to_bytes();
    /// assert_eq!(sent.len(), 65_536);
    /// let left = egress.check_cost(&Caller::new("acme"), 0).await;
    /// assert_eq!(left.info().unwrap().min_remaining(), Some(100_000 - 65_536));
    /// # }
    /// ```
    pub fn count_response_bytes(self) -> Self {
        let mut config = self.into_config();
        config.after_response = Some(AfterResponse::CountBytes);
        config.cost = Some(CostFn(Arc::new(|_| 1)));
        Self::rebuilt(config)
    }

    /// Makes the limit soft: a request the policies refuse goes on to the inner service
    /// all the same, with a [`Decision::SoftLimited`] in its extensions before the handler
    /// runs, so that the handler can degrade (answer from a cache, use a smaller model,
    /// queue at a lower priority) instead of the caller getting a 429. It counts nothing,
    /// as a refusal does; its response carries the RateLimit fields of the refusal (`r=0`
    /// and `t` for the exhausted policy) and no Retry-After, and such decisions are counted
    /// in `tollgate_decisions_total` with outcome `soft_limited`. A store that fails closed
    /// still refuses with 503: the soft limit is about quota, not about a store that cannot
    /// decide.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tollgate::{Caller, Decision, Limiter, Policy, Quota, RateLimitLayer};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(1)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter).key(Caller::new("acme")).soft_limit(true);
    /// let answers = ServiceBuilder::new().layer(layer).service_fn(|req: http::Request<()>| async move {
    ///     let model = match req.extensions().get::<Decision>() {
    ///         Some(Decision::SoftLimited(_)) => "small",
    ///         _ => "large",
    ///     };
    ///     let response = http::Response::builder().header("x-model", model);
    ///     Ok::<_, Infallible>(response.body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap())
    /// });
    /// let ask = || http::Request::post("/v1/answers").body(()).unwrap();
    /// let first = answers.clone().oneshot(ask()).await.unwrap();
    /// assert_eq!(first.headers()["x-model"], "large");
    /// let over = answers.oneshot(ask()).await.unwrap();
    /// assert_eq!(over.status(), 200);
    /// assert!(over.headers()["ratelimit"].to_str().unwrap().contains("r=0"));
    /// assert_eq!(over.headers()["x-model"], "small");
    /// # }
    /// ```
    pub fn soft_limit(self, soft: bool) -> Self {
        let mut config = self.into_config();
        config.refusals = if soft {
            Refusals::LetThrough
        } else {
            Refusals::Refuse
        };
        Self::rebuilt(config)
    }

    /// The limiter this layer decides with.
    pub fn limiter(&self) -> &Limiter {
        &self.config.limiter
    }

    /// The body type of the responses: [`Wrapped`], the default, for any inner body, or
    /// [`InnerBody`](crate::response::InnerBody), the inner service's own body type, which
    /// saves a copy of each response and, in an axum router, an allocation per request.
    ///
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{Router, routing::get};
    /// use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer, response::InnerBody};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///     .build();
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Caller::new("*"))
    ///     .response_body::<InnerBody>();
    /// let app: Router = Router::new().route("/orders", get(|| async { "[]" })).layer(layer);
    /// # drop(app);
    /// # }
    /// ```
    pub fn response_body<Shape2>(self) -> RateLimitLayer<K, Shape2> {
        RateLimitLayer {
            config: self.config,
            shape: PhantomData,
        }
    }

    fn rebuilt(config: Config<K>) -> Self {
        Self {
            config: Arc::new(config),
            shape: PhantomData,
        }
    }

    fn into_config(self) -> Config<K> {
        Arc::try_unwrap(self.config).unwrap_or_else(|shared| Config {
            limiter: shared.limiter.clone(),
            key: shared.key.clone(),
            missing_key: shared.missing_key,
            header_mode: shared.header_mode,
            field_forms: shared.field_forms,
            decision_on_every_response: shared.decision_on_every_response,
            unavailable_status: shared.unavailable_status,
            policy_fields: PolicyFieldCache::default(),
            remaining_cap: shared.remaining_cap,
            partition_key: shared.partition_key.clone(),
            skip: shared.skip.clone(),
            refusal: shared.refusal.clone(),
            cost: shared.cost.clone(),
            after_response: shared.after_response.clone(),
            refusals: shared.refusals,
        })
    }
}

impl<S, K: Clone, Shape> Layer<S> for RateLimitLayer<K, Shape> {
    type Service = RateLimit<S, K, Shape>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_config(inner, self.config.clone())
    }
}
