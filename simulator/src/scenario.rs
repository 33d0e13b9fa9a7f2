//! What is simulated: the callers, the quota, the deployment, the outage and the failure
//! policies to compare.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tollgate::BreakerConfig;
use tollgate::BuildError;
use tollgate::FailurePolicy;
use tollgate::InstanceCount;
use tollgate::Leases;
use tollgate::Limiter;
use tollgate::RateLimitLayer;
use tollgate::key::AsyncKeyExtractor;
use tollgate::{Policy, Quota};
use tower_layer::Layer;
use tower_service::Service;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};

use crate::service::{Answering, FrontLayer, RateLimited, SimBody, UserLayer};
use crate::store::{FaultKind, InstanceContext};

/// Past this many simulated requests, a run takes too long to be worth it.
pub(crate) const MAX_REQUESTS: f64 = 50_000_000.0;
/// At most this many limiter instances in one group.
const MAX_INSTANCES: usize = 2_000;

/// One of the failure policies the simulator knows how to deploy, by the name the tables
/// print.
///
/// ```
/// use tollgate_simulator::PolicyName;
/// let policy: PolicyName = "local-share".parse().unwrap();
/// assert_eq!(policy, PolicyName::LocalShare);
/// assert_eq!(policy.name(), "local-share");
/// assert!("fail-sideways".parse::<PolicyName>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PolicyName {
    /// [`FailurePolicy::open`]: everything passes while the store is down.
    Open,
    /// [`FailurePolicy::closed`]: everything is refused with 503 while the store is down.
    Closed,
    /// [`FailurePolicy::local_share`] divided by the configured number of instances.
    LocalShare,
    /// [`FailurePolicy::fail_static`]: what the store last refused stays refused until
    /// that refusal expires; everything else passes.
    Static,
    /// [`FailurePolicy::static_then`] a local share: the store's last refusals first, the
    /// local share for the rest.
    StaticThenLocalShare,
    /// A local share that forgot to divide: every instance enforces the full limit.
    LocalShareNoDivisor,
    /// A local share divided by a stale count: twice the configured instances run.
    LocalShareStaleDivisor,
    /// A local share where all of the first customer's requests land on one instance.
    LocalSharePinned,
    /// [`Leases`]: callers over 20 requests a second on an instance are decided from
    /// leases of quota, the others per request; a local share when the store is down.
    LocalShareLeased,
}

/// The rate on one instance above which the leased group decides a caller from leases: in
/// the running example acme (120/s over 4 instances, 30/s each) is hot, globex and
/// initech are not.
const LEASE_THRESHOLD_PER_SEC: u64 = 20;

impl PolicyName {
    /// Every policy, in the order the tables list them.
    pub const ALL: [PolicyName; 9] = [
        PolicyName::Open,
        PolicyName::Closed,
        PolicyName::LocalShare,
        PolicyName::Static,
        PolicyName::StaticThenLocalShare,
        PolicyName::LocalShareNoDivisor,
        PolicyName::LocalShareStaleDivisor,
        PolicyName::LocalSharePinned,
        PolicyName::LocalShareLeased,
    ];

    /// The name the tables print and [`FromStr`] reads.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// assert_eq!(PolicyName::StaticThenLocalShare.name(), "static-then-local-share");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Open => "open",
            PolicyName::Closed => "closed",
            PolicyName::LocalShare => "local-share",
            PolicyName::Static => "static",
            PolicyName::StaticThenLocalShare => "static-then-local-share",
            PolicyName::LocalShareNoDivisor => "local-share-no-divisor",
            PolicyName::LocalShareStaleDivisor => "local-share-stale-divisor",
            PolicyName::LocalSharePinned => "local-share-pinned",
            PolicyName::LocalShareLeased => "local-share-leased",
        }
    }

    /// What the limiters of this group do when the store fails, in a deployment
    /// configured with `instances` instances.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// let policy = PolicyName::Closed.failure_policy(4);
    /// # let _ = policy;
    /// ```
    pub fn failure_policy(self, instances: u64) -> FailurePolicy {
        self.policy_with(InstanceCount::fixed(instances))
    }

    /// [`failure_policy`](Self::failure_policy) for the instance at `place` among them, as
    /// a deployment that gives each instance its ordinal configures it.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// let second = PolicyName::LocalShare.failure_policy_at(4, 1);
    /// assert!(format!("{second:?}").contains("at_place(1)"));
    /// ```
    pub fn failure_policy_at(self, instances: u64, place: u64) -> FailurePolicy {
        self.policy_with(InstanceCount::fixed(instances).at_place(place))
    }

    fn policy_with(self, count: InstanceCount) -> FailurePolicy {
        let share = || FailurePolicy::local_share(count.clone());
        match self {
            PolicyName::Open => FailurePolicy::open(),
            PolicyName::Closed => FailurePolicy::closed(),
            PolicyName::Static => FailurePolicy::fail_static(),
            PolicyName::StaticThenLocalShare => FailurePolicy::static_then(share()),
            PolicyName::LocalShareNoDivisor => FailurePolicy::local_share(InstanceCount::fixed(1)),
            PolicyName::LocalShare
            | PolicyName::LocalShareStaleDivisor
            | PolicyName::LocalSharePinned
            | PolicyName::LocalShareLeased => share(),
        }
    }

    /// The leases of this group's limiters, in a deployment configured with `instances`
    /// instances: only [`PolicyName::LocalShareLeased`] leases.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// assert!(PolicyName::LocalShareLeased.leases(4).is_some());
    /// assert!(PolicyName::LocalShare.leases(4).is_none());
    /// ```
    pub fn leases(self, instances: u64) -> Option<Leases> {
        (self == PolicyName::LocalShareLeased).then(|| {
            Leases::new()
                .threshold_per_sec(LEASE_THRESHOLD_PER_SEC)
                .instances(InstanceCount::fixed(instances))
        })
    }

    /// How many instances actually run when `instances` are configured: twice as many
    /// when the divisor is stale.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// assert_eq!(PolicyName::LocalShareStaleDivisor.running_instances(4), 8);
    /// assert_eq!(PolicyName::LocalShare.running_instances(4), 4);
    /// ```
    pub fn running_instances(self, instances: usize) -> usize {
        match self {
            PolicyName::LocalShareStaleDivisor => instances * 2,
            _ => instances,
        }
    }

    /// Whether all of the first customer's requests land on the first instance.
    ///
    /// ```
    /// use tollgate_simulator::PolicyName;
    /// assert!(PolicyName::LocalSharePinned.pins_first_customer());
    /// ```
    pub fn pins_first_customer(self) -> bool {
        self == PolicyName::LocalSharePinned
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyName {
    type Err = ScenarioError;

    fn from_str(name: &str) -> Result<Self, ScenarioError> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| ScenarioError::UnknownPolicy(name.to_owned()))
    }
}

impl FromStr for FaultKind {
    type Err = ScenarioError;

    fn from_str(name: &str) -> Result<Self, ScenarioError> {
        match name {
            "refuse" => Ok(FaultKind::Refuse),
            "blackhole" => Ok(FaultKind::Blackhole),
            "slow" => Ok(FaultKind::Slow),
            other => Err(ScenarioError::UnknownFault(other.to_owned())),
        }
    }
}

/// The counting algorithm of the simulated quota.
///
/// ```
/// use tollgate_simulator::AlgorithmKind;
/// assert_eq!("token-bucket".parse::<AlgorithmKind>().unwrap(), AlgorithmKind::TokenBucket);
/// assert!("leaky".parse::<AlgorithmKind>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// A sliding window counter (the default).
    #[default]
    SlidingWindow,
    /// A token bucket.
    TokenBucket,
}

impl FromStr for AlgorithmKind {
    type Err = ScenarioError;

    fn from_str(name: &str) -> Result<Self, ScenarioError> {
        match name {
            "sliding-window" => Ok(AlgorithmKind::SlidingWindow),
            "token-bucket" => Ok(AlgorithmKind::TokenBucket),
            other => Err(ScenarioError::UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// A caller sending requests at a steady rate: request `k` goes out at `k / rate` s.
///
/// Each request is a `GET /orders` without a body that carries the customer's name in
/// `x-customer-id` (the header the simulator's own layer is keyed on), and the handler
/// answers it 200 with no header and no body. For a layer of your own
/// ([`Scenario::layer`]), say what it reads: the headers
/// ([`header`](Self::header)), the method and path ([`request`](Self::request)) and the
/// body ([`body`](Self::body)) each request carries, and how the handler answers
/// ([`answers_status`](Self::answers_status), [`answers_header`](Self::answers_header),
/// [`answers_bytes`](Self::answers_bytes)), for the `count_only`, `settle` or
/// `count_response_bytes` that reads the answer.
///
/// ```
/// use tollgate_simulator::Customer;
/// let acme: Customer = "acme=120".parse().unwrap();
/// assert_eq!((acme.name(), acme.rate()), ("acme", 120.0));
/// assert!("acme".parse::<Customer>().is_err());
/// assert!("a b=3".parse::<Customer>().is_err());
///
/// // A completion request reserved at its max_tokens, settled at what the answer used.
/// let acme = Customer::new("acme", 2.0)
///     .request("POST", "/v1/completions")
///     .header("x-api-key", "sk_acme")
///     .header("x-max-tokens", "2000")
///     .answers_header("x-tokens-used", "500");
/// # drop(acme);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Customer {
    name: String,
    rate: f64,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Bytes,
    answer_status: u16,
    answer_headers: Vec<(String, String)>,
    answer_bytes: usize,
}

impl Customer {
    /// A customer called `name` (sent as its key) sending `rate` requests per second;
    /// checked when the scenario is.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("globex", 20.0).rate(), 20.0);
    /// ```
    pub fn new(name: impl Into<String>, rate: f64) -> Self {
        Self {
            name: name.into(),
            rate,
            method: "GET".to_owned(),
            path: "/orders".to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
            answer_status: 200,
            answer_headers: Vec::new(),
            answer_bytes: 0,
        }
    }

    /// The customer's name, the value of its `x-customer-id` header.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.0).name(), "acme");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Requests per second.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.5).rate(), 1.5);
    /// ```
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Sends `name: value` with every request, after `x-customer-id` (a header of that
    /// name given here replaces it). Give a name twice and both values are sent.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// let acme = Customer::new("acme", 10.0).header("x-api-key", "sk_acme");
    /// assert_eq!(acme.headers(), [("x-api-key".to_owned(), "sk_acme".to_owned())]);
    /// ```
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The headers given with [`header`](Self::header), in order.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert!(Customer::new("acme", 10.0).headers().is_empty());
    /// ```
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Sends each request with this method to this path, a query string allowed (default
    /// `GET /orders`).
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// let batch = Customer::new("acme", 10.0).request("POST", "/batch?items=30");
    /// assert_eq!(batch.request_line(), ("POST", "/batch?items=30"));
    /// ```
    pub fn request(mut self, method: impl Into<String>, path: impl Into<String>) -> Self {
        self.method = method.into();
        self.path = path.into();
        self
    }

    /// The method and path of each request.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.0).request_line(), ("GET", "/orders"));
    /// ```
    pub fn request_line(&self) -> (&str, &str) {
        (&self.method, &self.path)
    }

    /// Sends `body` with every request (default: none), for a layer that reads it, such
    /// as a [`BodyCostLayer`](tollgate::cost::BodyCostLayer) given to
    /// [`Scenario::in_front`].
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// let acme = Customer::new("acme", 1.0).body(r#"{"max_tokens": 2000}"#);
    /// assert_eq!(acme.body_bytes(), br#"{"max_tokens": 2000}"#);
    /// ```
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The body each request carries.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert!(Customer::new("acme", 1.0).body_bytes().is_empty());
    /// ```
    pub fn body_bytes(&self) -> &[u8] {
        &self.body
    }

    /// The handler answers this customer's requests with `status` (default 200): a 401
    /// for a login route whose layer counts only failed attempts, say. An answer of the
    /// handler counts as admitted whatever its status.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("mallory", 1.0).answers_status(401).answer_status(), 401);
    /// ```
    pub fn answers_status(mut self, status: u16) -> Self {
        self.answer_status = status;
        self
    }

    /// The status the handler answers with.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.0).answer_status(), 200);
    /// ```
    pub fn answer_status(&self) -> u16 {
        self.answer_status
    }

    /// The handler's answers to this customer carry `name: value`, for a layer that reads
    /// its responses: a [`settle`](tollgate::RateLimitLayer::settle) reading the tokens a
    /// completion used, a [`count_only`](tollgate::RateLimitLayer::count_only) reading
    /// whether it counts.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// let acme = Customer::new("acme", 1.0).answers_header("x-tokens-used", "420");
    /// assert_eq!(acme.answer_headers(), [("x-tokens-used".to_owned(), "420".to_owned())]);
    /// ```
    pub fn answers_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.answer_headers.push((name.into(), value.into()));
        self
    }

    /// The headers given with [`answers_header`](Self::answers_header), in order.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert!(Customer::new("acme", 1.0).answer_headers().is_empty());
    /// ```
    pub fn answer_headers(&self) -> &[(String, String)] {
        &self.answer_headers
    }

    /// The handler's answers to this customer have a body of `bytes` bytes (default 0, at
    /// most 64 MiB, sent in frames of up to 64 KiB), read to the end by the simulated client: what a layer with
    /// [`count_response_bytes`](tollgate::RateLimitLayer::count_response_bytes) charges.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.0).answers_bytes(65_536).answer_bytes(), 65_536);
    /// ```
    pub fn answers_bytes(mut self, bytes: usize) -> Self {
        self.answer_bytes = bytes;
        self
    }

    /// The length of the handler's answers' bodies.
    ///
    /// ```
    /// use tollgate_simulator::Customer;
    /// assert_eq!(Customer::new("acme", 1.0).answer_bytes(), 0);
    /// ```
    pub fn answer_bytes(&self) -> usize {
        self.answer_bytes
    }

    pub(crate) fn check(&self) -> Result<(), ScenarioError> {
        let name = &self.name;
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid_name {
            return Err(ScenarioError::BadCustomerName(name.clone()));
        }
        if !self.rate.is_finite() || self.rate <= 0.0 || self.rate > 100_000.0 {
            return Err(ScenarioError::BadRate {
                customer: name.clone(),
                rate: self.rate,
            });
        }
        self.prepare().map(drop)
    }

    /// The request template and the answer of this customer, or the first setting HTTP
    /// cannot carry.
    pub(crate) fn prepare(&self) -> Result<Prepared, ScenarioError> {
        let bad = |setting: &'static str, value: &str| ScenarioError::BadCustomerSetting {
            customer: self.name.clone(),
            setting,
            value: value.to_owned(),
        };
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|_| bad("request (method)", &self.method))?;
        let uri: Uri = self
            .path
            .parse()
            .ok()
            .filter(|uri: &Uri| uri.scheme().is_none() && uri.path().starts_with('/'))
            .ok_or_else(|| bad("request (path)", &self.path))?;
        let headers = |pairs: &[(String, String)], setting: &'static str| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                let name =
                    HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(setting, name))?;
                let value = HeaderValue::from_str(value).map_err(|_| bad(setting, value))?;
                map.append(name, value);
            }
            Ok(map)
        };
        let mut request_headers = headers(&self.headers, "header")?;
        if !request_headers.contains_key(CUSTOMER_HEADER) {
            let id = HeaderValue::from_str(&self.name)
                .map_err(|_| ScenarioError::BadCustomerName(self.name.clone()))?;
            request_headers.insert(CUSTOMER_HEADER, id);
        }
        let status = StatusCode::from_u16(self.answer_status)
            .ok()
            .filter(|s| !s.is_informational())
            .ok_or_else(|| bad("answers_status", &self.answer_status.to_string()))?;
        if self.answer_bytes > MAX_ANSWER_BYTES {
            return Err(bad("answers_bytes", &self.answer_bytes.to_string()));
        }
        Ok(Prepared {
            method,
            uri,
            headers: request_headers,
            body: self.body.clone(),
            answering: Arc::new(Answering {
                status,
                headers: headers(&self.answer_headers, "answers_header")?,
                body_len: self.answer_bytes,
            }),
        })
    }
}

/// The header each request carries its customer's name in.
pub(crate) const CUSTOMER_HEADER: &str = "x-customer-id";
/// The longest answer body a customer can be given.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// One customer's request, ready to copy for each request it sends, and its answer.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) answering: Arc<Answering>,
}

impl FromStr for Customer {
    type Err = ScenarioError;

    /// `NAME=RATE`.
    fn from_str(value: &str) -> Result<Self, ScenarioError> {
        let (name, rate) = value
            .split_once('=')
            .ok_or_else(|| ScenarioError::NotNameRate(value.to_owned()))?;
        let rate = rate
            .parse()
            .map_err(|_| ScenarioError::NotNameRate(value.to_owned()))?;
        let customer = Customer::new(name, rate);
        customer.check()?;
        Ok(customer)
    }
}

/// Builds each instance's [`Limiter`] of a group of your own, from the instance's store
/// and clock (see [`InstanceContext`]).
pub(crate) type Factory =
    Arc<dyn Fn(&InstanceContext) -> Result<Limiter, BuildError> + Send + Sync>;

/// A group of instances that runs a limiter of the caller's own.
#[derive(Clone)]
pub(crate) struct CustomGroup {
    pub(crate) name: String,
    pub(crate) factory: Factory,
}

impl fmt::Debug for CustomGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomGroup")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One group of the run, as the engine deploys it.
#[derive(Clone, Debug)]
pub(crate) enum GroupKind {
    Builtin(PolicyName),
    Custom(CustomGroup),
}

/// An outage scenario: callers sending requests at steady rates to a deployment of
/// limiter instances behind a round robin, a phase on a healthy store, an outage, and a
/// recovery. Each failure policy to compare runs its own group of instances (with its own
/// counters) through the same timeline.
///
/// [`Scenario::default`] is the running example: an orders API on 4 instances limiting each
/// customer to 50 requests per second (sliding window); acme sends 120 req/s, globex 20,
/// initech 5; 30 s normal, a 30 s outage in which the store refuses every call, 30 s of
/// recovery; every [`PolicyName`] compared. The builder methods replace one setting each;
/// [`validate`](Self::validate) (and every run) checks the numbers.
///
/// ```
/// use tollgate_simulator::{FaultKind, PolicyName, Scenario, ScenarioError};
///
/// let scenario = Scenario::default()
///     .fault(FaultKind::Blackhole)
///     .policies([PolicyName::Closed]);
/// assert!(scenario.validate().is_ok());
/// assert!(matches!(
///     scenario.limit(0).validate(),
///     Err(ScenarioError::OutOfRange { setting: "limit", .. })
/// ));
/// ```
#[derive(Clone, Debug)]
pub struct Scenario {
    pub(crate) limit: u64,
    pub(crate) window_secs: u64,
    pub(crate) instances: usize,
    pub(crate) algorithm: AlgorithmKind,
    pub(crate) burst: Option<u64>,
    pub(crate) normal_secs: u64,
    pub(crate) outage_secs: u64,
    pub(crate) recovery_secs: u64,
    pub(crate) traffic: Vec<Customer>,
    pub(crate) policies: Vec<PolicyName>,
    pub(crate) custom: Vec<CustomGroup>,
    pub(crate) layer: Option<UserLayer>,
    pub(crate) front: Option<FrontLayer>,
    pub(crate) fault: FaultKind,
    pub(crate) store_timeout_ms: u64,
    pub(crate) breaker_base_open_ms: Option<u64>,
    pub(crate) breaker_max_open_ms: Option<u64>,
    pub(crate) traced: Option<String>,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            limit: 50,
            window_secs: 1,
            instances: 4,
            algorithm: AlgorithmKind::SlidingWindow,
            burst: None,
            normal_secs: 30,
            outage_secs: 30,
            recovery_secs: 30,
            traffic: vec![
                Customer::new("acme", 120.0),
                Customer::new("globex", 20.0),
                Customer::new("initech", 5.0),
            ],
            policies: PolicyName::ALL.to_vec(),
            custom: Vec::new(),
            layer: None,
            front: None,
            fault: FaultKind::Refuse,
            store_timeout_ms: 20,
            breaker_base_open_ms: None,
            breaker_max_open_ms: None,
            traced: None,
        }
    }
}

impl Scenario {
    /// The running example; the same as [`Scenario::default`].
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().limit_value(), 50);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests per window per customer (1 to 10^9; default 50).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().limit(40).limit_value(), 40);
    /// ```
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// The window, in whole seconds (1 to 86400; default 1).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().window_secs(2).window_secs_value(), 2);
    /// ```
    pub fn window_secs(mut self, secs: u64) -> Self {
        self.window_secs = secs;
        self
    }

    /// The instances behind the round robin, as the deployment is configured (1 to 1000;
    /// default 4).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().instances(2).instances_value(), 2);
    /// ```
    pub fn instances(mut self, instances: usize) -> Self {
        self.instances = instances;
        self
    }

    /// The counting algorithm (default: sliding window).
    ///
    /// ```
    /// use tollgate_simulator::{AlgorithmKind, Scenario};
    /// let scenario = Scenario::new().algorithm(AlgorithmKind::TokenBucket);
    /// assert_eq!(scenario.algorithm_value(), AlgorithmKind::TokenBucket);
    /// ```
    pub fn algorithm(mut self, algorithm: AlgorithmKind) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The token bucket's capacity (1 to 10^9; default: the limit). Only for the token
    /// bucket.
    ///
    /// ```
    /// use tollgate_simulator::{AlgorithmKind, Scenario, ScenarioError};
    /// let scenario = Scenario::new().burst(80);
    /// assert!(matches!(scenario.validate(), Err(ScenarioError::BurstNeedsTokenBucket)));
    /// assert!(scenario.algorithm(AlgorithmKind::TokenBucket).validate().is_ok());
    /// ```
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The length of the phase before the outage, in seconds (1 to 86400; default 30).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Scenario};
    /// assert_eq!(Scenario::new().normal_secs(5).phase_secs(Phase::Normal), 5);
    /// ```
    pub fn normal_secs(mut self, secs: u64) -> Self {
        self.normal_secs = secs;
        self
    }

    /// The length of the outage, in seconds (1 to 86400; default 30).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Scenario};
    /// assert_eq!(Scenario::new().outage_secs(600).phase_secs(Phase::Outage), 600);
    /// ```
    pub fn outage_secs(mut self, secs: u64) -> Self {
        self.outage_secs = secs;
        self
    }

    /// The length of the phase after the outage, in seconds (1 to 86400; default 30).
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Scenario};
    /// assert_eq!(Scenario::new().recovery_secs(5).phase_secs(Phase::Recovery), 5);
    /// ```
    pub fn recovery_secs(mut self, secs: u64) -> Self {
        self.recovery_secs = secs;
        self
    }

    /// The customers, replacing the default acme, globex and initech.
    ///
    /// ```
    /// use tollgate_simulator::{Customer, Scenario};
    /// let scenario = Scenario::new().traffic([Customer::new("big", 60.0)]);
    /// assert_eq!(scenario.traffic_value().len(), 1);
    /// ```
    pub fn traffic(mut self, customers: impl IntoIterator<Item = Customer>) -> Self {
        self.traffic = customers.into_iter().collect();
        self
    }

    /// The failure policies to compare, one group each, in this order (default: every
    /// [`PolicyName`]). An empty list leaves only the groups added with
    /// [`group`](Self::group).
    ///
    /// ```
    /// use tollgate_simulator::{PolicyName, Scenario};
    /// let scenario = Scenario::new().policies([PolicyName::Open, PolicyName::Closed]);
    /// assert_eq!(scenario.group_names(), ["open", "closed"]);
    /// ```
    pub fn policies(mut self, policies: impl IntoIterator<Item = PolicyName>) -> Self {
        self.policies = policies.into_iter().collect();
        self
    }

    /// Adds a group of your own, run after the [`policies`](Self::policies) ones: each of
    /// its [`instances`](Self::instances) runs the [`Limiter`] that `factory` builds from
    /// the instance's [`InstanceContext`] (its store and clock). A configuration error
    /// the factory returns ends the run with
    /// [`SimulationError::Build`](super::SimulationError::Build).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// use tollgate::{FailurePolicy, Policy, Quota};
    ///
    /// let scenario = Scenario::new().policies([]).group("mine", |instance| {
    ///     instance
    ///         .limiter_builder()
    ///         .policy(Policy::sliding_window("per-second", Quota::per_second(50)))
    ///         .on_store_failure(FailurePolicy::open())
    ///         .try_build()
    /// });
    /// assert_eq!(scenario.group_names(), ["mine"]);
    /// ```
    pub fn group(
        mut self,
        name: impl Into<String>,
        factory: impl Fn(&InstanceContext) -> Result<Limiter, BuildError> + Send + Sync + 'static,
    ) -> Self {
        self.custom.push(CustomGroup {
            name: name.into(),
            factory: Arc::new(factory),
        });
        self
    }

    /// Runs every group's instances behind the [`RateLimitLayer`] that `build` makes
    /// around the instance's limiter, instead of the simulator's own (keyed on
    /// `x-customer-id`, one unit a request, nothing else): your key extractor, plan tiers,
    /// cost, `count_only`, `settle`, `count_response_bytes`, `soft_limit`, skip predicate,
    /// refusal hook and every other setting of your layer take part in the replay. `build`
    /// runs once per instance, with the [`Limiter`] that the group made for it (a group of
    /// your own's from its factory, a built-in group's from the scenario's quota and its
    /// failure policy), on the group's simulated store and the run's clock; build the layer
    /// around that limiter, or the instance does not see the outage.
    ///
    /// The requests carry what each [`Customer`] says ([`header`](Customer::header),
    /// [`body`](Customer::body), [`request`](Customer::request)) and the handler answers
    /// as it says ([`answers_header`](Customer::answers_header) and the like). The
    /// simulator turns on
    /// [`decision_on_every_response`](RateLimitLayer::decision_on_every_response) to read
    /// each decision; nothing else of the layer changes.
    ///
    /// ```
    /// use tollgate::key::{FnKey, KeyRejection};
    /// use tollgate::{Caller, FailurePolicy, Policy, Quota, RateLimitLayer};
    /// use tollgate_simulator::{Customer, Phase, Scenario};
    ///
    /// // The API key names the customer and its plan.
    /// let by_api_key = FnKey::new(|request: &http::Request<()>| {
    ///     match request.headers().get("x-api-key")?.to_str().ok()? {
    ///         "sk_acme" => Some(Caller::new("acme").with_tier("gold")),
    ///         "sk_globex" => Some(Caller::new("globex")),
    ///         _ => None,
    ///     }
    /// });
    /// let report = Scenario::new()
    ///     .policies([])
    ///     .traffic([
    ///         Customer::new("acme", 40.0).header("x-api-key", "sk_acme"),
    ///         Customer::new("globex", 40.0).header("x-api-key", "sk_globex"),
    ///     ])
    ///     .normal_secs(2).outage_secs(2).recovery_secs(2)
    ///     .group("mine", |instance| {
    ///         instance
    ///             .limiter_builder()
    ///             .policy(Policy::sliding_window("per-second", Quota::per_second(20)))
    ///             .tier("gold", [Policy::sliding_window("per-second", Quota::per_second(100))])
    ///             .on_store_failure(FailurePolicy::local_share(instance.instance_count()))
    ///             .try_build()
    ///     })
    ///     .layer(move |limiter| RateLimitLayer::new(limiter).key(by_api_key.clone()))
    ///     .run_blocking()
    ///     .unwrap();
    /// // acme's plan lets all of its 40 a second through; globex is held to 20.
    /// assert_eq!(report.row("mine", Phase::Normal, "acme").unwrap().admitted_per_sec, 40.0);
    /// let globex = report.row("mine", Phase::Normal, "globex").unwrap();
    /// assert!(globex.admitted_per_sec <= 20.0, "{globex:?}");
    /// ```
    pub fn layer<K, F>(mut self, build: F) -> Self
    where
        K: AsyncKeyExtractor,
        F: Fn(Limiter) -> RateLimitLayer<K> + Send + Sync + 'static,
    {
        self.layer = Some(UserLayer::new(build));
        self
    }

    /// Puts `layer` in front of each instance's rate limit, so that requests meet it first,
    /// as a router's later `route_layer` runs before an earlier one: a
    /// [`BodyCostLayer`](tollgate::cost::BodyCostLayer) that estimates a request's cost
    /// from its body for [`RequestCost::of_request`](tollgate::cost::RequestCost::of_request),
    /// an authentication middleware that leaves the caller in the request's extensions for
    /// an [`ExtensionKey`](tollgate::key::ExtensionKey). For several layers, give one that
    /// stacks them (`tower::ServiceBuilder`, `tower_layer::Stack`). Its service takes a
    /// `Request<`[`SimBody`]`>` and calls the [`RateLimited`] it wraps; the simulated client
    /// reads every response's body to the end. An answer that neither reached the handler
    /// nor is a 429 or 503 (a 413 of the body-cost layer, a 401 of the authentication) is
    /// counted in [`Counts::other`](crate::Counts::other).
    ///
    /// ```
    /// use tollgate::cost::{BodyCostLayer, RequestCost};
    /// use tollgate::key::HeaderKey;
    /// use tollgate::{FailurePolicy, Policy, Quota, RateLimitLayer};
    /// use tollgate_simulator::{Customer, Phase, Scenario};
    ///
    /// let max_tokens = |body: &[u8]| {
    ///     let body = std::str::from_utf8(body).ok()?;
    ///     body.strip_prefix("max_tokens=")?.parse().ok()
    /// };
    /// let report = Scenario::new()
    ///     .policies([])
    ///     .instances(1)
    ///     .traffic([Customer::new("acme", 10.0).request("POST", "/v1/completions").body("max_tokens=300")])
    ///     .normal_secs(2).outage_secs(1).recovery_secs(1)
    ///     .group("tokens", |instance| {
    ///         instance
    ///             .limiter_builder()
    ///             .policy(Policy::sliding_window("tokens", Quota::per_second(1_000)))
    ///             .on_store_failure(FailurePolicy::closed())
    ///             .try_build()
    ///     })
    ///     .layer(|limiter| {
    ///         RateLimitLayer::new(limiter)
    ///             .key(HeaderKey::new("x-customer-id"))
    ///             .cost(RequestCost::of_request)
    ///     })
    ///     .in_front(BodyCostLayer::new(1_024, max_tokens))
    ///     .run_blocking()
    ///     .unwrap();
    /// // 1,000 tokens a second at 300 a request: 3 of the 10 each second.
    /// let normal = report.row("tokens", Phase::Normal, "acme").unwrap();
    /// assert_eq!(normal.admitted_per_sec, 3.0);
    /// ```
    pub fn in_front<L, B>(mut self, layer: L) -> Self
    where
        L: Layer<RateLimited> + Send + Sync + 'static,
        L::Service:
            Service<Request<SimBody>, Response = Response<B>> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request<SimBody>>>::Future: Send + 'static,
        <L::Service as Service<Request<SimBody>>>::Error: Send + 'static,
        B: http_body::Body<Data = Bytes> + Send + 'static,
    {
        self.front = Some(FrontLayer::new(layer));
        self
    }

    /// How the store fails during the outage (default: it refuses every call).
    ///
    /// ```
    /// use tollgate_simulator::{FaultKind, Scenario};
    /// assert_eq!(Scenario::new().fault(FaultKind::Slow).fault_value(), FaultKind::Slow);
    /// ```
    pub fn fault(mut self, fault: FaultKind) -> Self {
        self.fault = fault;
        self
    }

    /// The limiters' store timeout in milliseconds (1 to 60000; default 20).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().store_timeout_ms(50).store_timeout_ms_value(), 50);
    /// ```
    pub fn store_timeout_ms(mut self, ms: u64) -> Self {
        self.store_timeout_ms = ms;
        self
    }

    /// The ceiling of the breaker's first open interval, in milliseconds (1 to 3600000;
    /// default: [`BreakerConfig::default`]'s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_simulator::Scenario;
    /// let breaker = Scenario::new().breaker_base_open_ms(100).breaker();
    /// assert_eq!(breaker.base_open_duration(), Duration::from_millis(100));
    /// ```
    pub fn breaker_base_open_ms(mut self, ms: u64) -> Self {
        self.breaker_base_open_ms = Some(ms);
        self
    }

    /// The most the breaker's open interval grows to, in milliseconds (1 to 3600000;
    /// default: [`BreakerConfig::default`]'s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_simulator::Scenario;
    /// let breaker = Scenario::new().breaker_max_open_ms(2_000).breaker();
    /// assert_eq!(breaker.max_open_duration(), Duration::from_millis(2_000));
    /// ```
    pub fn breaker_max_open_ms(mut self, ms: u64) -> Self {
        self.breaker_max_open_ms = Some(ms);
        self
    }

    /// Records every request of the customer called `name` (one of the traffic's), in
    /// every group: when it was sent, its answer and its quota's state after the decision
    /// (see [`GroupReport::trace`](super::GroupReport::trace)). One entry per request, so
    /// trace a customer of a scenario of moderate size.
    ///
    /// ```
    /// use tollgate_simulator::{Scenario, ScenarioError};
    /// assert_eq!(Scenario::new().trace("acme").traced_value(), Some("acme"));
    /// assert!(matches!(
    ///     Scenario::new().trace("umbrella").validate(),
    ///     Err(ScenarioError::UnknownTraced(_))
    /// ));
    /// ```
    pub fn trace(mut self, name: impl Into<String>) -> Self {
        self.traced = Some(name.into());
        self
    }

    /// The limit per window.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().limit_value(), 50);
    /// ```
    pub fn limit_value(&self) -> u64 {
        self.limit
    }

    /// The window in seconds.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().window_secs_value(), 1);
    /// ```
    pub fn window_secs_value(&self) -> u64 {
        self.window_secs
    }

    /// The configured instances.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().instances_value(), 4);
    /// ```
    pub fn instances_value(&self) -> usize {
        self.instances
    }

    /// The counting algorithm.
    ///
    /// ```
    /// use tollgate_simulator::{AlgorithmKind, Scenario};
    /// assert_eq!(Scenario::new().algorithm_value(), AlgorithmKind::SlidingWindow);
    /// ```
    pub fn algorithm_value(&self) -> AlgorithmKind {
        self.algorithm
    }

    /// The token bucket's capacity: the one set, or the limit.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().burst_value(), 50);
    /// ```
    pub fn burst_value(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// The customers.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().traffic_value()[0].name(), "acme");
    /// ```
    pub fn traffic_value(&self) -> &[Customer] {
        &self.traffic
    }

    /// The built-in failure policies compared.
    ///
    /// ```
    /// use tollgate_simulator::{PolicyName, Scenario};
    /// assert_eq!(Scenario::new().policies_value(), PolicyName::ALL);
    /// ```
    pub fn policies_value(&self) -> &[PolicyName] {
        &self.policies
    }

    /// The fault of the outage.
    ///
    /// ```
    /// use tollgate_simulator::{FaultKind, Scenario};
    /// assert_eq!(Scenario::new().fault_value(), FaultKind::Refuse);
    /// ```
    pub fn fault_value(&self) -> FaultKind {
        self.fault
    }

    /// The store timeout in milliseconds.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().store_timeout_ms_value(), 20);
    /// ```
    pub fn store_timeout_ms_value(&self) -> u64 {
        self.store_timeout_ms
    }

    /// The customer whose requests are traced, if any.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().traced_value(), None);
    /// ```
    pub fn traced_value(&self) -> Option<&str> {
        self.traced.as_deref()
    }

    /// Whether either breaker setting overrides the library's default.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert!(!Scenario::new().breaker_overridden());
    /// assert!(Scenario::new().breaker_max_open_ms(2_000).breaker_overridden());
    /// ```
    pub fn breaker_overridden(&self) -> bool {
        self.breaker_base_open_ms.is_some() || self.breaker_max_open_ms.is_some()
    }

    /// The length of a phase in seconds.
    ///
    /// ```
    /// use tollgate_simulator::{Phase, Scenario};
    /// assert_eq!(Scenario::new().phase_secs(Phase::Outage), 30);
    /// ```
    pub fn phase_secs(&self, phase: super::Phase) -> u64 {
        match phase {
            super::Phase::Normal => self.normal_secs,
            super::Phase::Outage => self.outage_secs,
            super::Phase::Recovery => self.recovery_secs,
        }
    }

    /// The whole run in seconds.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().total_secs(), 90);
    /// ```
    pub fn total_secs(&self) -> u64 {
        self.normal_secs + self.outage_secs + self.recovery_secs
    }

    /// The groups' names, in the order they run and report.
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().group_names()[0], "open");
    /// ```
    pub fn group_names(&self) -> Vec<String> {
        self.groups().map(|(name, _)| name).collect()
    }

    /// How many instances each group runs, in the order of
    /// [`group_names`](Self::group_names): what a real-time run needs one store for each.
    ///
    /// ```
    /// use tollgate_simulator::{PolicyName, Scenario};
    /// let scenario = Scenario::new()
    ///     .policies([PolicyName::LocalShare, PolicyName::LocalShareStaleDivisor]);
    /// assert_eq!(scenario.group_instances(), [4, 8]);
    /// ```
    pub fn group_instances(&self) -> Vec<usize> {
        self.groups().map(|(_, kind)| self.running(&kind)).collect()
    }

    pub(crate) fn groups(&self) -> impl Iterator<Item = (String, GroupKind)> + '_ {
        self.policies
            .iter()
            .map(|&p| (p.name().to_owned(), GroupKind::Builtin(p)))
            .chain(
                self.custom
                    .iter()
                    .map(|c| (c.name.clone(), GroupKind::Custom(c.clone()))),
            )
    }

    pub(crate) fn running(&self, kind: &GroupKind) -> usize {
        match kind {
            GroupKind::Builtin(policy) => policy.running_instances(self.instances),
            GroupKind::Custom(_) => self.instances,
        }
    }

    /// The quota as a [`Policy`], named after its window (`per-second`, `per-minute`,
    /// `per-Ns`).
    ///
    /// ```
    /// use tollgate_simulator::Scenario;
    /// assert_eq!(Scenario::new().policy().name(), "per-second");
    /// assert_eq!(Scenario::new().policy().quota(), 50);
    /// ```
    pub fn policy(&self) -> Policy {
        let name = match self.window_secs {
            1 => "per-second".to_owned(),
            60 => "per-minute".to_owned(),
            n => format!("per-{n}s"),
        };
        let quota = Quota::new(self.limit, Duration::from_secs(self.window_secs));
        match self.algorithm {
            AlgorithmKind::SlidingWindow => Policy::sliding_window(name, quota),
            AlgorithmKind::TokenBucket => Policy::token_bucket(name, quota, self.burst_value()),
        }
    }

    /// The library's default breaker with this scenario's overrides.
    ///
    /// ```
    /// use tollgate::BreakerConfig;
    /// use tollgate_simulator::Scenario;
    /// let default = BreakerConfig::default();
    /// assert_eq!(Scenario::new().breaker().max_open_duration(), default.max_open_duration());
    /// ```
    pub fn breaker(&self) -> BreakerConfig {
        let mut config = BreakerConfig::default();
        if let Some(ms) = self.breaker_base_open_ms {
            config = config.base_open(Duration::from_millis(ms));
        }
        if let Some(ms) = self.breaker_max_open_ms {
            config = config.max_open(Duration::from_millis(ms));
        }
        config
    }

    /// Checks the numbers: each setting in its range, the burst only with the token
    /// bucket, the breaker's first interval no longer than its longest, valid customers
    /// and not too many requests to simulate.
    ///
    /// ```
    /// use tollgate_simulator::{Customer, Scenario, ScenarioError};
    /// let error = Scenario::new()
    ///     .traffic([Customer::new("a", 1.0), Customer::new("a", 2.0)])
    ///     .validate()
    ///     .unwrap_err();
    /// assert!(matches!(error, ScenarioError::DuplicateCustomer(_)));
    /// ```
    pub fn validate(&self) -> Result<(), ScenarioError> {
        range("limit", self.limit, 1, 1_000_000_000)?;
        range("window_secs", self.window_secs, 1, 86_400)?;
        range("instances", self.instances as u64, 1, 1_000)?;
        if let Some(burst) = self.burst {
            range("burst", burst, 1, 1_000_000_000)?;
        }
        range("normal_secs", self.normal_secs, 1, 86_400)?;
        range("outage_secs", self.outage_secs, 1, 86_400)?;
        range("recovery_secs", self.recovery_secs, 1, 86_400)?;
        range("store_timeout_ms", self.store_timeout_ms, 1, 60_000)?;
        if let Some(ms) = self.breaker_base_open_ms {
            range("breaker_base_open_ms", ms, 1, 3_600_000)?;
        }
        if let Some(ms) = self.breaker_max_open_ms {
            range("breaker_max_open_ms", ms, 1, 3_600_000)?;
        }
        if self.traffic.is_empty() {
            return Err(ScenarioError::NoCustomers);
        }
        for (i, customer) in self.traffic.iter().enumerate() {
            customer.check()?;
            if self.traffic[..i].iter().any(|c| c.name == customer.name) {
                return Err(ScenarioError::DuplicateCustomer(customer.name.clone()));
            }
        }
        if let Some(traced) = &self.traced
            && !self.traffic.iter().any(|c| &c.name == traced)
        {
            return Err(ScenarioError::UnknownTraced(traced.clone()));
        }
        let names = self.group_names();
        if names.is_empty() {
            return Err(ScenarioError::NoGroups);
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ScenarioError::DuplicateGroup(name.clone()));
            }
        }
        if self.burst.is_some() && self.algorithm != AlgorithmKind::TokenBucket {
            return Err(ScenarioError::BurstNeedsTokenBucket);
        }
        let breaker = self.breaker();
        if breaker.base_open_duration() > breaker.max_open_duration() {
            return Err(ScenarioError::BreakerBaseAboveMax {
                base_ms: breaker.base_open_duration().as_millis() as u64,
                max_ms: breaker.max_open_duration().as_millis() as u64,
            });
        }
        let period_ms = u128::from(self.window_secs) * 1_000;
        let largest = u128::from(self.limit.max(self.burst.unwrap_or(0)));
        if largest * period_ms >= 1 << 53 {
            return Err(ScenarioError::QuotaTooLarge);
        }
        let instances = self.group_instances().into_iter().max().unwrap_or(0);
        let requests = self.traffic.iter().map(|c| c.rate).sum::<f64>()
            * self.total_secs() as f64
            * names.len() as f64;
        if requests > MAX_REQUESTS || instances > MAX_INSTANCES {
            return Err(ScenarioError::TooLarge {
                requests: requests as u64,
                instances,
            });
        }
        Ok(())
    }
}

pub(crate) fn range(
    setting: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<(), ScenarioError> {
    if value < min || value > max {
        return Err(ScenarioError::OutOfRange {
            setting,
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// Why a scenario cannot run.
///
/// ```
/// use tollgate_simulator::{Scenario, ScenarioError};
/// let error = Scenario::new().breaker_max_open_ms(100).validate().unwrap_err();
/// assert!(matches!(error, ScenarioError::BreakerBaseAboveMax { base_ms: 500, max_ms: 100 }));
/// assert!(error.to_string().contains("500 ms"));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ScenarioError {
    /// A number outside its range; `setting` is the builder method's name.
    OutOfRange {
        /// The builder method that set it, such as `window_secs`.
        setting: &'static str,
        /// The value given.
        value: u64,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A burst was set, but the algorithm is not the token bucket.
    BurstNeedsTokenBucket,
    /// The breaker's first open interval is longer than its longest.
    BreakerBaseAboveMax {
        /// The first interval's ceiling, in milliseconds.
        base_ms: u64,
        /// The longest interval, in milliseconds.
        max_ms: u64,
    },
    /// The limit (or burst) times the window in milliseconds reaches 2^53.
    QuotaTooLarge,
    /// Too many requests or instances to simulate.
    TooLarge {
        /// The requests the run would send.
        requests: u64,
        /// The most instances of one group.
        instances: usize,
    },
    /// No customers.
    NoCustomers,
    /// No groups: no failure policies and no groups of your own.
    NoGroups,
    /// Two groups with one name.
    DuplicateGroup(String),
    /// A customer name that is not 1 to 64 letters, digits, `-`, `_` or `.`.
    BadCustomerName(String),
    /// A rate that is not above 0 and at most 100000 per second.
    BadRate {
        /// The customer.
        customer: String,
        /// The rate given.
        rate: f64,
    },
    /// Two customers with one name.
    DuplicateCustomer(String),
    /// A customer's header, method, path or answer that HTTP cannot carry.
    BadCustomerSetting {
        /// The customer.
        customer: String,
        /// The [`Customer`] method that set it, such as `header`.
        setting: &'static str,
        /// The value given.
        value: String,
    },
    /// A customer that is not `NAME=RATE`.
    NotNameRate(String),
    /// The traced customer is not in the traffic.
    UnknownTraced(String),
    /// An unknown failure policy name.
    UnknownPolicy(String),
    /// An unknown fault name.
    UnknownFault(String),
    /// An unknown algorithm name.
    UnknownAlgorithm(String),
    /// A [`Regions`](crate::Regions) scenario without regions.
    NoRegions,
    /// Two regions with one name.
    DuplicateRegion(String),
    /// A region name that is not 1 to 32 letters, digits, `-`, `_` or `.`.
    BadRegionName(String),
    /// A region the scenario does not have (the fault names it).
    UnknownRegion(String),
    /// An unknown [`ShareBy`](crate::ShareBy) name.
    UnknownShareBy(String),
    /// A customer's spread over the regions is not one fraction per region, each from 0
    /// to 1, adding up to 1.
    BadSpread {
        /// The customer.
        customer: String,
        /// The fractions given.
        spread: Vec<f64>,
    },
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScenarioError::OutOfRange {
                setting,
                value,
                min,
                max,
            } => write!(f, "{setting}: {value} is out of range ({min} to {max})"),
            ScenarioError::BurstNeedsTokenBucket => {
                f.write_str("a burst needs the token bucket algorithm")
            }
            ScenarioError::BreakerBaseAboveMax { base_ms, max_ms } => write!(
                f,
                "the breaker's base open interval ({base_ms} ms) must not exceed its max \
                 ({max_ms} ms); the defaults are 500 and 1000"
            ),
            ScenarioError::QuotaTooLarge => {
                f.write_str("the limit (or burst) x the window (ms) must stay below 2^53")
            }
            ScenarioError::TooLarge {
                requests,
                instances,
            } => write!(
                f,
                "that is {requests} requests over {instances} instances: too many to simulate \
                 (at most {MAX_REQUESTS:.0}); lower the rates, the phases or the policies"
            ),
            ScenarioError::NoCustomers => f.write_str("no customers"),
            ScenarioError::NoGroups => f.write_str("no failure policies and no groups"),
            ScenarioError::DuplicateGroup(name) => write!(f, "group {name:?} given twice"),
            ScenarioError::BadCustomerName(name) => write!(
                f,
                "customer name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
            ),
            ScenarioError::BadRate { customer, rate } => write!(
                f,
                "rate {rate} of {customer} must be above 0 and at most 100000 per second"
            ),
            ScenarioError::DuplicateCustomer(name) => write!(f, "customer {name:?} given twice"),
            ScenarioError::BadCustomerSetting {
                customer,
                setting,
                value,
            } => write!(
                f,
                "{setting} of {customer}: {value:?} cannot go in an HTTP message"
            ),
            ScenarioError::NotNameRate(value) => write!(f, "{value:?} is not NAME=RATE"),
            ScenarioError::UnknownTraced(name) => {
                write!(f, "the traced customer {name:?} is not in the traffic")
            }
            ScenarioError::UnknownPolicy(name) => {
                let known: Vec<&str> = PolicyName::ALL.iter().map(|p| p.name()).collect();
                write!(f, "unknown policy {name:?} (one of {})", known.join(", "))
            }
            ScenarioError::UnknownFault(name) => {
                write!(f, "unknown fault {name:?} (refuse, blackhole or slow)")
            }
            ScenarioError::UnknownAlgorithm(name) => write!(
                f,
                "unknown algorithm {name:?} (sliding-window or token-bucket)"
            ),
            ScenarioError::NoRegions => f.write_str("no regions"),
            ScenarioError::DuplicateRegion(name) => write!(f, "region {name:?} given twice"),
            ScenarioError::BadRegionName(name) => write!(
                f,
                "region name {name:?} must be 1 to 32 letters, digits, '-', '_' or '.'"
            ),
            ScenarioError::UnknownRegion(name) => write!(f, "no region is called {name:?}"),
            ScenarioError::UnknownShareBy(name) => {
                write!(f, "unknown share {name:?} (demand or weight)")
            }
            ScenarioError::BadSpread { customer, spread } => write!(
                f,
                "the spread of {customer} ({spread:?}) must give each region a fraction from \
                 0 to 1, adding up to 1"
            ),
        }
    }
}

impl std::error::Error for ScenarioError {}
