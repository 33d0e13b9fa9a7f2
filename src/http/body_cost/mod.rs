//! The body-cost layer: a request's cost read from a bounded buffer of its body before the
//! rate limit decides (documented at its public path, `tollgate::cost`).

mod body;
mod estimate;
mod layer;
mod service;

pub use body::PrefixedBody;
pub use estimate::RequestCost;
pub use layer::BodyCostLayer;
pub use service::BodyCost;
