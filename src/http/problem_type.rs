//! The problem types a refusal's problem+json body names.

/// The `type` of a refusal's problem+json body (RFC 9457): what kind of refusal it is, as a
/// URI a client can match on.
///
/// ```
/// use tollgate::response::ProblemType;
///
/// let uri = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// assert_eq!(ProblemType::from_uri(uri), Some(ProblemType::QuotaExceeded));
/// assert_eq!(ProblemType::QuotaExceeded.uri(), uri);
/// assert_eq!(ProblemType::from_uri("about:blank"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemType {
    /// A 429: the caller used its quota. The type the IETF RateLimit draft registers.
    QuotaExceeded,
    /// A fail-closed refusal (503 by default): the store could not decide, or a
    /// concurrency shed turned the request away. Registered by the same draft.
    TemporaryReducedCapacity,
    /// A 429 for a request whose cost exceeds a policy's whole quota: no wait would ever
    /// admit it, so the response has no Retry-After. Its members: `policy` (the first such
    /// policy), `cost`, `quota` and `violated-policies`.
    CostExceedsQuota,
}

impl ProblemType {
    const ALL: [ProblemType; 3] = [
        ProblemType::QuotaExceeded,
        ProblemType::TemporaryReducedCapacity,
        ProblemType::CostExceedsQuota,
    ];

    /// The URI written as the body's `type` member.
    pub const fn uri(self) -> &'static str {
        match self {
            ProblemType::QuotaExceeded => {
                "https://iana.org/assignments/http-problem-types#quota-exceeded"
            }
            ProblemType::TemporaryReducedCapacity => {
                "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
            }
            // This type is tollgate's own, so its URI is where it is documented.
            ProblemType::CostExceedsQuota => {
                "https://docs.rs/tollgate/latest/tollgate/response/enum.ProblemType.html#variant.CostExceedsQuota"
            }
        }
    }

    /// The problem type a body's `type` member names, if it is one of these.
    pub fn from_uri(uri: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|problem| problem.uri() == uri)
    }
}
