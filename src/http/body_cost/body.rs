//! The body a request goes on with once its first bytes were read: those frames again, in
//! order, then whatever the body had left.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// A request body whose first frames were read (to estimate its cost): it yields them
    /// again, unchanged and in order, then the rest of the body.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tollgate::cost::PrefixedBody;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let read = vec![http_body::Frame::data(bytes::Bytes::from_static(b"{\"max_"))];
    /// let rest = http_body_util::Full::new(bytes::Bytes::from_static(b"tokens\":5}"));
    /// let body = PrefixedBody::new(read, Some(rest));
    /// let whole = body.collect().await.unwrap().to_bytes();
    /// assert_eq!(&whole[..], b"{\"max_tokens\":5}");
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct PrefixedBody<B> {
        read: VecDeque<Frame<Bytes>>,
        #[pin]
        rest: Option<B>,
    }
}

impl<B> PrefixedBody<B> {
    /// The frames `read` from a body, then `rest` (`None`: the body had ended).
    pub fn new(read: Vec<Frame<Bytes>>, rest: Option<B>) -> Self {
        Self {
            read: read.into(),
            rest,
        }
    }
}

impl<B> Body for PrefixedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match this.rest.as_pin_mut() {
            Some(rest) => rest.poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .read
            .iter()
            .filter_map(|frame| frame.data_ref().map(|data| data.len() as u64))
            .sum();
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(read));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint
    }
}
