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

use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

mod copy;
mod mapped;

pub use mapped::{MappedArray, MAX_ARRAY_SIZE, ZERO_BY_STORES};

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
