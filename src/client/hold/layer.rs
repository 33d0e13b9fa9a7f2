//! The layer, one set of holds shared by every service it wraps, and its settings: the
//! partition, how long a call may wait, the longest hold, the clock.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::config::Config;
use super::service::HoldBack;
use super::state::Shared;
use crate::client::error::HoldReason;
use crate::store::clock::Clock;

/// Honours what servers say about their limits, on the client side: after a response that
/// says to wait, calls to that server's partition are not sent until the wait is over.
///
/// Wraps any `Service<http::Request<B>, Response = http::Response<R>> + Clone` whose error
/// converts into tower's boxed error: hyper's
/// client, reqwest or any HTTP client behind a tower service, a tonic `Channel`. Responses
/// come back with their body `R` wrapped in a [`HoldBackBody`](crate::client::HoldBackBody).
/// A response holds its partition when it carries
///
/// - `Retry-After` on a 429 or 503 (seconds or an HTTP date),
/// - a `RateLimit` field (draft 11) with a policy at `r=0`, for that policy's `t` (on any
///   status: the next call would be refused),
/// - `grpc-retry-pushback-ms` (gRPC) with milliseconds above zero, for that long, or
/// - gRPC's "do not retry": `grpc-retry-pushback-ms` below zero or not an integer, beside
///   RESOURCE_EXHAUSTED or UNAVAILABLE (gRPC's 429 and 503), for [`max_hold`](Self::max_hold)
///   ([`HoldReason::GrpcNoRetry`]).
///
/// gRPC's pushback is read where the gRPC status is: in the response headers of a
/// Trailers-Only answer (as tollgate's refusals are), and otherwise in the trailers, when
/// the response's [`HoldBackBody`](crate::client::HoldBackBody) yields them. A hold read
/// from the trailers starts when they arrive, so calls made before the caller has read
/// the body that far are sent.
///
/// The longest of these wins, capped at [`max_hold`](Self::max_hold); a hold
/// is only ever lengthened by later responses. While a partition is held, a call to it
/// fails at once with a boxed [`NotSent`](crate::client::NotSent) (the service's error is tower's
/// `Box<dyn Error + Send + Sync>`), or,
/// with [`max_wait`](Self::max_wait), waits for the hold to end if it ends
/// within that time and is sent then. Calls already in flight when a hold starts are not
/// recalled.
///
/// gRPC's own clients take "do not retry" as final for the call that got it. This layer
/// cannot tell a retry from the next call of the same partition, and the server names no
/// time, so it holds the partition as long as it holds anything: a server short of capacity
/// that says retrying is futile is not called again until `max_hold` has passed. Partition
/// by method (the request path) to keep the hold to the method refused, or shorten
/// `max_hold`. Beside any other status, "do not retry" is about the call itself (a bad
/// argument, a missing entity) and holds nothing: the failure goes to the caller as it came.
///
/// The partition is the request URI's authority by default, or what
/// [`partition`](Self::partition) chooses (a host and an API key's digest). A layer holds
/// at most 10,000 partitions at once, so memory stays bounded whatever the partitions are;
/// a new hold past that replaces the one that ends soonest, and adding one never scans the
/// others.
///
/// Each call held back increments `tollgate_client_held_back_total`, labelled `layer`,
/// `reason` ([`HoldReason::as_str`]) and `outcome` (`failed`, or `waited` for a call sent
/// after waiting), through the `metrics` facade.
///
/// # With the adaptive throttle
///
/// The two compose: put this layer outside the
/// [`AdaptiveThrottleLayer`](crate::client::AdaptiveThrottleLayer), so that calls held back here
/// (never sent) do not count as requests the backend refused. Both fail with tower's boxed
/// error, and a call either did not send downcasts to the one
/// [`NotSent`](crate::client::NotSent) (its [`reason`](crate::client::NotSent::reason)
/// tells them apart); anything else is the inner service's.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tollgate::client::{AdaptiveThrottleLayer, HoldBackLayer, HoldReason, NotSent};
/// use tollgate::store::ManualClock;
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = ManualClock::new(1_800_000_000_000);
/// let hold = HoldBackLayer::new().name("orders").clock(clock.clone());
/// let throttle = AdaptiveThrottleLayer::new().name("orders").clock(clock.clone());
/// // A server whose last unit was just spent: it answers, and says none is left for 2 s.
/// let client = ServiceBuilder::new()
///     .layer(hold.clone())
///     .layer(throttle.clone())
///     .service_fn(|_req: Request<()>| async {
///         let response = Response::builder()
///             .header("ratelimit", r#""per-second";r=0;t=2"#)
///             .body(())
///             .unwrap();
///         Ok::<_, Infallible>(response)
///     });
/// let call = || Request::get("http://orders.internal/orders").body(()).unwrap();
///
/// assert_eq!(client.clone().oneshot(call()).await.unwrap().status(), 200);
/// // Not sent: the server said to wait.
/// let error = client.clone().oneshot(call()).await.unwrap_err();
/// assert_eq!(error.downcast_ref::<NotSent>().unwrap().reason(), HoldReason::RateLimitHeader);
/// assert_eq!(hold.held_for("orders.internal"), Some(Duration::from_secs(2)));
/// // The throttle saw one request, accepted.
/// assert_eq!((throttle.requests(), throttle.accepts()), (1, 1));
///
/// clock.advance(Duration::from_secs(2));
/// assert!(client.oneshot(call()).await.is_ok());
/// # }
/// ```
#[derive(Clone)]
pub struct HoldBackLayer {
    pub(super) shared: Arc<Shared>,
}

impl HoldBackLayer {
    /// A layer with the defaults: partitioned by authority, held calls fail at once, holds
    /// of at most an hour, the system clock.
    ///
    /// ```
    /// let layer = tollgate::client::HoldBackLayer::new();
    /// assert_eq!(layer.held_for("api.example.com"), None);
    /// ```
    pub fn new() -> Self {
        Self::from_config(Config::default())
    }

    /// How long calls to `partition` stay held from now, and why; `None` when they are sent.
    ///
    /// ```
    /// let layer = tollgate::client::HoldBackLayer::new();
    /// assert_eq!(layer.held_for("api.example.com"), None);
    /// ```
    pub fn held_for(&self, partition: &str) -> Option<Duration> {
        self.shared.held_for(partition).map(|(wait, _)| wait)
    }

    /// Why `partition` is held, if it is.
    ///
    /// ```
    /// let layer = tollgate::client::HoldBackLayer::new();
    /// assert_eq!(layer.hold_reason("api.example.com"), None);
    /// ```
    pub fn hold_reason(&self, partition: &str) -> Option<HoldReason> {
        self.shared.held_for(partition).map(|(_, reason)| reason)
    }
}

client_layer!(HoldBackLayer, service: HoldBack, shared: Shared, config: Config);

/// Configuration, tower-http style: each method takes the layer and returns it with the
/// setting changed, and with no partition held (configure a layer before cloning it or
/// wrapping services with it).
///
/// ```
/// use std::time::Duration;
/// use tollgate::client::HoldBackLayer;
/// use tollgate::store::ManualClock;
///
/// let layer = HoldBackLayer::new()
///     .name("github")
///     .max_wait(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(600))
///     .clock(ManualClock::new(0));
/// assert!(format!("{layer:?}").contains(r#"name: "github""#));
/// ```
impl HoldBackLayer {
    /// Names the layer in metric labels and logs (default `"default"`).
    ///
    /// ```
    /// use tollgate::client::HoldBackLayer;
    /// let layer = HoldBackLayer::new().name("stripe");
    /// assert!(format!("{layer:?}").contains(r#"name: "stripe""#));
    /// ```
    pub fn name(self, name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        self.configure(|config| config.name = name)
    }

    /// Chooses the partition of each request from its parts (method, URI, headers,
    /// extensions): what one server's limit covers. The default is the URI's authority (or
    /// `Host`), one partition per server.
    ///
    /// A server that limits per API key limits each key apart: partition by host and a
    /// digest of the key, so that a key told to wait does not hold back the others (and
    /// the key itself is not kept in memory):
    ///
    /// ```
    /// use sha2::{Digest, Sha256};
    /// use tollgate::client::HoldBackLayer;
    ///
    /// let layer = HoldBackLayer::new()
    ///     .partition(|parts| {
    ///         let host = parts.uri.authority().map_or("", |a| a.as_str());
    ///         let key = parts.headers.get("authorization").map_or(&b""[..], |v| v.as_bytes());
    ///         let digest = Sha256::digest(key);
    ///         let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    ///         format!("{host}#{short}")
    ///     });
    /// # drop(layer);
    /// ```
    pub fn partition(self, partition: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.configure(|config| config.partition = Arc::new(partition))
    }

    /// How long a call to a held partition may wait for the hold to end before it is sent
    /// (default zero: it fails at once with [`NotSent`](crate::client::NotSent)). A call whose
    /// partition stays held longer than this from when it was made fails at once, without
    /// waiting for a wait that cannot end in time; a hold that grows while it waits (a
    /// response of a call in flight says to wait longer) fails it then.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::HoldBackLayer;
    /// // Interactive callers wait up to half a second, no more.
    /// let layer = HoldBackLayer::new().max_wait(Duration::from_millis(500));
    /// # drop(layer);
    /// ```
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.configure(|config| config.max_wait = max_wait)
    }

    /// The longest a partition is held, whatever the server asks (default an hour): a
    /// server that sends `Retry-After: 99999999` by mistake does not silence the client
    /// for years. It is also how long gRPC's "do not retry", which names no time, holds
    /// a partition.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::client::HoldBackLayer;
    /// let layer = HoldBackLayer::new().max_hold(Duration::from_secs(60));
    /// # drop(layer);
    /// ```
    pub fn max_hold(self, max_hold: Duration) -> Self {
        self.configure(|config| config.max_hold = max_hold)
    }

    /// Reads time from `clock` (default the system clock), such as a
    /// [`ManualClock`](crate::store::ManualClock) in tests. Waits (with
    /// [`max_wait`](Self::max_wait)) sleep on tokio's timer and then read this clock again.
    ///
    /// ```
    /// use tollgate::client::HoldBackLayer;
    /// use tollgate::store::ManualClock;
    /// let layer = HoldBackLayer::new().clock(ManualClock::new(0));
    /// # drop(layer);
    /// ```
    pub fn clock(self, clock: impl Clock) -> Self {
        self.configure(|config| config.clock = Arc::new(clock))
    }
}
