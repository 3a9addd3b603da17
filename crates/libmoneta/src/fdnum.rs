//! The library's own descriptors (control socket, channel memory, kick pipe, position
//! segments) live high in the descriptor table, out of the application's way: a program may
//! `dup2` onto any number it believes free (a shell's `exec 3>file`), and would otherwise
//! replace one of ours. They start at half the open-file limit (at least 256).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

fn base() -> i32 {
    static BASE: OnceLock<i32> = OnceLock::new();
    *BASE.get_or_init(|| {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let soft = l.current.unwrap_or(1 << 20).min(1 << 20) as i32;
        (soft / 2).max(256).min(soft.saturating_sub(64).max(3))
    })
}

/// Moves `fd` to a number at or above the base (keeping close-on-exec set); on failure (a low
/// open-file limit) keeps it where it is.
pub(crate) fn hide(fd: OwnedFd) -> OwnedFd {
    let raw = fd.as_raw_fd();
    if raw >= base() {
        return fd;
    }
    // SAFETY: duplicating a descriptor we own.
    let n = unsafe { libc::syscall(libc::SYS_fcntl, raw, libc::F_DUPFD_CLOEXEC, base()) } as i32;
    if n < 0 {
        return fd;
    }
    drop(fd);
    // SAFETY: a fresh descriptor this call made, owned from now on.
    unsafe { OwnedFd::from_raw_fd(n) }
}
