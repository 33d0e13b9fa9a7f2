//! The master of a Redis Sentinel deployment: asked of the Sentinels each time a connection
//! is made, so that a failover is followed without a restart.
//!
//! The redis crate's Sentinel client asks each Sentinel for the masters it monitors, skips
//! one flagged down (`s_down`, `o_down`), and connects to the named master only after
//! `ROLE` there says it is a master; replicas are never asked. The connection to it is then
//! watched (see `link`): when the master dies or is demoted (Sentinel disconnects the
//! clients of an instance it reconfigures, and a demoted master answers writes with
//! `READONLY` and `ROLE` with `slave`), the connection is given up and the Sentinels are
//! asked again, until they name the promoted replica.

use std::fmt;

use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};

/// Finds and connects to the master that Sentinels call `name`.
pub(super) struct SentinelMaster {
    client: SentinelClient,
    name: String,
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
        Ok(Self {
            client,
            name: name.to_owned(),
        })
    }

    /// Asks the Sentinels where the master is now, and connects to it.
    pub(super) async fn connect(
        &mut self,
        config: &redis::AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        self.client.get_async_connection_with_config(config).await
    }
}

impl fmt::Debug for SentinelMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelMaster")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
