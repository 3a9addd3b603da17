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

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once, Weak};

pub use crate::generation::generation;
use crate::generation::{GenLock, FORKS_MADE, GENERATION};

/// What the fork handlers ask of each connection of the process.
pub(crate) trait Forkable: Send + Sync {
    /// Before a fork: a bundle of the connection's handles for the child, if it has any.
    fn prepare_fork(&self) -> Option<Ticket>;
    /// In the child, right after the fork: makes the parent's channel inert (only system
    /// calls: no lock, no allocation).
    fn detach_current(&self);
    /// In the child, right after the fork: the bundle to claim.
    fn set_ticket(&self, t: Ticket);
    /// The descriptors the connection holds now.
    fn descriptors(&self) -> Vec<i32>;
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

static REGISTRY: GenLock<Vec<Weak<dyn Forkable>>> = GenLock::new(Vec::new());

thread_local! {
    /// Tickets taken by this thread's fork in progress.
    static FORKING: RefCell<Vec<(Arc<dyn Forkable>, Ticket)>> = const { RefCell::new(Vec::new()) };
}

/// Registers a connection for the fork handlers (installed with the first one).
pub(crate) fn register(inner: Weak<dyn Forkable>) {
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
    reg.push(inner);
}

extern "C" fn prepare() {
    FORKS_MADE.fetch_add(1, Ordering::AcqRel);
    let live: Vec<Arc<dyn Forkable>> = REGISTRY.lock().iter().filter_map(|w| w.upgrade()).collect();
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

/// The descriptors the library holds now (connections, position segments, kernel files'
/// `O_PATH` descriptors), so that a
/// program closing "every other descriptor" (`closefrom`, `close_range`) can leave them.
pub fn own_descriptors() -> Vec<i32> {
    let mut v = Vec::new();
    for inner in REGISTRY.lock().iter().filter_map(|w| w.upgrade()) {
        v.extend(inner.descriptors());
    }
    v.extend(crate::position::descriptors());
    v.extend(crate::kernel::descriptors());
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
