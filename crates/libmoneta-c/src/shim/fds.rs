//! The descriptor table: which of the process's file descriptors are Moneta files.
//!
//! A Moneta file holds a real kernel descriptor, so numbers never collide with the
//! application's: an `O_PATH` descriptor of `/dev/null`, opened with the application's
//! `O_CLOEXEC`. Reading or writing it through the kernel fails with `EBADF`, so a call the
//! shim does not see fails loudly instead of quietly reading nothing. `dup` duplicates that
//! descriptor and maps the new number to the same open file description ([`Desc`]), so
//! aliases share the position and the status flags; the kernel keeps each number's
//! close-on-exec flag, as for any descriptor.
//!
//! Lookups take no lock: the table is two levels of 1024 slots (descriptors up to 2^20), each
//! chunk with a bitmap checked first, so a call on a descriptor that is not Moneta's costs two
//! loads; a Moneta slot is an `ArcSwapOption`.
//!
//! A `vfork` child shares its parent's memory until it executes a program, so it must not
//! change the table (its parent would find its own descriptors remapped): its changes (a
//! `dup2` onto standard input before `exec`, say) go to a small overlay that only the `exec`
//! hand-over reads, and the parent ignores once it runs again.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use libmoneta::File;

const CHUNK: usize = 1024;
const CHUNKS: usize = 1024;

/// An open file description of a Moneta file (what `dup` shares).
pub(crate) struct Desc {
    pub file: File,
    /// The nvfs path it was opened by (what `*at` calls and `fchdir` start from).
    pub path: Vec<u8>,
    /// Status flags as `F_GETFL` reports them (access mode, `O_APPEND`, `O_NONBLOCK`, ...).
    pub flags: AtomicI32,
    /// A directory.
    pub is_dir: bool,
    /// Position of a directory read through `getdents`-style calls (the readdir cookie).
    pub dir_cookie: Mutex<u64>,
    /// A POSIX write lock was taken through it (as SQLite does before it writes a database).
    pub write_locked: AtomicBool,
}

struct Chunk<T> {
    bits: [AtomicU64; CHUNK / 64],
    slots: [ArcSwapOption<T>; CHUNK],
}

/// Descriptor numbers mapped to shared descriptions, looked up without a lock. Chunks are
/// allocated on first use and never freed.
pub(crate) struct Table<T> {
    cells: [AtomicPtr<Chunk<T>>; CHUNKS],
}

impl<T> Table<T> {
    pub(crate) const fn new() -> Self {
        Table {
            cells: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
        }
    }

    fn chunk(&self, fd: c_int) -> Option<&Chunk<T>> {
        let i = usize::try_from(fd).ok()? / CHUNK;
        let p = self.cells.get(i)?.load(Ordering::Acquire);
        // SAFETY: chunks are allocated once and never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    fn chunk_or_new(&self, fd: c_int) -> Option<&Chunk<T>> {
        let i = usize::try_from(fd).ok()? / CHUNK;
        let cell = self.cells.get(i)?;
        let p = cell.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: as in `chunk`.
            return Some(unsafe { &*p });
        }
        let fresh = Box::into_raw(Box::new(Chunk {
            bits: [const { AtomicU64::new(0) }; CHUNK / 64],
            slots: std::array::from_fn(|_| ArcSwapOption::empty()),
        }));
        match cell.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; never freed.
            Ok(_) => Some(unsafe { &*fresh }),
            Err(other) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as in `chunk`.
                Some(unsafe { &*other })
            }
        }
    }

    /// Whether `fd` is in the table (two loads).
    #[inline]
    pub(crate) fn has(&self, fd: c_int) -> bool {
        let Some(c) = self.chunk(fd) else {
            return false;
        };
        let i = fd as usize % CHUNK;
        c.bits[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// The description behind `fd`.
    #[inline]
    pub(crate) fn get(&self, fd: c_int) -> Option<Arc<T>> {
        if !self.has(fd) {
            return None;
        }
        self.chunk(fd)?.slots[fd as usize % CHUNK].load_full()
    }

    /// Maps `fd` (below [`fits`]'s bound) to `d`.
    pub(crate) fn put(&self, fd: c_int, d: Arc<T>) {
        let Some(c) = self.chunk_or_new(fd) else {
            return;
        };
        let i = fd as usize % CHUNK;
        c.slots[i].store(Some(d));
        c.bits[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
    }

    /// Forgets `fd`; returns what it mapped.
    pub(crate) fn take(&self, fd: c_int) -> Option<Arc<T>> {
        let c = self.chunk(fd)?;
        let i = fd as usize % CHUNK;
        c.bits[i / 64].fetch_and(!(1 << (i % 64)), Ordering::AcqRel);
        c.slots[i].swap(None)
    }

    /// Every entry.
    pub(crate) fn entries(&self) -> Vec<(c_int, Arc<T>)> {
        let mut out = Vec::new();
        for (ci, cell) in self.cells.iter().enumerate() {
            let p = cell.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: as in `chunk`.
            let c = unsafe { &*p };
            for w in 0..CHUNK / 64 {
                let mut bits = c.bits[w].load(Ordering::Acquire);
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let i = w * 64 + b;
                    if let Some(d) = c.slots[i].load_full() {
                        out.push(((ci * CHUNK + i) as c_int, d));
                    }
                }
            }
        }
        out
    }
}

static TABLE: Table<Desc> = Table::new();

/// Whether `fd` is a Moneta descriptor (two loads).
#[inline]
pub(crate) fn is_moneta(fd: c_int) -> bool {
    TABLE.has(fd)
}

/// The description behind `fd`, if it is Moneta's.
#[inline]
pub(crate) fn get(fd: c_int) -> Option<Arc<Desc>> {
    TABLE.get(fd)
}

/// The process that owns the table, and the fork generation it was read in.
static OWNER: AtomicI32 = AtomicI32::new(0);
static OWNER_GEN: AtomicU64 = AtomicU64::new(u64::MAX);

fn getpid() -> i32 {
    // SAFETY: a plain system call (not the C library's cached or hooked one).
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Whether this is a `vfork` child running on its parent's memory (checked only where the
/// table would change: one system call).
pub(crate) fn vforked() -> bool {
    let g = libmoneta::fork::generation();
    if OWNER_GEN.load(Ordering::Acquire) != g {
        // First change in this process, or the first since a fork (whose child handlers ran).
        OWNER.store(getpid(), Ordering::Release);
        OWNER_GEN.store(g, Ordering::Release);
        return false;
    }
    getpid() != OWNER.load(Ordering::Acquire)
}

/// Changes a `vfork` child made: (descriptor, description or null), for its `exec`.
const OVERLAY: usize = 64;
static OVERLAY_PID: AtomicI32 = AtomicI32::new(0);
static OVERLAY_LEN: AtomicUsize = AtomicUsize::new(0);
static OVERLAY_FD: [AtomicI32; OVERLAY] = [const { AtomicI32::new(-1) }; OVERLAY];
static OVERLAY_DESC: [AtomicPtr<Desc>; OVERLAY] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; OVERLAY];

fn overlay_put(fd: c_int, d: Option<Arc<Desc>>) {
    let me = getpid();
    if OVERLAY_PID.load(Ordering::Acquire) != me {
        OVERLAY_LEN.store(0, Ordering::Release);
        OVERLAY_PID.store(me, Ordering::Release);
    }
    // The reference is leaked on purpose: the parent's counts must not change, and the
    // description lives as long as the parent holds it anyway.
    let p = d.map_or(std::ptr::null_mut(), |d| Arc::into_raw(d) as *mut Desc);
    let n = OVERLAY_LEN.load(Ordering::Acquire);
    let i = (0..n)
        .find(|&i| OVERLAY_FD[i].load(Ordering::Acquire) == fd)
        .unwrap_or(n);
    if i < OVERLAY {
        OVERLAY_FD[i].store(fd, Ordering::Release);
        OVERLAY_DESC[i].store(p, Ordering::Release);
        if i == n {
            OVERLAY_LEN.store(n + 1, Ordering::Release);
        }
    }
}

/// The table as this process sees it: in a `vfork` child, with its own changes over it.
pub(crate) fn effective() -> Vec<(c_int, Arc<Desc>)> {
    let mut v = all();
    if OVERLAY_PID.load(Ordering::Acquire) == getpid() {
        for i in 0..OVERLAY_LEN.load(Ordering::Acquire).min(OVERLAY) {
            let fd = OVERLAY_FD[i].load(Ordering::Acquire);
            let p = OVERLAY_DESC[i].load(Ordering::Acquire);
            v.retain(|(f, _)| *f != fd);
            if !p.is_null() {
                // SAFETY: a leaked reference (see `overlay_put`): the count is raised for the
                // copy made here.
                let d = unsafe {
                    Arc::increment_strong_count(p);
                    Arc::from_raw(p)
                };
                v.push((fd, d));
            }
        }
    }
    v
}

/// Maps `fd` to `d` (replacing what it mapped).
pub(crate) fn set(fd: c_int, d: Arc<Desc>) {
    if vforked() {
        overlay_put(fd, Some(d));
        return;
    }
    TABLE.put(fd, d);
}

/// Forgets `fd`; returns the description it mapped (`None` in a `vfork` child, which must not
/// drop its parent's references).
pub(crate) fn remove(fd: c_int) -> Option<Arc<Desc>> {
    if is_moneta(fd) && vforked() {
        overlay_put(fd, None);
        return None;
    }
    TABLE.take(fd)
}

/// Whether the table can hold `fd`.
pub(crate) fn fits(fd: c_int) -> bool {
    fd >= 0 && (fd as usize) < CHUNK * CHUNKS
}

/// Every Moneta descriptor with its description.
pub(crate) fn all() -> Vec<(c_int, Arc<Desc>)> {
    TABLE.entries()
}
