//! The C library's file functions, exported under their own names: Moneta files go through
//! libmoneta, everything else to the C library (`real!`). The variadic ones (`open`, `fcntl`,
//! `execl`, ...) are in `csrc/shim.c` and call the `moneta_shim_*` functions here.
//!
//! Each hook sets `errno` exactly as the kernel would on failure and leaves it untouched on
//! success ([`run`]).
//!
//! By what the calls do: [`open`] (opening and closing), [`data`] (reads, writes, seeks),
//! [`attrs`] (`stat`, `access`), [`size`] (sync, truncate, allocate, advice), [`names`]
//! (unlink, rename, mkdir, links), [`perms`] (modes, owners, times), [`descriptors`] (`dup`,
//! `fcntl`, locks), [`copies`] (`copy_file_range`, `sendfile`), [`statfs`], [`cwd`] (the
//! current directory) and [`xattr`]. This module holds what they share: the descriptor
//! reservation, buffer views and the `with_fd!`/`with_path!` routing macros.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsStr};
use std::os::fd::IntoRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use libc::{mode_t, off64_t, off_t, size_t, ssize_t};
use moneta_abi::fsproto::{FsStat, WireTime, UTIME_NOW, UTIME_OMIT};

use super::fds::{self, Desc};
use super::paths::{self, classify, Where};
use super::{conn, count, eno, hooked, log, real, run, COUNTERS, DEBUG};

extern "C" {
    fn moneta_shim_std_before(fd: c_int);
    fn moneta_shim_std_after(fd: c_int, is_moneta: c_int);
}

/// Before descriptor `fd` changes: a standard stream's buffered bytes go where it points now.
pub(crate) fn std_before(fd: c_int) {
    if (0..=2).contains(&fd) && !fds::vforked() {
        // SAFETY: the C side flushes the standard stream of that descriptor.
        unsafe { moneta_shim_std_before(fd) };
    }
}

/// After descriptor `fd` changed: its standard stream follows (see `csrc/shim.c`).
pub(crate) fn std_after(fd: c_int) {
    // A vfork child shares its parent's stream variables: the next image sets up its own.
    if (0..=2).contains(&fd) && !fds::vforked() {
        // SAFETY: the C side swaps the standard stream of that descriptor.
        unsafe { moneta_shim_std_after(fd, fds::is_moneta(fd) as c_int) };
    }
}

/// The device number Moneta files report in `st_dev` (major 0, as for other file systems
/// without a block device).
pub(crate) const MONETA_DEV: u64 = 0x4d4e;

fn p(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

unsafe fn slice<'a>(ptr: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: the caller passes `n` readable bytes.
        unsafe { std::slice::from_raw_parts(ptr.cast(), n) }
    }
}

unsafe fn slice_mut<'a>(ptr: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || ptr.is_null() {
        &mut []
    } else {
        // SAFETY: the caller passes `n` writable bytes.
        unsafe { std::slice::from_raw_parts_mut(ptr.cast(), n) }
    }
}

/// The current `umask` (read by setting and restoring it, as the kernel offers no read).
fn umask() -> mode_t {
    // SAFETY: plain system calls.
    unsafe {
        let m = libc::syscall(libc::SYS_umask, 0o022) as mode_t;
        libc::syscall(libc::SYS_umask, m);
        m
    }
}

/// A kernel descriptor that stands for a Moneta file (see [`fds`]).
fn reserve(cloexec: bool) -> Result<c_int, i32> {
    let mut flags = rustix::fs::OFlags::PATH;
    if cloexec {
        flags |= rustix::fs::OFlags::CLOEXEC;
    }
    let fd = rustix::fs::open("/dev/null", flags, rustix::fs::Mode::empty())
        .map_err(|e| e.raw_os_error())?
        .into_raw_fd();
    if !fds::fits(fd) {
        // SAFETY: ours.
        unsafe { libc::syscall(libc::SYS_close, fd) };
        return Err(libc::EMFILE);
    }
    Ok(fd)
}

fn offset(off: i64) -> Result<u64, i32> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

macro_rules! with_fd {
    ($fd:expr, $failed:expr, |$d:ident| $body:expr, $real:expr) => {{
        if hooked() {
            if let Some($d) = fds::get($fd) {
                return run($failed, || $body);
            }
        }
        #[allow(unused_unsafe)]
        // SAFETY: forwarding the caller's arguments to the C library.
        unsafe {
            $real
        }
    }};
}

macro_rules! with_path {
    ($path:expr, $failed:expr, |$m:ident, $np:ident| $body:expr, $real:expr) => {{
        if hooked() {
            // SAFETY: the hook's caller passes a NUL-terminated path.
            if let Where::Moneta($np) = unsafe { classify(libc::AT_FDCWD, $path) } {
                if let Some($m) = conn() {
                    return run($failed, || $body);
                }
            }
        }
        #[allow(unused_unsafe)]
        // SAFETY: forwarding the caller's arguments to the C library.
        unsafe {
            $real
        }
    }};
}

macro_rules! with_path_at {
    ($dirfd:expr, $path:expr, $failed:expr, |$m:ident, $np:ident| $body:expr, $real:expr) => {{
        if hooked() {
            // SAFETY: the hook's caller passes a NUL-terminated path.
            if let Where::Moneta($np) = unsafe { classify($dirfd, $path) } {
                if let Some($m) = conn() {
                    return run($failed, || $body);
                }
            }
        }
        #[allow(unused_unsafe)]
        // SAFETY: forwarding the caller's arguments to the C library.
        unsafe {
            $real
        }
    }};
}

mod attrs;
mod copies;
mod cwd;
mod data;
mod descriptors;
mod names;
mod open;
mod perms;
mod size;
mod statfs;
mod xattr;

pub use self::{
    attrs::*, copies::*, cwd::*, data::*, descriptors::*, names::*, open::*, perms::*, size::*,
    statfs::*, xattr::*,
};
