//! The fields of draft 11 as typed values; see the crate's `headers` module.

pub(crate) mod error;
pub(crate) mod format;
mod list;
pub(crate) mod policy;
pub(crate) mod retry_after;
pub(crate) mod single_limit;
pub(crate) mod state;

#[cfg(test)]
mod tests;
