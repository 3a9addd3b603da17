//! The `LD_PRELOAD` shim (Moneta-D §2.2): unmodified programs open, read and write files under
//! a mount prefix (default `/moneta`, `MONETA_MOUNT`) through libmoneta, without a system call
//! on the data path; every other file goes to the C library untouched.
//!
//! The library exports the C library's file functions under their own names; the dynamic
//! linker binds a preloaded program's calls to them. Each one first asks whether the call is
//! about a Moneta file (a path under the prefix, or a descriptor in the table of
//! [`fds`]) and otherwise calls the C library's own function, found with
//! `dlsym(RTLD_NEXT)`. The shim is active when the library was preloaded (`LD_PRELOAD`
//! names it) or `MONETA_SHIM=1`; `MONETA_SHIM=0` turns it off. A program that merely links
//! `-lmoneta` for the C interface gets the C library's behavior.
//!
//! Settings (environment): `MONETA_MOUNT` (prefix), `MONETA_SOCKET` (daemon), `MONETA_COMPLETION`
//! (completion policy), `MONETA_LOG` (`error`, `warn`, `info`, `debug`: messages on standard
//! error), `MONETA_REPORT=1` (a summary at exit), `MONETA_AFFINITY` (`any` leaves the threads
//! on the CPU of a pinned poller, see [`libmoneta::affinity`]).

pub mod dir;
pub mod exec;
pub mod fds;
pub mod hooks;
pub mod kfs;
mod launch;
pub mod locks;
pub mod paths;
pub mod stdio;

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use libmoneta::{ClientError, Moneta};

/// Looks up (once) and returns the C library's own `name`, typed as `fn($args) -> $ret`.
macro_rules! real {
    ($name:ident : fn($($a:ty),*) -> $r:ty) => {{
        static P: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let p = crate::shim::lookup(&P, concat!(stringify!($name), "\0"));
        crate::shim::as_fn::<unsafe extern "C" fn($($a),*) -> $r>(p)
    }};
}
pub(crate) use real;

/// The address of the C library's `name` (NUL-terminated), cached in `cache`.
pub(crate) fn lookup(cache: &std::sync::atomic::AtomicUsize, name: &'static str) -> usize {
    let mut p = cache.load(Ordering::Relaxed);
    if p == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the next definition after
        // this library: the C library's.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
        if p == 0 {
            die(&format!(
                "the C library has no {}",
                name.trim_end_matches('\0')
            ));
        }
        cache.store(p, Ordering::Relaxed);
    }
    p
}

/// `p` as the function pointer type `F`: only for addresses [`lookup`] found under the name
/// whose C signature `F` spells (the `real!` macro pairs them).
pub(crate) fn as_fn<F: Copy>(p: usize) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: `F` is a function pointer type of the symbol's C signature (see above).
    unsafe { std::mem::transmute_copy::<usize, F>(&p) }
}

/// Ends the process with a message: the C library lacks something the shim cannot do
/// without.
pub(crate) fn die(what: &str) -> ! {
    let msg = format!("libmoneta: {what}\n");
    // SAFETY: a plain write of a buffer we own to standard error.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
    std::process::abort()
}

/// The shim's settings, read once.
pub(crate) struct Config {
    /// Absolute, normalized, without a trailing slash (empty: the shim is off).
    pub prefix: Vec<u8>,
    pub socket: std::path::PathBuf,
    pub log: u8,
}

/// Log levels.
pub(crate) const ERROR: u8 = 1;
pub(crate) const WARN: u8 = 2;
pub(crate) const INFO: u8 = 3;
pub(crate) const DEBUG: u8 = 4;

const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(0);
static CONFIG: OnceLock<Config> = OnceLock::new();

thread_local! {
    /// Set while the shim runs its own code on this thread: a C library call made from
    /// inside goes straight to the C library (no recursion into the hooks).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn env(name: &CStr) -> Option<Vec<u8>> {
    // SAFETY: getenv with a NUL-terminated name; the result is copied at once.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: getenv returns a NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
    }
}

fn decide() -> bool {
    match env(c"MONETA_SHIM").as_deref() {
        Some(b"0") => return false,
        Some(b"1") => return true,
        _ => {}
    }
    env(c"LD_PRELOAD").is_some_and(|v| {
        v.split(|&b| b == b':' || b == b' ')
            .any(|p| p.rsplit(|&b| b == b'/').next() == Some(b"libmoneta.so"))
    })
}

/// Whether the shim handles anything in this process (cheap after the first call).
#[inline]
pub(crate) fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = decide();
            STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
    }
}

/// The settings (only called when active).
pub(crate) fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let prefix = env(c"MONETA_MOUNT")
            .map(|p| paths::normalize(&p))
            .unwrap_or_else(|| b"/moneta".to_vec());
        let prefix = if prefix == b"/" || prefix.is_empty() {
            Vec::new()
        } else {
            prefix
        };
        let socket = match env(c"MONETA_SOCKET") {
            Some(s) => std::path::PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(s),
            ),
            None => libmoneta::paths::default_socket(),
        };
        let log = match env(c"MONETA_LOG").as_deref() {
            Some(b"error") => ERROR,
            Some(b"info") => INFO,
            Some(b"debug") => DEBUG,
            Some(b"off") | Some(b"none") => 0,
            _ => WARN,
        };
        let report = env(c"MONETA_REPORT").as_deref() == Some(b"1");
        if report {
            // SAFETY: registers a plain function to run at exit.
            unsafe { libc::atexit(report_at_exit) };
        }
        Config {
            prefix,
            socket,
            log,
        }
    })
}

/// Writes a message on standard error if the log level allows it.
pub(crate) fn log(level: u8, msg: std::fmt::Arguments<'_>) {
    if config().log >= level {
        let text = format!("libmoneta[{}]: {msg}\n", std::process::id());
        // SAFETY: a plain write of a buffer we own.
        unsafe { libc::syscall(libc::SYS_write, 2, text.as_ptr(), text.len()) };
    }
}

/// Runs `f` with the recursion guard set.
#[inline]
pub(crate) fn inside<R>(f: impl FnOnce() -> R) -> R {
    let was = INSIDE.with(|i| i.replace(true));
    let r = f();
    INSIDE.with(|i| i.set(was));
    r
}

/// Whether the hooks should look at this call at all: the shim is on and this is not the
/// shim's own code calling the C library.
#[inline]
pub(crate) fn hooked() -> bool {
    active() && !INSIDE.try_with(|i| i.get()).unwrap_or(true)
}

/// Counters for `MONETA_REPORT`.
pub(crate) struct Counters {
    pub intercepted: AtomicU64,
    pub direct_ios: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub opens: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    intercepted: AtomicU64::new(0),
    direct_ios: AtomicU64::new(0),
    bytes_read: AtomicU64::new(0),
    bytes_written: AtomicU64::new(0),
    opens: AtomicU64::new(0),
};

#[inline]
pub(crate) fn count(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

extern "C" fn report_at_exit() {
    let c = &COUNTERS;
    let (soft, hard, extends, device) = match CONN.get() {
        Some(m) => {
            let s = m.stats();
            let device = match s.device_cpu {
                Some(cpu) => format!(
                    "; the device has CPU {cpu}: {} threads moved off it",
                    s.threads_moved
                ),
                None => String::new(),
            };
            (s.soft_misses, s.hard_misses, s.extends, device)
        }
        _ => (0, 0, 0, String::new()),
    };
    let calls: Vec<String> = libmoneta::calls_made()
        .iter()
        .map(|(n, c)| format!("{n} {c}"))
        .collect();
    let calls = if calls.is_empty() {
        String::new()
    } else {
        format!(
            "; file-system calls: {} ({} of the stats answered by what was kept, {} of the \
             closes posted without waiting); {} lock calls answered in leases; {} writes past \
             the end in a size lease; {} writes posted under a sole lease",
            calls.join(", "),
            libmoneta::stats_kept(),
            libmoneta::closes_posted(),
            libmoneta::locks_leased(),
            libmoneta::sizes_leased(),
            libmoneta::writes_posted()
        )
    };
    let text = format!(
        "libmoneta report (pid {}): {} calls intercepted, {} opens, {} direct I/Os, {} bytes read, \
         {} bytes written, {} soft misses, {} hard misses, {} extends{device}{calls}\n",
        std::process::id(),
        c.intercepted.load(Ordering::Relaxed),
        c.opens.load(Ordering::Relaxed),
        c.direct_ios.load(Ordering::Relaxed),
        c.bytes_read.load(Ordering::Relaxed),
        c.bytes_written.load(Ordering::Relaxed),
        soft,
        hard,
        extends,
    );
    // SAFETY: a plain write of a buffer we own.
    unsafe { libc::syscall(libc::SYS_write, 2, text.as_ptr(), text.len()) };
}

static CONN: OnceLock<Moneta> = OnceLock::new();

/// The process's connection, if made already.
pub(crate) fn connected() -> Option<&'static Moneta> {
    CONN.get()
}

/// The process's connection, made on first use. `None` when the daemon cannot be reached (or
/// is not one this process trusts): the caller fails the call with `EIO`, and the first time
/// a message says why. A Moneta path never falls through to the host's file of the same
/// name. Later calls try again, so a daemon started afterwards is found; once connected,
/// libmoneta reconnects by itself after a restart of the daemon.
pub(crate) fn conn() -> Option<&'static Moneta> {
    if let Some(m) = CONN.get() {
        return Some(m);
    }
    match inside(|| Moneta::connect(&config().socket)) {
        Ok(m) => {
            // Another thread may have connected first: keep that one.
            let _ = CONN.set(m);
            CONN.get()
        }
        Err(e) => {
            static TOLD: std::sync::Once = std::sync::Once::new();
            TOLD.call_once(|| {
                let e = e.to_string();
                // Not twice: the error may already say how to start one.
                let start = if e.contains("moneta start") {
                    ""
                } else {
                    " (start one with `moneta start`)"
                };
                log(
                    ERROR,
                    format_args!(
                        "{e}; calls on paths under {} fail with EIO (Input/output error) until \
                         a daemon answers{start}",
                        String::from_utf8_lossy(&config().prefix)
                    ),
                )
            });
            None
        }
    }
}

/// What a hook does with a path.
pub(crate) enum Route {
    /// A Moneta file: the connection and the nvfs path.
    Moneta(&'static Moneta, Vec<u8>),
    /// The C library's, with the caller's path (`None`) or this one instead.
    Host(Option<std::ffi::CString>),
    /// A Moneta path that cannot be served: fail with this errno.
    Fail(i32),
}

/// Routes `path` (relative to `dirfd`): Moneta's, the C library's, or a failure when the
/// daemon cannot be reached.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string.
pub(crate) unsafe fn route(dirfd: libc::c_int, path: *const libc::c_char) -> Route {
    // SAFETY: per the caller.
    match unsafe { paths::classify(dirfd, path) } {
        paths::Where::Moneta(np) => match conn() {
            // ext4 or XFS: a real path of a real mount.
            Some(m) if kfs::serves(m) => Route::Host(None),
            Some(m) => Route::Moneta(m, np),
            None => Route::Fail(libc::EIO),
        },
        paths::Where::Libc => Route::Host(None),
        paths::Where::Host(c) => Route::Host(Some(c)),
    }
}

/// Fails a hooked call with `e`.
#[inline]
pub(crate) fn fail<T>(failed: T, e: i32) -> T {
    count(&COUNTERS.intercepted, 1);
    set_errno(e);
    failed
}

/// Installs the connection the previous program image handed over (see [`exec`]).
pub(crate) fn set_conn(m: Moneta) {
    let _ = CONN.set(m);
}

/// Sets `errno`.
#[inline]
pub(crate) fn set_errno(e: i32) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
#[inline]
pub(crate) fn errno() -> i32 {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The errno a failed libmoneta call means. A call that finds no daemon to connect to (its
/// daemon died, and none answers yet) fails with `EIO`, as every call on a Moneta path does
/// while no daemon answers (docs/shim.md), where the library says `ENOTCONN`.
#[inline]
pub(crate) fn eno(e: ClientError) -> i32 {
    match e {
        ClientError::NotRunning { .. } => libc::EIO,
        e => e.errno(),
    }
}

/// [`run`] for a call on a kernel file served through the channel, which answers `None` when
/// the file went back to the kernel meanwhile (the caller then makes the C library's call).
#[inline]
pub(crate) fn run_kfs<T>(failed: T, f: impl FnOnce() -> Option<Result<T, i32>>) -> Option<T> {
    let saved = errno();
    let r = inside(f)?;
    count(&COUNTERS.intercepted, 1);
    Some(match r {
        Ok(v) => {
            set_errno(saved);
            v
        }
        Err(e) => {
            set_errno(e);
            failed
        }
    })
}

/// Runs a Moneta call with the recursion guard: on success `errno` stays what it was; on
/// failure it is set and `failed` returned.
#[inline]
pub(crate) fn run<T>(failed: T, f: impl FnOnce() -> Result<T, i32>) -> T {
    count(&COUNTERS.intercepted, 1);
    let saved = errno();
    match inside(f) {
        Ok(v) => {
            set_errno(saved);
            v
        }
        Err(e) => {
            set_errno(e);
            failed
        }
    }
}
