//! The identity a request is counted under.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::store::inline_bytes::InlineBytes;

// The first byte of the encoded form says what follows, so that a raw key can never
// equal a digest or the anonymous bucket, whatever bytes the caller sends.
const TAG_RAW: u8 = b'=';
const TAG_DIGEST: u8 = b'#';
const TAG_ANONYMOUS: u8 = b'?';

/// The key a caller is counted under: any bytes, bounded in length.
///
/// Keys come from untrusted input, so a key accepts any bytes (not only UTF-8) and a key
/// longer than [`MAX_KEY_BYTES`](CallerKey::MAX_KEY_BYTES) is stored as its SHA-256 digest. Distinct inputs stay
/// distinct: `acme` and `acme}` are two keys, and no raw key can collide with a digest or
/// with [`CallerKey::anonymous`].
///
/// Keys of up to 37 bytes (a UUID, an API key, a digest) are held inline: making or
/// cloning one costs no allocation. Longer ones take one heap block.
///
/// ```
/// use tollgate::store::CallerKey;
///
/// let acme = CallerKey::new("acme");
/// assert_ne!(acme, CallerKey::new("acme}"));
/// assert!(!acme.is_digest());
///
/// let long = CallerKey::new(vec![b'x'; 10_000]);
/// assert!(long.is_digest());
/// assert!(long.encoded().len() <= 1 + tollgate::store::CallerKey::MAX_KEY_BYTES);
/// ```
#[derive(Clone)]
pub struct CallerKey {
    encoded: Encoded,
}

/// Encoded keys up to this many bytes are held inline: a key extracted per request then
/// costs no allocation. 38 keeps a key as small as 40 bytes.
const INLINE_BYTES: usize = 38;

type Encoded = InlineBytes<INLINE_BYTES>;

// Keys compare, hash and order by their encoded bytes, however they are held.
impl PartialEq for CallerKey {
    fn eq(&self, other: &Self) -> bool {
        self.encoded() == other.encoded()
    }
}

impl Eq for CallerKey {}

impl Hash for CallerKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.encoded().hash(state);
    }
}

impl PartialOrd for CallerKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CallerKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.encoded().cmp(other.encoded())
    }
}

impl CallerKey {
    /// The longest key kept as given, in bytes: a longer one is kept as its SHA-256
    /// digest, so a caller's storage stays bounded whatever the client sends.
    pub const MAX_KEY_BYTES: usize = 128;

    /// A key from any bytes; keys over [`MAX_KEY_BYTES`](Self::MAX_KEY_BYTES) are hashed.
    #[inline]
    pub fn new(key: impl AsRef<[u8]>) -> Self {
        let key = key.as_ref();
        if key.len() > Self::MAX_KEY_BYTES {
            return Self::digest_of(key);
        }
        Self {
            encoded: Encoded::concat(&[TAG_RAW], key),
        }
    }

    /// A key too long to keep as given, kept as its digest: rare, and kept out of the
    /// code a request's key is made with.
    #[cold]
    #[inline(never)]
    fn digest_of(key: &[u8]) -> Self {
        Self {
            encoded: Encoded::concat(&[TAG_DIGEST], &Sha256::digest(key)),
        }
    }

    /// The one shared bucket for requests that carry no key, when the layer is told to
    /// count them together. It never equals a key made with [`CallerKey::new`].
    ///
    /// ```
    /// use tollgate::store::CallerKey;
    /// assert_ne!(CallerKey::anonymous(), CallerKey::new("anonymous"));
    /// ```
    pub fn anonymous() -> Self {
        Self {
            encoded: Encoded::concat(&[TAG_ANONYMOUS], &[]),
        }
    }

    /// The unambiguous byte form that stores use to name this caller's counters: one tag
    /// byte, then either the raw key or its 32-byte digest.
    ///
    /// ```
    /// use tollgate::store::CallerKey;
    /// assert_eq!(CallerKey::new("acme").encoded(), b"=acme");
    /// ```
    pub fn encoded(&self) -> &[u8] {
        self.encoded.as_bytes()
    }

    /// Whether the key was longer than [`MAX_KEY_BYTES`](Self::MAX_KEY_BYTES) and is kept as its digest.
    ///
    /// ```
    /// use tollgate::store::CallerKey;
    /// assert!(!CallerKey::new("acme").is_digest());
    /// ```
    pub fn is_digest(&self) -> bool {
        self.encoded().first() == Some(&TAG_DIGEST)
    }

    /// Whether this is the shared bucket for requests without a key.
    ///
    /// ```
    /// use tollgate::store::CallerKey;
    /// assert!(CallerKey::anonymous().is_anonymous());
    /// ```
    pub fn is_anonymous(&self) -> bool {
        self.encoded().first() == Some(&TAG_ANONYMOUS)
    }
}

impl fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerKey({self})")
    }
}

/// Shows the key with non-printable bytes escaped; digests as `sha256:<hex>`.
impl fmt::Display for CallerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (tag, rest) = self
            .encoded()
            .split_first()
            .unwrap_or((&TAG_ANONYMOUS, &[]));
        match *tag {
            TAG_DIGEST => {
                f.write_str("sha256:")?;
                rest.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
            TAG_ANONYMOUS => f.write_str("<anonymous>"),
            _ => write!(f, "{}", rest.escape_ascii()),
        }
    }
}

impl From<&str> for CallerKey {
    #[inline]
    fn from(key: &str) -> Self {
        Self::new(key)
    }
}

impl From<&[u8]> for CallerKey {
    #[inline]
    fn from(key: &[u8]) -> Self {
        Self::new(key)
    }
}

impl<const N: usize> From<&[u8; N]> for CallerKey {
    #[inline]
    fn from(key: &[u8; N]) -> Self {
        Self::new(key)
    }
}

impl From<Vec<u8>> for CallerKey {
    #[inline]
    fn from(key: Vec<u8>) -> Self {
        Self::new(key)
    }
}

impl From<String> for CallerKey {
    #[inline]
    fn from(key: String) -> Self {
        Self::new(key)
    }
}

/// A caller as a key extractor found it: the key its counters live under and, optionally,
/// the plan tier that chooses its quotas.
///
/// ```
/// use tollgate::Caller;
/// use tollgate::store::CallerKey;
///
/// let caller = Caller::new("acme").with_tier("enterprise");
/// assert_eq!(caller.key(), &CallerKey::new("acme"));
/// assert_eq!(caller.tier(), Some("enterprise"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    key: CallerKey,
    tier: Option<Arc<str>>,
    /// Quotas of its own, by policy name, in the order given.
    quotas: Option<OwnQuotas>,
    /// The budgets it belongs to, innermost first.
    levels: Option<Budgets>,
}

/// The nested budgets a caller belongs to: (level, key), innermost first.
type Budgets = Arc<[(Arc<str>, CallerKey)]>;

/// A caller's own quotas: policy names and quotas, in the order given.
pub(crate) type OwnQuotas = Arc<[(Arc<str>, u64)]>;

impl Caller {
    /// A caller with the default quotas.
    pub fn new(key: impl Into<CallerKey>) -> Self {
        Self {
            key: key.into(),
            tier: None,
            quotas: None,
            levels: None,
        }
    }

    /// Puts the caller on a plan tier; the limiter applies that tier's policies.
    pub fn with_tier(mut self, tier: impl Into<Arc<str>>) -> Self {
        self.tier = Some(tier.into());
        self
    }

    /// Gives the caller a quota of its own for the policy named `policy` (of the default
    /// set, or of its tier's): `quota` units in that policy's window, whatever the policy
    /// says, for a plan read at request time (a JWT claim, a contract in a database).
    ///
    /// The count is kept: the quota's units, the window and the algorithm have not
    /// changed, so a raised quota grants the difference at once and a lowered one refuses
    /// until the count falls under it. A token bucket's rate becomes `quota` a period and
    /// its burst is scaled alike. The quota is advertised in the RateLimit fields, divided
    /// by a local share like any other, and counted by both stores (the Redis script takes
    /// each call's quotas). A name that no policy of the caller's set has changes nothing;
    /// 0 is taken as 1 (refuse a caller outright with a key rejection instead). Several
    /// calls give several policies their quotas; a later one for the same name wins.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-minute", Quota::per_minute(100)))
    ///     .build();
    /// // acme's contract says 250 a minute.
    /// let acme = Caller::new("acme").with_quota("per-minute", 250);
    /// let decision = limiter.check(&acme).await;
    /// assert_eq!(decision.info().unwrap().policies().next().unwrap().quota(), 250);
    /// assert_eq!(decision.info().unwrap().min_remaining(), Some(249));
    /// # }
    /// ```
    pub fn with_quota(mut self, policy: impl Into<Arc<str>>, quota: u64) -> Self {
        let policy = policy.into();
        let mut quotas: Vec<(Arc<str>, u64)> = self
            .quotas
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|(name, _)| *name != policy)
            .cloned()
            .collect();
        quotas.push((policy, quota));
        self.quotas = Some(quotas.into());
        self
    }

    /// The caller's own quotas, by policy name (see [`with_quota`](Self::with_quota)).
    ///
    /// ```
    /// use tollgate::Caller;
    /// let acme = Caller::new("acme").with_quota("per-minute", 250).with_quota("per-day", 9_000);
    /// assert_eq!(acme.quotas().collect::<Vec<_>>(), [("per-minute", 250), ("per-day", 9_000)]);
    /// ```
    pub fn quotas(&self) -> impl Iterator<Item = (&str, u64)> {
        self.quotas
            .iter()
            .flat_map(|quotas| quotas.iter().map(|(name, quota)| (&**name, *quota)))
    }

    /// Makes the caller a member of a nested budget: the budget `key` at `level` (a team,
    /// an organisation), whose policies the limiter declares with
    /// [`LimiterBuilder::level`](crate::LimiterBuilder::level). Call it from the innermost
    /// level out (the team, then the organisation). A request is then decided against the
    /// caller's own policies and every level's at once, all or nothing: admitted only if
    /// every level admits it, and a refusal consumes nothing at any level. In one store
    /// call: every counter of a budget lives under the outermost level's key (on Redis, its
    /// hash tag), so the organisation is the unit a Redis Cluster places on a node. A level
    /// the limiter has no policies for is counted for nothing. The RateLimit fields name
    /// each level's policies `<level>:<name>`, and a refusal names the level's that refused.
    ///
    /// ```
    /// use tollgate::{Caller, Limiter, Policy, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::sliding_window("per-second", Quota::per_second(3)))
    ///     .level("org", [Policy::sliding_window("per-second", Quota::per_second(4))])
    ///     .build();
    /// let alice = Caller::new("alice").within("org", "acme");
    /// let bob = Caller::new("bob").within("org", "acme");
    /// for _ in 0..3 {
    ///     assert!(limiter.check(&alice).await.is_allowed());
    /// }
    /// // alice has used her 3; bob gets the org's 4th, then the org is out.
    /// assert!(limiter.check(&bob).await.is_allowed());
    /// let refused = limiter.check(&bob).await;
    /// let refusing: Vec<_> = refused.info().unwrap().violated().map(|p| p.name()).collect();
    /// assert_eq!(refusing, ["org:per-second"]);
    /// # }
    /// ```
    pub fn within(mut self, level: impl Into<Arc<str>>, key: impl Into<CallerKey>) -> Self {
        let mut levels: Vec<(Arc<str>, CallerKey)> =
            self.levels.as_deref().unwrap_or_default().to_vec();
        levels.push((level.into(), key.into()));
        self.levels = Some(levels.into());
        self
    }

    /// The budgets the caller belongs to, innermost first (see [`within`](Self::within)).
    ///
    /// ```
    /// use tollgate::Caller;
    /// let alice = Caller::new("alice").within("team", "sync").within("org", "acme");
    /// let levels: Vec<_> = alice.levels().map(|(level, key)| (level, key.to_string())).collect();
    /// assert_eq!(levels, [("team", "sync".to_owned()), ("org", "acme".to_owned())]);
    /// ```
    pub fn levels(&self) -> impl Iterator<Item = (&str, &CallerKey)> {
        self.levels
            .iter()
            .flat_map(|levels| levels.iter().map(|(level, key)| (&**level, key)))
    }

    /// The caller whose key a nested budget's counters live under: the outermost level's,
    /// with nothing else; `None` for a caller in no budget.
    pub(crate) fn counted_under(&self) -> Option<Caller> {
        let (_, outermost) = self.levels.as_deref()?.last()?;
        Some(Caller::new(outermost.clone()))
    }

    /// The caller's own quotas as kept, for the limiter (`None`: it has none).
    pub(crate) fn own_quotas(&self) -> Option<&OwnQuotas> {
        self.quotas.as_ref()
    }

    /// The key the caller's counters live under.
    pub fn key(&self) -> &CallerKey {
        &self.key
    }

    /// The caller's plan tier, if the extractor named one.
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }
}

impl From<CallerKey> for Caller {
    fn from(key: CallerKey) -> Self {
        Self::new(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_keys_never_equal_digests() {
        let long = vec![7u8; CallerKey::MAX_KEY_BYTES + 1];
        let digest = CallerKey::new(&long);
        // A raw key made of the digest's own bytes stays distinct.
        let forged = CallerKey::new(&digest.encoded()[1..]);
        assert_ne!(digest, forged);
        assert_eq!(CallerKey::new(&long), digest);
    }

    #[test]
    fn keys_at_the_bound_stay_raw() {
        let key = CallerKey::new(vec![b'a'; CallerKey::MAX_KEY_BYTES]);
        assert!(!key.is_digest());
        assert_eq!(key.encoded().len(), CallerKey::MAX_KEY_BYTES + 1);
    }

    #[test]
    fn short_and_long_keys_are_held_apart_but_compare_by_bytes() {
        let short = CallerKey::new("acme");
        assert!(short.encoded.is_inline());
        let uuid = CallerKey::new("0b6f2a3e-59d4-4c1e-9a0f-3f1c2d4e5b6a");
        assert!(uuid.encoded.is_inline());
        assert!(!CallerKey::new([b'k'; 38]).encoded.is_inline());
        let long = CallerKey::new([b'k'; 64]);
        assert!(!long.encoded.is_inline());
        assert_eq!(long.encoded().len(), 65);
        assert_eq!(long.clone(), long);
        assert!(short < CallerKey::new("acmf"));
        let digest = CallerKey::new(vec![1u8; CallerKey::MAX_KEY_BYTES + 1]);
        assert!(digest.encoded.is_inline());
        assert!(digest.is_digest());
    }

    #[test]
    fn display_escapes_bytes() {
        assert_eq!(CallerKey::new(b"a\xffb").to_string(), "a\\xffb");
    }
}
