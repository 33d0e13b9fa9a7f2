//! Failure domains: the parts of a store that fail on their own (the masters of a Redis
//! Cluster), so that the limiter can keep one circuit breaker per part.

/// The part of a store that decides a caller, as far as failures go, and whether it is
/// connected.
///
/// A store made of parts that fail independently (a Redis Cluster's masters) tells the
/// limiter which part each caller's decisions go to, through
/// [`Backend::failure_domain`](crate::store::Backend::failure_domain); the limiter keeps
/// one circuit breaker per domain, so a dead master sends only the decisions of its own
/// slots to the failure policy. The id is small and opaque (an index the store assigns),
/// and [`Backend::failure_domain_label`](crate::store::Backend::failure_domain_label) names
/// it in metrics (a node's address, never a caller key). A store of one part has one domain,
/// [`FailureDomain::WHOLE`].
///
/// A domain is connected, connecting (its first connection is being made: a call waits
/// for it, within the limiter's store timeout), not connected (its connection was lost
/// and is being made again), or refused (no connection, and the latest attempt to make one
/// was refused). A domain that is not connected or refused is not asked at all: each
/// decision falls back at once, counted with the reason `not_connected` (`refused` for a
/// refused one), and counted by the domain's breaker as a failure, so an outage opens it
/// as usual. A call to a connecting domain that runs out of time falls back as
/// `not_connected`. A breaker opened that way
/// waits for the connection rather than for its interval: the first decision once the
/// domain is connected again goes to the store.
///
/// ```
/// use tollgate::store::FailureDomain;
///
/// let node = FailureDomain::new(3);
/// assert_eq!(node.id(), 3);
/// assert!(node.is_connected() && node.can_call());
/// assert!(!node.connecting().is_connected() && node.connecting().can_call());
/// assert!(!node.not_connected().can_call());
/// assert!(!node.refused().can_call() && node.refused().is_refused());
/// assert_eq!(FailureDomain::WHOLE.id(), 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FailureDomain {
    id: u32,
    reach: Reach,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reach {
    Connected,
    Connecting,
    NotConnected,
    Refused,
}

impl FailureDomain {
    /// The whole store as one domain, connected: the answer of a store of one part.
    pub const WHOLE: FailureDomain = FailureDomain::new(0);

    /// The domain `id`, connected.
    pub const fn new(id: u32) -> Self {
        Self {
            id,
            reach: Reach::Connected,
        }
    }

    /// The same domain, its first connection still being made: a call waits for it.
    pub const fn connecting(self) -> Self {
        Self {
            reach: Reach::Connecting,
            ..self
        }
    }

    /// The same domain, with no connection now (lost, being made again): not called.
    pub const fn not_connected(self) -> Self {
        Self {
            reach: Reach::NotConnected,
            ..self
        }
    }

    /// The same domain, with no connection now because the latest attempt to make one was
    /// refused (nothing listens there: the server was killed, or is not started): not
    /// called, as [`not_connected`](Self::not_connected), but counted with the reason
    /// `refused`.
    pub const fn refused(self) -> Self {
        Self {
            reach: Reach::Refused,
            ..self
        }
    }

    /// Whether the latest attempt to connect to this domain was refused.
    pub const fn is_refused(&self) -> bool {
        matches!(self.reach, Reach::Refused)
    }

    /// The domain's id, as the store assigned it.
    pub const fn id(&self) -> u32 {
        self.id
    }

    /// Whether the domain has a connection now.
    pub const fn is_connected(&self) -> bool {
        matches!(self.reach, Reach::Connected)
    }

    /// Whether the limiter calls the store for this domain: connected, or connecting for
    /// the first time.
    pub const fn can_call(&self) -> bool {
        !matches!(self.reach, Reach::NotConnected | Reach::Refused)
    }
}
