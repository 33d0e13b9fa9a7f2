//! Enforce, shadow or off: switchable on a running service.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// How a limiter treats its decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Refuse what the policies refuse.
    #[default]
    Enforce,
    /// Decide and count as usual (store calls, failure policy, metrics), but refuse nothing:
    /// would-be refusals are counted as `shadow_limited` / `shadow_unavailable`. For
    /// rolling a limit out, or watching what a failure policy would do during an outage.
    Shadow,
    /// No decisions: every request passes, no store call, nothing counted. The kill switch.
    Off,
}

impl Mode {
    /// A short, stable name for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Mode::Shadow,
            2 => Mode::Off,
            _ => Mode::Enforce,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Mode::Enforce => 0,
            Mode::Shadow => 1,
            Mode::Off => 2,
        }
    }
}

/// A handle that switches running limiters between [`Mode`]s without rebuilding the
/// router. Clones control the same limiters; one switch may serve several limiters (a
/// kill switch for all of a service's limits).
///
/// ```
/// use tollgate::{Caller, Limiter, Policy, Quota, reload::{Mode, ModeSwitch}};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let switch = ModeSwitch::new(Mode::Enforce);
/// let limiter = Limiter::builder()
///     .policy(Policy::sliding_window("per-second", Quota::per_second(1)))
///     .mode(switch.clone())
///     .build();
/// let acme = Caller::new("acme");
/// assert!(limiter.check(&acme).await.is_allowed());
/// assert!(!limiter.check(&acme).await.is_allowed());
/// switch.set(Mode::Shadow); // e.g. from an admin endpoint
/// assert!(limiter.check(&acme).await.is_allowed());
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ModeSwitch {
    mode: Arc<AtomicU8>,
}

impl ModeSwitch {
    /// A switch set to `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode: Arc::new(AtomicU8::new(mode.as_u8())),
        }
    }

    /// The current mode.
    pub fn get(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    /// Switches every limiter that shares this handle; takes effect on the next request.
    pub fn set(&self, mode: Mode) {
        let previous = Mode::from_u8(self.mode.swap(mode.as_u8(), Ordering::Relaxed));
        if previous != mode {
            tracing::warn!(
                from = previous.as_str(),
                to = mode.as_str(),
                "rate limit mode switched"
            );
        }
    }
}
