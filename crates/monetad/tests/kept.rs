//! Answers about attributes kept by the client (docs/abi.md §3.7): a `stat` (of a path or a
//! handle, an error too) and the attributes an `open` answered with are given again without a
//! call while the channel's change-board counter keeps its value, and never after another
//! process changed what they depended on. `fsync` at the `device` level is answered by the
//! client.

mod common;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions};

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    r.expect_err("the call should fail").errno()
}

#[test]
fn kept_answers_hold_until_another_process_changes_what_they_depended_on() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    a.mkdir("/dir", 0o755).unwrap();
    // Opened for writing only: its growth leaves no room (docs/abi.md §3.9), which would keep
    // answers about it from being kept while it is open.
    let f = a
        .open("/dir/f", OpenOptions::new().write(true).create(true))
        .unwrap();
    f.write_at(b"12345", 0).unwrap();
    // Asked once, then kept: the second stat makes no call.
    assert_eq!(a.stat("/dir/f").unwrap().size, 5);
    assert_eq!(f.stat().unwrap().size, 5);
    let before = fs_calls(&d);
    let kept = libmoneta::stats_kept();
    assert_eq!(a.stat("/dir/f").unwrap().size, 5);
    assert_eq!(f.stat().unwrap().size, 5);
    assert_eq!(fs_calls(&d), before, "kept answers make no call");
    assert!(libmoneta::stats_kept() >= kept + 2);
    // A file made beside it changes nothing the answer depended on: still kept.
    b.open("/dir/g", &rw()).unwrap().close().unwrap();
    let before = fs_calls(&d);
    assert_eq!(a.stat("/dir/f").unwrap().size, 5);
    assert_eq!(fs_calls(&d), before);
    // Another process grows it: both answers are asked again, and are new.
    let g = b.open("/dir/f", &rw()).unwrap();
    g.write_at(b"more bytes", 5).unwrap();
    assert_eq!(a.stat("/dir/f").unwrap().size, 15);
    assert_eq!(f.stat().unwrap().size, 15);
    // Its mode, from another process.
    b.chmod("/dir/f", 0o600).unwrap();
    assert_eq!(a.stat("/dir/f").unwrap().mode & 0o777, 0o600);
    assert_eq!(f.stat().unwrap().mode & 0o777, 0o600);
    // A name that is missing is kept missing until another process makes it.
    assert_eq!(errno_of(a.stat("/dir/new")), libc::ENOENT);
    assert_eq!(errno_of(a.stat("/dir/new")), libc::ENOENT);
    b.open("/dir/new", &rw()).unwrap().close().unwrap();
    assert_eq!(a.stat("/dir/new").unwrap().size, 0);
    // Renames: the old name goes, the new one comes, through a renamed directory too.
    b.rename("/dir/new", "/dir/newer", false).unwrap();
    assert_eq!(errno_of(a.stat("/dir/new")), libc::ENOENT);
    assert_eq!(a.stat("/dir/newer").unwrap().size, 0);
    b.rename("/dir", "/moved", false).unwrap();
    assert_eq!(errno_of(a.stat("/dir/f")), libc::ENOENT);
    assert_eq!(a.stat("/moved/f").unwrap().size, 15);
    // Who may search a directory on the way.
    b.mkdir("/moved/private", 0o755).unwrap();
    b.open("/moved/private/x", &rw()).unwrap().close().unwrap();
    a.stat("/moved/private/x").unwrap();
    b.chmod("/moved/private", 0o700).unwrap();
    // Root passes the mode; the answer is asked again all the same (the counter moved).
    let before = fs_calls(&d);
    a.stat("/moved/private/x").unwrap();
    assert_eq!(fs_calls(&d), before + 1);
    // Unlinked by another: gone.
    b.unlink("/moved/newer").unwrap();
    assert_eq!(errno_of(a.stat("/moved/newer")), libc::ENOENT);
}

#[test]
fn a_handle_answers_from_its_open_and_not_once_closed() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let f = a.open("/f", &rw()).unwrap();
    // The attributes the open answered with are the first stat's answer.
    let before = fs_calls(&d);
    assert_eq!(f.stat().unwrap().size, 0);
    assert_eq!(fs_calls(&d), before);
    // Its own growth is seen at once (the extend moved the counter).
    f.write_at(&[7u8; 10_000], 0).unwrap();
    assert_eq!(f.stat().unwrap().size, 10_000);
    f.set_len(3).unwrap();
    assert_eq!(f.stat().unwrap().size, 3);
    // fsync at the device level (a volatile array) is answered here.
    let before = fs_calls(&d);
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    assert_eq!(fs_calls(&d), before);
    let handle = f.handle();
    drop(f);
    // A closed handle's answer is not kept: the daemon says it is gone.
    let ch = a.channel();
    let r = ch.fs(moneta_abi::fsproto::FsRequest::Stat {
        target: moneta_abi::fsproto::Target::Handle(handle),
    });
    assert_eq!(errno_of(r), libc::EBADF);
}

#[test]
fn an_fsync_after_growth_in_a_size_lease_is_a_call_only_where_the_array_outlives_the_daemon() {
    // At the device level the daemon on a file applies the size an fsync covers, so that a
    // kill right after keeps it; on a volatile array nothing outlives the daemon, and the
    // fsync is answered here.
    let dir = TempDir::new("devicelevel");
    let img = dir.0.join("device.img").display().to_string();
    let persistent = Daemon::start_raw(
        &[
            "--device",
            img.as_str(),
            "--size",
            "64M",
            "--durability",
            "device",
        ],
        dir,
    );
    let volatile = Daemon::start_fs("64M", &[]);
    for (d, asks) in [(&persistent, true), (&volatile, false)] {
        let a = Moneta::connect(&d.socket).unwrap();
        let b = Moneta::connect(&d.socket).unwrap();
        // Read-write: the first growth leaves room, and the second is published in it.
        let f = a.open("/journal", &rw()).unwrap();
        f.write_at(&[1u8; 512], 0).unwrap();
        let extends = a.stats().extends;
        let before = fs_calls_settled(d);
        f.write_at(&[2u8; 100], 512).unwrap();
        assert_eq!(a.stats().extends, extends, "inside the room");
        assert_eq!(b.stat("/journal").unwrap().size, 612);
        let before_sync = fs_calls_settled(d);
        f.sync_all().unwrap();
        assert_eq!(fs_calls_settled(d) > before_sync, asks);
        // A second fsync has nothing new to apply either way.
        let after = fs_calls_settled(d);
        f.sync_data().unwrap();
        assert_eq!(fs_calls_settled(d), after);
        assert!(
            before_sync > before,
            "the other connection's stat was a call"
        );
        assert_eq!(b.stat("/journal").unwrap().size, 612);
    }
}

#[test]
fn fsync_at_the_host_level_is_still_a_call() {
    let dir = TempDir::new("hostlevel");
    let img = dir.0.join("device.img").display().to_string();
    let d = Daemon::start_raw(
        &[
            "--device",
            img.as_str(),
            "--size",
            "64M",
            "--durability",
            "host",
        ],
        dir,
    );
    let a = Moneta::connect(&d.socket).unwrap();
    let f = a.open("/f", &rw()).unwrap();
    f.write_at(b"x", 0).unwrap();
    let before = d.control().status().unwrap();
    f.sync_all().unwrap();
    let after = d.control().status().unwrap();
    // At the host level fsync flushes: a call, through the channel or the socket.
    assert!(
        after.fs_calls + after.fs_calls_referred > before.fs_calls + before.fs_calls_referred
            || after.flushes > before.flushes,
        "{before:?} {after:?}"
    );
}

#[test]
fn a_channel_past_its_bound_asks_again_and_what_it_kept_still_hears_of_changes() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let f = a.open("/early", &rw()).unwrap();
    f.write_at(b"1", 0).unwrap();
    assert_eq!(a.stat("/early").unwrap().size, 1);
    // Answers about missing names fill the channel's watches: each depends on its name in the
    // root, besides the root's search (one per slot).
    for k in 0..17_000 {
        assert_eq!(errno_of(a.stat(format!("/missing-{k}"))), libc::ENOENT);
    }
    // Past the bound an answer is not kept: the same name asked twice is asked twice.
    let before = fs_calls(&d);
    assert_eq!(errno_of(a.stat("/missing-late")), libc::ENOENT);
    assert_eq!(errno_of(a.stat("/missing-late")), libc::ENOENT);
    assert_eq!(fs_calls(&d), before + 2);
    // Nothing kept is trusted past a change: another process grows the early file, made
    // a name that was missing, and both answers are new.
    let g = b.open("/early", &rw()).unwrap();
    g.write_at(b"23", 1).unwrap();
    b.open("/missing-5", &rw()).unwrap().close().unwrap();
    assert_eq!(a.stat("/early").unwrap().size, 3);
    assert_eq!(a.stat("/missing-5").unwrap().size, 0);
    assert_eq!(errno_of(a.stat("/missing-6")), libc::ENOENT);
}

#[test]
fn a_name_this_process_unlinked_is_kept_missing_until_another_process_makes_it() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    a.mkdir("/dir", 0o755).unwrap();
    // Looked for first, as SQLite looks for its journal: a path this process asked about.
    assert_eq!(errno_of(a.stat("/dir/j")), libc::ENOENT);
    assert_eq!(errno_of(a.lstat("/dir/l")), libc::ENOENT);
    for round in 0..2 {
        a.open("/dir/j", &rw()).unwrap().close().unwrap();
        a.symlink(b"j", "/dir/l").unwrap();
        a.unlink("/dir/j").unwrap();
        a.unlink("/dir/l").unwrap();
        // The unlinks answered the stats of their paths, either follow flag: no call.
        let before = fs_calls_settled(&d);
        for p in ["/dir/j", "/dir/l"] {
            assert_eq!(errno_of(a.stat(p)), libc::ENOENT);
            assert_eq!(errno_of(a.lstat(p)), libc::ENOENT);
        }
        assert_eq!(fs_calls_settled(&d), before, "round {round}: kept missing");
        // Another process makes both names again: asked again, and found.
        b.open("/dir/j", &rw()).unwrap().close().unwrap();
        b.symlink(b"j", "/dir/l").unwrap();
        assert!(a.stat("/dir/j").is_ok());
        assert!(a.lstat("/dir/l").is_ok());
        assert!(a.stat("/dir/l").is_ok());
        b.unlink("/dir/j").unwrap();
        b.unlink("/dir/l").unwrap();
        // And gone again, for this process too, though it kept the names made.
        assert_eq!(errno_of(a.stat("/dir/j")), libc::ENOENT);
        assert_eq!(errno_of(a.lstat("/dir/l")), libc::ENOENT);
    }
    // A path it never asked about is unlinked without a watch: a stat of it asks.
    a.open("/dir/n", &rw()).unwrap().close().unwrap();
    a.unlink("/dir/n").unwrap();
    let before = fs_calls_settled(&d);
    assert_eq!(errno_of(a.stat("/dir/n")), libc::ENOENT);
    assert!(
        fs_calls_settled(&d) > before,
        "not kept: nobody asked about it before"
    );
    // A directory made in an unlinked name's place, by another process, is seen too.
    assert_eq!(errno_of(a.stat("/dir/k")), libc::ENOENT);
    a.open("/dir/k", &rw()).unwrap().close().unwrap();
    a.unlink("/dir/k").unwrap();
    b.mkdir("/dir/k", 0o700).unwrap();
    assert_eq!(a.stat("/dir/k").unwrap().mode & libc::S_IFMT, libc::S_IFDIR);
    // A change of the directory's search rights is heard too: the stat is asked again (root
    // searches any directory, so the answer is still that the name is missing).
    assert_eq!(errno_of(a.stat("/dir/m")), libc::ENOENT);
    a.open("/dir/m", &rw()).unwrap().close().unwrap();
    a.unlink("/dir/m").unwrap();
    b.chmod("/dir", 0o600).unwrap();
    let before = fs_calls_settled(&d);
    assert_eq!(errno_of(a.stat("/dir/m")), libc::ENOENT);
    assert!(fs_calls_settled(&d) > before, "asked again after the chmod");
}
