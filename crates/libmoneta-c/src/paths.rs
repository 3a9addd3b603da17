//! Calls on paths: attributes, directories, names, links, modes and owners, sizes, times and
//! the file system's totals.

use super::*;

/// `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_stat(
    m: *const MonetaConn,
    path: *const c_char,
    out: *mut MonetaStat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { stat_impl(m, path, out, true) }
}

/// `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_lstat(
    m: *const MonetaConn,
    path: *const c_char,
    out: *mut MonetaStat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { stat_impl(m, path, out, false) }
}

unsafe fn stat_impl(
    m: *const MonetaConn,
    path: *const c_char,
    out: *mut MonetaStat,
    follow: bool,
) -> c_int {
    let m = obj!(m, -1);
    let p = path_arg!(path, -1);
    // SAFETY: the caller passes a writable MonetaStat.
    let Some(out) = (unsafe { out.as_mut() }) else {
        set_errno(libc::EFAULT);
        return -1;
    };
    let r = if follow { m.m.stat(p) } else { m.m.lstat(p) };
    status(r.map(|s| to_c_stat(&s, out)))
}

/// `mkdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_mkdir(
    m: *const MonetaConn,
    path: *const c_char,
    mode: u32,
) -> c_int {
    let m = obj!(m, -1);
    status(m.m.mkdir(path_arg!(path, -1), mode).map(|_| ()))
}

/// `rmdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_rmdir(m: *const MonetaConn, path: *const c_char) -> c_int {
    let m = obj!(m, -1);
    status(m.m.rmdir(path_arg!(path, -1)))
}

/// `unlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_unlink(m: *const MonetaConn, path: *const c_char) -> c_int {
    let m = obj!(m, -1);
    status(m.m.unlink(path_arg!(path, -1)))
}

/// `rename(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_rename(
    m: *const MonetaConn,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    let m = obj!(m, -1);
    status(m.m.rename(path_arg!(from, -1), path_arg!(to, -1), false))
}

/// `link(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_link(
    m: *const MonetaConn,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    let m = obj!(m, -1);
    status(m.m.link(path_arg!(from, -1), path_arg!(to, -1)).map(|_| ()))
}

/// `symlink(2)`: a link at `path` pointing to `target`.
#[no_mangle]
pub unsafe extern "C" fn moneta_symlink(
    m: *const MonetaConn,
    target: *const c_char,
    path: *const c_char,
) -> c_int {
    let m = obj!(m, -1);
    let t = path_arg!(target, -1);
    status(
        m.m.symlink(t.as_os_str().as_bytes(), path_arg!(path, -1))
            .map(|_| ()),
    )
}

/// `readlink(2)`: the target's bytes (not NUL-terminated, truncated to `size`).
#[no_mangle]
pub unsafe extern "C" fn moneta_readlink(
    m: *const MonetaConn,
    path: *const c_char,
    buf: *mut c_void,
    size: usize,
) -> libc::ssize_t {
    let m = obj!(m, -1);
    let p = path_arg!(path, -1);
    if buf.is_null() && size > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    count(m.m.readlink(p).map(|t| {
        let n = t.len().min(size);
        // SAFETY: the caller passes `size` writable bytes.
        unsafe { slice_mut(buf.cast(), n) }.copy_from_slice(&t[..n]);
        n
    }))
}

/// `chmod(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_chmod(
    m: *const MonetaConn,
    path: *const c_char,
    mode: u32,
) -> c_int {
    let m = obj!(m, -1);
    status(m.m.chmod(path_arg!(path, -1), mode))
}

/// `chown(2)` (`(uint32_t)-1` leaves an id unchanged).
#[no_mangle]
pub unsafe extern "C" fn moneta_chown(
    m: *const MonetaConn,
    path: *const c_char,
    uid: u32,
    gid: u32,
) -> c_int {
    let m = obj!(m, -1);
    status(m.m.chown(path_arg!(path, -1), uid, gid, true))
}

/// `truncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_truncate(
    m: *const MonetaConn,
    path: *const c_char,
    len: i64,
) -> c_int {
    let m = obj!(m, -1);
    let p = path_arg!(path, -1);
    status(offset(len).and_then(|l| m.m.truncate(p, l)))
}

/// `utimensat(2)`: `times` NULL sets both to now; `UTIME_NOW` and `UTIME_OMIT` work as there.
#[no_mangle]
pub unsafe extern "C" fn moneta_utimens(
    m: *const MonetaConn,
    path: *const c_char,
    times: *const libc::timespec,
) -> c_int {
    let m = obj!(m, -1);
    let p = path_arg!(path, -1);
    let wire = |t: &libc::timespec| WireTime {
        sec: t.tv_sec,
        nsec: match t.tv_nsec {
            libc::UTIME_NOW => UTIME_NOW,
            libc::UTIME_OMIT => UTIME_OMIT,
            n => n as u32,
        },
    };
    let (a, b) = if times.is_null() {
        let now = WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        };
        (now, now)
    } else {
        // SAFETY: the caller passes two timespecs.
        let t = unsafe { std::slice::from_raw_parts(times, 2) };
        (wire(&t[0]), wire(&t[1]))
    };
    status(m.m.utimes(p, a, b, true))
}

/// `statfs(2)` of nvfs.
#[no_mangle]
pub unsafe extern "C" fn moneta_statfs(m: *const MonetaConn, out: *mut MonetaStatfs) -> c_int {
    let m = obj!(m, -1);
    // SAFETY: the caller passes a writable MonetaStatfs.
    let Some(out) = (unsafe { out.as_mut() }) else {
        set_errno(libc::EFAULT);
        return -1;
    };
    status(m.m.statfs().map(|s| {
        *out = MonetaStatfs {
            chunk_size: s.chunk_size,
            chunks: s.chunks,
            chunks_free: s.chunks_free,
            inodes: s.inodes,
            inodes_free: s.inodes_free,
            name_max: s.name_max,
        }
    }))
}
