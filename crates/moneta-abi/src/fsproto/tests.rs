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
