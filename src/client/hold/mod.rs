//! Honouring what servers say about their limits: holds per partition, read from each
//! response (its headers, then its trailers), that keep calls local until the server's wait
//! is over.

mod body;
mod config;
mod future;
mod layer;
mod service;
mod signals;
mod state;
mod table;
mod wait;

#[cfg(test)]
mod tests;

pub use body::HoldBackBody;
pub use future::HoldBackFuture;
pub use layer::HoldBackLayer;
pub use service::HoldBack;
