//! The HTTP floor: the layer and its service, the response future and body, who is
//! calling (key extraction), and what a response says (headers and refusals).
//!
//! In the order a request meets them: [`layer`] builds the [`service`], which extracts the
//! caller's [`key`] and asks the limiter; the [`future`] waits for the decision, then either
//! calls the inner service and adds the [`headers`] to its response, or answers with a
//! [`refusal`], which [`response`] writes as HTTP and [`grpc`] as a gRPC status.

pub(crate) mod body;
pub(crate) mod body_cost;
pub(crate) mod body_shape;
pub(crate) mod byte_meter;
pub(crate) mod config;
pub(crate) mod field_forms;
pub(crate) mod future;
pub(crate) mod grpc;
pub(crate) mod headers;
pub(crate) mod key;
pub(crate) mod layer;
pub(crate) mod problem_type;
pub(crate) mod refusal;
pub(crate) mod render;
pub(crate) mod response;
pub(crate) mod service;
pub(crate) mod typed_headers;
