//! The parts of libnbd (the NBD client library of the libguestfs project) a link to another
//! member uses, loaded at run time: a daemon without members never needs the library, and one
//! with members says clearly when it is missing (Debian: `libnbd0`).
//!
//! Only the asynchronous calls are used: the device's poller issues every forwarded request at
//! once and moves the connection's bytes when its socket is ready, never waiting on it, so
//! several requests are in flight on one connection.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;

use rustix::event::{PollFd, PollFlags};

/// libnbd's `nbd_completion_callback`; a null callback asks for none (completions are
/// collected with `nbd_aio_peek_command_completed`).
#[repr(C)]
struct Completion {
    callback: *const c_void,
    user_data: *mut c_void,
    free: *const c_void,
}

const NO_CALLBACK: Completion = Completion {
    callback: std::ptr::null(),
    user_data: std::ptr::null_mut(),
    free: std::ptr::null(),
};

/// libnbd's `LIBNBD_AIO_DIRECTION_READ`: it waits for the socket to be readable.
const DIRECTION_READ: c_uint = 1;
/// libnbd's `LIBNBD_AIO_DIRECTION_WRITE`: it waits for the socket to be writable.
const DIRECTION_WRITE: c_uint = 2;

type Handle = *mut c_void;

/// Declares the library's entry points (field, symbol, C signature from libnbd.h) and the
/// function that looks them up in a loaded library.
macro_rules! entry_points {
    ($($field:ident = $sym:literal : $ty:ty;)*) => {
        /// The library's entry points.
        struct Lib {
            $($field: $ty,)*
        }

        /// Looks every entry point up in the library `h`.
        fn symbols(h: *mut c_void) -> Result<Lib, String> {
            Ok(Lib {
                $($field: {
                    // SAFETY: looking up a symbol of a loaded library by a NUL-terminated name.
                    let p = unsafe { libc::dlsym(h, concat!($sym, "\0").as_ptr().cast()) };
                    if p.is_null() {
                        return Err(format!(
                            "libnbd.so.0 lacks {} (libnbd 1.2 or later is needed)",
                            $sym
                        ));
                    }
                    // SAFETY: the symbol is the libnbd function of that name, whose C
                    // signature the field's type spells out.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                },)*
            })
        }
    };
}

entry_points! {
    create = "nbd_create": unsafe extern "C" fn() -> Handle;
    close = "nbd_close": unsafe extern "C" fn(Handle);
    get_error = "nbd_get_error": unsafe extern "C" fn() -> *const c_char;
    get_errno = "nbd_get_errno": unsafe extern "C" fn() -> c_int;
    set_uri_allow_local_file = "nbd_set_uri_allow_local_file": unsafe extern "C" fn(Handle, bool) -> c_int;
    aio_connect_uri = "nbd_aio_connect_uri": unsafe extern "C" fn(Handle, *const c_char) -> c_int;
    aio_is_ready = "nbd_aio_is_ready": unsafe extern "C" fn(Handle) -> c_int;
    get_size = "nbd_get_size": unsafe extern "C" fn(Handle) -> i64;
    is_read_only = "nbd_is_read_only": unsafe extern "C" fn(Handle) -> c_int;
    aio_pread = "nbd_aio_pread": unsafe extern "C" fn(Handle, *mut c_void, usize, u64, Completion, u32) -> i64;
    aio_pwrite = "nbd_aio_pwrite": unsafe extern "C" fn(Handle, *const c_void, usize, u64, Completion, u32) -> i64;
    aio_flush = "nbd_aio_flush": unsafe extern "C" fn(Handle, Completion, u32) -> i64;
    aio_cache = "nbd_aio_cache": unsafe extern "C" fn(Handle, u64, u64, Completion, u32) -> i64;
    can_cache = "nbd_can_cache": unsafe extern "C" fn(Handle) -> c_int;
    aio_get_fd = "nbd_aio_get_fd": unsafe extern "C" fn(Handle) -> c_int;
    aio_get_direction = "nbd_aio_get_direction": unsafe extern "C" fn(Handle) -> c_uint;
    aio_notify_read = "nbd_aio_notify_read": unsafe extern "C" fn(Handle) -> c_int;
    aio_notify_write = "nbd_aio_notify_write": unsafe extern "C" fn(Handle) -> c_int;
    aio_peek_command_completed = "nbd_aio_peek_command_completed": unsafe extern "C" fn(Handle) -> i64;
    aio_command_completed = "nbd_aio_command_completed": unsafe extern "C" fn(Handle, u64) -> c_int;
    aio_is_dead = "nbd_aio_is_dead": unsafe extern "C" fn(Handle) -> c_int;
    aio_is_closed = "nbd_aio_is_closed": unsafe extern "C" fn(Handle) -> c_int;
}

// SAFETY: function pointers into a library that stays loaded for the life of the process;
// libnbd's calls are safe from any thread.
unsafe impl Send for Lib {}
// SAFETY: as above; the struct is never written after it is made.
unsafe impl Sync for Lib {}

fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Lib, String> {
    let name = c"libnbd.so.0";
    // SAFETY: dlopen of a library by name; the handle is never closed.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(
            "a link to another member needs libnbd (libnbd.so.0; Debian: apt install \
                    libnbd0), which cannot be loaded"
                .into(),
        );
    }
    symbols(h)
}

/// Whether libnbd can be loaded (with the reason when not).
pub fn available() -> Result<(), String> {
    lib().map(|_| ())
}

/// One connection to an NBD server.
pub struct Conn {
    lib: &'static Lib,
    h: Handle,
}

// SAFETY: a libnbd handle may be used from any thread (libnbd locks it); this one is used by
// one thread at a time.
unsafe impl Send for Conn {}

impl Conn {
    /// Starts connecting to `uri` (`nbd://`, `nbds://`, `nbd+unix://`, ...; a `tls-psk-file`
    /// in the URI is allowed). The connection and the handshake go on as [`Conn::notify`] is
    /// called; [`Conn::ready`] says when they are done, [`Conn::broken`] when they failed.
    pub fn start(uri: &str) -> Result<Conn, String> {
        let lib = lib()?;
        let c_uri = CString::new(uri).map_err(|_| "the URI holds a NUL byte".to_string())?;
        // SAFETY: nbd_create returns a new handle or null.
        let h = unsafe { (lib.create)() };
        if h.is_null() {
            return Err(last_error(lib));
        }
        let conn = Conn { lib, h };
        // SAFETY: `h` is a live handle; `c_uri` outlives the call (libnbd copies the URI).
        unsafe {
            (lib.set_uri_allow_local_file)(h, true);
            if (lib.aio_connect_uri)(h, c_uri.as_ptr()) == -1 {
                return Err(last_error(lib));
            }
        }
        Ok(conn)
    }

    /// Whether the connection is made and the handshake done: requests may be issued.
    pub fn ready(&self) -> bool {
        // SAFETY: live handle.
        unsafe { (self.lib.aio_is_ready)(self.h) == 1 }
    }

    /// The export's size in bytes.
    pub fn size(&self) -> Result<u64, String> {
        // SAFETY: live handle.
        let s = unsafe { (self.lib.get_size)(self.h) };
        if s < 0 {
            Err(last_error(self.lib))
        } else {
            Ok(s as u64)
        }
    }

    /// Whether the server refuses writes.
    pub fn read_only(&self) -> bool {
        // SAFETY: live handle.
        unsafe { (self.lib.is_read_only)(self.h) == 1 }
    }

    /// Starts a read of `len` bytes at `offset` into `buf`; its cookie.
    ///
    /// # Safety
    /// `buf` must stay valid for writes of `len` bytes until the command completes or the
    /// connection is closed.
    pub unsafe fn read(&self, buf: *mut u8, len: usize, offset: u64) -> Result<u64, String> {
        // SAFETY: live handle; the caller keeps `buf` valid.
        self.cookie(unsafe {
            (self.lib.aio_pread)(self.h, buf.cast(), len, offset, NO_CALLBACK, 0)
        })
    }

    /// Starts a write of `len` bytes at `offset` from `buf`; its cookie.
    ///
    /// # Safety
    /// `buf` must stay valid for reads of `len` bytes until the command completes or the
    /// connection is closed.
    pub unsafe fn write(&self, buf: *const u8, len: usize, offset: u64) -> Result<u64, String> {
        // SAFETY: live handle; the caller keeps `buf` valid.
        self.cookie(unsafe {
            (self.lib.aio_pwrite)(self.h, buf.cast(), len, offset, NO_CALLBACK, 0)
        })
    }

    /// Starts a flush; its cookie.
    pub fn flush(&self) -> Result<u64, String> {
        // SAFETY: live handle; no buffer.
        self.cookie(unsafe { (self.lib.aio_flush)(self.h, NO_CALLBACK, 0) })
    }

    /// Whether the server takes `NBD_CMD_CACHE` (a hint that a range will be read).
    pub fn can_cache(&self) -> bool {
        // SAFETY: live handle.
        unsafe { (self.lib.can_cache)(self.h) == 1 }
    }

    /// Starts an `NBD_CMD_CACHE` of `len` bytes at `offset`; its cookie.
    pub fn cache(&self, len: u64, offset: u64) -> Result<u64, String> {
        // SAFETY: live handle; no buffer.
        self.cookie(unsafe { (self.lib.aio_cache)(self.h, len, offset, NO_CALLBACK, 0) })
    }

    fn cookie(&self, c: i64) -> Result<u64, String> {
        if c < 0 {
            Err(last_error(self.lib))
        } else {
            Ok(c as u64)
        }
    }

    /// The connection's socket and what to wait for on it (`poll`'s events): readable, writable
    /// or both, as libnbd waits. `None` while it has no socket.
    pub fn waits_on(&self) -> Option<(BorrowedFd<'_>, PollFlags)> {
        // SAFETY: live handle.
        let (fd, dir) = unsafe {
            (
                (self.lib.aio_get_fd)(self.h),
                (self.lib.aio_get_direction)(self.h),
            )
        };
        if fd < 0 {
            return None;
        }
        let mut flags = PollFlags::empty();
        if dir & DIRECTION_READ != 0 {
            flags |= PollFlags::IN;
        }
        if dir & DIRECTION_WRITE != 0 {
            flags |= PollFlags::OUT;
        }
        // SAFETY: the socket stays open while the handle lives, which the borrow of `self`
        // holds.
        Some((unsafe { BorrowedFd::borrow_raw(fd) }, flags))
    }

    /// Tells libnbd what `poll` found on the socket (`revents`): readable (or hung up, or in
    /// error), else writable. One at a time: the first may change what the connection waits
    /// for, and the other, if it still holds, is seen at the next look.
    pub fn notify(&self, revents: PollFlags) {
        // SAFETY: live handle.
        unsafe {
            if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
                (self.lib.aio_notify_read)(self.h);
            } else if revents.contains(PollFlags::OUT) {
                (self.lib.aio_notify_write)(self.h);
            }
        }
    }

    /// The next completed command: its cookie and whether it succeeded (`Err` with the reason
    /// and the errno the server answered).
    pub fn next_completed(&self) -> Option<(u64, Result<(), Failed>)> {
        // SAFETY: live handle.
        let c = unsafe { (self.lib.aio_peek_command_completed)(self.h) };
        if c <= 0 {
            return None;
        }
        // SAFETY: live handle; `c` is a cookie libnbd just named.
        let r = unsafe { (self.lib.aio_command_completed)(self.h, c as u64) };
        Some((
            c as u64,
            if r == 1 {
                Ok(())
            } else {
                // SAFETY: thread-local, set by the call just made.
                Err((last_error(self.lib), unsafe { (self.lib.get_errno)() }))
            },
        ))
    }

    /// The last error libnbd reported on this thread (what made the connection fail).
    pub fn error(&self) -> String {
        last_error(self.lib)
    }

    /// Drives the connection until it is ready, or until command `cookie` (when given) has
    /// completed: `Ok` when it succeeded. For callers that wait for one thing at a time (a
    /// measurement, a tool); the device's links never block.
    pub fn wait(&self, cookie: Option<u64>) -> Result<(), String> {
        loop {
            if let Some(c) = cookie {
                // SAFETY: live handle; `c` is a cookie of this handle.
                match unsafe { (self.lib.aio_command_completed)(self.h, c) } {
                    1 => return Ok(()),
                    -1 => return Err(last_error(self.lib)),
                    _ => {}
                }
            } else if self.ready() {
                return Ok(());
            }
            if self.broken() {
                return Err(last_error(self.lib));
            }
            let (sock, flags) = self
                .waits_on()
                .ok_or_else(|| "the connection has no socket".to_string())?;
            let mut fds = [PollFd::from_borrowed_fd(sock, flags)];
            rustix::event::poll(&mut fds, None).map_err(|e| e.to_string())?;
            let r = fds[0].revents();
            self.notify(r);
        }
    }

    /// Whether the connection has failed or closed.
    pub fn broken(&self) -> bool {
        // SAFETY: live handle.
        unsafe { (self.lib.aio_is_dead)(self.h) == 1 || (self.lib.aio_is_closed)(self.h) == 1 }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once; nbd_close closes the socket.
        unsafe { (self.lib.close)(self.h) }
    }
}

/// Why a command failed: libnbd's message and the errno the server answered.
pub type Failed = (String, i32);

fn last_error(lib: &Lib) -> String {
    // SAFETY: nbd_get_error returns a thread-local string or null.
    let p = unsafe { (lib.get_error)() };
    if p.is_null() {
        "unknown libnbd error".into()
    } else {
        // SAFETY: a NUL-terminated string owned by libnbd, copied at once.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
