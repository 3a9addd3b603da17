//! Copies between descriptors: `copy_file_range`, `sendfile`.

use super::*;

/// Copies through a buffer when either side is a Moneta descriptor.
pub(super) fn copy_via_buffer(
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
                Err(crate::shim::errno())
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
                    Err(crate::shim::errno())
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
    if hooked() {
        for fd in [infd, outfd] {
            if let Err(e) = crate::shim::kfs::give_back(fd) {
                return crate::shim::fail(-1, e);
            }
        }
    }
    if hooked() && (fds::is_moneta(infd) || fds::is_moneta(outfd)) {
        if flags != 0 {
            crate::shim::set_errno(libc::EINVAL);
            return -1;
        }
        // Not through `run`: the copy calls the hooks, which take care of errno themselves.
        // SAFETY: per the caller: NULL or a valid offset.
        let (i, o) = unsafe { (inoff.as_mut(), outoff.as_mut()) };
        return match copy_via_buffer(infd, i, outfd, o, n) {
            Ok(v) => v,
            Err(e) => {
                crate::shim::set_errno(e);
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
    if hooked() {
        for fd in [infd, outfd] {
            if let Err(e) = crate::shim::kfs::give_back(fd) {
                return crate::shim::fail(-1, e);
            }
        }
    }
    if hooked() && (fds::is_moneta(infd) || fds::is_moneta(outfd)) {
        // SAFETY: per the caller.
        let o = unsafe { off.as_mut() };
        return match copy_via_buffer(infd, o, outfd, None, n) {
            Ok(v) => v,
            Err(e) => {
                crate::shim::set_errno(e);
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
