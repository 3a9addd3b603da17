//! Which paths are Moneta's: an absolute path under the prefix, a relative one while the
//! current directory is under it, or one relative to a Moneta directory descriptor (`*at`).
//!
//! Paths are compared after lexical normalization (`//`, `.`, `..`), so `/moneta/../etc` is
//! not a Moneta path. The current directory is tracked by the `chdir`/`fchdir` hooks: a
//! directory under the prefix exists only in nvfs, so the kernel's current directory stays
//! where it was and the shim answers `getcwd` itself.

use std::ffi::{c_char, c_int, CStr};
use std::sync::RwLock;

use super::{config, fds};

/// A path's destination.
pub(crate) enum Where {
    /// A path inside nvfs (absolute, normalized, keeping a trailing `/` if there was one).
    Moneta(Vec<u8>),
    /// Not Moneta's: the C library's business.
    Libc,
}

/// Lexically normalizes an absolute path: no `//`, `.` or `..` (`..` at the root stays
/// there), no trailing slash except for `/` itself.
pub(crate) fn normalize(p: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = Vec::with_capacity(p.len() + 1);
    for c in parts {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// The nvfs path of a normalized absolute path under the prefix, if it is under it.
pub(crate) fn inner(norm: &[u8]) -> Option<Vec<u8>> {
    let prefix = &config().prefix;
    if prefix.is_empty() || !norm.starts_with(prefix) {
        return None;
    }
    match &norm[prefix.len()..] {
        [] => Some(b"/".to_vec()),
        rest if rest[0] == b'/' => Some(rest.to_vec()),
        _ => None,
    }
}

/// The current directory inside nvfs, when the process has changed into one.
static CWD: RwLock<Option<Vec<u8>>> = RwLock::new(None);

/// The nvfs current directory, if the process is in one.
pub(crate) fn cwd() -> Option<Vec<u8>> {
    CWD.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Records that the current directory is `dir` inside nvfs (`None`: a kernel directory).
pub(crate) fn set_cwd(dir: Option<Vec<u8>>) {
    *CWD.write().unwrap_or_else(|e| e.into_inner()) = dir;
}

/// Joins `rel` (relative) onto the nvfs directory `base`.
fn join(base: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut p = base.to_vec();
    if !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(rel);
    p
}

/// Normalizes an nvfs path, keeping a trailing slash (it matters: `mkdir("d/")`, `open("f/")`).
fn finish(p: &[u8]) -> Vec<u8> {
    let mut n = normalize(p);
    if p.ends_with(b"/") && n != b"/" {
        n.push(b'/');
    }
    n
}

/// Where `path` (relative to `dirfd` when not absolute) points.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string.
pub(crate) unsafe fn classify(dirfd: c_int, path: *const c_char) -> Where {
    if path.is_null() {
        return Where::Libc;
    }
    // SAFETY: per the caller.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    classify_bytes(dirfd, p)
}

/// [`classify`] on bytes.
pub(crate) fn classify_bytes(dirfd: c_int, p: &[u8]) -> Where {
    if p.is_empty() {
        return Where::Libc;
    }
    if p[0] == b'/' {
        return match inner(&normalize(p)) {
            Some(mut i) => {
                if p.ends_with(b"/") && i != b"/" {
                    i.push(b'/');
                }
                Where::Moneta(i)
            }
            None => Where::Libc,
        };
    }
    if dirfd == libc::AT_FDCWD {
        return match cwd() {
            Some(dir) => Where::Moneta(finish(&join(&dir, p))),
            None => Where::Libc,
        };
    }
    match fds::get(dirfd) {
        Some(d) => Where::Moneta(finish(&join(&d.path, p))),
        None => Where::Libc,
    }
}

/// The prefix path a user sees for an nvfs path (for `getcwd` and `realpath`).
pub(crate) fn outer(inner: &[u8]) -> Vec<u8> {
    let mut p = config().prefix.clone();
    if inner != b"/" {
        p.extend_from_slice(inner);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn normalizes_lexically() {
        assert_eq!(normalize(b"/"), b"/");
        assert_eq!(normalize(b"//a//b/"), b"/a/b");
        assert_eq!(normalize(b"/a/./b/../c"), b"/a/c");
        assert_eq!(normalize(b"/../.."), b"/");
        assert_eq!(normalize(b"/moneta/../etc/passwd"), b"/etc/passwd");
    }
}
