//! Extended attributes: nvfs has none.

use super::*;

/// Existence of a Moneta path (so that a missing one still says `ENOENT`), then `err`.
pub(super) fn no_xattrs(
    m: &libmoneta::Moneta,
    np: &[u8],
    follow: bool,
    err: i32,
) -> Result<ssize_t, i32> {
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
