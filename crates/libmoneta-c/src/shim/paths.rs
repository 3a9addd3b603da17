//! Which paths are Moneta's: an absolute path under the prefix, a relative one while the
//! current directory is under it, or one relative to a Moneta directory descriptor (`*at`).
//!
//! Paths are compared after lexical normalization (`//`, `.`, `..`), so `/moneta/../etc` is
//! not a Moneta path. The current directory is tracked by the `chdir`/`fchdir` hooks: a
//! directory under the prefix exists only in nvfs, so the kernel's current directory stays
//! where it was and the shim answers `getcwd` itself.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::RwLock;

use super::{config, fds};

/// A path's destination.
pub(crate) enum Where {
    /// A path inside nvfs (absolute, normalized, keeping a trailing `/` if there was one).
    Moneta(Vec<u8>),
    /// Not Moneta's: the C library's business, with the caller's path.
    Libc,
    /// Not Moneta's, but the C library must be given this absolute path instead of the
    /// caller's: the caller's leaves the prefix lexically (`/moneta/..`, or `..` from a Moneta
    /// directory), which the kernel, for which the prefix does not exist, cannot follow.
    Host(CString),
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

/// The environment variable that carries a Moneta working directory to child processes (as
/// its prefix path), which the kernel cannot: see [`enter`].
pub(crate) const CWD_VAR: &std::ffi::CStr = c"MONETA_CWD";

/// Whether the kernel's working directory is a removed directory of ours (see [`enter`]).
static KERNEL_DEAD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes `dir` (an nvfs directory) the working directory.
///
/// The kernel knows nothing of it, so its own working directory would stay where the process
/// was, and anything that resolves a relative path without the shim (a statically linked
/// program started from here, a raw system call, the shell `system(3)` starts) would find or
/// create files in that host directory instead. So the kernel's working directory becomes a
/// private directory that is removed at once: relative paths the kernel sees then fail with
/// `ENOENT` rather than land anywhere. Children learn the Moneta directory from
/// `MONETA_CWD`, which the shim honours at start only when its kernel directory is such a
/// removed one (so a stale value after a host `cd` is ignored).
pub(crate) fn enter(dir: Vec<u8>) {
    if !KERNEL_DEAD.load(std::sync::atomic::Ordering::Relaxed) && make_kernel_cwd_dead() {
        KERNEL_DEAD.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if let Ok(v) = std::ffi::CString::new(outer(&dir)) {
        // SAFETY: setenv with NUL-terminated strings.
        unsafe { libc::setenv(CWD_VAR.as_ptr(), v.as_ptr(), 1) };
    }
    set_cwd(Some(dir));
}

/// The working directory is a kernel one again (after a successful `chdir` there).
pub(crate) fn leave() {
    KERNEL_DEAD.store(false, std::sync::atomic::Ordering::Relaxed);
    if cwd().is_some() {
        // SAFETY: unsetenv with a NUL-terminated name.
        unsafe { libc::unsetenv(CWD_VAR.as_ptr()) };
    }
    set_cwd(None);
}

/// At start: takes the Moneta working directory a parent left in `MONETA_CWD`, if the
/// kernel's working directory is a removed one (the parent's doing); drops a stale value.
pub(crate) fn inherit_cwd() {
    // SAFETY: getenv at load time.
    let v = unsafe { libc::getenv(CWD_VAR.as_ptr()) };
    if v.is_null() {
        return;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let outer_path = unsafe { CStr::from_ptr(v) }.to_bytes().to_vec();
    let mut buf = [0u8; 64];
    // SAFETY: the raw system call writes at most `buf.len()` bytes; it fails with ENOENT
    // when the working directory has been removed.
    let r = unsafe { libc::syscall(libc::SYS_getcwd, buf.as_mut_ptr(), buf.len()) };
    let removed = r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
    match (removed, inner(&normalize(&outer_path))) {
        (true, Some(dir)) => {
            KERNEL_DEAD.store(true, std::sync::atomic::Ordering::Relaxed);
            set_cwd(Some(dir));
        }
        // SAFETY: unsetenv with a NUL-terminated name, at load time.
        _ => unsafe {
            libc::unsetenv(CWD_VAR.as_ptr());
        },
    }
}

/// Moves the kernel's working directory into a new private directory and removes it.
fn make_kernel_cwd_dead() -> bool {
    let dir = format!(
        "/tmp/.moneta-cwd-{}-{:x}\0",
        std::process::id(),
        // Distinct per call: the address of a local and the time.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    );
    let p = dir.as_ptr();
    // SAFETY: raw system calls (the hooks must not see them) on a NUL-terminated path.
    unsafe {
        if libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, p, 0o700) != 0 {
            return false;
        }
        let moved = libc::syscall(libc::SYS_chdir, p) == 0;
        libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, p, libc::AT_REMOVEDIR);
        moved
    }
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

/// [`classify`] on bytes. When the daemon serves a kernel file system (`monetad
/// --kernel-fs`), every path is the kernel's: its files are real files of a real mount, and
/// the shim only takes over the data of those opened ([`super::kfs`]).
pub(crate) fn classify_bytes(dirfd: c_int, p: &[u8]) -> Where {
    if super::kfs::serving() {
        return Where::Libc;
    }
    match classify_nvfs(dirfd, p) {
        Where::Moneta(_) if super::kfs::probe() => Where::Libc,
        w => w,
    }
}

fn classify_nvfs(dirfd: c_int, p: &[u8]) -> Where {
    if p.is_empty() {
        return Where::Libc;
    }
    if p[0] == b'/' {
        return absolute(p, false);
    }
    if dirfd == libc::AT_FDCWD {
        return match cwd() {
            Some(dir) => absolute(&join(&outer(&dir), p), true),
            None => match reaching_in(p).then(kernel_cwd).flatten() {
                Some(base) => inside_only(&join(&base, p)),
                None => Where::Libc,
            },
        };
    }
    match fds::get(dirfd) {
        Some(d) => absolute(&join(&outer(&d.path), p), true),
        None => match reaching_in(p).then(|| kernel_fd_path(dirfd)).flatten() {
            Some(base) => inside_only(&join(&base, p)),
            None => Where::Libc,
        },
    }
}

/// An absolute path: Moneta's if it normalizes to one under the prefix; otherwise the C
/// library's, rewritten when it went through the prefix (or `rewrite` says it must be: a path
/// made here from a Moneta directory, which the kernel does not know).
fn absolute(p: &[u8], rewrite: bool) -> Where {
    let norm = normalize(p);
    if let Some(mut i) = inner(&norm) {
        if p.ends_with(b"/") && i != b"/" {
            i.push(b'/');
        }
        return Where::Moneta(i);
    }
    if rewrite || through_prefix(p) {
        let mut n = norm;
        if p.ends_with(b"/") && n != b"/" {
            n.push(b'/');
        }
        return match CString::new(n) {
            Ok(c) => Where::Host(c),
            Err(_) => Where::Libc,
        };
    }
    Where::Libc
}

/// A path resolved from a kernel directory: Moneta's when it lands under the prefix, else the
/// caller's path is right for the kernel as it is.
fn inside_only(p: &[u8]) -> Where {
    match absolute(p, false) {
        w @ Where::Moneta(_) => w,
        _ => Where::Libc,
    }
}

/// Whether some leading part of the absolute path `p` lies under the prefix (it enters the
/// prefix and, ending outside, leaves it again with `..`).
fn through_prefix(p: &[u8]) -> bool {
    let prefix = &config().prefix;
    let Some(last) = prefix
        .rsplit(|&b| b == b'/')
        .next()
        .filter(|l| !l.is_empty())
    else {
        return false;
    };
    // Cheap first: a path that never names the prefix's last component cannot enter it.
    if !p.windows(last.len()).any(|w| w == last) {
        return false;
    }
    let mut stack: Vec<&[u8]> = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => continue,
            b".." => {
                stack.pop();
            }
            c => stack.push(c),
        }
        let mut sofar = Vec::with_capacity(p.len());
        for c in &stack {
            sofar.push(b'/');
            sofar.extend_from_slice(c);
        }
        if inner(&sofar).is_some() {
            return true;
        }
    }
    false
}

/// Whether a relative path could reach the prefix from a kernel directory: it names the
/// prefix's last component (`moneta/x` from `/`, `mnt/moneta/x` from `/` for the prefix
/// `/mnt/moneta`) or climbs with `..`. Only then is the directory's own path worth a system
/// call.
fn reaching_in(p: &[u8]) -> bool {
    let prefix = &config().prefix;
    let Some(last) = prefix
        .rsplit(|&b| b == b'/')
        .next()
        .filter(|l| !l.is_empty())
    else {
        return false;
    };
    p.split(|&b| b == b'/').any(|c| c == last || c == b"..")
}

/// The kernel's current directory (when the process's current directory is not Moneta's).
fn kernel_cwd() -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: the raw system call writes at most `buf.len()` bytes.
    let n = unsafe { libc::syscall(libc::SYS_getcwd, buf.as_mut_ptr(), buf.len()) };
    if n <= 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    buf.truncate(end);
    buf.starts_with(b"/").then_some(buf)
}

/// The path of the kernel directory descriptor `fd`, as the kernel names it.
fn kernel_fd_path(fd: c_int) -> Option<Vec<u8>> {
    let link = format!("/proc/self/fd/{fd}\0");
    let mut buf = vec![0u8; 4096];
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe {
        libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            link.as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n <= 0 || n as usize >= buf.len() {
        return None;
    }
    buf.truncate(n as usize);
    // "/dir", not "anon_inode:[...]" or "/dir (deleted)".
    (buf.starts_with(b"/") && !buf.ends_with(b" (deleted)")).then_some(buf)
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
