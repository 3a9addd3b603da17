//! File-system calls through the channel (`OP_FS`, docs/abi.md §4.3): the same answers as the
//! control socket, unlinked files freed with revocation, referrals for what the poller may not
//! do, and forged commands that hurt only their sender. Real daemons, real channels.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use libmoneta::{Channel, ClientError};
use moneta_abi::control::{encode_request, Request};
use moneta_abi::fsproto::*;
use moneta_abi::{Command, Completion, Opcode, Status};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

/// A reply with what differs between two connections' worlds taken out (handles, inode
/// numbers, times, layout tags, array addresses): its kind, sizes, modes and errno.
fn norm(r: Result<FsReply, ClientError>) -> String {
    match r {
        Ok(FsReply::Empty) => "ok".into(),
        Ok(FsReply::Opened { rights, stat, .. }) => {
            format!(
                "opened rights {rights} mode {:o} size {}",
                stat.mode, stat.size
            )
        }
        // How much room depends on what lies next to the file on the array (the reserve that
        // continues its first chunk): a chunk or more from offset 0 is the rule.
        Ok(FsReply::OpenedRoom {
            rights,
            stat,
            extents,
            ..
        }) => format!(
            "opened rights {rights} mode {:o} size {} with room {}",
            stat.mode,
            stat.size,
            match extents.first() {
                None => "none".to_string(),
                Some(x) => format!(
                    "from {} of at least a chunk {}, holes {}",
                    x.file_off,
                    extents.iter().map(|x| x.len).sum::<u64>() >= stat.blksize,
                    extents.iter().any(|x| x.dev == HOLE)
                ),
            }
        ),
        Ok(FsReply::Stat(s)) => format!(
            "stat mode {:o} nlink {} size {} blocks {}",
            s.mode, s.nlink, s.size, s.blocks
        ),
        Ok(FsReply::Extents { size, extents, .. }) => format!(
            "extents size {size} runs {:?}",
            extents
                .iter()
                .map(|x| (x.file_off, x.len, x.dev == HOLE))
                .collect::<Vec<_>>()
        ),
        Ok(FsReply::Lock(l)) => format!("lock {:?} {} {}", l.ty, l.start, l.len),
        Ok(FsReply::StatFs(s)) => format!("statfs {} {}", s.chunks, s.inodes),
        Ok(other) => format!("{other:?}"),
        Err(ClientError::Refused { errno, .. }) => format!("errno {errno}"),
        Err(e) => format!("error {e}"),
    }
}

fn path(dir: &str, name: &str) -> Vec<u8> {
    format!("/{dir}/{name}").into_bytes()
}

/// The same sequence of calls in directory `dir`, each made by `call`; the normalised
/// replies. `leases` says whether the caller's channel wants size leases (around the opens
/// that ask for room: an extend's room depends on where the file lies on the array).
fn sequence(
    dir: &str,
    call: &dyn Fn(FsRequest) -> Result<FsReply, ClientError>,
    handle_of: &dyn Fn(&Result<FsReply, ClientError>) -> u64,
    leases: &dyn Fn(bool),
) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |r: Result<FsReply, ClientError>| {
        out.push(norm(r));
    };
    let open = |p: Vec<u8>, flags: i32, mode: u32| FsRequest::Open {
        flags: flags as u32,
        mode,
        path: p,
    };
    leases(false);
    let f = path(dir, "f");
    let r = call(open(f.clone(), CREAT | libc::O_EXCL, 0o640));
    let h = handle_of(&r);
    note(r);
    note(call(open(f.clone(), CREAT | libc::O_EXCL, 0o640)));
    note(call(open(path(dir, "missing"), libc::O_RDONLY, 0)));
    note(call(open(
        format!("/{dir}").into_bytes(),
        libc::O_WRONLY,
        0,
    )));
    note(call(open(path(dir, "f/x"), libc::O_RDONLY, 0)));
    // O_TRUNC of an empty file is answered at once; of one with data (which frees space) by
    // a worker, and the same.
    let r = call(open(f.clone(), libc::O_WRONLY | libc::O_TRUNC, 0));
    let h2 = handle_of(&r);
    note(r);
    note(call(FsRequest::Extend {
        handle: h,
        offset: 0,
        len: 10_000,
    }));
    note(call(FsRequest::Extend {
        handle: h,
        offset: APPEND,
        len: 5_000,
    }));
    note(call(FsRequest::Lookup {
        handle: h,
        offset: 0,
        len: u64::MAX,
    }));
    note(call(FsRequest::Stat {
        target: Target::Handle(h),
    }));
    note(call(FsRequest::Stat {
        target: Target::Path {
            path: f.clone(),
            follow: true,
        },
    }));
    note(call(FsRequest::Stat {
        target: Target::Handle(h + 1000),
    }));
    note(call(FsRequest::Utimes {
        target: Target::Handle(h),
        atime: WireTime {
            sec: 0,
            nsec: UTIME_OMIT,
        },
        mtime: WireTime {
            sec: 0,
            nsec: UTIME_NOW,
        },
    }));
    note(call(FsRequest::Lock {
        handle: h,
        kind: LockKind::Posix,
        cmd: LockCmd::Set,
        ty: LockType::Write,
        wait: false,
        start: 0,
        len: 100,
    }));
    note(call(FsRequest::Lock {
        handle: h,
        kind: LockKind::Flock,
        cmd: LockCmd::Test,
        ty: LockType::Read,
        wait: false,
        start: 0,
        len: 0,
    }));
    note(call(FsRequest::Fsync { handle: h }));
    let r = call(open(f.clone(), libc::O_RDWR | libc::O_TRUNC, 0));
    let h3 = handle_of(&r);
    note(r);
    note(call(FsRequest::Stat {
        target: Target::Handle(h),
    }));
    note(call(FsRequest::Rename {
        flags: 0,
        from: f.clone(),
        to: path(dir, "g"),
    }));
    note(call(FsRequest::Stat {
        target: Target::Path {
            path: f.clone(),
            follow: true,
        },
    }));
    note(call(FsRequest::Rename {
        flags: RENAME_NOREPLACE,
        from: path(dir, "g"),
        to: path(dir, "g"),
    }));
    for handle in [h, h2, h3] {
        note(call(FsRequest::Close { handle }));
    }
    note(call(FsRequest::Close { handle: h }));
    note(call(FsRequest::Unlink {
        path: path(dir, "g"),
    }));
    note(call(FsRequest::UnlinkKeep {
        path: path(dir, "g"),
    }));
    let r = call(open(path(dir, "k"), CREAT, 0o600));
    let hk = handle_of(&r);
    note(r);
    note(call(FsRequest::Close { handle: hk }));
    note(call(FsRequest::UnlinkKeep {
        path: path(dir, "k"),
    }));
    // An open that asks for room: an empty file made for reading and writing gets it (and a
    // size lease over it); one with data, or opened for writing only, does not.
    let room = |p: Vec<u8>, flags: i32| FsRequest::OpenRoom {
        flags: flags as u32,
        mode: 0o600,
        path: p,
    };
    leases(true);
    let r = call(room(path(dir, "j"), CREAT | libc::O_EXCL));
    let hj = handle_of(&r);
    note(r);
    let r = call(room(path(dir, "k"), libc::O_CREAT | libc::O_WRONLY));
    let hw = handle_of(&r);
    note(r);
    note(call(FsRequest::Extend {
        handle: hw,
        offset: 0,
        len: 3,
    }));
    let r = call(room(path(dir, "k"), libc::O_RDWR));
    let hk = handle_of(&r);
    note(r);
    let r = call(room(path(dir, "j"), libc::O_RDONLY));
    let hr = handle_of(&r);
    note(r);
    note(call(room(path(dir, "nothing"), libc::O_RDWR)));
    leases(false);
    for handle in [hj, hw, hk, hr] {
        note(call(FsRequest::Close { handle }));
    }
    for p in ["j", "k"] {
        note(call(FsRequest::Unlink { path: path(dir, p) }));
    }
    note(call(FsRequest::Unlink {
        path: format!("/{dir}").into_bytes(),
    }));
    // The name space: directories, links, symbolic links and listing them.
    note(call(FsRequest::Mkdir {
        mode: 0o750,
        path: path(dir, "d"),
    }));
    note(call(FsRequest::Mkdir {
        mode: 0o750,
        path: path(dir, "d"),
    }));
    let r = call(open(path(dir, "d/x"), CREAT, 0o600));
    let hx = handle_of(&r);
    note(r);
    note(call(FsRequest::Link {
        from: path(dir, "d/x"),
        to: path(dir, "d/y"),
    }));
    note(call(FsRequest::Link {
        from: path(dir, "d"),
        to: path(dir, "e"),
    }));
    note(call(FsRequest::Symlink {
        target: b"x".to_vec(),
        path: path(dir, "d/s"),
    }));
    note(call(FsRequest::Readlink {
        path: path(dir, "d/s"),
    }));
    note(call(FsRequest::Readlink {
        path: path(dir, "d/x"),
    }));
    let r = call(open(path(dir, "d"), libc::O_RDONLY | libc::O_DIRECTORY, 0));
    let hd = handle_of(&r);
    note(r);
    let listed = match call(FsRequest::Readdir {
        handle: hd,
        cookie: 0,
    }) {
        Ok(FsReply::Dir { entries, end }) => {
            let mut names: Vec<String> = entries
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect();
            names.sort();
            format!("dir {names:?} end {end}")
        }
        other => norm(other),
    };
    // (Names only: the inode numbers differ between the two directories.)
    note(Ok(FsReply::Bytes(listed.into_bytes())));
    note(call(FsRequest::Readdir {
        handle: hx,
        cookie: 0,
    }));
    note(call(FsRequest::Rmdir {
        path: path(dir, "d"),
    }));
    for p in ["d/x", "d/y", "d/s"] {
        note(call(FsRequest::Unlink { path: path(dir, p) }));
    }
    for handle in [hx, hd] {
        note(call(FsRequest::Close { handle }));
    }
    note(call(FsRequest::Rmdir {
        path: path(dir, "d"),
    }));
    note(call(FsRequest::Rmdir {
        path: path(dir, "d"),
    }));
    out
}

fn opened_handle(r: &Result<FsReply, ClientError>) -> u64 {
    match r {
        Ok(FsReply::Opened { handle, .. } | FsReply::OpenedRoom { handle, .. }) => *handle,
        _ => 0,
    }
}

#[test]
fn calls_through_the_channel_answer_as_the_socket_does() {
    let d = Daemon::start_fs("64M", &[]);
    let ch = d.channel();
    let sock = d.channel();
    // Each asks for size leases around the opens that ask for room.
    let maps = [&ch, &sock].map(ChannelMap::of_channel);
    let leases = |m: &ChannelMap, on: bool| {
        m.at::<moneta_abi::SizeLeaseArea>(moneta_abi::SIZE_LEASE_OFFSET)
            .wanted
            .store(u32::from(on), std::sync::atomic::Ordering::Release);
    };
    for dir in ["a", "b"] {
        sock.control()
            .fs(FsRequest::Mkdir {
                mode: 0o755,
                path: format!("/{dir}").into_bytes(),
            })
            .unwrap();
    }
    let before = sock.control().fs(FsRequest::Statfs).unwrap();
    // The connection's first file call on the socket publishes its handles for the device.
    ch.control().fs(FsRequest::Statfs).unwrap();
    let st0 = d.control().status().unwrap();
    let fast = sequence("a", &|r| ch.fs(r), &opened_handle, &|on| {
        leases(&maps[0], on)
    });
    let st1 = d.control().status().unwrap();
    let slow = sequence("b", &|r| sock.control().fs(r), &opened_handle, &|on| {
        leases(&maps[1], on)
    });
    assert_eq!(fast, slow);
    assert!(fast.iter().any(|r| r.starts_with("extents")), "{fast:?}");
    assert!(
        fast.iter()
            .any(|r| r.ends_with("with room from 0 of at least a chunk true, holes false")),
        "an open got room: {fast:?}"
    );
    assert!(fast.iter().filter(|r| r.starts_with("errno")).count() >= 6);
    // The device answered all of them (the O_TRUNC of a file with data through a worker,
    // not referred to the socket), and the socket path none.
    let answered = st1.fs_calls - st0.fs_calls;
    let referred = st1.fs_calls_referred - st0.fs_calls_referred;
    assert!(
        answered >= fast.len() as u64,
        "{answered} of {}",
        fast.len()
    );
    assert_eq!(referred, 0, "the truncation with data is made by a worker");
    let st2 = d.control().status().unwrap();
    assert_eq!(st2.fs_calls, st1.fs_calls);
    // Both files are gone, their space free again (a call on the socket waits for the frees
    // the channel's unlink left).
    assert_eq!(
        norm(sock.control().fs(FsRequest::Statfs)),
        norm(Ok(before.clone()))
    );
    let (FsReply::StatFs(a), FsReply::StatFs(b)) =
        (before, sock.control().fs(FsRequest::Statfs).unwrap())
    else {
        panic!("statfs replies")
    };
    assert_eq!(
        (a.chunks_free, a.inodes_free),
        (b.chunks_free, b.inodes_free)
    );
}

#[test]
fn a_file_unlinked_through_the_channel_is_freed_after_its_last_handle() {
    let d = Daemon::start_fs("32M", &[]);
    let ch = d.channel();
    let other = d.channel();
    let c = ch.control();
    let free = |c: &libmoneta::Control| match c.fs(FsRequest::Statfs).unwrap() {
        FsReply::StatFs(s) => s.chunks_free,
        r => panic!("{r:?}"),
    };
    let empty = free(c);
    let (h, _, _) = c.fs_open(b"/f", CREAT, 0o644).unwrap();
    file_write(&ch, h, 0, &[7u8; 1 << 20]).unwrap();
    c.fs_close(h).unwrap();
    // Another connection holds it open; this one unlinks it through the channel.
    let (oh, _, _) = other.control().fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    ch.fs(FsRequest::Unlink {
        path: b"/f".to_vec(),
    })
    .unwrap();
    assert_eq!(
        norm(c.fs(FsRequest::Stat {
            target: Target::Path {
                path: b"/f".to_vec(),
                follow: true
            }
        })),
        format!("errno {}", libc::ENOENT)
    );
    // Still whole for the reader that has it open, and its space still taken.
    assert_eq!(file_read(&other, oh).unwrap(), vec![7u8; 1 << 20]);
    assert!(free(c) < empty);
    // The reader's last close, through its channel, lets the file go.
    other.control().fs(FsRequest::Statfs).unwrap();
    other.fs(FsRequest::Close { handle: oh }).unwrap();
    assert_eq!(free(c), empty);
    // A file with data whose last name goes through the channel while nobody holds it.
    let (h, _, _) = c.fs_open(b"/g", CREAT, 0o644).unwrap();
    file_write(&ch, h, 0, &[9u8; 300_000]).unwrap();
    let x = c.fs_lookup(h, 0, 1).unwrap().1[0];
    c.fs_close(h).unwrap();
    ch.fs(FsRequest::Rename {
        flags: 0,
        from: b"/missing".to_vec(),
        to: b"/g".to_vec(),
    })
    .unwrap_err();
    ch.fs(FsRequest::Unlink {
        path: b"/g".to_vec(),
    })
    .unwrap();
    // Whatever the daemon does meanwhile, its records are revoked before the space returns:
    // a forged read of the old address misses.
    let mut buf = [0u8; 16];
    let r = ch.read(x.dev, &mut buf, Completion::Dma);
    assert!(
        matches!(r, Err(ClientError::Status(Status::PermissionMiss))),
        "{r:?}"
    );
    assert_eq!(free(c), empty);
    // A rename over a file with data frees the file it replaces.
    let (h, _, _) = c.fs_open(b"/old", CREAT, 0o644).unwrap();
    file_write(&ch, h, 0, &[1u8; 200_000]).unwrap();
    c.fs_close(h).unwrap();
    let (h, _, _) = c.fs_open(b"/new", CREAT, 0o644).unwrap();
    c.fs_close(h).unwrap();
    ch.fs(FsRequest::Rename {
        flags: 0,
        from: b"/new".to_vec(),
        to: b"/old".to_vec(),
    })
    .unwrap();
    assert_eq!(free(c), empty);
    assert!(d.control().status().unwrap().fs_calls >= 4);
}

/// Rings `OP_FS` on `ch` with `msg` in the slice and the given words; the completion.
fn ring_fs(ch: &Channel, msg: &[u8], len: u64, addr: u64, file: u64) -> (Status, Vec<u8>) {
    let tag = ch.tag();
    ch.write_dma(tag, 0, msg);
    ch.submit(
        tag,
        &Command::new(Opcode::Fs, Completion::Dma, addr, len, file),
    );
    let c = ch.wait(tag, Completion::Dma);
    let out = match c {
        Ok(c) => {
            let mut b = vec![0u8; (c.bytes as usize).min(ch.slice_size())];
            ch.read_dma(tag, 0, &mut b);
            (c.status, b)
        }
        Err(ClientError::Status(s)) => (s, Vec::new()),
        Err(e) => panic!("{e}"),
    };
    ch.release(tag);
    out
}

#[test]
fn forged_fs_commands_hurt_only_their_sender() {
    let d = Daemon::start_fs("16M", &[]);
    let ch = d.channel();
    let c = ch.control();
    let (h, _, _) = c.fs_open(b"/mine", CREAT, 0o600).unwrap();
    let stat = encode_request(
        5,
        &Request::Fs(FsRequest::Stat {
            target: Target::Handle(h),
        }),
    );
    let slice = ch.slice_size() as u64;
    // Shape: length within the slice, no address, no file word.
    assert_eq!(ring_fs(&ch, &stat, 0, 0, 0).0, Status::BadDma);
    assert_eq!(ring_fs(&ch, &stat, slice + 1, 0, 0).0, Status::BadDma);
    assert_eq!(
        ring_fs(&ch, &stat, stat.len() as u64, 8, 0).0,
        Status::Malformed
    );
    assert_eq!(
        ring_fs(&ch, &stat, stat.len() as u64, 0, h).0,
        Status::Malformed
    );
    // Answered when taken, outside barrier epochs: never a barrier.
    let tag = ch.tag();
    ch.write_dma(tag, 0, &stat);
    let mut barrier = Command::new(Opcode::Fs, Completion::Dma, 0, stat.len() as u64, 0);
    barrier.barrier = true;
    ch.submit(tag, &barrier);
    let r = ch.wait(tag, Completion::Dma);
    ch.release(tag);
    assert!(
        matches!(r, Ok(c) if c.status == Status::Malformed)
            || matches!(r, Err(ClientError::Status(Status::Malformed))),
        "{r:?}"
    );
    // A good one: the socket's reply message, with its sequence number.
    let (st, reply) = ring_fs(&ch, &stat, stat.len() as u64, 0, 0);
    assert_eq!(st, Status::Ok);
    let r = moneta_abi::control::decode_reply(&reply, stat_op()).unwrap();
    assert_eq!(r.seq, 5);
    assert!(matches!(
        r.result,
        Ok(moneta_abi::control::ReplyBody::Fs(FsReply::Stat(_)))
    ));
    // Garbage, a cut request and a request of the wrong length are referred: the socket
    // then answers the protocol error.
    let noise: Vec<u8> = (0..slice).map(|i| (i * 131 % 251) as u8).collect();
    assert_eq!(ring_fs(&ch, &noise, slice, 0, 0).0, Status::Refer);
    assert_eq!(
        ring_fs(&ch, &stat, stat.len() as u64 - 3, 0, 0).0,
        Status::Refer
    );
    assert_eq!(ring_fs(&ch, &stat, slice, 0, 0).0, Status::Refer);
    // Control operations other than file calls are never carried out from a channel.
    for req in [Request::Shutdown, Request::Status, Request::Ping] {
        let m = encode_request(1, &req);
        assert_eq!(ring_fs(&ch, &m, m.len() as u64, 0, 0).0, Status::Refer);
    }
    // Calls the device does not make on the channel are referred (and change nothing).
    c.fs_extend(h, 0, 100).unwrap();
    for req in [
        FsRequest::Truncate {
            target: Target::Handle(h),
            size: 0,
        },
        FsRequest::Fork,
        FsRequest::Map {
            handle: h,
            write: false,
        },
    ] {
        let m = encode_request(1, &Request::Fs(req));
        assert_eq!(ring_fs(&ch, &m, m.len() as u64, 0, 0).0, Status::Refer);
    }
    assert_eq!(
        c.fs_stat(b"/mine", true).unwrap().size,
        100,
        "the truncate was not made"
    );
    // Another connection's handle, through this channel: not this connection's.
    let other = d.channel();
    other.control().fs(FsRequest::Statfs).unwrap();
    let close = encode_request(2, &Request::Fs(FsRequest::Close { handle: h }));
    let (st, reply) = ring_fs(&other, &close, close.len() as u64, 0, 0);
    assert_eq!(st, Status::Ok);
    let r = moneta_abi::control::decode_reply(&reply, OP_FS_CLOSE).unwrap();
    assert_eq!(r.result.unwrap_err().errno, libc::EBADF);
    // The daemon is well and the file still open on its own connection.
    d.control().ping().unwrap();
    assert!(matches!(
        c.fs(FsRequest::Stat {
            target: Target::Handle(h)
        }),
        Ok(FsReply::Stat(_))
    ));
}

/// A daemon on a fresh 32 MiB backing file, at the default (`host`) durability level.
fn host_daemon(name: &str) -> Daemon {
    let dir = TempDir::new(name);
    let img = dir.0.join("img").to_string_lossy().to_string();
    Daemon::start_raw(&["--device", &img, "--size", "32M"], dir)
}

/// Creates `path` (read and write, mode 644) through the channel; its handle.
fn create_through(ch: &Channel, path: &[u8]) -> u64 {
    match ch
        .fs(FsRequest::Open {
            flags: CREAT as u32,
            mode: 0o644,
            path: path.to_vec(),
        })
        .unwrap()
    {
        FsReply::Opened { handle, .. } => handle,
        r => panic!("{r:?}"),
    }
}

fn fsync_op() -> u16 {
    FsRequest::Fsync { handle: 0 }.op()
}

fn stat_op() -> u16 {
    FsRequest::Stat {
        target: Target::Handle(0),
    }
    .op()
}

#[test]
fn at_the_host_level_fsync_is_answered_on_the_channel_after_its_flush() {
    let dir = TempDir::new("quick-host");
    let img = dir.0.join("img");
    let img_s = img.to_string_lossy().to_string();
    let d = Daemon::start_raw(&["--device", &img_s, "--size", "32M"], dir);
    let ch = d.channel();
    ch.control().fs(FsRequest::Statfs).unwrap();
    let (h, _, _) = match ch
        .fs(FsRequest::Open {
            flags: CREAT as u32,
            mode: 0o644,
            path: b"/f".to_vec(),
        })
        .unwrap()
    {
        FsReply::Opened {
            handle,
            rights,
            stat,
        } => (handle, rights, stat),
        r => panic!("{r:?}"),
    };
    file_write(&ch, h, 0, b"durable").unwrap();
    let st0 = d.control().status().unwrap();
    // The flush waits for the disk: a worker of the device makes it, and the poller then
    // completes the command on the channel (nothing goes to the socket).
    ch.fs(FsRequest::Fsync { handle: h }).unwrap();
    let st1 = d.control().status().unwrap();
    assert_eq!(st1.fs_calls_referred, st0.fs_calls_referred);
    assert_eq!(st1.fs_calls, st0.fs_calls + 1);
    // A handle this connection does not have: refused as the socket refuses it.
    let bad = ch.fs(FsRequest::Fsync { handle: h + 1000 });
    assert!(
        matches!(bad, Err(ClientError::Refused { errno, .. }) if errno == libc::EBADF),
        "{bad:?}"
    );
    // Calls rung at once: a channel has at most two at the workers, the rest are referred;
    // each is answered once, and the socket answers the referred ones alike.
    let fsync = encode_request(9, &Request::Fs(FsRequest::Fsync { handle: h }));
    let tags: Vec<_> = (0..8).map(|_| ch.tag()).collect();
    for &tag in &tags {
        ch.write_dma(tag, 0, &fsync);
        ch.submit(
            tag,
            &Command::new(Opcode::Fs, Completion::Dma, 0, fsync.len() as u64, 0),
        );
    }
    let (mut answered, mut referred) = (0, 0);
    for &tag in &tags {
        match ch.wait(tag, Completion::Dma) {
            Ok(c) if c.status == Status::Ok => {
                let mut b = vec![0u8; c.bytes as usize];
                ch.read_dma(tag, 0, &mut b);
                let r = moneta_abi::control::decode_reply(&b, fsync_op()).unwrap();
                assert_eq!(r.seq, 9);
                assert!(r.result.is_ok(), "{:?}", r.result);
                answered += 1;
            }
            Ok(c) if c.status == Status::Refer => referred += 1,
            Err(ClientError::Status(Status::Refer)) => referred += 1,
            r => panic!("{r:?}"),
        }
        ch.release(tag);
    }
    assert_eq!(answered + referred, 8);
    assert!(answered >= 1, "{answered} answered, {referred} referred");
    eprintln!("8 fsyncs rung at once: {answered} answered, {referred} referred");
    ch.fs(FsRequest::Close { handle: h }).unwrap();
    // Many creates and unlinks through the channel fill the journal's log; checkpoints made
    // beside the poller keep answering them.
    for i in 0..3000 {
        let p = format!("/n{i}").into_bytes();
        match ch
            .fs(FsRequest::Open {
                flags: (CREAT | libc::O_EXCL) as u32,
                mode: 0o644,
                path: p.clone(),
            })
            .unwrap()
        {
            FsReply::Opened { handle, .. } => {
                ch.fs(FsRequest::Close { handle }).unwrap();
            }
            r => panic!("{r:?}"),
        }
        ch.fs(FsRequest::Unlink { path: p }).unwrap();
    }
    let st2 = d.control().status().unwrap();
    eprintln!(
        "host level: {} answered, {} referred",
        st2.fs_calls - st1.fs_calls,
        st2.fs_calls_referred - st1.fs_calls_referred
    );
    assert!(
        // 9,000 calls; those made while a checkpoint runs go to the socket (about 100
        // here), more on a busy machine.
        st2.fs_calls - st1.fs_calls > 4500,
        "{} answered, {} referred",
        st2.fs_calls - st1.fs_calls,
        st2.fs_calls_referred - st1.fs_calls_referred
    );
    // The daemon killed now: the image mounts (it checks it), every name gone, the synced
    // file whole.
    drop(ch);
    let mut d = d;
    d.kill9();
    d.spawn();
    let ch = d.channel();
    let c = ch.control();
    assert!(c.fs_stat(b"/n0", true).is_err());
    assert!(c.fs_stat(b"/n2999", true).is_err());
    let (h, _, _) = c.fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    assert_eq!(file_read(&ch, h).unwrap(), b"durable");
}

#[test]
fn a_close_the_poller_cannot_make_at_once_is_made_by_a_worker() {
    let d = host_daemon("quick-close-later");
    let ch = Arc::new(d.channel());
    ch.control().fs(FsRequest::Statfs).unwrap();
    let busy = create_through(&ch, b"/busy");
    // The connection's own socket calls, one after another, each holding its session
    // through a flush to the host's disk: the poller finds the session busy most of the time.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (ch, stop) = (ch.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file_write(&ch, busy, 0, &n.to_le_bytes()).unwrap();
                ch.control().fs(FsRequest::Fsync { handle: busy }).unwrap();
                n += 1;
            }
            n
        })
    };
    let close_op = FsRequest::Close { handle: 0 }.op();
    for i in 0..200 {
        let h = match ch
            .fs(FsRequest::Open {
                flags: CREAT as u32,
                mode: 0o644,
                path: format!("/c{i}").into_bytes(),
            })
            .unwrap()
        {
            FsReply::Opened { handle, .. } => handle,
            r => panic!("{r:?}"),
        };
        // Every close rung on the channel is answered there: at once, or by a worker.
        let close = encode_request(3, &Request::Fs(FsRequest::Close { handle: h }));
        let (st, reply) = ring_fs(&ch, &close, close.len() as u64, 0, 0);
        assert_eq!(st, Status::Ok, "close {i} was referred");
        let r = moneta_abi::control::decode_reply(&reply, close_op).unwrap();
        assert!(r.result.is_ok(), "{:?}", r.result);
        // It was made: the handle is gone.
        let again = ch.control().fs(FsRequest::Close { handle: h });
        assert!(
            matches!(again, Err(ClientError::Refused { errno, .. }) if errno == libc::EBADF),
            "{again:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let syncs = syncer.join().unwrap();
    eprintln!("200 closes on the channel beside {syncs} fsyncs on the socket");
    assert!(syncs > 0);
}

/// Polls `tag` until its command completes; a command the device dropped fails the test
/// instead of hanging it.
fn wait_within(ch: &Channel, tag: libmoneta::Tag, mode: Completion) -> libmoneta::Completed {
    let start = std::time::Instant::now();
    loop {
        if let Some(c) = ch.poll(tag, mode) {
            return c;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "a command rung on a tag whose flush had just been answered was lost"
        );
        std::thread::yield_now();
    }
}

/// The daemon's status after `calls` file calls since `st0`, all answered on the channel.
fn all_on_the_channel(
    d: &Daemon,
    st0: &moneta_abi::control::StatusReport,
    calls: u64,
) -> moneta_abi::control::StatusReport {
    let st1 = d.control().status().unwrap();
    assert_eq!(
        st1.fs_calls - st0.fs_calls,
        calls,
        "every call on the channel"
    );
    assert_eq!(
        st1.fs_calls_referred, st0.fs_calls_referred,
        "none referred"
    );
    st1
}

#[test]
fn a_flush_at_the_workers_says_so_and_its_tag_is_rung_again_at_once() {
    let d = host_daemon("quick-away");
    let ch = d.channel();
    ch.control().fs(FsRequest::Statfs).unwrap();
    let h = create_through(&ch, b"/f");
    let fsync = encode_request(9, &Request::Fs(FsRequest::Fsync { handle: h }));
    let st0 = d.control().status().unwrap();
    // One tag, rung again the moment each flush is answered: the worker that made the flush
    // publishes its completion, and the poller, which still counts the command in flight
    // until it takes the worker's answer, must take the next command all the same.
    let tag = ch.tag();
    // A waiter marked on the tag throughout: the worker then wakes it (a system call) between
    // its publication and its answer to the poller, the window this test rings in.
    ch.slot(tag)
        .status
        .waiter
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // Another client keeps the poller busy, so that it looks at the doorbell while the
    // worker publishes rather than sleeping until the worker's answer wakes it.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        let other = d.channel();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                other.nop(Completion::Dma).unwrap();
            }
        })
    };
    let rounds = 1000u64;
    let mut away = 0;
    for i in 0..rounds {
        file_write(&ch, h, 0, &[i as u8; 64]).unwrap();
        let mode = if i % 2 == 0 {
            Completion::Dma
        } else {
            Completion::Sleep
        };
        ch.write_dma(tag, 0, &fsync);
        ch.submit(
            tag,
            &Command::new(Opcode::Fs, mode, 0, fsync.len() as u64, 0),
        );
        let seq =
            (ch.slot(tag).command.words[0].load(std::sync::atomic::Ordering::Relaxed) >> 32) as u32;
        let c = wait_within(&ch, tag, mode);
        assert_eq!(c.status, Status::Ok);
        let mut b = vec![0u8; c.bytes as usize];
        ch.read_dma(tag, 0, &mut b);
        // The tag again at once.
        ch.submit(tag, &Command::new(Opcode::Nop, Completion::Dma, 0, 0, 0));
        assert_eq!(wait_within(&ch, tag, Completion::Dma).status, Status::Ok);
        let r = moneta_abi::control::decode_reply(&b, fsync_op()).unwrap();
        assert!(r.result.is_ok(), "{:?}", r.result);
        // The device said, while the flush ran, that the command waited on a thread of its
        // own, with no completion time: a client spinning for it would take that thread's
        // CPU. (Only DMA completions have a time to tell: an issue-sleep waiter sleeps.)
        let st = &ch.slot(tag).status;
        if mode == Completion::Dma && st.eta_seq.load(std::sync::atomic::Ordering::Acquire) == seq {
            assert_eq!(
                st.eta_ns.load(std::sync::atomic::Ordering::Relaxed),
                moneta_abi::ETA_AWAY
            );
            away += 1;
        }
    }
    ch.release(tag);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
    all_on_the_channel(&d, &st0, rounds);
    // Every flush had a changed page to write: each went to a worker.
    assert_eq!(away, rounds / 2);
    assert!(ch.pop_error().is_none(), "a command was reported busy");
    // And the bytes of the last round are the file's.
    assert_eq!(file_read(&ch, h).unwrap(), [(rounds - 1) as u8; 64]);
}

#[test]
fn a_flush_the_worker_answers_itself_does_not_wake_the_sleeping_poller() {
    let d = host_daemon("quick-no-wake");
    let ch = d.channel();
    let h = create_through(&ch, b"/f");
    let rounds = 60u64;
    let st0 = d.control().status().unwrap();
    for i in 0..rounds {
        // Quiet long enough for the channel to park and the poller to sleep: the write's
        // ring kicks it awake.
        std::thread::sleep(std::time::Duration::from_millis(3));
        file_write(&ch, h, 0, &[i as u8; 64]).unwrap();
        // The poller hands the flush to a worker and sleeps until something wakes it; the
        // worker answers the client itself, and that is not something.
        match ch.fs(FsRequest::Fsync { handle: h }).unwrap() {
            FsReply::Empty => {}
            r => panic!("{r:?}"),
        }
    }
    let st1 = all_on_the_channel(&d, &st0, rounds);
    // A wake-up a round for the write's kick (the channel parked while the client slept),
    // now and then another where the fsync's ring found it parked again (1.4 a round here);
    // woken by the worker as well, the poller wakes at least twice a round (2.6 here).
    let wakeups = st1.poller_wakeups - st0.poller_wakeups;
    assert!(
        wakeups >= rounds && wakeups < rounds * 2,
        "{wakeups} wake-ups in {rounds} rounds"
    );
    assert_eq!(file_read(&ch, h).unwrap(), [(rounds - 1) as u8; 64]);
}

#[test]
fn the_workers_and_the_flusher_leave_a_pinned_poller_its_cpu() {
    let allowed = moneta_device::allowed_cpus();
    let [rest @ .., last] = allowed.as_slice() else {
        panic!("no CPU allowed");
    };
    let dir = TempDir::new("quick-pinned");
    let img = dir.0.join("img").to_string_lossy().to_string();
    let d = Daemon::start_raw(
        &["--device", &img, "--size", "32M", "--poller-cpu", "auto"],
        dir,
    );
    let ch = d.channel();
    let h = create_through(&ch, b"/f");
    file_write(&ch, h, 0, &[7; 64]).unwrap();
    // The first flush at the `host` level starts the file-call workers, from the poller.
    match ch.fs(FsRequest::Fsync { handle: h }).unwrap() {
        FsReply::Empty => {}
        r => panic!("{r:?}"),
    }
    // One CPU: nothing is pinned, and everything shares it.
    let others = if rest.is_empty() {
        last.to_string()
    } else {
        moneta_device::cpu_list(rest)
    };
    let cpus = |name: &str| threads_cpus(d.pid(), name);
    // Each worker moves itself as it starts, which may be a moment after the flush that
    // started them all was answered by one of them.
    let settled = eventually(Duration::from_secs(5), || {
        let workers = cpus("moneta-files");
        !workers.is_empty() && workers.iter().all(|c| *c == others)
    });
    assert!(
        settled,
        "workers on {:?}, not {others}",
        cpus("moneta-files")
    );
    assert_eq!(cpus("moneta-flusher"), std::slice::from_ref(&others));
    assert_eq!(cpus("moneta-poller"), [last.to_string()]);
}

#[test]
fn a_client_gone_while_its_fsyncs_flush_leaves_the_daemon_well() {
    let dir = TempDir::new("quick-host-gone");
    let img = dir.0.join("img");
    let img_s = img.to_string_lossy().to_string();
    let d = Daemon::start_raw(&["--device", &img_s, "--size", "32M"], dir);
    let open0 = d.control().status().unwrap().channels_open;
    for round in 0..4 {
        let ch = d.channel();
        let h = match ch
            .fs(FsRequest::Open {
                flags: CREAT as u32,
                mode: 0o644,
                path: format!("/g{round}").into_bytes(),
            })
            .unwrap()
        {
            FsReply::Opened { handle, .. } => handle,
            r => panic!("{r:?}"),
        };
        file_write(&ch, h, 0, &[round as u8; 8192]).unwrap();
        // Two fsyncs rung, and the connection dropped before either is answered.
        let fsync = encode_request(1, &Request::Fs(FsRequest::Fsync { handle: h }));
        for _ in 0..2 {
            let tag = ch.tag();
            ch.write_dma(tag, 0, &fsync);
            ch.submit(
                tag,
                &Command::new(Opcode::Fs, Completion::Dma, 0, fsync.len() as u64, 0),
            );
        }
        drop(ch);
    }
    // Every channel goes once its commands are done, and the daemon answers as before.
    let t0 = std::time::Instant::now();
    while d.control().status().unwrap().channels_open > open0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "channels stay open"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ch = d.channel();
    let c = ch.control();
    for round in 0..4 {
        assert_eq!(
            c.fs_stat(format!("/g{round}").as_bytes(), true)
                .unwrap()
                .size,
            8192
        );
    }
    let (h, _, _) = c.fs_open(b"/g3", libc::O_RDWR, 0).unwrap();
    ch.fs(FsRequest::Fsync { handle: h }).unwrap();
}

#[test]
fn many_file_calls_at_once_are_answered_over_several_passes() {
    let d = Daemon::start_fs("32M", &[]);
    let ch = d.channel();
    ch.control().fs(FsRequest::Statfs).unwrap();
    // Another channel reads while the burst is answered: the poller spends a bounded time on
    // file calls in one pass (moneta_device::FILE_CALLS_PER_PASS_NS) and leaves the rest for
    // later passes, so other channels' data never wait long behind them.
    let reader = d.channel();
    let (h, _, _) = reader.control().fs_open(b"/data", CREAT, 0o644).unwrap();
    let x = match reader
        .control()
        .fs(FsRequest::Extend {
            handle: h,
            offset: 0,
            len: 4096,
        })
        .unwrap()
    {
        FsReply::Extents { extents, .. } => extents[0],
        r => panic!("{r:?}"),
    };
    // 64 creates rung at once: each answered once, through the channel (or, when the file
    // system was busy and the workers were taken, referred having changed nothing: the
    // socket then makes the same exclusive create).
    let before = d.control().status().unwrap();
    let mut mask = 0u64;
    let mut msgs = Vec::new();
    for t in 0..64u8 {
        let m = encode_request(
            t as u32,
            &Request::Fs(FsRequest::Open {
                flags: (CREAT | libc::O_EXCL) as u32,
                mode: 0o644,
                path: format!("/burst{t}").into_bytes(),
            }),
        );
        let tag = ch.try_tag().expect("a free tag");
        ch.write_dma(tag, 0, &m);
        ch.prepare(
            tag,
            &Command::new(Opcode::Fs, Completion::Dma, 0, m.len() as u64, 0),
        );
        mask |= 1 << tag.0;
        msgs.push(tag);
    }
    ch.ring(mask);
    let mut buf = vec![0u8; 4096];
    reader.read(x.dev, &mut buf, Completion::Dma).unwrap();
    // The other channel's file calls (asked of the device, not kept) are taken in their turn
    // too, not referred.
    for _ in 0..8 {
        match reader.ask(FsRequest::Stat {
            target: Target::Handle(h),
        }) {
            Ok(FsReply::Stat(st)) => assert_eq!(st.size, 4096),
            r => panic!("{r:?}"),
        }
    }
    let mut referred = 0;
    for (t, tag) in msgs.iter().enumerate() {
        let c = ch.wait(*tag, Completion::Dma).unwrap();
        ch.release(*tag);
        if c.status == Status::Refer {
            referred += 1;
            ch.control()
                .fs_open(format!("/burst{t}").as_bytes(), CREAT | libc::O_EXCL, 0o644)
                .expect("a referred create changed nothing");
            continue;
        }
        assert_eq!(c.status, Status::Ok);
    }
    let after = d.control().status().unwrap();
    assert_eq!(after.fs_calls_referred - before.fs_calls_referred, referred);
    assert!(after.fs_calls >= before.fs_calls + 64 - referred);
    for t in 0..64 {
        ch.control()
            .fs_stat(format!("/burst{t}").as_bytes(), true)
            .unwrap();
    }
}

#[test]
fn files_unlinked_back_to_back_through_the_channel_are_all_freed_without_another_call() {
    let d = Daemon::start_fs("32M", &[]);
    let ch = d.channel();
    // The connection's first file call on the socket publishes its handles for the device.
    ch.control().fs(FsRequest::Statfs).unwrap();
    let open = |name: &str| match ch
        .fs(FsRequest::Open {
            flags: (libc::O_RDWR | libc::O_CREAT) as u32,
            mode: 0o644,
            path: name.as_bytes().to_vec(),
        })
        .unwrap()
    {
        FsReply::Opened { handle, stat, .. } => (handle, stat.ino),
        r => panic!("{r:?}"),
    };
    let mut gone = Vec::new();
    for i in 0..3 {
        let (h, ino) = open(&format!("/a{i}"));
        file_write(&ch, h, 0, &[1u8; 100_000]).unwrap();
        ch.fs(FsRequest::Close { handle: h }).unwrap();
        gone.push(ino);
    }
    // Each unlink leaves its file to the releaser: the first wakes it, the others come
    // while it gathers, and no call on the socket (which would free them itself) follows.
    for i in 0..3 {
        ch.fs(FsRequest::Unlink {
            path: format!("/a{i}").into_bytes(),
        })
        .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // New files take the lowest free inodes: those of the three, once they are freed.
    let mut again: Vec<u64> = (0..3).map(|i| open(&format!("/b{i}")).1).collect();
    again.sort_unstable();
    gone.sort_unstable();
    assert_eq!(again, gone);
}
