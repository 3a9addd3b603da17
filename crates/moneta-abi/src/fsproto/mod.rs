//! The file-system calls of the control protocol (ops 16 to 42): the permission manager's
//! interface (Moneta-D §2.1). Payloads use the control protocol's little-endian encoding; a
//! byte string is a u32 length followed by the bytes (no terminator, no padding).
//!
//! A *handle* names a file opened on the same connection; it is valid only there. A *target*
//! is kind (u32: [`TARGET_PATH`], [`TARGET_PATH_NOFOLLOW`] or [`TARGET_HANDLE`]), reserved
//! (u32, zero), handle (u64, zero unless kind is a handle), path (string, empty for a handle).
//! Paths are absolute within nvfs (they start with `/`), at most [`PATH_MAX`] bytes, without
//! NUL bytes.

use crate::control::{Error, Reader, Writer};

mod reply;
mod request;

pub use reply::*;
pub use request::FsRequest;

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

#[cfg(test)]
mod tests;
