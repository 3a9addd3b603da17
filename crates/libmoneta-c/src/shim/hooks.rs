//! The C library's file functions, exported under their own names: Moneta files go through
//! libmoneta, everything else to the C library (`real!`). The variadic ones (`open`, `fcntl`,
//! `execl`, ...) are in `csrc/shim.c` and call the `moneta_shim_*` functions here.
//!
//! Each hook sets `errno` exactly as the kernel would on failure and leaves it untouched on
//! success ([`run`]).

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

/// Opens an nvfs path as a new Moneta descriptor.
fn open_moneta(
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
        (mode & 0o7777) & !umask()
    } else {
        0
    };
    let file = m.open_flags(p(&path), oflags, mode).map_err(eno)?;
    let is_dir = file
        .stat()
        .map(|s| s.mode & libc::S_IFMT == libc::S_IFDIR)
        .unwrap_or(false);
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
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(np) = unsafe { classify(dirfd, path) } {
            if let Some(m) = conn() {
                return run(-1, || open_moneta(m, np, flags, mode));
            }
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe {
        real!(openat64: fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode)
    }
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

fn close_moneta(fd: c_int, d: Arc<Desc>) -> Result<c_int, i32> {
    // SAFETY: our reserved descriptor.
    let r = unsafe { libc::syscall(libc::SYS_close, fd) };
    // The last reference closes the file on the daemon, reporting its answer.
    if let Ok(d) = Arc::try_unwrap(d) {
        d.file.close().map_err(eno)?;
    }
    if r < 0 {
        return Err(super::errno());
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
    // SAFETY: forwarding.
    unsafe { real!(close: fn(c_int) -> c_int)(fd) }
}

/// Closes `[first, last]` except the library's own descriptors (its connection and position
/// segments), whose numbers the program does not know it holds.
fn close_range_sparing(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
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
        let saved = super::errno();
        let r = super::inside(|| close_range_sparing(first, last, flags as c_uint));
        if r == 0 {
            super::set_errno(saved);
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

fn data_io(n: usize, write: bool) {
    count(&COUNTERS.direct_ios, 1);
    if write {
        count(&COUNTERS.bytes_written, n as u64);
    } else {
        count(&COUNTERS.bytes_read, n as u64);
    }
}

/// `read(2)`.
///
/// # Safety
///
/// As `read(2)`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: per the caller.
            let b = unsafe { slice_mut(buf, n) };
            let r = d.file.read(b).map_err(eno)?;
            data_io(r, false);
            Ok(r as ssize_t)
        },
        real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, n)
    )
}

/// `write(2)`.
///
/// # Safety
///
/// As `write(2)`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: per the caller.
            let b = unsafe { slice(buf, n) };
            let r = d.file.write(b).map_err(eno)?;
            data_io(r, true);
            Ok(r as ssize_t)
        },
        real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n)
    )
}

fn offset(off: i64) -> Result<u64, i32> {
    u64::try_from(off).map_err(|_| libc::EINVAL)
}

fn pread_impl(d: &Desc, buf: *mut c_void, n: usize, off: i64) -> Result<ssize_t, i32> {
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf, n) };
    let r = d.file.read_at(b, offset(off)?).map_err(eno)?;
    data_io(r, false);
    Ok(r as ssize_t)
}

fn pwrite_impl(d: &Desc, buf: *const c_void, n: usize, off: i64) -> Result<ssize_t, i32> {
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf, n) };
    let r = d.file.write_at(b, offset(off)?).map_err(eno)?;
    data_io(r, true);
    Ok(r as ssize_t)
}

/// `pread(2)`.
///
/// # Safety
///
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| pread_impl(&d, buf, n, off),
        real!(pread64: fn(c_int, *mut c_void, size_t, off64_t) -> ssize_t)(fd, buf, n, off)
    )
}

/// `pread64(2)`.
///
/// # Safety
///
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { pread(fd, buf, n, off) }
}

/// `pwrite(2)`.
///
/// # Safety
///
/// As `pwrite(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| pwrite_impl(&d, buf, n, off),
        real!(pwrite64: fn(c_int, *const c_void, size_t, off64_t) -> ssize_t)(fd, buf, n, off)
    )
}

/// `pwrite64(2)`.
///
/// # Safety
///
/// As `pwrite(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { pwrite(fd, buf, n, off) }
}

unsafe fn iov<'a>(v: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], i32> {
    if !(0..=1024).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if v.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes `cnt` iovecs.
    Ok(unsafe { std::slice::from_raw_parts(v, cnt as usize) })
}

fn gather(v: &[libc::iovec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.iter().map(|i| i.iov_len).sum());
    for i in v {
        // SAFETY: each iovec describes readable memory of the caller.
        out.extend_from_slice(unsafe { slice(i.iov_base, i.iov_len) });
    }
    out
}

/// Reads into the buffers in order: from `off`, or at the position (advancing it).
fn readv_impl(d: &Desc, v: &[libc::iovec], off: Option<u64>) -> Result<ssize_t, i32> {
    let total: usize = v.iter().map(|i| i.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let n = match off {
        Some(o) => d.file.read_at(&mut tmp, o),
        None => d.file.read(&mut tmp),
    }
    .map_err(eno)?;
    let mut at = 0;
    for i in v {
        if at >= n {
            break;
        }
        let k = i.iov_len.min(n - at);
        // SAFETY: each iovec describes writable memory of the caller.
        unsafe { slice_mut(i.iov_base, k) }.copy_from_slice(&tmp[at..at + k]);
        at += k;
    }
    data_io(n, false);
    Ok(n as ssize_t)
}

fn writev_impl(d: &Desc, v: &[libc::iovec], off: Option<u64>) -> Result<ssize_t, i32> {
    let data = gather(v);
    let n = match off {
        Some(o) => d.file.write_at(&data, o),
        None => d.file.write(&data),
    }
    .map_err(eno)?;
    data_io(n, true);
    Ok(n as ssize_t)
}

/// `readv(2)`.
///
/// # Safety
///
/// As `readv(2)`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, v: *const libc::iovec, cnt: c_int) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: the caller passes `cnt` iovecs.
            readv_impl(&d, unsafe { iov(v, cnt) }?, None)
        },
        real!(readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, v, cnt)
    )
}

/// `writev(2)`.
///
/// # Safety
///
/// As `writev(2)`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, v: *const libc::iovec, cnt: c_int) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: the caller passes `cnt` iovecs.
            writev_impl(&d, unsafe { iov(v, cnt) }?, None)
        },
        real!(writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, v, cnt)
    )
}

/// `preadv(2)`.
///
/// # Safety
///
/// As `preadv(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off_t,
) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: the caller passes `cnt` iovecs.
            readv_impl(&d, unsafe { iov(v, cnt) }?, Some(offset(off)?))
        },
        real!(preadv64: fn(c_int, *const libc::iovec, c_int, off64_t) -> ssize_t)(fd, v, cnt, off)
    )
}

/// `preadv64(2)`.
///
/// # Safety
///
/// As `preadv(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { preadv(fd, v, cnt, off) }
}

/// `pwritev(2)`.
///
/// # Safety
///
/// As `pwritev(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off_t,
) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: the caller passes `cnt` iovecs.
            writev_impl(&d, unsafe { iov(v, cnt) }?, Some(offset(off)?))
        },
        real!(pwritev64: fn(c_int, *const libc::iovec, c_int, off64_t) -> ssize_t)(fd, v, cnt, off)
    )
}

/// `pwritev64(2)`.
///
/// # Safety
///
/// As `pwritev(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { pwritev(fd, v, cnt, off) }
}

/// `preadv2(2)`: offset -1 means the position; flags are hints a memory device has no use for,
/// except unknown ones (`EOPNOTSUPP`).
///
/// # Safety
///
/// As `preadv2(2)`.
#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            rwf_ok(flags)?;
            let at = if off == -1 { None } else { Some(offset(off)?) };
            // SAFETY: the caller passes `cnt` iovecs.
            readv_impl(&d, unsafe { iov(v, cnt) }?, at)
        },
        real!(preadv64v2: fn(c_int, *const libc::iovec, c_int, off64_t, c_int) -> ssize_t)(
            fd, v, cnt, off, flags
        )
    )
}

/// `pwritev2(2)`.
///
/// # Safety
///
/// As `pwritev2(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    v: *const libc::iovec,
    cnt: c_int,
    off: off_t,
    flags: c_int,
) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |d| {
            rwf_ok(flags)?;
            let at = if off == -1 { None } else { Some(offset(off)?) };
            // SAFETY: the caller passes `cnt` iovecs.
            let r = writev_impl(&d, unsafe { iov(v, cnt) }?, at)?;
            if flags & (libc::RWF_DSYNC | libc::RWF_SYNC) != 0 {
                d.file.sync_data().map_err(eno)?;
            }
            Ok(r)
        },
        real!(pwritev64v2: fn(c_int, *const libc::iovec, c_int, off64_t, c_int) -> ssize_t)(
            fd, v, cnt, off, flags
        )
    )
}

fn rwf_ok(flags: c_int) -> Result<(), i32> {
    let known =
        libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_NOWAIT | libc::RWF_APPEND;
    if flags & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

fn lseek_impl(d: &Desc, off: i64, whence: c_int) -> Result<off_t, i32> {
    use std::io::SeekFrom;
    if d.is_dir {
        // Directory positions are readdir cookies.
        return match whence {
            libc::SEEK_SET if off >= 0 => {
                *d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner()) = off as u64;
                Ok(off)
            }
            libc::SEEK_CUR if off == 0 => {
                Ok(*d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner()) as off_t)
            }
            _ => Err(libc::EINVAL),
        };
    }
    let to = match whence {
        libc::SEEK_SET => SeekFrom::Start(offset(off)?),
        libc::SEEK_CUR => SeekFrom::Current(off),
        libc::SEEK_END => SeekFrom::End(off),
        libc::SEEK_DATA | libc::SEEK_HOLE => {
            // Data everywhere before the end (holes read as zeros and are not reported).
            let size = d.file.len().map_err(eno)?;
            let o = offset(off)?;
            if o >= size {
                return Err(libc::ENXIO);
            }
            let at = if whence == libc::SEEK_DATA { o } else { size };
            d.file.seek(SeekFrom::Start(at)).map_err(eno)?;
            return Ok(at as off_t);
        }
        _ => return Err(libc::EINVAL),
    };
    Ok(d.file.seek(to).map_err(eno)? as off_t)
}

/// `lseek(2)`.
#[no_mangle]
pub extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    with_fd!(
        fd,
        -1,
        |d| lseek_impl(&d, off, whence),
        real!(lseek64: fn(c_int, off64_t, c_int) -> off64_t)(fd, off, whence)
    )
}

/// `lseek64(2)`.
#[no_mangle]
pub extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    lseek(fd, off, whence)
}

// ----- attributes -----

/// Fills a `struct stat` from nvfs attributes.
pub(crate) fn fill_stat(s: &FsStat, out: &mut libc::stat) {
    // SAFETY: all-zero is a valid `struct stat`.
    *out = unsafe { std::mem::zeroed() };
    out.st_dev = MONETA_DEV;
    out.st_ino = s.ino;
    out.st_nlink = s.nlink as _;
    out.st_mode = s.mode;
    out.st_uid = s.uid;
    out.st_gid = s.gid;
    out.st_size = s.size as _;
    out.st_blksize = s.blksize as _;
    out.st_blocks = s.blocks as _;
    out.st_atime = s.atime.sec;
    out.st_atime_nsec = s.atime.nsec as _;
    out.st_mtime = s.mtime.sec;
    out.st_mtime_nsec = s.mtime.nsec as _;
    out.st_ctime = s.ctime.sec;
    out.st_ctime_nsec = s.ctime.nsec as _;
}

fn fill_statx(s: &FsStat, out: &mut libc::statx) {
    // SAFETY: all-zero is a valid `struct statx`.
    *out = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    out.stx_blksize = s.blksize as u32;
    out.stx_nlink = s.nlink;
    out.stx_uid = s.uid;
    out.stx_gid = s.gid;
    out.stx_mode = s.mode as u16;
    out.stx_ino = s.ino;
    out.stx_size = s.size;
    out.stx_blocks = s.blocks;
    let t = |w: WireTime| {
        // SAFETY: all-zero is a valid timestamp.
        let mut ts: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        ts.tv_sec = w.sec;
        ts.tv_nsec = w.nsec;
        ts
    };
    out.stx_atime = t(s.atime);
    out.stx_btime = t(s.btime);
    out.stx_ctime = t(s.ctime);
    out.stx_mtime = t(s.mtime);
    out.stx_dev_major = 0;
    out.stx_dev_minor = MONETA_DEV as u32;
}

/// Attributes of a Moneta path or descriptor.
fn moneta_stat(dirfd: c_int, path: *const c_char, flags: c_int) -> Option<Result<FsStat, i32>> {
    // SAFETY: a non-NULL path is a NUL-terminated string (the hook's caller's promise).
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        let d = if dirfd == libc::AT_FDCWD {
            None
        } else {
            fds::get(dirfd)
        }?;
        return Some(d.file.stat().map_err(eno));
    }
    // SAFETY: per the hook's caller.
    let Where::Moneta(np) = (unsafe { classify(dirfd, path) }) else {
        return None;
    };
    let m = conn()?;
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    Some(
        if follow {
            m.stat(p(&np))
        } else {
            m.lstat(p(&np))
        }
        .map_err(eno),
    )
}

/// `fstatat(2)`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    if hooked() {
        if let Some(r) = super::inside(|| moneta_stat(dirfd, path, flags)) {
            return run(-1, || {
                let s = r?;
                // SAFETY: the caller passes a writable struct stat.
                fill_stat(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
                Ok(0)
            });
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(fstatat64: fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int)(
            dirfd, path, out, flags,
        )
    }
}

/// `fstatat64(2)`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `stat(2)`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `stat64(2)`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `lstat(2)`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `lstat64(2)`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `fstat(2)`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, out: *mut libc::stat) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            let s = d.file.stat().map_err(eno)?;
            // SAFETY: the caller passes a writable struct stat.
            fill_stat(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        real!(fstat64: fn(c_int, *mut libc::stat) -> c_int)(fd, out)
    )
}

/// `fstat64(2)`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__fxstat` (glibc before 2.33 compiled these calls to it; it still exports it).
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__fxstat64`.
///
/// # Safety
///
/// As `fstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstat(fd, out) }
}

/// `__xstat`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `__xstat64`.
///
/// # Safety
///
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __xstat64(
    _ver: c_int,
    path: *const c_char,
    out: *mut libc::stat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, 0) }
}

/// `__lxstat`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, out: *mut libc::stat) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__lxstat64`.
///
/// # Safety
///
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    _ver: c_int,
    path: *const c_char,
    out: *mut libc::stat,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `__fxstatat`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `__fxstatat64`.
///
/// # Safety
///
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatat(dirfd, path, out, flags) }
}

/// `statx(2)`.
///
/// # Safety
///
/// As `statx(2)`.
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    if hooked() {
        if let Some(r) = super::inside(|| moneta_stat(dirfd, path, flags)) {
            return run(-1, || {
                let s = r?;
                // SAFETY: the caller passes a writable struct statx.
                fill_statx(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
                Ok(0)
            });
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int)(
            dirfd, path, flags, mask, out,
        )
    }
}

/// `faccessat(2)`: existence, then the permission bits against the real ids (or the
/// effective ones with `AT_EACCESS`), root passing read and write and needing one execute bit,
/// as the kernel decides.
///
/// # Safety
///
/// As `faccessat(2)`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    amode: c_int,
    flags: c_int,
) -> c_int {
    if hooked() {
        if let Some(r) =
            super::inside(|| moneta_stat(dirfd, path, flags & libc::AT_SYMLINK_NOFOLLOW))
        {
            return run(-1, || {
                let s = r?;
                if amode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
                    return Err(libc::EINVAL);
                }
                if amode == libc::F_OK {
                    return Ok(0);
                }
                // SAFETY: plain system calls.
                let (uid, gid) = unsafe {
                    if flags & libc::AT_EACCESS != 0 {
                        (libc::geteuid(), libc::getegid())
                    } else {
                        (libc::getuid(), libc::getgid())
                    }
                };
                if may_access(&s, uid, gid, amode) {
                    Ok(0)
                } else {
                    Err(libc::EACCES)
                }
            });
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int)(dirfd, path, amode, flags)
    }
}

fn in_groups(gid: u32) -> bool {
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: a buffer of 256 entries.
    let n = unsafe { libc::getgroups(256, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

fn may_access(s: &FsStat, uid: u32, gid: u32, amode: c_int) -> bool {
    let mode = s.mode;
    if uid == 0 {
        // Root: read and write always; execute if anyone may, or a directory.
        return amode & libc::X_OK == 0
            || mode & 0o111 != 0
            || mode & libc::S_IFMT == libc::S_IFDIR;
    }
    let bits = if s.uid == uid {
        (mode >> 6) & 7
    } else if s.gid == gid || in_groups(s.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    let want = ((amode & libc::R_OK != 0) as u32) << 2
        | ((amode & libc::W_OK != 0) as u32) << 1
        | (amode & libc::X_OK != 0) as u32;
    bits & want == want
}

/// `access(2)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, 0) }
}

/// `euidaccess(3)` / `eaccess(3)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, libc::AT_EACCESS) }
}

/// `eaccess(3)`.
///
/// # Safety
///
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, amode: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { faccessat(libc::AT_FDCWD, path, amode, libc::AT_EACCESS) }
}

// ----- durability and size -----

/// `fsync(2)`.
#[no_mangle]
pub extern "C" fn fsync(fd: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.sync_all().map(|_| 0).map_err(eno),
        real!(fsync: fn(c_int) -> c_int)(fd)
    )
}

/// `fdatasync(2)`.
#[no_mangle]
pub extern "C" fn fdatasync(fd: c_int) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.sync_data().map(|_| 0).map_err(eno),
        real!(fdatasync: fn(c_int) -> c_int)(fd)
    )
}

/// `sync_file_range(2)`: data written through a channel is on the array already; a range with
/// `SYNC_FILE_RANGE_WAIT_AFTER` makes it durable like `fdatasync`.
#[no_mangle]
pub extern "C" fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            if off < 0 || n < 0 || flags & !7 != 0 {
                return Err(libc::EINVAL);
            }
            if flags & libc::SYNC_FILE_RANGE_WAIT_AFTER != 0 {
                d.file.sync_data().map_err(eno)?;
            }
            Ok(0)
        },
        real!(sync_file_range: fn(c_int, off64_t, off64_t, c_uint) -> c_int)(fd, off, n, flags)
    )
}

/// `ftruncate(2)`.
#[no_mangle]
pub extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            if d.is_dir {
                return Err(libc::EINVAL);
            }
            d.file.set_len(offset(len)?).map(|_| 0).map_err(eno)
        },
        real!(ftruncate64: fn(c_int, off64_t) -> c_int)(fd, len)
    )
}

/// `ftruncate64(2)`.
#[no_mangle]
pub extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    ftruncate(fd, len)
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

/// `truncate(2)`.
///
/// # Safety
///
/// As `truncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    with_path!(
        path,
        -1,
        |m, np| m.truncate(p(&np), offset(len)?).map(|_| 0).map_err(eno),
        real!(truncate64: fn(*const c_char, off64_t) -> c_int)(path, len)
    )
}

/// `truncate64(2)`.
///
/// # Safety
///
/// As `truncate(2)`.
#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off64_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { truncate(path, len) }
}

fn fallocate_impl(d: &Desc, mode: c_int, off: i64, len: i64) -> Result<c_int, i32> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if d.is_dir {
        return Err(libc::ENODEV);
    }
    if d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
        // Punching and collapsing holes: not offered by nvfs.
        return Err(libc::EOPNOTSUPP);
    }
    (off as u64).checked_add(len as u64).ok_or(libc::EFBIG)?;
    // The space is taken now (ENOSPC at once, not at a later write), as the kernel does.
    d.file
        .allocate(
            off as u64,
            len as u64,
            mode & libc::FALLOC_FL_KEEP_SIZE != 0,
        )
        .map_err(eno)?;
    Ok(0)
}

/// `fallocate(2)`.
#[no_mangle]
pub extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| fallocate_impl(&d, mode, off, len),
        real!(fallocate64: fn(c_int, c_int, off64_t, off64_t) -> c_int)(fd, mode, off, len)
    )
}

/// `fallocate64(2)`.
#[no_mangle]
pub extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    fallocate(fd, mode, off, len)
}

/// `posix_fallocate(3)`: returns the error instead of setting `errno`.
#[no_mangle]
pub extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            let saved = super::errno();
            let r = super::inside(|| fallocate_impl(&d, 0, off, len));
            super::set_errno(saved);
            return match r {
                Ok(_) => 0,
                Err(e) => e,
            };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(posix_fallocate64: fn(c_int, off64_t, off64_t) -> c_int)(fd, off, len) }
}

/// `posix_fallocate64(3)`.
#[no_mangle]
pub extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    posix_fallocate(fd, off, len)
}

/// `posix_fadvise(2)`: advice has nothing to act on (no page cache); returns the error.
#[no_mangle]
pub extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    if hooked() && fds::is_moneta(fd) {
        return if !(0..=5).contains(&advice) || len < 0 || off < 0 {
            libc::EINVAL
        } else {
            0
        };
    }
    // SAFETY: forwarding.
    unsafe {
        real!(posix_fadvise64: fn(c_int, off64_t, off64_t, c_int) -> c_int)(fd, off, len, advice)
    }
}

/// `posix_fadvise64(2)`.
#[no_mangle]
pub extern "C" fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int {
    posix_fadvise(fd, off, len, advice)
}

/// `readahead(2)`.
#[no_mangle]
pub extern "C" fn readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t {
    with_fd!(
        fd,
        -1,
        |_d| Ok(0),
        real!(readahead: fn(c_int, off64_t, size_t) -> ssize_t)(fd, off, n)
    )
}

// ----- names -----

/// `unlinkat(2)`.
///
/// # Safety
///
/// As `unlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if flags & !libc::AT_REMOVEDIR != 0 {
                return Err(libc::EINVAL);
            }
            if flags & libc::AT_REMOVEDIR != 0 {
                m.rmdir(p(&np)).map(|_| 0).map_err(eno)
            } else {
                m.unlink(p(&np)).map(|_| 0).map_err(eno)
            }
        },
        real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int)(dirfd, path, flags)
    )
}

/// `unlink(2)`.
///
/// # Safety
///
/// As `unlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { unlinkat(libc::AT_FDCWD, path, 0) }
}

/// `rmdir(2)`.
///
/// # Safety
///
/// As `rmdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { unlinkat(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

/// `mkdirat(2)`.
///
/// # Safety
///
/// As `mkdirat(2)`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| m
            .mkdir(p(&np), (mode & 0o7777) & !umask())
            .map(|_| 0)
            .map_err(eno),
        real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, path, mode)
    )
}

/// `mkdir(2)`.
///
/// # Safety
///
/// As `mkdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

/// `renameat2(2)`: both names on Moneta, or neither (`EXDEV` otherwise, as between two file
/// systems).
///
/// # Safety
///
/// As `renameat2(2)`.
#[no_mangle]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        let (a, b) = unsafe { (classify(olddir, old), classify(newdir, new)) };
        match (a, b) {
            (Where::Moneta(a), Where::Moneta(b)) => {
                if let Some(m) = conn() {
                    return run(-1, || {
                        if flags & !libc::RENAME_NOREPLACE != 0 {
                            return Err(libc::EINVAL);
                        }
                        m.rename(p(&a), p(&b), flags & libc::RENAME_NOREPLACE != 0)
                            .map(|_| 0)
                            .map_err(eno)
                    });
                }
            }
            (Where::Moneta(_), Where::Libc) | (Where::Libc, Where::Moneta(_))
                if conn().is_some() =>
            {
                return run(-1, || Err(libc::EXDEV));
            }
            _ => {}
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(
            olddir, old, newdir, new, flags,
        )
    }
}

/// `renameat(2)`.
///
/// # Safety
///
/// As `renameat(2)`.
#[no_mangle]
pub unsafe extern "C" fn renameat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { renameat2(olddir, old, newdir, new, 0) }
}

/// `rename(2)`.
///
/// # Safety
///
/// As `rename(2)`.
#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { renameat2(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

/// `linkat(2)` (both names on Moneta, else `EXDEV`).
///
/// # Safety
///
/// As `linkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn linkat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        let (a, b) = unsafe { (classify(olddir, old), classify(newdir, new)) };
        match (a, b) {
            (Where::Moneta(a), Where::Moneta(b)) => {
                if let Some(m) = conn() {
                    return run(-1, || m.link(p(&a), p(&b)).map(|_| 0).map_err(eno));
                }
            }
            (Where::Moneta(_), Where::Libc) | (Where::Libc, Where::Moneta(_))
                if conn().is_some() =>
            {
                return run(-1, || Err(libc::EXDEV));
            }
            _ => {}
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(linkat: fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int)(
            olddir, old, newdir, new, flags,
        )
    }
}

/// `link(2)`.
///
/// # Safety
///
/// As `link(2)`.
#[no_mangle]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { linkat(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }
}

/// `symlinkat(2)`: the link is Moneta's when its own path is.
///
/// # Safety
///
/// As `symlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if target.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: per the caller.
            let t = unsafe { CStr::from_ptr(target) }.to_bytes();
            m.symlink(t, p(&np)).map(|_| 0).map_err(eno)
        },
        real!(symlinkat: fn(*const c_char, c_int, *const c_char) -> c_int)(target, dirfd, path)
    )
}

/// `symlink(2)`.
///
/// # Safety
///
/// As `symlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { symlinkat(target, libc::AT_FDCWD, path) }
}

/// `readlinkat(2)`.
///
/// # Safety
///
/// As `readlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if size == 0 {
                return Err(libc::EINVAL);
            }
            let t = m.readlink(p(&np)).map_err(eno)?;
            let n = t.len().min(size);
            // SAFETY: the caller passes `size` writable bytes.
            unsafe { slice_mut(buf.cast(), n) }.copy_from_slice(&t[..n]);
            Ok(n as ssize_t)
        },
        real!(readlinkat: fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t)(
            dirfd, path, buf, size
        )
    )
}

/// `readlink(2)`.
///
/// # Safety
///
/// As `readlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { readlinkat(libc::AT_FDCWD, path, buf, size) }
}

// ----- permissions and times -----

/// `fchmodat(2)`.
///
/// # Safety
///
/// As `fchmodat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
                // As Linux: the mode of a symbolic link cannot be changed.
                return Err(libc::EOPNOTSUPP);
            }
            m.chmod(p(&np), mode & 0o7777).map(|_| 0).map_err(eno)
        },
        real!(fchmodat: fn(c_int, *const c_char, mode_t, c_int) -> c_int)(dirfd, path, mode, flags)
    )
}

/// `chmod(2)`.
///
/// # Safety
///
/// As `chmod(2)`.
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchmodat(libc::AT_FDCWD, path, mode, 0) }
}

/// `fchmod(2)`.
#[no_mangle]
pub extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.chmod(mode & 0o7777).map(|_| 0).map_err(eno),
        real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode)
    )
}

/// `fchownat(2)`.
///
/// # Safety
///
/// As `fchownat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: a non-NULL path is a NUL-terminated string.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if hooked() && flags & libc::AT_EMPTY_PATH != 0 && empty {
        if let Some(d) = fds::get(dirfd) {
            return run(-1, || d.file.chown(uid, gid).map(|_| 0).map_err(eno));
        }
    }
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| m
            .chown(p(&np), uid, gid, flags & libc::AT_SYMLINK_NOFOLLOW == 0)
            .map(|_| 0)
            .map_err(eno),
        real!(fchownat: fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int)(
            dirfd, path, uid, gid, flags
        )
    )
}

/// `chown(2)`.
///
/// # Safety
///
/// As `chown(2)`.
#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, 0) }
}

/// `lchown(2)`.
///
/// # Safety
///
/// As `lchown(2)`.
#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: per the caller.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// `fchown(2)`.
#[no_mangle]
pub extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| d.file.chown(uid, gid).map(|_| 0).map_err(eno),
        real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid)
    )
}

fn wire(t: Option<&libc::timespec>) -> Result<WireTime, i32> {
    Ok(match t {
        None => WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(t) if t.tv_nsec == libc::UTIME_NOW => WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(t) if t.tv_nsec == libc::UTIME_OMIT => WireTime {
            sec: 0,
            nsec: UTIME_OMIT,
        },
        Some(t) if (0..1_000_000_000).contains(&t.tv_nsec) => WireTime {
            sec: t.tv_sec,
            nsec: t.tv_nsec as u32,
        },
        Some(_) => return Err(libc::EINVAL),
    })
}

unsafe fn times2(times: *const libc::timespec) -> Result<(WireTime, WireTime), i32> {
    if times.is_null() {
        return Ok((wire(None)?, wire(None)?));
    }
    // SAFETY: the caller passes two timespecs.
    let t = unsafe { std::slice::from_raw_parts(times, 2) };
    Ok((wire(Some(&t[0]))?, wire(Some(&t[1]))?))
}

/// `utimensat(2)`.
///
/// # Safety
///
/// As `utimensat(2)`.
#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if hooked() && path.is_null() {
        // Linux: a NULL path means the descriptor itself (futimens).
        if let Some(d) = fds::get(dirfd) {
            return run(-1, || {
                // SAFETY: per the caller.
                let (a, m) = unsafe { times2(times) }?;
                d.file.utimes(a, m).map(|_| 0).map_err(eno)
            });
        }
    }
    with_path_at!(
        dirfd,
        path,
        -1,
        |m, np| {
            // SAFETY: per the caller.
            let (a, mt) = unsafe { times2(times) }?;
            m.utimes(p(&np), a, mt, flags & libc::AT_SYMLINK_NOFOLLOW == 0)
                .map(|_| 0)
                .map_err(eno)
        },
        real!(utimensat: fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int)(
            dirfd, path, times, flags
        )
    )
}

/// `futimens(3)`.
///
/// # Safety
///
/// As `futimens(3)`.
#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            // SAFETY: per the caller.
            let (a, m) = unsafe { times2(times) }?;
            d.file.utimes(a, m).map(|_| 0).map_err(eno)
        },
        real!(futimens: fn(c_int, *const libc::timespec) -> c_int)(fd, times)
    )
}

unsafe fn tv_to_ts(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: the caller passes two timevals.
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    Some([0, 1].map(|i| libc::timespec {
        tv_sec: t[i].tv_sec,
        tv_nsec: t[i].tv_usec * 1000,
    }))
}

/// `utimes(2)`.
///
/// # Safety
///
/// As `utimes(2)`.
#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(_) = unsafe { classify(libc::AT_FDCWD, path) } {
            // SAFETY: per the caller.
            let ts = unsafe { tv_to_ts(tv) };
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, 0) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(utimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}

/// `lutimes(3)`.
///
/// # Safety
///
/// As `lutimes(3)`.
#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(_) = unsafe { classify(libc::AT_FDCWD, path) } {
            // SAFETY: per the caller.
            let ts = unsafe { tv_to_ts(tv) };
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, libc::AT_SYMLINK_NOFOLLOW) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(lutimes: fn(*const c_char, *const libc::timeval) -> c_int)(path, tv) }
}

/// `futimes(3)`.
///
/// # Safety
///
/// As `futimes(3)`.
#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if hooked() && fds::is_moneta(fd) {
        // SAFETY: per the caller.
        let ts = unsafe { tv_to_ts(tv) };
        let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        // SAFETY: per the caller.
        return unsafe { futimens(fd, ptr) };
    }
    // SAFETY: forwarding.
    unsafe { real!(futimes: fn(c_int, *const libc::timeval) -> c_int)(fd, tv) }
}

/// `utime(2)`.
///
/// # Safety
///
/// As `utime(2)`.
#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(_) = unsafe { classify(libc::AT_FDCWD, path) } {
            // SAFETY: per the caller.
            let ts = unsafe { t.as_ref() }.map(|u| {
                [
                    libc::timespec {
                        tv_sec: u.actime,
                        tv_nsec: 0,
                    },
                    libc::timespec {
                        tv_sec: u.modtime,
                        tv_nsec: 0,
                    },
                ]
            });
            let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
            // SAFETY: per the caller.
            return unsafe { utimensat(libc::AT_FDCWD, path, ptr, 0) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(utime: fn(*const c_char, *const libc::utimbuf) -> c_int)(path, t) }
}

// ----- descriptors -----

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
                return Err(super::errno());
            }
            fds::set(n, d);
            std_after(n);
            Ok(n)
        },
        real!(dup: fn(c_int) -> c_int)(fd)
    )
}

fn dup3_impl(old: c_int, new: c_int, flags: c_int) -> Option<Result<c_int, i32>> {
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
            return Err(super::errno());
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

fn fcntl_moneta(fd: c_int, d: &Arc<Desc>, cmd: c_int, arg: usize) -> Result<c_int, i32> {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: duplicating our reserved descriptor.
            let n = unsafe { libc::syscall(libc::SYS_fcntl, fd, cmd, arg) } as c_int;
            if n < 0 {
                return Err(super::errno());
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
                Err(super::errno())
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
        | libc::F_OFD_SETLKW => super::locks::fcntl_lock(d, cmd, arg),
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
        |d| super::locks::flock(&d, op),
        real!(flock: fn(c_int, c_int) -> c_int)(fd, op)
    )
}

/// `mmap(2)` of a Moneta file: not offered yet (`ENODEV`, as for a file system without
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
    if hooked() && flags & libc::MAP_ANONYMOUS == 0 && fds::is_moneta(fd) {
        return run(libc::MAP_FAILED, || Err(libc::ENODEV));
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

// ----- copies between descriptors -----

/// Copies through a buffer when either side is a Moneta descriptor.
fn copy_via_buffer(
    infd: c_int,
    inoff: Option<&mut i64>,
    outfd: c_int,
    outoff: Option<&mut i64>,
    n: usize,
) -> Result<ssize_t, i32> {
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut inoff = inoff;
    let mut outoff = outoff;
    let mut done = 0usize;
    while done < n {
        let want = buf.len().min(n - done);
        let got = match inoff.as_deref_mut() {
            Some(o) => {
                // SAFETY: reading into our buffer through the hooks (either side may be Moneta).
                let r = unsafe { pread(infd, buf.as_mut_ptr().cast(), want, *o) };
                if r > 0 {
                    *o += r as i64;
                }
                r
            }
            // SAFETY: as above.
            None => unsafe { read(infd, buf.as_mut_ptr().cast(), want) },
        };
        if got < 0 {
            return if done > 0 {
                Ok(done as ssize_t)
            } else {
                Err(super::errno())
            };
        }
        if got == 0 {
            break;
        }
        let mut w = 0usize;
        while w < got as usize {
            let put = match outoff.as_deref_mut() {
                Some(o) => {
                    // SAFETY: writing from our buffer through the hooks.
                    let r =
                        unsafe { pwrite(outfd, buf[w..].as_ptr().cast(), got as usize - w, *o) };
                    if r > 0 {
                        *o += r as i64;
                    }
                    r
                }
                // SAFETY: as above.
                None => unsafe { write(outfd, buf[w..].as_ptr().cast(), got as usize - w) },
            };
            if put < 0 {
                return if done + w > 0 {
                    Ok((done + w) as ssize_t)
                } else {
                    Err(super::errno())
                };
            }
            w += put as usize;
        }
        done += got as usize;
    }
    Ok(done as ssize_t)
}

/// `copy_file_range(2)`: between files of which one is Moneta's, a copy through memory.
///
/// # Safety
///
/// As `copy_file_range(2)`.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    infd: c_int,
    inoff: *mut off64_t,
    outfd: c_int,
    outoff: *mut off64_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    if hooked() && (fds::is_moneta(infd) || fds::is_moneta(outfd)) {
        if flags != 0 {
            super::set_errno(libc::EINVAL);
            return -1;
        }
        // Not through `run`: the copy calls the hooks, which take care of errno themselves.
        // SAFETY: per the caller: NULL or a valid offset.
        let (i, o) = unsafe { (inoff.as_mut(), outoff.as_mut()) };
        return match copy_via_buffer(infd, i, outfd, o, n) {
            Ok(v) => v,
            Err(e) => {
                super::set_errno(e);
                -1
            }
        };
    }
    // SAFETY: forwarding.
    unsafe {
        real!(copy_file_range: fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t)(
            infd, inoff, outfd, outoff, n, flags,
        )
    }
}

/// `sendfile(2)`.
///
/// # Safety
///
/// As `sendfile(2)`.
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    outfd: c_int,
    infd: c_int,
    off: *mut off_t,
    n: size_t,
) -> ssize_t {
    if hooked() && (fds::is_moneta(infd) || fds::is_moneta(outfd)) {
        // SAFETY: per the caller.
        let o = unsafe { off.as_mut() };
        return match copy_via_buffer(infd, o, outfd, None, n) {
            Ok(v) => v,
            Err(e) => {
                super::set_errno(e);
                -1
            }
        };
    }
    // SAFETY: forwarding.
    unsafe {
        real!(sendfile64: fn(c_int, c_int, *mut off64_t, size_t) -> ssize_t)(outfd, infd, off, n)
    }
}

/// `sendfile64(2)`.
///
/// # Safety
///
/// As `sendfile(2)`.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    outfd: c_int,
    infd: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    // SAFETY: per the caller.
    unsafe { sendfile(outfd, infd, off, n) }
}

// ----- file systems -----

fn fill_statvfs(s: &moneta_abi::fsproto::FsStatFs, out: &mut libc::statvfs) {
    // SAFETY: all-zero is a valid `struct statvfs`.
    *out = unsafe { std::mem::zeroed() };
    out.f_bsize = s.chunk_size as _;
    out.f_frsize = s.chunk_size as _;
    out.f_blocks = s.chunks as _;
    out.f_bfree = s.chunks_free as _;
    out.f_bavail = s.chunks_free as _;
    out.f_files = s.inodes as _;
    out.f_ffree = s.inodes_free as _;
    out.f_favail = s.inodes_free as _;
    out.f_fsid = MONETA_DEV as _;
    out.f_namemax = s.name_max as _;
}

fn fill_statfs(s: &moneta_abi::fsproto::FsStatFs, out: &mut libc::statfs) {
    // SAFETY: all-zero is a valid `struct statfs`.
    *out = unsafe { std::mem::zeroed() };
    // "MNTA": a file-system magic of its own.
    out.f_type = 0x4d4e5441;
    out.f_bsize = s.chunk_size as _;
    out.f_frsize = s.chunk_size as _;
    out.f_blocks = s.chunks as _;
    out.f_bfree = s.chunks_free as _;
    out.f_bavail = s.chunks_free as _;
    out.f_files = s.inodes as _;
    out.f_ffree = s.inodes_free as _;
    out.f_namelen = s.name_max as _;
}

/// `statvfs(3)`.
///
/// # Safety
///
/// As `statvfs(3)`.
#[no_mangle]
pub unsafe extern "C" fn statvfs(path: *const c_char, out: *mut libc::statvfs) -> c_int {
    with_path!(
        path,
        -1,
        |m, np| {
            m.stat(p(&np)).map_err(eno)?;
            let s = m.statfs().map_err(eno)?;
            // SAFETY: the caller passes a writable struct.
            fill_statvfs(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        real!(statvfs64: fn(*const c_char, *mut libc::statvfs) -> c_int)(path, out)
    )
}

/// `statvfs64(3)`.
///
/// # Safety
///
/// As `statvfs(3)`.
#[no_mangle]
pub unsafe extern "C" fn statvfs64(path: *const c_char, out: *mut libc::statvfs) -> c_int {
    // SAFETY: per the caller.
    unsafe { statvfs(path, out) }
}

/// `fstatvfs(3)`.
///
/// # Safety
///
/// As `fstatvfs(3)`.
#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, out: *mut libc::statvfs) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            let s = d.file.moneta().statfs().map_err(eno)?;
            // SAFETY: the caller passes a writable struct.
            fill_statvfs(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        real!(fstatvfs64: fn(c_int, *mut libc::statvfs) -> c_int)(fd, out)
    )
}

/// `fstatvfs64(3)`.
///
/// # Safety
///
/// As `fstatvfs(3)`.
#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, out: *mut libc::statvfs) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatvfs(fd, out) }
}

/// `statfs(2)`.
///
/// # Safety
///
/// As `statfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn statfs(path: *const c_char, out: *mut libc::statfs) -> c_int {
    with_path!(
        path,
        -1,
        |m, np| {
            m.stat(p(&np)).map_err(eno)?;
            let s = m.statfs().map_err(eno)?;
            // SAFETY: the caller passes a writable struct.
            fill_statfs(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        real!(statfs64: fn(*const c_char, *mut libc::statfs) -> c_int)(path, out)
    )
}

/// `statfs64(2)`.
///
/// # Safety
///
/// As `statfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn statfs64(path: *const c_char, out: *mut libc::statfs) -> c_int {
    // SAFETY: per the caller.
    unsafe { statfs(path, out) }
}

/// `fstatfs(2)`.
///
/// # Safety
///
/// As `fstatfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, out: *mut libc::statfs) -> c_int {
    with_fd!(
        fd,
        -1,
        |d| {
            let s = d.file.moneta().statfs().map_err(eno)?;
            // SAFETY: the caller passes a writable struct.
            fill_statfs(&s, unsafe { out.as_mut() }.ok_or(libc::EFAULT)?);
            Ok(0)
        },
        real!(fstatfs64: fn(c_int, *mut libc::statfs) -> c_int)(fd, out)
    )
}

/// `fstatfs64(2)`.
///
/// # Safety
///
/// As `fstatfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, out: *mut libc::statfs) -> c_int {
    // SAFETY: per the caller.
    unsafe { fstatfs(fd, out) }
}

// ----- current directory -----

/// `chdir(2)`: into a Moneta directory, the shim keeps the current directory itself.
///
/// # Safety
///
/// As `chdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(np) = unsafe { classify(libc::AT_FDCWD, path) } {
            if let Some(m) = conn() {
                return run(-1, || {
                    let s = m.stat(p(&np)).map_err(eno)?;
                    if s.mode & libc::S_IFMT != libc::S_IFDIR {
                        return Err(libc::ENOTDIR);
                    }
                    paths::set_cwd(Some(paths::normalize(&np)));
                    Ok(0)
                });
            }
        }
    }
    // SAFETY: forwarding.
    let r = unsafe { real!(chdir: fn(*const c_char) -> c_int)(path) };
    if r == 0 && active() {
        paths::set_cwd(None);
    }
    r
}

use super::active;

/// `fchdir(2)`.
#[no_mangle]
pub extern "C" fn fchdir(fd: c_int) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            return run(-1, || {
                if !d.is_dir {
                    return Err(libc::ENOTDIR);
                }
                paths::set_cwd(Some(paths::normalize(&d.path)));
                Ok(0)
            });
        }
    }
    // SAFETY: forwarding.
    let r = unsafe { real!(fchdir: fn(c_int) -> c_int)(fd) };
    if r == 0 && active() {
        paths::set_cwd(None);
    }
    r
}

/// `getcwd(3)`.
///
/// # Safety
///
/// As `getcwd(3)`.
#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    if hooked() {
        if let Some(dir) = paths::cwd() {
            return run(std::ptr::null_mut(), || {
                let mut full = paths::outer(&dir);
                full.push(0);
                if buf.is_null() {
                    // glibc's extension: allocate (at least `size` bytes when given).
                    let n = full.len().max(size);
                    // SAFETY: malloc; the caller frees it.
                    let m = unsafe { libc::malloc(n) } as *mut u8;
                    if m.is_null() {
                        return Err(libc::ENOMEM);
                    }
                    // SAFETY: `m` has room for `full`.
                    unsafe { std::ptr::copy_nonoverlapping(full.as_ptr(), m, full.len()) };
                    return Ok(m.cast());
                }
                if size == 0 {
                    return Err(libc::EINVAL);
                }
                if full.len() > size {
                    return Err(libc::ERANGE);
                }
                // SAFETY: the caller passes `size` writable bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(full.as_ptr(), buf.cast::<u8>(), full.len())
                };
                Ok(buf)
            });
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(getcwd: fn(*mut c_char, size_t) -> *mut c_char)(buf, size) }
}

/// `get_current_dir_name(3)`.
#[no_mangle]
pub extern "C" fn get_current_dir_name() -> *mut c_char {
    if hooked() && paths::cwd().is_some() {
        // SAFETY: getcwd allocates with a NULL buffer.
        return unsafe { getcwd(std::ptr::null_mut(), 0) };
    }
    // SAFETY: forwarding.
    unsafe { real!(get_current_dir_name: fn() -> *mut c_char)() }
}

/// `realpath(3)`: a Moneta path is normalized lexically and must exist (symbolic links inside
/// nvfs are not resolved).
///
/// # Safety
///
/// As `realpath(3)`.
#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    if hooked() {
        // SAFETY: per the caller.
        if let Where::Moneta(np) = unsafe { classify(libc::AT_FDCWD, path) } {
            if let Some(m) = conn() {
                return run(std::ptr::null_mut(), || {
                    m.stat(p(&np)).map_err(eno)?;
                    let mut full = paths::outer(&paths::normalize(&np));
                    if full.len() >= libc::PATH_MAX as usize {
                        return Err(libc::ENAMETOOLONG);
                    }
                    full.push(0);
                    let dst = if resolved.is_null() {
                        // SAFETY: malloc; the caller frees it.
                        let m = unsafe { libc::malloc(libc::PATH_MAX as usize) } as *mut c_char;
                        if m.is_null() {
                            return Err(libc::ENOMEM);
                        }
                        m
                    } else {
                        resolved
                    };
                    // SAFETY: `dst` has PATH_MAX bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(full.as_ptr(), dst.cast::<u8>(), full.len())
                    };
                    Ok(dst)
                });
            }
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(realpath: fn(*const c_char, *mut c_char) -> *mut c_char)(path, resolved) }
}

/// `ioctl` on a Moneta descriptor: the few requests programs ask of regular files.
#[no_mangle]
pub extern "C" fn moneta_shim_ioctl(fd: c_int, req: libc::c_ulong, arg: usize) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            return run(-1, || match req {
                libc::FIONREAD => {
                    let size = d.file.len().map_err(eno)?;
                    let left = size
                        .saturating_sub(d.file.position())
                        .min(c_int::MAX as u64);
                    // SAFETY: the caller passes an int.
                    unsafe { *(arg as *mut c_int) = left as c_int };
                    Ok(0)
                }
                libc::FIOCLEX | libc::FIONCLEX => {
                    // SAFETY: on our reserved descriptor.
                    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, req, arg) } as c_int;
                    if r < 0 {
                        Err(super::errno())
                    } else {
                        Ok(r)
                    }
                }
                _ => Err(libc::ENOTTY),
            });
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(ioctl: fn(c_int, libc::c_ulong, usize) -> c_int)(fd, req, arg) }
}

// ----- extended attributes: nvfs has none -----

/// Existence of a Moneta path (so that a missing one still says `ENOENT`), then `err`.
fn no_xattrs(m: &libmoneta::Moneta, np: &[u8], follow: bool, err: i32) -> Result<ssize_t, i32> {
    if follow {
        m.stat(p(np)).map_err(eno)?;
    } else {
        m.lstat(p(np)).map_err(eno)?;
    }
    if err == 0 {
        Ok(0)
    } else {
        Err(err)
    }
}

macro_rules! xattr_path_hooks {
    ($($name:ident($($arg:ident: $ty:ty),*) follow $follow:expr, answer $err:expr;)*) => {$(
        /// An extended-attribute call: on a Moneta path, nvfs keeps none (`ENOTSUP`; an empty
        /// list for the list calls).
        ///
        /// # Safety
        ///
        /// As the C library's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, $($arg: $ty),*) -> ssize_t {
            with_path!(
                path,
                -1,
                |m, np| no_xattrs(m, &np, $follow, $err),
                real!($name: fn(*const c_char, $($ty),*) -> ssize_t)(path, $($arg),*)
            )
        }
    )*};
}

xattr_path_hooks! {
    getxattr(name: *const c_char, value: *mut c_void, size: size_t) follow true, answer libc::ENOTSUP;
    lgetxattr(name: *const c_char, value: *mut c_void, size: size_t) follow false, answer libc::ENOTSUP;
    listxattr(list: *mut c_char, size: size_t) follow true, answer 0;
    llistxattr(list: *mut c_char, size: size_t) follow false, answer 0;
    removexattr(name: *const c_char) follow true, answer libc::ENOTSUP;
    lremovexattr(name: *const c_char) follow false, answer libc::ENOTSUP;
    setxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) follow true, answer libc::ENOTSUP;
    lsetxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) follow false, answer libc::ENOTSUP;
}

macro_rules! xattr_fd_hooks {
    ($($name:ident($($arg:ident: $ty:ty),*) answer $err:expr;)*) => {$(
        /// An extended-attribute call on a descriptor: none on a Moneta file.
        ///
        /// # Safety
        ///
        /// As the C library's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, $($arg: $ty),*) -> ssize_t {
            with_fd!(
                fd,
                -1,
                |_d| if $err == 0 { Ok(0) } else { Err($err) },
                real!($name: fn(c_int, $($ty),*) -> ssize_t)(fd, $($arg),*)
            )
        }
    )*};
}

xattr_fd_hooks! {
    fgetxattr(name: *const c_char, value: *mut c_void, size: size_t) answer libc::ENOTSUP;
    flistxattr(list: *mut c_char, size: size_t) answer 0;
    fremovexattr(name: *const c_char) answer libc::ENOTSUP;
    fsetxattr(name: *const c_char, value: *const c_void, size: size_t, flags: c_int) answer libc::ENOTSUP;
}
