//! The count of requests in flight, and the slot each admitted request holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Response;
use metrics::{Key, Label, Level, Metadata, Unit};

use crate::http::body::ResponseBody;
use crate::http::response;

/// Counted each time the layer sheds a request, labelled `layer`.
const SHED_TOTAL: &str = "tollgate_shed_total";
/// Requests in flight through the layer, labelled `layer`.
const IN_FLIGHT: &str = "tollgate_in_flight";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// What every service made by one [`ConcurrencyShedLayer::layer`](super::ConcurrencyShedLayer)
/// call shares.
pub(super) struct Shared {
    pub(super) max_in_flight: usize,
    pub(super) retry_after_secs: u64,
    /// Shared further, with the layer and every other service it made.
    pub(super) in_flight: Arc<AtomicUsize>,
    /// Metric keys built once, so that counting allocates nothing per request.
    shed_key: Key,
    in_flight_key: Key,
    pub(super) name: Arc<str>,
}

impl Shared {
    /// The state of one layer's services, with its metric keys labelled `layer` = `name`.
    pub(super) fn new(
        max_in_flight: usize,
        retry_after_secs: u64,
        in_flight: Arc<AtomicUsize>,
        name: Arc<str>,
    ) -> Arc<Self> {
        // Described for each layer built, so a recorder installed after an earlier layer
        // gets the descriptions too.
        metrics::describe_counter!(
            SHED_TOTAL,
            Unit::Count,
            "Requests refused with 503 by a ConcurrencyShedLayer because too many were in \
             flight, by layer."
        );
        metrics::describe_gauge!(
            IN_FLIGHT,
            Unit::Count,
            "Requests in flight through a ConcurrencyShedLayer, by layer."
        );
        let labels = vec![Label::new("layer", name.clone())];
        Arc::new(Self {
            max_in_flight,
            retry_after_secs,
            in_flight,
            shed_key: Key::from_parts(SHED_TOTAL, labels.clone()),
            in_flight_key: Key::from_parts(IN_FLIGHT, labels),
            name,
        })
    }

    /// Takes a slot if one is free.
    pub(super) fn try_acquire(self: &Arc<Self>) -> Option<InFlight> {
        // The count guards no other data: Relaxed is enough, and the compare-and-swap
        // loop never lets it pass the maximum, even for an instant.
        self.in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_in_flight).then_some(n + 1)
            })
            .ok()?;
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.in_flight_key, &METADATA)
                .increment(1.0);
        });
        Some(InFlight {
            shared: self.clone(),
        })
    }

    /// Counts and logs a shed request, and answers it.
    pub(super) fn shed<B>(&self) -> Response<ResponseBody<B>> {
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&self.shed_key, &METADATA)
                .increment(1);
        });
        tracing::debug!(
            layer = %self.name,
            max_in_flight = self.max_in_flight,
            "shed a request: too many in flight"
        );
        response::overloaded(self.retry_after_secs)
    }
}

/// A slot taken; dropping it gives the slot back.
pub(super) struct InFlight {
    shared: Arc<Shared>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        metrics::with_recorder(|recorder| {
            recorder
                .register_gauge(&self.shared.in_flight_key, &METADATA)
                .decrement(1.0);
        });
    }
}
