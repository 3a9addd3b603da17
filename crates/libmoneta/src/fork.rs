//! `fork` (Moneta-D §2.2: the library keeps POSIX semantics): a child process gets its own
//! channel on first use, keeps its open files, and never touches its parent's tags.
//!
//! - Before a fork (`pthread_atfork` prepare), every connection of the process that has open
//!   files asks the daemon for a *bundle*: a copy of all its handles that the child can claim
//!   (`OP_FS_FORK`). The daemon answers with a bundle id, a secret and the write end of a pipe;
//!   the ticket is kept in the forking thread.
//! - After the fork, the parent closes its copy of the pipe; the child bumps the process's
//!   *fork generation* and moves the tickets into their connections. It makes no system call
//!   and takes no lock a thread of the parent could have held.
//! - A connection whose generation is not the process's is stale: its first use in the child
//!   detaches the parent's channel (its descriptors and mapping are replaced by inert ones),
//!   connects anew and claims the bundle (`OP_FS_INHERIT`), which maps each of the parent's
//!   handles to one of its own; open files rebind to theirs when next used.
//! - A child that never uses Moneta never claims: the bundle is released when the last copy of
//!   the pipe's write end closes (the child exits or executes another program).
//!
//! A file opened by another thread between the prepare step and the fork is not in the bundle;
//! in the child it fails with `EBADF`.

use std::cell::{RefCell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once, Weak};
use std::time::Duration;

use crate::file::Inner;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static FORKS_MADE: AtomicU64 = AtomicU64::new(0);

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

/// What a child needs to claim its parent's handles.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    pub(crate) bundle: u64,
    pub(crate) secret: [u64; 2],
    /// The pipe's write end (raw: closed explicitly, once, by whichever process holds it).
    pub(crate) pipe: i32,
}

impl Ticket {
    pub(crate) fn close_pipe(&self) {
        // SAFETY: the descriptor came from the daemon's reply and is closed once.
        unsafe { libc::syscall(libc::SYS_close, self.pipe) };
    }
}

static REGISTRY: GenLock<Vec<Weak<Inner>>> = GenLock::new(Vec::new());

thread_local! {
    /// Tickets taken by this thread's fork in progress.
    static FORKING: RefCell<Vec<(Arc<Inner>, Ticket)>> = const { RefCell::new(Vec::new()) };
}

/// Registers a connection for the fork handlers (installed with the first one).
pub(crate) fn register(inner: &Arc<Inner>) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: the handlers are plain functions that live as long as the process.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if r != 0 {
            eprintln!("libmoneta: pthread_atfork failed ({r}); forked children lose their files");
        }
    });
    let mut reg = REGISTRY.lock();
    reg.retain(|w| w.strong_count() > 0);
    reg.push(Arc::downgrade(inner));
}

extern "C" fn prepare() {
    FORKS_MADE.fetch_add(1, Ordering::AcqRel);
    let live: Vec<Arc<Inner>> = REGISTRY.lock().iter().filter_map(|w| w.upgrade()).collect();
    let mut tickets = Vec::new();
    for inner in live {
        if let Some(t) = inner.prepare_fork() {
            tickets.push((inner, t));
        }
    }
    FORKING.with(|f| *f.borrow_mut() = tickets);
}

extern "C" fn parent() {
    FORKING.with(|f| {
        for (_, t) in f.borrow_mut().drain(..) {
            t.close_pipe();
        }
    });
}

/// The descriptors the library holds now (connections and position segments), so that a
/// program closing "every other descriptor" (`closefrom`, `close_range`) can leave them.
pub fn own_descriptors() -> Vec<i32> {
    let mut v = Vec::new();
    for inner in REGISTRY.lock().iter().filter_map(|w| w.upgrade()) {
        v.extend(inner.descriptors());
    }
    v.extend(crate::position::descriptors());
    v
}

extern "C" fn child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // The parent's connections are no concern of the child's: make them inert now, so that
    // the parent's session ends when the parent goes even while this child lives on. (The
    // registry lock cannot be held by a thread of this process: a holder from the parent's
    // generation is taken over.)
    for inner in REGISTRY.lock().iter().filter_map(|w| w.upgrade()) {
        inner.detach_current();
    }
    FORKING.with(|f| {
        for (inner, t) in f.borrow_mut().drain(..) {
            inner.set_ticket(t);
        }
    });
}
