//! The applications benchmark's pieces against real programs and a real daemon:
//!
//! - `examples/apps/bdb_bench.c` built with the documented command, run on tmpfs and under
//!   `moneta run` on `/moneta`, each database checked by the program's `--verify` pass, and
//!   each one verified again after copying it to the other side (the bytes on nvfs are a valid
//!   Berkeley DB environment for the kernel's file system, and the other way round);
//! - the kernel block path (`src/loopfs.rs`): ext4 and XFS on a loop device over a tmpfs file,
//!   `O_DIRECT` with aligned buffers, and nothing left behind after the drop (needs root; the
//!   test says so and passes without it);
//! - the whole benchmark (`src/apps.rs`) in its quick configuration against a private daemon.
//!
//! `loopfs.rs` and `apps.rs` are modules of the `moneta` binary; they use nothing of it but each
//! other, so they are compiled into this test as well (`#[path]`), and their unit tests run here.
//!
//! Needs a C compiler, libdb-dev, sqlite3, fio and (for XFS) xfsprogs: `scripts/test.sh`
//! installs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../src/loopfs.rs"]
mod loopfs; // `#![allow(dead_code)]` inside: its API is wider than these tests

#[allow(dead_code)]
#[path = "../src/apps.rs"]
mod apps;

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

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u64::from_le_bytes(b)
}

/// A directory removed at the end, under `base`.
struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &Path, tag: &str) -> TempDir {
        let d = base.join(format!(
            "moneta-apps-{tag}-{}-{:x}",
            std::process::id(),
            rand_u64()
        ));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A daemon of the test's own on a volatile array, stopped at the end.
struct Daemon {
    _dir: TempDir,
    socket: PathBuf,
}

impl Daemon {
    fn start(size: &str) -> Daemon {
        let dir = TempDir::new(&std::env::temp_dir(), "d");
        let socket = dir.0.join("monetad.sock");
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .args(["start", "--volatile", "--size", size, "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
        Daemon { _dir: dir, socket }
    }

    /// `moneta run -- args...` with this daemon.
    fn run(&self, args: &[&str]) -> Output {
        let _ = library();
        let child = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("run")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--no-start")
            .arg("--")
            .args(args)
            .env_remove("MONETA_MOUNT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_limit(child, Duration::from_secs(300))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("stop")
            .arg("--socket")
            .arg(&self.socket)
            .output();
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

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/apps/bdb_bench.c")
}

/// Builds bdb_bench.c exactly as its header says (warnings are errors).
fn build_bdb(dir: &Path) -> PathBuf {
    let exe = dir.join("bdb_bench");
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(source())
        .arg("-ldb")
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc bdb_bench.c (libdb-dev installed?): {}",
        text(&o)
    );
    exe
}

/// The JSON line a run printed.
fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", text(o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or_else(|| panic!("{}", text(o)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// A run's line is well formed; its update count.
fn check_run(v: &serde_json::Value, kind: &str, ops: u64) -> u64 {
    assert_eq!(v["workload"], format!("bdb-{kind}"), "{v}");
    assert_eq!(v["ops"].as_u64(), Some(ops), "{v}");
    let seconds = v["seconds"].as_f64().unwrap();
    let rate = v["ops_per_s"].as_f64().unwrap();
    assert!(seconds > 0.0 && rate > 0.0, "{v}");
    assert!((rate * seconds / ops as f64 - 1.0).abs() < 0.01, "{v}");
    assert!(v["p50_us"].as_f64().unwrap() > 0.0, "{v}");
    ops
}

fn check_verify(v: &serde_json::Value, kind: &str, records: u64, updates: u64) {
    assert_eq!(v["workload"], format!("bdb-{kind}"), "{v}");
    assert_eq!(v["verify"], "ok", "{v}");
    assert_eq!(v["records"].as_u64(), Some(records), "{v}");
    assert_eq!(v["updates"].as_u64(), Some(updates), "{v}");
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

fn native(exe: &Path, args: &[&str]) -> Output {
    let child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_limit(child, Duration::from_secs(300))
}

/// bdb_bench on tmpfs and on Moneta, both kinds, each database verified where it was made and
/// again after a copy to the other side.
#[test]
fn bdb_bench_on_tmpfs_and_on_moneta() {
    let build = TempDir::new(&std::env::temp_dir(), "build");
    let exe = build_bdb(&build.0);
    let exe_s = exe.to_str().unwrap();
    let shm = TempDir::new(Path::new("/dev/shm"), "bdb");
    let d = Daemon::start("256M");
    let records = 4000u64;
    let ops = 3000u64;
    let (r, n) = (records.to_string(), ops.to_string());
    for kind in ["btree", "hash"] {
        let run = |dir: &str| -> Vec<String> {
            [
                "--kind",
                kind,
                "--records",
                &r,
                "--ops",
                &n,
                "--seed",
                "7",
                dir,
            ]
            .map(String::from)
            .to_vec()
        };
        let verify = |dir: &str| -> Vec<String> {
            ["--verify", "--kind", kind, "--records", &r, dir]
                .map(String::from)
                .to_vec()
        };

        // The kernel on tmpfs.
        let kdir = shm.0.join(kind);
        let kdir = kdir.to_str().unwrap();
        let v = json(&native(&exe, &strs(&run(kdir))));
        let updates = check_run(&v, kind, ops);
        check_verify(
            &json(&native(&exe, &strs(&verify(kdir)))),
            kind,
            records,
            updates,
        );

        // Moneta, through the shim.
        let mdir = format!("/moneta/bdb-{kind}");
        let mut args = vec![exe_s];
        let a = run(&mdir);
        args.extend(strs(&a));
        let v = json(&d.run(&args));
        let updates = check_run(&v, kind, ops);
        let mut args = vec![exe_s];
        let a = verify(&mdir);
        args.extend(strs(&a));
        check_verify(&json(&d.run(&args)), kind, records, updates);

        // Moneta's files on the kernel's file system, and the kernel's on Moneta.
        let copied = shm.0.join(format!("{kind}-from-moneta"));
        let copied = copied.to_str().unwrap();
        let o = d.run(&["cp", "-r", &mdir, copied]);
        assert!(o.status.success(), "{}", text(&o));
        check_verify(
            &json(&native(&exe, &strs(&verify(copied)))),
            kind,
            records,
            updates,
        );
        let back = format!("/moneta/{kind}-from-tmpfs");
        let o = d.run(&["cp", "-r", kdir, &back]);
        assert!(o.status.success(), "{}", text(&o));
        let mut args = vec![exe_s];
        let a = verify(&back);
        args.extend(strs(&a));
        check_verify(&json(&d.run(&args)), kind, records, ops);
    }
}

/// Bad arguments and a database that exists already are refused with a message and a
/// non-zero status.
#[test]
fn bdb_bench_refuses_bad_use() {
    let build = TempDir::new(&std::env::temp_dir(), "build");
    let exe = build_bdb(&build.0);
    let shm = TempDir::new(Path::new("/dev/shm"), "bad");
    let dir = shm.0.join("db");
    let dir = dir.to_str().unwrap();
    for args in [
        vec!["--kind", "queue", dir],
        vec!["--records", "12x", dir],
        vec!["--ops", "5", "--seconds", "1", dir],
        vec![],
    ] {
        let o = native(&exe, &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("usage") || err.contains("bad number"), "{err}");
    }
    let o = native(&exe, &["--records", "100", "--ops", "10", dir]);
    assert!(o.status.success(), "{}", text(&o));
    let o = native(&exe, &["--records", "100", "--ops", "10", dir]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("exists already"),
        "{}",
        text(&o)
    );
    // Verifying with the wrong record count finds the difference.
    let o = native(&exe, &["--verify", "--records", "101", dir]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
}

/// The mount table's file system type at `dir`, if something is mounted there.
fn mounted_type(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_str().unwrap();
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-")?;
        (f[4] == dir).then(|| f[dash + 1].to_string())
    })
}

fn losetup_list() -> String {
    let o = Command::new("losetup").arg("-a").output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// ext4 and XFS on a loop device: mounted, `O_DIRECT` works with aligned buffers and refuses
/// unaligned ones, and the drop leaves no mount, loop device, file or directory behind.
#[test]
fn loop_file_systems_with_o_direct() {
    use std::os::unix::fs::FileExt;
    if !is_root() {
        eprintln!("loop_file_systems_with_o_direct: not root, nothing to test");
        let e = loopfs::LoopFs::create(loopfs::FsKind::Ext4, 64 << 20).unwrap_err();
        assert!(e.contains("root"), "{e}");
        return;
    }
    for (kind, size) in [
        (loopfs::FsKind::Ext4, 64u64 << 20),
        (loopfs::FsKind::Xfs, 320 << 20),
    ] {
        if kind == loopfs::FsKind::Xfs {
            if let Err(e) = kind.available() {
                // scripts/test.sh installs xfsprogs; without it the reason must name it.
                assert!(e.contains("xfsprogs"), "{e}");
                eprintln!("loop_file_systems_with_o_direct: {e}");
                continue;
            }
        }
        let fs = loopfs::LoopFs::create(kind, size).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(fs.kind, kind);
        assert_eq!(mounted_type(&fs.mount).as_deref(), Some(kind.name()));
        assert!(fs.backing.starts_with("/dev/shm"));
        assert!(losetup_list().contains(fs.backing.to_str().unwrap()));
        assert!(fs.loop_direct_io, "the loop device should do direct I/O");

        let path = fs.mount.join("data");
        let f = loopfs::open_direct(&path, true).unwrap();
        let mut w = loopfs::aligned_buffer(1 << 16);
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i * 7 + i / 4096) as u8;
        }
        f.write_all_at(&w, 4096).unwrap();
        let mut r = loopfs::aligned_buffer(1 << 16);
        f.read_exact_at(&mut r, 4096).unwrap();
        assert_eq!(&r[..], &w[..]);
        // O_DIRECT is really on: a buffer off the alignment is refused.
        let mut big = loopfs::aligned_buffer(8192 + 512);
        let e = f.read_at(&mut big[1..4097], 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        drop(f);

        let (mount, backing, device) = (fs.mount.clone(), fs.backing.clone(), fs.device.clone());
        fs.destroy().unwrap();
        assert_eq!(mounted_type(&mount), None);
        assert!(!mount.exists(), "{} left behind", mount.display());
        assert!(!backing.exists(), "{} left behind", backing.display());
        let list = losetup_list();
        assert!(
            !list.contains(backing.to_str().unwrap()),
            "{} still attached: {list}",
            device.display()
        );
    }
    // A size under the file system's minimum is refused before anything is made.
    let e = loopfs::LoopFs::create(loopfs::FsKind::Xfs, 64 << 20).unwrap_err();
    assert!(e.contains("at least") || e.contains("xfsprogs"), "{e}");
}

/// The whole applications benchmark in its quick configuration: a record for every workload
/// on every target, the measured ones with work done, the loop targets measured as root.
#[test]
fn applications_benchmark_quick() {
    let _ = library();
    let d = Daemon::start("256M");
    let work = TempDir::new(&std::env::temp_dir(), "work");
    let opts = apps::AppOptions {
        quick: true,
        moneta_socket: d.socket.clone(),
        moneta_bin: PathBuf::from(env!("CARGO_BIN_EXE_moneta")),
        work: work.0.clone(),
    };
    let t = Instant::now();
    let records = apps::run(&opts).unwrap_or_else(|e| panic!("apps::run: {e}"));
    let took = t.elapsed();
    for r in &records {
        eprintln!(
            "{:<18} {:<20} {:>10.0} ops/s  p50 {:>8} µs  {}",
            r.workload,
            r.target,
            r.ops_per_s,
            r.p50_us.map(|p| format!("{p:.1}")).unwrap_or_default(),
            r.skipped().unwrap_or("")
        );
    }
    for (w, target, s) in apps::speedups(&records) {
        eprintln!("speedup {w:<18} moneta over {target:<20} {s:.2}x");
    }
    eprintln!("quick configuration: {:.1} s", took.as_secs_f64());

    assert_eq!(records.len(), apps::WORKLOADS.len() * 4);
    for w in apps::WORKLOADS {
        for target in [
            "moneta",
            "kernel-tmpfs",
            "kernel-ext4-odirect",
            "kernel-xfs-odirect",
        ] {
            let r = records
                .iter()
                .find(|r| r.workload == w && r.target == target)
                .unwrap_or_else(|| panic!("no record for {w} on {target}"));
            let must_run = matches!(target, "moneta" | "kernel-tmpfs")
                || (target == "kernel-ext4-odirect" && is_root());
            if must_run {
                assert!(r.skipped().is_none(), "{w} on {target}: {:?}", r.skipped());
            }
            if r.skipped().is_none() {
                assert!(r.ops > 0 && r.seconds > 0.0 && r.ops_per_s > 0.0, "{r:?}");
                assert!(r.detail["command"].is_string(), "{r:?}");
                let o_direct = r.detail["o_direct"].as_bool().unwrap();
                assert_eq!(
                    o_direct,
                    w.starts_with("fio") && target.ends_with("odirect"),
                    "{r:?}"
                );
            } else {
                assert_eq!(r.ops, 0);
            }
            if w.starts_with("fio") && r.skipped().is_none() {
                assert!(r.p50_us.unwrap() > 0.0, "{r:?}");
                // Two rounds, the record the lower of them.
                let rounds: Vec<f64> = r.detail["rounds_ops_per_s"]
                    .as_array()
                    .unwrap_or_else(|| panic!("no rounds: {r:?}"))
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                assert_eq!(rounds.len(), 2, "{r:?}");
                assert_eq!(r.ops_per_s, rounds[0].min(rounds[1]), "{r:?}");
            }
        }
    }
    let s = apps::speedups(&records);
    assert!(s.len() >= apps::WORKLOADS.len(), "{s:?}");
    assert!(s.iter().all(|(_, _, x)| x.is_finite() && *x > 0.0));
    serde_json::to_string(&records).unwrap();
    // Well under a minute on the project's machines (release build); a debug build is
    // slower, so this only catches a configuration that grew by an order of magnitude.
    assert!(took < Duration::from_secs(240), "took {took:?}");
}
