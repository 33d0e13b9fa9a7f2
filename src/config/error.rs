//! Why a definition read from a file cannot make a limiter.

use std::fmt;
use std::time::Duration;

use crate::limiter::build_error::BuildError;
use crate::store::invalid_policy::InvalidPolicy;

/// Why a [`LimiterDefinition`](super::LimiterDefinition) cannot be turned into limits, a
/// limiter or a key extractor. Policies are named by their set (`tier`, `None` for the
/// defaults) and their name, so the entry of the file is easy to find.
///
/// ```
/// use tollgate::config::{DefinitionError, LimiterDefinition};
///
/// let definition: LimiterDefinition = serde_json::from_str(
///     r#"{ "policies": [{ "name": "per-second", "algorithm": "sliding_window", "limit": 0, "window": "1s" }] }"#,
/// ).unwrap();
/// let error = definition.limits().unwrap_err();
/// assert!(matches!(error, DefinitionError::Policy { .. }));
/// assert_eq!(
///     error.to_string(),
///     "policy \"per-second\" of the default policies: a sliding window or log needs a limit of at least 1"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DefinitionError {
    /// A policy's values cannot work (a zero limit, a count beyond exact arithmetic, an
    /// invalid name).
    Policy {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The policy's name as written.
        name: String,
        /// What is wrong with it.
        error: InvalidPolicy,
    },
    /// A policy lacks a field its algorithm needs (`limit` and `window` for a sliding
    /// window; `rate`, `period` and `burst` for a token bucket), or has one it does not use.
    Field {
        /// The tier, or `None` for the default policies.
        tier: Option<String>,
        /// The policy's name as written.
        name: String,
        /// The field.
        field: &'static str,
        /// Whether the field is missing (`true`) or does not belong (`false`).
        missing: bool,
    },
    /// The policy sets cannot work together: a set without a policy, or a name twice in one
    /// set.
    Limits(BuildError),
    /// The key names a header that is not a valid header name.
    HeaderName(String),
    /// A local share among zero instances.
    ZeroInstances,
    /// A store timeout under 1 ms, below any round trip: every remote decision would time
    /// out and meet the failure policy.
    StoreTimeoutTooShort(Duration),
}

impl fmt::Display for DefinitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |tier: &Option<String>| match tier {
            Some(tier) => format!("tier {tier:?}"),
            None => "the default policies".to_owned(),
        };
        match self {
            DefinitionError::Policy { tier, name, error } => {
                write!(f, "policy {name:?} of {}: {error}", set(tier))
            }
            DefinitionError::Field {
                tier,
                name,
                field,
                missing: true,
            } => write!(f, "policy {name:?} of {} needs `{field}`", set(tier)),
            DefinitionError::Field {
                tier, name, field, ..
            } => write!(
                f,
                "policy {name:?} of {}: its algorithm does not use `{field}`",
                set(tier)
            ),
            DefinitionError::Limits(error) => error.fmt(f),
            DefinitionError::HeaderName(name) => {
                write!(f, "the key's header {name:?} is not a valid header name")
            }
            DefinitionError::ZeroInstances => {
                f.write_str("a local share needs at least 1 instance")
            }
            DefinitionError::StoreTimeoutTooShort(timeout) => {
                BuildError::StoreTimeoutTooShort { timeout: *timeout }.fmt(f)
            }
        }
    }
}

impl std::error::Error for DefinitionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DefinitionError::Policy { error, .. } => Some(error),
            DefinitionError::Limits(error) => Some(error),
            _ => None,
        }
    }
}

impl From<BuildError> for DefinitionError {
    fn from(error: BuildError) -> Self {
        DefinitionError::Limits(error)
    }
}
