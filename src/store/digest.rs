//! A keyed digest of a caller key: HMAC-SHA-256 under a secret, truncated to 128 bits, the
//! same on every instance given the same secret. It names callers where the key itself must
//! not appear: Redis key names and the `pk` parameter of the RateLimit fields.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The length of a digest, in bytes: 128 bits keep distinct callers apart.
pub(crate) const DIGEST_LEN: usize = 16;

/// HMAC-SHA-256 (RFC 2104) under a secret, truncated to [`DIGEST_LEN`] bytes.
#[derive(Clone)]
pub(crate) struct KeyedDigest {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for KeyedDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.write_str("KeyedDigest(..)")
    }
}

impl KeyedDigest {
    pub(crate) fn new(secret: &[u8]) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
        }
    }

    /// The digest of `bytes`.
    pub(crate) fn of(&self, bytes: &[u8]) -> [u8; DIGEST_LEN] {
        let mut mac = self.mac.clone();
        mac.update(bytes);
        let full = mac.finalize().into_bytes();
        let mut digest = [0u8; DIGEST_LEN];
        digest.copy_from_slice(&full[..DIGEST_LEN]);
        digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // RFC 4231, test cases 2 and 6 (a key longer than the block), truncated to 128 bits.
    #[test]
    fn digests_are_hmac_sha256() {
        let digest = KeyedDigest::new(b"Jefe").of(b"what do ya want for nothing?");
        assert_eq!(hex(&digest), "5bdcc146bf60754e6a042426089575c7");
        let digest = KeyedDigest::new(&[0xaa; 131])
            .of(b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(hex(&digest), "60e431591ee0b67f0d8a26aacbf5b77f");
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let key = KeyedDigest::new(b"hunter2");
        assert_eq!(format!("{key:?}"), "KeyedDigest(..)");
    }
}
