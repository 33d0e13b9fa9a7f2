//! How the Redis store's connections are made and made again: the timeouts every one of
//! them is made with, and the jittered, doubling pause between failed attempts.

use std::time::Duration;

use redis::AsyncConnectionConfig;

use crate::store::random::RandomSource;

/// How connections are made and watched.
#[derive(Clone, Copy, Debug)]
pub(super) struct LinkConfig {
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) reconnect_min: Duration,
    pub(super) reconnect_max: Duration,
}

impl LinkConfig {
    pub(super) fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// The pause between failed attempts, from the minimum of reconnection up.
    pub(super) fn backoff(&self) -> Backoff {
        Backoff::new(self.reconnect_min, self.reconnect_max)
    }
}

/// The jittered, doubling pause between failed connection attempts.
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    random: RandomSource,
}

impl Backoff {
    pub(super) fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
            random: RandomSource::new(),
        }
    }

    /// Between half the current ceiling and all of it; the ceiling doubles up to the
    /// maximum.
    pub(super) fn pause(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        ceiling.mul_f64(0.5 + 0.5 * self.random.next_f64())
    }

    pub(super) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_is_jittered() {
        let mut backoff = Backoff::new(Duration::from_millis(25), Duration::from_millis(250));
        let ceilings = [25, 50, 100, 200, 250, 250, 250];
        for ceiling in ceilings {
            let pause = backoff.pause();
            let ceiling = Duration::from_millis(ceiling);
            assert!(
                pause >= ceiling / 2 && pause <= ceiling,
                "{pause:?} for {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.pause() <= Duration::from_millis(25));
    }
}
