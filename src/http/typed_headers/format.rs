//! The one definition of the fields' format: the parameter names of draft 11, the writer
//! of their items and the buffer they are written into. The layer's responses and the
//! typed headers' `encode` both write through these functions, and the decoder reads the
//! same names.

use std::cell::RefCell;

use bytes::{BufMut, BytesMut};

/// `q`: the quota of a `RateLimit-Policy` item.
pub(crate) const QUOTA: &str = "q";
/// `qu`: the unit the quota counts (`"request"` when absent).
pub(crate) const QUOTA_UNIT: &str = "qu";
/// `w`: the window of a `RateLimit-Policy` item, in seconds.
pub(crate) const WINDOW: &str = "w";
/// `pk`: the partition key, a byte sequence.
pub(crate) const PARTITION_KEY: &str = "pk";
/// `r`: the units left of a `RateLimit` item.
pub(crate) const REMAINING: &str = "r";
/// `t`: the seconds until a `RateLimit` item's quota resets.
pub(crate) const RESET: &str = "t";

/// The largest Structured Field integer (15 digits); larger values are written as it.
pub(crate) const MAX_INTEGER: u64 = 999_999_999_999_999;

// Fields are written into one thread-local buffer and split off it, so a response's field
// shares an allocation with the fields of the responses before it instead of allocating
// its own; the buffer is replaced once the fields in it have used it up.
const FIELD_BUFFER: usize = 4096;

thread_local! {
    static FIELDS: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(FIELD_BUFFER));
}

/// Runs `write` on this thread's empty field buffer, whose contents `write` splits off.
pub(crate) fn with_field_buffer<T>(write: impl FnOnce(&mut BytesMut) -> T) -> T {
    FIELDS.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        if buffer.capacity() < FIELD_BUFFER / 4 {
            *buffer = BytesMut::with_capacity(FIELD_BUFFER);
        }
        buffer.clear();
        write(&mut buffer)
    })
}

/// Whether `value` can be written as a Structured Field string: printable ASCII only.
pub(crate) fn is_sf_string(value: &str) -> bool {
    value.bytes().all(|byte| (0x20..0x7f).contains(&byte))
}

/// The separator before every item but the first.
pub(crate) fn push_separator(out: &mut BytesMut) {
    if !out.is_empty() {
        out.put_slice(b", ");
    }
}

/// `"value"`, with `"` and `\` escaped. `value` must pass [`is_sf_string`].
pub(crate) fn push_string(out: &mut BytesMut, value: &str) {
    // Copied whole when nothing needs escaping, the usual name: a byte at a time, each
    // write reads and writes the buffer's length.
    if !value.bytes().any(|byte| byte == b'"' || byte == b'\\') {
        out.reserve(value.len() + 2);
        out.put_u8(b'"');
        out.put_slice(value.as_bytes());
        out.put_u8(b'"');
        return;
    }
    out.put_u8(b'"');
    for byte in value.bytes() {
        if byte == b'"' || byte == b'\\' {
            out.put_u8(b'\\');
        }
        out.put_u8(byte);
    }
    out.put_u8(b'"');
}

/// `;key=value`, the value capped at [`MAX_INTEGER`].
pub(crate) fn push_integer(out: &mut BytesMut, key: &str, value: u64) {
    let mut value = value.min(MAX_INTEGER);
    // The digits and `=` written back to front, then copied once.
    let mut digits = [0u8; 16];
    let mut start = digits.len();
    loop {
        start -= 1;
        // value % 10 < 10
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    start -= 1;
    digits[start] = b'=';
    out.reserve(1 + key.len() + digits.len() - start);
    out.put_u8(b';');
    out.put_slice(key.as_bytes());
    out.put_slice(&digits[start..]);
}

/// `;key="value"`. `value` must pass [`is_sf_string`].
pub(crate) fn push_string_param(out: &mut BytesMut, key: &str, value: &str) {
    push_key(out, key);
    push_string(out, value);
}

/// `;key=:base64:`.
pub(crate) fn push_bytes(out: &mut BytesMut, key: &str, bytes: &[u8]) {
    push_key(out, key);
    out.put_u8(b':');
    push_base64(out, bytes);
    out.put_u8(b':');
}

fn push_key(out: &mut BytesMut, key: &str) {
    out.put_u8(b';');
    out.put_slice(key.as_bytes());
    out.put_u8(b'=');
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64 with padding, as a Structured Field byte sequence holds them.
fn push_base64(out: &mut BytesMut, bytes: &[u8]) {
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        let sextet = |shift: u32| BASE64[((n >> shift) & 0x3f) as usize];
        out.put_slice(&[sextet(18), sextet(12)]);
        out.put_u8(if chunk.len() > 1 { sextet(6) } else { b'=' });
        out.put_u8(if chunk.len() > 2 { sextet(0) } else { b'=' });
    }
}
