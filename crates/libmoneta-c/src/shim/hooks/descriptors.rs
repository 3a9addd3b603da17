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
        kfs | k | {
            // SAFETY: duplicating the file's `O_PATH` descriptor.
            let r = crate::shim::kfs::duplicate(fd, &k, || unsafe {
                libc::syscall(libc::SYS_dup, fd) as c_int
            });
            if let Some(Ok(n)) = r {
                std_after(n);
            }
            r
        },
        real!(dup: fn(c_int) -> c_int)(fd)
    )
}

/// `dup3` of a kernel file served through the channel ([`crate::shim::kfs`]): `None` when it
/// is not one (or no longer).
fn dup3_kfs(old: c_int, new: c_int, flags: c_int) -> Option<Result<c_int, i32>> {
    let k = crate::shim::kfs::get(old)?;
    if old == new {
        return Some(if flags != 0 {
            Err(libc::EINVAL)
        } else {
            Ok(new)
        });
    }
    if !fds::fits(new) {
        return Some(Err(libc::EBADF));
    }
    std_before(new);
    let before = crate::shim::kfs::forget(new);
    // SAFETY: the kernel replaces `new` atomically, as for any dup2.
    let r = crate::shim::kfs::duplicate(old, &k, || unsafe {
        libc::syscall(libc::SYS_dup3, old, new, flags) as c_int
    });
    if let Some(Ok(_)) = r {
        drop(fds::remove(new));
        drop(before);
        std_after(new);
    }
    r
}

pub(super) fn dup3_impl(old: c_int, new: c_int, flags: c_int) -> Option<Result<c_int, i32>> {
    if crate::shim::kfs::has(old) {
        if let Some(r) = crate::shim::inside(|| dup3_kfs(old, new, flags)) {
            return Some(r);
        }
    }
    if crate::shim::kfs::has(new) && old != new {
        // A kernel file served through the channel is replaced: the kernel's dup3 closes
        // its `O_PATH` descriptor, and the shim forgets it.
        // SAFETY: the kernel replaces `new` atomically, as for any dup2.
        let r = unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) } as c_int;
        if r < 0 {
            return Some(Err(crate::shim::errno()));
        }
        drop(crate::shim::kfs::forget(new));
        let before = fds::remove(new);
        if let Some(d) = fds::get(old) {
            fds::set(new, d);
        }
        drop(before);
        std_after(new);
        return Some(Ok(new));
    }
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
        if old == new && (fds::is_moneta(old) || crate::shim::kfs::has(old)) {
            return new;
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
        if let Some(k) = crate::shim::kfs::get(fd) {
            if let Some(r) = crate::shim::run_kfs(-1, || fcntl_kfs(fd, &k, cmd, arg)) {
                return r;
            }
        }
    }
    // SAFETY: forwarding; the argument is passed on as the C library received it.
    unsafe { real!(fcntl64: fn(c_int, c_int, usize) -> c_int)(fd, cmd, arg) }
}

/// `fcntl` on a kernel file served through the channel: duplicates share it, the status
/// flags are the shim's (`O_APPEND` gives it back to the kernel), the descriptor flags are the
/// kernel's; anything else (locks, leases, ...) gives it back to the kernel first (`None`).
fn fcntl_kfs(
    fd: c_int,
    k: &Arc<crate::shim::kfs::KDesc>,
    cmd: c_int,
    arg: usize,
) -> Option<Result<c_int, i32>> {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: duplicating the file's `O_PATH` descriptor.
            let r = crate::shim::kfs::duplicate(fd, k, || unsafe {
                libc::syscall(libc::SYS_fcntl, fd, cmd, arg) as c_int
            });
            if let Some(Ok(n)) = r {
                std_after(n);
            }
            r
        }
        libc::F_GETFD | libc::F_SETFD => None,
        libc::F_GETFL => Some(Ok(k.flags.load(Ordering::Relaxed))),
        libc::F_SETFL if arg as c_int & libc::O_APPEND == 0 => {
            let settable = libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;
            let old = k.flags.load(Ordering::Relaxed);
            k.flags.store(
                (old & !settable) | (arg as c_int & settable),
                Ordering::Relaxed,
            );
            Some(Ok(0))
        }
        _ => crate::shim::kfs::settle(fd).err().map(Err),
    }
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
