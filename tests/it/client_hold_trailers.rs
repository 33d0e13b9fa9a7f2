//! `HoldBackLayer` on a tonic channel, against a tonic server whose refusal ends a normal
//! gRPC response: a message, then trailers carrying the status and
//! `grpc-retry-pushback-ms` (tollgate's own refusals are Trailers-Only; servers that refuse
//! mid-stream, or after sending headers, answer like this). The hold starts when the
//! client reads the trailers.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tokio::net::TcpListener;
use tollgate::client::{HoldBackLayer, HoldReason, NotSent};
use tollgate::store::ManualClock;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::tokio_stream;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tower::{Layer, Service};

const FOLLOW: &str = "/tollgate.test.Feed/Follow";

/// Messages as their bytes, so that neither end needs protobuf.
#[derive(Clone, Copy, Debug, Default)]
struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> BytesCodec {
        BytesCodec
    }

    fn decoder(&mut self) -> BytesCodec {
        BytesCodec
    }
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// A server-streaming method that sends one message and then refuses with
/// RESOURCE_EXHAUSTED and `pushback` as `grpc-retry-pushback-ms`: tonic writes both into
/// the trailers.
#[derive(Clone)]
struct RefusesAfterOneMessage {
    pushback: &'static str,
}

impl NamedService for RefusesAfterOneMessage {
    const NAME: &'static str = "tollgate.test.Feed";
}

impl Service<http::Request<tonic::body::Body>> for RefusesAfterOneMessage {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let pushback = self.pushback;
        let follow = tower::service_fn(move |_: tonic::Request<Bytes>| async move {
            let mut metadata = MetadataMap::new();
            metadata.insert("grpc-retry-pushback-ms", pushback.parse().unwrap());
            let refusal = Status::with_metadata(Code::ResourceExhausted, "over quota", metadata);
            let answers = vec![Ok(Bytes::from_static(b"first")), Err(refusal)];
            Ok::<_, Status>(tonic::Response::new(tokio_stream::iter(answers)))
        });
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(BytesCodec);
            Ok(grpc.server_streaming(follow, request).await)
        })
    }
}

/// The server's address, and a tonic client whose calls go through `layer`. The client
/// names the server in each request's URI, so the layer's default partition is its
/// authority.
async fn serve_and_connect(
    pushback: &'static str,
    layer: &HoldBackLayer,
) -> (
    String,
    tonic::client::Grpc<tollgate::client::HoldBack<Channel>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        Server::builder()
            .add_service(RefusesAfterOneMessage { pushback })
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let origin: http::Uri = format!("http://{authority}").parse().unwrap();
    let channel = Channel::builder(origin.clone()).connect().await.unwrap();
    let client = tonic::client::Grpc::with_origin(layer.layer(channel), origin);
    (authority, client)
}

async fn follow(
    client: &mut tonic::client::Grpc<tollgate::client::HoldBack<Channel>>,
) -> Result<tonic::codec::Streaming<Bytes>, Status> {
    client
        .ready()
        .await
        .map_err(|e| Status::unknown(e.to_string()))?;
    let request = tonic::Request::new(Bytes::new());
    client
        .server_streaming(request, PathAndQuery::from_static(FOLLOW), BytesCodec)
        .await
        .map(tonic::Response::into_inner)
}

fn held_back(status: &Status) -> Option<&NotSent> {
    std::error::Error::source(status)?.downcast_ref()
}

#[tokio::test]
async fn regression_pushback_in_the_trailers_holds_the_server_from_when_they_arrive() {
    let clock = ManualClock::new(1_800_000_000_000);
    let layer = HoldBackLayer::new().clock(clock.clone());
    let (authority, mut client) = serve_and_connect("1500", &layer).await;

    let mut answers = follow(&mut client).await.expect("a normal response");
    assert_eq!(
        answers.message().await.unwrap().as_deref(),
        Some(&b"first"[..])
    );
    // The status, and the pushback, are still to come.
    assert_eq!(layer.held_for(&authority), None);

    clock.advance(Duration::from_millis(300));
    let refusal = answers.message().await.unwrap_err();
    assert_eq!(refusal.code(), Code::ResourceExhausted);
    // Held from when the trailers arrived.
    assert_eq!(
        layer.held_for(&authority),
        Some(Duration::from_millis(1_500))
    );
    assert_eq!(
        layer.hold_reason(&authority),
        Some(HoldReason::GrpcPushback)
    );

    let held = follow(&mut client).await.unwrap_err();
    let not_sent = held_back(&held).unwrap_or_else(|| panic!("sent: {held:?}"));
    assert_eq!(not_sent.partition(), Some(authority.as_str()));
    assert_eq!(not_sent.retry_after(), Some(Duration::from_millis(1_500)));

    clock.advance(Duration::from_millis(1_500));
    let mut answers = follow(&mut client)
        .await
        .expect("sent once the hold is over");
    assert!(answers.message().await.unwrap().is_some());
}

#[tokio::test]
async fn regression_do_not_retry_in_the_trailers_holds_the_server_for_max_hold() {
    let clock = ManualClock::new(1_800_000_000_000);
    let layer = HoldBackLayer::new()
        .clock(clock.clone())
        .max_hold(Duration::from_secs(600));
    let (authority, mut client) = serve_and_connect("-1", &layer).await;

    let mut answers = follow(&mut client).await.expect("a normal response");
    answers.message().await.unwrap();
    assert_eq!(
        answers.message().await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert_eq!(layer.held_for(&authority), Some(Duration::from_secs(600)));

    let held = follow(&mut client).await.unwrap_err();
    assert!(held_back(&held).is_some(), "sent: {held:?}");
}
