//! The connection to a Redis Cluster, made in the background, and the slot map read beside
//! it.
//!
//! Making a cluster connection takes several round trips (connect to a seed, `CLUSTER
//! SLOTS`, a connection per node). Made inside a decision, under the store timeout, it would
//! be dropped half made whenever that takes longer than the timeout (TLS, another zone, a
//! cold start), and the limiter would never reach the store. So a task makes it, retrying
//! with the backoff of single-node connections; a decision made until then waits for it
//! within its own timeout and, when that runs out, falls back as not connected. The task
//! is started when the backend is built inside a Tokio runtime, or else by the first
//! decision.
//!
//! Once connected, the task reads the slot map every [`TOPOLOGY_EVERY`] (sooner after a
//! `MOVED`), from one master after another. Each decision goes to the master the map names
//! for its slot, which is also the failure domain whose breaker it passes (a failure after a
//! redirect is charged to the node the redirect named, see `cluster`): a dead master's
//! decisions time out against its own breaker only, and once its replica is promoted the
//! next reading sends them to the replica, a new domain with a closed breaker. The redis
//! crate's own slot map, which it refreshes only when its calls fail, is not relied on.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::Notify;

use super::connecting::LinkConfig;
use super::race::race;
use super::topology::{Address, Topology, parse_slots};
use crate::store::backend::StoreError;
use crate::store::domain::FailureDomain;

/// How often the slot map is read.
pub(super) const TOPOLOGY_EVERY: Duration = Duration::from_millis(250);

/// How many masters one reading of the slot map tries before it waits for the next.
const TOPOLOGY_TRIES: usize = 3;

struct Shared {
    client: ClusterClient,
    config: LinkConfig,
    connection: OnceLock<ClusterConnection>,
    topology: Topology,
    /// Read the slot map now (a `MOVED` said it changed).
    stale: Notify,
    /// Woken once connected with the slot map read.
    ready: Notify,
}

/// Stops the task when the last clone of the link is dropped.
struct Task(tokio::task::AbortHandle);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A cluster connection kept by a task of its own. Cheap to clone; clones share it.
#[derive(Clone)]
pub(super) struct ClusterLink {
    shared: Arc<Shared>,
    task: Arc<OnceLock<Task>>,
}

impl ClusterLink {
    /// Starts connecting now if there is a Tokio runtime, else at the first use.
    pub(super) fn new(client: ClusterClient, config: LinkConfig) -> Self {
        let link = Self {
            shared: Arc::new(Shared {
                client,
                config,
                connection: OnceLock::new(),
                topology: Topology::default(),
                stale: Notify::new(),
                ready: Notify::new(),
            }),
            task: Arc::new(OnceLock::new()),
        };
        link.start();
        link
    }

    /// Starts the task, once, if a Tokio runtime is there to run it.
    fn start(&self) {
        if self.task.get().is_some() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.task.get_or_init(|| {
                let task = runtime.spawn(keep_connected(self.shared.clone()));
                Task(task.abort_handle())
            });
        }
    }

    /// Whether decisions can be sent: connected, with the slot map read.
    pub(super) fn is_connected(&self) -> bool {
        self.start();
        self.shared.connection.get().is_some() && self.shared.topology.is_known()
    }

    pub(super) fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// The link as a failure domain before a slot is known: connecting until the
    /// connection is made and the slot map read, then connected (the cluster client makes
    /// its connections to the nodes again by itself).
    pub(super) fn domain(&self) -> FailureDomain {
        if self.is_connected() {
            FailureDomain::WHOLE
        } else {
            FailureDomain::WHOLE.connecting()
        }
    }

    /// The connection, once made with the slot map read; until then this waits for it (the
    /// caller bounds the wait). Outside a Tokio runtime nothing can make it: a
    /// [`StoreError::not_connected`] error.
    pub(super) async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        loop {
            let ready = self.shared.ready.notified();
            let mut ready = std::pin::pin!(ready);
            ready.as_mut().enable();
            if self.is_connected()
                && let Some(connection) = self.shared.connection.get()
            {
                return Ok(connection.clone());
            }
            if self.task.get().is_none() {
                return Err(StoreError::not_connected(
                    "no Tokio runtime to connect to the Redis Cluster on",
                ));
            }
            ready.await;
        }
    }

    /// Asks for the slot map to be read again now.
    pub(super) fn stale(&self) {
        self.shared.stale.notify_one();
    }
}

impl fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterLink")
            .field("connected", &self.shared.connection.get().is_some())
            .field("topology", &self.shared.topology)
            .finish()
    }
}

async fn keep_connected(shared: Arc<Shared>) {
    let config = shared.config;
    let mut backoff = config.backoff();
    let mut warned = false;
    let connection = loop {
        match tokio::time::timeout(config.connect_timeout, shared.client.get_async_connection())
            .await
        {
            Ok(Ok(connection)) => break connection,
            Ok(Err(error)) if !warned => {
                tracing::warn!(%error, "cannot connect to the Redis Cluster; retrying in the background");
                warned = true;
            }
            Err(_) if !warned => {
                tracing::warn!(
                    "no connection to the Redis Cluster within the connect timeout; retrying in \
                     the background"
                );
                warned = true;
            }
            _ => {}
        }
        tokio::time::sleep(backoff.pause()).await;
    };
    let _ = shared.connection.set(connection.clone());
    tracing::info!("connected to the Redis Cluster");
    let mut next = 0usize;
    loop {
        read_slot_map(&shared, &connection, &mut next).await;
        race(shared.stale.notified(), tokio::time::sleep(TOPOLOGY_EVERY)).await;
    }
}

/// Reads `CLUSTER SLOTS` from one master after another (starting at the `next`th), or from
/// any node before any master is known.
async fn read_slot_map(shared: &Shared, connection: &ClusterConnection, next: &mut usize) {
    let masters = shared.topology.masters();
    let timeout = shared.config.response_timeout.min(TOPOLOGY_EVERY);
    for attempt in 0..TOPOLOGY_TRIES {
        let asked: Option<Address> = (!masters.is_empty()).then(|| {
            *next = next.wrapping_add(1);
            masters[*next % masters.len()].clone()
        });
        let routing = match &asked {
            Some(address) => SingleNodeRoutingInfo::ByAddress {
                host: address.host.clone(),
                port: address.port,
            },
            None => SingleNodeRoutingInfo::Random,
        };
        let mut command = redis::cmd("CLUSTER");
        command.arg("SLOTS");
        let reply = tokio::time::timeout(
            timeout,
            connection
                .clone()
                .route_command(command, RoutingInfo::SingleNode(routing)),
        )
        .await;
        let host = asked.as_ref().map(|a| a.host.as_str()).unwrap_or_default();
        match reply {
            Ok(Ok(reply)) => match parse_slots(&reply, host) {
                Some(ranges) if !ranges.is_empty() => {
                    if shared.topology.update(&ranges) {
                        tracing::info!(masters = ?shared.topology.masters(), "Redis Cluster slot map read");
                    }
                    shared.ready.notify_waiters();
                    return;
                }
                _ => tracing::debug!(attempt, "an unreadable CLUSTER SLOTS reply"),
            },
            Ok(Err(error)) => tracing::debug!(attempt, %error, "CLUSTER SLOTS failed"),
            Err(_) => tracing::debug!(attempt, "no answer to CLUSTER SLOTS in time"),
        }
    }
}
