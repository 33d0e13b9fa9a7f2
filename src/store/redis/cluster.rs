//! The decision script on a Redis Cluster, following the cluster as it changes.
//!
//! The redis crate's cluster client follows `MOVED`, `ASK` and `TRYAGAIN` only while it has
//! retries left, and a client with retries also repeats calls after an I/O error or a
//! dropped connection: a script whose reply was lost may already have counted, so
//! repeating it would count the request twice. The client is therefore built without
//! retries, and this module follows the redirects itself:
//!
//! - `MOVED slot host:port`: the slot lives elsewhere now. The call goes again to the named
//!   node, and the slot map (see `cluster_link`) is read again at once, so later calls go
//!   straight to the right node.
//! - `ASK slot host:port`: the slot is migrating and this caller's keys are already on the
//!   importing node. `ASKING` and the call go to the named node together, as one pipeline
//!   on one connection, so no other command can slip between them.
//! - `TRYAGAIN` (some of a caller's keys moved, some not yet) and `CLUSTERDOWN`: after a
//!   short pause, the same call to the same place.
//!
//! A call goes first to the master that the backend's slot map names for its keys (the
//! failure domain whose breaker it passed), else where the client's own map sends it. Where
//! it is headed is kept beside it (see [`Heading`]): a call that fails after a redirect
//! failed at the node the redirect named, and that node's failure domain is charged, not the
//! one the stale map named.
//!
//! Each of these replies means the script did not run, so sending it again is safe. Any
//! other error (a timeout, a refused or dropped connection, an I/O error, a script error)
//! ends the call: it may have run. The number of attempts is bounded, and the caller
//! bounds the whole call by its response timeout.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, Script};
use redis::{ServerErrorKind, Value};

use super::eval;
use super::topology::Address;

/// How many redirects (or pauses) one call follows before it gives up.
const MAX_REDIRECTS: usize = 5;

/// The pause before trying again after `TRYAGAIN` or `CLUSTERDOWN`.
const PAUSE: Duration = Duration::from_millis(5);

/// Where an attempt goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    /// To the node that the client's slot map names for the keys.
    BySlot,
    /// To the node at this address (after `MOVED`).
    Node { host: String, port: u16 },
    /// `ASKING`, then the call, on the node at this address (after `ASK`).
    Asking { host: String, port: u16 },
}

/// What to do after an attempt failed with an error.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Try again at once, there.
    Go(Route),
    /// Try again there after a short pause.
    Pause(Route),
    /// The call may have run, or will not succeed: the error is the answer.
    Stop,
}

/// The node a call is headed for: the master the slot map named for its keys, then each
/// node a redirect names. Read once the call has failed (or was given up at its timeout), it
/// is the node the failure belongs to; `None` while the client's own slot map chooses.
#[derive(Debug, Default)]
pub(super) struct Heading(Mutex<Option<Address>>);

impl Heading {
    /// Heads for `node`.
    pub(super) fn head_for(&self, node: Option<Address>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = node;
    }

    /// The node the call is headed for now.
    pub(super) fn node(&self) -> Option<Address> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Runs `script` on the cluster with `keys` and `args` (`EVALSHA`, or `EVAL` on NOSCRIPT),
/// first on the node `heading` names (the master the slot map names for the keys) or else
/// wherever the client's own map sends it, following up to [`MAX_REDIRECTS`] redirects
/// (each one recorded in `heading`), never repeating a call that may have run. `moved` is
/// called on each `MOVED`: the slot map is stale.
pub(super) async fn evaluate<T: FromRedisValue>(
    connection: &ClusterConnection,
    heading: &Heading,
    moved: impl Fn(),
    script: &Script,
    source: &str,
    keys: &[Vec<u8>],
    args: &(impl redis::ToRedisArgs + Sync),
) -> Result<T, RedisError> {
    let mut route = match heading.node() {
        Some(Address { host, port }) => Route::Node { host, port },
        None => Route::BySlot,
    };
    let mut redirects = 0;
    loop {
        let mut routed = Routed {
            connection: connection.clone(),
            route: route.clone(),
        };
        let error = match eval::evaluate(&mut routed, script, source, keys, args).await {
            Ok(reply) => return Ok(reply),
            Err(error) => error,
        };
        if redirects == MAX_REDIRECTS {
            return Err(error);
        }
        redirects += 1;
        if error.kind() == ErrorKind::Server(ServerErrorKind::Moved) {
            moved();
        }
        route = match next(&error, &route) {
            Next::Go(next) => next,
            Next::Pause(next) => {
                tokio::time::sleep(PAUSE).await;
                next
            }
            Next::Stop => return Err(error),
        };
        // A node that has no connection sends the call by the client's own map, and stays
        // the node it was headed for: that is where it failed.
        if let Route::Node { host, port } | Route::Asking { host, port } = &route {
            heading.head_for(Some(Address {
                host: host.clone(),
                port: *port,
            }));
        }
        tracing::debug!(%error, ?route, redirects, "redis cluster: the script goes again");
    }
}

/// The next step after `error` on `route`.
fn next(error: &RedisError, route: &Route) -> Next {
    let named = || {
        error
            .redirect_node()
            .and_then(|(address, _slot)| split_address(address))
    };
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => match named() {
            Some((host, port)) => Next::Go(Route::Node { host, port }),
            None => Next::Stop,
        },
        ErrorKind::Server(ServerErrorKind::Ask) => match named() {
            Some((host, port)) => Next::Go(Route::Asking { host, port }),
            None => Next::Stop,
        },
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
            Next::Pause(route.clone())
        }
        // The client has no open connection to the named node (it is new to the client,
        // or reconnecting): nothing was sent. The slot map, refreshing since `MOVED`,
        // chooses the node instead.
        ErrorKind::ClusterConnectionNotFound if *route != Route::BySlot => {
            Next::Pause(Route::BySlot)
        }
        _ => Next::Stop,
    }
}

/// `host:port` (or `[v6]:port`) as a redirect names a node.
fn split_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

/// The cluster connection with every command sent along one route.
struct Routed {
    connection: ClusterConnection,
    route: Route,
}

impl ConnectionLike for Routed {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match &self.route {
                Route::BySlot => self.connection.req_packed_command(cmd).await,
                Route::Node { host, port } => {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    });
                    self.connection.route_command(cmd.clone(), routing).await
                }
                Route::Asking { host, port } => {
                    let mut pipeline = redis::pipe();
                    pipeline.add_command(redis::cmd("ASKING"));
                    pipeline.add_command(cmd.clone());
                    let route = SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    };
                    // Only the call's own reply comes back (offset 1): `ASKING` answers OK.
                    let mut replies = self
                        .connection
                        .route_pipeline(pipeline, 1, 1, route)
                        .await?;
                    match replies.pop() {
                        Some(reply) if replies.is_empty() => Ok(reply),
                        _ => Err(RedisError::from((
                            ErrorKind::Client,
                            "one reply expected after ASKING",
                        ))),
                    }
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // Only single commands are routed here; a pipeline goes by its keys' slot.
        self.connection.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(reply: &str) -> RedisError {
        redis::parse_redis_value(reply.as_bytes())
            .and_then(Value::extract_error)
            .expect_err("an error reply")
    }

    fn node(host: &str, port: u16) -> Route {
        Route::Node {
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn moved_goes_to_the_named_node() {
        let moved = error("-MOVED 3999 127.0.0.1:6381\r\n");
        assert_eq!(
            next(&moved, &Route::BySlot),
            Next::Go(node("127.0.0.1", 6381))
        );
        // A second MOVED from a node reached by address goes on to the next one.
        assert_eq!(
            next(
                &error("-MOVED 3999 10.0.0.2:7000\r\n"),
                &node("127.0.0.1", 6381)
            ),
            Next::Go(node("10.0.0.2", 7000))
        );
    }

    #[test]
    fn ask_goes_to_the_named_node_with_asking() {
        let ask = error("-ASK 12182 127.0.0.1:7002\r\n");
        assert_eq!(
            next(&ask, &Route::BySlot),
            Next::Go(Route::Asking {
                host: "127.0.0.1".to_owned(),
                port: 7002
            })
        );
    }

    #[test]
    fn try_again_and_cluster_down_pause_then_retry_the_same_route() {
        let asking = Route::Asking {
            host: "127.0.0.1".to_owned(),
            port: 7002,
        };
        let try_again = error("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
        assert_eq!(next(&try_again, &asking), Next::Pause(asking.clone()));
        let down = error("-CLUSTERDOWN The cluster is down\r\n");
        assert_eq!(next(&down, &Route::BySlot), Next::Pause(Route::BySlot));
    }

    #[test]
    fn a_call_that_may_have_run_is_never_repeated() {
        let io = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        let dropped = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "broken pipe",
        ));
        let timeout = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        ));
        let script = error("-ERR user_script:1: something failed\r\n");
        let noscript = error("-NOSCRIPT No matching script\r\n");
        for error in [io, dropped, timeout, script, noscript] {
            for route in [Route::BySlot, node("127.0.0.1", 6381)] {
                assert_eq!(next(&error, &route), Next::Stop, "{error} on {route:?}");
            }
        }
    }

    #[test]
    fn a_node_without_a_connection_falls_back_to_the_slot_map() {
        let missing = RedisError::from((
            ErrorKind::ClusterConnectionNotFound,
            "Requested connection not found",
            "127.0.0.1:6381".to_owned(),
        ));
        assert_eq!(
            next(&missing, &node("127.0.0.1", 6381)),
            Next::Pause(Route::BySlot)
        );
        // By slot there is no other way: the error stands.
        assert_eq!(next(&missing, &Route::BySlot), Next::Stop);
    }

    #[test]
    fn redirect_addresses() {
        assert_eq!(
            split_address("127.0.0.1:6381"),
            Some(("127.0.0.1".to_owned(), 6381))
        );
        assert_eq!(split_address("[::1]:7000"), Some(("::1".to_owned(), 7000)));
        assert_eq!(
            split_address("redis-0.local:7000"),
            Some(("redis-0.local".to_owned(), 7000))
        );
        assert_eq!(split_address(":7000"), None);
        assert_eq!(split_address("127.0.0.1"), None);
        assert_eq!(split_address("127.0.0.1:port"), None);
    }
}
