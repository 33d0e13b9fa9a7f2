//! `RateLimit`: where each policy stands for the request.

use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderName, HeaderValue};

use super::error::InvalidField;
use super::format::{self, MAX_INTEGER, PARTITION_KEY, REMAINING, RESET};
use super::list::{self, Item, Member};

/// The `RateLimit` field of draft 11: each policy's state for this request, as a list of
/// `"name";r=remaining;t=reset` items (with an optional `pk`, the partition key).
///
/// A [`headers::Header`], so axum-extra's `TypedHeader` and `headers::HeaderMapExt` read and
/// write it. A field the draft does not allow (not a Structured Field list, an item that is
/// not a string, no `r`, a negative or non-integer `r` or `t`) is an error; parameters the
/// draft does not define are ignored.
///
/// ```
/// use std::time::Duration;
/// use headers::HeaderMapExt;
/// use tollgate::headers::{QuotaState, RateLimitHeader};
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("ratelimit", r#""per-second";r=0;t=1, "daily";r=812;t=40000"#.parse().unwrap());
/// let state: RateLimitHeader = headers.typed_get().unwrap();
/// // The policy that runs out first decides when to call again.
/// assert_eq!(state.exhausted_for(), Some(Duration::from_secs(1)));
/// assert_eq!(state.get("daily").unwrap().remaining(), 812);
///
/// let mut headers = http::HeaderMap::new();
/// headers.typed_insert(RateLimitHeader::new().state(QuotaState::new("per-minute", 3).unwrap().with_reset_secs(20)));
/// assert_eq!(headers["ratelimit"], r#""per-minute";r=3;t=20"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitHeader {
    states: Vec<QuotaState>,
}

/// One item of [`RateLimitHeader`]: a named policy's remaining units and reset.
///
/// ```
/// use tollgate::headers::QuotaState;
///
/// let state = QuotaState::new("per-second", 0).unwrap().with_reset_secs(1).with_partition_key(vec![9]);
/// assert_eq!((state.name(), state.remaining(), state.reset_secs()), ("per-second", 0, Some(1)));
/// assert_eq!(state.partition_key(), Some(&[9u8][..]));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaState {
    name: String,
    remaining: u64,
    reset: Option<u64>,
    partition_key: Option<Vec<u8>>,
}

impl RateLimitHeader {
    /// A field with no state yet (encoded as no field line until one is added).
    ///
    /// ```
    /// assert!(tollgate::headers::RateLimitHeader::new().states().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a policy's state, after those already added.
    ///
    /// ```
    /// use tollgate::headers::{QuotaState, RateLimitHeader};
    /// let field = RateLimitHeader::new().state(QuotaState::new("a", 1).unwrap());
    /// assert_eq!(field.states()[0].remaining(), 1);
    /// ```
    pub fn state(mut self, state: QuotaState) -> Self {
        self.states.push(state);
        self
    }

    /// The states, in the field's order.
    ///
    /// ```
    /// let field = tollgate::headers::RateLimitHeader::parse(br#""a";r=1, "b";r=2;t=5"#).unwrap();
    /// assert_eq!(field.states().len(), 2);
    /// ```
    pub fn states(&self) -> &[QuotaState] {
        &self.states
    }

    /// The first state of the policy named `name`.
    ///
    /// ```
    /// let field = tollgate::headers::RateLimitHeader::parse(br#""a";r=1"#).unwrap();
    /// assert!(field.get("a").is_some());
    /// ```
    pub fn get(&self, name: &str) -> Option<&QuotaState> {
        list::find(&self.states, name)
    }

    /// How long the field says no request will be admitted: the longest `t` among the
    /// policies with `r=0` (a policy with `r=0` and no `t` gives no time), or `None` when
    /// every policy has units left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::headers::RateLimitHeader;
    /// let field = RateLimitHeader::parse(br#""a";r=0;t=3, "b";r=0;t=30, "c";r=5;t=60"#).unwrap();
    /// assert_eq!(field.exhausted_for(), Some(Duration::from_secs(30)));
    /// assert_eq!(RateLimitHeader::parse(br#""a";r=2;t=3"#).unwrap().exhausted_for(), None);
    /// ```
    pub fn exhausted_for(&self) -> Option<Duration> {
        self.states
            .iter()
            .filter(|state| state.remaining == 0)
            .filter_map(|state| state.reset)
            .max()
            .map(Duration::from_secs)
    }

    /// Decodes one field value (all lines joined with `, `), as
    /// [`decode`](headers::Header::decode) does. A value that does not follow the draft
    /// is an error; what was wrong with it goes to a debug-level `tracing` event.
    ///
    /// ```
    /// use tollgate::headers::RateLimitHeader;
    /// assert_eq!(RateLimitHeader::parse(br#""a";r=1;t=2;x=?1"#).unwrap().states()[0].reset_secs(), Some(2));
    /// assert!(RateLimitHeader::parse(br#""a";r=1.5"#).is_err());
    /// assert!(RateLimitHeader::parse(b"\"a\";r=1;;").is_err());
    /// ```
    pub fn parse(value: &[u8]) -> Result<Self, headers::Error> {
        list::parse(value).map(|states| Self { states })
    }

    /// [`parse`](Self::parse), saying what is wrong.
    #[cfg(test)]
    pub(crate) fn parse_with_reason(value: &[u8]) -> Result<Self, InvalidField> {
        list::parse_with_reason(value).map(|states| Self { states })
    }
}

impl QuotaState {
    /// A state with `remaining` units left; values above 999,999,999,999,999 (the largest
    /// Structured Field integer) are taken as it. The name must be printable ASCII (a
    /// Structured Field string); any other is an error.
    ///
    /// ```
    /// assert!(tollgate::headers::QuotaState::new("\n", 1).is_err());
    /// ```
    pub fn new(name: impl Into<String>, remaining: u64) -> Result<Self, headers::Error> {
        Ok(Self {
            name: list::checked_string(name)?,
            remaining: remaining.min(MAX_INTEGER),
            reset: None,
            partition_key: None,
        })
    }

    /// Sets `t`, the seconds until the quota resets (capped as `r` is).
    ///
    /// ```
    /// let s = tollgate::headers::QuotaState::new("a", 0).unwrap().with_reset_secs(4);
    /// assert_eq!(s.reset_secs(), Some(4));
    /// ```
    pub fn with_reset_secs(mut self, secs: u64) -> Self {
        self.reset = Some(secs.min(MAX_INTEGER));
        self
    }

    /// Sets `pk`, the partition key.
    ///
    /// ```
    /// let s = tollgate::headers::QuotaState::new("a", 0).unwrap().with_partition_key(vec![1]);
    /// assert_eq!(s.partition_key(), Some(&[1u8][..]));
    /// ```
    pub fn with_partition_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// The policy's name.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaState::new("a", 1).unwrap().name(), "a");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `r`: the units left.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaState::new("a", 1).unwrap().remaining(), 1);
    /// ```
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// `t`: the seconds until the quota resets, if the field gives it.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaState::new("a", 1).unwrap().reset_secs(), None);
    /// ```
    pub fn reset_secs(&self) -> Option<u64> {
        self.reset
    }

    /// `pk`: the partition key, if the field gives one.
    ///
    /// ```
    /// assert_eq!(tollgate::headers::QuotaState::new("a", 1).unwrap().partition_key(), None);
    /// ```
    pub fn partition_key(&self) -> Option<&[u8]> {
        self.partition_key.as_deref()
    }
}

impl Member for QuotaState {
    const FIELD: &'static str = "ratelimit";

    fn name(&self) -> &str {
        &self.name
    }

    fn read(item: &Item) -> Result<Self, InvalidField> {
        Ok(Self {
            name: item.name.clone(),
            remaining: item.required_integer(REMAINING)?,
            reset: item.integer(RESET)?,
            partition_key: item.bytes(PARTITION_KEY)?,
        })
    }

    fn write_params(&self, out: &mut BytesMut) {
        format::push_integer(out, REMAINING, self.remaining);
        if let Some(reset) = self.reset {
            format::push_integer(out, RESET, reset);
        }
        if let Some(pk) = &self.partition_key {
            format::push_bytes(out, PARTITION_KEY, pk);
        }
    }
}

impl headers::Header for RateLimitHeader {
    fn name() -> &'static HeaderName {
        static NAME: HeaderName = crate::http::response::RATELIMIT;
        &NAME
    }

    fn decode<'i, I>(values: &mut I) -> Result<Self, headers::Error>
    where
        I: Iterator<Item = &'i HeaderValue>,
    {
        list::decode(values).map(|states| Self { states })
    }

    fn encode<E: Extend<HeaderValue>>(&self, values: &mut E) {
        list::encode(&self.states, values);
    }
}
