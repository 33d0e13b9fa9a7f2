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

/// Parses an HTTP/1.1 response read to the end of a closed connection.
pub fn parse_response(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = std::str::from_utf8(&raw[..split]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let code = status_line
        .strip_prefix("HTTP/1.1 ")
        .expect("HTTP/1.1 status line");
    let status = StatusCode::from_bytes(&code.as_bytes()[..3]).unwrap();
    let mut headers = http::HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').expect("name: value");
        headers.append(
            http::HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
            http::HeaderValue::from_str(value.trim()).unwrap(),
        );
    }
    let rest = &raw[split + 4..];
    let chunked = headers
        .get(http::header::TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let body = if chunked {
        dechunk(rest)
    } else if let Some(length) = headers.get(http::header::CONTENT_LENGTH) {
        let length: usize = length.to_str().unwrap().parse().unwrap();
        rest[..length].to_vec()
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body: body.into(),
        extensions: http::Extensions::new(),
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size_text = std::str::from_utf8(&data[..line_end]).unwrap();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Writes `request` over a fresh connection from `source` and reads until the server
/// closes it.
pub async fn exchange(
    server: std::net::SocketAddr,
    source: std::net::IpAddr,
    request: &str,
) -> Vec<u8> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(source, 0)).unwrap();
    let stream = socket.connect(server).await.unwrap();
    // tokio's io-util is not a dev-dependency: write and read with the readiness API.
    let mut unsent = request.as_bytes();
    while !unsent.is_empty() {
        stream.writable().await.unwrap();
        match stream.try_write(unsent) {
            Ok(n) => unsent = &unsent[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("write: {e}"),
        }
    }
    let mut raw = Vec::new();
    let mut buf = [0; 4096];
    loop {
        stream.readable().await.unwrap();
        match stream.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // A connection the server drops without an answer reads as what came before.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    raw
}
