//! `moneta bench`: one engine that times the same I/O pattern through different paths.
//!
//! Paths: `moneta` (files on nvfs through libmoneta, synchronous or `--qd` asynchronous),
//! `moneta-raw` (raw commands through a channel on one file's extent: no file system on the
//! way), `moneta-kfs-ext4`/`moneta-kfs-xfs` and `kernel-kfs-*` (files of ext4 or XFS made on
//! the array by a private `monetad --kernel-fs`, through channels or through the kernel's
//! mount: Moneta-D's recycled file system, [`kfs`]), `kernel-psync` (`pread`/`pwrite` on a
//! file, by default in `/dev/shm`), `kernel-uring` and `kernel-uring-sqpoll` (io_uring on that
//! file), `fuse` (`pread`/`pwrite` on a file under a
//! `moneta mount` of the private daemon), and `perm-check` (the permission table's
//! check alone, in process). Each configuration runs `--runs` times, paths alternating, after
//! a discarded warm-up; the reported run is the median by p50 latency, with the spread of p50
//! over all runs.

pub mod accuracy;
mod args;
pub mod breakdown;
pub mod buffer;
mod files;
pub mod instructions;
mod kfs;
pub mod machine;
pub mod modelfig;
mod neighbour;
mod print;
mod record;
pub mod remote;
mod setup;
mod threads;
mod uring;

use args::validate;
pub use args::{BenchArgs, CompletionArg, Op, Path};
use neighbour::Neighbour;
use print::*;
use record::*;
pub use record::{Cpu, Latency, Record};
use setup::*;
use threads::*;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use libmoneta::Control;
use moneta_abi::Completion;
use rand::{Rng, SeedableRng};
use serde::Serialize;

fn summarize(
    a: &BenchArgs,
    path: Path,
    size: u64,
    mut runs: Vec<RunResult>,
    completion: Option<CompletionArg>,
) -> Record {
    let n = runs.len();
    let mut p50s: Vec<u64> = runs.iter().map(|r| r.hist.value_at_quantile(0.5)).collect();
    p50s.sort_unstable();
    runs.sort_by_key(|r| r.hist.value_at_quantile(0.5));
    // Wear only accumulates: the latest state is the one after the run that left the most.
    let latest_wear = runs
        .iter()
        .filter_map(|r| r.model.map(|(_, after)| after))
        .max_by(|a, b| a.wear_total().total_cmp(&b.wear_total()));
    let r = runs.swap_remove(n / 2);
    // The stages of the run whose latencies are reported, so that they add up to its mean (a
    // sum over every run let one slow run push the stages past the median run's mean).
    let trace = r.trace;
    let h = &r.hist;
    let (instructions_per_op, instructions_note) = match &r.instructions {
        None => (None, None),
        Some(Ok(c)) => (
            Some(c.instructions as f64 / r.ops.max(1) as f64),
            Some(c.scope.to_string()),
        ),
        Some(Err(e)) => (None, Some(e.clone())),
    };
    let iops = r.ops as f64 / r.seconds;
    let mib_s = if a.op == Op::Nop {
        0.0
    } else {
        iops * size as f64 / (1 << 20) as f64
    };
    let busy = |c: &Cpu| c.total_s;
    let cpus = (busy(&r.cpu) + r.device_cpu.as_ref().map(busy).unwrap_or(0.0)) / r.seconds;
    let breakdown = if !a.breakdown {
        None
    } else if let Some(t) = &trace {
        Some(breakdown::moneta_components(t))
    } else {
        path.synchronous()
            .then(|| breakdown::kernel_components(h.mean(), size, path != Path::KernelPsync))
    };
    Record {
        path: path.name(),
        op: a.op,
        size,
        qd: if path.synchronous() { 1 } else { a.qd },
        threads: a.threads,
        completion,
        ops: r.ops,
        seconds: r.seconds,
        iops,
        mib_s,
        lat_ns: Latency {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            mean: h.mean() as u64,
            max: h.max(),
        },
        cpu: r.cpu,
        device_cpu: r.device_cpu,
        runs: n,
        p50_spread: [p50s[0], p50s[n - 1]],
        records: None,
        open_files: a.open_files,
        extents: None,
        soft_misses: r.misses.map(|m| m.0),
        hard_misses: r.misses.map(|m| m.1),
        cpus,
        mib_s_per_cpu: if cpus > 0.0 { mib_s / cpus } else { 0.0 },
        instructions_per_op,
        instructions_note,
        breakdown,
        neighbour: None,
        model: "none".into(),
        model_parameters: None,
        model_figures: r
            .model
            .map(|(b, e)| modelfig::figures(b, e, latest_wear.unwrap_or(e))),
        neighbour_mib_s: r.neighbour_mib_s,
        channel_bytes: r.channel_bytes,
    }
}

/// The permission check alone: `records` records in one channel's tree, random lookups.
pub fn perm_check(records: u64, seed: u64) -> Record {
    let records = records.max(1);
    let mut t = moneta_device::PermissionTable::new(records as usize, 2, true);
    for i in 0..records {
        // Gaps between records keep them from merging.
        t.insert(
            1,
            i * 8192,
            4096,
            moneta_device::READ | moneta_device::WRITE,
            i,
        )
        .expect("insert");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let addrs: Vec<u64> = (0..1 << 16)
        .map(|_| rng.gen_range(0..records) * 8192 + rng.gen_range(0..3584))
        .collect();
    let rounds = 32;
    let mut best = f64::MAX;
    let mut hist = new_hist();
    for _ in 0..rounds {
        let start = Instant::now();
        let mut ok = 0u64;
        for &a in &addrs {
            ok += t
                .check(1, std::hint::black_box(a), 512, moneta_device::READ)
                .is_ok() as u64;
        }
        let ns = start.elapsed().as_nanos() as f64 / addrs.len() as f64;
        assert_eq!(ok, addrs.len() as u64);
        best = best.min(ns);
        hist.record((ns * 1000.0) as u64).ok();
    }
    let p50 = hist.value_at_quantile(0.5) as f64 / 1000.0;
    let ops = (rounds * addrs.len()) as u64;
    Record {
        path: Path::PermCheck.name(),
        op: Op::Read,
        size: 512,
        qd: 1,
        threads: 1,
        completion: None,
        ops,
        seconds: p50 * ops as f64 / 1e9,
        iops: 1e9 / p50,
        mib_s: 0.0,
        lat_ns: Latency {
            p50: p50.round() as u64,
            p90: (hist.value_at_quantile(0.9) as f64 / 1000.0).round() as u64,
            p99: (hist.value_at_quantile(0.99) as f64 / 1000.0).round() as u64,
            p999: (hist.value_at_quantile(0.999) as f64 / 1000.0).round() as u64,
            mean: (hist.mean() / 1000.0).round() as u64,
            max: (hist.max() as f64 / 1000.0).round() as u64,
        },
        cpu: Cpu::default(),
        device_cpu: None,
        runs: rounds,
        p50_spread: [
            best.round() as u64,
            (hist.max() as f64 / 1000.0).round() as u64,
        ],
        records: Some(records),
        open_files: 0,
        extents: None,
        soft_misses: None,
        hard_misses: None,
        cpus: 1.0,
        mib_s_per_cpu: 0.0,
        instructions_per_op: None,
        instructions_note: None,
        breakdown: None,
        neighbour: None,
        model: "none".into(),
        model_parameters: None,
        model_figures: None,
        neighbour_mib_s: None,
        channel_bytes: None,
    }
}

/// Runs the benchmark; returns the records.
pub fn run(mut a: BenchArgs) -> Result<Vec<Record>, String> {
    let compare = a.paths.is_empty();
    if compare {
        a.paths = vec![Path::KernelPsync, Path::Moneta, Path::MonetaRaw];
    }
    let sizes = if a.size.is_empty() {
        vec![512, 4096]
    } else {
        a.size.clone()
    };
    let ops = if compare {
        vec![Op::Read, Op::Write]
    } else {
        vec![a.op]
    };
    if a.paths.contains(&Path::Remote) {
        if a.paths.len() > 1 {
            return Err("--path remote runs on its own".into());
        }
        remote::run_remote(&a)?;
        return Ok(Vec::new());
    }
    if a.paths.contains(&Path::DramBuffer) {
        if a.paths.len() > 1 {
            return Err("--path dram-buffer runs on its own".into());
        }
        buffer::run_buffer(&a)?;
        return Ok(Vec::new());
    }
    if a.paths.contains(&Path::ModelAccuracy) {
        if a.paths.len() > 1 {
            return Err("--path model-accuracy runs on its own".into());
        }
        accuracy::run_accuracy(&a)?;
        return Ok(Vec::new());
    }
    let mut io_paths: Vec<Path> = a
        .paths
        .iter()
        .copied()
        .filter(|p| *p != Path::PermCheck && *p != Path::Nvfs)
        .collect();
    // The recycled file systems need root: without it their paths are skipped, saying why,
    // and the others run; with nothing else to run the bench fails with the reason.
    let mut skipped = Vec::new();
    for kind in crate::loopfs::FsKind::ALL {
        let wanted: Vec<Path> = io_paths
            .iter()
            .copied()
            .filter(|p| p.kfs_kind() == Some(kind))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        if let Some(why) = kfs::unavailable(kind) {
            io_paths.retain(|p| p.kfs_kind() != Some(kind));
            let names: Vec<&str> = wanted.iter().map(|p| p.name()).collect();
            skipped.push(format!("{} skipped: {why}", names.join(", ")));
        }
    }
    if !skipped.is_empty() {
        if io_paths.is_empty()
            && !a
                .paths
                .iter()
                .any(|p| matches!(p, Path::PermCheck | Path::Nvfs))
        {
            return Err(skipped.join("; "));
        }
        for s in &skipped {
            eprintln!("moneta bench: {s}");
        }
    }
    if a.paths.contains(&Path::Nvfs) {
        crate::fsbench::run(a.files, a.json)?;
        if io_paths.is_empty() && !a.paths.contains(&Path::PermCheck) {
            return Ok(Vec::new());
        }
    }
    if a.op == Op::Nop && io_paths.iter().any(|p| *p != Path::MonetaRaw) {
        return Err("--op nop measures the channel alone: use it with --path moneta-raw".into());
    }
    if a.qd != 1 && !io_paths.is_empty() && io_paths.iter().all(|p| p.synchronous()) {
        return Err(
            "kernel-psync, kernel-odirect, the kernel-fs, fuse and the mmap paths are synchronous: \
             use --threads, not --qd"
                .into(),
        );
    }
    validate(&a, &sizes, moneta_abi::DEFAULT_SLICE_SIZE, &io_paths)?;
    if a.neighbour
        && (io_paths.is_empty()
            || io_paths
                .iter()
                .any(|p| !matches!(p, Path::Moneta | Path::MonetaZeroCopy | Path::MonetaRaw)))
    {
        return Err("--neighbour shares a Moneta daemon: use it with the moneta paths only".into());
    }
    if a.socket.is_some() && (a.model.is_some() || !a.model_set.is_empty()) {
        return Err(
            "--model and --model-set set up the private daemon; the daemon at --socket runs \
             the model it was started with"
                .into(),
        );
    }
    let mut out = Vec::new();
    let daemon = if io_paths.iter().any(|p| {
        matches!(
            p,
            Path::Moneta | Path::MonetaZeroCopy | Path::MonetaRaw | Path::Fuse | Path::MonetaMmap
        )
    }) {
        Some(BenchDaemon::get(&a, a.region)?)
    } else {
        None
    };
    let kernel = if io_paths.iter().any(|p| {
        matches!(
            p,
            Path::KernelPsync | Path::KernelUring | Path::KernelUringSqpoll | Path::KernelMmap
        )
    }) {
        Some(kernel_files(&a, None)?)
    } else {
        None
    };
    let mut odirect = Vec::new();
    for (p, kind) in [
        (Path::KernelOdirectExt4, crate::loopfs::FsKind::Ext4),
        (Path::KernelOdirectXfs, crate::loopfs::FsKind::Xfs),
    ] {
        if io_paths.contains(&p) {
            odirect.push((p, kernel_files(&a, Some(kind))?));
        }
    }
    // The recycled file systems' daemons and the channel path's files; declared before the
    // targets, so that every handle and descriptor of a file is gone before its daemon stops
    // and unmounts.
    let mut kfs_daemons: Vec<kfs::KfsDaemon> = Vec::new();
    for kind in crate::loopfs::FsKind::ALL {
        if io_paths.iter().any(|p| p.kfs_kind() == Some(kind)) {
            kfs_daemons.push(kfs::KfsDaemon::start(&a, kind)?);
        }
    }
    let kfs_daemon = |p: Path| {
        kfs_daemons
            .iter()
            .find(|d| Some(d.kind) == p.kfs_kind())
            .expect("a daemon per file system")
    };
    let mut kfs_files = Vec::new();
    for d in &kfs_daemons {
        if io_paths.iter().any(|p| {
            matches!(p, Path::MonetaKfsExt4 | Path::MonetaKfsXfs) && p.kfs_kind() == Some(d.kind)
        }) {
            kfs_files.push((d.kind, d.channel_files()?));
        }
    }
    // Declared before the targets, so that their descriptors close before it unmounts.
    let fuse = if io_paths.contains(&Path::Fuse) {
        Some(fuse_files(daemon.as_ref().expect("daemon"), &a)?)
    } else {
        None
    };
    let moneta_files = if io_paths
        .iter()
        .any(|p| matches!(p, Path::Moneta | Path::MonetaZeroCopy | Path::MonetaMmap))
    {
        Some(bench_files(daemon.as_ref().expect("daemon"), &a)?)
    } else {
        None
    };
    // The mappings, made once and unmapped at the end.
    let moneta_maps = if io_paths.contains(&Path::MonetaMmap) {
        let files = &moneta_files.as_ref().expect("files").files;
        let mut fds = Vec::with_capacity(files.len());
        for f in files.iter() {
            fds.push(
                f.pages(true)
                    .map_err(|e| format!("cannot map a Moneta file: {e}"))?
                    .0,
            );
        }
        Some(threads::Maps::of(
            &fds,
            a.region / a.open_files.max(1) as u64,
        )?)
    } else {
        None
    };
    let kernel_maps = if io_paths.contains(&Path::KernelMmap) {
        let fds = &kernel.as_ref().expect("kernel file").fds;
        Some(threads::Maps::of(
            fds,
            a.region / a.open_files.max(1) as u64,
        )?)
    } else {
        None
    };
    let mut targets: Vec<(Path, Target)> = Vec::new();
    for &p in &io_paths {
        let t = match p {
            Path::MonetaRaw => raw_target(daemon.as_ref().expect("daemon"), &a)?,
            Path::Moneta | Path::MonetaZeroCopy => {
                let d = daemon.as_ref().expect("daemon");
                Target::File {
                    files: moneta_files.as_ref().expect("files").files.clone(),
                    zero_copy: p == Path::MonetaZeroCopy,
                    daemon_pid: d.pid,
                    completion: a.completion,
                    socket: d.socket.clone(),
                }
            }
            Path::KernelPsync => Target::Kernel {
                fds: kernel.as_ref().expect("kernel file").fds.clone(),
            },
            Path::MonetaMmap => Target::Mapped(moneta_maps.clone().expect("mapped")),
            Path::KernelMmap => Target::Mapped(kernel_maps.clone().expect("mapped")),
            Path::Fuse => Target::Kernel {
                fds: fuse.as_ref().expect("mount").files.fds.clone(),
            },
            Path::KernelOdirectExt4 | Path::KernelOdirectXfs => Target::Kernel {
                fds: odirect
                    .iter()
                    .find(|(q, _)| *q == p)
                    .expect("loop file system")
                    .1
                    .fds
                    .clone(),
            },
            Path::MonetaKfsExt4 | Path::MonetaKfsXfs => {
                let d = kfs_daemon(p);
                Target::KernelFs {
                    files: kfs_files
                        .iter()
                        .find(|(k, _)| *k == d.kind)
                        .expect("channel files")
                        .1
                        .clone(),
                    daemon_pid: d.pid,
                    socket: d.socket.clone(),
                    per_file: a.region / a.open_files.max(1) as u64,
                }
            }
            Path::KernelKfsExt4Odirect
            | Path::KernelKfsExt4Buffered
            | Path::KernelKfsXfsOdirect
            | Path::KernelKfsXfsBuffered => Target::KernelReopen {
                paths: kfs_daemon(p).files.clone(),
                direct: matches!(p, Path::KernelKfsExt4Odirect | Path::KernelKfsXfsOdirect),
            },
            Path::KernelUring | Path::KernelUringSqpoll => Target::Uring {
                fds: kernel.as_ref().expect("kernel file").fds.clone(),
                sqpoll: p == Path::KernelUringSqpoll,
            },
            Path::PermCheck
            | Path::Nvfs
            | Path::ModelAccuracy
            | Path::DramBuffer
            | Path::Remote => {
                unreachable!("not an I/O path")
            }
        };
        targets.push((p, t));
    }
    for &op in &ops {
        for &size in &sizes {
            let mut cfg = a.clone();
            cfg.op = op;
            let mut results: Vec<(Path, Vec<RunResult>)> =
                io_paths.iter().map(|&p| (p, Vec::new())).collect();
            // Warm-up, discarded, then runs alternating between paths.
            for (p, _) in &results {
                let t = target_for(*p, &targets);
                let mut w = cfg.clone();
                if p.synchronous() {
                    w.qd = 1;
                }
                if cfg.warmup > 0.0 {
                    run_threads(&w, size, t, cfg.warmup, None)?;
                }
            }
            // Beside the neighbour: the same runs again with it reading, alternating.
            let mut beside: Vec<(Path, Vec<RunResult>)> = if cfg.neighbour {
                io_paths.iter().map(|&p| (p, Vec::new())).collect()
            } else {
                Vec::new()
            };
            for _ in 0..cfg.runs {
                for (p, rs) in results.iter_mut() {
                    let t = target_for(*p, &targets);
                    let mut w = cfg.clone();
                    if p.synchronous() {
                        w.qd = 1;
                    }
                    let ctl = model_control(*p, daemon.as_ref());
                    let before = ctl.as_ref().and_then(modelfig::snap);
                    let mut r = run_threads(&w, size, t, cfg.duration, cfg.ops)?;
                    let after = ctl.as_ref().and_then(modelfig::snap);
                    r.model = before.zip(after);
                    rs.push(r);
                }
                for (p, rs) in beside.iter_mut() {
                    let t = target_for(*p, &targets);
                    let d = daemon.as_ref().expect("the neighbour needs the daemon");
                    let n = Neighbour::start(&d.socket, cfg.duration + 2.0, &cfg)?;
                    let ctl = model_control(*p, daemon.as_ref());
                    let before = ctl.as_ref().and_then(modelfig::snap);
                    let mut r = run_threads(&cfg, size, t, cfg.duration, cfg.ops)?;
                    let after = ctl.as_ref().and_then(modelfig::snap);
                    r.model = before.zip(after);
                    r.neighbour_mib_s = Some(n.finish()?);
                    rs.push(r);
                }
            }
            let results: Vec<(Path, Vec<RunResult>, Option<bool>)> = if cfg.neighbour {
                results
                    .into_iter()
                    .map(|(p, r)| (p, r, Some(false)))
                    .chain(beside.into_iter().map(|(p, r)| (p, r, Some(true))))
                    .collect()
            } else {
                results.into_iter().map(|(p, r)| (p, r, None)).collect()
            };
            for (p, rs, neighbour) in results {
                let completion =
                    matches!(p, Path::MonetaRaw | Path::Moneta).then_some(cfg.completion);
                let mut rec = summarize(&cfg, p, size, rs, completion);
                rec.neighbour = neighbour;
                if matches!(p, Path::Moneta | Path::MonetaZeroCopy) {
                    rec.extents = moneta_files.as_ref().map(|f| f.extents);
                }
                if let Some(d) = &daemon {
                    (rec.model, rec.model_parameters) = d.model.clone();
                }
                if a.json && !a.quiet {
                    println!("{}", serde_json::to_string(&rec).expect("serialize"));
                }
                out.push(rec);
            }
        }
    }
    if a.paths.contains(&Path::PermCheck) || compare {
        for &n in &a.records {
            let mut rec = perm_check(n, a.seed);
            if let Some(d) = &daemon {
                (rec.model, rec.model_parameters) = d.model.clone();
            }
            if a.json && !a.quiet {
                println!("{}", serde_json::to_string(&rec).expect("serialize"));
            }
            out.push(rec);
        }
    }
    if a.quiet {
    } else if a.csv {
        print!("{}", crate::csvout::to_csv(&out)?);
    } else if !a.json {
        print_table(&out);
        if a.breakdown {
            print_breakdown(&out);
        }
    }
    let files_left = daemon
        .as_ref()
        .filter(|d| d.fs && d.private.is_none())
        .map(|d| d.socket.clone());
    drop(targets);
    drop(moneta_files);
    // Every handle first, then the daemons stop (and unmount).
    drop(kfs_files);
    drop(kfs_daemons);
    if let Some(socket) = files_left {
        // On the user's daemon: remove the bench's files.
        if let Ok(m) = libmoneta::Moneta::connect(&socket) {
            let _ = m.unlink(file_name("raw"));
            for i in 0..a.open_files {
                let _ = m.unlink(file_name(&format!("files{i}")));
            }
        }
    }
    if compare && !a.quiet {
        if let Some(d) = &daemon {
            let idle = idle_cpu(d.pid, Duration::from_secs(2));
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"path": "moneta-idle", "seconds": 2.0, "cpu_pct": idle})
                );
            } else if let Some(pct) = idle.filter(|_| !a.csv) {
                println!("idle daemon: {pct:.2}% of one CPU over 2 s");
            }
        }
        // The floor under a request served by another core, for reading the figures above.
        let cores = machine::core_to_core();
        if a.json {
            if let Some(c) = &cores {
                let v = serde_json::json!({
                    "path": "machine-cores",
                    "cpus": c.cpus,
                    "line_round_trip_ns": c.line_round_trip_ns,
                    "handoff_4k_ns": c.handoff_4k_ns,
                });
                println!("{v}");
            }
        } else if !a.csv {
            match cores {
                Some(c) => println!(
                    "cores {} and {}: a cache line there and back {} ns, 4 KiB handed across {} ns",
                    c.cpus[0], c.cpus[1], c.line_round_trip_ns, c.handoff_4k_ns
                ),
                None => println!("cores: fewer than two usable CPUs, nothing handed across"),
            }
        }
    }
    if let Some(k) = kernel {
        for p in &k.remove {
            let _ = std::fs::remove_file(p);
        }
    }
    drop(odirect);
    Ok(out)
}

/// A control connection for reading the model's counters around a run of a Moneta path on a
/// daemon with a model.
fn model_control(p: Path, d: Option<&BenchDaemon>) -> Option<Control> {
    let d = d?;
    let moneta = matches!(p, Path::Moneta | Path::MonetaZeroCopy | Path::MonetaRaw);
    (moneta && d.model.0 != "none")
        .then(|| Control::connect(&d.socket).ok())
        .flatten()
}

fn target_for(p: Path, targets: &[(Path, Target)]) -> &Target {
    &targets
        .iter()
        .find(|(q, _)| *q == p)
        .expect("a target per path")
        .1
}

/// The daemon's CPU use over `over`, in percent of one CPU, after letting it settle.
pub fn idle_cpu(pid: u32, over: Duration) -> Option<f64> {
    std::thread::sleep(Duration::from_millis(200));
    let a = proc_cpu(pid)?;
    std::thread::sleep(over);
    let b = proc_cpu(pid)?;
    let d = sub(b, a);
    Some(d.total_s / over.as_secs_f64() * 100.0)
}
