//! Replies of the file-system calls: attributes, extents, directory entries, and each call's
//! encoding.

use super::*;

/// File attributes on the wire (104 bytes): ino, size, blocks, blksize (u64); atime, mtime,
/// ctime, btime seconds (i64); their nanoseconds (u32 each); mode, nlink, uid, gid, generation,
/// reserved (u32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FsStat {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u64,
    pub atime: WireTime,
    pub mtime: WireTime,
    pub ctime: WireTime,
    pub btime: WireTime,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub generation: u32,
}

/// One run of a file in an extent list (24 bytes): file offset, length, array address (or
/// [`HOLE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsExtent {
    /// First byte in the file.
    pub file_off: u64,
    /// Bytes.
    pub len: u64,
    /// First array byte, or [`HOLE`].
    pub dev: u64,
}

/// One directory entry: ino (u64), next cookie (u64), kind (u8, `DT_*`), name (u8 length and
/// bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsDirEntry {
    /// Inode.
    pub ino: u64,
    /// Cookie continuing after this entry.
    pub next: u64,
    /// `DT_*`.
    pub kind: u8,
    /// Name (1 to 255 bytes).
    pub name: Vec<u8>,
}

/// Bytes of an [`FsStat`] on the wire.
pub const STAT_LEN: usize = 104;

/// One entry of an [`OP_FS_STATDIR`] reply: its attributes, then its name (u8 length and
/// bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsStatEntry {
    /// Name (1 to 255 bytes).
    pub name: Vec<u8>,
    /// What a stat of the entry's path answers.
    pub stat: FsStat,
}

/// File-system totals: chunk size, chunks, free chunks, inodes, free inodes, longest name (u64
/// each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FsStatFs {
    pub chunk_size: u64,
    pub chunks: u64,
    pub chunks_free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub name_max: u64,
}

/// A file-system reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsReply {
    /// No payload.
    Empty,
    /// handle (u64), rights (u32: `RIGHT_READ` | `RIGHT_WRITE`), reserved (u32), attributes.
    Opened {
        /// The new handle.
        handle: u64,
        /// Rights granted.
        rights: u32,
        /// Attributes.
        stat: FsStat,
    },
    /// handle (u64), rights (u32), reserved (u32), attributes, count (u32), reserved (u32),
    /// file tag (u64), `count` extents: an open with the room it was given (none when `count`
    /// is 0). The size is the attributes'.
    OpenedRoom {
        /// The new handle.
        handle: u64,
        /// Rights granted.
        rights: u32,
        /// Attributes.
        stat: FsStat,
        /// The tag the extents' records carry.
        file: u64,
        /// The room: whole extents from offset 0.
        extents: Vec<FsExtent>,
    },
    /// Attributes.
    Stat(FsStat),
    /// size (u64), count (u32), reserved (u32), file tag (u64), `count` extents.
    Extents {
        /// File size.
        size: u64,
        /// The tag the extents' records carry: commands on them put it in word 4.
        file: u64,
        /// Runs from the requested offset on, whole extents, holes included.
        extents: Vec<FsExtent>,
    },
    /// count (u32), end (u32: 1 when the directory is exhausted), entries.
    Dir {
        /// Entries.
        entries: Vec<FsDirEntry>,
        /// No more entries.
        end: bool,
    },
    /// count (u32), end (u32: 1 when the directory is exhausted), next cookie (u64), entries:
    /// attributes, then the name (u8 length and bytes).
    Stats {
        /// Entries and their attributes.
        entries: Vec<FsStatEntry>,
        /// The cookie that continues after the last entry looked at.
        next: u64,
        /// No more entries.
        end: bool,
    },
    /// A byte string.
    Bytes(Vec<u8>),
    /// Totals.
    StatFs(FsStatFs),
    /// bundle (u64), secret (two u64), handles (u32), reserved (u32); a pipe's write end
    /// comes with it.
    Forked {
        /// The bundle's id.
        bundle: u64,
        /// What a claim must present.
        secret: [u64; 2],
        /// Handles in the bundle.
        handles: u32,
    },
    /// total (u32), count (u32), `count` pairs of (old handle, new handle) (u64 each).
    Inherited {
        /// Pairs in the whole bundle.
        total: u32,
        /// The claiming connection's handle for each handle of the forking one, from the
        /// requested index on.
        pairs: Vec<(u64, u64)>,
    },
    /// The answer to a lock test.
    Lock(FsLock),
}

impl FsReply {
    pub(crate) fn encode(&self, w: &mut Writer) {
        match self {
            FsReply::Empty => {}
            FsReply::Opened {
                handle,
                rights,
                stat,
            } => {
                w.u64(*handle).u32(*rights).u32(0);
                w.stat(stat);
            }
            FsReply::OpenedRoom {
                handle,
                rights,
                stat,
                file,
                extents,
            } => {
                w.u64(*handle).u32(*rights).u32(0);
                w.stat(stat);
                w.u32(extents.len() as u32).u32(0).u64(*file);
                for x in extents {
                    w.u64(x.file_off).u64(x.len).u64(x.dev);
                }
            }
            FsReply::Stat(s) => w.stat(s),
            FsReply::Extents {
                size,
                file,
                extents,
            } => {
                w.u64(*size).u32(extents.len() as u32).u32(0).u64(*file);
                for x in extents {
                    w.u64(x.file_off).u64(x.len).u64(x.dev);
                }
            }
            FsReply::Dir { entries, end } => {
                w.u32(entries.len() as u32).u32(*end as u32);
                for d in entries {
                    w.u64(d.ino).u64(d.next);
                    w.0.push(d.kind);
                    w.0.push(d.name.len().min(255) as u8);
                    w.0.extend_from_slice(&d.name[..d.name.len().min(255)]);
                }
            }
            FsReply::Stats { entries, next, end } => {
                w.u32(entries.len() as u32).u32(*end as u32).u64(*next);
                for e in entries {
                    w.stat(&e.stat);
                    w.0.push(e.name.len().min(255) as u8);
                    w.0.extend_from_slice(&e.name[..e.name.len().min(255)]);
                }
            }
            FsReply::Bytes(b) => {
                w.bytes(b);
            }
            FsReply::StatFs(s) => {
                w.u64(s.chunk_size)
                    .u64(s.chunks)
                    .u64(s.chunks_free)
                    .u64(s.inodes)
                    .u64(s.inodes_free)
                    .u64(s.name_max);
            }
            FsReply::Forked {
                bundle,
                secret,
                handles,
            } => {
                w.u64(*bundle)
                    .u64(secret[0])
                    .u64(secret[1])
                    .u32(*handles)
                    .u32(0);
            }
            FsReply::Inherited { total, pairs } => {
                w.u32(*total).u32(pairs.len() as u32);
                for (a, b) in pairs {
                    w.u64(*a).u64(*b);
                }
            }
            FsReply::Lock(l) => {
                w.u32(l.ty.to_wire()).i32(l.pid).u64(l.start).u64(l.len);
            }
        }
    }

    /// Bytes `entries` take in a [`FsReply::Dir`] (for filling a reply up to the limit).
    pub fn dir_entry_len(name: &[u8]) -> usize {
        18 + name.len()
    }

    /// Bytes an entry takes in a [`FsReply::Stats`].
    pub fn stat_entry_len(name: &[u8]) -> usize {
        STAT_LEN + 1 + name.len()
    }

    /// Bytes of a [`FsReply::Stats`] besides its entries.
    pub const STATS_HEAD: usize = 16;

    pub(crate) fn decode(op: u16, r: &mut Reader<'_>) -> Result<FsReply, Error> {
        Ok(match op {
            OP_FS_OPEN => {
                let handle = r.u64()?;
                let rights = r.u32()?;
                r.zero32("reserved")?;
                FsReply::Opened {
                    handle,
                    rights,
                    stat: r.stat()?,
                }
            }
            OP_FS_OPEN_ROOM => {
                let handle = r.u64()?;
                let rights = r.u32()?;
                r.zero32("reserved")?;
                let stat = r.stat()?;
                let n = r.u32()? as usize;
                r.zero32("reserved")?;
                let file = r.u64()?;
                FsReply::OpenedRoom {
                    handle,
                    rights,
                    stat,
                    file,
                    extents: extent_list(r, n)?,
                }
            }
            OP_FS_STAT | OP_FS_MKDIR | OP_FS_LINK | OP_FS_SYMLINK | OP_FS_MAP => {
                FsReply::Stat(r.stat()?)
            }
            OP_FS_LOOKUP | OP_FS_EXTEND => {
                let size = r.u64()?;
                let n = r.u32()? as usize;
                r.zero32("reserved")?;
                let file = r.u64()?;
                FsReply::Extents {
                    size,
                    file,
                    extents: extent_list(r, n)?,
                }
            }
            OP_FS_READDIR => {
                let n = r.u32()? as usize;
                let end = match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::BadField("end")),
                };
                let mut entries = Vec::new();
                for _ in 0..n {
                    let ino = r.u64()?;
                    let next = r.u64()?;
                    let kind = r.take(1)?[0];
                    let len = r.take(1)?[0] as usize;
                    entries.push(FsDirEntry {
                        ino,
                        next,
                        kind,
                        name: r.take(len)?.to_vec(),
                    });
                }
                FsReply::Dir { entries, end }
            }
            OP_FS_STATDIR => {
                let n = r.u32()? as usize;
                let end = match r.u32()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::BadField("end")),
                };
                let next = r.u64()?;
                let mut entries = Vec::new();
                for _ in 0..n {
                    let stat = r.stat()?;
                    let len = r.take(1)?[0] as usize;
                    entries.push(FsStatEntry {
                        name: r.take(len)?.to_vec(),
                        stat,
                    });
                }
                FsReply::Stats { entries, next, end }
            }
            OP_FS_READLINK => FsReply::Bytes(r.string()?),
            OP_FS_STATFS => FsReply::StatFs(FsStatFs {
                chunk_size: r.u64()?,
                chunks: r.u64()?,
                chunks_free: r.u64()?,
                inodes: r.u64()?,
                inodes_free: r.u64()?,
                name_max: r.u64()?,
            }),
            OP_FS_FORK => {
                let bundle = r.u64()?;
                let secret = [r.u64()?, r.u64()?];
                let handles = r.u32()?;
                r.zero32("reserved")?;
                FsReply::Forked {
                    bundle,
                    secret,
                    handles,
                }
            }
            OP_FS_INHERIT => {
                let total = r.u32()?;
                let n = r.u32()? as usize;
                if n > MAX_INHERITED || n > total as usize {
                    return Err(Error::BadField("pair count"));
                }
                let mut pairs = Vec::with_capacity(n);
                for _ in 0..n {
                    pairs.push((r.u64()?, r.u64()?));
                }
                FsReply::Inherited { total, pairs }
            }
            // A set is answered with no payload, a test with the lock found.
            OP_FS_LOCK if r.b.is_empty() => FsReply::Empty,
            OP_FS_LOCK => FsReply::Lock(FsLock {
                ty: LockType::from_wire(r.u32()?).ok_or(Error::BadField("lock type"))?,
                pid: r.i32()?,
                start: r.u64()?,
                len: r.u64()?,
            }),
            _ => FsReply::Empty,
        })
    }
}
