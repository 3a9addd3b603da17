//! Descriptors: `dup`, `dup2`, `dup3`, `fcntl`, `flock`.

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
