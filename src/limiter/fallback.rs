//! Why a decision could not be made by the store.

use crate::store::backend::{StoreError, StoreErrorKind};

/// Why a decision fell back to the failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The store did not answer within the store timeout.
    Timeout,
    /// The store refused or dropped the connection.
    Refused,
    /// The store answered with an error.
    OtherError,
    /// The breaker is open: the store was not asked.
    BreakerOpen,
}

impl FallbackReason {
    /// A short, stable name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::Timeout => "timeout",
            FallbackReason::Refused => "refused",
            FallbackReason::OtherError => "other_error",
            FallbackReason::BreakerOpen => "breaker_open",
        }
    }

    pub(crate) fn of(error: &StoreError) -> Self {
        match error.kind() {
            StoreErrorKind::Timeout => FallbackReason::Timeout,
            StoreErrorKind::Unavailable => FallbackReason::Refused,
            _ => FallbackReason::OtherError,
        }
    }
}
