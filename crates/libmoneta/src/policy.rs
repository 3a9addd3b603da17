//! How a request waits for its completion (Moneta-D §4.4): spin on the DMA completion for small
//! requests, where a sleep and wake-up would cost more than the transfer, and sleep on a futex
//! for large ones, where spinning would waste a core for the whole transfer.

use moneta_abi::Completion;

/// Requests of at most this many bytes spin by default; larger ones sleep. Moneta-D found the
/// crossover at 8 KiB on its hardware, where a 8 KiB transfer took as long as a sleep and
/// wake-up. Here a futex wake-up of a sleeping thread costs 10-40 µs (a virtual CPU has to be
/// woken), while the device moves 256 KiB in about 35 µs: with one thread spinning wins at every
/// size, and with four threads on two cores sleeping starts to win between 128 KiB and 512 KiB
/// (`docs/performance.md`, "Completion: the crossover").
pub const DEFAULT_SPIN_MAX: usize = 256 * 1024;

/// Environment variable that overrides the default policy: `spin`, `forward`, `sleep`, or
/// `auto` / `auto:BYTES` (spin up to BYTES, sleep above).
pub const ENV_COMPLETION: &str = "MONETA_COMPLETION";

/// A completion policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Every request waits this way.
    Fixed(Completion),
    /// Spin (DMA completion) for requests of at most `spin_max` bytes, sleep above.
    Auto {
        /// Largest request that spins.
        spin_max: usize,
    },
}

impl Default for Policy {
    fn default() -> Self {
        Policy::Auto {
            spin_max: DEFAULT_SPIN_MAX,
        }
    }
}

impl Policy {
    /// The completion mode for a request of `len` bytes.
    #[inline]
    pub fn mode(self, len: usize) -> Completion {
        match self {
            Policy::Fixed(c) => c,
            Policy::Auto { spin_max } if len <= spin_max => Completion::Dma,
            Policy::Auto { .. } => Completion::Sleep,
        }
    }

    /// Parses a policy as [`ENV_COMPLETION`] spells it.
    pub fn parse(s: &str) -> Option<Policy> {
        match s.trim() {
            "spin" | "dma" => Some(Policy::Fixed(Completion::Dma)),
            "forward" => Some(Policy::Fixed(Completion::Forward)),
            "sleep" => Some(Policy::Fixed(Completion::Sleep)),
            "auto" => Some(Policy::default()),
            other => other
                .strip_prefix("auto:")
                .and_then(|n| n.parse().ok())
                .map(|spin_max| Policy::Auto { spin_max }),
        }
    }

    /// The policy [`ENV_COMPLETION`] asks for, or the default. An unparsable value is ignored
    /// with a message on standard error, once per process.
    pub fn from_env() -> Policy {
        static WARNED: std::sync::Once = std::sync::Once::new();
        crate::env_setting(
            ENV_COMPLETION,
            Policy::parse,
            "spin, forward, sleep, auto or auto:BYTES",
            &WARNED,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_choose() {
        assert_eq!(Policy::parse("spin"), Some(Policy::Fixed(Completion::Dma)));
        assert_eq!(
            Policy::parse(" sleep "),
            Some(Policy::Fixed(Completion::Sleep))
        );
        assert_eq!(
            Policy::parse("auto:4096"),
            Some(Policy::Auto { spin_max: 4096 })
        );
        assert_eq!(Policy::parse("auto:x"), None);
        assert_eq!(Policy::parse("fast"), None);
        let p = Policy::default();
        assert_eq!(p.mode(512), Completion::Dma);
        assert_eq!(p.mode(DEFAULT_SPIN_MAX), Completion::Dma);
        assert_eq!(DEFAULT_SPIN_MAX, 256 * 1024);
        assert_eq!(p.mode(DEFAULT_SPIN_MAX + 1), Completion::Sleep);
        assert_eq!(
            Policy::Fixed(Completion::Forward).mode(1 << 20),
            Completion::Forward
        );
    }
}
