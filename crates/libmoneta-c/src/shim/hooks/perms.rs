//! Permissions and times: `chmod`, `chown`, `utimensat` and their relatives.

use super::*;

/// `fchmodat(2)`.
///
/// # Safety
///
/// As `fchmodat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
                // As Linux: the mode of a symbolic link cannot be changed.
                return Err(libc::EOPNOTSUPP);
            }
            m.chmod(p(&np), mode & 0o7777).map(|_| 0).map_err(eno)
        },
        real!(fchmodat: fn(c_int, *const c_char, mode_t, c_int) -> c_int)(dirfd, path, mode, flags)
    )
}

/// `chmod(2)`.
///
/// # Safety
///
/// As `chmod(2)`.
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchmodat(libc::AT_FDCWD, path, mode, 0) }
}

/// `umask(2)`: set through the C library and kept for the creates (see `current_umask`).
#[no_mangle]
pub extern "C" fn umask(mask: mode_t) -> mode_t {
    let _turn = UMASK_TURN.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the C library's umask, which cannot fail.
    let old = unsafe { real!(umask: fn(mode_t) -> mode_t)(mask) };
    // A `vfork` child runs on its parent's memory, and its umask is its own.
    if getpid() == UMASK_OWNER.load(Ordering::Acquire) {
        UMASK.store(mask & 0o777, Ordering::Release);
    }
    old
}

/// `fchmod(2)`.
#[no_mangle]
pub extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.chmod(mode & 0o7777).map(|_| 0).map_err(eno),
        real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode)
    )
}

/// `fchownat(2)`.
///
/// # Safety
///
/// As `fchownat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: a non-NULL path is a NUL-terminated string.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if hooked() && flags & libc::AT_EMPTY_PATH != 0 && empty {
        if let Some(d) = fds::get(dirfd) {
            return run(-1, || d.file.chown(uid, gid).map(|_| 0).map_err(eno));
        }
    }
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| m
            .chown(p(&np), uid, gid, flags & libc::AT_SYMLINK_NOFOLLOW == 0)
            .map(|_| 0)
            .map_err(eno),
        real!(fchownat: fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int)(
            dirfd, path, uid, gid, flags
        )
    )
}

/// `chown(2)`.
///
/// # Safety
///
/// As `chown(2)`.
#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, 0) }
}

/// `lchown(2)`.
///
/// # Safety
///
/// As `lchown(2)`.
#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `fchown(2)`.
#[no_mangle]
pub extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.chown(uid, gid).map(|_| 0).map_err(eno),
        real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid)
    )
}

pub(super) fn wire(t: Option<&libc::timespec>) -> Result<WireTime, i32> {
    Ok(match t {
        None => WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(t) if t.tv_nsec == libc::UTIME_NOW => WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(t) if t.tv_nsec == libc::UTIME_OMIT => WireTime {
            sec: 0,
            nsec: UTIME_OMIT,
        },
        Some(t) if (0..1_000_000_000).contains(&t.tv_nsec) => WireTime {
            sec: t.tv_sec,
            nsec: t.tv_nsec as u32,
        },
        Some(_) => return Err(libc::EINVAL),
    })
}

pub(super) unsafe fn times2(times: *const libc::timespec) -> Result<(WireTime, WireTime), i32> {
    if times.is_null() {
        return Ok((wire(None)?, wire(None)?));
    }
    // SAFETY: the caller passes two timespecs.
    let t = unsafe { std::slice::from_raw_parts(times, 2) };
    Ok((wire(Some(&t[0]))?, wire(Some(&t[1]))?))
}

/// `utimensat(2)`.
///
/// # Safety
///
/// As `utimensat(2)`.
#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if hooked() && path.is_null() {
        // Linux: a NULL path means the descriptor itself (futimens).
        if let Some(d) = fds::get(dirfd) {
            return run(-1, || {
                // SAFETY: per the caller.
                let (a, m) = unsafe { times2(times) }?;
                d.file.utimes(a, m).map(|_| 0).map_err(eno)
            });
        }
    }
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            // SAFETY: per the caller.
            let (a, mt) = unsafe { times2(times) }?;
            m.utimes(p(&np), a, mt, flags & libc::AT_SYMLINK_NOFOLLOW == 0)
                .map(|_| 0)
                .map_err(eno)
        },
        real!(utimensat: fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int)(
            dirfd, path, times, flags
        )
    )
}

/// `futimens(3)`.
///
/// # Safety
///
/// As `futimens(3)`.
#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: per the caller.
            let (a, m) = unsafe { times2(times) }?;
            d.file.utimes(a, m).map(|_| 0).map_err(eno)
        },
        real!(futimens: fn(c_int, *const libc::timespec) -> c_int)(fd, times)
    )
}

pub(super) unsafe fn tv_to_ts(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: the caller passes two timevals.
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    Some([0, 1].map(|i| libc::timespec {
        tv_sec: t[i].tv_sec,
        tv_nsec: t[i].tv_usec * 1000,
    }))
}

/// `utimes(2)`.
///
/// # Safety
///
/// As `utimes(2)`.
#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if !matches!(unsafe { classify(libc::AT_FDCWD, path) }, Where::Libc) {
            // SAFETY: per the caller.
            let ts = unsafe { tv_to_ts(tv) };
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, 0) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(utimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}

/// `lutimes(3)`.
///
/// # Safety
///
/// As `lutimes(3)`.
#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if !matches!(unsafe { classify(libc::AT_FDCWD, path) }, Where::Libc) {
            // SAFETY: per the caller.
            let ts = unsafe { tv_to_ts(tv) };
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, libc::AT_SYMLINK_NOFOLLOW) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(lutimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}

/// `futimes(3)`.
///
/// # Safety
///
/// As `futimes(3)`.
#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if let Err(e) = crate::shim::kfs::give_back(fd) {
        return crate::shim::fail(-1, e);
    }
    if hooked() && fds::is_moneta(fd) {
        // SAFETY: per the caller.
        let ts = unsafe { tv_to_ts(tv) };
        let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        // SAFETY: per the caller.
        return unsafe { futimens(fd, ptr) };
    }
    // SAFETY: forwarding.
    unsafe { real!(futimes: fn(c_int, *const libc::timeval) -> c_int)(fd, tv) }
}

/// `utime(2)`.
///
/// # Safety
///
/// As `utime(2)`.
#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if !matches!(unsafe { classify(libc::AT_FDCWD, path) }, Where::Libc) {
            // SAFETY: per the caller.
            let ts = unsafe { t.as_ref() }.map(|u| {
                [
                    libc::timespec {
                        tv_sec: u.actime,
                        tv_nsec: 0,
                    },
                    libc::timespec {
                        tv_sec: u.modtime,
                        tv_nsec: 0,
                    },
                ]
            });
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, 0) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(utime: fn(*const c_char, *const libc::utimbuf) -> c_int)(path, t) }
}
