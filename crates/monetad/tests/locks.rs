//! Advisory locks between processes through a real daemon: POSIX record locks (owned by the
//! connection, that is the process), OFD locks and `flock` locks (owned by the open file
//! description, shared with forked children), their release on close, at the end of a session
//! and when the holder is killed, deadlock detection for waiters, bad requests and limits.
//!
//! Separate connections play separate processes; forked children play real ones. The tests of
//! this file run one at a time: a fork copies every open file of the process into the child's
//! bundle, which would hold another test's open file descriptions (and their locks) open.

mod common;

use std::time::Duration;

use common::*;
use libmoneta::{File, LockCmd, LockInfo, LockKind, LockType, Moneta, OpenOptions};
use moneta_abi::control::{decode_reply, encode_request, errno, Request};
use moneta_abi::fsproto::{FsRequest, LOCK_OFFSET_MAX, OP_FS_LOCK};
use monetad::locks::{MAX_LOCKS_PER_FILE, MAX_LOCKS_PER_OWNER};

use LockKind::{Flock, Ofd, Posix};
use LockType::{Read, Unlock, Write};

/// A waiting set (one try); the errno on failure.
fn set_waiting(f: &File, kind: LockKind, ty: LockType, start: u64, len: u64) -> Result<(), i32> {
    f.lock(kind, LockCmd::Set, ty, start, len, true)
        .map(|_| ())
        .map_err(|e| e.errno())
}

fn test(f: &File, kind: LockKind, ty: LockType, start: u64, len: u64) -> Option<LockInfo> {
    f.lock(kind, LockCmd::Test, ty, start, len, false)
        .expect("lock test")
}

fn info(ty: LockType, pid: i32, start: u64, len: u64) -> Option<LockInfo> {
    Some(LockInfo {
        ty,
        pid,
        start,
        len,
    })
}

fn me() -> i32 {
    std::process::id() as i32
}

/// Runs `body` in a forked child and returns its exit code (99 if it panicked). The child
/// leaves with `_exit`, so nothing of the test harness runs twice.
fn in_child(body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child runs `body` and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(99);
        // SAFETY: ends the child without running the parent's destructors or harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn read_locks_share_and_write_locks_exclude_between_processes() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let fa = a.open("/f", &rw()).unwrap();
    let fb = b.open("/f", &rw()).unwrap();

    set(&fa, Posix, Read, 0, 100).unwrap();
    set(&fb, Posix, Read, 50, 100).unwrap();
    assert_eq!(set(&fb, Posix, Write, 0, 10), Err(errno::EAGAIN));
    assert_eq!(set(&fa, Posix, Write, 120, 1), Err(errno::EAGAIN));
    // Converting its own range to a write lock conflicts with nobody else's there.
    set(&fa, Posix, Write, 0, 50).unwrap();
    assert_eq!(set(&fb, Posix, Read, 49, 1), Err(errno::EAGAIN));
    // ...but the overlap with B's read lock does.
    assert_eq!(set(&fa, Posix, Write, 0, 60), Err(errno::EAGAIN));
    // A refused set changes nothing: A still holds a write lock on [0, 50) only.
    assert_eq!(test(&fb, Posix, Write, 0, 0), info(Write, me(), 0, 50));
    set(&fb, Posix, Read, 150, 0).unwrap();
    assert_eq!(set(&fa, Posix, Write, 1 << 40, 1), Err(errno::EAGAIN));
    // Unlocking everything lets the other side in.
    set(&fa, Posix, Unlock, 0, 0).unwrap();
    set(&fb, Posix, Write, 0, 50).unwrap();
    assert_eq!(set(&fa, Posix, Read, 10, 1), Err(errno::EAGAIN));
}

#[test]
fn an_owner_splits_merges_and_converts_its_ranges() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let fa = a.open("/f", &rw()).unwrap();
    let fb = b.open("/f", &rw()).unwrap();

    set(&fa, Posix, Write, 0, 100).unwrap();
    set(&fa, Posix, Unlock, 40, 20).unwrap();
    // [0, 40) and [60, 100) are left.
    set(&fb, Posix, Write, 40, 20).unwrap();
    set(&fb, Posix, Unlock, 40, 20).unwrap();
    assert_eq!(test(&fb, Posix, Read, 0, 0), info(Write, me(), 0, 40));
    assert_eq!(test(&fb, Posix, Read, 40, 0), info(Write, me(), 60, 40));
    assert_eq!(test(&fb, Posix, Read, 40, 20), None);
    // Filling the hole merges the three ranges into one.
    set(&fa, Posix, Write, 40, 20).unwrap();
    assert_eq!(test(&fb, Posix, Read, 99, 1), info(Write, me(), 0, 100));
    // Converting the middle to a read lock splits it; B may share the middle only.
    set(&fa, Posix, Read, 10, 10).unwrap();
    assert_eq!(test(&fb, Posix, Read, 0, 0), info(Write, me(), 0, 10));
    assert_eq!(test(&fb, Posix, Write, 10, 10), info(Read, me(), 10, 10));
    set(&fb, Posix, Read, 12, 5).unwrap();
    assert_eq!(set(&fb, Posix, Read, 20, 1), Err(errno::EAGAIN));
    // A lock to the end reports length 0.
    set(&fa, Posix, Write, 1000, 0).unwrap();
    assert_eq!(test(&fb, Posix, Read, 5000, 1), info(Write, me(), 1000, 0));
    // The last byte of the range is addressable.
    set(&fb, Posix, Write, LOCK_OFFSET_MAX - 9, 0).unwrap_err();
    set(&fa, Posix, Unlock, 0, 0).unwrap();
    set(&fb, Posix, Write, LOCK_OFFSET_MAX, 1).unwrap();
    assert_eq!(
        test(&fa, Posix, Read, 1 << 62, 0),
        info(Write, me(), LOCK_OFFSET_MAX, 0)
    );
}

#[test]
fn getlk_reports_the_conflicting_lock() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let fa = a.open("/f", &rw()).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    assert_eq!(test(&fb, Posix, Write, 0, 0), None);
    set(&fa, Posix, Read, 10, 5).unwrap();
    set(&fa, Ofd, Write, 100, 10).unwrap();
    // A read test passes read locks by and stops at the OFD write lock: pid -1 as in Linux.
    assert_eq!(test(&fb, Posix, Read, 0, 0), info(Write, -1, 100, 10));
    assert_eq!(test(&fb, Ofd, Write, 0, 0), info(Read, me(), 10, 5));
    assert_eq!(test(&fb, Ofd, Write, 15, 85), None);
    // The owner's own locks never conflict with its tests, but a POSIX lock and an OFD lock
    // of one process do conflict with each other.
    assert_eq!(test(&fa, Posix, Write, 10, 5), None);
    assert_eq!(test(&fa, Posix, Write, 100, 1), info(Write, -1, 100, 10));
    assert_eq!(test(&fa, Ofd, Write, 10, 1), info(Read, me(), 10, 5));
    assert_eq!(set(&fa, Posix, Read, 105, 1), Err(errno::EAGAIN));
}

#[test]
fn closing_any_handle_of_the_file_releases_the_process_locks() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let f1 = a.open("/f", &rw()).unwrap();
    let other = a.open("/g", &rw()).unwrap();
    set(&f1, Posix, Write, 0, 10).unwrap();
    set(&f1, Ofd, Write, 20, 10).unwrap();
    set(&other, Posix, Write, 0, 10).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    let gb = b.open("/g", &rw()).unwrap();
    assert_eq!(set(&fb, Posix, Write, 0, 10), Err(errno::EAGAIN));

    // Another descriptor of the same file, opened and closed: the POSIX locks go...
    let f2 = a.open("/f", OpenOptions::new().read(true)).unwrap();
    f2.close().unwrap();
    set(&fb, Posix, Write, 0, 10).unwrap();
    // ...but not the OFD lock of the first open, nor the locks on other files.
    assert_eq!(set(&fb, Posix, Write, 20, 10), Err(errno::EAGAIN));
    assert_eq!(set(&gb, Posix, Write, 0, 10), Err(errno::EAGAIN));
    // Closing the open file description that holds the OFD lock releases it.
    drop(f1);
    set(&fb, Posix, Write, 20, 10).unwrap();
    drop(other);
    set(&gb, Posix, Write, 0, 10).unwrap();
}

#[test]
fn session_end_releases_every_lock() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let b = Moneta::connect(&d.socket).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    // A bare connection, which never closes its handle: only the end of the session does.
    let ctl = d.control();
    let (handle, _, _) = ctl.fs_open(b"/f", libc::O_RDWR, 0).unwrap();
    for (kind, ty, start, len) in [
        (Posix, Write, 0, 10),
        (Ofd, Read, 10, 10),
        (Flock, Write, 0, 0),
    ] {
        ctl.fs(FsRequest::Lock {
            handle,
            kind,
            cmd: LockCmd::Set,
            ty,
            wait: false,
            start,
            len,
        })
        .unwrap();
    }
    assert_eq!(set(&fb, Posix, Write, 0, 20), Err(errno::EAGAIN));
    assert_eq!(set(&fb, Flock, Read, 0, 0), Err(errno::EAGAIN));
    drop(ctl);
    assert!(eventually(Duration::from_secs(5), || set(
        &fb, Posix, Write, 0, 20
    )
    .is_ok()));
    set(&fb, Flock, Write, 0, 0).unwrap();
}

#[test]
fn killing_the_holder_releases_its_locks() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let socket = d.socket.clone();
    let (r, w) = rustix::pipe::pipe().unwrap();
    // SAFETY: the child only runs the closure below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        drop(r);
        let run = || {
            let m = Moneta::connect(&socket).unwrap();
            let f = m.open("/k", &rw()).unwrap();
            set(&f, Posix, Write, 0, 10).unwrap();
            set(&f, Ofd, Write, 10, 10).unwrap();
            set(&f, Flock, Write, 0, 0).unwrap();
            rustix::io::write(&w, b"x").unwrap();
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
        // SAFETY: ends the child without running the parent's destructors or harness.
        unsafe { libc::_exit(99) };
    }
    drop(w);
    let mut byte = [0u8; 1];
    assert_eq!(
        rustix::io::read(&r, &mut byte).unwrap(),
        1,
        "the child could not take its locks"
    );
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/k", &rw()).unwrap();
    assert_eq!(test(&f, Posix, Read, 0, 0), info(Write, pid, 0, 10));
    assert_eq!(test(&f, Posix, Read, 10, 0), info(Write, -1, 10, 10));
    assert_eq!(set(&f, Posix, Write, 0, 20), Err(errno::EAGAIN));
    assert_eq!(set(&f, Flock, Read, 0, 0), Err(errno::EAGAIN));

    // SAFETY: signals and reaps our own child.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGKILL), 0);
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFSIGNALED(status));
    }
    assert!(eventually(Duration::from_secs(5), || set(
        &f, Posix, Write, 0, 20
    )
    .is_ok()));
    set(&f, Flock, Write, 0, 0).unwrap();
    assert_eq!(test(&f, Ofd, Write, 0, 0), info(Write, me(), 0, 20));
}

#[test]
fn ofd_locks_are_shared_with_a_forked_child_and_posix_locks_are_not() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/f", &rw()).unwrap();
    set(&f, Ofd, Write, 0, 10).unwrap();
    set(&f, Posix, Write, 100, 10).unwrap();
    // A second open of the file is another open file description: it conflicts, even in the
    // same process.
    let g = m.open("/f", &rw()).unwrap();
    assert_eq!(set(&g, Ofd, Write, 5, 1), Err(errno::EAGAIN));
    assert_eq!(test(&g, Ofd, Read, 0, 0), info(Write, -1, 0, 10));

    let parent = me();
    let code = in_child(|| {
        // The inherited file carries the parent's open file description: its OFD lock is
        // this one's too, and extending it conflicts with nothing.
        if set(&f, Ofd, Write, 0, 10).is_err() || set(&f, Ofd, Write, 10, 10).is_err() {
            return 1;
        }
        // The parent's POSIX lock is not the child's.
        if set(&f, Posix, Read, 100, 1) != Err(errno::EAGAIN) {
            return 2;
        }
        if test(&f, Posix, Read, 100, 1) != info(Write, parent, 100, 10) {
            return 3;
        }
        // The child's own POSIX lock conflicts with the shared OFD lock.
        if set(&f, Posix, Read, 5, 1) != Err(errno::EAGAIN) {
            return 4;
        }
        if set(&f, Posix, Write, 50, 10).is_err() {
            return 5;
        }
        0
    });
    assert_eq!(code, 0, "child check {code} failed");
    // The child extended the shared lock; its own POSIX lock went with it.
    assert_eq!(test(&g, Ofd, Read, 0, 0), info(Write, -1, 0, 20));
    assert!(eventually(Duration::from_secs(5), || test(
        &g, Posix, Read, 50, 10
    )
    .is_none()));
    // The child's exit closed its copy, not the parent's: the OFD lock stays.
    assert_eq!(set(&g, Ofd, Write, 15, 1), Err(errno::EAGAIN));

    // A child unlocks through its copy: the parent's lock is gone too.
    let code = in_child(|| match set(&f, Ofd, Unlock, 0, 0) {
        Ok(()) => 0,
        Err(_) => 1,
    });
    assert_eq!(code, 0);
    set(&g, Ofd, Write, 0, 20).unwrap();
    assert_eq!(set(&f, Ofd, Read, 0, 1), Err(errno::EAGAIN));
    // The last close of g's open file description releases its lock (the child's copy of g
    // went when the daemon saw the child's connection end).
    g.close().unwrap();
    assert!(eventually(Duration::from_secs(5), || set(
        &f, Ofd, Read, 0, 1
    )
    .is_ok()));
}

#[test]
fn flock_is_whole_file_and_independent_of_record_locks() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let fa = a.open("/f", &rw()).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    set(&fa, Posix, Write, 0, 0).unwrap();
    set(&fa, Ofd, Write, 0, 0).unwrap_err();
    // Record locks do not stop flock, in either direction.
    set(&fb, Flock, Write, 0, 0).unwrap();
    set(&fa, Posix, Unlock, 0, 0).unwrap();
    set(&fa, Posix, Write, 0, 0).unwrap();
    // flock on a read-only open may be exclusive; start and length are ignored.
    let ro = a.open("/f", OpenOptions::new().read(true)).unwrap();
    assert_eq!(set(&ro, Flock, Read, 5, 5), Err(errno::EAGAIN));
    set(&fb, Flock, Read, 0, 0).unwrap();
    set(&ro, Flock, Read, 0, 0).unwrap();
    assert_eq!(set(&ro, Flock, Write, 0, 0), Err(errno::EAGAIN));
    // That failed conversion dropped ro's shared lock (as Linux does), so fb may upgrade.
    set(&fb, Flock, Write, 0, 0).unwrap();
    set(&fb, Flock, Unlock, 0, 0).unwrap();
    set(&ro, Flock, Write, 0, 0).unwrap();
    assert_eq!(set(&fb, Flock, Read, 0, 0), Err(errno::EAGAIN));
    // A flock lock cannot be tested.
    let e = fb
        .lock(Flock, LockCmd::Test, Read, 0, 0, false)
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    // The last close of its open file description releases it.
    ro.close().unwrap();
    fb.lock_wait(Flock, Write, 0, 0).unwrap();
}

#[test]
fn waiting_in_a_cycle_fails_with_edeadlk() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let (a, b) = (
        Moneta::connect(&d.socket).unwrap(),
        Moneta::connect(&d.socket).unwrap(),
    );
    let fa = a.open("/f", &rw()).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    set(&fa, Posix, Write, 0, 10).unwrap();
    set(&fb, Posix, Write, 10, 10).unwrap();
    // A waits for B; B waiting for A would never end.
    assert_eq!(set_waiting(&fa, Posix, Write, 10, 1), Err(errno::EAGAIN));
    assert_eq!(set_waiting(&fb, Posix, Write, 0, 1), Err(errno::EDEADLK));
    // Without wait it is a plain conflict.
    assert_eq!(set(&fb, Posix, Write, 0, 1), Err(errno::EAGAIN));

    // With a real waiter: A blocks in lock_wait; B's wait is refused; B gives way.
    std::thread::scope(|sc| {
        let waiter = sc.spawn(|| fa.lock_wait(Posix, Write, 10, 1));
        std::thread::sleep(Duration::from_millis(100));
        let e = fb.lock_wait(Posix, Write, 0, 1).unwrap_err();
        assert_eq!(e.errno(), errno::EDEADLK);
        assert!(!waiter.is_finished());
        set(&fb, Posix, Unlock, 10, 10).unwrap();
        waiter.join().unwrap().unwrap();
    });
    assert_eq!(test(&fb, Posix, Read, 0, 0), info(Write, me(), 0, 11));

    // Open file descriptions wait for each other the same way, even in one process.
    let f1 = a.open("/g", &rw()).unwrap();
    let f2 = a.open("/g", &rw()).unwrap();
    set(&f1, Ofd, Write, 0, 10).unwrap();
    set(&f2, Ofd, Write, 10, 10).unwrap();
    assert_eq!(set_waiting(&f1, Ofd, Read, 15, 1), Err(errno::EAGAIN));
    assert_eq!(set_waiting(&f2, Ofd, Read, 5, 1), Err(errno::EDEADLK));
    // A success drops the waiter's edges: then f2 may wait for f1.
    set(&f1, Ofd, Write, 100, 1).unwrap();
    assert_eq!(set_waiting(&f2, Ofd, Read, 5, 1), Err(errno::EAGAIN));
}

#[test]
fn bad_requests_are_refused() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    m.create("/f").unwrap().close().unwrap();
    let ro = m.open("/f", OpenOptions::new().read(true)).unwrap();
    let wo = m.open("/f", OpenOptions::new().write(true)).unwrap();
    // Record locks need the matching open mode; unlocking and testing do not.
    assert_eq!(set(&ro, Posix, Write, 0, 1), Err(errno::EBADF));
    assert_eq!(set(&ro, Ofd, Write, 0, 1), Err(errno::EBADF));
    assert_eq!(set(&wo, Posix, Read, 0, 1), Err(errno::EBADF));
    assert_eq!(set(&wo, Ofd, Read, 0, 1), Err(errno::EBADF));
    set(&ro, Posix, Read, 0, 1).unwrap();
    set(&wo, Posix, Write, 10, 1).unwrap();
    set(&ro, Posix, Unlock, 0, 0).unwrap();
    assert_eq!(test(&ro, Posix, Write, 0, 0), None);
    // Ranges past off_t, a test for "unlock".
    assert_eq!(
        set(&wo, Posix, Write, LOCK_OFFSET_MAX + 1, 0),
        Err(errno::EINVAL)
    );
    assert_eq!(set(&wo, Posix, Write, 10, u64::MAX), Err(errno::EINVAL));
    assert_eq!(
        set(&wo, Posix, Write, LOCK_OFFSET_MAX, 2),
        Err(errno::EINVAL)
    );
    assert_eq!(set(&wo, Ofd, Unlock, u64::MAX, 1), Err(errno::EINVAL));
    let e = wo
        .lock(Posix, LockCmd::Test, Unlock, 0, 0, false)
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);

    // A handle the connection does not hold.
    let ctl = d.control();
    let lock = |handle| FsRequest::Lock {
        handle,
        kind: Posix,
        cmd: LockCmd::Set,
        ty: Read,
        wait: false,
        start: 0,
        len: 0,
    };
    let e = ctl.fs(lock(ro.handle())).unwrap_err();
    assert_eq!(e.errno(), errno::EBADF);

    // Unknown kind, cmd, type or wait values make the message malformed.
    let good = encode_request(7, &Request::Fs(lock(1)));
    for at in [24, 28, 32, 36] {
        let mut bad = good.clone();
        bad[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
        ctl.send_raw(&bad).unwrap();
        let (reply, _) = ctl.recv_raw().unwrap();
        let r = decode_reply(&reply, OP_FS_LOCK).unwrap();
        assert_eq!(r.result.unwrap_err().errno, errno::EPROTO, "field at {at}");
    }
    ctl.ping().unwrap();
}

#[test]
fn lock_limits_refuse_with_enolck() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/f", &rw()).unwrap();
    // One process: every other byte, up to its limit.
    let n = MAX_LOCKS_PER_OWNER as u64;
    for i in 0..n {
        set(&f, Posix, Read, 2 * i, 1).unwrap();
    }
    assert_eq!(set(&f, Posix, Read, 2 * n, 1), Err(errno::ENOLCK));
    // Splitting a range needs one more lock too; merging two frees one.
    set(&f, Posix, Read, 2 * n, 1).unwrap_err();
    set(&f, Posix, Read, 1, 1).unwrap();
    set(&f, Posix, Read, 2 * n, 1).unwrap();
    assert_eq!(set(&f, Posix, Unlock, 1, 1), Err(errno::ENOLCK));
    f.close().unwrap();

    // One file: open file descriptions of one process fill it up.
    let per = MAX_LOCKS_PER_FILE / MAX_LOCKS_PER_OWNER;
    let files: Vec<File> = (0..per).map(|_| m.open("/g", &rw()).unwrap()).collect();
    for (k, g) in files.iter().enumerate() {
        let base = (k as u64) << 32;
        for i in 0..n {
            set(g, Ofd, Read, base + 2 * i, 1).unwrap();
        }
    }
    let last = m.open("/g", &rw()).unwrap();
    assert_eq!(set(&last, Ofd, Read, 1, 1), Err(errno::ENOLCK));
    assert_eq!(set(&last, Flock, Read, 0, 0), Err(errno::ENOLCK));
    drop(files);
    set(&last, Ofd, Read, 1, 1).unwrap();
}
