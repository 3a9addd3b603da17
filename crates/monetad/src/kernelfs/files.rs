//! The permission manager of a recycled kernel file system: open files, their leases, and
//! the records installed from their extent maps.
//!
//! - **Open** (`OP_KFS_OPEN`): the client opened the file through the kernel, which checked
//!   its credentials; the descriptor it hands over must be a regular file of the mounted file
//!   system, and its access mode becomes the handle's rights. The daemon opens a description
//!   of its own (one per file, shared by every handle of it; read-only until a handle may
//!   write, so that a reader cannot keep an executable from being run) and closes the
//!   client's copy; the client closes its own too, keeping at most an `O_PATH` one.
//! - **Map** (`OP_KFS_MAP`): the daemon takes a write lease on its description (see
//!   [`super::leases`]); the kernel grants one only while nobody else has the file open, which
//!   is also when the kernel's page cache and the array cannot disagree: the file's dirty pages
//!   are written back and its cached pages dropped first, so the next kernel read comes from
//!   the array. Then each extent of the range is either installed in the caller's channel
//!   (written, plain extents; without write for an extent shared with another file) or
//!   answered as zeros (holes, preallocated extents) or as kernel-only (inline, encoded,
//!   encrypted, unaligned, not yet allocated), never installed. Records end at the end of
//!   the file, so no channel reads or writes past it.
//! - **Allocate** (`OP_KFS_ALLOCATE`): holes and preallocated extents of the range, and the
//!   range past the end of the file, are written with zeros through the daemon's description
//!   (so they become plain, written extents, and the file grows), after every channel's
//!   records of the file are revoked (a partial block at the old end passes through the page
//!   cache, whose write-back must not race a channel's write); then the range is mapped.
//! - **Close**: the caller's channel loses its records of the file; the last close gives the
//!   lease back and closes the daemon's description.
//! - **Lease break**: another open or a truncate of the file: every channel's records of it
//!   are revoked, and only then the lease given back. The next map takes it again once the
//!   other description is gone, or answers `EAGAIN`: the client then uses the kernel.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use moneta_abi::control::{errno, Failure, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::kfsproto::{kind, KfsExtent, KfsMap, KfsReply, MAX_KFS_EXTENTS};
use moneta_device::{Device, TableOp};

use super::sys::{self, flags};

/// Most handles one connection holds.
pub const MAX_HANDLES_PER_CONNECTION: usize = 4096;

/// Bytes of zeros written per call when a range is allocated.
const ZERO_CHUNK: usize = 1 << 20;

fn fail(errno: i32, message: impl Into<String>) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

fn io_fail(what: &str, e: std::io::Error) -> Failure {
    fail(
        e.raw_os_error().unwrap_or(errno::EIO),
        format!("{what}: {e}"),
    )
}

/// A file some handle has open.
struct KFile {
    /// The daemon's own description, the one the lease is on.
    fd: OwnedFd,
    ino: u64,
    /// The description is open for writing (some handle may write).
    writable: bool,
    /// The daemon holds the lease: nobody else has the file open, and records may exist.
    leased: bool,
    handles: usize,
    /// Channels that may hold records of the file.
    channels: BTreeSet<u32>,
}

struct Handle {
    file: u64,
    conn: u64,
    rights: u32,
}

#[derive(Default)]
struct Inner {
    files: HashMap<u64, KFile>,
    by_ino: HashMap<u64, u64>,
    by_fd: HashMap<RawFd, u64>,
    handles: HashMap<u64, Handle>,
    per_conn: HashMap<u64, usize>,
    next_file: u64,
    next_handle: u64,
}

/// The open files of a kernel file system on the array.
pub struct Files {
    device: Arc<Device>,
    array_size: u64,
    /// The file system's device number.
    dev: u64,
    mount: PathBuf,
    /// [`moneta_abi::kfsproto::FS_EXT4`] or [`moneta_abi::kfsproto::FS_XFS`].
    kind: u32,
    signal: libc::c_int,
    inner: Mutex<Inner>,
    stopped: AtomicBool,
}

impl Files {
    /// The files of the `kind` file system mounted at `mount` (device number `dev`), whose
    /// records go to `device`; lease breaks come as `signal`.
    pub fn new(
        device: Arc<Device>,
        kind: super::Kind,
        dev: u64,
        mount: PathBuf,
        signal: libc::c_int,
    ) -> Files {
        // Clients compare paths with it: absolute, without symbolic links.
        let mount = std::fs::canonicalize(&mount).unwrap_or(mount);
        Files {
            array_size: device.array_size(),
            device,
            dev,
            mount,
            kind: match kind {
                super::Kind::Ext4 => moneta_abi::kfsproto::FS_EXT4,
                super::Kind::Xfs => moneta_abi::kfsproto::FS_XFS,
            },
            signal,
            inner: Mutex::default(),
            stopped: AtomicBool::new(false),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Which file system this is and where it is mounted (`KFS_INFO`).
    pub fn info(&self) -> KfsReply {
        use std::os::unix::ffi::OsStrExt;
        KfsReply::Info {
            kind: self.kind,
            mount: self.mount.as_os_str().as_bytes().to_vec(),
        }
    }

    /// Whether [`Files::shutdown`] ran.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// `OP_KFS_OPEN`: a handle on the file `fd` (the client's description) is open on.
    pub fn open(&self, conn: u64, fd: OwnedFd) -> Result<KfsReply, Failure> {
        let st = rustix::fs::fstat(&fd).map_err(|e| io_fail("fstat", e.into()))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(fail(
                errno::EINVAL,
                "the descriptor is not a regular file's",
            ));
        }
        if st.st_dev != self.dev {
            return Err(fail(
                libc::EXDEV,
                format!(
                    "the file is not on the kernel file system this daemon serves ({})",
                    self.mount.display()
                ),
            ));
        }
        let fl = sys::status_flags(fd.as_fd()).map_err(|e| io_fail("fcntl", e))?;
        if fl & libc::O_PATH != 0 {
            return Err(fail(
                errno::EBADF,
                "the descriptor was opened with O_PATH: it may neither read nor write",
            ));
        }
        let rights = match fl & libc::O_ACCMODE {
            libc::O_RDONLY => RIGHT_READ,
            libc::O_WRONLY => RIGHT_WRITE,
            _ => RIGHT_READ | RIGHT_WRITE,
        };
        let ino = st.st_ino;
        if self.inner().per_conn.get(&conn).copied().unwrap_or(0) >= MAX_HANDLES_PER_CONNECTION {
            return Err(fail(
                errno::EMFILE,
                format!("a connection holds at most {MAX_HANDLES_PER_CONNECTION} handles"),
            ));
        }
        // The daemon's own description, opened outside the lock: an open waits for any lease
        // on the file (its own too, which the watcher then breaks). It is read-only until a
        // handle may write: a description open for writing keeps the file from being run.
        let write = rights & RIGHT_WRITE != 0;
        let have = {
            let inner = self.inner();
            inner
                .by_ino
                .get(&ino)
                .map(|id| inner.files.get(id).is_some_and(|f| f.writable))
        };
        let own = match have {
            Some(writable) if writable || !write => None,
            _ => Some(self.reopen(&fd, ino, write)?),
        };
        // The client's copy goes now: a lease needs it gone.
        drop(fd);
        let mut inner = self.inner();
        let file = match (inner.by_ino.get(&ino).copied(), own) {
            (Some(id), None) => id,
            (Some(id), Some(own)) => {
                // A writable description replaces a read-only one.
                let inner = &mut *inner;
                let f = inner.files.get_mut(&id).expect("an indexed file");
                if write && !f.writable {
                    if f.leased {
                        self.revoke(id, f);
                        sys::drop_lease(f.fd.as_fd());
                        f.leased = false;
                    }
                    inner.by_fd.remove(&f.fd.as_raw_fd());
                    inner.by_fd.insert(own.as_raw_fd(), id);
                    f.fd = own;
                    f.writable = true;
                }
                id
            }
            (None, None) => {
                // Closed by another connection meanwhile: the caller opens again.
                return Err(fail(errno::EAGAIN, "the file was closed meanwhile; retry"));
            }
            (None, Some(own)) => {
                inner.next_file += 1;
                let id = inner.next_file;
                inner.by_fd.insert(own.as_raw_fd(), id);
                inner.by_ino.insert(ino, id);
                inner.files.insert(
                    id,
                    KFile {
                        fd: own,
                        ino,
                        writable: write,
                        leased: false,
                        handles: 0,
                        channels: BTreeSet::new(),
                    },
                );
                id
            }
        };
        inner.files.get_mut(&file).expect("known file").handles += 1;
        inner.next_handle += 1;
        let handle = inner.next_handle;
        inner.handles.insert(handle, Handle { file, conn, rights });
        *inner.per_conn.entry(conn).or_default() += 1;
        Ok(KfsReply::Opened {
            handle,
            size: st.st_size as u64,
            rights,
        })
    }

    /// Opens the daemon's own description of the file `fd` is open on, for reading, and for
    /// writing too with `write`.
    fn reopen(&self, fd: &OwnedFd, ino: u64, write: bool) -> Result<OwnedFd, Failure> {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let access = if write {
            rustix::fs::OFlags::RDWR
        } else {
            rustix::fs::OFlags::RDONLY
        };
        let own = rustix::fs::open(
            path.as_str(),
            access | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| {
            io_fail(
                "the daemon cannot open the file for itself (immutable, append-only or being \
                 executed?)",
                e.into(),
            )
        })?;
        let st = rustix::fs::fstat(&own).map_err(|e| io_fail("fstat", e.into()))?;
        if st.st_ino != ino || st.st_dev != self.dev {
            return Err(fail(errno::EIO, "the file changed while it was opened"));
        }
        sys::notify_breaks(own.as_fd(), self.signal).map_err(|e| io_fail("fcntl", e))?;
        Ok(own)
    }

    fn handle(inner: &Inner, conn: u64, handle: u64) -> Result<(u64, u32), Failure> {
        match inner.handles.get(&handle) {
            Some(h) if h.conn == conn => Ok((h.file, h.rights)),
            _ => Err(fail(errno::EBADF, format!("no handle {handle}"))),
        }
    }

    /// Takes the lease on `f` if it is not held: its dirty pages written back and its cached
    /// pages dropped.
    fn lease(f: &mut KFile) -> Result<(), Failure> {
        if f.leased {
            return Ok(());
        }
        match sys::take_lease(f.fd.as_fd()) {
            Ok(true) => {}
            Ok(false) => {
                return Err(fail(
                    errno::EAGAIN,
                    "the file is open elsewhere through the kernel: use the kernel for it \
                     until it is closed there",
                ))
            }
            Err(e) => return Err(io_fail("cannot lease the file", e)),
        }
        match sys::flush_cache(f.fd.as_fd()) {
            Ok(true) => {
                f.leased = true;
                Ok(())
            }
            Ok(false) => {
                sys::drop_lease(f.fd.as_fd());
                Err(fail(
                    errno::EAGAIN,
                    "the kernel's page cache still holds the file's pages: use the kernel",
                ))
            }
            Err(e) => {
                sys::drop_lease(f.fd.as_fd());
                Err(io_fail("cannot write the file's pages back", e))
            }
        }
    }

    /// Revokes every channel's records of file `id`, waiting until no request that used them
    /// is in flight.
    fn revoke(&self, id: u64, f: &mut KFile) {
        for channel in std::mem::take(&mut f.channels) {
            // A channel closed since has lost its records with it.
            let _ = self
                .device
                .update(vec![TableOp::RemoveFile { channel, file: id }]);
        }
    }

    /// The channel records go to: the connection must have one.
    fn channel(channel: Option<u32>) -> Result<u32, Failure> {
        channel.ok_or_else(|| {
            fail(
                errno::EINVAL,
                "this connection has no channel to install records in",
            )
        })
    }

    /// `OP_KFS_MAP`.
    pub fn map(
        &self,
        conn: u64,
        channel: Option<u32>,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<KfsReply, Failure> {
        let channel = Self::channel(channel)?;
        let mut inner = self.inner();
        let (id, rights) = Self::handle(&inner, conn, handle)?;
        let f = inner.files.get_mut(&id).expect("a handle's file");
        Self::lease(f)?;
        self.map_leased(id, f, channel, rights, offset, len)
            .map(KfsReply::Map)
    }

    fn size(f: &KFile) -> Result<u64, Failure> {
        rustix::fs::fstat(&f.fd)
            .map(|st| st.st_size as u64)
            .map_err(|e| io_fail("fstat", e.into()))
    }

    /// Maps `[offset, offset + len)` of leased file `id` and installs its channel extents.
    fn map_leased(
        &self,
        id: u64,
        f: &mut KFile,
        channel: u32,
        rights: u32,
        offset: u64,
        len: u64,
    ) -> Result<KfsMap, Failure> {
        let size = Self::size(f)?;
        let end = offset.saturating_add(len).min(size);
        let mut extents = Vec::new();
        if offset >= end {
            return Ok(KfsMap { size, extents });
        }
        let map = sys::fiemap(f.fd.as_fd(), offset, end).map_err(|e| io_fail("FIEMAP", e))?;
        let mut ops = Vec::new();
        let mut at = offset;
        let zeros = |logical: u64, len: u64| KfsExtent {
            logical,
            physical: 0,
            len,
            kind: kind::ZEROS,
            rights: 0,
        };
        let mut full = false;
        for e in map {
            // Room for a hole before it and the extent itself; the client asks again for
            // the rest.
            if extents.len() + 2 > MAX_KFS_EXTENTS {
                full = true;
                break;
            }
            let (ls, le) = (e.logical.max(at), e.logical.saturating_add(e.len).min(end));
            if le <= ls {
                continue;
            }
            if ls > at {
                extents.push(zeros(at, ls - at));
            }
            let physical = e.physical + (ls - e.logical);
            let mut x = KfsExtent {
                logical: ls,
                physical,
                len: le - ls,
                kind: kind::CHANNEL,
                rights: if e.flags & flags::SHARED != 0 {
                    rights & !RIGHT_WRITE
                } else {
                    rights
                },
            };
            if e.flags & flags::KERNEL_ONLY != 0
                || x.rights == 0
                || physical
                    .checked_add(x.len)
                    .is_none_or(|pe| pe > self.array_size)
            {
                x = KfsExtent {
                    physical: 0,
                    kind: kind::KERNEL,
                    rights: 0,
                    ..x
                };
            } else if e.flags & flags::UNWRITTEN != 0 {
                x = zeros(ls, le - ls);
            } else {
                ops.push(TableOp::Insert {
                    channel,
                    start: physical,
                    len: x.len,
                    rights: x.rights as u8,
                    file: id,
                });
            }
            extents.push(x);
            at = le;
        }
        if at < end && !full {
            // A hole to the end of the range.
            extents.push(zeros(at, end - at));
        }
        if !ops.is_empty() {
            f.channels.insert(channel);
            self.device.update(ops).map_err(|e| {
                fail(
                    errno::ENOSPC,
                    format!("cannot install the file's records: {e}"),
                )
            })?;
        }
        Ok(KfsMap { size, extents })
    }

    /// `OP_KFS_ALLOCATE`.
    pub fn allocate(
        &self,
        conn: u64,
        channel: Option<u32>,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<KfsReply, Failure> {
        let channel = Self::channel(channel)?;
        let mut inner = self.inner();
        let (id, rights) = Self::handle(&inner, conn, handle)?;
        if rights & RIGHT_WRITE == 0 {
            return Err(fail(errno::EBADF, "the handle is not open for writing"));
        }
        let f = inner.files.get_mut(&id).expect("a handle's file");
        Self::lease(f)?;
        self.revoke(id, f);
        let size = Self::size(f)?;
        let end = offset + len;
        let mut fill = Vec::new();
        if offset < size {
            let mut at = offset;
            let stop = end.min(size);
            let map = sys::fiemap(f.fd.as_fd(), offset, stop).map_err(|e| io_fail("FIEMAP", e))?;
            for e in map {
                let (ls, le) = (e.logical.max(at), e.logical.saturating_add(e.len).min(stop));
                if le <= ls {
                    continue;
                }
                if ls > at {
                    fill.push((at, ls));
                }
                if e.flags & flags::UNWRITTEN != 0 && e.flags & flags::KERNEL_ONLY == 0 {
                    fill.push((ls, le));
                }
                at = le;
            }
            if at < stop {
                fill.push((at, stop));
            }
        }
        if end > size {
            fill.push((offset.max(size), end));
        }
        let zeros = vec![0u8; ZERO_CHUNK];
        for (s, e) in fill {
            let mut at = s;
            while at < e {
                let n = ((e - at) as usize).min(ZERO_CHUNK);
                let w = rustix::io::pwrite(&f.fd, &zeros[..n], at)
                    .map_err(|e| io_fail("cannot allocate", e.into()))?;
                at += w as u64;
            }
        }
        match sys::flush_cache(f.fd.as_fd()) {
            Ok(true) => {}
            Ok(false) => {
                return Err(fail(
                    errno::EIO,
                    "the kernel's page cache kept the file's pages after writing them back",
                ))
            }
            Err(e) => return Err(io_fail("cannot write the file's pages back", e)),
        }
        self.map_leased(id, f, channel, rights, offset, len)
            .map(KfsReply::Map)
    }

    /// `OP_KFS_CLOSE`: the caller's channel loses its records of the file.
    pub fn close(&self, conn: u64, channel: Option<u32>, handle: u64) -> Result<(), Failure> {
        let mut inner = self.inner();
        Self::handle(&inner, conn, handle)?;
        self.close_locked(&mut inner, channel, handle);
        Ok(())
    }

    fn close_locked(&self, inner: &mut Inner, channel: Option<u32>, handle: u64) {
        let Some(h) = inner.handles.remove(&handle) else {
            return;
        };
        if let Some(n) = inner.per_conn.get_mut(&h.conn) {
            *n -= 1;
            if *n == 0 {
                inner.per_conn.remove(&h.conn);
            }
        }
        let f = inner.files.get_mut(&h.file).expect("a handle's file");
        f.handles -= 1;
        if let Some(c) = channel {
            if f.channels.remove(&c) {
                let _ = self.device.update(vec![TableOp::RemoveFile {
                    channel: c,
                    file: h.file,
                }]);
            }
        }
        if f.handles == 0 {
            let mut f = inner.files.remove(&h.file).expect("a handle's file");
            self.revoke(h.file, &mut f);
            if f.leased {
                sys::drop_lease(f.fd.as_fd());
            }
            inner.by_fd.remove(&f.fd.as_raw_fd());
            inner.by_ino.remove(&f.ino);
        }
    }

    /// A connection ended: its handles close (before its channel goes, so that no record is
    /// revoked from a channel given to someone else meanwhile).
    pub fn end_connection(&self, conn: u64, channel: Option<u32>) {
        let mut inner = self.inner();
        let mine: Vec<u64> = inner
            .handles
            .iter()
            .filter(|(_, h)| h.conn == conn)
            .map(|(k, _)| *k)
            .collect();
        for h in mine {
            self.close_locked(&mut inner, channel, h);
        }
        if let Some(c) = channel {
            for f in inner.files.values_mut() {
                f.channels.remove(&c);
            }
        }
    }

    /// The lease on description `fd` is being broken: revoke, then give it back.
    pub fn lease_broken(&self, fd: RawFd) {
        let mut inner = self.inner();
        let Some(id) = inner.by_fd.get(&fd).copied() else {
            return;
        };
        let f = inner.files.get_mut(&id).expect("an indexed file");
        if f.leased {
            self.revoke(id, f);
            sys::drop_lease(f.fd.as_fd());
            f.leased = false;
            tracing::debug!(ino = f.ino, "lease broken: records revoked");
        }
    }

    /// Answers every break in progress, signalled or not.
    pub fn sweep(&self) {
        let broken: Vec<RawFd> = {
            let inner = self.inner();
            inner
                .files
                .values()
                .filter(|f| f.leased && sys::lease_state(f.fd.as_fd()) != Some(libc::F_WRLCK))
                .map(|f| f.fd.as_raw_fd())
                .collect()
        };
        for fd in broken {
            self.lease_broken(fd);
        }
    }

    /// Revokes every record and gives every lease back (the daemon stops).
    pub fn shutdown(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        let mut inner = self.inner();
        let ids: Vec<u64> = inner.files.keys().copied().collect();
        for id in ids {
            let mut f = inner.files.remove(&id).expect("listed");
            self.revoke(id, &mut f);
            if f.leased {
                sys::drop_lease(f.fd.as_fd());
            }
        }
        inner.handles.clear();
        inner.by_fd.clear();
        inner.by_ino.clear();
        inner.per_conn.clear();
    }
}
