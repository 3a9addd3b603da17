//! Stage timing of reads and writes, for latency breakdowns (Moneta-D's Figure 3).
//!
//! Off by default: the data path then pays one relaxed load per request. [`enable`] turns it on
//! for the whole process; from then on every read or write that `File` serves with one command
//! (a request inside one extent and one DMA slice: the common small request) adds the time of
//! each of its stages to the calling thread's sums, which [`take`] returns and resets:
//!
//! - `lookup`: from the call to a device address (argument checks, the handle, the map);
//! - `submit`: taking a tag and writing the command and the doorbell;
//! - `copy`: between the caller's buffer and the DMA buffer;
//! - `wait`: from the doorbell to the completion seen, of which the device reports `device`
//!   (its own time from seeing the doorbell to publishing the completion);
//! - `finish`: releasing the tag and returning.
//!
//! Stamps come from the processor's time-stamp counter where it is invariant (a few
//! nanoseconds each), else from the monotonic clock.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);

/// Nanoseconds per stamp unit, as a 32.32 fixed-point number (set by [`enable`]).
static MULT: AtomicU64 = AtomicU64::new(1 << 32);

/// Whether stamps are TSC ticks (else nanoseconds of the monotonic clock).
static TSC: AtomicBool = AtomicBool::new(false);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// Time spent in each stage, summed over `ops` requests (nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// Requests timed.
    pub ops: u64,
    /// Argument checks and the extent lookup.
    pub lookup_ns: u64,
    /// Tag and command submission.
    pub submit_ns: u64,
    /// Copies between the caller's buffer and the DMA buffer.
    pub copy_ns: u64,
    /// Doorbell to completion seen.
    pub wait_ns: u64,
    /// Of `wait_ns`, the device's own time (as it reports in the tag status entry).
    pub device_ns: u64,
    /// Tag release and return.
    pub finish_ns: u64,
}

impl Breakdown {
    /// Adds `o`'s sums to this one's.
    pub fn add(&mut self, o: &Breakdown) {
        self.ops += o.ops;
        self.lookup_ns += o.lookup_ns;
        self.submit_ns += o.submit_ns;
        self.copy_ns += o.copy_ns;
        self.wait_ns += o.wait_ns;
        self.device_ns += o.device_ns;
        self.finish_ns += o.finish_ns;
    }
}

thread_local! {
    static SUMS: Cell<Breakdown> = const { Cell::new(Breakdown {
        ops: 0, lookup_ns: 0, submit_ns: 0, copy_ns: 0, wait_ns: 0, device_ns: 0, finish_ns: 0,
    }) };
}

/// Turns stage timing on or off for the process (the first call calibrates the counter, about
/// 20 ms).
pub fn enable(on: bool) {
    static CALIBRATED: OnceLock<()> = OnceLock::new();
    if on {
        CALIBRATED.get_or_init(calibrate);
    }
    ON.store(on, Ordering::Release);
}

/// Whether stage timing is on.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// This thread's sums since the last call, in nanoseconds; resets them.
pub fn take() -> Breakdown {
    let raw = SUMS.with(|s| s.replace(Breakdown::default()));
    let m = MULT.load(Ordering::Relaxed);
    let ns = |t: u64| ((u128::from(t) * u128::from(m)) >> 32) as u64;
    Breakdown {
        ops: raw.ops,
        lookup_ns: ns(raw.lookup_ns),
        submit_ns: ns(raw.submit_ns),
        copy_ns: ns(raw.copy_ns),
        wait_ns: ns(raw.wait_ns),
        // The device reports nanoseconds already.
        device_ns: raw.device_ns,
        finish_ns: ns(raw.finish_ns),
    }
}

fn calibrate() {
    #[cfg(target_arch = "x86_64")]
    {
        let invariant = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                let flags = info.lines().find(|l| l.starts_with("flags"))?.to_string();
                let has = |f: &str| flags.split_whitespace().any(|x| x == f);
                Some(has("constant_tsc") && has("nonstop_tsc"))
            })
            .unwrap_or(false);
        if invariant {
            let (t0, c0) = (Instant::now(), rdtsc());
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (t1, c1) = (Instant::now(), rdtsc());
            let ns = (t1 - t0).as_nanos();
            if let Some(ticks) = c1.checked_sub(c0).filter(|&t| t > 0) {
                if let Ok(m) = u64::try_from((ns << 32) / u128::from(ticks)) {
                    MULT.store(m, Ordering::Relaxed);
                    TSC.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
    epoch();
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86-64; it reads a counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// A stamp in the unit [`take`] converts from; never 0 while tracing is on.
#[inline]
pub(crate) fn stamp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if TSC.load(Ordering::Relaxed) {
        return rdtsc().max(1);
    }
    (epoch().elapsed().as_nanos() as u64).max(1)
}

/// Adds one request's stages to this thread's sums: every field but `device_ns` (already
/// nanoseconds) in stamp units.
#[inline(never)]
pub(crate) fn record(r: &Breakdown) {
    SUMS.with(|c| {
        let mut b = c.get();
        b.add(r);
        c.set(b);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_advance_and_sums_reset() {
        enable(true);
        let a = stamp();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = stamp();
        assert!(b > a);
        record(&Breakdown {
            ops: 1,
            submit_ns: b - a,
            device_ns: 7,
            ..Breakdown::default()
        });
        let t = take();
        assert_eq!(t.ops, 1);
        // Two milliseconds, whatever the unit of the stamps.
        assert!(
            (1_500_000..200_000_000).contains(&t.submit_ns),
            "{}",
            t.submit_ns
        );
        assert_eq!(t.device_ns, 7);
        assert_eq!(take(), Breakdown::default());
        enable(false);
    }
}
