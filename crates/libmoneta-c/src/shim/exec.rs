//! `exec`: Moneta descriptors without close-on-exec stay usable in the new program image.
//!
//! A Moneta file is a handle on the process's connection and a position in the shim's memory,
//! both of which `exec` throws away. So before `execve` (and the other `exec` calls and
//! `posix_spawn`), the shim asks the daemon for a bundle of the connection's handles (as for a
//! fork), and writes a record of every descriptor to hand on into a memfd without
//! close-on-exec: its number, the handle, flags, path and where its shared position lives. The
//! new image finds the record through `MONETA_HANDOVER` in its environment (the variable is
//! removed at once), claims the bundle on a new connection, and rebuilds the descriptors under
//! the same numbers before `main` runs. The kernel descriptors behind Moneta files stay open
//! across `exec` as the application asked, so the numbers are still taken.
//!
//! If `exec` fails, everything is undone (the bundle goes with its pipe). `LD_PRELOAD` is added
//! to an environment that lost it, so the new image has the shim to take the files over.
//! `system(3)` and `popen(3)` start their shell inside the C library, out of the hooks' reach:
//! the shell gets no Moneta descriptors (it can open Moneta paths itself).
//!
//! Files of a kernel file system served through the channel ([`super::kfs`]) are handed on as
//! what they are, kernel files: those without close-on-exec go back to the kernel first.

use std::ffi::{c_char, c_int, CStr, CString};
use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::sync::Mutex;

use libmoneta::{File, FileState, Moneta};

use super::fds::{self, Desc};
use super::paths;
use super::{config, conn, hooked, log, real, DEBUG, ERROR};

const VERSION: u32 = 1;
const ENV: &str = "MONETA_HANDOVER";

/// What one `exec` call set up, to be undone if it fails (or, after `posix_spawn`, in the
/// parent).
struct Prepared {
    env: Vec<CString>,
    ptrs: Vec<*const c_char>,
    memfd: c_int,
    pipe: c_int,
    /// Descriptors whose close-on-exec flag was cleared.
    uncloexec: Vec<c_int>,
}

impl Prepared {
    fn undo(self) {
        // SAFETY: descriptors this call made, or whose flag it cleared.
        unsafe {
            libc::syscall(libc::SYS_close, self.memfd);
            libc::syscall(libc::SYS_close, self.pipe);
            for fd in self.uncloexec {
                libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
}

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
}

fn cloexec(fd: c_int) -> bool {
    // SAFETY: reading a descriptor's flags.
    let f = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFD) };
    f >= 0 && f & libc::FD_CLOEXEC as i64 != 0
}

fn clear_cloexec(fd: c_int, undo: &mut Vec<c_int>) {
    if cloexec(fd) {
        // SAFETY: changing a flag of our own descriptor.
        unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, 0) };
        undo.push(fd);
    }
}

/// Our library's path, for an environment that lost `LD_PRELOAD`.
fn library_path() -> Option<Vec<u8>> {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address inside this library.
    let r = unsafe { libc::dladdr(library_path as *const libc::c_void, &mut info) };
    if r == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returns a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_bytes()
            .to_vec(),
    )
}

/// The environment a new program image gets: the caller's `envp`, with the hand-over record
/// named when there is one (`memfd`), `MONETA_CWD` naming the Moneta working directory (or
/// removed when there is none) and `LD_PRELOAD` put back when the new image needs the shim
/// for either. `None` when the caller's environment needs no change.
///
/// # Safety
///
/// `envp` is NULL or a NULL-terminated array of NUL-terminated strings.
unsafe fn child_env(
    envp: *const *const c_char,
    memfd: Option<c_int>,
) -> Option<(Vec<CString>, Vec<*const c_char>)> {
    let cwd = paths::cwd();
    let var = paths::CWD_VAR.to_bytes();
    let named = |b: &[u8], name: &[u8]| b.starts_with(name) && b.get(name.len()) == Some(&b'=');
    let mut env: Vec<CString> = Vec::new();
    let mut has_preload = false;
    let mut had_cwd = false;
    if !envp.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: per the caller: a NULL-terminated array.
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: per the caller.
            let s = unsafe { CStr::from_ptr(p) };
            let b = s.to_bytes();
            if named(b, var) {
                had_cwd = true;
            } else if !named(b, ENV.as_bytes()) {
                has_preload |= b.starts_with(b"LD_PRELOAD=");
                env.push(s.to_owned());
            }
            i += 1;
        }
    }
    if memfd.is_none() && cwd.is_none() && !had_cwd {
        return None;
    }
    if !has_preload && (memfd.is_some() || cwd.is_some()) {
        if let Some(lib) = library_path() {
            let mut v = b"LD_PRELOAD=".to_vec();
            v.extend_from_slice(&lib);
            env.push(CString::new(v).expect("no NUL in a path"));
        }
    }
    if let Some(dir) = &cwd {
        let mut v = var.to_vec();
        v.push(b'=');
        v.extend_from_slice(&paths::outer(dir));
        if let Ok(c) = CString::new(v) {
            env.push(c);
        }
    }
    if let Some(fd) = memfd {
        env.push(CString::new(format!("{ENV}={fd}")).expect("no NUL"));
    }
    let mut ptrs: Vec<*const c_char> = env.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Some((env, ptrs))
}

/// Builds the hand-over for the Moneta descriptors that survive `exec`, and the environment
/// that names it; `None` when there is nothing to hand over.
///
/// # Safety
///
/// `envp` is NULL or a NULL-terminated array of NUL-terminated strings.
unsafe fn prepare(envp: *const *const c_char) -> Option<Prepared> {
    let moving: Vec<(c_int, Arc<Desc>)> = fds::effective()
        .into_iter()
        .filter(|(fd, _)| !cloexec(*fd))
        .collect();
    if moving.is_empty() {
        return None;
    }
    let m = conn()?;
    let h = match super::inside(|| m.handover()) {
        Ok(h) => h,
        Err(e) => {
            log(
                ERROR,
                format_args!("Moneta files cannot be handed to the new program: {e}"),
            );
            return None;
        }
    };
    let mut undo = Vec::new();
    clear_cloexec(h.pipe, &mut undo);
    // Unique descriptions, in order, and which each descriptor uses.
    let mut descs: Vec<Arc<Desc>> = Vec::new();
    let mut map: Vec<(c_int, u32)> = Vec::new();
    for (fd, d) in &moving {
        let i = match descs.iter().position(|x| Arc::ptr_eq(x, d)) {
            Some(i) => i,
            None => {
                descs.push(d.clone());
                descs.len() - 1
            }
        };
        map.push((*fd, i as u32));
    }
    let cfg = config();
    let mut w = W(Vec::new());
    w.u32(VERSION);
    w.bytes(cfg.socket.as_os_str().as_encoded_bytes());
    w.bytes(&cfg.prefix);
    w.u64(h.bundle);
    w.u64(h.secret[0]);
    w.u64(h.secret[1]);
    w.i32(h.pipe);
    w.u32(descs.len() as u32);
    for d in &descs {
        let st = match super::inside(|| d.file.state()) {
            Ok(s) => s,
            Err(e) => {
                log(
                    ERROR,
                    format_args!("a Moneta file cannot be handed over: {e}"),
                );
                Prepared {
                    env: Vec::new(),
                    ptrs: Vec::new(),
                    memfd: -1,
                    pipe: h.pipe,
                    uncloexec: undo,
                }
                .undo();
                return None;
            }
        };
        if let Some((fd, _)) = st.position_cell {
            clear_cloexec(fd, &mut undo);
        }
        w.u64(st.handle);
        w.u64(st.ino);
        w.u8(st.readable as u8);
        w.u8(st.writable as u8);
        w.u8(st.append as u8);
        w.u8(st.is_dir as u8);
        w.i32(d.flags.load(std::sync::atomic::Ordering::Relaxed));
        w.u64(st.position);
        let (cfd, cidx) = st.position_cell.unwrap_or((-1, 0));
        w.i32(cfd);
        w.u32(cidx);
        w.u64(*d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner()));
        w.bytes(&d.path);
    }
    w.u32(map.len() as u32);
    for (fd, i) in &map {
        w.i32(*fd);
        w.u32(*i);
    }
    let memfd = match rustix::fs::memfd_create("moneta-handover", rustix::fs::MemfdFlags::empty()) {
        Ok(f) => f.into_raw_fd(),
        Err(e) => {
            log(ERROR, format_args!("cannot make the hand-over memfd: {e}"));
            Prepared {
                env: Vec::new(),
                ptrs: Vec::new(),
                memfd: -1,
                pipe: h.pipe,
                uncloexec: undo,
            }
            .undo();
            return None;
        }
    };
    // SAFETY: writing our buffer to our memfd.
    let wrote = unsafe { libc::syscall(libc::SYS_pwrite64, memfd, w.0.as_ptr(), w.0.len(), 0) };
    // SAFETY: per the caller.
    let (env, ptrs) = unsafe { child_env(envp, Some(memfd)) }.expect("an environment");
    let p = Prepared {
        env,
        ptrs,
        memfd,
        pipe: h.pipe,
        uncloexec: undo,
    };
    if wrote != w.0.len() as i64 {
        log(ERROR, format_args!("cannot write the hand-over record"));
        p.undo();
        return None;
    }
    log(
        DEBUG,
        format_args!("handing {} descriptors to the next image", map.len()),
    );
    Some(p)
}

extern "C" {
    static environ: *const *const c_char;
}

fn current_env() -> *const *const c_char {
    // SAFETY: reading the process's environment pointer.
    unsafe { environ }
}

/// Runs an exec-like call with the hand-over in place, undoing it if the call returns.
///
/// # Safety
///
/// `envp` as for `execve`.
unsafe fn with_handover(
    envp: *const *const c_char,
    call: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if hooked() {
        super::kfs::before_exec();
        // SAFETY: per the caller.
        if let Some(p) = unsafe { prepare(envp) } {
            let r = call(p.ptrs.as_ptr());
            let e = super::errno();
            let _keep = &p.env;
            p.undo();
            super::set_errno(e);
            return r;
        }
        // No descriptors to hand over, but perhaps a working directory.
        // SAFETY: per the caller.
        if let Some((_env, ptrs)) = unsafe { child_env(envp, None) } {
            return call(ptrs.as_ptr());
        }
    }
    call(envp)
}

/// `execve(2)`.
///
/// # Safety
///
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the caller.
    match unsafe { super::launch::prepare(path, argv) } {
        None => {}
        Some(Err(e)) => return super::fail(-1, e),
        Some(Ok(mut img)) => {
            let args = img.argv_ptr();
            // SAFETY: the image's path and arguments live until the call returns.
            return unsafe {
                with_handover(envp, |env| {
                    real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int)(
                        img.path.as_ptr(),
                        args,
                        env,
                    )
                })
            };
        }
    }
    // SAFETY: per the caller.
    unsafe {
        with_handover(envp, |env| {
            real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int)(
                path, argv, env,
            )
        })
    }
}

/// `execv(3)`.
///
/// # Safety
///
/// As `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { execve(path, argv, current_env()) }
}

/// `execvpe(3)`.
///
/// # Safety
///
/// As `execvpe(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if hooked() && !file.is_null() {
        // SAFETY: per the caller.
        let name = unsafe { CStr::from_ptr(file) };
        if name.to_bytes().contains(&b'/') {
            // No search: the C library would call the kernel's execve with the path, which
            // must be ours to see (a Moneta program, a program that cannot see Moneta). Only
            // its fallback for a script without `#!` (ENOEXEC: run by /bin/sh) is left to it.
            // SAFETY: per the caller.
            let r = unsafe { execve(file, argv, envp) };
            if super::errno() != libc::ENOEXEC {
                return r;
            }
        } else {
            // A search that reaches a directory under the prefix is ours to make.
            let found = super::inside(|| super::launch::search_path(name));
            if let Some(full) = found {
                // SAFETY: per the caller; `full` lives until the call returns.
                return unsafe { execve(full.as_ptr(), argv, envp) };
            }
            // SAFETY: per the caller.
            unsafe { super::launch::warn_searched(name, argv) };
        }
    }
    // SAFETY: per the caller.
    unsafe {
        with_handover(envp, |env| {
            real!(execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int)(
                file, argv, env,
            )
        })
    }
}

/// `execvp(3)`.
///
/// # Safety
///
/// As `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: per the caller.
    unsafe { execvpe(file, argv, current_env()) }
}

/// `fexecve(3)`.
///
/// # Safety
///
/// As `fexecve(3)`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: per the caller.
    unsafe {
        with_handover(envp, |env| {
            real!(fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int)(
                fd, argv, env,
            )
        })
    }
}

/// `execveat(2)`.
///
/// # Safety
///
/// As `execveat(2)`.
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: per the caller.
    unsafe {
        with_handover(envp, |env| {
            real!(execveat: fn(c_int, *const c_char, *const *const c_char, *const *const c_char, c_int) -> c_int)(
                dirfd, path, argv, env, flags,
            )
        })
    }
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

/// `posix_spawn` or, with `search`, `posix_spawnp` of a name without `/` (which the C
/// library looks up on `PATH`, never relative to the working directory).
#[allow(clippy::too_many_arguments)]
unsafe fn spawn(
    real: SpawnFn,
    search: bool,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if hooked() {
        super::kfs::before_exec();
        // A Moneta program runs from a copy (its memfd is inherited by the child, which
        // executes it by its /proc path).
        let prepared = if search {
            None
        } else {
            // SAFETY: per the caller.
            unsafe { super::launch::prepare(path, argv) }
        };
        let mut img = match prepared {
            None => None,
            Some(Err(e)) => return e,
            Some(Ok(img)) => Some(img),
        };
        let (path, argv) = match img.as_mut() {
            Some(i) => (i.path.as_ptr(), i.argv_ptr()),
            None => (path, argv),
        };
        // SAFETY: per the caller.
        if let Some(p) = unsafe { prepare(envp) } {
            // SAFETY: forwarding with the hand-over's environment.
            let r = unsafe { real(pid, path, actions, attr, argv, p.ptrs.as_ptr()) };
            // The child has its copies (or failed); the parent drops the hand-over either way.
            p.undo();
            return r;
        }
        // SAFETY: per the caller.
        if let Some((_env, ptrs)) = unsafe { child_env(envp, None) } {
            // SAFETY: forwarding with the working directory named.
            return unsafe { real(pid, path, actions, attr, argv, ptrs.as_ptr()) };
        }
        // SAFETY: forwarding (the image, if any, lives until here).
        let r = unsafe { real(pid, path, actions, attr, argv, envp) };
        drop(img);
        return r;
    }
    // SAFETY: forwarding.
    unsafe { real(pid, path, actions, attr, argv, envp) }
}

/// `posix_spawn(3)`.
///
/// # Safety
///
/// As `posix_spawn(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f: SpawnFn = real!(posix_spawn: fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *const c_char,
        *const *const c_char
    ) -> c_int);
    // SAFETY: per the caller.
    unsafe { spawn(f, false, pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp(3)`.
///
/// # Safety
///
/// As `posix_spawnp(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    if hooked() && !file.is_null() {
        // SAFETY: per the caller.
        let name = unsafe { CStr::from_ptr(file) };
        if name.to_bytes().contains(&b'/') {
            // No search: the path is used as given, as by posix_spawn.
            // SAFETY: per the caller.
            return unsafe { posix_spawn(pid, file, actions, attr, argv, envp) };
        }
        let found = super::inside(|| super::launch::search_path(name));
        if let Some(full) = found {
            // SAFETY: per the caller; `full` lives until the call returns.
            return unsafe { posix_spawn(pid, full.as_ptr(), actions, attr, argv, envp) };
        }
        // SAFETY: per the caller.
        unsafe { super::launch::warn_searched(name, argv) };
    }
    let f: SpawnFn = real!(posix_spawnp: fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *const c_char,
        *const *const c_char
    ) -> c_int);
    // SAFETY: per the caller.
    unsafe { spawn(f, true, pid, file, actions, attr, argv, envp) }
}

/// The previous image's hand-over and working directory, taken at load time (before
/// `main`).
extern "C" fn take_over() {
    super::hooks::learn_umask();
    if super::active() {
        paths::inherit_cwd();
    }
    // SAFETY: reading the environment at load time, before any thread exists.
    let v = unsafe { libc::getenv(c"MONETA_HANDOVER".as_ptr()) };
    if v.is_null() {
        return;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let fd: c_int = match unsafe { CStr::from_ptr(v) }
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(fd) => fd,
        None => return,
    };
    // SAFETY: removing our own variable at load time.
    unsafe { libc::unsetenv(c"MONETA_HANDOVER".as_ptr()) };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: reading the hand-over memfd into our buffer.
        let n = unsafe {
            libc::syscall(
                libc::SYS_pread64,
                fd,
                chunk.as_mut_ptr(),
                chunk.len(),
                buf.len(),
            )
        };
        if n <= 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n as usize]);
    }
    // SAFETY: the memfd is ours now.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    if !super::active() {
        return;
    }
    if let Err(e) = super::inside(|| adopt(&buf)) {
        log(
            ERROR,
            format_args!("the Moneta files of the previous program are lost: {e}"),
        );
    }
}

fn adopt(buf: &[u8]) -> Result<(), String> {
    let bad = || "malformed hand-over record".to_string();
    let mut r = R(buf);
    if r.u32().ok_or_else(bad)? != VERSION {
        return Err("hand-over record of another version".into());
    }
    let socket = r.bytes().ok_or_else(bad)?;
    let _prefix = r.bytes().ok_or_else(bad)?;
    let bundle = r.u64().ok_or_else(bad)?;
    let secret = [r.u64().ok_or_else(bad)?, r.u64().ok_or_else(bad)?];
    let pipe = r.i32().ok_or_else(bad)?;
    let socket = std::path::PathBuf::from(
        <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(socket),
    );
    let claimed = Moneta::adopt(&socket, bundle, secret);
    // SAFETY: the pipe's write end came with the record; the bundle is claimed or lost now.
    unsafe { libc::syscall(libc::SYS_close, pipe) };
    let (m, pairs) = claimed.map_err(|e| e.to_string())?;
    let n = r.u32().ok_or_else(bad)? as usize;
    let mut descs: Vec<Option<Arc<Desc>>> = Vec::with_capacity(n.min(65536));
    for _ in 0..n {
        let handle = r.u64().ok_or_else(bad)?;
        let ino = r.u64().ok_or_else(bad)?;
        let readable = r.u8().ok_or_else(bad)? != 0;
        let writable = r.u8().ok_or_else(bad)? != 0;
        let append = r.u8().ok_or_else(bad)? != 0;
        let is_dir = r.u8().ok_or_else(bad)? != 0;
        let flags = r.i32().ok_or_else(bad)?;
        let position = r.u64().ok_or_else(bad)?;
        let cfd = r.i32().ok_or_else(bad)?;
        let cidx = r.u32().ok_or_else(bad)?;
        let cookie = r.u64().ok_or_else(bad)?;
        let path = r.bytes().ok_or_else(bad)?;
        let st = FileState {
            handle,
            ino,
            readable,
            writable,
            append,
            is_dir,
            position_cell: (cfd >= 0).then_some((cfd, cidx)),
            position,
        };
        let d = match pairs.get(&handle) {
            Some(&new) => match File::adopt(&m, new, &st) {
                Ok(file) => Some(Arc::new(Desc {
                    file,
                    path,
                    flags: flags.into(),
                    is_dir,
                    dir_cookie: Mutex::new(cookie),
                    write_locked: false.into(),
                })),
                Err(e) => {
                    log(ERROR, format_args!("a Moneta file is lost: {e}"));
                    None
                }
            },
            None => None,
        };
        descs.push(d);
    }
    let nfd = r.u32().ok_or_else(bad)?;
    for _ in 0..nfd {
        let fd = r.i32().ok_or_else(bad)?;
        let i = r.u32().ok_or_else(bad)? as usize;
        if let Some(Some(d)) = descs.get(i) {
            if fds::fits(fd) {
                fds::set(fd, d.clone());
            }
        }
    }
    super::set_conn(m);
    for fd in 0..3 {
        super::hooks::std_after(fd);
    }
    Ok(())
}

/// Runs [`take_over`] when the library is loaded, before the program's `main`.
#[used]
#[link_section = ".init_array"]
static TAKE_OVER: extern "C" fn() = take_over;
