//! Files of a kernel file system on the array (`monetad --kernel-fs`, docs/kernelfs.md).
//!
//! When the daemon serves ext4 or XFS in place of nvfs, the shim leaves every path to the
//! kernel (names, directories, attributes are the kernel's own) and takes over only the data
//! of regular files opened on that file system: after the C library's `open` succeeds, the
//! shim hands the new descriptor to the daemon ([`libmoneta::KernelFile::adopt`], which keeps
//! an `O_PATH` descriptor of the file) and puts an `O_PATH` descriptor of the file under the
//! same number. Reads, writes, seeks, `fsync` and `ftruncate` on that number then go through
//! the channel (and through the kernel where the daemon says so); `fstat`, `fstatfs` and the
//! close-on-exec flag work on the `O_PATH` descriptor as they are.
//!
//! Anything else on such a number (`mmap`, locks, `fchmod`, `fallocate`, `ioctl`, `sendfile`,
//! `O_APPEND`, `SEEK_DATA`, ...) first gives the file back to the kernel: the shim opens the
//! file again through the kernel with the descriptor's access mode and flags (the kernel
//! checks the caller's rights again), moves that description to the shim's file position,
//! puts it under every number that shared the description, and forgets them; the call then
//! goes to the C library. From then on that descriptor is an ordinary kernel descriptor. The
//! same happens to every such descriptor before a `fork` or `vfork` (parent and child share
//! the file position, which only the kernel can hold for both), and, for descriptors without
//! close-on-exec, before `exec` and `posix_spawn`. Files opened with `O_APPEND` stay with the
//! kernel from the start (its appends are atomic).

use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};

use libmoneta::{KernelFile, Moneta};

use super::fds::{self, Table};
use super::{conn, eno, inside, log, DEBUG};

/// An open file description of a kernel file served through the channel.
pub(crate) struct KDesc {
    pub file: KernelFile,
    /// Status flags as `F_GETFL` reports them.
    pub flags: AtomicI32,
    /// The file position, held across each `read` and `write` that moves it (as the kernel's
    /// lock of a description's position).
    pos: Mutex<Pos>,
}

struct Pos {
    at: u64,
    /// Given back to the kernel: the numbers are kernel descriptors now.
    gone: bool,
}

static TABLE: Table<KDesc> = Table::new();
/// Whether this process ever made such a descriptor (one load on every other call).
static ANY: AtomicBool = AtomicBool::new(false);

const UNKNOWN: u8 = 0;
const NVFS: u8 = 1;
const KERNEL: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// The device number of the kernel file system's mount.
static DEV: AtomicU64 = AtomicU64::new(0);

/// Whether the daemon is known to serve a kernel file system (one load).
#[inline]
pub(crate) fn serving() -> bool {
    MODE.load(Ordering::Relaxed) == KERNEL
}

/// Whether the daemon serves a kernel file system, asking it if the process is connected
/// already (classifying a path must not connect: the hooks that serve a path connect, and
/// ask [`serves`]).
pub(crate) fn probe() -> bool {
    match MODE.load(Ordering::Acquire) {
        KERNEL => true,
        NVFS => false,
        _ => super::connected().is_some_and(learn),
    }
}

/// Whether the daemon behind `m` serves a kernel file system (asked once).
pub(crate) fn serves(m: &Moneta) -> bool {
    match MODE.load(Ordering::Acquire) {
        KERNEL => true,
        NVFS => false,
        _ => learn(m),
    }
}

fn learn(m: &Moneta) -> bool {
    match inside(|| m.kernel_fs()) {
        Ok(Some(k)) => {
            let dev = rustix::fs::stat(&k.mount).map(|s| s.st_dev).unwrap_or(0);
            DEV.store(dev, Ordering::Release);
            MODE.store(KERNEL, Ordering::Release);
            log(
                DEBUG,
                format_args!(
                    "the daemon serves {} on {}: paths go to the kernel, data of its files \
                     through the channel",
                    k.kind,
                    k.mount.display()
                ),
            );
            true
        }
        Ok(None) => {
            MODE.store(NVFS, Ordering::Release);
            false
        }
        Err(_) => false,
    }
}

/// The description behind `fd`, if it is a kernel file served through the channel.
#[inline]
pub(crate) fn get(fd: c_int) -> Option<Arc<KDesc>> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    TABLE.get(fd)
}

/// Whether `fd` is one.
#[inline]
pub(crate) fn has(fd: c_int) -> bool {
    ANY.load(Ordering::Relaxed) && TABLE.has(fd)
}

fn errno() -> i32 {
    super::errno()
}

/// Takes over `fd`, just opened through the kernel with `flags`, if it is a regular file of
/// the daemon's kernel file system that the channel can serve; otherwise (or if the daemon
/// refuses it) it stays the kernel's. Returns `fd` either way.
pub(crate) fn adopt(fd: c_int, flags: c_int) -> c_int {
    if flags & (libc::O_PATH | libc::O_DIRECTORY | libc::O_APPEND) != 0 || !fds::fits(fd) {
        return fd;
    }
    let Ok(st) = rustix::fs::fstat(
        // SAFETY: the caller's descriptor, borrowed for the call.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    ) else {
        return fd;
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_dev != DEV.load(Ordering::Acquire) {
        return fd;
    }
    let Some(m) = conn() else { return fd };
    let saved = errno();
    let r = inside(|| take_over(m, fd, flags));
    if let Err(e) = r {
        log(
            DEBUG,
            format_args!("descriptor {fd} stays with the kernel: {e}"),
        );
    }
    super::set_errno(saved);
    fd
}

fn take_over(m: &Moneta, fd: c_int, flags: c_int) -> Result<(), String> {
    // SAFETY: duplicating the caller's descriptor; the copy is ours.
    let copy = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 0) } as c_int;
    if copy < 0 {
        return Err(format!("dup: errno {}", errno()));
    }
    // SAFETY: a descriptor just made, owned by nobody else.
    let copy = unsafe { OwnedFd::from_raw_fd(copy) };
    let file = KernelFile::adopt(m, copy).map_err(|e| e.to_string())?;
    let cloexec = if flags & libc::O_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // The number now names the file by path only: the kernel's description of it closes
    // (nothing else holds it), so the daemon can take its lease.
    // SAFETY: replacing the caller's descriptor with one of the same file.
    if unsafe { libc::syscall(libc::SYS_dup3, file.path_fd().as_raw_fd(), fd, cloexec) } < 0 {
        return Err(format!("dup3: errno {}", errno()));
    }
    let kept = libc::O_ACCMODE
        | libc::O_NONBLOCK
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_SYNC
        | libc::O_DSYNC;
    TABLE.put(
        fd,
        Arc::new(KDesc {
            file,
            flags: (flags & kept | libc::O_LARGEFILE).into(),
            pos: Mutex::new(Pos { at: 0, gone: false }),
        }),
    );
    if !ANY.swap(true, Ordering::AcqRel) {
        static ATFORK: Once = Once::new();
        // SAFETY: a plain function that lives as long as the process.
        ATFORK.call_once(|| unsafe {
            libc::pthread_atfork(Some(before_fork), None, None);
        });
    }
    super::count(&super::COUNTERS.opens, 1);
    log(
        DEBUG,
        format_args!("descriptor {fd} served through the channel"),
    );
    Ok(())
}

impl KDesc {
    fn lock(&self) -> MutexGuard<'_, Pos> {
        self.pos.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn readable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_WRONLY
    }

    fn writable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_ACCMODE != libc::O_RDONLY
    }

    /// Reads at `at`.
    pub(crate) fn read_at(&self, buf: &mut [u8], at: u64) -> Result<usize, i32> {
        if !self.readable() {
            return Err(libc::EBADF);
        }
        self.file.read_at(buf, at).map_err(eno)
    }

    /// Writes all of `data` at `at`.
    pub(crate) fn write_at(&self, data: &[u8], at: u64) -> Result<usize, i32> {
        if !self.writable() {
            return Err(libc::EBADF);
        }
        at.checked_add(data.len() as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(libc::EFBIG)?;
        self.file.write_at(data, at).map_err(eno)?;
        if self.flags.load(Ordering::Relaxed) & (libc::O_SYNC | libc::O_DSYNC) != 0 {
            self.file.sync().map_err(eno)?;
        }
        Ok(data.len())
    }

    /// Runs `f` at the file position and moves it by what `f` returns; `None` when the
    /// description went back to the kernel meanwhile (the caller makes the C library's call).
    pub(crate) fn at_position(
        &self,
        f: impl FnOnce(u64) -> Result<usize, i32>,
    ) -> Option<Result<usize, i32>> {
        let mut p = self.lock();
        if p.gone {
            return None;
        }
        Some(f(p.at).inspect(|&n| p.at += n as u64))
    }

    /// `lseek`: `None` for what only the kernel answers (`SEEK_DATA`, `SEEK_HOLE`).
    pub(crate) fn seek(&self, off: i64, whence: c_int) -> Option<Result<i64, i32>> {
        let mut p = self.lock();
        if p.gone {
            return None;
        }
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => p.at as i64,
            libc::SEEK_END => match self.file.len() {
                Ok(n) => n as i64,
                Err(e) => return Some(Err(eno(e))),
            },
            libc::SEEK_DATA | libc::SEEK_HOLE => return None,
            _ => return Some(Err(libc::EINVAL)),
        };
        Some(match base.checked_add(off) {
            Some(n) if n >= 0 => {
                p.at = n as u64;
                Ok(n)
            }
            Some(_) => Err(libc::EINVAL),
            None => Err(libc::EOVERFLOW),
        })
    }

    /// `fsync`, `fdatasync`.
    pub(crate) fn sync(&self) -> Result<c_int, i32> {
        self.file.sync().map_err(eno)?;
        Ok(0)
    }

    /// `fallocate`, through the kernel.
    pub(crate) fn allocate(&self, mode: c_int, off: i64, len: i64) -> Result<c_int, i32> {
        if off < 0 || len <= 0 {
            return Err(libc::EINVAL);
        }
        if !self.writable() {
            return Err(libc::EBADF);
        }
        (off as u64)
            .checked_add(len as u64)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(libc::EFBIG)?;
        self.file
            .allocate(off as u64, len as u64, mode)
            .map_err(eno)?;
        Ok(0)
    }

    /// `ftruncate`.
    pub(crate) fn set_len(&self, size: i64) -> Result<c_int, i32> {
        let size = u64::try_from(size).map_err(|_| libc::EINVAL)?;
        if !self.writable() {
            return Err(libc::EINVAL);
        }
        self.file.set_len(size).map_err(eno)?;
        Ok(0)
    }
}

/// Makes a duplicate of a descriptor of `d` with `make` (a `dup`, `dup3` or `F_DUPFD` of it)
/// and maps the new number to `d`; `None`, having made nothing, when `d` went back to the
/// kernel meanwhile or this is a `vfork` child (which must not change its parent's table: the
/// descriptor `fd` is given back to the kernel there first). Either way the caller then makes
/// the C library's call.
pub(crate) fn duplicate(
    fd: c_int,
    d: &Arc<KDesc>,
    make: impl FnOnce() -> c_int,
) -> Option<Result<c_int, i32>> {
    if fds::vforked() {
        return settle(fd).err().map(Err);
    }
    let p = d.lock();
    if p.gone {
        return None;
    }
    let n = make();
    if n < 0 {
        return Some(Err(errno()));
    }
    if !fds::fits(n) {
        // SAFETY: the duplicate just made.
        unsafe { libc::syscall(libc::SYS_close, n) };
        return Some(Err(libc::EMFILE));
    }
    TABLE.put(n, d.clone());
    drop(p);
    Some(Ok(n))
}

/// The numbers of every such descriptor.
pub(crate) fn numbers() -> Vec<c_int> {
    if !ANY.load(Ordering::Relaxed) {
        return Vec::new();
    }
    TABLE.entries().into_iter().map(|(n, _)| n).collect()
}

/// Forgets `fd` (closed or replaced); `None` in a `vfork` child, which must not change its
/// parent's table.
pub(crate) fn forget(fd: c_int) -> Option<Arc<KDesc>> {
    if !has(fd) || fds::vforked() {
        return None;
    }
    TABLE.take(fd)
}

/// A kernel description of `d`'s file at its position, with its flags (close-on-exec: the
/// caller puts it where it belongs).
fn reopen(d: &KDesc, at: u64) -> Result<OwnedFd, i32> {
    let keep = libc::O_ACCMODE
        | libc::O_NONBLOCK
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_SYNC
        | libc::O_DSYNC;
    let flags = d.flags.load(Ordering::Relaxed) & keep;
    let path = format!("/proc/self/fd/{}\0", d.file.path_fd().as_raw_fd());
    // SAFETY: a NUL-terminated path; the descriptor returned is ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags | libc::O_CLOEXEC,
            0,
        )
    } as c_int;
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: just made.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a plain system call on our descriptor.
    if unsafe { libc::syscall(libc::SYS_lseek, fd.as_raw_fd(), at as i64, libc::SEEK_SET) } < 0 {
        return Err(errno());
    }
    Ok(fd)
}

/// Puts `kernel` under `n`, keeping `n`'s close-on-exec flag.
fn put_under(kernel: &OwnedFd, n: c_int) -> Result<(), i32> {
    // SAFETY: plain system calls on descriptors of this process.
    unsafe {
        let fdflags = libc::syscall(libc::SYS_fcntl, n, libc::F_GETFD) as c_int;
        let cloexec = if fdflags > 0 && fdflags & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        if libc::syscall(libc::SYS_dup3, kernel.as_raw_fd(), n, cloexec) < 0 {
            return Err(errno());
        }
    }
    Ok(())
}

/// Gives `fd`'s file back to the kernel (see the module's description), if it is one of
/// these; in a `vfork` child only `fd` is changed, and only in the kernel's table.
pub(crate) fn settle(fd: c_int) -> Result<(), i32> {
    let Some(d) = get(fd) else { return Ok(()) };
    let mut p = d.lock();
    if p.gone {
        return Ok(());
    }
    let kernel = reopen(&d, p.at)?;
    if fds::vforked() {
        return put_under(&kernel, fd);
    }
    for (n, e) in TABLE.entries() {
        if Arc::ptr_eq(&e, &d) {
            put_under(&kernel, n)?;
            TABLE.take(n);
        }
    }
    p.gone = true;
    log(
        DEBUG,
        format_args!("descriptor {fd} given back to the kernel"),
    );
    Ok(())
}

/// `vfork(3)`: every file goes back to the kernel first, as before a fork (the child's
/// descriptors share the parent's descriptions and positions, and a program it executes
/// reads and writes through them). The C library's `vfork` is then entered by a jump, with
/// the caller's return address where it was: a function that returns twice must not have a
/// frame of its own.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {prepare}",
        "add rsp, 8",
        "jmp rax",
        prepare = sym before_vfork,
    )
}

/// `vfork(3)` (see the x86-64 version).
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-16]!",
        "bl {prepare}",
        "ldp x29, x30, [sp], #16",
        "br x0",
        prepare = sym before_vfork,
    )
}

/// Gives the files back to the kernel; returns the C library's `vfork`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" fn before_vfork() -> usize {
    static P: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if ANY.load(Ordering::Relaxed) && super::hooked() {
        before_fork();
    }
    super::lookup(&P, "vfork\0")
}

/// In a hook about to make the C library's call on `fd`: gives it back to the kernel first
/// if it is one of these ([`settle`]).
#[inline]
pub(crate) fn give_back(fd: c_int) -> Result<(), i32> {
    if has(fd) && super::hooked() {
        inside(|| settle(fd))
    } else {
        Ok(())
    }
}

/// Gives every file back to the kernel before a fork: the child shares the descriptions and
/// their positions, which only the kernel can keep for both.
extern "C" fn before_fork() {
    if !fds::vforked() {
        for (fd, _) in TABLE.entries() {
            let _ = inside(|| settle(fd));
        }
    }
}

/// Before `exec` or `posix_spawn`: descriptors the new program inherits become kernel
/// descriptors (the new image knows nothing of the channel's).
pub(crate) fn before_exec() {
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    for (fd, _) in TABLE.entries() {
        // SAFETY: a plain system call.
        let fdflags = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFD) } as c_int;
        if fdflags >= 0 && fdflags & libc::FD_CLOEXEC == 0 {
            let _ = inside(|| settle(fd));
        }
    }
}
