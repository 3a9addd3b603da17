//! File systems: `statfs`, `statvfs` and their descriptor forms.

use super::*;

pub(super) fn fill_statvfs(s: &moneta_abi::fsproto::FsStatFs, out: &mut libc::statvfs) {
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

pub(super) fn fill_statfs(s: &moneta_abi::fsproto::FsStatFs, out: &mut libc::statfs) {
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
        kfs direct,
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
        kfs direct,
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
