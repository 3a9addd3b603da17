//! The permission manager (Moneta-D §2.1, the kernel's part): it answers file-system calls for
//! a client with the client's credentials, keeps the client's open files (handles), and
//! installs and revokes extent permission records in the client's channel.
//!
//! - A lookup (the soft miss) maps an offset of an open file to its extents and installs them
//!   in the caller's channel with the rights of the caller's open handles of that file (their
//!   union: the channel is the process's, so what one handle allows, the process may do).
//! - An extend allocates (zeroed) chunks for writes past the end or into holes, grows the size
//!   and installs the new extents.
//! - A close removes the channel's records of the file once no other handle of the connection
//!   has the rights they carry.
//! - Freeing space (truncate, unlink of a closed file, the last close of an unlinked file,
//!   rename over a file) first revokes every channel's records over the freed ranges and waits
//!   until the device confirms that no request issued before is in flight; only then does the
//!   change commit and the space become allocatable. This happens under the file-system lock,
//!   so no allocation can slip in between.
//! - `chmod` does not revoke the rights of handles already open: as in POSIX, permission is
//!   checked at open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use moneta_abi::control::{errno, Failure, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::fsproto::*;
use moneta_device::{Device, TableOp};
use moneta_fs::{file_id, Cred, Fs, FsError, Mapping, SetTime, Stat, Time};

/// Most open handles per connection.
pub const MAX_HANDLES: usize = 65536;

/// The permission manager: the mounted file system and the device whose tables it fills.
pub struct Manager {
    fs: Mutex<Fs>,
    device: Arc<Device>,
}

#[derive(Clone, Copy, Debug)]
struct Handle {
    ino: u64,
    file: u64,
    read: bool,
    write: bool,
}

/// A connection's view: its credentials and open handles.
pub struct Session {
    /// Credentials from `SO_PEERCRED` and `SO_PEERGROUPS`.
    pub cred: Cred,
    handles: HashMap<u64, Handle>,
    /// Per inode: handles open for reading, for writing (so a lookup finds its rights at once).
    per_file: HashMap<u64, (u32, u32)>,
    next: u64,
}

impl Session {
    /// A session with no open files.
    pub fn new(cred: Cred) -> Session {
        Session {
            cred,
            handles: HashMap::new(),
            per_file: HashMap::new(),
            next: 1,
        }
    }

    /// The rights this connection's handles of `ino` carry together.
    fn rights(&self, ino: u64) -> u32 {
        match self.per_file.get(&ino) {
            Some(&(readers, writers)) => {
                (if readers > 0 { RIGHT_READ } else { 0 })
                    | if writers > 0 { RIGHT_WRITE } else { 0 }
            }
            None => 0,
        }
    }

    fn add(&mut self, handle: u64, h: Handle) {
        let c = self.per_file.entry(h.ino).or_default();
        c.0 += h.read as u32;
        c.1 += h.write as u32;
        self.handles.insert(handle, h);
    }

    fn remove(&mut self, handle: u64) -> Option<Handle> {
        let h = self.handles.remove(&handle)?;
        let c = self.per_file.get_mut(&h.ino).expect("counted at open");
        c.0 -= h.read as u32;
        c.1 -= h.write as u32;
        if *c == (0, 0) {
            self.per_file.remove(&h.ino);
        }
        Some(h)
    }
}

fn failure(e: FsError) -> Failure {
    Failure {
        errno: e.errno,
        message: e.message,
    }
}

fn fail(errno: i32, message: &str) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

fn wire_time(t: Time) -> WireTime {
    WireTime {
        sec: t.sec,
        nsec: t.nsec,
    }
}

fn wire_stat(s: &Stat) -> FsStat {
    FsStat {
        ino: s.ino,
        size: s.size,
        blocks: s.blocks,
        blksize: s.blksize,
        atime: wire_time(s.atime),
        mtime: wire_time(s.mtime),
        ctime: wire_time(s.ctime),
        btime: wire_time(s.btime),
        mode: s.mode,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        generation: s.generation,
    }
}

fn set_time(t: WireTime) -> SetTime {
    match t.nsec {
        UTIME_NOW => SetTime::Now,
        UTIME_OMIT => SetTime::Omit,
        nsec => SetTime::At(Time { sec: t.sec, nsec }),
    }
}

fn extents(size: u64, maps: &[Mapping]) -> FsReply {
    FsReply::Extents {
        size,
        extents: maps
            .iter()
            .map(|m| FsExtent {
                file_off: m.file_off,
                len: m.len,
                dev: m.dev.unwrap_or(HOLE),
            })
            .collect(),
    }
}

impl Manager {
    /// A manager over `fs` for `device`; installs the revocation hook.
    pub fn new(mut fs: Fs, device: Arc<Device>) -> Manager {
        let d = device.clone();
        fs.set_revoker(Box::new(move |ranges| {
            let ops = ranges
                .iter()
                .map(|&(start, len)| TableOp::RemoveRangeAll { start, len })
                .collect();
            d.update(ops).map_err(|e| FsError {
                errno: libc::EIO,
                message: format!("revocation failed: {e}"),
            })
        }));
        Manager {
            fs: Mutex::new(fs),
            device,
        }
    }

    fn fs(&self) -> MutexGuard<'_, Fs> {
        // A panic while holding the lock leaves the mirror unknown; the daemon must not go on.
        self.fs.lock().unwrap_or_else(|_| {
            tracing::error!("the file system lock is poisoned; stopping");
            std::process::abort()
        })
    }

    /// Releases everything a closing connection held. Its channel is already gone.
    pub fn end_session(&self, s: &mut Session) {
        let mut fs = self.fs();
        s.per_file.clear();
        for (_, h) in s.handles.drain() {
            if let Err(e) = fs.close(h.ino) {
                tracing::warn!(ino = h.ino, "closing a handle of a finished session: {e}");
            }
        }
    }

    fn handle(s: &Session, h: u64) -> Result<Handle, Failure> {
        s.handles
            .get(&h)
            .copied()
            .ok_or_else(|| fail(errno::EBADF, "no such handle on this connection"))
    }

    fn target_ino(&self, fs: &Fs, s: &Session, t: &Target) -> Result<u64, Failure> {
        match t {
            Target::Handle(h) => Ok(Self::handle(s, *h)?.ino),
            Target::Path { path, follow } => fs.lookup(&s.cred, path, *follow).map_err(failure),
        }
    }

    /// Installs records for the mapped runs in `channel` with the session's rights on `h`'s
    /// file. Called with the file-system lock held, so the extents cannot be freed meanwhile.
    fn install(
        &self,
        s: &Session,
        channel: Option<u32>,
        h: &Handle,
        maps: &[Mapping],
    ) -> Result<(), Failure> {
        let Some(channel) = channel else {
            return Ok(());
        };
        let rights = s.rights(h.ino);
        let ops: Vec<TableOp> = maps
            .iter()
            .filter_map(|m| {
                m.dev.map(|start| TableOp::Insert {
                    channel,
                    start,
                    len: m.len,
                    rights: rights as u8,
                    file: h.file,
                })
            })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        self.device
            .update(ops)
            .map_err(|e| fail(errno::EIO, &format!("cannot install records: {e}")))
    }

    /// Answers one file-system call of session `s`, whose channel (if it opened one) is
    /// `channel`.
    pub fn call(
        &self,
        s: &mut Session,
        channel: Option<u32>,
        req: FsRequest,
    ) -> Result<FsReply, Failure> {
        let cred = s.cred.clone();
        match req {
            FsRequest::Open { flags, mode, path } => {
                if s.handles.len() >= MAX_HANDLES {
                    return Err(fail(
                        errno::EMFILE,
                        "too many open files on this connection",
                    ));
                }
                let o = self
                    .fs()
                    .open(&cred, &path, flags as i32, mode)
                    .map_err(failure)?;
                let handle = s.next;
                s.next += 1;
                s.add(
                    handle,
                    Handle {
                        ino: o.ino,
                        file: file_id(o.ino, o.stat.generation),
                        read: o.read,
                        write: o.write,
                    },
                );
                let rights =
                    if o.read { RIGHT_READ } else { 0 } | if o.write { RIGHT_WRITE } else { 0 };
                Ok(FsReply::Opened {
                    handle,
                    rights,
                    stat: wire_stat(&o.stat),
                })
            }
            FsRequest::Close { handle } => {
                let h = Self::handle(s, handle)?;
                let before = s.rights(h.ino);
                s.remove(handle);
                let after = s.rights(h.ino);
                if let (Some(channel), true) = (channel, after != before) {
                    self.device
                        .update(vec![TableOp::RemoveFile {
                            channel,
                            file: h.file,
                        }])
                        .map_err(|e| fail(errno::EIO, &format!("cannot revoke records: {e}")))?;
                }
                self.fs().close(h.ino).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Lookup {
                handle,
                offset,
                len,
            } => {
                let h = Self::handle(s, handle)?;
                let fs = self.fs();
                let (size, maps) = fs.map(h.ino, offset, len, MAX_EXTENTS).map_err(failure)?;
                self.install(s, channel, &h, &maps)?;
                Ok(extents(size, &maps))
            }
            FsRequest::Extend {
                handle,
                offset,
                len,
            } => {
                let h = Self::handle(s, handle)?;
                if !h.write {
                    return Err(fail(errno::EBADF, "the handle is not open for writing"));
                }
                let mut fs = self.fs();
                let (size, maps) = fs
                    .extend(h.ino, offset, len, MAX_EXTENTS)
                    .map_err(failure)?;
                self.install(s, channel, &h, &maps)?;
                Ok(extents(size, &maps))
            }
            FsRequest::Fsync { handle } => {
                let h = Self::handle(s, handle)?;
                self.fs().fsync(h.ino).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Stat { target } => {
                let fs = self.fs();
                let st = match &target {
                    Target::Handle(h) => fs.stat_ino(Self::handle(s, *h)?.ino),
                    Target::Path { path, follow } => {
                        fs.stat(&cred, path, *follow).map_err(failure)?
                    }
                };
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Truncate { target, size } => {
                let mut fs = self.fs();
                match &target {
                    Target::Handle(h) => {
                        let h = Self::handle(s, *h)?;
                        if !h.write {
                            return Err(fail(errno::EINVAL, "the handle is not open for writing"));
                        }
                        fs.truncate_open(h.ino, size).map_err(failure)?;
                    }
                    Target::Path { path, .. } => fs.truncate(&cred, path, size).map_err(failure)?,
                }
                Ok(FsReply::Empty)
            }
            FsRequest::Chmod { target, mode } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                fs.chmod(&cred, ino, mode).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Chown { target, uid, gid } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                let opt = |v: u32| (v != u32::MAX).then_some(v);
                fs.chown(&cred, ino, opt(uid), opt(gid)).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Utimes {
                target,
                atime,
                mtime,
            } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                fs.utimes(&cred, ino, set_time(atime), set_time(mtime))
                    .map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Mkdir { mode, path } => {
                let st = self.fs().mkdir(&cred, &path, mode).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Rmdir { path } => {
                self.fs().rmdir(&cred, &path).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Unlink { path } => {
                self.fs().unlink(&cred, &path).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Rename { flags, from, to } => {
                self.fs()
                    .rename(&cred, &from, &to, flags & RENAME_NOREPLACE != 0)
                    .map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Link { from, to } => {
                let st = self.fs().link(&cred, &from, &to).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Symlink { target, path } => {
                let st = self.fs().symlink(&cred, &target, &path).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Readlink { path } => {
                let t = self.fs().readlink(&cred, &path).map_err(failure)?;
                Ok(FsReply::Bytes(t))
            }
            FsRequest::Readdir { handle, cookie } => {
                let h = Self::handle(s, handle)?;
                if !h.read {
                    return Err(fail(errno::EBADF, "the handle is not open for reading"));
                }
                let (list, mut end) = self.fs().readdir(h.ino, cookie, 1024).map_err(failure)?;
                // Fill the reply up to the message limit.
                let mut room =
                    moneta_abi::control::MAX_MESSAGE - moneta_abi::control::HEADER_LEN - 16;
                let mut entries = Vec::new();
                for d in list {
                    let need = FsReply::dir_entry_len(&d.name);
                    if need > room {
                        end = false;
                        break;
                    }
                    room -= need;
                    entries.push(FsDirEntry {
                        ino: d.ino,
                        next: d.next,
                        kind: d.kind,
                        name: d.name,
                    });
                }
                Ok(FsReply::Dir { entries, end })
            }
            FsRequest::Statfs => {
                let t = self.fs().statfs();
                Ok(FsReply::StatFs(FsStatFs {
                    chunk_size: t.chunk_size,
                    chunks: t.chunks,
                    chunks_free: t.chunks_free,
                    inodes: t.inodes,
                    inodes_free: t.inodes_free,
                    name_max: t.name_max,
                }))
            }
        }
    }
}
