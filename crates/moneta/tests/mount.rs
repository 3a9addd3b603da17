//! nvfs through `moneta mount`: real daemons, real mounts, real programs (coreutils, a
//! statically linked busybox the shim cannot reach), coherence with libmoneta's clients both
//! ways, the errnos of each call, record locks against libmoneta's, two users (setuid children
//! through `setpriv`; these tests run as root, as CI does), a killed server and unmounting.
//!
//! FUSE must be there: without /dev/fuse (or, for a user, fusermount3) the tests fail and say
//! so; `scripts/test.sh` installs fuse3.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use libmoneta::{LockCmd, LockKind, LockType, Moneta, OpenOptions};

fn moneta() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moneta"))
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// FUSE is there, or the test fails saying what is missing.
fn need_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "FUSE is unavailable: /dev/fuse is missing (modprobe fuse; in a container, pass the \
         device); these tests need it and are not skipped"
    );
    if !rustix::process::geteuid().is_root() {
        let ok = Command::new("sh")
            .args(["-c", "command -v fusermount3"])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "fusermount3 is missing: install fuse3 (scripts/test.sh does)"
        );
    }
}

fn need_root(test: &str) {
    assert!(
        rustix::process::geteuid().is_root(),
        "{test} runs programs as other users and needs root (CI runs the tests as root)"
    );
}

/// A directory others may search, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!(
            "moneta-mount-{tag}-{}-{:x}",
            std::process::id(),
            Instant::now().elapsed().subsec_nanos() ^ rand_u32()
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(d)
    }
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u32::from_le_bytes(b)
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon of the test's own on a volatile array; with `shared`, other users may connect.
struct Daemon {
    dir: TempDir,
    socket: PathBuf,
}

impl Daemon {
    fn start(shared: bool) -> Daemon {
        let dir = TempDir::new("d");
        let socket = dir.0.join("monetad.sock");
        let mut c = moneta();
        c.args(["start", "--volatile", "--size", "128M", "--socket"])
            .arg(&socket);
        if shared {
            c.args(["--", "--socket-mode", "666"]);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
        Daemon { dir, socket }
    }

    fn client(&self) -> Moneta {
        Moneta::connect(&self.socket).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = moneta()
            .arg("stop")
            .arg("--socket")
            .arg(&self.socket)
            .output();
        let _ = &self.dir;
    }
}

/// A `moneta mount` of a daemon, unmounted at the end.
struct Mount {
    path: PathBuf,
    pid: u32,
    _dir: TempDir,
}

impl Mount {
    fn new(d: &Daemon) -> Mount {
        need_fuse();
        let dir = TempDir::new("m");
        let path = dir.0.join("mnt");
        std::fs::create_dir(&path).unwrap();
        let o = moneta()
            .arg("mount")
            .arg("--socket")
            .arg(&d.socket)
            .arg(&path)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta mount: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let pid = out
            .split("server pid ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no server pid in {out:?}"));
        Mount {
            path,
            pid,
            _dir: dir,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                .unwrap_or_default()
                .contains(") Z ")
    }

    /// `sh -c script` in the mount, as `user` (uid and gid, and `groups` besides) or as
    /// root.
    fn sh_as(&self, user: Option<(u32, &[u32])>, script: &str) -> Output {
        let mut c = match user {
            Some((uid, groups)) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"));
                if groups.is_empty() {
                    c.arg("--clear-groups");
                } else {
                    let g: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
                    c.arg(format!("--groups={}", g.join(",")));
                }
                c.args(["sh", "-c", script]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.args(["-c", script]);
                c
            }
        };
        c.current_dir(&self.path)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn sh(&self, script: &str) -> String {
        let o = self.sh_as(None, script);
        assert!(o.status.success(), "{script}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = moneta()
            .arg("umount")
            .arg("--lazy")
            .arg(&self.path)
            .output();
        let t = Instant::now();
        while self.alive() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.alive() {
            // SAFETY: a signal to a process this test started.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
    }
}

fn errno_of<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Coreutils on the mount: every change they make is what libmoneta's clients see.
#[test]
fn coreutils_through_the_mount() {
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    let c = d.client();
    let src = d.dir.0.join("src");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    m.sh(&format!(
        "cp {} big && mkdir -p a/b && cp big a/b/copy",
        src.display()
    ));
    let f = c.open("/a/b/copy", OpenOptions::new().read(true)).unwrap();
    let mut back = vec![0u8; data.len() + 10];
    let mut got = 0;
    while got < back.len() {
        let n = f.read_at(&mut back[got..], got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(
        &back[..got],
        &data[..],
        "cp through the mount, read through libmoneta"
    );
    drop(f);
    let ls = m.sh("ls -l a/b");
    assert!(ls.contains("3000000") && ls.contains("copy"), "{ls}");
    m.sh("mv a/b/copy a/moved && rm big && ln -s moved a/link && ln a/moved a/hard");
    assert_eq!(c.readlink("/a/link").unwrap(), b"moved");
    assert_eq!(c.stat("/a/hard").unwrap().nlink, 2);
    assert!(c.stat("/big").is_err() && c.stat("/a/b/copy").is_err());
    let st = m.sh("stat -c '%s %h %a %F' a/moved a/link");
    assert_eq!(
        st, "3000000 2 644 regular file\n5 1 777 symbolic link\n",
        "{st}"
    );
    m.sh(
        "chmod 640 a/moved && truncate -s 10 a/hard && touch -d '2001-02-03 04:05:06 UTC' a/moved",
    );
    let s = c.stat("/a/moved").unwrap();
    assert_eq!(
        (s.mode & 0o7777, s.mtime.sec, s.size),
        (0o640, 981173106, 10)
    );
    assert_eq!(m.sh("cat a/link"), String::from_utf8_lossy(&data[..10]));
    let df = m.sh("df -k . | tail -1");
    let fs = c.statfs().unwrap();
    let total_k = fs.chunks * fs.chunk_size / 1024;
    assert!(df.contains(&total_k.to_string()), "df {df} against {fs:?}");
    m.sh("rm -r a && ls -a");
    assert_eq!(
        c.read_dir("/")
            .unwrap()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect::<Vec<_>>(),
        ["lost+found"]
    );
    // A directory of many entries is read whole (readdir in several requests).
    m.sh("mkdir many && cd many && for i in $(seq 1 600); do : > file-$i; done");
    assert_eq!(m.sh("ls many | wc -l").trim(), "600");
    assert_eq!(c.read_dir("/many").unwrap().len(), 602);
}

/// A statically linked program reaches Moneta's files through the mount; under `moneta run`
/// the shim cannot reach it and says so.
#[test]
fn statically_linked_program() {
    let busybox = Command::new("sh")
        .args(["-c", "command -v busybox"])
        .output()
        .unwrap();
    let busybox = String::from_utf8_lossy(&busybox.stdout).trim().to_string();
    assert!(
        !busybox.is_empty(),
        "busybox (busybox-static) is missing; scripts/test.sh installs it"
    );
    let ldd = Command::new("ldd").arg(&busybox).output().unwrap();
    assert!(
        !ldd.status.success(),
        "{busybox} must be statically linked (busybox-static): {}",
        text(&ldd)
    );
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    let c = d.client();
    let f = c.create("/from-libmoneta").unwrap();
    f.write_at(b"written through a channel\n", 0).unwrap();
    drop(f);
    let out = m.sh("busybox cat from-libmoneta && busybox sh -c 'echo static > by-busybox'");
    assert_eq!(out, "written through a channel\n");
    let f = c
        .open("/by-busybox", OpenOptions::new().read(true))
        .unwrap();
    let mut b = [0u8; 32];
    let n = f.read_at(&mut b, 0).unwrap();
    assert_eq!(&b[..n], b"static\n");
    let o = moneta()
        .args(["run", "--no-start", "--socket"])
        .arg(&d.socket)
        .args(["--", "busybox", "cat", "/moneta/from-libmoneta"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("statically linked"),
        "the shim cannot serve a static program: {}",
        text(&o)
    );
}

/// A write through a channel is read through the mount at once, and the other way round:
/// data, sizes, truncation, names.
#[test]
fn coherent_with_channel_clients() {
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    let c = d.client();
    let f = c
        .open(
            "/shared",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    let k = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("shared"))
        .unwrap();
    let mut buf = [0u8; 8];
    for i in 0..300u64 {
        let v = i.to_le_bytes();
        if i % 2 == 0 {
            f.write_at(&v, i * 8).unwrap();
            let n = rustix::io::pread(&k, &mut buf, i * 8).unwrap();
            assert_eq!((n, buf), (8, v), "channel write {i} read through the mount");
        } else {
            rustix::io::pwrite(&k, &v, i * 8).unwrap();
            let n = f.read_at(&mut buf, i * 8).unwrap();
            assert_eq!((n, buf), (8, v), "mount write {i} read through the channel");
        }
    }
    assert_eq!(k.metadata().unwrap().len(), 300 * 8);
    // Growth through the channel: the mount sees the size and the bytes.
    f.write_at(b"tail", 1 << 20).unwrap();
    assert_eq!(k.metadata().unwrap().len(), (1 << 20) + 4);
    let mut t = [0u8; 4];
    assert_eq!(rustix::io::pread(&k, &mut t, 1 << 20).unwrap(), 4);
    assert_eq!(&t, b"tail");
    // Truncation through the mount: the channel client reads the new end.
    k.set_len(16).unwrap();
    let mut big = [0u8; 64];
    assert_eq!(f.read_at(&mut big, 0).unwrap(), 16);
    // Names made through the channel appear in the mount at once, and the other way round.
    c.mkdir("/dir-by-channel", 0o755).unwrap();
    assert!(m.p("dir-by-channel").is_dir());
    std::fs::create_dir(m.p("dir-by-mount")).unwrap();
    assert!(c.stat("/dir-by-mount").is_ok());
    c.rename("/shared", "/dir-by-channel/renamed", false)
        .unwrap();
    assert!(!m.p("shared").exists());
    assert_eq!(
        std::fs::metadata(m.p("dir-by-channel/renamed"))
            .unwrap()
            .len(),
        16
    );
    // The open descriptor follows the file, as on any file system.
    rustix::io::pwrite(&k, b"still", 0).unwrap();
    assert_eq!(f.read_at(&mut t, 0).unwrap(), 4);
    assert_eq!(&t, b"stil");
    // O_APPEND through the mount lands at the end the manager knows, after channel writes.
    f.write_at(b"0123456789", 16).unwrap();
    let mut a = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("dir-by-channel/renamed"))
        .unwrap();
    a.write_all(b"APP").unwrap();
    assert_eq!(f.read_at(&mut big, 0).unwrap(), 29);
    assert_eq!(&big[26..29], b"APP");
    // Writes set mtime (when the descriptor closes or the file is looked at).
    let before = c.stat("/dir-by-channel/renamed").unwrap().mtime;
    std::thread::sleep(Duration::from_millis(20));
    rustix::io::pwrite(&k, b"x", 1).unwrap();
    drop(k);
    let after = c.stat("/dir-by-channel/renamed").unwrap().mtime;
    assert!(
        (after.sec, after.nsec) > (before.sec, before.nsec),
        "{before:?} -> {after:?}"
    );
}

/// Each call's errno is the one Linux gives.
#[test]
fn errnos() {
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::write(m.p("d/f"), b"x").unwrap();
    std::fs::write(m.p("g"), b"y").unwrap();
    assert_eq!(errno_of(std::fs::create_dir(m.p("d"))), libc::EEXIST);
    assert_eq!(errno_of(std::fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(std::fs::remove_dir(m.p("g"))), libc::ENOTDIR);
    assert_eq!(errno_of(std::fs::remove_file(m.p("d"))), libc::EISDIR);
    assert_eq!(errno_of(std::fs::read(m.p("nope"))), libc::ENOENT);
    assert_eq!(errno_of(std::fs::read(m.p("g/x"))), libc::ENOTDIR);
    assert_eq!(
        errno_of(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.p("g"))
        ),
        libc::EEXIST
    );
    let long = "n".repeat(256);
    assert_eq!(
        errno_of(std::fs::write(m.p(&long), b"")),
        libc::ENAMETOOLONG
    );
    // renameat2(RENAME_NOREPLACE) refuses an existing target and moves to a free one.
    let rename2 = |a: &Path, b: &Path, flags: u32| {
        // SAFETY: NUL-terminated paths, descriptors AT_FDCWD.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cstr(a).as_ptr(),
                libc::AT_FDCWD,
                cstr(b).as_ptr(),
                flags,
            )
        };
        if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    assert_eq!(
        rename2(&m.p("g"), &m.p("d/f"), libc::RENAME_NOREPLACE),
        libc::EEXIST
    );
    assert_eq!(rename2(&m.p("g"), &m.p("d/h"), libc::RENAME_NOREPLACE), 0);
    assert_eq!(
        rename2(&m.p("d/h"), &m.p("d/f"), libc::RENAME_EXCHANGE),
        libc::EINVAL
    );
    assert_eq!(
        errno_of(std::fs::rename(m.p("d"), m.p("d/sub"))),
        libc::EINVAL
    );
    // Devices and fifos: nvfs keeps none.
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::mkfifo(cstr(&m.p("fifo")).as_ptr(), 0o644) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    // fallocate reserves space; punching holes is not supported.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("d/f"))
        .unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 3 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 3 << 20);
    assert_eq!(
        rustix::fs::fallocate(
            &f,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            0,
            4096
        )
        .map_err(|e| e.raw_os_error()),
        Err(libc::EOPNOTSUPP)
    );
    f.sync_all().unwrap();
    // xattrs: nvfs has none.
    let r = rustix::fs::getxattr(m.p("d/f"), "user.x", &mut [0u8; 8]);
    assert!(
        matches!(r, Err(e) if e.raw_os_error() == libc::EOPNOTSUPP),
        "{r:?}"
    );
    // A file unlinked while open stays readable and writable through its descriptor.
    std::fs::remove_file(m.p("d/f")).unwrap();
    rustix::io::pwrite(&f, b"after", 0).unwrap();
    let mut b = [0u8; 5];
    rustix::io::pread(&f, &mut b, 0).unwrap();
    assert_eq!(&b, b"after");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
}

/// Record locks through the mount conflict with libmoneta's, both ways; F_SETLKW waits and
/// takes a signal; closing a descriptor drops the process's locks.
#[test]
fn locks_against_channel_clients() {
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    let c = d.client();
    std::fs::write(m.p("db"), vec![0u8; 4096]).unwrap();
    let k = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("db"))
        .unwrap();
    let setlk = |cmd: i32, ty: i32, start: i64, len: i64| -> (i32, libc::flock) {
        // SAFETY: flock is plain data; all zeros is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = ty as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = start;
        fl.l_len = len;
        // SAFETY: a valid descriptor and a flock structure.
        let r = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&k), cmd, &mut fl) };
        let e = if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        };
        (e, fl)
    };
    let me = std::process::id() as i32;
    assert_eq!(setlk(libc::F_SETLK, libc::F_WRLCK, 0, 10).0, 0);
    let f = c
        .open("/db", OpenOptions::new().read(true).write(true))
        .unwrap();
    let held = f
        .lock(LockKind::Posix, LockCmd::Test, LockType::Read, 5, 1, false)
        .unwrap()
        .expect("the mount's lock is seen");
    assert_eq!((held.ty, held.start, held.len), (LockType::Write, 0, 10));
    let busy = f.lock(LockKind::Posix, LockCmd::Set, LockType::Read, 0, 1, false);
    assert_eq!(busy.unwrap_err().errno(), libc::EAGAIN);
    // The other way: libmoneta's lock refuses the mount's, and F_GETLK names its process.
    f.lock(
        LockKind::Posix,
        LockCmd::Set,
        LockType::Write,
        100,
        10,
        false,
    )
    .unwrap();
    assert_eq!(setlk(libc::F_SETLK, libc::F_RDLCK, 105, 1).0, libc::EAGAIN);
    let (e, fl) = setlk(libc::F_GETLK, libc::F_RDLCK, 100, 0);
    assert_eq!(e, 0);
    assert_eq!(
        (fl.l_type as i32, fl.l_start, fl.l_len, fl.l_pid),
        (libc::F_WRLCK, 100, 10, me)
    );
    // The process's own locks never conflict with each other, and split and merge.
    assert_eq!(setlk(libc::F_SETLK, libc::F_RDLCK, 2, 3).0, 0);
    assert_eq!(setlk(libc::F_SETLK, libc::F_WRLCK, 10, 10).0, 0);
    // F_SETLKW in another process waits for libmoneta's lock to go.
    let waiter = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import fcntl,os\nf=open({:?},'r+')\n\
             fcntl.lockf(f,fcntl.LOCK_EX,10,100,os.SEEK_SET)",
            m.p("db").display().to_string()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let mut waiter = waiter;
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "F_SETLKW returned while libmoneta held the lock"
    );
    f.lock(
        LockKind::Posix,
        LockCmd::Set,
        LockType::Unlock,
        100,
        10,
        false,
    )
    .unwrap();
    let o = waiter.wait_with_output().unwrap();
    assert!(o.status.success(), "waiter: {}", text(&o));
    // A waiting F_SETLKW takes a signal (EINTR).
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import fcntl,signal,sys\n\
             def h(*a): raise TimeoutError()\n\
             signal.signal(signal.SIGALRM,h)\nsignal.alarm(1)\nf=open({:?},'r+')\n\
             try:\n  fcntl.lockf(f,fcntl.LOCK_EX,10,0)\nexcept TimeoutError:\n  sys.exit(0)\n\
             sys.exit(3)",
            m.p("db").display().to_string()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "interrupted waiter: {}", text(&o));
    // Closing any descriptor of the file drops the process's locks (POSIX).
    let k2 = std::fs::File::open(m.p("db")).unwrap();
    drop(k2);
    f.lock(LockKind::Posix, LockCmd::Set, LockType::Write, 0, 20, false)
        .unwrap();
    drop(k);
}

/// Two users: each acts with their own credentials through the same mount, exactly as
/// through libmoneta (ownership, mode bits, supplementary groups, the sticky bit).
#[test]
fn two_users() {
    need_root("two_users");
    let d = Daemon::start(true);
    let m = Mount::new(&d);
    let (a, b, g) = (60101u32, 60102u32, 60150u32);
    m.sh("mkdir -m 1777 tmp && mkdir -m 700 private && echo top > private/f");
    let run = |user: u32, groups: &[u32], script: &str| m.sh_as(Some((user, groups)), script);
    let ok = |user: u32, groups: &[u32], script: &str| {
        let o = run(user, groups, script);
        assert!(o.status.success(), "uid {user}: {script}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let refused = |user: u32, groups: &[u32], script: &str, what: &str| {
        let o = run(user, groups, script);
        assert!(!o.status.success(), "uid {user}: {script} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(what), "uid {user}: {script}: {err}");
    };
    ok(
        a,
        &[],
        "echo mine > tmp/a && chmod 600 tmp/a && echo shared > tmp/s && chmod 640 tmp/s",
    );
    let c = d.client();
    let s = c.stat("/tmp/a").unwrap();
    assert_eq!(
        (s.uid, s.gid, s.mode & 0o777),
        (a, a, 0o600),
        "created as uid {a}"
    );
    refused(b, &[], "cat tmp/a", "Permission denied");
    refused(b, &[], "cat private/f", "Permission denied");
    refused(b, &[], "ls private", "Permission denied");
    refused(b, &[], "echo x > tmp/a", "Permission denied");
    refused(b, &[], "rm -f tmp/a", "Operation not permitted");
    refused(b, &[], "chmod 666 tmp/a", "Operation not permitted");
    refused(b, &[], "mv tmp/a tmp/b", "Operation not permitted");
    refused(a, &[], "chown 60102 tmp/a", "Operation not permitted");
    refused(b, &[], "echo y > z", "Permission denied");
    // A supplementary group opens what the group may read, and only that.
    m.sh(&format!("chgrp {g} tmp/s"));
    refused(b, &[], "cat tmp/s", "Permission denied");
    assert_eq!(ok(b, &[g], "cat tmp/s"), "shared\n");
    refused(b, &[g], "echo w >> tmp/s", "Permission denied");
    // What each created is theirs; root may do anything.
    ok(b, &[], "echo b > tmp/b");
    assert_eq!(c.stat("/tmp/b").unwrap().uid, b);
    ok(a, &[], "cat tmp/a && rm tmp/a");
    m.sh("cat tmp/b && chown 60101 tmp/b");
    assert_eq!(c.stat("/tmp/b").unwrap().uid, a);
    // libmoneta as user b gets the same answers as the mount did.
    let o = Command::new("setpriv")
        .args([
            &format!("--reuid={b}"),
            &format!("--regid={b}"),
            "--clear-groups",
        ])
        .arg(env!("CARGO_BIN_EXE_moneta"))
        .args(["run", "--no-start", "--socket"])
        .arg(&d.socket)
        .args(["--", "cat", "/moneta/private/f"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        text(&o)
    );
}

/// A killed server leaves a dead mount that `moneta umount` clears; mounting again shows the
/// files; `moneta umount` refuses what is not a moneta mount; mount errors are clear.
#[test]
fn killed_server_and_unmounting() {
    let d = Daemon::start(false);
    let mut m = Mount::new(&d);
    std::fs::write(m.p("kept"), b"kept").unwrap();
    // SAFETY: a signal to the server this test started.
    unsafe { libc::kill(m.pid as i32, libc::SIGKILL) };
    let t = Instant::now();
    while m.alive() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The kernel answers a call on a connection it is still aborting ECONNABORTED, and
    // ENOTCONN once it is done: either way the mount is dead.
    let e = errno_of(std::fs::metadata(m.p("kept")));
    assert!(e == libc::ENOTCONN || e == libc::ECONNABORTED, "errno {e}");
    let o = moneta().arg("umount").arg(&m.path).output().unwrap();
    assert!(o.status.success(), "umount of a dead mount: {}", text(&o));
    assert_eq!(std::fs::read_dir(&m.path).unwrap().count(), 0);
    let o = moneta().arg("umount").arg(&m.path).output().unwrap();
    assert!(
        !o.status.success() && text(&o).contains("nothing is mounted"),
        "{}",
        text(&o)
    );
    let o = moneta().args(["umount", "/"]).output().unwrap();
    assert!(
        !o.status.success() && text(&o).contains("not a moneta mount"),
        "{}",
        text(&o)
    );
    // Mounted again on the same directory: the files are there (they live in the daemon).
    let again = Mount::new(&d);
    m.pid = again.pid;
    assert_eq!(std::fs::read(again.p("kept")).unwrap(), b"kept");
    // SIGTERM unmounts cleanly.
    // SAFETY: a signal to the server this test started.
    unsafe { libc::kill(again.pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    while again.alive() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!again.alive(), "the server stops on SIGTERM");
    assert_eq!(std::fs::read_dir(&again.path).unwrap().count(), 0);
    // Errors: no daemon, not a directory, a raw daemon.
    let dir = TempDir::new("e");
    let o = moneta()
        .args(["mount", "--socket"])
        .arg(dir.0.join("none.sock"))
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("not running"),
        "{}",
        text(&o)
    );
    let file = dir.0.join("file");
    std::fs::write(&file, b"").unwrap();
    let o = moneta()
        .args(["mount", "--socket"])
        .arg(&d.socket)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("is not a directory"),
        "{}",
        text(&o)
    );
    let raw_sock = dir.0.join("raw.sock");
    let o = moneta()
        .args(["start", "--volatile", "--size", "16M", "--socket"])
        .arg(&raw_sock)
        .args(["--", "--raw"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta()
        .args(["mount", "--socket"])
        .arg(&raw_sock)
        .arg(&dir.0)
        .output()
        .unwrap();
    let _ = moneta().args(["stop", "--socket"]).arg(&raw_sock).output();
    assert!(
        !o.status.success() && text(&o).contains("raw device"),
        "{}",
        text(&o)
    );
    assert!(crate_mounts_under(&dir.0).is_empty());
}

/// Mounts under `dir` in /proc/self/mountinfo.
fn crate_mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let d = dir.display().to_string();
    info.lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|p| p.starts_with(&d)))
        .map(str::to_string)
        .collect()
}

/// `moneta bench --path fuse` runs beside the other paths in a tiny configuration.
#[test]
fn bench_fuse_path() {
    need_fuse();
    let o = moneta()
        .args([
            "bench",
            "--path",
            "fuse",
            "--path",
            "kernel-psync",
            "--size",
            "4K",
            "--op",
            "randrw",
            "--duration",
            "0.2",
            "--warmup",
            "0.1",
            "--runs",
            "1",
            "--region",
            "8M",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let paths: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["path"].as_str().map(str::to_string))
        .collect();
    assert!(paths.contains(&"fuse".to_string()), "{out}");
    assert!(paths.contains(&"kernel-psync".to_string()), "{out}");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !info.contains("moneta-bench-mount"),
        "the bench unmounts: {info}"
    );
}

/// A shared mapping of a file through the mount: stores reach the array (and libmoneta's
/// clients) at msync; a new mapping sees what channel clients wrote before it.
#[test]
fn shared_mapping() {
    let d = Daemon::start(false);
    let m = Mount::new(&d);
    let c = d.client();
    let f = c
        .open(
            "/mapped",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    f.write_at(&[b'a'; 8192], 0).unwrap();
    let k = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("mapped"))
        .unwrap();
    // SAFETY: a fresh shared mapping of 8 KiB of a file of 8 KiB, used through raw pointers
    // only while mapped.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            8192,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &k,
            0,
        )
    }
    .expect("a shared mapping through the mount (Linux 6.6 or later)");
    let bytes = p.cast::<u8>();
    // SAFETY: inside the mapping.
    unsafe {
        assert_eq!(bytes.add(100).read_volatile(), b'a');
        std::ptr::copy_nonoverlapping(b"mapped".as_ptr(), bytes.add(4096), 6);
        rustix::mm::msync(p, 8192, rustix::mm::MsyncFlags::SYNC).unwrap();
        rustix::mm::munmap(p, 8192).unwrap();
    }
    let mut b = [0u8; 6];
    f.read_at(&mut b, 4096).unwrap();
    assert_eq!(&b, b"mapped");
}
