//! The master of a Redis Sentinel deployment: asked of the Sentinels each time a connection
//! is made, and followed to where the Sentinels announce it, so that a failover is followed
//! without a restart.
//!
//! The redis crate's Sentinel client asks each Sentinel for the masters it monitors, skips
//! one flagged down (`s_down`, `o_down`), and connects to the named master only after
//! `ROLE` there says it is a master; replicas are never asked. The connection to it is then
//! watched (see `link`): when the master dies or is demoted (Sentinel disconnects the
//! clients of an instance it reconfigures, and a demoted master answers writes with
//! `READONLY` and `ROLE` with `slave`), the connection is given up and the Sentinels are
//! asked again, until they name the promoted replica.
//!
//! A master cut off from the Sentinels is demoted by nobody: it answers as a master for as
//! long as the partition lasts. So the Sentinels' announcements are heard too (see
//! `sentinel_announcements`): once a Sentinel announces the replica it promotes, a
//! connection is made to that replica, and used in place of the old master's as soon as
//! `ROLE` there says master.

use std::fmt;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, RedisResult};

use super::connecting::LinkConfig;
use super::sentinel_announcements::{self, Announcements, Subscriptions};
use super::topology::Address;

/// Finds and connects to the master that Sentinels call `name`.
pub(super) struct SentinelMaster {
    client: SentinelClient,
    name: String,
    /// One client per Sentinel, for its announcements.
    sentinels: Vec<redis::Client>,
    announcements: Arc<Announcements>,
    /// How the latest connection was made (the master's address, and the settings an
    /// announced master is connected to with); boxed, as it is seldom read.
    connected: Option<Box<ConnectionInfo>>,
}

/// What following the Sentinels' latest announcement came to.
pub(super) enum Followed {
    /// Connected to the announced master, which says it is one.
    Connected(MultiplexedConnection),
    /// The failover is over, but its new master could not be used yet: the connection in
    /// use points at a master no more.
    Abandon,
    /// The replica being promoted is not a master yet.
    NotYet,
}

impl SentinelMaster {
    /// The master `name`, as the Sentinels at `sentinels` (`redis://host:port/` URLs) know
    /// it. Nothing is connected yet.
    pub(super) fn new(sentinels: &[String], name: &str) -> RedisResult<Self> {
        // An owned name: without TLS the client takes a `String`, with it any `AsRef<str>`.
        let service: String = name.to_owned();
        let client = SentinelClient::build(
            sentinels.to_vec(),
            service,
            None,
            SentinelServerType::Master,
        )?;
        let sentinels = sentinels
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Self {
            client,
            name: name.to_owned(),
            sentinels,
            announcements: Arc::new(Announcements::new(name)),
            connected: None,
        })
    }

    /// Starts hearing the Sentinels' announcements, on the current Tokio runtime, for as
    /// long as the returned handle lives.
    pub(super) fn subscribe(&self, config: LinkConfig) -> Subscriptions {
        sentinel_announcements::subscribe(&self.sentinels, &self.announcements, config)
    }

    /// Connects to the master a Sentinel announced, if one is announced and says it is a
    /// master, else asks the Sentinels where the master is now, and connects to it.
    pub(super) async fn connect(
        &mut self,
        config: &redis::AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        if let Some(Followed::Connected(connection)) = self.follow_announcement(config).await {
            return Ok(connection);
        }
        let client = self.client.async_get_client().await?;
        let connection = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        self.connected = Some(Box::new(client.get_connection_info().clone()));
        Ok(connection)
    }

    /// Waits until a Sentinel announces something of this master.
    pub(super) async fn announcement(&self) {
        self.announcements.next().await;
    }

    /// Follows the Sentinels' latest announcement, if it names a master other than the one
    /// connected to: connects to it, and keeps the connection if `ROLE` there says master.
    /// `None` when nothing announced is to be followed.
    pub(super) async fn follow_announcement(
        &mut self,
        config: &redis::AsyncConnectionConfig,
    ) -> Option<Followed> {
        let announced = self.announcements.pending()?;
        // The settings of the latest connection, at the announced address: without one
        // there is nothing to go by, and the Sentinels are asked.
        let Some(connected) = self.connected.as_deref().cloned() else {
            self.announcements.followed(&announced);
            return None;
        };
        if address(connected.addr()).as_ref() == Some(&announced.master) {
            self.announcements.followed(&announced);
            return None;
        }
        let moved = at(connected.addr(), &announced.master);
        let info = connected.set_addr(moved);
        match connect_to_master(info.clone(), config).await {
            Ok(connection) => {
                self.announcements.followed(&announced);
                self.connected = Some(Box::new(info));
                Some(Followed::Connected(connection))
            }
            Err(error) if announced.switched => {
                // The Sentinels name it now: asked again, they say where to go.
                tracing::debug!(%error, master = %announced.master, "the announced master cannot be used yet");
                self.announcements.followed(&announced);
                Some(Followed::Abandon)
            }
            Err(error) => {
                tracing::debug!(%error, master = %announced.master, "the replica being promoted is not a master yet");
                Some(Followed::NotYet)
            }
        }
    }
}

impl fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A connection to the node `info` names, if `ROLE` there says master.
async fn connect_to_master(
    info: ConnectionInfo,
    config: &redis::AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(info)?;
    let mut connection = client
        .get_multiplexed_async_connection_with_config(config)
        .await?;
    let role: redis::Role = redis::cmd("ROLE").query_async(&mut connection).await?;
    match role {
        redis::Role::Primary { .. } => Ok(connection),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "not a master (yet)",
        ))),
    }
}

/// The host and port of `addr`, for a TCP address.
fn address(addr: &ConnectionAddr) -> Option<Address> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some(Address {
                host: host.clone(),
                port: *port,
            })
        }
        _ => None,
    }
}

/// `addr`, moved to `to` (TLS settings kept).
fn at(addr: &ConnectionAddr, to: &Address) -> ConnectionAddr {
    match addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: to.host.clone(),
            port: to.port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(to.host.clone(), to.port),
    }
}
