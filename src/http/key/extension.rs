use std::fmt;
use std::future::{Ready, ready};
use std::marker::PhantomData;

use http::Request;

use super::{KeyExtractor, KeyResult};
use crate::store::caller::Caller;

/// Counts callers by a value that earlier middleware put in the request's extensions, such
/// as the authenticated principal.
///
/// The value is turned into a [`Caller`] with `Into`, so an auth layer can insert its own
/// type and implement `From<&Principal> for Caller` to choose the key (and the plan tier).
/// A request without the extension has no key.
///
/// ```
/// use tollgate::{Caller, ExtensionKey};
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
    type Future = Ready<KeyResult>;

    fn extract<B>(&self, request: &Request<B>) -> Self::Future {
        ready(Ok(request.extensions().get::<T>().map(Into::into)))
    }

    fn extract_now<B>(&self, request: &Request<B>) -> Option<KeyResult> {
        Some(self.extract(request).into_inner())
    }
}
