//! Directory listings (`OP_FS_STATDIR`, docs/abi.md §3.7) through a real daemon: a process
//! that stats path after path in a directory asks for the attributes of its entries at once,
//! answers the rest itself, and asks again as soon as anything an answer depended on changes
//! (the entry, its name, the directory, the walk to it), whichever process changed it. Other
//! users cannot list what they could not read.
//!
//! Separate connections play separate processes.

mod common;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions};
use moneta_abi::fsproto::{FsReply, FsRequest, FsStat, Target};

/// Entry point of child processes started with `spawn_role_as`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "lister" => lister_role(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The attributes a stat compares: what a listing could get wrong.
fn key(s: &FsStat) -> (u64, u64, u32, u32, u32, u32) {
    (s.ino, s.size, s.mode, s.nlink, s.uid, s.gid)
}

/// The answer of a connection that keeps nothing: the daemon's own, now.
fn fresh(d: &Daemon, path: &str, follow: bool) -> Result<FsStat, i32> {
    match d.channel().control().fs(FsRequest::Stat {
        target: Target::Path {
            path: path.as_bytes().to_vec(),
            follow,
        },
    }) {
        Ok(FsReply::Stat(s)) => Ok(s),
        Err(ClientError::Refused { errno, .. }) => Err(errno),
        other => panic!("{other:?}"),
    }
}

/// `a`'s answer for `path` is the daemon's own answer now.
fn same(d: &Daemon, a: &Moneta, path: &str) {
    let mine = a.stat(path).map(|s| key(&s)).map_err(|e| e.errno());
    assert_eq!(
        mine,
        fresh(d, path, true).map(|s| key(&s)),
        "{path} as kept"
    );
}

#[test]
fn a_directory_listed_at_once_answers_its_entries_until_what_they_depended_on_changes() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    b.mkdir("/top", 0o755).unwrap();
    b.mkdir("/top/d", 0o755).unwrap();
    b.mkdir("/top/d/sub", 0o700).unwrap();
    let n = 100;
    for i in 0..n {
        let f = b.open(format!("/top/d/f{i}"), &rw()).unwrap();
        f.write_at(&vec![i as u8; i * 7], 0).unwrap();
    }
    b.symlink(b"f1", "/top/d/link").unwrap();

    // Path after path: after the first misses a listing answers, a page at a time, and
    // every answer is the daemon's own.
    let listed = libmoneta::listings();
    let before = fs_calls_settled(&d);
    for i in 0..n {
        let st = a.stat(format!("/top/d/f{i}")).unwrap();
        assert_eq!(st.size, (i * 7) as u64);
    }
    let asked = fs_calls_settled(&d) - before;
    let pages = libmoneta::listings() - listed;
    assert!(pages >= 1, "no listing");
    // Up to three misses before each page, as the process's last pages paid (other tests
    // of this process count too): a quarter of the stats at most.
    assert!(
        asked <= 4 * pages + 2 && asked <= 25,
        "{asked} calls for {n} stats ({pages} pages)"
    );
    for i in 0..n {
        same(&d, &a, &format!("/top/d/f{i}"));
    }
    // A symbolic link: its own attributes without following, its target's with.
    let l = a.lstat("/top/d/link").unwrap();
    assert_eq!(l.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        a.stat("/top/d/link").unwrap().ino,
        a.stat("/top/d/f1").unwrap().ino
    );
    same(&d, &a, "/top/d/sub");

    // Another process changes an entry: its attributes, its data, its name.
    b.chmod("/top/d/f10", 0o600).unwrap();
    same(&d, &a, "/top/d/f10");
    let g = b.open("/top/d/f11", &rw()).unwrap();
    g.write_at(b"grown", 5000).unwrap();
    assert_eq!(a.stat("/top/d/f11").unwrap().size, 5005);
    drop(g);
    b.unlink("/top/d/f12").unwrap();
    assert_eq!(errno_of(a.stat("/top/d/f12")), libc::ENOENT);
    let ino13 = a.stat("/top/d/f13").unwrap().ino;
    b.rename("/top/d/f13", "/top/d/g13", false).unwrap();
    assert_eq!(errno_of(a.stat("/top/d/f13")), libc::ENOENT);
    assert_eq!(a.stat("/top/d/g13").unwrap().ino, ino13);
    // Another name replaces an entry: the new file's answer.
    b.rename("/top/d/f15", "/top/d/f14", false).unwrap();
    assert_eq!(a.stat("/top/d/f14").unwrap().size, 15 * 7);
    // A file made beside the others is seen (the listing's directory changed).
    b.open("/top/d/new", &rw()).unwrap().close().unwrap();
    assert_eq!(a.stat("/top/d/new").unwrap().size, 0);
    for i in 16..n {
        same(&d, &a, &format!("/top/d/f{i}"));
    }

    // The walk to the directory: a search permission on the way, and a rename of it.
    for i in 20..40 {
        a.stat(format!("/top/d/f{i}")).unwrap();
    }
    b.chmod("/top", 0o700).unwrap();
    let before = fs_calls_settled(&d);
    a.stat("/top/d/f20").unwrap();
    assert!(
        fs_calls_settled(&d) > before,
        "asked again after the walk changed"
    );
    b.rename("/top", "/moved", false).unwrap();
    assert_eq!(errno_of(a.stat("/top/d/f21")), libc::ENOENT);
    assert_eq!(a.stat("/moved/d/f21").unwrap().size, 21 * 7);
    for i in 22..n {
        same(&d, &a, &format!("/moved/d/f{i}"));
    }
}

#[test]
fn a_listing_of_something_else_than_a_directory_is_refused_and_stats_go_on() {
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    a.open("/file", &rw()).unwrap().close().unwrap();
    let ch = a.channel();
    let ask = |path: &[u8], cookie: u64| {
        ch.fs(FsRequest::StatDir {
            path: path.to_vec(),
            cookie,
            follow: false,
        })
    };
    assert_eq!(errno_of(ask(b"/file", 0)), libc::ENOTDIR);
    assert_eq!(errno_of(ask(b"/none", 0)), libc::ENOENT);
    assert_eq!(errno_of(ask(b"/file/x", 0)), libc::ENOTDIR);
    // A cookie past the end: nothing more.
    match ask(b"/", u64::MAX - 1).unwrap() {
        FsReply::Stats { entries, end, .. } => {
            assert!(entries.is_empty());
            assert!(end);
        }
        other => panic!("{other:?}"),
    }
    // The root's entries, `.` and `..` left out.
    match ask(b"/", 0).unwrap() {
        FsReply::Stats { entries, end, .. } => {
            let mut names: Vec<&[u8]> = entries.iter().map(|e| &e.name[..]).collect();
            names.sort();
            assert_eq!(names, [&b"file"[..], b"lost+found"]);
            let file = entries.iter().find(|e| e.name == b"file").unwrap();
            assert_eq!(file.stat.ino, a.stat("/file").unwrap().ino);
            assert!(end);
        }
        other => panic!("{other:?}"),
    }
    // Stats under a file, past the misses that ask for its listing (refused): each answers
    // as a stat does.
    for i in 0..5 {
        assert_eq!(errno_of(a.stat(format!("/file/x{i}"))), libc::ENOTDIR);
    }
    assert!(a.stat("/file").is_ok());
}

/// As another user: lists `args[1]` (searchable, not readable), whose entries it may still
/// stat one at a time.
fn lister_role(args: &[String]) -> i32 {
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let dir = &args[1];
    let r = m.channel().fs(FsRequest::StatDir {
        path: dir.as_bytes().to_vec(),
        cookie: 0,
        follow: true,
    });
    if errno_of(r) != libc::EACCES {
        return 1;
    }
    for i in 0..10 {
        match m.stat(format!("{dir}/f{i}")) {
            Ok(s) if s.size == i as u64 => {}
            other => {
                eprintln!("f{i}: {other:?}");
                return 2;
            }
        }
    }
    0
}

#[test]
fn another_user_cannot_list_a_directory_it_may_only_search() {
    if !can_setuid("another_user_cannot_list_a_directory_it_may_only_search") {
        return;
    }
    // A daemon that serves other users: its socket open to all, in a directory they can search.
    let d = Daemon::start_fs("64M", &["--socket-mode", "666"]);
    std::fs::set_permissions(
        &d.dir.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let a = Moneta::connect(&d.socket).unwrap();
    a.mkdir("/hidden", 0o711).unwrap();
    for i in 0..10 {
        let f = a
            .open(
                format!("/hidden/f{i}"),
                OpenOptions::new().write(true).create(true).mode(0o644),
            )
            .unwrap();
        f.write_at(&vec![1u8; i], 0).unwrap();
    }
    let mut child = spawn_role_as(
        65534,
        "lister",
        &[d.socket.display().to_string(), "/hidden".into()],
    );
    assert!(child.wait().unwrap().success());
}

#[test]
fn listings_past_the_channels_bound_of_watched_answers_are_refused_and_stats_go_on() {
    // 16,384 watched dependencies a channel at most: one for each entry listed, and a few for
    // each directory.
    let d = Daemon::start_fs("512M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    b.mkdir("/big", 0o755).unwrap();
    let n = 17_000;
    for i in 0..n {
        b.open(format!("/big/f{i}"), &rw())
            .unwrap()
            .close_soon()
            .unwrap();
    }
    let ch = a.channel();
    let (mut cookie, mut listed) = (0, 0usize);
    let refused = loop {
        match ch.fs(FsRequest::StatDir {
            path: b"/big".to_vec(),
            cookie,
            follow: false,
        }) {
            Ok(FsReply::Stats { entries, next, end }) => {
                listed += entries.len();
                assert!(!end, "the bound comes before the end");
                cookie = next;
            }
            Err(e) => break Some(e.errno()),
            Ok(other) => panic!("{other:?}"),
        }
    };
    assert_eq!(refused, Some(libc::ENOBUFS));
    assert!((15_000..16_384).contains(&listed), "{listed}");
    // The channel goes on answering, one stat at a time.
    assert_eq!(a.stat("/big/f16999").unwrap().size, 0);
    assert_eq!(errno_of(a.stat("/big/none")), libc::ENOENT);
}
