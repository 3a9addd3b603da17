//! The C interface of libmoneta: `libmoneta.so` and `libmoneta.a`, with the header
//! `include/moneta.h` generated from this file by cbindgen (a test checks that the committed
//! header matches).
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

/// Opens `path` with `open(2)` flags and creation mode.
#[no_mangle]
pub unsafe extern "C" fn moneta_open(
    m: *const MonetaConn,
    path: *const c_char,
    flags: c_int,
    mode: u32,
) -> *mut MonetaFile {
    let m = obj!(m, std::ptr::null_mut());
    let p = path_arg!(path, std::ptr::null_mut());
    match m.m.open_flags(p, flags, mode) {
        Ok(f) => Box::into_raw(Box::new(MonetaFile {
            f,
            requests: AtomicUsize::new(0),
        })),
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// Closes a file (`EBUSY`, and the file stays open, while requests on it are in flight).
#[no_mangle]
pub unsafe extern "C" fn moneta_close(f: *mut MonetaFile) -> c_int {
    let cf = obj!(f, -1);
    if cf.requests.load(Ordering::Acquire) != 0 {
        set_errno(libc::EBUSY);
        return -1;
    }
    // SAFETY: `f` came from moneta_open and is freed once.
    let cf = unsafe { Box::from_raw(f) };
    status(cf.f.close())
}

/// `read(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_read(
    f: *const MonetaFile,
    buf: *mut c_void,
    n: usize,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf.cast(), n) };
    count(f.f.read(b))
}

/// `write(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_write(
    f: *const MonetaFile,
    buf: *const c_void,
    n: usize,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf.cast(), n) };
    count(f.f.write(b))
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

/// `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_pread(
    f: *const MonetaFile,
    buf: *mut c_void,
    n: usize,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf.cast(), n) };
    count(offset(off).and_then(|o| f.f.read_at(b, o)))
}

/// `pwrite(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_pwrite(
    f: *const MonetaFile,
    buf: *const c_void,
    n: usize,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf.cast(), n) };
    count(offset(off).and_then(|o| f.f.write_at(b, o)))
}

unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Option<&'a [libc::iovec]> {
    if !(0..=IOV_MAX).contains(&cnt) {
        set_errno(libc::EINVAL);
        return None;
    }
    if cnt == 0 {
        return Some(&[]);
    }
    if iov.is_null() {
        set_errno(libc::EFAULT);
        return None;
    }
    // SAFETY: the caller passes `cnt` iovecs.
    Some(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

fn gather(v: &[libc::iovec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.iter().map(|i| i.iov_len).sum());
    for i in v {
        // SAFETY: each iovec describes readable memory of the caller.
        out.extend_from_slice(unsafe { slice(i.iov_base as *const u8, i.iov_len) });
    }
    out
}

fn scatter_read(
    v: &[libc::iovec],
    mut read: impl FnMut(&mut [u8], u64) -> Result<usize, ClientError>,
) -> Result<usize, ClientError> {
    let mut total = 0usize;
    for i in v {
        // SAFETY: each iovec describes writable memory of the caller.
        let b = unsafe { slice_mut(i.iov_base as *mut u8, i.iov_len) };
        if b.is_empty() {
            continue;
        }
        let n = read(b, total as u64)?;
        total += n;
        if n < b.len() {
            break;
        }
    }
    Ok(total)
}

/// `readv(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_readv(
    f: *const MonetaFile,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    // SAFETY: per the caller.
    let Some(v) = (unsafe { iovecs(iov, iovcnt) }) else {
        return -1;
    };
    let total: usize = v.iter().map(|i| i.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let r = f.f.read(&mut tmp);
    if let Ok(n) = r {
        let mut at = 0;
        for i in v {
            if at >= n {
                break;
            }
            let k = i.iov_len.min(n - at);
            // SAFETY: each iovec describes writable memory of the caller.
            unsafe { slice_mut(i.iov_base as *mut u8, k) }.copy_from_slice(&tmp[at..at + k]);
            at += k;
        }
    }
    count(r)
}

/// `writev(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_writev(
    f: *const MonetaFile,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    // SAFETY: per the caller.
    let Some(v) = (unsafe { iovecs(iov, iovcnt) }) else {
        return -1;
    };
    count(f.f.write(&gather(v)))
}

/// `preadv(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_preadv(
    f: *const MonetaFile,
    iov: *const libc::iovec,
    iovcnt: c_int,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    // SAFETY: per the caller.
    let Some(v) = (unsafe { iovecs(iov, iovcnt) }) else {
        return -1;
    };
    count(offset(off).and_then(|o| scatter_read(v, |b, at| f.f.read_at(b, o + at))))
}

/// `pwritev(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_pwritev(
    f: *const MonetaFile,
    iov: *const libc::iovec,
    iovcnt: c_int,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    // SAFETY: per the caller.
    let Some(v) = (unsafe { iovecs(iov, iovcnt) }) else {
        return -1;
    };
    count(offset(off).and_then(|o| f.f.write_at(&gather(v), o)))
}

/// `lseek(2)` with `SEEK_SET`, `SEEK_CUR` or `SEEK_END`.
#[no_mangle]
pub unsafe extern "C" fn moneta_lseek(f: *const MonetaFile, off: i64, whence: c_int) -> i64 {
    let f = obj!(f, -1);
    let to = match whence {
        libc::SEEK_SET => match offset(off) {
            Ok(o) => std::io::SeekFrom::Start(o),
            Err(e) => return fail(e, -1),
        },
        libc::SEEK_CUR => std::io::SeekFrom::Current(off),
        libc::SEEK_END => std::io::SeekFrom::End(off),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    match f.f.seek(to) {
        Ok(p) => p as i64,
        Err(e) => fail(e, -1),
    }
}

/// `fsync(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_fsync(f: *const MonetaFile) -> c_int {
    status(obj!(f, -1).f.sync_all())
}

/// `fdatasync(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_fdatasync(f: *const MonetaFile) -> c_int {
    status(obj!(f, -1).f.sync_data())
}

/// A barrier on the connection's channel (Moneta §IV): returns 0 once every request submitted
/// on it before the call (asynchronous ones included) has completed; the device issues no
/// request submitted after the call before then. It orders; `moneta_fsync` persists.
#[no_mangle]
pub unsafe extern "C" fn moneta_barrier(f: *const MonetaFile) -> c_int {
    status(obj!(f, -1).f.barrier())
}

/// Advice on the file's bytes `[off, off + len)` (`len` 0: to the end), as `posix_fadvise`
/// takes it (`POSIX_FADV_*`): `POSIX_FADV_WILLNEED` sends the device a hint to fill its DRAM
/// buffer with them (as `File::will_need` in Rust); the others have nothing to act on (there is no
/// page cache) and succeed. Returns 0, or -1 with `errno` (`EINVAL` for an unknown advice or a
/// negative range, `EBADF` for `WILLNEED` on a file not open for reading).
#[no_mangle]
pub unsafe extern "C" fn moneta_advise(
    f: *const MonetaFile,
    off: i64,
    len: i64,
    advice: c_int,
) -> c_int {
    let f = obj!(f, -1);
    if !(0..=5).contains(&advice) || off < 0 || len < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    if advice == libc::POSIX_FADV_WILLNEED {
        return status(f.f.will_need(off as u64, len as u64));
    }
    0
}

/// Maps `len` bytes of the file from `off` (a multiple of the page size) into memory, as
/// `mmap(2)` with `prot` and `flags` (`MAP_SHARED` or `MAP_PRIVATE`, and any of the others but
/// `MAP_ANONYMOUS`): the mapping is of the file's own pages (a memory drive), so a store
/// through a shared mapping is at once in the file. A shared writable mapping needs the file
/// open for reading and writing (`EACCES`), as the kernel asks of a descriptor. Returns the
/// address, or `MAP_FAILED` with `errno` (`ENODEV` where the array hands out no pages: one
/// with data checksums). Unmap with `moneta_unmap`; the mapping outlives `moneta_close`.
#[no_mangle]
pub unsafe extern "C" fn moneta_map(
    f: *const MonetaFile,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: i64,
) -> *mut c_void {
    use std::os::fd::AsRawFd;
    let f = obj!(f, libc::MAP_FAILED);
    // SAFETY: a plain system call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as i64;
    if len == 0 || off < 0 || off % page != 0 || flags & libc::MAP_ANONYMOUS != 0 {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let shared = flags & 3 != libc::MAP_PRIVATE;
    let write = shared && prot & libc::PROT_WRITE != 0;
    let fd = match f.f.pages(write) {
        Ok((fd, _)) => fd,
        Err(e) if write && e.errno() == libc::EBADF => {
            set_errno(libc::EACCES);
            return libc::MAP_FAILED;
        }
        Err(e) => return fail(e, libc::MAP_FAILED),
    };
    // SAFETY: a new mapping of the file's pages where the kernel chooses (or where the caller
    // asked, with its own flags).
    unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd.as_raw_fd(), off) }
}

/// Unmaps what `moneta_map` mapped (`munmap(2)`): nothing may use the range afterwards.
#[no_mangle]
pub unsafe extern "C" fn moneta_unmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: per the caller.
    unsafe { libc::munmap(addr, len) }
}

/// `msync(2)` of a range `moneta_map` mapped: with `MS_SYNC`, on a persistent array, the
/// stores through it are durable on the host's disk when it returns (docs/nvfs.md).
#[no_mangle]
pub unsafe extern "C" fn moneta_msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { libc::msync(addr, len, flags) }
}

/// `ftruncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_ftruncate(f: *const MonetaFile, len: i64) -> c_int {
    let f = obj!(f, -1);
    status(offset(len).and_then(|l| f.f.set_len(l)))
}

/// `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_fstat(f: *const MonetaFile, out: *mut MonetaStat) -> c_int {
    let f = obj!(f, -1);
    // SAFETY: the caller passes a writable MonetaStat.
    let Some(out) = (unsafe { out.as_mut() }) else {
        set_errno(libc::EFAULT);
        return -1;
    };
    status(f.f.stat().map(|s| to_c_stat(&s, out)))
}

/// `fchmod(2)`.
#[no_mangle]
pub unsafe extern "C" fn moneta_fchmod(f: *const MonetaFile, mode: u32) -> c_int {
    status(obj!(f, -1).f.chmod(mode))
}

/// Sets how this file's requests wait: one of `MONETA_COMPLETION_*` (`spin_max` matters only
/// for `MONETA_COMPLETION_AUTO`); -1 restores the connection's policy.
#[no_mangle]
pub unsafe extern "C" fn moneta_set_completion(
    f: *const MonetaFile,
    mode: c_int,
    spin_max: usize,
) -> c_int {
    let f = obj!(f, -1);
    let p = match mode {
        -1 => None,
        MONETA_COMPLETION_SPIN => Some(Policy::Fixed(Completion::Dma)),
        MONETA_COMPLETION_FORWARD => Some(Policy::Fixed(Completion::Forward)),
        MONETA_COMPLETION_SLEEP => Some(Policy::Fixed(Completion::Sleep)),
        MONETA_COMPLETION_AUTO => Some(Policy::Auto { spin_max }),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    f.f.set_policy(p);
    0
}

/// One batch of directory entries of an open directory from `*cookie` (0 to start); advances
/// `*cookie`. Returns the entries stored (at most `max`), 0 at the end.
#[no_mangle]
pub unsafe extern "C" fn moneta_readdir(
    dir: *const MonetaFile,
    cookie: *mut u64,
    out: *mut MonetaDirent,
    max: usize,
) -> libc::ssize_t {
    let d = obj!(dir, -1);
    if cookie.is_null() || (out.is_null() && max > 0) {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes a valid cookie and `max` writable entries.
    let (c, outs) = unsafe { (&mut *cookie, slice_mut_of(out, max)) };
    let mut n = 0usize;
    while n < outs.len() {
        let (entries, end) = match d.f.read_dir_from(*c) {
            Ok(x) => x,
            Err(e) => return fail(e, -1),
        };
        // Entries beyond `max` are not lost: the cookie stops at the last one stored.
        for e in entries {
            if n == outs.len() {
                break;
            }
            let o = &mut outs[n];
            o.ino = e.ino;
            o.next = e.next;
            o.kind = e.kind;
            o.name_len = e.name.len() as u8;
            o.name = [0; 256];
            for (d, s) in o.name.iter_mut().zip(&e.name) {
                *d = *s as c_char;
            }
            *c = e.next;
            n += 1;
        }
        if end || n > 0 {
            break;
        }
    }
    n as libc::ssize_t
}

unsafe fn slice_mut_of<'a, T>(p: *mut T, n: usize) -> &'a mut [T] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: per the caller.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

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

/// A file of the ext4 or XFS file system a daemon started with `--kernel-fs` serves.
pub struct MonetaKernelFile {
    f: libmoneta::KernelFile,
}

/// Which kernel file system the daemon serves (`monetad --kernel-fs`): 1 for ext4, 2 for
/// XFS, 0 when it serves nvfs or a raw array, -1 on error. With `mount` not NULL, the mount
/// point's path is written there, NUL-terminated (`ENAMETOOLONG` if `len` bytes cannot hold
/// it).
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_fs(
    m: *const MonetaConn,
    mount: *mut c_char,
    len: usize,
) -> c_int {
    let m = obj!(m, -1);
    match m.m.kernel_fs() {
        Ok(None) => 0,
        Ok(Some(k)) => {
            if !mount.is_null() {
                let b = k.mount.as_os_str().as_bytes();
                if b.len() >= len {
                    set_errno(libc::ENAMETOOLONG);
                    return -1;
                }
                // SAFETY: the caller passes `len` writable bytes.
                let out = unsafe { slice_mut(mount.cast(), len) };
                out[..b.len()].copy_from_slice(b);
                out[b.len()] = 0;
            }
            if k.kind == "xfs" {
                2
            } else {
                1
            }
        }
        Err(e) => fail(e, -1),
    }
}

/// Opens `path`, a regular file of the daemon's kernel file system, through the kernel with
/// `open(2)` flags and mode (the kernel checks the caller's rights, creates and truncates), and
/// hands it to the daemon: its data then goes through the channel. `O_APPEND`, `O_PATH` and
/// `O_DIRECTORY` are `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_open(
    m: *const MonetaConn,
    path: *const c_char,
    flags: c_int,
    mode: u32,
) -> *mut MonetaKernelFile {
    use std::os::fd::FromRawFd;
    let m = obj!(m, std::ptr::null_mut());
    if path.is_null() {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    if flags & (libc::O_APPEND | libc::O_PATH | libc::O_DIRECTORY) != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: a NUL-terminated path; the descriptor returned is ours.
    let fd = unsafe { libc::open(path, flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: just opened, owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    match libmoneta::KernelFile::adopt(&m.m, fd) {
        Ok(f) => Box::into_raw(Box::new(MonetaKernelFile { f })),
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// `pread(2)` on a kernel file.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_pread(
    f: *const MonetaKernelFile,
    buf: *mut c_void,
    n: usize,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf.cast(), n) };
    count(offset(off).and_then(|o| f.f.read_at(b, o)))
}

/// `pwrite(2)` on a kernel file (all of it, or -1).
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_pwrite(
    f: *const MonetaKernelFile,
    buf: *const c_void,
    n: usize,
    off: i64,
) -> libc::ssize_t {
    let f = obj!(f, -1);
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf.cast(), n) };
    count(offset(off).and_then(|o| {
        o.checked_add(n as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| ClientError::Io(std::io::Error::from_raw_os_error(libc::EFBIG)))?;
        f.f.write_at(b, o).map(|()| n)
    }))
}

/// The size of a kernel file, or -1.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_size(f: *const MonetaKernelFile) -> i64 {
    match obj!(f, -1).f.len() {
        Ok(n) => n as i64,
        Err(e) => fail(e, -1),
    }
}

/// `ftruncate(2)` on a kernel file, through the kernel.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_ftruncate(f: *const MonetaKernelFile, len: i64) -> c_int {
    let f = obj!(f, -1);
    status(offset(len).and_then(|l| f.f.set_len(l)))
}

/// `fsync(2)` on a kernel file: what the channel wrote is made durable.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_fsync(f: *const MonetaKernelFile) -> c_int {
    status(obj!(f, -1).f.sync())
}

/// Closes a kernel file.
#[no_mangle]
pub unsafe extern "C" fn moneta_kernel_close(f: *mut MonetaKernelFile) -> c_int {
    let _ = obj!(f, -1);
    // SAFETY: `f` came from moneta_kernel_open and is freed once.
    drop(unsafe { Box::from_raw(f) });
    0
}

fn start_req(f: &MonetaFile, r: Result<Pending<'_>, ClientError>) -> *mut MonetaReq {
    match r {
        Ok(p) => {
            f.requests.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the request borrows `f.f`; moneta_close refuses while `requests` counts
            // it, so the file outlives the request.
            let p: Pending<'static> = unsafe { std::mem::transmute(p) };
            Box::into_raw(Box::new(MonetaReq {
                p,
                file: f as *const MonetaFile,
            }))
        }
        Err(e) => fail(e, std::ptr::null_mut()),
    }
}

/// Submits a read of `n` bytes at `off` into `buf`, which must stay valid until the request
/// is waited for or freed. Returns at once.
#[no_mangle]
pub unsafe extern "C" fn moneta_submit_read(
    f: *const MonetaFile,
    buf: *mut c_void,
    n: usize,
    off: i64,
) -> *mut MonetaReq {
    let f = obj!(f, std::ptr::null_mut());
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller keeps `buf` valid for `n` bytes until the request ends.
    let r = offset(off).and_then(|o| unsafe { f.f.submit_read_raw(buf.cast(), n, o, None) });
    start_req(f, r)
}

/// Submits a write of `n` bytes from `buf` at `off` (at the end for a file opened with
/// `O_APPEND`); `buf` must stay valid and unchanged until the request ends. Returns at once.
#[no_mangle]
pub unsafe extern "C" fn moneta_submit_write(
    f: *const MonetaFile,
    buf: *const c_void,
    n: usize,
    off: i64,
) -> *mut MonetaReq {
    let f = obj!(f, std::ptr::null_mut());
    if buf.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller keeps `buf` valid for `n` bytes until the request ends.
    let r = offset(off).and_then(|o| unsafe { f.f.submit_write_raw(buf.cast(), n, o, None) });
    start_req(f, r)
}

/// Whether the request has ended (1) or not (0), moving it along without blocking.
#[no_mangle]
pub unsafe extern "C" fn moneta_poll(r: *mut MonetaReq) -> c_int {
    // SAFETY: the caller passes a live request.
    match unsafe { r.as_mut() } {
        Some(r) => r.p.poll() as c_int,
        None => {
            set_errno(libc::EFAULT);
            -1
        }
    }
}

unsafe fn finish(r: *mut MonetaReq) -> libc::ssize_t {
    // SAFETY: `r` came from a submit call and is freed once, here.
    let mut b = unsafe { Box::from_raw(r) };
    let res = b.p.wait();
    let file = b.file;
    drop(b);
    // SAFETY: the file outlives its requests (see start_req).
    unsafe { &*file }.requests.fetch_sub(1, Ordering::AcqRel);
    count(res)
}

/// Waits for the request to end and frees it: the bytes moved, or -1 and `errno`.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait(r: *mut MonetaReq) -> libc::ssize_t {
    if r.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: per the caller.
    unsafe { finish(r) }
}

/// Frees a request without its result (waiting for the device to be done with it).
#[no_mangle]
pub unsafe extern "C" fn moneta_req_free(r: *mut MonetaReq) {
    if !r.is_null() {
        // SAFETY: per the caller.
        let _ = unsafe { finish(r) };
    }
}

/// Waits until one of the non-NULL requests in `reqs[0..n]` ends; stores its index in
/// `*index`, frees it, sets `reqs[*index]` to NULL and returns its result (bytes, or -1 and
/// `errno`). With no request left: -1 and `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait_any(
    reqs: *mut *mut MonetaReq,
    n: usize,
    index: *mut usize,
) -> libc::ssize_t {
    if reqs.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` request slots.
    let slots = unsafe { slice_mut_of(reqs, n) };
    if slots.iter().all(|r| r.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let mut rounds = 0u32;
    loop {
        for (i, slot) in slots.iter_mut().enumerate() {
            // SAFETY: non-NULL slots hold live requests.
            let Some(r) = (unsafe { slot.as_mut() }) else {
                continue;
            };
            if r.p.poll() {
                let done = std::mem::replace(slot, std::ptr::null_mut());
                if !index.is_null() {
                    // SAFETY: the caller passes a writable index or NULL.
                    unsafe { *index = i };
                }
                // SAFETY: `done` is live and freed once.
                return unsafe { finish(done) };
            }
        }
        rounds += 1;
        if rounds < 2000 {
            std::hint::spin_loop();
        } else if rounds < 2100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}

/// Waits for every non-NULL request in `reqs[0..n]`, frees them and sets the slots to NULL;
/// `results[i]` (if `results` is not NULL) gets bytes moved or a negative errno. Returns 0.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait_all(
    reqs: *mut *mut MonetaReq,
    n: usize,
    results: *mut libc::ssize_t,
) -> c_int {
    if reqs.is_null() && n > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller passes `n` request slots and, unless NULL, `n` results.
    let slots = unsafe { slice_mut_of(reqs, n) };
    for (i, slot) in slots.iter_mut().enumerate() {
        let r = std::mem::replace(slot, std::ptr::null_mut());
        if r.is_null() {
            continue;
        }
        // SAFETY: a live request, freed once.
        let v = unsafe { finish(r) };
        let v = if v < 0 {
            // SAFETY: errno of this thread.
            -(unsafe { *libc::__errno_location() } as libc::ssize_t)
        } else {
            v
        };
        if !results.is_null() {
            // SAFETY: per the caller.
            unsafe { *results.add(i) = v };
        }
    }
    0
}
