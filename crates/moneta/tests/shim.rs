//! Unmodified programs on Moneta files through the `LD_PRELOAD` shim, started with `moneta run`
//! against a real daemon: coreutils, sqlite3, python3, fio and a shell script, each checked by
//! content, plus a C program that checks the C library calls one by one (`shim/probe.c`).
//!
//! The programs come from the distribution (`scripts/test.sh` installs sqlite3 and fio); a
//! missing one fails its test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_moneta"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `libmoneta.so` beside the binaries, brought up to date once per test process (`cargo test`
/// leaves it as the last `cargo build` made it).
fn library() -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let dir = bin_dir();
    let so = dir.join("libmoneta.so");
    BUILT.get_or_init(|| {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "--quiet", "-p", "libmoneta-c"]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "cargo build -p libmoneta-c");
    });
    assert!(so.exists(), "{} missing", so.display());
    so
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!(
            "moneta-shim-{tag}-{}-{:x}",
            std::process::id(),
            rand_u64()
        ));
        std::fs::create_dir_all(&d).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u64::from_le_bytes(b)
}

/// A daemon of the test's own on a volatile array, stopped at the end.
struct Daemon {
    dir: TempDir,
    socket: PathBuf,
}

impl Daemon {
    fn start(size: &str) -> Daemon {
        Self::start_with(size, &[])
    }

    /// With further `monetad` options.
    fn start_with(size: &str, monetad: &[&str]) -> Daemon {
        let dir = TempDir::new("d");
        let socket = dir.0.join("monetad.sock");
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .args(["start", "--volatile", "--size", size, "--socket"])
            .arg(&socket)
            .arg("--")
            .args(monetad)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
        Daemon { dir, socket }
    }

    /// `moneta run -- args...` with this daemon; stdin from `input`.
    fn run(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        self.run_env(args, input, &[])
    }

    fn run_env(&self, args: &[&str], input: Option<&[u8]>, env: &[(&str, &str)]) -> Output {
        let _ = library();
        let mut c = Command::new(env!("CARGO_BIN_EXE_moneta"));
        c.arg("run")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--no-start")
            .arg("--")
            .args(args)
            .env_remove("MONETA_MOUNT")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        if let Some(i) = input {
            child.stdin.take().unwrap().write_all(i).unwrap();
        }
        wait_limit(child, Duration::from_secs(300))
    }

    /// `sh -c script` under the shim; fails the test unless it exits 0.
    fn sh(&self, script: &str) -> String {
        let o = self.run(&["sh", "-c", script], None);
        assert!(o.status.success(), "sh -c {script:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("stop")
            .arg("--socket")
            .arg(&self.socket)
            .output();
        let _ = &self.dir;
    }
}

fn wait_limit(mut child: std::process::Child, limit: Duration) -> Output {
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("timed out after {limit:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn need(tool: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "{tool} is not installed (scripts/test.sh installs it)");
}

fn cc(src: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc {}: {}", src.display(), text(&o));
}

/// The C library calls one by one: errno rules, descriptors and dup, positions, flags,
/// attributes, vectored I/O, truncation, mmap (the file's own pages, shared and private), fork, exec
/// with a Moneta stdout, record locks and flock between processes, stdio, directories, rename
/// across devices, the current directory, and an unlinked file still open.
#[test]
fn probe_of_the_c_library_calls() {
    let d = Daemon::start("256M");
    let t = TempDir::new("probe");
    let exe = t.0.join("probe");
    cc(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim/probe.c"),
        &exe,
        &[],
    );
    let o = d.run(&[exe.to_str().unwrap(), "/moneta/probe"], None);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("probe: ok"),
        "{}",
        text(&o)
    );
    // What it left, seen by another program.
    let out = d.sh("cat /moneta/probe/exec-out; ls /moneta/probe/sub");
    assert_eq!(out, "abZZmoved\n");
}

/// LMDB maps its data file (read-only, written with `pwrite`) and its lock file (shared,
/// written through the mapping) in every process: a database loaded, then read back by other
/// processes, on a volatile array and on a persistent one.
#[test]
fn lmdb_loads_and_reads_back() {
    need("mdb_load");
    let volatile = Daemon::start("64M");
    let persistent = PersistentDaemon::start();
    for d in [&volatile, &persistent.0] {
        let out = d.sh("set -e; mkdir /moneta/lm && \
             awk 'BEGIN{for(i=0;i<5000;i++){printf \"key%05d\\nvalue%d\\n\", i, i*i}}' | \
             mdb_load -T /moneta/lm && mdb_stat /moneta/lm | grep Entries && \
             mdb_dump -p /moneta/lm | grep -c value && mdb_dump -p /moneta/lm | grep -A1 key04999");
        assert_eq!(out, "  Entries: 5000\n5000\n key04999\n value24990001\n");
    }
}

/// A program that maps a Moneta file read-only and writes through the mapping dies of
/// SIGSEGV, after `mmap` and `mprotect` refused it writable pages; the file is unchanged.
#[test]
fn a_read_only_mapping_written_dies_of_sigsegv() {
    let d = Daemon::start("64M");
    let t = TempDir::new("rowrite");
    let exe = t.0.join("rowrite");
    cc(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim/rowrite.c"),
        &exe,
        &[],
    );
    d.sh("printf readonly > /moneta/ro.txt");
    let o = d.run(&[exe.to_str().unwrap(), "/moneta/ro.txt"], None);
    use std::os::unix::process::ExitStatusExt;
    let segv =
        o.status.signal() == Some(libc::SIGSEGV) || o.status.code() == Some(128 + libc::SIGSEGV);
    assert!(segv, "{:?}: {}", o.status, text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "readonly\n");
    assert_eq!(d.sh("cat /moneta/ro.txt"), "readonly");
}

/// coreutils: a 100 MiB random file copied in and out and compared; cat, dd with odd block
/// sizes, ls -l, mv, rm -r, mkdir -p, sha256sum.
#[test]
fn coreutils() {
    let d = Daemon::start("512M");
    let t = TempDir::new("core");
    let src = t.0.join("random.bin");
    {
        let mut f = std::fs::File::create(&src).unwrap();
        let mut x = rand_u64() | 1;
        let mut block = vec![0u8; 1 << 20];
        for _ in 0..100 {
            for c in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&block).unwrap();
        }
    }
    let s = src.to_str().unwrap();
    let back = t.0.join("back.bin");
    let b = back.to_str().unwrap();
    d.sh(&format!(
        "set -e; mkdir -p /moneta/a/b/c; cp {s} /moneta/a/b/c/big; cp /moneta/a/b/c/big {b}; \
         cmp {s} {b}; cmp {s} /moneta/a/b/c/big"
    ));
    assert_eq!(
        std::fs::read(&src).unwrap(),
        std::fs::read(&back).unwrap(),
        "copied out and in"
    );
    let sums = d.sh(&format!("sha256sum {s} /moneta/a/b/c/big | cut -d' ' -f1"));
    let lines: Vec<&str> = sums.lines().collect();
    assert!(lines.len() == 2 && lines[0] == lines[1], "{sums}");
    // dd with block sizes that divide nothing, in and out.
    d.sh(&format!(
        "set -e; dd if={s} of=/moneta/dd.bin bs=7777 status=none; \
         dd if=/moneta/dd.bin of={b}.dd bs=12345 status=none; cmp {s} {b}.dd; \
         dd if={s} of=/moneta/part bs=1000 count=3 skip=5 status=none"
    ));
    let whole = std::fs::read(&src).unwrap();
    let part = d.run(&["cat", "/moneta/part"], None);
    assert!(part.status.success());
    assert_eq!(part.stdout, &whole[5000..8000]);
    // ls -l, mv, rm -r.
    let ls = d.sh("ls -l /moneta/a/b/c");
    assert!(ls.contains("104857600") && ls.contains(" big"), "{ls}");
    d.sh("mv /moneta/a/b/c/big /moneta/moved && test ! -e /moneta/a/b/c/big");
    let ls = d.sh("ls /moneta");
    assert_eq!(ls, "a\ndd.bin\nlost+found\nmoved\npart\n");
    d.sh("rm -r /moneta/a && test ! -e /moneta/a");
    assert_eq!(d.sh("ls /moneta"), "dd.bin\nlost+found\nmoved\npart\n");
    // mv out of Moneta copies across "devices" and removes the source.
    d.sh(&format!("mv /moneta/part {b}.part"));
    assert_eq!(
        std::fs::read(format!("{b}.part")).unwrap(),
        &whole[5000..8000]
    );
    assert_eq!(d.sh("ls /moneta"), "dd.bin\nlost+found\nmoved\n");
}

/// A shell script with `>`, `>>`, `<` and a pipeline into Moneta files.
#[test]
fn shell_redirections() {
    let d = Daemon::start("128M");
    let out = d.sh(
        "set -e; echo one > /moneta/f; echo two >> /moneta/f; printf 'three\\n' >> /moneta/f; \
         cat < /moneta/f > /moneta/g; sort -r < /moneta/g | tr a-z A-Z > /moneta/h; \
         while read l; do echo \"got $l\"; done < /moneta/h; wc -l < /moneta/f",
    );
    assert_eq!(out, "got TWO\ngot THREE\ngot ONE\n3\n");
    // A group's output through the shell's own echo, a forked and executed shell and an
    // external program, one after the other at the shared position.
    let out = d.sh(
        "{ echo one; sh -c 'echo two'; /bin/echo three; printf 'four\\n'; } > /moneta/seq; \
         cat /moneta/seq",
    );
    assert_eq!(out, "one\ntwo\nthree\nfour\n");
    // bash, which forks and execs differently from dash.
    let o = d.run(
        &[
            "bash",
            "-c",
            "exec 3>/moneta/b3; echo via3 >&3; exec 3>&-; cat /moneta/b3; { echo a; echo b; } > /moneta/b4; cat /moneta/b4",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "via3\na\nb\n");
}

/// sqlite3: 100,000 rows in one transaction, reopened and checked; then two writer processes
/// at once, which SQLite's locks keep from corrupting anything.
#[test]
fn sqlite3() {
    need("sqlite3");
    let d = Daemon::start("256M");
    let script = "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);\n\
                  BEGIN;\n\
                  WITH RECURSIVE c(x) AS (VALUES(1) UNION ALL SELECT x+1 FROM c WHERE x<100000)\n\
                  INSERT INTO t SELECT x, hex(randomblob(16)) FROM c;\n\
                  COMMIT;\n";
    let o = d.run(&["sqlite3", "/moneta/db.sqlite"], Some(script.as_bytes()));
    assert!(o.status.success(), "{}", text(&o));
    let o = d.run(
        &[
            "sqlite3",
            "/moneta/db.sqlite",
            "PRAGMA integrity_check; SELECT count(*), sum(a) FROM t;",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok\n100000|5000050000\n"
    );

    // Two writers at once: each inserts 300 rows, one transaction per row.
    two_row_writers(&d);
    let o = d.run(
        &[
            "sqlite3",
            "/moneta/w.sqlite",
            "PRAGMA integrity_check; SELECT who, count(*), sum(n) FROM w GROUP BY who;",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok\na|300|44850\nb|300|44850\n"
    );

    // WAL mode maps the -shm file shared between processes: on a volatile array the file's
    // own pages. Three writer processes at once, then the count and an integrity check.
    d.sh("sqlite3 /moneta/wal.db 'PRAGMA journal_mode=WAL; CREATE TABLE t(who TEXT, n INTEGER);' >/dev/null");
    let writer = |who: &str| {
        let mut sql = String::from(".timeout 20000\n");
        for n in 0..200 {
            sql.push_str(&format!("INSERT INTO t VALUES('{who}', {n});\n"));
        }
        sql
    };
    let scripts = [writer("a"), writer("b"), writer("c")];
    std::thread::scope(|s| {
        let hs: Vec<_> = scripts
            .iter()
            .map(|sql| s.spawn(|| d.run(&["sqlite3", "/moneta/wal.db"], Some(sql.as_bytes()))))
            .collect();
        for h in hs {
            let o = h.join().unwrap();
            assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));
        }
    });
    let out = d.sh(
        "sqlite3 /moneta/wal.db 'PRAGMA journal_mode; PRAGMA integrity_check; \
         SELECT who, count(*), sum(n) FROM t GROUP BY who;'",
    );
    assert_eq!(out, "wal\nok\na|200|19900\nb|200|19900\nc|200|19900\n");
    let out = d.sh("ls /moneta/ | grep wal.db | sort");
    assert_eq!(
        out, "wal.db\n",
        "the -wal and -shm files go with the last connection"
    );

    // On a persistent array the -shm file's pages are a file beside the backing file: WAL
    // works there too.
    let p = PersistentDaemon::start();
    p.0.sh("sqlite3 /moneta/wal.db 'PRAGMA journal_mode=WAL; CREATE TABLE t(a);' >/dev/null");
    std::thread::scope(|s| {
        let hs: Vec<_> = ["x", "y"]
            .iter()
            .map(|who| {
                let sql = format!(
                    ".timeout 20000\n{}",
                    (0..100)
                        .map(|n| format!("INSERT INTO t VALUES('{who}{n}');\n"))
                        .collect::<String>()
                );
                let p = &p;
                s.spawn(move || {
                    p.0.run(&["sqlite3", "/moneta/wal.db"], Some(sql.as_bytes()))
                })
            })
            .collect();
        for h in hs {
            let o = h.join().unwrap();
            assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));
        }
    });
    let out =
        p.0.sh("sqlite3 /moneta/wal.db 'PRAGMA integrity_check; SELECT count(*) FROM t;'");
    assert_eq!(out, "ok\n200\n");

    // An array with data checksums hands out no pages (stores through a mapping would bypass
    // them): the switch is refused with a message naming mmap, once, and the database keeps
    // its journal mode.
    let c = Daemon::start_with("64M", &["--data-checksums"]);
    c.sh("sqlite3 /moneta/wal.db 'CREATE TABLE t(a); INSERT INTO t VALUES(7);'");
    let o = c.run(
        &["sqlite3", "/moneta/wal.db"],
        Some(b"PRAGMA journal_mode=WAL;\nINSERT INTO t VALUES(8);\nPRAGMA journal_mode=WAL;\n"),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("journal_mode=WAL refused for /moneta/wal.db")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("(mmap MAP_SHARED)"), "{err}");
    let out = c.sh(
        "sqlite3 /moneta/wal.db 'PRAGMA journal_mode; PRAGMA integrity_check; SELECT a FROM t;'",
    );
    assert_eq!(out, "delete\nok\n7\n8\n");
}

/// Makes `/moneta/w.sqlite` with a table `w(who, n)`, then runs two `sqlite3` writer
/// processes at once, `a` and `b`, each inserting 300 rows `(who, 0..300)`, one transaction
/// per row; both must succeed with nothing on standard error.
fn two_row_writers(d: &Daemon) {
    d.sh("sqlite3 /moneta/w.sqlite 'CREATE TABLE w(who TEXT, n INTEGER)'");
    let writer = |who: &str| {
        let mut sql = String::from(".timeout 20000\n");
        for n in 0..300 {
            sql.push_str(&format!(
                "BEGIN IMMEDIATE; INSERT INTO w VALUES('{who}', {n}); COMMIT;\n"
            ));
        }
        sql
    };
    let (a, b) = (writer("a"), writer("b"));
    std::thread::scope(|s| {
        let ha = s.spawn(|| d.run(&["sqlite3", "/moneta/w.sqlite"], Some(a.as_bytes())));
        let hb = s.spawn(|| d.run(&["sqlite3", "/moneta/w.sqlite"], Some(b.as_bytes())));
        for o in [ha.join().unwrap(), hb.join().unwrap()] {
            assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));
        }
    });
}

/// sqlite3 at the `host` level, the persistent array's default, where a database made
/// durable again and again goes in place in each process that writes it (libmoneta's
/// default): two writer processes at once, one transaction per row; then the daemon is
/// killed, and the next one folds the database's pages back: it checks whole, every row there.
#[test]
fn sqlite3_in_place_at_the_host_level_survives_a_killed_daemon() {
    need("sqlite3");
    let p = PersistentDaemon::start();
    two_row_writers(&p.0);
    // The database went in place: its pages are a file beside the backing file.
    let pages = p.0.dir.0.join("device.img.pages");
    let listed = std::fs::read_dir(&pages).map_or(0, |d| d.count());
    assert!(listed > 0, "no file went in place");
    let pid: i32 = std::fs::read_to_string(p.0.socket.with_extension("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: a signal to the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    p.spawn();
    assert!(!pages.exists(), "the pages were not folded back");
    let out = p.0.sh("sqlite3 /moneta/w.sqlite 'PRAGMA integrity_check; \
         SELECT who, count(*), sum(n) FROM w GROUP BY who;'");
    assert_eq!(out, "ok\na|300|44850\nb|300|44850\n");
}

/// A daemon on a persistent array (a backing file in the test's directory), stopped at the
/// end.
struct PersistentDaemon(Daemon);

impl PersistentDaemon {
    fn start() -> PersistentDaemon {
        let dir = TempDir::new("p");
        let socket = dir.0.join("monetad.sock");
        let p = PersistentDaemon(Daemon { dir, socket });
        p.spawn();
        p
    }

    /// Starts a daemon on the array (again, after one was killed).
    fn spawn(&self) {
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .args(["start", "--size", "64M", "--device"])
            .arg(self.0.dir.0.join("device.img"))
            .arg("--socket")
            .arg(&self.0.socket)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
    }
}

/// python3 with open, os and shutil.
#[test]
fn python3() {
    need("python3");
    let d = Daemon::start("128M");
    let script = r#"
import os, shutil
os.makedirs('/moneta/py/sub', exist_ok=True)
with open('/moneta/py/a.txt', 'w') as f:
    f.write('hello\n' * 1000)
with open('/moneta/py/a.txt') as f:
    assert f.read() == 'hello\n' * 1000
with open('/moneta/py/bin', 'wb') as f:
    f.write(bytes(range(256)) * 4000)
    f.seek(10)
    f.write(b'XY')
with open('/moneta/py/bin', 'rb') as f:
    f.seek(9)
    assert f.read(4) == bytes([9]) + b'XY' + bytes([12])
    assert os.fstat(f.fileno()).st_size == 1024000
shutil.copyfile('/etc/hostname', '/moneta/py/host')
assert open('/moneta/py/host', 'rb').read() == open('/etc/hostname', 'rb').read()
shutil.copytree('/moneta/py', '/moneta/py2')
assert sorted(os.listdir('/moneta/py2')) == ['a.txt', 'bin', 'host', 'sub']
assert open('/moneta/py2/bin', 'rb').read() == open('/moneta/py/bin', 'rb').read()
os.rename('/moneta/py/a.txt', '/moneta/py/b.txt')
with open('/moneta/py/b.txt', 'a') as f:
    f.write('x')
assert os.path.getsize('/moneta/py/b.txt') == 6001
walk = [(r, sorted(d), sorted(f)) for r, d, f in os.walk('/moneta')]
assert ('/moneta/py', ['sub'], ['b.txt', 'bin', 'host']) in walk, walk
shutil.rmtree('/moneta/py2')
assert not os.path.exists('/moneta/py2')
os.chdir('/moneta/py')
assert os.getcwd() == '/moneta/py'
with open('rel.txt', 'w') as f:
    f.write('relative')
assert open('/moneta/py/rel.txt').read() == 'relative'
fd = os.open('/moneta/py/rel.txt', os.O_RDWR)
assert os.pread(fd, 3, 2) == b'lat'
os.pwrite(fd, b'RE', 0)
os.ftruncate(fd, 4)
os.close(fd)
assert open('rel.txt').read() == 'REla'
# Children started by subprocess (vfork and exec) with Moneta files as stdin and stdout; the
# parent's own descriptors stay its own.
import subprocess
r = subprocess.run(['cat'], stdin=open('/moneta/py/rel.txt'), capture_output=True)
assert r.stdout == b'REla', r
with open('/moneta/py/out', 'w') as f:
    subprocess.run(['sh', '-c', 'cat; echo more'], stdin=open('/moneta/py/rel.txt'), stdout=f)
assert open('/moneta/py/out').read() == 'RElamore\n'
print('python: ok')
"#;
    let o = d.run(&["python3", "-c", script], None);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("python: ok"),
        "{}",
        text(&o)
    );
}

/// Closes whose answer nothing waits for are posted without waiting (libmoneta.md, "Closes"):
/// the data and sizes are there for every later reader, an unlinked file's space is free for
/// the next `statfs`; the close of a file the process locked waits (another process takes the
/// lock at once after it), and so does one of a file opened before a fork.
#[test]
fn closes_are_posted_unless_locks_or_a_fork_depend_on_them() {
    need("python3");
    let d = Daemon::start("64M");
    let script = r#"
import os, fcntl, subprocess, sys
d = '/moneta/pc'
os.makedirs(d, exist_ok=True)
for i in range(10):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_RDWR, 0o644)
    os.write(fd, bytes([i]) * 5000)
    os.close(fd)
for i in range(10):
    st = os.stat(f'{d}/f{i}')
    assert st.st_size == 5000, st
    with open(f'{d}/f{i}', 'rb', buffering=0) as f:
        assert f.read() == bytes([i]) * 5000
before = os.statvfs(d).f_bfree
fd = os.open(f'{d}/big', os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b'b' * (1 << 20))
assert os.statvfs(d).f_bfree < before
os.unlink(f'{d}/big')
os.close(fd)
assert os.statvfs(d).f_bfree == before, (os.statvfs(d).f_bfree, before)
fd = os.open(f'{d}/locked', os.O_CREAT | os.O_RDWR, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
os.close(fd)
r = subprocess.run([sys.executable, '-c', 'import fcntl, os; fd = os.open("' + d + '/locked", os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("taken")'], capture_output=True)
assert r.stdout == b'taken\n', r
fd = os.open(f'{d}/forked', os.O_CREAT | os.O_RDWR, 0o644)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
os.close(fd)
print('closes: ok')
"#;
    let o = d.run_env(&["python3", "-c", script], None, &[("MONETA_REPORT", "1")]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("closes: ok"),
        "{}",
        text(&o)
    );
    // The parent's report: the ten small files' closes (and their readers'), and the
    // unlinked file's, were posted; the locked file's and the one open across the fork were
    // not.
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .filter(|l| l.contains("libmoneta report"))
        .find(|l| l.contains("lock"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("21 of the closes posted without waiting"),
        "{line}"
    );
}

/// Creates follow the umask: the one the program started with, and each it sets, as the
/// kernel applies them (the shim keeps the umask as the program sets it, and applies it
/// itself); a `vfork` child that sets its own before its `exec` leaves the parent's alone, and
/// a forked child's is its own.
#[test]
fn creates_follow_the_umask() {
    need("python3");
    let d = Daemon::start("64M");
    let script = r#"
import os, stat, subprocess
def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)
def made(name, umask_seen):
    os.close(os.open('/moneta/um/' + name, os.O_CREAT | os.O_WRONLY, 0o666))
    os.mkdir('/moneta/um/' + name + '.d', 0o777)
    f, d = mode('/moneta/um/' + name), mode('/moneta/um/' + name + '.d')
    assert (f, d) == (0o666 & ~umask_seen, 0o777 & ~umask_seen), (name, oct(f), oct(d))
os.mkdir('/moneta/um', 0o755)
os.chmod('/moneta/um', 0o755)
made('inherited', 0o027)
assert os.umask(0o077) == 0o027
made('after-077', 0o077)
assert os.umask(0o002) == 0o077
made('after-002', 0o002)
# A child that sets its own umask before it runs its program (vfork, on this memory).
subprocess.run(['true'], umask=0o000, check=True)
made('after-child', 0o002)
# A forked child's umask is its own, and so is its parent's.
pid = os.fork()
if pid == 0:
    try:
        os.umask(0o070)
        made('in-fork-child', 0o070)
        os._exit(0)
    except BaseException as e:
        print(e)
        os._exit(1)
assert os.waitpid(pid, 0)[1] == 0
made('after-fork', 0o002)
print('umask: ok')
"#;
    let cmd = "umask 027; exec python3 -c \"$0\"";
    let o = d.run(&["sh", "-c", cmd, script], None);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("umask: ok"),
        "{}",
        text(&o)
    );
}

/// git maps its files (`.git/config`, every file `git add` takes over 32 KiB, packs): a
/// repository under the prefix takes commits, shows diffs, packs, checks and clones itself, on
/// a volatile array and on a persistent one.
#[test]
fn git_repository_under_the_prefix() {
    need("git");
    let volatile = Daemon::start("128M");
    let persistent = PersistentDaemon::start();
    for d in [&volatile, &persistent.0] {
        let out = d.sh("set -e; cd /moneta && git init -q repo && cd repo && \
             git config user.name u && git config user.email u@example.org && \
             printf 'one\\n' > a && head -c 200000 /dev/zero | tr '\\0' b > big && \
             git add a big && git commit -qm first && \
             printf 'two\\n' >> a && git diff --stat | cat && git commit -qam second && \
             git gc -q && git fsck --no-progress 2>&1 && git log --format=%s | cat && \
             git show HEAD:a && cd .. && git clone -q repo copy && cd copy && \
             git log --format=%s | cat && wc -c < big && git fsck --no-progress 2>&1");
        assert_eq!(
            out,
            " a | 1 +\n 1 file changed, 1 insertion(+)\nsecond\nfirst\none\ntwo\nsecond\nfirst\n200000\n"
        );
    }
}

/// Python's `mmap`: a file shared between a process and its child, and with a process that
/// reads it through `read`.
#[test]
fn python_mmap_shared_between_processes() {
    need("python3");
    let d = Daemon::start("64M");
    let script = r#"
import mmap, os, signal, subprocess
with open('/moneta/m.bin', 'wb') as f:
    f.write(b'.' * 8192)
f = open('/moneta/m.bin', 'r+b')
m = mmap.mmap(f.fileno(), 8192)
pid = os.fork()
if pid == 0:
    m[100:105] = b'child'
    os._exit(0)
os.waitpid(pid, 0)
assert m[100:105] == b'child', m[100:105]
m[4096:4102] = b'parent'
r = subprocess.run(['python3', '-c', "print(open('/moneta/m.bin','rb').read()[4096:4102].decode())"], capture_output=True)
assert r.stdout == b'parent\n', r
os.pwrite(f.fileno(), b'write', 200)
assert m[200:205] == b'write'
m.flush()
m.close()
assert open('/moneta/m.bin', 'rb').read(205)[100:] == b'child' + b'.' * 95 + b'write'
print('python mmap: ok')
"#;
    let o = d.run(&["python3", "-c", script], None);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("python mmap: ok"),
        "{}",
        text(&o)
    );
}

/// Hints through the C library reach the device: `posix_fadvise`, `readahead` and `madvise`
/// with `WILLNEED` fill the modelled DRAM buffer with the file's lines, and only from a
/// descriptor open for reading.
#[test]
fn hints_from_fadvise_readahead_and_madvise_fill_the_dram_buffer() {
    need("python3");
    let d = Daemon::start_with(
        "64M",
        &[
            "--model",
            "slow-nvm",
            "--model-set",
            "buffer=4M",
            "--model-set",
            "readahead=0",
        ],
    );
    let script = r#"
import ctypes, errno, mmap, os
fd = os.open('/moneta/h.bin', os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b'x' * (256 << 10))
os.posix_fadvise(fd, 0, 65536, os.POSIX_FADV_WILLNEED)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
try:
    os.posix_fadvise(fd, 0, 10, 99)
    raise SystemExit('unknown advice taken')
except OSError as e:
    assert e.errno == errno.EINVAL, e
libc = ctypes.CDLL(None, use_errno=True)
assert libc.readahead(fd, ctypes.c_int64(196608), ctypes.c_size_t(16384)) == 0
m = mmap.mmap(fd, 256 << 10)
m.madvise(mmap.MADV_WILLNEED, 131072, 65536)
assert m[131072:131075] == b'xxx'
w = os.open('/moneta/h.bin', os.O_WRONLY)
try:
    os.posix_fadvise(w, 0, 4096, os.POSIX_FADV_WILLNEED)
    raise SystemExit('hint through a write-only descriptor taken')
except OSError as e:
    assert e.errno == errno.EBADF, e
print('hints: ok')
"#;
    let o = d.run(&["python3", "-c", script], None);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("hints: ok"),
        "{}",
        text(&o)
    );
    let m = libmoneta::Control::connect(&d.socket)
        .unwrap()
        .model()
        .unwrap();
    // 16 lines of 4 KiB by posix_fadvise, 4 by readahead, 16 by madvise.
    assert_eq!(m.get("buffer.hinted_lines"), Some("36"), "{m:?}");
}

/// fio with psync, random reads and writes, crc32c verification: no verify errors.
#[test]
fn fio_verifies() {
    need("fio");
    let d = Daemon::start("256M");
    let o = d.run(
        &[
            "fio",
            "--name=verify",
            "--filename=/moneta/fio.dat",
            "--size=32M",
            "--ioengine=psync",
            "--rw=randrw",
            "--bs=4k",
            "--bssplit=512/20:4k/50:64k/30",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("fio JSON");
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() > 0);
    assert!(job["read"]["io_bytes"].as_u64().unwrap() > 0);
    let ls = d.sh("ls -l /moneta/fio.dat");
    assert!(ls.contains("33554432"), "{ls}");
}

/// `MONETA_REPORT=1` prints what the shim did; files outside the prefix are the C library's.
#[test]
fn report_and_files_outside_the_prefix() {
    let d = Daemon::start("64M");
    let t = TempDir::new("rep");
    let outside = t.0.join("plain.txt");
    let script = format!(
        "echo data > /moneta/r; cat /moneta/r; echo kernel > {o}; cat {o}",
        o = outside.display()
    );
    let o = d.run_env(&["sh", "-c", &script], None, &[("MONETA_REPORT", "1")]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "data\nkernel\n");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kernel\n");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("libmoneta report") && err.contains("direct I/Os"),
        "{err}"
    );
}

/// A daemon whose poller has a CPU of its own: a program's threads leave it that CPU when the
/// program first touches a Moneta file (threads started before too), except one the program
/// pinned there itself; `MONETA_AFFINITY=any` leaves every mask alone; the report says what
/// moved. On a single CPU `auto` pins nothing and nothing moves.
#[test]
fn programs_leave_the_device_its_cpu() {
    let allowed = moneta_device::allowed_cpus();
    let d = Daemon::start_with("64M", &["--poller-cpu", "auto"]);
    // Three threads: the main one, one started before the first Moneta call, and one that
    // pinned itself to the poller's CPU (or to the only CPU).
    let script = r#"
import os, sys, threading
cpu = int(sys.argv[1])
ready = threading.Barrier(3); done = threading.Event()
def idle(pin):
    if pin: os.sched_setaffinity(0, {cpu})
    ready.wait(); done.wait()
ts = [threading.Thread(target=idle, args=(p,)) for p in (False, True)]
for t in ts: t.start()
ready.wait()
with open('/moneta/a', 'w') as f: f.write('x')
print(open('/moneta/a').read(),
      ','.join(str(c) for c in sorted(os.sched_getaffinity(0))),
      ','.join(str(c) for c in sorted(os.sched_getaffinity(ts[0].native_id))),
      ','.join(str(c) for c in sorted(os.sched_getaffinity(ts[1].native_id))))
done.set()
for t in ts: t.join()
"#;
    let list = |c: &[usize]| {
        c.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let last = *allowed.last().unwrap();
    let pinned = last.to_string();
    let run = |env: &[(&str, &str)]| {
        let mut e = vec![("MONETA_REPORT", "1")];
        e.extend_from_slice(env);
        let o = d.run_env(&["python3", "-c", script, &pinned], None, &e);
        assert!(o.status.success(), "{}", text(&o));
        (
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (out, err) = run(&[]);
    if allowed.len() >= 2 {
        let rest = list(&allowed[..allowed.len() - 1]);
        assert_eq!(out, format!("x {rest} {rest} {last}"), "{err}");
        assert!(
            err.contains(&format!(
                "the device has CPU {last}: 2 threads moved off it"
            )),
            "{err}"
        );
        let (out, err) = run(&[("MONETA_AFFINITY", "any")]);
        assert_eq!(
            out,
            format!("x {all} {all} {last}", all = list(&allowed)),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "the device has CPU {last}: 0 threads moved off it"
            )),
            "{err}"
        );
    } else {
        assert_eq!(out, format!("x {last} {last} {last}"), "{err}");
        assert!(!err.contains("the device has CPU"), "{err}");
    }
}

/// Without a daemon: `moneta run --no-start` refuses with a clear message; a preloaded
/// program says once that the daemon is not running, and calls on paths under the prefix fail
/// with `EIO` rather than reach the host's files of the same name.
#[test]
fn no_daemon() {
    let t = TempDir::new("nod");
    let socket = t.0.join("none.sock");
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(["run", "--no-start", "--socket"])
        .arg(&socket)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("no monetad answers"), "{}", text(&o));
    let o = Command::new("sh")
        .args(["-c", "cat /moneta/x /moneta/y; echo done"])
        .env("LD_PRELOAD", library())
        .env("MONETA_SOCKET", &socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(String::from_utf8_lossy(&o.stdout).contains("done"));
    assert_eq!(err.matches("is not running").count(), 1, "{err}");
    // The calls fail with EIO: never the host's /moneta/x, were there one.
    assert!(err.contains("fail with EIO"), "{err}");
    assert_eq!(err.matches(": Input/output error").count(), 2, "{err}");
    assert_eq!(err.matches("moneta start").count(), 1, "{err}");
    // With the prefix over a host directory that holds files of the same names: nothing
    // is read, listed, written, created or removed there.
    let mnt = t.0.join("mnt");
    std::fs::create_dir_all(mnt.join("sub")).unwrap();
    std::fs::write(mnt.join("x"), "host").unwrap();
    let m = mnt.display();
    let script = format!(
        "cat {m}/x; ls {m}; stat {m}/x; echo new > {m}/y; echo more >> {m}/x; rm {m}/x; \
         mkdir {m}/d; mv {m}/sub {m}/sub2; cd {m}/sub && touch z; cd /; cat {}/x; echo done",
        m.to_string().strip_prefix('/').unwrap()
    );
    let o = Command::new("sh")
        .args(["-c", &script])
        .env("LD_PRELOAD", library())
        .env("MONETA_SOCKET", &socket)
        .env("MONETA_MOUNT", &mnt)
        .current_dir(&t.0)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n", "{err}");
    assert_eq!(
        err.matches("is not running").count(),
        8,
        "one per process: {err}"
    );
    assert_eq!(std::fs::read_to_string(mnt.join("x")).unwrap(), "host");
    let mut names: Vec<String> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["sub", "x"]);
    assert!(!t.0.join("z").exists() && !mnt.join("sub/z").exists());
}

/// Runs a Python `script` under the shim, its daemon at `socket` (whether one runs there or
/// not: the script may start and stop it).
fn python_for_daemon_at(script: &str, socket: &std::path::Path) -> std::process::Output {
    Command::new("python3")
        .args(["-c", script])
        .env("LD_PRELOAD", library())
        .env("MONETA_SOCKET", socket)
        .env_remove("MONETA_MOUNT")
        .output()
        .unwrap()
}

/// A daemon killed under a program: its calls on `/moneta` fail with `EIO`, the first within
/// the liveness interval and the rest at once (each used to wait another interval, and opens
/// and the reading of a directory opened before failed with `ENOTCONN`).
#[test]
fn calls_after_the_daemon_was_killed_fail_with_eio_at_once() {
    need("python3");
    let t = TempDir::new("killed");
    let socket = t.0.join("monetad.sock");
    let moneta = env!("CARGO_BIN_EXE_moneta");
    let script = format!(
        r#"
import errno, os, re, signal, subprocess, time
out = subprocess.run(['{moneta}', 'start', '--volatile', '--size', '32M', '--socket', '{s}'], check=True, capture_output=True, text=True).stdout
pid = int(re.search(r'pid (\d+)', out).group(1))
fd = os.open('/moneta/f', os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, b'x', 0)
os.mkdir('/moneta/d')
listing = os.scandir('/moneta/d')
os.kill(pid, signal.SIGKILL)
def fails(call):
    try:
        call()
    except OSError as e:
        assert e.errno == errno.EIO, e
        return
    raise SystemExit('a call succeeded without a daemon')
# A write through the file's only open may return once rung (a posted write, abi.md 3.10),
# before anything finds the daemon gone; the next call that collects it, a read, fails.
try:
    os.pwrite(fd, b'y', 0)
except OSError as e:
    assert e.errno == errno.EIO, e
fails(lambda: os.pread(fd, 1, 0))
fails(lambda: os.pwrite(fd, b'y', 0))
t = time.monotonic()
for i in range(20):
    fails(lambda: os.pwrite(fd, b'y', 0))
    fails(lambda: os.open('/moneta/g%d' % i, os.O_RDWR | os.O_CREAT))
took = time.monotonic() - t
assert took < 2, took
fails(lambda: list(listing))
print('ok')
"#,
        s = socket.display()
    );
    let o = python_for_daemon_at(&script, &socket);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n");
}

/// A program that outlives its daemon: without one, Moneta paths fail with `EIO`; a daemon
/// started later is found by the next call; after a restart, files opened before fail with
/// `EIO` and new opens work.
#[test]
fn a_daemon_started_or_restarted_later_is_found() {
    need("python3");
    let t = TempDir::new("later");
    let socket = t.0.join("monetad.sock");
    let moneta = env!("CARGO_BIN_EXE_moneta");
    let script = format!(
        r#"
import errno, subprocess
def start(): subprocess.run(['{moneta}', 'start', '--volatile', '--size', '32M', '--socket', '{s}'], check=True, stdout=subprocess.DEVNULL)
def stop(): subprocess.run(['{moneta}', 'stop', '--socket', '{s}'], check=True, stdout=subprocess.DEVNULL)
try:
    open('/moneta/a', 'w')
    raise SystemExit('opened without a daemon')
except OSError as e:
    assert e.errno == errno.EIO, e
start()
f = open('/moneta/a', 'w'); f.write('one'); f.flush()
stop(); start()
try:
    f.write('two'); f.flush()
    raise SystemExit('an old file survived the restart')
except OSError as e:
    assert e.errno == errno.EIO, e
open('/moneta/b', 'w').write('new')
print(open('/moneta/b').read())
stop()
"#,
        s = socket.display()
    );
    let o = python_for_daemon_at(&script, &socket);
    let _ = Command::new(moneta)
        .args(["stop", "--socket"])
        .arg(&socket)
        .output();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "new\n");
}

/// Programs the shim cannot reach are refused, not run without it: a statically linked one
/// and a set-user-ID one.
#[test]
fn unreachable_programs_are_refused() {
    let d = Daemon::start("64M");
    let t = TempDir::new("ref");
    let src = t.0.join("hello.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let stat = t.0.join("static-hello");
    cc(&src, &stat, &["-static"]);
    let o = d.run(&[stat.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("statically linked"), "{}", text(&o));
    let suid = t.0.join("suid-hello");
    cc(&src, &suid, &[]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let o = d.run(&[suid.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("set-user-ID"), "{}", text(&o));
    // A script is judged by its interpreter, and runs.
    let script = t.0.join("s.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi > /moneta/s; cat /moneta/s\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = d.run(&[script.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n");
}

/// The working directory: a Moneta one survives `exec` (the shell's children, `make -C`), and
/// nothing that resolves relative paths without the shim (a statically linked program) reaches
/// the host directory the shell started in; `..` leaves the prefix for the host's `/`; paths
/// that reach the prefix from a kernel directory (`cd / && cat moneta/x`, a descriptor of `/`)
/// are Moneta's, so rsync works into `/moneta`.
#[test]
fn working_directory_and_paths_into_the_prefix() {
    let d = Daemon::start("64M");
    let t = TempDir::new("cwd");
    let host = t.0.display().to_string();
    std::fs::write(t.0.join("victim"), "host").unwrap();
    d.sh("mkdir -p /moneta/d && echo m > /moneta/d/victim");
    let out = d.sh(&format!(
        "cd {host} && sh -c 'cd /moneta/d && rm victim; touch new; echo r > rel; /bin/pwd; \
         cat rel'"
    ));
    assert_eq!(out, "/moneta/d\nr\n");
    assert_eq!(std::fs::read_to_string(t.0.join("victim")).unwrap(), "host");
    assert!(!t.0.join("new").exists() && !t.0.join("rel").exists());
    assert_eq!(d.sh("ls /moneta/d"), "new\nrel\n");
    // make -C runs its recipes in the Moneta directory.
    d.sh("printf 'all:\\n\\techo made > out\\n' > /moneta/d/Makefile");
    d.sh(&format!("cd {host} && make -s -C /moneta/d"));
    assert_eq!(d.sh("cat /moneta/d/out"), "made\n");
    assert!(!t.0.join("out").exists());
    // posix_spawn, posix_spawnp (found on PATH, not in the working directory) and system.
    let out = d.sh(&format!(
        "cd {host} && cd /moneta/d && python3 -c \"import os\n\
         os.posix_spawn('/bin/sh', ['sh', '-c', 'pwd; touch s1'], os.environ); os.wait()\n\
         os.posix_spawnp('sh', ['sh', '-c', 'pwd; touch s2'], os.environ); os.wait()\n\
         os.system('pwd; touch s3')\" && ls /moneta/d && rm /moneta/d/s?"
    ));
    assert_eq!(
        out,
        "/moneta/d\n/moneta/d\n/moneta/d\nMakefile\nnew\nout\nrel\ns1\ns2\ns3\n"
    );
    assert!(["s1", "s2", "s3"].iter().all(|f| !t.0.join(f).exists()));
    // A statically linked program started from a Moneta directory cannot see it, and its
    // relative paths fail instead of landing in the host directory.
    let src = t.0.join("create.c");
    std::fs::write(
        &src,
        "#include <fcntl.h>\n#include <errno.h>\n#include <stdio.h>\n\
         int main(void) { int fd = open(\"created\", O_CREAT | O_WRONLY, 0644);\n\
         printf(\"%d %d\\n\", fd, fd < 0 ? errno : 0); return 0; }\n",
    )
    .unwrap();
    let stat = t.0.join("create");
    cc(&src, &stat, &["-static"]);
    let out = d.sh(&format!("cd {host} && cd /moneta/d && {}", stat.display()));
    assert_eq!(out, format!("-1 {}\n", libc::ENOENT));
    assert!(!t.0.join("created").exists());
    // `..` out of the prefix is the host's root, for directories and for names.
    assert_eq!(
        d.sh("cd /moneta/d && cd ../.. && /bin/pwd && ls -d etc"),
        "/\netc\n"
    );
    // `ls -la /moneta` lists the host's `/` as `..`, with its real attributes (not
    // `d?????????`).
    let out = d.sh(
        "ls -la --time-style=+%s /moneta | awk '$NF == \"..\" { print $1, $2, $3, $4, $5, $6 }'; \
         ls -lad --time-style=+%s / | awk '{ print $1, $2, $3, $4, $5, $6 }'",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.len() == 2 && lines[0] == lines[1] && !out.contains('?'),
        "{out}"
    );
    // Relative to a kernel directory, into the prefix; for a prefix of several components
    // too, from above its last one.
    assert_eq!(d.sh("cd / && cat moneta/d/out"), "made\n");
    let nested = t.0.join("mnt/moneta");
    let rel = nested.strip_prefix("/").unwrap().display().to_string();
    let o = d.run_env(
        &["sh", "-c", &format!("cd / && cat {rel}/d/out")],
        None,
        &[("MONETA_MOUNT", nested.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "made\n");
    let out = d.sh("python3 -c \"import os; fd = os.open('/', os.O_PATH); \
         print(os.stat('moneta/d/out', dir_fd=fd).st_size)\"");
    assert_eq!(out, "5\n");
    // rsync into and out of /moneta.
    need("rsync");
    std::fs::create_dir_all(t.0.join("src/sub")).unwrap();
    std::fs::write(t.0.join("src/a"), "alpha").unwrap();
    std::fs::write(t.0.join("src/sub/b"), vec![7u8; 300_000]).unwrap();
    d.sh(&format!("rsync -a {host}/src/ /moneta/copy/"));
    d.sh(&format!("rsync -a /moneta/copy/ {host}/back/"));
    assert_eq!(std::fs::read(t.0.join("back/a")).unwrap(), b"alpha");
    assert_eq!(
        std::fs::read(t.0.join("back/sub/b")).unwrap(),
        vec![7u8; 300_000]
    );
}

/// `chdir` into a Moneta directory the caller may not search fails with `EACCES`, as the
/// kernel's does (needs root to run the shell as another user; CI has it).
#[test]
fn chdir_needs_search_permission() {
    assert!(
        rustix::process::geteuid().is_root() || std::env::var("CI").as_deref() != Ok("true"),
        "this test needs root, and CI must run it"
    );
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED chdir_needs_search_permission: needs root");
        return;
    }
    let d = Daemon::start_with("64M", &["--socket-mode", "666"]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.sh("mkdir -m 700 /moneta/private && mkdir -m 755 /moneta/open && chmod 755 /moneta");
    // The library where the other user can load it.
    let t = TempDir::new("perm");
    std::fs::set_permissions(&t.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lib = t.0.join("libmoneta.so");
    std::fs::copy(library(), &lib).unwrap();
    let src = t.0.join("cd.c");
    std::fs::write(
        &src,
        "#include <errno.h>\n#include <stdio.h>\n#include <unistd.h>\n\
         int main(int c, char **v) { char b[256];\n\
         for (int i = 1; i < c; i++) { if (chdir(v[i])) { printf(\"%s %d\\n\", v[i], errno); }\n\
         else { printf(\"%s\\n\", getcwd(b, sizeof b)); } } return 0; }\n",
    )
    .unwrap();
    let exe = t.0.join("cd");
    cc(&src, &exe, &[]);
    let o = Command::new("setpriv")
        .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
        .arg(&exe)
        .args(["/moneta/open", "/moneta/private"])
        .env("LD_PRELOAD", &lib)
        .env("MONETA_SOCKET", &d.socket)
        .current_dir("/")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        out,
        format!("/moneta/open\n/moneta/private {}\n", libc::EACCES),
        "{err}"
    );
}

/// Temporary files under the prefix: `mkstemp` and its family are the C library's own calls
/// of its internal `open`, out of the hooks' reach, so the shim makes them itself: `sort -T`,
/// `ar` and `mktemp` work in `/moneta`.
#[test]
fn temporary_files_under_the_prefix() {
    // Many small files: a small allocation unit.
    let d = Daemon::start_with("256M", &["--chunk-size", "64K"]);
    let t = TempDir::new("tmp");
    // A C program: mkstemp, mkostemps with a suffix, mkdtemp, and a malformed template.
    let src = t.0.join("tmp.c");
    std::fs::write(
        &src,
        r#"#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
int main(void) {
    char a[] = "/moneta/t/aXXXXXX", b[] = "/moneta/t/bXXXXXX.txt", c[] = "/moneta/t/dXXXXXX";
    char bad[] = "/moneta/t/nope";
    int fa = mkstemp(a), fb = mkostemps(b, 4, O_CLOEXEC);
    if (fa < 0 || fb < 0) { perror("mkstemp"); return 1; }
    if (write(fa, "hello", 5) != 5) return 2;
    struct stat st;
    if (fstat(fa, &st) || (st.st_mode & 0777) != 0600) return 3;
    if (strncmp(a, "/moneta/t/a", 11) || strstr(a, "XXXXXX") || strcmp(b + strlen(b) - 4, ".txt")) return 4;
    if (!(fcntl(fb, F_GETFD) & FD_CLOEXEC)) return 5;
    char *dir = mkdtemp(c);
    if (!dir || stat(dir, &st) || !S_ISDIR(st.st_mode) || (st.st_mode & 0777) != 0700) return 6;
    errno = 0;
    if (mkstemp(bad) != -1 || errno != EINVAL) return 7;
    printf("%s\n", a);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = t.0.join("tmp");
    cc(&src, &exe, &[]);
    d.sh("mkdir -p /moneta/t");
    let o = d.run(&[exe.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", text(&o));
    let name = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert_eq!(d.sh(&format!("cat {name}")), "hello");
    // sort spilling to temporary files under /moneta.
    let lines: String = (0..20_000).rev().map(|i| format!("{i:06}\n")).collect();
    std::fs::write(t.0.join("in"), &lines).unwrap();
    let host = t.0.display();
    let out = d.sh(&format!(
        "mkdir -p /moneta/sorttmp && sort -S 4K -T /moneta/sorttmp {host}/in | head -2; \
         ls /moneta/sorttmp | wc -l"
    ));
    assert_eq!(out, "000000\n000001\n0\n");
    // ar writes its archive through a temporary file beside it; mktemp makes files and
    // directories there.
    std::fs::write(t.0.join("one.txt"), "one").unwrap();
    let out = d.sh(&format!(
        "cd {host} && ar rc /moneta/t/lib.a one.txt && ar t /moneta/t/lib.a && \
         f=$(mktemp -p /moneta/t) && echo x > $f && cat $f && \
         dd=$(mktemp -d -p /moneta/t) && test -d $dd && echo dir"
    ));
    assert_eq!(out, "one.txt\nx\ndir\n");
}

/// Programs that are Moneta files run: an ELF executable copied into `/moneta` (from a path,
/// relative to a Moneta working directory, found on `PATH`), a `#!` script that sees its own
/// path, with the checks of `exec` (execute permission; set-user-ID ignored); and a statically
/// linked program started on Moneta paths says why it will not find them.
#[test]
fn programs_on_moneta_run() {
    let d = Daemon::start("256M");
    let t = TempDir::new("exec");
    let src = t.0.join("prog.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char buf[64] = {0};
    FILE *f = fopen("data", "r");
    if (f) { fgets(buf, sizeof buf, f); fclose(f); }
    printf("%s %d %s euid=%d\n", argc > 1 ? argv[1] : "-", argc, buf, (int)geteuid());
    return 0;
}
"#,
    )
    .unwrap();
    let exe = t.0.join("prog");
    cc(&src, &exe, &[]);
    let host = t.0.display();
    d.sh(&format!(
        "mkdir -p /moneta/w3 && cp {host}/prog /moneta/w3/prog && chmod 755 /moneta/w3/prog && \
         printf data > /moneta/w3/data"
    ));
    let me = rustix::process::geteuid().as_raw();
    assert_eq!(
        d.sh("cd /moneta/w3 && /moneta/w3/prog a && ./prog b c && PATH=/moneta/w3:$PATH prog d"),
        format!("a 2 data euid={me}\nb 3 data euid={me}\nd 2 data euid={me}\n")
    );
    // Through execvp and posix_spawnp with a path (env, python's subprocess), and found on
    // PATH by them.
    assert_eq!(
        d.sh("cd /moneta/w3 && env /moneta/w3/prog e && env ./prog f && \
             PATH=/moneta/w3:$PATH env prog g && python3 -c \
             'import os; os.posix_spawnp(\"./prog\", [\"./prog\", \"h\"], os.environ); os.wait()'"),
        format!("e 2 data euid={me}\nf 2 data euid={me}\ng 2 data euid={me}\nh 2 data euid={me}\n")
    );
    // Set-user-ID is ignored (as on a nosuid mount); no execute bit is EACCES.
    d.sh("chmod 4755 /moneta/w3/prog");
    assert!(d
        .sh("cd /moneta/w3 && ./prog x")
        .ends_with(&format!("euid={me}\n")));
    d.sh("chmod 644 /moneta/w3/prog");
    let o = d.run(&["sh", "-c", "/moneta/w3/prog"], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("Permission denied"), "{}", text(&o));
    // A script runs its interpreter with its own path, which the interpreter opens itself.
    d.sh(
        "printf '#!/bin/sh\\necho \"$0 $1\"; cat data\\n' > /moneta/w3/s.sh && \
         chmod 755 /moneta/w3/s.sh",
    );
    assert_eq!(d.sh("cd /moneta/w3 && ./s.sh hi"), "./s.sh hi\ndata");
    assert_eq!(
        d.sh("cd /moneta/w3 && /moneta/w3/s.sh there"),
        "/moneta/w3/s.sh there\ndata"
    );
    // A statically linked program cannot see /moneta: run on a Moneta path, it is told why.
    let ssrc = t.0.join("st.c");
    std::fs::write(
        &ssrc,
        "#include <stdio.h>\nint main(int c, char **v) { return c > 1 && fopen(v[1], \"r\") ? 0 : 3; }\n",
    )
    .unwrap();
    let st = t.0.join("st");
    cc(&ssrc, &st, &["-static"]);
    let o = d.run(
        &["sh", "-c", &format!("{} /moneta/w3/data", st.display())],
        None,
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("statically linked"), "{}", text(&o));
}

/// busybox (statically linked: `scripts/test.sh` installs busybox-static) cannot see
/// `/moneta`. `moneta run busybox` refuses it; started on Moneta paths from a program under
/// the shim (a shell, `env` and `xargs`, which search `PATH` through the C library, or as a
/// shell whose command names them), it is told why once instead of a bare "No such file or
/// directory"; started without Moneta paths, nothing is said.
#[test]
fn static_busybox_is_told_why() {
    need("busybox");
    let d = Daemon::start("64M");
    let o = d.run(&["busybox", "true"], None);
    assert!(
        !o.status.success() && text(&o).contains("statically linked"),
        "the test needs a statically linked busybox (busybox-static): {}",
        text(&o)
    );
    d.sh("echo x > /moneta/f");
    for script in [
        "busybox cat /moneta/f",
        "env busybox cat /moneta/f",
        "echo /moneta/f | xargs busybox cat",
        "busybox sh -c 'cat /moneta/f'",
        "busybox dd if=/moneta/f of=/dev/null",
        "cd /moneta && busybox cat f",
    ] {
        let o = d.run(&["sh", "-c", script], None);
        assert!(!o.status.success(), "{script}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.matches("busybox is statically linked").count(),
            1,
            "{script}: {err}"
        );
        assert!(
            err.contains("files under /moneta will not be found by it"),
            "{script}: {err}"
        );
    }
    let o = d.run(
        &["sh", "-c", "busybox ls / >/dev/null; env busybox true"],
        None,
    );
    assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));
}
