//! The current directory: `chdir`, `fchdir`, `getcwd`, `realpath`.

use super::*;

/// `chdir(2)`: into a Moneta directory, the shim keeps the current directory itself (and the
/// kernel's becomes a removed directory, see [`paths::enter`]).
///
/// # Safety
///
/// As `chdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        // SAFETY: per the caller.
        match unsafe { crate::shim::route(libc::AT_FDCWD, path) } {
            crate::shim::Route::Moneta(m, np) => {
                return run(-1, || {
                    let s = m.stat(p(&np)).map_err(eno)?;
                    enter_dir(&s, paths::normalize(&np))
                })
            }
            crate::shim::Route::Fail(e) => return crate::shim::fail(-1, e),
            crate::shim::Route::Host(h) => host = h,
        }
    }
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding.
    let r = unsafe { real!(chdir: fn(*const c_char) -> c_int)(path) };
    if r == 0 && active() {
        paths::leave();
    }
    r
}

/// Changes into the nvfs directory `dir` whose attributes are `s`: it must be a directory the
/// caller may search (`EACCES` otherwise, as the kernel says).
fn enter_dir(s: &FsStat, dir: Vec<u8>) -> Result<c_int, i32> {
    if s.mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(libc::ENOTDIR);
    }
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if !may_access(s, uid, gid, libc::X_OK) {
        return Err(libc::EACCES);
    }
    paths::enter(dir);
    Ok(0)
}

use crate::shim::active;

/// `fchdir(2)`.
#[no_mangle]
pub extern "C" fn fchdir(fd: c_int) -> c_int {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            return run(-1, || {
                if !d.is_dir {
                    return Err(libc::ENOTDIR);
                }
                let s = d.file.stat().map_err(eno)?;
                enter_dir(&s, paths::normalize(&d.path))
            });
        }
    }
    // SAFETY: forwarding.
    let r = unsafe { real!(fchdir: fn(c_int) -> c_int)(fd) };
    if r == 0 && active() {
        paths::leave();
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
    let mut host: Option<std::ffi::CString> = None;
    if hooked() {
        // SAFETY: per the caller.
        match unsafe { crate::shim::route(libc::AT_FDCWD, path) } {
            crate::shim::Route::Fail(e) => return crate::shim::fail(std::ptr::null_mut(), e),
            crate::shim::Route::Host(h) => host = h,
            crate::shim::Route::Moneta(m, np) => {
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
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    // SAFETY: forwarding.
    unsafe { real!(realpath: fn(*const c_char, *mut c_char) -> *mut c_char)(path, resolved) }
}

/// `ioctl` on a Moneta descriptor: the few requests programs ask of regular files.
#[no_mangle]
pub extern "C" fn moneta_shim_ioctl(fd: c_int, req: libc::c_ulong, arg: usize) -> c_int {
    if hooked() {
        if let Err(e) = crate::shim::kfs::give_back(fd) {
            return crate::shim::fail(-1, e);
        }

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
                        Err(crate::shim::errno())
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
