//! `moneta export`: a file of nvfs served over NBD (nbdkit with the `moneta-nbd` plugin) and
//! checked with standard clients: `nbdinfo`, `nbdcopy` both ways (several connections),
//! `qemu-img convert` and `info`, `qemu-io` writes with FUA and a flush, fio's `nbd` engine
//! with CRC32C verification; writes through the export are what channel clients read and the
//! other way round; a read-only export refuses writes; and as another user, the export's
//! rights are that user's (read-only on a file it may only read, refused on one it may not).
//!
//! The tools come from the distribution (`scripts/test.sh` installs nbdkit, libnbd-bin and
//! qemu-utils); a missing one fails the test.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{built, pattern, text};
use libmoneta::{Moneta, OpenOptions};

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (scripts/test.sh installs it): {e}"))
}

fn run_ok(cmd: &str, args: &[&str]) -> Output {
    let o = run(cmd, args);
    assert!(o.status.success(), "{cmd} {args:?}: {}", text(&o));
    o
}

/// A daemon of the test's own on a volatile array, other users allowed to connect; the
/// exports it starts are killed at the end.
struct Setup {
    dir: PathBuf,
    socket: PathBuf,
    pids: Vec<i32>,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        Self::with(tag, &[])
    }

    /// With further monetad options.
    fn with(tag: &str, monetad: &[&str]) -> Setup {
        let _ = built("libmoneta_nbd.so");
        let dir = std::env::temp_dir().join(format!("moneta-export-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        // Searchable by the other user; its exports' sockets go to a directory it may write.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let nbd = dir.join("nbd");
        std::fs::create_dir(&nbd).unwrap();
        std::fs::set_permissions(&nbd, std::fs::Permissions::from_mode(0o777)).unwrap();
        let socket = dir.join("monetad.sock");
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .args(["start", "--volatile", "--size", "256M", "--socket"])
            .arg(&socket)
            .args(["--", "--socket-mode", "666"])
            .args(monetad)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
        Setup {
            dir,
            socket,
            pids: Vec::new(),
        }
    }

    fn moneta(&self) -> Moneta {
        Moneta::connect(&self.socket).unwrap()
    }

    /// Starts `moneta export` on a Unix socket of the test's directory (as user `uid` if
    /// given); returns the export's URI. `file` empty: none (a `--range` in `extra`).
    fn export(&mut self, name: &str, file: &str, extra: &[&str], uid: Option<u32>) -> String {
        let sock = self.dir.join("nbd").join(format!("{name}.sock"));
        let pid = self.dir.join("nbd").join(format!("{name}.pid"));
        let mut c = match uid {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={u}"))
                    .arg(format!("--regid={u}"))
                    .arg("--clear-groups")
                    .arg(env!("CARGO_BIN_EXE_moneta"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_moneta")),
        };
        let o = c
            .arg("export")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--unix")
            .arg(&sock)
            .arg("--pidfile")
            .arg(&pid)
            .args(extra)
            .args((!file.is_empty()).then_some(file))
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta export: {}", text(&o));
        let p: i32 = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        self.pids.push(p);
        let uri = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert_eq!(uri, format!("nbd+unix:///?socket={}", sock.display()));
        uri
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for &p in &self.pids {
            // SAFETY: a plain system call.
            unsafe { libc::kill(p, libc::SIGTERM) };
        }
        let _ = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("stop")
            .arg("--socket")
            .arg(&self.socket)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nvfs_file(m: &Moneta, path: &str, data: &[u8], mode: u32) {
    let f = m
        .open(
            path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(mode),
        )
        .unwrap();
    f.write_at(data, 0).unwrap();
    f.sync_all().unwrap();
}

fn nvfs_read(m: &Moneta, path: &str, len: usize) -> Vec<u8> {
    let f = m.open(path, OpenOptions::new().read(true)).unwrap();
    let mut b = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut b[done..], done as u64).unwrap();
        assert!(n > 0, "short file");
        done += n;
    }
    b
}

#[test]
fn standard_clients_read_and_write_an_export() {
    let mut s = Setup::new("clients");
    let m = s.moneta();
    let len = 16 << 20;
    nvfs_file(&m, "/disk", &pattern(1, len), 0o644);
    let uri = s.export("disk", "/disk", &[], None);
    let dir = s.dir.clone();
    let p = |n: &str| dir.join(n).to_str().unwrap().to_string();

    let o = run_ok("nbdinfo", &[&uri]);
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(info.contains(&format!("export-size: {len}")), "{info}");
    for want in [
        "is_read_only: false",
        "can_flush: true",
        "can_fua: true",
        "can_multi_conn: true",
        "can_cache: true",
    ] {
        assert!(info.contains(want), "{want}: {info}");
    }

    // nbdcopy into the export (several connections), then the channel reads it.
    let data = pattern(2, len);
    std::fs::write(p("in.img"), &data).unwrap();
    run_ok("nbdcopy", &["--connections=4", &p("in.img"), &uri]);
    assert!(
        nvfs_read(&m, "/disk", len) == data,
        "a channel reads other bytes"
    );
    // A channel writes, the export reads.
    let patch = pattern(3, 300_001);
    let f = m.open("/disk", OpenOptions::new().write(true)).unwrap();
    f.write_at(&patch, 1_000_003).unwrap();
    drop(f);
    let mut expect = data.clone();
    expect[1_000_003..1_000_003 + patch.len()].copy_from_slice(&patch);
    run_ok("nbdcopy", &[&uri, &p("out.img")]);
    assert!(
        std::fs::read(p("out.img")).unwrap() == expect,
        "nbdcopy read other bytes"
    );

    // qemu-img.
    run_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, &p("q.img")],
    );
    assert!(
        std::fs::read(p("q.img")).unwrap() == expect,
        "qemu-img read other bytes"
    );
    let o = run_ok("qemu-img", &["info", "--output=json", &uri]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("\"virtual-size\": {len}")));

    // qemu-io: a write with FUA, a plain write, a flush; the channel sees them.
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -f -P 0x5a 4096 8192",
            "-c",
            "write -P 0xa5 65536 4096",
            "-c",
            "flush",
            &uri,
        ],
    );
    let got = nvfs_read(&m, "/disk", 70_000);
    assert!(got[4096..12288].iter().all(|&b| b == 0x5a));
    assert!(got[65536..69632].iter().all(|&b| b == 0xa5));

    // fio's nbd engine, random reads and writes with verification.
    let o = run_ok("fio", &["--enghelp"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nbd"),
        "this fio has no nbd engine"
    );
    let o = run_ok(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randrw",
            "--bs=4k",
            "--size=8M",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            &format!("--directory={}", dir.display()),
        ],
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("err= 0"),
        "{}",
        text(&o)
    );

    // A read-only export refuses writes.
    let ro = s.export("ro", "/disk", &["--readonly"], None);
    let o = run_ok("nbdinfo", &[&ro]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("is_read_only: true"));
    let o = run("nbdcopy", &[&p("in.img"), &ro]);
    assert!(!o.status.success(), "a read-only export took a write");
}

#[test]
fn an_exports_rights_are_its_users() {
    let mut s = Setup::new("rights");
    // Another user's exports need root to become that user.
    if !rustix::process::geteuid().is_root() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "this test needs root, and CI must run it"
        );
        eprintln!("SKIPPED: exporting as another user needs root");
        return;
    }
    let m = s.moneta();
    nvfs_file(&m, "/shared", &pattern(5, 1 << 20), 0o644);
    nvfs_file(&m, "/private", &pattern(6, 1 << 20), 0o600);
    // Another user may read /shared but not write it: its export is read-only.
    let uri = s.export("shared", "/shared", &[], Some(1001));
    let o = run_ok("nbdinfo", &[&uri]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("is_read_only: true"),
        "{}",
        text(&o)
    );
    let out = s.dir.join("shared.img");
    run_ok("nbdcopy", &[&uri, out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == pattern(5, 1 << 20));
    // It may not read /private: no export.
    let o = Command::new("setpriv")
        .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_moneta"))
        .arg("export")
        .arg("--socket")
        .arg(&s.socket)
        .arg("--unix")
        .arg(s.dir.join("nbd").join("private.sock"))
        .arg("/private")
        .output()
        .unwrap();
    assert!(!o.status.success(), "exported a file the user may not read");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("permission denied"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_exports_say_why() {
    let s = Setup::new("bad");
    let m = s.moneta();
    m.mkdir("/dir", 0o755).unwrap();
    for (file, why) in [
        ("/missing", "no such file"),
        ("/dir", "not a regular file"),
        ("relative", "starting with /"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("export")
            .arg("--socket")
            .arg(&s.socket)
            .arg("--unix")
            .arg(s.dir.join("x.nbd"))
            .arg(file)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{file}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{file}: {err}");
    }
}

/// A raw daemon's array, or a range of it, exported by its own user: two exports of
/// overlapping ranges see the same bytes at the right places; a daemon with a file system
/// refuses a range.
#[test]
fn ranges_of_a_raw_array() {
    let mut s = Setup::with("raw", &["--raw"]);
    let whole = s.export("whole", "", &["--range", "0:0"], None);
    let o = run_ok("nbdinfo", &["--size", &whole]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (256u64 << 20).to_string()
    );
    let part = s.export("part", "", &["--range", "1M:2M"], None);
    let o = run_ok("nbdinfo", &["--size", &part]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (2u64 << 20).to_string()
    );
    let p = |n: &str| s.dir.join(n).to_str().unwrap().to_string();
    let data = pattern(9, 2 << 20);
    std::fs::write(p("part.in"), &data).unwrap();
    run_ok("nbdcopy", &[&p("part.in"), &part]);
    run_ok("nbdcopy", &[&whole, &p("whole.out")]);
    let all = std::fs::read(p("whole.out")).unwrap();
    assert!(
        all[1 << 20..3 << 20] == data[..],
        "the range landed elsewhere"
    );
    // Past the range, nothing: it is only the range's.
    assert!(all[3 << 20..4 << 20].iter().all(|&b| b == 0));

    let nvfs = Setup::new("raw-nvfs");
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .arg("export")
        .arg("--socket")
        .arg(&nvfs.socket)
        .arg("--unix")
        .arg(nvfs.dir.join("nbd").join("x.sock"))
        .args(["--range", "0:1M"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("serves a file system"),
        "{}",
        text(&o)
    );
}
