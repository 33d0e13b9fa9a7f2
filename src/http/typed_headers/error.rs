//! Why a field did not decode, or a value cannot be written.

use std::fmt;

/// A field value that does not follow draft 11 (or RFC 9110, for `Retry-After`), or a value
/// that a field cannot carry.
///
/// [`headers::Header::decode`] can only answer the `headers` crate's opaque error; the
/// `parse` functions of each type answer this one, which says what was wrong.
///
/// ```
/// use tollgate::headers::RateLimitHeader;
///
/// let error = RateLimitHeader::parse(b"\"per-second\";t=1").unwrap_err();
/// assert!(error.to_string().contains("`r`"), "{error}");
/// let error = RateLimitHeader::parse(b"\"per-second\";r=1,").unwrap_err();
/// assert!(error.to_string().contains("trailing"), "{error}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidField {
    what: String,
}

impl InvalidField {
    /// A value that is not a Structured Field list, with the byte offset where it stopped.
    pub(crate) fn syntax(what: &str, at: usize) -> Self {
        Self {
            what: format!("not a Structured Field list: {what} at byte {at}"),
        }
    }

    /// A list, or a value, of the wrong shape.
    pub(crate) fn shape(what: impl Into<String>) -> Self {
        Self { what: what.into() }
    }
}

impl fmt::Display for InvalidField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for InvalidField {}
