//! The C interface of libmoneta: `libmoneta.so` and `libmoneta.a`, with the header
//! `include/moneta.h` generated from this file and its modules by cbindgen (a test checks that
//! the committed header matches). The calls live by what they act on: `files.rs` (an open
//! file), `paths.rs` (a path), `kernel.rs` (a file of the daemon's kernel file system) and
//! `aio.rs` (asynchronous requests); the shared types and argument helpers live here.
//!
//! Conventions: a call that returns `int`, `ssize_t` or `int64_t` returns -1 and sets `errno`
//! on failure; a call that returns a pointer returns NULL and sets `errno`. Paths are paths
//! inside nvfs (absolute, starting with `/`). Every object is used from any thread; a request
//! or a file must not be used after the call that frees it (`moneta_wait*`, `moneta_req_free`,
//! `moneta_close`). A file with requests in flight cannot be closed (`EBUSY`).

#![allow(clippy::missing_safety_doc)]

/// The `LD_PRELOAD` shim: the C library's file functions (not part of `moneta.h`).
///
/// cbindgen:ignore
pub mod shim;

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use moneta_abi::fsproto::{FsStat, WireTime, UTIME_NOW, UTIME_OMIT};
use moneta_abi::Completion;

use libmoneta::{ClientError, File, Moneta, Pending, Policy};

/// Requests wait by spinning on the DMA completion.
pub const MONETA_COMPLETION_SPIN: c_int = 0;
/// Requests wait by forwarding (a completion count and the tag status register).
pub const MONETA_COMPLETION_FORWARD: c_int = 1;
/// Requests sleep on a futex until the device wakes them.
pub const MONETA_COMPLETION_SLEEP: c_int = 2;
/// Spin for requests of at most `spin_max` bytes, sleep for larger ones.
pub const MONETA_COMPLETION_AUTO: c_int = 3;

/// A connection to `monetad` and its channel.
pub struct MonetaConn {
    m: Moneta,
}

/// An open file.
pub struct MonetaFile {
    f: File,
    requests: AtomicUsize,
}

/// An asynchronous request.
pub struct MonetaReq {
    // Borrows the file, which cannot close while `requests` counts this one.
    p: Pending<'static>,
    file: *const MonetaFile,
}

/// File attributes.
#[repr(C)]
pub struct MonetaStat {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Preferred I/O size.
    pub blksize: u64,
    /// Last access, seconds.
    pub atime_sec: i64,
    /// Last modification, seconds.
    pub mtime_sec: i64,
    /// Last status change, seconds.
    pub ctime_sec: i64,
    /// Creation, seconds.
    pub btime_sec: i64,
    /// Nanoseconds of `atime_sec`.
    pub atime_nsec: u32,
    /// Nanoseconds of `mtime_sec`.
    pub mtime_nsec: u32,
    /// Nanoseconds of `ctime_sec`.
    pub ctime_nsec: u32,
    /// Nanoseconds of `btime_sec`.
    pub btime_nsec: u32,
    /// Type and permission bits (`S_IF*` | mode).
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// File-system totals.
#[repr(C)]
pub struct MonetaStatfs {
    /// Allocation unit in bytes.
    pub chunk_size: u64,
    /// Chunks in all.
    pub chunks: u64,
    /// Free chunks.
    pub chunks_free: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// Longest name.
    pub name_max: u64,
}

/// A directory entry.
#[repr(C)]
pub struct MonetaDirent {
    /// Inode number.
    pub ino: u64,
    /// Cookie that continues after this entry.
    pub next: u64,
    /// `DT_*` type.
    pub kind: u8,
    /// Bytes of `name` before its terminating NUL.
    pub name_len: u8,
    /// The name, NUL-terminated.
    pub name: [c_char; 256],
}

/// Most buffers in one vectored call, as Linux's `IOV_MAX`.
const IOV_MAX: c_int = 1024;

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn fail<T>(e: ClientError, v: T) -> T {
    set_errno(e.errno());
    v
}

fn status(r: Result<(), ClientError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e, -1),
    }
}

fn count(r: Result<usize, ClientError>) -> libc::ssize_t {
    match r {
        Ok(n) => n as libc::ssize_t,
        Err(e) => fail(e, -1),
    }
}

unsafe fn path<'a>(p: *const c_char) -> Option<&'a Path> {
    if p.is_null() {
        set_errno(libc::EFAULT);
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    Some(Path::new(OsStr::from_bytes(c.to_bytes())))
}

macro_rules! obj {
    ($p:expr, $err:expr) => {
        // SAFETY: the caller passes an object this library returned and has not freed.
        match unsafe { $p.as_ref() } {
            Some(o) => o,
            None => {
                set_errno(libc::EFAULT);
                return $err;
            }
        }
    };
}

macro_rules! path_arg {
    ($p:expr, $err:expr) => {
        // SAFETY: the caller passes a NUL-terminated string.
        match unsafe { path($p) } {
            Some(p) => p,
            None => return $err,
        }
    };
}

fn to_c_stat(s: &FsStat, out: &mut MonetaStat) {
    *out = MonetaStat {
        ino: s.ino,
        size: s.size,
        blocks: s.blocks,
        blksize: s.blksize,
        atime_sec: s.atime.sec,
        mtime_sec: s.mtime.sec,
        ctime_sec: s.ctime.sec,
        btime_sec: s.btime.sec,
        atime_nsec: s.atime.nsec,
        mtime_nsec: s.mtime.nsec,
        ctime_nsec: s.ctime.nsec,
        btime_nsec: s.btime.nsec,
        mode: s.mode,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
    };
}

/// Connects to the daemon at `socket` (NULL: `$MONETA_SOCKET` or the default path) and opens
/// this process's channel.
#[no_mangle]
pub unsafe extern "C" fn moneta_connect(socket: *const c_char) -> *mut MonetaConn {
    let sock = if socket.is_null() {
        libmoneta::paths::default_socket()
    } else {
        path_arg!(socket, std::ptr::null_mut()).to_path_buf()
    };
    match Moneta::connect(&sock) {
        Ok(m) => Box::into_raw(Box::new(MonetaConn { m })),
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// Drops the connection; files still open keep it alive until they close.
#[no_mangle]
pub unsafe extern "C" fn moneta_disconnect(m: *mut MonetaConn) {
    if !m.is_null() {
        // SAFETY: `m` came from moneta_connect and is freed once.
        drop(unsafe { Box::from_raw(m) });
    }
}

unsafe fn slice<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: per the caller.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

unsafe fn slice_mut<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: per the caller.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

fn offset(off: i64) -> Result<u64, ClientError> {
    u64::try_from(off).map_err(|_| ClientError::Io(std::io::Error::from_raw_os_error(libc::EINVAL)))
}

unsafe fn slice_mut_of<'a, T>(p: *mut T, n: usize) -> &'a mut [T] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: per the caller.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

// The header lists the calls in this order.
mod files;

mod paths;

mod kernel;

mod aio;
