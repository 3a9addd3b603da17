//! The media: the bytes of the NVM array.
//!
//! [`MappedArray`] maps a backing file `MAP_SHARED` (persistent: every completed write is in the
//! page cache of the file, so it survives the death of `monetad`; `flush` makes a range durable
//! against a crash of the machine) or a memfd (volatile). The array's file descriptor never
//! leaves the daemon.
//!
//! Array addresses are what permission records and commands name; the media location of an
//! address is the same number today. Wear leveling will remap between the two behind this
//! trait.
//!
//! Two kinds of persistence meet here. The emulated device's own: a completed write is in the
//! array, which outlives the daemon (the page cache keeps a file's pages). And the host's:
//! [`Media::flush`] and [`Media::flush_ranges`] write a backing file's pages to the host's
//! disk, so that they outlive a crash of the machine. [`FlushAs`] gives the engine an array
//! whose flushes are the device's own (nothing to wait for), for a daemon that promises only
//! that, or go through a descriptor of their own.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

/// Errors opening or creating the array.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The backing file could not be opened or created.
    #[error("cannot open backing file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The backing file does not exist and no size was given to create it.
    #[error("backing file {0} does not exist; give a size to create it")]
    NoSize(PathBuf),
    /// The backing file exists with another size than asked for.
    #[error("backing file {path} holds {actual} bytes, not the {wanted} asked for; omit the size to use the file as it is")]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Its size.
        actual: u64,
        /// The size asked for.
        wanted: u64,
    },
    /// Zero, or too large to map.
    #[error(
        "invalid array size {0}: must be between 4 KiB and 2^46 bytes and a multiple of 4 KiB"
    )]
    BadSize(u64),
    /// Another daemon holds the backing file.
    #[error("backing file {0} is in use by another monetad")]
    Busy(PathBuf),
    /// The file system (or memory, for a volatile array) cannot hold the array.
    #[error("not enough space to reserve the {0}-byte array")]
    NoSpace(u64),
    /// Mapping or sizing failed.
    #[error("cannot map the array: {0}")]
    Map(io::Error),
}

/// The bytes of the array, as the engine sees them.
///
/// Implementations are used by one thread at a time for data movement; `flush` may run on
/// another thread.
pub trait Media: Send + Sync + 'static {
    /// Bytes in the array.
    fn size(&self) -> u64;

    /// Whether the contents survive the daemon (a file) or not (a memfd).
    fn persistent(&self) -> bool;

    /// Copies `len` bytes at array address `addr` to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes; `addr + len <= self.size()`.
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize);

    /// Copies `len` bytes from `src` to array address `addr`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes; `addr + len <= self.size()`.
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize);

    /// Makes `[addr, addr+len)` durable on the backing store (no-op for volatile media).
    fn flush(&self, addr: u64, len: u64) -> io::Result<()>;

    /// Writes `bytes` at array address `addr` through the backing file's own interface
    /// (`pwrite`) where there is one, otherwise as [`Media::write`]. Every reader sees the
    /// same bytes either way (one page cache), but pages written so are not dirtied through
    /// the daemon's mapping, so writing them back to the disk does not have to write-protect
    /// them there first. On this project's virtual machines that write-protection (a TLB
    /// shootdown across the daemon's CPUs) made writing back one page cost 300–500 µs instead
    /// of 80–100. For bytes that must reach the disk soon and often: the metadata log at the
    /// host durability level.
    fn write_file(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        // SAFETY: `bytes` is valid for reads of its length; `write` checks the range.
        unsafe { self.write(addr, bytes.as_ptr(), bytes.len()) };
        Ok(())
    }

    /// Makes every range of `ranges` durable on the backing store, waiting for the store's
    /// own flush as few times as it allows (once, for a backing file: see [`MappedArray`]).
    /// The default flushes the ranges one by one.
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        for &(addr, len) in ranges {
            self.flush(addr, len)?;
        }
        Ok(())
    }

    /// How many flushes of [`Media::flush_ranges_in`] may run at once, each in a lane of its
    /// own. The default, 1: flushes one at a time.
    fn flush_lanes(&self) -> usize {
        1
    }

    /// [`Media::flush_ranges`] in lane `lane` (below [`Media::flush_lanes`]), beside a flush
    /// in another lane. A backing file's lane is a descriptor and a mapping of its own: the
    /// host reports a write-back error once to each open file description that looks, so two
    /// flushes through one description could let one take the other's error, and its callers
    /// believe their data durable. The default flushes as `flush_ranges` does.
    fn flush_ranges_in(&self, lane: usize, ranges: &[(u64, u64)]) -> io::Result<()> {
        let _ = lane;
        self.flush_ranges(ranges)
    }

    /// Sets `[addr, addr+len)` to zero. The default stores zeros; a mapped array punches a hole
    /// instead, which is faster and gives the memory back.
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut at = addr;
        let end = addr + len;
        while at < end {
            let n = (end - at).min(ZEROS.len() as u64) as usize;
            // SAFETY: `ZEROS` is valid for reads of `n <= 4096` bytes; the range is the
            // caller's, inside the array.
            unsafe { self.write(at, ZEROS.as_ptr(), n) };
            at += n as u64;
        }
        Ok(())
    }

    /// Shows `len` bytes of `segment` from offset `seg_off` at array addresses
    /// `[addr, addr + len)`, in place of the array's own pages there (all page-aligned): the
    /// engine, and every reader and writer of the array, then reach the segment's pages at
    /// those addresses, and whoever maps the segment shares them. Used to give a file pages of
    /// its own that can be handed to processes ([`Media::detach`] undoes it). The caller keeps
    /// every access to the range away while it changes, and keeps the segment at least
    /// `seg_off + len` bytes long. Arrays that cannot answer `Unsupported`.
    fn overlay(
        &self,
        addr: u64,
        len: u64,
        segment: BorrowedFd<'_>,
        seg_off: u64,
    ) -> io::Result<()> {
        let _ = (addr, len, segment, seg_off);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this array cannot show other pages in its place",
        ))
    }

    /// Shows the array's own pages at `[addr, addr + len)` again, after [`Media::overlay`]
    /// (what was written to the segment stays in the segment).
    fn detach(&self, addr: u64, len: u64) -> io::Result<()> {
        let _ = (addr, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this array shows no other pages",
        ))
    }

    /// `[addr, addr + len)` will be read soon: an array kept in a file asks the host to start
    /// reading its pages in, without waiting. The default, for arrays in memory, does nothing.
    fn will_need(&self, addr: u64, len: u64) {
        let _ = (addr, len);
    }
}

impl<T: Media + ?Sized> Media for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn persistent(&self) -> bool {
        (**self).persistent()
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).write(addr, src, len) }
    }
    fn flush(&self, addr: u64, len: u64) -> io::Result<()> {
        (**self).flush(addr, len)
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        (**self).flush_ranges(ranges)
    }
    fn flush_lanes(&self) -> usize {
        (**self).flush_lanes()
    }
    fn flush_ranges_in(&self, lane: usize, ranges: &[(u64, u64)]) -> io::Result<()> {
        (**self).flush_ranges_in(lane, ranges)
    }
    fn write_file(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        (**self).write_file(addr, bytes)
    }
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        (**self).zero(addr, len)
    }
    fn overlay(
        &self,
        addr: u64,
        len: u64,
        segment: BorrowedFd<'_>,
        seg_off: u64,
    ) -> io::Result<()> {
        (**self).overlay(addr, len, segment, seg_off)
    }
    fn detach(&self, addr: u64, len: u64) -> io::Result<()> {
        (**self).detach(addr, len)
    }
    fn will_need(&self, addr: u64, len: u64) {
        (**self).will_need(addr, len)
    }
}

/// An array whose flushes are not its own, and the way they are made instead
/// ([`FlushAs::device`], [`FlushAs::lane`]); everything else passes through to `M`.
pub struct FlushAs<M> {
    inner: M,
    way: FlushWay,
}

/// How a [`FlushAs`] array flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlushWay {
    /// As the emulated device: not at all ([`FlushAs::device`]).
    Device,
    /// Through this flush lane of the array ([`Media::flush_ranges_in`]).
    Lane(usize),
}

impl<M: Media> FlushAs<M> {
    /// An array whose flushes are the emulated device's own: a completed write is already in
    /// the array, which outlives the daemon, so a flush has nothing to wait for (as an NVM
    /// device's flush of its write buffer costs microseconds). A daemon that promises only
    /// the device's persistence (`monetad --durability device`) gives the engine its array
    /// so, and a channel's FLUSH and the engine's stop leave the backing file to the host's
    /// own writeback.
    pub fn device(inner: M) -> Self {
        Self {
            inner,
            way: FlushWay::Device,
        }
    }

    /// An array whose flushes all go through flush lane `lane` of `inner`: what a thread that
    /// flushes beside others is given, so that it hears every write-back error of its own
    /// ranges however the others' flushes fare. The daemon gives the engine its array so at
    /// the `host` level: a channel's FLUSH then never shares an open file description with
    /// the file system's checkpoints (the array's own descriptor) or its group commit (the
    /// other lanes). Where `inner` has no such lane, its flushes are `inner`'s own.
    pub fn lane(inner: M, lane: usize) -> Self {
        Self {
            inner,
            way: FlushWay::Lane(lane),
        }
    }
}

impl<M: Media> Media for FlushAs<M> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn persistent(&self) -> bool {
        self.inner.persistent()
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.write(addr, src, len) }
    }
    fn flush(&self, addr: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.flush_ranges(&[(addr, len)])
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        match self.way {
            FlushWay::Device => Ok(()),
            FlushWay::Lane(lane) => self.inner.flush_ranges_in(lane, ranges),
        }
    }
    fn flush_lanes(&self) -> usize {
        1
    }
    fn flush_ranges_in(&self, _lane: usize, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.flush_ranges(ranges)
    }
    fn write_file(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_file(addr, bytes)
    }
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        self.inner.zero(addr, len)
    }
    fn overlay(
        &self,
        addr: u64,
        len: u64,
        segment: BorrowedFd<'_>,
        seg_off: u64,
    ) -> io::Result<()> {
        self.inner.overlay(addr, len, segment, seg_off)
    }
    fn detach(&self, addr: u64, len: u64) -> io::Result<()> {
        self.inner.detach(addr, len)
    }
    fn will_need(&self, addr: u64, len: u64) {
        self.inner.will_need(addr, len)
    }
}

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
        if self.persistent {
            // As at `map`: no readahead on the backing file's pages.
            // SAFETY: advice on pages of our own mapping, checked in range by `remap`.
            unsafe {
                let p = self.map.as_mut_ptr().add(addr as usize);
                let _ = rustix::mm::madvise(p.cast(), len as usize, rustix::mm::Advice::Random);
            }
        }
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

/// Writes shorter than this are copied through the cache: streaming pays off only when whole
/// lines are written.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const STREAM_MIN: usize = 1024;

/// Copies `len` bytes from `src` to `dst`, storing the whole cache lines of `dst` around the
/// cache (non-temporal stores), as a device's DMA engine writes its media: the line is not read
/// first and does not displace what the poller keeps in its cache (the channels, the permission
/// table). The ragged ends go through the cache. Ends with a store fence, so the data is
/// ordered before whatever the caller stores next (the completion).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes; the two do not overlap.
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LINE: usize = 64;
        let head = dst.align_offset(LINE).min(len);
        let body = (len - head) / LINE * LINE;
        // SAFETY: every range below lies inside `[0, len)` of both buffers (the caller's
        // contract); the streamed stores go to 64-byte aligned lines of `dst` (`head` aligns
        // it), as `_mm_stream_si128` needs 16-byte alignment; SSE2 is part of x86_64.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let mut off = head;
            while off < head + body {
                let s = src.add(off).cast::<__m128i>();
                let d = dst.add(off).cast::<__m128i>();
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                off += LINE;
            }
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
            _mm_sfence();
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

fn zero_by_stores(m: &MappedArray, addr: u64, len: u64) -> io::Result<()> {
    if len > 0 {
        // SAFETY: `ptr` checks the range against the mapping.
        unsafe { std::ptr::write_bytes(m.ptr(addr, len as usize), 0, len as usize) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn shown_runs_merge_when_shown_and_split_when_detached() {
        let a = MappedArray::volatile(1 << 20).unwrap();
        let runs = |a: &MappedArray| {
            a.shown
                .lock()
                .unwrap()
                .clone()
                .into_iter()
                .collect::<Vec<_>>()
        };
        a.mark_shown(0, 4096, true);
        a.mark_shown(8192, 4096, true);
        assert_eq!(runs(&a), [(0, 4096), (8192, 12288)]);
        a.mark_shown(4096, 4096, true);
        assert_eq!(runs(&a), [(0, 12288)]);
        a.mark_shown(4096, 4096, false);
        assert_eq!(runs(&a), [(0, 4096), (8192, 12288)]);
        a.mark_shown(0, 65536, false);
        assert!(runs(&a).is_empty());
    }
    use super::*;

    #[test]
    fn file_array_persists_and_checks_size() {
        let dir = std::env::temp_dir().join(format!("moneta-media-{}", std::process::id()));
        let path = dir.join("a.img");
        let _ = std::fs::remove_file(&path);
        assert!(matches!(
            MappedArray::open_file(&path, None),
            Err(MediaError::NoSize(_))
        ));
        {
            let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
            assert!(matches!(
                MappedArray::open_file(&path, None),
                Err(MediaError::Busy(_))
            ));
            let data = b"persistent bytes";
            // SAFETY: `data` is valid for its length and the range is inside the array.
            unsafe { a.write(4000, data.as_ptr(), data.len()) };
            a.flush(4000, data.len() as u64).unwrap();
        }
        let a = MappedArray::open_file(&path, None).unwrap();
        assert_eq!(a.size(), 1 << 20);
        let mut buf = [0u8; 16];
        // SAFETY: `buf` is valid for 16 bytes and the range is inside the array.
        unsafe { a.read(4000, buf.as_mut_ptr(), 16) };
        assert_eq!(&buf, b"persistent bytes");
        drop(a);
        assert!(matches!(
            MappedArray::open_file(&path, Some(2 << 20)),
            Err(MediaError::SizeMismatch { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Dirty KiB of the mapping that starts at `start`, from `/proc/self/smaps`.
    fn dirty_kib(start: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{start:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        assert!(lines.next().is_some(), "no mapping at {start:x}");
        lines
            // The mapping's fields, up to the next mapping's first line (`start-end perms …`).
            .take_while(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.ends_with(':'))
            })
            .filter(|l| l.starts_with("Shared_Dirty:") || l.starts_with("Private_Dirty:"))
            .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
            .sum()
    }

    #[test]
    fn each_flush_lane_writes_back_what_the_array_s_mapping_dirtied() {
        let dir = std::env::temp_dir().join(format!("moneta-lanes-{}", std::process::id()));
        let path = dir.join("a.img");
        let _ = std::fs::remove_file(&path);
        let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
        assert_eq!(a.flush_lanes(), FLUSH_LANES);
        let start = a.map.as_ptr() as usize;
        for lane in 0..FLUSH_LANES {
            let at = 8192 * (lane as u64 + 1);
            let data = [lane as u8 + 1; 100];
            // SAFETY: `data` is valid for its length and the range is inside the array.
            unsafe { a.write(at, data.as_ptr(), data.len()) };
            assert!(dirty_kib(start) >= 4, "the store dirtied a page");
            a.flush_ranges_in(lane, &[(at, data.len() as u64)]).unwrap();
            assert_eq!(dirty_kib(start), 0, "lane {lane} wrote the page back");
            // A lane is an open file description of its own, not the array's.
            let lane_fd = a.lanes[lane].file.as_raw_fd();
            assert_ne!(lane_fd, a.file.as_raw_fd());
            let off = rustix::fs::seek(&a.lanes[lane].file, rustix::fs::SeekFrom::Start(77));
            assert_eq!(off.unwrap(), 77);
            assert_eq!(
                rustix::fs::seek(&a.file, rustix::fs::SeekFrom::Current(0)).unwrap(),
                0
            );
        }
        // Past the lanes there are, the array's own descriptor flushes.
        let data = [9u8; 10];
        // SAFETY: as above.
        unsafe { a.write(0, data.as_ptr(), data.len()) };
        a.flush_ranges_in(FLUSH_LANES, &[(0, 10)]).unwrap();
        assert_eq!(dirty_kib(start), 0);
        drop(a);
        // A memfd's array flushes nothing and has one lane.
        let v = MappedArray::volatile(1 << 20).unwrap();
        assert_eq!(v.flush_lanes(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An array in memory that records which lane each flush went through (`None`: its
    /// own descriptor).
    struct Lanes(MappedArray, std::sync::Mutex<Vec<Option<usize>>>);

    impl Media for Lanes {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn persistent(&self) -> bool {
            true
        }
        unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.read(addr, dst, len) }
        }
        unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.0.write(addr, src, len) }
        }
        fn flush(&self, _addr: u64, _len: u64) -> io::Result<()> {
            self.1.lock().unwrap().push(None);
            Ok(())
        }
        fn flush_ranges(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
            self.1.lock().unwrap().push(None);
            Ok(())
        }
        fn flush_lanes(&self) -> usize {
            3
        }
        fn flush_ranges_in(&self, lane: usize, _ranges: &[(u64, u64)]) -> io::Result<()> {
            self.1.lock().unwrap().push(Some(lane));
            Ok(())
        }
    }

    #[test]
    fn an_array_in_a_lane_flushes_only_through_that_lane() {
        let inner = std::sync::Arc::new(Lanes(
            MappedArray::volatile(1 << 20).unwrap(),
            Default::default(),
        ));
        let a = FlushAs::lane(inner.clone(), 2);
        assert_eq!(a.flush_lanes(), 1);
        a.flush(4096, 100).unwrap();
        a.flush(0, 0).unwrap();
        a.flush_ranges(&[(0, 10), (8192, 10)]).unwrap();
        a.flush_ranges_in(0, &[(0, 10)]).unwrap();
        // What it does not flush passes through.
        let data = [5u8; 8];
        // SAFETY: `data` is valid for its length and the range is inside the array.
        unsafe { a.write(100, data.as_ptr(), data.len()) };
        let mut back = [0u8; 8];
        // SAFETY: as above.
        unsafe { a.read(100, back.as_mut_ptr(), back.len()) };
        assert_eq!(back, data);
        assert_eq!(a.size(), 1 << 20);
        assert_eq!(*inner.1.lock().unwrap(), vec![Some(2); 3]);
    }

    #[test]
    fn zeroing_and_flushing_ranges_of_a_backing_file() {
        let dir = std::env::temp_dir().join(format!("moneta-zero-{}", std::process::id()));
        let path = dir.join("a.img");
        let _ = std::fs::remove_file(&path);
        let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
        let ones = vec![1u8; 1 << 20];
        // SAFETY: `ones` covers the whole array.
        unsafe { a.write(0, ones.as_ptr(), ones.len()) };
        // Short and long ranges, aligned and not.
        for (addr, len) in [(100u64, 50u64), (8192, 4096), (70_000, 200_000), (4095, 2)] {
            a.zero(addr, len).unwrap();
            let mut back = vec![9u8; len as usize + 2];
            // SAFETY: `back` holds the range and a byte on each side, inside the array.
            unsafe { a.read(addr - 1, back.as_mut_ptr(), back.len()) };
            assert_eq!(back[0], 1, "before {addr}");
            assert!(
                back[1..=len as usize].iter().all(|b| *b == 0),
                "{addr}+{len}"
            );
            assert_eq!(back[len as usize + 1], 1, "after {addr}+{len}");
        }
        a.flush_ranges(&[(0, 4096), (300_000, 10_000), (1 << 19, 1)])
            .unwrap();
        a.flush_ranges(&[]).unwrap();
        // The file keeps its blocks: zeroing never leaves a hole a store could fault in.
        let allocated = std::fs::metadata(&path).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        });
        assert!(allocated.unwrap() >= 1 << 20);
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_device_flush_flushes_nothing_and_passes_the_rest_on() {
        let a = FlushAs::device(MappedArray::volatile(8192).unwrap());
        let data = [7u8; 16];
        // SAFETY: `data` is valid for 16 bytes; the range is inside the array.
        unsafe { a.write(100, data.as_ptr(), 16) };
        a.flush(0, 8192).unwrap();
        a.zero(104, 4).unwrap();
        let mut back = [0u8; 16];
        // SAFETY: `back` is valid for 16 bytes; the range is inside the array.
        unsafe { a.read(100, back.as_mut_ptr(), 16) };
        assert_eq!(back[..4], [7; 4]);
        assert_eq!(back[4..8], [0; 4]);
        assert_eq!(a.size(), 8192);
    }

    #[test]
    fn streamed_writes_land_whole_at_any_alignment() {
        let a = MappedArray::volatile(64 << 10).unwrap();
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // Lengths below, at and above the streaming threshold, array addresses and source
        // offsets on and off cache-line boundaries.
        for (addr, from, len) in [
            (0u64, 0usize, 4096usize),
            (3, 1, 4096),
            (64, 5, STREAM_MIN - 1),
            (127, 0, STREAM_MIN),
            (4095, 17, 8193),
            (40_000, 63, 20_000 - 63),
            (1, 2, 65),
        ] {
            // Fill around the target so a store outside the range would show.
            let fill = vec![0xa5u8; len + 256];
            let base = addr.saturating_sub(128);
            // SAFETY: `fill` is valid for the length written, clipped to the array's end.
            unsafe {
                a.write(
                    base,
                    fill.as_ptr(),
                    fill.len().min((a.size() - base) as usize),
                )
            };
            // SAFETY: `src[from..from+len]` is in bounds; the range is inside the array.
            unsafe { a.write(addr, src[from..].as_ptr(), len) };
            let mut back = vec![0u8; len];
            // SAFETY: `back` holds `len` bytes; the range is inside the array.
            unsafe { a.read(addr, back.as_mut_ptr(), len) };
            assert_eq!(back, &src[from..from + len], "addr {addr} len {len}");
            let mut edge = [0u8; 1];
            if addr > 0 {
                // SAFETY: one byte inside the array.
                unsafe { a.read(addr - 1, edge.as_mut_ptr(), 1) };
                assert_eq!(edge[0], 0xa5, "byte before addr {addr}");
            }
            if addr + (len as u64) < a.size() {
                // SAFETY: one byte inside the array.
                unsafe { a.read(addr + len as u64, edge.as_mut_ptr(), 1) };
                assert_eq!(edge[0], 0xa5, "byte after addr {addr} len {len}");
            }
        }
    }

    #[test]
    fn pieces_shown_one_by_one_and_detached_together() {
        use std::io::Write;
        let a = MappedArray::volatile(1 << 20).unwrap();
        let own = [1u8; 8192];
        // SAFETY: `own` is valid for its length, inside the array.
        unsafe { a.write(8192, own.as_ptr(), own.len()) };
        let fd = rustix::fs::memfd_create("piece", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut seg = File::from(fd);
        seg.write_all(&[2u8; 8192]).unwrap();
        a.overlay(8192, 4096, seg.as_fd(), 0).unwrap();
        a.overlay(12288, 4096, seg.as_fd(), 4096).unwrap();
        let mut got = [0u8; 8192];
        // SAFETY: `got` is valid for its length.
        unsafe { a.read(8192, got.as_mut_ptr(), got.len()) };
        assert!(got.iter().all(|&b| b == 2), "the segment's pages are shown");
        // A store through the array is a store to the segment.
        // SAFETY: as above.
        unsafe { a.write(9000, [9u8].as_ptr(), 1) };
        let mut one = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&seg, &mut one, 808).unwrap();
        assert_eq!(one, [9]);
        assert_eq!(a.overlaid.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(
            a.shown
                .lock()
                .unwrap()
                .clone()
                .into_iter()
                .collect::<Vec<_>>(),
            [(8192, 16384)]
        );
        a.detach(8192, 8192).unwrap();
        assert_eq!(a.overlaid.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(a.shown.lock().unwrap().is_empty());
        // The array's own pages again (a volatile array's were given back: zeros).
        // SAFETY: as above.
        unsafe { a.read(8192, got.as_mut_ptr(), got.len()) };
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn volatile_array_rejects_bad_sizes() {
        assert!(MappedArray::volatile(0).is_err());
        assert!(MappedArray::volatile(5000).is_err());
        let a = MappedArray::volatile(8192).unwrap();
        assert!(!a.persistent());
        let mut b = [1u8; 8];
        // SAFETY: `b` is valid for 8 bytes and the range is inside the array.
        unsafe { a.read(8184, b.as_mut_ptr(), 8) };
        assert_eq!(b, [0; 8]);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn out_of_range_access_panics() {
        let a = MappedArray::volatile(4096).unwrap();
        let mut b = [0u8; 8];
        // SAFETY: `b` is valid for 8 bytes; the range is deliberately outside the array and
        // the bounds assertion must fire before any copy.
        unsafe { a.read(4092, b.as_mut_ptr(), 8) };
    }
}
