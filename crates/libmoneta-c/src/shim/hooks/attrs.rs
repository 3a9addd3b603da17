//! Attributes: the `stat` family, `statx`, `access`.

use super::*;

/// Fills a `struct stat` from nvfs attributes.
pub(crate) fn fill_stat(s: &FsStat, out: &mut libc::stat) {
    // SAFETY: all-zero is a valid `struct stat`.
    *out = unsafe { std::mem::zeroed() };
    out.st_dev = MONETA_DEV;
    out.st_ino = s.ino;
    out.st_nlink = s.nlink as _;
    out.st_mode = s.mode;
    out.st_uid = s.uid;
    out.st_gid = s.gid;
    out.st_size = s.size as _;
    out.st_blksize = s.blksize as _;
    out.st_blocks = s.blocks as _;
    out.st_atime = s.atime.sec;
    out.st_atime_nsec = s.atime.nsec as _;
    out.st_mtime = s.mtime.sec;
    out.st_mtime_nsec = s.mtime.nsec as _;
    out.st_ctime = s.ctime.sec;
    out.st_ctime_nsec = s.ctime.nsec as _;
}

pub(super) fn fill_statx(s: &FsStat, out: &mut libc::statx) {
    // SAFETY: all-zero is a valid `struct statx`.
    *out = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    out.stx_blksize = s.blksize as u32;
    out.stx_nlink = s.nlink;
    out.stx_uid = s.uid;
    out.stx_gid = s.gid;
    out.stx_mode = s.mode as u16;
    out.stx_ino = s.ino;
    out.stx_size = s.size;
    out.stx_blocks = s.blocks;
    let t = |w: WireTime| {
        // SAFETY: all-zero is a valid timestamp.
        let mut ts: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        ts.tv_sec = w.sec;
        ts.tv_nsec = w.nsec;
        ts
    };
    out.stx_atime = t(s.atime);
    out.stx_btime = t(s.btime);
    out.stx_ctime = t(s.ctime);
    out.stx_mtime = t(s.mtime);
    out.stx_dev_major = 0;
    out.stx_dev_minor = MONETA_DEV as u32;
}

/// Attributes of a Moneta path or descriptor.
pub(super) fn moneta_stat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> Result<Result<FsStat, i32>, Option<std::ffi::CString>> {
    // SAFETY: a non-NULL path is a NUL-terminated string (the hook's caller's promise).
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        let d = if dirfd == libc::AT_FDCWD {
            None
        } else {
            fds::get(dirfd)
        };
        return match d {
            Some(d) => Ok(d.file.stat().map_err(eno)),
            None => Err(None),
        };
    }
    // SAFETY: per the hook's caller.
    let (m, np) = match unsafe { crate::shim::route(dirfd, path) } {
        crate::shim::Route::Moneta(m, np) => (m, np),
        crate::shim::Route::Fail(e) => return Ok(Err(e)),
        crate::shim::Route::Host(h) => return Err(h),
    };
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    Ok(if follow {
        m.stat(p(&np))
    } else {
        m.lstat(p(&np))
    }
    .map_err(eno))
}

/// `fstatat(2)`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        match crate::shim::inside(|| moneta_stat(dirfd, path, flags)) {
            Ok(r) => {
                return run(-1, || {
                    let s = r?;
                    // SAFETY: the caller passes a writable struct stat.
                    fill_stat(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
                    Ok(0)
                });
            }
            Err(h) => host = h,
        }
    }
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe {
        real!(fstatat64: fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int)(
            dirfd, path, out, flags,
        )
    }
}

/// `fstatat64(2)`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `stat(2)`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `stat64(2)`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `lstat(2)`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `lstat64(2)`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `fstat(2)`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, out: *mut libc::stat) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            let s = d.file.stat().map_err(eno)?;
            // SAFETY: the caller passes a writable struct stat.
            fill_stat(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        kfs direct,
        real!(fstat64: fn(c_int, *mut libc::stat) -> c_int)(fd, out)
    )
}

/// `fstat64(2)`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__fxstat` (glibc before 2.33 compiled these calls to it; it still exports it).
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__fxstat64`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__xstat`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `__xstat64`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __xstat64(
    _ver: c_int,
    path: *const c_char,
    out: *mut libc::stat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `__lxstat`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__lxstat64`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    _ver: c_int,
    path: *const c_char,
    out: *mut libc::stat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__fxstatat`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `__fxstatat64`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `statx(2)`.
///
/// # Safety
///
/// As `statx(2)`.
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        match crate::shim::inside(|| moneta_stat(dirfd, path, flags)) {
            Ok(r) => {
                return run(-1, || {
                    let s = r?;
                    // SAFETY: the caller passes a writable struct statx.
                    fill_statx(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
                    Ok(0)
                });
            }
            Err(h) => host = h,
        }
    }
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe {
        real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int)(
            dirfd, path, flags, mask, out,
        )
    }
}

/// `faccessat(2)`: existence, then the permission bits against the real ids (or the
/// effective ones with `AT_EACCESS`), root passing read and write and needing one execute bit,
/// as the kernel decides.
///
/// # Safety
///
/// As `faccessat(2)`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    amode: c_int,
    flags: c_int,
) -> c_int {
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        match crate::shim::inside(|| moneta_stat(dirfd, path, flags & libc::AT_SYMLINK_NOFOLLOW)) {
            Ok(r) => {
                return run(-1, || {
                    let s = r?;
                    if amode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
                        return Err(libc::EINVAL);
                    }
                    if amode == libc::F_OK {
                        return Ok(0);
                    }
                    // SAFETY: plain system calls.
                    let (uid, gid) = unsafe {
                        if flags & libc::AT_EACCESS != 0 {
                            (libc::geteuid(), libc::getegid())
                        } else {
                            (libc::getuid(), libc::getgid())
                        }
                    };
                    if may_access(&s, uid, gid, amode) {
                        Ok(0)
                    } else {
                        Err(libc::EACCES)
                    }
                });
            }
            Err(h) => host = h,
        }
    }
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe {
        real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int)(dirfd, path, amode, flags)
    }
}

pub(super) fn in_groups(gid: u32) -> bool {
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: a buffer of 256 entries.
    let n = unsafe { libc::getgroups(256, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

pub(crate) fn may_access(s: &FsStat, uid: u32, gid: u32, amode: c_int) -> bool {
    let mode = s.mode;
    if uid == 0 {
        // Root: read and write always; execute if anyone may, or a directory.
        return amode & libc::X_OK == 0
            || mode & 0o111 != 0
            || mode & libc::S_IFMT == libc::S_IFDIR;
    }
    let bits = if s.uid == uid {
        (mode >> 6) & 7
    } else if s.gid == gid || in_groups(s.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    let want = ((amode & libc::R_OK != 0) as u32) << 2
        | ((amode & libc::W_OK != 0) as u32) << 1
        | (amode & libc::X_OK != 0) as u32;
    bits & want == want
}

/// `access(2)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, 0) }
}

/// `euidaccess(3)` / `eaccess(3)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, libc::AT_EACCESS) }
}

/// `eaccess(3)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, libc::AT_EACCESS) }
}
