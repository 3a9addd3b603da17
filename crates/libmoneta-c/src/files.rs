//! Files: opening and closing, reads and writes (plain, vectored, at an offset), `fsync`,
//! barriers, advice, mappings, size, attributes, completion policy and directory listing.

use super::*;

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
