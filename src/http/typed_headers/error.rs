//! Why a field did not decode.

use std::fmt;

/// A field value that does not follow draft 11 (or RFC 9110, for `Retry-After`), and what
/// was wrong with it.
///
/// The public functions answer the `headers` crate's opaque [`headers::Error`], as
/// [`headers::Header::decode`] must; the reason goes to a debug-level `tracing` event
/// ([`into_header_error`](Self::into_header_error)), for whoever is looking into why a
/// server's field is not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InvalidField {
    what: String,
}

impl InvalidField {
    /// A value that is not a Structured Field list, as sfv found it: what was wrong, and the
    /// byte offset where it stopped.
    pub(crate) fn syntax(error: &sfv::Error) -> Self {
        let what = match error.index() {
            Some(at) => format!("not a Structured Field list: {error:#} at byte {at}"),
            None => format!("not a Structured Field list: {error:#}"),
        };
        Self { what }
    }

    /// A list, or a value, of the wrong shape.
    pub(crate) fn shape(what: impl Into<String>) -> Self {
        Self { what: what.into() }
    }

    /// The error the public functions answer, once the reason is logged against `field`.
    pub(crate) fn into_header_error(self, field: &'static str) -> headers::Error {
        tracing::debug!(field, reason = %self, "field value did not decode");
        headers::Error::invalid()
    }
}

impl fmt::Display for InvalidField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for InvalidField {}
