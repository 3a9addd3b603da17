//! Between the file system's and the lock table's own types and the protocol's: replies,
//! failures, lock ranges, attributes and times.

use super::*;

pub(super) fn statfs_reply(fs: &Fs) -> FsReply {
    let t = fs.statfs();
    FsReply::StatFs(FsStatFs {
        chunk_size: t.chunk_size,
        chunks: t.chunks,
        chunks_free: t.chunks_free,
        inodes: t.inodes,
        inodes_free: t.inodes_free,
        name_max: t.name_max,
    })
}

pub(super) fn failure(e: FsError) -> Failure {
    Failure {
        errno: e.errno,
        message: e.message,
    }
}

pub(super) fn fail(errno: i32, message: &str) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

pub(super) fn lock_failure(e: LockError) -> Failure {
    Failure {
        errno: e.errno(),
        message: e.to_string(),
    }
}

/// The bytes a record lock of `start` and `len` (0: to the end) covers, within `off_t`.
pub(super) fn lock_range(start: u64, len: u64) -> Result<Range, Failure> {
    let end = match len {
        0 => Some(LOCK_OFFSET_MAX),
        n => start.checked_add(n - 1),
    };
    match end {
        Some(end) if start <= LOCK_OFFSET_MAX && end <= LOCK_OFFSET_MAX => Ok(Range { start, end }),
        _ => Err(fail(
            errno::EINVAL,
            "the lock range runs past the largest file offset (2^63 - 1)",
        )),
    }
}

/// A lock as a test reports it: pid -1 for a lock of an open file description, length 0 for
/// one that runs to the end.
pub(super) fn wire_lock(h: &Held) -> FsLock {
    FsLock {
        ty: match h.mode {
            Mode::Read => LockType::Read,
            Mode::Write => LockType::Write,
        },
        pid: match h.owner {
            Owner::Session(_) => h.pid,
            Owner::Ofd(_) => -1,
        },
        start: h.range.start,
        len: if h.range.end >= LOCK_OFFSET_MAX {
            0
        } else {
            h.range.end - h.range.start + 1
        },
    }
}

pub(super) fn wire_time(t: Time) -> WireTime {
    WireTime {
        sec: t.sec,
        nsec: t.nsec,
    }
}

pub(super) fn wire_stat(s: &Stat) -> FsStat {
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

pub(super) fn set_time(t: WireTime) -> SetTime {
    match t.nsec {
        UTIME_NOW => SetTime::Now,
        UTIME_OMIT => SetTime::Omit,
        nsec => SetTime::At(Time { sec: t.sec, nsec }),
    }
}

pub(super) fn extents(size: u64, file: u64, maps: &[Mapping]) -> FsReply {
    FsReply::Extents {
        size,
        file,
        extents: wire_extents(maps),
    }
}

/// Mappings as a reply's extents (a hole's `dev` is [`HOLE`]).
pub(super) fn wire_extents(maps: &[Mapping]) -> Vec<FsExtent> {
    maps.iter()
        .map(|m| FsExtent {
            file_off: m.file_off,
            len: m.len,
            dev: m.dev.unwrap_or(HOLE),
        })
        .collect()
}

/// A directory reply of the entries of `list` that fit in `room` bytes of payload (`end`
/// only if all of them did and the directory has no more).
pub(super) fn dir_reply(list: Vec<moneta_fs::DirEntry>, mut end: bool, mut room: usize) -> FsReply {
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
    FsReply::Dir { entries, end }
}
