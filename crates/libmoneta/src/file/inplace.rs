//! Reads and writes in place (memory drives, 004's execute/access in place): a file's own
//! pages (`FS_MAP`) mapped once, after which a read or a write inside the file's known size is
//! a copy from or to the mapping, with no command and no system call.
//!
//! By default a file goes in place by itself once it has been made durable enough times at
//! the `host` level (`MONETA_MODE=sync`, the default, [`File::set_in_place_after_syncs`]),
//! where an `fsync` in place is the client's own `msync` rather than a call; at any other
//! level it stays on the channel. `MONETA_MODE=map` in the environment, or
//! [`File::set_in_place`], puts every file in place; `MONETA_MODE=auto`
//! ([`File::set_in_place_after`]) each file once it has been read and written through the
//! channel enough times inside its known size: a file used again and again, such as a
//! database, then goes in place, while one made, written once and removed, such as a rollback
//! journal, is never mapped (each mapping is an `FS_MAP` on the control socket).
//! `MONETA_MODE=channel` keeps every file on the channel.
//! Only what lies inside the size the library knows goes in place; anything else (a read that
//! may meet the end, a write that grows the file, an appending file) takes the channel, which
//! learns the size or extends the file, after which that range goes in place too.
//!
//! Pages can be retired under a mapping (a truncation or the file's final free: docs/abi.md,
//! `FS_MAP`); an access in place must then never reach them. Each access announces itself in
//! the channel header's `in_place` word, then checks that the header's `retired` count is the
//! one the mapping was made under, and the device raises that count before it retires pages
//! and waits (a bounded time) for `in_place` to fall to zero. Either the access sees the new
//! count (it drops the mapping and takes the channel), or the device sees it inside and lets
//! it finish first: both use sequentially consistent operations, so one of the two always
//! happens (the pattern of Dekker's algorithm).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::RwLock;

use super::File;
use crate::ClientError;

/// Address space reserved for one file's pages: a file larger than this is read and written
/// in place up to here, and through the channel beyond.
const RESERVE: usize = 16 << 30;

/// The environment variable that turns access in place on for every file (`map`), on for
/// each file after [`AUTO_AFTER`] accesses through the channel (`auto`), on for each file
/// after [`SYNC_AFTER`] `fsync`s at the `host` level (`sync`, the default), or off (`channel`).
pub const ENV_MODE: &str = "MONETA_MODE";

/// With `MONETA_MODE=auto`: the reads and writes inside a file's known size that go through
/// the channel before the file's go in place.
pub const AUTO_AFTER: u32 = 16;

/// By default (`MONETA_MODE=sync`): the `fsync`s of a file at the `host` level after which
/// its reads and writes go in place (and its `fsync`s need no call).
pub const SYNC_AFTER: u32 = 8;

/// The largest file that goes in place by its `fsync`s: making its pages copies it whole.
pub const SYNC_IN_PLACE_MAX: u64 = 64 << 20;

/// A file's mapping for access in place.
pub(super) struct InPlace {
    on: AtomicBool,
    /// Accesses through the channel inside the known size after which access in place turns
    /// on by itself (0: never).
    after: AtomicU32,
    /// Such accesses so far.
    seen: AtomicU32,
    /// `fsync`s at the `host` level after which access in place turns on by itself (0: never).
    sync_after: AtomicU32,
    /// Such `fsync`s so far.
    syncs: AtomicU32,
    map: RwLock<Option<Mapping>>,
}

struct Mapping {
    base: usize,
    len: usize,
    writable: bool,
    /// The `retired` count it was made under.
    generation: u64,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, and no access uses it (they hold the read lock).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

impl InPlace {
    /// On after [`SYNC_AFTER`] `fsync`s at the `host` level (the default, `MONETA_MODE=sync`),
    /// unless `MONETA_MODE=map` (on), `auto` (on after [`AUTO_AFTER`] accesses) or `channel`
    /// (off). Any other value is the default.
    pub(super) fn from_env() -> InPlace {
        static MODE: std::sync::OnceLock<(bool, u32, u32)> = std::sync::OnceLock::new();
        let (on, after, sync_after) =
            *MODE.get_or_init(|| match std::env::var(ENV_MODE).as_deref() {
                Ok("map") => (true, 0, 0),
                Ok("auto") => (false, AUTO_AFTER, 0),
                Ok("channel") => (false, 0, 0),
                _ => (false, 0, SYNC_AFTER),
            });
        InPlace {
            on: AtomicBool::new(on),
            after: AtomicU32::new(after),
            seen: AtomicU32::new(0),
            sync_after: AtomicU32::new(sync_after),
            syncs: AtomicU32::new(0),
            map: RwLock::new(None),
        }
    }
}

enum Dir<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl File {
    /// Turns reading and writing through the file's own pages on or off for this file (the
    /// default is off until the file goes in place by itself, or on for every file with
    /// `MONETA_MODE=map`). On, a read or a write
    /// inside the file's known size copies from or to a mapping of the file's pages with no
    /// command; the first such access maps them (`FS_MAP`). Where the array hands out no
    /// pages, everything goes through the channel as before.
    pub fn set_in_place(&self, on: bool) {
        self.in_place.on.store(on, Ordering::Relaxed);
        if !on {
            // Off by choice: not on again by itself either.
            self.in_place.after.store(0, Ordering::Relaxed);
            self.in_place.sync_after.store(0, Ordering::Relaxed);
            *self.in_place.map.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Turns reading and writing in place on by itself once `accesses` reads and writes
    /// inside the file's known size have gone through the channel (0: never; every file has
    /// `AUTO_AFTER` with `MONETA_MODE=auto`). A file read and written again and again then
    /// goes in place, at the cost of one `FS_MAP`; one written once and removed never does.
    pub fn set_in_place_after(&self, accesses: u32) {
        self.in_place.seen.store(0, Ordering::Relaxed);
        self.in_place.after.store(accesses, Ordering::Relaxed);
    }

    /// Turns reading and writing in place on by itself once the file has been made durable
    /// `syncs` times at the `host` level with a call to the daemon (0: never; every file has
    /// [`SYNC_AFTER`] by default, `MONETA_MODE=sync`), if it is open for reading and writing and no
    /// larger than [`SYNC_IN_PLACE_MAX`]. A file made durable again and again, a database or
    /// its log, then goes in place, and its `fsync`s are its own `msync` (docs/nvfs.md,
    /// "Durability levels"); one made durable once or twice and removed never does.
    pub fn set_in_place_after_syncs(&self, syncs: u32) {
        self.in_place.syncs.store(0, Ordering::Relaxed);
        self.in_place.sync_after.store(syncs, Ordering::Relaxed);
    }

    /// Whether reads and writes may go in place now or later (on, or on by itself after
    /// enough accesses, or after enough `fsync`s of a file open for reading and writing at
    /// the `host` level): such a file's reads collect its posted writes first, as an access
    /// in place does not wait for commands in flight.
    pub(super) fn in_place_possible(&self) -> bool {
        self.in_place.on.load(Ordering::Relaxed)
            || self.in_place.after.load(Ordering::Relaxed) > 0
            || (self.in_place.sync_after.load(Ordering::Relaxed) > 0
                && self.readable
                && self.writable
                && self.ch().header().fs_flags.load(Ordering::Acquire)
                    & moneta_abi::FS_DURABLE_PAGE
                    != 0)
    }

    /// Whether reads and writes go in place where they can.
    pub fn in_place(&self) -> bool {
        self.in_place.on.load(Ordering::Relaxed)
    }

    /// Reads `buf` at `off` in place, if it lies inside the known size: `Some(bytes)`, or
    /// `None` for the channel to do it.
    pub(super) fn read_in_place(&self, buf: &mut [u8], off: u64) -> Option<usize> {
        let n = buf.len();
        self.access(Dir::Read(buf), off).then_some(n)
    }

    /// Writes `data` at `off` in place, if it lies inside the known size: whether it did.
    pub(super) fn write_in_place(&self, data: &[u8], off: u64) -> bool {
        self.access(Dir::Write(data), off)
    }

    fn access(&self, dir: Dir<'_>, off: u64) -> bool {
        let (len, write) = match &dir {
            Dir::Read(b) => (b.len(), false),
            Dir::Write(d) => (d.len(), true),
        };
        let Some(end) = off.checked_add(len as u64) else {
            return false;
        };
        if !self.in_place.on.load(Ordering::Relaxed) {
            self.count_toward_in_place(end);
            return false;
        }
        if end > RESERVE as u64 {
            return false;
        }
        let Ok(ch) = self.m.inner.live() else {
            return false;
        };
        let header = ch.header();
        {
            let map = self.in_place.map.read().unwrap_or_else(|e| e.into_inner());
            // The size is read under the mapping's lock: a remap sets it to what the new
            // pages cover before anyone uses them.
            if end > self.map.read().unwrap_or_else(|e| e.into_inner()).size {
                return false;
            }
            if let Some(m) = map.as_ref().filter(|m| !write || m.writable) {
                header.in_place.fetch_add(1, Ordering::SeqCst);
                let current = header.retired.load(Ordering::SeqCst) == m.generation;
                if current {
                    let p = (m.base + off as usize) as *mut u8;
                    // SAFETY: `[off, end)` lies inside the file's known size, which its pages
                    // always cover (the daemon grows them before it answers a size), inside
                    // the mapping's reserve; the pages are current (checked above, with the
                    // device waiting for this access before it retires them).
                    unsafe {
                        match dir {
                            Dir::Read(b) => std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), len),
                            Dir::Write(d) => std::ptr::copy_nonoverlapping(d.as_ptr(), p, len),
                        }
                    }
                }
                header.in_place.fetch_sub(1, Ordering::SeqCst);
                if current {
                    return true;
                }
            }
        }
        // No mapping yet, or one of retired pages: (re)map, and let the channel do this one.
        // Pages that cannot be had (none on this array, the daemon's limits, no address space)
        // leave the file on the channel, rather than asking again at every access.
        if self.remap(write).is_err() {
            self.in_place.on.store(false, Ordering::Relaxed);
            self.in_place.after.store(0, Ordering::Relaxed);
            self.in_place.sync_after.store(0, Ordering::Relaxed);
        }
        false
    }

    /// An access through the channel ending at `end`: counted when it lies inside the known
    /// size (one that access in place would have served), and the count may turn it on.
    fn count_toward_in_place(&self, end: u64) {
        let after = self.in_place.after.load(Ordering::Relaxed);
        if after == 0 || end > RESERVE as u64 {
            return;
        }
        if end > self.map.read().unwrap_or_else(|e| e.into_inner()).size {
            return;
        }
        if self.in_place.seen.fetch_add(1, Ordering::Relaxed) + 1 >= after {
            self.in_place.on.store(true, Ordering::Relaxed);
        }
    }

    /// An `fsync` that goes to the daemon: at the `host` level (where an `fsync` in place
    /// needs no call) it counts toward turning access in place on, for a file open for
    /// reading and writing and no larger than [`SYNC_IN_PLACE_MAX`].
    pub(super) fn count_sync_toward_in_place(&self, flags: u32) {
        let after = self.in_place.sync_after.load(Ordering::Relaxed);
        if after == 0
            || flags & moneta_abi::FS_DURABLE_PAGE == 0
            || !(self.readable && self.writable)
            || self.in_place.on.load(Ordering::Relaxed)
            || self.map.read().unwrap_or_else(|e| e.into_inner()).size > SYNC_IN_PLACE_MAX
        {
            return;
        }
        if self.in_place.syncs.fetch_add(1, Ordering::Relaxed) + 1 >= after {
            self.in_place.on.store(true, Ordering::Relaxed);
        }
    }

    /// Maps the file's current pages, writable if the file is open for writing.
    fn remap(&self, write: bool) -> Result<(), ClientError> {
        let mut slot = self.in_place.map.write().unwrap_or_else(|e| e.into_inner());
        let writable = self.writable && self.readable;
        if write && !writable {
            return Ok(());
        }
        // In order with the file's lookups and extends, whose answers set its size too.
        let _order = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let header = self.m.inner.live()?.header();
        let generation = header.retired.load(Ordering::SeqCst);
        // Pages an `fsync` writes to the host's disk (the `host` level) are faulted in one at
        // a time: a flush writes back each dirty folio whole, and readahead would make folios
        // of up to megabytes of a file whose writes are a few KiB.
        let flags = header.fs_flags.load(Ordering::Acquire);
        let flushed = flags & (moneta_abi::FS_FSYNC_IS_ORDER | moneta_abi::FS_VOLATILE) == 0;
        *slot = None;
        let (fd, stat) = self.pages(writable)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new mapping chosen by the kernel, of the file's pages; pages past their
        // end are never touched (accesses stay inside the known size).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RESERVE,
                prot,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        if flushed {
            // SAFETY: advice on the mapping just made.
            unsafe { libc::madvise(p, RESERVE, libc::MADV_RANDOM) };
        }
        *slot = Some(Mapping {
            base: p as usize,
            len: RESERVE,
            writable,
            generation,
        });
        // The pages cover the size the daemon answered with, which may be less than this
        // file knew (another process truncated it): accesses in place stay inside it.
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.size = stat.size;
        Ok(())
    }

    /// `fsync` of a file mapped for access in place, at the `host` level, without a call where
    /// none is needed: `Some(result)` when it is done here, `None` for `FS_FSYNC` to do it.
    ///
    /// Every byte of a mapped file, whether stored in place or written through a channel, is
    /// in its pages, which the mapping reaches: `msync` of the whole reservation writes back
    /// every dirty page of the file and flushes the host's disk, as `fdatasync` of a kernel
    /// file does, in this thread. What else the call owes is metadata: every change that
    /// completed before it must be durable too. The daemon's durability page says so when,
    /// loaded in this order, the last durable transaction is at least the last committed
    /// one (both only grow). When it is not, the call goes to the daemon before anything is
    /// flushed here: its durability point flushes the file's data with the metadata, in one
    /// flush of the disk, where a flush here first would make two. A mapped file has no size
    /// lease out (its size moves through calls only), and pages retired meanwhile (a
    /// truncation) send the call to the daemon, which then holds the bytes in the array.
    pub(super) fn sync_in_place(&self) -> Option<Result<(), ClientError>> {
        let slot = self.in_place.map.read().unwrap_or_else(|e| e.into_inner());
        let m = slot.as_ref()?;
        if self.map.read().unwrap_or_else(|e| e.into_inner()).size > m.len as u64 {
            return None;
        }
        let ch = self.m.inner.live().ok()?;
        let header = ch.header();
        if header.retired.load(Ordering::SeqCst) != m.generation || !ch.metadata_durable() {
            return None;
        }
        // SAFETY: the whole of this file's mapping, which the read lock keeps in place.
        let flushed = unsafe {
            rustix::mm::msync(
                m.base as *mut std::ffi::c_void,
                m.len,
                rustix::mm::MsyncFlags::SYNC,
            )
        };
        match flushed {
            Ok(()) => {}
            Err(rustix::io::Errno::IO) => {
                return Some(Err(ClientError::Refused {
                    errno: libc::EIO,
                    message: "writing the file's pages back to the host's disk failed".into(),
                }))
            }
            Err(_) => return None,
        }
        if header.retired.load(Ordering::SeqCst) != m.generation {
            return None;
        }
        if !ch.control().alive() {
            return Some(Err(ClientError::DeviceGone));
        }
        Some(Ok(()))
    }
}
