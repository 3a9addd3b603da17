//! Files of the kernel file system a daemon serves with `--kernel-fs`, read and written
//! through the kernel with the extents the daemon maps.

use super::*;

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
