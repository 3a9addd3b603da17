//! Directory streams (`opendir`, `readdir`, ...) on Moneta directories.
//!
//! The C library's `DIR` reads its descriptor with `getdents64` inside the library, where no
//! hook can see it, so a Moneta directory gets a stream of the shim's own. Those streams live
//! in one region of memory reserved for them, so telling one of ours from the C library's is a
//! bounds check; every stream function passes the others through.

use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

use libmoneta::DirEntry;

use super::fds;
use super::hooks::{close, moneta_shim_openat};
use super::{eno, errno, hooked, real, set_errno};

/// Most Moneta directory streams open at once in a process.
const MAX_STREAMS: usize = 1024;

/// A directory stream of the shim's.
struct MDir {
    fd: c_int,
    batch: Vec<DirEntry>,
    idx: usize,
    /// Cookie of the next batch to fetch.
    cookie: u64,
    end: bool,
    /// What `readdir` returns points here.
    ent: libc::dirent64,
}

struct Arena {
    base: usize,
    free: Vec<usize>,
}

static ARENA: Mutex<Option<Arena>> = Mutex::new(None);
static BASE: AtomicPtr<MDir> = AtomicPtr::new(std::ptr::null_mut());

fn slot_size() -> usize {
    std::mem::size_of::<MDir>().next_multiple_of(64)
}

/// Whether `d` is one of the shim's streams.
fn ours(d: *mut c_void) -> Option<*mut MDir> {
    let base = BASE.load(Ordering::Acquire) as usize;
    let a = d as usize;
    if base == 0 || a < base || a >= base + MAX_STREAMS * slot_size() {
        return None;
    }
    (a - base).is_multiple_of(slot_size()).then_some(d.cast())
}

fn alloc(m: MDir) -> Result<*mut MDir, i32> {
    let mut g = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let len = MAX_STREAMS * slot_size();
        // SAFETY: a fresh anonymous mapping, never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        BASE.store(p.cast(), Ordering::Release);
        *g = Some(Arena {
            base: p as usize,
            free: (0..MAX_STREAMS).rev().collect(),
        });
    }
    let a = g.as_mut().expect("made above");
    let i = a.free.pop().ok_or(libc::EMFILE)?;
    let ptr = (a.base + i * slot_size()) as *mut MDir;
    // SAFETY: a free slot of the arena, aligned and large enough.
    unsafe { ptr.write(m) };
    Ok(ptr)
}

fn free(ptr: *mut MDir) {
    let mut g = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(a) = g.as_mut() {
        // SAFETY: a live stream, dropped once.
        unsafe { std::ptr::drop_in_place(ptr) };
        a.free.push((ptr as usize - a.base) / slot_size());
    }
}

fn new_stream(fd: c_int, cookie: u64) -> Result<*mut MDir, i32> {
    alloc(MDir {
        fd,
        batch: Vec::new(),
        idx: 0,
        cookie,
        end: false,
        // SAFETY: all-zero is a valid dirent64.
        ent: unsafe { std::mem::zeroed() },
    })
}

/// `opendir(3)`.
///
/// # Safety
///
/// As `opendir(3)`.
#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut c_void {
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
    if hooked() {
        if let super::paths::Where::Moneta(_) =
            // SAFETY: per the caller.
            unsafe { super::paths::classify(libc::AT_FDCWD, path) }
        {
            // SAFETY: per the caller; the open hook handles the Moneta path.
            let fd = unsafe {
                moneta_shim_openat(
                    libc::AT_FDCWD,
                    path,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            if fds::is_moneta(fd) {
                return match new_stream(fd, 0) {
                    Ok(p) => p.cast(),
                    Err(e) => {
                        close(fd);
                        set_errno(e);
                        std::ptr::null_mut()
                    }
                };
            }
            // The daemon was unreachable and the C library opened it: its own stream.
            // SAFETY: forwarding.
            return unsafe { real!(fdopendir: fn(c_int) -> *mut c_void)(fd) };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(opendir: fn(*const c_char) -> *mut c_void)(path) }
}

/// `fdopendir(3)`: the stream takes the descriptor over.
#[no_mangle]
pub extern "C" fn fdopendir(fd: c_int) -> *mut c_void {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            if !d.is_dir {
                set_errno(libc::ENOTDIR);
                return std::ptr::null_mut();
            }
            let cookie = *d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner());
            return match new_stream(fd, cookie) {
                Ok(p) => p.cast(),
                Err(e) => {
                    set_errno(e);
                    std::ptr::null_mut()
                }
            };
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(fdopendir: fn(c_int) -> *mut c_void)(fd) }
}

/// The next entry of one of our streams, or `None` at the end (or an error, in `errno`).
fn next(m: &mut MDir) -> Option<*mut libc::dirent64> {
    while m.idx >= m.batch.len() {
        if m.end {
            return None;
        }
        let d = fds::get(m.fd)?;
        let saved = errno();
        let r = super::inside(|| d.file.read_dir_from(m.cookie));
        match r {
            Ok((entries, end)) => {
                set_errno(saved);
                m.end = end || entries.is_empty();
                m.batch = entries;
                m.idx = 0;
            }
            Err(e) => {
                set_errno(eno(e));
                return None;
            }
        }
    }
    let e = &m.batch[m.idx];
    m.idx += 1;
    m.cookie = e.next;
    if let Some(d) = fds::get(m.fd) {
        *d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner()) = e.next;
    }
    let ent = &mut m.ent;
    ent.d_ino = e.ino;
    ent.d_off = e.next as i64;
    ent.d_type = e.kind;
    let n = e.name.len().min(255);
    for (dst, &src) in ent.d_name.iter_mut().zip(&e.name[..n]) {
        *dst = src as c_char;
    }
    ent.d_name[n] = 0;
    ent.d_reclen =
        (std::mem::offset_of!(libc::dirent64, d_name) + n + 1).next_multiple_of(8) as u16;
    Some(ent)
}

/// `readdir(3)` (on 64-bit Linux the same entry layout as `readdir64`).
///
/// # Safety
///
/// As `readdir(3)`.
#[no_mangle]
pub unsafe extern "C" fn readdir(dir: *mut c_void) -> *mut libc::dirent64 {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams; streams are not shared between threads by POSIX.
        return next(unsafe { &mut *m }).unwrap_or(std::ptr::null_mut());
    }
    // SAFETY: forwarding.
    unsafe { real!(readdir: fn(*mut c_void) -> *mut libc::dirent64)(dir) }
}

/// `readdir64(3)`.
///
/// # Safety
///
/// As `readdir(3)`.
#[no_mangle]
pub unsafe extern "C" fn readdir64(dir: *mut c_void) -> *mut libc::dirent64 {
    if let Some(m) = ours(dir) {
        // SAFETY: as in `readdir`.
        return next(unsafe { &mut *m }).unwrap_or(std::ptr::null_mut());
    }
    // SAFETY: forwarding.
    unsafe { real!(readdir64: fn(*mut c_void) -> *mut libc::dirent64)(dir) }
}

unsafe fn readdir_r_impl(
    m: *mut MDir,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    let saved = errno();
    set_errno(0);
    // SAFETY: one of our live streams.
    let r = next(unsafe { &mut *m });
    let e = errno();
    set_errno(saved);
    match r {
        Some(ent) => {
            // SAFETY: the caller passes room for a dirent.
            unsafe {
                std::ptr::copy_nonoverlapping(ent, entry, 1);
                *result = entry;
            }
            0
        }
        None => {
            // SAFETY: as above.
            unsafe { *result = std::ptr::null_mut() };
            e
        }
    }
}

/// `readdir_r(3)`.
///
/// # Safety
///
/// As `readdir_r(3)`.
#[no_mangle]
pub unsafe extern "C" fn readdir_r(
    dir: *mut c_void,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    if let Some(m) = ours(dir) {
        // SAFETY: per the caller.
        return unsafe { readdir_r_impl(m, entry, result) };
    }
    // SAFETY: forwarding.
    unsafe {
        real!(readdir_r: fn(*mut c_void, *mut libc::dirent64, *mut *mut libc::dirent64) -> c_int)(
            dir, entry, result,
        )
    }
}

/// `readdir64_r(3)`.
///
/// # Safety
///
/// As `readdir_r(3)`.
#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut c_void,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    if let Some(m) = ours(dir) {
        // SAFETY: per the caller.
        return unsafe { readdir_r_impl(m, entry, result) };
    }
    // SAFETY: forwarding.
    unsafe {
        real!(readdir64_r: fn(*mut c_void, *mut libc::dirent64, *mut *mut libc::dirent64) -> c_int)(
            dir, entry, result,
        )
    }
}

/// `closedir(3)`.
///
/// # Safety
///
/// As `closedir(3)`.
#[no_mangle]
pub unsafe extern "C" fn closedir(dir: *mut c_void) -> c_int {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams.
        let fd = unsafe { (*m).fd };
        free(m);
        return close(fd);
    }
    // SAFETY: forwarding.
    unsafe { real!(closedir: fn(*mut c_void) -> c_int)(dir) }
}

/// `rewinddir(3)`.
///
/// # Safety
///
/// As `rewinddir(3)`.
#[no_mangle]
pub unsafe extern "C" fn rewinddir(dir: *mut c_void) {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams.
        let m = unsafe { &mut *m };
        seek(m, 0);
        return;
    }
    // SAFETY: forwarding.
    unsafe { real!(rewinddir: fn(*mut c_void) -> ())(dir) }
}

fn seek(m: &mut MDir, cookie: u64) {
    m.batch.clear();
    m.idx = 0;
    m.cookie = cookie;
    m.end = false;
}

/// `seekdir(3)`: to a position `telldir` gave (a readdir cookie).
///
/// # Safety
///
/// As `seekdir(3)`.
#[no_mangle]
pub unsafe extern "C" fn seekdir(dir: *mut c_void, pos: c_long) {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams.
        seek(unsafe { &mut *m }, pos as u64);
        return;
    }
    // SAFETY: forwarding.
    unsafe { real!(seekdir: fn(*mut c_void, c_long) -> ())(dir, pos) }
}

/// `telldir(3)`.
///
/// # Safety
///
/// As `telldir(3)`.
#[no_mangle]
pub unsafe extern "C" fn telldir(dir: *mut c_void) -> c_long {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams.
        let m = unsafe { &*m };
        return m.cookie as c_long;
    }
    // SAFETY: forwarding.
    unsafe { real!(telldir: fn(*mut c_void) -> c_long)(dir) }
}

/// `dirfd(3)`.
///
/// # Safety
///
/// As `dirfd(3)`.
#[no_mangle]
pub unsafe extern "C" fn dirfd(dir: *mut c_void) -> c_int {
    if let Some(m) = ours(dir) {
        // SAFETY: one of our live streams.
        return unsafe { (*m).fd };
    }
    // SAFETY: forwarding.
    unsafe { real!(dirfd: fn(*mut c_void) -> c_int)(dir) }
}

type Filter = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
type Compar =
    Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>;

/// `scandir(3)` of a Moneta directory (the C library's opens the directory internally, out of
/// the hooks' reach).
///
/// # Safety
///
/// As `scandir(3)`.
#[no_mangle]
pub unsafe extern "C" fn scandir(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> c_int {
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
    if hooked() {
        if let super::paths::Where::Moneta(_) =
            // SAFETY: per the caller.
            unsafe { super::paths::classify(libc::AT_FDCWD, path) }
        {
            // SAFETY: per the caller.
            return unsafe { scan(path, list, filter, compar) };
        }
    }
    // SAFETY: forwarding.
    unsafe {
        real!(scandir: fn(*const c_char, *mut *mut *mut libc::dirent64, Filter, Compar) -> c_int)(
            path, list, filter, compar,
        )
    }
}

/// `scandir64(3)`.
///
/// # Safety
///
/// As `scandir(3)`.
#[no_mangle]
pub unsafe extern "C" fn scandir64(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> c_int {
    // SAFETY: per the caller.
    unsafe { scandir(path, list, filter, compar) }
}

unsafe fn scan(
    path: *const c_char,
    list: *mut *mut *mut libc::dirent64,
    filter: Filter,
    compar: Compar,
) -> c_int {
    // SAFETY: per the caller.
    let d = unsafe { opendir(path) };
    if d.is_null() {
        return -1;
    }
    let mut out: Vec<*mut libc::dirent64> = Vec::new();
    loop {
        // SAFETY: our stream.
        let e = unsafe { readdir(d) };
        if e.is_null() {
            break;
        }
        if let Some(f) = filter {
            // SAFETY: the caller's filter takes an entry.
            if unsafe { f(e) } == 0 {
                continue;
            }
        }
        // SAFETY: a copy the caller frees with free(3).
        let copy =
            unsafe { libc::malloc(std::mem::size_of::<libc::dirent64>()) } as *mut libc::dirent64;
        if copy.is_null() {
            for p in out {
                // SAFETY: our allocations.
                unsafe { libc::free(p.cast()) };
            }
            // SAFETY: our stream.
            unsafe { closedir(d) };
            set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: both valid dirents.
        unsafe { std::ptr::copy_nonoverlapping(e, copy, 1) };
        out.push(copy);
    }
    // SAFETY: our stream.
    unsafe { closedir(d) };
    let n = out.len();
    // SAFETY: an array the caller frees with free(3).
    let arr = unsafe { libc::malloc(n.max(1) * std::mem::size_of::<*mut libc::dirent64>()) }
        as *mut *mut libc::dirent64;
    if arr.is_null() {
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: room for `n` pointers.
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), arr, n) };
    if let Some(c) = compar {
        // SAFETY: the caller's comparison takes two entry pointers, as qsort passes them.
        unsafe {
            libc::qsort(
                arr.cast(),
                n,
                std::mem::size_of::<*mut libc::dirent64>(),
                Some(std::mem::transmute::<
                    unsafe extern "C" fn(
                        *mut *const libc::dirent64,
                        *mut *const libc::dirent64,
                    ) -> c_int,
                    unsafe extern "C" fn(*const c_void, *const c_void) -> c_int,
                >(c)),
            )
        };
    }
    // SAFETY: the caller passes a writable pointer.
    unsafe { *list = arr };
    n as c_int
}

/// `getdents64(2)` on a Moneta directory descriptor.
///
/// # Safety
///
/// As `getdents64(2)`.
#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    if hooked() {
        if let Some(d) = fds::get(fd) {
            if !d.is_dir {
                set_errno(libc::ENOTDIR);
                return -1;
            }
            let saved = errno();
            let mut cookie = d.dir_cookie.lock().unwrap_or_else(|e| e.into_inner());
            let r = super::inside(|| d.file.read_dir_from(*cookie));
            let entries = match r {
                Ok((e, _)) => e,
                Err(e) => {
                    set_errno(eno(e));
                    return -1;
                }
            };
            let base = std::mem::offset_of!(libc::dirent64, d_name);
            let mut at = 0usize;
            for e in entries {
                let reclen = (base + e.name.len() + 1).next_multiple_of(8);
                if at + reclen > n {
                    if at == 0 {
                        set_errno(libc::EINVAL);
                        return -1;
                    }
                    break;
                }
                // SAFETY: `reclen` bytes at `at` are inside the caller's buffer.
                unsafe {
                    let p = (buf as *mut u8).add(at);
                    std::ptr::write_bytes(p, 0, reclen);
                    let ent = p.cast::<libc::dirent64>();
                    std::ptr::addr_of_mut!((*ent).d_ino).write_unaligned(e.ino);
                    std::ptr::addr_of_mut!((*ent).d_off).write_unaligned(e.next as i64);
                    std::ptr::addr_of_mut!((*ent).d_reclen).write_unaligned(reclen as u16);
                    std::ptr::addr_of_mut!((*ent).d_type).write_unaligned(e.kind);
                    std::ptr::copy_nonoverlapping(e.name.as_ptr(), p.add(base), e.name.len());
                }
                at += reclen;
                *cookie = e.next;
            }
            set_errno(saved);
            return at as isize;
        }
    }
    // SAFETY: forwarding.
    unsafe { real!(getdents64: fn(c_int, *mut c_void, usize) -> isize)(fd, buf, n) }
}
