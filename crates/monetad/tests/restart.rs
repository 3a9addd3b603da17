//! A client across a restart of its daemon: new opens and path calls reconnect on their own,
//! files open across the restart fail with `EIO`, and a process whose `SIGPIPE` is not set
//! aside (as in C programs) survives kicking a channel whose daemon has gone.

mod common;

use std::time::Duration;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions};

/// Entry point of child processes started with `spawn_role`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "outlive" => outlive(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

/// A persistent daemon in its own directory.
fn persistent() -> Daemon {
    let dir = TempDir::new("restart");
    let img = dir.0.join("device.img").display().to_string();
    Daemon::start_raw(&["--device", &img, "--size", "64M"], dir)
}

#[test]
fn new_opens_reconnect_after_a_restart_and_old_files_fail_with_eio() {
    let mut d = persistent();
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/kept", &rw()).unwrap();
    f.write_at(b"before the restart", 0).unwrap();
    f.sync_all().unwrap();
    d.kill9();
    d.spawn();
    // The first call after the restart finds the old connection closed and makes a new one.
    let g = m.open("/kept", OpenOptions::new().read(true)).unwrap();
    let mut buf = [0u8; 18];
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 18);
    assert_eq!(&buf, b"before the restart");
    m.mkdir("/after", 0o755).unwrap();
    let h = m.open("/after/new", &rw()).unwrap();
    h.write_at(b"new", 0).unwrap();
    assert_eq!(m.stat("/after/new").unwrap().size, 3);
    // The file opened before is gone with its connection.
    for r in [
        f.read_at(&mut buf, 0).map(drop),
        f.write_at(b"x", 0).map(drop),
        f.stat().map(drop),
    ] {
        match r {
            Err(e) => assert_eq!(e.errno(), libc::EIO, "{e}"),
            Ok(()) => panic!("a file of the old connection still works"),
        }
    }
    // A daemon that stays away: calls fail, and work again once one is back.
    d.kill9();
    let e = m.stat("/kept").unwrap_err();
    assert!(
        matches!(e, ClientError::NotRunning { .. }) && e.errno() != 0,
        "{e:?}"
    );
    d.spawn();
    assert_eq!(m.stat("/kept").unwrap().size, 18);
    drop(g);
    drop(h);
}

/// Holds a file open, with `SIGPIPE` at its default action, until the parent kills the
/// daemon; then reads: the call must fail, not kill the process.
fn outlive(args: &[String]) -> i32 {
    // SAFETY: restoring the default disposition of a signal at the start of the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let f = m.open("/pipe", &rw()).unwrap();
    f.write_at(&[1u8; 4096], 0).unwrap();
    println!("READY");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // The daemon is gone; the channel has long been parked, so this read kicks its pipe.
    let mut buf = [0u8; 4096];
    match f.read_at(&mut buf, 0) {
        Err(e) if e.errno() == libc::EIO => 0,
        other => {
            eprintln!("read after the daemon died: {other:?}");
            1
        }
    }
}

#[test]
fn a_client_survives_kicking_a_dead_daemon() {
    use std::io::{BufRead, Write};
    let mut d = persistent();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry", "--nocapture"])
        .env("MONETA_TEST_ROLE", "outlive")
        .env("MONETA_TEST_ARGS", d.socket.display().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("READY") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child exited early"
        );
    }
    // Long enough for the device to park the quiet channel (200 µs by default).
    std::thread::sleep(Duration::from_millis(50));
    d.kill9();
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the client died instead of failing its read: {status:?}"
    );
}
