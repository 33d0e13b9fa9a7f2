//! Load shedding by concurrency: a layer that needs no store.
//!
//! When more requests are in flight through the layer than it allows, a new one is
//! answered at once with 503, `Retry-After` and the temporary-reduced-capacity problem,
//! instead of queueing behind the others. Requests may be put in priority classes by
//! predicates on their head: the lower classes are shed first, and the critical class
//! keeps a reserved share of the slots (see
//! [`ConcurrencyShedLayer`'s priority classes](ConcurrencyShedLayer#priority-classes)).

pub(crate) mod future;
mod layer;
mod service;
mod slot;

pub use layer::ConcurrencyShedLayer;
pub use service::ConcurrencyShed;
