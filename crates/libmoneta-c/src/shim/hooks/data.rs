//! Data: `read`, `write`, the positioned and vectored forms, `lseek`.

use super::*;
use crate::shim::kfs::KDesc;

pub(super) fn data_io(n: usize, write: bool) {
    count(&COUNTERS.direct_ios, 1);
    if write {
        count(&COUNTERS.bytes_written, n as u64);
    } else {
        count(&COUNTERS.bytes_read, n as u64);
    }
}

/// The first bytes of a SQLite database (its file header, at the start of page 1).
const SQLITE_HEADER: &[u8] = b"SQLite format 3\0";

/// Refuses the write by which SQLite turns a database to WAL mode (`PRAGMA
/// journal_mode=WAL`): page 1 written at offset 0 through a descriptor that took a write
/// lock (SQLite's, before it writes), with the header's format versions (bytes 18 and 19) at
/// 2 where the file's are not. A database in WAL mode maps its `-shm` file into memory,
/// shared, at every open, which an array with data checksums cannot give (others can, and
/// there the switch goes through): let through, the switch would
/// leave a database that no later open reads. Refused, SQLite rolls the change back and
/// reports an I/O error, the database keeps its journal mode, and a message says why once.
/// A copy of a
/// WAL database (`cp`, no lock) and the checkpoints of one already in WAL mode (opened with
/// `locking_mode=EXCLUSIVE`) are let through.
fn refuse_wal_switch(d: &Desc, data: &[u8], at: Option<u64>) -> Result<(), i32> {
    if data.len() < 20
        || !data.starts_with(SQLITE_HEADER)
        || data[18..20] != [2, 2]
        || !d.write_locked.load(Ordering::Relaxed)
    {
        return Ok(());
    }
    if at.unwrap_or_else(|| d.file.position()) != 0 {
        return Ok(());
    }
    let mut now = [0u8; 20];
    let n = d.file.read_at(&mut now, 0).map_err(eno)?;
    if n == now.len() && now.starts_with(SQLITE_HEADER) && now[18..20] == [2, 2] {
        return Ok(());
    }
    // Where the array hands files' pages out (all but one with data checksums), the -shm
    // file maps.
    match d.file.pages(false) {
        Err(e) if e.errno() == libc::ENODEV => {}
        _ => return Ok(()),
    }
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        log(
            crate::shim::ERROR,
            format_args!(
                "journal_mode=WAL refused for {} (EOPNOTSUPP): a SQLite database in WAL mode \
                 maps its -shm file into memory shared between processes (mmap MAP_SHARED), \
                 which this array cannot give (it keeps data checksums, which stores through a \
                 mapping would bypass); the database keeps its journal mode (DELETE, TRUNCATE \
                 and PERSIST work)",
                String::from_utf8_lossy(&paths::outer(&d.path))
            ),
        )
    });
    Err(libc::EOPNOTSUPP)
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
        kfs | k | k_read(&k, buf, n, None),
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
            refuse_wal_switch(&d, b, None)?;
            let r = d.file.write(b).map_err(eno)?;
            data_io(r, true);
            Ok(r as ssize_t)
        },
        kfs | k | k_write(&k, buf, n, None),
        real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n)
    )
}

pub(super) fn pread_impl(d: &Desc, buf: *mut c_void, n: usize, off: i64) -> Result<ssize_t, i32> {
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf, n) };
    let r = d.file.read_at(b, offset(off)?).map_err(eno)?;
    data_io(r, false);
    Ok(r as ssize_t)
}

pub(super) fn pwrite_impl(
    d: &Desc,
    buf: *const c_void,
    n: usize,
    off: i64,
) -> Result<ssize_t, i32> {
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf, n) };
    let off = offset(off)?;
    refuse_wal_switch(d, b, Some(off))?;
    let r = d.file.write_at(b, off).map_err(eno)?;
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
        kfs | k | k_read(&k, buf, n, Some(off)),
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
        kfs | k | k_write(&k, buf, n, Some(off)),
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

pub(super) unsafe fn iov<'a>(v: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], i32> {
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

pub(super) fn gather(v: &[libc::iovec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.iter().map(|i| i.iov_len).sum());
    for i in v {
        // SAFETY: each iovec describes readable memory of the caller.
        out.extend_from_slice(unsafe { slice(i.iov_base, i.iov_len) });
    }
    out
}

/// Reads into the buffers in order: from `off`, or at the position (advancing it).
pub(super) fn readv_impl(d: &Desc, v: &[libc::iovec], off: Option<u64>) -> Result<ssize_t, i32> {
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

pub(super) fn writev_impl(d: &Desc, v: &[libc::iovec], off: Option<u64>) -> Result<ssize_t, i32> {
    let data = gather(v);
    refuse_wal_switch(d, &data, off)?;
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
        // SAFETY: the caller passes `cnt` iovecs.
        kfs | k | k_readv(&k, unsafe { iov(v, cnt) }, None),
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
        // SAFETY: the caller passes `cnt` iovecs.
        kfs | k | k_writev(&k, unsafe { iov(v, cnt) }, None),
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
        // SAFETY: the caller passes `cnt` iovecs.
        kfs | k | k_readv(&k, unsafe { iov(v, cnt) }, Some(off)),
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
        // SAFETY: the caller passes `cnt` iovecs.
        kfs | k | k_writev(&k, unsafe { iov(v, cnt) }, Some(off)),
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
        kfs | k | {
            match rwf_ok(flags) {
                Err(e) => Some(Err(e)),
                // Hints a memory device has no use for: through the channel.
                Ok(()) if flags & !(libc::RWF_HIPRI | libc::RWF_NOWAIT) == 0 => {
                    // SAFETY: the caller passes `cnt` iovecs.
                    k_readv(&k, unsafe { iov(v, cnt) }, (off != -1).then_some(off))
                }
                Ok(()) => None,
            }
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
        kfs | k | {
            match rwf_ok(flags) {
                Err(e) => Some(Err(e)),
                // An append is the kernel's (atomic); the others are hints or a sync.
                Ok(()) if flags & libc::RWF_APPEND == 0 => {
                    // SAFETY: the caller passes `cnt` iovecs.
                    let r = k_writev(&k, unsafe { iov(v, cnt) }, (off != -1).then_some(off));
                    if flags & (libc::RWF_DSYNC | libc::RWF_SYNC) != 0 && matches!(r, Some(Ok(_))) {
                        if let Err(e) = k.sync() {
                            return Some(Err(e));
                        }
                    }
                    r
                }
                Ok(()) => {
                    if let Err(e) = crate::shim::kfs::settle(fd) {
                        return Some(Err(e));
                    }
                    None
                }
            }
        },
        real!(pwritev64v2: fn(c_int, *const libc::iovec, c_int, off64_t, c_int) -> ssize_t)(
            fd, v, cnt, off, flags
        )
    )
}

pub(super) fn rwf_ok(flags: c_int) -> Result<(), i32> {
    let known =
        libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_NOWAIT | libc::RWF_APPEND;
    if flags & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

pub(super) fn lseek_impl(d: &Desc, off: i64, whence: c_int) -> Result<off_t, i32> {
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
        kfs | k | {
            match k.seek(off, whence) {
                Some(r) => Some(r),
                None => crate::shim::kfs::settle(fd).err().map(Err),
            }
        },
        real!(lseek64: fn(c_int, off64_t, c_int) -> off64_t)(fd, off, whence)
    )
}

/// `lseek64(2)`.
#[no_mangle]
pub extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    lseek(fd, off, whence)
}

// Kernel files served through the channel (`crate::shim::kfs`): `None` when the description
// went back to the kernel meanwhile.

fn k_read(k: &KDesc, buf: *mut c_void, n: usize, off: Option<i64>) -> Option<Result<ssize_t, i32>> {
    // SAFETY: the caller passes `n` writable bytes.
    let b = unsafe { slice_mut(buf, n) };
    let r = match off.map(offset) {
        Some(Err(e)) => return Some(Err(e)),
        Some(Ok(o)) => k.read_at(b, o),
        None => k.at_position(|at| k.read_at(b, at))?,
    };
    Some(r.map(|n| {
        data_io(n, false);
        n as ssize_t
    }))
}

fn k_write(
    k: &KDesc,
    buf: *const c_void,
    n: usize,
    off: Option<i64>,
) -> Option<Result<ssize_t, i32>> {
    // SAFETY: the caller passes `n` readable bytes.
    let b = unsafe { slice(buf, n) };
    let r = match off.map(offset) {
        Some(Err(e)) => return Some(Err(e)),
        Some(Ok(o)) => k.write_at(b, o),
        None => k.at_position(|at| k.write_at(b, at))?,
    };
    Some(r.map(|n| {
        data_io(n, true);
        n as ssize_t
    }))
}

fn k_readv(
    k: &KDesc,
    v: Result<&[libc::iovec], i32>,
    off: Option<i64>,
) -> Option<Result<ssize_t, i32>> {
    let v = match v {
        Ok(v) => v,
        Err(e) => return Some(Err(e)),
    };
    let total: usize = v.iter().map(|i| i.iov_len).sum();
    let mut tmp = vec![0u8; total];
    let r = k_read(k, tmp.as_mut_ptr().cast(), total, off)?;
    if let Ok(n) = r {
        let n = n as usize;
        let mut at = 0;
        for i in v {
            if at >= n {
                break;
            }
            let c = i.iov_len.min(n - at);
            // SAFETY: each iovec describes writable memory of the caller.
            unsafe { slice_mut(i.iov_base, c) }.copy_from_slice(&tmp[at..at + c]);
            at += c;
        }
    }
    Some(r)
}

fn k_writev(
    k: &KDesc,
    v: Result<&[libc::iovec], i32>,
    off: Option<i64>,
) -> Option<Result<ssize_t, i32>> {
    let data = match v {
        Ok(v) => gather(v),
        Err(e) => return Some(Err(e)),
    };
    k_write(k, data.as_ptr().cast(), data.len(), off)
}
