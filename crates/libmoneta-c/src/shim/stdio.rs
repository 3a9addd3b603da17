//! stdio streams on Moneta files: `fopen`, `fdopen` and `freopen` open the descriptor through
//! the shim and wrap it with `fopencookie` (`csrc/shim.c`), since the C library's own streams
//! read and write their descriptor from inside the library, where no hook can see it.
//!
//! `freopen` onto a Moneta path works on streams the shim made, and on the standard streams:
//! the new file takes the descriptor's number, the stream variable then points at the shim's
//! stream over it (see `csrc/shim.c`), and that stream is returned. Other C library streams
//! cannot be turned into cookie streams in place: `EOPNOTSUPP`, with a message.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use super::fds;
use super::hooks::{close, dup3, moneta_shim_openat};
use super::paths::{classify, Where};
use super::{hooked, log, real, set_errno, WARN};

extern "C" {
    fn moneta_shim_cookie_stream(fd: c_int, mode: *const c_char) -> *mut c_void;
    fn moneta_shim_std_stream(fd: c_int) -> *mut c_void;
}

/// Streams made by the shim.
static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn remember(fp: *mut c_void) {
    STREAMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(fp as usize);
}

fn is_ours(fp: *mut c_void) -> bool {
    STREAMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&(fp as usize)))
}

/// `open(2)` flags for an `fopen(3)` mode, or `EINVAL`.
fn mode_flags(mode: &[u8]) -> Result<c_int, i32> {
    let mut f = match mode.first() {
        Some(b'r') => libc::O_RDONLY,
        Some(b'w') => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        Some(b'a') => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return Err(libc::EINVAL),
    };
    for &c in &mode[1..] {
        match c {
            b'+' => f = (f & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => f |= libc::O_EXCL,
            b'e' => f |= libc::O_CLOEXEC,
            b',' => break,
            _ => {}
        }
    }
    Ok(f)
}

fn cookie(fd: c_int, mode: *const c_char) -> *mut c_void {
    // SAFETY: a Moneta descriptor and the caller's NUL-terminated mode.
    let fp = unsafe { moneta_shim_cookie_stream(fd, mode) };
    if !fp.is_null() {
        remember(fp);
    }
    fp
}

/// `fopen(3)`.
///
/// # Safety
///
/// As `fopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut c_void {
    // A path that leaves the prefix lexically goes to the C library rewritten.
    let host = if hooked() {
        // SAFETY: per the caller.
        match unsafe { crate::shim::paths::classify(libc::AT_FDCWD, path) } {
            crate::shim::paths::Where::Host(c) => Some(c),
            _ => None,
        }
    } else {
        None
    };
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    if hooked() && !mode.is_null() {
        // SAFETY: per the caller.
        if let Where::Moneta(_) = unsafe { classify(libc::AT_FDCWD, path) } {
            // SAFETY: per the caller.
            let m = unsafe { CStr::from_ptr(mode) }.to_bytes();
            let flags = match mode_flags(m) {
                Ok(f) => f,
                Err(e) => {
                    set_errno(e);
                    return std::ptr::null_mut();
                }
            };
            // SAFETY: per the caller.
            let fd = unsafe { moneta_shim_openat(libc::AT_FDCWD, path, flags, 0o666) };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            if fds::is_moneta(fd) {
                let fp = cookie(fd, mode);
                if fp.is_null() {
                    let e = super::errno();
                    close(fd);
                    set_errno(e);
                }
                return fp;
            }
            // The daemon is unreachable and the C library opened it: a C library stream.
            // SAFETY: forwarding.
            return unsafe { real!(fdopen: fn(c_int, *const c_char) -> *mut c_void)(fd, mode) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(fopen64: fn(*const c_char, *const c_char) -> *mut c_void)(path, mode) }
}

/// `fopen64(3)`.
///
/// # Safety
///
/// As `fopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut c_void {
    // SAFETY: per the caller.
    unsafe { fopen(path, mode) }
}

/// `fdopen(3)`.
///
/// # Safety
///
/// As `fdopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut c_void {
    // The stream reads and writes inside the C library, out of the hooks' reach.
    if let Err(e) = crate::shim::kfs::give_back(fd) {
        return crate::shim::fail(std::ptr::null_mut(), e);
    }
    if hooked() && fds::is_moneta(fd) && !mode.is_null() {
        return cookie(fd, mode);
    }
    // SAFETY: forwarding.
    unsafe { real!(fdopen: fn(c_int, *const c_char) -> *mut c_void)(fd, mode) }
}

/// `freopen(3)`.
///
/// # Safety
///
/// As `freopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut c_void,
) -> *mut c_void {
    // A path that leaves the prefix lexically goes to the C library rewritten.
    let host = if hooked() {
        // SAFETY: per the caller.
        match unsafe { crate::shim::paths::classify(libc::AT_FDCWD, path) } {
            crate::shim::paths::Where::Host(c) => Some(c),
            _ => None,
        }
    } else {
        None
    };
    let path = host.as_ref().map_or(path, |c| c.as_ptr());
    if hooked() && !path.is_null() && !mode.is_null() {
        // SAFETY: per the caller.
        if let Where::Moneta(_) = unsafe { classify(libc::AT_FDCWD, path) } {
            // SAFETY: a valid stream, per the caller.
            let old = unsafe { libc::fileno(stream.cast()) };
            // SAFETY: reading the standard stream variables.
            let standard =
                (0..=2).contains(&old) && unsafe { moneta_shim_std_stream(old) } == stream;
            if !is_ours(stream) && !standard {
                log(
                    WARN,
                    format_args!(
                        "freopen onto a Moneta file works on the standard streams and on \
                         streams the shim opened only"
                    ),
                );
                set_errno(libc::EOPNOTSUPP);
                return std::ptr::null_mut();
            }
            // SAFETY: a valid stream.
            unsafe { libc::fflush(stream.cast()) };
            // SAFETY: per the caller.
            let m = unsafe { CStr::from_ptr(mode) }.to_bytes();
            let flags = match mode_flags(m) {
                Ok(f) => f,
                Err(e) => {
                    set_errno(e);
                    return std::ptr::null_mut();
                }
            };
            // SAFETY: per the caller.
            let fd = unsafe { moneta_shim_openat(libc::AT_FDCWD, path, flags, 0o666) };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            // The stream's cookie is its descriptor number: point that number at the new file.
            let r = dup3(fd, old, flags & libc::O_CLOEXEC);
            let e = super::errno();
            close(fd);
            if r < 0 {
                set_errno(e);
                return std::ptr::null_mut();
            }
            if standard {
                // The variable now points at the shim's stream over that descriptor.
                // SAFETY: reading the standard stream variable.
                return unsafe { moneta_shim_std_stream(old) };
            }
            // SAFETY: a stream of ours.
            unsafe { libc::clearerr(stream.cast()) };
            return stream;
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(freopen64: fn(*const c_char, *const c_char, *mut c_void) -> *mut c_void)(
            path, mode, stream,
        )
    }
}

/// `freopen64(3)`.
///
/// # Safety
///
/// As `freopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: per the caller.
    unsafe { freopen(path, mode, stream) }
}

#[cfg(test)]
mod tests {
    use super::mode_flags;

    #[test]
    fn modes() {
        assert_eq!(mode_flags(b"r"), Ok(libc::O_RDONLY));
        assert_eq!(
            mode_flags(b"w+e"),
            Ok(libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC)
        );
        assert_eq!(
            mode_flags(b"ax"),
            Ok(libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_EXCL)
        );
        assert_eq!(mode_flags(b"q"), Err(libc::EINVAL));
    }
}
