//! The Redis store's slots of requests in flight: a sorted set per caller and limit,
//! scored by each slot's expiry on Redis's clock, changed by lua/in_flight.lua.

use std::sync::LazyLock;

use redis::Script;

use super::backend::RedisBackend;
use crate::store::backend::StoreError;
use crate::store::caller::CallerKey;
use crate::store::future::StoreFuture;
use crate::store::slots::{Slot, SlotStore};

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
        slot: &Slot,
        op: &str,
        rest: &[u64],
    ) -> StoreFuture<Result<T, StoreError>> {
        let keys = [self.slots_key(&slot.caller, &slot.name)];
        let mut args = vec![
            op.as_bytes().to_vec(),
            format!("{:032x}", slot.id).into_bytes(),
        ];
        args.extend(rest.iter().map(|n| n.to_string().into_bytes()));
        let connection = self.connection().clone();
        let timeout = self.response_timeout();
        StoreFuture::boxed(async move {
            connection
                .run(&SLOTS, SLOTS_SOURCE, &keys, &args, timeout)
                .await
        })
    }
}

/// A slot's time to live as Redis takes it: whole milliseconds, at least one.
fn ttl_ms(slot: &Slot) -> u64 {
    u64::try_from(slot.ttl.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl SlotStore for RedisBackend {
    fn acquire(&self, slot: &Slot, limit: u64) -> StoreFuture<Result<Option<u64>, StoreError>> {
        let reply = self.run_slots::<Vec<i64>>(slot, "acquire", &[ttl_ms(slot), limit]);
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

    fn renew(&self, slot: &Slot) -> StoreFuture<Result<bool, StoreError>> {
        let reply = self.run_slots::<i64>(slot, "renew", &[ttl_ms(slot)]);
        StoreFuture::boxed(async move { Ok(reply.await? == 1) })
    }

    fn release(&self, slot: &Slot) -> StoreFuture<Result<(), StoreError>> {
        let reply = self.run_slots::<i64>(slot, "release", &[]);
        StoreFuture::boxed(async move { reply.await.map(|_| ()) })
    }
}
