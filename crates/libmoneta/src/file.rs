//! Files on nvfs through the channel (Moneta-D §2.2, §4.2, §4.3).
//!
//! A [`Moneta`] is a process's connection: one control socket to `monetad` and the channel that
//! comes with it, shared by every thread and every open [`File`]. Opening a file asks the
//! permission manager for a handle; after that, reads and writes inside the file go straight to
//! the device through the channel, without a system call. Each open file keeps a *translation
//! map* from file offsets to array addresses, filled on demand:
//!
//! - an offset the map does not cover is a **soft miss**: the library asks the manager for the
//!   extents there (`FS_LOOKUP`), which also installs their permission records in the channel;
//! - a command that completes with `PERMISSION_MISS` (the record was evicted, or revoked by a
//!   truncate) is a **hard miss**: the library forgets that offset's translation, asks again
//!   and retries from the first byte that did not complete;
//! - a write past the end or into a hole goes through the manager's extend call, which
//!   allocates whole chunks, zeroed, and grows the file.
//!
//! Commands carry the file's layout tag from the last lookup, and the device lets them use only
//! records with that tag; a lookup answering with a new tag (space has left the file since)
//! empties the map. So a translation made before another process truncated the file never
//! reaches the freed space once it belongs to another file, even when this process's channel
//! holds records over it for that file.
//!
//! The cached size is a hint. It can be too large only while the map holds no records past the
//! true end: a truncate in any process revokes every channel's records from the chunk of the
//! new end on, so a stale larger size always meets a hard miss first. It can be too small (the
//! file grew through another descriptor), so a read that the cached size would cut short asks
//! the manager first (a lookup, which answers with the size of the moment).
//!
//! ```
//! # let _daemon = monetad::testing::Daemon::start();
//! use libmoneta::{Moneta, OpenOptions};
//!
//! let m = Moneta::connect_default()?;
//! let f = m.open("/notes.txt", OpenOptions::new().read(true).write(true).create(true))?;
//! f.write_at(b"hello, nvm", 0)?;
//! let mut buf = [0u8; 5];
//! assert_eq!(f.read_at(&mut buf, 0)?, 5);
//! assert_eq!(&buf, b"hello");
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

mod data;
mod hint;
mod inplace;
mod map;
mod open;
mod posted;

use std::io::{self, IoSlice, IoSliceMut, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use moneta_abi::control::{RIGHT_READ, RIGHT_WRITE};
use moneta_abi::fsproto::{FsReply, FsRequest, FsStat, Target, WireTime, APPEND};
use moneta_abi::Completion;

use crate::channel::Channel;
use crate::generation::sharing_stamp;
use crate::policy::Policy;
use crate::position::Position;
use crate::ClientError;

pub use crate::connection::{Connector, DirEntry, FileState, Handover, Moneta, OpenOptions, Stats};
use crate::{bad_reply, errno};
use map::Map;
pub(crate) use map::Prepared;

/// An open file on nvfs.
pub struct File {
    m: Moneta,
    /// The daemon's handle, on the connection of channel `epoch` of `m`.
    handle: AtomicU64,
    epoch: AtomicU64,
    ino: u64,
    readable: bool,
    writable: bool,
    append: std::sync::atomic::AtomicBool,
    is_dir: bool,
    pos: Position,
    map: RwLock<Map>,
    /// Serializes this file's lookups and extends, so that sizes from replies apply in order.
    miss: Mutex<()>,
    /// 0: the connection's policy; else [`encode_policy`].
    policy: AtomicU64,
    /// Closed by [`File::close`]: nothing left for `Drop`.
    closed: std::sync::atomic::AtomicBool,
    /// Reads and writes through the file's own pages ([`File::set_in_place`]).
    in_place: inplace::InPlace,
    /// A size was published under a size lease since the last `fsync` ([`File::sync_all`]).
    grown: std::sync::atomic::AtomicBool,
    /// [`sharing_stamp`] when this process image opened the file; [`HANDED_OVER`] for a file
    /// another image handed over. A close may be posted only while it stands
    /// ([`File::close_soon`]).
    born: u64,
    /// The channel knows that the process asks for locks on the file
    /// ([`Channel::note_locking`], noted once).
    locking_noted: std::sync::atomic::AtomicBool,
    /// The path of a file this process made empty for reading and writing, until its first
    /// extend says whether it grew in room a size lease gave ([`File::watch_growth`]).
    growth_path: Mutex<Option<Box<[u8]>>>,
    /// Writes returned before their completions, under a sole lease ([`posted`]).
    posted: posted::PostedWrites,
}

/// [`File::born`] of a file another program image handed over.
const HANDED_OVER: u64 = u64::MAX;

fn encode_policy(p: Policy) -> u64 {
    match p {
        Policy::Fixed(Completion::Dma) => 1,
        Policy::Fixed(Completion::Forward) => 2,
        Policy::Fixed(Completion::Sleep) => 3,
        Policy::Auto { spin_max } => 4 + spin_max as u64,
    }
}

fn decode_policy(v: u64) -> Option<Policy> {
    match v {
        0 => None,
        1 => Some(Policy::Fixed(Completion::Dma)),
        2 => Some(Policy::Fixed(Completion::Forward)),
        3 => Some(Policy::Fixed(Completion::Sleep)),
        n => Some(Policy::Auto {
            spin_max: (n - 4) as usize,
        }),
    }
}

impl File {
    /// A file the manager has just opened on `m`'s connection of channel `epoch`.
    pub(crate) fn opened(
        m: Moneta,
        handle: u64,
        epoch: u64,
        rights: u32,
        flags: i32,
        stat: &FsStat,
        pos: Position,
    ) -> File {
        File {
            m,
            handle: AtomicU64::new(handle),
            epoch: AtomicU64::new(epoch),
            ino: stat.ino,
            readable: rights & RIGHT_READ != 0,
            writable: rights & RIGHT_WRITE != 0,
            append: std::sync::atomic::AtomicBool::new(flags & libc::O_APPEND != 0),
            is_dir: stat.mode & libc::S_IFMT == libc::S_IFDIR,
            pos,
            map: RwLock::new(Map {
                size: stat.size,
                gen: 0,
                file: 0,
                ext: Vec::new(),
            }),
            miss: Mutex::new(()),
            policy: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            in_place: inplace::InPlace::from_env(),
            grown: std::sync::atomic::AtomicBool::new(false),
            born: sharing_stamp(),
            locking_noted: std::sync::atomic::AtomicBool::new(false),
            growth_path: Mutex::new(None),
            posted: Default::default(),
        }
    }

    /// Remembers `path` (the file was made empty, for reading and writing) until the first
    /// extend: if a size lease then gives it room, the process makes growing files at that
    /// path, and opens that make one again ask for room at once ([`Moneta::open_flags`]).
    pub(crate) fn watch_growth(&self, path: Vec<u8>) {
        *self.growth_path.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.into());
    }

    /// The room an open gave the file (`FS_OPEN_ROOM`): its extents go into the map, as an
    /// extend's would, and the size lease over them is in the channel already.
    pub(crate) fn take_room(&self, m: crate::control::Mapped) {
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        self.apply_mapped(m);
    }

    /// What the file's first extend says about its growth ([`File::watch_growth`]).
    pub(super) fn note_growth(&self, handle: u64) {
        let path = self
            .growth_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(path) = path {
            if self.ch().leased_size(handle).is_some() {
                self.m.inner.note_roomy(path);
            }
        }
    }

    /// What another program image needs to rebuild this file (see [`Moneta::handover`]).
    #[doc(hidden)]
    pub fn state(&self) -> Result<FileState, ClientError> {
        Ok(FileState {
            handle: self.h()?,
            ino: self.ino,
            readable: self.readable,
            writable: self.writable,
            append: self.appends(),
            is_dir: self.is_dir,
            position_cell: self.pos.locate(),
            position: self.pos.get(),
        })
    }

    /// Rebuilds a file another program image handed over, with its handle `handle` on `m`.
    #[doc(hidden)]
    pub fn adopt(m: &Moneta, handle: u64, st: &FileState) -> Result<File, ClientError> {
        let pos = match st.position_cell.map(|(fd, i)| Position::adopt(fd, i)) {
            Some(Ok(p)) => p,
            _ => {
                let p = Position::new()?;
                p.lock().set(st.position);
                p
            }
        };
        m.inner.open.fetch_add(1, Ordering::AcqRel);
        Ok(File {
            m: m.clone(),
            handle: AtomicU64::new(handle),
            epoch: AtomicU64::new(m.inner.epoch.load(Ordering::Acquire)),
            ino: st.ino,
            readable: st.readable,
            writable: st.writable,
            append: std::sync::atomic::AtomicBool::new(st.append),
            is_dir: st.is_dir,
            pos,
            map: RwLock::new(Map {
                size: 0,
                gen: 0,
                file: 0,
                ext: Vec::new(),
            }),
            miss: Mutex::new(()),
            policy: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            in_place: inplace::InPlace::from_env(),
            grown: std::sync::atomic::AtomicBool::new(false),
            born: HANDED_OVER,
            locking_noted: std::sync::atomic::AtomicBool::new(false),
            growth_path: Mutex::new(None),
            posted: Default::default(),
        })
    }

    /// Whether the file was opened for reading.
    pub(crate) fn readable(&self) -> bool {
        self.readable
    }

    /// Whether the file was opened for writing.
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// The daemon's handle (on this process's connection).
    pub fn handle(&self) -> u64 {
        self.h().unwrap_or(0)
    }

    /// The handle, after making sure it and the channel belong to this process: in a forked
    /// child, the first use connects and maps the parent's handle to the inherited one.
    #[inline]
    pub(crate) fn h(&self) -> Result<u64, ClientError> {
        let i = &self.m.inner;
        if i.fresh() && self.epoch.load(Ordering::Acquire) == i.epoch.load(Ordering::Acquire) {
            return Ok(self.handle.load(Ordering::Relaxed));
        }
        self.rebind()
    }

    #[cold]
    fn rebind(&self) -> Result<u64, ClientError> {
        let i = &self.m.inner;
        i.refresh()?;
        let (e, h) = (
            self.epoch.load(Ordering::Acquire),
            self.handle.load(Ordering::Relaxed),
        );
        let (h, now) = i.carry_handle(e, h)?;
        if now == e {
            return Ok(h);
        }
        // The translation map held records of the old channel.
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.ext.clear();
        map.gen += 1;
        self.handle.store(h, Ordering::Relaxed);
        self.epoch.store(now, Ordering::Release);
        Ok(h)
    }

    /// The file's own pages, to map with `mmap` at the file's offsets (a memory drive): a
    /// descriptor open for reading and writing if `write` (the file must be open for
    /// writing), else for reading only, and the file's attributes. A store through a shared
    /// mapping of it is at once what every read of the file sees, and a write of the file is
    /// at once in every mapping. The kernel enforces the descriptor's mode: a read-only one
    /// gives no writable shared mapping. `ENODEV` where the array cannot hand pages out (one
    /// with data checksums).
    pub fn pages(&self, write: bool) -> Result<(std::os::fd::OwnedFd, FsStat), ClientError> {
        if self.is_dir {
            return Err(errno(libc::ENODEV));
        }
        let h = self.h()?;
        // Stores and loads through the pages do not wait for commands in flight.
        self.settle_reporting()?;
        let (stat, fd) = self.m.inner.live()?.control().fs_map(h, write)?;
        Ok((fd, stat))
    }

    /// Whether the file is a directory (as its open found it: a file's type never changes).
    pub fn is_dir(&self) -> bool {
        self.is_dir
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The connection the file belongs to.
    pub fn moneta(&self) -> &Moneta {
        &self.m
    }

    /// Overrides the connection's completion policy for this file (`None` restores it).
    pub fn set_policy(&self, p: Option<Policy>) {
        self.policy
            .store(p.map_or(0, encode_policy), Ordering::Relaxed);
    }

    /// The completion policy in force for this file.
    pub fn policy(&self) -> Policy {
        decode_policy(self.policy.load(Ordering::Relaxed)).unwrap_or(self.m.inner.policy)
    }

    #[inline]
    fn mode_for(&self, len: usize) -> Completion {
        self.policy().mode(len)
    }

    /// The channel, once [`File::h`] succeeded.
    #[inline]
    fn ch(&self) -> &Channel {
        self.m.inner.cur()
    }

    /// The connection's channel (see [`Moneta::channel`]).
    pub fn channel(&self) -> &Channel {
        self.m.channel()
    }

    /// Whether writes go to the end (`O_APPEND`).
    pub fn appends(&self) -> bool {
        self.append.load(Ordering::Relaxed)
    }

    /// Turns `O_APPEND` on or off (`fcntl(F_SETFL)`).
    pub fn set_append(&self, on: bool) {
        self.append.store(on, Ordering::Relaxed);
    }

    /// Where a write asked for at `off` goes: `None` means at the end.
    pub(crate) fn write_offset(&self, off: u64) -> Option<u64> {
        (!self.appends()).then_some(off)
    }

    /// Refuses a read on a directory or a handle without the right.
    pub(crate) fn check_access(&self, write: bool) -> Result<(), ClientError> {
        if write {
            if !self.writable {
                return Err(errno(libc::EBADF));
            }
        } else {
            if self.is_dir {
                return Err(errno(libc::EISDIR));
            }
            if !self.readable {
                return Err(errno(libc::EBADF));
            }
        }
        Ok(())
    }

    /// Refuses ranges past the largest file offset.
    pub(crate) fn check_range(&self, off: u64, len: u64, write: bool) -> Result<(), ClientError> {
        match off.checked_add(len) {
            Some(end) if off <= i64::MAX as u64 && end <= i64::MAX as u64 => Ok(()),
            _ => Err(errno(if write { libc::EFBIG } else { libc::EINVAL })),
        }
    }

    /// Reserves `len` bytes at the end of the file (atomically with other appenders, in any
    /// process); returns where they start.
    pub(crate) fn append_at(&self, len: u64) -> Result<u64, ClientError> {
        if len == 0 {
            return self.len();
        }
        let (_, size) = self.lookup(APPEND, len, true)?;
        size.checked_sub(len)
            .ok_or_else(|| bad_reply("append size"))
    }

    /// Drops the translation of `at` (after a hard miss there seen by an asynchronous request).
    pub(crate) fn forget_at(&self, at: u64) {
        let mut f = 0;
        let _ = self.hard_miss_at(at, &mut f);
    }

    /// Writes all of `data` at exactly `off` (no append redirection).
    pub(crate) fn write_exact_at_with(
        &self,
        data: &[u8],
        off: u64,
        mode: Completion,
    ) -> Result<(), ClientError> {
        self.write_inner(data, Some(off), mode).map(|_| ())
    }

    /// Attributes (`fstat(2)`).
    pub fn stat(&self) -> Result<FsStat, ClientError> {
        self.m.fs_stat_reply(FsRequest::Stat {
            target: Target::Handle(self.h()?),
        })
    }

    /// The file's size as the manager knows it now.
    pub fn len(&self) -> Result<u64, ClientError> {
        Ok(self.stat()?.size)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool, ClientError> {
        Ok(self.len()? == 0)
    }

    /// `ftruncate(2)`.
    pub fn set_len(&self, size: u64) -> Result<(), ClientError> {
        if !self.writable {
            return Err(errno(libc::EINVAL));
        }
        // The truncation must not overtake a write posted before it.
        self.settle_reporting()?;
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        self.m.fs_empty(FsRequest::Truncate {
            target: Target::Handle(self.h()?),
            size,
        })?;
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.ext.clear();
        map.size = size;
        map.gen += 1;
        Ok(())
    }

    /// `fallocate(2)` mode 0 and `posix_fallocate(3)`: allocates every hole of
    /// `[off, off + len)` (zeroed) and grows the size to `off + len` if that is larger, so
    /// that later writes there cannot fail for want of space. When the device lacks the space
    /// it fails at once with `ENOSPC` and changes nothing.
    ///
    /// With `keep_size` (`FALLOC_FL_KEEP_SIZE`) the size stays as it is: the holes inside it
    /// are allocated; nvfs keeps no space past a file's last chunk, so for the part beyond it
    /// the call only checks that the device has the room now (`ENOSPC` otherwise) and reserves
    /// nothing there.
    pub fn allocate(&self, off: u64, len: u64, keep_size: bool) -> Result<(), ClientError> {
        if self.is_dir {
            return Err(errno(libc::ENODEV));
        }
        self.check_access(true)?;
        if len == 0 {
            return Err(errno(libc::EINVAL));
        }
        self.check_range(off, len, true)?;
        self.h()?;
        let end = off + len;
        if !keep_size {
            self.lookup(off, len, true)?;
            return Ok(());
        }
        let size = self.len()?;
        if off < size {
            self.lookup(off, end.min(size) - off, true)?;
        }
        if end > size {
            let fs = self.m.statfs()?;
            let cs = fs.chunk_size.max(1);
            let first = size.max(off).div_ceil(cs);
            let need = end.div_ceil(cs).saturating_sub(first);
            if need > fs.chunks_free {
                return Err(ClientError::Refused {
                    errno: libc::ENOSPC,
                    message: format!(
                        "no space left: {need} chunks needed, {} free",
                        fs.chunks_free
                    ),
                });
            }
        }
        Ok(())
    }

    /// `fsync(2)`: at the daemon's `host` durability level, the file's data and every metadata
    /// change before the call durable against a crash of the machine (one flush, shared with
    /// the other callers of the moment); at the `device` level, where every change is in the
    /// array once its call returns, answered here with no call at all (the channel header's
    /// `FS_FSYNC_IS_ORDER`; docs/nvfs.md, "Durability levels"), and on a volatile array, where
    /// nothing outlives the daemon, likewise (`FS_VOLATILE`).
    pub fn sync_all(&self) -> Result<(), ClientError> {
        let handle = self.h()?;
        // The writes it covers must have completed, posted ones too.
        self.settle_reporting()?;
        let flags = self.ch().header().fs_flags.load(Ordering::Acquire);
        if flags & moneta_abi::FS_VOLATILE != 0 {
            // Every write of this file that returned is in the array, the daemon reads a
            // size published under a size lease whenever anything depends on it, and nothing
            // is kept past the daemon: there is nothing to make durable.
            return Ok(());
        }
        if flags & moneta_abi::FS_FSYNC_IS_ORDER != 0 && !self.grown.swap(false, Ordering::AcqRel) {
            // The daemon keeps every change in the array as it makes it, and every write of
            // this file that returned is in the array: there is nothing to make durable.
            // A size published under a size lease is the exception: the call applies it.
            return Ok(());
        }
        if self.is_dir {
            // A directory has no data of its own: its `fsync` owes every metadata change
            // before it, which the daemon's durability page may show durable already
            // (docs/nvfs.md, "Durability levels").
            let ch = self.ch();
            if ch.metadata_durable() {
                return match ch.control().alive() {
                    true => Ok(()),
                    false => Err(ClientError::DeviceGone),
                };
            }
        } else {
            // A size published under a size lease is applied by the call, which must then be
            // made. Otherwise a file read and written in place makes its own data durable,
            // and may find no metadata left to make so.
            if !self.grown.swap(false, Ordering::AcqRel) {
                if let Some(done) = self.sync_in_place() {
                    return done;
                }
            }
            self.count_sync_toward_in_place(flags);
        }
        self.m.fs_empty(FsRequest::Fsync { handle })
    }

    /// `fdatasync(2)` (nvfs keeps data and metadata together: the same as [`File::sync_all`]).
    pub fn sync_data(&self) -> Result<(), ClientError> {
        self.sync_all()
    }

    /// A barrier on the process's channel (Moneta §IV): returns once every request submitted
    /// on it before the call (by any thread, through any file, including asynchronous ones not
    /// yet reaped) has completed, and the device issues no request submitted after the call
    /// before then. It orders; it does not persist (that is [`File::sync_all`]).
    pub fn barrier(&self) -> Result<(), ClientError> {
        self.channel().barrier(self.policy().mode(0))
    }

    /// `fchmod(2)`.
    pub fn chmod(&self, mode: u32) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Chmod {
            target: Target::Handle(self.h()?),
            mode,
        })
    }

    /// `fchown(2)`.
    pub fn chown(&self, uid: u32, gid: u32) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Chown {
            target: Target::Handle(self.h()?),
            uid,
            gid,
        })
    }

    /// `futimens(2)`.
    pub fn utimes(&self, atime: WireTime, mtime: WireTime) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Utimes {
            target: Target::Handle(self.h()?),
            atime,
            mtime,
        })
    }

    /// One batch of directory entries from `cookie` (0 to start, else the `next` of the last
    /// entry seen), and whether the directory is exhausted.
    pub fn read_dir_from(&self, cookie: u64) -> Result<(Vec<DirEntry>, bool), ClientError> {
        match self.m.fs(FsRequest::Readdir {
            handle: self.h()?,
            cookie,
        })? {
            FsReply::Dir { entries, end } => Ok((entries, end)),
            _ => Err(bad_reply("readdir reply")),
        }
    }

    /// Closes the file, reporting the daemon's answer (dropping it closes as
    /// [`File::close_soon`] does, silently).
    pub fn close(self) -> Result<(), ClientError> {
        self.closed.store(true, Ordering::Relaxed);
        self.m.inner.open.fetch_sub(1, Ordering::AcqRel);
        self.close_handle(false)
    }

    /// Closes the file; when nothing the program or another process can see depends on the
    /// daemon's answer, without waiting for it (docs/libmoneta.md, "Closes posted"): the
    /// process never asked to lock the file (closing any handle of a file releases the
    /// process's locks on it, which another process may wait for), and this process image
    /// opened it with no fork or handover since (so no other process shares its open file
    /// description, whose `flock` locks its last close releases). The process's next file
    /// call collects the answer; one that refuses the close is dropped. Otherwise as
    /// [`File::close`].
    pub fn close_soon(self) -> Result<(), ClientError> {
        self.closed.store(true, Ordering::Relaxed);
        self.m.inner.open.fetch_sub(1, Ordering::AcqRel);
        self.close_handle(true)
    }

    /// Closes the daemon's handle: posted without waiting when `post` allows and nothing
    /// depends on the answer ([`File::close_soon`]), else waiting for it.
    fn close_handle(&self, post: bool) -> Result<(), ClientError> {
        // The close ends the handle's records: posted writes complete first (and give their
        // tags back whatever happens next), and a failure among them is the close's to report.
        let settled = self.settle_reporting();
        let handle = self.h()?;
        // (The locks are checked as the close is posted, under the lock that a first lock
        // call takes.)
        if post
            && self.born == sharing_stamp()
            && self.m.inner.fresh()
            && settled.is_ok()
            && self.channel().post_close(handle, self.ino)
        {
            return Ok(());
        }
        let closed = self.m.fs_empty(FsRequest::Close { handle });
        settled.and(closed)
    }

    /// Tells the channel, once, that the process asks for locks on the file: its closes must
    /// wait for their answers from now on.
    pub(crate) fn note_locking(&self) {
        if !self.locking_noted.swap(true, Ordering::AcqRel) {
            self.channel().note_locking(self.ino);
        }
    }

    /// `lseek(2)`: the new position.
    pub fn seek(&self, to: SeekFrom) -> Result<u64, ClientError> {
        let mut pos = self.pos.lock();
        let new = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => pos.get().checked_add_signed(d),
            SeekFrom::End(d) => self.len()?.checked_add_signed(d),
        };
        match new {
            Some(n) if n <= i64::MAX as u64 => {
                pos.set(n);
                Ok(n)
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }

    /// The position.
    pub fn position(&self) -> u64 {
        self.pos.get()
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("handle", &self.handle.load(Ordering::Relaxed))
            .field("ino", &self.ino)
            .field("read", &self.readable)
            .field("write", &self.writable)
            .field("append", &self.appends())
            .finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.m.inner.open.fetch_sub(1, Ordering::AcqRel);
        // A forked child that never used its connection has nothing to close: the bundle
        // holding its copies goes when the child does.
        if !self.m.inner.fresh() {
            return;
        }
        let _ = self.close_handle(true);
    }
}

impl io::Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf).map_err(Into::into)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        File::read_vectored(self, bufs).map_err(Into::into)
    }
}

impl io::Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf).map_err(Into::into)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        File::write_vectored(self, bufs).map_err(Into::into)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        File::seek(self, pos).map_err(Into::into)
    }
}

impl io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf).map_err(Into::into)
    }
}

impl io::Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf).map_err(Into::into)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        File::seek(self, pos).map_err(Into::into)
    }
}
