//! What the machine's cores cost each other, measured beside the figures that depend on it.
//!
//! A request served by the device's poller crosses from the client's core to the poller's and
//! back: the command's cache line one way, the completion and the data the other. How far
//! apart the two cores are decides a floor under every such request that no code on either
//! side can lower. On a virtual machine the two vCPUs may share a core complex or sit on
//! different ones (or sockets), and the floor differs by several times between the two, so the
//! bench measures it on the spot: two threads pinned to the first two CPUs this process may
//! use bounce one cache line (the round trip of a doorbell and its completion), then hand
//! 4 KiB written on one core to a reader on the other (what a 4 KiB read through the DMA
//! buffer must move, plus the two hops).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The cost of talking across two cores.
#[derive(Debug, Clone)]
pub struct CoreToCore {
    /// The two CPUs measured.
    pub cpus: [usize; 2],
    /// One cache line there and back, median of the rounds, in nanoseconds.
    pub line_round_trip_ns: u64,
    /// A 4 KiB hand-off with a round trip of signalling, median of the rounds.
    pub handoff_4k_ns: u64,
}

/// Round trips timed for the cache-line figure.
const LINE_TRIPS: u64 = 200_000;

/// Hand-offs timed for the 4 KiB figure.
const HANDOFFS: u64 = 20_000;

/// Rounds of each; the median round is reported.
const ROUNDS: usize = 5;

fn pin(cpu: usize) -> rustix::io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set)
}

/// The first two CPUs this thread may run on; `None` on a single-CPU machine.
fn two_cpus() -> Option<[usize; 2]> {
    let set = sched_getaffinity(None).ok()?;
    let mut it = (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c));
    Some([it.next()?, it.next()?])
}

/// Runs `here` on `cpus[0]` and `there` on `cpus[1]`, both on fresh threads so that the
/// caller's own affinity is left alone; returns what `here` returns.
fn pair<T: Send + 'static>(
    cpus: [usize; 2],
    here: impl FnOnce() -> T + Send + 'static,
    there: impl FnOnce() + Send + 'static,
) -> Option<T> {
    let t = std::thread::spawn(move || {
        if pin(cpus[1]).is_ok() {
            there();
        }
    });
    let h = std::thread::spawn(move || pin(cpus[0]).ok().map(|()| here()));
    let r = h.join().ok().flatten();
    let _ = t.join();
    r
}

/// Median of `ROUNDS` rounds of `LINE_TRIPS` cache-line round trips, per trip.
fn line_round_trip(cpus: [usize; 2]) -> Option<u64> {
    line_trips(cpus, ROUNDS as u64, LINE_TRIPS)
}

/// One quick look at the first two usable CPUs: `trips` cache-line round trips (a few
/// milliseconds for 5,000), per trip, for telling which state the host is in between two
/// measurements; `None` with fewer than two CPUs or when pinning is refused.
pub fn line_probe_ns(trips: u64) -> Option<u64> {
    line_trips(two_cpus()?, 1, trips.max(1))
}

/// Median of `rounds` rounds of `trips` cache-line round trips, per trip.
fn line_trips(cpus: [usize; 2], rounds: u64, trips: u64) -> Option<u64> {
    let flag = Arc::new(AtomicU64::new(0));
    let f = flag.clone();
    let mut per = pair(
        cpus,
        move || {
            let mut per = Vec::new();
            for r in 0..rounds {
                let t = std::time::Instant::now();
                for i in 0..trips {
                    let k = 2 * (r * trips + i);
                    flag.store(k + 1, Ordering::Release);
                    while flag.load(Ordering::Acquire) != k + 2 {
                        std::hint::spin_loop();
                    }
                }
                per.push(t.elapsed().as_nanos() as u64 / trips);
            }
            flag.store(u64::MAX, Ordering::Release);
            per
        },
        move || loop {
            let v = f.load(Ordering::Acquire);
            if v == u64::MAX {
                return;
            }
            if v % 2 == 1 {
                f.store(v + 1, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        },
    )?;
    per.sort_unstable();
    per.get(per.len() / 2).copied()
}

/// Median of `ROUNDS` rounds of 4 KiB hand-offs: the far core writes the page when asked,
/// this core reads all of it once told.
fn handoff_4k(cpus: [usize; 2]) -> Option<u64> {
    const WORDS: usize = 4096 / 8;
    let page: Arc<Vec<AtomicU64>> = Arc::new((0..WORDS).map(|_| AtomicU64::new(0)).collect());
    let flag = Arc::new(AtomicU64::new(0));
    let (p, f) = (page.clone(), flag.clone());
    let rounds = ROUNDS as u64;
    let mut per = pair(
        cpus,
        move || {
            let mut per = Vec::new();
            let mut sum = 0u64;
            for r in 0..rounds {
                let t = std::time::Instant::now();
                for i in 0..HANDOFFS {
                    let k = 2 * (r * HANDOFFS + i);
                    flag.store(k + 1, Ordering::Release);
                    while flag.load(Ordering::Acquire) != k + 2 {
                        std::hint::spin_loop();
                    }
                    for w in page.iter() {
                        sum = sum.wrapping_add(w.load(Ordering::Relaxed));
                    }
                }
                per.push(t.elapsed().as_nanos() as u64 / HANDOFFS);
            }
            flag.store(u64::MAX, Ordering::Release);
            std::hint::black_box(sum);
            per
        },
        move || loop {
            let v = f.load(Ordering::Acquire);
            if v == u64::MAX {
                return;
            }
            if v % 2 == 1 {
                for w in p.iter() {
                    w.store(v, Ordering::Relaxed);
                }
                f.store(v + 1, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        },
    )?;
    per.sort_unstable();
    per.get(per.len() / 2).copied()
}

/// Measures the first two usable CPUs (about half a second); `None` with fewer than two or
/// when pinning is refused.
pub fn core_to_core() -> Option<CoreToCore> {
    let cpus = two_cpus()?;
    Some(CoreToCore {
        cpus,
        line_round_trip_ns: line_round_trip(cpus)?,
        handoff_4k_ns: handoff_4k(cpus)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_two_cores_when_there_are_two() {
        let Some(cpus) = two_cpus() else {
            // A single-CPU machine has nothing to measure, and says so with `None`.
            assert!(core_to_core().is_none());
            return;
        };
        let c = core_to_core().expect("two CPUs can be measured");
        assert_eq!(c.cpus, cpus);
        assert_ne!(c.cpus[0], c.cpus[1]);
        assert!(c.line_round_trip_ns > 0);
        // Moving a page and signalling both ways costs at least the signalling.
        assert!(c.handoff_4k_ns >= c.line_round_trip_ns / 2);
    }
}
