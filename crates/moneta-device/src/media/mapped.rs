//! [`MappedArray`]: the array as a mapping of a backing file or a memfd, the flush lanes that
//! write a backing file's ranges back, and the pages of other files shown over it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use memmap2::{MmapOptions, MmapRaw};

use super::copy::stream_copy;
use super::{Media, MediaError};

/// The array mapped from a backing file or a memfd.
pub struct MappedArray {
    map: MmapRaw,
    size: u64,
    persistent: bool,
    file: File,
    /// Mapped for reading only ([`MappedArray::open_read_only`]).
    read_only: bool,
    /// Pages shown from other files ([`Media::overlay`]) and not detached since (counted in
    /// pages, since a detach may cover several pieces shown one by one).
    overlaid: std::sync::atomic::AtomicUsize,
    /// Where: start → end of each run shown from another file (merged when they touch).
    shown: std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
    /// The flush lanes of a backing file ([`Media::flush_ranges_in`]): empty for a memfd, or
    /// where the file could not be opened again.
    lanes: Vec<Lane>,
}

/// A flush lane: the backing file opened again (an open file description of its own, with
/// its own view of write-back errors) and mapped, shared and for reading, whole. `msync` of a
/// range of this mapping writes back the file's pages there, whichever mapping dirtied them.
struct Lane {
    file: File,
    map: MmapRaw,
}

/// Flush lanes of a backing file: two for the file system's group commit (two flushes at
/// once, as the kernel lets two `fdatasync` calls of a file run) and one for the engine's own
/// FLUSH ([`FlushAs::lane`]), which runs beside them and beside the file system's checkpoints.
const FLUSH_LANES: usize = 3;

impl Lane {
    /// `file` opened again through `/proc/self/fd` and mapped; `None` where that fails.
    fn open(file: &File, size: usize) -> Option<Lane> {
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .ok()?;
        // Opened for writing, so that the shared mapping is one `msync` writes back.
        let map = MmapOptions::new().len(size).map_raw_read_only(&file).ok()?;
        Some(Lane { file, map })
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        crate::guard::unguard(self.map.as_mut_ptr() as usize, self.size as usize);
    }
}

/// Largest array we accept: 64 TiB.
pub const MAX_ARRAY_SIZE: u64 = 1 << 46;

fn check_size(size: u64) -> Result<(), MediaError> {
    if !(4096..=MAX_ARRAY_SIZE).contains(&size) || !size.is_multiple_of(4096) {
        return Err(MediaError::BadSize(size));
    }
    Ok(())
}

impl MappedArray {
    /// Opens the backing file at `path`, creating it with `size` bytes (sparse) if it does not
    /// exist. With `size` given, an existing file must have that size. The file is locked
    /// (`flock`) so two daemons never serve one array.
    pub fn open_file(path: &Path, size: Option<u64>) -> Result<Self, MediaError> {
        let err = |source| MediaError::Open {
            path: path.to_owned(),
            source,
        };
        let exists = path.exists();
        if !exists && size.is_none() {
            return Err(MediaError::NoSize(path.to_owned()));
        }
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(err)?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|_| MediaError::Busy(path.to_owned()))?;
        let actual = file.metadata().map_err(err)?.len();
        let size = match (exists, size) {
            (true, Some(wanted)) if actual != wanted => {
                return Err(MediaError::SizeMismatch {
                    path: path.to_owned(),
                    actual,
                    wanted,
                })
            }
            (true, _) => actual,
            (false, Some(s)) => s,
            (false, None) => unreachable!("checked above"),
        };
        check_size(size)?;
        if !exists {
            file.set_len(size).map_err(MediaError::Map)?;
        }
        Self::allocate(&file, size)?;
        Self::map(file, size, true)
    }

    /// Opens an existing backing file for reading only: the file is neither written, nor
    /// extended, nor allocated (a check must not change what it checks, and must work on a
    /// file the caller may only read). It takes a shared lock, so it fails with
    /// [`MediaError::Busy`] while a daemon serves the file. Writing to the array is a
    /// programming error and panics.
    pub fn open_read_only(path: &Path) -> Result<Self, MediaError> {
        let err = |source| MediaError::Open {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new().read(true).open(path).map_err(err)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared)
            .map_err(|_| MediaError::Busy(path.to_owned()))?;
        let size = file.metadata().map_err(err)?.len();
        check_size(size)?;
        let len = usize::try_from(size).map_err(|_| MediaError::BadSize(size))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw_read_only(&file)
            .map_err(MediaError::Map)?;
        Ok(Self {
            map,
            size,
            persistent: true,
            file,
            read_only: true,
            overlaid: Default::default(),
            shown: Default::default(),
            lanes: Vec::new(),
        })
    }

    /// The backing file or memfd (to attach it to a loop device).
    pub fn backing(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Whether the file holds any data at all: `false` for a file that is one hole (as made
    /// by `truncate -s`), which holds nothing anyone could lose.
    pub fn has_data(path: &Path) -> io::Result<bool> {
        let file = File::open(path)?;
        match rustix::fs::seek(&file, rustix::fs::SeekFrom::Data(0)) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::NXIO) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// A volatile array of `size` bytes in a memfd, sparse.
    pub fn volatile(size: u64) -> Result<Self, MediaError> {
        check_size(size)?;
        let fd = rustix::fs::memfd_create("moneta-array", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| MediaError::Map(e.into()))?;
        let file = File::from(fd);
        file.set_len(size).map_err(MediaError::Map)?;
        // Sparse: memory is taken as the array is written (a memfd has no file system to fill
        // up, so a store into a hole cannot raise SIGBUS), and a file system on it costs only
        // the pages its files touch.
        Self::map(file, size, false)
    }

    /// Reserves every block of the array up front: a store into a hole of a `MAP_SHARED`
    /// mapping on a full file system would raise SIGBUS in the daemon.
    fn allocate(file: &File, size: u64) -> Result<(), MediaError> {
        rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size).map_err(|e| {
            if e == rustix::io::Errno::NOSPC {
                MediaError::NoSpace(size)
            } else {
                MediaError::Map(e.into())
            }
        })
    }

    fn map(file: File, size: u64, persistent: bool) -> Result<Self, MediaError> {
        let len = usize::try_from(size).map_err(|_| MediaError::BadSize(size))?;
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(MediaError::Map)?;
        if persistent {
            // No readahead on faults: the page cache then holds the backing file in pages, not
            // in the large folios readahead grows, and writing back one changed page writes
            // that page. With folios of up to 2 MiB, each `msync` of a few KiB wrote megabytes
            // (SQLite's updates at the `host` level: 15 GB written back for 40 MB changed, and
            // twice the time). The array is written before it is read, so readahead has
            // little to give.
            let _ = map.advise(memmap2::Advice::Random);
        }
        let lanes = if persistent {
            (0..FLUSH_LANES)
                .map_while(|_| Lane::open(&file, len))
                .collect::<Vec<_>>()
        } else {
            Vec::new()
        };
        Ok(Self {
            map,
            size,
            persistent,
            file,
            read_only: false,
            overlaid: Default::default(),
            shown: Default::default(),
            lanes: if lanes.len() == FLUSH_LANES {
                lanes
            } else {
                Vec::new()
            },
        })
    }

    /// [`Media::flush_ranges`] through `fd` and `map`: the array's own descriptor and
    /// mapping, or a flush lane's. Ranges over other files' pages are flushed through the
    /// array's own mapping, the one that shows them.
    fn flush_through(
        &self,
        fd: BorrowedFd<'_>,
        map: &MmapRaw,
        ranges: &[(u64, u64)],
    ) -> io::Result<()> {
        if !self.persistent {
            return Ok(());
        }
        let clip = |&(addr, len): &(u64, u64)| {
            let end = addr.saturating_add(len).min(self.size);
            (addr < end).then_some((addr, end - addr))
        };
        let mut ranges: Vec<(u64, u64)> = ranges.iter().filter_map(clip).collect();
        if self.overlaid.load(std::sync::atomic::Ordering::Acquire) > 0 {
            // Ranges over other files' pages: `msync` of the mapping writes back whichever
            // file each page is, where the backing file's descriptor would not. Only those
            // (a mapped file's data): the rest, the metadata above all, share one flush.
            let shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
            let over = |&(addr, len): &(u64, u64)| {
                shown
                    .range(..addr + len)
                    .next_back()
                    .is_some_and(|(_, &end)| end > addr)
            };
            let (theirs, ours): (Vec<_>, Vec<_>) = ranges.iter().partition(|r| over(r));
            drop(shown);
            for (addr, len) in theirs {
                self.flush(addr, len)?;
            }
            ranges = ours;
        }
        let Some((&(last, last_len), rest)) = ranges.split_last() else {
            return Ok(());
        };
        // Every write is started first, the last range's too, so the disk has them together;
        // then each but the last is waited for, and the `msync` of the last waits for its own
        // (already under way) and flushes. A single range goes straight to its `msync`, which
        // starts the range's write itself: starting it apart first would walk the range's
        // pages twice for nothing.
        let start = if rest.is_empty() {
            &[][..]
        } else {
            &ranges[..]
        };
        for (pass, which) in [(libc::SYNC_FILE_RANGE_WRITE, start), (SYNC_AND_WAIT, rest)] {
            for &(addr, len) in which {
                // SAFETY: a system call on the array's descriptor or a lane's, open as long as
                // `self`; it touches no memory of ours.
                let r = unsafe {
                    libc::sync_file_range(
                        fd.as_raw_fd(),
                        addr as libc::off64_t,
                        len as libc::off64_t,
                        pass,
                    )
                };
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        map.flush_range(last as usize, last_len as usize)
    }

    /// A pointer for writing: never into a read-only mapping.
    fn ptr_mut(&self, addr: u64, len: usize) -> *mut u8 {
        assert!(!self.read_only, "write to an array opened read-only");
        self.ptr(addr, len)
    }

    fn ptr(&self, addr: u64, len: usize) -> *mut u8 {
        assert!(
            addr.checked_add(len as u64)
                .is_some_and(|end| end <= self.size),
            "media access out of range"
        );
        // SAFETY: addr + len <= size, checked above, and the mapping is `size` bytes long.
        unsafe { self.map.as_mut_ptr().add(addr as usize) }
    }
}

impl Media for MappedArray {
    fn size(&self) -> u64 {
        self.size
    }

    fn persistent(&self) -> bool {
        self.persistent
    }

    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        let src = self.ptr(addr, len);
        // SAFETY: `src` is in bounds of the mapping (checked by `ptr`), `dst` is valid for `len`
        // bytes (the caller's contract), and the array mapping never overlaps a channel mapping.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }

    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        let dst = self.ptr_mut(addr, len);
        // SAFETY: as in `read`, with the roles of the two ranges swapped.
        unsafe { stream_copy(dst, src, len) }
    }

    fn flush(&self, addr: u64, len: u64) -> io::Result<()> {
        if !self.persistent || len == 0 {
            return Ok(());
        }
        let end = addr.saturating_add(len).min(self.size);
        if addr >= end {
            return Ok(());
        }
        self.map.flush_range(addr as usize, (end - addr) as usize)
    }

    /// One ordered flush of several ranges: every range's write-back is started with
    /// `sync_file_range` (which neither flushes the disk's cache nor commits the host file
    /// system's journal), every range but the last is waited for, then `msync` of the last
    /// range waits for its write-back and makes them all durable with the one flush of the
    /// disk's cache (and the one journal commit of the host file system, for pages zeroed by
    /// `fallocate`) that `msync` does. An `msync` per range would pay that flush once per
    /// range; starting the last range's write-back only in its `msync` would wait for the
    /// disk twice.
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.flush_through(self.file.as_fd(), &self.map, ranges)
    }

    fn flush_lanes(&self) -> usize {
        self.lanes.len().max(1)
    }

    fn flush_ranges_in(&self, lane: usize, ranges: &[(u64, u64)]) -> io::Result<()> {
        match self.lanes.get(lane) {
            Some(l) => self.flush_through(l.file.as_fd(), &l.map, ranges),
            None => self.flush_ranges(ranges),
        }
    }

    fn write_file(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        let _ = self.ptr_mut(addr, bytes.len());
        if !self.persistent {
            // SAFETY: `bytes` is valid for its length; the range was checked above.
            unsafe { self.write(addr, bytes.as_ptr(), bytes.len()) };
            return Ok(());
        }
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(bytes, addr)
    }

    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _ = self.ptr_mut(addr, len as usize);
        // Short ranges are stored (a few pages of stores cost less than a system call that
        // changes the host file system's extents); the whole pages of longer ones are zeroed by
        // the host file system, their ragged ends stored.
        let first = addr.next_multiple_of(4096);
        let last = (addr + len) / 4096 * 4096;
        // While other files' pages are shown, the host file system's zeroing would miss
        // them: stores reach whichever pages are there.
        let overlaid = self.overlaid.load(std::sync::atomic::Ordering::Acquire) > 0;
        if len < ZERO_BY_STORES || first >= last || overlaid {
            return zero_by_stores(self, addr, len);
        }
        self.zero_pages(first, last - first)?;
        zero_by_stores(self, addr, first - addr)?;
        zero_by_stores(self, last, addr + len - last)
    }

    fn overlay(
        &self,
        addr: u64,
        len: u64,
        segment: BorrowedFd<'_>,
        seg_off: u64,
    ) -> io::Result<()> {
        let at = self.map.as_mut_ptr() as usize + addr as usize;
        if self.persistent && !crate::guard::guard(at, len as usize) {
            // Pages of a host file, which its writers can shorten: a fault there must not
            // kill the daemon (see `guard`), so none is shown unguarded.
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "no room left to guard another piece of a mapped file",
            ));
        }
        if let Err(e) = self.remap(addr, len, segment, seg_off) {
            crate::guard::unguard(at, len as usize);
            return Err(e);
        }
        self.overlaid
            .fetch_add((len / 4096) as usize, std::sync::atomic::Ordering::AcqRel);
        self.mark_shown(addr, len, true);
        if !self.persistent {
            // The memfd's own pages there are no longer seen: give their memory back (at
            // best: they are unseen either way).
            let _ = rustix::fs::fallocate(
                &self.file,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                addr,
                len,
            );
        }
        Ok(())
    }

    fn detach(&self, addr: u64, len: u64) -> io::Result<()> {
        self.remap(addr, len, self.file.as_fd(), addr)?;
        crate::guard::unguard(self.map.as_mut_ptr() as usize + addr as usize, len as usize);
        let _ = self.overlaid.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |n| Some(n.saturating_sub((len / 4096) as usize)),
        );
        self.mark_shown(addr, len, false);
        Ok(())
    }

    fn will_need(&self, addr: u64, len: u64) {
        if !self.persistent {
            return;
        }
        // Whole pages, inside the array, and at most `WILL_NEED_MAX` of them at once: the
        // host starts the reads and the poller does not wait for them.
        let start = addr & !4095;
        let end = addr
            .saturating_add(len.min(WILL_NEED_MAX))
            .min(self.size)
            .next_multiple_of(4096)
            .min(self.size);
        if end <= start {
            return;
        }
        // SAFETY: advice on pages of our own mapping, inside it (checked above).
        unsafe {
            let p = self.map.as_mut_ptr().add(start as usize);
            let _ = rustix::mm::madvise(
                p.cast(),
                (end - start) as usize,
                rustix::mm::Advice::WillNeed,
            );
        }
    }
}

/// Most bytes one hint asks the host to read in (a larger hint asks for its start).
const WILL_NEED_MAX: u64 = 256 << 10;

impl MappedArray {
    /// Records `[addr, addr + len)` as shown from another file (`on`) or as the array's own
    /// pages again.
    fn mark_shown(&self, addr: u64, len: u64, on: bool) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let (mut start, mut end) = (addr, addr + len);
        // Every run that overlaps or touches the range goes, its parts outside it kept (when
        // the range is detached) or merged into it (when shown).
        let touching: Vec<(u64, u64)> = shown
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= addr)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            shown.remove(&s);
            if on {
                start = start.min(s);
                end = end.max(e);
            } else {
                if s < addr {
                    shown.insert(s, addr);
                }
                if e > addr + len {
                    shown.insert(addr + len, e);
                }
            }
        }
        if on {
            shown.insert(start, end);
        }
    }

    /// Maps `len` bytes of `fd` from `off` over the array's pages at `addr`, in place.
    fn remap(&self, addr: u64, len: u64, fd: BorrowedFd<'_>, off: u64) -> io::Result<()> {
        assert!(!self.read_only, "remap of an array opened read-only");
        let page = 4096;
        let fits = addr.checked_add(len).is_some_and(|end| end <= self.size);
        if !fits
            || !addr.is_multiple_of(page)
            || !len.is_multiple_of(page)
            || !off.is_multiple_of(page)
            || len == 0
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot remap {len} bytes at {addr:#x} from offset {off:#x}: not whole pages of the array"),
            ));
        }
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: the range lies inside our own mapping of the array (checked above), so
        // MAP_FIXED replaces only pages of it; the caller keeps accesses away meanwhile.
        unsafe {
            let at = self.map.as_mut_ptr().add(addr as usize);
            rustix::mm::mmap(
                at.cast(),
                len as usize,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                off,
            )?;
            if self.persistent {
                // As at `map`: no readahead into large folios, whether the pages are the
                // backing file's again or a mapped file's, since a flush writes back every
                // folio it touches whole.
                let _ = rustix::mm::madvise(at.cast(), len as usize, rustix::mm::Advice::Random);
            }
        }
        Ok(())
    }

    /// Zeroes whole pages through the host file system. A backing file keeps its blocks
    /// (`FALLOC_FL_ZERO_RANGE` makes them unwritten extents that read as zeros: one call, and
    /// a later store cannot meet a full file system) or, where the host file system lacks
    /// that, has a hole punched and its blocks reserved again. A memfd has the hole punched,
    /// which gives the memory back.
    fn zero_pages(&self, first: u64, len: u64) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags as F};
        if self.persistent
            && fallocate(&self.file, F::ZERO_RANGE | F::KEEP_SIZE, first, len).is_ok()
        {
            return Ok(());
        }
        if fallocate(&self.file, F::PUNCH_HOLE | F::KEEP_SIZE, first, len).is_err() {
            return zero_by_stores(self, first, len);
        }
        if self.persistent {
            fallocate(&self.file, F::KEEP_SIZE, first, len)?;
        }
        Ok(())
    }
}

/// `sync_file_range` flags that write a range back and wait until the disk has it (in its
/// cache: only a flush makes it durable).
const SYNC_AND_WAIT: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

/// Ranges shorter than this are zeroed by storing zeros rather than through the host file
/// system (on ext4 here: 64 KiB of stores 31 µs; `FALLOC_FL_ZERO_RANGE` over 64 KiB holding a
/// dirty page 81 µs, over a clean one 7 µs, over 64 MiB 31 µs; punching and reserving again
/// 294 µs).
pub const ZERO_BY_STORES: u64 = 64 << 10;

fn zero_by_stores(m: &MappedArray, addr: u64, len: u64) -> io::Result<()> {
    if len > 0 {
        // SAFETY: `ptr` checks the range against the mapping.
        unsafe { std::ptr::write_bytes(m.ptr(addr, len as usize), 0, len as usize) };
    }
    Ok(())
}

#[cfg(test)]
mod tests;
