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

/// A limiter's mode, shared by its clones: switched on a running service by
/// [`Limiter::set_mode`](crate::Limiter::set_mode), read on every decision.
#[derive(Clone, Debug, Default)]
pub(crate) struct ModeSwitch {
    mode: Arc<AtomicU8>,
}

impl ModeSwitch {
    pub(crate) fn new(mode: Mode) -> Self {
        Self {
            mode: Arc::new(AtomicU8::new(mode.as_u8())),
        }
    }

    pub(crate) fn get(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Relaxed))
    }

    pub(crate) fn set(&self, mode: Mode) {
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
