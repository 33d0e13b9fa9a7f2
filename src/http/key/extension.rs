use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::Request;

use super::{Extracted, KeyExtractor};
use crate::store::caller::Caller;

/// Counts callers by a value that earlier middleware put in the request's extensions, such
/// as the authenticated principal.
///
/// The value is turned into a [`Caller`] with `Into`, so an auth layer can insert its own
/// type and implement `From<&Principal> for Caller` to choose the key (and the plan tier).
/// A request without the extension has no key (see [`MissingKey`](crate::key::MissingKey)); the
/// first such request logs one warning (per extractor and its clones) naming the usual
/// cause: the middleware that inserts the extension runs inside the rate-limit layer
/// instead of outside it. In axum, a layer added later wraps the ones added before, so add
/// the authentication layer after the rate-limit layer.
///
/// ```
/// use tollgate::{Caller, key::ExtensionKey};
///
/// #[derive(Clone)]
/// struct Principal { account: String, plan: &'static str }
///
/// impl From<&Principal> for Caller {
///     fn from(p: &Principal) -> Self {
///         Caller::new(p.account.as_str()).with_tier(p.plan)
///     }
/// }
///
/// let by_principal = ExtensionKey::<Principal>::new();
/// # drop(by_principal);
/// ```
pub struct ExtensionKey<T> {
    /// Set once a request without the extension has been reported; shared by clones.
    warned_missing: Arc<AtomicBool>,
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
    for<'a> &'a T: Into<Caller>,
{
    /// Keys on the extension of type `T`.
    pub fn new() -> Self {
        Self {
            warned_missing: Arc::new(AtomicBool::new(false)),
            _marker: PhantomData,
        }
    }
}

impl<T> Default for ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
    for<'a> &'a T: Into<Caller>,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        Self {
            warned_missing: self.warned_missing.clone(),
            _marker: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> KeyExtractor for ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
    for<'a> &'a T: Into<Caller>,
{
    fn extract<B>(&self, request: &Request<B>) -> Extracted {
        match request.extensions().get::<T>() {
            Some(value) => Extracted::Caller(value.into()),
            None => {
                if !self.warned_missing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        extension = std::any::type_name::<T>(),
                        "a request reached the rate-limit layer without the extension its \
                         ExtensionKey reads, so it has no key. The likely cause: the \
                         middleware that inserts it (authentication) sits inside the \
                         rate-limit layer, but must run before the rate-limit layer (in axum, \
                         add that layer after the rate-limit layer, so that it wraps it)"
                    );
                }
                Extracted::NoKey
            }
        }
    }
}
