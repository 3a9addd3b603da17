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
pub mod breakdown;
pub mod buffer;
mod files;
pub mod instructions;
mod kfs;
pub mod machine;
pub mod modelfig;
mod print;
mod record;
pub mod remote;
mod setup;
mod threads;
mod uring;

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

/// An I/O path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// Files on nvfs through libmoneta (`--qd` above 1: asynchronous requests).
    Moneta,
    /// Those files without copies: reads left in the DMA slice, writes filled in place
    /// (requests of at most one DMA slice).
    MonetaZeroCopy,
    /// Raw commands through a channel on one file's extent.
    MonetaRaw,
    /// Those files mapped into memory (their own pages, `FS_MAP`): loads and stores, no
    /// command at all (synchronous: `--threads`, not `--qd`).
    MonetaMmap,
    /// pread/pwrite on a file (tmpfs by default).
    KernelPsync,
    /// io_uring on that file: fixed file, registered buffers, single issuer, deferred task
    /// work.
    KernelUring,
    /// io_uring with a kernel thread polling the submission queue.
    KernelUringSqpoll,
    /// The kernel path's file mapped into memory (`mmap` `MAP_SHARED` of a tmpfs file):
    /// loads and stores.
    KernelMmap,
    /// pread/pwrite with `O_DIRECT` on ext4 on a loop device over a tmpfs file: the kernel's
    /// block path, the papers' baseline (needs root; the bench sets it up and tears it down).
    KernelOdirectExt4,
    /// The same on XFS.
    KernelOdirectXfs,
    /// Files of ext4 made on the array by a private `monetad --kernel-fs ext4` (Moneta-D's
    /// recycled file system), read and written through a channel (`libmoneta::KernelFile`):
    /// the kernel checks the open, the data goes without a system call (needs root; the bench
    /// starts the daemon, writes the files, and stops it, which unmounts).
    MonetaKfsExt4,
    /// The same on XFS (an array of at least 300 MiB).
    MonetaKfsXfs,
    /// Those ext4 files through the kernel's mount: pread/pwrite with `O_DIRECT` (aligned
    /// buffers). Each run opens the files and closes them at its end, since a kernel open
    /// takes them from the channels.
    KernelKfsExt4Odirect,
    /// Those ext4 files through the kernel's mount and its page cache: pread/pwrite.
    KernelKfsExt4Buffered,
    /// The XFS files through the kernel's mount with `O_DIRECT`.
    KernelKfsXfsOdirect,
    /// The XFS files through the kernel's mount and its page cache.
    KernelKfsXfsBuffered,
    /// pread/pwrite on a file of nvfs through `moneta mount` (FUSE, direct I/O): the path of
    /// programs the shim does not reach. The bench mounts its daemon's file system and
    /// unmounts it at the end (needs /dev/fuse, and fusermount3 without root).
    Fuse,
    /// The permission table's check alone.
    PermCheck,
    /// The file system's calls against the kernel on tmpfs: the soft miss through the channel
    /// (LOOKUP) and on the control socket, stat, 10,000 small files.
    Nvfs,
    /// The array's timing model against itself (private daemons): the latency it adds at
    /// queue depth 1 across array latencies of 4 ns to 128 µs against its own prediction
    /// (daemons with and without the model side by side, in eight pairs of short bursts per
    /// `--runs`, at least three, each run on daemons of its own; the host's state probed around
    /// every pair and the target judged on the pairs of its close state), the bandwidth of
    /// large transfers against its analytical peak, and its work per request.
    ModelAccuracy,
    /// The model's DRAM buffer (private daemons, `--model`, slow-nvm by default): sequential
    /// and strided reads at queue depth 1 with no buffer, a buffer filled on misses, read-ahead
    /// within the file's extent, the reader's hints (`File::will_need`), and both.
    DramBuffer,
    /// Paper 003's Figure 3b (private daemons): a member's range read or written through a
    /// channel (the device forwards over its NBD link, TLS-PSK on loopback) against the same
    /// bytes through a user-space NBD client (libnbd) and against the device's own array, at
    /// queue depth 1 for each `--size` (docs/distributed.md)
    Remote,
}

impl Path {
    /// A path of synchronous system calls (queue depth 1 whatever `--qd` says).
    fn synchronous(self) -> bool {
        matches!(
            self,
            Path::KernelPsync
                | Path::KernelOdirectExt4
                | Path::KernelOdirectXfs
                | Path::MonetaKfsExt4
                | Path::MonetaKfsXfs
                | Path::KernelKfsExt4Odirect
                | Path::KernelKfsExt4Buffered
                | Path::KernelKfsXfsOdirect
                | Path::KernelKfsXfsBuffered
                | Path::Fuse
                | Path::MonetaMmap
                | Path::KernelMmap
        )
    }

    /// The path's name, as `--path` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Moneta => "moneta",
            Path::MonetaZeroCopy => "moneta-zero-copy",
            Path::MonetaRaw => "moneta-raw",
            Path::MonetaMmap => "moneta-mmap",
            Path::KernelMmap => "kernel-mmap",
            Path::KernelPsync => "kernel-psync",
            Path::KernelUring => "kernel-uring",
            Path::KernelUringSqpoll => "kernel-uring-sqpoll",
            Path::KernelOdirectExt4 => "kernel-odirect-ext4",
            Path::KernelOdirectXfs => "kernel-odirect-xfs",
            Path::MonetaKfsExt4 => "moneta-kfs-ext4",
            Path::MonetaKfsXfs => "moneta-kfs-xfs",
            Path::KernelKfsExt4Odirect => "kernel-kfs-ext4-odirect",
            Path::KernelKfsExt4Buffered => "kernel-kfs-ext4-buffered",
            Path::KernelKfsXfsOdirect => "kernel-kfs-xfs-odirect",
            Path::KernelKfsXfsBuffered => "kernel-kfs-xfs-buffered",
            Path::Fuse => "fuse",
            Path::PermCheck => "perm-check",
            Path::Nvfs => "nvfs",
            Path::ModelAccuracy => "model-accuracy",
            Path::DramBuffer => "dram-buffer",
            Path::Remote => "remote",
        }
    }
}

/// What each operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Random reads.
    Read,
    /// Random writes.
    Write,
    /// Random reads and writes, half each.
    Randrw,
    /// Sequential reads.
    Seqread,
    /// Sequential writes.
    Seqwrite,
    /// Commands that move no data: the channel's round trip (moneta-raw only).
    Nop,
}

/// Completion strategy for the Moneta paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompletionArg {
    /// DMA completion: spin on the tag status entry.
    Spin,
    /// Forwarding: spin on the completion count.
    Forward,
    /// Issue-sleep: sleep on a futex.
    Sleep,
    /// libmoneta's policy: spin up to 256 KiB, sleep above.
    Auto,
}

impl CompletionArg {
    /// The mode for a request of `size` bytes.
    fn mode(self, size: u64) -> Completion {
        match self {
            CompletionArg::Spin => Completion::Dma,
            CompletionArg::Forward => Completion::Forward,
            CompletionArg::Sleep => Completion::Sleep,
            CompletionArg::Auto => libmoneta::Policy::default().mode(size as usize),
        }
    }
}

/// Options of `moneta bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Paths to measure (repeatable). Without any: the comparison of moneta (files through
    /// libmoneta) and moneta-raw against kernel-psync for 512 B and 4 KiB reads and writes, the
    /// permission check, the idle daemon's CPU, and what talking across two cores costs on this
    /// machine (a cache line there and back, 4 KiB handed across: the floor under a request
    /// served by another core).
    #[arg(long = "path", value_enum)]
    pub paths: Vec<Path>,
    /// Operation.
    #[arg(long, value_enum, default_value = "read")]
    pub op: Op,
    /// Request sizes in bytes (comma-separated; K/M suffixes allowed).
    #[arg(long, value_delimiter = ',', value_parser = monetad::config::parse_size)]
    pub size: Vec<u64>,
    /// Requests in flight per thread (kernel-psync is synchronous).
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Operations per thread and run instead of a duration (the warm-up still lasts
    /// `--warmup` seconds; 0 skips it).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Seconds of discarded warm-up before each configuration.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per configuration; the median is reported with the spread.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// File for the kernel paths [default: /dev/shm/moneta-bench-PID].
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Bytes of the region the requests fall in.
    #[arg(long, default_value = "64M", value_parser = monetad::config::parse_size)]
    pub region: u64,
    /// Completion strategy for the Moneta paths.
    #[arg(long, value_enum, default_value = "spin")]
    pub completion: CompletionArg,
    /// Records installed for perm-check (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1000u64, 16384])]
    pub records: Vec<u64>,
    /// Use the daemon at this socket (the bench works in a file it creates and removes, or, on
    /// a daemon started with --raw, grants itself an extent, which needs the daemon's user or
    /// root). Without it the bench starts a private daemon on a volatile array and stops it at
    /// the end. The kernel-fs paths (moneta-kfs-*, kernel-kfs-*) always run on private daemons
    /// of their own (`monetad --kernel-fs`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print one JSON object per configuration instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Small files created by `--path nvfs`.
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Time each stage of the requests (Moneta-D's Figure 3): on the moneta path from counters
    /// in libmoneta and in the daemon (the private daemon runs with `--trace`; a daemon given
    /// with --socket needs it too for the device's stages); on the kernel paths the system call
    /// and the copy timed apart and the rest of the mean. Queue depth 1.
    #[arg(long)]
    pub breakdown: bool,
    /// Files the requests spread over, each an equal part of the region (moneta and
    /// kernel-psync paths): more files, more permission records.
    #[arg(long, default_value_t = 1)]
    pub open_files: usize,
    /// Extents each moneta file is made of: its chunks are written in a shuffled order, so
    /// they lie next to each other on the array but not in the file, on a private daemon whose
    /// allocation unit is the file's size over this (a power of two, at least 4 KiB).
    #[arg(long)]
    pub extents: Option<u64>,
    /// Private daemon: do not merge adjacent permission records (`monetad --no-merge`).
    #[arg(long)]
    pub no_merge: bool,
    /// Private daemon: permission table entries [default: the daemon's, 16384].
    #[arg(long)]
    pub table_entries: Option<usize>,
    /// Count the instructions the bench threads retire (user and kernel, from the processor's
    /// counters through perf_event_open), per operation; where the machine cannot count them
    /// the record says why.
    #[arg(long)]
    pub count_instructions: bool,
    /// Print CSV (a header, then one row per configuration) instead of tables.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Measure the Moneta paths twice in every run, alone and beside a neighbour: another
    /// process on the same daemon reading 1 MiB at a time as 64 commands on all of its tags
    /// (`moneta bench --path moneta-raw --op read --size 1M`, in a child process). The records
    /// say which (`neighbour`: false alone, true beside it).
    #[arg(long)]
    pub neighbour: bool,
    /// The neighbour's request size.
    #[arg(long, default_value = "1M", value_parser = monetad::config::parse_size)]
    pub neighbour_size: u64,
    /// The neighbour's threads.
    #[arg(long, default_value_t = 1)]
    pub neighbour_threads: usize,
    /// Private daemon: the array's size [default: room for two regions and the file
    /// system's tables].
    #[arg(long, value_parser = monetad::config::parse_size)]
    pub array_size: Option<u64>,
    /// Private daemon: the array's timing model (`monetad --model`: none, pcm, dram,
    /// slow-nvm, flash-like); every record names the model its daemon ran.
    #[arg(long)]
    pub model: Option<String>,
    /// Private daemon: one parameter of the model, NAME=VALUE (repeatable; `monetad
    /// --model-set`).
    #[arg(long = "model-set", value_name = "NAME=VALUE")]
    pub model_set: Vec<String>,
    /// Print nothing (the records are returned to the caller: `moneta report`).
    #[arg(skip)]
    pub quiet: bool,
}

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

/// The `--neighbour`: another `moneta bench` process on the same daemon, reading 1 MiB at a
/// time through all 64 of its tags for `seconds`.
struct Neighbour {
    child: Option<std::process::Child>,
}

impl Neighbour {
    /// Starts it and returns once its reads are flowing (the daemon has read more than the
    /// region the neighbour wrote first).
    fn start(socket: &std::path::Path, seconds: f64, a: &BenchArgs) -> Result<Neighbour, String> {
        let ctl = Control::connect(socket).map_err(|e| e.to_string())?;
        let before = ctl.status().map_err(|e| e.to_string())?.bytes_read;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(exe)
            .args([
                "bench",
                "--path",
                "moneta-raw",
                "--op",
                "read",
                "--size",
                &a.neighbour_size.to_string(),
                "--threads",
                &a.neighbour_threads.to_string(),
            ])
            .args(["--warmup", "0", "--runs", "1", "--json"])
            .args(["--region", "64M", "--duration", &format!("{seconds:.3}")])
            .arg("--socket")
            .arg(socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the neighbour: {e}"))?;
        let mut n = Neighbour { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = n.child.as_mut().expect("started");
            if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("the neighbour stopped early ({st})"));
            }
            let read = ctl.status().map_err(|e| e.to_string())?.bytes_read;
            if read.saturating_sub(before) > 256 << 20 {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err("the neighbour did not start reading within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for it to end (it removes its files); its bandwidth (MiB/s).
    fn finish(mut self) -> Result<f64, String> {
        let child = self.child.take().expect("started");
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "the neighbour failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v.get("mib_s").and_then(|m| m.as_f64()))
            .ok_or_else(|| format!("the neighbour reported no bandwidth: {text}"))
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn validate(a: &BenchArgs, sizes: &[u64], slice: usize, paths: &[Path]) -> Result<(), String> {
    let raw = paths.contains(&Path::MonetaRaw);
    if a.threads == 0
        || a.qd == 0
        || a.runs == 0
        || a.duration <= 0.0
        || a.ops == Some(0)
        || a.open_files == 0
    {
        return Err("threads, qd, runs, ops, open files and duration must be positive".into());
    }
    if a.qd > 4096 {
        return Err("qd is at most 4096".into());
    }
    if a.breakdown && paths.iter().any(|p| p.kfs_kind().is_some()) {
        return Err(
            "--breakdown times the moneta and the kernel's own paths, not the kernel-fs ones"
                .into(),
        );
    }
    if a.breakdown && a.qd != 1 {
        return Err("--breakdown times requests one at a time: use it with --qd 1".into());
    }
    if raw && a.threads * a.qd > moneta_abi::TAGS_PER_CHANNEL {
        return Err(format!(
            "threads x qd = {} exceeds the raw channel's {} tags",
            a.threads * a.qd,
            moneta_abi::TAGS_PER_CHANNEL
        ));
    }
    if a.open_files > 4096 {
        return Err("--open-files is at most 4096".into());
    }
    if a.open_files > 1
        && paths.iter().any(|p| {
            matches!(
                p,
                Path::MonetaRaw | Path::KernelUring | Path::KernelUringSqpoll
            )
        })
    {
        return Err(
            "--open-files above 1 works with the moneta, moneta-zero-copy, kernel-psync and \
             fuse paths"
                .into(),
        );
    }
    if paths.contains(&Path::MonetaZeroCopy) {
        if let Some(s) = sizes.iter().find(|&&s| s as usize > slice) {
            return Err(format!(
                "moneta-zero-copy requests fit one DMA slice ({slice} bytes): size {s} does not"
            ));
        }
    }
    let part = a.region / a.open_files as u64;
    for &s in sizes {
        if s == 0 || s > part {
            return Err(format!(
                "size {s} must be between 1 and the region's part per file ({part})"
            ));
        }
    }
    Ok(())
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
