//! Honouring what servers say about their limits: holds per partition, read from each
//! response, that keep calls local until the server's wait is over.

mod config;
mod layer;
mod service;
mod signals;
mod state;
mod table;
mod wait;

#[cfg(test)]
mod tests;

pub use layer::HoldBackLayer;
pub use service::HoldBack;
pub(super) use state::Shared as Holds;
pub(super) use wait::Wait;
