//! Who may reach whose daemon, and how much of it: the socket's mode, each user's share of
//! channels and connections, clients that refuse a daemon they do not trust, and a daemon that
//! never deletes or overwrites a file it did not make. Real daemons, real processes under other
//! uids (these tests need root, which CI has).

mod common;

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use libmoneta::trust::Trust;
use libmoneta::{Channel, ClientError, Control};
use moneta_abi::control::errno;

/// Entry point of child processes started with `spawn_role_as`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "hog" => hog(&args),
        "channels" => open_channels(&args),
        "connect" => connect_refused(&args),
        "listen" => listen_here(&args),
        "keeper" => keeper(&args),
        "flood" => flood(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

fn refused_errno<T>(r: Result<T, ClientError>) -> Option<i32> {
    match r {
        Err(ClientError::Refused { errno, .. }) => Some(errno),
        _ => None,
    }
}

/// Takes channels until refused, then connections until refused; reports both counts and
/// holds everything until its standard input closes.
fn hog(args: &[String]) -> i32 {
    let socket = Path::new(&args[0]);
    let mut channels = Vec::new();
    let refusal = loop {
        match Channel::open(socket) {
            Ok(ch) => channels.push(ch),
            Err(e) => break e,
        }
        if channels.len() > 64 {
            eprintln!("no share enforced");
            return 1;
        }
    };
    let msg = refusal.to_string();
    if refused_errno::<()>(Err(refusal)) != Some(errno::EMFILE) || !msg.contains("--user-channels")
    {
        eprintln!("channel refusal: {msg}");
        return 1;
    }
    let mut conns = Vec::new();
    // The connection the refused channel came on is closed, but the daemon counts it until
    // its connection thread has seen the end: one refusal is tried again a little later.
    let mut retried = false;
    loop {
        let c = match Control::connect(socket) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("connect: {e}");
                return 1;
            }
        };
        match c.ping() {
            Ok(()) => conns.push(c),
            Err(e) => {
                let msg = e.to_string();
                if refused_errno::<()>(Err(e)) != Some(errno::EMFILE)
                    || !msg.contains("--user-connections")
                {
                    eprintln!("connection refusal: {msg}");
                    return 1;
                }
                if retried {
                    break;
                }
                retried = true;
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        if conns.len() > 256 {
            eprintln!("no connection share enforced");
            return 1;
        }
    }
    println!(
        "HOLDING {} {}",
        channels.len(),
        channels.len() + conns.len()
    );
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    0
}

/// Opens `args[1]` channels, each must succeed.
fn open_channels(args: &[String]) -> i32 {
    let n: usize = args[1].parse().unwrap();
    let mut held = Vec::new();
    for i in 0..n {
        match Channel::open(Path::new(&args[0])) {
            Ok(ch) => held.push(ch),
            Err(e) => {
                eprintln!("channel {i}: {e}");
                return 1;
            }
        }
    }
    0
}

/// Must not be able to connect at all (the socket is the daemon's user's only).
fn connect_refused(args: &[String]) -> i32 {
    match Control::connect(Path::new(&args[0])) {
        Err(ClientError::NotRunning { source, .. })
            if source.raw_os_error() == Some(libc::EACCES) =>
        {
            0
        }
        other => {
            eprintln!("connect by another user: {:?}", other.map(|_| ()));
            1
        }
    }
}

/// Listens on a SOCK_SEQPACKET socket at `args[0]`, accepts one connection and keeps it
/// until standard input closes: a stand-in for a daemon run by someone else.
fn listen_here(args: &[String]) -> i32 {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
    let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    rustix::net::bind(&fd, &SocketAddrUnix::new(Path::new(&args[0])).unwrap()).unwrap();
    rustix::net::listen(&fd, 8).unwrap();
    println!("LISTENING");
    let _conn = rustix::net::accept(&fd);
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    0
}

/// A child process killed and reaped however the test ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads a file of its own (installing its records), says so, waits for its standard input
/// to close, reads it again and prints its hard misses (records it lost meanwhile).
fn keeper(args: &[String]) -> i32 {
    let m = libmoneta::Moneta::connect(Path::new(&args[0])).unwrap();
    let mut o = libmoneta::OpenOptions::new();
    o.read(true).write(true).create(true);
    let f = m
        .open(format!("/keeper-{}", std::process::id()), &o)
        .unwrap();
    f.write_at(&[5u8; 4 << 20], 0).unwrap();
    let mut buf = vec![0u8; 4 << 20];
    f.read_at(&mut buf, 0).unwrap();
    let before = m.stats().hard_misses;
    println!("READY");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    f.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    println!("MISSES {}", m.stats().hard_misses - before);
    0
}

/// Writes two files a chunk at a time in turn (so each is made of many extents), then reads
/// them: far more records than its share.
fn flood(args: &[String]) -> i32 {
    let m = libmoneta::Moneta::connect(Path::new(&args[0])).unwrap();
    let mut o = libmoneta::OpenOptions::new();
    o.read(true).write(true).create(true);
    let a = m.open("/flood-a", &o).unwrap();
    let b = m.open("/flood-b", &o).unwrap();
    for i in 0..96u64 {
        a.write_at(&[1u8; 4096], i * 4096).unwrap();
        b.write_at(&[2u8; 4096], i * 4096).unwrap();
    }
    // Requests of 16 extents each, well within its share; the files need 192 records.
    let mut buf = vec![0u8; 16 * 4096];
    for _ in 0..3 {
        for at in (0..96u64).step_by(16) {
            a.read_at(&mut buf, at * 4096).unwrap();
            assert!(buf.iter().all(|&x| x == 1));
            b.read_at(&mut buf, at * 4096).unwrap();
            assert!(buf.iter().all(|&x| x == 2));
        }
    }
    0
}

fn wait_line(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut r = std::io::BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the child exited early"
        );
        if line.starts_with(prefix) {
            return line;
        }
    }
}

fn spawn_piped_as(uid: u32, role: &str, args: &[String]) -> Child {
    use std::os::unix::process::CommandExt;
    Command::new(reachable_copy(&std::env::current_exe().unwrap()))
        .args(["--exact", "child_process_entry", "--nocapture"])
        .env("MONETA_TEST_ROLE", role)
        .env("MONETA_TEST_ARGS", args.join("\u{1f}"))
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A daemon shared with other users: socket mode 666 in a directory they can search.
fn shared_daemon(args: &[&str]) -> Daemon {
    let mut all = vec!["--socket-mode", "666"];
    all.extend_from_slice(args);
    let d = Daemon::start_fs("64M", &all);
    std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn each_user_gets_a_share_of_channels_and_connections() {
    if !can_setuid("each_user_gets_a_share_of_channels_and_connections") {
        return;
    }
    let d = shared_daemon(&["--max-channels", "10", "--user-channels", "4"]);
    let socket = d.socket.display().to_string();
    let mut hog1 = spawn_piped_as(1001, "hog", std::slice::from_ref(&socket));
    let line = wait_line(&mut hog1, "HOLDING");
    assert_eq!(
        line.trim(),
        "HOLDING 4 20",
        "4 channels, 4 + 16 connections"
    );
    // Another user still gets their share while the first holds all of theirs.
    let mut other = spawn_role_as(1002, "channels", &[socket.clone(), "4".into()]);
    assert!(other.wait().unwrap().success(), "the second user's share");
    wait_channels(&d, 4);
    // The daemon's own user (root here) is not held to a share.
    let mine: Vec<Channel> = (0..6).map(|_| d.channel()).collect();
    assert_eq!(mine.len(), 6);
    let s = d.control().status().unwrap();
    assert_eq!(s.channels_open, 4 + 6);
    // What the first user held comes back when its process goes.
    drop(hog1.stdin.take());
    assert!(hog1.wait().unwrap().success());
    drop(mine);
    wait_channels(&d, 0);
    let mut again = spawn_role_as(1001, "channels", &[socket, "4".into()]);
    assert!(again.wait().unwrap().success(), "the share is free again");
}

/// Waits until the daemon has reclaimed all but `n` channels (reclaim follows a client's exit).
fn wait_channels(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.control().status().unwrap().channels_open > n {
        assert!(Instant::now() < deadline, "channels not reclaimed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One user's records cannot push another's out of the permission table: past its share a
/// user's own records make room for its new ones.
#[test]
fn each_user_gets_a_share_of_the_permission_table() {
    if !can_setuid("each_user_gets_a_share_of_the_permission_table") {
        return;
    }
    let d = shared_daemon(&[
        "--chunk-size",
        "4K",
        "--no-merge",
        "--table-entries",
        "128",
        "--user-records",
        "32",
        "--append-reserve",
        "0",
    ]);
    d.control()
        .fs(moneta_abi::fsproto::FsRequest::Chmod {
            target: moneta_abi::fsproto::Target::Path {
                path: b"/".to_vec(),
                follow: true,
            },
            mode: 0o1777,
        })
        .unwrap();
    let socket = d.socket.display().to_string();
    let mut keeper = KillOnDrop(spawn_piped_as(
        1002,
        "keeper",
        std::slice::from_ref(&socket),
    ));
    wait_line(&mut keeper.0, "READY");
    let mut flood = spawn_role_as(1001, "flood", std::slice::from_ref(&socket));
    assert!(flood.wait().unwrap().success());
    let s = d.control().status().unwrap();
    assert!(s.table_evictions > 0, "the flood overflowed its share");
    drop(keeper.0.stdin.take());
    let line = wait_line(&mut keeper.0, "MISSES");
    assert_eq!(
        line.trim(),
        "MISSES 0",
        "the keeper lost records to the flood"
    );
}

#[test]
fn by_default_only_the_daemons_user_may_connect() {
    if !can_setuid("by_default_only_the_daemons_user_may_connect") {
        return;
    }
    let d = Daemon::start_fs("64M", &[]);
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Even with the directory opened up, the socket itself keeps others out.
    std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = spawn_role_as(1001, "connect", &[d.socket.display().to_string()]);
    assert!(child.wait().unwrap().success());
    d.control().ping().unwrap();
}

/// A directory owned by `uid`, mode 0755, inside a private test directory.
fn dir_of(parent: &TempDir, name: &str, uid: u32, mode: u32) -> PathBuf {
    let p = parent.0.join(name);
    std::fs::create_dir(&p).unwrap();
    std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[test]
fn a_client_refuses_a_daemon_it_does_not_trust() {
    if !can_setuid("a_client_refuses_a_daemon_it_does_not_trust") {
        return;
    }
    let top = TempDir::new("trust");
    std::fs::set_permissions(&top.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A real daemon run by uid 1001 in its own directory (as /tmp/moneta-<uid> would be if
    // that user had made it first).
    let theirs = dir_of(&top, "theirs", 1001, 0o700);
    let socket = theirs.join("monetad.sock");
    let mut daemon = KillOnDrop({
        use std::os::unix::process::CommandExt;
        Command::new(reachable_copy(Path::new(env!("CARGO_BIN_EXE_monetad"))))
            .args(["--volatile", "--size", "64M", "--socket"])
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .uid(1001)
            .gid(1001)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    });
    let named = Trust::own().with_named("1001").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Control::connect_trusting(&socket, &named).is_err() {
        assert!(daemon.0.try_wait().unwrap().is_none(), "monetad exited");
        assert!(Instant::now() < deadline, "monetad did not come up");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Named, it is used; not named, it is refused with a message that says what to do.
    Control::connect_trusting(&socket, &named)
        .unwrap()
        .ping()
        .unwrap();
    match Control::connect_trusting(&socket, &Trust::own()) {
        Err(ClientError::Untrusted(why)) => {
            assert!(why.contains("uid 1001"), "{why}");
            assert!(why.contains("MONETA_DAEMON_UID=1001"), "{why}");
        }
        other => panic!("an untrusted daemon was used: {:?}", other.map(|_| ())),
    }
    drop(daemon);

    // A socket that looks like ours (root's file, in root's directory) but whose listener runs
    // as another user: the daemon's credentials give it away.
    let ours = dir_of(&top, "ours", 0, 0o755);
    let fake = ours.join("monetad.sock");
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut listener = KillOnDrop(spawn_piped_as(
        1001,
        "listen",
        &[fake.display().to_string()],
    ));
    wait_line(&mut listener.0, "LISTENING");
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&fake, Some(0), Some(0)).unwrap();
    match Control::connect_trusting(&fake, &Trust::own()) {
        Err(ClientError::Untrusted(why)) => {
            assert!(why.contains("refusing the daemon"), "{why}");
            assert!(why.contains("runs as uid 1001"), "{why}");
        }
        other => panic!("a foreign listener was used: {:?}", other.map(|_| ())),
    }
    drop(listener);

    // A directory others may write is refused before anything is sent.
    let open = dir_of(&top, "open", 0, 0o777);
    match Control::connect_trusting(&open.join("monetad.sock"), &Trust::own()) {
        Err(ClientError::Untrusted(why)) => assert!(why.contains("writable by others"), "{why}"),
        other => panic!("a world-writable directory passed: {:?}", other.map(|_| ())),
    }
}

#[test]
fn the_daemon_never_deletes_or_overwrites_what_it_did_not_make() {
    let dir = TempDir::new("files");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = |socket: &Path| {
        Command::new(env!("CARGO_BIN_EXE_monetad"))
            .args(["--volatile", "--size", "16M", "--socket"])
            .arg(socket)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    // A regular file at the socket's path.
    let precious = dir.0.join("notes.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let out = run(&precious);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    // A file that is not a pid file beside the socket.
    let socket = dir.0.join("data.sock");
    let beside = dir.0.join("data.pid");
    std::fs::write(&beside, b"my data, not a pid").unwrap();
    let out = run(&socket);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a pid file"), "{err}");
    assert_eq!(std::fs::read(&beside).unwrap(), b"my data, not a pid");
    assert!(!socket.exists(), "a refused start leaves no socket behind");
    // A stale pid file of an earlier daemon is replaced, and a stopped daemon removes its
    // socket and pid file.
    std::fs::write(&beside, b"12345\n").unwrap();
    let mut d = Daemon {
        child: None,
        socket: socket.clone(),
        dir: TempDir(dir.0.join("unused")),
        args: vec!["--volatile".into(), "--size".into(), "16M".into()],
    };
    d.spawn();
    // The daemon binds its socket first (a live daemon's pid file must never be overwritten)
    // and writes its pid file just after: look until it has.
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&beside).unwrap_or_default().trim() != d.pid().to_string()
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        std::fs::read_to_string(&beside).unwrap().trim(),
        d.pid().to_string()
    );
    let pid = rustix::process::Pid::from_raw(d.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = d.wait_exit(Duration::from_secs(20)).expect("monetad stops");
    assert!(status.success());
    assert!(!socket.exists() && !beside.exists());
}
