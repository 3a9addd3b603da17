//! `fork` with libmoneta: a child gets its own channel, keeps its parent's open files with
//! their shared positions, never uses the parent's tags, and bundles nobody claims are
//! released when the processes that could claim them are gone.

mod common;

use std::io::{Read, SeekFrom, Write};
use std::time::{Duration, Instant};

use common::*;
use libmoneta::{Moneta, OpenOptions};

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

/// Runs `body` in a forked child and returns its exit code (the body's value; 99 if it
/// panicked). The child leaves with `_exit`, so nothing of the test harness runs twice.
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
fn fork_keeps_files_and_shares_positions() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let parent_channel = m.channel().id();

    // Shared position: the parent reads 5 bytes, the child reads the next 5 and writes at
    // the position it leaves, and the parent then continues after the child's bytes.
    let mut f = m.open("/shared", &rw()).unwrap();
    f.write_all(b"0123456789abcdefghij").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut five = [0u8; 5];
    f.read_exact(&mut five).unwrap();
    assert_eq!(&five, b"01234");
    let code = in_child(|| {
        if m.channel().id() == parent_channel {
            return 1; // must have its own channel
        }
        let mut b = [0u8; 5];
        if f.read(&mut b).unwrap_or(0) != 5 || &b != b"56789" {
            return 2;
        }
        if f.write(b"XY").ok() != Some(2) {
            return 3;
        }
        // New files work too, and the parent's handle number is not the child's.
        let g = m.open("/from-child", &rw()).unwrap();
        g.write_at(b"child was here", 0).unwrap();
        g.close().unwrap();
        0
    });
    assert_eq!(code, 0, "child check {code} failed");
    assert_eq!(
        f.position(),
        12,
        "the child's reads and writes moved the shared position"
    );
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"cdefghij");
    let mut all = vec![0u8; 20];
    f.read_at(&mut all, 0).unwrap();
    assert_eq!(&all, b"0123456789XYcdefghij");
    let g = m
        .open("/from-child", OpenOptions::new().read(true))
        .unwrap();
    let mut buf = [0u8; 14];
    g.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"child was here");
    drop(g);
    // The parent's channel and handle still work after the child left.
    f.write_at(b"!", 20).unwrap();
    assert_eq!(f.len().unwrap(), 21);

    // A file the parent closes and unlinks right after the fork stays readable in the child,
    // as an inherited descriptor would.
    let h = m.open("/doomed", &rw()).unwrap();
    h.write_at(&pattern(7, 0, 300_000), 0).unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    // SAFETY: the child only runs the closure below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = [0u8; 1];
        let _ = rustix::io::read(&r, &mut b);
        let mut got = vec![0u8; 300_000];
        let code = match h.read_at(&mut got, 0) {
            Ok(300_000) if got == pattern(7, 0, 300_000) => 0,
            Ok(_) => 11,
            Err(_) => 12,
        };
        // SAFETY: as in `in_child`.
        unsafe { libc::_exit(code) };
    }
    h.close().unwrap();
    m.unlink("/doomed").unwrap();
    rustix::io::write(&w, b"x").unwrap();
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}"
    );

    // A request in flight in the parent is not the child's: it ends with ECANCELED there,
    // and completes normally in the parent.
    let mut p = f.submit_read(vec![0u8; 4096], 0).unwrap();
    let code = in_child(|| match p.wait() {
        Err(e) if e.errno() == libc::ECANCELED => 0,
        _ => 20,
    });
    assert_eq!(code, 0);
    assert_eq!(p.wait().unwrap(), 21);
    drop(p);

    // A grandchild inherits through a child that forked before touching anything.
    let code = in_child(|| {
        in_child(|| {
            let mut b = [0u8; 3];
            match f.read_at(&mut b, 0) {
                Ok(3) if &b == b"012" => 0,
                _ => 30,
            }
        })
    });
    assert_eq!(code, 0);
}

#[test]
fn unclaimed_bundles_are_released() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let free0 = m.statfs().unwrap().chunks_free;
    let f = m.open("/big", &rw()).unwrap();
    f.write_at(&vec![1u8; 3 << 20], 0).unwrap();
    m.unlink("/big").unwrap();
    // Children that exit at once, never using Moneta: their bundles hold the file only until
    // they are gone.
    for _ in 0..5 {
        assert_eq!(in_child(|| 0), 0);
    }
    f.close().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let free = m.statfs().unwrap().chunks_free;
        if free == free0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "space of the unlinked file not freed: {free} free chunks, {free0} before"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A connection with no open file forks without asking the daemon anything, and the
    // child still works.
    let code = in_child(|| match m.open("/after", &rw()) {
        Ok(g) => {
            g.write_at(b"ok", 0).unwrap();
            0
        }
        Err(_) => 40,
    });
    assert_eq!(code, 0);
    assert_eq!(m.stat("/after").unwrap().size, 2);
}
