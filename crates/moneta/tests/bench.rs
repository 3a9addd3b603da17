//! `moneta bench` in tiny configurations: its accounting against known workloads, the stage
//! breakdown, table pressure, several files, zero-copy, split requests and CSV.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn moneta(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(args)
        .output()
        .expect("run moneta")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the bench with `--json` (and a short, warm-up-free single run unless overridden);
/// returns its records.
fn bench(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["bench", "--json", "--warmup", "0", "--runs", "1"];
    all.extend_from_slice(args);
    let o = moneta(&all);
    assert!(o.status.success(), "{all:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn find<'a>(recs: &'a [Value], path: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("no {path} record in {recs:?}"))
}

/// A daemon of our own for the accounting checks, stopped at the end.
struct Daemon {
    socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    fn start(tag: &str, extra: &[&str]) -> Daemon {
        let dir =
            std::env::temp_dir().join(format!("moneta-benchtest-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("s.sock");
        let mut args = vec![
            "start",
            "--socket",
            socket.to_str().unwrap(),
            "--volatile",
            "--size",
            "64M",
            "--",
        ];
        args.extend_from_slice(extra);
        let o = moneta(&args);
        assert!(o.status.success(), "{}", text(&o));
        Daemon { socket, dir }
    }

    fn status(&self) -> Value {
        let o = moneta(&[
            "status",
            "--json",
            "--socket",
            self.socket.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn socket(&self) -> &str {
        self.socket.to_str().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = moneta(&["stop", "--socket", self.socket.to_str().unwrap()]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn delta(a: &Value, b: &Value, k: &str) -> u64 {
    b[k].as_u64().unwrap() - a[k].as_u64().unwrap()
}

/// Every operation the bench counts is a command the device counted, with its bytes; a
/// request larger than its share of the DMA buffer is split into commands the device counts
/// one by one.
#[test]
fn operation_and_byte_counts_match_the_devices() {
    let d = Daemon::start("count", &["--raw"]);
    let s0 = d.status();
    let r = bench(&[
        "--socket",
        d.socket(),
        "--path",
        "moneta-raw",
        "--op",
        "randrw",
        "--size",
        "4K",
        "--qd",
        "4",
        "--ops",
        "1000",
        "--region",
        "1M",
    ]);
    let s1 = d.status();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["ops"], 1000);
    assert_eq!(delta(&s0, &s1, "commands"), 1000);
    assert_eq!(delta(&s0, &s1, "command_errors"), 0);
    let bytes = delta(&s0, &s1, "bytes_read") + delta(&s0, &s1, "bytes_written");
    assert_eq!(bytes, 1000 * 4096);
    // A 50/50 mix is about half writes.
    let w = delta(&s0, &s1, "bytes_written") / 4096;
    assert!((350..650).contains(&w), "{w} writes of 1000");

    // 2 MiB requests from 2 threads at depth 2: each slot has 16 slices (256 KiB), so every
    // request is 8 commands.
    let r = bench(&[
        "--socket",
        d.socket(),
        "--path",
        "moneta-raw",
        "--op",
        "read",
        "--size",
        "2M",
        "--qd",
        "2",
        "--threads",
        "2",
        "--ops",
        "5",
        "--region",
        "8M",
    ]);
    let s2 = d.status();
    assert_eq!(r[0]["ops"], 10);
    assert_eq!(delta(&s1, &s2, "commands"), 80);
    assert_eq!(delta(&s1, &s2, "bytes_read"), 10 * (2 << 20));
}

/// With the media model adding 200 us to every read, the percentiles sit just above it.
#[test]
fn latency_percentiles_follow_the_media_model() {
    let d = Daemon::start("lat", &["--raw", "--read-latency-ns", "200000"]);
    let r = bench(&[
        "--socket",
        d.socket(),
        "--path",
        "moneta-raw",
        "--size",
        "512",
        "--ops",
        "200",
        "--completion",
        "sleep",
        "--region",
        "1M",
    ]);
    let lat = &r[0]["lat_ns"];
    let p = |k: &str| lat[k].as_u64().unwrap();
    assert!(p("p50") >= 200_000 && p("p50") < 2_000_000, "{lat}");
    assert!(p("p50") <= p("p90") && p("p90") <= p("p99") && p("p99") <= p("max"));
    assert!(p("mean") >= 200_000, "{lat}");
    // 200 requests one at a time take at least 200 x 200 us.
    assert!(r[0]["seconds"].as_f64().unwrap() >= 0.04);
}

/// `--breakdown`: the moneta path's stages come from counters in libmoneta and the daemon and
/// add up to no more than the latency the bench measured around each call; the kernel's add
/// up to its mean.
#[test]
fn breakdown_components_add_up() {
    let recs = bench(&[
        "--path",
        "moneta",
        "--path",
        "kernel-psync",
        "--breakdown",
        "--size",
        "512,4K",
        "--op",
        "read",
        "--ops",
        "3000",
        "--region",
        "4M",
    ]);
    assert_eq!(recs.len(), 4);
    for r in &recs {
        let parts = r["breakdown"].as_array().unwrap_or_else(|| panic!("{r}"));
        let sum: f64 = parts.iter().map(|c| c["ns"].as_f64().unwrap()).sum();
        let mean = r["lat_ns"]["mean"].as_f64().unwrap();
        assert!(parts.iter().all(|c| c["ns"].as_f64().unwrap() >= 0.0));
        if r["path"] == "moneta" {
            let names: Vec<&str> = parts.iter().map(|c| c["name"].as_str().unwrap()).collect();
            for n in [
                "extent lookup",
                "submission",
                "permission check",
                "data movement (array)",
                "doorbell and completion",
                "copy (DMA buffer)",
            ] {
                assert!(names.contains(&n), "{n} missing: {names:?}");
            }
            // The daemon traced the requests: its stages are measured, not zero.
            let get = |n: &str| {
                parts.iter().find(|c| c["name"] == n).unwrap()["ns"]
                    .as_f64()
                    .unwrap()
            };
            assert!(get("permission check") > 0.0 && get("data movement (array)") > 0.0);
            assert!(get("copy (DMA buffer)") > 0.0);
            assert!(
                sum <= mean * 1.1 && sum >= mean * 0.3,
                "{sum} vs {mean}: {r}"
            );
        } else {
            assert_eq!(parts[0]["name"], "system call");
            assert!((sum - mean).abs() <= 1.0 + mean * 1e-6, "{sum} vs {mean}");
        }
    }
    // Queue depth above 1 is refused.
    let o = moneta(&["bench", "--path", "moneta", "--breakdown", "--qd", "2"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--qd 1"), "{}", text(&o));
}

/// A file of 2048 extents on a table of 1024 records: with merging its records fold into one
/// and nothing misses; without, the table cannot hold them and requests meet hard misses,
/// yet every one completes.
#[test]
fn extents_load_the_permission_table_unless_merged() {
    let common = [
        "--path",
        "moneta",
        "--size",
        "512",
        "--ops",
        "3000",
        "--region",
        "8M",
        "--extents",
        "2048",
        "--table-entries",
        "1024",
    ];
    let merged = bench(&common);
    let mut args = common.to_vec();
    args.push("--no-merge");
    let unmerged = bench(&args);
    for r in [&merged[0], &unmerged[0]] {
        let e = r["extents"].as_u64().unwrap();
        // Shuffled chunks land next to each other in the file now and then.
        assert!((2000..=2048).contains(&e), "{r}");
        assert_eq!(r["ops"], 3000);
    }
    assert_eq!(merged[0]["hard_misses"], 0, "{}", merged[0]);
    assert!(
        unmerged[0]["hard_misses"].as_u64().unwrap() > 0,
        "{}",
        unmerged[0]
    );
    // Extents that do not divide the region into a power of two are refused.
    let o = moneta(&[
        "bench",
        "--path",
        "moneta",
        "--region",
        "8M",
        "--extents",
        "3000",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("power"), "{}", text(&o));
}

/// Requests spread over several files on both sides; zero-copy requests; CSV output.
#[test]
fn open_files_zero_copy_and_csv() {
    let recs = bench(&[
        "--path",
        "moneta",
        "--path",
        "moneta-zero-copy",
        "--path",
        "kernel-psync",
        "--op",
        "randrw",
        "--open-files",
        "8",
        "--size",
        "4K",
        "--ops",
        "500",
        "--region",
        "8M",
    ]);
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert_eq!(r["open_files"], 8, "{r}");
        assert_eq!(r["ops"], 500, "{r}");
        assert!(r["cpus"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        find(&recs, "moneta-zero-copy")["mib_s_per_cpu"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // Zero-copy requests fit one DMA slice.
    let o = moneta(&["bench", "--path", "moneta-zero-copy", "--size", "64K"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("slice"), "{}", text(&o));

    let o = moneta(&[
        "bench",
        "--csv",
        "--path",
        "kernel-psync",
        "--size",
        "512,4K",
        "--ops",
        "100",
        "--warmup",
        "0",
        "--runs",
        "1",
        "--region",
        "1M",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    for c in [
        "path",
        "size",
        "lat_ns_p50",
        "cpu_user_s",
        "cpus",
        "mib_s_per_cpu",
    ] {
        assert!(head.contains(&c), "{c} not in {head:?}");
    }
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2);
    let size = head.iter().position(|c| *c == "size").unwrap();
    assert_eq!(rows[0][size], "512");
    assert_eq!(rows[1][size], "4096");
    assert!(rows.iter().all(|r| r.len() == head.len()));
}

/// The kernel's block path: ext4 and XFS on loop devices over tmpfs files, set up and torn
/// down by the bench. Without root the bench refuses with the reason.
#[test]
fn kernel_odirect_paths_on_loop_devices() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let args = [
        "--path",
        "kernel-odirect-ext4",
        "--path",
        "kernel-odirect-xfs",
        "--op",
        "randrw",
        "--size",
        "512,16K",
        "--ops",
        "200",
        "--region",
        "8M",
        "--breakdown",
    ];
    if !root {
        let mut all = vec!["bench", "--json"];
        all.extend_from_slice(&args);
        let o = moneta(&all);
        assert!(!o.status.success());
        assert!(text(&o).contains("needs root"), "{}", text(&o));
        return;
    }
    let _loops = LOOP_DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let loops_before = loop_backings();
    let recs = bench(&args);
    assert_eq!(recs.len(), 4);
    for r in &recs {
        assert_eq!(r["ops"], 200, "{r}");
        assert_eq!(r["qd"], 1);
        let parts = r["breakdown"].as_array().unwrap();
        assert_eq!(parts[1]["name"], "file system and block layer");
    }
    // Everything the bench set up is gone: its loop devices and their backing files.
    assert_eq!(loop_backings(), loops_before);
}

/// Whether this process may make loop devices and mounts; without root a test that needs them
/// says it skipped, and fails under `CI=true`, which must run it.
fn root_or_skip(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "{what} needs root, and CI must run it"
    );
    eprintln!("SKIPPED: {what} needs root (a loop device and a mount)");
    false
}

/// Moneta-D's recycled file systems: a private `monetad --kernel-fs` for ext4 and another for
/// XFS, the same files read and written through channels and through the kernel's mount, one
/// path after the other (the channel path's second size follows the kernel's runs of the
/// first, so it takes the files back from the kernel). Every channel byte is counted by the
/// daemon (nothing fell back to the kernel), the daemons are stopped and their mounts and loop
/// devices gone; a user without root is told the paths were skipped while the others run.
#[test]
fn kernel_fs_paths_through_channels_and_the_kernel() {
    if !root_or_skip("the kernel-fs bench paths") {
        return;
    }
    let paths = [
        "moneta-kfs-ext4",
        "kernel-kfs-ext4-odirect",
        "kernel-kfs-ext4-buffered",
        "moneta-kfs-xfs",
        "kernel-kfs-xfs-odirect",
        "kernel-kfs-xfs-buffered",
    ];
    let _loops = LOOP_DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let loops_before = loop_backings();
    let mut args = vec![
        "--op",
        "randrw",
        "--size",
        "512,64K",
        "--ops",
        "150",
        "--region",
        "8M",
        "--open-files",
        "2",
    ];
    for p in paths {
        args.extend(["--path", p]);
    }
    let recs = bench(&args);
    assert_eq!(recs.len(), paths.len() * 2, "{recs:?}");
    for p in paths {
        for size in [512u64, 65536] {
            let r = recs
                .iter()
                .find(|r| r["path"] == p && r["size"] == size)
                .unwrap_or_else(|| panic!("no {p} {size} record in {recs:?}"));
            assert_eq!(r["ops"], 150, "{r}");
            assert_eq!(r["qd"], 1, "{r}");
            assert_eq!(r["runs"], 1, "{r}");
            assert_eq!(r["open_files"], 2, "{r}");
            assert!(r["mib_s"].as_f64().unwrap() > 0.0, "{r}");
            if p.starts_with("moneta-kfs") {
                // Every byte of the run went through the channel, none through the kernel.
                assert_eq!(r["channel_bytes"].as_u64(), Some(150 * size), "{r}");
                assert!(r["device_cpu"].is_object(), "{r}");
            } else {
                assert!(r.get("channel_bytes").is_none(), "{r}");
            }
        }
    }
    // The daemons stopped: nothing of theirs is mounted, no loop device of theirs is left.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("moneta-bench-kfs-"), "{mounts}");
    assert_eq!(loop_backings(), loops_before);

    // Refused with the breakdown, whose stages these paths do not have.
    let o = moneta(&["bench", "--path", "moneta-kfs-ext4", "--breakdown"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--breakdown"), "{}", text(&o));

    // Another user: the kernel-fs paths are skipped with the reason, the others run; alone
    // they fail with it.
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=1001", "--regid=1001", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_moneta"))
            .args(args)
            .current_dir("/")
            .output()
            .expect("run setpriv")
    };
    let o = as_user(&[
        "bench",
        "--json",
        "--path",
        "kernel-psync",
        "--path",
        "moneta-kfs-xfs",
        "--size",
        "4K",
        "--ops",
        "10",
        "--runs",
        "1",
        "--warmup",
        "0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("moneta-kfs-xfs skipped") && err.contains("needs root"),
        "{err}"
    );
    let recs: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["path"], "kernel-psync");
    let o = as_user(&["bench", "--path", "kernel-kfs-ext4-buffered", "--ops", "10"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("kernel-kfs-ext4-buffered skipped") && text(&o).contains("needs root"),
        "{}",
        text(&o)
    );
}

/// Backing files of the attached loop devices.
/// Held by the tests that compare the machine's loop devices before and after their bench, so
/// that one's devices are not counted as the other's leftovers.
static LOOP_DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn loop_backings() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `--neighbour`: each Moneta configuration alone and beside another process reading 1 MiB at a
/// time, both recorded; kernel paths are refused with it.
#[test]
fn bench_beside_a_neighbour() {
    let recs = bench(&[
        "--path",
        "moneta",
        "--size",
        "4K",
        "--duration",
        "0.3",
        "--neighbour",
    ]);
    assert_eq!(recs.len(), 2, "{recs:?}");
    let alone = recs.iter().find(|r| r["neighbour"] == false).unwrap();
    let beside = recs.iter().find(|r| r["neighbour"] == true).unwrap();
    for r in [alone, beside] {
        assert_eq!(r["path"], "moneta");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
    }
    let o = moneta(&["bench", "--path", "kernel-psync", "--neighbour"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--neighbour"), "{}", text(&o));
}

#[test]
fn the_model_is_measured_against_itself() {
    let recs = bench(&["--path", "model-accuracy", "--ops", "200"]);
    let of = |f: &'static str| recs.iter().filter(move |r| r["figure"] == f);
    // Every array latency of the sweep, reads and writes, each with the model's prediction.
    assert_eq!(of("latency").count(), 14);
    let mut close_points = 0;
    for r in of("latency") {
        let predicted = r["predicted_ns"].as_u64().unwrap();
        assert!(predicted >= r["array_ns"].as_u64().unwrap(), "{r}");
        assert!(r["within_target"].is_boolean());
        // The point is the median of at least three runs' pairs, inside their spread; the
        // pairs of the host's two states add up to all of them. (One state is told from the
        // other over the whole sweep's probes: a point measured while the host stayed in its
        // far state has no close pairs, but the sweep as a whole has.)
        assert!(r["pairs"].as_u64().unwrap() >= 3, "{r}");
        let lo = r["added_spread_ns"][0].as_i64().unwrap();
        let hi = r["added_spread_ns"][1].as_i64().unwrap();
        let added = r["added_ns"].as_i64().unwrap();
        assert!(lo <= added && added <= hi, "{r}");
        assert!(r["runs_added_ns"].as_array().unwrap().len() >= 3, "{r}");
        let pairs = r["pairs"].as_u64().unwrap();
        let close = r["close"]["pairs"].as_u64().unwrap_or(0);
        if close > 0 {
            close_points += 1;
        }
        let far = r["far"]["pairs"].as_u64().unwrap_or(0);
        assert_eq!(close + far, pairs, "{r}");
        if close > 0 && std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2 {
            assert!(
                r["close"]["line_round_trip_ns"].as_u64().unwrap() > 0,
                "{r}"
            );
        }
    }
    assert!(
        close_points > 0,
        "no point of the sweep has pairs in the close state"
    );
    // The slowest array adds at least its own latency to every request.
    let slow = of("latency")
        .find(|r| r["array_ns"] == 128_000 && r["op"] == "read")
        .unwrap();
    assert!(slow["model_p50_ns"].as_u64().unwrap() > 128_000, "{slow}");
    assert_eq!(of("bandwidth").count(), 2);
    for r in of("bandwidth") {
        assert_eq!(r["peak_mb_s"].as_f64(), Some(2000.0));
        assert!(r["mb_s"].as_f64().unwrap() > 0.0);
    }
    let cost: Vec<_> = of("cost").collect();
    assert_eq!(cost.len(), 1);
    assert!(cost[0]["ns_per_request"].as_f64().unwrap() > 0.0);
    // With --model, every record names the model and its parameters.
    let recs = bench(&[
        "--path",
        "moneta-raw",
        "--path",
        "moneta",
        "--ops",
        "100",
        "--size",
        "4K",
        "--model",
        "dram",
        "--model-set",
        "controllers=2",
    ]);
    for r in &recs {
        assert_eq!(r["model"], "dram", "{r}");
        assert_eq!(r["model_parameters"]["controllers"], "2", "{r}");
        assert!(
            r["model_figures"]["energy_per_op_j"].as_f64() > Some(0.0),
            "{r}"
        );
    }
    let o = moneta(&[
        "bench",
        "--path",
        "moneta",
        "--socket",
        "/nonexistent",
        "--model",
        "pcm",
    ]);
    assert!(!o.status.success() && text(&o).contains("private daemon"));
}

#[test]
fn the_file_system_calls_both_ways_and_the_kernels() {
    let recs = bench(&["--path", "nvfs", "--files", "200"]);
    for op in [
        "fstat",
        "stat",
        "create",
        "rename",
        "unlink",
        "lock-unlock",
        "write-fsync",
        "create-write-close",
    ] {
        for path in ["nvfs", "nvfs-socket", "kernel-tmpfs"] {
            let r = recs
                .iter()
                .find(|r| r["path"] == path && r["op"] == op)
                .unwrap_or_else(|| panic!("no {path} {op} in {recs:?}"));
            assert!(r["ops"].as_u64().unwrap() >= 100, "{r}");
            assert!(r["p50_ns"].as_u64().unwrap() > 0, "{r}");
        }
    }
    // Kept answers of fstat and stat, as libmoneta gives them, and its fsync through a file.
    for (path, op) in [
        ("nvfs-kept", "fstat"),
        ("nvfs-kept", "stat"),
        ("nvfs-file", "write-fsync"),
        ("nvfs-file", "write-and-fsync"),
        ("kernel-tmpfs", "write-and-fsync"),
    ] {
        let r = recs
            .iter()
            .find(|r| r["path"] == path && r["op"] == op)
            .unwrap_or_else(|| panic!("no {path} {op} in {recs:?}"));
        assert!(r["ops"].as_u64().unwrap() >= 100, "{r}");
    }
    // Through the channel the device answered the calls (9 per round, 100 rounds, counted
    // before the small files), and the socket's side asked none.
    let calls = recs
        .iter()
        .find(|r| r["op"] == "channel-calls")
        .expect("the device's counts");
    let answered = calls["ops"].as_u64().unwrap();
    let referred = calls["referred"].as_u64().unwrap();
    assert!(answered + referred >= 800, "{calls}");
    assert!(answered >= 400, "{calls}");
}

#[test]
fn mapped_files_against_the_kernels_mapping() {
    let recs = bench(&[
        "--path",
        "moneta-mmap",
        "--path",
        "kernel-mmap",
        "--op",
        "randrw",
        "--size",
        "4K",
        "--ops",
        "20000",
    ]);
    for path in ["moneta-mmap", "kernel-mmap"] {
        let r = find(&recs, path);
        assert_eq!(r["ops"].as_u64().unwrap(), 20000, "{r}");
        assert!(r["lat_ns"]["p50"].as_u64().unwrap() > 0, "{r}");
    }
    // A queue depth means nothing to loads and stores.
    let o = moneta(&["bench", "--path", "moneta-mmap", "--qd", "4"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("synchronous"), "{}", text(&o));
}

/// The DRAM buffer's bench: every setup on both patterns, with the buffer doing what each
/// setup says (read-ahead serves sequential reads and none of the strided ones; hints serve
/// both; without a buffer nothing is served from one).
#[test]
fn the_dram_buffer_with_read_ahead_and_hints() {
    let recs = bench(&["--path", "dram-buffer", "--region", "32M", "--ops", "256"]);
    assert_eq!(recs.len(), 10, "{recs:?}");
    let get = |pattern: &str, setup: &str| {
        recs.iter()
            .find(|r| r["pattern"] == pattern && r["setup"] == setup)
            .unwrap_or_else(|| panic!("no {pattern} {setup} in {recs:?}"))
    };
    let hits = |r: &Value| r["hit_ratio"].as_f64().unwrap();
    for pattern in ["sequential", "strided"] {
        let none = get(pattern, "no-buffer");
        assert_eq!(none["model"], "slow-nvm", "{none}");
        assert_eq!(none["reads"], 256, "{none}");
        assert_eq!(hits(none), 0.0, "{none}");
        assert_eq!(hits(get(pattern, "demand")), 0.0);
        assert!(
            hits(get(pattern, "hints")) > 0.95,
            "{}",
            get(pattern, "hints")
        );
    }
    let seq = get("sequential", "read-ahead");
    assert!(hits(seq) > 0.95, "{seq}");
    let strided = get("strided", "read-ahead");
    assert_eq!(hits(strided), 0.0, "{strided}");
    assert_eq!(strided["used_ahead"], 0, "{strided}");
    assert!(
        strided["unused_ahead"].as_u64().unwrap() >= 255 * 16,
        "{strided}"
    );
    // Without a model there is no buffer to measure.
    let o = moneta(&["bench", "--path", "dram-buffer", "--model", "none"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("give a model"), "{}", text(&o));
}

/// Paper 003's Figure 3b: a member's range through the forwarding device, the same bytes
/// through an NBD client, and the device's own array, for reads and writes; the bench's
/// daemons and export are gone afterwards.
#[test]
fn remote_access_through_forwarding_an_nbd_client_and_locally() {
    // The member's export loads the NBD plugin.
    let _ = common::built("libmoneta_nbd.so");
    for op in ["read", "write"] {
        let recs = bench(&[
            "--path", "remote", "--op", op, "--size", "4K,64K", "--ops", "50", "--region", "8M",
        ]);
        assert_eq!(recs.len(), 6, "{recs:?}");
        for size in [4096, 65536] {
            for t in ["local", "forwarded", "nbd-client"] {
                let r = recs
                    .iter()
                    .find(|r| r["size"] == size && r["transport"] == t)
                    .unwrap_or_else(|| panic!("no {t} {size} in {recs:?}"));
                assert_eq!(r["op"], op, "{r}");
                assert_eq!(r["ops"], 50, "{r}");
                assert!(r["p50_ns"].as_u64().unwrap() > 0, "{r}");
                // What a remote transport adds is counted against the local mean of the size.
                let local = recs
                    .iter()
                    .find(|r| r["size"] == size && r["transport"] == "local")
                    .unwrap();
                let mean = |r: &Value| r["mean_ns"].as_u64().unwrap();
                let added = if t == "local" {
                    0
                } else {
                    mean(r).saturating_sub(mean(local))
                };
                assert_eq!(r["added_ns"], added, "{r} against {local}");
            }
        }
    }
    let left = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("moneta-bench-remote-")
        });
    assert!(!left, "the remote bench left its directory behind");
    let o = moneta(&["bench", "--path", "remote", "--op", "randrw"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("read or write"), "{}", text(&o));
}
