//! The response body: the inner service's, or the limiter's own problem+json.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::http::byte_meter::ByteMeter;
use crate::store::held_slot::HeldSlot;

pin_project! {
    /// The body of a response that went through the rate limit layer: either the inner
    /// service's body, untouched, or the limiter's own refusal body.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    // A slot or a meter is boxed: every response is moved several times on its way out
    // (each wrapping future, the router's own body box), and those of the usual request,
    // which holds neither, are then a third of the size.
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        Full {
            data: Option<Bytes>,
        },
        // The inner body of a request that holds an in-flight slot: freed when the body
        // ends, or when it is dropped before (a client gone away).
        Holding {
            #[pin]
            body: B,
            slot: Option<Box<HeldSlot>>,
        },
        // The inner body of a request charged the bytes it sends: settled when the body
        // ends, or when it is dropped before (a client gone away).
        Counting {
            #[pin]
            body: B,
            meter: Option<Box<ByteMeter>>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn holding(body: B, slot: HeldSlot) -> Self {
        Self {
            kind: Kind::Holding {
                body,
                slot: Some(Box::new(slot)),
            },
        }
    }

    pub(crate) fn counting(body: B, meter: ByteMeter) -> Self {
        Self {
            kind: Kind::Counting {
                body,
                meter: Some(Box::new(meter)),
            },
        }
    }

    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Holding { body, slot } => {
                let frame = ready!(body.poll_frame(cx));
                if frame.is_none() {
                    drop(slot.take());
                }
                Poll::Ready(frame)
            }
            KindProj::Counting { body, meter } => {
                let frame = ready!(body.poll_frame(cx));
                match &frame {
                    Some(Ok(frame)) => {
                        if let (Some(meter), Some(data)) = (meter.as_mut(), frame.data_ref()) {
                            meter.add(data.len());
                        }
                    }
                    // The end, or an error that ends the body: what was sent is settled.
                    _ => drop(meter.take()),
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Holding { body, .. } | Kind::Counting { body, .. } => {
                body.is_end_stream()
            }
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Holding { body, .. } | Kind::Counting { body, .. } => {
                body.size_hint()
            }
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
