//! Why a limiter's configuration (or a swap of its limits) cannot work.

use std::fmt;
use std::time::Duration;

/// Why [`LimiterBuilder::try_build`](crate::LimiterBuilder::try_build) refused a configuration.
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
    /// A trusted proxy's network ([`ClientIp::trusted_proxies`]) is not a CIDR block
    /// nor an address.
    ///
    /// [`ClientIp::trusted_proxies`]: crate::key::ClientIp::trusted_proxies
    InvalidCidr {
        /// The block as given.
        block: String,
    },
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
            BuildError::InvalidCidr { block } => write!(f, "invalid CIDR block {block:?}"),
        }
    }
}

impl std::error::Error for BuildError {}
