//! What the Sentinels announce of a failover, heard on a subscription to each Sentinel.
//!
//! A master that the Sentinels can no longer reach (a partition between them) is still a
//! master in its own eyes: it answers `ROLE` with `master` and takes writes until the
//! Sentinels reach it again to demote it, which a lasting partition puts off for as long as
//! it lasts. Its clients can only learn of the failover from the Sentinels, and the
//! Sentinels tell it on their pub/sub channels:
//!
//! - `+failover-state-wait-promotion` (`slave <ip>:<port> <ip> <port> @ <name> ...`), from
//!   the Sentinel leading the failover, once it has told the replica to become the master;
//! - `+switch-master` (`<name> <old ip> <old port> <new ip> <new port>`), from each Sentinel
//!   once it takes the new master as the master, about a second later (a Sentinel confirms
//!   a promotion with its next `INFO` of the replica, once a second).
//!
//! Every Sentinel is subscribed to (any of them may lead a failover), each on a connection
//! of its own that is made again with a jittered backoff when it is lost, and pinged when
//! idle so that one cut off silently is noticed. What they announce is kept for the link,
//! which moves to the announced master once it says it is one (see `sentinel` and `link`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_core::Stream;
use redis::Msg;
use redis::aio::PubSub;
use tokio::sync::Notify;

use super::connecting::LinkConfig;
use super::race::{Either, race};
use super::topology::Address;

/// The announcement of a replica being promoted.
const PROMOTING: &str = "+failover-state-wait-promotion";
/// The announcement of a failover's end.
const SWITCHED: &str = "+switch-master";

/// How long a replica announced as being promoted is waited for to say it is the master.
/// It says so within milliseconds; one that does not was not promoted, and the failover's
/// end (or the master's loss) decides instead.
const PROMOTION_WAIT: Duration = Duration::from_secs(5);

/// How long a subscription may stay silent before its Sentinel is pinged.
const SUBSCRIPTION_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Where the Sentinels announced the master `name` is going.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Announced {
    /// The new master's address, as the Sentinels name it.
    pub(super) master: Address,
    /// The failover is over (`+switch-master`); otherwise the replica has been told to
    /// become the master and may not be one yet.
    pub(super) switched: bool,
    heard: Instant,
}

/// The latest announcement about one master, shared by the subscriptions and the link.
#[derive(Debug)]
pub(super) struct Announcements {
    name: String,
    latest: Mutex<Option<Latest>>,
    heard: Notify,
}

#[derive(Debug)]
struct Latest {
    announced: Announced,
    /// The link has followed it (or found it of no use).
    followed: bool,
}

impl Announcements {
    pub(super) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            latest: Mutex::new(None),
            heard: Notify::new(),
        }
    }

    /// The announcement still to be followed, if any: a failover's end, or a promotion
    /// announced less than [`PROMOTION_WAIT`] ago.
    pub(super) fn pending(&self) -> Option<Announced> {
        self.lock()
            .as_ref()
            .filter(|latest| !latest.followed)
            .map(|latest| latest.announced.clone())
            .filter(|a| a.switched || a.heard.elapsed() < PROMOTION_WAIT)
    }

    /// `announced` has been followed (or found of no use): it is not pending any more,
    /// unless another master was announced meanwhile.
    pub(super) fn followed(&self, announced: &Announced) {
        if let Some(latest) = self.lock().as_mut()
            && latest.announced.master == announced.master
        {
            latest.followed = true;
        }
    }

    /// Waits for the next announcement.
    pub(super) async fn next(&self) {
        self.heard.notified().await;
    }

    /// Takes in `message`, if it announces something of this master.
    fn hear(&self, message: &Msg) {
        let Ok(payload) = message.get_payload::<String>() else {
            return;
        };
        let Some(announced) = parse(message.get_channel_name(), &payload, &self.name) else {
            return;
        };
        let mut latest = self.lock();
        match latest.as_mut() {
            // Every Sentinel announces the failover's end: only the first is news, and a
            // promotion already followed needs no following again.
            Some(known) if known.announced.master == announced.master => {
                if known.announced.switched || !announced.switched {
                    return;
                }
                known.announced.switched = true;
                if known.followed {
                    return;
                }
            }
            _ => {
                *latest = Some(Latest {
                    announced: announced.clone(),
                    followed: false,
                });
            }
        }
        drop(latest);
        tracing::info!(
            master = %self.name,
            to = %announced.master,
            switched = announced.switched,
            "a Sentinel announced a new master"
        );
        self.heard.notify_waiters();
    }

    // Every update under this lock is a plain assignment, so a poisoned lock is still sound.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Latest>> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What `payload` on `channel` announces of the master `name`, if anything.
fn parse(channel: &str, payload: &str, name: &str) -> Option<Announced> {
    let fields: Vec<&str> = payload.split_ascii_whitespace().collect();
    let (host, port, switched) = match (channel, fields.as_slice()) {
        (SWITCHED, [master, _, _, host, port, ..]) if *master == name => (host, port, true),
        (PROMOTING, ["slave", _, host, port, "@", master, ..]) if *master == name => {
            (host, port, false)
        }
        _ => return None,
    };
    Some(Announced {
        master: Address {
            host: (*host).to_owned(),
            port: port.parse().ok()?,
        },
        switched,
        heard: Instant::now(),
    })
}

/// The subscriptions to the Sentinels; they end when this is dropped.
#[derive(Debug)]
pub(super) struct Subscriptions(Vec<tokio::task::AbortHandle>);

impl Drop for Subscriptions {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Subscribes to the announcements of every Sentinel of `sentinels`, on the current Tokio
/// runtime, for as long as the returned handle lives.
pub(super) fn subscribe(
    sentinels: &[redis::Client],
    announcements: &Arc<Announcements>,
    config: LinkConfig,
) -> Subscriptions {
    Subscriptions(
        sentinels
            .iter()
            .map(|sentinel| {
                tokio::spawn(listen_to(sentinel.clone(), announcements.clone(), config))
                    .abort_handle()
            })
            .collect(),
    )
}

/// Listens to one Sentinel, subscribing again whenever the subscription is lost.
async fn listen_to(sentinel: redis::Client, announcements: Arc<Announcements>, config: LinkConfig) {
    let mut backoff = config.backoff();
    loop {
        let subscribed =
            tokio::time::timeout(config.connect_timeout, subscription(&sentinel)).await;
        match subscribed {
            Ok(Ok(pubsub)) => {
                backoff.reset();
                let why = listen(pubsub, &announcements, config.response_timeout).await;
                tracing::debug!(
                    master = %announcements.name,
                    why,
                    "a Sentinel's announcements are subscribed to again"
                );
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "cannot subscribe to a Sentinel's announcements yet");
            }
            Err(_) => tracing::debug!("no subscription to a Sentinel within the connect timeout"),
        }
        tokio::time::sleep(backoff.pause()).await;
    }
}

async fn subscription(sentinel: &redis::Client) -> redis::RedisResult<PubSub> {
    let mut pubsub = sentinel.get_async_pubsub().await?;
    pubsub.subscribe(&[PROMOTING, SWITCHED]).await?;
    Ok(pubsub)
}

/// Takes in what `pubsub` brings until it is lost; returns why it ended.
async fn listen(
    pubsub: PubSub,
    announcements: &Announcements,
    response_timeout: Duration,
) -> &'static str {
    let (mut sink, stream) = pubsub.split();
    let mut stream = std::pin::pin!(stream);
    let mut checks = tokio::time::interval(SUBSCRIPTION_CHECK_EVERY);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    checks.tick().await;
    loop {
        let message = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx));
        match race(message, checks.tick()).await {
            Either::First(Some(message)) => announcements.hear(&message),
            Either::First(None) => return "the subscription was lost",
            Either::Second(_) => {
                let ping = sink.ping::<redis::Value>();
                if !matches!(
                    tokio::time::timeout(response_timeout, ping).await,
                    Ok(Ok(_))
                ) {
                    return "the Sentinel did not answer a ping";
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(host: &str, port: u16) -> Address {
        Address {
            host: host.to_owned(),
            port,
        }
    }

    #[test]
    fn announcements_of_this_master_are_read() {
        let switched = parse(SWITCHED, "limiter 10.0.0.1 6379 10.0.0.2 6380", "limiter").unwrap();
        assert_eq!(switched.master, at("10.0.0.2", 6380));
        assert!(switched.switched);
        let promoting = parse(
            PROMOTING,
            "slave 10.0.0.2:6380 10.0.0.2 6380 @ limiter 10.0.0.1 6379",
            "limiter",
        )
        .unwrap();
        assert_eq!(promoting.master, at("10.0.0.2", 6380));
        assert!(!promoting.switched);
    }

    #[test]
    fn announcements_of_other_masters_or_of_another_shape_are_not() {
        assert_eq!(
            parse(SWITCHED, "other 10.0.0.1 6379 10.0.0.2 6380", "limiter"),
            None
        );
        assert_eq!(
            parse(
                PROMOTING,
                "slave 10.0.0.2:6380 10.0.0.2 6380 @ other 10.0.0.1 6379",
                "limiter"
            ),
            None
        );
        assert_eq!(parse(SWITCHED, "limiter 10.0.0.1 6379", "limiter"), None);
        assert_eq!(
            parse(SWITCHED, "limiter 10.0.0.1 6379 10.0.0.2 port", "limiter"),
            None
        );
        assert_eq!(
            parse("+sdown", "master limiter 10.0.0.1 6379", "limiter"),
            None
        );
    }

    #[test]
    fn a_followed_announcement_is_pending_no_more() {
        let announcements = Announcements::new("limiter");
        let announced = parse(SWITCHED, "limiter 10.0.0.1 6379 10.0.0.2 6380", "limiter").unwrap();
        *announcements.lock() = Some(Latest {
            announced: announced.clone(),
            followed: false,
        });
        assert_eq!(announcements.pending().as_ref(), Some(&announced));
        announcements.followed(&announced);
        assert_eq!(announcements.pending(), None);
    }
}
