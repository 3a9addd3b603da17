//! Descriptors: `dup`, `dup2`, `dup3`, `fcntl`, `flock`, `ioctl`.

use super::*;

/// `dup(2)`.
#[no_mangle]
pub extern "C" fn dup(fd: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: duplicating our reserved descriptor.
            let n = unsafe { libc::syscall(libc::SYS_dup, fd) } as c_int;
            if n < 0 {
                return Err(crate::shim::errno());
            }
            fds::set(n, d);
            std_after(n);
            Ok(n)
        },
        real!(dup: fn(c_int) -> c_int)(fd)
    )
}

pub(super) fn dup3_impl(old: c_int, new: c_int, flags: c_int) -> Option<Result<c_int, i32>> {
    let src = fds::get(old);
    let dst = fds::is_moneta(new);
    if src.is_none() && !dst {
        return None;
    }
    Some((|| {
        if old == new {
            return if flags != 0 {
                Err(libc::EINVAL)
            } else {
                Ok(new)
            };
        }
        if !fds::fits(new) {
            return Err(libc::EBADF);
        }
        std_before(new);
        // SAFETY: the kernel replaces `new` atomically, as for any dup2.
        let r = unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) } as c_int;
        if r < 0 {
            return Err(crate::shim::errno());
        }
        let before = match src {
            Some(d) => {
                let prev = fds::get(new);
                fds::set(new, d);
                prev
            }
            None => fds::remove(new),
        };
        drop(before);
        std_after(new);
        Ok(new)
    })())
}

/// `dup2(2)`.
#[no_mangle]
pub extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if hooked() {
        if old == new {
            if let Some(_d) = fds::get(old) {
                return new;
            }
        }
        if let Some(r) = dup3_impl(old, new, 0) {
            return run(-1, || r);
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(dup2: fn(c_int, c_int) -> c_int)(old, new) }
}

/// `dup3(2)`.
#[no_mangle]
pub extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if hooked() {
        if let Some(r) = dup3_impl(old, new, flags) {
            return run(-1, || r);
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(dup3: fn(c_int, c_int, c_int) -> c_int)(old, new, flags) }
}

/// `fcntl(2)` on a Moneta descriptor (the C side reads the variadic argument).
#[no_mangle]
pub extern "C" fn moneta_shim_fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            return run(-1, || fcntl_moneta(fd, &d, cmd, arg));
        }
    }
    // SAFETY: forwarding; the argument is passed on as the C library received it.
    unsafe { real!(fcntl64: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

pub(super) fn fcntl_moneta(fd: c_int, d: &Arc<Desc>, cmd: c_int, arg: usize) -> Result<c_int, i32> {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: duplicating our reserved descriptor.
            let n = unsafe { libc::syscall(libc::SYS_fcntl, fd, cmd, arg) } as c_int;
            if n < 0 {
                return Err(crate::shim::errno());
            }
            if !fds::fits(n) {
                // SAFETY: ours.
                unsafe { libc::syscall(libc::SYS_close, n) };
                return Err(libc::EMFILE);
            }
            fds::set(n, d.clone());
            std_after(n);
            Ok(n)
        }
        libc::F_GETFD | libc::F_SETFD => {
            // The close-on-exec flag is the kernel's, on our descriptor.
            // SAFETY: on our reserved descriptor.
            let r = unsafe { libc::syscall(libc::SYS_fcntl, fd, cmd, arg) } as c_int;
            if r < 0 {
                Err(crate::shim::errno())
            } else {
                Ok(r)
            }
        }
        libc::F_GETFL => Ok(d.flags.load(Ordering::Relaxed)),
        libc::F_SETFL => {
            // As Linux: only these status flags change; the access mode stays.
            let settable = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;
            let v = arg as c_int;
            let old = d.flags.load(Ordering::Relaxed);
            d.flags
                .store((old & !settable) | (v & settable), Ordering::Relaxed);
            d.file.set_append(v & libc::O_APPEND != 0);
            Ok(0)
        }
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => crate::shim::locks::fcntl_lock(d, cmd, arg),
        libc::F_GETLEASE => Ok(libc::F_UNLCK),
        libc::F_SETLEASE
        | libc::F_NOTIFY
        | libc::F_SETPIPE_SZ
        | libc::F_GETPIPE_SZ
        | libc::F_ADD_SEALS
        | libc::F_GET_SEALS => Err(libc::EINVAL),
        // F_SETSIG and F_GETSIG (10 and 11 on Linux): no signals come from a regular file.
        libc::F_GETOWN | libc::F_SETOWN | 10 | 11 => Ok(0),
        _ => Err(libc::EINVAL),
    }
}

/// `flock(2)`.
#[no_mangle]
pub extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| crate::shim::locks::flock(&d, op),
        real!(flock: fn(c_int, c_int) -> c_int)(fd, op)
    )
}

/// Says once, on standard error, why a Moneta file cannot be mapped shared and what to do:
/// the program itself usually reports only an I/O error (SQLite: "disk I/O error").
fn refuse_map(path: &[u8]) {
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        let sqlite = if path.ends_with(b"-shm") {
            " SQLite in WAL mode maps its -shm file: keep databases under the prefix in \
             another journal mode; one already in WAL mode opens with \
             `PRAGMA locking_mode=EXCLUSIVE;` (which needs no map), and \
             `PRAGMA journal_mode=DELETE;` then turns it back"
        } else {
            ""
        };
        log(
            crate::shim::ERROR,
            format_args!(
                "mmap of {} refused (ENODEV): this array hands out no files' pages \
                 (it keeps data checksums, which stores through a mapping would bypass), so \
                 its files cannot be mapped shared (MAP_SHARED); private mappings \
                 (MAP_PRIVATE) are copies.{sqlite}",
                String::from_utf8_lossy(&crate::shim::paths::outer(path))
            ),
        )
    });
}

/// A private mapping of a Moneta file: anonymous memory holding a copy of the file's bytes
/// from `off` (zeros past the end), with the protection asked for. `MAP_PRIVATE` promises
/// no more: the process's own stores stay its own, and POSIX leaves unspecified whether
/// later changes of the file show through, so readers that map (git, `ld.so`, `grep`) work.
/// The caller has made [`map_checks`].
fn map_private_copy(
    d: &Desc,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<*mut c_void, i32> {
    // The flags that describe the mapping's place and backing carry over; the file does not.
    let keep = libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_NORESERVE
        | libc::MAP_POPULATE
        | libc::MAP_LOCKED;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (flags & keep);
    // SAFETY: an anonymous mapping where the caller asked for the file's.
    let p = unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            anon,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::shim::errno());
    }
    let undo = |e: i32| {
        // SAFETY: unmapping what was just mapped.
        unsafe { libc::munmap(p, len) };
        Err(e)
    };
    // SAFETY: `len` bytes just mapped readable and writable, seen by nothing else yet.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let mut at = 0usize;
    while at < len {
        match d.file.read_at(&mut buf[at..], off as u64 + at as u64) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) => return undo(eno(e)),
        }
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        // SAFETY: changing the protection of our own mapping.
        if unsafe { libc::mprotect(p, len, prot) } != 0 {
            return undo(crate::shim::errno());
        }
    }
    super::data::data_io(at, false);
    Ok(p)
}

/// The kernel's checks of a file mapping, before anything is mapped: a length, an offset
/// that is a multiple of the page size, a regular file open for reading.
fn map_checks(d: &Desc, len: size_t, off: off_t) -> Result<(), i32> {
    // SAFETY: a plain system call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as i64;
    if len == 0 || off < 0 || off % page != 0 {
        return Err(libc::EINVAL);
    }
    if d.is_dir {
        return Err(libc::ENODEV);
    }
    if d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE == libc::O_WRONLY {
        return Err(libc::EACCES);
    }
    Ok(())
}

/// A mapping of a Moneta file's own pages (a memory drive, `OP_FS_MAP`): the kernel maps
/// them as asked and enforces the descriptor's mode, which is the file's open mode (a shared
/// mapping of a file open for writing gets writable pages; any other gets read-only ones, so
/// `PROT_WRITE` on a shared mapping of a read-only open fails with `EACCES`, at `mmap` or
/// at a later `mprotect`). `Ok(None)` where the array hands out no pages (`ENODEV`). The
/// caller has made [`map_checks`].
fn map_pages(
    d: &Desc,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<Option<*mut c_void>, i32> {
    let acc = d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE;
    let shared = flags & 3 != libc::MAP_PRIVATE;
    let write = shared && acc == libc::O_RDWR;
    let pages = match d.file.pages(write).map_err(eno) {
        Ok((fd, _)) => fd,
        Err(libc::ENODEV) => return Ok(None),
        Err(e) => return Err(e),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: the caller's mapping, of the file's pages instead of the file's descriptor.
    let p = unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr,
            len,
            prot,
            flags,
            pages.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::shim::errno());
    }
    Ok(Some(p))
}

/// `mmap(2)`: a mapping of a Moneta file maps the file's own pages ([`map_pages`]); where
/// the array hands none out (one with data checksums), a private mapping is a copy
/// ([`map_private_copy`]) and a shared one fails with `ENODEV` (as for a file system without
/// `mmap`); anonymous and other mappings go to the C library.
///
/// # Safety
///
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if hooked() && flags & libc::MAP_ANONYMOUS == 0 {
        if let Some(d) = fds::get(fd) {
            return run(libc::MAP_FAILED, || {
                map_checks(&d, len, off)?;
                if let Some(p) = map_pages(&d, addr, len, prot, flags, off)? {
                    return Ok(p);
                }
                // MAP_SHARED_VALIDATE (3) is a shared mapping too.
                if flags & 3 == libc::MAP_PRIVATE {
                    return map_private_copy(&d, addr, len, prot, flags, off);
                }
                refuse_map(&d.path);
                Err(libc::ENODEV)
            });
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr, len, prot, flags, fd, off,
        )
    }
}

/// `mmap64(2)`.
///
/// # Safety
///
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // SAFETY: per the caller.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}
