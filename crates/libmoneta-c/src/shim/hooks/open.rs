//! Opening and closing: `open` and its variants, `close`, `close_range`, `closefrom`.

use super::*;
/// Opens an nvfs path as a new Moneta descriptor.
pub(super) fn open_moneta(
    m: &libmoneta::Moneta,
    path: Vec<u8>,
    flags: c_int,
    mode: mode_t,
) -> Result<c_int, i32> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(libc::EOPNOTSUPP);
    }
    let mut oflags = flags;
    if oflags & libc::O_PATH != 0 {
        // A path-only descriptor (for fstat, fchdir, *at): opened for reading.
        oflags = libc::O_RDONLY | (flags & (libc::O_DIRECTORY | libc::O_NOFOLLOW));
    }
    let mode = if flags & libc::O_CREAT != 0 {
        (mode & 0o7777) & !current_umask()
    } else {
        0
    };
    let file = m.open_flags(p(&path), oflags, mode).map_err(eno)?;
    let is_dir = file.is_dir();
    let fd = reserve(flags & libc::O_CLOEXEC != 0)?;
    let kept = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_PATH;
    fds::set(
        fd,
        Arc::new(Desc {
            file,
            path,
            flags: (flags & kept | libc::O_LARGEFILE).into(),
            is_dir,
            dir_cookie: Mutex::new(0),
            write_locked: false.into(),
        }),
    );
    count(&COUNTERS.opens, 1);
    log(DEBUG, format_args!("open fd {fd}"));
    std_after(fd);
    Ok(fd)
}

/// `openat(2)` and every variant (`open`, `open64`, `creat`, `__open_2`, ...): the C side
/// has read the mode when `O_CREAT` or `O_TMPFILE` asked for one.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn moneta_shim_openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        // SAFETY: per the caller.
        match unsafe { crate::shim::route(dirfd, path) } {
            crate::shim::Route::Moneta(m, np) => {
                return run(-1, || open_moneta(m, np, flags, mode))
            }
            crate::shim::Route::Fail(e) => return crate::shim::fail(-1, e),
            crate::shim::Route::Host(h) => host = h,
        }
    }
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding the caller's arguments (or the rewritten path).
    let fd = unsafe {
        real!(openat64: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode)
    };
    if fd >= 0 && crate::shim::kfs::serving() && hooked() {
        // A file of the daemon's kernel file system: its data through the channel.
        return crate::shim::kfs::adopt(fd, flags);
    }
    fd
}

/// `creat(2)`.
///
/// # Safety
///
/// As `creat(2)`.
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe {
        moneta_shim_openat(
            libc::AT_FDCWD,
            path,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            mode,
        )
    }
}

/// `creat64(2)`.
///
/// # Safety
///
/// As `creat(2)`.
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { creat(path, mode) }
}

pub(super) fn close_moneta(fd: c_int, d: Arc<Desc>) -> Result<c_int, i32> {
    // SAFETY: our reserved descriptor.
    let r = unsafe { libc::syscall(libc::SYS_close, fd) };
    // The last reference closes the file on the daemon (see `File::close_soon`).
    if let Ok(d) = Arc::try_unwrap(d) {
        d.file.close_soon().map_err(eno)?;
    }
    if r < 0 {
        return Err(crate::shim::errno());
    }
    Ok(0)
}

/// `close(2)`.
#[no_mangle]
pub extern "C" fn close(fd: c_int) -> c_int {
    if hooked() && fds::is_moneta(fd) {
        std_before(fd);
        if let Some(d) = fds::remove(fd) {
            let r = run(-1, || close_moneta(fd, d));
            std_after(fd);
            return r;
        }
    }
    if hooked() && crate::shim::kfs::has(fd) {
        let k = crate::shim::kfs::forget(fd);
        // SAFETY: forwarding.
        let r = unsafe { real!(close: fn(c_int) -> c_int)(fd) };
        let e = crate::shim::errno();
        // The last descriptor of the description gives the file back to the daemon.
        crate::shim::inside(|| drop(k));
        crate::shim::set_errno(e);
        return r;
    }
    // SAFETY: forwarding.
    unsafe { real!(close: fn(c_int) -> c_int)(fd) }
}

/// Closes `[first, last]` except the library's own descriptors (its connection and position
/// segments), whose numbers the program does not know it holds.
pub(super) fn close_range_sparing(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    let mut keep: Vec<c_uint> = libmoneta::fork::own_descriptors()
        .into_iter()
        .filter_map(|f| c_uint::try_from(f).ok())
        .filter(|&f| f >= first && f <= last)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut lo = first;
    for k in keep.into_iter().chain(std::iter::once(c_uint::MAX)) {
        let hi = if k == c_uint::MAX {
            last
        } else {
            k.saturating_sub(1)
        };
        if k != lo && lo <= hi && (k == c_uint::MAX || k > lo) {
            // SAFETY: closing a range of the application's descriptors, as it asked.
            let r = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, flags) };
            if r < 0 {
                return -1;
            }
        }
        if k == c_uint::MAX {
            break;
        }
        lo = k.saturating_add(1);
        if lo > last {
            break;
        }
    }
    0
}

/// `close_range(2)`: Moneta descriptors in the range are closed too; the library's own stay.
#[no_mangle]
pub extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if hooked() && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        for (fd, _) in fds::all() {
            if (fd as c_uint) >= first && (fd as c_uint) <= last {
                drop(fds::remove(fd));
            }
        }
        for fd in crate::shim::kfs::numbers() {
            if (fd as c_uint) >= first && (fd as c_uint) <= last {
                let k = crate::shim::kfs::forget(fd);
                crate::shim::inside(|| drop(k));
            }
        }
        let saved = crate::shim::errno();
        let r = crate::shim::inside(|| close_range_sparing(first, last, flags as c_uint));
        if r == 0 {
            crate::shim::set_errno(saved);
        }
        return r;
    }
    // SAFETY: forwarding.
    unsafe { real!(close_range: fn(c_uint, c_uint, c_int) -> c_int)(first, last, flags) }
}

/// `closefrom(3)`: as `close_range(low, ~0, 0)`.
#[no_mangle]
pub extern "C" fn closefrom(low: c_int) {
    if hooked() && low >= 0 {
        let _ = close_range(low as c_uint, c_uint::MAX, 0);
        return;
    }
    // SAFETY: forwarding.
    unsafe { real!(closefrom: fn(c_int) -> ())(low) }
}
