//! The process's fork generation and a lock a forked child can always take: the ground the
//! fork handling ([`crate::fork`]) and the shared file positions stand on.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(0);
pub(crate) static FORKS_MADE: AtomicU64 = AtomicU64::new(0);

/// The process's fork generation: 0 in a process that was not forked from one using Moneta,
/// one more in each child than in its parent.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Forks this process has made (counted before each fork).
#[inline]
pub(crate) fn forks_made() -> u64 {
    FORKS_MADE.load(Ordering::Acquire)
}

/// Handovers of the process's open files to a next program image made so far
/// ([`crate::Moneta::handover`]): like a fork, each lets another process come to share the
/// open files' descriptions.
static HANDOVERS: AtomicU64 = AtomicU64::new(0);

/// Counts a handover of the open files to a next program image.
pub(crate) fn note_handover() {
    HANDOVERS.fetch_add(1, Ordering::AcqRel);
}

/// Forks made (by this process, or by its parent before it) plus handovers of the open files
/// to a next program image: it moves whenever another process may come to share the open
/// files' descriptions.
pub(crate) fn sharing_stamp() -> u64 {
    forks_made() + HANDOVERS.load(Ordering::Acquire)
}

/// A mutex that a forked child can always take: the holder records its fork generation, and a
/// holder of an older generation was a thread of the parent, which does not exist in the
/// child. (What it protected may have been left half-updated by that thread; POSIX makes the
/// same reservation for any state shared with threads across a fork.)
pub(crate) struct GenLock<T> {
    word: AtomicU64,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialized by `word`.
unsafe impl<T: Send> Sync for GenLock<T> {}
// SAFETY: as for a mutex.
unsafe impl<T: Send> Send for GenLock<T> {}

/// A held [`GenLock`].
pub(crate) struct GenGuard<'a, T> {
    lock: &'a GenLock<T>,
}

impl<T> GenLock<T> {
    pub(crate) const fn new(v: T) -> GenLock<T> {
        GenLock {
            word: AtomicU64::new(0),
            data: UnsafeCell::new(v),
        }
    }

    pub(crate) fn lock(&self) -> GenGuard<'_, T> {
        let mine = generation() + 1;
        let mut spins = 0u32;
        loop {
            let cur = self.word.load(Ordering::Relaxed);
            if (cur == 0 || cur != mine)
                && self
                    .word
                    .compare_exchange(cur, mine, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return GenGuard { lock: self };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

impl<T> Deref for GenGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for GenGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for GenGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.word.store(0, Ordering::Release);
    }
}
