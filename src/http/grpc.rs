//! Refusals of gRPC requests: a gRPC status in a Trailers-Only response.
//!
//! A gRPC client reads an HTTP 429 or 503 as a broken transport, not as an answer. To a
//! gRPC request the layer therefore answers HTTP 200 with `content-type: application/grpc`,
//! the status in `grpc-status` and `grpc-message`, and no body: the response headers are
//! the trailers and end the stream (one HEADERS frame with END_STREAM), which is what the
//! gRPC protocol calls Trailers-Only. The RateLimit fields, Retry-After and
//! `grpc-retry-pushback-ms` travel as metadata beside the status; what they say is the
//! [refusal](super::refusal)'s, whichever protocol renders it.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::http::refusal::Refusal;

/// The `grpc-status` field name.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The `grpc-message` field name.
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// How long a client should wait before retrying, in milliseconds; gRPC clients with a
/// retry policy honour it (and do not retry at all when it is absent on a throttled call
/// and their policy says so).
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// A gRPC status code, as the protocol numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Code(u8);

impl Code {
    const CANCELLED: Code = Code(1);
    const INVALID_ARGUMENT: Code = Code(3);
    const DEADLINE_EXCEEDED: Code = Code(4);
    const NOT_FOUND: Code = Code(5);
    const PERMISSION_DENIED: Code = Code(7);
    pub(crate) const RESOURCE_EXHAUSTED: Code = Code(8);
    const FAILED_PRECONDITION: Code = Code(9);
    const ABORTED: Code = Code(10);
    const OUT_OF_RANGE: Code = Code(11);
    const UNIMPLEMENTED: Code = Code(12);
    pub(crate) const UNAVAILABLE: Code = Code(14);
    const UNAUTHENTICATED: Code = Code(16);

    /// The code a key rejection's 4xx stands for. The pairs are those of the
    /// `google.rpc.Code` table read backwards; a 4xx without a code of its own is the
    /// caller's mistake, so INVALID_ARGUMENT.
    fn of_rejection(status: StatusCode) -> Code {
        match status {
            StatusCode::UNAUTHORIZED => Code::UNAUTHENTICATED,
            StatusCode::FORBIDDEN => Code::PERMISSION_DENIED,
            StatusCode::NOT_FOUND => Code::NOT_FOUND,
            StatusCode::REQUEST_TIMEOUT => Code::DEADLINE_EXCEEDED,
            StatusCode::CONFLICT => Code::ABORTED,
            StatusCode::PRECONDITION_FAILED | StatusCode::PRECONDITION_REQUIRED => {
                Code::FAILED_PRECONDITION
            }
            StatusCode::RANGE_NOT_SATISFIABLE => Code::OUT_OF_RANGE,
            StatusCode::METHOD_NOT_ALLOWED => Code::UNIMPLEMENTED,
            StatusCode::TOO_MANY_REQUESTS => Code::RESOURCE_EXHAUSTED,
            _ if status.as_u16() == 499 => Code::CANCELLED,
            _ => Code::INVALID_ARGUMENT,
        }
    }
}

/// Whether a request is gRPC: its content-type is `application/grpc`, alone or with a
/// `+format` suffix (`application/grpc+proto`) or parameters. gRPC-Web
/// (`application/grpc-web...`) frames its trailers in the body, so it is not answered
/// this way.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return false;
    };
    let value = value.as_bytes();
    let prefix = b"application/grpc";
    value.len() >= prefix.len()
        && value[..prefix.len()].eq_ignore_ascii_case(prefix)
        && matches!(value.get(prefix.len()), None | Some(b'+' | b';' | b' '))
}

/// The gRPC envelope of a refusal: a status in a Trailers-Only response, with the pushback
/// when waiting helps.
///
/// - Limited, or a cost no quota admits: RESOURCE_EXHAUSTED; the latter carries no
///   pushback, since waiting never makes it fit (and a gRPC client whose retry policy
///   requires a pushback then does not retry).
/// - Fail closed: UNAVAILABLE, whatever HTTP status the layer gives such refusals (gRPC
///   clients retry UNAVAILABLE, after the pushback).
/// - A key rejection: the gRPC code its 4xx stands for, its detail as the message.
pub(crate) fn status_of(refusal: &Refusal<'_>) -> Response<Bytes> {
    let mut response = match refusal {
        Refusal::Limited(info) => {
            let mut message = String::from("quota exceeded:");
            for (i, policy) in info.violated().enumerate() {
                message.push_str(if i == 0 { " " } else { ", " });
                message.push_str(policy.name());
            }
            trailers_only(Code::RESOURCE_EXHAUSTED, &message)
        }
        Refusal::CostExceedsQuota { info, policy } => {
            let message = format!(
                "the request costs {} units, more than the {} that policy {} admits in a window",
                info.cost(),
                policy.quota(),
                policy.name()
            );
            trailers_only(Code::RESOURCE_EXHAUSTED, &message)
        }
        Refusal::Unavailable { .. } => trailers_only(
            Code::UNAVAILABLE,
            "temporarily reduced capacity: the rate limit cannot be checked",
        ),
        Refusal::Rejected(rejection) => {
            trailers_only(Code::of_rejection(rejection.status()), rejection.detail())
        }
    };
    // Milliseconds as the store computed them; never 0, which would invite an instant retry.
    if let Some(ms) = refusal.retry_after_ms() {
        response
            .headers_mut()
            .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    }
    response
}

/// A request refused because all of its caller's slots of the in-flight limit `policy`
/// (of `quota`) are taken: RESOURCE_EXHAUSTED, with the pushback of the HTTP refusal's
/// Retry-After.
pub(crate) fn slots_taken(policy: &str, quota: u64, retry_after_ms: u64) -> Response<Bytes> {
    let message = format!("quota exceeded: all {quota} slots of {policy} are in use");
    let mut response = trailers_only(Code::RESOURCE_EXHAUSTED, &message);
    response.headers_mut().insert(
        GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from(retry_after_ms.max(1)),
    );
    response
}

/// A request the store could not decide and the failure policy refuses: UNAVAILABLE, which
/// gRPC clients retry, after the pushback.
pub(crate) fn unavailable(retry_after_ms: u64) -> Response<Bytes> {
    let mut response = trailers_only(
        Code::UNAVAILABLE,
        "temporarily reduced capacity: the limit cannot be checked",
    );
    response.headers_mut().insert(
        GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from(retry_after_ms.max(1)),
    );
    response
}

/// HTTP 200, `application/grpc`, the status and message, and an empty body that reports
/// the end of the stream at once.
fn trailers_only(code: Code, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code.0)));
    if let Ok(message) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    response
}

/// The gRPC message encoding: UTF-8, every byte outside printable ASCII, and `%` itself,
/// written `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;

    fn with_content_type(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn grpc_content_types_are_recognised() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "Application/GRPC",
            "application/grpc; charset=utf-8",
        ] {
            assert!(is_grpc(&with_content_type(grpc)), "{grpc}");
        }
        for other in [
            "application/json",
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
            "text/plain",
        ] {
            assert!(!is_grpc(&with_content_type(other)), "{other}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn messages_are_percent_encoded_as_grpc_says() {
        assert_eq!(percent_encode("quota exceeded: a"), "quota exceeded: a");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("caf\u{e9}\n"), "caf%C3%A9%0A");
        assert_eq!(percent_encode("\u{7f}~ "), "%7F~ ");
    }

    #[test]
    fn rejections_map_to_the_matching_code() {
        let code = |status| Code::of_rejection(status).0;
        assert_eq!(code(StatusCode::BAD_REQUEST), 3);
        assert_eq!(code(StatusCode::UNAUTHORIZED), 16);
        assert_eq!(code(StatusCode::FORBIDDEN), 7);
        assert_eq!(code(StatusCode::NOT_FOUND), 5);
        assert_eq!(code(StatusCode::TOO_MANY_REQUESTS), 8);
        assert_eq!(code(StatusCode::IM_A_TEAPOT), 3);
    }

    use crate::http::body::ResponseBody;
    use crate::http::key::KeyRejection;

    #[test]
    fn a_rejection_is_trailers_only() {
        let rejection = KeyRejection::new(StatusCode::UNAUTHORIZED, "no x-api-key: 100% needed");
        let response = status_of(&Refusal::Rejected(&rejection))
            .map(ResponseBody::<http_body_util::Empty<Bytes>>::full);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(response.headers()[GRPC_STATUS], "16");
        assert_eq!(
            response.headers()[GRPC_MESSAGE],
            "no x-api-key: 100%25 needed"
        );
        assert!(response.body().is_end_stream());
        assert_eq!(response.body().size_hint().exact(), Some(0));
    }
}
