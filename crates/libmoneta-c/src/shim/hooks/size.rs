//! Durability and size: `fsync`, `fdatasync`, `truncate`, `fallocate`, advice.

use super::*;

/// `fsync(2)`.
#[no_mangle]
pub extern "C" fn fsync(fd: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.sync_all().map(|_| 0).map_err(eno),
        kfs | k | Some(k.sync()),
        real!(fsync: fn(c_int) -> c_int)(fd)
    )
}

/// `fdatasync(2)`.
#[no_mangle]
pub extern "C" fn fdatasync(fd: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.sync_data().map(|_| 0).map_err(eno),
        kfs | k | Some(k.sync()),
        real!(fdatasync: fn(c_int) -> c_int)(fd)
    )
}

/// `sync_file_range(2)`: data written through a channel is on the array already; a range with
/// `SYNC_FILE_RANGE_WAIT_AFTER` makes it durable like `fdatasync`.
#[no_mangle]
pub extern "C" fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            if off < 0 || n < 0 || flags & !7 != 0 {
                return Err(libc::EINVAL);
            }
            if flags & libc::SYNC_FILE_RANGE_WAIT_AFTER != 0 {
                d.file.sync_data().map_err(eno)?;
            }
            Ok(0)
        },
        kfs | k
            | Some(if off < 0 || n < 0 || flags & !7 != 0 {
                Err(libc::EINVAL)
            } else if flags & libc::SYNC_FILE_RANGE_WAIT_AFTER != 0 {
                k.sync()
            } else {
                Ok(0)
            }),
        real!(sync_file_range: fn(c_int, off64_t, off64_t, c_uint) -> c_int)(fd, off, n, flags)
    )
}

/// `ftruncate(2)`.
#[no_mangle]
pub extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            if d.is_dir {
                return Err(libc::EINVAL);
            }
            d.file.set_len(offset(len)?).map(|_| 0).map_err(eno)
        },
        kfs | k | Some(k.set_len(len)),
        real!(ftruncate64: fn(c_int, off64_t) -> c_int)(fd, len)
    )
}

/// `ftruncate64(2)`.
#[no_mangle]
pub extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    ftruncate(fd, len)
}

/// `truncate(2)`.
///
/// # Safety
///
/// As `truncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    with_path!(
        path,
        -1,
        |m, np| m.truncate(p(&np), offset(len)?).map(|_| 0).map_err(eno),
        real!(truncate64: fn(*const c_char, off64_t) -> c_int)(path, len)
    )
}

/// `truncate64(2)`.
///
/// # Safety
///
/// As `truncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off64_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { truncate(path, len) }
}

pub(super) fn fallocate_impl(d: &Desc, mode: c_int, off: i64, len: i64) -> Result<c_int, i32> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if d.is_dir {
        return Err(libc::ENODEV);
    }
    if d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
        // Punching and collapsing holes: not offered by nvfs.
        return Err(libc::EOPNOTSUPP);
    }
    (off as u64).checked_add(len as u64).ok_or(libc::EFBIG)?;
    // The space is taken now (ENOSPC at once, not at a later write), as the kernel does.
    d.file
        .allocate(
            off as u64,
            len as u64,
            mode & libc::FALLOC_FL_KEEP_SIZE != 0,
        )
        .map_err(eno)?;
    Ok(0)
}

/// `fallocate(2)`.
#[no_mangle]
pub extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| fallocate_impl(&d, mode, off, len),
        kfs | k | Some(k.allocate(mode, off, len)),
        real!(fallocate64: fn(c_int, c_int, off64_t, off64_t) -> c_int)(fd, mode, off, len)
    )
}

/// `fallocate64(2)`.
#[no_mangle]
pub extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    fallocate(fd, mode, off, len)
}

/// `posix_fallocate(3)`: returns the error instead of setting `errno`.
#[no_mangle]
pub extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            let saved = crate::shim::errno();
            let r = crate::shim::inside(|| fallocate_impl(&d, 0, off, len));
            crate::shim::set_errno(saved);
            return match r {
                Ok(_) => 0,
                Err(e) => e,
            };
        }
        if let Some(k) = crate::shim::kfs::get(fd) {
            let saved = crate::shim::errno();
            let r = crate::shim::inside(|| k.allocate(0, off, len));
            crate::shim::set_errno(saved);
            return match r {
                Ok(_) => 0,
                Err(e) => e,
            };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(posix_fallocate64: fn(c_int, off64_t, off64_t) -> c_int)(fd, off, len) }
}

/// `posix_fallocate64(3)`.
#[no_mangle]
pub extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    posix_fallocate(fd, off, len)
}

/// `posix_fadvise(2)`: `POSIX_FADV_WILLNEED` tells the device the range will be read soon
/// (`File::will_need`: its DRAM buffer fills it); other advice has nothing to act on (there
/// is no page cache). Returns the error number, as `posix_fadvise` does.
#[no_mangle]
pub extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            if !(0..=5).contains(&advice) || len < 0 || off < 0 {
                return libc::EINVAL;
            }
            if advice != libc::POSIX_FADV_WILLNEED || d.is_dir {
                return 0;
            }
            let saved = crate::shim::errno();
            let r = crate::shim::inside(|| d.file.will_need(off as u64, len as u64));
            crate::shim::set_errno(saved);
            return match r {
                Ok(()) => 0,
                Err(e) => eno(e),
            };
        }
        if crate::shim::kfs::has(fd) {
            // Served through the channel: no page cache holds the file's pages to advise on.
            return if !(0..=5).contains(&advice) || len < 0 || off < 0 {
                libc::EINVAL
            } else {
                0
            };
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(posix_fadvise64: fn(c_int, off64_t, off64_t, c_int) -> c_int)(fd, off, len, advice)
    }
}

/// `posix_fadvise64(2)`.
#[no_mangle]
pub extern "C" fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    posix_fadvise(fd, off, len, advice)
}

/// `readahead(2)`: a hint to the device, as `POSIX_FADV_WILLNEED` (`EINVAL` on a directory,
/// `EBADF` on a file not open for reading).
#[no_mangle]
pub extern "C" fn readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            if d.is_dir || off < 0 {
                return Err(libc::EINVAL);
            }
            if n == 0 {
                return Ok(0);
            }
            d.file.will_need(off as u64, n as u64).map_err(eno)?;
            Ok(0)
        },
        kfs | k
            | Some(if off < 0 {
                Err(libc::EINVAL)
            } else if k.flags.load(Ordering::Relaxed) & libc::O_ACCMODE == libc::O_WRONLY {
                Err(libc::EBADF)
            } else {
                Ok(0)
            }),
        real!(readahead: fn(c_int, off64_t, size_t) -> ssize_t)(fd, off, n)
    )
}
