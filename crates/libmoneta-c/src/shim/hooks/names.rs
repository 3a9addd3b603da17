//! Names: `unlink`, `rename`, `mkdir`, `rmdir`, `link`, `symlink`, `readlink`.

use super::*;

/// `unlinkat(2)`.
///
/// # Safety
///
/// As `unlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if flags & !libc::AT_REMOVEDIR != 0 {
                return Err(libc::EINVAL);
            }
            if flags & libc::AT_REMOVEDIR != 0 {
                m.rmdir(p(&np)).map(|_| 0).map_err(eno)
            } else {
                m.unlink(p(&np)).map(|_| 0).map_err(eno)
            }
        },
        real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int)(dirfd, path, flags)
    )
}

/// `unlink(2)`.
///
/// # Safety
///
/// As `unlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { unlinkat(libc::AT_FDCWD, path, 0) }
}

/// `rmdir(2)`.
///
/// # Safety
///
/// As `rmdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { unlinkat(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

/// `mkdirat(2)`.
///
/// # Safety
///
/// As `mkdirat(2)`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| m
            .mkdir(p(&np), (mode & 0o7777) & !current_umask())
            .map(|_| 0)
            .map_err(eno),
        real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, path, mode)
    )
}

/// `mkdir(2)`.
///
/// # Safety
///
/// As `mkdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

/// `renameat2(2)`: both names on Moneta, or neither (`EXDEV` otherwise, as between two file
/// systems).
///
/// # Safety
///
/// As `renameat2(2)`.
#[no_mangle]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    let (mut h1, mut h2) = (None, None);
    if hooked() {
        // SAFETY: per the caller.
        match unsafe { route_pair(olddir, old, newdir, new) } {
            Pair::Moneta(m, a, b) => {
                return run(-1, || {
                    if flags & !libc::RENAME_NOREPLACE != 0 {
                        return Err(libc::EINVAL);
                    }
                    m.rename(p(&a), p(&b), flags & libc::RENAME_NOREPLACE != 0)
                        .map(|_| 0)
                        .map_err(eno)
                })
            }
            Pair::Fail(e) => return crate::shim::fail(-1, e),
            Pair::Host(a, b) => (h1, h2) = (a, b),
        }
    }
    let old = h1.as_ref().map_or(old, |c| c.as_ptr());
    let new = h2.as_ref().map_or(new, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe {
        real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(
            olddir, old, newdir, new, flags,
        )
    }
}

/// `renameat(2)`.
///
/// # Safety
///
/// As `renameat(2)`.
#[no_mangle]
pub unsafe extern "C" fn renameat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { renameat2(olddir, old, newdir, new, 0) }
}

/// `rename(2)`.
///
/// # Safety
///
/// As `rename(2)`.
#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { renameat2(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

/// `linkat(2)` (both names on Moneta, else `EXDEV`).
///
/// # Safety
///
/// As `linkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn linkat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    let (mut h1, mut h2) = (None, None);
    if hooked() {
        // SAFETY: per the caller.
        match unsafe { route_pair(olddir, old, newdir, new) } {
            Pair::Moneta(m, a, b) => {
                return run(-1, || m.link(p(&a), p(&b)).map(|_| 0).map_err(eno))
            }
            Pair::Fail(e) => return crate::shim::fail(-1, e),
            Pair::Host(a, b) => (h1, h2) = (a, b),
        }
    }
    let old = h1.as_ref().map_or(old, |c| c.as_ptr());
    let new = h2.as_ref().map_or(new, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe {
        real!(linkat: fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int)(
            olddir, old, newdir, new, flags,
        )
    }
}

/// `link(2)`.
///
/// # Safety
///
/// As `link(2)`.
#[no_mangle]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { linkat(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

/// `symlinkat(2)`: the link is Moneta's when its own path is.
///
/// # Safety
///
/// As `symlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if target.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: per the caller.
            let t = unsafe { CStr::from_ptr(target) }.to_bytes();
            m.symlink(t, p(&np)).map(|_| 0).map_err(eno)
        },
        real!(symlinkat: fn(*const c_char, c_int, *const c_char) -> c_int)(target, dirfd, path)
    )
}

/// `symlink(2)`.
///
/// # Safety
///
/// As `symlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { symlinkat(target, libc::AT_FDCWD, path) }
}

/// `readlinkat(2)`.
///
/// # Safety
///
/// As `readlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if size == 0 {
                return Err(libc::EINVAL);
            }
            let t = m.readlink(p(&np)).map_err(eno)?;
            let n = t.len().min(size);
            // SAFETY: the caller passes `size` writable bytes.
            unsafe { slice_mut(buf.cast(), n) }.copy_from_slice(&t[..n]);
            Ok(n as ssize_t)
        },
        real!(readlinkat: fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t)(
            dirfd, path, buf, size
        )
    )
}

/// `readlink(2)`.
///
/// # Safety
///
/// As `readlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { readlinkat(libc::AT_FDCWD, path, buf, size) }
}
