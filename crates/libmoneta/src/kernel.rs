//! Files of a kernel file system on the array (`monetad --kernel-fs`, docs/kernelfs.md): the
//! kernel decides at open whether the caller may read or write a file, as in Moneta-D's
//! recycled XFS; afterwards reads and writes go through the channel at the addresses the
//! file's extent map gives, and through the kernel only where the channel cannot go.
//!
//! [`KernelFile::open`] opens the file through the kernel, hands the descriptor to the daemon
//! (`KFS_OPEN`) and closes it, keeping an `O_PATH` descriptor to reach the file through the
//! kernel again when it must: for bytes the daemon will not install (inline or encoded data),
//! while the file is open elsewhere through the kernel (the daemon answers `EAGAIN`), and to
//! change its size downwards. Those kernel opens check the caller's rights again, and make
//! the daemon revoke every channel's records of the file first (its lease breaks).
//!
//! What the client keeps is the channel extents the daemon installed; a read or write that
//! finds its record gone (revoked, evicted) asks again. Holes, preallocated extents and the
//! end of the file are always asked of the daemon, so a file that another program grew or
//! wrote is seen at once.
//!
//! Writes through the channel do not pass the kernel, which therefore does not update the
//! file's modification time: [`KernelFile::sync`] and the drop of a file written through the
//! channel set it (and the change time) to the current time.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use moneta_abi::control::{ReplyBody, Request, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::kfsproto::{kind, KfsExtent, KfsMap, KfsReply, KfsRequest};
use moneta_abi::{Completion, Status};
use rustix::fs::{Mode, OFlags};

use crate::{Channel, ClientError, Moneta};

/// Bytes a map asks for beyond what a request needs, so that sequential requests ask seldom.
const MAP_AHEAD: u64 = 16 << 20;

/// Bytes a write into a hole or a preallocated extent inside the file has the daemon
/// allocate at once (never past the end of the file, which would change its size), so that
/// small writes filling a preallocated file ask seldom.
const ALLOCATE_AHEAD: u64 = 1 << 20;

/// Times a request asks again after finding its records gone before it uses the kernel.
const RETRIES: usize = 8;

/// The `O_PATH` descriptors the open files hold, which a program closing "every other
/// descriptor" must leave ([`crate::fork::own_descriptors`]).
static PATH_FDS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

pub(crate) fn descriptors() -> Vec<i32> {
    PATH_FDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect()
}

/// The channel a file's handle belongs to.
enum Via {
    /// A channel of the caller's.
    Channel(Arc<Channel>),
    /// The channel a connection had when the file was opened (its address): after a fork or
    /// a restart of the daemon the connection has another, on which the handle means nothing.
    Connection(Moneta, usize),
}

/// Which kernel file system a daemon serves ([`Moneta::kernel_fs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFs {
    /// `ext4` or `xfs`.
    pub kind: &'static str,
    /// Where it is mounted (absolute, without symbolic links).
    pub mount: PathBuf,
}

impl Moneta {
    /// The kernel file system the daemon serves (`monetad --kernel-fs`), or `None` when it
    /// serves nvfs or a raw array.
    pub fn kernel_fs(&self) -> Result<Option<KernelFs>, ClientError> {
        use std::os::unix::ffi::OsStrExt;
        let ch = self.inner.live()?;
        match ch.control().call(&Request::Kfs(KfsRequest::Info)) {
            Ok((ReplyBody::Kfs(KfsReply::Info { kind, mount }), _)) => Ok(Some(KernelFs {
                kind: if kind == moneta_abi::kfsproto::FS_XFS {
                    "xfs"
                } else {
                    "ext4"
                },
                mount: PathBuf::from(std::ffi::OsStr::from_bytes(&mount)),
            })),
            Ok(_) => Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
                "reply",
            ))),
            Err(e) if refused(&e) == Some(libc::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A file of the kernel file system on the array.
pub struct KernelFile {
    via: Via,
    handle: u64,
    /// The file, for the kernel's path.
    path_fd: OwnedFd,
    rights: u32,
    /// Channel extents the daemon installed, in file order.
    extents: Mutex<Vec<KfsExtent>>,
    /// Written through the channel since the modification time was last set.
    wrote: AtomicBool,
    /// The file's size in the daemon's last answer.
    size_seen: AtomicU64,
}

fn refused(e: &ClientError) -> Option<i32> {
    match e {
        ClientError::Refused { errno, .. } => Some(*errno),
        _ => None,
    }
}

fn record_gone(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Status(Status::PermissionMiss) | ClientError::Status(Status::PermissionDenied)
    )
}

/// How a piece of a request goes.
enum Route {
    /// Through the channel at this address.
    Channel(u64, u64),
    /// Zeros (a hole or a preallocated extent, now).
    Zeros(u64),
    /// Through the kernel.
    Kernel(u64),
    /// Past the end of the file.
    End,
}

impl KernelFile {
    /// Opens `path` through the kernel (for reading, and for writing too with `write`) and
    /// hands it to the daemon behind `channel`.
    pub fn open(channel: &Arc<Channel>, path: &Path, write: bool) -> Result<Self, ClientError> {
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let fd = rustix::fs::open(path, access | OFlags::CLOEXEC, Mode::empty())
            .map_err(ClientError::from)?;
        Self::hand_over(Via::Channel(channel.clone()), channel, fd)
    }

    /// Hands `fd`, a descriptor of a regular file of the daemon's kernel file system that
    /// the caller opened through the kernel, to the daemon behind `m`'s channel (which checks
    /// it), and closes it: its access mode gives the file's rights. A read-write or read-only
    /// descriptor is what the kernel's own `open` makes; an `O_PATH` one is refused.
    pub fn adopt(m: &Moneta, fd: OwnedFd) -> Result<Self, ClientError> {
        let ch = m.inner.live()?;
        let via = Via::Connection(m.clone(), ch as *const Channel as usize);
        Self::hand_over(via, ch, fd)
    }

    fn hand_over(via: Via, ch: &Channel, fd: OwnedFd) -> Result<Self, ClientError> {
        let path_fd = rustix::fs::open(
            format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(ClientError::from)?;
        let (body, _) = ch
            .control()
            .call_passing(&Request::Kfs(KfsRequest::Open), &[fd.as_fd()])?;
        // The daemon holds a description of its own now; this one would keep its lease away.
        drop(fd);
        let ReplyBody::Kfs(KfsReply::Opened { handle, rights, .. }) = body else {
            return Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
                "reply",
            )));
        };
        PATH_FDS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path_fd.as_raw_fd());
        Ok(KernelFile {
            via,
            handle,
            path_fd,
            rights,
            extents: Mutex::new(Vec::new()),
            wrote: AtomicBool::new(false),
            size_seen: AtomicU64::new(0),
        })
    }

    /// The channel of the handle: `EIO` once the connection has another (after a fork, or
    /// when the daemon went away and the connection was made anew).
    fn channel(&self) -> Result<&Channel, ClientError> {
        match &self.via {
            Via::Channel(c) => Ok(c),
            Via::Connection(m, at) => {
                let ch = m.inner.live()?;
                if ch as *const Channel as usize == *at {
                    Ok(ch)
                } else {
                    Err(ClientError::Io(std::io::Error::from_raw_os_error(
                        libc::EIO,
                    )))
                }
            }
        }
    }

    /// The `O_PATH` descriptor of the file the library keeps (to reach the file through the
    /// kernel: `/proc/self/fd/N` opens it again with the caller's rights checked anew).
    pub fn path_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.path_fd.as_fd()
    }

    /// The rights the daemon gave the handle ([`RIGHT_READ`], [`RIGHT_WRITE`]).
    pub fn rights(&self) -> u32 {
        self.rights
    }

    fn ask(&self, req: KfsRequest) -> Result<KfsMap, ClientError> {
        match self.channel()?.control().call(&Request::Kfs(req))?.0 {
            ReplyBody::Kfs(KfsReply::Map(m)) => Ok(m),
            _ => Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
                "reply",
            ))),
        }
    }

    /// Keeps the channel extents of `m`.
    fn keep(&self, m: &KfsMap) {
        let mut ext = self.extents.lock().expect("extents lock");
        for e in m.extents.iter().filter(|e| e.kind == kind::CHANNEL) {
            let end = e.logical + e.len;
            ext.retain(|x| x.logical + x.len <= e.logical || x.logical >= end);
            let at = ext.partition_point(|x| x.logical < e.logical);
            ext.insert(at, *e);
        }
    }

    fn forget(&self) {
        self.extents.lock().expect("extents lock").clear();
    }

    /// The route of the bytes from `at` (at most `want` of them), asking the daemon unless a
    /// kept extent covers `at`; `Ok(None)` when the daemon says to use the kernel.
    fn route(&self, at: u64, want: u64, right: u32) -> Result<Option<Route>, ClientError> {
        {
            let ext = self.extents.lock().expect("extents lock");
            let i = ext.partition_point(|x| x.logical + x.len <= at);
            if let Some(e) = ext
                .get(i)
                .filter(|e| e.logical <= at && e.rights & right != 0)
            {
                let n = (e.logical + e.len - at).min(want);
                return Ok(Some(Route::Channel(e.physical + (at - e.logical), n)));
            }
        }
        let m = match self.ask(KfsRequest::Map {
            handle: self.handle,
            offset: at,
            len: want.max(MAP_AHEAD),
        }) {
            Ok(m) => m,
            Err(e) if refused(&e) == Some(libc::EAGAIN) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.keep(&m);
        self.size_seen.store(m.size, Ordering::Relaxed);
        let Some(e) = m.extents.first().filter(|e| e.logical <= at) else {
            return Ok(Some(Route::End));
        };
        let n = (e.logical + e.len - at).min(want);
        Ok(Some(match e.kind {
            kind::CHANNEL if e.rights & right != 0 => {
                Route::Channel(e.physical + (at - e.logical), n)
            }
            kind::ZEROS => Route::Zeros(n),
            _ => Route::Kernel(n),
        }))
    }

    /// The file through the kernel, opened again for this access.
    fn through_kernel(&self, write: bool) -> Result<std::fs::File, ClientError> {
        let access = if write {
            OFlags::WRONLY
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::open(
            format!("/proc/self/fd/{}", self.path_fd.as_raw_fd()).as_str(),
            access | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(ClientError::from)?;
        // The kernel's open broke the daemon's lease: every record of the file is gone.
        self.forget();
        Ok(std::fs::File::from(fd))
    }

    /// Reads at `offset`; returns the bytes read (fewer only at the end of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, ClientError> {
        use std::os::unix::fs::FileExt;
        if self.rights & RIGHT_READ == 0 {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EBADF,
            )));
        }
        let mut done = 0usize;
        let mut retries = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let want = (buf.len() - done) as u64;
            let route = if retries > RETRIES {
                None
            } else {
                self.route(at, want, RIGHT_READ)?
            };
            let piece = &mut buf[done..];
            match route {
                Some(Route::Channel(addr, n)) => {
                    match self.channel()?.read_pipelined(
                        addr,
                        &mut piece[..n as usize],
                        Completion::Dma,
                    ) {
                        Ok(()) => done += n as usize,
                        Err(e) if record_gone(&e) => {
                            self.forget();
                            retries += 1;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Some(Route::Zeros(n)) => {
                    piece[..n as usize].fill(0);
                    done += n as usize;
                }
                Some(Route::End) => break,
                Some(Route::Kernel(n)) => {
                    let f = self.through_kernel(false)?;
                    let r = f.read_at(&mut piece[..n as usize], at)?;
                    done += r;
                    if r == 0 {
                        break;
                    }
                }
                None => {
                    // The rest through the kernel.
                    let f = self.through_kernel(false)?;
                    let r = f.read_at(piece, at)?;
                    done += r;
                    if r == 0 {
                        break;
                    }
                    retries = 0;
                }
            }
        }
        Ok(done)
    }

    /// Writes all of `data` at `offset`, growing the file where it ends past its end.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<(), ClientError> {
        use std::os::unix::fs::FileExt;
        if self.rights & RIGHT_WRITE == 0 {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EBADF,
            )));
        }
        let mut done = 0usize;
        let mut retries = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let want = (data.len() - done) as u64;
            let route = if retries > RETRIES {
                None
            } else {
                self.route(at, want, RIGHT_WRITE)?
            };
            let piece = &data[done..];
            match route {
                Some(Route::Channel(addr, n)) => {
                    match self.channel()?.write_pipelined(
                        addr,
                        &piece[..n as usize],
                        Completion::Dma,
                    ) {
                        Ok(()) => {
                            self.wrote.store(true, Ordering::Relaxed);
                            done += n as usize
                        }
                        Err(e) if record_gone(&e) => {
                            self.forget();
                            retries += 1;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Some(r @ (Route::Zeros(_) | Route::End)) => {
                    // Holes, preallocated extents and the end of the file become written
                    // extents first, for the rest of the write at once (and, inside the file,
                    // a little more).
                    let size = self.size_seen.load(Ordering::Relaxed);
                    let len = match r {
                        Route::Zeros(_) if at < size => want.max((size - at).min(ALLOCATE_AHEAD)),
                        _ => want,
                    };
                    match self.ask(KfsRequest::Allocate {
                        handle: self.handle,
                        offset: at,
                        len,
                    }) {
                        Ok(m) => self.keep(&m),
                        Err(e) if refused(&e) == Some(libc::EAGAIN) => retries = RETRIES + 1,
                        Err(e) => return Err(e),
                    }
                    retries += 1;
                }
                Some(Route::Kernel(n)) => {
                    let f = self.through_kernel(true)?;
                    f.write_all_at(&piece[..n as usize], at)?;
                    done += n as usize;
                }
                None => {
                    let f = self.through_kernel(true)?;
                    f.write_all_at(piece, at)?;
                    done = data.len();
                }
            }
        }
        Ok(())
    }

    /// The file's size now.
    pub fn len(&self) -> Result<u64, ClientError> {
        Ok(rustix::fs::fstat(&self.path_fd)
            .map_err(ClientError::from)?
            .st_size as u64)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool, ClientError> {
        Ok(self.len()? == 0)
    }

    /// Sets the size, through the kernel (which first has the daemon revoke every channel's
    /// records of the file).
    pub fn set_len(&self, size: u64) -> Result<(), ClientError> {
        let f = self.through_kernel(true)?;
        f.set_len(size)?;
        Ok(())
    }

    /// `fallocate(2)` with `mode` through the kernel (which first has the daemon revoke every
    /// channel's records of the file): preallocated space reads as zeros, and becomes
    /// writable through the channel when first written.
    pub fn allocate(&self, offset: u64, len: u64, mode: i32) -> Result<(), ClientError> {
        let f = self.through_kernel(true)?;
        // SAFETY: a plain system call on a descriptor we own.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
        if r < 0 {
            return Err(ClientError::Io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Makes what was written through the channel durable in the array's backing file (a
    /// FLUSH of every extent kept), and sets the modification time if the channel wrote; the
    /// file's size and allocation became durable when the daemon allocated them.
    pub fn sync(&self) -> Result<(), ClientError> {
        let ext: Vec<KfsExtent> = self.extents.lock().expect("extents lock").clone();
        for e in ext.iter().filter(|e| e.rights & RIGHT_WRITE != 0) {
            match self.channel()?.flush(e.physical, e.len, Completion::Dma) {
                Ok(()) => {}
                // Revoked since: the kernel took the file over, and writes it back itself.
                Err(e) if record_gone(&e) => {}
                Err(e) => return Err(e),
            }
        }
        self.touch();
        Ok(())
    }

    /// Sets the modification time to now if the channel wrote since it was last set. (A
    /// change of times takes no lease: the records stay.)
    fn touch(&self) {
        if self.wrote.swap(false, Ordering::Relaxed) {
            let now = rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            };
            let _ = rustix::fs::utimensat(
                rustix::fs::CWD,
                format!("/proc/self/fd/{}", self.path_fd.as_raw_fd()).as_str(),
                &rustix::fs::Timestamps {
                    last_access: rustix::fs::Timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    },
                    last_modification: now,
                },
                rustix::fs::AtFlags::empty(),
            );
        }
    }
}

impl Drop for KernelFile {
    fn drop(&mut self) {
        self.touch();
        // A forked child's copy has nothing to close (and must not connect to say so).
        let stale = matches!(&self.via, Via::Connection(m, _) if !m.inner.fresh());
        if let Some(ch) = (!stale).then(|| self.channel().ok()).flatten() {
            let _ = ch.control().call(&Request::Kfs(KfsRequest::Close {
                handle: self.handle,
            }));
        }
        PATH_FDS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.path_fd.as_raw_fd());
    }
}
