use http::{HeaderName, Request};

use super::{Extracted, KeyExtractor};
use crate::store::caller::Caller;

/// Counts callers by the value of a request header, such as an API key or a customer id.
///
/// The value is taken as raw bytes (non-UTF-8 is fine) and bounded like every
/// [`CallerKey`](crate::store::CallerKey). A request without the header, or with an empty value,
/// has no key and is handled by the layer's [`MissingKey`](crate::key::MissingKey) choice. When
/// the header is repeated, the first value counts.
///
/// ```
/// use tollgate::key::HeaderKey;
///
/// let by_customer = HeaderKey::new("x-customer-id");
/// assert_eq!(by_customer.name().as_str(), "x-customer-id");
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys on the named header.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name; use [`HeaderKey::from_name`] with a
    /// checked [`HeaderName`] to avoid that.
    pub fn new(name: &str) -> Self {
        match HeaderName::try_from(name) {
            Ok(name) => Self::from_name(name),
            Err(_) => panic!("HeaderKey::new: {name:?} is not a valid header name"),
        }
    }

    /// Keys on the given header.
    ///
    /// ```
    /// use tollgate::key::HeaderKey;
    /// let by_auth = HeaderKey::from_name(http::header::AUTHORIZATION);
    /// # drop(by_auth);
    /// ```
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }

    /// The header this extractor reads.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl KeyExtractor for HeaderKey {
    #[inline]
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        // Built where it is returned: each step of an `Option` chain would move the caller.
        match request.headers().get(&self.name) {
            Some(value) if !value.is_empty() => Extracted::Caller(Caller::new(value.as_bytes())),
            _ => Extracted::NoKey,
        }
    }
}
