//! Short byte strings held inline, longer ones in one heap block: a caller's key, extracted
//! per request and tracked per caller, usually costs no allocation.

/// Up to `N` bytes inline, more in one heap block.
///
/// `N` is chosen by the holder: the per-request key keeps a UUID or a digest inline (38,
/// so the key takes 40 bytes); the in-process store, which holds one per tracked caller,
/// keeps 22, as small as the boxed form.
#[derive(Clone)]
pub(crate) enum InlineBytes<const N: usize> {
    Inline { len: u8, bytes: [u8; N] },
    Boxed(Box<[u8]>),
}

impl<const N: usize> InlineBytes<N> {
    /// `head` followed by `tail`, copied once.
    pub(crate) fn concat(head: &[u8], tail: &[u8]) -> Self {
        let len = head.len() + tail.len();
        // N stays far below u8::MAX for every holder.
        if len <= N && N <= usize::from(u8::MAX) {
            let mut bytes = [0; N];
            bytes[..head.len()].copy_from_slice(head);
            bytes[head.len()..len].copy_from_slice(tail);
            InlineBytes::Inline {
                len: len as u8,
                bytes,
            }
        } else {
            let mut boxed = Vec::with_capacity(len);
            boxed.extend_from_slice(head);
            boxed.extend_from_slice(tail);
            InlineBytes::Boxed(boxed.into_boxed_slice())
        }
    }

    /// A copy of `bytes`.
    pub(crate) fn new(bytes: &[u8]) -> Self {
        Self::concat(bytes, &[])
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            InlineBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            InlineBytes::Boxed(bytes) => bytes,
        }
    }

    /// Whether the bytes live in the holder, without a heap block.
    #[cfg(test)]
    pub(crate) fn is_inline(&self) -> bool {
        matches!(self, InlineBytes::Inline { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_n_bytes_stay_inline_and_more_take_a_block() {
        let at_bound = InlineBytes::<4>::concat(b"=", b"abc");
        assert!(at_bound.is_inline());
        assert_eq!(at_bound.as_bytes(), b"=abc");
        let over = InlineBytes::<4>::concat(b"=", b"abcd");
        assert!(!over.is_inline());
        assert_eq!(over.as_bytes(), b"=abcd");
        assert_eq!(InlineBytes::<4>::new(b"").as_bytes(), b"");
        assert_eq!(over.clone().as_bytes(), over.as_bytes());
    }

    #[test]
    fn the_holders_sizes_are_what_they_were_chosen_for() {
        assert_eq!(size_of::<InlineBytes<38>>(), 40);
        assert_eq!(size_of::<InlineBytes<22>>(), 24);
    }
}
