//! Honouring what servers say about their limits: holds per partition, read from each
//! response, that keep calls local until the server's wait is over.

mod config;
mod future;
mod layer;
mod service;
mod signals;
mod state;

#[cfg(test)]
mod tests;

pub use future::HoldBackFuture;
pub use layer::HoldBackLayer;
pub use service::HoldBack;
