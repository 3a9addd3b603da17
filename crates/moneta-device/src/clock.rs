//! Time as the engine sees it, behind a trait so a test or a simulation can supply its own.

use std::time::Instant;

/// A monotonic source of nanoseconds.
pub trait Clock: Send + 'static {
    /// Nanoseconds since an arbitrary fixed origin; never decreases.
    fn now_ns(&self) -> u64;
}

/// The machine's monotonic clock.
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

/// The processor's time-stamp counter, scaled to nanoseconds: a quarter of the cost of the
/// monotonic clock on virtual machines, where that is measurable on the data path. Used only
/// where the counter is invariant (`constant_tsc` and `nonstop_tsc`).
#[cfg(target_arch = "x86_64")]
pub struct TscClock {
    base: u64,
    /// Nanoseconds per tick, as a 32.32 fixed-point number.
    mult: u64,
}

#[cfg(target_arch = "x86_64")]
impl TscClock {
    /// Calibrates the counter against the monotonic clock (about 20 ms); `None` where the
    /// counter is not invariant.
    pub fn new() -> Option<Self> {
        let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let flags = info.lines().find(|l| l.starts_with("flags"))?;
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if !has("constant_tsc") || !has("nonstop_tsc") {
            return None;
        }
        let (t0, c0) = (Instant::now(), rdtsc());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (t1, c1) = (Instant::now(), rdtsc());
        let ticks = c1.checked_sub(c0).filter(|&t| t > 0)?;
        let ns = (t1 - t0).as_nanos() as u64;
        let mult = u64::try_from((u128::from(ns) << 32) / u128::from(ticks)).ok()?;
        Some(Self {
            base: rdtsc(),
            mult,
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64; it reads a counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "x86_64")]
impl Clock for TscClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        let ticks = rdtsc().saturating_sub(self.base);
        ((u128::from(ticks) * u128::from(self.mult)) >> 32) as u64
    }
}

/// The cheapest trustworthy clock of this machine: the TSC where it is invariant, otherwise the
/// monotonic clock.
pub enum SystemClock {
    /// Time-stamp counter.
    #[cfg(target_arch = "x86_64")]
    Tsc(TscClock),
    /// `CLOCK_MONOTONIC`.
    Monotonic(MonotonicClock),
}

impl SystemClock {
    /// Picks and calibrates the clock.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = TscClock::new() {
            return SystemClock::Tsc(t);
        }
        SystemClock::Monotonic(MonotonicClock::new())
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            SystemClock::Tsc(t) => t.now_ns(),
            SystemClock::Monotonic(m) => m.now_ns(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_tracks_the_monotonic_clock() {
        let c = SystemClock::best();
        let (a, t) = (c.now_ns(), Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (b, real) = (c.now_ns(), t.elapsed().as_nanos() as u64);
        assert!(b >= a);
        let diff = (b - a).abs_diff(real);
        assert!(diff < real / 10, "clock drifted {diff} ns over {real} ns");
    }
}
