//! `RateLimit-Policy`: the quota policies a server applies.

use bytes::BytesMut;
use http::{HeaderName, HeaderValue};

use super::error::InvalidField;
use super::format::{self, MAX_INTEGER, PARTITION_KEY, QUOTA, QUOTA_UNIT, WINDOW};
use super::list::{self, Item, Member};

/// The `RateLimit-Policy` field of draft 11: every quota policy that applies to the
/// request, as a list of `"name";q=quota;w=window` items (with optional `qu`, the quota
/// unit, and `pk`, the partition key).
///
/// A [`headers::Header`], so axum-extra's `TypedHeader` and `headers::HeaderMapExt` read and
/// write it. A field the draft does not allow (not a Structured Field list, an item that is
/// not a string, no `q`, a negative or non-integer `q` or `w`) is an error; parameters the
/// draft does not define are ignored.
///
/// ```
/// use headers::HeaderMapExt;
/// use tollgate::headers::{QuotaPolicy, RateLimitPolicyHeader};
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("ratelimit-policy", r#""per-second";q=50;w=1, "daily";q=1000;w=86400"#.parse().unwrap());
/// let policy: RateLimitPolicyHeader = headers.typed_get().unwrap();
/// assert_eq!(policy.policies().len(), 2);
/// assert_eq!(policy.get("daily").unwrap().quota(), 1000);
/// assert_eq!(policy.get("daily").unwrap().window_secs(), Some(86_400));
///
/// // Written by the same code that writes the rate limit layer's responses.
/// let mut headers = http::HeaderMap::new();
/// let policy = RateLimitPolicyHeader::new()
///     .policy(QuotaPolicy::new("per-minute", 100).unwrap().with_window_secs(60));
/// headers.typed_insert(policy);
/// assert_eq!(headers["ratelimit-policy"], r#""per-minute";q=100;w=60"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitPolicyHeader {
    policies: Vec<QuotaPolicy>,
}

/// One item of [`RateLimitPolicyHeader`]: a named quota.
///
/// ```
/// use tollgate::headers::QuotaPolicy;
///
/// let policy = QuotaPolicy::new("uploads", 10_000_000)
///     .unwrap()
///     .with_window_secs(3_600)
///     .with_unit("content-bytes")
///     .unwrap()
///     .with_partition_key(*b"\x01\x02");
/// assert_eq!(policy.name(), "uploads");
/// assert_eq!(policy.unit(), Some("content-bytes"));
/// assert_eq!(policy.partition_key(), Some(&[1u8, 2][..]));
/// // A name must be printable ASCII, as a Structured Field string is.
/// assert!(QuotaPolicy::new("caf\u{e9}", 1).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaPolicy {
    name: String,
    quota: u64,
    window: Option<u64>,
    unit: Option<String>,
    partition_key: Option<Vec<u8>>,
}

impl RateLimitPolicyHeader {
    /// A field with no policy yet (encoded as no field line until one is added).
    ///
    /// ```
    /// assert!(tollgate::headers::RateLimitPolicyHeader::new().policies().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a policy, after those already added.
    ///
    /// ```
    /// use tollgate::headers::{QuotaPolicy, RateLimitPolicyHeader};
    /// let field = RateLimitPolicyHeader::new().policy(QuotaPolicy::new("a", 1).unwrap());
    /// assert_eq!(field.policies()[0].name(), "a");
    /// ```
    pub fn policy(mut self, policy: QuotaPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// The policies, in the field's order.
    ///
    /// ```
    /// let field = tollgate::headers::RateLimitPolicyHeader::parse(br#""a";q=1, "b";q=2"#).unwrap();
    /// assert_eq!(field.policies().iter().map(|p| p.quota()).sum::<u64>(), 3);
    /// ```
    pub fn policies(&self) -> &[QuotaPolicy] {
        &self.policies
    }

    /// The first policy named `name`.
    ///
    /// ```
    /// let field = tollgate::headers::RateLimitPolicyHeader::parse(br#""a";q=1"#).unwrap();
    /// assert!(field.get("b").is_none());
    /// ```
    pub fn get(&self, name: &str) -> Option<&QuotaPolicy> {
        list::find(&self.policies, name)
    }

    /// Decodes one field value (all lines joined with `, `), as
    /// [`decode`](headers::Header::decode) does. A value that does not follow the draft
    /// is an error; what was wrong with it goes to a debug-level `tracing` event.
    ///
    /// ```
    /// use tollgate::headers::RateLimitPolicyHeader;
    /// let field = RateLimitPolicyHeader::parse(br#""burst";q=100;w=60;qu="request";x-vendor=1"#).unwrap();
    /// assert_eq!(field.policies()[0].unit(), Some("request"));
    /// assert!(RateLimitPolicyHeader::parse(br#""burst";q=-1"#).is_err());
    /// assert!(RateLimitPolicyHeader::parse(b"burst;q=100").is_err()); // a token, not a string
    /// ```
    pub fn parse(value: &[u8]) -> Result<Self, headers::Error> {
        list::parse(value).map(|policies| Self { policies })
    }
}

impl QuotaPolicy {
    /// A policy of `quota` units; quotas above 999,999,999,999,999 (the largest Structured
    /// Field integer) are taken as it. The name must be printable ASCII (a Structured Field
    /// string); any other is an error.
    ///
    /// ```
    /// use tollgate::headers::QuotaPolicy;
    /// assert_eq!(QuotaPolicy::new("big", u64::MAX).unwrap().quota(), 999_999_999_999_999);
    /// ```
    pub fn new(name: impl Into<String>, quota: u64) -> Result<Self, headers::Error> {
        Ok(Self {
            name: list::checked_string(name)?,
            quota: quota.min(MAX_INTEGER),
            window: None,
            unit: None,
            partition_key: None,
        })
    }

    /// Sets `w`, the window in seconds (capped as the quota is).
    ///
    /// ```
    /// let p = tollgate::headers::QuotaPolicy::new("a", 1).unwrap().with_window_secs(60);
    /// assert_eq!(p.window_secs(), Some(60));
    /// ```
    pub fn with_window_secs(mut self, secs: u64) -> Self {
        self.window = Some(secs.min(MAX_INTEGER));
        self
    }

    /// Sets `qu`, the quota unit (`"request"`, `"content-bytes"`, `"concurrent-requests"`);
    /// printable ASCII only, any other is an error.
    ///
    /// ```
    /// let p = tollgate::headers::QuotaPolicy::new("a", 1).unwrap().with_unit("request").unwrap();
    /// assert_eq!(p.unit(), Some("request"));
    /// ```
    pub fn with_unit(mut self, unit: impl Into<String>) -> Result<Self, headers::Error> {
        self.unit = Some(list::checked_string(unit)?);
        Ok(self)
    }

    /// Sets `pk`, the partition key.
    ///
    /// ```
    /// let p = tollgate::headers::QuotaPolicy::new("a", 1).unwrap().with_partition_key(vec![7]);
    /// assert_eq!(p.partition_key(), Some(&[7u8][..]));
    /// ```
    pub fn with_partition_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// The policy's name.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaPolicy::new("a", 1).unwrap().name(), "a");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `q`: the quota.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaPolicy::new("a", 5).unwrap().quota(), 5);
    /// ```
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// `w`: the window in seconds, if the field gives one.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaPolicy::new("a", 5).unwrap().window_secs(), None);
    /// ```
    pub fn window_secs(&self) -> Option<u64> {
        self.window
    }

    /// `qu`: the quota unit, if the field gives one (the draft's default is `"request"`).
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaPolicy::new("a", 5).unwrap().unit(), None);
    /// ```
    pub fn unit(&self) -> Option<&str> {
        self.unit.as_deref()
    }

    /// `pk`: the partition key, if the field gives one.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaPolicy::new("a", 5).unwrap().partition_key(), None);
    /// ```
    pub fn partition_key(&self) -> Option<&[u8]> {
        self.partition_key.as_deref()
    }
}

impl Member for QuotaPolicy {
    const FIELD: &'static str = "ratelimit-policy";

    fn name(&self) -> &str {
        &self.name
    }

    fn read(item: &Item) -> Result<Self, InvalidField> {
        Ok(Self {
            name: item.name.clone(),
            quota: item.required_integer(QUOTA)?,
            window: item.integer(WINDOW)?,
            unit: item.string(QUOTA_UNIT)?,
            partition_key: item.bytes(PARTITION_KEY)?,
        })
    }

    fn write_params(&self, out: &mut BytesMut) {
        format::push_integer(out, QUOTA, self.quota);
        if let Some(window) = self.window {
            format::push_integer(out, WINDOW, window);
        }
        if let Some(unit) = &self.unit {
            format::push_string_param(out, QUOTA_UNIT, unit);
        }
        if let Some(pk) = &self.partition_key {
            format::push_bytes(out, PARTITION_KEY, pk);
        }
    }
}

impl headers::Header for RateLimitPolicyHeader {
    fn name() -> &'static HeaderName {
        static NAME: HeaderName = crate::http::response::RATELIMIT_POLICY;
        &NAME
    }

    fn decode<'i, I>(values: &mut I) -> Result<Self, headers::Error>
    where
        I: Iterator<Item = &'i HeaderValue>,
    {
        list::decode(values).map(|policies| Self { policies })
    }

    fn encode<E: Extend<HeaderValue>>(&self, values: &mut E) {
        list::encode(&self.policies, values);
    }
}
