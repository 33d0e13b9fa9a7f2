//! The Redis store's slots of requests in flight: a sorted set per caller and limit,
//! scored by each slot's expiry on Redis's clock, changed by lua/in_flight.lua.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::backend::RedisBackend;
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;
use crate::store::slots::SlotStore;

const SLOTS_SOURCE: &str = concat!(
    include_str!("../../../lua/clock.lua"),
    include_str!("../../../lua/in_flight.lua"),
);

static SLOTS: LazyLock<Script> = LazyLock::new(|| Script::new(SLOTS_SOURCE));

impl RedisBackend {
    /// The Redis key that holds `caller`'s slots of the in-flight limit `name`:
    /// `<prefix>:{<caller>}:<name>:in-flight`, in the slot of the caller's counters.
    ///
    /// ```
    /// use tollgate::RedisBackend;
    /// use tollgate::store::CallerKey;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = RedisBackend::builder("redis://127.0.0.1:6380/").build().unwrap();
    /// assert_eq!(store.slots_key(&CallerKey::new("acme"), "reports"), b"rl:{acme}:reports:in-flight");
    /// # }
    /// ```
    pub fn slots_key(&self, caller: &CallerKey, name: &str) -> Vec<u8> {
        let mut suffix = Vec::with_capacity(name.len() + 10);
        suffix.extend_from_slice(name.as_bytes());
        suffix.extend_from_slice(b":in-flight");
        self.tagged_key(caller, &suffix)
    }

    fn run_slots<T: redis::FromRedisValue + Send + 'static>(
        &self,
        caller: &CallerKey,
        name: &str,
        args: Vec<Vec<u8>>,
    ) -> StoreFuture<Result<T, StoreError>> {
        let keys = [self.slots_key(caller, name)];
        let connection = self.connection().clone();
        let timeout = self.response_timeout();
        StoreFuture::boxed(async move {
            connection
                .run(&SLOTS, SLOTS_SOURCE, &keys, &args, timeout)
                .await
        })
    }
}

fn args(op: &str, slot: u128, rest: &[u64]) -> Vec<Vec<u8>> {
    let mut args = vec![op.as_bytes().to_vec(), format!("{slot:032x}").into_bytes()];
    args.extend(rest.iter().map(|n| n.to_string().into_bytes()));
    args
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl SlotStore for RedisBackend {
    fn acquire(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        limit: u64,
        ttl: Duration,
    ) -> StoreFuture<Result<Option<u64>, StoreError>> {
        let reply =
            self.run_slots::<Vec<i64>>(caller, name, args("acquire", slot, &[ttl_ms(ttl), limit]));
        StoreFuture::boxed(async move {
            match reply.await?.as_slice() {
                [1, held] => Ok(Some(u64::try_from(*held).unwrap_or(0))),
                [0, _] => Ok(None),
                other => Err(StoreError::other(format!(
                    "the slots script answered {other:?} to an acquire"
                ))),
            }
        })
    }

    fn renew(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
        ttl: Duration,
    ) -> StoreFuture<Result<bool, StoreError>> {
        let reply = self.run_slots::<i64>(caller, name, args("renew", slot, &[ttl_ms(ttl)]));
        StoreFuture::boxed(async move { Ok(reply.await? == 1) })
    }

    fn release(
        &self,
        caller: &CallerKey,
        name: &str,
        slot: u128,
    ) -> StoreFuture<Result<(), StoreError>> {
        let reply = self.run_slots::<i64>(caller, name, args("release", slot, &[]));
        StoreFuture::boxed(async move { reply.await.map(|_| ()) })
    }
}
