//! Requests of the file-system calls: what each carries, and its encoding.

use super::*;

/// A file-system request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum FsRequest {
    Open {
        flags: u32,
        mode: u32,
        path: Vec<u8>,
    },
    OpenRoom {
        flags: u32,
        mode: u32,
        path: Vec<u8>,
    },
    Close {
        handle: u64,
    },
    Lookup {
        handle: u64,
        offset: u64,
        len: u64,
    },
    Extend {
        handle: u64,
        offset: u64,
        len: u64,
    },
    Fsync {
        handle: u64,
    },
    Stat {
        target: Target,
    },
    Truncate {
        target: Target,
        size: u64,
    },
    Chmod {
        target: Target,
        mode: u32,
    },
    Chown {
        target: Target,
        uid: u32,
        gid: u32,
    },
    Utimes {
        target: Target,
        atime: WireTime,
        mtime: WireTime,
    },
    Mkdir {
        mode: u32,
        path: Vec<u8>,
    },
    Rmdir {
        path: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    UnlinkKeep {
        path: Vec<u8>,
    },
    Rename {
        flags: u32,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Symlink {
        target: Vec<u8>,
        path: Vec<u8>,
    },
    Readlink {
        path: Vec<u8>,
    },
    Readdir {
        handle: u64,
        cookie: u64,
    },
    StatDir {
        path: Vec<u8>,
        cookie: u64,
        follow: bool,
    },
    Statfs,
    Fork,
    Durable,
    Map {
        handle: u64,
        write: bool,
    },
    Inherit {
        bundle: u64,
        secret: [u64; 2],
        from: u32,
    },
    Lock {
        handle: u64,
        kind: LockKind,
        cmd: LockCmd,
        ty: LockType,
        wait: bool,
        start: u64,
        len: u64,
    },
}

impl FsRequest {
    /// Whether the device may answer this call through the channel (`OP_FS`): the common
    /// calls whose work is bounded. It refers every other call to the control socket (and
    /// leaves any of these it cannot answer at once to a worker, docs/abi.md §4.3).
    pub fn on_channel(&self) -> bool {
        matches!(
            self,
            FsRequest::Open { .. }
                | FsRequest::OpenRoom { .. }
                | FsRequest::Close { .. }
                | FsRequest::Lookup { .. }
                | FsRequest::Extend { .. }
                | FsRequest::Fsync { .. }
                | FsRequest::Stat { .. }
                | FsRequest::Statfs
                | FsRequest::Unlink { .. }
                | FsRequest::UnlinkKeep { .. }
                | FsRequest::Rename { .. }
                | FsRequest::Utimes { .. }
                | FsRequest::Chmod { .. }
                | FsRequest::Chown { .. }
                | FsRequest::Lock { .. }
                | FsRequest::Mkdir { .. }
                | FsRequest::Rmdir { .. }
                | FsRequest::Link { .. }
                | FsRequest::Symlink { .. }
                | FsRequest::Readlink { .. }
                | FsRequest::Readdir { .. }
                | FsRequest::StatDir { .. }
        )
    }

    /// The op code.
    pub fn op(&self) -> u16 {
        match self {
            FsRequest::Open { .. } => OP_FS_OPEN,
            FsRequest::OpenRoom { .. } => OP_FS_OPEN_ROOM,
            FsRequest::Close { .. } => OP_FS_CLOSE,
            FsRequest::Lookup { .. } => OP_FS_LOOKUP,
            FsRequest::Extend { .. } => OP_FS_EXTEND,
            FsRequest::Fsync { .. } => OP_FS_FSYNC,
            FsRequest::Stat { .. } => OP_FS_STAT,
            FsRequest::Truncate { .. } => OP_FS_TRUNCATE,
            FsRequest::Chmod { .. } => OP_FS_CHMOD,
            FsRequest::Chown { .. } => OP_FS_CHOWN,
            FsRequest::Utimes { .. } => OP_FS_UTIMES,
            FsRequest::Mkdir { .. } => OP_FS_MKDIR,
            FsRequest::Rmdir { .. } => OP_FS_RMDIR,
            FsRequest::Unlink { .. } => OP_FS_UNLINK,
            FsRequest::UnlinkKeep { .. } => OP_FS_UNLINK_KEEP,
            FsRequest::Rename { .. } => OP_FS_RENAME,
            FsRequest::Link { .. } => OP_FS_LINK,
            FsRequest::Symlink { .. } => OP_FS_SYMLINK,
            FsRequest::Readlink { .. } => OP_FS_READLINK,
            FsRequest::Readdir { .. } => OP_FS_READDIR,
            FsRequest::StatDir { .. } => OP_FS_STATDIR,
            FsRequest::Statfs => OP_FS_STATFS,
            FsRequest::Fork => OP_FS_FORK,
            FsRequest::Durable => OP_FS_DURABLE,
            FsRequest::Inherit { .. } => OP_FS_INHERIT,
            FsRequest::Lock { .. } => OP_FS_LOCK,
            FsRequest::Map { .. } => OP_FS_MAP,
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        match self {
            FsRequest::Open { flags, mode, path } | FsRequest::OpenRoom { flags, mode, path } => {
                w.u32(*flags).u32(*mode).bytes(path);
            }
            FsRequest::Close { handle } | FsRequest::Fsync { handle } => {
                w.u64(*handle);
            }
            FsRequest::Lookup {
                handle,
                offset,
                len,
            }
            | FsRequest::Extend {
                handle,
                offset,
                len,
            } => {
                w.u64(*handle).u64(*offset).u64(*len);
            }
            FsRequest::Stat { target } => w.target(target),
            FsRequest::Truncate { target, size } => {
                w.target(target);
                w.u64(*size);
            }
            FsRequest::Chmod { target, mode } => {
                w.target(target);
                w.u32(*mode).u32(0);
            }
            FsRequest::Chown { target, uid, gid } => {
                w.target(target);
                w.u32(*uid).u32(*gid);
            }
            FsRequest::Utimes {
                target,
                atime,
                mtime,
            } => {
                w.target(target);
                w.u64(atime.sec as u64)
                    .u32(atime.nsec)
                    .u32(mtime.nsec)
                    .u64(mtime.sec as u64);
            }
            FsRequest::Mkdir { mode, path } => {
                w.u32(*mode).u32(0).bytes(path);
            }
            FsRequest::Rmdir { path }
            | FsRequest::Unlink { path }
            | FsRequest::UnlinkKeep { path }
            | FsRequest::Readlink { path } => {
                w.bytes(path);
            }
            FsRequest::Rename { flags, from, to } => {
                w.u32(*flags).u32(0).bytes(from).bytes(to);
            }
            FsRequest::Link { from, to } => {
                w.bytes(from).bytes(to);
            }
            FsRequest::Symlink { target, path } => {
                w.bytes(target).bytes(path);
            }
            FsRequest::Readdir { handle, cookie } => {
                w.u64(*handle).u64(*cookie);
            }
            FsRequest::StatDir {
                path,
                cookie,
                follow,
            } => {
                w.u64(*cookie).u32(u32::from(*follow)).u32(0).bytes(path);
            }
            FsRequest::Statfs | FsRequest::Fork | FsRequest::Durable => {}
            FsRequest::Map { handle, write } => {
                w.u64(*handle).u32(u32::from(*write)).u32(0);
            }
            FsRequest::Inherit {
                bundle,
                secret,
                from,
            } => {
                w.u64(*bundle)
                    .u64(secret[0])
                    .u64(secret[1])
                    .u32(*from)
                    .u32(0);
            }
            FsRequest::Lock {
                handle,
                kind,
                cmd,
                ty,
                wait,
                start,
                len,
            } => {
                w.u64(*handle)
                    .u32(kind.to_wire())
                    .u32(cmd.to_wire())
                    .u32(ty.to_wire())
                    .u32(*wait as u32)
                    .u64(*start)
                    .u64(*len);
            }
        }
    }

    pub(crate) fn decode(op: u16, r: &mut Reader<'_>) -> Result<FsRequest, Error> {
        let time_ok = |t: WireTime| {
            if t.nsec < 1_000_000_000 || t.nsec == UTIME_NOW || t.nsec == UTIME_OMIT {
                Ok(t)
            } else {
                Err(Error::BadField("nanoseconds"))
            }
        };
        Ok(match op {
            OP_FS_OPEN => FsRequest::Open {
                flags: r.u32()?,
                mode: r.u32()?,
                path: r.path()?,
            },
            OP_FS_OPEN_ROOM => FsRequest::OpenRoom {
                flags: r.u32()?,
                mode: r.u32()?,
                path: r.path()?,
            },
            OP_FS_CLOSE => FsRequest::Close { handle: r.u64()? },
            OP_FS_LOOKUP | OP_FS_EXTEND => {
                let (handle, offset, len) = (r.u64()?, r.u64()?, r.u64()?);
                let append = op == OP_FS_EXTEND && offset == APPEND;
                if !append && offset.checked_add(len).is_none() {
                    return Err(Error::BadField("len"));
                }
                if op == OP_FS_LOOKUP {
                    FsRequest::Lookup {
                        handle,
                        offset,
                        len,
                    }
                } else {
                    FsRequest::Extend {
                        handle,
                        offset,
                        len,
                    }
                }
            }
            OP_FS_FSYNC => FsRequest::Fsync { handle: r.u64()? },
            OP_FS_STAT => FsRequest::Stat {
                target: r.target()?,
            },
            OP_FS_TRUNCATE => FsRequest::Truncate {
                target: r.target()?,
                size: r.u64()?,
            },
            OP_FS_CHMOD => {
                let target = r.target()?;
                let mode = r.u32()?;
                r.zero32("reserved")?;
                FsRequest::Chmod { target, mode }
            }
            OP_FS_CHOWN => FsRequest::Chown {
                target: r.target()?,
                uid: r.u32()?,
                gid: r.u32()?,
            },
            OP_FS_UTIMES => {
                let target = r.target()?;
                let asec = r.i64()?;
                let ansec = r.u32()?;
                let mnsec = r.u32()?;
                let msec = r.i64()?;
                FsRequest::Utimes {
                    target,
                    atime: time_ok(WireTime {
                        sec: asec,
                        nsec: ansec,
                    })?,
                    mtime: time_ok(WireTime {
                        sec: msec,
                        nsec: mnsec,
                    })?,
                }
            }
            OP_FS_MKDIR => {
                let mode = r.u32()?;
                r.zero32("reserved")?;
                FsRequest::Mkdir {
                    mode,
                    path: r.path()?,
                }
            }
            OP_FS_RMDIR => FsRequest::Rmdir { path: r.path()? },
            OP_FS_UNLINK => FsRequest::Unlink { path: r.path()? },
            OP_FS_UNLINK_KEEP => FsRequest::UnlinkKeep { path: r.path()? },
            OP_FS_RENAME => {
                let flags = r.u32()?;
                r.zero32("reserved")?;
                if flags & !RENAME_NOREPLACE != 0 {
                    return Err(Error::BadField("rename flags"));
                }
                FsRequest::Rename {
                    flags,
                    from: r.path()?,
                    to: r.path()?,
                }
            }
            OP_FS_LINK => FsRequest::Link {
                from: r.path()?,
                to: r.path()?,
            },
            OP_FS_SYMLINK => FsRequest::Symlink {
                target: r.path()?,
                path: r.path()?,
            },
            OP_FS_READLINK => FsRequest::Readlink { path: r.path()? },
            OP_FS_READDIR => FsRequest::Readdir {
                handle: r.u64()?,
                cookie: r.u64()?,
            },
            OP_FS_STATDIR => {
                let cookie = r.u64()?;
                let follow = match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::BadField("follow")),
                };
                r.zero32("reserved")?;
                FsRequest::StatDir {
                    path: r.path()?,
                    cookie,
                    follow,
                }
            }
            OP_FS_STATFS => FsRequest::Statfs,
            OP_FS_FORK => FsRequest::Fork,
            OP_FS_DURABLE => FsRequest::Durable,
            OP_FS_MAP => {
                let handle = r.u64()?;
                let write = match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::BadField("write")),
                };
                r.zero32("reserved")?;
                FsRequest::Map { handle, write }
            }
            OP_FS_INHERIT => {
                let bundle = r.u64()?;
                let secret = [r.u64()?, r.u64()?];
                let from = r.u32()?;
                r.zero32("reserved")?;
                FsRequest::Inherit {
                    bundle,
                    secret,
                    from,
                }
            }
            OP_FS_LOCK => {
                let handle = r.u64()?;
                let kind = LockKind::from_wire(r.u32()?).ok_or(Error::BadField("lock kind"))?;
                let cmd = LockCmd::from_wire(r.u32()?).ok_or(Error::BadField("lock cmd"))?;
                let ty = LockType::from_wire(r.u32()?).ok_or(Error::BadField("lock type"))?;
                let wait = match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::BadField("lock wait")),
                };
                // Ranges are checked by the manager, which answers EINVAL as fcntl does.
                FsRequest::Lock {
                    handle,
                    kind,
                    cmd,
                    ty,
                    wait,
                    start: r.u64()?,
                    len: r.u64()?,
                }
            }
            other => return Err(Error::UnknownOp(other)),
        })
    }
}
