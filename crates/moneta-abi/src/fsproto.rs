//! The file-system calls of the control protocol (ops 16 to 41): the permission manager's
//! interface (Moneta-D §2.1). Payloads use the control protocol's little-endian encoding; a
//! byte string is a u32 length followed by the bytes (no terminator, no padding).
//!
//! A *handle* names a file opened on the same connection; it is valid only there. A *target*
//! is kind (u32: [`TARGET_PATH`], [`TARGET_PATH_NOFOLLOW`] or [`TARGET_HANDLE`]), reserved
//! (u32, zero), handle (u64, zero unless kind is a handle), path (string, empty for a handle).
//! Paths are absolute within nvfs (they start with `/`), at most [`PATH_MAX`] bytes, without
//! NUL bytes.

use crate::control::{Error, Reader, Writer};

/// `open`: payload flags (u32, Linux `O_*` bits), mode (u32), path. Reply: [`FsReply::Opened`].
pub const OP_FS_OPEN: u16 = 16;
/// `close`: payload handle (u64). Reply empty. Revokes the channel's records of the file once
/// no other handle of the connection needs them.
pub const OP_FS_CLOSE: u16 = 17;
/// Extent lookup, the soft miss: payload handle (u64), offset (u64), length (u64). Installs
/// records for the mapped extents in the connection's channel with the handle's rights.
/// Reply: [`FsReply::Extents`].
pub const OP_FS_LOOKUP: u16 = 18;
/// Allocate and extend for writes past the end or into holes: payload as lookup; needs a
/// handle open for writing. Offset [`APPEND`] places the range at the file's end, atomically
/// with the growth; the reply's size minus the length is where it landed.
/// Reply: [`FsReply::Extents`].
pub const OP_FS_EXTEND: u16 = 19;
/// Extend offset meaning "at the current end of the file".
pub const APPEND: u64 = u64::MAX;
/// `fsync`: payload handle (u64). Reply empty.
pub const OP_FS_FSYNC: u16 = 20;
/// `stat`/`lstat`/`fstat`: payload target. Reply: [`FsReply::Stat`].
pub const OP_FS_STAT: u16 = 21;
/// `truncate`/`ftruncate`: payload target, size (u64). Reply empty.
pub const OP_FS_TRUNCATE: u16 = 22;
/// `chmod`/`fchmod`: payload target, mode (u32), reserved (u32). Reply empty.
pub const OP_FS_CHMOD: u16 = 23;
/// `chown`/`lchown`/`fchown`: payload target, uid (u32), gid (u32); `u32::MAX` leaves one
/// unchanged. Reply empty.
pub const OP_FS_CHOWN: u16 = 24;
/// `utimensat`/`futimens`: payload target, atime seconds (i64), atime nanoseconds (u32),
/// mtime nanoseconds (u32), mtime seconds (i64); nanoseconds [`UTIME_NOW`] or [`UTIME_OMIT`]
/// as in Linux. Reply empty.
pub const OP_FS_UTIMES: u16 = 25;
/// `mkdir`: payload mode (u32), reserved (u32), path. Reply: [`FsReply::Stat`].
pub const OP_FS_MKDIR: u16 = 26;
/// `rmdir`: payload path. Reply empty.
pub const OP_FS_RMDIR: u16 = 27;
/// `unlink`: payload path. Reply empty.
pub const OP_FS_UNLINK: u16 = 28;
/// `rename`/`renameat2`: payload flags (u32: 0 or [`RENAME_NOREPLACE`]), reserved (u32), old
/// path, new path. Reply empty.
pub const OP_FS_RENAME: u16 = 29;
/// `link`: payload old path, new path. Reply: [`FsReply::Stat`].
pub const OP_FS_LINK: u16 = 30;
/// `symlink`: payload target bytes, link path. Reply: [`FsReply::Stat`].
pub const OP_FS_SYMLINK: u16 = 31;
/// `readlink`: payload path. Reply: [`FsReply::Bytes`].
pub const OP_FS_READLINK: u16 = 32;
/// `readdir`: payload handle of an open directory (u64), cookie (u64: 0 to start, else the
/// `next` of the last entry seen). Reply: [`FsReply::Dir`].
pub const OP_FS_READDIR: u16 = 33;
/// `statfs`: no payload. Reply: [`FsReply::StatFs`].
pub const OP_FS_STATFS: u16 = 34;
/// Prepares a `fork`: no payload. The daemon copies every handle of the connection into a
/// *bundle* that a child process claims with [`OP_FS_INHERIT`] on its own connection. Reply:
/// [`FsReply::Forked`], with one file descriptor: the write end of a pipe whose read end the
/// daemon keeps. The bundle lives until it is claimed or until every copy of that write end is
/// closed (the parent closes its copy after forking; a child that exits or never claims drops
/// its own), so no bundle outlives the processes that could claim it.
pub const OP_FS_FORK: u16 = 35;
/// Claims a bundle made by [`OP_FS_FORK`] on another connection: payload bundle (u64), secret
/// (two u64), from (u32), reserved (u32). The first call (from 0) moves every handle of the
/// bundle to this connection, with the same rights, and answers the first pairs of (old
/// handle, new handle); a bundle of more than [`MAX_INHERITED`] handles is read in pages by
/// calling again with `from` set to the pairs received so far (the same bundle and secret).
/// Reply: [`FsReply::Inherited`]. A wrong bundle or secret, or a bundle already claimed by
/// another connection: `EBADF`.
pub const OP_FS_INHERIT: u16 = 36;
/// Advisory file locks: `fcntl` record locks (`F_SETLK`, `F_SETLKW`, `F_GETLK`), their
/// open-file-description forms (`F_OFD_*`) and `flock`. Payload: handle (u64), kind (u32,
/// [`LockKind`]), cmd (u32, [`LockCmd`]), type (u32, [`LockType`]), wait (u32: 0 or 1; 1 when
/// the caller retries a conflicting set until it succeeds and wants deadlock detection), start
/// (u64, absolute byte offset), len (u64; 0 means from start to the end of the file and beyond,
/// as `l_len` 0). The client resolves `SEEK_CUR`, `SEEK_END` and a negative `l_len` itself. A
/// flock lock covers the whole file: start and len are ignored. Reply to a set: empty; to a
/// test: [`FsReply::Lock`]. A set that conflicts fails with `EAGAIN`, or `EDEADLK` when waiting
/// would close a cycle of waiters; `ENOLCK` beyond the daemon's lock limits; `EBADF` for a read
/// lock on a handle not open for reading or a write lock on one not open for writing (record
/// locks only); `EINVAL` for a range past [`LOCK_OFFSET_MAX`], a test with type unlock, or a
/// test of a flock lock.
pub const OP_FS_LOCK: u16 = 37;
/// Maps a file into memory: payload handle (u64) of an open regular file, write (u32: 1 for
/// pages that may be written, which needs a handle open for writing, else 0), reserved (u32).
/// Reply: [`FsReply::Stat`] of the file, with one file descriptor: the file's own pages (its
/// *segment*), open for reading and writing when `write` is 1, else for reading only, to be
/// mapped with `mmap` at the file's own offsets (segment offset = file offset). The pages are
/// the array's bytes of the file: a store through a mapping is what every channel command and
/// every other mapping of the file sees, with no copy. Errors: `EBADF` for `write` on a
/// handle not open for writing; `EINVAL` for a file that is not regular; `ENODEV` where the
/// array cannot hand pages out (one with data checksums, or chunks that are not whole pages);
/// `ENOMEM` when the daemon already maps as many files (8,192) or shows as many pieces of
/// them (16,384) as it allows, or the caller's user (other than root and the daemon's own)
/// already had a quarter of those files mapped.
pub const OP_FS_MAP: u16 = 38;
/// The attributes of a directory's entries, for a client that keeps answers (docs/abi.md
/// §3.7): payload cookie (u64: 0 to start, else the reply's `next`), follow (u32: 1 for what
/// `stat` of each entry's path answers, 0 for `lstat`'s), reserved (u32), path of the directory
/// (a final symlink followed). Reply: [`FsReply::Stats`]: for each entry but `.` and `..` (and,
/// with follow, but symbolic links), exactly what [`OP_FS_STAT`] of the path `path/name` would
/// answer now. The caller needs read and search permission on the directory (`EACCES`); a
/// directory the path does not reach is `ENOENT`, something else `ENOTDIR`. A channel's
/// connection that cannot have one more answer watched is refused with `ENOBUFS`.
pub const OP_FS_STATDIR: u16 = 39;
/// `unlink`, for a client that keeps answers (docs/abi.md §3.7): payload path. Reply empty.
/// As [`OP_FS_UNLINK`], and once the name is gone the daemon watches, for the calling
/// connection's channel, what a stat of the path depends on, so that the client may keep
/// `ENOENT` as that stat's answer. For a daemon whose channels have `FS_UNLINK_KEPT`.
pub const OP_FS_UNLINK_KEEP: u16 = 40;
/// `open` that also asks for room (docs/abi.md §3.9): payload as [`OP_FS_OPEN`]. As
/// [`OP_FS_OPEN`]; and when the file it opens is an empty regular file, opened for reading
/// and writing, through a channel that wants size leases and has a slot free, the daemon
/// allocates room from offset 0 and grants a size lease over it, as an extend that ends the
/// file would. Reply: [`FsReply::OpenedRoom`] (no extents when it gave no room). For a daemon
/// whose channels have `FS_ROOM_AT_OPEN`.
pub const OP_FS_OPEN_ROOM: u16 = 41;
/// The durability page (docs/abi.md §2.10, "The durability page"): payload empty. Reply empty,
/// with one file descriptor: a sealed memfd of [`crate::DURABLE_PAGE_SIZE`] bytes, open for
/// reading only, whose words say how far the file system's metadata transactions are committed
/// and how far they are durable on the host's disk ([`crate::DurablePage`]). For a daemon
/// whose channels have `FS_DURABLE_PAGE`; any other answers `EOPNOTSUPP`.
pub const OP_FS_DURABLE: u16 = 42;

/// The path an [`OP_FS_STATDIR`] entry's answer is for, and is watched under: `dir/name`
/// (`/name` in the root), from the directory's path exactly as the request named it.
pub fn entry_path(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !dir.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Longest path, in bytes.
pub const PATH_MAX: usize = 4095;
/// Target kind: a path, following a final symlink.
pub const TARGET_PATH: u32 = 0;
/// Target kind: a path, not following a final symlink.
pub const TARGET_PATH_NOFOLLOW: u32 = 1;
/// Target kind: an open handle.
pub const TARGET_HANDLE: u32 = 2;
/// `utimensat`'s "now".
pub const UTIME_NOW: u32 = (1 << 30) - 1;
/// `utimensat`'s "leave unchanged".
pub const UTIME_OMIT: u32 = (1 << 30) - 2;
/// `renameat2` flag: fail with `EEXIST` instead of replacing.
pub const RENAME_NOREPLACE: u32 = 1;
/// `dev` of a hole in an extent list.
pub const HOLE: u64 = u64::MAX;
/// Most extents in one reply.
pub const MAX_EXTENTS: usize = 256;
/// Most handle pairs in one [`FsReply::Inherited`] (one page of a bundle).
pub const MAX_INHERITED: usize = 1000;
/// Last byte offset a record lock may cover: `off_t`'s largest value, as in Linux. A lock
/// whose `len` is 0 ends there.
pub const LOCK_OFFSET_MAX: u64 = i64::MAX as u64;

/// `n` extents of a reply (at most [`MAX_EXTENTS`]).
fn extent_list(r: &mut Reader<'_>, n: usize) -> Result<Vec<FsExtent>, Error> {
    if n > MAX_EXTENTS {
        return Err(Error::BadField("extent count"));
    }
    let mut extents = Vec::with_capacity(n);
    for _ in 0..n {
        extents.push(FsExtent {
            file_off: r.u64()?,
            len: r.u64()?,
            dev: r.u64()?,
        });
    }
    Ok(extents)
}

/// Whether `op` is a file-system call.
pub fn is_fs_op(op: u16) -> bool {
    (OP_FS_OPEN..=OP_FS_DURABLE).contains(&op)
}

/// Who owns a lock ([`OP_FS_LOCK`] kind, u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// 0: a POSIX record lock (`F_SETLK`), owned by the process (the connection).
    Posix,
    /// 1: an open-file-description record lock (`F_OFD_SETLK`), owned by the open file
    /// description: the handle and every copy of it a fork made.
    Ofd,
    /// 2: a `flock` lock on the whole file, owned by the open file description.
    Flock,
}

/// What a lock call does ([`OP_FS_LOCK`] cmd, u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockCmd {
    /// 0: place, convert or remove a lock (`F_SETLK`, `F_SETLKW`, `flock`).
    Set,
    /// 1: report a lock that would conflict (`F_GETLK`); record locks only.
    Test,
}

/// A lock's type ([`OP_FS_LOCK`] type, u32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockType {
    /// 0: shared (`F_RDLCK`, `LOCK_SH`).
    Read,
    /// 1: exclusive (`F_WRLCK`, `LOCK_EX`).
    Write,
    /// 2: remove (`F_UNLCK`, `LOCK_UN`); in a test reply, "nothing conflicts".
    Unlock,
}

macro_rules! wire_enum {
    ($t:ident { $($v:ident = $n:literal),* }) => {
        impl $t {
            /// The wire value.
            pub fn to_wire(self) -> u32 {
                match self { $($t::$v => $n),* }
            }
            /// The variant of a wire value, if it names one.
            pub fn from_wire(v: u32) -> Option<$t> {
                match v { $($n => Some($t::$v),)* _ => None }
            }
        }
    };
}

wire_enum!(LockKind { Posix = 0, Ofd = 1, Flock = 2 });
wire_enum!(LockCmd { Set = 0, Test = 1 });
wire_enum!(LockType { Read = 0, Write = 1, Unlock = 2 });

/// The answer to a lock test (24 bytes): type (u32: [`LockType`]), pid (i32), start (u64),
/// len (u64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsLock {
    /// The conflicting lock's type, or [`LockType::Unlock`] when the lock could be placed
    /// (then pid is 0 and start and len are those asked about).
    pub ty: LockType,
    /// The owner's process id for a POSIX lock (as `SO_PEERCRED` gave it: 0 for a process in
    /// another pid namespace); -1 for a lock of an open file description, as Linux reports.
    pub pid: i32,
    /// First byte.
    pub start: u64,
    /// Bytes; 0 when the lock runs to [`LOCK_OFFSET_MAX`] (the end of the file and beyond).
    pub len: u64,
}

/// What a call acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A path; `follow` says whether a final symlink is followed.
    Path {
        /// The path.
        path: Vec<u8>,
        /// Follow a final symlink.
        follow: bool,
    },
    /// An open handle.
    Handle(u64),
}

/// A timestamp on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireTime {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds, or [`UTIME_NOW`] / [`UTIME_OMIT`] in a request.
    pub nsec: u32,
}

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

fn path_ok(p: &[u8]) -> Result<(), Error> {
    if p.len() > PATH_MAX || p.contains(&0) {
        return Err(Error::BadField("path"));
    }
    Ok(())
}

impl<'a> Reader<'a> {
    fn string(&mut self) -> Result<Vec<u8>, Error> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn path(&mut self) -> Result<Vec<u8>, Error> {
        let p = self.string()?;
        path_ok(&p)?;
        Ok(p)
    }
    fn i64(&mut self) -> Result<i64, Error> {
        Ok(self.u64()? as i64)
    }
    fn target(&mut self) -> Result<Target, Error> {
        let kind = self.u32()?;
        self.zero32("reserved")?;
        let handle = self.u64()?;
        let path = self.path()?;
        match kind {
            TARGET_PATH | TARGET_PATH_NOFOLLOW if handle == 0 => Ok(Target::Path {
                path,
                follow: kind == TARGET_PATH,
            }),
            TARGET_HANDLE if path.is_empty() => Ok(Target::Handle(handle)),
            _ => Err(Error::BadField("target")),
        }
    }
    fn stat(&mut self) -> Result<FsStat, Error> {
        let (ino, size, blocks, blksize) = (self.u64()?, self.u64()?, self.u64()?, self.u64()?);
        let secs = [self.i64()?, self.i64()?, self.i64()?, self.i64()?];
        let ns = [self.u32()?, self.u32()?, self.u32()?, self.u32()?];
        let t = |i: usize| WireTime {
            sec: secs[i],
            nsec: ns[i],
        };
        let s = FsStat {
            ino,
            size,
            blocks,
            blksize,
            atime: t(0),
            mtime: t(1),
            ctime: t(2),
            btime: t(3),
            mode: self.u32()?,
            nlink: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            generation: self.u32()?,
        };
        self.zero32("reserved")?;
        Ok(s)
    }
}

impl Writer {
    fn target(&mut self, t: &Target) {
        match t {
            Target::Path { path, follow } => {
                let kind = if *follow {
                    TARGET_PATH
                } else {
                    TARGET_PATH_NOFOLLOW
                };
                self.u32(kind).u32(0).u64(0).bytes(path);
            }
            Target::Handle(h) => {
                self.u32(TARGET_HANDLE).u32(0).u64(*h).bytes(&[]);
            }
        }
    }
    fn stat(&mut self, s: &FsStat) {
        self.u64(s.ino).u64(s.size).u64(s.blocks).u64(s.blksize);
        for t in [s.atime, s.mtime, s.ctime, s.btime] {
            self.u64(t.sec as u64);
        }
        for t in [s.atime, s.mtime, s.ctime, s.btime] {
            self.u32(t.nsec);
        }
        self.u32(s.mode)
            .u32(s.nlink)
            .u32(s.uid)
            .u32(s.gid)
            .u32(s.generation)
            .u32(0);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{
        decode_reply, decode_request, encode_reply, encode_request, ReplyBody, Request,
    };

    #[test]
    fn fs_requests_round_trip() {
        let t = WireTime {
            sec: -3,
            nsec: UTIME_OMIT,
        };
        let reqs = vec![
            FsRequest::Open {
                flags: 0o102,
                mode: 0o644,
                path: b"/a/b".to_vec(),
            },
            FsRequest::OpenRoom {
                flags: 0o102,
                mode: 0o600,
                path: b"/a/b-journal".to_vec(),
            },
            FsRequest::Close { handle: 7 },
            FsRequest::Lookup {
                handle: 1,
                offset: 2,
                len: 3,
            },
            FsRequest::Extend {
                handle: 1,
                offset: 4096,
                len: 1,
            },
            FsRequest::Fsync { handle: 9 },
            FsRequest::Stat {
                target: Target::Path {
                    path: b"/x".to_vec(),
                    follow: false,
                },
            },
            FsRequest::Truncate {
                target: Target::Handle(4),
                size: 5,
            },
            FsRequest::Chmod {
                target: Target::Handle(4),
                mode: 0o600,
            },
            FsRequest::Chown {
                target: Target::Handle(4),
                uid: u32::MAX,
                gid: 5,
            },
            FsRequest::Utimes {
                target: Target::Handle(4),
                atime: t,
                mtime: WireTime { sec: 9, nsec: 8 },
            },
            FsRequest::Mkdir {
                mode: 0o755,
                path: b"/d".to_vec(),
            },
            FsRequest::Rmdir {
                path: b"/d".to_vec(),
            },
            FsRequest::Unlink {
                path: b"/f".to_vec(),
            },
            FsRequest::UnlinkKeep {
                path: b"/f".to_vec(),
            },
            FsRequest::Rename {
                flags: RENAME_NOREPLACE,
                from: b"/a".to_vec(),
                to: b"/b".to_vec(),
            },
            FsRequest::Link {
                from: b"/a".to_vec(),
                to: b"/b".to_vec(),
            },
            FsRequest::Symlink {
                target: b"x".to_vec(),
                path: b"/l".to_vec(),
            },
            FsRequest::Readlink {
                path: b"/l".to_vec(),
            },
            FsRequest::Readdir {
                handle: 3,
                cookie: 77,
            },
            FsRequest::StatDir {
                path: b"/d".to_vec(),
                cookie: 9,
                follow: true,
            },
            FsRequest::Statfs,
            FsRequest::Fork,
            FsRequest::Durable,
            FsRequest::Map {
                handle: 7,
                write: true,
            },
            FsRequest::Inherit {
                bundle: 12,
                secret: [u64::MAX, 3],
                from: 1000,
            },
            FsRequest::Lock {
                handle: 3,
                kind: LockKind::Posix,
                cmd: LockCmd::Set,
                ty: LockType::Write,
                wait: true,
                start: 40,
                len: 0,
            },
            FsRequest::Lock {
                handle: 4,
                kind: LockKind::Ofd,
                cmd: LockCmd::Test,
                ty: LockType::Read,
                wait: false,
                start: u64::MAX,
                len: u64::MAX,
            },
            FsRequest::Lock {
                handle: 5,
                kind: LockKind::Flock,
                cmd: LockCmd::Set,
                ty: LockType::Unlock,
                wait: false,
                start: 0,
                len: 0,
            },
        ];
        for req in reqs {
            let b = encode_request(5, &Request::Fs(req.clone()));
            assert_eq!(decode_request(&b).unwrap(), (5, Request::Fs(req)));
        }
        let long = vec![b'a'; PATH_MAX + 1];
        let b = encode_request(1, &Request::Fs(FsRequest::Unlink { path: long }));
        assert_eq!(decode_request(&b), Err(Error::BadField("path")));
        let b = encode_request(
            1,
            &Request::Fs(FsRequest::Unlink {
                path: b"/a\0b".to_vec(),
            }),
        );
        assert_eq!(decode_request(&b), Err(Error::BadField("path")));
        let bad_time = FsRequest::Utimes {
            target: Target::Handle(1),
            atime: WireTime {
                sec: 0,
                nsec: 2_000_000_000,
            },
            mtime: t,
        };
        let b = encode_request(1, &Request::Fs(bad_time));
        assert_eq!(decode_request(&b), Err(Error::BadField("nanoseconds")));
    }

    #[test]
    fn lock_requests_reject_unknown_values() {
        let req = Request::Fs(FsRequest::Lock {
            handle: 1,
            kind: LockKind::Posix,
            cmd: LockCmd::Set,
            ty: LockType::Read,
            wait: false,
            start: 0,
            len: 0,
        });
        let good = encode_request(1, &req);
        assert_eq!(good.len(), 16 + 40);
        // Payload: handle at 16, kind at 24, cmd at 28, type at 32, wait at 36.
        for (at, value, field) in [
            (24, 3, "lock kind"),
            (28, 2, "lock cmd"),
            (32, 3, "lock type"),
            (36, 2, "lock wait"),
        ] {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&(value as u32).to_le_bytes());
            assert_eq!(decode_request(&b), Err(Error::BadField(field)));
        }
        for cut in 16..good.len() {
            let mut b = good[..cut].to_vec();
            b[12..16].copy_from_slice(&((cut - 16) as u32).to_le_bytes());
            assert_eq!(decode_request(&b), Err(Error::Truncated), "cut at {cut}");
        }
        // A reply with an unknown type, or of a length that is neither 0 nor 24 bytes.
        let ok = encode_reply(
            OP_FS_LOCK,
            2,
            &Ok(ReplyBody::Fs(FsReply::Lock(FsLock {
                ty: LockType::Read,
                pid: 1,
                start: 2,
                len: 3,
            }))),
        );
        let mut b = ok.clone();
        b[24] = 3;
        assert!(decode_reply(&b, OP_FS_LOCK).is_err());
        let mut b = ok.clone();
        b.pop();
        let n = (b.len() - 16) as u32;
        b[12..16].copy_from_slice(&n.to_le_bytes());
        assert!(decode_reply(&b, OP_FS_LOCK).is_err());
        for (kind, n) in [
            (LockKind::Posix, 0),
            (LockKind::Ofd, 1),
            (LockKind::Flock, 2),
        ] {
            assert_eq!(kind.to_wire(), n);
            assert_eq!(LockKind::from_wire(n), Some(kind));
        }
    }

    #[test]
    fn fs_replies_round_trip() {
        let stat = FsStat {
            ino: 3,
            size: 4,
            mode: 0o100644,
            nlink: 1,
            ..Default::default()
        };
        let replies = vec![
            (
                OP_FS_OPEN,
                FsReply::Opened {
                    handle: 1,
                    rights: 3,
                    stat,
                },
            ),
            (
                OP_FS_OPEN_ROOM,
                FsReply::OpenedRoom {
                    handle: 2,
                    rights: 3,
                    stat: FsStat { size: 0, ..stat },
                    file: 0x55,
                    extents: vec![FsExtent {
                        file_off: 0,
                        len: 16 << 10,
                        dev: 1 << 30,
                    }],
                },
            ),
            (
                OP_FS_OPEN_ROOM,
                FsReply::OpenedRoom {
                    handle: 3,
                    rights: 1,
                    stat,
                    file: 0,
                    extents: Vec::new(),
                },
            ),
            (OP_FS_STAT, FsReply::Stat(stat)),
            (
                OP_FS_LOOKUP,
                FsReply::Extents {
                    size: 10,
                    file: 0x1234_5678_9abc,
                    extents: vec![FsExtent {
                        file_off: 0,
                        len: 1 << 20,
                        dev: HOLE,
                    }],
                },
            ),
            (
                OP_FS_READDIR,
                FsReply::Dir {
                    entries: vec![FsDirEntry {
                        ino: 1,
                        next: 2,
                        kind: 4,
                        name: b"..".to_vec(),
                    }],
                    end: true,
                },
            ),
            (
                OP_FS_STATDIR,
                FsReply::Stats {
                    entries: vec![
                        FsStatEntry {
                            name: b"a".to_vec(),
                            stat,
                        },
                        FsStatEntry {
                            name: vec![b'n'; 255],
                            stat: FsStat { ino: 9, ..stat },
                        },
                    ],
                    next: 12,
                    end: false,
                },
            ),
            (OP_FS_READLINK, FsReply::Bytes(b"target".to_vec())),
            (
                OP_FS_STATFS,
                FsReply::StatFs(FsStatFs {
                    chunk_size: 1 << 20,
                    ..Default::default()
                }),
            ),
            (OP_FS_CLOSE, FsReply::Empty),
            (
                OP_FS_FORK,
                FsReply::Forked {
                    bundle: 4,
                    secret: [5, 6],
                    handles: 7,
                },
            ),
            (
                OP_FS_INHERIT,
                FsReply::Inherited {
                    total: 1002,
                    pairs: vec![(1, 9), (2, 10)],
                },
            ),
            (OP_FS_LOCK, FsReply::Empty),
            (
                OP_FS_LOCK,
                FsReply::Lock(FsLock {
                    ty: LockType::Write,
                    pid: -1,
                    start: 7,
                    len: 0,
                }),
            ),
            (
                OP_FS_LOCK,
                FsReply::Lock(FsLock {
                    ty: LockType::Unlock,
                    pid: 1234,
                    start: u64::MAX,
                    len: 1,
                }),
            ),
        ];
        assert_eq!(entry_path(b"/", b"x"), b"/x");
        assert_eq!(entry_path(b"/a/b", b"x"), b"/a/b/x");
        let mut w = Writer(Vec::new());
        w.stat(&stat);
        assert_eq!(w.0.len(), STAT_LEN);
        for (op, rep) in replies {
            let b = encode_reply(op, 2, &Ok(ReplyBody::Fs(rep.clone())));
            assert_eq!(decode_reply(&b, op).unwrap().result, Ok(ReplyBody::Fs(rep)));
        }
    }
}
