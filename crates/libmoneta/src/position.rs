//! File positions that a forked child shares with its parent, as POSIX has an open file
//! description's offset shared by every process that inherited it.
//!
//! Each open file's position lives in a 64-byte cell of a shared mapping (memfd segments of
//! 1024 cells, inherited by `fork`). A cell holds the position and a lock that works between
//! processes: 0 when free, else the holder's thread id, with a bit telling that someone may
//! sleep on it (a shared futex). A waiter that sleeps long checks that the holder still exists,
//! and takes over the lock of a thread that died holding it.
//!
//! A process allocates cells from its own segments only: a child stops using the free list it
//! inherited (its parent goes on using that one) and maps new segments. A cell goes back to
//! the free list when its file closes in the process that allocated it, if that process has
//! not forked since; a cell that a child may still use is never reused.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::generation::{self as fork, GenLock};

const CELLS_PER_SEGMENT: usize = 1024;
const WAITERS: u32 = 1 << 31;
/// How long a waiter sleeps before it checks that the holder is still alive.
const HOLDER_CHECK: Duration = Duration::from_millis(20);

#[repr(C, align(64))]
struct Cell {
    pos: AtomicU64,
    lock: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Cell>() == 64);

struct Segment {
    /// The memfd (dropped in a forked child, which cannot hand it on).
    fd: Option<OwnedFd>,
    base: usize,
}

struct Arena {
    gen: u64,
    segments: Vec<Segment>,
    free: Vec<NonNull<Cell>>,
}

// SAFETY: the cells are shared memory accessed through atomics only.
unsafe impl Send for Arena {}

static ARENA: GenLock<Arena> = GenLock::new(Arena {
    gen: 0,
    segments: Vec::new(),
    free: Vec::new(),
});

impl Arena {
    fn grow(&mut self) -> std::io::Result<()> {
        let fd = crate::fdnum::hide(rustix::fs::memfd_create(
            "moneta-positions",
            rustix::fs::MemfdFlags::CLOEXEC,
        )?);
        let size = CELLS_PER_SEGMENT * std::mem::size_of::<Cell>();
        rustix::fs::ftruncate(&fd, size as u64)?;
        // SAFETY: a fresh shared mapping of the whole memfd; it is never unmapped, since cells
        // may be in use until the process ends.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let base = base.cast::<Cell>();
        for i in (0..CELLS_PER_SEGMENT).rev() {
            // SAFETY: in bounds of the mapping.
            self.free
                .push(NonNull::new(unsafe { base.add(i) }).expect("mmap is non-null"));
        }
        self.segments.push(Segment {
            fd: Some(fd),
            base: base as usize,
        });
        Ok(())
    }
}

/// The descriptors of this process's position segments (kept, for the library's own list).
pub(crate) fn descriptors() -> Vec<i32> {
    use std::os::fd::AsRawFd;
    let mut v: Vec<i32> = ARENA
        .lock()
        .segments
        .iter()
        .filter_map(|s| s.fd.as_ref().map(|f| f.as_raw_fd()))
        .collect();
    v.extend(
        ADOPTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|&(fd, _)| fd),
    );
    v
}

/// Segments mapped from memfds another program image handed over (`exec`), by descriptor.
static ADOPTED: std::sync::Mutex<Vec<(i32, usize)>> = std::sync::Mutex::new(Vec::new());

/// `gen` of a position whose cell is never given back (adopted from another image).
const NEVER_FREED: u64 = u64::MAX;

/// An open file's position.
pub(crate) struct Position {
    cell: NonNull<Cell>,
    gen: u64,
    forks: u64,
}

// SAFETY: the cell is accessed through atomics only.
unsafe impl Send for Position {}
// SAFETY: as above.
unsafe impl Sync for Position {}

impl Position {
    /// A position at 0.
    pub(crate) fn new() -> std::io::Result<Position> {
        let gen = fork::generation();
        let forks = fork::forks_made();
        let mut a = ARENA.lock();
        if a.gen != gen {
            // Inherited from the parent: its cells stay mapped for the files that use them,
            // but their free list is the parent's to use.
            a.free.clear();
            for s in &mut a.segments {
                s.fd = None;
            }
            a.gen = gen;
        }
        if a.free.is_empty() {
            a.grow()?;
        }
        let cell = a.free.pop().expect("grown");
        // SAFETY: a cell of a live segment, handed out to this position alone.
        let c = unsafe { cell.as_ref() };
        c.pos.store(0, Ordering::Relaxed);
        c.lock.store(0, Ordering::Release);
        Ok(Position { cell, gen, forks })
    }

    /// Where the cell lives, to hand it to the next program image across `exec`: the
    /// segment's memfd and the cell's index in it.
    pub(crate) fn locate(&self) -> Option<(i32, u32)> {
        use std::os::fd::AsRawFd;
        let addr = self.cell.as_ptr() as usize;
        let size = CELLS_PER_SEGMENT * std::mem::size_of::<Cell>();
        let within = |base: usize| addr >= base && addr < base + size;
        let index = |base: usize| ((addr - base) / std::mem::size_of::<Cell>()) as u32;
        {
            let a = ARENA.lock();
            for s in &a.segments {
                if within(s.base) {
                    return s.fd.as_ref().map(|fd| (fd.as_raw_fd(), index(s.base)));
                }
            }
        }
        let adopted = ADOPTED.lock().unwrap_or_else(|e| e.into_inner());
        adopted
            .iter()
            .find(|&&(_, base)| within(base))
            .map(|&(fd, base)| (fd, index(base)))
    }

    /// The position in cell `index` of the segment memfd `fd` handed over by the previous
    /// program image; it stays shared with every process that shares it, and is never reused.
    pub(crate) fn adopt(fd: i32, index: u32) -> std::io::Result<Position> {
        if index as usize >= CELLS_PER_SEGMENT {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut adopted = ADOPTED.lock().unwrap_or_else(|e| e.into_inner());
        let base = match adopted.iter().find(|&&(f, _)| f == fd) {
            Some(&(_, base)) => base,
            None => {
                let size = CELLS_PER_SEGMENT * std::mem::size_of::<Cell>();
                // SAFETY: the descriptor is valid for as long as we keep it (never closed);
                // a shared mapping of exactly one segment, never unmapped.
                let base = unsafe {
                    let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                    if rustix::fs::fstat(borrowed)?.st_size < size as i64 {
                        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
                    }
                    rustix::mm::mmap(
                        std::ptr::null_mut(),
                        size,
                        rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                        rustix::mm::MapFlags::SHARED,
                        borrowed,
                        0,
                    )?
                } as usize;
                adopted.push((fd, base));
                base
            }
        };
        let cell = (base + index as usize * std::mem::size_of::<Cell>()) as *mut Cell;
        Ok(Position {
            cell: NonNull::new(cell).expect("mapped"),
            gen: NEVER_FREED,
            forks: 0,
        })
    }

    fn cell(&self) -> &Cell {
        // SAFETY: segments are never unmapped.
        unsafe { self.cell.as_ref() }
    }

    /// The position, without the lock.
    pub(crate) fn get(&self) -> u64 {
        self.cell().pos.load(Ordering::Acquire)
    }

    /// Takes the position's lock (between threads and processes).
    pub(crate) fn lock(&self) -> PosGuard<'_> {
        let c = self.cell();
        let me = tid();
        if c.lock
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return PosGuard { cell: c };
        }
        for _ in 0..100 {
            std::hint::spin_loop();
            if c.lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return PosGuard { cell: c };
            }
        }
        loop {
            let cur = c.lock.load(Ordering::Relaxed);
            if cur == 0 {
                if c.lock
                    .compare_exchange(0, me | WAITERS, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return PosGuard { cell: c };
                }
                continue;
            }
            if cur & WAITERS == 0
                && c.lock
                    .compare_exchange(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let ts = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: HOLDER_CHECK.as_nanos() as i64,
            };
            let r = rustix::thread::futex::wait(
                &c.lock,
                rustix::thread::futex::Flags::empty(),
                cur | WAITERS,
                Some(&ts),
            );
            if r == Err(rustix::io::Errno::TIMEDOUT) {
                let holder = cur & !WAITERS;
                if !alive(holder)
                    && c.lock
                        .compare_exchange(
                            cur | WAITERS,
                            me | WAITERS,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    return PosGuard { cell: c };
                }
            }
        }
    }
}

impl Drop for Position {
    fn drop(&mut self) {
        // A cell a child may use (this process forked since, or this is a child using its
        // parent's cell) is never handed out again.
        if fork::generation() == self.gen && fork::forks_made() == self.forks {
            let mut a = ARENA.lock();
            if a.gen == self.gen {
                a.free.push(self.cell);
            }
        }
    }
}

/// A held position lock.
pub(crate) struct PosGuard<'a> {
    cell: &'a Cell,
}

impl PosGuard<'_> {
    pub(crate) fn get(&self) -> u64 {
        self.cell.pos.load(Ordering::Relaxed)
    }
    pub(crate) fn set(&mut self, v: u64) {
        self.cell.pos.store(v, Ordering::Release);
    }
}

impl Drop for PosGuard<'_> {
    fn drop(&mut self) {
        if self.cell.lock.swap(0, Ordering::Release) & WAITERS != 0 {
            let _ = rustix::thread::futex::wake(
                &self.cell.lock,
                rustix::thread::futex::Flags::empty(),
                1,
            );
        }
    }
}

/// This thread's id, cached per fork generation (a child's thread has a new one).
fn tid() -> u32 {
    thread_local! {
        static TID: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((u64::MAX, 0)) };
    }
    let g = fork::generation();
    TID.with(|t| {
        let (tg, id) = t.get();
        if tg == g {
            return id;
        }
        let id = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        t.set((g, id));
        id
    })
}

fn alive(tid: u32) -> bool {
    match rustix::process::Pid::from_raw(tid as i32) {
        Some(p) => rustix::process::test_kill_process(p) != Err(rustix::io::Errno::SRCH),
        None => false,
    }
}
