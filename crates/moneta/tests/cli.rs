//! The `moneta` command as a user runs it: a real daemon started and stopped, a real bench.

use std::path::PathBuf;
use std::process::{Command, Output};

fn moneta(args: &[&str], env: &[(&str, &PathBuf)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moneta"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run moneta")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("moneta-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

#[test]
fn start_status_stop_on_the_default_paths() {
    let dir = tempdir("life");
    let runtime = dir.0.join("run");
    let data = dir.0.join("data");
    let env = [("XDG_RUNTIME_DIR", &runtime), ("XDG_DATA_HOME", &data)];
    let o = moneta(&["start", "--size", "64M"], &env);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("monetad started"));
    let socket = runtime.join("moneta/monetad.sock");
    assert!(socket.exists());
    assert!(
        data.join("moneta/device.img").exists(),
        "default device file"
    );
    let o = moneta(&["start"], &env);
    assert!(!o.status.success());
    assert!(text(&o).contains("already running"), "{}", text(&o));
    let o = moneta(&["status", "--json"], &env);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["array_size"], 64 << 20);
    assert_eq!(v["persistent"], 1);
    assert_eq!(v["channels_max"], 1024);
    assert_eq!(v["table_capacity"], 16384);
    let o = moneta(&["status"], &env);
    assert!(text(&o).contains("channels open"));
    // A reader gone before the output (`moneta status | head`) ends it quietly.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .arg("status")
        .envs(env)
        .stdout(writer)
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{}", text(&o));
    assert!(o.stderr.is_empty(), "{}", text(&o));
    // The daemon's log is plain text (no terminal colour codes in a file).
    let log = std::fs::read_to_string(runtime.join("moneta/monetad.log")).unwrap();
    assert!(
        log.contains("monetad ready") && !log.contains('\x1b'),
        "{log:?}"
    );
    let o = moneta(&["stop"], &env);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!socket.exists());
    let o = moneta(&["status"], &env);
    assert!(!o.status.success());
    assert!(text(&o).contains("not running"), "{}", text(&o));
}

#[test]
fn bench_emits_well_formed_records_in_a_tiny_configuration() {
    let dir = tempdir("bench");
    let target = dir.0.join("kernel.dat");
    let t = target.display().to_string();
    let o = moneta(
        &[
            "bench",
            "--path",
            "moneta",
            "--path",
            "moneta-raw",
            "--path",
            "kernel-psync",
            "--path",
            "kernel-uring",
            "--path",
            "kernel-uring-sqpoll",
            "--path",
            "perm-check",
            "--size",
            "512,4K",
            "--threads",
            "2",
            "--duration",
            "0.2",
            "--warmup",
            "0.05",
            "--runs",
            "2",
            "--records",
            "100",
            "--region",
            "4M",
            "--target",
            &t,
            "--json",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 5 * 2 + 1);
    for r in &recs {
        for k in [
            "path", "op", "size", "qd", "threads", "ops", "seconds", "iops", "mib_s", "lat_ns",
            "cpu",
        ] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        let lat = &r["lat_ns"];
        let (p50, p99, max) = (
            lat["p50"].as_u64().unwrap(),
            lat["p99"].as_u64().unwrap(),
            lat["max"].as_u64().unwrap(),
        );
        assert!(p50 > 0 && p50 <= p99 && p99 <= max, "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0);
        let iops = r["iops"].as_f64().unwrap();
        if r["path"] != "perm-check" {
            let ops = r["ops"].as_f64().unwrap();
            let secs = r["seconds"].as_f64().unwrap();
            assert!((iops - ops / secs).abs() < 1e-6 * iops.max(1.0));
            let size = r["size"].as_f64().unwrap();
            let mib = r["mib_s"].as_f64().unwrap();
            assert!((mib - iops * size / 1048576.0).abs() < 1e-6 * mib.max(1.0));
            assert_eq!(r["threads"], 2);
        }
    }
    for p in ["moneta", "moneta-raw"] {
        assert!(recs
            .iter()
            .any(|r| r["path"] == p && r["device_cpu"].is_object()));
    }
    for p in ["moneta", "kernel-uring", "kernel-uring-sqpoll"] {
        assert_eq!(recs.iter().filter(|r| r["path"] == p).count(), 2, "{p}");
    }
    assert!(recs
        .iter()
        .any(|r| r["path"] == "perm-check" && r["records"] == 100));
    assert!(!target.exists() || std::fs::metadata(&target).unwrap().len() == 4 << 20);
}

#[test]
fn bench_runs_every_completion_strategy_with_queue_depth() {
    for c in ["spin", "forward", "sleep"] {
        let o = moneta(
            &[
                "bench",
                "--path",
                "moneta-raw",
                "--op",
                "randrw",
                "--qd",
                "4",
                "--size",
                "4K",
                "--duration",
                "0.1",
                "--warmup",
                "0",
                "--runs",
                "1",
                "--region",
                "1M",
                "--completion",
                c,
                "--json",
            ],
            &[],
        );
        assert!(o.status.success(), "{c}: {}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["completion"], c);
        assert_eq!(r["qd"], 4);
        assert!(r["ops"].as_u64().unwrap() > 0);
    }
}

/// Queue depth through libmoneta's asynchronous API and io_uring, with a fixed number of
/// operations per thread instead of a duration.
#[test]
fn bench_async_paths_with_an_operation_count() {
    let o = moneta(
        &[
            "bench",
            "--path",
            "moneta",
            "--path",
            "kernel-uring",
            "--op",
            "randrw",
            "--qd",
            "8",
            "--threads",
            "2",
            "--size",
            "512,40K",
            "--ops",
            "300",
            "--warmup",
            "0",
            "--runs",
            "1",
            "--region",
            "4M",
            "--json",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let recs: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 4);
    for r in &recs {
        assert_eq!(r["qd"], 8, "{r}");
        // Each thread stops after 300 completions; its last requests in flight still count.
        let ops = r["ops"].as_u64().unwrap();
        assert!((600..=600 + 2 * 8).contains(&ops), "{r}");
    }
}

#[test]
fn bench_refuses_impossible_configurations() {
    for (args, msg) in [
        (
            &["bench", "--path", "moneta-raw", "--qd", "0"][..],
            "positive",
        ),
        (
            &[
                "bench",
                "--path",
                "moneta-raw",
                "--qd",
                "16",
                "--threads",
                "8",
            ][..],
            "64 tags",
        ),
        (
            &["bench", "--path", "kernel-psync", "--qd", "4"][..],
            "synchronous",
        ),
        (
            &[
                "bench",
                "--path",
                "moneta-raw",
                "--size",
                "1M",
                "--region",
                "512K",
            ][..],
            "region",
        ),
    ] {
        let o = moneta(args, &[]);
        assert!(!o.status.success());
        assert!(text(&o).contains(msg), "{args:?}: {}", text(&o));
    }
}

#[test]
fn mkfs_and_fsck_an_image() {
    let d = tempdir("mkfs");
    let img = d.0.join("img");
    let p = img.to_str().unwrap();
    let o = moneta(
        &[
            "mkfs",
            p,
            "--size",
            "64M",
            "--chunk-size",
            "64K",
            "--root-mode",
            "1777",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("chunks of 65536 bytes"), "{}", text(&o));
    let o = moneta(&["mkfs", p], &[]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--force"), "{}", text(&o));
    let o = moneta(&["fsck", p], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"));
    // A daemon serves it; files made through it check clean afterwards.
    let sock = d.0.join("s.sock");
    let o = moneta(
        &["start", "--device", p, "--socket", sock.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let c = libmoneta::Control::connect(&sock).unwrap();
    let (h, _, _) = c
        .fs_open(b"/f", libc::O_CREAT | libc::O_RDWR, 0o644)
        .unwrap();
    c.fs_extend(h, 0, 100_000).unwrap();
    c.fs_close(h).unwrap();
    let st = c.fs_stat(b"/", true).unwrap();
    assert_eq!(st.mode & 0o7777, 0o1777);
    drop(c);
    let o = moneta(&["stop", "--socket", sock.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta(&["fsck", p, "-v"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("1 files"), "{}", text(&o));
    assert!(!text(&o).contains("note: "), "{}", text(&o));
    // A daemon killed while a file's pages are out leaves them beside the image, and the
    // check says so; the next daemon folds them back.
    let o = moneta(
        &["start", "--device", p, "--socket", sock.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = libmoneta::Moneta::connect(&sock).unwrap();
    let f = m
        .open("/f", libmoneta::OpenOptions::new().read(true).write(true))
        .unwrap();
    let (pages, _) = f.pages(true).unwrap();
    let pid: i32 = text(&o)
        .split("pid ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", text(&o)));
    // SAFETY: a signal to the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop((pages, f, m));
    let o = moneta(&["fsck", p], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("img.pages holds the pages of files that were mapped"),
        "{}",
        text(&o)
    );
    let o = moneta(
        &["start", "--device", p, "--socket", sock.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta(&["stop", "--socket", sock.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta(&["fsck", p], &[]);
    assert!(!text(&o).contains("note: "), "{}", text(&o));
    // Damage: set the last bit of the chunk bitmap (a leaked chunk).
    let t = {
        let a = moneta_device::MappedArray::open_file(&img, None).unwrap();
        moneta_fs::tables::load(&a).unwrap().sb.geometry
    };
    let last = t.chunk_count - 1;
    let at = t.bitmap_off + last / 64 * 8;
    let mut bytes = std::fs::read(&img).unwrap();
    let mut w = u64::from_le_bytes(bytes[at as usize..at as usize + 8].try_into().unwrap());
    w |= 1 << (last % 64);
    bytes[at as usize..at as usize + 8].copy_from_slice(&w.to_le_bytes());
    std::fs::write(&img, &bytes).unwrap();
    let o = moneta(&["fsck", p], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("no file owns them"), "{}", text(&o));
    let o = moneta(&["fsck", p, "--repair"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = moneta(&["fsck", p], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // A foreign file cannot be checked.
    std::fs::write(d.0.join("junk"), vec![7u8; 1 << 20]).unwrap();
    let o = moneta(&["fsck", d.0.join("junk").to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(8), "{}", text(&o));
}

/// `moneta mkfs` and `moneta fsck` never destroy or change what they were not asked to: a
/// file holding other data is refused without `--force`, rejected arguments leave nothing
/// behind, and a check opens the image for reading only (it works on an image the caller
/// may only read, and leaves it as it was).
#[test]
fn image_commands_never_destroy_what_they_did_not_make() {
    let d = tempdir("keep");
    // Someone's data.
    let precious = d.0.join("precious");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&precious, &data).unwrap();
    let o = moneta(&["mkfs", precious.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(text(&o).contains("holds data"), "{}", text(&o));
    assert!(text(&o).contains("--force"), "{}", text(&o));
    assert_eq!(std::fs::read(&precious).unwrap(), data);
    let o = moneta(
        &[
            "mkfs",
            precious.to_str().unwrap(),
            "--force",
            "--chunk-size",
            "64K",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    // A file of holes holds nothing to lose.
    let holes = d.0.join("holes");
    std::fs::File::create(&holes)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let o = moneta(&["mkfs", holes.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    // Rejected arguments, or a format that fails, leave no file behind.
    for args in [
        vec!["--root-mode", "999"],
        vec!["--root-owner", "nobody"],
        vec!["--chunk-size", "3000"],
        vec!["--size", "8K"],
    ] {
        let fresh = d.0.join("fresh");
        let mut all = vec!["mkfs", fresh.to_str().unwrap()];
        all.extend(args.iter().copied());
        let o = moneta(&all, &[]);
        assert!(!o.status.success(), "{args:?}");
        assert!(!fresh.exists(), "{args:?} left {}", fresh.display());
    }
    // A check changes nothing, and needs only read access.
    let img = d.0.join("img");
    let o = moneta(&["mkfs", img.to_str().unwrap(), "--size", "16M"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let before = (
        std::fs::read(&img).unwrap(),
        std::fs::metadata(&img).unwrap().modified().unwrap(),
    );
    let o = moneta(&["fsck", img.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let after = (
        std::fs::read(&img).unwrap(),
        std::fs::metadata(&img).unwrap().modified().unwrap(),
    );
    assert!(before == after, "fsck changed the image");
    assert!(
        rustix::process::geteuid().is_root() || std::env::var("CI").as_deref() != Ok("true"),
        "this test needs root, and CI must run it"
    );
    if rustix::process::geteuid().is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&img, std::fs::Permissions::from_mode(0o644)).unwrap();
        let o = Command::new("setpriv")
            .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_moneta"))
            .args(["fsck", img.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = Command::new("setpriv")
            .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_moneta"))
            .args(["fsck", img.to_str().unwrap(), "--repair"])
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(8),
            "a repair needs write access: {}",
            text(&o)
        );
    } else {
        eprintln!("SKIPPED the read-only fsck as another user: needs root");
    }
}

/// `moneta mkfs --data-checksums` and `moneta fsck --data`: a byte flipped in a file's data is
/// reported with the file and the offset (exit 4); the metadata check alone stays clean.
#[test]
fn fsck_data_names_the_damaged_blocks() {
    let d = tempdir("data");
    let img = d.0.join("img");
    let p = img.to_str().unwrap();
    let o = moneta(
        &[
            "mkfs",
            p,
            "--size",
            "32M",
            "--chunk-size",
            "64K",
            "--data-checksums",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("data checksums"), "{}", text(&o));
    let sock = d.0.join("s.sock");
    let o = moneta(
        &["start", "--device", p, "--socket", sock.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    {
        let m = libmoneta::Moneta::connect(&sock).unwrap();
        let mut opts = libmoneta::OpenOptions::new();
        opts.read(true).write(true).create(true);
        let f = m.open("/f", &opts).unwrap();
        f.write_at(&[0x5a; 20_000], 0).unwrap();
        f.sync_all().unwrap();
    }
    let o = moneta(&["stop", "--socket", sock.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta(&["fsck", p, "--data"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("data: 0 damaged blocks"), "{}", text(&o));
    let addr = {
        let a = moneta_device::MappedArray::open_read_only(&img).unwrap();
        let t = moneta_fs::tables::load(&a).unwrap();
        let e = t.extents.values().next().unwrap();
        t.sb.geometry.chunk_addr(e.dev_chunk) + 8192 + 17
    };
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[addr as usize] ^= 1;
    std::fs::write(&img, &bytes).unwrap();
    let o = moneta(&["fsck", p], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = moneta(&["fsck", p, "--data"], &[]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("/f (inode 3)"), "{}", text(&o));
    assert!(text(&o).contains("offset 8192"), "{}", text(&o));
    assert!(text(&o).contains("data: 1 damaged blocks"), "{}", text(&o));
    // An image without checksums says so.
    let plain = d.0.join("plain");
    let o = moneta(&["mkfs", plain.to_str().unwrap(), "--size", "16M"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = moneta(&["fsck", plain.to_str().unwrap(), "--data"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("keeps no data checksums"), "{}", text(&o));
}
