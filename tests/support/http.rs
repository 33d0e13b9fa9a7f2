//! Driving a service with requests and reading responses back as structured data.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

/// A response read to the end.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub extensions: http::Extensions,
}

impl Reply {
    /// The body parsed as JSON (problem+json refusals).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("body is JSON")
    }

    /// A header parsed as a Structured Fields List, its field lines combined as RFC 9651
    /// says (joined with commas).
    pub fn sf_list(&self, name: &str) -> Option<sfv::List> {
        let lines: Vec<&[u8]> = self
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        if lines.is_empty() {
            return None;
        }
        let combined = lines.join(&b", "[..]);
        Some(
            sfv::Parser::new(&combined)
                .parse::<sfv::List>()
                .unwrap_or_else(|e| panic!("{name} is not a Structured Fields List: {e}")),
        )
    }

    /// Per policy name, the integer parameters of a RateLimit or RateLimit-Policy header.
    pub fn policy_params(&self, name: &str) -> Vec<(String, Vec<(String, i64)>)> {
        let Some(list) = self.sf_list(name) else {
            return Vec::new();
        };
        list.iter()
            .map(|entry| match entry {
                sfv::ListEntry::Item(item) => {
                    let policy = match &item.bare_item {
                        sfv::BareItem::String(s) => s.as_str().to_owned(),
                        other => panic!("{name}: policy name is not a String: {other:?}"),
                    };
                    let params = item
                        .params
                        .iter()
                        .map(|(k, v)| match v {
                            sfv::BareItem::Integer(i) => (k.as_str().to_owned(), i64::from(*i)),
                            other => panic!("{name}: parameter {k:?} is not an Integer: {other:?}"),
                        })
                        .collect();
                    (policy, params)
                }
                other => panic!("{name}: unexpected inner list {other:?}"),
            })
            .collect()
    }

    /// Retry-After in whole seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.headers.get(http::header::RETRY_AFTER).map(|v| {
            v.to_str()
                .unwrap()
                .parse()
                .expect("Retry-After is whole seconds")
        })
    }
}

/// Sends one request through `service` and reads the whole response.
pub async fn send<S, B>(service: &mut S, request: Request<Full<Bytes>>) -> Reply
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = service
        .ready()
        .await
        .expect("service ready")
        .call(request)
        .await
        .expect("service answered");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body read").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
        extensions: parts.extensions,
    }
}

/// A GET request for `uri` with the given headers.
pub fn get(uri: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::get(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// The inner service of most tests: always 200 "ok".
pub async fn ok_handler(
    _request: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}
