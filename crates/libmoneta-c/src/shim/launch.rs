//! Running programs that are Moneta files, and saying when a program cannot see them.
//!
//! The kernel cannot execute a file it cannot see, so `exec` of a Moneta path runs a copy:
//! the shim checks what the kernel would (a regular file, execute permission for the caller;
//! set-user-ID and set-group-ID bits are ignored, as on a `nosuid` mount), reads the file
//! through the channel into a sealed memfd and executes `/proc/self/fd/N` of it (the memfd is
//! close-on-exec, so the new program does not keep it). A `#!` script is not copied: its
//! interpreter runs with the script's path as the caller gave it (as the kernel does), which
//! the interpreter, under the shim too, opens itself: `$0` and `__file__` are that path.
//! The new program sees `/proc/self/exe` as the memfd (`/memfd:moneta-exec (deleted)`).
//!
//! A statically linked or set-ID program started with Moneta in play (a Moneta working
//! directory, or an argument that names a Moneta path) cannot be reached by `LD_PRELOAD`: it
//! runs, but a message says why its Moneta paths will not be found, whether it was started
//! by path or found on `PATH` (`env`, `xargs`).

use std::ffi::{c_char, CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use super::paths::{self, Where};
use super::{config, conn, eno, hooked, log, ERROR, WARN};

/// `#!` interpreters followed, as the kernel allows.
const MAX_INTERPRETERS: u32 = 4;

/// A program image ready for `execve`: the path to give the kernel, the arguments, and the
/// memfd that path names (closed on drop, or by the successful `exec`).
pub(crate) struct Image {
    pub path: CString,
    pub argv: Vec<CString>,
    ptrs: Vec<*const c_char>,
    _memfd: Option<OwnedFd>,
}

impl Image {
    /// `argv` as the NULL-terminated array `execve` takes.
    pub fn argv_ptr(&mut self) -> *const *const c_char {
        self.ptrs = self.argv.iter().map(|a| a.as_ptr()).collect();
        self.ptrs.push(std::ptr::null());
        self.ptrs.as_ptr()
    }
}

/// The strings of a NULL-terminated `argv`.
///
/// # Safety
///
/// `argv` is NULL or a NULL-terminated array of NUL-terminated strings.
unsafe fn args(argv: *const *const c_char) -> Vec<CString> {
    let mut out = Vec::new();
    if argv.is_null() {
        return out;
    }
    let mut i = 0;
    loop {
        // SAFETY: per the caller.
        let p = unsafe { *argv.add(i) };
        if p.is_null() {
            return out;
        }
        // SAFETY: per the caller.
        out.push(unsafe { CStr::from_ptr(p) }.to_owned());
        i += 1;
    }
}

/// What `exec` of `path` with `argv` must run instead, when `path` is a Moneta file: `None`
/// for a host program (after the warning about unreachable programs, when it applies), or the
/// image, or the errno the `exec` fails with.
///
/// # Safety
///
/// `path` a NUL-terminated string, `argv` as for `execve`.
pub(crate) unsafe fn prepare(
    path: *const c_char,
    argv: *const *const c_char,
) -> Option<Result<Image, i32>> {
    if !hooked() || path.is_null() {
        return None;
    }
    // SAFETY: per the caller.
    let argv = unsafe { args(argv) };
    // SAFETY: per the caller.
    let path = unsafe { CStr::from_ptr(path) }.to_owned();
    super::inside(|| resolve(path, argv, 0))
}

fn resolve(path: CString, argv: Vec<CString>, depth: u32) -> Option<Result<Image, i32>> {
    let np = match classify_c(&path) {
        // A program on the daemon's ext4 or XFS: the kernel runs it as any other.
        Where::Moneta(_) if conn().is_some_and(super::kfs::serves) => {
            return (depth > 0).then(|| Ok(host_image(path, argv)));
        }
        Where::Moneta(np) => np,
        Where::Host(h) => {
            warn_if_unreachable(&h, &argv);
            return (depth > 0).then(|| Ok(host_image(h, argv)));
        }
        Where::Libc => {
            warn_if_unreachable(&path, &argv);
            return (depth > 0).then(|| Ok(host_image(path, argv)));
        }
    };
    Some(moneta_image(np, &path, argv, depth))
}

fn classify_c(p: &CStr) -> Where {
    paths::classify_bytes(libc::AT_FDCWD, p.to_bytes())
}

fn host_image(path: CString, argv: Vec<CString>) -> Image {
    Image {
        path,
        argv,
        ptrs: Vec::new(),
        _memfd: None,
    }
}

/// The image of the Moneta file `np` (an nvfs path).
fn moneta_image(np: Vec<u8>, given: &CStr, argv: Vec<CString>, depth: u32) -> Result<Image, i32> {
    let m = conn().ok_or(libc::EIO)?;
    let p = std::path::Path::new(std::ffi::OsStr::from_bytes(&np));
    let st = m.stat(p).map_err(eno)?;
    if st.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EACCES);
    }
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if !super::hooks::may_access(&st, uid, gid, libc::X_OK) {
        return Err(libc::EACCES);
    }
    let f = m
        .open(p, libmoneta::OpenOptions::new().read(true))
        .map_err(eno)?;
    let mut head = vec![0u8; libmoneta::program::HEAD];
    let n = f.read_at(&mut head, 0).map_err(eno)?;
    head.truncate(n);
    if let Some((interp, arg)) = libmoneta::program::shebang(&head) {
        if depth >= MAX_INTERPRETERS {
            return Err(libc::ELOOP);
        }
        // The interpreter, its argument, the script's path as the caller gave it, then the
        // caller's arguments after the first (the kernel's order).
        let script = given.to_owned();
        let interp = CString::new(interp).map_err(|_| libc::ENOEXEC)?;
        let mut v = vec![interp.clone()];
        if let Some(a) = arg {
            v.push(CString::new(a).map_err(|_| libc::ENOEXEC)?);
        }
        v.push(script);
        v.extend(argv.into_iter().skip(1));
        return match resolve(interp.clone(), v.clone(), depth + 1) {
            Some(r) => r,
            None => Ok(host_image(interp, v)),
        };
    }
    if libmoneta::program::is_elf(&head) && !libmoneta::program::has_interp(&head) {
        log(
            WARN,
            format_args!(
                "{} is statically linked: LD_PRELOAD cannot reach it, so it will not find \
                 files under {}",
                String::from_utf8_lossy(&paths::outer(&np)),
                String::from_utf8_lossy(&config().prefix)
            ),
        );
    }
    let size = st.size;
    let memfd = rustix::fs::memfd_create(
        "moneta-exec",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| e.raw_os_error())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let want = ((size - at) as usize).min(buf.len());
        let got = f.read_at(&mut buf[..want], at).map_err(eno)?;
        if got == 0 {
            break;
        }
        let mut off = 0;
        while off < got {
            let w = rustix::io::pwrite(&memfd, &buf[off..got], at + off as u64)
                .map_err(|e| e.raw_os_error())?;
            off += w;
        }
        at += got as u64;
    }
    // Sealed: nothing can change the image between this check and the kernel's reading.
    let _ = rustix::fs::fcntl_add_seals(
        &memfd,
        rustix::fs::SealFlags::SEAL
            | rustix::fs::SealFlags::SHRINK
            | rustix::fs::SealFlags::GROW
            | rustix::fs::SealFlags::WRITE,
    );
    let path =
        CString::new(format!("/proc/self/fd/{}", memfd.as_raw_fd())).expect("no NUL in a number");
    Ok(Image {
        path,
        argv,
        ptrs: Vec::new(),
        _memfd: Some(memfd),
    })
}

/// Whether `arg` names a Moneta path: as a whole (also relative to a Moneta working
/// directory), or inside it, as an absolute path under the prefix after a separator
/// (`if=/moneta/x`, `--file=/moneta/x`, the command of `sh -c 'ls /moneta'`).
fn names_moneta(arg: &[u8]) -> bool {
    if matches!(paths::classify_bytes(libc::AT_FDCWD, arg), Where::Moneta(_)) {
        return true;
    }
    let prefix = &config().prefix;
    if prefix.is_empty() {
        return false;
    }
    let name = |b: u8| b.is_ascii_alphanumeric() || b"/._-~".contains(&b);
    (0..arg.len()).any(|i| {
        arg[i..].starts_with(prefix)
            && (i == 0 || !name(arg[i - 1]))
            && arg
                .get(i + prefix.len())
                .is_none_or(|&b| b == b'/' || !name(b))
    })
}

/// The host program `execvp` would run for `file` (no `/` in it): the first executable
/// regular file of that name in a `PATH` directory (the C library's default path when
/// `PATH` is unset).
fn host_search(file: &[u8]) -> Option<CString> {
    let path = std::env::var_os("PATH")
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_else(|| b"/bin:/usr/bin".to_vec());
    path.split(|&b| b == b':').find_map(|d| {
        let mut cand = if d.is_empty() {
            b".".to_vec()
        } else {
            d.to_vec()
        };
        cand.push(b'/');
        cand.extend_from_slice(file);
        let c = CString::new(cand).ok()?;
        let st = rustix::fs::stat(c.as_c_str()).ok()?;
        (st.st_mode & libc::S_IFMT == libc::S_IFREG
            && rustix::fs::access(c.as_c_str(), rustix::fs::Access::EXEC_OK).is_ok())
        .then_some(c)
    })
}

/// Before `execvp` or `posix_spawnp` of `file` on the C library's own `PATH` search: the
/// warning of [`warn_if_unreachable`] for the program the search will find.
///
/// # Safety
///
/// `argv` as for `execve`.
pub(crate) unsafe fn warn_searched(file: &CStr, argv: *const *const c_char) {
    if !hooked() || file.to_bytes().is_empty() || file.to_bytes().contains(&b'/') {
        return;
    }
    // SAFETY: per the caller.
    let argv = unsafe { args(argv) };
    super::inside(|| {
        // The search only when the warning could apply.
        if in_play(&argv) {
            if let Some(full) = host_search(file.to_bytes()) {
                warn_if_unreachable(&full, &argv);
            }
        }
    });
}

/// Whether Moneta is in play for a program started with `argv`: a Moneta working directory,
/// or an argument that names a Moneta path.
fn in_play(argv: &[CString]) -> bool {
    paths::cwd().is_some() || argv.iter().skip(1).any(|a| names_moneta(a.to_bytes()))
}

/// A host program that `LD_PRELOAD` cannot reach (statically linked, or set-user-ID or
/// set-group-ID), started with Moneta in play (a Moneta working directory, or an argument
/// that names a Moneta path): says so once, since the program itself will only report that
/// the paths do not exist.
fn warn_if_unreachable(path: &CStr, argv: &[CString]) {
    if !in_play(argv) {
        return;
    }
    let Some(why) = unreachable(path, 0) else {
        return;
    };
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        log(
            ERROR,
            format_args!(
                "{why}: files under {} will not be found by it",
                String::from_utf8_lossy(&config().prefix)
            ),
        )
    });
}

/// Why `LD_PRELOAD` cannot reach the host program at `path`, if it cannot.
fn unreachable(path: &CStr, depth: u32) -> Option<String> {
    let show = path.to_string_lossy();
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return Some(format!(
            "{show} is set-user-ID or set-group-ID: the dynamic linker ignores LD_PRELOAD for it"
        ));
    }
    let mut head = [0u8; 4096];
    let n = rustix::io::pread(&fd, &mut head, 0).ok()?;
    let head = &head[..n];
    if let Some((interp, _)) = libmoneta::program::shebang(head) {
        if depth >= MAX_INTERPRETERS {
            return None;
        }
        return unreachable(&CString::new(interp).ok()?, depth + 1);
    }
    (libmoneta::program::is_elf(head) && !libmoneta::program::has_interp(head))
        .then(|| format!("{show} is statically linked: LD_PRELOAD cannot reach it"))
}

/// The program `file` names, searched on `PATH` as `execvp` does, when the search reaches a
/// directory under the prefix (which the C library's own search cannot look in): `None` when
/// the C library can search itself.
pub(crate) fn search_path(file: &CStr) -> Option<CString> {
    let f = file.to_bytes();
    if f.is_empty() || f.contains(&b'/') {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    let dirs: Vec<Vec<u8>> = path
        .as_bytes()
        .split(|&b| b == b':')
        .map(|d| {
            if d.is_empty() {
                b".".to_vec()
            } else {
                d.to_vec()
            }
        })
        .collect();
    let moneta = |d: &[u8]| matches!(paths::classify_bytes(libc::AT_FDCWD, d), Where::Moneta(_));
    if !dirs.iter().any(|d| moneta(d)) {
        return None;
    }
    for d in dirs {
        let mut cand = d.clone();
        cand.push(b'/');
        cand.extend_from_slice(f);
        let c = CString::new(cand.clone()).ok()?;
        let found = match paths::classify_bytes(libc::AT_FDCWD, &cand) {
            Where::Moneta(np) => conn().is_some_and(|m| {
                m.stat(std::path::Path::new(std::ffi::OsStr::from_bytes(&np)))
                    .is_ok_and(|s| s.mode & libc::S_IFMT == libc::S_IFREG && s.mode & 0o111 != 0)
            }),
            _ => rustix::fs::access(c.as_c_str(), rustix::fs::Access::EXEC_OK).is_ok(),
        };
        if found {
            return Some(c);
        }
    }
    None
}
