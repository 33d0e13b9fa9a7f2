//! The counts of requests in flight, the class of each request, and the slot each admitted
//! request holds.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use http::request::Parts;
use http::{Request, Response};
use metrics::{Key, Label, Level, Metadata, Unit};

use crate::http::body::ResponseBody;
use crate::http::response;

/// Counted each time the layer sheds a request, labelled `layer` and `class`.
const SHED_TOTAL: &str = "tollgate_shed_total";
/// Requests in flight through the layer, labelled `layer`.
const IN_FLIGHT: &str = "tollgate_in_flight";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// A predicate on a request's head that puts it in a class.
pub(super) type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// A request's priority class, most important first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Critical,
    Normal,
    Sheddable,
}

impl Class {
    /// The `class` label of `tollgate_shed_total`.
    fn label(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Normal => "normal",
            Class::Sheddable => "sheddable",
        }
    }

    /// What a request of the class adds to [`Counts::packed`].
    fn packed_one(self) -> u64 {
        match self {
            Class::Critical => ONE_IN_ALL,
            Class::Normal | Class::Sheddable => ONE_IN_ALL | ONE_BELOW_CRITICAL,
        }
    }
}

/// The most requests a layer counts in flight: each count is half of a `u64`.
pub(super) const MAX_COUNTED: usize = u32::MAX as usize;
/// One request in the high half of [`Counts::packed`], which counts all of them.
const ONE_IN_ALL: u64 = 1 << 32;
/// One request in the low half, which counts those below critical.
const ONE_BELOW_CRITICAL: u64 = 1;

/// The requests in flight through one layer and its clones: all of them and those below
/// critical (normal and sheddable: what may not use the reserve) in one word, so that a
/// critical or normal request is admitted with one compare-and-swap, and the sheddable
/// ones apart.
#[derive(Default)]
pub(super) struct Counts {
    /// All requests in the high half, those below critical in the low half.
    packed: AtomicU64,
    sheddable: AtomicUsize,
}

impl Counts {
    /// The requests in flight, of every class.
    pub(super) fn all(&self) -> usize {
        (self.packed.load(Ordering::Relaxed) >> 32) as usize
    }

    /// Sheddable, below critical and all requests in flight.
    fn now(&self) -> [usize; 3] {
        let packed = self.packed.load(Ordering::Relaxed);
        [
            self.sheddable.load(Ordering::Relaxed),
            (packed & u64::from(u32::MAX)) as usize,
            (packed >> 32) as usize,
        ]
    }
}

impl fmt::Debug for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [sheddable, below_critical, all] = self.now();
        f.debug_struct("Counts")
            .field("all", &all)
            .field("below_critical", &below_critical)
            .field("sheddable", &sheddable)
            .finish()
    }
}

/// The ceiling of each count, as one service of the layer enforces them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ceilings {
    pub(super) sheddable: usize,
    pub(super) below_critical: usize,
    pub(super) all: usize,
}

impl Ceilings {
    /// The ceilings of a layer letting `max_in_flight` through, keeping `reserve` slots for
    /// critical requests, and sheddable ones below `sheddable_limit` (half of what normal
    /// requests may use when `None`). Each is clamped under the one above it, and the
    /// maximum under [`MAX_COUNTED`].
    pub(super) fn new(
        max_in_flight: usize,
        reserve: usize,
        sheddable_limit: Option<usize>,
    ) -> Self {
        let max_in_flight = max_in_flight.min(MAX_COUNTED);
        let below_critical = max_in_flight - reserve.min(max_in_flight);
        let sheddable = sheddable_limit
            .unwrap_or(below_critical / 2)
            .min(below_critical);
        Self {
            sheddable,
            below_critical,
            all: max_in_flight,
        }
    }
}

/// What every service made by one [`ConcurrencyShedLayer::layer`](super::ConcurrencyShedLayer)
/// call shares.
pub(super) struct Shared {
    pub(super) ceilings: Ceilings,
    pub(super) retry_after_secs: u64,
    /// Shared further, with the layer and every other service it made.
    pub(super) counts: Arc<Counts>,
    critical: Option<Predicate>,
    sheddable: Option<Predicate>,
    /// Metric keys built once, so that counting allocates nothing per request; the shed
    /// counters indexed by class.
    shed_keys: [Key; 3],
    in_flight_key: Key,
    pub(super) name: Arc<str>,
}

/// The classifiers of a layer: which requests are critical, which sheddable.
#[derive(Clone, Default)]
pub(super) struct Classifiers {
    pub(super) critical: Option<Predicate>,
    pub(super) sheddable: Option<Predicate>,
}

impl Shared {
    /// The state of one layer's services, with its metric keys labelled `layer` = `name`.
    pub(super) fn new(
        ceilings: Ceilings,
        retry_after_secs: u64,
        counts: Arc<Counts>,
        classifiers: Classifiers,
        name: Arc<str>,
    ) -> Arc<Self> {
        // Described for each layer built, so a recorder installed after an earlier layer
        // gets the descriptions too.
        metrics::describe_counter!(
            SHED_TOTAL,
            Unit::Count,
            "Requests refused with 503 by a ConcurrencyShedLayer because too many were in \
             flight for their class, by layer and class (critical, normal, sheddable)."
        );
        metrics::describe_gauge!(
            IN_FLIGHT,
            Unit::Count,
            "Requests in flight through a ConcurrencyShedLayer, or holding a slot of an \
             InFlightLayer, by layer."
        );
        let layer = Label::new("layer", name.clone());
        let shed_key = |class: Class| {
            Key::from_parts(
                SHED_TOTAL,
                vec![layer.clone(), Label::new("class", class.label())],
            )
        };
        Arc::new(Self {
            ceilings,
            retry_after_secs,
            counts,
            critical: classifiers.critical,
            sheddable: classifiers.sheddable,
            shed_keys: [
                shed_key(Class::Critical),
                shed_key(Class::Normal),
                shed_key(Class::Sheddable),
            ],
            in_flight_key: Key::from_parts(IN_FLIGHT, vec![layer]),
            name,
        })
    }

    /// Whether any request can be other than normal.
    fn classifies(&self) -> bool {
        self.critical.is_some() || self.sheddable.is_some()
    }

    /// The class of `request`: critical if the critical predicate holds (whatever the
    /// sheddable one says), else sheddable if that one holds, else normal.
    pub(super) fn classify<B>(&self, request: Request<B>) -> (Class, Request<B>) {
        if !self.classifies() {
            return (Class::Normal, request);
        }
        // Taking the request apart and back together moves its fields, nothing more.
        let (parts, body) = request.into_parts();
        let class = if self.critical.as_ref().is_some_and(|p| p(&parts)) {
            Class::Critical
        } else if self.sheddable.as_ref().is_some_and(|p| p(&parts)) {
            Class::Sheddable
        } else {
            Class::Normal
        };
        (class, Request::from_parts(parts, body))
    }

    /// Takes a slot for a request of `class` if its class may have one.
    pub(super) fn try_acquire(self: &Arc<Self>, class: Class) -> Option<InFlight> {
        // Each ceiling bounds one count (both halves of the packed word are compared in
        // one compare-and-swap), and a compare-and-swap never lets a count pass its
        // ceiling, even for an instant: so no class ever exceeds its share, however
        // requests race. The counts guard no other data: Relaxed is enough.
        let ceilings = self.ceilings;
        let counts = &self.counts;
        if class == Class::Sheddable
            && counts
                .sheddable
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < ceilings.sheddable).then_some(n + 1)
                })
                .is_err()
        {
            return None;
        }
        let admitted = counts
            .packed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |packed| {
                let all = (packed >> 32) as usize;
                let below_critical = (packed & u64::from(u32::MAX)) as usize;
                let fits = all < ceilings.all
                    && (class == Class::Critical || below_critical < ceilings.below_critical);
                fits.then(|| packed + class.packed_one())
            })
            .is_ok();
        if !admitted {
            // Held for a moment, this count may have shed another sheddable request; none
            // of the other classes reads it.
            if class == Class::Sheddable {
                counts.sheddable.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.in_flight_key, &METADATA)
                .increment(1.0);
        });
        Some(InFlight {
            shared: self.clone(),
            class,
        })
    }

    /// Counts and logs a shed request of `class`, and answers it.
    pub(super) fn shed<B>(&self, class: Class) -> Response<ResponseBody<B>> {
        let key = &self.shed_keys[class as usize];
        metrics::with_recorder(|recorder| {
            recorder.register_counter(key, &METADATA).increment(1);
        });
        tracing::debug!(
            layer = %self.name,
            class = class.label(),
            max_in_flight = self.ceilings.all,
            "shed a request: too many in flight for its class"
        );
        response::overloaded(self.retry_after_secs)
    }
}

/// A slot taken; dropping it gives the slot back.
pub(super) struct InFlight {
    shared: Arc<Shared>,
    class: Class,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counts = &self.shared.counts;
        counts
            .packed
            .fetch_sub(self.class.packed_one(), Ordering::Relaxed);
        if self.class == Class::Sheddable {
            counts.sheddable.fetch_sub(1, Ordering::Relaxed);
        }
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.shared.in_flight_key, &METADATA)
                .decrement(1.0);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(ceilings: Ceilings) -> Arc<Shared> {
        Shared::new(
            ceilings,
            1,
            Arc::default(),
            Classifiers::default(),
            "test".into(),
        )
    }

    #[test]
    fn ceilings_nest_and_clamp() {
        assert_eq!(
            Ceilings::new(10, 2, None),
            Ceilings {
                sheddable: 4,
                below_critical: 8,
                all: 10
            }
        );
        assert_eq!(
            Ceilings::new(10, 20, Some(5)),
            Ceilings {
                sheddable: 0,
                below_critical: 0,
                all: 10
            }
        );
        assert_eq!(Ceilings::new(10, 0, Some(50)).sheddable, 10);
        assert_eq!(
            Ceilings::new(0, 3, None),
            Ceilings {
                sheddable: 0,
                below_critical: 0,
                all: 0
            }
        );
    }

    #[test]
    fn a_refused_class_gives_back_the_counts_it_took() {
        let shared = shared(Ceilings::new(3, 0, Some(2)));
        let critical = shared.try_acquire(Class::Critical).unwrap();
        let _normal = shared.try_acquire(Class::Normal).unwrap();
        let _sheddable = shared.try_acquire(Class::Sheddable).unwrap();
        // The total is full: a sheddable request passes its own ceiling, then is refused,
        // and leaves its count as it was.
        assert!(shared.try_acquire(Class::Sheddable).is_none());
        assert!(shared.try_acquire(Class::Normal).is_none());
        let now = || shared.counts.now();
        assert_eq!(now(), [1, 2, 3]);
        drop(critical);
        assert_eq!(now(), [1, 2, 2]);
        let normal = shared.try_acquire(Class::Normal).unwrap();
        assert_eq!(now(), [1, 3, 3]);
        drop(normal);
        assert_eq!(now(), [1, 2, 2]);
    }

    #[test]
    fn the_reserve_is_only_for_critical_requests() {
        let shared = shared(Ceilings::new(3, 1, None));
        let critical = shared.try_acquire(Class::Critical).unwrap();
        let normal = shared.try_acquire(Class::Normal).unwrap();
        let _other = shared.try_acquire(Class::Normal).unwrap();
        // One slot is free, but it is the reserve's: the critical request in flight is
        // counted in the reserve first, so the slots outside it are all taken.
        drop(critical);
        assert!(shared.try_acquire(Class::Normal).is_none());
        assert!(shared.try_acquire(Class::Sheddable).is_none());
        let critical = shared.try_acquire(Class::Critical).unwrap();
        // A critical request takes a free slot outside the reserve, too.
        drop(normal);
        let _second = shared.try_acquire(Class::Critical).unwrap();
        assert!(shared.try_acquire(Class::Critical).is_none());
        // With one critical request in flight the reserve is in use, so the slot the
        // other gives back is outside it, and a normal request may take it.
        drop(critical);
        let _normal = shared.try_acquire(Class::Normal).unwrap();
        assert!(shared.try_acquire(Class::Critical).is_none());
    }
}
