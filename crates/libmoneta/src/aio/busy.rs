//! A request's busy flag: a futex lock taken by whoever works on the request.

use std::sync::atomic::{AtomicU32, Ordering};

/// A request's busy flag: whoever holds it (the request's own calls, or a thread reaping it,
/// `Channel::reap_others`) is the only one touching the state. A thread that finds it taken
/// spins briefly, then sleeps until the holder gives it back, rather than yielding in a loop:
/// each `sched_yield` puts the thread behind every other runnable thread of the process, and
/// with more threads than CPUs an owner yielding for its request waited milliseconds.
pub(super) struct Busy(AtomicU32);

/// [`Busy`]: free, held, held with a thread asleep waiting for it.
const BUSY_FREE: u32 = 0;
const BUSY_HELD: u32 = 1;
const BUSY_WAITED: u32 = 2;

/// Spins of a thread waiting for a busy flag before it sleeps.
const BUSY_SPINS: u32 = 64;

impl Busy {
    pub(super) const fn new() -> Busy {
        Busy(AtomicU32::new(BUSY_FREE))
    }

    pub(super) fn try_take(&self) -> bool {
        self.0
            .compare_exchange(BUSY_FREE, BUSY_HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes the flag, waiting for its holder if need be (a futex lock: Drepper's "Futexes
    /// are tricky", mutex 2).
    pub(super) fn take(&self) {
        for _ in 0..BUSY_SPINS {
            if self.try_take() {
                return;
            }
            std::hint::spin_loop();
        }
        while self.0.swap(BUSY_WAITED, Ordering::Acquire) != BUSY_FREE {
            let _ = rustix::thread::futex::wait(
                &self.0,
                rustix::thread::futex::Flags::PRIVATE,
                BUSY_WAITED,
                None,
            );
        }
    }

    pub(super) fn give(&self) {
        if self.0.swap(BUSY_FREE, Ordering::Release) == BUSY_WAITED {
            let _ = rustix::thread::futex::wake(&self.0, rustix::thread::futex::Flags::PRIVATE, 1);
        }
    }
}
