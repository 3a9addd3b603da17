//! The FUSE file system: each kernel request turned into libmoneta calls on the caller's own
//! connection (see `creds.rs`), by path for names and attributes (`nodes.rs`), by handle for
//! open files.
//!
//! Coherence with channel clients: file data are never cached by the kernel (every open
//! answers `FOPEN_DIRECT_IO`, so each `read` and `write` is a request to this server, which
//! reads and writes the array through its channel at once), and entries and attributes are
//! given with a timeout of zero (each path walk asks again). A write through any channel is
//! read through the mount by the next `read`, and the other way round.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use libmoneta::moneta_abi::fsproto::{FsStat, WireTime, UTIME_NOW, UTIME_OMIT};
use libmoneta::{ClientError, LockType, Moneta};

use super::creds::{proc_status, Caller, Pool};
use super::locks::{self, Holder, Owners};
use super::nodes::{NoPath, Nodes, ROOT};

/// How long the kernel may keep an entry or attributes: not at all, so that changes made
/// through channels are seen by the next call through the mount.
const TTL: Duration = Duration::ZERO;

/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// An open file or directory through the mount.
pub struct Open {
    /// The file, on the connection of whoever opened it.
    pub file: libmoneta::File,
    ino: u64,
    /// `O_ACCMODE` bits it was opened with.
    access: i32,
    /// Written through since its times were last set (the manager does not see writes
    /// through channels; the server sets mtime and ctime for them, see `touch`).
    dirty: AtomicBool,
}

/// The file system.
pub struct MountFs {
    pool: Pool,
    nodes: Mutex<Nodes>,
    open: RwLock<HashMap<u64, Arc<Open>>>,
    next_fh: AtomicU64,
    owners: Arc<Owners>,
    waiters: Arc<AtomicUsize>,
}

fn errno(e: &ClientError) -> Errno {
    Errno::from_i32(e.errno())
}

fn no_path(e: NoPath) -> Errno {
    match e {
        NoPath::Unknown | NoPath::Detached => Errno::ENOENT,
    }
}

fn time(t: WireTime) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nsec.min(999_999_999)))
    }
}

fn wire_time(t: Option<TimeOrNow>) -> WireTime {
    match t {
        None => WireTime {
            sec: 0,
            nsec: UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => WireTime {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                // Before the epoch: whole seconds down, nanoseconds up.
                let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                WireTime { sec, nsec }
            }
        },
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dirent_kind(dt: u8) -> FileType {
    match dt {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn attr(s: &FsStat) -> FileAttr {
    FileAttr {
        ino: INodeNo(s.ino),
        size: s.size,
        blocks: s.blocks,
        atime: time(s.atime),
        mtime: time(s.mtime),
        ctime: time(s.ctime),
        crtime: time(s.btime),
        kind: kind(s.mode),
        perm: (s.mode & 0o7777) as u16,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: 0,
        blksize: s.blksize.min(u64::from(u32::MAX)) as u32,
        flags: 0,
    }
}

fn name_bytes(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

impl MountFs {
    /// A file system served through `pool`'s connections.
    pub fn new(pool: Pool) -> MountFs {
        MountFs {
            pool,
            nodes: Mutex::new(Nodes::default()),
            open: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            owners: Arc::new(Owners::default()),
            waiters: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caller's own connection.
    fn conn(&self, req: &Request) -> Result<Moneta, Errno> {
        let c = Caller::of_request(req.uid(), req.gid(), req.pid());
        self.pool.get(&c).map_err(|e| errno(&e))
    }

    fn path(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        self.nodes().path(ino).map_err(no_path)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<Vec<u8>, Errno> {
        self.nodes()
            .child(parent, name_bytes(name))
            .map_err(no_path)
    }

    /// `f` with the caller's connection on the path of `name` in `parent`.
    fn at_child<T>(
        &self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        f: impl FnOnce(&Moneta, &OsStr) -> Result<T, ClientError>,
    ) -> Result<T, Errno> {
        let p = self.child(parent, name)?;
        f(&self.conn(req)?, OsStr::from_bytes(&p)).map_err(|e| errno(&e))
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Open>, Errno> {
        let t = self.open.read().unwrap_or_else(|e| e.into_inner());
        t.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, o: Open) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let mut t = self.open.write().unwrap_or_else(|e| e.into_inner());
        t.insert(fh, Arc::new(o));
        FileHandle(fh)
    }

    fn take_handle(&self, fh: FileHandle) -> Option<Arc<Open>> {
        let mut t = self.open.write().unwrap_or_else(|e| e.into_inner());
        t.remove(&fh.0)
    }

    /// Open files of `ino`.
    fn handles_of(&self, ino: u64) -> Vec<Arc<Open>> {
        let t = self.open.read().unwrap_or_else(|e| e.into_inner());
        t.values().filter(|o| o.ino == ino).cloned().collect()
    }

    /// Sets mtime and ctime of a file written through `o` since they were last set: the
    /// manager learns of writes inside a file's size only this way, as a close-to-open
    /// network file system does (a write that grows a file sets them in the manager at once).
    fn touch(&self, o: &Open) {
        if o.dirty.swap(false, Ordering::AcqRel) {
            let omit = WireTime {
                sec: 0,
                nsec: UTIME_OMIT,
            };
            let now = WireTime {
                sec: 0,
                nsec: UTIME_NOW,
            };
            if let Err(e) = o.file.utimes(omit, now) {
                eprintln!("moneta mount: cannot set the times of inode {}: {e}", o.ino);
            }
        }
    }

    /// Attributes of `ino`: by its path with the caller's credentials, else (its name went:
    /// an unlinked open file) through an open handle of it.
    fn stat_ino(&self, req: &Request, ino: u64) -> Result<FsStat, Errno> {
        for o in self.handles_of(ino) {
            self.touch(&o);
        }
        let by_path = match self.path(ino) {
            Ok(p) => {
                let m = self.conn(req)?;
                match m.lstat(OsStr::from_bytes(&p)) {
                    Ok(s) if s.ino == ino => Ok(s),
                    Ok(_) => Err(Errno::ENOENT),
                    Err(e) => Err(errno(&e)),
                }
            }
            Err(e) => Err(e),
        };
        match by_path {
            Err(e) if e == Errno::ENOENT => self
                .handles_of(ino)
                .first()
                .ok_or(Errno::ENOENT)
                .and_then(|o| o.file.stat().map_err(|e| errno(&e))),
            other => other,
        }
    }

    /// An entry reply for the file `parent`/`name` whose attributes are `s`.
    fn entry(&self, parent: u64, name: &OsStr, s: &FsStat, reply: ReplyEntry) {
        self.nodes().found(parent, name_bytes(name), s.ino, true);
        reply.entry(&TTL, &attr(s), Generation(u64::from(s.generation)));
    }

    /// Opens `ino` (which must still be the file at its path) with `flags`.
    fn open_ino(&self, req: &Request, ino: u64, flags: i32) -> Result<Open, Errno> {
        let path = self.path(ino)?;
        let m = self.conn(req)?;
        let f = m
            .open_flags(OsStr::from_bytes(&path), flags, 0)
            .map_err(|e| errno(&e))?;
        if f.ino() != ino {
            let _ = f.close();
            return Err(Errno::ENOENT);
        }
        Ok(Open {
            file: f,
            ino,
            access: flags & libc::O_ACCMODE,
            dirty: AtomicBool::new(false),
        })
    }

    fn setattr_inner(
        &self,
        req: &Request,
        ino: u64,
        set: Set,
        fh: Option<FileHandle>,
    ) -> Result<FsStat, Errno> {
        let open = fh.map(|fh| self.handle(fh)).transpose()?;
        let path = self.path(ino);
        let m = self.conn(req)?;
        // The caller's credentials by path; an unlinked open file has none, and then its
        // opener's handle is what is left (as fchmod on that descriptor).
        let by = match (&path, &open) {
            (Ok(p), _) => By::Path(p.as_slice()),
            (Err(_), Some(o)) => By::Handle(&o.file),
            (Err(e), None) => return Err(*e),
        };
        let err = |e: ClientError| errno(&e);
        if let Some(size) = set.size {
            match (&open, &by) {
                // ftruncate: the descriptor's rights, as the kernel checked them.
                (Some(o), _) => o.file.set_len(size).map_err(err)?,
                (None, By::Path(p)) => m.truncate(OsStr::from_bytes(p), size).map_err(err)?,
                (None, By::Handle(f)) => f.set_len(size).map_err(err)?,
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let (u, g) = (set.uid.unwrap_or(u32::MAX), set.gid.unwrap_or(u32::MAX));
            match &by {
                By::Path(p) => m.chown(OsStr::from_bytes(p), u, g, false).map_err(err)?,
                By::Handle(f) => f.chown(u, g).map_err(err)?,
            }
        }
        if let Some(mode) = set.mode {
            match &by {
                By::Path(p) => m.chmod(OsStr::from_bytes(p), mode & 0o7777).map_err(err)?,
                By::Handle(f) => f.chmod(mode & 0o7777).map_err(err)?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let (a, t) = (wire_time(set.atime), wire_time(set.mtime));
            if let Some(o) = &open {
                // Explicit times replace what the writes would have set.
                o.dirty.store(false, Ordering::Release);
            }
            match &by {
                By::Path(p) => m.utimes(OsStr::from_bytes(p), a, t, false).map_err(err)?,
                By::Handle(f) => f.utimes(a, t).map_err(err)?,
            }
        }
        match (&open, &by) {
            (Some(o), _) => o.file.stat().map_err(err),
            (None, By::Path(p)) => {
                let s = m.lstat(OsStr::from_bytes(p)).map_err(err)?;
                if s.ino == ino {
                    Ok(s)
                } else {
                    Err(Errno::ENOENT)
                }
            }
            (None, By::Handle(f)) => f.stat().map_err(err),
        }
    }
}

/// What a setattr changes.
struct Set {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// How a setattr names its file.
enum By<'a> {
    Path(&'a [u8]),
    Handle(&'a libmoneta::File),
}

/// Open flags passed on to the manager: access, appending, truncation, creation. The server
/// adds `O_NOFOLLOW`: the kernel resolves symbolic links itself, so the last component is the
/// inode it asked for, never a link to follow.
const PASSED: i32 = libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL;

impl Filesystem for MountFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // POSIX locks through the manager; O_TRUNC in open (one call, atomic with it); lookups
        // in one directory in parallel; shared mappings of direct-I/O files (Linux 6.6 on).
        let want = InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        let have = config.capabilities();
        let _ = config.add_capabilities(want & have);
        let _ = config.set_max_write(MAX_WRITE);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.at_child(req, parent.0, name, |m, p| m.lstat(p));
        match r {
            Ok(s) => self.entry(parent.0, name, &s, reply),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = match fh {
            Some(fh) => self.handle(fh).and_then(|o| {
                self.touch(&o);
                o.file.stat().map_err(|e| errno(&e))
            }),
            None => self.stat_ino(req, ino.0),
        };
        match r {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = Set {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.setattr_inner(req, ino.0, set, fh) {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.path(ino.0).and_then(|p| {
            self.conn(req)?
                .readlink(OsStr::from_bytes(&p))
                .map_err(|e| errno(&e))
        });
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // nvfs keeps regular files, directories and symbolic links only.
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let r = self.child(parent.0, name).and_then(|p| {
            let m = self.conn(req)?;
            let f = m
                .open_flags(
                    OsStr::from_bytes(&p),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    mode & 0o7777,
                )
                .map_err(|e| errno(&e))?;
            let s = f.stat().map_err(|e| errno(&e));
            let _ = f.close();
            s
        });
        match r {
            Ok(s) => self.entry(parent.0, name, &s, reply),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.at_child(req, parent.0, name, |m, p| m.mkdir(p, mode & 0o7777));
        match r {
            Ok(s) => self.entry(parent.0, name, &s, reply),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.at_child(req, parent.0, name, |m, p| m.unlink(p));
        match r {
            Ok(()) => {
                self.nodes().gone(parent.0, name_bytes(name));
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.at_child(req, parent.0, name, |m, p| m.rmdir(p));
        match r {
            Ok(()) => {
                self.nodes().gone(parent.0, name_bytes(name));
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let r = self.at_child(req, parent.0, link_name, |m, p| {
            m.symlink(target.as_os_str().as_bytes(), p)
        });
        match r {
            Ok(s) => self.entry(parent.0, link_name, &s, reply),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // nvfs has no exchange and no whiteouts.
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let r = self.child(parent.0, name).and_then(|from| {
            let to = self.child(newparent.0, newname)?;
            self.conn(req)?
                .rename(OsStr::from_bytes(&from), OsStr::from_bytes(&to), noreplace)
                .map_err(|e| errno(&e))
        });
        match r {
            Ok(()) => {
                self.nodes()
                    .moved(parent.0, name_bytes(name), newparent.0, name_bytes(newname));
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.path(ino.0).and_then(|from| {
            let to = self.child(newparent.0, newname)?;
            self.conn(req)?
                .link(OsStr::from_bytes(&from), OsStr::from_bytes(&to))
                .map_err(|e| errno(&e))
        });
        match r {
            Ok(s) => self.entry(newparent.0, newname, &s, reply),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let flags = (flags.0 & PASSED & !(libc::O_CREAT | libc::O_EXCL)) | libc::O_NOFOLLOW;
        match self.open_ino(req, ino.0, flags) {
            Ok(o) => {
                let fh = self.add_handle(o);
                reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let o = match self.handle(fh) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match o.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if got == 0 => return reply.error(errno(&e)),
                Err(_) => break,
            }
        }
        reply.data(&buf[..got])
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let o = match self.handle(fh) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        // A file opened with O_APPEND writes at the end the manager places, atomically with
        // every other appender, whatever offset the kernel computed from its own idea of the
        // size.
        match o.file.write_at(data, offset) {
            Ok(n) => {
                o.dirty.store(true, Ordering::Release);
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.owners.flush(lock_owner.0, ino.0);
        if let Ok(o) = self.handle(fh) {
            self.touch(&o);
        }
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.owners.release(fh.0);
        match self.take_handle(fh) {
            Some(o) => {
                self.touch(&o);
                match Arc::try_unwrap(o) {
                    Ok(o) => match o.file.close() {
                        Ok(()) => reply.ok(),
                        Err(e) => reply.error(errno(&e)),
                    },
                    // A lock waiter still holds it; it closes when that one is done.
                    Err(_) => reply.ok(),
                }
            }
            None => reply.error(Errno::EBADF),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.handle(fh).and_then(|o| {
            self.touch(&o);
            o.file.sync_all().map_err(|e| errno(&e))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.open_ino(req, ino.0, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(o) => {
                let fh = self.add_handle(o);
                reply.opened(fh, FopenFlags::empty())
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let o = match self.handle(fh) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        // Offsets are nvfs's cookies: each entry carries the one that continues after it.
        let mut cookie = offset;
        loop {
            let (entries, end) = match o.file.read_dir_from(cookie) {
                Ok(r) => r,
                Err(e) => return reply.error(errno(&e)),
            };
            for e in &entries {
                if reply.add(
                    INodeNo(e.ino),
                    e.next,
                    dirent_kind(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    return reply.ok();
                }
                cookie = e.next;
            }
            if end || entries.is_empty() {
                return reply.ok();
            }
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.take_handle(fh) {
            Some(o) => {
                if let Ok(o) = Arc::try_unwrap(o) {
                    let _ = o.file.close();
                }
                reply.ok()
            }
            None => reply.error(Errno::EBADF),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self
            .handle(fh)
            .and_then(|o| o.file.sync_all().map_err(|e| errno(&e)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self
            .conn(req)
            .and_then(|m| m.statfs().map_err(|e| errno(&e)))
        {
            Ok(s) => {
                let bsize = s.chunk_size.min(u64::from(u32::MAX)) as u32;
                reply.statfs(
                    s.chunks,
                    s.chunks_free,
                    s.chunks_free,
                    s.inodes,
                    s.inodes_free,
                    bsize,
                    s.name_max.min(u64::from(u32::MAX)) as u32,
                    bsize,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.child(parent.0, name).and_then(|p| {
            let m = self.conn(req)?;
            let flags = (flags & PASSED) | libc::O_CREAT | libc::O_NOFOLLOW;
            let f = m
                .open_flags(OsStr::from_bytes(&p), flags, mode & 0o7777)
                .map_err(|e| errno(&e))?;
            match f.stat() {
                Ok(s) => Ok((f, s, flags)),
                Err(e) => {
                    let _ = f.close();
                    Err(errno(&e))
                }
            }
        });
        match r {
            Ok((f, s, flags)) => {
                self.nodes().found(parent.0, name_bytes(name), s.ino, true);
                let fh = self.add_handle(Open {
                    file: f,
                    ino: s.ino,
                    access: flags & libc::O_ACCMODE,
                    dirty: AtomicBool::new(false),
                });
                reply.created(
                    &TTL,
                    &attr(&s),
                    Generation(u64::from(s.generation)),
                    fh,
                    FopenFlags::FOPEN_DIRECT_IO,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let r = (|| {
            let ty = locks::lock_type(typ).map_err(Errno::from_i32)?;
            let (s, len) = locks::range(start, end).map_err(Errno::from_i32)?;
            // Through the owner's own handle, so that its own locks never conflict; an owner
            // without one holds no locks, and the open file's handle holds none of its own.
            let held = match self.owners.get(lock_owner.0, ino.0) {
                Some(h) => h.test(ty, s, len),
                None => {
                    let o = self.handle(fh)?;
                    o.file.lock(
                        libmoneta::LockKind::Ofd,
                        libmoneta::LockCmd::Test,
                        ty,
                        s,
                        len,
                        false,
                    )
                }
            }
            .map_err(|e| errno(&e))?;
            Ok(held)
        })();
        match r {
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Ok(Some(l)) => {
                let (a, b) = locks::kernel_range(l.start, l.len);
                let pid = if l.pid > 0 {
                    l.pid as u32
                } else {
                    self.owners.other_pid(lock_owner.0, ino.0).unwrap_or(0)
                };
                reply.locked(a, b, locks::fcntl_type(l.ty), pid)
            }
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (ty, s, len) = match locks::lock_type(typ)
            .and_then(|ty| locks::range(start, end).map(|(s, l)| (ty, s, l)))
        {
            Ok(v) => v,
            Err(e) => return reply.error(Errno::from_i32(e)),
        };
        let o = match self.handle(fh) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let holder = if ty == LockType::Unlock {
            match self.owners.get(lock_owner.0, ino.0) {
                Some(h) => h,
                // An owner with no handle holds no locks: nothing to remove.
                None => return reply.ok(),
            }
        } else {
            self.owners.holder(lock_owner.0, ino.0, fh.0, pid, || {
                // The owner's own handle, with the open file's access, through the opener's
                // connection.
                let own = self.path(ino.0).ok().and_then(|p| {
                    o.file
                        .moneta()
                        .open_flags(OsStr::from_bytes(&p), o.access | libc::O_NOFOLLOW, 0)
                        .ok()
                });
                match own {
                    Some(f) if f.ino() == ino.0 => Holder::Own(Box::new(f)),
                    other => {
                        if let Some(f) = other {
                            let _ = f.close();
                        }
                        Holder::Shared(o.clone())
                    }
                }
            })
        };
        match holder.set(ty, s, len, sleep) {
            Err(e) if sleep && e.errno() == libc::EAGAIN => {}
            Ok(()) => return reply.ok(),
            Err(e) => return reply.error(errno(&e)),
        }
        // F_SETLKW: wait on a thread of its own, retrying as libmoneta's lock_wait does, and
        // give up with EINTR when the caller has a signal to take (the kernel cannot interrupt
        // a request its server has taken; this is how the wait stays interruptible).
        if self.waiters.fetch_add(1, Ordering::AcqRel) >= locks::MAX_WAITERS {
            self.waiters.fetch_sub(1, Ordering::AcqRel);
            return reply.error(Errno::from_i32(libc::ENOLCK));
        }
        let waiters = self.waiters.clone();
        let tid = req.pid();
        let spawned = std::thread::Builder::new()
            .name("moneta-lock-wait".into())
            .spawn(move || {
                let mut pause = libmoneta::lock::LOCK_WAIT_FIRST;
                let r = loop {
                    match holder.set(ty, s, len, true) {
                        Err(e) if e.errno() == libc::EAGAIN => {
                            if proc_status(tid).is_none_or(|st| st.deliverable != 0) {
                                break Err(Errno::EINTR);
                            }
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(libmoneta::lock::LOCK_WAIT_MAX);
                        }
                        Ok(()) => break Ok(()),
                        Err(e) => break Err(errno(&e)),
                    }
                };
                drop(o);
                waiters.fetch_sub(1, Ordering::AcqRel);
                match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(e),
                }
            });
        if let Err(e) = spawned {
            self.waiters.fetch_sub(1, Ordering::AcqRel);
            eprintln!("moneta mount: cannot start a lock waiter: {e}");
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let keep = match mode {
            0 => false,
            libc::FALLOC_FL_KEEP_SIZE => true,
            // Punching holes, collapsing, zeroing ranges: nvfs has none of them.
            _ => return reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
        };
        match self
            .handle(fh)
            .and_then(|o| o.file.allocate(offset, length, keep).map_err(|e| errno(&e)))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Whether the root of the file system answers: the server's first check of its daemon.
pub fn check_root(pool: &Pool) -> Result<(), String> {
    let me = Caller::own();
    let m = pool.get(&me).map_err(|e| e.to_string())?;
    m.statfs().map_err(|e| {
        if e.errno() == libc::EOPNOTSUPP {
            "the daemon serves a raw device (monetad --raw): there is no file system to mount"
                .to_string()
        } else {
            format!("the daemon's file system does not answer: {e}")
        }
    })?;
    let s = m.lstat("/").map_err(|e| format!("stat /: {e}"))?;
    if s.ino != ROOT {
        return Err(format!("nvfs's root is inode {}, not {ROOT}", s.ino));
    }
    Ok(())
}
