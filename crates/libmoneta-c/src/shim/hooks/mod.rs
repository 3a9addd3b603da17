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
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
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

/// The process's `umask` as the shim knows it, so that a create learns it without a system
/// call: read when the library is loaded (by setting and restoring it, as the kernel offers no
/// read) and kept by the `umask` hook ([`perms::umask`]). A forked child inherits it with the
/// memory. A program that changes its umask with a raw system call, past the C library, is not
/// seen; nor is a `vfork` child's own change, which stays the child's (it runs on its parent's
/// memory until it calls `exec`).
static UMASK: AtomicU32 = AtomicU32::new(0o022);
/// The process [`UMASK`] belongs to: set at load and in a forked child (`pthread_atfork`), so
/// that a `vfork` child, another process on the same memory, leaves it alone.
static UMASK_OWNER: AtomicI32 = AtomicI32::new(0);
/// Held while the kernel's umask and [`UMASK`] change together.
static UMASK_TURN: Mutex<()> = Mutex::new(());

/// The current `umask`.
fn current_umask() -> mode_t {
    UMASK.load(Ordering::Acquire)
}

/// Reads the umask and takes [`UMASK`] for this process; run when the library is loaded,
/// before the program's `main`.
pub(crate) fn learn_umask() {
    extern "C" fn forked_child() {
        UMASK_OWNER.store(getpid(), Ordering::Release);
    }
    // SAFETY: plain system calls; registering a handler that only stores.
    unsafe {
        let m = libc::syscall(libc::SYS_umask, 0o022) as mode_t;
        libc::syscall(libc::SYS_umask, m);
        UMASK.store(m, Ordering::Release);
        libc::pthread_atfork(None, None, Some(forked_child));
    }
    UMASK_OWNER.store(getpid(), Ordering::Release);
}

fn getpid() -> i32 {
    // SAFETY: a plain system call (not the C library's cached one).
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
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

/// Routes a descriptor call: an nvfs descriptor runs `|$d| $body`. A kernel file served
/// through the channel ([`crate::shim::kfs`]) runs `kfs |$k| $kbody` (which answers `None`
/// when the file went back to the kernel meanwhile), or goes to the C library as it is with
/// `kfs direct` (calls an `O_PATH` descriptor serves), or by default is first given back to
/// the kernel. Anything else runs `$real`.
macro_rules! with_fd {
    ($fd:expr, $failed:expr, |$d:ident| $body:expr, $real:expr) => {{
        if hooked() {
            if let Some($d) = fds::get($fd) {
                return run($failed, || $body);
            }
            if crate::shim::kfs::has($fd) {
                if let Err(e) = crate::shim::inside(|| crate::shim::kfs::settle($fd)) {
                    return crate::shim::fail($failed, e);
                }
            }
        }
        #[allow(unused_unsafe)]
        // SAFETY: forwarding the caller's arguments to the C library.
        unsafe {
            $real
        }
    }};
    ($fd:expr, $failed:expr, |$d:ident| $body:expr, kfs direct, $real:expr) => {{
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
    ($fd:expr, $failed:expr, |$d:ident| $body:expr, kfs |$k:ident| $kbody:expr, $real:expr) => {{
        if hooked() {
            if let Some($d) = fds::get($fd) {
                return run($failed, || $body);
            }
            if let Some($k) = crate::shim::kfs::get($fd) {
                if let Some(r) = crate::shim::run_kfs($failed, || $kbody) {
                    return r;
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

/// How a call on two paths goes.
pub(super) enum Pair {
    /// Both are Moneta paths.
    Moneta(&'static libmoneta::Moneta, Vec<u8>, Vec<u8>),
    /// It cannot be made: `EXDEV` between Moneta and another file system, `EIO` without a
    /// daemon.
    Fail(i32),
    /// The C library's, with the paths it must see instead of the caller's (`None`: the
    /// caller's).
    Host(Option<std::ffi::CString>, Option<std::ffi::CString>),
}

/// Routes a call on two paths (rename, link).
///
/// # Safety
///
/// Both paths are NULL or NUL-terminated strings.
pub(super) unsafe fn route_pair(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
) -> Pair {
    // SAFETY: per the caller.
    let (a, b) = unsafe { (classify(d1, p1), classify(d2, p2)) };
    let host = |w: Where| match w {
        Where::Host(c) => Some(c),
        _ => None,
    };
    match (a, b) {
        (Where::Moneta(_), _) | (_, Where::Moneta(_))
            if conn().is_some_and(crate::shim::kfs::serves) =>
        {
            Pair::Host(None, None)
        }
        (Where::Moneta(a), Where::Moneta(b)) => match conn() {
            Some(m) => Pair::Moneta(m, a, b),
            None => Pair::Fail(libc::EIO),
        },
        (Where::Moneta(_), _) | (_, Where::Moneta(_)) => Pair::Fail(libc::EXDEV),
        (a, b) => Pair::Host(host(a), host(b)),
    }
}

/// Routes a path call: a Moneta path runs `$body` with the connection `$m` and the nvfs path
/// `$np`; a Moneta path that cannot be served (no daemon) fails with `EIO`; anything else
/// runs `$real`, the C library's call, in which `$path` names the path the C library must see
/// (the caller's, or its rewriting when it left the prefix lexically).
macro_rules! with_path_at {
    ($dirfd:expr, $path:ident, $failed:expr, |$m:ident, $np:ident| $body:expr, $real:expr) => {{
        let mut host: Option<std::ffi::CString> = None;
        if hooked() {
            // SAFETY: the hook's caller passes a NUL-terminated path.
            match unsafe { crate::shim::route($dirfd, $path) } {
                crate::shim::Route::Moneta($m, $np) => return run($failed, || $body),
                crate::shim::Route::Fail(e) => return crate::shim::fail($failed, e),
                crate::shim::Route::Host(h) => host = h,
            }
        }
        let $path = host.as_ref().map_or($path, |c| c.as_ptr());
        #[allow(unused_unsafe)]
        // SAFETY: forwarding the caller's arguments (or their rewritten path) to the C library.
        unsafe {
            $real
        }
    }};
}

/// [`with_path_at!`] relative to the current directory.
macro_rules! with_path {
    ($path:ident, $failed:expr, |$m:ident, $np:ident| $body:expr, $real:expr) => {
        with_path_at!(libc::AT_FDCWD, $path, $failed, |$m, $np| $body, $real)
    };
}

mod attrs;
mod copies;
mod cwd;
mod data;
mod descriptors;
mod mapping;
mod names;
mod open;
mod perms;
mod size;
mod statfs;
mod tmp;
mod xattr;

pub use self::{
    attrs::*, copies::*, cwd::*, data::*, descriptors::*, mapping::*, names::*, open::*, perms::*,
    size::*, statfs::*, tmp::*, xattr::*,
};
