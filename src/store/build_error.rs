//! Why a configuration cannot work: a limiter's, a swap of its limits, a policy's, an
//! instance registry's, or a definition read from a file.

use std::fmt;
use std::time::Duration;

/// Why a configuration was refused: the one error of every fallible constructor and check
/// of the crate's configuration.
///
/// - [`LimiterBuilder::try_build`](crate::LimiterBuilder::try_build) and
///   [`Limiter::set_limits`](crate::Limiter::set_limits): the policy sets, the store
///   timeout, the limiter's name;
/// - [`Policy::try_new`](crate::Policy::try_new) and the
///   [`Algorithm`](crate::store::Algorithm) `try_` constructors: a policy's name and
///   numbers;
/// - `InstanceRegistry::start` (the `redis` feature): the heartbeat and instance id its
///   store was built with, and its initial count;
/// - the definitions of `tollgate::config` (the `serde` feature): each of the above, and a
///   field, key or failure policy that a file names wrongly.
///
/// ```
/// use std::time::Duration;
/// use tollgate::BuildError;
/// use tollgate::store::Algorithm;
///
/// let error = Algorithm::try_sliding_window(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(error, BuildError::ZeroLimit);
/// assert_eq!(error.to_string(), "a sliding window or log needs a limit of at least 1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// The default set (`tier` is `None`) or a tier has no policy.
    NoPolicies {
        /// The tier without a policy, or `None` for the default policies.
        tier: Option<String>,
    },
    /// Two policies of one set share a name (clients could not tell them apart).
    DuplicatePolicy {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The repeated name.
        name: String,
    },
    /// The store timeout is under 1 ms, below any round trip: every remote decision would
    /// time out and meet the failure policy.
    StoreTimeoutTooShort {
        /// The timeout asked for.
        timeout: Duration,
    },
    /// The limiter was given a store ([`LimiterBuilder::backend`]) but no
    /// [`name`](crate::LimiterBuilder::name) nor
    /// [`counter_scope`](crate::LimiterBuilder::counter_scope):
    /// every unnamed limiter on that store would count in the same counters.
    ///
    /// [`LimiterBuilder::backend`]: crate::LimiterBuilder::backend
    Unnamed,

    /// A policy's name is empty, longer than 64 bytes, or not printable ASCII (it appears
    /// in HTTP headers and store keys).
    InvalidPolicyName(String),
    /// A sliding window's or sliding log's limit is zero.
    ZeroLimit,
    /// A token bucket's rate is zero.
    ZeroRate,
    /// A token bucket's burst is zero.
    ZeroBurst,
    /// A policy's window or refill period is under one millisecond.
    ShortPeriod,
    /// A policy's limit (or rate, or burst) times its window (or period) in milliseconds
    /// reaches 2^53, beyond exact arithmetic in Redis's Lua.
    Inexact,
    /// A sliding log's limit is above the most it keeps per caller: it stores one entry per
    /// admitted unit ([`Algorithm::MAX_LOG_LIMIT`](crate::store::Algorithm::MAX_LOG_LIMIT)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::BuildError;
    /// use tollgate::store::Algorithm;
    /// let error = Algorithm::try_sliding_log(50_000, Duration::from_secs(1)).unwrap_err();
    /// assert_eq!(error, BuildError::LogTooLarge { limit: 50_000, max: 10_000 });
    /// assert_eq!(
    ///     error.to_string(),
    ///     "a sliding log keeps one entry per admitted unit: its limit must be at most 10000, got 50000"
    /// );
    /// ```
    LogTooLarge {
        /// The limit asked for.
        limit: u64,
        /// The largest limit a sliding log takes.
        max: u64,
    },

    /// An instance registry's heartbeat interval is not shorter than its liveness window:
    /// instances would drop out of each other's counts between beats, each counting only
    /// itself.
    HeartbeatNotShorterThanWindow {
        /// The heartbeat interval asked for.
        heartbeat_every: Duration,
        /// The liveness window asked for.
        live_within: Duration,
    },
    /// An instance registry's instance id is empty or holds a control character.
    InvalidInstanceId(String),
    /// An instance registry was started with an `initial_count` of 0: an instance started
    /// while Redis is unreachable would divide by 1 until its first heartbeat answers.
    NoInitialCount,
    /// An instance registry was started outside a Tokio runtime, where its background task
    /// cannot run.
    NoRuntime,
    /// A two-tier store's region (`TwoTierBackend::builder`, with the `redis` feature) has
    /// an empty name or one with a control character, or its weights
    /// (`TwoTierBuilder::share_by_weight`) have no regions (`all` is 0) or a weight above
    /// them all.
    InvalidRegion {
        /// The region's name.
        region: String,
        /// The region's weight (0 when none was given).
        weight: u32,
        /// The weights of all regions together (0 when none was given).
        all: u32,
    },

    /// A policy of a definition read from a file cannot work: one of the policy errors
    /// above ([`ZeroLimit`](Self::ZeroLimit), [`Inexact`](Self::Inexact),
    /// [`InvalidPolicyName`](Self::InvalidPolicyName), …), with where the policy is, so the
    /// entry of the file is easy to find.
    PolicyInDefinition {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The policy's name as written.
        name: String,
        /// What is wrong with it.
        error: Box<BuildError>,
    },
    /// A policy of a definition lacks a field its algorithm needs (`limit` and `window` for
    /// a sliding window or log; `rate`, `period` and `burst` for a token bucket), or has one
    /// it does not use.
    PolicyField {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The policy's name as written.
        name: String,
        /// The field.
        field: &'static str,
        /// Whether the field is missing (`true`) or does not belong (`false`).
        missing: bool,
    },
    /// A definition's key names a header that is not a valid header name.
    InvalidHeaderName(String),
    /// A definition's failure policy is a local share among zero instances.
    ZeroInstances,
    /// A trusted proxy's network ([`ClientIp::trusted_proxies`]) is not a CIDR block
    /// nor an address.
    ///
    /// [`ClientIp::trusted_proxies`]: crate::key::ClientIp::trusted_proxies
    InvalidCidr {
        /// The block as given.
        block: String,
    },
    /// A definition gives callers quotas of their own, or budgets, but names no key to
    /// find the callers by.
    QuotasWithoutKey,
    /// A definition's key names both a header and the client IP, or neither.
    AmbiguousKey,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |tier: &Option<String>| match tier {
            Some(tier) => format!("tier {tier:?}"),
            None => "the default policies".to_owned(),
        };
        match self {
            BuildError::NoPolicies { tier } => {
                write!(f, "{} need at least one policy", set(tier))
            }
            BuildError::DuplicatePolicy { tier, name } => {
                write!(f, "{} name policy {name:?} twice", set(tier))
            }
            BuildError::StoreTimeoutTooShort { timeout } => write!(
                f,
                "the store timeout ({timeout:?}) is under 1 ms: every remote decision would \
                 time out"
            ),
            BuildError::Unnamed => f.write_str(
                "a limiter given a store needs a name (LimiterBuilder::name, the same on \
                 every instance) or a counter_scope: unnamed limiters on one store would \
                 share their counters",
            ),
            BuildError::InvalidPolicyName(name) => write!(
                f,
                "a policy name must be 1 to 64 printable ASCII characters, got {name:?}"
            ),
            BuildError::InvalidRegion {
                region,
                weight,
                all,
            } => write!(
                f,
                "a region needs a name of printable characters, and a weight of at most all \
                 regions' weights, all above 0: got {region:?}, {weight} of {all}"
            ),
            BuildError::ZeroLimit => {
                f.write_str("a sliding window or log needs a limit of at least 1")
            }
            BuildError::ZeroRate => f.write_str("a token bucket needs a rate of at least 1"),
            BuildError::ZeroBurst => f.write_str("a token bucket needs a burst of at least 1"),
            BuildError::ShortPeriod => {
                f.write_str("a window or refill period must be at least 1 ms")
            }
            BuildError::Inexact => {
                f.write_str("the count times the window or period (ms) must stay below 2^53")
            }
            BuildError::LogTooLarge { limit, max } => write!(
                f,
                "a sliding log keeps one entry per admitted unit: its limit must be at most {max}, got {limit}"
            ),
            BuildError::HeartbeatNotShorterThanWindow {
                heartbeat_every,
                live_within,
            } => write!(
                f,
                "the heartbeat interval ({heartbeat_every:?}) must be shorter than the liveness \
                 window ({live_within:?}), or each instance counts only itself"
            ),
            BuildError::InvalidInstanceId(id) => write!(
                f,
                "the instance id {id:?} is empty or holds a control character"
            ),
            BuildError::NoInitialCount => f.write_str(
                "the instance registry needs the deployment's instance count (initial_count), \
                 used until the first heartbeat answers: an instance started while Redis is \
                 unreachable would otherwise divide by 1",
            ),
            BuildError::NoRuntime => f.write_str(
                "the instance registry must be started inside a Tokio runtime, which runs its \
                 heartbeat",
            ),
            BuildError::PolicyInDefinition { tier, name, error } => {
                write!(f, "policy {name:?} of {}: {error}", set(tier))
            }
            BuildError::PolicyField {
                tier,
                name,
                field,
                missing: true,
            } => write!(f, "policy {name:?} of {} needs `{field}`", set(tier)),
            BuildError::PolicyField {
                tier, name, field, ..
            } => write!(
                f,
                "policy {name:?} of {}: its algorithm does not use `{field}`",
                set(tier)
            ),
            BuildError::InvalidHeaderName(name) => {
                write!(f, "the key's header {name:?} is not a valid header name")
            }
            BuildError::ZeroInstances => f.write_str("a local share needs at least 1 instance"),
            BuildError::InvalidCidr { block } => write!(f, "invalid CIDR block {block:?}"),
            BuildError::QuotasWithoutKey => f.write_str(
                "callers' own quotas and budgets need a key that finds the callers (`key`)",
            ),
            BuildError::AmbiguousKey => {
                f.write_str("a key reads either a `header` or the `client_ip`, one of the two")
            }
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::PolicyInDefinition { error, .. } => Some(error.as_ref()),
            _ => None,
        }
    }
}
