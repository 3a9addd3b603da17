//! Mappings: `mmap` of a Moneta file maps its own pages (memory drives), and `madvise` with
//! `MADV_WILLNEED` over such a mapping becomes a hint to the device; `munmap` forgets what
//! it unmaps.

use super::*;

/// Says once, on standard error, why a Moneta file cannot be mapped shared and what to do:
/// the program itself usually reports only an I/O error (SQLite: "disk I/O error").
fn refuse_map(path: &[u8]) {
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        let sqlite = if path.ends_with(b"-shm") {
            " SQLite in WAL mode maps its -shm file: keep databases under the prefix in \
             another journal mode; one already in WAL mode opens with \
             `PRAGMA locking_mode=EXCLUSIVE;` (which needs no map), and \
             `PRAGMA journal_mode=DELETE;` then turns it back"
        } else {
            ""
        };
        log(
            crate::shim::ERROR,
            format_args!(
                "mmap of {} refused (ENODEV): this array hands out no files' pages \
                 (it keeps data checksums, which stores through a mapping would bypass), so \
                 its files cannot be mapped shared (MAP_SHARED); private mappings \
                 (MAP_PRIVATE) are copies.{sqlite}",
                String::from_utf8_lossy(&crate::shim::paths::outer(path))
            ),
        )
    });
}

/// Private mappings up to this length are copies ([`map_private_copy`]); longer ones map the
/// file's own pages, copy-on-write.
const PRIVATE_COPY_MAX: size_t = 1 << 20;

/// A private mapping of a Moneta file: anonymous memory holding a copy of the file's bytes
/// from `off` (zeros past the end), with the protection asked for. `MAP_PRIVATE` promises
/// no more: the process's own stores stay its own, and POSIX leaves unspecified whether
/// later changes of the file show through, so readers that map (git, `ld.so`, `grep`) work.
/// The caller has made [`map_checks`].
fn map_private_copy(
    d: &Desc,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<*mut c_void, i32> {
    // The flags that describe the mapping's place and backing carry over; the file does not.
    let keep = libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_NORESERVE
        | libc::MAP_POPULATE
        | libc::MAP_LOCKED;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | (flags & keep);
    // SAFETY: an anonymous mapping where the caller asked for the file's.
    let p = unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            anon,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::shim::errno());
    }
    let undo = |e: i32| {
        // SAFETY: unmapping what was just mapped.
        unsafe { libc::munmap(p, len) };
        Err(e)
    };
    // SAFETY: `len` bytes just mapped readable and writable, seen by nothing else yet.
    let buf = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let mut at = 0usize;
    while at < len {
        match d.file.read_at(&mut buf[at..], off as u64 + at as u64) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) => return undo(eno(e)),
        }
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        // SAFETY: changing the protection of our own mapping.
        if unsafe { libc::mprotect(p, len, prot) } != 0 {
            return undo(crate::shim::errno());
        }
    }
    super::data::data_io(at, false);
    Ok(p)
}

/// The kernel's checks of a file mapping, before anything is mapped: a length, an offset
/// that is a multiple of the page size, a regular file open for reading.
fn map_checks(d: &Desc, len: size_t, off: off_t) -> Result<(), i32> {
    // SAFETY: a plain system call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as i64;
    if len == 0 || off < 0 || off % page != 0 {
        return Err(libc::EINVAL);
    }
    if d.is_dir {
        return Err(libc::ENODEV);
    }
    if d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE == libc::O_WRONLY {
        return Err(libc::EACCES);
    }
    Ok(())
}

/// A mapping of a Moneta file's own pages (a memory drive, `OP_FS_MAP`): the kernel maps
/// them as asked and enforces the descriptor's mode, which is the file's open mode (a shared
/// mapping of a file open for writing gets writable pages; any other gets read-only ones, so
/// `PROT_WRITE` on a shared mapping of a read-only open fails with `EACCES`, at `mmap` or
/// at a later `mprotect`). `Ok(None)` where the array hands out no pages (`ENODEV`). The
/// caller has made [`map_checks`].
fn map_pages(
    d: &Desc,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    off: off_t,
) -> Result<Option<*mut c_void>, i32> {
    let acc = d.flags.load(Ordering::Relaxed) & libc::O_ACCMODE;
    let shared = flags & 3 != libc::MAP_PRIVATE;
    let write = shared && acc == libc::O_RDWR;
    let pages = match d.file.pages(write).map_err(eno) {
        Ok((fd, _)) => fd,
        Err(libc::ENODEV) => return Ok(None),
        Err(e) => return Err(e),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: the caller's mapping, of the file's pages instead of the file's descriptor.
    let p = unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr,
            len,
            prot,
            flags,
            pages.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(crate::shim::errno());
    }
    Ok(Some(p))
}

/// `mmap(2)`: a private mapping of a Moneta file up to [`PRIVATE_COPY_MAX`] is a copy
/// ([`map_private_copy`]); any other maps the file's own pages ([`map_pages`]); where the
/// array hands none out (one with data checksums), a longer private mapping is a copy too and
/// a shared one fails with `ENODEV` (as for a file system without `mmap`); anonymous and
/// other mappings go to the C library.
///
/// # Safety
///
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if hooked() && flags & libc::MAP_ANONYMOUS == 0 {
        if let Err(e) = crate::shim::kfs::give_back(fd) {
            return crate::shim::fail(libc::MAP_FAILED, e);
        }
        if let Some(d) = fds::get(fd) {
            return run(libc::MAP_FAILED, || {
                map_checks(&d, len, off)?;
                if flags & 3 == libc::MAP_PRIVATE && len <= PRIVATE_COPY_MAX {
                    // A read through the channel costs less than the file's own pages, which
                    // the daemon moves into a segment of their own (a host file at the
                    // `host` level): what git and the loader map is small and private.
                    return map_private_copy(&d, addr, len, prot, flags, off);
                }
                if let Some(p) = map_pages(&d, addr, len, prot, flags, off)? {
                    regions::add(p as usize, len, off as u64, &d);
                    return Ok(p);
                }
                // MAP_SHARED_VALIDATE (3) is a shared mapping too.
                if flags & 3 == libc::MAP_PRIVATE {
                    return map_private_copy(&d, addr, len, prot, flags, off);
                }
                refuse_map(&d.path);
                Err(libc::ENODEV)
            });
        }
    }
    // SAFETY: forwarding.
    let p = unsafe {
        real!(mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void)(
            addr, len, prot, flags, fd, off,
        )
    };
    if p != libc::MAP_FAILED && flags & libc::MAP_FIXED != 0 {
        // It replaced whatever was mapped there.
        regions::forget(p as usize, len);
    }
    p
}

/// `mmap64(2)`.
///
/// # Safety
///
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // SAFETY: per the caller.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// `munmap(2)`: forgets the Moneta mappings of the range (for [`madvise`]), then unmaps.
///
/// # Safety
///
/// As `munmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if hooked() && regions::any() {
        crate::shim::inside(|| regions::forget(addr as usize, len));
    }
    // The system call itself, as the C library's wrapper makes it: no lookup of the C
    // library's symbol, which could itself unmap on the way.
    // SAFETY: per the caller.
    let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    r as c_int
}

/// `madvise(2)`: `MADV_WILLNEED` over a mapping of a Moneta file's pages also tells the device
/// that those bytes of the file will be read soon (`File::will_need`: its DRAM buffer fills
/// them); the advice then goes to the kernel as always. The file must still be open in the
/// process for the hint to reach the device.
///
/// # Safety
///
/// As `madvise(2)`.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if advice == libc::MADV_WILLNEED && hooked() && regions::any() {
        let saved = crate::shim::errno();
        crate::shim::inside(|| {
            for (d, off, n) in regions::files(addr as usize, len) {
                let _ = d.file.will_need(off, n);
            }
        });
        crate::shim::set_errno(saved);
    }
    // SAFETY: forwarding.
    unsafe { real!(madvise: fn(*mut c_void, size_t, c_int) -> c_int)(addr, len, advice) }
}

/// The Moneta mappings of this process: where each lies, and the file and offset it maps.
/// Kept for hints only, so a lost entry loses a hint and nothing else: the table is taken with
/// `try_lock` (a hook never waits, so a fork or a signal cannot leave it waiting), and a
/// mapping moved by `mremap` is simply not found.
mod regions {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, Weak};

    use crate::shim::fds::Desc;

    struct Region {
        start: usize,
        len: usize,
        off: u64,
        desc: Weak<Desc>,
    }

    static TABLE: Mutex<Vec<Region>> = Mutex::new(Vec::new());
    static COUNT: AtomicUsize = AtomicUsize::new(0);

    /// Most mappings remembered (the oldest are forgotten first).
    const MOST: usize = 4096;

    /// Whether any Moneta mapping is remembered.
    #[inline]
    pub(super) fn any() -> bool {
        COUNT.load(Ordering::Relaxed) > 0
    }

    /// A new mapping of `d`'s pages from file offset `off`.
    pub(super) fn add(start: usize, len: usize, off: u64, d: &Arc<Desc>) {
        let Ok(mut t) = TABLE.try_lock() else { return };
        cut(&mut t, start, len);
        if t.len() >= MOST {
            t.remove(0);
        }
        t.push(Region {
            start,
            len,
            off,
            desc: Arc::downgrade(d),
        });
        COUNT.store(t.len(), Ordering::Relaxed);
    }

    /// `[start, start + len)` is no longer what it was.
    pub(super) fn forget(start: usize, len: usize) {
        if !any() {
            return;
        }
        let Ok(mut t) = TABLE.try_lock() else { return };
        cut(&mut t, start, len);
        COUNT.store(t.len(), Ordering::Relaxed);
    }

    /// Removes `[start, start + len)` from the regions, keeping what lies on either side.
    fn cut(t: &mut Vec<Region>, start: usize, len: usize) {
        let end = start.saturating_add(len);
        let mut kept = Vec::new();
        t.retain(|r| {
            let r_end = r.start + r.len;
            if r_end <= start || r.start >= end {
                return true;
            }
            if r.start < start {
                kept.push(Region {
                    start: r.start,
                    len: start - r.start,
                    off: r.off,
                    desc: r.desc.clone(),
                });
            }
            if r_end > end {
                kept.push(Region {
                    start: end,
                    len: r_end - end,
                    off: r.off + (end - r.start) as u64,
                    desc: r.desc.clone(),
                });
            }
            false
        });
        t.extend(kept);
    }

    /// The files and byte ranges (file offset, length) that `[start, start + len)` maps.
    pub(super) fn files(start: usize, len: usize) -> Vec<(Arc<Desc>, u64, u64)> {
        let Ok(t) = TABLE.try_lock() else {
            return Vec::new();
        };
        let end = start.saturating_add(len);
        t.iter()
            .filter_map(|r| {
                let (s, e) = (r.start.max(start), (r.start + r.len).min(end));
                if s >= e {
                    return None;
                }
                let d = r.desc.upgrade()?;
                Some((d, r.off + (s - r.start) as u64, (e - s) as u64))
            })
            .collect()
    }
}
