//! Temporary files: `mkstemp`, `mkostemp`, `mkstemps`, `mkostemps` (and their `64` names) and
//! `mkdtemp`. The C library makes them with its internal `open` and `mkdir`, which no hook
//! sees, so a template under the prefix would name a host path; here a template that is
//! Moneta's is filled and created through the hooks, and any other goes to the C library.

use super::*;

/// Attempts at a free name before giving up with `EEXIST`, as the C library does.
const ATTEMPTS: u32 = 62 * 62 * 62;

const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Fills the six `X` before the last `suffix` bytes of `t` with random letters.
fn fill(t: &mut [u8], suffix: usize) {
    let end = t.len() - suffix;
    let mut r = [0u8; 6];
    if rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty()).is_err() {
        // No entropy source: the time and the address of a local, mixed.
        let x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (&r as *const _ as u64);
        r.copy_from_slice(&x.to_le_bytes()[..6]);
    }
    for (i, b) in r.iter().enumerate() {
        t[end - 6 + i] = LETTERS[*b as usize % LETTERS.len()];
    }
}

/// The template as bytes, if it is a Moneta path with `XXXXXX` before `suffix` bytes: `None`
/// for the C library, `Some(Err(errno))` for a Moneta template that is malformed.
///
/// # Safety
///
/// `t` is NULL or a NUL-terminated, writable string.
unsafe fn moneta_template(t: *mut c_char, suffix: c_int) -> Option<Result<usize, i32>> {
    if !hooked() || t.is_null() {
        return None;
    }
    // SAFETY: per the caller.
    if !matches!(unsafe { classify(libc::AT_FDCWD, t) }, Where::Moneta(_)) {
        return None;
    }
    // SAFETY: per the caller.
    let len = unsafe { CStr::from_ptr(t) }.to_bytes().len();
    let Ok(suffix) = usize::try_from(suffix) else {
        return Some(Err(libc::EINVAL));
    };
    // SAFETY: `len` bytes of the caller's string.
    let bytes = unsafe { std::slice::from_raw_parts(t.cast::<u8>(), len) };
    if len < 6 + suffix || &bytes[len - suffix - 6..len - suffix] != b"XXXXXX" {
        return Some(Err(libc::EINVAL));
    }
    Some(Ok(len))
}

/// Fills the template and creates the file or directory `make` makes of it, trying new names
/// while they exist.
///
/// # Safety
///
/// `t` is a writable string of `len` bytes (and its NUL).
unsafe fn create(
    t: *mut c_char,
    len: usize,
    suffix: usize,
    make: impl Fn(*const c_char) -> c_int,
) -> c_int {
    // SAFETY: per the caller.
    let bytes = unsafe { std::slice::from_raw_parts_mut(t.cast::<u8>(), len) };
    for _ in 0..ATTEMPTS {
        fill(bytes, suffix);
        let r = make(t);
        if r >= 0 || crate::shim::errno() != libc::EEXIST {
            return r;
        }
    }
    crate::shim::set_errno(libc::EEXIST);
    -1
}

/// `mkostemps(3)`: the others call it.
///
/// # Safety
///
/// As `mkostemps(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkostemps(t: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: per the caller.
    match unsafe { moneta_template(t, suffix) } {
        None => {
            // SAFETY: forwarding.
            unsafe { real!(mkostemps: fn(*mut c_char, c_int, c_int) -> c_int)(t, suffix, flags) }
        }
        Some(Err(e)) => crate::shim::fail(-1, e),
        Some(Ok(len)) => {
            let flags = (flags & (libc::O_APPEND | libc::O_CLOEXEC | libc::O_SYNC | libc::O_DSYNC))
                | libc::O_RDWR
                | libc::O_CREAT
                | libc::O_EXCL;
            // SAFETY: the template is the caller's writable string; the hook reads the mode
            // given with O_CREAT.
            unsafe {
                create(t, len, suffix as usize, |p| {
                    moneta_shim_openat(libc::AT_FDCWD, p, flags, 0o600)
                })
            }
        }
    }
}

/// `mkostemps64`.
///
/// # Safety
///
/// As `mkostemps(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkostemps64(t: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, suffix, flags) }
}

/// `mkstemp(3)`.
///
/// # Safety
///
/// As `mkstemp(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkstemp(t: *mut c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, 0, 0) }
}

/// `mkstemp64`.
///
/// # Safety
///
/// As `mkstemp(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkstemp64(t: *mut c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, 0, 0) }
}

/// `mkostemp(3)`.
///
/// # Safety
///
/// As `mkostemp(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkostemp(t: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, 0, flags) }
}

/// `mkostemp64`.
///
/// # Safety
///
/// As `mkostemp(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkostemp64(t: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, 0, flags) }
}

/// `mkstemps(3)`.
///
/// # Safety
///
/// As `mkstemps(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkstemps(t: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, suffix, 0) }
}

/// `mkstemps64`.
///
/// # Safety
///
/// As `mkstemps(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkstemps64(t: *mut c_char, suffix: c_int) -> c_int {
    // SAFETY: per the caller.
    unsafe { mkostemps(t, suffix, 0) }
}

/// `mkdtemp(3)`: a directory of mode 0700.
///
/// # Safety
///
/// As `mkdtemp(3)`.
#[no_mangle]
pub unsafe extern "C" fn mkdtemp(t: *mut c_char) -> *mut c_char {
    // SAFETY: per the caller.
    match unsafe { moneta_template(t, 0) } {
        None => {
            // SAFETY: forwarding.
            unsafe { real!(mkdtemp: fn(*mut c_char) -> *mut c_char)(t) }
        }
        Some(Err(e)) => crate::shim::fail(std::ptr::null_mut(), e),
        Some(Ok(len)) => {
            // SAFETY: the template is the caller's writable string.
            let r = unsafe { create(t, len, 0, |p| mkdir(p, 0o700)) };
            if r == 0 {
                t
            } else {
                std::ptr::null_mut()
            }
        }
    }
}
