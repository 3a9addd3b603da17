//! The kernel interfaces the recycled file system rests on: a file's extent map (FIEMAP),
//! leases, the page cache's state of a file, and loop devices.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// `FS_IOC_FIEMAP`: `_IOWR('f', 11, struct fiemap)`.
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// Sync the file before mapping it.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// Bytes of `struct fiemap` before its extents.
const FIEMAP_HEADER: usize = 32;
/// Bytes of one `struct fiemap_extent`.
const FIEMAP_EXTENT: usize = 56;
/// Extents asked for per call.
const FIEMAP_BATCH: usize = 64;

/// `fe_flags` bits.
pub mod flags {
    /// The last extent of the file.
    pub const LAST: u32 = 0x1;
    /// The location is not known yet.
    pub const UNKNOWN: u32 = 0x2;
    /// Delayed allocation: no blocks yet.
    pub const DELALLOC: u32 = 0x4;
    /// The data is encoded (compressed).
    pub const ENCODED: u32 = 0x8;
    /// The data is encrypted.
    pub const DATA_ENCRYPTED: u32 = 0x80;
    /// The extent is not block-aligned.
    pub const NOT_ALIGNED: u32 = 0x100;
    /// The data lives in metadata blocks (inline).
    pub const DATA_INLINE: u32 = 0x200;
    /// Several files' tails packed in one block.
    pub const DATA_TAIL: u32 = 0x400;
    /// Allocated but not written: reads as zeros.
    pub const UNWRITTEN: u32 = 0x800;
    /// The file shares the blocks with another (reflink, snapshot).
    pub const SHARED: u32 = 0x2000;
    /// Where the channel must not go: the bytes are not plainly at the address.
    pub const KERNEL_ONLY: u32 =
        UNKNOWN | DELALLOC | ENCODED | DATA_ENCRYPTED | NOT_ALIGNED | DATA_INLINE | DATA_TAIL;
}

/// One extent of a file's map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First byte of the file.
    pub logical: u64,
    /// Its address on the block device.
    pub physical: u64,
    /// Bytes.
    pub len: u64,
    /// [`flags`].
    pub flags: u32,
}

/// The extents of `fd` that overlap `[start, end)`, in file order, the file synced first
/// (`FIEMAP_FLAG_SYNC`, so delayed allocations have blocks).
pub fn fiemap(fd: BorrowedFd<'_>, start: u64, end: u64) -> io::Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut at = start;
    let mut buf = vec![0u64; (FIEMAP_HEADER + FIEMAP_BATCH * FIEMAP_EXTENT) / 8];
    while at < end {
        buf.iter_mut().for_each(|w| *w = 0);
        buf[0] = at;
        buf[1] = end - at;
        // fm_flags (u32) and fm_extent_count (u32) after fm_mapped_extents.
        buf[2] = u64::from(FIEMAP_FLAG_SYNC);
        buf[3] = FIEMAP_BATCH as u64;
        // SAFETY: `buf` is a `struct fiemap` with room for FIEMAP_BATCH extents, as its
        // fm_extent_count says; the kernel writes within it.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FIEMAP, buf.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let mapped = (buf[2] >> 32) as usize;
        if mapped == 0 {
            break;
        }
        let mut last = false;
        for i in 0..mapped.min(FIEMAP_BATCH) {
            let w = (FIEMAP_HEADER + i * FIEMAP_EXTENT) / 8;
            let e = Extent {
                logical: buf[w],
                physical: buf[w + 1],
                len: buf[w + 2],
                flags: buf[w + 5] as u32,
            };
            last |= e.flags & flags::LAST != 0;
            at = e.logical.saturating_add(e.len).max(at + 1);
            if e.len > 0 {
                out.push(e);
            }
        }
        if last {
            break;
        }
    }
    Ok(out)
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes a write lease on `fd` (the kernel grants it only while no other open file
/// description of the file exists); `Ok(false)` when another exists.
pub fn take_lease(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: an fcntl on a descriptor the caller holds.
    match check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) }) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives a lease back (also the answer to a lease break).
pub fn drop_lease(fd: BorrowedFd<'_>) {
    // SAFETY: an fcntl on a descriptor the caller holds.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
}

/// The lease `fd` holds now (`F_WRLCK`, `F_RDLCK`, `F_UNLCK`); while it is being broken, the
/// kind it must become. `None` if the kernel does not say.
pub fn lease_state(fd: BorrowedFd<'_>) -> Option<libc::c_int> {
    // SAFETY: an fcntl on a descriptor the caller holds.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLEASE) }).ok()
}

/// Has the kernel tell a break of `fd`'s lease by `signal` to this process, with the
/// descriptor in the signal's information.
pub fn notify_breaks(fd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntls on a descriptor the caller holds.
    unsafe {
        check(libc::fcntl(fd.as_raw_fd(), F_SETSIG, signal))?;
        check(libc::fcntl(fd.as_raw_fd(), libc::F_SETOWN, libc::getpid()))?;
    }
    Ok(())
}

/// The access mode and status flags of an open file description.
pub fn status_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: an fcntl on a descriptor the caller holds.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

/// Writes the file's dirty pages back and drops its pages from the page cache, so that the
/// next read through the kernel comes from the array; `Ok(false)` if pages stay (someone
/// holds them).
pub fn flush_cache(fd: BorrowedFd<'_>) -> io::Result<bool> {
    rustix::fs::fdatasync(fd)?;
    // SAFETY: an advice call on a descriptor the caller holds.
    let r = unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(cached_pages(fd)?.is_none_or(|n| n == 0))
}

/// Pages of the file in the page cache (`cachestat`, Linux 6.5), `None` where the kernel
/// cannot say.
pub fn cached_pages(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    // struct cachestat_range { u64 off; u64 len; } (len 0: to the end) and struct cachestat
    // { u64 nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; }.
    let range = [0u64; 2];
    let mut stat = [0u64; 5];
    // SAFETY: the kernel reads `range` and writes `stat`, both of the sizes it expects.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            range.as_ptr(),
            stat.as_mut_ptr(),
            0u32,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(stat[0]))
}

/// `F_SETSIG` (Linux): the signal that tells of a lease break, with the descriptor.
const F_SETSIG: libc::c_int = 10;
/// `cachestat(2)`'s number (the same on every architecture, Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

/// `LOOP_CTL_GET_FREE`.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE`.
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// Detach the loop device when its last user closes it.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Bytes of `struct loop_config`.
const LOOP_CONFIG: usize = 304;

/// Attaches `backing` to a free loop device, detached again once the last user closes it
/// (the mount, when there is one). The device reads and writes through the backing file's
/// page cache, the pages the daemon maps as the array. Returns its path and an open
/// descriptor of it.
pub fn attach_loop(backing: BorrowedFd<'_>) -> io::Result<(std::path::PathBuf, OwnedFd)> {
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut last = io::Error::other("no free loop device");
    for _ in 0..16 {
        // SAFETY: an ioctl without arguments on the loop control device.
        let n = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) })?;
        let path = std::path::PathBuf::from(format!("/dev/loop{n}"));
        let dev = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let mut config = [0u8; LOOP_CONFIG];
        config[0..4].copy_from_slice(&(backing.as_raw_fd() as u32).to_ne_bytes());
        // lo_flags: in struct loop_info64 (at 8), after five u64 and three u32.
        config[60..64].copy_from_slice(&LO_FLAGS_AUTOCLEAR.to_ne_bytes());
        // SAFETY: `config` is a `struct loop_config` the kernel reads.
        match check(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, config.as_ptr()) }) {
            Ok(_) => return Ok((path, OwnedFd::from(dev))),
            // Taken by someone else between the two calls: try the next free one.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}
