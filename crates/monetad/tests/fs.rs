//! nvfs and the permission manager through real processes: every file-system call and its
//! errors over the socket, data through channels, other users, revocation before reuse.

mod common;

use std::time::{Duration, Instant};

use common::*;
use libmoneta::{Channel, ClientError, Control};
use moneta_abi::control::{RIGHT_READ, RIGHT_WRITE};
use moneta_abi::fsproto::*;
use moneta_abi::{Completion, Status};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

/// Entry point of child processes started with `spawn_role_as`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "owner" => owner_role(&args),
        "intruder" => intruder_role(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

fn refused(r: Result<impl std::fmt::Debug, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn target(p: &[u8]) -> Target {
    Target::Path {
        path: p.to_vec(),
        follow: true,
    }
}

#[test]
fn every_call_through_the_socket() {
    let d = Daemon::start_fs("64M", &[]);
    let ch = d.channel();
    let c = ch.control();
    // statfs, mkdir, open/create, stat.
    let FsReply::StatFs(sf) = c.fs(FsRequest::Statfs).unwrap() else {
        panic!()
    };
    assert_eq!(sf.chunk_size, 4096);
    let free0 = sf.chunks_free;
    let FsReply::Stat(dst) = c
        .fs(FsRequest::Mkdir {
            mode: 0o755,
            path: b"/dir".to_vec(),
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(dst.mode, libc::S_IFDIR | 0o755);
    let (h, rights, st) = c
        .fs_open(b"/dir/file", CREAT | libc::O_EXCL, 0o640)
        .unwrap();
    assert_eq!(rights, RIGHT_READ | RIGHT_WRITE);
    assert_eq!((st.size, st.mode), (0, libc::S_IFREG | 0o640));
    assert_eq!(
        refused(c.fs_open(b"/dir/file", CREAT | libc::O_EXCL, 0o640)),
        libc::EEXIST
    );
    assert_eq!(
        refused(c.fs_open(b"/nope/file", CREAT, 0o640)),
        libc::ENOENT
    );
    assert_eq!(refused(c.fs_open(b"/dir", libc::O_WRONLY, 0)), libc::EISDIR);
    assert_eq!(
        refused(c.fs_open(b"/dir/file", libc::O_RDONLY | libc::O_DIRECTORY, 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        refused(c.fs_open(b"dir/file", libc::O_RDONLY, 0)),
        libc::EINVAL
    );
    // Data: extend then write through the channel; read back on another connection.
    let data = pattern(7, 0, 3 << 20);
    file_write(&ch, h, 0, &data).unwrap();
    let (size, ext) = c.fs_lookup(h, 0, u64::MAX).unwrap();
    assert_eq!(size, 3 << 20);
    assert_eq!(
        ext.len(),
        1,
        "a file written sequentially from empty is one extent"
    );
    let other = d.channel();
    let (h2, r2, _) = other
        .control()
        .fs_open(b"/dir/file", libc::O_RDONLY, 0)
        .unwrap();
    assert_eq!(r2, RIGHT_READ);
    assert_eq!(file_read(&other, h2).unwrap(), data);
    // Without a lookup, the channel has no record: a miss.
    let fresh = d.channel();
    let mut b = [0u8; 16];
    assert!(fresh.read(ext[0].dev, &mut b, Completion::Dma).is_err());
    // O_APPEND and sparse writes: a hole reads as zeros.
    file_write(&ch, h, 5 << 20, b"tail").unwrap();
    let back = file_read(&other, h2).unwrap();
    assert_eq!(back.len(), (5 << 20) + 4);
    assert!(back[3 << 20..5 << 20].iter().all(|&x| x == 0));
    assert_eq!(&back[5 << 20..], b"tail");
    // Read-only handles cannot extend.
    assert_eq!(refused(other.control().fs_extend(h2, 0, 1)), libc::EBADF);
    // fstat, fsync, ftruncate, truncate.
    let FsReply::Stat(fst) = c
        .fs(FsRequest::Stat {
            target: Target::Handle(h),
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(fst.size, (5 << 20) + 4);
    c.fs(FsRequest::Fsync { handle: h }).unwrap();
    c.fs(FsRequest::Truncate {
        target: Target::Handle(h),
        size: 100,
    })
    .unwrap();
    assert_eq!(c.fs_stat(b"/dir/file", true).unwrap().size, 100);
    assert_eq!(
        refused(other.control().fs(FsRequest::Truncate {
            target: Target::Handle(h2),
            size: 0
        })),
        libc::EINVAL
    );
    c.fs(FsRequest::Truncate {
        target: target(b"/dir/file"),
        size: 200,
    })
    .unwrap();
    let back = file_read(&ch, h).unwrap();
    assert_eq!(&back[..100], &data[..100]);
    assert!(
        back[100..].iter().all(|&x| x == 0),
        "truncated bytes read as zeros"
    );
    // chmod, chown, utimes.
    c.fs(FsRequest::Chmod {
        target: target(b"/dir/file"),
        mode: 0o600,
    })
    .unwrap();
    c.fs(FsRequest::Chown {
        target: Target::Handle(h),
        uid: 4242,
        gid: u32::MAX,
    })
    .unwrap();
    c.fs(FsRequest::Utimes {
        target: target(b"/dir/file"),
        atime: WireTime { sec: 1000, nsec: 1 },
        mtime: WireTime { sec: 2000, nsec: 2 },
    })
    .unwrap();
    let st = c.fs_stat(b"/dir/file", true).unwrap();
    assert_eq!((st.mode & 0o7777, st.uid), (0o600, 4242));
    assert_eq!((st.atime.sec, st.mtime.sec, st.mtime.nsec), (1000, 2000, 2));
    // link, symlink, readlink, rename, readdir, unlink, rmdir.
    c.fs(FsRequest::Link {
        from: b"/dir/file".to_vec(),
        to: b"/hard".to_vec(),
    })
    .unwrap();
    c.fs(FsRequest::Symlink {
        target: b"dir/file".to_vec(),
        path: b"/soft".to_vec(),
    })
    .unwrap();
    assert_eq!(
        c.fs(FsRequest::Readlink {
            path: b"/soft".to_vec()
        })
        .unwrap(),
        FsReply::Bytes(b"dir/file".to_vec())
    );
    assert_eq!(c.fs_stat(b"/soft", true).unwrap().ino, st.ino);
    assert_eq!(
        c.fs_stat(b"/soft", false).unwrap().mode & libc::S_IFMT,
        libc::S_IFLNK
    );
    assert_eq!(c.fs_stat(b"/hard", true).unwrap().nlink, 2);
    c.fs(FsRequest::Rename {
        flags: 0,
        from: b"/hard".to_vec(),
        to: b"/dir/renamed".to_vec(),
    })
    .unwrap();
    assert_eq!(
        refused(c.fs(FsRequest::Rename {
            flags: RENAME_NOREPLACE,
            from: b"/dir/renamed".to_vec(),
            to: b"/dir/file".to_vec(),
        })),
        libc::EEXIST
    );
    let (dh, _, _) = c
        .fs_open(b"/dir", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .unwrap();
    let FsReply::Dir { entries, end } = c
        .fs(FsRequest::Readdir {
            handle: dh,
            cookie: 0,
        })
        .unwrap()
    else {
        panic!()
    };
    assert!(end);
    let mut names: Vec<_> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "file", "renamed"]);
    assert_eq!(
        refused(c.fs(FsRequest::Rmdir {
            path: b"/dir".to_vec()
        })),
        libc::ENOTEMPTY
    );
    assert_eq!(
        refused(c.fs(FsRequest::Unlink {
            path: b"/dir".to_vec()
        })),
        libc::EISDIR
    );
    c.fs(FsRequest::Unlink {
        path: b"/dir/renamed".to_vec(),
    })
    .unwrap();
    c.fs(FsRequest::Unlink {
        path: b"/soft".to_vec(),
    })
    .unwrap();
    // Unlinked while open: still readable and writable through the handles.
    c.fs(FsRequest::Unlink {
        path: b"/dir/file".to_vec(),
    })
    .unwrap();
    assert_eq!(refused(c.fs_stat(b"/dir/file", true)), libc::ENOENT);
    file_write(&ch, h, 0, b"still here").unwrap();
    assert_eq!(&file_read(&other, h2).unwrap()[..10], b"still here");
    c.fs_close(h).unwrap();
    other.control().fs_close(h2).unwrap();
    c.fs_close(dh).unwrap();
    assert_eq!(refused(c.fs_close(h)), libc::EBADF);
    assert_eq!(refused(c.fs_lookup(h, 0, 1)), libc::EBADF);
    c.fs(FsRequest::Rmdir {
        path: b"/dir".to_vec(),
    })
    .unwrap();
    let FsReply::StatFs(sf) = c.fs(FsRequest::Statfs).unwrap() else {
        panic!()
    };
    assert_eq!(
        sf.chunks_free, free0,
        "the last close freed the unlinked file's space"
    );
    // The records of a closed file are gone from the channel.
    assert!(ch.read(ext[0].dev, &mut b, Completion::Dma).is_err());
}

#[test]
fn a_raw_daemon_refuses_file_calls_and_a_foreign_image_is_refused() {
    let d = Daemon::start(&[]);
    assert_eq!(refused(d.control().fs(FsRequest::Statfs)), libc::EOPNOTSUPP);
    let dir = TempDir::new("foreign");
    let img = dir.0.join("img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--device", img.to_str().unwrap(), "--socket"])
        .arg(dir.0.join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not an nvfs image") && err.contains("moneta mkfs"),
        "{err}"
    );
}

/// Reads through a forged command: a channel command at `addr` whatever the records say.
fn forged_read(ch: &Channel, addr: u64) -> Status {
    let mut buf = [0u8; 64];
    match ch.read(addr, &mut buf, Completion::Dma) {
        Ok(()) => Status::Ok,
        Err(ClientError::Status(s)) => s,
        Err(e) => panic!("unexpected {e}"),
    }
}

fn owner_role(args: &[String]) -> i32 {
    let ch = Channel::open(std::path::Path::new(&args[0])).unwrap();
    let c = ch.control();
    let (h, _, _) = c.fs_open(b"/shared/secret", CREAT, 0o600).unwrap();
    file_write(&ch, h, 0, &[0x5a; 8192]).unwrap();
    let (_, ext) = c.fs_lookup(h, 0, 1).unwrap();
    let (r, _, _) = c.fs_open(b"/shared/readable", CREAT, 0o644).unwrap();
    file_write(&ch, r, 0, &[0x11; 4096]).unwrap();
    let (_, rext) = c.fs_lookup(r, 0, 1).unwrap();
    // Tell the parent where the secret lives, then hold the files open.
    println!("SECRET {} READABLE {}", ext[0].dev, rext[0].dev);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    0
}

fn intruder_role(args: &[String]) -> i32 {
    let ch = Channel::open(std::path::Path::new(&args[0])).unwrap();
    let c = ch.control();
    let secret: u64 = args[1].parse().unwrap();
    let readable: u64 = args[2].parse().unwrap();
    // The file calls refuse.
    assert_eq!(
        refused(c.fs_open(b"/shared/secret", libc::O_RDONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        refused(c.fs_open(b"/shared/secret", libc::O_WRONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        refused(c.fs(FsRequest::Truncate {
            target: target(b"/shared/secret"),
            size: 0
        })),
        libc::EACCES
    );
    assert_eq!(
        refused(c.fs(FsRequest::Chmod {
            target: target(b"/shared/secret"),
            mode: 0o666
        })),
        libc::EPERM
    );
    assert_eq!(
        refused(c.fs(FsRequest::Unlink {
            path: b"/shared/secret".to_vec()
        })),
        libc::EPERM
    );
    // The same calls through the channel (the device answers them with this connection's
    // credentials, whatever the request says) refuse the same way.
    let st = |p: &[u8]| FsRequest::Open {
        flags: libc::O_RDONLY as u32,
        mode: 0,
        path: p.to_vec(),
    };
    assert_eq!(refused(ch.fs(st(b"/shared/secret"))), libc::EACCES);
    assert_eq!(
        refused(ch.fs(FsRequest::Open {
            flags: (libc::O_WRONLY | libc::O_TRUNC) as u32,
            mode: 0,
            path: b"/shared/secret".to_vec(),
        })),
        libc::EACCES
    );
    assert_eq!(
        refused(ch.fs(FsRequest::Unlink {
            path: b"/shared/secret".to_vec()
        })),
        libc::EPERM
    );
    assert_eq!(
        refused(ch.fs(FsRequest::Rename {
            flags: 0,
            from: b"/shared/secret".to_vec(),
            to: b"/shared/taken".to_vec(),
        })),
        libc::EPERM
    );
    // Handles are per connection: guessing one finds nothing, on the socket or through the
    // channel (the owner's handles are 1 and 2, on its own channel).
    for guess in 0..8 {
        assert_eq!(
            refused(ch.fs(FsRequest::Close { handle: guess })),
            libc::EBADF
        );
        assert_eq!(
            refused(ch.fs(FsRequest::Stat {
                target: Target::Handle(guess)
            })),
            libc::EBADF
        );
    }
    let s = c.status().unwrap();
    // All of them, the truncating open too (it would free space: a worker makes it).
    assert!(s.fs_calls >= 20 && s.fs_calls_referred == 0, "{s:?}");
    for guess in 0..8 {
        assert_eq!(refused(c.fs_lookup(guess, 0, 1)), libc::EBADF);
        assert!(ch.lookup(guess, 0, 1 << 20).unwrap().is_none());
    }
    // No hard link to it either (Linux's protected_hardlinks), which would let a later
    // `chown -R` of the intruder's directory by root hand it over.
    assert_eq!(
        refused(c.fs(FsRequest::Link {
            from: b"/shared/secret".to_vec(),
            to: b"/shared/mine".to_vec(),
        })),
        libc::EPERM
    );
    // Forged commands straight at the secret's address miss.
    assert_eq!(forged_read(&ch, secret), Status::PermissionMiss);
    let w = ch.write(secret, &[0xEE; 64], Completion::Dma);
    assert!(
        matches!(w, Err(ClientError::Status(Status::PermissionMiss))),
        "{w:?}"
    );
    // A read-only open of another file installs read rights only; writes are denied, and
    // the records cover that file, not the secret next to it.
    let (h, rights, _) = c.fs_open(b"/shared/readable", libc::O_RDONLY, 0).unwrap();
    assert_eq!(rights, RIGHT_READ);
    assert_eq!(file_read(&ch, h).unwrap(), vec![0x11; 4096]);
    let w = ch.write(readable, &[0xEE; 64], Completion::Dma);
    assert!(
        matches!(w, Err(ClientError::Status(Status::PermissionDenied))),
        "{w:?}"
    );
    assert_ne!(forged_read(&ch, secret), Status::Ok);
    0
}

#[test]
fn other_users_cannot_reach_a_private_file() {
    let d = Daemon::start_fs("64M", &["--socket-mode", "666"]);
    let c = d.control();
    c.fs(FsRequest::Mkdir {
        mode: 0o1777,
        path: b"/shared".to_vec(),
    })
    .unwrap();
    // The socket's directory must be reachable by the other users.
    std::fs::set_permissions(
        &d.dir.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut owner = spawn_role_piped(1000, "owner", &[d.socket.display().to_string()]);
    let mut line = String::new();
    {
        use std::io::BufRead;
        let out = owner.stdout.as_mut().unwrap();
        let mut r = std::io::BufReader::new(out);
        loop {
            line.clear();
            assert!(r.read_line(&mut line).unwrap() > 0, "owner exited early");
            if line.starts_with("SECRET") {
                break;
            }
        }
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    let mut intruder = spawn_role_as(
        1001,
        "intruder",
        &[
            d.socket.display().to_string(),
            f[1].to_string(),
            f[3].to_string(),
        ],
    );
    assert!(
        intruder.wait().unwrap().success(),
        "the intruder's checks hold"
    );
    drop(owner.stdin.take());
    assert!(owner.wait().unwrap().success());
    // The secret is intact.
    let ch = d.channel();
    let (h, _, _) = ch
        .control()
        .fs_open(b"/shared/secret", libc::O_RDONLY, 0)
        .unwrap();
    assert_eq!(file_read(&ch, h).unwrap(), vec![0x5a; 8192]);
}

fn spawn_role_piped(uid: u32, role: &str, args: &[String]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap();
    let copy = std::env::temp_dir().join(format!("moneta-fsrole-{}-{uid}", std::process::id()));
    std::fs::copy(&exe, &copy).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::process::Command::new(&copy)
        .args(["--exact", "child_process_entry", "--nocapture", "--quiet"])
        .env("MONETA_TEST_ROLE", role)
        .env("MONETA_TEST_ARGS", args.join("\u{1f}"))
        .uid(uid)
        .gid(uid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_reader_never_sees_the_bytes_of_a_file_that_reuses_the_space() {
    // Small chunks and a small array so the new file must reuse the freed chunks.
    let d = Daemon::start_fs("16M", &[]);
    let c = d.control();
    let FsReply::StatFs(sf) = c.fs(FsRequest::Statfs).unwrap() else {
        panic!()
    };
    let whole = sf.chunks_free * sf.chunk_size;
    let writer = d.channel();
    let (wh, _, _) = writer.control().fs_open(b"/old", CREAT, 0o644).unwrap();
    file_write(&writer, wh, 0, &vec![0xAA; whole as usize]).unwrap();
    let reader = d.channel();
    let (rh, _, _) = reader
        .control()
        .fs_open(b"/old", libc::O_RDONLY, 0)
        .unwrap();
    let (_, ext) = reader.control().fs_lookup(rh, 0, u64::MAX).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let ext2 = ext.clone();
    let reader_thread = std::thread::spawn(move || {
        let (mut ok, mut refused) = (0u64, 0u64);
        let mut buf = vec![0u8; 4096];
        let mut i = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let x = ext2[(i as usize) % ext2.len()];
            let at = x.dev + (i * 4096 * 7) % x.len;
            match reader.read(at, &mut buf, Completion::Dma) {
                Ok(()) => {
                    assert!(
                        buf.iter().all(|&b| b == 0xAA || b == 0),
                        "the reader saw bytes of another file"
                    );
                    ok += 1;
                }
                Err(ClientError::Status(Status::PermissionMiss)) => refused += 1,
                Err(e) => panic!("{e}"),
            }
            i += 1;
        }
        (ok, refused)
    });
    std::thread::sleep(Duration::from_millis(20));
    // Truncate to zero through another process's connection, then a new file takes the space.
    c.fs(FsRequest::Truncate {
        target: target(b"/old"),
        size: 0,
    })
    .unwrap();
    let w2 = d.channel();
    let (nh, _, _) = w2.control().fs_open(b"/new", CREAT, 0o644).unwrap();
    let t = Instant::now();
    let mut rounds = 0;
    while t.elapsed() < Duration::from_millis(200) || rounds < 3 {
        file_write(&w2, nh, 0, &vec![0xBB; whole as usize]).unwrap();
        rounds += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, refused) = reader_thread.join().unwrap();
    assert!(
        refused > 0,
        "the reader's records were revoked ({ok} reads went through first)"
    );
    // The reader's own handle still works: the file is now empty.
    let r2 = d.channel();
    let (rh2, _, _) = r2.control().fs_open(b"/old", libc::O_RDONLY, 0).unwrap();
    assert!(file_read(&r2, rh2).unwrap().is_empty());
    let _ = Control::connect(&d.socket).unwrap().ping();
}

#[test]
fn a_connection_keeps_the_rights_its_remaining_handles_carry() {
    let d = Daemon::start_fs("64M", &[]);
    let ch = d.channel();
    let c = ch.control();
    let (rw, _, _) = c.fs_open(b"/f", CREAT, 0o644).unwrap();
    let (ro, rights, _) = c.fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    assert_eq!(rights, RIGHT_READ);
    file_write(&ch, rw, 0, &[3; 4096]).unwrap();
    let (_, ext) = c.fs_lookup(ro, 0, 1).unwrap();
    let dev = ext[0].dev;
    // Looked up through the read-only handle, the record still carries the union: write.
    ch.write(dev, &[4; 16], Completion::Dma).unwrap();
    // Closing the read-only handle changes nothing the connection may do.
    let (ro2, _, _) = c.fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    c.fs_close(ro2).unwrap();
    ch.write(dev, &[5; 16], Completion::Dma).unwrap();
    // Closing the writable one drops write: the records go, and a new lookup gives read only.
    c.fs_close(rw).unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(
        ch.read(dev, &mut b, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
    c.fs_lookup(ro, 0, 1).unwrap();
    ch.read(dev, &mut b, Completion::Dma).unwrap();
    assert_eq!(b, [5; 16]);
    assert!(matches!(
        ch.write(dev, &[6; 16], Completion::Dma),
        Err(ClientError::Status(Status::PermissionDenied))
    ));
    c.fs_close(ro).unwrap();
    assert!(matches!(
        ch.read(dev, &mut b, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
}

/// Reads 512 bytes at `dev` asking for layout tag `file`: the command's status.
fn read_tagged(ch: &Channel, dev: u64, file: u64) -> Status {
    let cmd = moneta_abi::Command::new(moneta_abi::Opcode::Read, Completion::Dma, dev, 512, file);
    ch.run(libmoneta::Tag(0), &cmd).unwrap().status
}

#[test]
fn layout_tags_change_when_space_leaves_a_file() {
    let d = Daemon::start_fs("16M", &["--chunk-size", "64K"]);
    let ch = d.channel();
    let c = ch.control();
    let (h, _, _) = c.fs_open(b"/f", CREAT, 0o644).unwrap();
    let grown = c.fs_extend_mapped(h, 0, 256 << 10).unwrap();
    assert_ne!(grown.file, 0, "a tag is never 0");
    let first = c.fs_lookup_mapped(h, 0, u64::MAX).unwrap();
    assert_eq!(first.file, grown.file, "growing keeps the tag");
    let x = first.extents[0];
    // Commands asking for the file's tag, or for none, pass; another tag misses.
    assert_eq!(read_tagged(&ch, x.dev, first.file), Status::Ok);
    assert_eq!(read_tagged(&ch, x.dev, 0), Status::Ok);
    assert_eq!(
        read_tagged(&ch, x.dev, first.file + 1),
        Status::PermissionMiss
    );
    // Another file has its own tag.
    let (g, _, _) = c.fs_open(b"/g", CREAT, 0o644).unwrap();
    let gm = c.fs_extend_mapped(g, 0, 64 << 10).unwrap();
    assert_ne!(gm.file, first.file);
    assert_eq!(
        read_tagged(&ch, gm.extents[0].dev, first.file),
        Status::PermissionMiss
    );
    // A read-write file's first growth left room past its end (docs/abi.md §3.9): the first
    // shrink gives the room back, and with it comes a new tag.
    c.fs(FsRequest::Truncate {
        target: Target::Handle(h),
        size: (256 << 10) - 100,
    })
    .unwrap();
    let first = c.fs_lookup_mapped(h, 0, 1).unwrap();
    assert_ne!(first.file, grown.file);
    // Shrinking within the last chunk frees nothing: same tag.
    c.fs(FsRequest::Truncate {
        target: Target::Handle(h),
        size: (256 << 10) - 200,
    })
    .unwrap();
    assert_eq!(c.fs_lookup_mapped(h, 0, 1).unwrap().file, first.file);
    // Freeing space gives a new tag; the file grown again over the same space answers to the
    // new tag only.
    c.fs(FsRequest::Truncate {
        target: Target::Handle(h),
        size: 0,
    })
    .unwrap();
    let again = c.fs_extend_mapped(h, 0, 256 << 10).unwrap();
    assert_ne!(again.file, first.file);
    let y = again.extents[0];
    assert_eq!(read_tagged(&ch, y.dev, again.file), Status::Ok);
    assert_eq!(read_tagged(&ch, y.dev, first.file), Status::PermissionMiss);
    // Closing the last handle drops the records of every tag the channel was given.
    c.fs_close(g).unwrap();
    assert_eq!(
        read_tagged(&ch, gm.extents[0].dev, 0),
        Status::PermissionMiss
    );
    c.fs_close(h).unwrap();
    assert_eq!(read_tagged(&ch, x.dev, 0), Status::PermissionMiss);
    assert_eq!(read_tagged(&ch, y.dev, 0), Status::PermissionMiss);
    // Reopened, the file starts a new tag.
    let (h, _, _) = c.fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    let reopened = c.fs_lookup_mapped(h, 0, 1).unwrap();
    assert!(reopened.file > again.file, "tags are not reused");
    assert_eq!(
        read_tagged(&ch, reopened.extents[0].dev, reopened.file),
        Status::Ok
    );
}

/// `OP_LOOKUP`, the soft miss through the channel: answered by the poller from the handles the
/// connection holds, with the records installed; anything it cannot answer is referred to the
/// control socket.
#[test]
fn lookups_through_the_channel() {
    // Three channels, so that ids come back soon.
    let d = Daemon::start_fs("16M", &["--chunk-size", "64K", "--max-channels", "3"]);
    let ch = d.channel();
    let c = ch.control();
    let (h, _, _) = c.fs_open(b"/f", CREAT, 0o644).unwrap();
    let grown = c.fs_extend_mapped(h, 0, 128 << 10).unwrap();
    c.fs(FsRequest::Truncate {
        target: Target::Handle(h),
        size: 100_000,
    })
    .unwrap();
    c.fs_close(h).unwrap();
    // A fresh open: the channel holds no records of the file.
    let (h, _, _) = c.fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    let x = grown.extents[0];
    assert_eq!(read_tagged(&ch, x.dev, 0), Status::PermissionMiss);
    let m = ch
        .lookup(h, 10, 1)
        .unwrap()
        .expect("answered by the device");
    assert_eq!(
        m,
        c.fs_lookup_mapped(h, 10, 1).unwrap(),
        "the same answer as the socket's"
    );
    assert_eq!(m.size, 100_000);
    assert_eq!(m.extents[0].dev, x.dev);
    assert_eq!(read_tagged(&ch, x.dev, m.file), Status::Ok);
    // Read-only: the records carry read rights only.
    let w = ch.write(x.dev, &[1; 16], Completion::Dma);
    assert!(
        matches!(w, Err(ClientError::Status(Status::PermissionDenied))),
        "{w:?}"
    );
    // Past the end: no runs.
    assert!(ch
        .lookup(h, 200_000, 1)
        .unwrap()
        .unwrap()
        .extents
        .is_empty());
    // A handle this connection does not hold, or no longer holds, is referred.
    assert!(ch.lookup(h + 1, 0, 1).unwrap().is_none());
    c.fs_close(h).unwrap();
    assert!(ch.lookup(h, 0, 1).unwrap().is_none());
    assert_eq!(
        read_tagged(&ch, x.dev, 0),
        Status::PermissionMiss,
        "close removed them"
    );
    // Another connection's handles are not this channel's, even with the same numbers.
    let other = d.channel();
    let (oh, _, _) = other.control().fs_open(b"/f", libc::O_RDONLY, 0).unwrap();
    assert!(ch.lookup(oh, 0, 1).unwrap().is_none());
    assert!(other.lookup(oh, 0, 1).unwrap().is_some());
    // A zero length is malformed.
    assert!(matches!(
        other.lookup(oh, 0, 0),
        Err(ClientError::Status(Status::Malformed))
    ));
    // A directory handle has no extents: referred, and the socket says why.
    let (dh, _, _) = c
        .fs_open(b"/", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .unwrap();
    assert!(ch.lookup(dh, 0, 1).unwrap().is_none());
    assert_eq!(refused(c.fs_lookup(dh, 0, 1)), libc::EINVAL);
    // A channel id given to a new connection sees none of the old one's handles.
    let id = other.id();
    drop(other);
    let mut reused = None;
    for _ in 0..100 {
        let Ok(n) = libmoneta::Channel::open(&d.socket) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if n.id() == id {
            reused = Some(n);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let reused = reused.expect("the channel id comes back");
    assert!(reused.lookup(oh, 0, 1).unwrap().is_none());
    // The device counted three answers and five referrals (the malformed one is neither).
    let st = d.control().status().unwrap();
    assert_eq!((st.lookups, st.lookups_referred), (3, 5));
}

#[test]
fn a_raw_daemon_refers_lookups() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    assert!(ch.lookup(1, 0, 1).unwrap().is_none());
}
